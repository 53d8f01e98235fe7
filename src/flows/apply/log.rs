//! The apply's bottom floor: the CI job's log ([`JobLog`]) and its last line ([`Verdict`]), the
//! apply's texts (`templates/apply/`), and what can end an apply: a refusal
//! ([`ApplyRefusal`], `core::apply`) or a failure ([`ApplyFailure`]), each rendered here.

use crate::core::apply::ApplyRefusal;
use crate::core::apply_note::{Reliance, Relied};
use crate::core::redact::Scrubber;
use crate::core::state::HeldLock;
use minijinja::context;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// The job log. The engine's lines (and any other text from outside planbot) are scrubbed
/// whole; planbot's own lines ([`JobLog::say`], the verdict) are rendered with their values
/// scrubbed and their words intact, so no secret can alter `planbot: apply succeeded`.
#[derive(Clone)]
pub struct JobLog {
    tx: mpsc::UnboundedSender<String>,
    scrubber: Arc<Scrubber>,
    /// Bytes sent and not yet taken by the job's connection ([`JobLogLines::recv`]).
    pending: Arc<AtomicUsize>,
    /// Outside lines not sent since the last one that was: the connection did not read them.
    dropped: Arc<AtomicUsize>,
}

/// The most bytes of the job's log planbot holds for a connection that does not read them
/// (a client that stays connected and stops reading): past it the engine's lines are counted,
/// not kept, and the log says how many; planbot's own lines and the verdict always go.
pub const JOB_LOG_PENDING_MAX: usize = 8 << 20;

/// The receiving end of a [`JobLog`], for the job's connection.
pub struct JobLogLines {
    rx: mpsc::UnboundedReceiver<String>,
    pending: Arc<AtomicUsize>,
}

impl JobLogLines {
    /// The next line, once written; `None` when the log is closed.
    pub async fn recv(&mut self) -> Option<String> {
        let line = self.rx.recv().await?;
        self.pending.fetch_sub(line.len(), Ordering::Relaxed);
        Some(line)
    }
}

impl JobLog {
    pub fn new(scrubber: Scrubber) -> (JobLog, JobLogLines) {
        let (tx, rx) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        (
            JobLog {
                tx,
                scrubber: Arc::new(scrubber),
                pending: pending.clone(),
                dropped: Arc::new(AtomicUsize::new(0)),
            },
            JobLogLines { rx, pending },
        )
    }

    /// Lines from outside planbot (the engine's output, its error report): scrubbed whole, and
    /// each kept one line that cannot read as planbot's ([`crate::core::defuse::ci_log_outside`]:
    /// control characters shown, a gutter before a line that would start with `planbot`).
    /// While the connection holds [`JOB_LOG_PENDING_MAX`] unread, they are counted instead.
    pub fn line(&self, text: impl AsRef<str>) {
        for l in text.as_ref().lines() {
            let l = crate::core::defuse::ci_log_outside(&self.scrubber.scrub(l));
            let line = format!("{l}\n");
            if self.pending.load(Ordering::Relaxed) + line.len() > JOB_LOG_PENDING_MAX {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.say_dropped();
            self.send(line);
        }
    }

    /// One of planbot's own lines (`templates/apply/log.txt.j2`), its values scrubbed.
    pub fn say(&self, kind: &str, ctx: minijinja::Value) {
        self.say_dropped();
        self.planbot_text(&crate::core::templates::scrubbing(&self.scrubber, || {
            log_text(kind, ctx)
        }));
    }

    /// The verdict, the log's last line: its reason was scrubbed when it was written.
    pub fn verdict(&self, verdict: &Verdict) {
        self.say_dropped();
        self.planbot_text(&verdict.last_line());
    }

    /// Say the refusal's hint; its reason, for the verdict, the runs and the note (its values
    /// scrubbed, its words intact).
    pub(super) fn refusal(&self, r: &ApplyRefusal) -> String {
        let hint = crate::core::templates::scrubbing(&self.scrubber, || r.hint());
        self.refusal_hinted(r, hint)
    }

    /// [`JobLog::refusal`] with `hint` (already scrubbed) as what to do next.
    pub(super) fn refusal_hinted(&self, r: &ApplyRefusal, hint: String) -> String {
        let why = crate::core::templates::scrubbing(&self.scrubber, || r.to_string());
        self.say(
            "hint",
            context! { hint => minijinja::Value::from_safe_string(hint) },
        );
        why
    }

    /// Say a policy verdict or approval (`reliance`) the apply relies on, and return it for the
    /// result note and the status (its line as the job's log says it, without `planbot: `).
    pub(super) fn rely(&self, reliance: Reliance, kind: &str, ctx: minijinja::Value) -> Relied {
        let line =
            crate::core::templates::scrubbing(&self.scrubber, || log_text(kind, ctx.clone()));
        self.say(kind, ctx);
        let line = line.trim();
        let line = line.strip_prefix("planbot: ").unwrap_or(line).to_string();
        Relied { reliance, line }
    }

    /// How many outside lines were not sent since the last that was, when any.
    fn say_dropped(&self) {
        let n = self.dropped.swap(0, Ordering::Relaxed);
        if n > 0 {
            self.planbot_text(&log_text("lines_not_sent", context! { n => n }));
        }
    }

    /// One of planbot's lines: a template kind is one line, so a line break a value brought
    /// stays in it, shown ([`crate::core::defuse::ci_log_own`]).
    fn planbot_text(&self, text: &str) {
        self.send(format!("{}\n", crate::core::defuse::ci_log_own(text)));
    }

    fn send(&self, line: String) {
        // Counted before it can be taken, so the count never goes below zero.
        let len = line.len();
        self.pending.fetch_add(len, Ordering::Relaxed);
        if self.tx.send(line).is_err() {
            self.pending.fetch_sub(len, Ordering::Relaxed);
        }
    }
}

/// How the whole request ended: the job log's last line. A reason is planbot's text with its
/// values already scrubbed (see [`say`]), or an error already scrubbed whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Succeeded,
    Refused(String),
    Failed(String),
}

