//! What a client that reaches planbot's port can hold of it, told on raw sockets against the real
//! service on loopback: bodies (checked from the headers first, capped, under a deadline),
//! connections (header timeout, keep-alive idle timeout, a limit that closes the longest idle),
//! `/readyz` (GitLab asked once per cache time) and `/metrics` (a bearer token or nothing).

use crate::support::service::*;
use planbot::core::config::Config;
use planbot::flows::service::server::Options;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MR: &str = "Merge Request Hook";
/// What a test waits at most for planbot to answer or close (a failure, never the normal path).
const PATIENCE: Duration = Duration::from_secs(15);

fn quiet() -> Options {
    Options {
        workers: false,
        reconcile: false,
    }
}

/// The test service's config with `[server]` settings.
fn with_server(dir: &std::path::Path, gitlab: &str, signing: bool, server: &str) -> Config {
    let config = test_config(dir, gitlab).lines("server", server);
    match signing {
        true => config.signing(),
        false => config,
    }
    .load()
}

async fn connect(s: &TestService) -> TcpStream {
    let addr = s.base.trim_start_matches("http://");
    TcpStream::connect(addr).await.expect("connect")
}

/// The status code of the response the server sends on `conn` (reading only its status line),
/// or panic if none comes within [`PATIENCE`].
async fn status_of(conn: &mut TcpStream) -> u16 {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while !got.ends_with(b"\r\n") {
            match conn.read(&mut byte).await {
                Ok(0) | Err(_) => break,
                Ok(_) => got.push(byte[0]),
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("planbot answered within the patience");
    let line = String::from_utf8_lossy(&got);
    line.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line, got {line:?}"))
}

/// Read until the server closes `conn` (EOF or reset), or panic after [`PATIENCE`].
async fn closed_by_server(conn: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .unwrap_or_else(|_| panic!("planbot never closed {what}"));
}

fn head(path: &str, headers: &[(&str, String)], length: Option<u64>) -> String {
    let mut h =
        format!("POST {path} HTTP/1.1\r\nHost: planbot.test\r\nContent-Type: application/json\r\n");
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    match length {
        Some(n) => h.push_str(&format!("Content-Length: {n}\r\n")),
        None => h.push_str("Transfer-Encoding: chunked\r\n"),
    }
    h.push_str("\r\n");
    h
}

const GIB: u64 = 1024 * 1024 * 1024;

#[tokio::test]
async fn a_wrong_token_is_refused_from_the_headers_before_any_body_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    // A wrong token announcing a 1 GiB body: 401 while the client has sent no byte of it.
    let mut conn = connect(&s).await;
    let headers = token_headers(MR, "stalled-1", "not-the-secret");
    conn.write_all(head("/webhooks/gitlab", &headers, Some(GIB)).as_bytes())
        .await
        .unwrap();
    assert_eq!(status_of(&mut conn).await, 401);
    // No token at all: the same.
    let mut conn = connect(&s).await;
    let mut headers = token_headers(MR, "stalled-2", "x");
    headers.retain(|(k, _)| *k != "X-Gitlab-Token");
    conn.write_all(head("/webhooks/gitlab", &headers, Some(GIB)).as_bytes())
        .await
        .unwrap();
    assert_eq!(status_of(&mut conn).await, 401);
    // The right token announcing more than 25 MiB: 413 at once, nothing read.
    let mut conn = connect(&s).await;
    let headers = token_headers(MR, "too-big", WEBHOOK_SECRET);
    conn.write_all(head("/webhooks/gitlab", &headers, Some(GIB)).as_bytes())
        .await
        .unwrap();
    assert_eq!(status_of(&mut conn).await, 413);
    assert_eq!(s.app.store.delivery_count().await.unwrap(), 0);
}

#[tokio::test]
async fn a_stale_or_shapeless_signature_is_refused_before_the_body_and_a_signed_body_has_a_deadline(
) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = with_server(dir.path(), &dead_url(), true, "body_timeout = \"1s\"");
    let s = TestService::start(cfg, quiet()).await;
    let body = fixture("webhooks/merge_request_open.json");
    // Signed six minutes ago: refused from the headers, the 1 GiB never read.
    let mut conn = connect(&s).await;
    let headers = signed_headers(MR, "msg-stale", &body, unix_now() - 360, &[]);
    conn.write_all(head("/webhooks/gitlab", &headers, Some(GIB)).as_bytes())
        .await
        .unwrap();
    assert_eq!(status_of(&mut conn).await, 401);
    // A signature header that is no HMAC-SHA256 at all: the same.
    let mut conn = connect(&s).await;
    let mut headers = signed_headers(MR, "msg-junk", &body, unix_now(), &[]);
    for (k, v) in headers.iter_mut() {
        if *k == "webhook-signature" {
            *v = "v1,bm9wZQ==".into();
        }
    }
    conn.write_all(head("/webhooks/gitlab", &headers, Some(GIB)).as_bytes())
        .await
        .unwrap();
    assert_eq!(status_of(&mut conn).await, 401);
    // Plausible headers (the signature can only be checked over the body): the body must come
    // whole within body_timeout; half of it, then nothing, gets 408 and the connection closed.
    let mut conn = connect(&s).await;
    let headers = signed_headers(MR, "msg-slow", &body, unix_now(), &[]);
    conn.write_all(head("/webhooks/gitlab", &headers, Some(body.len() as u64)).as_bytes())
        .await
        .unwrap();
    conn.write_all(&body.as_bytes()[..body.len() / 2])
        .await
        .unwrap();
    assert_eq!(status_of(&mut conn).await, 408);
    closed_by_server(&mut conn, "the connection of a body that came too slowly").await;
    assert_eq!(s.app.store.delivery_count().await.unwrap(), 0);
    // The same delivery sent whole is accepted.
    assert_eq!(s.deliver(&body, &headers).await, 200);
}

