//! The store (docs/internals.md, "Durability"): the [`Store`] facade the flows hold, its public types, and its two
//! backends behind [`backend::StoreBackend`]: `sqlite` (embedded, one host) and `postgres` (N replicas).

mod backend;
mod dump;
mod migrations;
mod policy;
mod postgres;
mod sqlite;
mod targeting;
mod types;

#[cfg(test)]
pub(crate) mod tests;

pub use dump::{Dump, Value};
pub use migrations::{PG_SCHEMA_VERSION, SCHEMA_VERSION};
pub use postgres::{default_replica_name, PgOptions};
pub use types::{
    ApplyId, ApplyRecord, ApplyState, ClaimedJob, DeliveryOutcome, DriftOutcome, DriftRootRecord,
    Enqueued, JobEnd, JobRow, Lease, NewApply, NewDelivery, NewRun, PlanTargeting, PolicyApproval,
    PolicyVerdictRecord, QueueJobId, QueueJobKind, QueueJobState, RunEnd, RunKind, RunQuery,
    RunRecord, RunState, SchemaError, ShownFingerprint, StoreProbe, UnknownValue, WidgetReports,
};

use crate::core::config::StoreUrl;
use crate::core::events::Job;
use crate::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId, RunId};
use crate::core::plan_digest::PlanDigest;
use crate::core::widgets::RootWidgets;
use anyhow::{Context, Result};
use backend::StoreBackend;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The store: cheap to clone (clones share the backend: SQLite's writer thread and reader, or
/// PostgreSQL's pool).
///
/// The store trusts its callers: every text handed to it (logs, notes, errors, details) must
/// already be scrubbed of secrets. It never sees raw webhook bodies.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    Sqlite(Arc<sqlite::SqliteStore>),
    Postgres(Arc<postgres::PgStore>),
}

/// Call the same method on whichever backend this store has.
macro_rules! on_backend {
    ($self:ident, $b:ident => $e:expr) => {
        match &$self.backend {
            Backend::Sqlite($b) => $e,
            Backend::Postgres($b) => $e,
        }
    };
}
pub(crate) use on_backend;

/// The most of a run's log kept: the engine's output is already cut to 1 MiB as it streams
/// (head and tail); scrubbing can lengthen it, and nothing else may make the store grow more.
pub const STORED_LOG_MAX: usize = 2 * 1024 * 1024;

/// The first and last halves of `text` (on character boundaries, at most about `max` bytes),
/// with a line saying how much was left out between them.
fn head_and_tail(text: &str, max: usize) -> String {
    let half = max / 2;
    let mut head_end = half.min(text.len());
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len().saturating_sub(half).max(head_end);
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let left_out = tail_start - head_end;
    format!(
        "{}\n(… {} of this log left out: planbot keeps the first and the last {} of a stored log …)\n{}",
        &text[..head_end],
        crate::capabilities::checkout_file::size_text(left_out as u64),
        crate::capabilities::checkout_file::size_text(half as u64),
        &text[tail_start..]
    )
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// On PostgreSQL, held while one apply of a project runs: the next waits (on any replica).
/// Released on drop. On SQLite (one process) it holds nothing: the root locks suffice there.
pub struct ProjectLock {
    _held: Held,
}

enum Held {
    /// SQLite: one process owns the store; its root locks serialise applies of a root.
    Nothing,
    /// PostgreSQL: a row in `project_locks`, deleted on drop.
    Row {
        pool: deadpool_postgres::Pool,
        project: i64,
        token: String,
    },
}

impl ProjectLock {
    fn none() -> ProjectLock {
        ProjectLock {
            _held: Held::Nothing,
        }
    }

    fn row(pool: deadpool_postgres::Pool, project: i64, token: String) -> ProjectLock {
        ProjectLock {
            _held: Held::Row {
                pool,
                project,
                token,
            },
        }
    }
}

impl ProjectLock {
    /// Free the lock now (dropping it frees it soon after, from a spawned task): the next
    /// apply of the project, on any replica, may start once this returns.
    pub async fn release(mut self) {
        if let Held::Row {
            pool,
            project,
            token,
        } = std::mem::replace(&mut self._held, Held::Nothing)
        {
            postgres::release_project_lock(pool, project, token).await;
        }
    }
}

impl Drop for ProjectLock {
    fn drop(&mut self) {
        if let Held::Row {
            pool,
            project,
            token,
        } = &self._held
        {
            // Without a runtime (process exit) the row frees when this replica's lease expires.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(postgres::release_project_lock(
                    pool.clone(),
                    *project,
                    token.clone(),
                ));
            }
        }
    }
}

