//! Service configuration (docs/configuration.md): TOML + `PLANBOT_<SECTION>_<KEY>` env overrides + `<key>_file` secrets.
//!
//! Pure: the caller hands in the file text, the environment and a file reader, so tests can
//! drive every path without touching the process environment.

use crate::core::policy::{self, PolicySetSpec};
use crate::core::store_tls::StoreTls;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use toml::Value;

/// A secret string: never printed (`Debug`/`Display` show `(set)`), compared in constant time,
/// and wiped from memory when dropped (`secrecy`'s [`SecretString`] zeroizes its buffer).
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(SecretString);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(SecretString::from(s.into()))
    }
    /// The secret itself, for the few places that must use it (HTTP auth, HMAC keys, child env).
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        use subtle::ConstantTimeEq;
        self.expose()
            .as_bytes()
            .ct_eq(other.expose().as_bytes())
            .into()
    }
}

impl Eq for Secret {}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(set)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(set)")
    }
}

/// One entry of `gitlab.projects`: a numeric id or a `group/project` path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectRef {
    Id(u64),
    Path(String),
}

impl fmt::Display for ProjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProjectRef::Id(id) => write!(f, "{id}"),
            ProjectRef::Path(p) => f.write_str(p),
        }
    }
}

/// The allowlist of projects; everything else is ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist(pub Vec<ProjectRef>);

impl Allowlist {
    /// Whether a project (known by id and/or path) is on the list. Paths compare case-insensitively.
    pub fn allows(&self, id: Option<u64>, path: Option<&str>) -> bool {
        self.0.iter().any(|p| match p {
            ProjectRef::Id(want) => id == Some(*want),
            ProjectRef::Path(want) => path.is_some_and(|p| p.eq_ignore_ascii_case(want)),
        })
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Base URL of planbot itself, for links to run pages (no trailing slash).
    pub public_url: Option<String>,
    /// Server secret keying the plan fingerprint (`core::fingerprint`).
    pub fingerprint_key: Secret,
    pub gitlab: GitlabConfig,
    pub engine: EngineConfig,
    pub apply: ApplyConfig,
    pub plan: PlanConfig,
    pub proxmox: ProxmoxConfig,
    pub sandbox: SandboxConfig,
    /// `[pages]` and `[gitlab.oauth]`: who may read `/runs`.
    pub pages: PagesConfig,
    /// `[metrics]`: who may read `/metrics`.
    pub metrics: MetricsConfig,
    /// `log_format` / `log_level`: how `serve` logs.
    pub log: LogConfig,
    /// `[store]`: where deliveries, jobs, runs and applies live.
    pub store: StoreConfig,
    /// `[state]`: GitLab-managed state, and the tokens each trust level reads or writes it with.
    pub state: StateConfig,
    /// `[modules]`: the tokens `init` fetches modules from the same GitLab with.
    pub modules: ModulesConfig,
    /// `[[policy_sets]]`: the operator's Rego policy sets (directories on planbot's host),
    /// checked on every repository's plans; a repository cannot switch them off.
    pub policy_sets: Vec<PolicySetSpec>,
}

/// A user name and token for the same GitLab (HTTP Basic auth: GitLab reads only the token,
/// the name is any non-empty word unless the token is a deploy token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitlabCredential {
    pub username: String,
    pub token: Secret,
}

/// `state.default`: what a root whose `.planbot.toml` entry says nothing about its state gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateDefault {
    /// The backend the root's code configures (the default).
    #[default]
    Own,
    /// The project's GitLab-managed state named after the root.
    Gitlab,
}

/// `[state]`, `[state.plan]`, `[state.apply]`: GitLab-managed state. MR plans read it with the
/// plan token (Developer: read only, `-lock=false`); the default branch's plans and applies
/// lock and write it with the apply token (Maintainer). Never the bot's own token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateConfig {
    pub default: StateDefault,
    pub plan: Option<GitlabCredential>,
    pub apply: Option<GitlabCredential>,
}

/// `[modules]`, `[modules.plan]`, `[modules.apply]`: read-only tokens `init` uses for modules
/// (git over HTTPS) and the module registry of the same GitLab, per trust level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModulesConfig {
    /// The projects modules come from (`group/project`): what `planbot doctor` checks the
    /// tokens can read.
    pub projects: Vec<String>,
    pub plan: Option<GitlabCredential>,
    pub apply: Option<GitlabCredential>,
}

/// `[store]`: the database planbot keeps its state in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// `store.url`; the default is `sqlite://<data_dir>/planbot.db`.
    pub url: StoreUrl,
    /// `store.password` (from `password_file`, usually): the PostgreSQL password.
    pub password: Option<Secret>,
    /// `store.ca_file`: the CA bundle (PEM) a PostgreSQL server's certificate must chain to
    /// (else the URL's `sslrootcert`, else the public web roots).
    pub ca_file: Option<PathBuf>,
    /// `store.lease` (PostgreSQL; default 30 s): how long a job stays a replica's without its
    /// heartbeat, so how long a dead replica's job waits before another replica takes it.
    pub lease: Duration,
}

impl StoreConfig {
    /// How planbot reaches a PostgreSQL store over TLS (`None` for SQLite); checked at load.
    pub fn tls(&self) -> Option<Result<StoreTls, String>> {
        match &self.url {
            StoreUrl::Sqlite(_) => None,
            StoreUrl::Postgres(u) => Some(StoreTls::from_url(u, self.ca_file.as_deref())),
        }
    }
}

/// Which database: an embedded SQLite file (one replica) or a PostgreSQL server (N replicas).
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite:///var/lib/planbot/planbot.db`: an absolute path.
    Sqlite(PathBuf),
    /// `postgres://user@host:5432/db?options` (also `postgresql://`), as libpq reads it.
    Postgres(String),
}

impl StoreUrl {
    /// Read a `store.url` value.
    pub fn parse(text: &str) -> Result<StoreUrl, String> {
        if let Some(path) = text.strip_prefix("sqlite://") {
            if !path.starts_with('/') {
                return Err(format!(
                    "`{text}`: a SQLite URL names an absolute path, e.g. sqlite:///var/lib/planbot/planbot.db"
                ));
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            let u = url::Url::parse(text).map_err(|e| format!("`{}`: {e}", mask_password(text)))?;
            if u.host_str().is_none_or(str::is_empty) {
                return Err(format!("`{}`: no host", mask_password(text)));
            }
            return Ok(StoreUrl::Postgres(text.to_string()));
        }
        Err(format!(
            "`{}`: expected sqlite:///path or postgres://user@host/db",
            mask_password(text)
        ))
    }

    /// A password written into the URL itself (better given as `store.password_file`).
    pub fn embedded_password(&self) -> Option<String> {
        match self {
            StoreUrl::Sqlite(_) => None,
            StoreUrl::Postgres(u) => url::Url::parse(u)
                .ok()
                .and_then(|u| u.password().map(|p| p.to_string()))
                .filter(|p| !p.is_empty()),
        }
    }
}

/// The URL with any password replaced by `***`.
fn mask_password(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => text.to_string(),
    }
}

/// Never shows a password.
impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Sqlite(p) => write!(f, "sqlite://{}", p.display()),
            StoreUrl::Postgres(u) => f.write_str(&mask_password(u)),
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

/// How `planbot serve` writes its log (on stderr).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    pub format: LogFormat,
    /// `log_level` (a `RUST_LOG`-style filter, e.g. `info` or `warn,planbot=debug`); `RUST_LOG`
    /// wins when set. `None`: `info`.
    pub level: Option<String>,
}

/// `log_format`: `text` (colours only on a terminal) or `json` (one object per line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// `pages.auth`: who may read the run pages (`/runs`, `/runs/{id}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagesAuth {
    /// Sign in with GitLab; a user sees the runs of projects they can see (Reporter or more).
    /// The default when `[gitlab.oauth]` is configured.
    Gitlab,
    /// Only clients on the loopback interface (the planbot host itself), and never a request
    /// relayed by a proxy. The default without `[gitlab.oauth]`.
    Loopback,
    /// Anyone who can reach planbot (private networks only; `serve --check` and doctor warn).
    None,
}

impl PagesAuth {
    /// Whether run-page links can go into notes and statuses (someone other than the planbot
    /// host can open them).
    pub fn links_are_readable(self) -> bool {
        self != PagesAuth::Loopback
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PagesAuth::Gitlab => "gitlab",
            PagesAuth::Loopback => "loopback",
            PagesAuth::None => "none",
        }
    }
}

/// `[gitlab.oauth]`: planbot registered as a GitLab application (scope `read_user`).
#[derive(Debug, Clone)]
pub struct OAuthConfig {
    pub client_id: String,
    pub client_secret: Secret,
}

/// `[pages]`.
#[derive(Debug, Clone)]
pub struct PagesConfig {
    pub auth: PagesAuth,
    pub oauth: Option<OAuthConfig>,
    /// How long a sign-in lasts (`pages.session_lifetime`, default 8 h).
    pub session_lifetime: Duration,
}

impl Default for PagesConfig {
    fn default() -> Self {
        PagesConfig {
            auth: PagesAuth::Loopback,
            oauth: None,
            session_lifetime: Duration::from_secs(8 * 3600),
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, Default)]
pub struct MetricsConfig {
    /// When set, `/metrics` answers only `Authorization: Bearer <token>`.
    pub token: Option<Secret>,
}

/// `[sandbox]`: how engine processes are confined (see `capabilities::sandbox`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Refuse to run the engine where the kernel offers no Landlock (default `true`).
    pub required: bool,
    /// `auto` (use Landlock when the kernel has it) or `off` (act as if it had none).
    pub landlock: LandlockSetting,
    /// TCP ports the engine may connect to, besides those of the Proxmox endpoints and the
    /// provider mirror (default `[443]`).
    pub connect_ports: Vec<u16>,
    /// Further paths the engine may read (a CA bundle elsewhere, a provider mirror).
    pub read_paths: Vec<PathBuf>,
    /// `auto` (own user, mount and PID namespaces for every engine process where the kernel
    /// allows them) or `off` (act as if it did not).
    pub namespaces: LandlockSetting,
    /// The memory one engine process may allocate, in bytes (default 4 GiB).
    pub memory_max: u64,
}

/// `sandbox.landlock` and `sandbox.namespaces`: use the kernel feature, or act as if it had none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockSetting {
    Auto,
    Off,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            required: true,
            landlock: LandlockSetting::Auto,
            connect_ports: vec![443],
            read_paths: Vec::new(),
            namespaces: LandlockSetting::Auto,
            memory_max: 4 << 30,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GitlabConfig {
    pub url: String,
    pub token: Secret,
    pub webhook_secret: Option<Secret>,
    pub signing_token: Option<Secret>,
    pub projects: Allowlist,
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub binary: String,
    pub timeout: Duration,
    pub lock_timeout: Duration,
    /// Time between SIGTERM and SIGKILL when the engine must stop.
    pub grace: Duration,
    /// The engine's environment. A value is a secret (scrubbed from all output, never printed)
    /// when [`EngineConfig::is_secret`] says so by its name.
    pub env: BTreeMap<String, Secret>,
    /// `[engine.plan] env`: added to `env` for MR plans (untrusted code: read-only credentials).
    pub plan_env: BTreeMap<String, Secret>,
    /// `[engine.apply] env`: added to `env` for plans and applies on the default branch.
    pub apply_env: BTreeMap<String, Secret>,
    /// `engine.provider_mirror`: an `https://` network mirror or an absolute directory
    /// (filesystem mirror) to install providers from instead of their registries.
    pub provider_mirror: Option<String>,
    /// `engine.max_plan_json_mib`: the most of a plan's `show -json` planbot accepts, in MiB.
    pub max_plan_json_mib: u64,
    /// `engine.secret_env`: more variables whose values are secrets, besides those whose name
    /// says so (`*PASS*`, `*TOKEN*`, `*SECRET*`, `*KEY*`, …: see `core::redact::is_secret_name`).
    pub secret_env: Vec<String>,
}

impl EngineConfig {
    /// Whether the value of the engine environment variable `name` is a secret: its name says
    /// so, or `engine.secret_env` lists it.
    pub fn is_secret(&self, name: &str) -> bool {
        crate::core::redact::is_secret_name(name) || self.secret_env.iter().any(|n| n == name)
    }
}

#[derive(Debug, Clone)]
pub struct ApplyConfig {
    pub job_name: String,
    pub open_issue_on_failure: bool,
}

#[derive(Debug, Clone)]
pub struct PlanConfig {
    pub max_concurrent_plans: usize,
}

/// One Proxmox API endpoint and its token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxmoxEndpoint {
    pub endpoint: Option<String>,
    pub api_token: Option<Secret>,
    pub insecure: bool,
    pub ca_file: Option<PathBuf>,
}

/// `[proxmox]` is the default; `[proxmox.plan]` / `[proxmox.apply]` override it per use
/// (a read-only token for plans, a privileged one for applies).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxmoxConfig {
    pub default: ProxmoxEndpoint,
    pub plan: Option<ProxmoxEndpoint>,
    pub apply: Option<ProxmoxEndpoint>,
    /// `[proxmox.apply] ssh_*`: how the bpg provider reaches the nodes over SSH (snippet
    /// uploads), given to the engine on the default branch's runs only.
    pub apply_ssh: Option<SshConfig>,
}

