//! Apply stage 6: the result on every surface — the stored apply, the MR note, the
//! `planbot/apply` commit status, and an issue when it failed (if configured); and, at start-up,
//! an apply a crash left running reported as interrupted.

use super::ctx::ApplyCtx;
use super::decide::Decided;
use super::log::{say, Verdict};
use crate::capabilities::gitlab::{CommitStatus, StatusState};
use crate::capabilities::store::{ApplyId, ApplyRecord, ApplyState, RunState};
use crate::core::apply_note::{render_result, ApplyOutcome, Relied, ResultNote, RootResult};
use crate::core::commit_status;
use crate::core::markdown::fence_for;
use crate::flows::context::app_state::App;
use minijinja::context;

/// The roots an apply left changes in, and those it could not check (the status text leads
/// with them).
#[derive(Debug, Default)]
pub(super) struct Left {
    pub changes: Vec<String>,
    pub unknown: Vec<String>,
}

/// How the apply ended, for the report: each root's line, the verdict, and what the stages
/// found on the way.
pub(super) struct Ending {
    pub results: Vec<RootResult>,
    pub verdict: Verdict,
    /// The failure's text or the engine's report, for the note and the failure issue.
    pub error: Option<String>,
    /// The policy verdicts and approvals the apply relied on, in the order the log said them.
    pub relied: Vec<Relied>,
    pub left: Left,
}

/// Record, note, status after a failure before any apply ran (the roots decided so far, and
/// the reliances their decisions said).
pub(super) async fn finish(
    ctx: &ApplyCtx,
    apply_id: ApplyId,
    decided: &[Decided],
    relied: &[Relied],
    verdict: &Verdict,
    error: Option<&str>,
) {
    let canceled = ctx.say("other_root_failed", context! {});
    for d in decided {
        ctx.end_run(d.run, RunState::Canceled, &canceled, &d.plan_log)
            .await;
    }
    let ending = Ending {
        results: not_applied(ctx, decided),
        verdict: verdict.clone(),
        error: error.map(str::to_string),
        relied: relied.to_vec(),
        left: Left::default(),
    };
    report(ctx, apply_id, decided, &ending).await;
}

/// Each root's line when none was applied.
fn not_applied(ctx: &ApplyCtx, decided: &[Decided]) -> Vec<RootResult> {
    decided
        .iter()
        .map(|d| RootResult {
            name: d.root.clone(),
            text: ctx.say("not_applied", context! {}),
        })
        .collect()
}

