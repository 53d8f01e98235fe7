//! Apply stage 5: apply the plans just checked against the review, upstream roots first
//! (`depends_on`), each under the lock its plan was made under, streaming the engine's output to
//! the job. Each root in named steps: [`stop`] when an upstream failed or was refused,
//! [`super::order::replan`] when an upstream applied, then [`apply`] (or [`nothing`], or
//! [`refused`] after its re-plan); [`Tally`] collects how each ended into the stage's verdict.

use super::ctx::ApplyCtx;
use super::decide::{Decided, Outcome};
use super::log::{ApplyFailure, JobLog, Verdict};
use super::order::{replan, How, Order, Stopped, Stops};
use super::report::{Ending, Left};
use crate::capabilities::engine::{EngineError, PlannedRun};
use crate::capabilities::gitlab::StatusState;
use crate::capabilities::store::RunState;
use crate::core::apply::ApplyRefusal;
use crate::core::apply_note::{Relied, RootResult};
use crate::flows::context::locks::RootGuard;
use minijinja::context;
use std::collections::BTreeSet;

/// What stage 5 needs besides the decided roots: the order and the confirmation (for the
/// re-plans, which run in the job's checkout as every plan of it).
pub(super) struct Stage<'a> {
    pub order: &'a Order<'a>,
    pub confirm: Option<&'a str>,
}

/// How one root ended in this stage, with its line for the report.
struct Ended {
    text: String,
    how: End,
}

/// How: stopped by an upstream, failed, refused (after its re-plan), nothing to apply, or applied.
enum End {
    Stopped(Stopped),
    Failed {
        failure: ApplyFailure,
        report: Option<String>,
    },
    Refused(ApplyRefusal),
    Nothing,
    Applied(Option<Leftover>),
}

/// What a plan right after a root's apply found, when not nothing
/// ([`PlannedRun::apply_and_replan`]).
enum Leftover {
    /// The apply left these changes: a provider reported success without doing the work.
    Changes(Vec<String>),
    /// That plan could not run: the engine's report.
    Unknown(String),
}

impl Leftover {
    /// What the plan right after the apply found: nothing, changes, or no answer.
    fn of(left: Result<Vec<String>, String>) -> Option<Leftover> {
        match left {
            Ok(changes) if changes.is_empty() => None,
            Ok(changes) => Some(Leftover::Changes(changes)),
            Err(report) => Some(Leftover::Unknown(report)),
        }
    }

    /// Its words in the job's log, the root's line and the note.
    fn text(&self, ctx: &ApplyCtx) -> String {
        match self {
            Leftover::Changes(changes) => {
                ctx.say("apply_left_changes", context! { changes => changes })
            }
            Leftover::Unknown(report) => {
                let error = ctx.first_error_line(report);
                ctx.say("replan_failed", context! { error => error })
            }
        }
    }
}

