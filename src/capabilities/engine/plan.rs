//! A plan run in named stages: check the request → choose the plan's encryption → make the
//! private run directory → `init` (serialised per plugin cache) → `plan -json -out` (its
//! machine-readable view, read back into the human log, its warnings kept) → `show -json`.

use super::apply::PlannedRun;
use super::checks::{has_test_files, EngineChecks};
use super::encryption::PlanEncryption;
use super::error::{EngineError, Step, StepError};
use super::output::RawLog;
use super::process::{Capture, StepCall, StepOutput};
use super::quota::Quota;
use super::request::{self, PlanRequest, StepProgress};
use super::run_dir::{private_run_dir, RunDirs};
use super::Engine;
use crate::capabilities::checkout_file;
use crate::core::engine_checks::{fmt_check_args, CheckSet, PlanWarnings, StepCheck};
use crate::core::plan::{Plan, PlanParseError};
use crate::core::redact::{Scrubber, Secrets};
use crate::core::state::Backend;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::Instant;

/// The provider lock file the engine writes in the root.
/// The engine's dependency lock file, in a root's directory.
pub const LOCK_FILE: &str = ".terraform.lock.hcl";

/// A lock file holds a few hashes per provider (about 1 KiB each): a megabyte is hundreds of
/// providers.
pub const LOCK_FILE_MAX: u64 = 1024 * 1024;

impl Engine {
    /// Run `init`, `plan -out` into a private dir, and `show -json` in `dir`.
    ///
    /// When `plan` fails, the plan file the engine still writes (an errored plan) is read with
    /// `show -json` to learn its secrets (sensitive variables, masked values), so that an error
    /// message quoting one (e.g. a precondition using `nonsensitive()`) is redacted too.
    pub async fn plan(&self, dir: &Path, req: &PlanRequest) -> Result<PlannedRun, EngineError> {
        self.plan_checked(dir, req, CheckSet::NONE).await.0
    }

    /// [`Engine::plan`], and the `checks` after it in the same run (its directory, environment,
    /// sandbox and quota; each step with its own timeout): `validate -json`, `fmt -check
    /// -list=true -recursive`, `test -json` when the root has test files. They run after the
    /// plan, also when the plan failed (a validation error's place is what its author needs);
    /// not when `init` failed or the run was stopped (timeout, cancel, quota).
    pub async fn plan_checked(
        &self,
        dir: &Path,
        req: &PlanRequest,
        checks: CheckSet,
    ) -> (Result<PlannedRun, EngineError>, EngineChecks) {
        const BEFORE: &str = "the plan run stopped before it";
        // Which test files the engine reads (the version is asked only of a runner that may
        // run the engine at all).
        let tofu = (checks.test || checks.validate)
            && self.refuse_unsandboxed().is_ok()
            && matches!(
                self.version().await.map(|v| v.name),
                Ok(super::version::EngineKind::OpenTofu)
            );
        let test_files = (checks.test || checks.validate) && has_test_files(dir, tofu);
        let mut out = EngineChecks::pending(checks, test_files, BEFORE);
        let planned = self.plan_run(dir, req, checks, test_files, &mut out).await;
        if let Err(e) = &planned {
            // Never reached: they did not run because of this error.
            let why = e.to_string().lines().next().unwrap_or("").to_string();
            for step in [&mut out.validate, &mut out.fmt, &mut out.test] {
                if matches!(step, StepCheck::NotRun(r) if r == BEFORE) {
                    *step = StepCheck::NotRun(why.clone());
                }
            }
        }
        (planned, out)
    }

