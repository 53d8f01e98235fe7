//! The store (docs/internals.md, "Durability"): the [`Store`] the flows hold, on SQLite (embedded,
//! one host) or PostgreSQL (N replicas). Each query is one `Store` method, in the file of the thing
//! it stores (queue, runs, reviews, applies, policy, targeting, drift, dump), that runs its
//! statement (`sql`: written once for both where they agree) on whichever database the store has.

mod applies;
mod drift;
mod dump;
mod kept_plans;
mod migrations;
mod policy;
mod postgres;
mod queue;
mod reviews;
mod root_units;
mod runs;
mod sql;
mod sqlite;
mod targeting;
mod types;

#[cfg(test)]
pub(crate) mod tests;

pub use applies::ProjectLock;
pub use dump::Dump;
pub use kept_plans::KeptPlanRow;
pub use migrations::{PG_SCHEMA_VERSION, SCHEMA_VERSION};
pub use postgres::{default_replica_name, PgOptions};
pub use root_units::UnitProgress;
pub use sql::Value;
pub use types::{
    ApplyId, ApplyRecord, ApplyState, ClaimedJob, DeliveryOutcome, DriftOutcome, DriftRootRecord,
    Enqueued, JobEnd, JobRow, Lease, NewApply, NewDelivery, NewRun, PolicyApproval,
    PolicyVerdictRecord, QueueJobId, QueueJobKind, QueueJobState, RunEnd, RunKind, RunQuery,
    RunRecord, RunState, SchemaError, ShownFingerprint, StoreProbe, UnknownValue, WidgetReports,
};

use crate::core::config::StoreUrl;
use anyhow::{Context, Result};
use sql::{Arg, Conn, Sql};
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The store: cheap to clone (clones share the database: SQLite's writer thread and reader, or
/// PostgreSQL's pool).
///
/// The store trusts its callers: every text handed to it (logs, notes, errors, details) must
/// already be scrubbed of secrets. It never sees raw webhook bodies.
#[derive(Clone)]
pub struct Store {
    db: Db,
}

#[derive(Clone)]
enum Db {
    Sqlite(Arc<sqlite::SqliteDb>),
    Postgres(Arc<postgres::PgDb>),
}

/// `read!(store, |c| body)`: `body`, an async block's, with `c` a [`Conn`] of the store's
/// database: SQLite's reader connection (on the blocking pool) or a pooled PostgreSQL one.
macro_rules! read {
    ($store:expr, |$c:ident| $body:expr) => {
        match &$store.db {
            $crate::capabilities::store::Db::Sqlite(db) => {
                db.read(move |conn| {
                    let $c = &$crate::capabilities::store::sqlite::Lite(conn);
                    $crate::capabilities::store::sql::now(async { $body })
                })
                .await
            }
            $crate::capabilities::store::Db::Postgres(db) => {
                let client = db.client().await?;
                let $c = &db.on(&client);
                $crate::capabilities::store::sql::typed(async { $body }).await
            }
        }
    };
}
pub(crate) use read;

/// `write!(store, |c| body)`: as [`read!`], in one transaction that commits when `body` returns
/// `Ok`: on SQLite in the writer thread's next batch (group commit), on PostgreSQL its own.
macro_rules! write {
    ($store:expr, |$c:ident| $body:expr) => {
        match &$store.db {
            $crate::capabilities::store::Db::Sqlite(db) => {
                db.write(move |conn| {
                    let $c = &$crate::capabilities::store::sqlite::Lite(conn);
                    $crate::capabilities::store::sql::now(async { $body })
                })
                .await
            }
            $crate::capabilities::store::Db::Postgres(db) => {
                let mut client = db.client().await?;
                let tx = client.transaction().await?;
                let out = {
                    let $c = &db.in_tx(&tx);
                    $crate::capabilities::store::sql::typed(async { $body }).await?
                };
                tx.commit().await?;
                Ok(out)
            }
        }
    };
}
pub(crate) use write;

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

impl Store {
    /// Open (or create) a SQLite store file, bring its schema up to date (refusing one written
    /// by a newer planbot: [`SchemaError::TooNew`]), and start its writer thread.
    pub fn open(path: &Path) -> Result<Store> {
        Ok(Store::from_sqlite(Arc::new(sqlite::SqliteDb::open(path)?)))
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
                let pg = postgres::PgDb::connect(u, password, ca_file, opts)
                    .await
                    .with_context(|| format!("opening the store {url}"))?;
                Ok(Store {
                    db: Db::Postgres(Arc::new(pg)),
                })
            }
        }
    }

    fn from_sqlite(s: Arc<sqlite::SqliteDb>) -> Store {
        Store { db: Db::Sqlite(s) }
    }

    /// The SQLite file, when the store is one.
    pub fn path(&self) -> Option<&Path> {
        match &self.db {
            Db::Sqlite(s) => Some(s.path()),
            Db::Postgres(_) => None,
        }
    }

    /// `sqlite` or `postgres` (for logs and metrics).
    pub fn kind(&self) -> &'static str {
        match &self.db {
            Db::Sqlite(_) => "sqlite",
            Db::Postgres(_) => "postgres",
        }
    }

    /// This replica's name in a PostgreSQL store.
    pub fn replica(&self) -> Option<&str> {
        match &self.db {
            Db::Sqlite(_) => None,
            Db::Postgres(p) => Some(p.replica()),
        }
    }

    /// A quick liveness query for `/readyz`: the database answers, and on SQLite the writer
    /// thread too; on PostgreSQL it fails once a newer planbot has migrated the database.
    pub async fn ping(&self) -> Result<()> {
        static ONE: Sql = Sql::both("SELECT 1");
        read!(self, |c| c.one(&ONE, &[]).await.map(drop))?;
        match &self.db {
            Db::Sqlite(db) => db.write(|_| Ok(())).await,
            Db::Postgres(db) => Ok(db.schema_current()?),
        }
    }

    /// The count `sql` reads (`SELECT COUNT(*) …`).
    async fn count(&self, sql: &'static Sql, args: Vec<Arg>) -> Result<u64> {
        read!(self, |c| Ok(c.one(sql, &args).await?.get::<i64>(0)? as u64))
    }

    /// Run one statement that writes, with `args`.
    async fn write_one(&self, sql: &'static Sql, args: Vec<Arg>) -> Result<()> {
        write!(self, |c| c.execute(sql, &args).await.map(drop))
    }
}
