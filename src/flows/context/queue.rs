//! The queue's in-process signals: wake idle workers when jobs are added, and cancel running jobs.
//!
//! Jobs themselves live in the store (see `capabilities::store`); this is only the state that
//! lets the intake and the flows reach the workers without knowing them (the workers, which
//! dispatch jobs to the flows, are in [`crate::flows::service::worker`]).

use crate::capabilities::store::QueueJobId;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Wakes workers and cancels running jobs.
#[derive(Default)]
pub struct Queue {
    wake: Notify,
    running: Mutex<HashMap<QueueJobId, CancellationToken>>,
}

impl Queue {
    pub fn new() -> Queue {
        Queue::default()
    }

    /// New jobs are in the store: wake up to `n` idle workers.
    pub fn jobs_added(&self, n: usize) {
        for _ in 0..n {
            self.wake.notify_one();
        }
    }

    /// Fire the tokens of these running jobs (superseded or closed). Unknown ids are ignored:
    /// a worker that claims a job re-checks its state after registering the token.
    pub fn cancel(&self, ids: &[QueueJobId]) {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            if let Some(t) = running.get(id) {
                tracing::info!(job = id.0, "cancelling superseded job");
                t.cancel();
            }
        }
    }

    /// Wait until [`Queue::jobs_added`] wakes this worker.
    pub(crate) async fn woken(&self) {
        self.wake.notified().await
    }

    /// How many jobs are running right now.
    pub fn running(&self) -> usize {
        self.running.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// A worker starts running this job: its cancellation token.
    pub(crate) fn register(&self, id: QueueJobId) -> CancellationToken {
        let t = CancellationToken::new();
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, t.clone());
        t
    }

    /// The job stopped running.
    pub(crate) fn unregister(&self, id: QueueJobId) {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}