/// SSH credentials for the bpg provider (`PROXMOX_VE_SSH_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshConfig {
    pub username: String,
    /// The private key itself (from `ssh_private_key_file`, usually): a secret.
    pub private_key: Option<Secret>,
    /// An ssh-agent socket holding the key, instead of the key.
    pub agent_socket: Option<PathBuf>,
}

impl ProxmoxConfig {
    /// The endpoint for plans: `[proxmox.plan]` keys, falling back to `[proxmox]`.
    pub fn for_plan(&self) -> ProxmoxEndpoint {
        merge_endpoint(&self.default, self.plan.as_ref())
    }
    /// The endpoint for applies: `[proxmox.apply]` keys, falling back to `[proxmox]`.
    pub fn for_apply(&self) -> ProxmoxEndpoint {
        merge_endpoint(&self.default, self.apply.as_ref())
    }
}

fn merge_endpoint(base: &ProxmoxEndpoint, over: Option<&ProxmoxEndpoint>) -> ProxmoxEndpoint {
    let Some(o) = over else {
        return base.clone();
    };
    ProxmoxEndpoint {
        endpoint: o.endpoint.clone().or_else(|| base.endpoint.clone()),
        api_token: o.api_token.clone().or_else(|| base.api_token.clone()),
        insecure: o.insecure || base.insecure,
        ca_file: o.ca_file.clone().or_else(|| base.ca_file.clone()),
    }
}

/// Why a config was rejected; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("config is not valid TOML: {0}")]
    Syntax(String),
    #[error("unknown config key `{key}`{hint}")]
    UnknownKey { key: String, hint: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
    #[error("config key `{key}` is required: {hint}")]
    Missing { key: String, hint: String },
    #[error("config key `{key}` is given both directly and as `{key}_file`; keep one")]
    Both { key: String },
    #[error("config key `{key}_file`: cannot read {path}: {message}")]
    SecretFile {
        key: String,
        path: String,
        message: String,
    },
}

impl ConfigError {
    /// The dotted key the error is about (`None` for a syntax error).
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Syntax(_) => None,
            ConfigError::UnknownKey { key, .. }
            | ConfigError::Invalid { key, .. }
            | ConfigError::Missing { key, .. }
            | ConfigError::Both { key }
            | ConfigError::SecretFile { key, .. } => Some(key),
        }
    }
}

/// Where a config value came from, so an error can send the reader to the right place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The config file, at this line when it could be found.
    File { line: Option<usize> },
    /// A `PLANBOT_*` environment variable.
    Env(String),
    /// A secret file, named by a `<key>_file` setting (or `PLANBOT_..._FILE`) that came from `via`.
    SecretFile { path: String, via: Box<Origin> },
}

impl Origin {
    /// `planbot.toml, line 7` / `environment variable PLANBOT_GITLAB_TOKEN` / `secret file ... (named in ...)`.
    pub fn describe(&self, file: &str) -> String {
        match self {
            Origin::File { line: Some(n) } => format!("{file}, line {n}"),
            Origin::File { line: None } => file.to_string(),
            Origin::Env(var) => format!("environment variable {var}"),
            Origin::SecretFile { path, via } => {
                format!("secret file {path} (named in {})", via.describe(file))
            }
        }
    }
}

/// One problem of a config and where the offending value came from (`None`: not set at all,
/// or a default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub error: ConfigError,
    pub origin: Option<Origin>,
}

impl Problem {
    /// The problem and, on a second line, where to fix it.
    pub fn describe(&self, file: &str) -> String {
        let whence = match (&self.origin, &self.error) {
            (Some(o), _) => format!("from {}", o.describe(file)),
            (None, ConfigError::Missing { .. }) => {
                format!("not set in {file} nor in the environment")
            }
            (None, ConfigError::Syntax(_)) => format!("in {file}"),
            (None, _) => "the default value".to_string(),
        };
        format!(
            "{}
    {whence}",
            self.error
        )
    }
}

/// What [`Config::load_all`] found: every problem, and the config built with fallbacks in place
/// of the bad values (for checks that do not depend on them; never to run with).
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Option<Config>,
    pub problems: Vec<Problem>,
    origins: BTreeMap<String, Origin>,
}

impl Loaded {
    /// Where `key` came from (`None`: not set, the default applies).
    pub fn origin(&self, key: &str) -> Option<&Origin> {
        self.origins.get(key)
    }

    /// The config when there was no problem.
    pub fn into_result(self) -> Result<Config, Vec<Problem>> {
        match self.config {
            Some(c) if self.problems.is_empty() => Ok(c),
            _ => Err(self.problems),
        }
    }
}

/// The literal placeholder the example config and manifests ship: never a real value.
pub const PLACEHOLDER: &str = "change-me";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Int,
    Bool,
    StrOrIntList,
    Table,
}

/// Every key planbot knows: (dotted path, kind, secret?). `engine.env` is a free-form table.
const KEYS: &[(&str, Kind, bool)] = &[
    ("listen", Kind::Str, false),
    ("data_dir", Kind::Str, false),
    ("public_url", Kind::Str, false),
    ("log_format", Kind::Str, false),
    ("log_level", Kind::Str, false),
    ("fingerprint_key", Kind::Str, true),
    ("gitlab.url", Kind::Str, false),
    ("gitlab.token", Kind::Str, true),
    ("gitlab.webhook_secret", Kind::Str, true),
    ("gitlab.signing_token", Kind::Str, true),
    ("gitlab.projects", Kind::StrOrIntList, false),
    ("engine.binary", Kind::Str, false),
    ("engine.timeout", Kind::Str, false),
    ("engine.lock_timeout", Kind::Str, false),
    ("engine.grace", Kind::Str, false),
    ("engine.env", Kind::Table, true),
    ("engine.provider_mirror", Kind::Str, false),
    ("engine.max_plan_json_mib", Kind::Int, false),
    ("engine.plan.env", Kind::Table, true),
    ("engine.apply.env", Kind::Table, true),
    ("engine.secret_env", Kind::StrOrIntList, false),
    ("sandbox.required", Kind::Bool, false),
    ("sandbox.landlock", Kind::Str, false),
    ("sandbox.connect_ports", Kind::StrOrIntList, false),
    ("sandbox.read_paths", Kind::StrOrIntList, false),
    ("sandbox.namespaces", Kind::Str, false),
    ("sandbox.memory_max", Kind::Str, false),
    ("apply.job_name", Kind::Str, false),
    ("apply.open_issue_on_failure", Kind::Bool, false),
    ("plan.max_concurrent_plans", Kind::Int, false),
    ("proxmox.endpoint", Kind::Str, false),
    ("proxmox.api_token", Kind::Str, true),
    ("proxmox.insecure", Kind::Bool, false),
    ("proxmox.ca_file", Kind::Str, false),
    ("proxmox.plan.endpoint", Kind::Str, false),
    ("proxmox.plan.api_token", Kind::Str, true),
    ("proxmox.plan.insecure", Kind::Bool, false),
    ("proxmox.plan.ca_file", Kind::Str, false),
    ("proxmox.apply.endpoint", Kind::Str, false),
    ("proxmox.apply.api_token", Kind::Str, true),
    ("proxmox.apply.insecure", Kind::Bool, false),
    ("proxmox.apply.ca_file", Kind::Str, false),
    ("proxmox.apply.ssh_username", Kind::Str, false),
    ("proxmox.apply.ssh_private_key", Kind::Str, true),
    ("proxmox.apply.ssh_agent_socket", Kind::Str, false),
    ("gitlab.oauth.client_id", Kind::Str, false),
    ("gitlab.oauth.client_secret", Kind::Str, true),
    ("pages.auth", Kind::Str, false),
    ("pages.session_lifetime", Kind::Str, false),
    ("metrics.token", Kind::Str, true),
    ("store.url", Kind::Str, false),
    ("store.password", Kind::Str, true),
    ("store.ca_file", Kind::Str, false),
    ("store.lease", Kind::Str, false),
    ("state.default", Kind::Str, false),
    ("state.plan.username", Kind::Str, false),
    ("state.plan.token", Kind::Str, true),
    ("state.apply.username", Kind::Str, false),
    ("state.apply.token", Kind::Str, true),
    ("modules.projects", Kind::StrOrIntList, false),
    ("modules.plan.username", Kind::Str, false),
    ("modules.plan.token", Kind::Str, true),
    ("modules.apply.username", Kind::Str, false),
    ("modules.apply.token", Kind::Str, true),
];

/// One setting as the reference lists it, straight from the table the parser uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// Dotted key, e.g. `gitlab.token`.
    pub key: &'static str,
    /// The variable that overrides it (`PLANBOT_ENGINE_ENV_<NAME>` for a table).
    pub env: String,
    /// `string`, `integer`, `true/false`, `list`, or `table`.
    pub kind: &'static str,
    /// A secret: never printed, and can be given as `<key>_file` / `<env>_FILE`.
    pub secret: bool,
}

/// Every setting planbot knows, in the parser's order.
pub fn settings() -> Vec<Setting> {
    KEYS.iter()
        .map(|(key, kind, secret)| Setting {
            key,
            env: if *kind == Kind::Table {
                format!("{}_<NAME>", env_name(key))
            } else {
                env_name(key)
            },
            kind: match kind {
                Kind::Str => "string",
                Kind::Int => "integer",
                Kind::Bool => "true/false",
                Kind::StrOrIntList => "list",
                Kind::Table => "table",
            },
            secret: *secret,
        })
        .collect()
}

const SECTIONS: &[&str] = &[
    "gitlab",
    "engine",
    "apply",
    "plan",
    "proxmox",
    "proxmox.plan",
    "proxmox.apply",
    "engine.plan",
    "engine.apply",
    "sandbox",
    "gitlab.oauth",
    "pages",
    "metrics",
    "store",
    "state",
    "state.plan",
    "state.apply",
    "modules",
    "modules.plan",
    "modules.apply",
];

/// The free-form tables of engine environment variables.
const ENV_TABLES: &[&str] = &["engine.env", "engine.plan.env", "engine.apply.env"];

fn key_info(path: &str) -> Option<(Kind, bool)> {
    KEYS.iter()
        .find(|(k, _, _)| *k == path)
        .map(|(_, kind, secret)| (*kind, *secret))
}

/// The environment variable that overrides `path`: `gitlab.webhook_secret` → `PLANBOT_GITLAB_WEBHOOK_SECRET`.
pub fn env_name(path: &str) -> String {
    format!("PLANBOT_{}", path.replace('.', "_").to_ascii_uppercase())
}

impl Config {
    /// Parse `text` (the TOML file), apply `PLANBOT_*` overrides from `env`, read `*_file`
    /// secrets with `read_file`, and validate.
    /// The first problem only; see [`Config::load_all`] for every one and where it came from.
    pub fn load(
        text: &str,
        env: &[(String, String)],
        read_file: &dyn Fn(&str) -> Result<String, String>,
    ) -> Result<Config, ConfigError> {
        Config::load_all(text, env, read_file)
            .into_result()
            .map_err(|mut problems| problems.remove(0).error)
    }

    /// Like [`Config::load`], but goes on after a problem: every problem, each with where its
    /// value came from (file line, environment variable, secret file).
    pub fn load_all(
        text: &str,
        env: &[(String, String)],
        read_file: &dyn Fn(&str) -> Result<String, String>,
    ) -> Loaded {
        let root: toml::Table = match text.parse() {
            Ok(root) => root,
            Err(e) => {
                let e: toml::de::Error = e;
                let line = e
                    .span()
                    .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
                return Loaded {
                    config: None,
                    problems: vec![Problem {
                        error: ConfigError::Syntax(e.message().to_string()),
                        origin: Some(Origin::File { line }),
                    }],
                    origins: BTreeMap::new(),
                };
            }
        };
        let mut errors: Vec<(ConfigError, Option<Origin>)> = Vec::new();
        let mut flat: BTreeMap<String, Value> = BTreeMap::new();
        let mut unknown_keys = Vec::new();
        flatten("", root, &mut flat, &mut unknown_keys);
        errors.extend(unknown_keys.into_iter().map(|e| (e, None)));
        let mut origins: BTreeMap<String, Origin> = flat
            .keys()
            .map(|k| {
                (
                    k.clone(),
                    Origin::File {
                        line: line_of(text, k),
                    },
                )
            })
            .collect();
        for (i, line) in header_lines(text, POLICY_SETS).into_iter().enumerate() {
            origins.insert(
                format!("{POLICY_SETS}[{i}]"),
                Origin::File { line: Some(line) },
            );
        }
        for table in ENV_TABLES {
            if let Some(Value::Table(t)) = flat.get(*table) {
                for k in t.keys() {
                    let key = format!("{table}.{k}");
                    let line = line_of(text, &key).or_else(|| line_of(text, table));
                    origins.insert(key, Origin::File { line });
                }
            }
        }
        apply_env(env, &mut flat, &mut origins, &mut errors);
        resolve_files(&mut flat, env, read_file, &mut origins, &mut errors);
        check_values(&mut flat, &mut errors);
        let mut soft = Vec::new();
        let config = match build(flat, &mut soft) {
            Ok(c) => Some(c),
            Err(e) => {
                soft.push(e);
                None
            }
        };
        errors.extend(soft.into_iter().map(|e| (e, None)));
        let mut problems: Vec<Problem> = Vec::new();
        for (error, origin) in errors {
            let origin = origin.or_else(|| origin_of(&origins, &error));
            let problem = Problem { error, origin };
            if !problems.contains(&problem) {
                problems.push(problem);
            }
        }
        Loaded {
            config,
            problems,
            origins,
        }
    }

