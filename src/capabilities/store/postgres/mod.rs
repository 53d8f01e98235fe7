//! The PostgreSQL backend, for N replicas on one database: a connection pool, leased jobs
//! (`FOR UPDATE SKIP LOCKED`, heartbeat, expiry), live replicas, per-project apply locks.
//!
//! Every replica registers itself in `replicas` and refreshes its row every third of the lease;
//! what a replica runs (jobs, runs, applies, project locks) names it as `owner`. A job's own
//! lease is extended by its worker's heartbeat, which also reads whether the job was canceled
//! meanwhile (by whichever replica got the newer head). When a replica dies, its job leases
//! and its `replicas` row expire: another replica takes the job, and the start-up sweeps mark
//! its runs and applies `interrupted`.
//!
//! The heartbeat also reads the schema version: once a newer planbot has migrated the database
//! (a rolling upgrade), this replica claims no more jobs and its `/readyz` fails, saying why.

mod migrations;
mod policies;
mod tls;

pub use migrations::PG_SCHEMA_VERSION;

use super::backend::StoreBackend;
use super::dump::{self, Dump, Ty, Value, TABLES};
use super::types::{superseded_kinds, PolicyApproval, PolicyVerdictRecord, VerdictRow};
use super::types::{
    ApplyId, ApplyRecord, ApplyState, ClaimedJob, DeliveryOutcome, Enqueued, JobEnd, JobRow, Lease,
    NewApply, NewDelivery, NewRun, QueueJobId, QueueJobKind, QueueJobState, RunEnd, RunKind,
    RunQuery, RunRecord, RunState, SchemaError, ShownFingerprint, StoreProbe,
};
use super::{now_ms, ProjectLock};
use crate::core::events::{Job, Redundant};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId, RunId};
use crate::core::plan_digest::PlanDigest;
use crate::core::store_tls::{self, SslMode, StoreTls};
use anyhow::{anyhow, Context, Result};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};
use tokio_util::sync::{CancellationToken, DropGuard};

/// How the PostgreSQL store behaves; the defaults suit production.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// How long a job (and a replica) stays owned without a heartbeat. A replica that dies
    /// leaves its job for this long before another takes it.
    pub lease: Duration,
    /// This replica's name in the database: unique per running process. A replica started
    /// again under the same name recovers its own jobs at once instead of after the lease.
    pub replica: String,
    /// Connections in the pool.
    pub pool_size: usize,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            lease: Duration::from_secs(30),
            replica: default_replica_name(),
            pool_size: 16,
        }
    }
}

/// `<hostname>-<pid>-<random>`: unique per process, and says where it runs.
pub fn default_replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "planbot".into());
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

pub(crate) struct PgStore {
    pool: Pool,
    opts: PgOptions,
    /// The schema version a heartbeat found when it is newer than [`PG_SCHEMA_VERSION`] (a
    /// newer planbot migrated the database while this one runs), else 0.
    newer_schema: Arc<AtomicU32>,
    /// Stops the replica heartbeat when the store is dropped.
    _heartbeat: DropGuard,
}

