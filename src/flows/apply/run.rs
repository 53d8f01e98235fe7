//! Apply stage 4: apply the plan files that were just checked against the review, in config
//! order, each under the lock its plan was made under, streaming the engine's output to the job.

use super::parity::Decided;
use super::{ApplyCtx, JobLog, Verdict};
use crate::capabilities::engine::{EngineError, PlannedRun};
use crate::capabilities::gitlab::StatusState;
use crate::capabilities::store::RunState;
use crate::core::apply_note::RootResult;
use crate::flows::context::locks::RootGuard;
use minijinja::context;

/// Stage 4: apply every decided root with changes; after a failure the later roots are not
/// applied (said so). Returns each root's line for the report and the verdict.
pub(super) async fn apply_all(
    ctx: &ApplyCtx,
    decided: &mut [Decided],
    log: &JobLog,
) -> (Vec<RootResult>, Verdict) {
    // 2. Apply the plan files that were just reviewed-checked, in config order.
    if decided.iter().any(|d| d.planned.is_some()) {
        ctx.status(StatusState::Running, &ctx.say("applying", context! {}))
            .await;
    }
    let mut results = Vec::new();
    let mut failure = None;
    for d in decided.iter_mut() {
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
            Some(planned) if failure.is_none() => {
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
                let guests = crate::core::preflight::updated_guests(planned.plan());
                match apply_root(&guard, planned, log).await {
                    Ok((out_log, left)) => {
                        ctx.end_run(d.run, RunState::Succeeded, &d.summary.one_line(), &out_log)
                            .await;
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
                        if let Some(left) = left_changes(ctx, &left) {
                            log.line(&left);
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
                        failure = Some(
                            ctx.say("root_failed", context! { root => &d.root, error => error }),
                        );
                        d.error = Some(report);
                    }
                }
            }
            Some(_) => {
                let text = ctx.say("earlier_root_failed", context! {});
                ctx.end_run(d.run, RunState::Canceled, &text, "").await;
                results.push(RootResult {
                    name: d.root.clone(),
                    text,
                });
            }
        }
    }
    let verdict = match failure {
        None => Verdict::Succeeded,
        Some(f) => Verdict::Failed(f),
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
/// run; `None` when it is empty.
fn left_changes(ctx: &ApplyCtx, left: &Result<Vec<String>, String>) -> Option<String> {
    match left {
        Ok(changes) if changes.is_empty() => None,
        Ok(changes) => Some(ctx.say("apply_left_changes", context! { changes => changes })),
        Err(report) => {
            let error = ctx.first_error_line(report);
            Some(ctx.say("replan_failed", context! { error => error }))
        }
    }
}

/// A root's (and a run's) text when there was nothing to apply.
pub(super) fn no_changes(ctx: &ApplyCtx) -> String {
    ctx.say("no_changes", context! {})
}
