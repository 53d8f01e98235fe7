//! SQL for targeted plans on PostgreSQL: the engine flags a comment asked for, per MR head and
//! root (the same rows as SQLite's).

use super::PgStore;
use crate::capabilities::store::now_ms;
use crate::capabilities::store::types::PlanTargeting;
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use anyhow::Result;

/// Replace every targeting of the MR (all its heads) by `set`'s, in one transaction.
pub(super) async fn set(store: &PgStore, set: &PlanTargeting) -> Result<()> {
    let now = now_ms();
    let mut c = store.client().await?;
    let tx = c.transaction().await?;
    let (project, mr) = (set.project.0 as i64, set.mr.0 as i64);
    tx.execute(
        "DELETE FROM plan_targeting WHERE project_id = $1 AND mr_iid = $2",
        &[&project, &mr],
    )
    .await?;
    for (root, json) in &set.roots {
        tx.execute(
            "INSERT INTO plan_targeting (project_id, mr_iid, sha, root, targeting, author_id, set_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &project,
                &mr,
                &set.sha.0,
                root,
                json,
                &(set.author.0 as i64),
                &now,
            ],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The targeting (as JSON) of one root at one head, if a comment asked for one.
pub(super) async fn get(
    c: &impl tokio_postgres::GenericClient,
    project: ProjectId,
    mr: MrIid,
    sha: &CommitSha,
    root: &str,
) -> Result<Option<String>> {
    Ok(c.query_opt(
        "SELECT targeting FROM plan_targeting
         WHERE project_id = $1 AND mr_iid = $2 AND sha = $3 AND root = $4",
        &[&(project.0 as i64), &(mr.0 as i64), &sha.0, &root],
    )
    .await?
    .map(|r| r.get(0)))
}
