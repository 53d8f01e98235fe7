//! The plan run of one MR head, in named stages (docs/architecture.md: "One webhook becomes a
//! note"):
//! [`prepare`] → [`roots`] → [`note`] → [`record`] → the final status.
//!
//! 1. [`prepare::prepare`]: status `planbot/plan` pending → running; mirror fetch;
//!    `.planbot.toml` from the DEFAULT branch (invalid ⇒ a note saying what is wrong, status
//!    failed); the commit to plan (GitLab's merge result or the head, said in the note); the
//!    changed files against the merge base; the checkout and the MR's sandboxed engine.
//! 2. [`roots::plan_roots`]: per affected root (serialised with other plans/applies of it): the
//!    engine's plan in a private dir, the Proxmox preflight, lint, a stored run.
//! 3. [`note::compose_note`] and [`note::upsert_note`]: ONE note, upserted by its marker.
//! 4. [`record::record`]: runs, fingerprints and digests stored once the note is up, and
//!    [`widgets::record`] what GitLab's MR widgets show of each clean plan.
//! 5. [`record::final_status`]: success/failed with a one-line description and the run page.

mod note;
mod prepare;
mod reach;
mod record;
mod roots;
mod widgets;

pub use note::upsert_note;

use crate::capabilities::gitlab::{CommitStatus, GitLabError, StatusState};
use crate::capabilities::store::{NewRun, QueueJobId, RunEnd, RunKind, RunState};
use crate::core::engine_checks::TestsStatus;
use crate::core::events::PlanJob;
use crate::core::ids::{CommitSha, ProjectId, RunId};
use crate::core::redact::Scrubber;
use crate::core::render::NoteContext;
use crate::flows::context::app_state::App;
use crate::flows::context::metrics::PlanOutcome;
use anyhow::Result;
use prepare::Prepared;
use roots::Outcome;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// One line of the plan flow (`kind` selects it in `templates/plan_status.txt.j2`): its values
/// scrubbed with `scrubber`, its words as written (no secret alters a status description).
fn text(scrubber: &Scrubber, kind: &str, ctx: minijinja::Value) -> String {
    let ctx = minijinja::context! { kind => kind, ..ctx };
    crate::core::templates::scrubbing(scrubber, || {
        crate::core::templates::render("plan_status.txt.j2", ctx)
            .map(|t| t.trim().to_string())
            .unwrap_or_else(|e| format!("planbot: {kind} ({e})"))
    })
}

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
        set_status(
            app,
            job.project,
            &job.head,
            StatusState::Failed,
            &text(
                &app.scrubber,
                "error",
                minijinja::context! { error => minijinja::Value::from_safe_string(error) },
            ),
            None,
            None,
        )
        .await;
    }
    result.map(|_| ())
}

