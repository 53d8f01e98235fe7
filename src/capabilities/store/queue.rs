//! Webhook deliveries (one row per authentic delivery, keyed for de-duplication) and planbot's
//! durable job queue: enqueue (with supersede), claim (on PostgreSQL under a lease), heartbeat,
//! finish, cancel, list.

use super::sql::{args, Arg, Conn, Row, Sql};
use super::types::{
    superseded_kinds, ClaimedJob, DeliveryOutcome, Enqueued, JobEnd, JobRow, Lease, NewDelivery,
    QueueJobId, QueueJobKind, QueueJobState,
};
use super::{now_ms, read, write, Db, Store};
use crate::core::events::{Job, Redundant, AUTHOR_FIELDS};
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use anyhow::Result;
use std::sync::LazyLock;
use std::time::Duration;

static INSERT_DELIVERY: Sql = Sql::both(
    "INSERT INTO deliveries (key, event, outcome, project_id, mr_iid, received_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (key) DO NOTHING RETURNING id",
);
static DELIVERY_COUNT: Sql = Sql::both("SELECT COUNT(*) FROM deliveries");
static DELIVERY_OUTCOME: Sql = Sql::both("SELECT outcome FROM deliveries WHERE key = ?1");

/// One MR's enqueues (dedupe, supersede) are serialised across replicas.
static MR_LOCK: Sql = Sql::postgres("SELECT pg_advisory_xact_lock(hashtextextended(?1, 0))");
static SAME_QUEUED: Sql = Sql::both(
    "SELECT id FROM jobs WHERE project_id IS NOT DISTINCT FROM ?1
       AND mr_iid IS NOT DISTINCT FROM ?2 AND state = 'queued' AND payload = ?3 LIMIT 1",
);
/// Every replica's idle workers hear of the job when its transaction commits
/// (`postgres::notices`); so does a plan job waiting for its units when one ends
/// ([`Store::finish_unit`]).
pub(super) static NOTIFY_JOB: Sql = Sql::postgres("SELECT pg_notify('planbot_jobs', '')");
static INSERT_JOB: Sql = Sql::both(
    "INSERT INTO jobs (kind, project_id, mr_iid, sha, payload, state, delivery_id, created_at)
     VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7) RETURNING id",
);
/// A head's plan jobs still to run or running.
static HEAD_PENDING: Sql = Sql::both(
    "SELECT COUNT(*) FROM jobs WHERE kind = 'plan' AND project_id = ?1 AND mr_iid = ?2
       AND sha = ?3 AND state IN ('queued', 'running')",
);
/// A head's plans: its plan jobs queued, running or done, and its finished plan runs.
static HEAD_PLANS: Sql = Sql::both(
    "SELECT (SELECT COUNT(*) FROM jobs WHERE kind = 'plan' AND project_id = ?1 AND mr_iid = ?2
               AND sha = ?3 AND state IN ('queued', 'running', 'done'))
          + (SELECT COUNT(*) FROM runs WHERE kind = 'plan' AND project_id = ?1 AND mr_iid = ?2
               AND sha = ?3 AND state IN ('succeeded', 'failed'))",
);

/// An MR's live jobs (of kind `?3`, or all; a plan's root units with the plans); PostgreSQL
/// locks them against claims meanwhile.
macro_rules! live_of_mr {
    () => {
        "project_id = ?1 AND mr_iid = ?2
         AND (CAST(?3 AS TEXT) IS NULL OR kind = ?3 OR (?3 = 'plan' AND kind = 'plan_root'))
         AND state IN ('queued', 'running')"
    };
}
static LIVE_OF_MR: Sql = Sql::each(
    concat!("SELECT id, state FROM jobs WHERE ", live_of_mr!()),
    concat!(
        "SELECT id, state FROM jobs WHERE ",
        live_of_mr!(),
        " FOR UPDATE"
    ),
);
static CANCEL_LIVE_OF_MR: Sql = Sql::both(concat!(
    "UPDATE jobs SET state = 'canceled', detail = ?4, finished_at = ?5 WHERE ",
    live_of_mr!()
));

