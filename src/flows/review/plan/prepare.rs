//! Stage 1 of a plan run: the MR is still open at this head, the statuses say queued then
//! planning, the mirror is fetched, the repo config is read from the DEFAULT branch, and the
//! commit to plan, the changed files, the checkout and the MR's engine are ready.

use super::shared::{set_status, text, upsert_note};
use crate::capabilities::engine::Engine;
use crate::capabilities::gitlab::{MergeRequest, StatusState};
use crate::capabilities::workspace::{Checkout, MrCommit, PlannedRef};
use crate::core::events::{Job, PlanJob, PlanReason};
use crate::core::ids::{CommitSha, NoteId};
use crate::core::render::NOTE_MARKER;
use crate::core::repo_config::{self, CheckoutMode, RepoConfig, RepoConfigError};
use crate::core::retire::{self, Retirements};
use crate::flows::context::app_state::App;
use crate::flows::context::metrics::PlanOutcome;
use crate::flows::context::policy_sets::PolicySets;
use crate::flows::review::gitlab_calls::gl;
use anyhow::{Context, Result};

/// Everything the later stages need, once the run is known to go ahead.
pub(super) struct Prepared {
    pub mr: MergeRequest,
    /// The branch the commit statuses are set on (GitLab picks one when absent).
    pub status_ref: Option<String>,
    /// `group/project`, for the run pages.
    pub project_path: Option<String>,
    pub config: RepoConfig,
    pub commit: MrCommit,
    pub changed: Vec<String>,
    /// Lines above the plans: which commit was planned, a config preview, the sandbox banner.
    pub banners: Vec<String>,
    pub checkout: Checkout,
    pub engine: Engine,
    /// The engine's version line for the note, when it could be read.
    pub version: Option<String>,
    /// The policy sets that check the plans (planbot's own and the default branch's).
    pub policies: PolicySets,
    /// The `.planbot.toml` this MR proposes, when it is broken: every problem of it (the note
    /// lists them; the status fails, merged as is nothing could be planned).
    pub proposed_invalid: Option<RepoConfigError>,
    /// The roots this MR retires (destroyed from the target branch's code) or renames
    /// (`core::retire`).
    pub retirements: Retirements,
    /// The target branch's code the retired roots' destroys are planned from (checked out only
    /// when the MR retires a root).
    pub retired_from: Option<(CommitSha, Checkout)>,
    /// The target branch's and the default branch's heads as planned (a plan reused from an
    /// earlier push was planned with the same: `super::reuse`).
    pub target_head: CommitSha,
    pub default_head: Option<CommitSha>,
    /// The default branch (the repo config's and the policy sets'): what a root unit planned
    /// on another replica reads them from.
    pub default_branch: String,
}

/// The MR moved past `job`'s head: make sure its newer head gets a plan even when that head's
/// webhook was lost or came first (GitLab does not order deliveries). The store drops this
/// job when the head already has a plan, queued, running or done. Fork heads are never planned
/// without a maintainer's command, so they get no catch-up.
async fn catch_up(
    app: &App,
    job: &PlanJob,
    mr: &MergeRequest,
    newer: &crate::core::ids::CommitSha,
) -> Result<()> {
    if job.fork || mr.is_fork() {
        return Ok(());
    }
    let plan = PlanJob {
        head: newer.clone(),
        draft: mr.draft,
        target_branch: Some(mr.target_branch.clone()).filter(|b| !b.is_empty()),
        reason: PlanReason::MissedHead,
        requested_by: None,
        ..job.clone()
    };
    app.enqueue(Job::Plan(plan))
        .await
        .context("queueing the plan of the MR's newer head")?;
    Ok(())
}

/// A run that ends before planning, with its outcome for the metrics and the log.
pub(super) struct Stop(pub PlanOutcome);

