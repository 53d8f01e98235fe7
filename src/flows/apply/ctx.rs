//! What every stage of the apply after the gate works with ([`ApplyCtx`]): the verified job, its
//! project, commit and merge request, the job's log and the policy gate; and the small things
//! every stage does with them (a text, a run's end, the `planbot/apply` status, a root's lock).

use super::log::{say, ApplyFailure, JobLog};
use super::policy::PolicyGate;
use super::retire::Retiring;
use crate::capabilities::gitlab::{CommitStatus, MergeRequest, StatusState};
use crate::capabilities::store::{RunEnd, RunState};
use crate::core::ids::{CommitSha, JobId, MrIid, ProjectId, RunId};
use crate::core::repo_config::Root;
use crate::core::targeting::Targeting;
use crate::flows::confinement::credentials::Trust;
use crate::flows::confinement::plan_request::JobRuns;
use crate::flows::context::app_state::App;
use crate::flows::context::locks::RootGuard;
use minijinja::context;
use std::sync::Arc;

/// What every stage after the gate works with: the verified job, its project and commit.
pub(super) struct ApplyCtx {
    /// Every root's plan request, with the apply credentials and the job's one state gate
    /// (`flows::confinement::plan_request`).
    pub runs: JobRuns,
    /// `[apply]` of the default branch's `.planbot.toml`: what the apply waits for.
    pub apply: crate::core::repo_config::ApplySettings,
    pub app: Arc<App>,
    pub project: ProjectId,
    pub project_path: String,
    pub sha: CommitSha,
    pub branch: String,
    pub mr: Option<MergeRequest>,
    pub job_id: JobId,
    pub user: Option<String>,
    pub pipeline_id: Option<u64>,
    pub log: JobLog,
    /// The policy sets that judge the apply: the default branch's before the merge, and
    /// planbot's own.
    pub policy: PolicyGate,
    /// The roots the merge retires, destroyed from the code before it (`None`: none).
    pub retiring: Option<Retiring>,
}

impl ApplyCtx {
    /// Whether the merge retires `root`: it is planned as its destroy, from the code before
    /// the merge.
    pub fn retires(&self, root: &str) -> bool {
        self.retiring.as_ref().is_some_and(|r| r.retires(root))
    }

    /// The runs a plan with `targeting` is made in: a destroy (of a retired root) over the
    /// code before the merge, every other plan over the merged commit.
    pub fn runs_for(&self, targeting: &Targeting) -> &JobRuns {
        match (&self.retiring, targeting.destroy) {
            (Some(retiring), true) => &retiring.runs,
            _ => &self.runs,
        }
    }

    pub fn mr_iid(&self) -> Option<MrIid> {
        self.mr.as_ref().map(|m| m.iid)
    }

    /// The line of an (already scrubbed) engine report that says what went wrong.
    pub fn first_error_line(&self, report: &str) -> String {
        report
            .lines()
            .find(|l| l.contains("Error"))
            .or_else(|| report.lines().next())
            .map(str::to_string)
            .unwrap_or_else(|| self.say("engine_failed", context! {}))
            .trim()
            .trim_start_matches(['│', '╷', '╵', ' '])
            .to_string()
    }

    /// One short text of the apply, its values scrubbed (see [`say`]).
    pub fn say(&self, kind: &str, ctx: minijinja::Value) -> String {
        say(&self.app.scrubber, kind, ctx)
    }

    /// The `planbot/apply` status; `description` is planbot's text whose values were scrubbed
    /// when it was rendered ([`ApplyCtx::say`]), or a scrubbed error.
    pub async fn status(&self, state: StatusState, description: &str) {
        let status = CommitStatus {
            state,
            name: crate::core::commit_status::APPLY.into(),
            description: Some(description.to_string()),
            target_url: None,
            ref_: Some(self.branch.clone()),
            pipeline_id: self.pipeline_id,
        };
        if let Err(e) = self
            .app
            .gitlab
            .set_commit_status(self.project, &self.sha, &status)
            .await
        {
            self.app.metrics.gitlab_error("set_commit_status");
            tracing::warn!(error = %e, "could not set the planbot/apply status");
        }
    }

    pub async fn end_run(&self, run: RunId, state: RunState, summary: &str, log: &str) {
        let end = RunEnd {
            state,
            summary: Some(summary.to_string()),
            log: self.app.scrubber.scrub(log).into_owned(),
            note_markdown: None,
            fingerprint: None,
        };
        if let Err(e) = self.app.store.finish_run(run, end).await {
            tracing::error!(error = %e, "could not record the end of an apply run");
        }
    }

    /// End a failed root's `run` (`log`: the engine's log so far) with what `failure` says.
    pub async fn fail_run(&self, run: RunId, failure: ApplyFailure, log: &str) -> ApplyFailure {
        let summary = failure.run_summary(&self.app.scrubber);
        self.end_run(run, RunState::Failed, &summary, log).await;
        failure
    }

    /// The root's lock, saying so in the job log when an apply or drift check of it holds it.
    pub async fn lock_root(&self, root: &Root) -> RootGuard {
        match self.app.root_locks.try_lock(self.project, &root.name) {
            Some(g) => g,
            None => {
                self.log.say("waiting", context! { root => &root.name });
                self.app.root_locks.lock(self.project, &root.name).await
            }
        }
    }

    /// When the engine's sandbox refused what a run needed: why, and the setting that allows
    /// it, in the job log and planbot's log.
    pub fn explain_denial(&self, report: &str) {
        if let Some(hint) = crate::flows::confinement::network::explain(
            &self.app.config,
            Trust::DefaultBranch,
            report,
        ) {
            tracing::warn!(project = self.project.0, explanation = %hint, "the engine's sandbox refused what an apply needed");
            self.log.say(
                "hint",
                context! { hint => minijinja::Value::from_safe_string(hint) },
            );
        }
    }
}
