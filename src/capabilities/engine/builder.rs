//! Building an [`Engine`]: its settings (timeouts, env, plugin cache, sandbox, CLI config) and
//! the engine binary, resolved on `PATH` ([`default_binary`]: `tofu`, else `terraform`).

use super::cli_config::CliConfig;
use super::env::forbidden_env_key;
use super::sandbox::SandboxMode;
use super::sandbox::Support;
use super::{Engine, EngineError, Inner};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Builder of an [`Engine`].
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    binary: PathBuf,
    temp_root: PathBuf,
    timeout: Duration,
    grace: Duration,
    lock_timeout: Duration,
    env: BTreeMap<String, String>,
    secret_env: Vec<String>,
    plugin_cache_dir: Option<PathBuf>,
    path: Option<OsString>,
    home: Option<OsString>,
    sandbox: SandboxMode,
    cli_config: CliConfig,
    max_plan_json: u64,
    disk_max: Option<u64>,
    job_cgroups: Option<super::cgroup::JobCgroups>,
    /// How to name another engine, in the error of one not found (`set engine.binary to its
    /// path`, or the CLI's `--engine` flag).
    not_found_hint: String,
}

/// The service's way to name an engine, in the error of one not found.
pub const CONFIG_HINT: &str = "set engine.binary to its path";

/// The most of a `show -json` document planbot accepts by default: 32 MiB. The 10,000-resource
/// benchmark plan is 12 MiB; a real 2,000-resource document with its state and configuration
/// about 2 MB.
pub const DEFAULT_MAX_PLAN_JSON: u64 = 32 * 1024 * 1024;

impl EngineBuilder {
    /// The defaults for `binary` (see [`Engine::builder`]).
    pub(super) fn new(binary: PathBuf, temp_root: PathBuf) -> EngineBuilder {
        EngineBuilder {
            binary,
            temp_root,
            timeout: Duration::from_secs(30 * 60),
            grace: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(5 * 60),
            env: BTreeMap::new(),
            secret_env: Vec::new(),
            plugin_cache_dir: None,
            path: None,
            home: None,
            sandbox: SandboxMode::strict(Support::probe(), true, |reason| {
                format!("refusing to run the engine without a sandbox: {reason}")
            }),
            cli_config: CliConfig::User,
            max_plan_json: DEFAULT_MAX_PLAN_JSON,
            disk_max: None,
            job_cgroups: None,
            not_found_hint: CONFIG_HINT.to_string(),
        }
    }

    /// How the user names another engine, said when this one is not found (default
    /// [`CONFIG_HINT`]; the CLI says `pass its path with --engine`).
    pub fn not_found_hint(mut self, hint: impl Into<String>) -> Self {
        self.not_found_hint = hint.into();
        self
    }

    /// The most bytes of `show -json` accepted; a plan that prints more fails with
    /// [`EngineError::OutputTooLarge`]. Default [`DEFAULT_MAX_PLAN_JSON`].
    pub fn max_plan_json(mut self, bytes: u64) -> Self {
        self.max_plan_json = bytes;
        self
    }

    /// The most a plan run's directories (its checkout, plan-file dir and plugin cache) may
    /// hold together, checked while each step runs; past it the engine is killed and the run
    /// fails with [`EngineError::OverQuota`]. Default: no quota.
    pub fn disk_max(mut self, bytes: Option<u64>) -> Self {
        self.disk_max = bytes;
        self
    }

    /// How engine processes are confined. Default: the strict profile, required (every run
    /// refused on a kernel without Landlock).
    /// Run all engine processes of each run in a cgroup of their own, made and capped as
    /// `cgroups` says (see [`super::JobCgroups`]). Default: none.
    pub fn job_cgroups(mut self, cgroups: Option<super::cgroup::JobCgroups>) -> Self {
        self.job_cgroups = cgroups;
        self
    }

    pub fn sandbox(mut self, mode: SandboxMode) -> Self {
        self.sandbox = mode;
        self
    }

    /// Where the engine's CLI configuration comes from. Default: the user's own.
    pub fn cli_config(mut self, config: CliConfig) -> Self {
        self.cli_config = config;
        self
    }

    /// Whole-run timeout (init + plan + show; an apply gets its own). Default 30 minutes.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// Time between the SIGTERM and the SIGKILL of the process group. Default 30 s.
    pub fn grace(mut self, d: Duration) -> Self {
        self.grace = d;
        self
    }

