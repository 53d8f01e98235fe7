//! Apply stage 4: apply the plan files that were just checked against the review, upstream roots
//! first (`depends_on`), each under the lock its plan was made under, streaming the engine's
//! output to the job; a dependent re-planned after its upstream applied ([`super::order`]).

use super::order::{How, Stops};
use super::parity::Decided;
use super::{ApplyCtx, JobLog, Verdict};
use crate::capabilities::engine::{EngineError, PlannedRun};
use crate::capabilities::gitlab::StatusState;
use crate::capabilities::store::RunState;
use crate::core::apply_note::RootResult;
use crate::core::repo_config::Root;
use crate::flows::context::locks::RootGuard;
use minijinja::context;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The roots of the apply in dependency order, each with the roots it depends on directly and
/// transitively (by name; not all of them need be roots of this apply).
pub(super) struct Order<'a> {
    pub roots: Vec<&'a Root>,
    pub upstreams: BTreeMap<String, Vec<String>>,
    pub above: BTreeMap<String, Vec<String>>,
}

/// What stage 4 needs besides the decided roots: the order, the checkout and the confirmation
/// (for the re-plans).
pub(super) struct Stage<'a> {
    pub order: &'a Order<'a>,
    pub checkout: &'a Path,
    pub confirm: Option<&'a str>,
}

/// Stage 4: apply every decided root with changes, upstream roots first (`decided` is in
/// dependency order). A root whose upstream applied is re-planned first ([`ApplyCtx::replan`]);
/// a failed or refused root stops every root below it, said so, and the roots not below it
/// still apply. Returns each root's line for the report and the verdict.
pub(super) async fn apply_all(
    ctx: &ApplyCtx,
    decided: &mut [Decided],
    stage: &Stage<'_>,
    log: &JobLog,
) -> (Vec<RootResult>, Verdict) {
    if decided.iter().any(|d| d.planned.is_some()) {
        ctx.status(StatusState::Running, &ctx.say("applying", context! {}))
            .await;
    }
    let mut results = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut refusals: Vec<String> = Vec::new();
    let mut stops = Stops::default();
    let mut stopped_roots: Vec<String> = Vec::new();
    let mut applied: BTreeSet<String> = BTreeSet::new();
    let no_upstream = Vec::new();
    for d in decided.iter_mut() {
        let upstreams = stage.order.upstreams.get(&d.root).unwrap_or(&no_upstream);
        let above = stage.order.above.get(&d.root).unwrap_or(&no_upstream);
        // 1. An upstream failed, was refused or was stopped: this root is not applied. Its own
        //    `depends_on` first (to say through which); then any root above it, for an apply
        //    of some roots only, where the one in between may not be part of it.
        if let Some(why) = stops.stopping(upstreams).or_else(|| stops.stopping(above)) {
            let text = ctx.stopped_text(&why);
            log.say("stopped", context! { root => &d.root, text => &text });
            ctx.end_run(d.run, RunState::Canceled, &text, &d.plan_log)
                .await;
            d.planned = None;
            d.guard = None;
            stops.stop(&d.root, &why);
            stopped_roots.push(d.root.clone());
            results.push(RootResult {
                name: d.root.clone(),
                text,
            });
            continue;
        }
        // 2. An upstream applied: plan again against its new outputs, and decide again.
        if let Some(upstream) = upstreams.iter().find(|u| applied.contains(*u)) {
            let root = stage
                .order
                .roots
                .iter()
                .find(|r| r.name == d.root)
                .expect("every decided root is in the order");
            if let Err(failure) = ctx
                .replan(d, root, stage.checkout, stage.confirm, upstream)
                .await
            {
                results.push(RootResult {
                    name: d.root.clone(),
                    text: ctx.say("plan_failed", context! {}),
                });
                stops.ended(&d.root, How::Failed);
                failures.push(failure);
                continue;
            }
            if let Some(refusal) = &d.refusal {
                let (why, hint) = crate::core::templates::scrubbing(&ctx.app.scrubber, || {
                    (refusal.to_string(), refusal.hint())
                });
                log.say(
                    "hint",
                    context! { hint => minijinja::Value::from_safe_string(hint) },
                );
                let because = ctx.say(
                    "refused_because",
                    context! { refusal => minijinja::Value::from_safe_string(why.clone()) },
                );
                ctx.end_run(d.run, RunState::Refused, &because, &d.plan_log)
                    .await;
                results.push(RootResult {
                    name: d.root.clone(),
                    text: because,
                });
                stops.ended(&d.root, How::Refused);
                refusals.push(why);
                continue;
            }
        }
        // 3. Apply its plan, if it has changes.
        match d.planned.take() {
            None => {
                log.say("nothing_to_apply", context! { root => &d.root });
                ctx.end_run(d.run, RunState::Succeeded, &no_changes(ctx), &d.plan_log)
                    .await;
                results.push(RootResult {
                    name: d.root.clone(),
                    text: no_changes(ctx),
                });
            }
            Some(planned) => {
                log.say(
                    "applying",
                    context! {
                        root => &d.root,
                        fingerprint => d.fingerprint.short(),
                        summary => d.summary.one_line(),
                        confirmed => d.confirmed,
                    },
                );
                let guard = d.guard.take().expect("a planned root holds its lock");
                // The guests it updates in place: after the apply, which changes wait for a reboot.
                let guests = crate::core::proxmox::preflight::updated_guests(planned.plan());
                let slot = ctx.app.engine_slot().await;
                let outcome = apply_root(&guard, planned, log).await;
                drop(slot);
                match outcome {
                    Ok((out_log, left)) => {
                        ctx.end_run(d.run, RunState::Succeeded, &d.summary.one_line(), &out_log)
                            .await;
                        applied.insert(d.root.clone());
                        let mut text = ctx.say("applied", context! { s => &d.summary });
                        let endpoint = crate::flows::preflight::endpoint_from_config(
                            &ctx.app.config.proxmox.for_apply(),
                            &ctx.app.config.engine.env,
                        );
                        if let Some(pending) =
                            crate::flows::preflight::pending_after_apply(endpoint, &guests).await
                        {
                            let pending = ctx.app.scrubber.scrub(&pending).into_owned();
                            log.line(&pending);
                            text = format!("{text}; {pending}");
                        }
                        if let Some(left) = left_changes(ctx, &d.root, &left) {
                            log.say("after_apply", context! { root => &d.root, text => &left });
                            text = format!("{text}; {left}");
                        }
                        results.push(RootResult {
                            name: d.root.clone(),
                            text,
                        });
                    }
                    Err(e) => {
                        let report = e.report(40);
                        ctx.explain_denial(&report);
                        ctx.end_run(
                            d.run,
                            RunState::Failed,
                            &ctx.say("apply_failed", context! {}),
                            &report,
                        )
                        .await;
                        results.push(RootResult {
                            name: d.root.clone(),
                            text: ctx.say("apply_failed", context! {}),
                        });
                        let error = ctx.first_error_line(&report);
                        failures.push(
                            ctx.say("root_failed", context! { root => &d.root, error => error }),
                        );
                        stops.ended(&d.root, How::Failed);
                        d.error = Some(report);
                    }
                }
            }
        }
    }
    // The roots that did not apply because of another, after the reason (the status and the
    // verdict say them too).
    let why = |reasons: Vec<String>| {
        let mut why = reasons.join("; ");
        if !stopped_roots.is_empty() {
            let below = ctx.say("stopped_roots", context! { roots => &stopped_roots });
            why = format!("{why}; {below}");
        }
        why
    };
    let verdict = if !failures.is_empty() {
        Verdict::Failed(why(failures))
    } else if !refusals.is_empty() {
        Verdict::Refused(why(refusals))
    } else {
        debug_assert!(stops.is_empty());
        Verdict::Succeeded
    };
    (results, verdict)
}

