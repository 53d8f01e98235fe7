//! Shared by the `service_*` tests: a real `planbot serve` application on 127.0.0.1:0 with a temp data_dir.
#![allow(dead_code)]

use super::world::PlanbotConfig;
use planbot::core::config::Config;
use planbot::core::webhook;
use planbot::flows::context::app_state::App;
use planbot::flows::service::server::{Application, Options};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const WEBHOOK_SECRET: &str = "hook-secret-for-tests";
/// The `[metrics] token` of [`test_config`]'s service (sent by [`TestService::metrics`]).
pub const METRICS_TOKEN: &str = "metrics-token-for-tests-0123456789";
/// `whsec_` + base64 of 32 bytes, the shape GitLab shows.
pub const SIGNING_TOKEN: &str = "whsec_dGVzdC1zaWduaW5nLWtleS0zMi1ieXRlcy1sb25nISE=";

/// A file of `tests/fixtures/gitlab/` (GitLab's documented payloads and answers).
pub fn fixture(rel: &str) -> String {
    super::fixtures::text(&format!("gitlab/{rel}"))
}

/// The config of a planbot on the fake GitLab: its bot watching `project`, the real `engine`,
/// GitLab-managed state for `project` as users run it (when the project exists).
pub fn config_for(
    data_dir: &Path,
    gitlab: &super::fake_gitlab::FakeGitLab,
    project: &str,
    engine: &Path,
) -> PlanbotConfig {
    let config = PlanbotConfig::serving(gitlab.url(), gitlab.bot_token(), data_dir)
        .projects(&[project])
        .engine(engine);
    match gitlab.project_named(project) {
        Some(p) => config.managed_state(gitlab, &p),
        None => config,
    }
}

/// Deliver an MR hook `body` (idempotency key `key`) to a `planbot serve` on `port`, as GitLab
/// does: the benchmarks' delivery. Panics unless it answers 200.
pub async fn deliver_mr_hook(http: &reqwest::Client, port: u16, body: Vec<u8>, key: &str) {
    let mut req = http
        .post(format!("http://127.0.0.1:{port}/webhooks/gitlab"))
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in token_headers("Merge Request Hook", key, WEBHOOK_SECRET) {
        req = req.header(k, v);
    }
    assert_eq!(req.send().await.unwrap().status(), 200, "delivery {key}");
}

/// [`config_for`] as the benchmarks run it: the engine may take 10 minutes.
pub fn bench_config(
    data_dir: &Path,
    gitlab: &super::fake_gitlab::FakeGitLab,
    project: &str,
    engine: &Path,
) -> PlanbotConfig {
    config_for(data_dir, gitlab, project, engine).set("engine", "timeout", "\"10m\"")
}

/// The config a test service of [`MiniGitLab`] runs with (`gitlab_url` may point at nothing:
/// probes then fail), watching `flightjs/flight-management` and `gitlab-org/gitlab-test`.
pub fn test_config(data_dir: &Path, gitlab_url: &str) -> PlanbotConfig {
    PlanbotConfig::serving(gitlab_url, "glpat-test-token-not-real", data_dir)
        .projects(&["flightjs/flight-management", "gitlab-org/gitlab-test"])
        .plan_slots(2)
        .metrics()
}

/// [`test_config`], deliveries signed when `signing`, loaded.
pub fn config(data_dir: &Path, gitlab_url: &str, signing: bool) -> Config {
    let config = test_config(data_dir, gitlab_url);
    match signing {
        true => config.signing(),
        false => config,
    }
    .load()
}

/// A URL where nothing listens (a port we bound and released).
pub fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

pub struct TestService {
    pub base: String,
    pub app: Arc<App>,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    pub http: reqwest::Client,
}

impl TestService {
    pub async fn start(config: Config, options: Options) -> TestService {
        let application = Application::build_with(config, options)
            .await
            .expect("build");
        let base = format!("http://127.0.0.1:{}", application.port());
        let app = application.app();
        let handle = tokio::spawn(application.run_until_stopped());
        TestService {
            base,
            app,
            handle,
            http: reqwest::Client::new(),
        }
    }

