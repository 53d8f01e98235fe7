//! The engine runner: runs `tofu`/`terraform` init + plan + show (and apply of that same plan file)
//! in a private temp dir, with an explicit environment, a timeout and redacted output.
//!
//! - The child environment is built from scratch: `PATH`, `HOME`, `TF_IN_AUTOMATION=1`,
//!   `TF_INPUT=0`, `TF_PLUGIN_CACHE_DIR`, the configured `engine.env`, the per-call extra env,
//!   `TF_WORKSPACE` when asked, and on OpenTofu `TF_ENCRYPTION` for the plan file. Nothing is
//!   inherited (no `TF_CLI_ARGS*`, `TF_LOG*`, stray `TF_VAR_*`, tokens). argv only, stdin null.
//! - The binary plan file is written into a 0700 directory under the temp root, owned by a
//!   [`PlannedRun`] that deletes it when dropped (success, error, timeout, panic), and the temp
//!   root is wiped at service start ([`wipe_temp_root`]).
//! - Every child runs in its own process group. On timeout or cancellation it gets ONE SIGTERM
//!   (a graceful stop: state persisted, lock released), then after a grace period SIGKILL of the
//!   whole group.
//! - `init` is serialised per plugin cache dir (Terraform's cache is not concurrency-safe).
//! - Every process (version, init, plan, show, apply, and what they start) runs under a
//!   Landlock sandbox ([`SandboxMode`], [`crate::capabilities::sandbox`]): it may write only the
//!   run's worktree, its private directory (home, temp, plan file) and the plugin cache. A run
//!   that must be sandboxed on a kernel without Landlock is refused before anything starts.
//! - With [`CliConfig::Owned`] (the service) each run gets its own `HOME` and a CLI config written
//!   by planbot (`TF_CLI_CONFIG_FILE`, an explicit `provider_installation`), so neither a
//!   repository's implied local mirror (`terraform.d/plugins`) nor a `.terraformrc` is used.
//! - Every text that comes out (logs, errors, streamed apply lines) is scrubbed of the configured
//!   env values, the per-call secrets, the plan-encryption key and the plan's own secrets.

pub use crate::capabilities::sandbox::Profile as SandboxProfile;
use crate::capabilities::sandbox::{Policy, Support};
use crate::core::fingerprint::Fingerprint;
use crate::core::plan::{Plan, PlanParseError};
use crate::core::redact::{Scrubber, Secrets};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::OsString;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

/// Run directories under the temp root are named with this prefix; only they are ever wiped.
pub const RUN_DIR_PREFIX: &str = "planbot-run-";

/// At most this much of a step's output is kept in a log (head and tail; the middle is cut).
const LOG_HEAD_BYTES: usize = 512 * 1024;
const LOG_TAIL_BYTES: usize = 512 * 1024;

/// After the engine process exits, its output pipes get this long to drain.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(5);

/// Which engine a binary is (defined in core, where a plan document's engine is told apart too).
pub use crate::core::engine_kind::EngineKind;

/// The engine's name and version, e.g. "Terraform 1.11.4" (its `Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineVersion {
    pub name: EngineKind,
    pub version: String,
}

impl fmt::Display for EngineVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

impl EngineVersion {
    /// Parse `BIN version -json`. Terraform's output has `terraform_outdated`; OpenTofu's,
    /// which keeps the `terraform_version` key, has not. `binary` breaks the tie when the JSON
    /// says nothing (a binary named `tofu…` is OpenTofu).
    pub fn from_version_json(json: &[u8], binary: &Path) -> Option<EngineVersion> {
        let v: serde_json::Value = serde_json::from_slice(json).ok()?;
        let version = v.get("terraform_version")?.as_str()?.to_string();
        let named_tofu = binary
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("tofu"));
        let name = if !named_tofu && v.get("terraform_outdated").is_some() {
            EngineKind::Terraform
        } else {
            EngineKind::OpenTofu
        };
        Some(EngineVersion { name, version })
    }
}

/// A step of a run, as named in errors and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Version,
    Init,
    Plan,
    Show,
    Apply,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Version => "version",
            Step::Init => "init",
            Step::Plan => "plan",
            Step::Show => "show -json",
            Step::Apply => "apply",
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
}

impl EngineError {
    /// The redacted engine output that goes with the error, when there is one.
    pub fn log(&self) -> Option<&str> {
        match self {
            EngineError::Failed { log, .. }
            | EngineError::TimedOut { log, .. }
            | EngineError::Cancelled { log, .. }
            | EngineError::BadPlanJson { log, .. } => Some(log),
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
        }
        out
    }
}

/// Ask a running step to stop (the same graceful stop as a timeout). Cheap to clone.
#[derive(Debug, Clone)]
pub struct CancelHandle(Arc<watch::Sender<bool>>);

/// Given to a [`PlanRequest`]; fires when its [`CancelHandle`] cancels.
#[derive(Debug, Clone)]
pub struct CancelToken(watch::Receiver<bool>);

impl CancelHandle {
    pub fn new() -> (CancelHandle, CancelToken) {
        let (tx, rx) = watch::channel(false);
        (CancelHandle(Arc::new(tx)), CancelToken(rx))
    }

    pub fn cancel(&self) {
        let _ = self.0.send(true);
    }
}

impl CancelToken {
    fn is_cancelled(&self) -> bool {
        *self.0.borrow()
    }

    async fn cancelled(&mut self) {
        if self.0.wait_for(|c| *c).await.is_err() {
            // The handle is gone: nobody can cancel any more.
            std::future::pending::<()>().await;
        }
    }
}

