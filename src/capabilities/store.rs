//! The SQLite store (design §11): deliveries, the durable job queue, runs, fingerprints, note ids, apply records.
//!
//! One file in `data_dir`, WAL mode. All writes go through ONE writer thread that batches
//! whatever is waiting into a single transaction (group commit), each operation in its own
//! savepoint so one failing operation does not undo the others; callers get their answer only
//! after the COMMIT. Reads use a separate connection on the blocking pool (WAL readers do not
//! wait for the writer).
//!
//! `synchronous=NORMAL` in WAL mode: a committed transaction survives a crash of the planbot
//! process (it is in the WAL file, written before the answer), but the last transactions before
//! a power loss or kernel crash may be lost (they are not fsynced on every commit). GitLab does
//! not re-deliver lost webhooks either way, and the start-up reconciliation re-plans any open MR
//! whose head has no plan, so this trade buys an order of magnitude in webhook throughput.
//!
//! The store trusts its callers: every text handed to it (logs, notes, errors, details) must
//! already be scrubbed of secrets. It never sees raw webhook bodies.

use crate::core::events::{Job, PlanJob, Supersede};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId, RunId};
use crate::core::plan_digest::PlanDigest;
use anyhow::{anyhow, Context, Result};
use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// A job in planbot's own queue (not a CI job).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct QueueJobId(pub i64);

impl std::fmt::Display for QueueJobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// An apply record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct ApplyId(pub i64);

/// Most operations batched into one transaction.
const MAX_BATCH: usize = 1024;

type Reply = Box<dyn FnOnce(Result<(), String>) + Send>;
type Op = Box<dyn FnOnce(&Connection) -> (bool, Reply) + Send>;

/// The store: cheap to clone (all clones share the writer thread and the reader connection).
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Mutex<mpsc::Sender<Op>>,
    reader: Arc<Mutex<Connection>>,
    /// Dropped with the store: tells the checkpointer thread to stop.
    _checkpointer: Mutex<mpsc::Sender<()>>,
}

/// How often the checkpointer copies the WAL back into the database file.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS deliveries (
    id          INTEGER PRIMARY KEY,
    key         TEXT NOT NULL UNIQUE,
    event       TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    project_id  INTEGER,
    mr_iid      INTEGER,
    received_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id          INTEGER PRIMARY KEY,
    kind        TEXT NOT NULL,
    project_id  INTEGER,
    mr_iid      INTEGER,
    sha         TEXT,
    payload     TEXT NOT NULL,
    state       TEXT NOT NULL,          -- queued | running | done | failed | canceled
    attempts    INTEGER NOT NULL DEFAULT 0,
    detail      TEXT,                   -- why it failed or was canceled
    delivery_id INTEGER,
    created_at  INTEGER NOT NULL,
    started_at  INTEGER,
    finished_at INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, id);
