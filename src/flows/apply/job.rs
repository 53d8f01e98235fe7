//! One apply request to its verdict ([`run`]): the stages in order, each returning early with
//! the verdict when the apply ends there — the job verified and its merged MR found
//! ([`super::verify`]), the checkout and the policy gate, the apply recorded once per CI job
//! under the project's lock, then [`super::parity`], [`super::run`] and [`super::report`].

use super::ctx::ApplyCtx;
use super::log::{refuse, say, JobLog, Verdict};
use super::order::{dependency_order, Order};
use super::report;
use super::retire::Retiring;
use super::verify::Caller;
use super::{parity, policy, run as stage, verify};
use crate::capabilities::gitlab::MergeRequest;
use crate::capabilities::state_gate::GateProject;
use crate::capabilities::store::{ApplyId, ApplyState, NewApply, ProjectLock};
use crate::capabilities::workspace::Checkout;
use crate::core::apply::{parse_confirm, ApplyRefusal};
use crate::core::ids::CommitSha;
use crate::core::repo_config::RepoConfig;
use crate::flows::confinement::credentials::Trust;
use crate::flows::confinement::plan_request::JobRuns;
use crate::flows::context::app_state::App;
use anyhow::{Context, Result};
use minijinja::context;
use std::path::Path;
use std::sync::Arc;

/// The request body of `POST /api/v1/apply` (all optional).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyBody {
    #[serde(default)]
    pub confirm: Option<String>,
    #[serde(default)]
    pub roots: Vec<String>,
}

/// Run one apply request from `client` to its verdict, writing progress to `log` (the verdict
/// last). A panic of the apply is caught here, in the task the endpoint spawns: the apply ends
/// at once as interrupted (its record, the `planbot/apply` status and the MR note say so), not
/// at the next start.
pub async fn run(
    app: Arc<App>,
    job_token: String,
    body: ApplyBody,
    log: JobLog,
    client: std::net::IpAddr,
) -> Verdict {
    use futures::FutureExt;
    let mut job = JobSeen::default();
    let caller = Caller {
        token: &job_token,
        client,
    };
    let outcome =
        std::panic::AssertUnwindSafe(verify_and_apply(&app, &caller, &body, &log, &mut job))
            .catch_unwind()
            .await;
    let verdict = match outcome {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => Verdict::Failed(app.scrubber.scrub(&format!("{e:#}")).into_owned()),
        Err(panic) => {
            job.panicked = true;
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            drop(panic);
            interrupted_by_panic(&app, &job, &message).await
        }
    };
    job.log_verdict(&verdict);
    app.metrics.apply_finished(match &verdict {
        Verdict::Succeeded => "succeeded",
        Verdict::Refused(_) => "refused",
        Verdict::Failed(_) if job.panicked => "interrupted",
        Verdict::Failed(_) => "failed",
    });
    log.verdict(&verdict);
    verdict
}

/// The apply task panicked: its record (when it had begun) ends `interrupted` now, its status
/// and note say so as after a restart, and the job's verdict says it failed.
async fn interrupted_by_panic(app: &App, job: &JobSeen, message: &str) -> Verdict {
    tracing::error!(
        ci_job = job.ci_job,
        project = job.project,
        panic = %app.scrubber.scrub(message),
        "the apply task panicked: ended as interrupted"
    );
    let record = match job.ci_job {
        Some(id) => app.store.apply_for_job(crate::core::ids::JobId(id)).await,
        None => Ok(None),
    };
    match record {
        Ok(Some(record)) if record.state == ApplyState::Running => {
            let text = say(&app.scrubber, "panicked", context! {});
            if let Err(e) = app
                .store
                .finish_apply(record.id, ApplyState::Interrupted, Some(text))
                .await
            {
                tracing::error!(error = %e, "could not record the interrupted apply");
            }
            report::report_interrupted(app, &record, true).await;
        }
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "could not read the apply that panicked"),
    }
    Verdict::Failed(say(&app.scrubber, "panicked", context! {}))
}

