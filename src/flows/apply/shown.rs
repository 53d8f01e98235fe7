//! What the job's log and the merge request show of a plan the apply refuses: the plan itself
//! (for a direct push, the only review it gets), and for a changed plan the plan-changed note:
//! what changed since the review, and the new plan as the MR would show it.

use super::ctx::ApplyCtx;
use super::plan::lint;
use crate::capabilities::engine::PlannedRun;
use crate::capabilities::store::ShownFingerprint;
use crate::core::apply_note::{render_plan_changed, PlanChangedNote};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::MrIid;
use crate::core::plan_digest::{delta, PlanDigest};
use crate::core::render::{render_note, NoteContext, RootOutcome, RootSection, NOTE_MARKER};
use crate::core::repo_config::Root;
use crate::flows::context::cpu::cpu_bound;
use minijinja::context;

/// Show the fresh plan in the job log (for a direct push, this is the only review).
pub(super) fn print_plan(ctx: &ApplyCtx, planned: &PlannedRun, root: &Root) {
    ctx.log.say("plan_is", context! { root => &root.name });
    for rc in planned
        .plan()
        .managed_changes()
        .filter(|rc| rc.has_change())
    {
        ctx.log.say(
            "change",
            context! {
                symbol => rc.kind().symbol(),
                address => rc.display_address(),
                verb => rc.kind().verb(),
            },
        );
    }
}

/// The plan-changed note on MR `mr`: the reviewed plan's fingerprint and the fresh one, what
/// changed between them (by their digests), and the fresh plan as the MR's note shows a plan.
pub(super) async fn post_plan_changed(
    ctx: &ApplyCtx,
    mr: MrIid,
    root: &Root,
    planned: &PlannedRun,
    fresh: &Fingerprint,
    reviewed: &ShownFingerprint,
) {
    let key = ctx.app.config.fingerprint_key.expose().as_bytes();
    // The run's secrets: the config's (given to the run) and the plan's own.
    let scrubber = planned.scrubber();
    // Scrubbed as the reviewed one was when it was recorded.
    let fresh_digest = cpu_bound(|| PlanDigest::of(planned.plan(), key).scrubbed(scrubber));
    let reviewed_digest = ctx
        .app
        .store
        .digest_for(ctx.project, mr, &root.name, &reviewed.sha)
        .await
        .ok()
        .flatten();
    let d = reviewed_digest
        .map(|r| delta(&r, &fresh_digest))
        .unwrap_or_default();
    let findings = lint(root, planned);
    let new_plan = cpu_bound(|| {
        render_note(
            &NoteContext {
                sha: Some(ctx.sha.0.clone()),
                engine: Some(planned.version().to_string()),
                ..NoteContext::default()
            },
            &[RootSection {
                name: root.name.clone(),
                outcome: RootOutcome::Planned {
                    plan: planned.plan(),
                    findings: &findings,
                    fingerprint: fresh,
                },
            }],
            scrubber,
        )
    })
    .replace(NOTE_MARKER, "");
    let body = render_plan_changed(
        &PlanChangedNote {
            root: &root.name,
            sha: ctx.sha.as_str(),
            job_name: &ctx.app.config.apply.job_name,
            user: ctx.user.as_deref(),
            reviewed_short: reviewed.fingerprint.short(),
            fresh_short: fresh.short(),
            delta: &d,
            new_plan: &new_plan,
        },
        scrubber,
    );
    if let Err(e) = ctx.app.gitlab.create_mr_note(ctx.project, mr, &body).await {
        ctx.app.metrics.gitlab_error("create_mr_note");
        tracing::warn!(error = %e, "could not post the plan-changed note");
    }
}