/// What to plan, besides the directory.
#[derive(Debug, Clone, Default)]
pub struct PlanRequest {
    /// `-var-file=` arguments, relative to the root directory (no absolute paths, no `..`).
    pub var_files: Vec<PathBuf>,
    /// `-var-file=` arguments the local operator chose on the command line (`planbot plan
    /// --var-file`): absolute paths, anywhere. Never from a repository. Passed after
    /// `var_files`, so they win.
    pub operator_var_files: Vec<PathBuf>,
    /// `-var=NAME=VALUE` arguments (`planbot plan --var`), passed last, so they win. Their
    /// values are secret only as the engine marks them (a sensitive variable is scrubbed via
    /// the plan JSON), like the values of a var file.
    pub vars: Vec<(String, String)>,
    /// Selected with `TF_WORKSPACE` (letters, digits, `-`, `_`).
    pub workspace: Option<String>,
    /// Extra environment for this run only (secrets: scrubbed from all output).
    pub extra_env: BTreeMap<String, String>,
    /// Further secret strings to scrub from all output (tokens the caller knows).
    pub extra_secrets: Vec<String>,
    /// The checkout the root lives in: the sandbox lets the engine write there, and a root
    /// directory or var file that resolves outside it (a symbolic link) is refused. `None`:
    /// the root directory itself.
    pub worktree: Option<PathBuf>,
    /// Stops the run (SIGTERM, grace, SIGKILL) when cancelled.
    pub cancel: Option<CancelToken>,
    /// Told when each step starts and ends (`planbot plan`'s progress on stderr).
    pub progress: Option<mpsc::UnboundedSender<StepProgress>>,
}

/// A step of a plan run starting (`took` is `None`) or ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepProgress {
    pub step: Step,
    pub took: Option<Duration>,
}

/// How the plan file was protected at rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanEncryption {
    /// OpenTofu: encrypted with a random per-run key in `TF_ENCRYPTION` (plan target only).
    PerRunKey,
    /// `TF_ENCRYPTION` is set in the configured engine env: the operator's own setup applies.
    Configured,
    /// Terraform has no plan encryption: the 0700 directory is the only protection.
    Unsupported,
}

/// How engine processes are confined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxMode {
    /// Every process under Landlock with this profile.
    Landlock {
        profile: SandboxProfile,
        /// The kernel's Landlock ABI version.
        abi: i32,
        /// Further paths the engine may read (`[sandbox] read_paths`, a provider mirror).
        extra_read: Vec<PathBuf>,
        /// TCP ports it may connect to (strict profile only).
        connect_ports: Vec<u16>,
    },
    /// No sandbox (`planbot plan --no-sandbox`, or `[sandbox] required = false` where the
    /// kernel offers none). The reason is shown wherever a plan is.
    Off { reason: String },
    /// A sandbox is required and unavailable: every run is refused with this text.
    Refused { reason: String },
}

impl SandboxMode {
    /// The strict profile where the kernel offers Landlock; else refused (`required`) with
    /// `refusal`, or off with the kernel's reason.
    pub fn strict(support: Support, required: bool, refusal: impl FnOnce(&str) -> String) -> Self {
        Self::with_profile(SandboxProfile::Strict, support, required, refusal)
    }

    /// `profile` where the kernel offers Landlock, else refused or off as for [`Self::strict`].
    pub fn with_profile(
        profile: SandboxProfile,
        support: Support,
        required: bool,
        refusal: impl FnOnce(&str) -> String,
    ) -> Self {
        match support {
            Support::Landlock { abi } => SandboxMode::Landlock {
                profile,
                abi,
                extra_read: Vec::new(),
                connect_ports: vec![443],
            },
            Support::Unavailable { reason } if required => SandboxMode::Refused {
                reason: refusal(reason),
            },
            Support::Unavailable { reason } => SandboxMode::Off {
                reason: reason.to_string(),
            },
        }
    }

    /// The kernel support this mode runs with (what `doctor` and `--check` describe).
    pub fn describe(&self) -> String {
        match self {
            SandboxMode::Landlock {
                profile,
                abi,
                connect_ports,
                ..
            } => {
                let mut text = Support::Landlock { abi: *abi }.describe();
                if *profile == SandboxProfile::Strict && *abi >= 4 {
                    let ports: Vec<String> = connect_ports.iter().map(u16::to_string).collect();
                    text.push_str(&format!(" (TCP ports allowed: {})", ports.join(", ")));
                }
                text
            }
            SandboxMode::Off { reason } => format!("no sandbox: {reason}"),
            SandboxMode::Refused { reason } => reason.clone(),
        }
    }
}

/// Where the engine's CLI configuration (provider installation, credentials) comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CliConfig {
    /// The user's own (`~/.terraformrc`, `~/.tofurc`): local runs of the user's own code.
    #[default]
    User,
    /// Written by planbot for each run, with a private `HOME`: only the installation method
    /// below, never a repository's `terraform.d/plugins` or a committed `.terraformrc`.
    Owned {
        provider_mirror: Option<ProviderMirror>,
    },
}

/// The operator's provider mirror (`engine.provider_mirror`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderMirror {
    /// `network_mirror { url = ... }` (an `https://` URL).
    Network(String),
    /// `filesystem_mirror { path = ... }` (an absolute directory, readable in the sandbox).
    Filesystem(PathBuf),
}

/// The CLI configuration file of an owned run: providers come from the registry (`direct`) or
/// the operator's mirror, and from nowhere else.
pub fn cli_config_text(mirror: Option<&ProviderMirror>) -> String {
    let method = match mirror {
        None => "  direct {}\n".to_string(),
        Some(ProviderMirror::Network(url)) => {
            format!("  network_mirror {{\n    url = {}\n  }}\n", hcl_string(url))
        }
        Some(ProviderMirror::Filesystem(dir)) => format!(
            "  filesystem_mirror {{\n    path = {}\n  }}\n",
            hcl_string(&dir.to_string_lossy())
        ),
    };
    format!("# Written by planbot for this run only.\nprovider_installation {{\n{method}}}\n")
}

/// A quoted HCL string (JSON string escaping is valid HCL, and `${`/`%{` are escaped).
fn hcl_string(s: &str) -> String {
    serde_json::to_string(s)
        .unwrap_or_default()
        .replace("${", "$${")
        .replace("%{", "%%{")
}

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
    plugin_cache_dir: Option<PathBuf>,
    temp_root: PathBuf,
    path: OsString,
    home: OsString,
    sandbox: SandboxMode,
    cli_config: CliConfig,
    version: tokio::sync::OnceCell<EngineVersion>,
}

