//! SQLite (the default, embedded: one file in `data_dir`): one writer thread with group commit
//! (`writer`), a reader connection, the connections' settings (`connection`), and [`Lite`], a
//! connection as the store's queries run on it.

mod connection;
mod writer;

use super::drift;
use super::migrations::{self, Kind, SCHEMA_VERSION};
use super::sql::{self, Arg, Conn, Row, Value};
use super::types::StoreProbe;
use anyhow::{anyhow, bail, Context, Result};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

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
        let c = &Lite(&conn);
        probe.last_drift_tick = sql::now(drift::last_tick(c))?;
        probe.drift_roots = sql::now(drift::roots(c))?;
    }
    Ok(probe)
}

/// All writes go through ONE writer thread that batches whatever is waiting into a single
/// transaction (group commit, see `writer`); callers get their answer only after the COMMIT.
/// Reads use a separate connection on the blocking pool (WAL readers do not wait for the
/// writer).
pub(crate) struct SqliteDb {
    path: PathBuf,
    writer: Mutex<mpsc::Sender<writer::Op>>,
    reader: Arc<Mutex<Connection>>,
    /// Dropped with the store: tells the checkpointer thread to stop.
    _checkpointer: Mutex<mpsc::Sender<()>>,
}

impl SqliteDb {
    /// Open (or create) the store file, bring its schema up to date (refusing one written by a
    /// newer planbot), and start its writer thread.
    pub(crate) fn open(path: &Path) -> Result<SqliteDb> {
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
        Ok(SqliteDb {
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
    pub(super) async fn read<R, F>(&self, f: F) -> Result<R>
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

/// A SQLite connection as the store's queries use it. Its statements run at once: the futures
/// of its methods never wait ([`sql::now`] runs them).
pub(super) struct Lite<'a>(pub(super) &'a Connection);

impl rusqlite::ToSql for Arg {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        match self {
            Arg::Int(n) => n.to_sql(),
            Arg::Text(t) => t.to_sql(),
        }
    }
}

/// `args`' first ones, as many as the statement has: a SQLite text may leave out the last
/// parameters, those only PostgreSQL's text uses (this replica's name, its lease).
fn bind<'a>(st: &rusqlite::Statement<'_>, args: &'a [Arg]) -> Result<&'a [Arg]> {
    let n = st.parameter_count();
    if args.len() < n {
        bail!("{n} parameters wanted, {} given", args.len());
    }
    Ok(&args[..n])
}

impl Conn for Lite<'_> {
    fn kind(&self) -> Kind {
        Kind::Sqlite
    }

    fn owner(&self) -> Option<(&str, i64)> {
        None
    }

    /// Every statement is kept prepared (the cache is bounded: `connection`).
    async fn query_text(&self, text: &str, args: &[Arg], _cache: bool) -> Result<Vec<Row>> {
        let mut st = self.0.prepare_cached(text)?;
        let args = bind(&st, args)?;
        let width = st.column_count();
        let mut rows = st.query(rusqlite::params_from_iter(args))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let values = (0..width)
                .map(|i| {
                    Ok(match r.get_ref(i)? {
                        ValueRef::Null => Value::Null,
                        ValueRef::Integer(n) => Value::Int(n),
                        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                        other => bail!(
                            "column {i} holds {:?}, not an integer or a text",
                            other.data_type()
                        ),
                    })
                })
                .collect::<Result<_>>()?;
            out.push(Row(values));
        }
        Ok(out)
    }

    async fn execute_text(&self, text: &str, args: &[Arg], _cache: bool) -> Result<u64> {
        let mut st = self.0.prepare_cached(text)?;
        let args = bind(&st, args)?;
        Ok(st.execute(rusqlite::params_from_iter(args))? as u64)
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
        let sqlite = Arc::new(SqliteDb::open(&dir.path().join("planbot.db")).unwrap());
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
            c.execute(
                "INSERT INTO deliveries (key, event, outcome, received_at)
                 VALUES ('b', 'merge_request', 'enqueued', 1)",
                [],
            )?;
            c.execute(
                "INSERT INTO jobs (kind, project_id, mr_iid, payload, state, created_at)
                 VALUES ('plan', 1, 2, '{}', 'queued', 1)",
                [],
            )?;
            bail!("refused after writing")
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
