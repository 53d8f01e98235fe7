//! The accept loop: every connection under a header timeout (which is also the keep-alive idle
//! timeout), at most `server.max_connections` at once (a new one closes the one idle the
//! longest), and an accept that backs off and retries when the process is out of descriptors.

use crate::core::config::ServerConfig;
use axum::extract::connect_info::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Descriptors kept for everything but client connections (store, git, engine pipes, logs).
pub const RESERVED_FILES: u64 = 256;

/// What one connection buffers of a request's head (and reads of its body at a time): a head
/// larger than this is answered 431 (hyper's default, ~400 KiB, let 1,000 connections hold
/// 400 MiB of headers).
pub const READ_BUFFER: usize = 64 * 1024;

/// The longest pause between accepts that failed for want of descriptors.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// One open connection: whether a request is in flight, since when it is idle, how to close it.
struct Entry {
    busy: u32,
    idle_since: Instant,
    close: CancellationToken,
}

/// The open connections, by the order they were accepted in.
#[derive(Default)]
struct Registry {
    next: u64,
    open: BTreeMap<u64, Entry>,
}

type Shared = Arc<Mutex<Registry>>;

impl Registry {
    fn add(&mut self) -> (u64, CancellationToken) {
        let id = self.next;
        self.next += 1;
        let close = CancellationToken::new();
        self.open.insert(
            id,
            Entry {
                busy: 0,
                idle_since: Instant::now(),
                close: close.clone(),
            },
        );
        (id, close)
    }

    /// Close the connection idle the longest (not one with a request in flight); whether one was.
    fn close_longest_idle(&mut self) -> bool {
        let Some(id) = self
            .open
            .iter()
            .filter(|(_, e)| e.busy == 0)
            .min_by_key(|(_, e)| e.idle_since)
            .map(|(id, _)| *id)
        else {
            return false;
        };
        if let Some(e) = self.open.remove(&id) {
            e.close.cancel();
        }
        true
    }
}

/// Marks its connection busy while a request is handled and its response sent.
struct Busy {
    registry: Shared,
    id: u64,
}

impl Busy {
    fn start(registry: &Shared, id: u64) -> Busy {
        if let Some(e) = registry.lock().unwrap().open.get_mut(&id) {
            e.busy += 1;
        }
        Busy {
            registry: registry.clone(),
            id,
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(e) = self.registry.lock().unwrap().open.get_mut(&self.id) {
            e.busy = e.busy.saturating_sub(1);
            e.idle_since = Instant::now();
        }
    }
}

/// A response body that keeps its connection marked busy until it is sent (or dropped).
struct Tracked {
    inner: axum::body::Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Raise the soft limit of open files to the hard one (systemd's default soft limit is 1,024);
/// the connections planbot may hold at once: `max_connections`, or fewer when the limit is low.
pub fn connection_limit(config: &ServerConfig) -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read the one struct passed.
    let files = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return config.max_connections;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            } else {
                tracing::warn!(
                    soft = lim.rlim_cur,
                    hard = lim.rlim_max,
                    "cannot raise the open-files limit to its hard limit"
                );
            }
        }
        lim.rlim_cur
    };
    let room = files.saturating_sub(RESERVED_FILES).max(1);
    if (config.max_connections as u64) > room {
        tracing::warn!(
            max_connections = config.max_connections,
            open_files = files,
            allowed = room,
            "server.max_connections is above what the open-files limit leaves for clients: holding at most `allowed` (raise LimitNOFILE=)"
        );
        return room as usize;
    }
    config.max_connections
}

/// Whether an accept error is about the one connection (it went away) rather than the process.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
    )
}

/// Serve `router` on `listener` until `stop` fires, then close idle connections and wait for
/// those with a request in flight.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    config: ServerConfig,
    stop: CancellationToken,
) {
    let limit = connection_limit(&config);
    let registry: Shared = Arc::default();
    let mut tasks = JoinSet::new();
    let mut backoff = Duration::from_millis(10);
    let mut refusing_since: Option<Instant> = None;
    loop {
        while tasks.try_join_next().is_some() {}
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => {
                backoff = Duration::from_millis(10);
                a
            }
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // EMFILE, ENFILE, ENOBUFS, ENOMEM: free a descriptor if one is idle, wait, retry.
                let freed = registry.lock().unwrap().close_longest_idle();
                tracing::warn!(error = %e, freed_idle = freed, retry_in = ?backoff, "accept failed: retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.cancelled() => break,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        let (id, close) = {
            let mut r = registry.lock().unwrap();
            if r.open.len() >= limit && !r.close_longest_idle() {
                // Every connection has a request in flight: this one is closed at once.
                if refusing_since.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(limit, "server.max_connections reached with every connection busy: closing new connections");
                    refusing_since = Some(Instant::now());
                }
                drop(stream);
                continue;
            }
            r.add()
        };
        tasks.spawn(connection(
            stream,
            peer,
            router.clone(),
            config.header_timeout,
            registry.clone(),
            id,
            close,
            stop.clone(),
        ));
    }
    // Stopping: idle connections (also those still sending headers) close now, busy ones once
    // their response is sent.
    drop(listener);
    for entry in registry.lock().unwrap().open.values() {
        if entry.busy == 0 {
            entry.close.cancel();
        }
    }
    while tasks.join_next().await.is_some() {}
}

#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    header_timeout: Duration,
    registry: Shared,
    id: u64,
    close: CancellationToken,
    stop: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let reg = registry.clone();
    let service = hyper::service::service_fn(move |req: axum::http::Request<Incoming>| {
        let busy = Busy::start(&reg, id);
        let mut req = req.map(axum::body::Body::new);
        req.extensions_mut().insert(ConnectInfo(peer));
        let router = router.clone();
        async move {
            let response = router.oneshot(req).await.unwrap_or_else(|e| match e {});
            Ok::<_, Infallible>(
                response.map(|inner| axum::body::Body::new(Tracked { inner, _busy: busy })),
            )
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(READ_BUFFER)
        .max_header_size(READ_BUFFER)
        .keep_alive(true);
    let conn = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
                break;
            }
            // Evicted for a newer connection: dropping it closes the socket.
            _ = close.cancelled() => break,
            _ = stop.cancelled(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
    registry.lock().unwrap().open.remove(&id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_idle_connection_is_closed_never_a_busy_one() {
        let registry: Shared = Arc::default();
        let (a, close_a) = registry.lock().unwrap().add();
        let (b, close_b) = registry.lock().unwrap().add();
        let busy_a = Busy::start(&registry, a);
        assert!(registry.lock().unwrap().close_longest_idle());
        assert!(close_b.is_cancelled() && !close_a.is_cancelled());
        assert!(!registry.lock().unwrap().open.contains_key(&b));
        assert!(!registry.lock().unwrap().close_longest_idle(), "a is busy");
        drop(busy_a);
        assert!(registry.lock().unwrap().close_longest_idle());
        assert!(close_a.is_cancelled());
    }
}