/// Builder of an [`Engine`].
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    binary: PathBuf,
    temp_root: PathBuf,
    timeout: Duration,
    grace: Duration,
    lock_timeout: Duration,
    env: BTreeMap<String, String>,
    plugin_cache_dir: Option<PathBuf>,
    path: Option<OsString>,
    home: Option<OsString>,
    sandbox: SandboxMode,
    cli_config: CliConfig,
}

impl EngineBuilder {
    /// How engine processes are confined. Default: the strict profile, required (every run
    /// refused on a kernel without Landlock).
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

    /// The configured `engine.env` (secrets: scrubbed from all output). `TF_LOG*` and
    /// `TF_CLI_ARGS*` are refused (dropped): they leak secrets or change what runs.
    pub fn env(mut self, env: BTreeMap<String, String>) -> Self {
        self.env = env;
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
        let binary = resolve_binary(&self.binary, &path)?;
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
                plugin_cache_dir: self.plugin_cache_dir,
                temp_root: self.temp_root,
                path,
                home: self
                    .home
                    .or_else(|| std::env::var_os("HOME"))
                    .unwrap_or_else(|| OsString::from("/")),
                sandbox: self.sandbox,
                cli_config: self.cli_config,
                version: tokio::sync::OnceCell::new(),
            }),
        })
    }
}

/// Keys never passed to the engine, whoever sets them.
fn forbidden_env_key(key: &str) -> bool {
    key.starts_with("TF_LOG") || key.starts_with("TF_CLI_ARGS")
}

/// `binary` itself when it holds a `/`, else the first executable `binary` on `path`.
fn resolve_binary(binary: &Path, path: &std::ffi::OsStr) -> Result<PathBuf, EngineError> {
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
                "`{}` is not on PATH (install OpenTofu, or set engine.binary to its path)",
                binary.display()
            ))
        })
}

/// The default engine: `tofu` on `PATH`, else `terraform`.
pub fn default_binary() -> Result<PathBuf, EngineError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    resolve_binary(Path::new("tofu"), &path)
        .or_else(|_| resolve_binary(Path::new("terraform"), &path))
        .map_err(|_| {
            EngineError::NotFound(
                "neither `tofu` nor `terraform` is on PATH (install OpenTofu, or pass --engine PATH)"
                    .to_string(),
            )
        })
}

/// Delete every run directory left in `temp_root` (by a crash) and make sure the root exists
/// with mode 0700. Only entries named `planbot-run-*` are touched. Returns how many were removed.
pub fn wipe_temp_root(temp_root: &Path) -> std::io::Result<usize> {
    ensure_private_dir(temp_root)?;
    let mut removed = 0;
    for entry in std::fs::read_dir(temp_root)? {
        let entry = entry?;
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(RUN_DIR_PREFIX)
        {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            // A plan file may sit in a dir made read-only by nobody but us; remove it anyway.
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
        removed += 1;
    }
    Ok(removed)
}

fn ensure_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// The `TF_ENCRYPTION` text for an OpenTofu run: a PBKDF2 key from a random per-run passphrase,
/// AES-GCM, applied to the plan target only (state is left as the repository configures it),
/// and enforced so the plan file is never written in clear.
pub fn plan_encryption_config(passphrase: &str) -> String {
    format!(
        r#"key_provider "pbkdf2" "planbot_run" {{
  passphrase    = "{passphrase}"
  key_length    = 32
  iterations    = 200000
  salt_length   = 32
  hash_function = "sha512"
}}

method "aes_gcm" "planbot_run" {{
  keys = key_provider.pbkdf2.planbot_run
}}

plan {{
  method   = method.aes_gcm.planbot_run
  enforced = true
}}
"#
    )
}

/// A random 256-bit passphrase, as 64 hex characters (no quoting issue in HCL).
fn random_passphrase() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
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

impl Engine {
    /// Start building a runner for `binary` (a name on `PATH` or a path) whose private run
    /// directories live in `temp_root`.
    pub fn builder(binary: impl Into<PathBuf>, temp_root: impl Into<PathBuf>) -> EngineBuilder {
        EngineBuilder {
            binary: binary.into(),
            temp_root: temp_root.into(),
            timeout: Duration::from_secs(30 * 60),
            grace: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(5 * 60),
            env: BTreeMap::new(),
            plugin_cache_dir: None,
            path: None,
            home: None,
            sandbox: SandboxMode::strict(Support::probe(), true, |reason| {
                format!("refusing to run the engine without a sandbox: {reason}")
            }),
            cli_config: CliConfig::User,
        }
    }

    /// How this runner confines the engine.
    pub fn sandbox(&self) -> &SandboxMode {
        &self.inner.sandbox
    }

    pub fn binary(&self) -> &Path {
        &self.inner.binary
    }

    pub fn temp_root(&self) -> &Path {
        &self.inner.temp_root
    }

    /// The secrets this runner always knows: the configured env values.
    pub fn secrets(&self) -> Secrets {
        let mut s = Secrets::new();
        s.extend(self.inner.env.values().cloned());
        s
    }

    /// `BIN version -json`, run once and remembered.
    pub async fn version(&self) -> Result<EngineVersion, EngineError> {
        self.inner
            .version
            .get_or_try_init(|| async {
                self.refuse_unsandboxed()?;
                let mut env = self.child_env(&BTreeMap::new(), None, None);
                env.insert("CHECKPOINT_DISABLE".into(), "1".into());
                let deadline = Instant::now() + Duration::from_secs(60).min(self.inner.timeout);
                let scrubber = self.secrets().scrubber();
                let confinement = self.confinement(None);
                let out = self
                    .run_step(
                        Step::Version,
                        &std::env::temp_dir(),
                        &["version".into(), "-json".into()],
                        &env,
                        Capture::Stdout,
                        deadline,
                        None,
                        &mut |_| {},
                        &scrubber,
                        confinement.as_ref(),
                    )
                    .await
                    .map_err(|e| e.into_engine_error(&RawLog::default(), &scrubber))?;
                EngineVersion::from_version_json(&out.stdout, &self.inner.binary).ok_or_else(|| {
                    EngineError::Failed {
                        step: Step::Version,
                        exit_code: Some(0),
                        log: format!(
                            "`{} version -json` printed no version: {}",
                            self.inner.binary.display(),
                            self.secrets().scrubber().scrub_bytes(&out.stdout)
                        ),
                    }
                })
            })
            .await
            .cloned()
    }

