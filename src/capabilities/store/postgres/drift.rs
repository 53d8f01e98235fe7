//! SQL for drift: the schedule's ticks (an occurrence claimed and its job queued in one
//! transaction, so that of N replicas waking at once exactly one queues the tick) and each
//! root's last check.

use super::queue::enqueue_in;
use super::PgStore;
use crate::capabilities::store::now_ms;
use crate::capabilities::store::types::{DriftOutcome, DriftRootRecord, QueueJobId};
use crate::core::events::Job;
use crate::core::ids::ProjectId;
use anyhow::Result;
use std::str::FromStr;

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
pub(super) async fn last(c: &tokio_postgres::Client) -> Result<Option<i64>> {
    let row = c
        .query_one("SELECT MAX(tick_at) FROM drift_ticks", &[])
        .await?;
    Ok(row.get(0))
}

/// Record a root's check (replacing the last one); a check that could not check keeps the
/// time of the last one that could.
pub(super) async fn record_root(store: &PgStore, r: &DriftRootRecord) -> Result<()> {
    let c = store.client().await?;
    c.execute(
        "INSERT INTO drift_roots (project_id, root, project_path, outcome, drifted, checked_at, checked_ok_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (project_id, root) DO UPDATE SET
           project_path = excluded.project_path, outcome = excluded.outcome,
           drifted = excluded.drifted, checked_at = excluded.checked_at,
           checked_ok_at = COALESCE(excluded.checked_ok_at, drift_roots.checked_ok_at)",
        &[
            &(r.project.0 as i64),
            &r.root,
            &r.project_path,
            &r.outcome.as_str(),
            &(r.drifted as i64),
            &r.checked_at,
            &r.checked_ok_at,
        ],
    )
    .await?;
    Ok(())
}

/// Forget the roots of `project` not in `keep` (removed, or no longer checked).
pub(super) async fn forget_roots(
    store: &PgStore,
    project: ProjectId,
    keep: &[String],
) -> Result<()> {
    let c = store.client().await?;
    c.execute(
        "DELETE FROM drift_roots WHERE project_id = $1 AND NOT (root = ANY($2))",
        &[&(project.0 as i64), &keep],
    )
    .await?;
    Ok(())
}

/// Every root's last check, by project and root.
pub(super) async fn roots(c: &tokio_postgres::Client) -> Result<Vec<DriftRootRecord>> {
    let rows = c
        .query(
            "SELECT project_id, project_path, root, outcome, drifted, checked_at, checked_ok_at
               FROM drift_roots ORDER BY project_path, root",
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(DriftRootRecord {
                project: ProjectId(r.get::<_, i64>(0) as u64),
                project_path: r.get(1),
                root: r.get(2),
                outcome: DriftOutcome::from_str(r.get::<_, &str>(3))?,
                drifted: r.get::<_, i64>(4) as u32,
                checked_at: r.get(5),
                checked_ok_at: r.get(6),
            })
        })
        .collect()
}
