//! One drift tick: every root of every configured project planned at the head of its default
//! branch (plan credentials, `-lock=false`, sandboxed as an MR's plan), classified, reported on
//! the root's issue, recorded as a `drift` run and summed up in the `planbot/drift` status.

use super::issue::{self, DriftTarget, IssueAction};
use crate::capabilities::engine::PlannedRun;
use crate::capabilities::gitlab::{CommitStatus, Project, StatusState};
use crate::capabilities::state_gate::GateProject;
use crate::capabilities::store::{
    DriftOutcome, DriftRootRecord, NewRun, RunEnd, RunKind, RunState,
};
use crate::core::config::ProjectRef;
use crate::core::drift::DriftVerdict;
use crate::core::ids::{CommitSha, ProjectId, RunId};
use crate::core::repo_config::{self, Root};
use crate::core::targeting::Targeting;
use crate::flows::confinement::credentials::Trust;
use crate::flows::confinement::plan_request::{self, JobRuns};
use crate::flows::context::app_state::App;
use anyhow::{Context, Result};
use std::time::SystemTime;

/// Which roots a tick checks, whether it may write anything, and what stops it.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only this project (its path or numeric id).
    pub project: Option<String>,
    /// Only roots of this name.
    pub root: Option<String>,
    /// Plan and print only: no issue, status or run is written.
    pub dry_run: bool,
    /// Stops the engine runs (SIGTERM, grace, SIGKILL): the service's shutdown.
    pub cancel: Option<crate::capabilities::engine::CancelToken>,
}

/// One root after a check.
#[derive(Debug, Clone)]
pub struct RootChecked {
    pub project_path: String,
    pub root: String,
    pub branch: String,
    pub sha: String,
    pub verdict: DriftVerdict,
    /// The fingerprint of the plan that brings reality back to the branch (drift only).
    pub fingerprint: Option<String>,
    /// What happened to the root's issue (`None` on a dry run, or when the issue could not
    /// be written: then `issue_error` says why).
    pub issue: Option<IssueAction>,
    pub issue_error: Option<String>,
    pub run: Option<RunId>,
}

/// What one tick found, root by root, and the projects it could not check at all (GitLab or
/// git unreachable, a broken `.planbot.toml` on the default branch): one project's failure
/// never stops the check of the others.
#[derive(Debug, Clone, Default)]
pub struct Tick {
    pub roots: Vec<RootChecked>,
    pub failed: Vec<ProjectFailed>,
}

/// A project a tick could not check, and why (scrubbed).
#[derive(Debug, Clone)]
pub struct ProjectFailed {
    pub project: String,
    pub error: String,
}

impl Tick {
    /// The exit code of `planbot drift`: 2 when any root drifted, else 1 when any root could
    /// not be checked (or its issue could not be written), else 0.
    pub fn exit_code(&self) -> i32 {
        let codes = self
            .roots
            .iter()
            .map(|r| {
                if r.issue_error.is_some() && r.verdict.exit_code() == 0 {
                    1
                } else {
                    r.verdict.exit_code()
                }
            })
            .chain(self.failed.iter().map(|_| 1));
        codes.fold(0, |worst, c| match (worst, c) {
            (2, _) | (_, 2) => 2,
            (1, _) | (_, 1) => 1,
            _ => 0,
        })
    }

    /// The terminal rendering: one block per root (`templates/drift/terminal.txt.j2`).
    pub fn render_text(&self, scrubber: &crate::core::redact::Scrubber, job_name: &str) -> String {
        let roots: Vec<minijinja::Value> = self
            .roots
            .iter()
            .map(|r| {
                minijinja::context! {
                    project => &r.project_path,
                    root => &r.root,
                    branch => &r.branch,
                    sha => &r.sha[..r.sha.len().min(8)],
                    drift => &r.verdict,
                    fingerprint => &r.fingerprint,
                    prefix => r.fingerprint.as_deref().map(|f| &f[..f.len().min(12)]),
                    issue => r.issue.map(issue_text),
                    issue_error => &r.issue_error,
                }
            })
            .collect();
        crate::core::templates::scrubbing(scrubber, || {
            crate::core::templates::render(
                "drift/terminal.txt.j2",
                minijinja::context! {
                    kind => "roots",
                    roots => roots,
                    failed => self.failed.iter().map(|f| minijinja::context! {
                        project => &f.project,
                        error => &f.error,
                    }).collect::<Vec<_>>(),
                    job_name => job_name,
                },
            )
            .unwrap_or_else(|e| format!("planbot: could not render the drift result: {e}\n"))
        })
    }
}