    /// `Err` when a sandbox is required and the kernel offers none: nothing may run.
    fn refuse_unsandboxed(&self) -> Result<(), EngineError> {
        match &self.inner.sandbox {
            SandboxMode::Refused { reason } => Err(EngineError::SandboxRefused(reason.clone())),
            _ => Ok(()),
        }
    }

    /// The sandbox of one run: the profile's base, the engine binary, the operator's extra
    /// read paths, and `run`'s own directories (worktree, private dirs, plugin cache). `None`
    /// when runs are not sandboxed.
    fn confinement(&self, run: Option<(&Path, &RunDirs)>) -> Option<Confinement> {
        let SandboxMode::Landlock {
            profile,
            abi,
            extra_read,
            connect_ports,
        } = &self.inner.sandbox
        else {
            return None;
        };
        let mut policy = Policy::base(*profile);
        policy.allow_exec(&self.inner.binary);
        for p in extra_read {
            policy.allow_read(p);
        }
        for port in connect_ports {
            policy.allow_port(*port);
        }
        if let Some((worktree, dirs)) = run {
            policy.allow_write(worktree);
            policy.allow_write(&dirs.out);
            policy.allow_write(&dirs.tmp);
            if let Some(home) = &dirs.home {
                policy.allow_write(home);
            }
            if let Some(file) = &dirs.cli_config_file {
                policy.allow_read(file);
            }
            if let Some(cache) = &self.inner.plugin_cache_dir {
                policy.allow_write(cache);
            }
        }
        Some(Confinement {
            policy,
            support: Support::Landlock { abi: *abi },
        })
    }

    /// The whole child environment (pure; see the module docs for what is in it and why).
    fn child_env(
        &self,
        extra: &BTreeMap<String, String>,
        workspace: Option<&str>,
        encryption: Option<&str>,
    ) -> BTreeMap<String, OsString> {
        let mut env: BTreeMap<String, OsString> = BTreeMap::new();
        env.insert("PATH".into(), self.inner.path.clone());
        env.insert("HOME".into(), self.inner.home.clone());
        env.insert("TF_IN_AUTOMATION".into(), "1".into());
        env.insert("TF_INPUT".into(), "0".into());
        if let Some(cache) = &self.inner.plugin_cache_dir {
            env.insert("TF_PLUGIN_CACHE_DIR".into(), cache.clone().into_os_string());
        }
        for (k, v) in self.inner.env.iter().chain(extra) {
            if !forbidden_env_key(k) {
                env.insert(k.clone(), v.into());
            }
        }
        if let Some(ws) = workspace {
            env.insert("TF_WORKSPACE".into(), ws.into());
        }
        if let Some(enc) = encryption {
            env.insert("TF_ENCRYPTION".into(), enc.into());
        }
        env
    }

