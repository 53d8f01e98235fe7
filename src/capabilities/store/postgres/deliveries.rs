//! SQL for webhook deliveries on PostgreSQL: one row per authentic delivery, keyed for de-duplication.

use super::queue;
use super::PgStore;
use crate::capabilities::store::now_ms;
use crate::capabilities::store::types::{DeliveryOutcome, NewDelivery};
use crate::core::events::Job;
use anyhow::Result;

pub(super) async fn record(
    store: &PgStore,
    d: NewDelivery,
    jobs: Vec<Job>,
) -> Result<DeliveryOutcome> {
    let now = now_ms();
    let mut c = store.client().await?;
    let tx = c.transaction().await?;
    // A replica that gets the same key at the same moment waits here for the first
    // transaction, then finds the row: one row whichever replica got it.
    let insert = tx
        .prepare_cached(
            "INSERT INTO deliveries (key, event, outcome, project_id, mr_iid, received_at)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (key) DO NOTHING RETURNING id",
        )
        .await?;
    let inserted = tx
        .query_opt(
            &insert,
            &[
                &d.key,
                &d.event,
                &d.outcome,
                &d.project.map(|p| p.0 as i64),
                &d.mr.map(|m| m.0 as i64),
                &now,
            ],
        )
        .await?;
    let Some(row) = inserted else {
        return Ok(DeliveryOutcome {
            duplicate: true,
            ..Default::default()
        });
    };
    let delivery_id: i64 = row.get(0);
    let mut out = DeliveryOutcome::default();
    for job in &jobs {
        let e = queue::enqueue_in(&tx, job, Some(delivery_id), now).await?;
        out.enqueued.extend(e.id);
        out.cancel_running.extend(e.cancel_running);
    }
    tx.commit().await?;
    Ok(out)
}

pub(super) async fn count(store: &PgStore) -> Result<u64> {
    let row = store
        .client()
        .await?
        .query_one("SELECT COUNT(*) FROM deliveries", &[])
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

pub(super) async fn outcome(store: &PgStore, key: String) -> Result<Option<String>> {
    Ok(store
        .client()
        .await?
        .query_opt("SELECT outcome FROM deliveries WHERE key = $1", &[&key])
        .await?
        .map(|r| r.get(0)))
}
