//! What judges a plan the apply would apply, besides parity: the policy sets ([`policy`], the
//! sets of [`super::policy::PolicyGate`]) and the Proxmox preflight ([`preflight`]). The reviewed
//! plan is judged by the verdict recorded on the merge request when that verdict holds every
//! set that checks the root now; any other plan (confirmed with `PLANBOT_CONFIRM`, a root the
//! sets did not check at review) is checked here, and waits for an owner where a set fails.

use super::ctx::ApplyCtx;
use super::plan::lint;
use crate::capabilities::engine::PlannedRun;
use crate::capabilities::store::{PolicyApproval, PolicyVerdictRecord, ShownFingerprint};
use crate::core::apply::{ApplyRefusal, PolicyAtApply};
use crate::core::apply_note::{Reliance, Relied};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::CommitSha;
use crate::core::plan::Plan;
use crate::core::policy::review::{RecordedVerdict, SetOrigin};
use crate::core::repo_config::Root;
use crate::flows::context::cpu::cpu_bound;
use crate::flows::context::policy_sets::PolicySets;
use anyhow::Result;
use minijinja::context;

/// The policy sets' judgment of one plan: the refusal, if a failing set was not approved, and
/// the verdicts and approvals it relied on (each said in the job's log).
#[derive(Default)]
pub(super) struct Judged {
    pub refusal: Option<ApplyRefusal>,
    pub relied: Vec<Relied>,
}

/// The policy gate of one root's plan to apply (`planned`, `fingerprint`): the verdict
/// recorded for the reviewed plan when it holds every set that checks the root now (and the
/// owners' approvals of that plan); else the sets' verdict on this plan, recorded on the merge
/// request so that an owner can approve it there. `reviewed`: the reviewed plan, when this
/// is it.
pub(super) async fn policy(
    ctx: &ApplyCtx,
    root: &Root,
    confirmed: bool,
    reviewed: Option<&ShownFingerprint>,
    planned: &PlannedRun,
    fingerprint: &Fingerprint,
) -> Result<Judged> {
    let sets = ctx.policy.covering(root);
    if let (false, Some(r), Some(mr)) = (confirmed, reviewed, &ctx.mr) {
        let verdict = ctx
            .app
            .store
            .policy_verdicts(ctx.project, mr.iid, &r.sha)
            .await?
            .into_iter()
            .find(|v| v.root == root.name && v.fingerprint == r.fingerprint)
            .filter(|v| {
                sets.sets
                    .iter()
                    .all(|s| v.verdict.sets.iter().any(|rs| rs.name == s.spec.name))
            });
        if let Some(v) = verdict {
            return reviewed_verdict(ctx, &root.name, r, &v.verdict).await;
        }
    }
    if sets.sets.is_empty() {
        return Ok(Judged::default());
    }
    check_now(ctx, root, &sets, planned, fingerprint).await
}

/// The gate of the reviewed plan `r`: its recorded verdict and the approvals of that plan.
async fn reviewed_verdict(
    ctx: &ApplyCtx,
    root: &str,
    r: &ShownFingerprint,
    verdict: &RecordedVerdict,
) -> Result<Judged> {
    let Some(mr) = &ctx.mr else {
        return Ok(Judged::default());
    };
    let approvals = ctx.app.store.policy_approvals(ctx.project, mr.iid).await?;
    let ok = PolicyApproval::sets_for(&approvals, root, &r.sha, &r.fingerprint);
    let mut relied = Vec::new();
    for set in verdict.blocking().filter(|s| ok.contains(&s.name.as_str())) {
        let approvers = approvers(&approvals, root, &r.sha, &set.name, &r.fingerprint);
        relied.push(ctx.log.rely(
            Reliance::Approved,
            "policy_approved",
            context! { root => root, set => &set.name, approvers => approvers },
        ));
    }
    let passed = verdict.sets.iter().filter(|s| !s.blocks()).count();
    if passed > 0 {
        relied.push(ctx.log.rely(
            Reliance::Passed,
            "policies_passed",
            context! { root => root, count => passed },
        ));
    }
    let refusal = verdict
        .first_unapproved(&ok)
        .map(|set| ApplyRefusal::PolicyFailed {
            root: root.to_string(),
            set: set.name.clone(),
            message: set.first_message(),
            owners: set.owners.iter().map(|o| o.to_string()).collect(),
        });
    Ok(Judged { refusal, relied })
}