    /// Stop it the hard way (as a crash would, minus the process): the future is dropped.
    pub async fn kill(self) {
        self.handle.abort();
        let _ = self.handle.await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POST a webhook with these headers.
    pub async fn deliver(&self, body: &str, headers: &[(&str, String)]) -> reqwest::StatusCode {
        let mut req = self
            .http
            .post(self.url("/webhooks/gitlab"))
            .header("content-type", "application/json")
            .body(body.to_string());
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        req.send().await.expect("POST /webhooks/gitlab").status()
    }

    /// GitLab's Merge Request Hook of MR `iid` opened (`body`, as the fake builds it), delivered
    /// with the webhook's secret token; planbot answers 200.
    pub async fn deliver_mr_opened(&self, body: &[u8], iid: u64) {
        let status = self
            .deliver(
                std::str::from_utf8(body).unwrap(),
                &token_headers("Merge Request Hook", &format!("open-{iid}"), WEBHOOK_SECRET),
            )
            .await;
        assert_eq!(status, 200);
    }

    /// The page of the newest run of `kind` among the last ten (`/runs/{id}`): status and text.
    pub async fn newest_run_page(
        &self,
        kind: planbot::capabilities::store::RunKind,
    ) -> (reqwest::StatusCode, String) {
        let run = self
            .app
            .store
            .recent_runs(10)
            .await
            .unwrap()
            .into_iter()
            .find(|r| r.kind == kind)
            .unwrap_or_else(|| panic!("no {kind:?} run among the last ten"));
        self.get_text(&format!("/runs/{}", run.id.0)).await
    }

    /// `GET /metrics` with the test config's bearer token: the text (asserting 200).
    pub async fn metrics(&self) -> String {
        let r = self
            .http
            .get(self.url("/metrics"))
            .bearer_auth(METRICS_TOKEN)
            .send()
            .await
            .expect("GET /metrics");
        assert_eq!(r.status(), 200, "GET /metrics with the token");
        r.text().await.unwrap()
    }

    pub async fn get_text(&self, path: &str) -> (reqwest::StatusCode, String) {
        let r = self.http.get(self.url(path)).send().await.expect("GET");
        let s = r.status();
        (s, r.text().await.unwrap())
    }

    /// Wait until `f` holds (polling the store), or panic after 10 s.
    pub async fn eventually<F, Fut>(&self, what: &str, f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        self.eventually_for(what, 10, f).await
    }

    /// Whether no job is queued or running any more (the worker records a job's end just after
    /// the flow's last word, its commit status).
    pub async fn jobs_all_ended(&self) -> bool {
        self.app
            .store
            .recent_jobs(50)
            .await
            .unwrap()
            .iter()
            .all(|j| j.state != "queued" && j.state != "running")
    }

    /// Wait until `f` holds, checking it now and again each time a worker records a job's end
    /// (the queue's marker, not a timer), or panic after `secs` saying what never happened.
    /// For what holds once a job has ended: its state in the store, its last status or note.
    pub async fn after_job_ends<F, Fut>(&self, what: &str, secs: u64, mut f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let mut ended = self.app.queue.ended_jobs();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            // Seen before `f` looks: an end recorded while `f` runs wakes `changed` at once.
            ended.borrow_and_update();
            if f().await {
                return;
            }
            match tokio::time::timeout_at(deadline, ended.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => panic!("the service stopped while waiting for: {what}"),
                Err(_) => panic!(
                    "timed out after {secs} s waiting for: {what} ({} jobs ended)",
                    *ended.borrow()
                ),
            }
        }
    }

    /// Like [`TestService::eventually`], with a deadline of `secs` (real engine runs).
    pub async fn eventually_for<F, Fut>(&self, what: &str, secs: u64, f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        super::eventually(what, secs, f).await
    }
}

