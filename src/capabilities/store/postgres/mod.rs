//! PostgreSQL, for N replicas on one database: a connection pool (over TLS as `tls` decides),
//! this replica's heartbeat, and [`PgConn`], a connection as the store's queries run on it.
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

mod notices;
mod tls;

use super::drift;
use super::migrations::{self, Kind, PG_SCHEMA_VERSION};
use super::now_ms;
use super::sql::{Arg, Conn, Row, Value};
use super::types::{SchemaError, StoreProbe};
use crate::core::store_tls::{self, SslMode, StoreTls};
use anyhow::{anyhow, bail, Context, Result};
use bytes::BytesMut;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use tokio_postgres::NoTls;
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

pub(crate) struct PgDb {
    pool: Pool,
    opts: PgOptions,
    /// The schema version a heartbeat found when it is newer than [`PG_SCHEMA_VERSION`] (a
    /// newer planbot migrated the database while this one runs), else 0.
    newer_schema: Arc<AtomicU32>,
    /// Counts the notices of jobs enqueued on any replica ([`notices`]).
    notices: Option<tokio::sync::watch::Receiver<u64>>,
    /// Stops the replica heartbeat (and the listening) when the store is dropped.
    _heartbeat: DropGuard,
}

impl PgDb {
    /// Connect (over TLS as the URL's `sslmode` and `ca_file` say), migrate (refusing a newer
    /// schema), register this replica and start its heartbeat.
    pub(crate) async fn connect(
        url: &str,
        password: Option<&str>,
        ca_file: Option<&Path>,
        opts: PgOptions,
    ) -> Result<PgDb> {
        let pool = pool(url, password, ca_file, opts.pool_size)?;
        {
            let mut client = pool.first_client().await?;
            migrations::migrate_postgres(&mut client)
                .await
                .context("migrating the PostgreSQL store")?;
        }
        let stop = CancellationToken::new();
        let notices = notices::spawn(pool.listener, stop.clone());
        let pool = pool.pool;
        let newer_schema = Arc::new(AtomicU32::new(0));
        let store = PgDb {
            pool: pool.clone(),
            opts: opts.clone(),
            newer_schema: newer_schema.clone(),
            notices: Some(notices),
            _heartbeat: stop.clone().drop_guard(),
        };
        store.beat().await.context("registering this replica")?;
        let lease = opts.lease;
        let beat = PgDb {
            pool,
            opts,
            newer_schema,
            notices: None,
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

    /// Hears of every job enqueued on any replica (its value counts them).
    pub(crate) fn job_notices(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.notices.clone()
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

    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool
            .get()
            .await
            .map_err(|e| anyhow!("PostgreSQL connection: {e}"))
    }

    fn lease_ms(&self) -> i64 {
        self.opts.lease.as_millis() as i64
    }

    /// How long a job stays this replica's without a heartbeat.
    pub(super) fn lease(&self) -> Duration {
        self.opts.lease
    }

    /// The pool, for what outlives a query (a project lock's release).
    pub(super) fn pool(&self) -> Pool {
        self.pool.clone()
    }

    /// A pooled connection as the store's queries use it, outside any transaction.
    pub(super) fn on<'a>(&'a self, client: &'a deadpool_postgres::Object) -> PgConn<'a> {
        PgConn {
            on: On::Client(client),
            owner: Some((&self.opts.replica, self.lease_ms())),
        }
    }

    /// A transaction as the store's queries use it.
    pub(super) fn in_tx<'a>(&'a self, tx: &'a deadpool_postgres::Transaction<'a>) -> PgConn<'a> {
        PgConn {
            on: On::Tx(tx),
            owner: Some((&self.opts.replica, self.lease_ms())),
        }
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
    pub(super) fn schema_current(&self) -> Result<(), SchemaError> {
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
    /// How a connection of the pool is made, for the one that listens for new jobs.
    listener: notices::Listener,
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
    let connector = tls::connector(&tls)?;
    let listener = notices::Listener {
        config: config.clone(),
        tls: connector.clone(),
    };
    let manager = match connector {
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
    Ok(TlsPool {
        pool,
        tls,
        listener,
    })
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
        let on = PgConn {
            on: On::Client(&c),
            owner: None,
        };
        (drift::last_tick(&on).await?, drift::roots(&on).await?)
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

/// Where a [`PgConn`]'s statements go.
enum On<'a> {
    Client(&'a deadpool_postgres::ClientWrapper),
    Tx(&'a deadpool_postgres::Transaction<'a>),
}

/// A PostgreSQL connection as the store's queries use it: each statement prepared once per
/// pooled connection (unless built at run time), its values read by their column's type.
pub(super) struct PgConn<'a> {
    on: On<'a>,
    /// This replica's name and lease; `None` for `planbot doctor`, which is no replica.
    owner: Option<(&'a str, i64)>,
}

impl ToSql for Arg {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Arg::Int(n) => n.to_sql_checked(ty, out),
            Arg::Text(t) => t.to_sql_checked(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty) || <String as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

/// Column `i` of `r`, by its type: the integers and texts the store keeps.
fn value(r: &tokio_postgres::Row, i: usize) -> Result<Value> {
    let ty = r.columns()[i].type_();
    let v = if *ty == Type::INT8 {
        r.try_get::<_, Option<i64>>(i)?.map(Value::Int)
    } else if *ty == Type::INT4 {
        r.try_get::<_, Option<i32>>(i)?
            .map(|n| Value::Int(n.into()))
    } else if <String as ToSql>::accepts(ty) {
        r.try_get::<_, Option<String>>(i)?.map(Value::Text)
    } else {
        bail!("column {i} is of type {ty}, not an integer or a text")
    };
    Ok(v.unwrap_or(Value::Null))
}

impl PgConn<'_> {
    async fn statement(&self, text: &str, cache: bool) -> Result<tokio_postgres::Statement> {
        Ok(match (&self.on, cache) {
            (On::Client(c), true) => c.prepare_cached(text).await?,
            (On::Client(c), false) => c.prepare(text).await?,
            (On::Tx(t), true) => t.prepare_cached(text).await?,
            (On::Tx(t), false) => t.prepare(text).await?,
        })
    }
}

fn params(args: &[Arg]) -> Vec<&(dyn ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn ToSql + Sync)).collect()
}

impl Conn for PgConn<'_> {
    fn kind(&self) -> Kind {
        Kind::Postgres
    }

    fn owner(&self) -> Option<(&str, i64)> {
        self.owner
    }

    async fn query_text(&self, text: &str, args: &[Arg], cache: bool) -> Result<Vec<Row>> {
        let st = self.statement(text, cache).await?;
        let rows = match &self.on {
            On::Client(c) => c.query(&st, &params(args)).await?,
            On::Tx(t) => t.query(&st, &params(args)).await?,
        };
        rows.iter()
            .map(|r| {
                Ok(Row((0..r.len())
                    .map(|i| value(r, i))
                    .collect::<Result<_>>()?))
            })
            .collect()
    }

    async fn execute_text(&self, text: &str, args: &[Arg], cache: bool) -> Result<u64> {
        let st = self.statement(text, cache).await?;
        Ok(match &self.on {
            On::Client(c) => c.execute(&st, &params(args)).await?,
            On::Tx(t) => t.execute(&st, &params(args)).await?,
        })
    }
}
