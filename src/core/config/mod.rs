//! The service's configuration: `planbot.toml`, `PLANBOT_*` overrides and `<key>_file` secrets.
//! Every key is declared once, in `keys`; `load` reads the sources, `build` makes the [`Config`].
//!
//! Pure: the caller hands in the file text, the environment and a file reader, so tests can
//! drive every path without touching the process environment.

mod build;
pub mod keys;
mod load;
mod problem;
#[cfg(test)]
mod tests;

pub use keys::{env_name, Key, Kind, Unset, KEYS};
pub use load::{pve_token_problem, CREDENTIALS_DIRECTORY, PLACEHOLDER};
pub use problem::{ConfigError, Loaded, Origin, Problem};

use crate::core::policy::{self, PolicySetSpec};
use crate::core::store_tls::StoreTls;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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
    /// `[server]`: what one client may hold of the listener (timeouts, connections).
    pub server: ServerConfig,
    pub data_dir: PathBuf,
    /// planbot's own address as users reach it: every link it writes is built from it
    /// ([`crate::core::links`]).
    pub public_url: Option<crate::core::links::PublicUrl>,
    /// Server secret keying the plan fingerprint (`core::fingerprint`).
    pub fingerprint_key: Secret,
    pub gitlab: GitlabConfig,
    pub engine: EngineConfig,
    pub apply: ApplyConfig,
    pub drift: DriftConfig,
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

/// `[server]`: the bounds every client of the listener is held to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The time a client has to send a request's headers, counted from the connection's
    /// opening or the end of its previous response (so also how long an idle keep-alive
    /// connection stays open).
    pub header_timeout: std::time::Duration,
    /// The time a client has to send a whole request body.
    pub body_timeout: std::time::Duration,
    /// Connections open at once; at the limit a new one closes the longest-idle one.
    pub max_connections: usize,
    /// The reverse proxies whose `X-Forwarded-For` names the client (for the per-client limit
    /// of wrong job tokens); from any other peer the header is ignored.
    pub trusted_proxies: Vec<IpNet>,
}

/// An address or a CIDR range (`10.0.0.0/8`, `fd00::/8`, `192.0.2.7`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl IpNet {
    /// `ADDRESS` or `ADDRESS/PREFIX`; the address's bits past the prefix must be zero.
    pub fn parse(text: &str) -> Result<IpNet, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: std::net::IpAddr = addr
            .parse()
            .map_err(|_| format!("`{text}` is not an IP address or a CIDR range"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("`{text}`: the prefix length must be 0 to {max}")),
            },
        };
        let net = IpNet { addr, prefix };
        if net.bits(addr) & net.mask() != net.bits(addr) {
            return Err(format!("`{text}` has bits set past its prefix length"));
        }
        Ok(net)
    }

    fn mask(&self) -> u128 {
        let max = if self.addr.is_ipv4() { 32 } else { 128 };
        match self.prefix {
            0 => 0,
            p => (u128::MAX << (128 - u32::from(p))) >> (128 - max),
        }
    }

    fn bits(&self, ip: std::net::IpAddr) -> u128 {
        match ip {
            std::net::IpAddr::V4(v4) => u128::from(u32::from(v4)),
            std::net::IpAddr::V6(v6) => u128::from(v6),
        }
    }

    /// Whether `ip` is in the range (an IPv4-mapped IPv6 address counts as its IPv4 one).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4()
            && self.bits(ip) & self.mask() == self.bits(self.addr) & self.mask()
    }
}

impl std::fmt::Debug for IpNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let max = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == max {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            header_timeout: std::time::Duration::from_secs(10),
            body_timeout: std::time::Duration::from_secs(30),
            max_connections: 1000,
            trusted_proxies: Vec::new(),
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, Default)]
pub struct MetricsConfig {
    /// `/metrics` answers only `Authorization: Bearer <token>`; unset, it answers 404.
    pub token: Option<Secret>,
}

/// `[sandbox]`: how engine processes are confined (see `capabilities::engine::sandbox`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Refuse to run the engine where the kernel offers no Landlock (default `true`).
    pub required: bool,
    /// `auto` (use Landlock when the kernel has it) or `off` (act as if it had none).
    pub landlock: LandlockSetting,
    /// TCP ports the engine may connect to, besides those of the Proxmox endpoints and the
    /// provider mirror (`sandbox.connect_ports`).
    pub connect_ports: Vec<u16>,
    /// Further paths the engine may read (a CA bundle elsewhere, a provider mirror).
    pub read_paths: Vec<PathBuf>,
    /// `auto` (own user, mount and PID namespaces for every engine process where the kernel
    /// allows them) or `off` (act as if it did not).
    pub namespaces: LandlockSetting,
    /// The memory one engine process may allocate, in bytes (`sandbox.memory_max`).
    pub memory_max: u64,
    /// What one plan run's checkout, plan-file dir and plugin cache may hold, in bytes
    /// (`sandbox.disk_max`).
    pub disk_max: u64,
    /// `auto` (each run's engine processes in a cgroup of their own where the host delegates
    /// one) or `off`.
    pub cgroup: LandlockSetting,
    /// The memory all engine processes of one run may use together, in bytes
    /// (`sandbox.job_memory_max`).
    pub job_memory_max: u64,
    /// The tasks (processes and threads) one run may have at once (`sandbox.job_tasks_max`).
    pub job_tasks_max: u64,
}

/// `sandbox.landlock` and `sandbox.namespaces`: use the kernel feature, or act as if it had none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockSetting {
    Auto,
    Off,
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
    /// `engine.binary`; unset, `tofu` on `PATH`, else `terraform` (resolved where it runs).
    pub binary: Option<String>,
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

/// `[drift]`: the drift check of every root (`flows::drift`).
#[derive(Debug, Clone)]
pub struct DriftConfig {
    /// The drift issue's labels; never empty (the first finds the issue again).
    pub labels: Vec<String>,
    /// When `planbot serve` checks drift: `Some` when `drift.enabled`.
    pub schedule: Option<crate::core::drift_schedule::DriftSchedule>,
    /// `drift.schedule` and `drift.time_zone` as written.
    pub schedule_text: String,
    pub time_zone: String,
}

#[derive(Debug, Clone)]
pub struct PlanConfig {
    pub max_concurrent_plans: usize,
    /// The most workers one author's (or one MR's) jobs hold at once.
    pub workers_per_author: usize,
    /// The deadline of one whole job.
    pub job_timeout: std::time::Duration,
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
    /// value came from (file line, environment variable, secret file), and the warnings.
    pub fn load_all(
        text: &str,
        env: &[(String, String)],
        read_file: &dyn Fn(&str) -> Result<String, String>,
    ) -> Loaded {
        load::load_all(text, env, read_file)
    }
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