#[tokio::test]
async fn a_chunked_body_past_the_cap_is_cut_off_with_413() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    let conn = connect(&s).await;
    let (mut rd, mut wr) = conn.into_split();
    let headers = token_headers(MR, "chunked", WEBHOOK_SECRET);
    // 40 chunks of 1 MiB, no Content-Length: planbot stops reading past 25 MiB.
    let writer = tokio::spawn(async move {
        wr.write_all(head("/webhooks/gitlab", &headers, None).as_bytes())
            .await?;
        let chunk = vec![b' '; 1024 * 1024];
        for _ in 0..40 {
            wr.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await?;
            wr.write_all(&chunk).await?;
            wr.write_all(b"\r\n").await?;
        }
        wr.write_all(b"0\r\n\r\n").await
    });
    let mut first = [0u8; 12];
    tokio::time::timeout(PATIENCE, rd.read_exact(&mut first))
        .await
        .expect("an answer")
        .expect("a status line");
    assert_eq!(&first, b"HTTP/1.1 413");
    drop(rd);
    let _ = writer.await;
    assert_eq!(s.app.store.delivery_count().await.unwrap(), 0);
}

#[tokio::test]
async fn the_apply_endpoint_caps_and_times_its_body() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = with_server(dir.path(), &dead_url(), false, "body_timeout = \"1s\"");
    let s = TestService::start(cfg, quiet()).await;
    let token = [("JOB-TOKEN", "glcbt-any".to_string())];
    // A body announced over the apply's 64 KiB: 413 before a byte of it.
    let mut conn = connect(&s).await;
    conn.write_all(head("/api/v1/apply", &token, Some(GIB)).as_bytes())
        .await
        .unwrap();
    assert_eq!(status_of(&mut conn).await, 413);
    // A small body that never comes: 408 after body_timeout.
    let mut conn = connect(&s).await;
    conn.write_all(head("/api/v1/apply", &token, Some(100)).as_bytes())
        .await
        .unwrap();
    conn.write_all(b"{\"confirm\":").await.unwrap();
    assert_eq!(status_of(&mut conn).await, 408);
}