/// A run that ends before planning, with its outcome for the metrics and the log.
struct Stop(pub PlanOutcome);

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
    let planned = roots::plan_roots(app, job, queue_job, &prepared, cancel, runs).await?;
    if cancel.is_cancelled() {
        return superseded(app, job, &prepared, &planned.results).await;
    }

    // The note: one scrubber over every known secret, the plans' included.
    let scrubber = note::scrubber_for(app.config.secrets(), &planned.results);
    let first_run = planned.results.iter().find_map(|r| match &r.outcome {
        Outcome::Planned { run, .. } | Outcome::Failed { run, .. } => Some(*run),
        Outcome::Skipped { .. } => None,
    });
    let run_url = first_run.and_then(|r| app.run_url(r));
    // The reached roots upstream first, with the arrows of their picture.
    let reach_order = crate::core::reach::in_order(&prepared.config.graph(), planned.reach.clone());
    let ctx = NoteContext {
        sha: Some(prepared.commit.sha.as_str().to_string()),
        draft: prepared.mr.draft,
        engine: prepared.version.clone(),
        duration: Some(started.elapsed()),
        run_url: run_url.clone(),
        run_hint: first_run.and_then(|r| app.run_hint(r)),
        banners: note::targeted_banners(&planned.results, &scrubber)
            .into_iter()
            .chain(prepared.banners.iter().cloned())
            .collect(),
        preflight_note: Some(planned.preflight_notes.join(" · ")).filter(|n| !n.is_empty()),
        capacity: planned.capacity.clone(),
        reach: reach_order.0,
        root_edges: reach_order.1,
        depends_hints: planned.depends_hints.clone(),
        hints: note::sandbox_hints(app, &planned.results),
        planned_before: note::planned_before(&prepared.config, &planned.results),
        invalid_file: prepared
            .proposed_invalid
            .as_ref()
            .map(|_| crate::core::repo_config::FILE_NAME.to_string()),
        ..NoteContext::default()
    };
    let policies = note::policy_verdicts(&prepared.policies, &planned.results, &scrubber);
    let approvals = if policies.iter().any(|(_, _, v)| !v.sets.is_empty()) {
        app.store.policy_approvals(job.project, job.mr).await?
    } else {
        Vec::new()
    };
    let ctx = NoteContext {
        policies: note::policy_sections(&policies, &job.head, &approvals, &prepared.policies),
        ..ctx
    };
    let body = note::compose_note(ctx, &planned.results, &scrubber);
    note::upsert_note(app, job.project, job.mr, &body).await?;
    let tests = TestsStatus::of(
        planned
            .results
            .iter()
            .filter_map(|r| note::root_checks(r).map(|c| (r.name.as_str(), c))),
    );

    let widgets = widgets::compute(&prepared, &planned.results, &policies, &scrubber).await;
    let recorded = record::record(
        app,
        job,
        planned.results,
        &policies,
        &body,
        &scrubber,
        prepared.proposed_invalid.is_some(),
    )
    .await?;
    widgets::record(app, job, widgets).await?;
    drop(prepared.checkout);

    let (state, description) = match &prepared.proposed_invalid {
        // The MR breaks `.planbot.toml`: merged as is, nothing could be planned.
        Some(err) => (
            StatusState::Failed,
            text(
                &app.scrubber,
                "invalid_proposed",
                minijinja::context! {
                    file => crate::core::repo_config::FILE_NAME,
                    problem => err.problems.first().map(|p| p.to_string()).unwrap_or_default(),
                    more => err.problems.len().saturating_sub(1),
                },
            ),
        ),
        None => record::final_status(&recorded, &app.scrubber),
    };
    set_status(
        app,
        job.project,
        &job.head,
        state,
        &description,
        run_url,
        prepared.status_ref.clone(),
    )
    .await;
    if let Some(tests) = &tests {
        set_test_status(
            app,
            job.project,
            &job.head,
            tests,
            prepared.status_ref.clone(),
        )
        .await;
    }
    crate::flows::review::policies::set_status(
        app,
        job.project,
        &job.head,
        prepared.status_ref,
        &policies,
        &approvals,
    )
    .await;
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
    set_status(
        app,
        job.project,
        &job.head,
        StatusState::Failed,
        &text(
            &app.scrubber,
            "past_deadline",
            minijinja::context! { limit => limit },
        ),
        None,
        None,
    )
    .await;
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
    set_status(
        app,
        job.project,
        &job.head,
        StatusState::Canceled,
        &why,
        None,
        prepared.status_ref.clone(),
    )
    .await;
    Ok(PlanOutcome::Canceled)
}

fn gl<T>(app: &App, op: &str, r: Result<T, GitLabError>) -> Result<T> {
    r.map_err(|e| {
        app.metrics.gitlab_error(op);
        anyhow::Error::new(e).context(op.to_string())
    })
}

async fn set_status(
    app: &App,
    project: ProjectId,
    sha: &CommitSha,
    state: StatusState,
    description: &str,
    target_url: Option<String>,
    ref_: Option<String>,
) {
    // Planbot's text, its values scrubbed when it was rendered ([`text`]).
    let status = CommitStatus {
        state,
        name: crate::core::commit_status::PLAN.into(),
        description: Some(description.to_string()),
        target_url,
        ref_,
        pipeline_id: None,
    };
    if let Err(e) = app.gitlab.set_commit_status(project, sha, &status).await {
        app.metrics.gitlab_error("set_commit_status");
        tracing::warn!(project = project.0, sha = %sha.short(), error = %e, "could not set the commit status");
    }
}

