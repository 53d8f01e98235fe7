//! Apply stages 1 and 2: who is asking — the CI job, verified with GitLab (`GET /job` with its
//! `CI_JOB_TOKEN`) and checked against the gate — and which merged MR landed the commit (its
//! plans are what was reviewed).

use super::log::{refuse, JobLog, Verdict};
use crate::capabilities::gitlab::{GitLabError, MergeRequest, Project};
use crate::core::apply::{check_job, ApplyRefusal, GateFacts, JobFacts};
use crate::core::ids::{CommitSha, ProjectId};
use crate::flows::context::app_state::App;
use anyhow::{Context, Result};
use minijinja::context;

/// Who presented a job token: the token, and the client's address (for the limit of wrong
/// tokens per client, [`crate::flows::context::limits`]).
pub(super) struct Caller<'a> {
    pub token: &'a str,
    pub client: std::net::IpAddr,
}

/// A job that passed every check of the gate.
pub(super) struct VerifiedJob {
    pub facts: JobFacts,
    pub project: Project,
    pub default_branch: String,
    pub pipeline_id: u64,
}

/// Stage 1: ask GitLab who the job is and check it (running, the configured manual job, on the
/// protected default branch at its head, an allowed project, never applied before).
/// `Ok(Err(verdict))` is a refusal, already written to the job log.
///
/// About a hundred lines on purpose (the token's lookup apart, in [`job_of_token`]): the gate's
/// checks in the order the refusals are documented, each returning early; split further, the
/// facts gathered so far would travel between helpers.
pub(super) async fn verify_job(
    app: &App,
    caller: &Caller<'_>,
    log: &JobLog,
) -> Result<Result<VerifiedJob, Verdict>> {
    let job = match job_of_token(app, caller, log).await? {
        Ok(j) => j,
        Err(verdict) => return Ok(Err(verdict)),
    };
    let pipeline = job.pipeline.clone();
    let facts = JobFacts {
        job_id: job.id,
        job_name: job.name.clone(),
        status: job.status.clone(),
        git_ref: job.ref_.clone(),
        tag: job.tag,
        pipeline_project_id: pipeline.project_id,
        pipeline_sha: pipeline.sha.clone(),
        username: job.user.as_ref().map(|u| u.username.clone()),
    };
    log.say(
        "job",
        context! {
            job_id => facts.job_id,
            job_name => &facts.job_name,
            git_ref => &facts.git_ref,
            sha => facts.pipeline_sha.short(),
            user => &facts.username,
        },
    );
    if facts.status != "running" {
        return Ok(Err(refuse(
            log,
            &ApplyRefusal::JobNotRunning {
                status: facts.status.clone(),
            },
        )));
    }
    // Refused here, before the branch lookups (the gate's order: running, then the project),
    // and from memory after the first time: see `App::served_project`.
    let project = match app.served_project(facts.pipeline_project_id).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            return Ok(Err(refuse(
                log,
                &ApplyRefusal::ProjectNotAllowed {
                    project_id: facts.pipeline_project_id,
                },
            )))
        }
        Err(e) => return Err(e).context("GET /projects/:id"),
    };
    let default_branch = project
        .default_branch
        .clone()
        .unwrap_or_else(|| "main".into());
    let (ref_protected, head) = if facts.tag {
        (false, CommitSha(String::new()))
    } else {
        match app.gitlab.branch(project.id, &facts.git_ref).await {
            Ok(b) => (b.protected, b.commit.id),
            Err(GitLabError::NotFound) => (false, CommitSha(String::new())),
            Err(e) => return Err(e).context("GET /repository/branches/:ref"),
        }
    };
    let default_head = if facts.git_ref == default_branch {
        head
    } else {
        app.gitlab
            .branch(project.id, &default_branch)
            .await
            .map(|b| b.commit.id)
            .context("GET /repository/branches/:default")?
    };
    let gate = GateFacts {
        // `served_project` found it in `gitlab.projects`, under the pipeline's project id.
        allowed_projects: vec![project.id],
        default_branch: default_branch.clone(),
        ref_protected,
        default_branch_head: default_head,
        expected_job_name: app.config.apply.job_name.clone(),
        job_already_applied: app.store.apply_for_job(facts.job_id).await?.is_some(),
    };
    if let Err(r) = check_job(&facts, &gate) {
        return Ok(Err(refuse(log, &r)));
    }
    Ok(Ok(VerifiedJob {
        facts,
        project,
        default_branch,
        pipeline_id: pipeline.id,
    }))
}

/// The CI job of the caller's token as GitLab has it; a token GitLab refuses is the refusal
/// (written to the log) and counts against the caller's client
/// ([`crate::flows::context::limits`]).
async fn job_of_token(
    app: &App,
    caller: &Caller<'_>,
    log: &JobLog,
) -> Result<Result<crate::capabilities::gitlab::Job, Verdict>> {
    match app.gitlab.job_for_token(caller.token).await {
        Ok(j) => Ok(Ok(j)),
        Err(GitLabError::Unauthorized) | Err(GitLabError::Forbidden) => {
            app.limits.wrong_token(caller.client);
            Ok(Err(refuse(log, &ApplyRefusal::InvalidJobToken)))
        }
        Err(e) => {
            app.metrics.gitlab_error("job_for_token");
            Err(e).context("asking GitLab about the job (GET /api/v4/job)")
        }
    }
}

/// Stage 2: the merged MR whose landed commit is `sha`; `None` for a direct push (then only a
/// `confirm` can apply, see `core::apply::parity`).
pub(super) async fn find_reviewed_mr(
    app: &App,
    project: ProjectId,
    sha: &CommitSha,
    log: &JobLog,
) -> Result<Option<MergeRequest>> {
    // The MR that landed this commit: its plans are what was reviewed.
    let mr = app
        .gitlab
        .commit_merge_requests(project, sha)
        .await
        .context("GET /repository/commits/:sha/merge_requests")?
        .into_iter()
        .find(|m| m.state == "merged" && m.landed_sha() == Some(sha));
    match &mr {
        Some(m) => log.say("from_mr", context! { sha => sha.short(), mr => m.iid }),
        None => log.say("not_from_mr", context! { sha => sha.short() }),
    }

    Ok(mr)
}