/// Claims are serialised across replicas (the fair share counts what the others run).
static CLAIM_LOCK: Sql =
    Sql::postgres("SELECT pg_advisory_xact_lock(hashtextextended('planbot-claim', 0))");
/// The claim: the oldest claimable job whose author (NULL: planbot's own work, one bucket) and
/// whose MR each hold fewer than `?2` running jobs. The author is read from the payload
/// ([`AUTHOR_FIELDS`]). On PostgreSQL a job running on a replica whose lease expired is
/// claimable too, the claim is leased (`?3` the replica, `?4` the lease's end), and SKIP LOCKED
/// keeps it from waiting on a job a supersede holds.
/// The author of job row `t`, read from its payload ([`AUTHOR_FIELDS`]): SQLite's text.
fn lite_author(t: &str) -> String {
    let [a, b] = AUTHOR_FIELDS;
    format!("COALESCE(json_extract({t}.payload, '$.{a}'), json_extract({t}.payload, '$.{b}'))")
}

/// [`lite_author`] in PostgreSQL's text.
fn pg_author(t: &str) -> String {
    let [a, b] = AUTHOR_FIELDS;
    format!("COALESCE(({t}.payload::jsonb) ->> '{a}', ({t}.payload::jsonb) ->> '{b}')")
}

/// How a claim on PostgreSQL marks the job `next` found: running, leased to replica `?3`
/// until `?4`.
const PG_CLAIM_NEXT: &str = "UPDATE jobs SET state = 'running', started_at = ?1,
                attempts = attempts + 1, owner = ?3, lease_expires_at = ?4
         FROM next WHERE jobs.id = next.id
         RETURNING jobs.id, jobs.payload, jobs.attempts";

static CLAIM: LazyLock<Sql> = LazyLock::new(|| {
    let (lite, pg) = (lite_author, pg_author);
    let sqlite = format!(
        "UPDATE jobs SET state = 'running', started_at = ?1, attempts = attempts + 1
         WHERE id = (
             SELECT q.id FROM jobs q WHERE q.state = 'queued' AND q.kind <> 'plan_root'
               AND (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running'
                      AND r.kind <> 'plan_root' AND {ar} IS {aq}) < ?2
               AND (q.mr_iid IS NULL OR (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running'
                      AND r.kind <> 'plan_root' AND r.project_id IS q.project_id
                      AND r.mr_iid = q.mr_iid) < ?2)
             ORDER BY q.id LIMIT 1)
         RETURNING id, payload, attempts",
        ar = lite("r"),
        aq = lite("q"),
    );
    let postgres = format!(
        "WITH next AS (
             SELECT q.id FROM jobs q
             WHERE (q.state = 'queued' OR (q.state = 'running' AND q.lease_expires_at < ?1))
               AND q.kind <> 'plan_root'
               AND (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running' AND r.kind <> 'plan_root'
                      AND r.lease_expires_at >= ?1 AND {ar} IS NOT DISTINCT FROM {aq}) < ?2
               AND (q.mr_iid IS NULL OR (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running'
                      AND r.kind <> 'plan_root' AND r.lease_expires_at >= ?1
                      AND r.project_id = q.project_id AND r.mr_iid = q.mr_iid) < ?2)
             ORDER BY q.id LIMIT 1 FOR UPDATE OF q SKIP LOCKED)
         {PG_CLAIM_NEXT}",
        ar = pg("r"),
        aq = pg("q"),
    );
    Sql::each(sqlite.leak(), postgres.leak())
});
/// The claim of a root unit (PostgreSQL only: units are queued on a shared store): the oldest
/// unit that no plan job of this replica queued (that job plans its roots nobody takes), whose
/// author holds fewer than `?2` units running on this replica. No cap per MR: one MR's roots
/// spread over every replica is what units are for.
static CLAIM_UNIT: LazyLock<Sql> = LazyLock::new(|| {
    let postgres = format!(
        "WITH next AS (
             SELECT q.id FROM jobs q
             WHERE q.kind = 'plan_root'
               AND (q.state = 'queued' OR (q.state = 'running' AND q.lease_expires_at < ?1))
               AND NOT EXISTS (SELECT 1 FROM jobs p
                      WHERE p.id = ((q.payload::jsonb) ->> 'parent')::bigint AND p.owner = ?3)
               AND (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running' AND r.kind = 'plan_root'
                      AND r.owner = ?3 AND r.lease_expires_at >= ?1
                      AND {ar} IS NOT DISTINCT FROM {aq}) < ?2
             ORDER BY q.id LIMIT 1 FOR UPDATE OF q SKIP LOCKED)
         {PG_CLAIM_NEXT}",
        ar = pg_author("r"),
        aq = pg_author("q"),
    );
    Sql::postgres(postgres.leak())
});
/// A job taken over from a dead replica: its runs there ended with it.
static INTERRUPT_JOB_RUNS: Sql = Sql::both(
    "UPDATE runs SET state = 'interrupted', finished_at = ?2 WHERE job_id = ?1 AND state = 'running'",
);
static FAIL_UNREADABLE: Sql =
    Sql::both("UPDATE jobs SET state = 'failed', finished_at = ?2, detail = ?3 WHERE id = ?1");

