//! The queue's in-process signals: wake idle workers when jobs are added, cancel running jobs,
//! and count the jobs whose end is recorded.
//!
//! Jobs themselves live in the store (see `capabilities::store`); this is only the state that
//! lets the intake and the flows reach the workers without knowing them (the workers, which
//! dispatch jobs to the flows, are in [`crate::flows::service::worker`]).

use crate::capabilities::store::QueueJobId;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

/// Wakes workers, cancels running jobs, and marks each job's recorded end.
#[derive(Default)]
pub struct Queue {
    wake: Notify,
    running: Mutex<HashMap<QueueJobId, CancellationToken>>,
    /// How many jobs this process's workers have ended and recorded (done, failed, canceled).
    ended: watch::Sender<u64>,
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

    /// A worker recorded a job's end in the store (its flow's last word already said).
    pub(crate) fn job_ended(&self) {
        self.ended.send_modify(|n| *n += 1);
    }

    /// Hears each [`Queue::job_ended`]: its value is how many jobs this process has ended, and
    /// `changed()` wakes the moment the next one is recorded (no polling needed to wait for one).
    pub fn ended_jobs(&self) -> watch::Receiver<u64> {
        self.ended.subscribe()
    }

    /// The job stopped running.
    pub(crate) fn unregister(&self, id: QueueJobId) {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}
