//! Process supervision: one engine command run to completion, timeout or cancellation.
//!
//! Every child runs in its own process group with an explicit environment, stdin null and its
//! output captured. On timeout or cancellation it gets ONE SIGTERM (a graceful stop: state
//! persisted, lock released), then after the grace period SIGKILL of the whole group; what is
//! left of the group when the engine exits (a provider plugin that outlived it) is killed too.
//!
//! Every engine process is also the kernel OOM killer's first choice
//! ([`super::ENGINE_OOM_SCORE_ADJ`], set in the child before anything else, inherited by all it
//! starts): when memory runs out — the host's, or the service cgroup's `MemoryMax=` — an engine
//! process dies, never planbot.

use super::cgroup::{Counts, JobCgroup};
use super::child::{EngineChild, Launch, StartError};
use super::error::{EngineError, Step, StepError, StopHow};
use super::output::{read_lines, Line, RawLog, LINES_IN_FLIGHT};
use super::quota::Quota;
use super::request::CancelToken;
use super::sandbox::Confinement;
use super::Engine;
use crate::core::engine_checks::{view_line, PlanWarnings};
use crate::core::redact::Scrubber;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// After the engine process exits, its output pipes get this long to drain.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(5);

/// What becomes of a step's stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Capture {
    /// stdout and stderr both go to the log, line by line.
    Log,
    /// stdout is the result (kept raw, not logged); stderr goes to the log.
    Stdout,
    /// Like `Stdout`, and the exit code is part of the result (`validate`, `fmt -check` and
    /// `test` exit non-zero to say what they found): an exit is no error.
    Verdict,
}

/// What every step of one run shares: where and how its commands run.
pub(super) struct StepCall<'a> {
    pub(super) dir: &'a Path,
    pub(super) env: &'a BTreeMap<String, OsString>,
    /// The whole run's deadline (a timeout stops the step gracefully).
    pub(super) deadline: Instant,
    pub(super) cancel: Option<CancelToken>,
    /// Redacts the lines handed to `on_line` as they come.
    pub(super) scrubber: &'a Scrubber,
    pub(super) confinement: Option<&'a Confinement>,
    /// The run's disk quota, checked while the step runs (plans; `None`: none).
    pub(super) quota: Option<&'a Quota>,
    /// The run's cgroup the step's processes join before they exec (`None`: none).
    pub(super) cgroup: Option<&'a JobCgroup>,
}

/// A successful step: its raw log, and its stdout when captured as the result.
pub(super) struct StepOutput {
    pub(super) log: RawLog,
    pub(super) stdout: Vec<u8>,
    /// The exit code (`None`: killed by a signal); not success only with [`Capture::Verdict`].
    pub(super) exit: Option<i32>,
}

#[derive(Debug, Clone, Copy)]
enum StopReason {
    TimedOut,
    Cancelled,
    /// The run's directories passed its disk quota: killed at once.
    OverQuota,
}

impl Engine {
    /// Run one engine command to completion (or timeout / cancellation), its output captured;
    /// every line (redacted) also goes to `on_line` as it comes.
    pub(super) async fn run_step(
        &self,
        step: Step,
        args: &[OsString],
        capture: Capture,
        call: &StepCall<'_>,
        on_line: &mut (dyn FnMut(&str) + Send),
    ) -> Result<StepOutput, StepError> {
        self.run_step_viewed(step, args, capture, call, on_line, None)
            .await
    }

