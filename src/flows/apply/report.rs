//! Apply stage 5: the result on every surface — the stored apply, the MR note, the
//! `planbot/apply` commit status, and an issue when it failed (if configured); and, at start-up,
//! an apply a crash left running reported as interrupted.

use super::parity::Decided;
use super::run::no_changes;
use super::{say, ApplyCtx, Verdict};
use crate::capabilities::gitlab::{CommitStatus, StatusState};
use crate::capabilities::store::{ApplyId, ApplyRecord, ApplyState, RunState};
use crate::core::apply_note::{render_result, ApplyOutcome, Relied, ResultNote, RootResult};
use crate::core::commit_status;
use crate::core::markdown::fence_for;
use crate::flows::context::app_state::App;
use minijinja::context;

impl ApplyCtx {
    /// Record, note, status after a failure before any apply ran.
    pub(super) async fn finish(
        &self,
        apply_id: ApplyId,
        decided: &[Decided],
        verdict: &Verdict,
        error: Option<&str>,
    ) {
        let results: Vec<RootResult> = decided
            .iter()
            .map(|d| RootResult {
                name: d.root.clone(),
                text: self.say("not_applied", context! {}),
            })
            .collect();
        let canceled = self.say("other_root_failed", context! {});
        for d in decided {
            self.end_run(d.run, RunState::Canceled, &canceled, &d.plan_log)
                .await;
        }
        self.report(apply_id, &results, decided, verdict, error)
            .await;
    }