static EXTEND_LEASE: Sql = Sql::postgres(
    "UPDATE jobs SET lease_expires_at = ?3 WHERE id = ?1 AND owner = ?2 AND state = 'running'",
);
static STATE_AND_OWNER: Sql = Sql::each(
    "SELECT state, NULL FROM jobs WHERE id = ?1",
    "SELECT state, owner FROM jobs WHERE id = ?1",
);
/// A job canceled meanwhile stays canceled; on PostgreSQL a job another replica took over is
/// left to it.
static FINISH_JOB: Sql = Sql::each(
    "UPDATE jobs SET state = ?2, detail = COALESCE(?3, detail), finished_at = ?4
     WHERE id = ?1 AND state = 'running'",
    "UPDATE jobs SET state = ?2, detail = COALESCE(?3, detail), finished_at = ?4
     WHERE id = ?1 AND state = 'running' AND owner = ?5",
);

/// Not a live replica's (or this one's, which at start-up runs nothing): `?1` now, `?2` this
/// replica.
macro_rules! owner_gone {
    () => {
        "(owner IS NULL OR owner = ?2 OR owner NOT IN
           (SELECT owner FROM replicas WHERE expires_at >= ?1))"
    };
}
pub(super) use owner_gone;

/// Jobs whose runner is gone go back to the queue; on PostgreSQL only those whose replica is
/// gone (the others are running elsewhere right now).
static REQUEUE_RUNNING: Sql = Sql::each(
    "UPDATE jobs SET state = 'queued', detail = 'interrupted by a restart; re-run'
     WHERE state = 'running'",
    "UPDATE jobs SET state = 'queued', detail = 'interrupted by a restart; re-run',
            owner = NULL, lease_expires_at = NULL
     WHERE state = 'running' AND (owner = ?2 OR lease_expires_at < ?1)",
);
static INTERRUPT_RUNS: Sql = Sql::each(
    "UPDATE runs SET state = 'interrupted', finished_at = ?1 WHERE state = 'running'",
    concat!(
        "UPDATE runs SET state = 'interrupted', finished_at = ?1 WHERE state = 'running' AND ",
        owner_gone!()
    ),
);

static QUEUE_DEPTH: Sql = Sql::both("SELECT COUNT(*) FROM jobs WHERE state = 'queued'");
macro_rules! job_select {
    () => {
        "SELECT id, kind, project_id, mr_iid, sha, state, attempts, detail, created_at,
                started_at, finished_at, payload FROM jobs"
    };
}
static JOB: Sql = Sql::both(concat!(job_select!(), " WHERE id = ?1"));
static RECENT_JOBS: Sql = Sql::both(concat!(job_select!(), " ORDER BY id DESC LIMIT ?1"));

