//! SQL for the drift schedule's ticks: an occurrence claimed and its job queued, in one
//! transaction, so that of N replicas waking at once exactly one queues the tick.

use super::queue::enqueue_in;
use super::PgStore;
use crate::capabilities::store::now_ms;
use crate::capabilities::store::types::QueueJobId;
use crate::core::events::Job;
use anyhow::Result;

/// Claim the tick of occurrence `at`: `None` when a replica already claimed it, else the
/// queued `drift_tick` job.
pub(super) async fn claim(store: &PgStore, at: i64) -> Result<Option<QueueJobId>> {
    let now = now_ms();
    let mut c = store.client().await?;
    let tx = c.transaction().await?;
    let inserted = tx
        .execute(
            "INSERT INTO drift_ticks (tick_at, claimed_at) VALUES ($1, $2) ON CONFLICT (tick_at) DO NOTHING",
            &[&at, &now],
        )
        .await?;
    if inserted == 0 {
        return Ok(None);
    }
    let job = enqueue_in(&tx, &Job::DriftTick { at }, None, now).await?.id;
    tx.execute(
        "UPDATE drift_ticks SET job_id = $2 WHERE tick_at = $1",
        &[&at, &job.map(|j| j.0)],
    )
    .await?;
    tx.commit().await?;
    Ok(job)
}

/// The newest claimed tick.
pub(super) async fn last(store: &PgStore) -> Result<Option<i64>> {
    let c = store.client().await?;
    let row = c
        .query_one("SELECT MAX(tick_at) FROM drift_ticks", &[])
        .await?;
    Ok(row.get(0))
}
