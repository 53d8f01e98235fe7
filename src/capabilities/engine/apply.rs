//! A finished plan ([`PlannedRun`]): the plan, its JSON, the redacted log and the private
//! directory holding the binary plan file, and the apply of exactly that plan file.
//!
//! Every text that comes out (logs, errors, streamed apply lines) is scrubbed of the
//! configured env values, the per-call secrets, the plan-encryption key and the plan's own
//! secrets.

use super::encryption::PlanEncryption;
use super::error::{EngineError, Step};
use super::output::RawLog;
use super::process::{Capture, StepCall};
use super::request::CancelToken;
use super::sandbox::Confinement;
use super::version::EngineVersion;
use super::Engine;
use crate::core::fingerprint::Fingerprint;
use crate::core::plan::Plan;
use crate::core::redact::{Scrubber, Secrets};
use crate::core::state::Backend;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A finished plan: the parsed plan, its JSON, the redacted log, and the private directory
/// holding the binary plan file (deleted when this is dropped, or after [`PlannedRun::apply`]).
pub struct PlannedRun {
    pub(super) engine: Engine,
    pub(super) dir: PathBuf,
    pub(super) env: BTreeMap<String, OsString>,
    pub(super) confinement: Option<Confinement>,
    pub(super) cancel: Option<CancelToken>,
    pub(super) log: String,
    pub(super) plan: Plan,
    pub(super) plan_json: Vec<u8>,
    pub(super) plan_file: PathBuf,
    pub(super) private: tempfile::TempDir,
    pub(super) lock_file: Option<Vec<u8>>,
    /// `-parallelism=N` of the plan, given to its apply too.
    pub(super) parallelism: Option<u16>,
    /// The `-target`/`-exclude`/`-replace` flags of the plan (empty: the full plan).
    pub(super) targeting: crate::core::targeting::Targeting,
    /// The plan's `-var-file=`/`-var=` arguments, for the plan after the apply.
    pub(super) var_args: Vec<OsString>,
    pub(super) backend: Backend,
    pub(super) version: EngineVersion,
    pub(super) encryption: PlanEncryption,
    pub(super) secrets: Secrets,
    pub(super) scrubber: Scrubber,
    /// The scrubber of the plan's own secrets only (collected when the plan was read), which
    /// the fingerprint binds.
    pub(super) plan_secrets: Scrubber,
    pub(super) duration: Duration,
    /// The job's state gate, kept running until the apply is done.
    pub(super) _state_gate: Option<std::sync::Arc<crate::capabilities::state_gate::GatePass>>,
    /// The run's cgroup (the apply runs in it too); dropped last: what is left in it is killed.
    pub(super) cgroup: Option<super::cgroup::JobCgroup>,
}

impl fmt::Debug for PlannedRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the env, the JSON or the secrets.
        f.debug_struct("PlannedRun")
            .field("dir", &self.dir)
            .field("private", &self.private.path())
            .field("version", &self.version)
            .field("encryption", &self.encryption)
            .field("duration", &self.duration)
            .finish_non_exhaustive()
    }
}

/// The result of an apply: its redacted log and how long it took.
#[derive(Debug, Clone)]
pub struct ApplyOutcome {
    pub log: String,
    pub duration: Duration,
}