/// A test hook, compiled only into debug builds (a release binary has neither this nor its
/// check in [`apply_all`]): the apply of this CI job id panics once its `planbot/apply` status
/// says it is applying, as a bug in the apply would. Nothing in planbot sets it; the story
/// `command_limits::an_apply_that_panics_ends_its_status_and_note_as_interrupted_at_once` does,
/// since no input makes planbot panic on purpose and the catch in [`super::job::run`] (the
/// record, status and note ended as interrupted at once) has no other way to be exercised.
#[cfg(debug_assertions)]
#[doc(hidden)]
pub static PANIC_WHILE_APPLYING_JOB: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Stage 5: apply every decided root with changes, upstream roots first (`decided` is in
/// dependency order). A failed or refused root stops every root below it, said so, and the
/// roots not below it still apply. The policy reliances of the re-plans are the ending's (the
/// first plans' are stage 4's).
pub(super) async fn apply_all(
    ctx: &ApplyCtx,
    decided: &mut [Decided],
    stage: &Stage<'_>,
) -> Ending {
    if decided
        .iter()
        .any(|d| matches!(d.outcome, Outcome::Apply { .. }))
    {
        ctx.status(StatusState::Running, &ctx.say("applying", context! {}))
            .await;
        #[cfg(debug_assertions)]
        if PANIC_WHILE_APPLYING_JOB.load(std::sync::atomic::Ordering::SeqCst) == ctx.job_id.0 {
            panic!("a panic asked for by a test (PANIC_WHILE_APPLYING_JOB)");
        }
    }
    let mut tally = Tally::default();
    for d in decided.iter_mut() {
        let ended = apply_in_order(ctx, d, stage, &mut tally).await;
        tally.record(&d.root, ended);
    }
    tally.ending(ctx)
}

/// One root, in order: stopped when an upstream failed or was refused (its own `depends_on`
/// first, to say through which; then any root above it, for an apply of some roots only, where
/// the one in between may not be part of it); planned again when an upstream applied; then
/// applied, when it has changes.
async fn apply_in_order(
    ctx: &ApplyCtx,
    d: &mut Decided,
    stage: &Stage<'_>,
    tally: &mut Tally,
) -> Ended {
    let upstreams = stage.order.upstreams(&d.root);
    let stopping = tally.stops.stopping(upstreams);
    if let Some(why) = stopping.or_else(|| tally.stops.stopping(stage.order.above(&d.root))) {
        return stop(ctx, d, why).await;
    }
    if let Some(upstream) = upstreams.iter().find(|u| tally.applied.contains(*u)) {
        let root = stage.order.root(&d.root);
        match replan(ctx, d, root, stage.confirm, upstream).await {
            Ok(mut relied) => tally.relied.append(&mut relied),
            Err(failure) => {
                let text = ctx.say("plan_failed", context! {});
                let how = End::Failed {
                    failure,
                    report: None,
                };
                return Ended { text, how };
            }
        }
    }
    match std::mem::replace(&mut d.outcome, Outcome::Nothing) {
        Outcome::Refused(refusal) => refused(ctx, d, refusal).await,
        Outcome::Nothing => nothing(ctx, d).await,
        Outcome::Apply {
            planned,
            confirmed,
            guard,
        } => apply(ctx, d, *planned, guard, confirmed).await,
    }
}

/// An upstream failed, was refused or was stopped: this root is not applied.
async fn stop(ctx: &ApplyCtx, d: &mut Decided, why: Stopped) -> Ended {
    let text = why.text(ctx);
    ctx.log
        .say("stopped", context! { root => &d.root, text => &text });
    ctx.end_run(d.run, RunState::Canceled, &text, &d.plan_log)
        .await;
    d.outcome = Outcome::Nothing;
    Ended {
        text,
        how: End::Stopped(why),
    }
}

/// The re-plan was refused: its hint, and its run ended refused.
async fn refused(ctx: &ApplyCtx, d: &Decided, refusal: ApplyRefusal) -> Ended {
    let why = ctx.log.refusal(&refusal);
    let text = ctx.say(
        "refused_because",
        context! { refusal => minijinja::Value::from_safe_string(why) },
    );
    ctx.end_run(d.run, RunState::Refused, &text, &d.plan_log)
        .await;
    Ended {
        text,
        how: End::Refused(refusal),
    }
}

/// No changes: nothing to apply (a retired root whose state holds nothing: its state deleted).
async fn nothing(ctx: &ApplyCtx, d: &Decided) -> Ended {
    ctx.log
        .say("nothing_to_apply", context! { root => &d.root });
    let mut text = ctx.say("no_changes", context! {});
    if ctx.retires(&d.root) {
        let said = retired_state(ctx, &d.root, true).await;
        ctx.log
            .say("after_apply", context! { root => &d.root, text => &said });
        text = format!("{text}; {said}");
    }
    ctx.end_run(d.run, RunState::Succeeded, &text, &d.plan_log)
        .await;
    Ended {
        text,
        how: End::Nothing,
    }
}

/// Apply the checked plan, under the lock it was made under; then what the apply left, and
/// which guests wait for a reboot.
async fn apply(
    ctx: &ApplyCtx,
    d: &Decided,
    planned: PlannedRun,
    guard: RootGuard,
    confirmed: bool,
) -> Ended {
    ctx.log.say(
        "applying",
        context! {
            root => &d.root,
            fingerprint => d.fingerprint.short(),
            summary => d.summary.one_line(),
            confirmed => confirmed,
        },
    );
    // The guests it updates in place: after the apply, which changes wait for a reboot.
    let guests = crate::core::proxmox::preflight::updated_guests(planned.plan());
    // A retired root's resources: what a destroy that fails part-way leaves is said.
    let retired = ctx.retires(&d.root);
    let destroying: Vec<String> = match retired {
        true => planned
            .plan()
            .managed_changes()
            .filter(|rc| rc.has_change())
            .map(|rc| rc.address.clone())
            .collect(),
        false => Vec::new(),
    };
    let mut destroyed = Vec::new();
    let slot = ctx.app.engine_slot().await;
    let outcome = apply_root(&guard, planned, &ctx.log, &mut destroyed).await;
    drop(slot);
    let (out_log, leftover) = match outcome {
        Ok(applied) => applied,
        Err(e) => {
            let mut ended = apply_failed(ctx, d, e).await;
            if retired {
                let left: Vec<&String> = destroying
                    .iter()
                    .filter(|a| !destroyed.contains(a))
                    .collect();
                let state = ctx.retiring.as_ref().and_then(|r| r.state_of(&d.root));
                let said = ctx.say("destroy_failed", context! { state, left });
                ctx.log
                    .say("after_apply", context! { root => &d.root, text => &said });
                ended.text = format!("{}; {said}", ended.text);
            }
            return ended;
        }
    };
    ctx.end_run(d.run, RunState::Succeeded, &d.summary.one_line(), &out_log)
        .await;
    let mut text = ctx.say("applied", context! { s => &d.summary });
    let endpoint = crate::flows::preflight::endpoint_from_config(
        &ctx.app.config.proxmox.for_apply(),
        &ctx.app.config.engine.env,
    );
    if let Some(pending) = crate::flows::preflight::pending_after_apply(endpoint, &guests).await {
        let pending = ctx.app.scrubber.scrub(&pending).into_owned();
        ctx.log.line(&pending);
        text = format!("{text}; {pending}");
    }
    if let Some(left) = &leftover {
        let said = left.text(ctx);
        ctx.log
            .say("after_apply", context! { root => &d.root, text => &said });
        text = format!("{text}; {said}");
    }
    if retired {
        let said = retired_state(ctx, &d.root, leftover.is_none()).await;
        ctx.log
            .say("after_apply", context! { root => &d.root, text => &said });
        text = format!("{text}; {said}");
    }
    Ended {
        text,
        how: End::Applied(leftover),
    }
}

/// The engine's apply failed: said, its run ended failed with the engine's report.
async fn apply_failed(ctx: &ApplyCtx, d: &Decided, e: EngineError) -> Ended {
    let report = e.report(40);
    ctx.explain_denial(&report);
    let failure = ApplyFailure::ApplyFailed {
        root: d.root.clone(),
        error: ctx.first_error_line(&report),
    };
    let failure = ctx.fail_run(d.run, failure, &report).await;
    Ended {
        text: ctx.say("apply_failed", context! {}),
        how: End::Failed {
            failure,
            report: Some(report),
        },
    }
}

/// A retired root destroyed: its GitLab-managed state deleted once the plan right after the
/// destroy found nothing left (`empty`), else kept; what became of it, said.
async fn retired_state(ctx: &ApplyCtx, root: &str, empty: bool) -> String {
    let Some(state) = ctx.retiring.as_ref().and_then(|r| r.state_of(root)) else {
        return ctx.say("retired_own_state", context! {});
    };
    if !empty {
        return ctx.say("retired_state_kept", context! { state });
    }
    let Some(credential) = &ctx.app.config.state.apply else {
        let error = "no `[state] apply` token";
        return ctx.say("retired_state_not_deleted", context! { state, error });
    };
    match ctx
        .app
        .gitlab
        .delete_terraform_state(ctx.project, &state, credential)
        .await
    {
        Ok(()) => {
            tracing::info!(project = ctx.project.0, root, state = %state, "retired root's state deleted");
            ctx.say("retired_state_deleted", context! { state })
        }
        Err(e) => {
            ctx.app.metrics.gitlab_error("delete_terraform_state");
            let error = ctx.app.scrubber.scrub(&e.to_string()).into_owned();
            ctx.say("retired_state_not_deleted", context! { state, error })
        }
    }
}

/// Apply-style work needs the root's lock: the guard is the proof. The apply's log, and what a
/// plan of the root right after it would still change; `destroyed` gathers the addresses the
/// engine said it destroyed (what a destroy that fails part-way did).
async fn apply_root(
    _guard: &RootGuard,
    planned: PlannedRun,
    log: &JobLog,
    destroyed: &mut Vec<String>,
) -> Result<(String, Option<Leftover>), EngineError> {
    let (out, left) = planned
        .apply_and_replan(|line| {
            if let Some((address, _)) = line.split_once(": Destruction complete") {
                destroyed.push(address.trim().to_string());
            }
            log.line(line)
        })
        .await?;
    Ok((out.log, Leftover::of(left)))
}

/// How the roots of stage 5 ended so far: their lines, the failures and refusals for the verdict,
/// the roots they stop, the roots that applied (their dependents are planned again), and what
/// the report needs besides.
#[derive(Default)]
struct Tally {
    results: Vec<RootResult>,
    failures: Vec<ApplyFailure>,
    refusals: Vec<ApplyRefusal>,
    stops: Stops,
    stopped: Vec<String>,
    applied: BTreeSet<String>,
    relied: Vec<Relied>,
    left: Left,
    error: Option<String>,
}

impl Tally {
    fn record(&mut self, root: &str, ended: Ended) {
        self.results.push(RootResult {
            name: root.to_string(),
            text: ended.text,
        });
        match ended.how {
            End::Stopped(why) => {
                self.stops.stop(root, &why);
                self.stopped.push(root.to_string());
            }
            End::Failed { failure, report } => {
                self.stops.ended(root, How::Failed);
                self.failures.push(failure);
                self.error = self.error.take().or(report);
            }
            End::Refused(refusal) => {
                self.stops.ended(root, How::Refused);
                self.refusals.push(refusal);
            }
            End::Nothing => {}
            End::Applied(leftover) => {
                self.applied.insert(root.to_string());
                match leftover {
                    Some(Leftover::Changes(_)) => self.left.changes.push(root.to_string()),
                    Some(Leftover::Unknown(_)) => self.left.unknown.push(root.to_string()),
                    None => {}
                }
            }
        }
    }

    /// The stage's verdict: failed when a root failed, else refused when one was refused, each
    /// reason said, then the roots that did not apply because of another.
    fn ending(self, ctx: &ApplyCtx) -> Ending {
        let why = |reasons: Vec<String>| {
            let mut why = reasons.join("; ");
            if !self.stopped.is_empty() {
                let below = ctx.say("stopped_roots", context! { roots => &self.stopped });
                why = format!("{why}; {below}");
            }
            why
        };
        let scrubber = &ctx.app.scrubber;
        let verdict = if !self.failures.is_empty() {
            Verdict::Failed(why(self
                .failures
                .iter()
                .map(|f| f.text(scrubber))
                .collect()))
        } else if !self.refusals.is_empty() {
            let reason =
                |r: &ApplyRefusal| crate::core::templates::scrubbing(scrubber, || r.to_string());
            Verdict::Refused(why(self.refusals.iter().map(reason).collect()))
        } else {
            debug_assert!(self.stops.is_empty());
            Verdict::Succeeded
        };
        Ending {
            results: self.results,
            verdict,
            relied: self.relied,
            left: self.left,
            error: self.error,
        }
    }
}
