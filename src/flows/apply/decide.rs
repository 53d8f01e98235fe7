//! The one apply decision (docs/workflow.md, "Apply from main"): a root planned on the merged
//! commit with the apply credentials, and what becomes of that plan: applied (the plan reviewed
//! on the MR, or confirmed), nothing to apply, refused ([`ApplyRefusal`]) or failed
//! ([`ApplyFailure`]). The first plan of every root ([`super::parity`]) and the re-plan of a
//! root after an upstream applied ([`super::order`]) both ask [`decide`].

use super::ctx::ApplyCtx;
use super::judge;
use super::log::ApplyFailure;
use super::plan;
use super::shown;
use crate::capabilities::engine::PlannedRun;
use crate::capabilities::store::ShownFingerprint;
use crate::capabilities::workspace::RootFiles;
use crate::core::apply::{parity, ApplyRefusal, Parity};
use crate::core::apply_note::Relied;
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::RunId;
use crate::core::plan::{ActionKind, Plan};
use crate::core::replan::{compare, Replan};
use crate::core::repo_config::Root;
use crate::core::state::{self, Backend};
use crate::core::summary::Summary;
use crate::core::targeting::Targeting;
use crate::flows::context::cpu::cpu_bound;
use crate::flows::context::locks::RootGuard;
use minijinja::context;
use std::path::Path;

/// What a root's plan is decided against.
pub(super) struct Ask<'a> {
    pub root: &'a Root,
    /// The plan shown on the MR for the root; none when it was not planned there (or no MR).
    pub reviewed: Option<&'a ShownFingerprint>,
    /// The flags the reviewed plan was made with: the root is planned again with them.
    pub targeting: &'a Targeting,
    /// `PLANBOT_CONFIRM`: the fingerprint prefix of a plan to apply though not reviewed.
    pub confirm: Option<&'a str>,
    /// For a re-plan after an upstream applied: the plan checked before.
    pub checked: Option<CheckedPlan<'a>>,
}

/// The plan checked against the review before `upstream` applied. A re-plan that differs from
/// it only in values it showed as "known after apply" ([`crate::core::replan`]) is applied as
/// that plan.
pub(super) struct CheckedPlan<'a> {
    pub plan: &'a PlannedRun,
    pub confirmed: bool,
    pub upstream: &'a str,
}

/// What becomes of a root's plan.
pub(super) enum Outcome {
    /// Apply it (the reviewed plan, or `confirmed` with `PLANBOT_CONFIRM`) under `guard`, the
    /// root's lock it was planned under.
    Apply {
        planned: Box<PlannedRun>,
        confirmed: bool,
        guard: RootGuard,
    },
    Nothing,
    Refused(ApplyRefusal),
}

/// One root of the apply once decided: its run, its plan and what becomes of it.
pub(super) struct Decided {
    pub root: String,
    pub run: RunId,
    pub fingerprint: Fingerprint,
    pub summary: Summary,
    /// The engine's log of every plan of the root in this apply.
    pub plan_log: String,
    pub outcome: Outcome,
    /// The policy verdicts and approvals the decision relied on (said in the job's log), for
    /// its caller to collect.
    pub relied: Vec<Relied>,
}

impl Decided {
    pub fn refusal(&self) -> Option<&ApplyRefusal> {
        match &self.outcome {
            Outcome::Refused(r) => Some(r),
            _ => None,
        }
    }
}

/// Decide `root` of the merged commit (its `run`, its lock `guard`): what was reviewed of it on
/// the MR, then [`decide`]. A failure has ended the run.
pub(super) async fn decide_root(
    ctx: &ApplyCtx,
    root: &Root,
    run: RunId,
    guard: RootGuard,
    confirm: Option<&str>,
    checked: Option<CheckedPlan<'_>>,
) -> Result<Decided, ApplyFailure> {
    let (reviewed, mut targeting) = match reviewed_plan(ctx, root).await {
        Ok(r) => r,
        Err(e) => return Err(ctx.fail_run(run, ApplyFailure::Internal(e), "").await),
    };
    // A root the merge retires is planned as its destroy, as the MR planned it.
    if ctx.retires(&root.name) {
        targeting = Targeting::destroy();
    }
    let ask = Ask {
        root,
        reviewed: reviewed.as_ref(),
        targeting: &targeting,
        confirm,
        checked,
    };
    decide(ctx, &ask, run, guard).await
}

/// The plan reviewed on the MR for `root`, and the flags it was made with (a targeted plan is
/// planned again with the same ones; the full plan otherwise).
async fn reviewed_plan(
    ctx: &ApplyCtx,
    root: &Root,
) -> anyhow::Result<(Option<ShownFingerprint>, Targeting)> {
    let Some(mr) = &ctx.mr else {
        return Ok((None, Targeting::default()));
    };
    let store = &ctx.app.store;
    let reviewed = store
        .last_shown_fingerprint(ctx.project, mr.iid, &root.name)
        .await?;
    let targeting = match &reviewed {
        Some(r) => {
            store
                .plan_targeting(ctx.project, mr.iid, &r.sha, &root.name)
                .await?
        }
        None => Targeting::default(),
    };
    Ok((reviewed, targeting))
}