fn issue_text(action: IssueAction) -> String {
    match action {
        IssueAction::Opened(iid) => format!("opened #{iid}"),
        IssueAction::Edited(iid) => format!("updated #{iid}"),
        IssueAction::Closed(iid) => format!("closed #{iid}"),
        IssueAction::None => "none".into(),
    }
}

/// Run one tick now, as the schedule does.
pub async fn tick(app: &App, selection: &Selection, now: SystemTime) -> Result<Tick> {
    let mut tick = Tick::default();
    for project in &app.config.gitlab.projects.0 {
        if !selected(project, selection.project.as_deref()) {
            continue;
        }
        if let Err(e) = check_project(app, project, selection, now, &mut tick.roots).await {
            let error = app.scrubber.scrub(&format!("{e:#}")).into_owned();
            tracing::warn!(project = %project, error = %error, "could not check the project for drift");
            tick.failed.push(ProjectFailed {
                project: project.to_string(),
                error,
            });
        }
    }
    Ok(tick)
}

fn selected(project: &ProjectRef, wanted: Option<&str>) -> bool {
    match wanted {
        None => true,
        Some(w) => project
            .to_string()
            .eq_ignore_ascii_case(w.trim_matches('/')),
    }
}

/// The default branch's head of one project, its repo config, and each selected root checked.
async fn check_project(
    app: &App,
    project: &ProjectRef,
    selection: &Selection,
    now: SystemTime,
    out: &mut Vec<RootChecked>,
) -> Result<()> {
    let info: Project = app
        .gitlab
        .project(&project.to_string())
        .await
        .context("GET /projects/:id")?;
    let branch = info.default_branch.clone().unwrap_or_else(|| "main".into());
    app.workspace
        .sync(info.id, &info.http_url_to_repo)
        .await
        .context("fetching the repository")?;
    let head = app
        .workspace
        .branch_head(info.id, &branch)
        .await?
        .with_context(|| format!("the default branch `{branch}` does not exist"))?;
    let config = app
        .workspace
        .repo_config_at(info.id, &format!("refs/heads/{branch}"))
        .await?
        .map_err(|e| anyhow::anyhow!("{}: {e}", repo_config::FILE_NAME))?;
    let roots: Vec<&Root> = config
        .roots
        .iter()
        .filter(|r| r.drift && selection.root.as_ref().is_none_or(|w| &r.name == w))
        .collect();
    // A check of the whole project also ends what it no longer checks: the issues and the
    // recorded checks of roots gone from `.planbot.toml` or set to `drift = false`.
    if selection.root.is_none() && !selection.dry_run {
        let checked: Vec<String> = roots.iter().map(|r| r.name.clone()).collect();
        if let Err(e) = close_unchecked(app, &info, &branch, &head, &checked, now).await {
            let error = app.scrubber.scrub(&format!("{e:#}")).into_owned();
            tracing::warn!(project = info.id.0, error = %error, "could not close the drift issues of roots no longer checked");
        }
    }
    if roots.is_empty() {
        return Ok(());
    }
    let waiting = unapplied_merge(app, info.id, &head).await?;
    let checkout = app.workspace.checkout(info.id, &head).await?;
    let engine = app.drift_engine()?;
    // The default branch's code with the plan credentials: the state only read.
    let mut runs = JobRuns::new(
        &app.config,
        Trust::MergeRequest,
        GateProject {
            id: info.id.0,
            path: Some(info.path_with_namespace.clone()),
        },
        &head,
        checkout.path(),
    );
    if let Some(cancel) = &selection.cancel {
        runs = runs.cancelled_by(cancel.clone());
    }
    let ctx = ProjectCheck {
        app,
        info: &info,
        branch: &branch,
        head: &head,
        runs: &runs,
        engine: &engine,
        waiting,
        selection,
        now,
    };
    let first = out.len();
    for root in roots {
        out.push(ctx.check_root(root).await?);
    }
    if !selection.dry_run {
        ctx.set_status(&out[first..]).await;
    }
    Ok(())
}

