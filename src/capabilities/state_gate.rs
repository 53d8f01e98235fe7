//! A job's state gate: the small HTTP server on loopback that the engine's `http` backend talks
//! to instead of GitLab, so the real state token never enters the sandbox.
//!
//! One gate per job (its own listener on `127.0.0.1`, an ephemeral port, stopped when the last
//! handle drops): the engine gets `http://127.0.0.1:<port>/api/v4/projects/<id>/terraform/state/
//! <name>` and a random credential good for this gate alone (checked in constant time, useless
//! at GitLab). The gate forwards with the real token of the run's trust level only what
//! [`crate::core::state::gate_request`] allows (the job's own project's states; reads only for
//! MR plans), streams both ways within [`STATE_MAX`], keeps GitLab's status codes and bodies
//! (a held lock's `409` and its lock info reach the engine as GitLab sent them), and refuses
//! everything else with `403` and a reason it keeps for the note.
//!
//! Why one listener per job rather than one for the service keyed by credential: the port is
//! allowed only in that job's sandbox (Landlock's connect rule), so even a credential another
//! job's MR code learned would not reach this gate; and a gate's life is its job's (no table of
//! grants to expire).

use crate::core::config::{GitlabCredential, Secret};
use crate::core::state::{self, GateCall, GateGrant, GateRefusal};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures::{Stream, StreamExt};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use subtle::ConstantTimeEq;

/// The largest state the gate passes either way (GitLab's own default has no limit; a state
/// of 5,000 resources is a few tens of MiB).
pub const STATE_MAX: u64 = 256 * 1024 * 1024;

/// How long the gate waits to connect to GitLab.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// One job's running gate. Cheap to share (`Arc`); the listener stops when the last handle is
/// dropped.
pub struct StateGate {
    port: u16,
    grant: GateGrant,
    credential: GitlabCredential,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for StateGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateGate")
            .field("port", &self.port)
            .field("grant", &self.grant)
            .finish_non_exhaustive()
    }
}

struct Inner {
    grant: GateGrant,
    gitlab_url: String,
    upstream: GitlabCredential,
    /// `Basic base64(user:password)` of the job's own credential.
    expected: String,
    refusals: Mutex<Vec<String>>,
    client: reqwest::Client,
}

impl StateGate {
    /// Start the gate for `grant` on an ephemeral loopback port, forwarding to `gitlab_url`'s
    /// state API with `upstream` (the token of the run's trust level).
    pub async fn start(
        grant: GateGrant,
        gitlab_url: &str,
        upstream: &GitlabCredential,
    ) -> std::io::Result<Arc<StateGate>> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let credential = GitlabCredential {
            username: format!("planbot-job-{}", random_hex(6)),
            token: Secret::new(random_hex(32)),
        };
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!(
                "{}:{}",
                credential.username,
                credential.token.expose()
            ))
        );
        let inner = Arc::new(Inner {
            grant: grant.clone(),
            gitlab_url: gitlab_url.to_string(),
            upstream: upstream.clone(),
            expected,
            refusals: Mutex::new(Vec::new()),
            client: client().map_err(std::io::Error::other)?,
        });
        let router = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Arc::new(StateGate {
            port,
            grant,
            credential,
            inner,
            task,
        }))
    }

    /// The gate's TCP port (the job's sandbox must allow it).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `http` backend's environment for the job: the gate's address of the grant's state,
    /// its lock address, and the job's own credential.
    pub fn env(&self) -> BTreeMap<String, String> {
        let address = state::state_address(
            &format!("http://127.0.0.1:{}", self.port),
            self.grant.project,
            &self.grant.state,
        );
        state::http_backend_env(&address, &self.credential)
    }

    /// The job's credential (a secret of the run: scrubbed from its output).
    pub fn password(&self) -> &str {
        self.credential.token.expose()
    }

    /// The project whose states this gate serves.
    pub fn project(&self) -> u64 {
        self.grant.project
    }

    /// What the gate refused so far, each with why, in order (the same reason once).
    pub fn refusals(&self) -> Vec<String> {
        self.inner
            .refusals
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }
}

