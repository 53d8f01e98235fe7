//! The plans kept for reuse across pushes (`flows::context::plan_reuse`): one row per root of
//! an open MR, its last plan, as text that holds no secret (the flow redacts it before it is
//! written). Any replica reads what another kept.

use super::sql::{args, Conn, Sql};
use super::{now_ms, read, write, Store};
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use anyhow::Result;

/// How long a kept plan is kept when its MR never closes or merges (a lost webhook).
const KEPT_FOR_MS: i64 = 30 * 24 * 3600 * 1000;

static UPSERT: Sql = Sql::both(
    "INSERT INTO kept_plans (project_id, mr_iid, root, head, planned_commit, inputs, outcome,
                             document, digests, kept_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
     ON CONFLICT (project_id, mr_iid, root) DO UPDATE SET head = excluded.head,
       planned_commit = excluded.planned_commit, inputs = excluded.inputs,
       outcome = excluded.outcome, document = excluded.document, digests = excluded.digests,
       kept_at = excluded.kept_at",
);
static SWEEP: Sql = Sql::both("DELETE FROM kept_plans WHERE kept_at < ?1");
static KEPT: Sql = Sql::both(
    "SELECT head, planned_commit, inputs, outcome, document, digests FROM kept_plans
     WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3",
);
static KEPT_INPUTS: Sql = Sql::both(
    "SELECT head, planned_commit, inputs FROM kept_plans
     WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3",
);
static FORGET_MR: Sql = Sql::both("DELETE FROM kept_plans WHERE project_id = ?1 AND mr_iid = ?2");

/// One kept plan, as stored: every text already free of secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptPlanRow {
    /// The MR head it was planned for.
    pub head: CommitSha,
    /// The commit planned (the merge result or the head).
    pub planned_commit: CommitSha,
    /// What must be equal for it to be reused (JSON).
    pub inputs: String,
    /// What the note and the statuses show of it besides the plan (JSON).
    pub outcome: String,
    /// The redacted `show -json` document.
    pub document: String,
    /// Its secrets as keyed digests (JSON).
    pub digests: String,
}

impl Store {
    /// Keep `row` as the last plan of `root` of the MR (replacing the one before); plans kept
    /// more than 30 days ago are dropped meanwhile.
    pub async fn keep_plan(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
        row: KeptPlanRow,
    ) -> Result<()> {
        let now = now_ms();
        let args = args![
            project,
            mr,
            root,
            &row.head,
            &row.planned_commit,
            row.inputs,
            row.outcome,
            row.document,
            row.digests,
            now
        ];
        write!(self, |c| {
            c.execute(&SWEEP, &args![now - KEPT_FOR_MS]).await?;
            c.execute(&UPSERT, &args).await?;
            Ok(())
        })
    }

    /// What decides whether the last plan kept of `root` of the MR is reused (its head,
    /// planned commit and inputs), without its document.
    pub async fn kept_plan_inputs(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
    ) -> Result<Option<(CommitSha, CommitSha, String)>> {
        let args = args![project, mr, root];
        let row = read!(self, |c| c.opt(&KEPT_INPUTS, &args).await)?;
        row.map(|r| Ok((CommitSha(r.get(0)?), CommitSha(r.get(1)?), r.get(2)?)))
            .transpose()
    }

    /// The last plan kept of `root` of the MR.
    pub async fn kept_plan(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
    ) -> Result<Option<KeptPlanRow>> {
        let args = args![project, mr, root];
        let row = read!(self, |c| c.opt(&KEPT, &args).await)?;
        row.map(|r| {
            Ok(KeptPlanRow {
                head: CommitSha(r.get(0)?),
                planned_commit: CommitSha(r.get(1)?),
                inputs: r.get(2)?,
                outcome: r.get(3)?,
                document: r.get(4)?,
                digests: r.get(5)?,
            })
        })
        .transpose()
    }

    /// Forget every plan kept of the MR (it was closed or merged).
    pub async fn forget_kept_plans(&self, project: ProjectId, mr: MrIid) -> Result<()> {
        write!(self, |c| {
            c.execute(&FORGET_MR, &args![project, mr]).await?;
            Ok(())
        })
    }
}