    /// Run `init`, `plan -out` into a private dir, and `show -json` in `dir`.
    ///
    /// When `plan` fails, the plan file the engine still writes (an errored plan) is read with
    /// `show -json` to learn its secrets (sensitive variables, masked values), so that an error
    /// message quoting one (e.g. a precondition using `nonsensitive()`) is redacted too.
    pub async fn plan(&self, dir: &Path, req: &PlanRequest) -> Result<PlannedRun, EngineError> {
        let started = Instant::now();
        let deadline = started + self.inner.timeout;
        self.refuse_unsandboxed()?;
        validate_request(req)?;
        let dir = std::fs::canonicalize(dir).map_err(|e| {
            EngineError::InvalidRequest(format!("root directory {}: {e}", dir.display()))
        })?;
        let worktree = match &req.worktree {
            Some(w) => std::fs::canonicalize(w).map_err(|e| {
                EngineError::InvalidRequest(format!("worktree {}: {e}", w.display()))
            })?,
            None => dir.clone(),
        };
        contained(&dir, &worktree, &req.var_files)?;

        let mut secrets = self.secrets();
        secrets.extend(req.extra_env.values().cloned());
        secrets.extend(req.extra_secrets.iter().cloned());

        let version = self.version().await?;
        let (encryption, enc_text) = if self.inner.env.contains_key("TF_ENCRYPTION")
            || req.extra_env.contains_key("TF_ENCRYPTION")
        {
            (PlanEncryption::Configured, None)
        } else if version.name == EngineKind::OpenTofu {
            let pass = random_passphrase();
            secrets.add(pass.clone());
            (
                PlanEncryption::PerRunKey,
                Some(plan_encryption_config(&pass)),
            )
        } else {
            (PlanEncryption::Unsupported, None)
        };
        let mut env = self.child_env(
            &req.extra_env,
            req.workspace.as_deref(),
            enc_text.as_deref(),
        );

        // The private directory (0700) that holds the plan file; deleted when it drops.
        ensure_private_dir(&self.inner.temp_root).map_err(|e| {
            EngineError::Io(format!("temp root {}: {e}", self.inner.temp_root.display()))
        })?;
        let private = tempfile::Builder::new()
            .prefix(RUN_DIR_PREFIX)
            .tempdir_in(&self.inner.temp_root)
            .map_err(|e| EngineError::Io(format!("private run dir: {e}")))?;
        ensure_private_dir(private.path())
            .map_err(|e| EngineError::Io(format!("private run dir: {e}")))?;
        let dirs = RunDirs::create(private.path(), &self.inner.cli_config)
            .map_err(|e| EngineError::Io(format!("private run dir: {e}")))?;
        dirs.set_env(&mut env);
        let confinement = self.confinement(Some((&worktree, &dirs)));
        let plan_file = dirs.out.join("plan");

        let mut log = RawLog::default();
        let env_scrubber = secrets.scrubber();
        let step = |step: Step, args: Vec<OsString>, capture: Capture| {
            let env = &env;
            let dir = &dir;
            let cancel = req.cancel.clone();
            let scrubber = &env_scrubber;
            let confinement = confinement.as_ref();
            let progress = req.progress.clone();
            async move {
                let tell = |took| {
                    if let Some(p) = &progress {
                        let _ = p.send(StepProgress { step, took });
                    }
                };
                let started = Instant::now();
                tell(None);
                let out = self
                    .run_step(
                        step,
                        dir,
                        &args,
                        env,
                        capture,
                        deadline,
                        cancel,
                        &mut |_| {},
                        scrubber,
                        confinement,
                    )
                    .await;
                tell(Some(started.elapsed()));
                out
            }
        };

        // init (serialised per plugin cache dir)
        {
            let _guard = match &self.inner.plugin_cache_dir {
                Some(cache) => {
                    std::fs::create_dir_all(cache).map_err(|e| {
                        EngineError::Io(format!("plugin cache dir {}: {e}", cache.display()))
                    })?;
                    Some(init_lock(cache).lock_owned().await)
                }
                None => None,
            };
            let args = vec!["init".into(), "-input=false".into(), "-no-color".into()];
            match step(Step::Init, args, Capture::Log).await {
                Ok(o) => log.append(o.log),
                Err(e) => return Err(e.into_engine_error(&log, &env_scrubber)),
            }
        }

        // plan -out
        let mut args: Vec<OsString> = vec![
            "plan".into(),
            "-input=false".into(),
            "-no-color".into(),
            format!("-lock-timeout={}s", self.inner.lock_timeout.as_secs()).into(),
        ];
        let mut out_arg = OsString::from("-out=");
        out_arg.push(&plan_file);
        args.push(out_arg);
        for vf in req.var_files.iter().chain(&req.operator_var_files) {
            let mut a = OsString::from("-var-file=");
            a.push(vf);
            args.push(a);
        }
        for (name, value) in &req.vars {
            args.push(format!("-var={name}={value}").into());
        }
        let show_args: Vec<OsString> =
            vec!["show".into(), "-json".into(), plan_file.clone().into()];
        match step(Step::Plan, args, Capture::Log).await {
            Ok(o) => log.append(o.log),
            Err(e) => {
                // Learn the errored plan's secrets before showing its error.
                if matches!(
                    e,
                    StepError::Stopped {
                        how: StopHow::Exit(_),
                        ..
                    }
                ) && plan_file.exists()
                {
                    if let Ok(o) = step(Step::Show, show_args.clone(), Capture::Stdout).await {
                        if let Ok(p) = Plan::from_json(&o.stdout) {
                            secrets.merge(&Secrets::from_plan(&p));
                        }
                    }
                }
                return Err(e.into_engine_error(&log, &secrets.scrubber()));
            }
        }

        // show -json
        let shown = match step(Step::Show, show_args, Capture::Stdout).await {
            Ok(o) => {
                log.append(o.log);
                o.stdout
            }
            Err(e) => return Err(e.into_engine_error(&log, &env_scrubber)),
        };
        let plan = match Plan::from_json(&shown) {
            Ok(p) => p,
            Err(e) => {
                let error = match e {
                    PlanParseError::NotJson(m) | PlanParseError::NotAPlan(m) => m,
                };
                return Err(EngineError::BadPlanJson {
                    error: env_scrubber.scrub(&error).into_owned(),
                    log: log.render(&env_scrubber),
                });
            }
        };
        secrets.merge(&Secrets::from_plan(&plan));
        let scrubber = secrets.scrubber();
        let lock_file = std::fs::read(dir.join(".terraform.lock.hcl")).ok();
        Ok(PlannedRun {
            engine: self.clone(),
            dir,
            env,
            confinement,
            cancel: req.cancel.clone(),
            log: log.render(&scrubber),
            plan,
            plan_json: shown,
            plan_file,
            private,
            lock_file,
            version,
            encryption,
            secrets,
            scrubber,
            duration: started.elapsed(),
        })
    }

    /// Run one engine command to completion (or timeout / cancellation), its output captured.
    #[allow(clippy::too_many_arguments)]
    async fn run_step(
        &self,
        step: Step,
        dir: &Path,
        args: &[OsString],
        env: &BTreeMap<String, OsString>,
        capture: Capture,
        deadline: Instant,
        mut cancel: Option<CancelToken>,
        on_line: &mut (dyn FnMut(&str) + Send),
        scrubber: &Scrubber,
        confinement: Option<&Confinement>,
    ) -> Result<StepOutput, StepError> {
        if cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
            return Err(StepError::Stopped {
                step,
                how: StopHow::Cancelled,
                log: RawLog::default(),
            });
        }
        let mut cmd = Command::new(&self.inner.binary);
        cmd.args(args)
            .current_dir(dir)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(c) = confinement {
            c.policy
                .prepare(c.support)
                .map_err(|e| StepError::Other(EngineError::Sandbox(e.to_string())))?
                .install(&mut cmd);
        }
        let mut child = cmd.spawn().map_err(|e| {
            StepError::Other(match e.kind() {
                std::io::ErrorKind::NotFound => {
                    EngineError::NotFound(format!("{}: {e}", self.inner.binary.display()))
                }
                _ if confinement.is_some() && e.raw_os_error() == Some(libc::EPERM) => {
                    EngineError::Sandbox(format!(
                        "the kernel refused the Landlock ruleset for `{step}` ({e})"
                    ))
                }
                _ => EngineError::Io(format!("{} {step}: {e}", self.inner.binary.display())),
            })
        })?;
        let pgid = child.id().map(|id| id as libc::pid_t);
        let mut group = GroupGuard { pgid, armed: true };