    /// The result on every surface: store, MR note, commit status, optionally an issue.
    pub(super) async fn report(
        &self,
        apply_id: ApplyId,
        results: &[RootResult],
        decided: &[Decided],
        verdict: &Verdict,
        error: Option<&str>,
    ) {
        let (state, outcome) = match verdict {
            Verdict::Succeeded
                if decided.iter().all(|d| d.summary.is_empty())
                    && results.iter().all(|r| r.text == no_changes(self)) =>
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
        if let Err(e) = self.app.store.finish_apply(apply_id, state, detail).await {
            tracing::error!(error = %e, "could not record the end of the apply");
        }
        let relied = self.relied();
        let relied_lines: Vec<String> = relied.iter().map(|r| r.line.clone()).collect();
        let nothing = no_changes(self);
        let summary = results
            .iter()
            .filter(|r| r.text != nothing)
            .map(|r| {
                let text = minijinja::Value::from_safe_string(r.text.clone());
                self.say("root_line", context! { root => &r.name, text => text })
            })
            .collect::<Vec<_>>()
            .join("; ");
        let run_id = decided.first().map(|d| d.run);
        let scrubbed_error = error.map(|e| self.app.scrubber.scrub(e).into_owned());
        let body = self.result_note(
            outcome,
            if summary.is_empty() {
                &nothing
            } else {
                &summary
            },
            results,
            scrubbed_error.as_deref(),
            None,
            &relied_lines,
            run_id,
        );
        if let Some(mr) = self.mr_iid() {
            if let Err(e) = self
                .app
                .gitlab
                .create_mr_note(self.project, mr, &body)
                .await
            {
                self.app.metrics.gitlab_error("create_mr_note");
                tracing::warn!(error = %e, "could not post the apply result");
            }
        }
        let banner = match (verdict, outcome) {
            (Verdict::Refused(_), _) => "refused",
            (_, ApplyOutcome::Nothing) => "nothing",
            (_, ApplyOutcome::Applied) => "applied",
            _ => "failed",
        };
        self.rewrite_merged_banner(banner).await;
        // A root's open drift issue hears how the apply that may repair it ended.
        for d in decided {
            let noted = async {
                let bot = self.app.bot_user().await?;
                crate::flows::drift::issue::note_on_open_issue(
                    &self.app.gitlab,
                    self.project,
                    &self.app.config.drift.labels,
                    &d.root,
                    &body,
                    bot,
                )
                .await
            };
            if let Err(e) = noted.await {
                self.app.metrics.gitlab_error("create_issue_note");
                tracing::warn!(root = %d.root, error = %e, "could not post the apply result on the drift issue");
            }
        }
        // Green means the apply succeeded; what it left (or could not check) leads the text.
        let left = self.left.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (status, description) = match verdict {
            Verdict::Succeeded => (
                StatusState::Success,
                if summary.is_empty() {
                    nothing.clone()
                } else {
                    self.say(
                        "applied_roots",
                        context! {
                            summary => minijinja::Value::from_safe_string(summary.clone()),
                            approved => crate::core::apply_note::approvals(&relied),
                            left => &left.changes,
                            unknown => &left.unknown,
                        },
                    )
                },
            ),
            Verdict::Refused(w) | Verdict::Failed(w) => (StatusState::Failed, w.clone()),
        };
        self.status(status, &description).await;
        if outcome == ApplyOutcome::Failed && self.app.config.apply.open_issue_on_failure {
            let run_url = run_id.and_then(|r| self.app.run_url(r));
            self.open_failure_issue(scrubbed_error.as_deref(), run_url, run_id)
                .await;
        }
    }

    /// The apply's result note for this job (`run`: the first root's run, linked from
    /// `public_url` or named on the planbot host).
    #[allow(clippy::too_many_arguments)]
    fn result_note(
        &self,
        outcome: ApplyOutcome,
        summary: &str,
        roots: &[RootResult],
        error: Option<&str>,
        hint: Option<&str>,
        policies: &[String],
        run: Option<crate::core::ids::RunId>,
    ) -> String {
        let run_url = run.and_then(|r| self.app.run_url(r));
        let run_hint = run.and_then(|r| self.app.run_hint(r));
        render_result(
            &ResultNote {
                outcome,
                sha: self.sha.as_str(),
                branch: &self.branch,
                user: self.user.as_deref(),
                summary,
                roots,
                error,
                log_excerpt: None,
                hint,
                policies,
                job_name: &self.app.config.apply.job_name,
                job_id: self.job_id.0,
                run_id: run.map(|r| r.0),
                run_url: run_url.as_deref(),
                run_hint: run_hint.as_deref(),
            },
            &self.app.scrubber,
        )
    }

    /// The policy verdicts and approvals the apply relied on so far ([`ApplyCtx::relied_on`]).
    fn relied(&self) -> Vec<Relied> {
        self.relied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Their lines, for the result note.
    fn relied_lines(&self) -> Vec<String> {
        self.relied().into_iter().map(|r| r.line).collect()
    }

    /// A refusal on the MR (`why`, and `hint`: what to do), as the job's log and the
    /// `planbot/apply` status say it: the result note (nothing was applied) and the plan note's
    /// merged banner.
    pub(super) async fn report_refused(&self, decided: &[Decided], why: &str, hint: &str) {
        let Some(mr) = self.mr_iid() else {
            return;
        };
        let results: Vec<RootResult> = decided
            .iter()
            .map(|d| RootResult {
                name: d.root.clone(),
                text: self.say("not_applied", context! {}),
            })
            .collect();
        let relied = self.relied_lines();
        let body = self.result_note(
            ApplyOutcome::Refused,
            "",
            &results,
            Some(why),
            Some(hint).filter(|h| !h.is_empty()),
            &relied,
            decided.first().map(|d| d.run),
        );
        if let Err(e) = self
            .app
            .gitlab
            .create_mr_note(self.project, mr, &body)
            .await
        {
            self.app.metrics.gitlab_error("create_mr_note");
            tracing::warn!(error = %e, "could not post the apply refusal");
        }
        self.rewrite_merged_banner("refused").await;
    }

    /// The plan note's "Merged — waiting for the apply job" banner, rewritten to say how the
    /// apply ended (`outcome`: applied, nothing, refused, failed), with the job's link. Only
    /// the bot user's plan note is edited; a note without the merged banner is left alone.
    async fn rewrite_merged_banner(&self, outcome: &str) {
        use crate::core::render::{MERGED_BANNER_MARKER, NOTE_MARKER};
        let Some(mr) = self.mr.as_ref() else { return };
        let job_url = mr
            .web_url
            .split_once("/-/merge_requests/")
            .map(|(project, _)| format!("{project}/-/jobs/{}", self.job_id.0));
        let banner = crate::core::templates::scrubbing(&self.app.scrubber, || {
            crate::core::templates::render(
                "comments/applied_banner.md.j2",
                context! {
                    outcome => outcome,
                    job_name => &self.app.config.apply.job_name,
                    job_id => self.job_id.0,
                    job_url => job_url,
                    branch => &self.branch,
                    sha => self.sha.short(),
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
            let bot = self.app.bot_user().await?;
            let notes = self.app.gitlab.mr_notes(self.project, mr.iid).await?;
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
            self.app
                .gitlab
                .edit_mr_note(self.project, mr.iid, note.id, &body)
                .await?;
            Ok(())
        };
        if let Err(e) = rewritten.await {
            self.app.metrics.gitlab_error("edit_mr_note");
            tracing::warn!(error = %e, "could not say on the plan note how the apply ended");
        }
    }

    /// `[apply] open_issue_on_failure`: an issue that says which job failed on which commit.
    async fn open_failure_issue(
        &self,
        scrubbed_error: Option<&str>,
        run_url: Option<String>,
        run_id: Option<crate::core::ids::RunId>,
    ) {
        // The issue's words as written, its values scrubbed.
        let issue = |kind| {
            crate::core::templates::scrubbing(&self.app.scrubber, || {
                crate::core::templates::text(
                    "apply/failure_issue.md.j2",
                    kind,
                    context! {
                        short_sha => self.sha.short(),
                        job_name => &self.app.config.apply.job_name,
                        job_id => self.job_id,
                        sha => &self.sha,
                        mr => self.mr_iid(),
                        error => scrubbed_error.unwrap_or(""),
                        fence => fence_for(scrubbed_error.unwrap_or("")),
                        run => run_url.clone(),
                        run_hint => run_id.and_then(|r| self.app.run_hint(r)),
                    },
                )
            })
        };
        let title = issue("title");
        let description = issue("body");
        if let Err(e) = self
            .app
            .gitlab
            .create_issue(self.project, &title, &description)
            .await
        {
            self.app.metrics.gitlab_error("create_issue");
            tracing::warn!(error = %e, "could not open the failure issue");
        }
    }
}

/// At start-up: an apply a crash left `running` is reported as interrupted, never re-run.
pub async fn report_interrupted(app: &App, record: &ApplyRecord) {
    app.metrics.apply_finished("interrupted");
    let text = say(
        &app.scrubber,
        "interrupted",
        context! { roots => &record.roots },
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