    /// [`Engine::run_step`]; with `view`, the command prints the engine's machine-readable
    /// view (`plan -json`): each line is read back into the text the human view prints
    /// (`core::engine_checks::view_line`) for the log and `on_line`, and its warnings are kept
    /// in `view` (also when the step fails).
    pub(super) async fn run_step_viewed(
        &self,
        step: Step,
        args: &[OsString],
        capture: Capture,
        call: &StepCall<'_>,
        on_line: &mut (dyn FnMut(&str) + Send),
        view: Option<&mut PlanWarnings>,
    ) -> Result<StepOutput, StepError> {
        if call.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
            return Err(StepError::Stopped {
                step,
                how: StopHow::Cancelled,
                log: RawLog::default(),
            });
        }
        let counted = call.cgroup.map(|c| c.counts()).unwrap_or_default();
        let mut running = self.start(step, args, capture, call)?;
        let mut sink = LineSink {
            log: RawLog::default(),
            scrubber: call.scrubber,
            on_line,
            view,
        };
        running.supervise(step, call, &mut sink).await?;
        let ended = running.end(call, counted).await;
        match self.how_stopped(&ended, capture, call) {
            Some(how) => Err(StepError::Stopped {
                step,
                how,
                log: sink.log,
            }),
            None => Ok(StepOutput {
                log: sink.log,
                stdout: ended.stdout.bytes,
                exit: ended.status.code(),
            }),
        }
    }

    /// The step's process spawned, its output read as it comes.
    fn start(
        &self,
        step: Step,
        args: &[OsString],
        capture: Capture,
        call: &StepCall<'_>,
    ) -> Result<Running, StepError> {
        let mut child = self.spawn(step, args, call)?;
        let group = GroupGuard::of(&child);
        let (lines, stdout_task) = stream_output(&mut child, capture, self.inner.max_plan_json);
        Ok(Running {
            child,
            group,
            lines,
            stdout_task,
            watch: Supervisor::new(call.deadline, self.inner.grace),
        })
    }

    /// How an ended step was stopped; `None` when it ran to its end (an exit that is a
    /// [`Capture::Verdict`] included).
    fn how_stopped(&self, ended: &Ended, capture: Capture, call: &StepCall<'_>) -> Option<StopHow> {
        let failed = ended.stop.is_some() || !ended.status.success();
        let how = match (ended.stop, ended.refused) {
            (Some(StopReason::Cancelled), _) => StopHow::Cancelled,
            (
                _,
                Some(Refused {
                    memory: Some(max), ..
                }),
            ) if failed => StopHow::OverMemory(max),
            (
                _,
                Some(Refused {
                    tasks: Some(max), ..
                }),
            ) if failed => StopHow::TooManyTasks(max),
            _ => match ended.stop {
                Some(StopReason::TimedOut) => StopHow::TimedOut(self.inner.timeout),
                Some(StopReason::Cancelled) => StopHow::Cancelled,
                Some(StopReason::OverQuota) => {
                    StopHow::OverQuota(call.quota.map(|q| q.max).unwrap_or_default())
                }
                // Before the exit status: the engine may have died of the pipe planbot closed.
                None if ended.stdout.overflowed => StopHow::TooLarge(self.inner.max_plan_json),
                None if !ended.status.success() && capture != Capture::Verdict => {
                    StopHow::Exit(ended.status.code())
                }
                None => return None,
            },
        };
        Some(how)
    }

    /// Start the engine in its own process group, confined when the run is sandboxed.
    fn spawn(
        &self,
        step: Step,
        args: &[OsString],
        call: &StepCall<'_>,
    ) -> Result<EngineChild, StepError> {
        let sandbox = match call.confinement {
            Some(c) => Some(
                match &c.isolation {
                    Some(isolation) => c.policy.prepare_isolated(c.support, isolation, call.dir),
                    None => c.policy.prepare(c.support),
                }
                .map_err(|e| StepError::Other(EngineError::Sandbox(e.to_string())))?,
            ),
            None => None,
        };
        let cgroup = call.cgroup.map(|c| c.enter_fds()).unwrap_or_default();
        let launch = Launch {
            program: &self.inner.binary,
            args,
            env: call.env,
            dir: call.dir,
            cgroup: &cgroup,
            sandbox: sandbox.as_ref(),
        };
        // ETXTBSY: the binary was just written (an install, an upgrade) and a process started
        // meanwhile still holds it open for writing until its exec; that passes in moments.
        let mut spawned = EngineChild::spawn(&launch);
        for attempt in 1..=5u64 {
            match &spawned {
                Err(e) if e.raw_os_error() == Some(Errno::ETXTBSY as i32) => {
                    std::thread::sleep(std::time::Duration::from_millis(20 * attempt));
                    spawned = EngineChild::spawn(&launch);
                }
                _ => break,
            }
        }
        spawned.map_err(|e| {
            StepError::Other(match e {
                StartError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    EngineError::NotFound(format!("{}: {e}", self.inner.binary.display()))
                }
                StartError::Sandbox(e) => EngineError::Sandbox(format!(
                    "the kernel refused the sandbox (namespaces or Landlock ruleset) for `{step}` ({e})"
                )),
                StartError::Io(e) => {
                    EngineError::Io(format!("{} {step}: {e}", self.inner.binary.display()))
                }
            })
        })
    }
}

/// The child's output lines on one bounded channel (stderr always, stdout unless it is the
/// result), and the task collecting stdout (at most `max_stdout` bytes) when it is.
fn stream_output(
    child: &mut EngineChild,
    capture: Capture,
    max_stdout: u64,
) -> (mpsc::Receiver<Line>, Option<JoinHandle<Captured>>) {
    let (tx, rx) = mpsc::channel::<Line>(LINES_IN_FLIGHT);
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let stdout_task = match capture {
        Capture::Log => {
            tokio::spawn(read_lines(stdout, tx.clone()));
            None
        }
        Capture::Stdout | Capture::Verdict => Some(tokio::spawn(read_capped(stdout, max_stdout))),
    };
    tokio::spawn(read_lines(stderr, tx));
    (rx, stdout_task)
}

