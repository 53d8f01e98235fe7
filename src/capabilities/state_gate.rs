//! A job's state gate: the small HTTP server on loopback that the engine's `http` backend talks
//! to instead of GitLab, so the real state token never enters the sandbox.
//!
//! One gate per job (its own listener on `127.0.0.1`, an ephemeral port, stopped when the last
//! handle drops), and a [`GatePass`] per root run of the job: the engine gets
//! `http://127.0.0.1:<port>/api/v4/projects/<id>/terraform/state/<name>` and a random
//! credential good for this gate alone, while its pass lives (checked in constant time, useless
//! at GitLab). The gate forwards with the real token of the job's trust level only what
//! [`crate::core::state::gate_request`] allows the pass (the job's own project's states, by id
//! or path; reads only for MR plans; writes only of the run's own state), streams both ways
//! within [`STATE_MAX`], keeps GitLab's status codes and bodies (a held lock's `409` and its lock
//! info reach the engine as GitLab sent them), and refuses everything else with `403` and a
//! reason it keeps for the note.
//!
//! Why one listener per job rather than one for the service keyed by credential: the port is
//! allowed only in that job's sandboxes (Landlock's connect rule), so even a credential another
//! job's MR code learned would not reach this gate; and a gate's life is its job's. Why one per
//! job rather than per root: the roots of a job share a checkout, and a module they share holds
//! one override naming the gate ([`crate::core::state::remote`]).

use crate::core::config::{GitlabCredential, Secret};
use crate::core::state::{self, GateAccess, GateCall, GateGrant, GateRefusal};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures::{Stream, StreamExt};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use subtle::ConstantTimeEq;

/// The largest state the gate passes either way (GitLab's own default has no limit; a state
/// of 5,000 resources is a few tens of MiB).
pub const STATE_MAX: u64 = 256 * 1024 * 1024;

/// How long the gate waits to connect to GitLab.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// At most this many refusals are kept for a pass (the same reason once).
const MAX_REFUSALS: usize = 20;

/// One job's running gate. Cheap to share (`Arc`); the listener stops when the last handle
/// (the job's, or a pass's) is dropped.
pub struct StateGate {
    port: u16,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for StateGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateGate")
            .field("port", &self.port)
            .field("project", &self.inner.project)
            .finish_non_exhaustive()
    }
}

/// Whose states a job's gate serves.
#[derive(Debug, Clone)]
pub struct GateProject {
    /// The project's numeric id (what GitLab is asked with).
    pub id: u64,
    /// Its path (`group/project`), when known: an address may name the project by it.
    pub path: Option<String>,
}

struct Inner {
    project: GateProject,
    /// What the job's runs may do (its trust level's).
    access: GateAccess,
    gitlab_url: String,
    upstream: GitlabCredential,
    passes: Mutex<Vec<PassEntry>>,
    /// Refusals of requests that carried no pass's credential: every pass reports them.
    unknown: Mutex<Vec<String>>,
    next: AtomicU64,
    client: reqwest::Client,
}

/// What the gate knows of one pass.
struct PassEntry {
    id: u64,
    /// `Basic base64(user:password)` of the pass's credential.
    expected: String,
    grant: GateGrant,
    refusals: Vec<String>,
}

/// One root run's way through the job's gate: its credential and what it may do. The pass
/// (and the gate with it) lives as long as the run holds it, through its apply.
pub struct GatePass {
    gate: Arc<StateGate>,
    id: u64,
    grant: GateGrant,
    credential: GitlabCredential,
}

impl std::fmt::Debug for GatePass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatePass")
            .field("port", &self.gate.port)
            .field("grant", &self.grant)
            .finish_non_exhaustive()
    }
}

impl StateGate {
    /// Start a job's gate for `project`'s states on an ephemeral loopback port, forwarding to
    /// `gitlab_url`'s state API with `upstream` (the token of the job's trust level), for runs
    /// that may do `access`. The port is none of `sandbox_ports` (the ports every engine run may
    /// connect to): no other job's engine reaches this gate.
    pub async fn start(
        project: GateProject,
        access: GateAccess,
        gitlab_url: &str,
        upstream: &GitlabCredential,
        sandbox_ports: &[u16],
    ) -> std::io::Result<Arc<StateGate>> {
        let mut taken = Vec::new();
        let (listener, port) = outside(
            sandbox_ports,
            || {
                let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
                let port = l.local_addr()?.port();
                Ok((l, port))
            },
            &mut taken,
        )?;
        drop(taken);
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let inner = Arc::new(Inner {
            project,
            access,
            gitlab_url: gitlab_url.to_string(),
            upstream: upstream.clone(),
            passes: Mutex::new(Vec::new()),
            unknown: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            client: client().map_err(std::io::Error::other)?,
        });
        let router = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Arc::new(StateGate { port, inner, task }))
    }

    /// The gate's TCP port (the job's sandboxes must allow it).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`: where the engine finds the gate.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A pass for one root run: its own credential, good at this gate for `state` (the run's
    /// own state, the one it may lock and write when the job's runs may).
    pub fn pass(self: &Arc<Self>, state: &str) -> Arc<GatePass> {
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
        let grant = GateGrant {
            project: self.inner.project.id,
            project_path: self.inner.project.path.clone(),
            state: state.to_string(),
            access: self.inner.access,
        };
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.passes).push(PassEntry {
            id,
            expected,
            grant: grant.clone(),
            refusals: Vec::new(),
        });
        Arc::new(GatePass {
            gate: self.clone(),
            id,
            grant,
            credential,
        })
    }
}

impl GatePass {
    /// The gate's TCP port (the run's sandbox must allow it).
    pub fn port(&self) -> u16 {
        self.gate.port
    }