    /// `-lock-timeout` for plan and apply. Default 5 minutes.
    pub fn lock_timeout(mut self, d: Duration) -> Self {
        self.lock_timeout = d;
        self
    }

    /// The configured `engine.env`. `TF_LOG*` and `TF_CLI_ARGS*` are refused (dropped): they
    /// leak secrets or change what runs. A value whose name looks secret (or that
    /// [`EngineBuilder::secret_env`] names) is scrubbed from all output.
    pub fn env(mut self, env: BTreeMap<String, String>) -> Self {
        self.env = env;
        self
    }

    /// More variable names whose values are secrets (`engine.secret_env`), besides those whose
    /// name says so.
    pub fn secret_env(mut self, names: Vec<String>) -> Self {
        self.secret_env = names;
        self
    }

    /// `TF_PLUGIN_CACHE_DIR` (created when missing).
    pub fn plugin_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugin_cache_dir = Some(dir.into());
        self
    }

    /// `PATH` of the engine (default: this process's `PATH`).
    pub fn path_env(mut self, path: impl Into<OsString>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// `HOME` of the engine (default: this process's `HOME`).
    pub fn home(mut self, home: impl Into<OsString>) -> Self {
        self.home = Some(home.into());
        self
    }

    /// Resolve the binary (on `PATH` unless it is a path) and finish.
    pub fn build(self) -> Result<Engine, EngineError> {
        let path = self
            .path
            .or_else(|| std::env::var_os("PATH"))
            .unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
        let binary = resolve_binary(&self.binary, &path, &self.not_found_hint)?;
        let env = self
            .env
            .into_iter()
            .filter(|(k, _)| {
                let ok = !forbidden_env_key(k);
                if !ok {
                    tracing::warn!(key = %k, "engine.env key refused: it leaks secrets or changes what runs");
                }
                ok
            })
            .collect();
        Ok(Engine {
            inner: Arc::new(Inner {
                binary,
                timeout: self.timeout,
                grace: self.grace,
                lock_timeout: self.lock_timeout,
                env,
                secret_env: self.secret_env,
                plugin_cache_dir: self.plugin_cache_dir,
                temp_root: self.temp_root,
                path,
                home: self
                    .home
                    .or_else(|| std::env::var_os("HOME"))
                    .unwrap_or_else(|| OsString::from("/")),
                sandbox: self.sandbox,
                cli_config: self.cli_config,
                max_plan_json: self.max_plan_json,
                disk_max: self.disk_max,
                quota_counts: Default::default(),
                job_cgroups: self.job_cgroups,
                version: tokio::sync::OnceCell::new(),
            }),
        })
    }
}

/// `binary` itself when it holds a `/`, else the first executable `binary` on `path`.
fn resolve_binary(
    binary: &Path,
    path: &std::ffi::OsStr,
    hint: &str,
) -> Result<PathBuf, EngineError> {
    use std::os::unix::fs::PermissionsExt;
    let is_exec = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if binary.components().count() > 1 || binary.is_absolute() {
        return if is_exec(binary) {
            Ok(binary.to_path_buf())
        } else {
            Err(EngineError::NotFound(format!(
                "{} is not an executable file",
                binary.display()
            )))
        };
    }
    std::env::split_paths(path)
        .map(|d| d.join(binary))
        .find(|p| is_exec(p))
        .ok_or_else(|| {
            EngineError::NotFound(format!(
                "`{}` is not on PATH (install OpenTofu, or {hint})",
                binary.display()
            ))
        })
}

/// The default engine: `tofu` on `PATH`, else `terraform`; `hint` says how to name another
/// when neither is there ([`CONFIG_HINT`] for the service).
pub fn default_binary(hint: &str) -> Result<PathBuf, EngineError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    resolve_binary(Path::new("tofu"), &path, hint)
        .or_else(|_| resolve_binary(Path::new("terraform"), &path, hint))
        .map_err(|_| {
            EngineError::NotFound(format!(
                "neither `tofu` nor `terraform` is on PATH (install OpenTofu, or {hint})"
            ))
        })
}

/// The engine of the service's config: `engine.binary` when set, else [`default_binary`].
pub fn configured_binary(binary: Option<&str>) -> Result<PathBuf, EngineError> {
    match binary {
        Some(b) => Ok(PathBuf::from(b)),
        None => default_binary(CONFIG_HINT),
    }
}
