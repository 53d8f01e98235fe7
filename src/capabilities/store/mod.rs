//! The SQLite store (design §11): the [`Store`] facade, its public types, and one file of SQL per
//! thing stored (deliveries, queue jobs, runs, reviews, applies), migrations and the writer.

mod applies;
mod connection;
mod deliveries;
mod migrations;
mod queue;
mod reviews;
mod runs;
mod types;
mod writer;

#[cfg(test)]
mod tests;

pub use migrations::{SchemaError, SCHEMA_VERSION};
pub use types::{
    ApplyId, ApplyRecord, ApplyState, ClaimedJob, DeliveryOutcome, Enqueued, JobEnd, JobRow,
    NewApply, NewDelivery, NewRun, QueueJobId, QueueJobKind, QueueJobState, RunEnd, RunKind,
    RunQuery, RunRecord, RunState, ShownFingerprint, UnknownValue,
};

use crate::core::events::Job;
use crate::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId, RunId};
use crate::core::plan_digest::PlanDigest;
use anyhow::{anyhow, Context, Result};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// The store: cheap to clone (all clones share the writer thread and the reader connection).
///
/// All writes go through ONE writer thread that batches whatever is waiting into a single
/// transaction (group commit, see `writer`); callers get their answer only after the COMMIT.
/// Reads use a separate connection on the blocking pool (WAL readers do not wait for the
/// writer). The store trusts its callers: every text handed to it (logs, notes, errors,
/// details) must already be scrubbed of secrets. It never sees raw webhook bodies.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Mutex<mpsc::Sender<writer::Op>>,
    reader: Arc<Mutex<Connection>>,
    /// Dropped with the store: tells the checkpointer thread to stop.
    _checkpointer: Mutex<mpsc::Sender<()>>,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Store {
    /// Open (or create) the store file, bring its schema up to date (refusing one written by a
    /// newer planbot: [`SchemaError::TooNew`]), and start its writer thread.
    pub fn open(path: &Path) -> Result<Store> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let mut writer = connection::open(path)?;
        migrations::migrate(&mut writer)
            .with_context(|| format!("migrating the store {}", path.display()))?;
        let reader = connection::open(path)?;
        // Checkpoints run on their own thread (see `connection::spawn_checkpointer`).
        writer.pragma_update(None, "wal_autocheckpoint", 0)?;
        let (tx, rx) = mpsc::channel::<writer::Op>();
        std::thread::Builder::new()
            .name("planbot-store-writer".into())
            .spawn(move || writer::writer_loop(writer, rx))
            .context("starting the store writer thread")?;
        let stop_checkpointer = connection::spawn_checkpointer(path)?;
        Ok(Store {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                writer: Mutex::new(tx),
                reader: Arc::new(Mutex::new(reader)),
                _checkpointer: Mutex::new(stop_checkpointer),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Run `f` in the writer's next transaction, under its own savepoint; answers after COMMIT.
    /// An error from `f` rolls back what `f` wrote and comes back here; the batch goes on.
    async fn write<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R> + Send + 'static,
    {
        let (op, rx) = writer::operation(f);
        self.inner
            .writer
            .lock()
            .map_err(|_| anyhow!("store writer lock poisoned"))?
            .send(op)
            .map_err(|_| anyhow!("the store writer has stopped"))?;
        rx.await
            .map_err(|_| anyhow!("the store writer dropped the operation"))?
    }

    /// Run `f` on the read connection, on the blocking pool.
    async fn read<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R> + Send + 'static,
    {
        let reader = self.inner.reader.clone();
        tokio::task::spawn_blocking(move || {
            let conn = reader
                .lock()
                .map_err(|_| anyhow!("store reader lock poisoned"))?;
            f(&conn)
        })
        .await
        .context("store read task")?
    }

    /// A quick liveness query for `/readyz`.
    pub async fn ping(&self) -> Result<()> {
        self.read(|c| {
            Ok(c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))
                .map(|_| ())?)
        })
        .await?;
        // The writer must be alive too.
        self.write(|_| Ok(())).await
    }

    // ----- deliveries -----------------------------------------------------------------------

    /// Record one authentic delivery and enqueue its jobs, atomically. A delivery whose key was
    /// seen before is a duplicate: nothing is enqueued again.
    pub async fn record_delivery(&self, d: NewDelivery, jobs: Vec<Job>) -> Result<DeliveryOutcome> {
        self.write(move |c| deliveries::record(c, &d, &jobs, now_ms()))
            .await
    }

    /// How many deliveries are recorded (all time).
    pub async fn delivery_count(&self) -> Result<u64> {
        self.read(deliveries::count).await
    }

    /// The recorded outcome of a delivery by its key.
    pub async fn delivery_outcome(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_string();
        self.read(move |c| deliveries::outcome(c, &key)).await
    }

    // ----- queue jobs -----------------------------------------------------------------------

    /// Enqueue a job outside a delivery (reconcile, commands, re-plans after a merge).
    pub async fn enqueue(&self, job: Job) -> Result<Enqueued> {
        self.write(move |c| queue::enqueue(c, &job, None, now_ms()))
            .await
    }

    /// Take the oldest queued job and mark it running.
    pub async fn claim_next(&self) -> Result<Option<ClaimedJob>> {
        self.write(|c| queue::claim_next(c, now_ms())).await
    }

    /// Record how a running job ended. A job canceled meanwhile stays canceled.
    pub async fn finish_job(&self, id: QueueJobId, end: JobEnd) -> Result<()> {
        self.write(move |c| queue::finish(c, id, &end, now_ms()))
            .await
    }

    /// Cancel every queued or running job of an MR (e.g. when it closes). Returns the running
    /// ones, whose cancellation tokens the queue must fire.
    pub async fn cancel_mr(
        &self,
        project: ProjectId,
        mr: MrIid,
        why: &str,
    ) -> Result<Vec<QueueJobId>> {
        let why = why.to_string();
        self.write(move |c| queue::cancel(c, project, mr, None, &why, now_ms()))
            .await
    }

    /// At start-up: jobs that were running when the process died go back to the queue (they
    /// run again); runs left `running` are marked `interrupted`. Returns how many jobs were requeued.
    pub async fn requeue_interrupted(&self) -> Result<usize> {
        self.write(|c| {
            let n = queue::requeue_running(c)?;
            runs::interrupt_running(c, now_ms())?;
            Ok(n)
        })
        .await
    }

    /// Jobs still to run.
    pub async fn queue_depth(&self) -> Result<u64> {
        self.read(queue::depth).await
    }

    /// One job's row.
    pub async fn job(&self, id: QueueJobId) -> Result<Option<JobRow>> {
        self.read(move |c| queue::get(c, id)).await
    }

    /// The newest jobs first (for pages and tests).
    pub async fn recent_jobs(&self, limit: u32) -> Result<Vec<JobRow>> {
        self.read(move |c| queue::recent(c, limit)).await
    }

    /// Whether this head of the MR has a plan: a finished plan run, or a plan job queued/running/done.
    pub async fn head_has_plan(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<bool> {
        self.read(move |c| queue::head_has_plan(c, project, mr, &sha))
            .await
    }

    // ----- runs -----------------------------------------------------------------------------

    /// Start a run (one root of one plan or apply); it shows as `running` until finished.
    pub async fn start_run(&self, run: NewRun) -> Result<RunId> {
        self.write(move |c| runs::start(c, &run, now_ms())).await
    }

    /// Finish a run. Every text must already be scrubbed.
    pub async fn finish_run(&self, id: RunId, end: RunEnd) -> Result<()> {
        self.write(move |c| runs::finish(c, id, &end, now_ms()))
            .await
    }

    pub async fn run(&self, id: RunId) -> Result<Option<RunRecord>> {
        self.read(move |c| runs::get(c, id)).await
    }

    /// The newest runs first.
    pub async fn recent_runs(&self, limit: u32) -> Result<Vec<RunRecord>> {
        self.read(move |c| runs::recent(c, limit)).await
    }

    /// The projects that have runs, with their last known path (for the run pages' filter).
    pub async fn run_projects(&self) -> Result<Vec<(ProjectId, Option<String>)>> {
        self.read(runs::projects).await
    }

    /// One page of runs, newest first: only of `q.projects`, optionally one MR and one state,
    /// older than `q.before`; at most `q.limit`.
    pub async fn runs_page(&self, q: RunQuery) -> Result<Vec<RunRecord>> {
        self.read(move |c| runs::page(c, &q)).await
    }

    /// Runs of one MR, newest first.
    pub async fn runs_for_mr(&self, project: ProjectId, mr: MrIid) -> Result<Vec<RunRecord>> {
        self.read(move |c| runs::for_mr(c, project, mr)).await
    }

    // ----- reviews: fingerprints, plan digests, MR notes ----------------------------------

    /// Record the fingerprint shown on the MR for (root, sha), when the note is posted.
    pub async fn record_fingerprint(&self, shown: ShownFingerprint) -> Result<()> {
        self.write(move |c| reviews::record_fingerprint(c, &shown, now_ms()))
            .await
    }

    /// The last fingerprint shown on the MR for `root` (any head), what an apply must match.
    pub async fn last_shown_fingerprint(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: &str,
    ) -> Result<Option<ShownFingerprint>> {
        let root = root.to_string();
        self.read(move |c| reviews::last_shown_fingerprint(c, project, mr, &root))
            .await
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
        self.read(move |c| reviews::fingerprint_for(c, project, mr, &root, &sha))
            .await
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
        self.write(move |c| reviews::record_digest(c, project, mr, &root, &sha, &digest))
            .await
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
        self.read(move |c| reviews::digest_for(c, project, mr, &root, &sha))
            .await
    }

    pub async fn set_mr_note(&self, project: ProjectId, mr: MrIid, note: NoteId) -> Result<()> {
        self.write(move |c| reviews::set_mr_note(c, project, mr, note, now_ms()))
            .await
    }

    pub async fn mr_note(&self, project: ProjectId, mr: MrIid) -> Result<Option<NoteId>> {
        self.read(move |c| reviews::mr_note(c, project, mr)).await
    }

    // ----- applies --------------------------------------------------------------------------

    /// Start an apply for a CI job. `None` if this CI job has applied (or tried to) before:
    /// one job id applies once.
    pub async fn begin_apply(&self, a: NewApply) -> Result<Option<ApplyId>> {
        self.write(move |c| applies::begin(c, &a, now_ms())).await
    }

    /// Finish an apply (`detail` already scrubbed).
    pub async fn finish_apply(
        &self,
        id: ApplyId,
        state: ApplyState,
        detail: Option<String>,
    ) -> Result<()> {
        self.write(move |c| applies::finish(c, id, state, detail.as_deref(), now_ms()))
            .await
    }

    /// At start-up: applies left `running` by a crash become `interrupted` (never re-run);
    /// returns them so they can be reported.
    pub async fn mark_interrupted_applies(&self) -> Result<Vec<ApplyRecord>> {
        self.write(|c| applies::mark_interrupted(c, now_ms())).await
    }

    pub async fn apply_for_job(&self, ci_job: JobId) -> Result<Option<ApplyRecord>> {
        self.read(move |c| applies::for_job(c, ci_job)).await
    }
}