    /// The `http` backend's environment for the run: the gate's address of its own state, its
    /// lock address, and the pass's credential.
    pub fn env(&self) -> BTreeMap<String, String> {
        let address = state::state_address(&self.gate.url(), self.grant.project, &self.grant.state);
        state::http_backend_env(&address, &self.credential)
    }

    /// The pass's credential (a secret of the run: scrubbed from its output).
    pub fn password(&self) -> &str {
        self.credential.token.expose()
    }

    /// The project whose states the gate serves.
    pub fn project(&self) -> u64 {
        self.grant.project
    }

    /// What the gate refused this run so far (and requests with no pass's credential), each
    /// with why, in order (the same reason once).
    pub fn refusals(&self) -> Vec<String> {
        let mut all = lock(&self.gate.inner.passes)
            .iter()
            .find(|p| p.id == self.id)
            .map(|p| p.refusals.clone())
            .unwrap_or_default();
        for r in lock(&self.gate.inner.unknown).iter() {
            if !all.contains(r) {
                all.push(r.clone());
            }
        }
        all
    }
}

impl Drop for GatePass {
    fn drop(&mut self) {
        lock(&self.gate.inner.passes).retain(|p| p.id != self.id);
    }
}

impl Drop for StateGate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How many ports [`outside`] tries.
const PORT_TRIES: usize = 16;

/// The first listener `bind` gives whose port is not in `avoid`; the others are kept in
/// `taken` meanwhile, so the next bind gets another port.
fn outside<L>(
    avoid: &[u16],
    mut bind: impl FnMut() -> std::io::Result<(L, u16)>,
    taken: &mut Vec<L>,
) -> std::io::Result<(L, u16)> {
    for _ in 0..PORT_TRIES {
        let (listener, port) = bind()?;
        if !avoid.contains(&port) {
            return Ok((listener, port));
        }
        taken.push(listener);
    }
    Err(std::io::Error::other(
        "no loopback port outside the engine sandbox's allow-list",
    ))
}

/// A lock of the gate's tables (a panic elsewhere leaves them usable).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
    /// Refuse with `refusal`, kept for the pass `pass` (or for every pass when no pass's
    /// credential came with the request).
    fn refuse(&self, status: StatusCode, pass: Option<u64>, refusal: GateRefusal) -> Response {
        tracing::warn!(project = self.project.id, reason = %refusal.0, "state gate refused a request");
        let keep = |list: &mut Vec<String>| {
            if !list.contains(&refusal.0) && list.len() < MAX_REFUSALS {
                list.push(refusal.0.clone());
            }
        };
        match pass {
            Some(id) => {
                if let Some(p) = lock(&self.passes).iter_mut().find(|p| p.id == id) {
                    keep(&mut p.refusals);
                }
            }
            None => keep(&mut lock(&self.unknown)),
        }
        (status, refusal.0).into_response()
    }

    /// The pass whose credential `authorization` is, compared in constant time with every
    /// pass's (no early end).
    fn pass_of(&self, authorization: Option<&[u8]>) -> Option<(u64, GateGrant)> {
        let given = authorization?;
        let mut found = None;
        for p in lock(&self.passes).iter() {
            if bool::from(given.ct_eq(p.expected.as_bytes())) {
                found = Some((p.id, p.grant.clone()));
            }
        }
        found
    }

    fn refusal(&self, access: GateAccess, why: &str, ctx: minijinja::Value) -> GateRefusal {
        let run = match access {
            GateAccess::Read => "plan",
            GateAccess::ReadWrite => "run",
        };
        let ctx = minijinja::context! { why => why, run => run, own => self.project.id, ..ctx };
        GateRefusal(crate::core::templates::text(
            "state.txt.j2",
            "gate_refused",
            ctx,
        ))
    }
}

async fn handle(State(gate): State<Arc<Inner>>, req: Request) -> Response {
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let Some((pass, grant)) = gate.pass_of(authorization) else {
        let r = gate.refusal(gate.access, "credential", minijinja::context! {});
        return gate.refuse(StatusCode::UNAUTHORIZED, None, r);
    };
    let call = match state::gate_request(
        &grant,
        req.method().as_str(),
        req.uri().path(),
        req.uri().query(),
    ) {
        Ok(c) => c,
        Err(r) => return gate.refuse(StatusCode::FORBIDDEN, Some(pass), r),
    };
    let too_large = |call: &GateCall| {
        gate.refusal(
            grant.access,
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
        return gate.refuse(StatusCode::PAYLOAD_TOO_LARGE, Some(pass), r);
    }
    let method = req.method().clone();
    let content_type = req.headers().get(header::CONTENT_TYPE).cloned();
    let body = bounded(req.into_body().into_data_stream());
    let mut upstream = gate
        .client
        .request(method, call.upstream(&gate.gitlab_url, grant.project))
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
            tracing::warn!(project = grant.project, error = %e.without_url(), "state gate: GitLab did not answer");
            return (
                StatusCode::BAD_GATEWAY,
                "planbot's state gate could not reach GitLab",
            )
                .into_response();
        }
    };
    if answer.content_length().is_some_and(|n| n > STATE_MAX) {
        let r = too_large(&call);
        return gate.refuse(StatusCode::BAD_GATEWAY, Some(pass), r);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_never_takes_a_port_the_engines_may_connect_to() {
        let mut given = [8006u16, 443, 41000].into_iter();
        let mut taken = Vec::new();
        let got = outside(&[443, 8006], || Ok(((), given.next().unwrap())), &mut taken);
        assert_eq!(got.unwrap().1, 41000);
        assert_eq!(taken.len(), 2);
        let mut taken = Vec::new();
        assert!(outside(&[443], || Ok(((), 443)), &mut taken).is_err());
    }
}
