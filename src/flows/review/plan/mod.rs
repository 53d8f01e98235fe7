//! The plan run of one MR head, in named stages (docs/architecture.md: "One webhook becomes a
//! note"): this `mod.rs` calls them in order; each imports only those before it and [`shared`].
//! [`prepare`] → [`roots`] (with [`reach`]) → [`note`] → [`record`] (with [`widgets`]).
//!
//! 1. [`prepare::prepare`]: status `planbot/plan` pending → running; mirror fetch;
//!    `.planbot.toml` from the DEFAULT branch (invalid ⇒ a note saying what is wrong, status
//!    failed); the commit to plan (GitLab's merge result or the head, said in the note); the
//!    changed files against the merge base; the checkout and the MR's sandboxed engine.
//! 2. [`roots::plan_roots`]: which roots the changes reach ([`reach::decide`]); per affected
//!    root (serialised with other plans/applies of it): the engine's plan in a private dir, the
//!    Proxmox preflight, lint, the policy sets, a stored run.
//! 3. [`note::post`]: ONE note, upserted by its marker ([`shared::upsert_note`]).
//! 4. [`record::record`]: runs, fingerprints and digests stored once the note is up, and
//!    [`widgets::record`] what GitLab's MR widgets show of each clean plan.
//! 5. [`record::set_statuses`]: `planbot/plan` success/failed with a one-line description and
//!    the run page, `planbot/test`, `planbot/policy`.

mod note;
mod prepare;
mod reach;
mod record;
mod reuse;
mod roots;
mod shared;
mod unit;
mod units;
mod widgets;

use crate::capabilities::gitlab::StatusState;
use crate::capabilities::store::{NewRun, QueueJobId, RunKind, RunState};
use crate::core::events::PlanJob;
use crate::core::ids::RunId;
use crate::flows::context::app_state::App;
use crate::flows::context::metrics::PlanOutcome;
use anyhow::Result;
use prepare::{Prepared, Stop};
use roots::Outcome;
use shared::{finish, set_status, text};
use std::time::Instant;
use tokio_util::sync::CancellationToken;
pub use unit::run as run_root_unit;

/// Plan `job` (one MR at one head commit). Stops promptly (killing the engine) when `cancel`
/// fires: a newer head superseded this one, or the MR was closed. `queue_job` is the store's
/// job it runs for (its runs name it, so that a replica taking the job over from a dead one
/// ends them `interrupted`); `None` when planning outside the queue.
pub async fn run(
    app: &App,
    job: &PlanJob,
    queue_job: Option<QueueJobId>,
    cancel: &CancellationToken,
) -> Result<()> {
    let started = Instant::now();
    let mut runs: Vec<RunId> = Vec::new();
    let result = plan(app, job, queue_job, cancel, &mut runs).await;
    let outcome = match &result {
        Ok(o) => *o,
        Err(_) => PlanOutcome::Error,
    };
    app.metrics.plan_finished(started.elapsed(), outcome);
    let (project, mr, sha) = (job.project.0, job.mr.0, job.head.short());
    let duration_ms = started.elapsed().as_millis() as u64;
    match &result {
        Ok(_) => tracing::info!(project, mr, sha, %outcome, duration_ms, "plan finished"),
        Err(e) => {
            let error = app.scrubber.scrub(&format!("{e:#}")).into_owned();
            tracing::warn!(project, mr, sha, %outcome, duration_ms, error = %error, "plan could not finish");
        }
    }
    if let Err(e) = &result {
        // Whatever broke, the MR must not keep a `running` status forever.
        let error = app.scrubber.scrub(&format!("{e:#}")).into_owned();
        if runs.is_empty() {
            // Before any root ran: one failed run for the MR head, so the run pages show why.
            let run = app
                .store
                .start_run(NewRun {
                    job: queue_job,
                    kind: RunKind::Plan,
                    project: job.project,
                    project_path: job.project_path.clone(),
                    mr: Some(job.mr),
                    root: ".".into(),
                    sha: job.head.clone(),
                })
                .await;
            if let Ok(run) = run {
                let _ = finish(app, run, RunState::Failed, &error, "", None).await;
            }
        }
        let error = minijinja::Value::from_safe_string(error);
        let line = text(
            &app.scrubber,
            "error",
            minijinja::context! { error => error },
        );
        set_status(app, job, StatusState::Failed, &line, None, None).await;
    }
    result.map(|_| ())
}