fn job_row(r: &Row) -> Result<JobRow> {
    Ok(JobRow {
        id: QueueJobId(r.get(0)?),
        kind: r.get(1)?,
        project: r.get::<Option<i64>>(2)?.map(|p| ProjectId(p as u64)),
        mr: r.get::<Option<i64>>(3)?.map(|m| MrIid(m as u64)),
        sha: r.get(4)?,
        state: r.get(5)?,
        attempts: r.get::<i64>(6)? as u32,
        detail: r.get(7)?,
        created_at: r.get(8)?,
        started_at: r.get(9)?,
        finished_at: r.get(10)?,
        job: serde_json::from_str(&r.get::<String>(11)?).ok(),
    })
}

/// Queue `job` in `c`'s transaction: nothing when an identical job is queued or it adds nothing
/// to its head's plans ([`Job::redundant`]); else the jobs it supersedes are canceled first.
pub(super) async fn enqueue_in(
    c: &impl Conn,
    job: &Job,
    delivery: Option<i64>,
    now: i64,
) -> Result<Enqueued> {
    let (project, mr) = job.mr().unzip();
    let payload = serde_json::to_string(job)?;
    if c.is_postgres() {
        let key = format!(
            "planbot-mr:{:?}:{:?}",
            project.map(|p| p.0),
            mr.map(|m| m.0)
        );
        c.execute(&MR_LOCK, &args![key]).await?;
    }
    let same = c.opt(&SAME_QUEUED, &args![project, mr, &payload]).await?;
    if same.is_some() || redundant(c, job).await? {
        return Ok(Enqueued::default());
    }
    let mut cancel_running = Vec::new();
    if let (Some((p, m)), Some(kind)) = (job.mr(), superseded_kinds(job)) {
        cancel_running = cancel_in(c, p, m, kind, &job.supersede_reason(), now).await?;
    }
    let kind = QueueJobKind::of(job).as_str();
    let sha = job.sha().map(|s| s.0.clone());
    let args = args![kind, project, mr, sha, payload, delivery, now];
    let id = c.one(&INSERT_JOB, &args).await?.get(0)?;
    if c.is_postgres() {
        c.execute(&NOTIFY_JOB, &[]).await?;
    }
    Ok(Enqueued {
        id: Some(QueueJobId(id)),
        cancel_running,
    })
}

/// Whether `job` adds nothing to the plans of its head already stored; under the MR's lock on
/// PostgreSQL, so two replicas enqueuing the same head at once agree.
async fn redundant(c: &impl Conn, job: &Job) -> Result<bool> {
    let (Some((p, m)), Some(sha)) = (job.mr(), job.sha()) else {
        return Ok(false);
    };
    let sql = match job.redundant() {
        Redundant::Never => return Ok(false),
        Redundant::WhileHeadQueuedOrRunning => &HEAD_PENDING,
        Redundant::OnceHeadPlanned => &HEAD_PLANS,
    };
    Ok(c.one(sql, &args![p, m, sha]).await?.get::<i64>(0)? > 0)
}

/// Cancel an MR's queued and running jobs (of one kind, or all); returns the running ones.
async fn cancel_in(
    c: &impl Conn,
    p: ProjectId,
    m: MrIid,
    kind: Option<QueueJobKind>,
    why: &str,
    now: i64,
) -> Result<Vec<QueueJobId>> {
    let kind = kind.map(QueueJobKind::as_str);
    let mut running = Vec::new();
    for row in c.rows(&LIVE_OF_MR, &args![p, m, kind]).await? {
        if row.get::<String>(1)? == QueueJobState::Running.as_str() {
            running.push(QueueJobId(row.get(0)?));
        }
    }
    c.execute(&CANCEL_LIVE_OF_MR, &args![p, m, kind, why, now])
        .await?;
    running.sort();
    Ok(running)
}

