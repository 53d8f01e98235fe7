//! SQL for runs (one root of one plan or apply) and their logs, notes and fingerprints as shown.

use crate::capabilities::store::types::{
    NewRun, QueueJobId, RunEnd, RunKind, RunQuery, RunRecord, RunState,
};
use crate::core::ids::{CommitSha, MrIid, ProjectId, RunId};
use anyhow::Result;
use rusqlite::{params, Connection, OptionalExtension};

pub(super) fn start(conn: &Connection, run: &NewRun, now: i64) -> Result<RunId> {
    conn.execute(
        "INSERT INTO runs (job_id, kind, project_id, project_path, mr_iid, root, sha, state, started_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', ?8)",
        params![
            run.job.map(|j| j.0),
            run.kind.as_str(),
            run.project.0 as i64,
            run.project_path,
            run.mr.map(|m| m.0 as i64),
            run.root,
            run.sha.0,
            now
        ],
    )?;
    Ok(RunId(conn.last_insert_rowid() as u64))
}

pub(super) fn finish(conn: &Connection, id: RunId, end: &RunEnd, now: i64) -> Result<()> {
    conn.execute(
        "UPDATE runs SET state = ?2, finished_at = ?3, summary = ?4, log = ?5, note_markdown = ?6,
                fingerprint = ?7
         WHERE id = ?1",
        params![
            id.0 as i64,
            end.state.as_str(),
            now,
            end.summary,
            end.log,
            end.note_markdown,
            end.fingerprint.as_ref().map(|f| f.as_hex().to_string())
        ],
    )?;
    Ok(())
}

/// Runs left `running` by a dead process become `interrupted`.
pub(super) fn interrupt_running(conn: &Connection, now: i64) -> Result<usize> {
    Ok(conn.execute(
        "UPDATE runs SET state = 'interrupted', finished_at = ?1 WHERE state = 'running'",
        [now],
    )?)
}

pub(super) fn get(conn: &Connection, id: RunId) -> Result<Option<RunRecord>> {
    Ok(conn
        .query_row(
            &format!("{RUN_SELECT} WHERE id = ?1"),
            [id.0 as i64],
            run_row,
        )
        .optional()?)
}

/// The newest runs first.
pub(super) fn recent(conn: &Connection, limit: u32) -> Result<Vec<RunRecord>> {
    let mut st = conn.prepare(&format!("{RUN_SELECT} ORDER BY id DESC LIMIT ?1"))?;
    let rows = st
        .query_map([limit], run_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// The projects that have runs, with their last known path.
pub(super) fn projects(conn: &Connection) -> Result<Vec<(ProjectId, Option<String>)>> {
    let mut st = conn
        .prepare("SELECT project_id, MAX(project_path) FROM runs GROUP BY project_id ORDER BY 2")?;
    let rows = st
        .query_map([], |r| {
            Ok((ProjectId(r.get::<_, i64>(0)? as u64), r.get(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// One page of runs, newest first (see [`RunQuery`]).
pub(super) fn page(conn: &Connection, q: &RunQuery) -> Result<Vec<RunRecord>> {
    if q.projects.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<String> = q.projects.iter().map(|p| p.0.to_string()).collect();
    let mut sql = format!("{RUN_SELECT} WHERE project_id IN ({})", ids.join(","));
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    if let Some(mr) = q.mr {
        args.push((mr.0 as i64).into());
        sql.push_str(&format!(" AND mr_iid = ?{}", args.len()));
    }
    if let Some(state) = q.state {
        args.push(state.as_str().to_string().into());
        sql.push_str(&format!(" AND state = ?{}", args.len()));
    }
    if let Some(before) = q.before {
        args.push((before.0 as i64).into());
        sql.push_str(&format!(" AND id < ?{}", args.len()));
    }
    args.push(i64::from(q.limit).into());
    sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", args.len()));
    let mut st = conn.prepare(&sql)?;
    let rows = st
        .query_map(rusqlite::params_from_iter(args), run_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// Runs of one MR, newest first.
pub(super) fn for_mr(conn: &Connection, project: ProjectId, mr: MrIid) -> Result<Vec<RunRecord>> {
    let mut st = conn.prepare(&format!(
        "{RUN_SELECT} WHERE project_id = ?1 AND mr_iid = ?2 ORDER BY id DESC"
    ))?;
    let rows = st
        .query_map(params![project.0 as i64, mr.0 as i64], run_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

const RUN_SELECT: &str =
    "SELECT id, job_id, kind, project_id, project_path, mr_iid, root, sha, state, started_at,
    finished_at, summary, log, note_markdown, fingerprint FROM runs";

fn run_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
    Ok(RunRecord {
        id: RunId(r.get::<_, i64>(0)? as u64),
        job: r.get::<_, Option<i64>>(1)?.map(QueueJobId),
        kind: RunKind::parse(&r.get::<_, String>(2)?),
        project: ProjectId(r.get::<_, i64>(3)? as u64),
        project_path: r.get(4)?,
        mr: r.get::<_, Option<i64>>(5)?.map(|m| MrIid(m as u64)),
        root: r.get(6)?,
        sha: CommitSha(r.get(7)?),
        state: RunState::parse(&r.get::<_, String>(8)?),
        started_at: r.get(9)?,
        finished_at: r.get(10)?,
        summary: r.get(11)?,
        log: r.get(12)?,
        note_markdown: r.get(13)?,
        fingerprint: r.get(14)?,
    })
}