/// The result on every surface: store, MR note, commit status, optionally an issue.
pub(super) async fn report(
    ctx: &ApplyCtx,
    apply_id: ApplyId,
    decided: &[Decided],
    ending: &Ending,
) {
    let (results, verdict) = (&ending.results, &ending.verdict);
    let nothing = ctx.say("no_changes", context! {});
    let (state, outcome) = match verdict {
        Verdict::Succeeded
            if decided.iter().all(|d| d.summary.is_empty())
                && results.iter().all(|r| r.text == nothing) =>
        {
            (ApplyState::Succeeded, ApplyOutcome::Nothing)
        }
        Verdict::Succeeded => (ApplyState::Succeeded, ApplyOutcome::Applied),
        _ => (ApplyState::Failed, ApplyOutcome::Failed),
    };
    let detail = match verdict {
        Verdict::Succeeded => None,
        Verdict::Refused(w) | Verdict::Failed(w) => Some(w.clone()),
    };
    if let Err(e) = ctx.app.store.finish_apply(apply_id, state, detail).await {
        tracing::error!(error = %e, "could not record the end of the apply");
    }
    let summary = results
        .iter()
        .filter(|r| r.text != nothing)
        .map(|r| {
            let text = minijinja::Value::from_safe_string(r.text.clone());
            ctx.say("root_line", context! { root => &r.name, text => text })
        })
        .collect::<Vec<_>>()
        .join("; ");
    let run_id = decided.first().map(|d| d.run);
    let scrubbed_error = ending
        .error
        .as_deref()
        .map(|e| ctx.app.scrubber.scrub(e).into_owned());
    let body = result_note(
        ctx,
        outcome,
        if summary.is_empty() {
            &nothing
        } else {
            &summary
        },
        results,
        scrubbed_error.as_deref(),
        None,
        &lines(&ending.relied),
        run_id,
    );
    post_note(ctx, &body, "could not post the apply result").await;
    let banner = match (verdict, outcome) {
        (Verdict::Refused(_), _) => "refused",
        (_, ApplyOutcome::Nothing) => "nothing",
        (_, ApplyOutcome::Applied) => "applied",
        _ => "failed",
    };
    rewrite_merged_banner(ctx, banner).await;
    note_on_drift_issues(ctx, decided, &body).await;
    let description = match summary.is_empty() {
        true => nothing,
        false => applied_roots(ctx, &summary, ending),
    };
    match verdict {
        Verdict::Succeeded => ctx.status(StatusState::Success, &description).await,
        Verdict::Refused(w) | Verdict::Failed(w) => ctx.status(StatusState::Failed, w).await,
    }
    if outcome == ApplyOutcome::Failed && ctx.app.config.apply.open_issue_on_failure {
        let run_url = run_id.and_then(|r| ctx.app.run_url(r));
        open_failure_issue(ctx, scrubbed_error.as_deref(), run_url, run_id).await;
    }
}

/// The status of an apply that succeeded: green means the apply succeeded; what it left (or
/// could not check) leads the text, then each root's line (`summary`) and the approvals.
fn applied_roots(ctx: &ApplyCtx, summary: &str, ending: &Ending) -> String {
    ctx.say(
        "applied_roots",
        context! {
            summary => minijinja::Value::from_safe_string(summary.to_string()),
            approved => crate::core::apply_note::approvals(&ending.relied),
            left => &ending.left.changes,
            unknown => &ending.left.unknown,
        },
    )
}

/// The reliances' lines, for the result note.
fn lines(relied: &[Relied]) -> Vec<String> {
    relied.iter().map(|r| r.line.clone()).collect()
}

/// The note `body` on the apply's merge request, if any (`what`: the warning when it fails).
async fn post_note(ctx: &ApplyCtx, body: &str, what: &str) {
    let Some(mr) = ctx.mr_iid() else { return };
    if let Err(e) = ctx.app.gitlab.create_mr_note(ctx.project, mr, body).await {
        ctx.app.metrics.gitlab_error("create_mr_note");
        tracing::warn!(error = %e, "{what}");
    }
}

/// A root's open drift issue hears how the apply that may repair it ended (`body`).
async fn note_on_drift_issues(ctx: &ApplyCtx, decided: &[Decided], body: &str) {
    for d in decided {
        let noted = async {
            let bot = ctx.app.bot_user().await?;
            crate::flows::drift::issue::note_on_open_issue(
                &ctx.app.gitlab,
                ctx.project,
                &ctx.app.config.drift.labels,
                &d.root,
                body,
                bot,
            )
            .await
        };
        if let Err(e) = noted.await {
            ctx.app.metrics.gitlab_error("create_issue_note");
            tracing::warn!(root = %d.root, error = %e, "could not post the apply result on the drift issue");
        }
    }
}

