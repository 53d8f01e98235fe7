//! Drift: the schedule's ticks (an occurrence claimed and its job queued in one transaction, so
//! that of N replicas waking at once exactly one queues the tick) and each root's last check.

use super::queue::enqueue_in;
use super::sql::{args, Conn, Sql};
use super::types::{DriftOutcome, DriftRootRecord, QueueJobId};
use super::{now_ms, read, write, Store};
use crate::core::events::Job;
use crate::core::ids::ProjectId;
use anyhow::Result;

static CLAIM_TICK: Sql = Sql::both(
    "INSERT INTO drift_ticks (tick_at, claimed_at) VALUES (?1, ?2) ON CONFLICT (tick_at) DO NOTHING",
);
static SET_TICK_JOB: Sql = Sql::both("UPDATE drift_ticks SET job_id = ?2 WHERE tick_at = ?1");
static LAST_TICK: Sql = Sql::both("SELECT MAX(tick_at) FROM drift_ticks");
/// A check that could not check keeps the time of the last one that could.
static RECORD_ROOT: Sql = Sql::both(
    "INSERT INTO drift_roots (project_id, root, project_path, outcome, drifted, checked_at,
                              checked_ok_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
     ON CONFLICT (project_id, root) DO UPDATE SET
       project_path = excluded.project_path, outcome = excluded.outcome,
       drifted = excluded.drifted, checked_at = excluded.checked_at,
       checked_ok_at = COALESCE(excluded.checked_ok_at, drift_roots.checked_ok_at)",
);
/// `?2`: the roots to keep, a JSON list; each database reads it with its own JSON function.
static FORGET_ROOTS: Sql = Sql::each(
    "DELETE FROM drift_roots WHERE project_id = ?1
       AND root NOT IN (SELECT value FROM json_each(?2))",
    "DELETE FROM drift_roots WHERE project_id = ?1
       AND root NOT IN (SELECT value FROM json_array_elements_text(CAST(?2 AS TEXT)::json))",
);
static ROOTS: Sql = Sql::both(
    "SELECT project_id, project_path, root, outcome, drifted, checked_at, checked_ok_at
       FROM drift_roots ORDER BY project_path, root",
);

/// The newest claimed tick (for `planbot doctor` too).
pub(super) async fn last_tick(c: &impl Conn) -> Result<Option<i64>> {
    c.one(&LAST_TICK, &[]).await?.get(0)
}

/// Every root's last check, by project path and root (for `planbot doctor` too).
pub(super) async fn roots(c: &impl Conn) -> Result<Vec<DriftRootRecord>> {
    let mut out = Vec::new();
    for r in c.rows(&ROOTS, &[]).await? {
        out.push(DriftRootRecord {
            project: ProjectId(r.get::<i64>(0)? as u64),
            project_path: r.get(1)?,
            root: r.get(2)?,
            outcome: r.get::<String>(3)?.parse::<DriftOutcome>()?,
            drifted: r.get::<i64>(4)? as u32,
            checked_at: r.get(5)?,
            checked_ok_at: r.get(6)?,
        });
    }
    Ok(out)
}

impl Store {
    /// Claim the drift schedule's tick of occurrence `at` (unix ms) and queue its
    /// `Job::DriftTick`, in one write: `None` when any replica already claimed it.
    pub async fn claim_drift_tick(&self, at: i64) -> Result<Option<QueueJobId>> {
        write!(self, |c| {
            let now = now_ms();
            if c.execute(&CLAIM_TICK, &args![at, now]).await? == 0 {
                return Ok(None);
            }
            let job = enqueue_in(c, &Job::DriftTick { at }, None, now).await?.id;
            c.execute(&SET_TICK_JOB, &args![at, job]).await?;
            Ok(job)
        })
    }

    /// The newest claimed drift tick (unix ms), if any ever was.
    pub async fn last_drift_tick(&self) -> Result<Option<i64>> {
        read!(self, |c| last_tick(c).await)
    }

    /// Record a root's drift check, replacing its last one (a check that could not check
    /// keeps the time of the last one that could).
    pub async fn record_drift_root(&self, r: DriftRootRecord) -> Result<()> {
        let args = args![
            r.project,
            r.root,
            r.project_path,
            r.outcome.as_str(),
            i64::from(r.drifted),
            r.checked_at,
            r.checked_ok_at
        ];
        self.write_one(&RECORD_ROOT, args).await
    }

    /// Forget the drift checks of `project`'s roots not in `keep` (removed from its
    /// `.planbot.toml`, or no longer checked).
    pub async fn forget_drift_roots(&self, project: ProjectId, keep: Vec<String>) -> Result<()> {
        let args = args![project, serde_json::to_string(&keep)?];
        self.write_one(&FORGET_ROOTS, args).await
    }

    /// Every root's last drift check, by project path and root.
    pub async fn drift_roots(&self) -> Result<Vec<DriftRootRecord>> {
        read!(self, |c| roots(c).await)
    }
}