        let (tx, mut rx) = mpsc::unbounded_channel::<Line>();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let mut raw_stdout = Vec::new();
        let stdout_task = match capture {
            Capture::Log => {
                tokio::spawn(read_lines(stdout, tx.clone()));
                None
            }
            Capture::Stdout => Some(tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut buf = Vec::new();
                let mut s = stdout;
                let _ = s.read_to_end(&mut buf).await;
                buf
            })),
        };
        tokio::spawn(read_lines(stderr, tx));

        let mut log = RawLog::default();
        let mut exit: Option<std::process::ExitStatus> = None;
        let mut stop: Option<StopReason> = None;
        let mut term_sent_at: Option<Instant> = None;
        let mut killed = false;
        let mut lines_open = true;
        let mut drain_until: Option<Instant> = None;
        loop {
            let kill_at = term_sent_at.map(|t| t + self.inner.grace);
            let wake = match (exit, kill_at, drain_until) {
                (Some(_), _, Some(d)) => d,
                (None, Some(k), _) if !killed => k,
                (None, _, _) if stop.is_none() => deadline,
                _ => Instant::now() + Duration::from_secs(3600),
            };
            tokio::select! {
                line = rx.recv(), if lines_open => match line {
                    Some(Line(text)) => {
                        on_line(&scrubber.scrub(&text));
                        log.push(text);
                    }
                    None => lines_open = false,
                },
                status = child.wait(), if exit.is_none() => {
                    let status = status.map_err(|e| StepError::Other(EngineError::Io(format!("{step}: {e}"))))?;
                    exit = Some(status);
                    drain_until = Some(Instant::now() + DRAIN_AFTER_EXIT);
                }
                _ = async { match cancel.as_mut() { Some(c) => c.cancelled().await, None => std::future::pending().await } }, if stop.is_none() && exit.is_none() => {
                    stop = Some(StopReason::Cancelled);
                    group.signal(libc::SIGTERM);
                    term_sent_at = Some(Instant::now());
                }
                _ = tokio::time::sleep_until(wake.into()) => {
                    if exit.is_some() {
                        // The engine exited but something in its group still holds the pipes.
                        group.signal(libc::SIGKILL);
                        break;
                    } else if term_sent_at.is_some() {
                        group.signal(libc::SIGKILL);
                        killed = true;
                    } else if stop.is_none() {
                        stop = Some(StopReason::TimedOut);
                        group.signal(libc::SIGTERM);
                        term_sent_at = Some(Instant::now());
                    }
                }
            }
            if exit.is_some() && !lines_open {
                break;
            }
        }
        group.armed = false;
        // Stragglers in the group (a provider plugin that outlived the engine) are not kept.
        group.signal_if_alive(libc::SIGKILL);
        if let Some(task) = stdout_task {
            raw_stdout = tokio::time::timeout(DRAIN_AFTER_EXIT, task)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
        }
        let status = exit.expect("loop ends after the exit");
        let how = match stop {
            Some(StopReason::TimedOut) => StopHow::TimedOut(self.inner.timeout),
            Some(StopReason::Cancelled) => StopHow::Cancelled,
            None if !status.success() => StopHow::Exit(status.code()),
            None => {
                return Ok(StepOutput {
                    log,
                    stdout: raw_stdout,
                })
            }
        };
        Err(StepError::Stopped { step, how, log })
    }
}

/// The sandbox of one run, ready to be applied to each of its processes.
#[derive(Debug, Clone)]
struct Confinement {
    policy: Policy,
    support: Support,
}

/// The directories of one run inside its private (0700) directory: the plan file's, the
/// temp dir (`TMPDIR`: providers' plugin sockets), and with an owned CLI config a private
/// `HOME` and the config file itself (read-only in the sandbox).
struct RunDirs {
    out: PathBuf,
    tmp: PathBuf,
    home: Option<PathBuf>,
    cli_config_file: Option<PathBuf>,
}

impl RunDirs {
    fn create(private: &Path, cli: &CliConfig) -> std::io::Result<RunDirs> {
        let sub = |name: &str| -> std::io::Result<PathBuf> {
            let d = private.join(name);
            ensure_private_dir(&d)?;
            Ok(d)
        };
        let (home, cli_config_file) = match cli {
            CliConfig::User => (None, None),
            CliConfig::Owned { provider_mirror } => {
                let file = private.join("cli.tfrc");
                std::fs::write(&file, cli_config_text(provider_mirror.as_ref()))?;
                (Some(sub("home")?), Some(file))
            }
        };
        Ok(RunDirs {
            out: sub("out")?,
            tmp: sub("tmp")?,
            home,
            cli_config_file,
        })
    }

    fn set_env(&self, env: &mut BTreeMap<String, OsString>) {
        env.insert("TMPDIR".into(), self.tmp.clone().into());
        env.insert("CHECKPOINT_DISABLE".into(), "1".into());
        if let Some(home) = &self.home {
            env.insert("HOME".into(), home.clone().into());
        }
        if let Some(file) = &self.cli_config_file {
            env.insert("TF_CLI_CONFIG_FILE".into(), file.clone().into());
        }
    }
}

/// Refuse a root directory or var file that resolves (through a symbolic link) outside the
/// worktree: the engine would run in, or read, a directory the repository does not own.
fn contained(dir: &Path, worktree: &Path, var_files: &[PathBuf]) -> Result<(), EngineError> {
    if !dir.starts_with(worktree) {
        return Err(EngineError::InvalidRequest(
            "the root directory resolves outside the repository checkout (through a symbolic link): refused".into(),
        ));
    }
    for vf in var_files {
        if let Ok(real) = std::fs::canonicalize(dir.join(vf)) {
            if !real.starts_with(worktree) {
                return Err(EngineError::InvalidRequest(format!(
                    "var file {:?} resolves outside the repository checkout (through a symbolic link): refused",
                    vf
                )));
            }
        }
    }
    Ok(())
}

fn validate_request(req: &PlanRequest) -> Result<(), EngineError> {
    for vf in &req.var_files {
        let escapes = vf.is_absolute()
            || vf
                .components()
                .any(|c| matches!(c, Component::ParentDir | Component::RootDir));
        if escapes || vf.as_os_str().is_empty() {
            return Err(EngineError::InvalidRequest(format!(
                "var file {:?} must be a relative path inside the root (no `..`)",
                vf
            )));
        }
    }
    for vf in &req.operator_var_files {
        if !vf.is_absolute() {
            return Err(EngineError::InvalidRequest(format!(
                "operator var file {vf:?} must be an absolute path"
            )));
        }
    }
    for (name, _) in &req.vars {
        if !is_variable_name(name) {
            return Err(EngineError::InvalidRequest(format!(
                "variable name {name:?}: use letters, digits, `-` and `_`, starting with a letter or `_`"
            )));
        }
    }
    if let Some(ws) = &req.workspace {
        let ok = !ws.is_empty()
            && ws.len() <= 90
            && ws
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(EngineError::InvalidRequest(format!(
                "workspace {ws:?}: use letters, digits, `-` and `_` only"
            )));
        }
    }
    for k in req.extra_env.keys() {
        if forbidden_env_key(k) {
            return Err(EngineError::InvalidRequest(format!(
                "environment variable {k} is never passed to the engine"
            )));
        }
    }
    Ok(())
}

