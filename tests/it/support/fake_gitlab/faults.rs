//! Faults on demand (an error N times, before or after the work, a rate limit, requests held
//! until released) and the calls counted per route.

use super::*;

#[derive(Debug, Default)]
pub(super) struct Faults {
    remaining: u32,
    status: u16,
    retry_after: Option<u64>,
    /// Do the work first, then answer the error.
    after_write: bool,
}

pub(super) async fn count_and_fault(
    State(state): State<Shared>,
    req: Request,
    next: Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_default();
    let key = format!("{} {}", req.method(), route);
    let exact = format!("{} {}", req.method(), req.uri().path());
    let hold = {
        let s = state.lock().unwrap_or_else(|e| e.into_inner());
        // The newest hold of the path (an earlier one may have been released).
        s.holds
            .iter()
            .rev()
            .find(|(k, _)| *k == exact)
            .map(|(_, h)| h.clone())
    };
    // The requests a hold lets through first ([`FakeGitLab::hold_after`]) pass untouched.
    let hold = hold.filter(|h| {
        h.pass
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_err()
    });
    if let Some(hold) = hold {
        let mut released = hold.released.subscribe();
        if !*released.borrow() {
            hold.arrived.send_modify(|n| *n += 1);
            let _ = released.wait_for(|r| *r).await;
        }
    }
    let fault = {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        *s.calls.entry(key.clone()).or_default() += 1;
        match s.faults.get_mut(&key) {
            Some(f) if f.remaining > 0 => {
                f.remaining -= 1;
                Some((f.status, f.retry_after, f.after_write))
            }
            _ => None,
        }
    };
    if let Some((code, retry_after, after_write)) = fault {
        if after_write {
            // The work is done (and kept); only the answer is lost.
            let _ = next.run(req).await;
        }
        let mut resp = err(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &format!("{code} injected by the fake GitLab"),
        );
        if let Some(secs) = retry_after {
            resp.headers_mut().insert(
                "retry-after",
                HeaderValue::from_str(&secs.to_string()).unwrap(),
            );
        }
        return resp;
    }
    next.run(req).await
}

/// The shared half of a [`Hold`]: how many requests arrived, and whether it was released.
#[derive(Debug)]
pub(super) struct HoldInner {
    arrived: tokio::sync::watch::Sender<u32>,
    released: tokio::sync::watch::Sender<bool>,
    /// How many more requests pass before the hold keeps them.
    pass: std::sync::atomic::AtomicU32,
}

/// Requests to one path kept waiting until [`Hold::release`] (or the hold is dropped): a
/// GitLab that is slow exactly while the test acts, and a marker that a request is waiting.
pub struct Hold {
    inner: Arc<HoldInner>,
}

impl Hold {
    /// Wait (at most `secs`) until a request is held: whether one was.
    pub async fn arrived(&self, secs: u64) -> bool {
        let mut rx = self.inner.arrived.subscribe();
        let waited = tokio::time::timeout(
            std::time::Duration::from_secs(secs),
            rx.wait_for(|n| *n > 0),
        )
        .await;
        matches!(waited, Ok(Ok(_)))
    }

    /// Let every held request (and every later one) through.
    pub fn release(&self) {
        self.inner.released.send_replace(true);
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

impl FakeGitLab {
    /// Keep every `method` request to exactly `path` (e.g. `"GET"`,
    /// `"/api/v4/projects/101/terraform/state/slow"`) waiting until the returned hold is
    /// released or dropped.
    pub fn hold(&self, method: &str, path: &str) -> Hold {
        self.hold_after(method, path, 0)
    }

    /// [`FakeGitLab::hold`] from the request after the first `pass` ones: e.g. an engine's
    /// second read of a state (its `plan`'s, after its `init`'s).
    pub fn hold_after(&self, method: &str, path: &str, pass: u32) -> Hold {
        let inner = Arc::new(HoldInner {
            arrived: tokio::sync::watch::channel(0).0,
            released: tokio::sync::watch::channel(false).0,
            pass: std::sync::atomic::AtomicU32::new(pass),
        });
        self.lock()
            .holds
            .push((format!("{method} {path}"), inner.clone()));
        Hold { inner }
    }

    /// Answer the next `times` calls of `route` (e.g. `"POST /api/v4/projects/{id}/merge_requests/{iid}/notes"`)
    /// with `status` and a JSON error, then behave normally.
    pub fn fail_next(&self, route: &str, times: u32, status: u16) {
        self.lock().faults.insert(
            route.to_string(),
            Faults {
                remaining: times,
                status,
                retry_after: None,
                after_write: false,
            },
        );
    }

    /// Let the next `times` calls of `route` do their work (store the note, the issue, the
    /// status), then answer `status` — as when a proxy in front of GitLab times out or answers
    /// 502 after GitLab committed the write. A client cannot tell this from a failure before
    /// the write.
    pub fn fail_next_after_write(&self, route: &str, times: u32, status: u16) {
        self.lock().faults.insert(
            route.to_string(),
            Faults {
                remaining: times,
                status,
                retry_after: None,
                after_write: true,
            },
        );
    }

    /// Like [`FakeGitLab::fail_next`] with 429 and a `Retry-After: secs` header.
    pub fn rate_limit_next(&self, route: &str, times: u32, retry_after_secs: u64) {
        self.lock().faults.insert(
            route.to_string(),
            Faults {
                remaining: times,
                status: 429,
                retry_after: Some(retry_after_secs),
                after_write: false,
            },
        );
    }

    /// How many calls `route` received (failed ones included).
    pub fn calls(&self, route: &str) -> u32 {
        self.lock().calls.get(route).copied().unwrap_or(0)
    }

    /// All calls per route so far.
    pub fn all_calls(&self) -> BTreeMap<String, u32> {
        self.lock()
            .calls
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}