    /// The config as `--check` prints it: every key, secrets shown as `(set)`.
    ///
    /// Long on purpose: one line per key, in the order `--check` prints them; split by section
    /// it would only scatter one list over several functions.
    pub fn describe(&self) -> String {
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "(not set)".into());
        let sec = |o: &Option<Secret>| if o.is_some() { "(set)" } else { "(not set)" }.to_string();
        let mut out = String::new();
        let mut line = |k: &str, v: String| out.push_str(&format!("{k} = {v}\n"));
        line("listen", self.listen.to_string());
        line("data_dir", self.data_dir.display().to_string());
        line("public_url", opt(&self.public_url));
        line(
            "log_format",
            match self.log.format {
                LogFormat::Text => "text",
                LogFormat::Json => "json",
            }
            .into(),
        );
        line(
            "log_level",
            self.log
                .level
                .clone()
                .unwrap_or_else(|| "(not set: info, or RUST_LOG)".into()),
        );
        line("fingerprint_key", "(set)".into());
        line("gitlab.url", self.gitlab.url.clone());
        line("gitlab.token", "(set)".into());
        line("gitlab.webhook_secret", sec(&self.gitlab.webhook_secret));
        line("gitlab.signing_token", sec(&self.gitlab.signing_token));
        let projects: Vec<String> = self
            .gitlab
            .projects
            .0
            .iter()
            .map(|p| p.to_string())
            .collect();
        line("gitlab.projects", format!("{projects:?}"));
        line("engine.binary", self.engine.binary.clone());
        line(
            "engine.timeout",
            humantime::format_duration(self.engine.timeout).to_string(),
        );
        line(
            "engine.lock_timeout",
            humantime::format_duration(self.engine.lock_timeout).to_string(),
        );
        line(
            "engine.grace",
            humantime::format_duration(self.engine.grace).to_string(),
        );
        // A secret as `(set)`; a user name or an address as it is.
        for (name, table) in [
            ("engine.env", &self.engine.env),
            ("engine.plan.env", &self.engine.plan_env),
            ("engine.apply.env", &self.engine.apply_env),
        ] {
            let keys: Vec<String> = table
                .iter()
                .map(|(k, v)| {
                    if self.engine.is_secret(k) {
                        format!("{k} = (set)")
                    } else {
                        format!("{k} = {:?}", v.expose())
                    }
                })
                .collect();
            line(name, format!("{{ {} }}", keys.join(", ")));
        }
        line("engine.secret_env", format!("{:?}", self.engine.secret_env));
        line("engine.provider_mirror", opt(&self.engine.provider_mirror));
        line(
            "engine.max_plan_json_mib",
            self.engine.max_plan_json_mib.to_string(),
        );
        line("sandbox.required", self.sandbox.required.to_string());
        line(
            "sandbox.landlock",
            match self.sandbox.landlock {
                LandlockSetting::Auto => "auto",
                LandlockSetting::Off => "off",
            }
            .into(),
        );
        line(
            "sandbox.connect_ports",
            format!("{:?}", self.sandbox.connect_ports),
        );
        line(
            "sandbox.read_paths",
            format!("{:?}", self.sandbox.read_paths),
        );
        line(
            "sandbox.namespaces",
            match self.sandbox.namespaces {
                LandlockSetting::Auto => "auto",
                LandlockSetting::Off => "off",
            }
            .into(),
        );
        line(
            "sandbox.memory_max",
            format!("{} MiB", self.sandbox.memory_max >> 20),
        );
        line("apply.job_name", self.apply.job_name.clone());
        line(
            "apply.open_issue_on_failure",
            self.apply.open_issue_on_failure.to_string(),
        );
        line(
            "plan.max_concurrent_plans",
            self.plan.max_concurrent_plans.to_string(),
        );
        for (name, ep) in [
            ("proxmox.plan", self.proxmox.for_plan()),
            ("proxmox.apply", self.proxmox.for_apply()),
        ] {
            line(&format!("{name}.endpoint"), opt(&ep.endpoint));
            line(&format!("{name}.api_token"), sec(&ep.api_token));
            line(&format!("{name}.insecure"), ep.insecure.to_string());
            line(
                &format!("{name}.ca_file"),
                ep.ca_file
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "(not set)".into()),
            );
        }
        line("pages.auth", self.pages.auth.as_str().into());
        line(
            "pages.session_lifetime",
            humantime::format_duration(self.pages.session_lifetime).to_string(),
        );
        line(
            "gitlab.oauth.client_id",
            opt(&self.pages.oauth.as_ref().map(|o| o.client_id.clone())),
        );
        line(
            "gitlab.oauth.client_secret",
            sec(&self.pages.oauth.as_ref().map(|o| o.client_secret.clone())),
        );
        line("metrics.token", sec(&self.metrics.token));
        line("store.url", self.store.url.to_string());
        line("store.password", sec(&self.store.password));
        line(
            "store.ca_file",
            self.store
                .ca_file
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "(not set)".into()),
        );
        line(
            "store TLS",
            match self.store.tls() {
                None => "(SQLite: no network)".into(),
                Some(Ok(tls)) => tls.to_string(),
                Some(Err(e)) => format!("(invalid: {e})"),
            },
        );
        line(
            "store.lease",
            humantime::format_duration(self.store.lease).to_string(),
        );
        line(
            "state.default",
            match self.state.default {
                StateDefault::Own => "own",
                StateDefault::Gitlab => "gitlab",
            }
            .into(),
        );
        let cred = |c: &Option<GitlabCredential>| match c {
            Some(c) => (c.username.clone(), "(set)".to_string()),
            None => ("(not set)".to_string(), "(not set)".to_string()),
        };
        for (name, c) in [
            ("state.plan", &self.state.plan),
            ("state.apply", &self.state.apply),
        ] {
            let (user, token) = cred(c);
            line(&format!("{name}.username"), user);
            line(&format!("{name}.token"), token);
        }
        line("modules.projects", format!("{:?}", self.modules.projects));
        for (name, c) in [
            ("modules.plan", &self.modules.plan),
            ("modules.apply", &self.modules.apply),
        ] {
            let (user, token) = cred(c);
            line(&format!("{name}.username"), user);
            line(&format!("{name}.token"), token);
        }
        for set in &self.policy_sets {
            let owners: Vec<String> = set.owners.iter().map(|o| o.to_string()).collect();
            line(
                &format!("policy_sets.{}", set.name),
                format!(
                    "{{ path = {:?}, namespace = {:?}, owners = {owners:?}, roots = {:?} }}",
                    set.path, set.namespace, set.roots
                ),
            );
        }
        out
    }

    /// Every secret the config holds, for the scrubber (docs/security.md, "Secrets").
    pub fn secrets(&self) -> Vec<String> {
        let mut s = vec![
            self.fingerprint_key.expose().to_string(),
            self.gitlab.token.expose().to_string(),
        ];
        for o in [&self.gitlab.webhook_secret, &self.gitlab.signing_token]
            .into_iter()
            .flatten()
        {
            s.push(o.expose().to_string());
        }
        for table in [
            &self.engine.env,
            &self.engine.plan_env,
            &self.engine.apply_env,
        ] {
            s.extend(
                table
                    .iter()
                    .filter(|(k, _)| self.engine.is_secret(k))
                    .map(|(_, v)| v.expose().to_string()),
            );
        }
        let pve = [
            Some(&self.proxmox.default),
            self.proxmox.plan.as_ref(),
            self.proxmox.apply.as_ref(),
        ];
        if let Some(key) = self
            .proxmox
            .apply_ssh
            .as_ref()
            .and_then(|s| s.private_key.as_ref())
        {
            s.push(key.expose().to_string());
        }
        for ep in pve.into_iter().flatten() {
            if let Some(t) = &ep.api_token {
                s.push(t.expose().to_string());
                // `user@realm!id=uuid`: the uuid alone is the secret part too.
                if let Some((_, uuid)) = t.expose().rsplit_once('=') {
                    s.push(uuid.to_string());
                }
            }
        }
        if let Some(o) = &self.pages.oauth {
            s.push(o.client_secret.expose().to_string());
        }
        if let Some(t) = &self.metrics.token {
            s.push(t.expose().to_string());
        }
        if let Some(p) = &self.store.password {
            s.push(p.expose().to_string());
        }
        s.extend(self.store.url.embedded_password());
        for c in [
            &self.state.plan,
            &self.state.apply,
            &self.modules.plan,
            &self.modules.apply,
        ]
        .into_iter()
        .flatten()
        {
            s.push(c.token.expose().to_string());
        }
        s
    }
}

/// `[pages]`, `[gitlab.oauth]` and `[metrics]`.
fn take_pages(
    flat: &mut BTreeMap<String, Value>,
    public_url: Option<&str>,
) -> Result<(PagesConfig, MetricsConfig), ConfigError> {
    let client_id = take_str(flat, "gitlab.oauth.client_id")?;
    let client_secret = take_str(flat, "gitlab.oauth.client_secret")?;
    let oauth = match (client_id, client_secret) {
        (None, None) => None,
        (Some(id), Some(secret)) if !id.trim().is_empty() && !secret.is_empty() => {
            Some(OAuthConfig {
                client_id: id.trim().to_string(),
                client_secret: Secret::new(secret),
            })
        }
        _ => {
            return Err(ConfigError::Missing {
                key: "gitlab.oauth.client_id".into(),
                hint: "[gitlab.oauth] needs both client_id and client_secret (or client_secret_file): the Application ID and Secret GitLab shows for the application".into(),
            })
        }
    };
    let auth = match take_str(flat, "pages.auth")?.as_deref() {
        None if oauth.is_some() => PagesAuth::Gitlab,
        None | Some("loopback") => PagesAuth::Loopback,
        Some("gitlab") => PagesAuth::Gitlab,
        Some("none") => PagesAuth::None,
        Some(other) => {
            return Err(ConfigError::Invalid {
                key: "pages.auth".into(),
                message: format!("`{other}`: expected \"gitlab\", \"loopback\" or \"none\""),
            })
        }
    };
    if auth == PagesAuth::Gitlab {
        if oauth.is_none() {
            return Err(ConfigError::Missing {
                key: "gitlab.oauth.client_id".into(),
                hint: "pages.auth = \"gitlab\" signs users in with GitLab: register planbot as a GitLab application and set [gitlab.oauth] client_id and client_secret_file".into(),
            });
        }
        if public_url.is_none() {
            return Err(ConfigError::Missing {
                key: "public_url".into(),
                hint: "signing in with GitLab needs planbot's own address: GitLab sends users back to <public_url>/auth/callback".into(),
            });
        }
    }
    let session_lifetime = take_duration(flat, "pages.session_lifetime", "8h")?;
    if session_lifetime < Duration::from_secs(60)
        || session_lifetime > Duration::from_secs(30 * 86400)
    {
        return Err(ConfigError::Invalid {
            key: "pages.session_lifetime".into(),
            message: "expected a duration from 1m to 30d, e.g. \"8h\"".into(),
        });
    }
    let token = take_str(flat, "metrics.token")?;
    if let Some(t) = &token {
        if t.len() < 16 || !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError::Invalid {
                key: "metrics.token".into(),
                message:
                    "use at least 16 printable characters without spaces (`openssl rand -hex 32`)"
                        .into(),
            });
        }
    }
    Ok((
        PagesConfig {
            auth,
            oauth,
            session_lifetime,
        },
        MetricsConfig {
            token: token.map(Secret::new),
        },
    ))
}

fn flatten(
    prefix: &str,
    table: toml::Table,
    out: &mut BTreeMap<String, Value>,
    unknown_keys: &mut Vec<ConfigError>,
) {
    for (k, v) in table {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if path == POLICY_SETS
            || ENV_TABLES
                .iter()
                .any(|t| path == *t || path.strip_suffix("_file") == Some(t))
        {
            out.insert(path, v);
            continue;
        }
        match v {
            Value::Table(t) if SECTIONS.contains(&path.as_str()) => {
                flatten(&path, t, out, unknown_keys)
            }
            v => {
                let known = key_info(&path).is_some()
                    || path
                        .strip_suffix("_file")
                        .and_then(key_info)
                        .is_some_and(|(_, secret)| secret);
                if !known {
                    unknown_keys.push(unknown(&path));
                    continue;
                }
                out.insert(path, v);
            }
        }
    }
}