impl Drop for StateGate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The client every gate forwards with (built once: TLS roots are read once per process).
fn client() -> Result<reqwest::Client, String> {
    static CLIENT: std::sync::OnceLock<Result<reqwest::Client, String>> =
        std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| e.to_string())
        })
        .clone()
}

fn random_hex(bytes: usize) -> String {
    use rand::RngCore;
    let mut b = vec![0u8; bytes];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Inner {
    fn refuse(&self, status: StatusCode, refusal: GateRefusal) -> Response {
        tracing::warn!(project = self.grant.project, reason = %refusal.0, "state gate refused a request");
        if let Ok(mut r) = self.refusals.lock() {
            if !r.contains(&refusal.0) && r.len() < 20 {
                r.push(refusal.0.clone());
            }
        }
        (status, refusal.0).into_response()
    }

    fn refusal(&self, why: &str, ctx: minijinja::Value) -> GateRefusal {
        let run = match self.grant.access {
            state::GateAccess::Read => "plan",
            state::GateAccess::ReadWrite => "run",
        };
        let ctx = minijinja::context! { why => why, run => run, own => self.grant.project, ..ctx };
        GateRefusal(crate::core::templates::text(
            "state.txt.j2",
            "gate_refused",
            ctx,
        ))
    }
}

async fn handle(State(gate): State<Arc<Inner>>, req: Request) -> Response {
    let authorized = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| bool::from(v.as_bytes().ct_eq(gate.expected.as_bytes())))
        .unwrap_or(false);
    if !authorized {
        let r = gate.refusal("credential", minijinja::context! {});
        return gate.refuse(StatusCode::UNAUTHORIZED, r);
    }
    let call = match state::gate_request(
        &gate.grant,
        req.method().as_str(),
        req.uri().path(),
        req.uri().query(),
    ) {
        Ok(c) => c,
        Err(r) => return gate.refuse(StatusCode::FORBIDDEN, r),
    };
    let too_large = |call: &GateCall| {
        gate.refusal(
            "too_large",
            minijinja::context! { op => format!("{:?}", call.op).to_lowercase(), name => &call.name, max => "256 MiB" },
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > STATE_MAX) {
        let r = too_large(&call);
        return gate.refuse(StatusCode::PAYLOAD_TOO_LARGE, r);
    }
    let method = req.method().clone();
    let content_type = req.headers().get(header::CONTENT_TYPE).cloned();
    let body = bounded(req.into_body().into_data_stream());
    let mut upstream = gate
        .client
        .request(method, call.upstream(&gate.gitlab_url, gate.grant.project))
        .basic_auth(&gate.upstream.username, Some(gate.upstream.token.expose()))
        .body(reqwest::Body::wrap_stream(body));
    if let Some(ct) = content_type {
        upstream = upstream.header(header::CONTENT_TYPE, ct);
    }
    if let Some(n) = declared {
        upstream = upstream.header(header::CONTENT_LENGTH, n);
    }
    let answer = match upstream.send().await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(project = gate.grant.project, error = %e.without_url(), "state gate: GitLab did not answer");
            return (
                StatusCode::BAD_GATEWAY,
                "planbot's state gate could not reach GitLab",
            )
                .into_response();
        }
    };
    if answer.content_length().is_some_and(|n| n > STATE_MAX) {
        let r = too_large(&call);
        return gate.refuse(StatusCode::BAD_GATEWAY, r);
    }
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    let mut resp = Response::new(Body::from_stream(bounded(answer.bytes_stream())));
    *resp.status_mut() = status;
    if let Some(ct) = content_type {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct);
    } else {
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
    }
    resp
}

/// `stream`, ended with an error once more than [`STATE_MAX`] bytes went through.
fn bounded<S, B, E>(stream: S) -> impl Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send
where
    S: Stream<Item = Result<B, E>> + Send + 'static,
    B: Into<bytes::Bytes>,
    E: std::fmt::Display,
{
    let mut seen: u64 = 0;
    stream.map(move |chunk| {
        let chunk: bytes::Bytes = chunk
            .map_err(|e| std::io::Error::other(e.to_string()))?
            .into();
        seen += chunk.len() as u64;
        if seen > STATE_MAX {
            return Err(std::io::Error::other(
                "state larger than the state gate's limit",
            ));
        }
        Ok(chunk)
    })
}
