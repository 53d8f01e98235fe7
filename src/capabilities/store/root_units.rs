//! The root units of an MR's plan job on a shared store (PostgreSQL): queued by the plan job,
//! claimed by the other replicas' workers ([`super::queue`]) or taken back by the plan job
//! itself, and their sealed results handed back through `unit_results`.

use super::sql::{args, Conn, Sql};
use super::types::QueueJobId;
use super::{now_ms, read, write, Store};
use anyhow::Result;

/// A unit's result is deleted once its plan job read it; one never read goes after a day.
const RESULT_KEPT_FOR_MS: i64 = 24 * 3600 * 1000;

/// The units of plan job `?1` (a unit is queued after its plan job, so its id is larger).
macro_rules! units_of {
    () => {
        "kind = 'plan_root' AND id > ?1 AND (payload::jsonb ->> 'parent')::bigint = ?1"
    };
}

/// The plan job takes its own unit back: nobody claimed it, or the replica that did is gone
/// (its lease ran out). It is done as a job: the plan job plans the root itself.
static TAKE: Sql = Sql::postgres(
    "UPDATE jobs SET state = 'done', detail = ?3, finished_at = ?2, owner = ?4,
            lease_expires_at = NULL
     WHERE id = ?1 AND (state = 'queued' OR (state = 'running' AND lease_expires_at < ?2))",
);
/// The runs a lapsed unit had started: the replica that ran them is gone.
static INTERRUPT_UNIT_RUNS: Sql = Sql::postgres(
    "UPDATE runs SET state = 'interrupted', finished_at = ?2 WHERE job_id = ?1 AND state = 'running'",
);
static PROGRESS: Sql = Sql::postgres(concat!(
    "SELECT id, state, CASE WHEN lease_expires_at < ?2 THEN 1 ELSE 0 END,
            (SELECT COUNT(*) FROM unit_results u WHERE u.job_id = jobs.id)
     FROM jobs WHERE ",
    units_of!(),
    " ORDER BY id"
));
static FINISH: Sql = Sql::postgres(
    "UPDATE jobs SET state = 'done', finished_at = ?2
     WHERE id = ?1 AND state = 'running' AND owner = ?3",
);
static INSERT_RESULT: Sql = Sql::postgres(
    "INSERT INTO unit_results (job_id, parent_id, sealed, created_at) VALUES (?1, ?2, ?3, ?4)
     ON CONFLICT (job_id) DO NOTHING",
);
static SWEEP_RESULTS: Sql = Sql::postgres("DELETE FROM unit_results WHERE created_at < ?1");
static TAKE_RESULT: Sql =
    Sql::postgres("DELETE FROM unit_results WHERE job_id = ?1 RETURNING sealed");
static CANCEL_UNITS: Sql = Sql::postgres(concat!(
    "UPDATE jobs SET state = 'canceled', detail = ?2, finished_at = ?3
     WHERE state IN ('queued', 'running') AND ",
    units_of!()
));
static INTERRUPT_RUNS_OF_UNITS: Sql = Sql::postgres(concat!(
    "UPDATE runs SET state = 'interrupted', finished_at = ?2 WHERE state = 'running'
       AND job_id IN (SELECT id FROM jobs WHERE ",
    units_of!(),
    ")"
));
/// The runs of units whose end the plan job never read (a unit still live, or one whose result
/// is still there): they end `canceled`, with `?3` as their summary.
static CANCEL_UNREAD_RUNS: Sql = Sql::postgres(concat!(
    "UPDATE runs SET state = 'canceled', summary = ?3, finished_at = ?2 WHERE state = 'running'
       AND job_id IN (SELECT id FROM jobs WHERE ",
    units_of!(),
    " AND (state IN ('queued', 'running')
            OR id IN (SELECT job_id FROM unit_results WHERE parent_id = ?1)))"
));
static FORGET_RESULTS: Sql = Sql::postgres("DELETE FROM unit_results WHERE parent_id = ?1");
static OTHER_REPLICAS: Sql =
    Sql::postgres("SELECT COUNT(*) FROM replicas WHERE expires_at >= ?1 AND owner <> ?2");

/// Where a root unit is, as its plan job sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitProgress {
    /// Nobody took it yet.
    Queued,
    /// Another replica plans it; `lapsed`: that replica's lease ran out (it is gone).
    Running { lapsed: bool },
    /// Ended: with a result to read, or without one (the plan job took it back, or it failed
    /// or was canceled).
    Ended { result: bool },
}