/// The open issues and recorded checks of the roots of `info` not in `checked`: each issue gets
/// a note saying the root is no longer checked and is closed; the records are forgotten.
async fn close_unchecked(
    app: &App,
    info: &Project,
    branch: &str,
    head: &CommitSha,
    checked: &[String],
    now: SystemTime,
) -> Result<()> {
    let target = DriftTarget {
        project: info.id,
        project_path: &info.path_with_namespace,
        root: "",
        branch,
        sha: head.as_str(),
        labels: &app.config.drift.labels,
        job_name: &app.config.apply.job_name,
        fingerprint: None,
        bot: app.bot_user().await?,
        run_url: None,
        run_hint: None,
    };
    let closed = issue::close_unchecked(&app.gitlab, &target, checked, &app.scrubber, now)
        .await
        .inspect_err(|_| app.metrics.gitlab_error("drift_issue"))?;
    for (root, iid) in closed {
        tracing::info!(project = info.id.0, root = %root, issue = iid, "drift issue of a root no longer checked closed");
    }
    app.store
        .forget_drift_roots(info.id, checked.to_vec())
        .await
        .context("forgetting the drift checks of roots no longer checked")
}

/// The newest merge into `head` whose apply has not run: the merged MR that landed `head`,
/// while `head` has no successful `planbot/apply` status.
async fn unapplied_merge(app: &App, project: ProjectId, head: &CommitSha) -> Result<Option<u64>> {
    let landed_by = app
        .gitlab
        .commit_merge_requests(project, head)
        .await
        .context("GET /repository/commits/:sha/merge_requests")?
        .into_iter()
        .find(|m| m.state == "merged" && m.landed_sha() == Some(head));
    let Some(mr) = landed_by else {
        return Ok(None);
    };
    let applied = app
        .gitlab
        .commit_statuses(project, head)
        .await
        .context("GET /repository/commits/:sha/statuses")?
        .iter()
        .any(|s| s.name == crate::core::commit_status::APPLY && s.status == "success");
    Ok((!applied).then_some(mr.iid.0))
}

/// One project's check in progress.
struct ProjectCheck<'a> {
    app: &'a App,
    info: &'a Project,
    branch: &'a str,
    head: &'a CommitSha,
    runs: &'a JobRuns,
    engine: &'a crate::capabilities::engine::Engine,
    waiting: Option<u64>,
    selection: &'a Selection,
    now: SystemTime,
}

