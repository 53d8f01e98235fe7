//! The steps of a run and why one did not produce a plan (or an apply): [`Step`], [`EngineError`].

use super::output::RawLog;
use crate::core::redact::Scrubber;
use std::fmt;
use std::time::Duration;

/// A step of a run, as named in errors and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Version,
    Init,
    Plan,
    Show,
    Apply,
    /// The checks run beside an MR's plan (`Engine::plan_checked`).
    Validate,
    Fmt,
    Test,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Version => "version",
            Step::Init => "init",
            Step::Plan => "plan",
            Step::Show => "show -json",
            Step::Apply => "apply",
            Step::Validate => "validate -json",
            Step::Fmt => "fmt -check",
            Step::Test => "test -json",
        })
    }
}

/// Why a run did not produce a plan (or an apply). Every `log` here is already redacted.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("engine binary not found: {0}")]
    NotFound(String),
    #[error("`{step}` failed (exit code {})", exit_code.map_or("none: killed by a signal".to_string(), |c| c.to_string()))]
    Failed {
        step: Step,
        exit_code: Option<i32>,
        log: String,
    },
    #[error("`{step}` timed out after {}", humantime::format_duration(*after))]
    TimedOut {
        step: Step,
        after: Duration,
        log: String,
    },
    #[error("`{step}` was cancelled")]
    Cancelled { step: Step, log: String },
    #[error("the engine's `show -json` output is not a plan: {error}")]
    BadPlanJson { error: String, log: String },
    /// `show -json` printed a plan over the value budget (`core::plan_budget`): refused unread.
    #[error("{error}")]
    TooManyValues { error: String, log: String },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("could not run the engine: {0}")]
    Io(String),
    /// A sandbox is required and cannot be had; nothing was run.
    #[error("{0}")]
    SandboxRefused(String),
    /// The sandbox could not be applied to a process; it was not started.
    #[error("could not confine the engine in its sandbox: {0}")]
    Sandbox(String),
    /// A file the engine left in the checkout (the lock file) could not be read safely.
    #[error("{0}")]
    CheckoutFile(#[from] crate::capabilities::checkout_file::CheckoutFileError),
    /// The run's directories (checkout, plan-file dir, plugin cache) held more than its disk
    /// quota; the engine was killed.
    #[error("`{step}` was stopped: the run's files (its checkout, plan file and plugin cache) took more than {}, the most a job may write (`sandbox.disk_max`)", crate::capabilities::checkout_file::size_text(*max))]
    OverQuota { step: Step, max: u64, log: String },
    /// The run's engine processes together reached the memory limit of its cgroup; the
    /// kernel's OOM killer ended them.
    #[error("`{step}` was stopped: the job's engine processes together used more than {}, the most one job may use (`sandbox.job_memory_max`), and the kernel ended them; raise the cap if the plan is legitimate", crate::capabilities::checkout_file::size_text(*max))]
    OverMemory { step: Step, max: u64, log: String },
    /// The run's cgroup refused forks at its tasks limit.
    #[error("`{step}` failed: the job's engine processes reached {max} processes and threads, the most one job may have at once (`sandbox.job_tasks_max`)")]
    TooManyTasks { step: Step, max: u64, log: String },
    /// A step printed more than planbot accepts.
    #[error("the plan is too large: `{step}` printed more than {}, the most planbot accepts ({what}); nothing of it was kept", crate::capabilities::checkout_file::size_text(*max))]
    OutputTooLarge {
        step: Step,
        max: u64,
        what: &'static str,
        log: String,
    },
}

impl EngineError {
    /// The redacted engine output that goes with the error, when there is one.
    pub fn log(&self) -> Option<&str> {
        match self {
            EngineError::Failed { log, .. }
            | EngineError::TimedOut { log, .. }
            | EngineError::Cancelled { log, .. }
            | EngineError::BadPlanJson { log, .. }
            | EngineError::OverQuota { log, .. }
            | EngineError::OverMemory { log, .. }
            | EngineError::TooManyTasks { log, .. }
            | EngineError::TooManyValues { log, .. }
            | EngineError::OutputTooLarge { log, .. } => Some(log),
            _ => None,
        }
    }