#[tokio::test]
async fn the_widgets_endpoint_caps_and_times_its_body() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = with_server(dir.path(), &dead_url(), false, "body_timeout = \"1s\"");
    let s = TestService::start(cfg, quiet()).await;
    let token = [("JOB-TOKEN", "glcbt-any".to_string())];
    for path in ["/api/v1/widgets/terraform", "/api/v1/widgets/codequality"] {
        // A body announced over the widgets' 1 KiB: 413 before a byte of it.
        let mut conn = connect(&s).await;
        conn.write_all(head(path, &token, Some(2048)).as_bytes())
            .await
            .unwrap();
        assert_eq!(status_of(&mut conn).await, 413, "{path}");
        // A small body that never comes: 408 after body_timeout.
        let mut conn = connect(&s).await;
        conn.write_all(head(path, &token, Some(2)).as_bytes())
            .await
            .unwrap();
        conn.write_all(b"{").await.unwrap();
        assert_eq!(status_of(&mut conn).await, 408, "{path}");
    }
}

#[tokio::test]
async fn a_connection_that_never_finishes_its_headers_is_closed_while_healthz_answers() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = with_server(dir.path(), &dead_url(), false, "header_timeout = \"1s\"");
    let s = TestService::start(cfg, quiet()).await;
    // Slowloris: a request line and one header, then nothing.
    let mut slow = connect(&s).await;
    slow.write_all(b"POST /webhooks/gitlab HTTP/1.1\r\nHost: planbot.test\r\n")
        .await
        .unwrap();
    // A silent connection: not one byte.
    let mut silent = connect(&s).await;
    assert_eq!(s.get_text("/healthz").await.0, 200);
    closed_by_server(&mut slow, "a connection whose headers never ended").await;
    closed_by_server(&mut silent, "a connection that never sent a byte").await;
    // An idle keep-alive connection after a full request is closed the same way.
    let mut kept = connect(&s).await;
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: planbot.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(status_of(&mut kept).await, 200);
    closed_by_server(&mut kept, "an idle keep-alive connection").await;
    assert_eq!(s.get_text("/healthz").await.0, 200);
}

#[tokio::test]
async fn a_request_head_over_64_kib_is_refused_with_431() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    let mut conn = connect(&s).await;
    let padding = "a".repeat(100 * 1024);
    conn.write_all(
        format!("GET /healthz HTTP/1.1\r\nHost: planbot.test\r\nX-Pad: {padding}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status_of(&mut conn).await, 431);
    // A head of ordinary size is answered.
    assert_eq!(s.get_text("/healthz").await.0, 200);
}

#[tokio::test]
async fn idle_connections_beyond_the_limit_are_closed_and_a_webhook_still_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    // A header timeout far beyond the test: only the limit can close these connections.
    let cfg = with_server(
        dir.path(),
        &dead_url(),
        false,
        "header_timeout = \"10m\"\nmax_connections = 8",
    );
    let s = TestService::start(cfg, quiet()).await;
    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..40 {
        let mut c = connect(&s).await;
        c.write_all(b"POST /webhooks/gitlab HTTP/1.1\r\nHost: planbot.test\r\n")
            .await
            .unwrap();
        let tx = closed_tx.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            loop {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            let _ = tx.send(i);
        });
    }
    // At most 8 stay open: the 32 idle the longest are closed by the newer ones.
    let mut closed = Vec::new();
    while closed.len() < 32 {
        let i = tokio::time::timeout(PATIENCE, closed_rx.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of 40 idle connections were closed", closed.len()))
            .unwrap();
        closed.push(i);
    }
    assert!(closed.iter().all(|i| *i < 40));
    // A real webhook and /healthz get in (each closing another idle connection).
    let body = fixture("webhooks/merge_request_open.json");
    assert_eq!(
        s.deliver(&body, &token_headers(MR, "after-flood", WEBHOOK_SECRET))
            .await,
        200
    );
    assert_eq!(s.get_text("/healthz").await.0, 200);
    assert_eq!(s.app.store.delivery_count().await.unwrap(), 1);
}