CREATE INDEX IF NOT EXISTS jobs_by_mr ON jobs(project_id, mr_iid, state);
CREATE TABLE IF NOT EXISTS runs (
    id            INTEGER PRIMARY KEY,
    job_id        INTEGER,
    kind          TEXT NOT NULL,        -- plan | apply
    project_id    INTEGER NOT NULL,
    project_path  TEXT,
    mr_iid        INTEGER,
    root          TEXT NOT NULL,
    sha           TEXT NOT NULL,
    state         TEXT NOT NULL,        -- running | succeeded | failed | canceled | refused | interrupted
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    summary       TEXT,
    log           TEXT NOT NULL DEFAULT '',
    note_markdown TEXT,
    fingerprint   TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_mr ON runs(project_id, mr_iid, sha);
CREATE TABLE IF NOT EXISTS fingerprints (
    project_id  INTEGER NOT NULL,
    mr_iid      INTEGER NOT NULL,
    root        TEXT NOT NULL,
    sha         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    run_id      INTEGER,
    shown_at    INTEGER NOT NULL,
    PRIMARY KEY (project_id, mr_iid, root, sha)
);
CREATE TABLE IF NOT EXISTS plan_digests (
    project_id  INTEGER NOT NULL,
    mr_iid      INTEGER NOT NULL,
    root        TEXT NOT NULL,
    sha         TEXT NOT NULL,
    digest      TEXT NOT NULL,          -- core::plan_digest::PlanDigest as JSON: secret-free
    PRIMARY KEY (project_id, mr_iid, root, sha)
);
CREATE TABLE IF NOT EXISTS mr_notes (
    project_id  INTEGER NOT NULL,
    mr_iid      INTEGER NOT NULL,
    note_id     INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (project_id, mr_iid)
);
CREATE TABLE IF NOT EXISTS applies (
    id          INTEGER PRIMARY KEY,
    ci_job_id   INTEGER NOT NULL UNIQUE, -- one CI job applies once
    project_id  INTEGER NOT NULL,
    mr_iid      INTEGER,
    sha         TEXT NOT NULL,
    roots       TEXT NOT NULL,           -- JSON list
    state       TEXT NOT NULL,           -- running | succeeded | failed | refused | interrupted
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    detail      TEXT
);
"#;

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // See the module comment: durable against a process crash, not against power loss.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

impl Store {
    /// Open (or create) the store file and start its writer thread.
    pub fn open(path: &Path) -> Result<Store> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let writer =
            Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
        configure(&writer).context("configuring SQLite")?;
        writer
            .execute_batch(SCHEMA)
            .context("creating the schema")?;
        let reader =
            Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
        configure(&reader).context("configuring SQLite")?;
        // Checkpoints (which fsync) run on their own thread and connection, not inside the
        // writer's COMMIT: the webhook answer never waits for one.
        writer.pragma_update(None, "wal_autocheckpoint", 0)?;
        let (tx, rx) = mpsc::channel::<Op>();
        std::thread::Builder::new()
            .name("planbot-store-writer".into())
            .spawn(move || writer_loop(writer, rx))
            .context("starting the store writer thread")?;
        let checkpointer =
            Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
        configure(&checkpointer).context("configuring SQLite")?;
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("planbot-store-checkpoint".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(CHECKPOINT_EVERY)
                {
                    // PASSIVE never blocks the writer or the readers.
                    let _ =
                        checkpointer.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                }
                let _ = checkpointer.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
            })
            .context("starting the store checkpoint thread")?;
        Ok(Store {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                writer: Mutex::new(tx),
                reader: Arc::new(Mutex::new(reader)),
                _checkpointer: Mutex::new(stop_tx),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Run `f` in the writer's next transaction; answers after COMMIT.
    pub async fn write<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<R>>();
        let op: Op = Box::new(move |conn| {
            let r = f(conn);
            let ok = r.is_ok();
            let reply: Reply = Box::new(move |commit| {
                let out = match commit {
                    Ok(()) => r,
                    Err(e) => Err(anyhow!("store commit failed: {e}")),
                };
                let _ = tx.send(out);
            });
            (ok, reply)
        });
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
    pub async fn read<R, F>(&self, f: F) -> Result<R>
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

    // ----- deliveries -----------------------------------------------------------------------

    /// Record one authentic delivery and enqueue its jobs, atomically. A delivery whose key was
    /// seen before is a duplicate: nothing is enqueued again.
    pub async fn record_delivery(&self, d: NewDelivery, jobs: Vec<Job>) -> Result<DeliveryOutcome> {
        self.write(move |conn| {
            let now = now_ms();
            let inserted = conn.execute(
                "INSERT INTO deliveries (key, event, outcome, project_id, mr_iid, received_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(key) DO NOTHING",
                params![
                    d.key,
                    d.event,
                    d.outcome,
                    d.project.map(|p| p.0 as i64),
                    d.mr.map(|m| m.0 as i64),
                    now
                ],
            )?;
            if inserted == 0 {
                return Ok(DeliveryOutcome {
                    duplicate: true,
                    ..Default::default()
                });
            }
            let delivery_id = conn.last_insert_rowid();
            let mut out = DeliveryOutcome::default();
            for job in &jobs {
                let e = enqueue_in(conn, job, Some(delivery_id), now)?;
                out.enqueued.extend(e.id);
                out.cancel_running.extend(e.cancel_running);
            }
            Ok(out)
        })
        .await
    }

    /// How many deliveries are recorded (all time).
    pub async fn delivery_count(&self) -> Result<u64> {
        self.read(|c| {
            Ok(c.query_row("SELECT COUNT(*) FROM deliveries", [], |r| {
                r.get::<_, i64>(0)
            })? as u64)
        })
        .await
    }

    /// The recorded outcome of a delivery by its key.
    pub async fn delivery_outcome(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_string();
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT outcome FROM deliveries WHERE key = ?1",
                [key],
                |r| r.get(0),
            )
            .optional()?)
        })
        .await
    }

    // ----- jobs -----------------------------------------------------------------------------

    /// Enqueue a job outside a delivery (reconcile, commands, re-plans after a merge).
    pub async fn enqueue(&self, job: Job) -> Result<Enqueued> {
        self.write(move |conn| enqueue_in(conn, &job, None, now_ms()))
            .await
    }

    /// Take the oldest queued job and mark it running.
    pub async fn claim_next(&self) -> Result<Option<ClaimedJob>> {
        self.write(|conn| {
            let row = conn
                .query_row(
                    "UPDATE jobs SET state = 'running', started_at = ?1, attempts = attempts + 1
                     WHERE id = (SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1)
                     RETURNING id, payload, attempts",
                    [now_ms()],
                    |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?)),
                )
                .optional()?;
            let Some((id, payload, attempts)) = row else {
                return Ok(None);
            };
            match serde_json::from_str::<Job>(&payload) {
                Ok(job) => Ok(Some(ClaimedJob {
                    id: QueueJobId(id),
                    job,
                    attempts: attempts as u32,
                })),
                Err(e) => {
                    // A payload from an incompatible version: fail it rather than loop on it.
                    conn.execute(
                        "UPDATE jobs SET state = 'failed', finished_at = ?2, detail = ?3 WHERE id = ?1",
                        params![id, now_ms(), format!("unreadable job payload: {e}")],
                    )?;
                    Ok(None)
                }
            }
        })
        .await
    }

    /// Record how a running job ended. A job canceled meanwhile stays canceled.
    pub async fn finish_job(&self, id: QueueJobId, end: JobEnd) -> Result<()> {
        self.write(move |conn| {
            let (state, detail) = match end {
                JobEnd::Done => ("done", None),
                JobEnd::Failed(d) => ("failed", Some(d)),
                JobEnd::Canceled(d) => ("canceled", Some(d)),
            };
            conn.execute(
                "UPDATE jobs SET state = ?2, detail = COALESCE(?3, detail), finished_at = ?4
                 WHERE id = ?1 AND state = 'running'",
                params![id.0, state, detail, now_ms()],
            )?;
            Ok(())
        })
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
        self.write(move |conn| cancel_where(conn, project, mr, None, &why, now_ms()))
            .await
    }

    /// At start-up: jobs that were running when the process died go back to the queue (they
    /// run again); runs left `running` are marked `interrupted`. Returns how many jobs were requeued.
    pub async fn requeue_interrupted(&self) -> Result<usize> {
        self.write(|conn| {
            let n = conn.execute(
                "UPDATE jobs SET state = 'queued', detail = 'interrupted by a restart; re-run' WHERE state = 'running'",
                [],
            )?;
            conn.execute(
                "UPDATE runs SET state = 'interrupted', finished_at = ?1 WHERE state = 'running'",
                [now_ms()],
            )?;
            Ok(n)
        })
        .await
    }

    /// Jobs still to run.
    pub async fn queue_depth(&self) -> Result<u64> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT COUNT(*) FROM jobs WHERE state = 'queued'",
                [],
                |r| r.get::<_, i64>(0),
            )? as u64)
        })
        .await
    }

    /// One job's row.
    pub async fn job(&self, id: QueueJobId) -> Result<Option<JobRow>> {
        self.read(move |c| {
            Ok(
                c.query_row(&format!("{JOB_SELECT} WHERE id = ?1"), [id.0], job_row)
                    .optional()?,
            )
        })
        .await
    }

    /// The newest jobs first (for pages and tests).
    pub async fn recent_jobs(&self, limit: u32) -> Result<Vec<JobRow>> {
        self.read(move |c| {
            let mut st = c.prepare(&format!("{JOB_SELECT} ORDER BY id DESC LIMIT ?1"))?;
            let rows = st
                .query_map([limit], job_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    /// Whether this head of the MR has a plan: a finished plan run, or a plan job queued/running/done.
    pub async fn head_has_plan(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<bool> {
        self.read(move |c| {
            let n: i64 = c.query_row(
                "SELECT (SELECT COUNT(*) FROM jobs WHERE kind = 'plan' AND project_id = ?1 AND mr_iid = ?2
                           AND sha = ?3 AND state IN ('queued', 'running', 'done'))
                      + (SELECT COUNT(*) FROM runs WHERE kind = 'plan' AND project_id = ?1 AND mr_iid = ?2
                           AND sha = ?3 AND state IN ('succeeded', 'failed'))",
                params![project.0 as i64, mr.0 as i64, sha.0],
                |r| r.get(0),
            )?;
            Ok(n > 0)
        })
        .await
    }

    // ----- runs -----------------------------------------------------------------------------

    /// Start a run (one root of one plan or apply); it shows as `running` until finished.
    pub async fn start_run(&self, run: NewRun) -> Result<RunId> {
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO runs (job_id, kind, project_id, project_path, mr_iid, root, sha, state, started_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', ?8)",
                params![
                    run.job.map(|j| j.0),
                    run.kind.as_str(),
                    run.project.0 as i64,
                    run.project_path,
                    run.mr.map(|m| m.0 as i64),
                    run.root,
                    run.sha.0,
                    now_ms()
                ],
            )?;
            Ok(RunId(conn.last_insert_rowid() as u64))
        })
        .await
    }

    /// Finish a run. Every text must already be scrubbed.
    pub async fn finish_run(&self, id: RunId, end: RunEnd) -> Result<()> {
        self.write(move |conn| {
            let now = now_ms();
            conn.execute(
                "UPDATE runs SET state = ?2, finished_at = ?3, summary = ?4, log = ?5, note_markdown = ?6,
                        fingerprint = ?7
                 WHERE id = ?1",
                params![
                    id.0 as i64,
                    end.state.as_str(),
                    now,
                    end.summary,
                    end.log,
                    end.note_markdown,
                    end.fingerprint.as_ref().map(|f| f.as_hex().to_string())
                ],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn run(&self, id: RunId) -> Result<Option<RunRecord>> {
        self.read(move |c| {
            Ok(c.query_row(
                &format!("{RUN_SELECT} WHERE id = ?1"),
                [id.0 as i64],
                run_row,
            )
            .optional()?)
        })
        .await
    }

    /// The newest runs first.
    pub async fn recent_runs(&self, limit: u32) -> Result<Vec<RunRecord>> {
        self.read(move |c| {
            let mut st = c.prepare(&format!("{RUN_SELECT} ORDER BY id DESC LIMIT ?1"))?;
            let rows = st
                .query_map([limit], run_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    /// The projects that have runs, with their last known path (for the run pages' filter).
    pub async fn run_projects(&self) -> Result<Vec<(ProjectId, Option<String>)>> {
        self.read(move |c| {
            let mut st = c.prepare(
                "SELECT project_id, MAX(project_path) FROM runs GROUP BY project_id ORDER BY 2",
            )?;
            let rows = st
                .query_map([], |r| {
                    Ok((ProjectId(r.get::<_, i64>(0)? as u64), r.get(1)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    /// One page of runs, newest first: only of `q.projects`, optionally one MR and one state,
    /// older than `q.before`; at most `q.limit`.
    pub async fn runs_page(&self, q: RunQuery) -> Result<Vec<RunRecord>> {
        self.read(move |c| {
            if q.projects.is_empty() {
                return Ok(Vec::new());
            }
            let ids: Vec<String> = q.projects.iter().map(|p| p.0.to_string()).collect();
            let mut sql = format!("{RUN_SELECT} WHERE project_id IN ({})", ids.join(","));
            let mut args: Vec<rusqlite::types::Value> = Vec::new();
            if let Some(mr) = q.mr {
                args.push((mr.0 as i64).into());
                sql.push_str(&format!(" AND mr_iid = ?{}", args.len()));
            }
            if let Some(state) = q.state {
                args.push(state.as_str().to_string().into());
                sql.push_str(&format!(" AND state = ?{}", args.len()));
            }
            if let Some(before) = q.before {
                args.push((before.0 as i64).into());
                sql.push_str(&format!(" AND id < ?{}", args.len()));
            }
            args.push(i64::from(q.limit).into());
            sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", args.len()));
            let mut st = c.prepare(&sql)?;
            let rows = st
                .query_map(rusqlite::params_from_iter(args), run_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    /// Runs of one MR, newest first.
    pub async fn runs_for_mr(&self, project: ProjectId, mr: MrIid) -> Result<Vec<RunRecord>> {
        self.read(move |c| {
            let mut st = c.prepare(&format!(
                "{RUN_SELECT} WHERE project_id = ?1 AND mr_iid = ?2 ORDER BY id DESC"
            ))?;
            let rows = st
                .query_map(params![project.0 as i64, mr.0 as i64], run_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    // ----- fingerprints ---------------------------------------------------------------------

    /// Record the fingerprint shown on the MR for (root, sha), when the note is posted.
    pub async fn record_fingerprint(&self, shown: ShownFingerprint) -> Result<()> {
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO fingerprints (project_id, mr_iid, root, sha, fingerprint, run_id, shown_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE
                 SET fingerprint = excluded.fingerprint, run_id = excluded.run_id, shown_at = excluded.shown_at",
                params![
                    shown.project.0 as i64,
                    shown.mr.0 as i64,
                    shown.root,
                    shown.sha.0,
                    shown.fingerprint.as_hex(),
                    shown.run.map(|r| r.0 as i64),
                    now_ms()
                ],
            )?;
            Ok(())
        })
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
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT project_id, mr_iid, root, sha, fingerprint, run_id FROM fingerprints
                 WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3 ORDER BY shown_at DESC, rowid DESC LIMIT 1",
                params![project.0 as i64, mr.0 as i64, root],
                fingerprint_row,
            )
            .optional()?
            .flatten())
        })
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
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT project_id, mr_iid, root, sha, fingerprint, run_id FROM fingerprints
                 WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3 AND sha = ?4",
                params![project.0 as i64, mr.0 as i64, root, sha.0],
                fingerprint_row,
            )
            .optional()?
            .flatten())
        })
        .await
    }

    // ----- plan digests ---------------------------------------------------------------------

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
        let (root, sha, digest) = (root.to_string(), sha.0.clone(), digest.to_json());
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO plan_digests (project_id, mr_iid, root, sha, digest) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (project_id, mr_iid, root, sha) DO UPDATE SET digest = excluded.digest",
                params![project.0 as i64, mr.0 as i64, root, sha, digest],
            )?;
            Ok(())
        })
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
        let (root, sha) = (root.to_string(), sha.0.clone());
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT digest FROM plan_digests WHERE project_id = ?1 AND mr_iid = ?2 AND root = ?3 AND sha = ?4",
                params![project.0 as i64, mr.0 as i64, root, sha],
                |r| r.get::<_, String>(0),
            )
            .optional()?
            .and_then(|text| PlanDigest::from_json(&text)))
        })
        .await
    }

    // ----- MR notes -------------------------------------------------------------------------

    pub async fn set_mr_note(&self, project: ProjectId, mr: MrIid, note: NoteId) -> Result<()> {
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO mr_notes (project_id, mr_iid, note_id, updated_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (project_id, mr_iid) DO UPDATE SET note_id = excluded.note_id, updated_at = excluded.updated_at",
                params![project.0 as i64, mr.0 as i64, note.0 as i64, now_ms()],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn mr_note(&self, project: ProjectId, mr: MrIid) -> Result<Option<NoteId>> {
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT note_id FROM mr_notes WHERE project_id = ?1 AND mr_iid = ?2",
                params![project.0 as i64, mr.0 as i64],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            .map(|n| NoteId(n as u64)))
        })
        .await
    }

    // ----- applies --------------------------------------------------------------------------

    /// Start an apply for a CI job. `None` if this CI job has applied (or tried to) before:
    /// one job id applies once.
    pub async fn begin_apply(&self, a: NewApply) -> Result<Option<ApplyId>> {
        self.write(move |conn| {
            let roots = serde_json::to_string(&a.roots)?;
            let n = conn.execute(
                "INSERT INTO applies (ci_job_id, project_id, mr_iid, sha, roots, state, started_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6) ON CONFLICT (ci_job_id) DO NOTHING",
                params![
                    a.ci_job.0 as i64,
                    a.project.0 as i64,
                    a.mr.map(|m| m.0 as i64),
                    a.sha.0,
                    roots,
                    now_ms()
                ],
            )?;
            Ok((n == 1).then(|| ApplyId(conn.last_insert_rowid())))
        })
        .await
    }

    /// Finish an apply (`detail` already scrubbed).
    pub async fn finish_apply(
        &self,
        id: ApplyId,
        state: ApplyState,
        detail: Option<String>,
    ) -> Result<()> {
        self.write(move |conn| {
            conn.execute(
                "UPDATE applies SET state = ?2, finished_at = ?3, detail = ?4 WHERE id = ?1",
                params![id.0, state.as_str(), now_ms(), detail],
            )?;
            Ok(())
        })
        .await
    }

    /// At start-up: applies left `running` by a crash become `interrupted` (never re-run);
    /// returns them so they can be reported.
    pub async fn mark_interrupted_applies(&self) -> Result<Vec<ApplyRecord>> {
        self.write(|conn| {
            let mut st = conn.prepare(&format!(
                "UPDATE applies SET state = 'interrupted', finished_at = ?1 WHERE state = 'running' RETURNING {APPLY_COLS}"
            ))?;
            let rows = st.query_map([now_ms()], apply_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    pub async fn apply_for_job(&self, ci_job: JobId) -> Result<Option<ApplyRecord>> {
        self.read(move |c| {
            Ok(c.query_row(
                &format!("SELECT {APPLY_COLS} FROM applies WHERE ci_job_id = ?1"),
                [ci_job.0 as i64],
                apply_row,
            )
            .optional()?)
        })
        .await
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
}

fn writer_loop(conn: Connection, rx: mpsc::Receiver<Op>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let mut replies: Vec<Reply> = Vec::with_capacity(batch.len());
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            let msg = e.to_string();
            for op in batch {
                // Still run nothing: answer every caller with the error.
                let (_, reply) = op_failed(op, &conn);
                reply(Err(msg.clone()));
            }
            continue;
        }
        for op in batch {
            let _ = conn.execute_batch("SAVEPOINT op");
            let (ok, reply) = op(&conn);
            if ok {
                let _ = conn.execute_batch("RELEASE op");
            } else {
                let _ = conn.execute_batch("ROLLBACK TO op; RELEASE op");
            }
            replies.push(reply);
        }
        let commit = conn.execute_batch("COMMIT").map_err(|e| e.to_string());
        if commit.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for reply in replies {
            reply(commit.clone());
        }
    }
}

/// Produce an op's reply without letting it touch the database (used when BEGIN failed).
fn op_failed(op: Op, conn: &Connection) -> (bool, Reply) {
    // Running the op outside a transaction would autocommit; instead run it inside a savepoint
    // that is always rolled back.
    let _ = conn.execute_batch("SAVEPOINT dead");
    let out = op(conn);
    let _ = conn.execute_batch("ROLLBACK TO dead; RELEASE dead");
    out
}

/// What enqueuing did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enqueued {
    /// The new job; `None` if an identical job was already queued.
    pub id: Option<QueueJobId>,
    /// Running jobs this one superseded: their tokens must be cancelled.
    pub cancel_running: Vec<QueueJobId>,
}

fn enqueue_in(conn: &Connection, job: &Job, delivery: Option<i64>, now: i64) -> Result<Enqueued> {
    let (project, mr) = job
        .mr()
        .map(|(p, m)| (Some(p), Some(m)))
        .unwrap_or((None, None));
    let sha = job.sha().map(|s| s.0.clone());
    let payload = serde_json::to_string(job)?;
    // An identical job already waiting: nothing to add (and nothing to supersede).
    let same: Option<i64> = conn
        .query_row(
            "SELECT id FROM jobs WHERE project_id IS ?1 AND mr_iid IS ?2 AND state = 'queued' AND payload = ?3 LIMIT 1",
            params![project.map(|p| p.0 as i64), mr.map(|m| m.0 as i64), &payload],
            |r| r.get(0),
        )
        .optional()?;
    if same.is_some() {
        return Ok(Enqueued::default());
    }
    let mut cancel_running = Vec::new();
    if let (Some(p), Some(m)) = (project, mr) {
        match job.supersedes() {
            Supersede::None => {}
            Supersede::OtherHeads => {
                let why = match job {
                    Job::Plan(PlanJob { head, .. }) => {
                        format!("superseded by a newer plan of {}", head.short())
                    }
                    _ => "superseded".to_string(),
                };
                cancel_running = cancel_where(conn, p, m, Some("plan"), &why, now)?;
            }
            Supersede::All => {
                cancel_running =
                    cancel_where(conn, p, m, None, "the merge request was closed", now)?;
            }
        }
    }
    conn.execute(
        "INSERT INTO jobs (kind, project_id, mr_iid, sha, payload, state, delivery_id, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7)",
        params![
            job.kind(),
            project.map(|p| p.0 as i64),
            mr.map(|m| m.0 as i64),
            sha,
            payload,
            delivery,
            now
        ],
    )?;
    Ok(Enqueued {
        id: Some(QueueJobId(conn.last_insert_rowid())),
        cancel_running,
    })
}

/// Cancel queued and running jobs of an MR (of one kind, or all); returns the running ones.
fn cancel_where(
    conn: &Connection,
    p: ProjectId,
    m: MrIid,
    kind: Option<&str>,
    why: &str,
    now: i64,
) -> Result<Vec<QueueJobId>> {
    let args = params![p.0 as i64, m.0 as i64, kind];
    let filter = "project_id = ?1 AND mr_iid = ?2 AND (?3 IS NULL OR kind = ?3)";
    let running = conn
        .prepare_cached(&format!(
            "SELECT id FROM jobs WHERE {filter} AND state = 'running'"
        ))?
        .query_map(args, |r| r.get::<_, i64>(0).map(QueueJobId))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    conn.prepare_cached(&format!(
        "UPDATE jobs SET state = 'canceled', detail = ?4, finished_at = ?5
         WHERE {filter} AND state IN ('queued', 'running')"
    ))?
    .execute(params![p.0 as i64, m.0 as i64, kind, why, now])?;
    Ok(running)
}

/// One delivery to record.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    /// `Idempotency-Key` / `webhook-id` (or a hash of the body when GitLab sent neither).
    pub key: String,
    /// The `X-Gitlab-Event` label (`merge_request`, `note`, …).
    pub event: String,
    /// `enqueued`, `ignored: …`, `unparseable: …`.
    pub outcome: String,
    pub project: Option<ProjectId>,
    pub mr: Option<MrIid>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryOutcome {
    /// The key was seen before; nothing was enqueued.
    pub duplicate: bool,
    pub enqueued: Vec<QueueJobId>,
    /// Running jobs superseded by this delivery.
    pub cancel_running: Vec<QueueJobId>,
}

/// A job taken from the queue.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub id: QueueJobId,
    pub job: Job,
    /// 1 on the first run; more after restarts.
    pub attempts: u32,
}

/// How a job ended.
#[derive(Debug, Clone)]
pub enum JobEnd {
    Done,
    Failed(String),
    Canceled(String),
}

/// A job as stored.
#[derive(Debug, Clone, Serialize)]
pub struct JobRow {
    pub id: QueueJobId,
    pub kind: String,
    pub project: Option<ProjectId>,
    pub mr: Option<MrIid>,
    pub sha: Option<String>,
    pub state: String,
    pub attempts: u32,
    pub detail: Option<String>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    #[serde(skip)]
    pub job: Option<Job>,
}

const JOB_SELECT: &str =
    "SELECT id, kind, project_id, mr_iid, sha, state, attempts, detail, created_at, started_at, finished_at, payload FROM jobs";

fn job_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<JobRow> {
    Ok(JobRow {
        id: QueueJobId(r.get(0)?),
        kind: r.get(1)?,
        project: r.get::<_, Option<i64>>(2)?.map(|p| ProjectId(p as u64)),
        mr: r.get::<_, Option<i64>>(3)?.map(|m| MrIid(m as u64)),
        sha: r.get(4)?,
        state: r.get(5)?,
        attempts: r.get::<_, i64>(6)? as u32,
        detail: r.get(7)?,
        created_at: r.get(8)?,
        started_at: r.get(9)?,
        finished_at: r.get(10)?,
        job: serde_json::from_str(&r.get::<_, String>(11)?).ok(),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    Plan,
    Apply,
}

impl RunKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Plan => "plan",
            RunKind::Apply => "apply",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Running,
    Succeeded,
    Failed,
    Canceled,
    Refused,
    Interrupted,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Canceled => "canceled",
            RunState::Refused => "refused",
            RunState::Interrupted => "interrupted",
        }
    }
    fn parse(s: &str) -> RunState {
        match s {
            "succeeded" => RunState::Succeeded,
            "failed" => RunState::Failed,
            "canceled" => RunState::Canceled,
            "refused" => RunState::Refused,
            "interrupted" => RunState::Interrupted,
            _ => RunState::Running,
        }
    }
}

/// A run to start.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub job: Option<QueueJobId>,
    pub kind: RunKind,
    pub project: ProjectId,
    pub project_path: Option<String>,
    pub mr: Option<MrIid>,
    pub root: String,
    pub sha: CommitSha,
}

/// How a run ended; every text already scrubbed.
#[derive(Debug, Clone)]
pub struct RunEnd {
    pub state: RunState,
    /// One line, e.g. "2 to add, 1 to change, 0 to destroy".
    pub summary: Option<String>,
    /// The redacted engine log.
    pub log: String,
    /// The rendered note (markdown) this run produced.
    pub note_markdown: Option<String>,
    pub fingerprint: Option<Fingerprint>,
}

/// What [`Store::runs_page`] lists.
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    pub projects: Vec<ProjectId>,
    pub mr: Option<MrIid>,
    pub state: Option<RunState>,
    pub before: Option<RunId>,
    pub limit: u32,
}

/// A run as stored.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    pub id: RunId,
    pub job: Option<QueueJobId>,
    pub kind: RunKind,
    pub project: ProjectId,
    pub project_path: Option<String>,
    pub mr: Option<MrIid>,
    pub root: String,
    pub sha: CommitSha,
    pub state: RunState,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub summary: Option<String>,
    pub log: String,
    pub note_markdown: Option<String>,
    pub fingerprint: Option<String>,
}

impl RunRecord {
    pub fn duration_ms(&self) -> Option<i64> {
        self.finished_at.map(|f| (f - self.started_at).max(0))
    }
}

const RUN_SELECT: &str =
    "SELECT id, job_id, kind, project_id, project_path, mr_iid, root, sha, state, started_at,
    finished_at, summary, log, note_markdown, fingerprint FROM runs";

fn run_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
    Ok(RunRecord {
        id: RunId(r.get::<_, i64>(0)? as u64),
        job: r.get::<_, Option<i64>>(1)?.map(QueueJobId),
        kind: if r.get::<_, String>(2)? == "apply" {
            RunKind::Apply
        } else {
            RunKind::Plan
        },
        project: ProjectId(r.get::<_, i64>(3)? as u64),
        project_path: r.get(4)?,
        mr: r.get::<_, Option<i64>>(5)?.map(|m| MrIid(m as u64)),
        root: r.get(6)?,
        sha: CommitSha(r.get(7)?),
        state: RunState::parse(&r.get::<_, String>(8)?),
        started_at: r.get(9)?,
        finished_at: r.get(10)?,
        summary: r.get(11)?,
        log: r.get(12)?,
        note_markdown: r.get(13)?,
        fingerprint: r.get(14)?,
    })
}

/// A fingerprint shown on an MR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownFingerprint {
    pub project: ProjectId,
    pub mr: MrIid,
    pub root: String,
    pub sha: CommitSha,
    pub fingerprint: Fingerprint,
    pub run: Option<RunId>,
}