/// Take the oldest claimable job of an author and an MR holding fewer than `share` running
/// jobs, and mark it running. A payload this version cannot read is failed rather than
/// retried forever.
async fn claim_in(c: &impl Conn, share: i64) -> Result<Option<ClaimedJob>> {
    let now = now_ms();
    let mut args = args![now, share];
    if let Some((replica, lease)) = c.owner() {
        c.execute(&CLAIM_LOCK, &[]).await?;
        args.extend(args![replica, now + lease]);
    }
    let mut row = c.opt(&CLAIM, &args).await?;
    if row.is_none() && c.is_postgres() {
        row = c.opt(&CLAIM_UNIT, &args).await?;
    }
    let Some(row) = row else {
        return Ok(None);
    };
    let (id, payload, attempts) = (
        row.get::<i64>(0)?,
        row.get::<String>(1)?,
        row.get::<i64>(2)?,
    );
    c.execute(&INTERRUPT_JOB_RUNS, &args![id, now]).await?;
    match serde_json::from_str::<Job>(&payload) {
        Ok(job) => Ok(Some(ClaimedJob {
            id: QueueJobId(id),
            job,
            attempts: attempts as u32,
        })),
        Err(e) => {
            let why = format!("unreadable job payload: {e}");
            c.execute(&FAIL_UNREADABLE, &args![id, now, why]).await?;
            Ok(None)
        }
    }
}

impl Store {
    /// Record one authentic delivery and enqueue its jobs, atomically. A delivery whose key was
    /// seen before (by any replica) is a duplicate: nothing is enqueued again.
    pub async fn record_delivery(&self, d: NewDelivery, jobs: Vec<Job>) -> Result<DeliveryOutcome> {
        write!(self, |c| {
            let now = now_ms();
            let row = args![d.key, d.event, d.outcome, d.project, d.mr, now];
            // A replica that gets the same key at the same moment waits here for the first
            // transaction, then finds the row: one row whichever replica got it.
            let Some(row) = c.opt(&INSERT_DELIVERY, &row).await? else {
                return Ok(DeliveryOutcome {
                    duplicate: true,
                    ..Default::default()
                });
            };
            let delivery = row.get(0)?;
            let mut out = DeliveryOutcome::default();
            for job in &jobs {
                let e = enqueue_in(c, job, Some(delivery), now).await?;
                out.enqueued.extend(e.id);
                out.cancel_running.extend(e.cancel_running);
            }
            Ok(out)
        })
    }

    /// How many deliveries are recorded (all time).
    pub async fn delivery_count(&self) -> Result<u64> {
        read!(self, |c| Ok(
            c.one(&DELIVERY_COUNT, &[]).await?.get::<i64>(0)? as u64
        ))
    }

    /// The recorded outcome of a delivery by its key.
    pub async fn delivery_outcome(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_string();
        read!(
            self,
            |c| match c.opt(&DELIVERY_OUTCOME, &args![key]).await? {
                Some(row) => row.get(0),
                None => Ok(None),
            }
        )
    }

    /// Enqueue a job outside a delivery (reconcile, commands, re-plans after a merge).
    pub async fn enqueue(&self, job: Job) -> Result<Enqueued> {
        write!(self, |c| enqueue_in(c, &job, None, now_ms()).await)
    }

    /// Take the oldest claimable job and mark it running (leased to this replica), whoever's
    /// it is.
    pub async fn claim_next(&self) -> Result<Option<ClaimedJob>> {
        self.claim_within(usize::MAX).await
    }

    /// Take the oldest claimable job whose author, and whose MR, hold fewer than `share`
    /// running jobs (the fair share of workers: one author's or one MR's jobs leave the other
    /// workers to everyone else), and mark it running.
    pub async fn claim_within(&self, share: usize) -> Result<Option<ClaimedJob>> {
        // The jobs are left to the replicas that know the database's schema.
        if let Db::Postgres(db) = &self.db {
            if db.schema_current().is_err() {
                return Ok(None);
            }
        }
        let share = i64::try_from(share).unwrap_or(i64::MAX);
        write!(self, |c| claim_in(c, share).await)
    }