/// Headers of a GitLab delivery authenticated by X-Gitlab-Token.
pub fn token_headers(event: &str, key: &str, token: &str) -> Vec<(&'static str, String)> {
    vec![
        ("X-Gitlab-Event", event.to_string()),
        ("Idempotency-Key", key.to_string()),
        ("X-Gitlab-Webhook-UUID", format!("uuid-{key}")),
        ("User-Agent", "GitLab/18.4.0".to_string()),
        ("X-Gitlab-Token", token.to_string()),
    ]
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Headers of a GitLab delivery signed with the Standard Webhooks scheme at `timestamp`.
pub fn signed_headers(
    event: &str,
    key: &str,
    body: &str,
    timestamp: i64,
    extra_sigs: &[&str],
) -> Vec<(&'static str, String)> {
    let k = webhook::decode_signing_token(SIGNING_TOKEN).unwrap();
    let good = webhook::sign(&k, key, timestamp, body.as_bytes());
    let mut sigs: Vec<String> = extra_sigs.iter().map(|s| s.to_string()).collect();
    sigs.insert(sigs.len() / 2, good);
    vec![
        ("X-Gitlab-Event", event.to_string()),
        ("Idempotency-Key", key.to_string()),
        ("webhook-id", key.to_string()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", sigs.join(" ")),
    ]
}

/// `merge_request_open.json` with another head commit (and, optionally, as an `update` push).
pub fn mr_event(head: &str, action: &str) -> String {
    let mut v: serde_json::Value =
        serde_json::from_str(&fixture("webhooks/merge_request_open.json")).unwrap();
    v["object_attributes"]["last_commit"]["id"] = head.into();
    v["object_attributes"]["action"] = action.into();
    if action == "update" {
        v["object_attributes"]["oldrev"] = "e59094b8de0f2f91abbe4760a52d9137260252d8".into();
    }
    v.to_string()
}

/// A small stateful stand-in for GitLab, for what the service itself asks at start-up and in
/// probes: `GET /user`, `GET /projects/:id`, `GET /projects/:id/merge_requests?state=opened`
/// (real JSON shapes). `hang` makes every request wait forever (a GitLab that stopped answering).
pub struct MiniGitLab {
    pub url: String,
    pub requests: Arc<std::sync::Mutex<Vec<String>>>,
}

#[derive(Clone)]
struct MiniState {
    open_mrs: Arc<Vec<serde_json::Value>>,
    hang: bool,
    requests: Arc<std::sync::Mutex<Vec<String>>>,
}

impl MiniGitLab {
    pub async fn start(open_mrs: Vec<serde_json::Value>, hang: bool) -> MiniGitLab {
        use axum::extract::{Path as AxPath, State};
        use axum::http::{HeaderMap, StatusCode, Uri};
        use axum::response::IntoResponse;
        use axum::routing::get;

        async fn gate(st: &MiniState, uri: &Uri, headers: &HeaderMap) -> Result<(), StatusCode> {
            st.requests.lock().unwrap().push(uri.to_string());
            if st.hang {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            match headers.get("private-token").and_then(|v| v.to_str().ok()) {
                Some("glpat-test-token-not-real") => Ok(()),
                _ => Err(StatusCode::UNAUTHORIZED),
            }
        }
        async fn user(
            State(st): State<MiniState>,
            uri: Uri,
            h: HeaderMap,
        ) -> axum::response::Response {
            match gate(&st, &uri, &h).await {
                Ok(()) => axum::Json(
                    serde_json::json!({"id": 99, "username": "planbot-bot", "name": "planbot"}),
                )
                .into_response(),
                Err(s) => s.into_response(),
            }
        }
        async fn project(
            State(st): State<MiniState>,
            AxPath(id): AxPath<String>,
            uri: Uri,
            h: HeaderMap,
        ) -> axum::response::Response {
            if let Err(s) = gate(&st, &uri, &h).await {
                return s.into_response();
            }
            if id == "2" || id == "flightjs/flight-management" {
                axum::Json(serde_json::json!({
                    "id": 2, "path_with_namespace": "flightjs/flight-management", "default_branch": "main",
                    "http_url_to_repo": "http://gitlab.example.com/flightjs/flight-management.git",
                    "web_url": "http://gitlab.example.com/flightjs/flight-management"
                }))
                .into_response()
            } else {
                (
                    StatusCode::NOT_FOUND,
                    axum::Json(serde_json::json!({"message": "404 Project Not Found"})),
                )
                    .into_response()
            }
        }
        async fn mrs(
            State(st): State<MiniState>,
            AxPath(id): AxPath<String>,
            uri: Uri,
            h: HeaderMap,
        ) -> axum::response::Response {
            if let Err(s) = gate(&st, &uri, &h).await {
                return s.into_response();
            }
            if id != "2" {
                return StatusCode::NOT_FOUND.into_response();
            }
            axum::Json(serde_json::Value::Array(st.open_mrs.to_vec())).into_response()
        }

        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let st = MiniState {
            open_mrs: Arc::new(open_mrs),
            hang,
            requests: requests.clone(),
        };
        let app = axum::Router::new()
            .route("/api/v4/user", get(user))
            .route("/api/v4/projects/{id}", get(project))
            .route("/api/v4/projects/{id}/merge_requests", get(mrs))
            .with_state(st);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        MiniGitLab { url, requests }
    }
}

/// An open MR as `GET /projects/:id/merge_requests` lists it.
pub fn open_mr(iid: u64, sha: &str, source_project: u64) -> serde_json::Value {
    serde_json::json!({
        "id": 1000 + iid, "iid": iid, "project_id": 2, "title": format!("MR {iid}"), "state": "opened",
        "sha": sha, "source_project_id": source_project, "target_project_id": 2,
        "source_branch": format!("feature-{iid}"), "target_branch": "main", "draft": false,
        "web_url": format!("http://gitlab.example.com/flightjs/flight-management/-/merge_requests/{iid}"),
        "author": {"id": 1, "username": "agarcia", "name": "Alex Garcia"},
        "merge_commit_sha": null, "squash_commit_sha": null
    })
}
