//! SQL for policy checks: each root's verdict per MR head, and the owners' approvals.

use crate::capabilities::store::types::{PolicyApproval, PolicyVerdictRecord, VerdictRow};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, ProjectId, UserId};
use anyhow::Result;
use rusqlite::{params, Connection};

pub(super) fn record_verdict(
    conn: &Connection,
    r: &PolicyVerdictRecord,
    verdict_json: &str,
    now: i64,
) -> Result<()> {
    conn.execute(
        "INSERT INTO policy_verdicts (project_id, mr_iid, root, sha, fingerprint, verdict, recorded_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE
         SET fingerprint = excluded.fingerprint, verdict = excluded.verdict,
             recorded_at = excluded.recorded_at",
        params![
            r.project.0 as i64,
            r.mr.0 as i64,
            r.root,
            r.sha.0,
            r.fingerprint.as_hex(),
            verdict_json,
            now
        ],
    )?;
    Ok(())
}

pub(super) fn verdicts(
    conn: &Connection,
    project: ProjectId,
    mr: MrIid,
    sha: &CommitSha,
) -> Result<Vec<VerdictRow>> {
    let mut st = conn.prepare(
        "SELECT root, fingerprint, verdict FROM policy_verdicts
         WHERE project_id = ?1 AND mr_iid = ?2 AND sha = ?3 ORDER BY rowid",
    )?;
    let rows = st
        .query_map(params![project.0 as i64, mr.0 as i64, sha.0], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<rusqlite::Result<Vec<VerdictRow>>>()?;
    Ok(rows)
}

pub(super) fn record_approval(conn: &Connection, a: &PolicyApproval, now: i64) -> Result<bool> {
    let n = conn.execute(
        "INSERT INTO policy_approvals (project_id, mr_iid, root, sha, fingerprint, policy_set,
                                       approver_id, approver, approved_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT DO NOTHING",
        params![
            a.project.0 as i64,
            a.mr.0 as i64,
            a.root,
            a.sha.0,
            a.fingerprint.as_hex(),
            a.set,
            a.approver_id.0 as i64,
            a.approver,
            now
        ],
    )?;
    Ok(n == 1)
}

pub(super) fn approvals(
    conn: &Connection,
    project: ProjectId,
    mr: MrIid,
) -> Result<Vec<PolicyApproval>> {
    let mut st = conn.prepare(
        "SELECT root, sha, fingerprint, policy_set, approver_id, approver, approved_at
         FROM policy_approvals WHERE project_id = ?1 AND mr_iid = ?2 ORDER BY id",
    )?;
    let rows = st
        .query_map(params![project.0 as i64, mr.0 as i64], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, i64>(6)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows
        .into_iter()
        .filter_map(|(root, sha, fp, set, approver_id, approver, at)| {
            Some(PolicyApproval {
                project,
                mr,
                root,
                sha: CommitSha(sha),
                fingerprint: Fingerprint::from_hex(&fp)?,
                set,
                approver_id: UserId(approver_id as u64),
                approver,
                approved_at: at,
            })
        })
        .collect())
}