/// The line (1-based) of `key` in the TOML text: its `name =` line under the `[section]`
/// header, or an inline `{ name = ... }` of its parent. `None` when written some other way.
fn line_of(text: &str, key: &str) -> Option<usize> {
    let (section, name) = key.rsplit_once('.').unwrap_or(("", key));
    let mut current = String::new();
    let is_assignment = |l: &str, name: &str| {
        l.strip_prefix(name)
            .is_some_and(|rest| rest.trim_start().starts_with('='))
            || l.strip_prefix(&format!("\"{name}\""))
                .is_some_and(|rest| rest.trim_start().starts_with('='))
    };
    for (n, line) in text.lines().enumerate() {
        let l = line.trim();
        if let Some(header) = l.strip_prefix('[').and_then(|h| h.split(']').next()) {
            current = header.trim().trim_matches('[').to_string();
            continue;
        }
        if current == section && is_assignment(l, name) {
            return Some(n + 1);
        }
        // `env = { NAME = ... }` on one line.
        if let Some((parent_section, parent)) = section.rsplit_once('.').or(Some(("", section))) {
            if current == parent_section
                && is_assignment(l, parent)
                && l.contains(&format!("{name} ="))
            {
                return Some(n + 1);
            }
        }
    }
    None
}

/// Where the value an error is about came from: its key, or the nearest enclosing one
/// (`engine.env.NAME` → `engine.env`), or the `_file` key that named it.
fn origin_of(origins: &BTreeMap<String, Origin>, error: &ConfigError) -> Option<Origin> {
    let key = error.key()?;
    if matches!(
        error,
        ConfigError::Missing { .. } | ConfigError::UnknownKey { .. }
    ) {
        return None;
    }
    let mut k = key;
    loop {
        if let Some(o) = origins.get(k).or_else(|| origins.get(&format!("{k}_file"))) {
            return Some(o.clone());
        }
        k = k.rsplit_once('.')?.0;
    }
}

fn unknown(path: &str) -> ConfigError {
    let section = path.rsplit_once('.').map(|(s, _)| s).unwrap_or("");
    let known: Vec<&str> = KEYS
        .iter()
        .map(|(k, _, _)| *k)
        .filter(|k| k.rsplit_once('.').map(|(s, _)| s).unwrap_or("") == section)
        .collect();
    let hint = if known.is_empty() {
        String::new()
    } else {
        format!(" (known keys here: {})", known.join(", "))
    };
    ConfigError::UnknownKey {
        key: path.to_string(),
        hint,
    }
}

fn apply_env(
    env: &[(String, String)],
    flat: &mut BTreeMap<String, Value>,
    origins: &mut BTreeMap<String, Origin>,
    errors: &mut Vec<(ConfigError, Option<Origin>)>,
) {
    for (name, value) in env {
        let Some(_) = name.strip_prefix("PLANBOT_") else {
            continue;
        };
        for (path, kind, secret) in KEYS {
            if *kind == Kind::Table {
                // PLANBOT_ENGINE_ENV_<NAME>=value sets engine.env.NAME (likewise
                // PLANBOT_ENGINE_PLAN_ENV_<NAME>, PLANBOT_ENGINE_APPLY_ENV_<NAME>).
                if let Some(var) = name.strip_prefix(&format!("{}_", env_name(path))) {
                    let mut t = match flat.remove(*path) {
                        Some(Value::Table(t)) => t,
                        _ => toml::Table::new(),
                    };
                    t.insert(var.to_string(), Value::String(value.clone()));
                    flat.insert(path.to_string(), Value::Table(t));
                    origins.insert(format!("{path}.{var}"), Origin::Env(name.clone()));
                }
                continue;
            }
            if *name == env_name(path) {
                flat.remove(&format!("{path}_file"));
                origins.insert(path.to_string(), Origin::Env(name.clone()));
                match env_value(path, *kind, value) {
                    Ok(v) => {
                        flat.insert(path.to_string(), v);
                    }
                    Err(e) => {
                        flat.remove(*path);
                        errors.push((e, Some(Origin::Env(name.clone()))));
                    }
                }
            } else if *secret && *name == format!("{}_FILE", env_name(path)) {
                flat.remove(*path);
                flat.insert(format!("{path}_file"), Value::String(value.clone()));
                origins.insert(format!("{path}_file"), Origin::Env(name.clone()));
            }
        }
    }
}

fn env_value(path: &str, kind: Kind, value: &str) -> Result<Value, ConfigError> {
    let invalid = |m: &str| ConfigError::Invalid {
        key: path.to_string(),
        message: m.to_string(),
    };
    Ok(match kind {
        Kind::Str | Kind::Table => Value::String(value.to_string()),
        Kind::Int => Value::Integer(
            value
                .trim()
                .parse()
                .map_err(|_| invalid("expected a whole number"))?,
        ),
        Kind::Bool => Value::Boolean(match value.trim() {
            "true" | "1" | "yes" => true,
            "false" | "0" | "no" | "" => false,
            _ => return Err(invalid("expected true or false")),
        }),
        Kind::StrOrIntList => {
            let v = value.trim();
            if v.starts_with('[') {
                let t: toml::Table = format!("x = {v}")
                    .parse()
                    .map_err(|_| invalid("expected a TOML array or a comma-separated list"))?;
                t["x"].clone()
            } else {
                Value::Array(
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(|s| match s.parse::<i64>() {
                            Ok(n) => Value::Integer(n),
                            Err(_) => Value::String(s.to_string()),
                        })
                        .collect(),
                )
            }
        }
    })
}

/// The directory systemd's `LoadCredential=` fills (and any other secret mount may name).
pub const CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";

/// Where a `<key>_file` path points: an absolute path as is; a relative one is a file name in
/// `$CREDENTIALS_DIRECTORY` (systemd's `LoadCredential=`), and an error when that is not set.
fn secret_file_path(
    key: &str,
    path: &str,
    env: &[(String, String)],
) -> Result<String, ConfigError> {
    if path.starts_with('/') {
        return Ok(path.to_string());
    }
    let dir = env
        .iter()
        .rev()
        .find(|(k, _)| k == CREDENTIALS_DIRECTORY)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty());
    match dir {
        Some(dir) => Ok(format!("{}/{path}", dir.trim_end_matches('/'))),
        None => Err(ConfigError::SecretFile {
            key: key.to_string(),
            path: path.to_string(),
            message: "a relative path names a file in $CREDENTIALS_DIRECTORY (systemd's LoadCredential=), which is not set; write an absolute path".into(),
        }),
    }
}

fn resolve_files(
    flat: &mut BTreeMap<String, Value>,
    env: &[(String, String)],
    read_file: &dyn Fn(&str) -> Result<String, String>,
    origins: &mut BTreeMap<String, Origin>,
    errors: &mut Vec<(ConfigError, Option<Origin>)>,
) {
    let file_keys: Vec<String> = flat
        .keys()
        .filter(|k| k.ends_with("_file"))
        .cloned()
        .collect();
    for fk in file_keys {
        if key_info(&fk).is_some() {
            continue; // a plain key that happens to end in `_file` (proxmox.ca_file)
        }
        let key = fk.trim_end_matches("_file").to_string();
        let via = origins.remove(&fk).unwrap_or(Origin::File { line: None });
        if flat.contains_key(&key) {
            flat.remove(&fk);
            errors.push((ConfigError::Both { key }, Some(via)));
            continue;
        }
        // On a problem the key gets a stand-in value, so it is not also reported as missing.
        let stand_in = if ENV_TABLES.contains(&key.as_str()) {
            Value::Table(toml::Table::new())
        } else {
            Value::String(FALLBACK_SECRET.into())
        };
        let Some(Value::String(path)) = flat.remove(&fk) else {
            errors.push((
                ConfigError::Invalid {
                    key: fk,
                    message: "expected a file path (string)".into(),
                },
                Some(via),
            ));
            flat.insert(key, stand_in);
            continue;
        };
        let read = secret_file_path(&key, &path, env).and_then(|path| {
            read_file(&path)
                .map(|text| (text, path.clone()))
                .map_err(|message| ConfigError::SecretFile {
                    key: key.clone(),
                    path,
                    message,
                })
        });
        let (text, path) = match read {
            Ok(read) => read,
            Err(e) => {
                errors.push((e, Some(via)));
                flat.insert(key, stand_in);
                continue;
            }
        };
        let origin = Origin::SecretFile {
            path,
            via: Box::new(via),
        };
        let text = text.trim_end_matches(['\n', '\r']).to_string();
        if ENV_TABLES.contains(&key.as_str()) {
            // engine.env_file: a file of NAME=value lines.
            let mut t = toml::Table::new();
            for l in text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
            {
                let Some((k, v)) = l.split_once('=') else {
                    errors.push((
                        ConfigError::Invalid {
                            key: format!("{key}_file"),
                            message: "expected NAME=value lines".into(),
                        },
                        Some(origin.clone()),
                    ));
                    continue;
                };
                let k = k.trim().to_string();
                origins.insert(format!("{key}.{k}"), origin.clone());
                t.insert(k, Value::String(v.to_string()));
            }
            flat.insert(key.clone(), Value::Table(t));
        } else {
            flat.insert(key.clone(), Value::String(text));
        }
        origins.insert(key, origin);
    }
}

/// A stand-in for a bad secret while the remaining keys are checked (never used to run).
const FALLBACK_SECRET: &str = "planbot-fallback-secret-0123456789";

/// Checks of values that parse but cannot work: empty secrets, the example's placeholder, and
/// Proxmox API tokens not of the form `user@realm!tokenid=secret`. A bad value is reported and
/// replaced by a stand-in, so it is not also reported as missing.
fn check_values(
    flat: &mut BTreeMap<String, Value>,
    errors: &mut Vec<(ConfigError, Option<Origin>)>,
) {
    let check = |key: &str, value: &str, secret: bool| -> Option<String> {
        if secret && value.trim().is_empty() {
            return Some("is empty".into());
        }
        if value.trim().eq_ignore_ascii_case(PLACEHOLDER) {
            return Some(format!(
                "is still the example's placeholder `{PLACEHOLDER}`: put the real value here"
            ));
        }
        let is_pve_token = key.starts_with("proxmox.") && key.ends_with(".api_token")
            || key == "proxmox.api_token"
            || key.ends_with(".env.PROXMOX_VE_API_TOKEN");
        if is_pve_token {
            return pve_token_problem(value);
        }
        None
    };
    let keys: Vec<String> = flat.keys().cloned().collect();
    for key in keys {
        match flat.get_mut(&key) {
            Some(Value::String(v)) => {
                let secret = key_info(&key).is_some_and(|(_, secret)| secret);
                if let Some(message) = check(&key, v, secret) {
                    *v = if key.ends_with("api_token") {
                        "planbot@pve!fallback=fallback".into()
                    } else {
                        FALLBACK_SECRET.into()
                    };
                    errors.push((ConfigError::Invalid { key, message }, None));
                }
            }
            Some(Value::Table(t)) if ENV_TABLES.contains(&key.as_str()) => {
                for (name, v) in t.iter_mut() {
                    let Value::String(text) = v else { continue };
                    let full = format!("{key}.{name}");
                    if let Some(message) = check(&full, text, true) {
                        *text = FALLBACK_SECRET.into();
                        errors.push((ConfigError::Invalid { key: full, message }, None));
                    }
                }
            }
            _ => {}
        }
    }
}

/// Why `value` is not a Proxmox API token `user@realm!tokenid=secret` (never quoting the secret).
pub fn pve_token_problem(value: &str) -> Option<String> {
    const FORM: &str =
        "write it as user@realm!tokenid=secret, e.g. planbot@pve!plan=<the UUID pveum printed>";
    let value = value.trim();
    if value.starts_with("PVEAPIToken") {
        return Some(format!(
            "starts with `PVEAPIToken=`, which is the HTTP header's prefix, not part of the token: {FORM}"
        ));
    }
    let Some((id, secret)) = value.split_once('=') else {
        return Some(format!("has no `=secret` part: {FORM}"));
    };
    let Some((user, token_name)) = id.split_once('!') else {
        return Some(format!("has no `!tokenid` part: {FORM}"));
    };
    let Some((name, realm)) = user.rsplit_once('@') else {
        return Some(format!("the user has no `@realm`: {FORM}"));
    };
    let word = |w: &str| {
        w.starts_with(|c: char| c.is_ascii_alphabetic())
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    if name.is_empty() || name.contains(char::is_whitespace) || !word(realm) {
        return Some(format!("the user `user@realm` is malformed: {FORM}"));
    }
    if !word(token_name) {
        return Some(format!(
            "the token id `{token_name}` is malformed (a letter, then letters, digits, `.`, `-`, `_`): {FORM}"
        ));
    }
    if secret.is_empty() || secret.contains(char::is_whitespace) {
        return Some(format!(
            "the secret after `=` is empty or has spaces: {FORM}"
        ));
    }
    None
}

fn take_str(flat: &mut BTreeMap<String, Value>, key: &str) -> Result<Option<String>, ConfigError> {
    match flat.remove(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ConfigError::Invalid {
            key: key.into(),
            message: format!("expected a string, found {}", other.type_str()),
        }),
    }
}