impl Store {
    /// How many other replicas are alive on this shared store (0 on SQLite).
    pub async fn other_replicas(&self) -> Result<u64> {
        let Some(me) = self.replica().map(str::to_string) else {
            return Ok(0);
        };
        self.count(&OTHER_REPLICAS, args![now_ms(), me]).await
    }

    /// The plan job takes unit `id` back to plan its root itself; `false` when another replica
    /// has it (running under a live lease) or it ended.
    pub async fn take_unit(&self, id: QueueJobId, why: &str) -> Result<bool> {
        let why = why.to_string();
        write!(self, |c| {
            let now = now_ms();
            let me = c.replica();
            let mut a = args![id, now, why];
            a.extend(me);
            let taken = c.execute(&TAKE, &a).await? == 1;
            if taken {
                c.execute(&INTERRUPT_UNIT_RUNS, &args![id, now]).await?;
            }
            Ok(taken)
        })
    }

    /// Where each unit of plan job `parent` is, by its id.
    pub async fn unit_progress(
        &self,
        parent: QueueJobId,
    ) -> Result<Vec<(QueueJobId, UnitProgress)>> {
        let rows = read!(self, |c| c.rows(&PROGRESS, &args![parent, now_ms()]).await)?;
        rows.iter()
            .map(|r| {
                let state: String = r.get(1)?;
                let progress = match state.as_str() {
                    "queued" => UnitProgress::Queued,
                    "running" => UnitProgress::Running {
                        lapsed: r.get::<i64>(2)? == 1,
                    },
                    _ => UnitProgress::Ended {
                        result: r.get::<i64>(3)? > 0,
                    },
                };
                Ok((QueueJobId(r.get(0)?), progress))
            })
            .collect()
    }

    /// Unit `id` of plan job `parent` ended on this replica with `sealed`: its result and its
    /// end are written together, and neither when the unit was canceled or taken back
    /// meanwhile (`false`).
    pub async fn finish_unit(
        &self,
        id: QueueJobId,
        parent: QueueJobId,
        sealed: String,
    ) -> Result<bool> {
        write!(self, |c| {
            let now = now_ms();
            let mut a = args![id, now];
            a.extend(c.replica());
            if c.execute(&FINISH, &a).await? != 1 {
                return Ok(false);
            }
            c.execute(&SWEEP_RESULTS, &args![now - RESULT_KEPT_FOR_MS])
                .await?;
            c.execute(&INSERT_RESULT, &args![id, parent, sealed, now])
                .await?;
            // The plan job's replica hears of it at commit rather than at its next look.
            c.execute(&super::queue::NOTIFY_JOB, &[]).await?;
            Ok(true)
        })
    }

    /// Unit `id`'s result, read once: it is deleted as it is read.
    pub async fn take_unit_result(&self, id: QueueJobId) -> Result<Option<String>> {
        write!(self, |c| match c.opt(&TAKE_RESULT, &args![id]).await? {
            Some(row) => Ok(Some(row.get(0)?)),
            None => Ok(None),
        })
    }

    /// Plan job `parent` ends (`restarted`: starts again after an earlier attempt): its units
    /// still queued or running are canceled (the replicas running them hear it at their next
    /// heartbeat) and their results unread are deleted. At a restart their runs still running
    /// end `interrupted` (the attempt that would have ended them is gone); at the end, the runs
    /// of the units whose end it did not read end `canceled` with `why` (it ends the others
    /// itself, with its note).
    pub async fn end_units(&self, parent: QueueJobId, why: &str, restarted: bool) -> Result<()> {
        let why = why.to_string();
        write!(self, |c| {
            if !c.is_postgres() {
                return Ok(());
            }
            let now = now_ms();
            if restarted {
                c.execute(&INTERRUPT_RUNS_OF_UNITS, &args![parent, now])
                    .await?;
            } else {
                c.execute(&CANCEL_UNREAD_RUNS, &args![parent, now, why.clone()])
                    .await?;
            }
            c.execute(&CANCEL_UNITS, &args![parent, why, now]).await?;
            c.execute(&FORGET_RESULTS, &args![parent]).await?;
            Ok(())
        })
    }
}