/// The whole run, stage by stage; returns how it ended.
async fn plan(
    app: &App,
    job: &PlanJob,
    queue_job: Option<QueueJobId>,
    cancel: &CancellationToken,
    runs: &mut Vec<RunId>,
) -> Result<PlanOutcome> {
    let started = Instant::now();
    let prepared = match prepare::prepare(app, job).await? {
        Ok(p) => p,
        Err(Stop(outcome)) => return Ok(outcome),
    };
    let mut planned = roots::plan_roots(app, job, queue_job, &prepared, cancel, runs).await?;
    if cancel.is_cancelled() {
        return superseded(app, job, &prepared, &planned.results).await;
    }
    let note = note::post(app, job, &prepared, &planned, started.elapsed()).await?;
    let widgets = widgets::compute(&prepared, &planned.results, &note).await;
    let blocked = prepared.proposed_invalid.is_some();
    let to_keep = std::mem::take(&mut planned.to_keep);
    let mut recorded = record::record(app, job, planned.results, &note, blocked).await?;
    for (root, kept) in &to_keep {
        let scrubber = &note.scrubber;
        crate::flows::context::plan_reuse::keep(app, job.project, job.mr, root, kept, scrubber)
            .await;
    }
    recorded.in_no_root = planned.in_no_root.len();
    widgets::record(app, job, widgets).await?;
    drop(prepared.checkout);
    let invalid = prepared.proposed_invalid.as_ref();
    let state =
        record::set_statuses(app, job, &recorded, &note, &prepared.status_ref, invalid).await;
    Ok(if state == StatusState::Success {
        PlanOutcome::Succeeded
    } else {
        PlanOutcome::Failed
    })
}

/// The job ran past `plan.job_timeout` and was stopped: the head's status says so (after the
/// flow's own last word, which took the stop for a supersede).
pub(crate) async fn past_deadline(app: &App, job: &PlanJob, limit: std::time::Duration) {
    let limit = humantime::format_duration(limit).to_string();
    let line = text(
        &app.scrubber,
        "past_deadline",
        minijinja::context! { limit => limit },
    );
    set_status(app, job, StatusState::Failed, &line, None, None).await;
}

/// A newer head or the MR's close cancelled the run: its runs end canceled and the status
/// says which of the two stopped it (GitLab is asked: a closed or merged MR was closed, else a
/// newer commit superseded it); no note is posted for this head.
async fn superseded(
    app: &App,
    job: &PlanJob,
    prepared: &Prepared,
    results: &[roots::RootResult],
) -> Result<PlanOutcome> {
    let closed = match app.gitlab.merge_request(job.project, job.mr).await {
        Ok(mr) => mr.state != "opened",
        Err(e) => {
            app.metrics.gitlab_error("merge_request");
            tracing::warn!(project = job.project.0, mr = job.mr.0, error = %e, "could not tell why the plan was stopped");
            false
        }
    };
    let why = text(
        &app.scrubber,
        if closed { "closed" } else { "superseded" },
        minijinja::context! {},
    );
    for r in results {
        match &r.outcome {
            Outcome::Planned { run, .. } => {
                finish(app, *run, RunState::Canceled, &why, "", None).await?;
            }
            // The engine stopped by the cancel: its run says why it was stopped.
            Outcome::Failed { run, end, .. } if end.state == RunState::Canceled => {
                finish(app, *run, RunState::Canceled, &why, &end.log, None).await?;
            }
            _ => {}
        }
    }
    let status_ref = prepared.status_ref.clone();
    set_status(app, job, StatusState::Canceled, &why, None, status_ref).await;
    Ok(PlanOutcome::Canceled)
}
