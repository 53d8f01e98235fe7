//! The drift schedule inside `planbot serve`: every replica looks at the clock at each
//! occurrence of `[drift] schedule`, and the one whose store write claims the occurrence's tick
//! queues it as a `drift_tick` job, which a worker runs exactly as `planbot drift` would. A tick
//! missed while every replica was down is claimed once at start-up (the latest one only).

use super::check::{self, Selection};
use crate::capabilities::engine::CancelToken;
use crate::core::drift_schedule::Due;
use crate::flows::context::app_state::App;
use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The longest the scheduler sleeps without looking at the clock again (a clock set forward or
/// back moves the occurrences; the sleep does not follow it).
const LOOK_AT_LEAST_EVERY: Duration = Duration::from_secs(3600);

/// After a failed look (the store unreachable), the next one.
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// One look at the clock: claim and queue the tick that is due, if any (and not claimed by
/// another replica); says when to look next (`None`: drift is off, or the schedule never fires
/// again). `started`: this replica's start, what "the last tick" is when none was ever claimed,
/// so a first start runs nothing before the schedule's next occurrence.
pub async fn look(
    app: &App,
    started: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>> {
    let Some(schedule) = &app.config.drift.schedule else {
        return Ok(None);
    };
    let last = app
        .store
        .last_drift_tick()
        .await
        .context("reading the last drift tick")?;
    let since = last
        .and_then(DateTime::<Utc>::from_timestamp_millis)
        .unwrap_or(started);
    match schedule.due(since, now) {
        Due::WaitUntil(next) => Ok(next),
        Due::Run(at) => {
            let claimed = app
                .store
                .claim_drift_tick(at.timestamp_millis())
                .await
                .context("claiming the drift tick")?;
            match claimed {
                Some(job) => {
                    tracing::info!(job = job.0, tick = %schedule.local(at), "drift check queued");
                    app.queue.jobs_added(1);
                }
                None => {
                    tracing::debug!(tick = %schedule.local(at), "drift tick claimed by another replica")
                }
            }
            Ok(schedule.next_after(now))
        }
    }
}

/// Look at the clock at every occurrence until `shutdown`, from `next` (what the start-up's
/// [`look`] said: `None`, the schedule never fires).
pub async fn keep(
    app: Arc<App>,
    started: DateTime<Utc>,
    mut next: Option<DateTime<Utc>>,
    shutdown: CancellationToken,
) {
    while let Some(at) = next {
        let wait = (at - Utc::now()).to_std().unwrap_or_default();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait.min(LOOK_AT_LEAST_EVERY)) => {}
        }
        next = match look(&app, started, Utc::now()).await {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "the drift schedule could not look at the store; trying again");
                Some(Utc::now() + RETRY_AFTER)
            }
        };
    }
}

/// Run one claimed tick (a `drift_tick` job): every root, as `planbot drift` does, writing
/// issues, statuses and runs.
pub async fn run_tick(app: &App, at: i64, cancel: &CancellationToken) -> Result<()> {
    // Bridge the queue's cancellation to the engine's (SIGTERM, grace, SIGKILL).
    let (token, _following) = CancelToken::following(cancel);
    let selection = Selection {
        cancel: Some(token),
        ..Selection::default()
    };
    let tick = check::tick(app, &selection, std::time::SystemTime::now())
        .await
        .with_context(|| format!("the drift check of tick {at}"))?;
    let drifted = tick
        .roots
        .iter()
        .filter(|r| r.verdict.exit_code() == 2)
        .count();
    tracing::info!(
        roots = tick.roots.len(),
        drifted,
        projects_not_checked = tick.failed.len(),
        "drift check done"
    );
    Ok(())
}
