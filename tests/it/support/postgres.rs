//! The PostgreSQL server the tests use — the one `PLANBOT_TEST_POSTGRES_URL` names, else a
//! throwaway one this process starts ([`super::throwaway_postgres`]): one fresh database per
//! test, and a client to read what the replicas wrote.

/// A new, empty database on the test server, as a URL; `None` only when skipping is allowed
/// and asked for (`PLANBOT_SKIP_POSTGRES_TESTS=1`, never under `CI=true`). Panics otherwise,
/// saying what to install: a test that needs PostgreSQL never passes without one.
pub async fn fresh_database(prefix: &str) -> Option<String> {
    let server = match std::env::var("PLANBOT_TEST_POSTGRES_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            if !ci && std::env::var("PLANBOT_SKIP_POSTGRES_TESTS").is_ok_and(|v| v == "1") {
                eprintln!("{prefix} test NOT RUN: PLANBOT_SKIP_POSTGRES_TESTS=1");
                return None;
            }
            match super::throwaway_postgres::throwaway() {
                Ok(t) => t.url.clone(),
                Err(e) => panic!("{e}"),
            }
        }
    };
    let name = format!("{prefix}_{:016x}", rand::random::<u64>());
    let client = connect(&server).await;
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let mut url = url::Url::parse(&server).unwrap();
    url.set_path(&format!("/{name}"));
    Some(url.to_string())
}

/// A plain client of `url` (its connection driven by a spawned task).
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to the test PostgreSQL: {e}"));
    tokio::spawn(conn);
    client
}