    /// Extend this replica's lease of a running job; says whether it was canceled meanwhile
    /// (anywhere) or taken by another replica.
    pub async fn heartbeat(&self, id: QueueJobId) -> Result<Lease> {
        write!(self, |c| {
            let owner = c.owner();
            if let Some((replica, lease)) = owner {
                let until = now_ms() + lease;
                if c.execute(&EXTEND_LEASE, &args![id, replica, until]).await? == 1 {
                    return Ok(Lease::Held);
                }
            }
            let Some(row) = c.opt(&STATE_AND_OWNER, &args![id]).await? else {
                return Ok(Lease::Lost);
            };
            let state: QueueJobState = row.get::<String>(0)?.parse()?;
            let mine = row.get::<Option<String>>(1)?.as_deref() == owner.map(|o| o.0);
            Ok(match state {
                // On SQLite nothing outside this process takes a job.
                QueueJobState::Running if owner.is_none() => Lease::Held,
                QueueJobState::Canceled if mine => Lease::Canceled,
                _ => Lease::Lost,
            })
        })
    }

    /// Hears of every job enqueued on any replica, the moment its transaction commits (the
    /// value counts them; `None` on SQLite, where only this process enqueues).
    pub fn job_notices(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match &self.db {
            Db::Sqlite(_) => None,
            Db::Postgres(db) => db.job_notices(),
        }
    }

    /// How often a running job must call [`Store::heartbeat`]; `None`: never (SQLite, where
    /// nothing outside this process can take or cancel a job).
    pub fn heartbeat_every(&self) -> Option<Duration> {
        match &self.db {
            Db::Sqlite(_) => None,
            Db::Postgres(db) => Some(db.lease() / 3),
        }
    }

    /// Record how a running job ended. A job canceled meanwhile stays canceled; a job another
    /// replica took over is left to it.
    pub async fn finish_job(&self, id: QueueJobId, end: JobEnd) -> Result<()> {
        write!(self, |c| {
            let state = end.state().as_str();
            let mut args = args![id, state, end.detail(), now_ms()];
            args.extend(c.replica());
            c.execute(&FINISH_JOB, &args).await.map(drop)
        })
    }

    /// Cancel every queued or running job of an MR (e.g. when it closes). Returns the running
    /// ones, whose cancellation tokens the queue must fire (other replicas see the cancel on
    /// their next heartbeat).
    pub async fn cancel_mr(
        &self,
        project: ProjectId,
        mr: MrIid,
        why: &str,
    ) -> Result<Vec<QueueJobId>> {
        let why = why.to_string();
        write!(self, |c| cancel_in(c, project, mr, None, &why, now_ms())
            .await)
    }

    /// At start-up: jobs that were running when their process died go back to the queue (they
    /// run again); their runs are marked `interrupted`. Returns how many jobs were requeued.
    pub async fn requeue_interrupted(&self) -> Result<usize> {
        write!(self, |c| {
            let mut args: Vec<Arg> = args![now_ms()];
            args.extend(c.replica());
            let n = c.execute(&REQUEUE_RUNNING, &args).await?;
            c.execute(&INTERRUPT_RUNS, &args).await?;
            Ok(n as usize)
        })
    }

    /// Jobs still to run.
    pub async fn queue_depth(&self) -> Result<u64> {
        read!(self, |c| Ok(
            c.one(&QUEUE_DEPTH, &[]).await?.get::<i64>(0)? as u64
        ))
    }

    /// One job's row.
    pub async fn job(&self, id: QueueJobId) -> Result<Option<JobRow>> {
        read!(self, |c| c
            .opt(&JOB, &args![id])
            .await?
            .as_ref()
            .map(job_row)
            .transpose())
    }

    /// The newest jobs first (for pages and tests).
    pub async fn recent_jobs(&self, limit: u32) -> Result<Vec<JobRow>> {
        read!(self, |c| c
            .rows(&RECENT_JOBS, &args![limit])
            .await?
            .iter()
            .map(job_row)
            .collect())
    }

    /// Whether this head of the MR has a plan: a finished plan run, or a plan job queued/running/done.
    pub async fn head_has_plan(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<bool> {
        Ok(self.count(&HEAD_PLANS, args![project, mr, &sha]).await? > 0)
    }
}
