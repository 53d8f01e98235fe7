//! The engine runner: `tofu`/`terraform` init + plan + show, and apply of that same plan file.
//! [`Engine`] is the facade; beside it one file per job (build, version, request, env, sandbox, encryption, run dirs, process, output, plan, apply).

mod apply;
mod builder;
mod cgroup;
mod checks;
pub mod child;
mod cli_config;
mod encryption;
mod env;
mod error;
mod output;
mod plan;
mod process;
mod quota;
mod request;
mod run_dir;
pub mod sandbox;
mod shown;
mod version;

pub use apply::{ApplyOutcome, PlannedRun};
pub use builder::{
    configured_binary, default_binary, EngineBuilder, CONFIG_HINT, DEFAULT_MAX_PLAN_JSON,
};
pub use cgroup::{sweep_stale_run_cgroups, CgroupSupport, JobCgroups};
pub use checks::EngineChecks;
pub use child::ENGINE_OOM_SCORE_ADJ;
pub use cli_config::{cli_config_text, CliConfig, ProviderMirror};
pub use encryption::{plan_encryption_config, PlanEncryption};
pub use env::go_runtime_env;
pub use error::{EngineError, Step};
pub use output::LINE_MAX_BYTES;
pub use plan::{LOCK_FILE, LOCK_FILE_MAX};
pub use request::{
    is_variable_name, CancelHandle, CancelToken, FmtOfRoots, PlanRequest, StepProgress,
};
pub use run_dir::{wipe_temp_root, RUN_DIR_PREFIX};
pub use sandbox::{Limits, Namespaces, Profile as SandboxProfile, SandboxMode};
pub use shown::{KeptShown, ShownPlan};
/// Which engine a binary is (defined in core, where a plan document's engine is told apart too).
pub use version::EngineKind;
pub use version::EngineVersion;

use crate::core::redact::Secrets;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Settings of the engine runner. Cheap to clone (shared inside).
#[derive(Debug, Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    binary: PathBuf,
    timeout: Duration,
    grace: Duration,
    lock_timeout: Duration,
    env: BTreeMap<String, String>,
    /// Names of `env` (and of a request's extra env) whose values are secrets besides those
    /// whose name says so.
    secret_env: Vec<String>,
    plugin_cache_dir: Option<PathBuf>,
    temp_root: PathBuf,
    path: OsString,
    home: OsString,
    sandbox: SandboxMode,
    cli_config: CliConfig,
    max_plan_json: u64,
    /// The disk quota of a plan run's directories (`None`: none).
    disk_max: Option<u64>,
    /// What the checkouts of the runs alive held, each counted for all its runs at once.
    quota_counts: quota::SharedCounts,
    /// Where each run's cgroup is made (`None`: none).
    job_cgroups: Option<cgroup::JobCgroups>,
    version: tokio::sync::OnceCell<EngineVersion>,
}

impl Engine {
    /// Start building a runner for `binary` (a name on `PATH` or a path) whose private run
    /// directories live in `temp_root`.
    pub fn builder(binary: impl Into<PathBuf>, temp_root: impl Into<PathBuf>) -> EngineBuilder {
        EngineBuilder::new(binary.into(), temp_root.into())
    }

    /// How this runner confines the engine.
    pub fn sandbox(&self) -> &SandboxMode {
        &self.inner.sandbox
    }

    pub fn binary(&self) -> &Path {
        &self.inner.binary
    }

    /// The per-run cgroups this runner makes, if any.
    pub fn job_cgroups(&self) -> Option<&JobCgroups> {
        self.inner.job_cgroups.as_ref()
    }

    /// A new run's cgroup, when this runner makes them.
    fn run_cgroup(&self) -> Result<Option<cgroup::JobCgroup>, EngineError> {
        self.inner
            .job_cgroups
            .as_ref()
            .map(|c| c.create())
            .transpose()
            .map_err(|e| EngineError::Sandbox(format!("could not make the run's cgroup: {e}")))
    }

    pub fn temp_root(&self) -> &Path {
        &self.inner.temp_root
    }

    /// The secrets this runner always knows: the configured env values that are secrets.
    pub fn secrets(&self) -> Secrets {
        let mut s = Secrets::new();
        s.extend(self.secret_values(&self.inner.env));
        s
    }

    /// Whether the value of the environment variable `name` is a secret: its name says so
    /// (`core::redact::is_secret_name`) or the runner was told ([`EngineBuilder::secret_env`]).
    pub fn is_secret_env(&self, name: &str) -> bool {
        crate::core::redact::is_secret_name(name) || self.inner.secret_env.iter().any(|n| n == name)
    }

    /// The values of `env` that are secrets.
    pub(crate) fn secret_values(&self, env: &BTreeMap<String, String>) -> Vec<String> {
        env.iter()
            .filter(|(k, _)| self.is_secret_env(k))
            .map(|(_, v)| v.clone())
            .collect()
    }
}