/// A step's stdout taken as its result.
#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    /// More than the cap came: nothing is kept, and the pipe was closed.
    overflowed: bool,
}

/// stdout up to `max` bytes. One byte more and reading stops: the pipe closes (the engine's
/// next write fails and it exits) and nothing of it is kept.
async fn read_capped(stdout: tokio::net::unix::pipe::Receiver, max: u64) -> Captured {
    use tokio::io::AsyncReadExt;
    let mut bytes = Vec::new();
    let _ = stdout
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .await;
    if bytes.len() as u64 > max {
        return Captured {
            bytes: Vec::new(),
            overflowed: true,
        };
    }
    Captured {
        bytes,
        overflowed: false,
    }
}

/// Where a step's lines go as they come: the raw log, `on_line` (redacted), and with a view
/// (`plan -json`) each line read back into the human view's text, its warnings kept.
struct LineSink<'a> {
    log: RawLog,
    scrubber: &'a Scrubber,
    on_line: &'a mut (dyn FnMut(&str) + Send),
    view: Option<&'a mut PlanWarnings>,
}

impl LineSink<'_> {
    fn take(&mut self, text: String) {
        match self.view.as_deref_mut() {
            Some(warnings) => {
                let read = view_line(&text);
                if let Some(d) = read.diagnostic {
                    warnings.add(d);
                }
                for l in read.text {
                    self.say(l);
                }
            }
            None => self.say(text),
        }
    }

    fn say(&mut self, line: String) {
        (self.on_line)(&self.scrubber.scrub(&line));
        self.log.push(line);
    }
}

/// A step's engine process while it runs: the child, its process group, its output (lines,
/// and stdout when it is the result) and where it stands.
struct Running {
    child: EngineChild,
    group: GroupGuard,
    lines: mpsc::Receiver<Line>,
    stdout_task: Option<JoinHandle<Captured>>,
    watch: Supervisor,
}

impl Running {
    /// Until the process exited and its output is read: its lines to `sink`; a cancel or the
    /// deadline stops it gracefully, the disk quota passed kills it at once.
    async fn supervise(
        &mut self,
        step: Step,
        call: &StepCall<'_>,
        sink: &mut LineSink<'_>,
    ) -> Result<(), StepError> {
        let Running {
            child,
            group,
            lines,
            watch,
            ..
        } = self;
        let mut cancel = call.cancel.clone();
        let mut quota_tick = tokio::time::interval(super::quota::EVERY);
        quota_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !watch.done() {
            tokio::select! {
                line = lines.recv(), if watch.lines_open => match line {
                    Some(Line(text)) => sink.take(text),
                    None => watch.lines_open = false,
                },
                status = child.wait(), if watch.exit.is_none() => {
                    let status = status.map_err(|e| StepError::Other(EngineError::Io(format!("{step}: {e}"))))?;
                    watch.exited(status);
                }
                _ = cancelled(&mut cancel), if watch.may_stop() => watch.stop(StopReason::Cancelled, group),
                _ = quota_tick.tick(), if call.quota.is_some() && watch.may_stop() => {
                    let quota = call.quota.cloned().expect("checked");
                    let over = tokio::task::spawn_blocking(move || quota.exceeded())
                        .await
                        .unwrap_or(false);
                    if over {
                        watch.kill(StopReason::OverQuota, group);
                    }
                }
                _ = tokio::time::sleep_until(watch.wake_at().into()) => watch.on_timer(group),
            }
        }
        Ok(())
    }

    /// The process has exited: stragglers in its group (a provider plugin that outlived the
    /// engine) and anything left in the run's cgroup (a process that left the group) are
    /// killed; what the cgroup refused since `counted`, and stdout, drained.
    async fn end(mut self, call: &StepCall<'_>, counted: Counts) -> Ended {
        self.group.disarm();
        self.group.signal(Signal::SIGKILL);
        if let Some(c) = call.cgroup {
            c.kill_all();
        }
        let refused = call.cgroup.map(|c| {
            let now = c.counts();
            Refused {
                memory: (now.oom_kills > counted.oom_kills).then_some(c.memory_max),
                tasks: (now.forks_refused > counted.forks_refused).then_some(c.tasks_max),
            }
        });
        let stdout = match self.stdout_task.take() {
            Some(task) => tokio::time::timeout(DRAIN_AFTER_EXIT, task)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default(),
            None => Captured::default(),
        };
        Ended {
            stop: self.watch.stop,
            status: self.watch.exit.expect("the loop ends after the exit"),
            refused,
            stdout,
        }
    }
}

