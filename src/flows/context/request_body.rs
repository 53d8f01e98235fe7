//! One bounded read of a request body: the size cap checked against `Content-Length` before a
//! byte is read and again while the body streams (chunked), a deadline for the whole read, and
//! a budget shared by every body being held at once, so no number of clients buffers more.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What the bodies being read or handled may hold at once, all requests together: four
/// webhook bodies of GitLab's maximum size (25 MiB).
pub const BUDGET_BYTES: usize = 100 * 1024 * 1024;

/// The budget is counted in KiB (a permit per KiB).
const UNIT: usize = 1024;

/// Why a body was not read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyRefusal {
    #[error("the body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the body did not arrive within {0:?}")]
    TimedOut(Duration),
    #[error("the body's bytes could not be read")]
    Broken,
    #[error("too many request bodies are being read at once")]
    Busy,
}

impl BodyRefusal {
    /// The HTTP status the client gets (413, 408, 400, 503).
    pub fn status(self) -> StatusCode {
        match self {
            BodyRefusal::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyRefusal::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
            BodyRefusal::Broken => StatusCode::BAD_REQUEST,
            BodyRefusal::Busy => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// The bytes every body being read or handled holds, shared by all requests.
#[derive(Clone)]
pub struct Budget {
    permits: Arc<Semaphore>,
}

impl Budget {
    pub fn new(bytes: usize) -> Budget {
        Budget {
            permits: Arc::new(Semaphore::new(bytes.div_ceil(UNIT))),
        }
    }

    /// Reserve `bytes` more for `held` (at once, or [`BodyRefusal::Busy`]: no waiting).
    fn reserve(
        &self,
        held: &mut Option<OwnedSemaphorePermit>,
        bytes: usize,
    ) -> Result<(), BodyRefusal> {
        let have = held.as_ref().map_or(0, |p| p.num_permits());
        let want = bytes.div_ceil(UNIT);
        if want <= have {
            return Ok(());
        }
        let more = u32::try_from(want - have).map_err(|_| BodyRefusal::Busy)?;
        let permit = self
            .permits
            .clone()
            .try_acquire_many_owned(more)
            .map_err(|_| BodyRefusal::Busy)?;
        match held {
            Some(p) => p.merge(permit),
            None => *held = Some(permit),
        }
        Ok(())
    }
}

/// A body read whole; its share of the [`Budget`] is given back when this is dropped (keep it
/// while the bytes are in use).
pub struct ReadBody {
    pub bytes: Bytes,
    _held: Option<OwnedSemaphorePermit>,
}

/// The declared `Content-Length`, if any (an unreadable one counts as too large: hyper has
/// already refused a malformed one).
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).map(|v| {
        v.to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(u64::MAX)
    })
}

/// Refuse a declared `Content-Length` over `limit` before reading anything.
pub fn check_declared(headers: &HeaderMap, limit: usize) -> Result<(), BodyRefusal> {
    match declared_length(headers) {
        Some(n) if n > limit as u64 => Err(BodyRefusal::TooLarge { limit }),
        _ => Ok(()),
    }
}

/// Read `body` whole: at most `limit` bytes (checked against `Content-Length` first, then
/// while it streams), within `deadline` for the whole read, holding what has arrived in
/// `budget`.
pub async fn read(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    deadline: Duration,
    budget: &Budget,
) -> Result<ReadBody, BodyRefusal> {
    check_declared(headers, limit)?;
    // The budget is taken as bytes arrive, not as declared: a client that announces a body
    // and stalls holds none of it.
    let mut held = None;
    let until = tokio::time::Instant::now() + deadline;
    let mut body = body;
    let mut buf = bytes::BytesMut::new();
    loop {
        let frame = match tokio::time::timeout_at(until, body.frame()).await {
            Err(_) => return Err(BodyRefusal::TimedOut(deadline)),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(BodyRefusal::Broken),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers: not used
        };
        let total = buf.len() + data.len();
        if total > limit {
            return Err(BodyRefusal::TooLarge { limit });
        }
        budget.reserve(&mut held, total)?;
        buf.extend_from_slice(&data);
    }
    Ok(ReadBody {
        bytes: buf.freeze(),
        _held: held,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_shared_and_given_back() {
        let budget = Budget::new(8 * UNIT);
        let mut a = None;
        budget.reserve(&mut a, 5 * UNIT).unwrap();
        budget.reserve(&mut a, 6 * UNIT).unwrap(); // grows by one
        let mut b = None;
        assert_eq!(budget.reserve(&mut b, 3 * UNIT), Err(BodyRefusal::Busy));
        budget.reserve(&mut b, 2 * UNIT).unwrap();
        drop(a);
        budget.reserve(&mut b, 8 * UNIT).unwrap();
    }

    #[test]
    fn a_declared_length_over_the_cap_is_refused_before_reading() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, "1025".parse().unwrap());
        assert_eq!(
            check_declared(&h, 1024),
            Err(BodyRefusal::TooLarge { limit: 1024 })
        );
        h.insert(header::CONTENT_LENGTH, "1024".parse().unwrap());
        assert_eq!(check_declared(&h, 1024), Ok(()));
        assert_eq!(check_declared(&HeaderMap::new(), 1024), Ok(()));
    }
}