    /// The plan run of [`Engine::plan_checked`]: set up, `init`, `plan`, `show`, the checks
    /// (`out`), and the run kept for its apply.
    async fn plan_run(
        &self,
        dir: &Path,
        req: &PlanRequest,
        checks: CheckSet,
        test_files: bool,
        out: &mut EngineChecks,
    ) -> Result<PlannedRun, EngineError> {
        let started = Instant::now();
        let mut run = self.set_up(dir, req).await?;
        let plan_file = run.dirs.out.join("plan");
        let env_scrubber = run.secrets.scrubber();
        let mut steps = PlanSteps {
            engine: self,
            req,
            init_env: &run.init_env,
            call: StepCall {
                dir: &run.place.dir,
                env: &run.env,
                deadline: started + self.inner.timeout,
                cancel: req.cancel.clone(),
                scrubber: &env_scrubber,
                confinement: run.confinement.as_ref(),
                quota: run.quota.as_ref(),
                cgroup: run.cgroup.as_ref(),
            },
            plan_file: &plan_file,
            log: RawLog::default(),
            warnings: PlanWarnings::default(),
        };
        steps.init().await?;
        // What `init` configured: its backend (none at all is the local one).
        let backend = Backend::after_init(
            std::fs::read(run.place.dir.join(".terraform").join("terraform.tfstate"))
                .ok()
                .as_deref(),
        );
        let shown = match steps.plan(&mut run.secrets).await {
            Ok(()) => steps.show().await,
            Err(e) => Err(e),
        };
        out.plan = std::mem::take(&mut steps.warnings);
        // The lock file as the plan left it, read within the plan's deadline (before the
        // checks, which have deadlines of their own).
        let lock_file = match &shown {
            Ok(_) => Some(read_lock_file(&run.place, started + self.inner.timeout).await),
            Err(_) => None,
        };
        if ran_root_code(&shown) {
            // A clean plan has validated the whole configuration (the engine validates before
            // it plans: an error there fails the plan, its warnings are the plan's): `validate`
            // runs again only after a failed or errored plan, or to read the test files.
            let validated = matches!(&shown, Ok((plan, _)) if !plan.errored) && !test_files;
            steps.checks(checks, test_files, validated, out).await;
        }
        // The plan's own secrets, collected once: merged into the run's, and their scrubber
        // kept for the plan's fingerprint (which binds only those).
        let plan_secrets = match &shown {
            Ok((plan, _)) => {
                let own = Secrets::from_plan(plan);
                run.secrets.merge(&own);
                own.scrubber()
            }
            Err(_) => Scrubber::none(),
        };
        out.scrubber = run.secrets.scrubber();
        let (plan, plan_json) = shown?;
        let var_args = steps.var_args();
        let log = steps.log;
        let lock_file = lock_file.expect("read when the plan was shown")?;
        // The same secrets as the checks': their matcher is built once.
        let scrubber = out.scrubber.clone();
        Ok(PlannedRun {
            engine: self.clone(),
            dir: run.place.dir,
            env: run.env,
            confinement: run.confinement,
            cancel: req.cancel.clone(),
            log: log.render(&scrubber),
            plan,
            plan_json,
            plan_file,
            private: run.private,
            lock_file,
            parallelism: req.parallelism,
            targeting: req.targeting.clone(),
            var_args,
            backend,
            version: run.version,
            encryption: run.encryption,
            secrets: run.secrets,
            scrubber,
            plan_secrets,
            duration: started.elapsed(),
            _state_gate: req.state_gate.clone(),
            cgroup: run.cgroup,
        })
    }

    /// `fmt -check` once over the directories `dirs` of the checkout `worktree` (repo-relative,
    /// `.` its top), run from its top in a run of its own set up from `req` (its sandbox, disk
    /// quota, cgroup and environment; nothing is planned): one engine process for every root of
    /// a job, where each root's own run took one. Each root reads its share of what it printed
    /// ([`crate::core::engine_checks::fmt_share`], [`super::FmtOfRoots`]).
    pub async fn fmt_of_roots(
        &self,
        worktree: &Path,
        dirs: &[&str],
        req: &PlanRequest,
    ) -> StepCheck {
        let run = match self.set_up(worktree, req).await {
            Ok(run) => run,
            Err(e) => return StepCheck::NotRun(format!("`{}` could not run: {e}", Step::Fmt)),
        };
        let scrubber = run.secrets.scrubber();
        let call = StepCall {
            dir: &run.place.dir,
            env: &run.env,
            deadline: Instant::now() + self.inner.timeout,
            cancel: req.cancel.clone(),
            scrubber: &scrubber,
            confinement: run.confinement.as_ref(),
            quota: run.quota.as_ref(),
            cgroup: run.cgroup.as_ref(),
        };
        let args = fmt_check_args(dirs).into_iter().map(OsString::from);
        self.run_check(Step::Fmt, args.collect(), &call).await
    }