/// The one decision: plan `ask.root` (its `run`, under its lock `guard`) in the job's checkout with the
/// reviewed plan's flags, and judge the plan: a state kept in the checkout is refused; then
/// parity with the reviewed plan (or, for a re-plan, the checked plan), the policy sets, the
/// preflight and the targeted gate. A failure has ended the run.
pub(super) async fn decide(
    ctx: &ApplyCtx,
    ask: &Ask<'_>,
    run: RunId,
    guard: RootGuard,
) -> Result<Decided, ApplyFailure> {
    let root = ask.root;
    if ask.targeting.destroy {
        let base = ctx.policy.base.as_ref().map(|b| b.short().to_string());
        ctx.log
            .say("retired", context! { root => &root.name, base });
    } else if !ask.targeting.is_empty() {
        ctx.log.say(
            "targeted",
            context! { root => &root.name, flags => ask.targeting.engine_args().join(" ") },
        );
    }
    let planned = plan::plan(ctx, root, run, ask.targeting).await?;
    let key = ctx.app.config.fingerprint_key.expose().as_bytes();
    let fingerprint = cpu_bound(|| planned.fingerprint(key));
    let summary = Summary::of(planned.plan());
    let plan_log = planned.log().to_string();
    let decided = |outcome, relied| Decided {
        root: root.name.clone(),
        run,
        outcome,
        fingerprint: fingerprint.clone(),
        summary,
        plan_log: plan_log.clone(),
        relied,
    };
    if planned.backend().is_local() {
        // What the files did not tell, `init` did: the state would be lost. Nothing applies.
        let refusal = ApplyRefusal::StateInCheckout {
            root: root.name.clone(),
        };
        return Ok(decided(Outcome::Refused(refusal), Vec::new()));
    }
    ctx.log.say(
        "planned",
        context! {
            root => &root.name,
            summary => summary.one_line(),
            fingerprint => fingerprint.short(),
        },
    );
    let judged = match planned.plan().errored {
        true => Err(ApplyFailure::PlanErrored {
            root: root.name.clone(),
        }),
        false => judge(ctx, ask, &planned, &fingerprint)
            .await
            .map_err(ApplyFailure::Internal),
    };
    let (parity, relied) = match judged {
        Ok(j) => j,
        Err(failure) => return Err(ctx.fail_run(run, failure, &plan_log).await),
    };
    let outcome = conclude(ctx, ask, parity, planned, guard, &fingerprint).await;
    Ok(decided(outcome, relied))
}

/// Parity with the reviewed plan; for a re-plan that parity refuses, the plan checked before
/// (the same, or the same but for values known after apply); then, for a plan to apply, the
/// policy sets, the preflight and the targeted gate. The policy reliances said on the way.
async fn judge(
    ctx: &ApplyCtx,
    ask: &Ask<'_>,
    planned: &PlannedRun,
    fingerprint: &Fingerprint,
) -> anyhow::Result<(Parity, Vec<Relied>)> {
    let root = ask.root;
    let mut decision = parity(
        &root.name,
        fingerprint,
        !plan_has_changes(planned.plan()),
        ctx.mr.is_some(),
        ask.reviewed.map(|r| &r.fingerprint),
        ask.confirm,
        &ctx.sha,
    );
    // The reviewed verdict of the policy sets covers the plan only when it is the reviewed
    // plan itself.
    let mut reviewed = ask.reviewed.filter(|r| r.fingerprint.ct_eq(fingerprint));
    let mut as_checked = false;
    if let (Parity::Refuse(_), Some(checked)) = (&decision, &ask.checked) {
        let replan = cpu_bound(|| compare(checked.plan.plan(), planned.plan()));
        say_replan(ctx, &root.name, checked.upstream, &replan);
        if !matches!(replan, Replan::Differs(_)) {
            decision = Parity::Apply {
                confirmed: checked.confirmed,
            };
            as_checked = true;
        }
        if matches!(replan, Replan::Resolved(_)) {
            reviewed = None;
        }
    }
    let mut relied = Vec::new();
    if let Parity::Apply { confirmed } = decision {
        let policy = judge::policy(ctx, root, confirmed, reviewed, planned, fingerprint).await?;
        relied = policy.relied;
        let refusal = match policy.refusal {
            Some(r) => Some(r),
            None => judge::preflight(ctx, &root.name, planned.plan()).await,
        };
        if let Some(refusal) = refusal {
            decision = Parity::Refuse(refusal);
        }
    }
    // A plan applied as the checked one passed the targeted gate as that plan.
    if !as_checked {
        decision = targeted_gate(
            decision,
            &root.name,
            ask.targeting,
            fingerprint,
            ask.confirm,
        );
    }
    Ok((decision, relied))
}

