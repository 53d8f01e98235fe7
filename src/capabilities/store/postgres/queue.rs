//! SQL for planbot's durable job queue on PostgreSQL: enqueue (with supersede), claim under a lease, heartbeat, finish, cancel, list.

use super::{opt_u64, PgStore};
use crate::capabilities::store::now_ms;
use crate::capabilities::store::types::{
    superseded_kinds, ClaimedJob, Enqueued, JobEnd, JobRow, Lease, QueueJobId, QueueJobKind,
    QueueJobState,
};
use crate::core::events::{Job, Redundant, AUTHOR_FIELDS};
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use anyhow::Result;
use tokio_postgres::Row;

/// SQL true when `owner` is not a live replica (or is this one, which at start-up runs nothing).
pub(super) const OWNER_GONE: &str = "(owner IS NULL OR owner = $1 OR owner NOT IN
    (SELECT owner FROM replicas WHERE expires_at >= $2))";

/// Queue `job` in `c`'s transaction (dedupe, supersede). On the webhook's path, so its
/// statements are prepared once per pooled connection (`prepare_cached`), not on every call.
pub(super) async fn enqueue_in(
    c: &deadpool_postgres::Transaction<'_>,
    job: &Job,
    delivery: Option<i64>,
    now: i64,
) -> Result<Enqueued> {
    let (project, mr) = job
        .mr()
        .map(|(p, m)| (Some(p.0 as i64), Some(m.0 as i64)))
        .unwrap_or((None, None));
    let sha = job.sha().map(|s| s.0.clone());
    let payload = serde_json::to_string(job)?;
    // One MR's enqueues (dedupe, supersede) are serialised across replicas.
    let lock = c
        .prepare_cached("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .await?;
    let same = c
        .prepare_cached(
            "SELECT id FROM jobs WHERE project_id IS NOT DISTINCT FROM $1
               AND mr_iid IS NOT DISTINCT FROM $2 AND state = 'queued' AND payload = $3 LIMIT 1",
        )
        .await?;
    c.execute(&lock, &[&format!("planbot-mr:{project:?}:{mr:?}")])
        .await?;
    let same = c.query_opt(&same, &[&project, &mr, &payload]).await?;
    if same.is_some() || redundant_in(c, job).await? {
        return Ok(Enqueued::default());
    }
    let mut cancel_running = Vec::new();
    if let (Some((p, m)), Some(kind)) = (job.mr(), superseded_kinds(job)) {
        cancel_running = cancel_in(c, p, m, kind, &job.supersede_reason(), now).await?;
    }
    let insert = c
        .prepare_cached(
            "INSERT INTO jobs (kind, project_id, mr_iid, sha, payload, state, delivery_id, created_at)
             VALUES ($1, $2, $3, $4, $5, 'queued', $6, $7) RETURNING id",
        )
        .await?;
    let row = c
        .query_one(
            &insert,
            &[
                &QueueJobKind::of(job).as_str(),
                &project,
                &mr,
                &sha,
                &payload,
                &delivery,
                &now,
            ],
        )
        .await?;
    Ok(Enqueued {
        id: Some(QueueJobId(row.get(0))),
        cancel_running,
    })
}

/// Whether `job` adds nothing to the plans of its head already stored ([`Job::redundant`]);
/// under the MR's advisory lock, so two replicas enqueuing the same head at once agree.
pub(super) async fn redundant_in(
    c: &deadpool_postgres::Transaction<'_>,
    job: &Job,
) -> Result<bool> {
    let (Some((p, m)), Some(sha)) = (job.mr(), job.sha()) else {
        return Ok(false);
    };
    let states: &[&str] = match job.redundant() {
        Redundant::Never => return Ok(false),
        Redundant::WhileHeadQueuedOrRunning => &["queued", "running"],
        Redundant::OnceHeadPlanned => &["queued", "running", "done"],
    };
    let finished_runs = job.redundant() == Redundant::OnceHeadPlanned;
    let head_plans = c.prepare_cached(HEAD_PLANS).await?;
    let row = c
        .query_one(
            &head_plans,
            &[
                &(p.0 as i64),
                &(m.0 as i64),
                &sha.0,
                &states,
                &finished_runs,
            ],
        )
        .await?;
    Ok(row.get::<_, i64>(0) > 0)
}

/// How many plans one head has: its plan jobs in states `$4`, plus (when `$5`) its finished
/// plan runs.
pub(super) const HEAD_PLANS: &str =
    "SELECT (SELECT COUNT(*) FROM jobs WHERE kind = 'plan' AND project_id = $1
           AND mr_iid = $2 AND sha = $3 AND state = ANY($4))
      + (SELECT COUNT(*) FROM runs WHERE $5 AND kind = 'plan' AND project_id = $1
           AND mr_iid = $2 AND sha = $3 AND state IN ('succeeded', 'failed'))";

