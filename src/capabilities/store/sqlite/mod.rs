//! The SQLite backend (the default, embedded: one file in `data_dir`): one writer thread with
//! group commit, a reader connection, and one file of SQL per thing stored.

mod applies;
mod connection;
mod deliveries;
mod drift;
mod policies;
mod queue;
mod reviews;
mod runs;
mod targeting;
mod writer;

use super::migrations::{self, SCHEMA_VERSION};

use super::backend::StoreBackend;
use super::dump::{self, Dump, Value, TABLES};
use super::types::{
    ApplyId, ApplyRecord, ApplyState, ClaimedJob, DeliveryOutcome, Enqueued, JobEnd, JobRow, Lease,
    NewApply, NewDelivery, NewRun, QueueJobId, QueueJobState, RunEnd, RunQuery, RunRecord,
    ShownFingerprint, StoreProbe,
};
use super::types::{
    DriftRootRecord, PlanTargeting, PolicyApproval, PolicyVerdictRecord, VerdictRow, WidgetReports,
};
use super::{now_ms, ProjectLock};
use crate::core::events::Job;
use crate::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId, RunId};
use crate::core::plan_digest::PlanDigest;
use anyhow::{anyhow, Context, Result};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What `planbot doctor` reads of the SQLite file at `path`, opened read-only (schema 0 when
/// it does not exist yet: `planbot serve` creates it).
pub(super) fn probe(path: &Path) -> Result<StoreProbe> {
    let mut probe = StoreProbe {
        server: None,
        tls: None,
        schema: 0,
        known: SCHEMA_VERSION,
        live_replicas: Vec::new(),
        last_drift_tick: None,
        drift_roots: Vec::new(),
    };
    if !path.exists() {
        return Ok(probe);
    }
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .with_context(|| format!("opening {} read-only", path.display()))?;
    probe.schema = migrations::sqlite_version(&conn)
        .with_context(|| format!("reading the schema version of {}", path.display()))?;
    let has_drift: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'drift_roots')",
        [],
        |r| r.get(0),
    )?;
    if has_drift {
        probe.last_drift_tick = drift::last(&conn)?;
        probe.drift_roots = drift::roots(&conn)?;
    }
    Ok(probe)
}

/// All writes go through ONE writer thread that batches whatever is waiting into a single
/// transaction (group commit, see `writer`); callers get their answer only after the COMMIT.
/// Reads use a separate connection on the blocking pool (WAL readers do not wait for the
/// writer).
pub(crate) struct SqliteStore {
    path: PathBuf,
    writer: Mutex<mpsc::Sender<writer::Op>>,
    reader: Arc<Mutex<Connection>>,
    /// Dropped with the store: tells the checkpointer thread to stop.
    _checkpointer: Mutex<mpsc::Sender<()>>,
}