impl PgStore {
    /// Connect (over TLS as the URL's `sslmode` and `ca_file` say), migrate (refusing a newer
    /// schema), register this replica and start its heartbeat.
    pub(crate) async fn connect(
        url: &str,
        password: Option<&str>,
        ca_file: Option<&Path>,
        opts: PgOptions,
    ) -> Result<PgStore> {
        let pool = pool(url, password, ca_file, opts.pool_size)?;
        {
            let mut client = pool.first_client().await?;
            migrations::migrate(&mut client)
                .await
                .context("migrating the PostgreSQL store")?;
        }
        let pool = pool.pool;
        let stop = CancellationToken::new();
        let newer_schema = Arc::new(AtomicU32::new(0));
        let store = PgStore {
            pool: pool.clone(),
            opts: opts.clone(),
            newer_schema: newer_schema.clone(),
            _heartbeat: stop.clone().drop_guard(),
        };
        store.beat().await.context("registering this replica")?;
        let lease = opts.lease;
        let beat = PgStore {
            pool,
            opts,
            newer_schema,
            _heartbeat: CancellationToken::new().drop_guard(),
        };
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(lease / 3) => {}
                }
                if let Err(e) = beat.beat().await {
                    tracing::warn!(error = %format!("{e:#}"), "replica heartbeat failed");
                }
            }
        });
        Ok(store)
    }

    pub(crate) fn replica(&self) -> &str {
        &self.opts.replica
    }

    /// Whether this replica's session with the server is encrypted (`pg_stat_ssl`).
    #[cfg(test)]
    pub(crate) async fn session_is_tls(&self) -> Result<bool> {
        let c = self.client().await?;
        let row = c
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await?;
        Ok(row.get(0))
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool
            .get()
            .await
            .map_err(|e| anyhow!("PostgreSQL connection: {e}"))
    }

    fn lease_ms(&self) -> i64 {
        self.opts.lease.as_millis() as i64
    }

    /// Refresh this replica's row (it is alive until `now + lease`).
    async fn beat(&self) -> Result<()> {
        let now = now_ms();
        let c = self.client().await?;
        c.execute(
            "INSERT INTO replicas (owner, started_at, expires_at) VALUES ($1, $2, $3)
             ON CONFLICT (owner) DO UPDATE SET expires_at = excluded.expires_at",
            &[&self.opts.replica, &now, &(now + self.lease_ms())],
        )
        .await?;
        // Long-dead replicas are forgotten.
        c.execute(
            "DELETE FROM replicas WHERE expires_at < $1",
            &[&(now - 86_400_000)],
        )
        .await?;
        let found = migrations::schema_version(&**c).await?;
        if found > PG_SCHEMA_VERSION && self.newer_schema.swap(found, Ordering::SeqCst) != found {
            tracing::warn!(
                found,
                known = PG_SCHEMA_VERSION,
                "a newer planbot migrated the store: this replica takes no more jobs and is not \
                 ready; upgrade it to the version the other replicas run"
            );
        }
        Ok(())
    }

    /// Refused once a newer planbot has migrated the database under this running replica.
    fn schema_current(&self) -> Result<(), SchemaError> {
        match self.newer_schema.load(Ordering::SeqCst) {
            0 => Ok(()),
            found => Err(SchemaError::TooNew {
                found,
                known: PG_SCHEMA_VERSION,
            }),
        }
    }
}

/// A connection pool to the server `url` names, with the TLS it asks for.
struct TlsPool {
    pool: Pool,
    tls: StoreTls,
}

impl TlsPool {
    /// The first connection: a refused certificate or a server without TLS says why.
    async fn first_client(&self) -> Result<deadpool_postgres::Object> {
        self.pool
            .get()
            .await
            .map_err(|e| match tls::explain(&e, &self.tls) {
                Some(why) => anyhow!("connecting to PostgreSQL: {why}"),
                None => anyhow!("connecting to PostgreSQL: {}", error_chain(&e)),
            })
    }
}

/// An error with its causes: the pool's and the driver's own texts say only "db error", the
/// server's reason (`database "x" does not exist`, `password authentication failed`) is below.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text
}

fn pool(url: &str, password: Option<&str>, ca_file: Option<&Path>, size: usize) -> Result<TlsPool> {
    let tls = StoreTls::from_url(url, ca_file).map_err(|e| anyhow!("store.url: {e}"))?;
    let mut config: tokio_postgres::Config = store_tls::driver_url(url)
        .parse()
        .context("store.url is not a PostgreSQL URL")?;
    if let Some(p) = password {
        config.password(p);
    }
    config.connect_timeout(Duration::from_secs(10));
    config.application_name("planbot");
    // The driver's `require` is "TLS, whatever the certificate": the connector verifies it.
    config.ssl_mode(match tls.mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        _ => tokio_postgres::config::SslMode::Require,
    });
    let manager_config = || ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match tls::connector(&tls)? {
        None => Manager::from_config(config, NoTls, manager_config()),
        Some(rustls) => Manager::from_config(config, rustls, manager_config()),
    };
    let pool = Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(10)))
        .build()
        .context("building the PostgreSQL pool")?;
    Ok(TlsPool { pool, tls })
}