/// Who asked for an apply, once GitLab said so: the ids of the log's verdict line.
#[derive(Default)]
struct JobSeen {
    ci_job: Option<u64>,
    project: Option<u64>,
    sha: Option<String>,
    /// The apply ended by a panic (caught in [`run`]).
    panicked: bool,
}

impl JobSeen {
    /// The log's line for the verdict: info when applied, a warning when refused or failed.
    fn log_verdict(&self, verdict: &Verdict) {
        let (ci_job, project, sha) = (self.ci_job, self.project, self.sha.as_deref());
        match verdict {
            Verdict::Succeeded => {
                tracing::info!(
                    ci_job,
                    project,
                    sha,
                    verdict = "succeeded",
                    "apply succeeded"
                )
            }
            Verdict::Refused(why) => {
                tracing::warn!(ci_job, project, sha, verdict = "refused", reason = %why, "apply refused")
            }
            Verdict::Failed(why) => {
                tracing::warn!(ci_job, project, sha, verdict = "failed", error = %why, "apply failed")
            }
        }
    }
}

/// The stages in order; each returns early with its verdict when the apply ends there.
async fn verify_and_apply(
    app: &Arc<App>,
    caller: &Caller<'_>,
    body: &ApplyBody,
    log: &JobLog,
    seen: &mut JobSeen,
) -> Result<Verdict> {
    let confirm = match parse_confirm(body.confirm.as_deref()) {
        Ok(c) => c,
        Err(r) => return Ok(refuse(log, &r)),
    };
    let job = match verify::verify_job(app, caller, log).await? {
        Ok(j) => j,
        Err(verdict) => return Ok(verdict),
    };
    let sha = job.facts.pipeline_sha.clone();
    *seen = JobSeen {
        ci_job: Some(job.facts.job_id.0),
        project: Some(job.project.id.0),
        sha: Some(sha.short().to_string()),
        panicked: false,
    };
    tracing::info!(
        ci_job = job.facts.job_id.0,
        project = job.project.id.0,
        sha = sha.short(),
        user = job.facts.username.as_deref(),
        "apply requested"
    );
    let mr = verify::find_reviewed_mr(app, job.project.id, &sha, log).await?;
    let (checkout, repo_config) = match checkout(app, &job, &sha).await? {
        Ok(c) => c,
        Err(verdict) => return Ok(verdict),
    };
    // The policy sets as the default branch had them before the merge (and planbot's own).
    let policy =
        match policy::PolicyGate::load(app, job.project.id, &job.default_branch, &sha, mr.as_ref())
            .await?
        {
            Ok(p) => p,
            Err(verdict) => return Ok(verdict),
        };
    let gate_project = GateProject {
        id: job.project.id.0,
        path: Some(job.project.path_with_namespace.clone()),
    };
    let before = policy.before.as_ref().zip(policy.base.as_ref());
    let retiring = Retiring::of(
        app,
        gate_project.clone(),
        before,
        &repo_config,
        &sha,
        &body.roots,
    )
    .await?;
    let retired: Vec<_> = retiring.iter().flat_map(|r| r.roots.clone()).collect();
    let order = dependency_order(&repo_config, &body.roots).with_retired(&retired);
    if order.roots.is_empty() {
        let roots = format!("{:?}", body.roots);
        let why = say(&app.scrubber, "no_root_matches", context! { roots });
        return Ok(Verdict::Refused(why));
    }
    let (apply_id, project_lock) = match begin(app, &job, mr.as_ref(), &order, log).await? {
        Ok(begun) => begun,
        Err(verdict) => return Ok(verdict),
    };
    // The apply credentials, and the job's one state gate for every root's plan and apply.
    let runs = JobRuns::new(
        &app.config,
        Trust::DefaultBranch,
        gate_project,
        &sha,
        checkout.path(),
    );
    let ctx = ApplyCtx {
        runs,
        apply: repo_config.apply.stricter(policy.before_apply),
        app: app.clone(),
        project: job.project.id,
        project_path: job.project.path_with_namespace.clone(),
        sha,
        branch: job.default_branch.clone(),
        mr,
        job_id: job.facts.job_id,
        user: job.facts.username.clone(),
        pipeline_id: Some(job.pipeline_id),
        log: log.clone(),
        policy,
        retiring,
    };
    let verdict =
        plan_apply_report(&ctx, apply_id, &order, checkout.path(), confirm.as_deref()).await;
    project_lock.release().await;
    verdict
}