/// What the run's cgroup refused during a step: memory (the OOM killer ended a process at the
/// run's limit, this one) or a fork (at the tasks limit, this one).
#[derive(Debug, Clone, Copy)]
struct Refused {
    memory: Option<u64>,
    tasks: Option<u64>,
}

/// A step whose process is gone: why it was stopped (if it was), its exit, what the run's
/// cgroup refused (with one) and its stdout when that is the result.
struct Ended {
    stop: Option<StopReason>,
    status: ExitStatus,
    refused: Option<Refused>,
    stdout: Captured,
}

/// Resolves when `cancel` fires; never without a token (or once its handle is gone).
async fn cancelled(cancel: &mut Option<CancelToken>) {
    match cancel.as_mut() {
        Some(c) => c.cancelled().await,
        None => std::future::pending().await,
    }
}

/// Where a running step stands: exited or not, asked to stop or not, SIGTERM sent when,
/// output pipes still open. Decides when to wake up next and what to do then.
struct Supervisor {
    deadline: Instant,
    grace: Duration,
    exit: Option<ExitStatus>,
    stop: Option<StopReason>,
    term_sent_at: Option<Instant>,
    killed: bool,
    lines_open: bool,
    drain_until: Option<Instant>,
    /// The engine exited but something in its group still held the pipes past the drain time.
    gave_up_draining: bool,
}

impl Supervisor {
    fn new(deadline: Instant, grace: Duration) -> Supervisor {
        Supervisor {
            deadline,
            grace,
            exit: None,
            stop: None,
            term_sent_at: None,
            killed: false,
            lines_open: true,
            drain_until: None,
            gave_up_draining: false,
        }
    }

    /// The engine has exited and its output is read (or no longer waited for).
    fn done(&self) -> bool {
        self.exit.is_some() && (!self.lines_open || self.gave_up_draining)
    }

    /// Whether a cancellation still matters.
    fn may_stop(&self) -> bool {
        self.stop.is_none() && self.exit.is_none()
    }

    fn exited(&mut self, status: ExitStatus) {
        self.exit = Some(status);
        self.drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
    }

    /// The graceful stop: one SIGTERM to the group; SIGKILL follows after the grace period.
    fn stop(&mut self, why: StopReason, group: &GroupGuard) {
        self.stop = Some(why);
        group.signal(Signal::SIGTERM);
        self.term_sent_at = Some(Instant::now());
    }

    /// The stop without grace (a disk filling up waits for nobody): SIGKILL to the group now.
    fn kill(&mut self, why: StopReason, group: &GroupGuard) {
        self.stop = Some(why);
        group.signal(Signal::SIGKILL);
        self.term_sent_at = Some(Instant::now());
        self.killed = true;
    }

    /// The next moment something is due: the end of the drain, the SIGKILL, the deadline.
    fn wake_at(&self) -> Instant {
        let kill_at = self.term_sent_at.map(|t| t + self.grace);
        match (self.exit, kill_at, self.drain_until) {
            (Some(_), _, Some(d)) => d,
            (None, Some(k), _) if !self.killed => k,
            (None, _, _) if self.stop.is_none() => self.deadline,
            _ => Instant::now() + Duration::from_secs(3600),
        }
    }

    /// What is due at [`Supervisor::wake_at`].
    fn on_timer(&mut self, group: &GroupGuard) {
        if self.exit.is_some() {
            // The engine exited but something in its group still holds the pipes.
            group.signal(Signal::SIGKILL);
            self.gave_up_draining = true;
        } else if self.term_sent_at.is_some() {
            group.signal(Signal::SIGKILL);
            self.killed = true;
        } else if self.stop.is_none() {
            self.stop(StopReason::TimedOut, group);
        }
    }
}

/// Signals the engine's process group; kills it if a run is abandoned (future dropped, panic).
struct GroupGuard {
    pgid: Option<Pid>,
    armed: bool,
}

impl GroupGuard {
    /// The group the child leads (`process_group(0)`: its pid is the group id).
    fn of(child: &EngineChild) -> GroupGuard {
        GroupGuard {
            pgid: Some(Pid::from_raw(child.id())),
            armed: true,
        }
    }

    /// Send `sig` to the whole group; a group that is gone (`ESRCH`) is no error.
    fn signal(&self, sig: Signal) {
        if let Some(pgid) = self.pgid.filter(|p| p.as_raw() > 1) {
            let _ = killpg(pgid, sig);
        }
    }

    /// The step ended normally: dropping the guard no longer kills the group.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            self.signal(Signal::SIGKILL);
        }
    }
}