pub(super) async fn cancel_in(
    c: &deadpool_postgres::Transaction<'_>,
    p: ProjectId,
    m: MrIid,
    kind: Option<QueueJobKind>,
    why: &str,
    now: i64,
) -> Result<Vec<QueueJobId>> {
    let kind = kind.map(QueueJobKind::as_str);
    let cancel = c
        .prepare_cached(
            "WITH hit AS (
                 SELECT id, state FROM jobs
                 WHERE project_id = $1 AND mr_iid = $2 AND ($3::text IS NULL OR kind = $3)
                   AND state IN ('queued', 'running')
                 FOR UPDATE)
             UPDATE jobs SET state = 'canceled', detail = $4, finished_at = $5
             FROM hit WHERE jobs.id = hit.id
             RETURNING jobs.id, hit.state",
        )
        .await?;
    let rows = c
        .query(&cancel, &[&(p.0 as i64), &(m.0 as i64), &kind, &why, &now])
        .await?;
    let mut running: Vec<QueueJobId> = rows
        .iter()
        .filter(|r| r.get::<_, String>(1) == "running")
        .map(|r| QueueJobId(r.get(0)))
        .collect();
    running.sort();
    Ok(running)
}

pub(super) const JOB_SELECT: &str =
    "SELECT id, kind, project_id, mr_iid, sha, state, attempts, detail, \
    created_at, started_at, finished_at, payload FROM jobs";

pub(super) fn job_row(r: &Row) -> JobRow {
    JobRow {
        id: QueueJobId(r.get(0)),
        kind: r.get(1),
        project: opt_u64(r, 2).map(ProjectId),
        mr: opt_u64(r, 3).map(MrIid),
        sha: r.get(4),
        state: r.get(5),
        attempts: r.get::<_, i64>(6) as u32,
        detail: r.get(7),
        created_at: r.get(8),
        started_at: r.get(9),
        finished_at: r.get(10),
        job: serde_json::from_str(&r.get::<_, String>(11)).ok(),
    }
}

pub(super) async fn enqueue(store: &PgStore, job: Job) -> Result<Enqueued> {
    let mut c = store.client().await?;
    let tx = c.transaction().await?;
    let e = enqueue_in(&tx, &job, None, now_ms()).await?;
    tx.commit().await?;
    Ok(e)
}

/// The claim: the oldest queued job (or running on a replica whose lease expired) whose author
/// (NULL: planbot's own work, one bucket) and whose MR each hold fewer than `$4` running jobs
/// under a live lease. The author is read from the payload ([`AUTHOR_FIELDS`]).
fn claim_sql() -> String {
    let author = |t: &str| {
        let [a, b] = AUTHOR_FIELDS;
        format!("COALESCE(({t}.payload::jsonb) ->> '{a}', ({t}.payload::jsonb) ->> '{b}')")
    };
    format!(
        "WITH next AS (
             SELECT q.id FROM jobs q
             WHERE (q.state = 'queued' OR (q.state = 'running' AND q.lease_expires_at < $1))
               AND (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running'
                      AND r.lease_expires_at >= $1 AND {ar} IS NOT DISTINCT FROM {aq}) < $4
               AND (q.mr_iid IS NULL OR (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running'
                      AND r.lease_expires_at >= $1 AND r.project_id = q.project_id
                      AND r.mr_iid = q.mr_iid) < $4)
             ORDER BY q.id LIMIT 1 FOR UPDATE OF q SKIP LOCKED)
         UPDATE jobs SET state = 'running', started_at = $1, attempts = attempts + 1,
                owner = $2, lease_expires_at = $3
         FROM next WHERE jobs.id = next.id
         RETURNING jobs.id, jobs.payload, jobs.attempts",
        ar = author("r"),
        aq = author("q"),
    )
}

pub(super) async fn claim_next(store: &PgStore, share: usize) -> Result<Option<ClaimedJob>> {
    // The jobs are left to the replicas that know the database's schema.
    if store.schema_current().is_err() {
        return Ok(None);
    }
    let now = now_ms();
    let mut c = store.client().await?;
    let tx = c.transaction().await?;
    // Queued jobs, and running ones whose replica stopped renewing the lease. Claims are
    // serialised across replicas (the fair share counts what the others run); SKIP LOCKED
    // keeps a claim from waiting on a job a supersede holds.
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('planbot-claim', 0))",
        &[],
    )
    .await?;
    let share = i64::try_from(share).unwrap_or(i64::MAX);
    let row = tx
        .query_opt(
            &claim_sql(),
            &[&now, &store.opts.replica, &(now + store.lease_ms()), &share],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let (id, payload, attempts): (i64, String, i64) = (row.get(0), row.get(1), row.get(2));
    // A job taken over from a dead replica: its runs there ended with it.
    tx.execute(
        "UPDATE runs SET state = 'interrupted', finished_at = $2
         WHERE job_id = $1 AND state = 'running'",
        &[&id, &now],
    )
    .await?;
    let out = match serde_json::from_str::<Job>(&payload) {
        Ok(job) => Some(ClaimedJob {
            id: QueueJobId(id),
            job,
            attempts: attempts as u32,
        }),
        Err(e) => {
            tx.execute(
                "UPDATE jobs SET state = 'failed', finished_at = $2, detail = $3 WHERE id = $1",
                &[&id, &now, &format!("unreadable job payload: {e}")],
            )
            .await?;
            None
        }
    };
    tx.commit().await?;
    Ok(out)
}