/// What `planbot doctor` reads of a PostgreSQL store, changing nothing: the server, whether
/// the session is encrypted, the schema version, the live replicas.
pub(crate) async fn probe(
    url: &str,
    password: Option<&str>,
    ca_file: Option<&Path>,
) -> Result<StoreProbe> {
    let c = pool(url, password, ca_file, 1)?.first_client().await?;
    let server: String = c.query_one("SHOW server_version", &[]).await?.get(0);
    let tls: bool = c
        .query_one(
            "SELECT COALESCE((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false)",
            &[],
        )
        .await?
        .get(0);
    let has = |table: &'static str| {
        let c = &c;
        async move {
            let row = c
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
                .await?;
            Ok::<bool, anyhow::Error>(row.get(0))
        }
    };
    let schema = if has("schema_migrations").await? {
        migrations::schema_version(&**c).await?
    } else {
        0
    };
    let live_replicas = if has("replicas").await? {
        c.query(
            "SELECT owner FROM replicas WHERE expires_at >= $1 ORDER BY owner",
            &[&now_ms()],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect()
    } else {
        Vec::new()
    };
    Ok(StoreProbe {
        server: Some(format!(
            "PostgreSQL {}",
            server.split_whitespace().next().unwrap_or("")
        )),
        tls: Some(tls),
        schema,
        known: PG_SCHEMA_VERSION,
        live_replicas,
    })
}

/// A row's nullable BIGINT as an id.
fn opt_u64(r: &Row, i: usize) -> Option<u64> {
    r.get::<_, Option<i64>>(i).map(|n| n as u64)
}

/// SQL true when `owner` is not a live replica (or is this one, which at start-up runs nothing).
const OWNER_GONE: &str = "(owner IS NULL OR owner = $1 OR owner NOT IN
    (SELECT owner FROM replicas WHERE expires_at >= $2))";