/// The apply of `order`'s roots recorded (once per CI job: a retried job is refused), and the
/// project's lock: one apply per project at a time, across replicas (held to the end of this
/// apply, and freed before the job hears the verdict).
async fn begin(
    app: &App,
    job: &verify::VerifiedJob,
    mr: Option<&MergeRequest>,
    order: &Order<'_>,
    log: &JobLog,
) -> Result<Result<(ApplyId, ProjectLock), Verdict>> {
    let roots = &order.roots;
    let Some(apply_id) = app
        .store
        .begin_apply(NewApply {
            ci_job: job.facts.job_id,
            project: job.project.id,
            mr: mr.map(|m| m.iid),
            sha: job.facts.pipeline_sha.clone(),
            roots: roots.iter().map(|r| r.name.clone()).collect(),
        })
        .await?
    else {
        let refusal = ApplyRefusal::JobAlreadyApplied {
            job_id: job.facts.job_id,
        };
        return Ok(Err(refuse(log, &refusal)));
    };
    let project_lock = match app.store.try_lock_project(job.project.id).await? {
        Some(lock) => lock,
        None => {
            log.say("project_waiting", context! {});
            app.store.lock_project(job.project.id).await?
        }
    };
    Ok(Ok((apply_id, project_lock)))
}

/// Stages 4 to 6: every root planned and decided; the checked plans applied in order; the
/// result reported.
async fn plan_apply_report(
    ctx: &ApplyCtx,
    apply_id: ApplyId,
    order: &Order<'_>,
    checkout: &Path,
    confirm: Option<&str>,
) -> Result<Verdict> {
    let planned = parity::plan_and_decide(ctx, apply_id, &order.roots, checkout, confirm).await?;
    let mut planned = match planned {
        Ok(p) => p,
        Err(verdict) => return Ok(verdict),
    };
    let stage = stage::Stage { order, confirm };
    let mut ending = stage::apply_all(ctx, &mut planned.decided, &stage).await;
    ending.relied.splice(0..0, planned.relied);
    report::report(ctx, apply_id, &planned.decided, &ending).await;
    Ok(ending.verdict)
}

/// Stage 3: the workspace at the merged commit, and the repo config of the default branch,
/// which is this commit's.
async fn checkout(
    app: &App,
    job: &verify::VerifiedJob,
    sha: &CommitSha,
) -> Result<Result<(Checkout, RepoConfig), Verdict>> {
    let project = &job.project;
    let default_branch = &job.default_branch;
    app.workspace
        .sync(project.id, &project.http_url_to_repo)
        .await
        .context("fetching the repository")?;
    let checkout = app
        .workspace
        .checkout(project.id, sha)
        .await
        .context("checking out the commit")?;
    // From git, as the plan flow reads it: never through the checkout's file system, where a
    // committed symbolic link would be followed.
    let repo_config = match app
        .workspace
        .repo_config_at(project.id, sha.as_str())
        .await
        .context("reading .planbot.toml")?
    {
        Ok(c) => c,
        Err(e) => {
            return Ok(Err(Verdict::Failed(say(
                &app.scrubber,
                "invalid_config",
                context! { branch => default_branch, error => e.to_string() },
            ))))
        }
    };
    Ok(Ok((checkout, repo_config)))
}