pub(super) async fn heartbeat(store: &PgStore, id: QueueJobId) -> Result<Lease> {
    let now = now_ms();
    let c = store.client().await?;
    let extended = c
        .execute(
            "UPDATE jobs SET lease_expires_at = $3
             WHERE id = $1 AND owner = $2 AND state = 'running'",
            &[&id.0, &store.opts.replica, &(now + store.lease_ms())],
        )
        .await?;
    if extended == 1 {
        return Ok(Lease::Held);
    }
    let row = c
        .query_opt("SELECT state, owner FROM jobs WHERE id = $1", &[&id.0])
        .await?;
    Ok(match row {
        Some(r)
            if r.get::<_, String>(0) == QueueJobState::Canceled.as_str()
                && r.get::<_, Option<String>>(1).as_deref() == Some(store.replica()) =>
        {
            Lease::Canceled
        }
        _ => Lease::Lost,
    })
}

pub(super) async fn finish(store: &PgStore, id: QueueJobId, end: JobEnd) -> Result<()> {
    store
        .client()
        .await?
        .execute(
            "UPDATE jobs SET state = $2, detail = COALESCE($3, detail), finished_at = $4
             WHERE id = $1 AND state = 'running' AND owner = $5",
            &[
                &id.0,
                &end.state().as_str(),
                &end.detail(),
                &now_ms(),
                &store.opts.replica,
            ],
        )
        .await?;
    Ok(())
}

pub(super) async fn cancel(
    store: &PgStore,
    project: ProjectId,
    mr: MrIid,
    why: String,
) -> Result<Vec<QueueJobId>> {
    let mut c = store.client().await?;
    let tx = c.transaction().await?;
    let ids = cancel_in(&tx, project, mr, None, &why, now_ms()).await?;
    tx.commit().await?;
    Ok(ids)
}

pub(super) async fn requeue_interrupted(store: &PgStore) -> Result<usize> {
    let now = now_ms();
    let mut c = store.client().await?;
    let tx = c.transaction().await?;
    // Only jobs whose replica is gone: the others are running elsewhere right now.
    let n = tx
        .execute(
            "UPDATE jobs SET state = 'queued', detail = 'interrupted by a restart; re-run',
                    owner = NULL, lease_expires_at = NULL
             WHERE state = 'running' AND (owner = $1 OR lease_expires_at < $2)",
            &[&store.opts.replica, &now],
        )
        .await?;
    tx.execute(
        &format!(
            "UPDATE runs SET state = 'interrupted', finished_at = $2
             WHERE state = 'running' AND {OWNER_GONE}"
        ),
        &[&store.opts.replica, &now],
    )
    .await?;
    tx.commit().await?;
    Ok(n as usize)
}

pub(super) async fn depth(store: &PgStore) -> Result<u64> {
    let row = store
        .client()
        .await?
        .query_one("SELECT COUNT(*) FROM jobs WHERE state = 'queued'", &[])
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

pub(super) async fn get(store: &PgStore, id: QueueJobId) -> Result<Option<JobRow>> {
    Ok(store
        .client()
        .await?
        .query_opt(&format!("{JOB_SELECT} WHERE id = $1"), &[&id.0])
        .await?
        .map(|r| job_row(&r)))
}

pub(super) async fn recent(store: &PgStore, limit: u32) -> Result<Vec<JobRow>> {
    Ok(store
        .client()
        .await?
        .query(
            &format!("{JOB_SELECT} ORDER BY id DESC LIMIT $1"),
            &[&i64::from(limit)],
        )
        .await?
        .iter()
        .map(job_row)
        .collect())
}

pub(super) async fn head_has_plan(
    store: &PgStore,
    project: ProjectId,
    mr: MrIid,
    sha: CommitSha,
) -> Result<bool> {
    let row = store
        .client()
        .await?
        .query_one(
            HEAD_PLANS,
            &[
                &(project.0 as i64),
                &(mr.0 as i64),
                &sha.0,
                &["queued", "running", "done"].as_slice(),
                &true,
            ],
        )
        .await?;
    Ok(row.get::<_, i64>(0) > 0)
}