/// The apply's result note for this job (`run`: the first root's run, linked from
/// `public_url` or named on the planbot host).
#[allow(clippy::too_many_arguments)]
fn result_note(
    ctx: &ApplyCtx,
    outcome: ApplyOutcome,
    summary: &str,
    roots: &[RootResult],
    error: Option<&str>,
    hint: Option<&str>,
    policies: &[String],
    run: Option<crate::core::ids::RunId>,
) -> String {
    let run_url = run.and_then(|r| ctx.app.run_url(r));
    let run_hint = run.and_then(|r| ctx.app.run_hint(r));
    render_result(
        &ResultNote {
            outcome,
            sha: ctx.sha.as_str(),
            branch: &ctx.branch,
            user: ctx.user.as_deref(),
            summary,
            roots,
            error,
            log_excerpt: None,
            hint,
            policies,
            job_name: &ctx.app.config.apply.job_name,
            job_id: ctx.job_id.0,
            run_id: run.map(|r| r.0),
            run_url: run_url.as_deref(),
            run_hint: run_hint.as_deref(),
        },
        &ctx.app.scrubber,
    )
}

/// A refusal on the MR (`why`, and `hint`: what to do), as the job's log and the
/// `planbot/apply` status say it: the result note (nothing was applied) and the plan note's
/// merged banner.
pub(super) async fn report_refused(
    ctx: &ApplyCtx,
    decided: &[Decided],
    relied: &[Relied],
    why: &str,
    hint: &str,
) {
    if ctx.mr.is_none() {
        return;
    }
    let body = result_note(
        ctx,
        ApplyOutcome::Refused,
        "",
        &not_applied(ctx, decided),
        Some(why),
        Some(hint).filter(|h| !h.is_empty()),
        &lines(relied),
        decided.first().map(|d| d.run),
    );
    post_note(ctx, &body, "could not post the apply refusal").await;
    rewrite_merged_banner(ctx, "refused").await;
}

/// The plan note's "Merged — waiting for the apply job" banner, rewritten to say how the
/// apply ended (`outcome`: applied, nothing, refused, failed), with the job's link. Only
/// the bot user's plan note is edited; a note without the merged banner is left alone.
async fn rewrite_merged_banner(ctx: &ApplyCtx, outcome: &str) {
    use crate::core::render::{MERGED_BANNER_MARKER, NOTE_MARKER};
    let Some(mr) = ctx.mr.as_ref() else { return };
    let job_url = mr
        .web_url
        .split_once("/-/merge_requests/")
        .map(|(project, _)| format!("{project}/-/jobs/{}", ctx.job_id.0));
    let banner = crate::core::templates::scrubbing(&ctx.app.scrubber, || {
        crate::core::templates::render(
            "comments/applied_banner.md.j2",
            context! {
                outcome => outcome,
                job_name => &ctx.app.config.apply.job_name,
                job_id => ctx.job_id.0,
                job_url => job_url,
                branch => &ctx.branch,
                sha => ctx.sha.short(),
            },
        )
    });
    let banner = match banner {
        Ok(b) => b.trim().to_string(),
        Err(e) => {
            tracing::warn!(error = %e, "could not render the applied banner");
            return;
        }
    };
    let rewritten = async {
        let bot = ctx.app.bot_user().await?;
        let notes = ctx.app.gitlab.mr_notes(ctx.project, mr.iid).await?;
        let Some(note) = notes.iter().find(|n| {
            !n.system
                && n.author.as_ref().is_some_and(|a| a.id == bot)
                && n.body.starts_with(NOTE_MARKER)
                && n.body.contains(MERGED_BANNER_MARKER)
        }) else {
            return anyhow::Ok(());
        };
        let (before, after) = note
            .body
            .split_once(MERGED_BANNER_MARKER)
            .expect("the marker is in the body");
        // The banner is the line after the marker; the plan note follows it.
        let rest = after
            .strip_prefix('\n')
            .unwrap_or(after)
            .split_once('\n')
            .map_or("", |(_, rest)| rest);
        let body = format!("{before}{MERGED_BANNER_MARKER}\n{banner}\n{rest}");
        ctx.app
            .gitlab
            .edit_mr_note(ctx.project, mr.iid, note.id, &body)
            .await?;
        Ok(())
    };
    if let Err(e) = rewritten.await {
        ctx.app.metrics.gitlab_error("edit_mr_note");
        tracing::warn!(error = %e, "could not say on the plan note how the apply ended");
    }
}