/// A plan no merge request's verdict covers, checked now by `sets`: the verdict is recorded on
/// the merge request (where an owner approves a failing set), and judged with the approvals.
async fn check_now(
    ctx: &ApplyCtx,
    root: &Root,
    sets: &PolicySets,
    planned: &PlannedRun,
    fingerprint: &Fingerprint,
) -> Result<Judged> {
    ctx.log.say(
        "policy_check_now",
        context! {
            root => &root.name,
            branch => &ctx.branch,
            base => ctx.policy.base.as_ref().map(|b| b.short().to_string()),
        },
    );
    let findings = lint(root, planned);
    let recorded = cpu_bound(|| {
        let document = sets.read_document(&root.name, planned.plan_json());
        // As with the preflight's findings, what the plan takes from the cluster is read
        // at plan time: a verdict made here (none was recorded) sees lint findings only.
        let verdict = sets.evaluate(&root.name, document, &findings, None);
        sets.record(&root.name, &verdict, planned.scrubber())
    });
    let mut approvals = Vec::new();
    if let Some(mr) = &ctx.mr {
        ctx.app
            .store
            .record_policy_verdict(PolicyVerdictRecord {
                project: ctx.project,
                mr: mr.iid,
                root: root.name.clone(),
                sha: ctx.sha.clone(),
                fingerprint: fingerprint.clone(),
                verdict: recorded.clone(),
            })
            .await?;
        approvals = ctx.app.store.policy_approvals(ctx.project, mr.iid).await?;
    }
    let ok = PolicyApproval::sets_for(&approvals, &root.name, &ctx.sha, fingerprint);
    let mut relied = Vec::new();
    for set in &recorded.sets {
        if !set.blocks() {
            relied.push(ctx.log.rely(
                Reliance::Passed,
                "policy_now_passed",
                context! { root => &root.name, set => &set.name },
            ));
        } else if ok.contains(&set.name.as_str()) {
            let approvers = approvers(&approvals, &root.name, &ctx.sha, &set.name, fingerprint);
            relied.push(ctx.log.rely(
                Reliance::Approved,
                "policy_now_approved",
                context! { root => &root.name, set => &set.name, approvers => approvers },
            ));
        }
    }
    let refusal = recorded.first_unapproved(&ok).map(|set| {
        ApplyRefusal::PolicyFailedAtApply(Box::new(PolicyAtApply {
            root: root.name.clone(),
            set: set.name.clone(),
            operator: set.origin == SetOrigin::Operator,
            branch: ctx.branch.clone(),
            base: ctx
                .policy
                .base
                .as_ref()
                .map(|b| b.short().to_string())
                .unwrap_or_default(),
            message: set.first_message(),
            owners: set.owners.iter().map(|o| o.to_string()).collect(),
            mr: ctx.mr.as_ref().map(|m| m.iid.0),
        }))
    });
    Ok(Judged { refusal, relied })
}

/// Who approved set `set` of `root` for the plan `fingerprint` of `sha`.
fn approvers<'a>(
    approvals: &'a [PolicyApproval],
    root: &str,
    sha: &CommitSha,
    set: &str,
    fingerprint: &Fingerprint,
) -> Vec<&'a str> {
    approvals
        .iter()
        .filter(|a| a.root == root && &a.sha == sha && a.set == set)
        .filter(|a| &a.fingerprint == fingerprint)
        .map(|a| a.approver.as_str())
        .collect()
}

/// The Proxmox preflight with the apply credentials, just before applying: an error
/// finding refuses the apply (no endpoint configured: nothing to check).
pub(super) async fn preflight(ctx: &ApplyCtx, root: &str, plan: &Plan) -> Option<ApplyRefusal> {
    let config = &ctx.app.config;
    let endpoint = crate::flows::preflight::endpoint_from_config(
        &config.proxmox.for_apply(),
        &config.engine.env,
    );
    match crate::flows::preflight::before_apply(endpoint, plan).await {
        Ok(findings) => {
            for f in findings {
                ctx.log.say(
                    "finding",
                    context! { rule => f.rule, address => &f.address, message => &f.message },
                );
            }
            None
        }
        Err(why) => Some(ApplyRefusal::PreflightFailed {
            root: root.to_string(),
            finding: why,
        }),
    }
}