    /// The error line and the last `max_lines` lines of the redacted log: what a note shows.
    pub fn report(&self, max_lines: usize) -> String {
        let mut out = self.to_string();
        if let Some(log) = self.log() {
            let lines: Vec<&str> = log.lines().collect();
            let start = lines.len().saturating_sub(max_lines);
            if start > 0 {
                out.push_str(&format!("\n(… {start} earlier lines left out …)"));
            }
            for l in &lines[start..] {
                out.push('\n');
                out.push_str(l);
            }
            // Go says `fatal error: runtime: out of memory` when an allocation past the
            // sandbox's memory cap fails: say which cap it was.
            if log.contains("out of memory") {
                let hint = crate::core::templates::render(
                    "sandbox.txt.j2",
                    minijinja::context! { kind => "out_of_memory" },
                )
                .unwrap_or_default();
                out.push_str("\n\n");
                out.push_str(hint.trim());
            }
        }
        out
    }
}

/// How a step ended without success, its raw log kept until the secrets are known.
pub(super) enum StepError {
    Stopped {
        step: Step,
        how: StopHow,
        log: RawLog,
    },
    Other(EngineError),
}

/// How a stopped step ended.
pub(super) enum StopHow {
    Exit(Option<i32>),
    TimedOut(Duration),
    Cancelled,
    /// The step's result (stdout) went past this many bytes.
    TooLarge(u64),
    /// The run's directories went past its disk quota of this many bytes.
    OverQuota(u64),
    /// The run's cgroup reached its memory limit (bytes): the kernel ended its processes.
    OverMemory(u64),
    /// The run's cgroup refused a fork at its tasks limit.
    TooManyTasks(u64),
}

impl StepError {
    /// Why a check step gave no result, in words (its output is not shown: only what it
    /// printed on stdout is read).
    pub(super) fn why_not(&self, step: Step) -> String {
        use crate::capabilities::checkout_file::size_text;
        match self {
            StepError::Other(e) => format!("`{step}` could not run: {e}"),
            StepError::Stopped { how, .. } => match how {
                StopHow::Exit(code) => format!(
                    "`{step}` failed (exit code {})",
                    code.map_or("none: killed by a signal".to_string(), |c| c.to_string())
                ),
                StopHow::TimedOut(after) => format!(
                    "`{step}` timed out after {}",
                    humantime::format_duration(*after)
                ),
                StopHow::Cancelled => format!("`{step}` was cancelled"),
                StopHow::TooLarge(max) => format!(
                    "`{step}` printed more than {}, the most planbot reads (`engine.max_plan_json_mib`)",
                    size_text(*max)
                ),
                StopHow::OverQuota(max) => format!(
                    "`{step}` was stopped: the run's files took more than {} (`sandbox.disk_max`)",
                    size_text(*max)
                ),
                StopHow::OverMemory(max) => format!(
                    "`{step}` was stopped: the run's processes together used more than {} (`sandbox.job_memory_max`)",
                    size_text(*max)
                ),
                StopHow::TooManyTasks(max) => format!(
                    "`{step}` failed: the run reached {max} processes and threads (`sandbox.job_tasks_max`)"
                ),
            },
        }
    }

    /// Whether the engine ran to its end and exited unsuccessfully (not stopped by planbot).
    pub(super) fn is_exit(&self) -> bool {
        matches!(
            self,
            StepError::Stopped {
                how: StopHow::Exit(_),
                ..
            }
        )
    }

    /// The error callers see: `before` (earlier steps' output) and this step's output,
    /// redacted with `scrubber`.
    pub(super) fn into_engine_error(self, before: &RawLog, scrubber: &Scrubber) -> EngineError {
        match self {
            StepError::Other(e) => e,
            StepError::Stopped { step, how, log } => {
                let mut all = RawLog::default();
                all.append_ref(before);
                all.append(log);
                let log = all.render(scrubber);
                match how {
                    StopHow::Exit(exit_code) => EngineError::Failed {
                        step,
                        exit_code,
                        log,
                    },
                    StopHow::TimedOut(after) => EngineError::TimedOut { step, after, log },
                    StopHow::Cancelled => EngineError::Cancelled { step, log },
                    StopHow::OverQuota(max) => EngineError::OverQuota { step, max, log },
                    StopHow::OverMemory(max) => EngineError::OverMemory { step, max, log },
                    StopHow::TooManyTasks(max) => EngineError::TooManyTasks { step, max, log },
                    StopHow::TooLarge(max) => EngineError::OutputTooLarge {
                        step,
                        max,
                        what: "`engine.max_plan_json_mib`",
                        log,
                    },
                }
            }
        }
    }
}