fn fingerprint_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Option<ShownFingerprint>> {
    let hex: String = r.get(4)?;
    Ok(
        Fingerprint::from_hex(&hex).map(|fingerprint| ShownFingerprint {
            project: ProjectId(r.get::<_, i64>(0).unwrap_or(0) as u64),
            mr: MrIid(r.get::<_, i64>(1).unwrap_or(0) as u64),
            root: r.get(2).unwrap_or_default(),
            sha: CommitSha(r.get(3).unwrap_or_default()),
            fingerprint,
            run: r
                .get::<_, Option<i64>>(5)
                .ok()
                .flatten()
                .map(|x| RunId(x as u64)),
        }),
    )
}

/// An apply to begin.
#[derive(Debug, Clone)]
pub struct NewApply {
    pub ci_job: JobId,
    pub project: ProjectId,
    pub mr: Option<MrIid>,
    pub sha: CommitSha,
    pub roots: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyState {
    Running,
    Succeeded,
    Failed,
    Refused,
    Interrupted,
}

impl ApplyState {
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyState::Running => "running",
            ApplyState::Succeeded => "succeeded",
            ApplyState::Failed => "failed",
            ApplyState::Refused => "refused",
            ApplyState::Interrupted => "interrupted",
        }
    }
    fn parse(s: &str) -> ApplyState {
        match s {
            "succeeded" => ApplyState::Succeeded,
            "failed" => ApplyState::Failed,
            "refused" => ApplyState::Refused,
            "interrupted" => ApplyState::Interrupted,
            _ => ApplyState::Running,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ApplyRecord {
    pub id: ApplyId,
    pub ci_job: JobId,
    pub project: ProjectId,
    pub mr: Option<MrIid>,
    pub sha: CommitSha,
    pub roots: Vec<String>,
    pub state: ApplyState,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub detail: Option<String>,
}

const APPLY_COLS: &str =
    "id, ci_job_id, project_id, mr_iid, sha, roots, state, started_at, finished_at, detail";

fn apply_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ApplyRecord> {
    Ok(ApplyRecord {
        id: ApplyId(r.get(0)?),
        ci_job: JobId(r.get::<_, i64>(1)? as u64),
        project: ProjectId(r.get::<_, i64>(2)? as u64),
        mr: r.get::<_, Option<i64>>(3)?.map(|m| MrIid(m as u64)),
        sha: CommitSha(r.get(4)?),
        roots: serde_json::from_str(&r.get::<_, String>(5)?).unwrap_or_default(),
        state: ApplyState::parse(&r.get::<_, String>(6)?),
        started_at: r.get(7)?,
        finished_at: r.get(8)?,
        detail: r.get(9)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::events::PlanReason;

    fn plan(mr: u64, head: char) -> Job {
        Job::Plan(PlanJob {
            project: ProjectId(1),
            project_path: Some("infra/homelab".into()),
            mr: MrIid(mr),
            head: CommitSha(head.to_string().repeat(40)),
            target_branch: Some("main".into()),
            source_project: Some(ProjectId(1)),
            fork: false,
            draft: false,
            reason: PlanReason::Opened,
            requested_by: None,
        })
    }

    fn delivery(key: &str) -> NewDelivery {
        NewDelivery {
            key: key.into(),
            event: "merge_request".into(),
            outcome: "enqueued".into(),
            project: Some(ProjectId(1)),
            mr: Some(MrIid(1)),
        }
    }

    #[tokio::test]
    async fn duplicate_deliveries_enqueue_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("planbot.db")).unwrap();
        let a = store
            .record_delivery(delivery("k1"), vec![plan(1, 'a')])
            .await
            .unwrap();
        assert!(!a.duplicate);
        assert_eq!(a.enqueued.len(), 1);
        let b = store
            .record_delivery(delivery("k1"), vec![plan(1, 'a')])
            .await
            .unwrap();
        assert!(b.duplicate);
        assert_eq!(store.queue_depth().await.unwrap(), 1);
        assert_eq!(store.delivery_count().await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_newer_head_supersedes_queued_and_running_plans_of_the_mr_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("planbot.db")).unwrap();
        let first = store.enqueue(plan(1, 'a')).await.unwrap().id.unwrap();
        let other_mr = store.enqueue(plan(2, 'b')).await.unwrap().id.unwrap();
        let claimed = store.claim_next().await.unwrap().unwrap();
        assert_eq!(claimed.id, first);
        let queued_old = store.enqueue(plan(1, 'c')).await.unwrap();
        // The running plan of head a is superseded (its token must fire).
        assert_eq!(queued_old.cancel_running, vec![first]);
        let newest = store.enqueue(plan(1, 'd')).await.unwrap();
        assert!(newest.cancel_running.is_empty());
        assert_eq!(
            store
                .job(queued_old.id.unwrap())
                .await
                .unwrap()
                .unwrap()
                .state,
            "canceled"
        );
        assert_eq!(store.job(first).await.unwrap().unwrap().state, "canceled");
        assert_eq!(store.job(other_mr).await.unwrap().unwrap().state, "queued");
        // A canceled job that finishes later stays canceled.
        store.finish_job(first, JobEnd::Done).await.unwrap();
        assert_eq!(store.job(first).await.unwrap().unwrap().state, "canceled");
        // An identical queued job is not added twice.
        assert_eq!(store.enqueue(plan(1, 'd')).await.unwrap().id, None);
    }

    #[tokio::test]
    async fn running_jobs_are_requeued_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("planbot.db");
        {
            let store = Store::open(&path).unwrap();
            store.enqueue(plan(1, 'a')).await.unwrap();
            let c = store.claim_next().await.unwrap().unwrap();
            let run = store
                .start_run(NewRun {
                    job: Some(c.id),
                    kind: RunKind::Plan,
                    project: ProjectId(1),
                    project_path: None,
                    mr: Some(MrIid(1)),
                    root: "core".into(),
                    sha: CommitSha("a".repeat(40)),
                })
                .await
                .unwrap();
            assert_eq!(
                store.run(run).await.unwrap().unwrap().state,
                RunState::Running
            );
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.requeue_interrupted().await.unwrap(), 1);
        let again = store.claim_next().await.unwrap().unwrap();
        assert_eq!(again.attempts, 2);
        assert_eq!(
            store.recent_runs(10).await.unwrap()[0].state,
            RunState::Interrupted
        );
    }

    #[tokio::test]
    async fn fingerprints_note_ids_and_applies() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("planbot.db")).unwrap();
        let fp = |c: char| Fingerprint::from_hex(&c.to_string().repeat(64)).unwrap();
        for (sha, f) in [('1', 'a'), ('2', 'b')] {
            store
                .record_fingerprint(ShownFingerprint {
                    project: ProjectId(1),
                    mr: MrIid(3),
                    root: "core".into(),
                    sha: CommitSha(sha.to_string().repeat(40)),
                    fingerprint: fp(f),
                    run: None,
                })
                .await
                .unwrap();
        }
        let last = store
            .last_shown_fingerprint(ProjectId(1), MrIid(3), "core")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(last.fingerprint, fp('b'));
        assert!(store
            .last_shown_fingerprint(ProjectId(1), MrIid(3), "edge")
            .await
            .unwrap()
            .is_none());
        let exact = store
            .fingerprint_for(ProjectId(1), MrIid(3), "core", CommitSha("1".repeat(40)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(exact.fingerprint, fp('a'));

        assert_eq!(store.mr_note(ProjectId(1), MrIid(3)).await.unwrap(), None);
        store
            .set_mr_note(ProjectId(1), MrIid(3), NoteId(77))
            .await
            .unwrap();
        assert_eq!(
            store.mr_note(ProjectId(1), MrIid(3)).await.unwrap(),
            Some(NoteId(77))
        );

        let a = NewApply {
            ci_job: JobId(9),
            project: ProjectId(1),
            mr: Some(MrIid(3)),
            sha: CommitSha("2".repeat(40)),
            roots: vec!["core".into()],
        };
        let id = store.begin_apply(a.clone()).await.unwrap().unwrap();
        assert_eq!(
            store.begin_apply(a).await.unwrap(),
            None,
            "one CI job applies once"
        );
        let interrupted = store.mark_interrupted_applies().await.unwrap();
        assert_eq!(interrupted.len(), 1);
        assert_eq!(interrupted[0].id, id);
        assert_eq!(interrupted[0].state, ApplyState::Interrupted);
        assert_eq!(
            store.apply_for_job(JobId(9)).await.unwrap().unwrap().roots,
            vec!["core"]
        );
    }

    /// Writes `tests/fixtures/store/v0.db`: a database made by this (pre-migration) schema,
    /// for the test that opens an old database with newer code. Run by hand:
    /// `PLANBOT_STORE_FIXTURE=/tmp/v0.db cargo test --lib make_store_fixture -- --ignored`.
    #[tokio::test]
    #[ignore]
    async fn make_store_fixture() {
        use crate::core::events::Command;
        use crate::core::ids::UserId;
        let path = PathBuf::from(std::env::var("PLANBOT_STORE_FIXTURE").unwrap());
        let _ = std::fs::remove_file(&path);
        {
            let store = Store::open(&path).unwrap();
            let d1 = store
                .record_delivery(delivery("fixture-delivery-1"), vec![plan(1, 'a')])
                .await
                .unwrap();
            let mut ignored = delivery("fixture-delivery-2");
            ignored.outcome = "ignored: draft".into();
            ignored.mr = Some(MrIid(4));
            store.record_delivery(ignored, vec![]).await.unwrap();
            // Job 1 (plan, mr 1): done, with a finished run.
            let claimed = store.claim_next().await.unwrap().unwrap();
            assert_eq!(claimed.id, d1.enqueued[0]);
            let run = store
                .start_run(NewRun {
                    job: Some(claimed.id),
                    kind: RunKind::Plan,
                    project: ProjectId(1),
                    project_path: Some("infra/homelab".into()),
                    mr: Some(MrIid(1)),
                    root: "core".into(),
                    sha: CommitSha("a".repeat(40)),
                })
                .await
                .unwrap();
            let fp = Fingerprint::from_hex(&"f".repeat(64)).unwrap();
            store
                .finish_run(
                    run,
                    RunEnd {
                        state: RunState::Succeeded,
                        summary: Some("1 to add, 0 to change, 0 to destroy".into()),
                        log: "Plan: 1 to add, 0 to change, 0 to destroy.\n".into(),
                        note_markdown: Some("### core\n\n1 to add".into()),
                        fingerprint: Some(fp.clone()),
                    },
                )
                .await
                .unwrap();
            store
                .record_fingerprint(ShownFingerprint {
                    project: ProjectId(1),
                    mr: MrIid(1),
                    root: "core".into(),
                    sha: CommitSha("a".repeat(40)),
                    fingerprint: fp,
                    run: Some(run),
                })
                .await
                .unwrap();
            let mut digest = PlanDigest::default();
            digest.outputs.insert("greeting".into(), "\"hello\"".into());
            store
                .record_digest(
                    ProjectId(1),
                    MrIid(1),
                    "core",
                    &CommitSha("a".repeat(40)),
                    &digest,
                )
                .await
                .unwrap();
            store
                .set_mr_note(ProjectId(1), MrIid(1), NoteId(501))
                .await
                .unwrap();
            store.finish_job(claimed.id, JobEnd::Done).await.unwrap();
            // Job 2 (command, mr 1): failed.
            let cmd = store
                .enqueue(Job::Command {
                    project: ProjectId(1),
                    project_path: Some("infra/homelab".into()),
                    mr: MrIid(1),
                    note: Some(NoteId(600)),
                    author: UserId(7),
                    command: Command::Plan,
                    head: Some(CommitSha("a".repeat(40))),
                    fork: false,
                })
                .await
                .unwrap()
                .id
                .unwrap();
            let c = store.claim_next().await.unwrap().unwrap();
            assert_eq!(c.id, cmd);
            store
                .finish_job(cmd, JobEnd::Failed("gitlab said 502".into()))
                .await
                .unwrap();
            // Job 3 (plan, mr 3): canceled when the MR closed.
            store.enqueue(plan(3, 'c')).await.unwrap();
            store
                .cancel_mr(ProjectId(1), MrIid(3), "the merge request was closed")
                .await
                .unwrap();
            // Job 4 (plan, mr 2): left running, with a running apply run.
            store.enqueue(plan(2, 'b')).await.unwrap();
            let running = store.claim_next().await.unwrap().unwrap();
            store
                .start_run(NewRun {
                    job: Some(running.id),
                    kind: RunKind::Apply,
                    project: ProjectId(1),
                    project_path: None,
                    mr: Some(MrIid(2)),
                    root: "edge".into(),
                    sha: CommitSha("b".repeat(40)),
                })
                .await
                .unwrap();
            // Job 5 (reconcile): queued.
            store.enqueue(Job::Reconcile).await.unwrap();
            // Applies: one succeeded, one left running.
            let a = store
                .begin_apply(NewApply {
                    ci_job: JobId(9001),
                    project: ProjectId(1),
                    mr: Some(MrIid(1)),
                    sha: CommitSha("a".repeat(40)),
                    roots: vec!["core".into()],
                })
                .await
                .unwrap()
                .unwrap();
            store
                .finish_apply(a, ApplyState::Succeeded, Some("applied core".into()))
                .await
                .unwrap();
            store
                .begin_apply(NewApply {
                    ci_job: JobId(9002),
                    project: ProjectId(1),
                    mr: Some(MrIid(2)),
                    sha: CommitSha("b".repeat(40)),
                    roots: vec!["edge".into(), "core".into()],
                })
                .await
                .unwrap()
                .unwrap();
        }
        // Let the store's threads close their connections, then fold the WAL into the file.
        std::thread::sleep(std::time::Duration::from_secs(2));
        let conn = Connection::open(&path).unwrap();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
    }
}