/// `[apply] open_issue_on_failure`: an issue that says which job failed on which commit.
async fn open_failure_issue(
    ctx: &ApplyCtx,
    scrubbed_error: Option<&str>,
    run_url: Option<String>,
    run_id: Option<crate::core::ids::RunId>,
) {
    // The issue's words as written, its values scrubbed.
    let issue = |kind| {
        crate::core::templates::scrubbing(&ctx.app.scrubber, || {
            crate::core::templates::text(
                "apply/failure_issue.md.j2",
                kind,
                context! {
                    short_sha => ctx.sha.short(),
                    job_name => &ctx.app.config.apply.job_name,
                    job_id => ctx.job_id,
                    sha => &ctx.sha,
                    mr => ctx.mr_iid(),
                    error => scrubbed_error.unwrap_or(""),
                    fence => fence_for(scrubbed_error.unwrap_or("")),
                    run => run_url.clone(),
                    run_hint => run_id.and_then(|r| ctx.app.run_hint(r)),
                },
            )
        })
    };
    let title = issue("title");
    let description = issue("body");
    if let Err(e) = ctx
        .app
        .gitlab
        .create_issue(ctx.project, &title, &description)
        .await
    {
        ctx.app.metrics.gitlab_error("create_issue");
        tracing::warn!(error = %e, "could not open the failure issue");
    }
}

/// An apply left `running` reported as interrupted, never re-run: at start-up one a crash left
/// (`panicked` false), or at once one whose task panicked.
pub async fn report_interrupted(app: &App, record: &ApplyRecord, panicked: bool) {
    if !panicked {
        app.metrics.apply_finished("interrupted"); // a panicked one is counted by its request
    }
    let text = say(
        &app.scrubber,
        "interrupted",
        context! { roots => &record.roots, panicked => panicked },
    );
    if let Some(mr) = record.mr {
        let roots: Vec<RootResult> = record
            .roots
            .iter()
            .map(|r| RootResult {
                name: r.clone(),
                text: say(&app.scrubber, "root_interrupted", context! {}),
            })
            .collect();
        let body = render_result(
            &ResultNote {
                outcome: ApplyOutcome::Interrupted,
                sha: record.sha.as_str(),
                branch: "",
                user: None,
                summary: "",
                roots: &roots,
                error: None,
                log_excerpt: None,
                hint: None,
                policies: &[],
                job_name: &app.config.apply.job_name,
                job_id: record.ci_job.0,
                run_id: None,
                run_url: None,
                run_hint: None,
            },
            &app.scrubber,
        );
        if let Err(e) = app.gitlab.create_mr_note(record.project, mr, &body).await {
            app.metrics.gitlab_error("create_mr_note");
            tracing::warn!(error = %e, "could not report the interrupted apply on the MR");
        }
    }
    // The ref of the `running` status the interrupted apply left, so that this one moves it
    // to `failed` (GitLab updates a running status only for the same name, ref and user).
    let ref_ = match app
        .gitlab
        .commit_statuses(record.project, &record.sha)
        .await
    {
        Ok(rows) => rows
            .into_iter()
            .rev()
            .find(|r| {
                r.name == commit_status::APPLY && matches!(r.status.as_str(), "running" | "pending")
            })
            .and_then(|r| r.ref_),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the interrupted apply's status");
            None
        }
    };
    let status = CommitStatus {
        state: StatusState::Failed,
        name: commit_status::APPLY.into(),
        description: Some(text),
        target_url: None,
        ref_,
        pipeline_id: None,
    };
    if let Err(e) = app
        .gitlab
        .set_commit_status(record.project, &record.sha, &status)
        .await
    {
        app.metrics.gitlab_error("set_commit_status");
        tracing::warn!(error = %e, "could not set the interrupted apply's status");
    }
}