    /// Everything a plan run needs before its first step: the request checked and placed, the
    /// secrets to scrub, the engine's version (and a targeted plan's flags checked against
    /// it), the plan's encryption, the environments of `init` and of the other steps, the
    /// private directories, the sandbox (with the job's state gate), the disk quota and the
    /// run's cgroup.
    async fn set_up(&self, dir: &Path, req: &PlanRequest) -> Result<RunSetup, EngineError> {
        self.refuse_unsandboxed()?;
        let place = request::place(dir, req)?;
        let mut secrets = self.secrets();
        secrets.extend(self.secret_values(&req.extra_env));
        secrets.extend(req.init_env.values().cloned());
        secrets.extend(req.extra_secrets.iter().cloned());
        if let Some(gate) = &req.state_gate {
            secrets.extend([gate.password().to_string()]);
        }
        let version = self.version().await?;
        // The flags of a targeted plan: only the allowed ones, each with an address, and none
        // this engine lacks (`-exclude` is OpenTofu's) — else nothing runs.
        req.targeting
            .recheck()
            .and_then(|t| t.check_engine(version.name).map(|_| t))
            .map_err(|e| EngineError::InvalidRequest(format!("targeted plan: {e}")))?;
        let (encryption, enc_text) =
            PlanEncryption::choose(&self.inner.env, req, &version, &mut secrets);
        let mut env = self.child_env(
            &req.extra_env,
            req.workspace.as_deref(),
            enc_text.as_deref(),
        );
        // The private directory (0700) that holds the plan file; deleted when it drops.
        let private = private_run_dir(&self.inner.temp_root)?;
        // The run's cgroup: every engine process of this run, and all they start, in it.
        let cgroup = self.run_cgroup()?;
        let dirs = RunDirs::create(private.path(), &self.inner.cli_config)
            .map_err(|e| EngineError::Io(format!("private run dir: {e}")))?;
        dirs.set_env(&mut env);
        // `init` alone gets the module credentials.
        let mut init_env = env.clone();
        for (k, v) in &req.init_env {
            if !super::env::forbidden_env_key(k) {
                init_env.insert(k.clone(), v.into());
            }
        }
        let mut confinement = self.confinement(Some((&place.worktree, &dirs)));
        if let (Some(c), Some(gate)) = (&mut confinement, &req.state_gate) {
            // The job's state gate: the one place the engine's `http` backend talks to.
            c.policy.allow_port(gate.port());
        }
        if let Some(c) = &confinement {
            c.set_env(&mut env);
        }
        let quota = self.inner.disk_max.map(|max| Quota {
            shared: self
                .inner
                .quota_counts
                .of(std::iter::once(place.worktree.clone())
                    .chain(self.inner.plugin_cache_dir.clone())
                    .collect()),
            own: vec![dirs.out.clone()],
            max,
        });
        Ok(RunSetup {
            place,
            secrets,
            version,
            encryption,
            env,
            init_env,
            private,
            dirs,
            confinement,
            quota,
            cgroup,
        })
    }
}

/// A plan run set up ([`Engine::set_up`]), before any engine step.
struct RunSetup {
    place: request::RunPlace,
    secrets: Secrets,
    version: super::version::EngineVersion,
    encryption: PlanEncryption,
    env: BTreeMap<String, OsString>,
    init_env: BTreeMap<String, OsString>,
    private: tempfile::TempDir,
    dirs: RunDirs,
    confinement: Option<super::sandbox::Confinement>,
    quota: Option<Quota>,
    cgroup: Option<super::cgroup::JobCgroup>,
}

/// The provider lock file as the plan left it in the root: the engine (and MR code it ran)
/// may have left anything in its place, so it is read as a checkout file (no link followed,
/// bounded, by `deadline`).
async fn read_lock_file(
    place: &request::RunPlace,
    deadline: Instant,
) -> Result<Option<Vec<u8>>, checkout_file::CheckoutFileError> {
    checkout_file::read(
        &place.worktree,
        &place
            .dir
            .strip_prefix(&place.worktree)
            .unwrap_or(Path::new(""))
            .join(LOCK_FILE),
        LOCK_FILE_MAX,
        deadline,
    )
    .await
}

