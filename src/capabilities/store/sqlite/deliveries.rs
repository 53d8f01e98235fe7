//! SQL for webhook deliveries: one row per authentic delivery, keyed for de-duplication.

use super::queue;
use crate::capabilities::store::types::{DeliveryOutcome, NewDelivery};
use crate::core::events::Job;
use anyhow::Result;
use rusqlite::{params, Connection, OptionalExtension};

/// Record one delivery and enqueue its jobs; a key seen before is a duplicate and enqueues nothing.
pub(super) fn record(
    conn: &Connection,
    d: &NewDelivery,
    jobs: &[Job],
    now: i64,
) -> Result<DeliveryOutcome> {
    let inserted = conn.execute(
        "INSERT INTO deliveries (key, event, outcome, project_id, mr_iid, received_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(key) DO NOTHING",
        params![
            d.key,
            d.event,
            d.outcome,
            d.project.map(|p| p.0 as i64),
            d.mr.map(|m| m.0 as i64),
            now
        ],
    )?;
    if inserted == 0 {
        return Ok(DeliveryOutcome {
            duplicate: true,
            ..Default::default()
        });
    }
    let delivery_id = conn.last_insert_rowid();
    let mut out = DeliveryOutcome::default();
    for job in jobs {
        let e = queue::enqueue(conn, job, Some(delivery_id), now)?;
        out.enqueued.extend(e.id);
        out.cancel_running.extend(e.cancel_running);
    }
    Ok(out)
}

pub(super) fn count(conn: &Connection) -> Result<u64> {
    Ok(conn.query_row("SELECT COUNT(*) FROM deliveries", [], |r| {
        r.get::<_, i64>(0)
    })? as u64)
}

pub(super) fn outcome(conn: &Connection, key: &str) -> Result<Option<String>> {
    Ok(conn
        .query_row(
            "SELECT outcome FROM deliveries WHERE key = ?1",
            [key],
            |r| r.get(0),
        )
        .optional()?)
}
