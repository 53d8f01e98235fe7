//! CPU-bound steps of the async flows (lint, fingerprint, the note of a big plan), run so that
//! they do not hold up the other tasks of the worker they land on.
//!
//! On a 10,000-resource plan these steps take about half a second. In the service's
//! multi-threaded runtime the worker hands its other tasks (webhook answers among them) to the
//! other workers first ([`tokio::task::block_in_place`]); elsewhere (a current-thread runtime,
//! or no runtime) the work just runs.

use tokio::runtime::{Handle, RuntimeFlavor};

/// Run `work`, letting the runtime move this worker's other tasks elsewhere meanwhile.
pub fn cpu_bound<R>(work: impl FnOnce() -> R) -> R {
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

#[cfg(test)]
mod tests {
    use super::cpu_bound;

    #[test]
    fn a_task_queued_on_the_same_worker_runs_while_the_work_computes() {
        assert_eq!(cpu_bound(|| 1 + 1), 2);
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(current.block_on(async { cpu_bound(|| 2 + 1) }), 3);
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        // On a worker: a task spawned just before (queued on this very worker) runs while
        // this one computes.
        let answer = multi.block_on(async {
            tokio::spawn(async {
                let (tx, rx) = std::sync::mpsc::channel();
                let other = tokio::spawn(async move { tx.send("answered").unwrap() });
                let seen = cpu_bound(|| rx.recv_timeout(std::time::Duration::from_secs(5)).ok());
                other.await.unwrap();
                seen
            })
            .await
            .unwrap()
        });
        assert_eq!(answer, Some("answered"));
    }
}