/// `planbot/test`: success when every root's tests ran and passed, failed when one failed,
/// errored or did not run; the description counts them. Only called when a root has tests.
async fn set_test_status(
    app: &App,
    project: ProjectId,
    sha: &CommitSha,
    tests: &TestsStatus,
    ref_: Option<String>,
) {
    let description = text(&app.scrubber, "tests", minijinja::context! { t => tests });
    let status = CommitStatus {
        state: if tests.ok {
            StatusState::Success
        } else {
            StatusState::Failed
        },
        name: crate::core::commit_status::TEST.into(),
        description: Some(description.chars().take(255).collect()),
        target_url: None,
        ref_,
        pipeline_id: None,
    };
    if let Err(e) = app.gitlab.set_commit_status(project, sha, &status).await {
        app.metrics.gitlab_error("set_commit_status");
        tracing::warn!(project = project.0, sha = %sha.short(), error = %e, "could not set the test status");
    }
}

/// End a run (scrubbed); returns what was recorded, so it can be recorded again with the note.
async fn finish(
    app: &App,
    run: RunId,
    state: RunState,
    summary: &str,
    log: &str,
    note: Option<String>,
) -> Result<RunEnd> {
    let end = RunEnd {
        state,
        summary: Some(app.scrubber.scrub(summary).into_owned()),
        log: app.scrubber.scrub(log).into_owned(),
        note_markdown: note,
        fingerprint: None,
    };
    app.store.finish_run(run, end.clone()).await?;
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::context;

    #[test]
    fn status_and_commit_texts_come_from_the_template() {
        let none = Scrubber::none();
        let all = [
            text(&none, "queued", context! {}),
            text(&none, "planning", context! { roots => "" }),
            text(&none, "superseded", context! {}),
            text(&none, "closed", context! {}),
            text(&none, "no_root", context! {}),
            text(
                &none,
                "error",
                context! { error => "fetching the repository: git fetch failed" },
            ),
            text(&none, "past_deadline", context! { limit => "2h" }),
            text(
                &none,
                "invalid_config",
                context! { file => ".planbot.toml", branch => "main", problem => "line 3, column 1: key `roots[0].directory`: unknown key" },
            ),
            text(
                &none,
                "invalid_proposed",
                context! { file => ".planbot.toml", problem => "line 6, column 1: key `roots[0].when_modifed`: unknown key `when_modifed`", more => 2 },
            ),
            text(
                &none,
                "result",
                context! { roots => vec![
                    context! { name => "core", state => "planned", summary => "1 to add, 0 to change, 0 to destroy", targeted => "1 excluded" },
                    context! { name => "edge", state => "planned", summary => "no changes", targeted => "" },
                ] },
            ),
            text(
                &none,
                "result",
                context! { roots => vec![
                    context! { name => "core", state => "planned", summary => "1 to add, 0 to change, 0 to destroy" },
                    context! { name => "dns", state => "failed" },
                    context! { name => "edge", state => "errored" },
                ] },
            ),
            text(
                &none,
                "tests",
                context! { t => TestsStatus { ok: true, roots: 2, passed: 7, skipped: 1, ..TestsStatus::default() } },
            ),
            text(
                &none,
                "tests",
                context! { t => TestsStatus { ok: false, roots: 1, passed: 1, failed: 1, failing: vec!["core".into()], not_run: vec!["dns".into()], ..TestsStatus::default() } },
            ),
            text(
                &none,
                "tests",
                context! { t => TestsStatus { ok: false, not_run: vec!["dns".into()], ..TestsStatus::default() } },
            ),
            text(
                &none,
                "commit_line",
                context! { planned => "merge", sha => "5717fb1e", head => "e4cd905a", target => "main", reason => None::<String> },
            ),
            text(
                &none,
                "commit_line",
                context! { planned => "head", sha => "e4cd905a", head => "e4cd905a", target => "main", reason => "the MR has conflicts, or GitLab has not computed its merge result yet" },
            ),
            text(
                &none,
                "commit_line",
                context! { planned => "head", sha => "e4cd905a", head => "e4cd905a", target => "main", reason => None::<String> },
            ),
        ];
        for t in &all {
            assert!(!t.is_empty() && !t.contains('\n'), "one line each: {t:?}");
            assert!(t.chars().count() <= 255 || t.starts_with('_'), "{t}");
        }
        insta::assert_snapshot!("plan_status_texts", all.join("\n"));
    }
}
