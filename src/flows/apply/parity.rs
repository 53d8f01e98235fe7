//! Apply stage 4: plan every root again on the merged commit, with the apply credentials and
//! each under its root lock, and decide ([`super::decide`]): a root is applied only when its
//! fresh plan's fingerprint is the one shown on the MR (or confirmed); one refusal refuses the
//! whole apply and shows what changed.

use super::ctx::ApplyCtx;
use super::decide::{decide_root, state_in_checkout, Decided};
use super::log::{ApplyFailure, Verdict};
use super::rails;
use super::report;
use crate::capabilities::gitlab::StatusState;
use crate::capabilities::store::{ApplyId, ApplyState, NewRun, RunKind, RunState};
use crate::core::apply::ApplyRefusal;
use crate::core::apply_note::Relied;
use crate::core::repo_config::Root;
use anyhow::{Context, Result};
use minijinja::context;
use std::path::Path;

/// Every root of the apply, decided, and the policy reliances their decisions said.
#[derive(Default)]
pub(super) struct Planned {
    pub decided: Vec<Decided>,
    pub relied: Vec<Relied>,
}

/// Stage 4: plan every root (each under its lock) and decide. Nothing is applied unless every
/// root with changes is the reviewed plan: a half-applied main helps nobody. `Err(verdict)`
/// ends the apply here (a root failed to plan, or a refusal), already recorded and reported.
pub(super) async fn plan_and_decide(
    ctx: &ApplyCtx,
    apply_id: ApplyId,
    roots: &[&Root],
    checkout: &Path,
    confirm: Option<&str>,
) -> Result<Result<Planned, Verdict>> {
    let mut planned = Planned::default();
    // What the apply waits for besides its plans (a deploy freeze): refused before any engine
    // runs.
    if let Some(refusal) = rails::held(ctx).await {
        return Ok(Err(refuse_apply(ctx, apply_id, &planned, refusal).await?));
    }
    // A root whose state would be written into this throwaway checkout is refused before any
    // engine runs.
    if let Some(refusal) = roots
        .iter()
        .find_map(|r| state_in_checkout(ctx, r, checkout))
    {
        return Ok(Err(refuse_apply(ctx, apply_id, &planned, refusal).await?));
    }
    for root in roots {
        match plan_root(ctx, root, confirm).await {
            Ok(mut d) => {
                planned.relied.append(&mut d.relied);
                planned.decided.push(d);
            }
            Err(failure) => {
                let failure = failure.text(&ctx.app.scrubber);
                let verdict = Verdict::Failed(failure.clone());
                let (decided, relied) = (&planned.decided, &planned.relied);
                report::finish(ctx, apply_id, decided, relied, &verdict, Some(&failure)).await;
                return Ok(Err(verdict));
            }
        }
    }
    if let Some(refusal) = planned.decided.iter().find_map(|d| d.refusal().cloned()) {
        return Ok(Err(refuse_apply(ctx, apply_id, &planned, refusal).await?));
    }
    Ok(Ok(planned))
}

/// Lock the root, record its run, and decide it.
async fn plan_root(
    ctx: &ApplyCtx,
    root: &Root,
    confirm: Option<&str>,
) -> Result<Decided, ApplyFailure> {
    let guard = ctx.lock_root(root).await;
    let run = ctx
        .app
        .store
        .start_run(NewRun {
            job: None,
            kind: RunKind::Apply,
            project: ctx.project,
            project_path: Some(ctx.project_path.clone()),
            mr: ctx.mr_iid(),
            root: root.name.clone(),
            sha: ctx.sha.clone(),
        })
        .await
        .context("recording the run")
        .map_err(ApplyFailure::Internal)?;
    decide_root(ctx, root, run, guard, confirm, None).await
}

/// End the apply refused: its runs, the job log's hint and verdict, the stored apply and the
/// `planbot/apply` status.
async fn refuse_apply(
    ctx: &ApplyCtx,
    apply_id: ApplyId,
    planned: &Planned,
    refusal: ApplyRefusal,
) -> Result<Verdict> {
    let hint = confirm_each(ctx, &planned.decided)
        .unwrap_or_else(|| crate::core::templates::scrubbing(&ctx.app.scrubber, || refusal.hint()));
    let why = ctx.log.refusal_hinted(&refusal, hint.clone());
    // The run pages say why, as the status and the job's log do.
    let because = ctx.say(
        "refused_because",
        context! { refusal => minijinja::Value::from_safe_string(why.clone()) },
    );
    for d in &planned.decided {
        ctx.end_run(d.run, RunState::Refused, &because, &d.plan_log)
            .await;
    }
    ctx.app
        .store
        .finish_apply(apply_id, ApplyState::Refused, Some(why.clone()))
        .await?;
    // `failed`: the job did not apply. A retried job's `running` then starts a new status
    // (GitLab updates only a pending/running one), so the commit shows the retry's outcome.
    ctx.status(StatusState::Failed, &because).await;
    report::report_refused(ctx, &planned.decided, &planned.relied, &why, &hint).await;
    Ok(Verdict::Refused(why))
}

/// With several roots whose fresh plan only a confirmation would apply, each has its own
/// fingerprint and one `PLANBOT_CONFIRM` confirms one: the hint names each root with the
/// `PLANBOT_ROOTS` and `PLANBOT_CONFIRM` that apply it (`None` with one root or none).
fn confirm_each(ctx: &ApplyCtx, decided: &[Decided]) -> Option<String> {
    let each: Vec<(&str, &str)> = decided
        .iter()
        .filter(|d| d.refusal().is_some_and(ApplyRefusal::confirmable))
        .map(|d| (d.root.as_str(), &d.fingerprint.as_hex()[..12]))
        .collect();
    (each.len() > 1).then(|| {
        crate::core::templates::scrubbing(&ctx.app.scrubber, || {
            super::log::log_text("confirm_each", context! { roots => each })
        })
        .trim()
        .trim_start_matches("planbot: ")
        .to_string()
    })
}
