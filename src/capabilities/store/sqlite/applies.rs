//! SQL for apply records: one per CI job, so a job id applies once.

use crate::capabilities::store::types::{ApplyId, ApplyRecord, ApplyState, NewApply};
use crate::core::ids::{CommitSha, JobId, MrIid, ProjectId};
use anyhow::Result;
use rusqlite::{params, Connection, OptionalExtension};

/// Start an apply; `None` if this CI job has one already.
pub(super) fn begin(conn: &Connection, a: &NewApply, now: i64) -> Result<Option<ApplyId>> {
    let roots = serde_json::to_string(&a.roots)?;
    let n = conn.execute(
        "INSERT INTO applies (ci_job_id, project_id, mr_iid, sha, roots, state, started_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6) ON CONFLICT (ci_job_id) DO NOTHING",
        params![
            a.ci_job.0 as i64,
            a.project.0 as i64,
            a.mr.map(|m| m.0 as i64),
            a.sha.0,
            roots,
            now
        ],
    )?;
    Ok((n == 1).then(|| ApplyId(conn.last_insert_rowid())))
}

pub(super) fn finish(
    conn: &Connection,
    id: ApplyId,
    state: ApplyState,
    detail: Option<&str>,
    now: i64,
) -> Result<()> {
    conn.execute(
        "UPDATE applies SET state = ?2, finished_at = ?3, detail = ?4 WHERE id = ?1",
        params![id.0, state.as_str(), now, detail],
    )?;
    Ok(())
}

/// Applies left `running` by a dead process become `interrupted`; returns them.
pub(super) fn mark_interrupted(conn: &Connection, now: i64) -> Result<Vec<ApplyRecord>> {
    let mut st = conn.prepare(&format!(
        "UPDATE applies SET state = 'interrupted', finished_at = ?1 WHERE state = 'running' RETURNING {APPLY_COLS}"
    ))?;
    let rows = st
        .query_map([now], apply_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

pub(super) fn for_job(conn: &Connection, ci_job: JobId) -> Result<Option<ApplyRecord>> {
    Ok(conn
        .query_row(
            &format!("SELECT {APPLY_COLS} FROM applies WHERE ci_job_id = ?1"),
            [ci_job.0 as i64],
            apply_row,
        )
        .optional()?)
}

const APPLY_COLS: &str =
    "id, ci_job_id, project_id, mr_iid, sha, roots, state, started_at, finished_at, detail";

fn apply_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ApplyRecord> {
    Ok(ApplyRecord {
        id: ApplyId(r.get(0)?),
        ci_job: JobId(r.get::<_, i64>(1)? as u64),
        project: ProjectId(r.get::<_, i64>(2)? as u64),
        mr: r.get::<_, Option<i64>>(3)?.map(|m| MrIid(m as u64)),
        sha: CommitSha(r.get(4)?),
        roots: serde_json::from_str(&r.get::<_, String>(5)?).unwrap_or_default(),
        state: ApplyState::parse(&r.get::<_, String>(6)?),
        started_at: r.get(7)?,
        finished_at: r.get(8)?,
        detail: r.get(9)?,
    })
}