/// An HCL identifier as a variable name: a letter or `_`, then letters, digits, `-`, `_`.
pub fn is_variable_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// How a step ended without success, its raw log kept until the secrets are known.
enum StepError {
    Stopped {
        step: Step,
        how: StopHow,
        log: RawLog,
    },
    Other(EngineError),
}

enum StopHow {
    Exit(Option<i32>),
    TimedOut(Duration),
    Cancelled,
}

impl StepError {
    /// The error callers see: `before` (earlier steps' output) and this step's output,
    /// redacted with `scrubber`.
    fn into_engine_error(self, before: &RawLog, scrubber: &Scrubber) -> EngineError {
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
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Capture {
    /// stdout and stderr both go to the log, line by line.
    Log,
    /// stdout is the result (kept raw, not logged); stderr goes to the log.
    Stdout,
}

#[derive(Debug, Clone, Copy)]
enum StopReason {
    TimedOut,
    Cancelled,
}

struct StepOutput {
    log: RawLog,
    stdout: Vec<u8>,
}

struct Line(String);

async fn read_lines<R: AsyncRead + Unpin>(r: R, tx: mpsc::UnboundedSender<Line>) {
    let mut reader = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
                if tx
                    .send(Line(String::from_utf8_lossy(&buf).into_owned()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
}

/// Unredacted output lines kept in memory until the secrets are known; head and tail only.
#[derive(Debug, Default)]
struct RawLog {
    head: Vec<String>,
    head_bytes: usize,
    tail: VecDeque<String>,
    tail_bytes: usize,
    cut_lines: usize,
}

impl RawLog {
    fn push(&mut self, line: String) {
        if self.tail.is_empty() && self.head_bytes + line.len() <= LOG_HEAD_BYTES {
            self.head_bytes += line.len() + 1;
            self.head.push(line);
            return;
        }
        self.tail_bytes += line.len() + 1;
        self.tail.push_back(line);
        while self.tail_bytes > LOG_TAIL_BYTES && self.tail.len() > 1 {
            if let Some(l) = self.tail.pop_front() {
                self.tail_bytes -= l.len() + 1;
                self.cut_lines += 1;
            }
        }
    }

    fn append_ref(&mut self, other: &RawLog) {
        for l in &other.head {
            self.push(l.clone());
        }
        if other.cut_lines > 0 {
            self.push(format!("(… {} lines left out …)", other.cut_lines));
        }
        for l in &other.tail {
            self.push(l.clone());
        }
    }

    fn append(&mut self, other: RawLog) {
        for l in other.head {
            self.push(l);
        }
        if other.cut_lines > 0 {
            self.push(format!("(… {} lines left out …)", other.cut_lines));
        }
        for l in other.tail {
            self.push(l);
        }
    }

    fn render(&self, scrubber: &Scrubber) -> String {
        let mut out = String::new();
        for l in &self.head {
            out.push_str(l);
            out.push('\n');
        }
        if self.cut_lines > 0 {
            out.push_str(&format!("(… {} lines left out …)\n", self.cut_lines));
        }
        for l in &self.tail {
            out.push_str(l);
            out.push('\n');
        }
        scrubber.scrub(&out).into_owned()
    }
}

/// Signals the engine's process group; kills it if a run is abandoned (future dropped, panic).
struct GroupGuard {
    pgid: Option<libc::pid_t>,
    armed: bool,
}

impl GroupGuard {
    fn signal(&self, sig: libc::c_int) {
        if let Some(pgid) = self.pgid.filter(|p| *p > 1) {
            // SAFETY: killpg has no memory-safety preconditions; a stale group yields ESRCH.
            unsafe {
                libc::killpg(pgid, sig);
            }
        }
    }

    /// Like `signal`, for a group whose leader may be gone (stragglers only).
    fn signal_if_alive(&self, sig: libc::c_int) {
        self.signal(sig);
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            self.signal(libc::SIGKILL);
        }
    }
}

/// A finished plan: the parsed plan, its JSON, the redacted log, and the private directory
/// holding the binary plan file (deleted when this is dropped, or after [`PlannedRun::apply`]).
pub struct PlannedRun {
    engine: Engine,
    dir: PathBuf,
    env: BTreeMap<String, OsString>,
    confinement: Option<Confinement>,
    cancel: Option<CancelToken>,
    log: String,
    plan: Plan,
    plan_json: Vec<u8>,
    plan_file: PathBuf,
    private: tempfile::TempDir,
    lock_file: Option<Vec<u8>>,
    version: EngineVersion,
    encryption: PlanEncryption,
    secrets: Secrets,
    scrubber: Scrubber,
    duration: Duration,
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

    /// The plan's fingerprint, bound to the provider lock file.
    pub fn fingerprint(&self, key: &[u8]) -> Fingerprint {
        Fingerprint::of_with_lock(&self.plan, key, self.lock_file.as_deref())
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
        args.push(self.plan_file.clone().into_os_string());
        let result = self
            .engine
            .run_step(
                Step::Apply,
                &self.dir,
                &args,
                &self.env,
                Capture::Log,
                started + inner.timeout,
                self.cancel.clone(),
                &mut on_line,
                &self.scrubber,
                self.confinement.as_ref(),
            )
            .await;
        let out = result.map_err(|e| e.into_engine_error(&RawLog::default(), &self.scrubber))?;
        let log = out.log.render(&self.scrubber);
        drop(self.private);
        Ok(ApplyOutcome {
            log,
            duration: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine_with(env: &[(&str, &str)]) -> Engine {
        Engine::builder("/bin/sh", "/nonexistent-temp-root")
            .env(
                env.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
            .plugin_cache_dir("/var/cache/plugins")
            .path_env("/usr/bin:/bin")
            .home("/home/planbot")
            .build()
            .unwrap()
    }

    #[test]
    fn the_child_environment_is_explicit() {
        let e = engine_with(&[
            ("TF_VAR_proxmox_api_token", "pve-token-secret"),
            ("TF_LOG", "trace"),
            ("TF_CLI_ARGS_plan", "-refresh=false"),
        ]);
        let extra: BTreeMap<String, String> =
            [("TF_VAR_extra".to_string(), "x".to_string())].into();
        let env = e.child_env(&extra, Some("staging"), None);
        let keys: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            vec![
                "HOME",
                "PATH",
                "TF_INPUT",
                "TF_IN_AUTOMATION",
                "TF_PLUGIN_CACHE_DIR",
                "TF_VAR_extra",
                "TF_VAR_proxmox_api_token",
                "TF_WORKSPACE"
            ]
        );
        assert_eq!(env["TF_IN_AUTOMATION"], "1");
        assert_eq!(env["TF_INPUT"], "0");
        assert_eq!(env["PATH"], "/usr/bin:/bin");
        assert_eq!(env["TF_WORKSPACE"], "staging");
        assert!(e.secrets().iter().any(|s| s == "pve-token-secret"));
    }

    #[test]
    fn opentofu_plan_encryption_lands_in_tf_encryption() {
        let pass = random_passphrase();
        assert_eq!(pass.len(), 64);
        assert_ne!(pass, random_passphrase(), "a new key per run");
        let text = plan_encryption_config(&pass);
        assert!(text.contains(&format!("passphrase    = \"{pass}\"")));
        assert!(text.contains(r#"key_provider "pbkdf2" "planbot_run""#));
        assert!(text.contains(r#"method "aes_gcm" "planbot_run""#));
        assert!(text.contains("keys = key_provider.pbkdf2.planbot_run"));
        assert!(
            text.contains("plan {\n  method   = method.aes_gcm.planbot_run\n  enforced = true\n}")
        );
        // Only the plan target: state stays as the repository configures it.
        assert!(!text.contains("state {"));
        // OpenTofu's minimum: 16 characters of passphrase, 200000 iterations.
        assert!(text.contains("iterations    = 200000"));
        let e = engine_with(&[]);
        let env = e.child_env(&BTreeMap::new(), None, Some(&text));
        assert_eq!(env["TF_ENCRYPTION"], OsString::from(text));
    }

    #[test]
    fn tells_opentofu_from_terraform() {
        let tf = br#"{"terraform_version":"1.11.4","platform":"linux_amd64","provider_selections":{},"terraform_outdated":false}"#;
        let tofu =
            br#"{"terraform_version":"1.10.6","platform":"linux_amd64","provider_selections":{}}"#;
        let v = EngineVersion::from_version_json(tf, Path::new("/usr/bin/terraform")).unwrap();
        assert_eq!(v.to_string(), "Terraform 1.11.4");
        let v = EngineVersion::from_version_json(tofu, Path::new("/usr/bin/tofu")).unwrap();
        assert_eq!(v.to_string(), "OpenTofu 1.10.6");
        assert!(EngineVersion::from_version_json(b"{}", Path::new("tofu")).is_none());
    }

    #[test]
    fn refuses_var_files_and_workspaces_that_escape() {
        for bad in ["/etc/shadow", "../secrets.tfvars", "a/../../b", ""] {
            let req = PlanRequest {
                var_files: vec![PathBuf::from(bad)],
                ..Default::default()
            };
            assert!(validate_request(&req).is_err(), "{bad}");
        }
        let ok = PlanRequest {
            var_files: vec![PathBuf::from("env/prod.tfvars")],
            workspace: Some("prod-1".into()),
            ..Default::default()
        };
        assert!(validate_request(&ok).is_ok());
        let bad_ws = PlanRequest {
            workspace: Some("prod; rm -rf".into()),
            ..Default::default()
        };
        assert!(validate_request(&bad_ws).is_err());
    }

    #[test]
    fn command_line_vars_need_a_variable_name_and_operator_var_files_an_absolute_path() {
        for bad in ["", "1vm", "vms=x", "a b", "-x", "name;rm"] {
            let req = PlanRequest {
                vars: vec![(bad.to_string(), "v".to_string())],
                ..Default::default()
            };
            assert!(validate_request(&req).is_err(), "{bad:?}");
        }
        let ok = PlanRequest {
            vars: vec![
                ("vm_count".to_string(), "a=b; $(x)".to_string()),
                ("_x-1".to_string(), String::new()),
            ],
            operator_var_files: vec![PathBuf::from("/home/me/prod.tfvars")],
            ..Default::default()
        };
        assert!(validate_request(&ok).is_ok());
        let relative = PlanRequest {
            operator_var_files: vec![PathBuf::from("prod.tfvars")],
            ..Default::default()
        };
        assert!(validate_request(&relative).is_err());
    }

    #[test]
    fn wipes_only_run_dirs() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("planbot-run-abc")).unwrap();
        std::fs::write(root.path().join("planbot-run-abc/plan"), b"x").unwrap();
        std::fs::write(root.path().join("keep-me"), b"y").unwrap();
        assert_eq!(wipe_temp_root(root.path()).unwrap(), 1);
        assert!(root.path().join("keep-me").exists());
        assert!(!root.path().join("planbot-run-abc").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(root.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn long_logs_keep_head_and_tail() {
        let mut log = RawLog::default();
        for i in 0..200_000 {
            log.push(format!("line {i:08}"));
        }
        let text = log.render(&Scrubber::none());
        assert!(text.starts_with("line 00000000\n"));
        assert!(text.ends_with("line 00199999\n"));
        assert!(text.contains("lines left out"));
        assert!(text.len() < LOG_HEAD_BYTES + LOG_TAIL_BYTES + 100);
    }
}