/// Stage 1: check, announce, fetch and check out. `Err(Stop)` ends the run early with its
/// outcome label (the MR moved on or closed, or the repo config is invalid and said so).
pub(super) async fn prepare(app: &App, job: &PlanJob) -> Result<Result<Prepared, Stop>> {
    let (project, ws) = (job.project, &app.workspace);
    let mr = match open_at_head(app, job).await? {
        Ok(mr) => mr,
        Err(stop) => return Ok(Err(stop)),
    };
    let status_ref = Some(mr.source_branch.clone()).filter(|s| !s.is_empty());
    let queued = text(&app.scrubber, "queued", minijinja::context! {});
    let pending = StatusState::Pending;
    set_status(app, job, pending, &queued, None, status_ref.clone()).await;

    let info = app.gitlab.project(&project.to_string()).await;
    let info = gl(app, "project", info)?;
    // The shared workspace: its per-project lock keeps concurrent plans from racing on the mirror.
    ws.sync(project, &info.http_url_to_repo)
        .await
        .context("fetching the repository")?;
    let planning = text(
        &app.scrubber,
        "planning",
        minijinja::context! { roots => "" },
    );
    let running = StatusState::Running;
    set_status(app, job, running, &planning, None, status_ref.clone()).await;

    // The repo config comes from the default branch only.
    let default_branch = info.default_branch.clone().unwrap_or_else(|| "main".into());
    let config = match ws
        .repo_config_at(project, &format!("refs/heads/{default_branch}"))
        .await?
    {
        Ok(c) => c,
        Err(err) => {
            invalid_config(app, job, &default_branch, &err, status_ref).await?;
            return Ok(Err(Stop(PlanOutcome::Failed)));
        }
    };
    // The policy sets too: the MR's own edits to them govern later MRs, never this one.
    let policies = PolicySets::load(app, project, &default_branch, &config)
        .await
        .context("reading the policy sets")?;
    let target = job
        .target_branch
        .clone()
        .or_else(|| Some(mr.target_branch.clone()).filter(|t| !t.is_empty()))
        .unwrap_or_else(|| default_branch.clone());
    let ToPlan {
        commit,
        changed,
        mut banners,
        proposed_invalid,
        retirements,
        target_sha,
    } = commit_to_plan(app, job, &config, &target, &default_branch).await?;
    let checkout = ws.checkout(project, &commit.sha).await?;
    let retired_from = match retirements.retired.is_empty() {
        true => None,
        false => Some((target_sha.clone(), ws.checkout(project, &target_sha).await?)),
    };
    banners.extend(renamed_lines(app, &retirements));
    let default_head = ws.branch_head(project, &default_branch).await?;
    let engine = app.mr_engine(project, job.mr)?;
    let version = engine.version().await.ok().map(|v| v.to_string());
    banners.extend(crate::flows::confinement::sandbox::note_banner(
        engine.sandbox(),
    ));
    Ok(Ok(Prepared {
        mr,
        status_ref,
        project_path: job.project_path.clone().or(Some(info.path_with_namespace)),
        config,
        commit,
        changed,
        banners,
        checkout,
        engine,
        version,
        policies,
        proposed_invalid,
        retirements,
        retired_from,
        target_head: target_sha,
        default_head,
        default_branch,
    }))
}

/// The line above the plans for each root the MR renames: nothing is destroyed, and how its
/// GitLab-managed state follows (or that it already does).
fn renamed_lines(app: &App, retirements: &Retirements) -> Vec<String> {
    retirements
        .renamed
        .iter()
        .map(|r| {
            text(
                &app.scrubber,
                "renamed",
                minijinja::context! {
                    from => &r.from, to => &r.to, dir => &r.dir,
                    state_before => &r.state_before, state_after => &r.state_after,
                    moves => r.state_moves(),
                },
            )
        })
        .collect()
}

/// The MR as GitLab has it, when it is still open at `job`'s head; else why the run stops (a
/// newer head gets its plan queued: [`catch_up`]).
async fn open_at_head(app: &App, job: &PlanJob) -> Result<Result<MergeRequest, Stop>> {
    let (project, iid) = (job.project, job.mr);
    let mr = gl(
        app,
        "merge_request",
        app.gitlab.merge_request(project, iid).await,
    )?;
    if mr.state != "opened" {
        tracing::info!(project = project.0, mr = iid.0, state = %mr.state, "not planning: the MR is not open");
        return Ok(Err(Stop(PlanOutcome::Skipped)));
    }
    if let Some(newer) = mr.sha.as_ref().filter(|s| *s != &job.head) {
        tracing::info!(
            project = project.0,
            mr = iid.0,
            "not planning: the MR has a newer head"
        );
        catch_up(app, job, &mr, newer).await?;
        return Ok(Err(Stop(PlanOutcome::Canceled)));
    }
    Ok(Ok(mr))
}

