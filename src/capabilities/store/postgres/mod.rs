//! The PostgreSQL backend, for N replicas on one database: a connection pool, leased jobs
//! (`FOR UPDATE SKIP LOCKED`, heartbeat, expiry), live replicas, per-project apply locks, and
//! one file of SQL per thing stored, laid out as SQLite's (deliveries, queue, runs, reviews,
//! applies, policies).
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

mod applies;
mod deliveries;
mod drift;
mod policies;
mod queue;
mod reviews;
mod runs;
mod targeting;
mod tls;

use super::migrations::{self, PG_SCHEMA_VERSION};

use super::backend::StoreBackend;
use super::dump::{self, Dump, Ty, Value, TABLES};
use super::types::{
    ApplyId, ApplyRecord, ApplyState, ClaimedJob, DeliveryOutcome, Enqueued, JobEnd, JobRow, Lease,
    NewApply, NewDelivery, NewRun, QueueJobId, RunEnd, RunQuery, RunRecord, SchemaError,
    ShownFingerprint, StoreProbe,
};
use super::types::{
    DriftRootRecord, PlanTargeting, PolicyApproval, PolicyVerdictRecord, VerdictRow, WidgetReports,
};
use super::{now_ms, ProjectLock};
use crate::core::events::Job;
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
            migrations::migrate_postgres(&mut client)
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
        let found = migrations::postgres_version(&**c).await?;
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
    let schema = migrations::postgres_version(&**c).await?;
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
    let (last_drift_tick, drift_roots) = if has("drift_roots").await? {
        (drift::last(&c).await?, drift::roots(&c).await?)
    } else {
        (None, Vec::new())
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
        last_drift_tick,
        drift_roots,
    })
}

/// A row's nullable BIGINT as an id.
fn opt_u64(r: &Row, i: usize) -> Option<u64> {
    r.get::<_, Option<i64>>(i).map(|n| n as u64)
}

impl StoreBackend for PgStore {
    async fn ping(&self) -> Result<()> {
        self.client().await?.query_one("SELECT 1", &[]).await?;
        Ok(self.schema_current()?)
    }

    async fn record_delivery(&self, d: NewDelivery, jobs: Vec<Job>) -> Result<DeliveryOutcome> {
        deliveries::record(self, d, jobs).await
    }

    async fn delivery_count(&self) -> Result<u64> {
        deliveries::count(self).await
    }

    async fn delivery_outcome(&self, key: String) -> Result<Option<String>> {
        deliveries::outcome(self, key).await
    }

    async fn enqueue(&self, job: Job) -> Result<Enqueued> {
        queue::enqueue(self, job).await
    }

    async fn claim_next(&self, share: usize) -> Result<Option<ClaimedJob>> {
        queue::claim_next(self, share).await
    }

    async fn heartbeat(&self, id: QueueJobId) -> Result<Lease> {
        queue::heartbeat(self, id).await
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        Some(self.opts.lease / 3)
    }

    async fn finish_job(&self, id: QueueJobId, end: JobEnd) -> Result<()> {
        queue::finish(self, id, end).await
    }

    async fn cancel_mr(
        &self,
        project: ProjectId,
        mr: MrIid,
        why: String,
    ) -> Result<Vec<QueueJobId>> {
        queue::cancel(self, project, mr, why).await
    }

    async fn requeue_interrupted(&self) -> Result<usize> {
        queue::requeue_interrupted(self).await
    }

    async fn queue_depth(&self) -> Result<u64> {
        queue::depth(self).await
    }

    async fn job(&self, id: QueueJobId) -> Result<Option<JobRow>> {
        queue::get(self, id).await
    }

    async fn recent_jobs(&self, limit: u32) -> Result<Vec<JobRow>> {
        queue::recent(self, limit).await
    }

    async fn head_has_plan(&self, project: ProjectId, mr: MrIid, sha: CommitSha) -> Result<bool> {
        queue::head_has_plan(self, project, mr, sha).await
    }