fn take_bool(flat: &mut BTreeMap<String, Value>, key: &str) -> Result<Option<bool>, ConfigError> {
    match flat.remove(key) {
        None => Ok(None),
        Some(Value::Boolean(b)) => Ok(Some(b)),
        Some(other) => Err(ConfigError::Invalid {
            key: key.into(),
            message: format!("expected true or false, found {}", other.type_str()),
        }),
    }
}

fn take_duration(
    flat: &mut BTreeMap<String, Value>,
    key: &str,
    default: &str,
) -> Result<Duration, ConfigError> {
    let s = take_str(flat, key)?.unwrap_or_else(|| default.to_string());
    humantime::parse_duration(&s).map_err(|e| ConfigError::Invalid {
        key: key.into(),
        message: format!("{e} (write e.g. \"30m\", \"90s\")"),
    })
}

fn take_endpoint(
    flat: &mut BTreeMap<String, Value>,
    prefix: &str,
) -> Result<Option<ProxmoxEndpoint>, ConfigError> {
    let k = |name: &str| {
        if prefix.is_empty() {
            format!("proxmox.{name}")
        } else {
            format!("proxmox.{prefix}.{name}")
        }
    };
    let endpoint = take_str(flat, &k("endpoint"))?;
    let api_token = take_str(flat, &k("api_token"))?.map(Secret::new);
    let insecure = take_bool(flat, &k("insecure"))?;
    let ca_file = take_str(flat, &k("ca_file"))?.map(PathBuf::from);
    if endpoint.is_none() && api_token.is_none() && insecure.is_none() && ca_file.is_none() {
        return Ok(None);
    }
    if let Some(e) = &endpoint {
        if !(e.starts_with("https://") || e.starts_with("http://")) {
            return Err(ConfigError::Invalid {
                key: k("endpoint"),
                message: "expected a URL like https://pve.example.com:8006".into(),
            });
        }
    }
    Ok(Some(ProxmoxEndpoint {
        endpoint,
        api_token,
        insecure: insecure.unwrap_or(false),
        ca_file,
    }))
}

/// `Ok(v)`, or `fallback` with the error kept in `problems` (so the other keys are still checked).
fn soft<T>(problems: &mut Vec<ConfigError>, r: Result<T, ConfigError>, fallback: T) -> T {
    r.unwrap_or_else(|e| {
        problems.push(e);
        fallback
    })
}

/// The config from the flattened keys, one section at a time. Problems of single keys go to
/// `problems` and the key gets a fallback, so every one is reported; an `Err` stops at once.
/// The steps run in this order because it is the order the problems are reported in.
fn build(
    mut flat: BTreeMap<String, Value>,
    problems: &mut Vec<ConfigError>,
) -> Result<Config, ConfigError> {
    let (p, flat) = (problems, &mut flat);
    let listen = take_listen(flat, p);
    let data_dir = PathBuf::from(
        soft(p, take_str(flat, "data_dir"), None).unwrap_or_else(|| "/var/lib/planbot".into()),
    );
    let public_url =
        soft(p, take_str(flat, "public_url"), None).map(|u| u.trim_end_matches('/').to_string());
    let fingerprint_key = take_fingerprint_key(flat, p);
    let gitlab = take_gitlab(flat, p);
    let engine = take_engine(flat, p);
    let sandbox = soft(p, take_sandbox(flat), SandboxConfig::default());
    let store = take_store(flat, p, &data_dir);
    let (pages, metrics) = soft(
        p,
        take_pages(flat, public_url.as_deref()),
        (PagesConfig::default(), MetricsConfig::default()),
    );
    let apply = take_apply(flat, p);
    let plan = take_plan(flat, p);
    let proxmox = take_proxmox(flat, p);
    let state = take_state(flat, p);
    let modules = take_modules(flat, p);
    let policy_sets = take_policy_sets(flat, p);
    // Known keys are left only when their section stopped early (already reported).
    for k in flat.keys().filter(|k| key_info(k).is_none()) {
        p.push(unknown(k));
    }
    let log = take_log(flat, p);
    Ok(Config {
        log,
        listen,
        data_dir,
        public_url,
        fingerprint_key: Secret::new(fingerprint_key),
        gitlab,
        engine,
        apply,
        plan,
        proxmox,
        sandbox,
        pages,
        metrics,
        store,
        state,
        modules,
        policy_sets,
    })
}

/// `[<section>] username` and `token` (or `token_file`): `None` without a token. The user name
/// defaults to `planbot` (GitLab reads only the token of a personal, project or group access
/// token).
fn take_credential(
    flat: &mut BTreeMap<String, Value>,
    p: &mut Vec<ConfigError>,
    section: &str,
) -> Option<GitlabCredential> {
    let username = soft(p, take_str(flat, &format!("{section}.username")), None);
    let token = soft(p, take_str(flat, &format!("{section}.token")), None)?;
    let username = username.unwrap_or_else(|| "planbot".into());
    if username.trim().is_empty() || username.contains(':') {
        p.push(ConfigError::Invalid {
            key: format!("{section}.username"),
            message: "expected a user name without `:` (any word for an access token; the token's user name for a deploy token)".into(),
        });
    }
    Some(GitlabCredential {
        username: username.trim().to_string(),
        token: Secret::new(token.trim()),
    })
}

/// `[state]`: the default for roots that say nothing, and the tokens per trust level.
fn take_state(flat: &mut BTreeMap<String, Value>, p: &mut Vec<ConfigError>) -> StateConfig {
    let default = match soft(p, take_str(flat, "state.default"), None).as_deref() {
        None | Some("own") => StateDefault::Own,
        Some("gitlab") => StateDefault::Gitlab,
        Some(other) => {
            p.push(ConfigError::Invalid {
                key: "state.default".into(),
                message: format!("`{other}`: expected \"own\" (the backend each root configures) or \"gitlab\" (the project's GitLab-managed state named after the root)"),
            });
            StateDefault::Own
        }
    };
    StateConfig {
        default,
        plan: take_credential(flat, p, "state.plan"),
        apply: take_credential(flat, p, "state.apply"),
    }
}

/// `[modules]`: the module projects (for `doctor`) and the tokens per trust level.
fn take_modules(flat: &mut BTreeMap<String, Value>, p: &mut Vec<ConfigError>) -> ModulesConfig {
    let projects = match flat.remove("modules.projects") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .into_iter()
            .filter_map(|v| match v {
                Value::String(s) if !s.trim().trim_matches('/').is_empty() => {
                    Some(s.trim().trim_matches('/').to_string())
                }
                other => {
                    p.push(ConfigError::Invalid {
                        key: "modules.projects".into(),
                        message: format!("`{other}` is not a project path like \"infra/modules\""),
                    });
                    None
                }
            })
            .collect(),
        Some(other) => {
            p.push(ConfigError::Invalid {
                key: "modules.projects".into(),
                message: format!("expected a list, found {}", other.type_str()),
            });
            Vec::new()
        }
    };
    ModulesConfig {
        projects,
        plan: take_credential(flat, p, "modules.plan"),
        apply: take_credential(flat, p, "modules.apply"),
    }
}

/// The array of tables of the operator's policy sets (not a dotted key: not in [`KEYS`]).
const POLICY_SETS: &str = "policy_sets";

/// The line (1-based) of each `[[name]]` header, in order.
fn header_lines(text: &str, name: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            l.trim()
                .strip_prefix("[[")
                .and_then(|h| h.split("]]").next())
                .is_some_and(|h| h.trim() == name)
        })
        .map(|(n, _)| n + 1)
        .collect()
}

/// `[[policy_sets]]`: each with a unique name, an absolute `path` (a directory on planbot's
/// host), `owners`, `roots` (root names, in any repository) and a Rego `namespace`.
fn take_policy_sets(
    flat: &mut BTreeMap<String, Value>,
    p: &mut Vec<ConfigError>,
) -> Vec<PolicySetSpec> {
    let items = match flat.remove(POLICY_SETS) {
        None => return Vec::new(),
        Some(Value::Array(items)) => items,
        Some(other) => {
            p.push(ConfigError::Invalid {
                key: POLICY_SETS.into(),
                message: format!(
                    "expected [[policy_sets]] tables, found {}",
                    other.type_str()
                ),
            });
            return Vec::new();
        }
    };
    let mut sets: Vec<PolicySetSpec> = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let key = |k: &str| format!("{POLICY_SETS}[{i}].{k}");
        let invalid = |k: &str, message: String| ConfigError::Invalid {
            key: key(k),
            message,
        };
        let Value::Table(mut t) = item else {
            p.push(invalid("name", "expected a table".into()));
            continue;
        };
        let string = |t: &mut toml::Table, k: &str, p: &mut Vec<ConfigError>| match t.remove(k) {
            None => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                p.push(invalid(
                    k,
                    format!("expected a string, found {}", other.type_str()),
                ));
                None
            }
        };
        let name = string(&mut t, "name", p);
        let path = string(&mut t, "path", p);
        let namespace =
            string(&mut t, "namespace", p).unwrap_or_else(|| policy::DEFAULT_NAMESPACE.to_string());
        let list = |t: &mut toml::Table, k: &str, p: &mut Vec<ConfigError>| match t.remove(k) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .filter_map(|v| match v {
                    Value::String(s) => Some(s),
                    other => {
                        p.push(invalid(k, format!("`{other}` is not a string")));
                        None
                    }
                })
                .collect(),
            Some(other) => {
                p.push(invalid(
                    k,
                    format!("expected a list, found {}", other.type_str()),
                ));
                Vec::new()
            }
        };
        let owners: Vec<String> = list(&mut t, "owners", p);
        let roots: Vec<String> = list(&mut t, "roots", p);
        for k in t.keys() {
            p.push(invalid(
                k,
                "unknown key (known keys here: name, path, owners, roots, namespace)".into(),
            ));
        }
        let Some(name) = name else {
            p.push(ConfigError::Missing {
                key: key("name"),
                hint: "each policy set needs a name, shown on the MR".into(),
            });
            continue;
        };
        if let Err(e) = policy::sets::check_name(&name) {
            p.push(invalid("name", e));
        } else if sets.iter().any(|s| s.name == name) {
            p.push(invalid(
                "name",
                format!("`{name}` is used twice; names must be unique"),
            ));
        }
        let Some(path) = path else {
            p.push(ConfigError::Missing {
                key: key("path"),
                hint: "the directory of .rego files on planbot's host, e.g. /etc/planbot/policies"
                    .into(),
            });
            continue;
        };
        if !path.starts_with('/') {
            p.push(invalid(
                "path",
                format!("`{path}` is not an absolute path (a directory on planbot's host)"),
            ));
        }
        if let Err(e) = policy::sets::check_namespace(&namespace) {
            p.push(invalid("namespace", e));
        }
        let owners = owners
            .iter()
            .filter_map(|o| {
                policy::Owner::parse(o)
                    .map_err(|e| p.push(invalid("owners", e)))
                    .ok()
            })
            .collect();
        sets.push(PolicySetSpec {
            name,
            path,
            owners,
            roots,
            namespace,
        });
    }
    sets
}

/// `[store]`: where deliveries, the queue, runs and applies live (the embedded SQLite file in
/// `data_dir` unless `url` says PostgreSQL), the PostgreSQL password, and its TLS (the URL's
/// `sslmode` and the CA, checked here: `prefer`/`allow` are refused).
fn take_store(
    flat: &mut BTreeMap<String, Value>,
    p: &mut Vec<ConfigError>,
    data_dir: &std::path::Path,
) -> StoreConfig {
    let default_store = StoreUrl::Sqlite(data_dir.join("planbot.db"));
    let url = match soft(p, take_str(flat, "store.url"), None) {
        None => default_store,
        Some(text) => soft(
            p,
            StoreUrl::parse(&text).map_err(|message| ConfigError::Invalid {
                key: "store.url".into(),
                message,
            }),
            default_store,
        ),
    };
    let password = soft(p, take_str(flat, "store.password"), None).map(Secret::new);
    let ca_file = soft(p, take_str(flat, "store.ca_file"), None).map(PathBuf::from);
    let default_lease = Duration::from_secs(30);
    let lease = soft(p, take_duration(flat, "store.lease", "30s"), default_lease);
    let lease = if (Duration::from_secs(1)..=Duration::from_secs(600)).contains(&lease) {
        lease
    } else {
        p.push(ConfigError::Invalid {
            key: "store.lease".into(),
            message: "expected a duration from 1s to 10m, e.g. \"30s\"".into(),
        });
        default_lease
    };
    let store = StoreConfig {
        url,
        password,
        ca_file,
        lease,
    };
    if let Some(Err(message)) = store.tls() {
        let key = if message.contains("store.ca_file") {
            "store.ca_file"
        } else {
            "store.url"
        };
        p.push(ConfigError::Invalid {
            key: key.into(),
            message,
        });
    }
    store
}

/// `listen`: an address like `0.0.0.0:8080` (the default).
fn take_listen(flat: &mut BTreeMap<String, Value>, p: &mut Vec<ConfigError>) -> SocketAddr {
    let default_listen = SocketAddr::from(([0, 0, 0, 0], 8080));
    match soft(p, take_str(flat, "listen"), None) {
        None => default_listen,
        Some(l) => soft(
            p,
            l.parse().map_err(|_| ConfigError::Invalid {
                key: "listen".into(),
                message: format!("`{l}` is not an address like 0.0.0.0:8080"),
            }),
            default_listen,
        ),
    }
}

