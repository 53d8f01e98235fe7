//! A root unit on the replica that took it (docs/architecture.md, "One MR's roots over every
//! replica"): the commit its plan job planned, fetched and checked out here (once for the
//! units of that job running here at once); the repo config and policy sets of the default
//! branch's commit that job read; the root planned as that job plans a root, in an engine slot
//! of this replica; its end sealed for the job ([`super::units`]).

use super::roots::{OfJob, RootPlanner};
use super::shared::finish;
use crate::capabilities::engine::{CancelToken, Engine};
use crate::capabilities::state_gate::GateProject;
use crate::capabilities::store::{QueueJobId, RunState};
use crate::capabilities::workspace::Checkout;
use crate::core::events::RootUnit;
use crate::core::ids::RunId;
use crate::core::repo_config::RepoConfig;
use crate::flows::confinement::credentials::Trust;
use crate::flows::confinement::plan_request::JobRuns;
use crate::flows::context::app_state::App;
use crate::flows::context::cpu::cpu_bound;
use crate::flows::context::policy_sets::PolicySets;
use anyhow::{Context, Result};
use tokio_util::sync::CancellationToken;

/// Plan `unit` (queue job `id`) and hand its end to its plan job. Its run ends with the plan
/// job's note; when the unit fails, was cancelled or was taken back meanwhile, its run ends
/// here.
pub async fn run(
    app: &App,
    unit: &RootUnit,
    id: QueueJobId,
    cancel: &CancellationToken,
) -> Result<()> {
    let mut started: Vec<RunId> = Vec::new();
    let result = plan(app, unit, id, cancel, &mut started).await;
    let why = match &result {
        Ok(true) => return Ok(()),
        Ok(false) => "its plan job took the root back, or was stopped".to_string(),
        Err(e) => app.scrubber.scrub(&format!("{e:#}")).into_owned(),
    };
    let state = match result {
        Ok(_) => RunState::Canceled,
        Err(_) => RunState::Failed,
    };
    for run in started {
        finish(app, run, state, &why, "", None).await?;
    }
    result.map(drop)
}

/// The unit planned and its end handed over; `false` when the store no longer wanted it.
async fn plan(
    app: &App,
    unit: &RootUnit,
    id: QueueJobId,
    cancel: &CancellationToken,
    started: &mut Vec<RunId>,
) -> Result<bool> {
    let job = &unit.plan;
    let project = job.project;
    let key = format!("{}:{}:{}", unit.parent, unit.commit.0, unit.config_at.0);
    let base: std::sync::Arc<UnitBase> = app
        .unit_bases
        .get_or_make(key, || UnitBase::make(app, unit))
        .await?;
    let UnitBase {
        config,
        policies,
        checkout,
        engine,
    } = &*base;
    let root = config
        .roots
        .iter()
        .find(|r| r.name == unit.root)
        .with_context(|| format!("the repo config has no root `{}`", unit.root))?;
    let (token, _following) = CancelToken::following(cancel);
    let gate_project = GateProject {
        id: project.0,
        path: job.project_path.clone(),
    };
    let runs = JobRuns::new(
        &app.config,
        Trust::MergeRequest,
        gate_project,
        &unit.commit,
        checkout.path(),
    )
    .cancelled_by(token);
    let of_job = OfJob {
        config,
        engine,
        policies,
        commit: &unit.commit,
        project_path: job.project_path.clone(),
    };
    let nothing = Default::default();
    let planner = RootPlanner::of_unit(app, job, id, of_job, runs, &nothing, cancel, started);
    let planned = planner.plan_in_slot(root, false).await?;
    let end = cpu_bound(|| planner.unit_end(planned))?;
    let sealed = super::units::seal(app, &end)?;
    drop(planner);
    drop(base);
    app.store
        .finish_unit(id, QueueJobId(unit.parent), sealed)
        .await
}

/// What the units of one plan job running here at once share ([`App::unit_bases`]): the
/// commit checked out once, the repo config and policy sets of the default branch's commit the
/// plan job read, and the MR's engine.
struct UnitBase {
    config: RepoConfig,
    policies: PolicySets,
    checkout: Checkout,
    engine: Engine,
}

impl UnitBase {
    /// The mirror fetched when it lacks either commit (from the clone URL GitLab gives, never
    /// one from the store: the workspace sends the bot's token to it), then each read from it.
    async fn make(app: &App, unit: &RootUnit) -> Result<UnitBase> {
        let (project, ws) = (unit.plan.project, &app.workspace);
        let mut present = true;
        for rev in [&unit.commit, &unit.config_at] {
            present &= ws
                .rev_parse(project, rev.as_str())
                .await
                .ok()
                .flatten()
                .is_some();
        }
        if !present {
            let info = app.gitlab.project(&project.to_string()).await;
            let info = crate::flows::review::gitlab_calls::gl(app, "project", info)?;
            ws.sync(project, &info.http_url_to_repo)
                .await
                .context("fetching the repository")?;
        }
        let config = ws
            .repo_config_at(project, unit.config_at.as_str())
            .await?
            .map_err(|e| {
                anyhow::anyhow!("the repo config its plan job read does not read here: {e}")
            })?;
        let rev = unit.config_at.as_str();
        let policies = PolicySets::load_at(app, project, rev, &unit.default_branch, &config)
            .await
            .context("reading the policy sets")?;
        let checkout = ws.checkout(project, &unit.commit).await?;
        let engine = app.mr_engine(project, unit.plan.mr)?;
        Ok(UnitBase {
            config,
            policies,
            checkout,
            engine,
        })
    }
}