/// Apply-style work needs the root's lock: the guard is the proof. The apply's log, and what a
/// plan of the root right after it would still change ([`PlannedRun::apply_and_replan`]).
async fn apply_root(
    _guard: &RootGuard,
    planned: PlannedRun,
    log: &JobLog,
) -> Result<(String, Result<Vec<String>, String>), EngineError> {
    let (out, left) = planned.apply_and_replan(|line| log.line(line)).await?;
    Ok((out.log, left))
}

/// The apply note's words when the plan after a successful apply is not empty ("the apply left
/// changes", with the list: a provider reported success without doing the work), or could not
/// run; `None` when it is empty. The root is kept for the status text, which leads with it
/// (a long description is cut at GitLab's 255 characters; this must not be what is cut).
pub(super) fn left_changes(
    ctx: &ApplyCtx,
    root: &str,
    left: &Result<Vec<String>, String>,
) -> Option<String> {
    let mut kept = ctx.left.lock().unwrap_or_else(|e| e.into_inner());
    match left {
        Ok(changes) if changes.is_empty() => None,
        Ok(changes) => {
            kept.changes.push(root.to_string());
            Some(ctx.say("apply_left_changes", context! { changes => changes }))
        }
        Err(report) => {
            kept.unknown.push(root.to_string());
            let error = ctx.first_error_line(report);
            Some(ctx.say("replan_failed", context! { error => error }))
        }
    }
}

/// A root's (and a run's) text when there was nothing to apply.
pub(super) fn no_changes(ctx: &ApplyCtx) -> String {
    ctx.say("no_changes", context! {})
}