/// The commit to plan (GitLab's merge result or the head, as the repo config asks and GitLab
/// allows), the files the MR changes against its target, the banner lines that say which
/// commit was planned and, when the MR edits `.planbot.toml`, what the proposed config means,
/// and that proposed config's problems when it is broken.
async fn commit_to_plan(
    app: &App,
    job: &PlanJob,
    config: &RepoConfig,
    target: &str,
    default_branch: &str,
) -> Result<ToPlan> {
    let (ws, project, iid, head) = (&app.workspace, job.project, job.mr, &job.head);
    let commit = ws
        .mr_commit(
            project,
            iid,
            head,
            target,
            config.plan.checkout == CheckoutMode::Merge,
        )
        .await?;
    let base = ws
        .branch_head(project, target)
        .await?
        .with_context(|| format!("the target branch `{target}` does not exist"))?;
    let changed = ws.changed_files(project, &base, head).await?;

    let mut banners = vec![text(
        &app.scrubber,
        "commit_line",
        minijinja::context! {
            planned => if commit.planned == PlannedRef::Merge { "merge" } else { "head" },
            sha => commit.sha.short(),
            head => commit.head.short(),
            target => target,
            reason => &commit.reason,
        },
    )];
    // `[apply] approvals` of the default branch: what the apply of this MR will wait for.
    if config.apply.approvals > 0 {
        banners.push(text(
            &app.scrubber,
            "approvals_line",
            minijinja::context! { approvals => config.apply.approvals },
        ));
    }
    // The roots the MR retires or renames: the config it proposes against the one it changes,
    // over the directories of the commit planned.
    let mut dirs = ws.directories_at(project, commit.sha.as_str()).await?;
    let named: Vec<&str> = config.roots.iter().map(|r| r.dir.as_str()).collect();
    dirs.extend(ws.paths_at(project, commit.sha.as_str(), &named).await?);
    let dirs_before = ws.directories_at(project, base.as_str()).await?;
    let edits_config = changed.iter().any(|f| f == repo_config::FILE_NAME);
    let proposed = match edits_config {
        true => Some(ws.proposed_repo_config_at(project, head.as_str()).await?),
        false => None,
    };
    let after = match &proposed {
        Some(p) => p.as_ref().ok(),
        None => Some(config),
    };
    let state_default = app.config.state.default;
    let trees = retire::Trees {
        before: &dirs_before,
        after: &dirs,
    };
    let retirements = retire::retirements(config, after, trees, state_default);
    // A root directory gone while `.planbot.toml` still lists it: the MR's config check says
    // the entry must go too, as it does for an edited file.
    let entry_kept = retirements
        .retired
        .iter()
        .any(|r| r.because == (retire::RetiredBecause::DirectoryGone { entry_kept: true }));
    let proposed = match (proposed, entry_kept) {
        (None, true) => Some(ws.proposed_repo_config_at(project, head.as_str()).await?),
        (proposed, _) => proposed,
    };
    let mut invalid = None;
    if let Some(preview) = proposed {
        banners.push(repo_config::render_preview(&preview, default_branch));
        invalid = preview.err();
    }
    Ok(ToPlan {
        commit,
        changed,
        banners,
        proposed_invalid: invalid,
        retirements,
        target_sha: base,
    })
}

/// What [`commit_to_plan`] found.
struct ToPlan {
    commit: MrCommit,
    changed: Vec<String>,
    banners: Vec<String>,
    proposed_invalid: Option<RepoConfigError>,
    retirements: Retirements,
    /// The target branch's head (the retired roots' destroys are planned from it).
    target_sha: CommitSha,
}

/// The default branch's `.planbot.toml` is invalid: say what is wrong, plan nothing.
async fn invalid_config(
    app: &App,
    job: &PlanJob,
    default_branch: &str,
    err: &RepoConfigError,
    status_ref: Option<String>,
) -> Result<NoteId> {
    let body = format!(
        "{NOTE_MARKER}\n{}",
        crate::core::templates::scrubbing(&app.scrubber, || {
            repo_config::render_error_note(default_branch, err)
        })
    );
    let note = upsert_note(app, job.project, job.mr, &body).await?;
    let first = err.problems.first().map(|p| p.to_string());
    let line = text(
        &app.scrubber,
        "invalid_config",
        minijinja::context! {
            file => repo_config::FILE_NAME,
            branch => default_branch,
            problem => first.unwrap_or_default(),
        },
    );
    set_status(app, job, StatusState::Failed, &line, None, status_ref).await;
    Ok(note)
}