    async fn start_run(&self, run: NewRun) -> Result<RunId> {
        runs::start(self, run).await
    }

    async fn finish_run(&self, id: RunId, end: RunEnd) -> Result<()> {
        runs::finish(self, id, end).await
    }

    async fn run(&self, id: RunId) -> Result<Option<RunRecord>> {
        runs::get(self, id).await
    }

    async fn recent_runs(&self, limit: u32) -> Result<Vec<RunRecord>> {
        runs::recent(self, limit).await
    }

    async fn run_projects(&self) -> Result<Vec<(ProjectId, Option<String>)>> {
        runs::projects(self).await
    }

    async fn runs_page(&self, q: RunQuery) -> Result<Vec<RunRecord>> {
        runs::page(self, q).await
    }

    async fn runs_for_mr(&self, project: ProjectId, mr: MrIid) -> Result<Vec<RunRecord>> {
        runs::for_mr(self, project, mr).await
    }

    async fn record_fingerprint(&self, shown: ShownFingerprint) -> Result<()> {
        reviews::record_fingerprint(self, shown).await
    }

    async fn last_shown_fingerprint(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
    ) -> Result<Option<ShownFingerprint>> {
        reviews::last_shown_fingerprint(self, project, mr, root).await
    }

    async fn fingerprint_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
    ) -> Result<Option<ShownFingerprint>> {
        reviews::fingerprint_for(self, project, mr, root, sha).await
    }

    async fn record_digest(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
        digest_json: String,
    ) -> Result<()> {
        reviews::record_digest(self, project, mr, root, sha, digest_json).await
    }

    async fn record_widgets(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
        report_json: String,
    ) -> Result<()> {
        reviews::record_widgets(self, project, mr, root, sha, report_json).await
    }

    async fn widgets_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<WidgetReports> {
        reviews::widgets_for(self, project, mr, sha).await
    }

    async fn digest_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
    ) -> Result<Option<PlanDigest>> {
        reviews::digest_for(self, project, mr, root, sha).await
    }

    async fn set_mr_note(&self, project: ProjectId, mr: MrIid, note: NoteId) -> Result<()> {
        reviews::set_mr_note(self, project, mr, note).await
    }

    async fn mr_note(&self, project: ProjectId, mr: MrIid) -> Result<Option<NoteId>> {
        reviews::mr_note(self, project, mr).await
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

    async fn set_plan_targeting(&self, set: PlanTargeting) -> Result<()> {
        targeting::set(self, &set).await
    }

    async fn plan_targeting(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
        root: String,
    ) -> Result<Option<String>> {
        targeting::get(&**self.client().await?, project, mr, &sha, &root).await
    }

    async fn claim_drift_tick(&self, at: i64) -> Result<Option<QueueJobId>> {
        drift::claim(self, at).await
    }

    async fn last_drift_tick(&self) -> Result<Option<i64>> {
        drift::last(&**self.client().await?).await
    }

    async fn record_drift_root(&self, root: DriftRootRecord) -> Result<()> {
        drift::record_root(self, &root).await
    }

    async fn forget_drift_roots(&self, project: ProjectId, keep: Vec<String>) -> Result<()> {
        drift::forget_roots(self, project, &keep).await
    }

    async fn drift_roots(&self) -> Result<Vec<DriftRootRecord>> {
        drift::roots(&**self.client().await?).await
    }

    async fn begin_apply(&self, a: NewApply) -> Result<Option<ApplyId>> {
        applies::begin(self, a).await
    }

    async fn finish_apply(
        &self,
        id: ApplyId,
        state: ApplyState,
        detail: Option<String>,
    ) -> Result<()> {
        applies::finish(self, id, state, detail).await
    }

    async fn mark_interrupted_applies(&self) -> Result<Vec<ApplyRecord>> {
        applies::mark_interrupted(self).await
    }

    async fn apply_for_job(&self, ci_job: JobId) -> Result<Option<ApplyRecord>> {
        applies::for_job(self, ci_job).await
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