impl ProjectCheck<'_> {
    async fn check_root(&self, root: &Root) -> Result<RootChecked> {
        let app = self.app;
        let project = self.info.id;
        // Exclusive against the root's apply (never an MR plan: they take no lock), then a
        // slot within the share of planbot's own work.
        let _guard = app.root_locks.lock(project, &root.name).await;
        let _slot = app.engine_slot_of(None).await;
        let run = if self.selection.dry_run {
            None
        } else {
            Some(
                app.store
                    .start_run(NewRun {
                        job: None,
                        kind: RunKind::Drift,
                        project,
                        project_path: Some(self.info.path_with_namespace.clone()),
                        mr: None,
                        root: root.name.clone(),
                        sha: self.head.clone(),
                    })
                    .await?,
            )
        };
        let (verdict, fingerprint, log) = self.verdict(root).await;
        let mut checked = RootChecked {
            project_path: self.info.path_with_namespace.clone(),
            root: root.name.clone(),
            branch: self.branch.to_string(),
            sha: self.head.as_str().to_string(),
            verdict,
            fingerprint,
            issue: None,
            issue_error: None,
            run,
        };
        if let Some(run) = run {
            self.report(&mut checked).await;
            self.record(run, &checked, &log).await?;
        }
        Ok(checked)
    }

    /// The root's plan of the branch, read as drift: its verdict, the fingerprint of a
    /// drifted plan (what the issue's `PLANBOT_CONFIRM` names), and the engine's log.
    async fn verdict(&self, root: &Root) -> (DriftVerdict, Option<String>, String) {
        let app = self.app;
        match self.plan(root).await {
            Ok(planned) if planned.plan().errored => (
                DriftVerdict::CouldNotCheck {
                    error: app.scrubber.scrub(&tail(planned.log(), 40)).into_owned(),
                },
                None,
                planned.log().to_string(),
            ),
            Ok(planned) => {
                let verdict = DriftVerdict::of_plan(planned.plan(), self.waiting);
                let fingerprint = matches!(verdict, DriftVerdict::Drifted { .. }).then(|| {
                    planned
                        .fingerprint(app.config.fingerprint_key.expose().as_bytes())
                        .as_hex()
                        .to_string()
                });
                (verdict, fingerprint, planned.log().to_string())
            }
            Err(error) => (
                DriftVerdict::CouldNotCheck {
                    error: app.scrubber.scrub(&error).into_owned(),
                },
                None,
                String::new(),
            ),
        }
    }

    /// End the check's run (its note as the issue shows it, its scrubbed log) and record the
    /// root's last check.
    async fn record(&self, run: RunId, checked: &RootChecked, log: &str) -> Result<()> {
        let (app, project) = (self.app, self.info.id);
        let now = humantime::format_rfc3339_seconds(self.now).to_string();
        let note = crate::core::drift::render_run_note(
            &crate::core::drift::DriftIssue {
                project: &checked.project_path,
                root: &checked.root,
                branch: &checked.branch,
                sha: &checked.sha,
                verdict: &checked.verdict,
                first_seen: "",
                last_seen: &now,
                fingerprint: checked.fingerprint.as_deref(),
                job_name: &app.config.apply.job_name,
                run_url: None,
                run_hint: None,
            },
            &app.scrubber,
        );
        let end = RunEnd {
            state: match checked.verdict {
                DriftVerdict::Clean | DriftVerdict::WaitingForApply { .. } => RunState::Succeeded,
                _ => RunState::Failed,
            },
            summary: Some(app.scrubber.scrub(&summary(checked)).into_owned()),
            log: app.scrubber.scrub(log).into_owned(),
            // What the issue shows (the attribute diffs), on the run page.
            note_markdown: Some(note),
            fingerprint: None,
        };
        app.store.finish_run(run, end).await?;
        app.store
            .record_drift_root(root_record(checked, project, self.now))
            .await?;
        Ok(())
    }

    /// The engine's plan of the root at the head: plan credentials, the state only read.
    async fn plan(&self, root: &Root) -> Result<PlannedRun, String> {
        let run = self
            .runs
            .request(root, &Targeting::default())
            .await
            .map_err(|e| e.to_string())?;
        self.engine
            .plan(&run.dir, &run.request)
            .await
            .map_err(|e| plan_request::failure_report(&run.request, &e))
    }

    /// The root's issue in line with the verdict; a GitLab failure is kept on the result.
    async fn report(&self, checked: &mut RootChecked) {
        let labels = &self.app.config.drift.labels;
        let run_url = checked.run.and_then(|r| self.app.run_url(r));
        let run_hint = checked.run.and_then(|r| self.app.run_hint(r));
        let written = match self.app.bot_user().await {
            Ok(bot) => {
                let target = DriftTarget {
                    project: self.info.id,
                    project_path: &checked.project_path,
                    root: &checked.root,
                    branch: &checked.branch,
                    sha: &checked.sha,
                    labels,
                    job_name: &self.app.config.apply.job_name,
                    fingerprint: checked.fingerprint.as_deref(),
                    bot,
                    run_url: run_url.as_deref(),
                    run_hint: run_hint.as_deref(),
                };
                issue::report(
                    &self.app.gitlab,
                    &target,
                    &checked.verdict,
                    &self.app.scrubber,
                    self.now,
                )
                .await
            }
            Err(e) => Err(e),
        };
        match written {
            Ok(action) => checked.issue = Some(action),
            Err(e) => {
                self.app.metrics.gitlab_error("drift_issue");
                let error = self.app.scrubber.scrub(&format!("{e:#}")).into_owned();
                tracing::warn!(project = self.info.id.0, root = %checked.root, error = %error, "could not write the drift issue");
                checked.issue_error = Some(error);
            }
        }
    }

    /// `planbot/drift` on the head: success when every root checked is clean (or waits for an
    /// apply), failed otherwise.
    async fn set_status(&self, checked: &[RootChecked]) {
        let drifted: Vec<&str> = checked
            .iter()
            .filter(|c| matches!(c.verdict, DriftVerdict::Drifted { .. }))
            .map(|c| c.root.as_str())
            .collect();
        let unknown: Vec<&str> = checked
            .iter()
            .filter(|c| matches!(c.verdict, DriftVerdict::CouldNotCheck { .. }))
            .map(|c| c.root.as_str())
            .collect();
        let state = if drifted.is_empty() && unknown.is_empty() {
            StatusState::Success
        } else {
            StatusState::Failed
        };
        let description = crate::core::templates::scrubbing(&self.app.scrubber, || {
            crate::core::templates::text(
                "drift/terminal.txt.j2",
                "status",
                minijinja::context! { drifted => drifted, unknown => unknown },
            )
        });
        // The run page of the first root that is not clean (else of the first root).
        let run = checked
            .iter()
            .find(|c| {
                matches!(
                    c.verdict,
                    DriftVerdict::Drifted { .. } | DriftVerdict::CouldNotCheck { .. }
                )
            })
            .or(checked.first())
            .and_then(|c| c.run);
        let status = CommitStatus {
            state,
            name: crate::core::commit_status::DRIFT.into(),
            description: Some(description.trim().to_string()),
            target_url: run.and_then(|r| self.app.run_url(r)),
            ref_: Some(self.branch.to_string()),
            pipeline_id: None,
        };
        if let Err(e) = self
            .app
            .gitlab
            .set_commit_status(self.info.id, self.head, &status)
            .await
        {
            self.app.metrics.gitlab_error("set_commit_status");
            tracing::warn!(project = self.info.id.0, error = %e, "could not set the planbot/drift status");
        }
    }
}

