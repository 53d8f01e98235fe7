//! TLS to the test PostgreSQL (it offers `ssl` with a certificate for `localhost` only, signed
//! by the CA `PLANBOT_TEST_POSTGRES_CA` names, or the throwaway server's own): which `sslmode`
//! connects, whether the session really is encrypted, and what a refused certificate says.
//!
//! Without that CA these tests fail like the other PostgreSQL tests (always under `CI=true`).

use super::backends::{postgres_db, SKIP_VAR, TEST_LEASE};
use crate::capabilities::store::{Db, PgOptions, Store};
use crate::core::config::StoreUrl;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The variable naming the test server's CA (a PEM file).
const CA_VAR: &str = "PLANBOT_TEST_POSTGRES_CA";

/// The test server's CA; `None` only when the PostgreSQL tests are skipped.
fn server_ca() -> Option<PathBuf> {
    match std::env::var(CA_VAR) {
        Ok(p) if !p.is_empty() => Some(PathBuf::from(p)),
        // The throwaway server's own CA, when no server is named.
        _ if std::env::var(super::backends::URL_VAR).map_or(true, |u| u.is_empty()) => {
            super::backends::throwaway::throwaway()
                .ok()
                .map(|t| t.ca.clone())
        }
        _ => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            let skip = std::env::var(SKIP_VAR).is_ok_and(|v| v == "1");
            if skip && !ci {
                eprintln!("PostgreSQL TLS tests NOT RUN: {SKIP_VAR}=1 and no {CA_VAR}");
                return None;
            }
            panic!(
                "{CA_VAR} is not set, so the PostgreSQL TLS tests cannot run against the server \
                 PLANBOT_TEST_POSTGRES_URL names: set it to the PEM of the CA that signed that \
                 server's certificate for `localhost` (or unset the URL: the tests then start a \
                 server of their own)"
            )
        }
    }
}

/// A fresh database on the test server and its CA; its URL's host and query are set per test.
async fn server() -> Option<(url::Url, PathBuf)> {
    let db = postgres_db().await?;
    let ca = server_ca()?;
    let StoreUrl::Postgres(u) = &db.url else {
        unreachable!()
    };
    Some((url::Url::parse(u).unwrap(), ca))
}

/// `base` with host `host` and query `query` (e.g. `sslmode=verify-full`).
fn at(base: &url::Url, host: &str, query: &str) -> StoreUrl {
    let mut u = base.clone();
    u.set_host(Some(host)).unwrap();
    u.set_query((!query.is_empty()).then_some(query));
    StoreUrl::Postgres(u.to_string())
}

async fn connect(url: &StoreUrl, ca_file: Option<&Path>) -> anyhow::Result<Store> {
    Store::connect_tls(
        url,
        None,
        ca_file,
        PgOptions {
            lease: TEST_LEASE,
            replica: "tls".into(),
            pool_size: 2,
        },
    )
    .await
}

/// Whether the store's session with the server is encrypted, as the server sees it.
async fn session_is_tls(store: &Store) -> bool {
    match &store.db {
        Db::Postgres(pg) => pg.session_is_tls().await.unwrap(),
        Db::Sqlite(_) => unreachable!(),
    }
}

fn refusal(r: anyhow::Result<Store>) -> String {
    match r {
        Ok(_) => panic!("connected, but should have been refused"),
        Err(e) => format!("{e:#}"),
    }
}

/// A CA that signed nothing the server holds.
fn other_ca(dir: &Path) -> PathBuf {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "other.key",
            "-out",
            "other.pem",
            "-days",
            "2",
            "-subj",
            "/CN=Another CA",
        ])
        .output()
        .expect("the openssl CLI runs (apt-get install openssl)");
    assert!(out.status.success(), "{out:?}");
    dir.join("other.pem")
}

#[tokio::test]
async fn verify_full_with_the_servers_ca_connects_to_localhost_over_tls() {
    let Some((base, ca)) = server().await else {
        return;
    };
    let store = connect(&at(&base, "localhost", "sslmode=verify-full"), Some(&ca))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(session_is_tls(&store).await, "the session is not encrypted");
    store.delivery_count().await.unwrap();
    drop(store);

    // The CA named by the URL's sslrootcert instead of store.ca_file.
    let query = format!("sslmode=verify-full&sslrootcert={}", ca.display());
    let store = connect(&at(&base, "localhost", &query), None)
        .await
        .unwrap();
    assert!(session_is_tls(&store).await);
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused_and_the_error_says_so() {
    let Some((base, _)) = server().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let other = other_ca(dir.path());
    for mode in ["verify-full", "verify-ca", "require"] {
        let e = refusal(
            connect(
                &at(&base, "localhost", &format!("sslmode={mode}")),
                Some(&other),
            )
            .await,
        );
        assert!(
            e.contains(&format!(
                "the PostgreSQL server's certificate is not trusted by store.ca_file {}",
                other.display()
            )),
            "{mode}: {e}"
        );
    }
    // Without a CA: the public web roots, which did not sign it either.
    let e = refusal(connect(&at(&base, "localhost", "sslmode=verify-full"), None).await);
    assert!(
        e.contains("not trusted by the public web roots (set store.ca_file"),
        "{e}"
    );
}

#[tokio::test]
async fn verify_full_checks_the_host_name_and_verify_ca_does_not() {
    let Some((base, ca)) = server().await else {
        return;
    };
    // The certificate names `localhost`, not 127.0.0.1.
    let e = refusal(connect(&at(&base, "127.0.0.1", "sslmode=verify-full"), Some(&ca)).await);
    assert!(
        e.contains("the PostgreSQL server's certificate is not valid for the host"),
        "{e}"
    );
    for mode in ["verify-ca", "require"] {
        let store = connect(
            &at(&base, "127.0.0.1", &format!("sslmode={mode}")),
            Some(&ca),
        )
        .await
        .unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        assert!(session_is_tls(&store).await, "{mode}");
    }
}

#[tokio::test]
async fn sslmode_disable_connects_in_plaintext() {
    let Some((base, ca)) = server().await else {
        return;
    };
    // `localhost` and 127.0.0.1 without sslmode: loopback, plaintext by default.
    for (host, query) in [
        ("localhost", "sslmode=disable"),
        ("127.0.0.1", "sslmode=disable"),
        ("localhost", ""),
        ("127.0.0.1", ""),
    ] {
        let store = connect(&at(&base, host, query), Some(&ca)).await.unwrap();
        assert!(!session_is_tls(&store).await, "{host} {query}");
    }
}

#[tokio::test]
async fn a_server_without_tls_is_refused_never_used_in_plaintext() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Answers the SSLRequest with `N` (no TLS), as a server with `ssl = off` does.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 8];
        socket.read_exact(&mut request).await.unwrap();
        assert_eq!(request, [0, 0, 0, 8, 4, 210, 22, 47], "an SSLRequest first");
        socket.write_all(b"N").await.unwrap();
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest).await;
        rest
    });
    let url = StoreUrl::Postgres(format!(
        "postgres://planbot@127.0.0.1:{port}/planbot?sslmode=verify-ca"
    ));
    let e = refusal(connect(&url, None).await);
    assert!(
        e.contains("the PostgreSQL server does not offer TLS, and sslmode=verify-ca requires it"),
        "{e}"
    );
    assert!(
        server.await.unwrap().is_empty(),
        "nothing is sent in plaintext after the refusal"
    );
}