/// Queue `job` in `c`'s transaction (dedupe, supersede). On the webhook's path, so its
/// statements are prepared once per pooled connection (`prepare_cached`), not on every call.
async fn enqueue_in(
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
async fn redundant_in(c: &deadpool_postgres::Transaction<'_>, job: &Job) -> Result<bool> {
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
const HEAD_PLANS: &str = "SELECT (SELECT COUNT(*) FROM jobs WHERE kind = 'plan' AND project_id = $1
           AND mr_iid = $2 AND sha = $3 AND state = ANY($4))
      + (SELECT COUNT(*) FROM runs WHERE $5 AND kind = 'plan' AND project_id = $1
           AND mr_iid = $2 AND sha = $3 AND state IN ('succeeded', 'failed'))";

async fn cancel_in(
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

const JOB_SELECT: &str = "SELECT id, kind, project_id, mr_iid, sha, state, attempts, detail, \
    created_at, started_at, finished_at, payload FROM jobs";

fn job_row(r: &Row) -> JobRow {
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

const RUN_SELECT: &str = "SELECT id, job_id, kind, project_id, project_path, mr_iid, root, sha, \
    state, started_at, finished_at, summary, log, note_markdown, fingerprint FROM runs";

fn run_row(r: &Row) -> RunRecord {
    RunRecord {
        id: RunId(r.get::<_, i64>(0) as u64),
        job: r.get::<_, Option<i64>>(1).map(QueueJobId),
        kind: RunKind::parse(&r.get::<_, String>(2)),
        project: ProjectId(r.get::<_, i64>(3) as u64),
        project_path: r.get(4),
        mr: opt_u64(r, 5).map(MrIid),
        root: r.get(6),
        sha: CommitSha(r.get(7)),
        state: RunState::parse(&r.get::<_, String>(8)),
        started_at: r.get(9),
        finished_at: r.get(10),
        summary: r.get(11),
        log: r.get(12),
        note_markdown: r.get(13),
        fingerprint: r.get(14),
    }
}

const APPLY_COLS: &str =
    "id, ci_job_id, project_id, mr_iid, sha, roots, state, started_at, finished_at, detail";

fn apply_row(r: &Row) -> ApplyRecord {
    ApplyRecord {
        id: ApplyId(r.get(0)),
        ci_job: JobId(r.get::<_, i64>(1) as u64),
        project: ProjectId(r.get::<_, i64>(2) as u64),
        mr: opt_u64(r, 3).map(MrIid),
        sha: CommitSha(r.get(4)),
        roots: serde_json::from_str(&r.get::<_, String>(5)).unwrap_or_default(),
        state: ApplyState::parse(&r.get::<_, String>(6)),
        started_at: r.get(7),
        finished_at: r.get(8),
        detail: r.get(9),
    }
}

/// A row whose fingerprint does not parse reads as no fingerprint.
fn fingerprint_row(r: &Row) -> Option<ShownFingerprint> {
    Fingerprint::from_hex(&r.get::<_, String>(4)).map(|fingerprint| ShownFingerprint {
        project: ProjectId(r.get::<_, i64>(0) as u64),
        mr: MrIid(r.get::<_, i64>(1) as u64),
        root: r.get(2),
        sha: CommitSha(r.get(3)),
        fingerprint,
        run: opt_u64(r, 5).map(RunId),
    })
}

impl StoreBackend for PgStore {
    async fn ping(&self) -> Result<()> {
        self.client().await?.query_one("SELECT 1", &[]).await?;
        Ok(self.schema_current()?)
    }

    async fn record_delivery(&self, d: NewDelivery, jobs: Vec<Job>) -> Result<DeliveryOutcome> {
        let now = now_ms();
        let mut c = self.client().await?;
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
            let e = enqueue_in(&tx, job, Some(delivery_id), now).await?;
            out.enqueued.extend(e.id);
            out.cancel_running.extend(e.cancel_running);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn delivery_count(&self) -> Result<u64> {
        let row = self
            .client()
            .await?
            .query_one("SELECT COUNT(*) FROM deliveries", &[])
            .await?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    async fn delivery_outcome(&self, key: String) -> Result<Option<String>> {
        Ok(self
            .client()
            .await?
            .query_opt("SELECT outcome FROM deliveries WHERE key = $1", &[&key])
            .await?
            .map(|r| r.get(0)))
    }

    async fn enqueue(&self, job: Job) -> Result<Enqueued> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let e = enqueue_in(&tx, &job, None, now_ms()).await?;
        tx.commit().await?;
        Ok(e)
    }

    async fn claim_next(&self) -> Result<Option<ClaimedJob>> {
        // The jobs are left to the replicas that know the database's schema.
        if self.schema_current().is_err() {
            return Ok(None);
        }
        let now = now_ms();
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // Queued jobs, and running ones whose replica stopped renewing the lease. SKIP LOCKED:
        // replicas claiming at once take different jobs.
        let row = tx
            .query_opt(
                "WITH next AS (
                     SELECT id FROM jobs
                     WHERE state = 'queued' OR (state = 'running' AND lease_expires_at < $1)
                     ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
                 UPDATE jobs SET state = 'running', started_at = $1, attempts = attempts + 1,
                        owner = $2, lease_expires_at = $3
                 FROM next WHERE jobs.id = next.id
                 RETURNING jobs.id, jobs.payload, jobs.attempts",
                &[&now, &self.opts.replica, &(now + self.lease_ms())],
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

    async fn heartbeat(&self, id: QueueJobId) -> Result<Lease> {
        let now = now_ms();
        let c = self.client().await?;
        let extended = c
            .execute(
                "UPDATE jobs SET lease_expires_at = $3
                 WHERE id = $1 AND owner = $2 AND state = 'running'",
                &[&id.0, &self.opts.replica, &(now + self.lease_ms())],
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
                    && r.get::<_, Option<String>>(1).as_deref() == Some(self.replica()) =>
            {
                Lease::Canceled
            }
            _ => Lease::Lost,
        })
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        Some(self.opts.lease / 3)
    }

    async fn finish_job(&self, id: QueueJobId, end: JobEnd) -> Result<()> {
        self.client()
            .await?
            .execute(
                "UPDATE jobs SET state = $2, detail = COALESCE($3, detail), finished_at = $4
                 WHERE id = $1 AND state = 'running' AND owner = $5",
                &[
                    &id.0,
                    &end.state().as_str(),
                    &end.detail(),
                    &now_ms(),
                    &self.opts.replica,
                ],
            )
            .await?;
        Ok(())
    }

    async fn cancel_mr(
        &self,
        project: ProjectId,
        mr: MrIid,
        why: String,
    ) -> Result<Vec<QueueJobId>> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let ids = cancel_in(&tx, project, mr, None, &why, now_ms()).await?;
        tx.commit().await?;
        Ok(ids)
    }

    async fn requeue_interrupted(&self) -> Result<usize> {
        let now = now_ms();
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // Only jobs whose replica is gone: the others are running elsewhere right now.
        let n = tx
            .execute(
                "UPDATE jobs SET state = 'queued', detail = 'interrupted by a restart; re-run',
                        owner = NULL, lease_expires_at = NULL
                 WHERE state = 'running' AND (owner = $1 OR lease_expires_at < $2)",
                &[&self.opts.replica, &now],
            )
            .await?;
        tx.execute(
            &format!(
                "UPDATE runs SET state = 'interrupted', finished_at = $2
                 WHERE state = 'running' AND {OWNER_GONE}"
            ),
            &[&self.opts.replica, &now],
        )
        .await?;
        tx.commit().await?;
        Ok(n as usize)
    }

    async fn queue_depth(&self) -> Result<u64> {
        let row = self
            .client()
            .await?
            .query_one("SELECT COUNT(*) FROM jobs WHERE state = 'queued'", &[])
            .await?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    async fn job(&self, id: QueueJobId) -> Result<Option<JobRow>> {
        Ok(self
            .client()
            .await?
            .query_opt(&format!("{JOB_SELECT} WHERE id = $1"), &[&id.0])
            .await?
            .map(|r| job_row(&r)))
    }

    async fn recent_jobs(&self, limit: u32) -> Result<Vec<JobRow>> {
        Ok(self
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

    async fn head_has_plan(&self, project: ProjectId, mr: MrIid, sha: CommitSha) -> Result<bool> {
        let row = self
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

    async fn start_run(&self, run: NewRun) -> Result<RunId> {
        let row = self
            .client()
            .await?
            .query_one(
                "INSERT INTO runs (job_id, kind, project_id, project_path, mr_iid, root, sha,
                                   state, started_at, owner)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 'running', $8, $9) RETURNING id",
                &[
                    &run.job.map(|j| j.0),
                    &run.kind.as_str(),
                    &(run.project.0 as i64),
                    &run.project_path,
                    &run.mr.map(|m| m.0 as i64),
                    &run.root,
                    &run.sha.0,
                    &now_ms(),
                    &self.opts.replica,
                ],
            )
            .await?;
        Ok(RunId(row.get::<_, i64>(0) as u64))
    }

    async fn finish_run(&self, id: RunId, end: RunEnd) -> Result<()> {
        self.client()
            .await?
            .execute(
                "UPDATE runs SET state = $2, finished_at = $3, summary = $4, log = $5,
                        note_markdown = $6, fingerprint = $7
                 WHERE id = $1",
                &[
                    &(id.0 as i64),
                    &end.state.as_str(),
                    &now_ms(),
                    &end.summary,
                    &end.log,
                    &end.note_markdown,
                    &end.fingerprint.as_ref().map(|f| f.as_hex().to_string()),
                ],
            )
            .await?;
        Ok(())
    }

    async fn run(&self, id: RunId) -> Result<Option<RunRecord>> {
        Ok(self
            .client()
            .await?
            .query_opt(&format!("{RUN_SELECT} WHERE id = $1"), &[&(id.0 as i64)])
            .await?
            .map(|r| run_row(&r)))
    }

    async fn recent_runs(&self, limit: u32) -> Result<Vec<RunRecord>> {
        Ok(self
            .client()
            .await?
            .query(
                &format!("{RUN_SELECT} ORDER BY id DESC LIMIT $1"),
                &[&i64::from(limit)],
            )
            .await?
            .iter()
            .map(run_row)
            .collect())
    }

    async fn run_projects(&self) -> Result<Vec<(ProjectId, Option<String>)>> {
        Ok(self
            .client()
            .await?
            .query(
                "SELECT project_id, MAX(project_path) FROM runs GROUP BY project_id
                 ORDER BY 2 NULLS FIRST",
                &[],
            )
            .await?
            .iter()
            .map(|r| (ProjectId(r.get::<_, i64>(0) as u64), r.get(1)))
            .collect())
    }

    async fn runs_page(&self, q: RunQuery) -> Result<Vec<RunRecord>> {
        if q.projects.is_empty() {
            return Ok(Vec::new());
        }
        let projects: Vec<i64> = q.projects.iter().map(|p| p.0 as i64).collect();
        let mut args: Vec<Box<dyn ToSql + Sync + Send>> = vec![Box::new(projects)];
        let mut sql = format!("{RUN_SELECT} WHERE project_id = ANY($1)");
        if let Some(mr) = q.mr {
            args.push(Box::new(mr.0 as i64));
            sql.push_str(&format!(" AND mr_iid = ${}", args.len()));
        }
        if let Some(state) = q.state {
            args.push(Box::new(state.as_str().to_string()));
            sql.push_str(&format!(" AND state = ${}", args.len()));
        }
        if let Some(before) = q.before {
            args.push(Box::new(before.0 as i64));
            sql.push_str(&format!(" AND id < ${}", args.len()));
        }
        args.push(Box::new(i64::from(q.limit)));
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", args.len()));
        let refs: Vec<&(dyn ToSql + Sync)> = args
            .iter()
            .map(|a| a.as_ref() as &(dyn ToSql + Sync))
            .collect();
        Ok(self
            .client()
            .await?
            .query(&sql, &refs)
            .await?
            .iter()
            .map(run_row)
            .collect())
    }

    async fn runs_for_mr(&self, project: ProjectId, mr: MrIid) -> Result<Vec<RunRecord>> {
        Ok(self
            .client()
            .await?
            .query(
                &format!("{RUN_SELECT} WHERE project_id = $1 AND mr_iid = $2 ORDER BY id DESC"),
                &[&(project.0 as i64), &(mr.0 as i64)],
            )
            .await?
            .iter()
            .map(run_row)
            .collect())
    }

    async fn record_fingerprint(&self, shown: ShownFingerprint) -> Result<()> {
        self.client()
            .await?
            .execute(
                "INSERT INTO fingerprints (project_id, mr_iid, root, sha, fingerprint, run_id, shown_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE
                 SET fingerprint = excluded.fingerprint, run_id = excluded.run_id,
                     shown_at = excluded.shown_at",
                &[
                    &(shown.project.0 as i64),
                    &(shown.mr.0 as i64),
                    &shown.root,
                    &shown.sha.0,
                    &shown.fingerprint.as_hex(),
                    &shown.run.map(|r| r.0 as i64),
                    &now_ms(),
                ],
            )
            .await?;
        Ok(())
    }

    async fn last_shown_fingerprint(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
    ) -> Result<Option<ShownFingerprint>> {
        Ok(self
            .client()
            .await?
            .query_opt(
                "SELECT project_id, mr_iid, root, sha, fingerprint, run_id FROM fingerprints
                 WHERE project_id = $1 AND mr_iid = $2 AND root = $3
                 ORDER BY shown_at DESC, seq DESC LIMIT 1",
                &[&(project.0 as i64), &(mr.0 as i64), &root],
            )
            .await?
            .and_then(|r| fingerprint_row(&r)))
    }

    async fn fingerprint_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
    ) -> Result<Option<ShownFingerprint>> {
        Ok(self
            .client()
            .await?
            .query_opt(
                "SELECT project_id, mr_iid, root, sha, fingerprint, run_id FROM fingerprints
                 WHERE project_id = $1 AND mr_iid = $2 AND root = $3 AND sha = $4",
                &[&(project.0 as i64), &(mr.0 as i64), &root, &sha.0],
            )
            .await?
            .and_then(|r| fingerprint_row(&r)))
    }

    async fn record_digest(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
        digest_json: String,
    ) -> Result<()> {
        self.client()
            .await?
            .execute(
                "INSERT INTO plan_digests (project_id, mr_iid, root, sha, digest)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE SET digest = excluded.digest",
                &[
                    &(project.0 as i64),
                    &(mr.0 as i64),
                    &root,
                    &sha.0,
                    &digest_json,
                ],
            )
            .await?;
        Ok(())
    }

    async fn digest_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
    ) -> Result<Option<PlanDigest>> {
        Ok(self
            .client()
            .await?
            .query_opt(
                "SELECT digest FROM plan_digests
                 WHERE project_id = $1 AND mr_iid = $2 AND root = $3 AND sha = $4",
                &[&(project.0 as i64), &(mr.0 as i64), &root, &sha.0],
            )
            .await?
            .and_then(|r| PlanDigest::from_json(&r.get::<_, String>(0))))
    }

    async fn set_mr_note(&self, project: ProjectId, mr: MrIid, note: NoteId) -> Result<()> {
        self.client()
            .await?
            .execute(
                "INSERT INTO mr_notes (project_id, mr_iid, note_id, updated_at)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (project_id, mr_iid) DO UPDATE
                 SET note_id = excluded.note_id, updated_at = excluded.updated_at",
                &[
                    &(project.0 as i64),
                    &(mr.0 as i64),
                    &(note.0 as i64),
                    &now_ms(),
                ],
            )
            .await?;
        Ok(())
    }

    async fn mr_note(&self, project: ProjectId, mr: MrIid) -> Result<Option<NoteId>> {
        Ok(self
            .client()
            .await?
            .query_opt(
                "SELECT note_id FROM mr_notes WHERE project_id = $1 AND mr_iid = $2",
                &[&(project.0 as i64), &(mr.0 as i64)],
            )
            .await?
            .map(|r| NoteId(r.get::<_, i64>(0) as u64)))
    }

    async fn record_policy_verdict(
        &self,
        record: PolicyVerdictRecord,
        verdict_json: String,
    ) -> Result<()> {
        policies::record_verdict(&**self.client().await?, &record, &verdict_json).await
    }

    async fn policy_verdicts(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<Vec<VerdictRow>> {
        policies::verdicts(&**self.client().await?, project, mr, &sha).await
    }

    async fn record_policy_approval(&self, approval: PolicyApproval) -> Result<bool> {
        policies::record_approval(&**self.client().await?, &approval).await
    }

    async fn policy_approvals(&self, project: ProjectId, mr: MrIid) -> Result<Vec<PolicyApproval>> {
        policies::approvals(&**self.client().await?, project, mr).await
    }

    async fn begin_apply(&self, a: NewApply) -> Result<Option<ApplyId>> {
        let roots = serde_json::to_string(&a.roots)?;
        Ok(self
            .client()
            .await?
            .query_opt(
                "INSERT INTO applies (ci_job_id, project_id, mr_iid, sha, roots, state,
                                      started_at, owner)
                 VALUES ($1, $2, $3, $4, $5, 'running', $6, $7)
                 ON CONFLICT (ci_job_id) DO NOTHING RETURNING id",
                &[
                    &(a.ci_job.0 as i64),
                    &(a.project.0 as i64),
                    &a.mr.map(|m| m.0 as i64),
                    &a.sha.0,
                    &roots,
                    &now_ms(),
                    &self.opts.replica,
                ],
            )
            .await?
            .map(|r| ApplyId(r.get(0))))
    }

    async fn finish_apply(
        &self,
        id: ApplyId,
        state: ApplyState,
        detail: Option<String>,
    ) -> Result<()> {
        self.client()
            .await?
            .execute(
                "UPDATE applies SET state = $2, finished_at = $3, detail = $4 WHERE id = $1",
                &[&id.0, &state.as_str(), &now_ms(), &detail],
            )
            .await?;
        Ok(())
    }

    async fn mark_interrupted_applies(&self) -> Result<Vec<ApplyRecord>> {
        Ok(self
            .client()
            .await?
            .query(
                &format!(
                    "UPDATE applies SET state = 'interrupted', finished_at = $2
                     WHERE state = 'running' AND {OWNER_GONE} RETURNING {APPLY_COLS}"
                ),
                &[&self.opts.replica, &now_ms()],
            )
            .await?
            .iter()
            .map(apply_row)
            .collect())
    }

    async fn apply_for_job(&self, ci_job: JobId) -> Result<Option<ApplyRecord>> {
        Ok(self
            .client()
            .await?
            .query_opt(
                &format!("SELECT {APPLY_COLS} FROM applies WHERE ci_job_id = $1"),
                &[&(ci_job.0 as i64)],
            )
            .await?
            .map(|r| apply_row(&r)))
    }

    async fn lock_project(&self, project: ProjectId) -> Result<ProjectLock> {
        let mut waited = false;
        loop {
            if let Some(lock) = self.try_lock_project(project).await? {
                return Ok(lock);
            }
            if !waited {
                tracing::info!(
                    project = project.0,
                    "another apply of this project runs (maybe on another replica); waiting"
                );
                waited = true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn try_lock_project(&self, project: ProjectId) -> Result<Option<ProjectLock>> {
        let token = format!("{}-{:016x}", self.opts.replica, rand::random::<u64>());
        let now = now_ms();
        // Take the row if it is free, or held by a replica that is gone.
        let got = self
            .client()
            .await?
            .query_opt(
                "INSERT INTO project_locks (project_id, owner, token, acquired_at)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (project_id) DO UPDATE
                 SET owner = excluded.owner, token = excluded.token,
                     acquired_at = excluded.acquired_at
                 WHERE project_locks.owner NOT IN
                       (SELECT owner FROM replicas WHERE expires_at >= $4)
                 RETURNING token",
                &[&(project.0 as i64), &self.opts.replica, &token, &now],
            )
            .await?;
        Ok(got.map(|_| ProjectLock::row(self.pool.clone(), project.0 as i64, token)))
    }

    async fn export(&self) -> Result<Dump> {
        let c = self.client().await?;
        let mut out = Dump::default();
        for (table, cols) in TABLES {
            let order = if *table == "fingerprints" { "seq" } else { "1" };
            let rows = c
                .query(
                    &format!(
                        "SELECT {} FROM {table} ORDER BY {order}",
                        dump::column_list(cols)
                    ),
                    &[],
                )
                .await?;
            let rows = rows
                .iter()
                .map(|r| {
                    cols.iter()
                        .enumerate()
                        .map(|(i, (_, ty))| match ty {
                            Ty::Int => r
                                .get::<_, Option<i64>>(i)
                                .map(Value::Int)
                                .unwrap_or(Value::Null),
                            Ty::Text => r
                                .get::<_, Option<String>>(i)
                                .map(Value::Text)
                                .unwrap_or(Value::Null),
                        })
                        .collect()
                })
                .collect();
            out.tables.push((table.to_string(), rows));
        }
        Ok(out)
    }

    async fn import(&self, dump: Dump) -> Result<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        for (table, rows) in &dump.tables {
            let (_, cols) = TABLES
                .iter()
                .find(|(t, _)| t == table)
                .ok_or_else(|| anyhow!("unknown table {table} in the dump"))?;
            let n: i64 = tx
                .query_one(&format!("SELECT COUNT(*) FROM {table}"), &[])
                .await?
                .get(0);
            anyhow::ensure!(n == 0, "the target store's table {table} is not empty");
            let marks: Vec<String> = (1..=cols.len()).map(|i| format!("${i}")).collect();
            let st = tx
                .prepare(&format!(
                    "INSERT INTO {table} ({}) VALUES ({})",
                    dump::column_list(cols),
                    marks.join(", ")
                ))
                .await?;
            for row in rows {
                let args: Vec<Box<dyn ToSql + Sync + Send>> = row
                    .iter()
                    .zip(cols.iter())
                    .map(|(v, (_, ty))| -> Box<dyn ToSql + Sync + Send> {
                        match (v, ty) {
                            (Value::Int(n), _) => Box::new(Some(*n)),
                            (Value::Text(t), _) => Box::new(Some(t.clone())),
                            (Value::Null, Ty::Int) => Box::new(None::<i64>),
                            (Value::Null, Ty::Text) => Box::new(None::<String>),
                        }
                    })
                    .collect();
                let refs: Vec<&(dyn ToSql + Sync)> = args
                    .iter()
                    .map(|a| a.as_ref() as &(dyn ToSql + Sync))
                    .collect();
                tx.execute(&st, &refs)
                    .await
                    .with_context(|| format!("copying a row of {table}"))?;
            }
            if cols.first().map(|(c, _)| *c) == Some("id") {
                tx.execute(
                    &format!(
                        "SELECT setval(pg_get_serial_sequence('{table}', 'id'),
                                       COALESCE((SELECT MAX(id) FROM {table}), 0) + 1, false)"
                    ),
                    &[],
                )
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }
}

/// Release a project lock row (what dropping a [`ProjectLock`] does on PostgreSQL).
pub(super) async fn release_project_lock(pool: Pool, project: i64, token: String) {
    // A live replica's lock row is not taken over, so a release that fails is tried again
    // (a database restart takes seconds) before giving up loudly.
    let mut wait = Duration::from_millis(250);
    for attempt in 1..=8 {
        let result = async {
            pool.get()
                .await
                .map_err(|e| anyhow!("{e}"))?
                .execute(
                    "DELETE FROM project_locks WHERE project_id = $1 AND token = $2",
                    &[&project, &token],
                )
                .await?;
            anyhow::Ok(())
        }
        .await;
        match result {
            Ok(()) => return,
            Err(e) if attempt < 8 => {
                tracing::warn!(project, attempt, error = %format!("{e:#}"), "releasing a project lock failed; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(10));
            }
            Err(e) => {
                tracing::error!(project, error = %format!("{e:#}"), "could not release a project lock: applies of this project wait until this replica restarts");
            }
        }
    }
}