impl PlannedRun {
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The `show -json` document as the engine printed it (holds secrets in clear: render it
    /// through the masks, never print it).
    pub fn plan_json(&self) -> &[u8] {
        &self.plan_json
    }

    /// The redacted combined output of init, plan and show.
    pub fn log(&self) -> &str {
        &self.log
    }

    pub fn duration(&self) -> Duration {
        self.duration
    }

    pub fn version(&self) -> &EngineVersion {
        &self.version
    }

    pub fn encryption(&self) -> PlanEncryption {
        self.encryption
    }

    /// Everything known to be secret in this run: configured env, per-call secrets, the plan
    /// encryption key, and the plan's own secrets.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// The scrubber built from [`PlannedRun::secrets`].
    pub fn scrubber(&self) -> &Scrubber {
        &self.scrubber
    }

    /// The root's `.terraform.lock.hcl` as it was after `init`, when there is one.
    pub fn lock_file(&self) -> Option<&[u8]> {
        self.lock_file.as_deref()
    }

    /// The plan's fingerprint, bound to the provider lock file and the `-parallelism` it is
    /// planned and applied with.
    pub fn fingerprint(&self, key: &[u8]) -> Fingerprint {
        super::shown::fingerprint(
            &self.plan,
            key,
            self.lock_file.as_deref(),
            self.parallelism,
            &self.targeting,
            &self.plan_secrets,
        )
    }

    /// The plan as a note shows it, its plan file, sandbox and state gate gone (an MR's plan
    /// is never applied).
    pub fn into_shown(self) -> super::ShownPlan {
        super::ShownPlan {
            plan: self.plan,
            plan_json: self.plan_json,
            log: self.log,
            secrets: self.secrets,
            lock_file: self.lock_file,
            parallelism: self.parallelism,
            targeting: self.targeting,
            backend: self.backend,
            plan_secrets: self.plan_secrets,
            kept_digest: None,
        }
    }

    /// The `-target`/`-exclude`/`-replace` flags this plan was made with (empty: the full plan).
    pub fn targeting(&self) -> &crate::core::targeting::Targeting {
        &self.targeting
    }

    /// The `-parallelism=N` this plan was made with and is applied with (`None`: the engine's
    /// default).
    pub fn parallelism(&self) -> Option<u16> {
        self.parallelism
    }

    /// The backend `init` configured: where the state lives (a local one is in the checkout).
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The (canonical) root directory that was planned; an apply runs there.
    pub fn root_dir(&self) -> &Path {
        &self.dir
    }

    /// The private directory holding the plan file (for tests and diagnostics).
    pub fn private_dir(&self) -> &Path {
        self.private.path()
    }

    /// Apply exactly this plan file (`apply PLANFILE`, never `-auto-approve` without a plan).
    pub async fn apply(self) -> Result<ApplyOutcome, EngineError> {
        self.apply_streaming(|_| {}).await
    }

    /// Apply exactly this plan file, handing every output line (already redacted) to `on_line`
    /// as it comes; the private directory is deleted afterwards, whatever happens. To stream
    /// to an HTTP response, pass `move |l| { let _ = tx.send(l.to_string()); }` with a tokio
    /// unbounded sender.
    pub async fn apply_streaming(
        self,
        on_line: impl FnMut(&str) + Send,
    ) -> Result<ApplyOutcome, EngineError> {
        let out = self.apply_steps(on_line).await;
        drop(self.private);
        out
    }

    /// [`PlannedRun::apply_streaming`], then, when the apply succeeded, a plan of the root again
    /// (the same directory, environment, sandbox, variables and `-parallelism`; its plan file in
    /// the private directory, read with `show -json`): what it would still change. The apply
    /// reported success; a provider that did not do the work shows up here. `Err(report)` (the
    /// engine's redacted output, at most 20 lines) when the plan after the apply could not run
    /// (then nothing says the apply left no changes).
    pub async fn apply_and_replan(
        self,
        on_line: impl FnMut(&str) + Send,
    ) -> Result<(ApplyOutcome, Result<Vec<String>, String>), EngineError> {
        let out = self.apply_steps(on_line).await?;
        let left = self.replan().await;
        drop(self.private);
        Ok((out, left))
    }

    /// The plan after the apply: `address (actions)` of every change it still has.
    async fn replan(&self) -> Result<Vec<String>, String> {
        let started = Instant::now();
        let inner = &self.engine.inner;
        // Beside the applied plan file: the directory the sandbox lets the engine write.
        let file = self.plan_file.with_file_name("after-apply");
        let mut args: Vec<OsString> = vec![
            "plan".into(),
            "-input=false".into(),
            "-no-color".into(),
            format!("-lock-timeout={}s", inner.lock_timeout.as_secs()).into(),
        ];
        if let Some(n) = self.parallelism {
            args.push(format!("-parallelism={n}").into());
        }
        let mut out_arg = OsString::from("-out=");
        out_arg.push(&file);
        args.push(out_arg);
        args.extend(self.var_args.iter().cloned());
        // A targeted plan is checked within its own scope (`-target`/`-exclude`: what it left
        // out is not "left by the apply"); `-replace` is not repeated, it would replace again.
        let scope = crate::core::targeting::Targeting {
            replace: Vec::new(),
            ..self.targeting.clone()
        };
        args.extend(scope.engine_args().into_iter().map(OsString::from));
        let call = self.step_call(started + inner.timeout);
        let why = |e: super::error::StepError| {
            e.into_engine_error(&RawLog::default(), &self.scrubber)
                .report(20)
        };
        self.engine
            .run_step(Step::Plan, &args, Capture::Log, &call, &mut |_| {})
            .await
            .map_err(why)?;
        let show = vec!["show".into(), "-json".into(), file.into_os_string()];
        let shown = self
            .engine
            .run_step(Step::Show, &show, Capture::Stdout, &call, &mut |_| {})
            .await
            .map_err(why)?;
        let plan = Plan::from_json(&shown.stdout).map_err(|e| e.to_string())?;
        Ok(plan
            .managed_changes()
            .filter(|rc| {
                !matches!(
                    rc.kind(),
                    crate::core::plan::ActionKind::NoOp | crate::core::plan::ActionKind::Read
                )
            })
            .map(|rc| format!("{} ({})", rc.address, rc.change.actions.join(", ")))
            .collect())
    }

    /// A step of this apply, in its private directory and sandbox, ending by `deadline`.
    fn step_call(&self, deadline: Instant) -> StepCall<'_> {
        StepCall {
            dir: &self.dir,
            env: &self.env,
            deadline,
            cancel: self.cancel.clone(),
            scrubber: &self.scrubber,
            confinement: self.confinement.as_ref(),
            quota: None,
            cgroup: self.cgroup.as_ref(),
        }
    }

    /// The apply itself; the private directory is kept (the caller drops it).
    async fn apply_steps(
        &self,
        mut on_line: impl FnMut(&str) + Send,
    ) -> Result<ApplyOutcome, EngineError> {
        let started = Instant::now();
        let inner = &self.engine.inner;
        let mut args: Vec<OsString> = vec![
            "apply".into(),
            "-input=false".into(),
            "-no-color".into(),
            format!("-lock-timeout={}s", inner.lock_timeout.as_secs()).into(),
        ];
        if let Some(n) = self.parallelism {
            args.push(format!("-parallelism={n}").into());
        }
        args.push(self.plan_file.clone().into_os_string());
        let call = self.step_call(started + inner.timeout);
        let result = self
            .engine
            .run_step(Step::Apply, &args, Capture::Log, &call, &mut on_line)
            .await;
        let out = result.map_err(|e| e.into_engine_error(&RawLog::default(), &self.scrubber))?;
        let log = out.log.render(&self.scrubber);
        Ok(ApplyOutcome {
            log,
            duration: started.elapsed(),
        })
    }
}
