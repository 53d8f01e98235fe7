//! What the store keeps of targeted plans (`planbot plan [ROOT] -- -target=…`): the flags a
//! comment asked for, per MR head and root, so that every plan of that head (a re-run, another
//! replica) and the apply of the reviewed head use them. A head without any is planned in full:
//! a new push drops them, and the next `planbot plan` comment on the MR replaces them all.

use super::backend::StoreBackend;
use super::types::PlanTargeting;
use super::{on_backend, Backend, Store};
use crate::core::ids::{CommitSha, MrIid, ProjectId, UserId};
use crate::core::targeting::Targeting;
use anyhow::{Context, Result};

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
        let set = PlanTargeting {
            project,
            mr,
            sha: sha.clone(),
            author,
            roots: roots
                .iter()
                .filter(|(_, t)| !t.is_empty())
                .map(|(r, t)| Ok((r.clone(), serde_json::to_string(t)?)))
                .collect::<Result<_>>()?,
        };
        on_backend!(self, b => b.set_plan_targeting(set).await)
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
        let row = on_backend!(self, b => b.plan_targeting(project, mr, sha.clone(), root.to_string()).await)?;
        let Some(json) = row else {
            return Ok(Targeting::default());
        };
        let stored: Targeting = serde_json::from_str(&json)
            .with_context(|| format!("the stored targeting of root `{root}` does not read"))?;
        stored
            .recheck()
            .with_context(|| format!("the stored targeting of root `{root}` is not valid"))
    }
}