impl Verdict {
    /// The line itself: one line, whatever its reason holds (a line break, a carriage return
    /// or a terminal escape from outside is shown, never acted on).
    pub fn last_line(&self) -> String {
        let safe = |why: &str| minijinja::Value::from_safe_string(why.to_string());
        crate::core::defuse::ci_log_own(&match self {
            Verdict::Succeeded => log_text("succeeded", context! {}),
            Verdict::Refused(why) => log_text("refused", context! { why => safe(why) }),
            Verdict::Failed(why) => log_text("failed", context! { why => safe(why) }),
        })
    }
}

/// One line of the CI job's log (`templates/apply/log.txt.j2`), exactly as the template writes
/// it (see [`JobLog::say`] for the scrubbed one).
pub(super) fn log_text(kind: &str, ctx: minijinja::Value) -> String {
    crate::core::templates::text("apply/log.txt.j2", kind, ctx)
}

/// One short text of the apply (`templates/apply/status.txt.j2`), its values scrubbed with
/// `scrubber` and its words intact.
pub(super) fn say(scrubber: &Scrubber, kind: &str, ctx: minijinja::Value) -> String {
    crate::core::templates::scrubbing(scrubber, || {
        crate::core::templates::text("apply/status.txt.j2", kind, ctx)
    })
}

/// The refusal's hint in the log, and its verdict (its values scrubbed, its words intact).
pub(super) fn refuse(log: &JobLog, r: &ApplyRefusal) -> Verdict {
    Verdict::Refused(log.refusal(r))
}

/// What made an apply fail (a refusal is an [`ApplyRefusal`]): what failed, with its values;
/// its words come from `templates/apply/status.txt.j2` when it is said ([`ApplyFailure::text`]).
#[derive(Debug)]
pub(super) enum ApplyFailure {
    /// planbot's own work failed: the store, the engine's setup, a policy set's evaluation.
    Internal(anyhow::Error),
    /// The root could not be planned at all: its directory is not in the commit, its
    /// GitLab-managed state has no token, or its state gate could not start.
    NotPlanned { root: String, why: String },
    /// The engine's plan failed: its report's line that says what went wrong.
    PlanFailed { root: String, error: String },
    /// The engine's plan waited `waited` for the state's lock, which someone else holds.
    StateLocked {
        root: String,
        lock: HeldLock,
        waited: String,
    },
    /// The plan ran to its end with errors.
    PlanErrored { root: String },
    /// The engine's apply failed: its report's line that says what went wrong.
    ApplyFailed { root: String, error: String },
}