/// Whether the engine ran the root's code to its end (a plan, or its error): then the checks
/// run.
fn ran_root_code<T>(shown: &Result<T, EngineError>) -> bool {
    matches!(
        shown,
        Ok(_)
            | Err(EngineError::Failed { .. }
                | EngineError::BadPlanJson { .. }
                | EngineError::TooManyValues { .. })
    )
}

/// The steps of one plan run, sharing its directory, environment, deadline and sandbox, and
/// the log of the steps so far.
struct PlanSteps<'a> {
    engine: &'a Engine,
    req: &'a PlanRequest,
    /// The environment of `init`: the run's, plus the request's `init_env`.
    init_env: &'a BTreeMap<String, OsString>,
    call: StepCall<'a>,
    plan_file: &'a Path,
    log: RawLog,
    /// The warnings `plan -json` gave.
    warnings: PlanWarnings,
}

impl PlanSteps<'_> {
    /// Run one step, telling the request's progress channel when it starts and ends; with
    /// `view`, a step printing the engine's machine-readable view ([`Engine::run_step_viewed`]).
    async fn run(
        &self,
        step: Step,
        args: Vec<OsString>,
        capture: Capture,
        view: Option<&mut PlanWarnings>,
    ) -> Result<StepOutput, StepError> {
        let init_call;
        let call = if step == Step::Init {
            init_call = StepCall {
                env: self.init_env,
                cancel: self.call.cancel.clone(),
                ..self.call
            };
            &init_call
        } else {
            &self.call
        };
        let tell = |took| {
            if let Some(p) = &self.req.progress {
                let _ = p.send(StepProgress { step, took });
            }
        };
        let started = Instant::now();
        tell(None);
        let out = self
            .engine
            .run_step_viewed(step, &args, capture, call, &mut |_| {}, view)
            .await;
        tell(Some(started.elapsed()));
        out
    }

    /// `init`, serialised per plugin cache dir (Terraform's cache is not concurrency-safe).
    async fn init(&mut self) -> Result<(), EngineError> {
        let _guard = match &self.engine.inner.plugin_cache_dir {
            Some(cache) => {
                std::fs::create_dir_all(cache).map_err(|e| {
                    EngineError::Io(format!("plugin cache dir {}: {e}", cache.display()))
                })?;
                Some(init_lock(cache).lock_owned().await)
            }
            None => None,
        };
        let mut args: Vec<OsString> =
            vec!["init".into(), "-input=false".into(), "-no-color".into()];
        if self.req.no_lock {
            args.push("-lock=false".into());
        }
        match self.run(Step::Init, args, Capture::Log, None).await {
            Ok(o) => {
                self.log.append(o.log);
                Ok(())
            }
            Err(e) => Err(e.into_engine_error(&self.log, self.call.scrubber)),
        }
    }

    /// `plan -json -out=PLAN_FILE` with the request's var files and vars: its lines read back
    /// into the log as the human view prints them, its warnings kept (`self.warnings`). When
    /// the engine fails, the errored plan's secrets are learnt (into `secrets`) before its
    /// error is shown.
    async fn plan(&mut self, secrets: &mut Secrets) -> Result<(), EngineError> {
        let mut warnings = PlanWarnings::default();
        let planned = self
            .run(
                Step::Plan,
                self.plan_args(),
                Capture::Log,
                Some(&mut warnings),
            )
            .await;
        self.warnings = warnings;
        match planned {
            Ok(o) => {
                self.log.append(o.log);
                Ok(())
            }
            Err(e) => {
                if e.is_exit() && self.plan_file.exists() {
                    if let Ok(o) = self
                        .run(Step::Show, self.show_args(), Capture::Stdout, None)
                        .await
                    {
                        if let Ok(p) = Plan::from_json(&o.stdout) {
                            secrets.merge(&Secrets::from_plan(&p));
                        }
                    }
                }
                Err(e.into_engine_error(&self.log, &secrets.scrubber()))
            }
        }
    }

    /// The checks asked for, one after the other (`validate`'s warnings go with its errors;
    /// `validated`: the plan did validate, [`StepCheck::ByThePlan`]).
    async fn checks(
        &mut self,
        set: CheckSet,
        has_tests: bool,
        validated: bool,
        out: &mut EngineChecks,
    ) {
        let engine = self.engine;
        if set.validate && validated {
            out.validate = StepCheck::ByThePlan;
        } else if set.validate {
            let args = vec!["validate".into(), "-json".into(), "-no-color".into()];
            out.validate = engine.run_check(Step::Validate, args, &self.call).await;
        }
        if set.fmt {
            let share = match &self.req.fmt_of_roots {
                Some(of_roots) => of_roots.share().await,
                None => None,
            };
            out.fmt = match share {
                Some(share) => share,
                None => {
                    let args = fmt_check_args(&[]).into_iter().map(OsString::from);
                    engine
                        .run_check(Step::Fmt, args.collect(), &self.call)
                        .await
                }
            };
        }
        if set.test && has_tests {
            let mut args: Vec<OsString> = vec!["test".into(), "-json".into(), "-no-color".into()];
            args.extend(self.var_args());
            out.test = engine.run_check(Step::Test, args, &self.call).await;
        }
    }

    /// `show -json PLAN_FILE`, parsed: the plan and the document as printed.
    async fn show(&mut self) -> Result<(Plan, Vec<u8>), EngineError> {
        let shown = match self
            .run(Step::Show, self.show_args(), Capture::Stdout, None)
            .await
        {
            Ok(o) => {
                self.log.append(o.log);
                o.stdout
            }
            Err(e) => return Err(e.into_engine_error(&self.log, self.call.scrubber)),
        };
        match Plan::from_json(&shown) {
            Ok(plan) => Ok((plan, shown)),
            Err(PlanParseError::TooManyValues(over)) => Err(EngineError::TooManyValues {
                error: over.to_string(),
                log: self.log.render(self.call.scrubber),
            }),
            Err(PlanParseError::NotJson(error) | PlanParseError::NotAPlan(error)) => {
                Err(EngineError::BadPlanJson {
                    error: self.call.scrubber.scrub(&error).into_owned(),
                    log: self.log.render(self.call.scrubber),
                })
            }
        }
    }

    fn plan_args(&self) -> Vec<OsString> {
        // The machine-readable view: each warning with its summary, detail and place (the
        // human view prints them only as text); the log is rebuilt from it.
        let mut args: Vec<OsString> = vec![
            "plan".into(),
            "-json".into(),
            "-input=false".into(),
            "-no-color".into(),
        ];
        if self.req.no_lock {
            args.push("-lock=false".into());
        } else {
            args.push(
                format!(
                    "-lock-timeout={}s",
                    self.engine.inner.lock_timeout.as_secs()
                )
                .into(),
            );
        }
        if let Some(n) = self.req.parallelism {
            args.push(format!("-parallelism={n}").into());
        }
        // One argv item per checked `FLAG=ADDRESS` (no shell reads them).
        args.extend(self.req.targeting.engine_args().into_iter().map(Into::into));
        let mut out_arg = OsString::from("-out=");
        out_arg.push(self.plan_file);
        args.push(out_arg);
        args.extend(self.var_args());
        args
    }

    /// The request's `-var-file=` and `-var=` arguments, in the order that makes the
    /// operator's win.
    fn var_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        for vf in self
            .req
            .var_files
            .iter()
            .chain(&self.req.operator_var_files)
        {
            let mut a = OsString::from("-var-file=");
            a.push(vf);
            args.push(a);
        }
        for (name, value) in &self.req.vars {
            args.push(format!("-var={name}={value}").into());
        }
        args
    }

    fn show_args(&self) -> Vec<OsString> {
        vec!["show".into(), "-json".into(), self.plan_file.into()]
    }
}

/// Per-plugin-cache-dir locks serialising `init` within this process.
fn init_lock(cache_dir: &Path) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: OnceLock<StdMutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> =
        OnceLock::new();
    let mut map = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    map.entry(cache_dir.to_path_buf()).or_default().clone()
}
