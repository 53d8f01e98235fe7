//! SQL for policy checks on PostgreSQL: each root's verdict per MR head, and the owners'
//! approvals (the same rows as SQLite's).

use crate::capabilities::store::now_ms;
use crate::capabilities::store::types::{PolicyApproval, PolicyVerdictRecord, VerdictRow};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, ProjectId, UserId};
use anyhow::Result;
use tokio_postgres::GenericClient;

pub(super) async fn record_verdict(
    c: &impl GenericClient,
    r: &PolicyVerdictRecord,
    verdict_json: &str,
) -> Result<()> {
    c.execute(
        "INSERT INTO policy_verdicts (project_id, mr_iid, root, sha, fingerprint, verdict, recorded_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE
         SET fingerprint = excluded.fingerprint, verdict = excluded.verdict,
             recorded_at = excluded.recorded_at",
        &[
            &(r.project.0 as i64),
            &(r.mr.0 as i64),
            &r.root,
            &r.sha.0,
            &r.fingerprint.as_hex(),
            &verdict_json,
            &now_ms(),
        ],
    )
    .await?;
    Ok(())
}

pub(super) async fn verdicts(
    c: &impl GenericClient,
    project: ProjectId,
    mr: MrIid,
    sha: &CommitSha,
) -> Result<Vec<VerdictRow>> {
    Ok(c.query(
        "SELECT root, fingerprint, verdict FROM policy_verdicts
             WHERE project_id = $1 AND mr_iid = $2 AND sha = $3 ORDER BY recorded_at, root",
        &[&(project.0 as i64), &(mr.0 as i64), &sha.0],
    )
    .await?
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect())
}

pub(super) async fn record_approval(c: &impl GenericClient, a: &PolicyApproval) -> Result<bool> {
    let n = c
        .execute(
            "INSERT INTO policy_approvals (project_id, mr_iid, root, sha, fingerprint, policy_set,
                                           approver_id, approver, approved_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT DO NOTHING",
            &[
                &(a.project.0 as i64),
                &(a.mr.0 as i64),
                &a.root,
                &a.sha.0,
                &a.fingerprint.as_hex(),
                &a.set,
                &(a.approver_id.0 as i64),
                &a.approver,
                &now_ms(),
            ],
        )
        .await?;
    Ok(n == 1)
}

pub(super) async fn approvals(
    c: &impl GenericClient,
    project: ProjectId,
    mr: MrIid,
) -> Result<Vec<PolicyApproval>> {
    Ok(c.query(
        "SELECT root, sha, fingerprint, policy_set, approver_id, approver, approved_at
             FROM policy_approvals WHERE project_id = $1 AND mr_iid = $2 ORDER BY id",
        &[&(project.0 as i64), &(mr.0 as i64)],
    )
    .await?
    .iter()
    .filter_map(|r| {
        Some(PolicyApproval {
            project,
            mr,
            root: r.get(0),
            sha: CommitSha(r.get(1)),
            fingerprint: Fingerprint::from_hex(&r.get::<_, String>(2))?,
            set: r.get(3),
            approver_id: UserId(r.get::<_, i64>(4) as u64),
            approver: r.get(5),
            approved_at: r.get(6),
        })
    })
    .collect())
}
