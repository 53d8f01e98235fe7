//! The backends the store's tests run against: SQLite in a temp dir, and a fresh database on
//! the PostgreSQL server `PLANBOT_TEST_POSTGRES_URL` names, else on a throwaway server this test
//! process starts from the system's `initdb` and `postgres` ([`throwaway`]).
//!
//! Where neither can be had, the PostgreSQL tests fail saying what to install: always under
//! `CI=true`, and elsewhere unless `PLANBOT_SKIP_POSTGRES_TESTS=1` says to skip them (they then
//! say so on stderr).

/// The throwaway server, shared as a file with the integration tests and the benchmark.
#[path = "../../../../tests/it/support/throwaway_postgres.rs"]
pub(crate) mod throwaway;

use crate::capabilities::store::{PgOptions, Store};
use crate::core::config::StoreUrl;
use std::time::Duration;

/// The variable naming the PostgreSQL server for the tests (a superuser URL: tests create
/// one database each).
pub(crate) const URL_VAR: &str = "PLANBOT_TEST_POSTGRES_URL";
/// Set to `1` to skip the PostgreSQL tests where no server runs (never honoured under CI).
pub(crate) const SKIP_VAR: &str = "PLANBOT_SKIP_POSTGRES_TESTS";

/// The lease the PostgreSQL tests use: short, so "a replica died" takes a second.
pub(crate) const TEST_LEASE: Duration = Duration::from_millis(900);

/// One backend under test, empty.
pub(crate) struct TestDb {
    pub kind: &'static str,
    pub url: StoreUrl,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// Open the store (again: the same replica, as after a restart of one planbot).
    pub(crate) async fn open(&self) -> Store {
        self.replica("replica-a").await
    }

    /// Open the store as the replica `name` (two names: two replicas on one database).
    pub(crate) async fn replica(&self, name: &str) -> Store {
        eprintln!("store backend under test: {} ({name})", self.kind);
        Store::connect_with(
            &self.url,
            None,
            PgOptions {
                lease: TEST_LEASE,
                replica: name.to_string(),
                pool_size: 8,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("opening the {} store: {e:#}", self.kind))
    }
}

/// A fresh SQLite store file.
pub(crate) fn sqlite_db() -> TestDb {
    let dir = tempfile::tempdir().unwrap();
    TestDb {
        kind: "sqlite",
        url: StoreUrl::Sqlite(dir.path().join("planbot.db")),
        _dir: Some(dir),
    }
}

/// SQLite, and PostgreSQL unless explicitly skipped.
pub(crate) async fn test_dbs() -> Vec<TestDb> {
    let mut dbs = vec![sqlite_db()];
    dbs.extend(postgres_db().await);
    dbs
}

/// The test server's URL; `None` only when skipping is allowed and asked for. Panics otherwise.
pub(crate) fn server_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            let skip = std::env::var(SKIP_VAR).is_ok_and(|v| v == "1");
            if skip && !ci {
                eprintln!("PostgreSQL store tests NOT RUN: {SKIP_VAR}=1 and no {URL_VAR}");
                return None;
            }
            match throwaway::throwaway() {
                Ok(t) => Some(t.url.clone()),
                Err(e) => panic!(
                    "{e}{}",
                    if ci {
                        ""
                    } else {
                        "; or skip them with PLANBOT_SKIP_POSTGRES_TESTS=1"
                    }
                ),
            }
        }
    }
}

/// A new, empty database on the test server.
pub(crate) async fn postgres_db() -> Option<TestDb> {
    let server = server_url()?;
    let name = format!("planbot_test_{:016x}", rand::random::<u64>());
    let (client, conn) = tokio_postgres::connect(&server, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {URL_VAR}: {e}"));
    let task = tokio::spawn(conn);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap_or_else(|e| panic!("creating a test database: {e}"));
    drop(client);
    let _ = task.await;
    let mut url = url::Url::parse(&server).expect("the test URL is a URL");
    url.set_path(&format!("/{name}"));
    Some(TestDb {
        kind: "postgres",
        url: StoreUrl::Postgres(url.to_string()),
        _dir: None,
    })
}
