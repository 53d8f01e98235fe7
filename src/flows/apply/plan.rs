//! The engine's plan of one root at the merged commit, with the apply credentials
//! ([`Trust::DefaultBranch`]): the request ([`plan_request`], with the gate of GitLab-managed
//! state), the run, a failed plan's run ended with why (who holds a state lock), and the plan's
//! lint findings ([`lint`]).

use super::ctx::ApplyCtx;
use super::log::{lock_text, ApplyFailure};
use crate::capabilities::engine::{EngineError, PlanRequest, PlannedRun};
use crate::core::ids::RunId;
use crate::core::proxmox::findings::{Facts, Finding};
use crate::core::repo_config::Root;
use crate::core::state::{self, HeldLock};
use crate::core::targeting::Targeting;
use crate::flows::confinement::plan_request::{self, RootRun};
use crate::flows::context::cpu::cpu_bound;
use minijinja::context;

/// The engine's run of `root`: the one request every trust level builds
/// (`flows::confinement::plan_request`), with the apply credentials and the job's state gate,
/// planned with the reviewed plan's flags (`targeting`).
async fn root_run(
    ctx: &ApplyCtx,
    root: &Root,
    targeting: &Targeting,
) -> Result<RootRun, ApplyFailure> {
    ctx.runs_for(targeting)
        .request(root, targeting)
        .await
        .map_err(|not_planned| ApplyFailure::NotPlanned {
            root: root.name.clone(),
            why: not_planned.to_string(),
        })
}

/// The engine's plan of `root` at the merged commit, with the apply credentials. A failure
/// ends the root's `run`, and is said in the job's log.
pub(super) async fn plan(
    ctx: &ApplyCtx,
    root: &Root,
    run: RunId,
    targeting: &Targeting,
) -> Result<PlannedRun, ApplyFailure> {
    ctx.log.say(
        "planning",
        context! { root => &root.name, dir => &root.dir },
    );
    let prepared = async {
        let engine = ctx
            .app
            .default_branch_engine()
            .map_err(ApplyFailure::Internal)?;
        Ok::<_, ApplyFailure>((engine, root_run(ctx, root, targeting).await?))
    }
    .await;
    let (engine, RootRun { dir, request }) = match prepared {
        Ok(prepared) => prepared,
        Err(failure) => return Err(ctx.fail_run(run, failure, "").await),
    };
    let slot = ctx.app.engine_slot().await;
    let planned = engine.plan(&dir, &request).await;
    drop(slot);
    match planned {
        Ok(p) => Ok(p),
        Err(e) => Err(plan_failed(ctx, root, run, &request, e).await),
    }
}

/// A plan the engine could not make: its run ended with the engine's report, which the job's
/// log shows; when someone else holds the state's lock, who, since when, and how to free it.
async fn plan_failed(
    ctx: &ApplyCtx,
    root: &Root,
    run: RunId,
    request: &PlanRequest,
    e: EngineError,
) -> ApplyFailure {
    let report = plan_request::failure_report(request, &e);
    let report = ctx.app.scrubber.scrub(&report).into_owned();
    let failure = ApplyFailure::PlanFailed {
        root: root.name.clone(),
        error: ctx.first_error_line(&report),
    };
    let failure = ctx.fail_run(run, failure, &report).await;
    ctx.log.line(&report);
    ctx.explain_denial(&report);
    let Some(lock) = HeldLock::from_engine_output(&report) else {
        return failure;
    };
    let lock = who_holds(ctx, root, lock).await;
    let root = root.name.clone();
    let waited = humantime::format_duration(ctx.app.config.engine.lock_timeout).to_string();
    let hint = lock_text(&ctx.app.scrubber, "locked_hint", &root, &lock, &waited);
    ctx.log.say(
        "hint",
        context! { hint => minijinja::Value::from_safe_string(hint) },
    );
    ApplyFailure::StateLocked { root, lock, waited }
}

/// `lock` with who holds it and since when, from GitLab for GitLab-managed state (the
/// engine's `http` backend names only the lock's ID); as it is when GitLab cannot tell.
async fn who_holds(ctx: &ApplyCtx, root: &Root, lock: HeldLock) -> HeldLock {
    let Some(name) = state::gitlab_state_name(root, ctx.app.config.state.default) else {
        return lock;
    };
    match ctx
        .app
        .gitlab
        .terraform_state_lock(&ctx.project_path, &name)
        .await
    {
        Ok(Some(held)) => lock.held_by(&held.username, &held.locked_at),
        Ok(None) => lock,
        Err(e) => {
            ctx.app.metrics.gitlab_error("terraform_state_lock");
            tracing::warn!(error = %e, "could not ask GitLab who holds a state lock");
            lock
        }
    }
}

/// The lint findings of `root`'s plan, as the MR's note shows them (the root's `lint_disable`
/// and `parallelism` applied).
pub(super) fn lint(root: &Root, planned: &PlannedRun) -> Vec<Finding> {
    let facts = Facts {
        parallelism: root.parallelism,
        ..Default::default()
    };
    cpu_bound(|| crate::core::proxmox::lint::lint_with(planned.plan(), &root.lint_disable, &facts))
}
