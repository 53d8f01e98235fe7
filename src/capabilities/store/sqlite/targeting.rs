//! SQL for targeted plans: the engine flags a comment asked for, per MR head and root.

use crate::capabilities::store::types::PlanTargeting;
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use anyhow::Result;
use rusqlite::{params, Connection, OptionalExtension};

/// Replace every targeting of the MR (all its heads) by `set`'s, in the caller's transaction.
pub(super) fn set(conn: &Connection, set: &PlanTargeting, now: i64) -> Result<()> {
    conn.execute(
        "DELETE FROM plan_targeting WHERE project_id = ?1 AND mr_iid = ?2",
        params![set.project.0 as i64, set.mr.0 as i64],
    )?;
    for (root, json) in &set.roots {
        conn.execute(
            "INSERT INTO plan_targeting (project_id, mr_iid, sha, root, targeting, author_id, set_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                set.project.0 as i64,
                set.mr.0 as i64,
                set.sha.0,
                root,
                json,
                set.author.0 as i64,
                now
            ],
        )?;
    }
    Ok(())
}

/// The targeting (as JSON) of one root at one head, if a comment asked for one.
pub(super) fn get(
    conn: &Connection,
    project: ProjectId,
    mr: MrIid,
    sha: &CommitSha,
    root: &str,
) -> Result<Option<String>> {
    Ok(conn
        .query_row(
            "SELECT targeting FROM plan_targeting
             WHERE project_id = ?1 AND mr_iid = ?2 AND sha = ?3 AND root = ?4",
            params![project.0 as i64, mr.0 as i64, sha.0, root],
            |r| r.get(0),
        )
        .optional()?)
}