/// How a re-plan compares with the checked plan, in the job's log (when it is not the same).
fn say_replan(ctx: &ApplyCtx, root: &str, upstream: &str, replan: &Replan) {
    match replan {
        Replan::Same => {}
        Replan::Resolved(paths) => ctx.log.say(
            "replan_resolved",
            context! { root => root, upstream => upstream, paths => paths },
        ),
        Replan::Differs(diff) => ctx.log.say(
            "replan_differs",
            context! {
                root => root,
                upstream => upstream,
                diff => diff.kind.name(),
                address => &diff.address,
                path => diff.kind.path(),
            },
        ),
    }
}

/// The judged plan's outcome, said: why it is applied (under the lock it was planned under), or
/// the refused plan shown (and, when it changed since the review, the plan-changed note on the
/// MR).
async fn conclude(
    ctx: &ApplyCtx,
    ask: &Ask<'_>,
    decision: Parity,
    planned: PlannedRun,
    guard: RootGuard,
    fingerprint: &Fingerprint,
) -> Outcome {
    let root = ask.root;
    match decision {
        Parity::NothingToApply => Outcome::Nothing,
        Parity::Apply { confirmed } => {
            say_why_applied(ctx, root, confirmed, fingerprint);
            if ask.targeting.is_partial() {
                ctx.log.say(
                    "targeted_confirmed",
                    context! { root => &root.name, fingerprint => fingerprint.short() },
                );
            }
            Outcome::Apply {
                planned: Box::new(planned),
                confirmed,
                guard,
            }
        }
        Parity::Refuse(refusal) => {
            shown::print_plan(ctx, &planned, root);
            if let (ApplyRefusal::PlanChanged { .. }, Some(mr), Some(reviewed)) =
                (&refusal, &ctx.mr, ask.reviewed)
            {
                shown::post_plan_changed(ctx, mr.iid, root, &planned, fingerprint, reviewed).await;
            }
            Outcome::Refused(refusal)
        }
    }
}

/// Say in the job log why this root may be applied: confirmed by fingerprint, or the plan
/// reviewed on the MR.
fn say_why_applied(ctx: &ApplyCtx, root: &Root, confirmed: bool, fingerprint: &Fingerprint) {
    if confirmed {
        ctx.log.say(
            "confirmed",
            context! { root => &root.name, fingerprint => fingerprint.short() },
        );
    } else {
        ctx.log.say(
            "reviewed",
            context! {
                root => &root.name,
                mr => ctx.mr_iid().map(|m| m.0).unwrap_or_default(),
            },
        );
    }
}

/// A targeted plan (`-target` or `-exclude`) leaves changes of the root out: applied as
/// reviewed, they would remain unapplied without anyone having decided so at the apply. So it
/// is applied only when `PLANBOT_CONFIRM` names its fingerprint; otherwise refused, saying why.
/// A `-replace` alone plans every change, and passes as reviewed.
fn targeted_gate(
    decision: Parity,
    root: &str,
    targeting: &Targeting,
    fresh: &Fingerprint,
    confirm: Option<&str>,
) -> Parity {
    match decision {
        Parity::Apply { .. }
            if targeting.is_partial() && !confirm.is_some_and(|c| fresh.matches_prefix(c)) =>
        {
            Parity::Refuse(ApplyRefusal::TargetedPlan {
                root: root.to_string(),
                left_out: targeting.counts(),
                flags: targeting.engine_args(),
                fresh: fresh.as_hex().to_string(),
            })
        }
        other => other,
    }
}

/// The refusal of a root whose state is a file in the checkout, as its files declare it
/// (read before any engine runs; a root with GitLab-managed state never is one). `None`
/// also when the files cannot be read as HCL: then `init` tells ([`decide`]).
pub(super) fn state_in_checkout(
    ctx: &ApplyCtx,
    root: &Root,
    checkout: &Path,
) -> Option<ApplyRefusal> {
    if state::gitlab_state_name(root, ctx.app.config.state.default).is_some() {
        return None;
    }
    let files = RootFiles::open(checkout, &root.dir)
        .and_then(|f| f.config_files())
        .ok()?;
    Backend::declared(&files)
        .filter(Backend::is_local)
        .map(|_| ApplyRefusal::StateInCheckout {
            root: root.name.clone(),
        })
}

/// Whether a plan changes anything at all (resources, moves, imports, outputs).
pub fn plan_has_changes(plan: &Plan) -> bool {
    plan.managed_changes().any(|rc| rc.has_change())
        || plan
            .output_changes
            .values()
            .any(|o| o.kind() != ActionKind::NoOp)
}
