//! The queue's workers: a bounded pool that claims jobs from the store, dispatches each to its
//! flow (`Job::Plan` → [`crate::flows::review::plan`], the others → [`crate::flows::review::commands`])
//! and honours cancellation and the job deadline.
//!
//! Fair share: a worker claims the oldest job of an author and an MR that hold fewer than
//! `plan.workers_per_author` running jobs (default: all workers but one), so one author's slow
//! plans never hold every worker while someone else's MR waits for its note.

use crate::capabilities::store::{ClaimedJob, JobEnd, Lease, QueueJobState};
use crate::core::events::Job;
use crate::flows::context::app_state::App;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// How long an idle worker sleeps before looking at the store again without being woken.
const IDLE_POLL: Duration = Duration::from_secs(2);

/// Start `n` workers; they stop when `shutdown` fires (running jobs are cancelled and stay
/// `running` in the store, so the next start re-runs them).
pub fn spawn_workers(app: Arc<App>, n: usize, shutdown: CancellationToken) -> Vec<JoinHandle<()>> {
    let mut workers: Vec<JoinHandle<()>> = (0..n)
        .map(|i| {
            let app = app.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { worker(app, i, shutdown).await })
        })
        .collect();
    if let Some(notices) = app.store.job_notices() {
        workers.push(tokio::spawn(wake_on_notices(app, n, notices, shutdown)));
    }
    workers
}

/// On a shared store: a job enqueued on any replica (a hook another replica took, a root unit
/// of another replica's plan job) wakes this replica's idle workers at once.
async fn wake_on_notices(
    app: Arc<App>,
    workers: usize,
    mut notices: tokio::sync::watch::Receiver<u64>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            changed = notices.changed() => {
                if changed.is_err() {
                    return;
                }
                app.queue.jobs_added(workers);
            }
            _ = shutdown.cancelled() => return,
        }
    }
}

async fn worker(app: Arc<App>, index: usize, shutdown: CancellationToken) {
    tracing::debug!(worker = index, "worker started");
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let share = app.config.plan.workers_per_author;
        let claimed = match app.store.claim_within(share).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "cannot claim a job from the store");
                None
            }
        };
        match claimed {
            Some(job) => run_claimed(&app, job, &shutdown).await,
            None => {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = app.queue.woken() => {}
                    _ = tokio::time::sleep(IDLE_POLL) => {}
                }
            }
        }
    }
}

async fn run_claimed(app: &Arc<App>, claimed: ClaimedJob, shutdown: &CancellationToken) {
    let watch = Watch::start(app, &claimed).await;
    announce_start(app, &claimed).await;
    let started = Instant::now();
    let ran = run_to_its_end(app, &claimed, &watch.token, shutdown).await;
    watch.stop(app);
    let id = claimed.id;
    let Some(ran) = ran else {
        tracing::info!(
            job = id.0,
            kind = claimed.job.kind(),
            "job stopped by the shutdown: it runs again at the next start"
        );
        return;
    };
    if watch.lost.is_cancelled() {
        // Another replica owns the job now: its end is that replica's to record.
        tracing::warn!(
            job = id.0,
            kind = claimed.job.kind(),
            "job left to the replica that took it over"
        );
        return;
    }
    let end = job_end(app, &claimed, ran, &watch.token).await;
    record_end(app, &claimed, end, started).await;
}

/// What watches a running job: its cancel token (in the queue's registry), and on a shared
/// store the heartbeat that renews its lease and `lost`, fired when another replica took it.
struct Watch {
    id: crate::capabilities::store::QueueJobId,
    token: CancellationToken,
    lost: CancellationToken,
    heartbeat: Option<JoinHandle<()>>,
}

impl Watch {
    async fn start(app: &Arc<App>, claimed: &ClaimedJob) -> Watch {
        let id = claimed.id;
        let token = app.queue.register(id);
        // Superseded between the claim and the registration: the store already says canceled.
        if let Ok(Some(row)) = app.store.job(id).await {
            if row.queue_state() == Ok(QueueJobState::Canceled) {
                token.cancel();
            }
        }
        // Shared store (PostgreSQL): renew the job's lease, and hear of a cancel made on any
        // replica.
        let lost = CancellationToken::new();
        let heartbeat = app.store.heartbeat_every().map(|every| {
            let (app, token, lost) = (app.clone(), token.clone(), lost.clone());
            tokio::spawn(async move { heartbeat(&app, id, every, &token, &lost).await })
        });
        Watch {
            id,
            token,
            lost,
            heartbeat,
        }
    }

    /// The job's run is over: no more heartbeat, and out of the metrics' and queue's running.
    fn stop(&self, app: &App) {
        if let Some(h) = &self.heartbeat {
            h.abort();
        }
        app.metrics.job_finished();
        app.queue.unregister(self.id);
    }
}

/// Count the job as started and say so in the log.
async fn announce_start(app: &App, claimed: &ClaimedJob) {
    app.metrics.job_started();
    if let Ok(depth) = app.store.queue_depth().await {
        app.metrics.set_queue_depth(depth);
    }
    let mr = claimed.job.mr();
    tracing::info!(
        job = claimed.id.0,
        kind = claimed.job.kind(),
        project = mr.map(|m| m.0 .0),
        mr = mr.map(|m| m.1 .0),
        sha = claimed.job.sha().map(|s| s.short()),
        attempt = claimed.attempts,
        "job started"
    );
}

/// How a job's run ended (unless the service stopped it).
enum Ran {
    /// Its flow returned (`Ok` too when a cancelled job did not stop in time and was dropped).
    Returned(anyhow::Result<()>),
    /// Stopped at the whole job's deadline (`plan.job_timeout`).
    PastDeadline,
}