/// `fingerprint_key`: required, at least 16 characters.
fn take_fingerprint_key(flat: &mut BTreeMap<String, Value>, p: &mut Vec<ConfigError>) -> String {
    let fingerprint_key = soft(p, take_str(flat, "fingerprint_key"), None);
    let fingerprint_key = soft(p, fingerprint_key.ok_or_else(|| ConfigError::Missing {
        key: "fingerprint_key".into(),
        hint: "a long random server secret, e.g. `openssl rand -hex 32` (keep it stable: reviewed plans are matched by it)".into(),
    }), FALLBACK_SECRET.into());
    if fingerprint_key.len() < 16 {
        p.push(ConfigError::Invalid {
            key: "fingerprint_key".into(),
            message: "too short: use at least 16 random characters (`openssl rand -hex 32`)".into(),
        });
    }
    fingerprint_key
}

/// `[gitlab]`: the URL, the token, how webhooks are authenticated, and the projects.
fn take_gitlab(flat: &mut BTreeMap<String, Value>, p: &mut Vec<ConfigError>) -> GitlabConfig {
    let url = soft(p, take_str(flat, "gitlab.url"), None);
    let url = soft(
        p,
        url.ok_or_else(|| ConfigError::Missing {
            key: "gitlab.url".into(),
            hint: "the GitLab base URL, e.g. https://gitlab.example.com".into(),
        }),
        "https://gitlab.invalid".into(),
    );
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        p.push(ConfigError::Invalid {
            key: "gitlab.url".into(),
            message: "expected a URL like https://gitlab.example.com".into(),
        });
    }
    let token = soft(p, take_str(flat, "gitlab.token"), None);
    let token = soft(
        p,
        token.ok_or_else(|| ConfigError::Missing {
            key: "gitlab.token".into(),
            hint: "a token with api scope (or set PLANBOT_GITLAB_TOKEN / gitlab.token_file)".into(),
        }),
        FALLBACK_SECRET.into(),
    );
    let webhook_secret = soft(p, take_str(flat, "gitlab.webhook_secret"), None).map(Secret::new);
    let signing_token = soft(p, take_str(flat, "gitlab.signing_token"), None);
    if let Some(t) = &signing_token {
        if crate::core::webhook::decode_signing_token(t).is_none() {
            p.push(ConfigError::Invalid {
                key: "gitlab.signing_token".into(),
                message: "expected `whsec_` followed by base64 (as GitLab shows it)".into(),
            });
        }
    }
    if webhook_secret.is_none() && signing_token.is_none() {
        p.push(ConfigError::Missing {
            key: "gitlab.webhook_secret".into(),
            hint: "set the webhook's secret token (and/or gitlab.signing_token); unauthenticated webhooks are not accepted".into(),
        });
    }
    let projects = take_projects(flat, p);
    GitlabConfig {
        url: url.trim_end_matches('/').to_string(),
        token: Secret::new(token),
        webhook_secret,
        signing_token: signing_token.map(Secret::new),
        projects: Allowlist(projects),
    }
}

/// `gitlab.projects`: a non-empty list of project paths and numeric ids.
fn take_projects(flat: &mut BTreeMap<String, Value>, p: &mut Vec<ConfigError>) -> Vec<ProjectRef> {
    let projects = match flat.remove("gitlab.projects") {
        None => Vec::new(),
        Some(Value::Array(items)) => soft(
            p,
            items
                .into_iter()
                .map(|v| match v {
                    Value::Integer(n) if n > 0 => Ok(ProjectRef::Id(n as u64)),
                    Value::String(s) if s.trim().parse::<u64>().is_ok() => {
                        Ok(ProjectRef::Id(s.trim().parse().unwrap_or(0)))
                    }
                    Value::String(s) if !s.trim().is_empty() => {
                        Ok(ProjectRef::Path(s.trim().trim_matches('/').to_string()))
                    }
                    other => Err(ConfigError::Invalid {
                        key: "gitlab.projects".into(),
                        message: format!("`{other}` is neither a project path nor a numeric id"),
                    }),
                })
                .collect::<Result<Vec<_>, _>>(),
            vec![ProjectRef::Id(0)],
        ),
        Some(other) => {
            p.push(ConfigError::Invalid {
                key: "gitlab.projects".into(),
                message: format!("expected a list, found {}", other.type_str()),
            });
            vec![ProjectRef::Id(0)]
        }
    };
    if projects.is_empty() {
        p.push(ConfigError::Missing {
            key: "gitlab.projects".into(),
            hint: "list the projects planbot serves, e.g. [\"infra/homelab\"]; every other project is ignored".into(),
        });
    }
    projects
}

/// `[engine]`, `[engine.plan]`, `[engine.apply]`: the binary, its time limits, its environment
/// and the provider mirror.
fn take_engine(flat: &mut BTreeMap<String, Value>, p: &mut Vec<ConfigError>) -> EngineConfig {
    let binary = soft(p, take_str(flat, "engine.binary"), None).unwrap_or_else(|| "tofu".into());
    let timeout = soft(
        p,
        take_duration(flat, "engine.timeout", "30m"),
        Duration::from_secs(1800),
    );
    let lock_timeout = soft(
        p,
        take_duration(flat, "engine.lock_timeout", "5m"),
        Duration::from_secs(300),
    );
    let grace = soft(
        p,
        take_duration(flat, "engine.grace", "30s"),
        Duration::from_secs(30),
    );
    let env = soft(p, take_env_table(flat, "engine.env"), BTreeMap::new());
    let plan_env = soft(p, take_env_table(flat, "engine.plan.env"), BTreeMap::new());
    let apply_env = soft(p, take_env_table(flat, "engine.apply.env"), BTreeMap::new());
    let provider_mirror = soft(p, take_str(flat, "engine.provider_mirror"), None);
    let secret_env = soft(p, take_names(flat, "engine.secret_env"), Vec::new());
    if let Some(m) = &provider_mirror {
        if !(m.starts_with("https://") || m.starts_with('/')) {
            p.push(ConfigError::Invalid {
                key: "engine.provider_mirror".into(),
                message: "expected an https:// URL (network mirror) or an absolute directory (filesystem mirror)".into(),
            });
        }
    }
    let max_plan_json_mib = match flat.remove("engine.max_plan_json_mib") {
        None => 32,
        Some(Value::Integer(n)) if (1..=4096).contains(&n) => n as u64,
        Some(other) => {
            p.push(ConfigError::Invalid {
                key: "engine.max_plan_json_mib".into(),
                message: format!("expected a number of MiB from 1 to 4096, found `{other}`"),
            });
            32
        }
    };
    EngineConfig {
        binary,
        timeout,
        lock_timeout,
        grace,
        env,
        plan_env,
        apply_env,
        provider_mirror,
        max_plan_json_mib,
        secret_env,
    }
}

/// A list of environment variable names (`engine.secret_env`).
fn take_names(flat: &mut BTreeMap<String, Value>, key: &str) -> Result<Vec<String>, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        key: key.into(),
        message,
    };
    match flat.remove(key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(n)
                    if !n.is_empty()
                        && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
                {
                    Ok(n)
                }
                other => Err(invalid(format!(
                    "`{other}` is not an environment variable name"
                ))),
            })
            .collect(),
        Some(other) => Err(invalid(format!(
            "expected a list, found {}",
            other.type_str()
        ))),
    }
}

/// `[apply]`.
fn take_apply(flat: &mut BTreeMap<String, Value>, p: &mut Vec<ConfigError>) -> ApplyConfig {
    let job_name =
        soft(p, take_str(flat, "apply.job_name"), None).unwrap_or_else(|| "planbot-apply".into());
    let open_issue_on_failure =
        soft(p, take_bool(flat, "apply.open_issue_on_failure"), None).unwrap_or(false);
    ApplyConfig {
        job_name,
        open_issue_on_failure,
    }
}

/// `[plan]`: `max_concurrent_plans` from 1 to 64 (default 2).
fn take_plan(flat: &mut BTreeMap<String, Value>, p: &mut Vec<ConfigError>) -> PlanConfig {
    let max_concurrent_plans = match flat.remove("plan.max_concurrent_plans") {
        None => 2,
        Some(Value::Integer(n)) if (1..=64).contains(&n) => n as usize,
        Some(other) => {
            p.push(ConfigError::Invalid {
                key: "plan.max_concurrent_plans".into(),
                message: format!("expected a number from 1 to 64, found `{other}`"),
            });
            2
        }
    };
    PlanConfig {
        max_concurrent_plans,
    }
}

/// `[proxmox]`, `[proxmox.plan]`, `[proxmox.apply]`: the endpoints and the apply's SSH.
fn take_proxmox(flat: &mut BTreeMap<String, Value>, p: &mut Vec<ConfigError>) -> ProxmoxConfig {
    let apply_ssh = soft(p, take_apply_ssh(flat), None);
    ProxmoxConfig {
        default: soft(p, take_endpoint(flat, ""), None).unwrap_or_default(),
        plan: soft(p, take_endpoint(flat, "plan"), None),
        apply: soft(p, take_endpoint(flat, "apply"), None),
        apply_ssh,
    }
}

/// `log_format` (`text` or `json`) and `log_level` (an `EnvFilter` directive).
fn take_log(flat: &mut BTreeMap<String, Value>, p: &mut Vec<ConfigError>) -> LogConfig {
    let format = match soft(p, take_str(flat, "log_format"), None).as_deref() {
        None | Some("text") => LogFormat::Text,
        Some("json") => LogFormat::Json,
        Some(other) => {
            p.push(ConfigError::Invalid {
                key: "log_format".into(),
                message: format!("expected \"text\" or \"json\", found `{other}`"),
            });
            LogFormat::Text
        }
    };
    let level = soft(p, take_str(flat, "log_level"), None);
    if let Some(level) = &level {
        if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(level) {
            p.push(ConfigError::Invalid {
                key: "log_level".into(),
                message: format!("{e} (write e.g. \"info\", \"warn\" or \"info,planbot=debug\")"),
            });
        }
    }
    LogConfig { format, level }
}

/// One table of engine environment variables (`engine.env`, `engine.plan.env`, …).
fn take_env_table(
    flat: &mut BTreeMap<String, Value>,
    path: &str,
) -> Result<BTreeMap<String, Secret>, ConfigError> {
    let env: BTreeMap<String, Secret> = match flat.remove(path) {
        None => BTreeMap::new(),
        Some(Value::Table(t)) => t
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, Secret::new(s))),
                other => Err(ConfigError::Invalid {
                    key: format!("{path}.{k}"),
                    message: format!("expected a string, found {}", other.type_str()),
                }),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ConfigError::Invalid {
                key: path.into(),
                message: format!("expected a table, found {}", other.type_str()),
            })
        }
    };
    for k in env.keys() {
        let forbidden = k.starts_with("TF_CLI_ARGS")
            || k.starts_with("TF_LOG")
            || ["PATH", "HOME", "TMPDIR", "TF_CLI_CONFIG_FILE"].contains(&k.as_str());
        if forbidden || k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(ConfigError::Invalid {
                key: format!("{path}.{k}"),
                message: "not allowed: planbot sets PATH/HOME/TMPDIR/TF_CLI_CONFIG_FILE itself and never passes TF_CLI_ARGS*/TF_LOG*".into(),
            });
        }
    }
    Ok(env)
}

/// `[proxmox.apply] ssh_username`, `ssh_private_key(_file)`, `ssh_agent_socket`.
fn take_apply_ssh(flat: &mut BTreeMap<String, Value>) -> Result<Option<SshConfig>, ConfigError> {
    let username = take_str(flat, "proxmox.apply.ssh_username")?;
    let private_key = take_str(flat, "proxmox.apply.ssh_private_key")?;
    let agent_socket = take_str(flat, "proxmox.apply.ssh_agent_socket")?.map(PathBuf::from);
    let Some(username) = username else {
        if private_key.is_some() || agent_socket.is_some() {
            return Err(ConfigError::Missing {
                key: "proxmox.apply.ssh_username".into(),
                hint: "the user the provider logs in as on the nodes (e.g. \"root\")".into(),
            });
        }
        return Ok(None);
    };
    if private_key.is_none() && agent_socket.is_none() {
        return Err(ConfigError::Missing {
            key: "proxmox.apply.ssh_private_key_file".into(),
            hint: "the SSH private key for that user (or ssh_agent_socket)".into(),
        });
    }
    if let Some(k) = &private_key {
        if !k.contains("PRIVATE KEY-----") {
            return Err(ConfigError::Invalid {
                key: "proxmox.apply.ssh_private_key".into(),
                message: "not a PEM/OpenSSH private key (it must contain `-----BEGIN … PRIVATE KEY-----`)".into(),
            });
        }
    }
    Ok(Some(SshConfig {
        username,
        private_key: private_key.map(|k| Secret::new(k + "\n")),
        agent_socket,
    }))
}

/// A size such as `512 MiB`, `4GiB` or `1048576` (bytes).
fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

