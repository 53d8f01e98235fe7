//! SQL for the drift schedule's ticks: an occurrence claimed and its job queued, in one write.

use super::queue;
use crate::capabilities::store::types::QueueJobId;
use crate::core::events::Job;
use anyhow::Result;
use rusqlite::{params, Connection};

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