impl ApplyFailure {
    /// The failure's text, for the verdict, the status and the note, its values scrubbed with
    /// `scrubber` and its words intact.
    pub fn text(&self, scrubber: &Scrubber) -> String {
        let plan_failed = |root: &str, error: minijinja::Value| {
            say(
                scrubber,
                "root_plan_failed",
                context! { root => root, error => error },
            )
        };
        match self {
            ApplyFailure::Internal(e) => scrubber.scrub(&format!("{e:#}")).into_owned(),
            ApplyFailure::NotPlanned { root, why } => plan_failed(root, why.as_str().into()),
            ApplyFailure::PlanFailed { root, error } => plan_failed(root, error.as_str().into()),
            ApplyFailure::StateLocked { root, lock, waited } => plan_failed(
                root,
                minijinja::Value::from_safe_string(lock_text(
                    scrubber, "locked", root, lock, waited,
                )),
            ),
            ApplyFailure::PlanErrored { root } => {
                say(scrubber, "root_plan_errored", context! { root => root })
            }
            ApplyFailure::ApplyFailed { root, error } => say(
                scrubber,
                "root_failed",
                context! { root => root, error => error },
            ),
        }
    }

    /// What the failed root's run says.
    pub fn run_summary(&self, scrubber: &Scrubber) -> String {
        match self {
            ApplyFailure::NotPlanned { why, .. } => why.clone(),
            ApplyFailure::PlanErrored { .. } => say(scrubber, "plan_errored", context! {}),
            ApplyFailure::ApplyFailed { .. } => say(scrubber, "apply_failed", context! {}),
            _ => say(scrubber, "plan_failed", context! {}),
        }
    }
}

/// A text of a held state lock (`templates/state.txt.j2`: `locked`, `locked_hint`): who holds
/// it, since when, and how long the engine waited; its values scrubbed.
pub(super) fn lock_text(
    scrubber: &Scrubber,
    kind: &str,
    root: &str,
    lock: &HeldLock,
    waited: &str,
) -> String {
    crate::core::templates::scrubbing(scrubber, || {
        crate::core::templates::text(
            "state.txt.j2",
            kind,
            context! {
                root => root,
                who => &lock.who,
                created => &lock.created,
                id => &lock.id,
                waited => waited,
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_that_does_not_read_holds_a_bounded_log_and_still_gets_the_verdict() {
        let (log, mut lines) = JobLog::new(crate::core::redact::Secrets::default().scrubber());
        // 20 MiB of engine output (lines of 1 KiB with their newline), none read meanwhile.
        let line = "x".repeat(1023);
        for _ in 0..20_000 {
            log.line(&line);
        }
        assert!(log.pending.load(Ordering::Relaxed) <= JOB_LOG_PENDING_MAX);
        log.verdict(&Verdict::Succeeded);
        drop(log);
        let mut got = Vec::new();
        while let Some(l) = lines.recv().await {
            got.push(l);
        }
        // What fitted, then how many were not sent, then the verdict: always the last line.
        assert_eq!(got.len(), 8192 + 2);
        assert!(got[..8192].iter().all(|l| l.len() == 1024));
        assert!(
            got[8192].starts_with(
                "planbot: 11808 lines of the engine's output not sent here: this connection did not read them"
            ),
            "{}",
            got[8192]
        );
        assert_eq!(got[8193], "planbot: apply succeeded\n");
    }

    #[tokio::test]
    async fn lines_flow_again_once_read_and_the_gap_is_said_where_it_was() {
        let (log, mut lines) = JobLog::new(crate::core::redact::Secrets::default().scrubber());
        let line = "y".repeat(1023);
        for _ in 0..8193 {
            log.line(&line);
        }
        // The connection reads one line: room for the next.
        assert_eq!(lines.recv().await.unwrap().len(), 1024);
        log.line("after the gap");
        drop(log);
        let mut rest = Vec::new();
        while let Some(l) = lines.recv().await {
            rest.push(l);
        }
        assert_eq!(rest.len(), 8191 + 2);
        assert!(rest[8191].starts_with("planbot: 1 line of the engine's output not sent here"));
        assert_eq!(rest[8192], "after the gap\n");
    }
}
