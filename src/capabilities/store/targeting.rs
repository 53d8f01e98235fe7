//! What the store keeps of targeted plans (`planbot plan [ROOT] -- -target=…`): the flags a
//! comment asked for, per MR head and root, so that every plan of that head (a re-run, another
//! replica) and the apply of the reviewed head use them. A head without any is planned in full:
//! a new push drops them, and the next `planbot plan` comment on the MR replaces them all.

use super::sql::{args, Conn, Sql};
use super::{now_ms, read, write, Store};
use crate::core::ids::{CommitSha, MrIid, ProjectId, UserId};
use crate::core::targeting::Targeting;
use anyhow::{Context, Result};

static FORGET_MR: Sql =
    Sql::both("DELETE FROM plan_targeting WHERE project_id = ?1 AND mr_iid = ?2");
static INSERT: Sql = Sql::both(
    "INSERT INTO plan_targeting (project_id, mr_iid, sha, root, targeting, author_id, set_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
);
static TARGETING: Sql = Sql::both(
    "SELECT targeting FROM plan_targeting
     WHERE project_id = ?1 AND mr_iid = ?2 AND sha = ?3 AND root = ?4",
);

impl Store {
    /// The targeting of `mr` from now on: `roots`' (empty: every root in full) at head `sha`,
    /// asked for by `author`; whatever was stored for the MR before (any head) is dropped.
    pub async fn set_plan_targeting(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: &CommitSha,
        author: UserId,
        roots: &[(String, Targeting)],
    ) -> Result<()> {
        let rows = roots
            .iter()
            .filter(|(_, t)| !t.is_empty())
            .map(|(root, t)| {
                let json = serde_json::to_string(t)?;
                Ok(args![project, mr, sha, root, json, author])
            })
            .collect::<Result<Vec<_>>>()?;
        write!(self, |c| {
            c.execute(&FORGET_MR, &args![project, mr]).await?;
            let now = now_ms();
            for mut row in rows {
                row.extend(args![now]);
                c.execute(&INSERT, &row).await?;
            }
            Ok(())
        })
    }

    /// The targeting of one root's plans at head `sha` (empty: a full plan). What was stored
    /// is checked again as a comment's flags are; a row that does not pass is an error (the
    /// plan and the apply stop, they never plan something else than what was asked).
    pub async fn plan_targeting(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: &CommitSha,
        root: &str,
    ) -> Result<Targeting> {
        let args = args![project, mr, sha, root];
        let row = read!(self, |c| c.opt(&TARGETING, &args).await)?;
        let Some(json) = row.map(|r| r.get::<String>(0)).transpose()? else {
            return Ok(Targeting::default());
        };
        let stored: Targeting = serde_json::from_str(&json)
            .with_context(|| format!("the stored targeting of root `{root}` does not read"))?;
        stored
            .recheck()
            .with_context(|| format!("the stored targeting of root `{root}` is not valid"))
    }
}