/// `[sandbox]`.
fn take_sandbox(flat: &mut BTreeMap<String, Value>) -> Result<SandboxConfig, ConfigError> {
    let mut c = SandboxConfig::default();
    if let Some(required) = take_bool(flat, "sandbox.required")? {
        c.required = required;
    }
    for (key, setting) in [
        ("sandbox.landlock", &mut c.landlock),
        ("sandbox.namespaces", &mut c.namespaces),
    ] {
        *setting = match take_str(flat, key)?.as_deref() {
            None | Some("auto") => LandlockSetting::Auto,
            Some("off") => LandlockSetting::Off,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: key.into(),
                    message: format!("`{other}`: expected \"auto\" or \"off\""),
                })
            }
        };
    }
    if let Some(text) = take_str(flat, "sandbox.memory_max")? {
        c.memory_max = parse_size(&text)
            .filter(|n| *n >= 64 << 20)
            .ok_or_else(|| ConfigError::Invalid {
                key: "sandbox.memory_max".into(),
                message: format!(
                    "`{text}`: expected a size of at least 64 MiB, such as \"512 MiB\" or \"4 GiB\""
                ),
            })?;
    }
    let list = |flat: &mut BTreeMap<String, Value>, key: &str| match flat.remove(key) {
        None => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(other) => Err(ConfigError::Invalid {
            key: key.into(),
            message: format!("expected a list, found {}", other.type_str()),
        }),
    };
    if let Some(items) = list(flat, "sandbox.connect_ports")? {
        c.connect_ports = items
            .into_iter()
            .map(|v| match v {
                Value::Integer(n) if (1..=65535).contains(&n) => Ok(n as u16),
                other => Err(ConfigError::Invalid {
                    key: "sandbox.connect_ports".into(),
                    message: format!("`{other}` is not a TCP port (1 to 65535)"),
                }),
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(items) = list(flat, "sandbox.read_paths")? {
        c.read_paths = items
            .into_iter()
            .map(|v| match v {
                Value::String(p) if p.starts_with('/') => Ok(PathBuf::from(p)),
                other => Err(ConfigError::Invalid {
                    key: "sandbox.read_paths".into(),
                    message: format!("`{other}` is not an absolute path"),
                }),
            })
            .collect::<Result<_, _>>()?;
    }
    Ok(c)
}

/// A valid config of the fewest keys, with `extra` appended and `env` (`PLANBOT_*`) applied:
/// for the unit tests of every module that reads a config.
#[cfg(test)]
pub(crate) fn test_config(extra: &str, env: &[(&str, &str)]) -> Config {
    let text = format!(
        r#"
fingerprint_key = "0123456789abcdef0123"
[gitlab]
url = "https://gitlab.example.com/"
token = "glpat-secret-token"
webhook_secret = "hook-secret"
projects = ["infra/homelab"]
{extra}
"#
    );
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::load(&text, &env, &|_| Err("no files".into())).expect("a valid test config")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::store_tls::SslMode;

    const MINIMAL: &str = r#"
fingerprint_key = "0123456789abcdef0123"
[gitlab]
url = "https://gitlab.example.com/"
token = "glpat-secret-token"
webhook_secret = "hook-secret"
projects = ["infra/homelab", 42]
"#;

    fn no_files(_: &str) -> Result<String, String> {
        Err("no such file".into())
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::load(MINIMAL, &[], &no_files).unwrap();
        assert_eq!(c.listen.to_string(), "0.0.0.0:8080");
        assert_eq!(c.gitlab.url, "https://gitlab.example.com");
        assert_eq!(c.engine.binary, "tofu");
        assert_eq!(c.engine.timeout, Duration::from_secs(1800));
        assert_eq!(c.apply.job_name, "planbot-apply");
        assert!(!c.apply.open_issue_on_failure);
        assert!(c.gitlab.projects.allows(Some(42), None));
        assert!(c.gitlab.projects.allows(Some(7), Some("Infra/Homelab")));
        assert!(!c.gitlab.projects.allows(Some(7), Some("infra/other")));
    }

    #[test]
    fn the_store_is_sqlite_in_data_dir_unless_a_url_says_otherwise() {
        let c = Config::load(
            &format!("data_dir = \"/srv/pb\"\n{MINIMAL}"),
            &[],
            &no_files,
        )
        .unwrap();
        assert_eq!(c.store.url, StoreUrl::Sqlite("/srv/pb/planbot.db".into()));
        assert_eq!(c.store.password, None);

        let read = |p: &str| match p {
            "/run/secrets/db" => Ok("db-pass-from-file\n".to_string()),
            _ => Err("no such file".to_string()),
        };
        let text = format!(
            "{MINIMAL}[store]\nurl = \"postgres://planbot:inline-pass@db.internal:5432/planbot\"\npassword_file = \"/run/secrets/db\"\n"
        );
        let c = Config::load(&text, &[], &read).unwrap();
        assert!(matches!(&c.store.url, StoreUrl::Postgres(u) if u.contains("db.internal")));
        let secrets = c.secrets();
        assert!(
            secrets.iter().any(|s| s == "db-pass-from-file"),
            "{secrets:?}"
        );
        assert!(secrets.iter().any(|s| s == "inline-pass"), "{secrets:?}");
        let shown = c.describe();
        assert!(
            shown.contains("store.url = postgres://planbot:***@db.internal:5432/planbot"),
            "{shown}"
        );
        assert!(shown.contains("store.password = (set)"), "{shown}");
        assert!(!shown.contains("inline-pass") && !shown.contains("db-pass-from-file"));
        assert!(!format!("{c:?}").contains("inline-pass"));

        let env = [(
            "PLANBOT_STORE_URL".to_string(),
            "sqlite:///var/lib/x.db".to_string(),
        )];
        let c = Config::load(MINIMAL, &env, &no_files).unwrap();
        assert_eq!(c.store.url, StoreUrl::Sqlite("/var/lib/x.db".into()));

        for bad in ["mysql://x/y", "sqlite://relative.db", "postgres:///nohost"] {
            let e = Config::load(
                &format!("{MINIMAL}[store]\nurl = \"{bad}\"\n"),
                &[],
                &no_files,
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("store.url"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_postgres_store_is_verified_over_tls_unless_local_and_never_falls_back_to_plaintext() {
        let load =
            |store: &str| Config::load(&format!("{MINIMAL}[store]\n{store}"), &[], &no_files);
        let c = load("url = \"postgres://planbot@db.internal/planbot\"\n").unwrap();
        let tls = c.store.tls().unwrap().unwrap();
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert!(
            c.describe().contains(
                "store TLS = verify-full (the default for a network host), CA the public web roots"
            ),
            "{}",
            c.describe()
        );
        for local in [
            "postgres://planbot@127.0.0.1:5432/planbot",
            "postgres://planbot@%2Frun%2Fpostgresql/planbot",
        ] {
            let c = load(&format!("url = \"{local}\"\n")).unwrap();
            assert_eq!(c.store.tls().unwrap().unwrap().mode, SslMode::Disable);
        }
        let c = load(
            "url = \"postgres://planbot@db.internal/planbot?sslmode=verify-ca\"\nca_file = \"/etc/planbot/db-ca.pem\"\n",
        )
        .unwrap();
        assert_eq!(
            c.store.ca_file,
            Some(PathBuf::from("/etc/planbot/db-ca.pem"))
        );
        let shown = c.describe();
        assert!(
            shown.contains("store.ca_file = /etc/planbot/db-ca.pem"),
            "{shown}"
        );
        assert!(
            shown.contains("store TLS = verify-ca, CA store.ca_file /etc/planbot/db-ca.pem"),
            "{shown}"
        );
        assert!(Config::load(MINIMAL, &[], &no_files)
            .unwrap()
            .describe()
            .contains("store TLS = (SQLite: no network)"));

        for mode in ["prefer", "allow"] {
            let e = load(&format!(
                "url = \"postgres://planbot@db.internal/planbot?sslmode={mode}\"\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("store.url")
                    && e.contains("plaintext")
                    && e.contains("sslmode=disable")
                    && e.contains("sslmode=verify-full"),
                "{mode}: {e}"
            );
        }
        let e = load(
            "url = \"postgres://planbot@db.internal/planbot?sslrootcert=/a.pem\"\nca_file = \"/b.pem\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("store.ca_file") && e.contains("differ"), "{e}");
    }

    #[test]
    fn unknown_key_is_named() {
        let text = format!("{MINIMAL}\n[engine]\nbinray = \"tofu\"\n");
        let e = Config::load(&text, &[], &no_files).unwrap_err();
        assert!(e.to_string().contains("`engine.binray`"), "{e}");
        assert!(e.to_string().contains("engine.binary"), "{e}");
        let e = Config::load(&format!("colour = 1\n{MINIMAL}"), &[], &no_files).unwrap_err();
        assert!(e.to_string().contains("`colour`"), "{e}");
        let e = Config::load(
            &format!("{MINIMAL}\n[gitlb]\nurl = \"x\"\n"),
            &[],
            &no_files,
        )
        .unwrap_err();
        assert!(e.to_string().contains("`gitlb`"), "{e}");
    }

    #[test]
    fn env_overrides_win_and_lists_parse() {
        let env = vec![
            ("PLANBOT_GITLAB_TOKEN".to_string(), "from-env".to_string()),
            (
                "PLANBOT_PLAN_MAX_CONCURRENT_PLANS".to_string(),
                "4".to_string(),
            ),
            ("PLANBOT_GITLAB_PROJECTS".to_string(), "a/b, 9".to_string()),
            (
                "PLANBOT_ENGINE_ENV_TF_VAR_pve_token".to_string(),
                "pve-secret".to_string(),
            ),
            ("PLANBOT_UNRELATED".to_string(), "x".to_string()),
        ];
        let c = Config::load(MINIMAL, &env, &no_files).unwrap();
        assert_eq!(c.gitlab.token.expose(), "from-env");
        assert_eq!(c.plan.max_concurrent_plans, 4);
        assert!(c.gitlab.projects.allows(Some(9), None));
        assert!(c.gitlab.projects.allows(None, Some("a/b")));
        assert!(!c.gitlab.projects.allows(Some(42), None));
        assert_eq!(c.engine.env["TF_VAR_pve_token"].expose(), "pve-secret");
    }

    #[test]
    fn secret_files_are_read_and_trimmed() {
        let text = MINIMAL.replace(
            "token = \"glpat-secret-token\"",
            "token_file = \"/run/secrets/gl\"",
        );
        let read = |p: &str| {
            if p == "/run/secrets/gl" {
                Ok("glpat-from-file\n".to_string())
            } else {
                Err("nope".to_string())
            }
        };
        let c = Config::load(&text, &[], &read).unwrap();
        assert_eq!(c.gitlab.token.expose(), "glpat-from-file");
        let both = text.replace("[gitlab]", "[gitlab]\ntoken = \"x\"");
        assert!(matches!(
            Config::load(&both, &[], &read),
            Err(ConfigError::Both { .. })
        ));
        let missing = MINIMAL.replace("token = \"glpat-secret-token\"", "token_file = \"/nope\"");
        let e = Config::load(&missing, &[], &read).unwrap_err();
        assert!(e.to_string().contains("gitlab.token_file"), "{e}");
        // `_file` only exists for secrets.
        let e = Config::load(&format!("listen_file = \"/x\"\n{MINIMAL}"), &[], &read).unwrap_err();
        assert!(e.to_string().contains("`listen_file`"), "{e}");
    }

    #[test]
    fn a_relative_secret_file_is_a_name_in_the_credentials_directory() {
        let text = MINIMAL.replace(
            "token = \"glpat-secret-token\"",
            "token_file = \"gitlab-token\"",
        );
        let read = |p: &str| {
            if p == "/run/credentials/planbot.service/gitlab-token" {
                Ok("glpat-from-credential\n".to_string())
            } else {
                Err(format!("no file {p}"))
            }
        };
        let env = vec![(
            "CREDENTIALS_DIRECTORY".to_string(),
            "/run/credentials/planbot.service/".to_string(),
        )];
        let c = Config::load(&text, &env, &read).unwrap();
        assert_eq!(c.gitlab.token.expose(), "glpat-from-credential");
        // The same name from the environment variable form.
        let env2 = [
            env.clone(),
            vec![(
                "PLANBOT_GITLAB_TOKEN_FILE".to_string(),
                "gitlab-token".to_string(),
            )],
        ]
        .concat();
        let c = Config::load(MINIMAL, &env2, &read).unwrap();
        assert_eq!(c.gitlab.token.expose(), "glpat-from-credential");
        // Without the directory, a relative path is an error that says what it means.
        let e = Config::load(&text, &[], &read).unwrap_err().to_string();
        assert!(e.contains("gitlab.token_file"), "{e}");
        assert!(e.contains("CREDENTIALS_DIRECTORY"), "{e}");
        assert!(e.contains("absolute path"), "{e}");
    }

    #[test]
    fn every_problem_is_reported_at_once_with_where_it_came_from() {
        let text = r#"
fingerprint_key = "0123456789abcdef0123"
[gitlab]
url = "https://gitlab.example.com/"
token_file = "/run/secrets/gl"
webhook_secret = "change-me"
projects = ["infra/homelab"]
[engine]
timeout = "soon"
[proxmox]
endpoint = "https://pve:8006"
api_token = "PVEAPIToken=a@pve!t=uuid-secret"
"#;
        let read = |p: &str| match p {
            "/run/secrets/gl" => Ok("\n".to_string()),
            _ => Err("no such file".to_string()),
        };
        let env = vec![
            (
                "PLANBOT_PLAN_MAX_CONCURRENT_PLANS".to_string(),
                "many".to_string(),
            ),
            ("PLANBOT_ENGINE_ENV_TF_VAR_x".to_string(), "".to_string()),
        ];
        let loaded = Config::load_all(text, &env, &read);
        let shown: Vec<String> = loaded
            .problems
            .iter()
            .map(|p| p.describe("planbot.toml"))
            .collect();
        let expect = [
            "config key `plan.max_concurrent_plans`: expected a whole number\n    from environment variable PLANBOT_PLAN_MAX_CONCURRENT_PLANS",
            "config key `engine.env.TF_VAR_x`: is empty\n    from environment variable PLANBOT_ENGINE_ENV_TF_VAR_x",
            "config key `gitlab.token`: is empty\n    from secret file /run/secrets/gl (named in planbot.toml, line 5)",
            "config key `gitlab.webhook_secret`: is still the example's placeholder `change-me`: put the real value here\n    from planbot.toml, line 6",
            "config key `proxmox.api_token`: starts with `PVEAPIToken=`, which is the HTTP header's prefix, not part of the token: write it as user@realm!tokenid=secret, e.g. planbot@pve!plan=<the UUID pveum printed>\n    from planbot.toml, line 12",
            "config key `engine.timeout`: expected number at 0 (write e.g. \"30m\", \"90s\")\n    from planbot.toml, line 9",
        ];
        for e in &expect {
            let head = e.lines().next().unwrap();
            let got = shown
                .iter()
                .find(|s| s.starts_with(&head[..30.min(head.len())]));
            assert_eq!(
                got.map(String::as_str),
                Some(*e),
                "all:\n{}",
                shown.join("\n")
            );
        }
        assert_eq!(shown.len(), expect.len(), "all:\n{}", shown.join("\n"));
        for s in &shown {
            assert!(!s.contains("uuid-secret"), "a secret in {s}");
        }
        assert!(loaded.into_result().is_err());
    }

    #[test]
    fn proxmox_tokens_must_be_user_at_realm_bang_id_equals_secret() {
        assert_eq!(
            pve_token_problem("planbot@pve!plan=a1b2c3d4-0000-1111-2222-333344445555"),
            None
        );
        assert_eq!(pve_token_problem("root@pam!tofu_01=x"), None);
        for bad in [
            "PVEAPIToken=planbot@pve!plan=uuid",
            "planbot@pve!plan",
            "planbot@pve=uuid",
            "planbot!plan=uuid",
            "planbot@pve!=uuid",
            "planbot@pve!plan=",
            "planbot@pve!1plan=uuid",
            "a1b2c3d4-0000-1111-2222-333344445555",
        ] {
            let problem = pve_token_problem(bad);
            assert!(problem.is_some(), "{bad} accepted");
            assert!(
                !problem.unwrap().contains("uuid"),
                "the secret is quoted for {bad}"
            );
        }
        // Also the provider's own variable in engine.env.
        let text =
            format!("{MINIMAL}\n[engine]\nenv = {{ PROXMOX_VE_API_TOKEN = \"uuid-only\" }}\n");
        let e = Config::load(&text, &[], &no_files).unwrap_err().to_string();
        assert!(
            e.contains("engine.env.PROXMOX_VE_API_TOKEN") && e.contains("no `=secret`"),
            "{e}"
        );
    }

    #[test]
    fn log_format_and_level_are_checked() {
        let c = Config::load(
            &format!("log_format = \"json\"\nlog_level = \"warn,planbot=debug\"\n{MINIMAL}"),
            &[],
            &no_files,
        )
        .unwrap();
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(c.log.level.as_deref(), Some("warn,planbot=debug"));
        let env = vec![("PLANBOT_LOG_FORMAT".to_string(), "json".to_string())];
        assert_eq!(
            Config::load(MINIMAL, &env, &no_files).unwrap().log.format,
            LogFormat::Json
        );
        assert_eq!(
            Config::load(MINIMAL, &[], &no_files).unwrap().log.format,
            LogFormat::Text
        );
        let problems = Config::load_all(
            &format!("log_format = \"xml\"\nlog_level = \"planbot=loud\"\n{MINIMAL}"),
            &[],
            &no_files,
        )
        .problems;
        let keys: Vec<_> = problems.iter().filter_map(|p| p.error.key()).collect();
        assert_eq!(keys, ["log_format", "log_level"], "{problems:?}");
    }

    #[test]
    fn describe_never_prints_secrets() {
        let text = format!(
            "{MINIMAL}\n[engine]\nenv = {{ TF_VAR_x = \"engine-secret-value\", TF_HTTP_PASSWORD = \"state-password-value\", TF_HTTP_USERNAME = \"planbot\" }}\nsecret_env = [\"TF_VAR_x\"]\n[proxmox]\nendpoint = \"https://pve:8006\"\napi_token = \"a@pve!t=uuid-secret\"\n"
        );
        let c = Config::load(&text, &[], &no_files).unwrap();
        let d = c.describe();
        for s in [
            "glpat-secret-token",
            "hook-secret",
            "engine-secret-value",
            "state-password-value",
            "uuid-secret",
            "0123456789abcdef0123",
        ] {
            assert!(!d.contains(s), "{s} leaked in:\n{d}");
        }
        // A user name is no secret: shown, and never scrubbed as one.
        assert!(
            d.contains(r#"engine.env = { TF_HTTP_PASSWORD = (set), TF_HTTP_USERNAME = "planbot", TF_VAR_x = (set) }"#),
            "{d}"
        );
        assert!(!c.secrets().contains(&"planbot".to_string()));
        assert!(c.secrets().contains(&"state-password-value".to_string()));
        assert!(c.secrets().contains(&"engine-secret-value".to_string()));
        assert!(d.contains("gitlab.token = (set)"));
        assert!(d.contains("proxmox.plan.endpoint = https://pve:8006"));
        assert!(!format!("{c:?}").contains("glpat-secret-token"));
        assert!(c.secrets().contains(&"uuid-secret".to_string()));
    }

    #[test]
    fn missing_credentials_are_explained() {
        let text = MINIMAL.replace("webhook_secret = \"hook-secret\"\n", "");
        let e = Config::load(&text, &[], &no_files).unwrap_err();
        assert!(e.to_string().contains("gitlab.webhook_secret"), "{e}");
        let e = Config::load(&MINIMAL.replace("fingerprint_key", "#"), &[], &no_files).unwrap_err();
        assert!(e.to_string().contains("fingerprint_key"), "{e}");
        let e = Config::load(
            &format!("{MINIMAL}\n[engine]\ntimeout = \"soon\"\n"),
            &[],
            &no_files,
        )
        .unwrap_err();
        assert!(e.to_string().contains("engine.timeout"), "{e}");
    }

    #[test]
    fn run_pages_fail_closed_and_sign_in_needs_oauth_and_public_url() {
        let c = Config::load(MINIMAL, &[], &no_files).unwrap();
        assert_eq!(
            c.pages.auth,
            PagesAuth::Loopback,
            "no [gitlab.oauth]: loopback only"
        );
        let oauth = format!(
            "public_url = \"https://planbot.example.com\"\n{MINIMAL}\n[gitlab.oauth]\nclient_id = \"app-id\"\nclient_secret = \"oauth-secret-value\"\n"
        );
        let c = Config::load(&oauth, &[], &no_files).unwrap();
        assert_eq!(
            c.pages.auth,
            PagesAuth::Gitlab,
            "sign-in is the default with oauth"
        );
        assert!(c.secrets().contains(&"oauth-secret-value".to_string()));
        assert!(!c.describe().contains("oauth-secret-value"));
        assert!(c.describe().contains("gitlab.oauth.client_secret = (set)"));
        let e = Config::load(
            &format!("{MINIMAL}\n[pages]\nauth = \"gitlab\"\n"),
            &[],
            &no_files,
        )
        .unwrap_err();
        assert!(e.to_string().contains("gitlab.oauth.client_id"), "{e}");
        let e = Config::load(
            &oauth.replace("public_url = \"https://planbot.example.com\"\n", ""),
            &[],
            &no_files,
        )
        .unwrap_err();
        assert!(e.to_string().contains("`public_url`"), "{e}");
        let e = Config::load(
            &format!("{MINIMAL}\n[pages]\nauth = \"open\"\n"),
            &[],
            &no_files,
        )
        .unwrap_err();
        assert!(e.to_string().contains("pages.auth"), "{e}");
        let c = Config::load(
            &format!("{MINIMAL}\n[pages]\nauth = \"none\"\n"),
            &[],
            &no_files,
        )
        .unwrap();
        assert_eq!(c.pages.auth, PagesAuth::None);
    }

    #[test]
    fn the_example_config_documents_every_key_and_loads() {
        let example = include_str!("../../deploy/planbot.example.toml");
        for (path, kind, secret) in KEYS {
            let (section, key) = path.rsplit_once('.').unwrap_or(("", path));
            if !section.is_empty() {
                assert!(
                    example.contains(&format!("[{section}]")),
                    "section [{section}] missing"
                );
            }
            let documented = example.lines().any(|l| {
                let l = l.trim_start_matches('#').trim();
                l.starts_with(&format!("{key} ="))
                    || (*secret && *kind != Kind::Table && l.starts_with(&format!("{key}_file =")))
            });
            assert!(
                documented,
                "{path} is not documented in deploy/planbot.example.toml"
            );
        }
        let read = |p: &str| {
            Ok(if p.contains("pve-token") {
                "planbot@pve!plan=0123-4567\n".to_string()
            } else {
                format!("secret from {p} 0123456789\n")
            })
        };
        // As shipped (its secrets named in $CREDENTIALS_DIRECTORY), its placeholder stops it,
        // named with its line.
        let env = [(
            CREDENTIALS_DIRECTORY.to_string(),
            "/run/credentials/planbot.service".to_string(),
        )];
        let problems = Config::load_all(example, &env, &read).problems;
        assert_eq!(problems.len(), 1, "{problems:?}");
        let line = example
            .lines()
            .position(|l| l.starts_with("env = { TF_VAR_encryption_passphrase = \"change-me\""))
            .unwrap();
        assert_eq!(
            problems[0].describe("planbot.toml"),
            format!("config key `engine.env.TF_VAR_encryption_passphrase`: is still the example's placeholder `change-me`: put the real value here\n    from planbot.toml, line {}", line + 1)
        );
        let example = example.replace("\"change-me\"", "\"a-real-passphrase\"");
        let c = Config::load(&example, &env, &read).expect("the example loads");
        assert_eq!(
            c.gitlab.token.expose(),
            "secret from /run/credentials/planbot.service/gitlab-token 0123456789"
        );
        assert_eq!(
            c.proxmox.for_plan().endpoint.as_deref(),
            Some("https://pve.example.com:8006")
        );
    }

    #[test]
    fn operator_policy_sets_are_read_and_checked_with_their_line() {
        let text = format!(
            "{MINIMAL}\n[[policy_sets]]\nname = \"guardrails\"\npath = \"/etc/planbot/policies\"\nowners = [\"alice\", \"group:infra/admins\"]\n"
        );
        let c = Config::load(&text, &[], &no_files).unwrap();
        assert_eq!(
            c.policy_sets,
            [PolicySetSpec {
                name: "guardrails".into(),
                path: "/etc/planbot/policies".into(),
                owners: vec![
                    policy::Owner::User("alice".into()),
                    policy::Owner::Group("infra/admins".into())
                ],
                roots: vec![],
                namespace: "main".into(),
            }]
        );
        assert!(c.describe().contains(
            "policy_sets.guardrails = { path = \"/etc/planbot/policies\", namespace = \"main\", owners = [\"alice\", \"group:infra/admins\"], roots = [] }"
        ));

        let text = format!(
            "{MINIMAL}\n[[policy_sets]]\nname = \"a\"\npath = \"/p\"\n\n[[policy_sets]]\nname = \"a\"\npath = \"policies\"\nnamespace = \"x-y\"\nowner = [\"bob\"]\n"
        );
        let problems = Config::load_all(&text, &[], &no_files).problems;
        let shown: Vec<String> = problems
            .iter()
            .map(|p| p.describe("planbot.toml"))
            .collect();
        assert_eq!(
            shown,
            [
                "config key `policy_sets[1].owner`: unknown key (known keys here: name, path, owners, roots, namespace)\n    from planbot.toml, line 13",
                "config key `policy_sets[1].name`: `a` is used twice; names must be unique\n    from planbot.toml, line 13",
                "config key `policy_sets[1].path`: `policies` is not an absolute path (a directory on planbot's host)\n    from planbot.toml, line 13",
                "config key `policy_sets[1].namespace`: `x-y` is not a Rego package (identifiers joined by dots, like `main` or `terraform.proxmox`)\n    from planbot.toml, line 13",
            ]
        );
    }
}