#[tokio::test]
async fn many_readyz_calls_ask_gitlab_once_within_the_cache_time() {
    let gitlab = MiniGitLab::start(vec![], false).await;
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &gitlab.url, false), quiet()).await;
    let user_calls = || {
        gitlab
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.starts_with("/api/v4/user"))
            .count()
    };
    let before = user_calls();
    // 50 at once (they share the one call in flight), then 50 one after the other.
    let at_once = (0..50).map(|_| s.get_text("/readyz"));
    for (status, body) in futures::future::join_all(at_once).await {
        assert_eq!(
            (status.as_u16(), body.as_str()),
            (200, "store: ok\ngitlab: ok\n")
        );
    }
    for _ in 0..50 {
        assert_eq!(s.get_text("/readyz").await.0, 200);
    }
    assert_eq!(user_calls() - before, 1, "GET /user calls for 100 probes");
}

#[tokio::test]
async fn metrics_are_off_without_a_token_and_refused_without_the_right_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_config(dir.path(), &dead_url())
        .projects(&["infra/homelab"])
        .unset("metrics", "token")
        .load();
    assert!(cfg.metrics.token.is_none());
    let s = TestService::start(cfg, quiet()).await;
    let (status, body) = s.get_text("/metrics").await;
    assert_eq!(status, 404);
    assert!(!body.contains("planbot_"), "{body}");
    assert!(body.contains("[metrics] token_file"), "{body}");
    // `serve --check` says how to turn it on.
    let report = planbot::flows::cli::serve::check_report(&s.app.config);
    assert!(
        report.contains("/metrics is off (404): set [metrics] token_file"),
        "{report}"
    );
    s.kill().await;

    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    assert_eq!(s.get_text("/metrics").await.0, 401);
    let wrong = s
        .http
        .get(s.url("/metrics"))
        .bearer_auth("metrics-token-for-tests-012345678X")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert!(s.metrics().await.contains("# EOF"));
}

#[tokio::test]
async fn a_planbot_with_few_open_files_keeps_accepting_under_a_flood_of_idle_connections() {
    // The attack on a real `planbot serve` process: 500 idle connections against a
    // process allowed 400 open files (the unit's old default was 1,024 against 1,100).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("planbot.toml");
    std::fs::write(
        &file,
        test_config(&dir.path().join("data"), &dead_url())
            .projects(&["flightjs/flight-management"])
            .set("server", "header_timeout", "\"10m\"")
            .text(),
    )
    .unwrap();
    let mut cmd = std::process::Command::new("prlimit");
    cmd.args(["--nofile=400:400", "--"])
        .arg(env!("CARGO_BIN_EXE_planbot"))
        .args(["serve", "--config"])
        .arg(&file);
    let serve = crate::support::ServeProcess::spawn(cmd);
    let addr = format!("127.0.0.1:{}", serve.port);
    let mut idle = Vec::new();
    for _ in 0..500 {
        let mut c = TcpStream::connect(&addr).await.expect("connect");
        c.write_all(b"POST /webhooks/gitlab HTTP/1.1\r\nHost: planbot.test\r\n")
            .await
            .unwrap();
        idle.push(c);
    }
    let http = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    let healthz = http
        .get(serve.url("/healthz"))
        .send()
        .await
        .expect("/healthz answers under the flood");
    assert_eq!(healthz.status(), 200);
    let body = fixture("webhooks/merge_request_open.json");
    let mut req = http
        .post(serve.url("/webhooks/gitlab"))
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in token_headers(MR, "under-flood", WEBHOOK_SECRET) {
        req = req.header(k, v);
    }
    let status = req
        .send()
        .await
        .expect("a webhook gets in under the flood")
        .status();
    assert_eq!(status, 200);
    // It stops promptly (SIGTERM) with the idle connections still open, and says it holds
    // fewer connections than configured, and why.
    let log = tokio::time::timeout(PATIENCE, tokio::task::spawn_blocking(move || serve.stop()))
        .await
        .expect("planbot stops promptly with idle connections open")
        .unwrap()
        .join("\n");
    assert!(
        log.contains("server.max_connections is above what the open-files limit leaves"),
        "{log}"
    );
    drop(idle);
}