/// Run the job's flow until it returns, its deadline passes, it is cancelled (then it has
/// the grace period to stop by itself) or the service stops (`None`: the job stays `running`
/// in the store, for the next start).
async fn run_to_its_end(
    app: &Arc<App>,
    claimed: &ClaimedJob,
    token: &CancellationToken,
    shutdown: &CancellationToken,
) -> Option<Ran> {
    let id = claimed.id;
    let span = tracing::info_span!(
        "job",
        id = id.0,
        kind = claimed.job.kind(),
        attempt = claimed.attempts
    );
    let job = dispatch(app, &claimed.job, id, token).instrument(span);
    tokio::pin!(job);
    tokio::select! {
        r = &mut job => Some(Ran::Returned(r)),
        _ = tokio::time::sleep(app.config.plan.job_timeout) => {
            // The whole job's deadline: stopped as a cancel stops it (the engine gets SIGTERM,
            // then SIGKILL after the grace period), then recorded failed, saying why.
            tracing::warn!(job = id.0, kind = claimed.job.kind(), "job ran past its deadline; stopping it");
            token.cancel();
            if tokio::time::timeout(cancel_grace(app), &mut job).await.is_err() {
                tracing::warn!(job = id.0, "job past its deadline did not stop in time; dropped");
            }
            Some(Ran::PastDeadline)
        }
        _ = token.cancelled() => {
            // Superseded or closed: the flow stops on its own (killing the engine, marking its
            // status canceled); if it does not within the grace period, it is dropped.
            match tokio::time::timeout(cancel_grace(app), &mut job).await {
                Ok(r) => Some(Ran::Returned(r)),
                Err(_) => {
                    tracing::warn!(job = id.0, "cancelled job did not stop in time; dropped");
                    Some(Ran::Returned(Ok(())))
                }
            }
        }
        _ = shutdown.cancelled() => {
            // Stopping: let the job be re-run by the next start (it stays `running` in the store).
            token.cancel();
            None
        }
    }
}

/// The end of a job that ran to it, as the store records it (a plan past its deadline also
/// says so on its MR).
async fn job_end(
    app: &Arc<App>,
    claimed: &ClaimedJob,
    ran: Ran,
    token: &CancellationToken,
) -> JobEnd {
    match ran {
        Ran::PastDeadline => {
            let limit = app.config.plan.job_timeout;
            let why = format!(
                "stopped after the job deadline of {} (plan.job_timeout)",
                humantime::format_duration(limit)
            );
            if let Job::Plan(p) = &claimed.job {
                crate::flows::review::plan::past_deadline(app, p, limit).await;
            }
            JobEnd::Failed(why)
        }
        _ if token.is_cancelled() => JobEnd::Canceled("superseded or closed while running".into()),
        Ran::Returned(Ok(())) => JobEnd::Done,
        Ran::Returned(Err(e)) => {
            let msg = app.scrubber.scrub(&format!("{e:#}")).into_owned();
            tracing::warn!(job = claimed.id.0, kind = claimed.job.kind(), error = %msg, "job failed");
            JobEnd::Failed(msg)
        }
    }
}

/// Record the job's end in the store and the log, and let the queue hand out what waited for
/// its share.
async fn record_end(app: &App, claimed: &ClaimedJob, end: JobEnd, started: Instant) {
    let id = claimed.id;
    let state = match &end {
        JobEnd::Done => "done",
        JobEnd::Failed(_) => "failed",
        JobEnd::Canceled(_) => "canceled",
    };
    tracing::info!(
        job = id.0,
        kind = claimed.job.kind(),
        state,
        duration_ms = started.elapsed().as_millis() as u64,
        "job finished"
    );
    if let Err(e) = app.store.finish_job(id, end).await {
        tracing::error!(job = id.0, error = %format!("{e:#}"), "cannot record the end of a job");
    }
    app.queue.job_ended();
    // Its author and its MR hold one job fewer: a job that waited for that share may be taken
    // by an idle worker now (this one takes the next it can by itself).
    app.queue.jobs_added(1);
}

/// Every `every`, renew this replica's lease of job `id`; fire `token` when the job was
/// canceled meanwhile (`lost` too when another replica took it).
async fn heartbeat(
    app: &App,
    id: crate::capabilities::store::QueueJobId,
    every: Duration,
    token: &CancellationToken,
    lost: &CancellationToken,
) {
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        match app.store.heartbeat(id).await {
            Ok(Lease::Held) => {}
            Ok(Lease::Canceled) => {
                tracing::info!(
                    job = id.0,
                    "job canceled in the store (superseded or closed); stopping it"
                );
                token.cancel();
                return;
            }
            Ok(Lease::Lost) => {
                tracing::warn!(
                    job = id.0,
                    "job's lease was lost to another replica; stopping it"
                );
                lost.cancel();
                token.cancel();
                return;
            }
            Err(e) => {
                tracing::warn!(job = id.0, error = %format!("{e:#}"), "job heartbeat failed");
            }
        }
    }
}

/// How long a cancelled job may take to stop by itself: the engine's SIGTERM→SIGKILL grace plus a margin.
fn cancel_grace(app: &App) -> Duration {
    app.config.engine.grace + Duration::from_secs(2)
}

async fn dispatch(
    app: &Arc<App>,
    job: &Job,
    id: crate::capabilities::store::QueueJobId,
    token: &CancellationToken,
) -> anyhow::Result<()> {
    match job {
        Job::Plan(p) => crate::flows::review::plan::run(app, p, Some(id), token).await,
        Job::PlanRoot(u) => crate::flows::review::plan::run_root_unit(app, u, id, token).await,
        Job::DriftTick { at } => crate::flows::drift::schedule::run_tick(app, *at, token).await,
        other => crate::flows::review::commands::run(app, other, token).await,
    }
}