/// The run's one-line summary.
fn summary(checked: &RootChecked) -> String {
    match &checked.verdict {
        DriftVerdict::Clean => "clean".into(),
        DriftVerdict::WaitingForApply { mr } => format!("waiting for the apply of !{mr}"),
        DriftVerdict::Drifted { resources } => format!("drift: {} resource(s)", resources.len()),
        DriftVerdict::CouldNotCheck { .. } => "could not check".into(),
    }
}

/// What the store keeps of a root's check, for `/metrics` and `planbot doctor`.
fn root_record(checked: &RootChecked, project: ProjectId, now: SystemTime) -> DriftRootRecord {
    let at = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let (outcome, drifted) = match &checked.verdict {
        DriftVerdict::Clean => (DriftOutcome::Clean, 0),
        DriftVerdict::WaitingForApply { .. } => (DriftOutcome::Waiting, 0),
        DriftVerdict::Drifted { resources } => (DriftOutcome::Drifted, resources.len() as u32),
        DriftVerdict::CouldNotCheck { .. } => (DriftOutcome::CouldNotCheck, 0),
    };
    DriftRootRecord {
        project,
        project_path: checked.project_path.clone(),
        root: checked.root.clone(),
        outcome,
        drifted,
        checked_at: at,
        checked_ok_at: (outcome != DriftOutcome::CouldNotCheck).then_some(at),
    }
}

/// The last `lines` lines of an engine log.
fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
