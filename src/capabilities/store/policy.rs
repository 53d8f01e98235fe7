//! What the store keeps of policy checks: the verdict recorded for each root's plan shown on a
//! merge request (with that plan's fingerprint), and the owners' approvals of a failing set for
//! one plan. The apply gate reads both; a new push shows a new plan, which no approval covers.

use super::sql::{args, Conn, Sql};
use super::types::{PolicyApproval, PolicyVerdictRecord};
use super::{now_ms, read, write, Store};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, ProjectId, UserId};
use crate::core::policy::review::RecordedVerdict;
use anyhow::Result;

/// A re-plan of the same head replaces the root's verdict.
static RECORD_VERDICT: Sql = Sql::both(
    "INSERT INTO policy_verdicts (project_id, mr_iid, root, sha, fingerprint, verdict,
                                  recorded_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
     ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE
     SET fingerprint = excluded.fingerprint, verdict = excluded.verdict,
         recorded_at = excluded.recorded_at",
);
static VERDICTS: Sql = Sql::both(
    "SELECT root, fingerprint, verdict FROM policy_verdicts
     WHERE project_id = ?1 AND mr_iid = ?2 AND sha = ?3 ORDER BY recorded_at, root",
);
/// The same approver approving the same set of the same plan again changes nothing.
static RECORD_APPROVAL: Sql = Sql::both(
    "INSERT INTO policy_approvals (project_id, mr_iid, root, sha, fingerprint, policy_set,
                                   approver_id, approver, approved_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
     ON CONFLICT DO NOTHING",
);
static APPROVALS: Sql = Sql::both(
    "SELECT root, sha, fingerprint, policy_set, approver_id, approver, approved_at
     FROM policy_approvals WHERE project_id = ?1 AND mr_iid = ?2 ORDER BY id",
);

impl Store {
    /// Record (or replace) the verdict of one root's plan shown for `sha`.
    pub async fn record_policy_verdict(&self, record: PolicyVerdictRecord) -> Result<()> {
        let r = &record;
        let args = args![
            r.project,
            r.mr,
            &r.root,
            &r.sha,
            r.fingerprint.as_hex(),
            r.verdict.to_json(),
            now_ms()
        ];
        self.write_one(&RECORD_VERDICT, args).await
    }

    /// The verdicts recorded for the plans shown for head `sha` of the MR, one per root. A row
    /// whose fingerprint or verdict does not parse reads as no verdict.
    pub async fn policy_verdicts(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: &CommitSha,
    ) -> Result<Vec<PolicyVerdictRecord>> {
        let args = args![project, mr, sha];
        let rows = read!(self, |c| c.rows(&VERDICTS, &args).await)?;
        let mut out = Vec::new();
        for r in rows {
            let (fingerprint, json) = (r.get::<String>(1)?, r.get::<String>(2)?);
            if let (Some(fingerprint), Some(verdict)) = (
                Fingerprint::from_hex(&fingerprint),
                RecordedVerdict::from_json(&json),
            ) {
                let (root, sha) = (r.get(0)?, sha.clone());
                out.push(PolicyVerdictRecord {
                    project,
                    mr,
                    root,
                    sha,
                    fingerprint,
                    verdict,
                });
            }
        }
        Ok(out)
    }

    /// Record an approval; `false` when the same person had already approved that set of that
    /// plan (nothing changes then).
    pub async fn record_policy_approval(&self, approval: PolicyApproval) -> Result<bool> {
        let a = &approval;
        let args = args![
            a.project,
            a.mr,
            &a.root,
            &a.sha,
            a.fingerprint.as_hex(),
            &a.set,
            a.approver_id,
            &a.approver,
            now_ms()
        ];
        write!(self, |c| Ok(c.execute(&RECORD_APPROVAL, &args).await? == 1))
    }

    /// Every approval given on the MR (any head), oldest first.
    pub async fn policy_approvals(
        &self,
        project: ProjectId,
        mr: MrIid,
    ) -> Result<Vec<PolicyApproval>> {
        let rows = read!(self, |c| c.rows(&APPROVALS, &args![project, mr]).await)?;
        let mut out = Vec::new();
        for r in rows {
            // An approval whose fingerprint does not parse approves nothing.
            let Some(fingerprint) = Fingerprint::from_hex(&r.get::<String>(2)?) else {
                continue;
            };
            out.push(PolicyApproval {
                project,
                mr,
                root: r.get(0)?,
                sha: CommitSha(r.get(1)?),
                fingerprint,
                set: r.get(3)?,
                approver_id: UserId(r.get::<i64>(4)? as u64),
                approver: r.get(5)?,
                approved_at: r.get(6)?,
            });
        }
        Ok(out)
    }
}
