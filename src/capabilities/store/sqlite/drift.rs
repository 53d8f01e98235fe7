//! SQL for drift: the schedule's ticks (an occurrence claimed and its job queued, in one write)
//! and each root's last check.

use super::queue;
use crate::capabilities::store::types::{DriftOutcome, DriftRootRecord, QueueJobId};
use crate::core::events::Job;
use crate::core::ids::ProjectId;
use anyhow::Result;
use rusqlite::{params, Connection};
use std::str::FromStr;

/// Claim the tick of occurrence `at`: `None` when it was already claimed, else the queued
/// `drift_tick` job.
pub(super) fn claim(conn: &Connection, at: i64, now: i64) -> Result<Option<QueueJobId>> {
    let inserted = conn.execute(
        "INSERT INTO drift_ticks (tick_at, claimed_at) VALUES (?1, ?2) ON CONFLICT (tick_at) DO NOTHING",
        params![at, now],
    )?;
    if inserted == 0 {
        return Ok(None);
    }
    let job = queue::enqueue(conn, &Job::DriftTick { at }, None, now)?.id;
    conn.execute(
        "UPDATE drift_ticks SET job_id = ?2 WHERE tick_at = ?1",
        params![at, job.map(|j| j.0)],
    )?;
    Ok(job)
}

/// The newest claimed tick.
pub(super) fn last(conn: &Connection) -> Result<Option<i64>> {
    Ok(conn.query_row("SELECT MAX(tick_at) FROM drift_ticks", [], |r| r.get(0))?)
}

/// Record a root's check (replacing the last one); a check that could not check keeps the
/// time of the last one that could.
pub(super) fn record_root(conn: &Connection, r: &DriftRootRecord) -> Result<()> {
    conn.execute(
        "INSERT INTO drift_roots (project_id, root, project_path, outcome, drifted, checked_at, checked_ok_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (project_id, root) DO UPDATE SET
           project_path = excluded.project_path, outcome = excluded.outcome,
           drifted = excluded.drifted, checked_at = excluded.checked_at,
           checked_ok_at = COALESCE(excluded.checked_ok_at, drift_roots.checked_ok_at)",
        params![
            r.project.0 as i64,
            r.root,
            r.project_path,
            r.outcome.as_str(),
            r.drifted,
            r.checked_at,
            r.checked_ok_at
        ],
    )?;
    Ok(())
}

/// Forget the roots of `project` not in `keep` (removed, or no longer checked).
pub(super) fn forget_roots(conn: &Connection, project: ProjectId, keep: &[String]) -> Result<()> {
    let keep = serde_json::to_string(keep)?;
    conn.execute(
        "DELETE FROM drift_roots WHERE project_id = ?1
           AND root NOT IN (SELECT value FROM json_each(?2))",
        params![project.0 as i64, keep],
    )?;
    Ok(())
}

/// Every root's last check, by project and root.
pub(super) fn roots(conn: &Connection) -> Result<Vec<DriftRootRecord>> {
    let mut stmt = conn.prepare(
        "SELECT project_id, project_path, root, outcome, drifted, checked_at, checked_ok_at
           FROM drift_roots ORDER BY project_path, root",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, i64>(4)?,
            r.get::<_, i64>(5)?,
            r.get::<_, Option<i64>>(6)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (project, project_path, root, outcome, drifted, checked_at, checked_ok_at) = row?;
        out.push(DriftRootRecord {
            project: ProjectId(project as u64),
            project_path,
            root,
            outcome: DriftOutcome::from_str(&outcome)?,
            drifted: drifted as u32,
            checked_at,
            checked_ok_at,
        });
    }
    Ok(out)
}