impl Store {
    /// Open (or create) a SQLite store file, bring its schema up to date (refusing one written
    /// by a newer planbot: [`SchemaError::TooNew`]), and start its writer thread.
    pub fn open(path: &Path) -> Result<Store> {
        Ok(Store::from_sqlite(Arc::new(sqlite::SqliteStore::open(
            path,
        )?)))
    }

    /// Read what `planbot doctor` shows of the store `url` names, creating and migrating
    /// nothing: a SQLite file that does not exist yet has schema 0.
    pub async fn probe(
        url: &StoreUrl,
        password: Option<&str>,
        ca_file: Option<&Path>,
    ) -> Result<StoreProbe> {
        match url {
            StoreUrl::Sqlite(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || sqlite::probe(&path))
                    .await
                    .context("reading the SQLite store")?
            }
            StoreUrl::Postgres(u) => postgres::probe(u, password, ca_file).await,
        }
    }

    /// Open the store `url` names: SQLite (as [`Store::open`]) or PostgreSQL (connect, migrate,
    /// register this replica). `password` is `[store] password` (from `password_file`).
    pub async fn connect(url: &StoreUrl, password: Option<&str>) -> Result<Store> {
        Store::connect_with(url, password, PgOptions::default()).await
    }

    /// [`Store::connect`] with PostgreSQL options (lease, replica name).
    pub async fn connect_with(
        url: &StoreUrl,
        password: Option<&str>,
        opts: PgOptions,
    ) -> Result<Store> {
        Store::connect_tls(url, password, None, opts).await
    }

    /// [`Store::connect_with`] trusting `ca_file` (`store.ca_file`, a PEM bundle) for
    /// PostgreSQL's TLS; the URL's `sslmode` says whether and how (see `core::store_tls`).
    pub async fn connect_tls(
        url: &StoreUrl,
        password: Option<&str>,
        ca_file: Option<&Path>,
        opts: PgOptions,
    ) -> Result<Store> {
        match url {
            StoreUrl::Sqlite(path) => Store::open(path),
            StoreUrl::Postgres(u) => {
                let pg = postgres::PgStore::connect(u, password, ca_file, opts)
                    .await
                    .with_context(|| format!("opening the store {url}"))?;
                Ok(Store {
                    backend: Backend::Postgres(Arc::new(pg)),
                })
            }
        }
    }

    fn from_sqlite(s: Arc<sqlite::SqliteStore>) -> Store {
        Store {
            backend: Backend::Sqlite(s),
        }
    }

    /// The SQLite file, when the store is one.
    pub fn path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Sqlite(s) => Some(s.path()),
            Backend::Postgres(_) => None,
        }
    }

    /// `sqlite` or `postgres` (for logs and metrics).
    pub fn kind(&self) -> &'static str {
        match &self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// This replica's name in a PostgreSQL store.
    pub fn replica(&self) -> Option<&str> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => Some(p.replica()),
        }
    }

    /// A quick liveness query for `/readyz`.
    pub async fn ping(&self) -> Result<()> {
        on_backend!(self, b => b.ping().await)
    }

    // ----- deliveries -----------------------------------------------------------------------

    /// Record one authentic delivery and enqueue its jobs, atomically. A delivery whose key was
    /// seen before (by any replica) is a duplicate: nothing is enqueued again.
    pub async fn record_delivery(&self, d: NewDelivery, jobs: Vec<Job>) -> Result<DeliveryOutcome> {
        on_backend!(self, b => b.record_delivery(d, jobs).await)
    }

    /// How many deliveries are recorded (all time).
    pub async fn delivery_count(&self) -> Result<u64> {
        on_backend!(self, b => b.delivery_count().await)
    }

    /// The recorded outcome of a delivery by its key.
    pub async fn delivery_outcome(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_string();
        on_backend!(self, b => b.delivery_outcome(key).await)
    }

    // ----- queue jobs -----------------------------------------------------------------------

    /// Enqueue a job outside a delivery (reconcile, commands, re-plans after a merge).
    pub async fn enqueue(&self, job: Job) -> Result<Enqueued> {
        on_backend!(self, b => b.enqueue(job).await)
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
        on_backend!(self, b => b.claim_next(share).await)
    }

    /// Extend this replica's lease of a running job; says whether it was canceled meanwhile
    /// (anywhere) or taken by another replica.
    pub async fn heartbeat(&self, id: QueueJobId) -> Result<Lease> {
        on_backend!(self, b => b.heartbeat(id).await)
    }

    /// How often a running job must call [`Store::heartbeat`]; `None`: never (SQLite, where
    /// nothing outside this process can take or cancel a job).
    pub fn heartbeat_every(&self) -> Option<Duration> {
        on_backend!(self, b => b.heartbeat_every())
    }

    /// Record how a running job ended. A job canceled meanwhile stays canceled; a job another
    /// replica took over is left to it.
    pub async fn finish_job(&self, id: QueueJobId, end: JobEnd) -> Result<()> {
        on_backend!(self, b => b.finish_job(id, end).await)
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
        on_backend!(self, b => b.cancel_mr(project, mr, why).await)
    }

    /// At start-up: jobs that were running when their process died go back to the queue (they
    /// run again); their runs are marked `interrupted`. Returns how many jobs were requeued.
    pub async fn requeue_interrupted(&self) -> Result<usize> {
        on_backend!(self, b => b.requeue_interrupted().await)
    }

    /// Jobs still to run.
    pub async fn queue_depth(&self) -> Result<u64> {
        on_backend!(self, b => b.queue_depth().await)
    }

    /// One job's row.
    pub async fn job(&self, id: QueueJobId) -> Result<Option<JobRow>> {
        on_backend!(self, b => b.job(id).await)
    }

    /// The newest jobs first (for pages and tests).
    pub async fn recent_jobs(&self, limit: u32) -> Result<Vec<JobRow>> {
        on_backend!(self, b => b.recent_jobs(limit).await)
    }

    /// Whether this head of the MR has a plan: a finished plan run, or a plan job queued/running/done.
    pub async fn head_has_plan(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<bool> {
        on_backend!(self, b => b.head_has_plan(project, mr, sha).await)
    }

    // ----- drift schedule ---------------------------------------------------------------------

    /// Claim the drift schedule's tick of occurrence `at` (unix ms) and queue its
    /// `Job::DriftTick`, in one write: `None` when any replica already claimed it.
    pub async fn claim_drift_tick(&self, at: i64) -> Result<Option<QueueJobId>> {
        on_backend!(self, b => b.claim_drift_tick(at).await)
    }

    /// The newest claimed drift tick (unix ms), if any ever was.
    pub async fn last_drift_tick(&self) -> Result<Option<i64>> {
        on_backend!(self, b => b.last_drift_tick().await)
    }

    /// Record a root's drift check, replacing its last one (a check that could not check
    /// keeps the time of the last one that could).
    pub async fn record_drift_root(&self, root: DriftRootRecord) -> Result<()> {
        on_backend!(self, b => b.record_drift_root(root).await)
    }

    /// Forget the drift checks of `project`'s roots not in `keep` (removed from its
    /// `.planbot.toml`, or no longer checked).
    pub async fn forget_drift_roots(&self, project: ProjectId, keep: Vec<String>) -> Result<()> {
        on_backend!(self, b => b.forget_drift_roots(project, keep).await)
    }

    /// Every root's last drift check, by project path and root.
    pub async fn drift_roots(&self) -> Result<Vec<DriftRootRecord>> {
        on_backend!(self, b => b.drift_roots().await)
    }

    // ----- runs -----------------------------------------------------------------------------

    /// Start a run (one root of one plan or apply); it shows as `running` until finished.
    pub async fn start_run(&self, run: NewRun) -> Result<RunId> {
        on_backend!(self, b => b.start_run(run).await)
    }

    /// Finish a run. Every text must already be scrubbed. A log longer than
    /// [`STORED_LOG_MAX`] keeps its head and tail, with a line saying what was left out.
    pub async fn finish_run(&self, id: RunId, mut end: RunEnd) -> Result<()> {
        if end.log.len() > STORED_LOG_MAX {
            end.log = head_and_tail(&end.log, STORED_LOG_MAX);
        }
        on_backend!(self, b => b.finish_run(id, end).await)
    }

    pub async fn run(&self, id: RunId) -> Result<Option<RunRecord>> {
        on_backend!(self, b => b.run(id).await)
    }

    /// The newest runs first.
    pub async fn recent_runs(&self, limit: u32) -> Result<Vec<RunRecord>> {
        on_backend!(self, b => b.recent_runs(limit).await)
    }

    /// The projects that have runs, with their last known path (for the run pages' filter).
    pub async fn run_projects(&self) -> Result<Vec<(ProjectId, Option<String>)>> {
        on_backend!(self, b => b.run_projects().await)
    }

    /// One page of runs, newest first: only of `q.projects`, optionally one MR and one state,
    /// older than `q.before`; at most `q.limit`.
    pub async fn runs_page(&self, q: RunQuery) -> Result<Vec<RunRecord>> {
        on_backend!(self, b => b.runs_page(q).await)
    }

    /// Runs of one MR, newest first.
    pub async fn runs_for_mr(&self, project: ProjectId, mr: MrIid) -> Result<Vec<RunRecord>> {
        on_backend!(self, b => b.runs_for_mr(project, mr).await)
    }

    // ----- reviews: fingerprints, plan digests, MR notes ----------------------------------

    /// Record the fingerprint shown on the MR for (root, sha), when the note is posted.
    pub async fn record_fingerprint(&self, shown: ShownFingerprint) -> Result<()> {
        on_backend!(self, b => b.record_fingerprint(shown).await)
    }

    /// The last fingerprint shown on the MR for `root` (any head), what an apply must match.
    pub async fn last_shown_fingerprint(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
    ) -> Result<Option<ShownFingerprint>> {
        let root = root.to_string();
        on_backend!(self, b => b.last_shown_fingerprint(project, mr, root).await)
    }

    /// The fingerprint shown for one exact (root, sha).
    pub async fn fingerprint_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
        sha: CommitSha,
    ) -> Result<Option<ShownFingerprint>> {
        let root = root.to_string();
        on_backend!(self, b => b.fingerprint_for(project, mr, root, sha).await)
    }

    /// Keep the secret-free digest of the plan shown for (root, sha), recorded with its
    /// fingerprint, so a refused apply can show what changed since review.
    pub async fn record_digest(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
        sha: &CommitSha,
        digest: &PlanDigest,
    ) -> Result<()> {
        let (root, sha, digest) = (root.to_string(), sha.clone(), digest.to_json());
        on_backend!(self, b => b.record_digest(project, mr, root, sha, digest).await)
    }

    /// The digest recorded for (root, sha), if any.
    pub async fn digest_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
        sha: &CommitSha,
    ) -> Result<Option<PlanDigest>> {
        let (root, sha) = (root.to_string(), sha.clone());
        on_backend!(self, b => b.digest_for(project, mr, root, sha).await)
    }

    /// Keep what GitLab's MR widgets show of the plan shown for (root, sha): its counts and
    /// findings ([`RootWidgets`], every text already scrubbed), recorded with its fingerprint.
    pub async fn record_widgets(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
        sha: &CommitSha,
        report: &RootWidgets,
    ) -> Result<()> {
        let (root, sha, json) = (root.to_string(), sha.clone(), report.to_json());
        on_backend!(self, b => b.record_widgets(project, mr, root, sha, json).await)
    }

    /// The widgets' reports of every root planned for (mr, sha), and whether a plan of that
    /// head is still queued or running.
    pub async fn widgets_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<WidgetReports> {
        on_backend!(self, b => b.widgets_for(project, mr, sha).await)
    }

    pub async fn set_mr_note(&self, project: ProjectId, mr: MrIid, note: NoteId) -> Result<()> {
        on_backend!(self, b => b.set_mr_note(project, mr, note).await)
    }

    pub async fn mr_note(&self, project: ProjectId, mr: MrIid) -> Result<Option<NoteId>> {
        on_backend!(self, b => b.mr_note(project, mr).await)
    }

    // ----- applies --------------------------------------------------------------------------

    /// Start an apply for a CI job. `None` if this CI job has applied (or tried to) before, on
    /// any replica: one job id applies once.
    pub async fn begin_apply(&self, a: NewApply) -> Result<Option<ApplyId>> {
        on_backend!(self, b => b.begin_apply(a).await)
    }

    /// Finish an apply (`detail` already scrubbed).
    pub async fn finish_apply(
        &self,
        id: ApplyId,
        state: ApplyState,
        detail: Option<String>,
    ) -> Result<()> {
        on_backend!(self, b => b.finish_apply(id, state, detail).await)
    }

    /// At start-up: applies left `running` by a dead process become `interrupted` (never
    /// re-run); returns them so they can be reported.
    pub async fn mark_interrupted_applies(&self) -> Result<Vec<ApplyRecord>> {
        on_backend!(self, b => b.mark_interrupted_applies().await)
    }

    pub async fn apply_for_job(&self, ci_job: JobId) -> Result<Option<ApplyRecord>> {
        on_backend!(self, b => b.apply_for_job(ci_job).await)
    }

    /// On PostgreSQL, wait until this caller alone applies to `project`, across every replica;
    /// the lock is held until the returned value is dropped (or its replica dies). On SQLite
    /// it returns at once (one process: the root locks serialise applies of a root).
    pub async fn lock_project(&self, project: ProjectId) -> Result<ProjectLock> {
        on_backend!(self, b => b.lock_project(project).await)
    }

    /// [`Store::lock_project`] without waiting: `None` while another apply of `project` holds it.
    pub async fn try_lock_project(&self, project: ProjectId) -> Result<Option<ProjectLock>> {
        on_backend!(self, b => b.try_lock_project(project).await)
    }

    // ----- moving a store ------------------------------------------------------------------

    /// Every row of every table.
    pub async fn export(&self) -> Result<Dump> {
        on_backend!(self, b => b.export().await)
    }

    /// Load `dump` into this (empty) store, keeping ids; all or nothing.
    pub async fn import(&self, dump: Dump) -> Result<()> {
        on_backend!(self, b => b.import(dump).await)
    }
}