impl SqliteStore {
    /// Open (or create) the store file, bring its schema up to date (refusing one written by a
    /// newer planbot), and start its writer thread.
    pub(crate) fn open(path: &Path) -> Result<SqliteStore> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let mut writer = connection::open(path)?;
        migrations::migrate_sqlite(&mut writer)
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
        Ok(SqliteStore {
            path: path.to_path_buf(),
            writer: Mutex::new(tx),
            reader: Arc::new(Mutex::new(reader)),
            _checkpointer: Mutex::new(stop_checkpointer),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f` in the writer's next transaction, under its own savepoint; answers after COMMIT.
    /// An error from `f` rolls back what `f` wrote and comes back here; the batch goes on.
    pub(super) async fn write<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R> + Send + 'static,
    {
        let (op, rx) = writer::operation(f);
        self.writer
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
        let reader = self.reader.clone();
        tokio::task::spawn_blocking(move || {
            let conn = reader
                .lock()
                .map_err(|_| anyhow!("store reader lock poisoned"))?;
            f(&conn)
        })
        .await
        .context("store read task")?
    }
}

impl StoreBackend for SqliteStore {
    async fn ping(&self) -> Result<()> {
        self.read(|c| {
            Ok(c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))
                .map(|_| ())?)
        })
        .await?;
        // The writer must be alive too.
        self.write(|_| Ok(())).await
    }

    async fn record_delivery(&self, d: NewDelivery, jobs: Vec<Job>) -> Result<DeliveryOutcome> {
        self.write(move |c| deliveries::record(c, &d, &jobs, now_ms()))
            .await
    }

    async fn delivery_count(&self) -> Result<u64> {
        self.read(deliveries::count).await
    }

    async fn delivery_outcome(&self, key: String) -> Result<Option<String>> {
        self.read(move |c| deliveries::outcome(c, &key)).await
    }

    async fn enqueue(&self, job: Job) -> Result<Enqueued> {
        self.write(move |c| queue::enqueue(c, &job, None, now_ms()))
            .await
    }

    async fn claim_next(&self, share: usize) -> Result<Option<ClaimedJob>> {
        self.write(move |c| queue::claim_next(c, now_ms(), share))
            .await
    }

    async fn heartbeat(&self, id: QueueJobId) -> Result<Lease> {
        let row = self.read(move |c| queue::get(c, id)).await?;
        Ok(match row.map(|r| r.queue_state()) {
            Some(Ok(QueueJobState::Running)) => Lease::Held,
            Some(Ok(QueueJobState::Canceled)) => Lease::Canceled,
            _ => Lease::Lost,
        })
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        None
    }

    async fn finish_job(&self, id: QueueJobId, end: JobEnd) -> Result<()> {
        self.write(move |c| queue::finish(c, id, &end, now_ms()))
            .await
    }

    async fn cancel_mr(
        &self,
        project: ProjectId,
        mr: MrIid,
        why: String,
    ) -> Result<Vec<QueueJobId>> {
        self.write(move |c| queue::cancel(c, project, mr, None, &why, now_ms()))
            .await
    }

    async fn requeue_interrupted(&self) -> Result<usize> {
        self.write(|c| {
            let n = queue::requeue_running(c)?;
            runs::interrupt_running(c, now_ms())?;
            Ok(n)
        })
        .await
    }

    async fn queue_depth(&self) -> Result<u64> {
        self.read(queue::depth).await
    }

    async fn job(&self, id: QueueJobId) -> Result<Option<JobRow>> {
        self.read(move |c| queue::get(c, id)).await
    }

    async fn recent_jobs(&self, limit: u32) -> Result<Vec<JobRow>> {
        self.read(move |c| queue::recent(c, limit)).await
    }

    async fn head_has_plan(&self, project: ProjectId, mr: MrIid, sha: CommitSha) -> Result<bool> {
        self.read(move |c| queue::head_has_plan(c, project, mr, &sha))
            .await
    }

    async fn start_run(&self, run: NewRun) -> Result<RunId> {
        self.write(move |c| runs::start(c, &run, now_ms())).await
    }

    async fn finish_run(&self, id: RunId, end: RunEnd) -> Result<()> {
        self.write(move |c| runs::finish(c, id, &end, now_ms()))
            .await
    }

    async fn run(&self, id: RunId) -> Result<Option<RunRecord>> {
        self.read(move |c| runs::get(c, id)).await
    }

    async fn recent_runs(&self, limit: u32) -> Result<Vec<RunRecord>> {
        self.read(move |c| runs::recent(c, limit)).await
    }

    async fn run_projects(&self) -> Result<Vec<(ProjectId, Option<String>)>> {
        self.read(runs::projects).await
    }

    async fn runs_page(&self, q: RunQuery) -> Result<Vec<RunRecord>> {
        self.read(move |c| runs::page(c, &q)).await
    }

    async fn runs_for_mr(&self, project: ProjectId, mr: MrIid) -> Result<Vec<RunRecord>> {
        self.read(move |c| runs::for_mr(c, project, mr)).await
    }

    async fn record_fingerprint(&self, shown: ShownFingerprint) -> Result<()> {
        self.write(move |c| reviews::record_fingerprint(c, &shown, now_ms()))
            .await
    }

    async fn last_shown_fingerprint(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
    ) -> Result<Option<ShownFingerprint>> {
        self.read(move |c| reviews::last_shown_fingerprint(c, project, mr, &root))
            .await
    }

    async fn fingerprint_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
    ) -> Result<Option<ShownFingerprint>> {
        self.read(move |c| reviews::fingerprint_for(c, project, mr, &root, &sha))
            .await
    }

    async fn record_digest(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
        digest_json: String,
    ) -> Result<()> {
        self.write(move |c| reviews::record_digest(c, project, mr, &root, &sha, &digest_json))
            .await
    }

    async fn record_widgets(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
        report_json: String,
    ) -> Result<()> {
        self.write(move |c| reviews::record_widgets(c, project, mr, &root, &sha, &report_json))
            .await
    }

    async fn widgets_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<WidgetReports> {
        self.read(move |c| reviews::widgets_for(c, project, mr, &sha))
            .await
    }

    async fn digest_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
    ) -> Result<Option<PlanDigest>> {
        self.read(move |c| reviews::digest_for(c, project, mr, &root, &sha))
            .await
    }

    async fn set_mr_note(&self, project: ProjectId, mr: MrIid, note: NoteId) -> Result<()> {
        self.write(move |c| reviews::set_mr_note(c, project, mr, note, now_ms()))
            .await
    }

    async fn mr_note(&self, project: ProjectId, mr: MrIid) -> Result<Option<NoteId>> {
        self.read(move |c| reviews::mr_note(c, project, mr)).await
    }

    async fn record_policy_verdict(
        &self,
        record: PolicyVerdictRecord,
        verdict_json: String,
    ) -> Result<()> {
        self.write(move |c| policies::record_verdict(c, &record, &verdict_json, now_ms()))
            .await
    }

    async fn policy_verdicts(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<Vec<VerdictRow>> {
        self.read(move |c| policies::verdicts(c, project, mr, &sha))
            .await
    }

    async fn record_policy_approval(&self, approval: PolicyApproval) -> Result<bool> {
        self.write(move |c| policies::record_approval(c, &approval, now_ms()))
            .await
    }

    async fn policy_approvals(&self, project: ProjectId, mr: MrIid) -> Result<Vec<PolicyApproval>> {
        self.read(move |c| policies::approvals(c, project, mr))
            .await
    }

    async fn set_plan_targeting(&self, set: PlanTargeting) -> Result<()> {
        self.write(move |c| targeting::set(c, &set, now_ms())).await
    }

    async fn plan_targeting(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
        root: String,
    ) -> Result<Option<String>> {
        self.read(move |c| targeting::get(c, project, mr, &sha, &root))
            .await
    }

    async fn claim_drift_tick(&self, at: i64) -> Result<Option<QueueJobId>> {
        self.write(move |c| drift::claim(c, at, now_ms())).await
    }

    async fn last_drift_tick(&self) -> Result<Option<i64>> {
        self.read(drift::last).await
    }

    async fn record_drift_root(&self, root: DriftRootRecord) -> Result<()> {
        self.write(move |c| drift::record_root(c, &root)).await
    }

    async fn forget_drift_roots(&self, project: ProjectId, keep: Vec<String>) -> Result<()> {
        self.write(move |c| drift::forget_roots(c, project, &keep))
            .await
    }

    async fn drift_roots(&self) -> Result<Vec<DriftRootRecord>> {
        self.read(drift::roots).await
    }

    async fn begin_apply(&self, a: NewApply) -> Result<Option<ApplyId>> {
        self.write(move |c| applies::begin(c, &a, now_ms())).await
    }

    async fn finish_apply(
        &self,
        id: ApplyId,
        state: ApplyState,
        detail: Option<String>,
    ) -> Result<()> {
        self.write(move |c| applies::finish(c, id, state, detail.as_deref(), now_ms()))
            .await
    }

    async fn mark_interrupted_applies(&self) -> Result<Vec<ApplyRecord>> {
        self.write(|c| applies::mark_interrupted(c, now_ms())).await
    }

    async fn apply_for_job(&self, ci_job: JobId) -> Result<Option<ApplyRecord>> {
        self.read(move |c| applies::for_job(c, ci_job)).await
    }

    async fn lock_project(&self, _project: ProjectId) -> Result<ProjectLock> {
        // One process owns the file: its root locks (`flows::context::locks`) already keep two
        // applies of a root apart, and applies of different roots may run side by side.
        Ok(ProjectLock::none())
    }

    async fn try_lock_project(&self, _project: ProjectId) -> Result<Option<ProjectLock>> {
        Ok(Some(ProjectLock::none()))
    }

    async fn export(&self) -> Result<Dump> {
        self.read(|c| {
            let mut out = Dump::default();
            for (table, cols) in TABLES {
                let sql = format!(
                    "SELECT {} FROM {table} ORDER BY rowid",
                    dump::column_list(cols)
                );
                let mut st = c.prepare(&sql)?;
                let rows = st
                    .query_map([], |r| {
                        (0..cols.len())
                            .map(|i| {
                                Ok(match r.get_ref(i)? {
                                    rusqlite::types::ValueRef::Null => Value::Null,
                                    rusqlite::types::ValueRef::Integer(n) => Value::Int(n),
                                    rusqlite::types::ValueRef::Text(t) => {
                                        Value::Text(String::from_utf8_lossy(t).into_owned())
                                    }
                                    other => Value::Text(format!("{other:?}")),
                                })
                            })
                            .collect::<rusqlite::Result<Vec<Value>>>()
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                out.tables.push((table.to_string(), rows));
            }
            Ok(out)
        })
        .await
    }

    async fn import(&self, dump: Dump) -> Result<()> {
        self.write(move |c| {
            for (table, rows) in &dump.tables {
                let (_, cols) = TABLES
                    .iter()
                    .find(|(t, _)| t == table)
                    .ok_or_else(|| anyhow!("unknown table {table} in the dump"))?;
                let n: i64 =
                    c.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))?;
                anyhow::ensure!(n == 0, "the target store's table {table} is not empty");
                let marks: Vec<String> = (1..=cols.len()).map(|i| format!("?{i}")).collect();
                let mut st = c.prepare(&format!(
                    "INSERT INTO {table} ({}) VALUES ({})",
                    dump::column_list(cols),
                    marks.join(", ")
                ))?;
                for row in rows {
                    let args = row.iter().map(|v| match v {
                        Value::Null => rusqlite::types::Value::Null,
                        Value::Int(n) => rusqlite::types::Value::Integer(*n),
                        Value::Text(t) => rusqlite::types::Value::Text(t.clone()),
                    });
                    st.execute(rusqlite::params_from_iter(args))?;
                }
            }
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::store::tests::{delivery, plan};
    use crate::capabilities::store::Store;

    #[tokio::test]
    async fn a_failing_write_in_a_batch_keeps_nothing_and_its_neighbours_commit() {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = Arc::new(SqliteStore::open(&dir.path().join("planbot.db")).unwrap());
        let store = Store::from_sqlite(sqlite.clone());
        // Hold the writer inside one operation while three more queue up behind it: those three
        // are then taken as one batch.
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let blocker = tokio::spawn({
            let sqlite = sqlite.clone();
            async move {
                sqlite
                    .write(move |_| {
                        let _ = started_tx.send(());
                        let _ = release_rx.recv();
                        Ok(())
                    })
                    .await
            }
        });
        started_rx.await.unwrap();
        let mut a = Box::pin(store.record_delivery(delivery("a"), vec![plan(1, 'a')]));
        let mut b = Box::pin(sqlite.write(|c| -> Result<()> {
            deliveries::record(c, &delivery("b"), &[plan(2, 'b')], now_ms())?;
            anyhow::bail!("refused after writing")
        }));
        let mut c = Box::pin(store.record_delivery(delivery("c"), vec![plan(3, 'c')]));
        // One poll each hands the operation to the writer.
        assert!(futures::poll!(&mut a).is_pending());
        assert!(futures::poll!(&mut b).is_pending());
        assert!(futures::poll!(&mut c).is_pending());
        release_tx.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        assert_eq!(a.await.unwrap().enqueued.len(), 1);
        let err = b.await.unwrap_err();
        assert_eq!(err.to_string(), "refused after writing");
        assert_eq!(c.await.unwrap().enqueued.len(), 1);
        assert_eq!(store.delivery_outcome("b").await.unwrap(), None);
        assert_eq!(store.delivery_count().await.unwrap(), 2);
        let mrs: Vec<_> = store
            .recent_jobs(10)
            .await
            .unwrap()
            .into_iter()
            .map(|j| j.mr.unwrap().0)
            .collect();
        assert_eq!(mrs, [3, 1], "b's job was rolled back with its delivery");
    }
}
