//! From one value per key to the [`Config`]: each value read as its declared type (serde), the
//! checks a type cannot say (ranges, URLs, keys that need each other), defaults from [`KEYS`].
//!
//! [`KEYS`]: super::keys::KEYS

use super::keys::{self, env_value, Unset, POLICY_SETS};
use super::problem::ConfigError;
use super::*;
use crate::core::drift_schedule::{DriftSchedule, ScheduleError};
use serde::de::DeserializeOwned;
use toml::Value;

/// The values of a config's keys, taken one by one as the config is built, and the problems
/// found on the way (each bad value is reported and replaced by its default, so every problem
/// is found in one pass).
pub(super) struct Values {
    flat: BTreeMap<String, Value>,
    problems: Vec<ConfigError>,
}

impl Values {
    pub(super) fn new(flat: BTreeMap<String, Value>) -> Values {
        Values {
            flat,
            problems: Vec::new(),
        }
    }

    pub(super) fn into_problems(self) -> Vec<ConfigError> {
        self.problems
    }

    fn invalid(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.problems.push(ConfigError::Invalid {
            key: key.into(),
            message: message.into(),
        });
    }

    fn missing(&mut self, key: &str, hint: &str) {
        self.problems.push(ConfigError::Missing {
            key: key.into(),
            hint: hint.into(),
        });
    }

    /// `key` as the file or the environment gives it, read as a `T`; `None` when not set or
    /// of the wrong type (then a problem).
    fn given<T: DeserializeOwned>(&mut self, key: &str) -> Option<T> {
        let decl = keys::key(key).unwrap_or_else(|| panic!("`{key}` is not declared in KEYS"));
        let value = self.flat.remove(key)?;
        let found = value.type_str();
        match T::deserialize(value) {
            Ok(v) => Some(v),
            Err(_) => {
                // A duration or a size is a string with its unit: say how one is written.
                let example = match decl.kind {
                    keys::Kind::Duration => {
                        " (write e.g. \"30m\", \"90s\": a number and its unit, in quotes)"
                    }
                    keys::Kind::Size => {
                        " (write e.g. \"4 GiB\", \"512 MiB\": a number and its unit, in quotes)"
                    }
                    _ => "",
                };
                self.invalid(
                    key,
                    format!("expected {}, found {found}{example}", decl.kind.expected()),
                );
                None
            }
        }
    }

    /// `key` as given, else its declared default ([`Unset::Value`]).
    fn get<T: DeserializeOwned>(&mut self, key: &str) -> T {
        if let Some(v) = self.given(key) {
            return v;
        }
        let decl = keys::key(key).expect("declared");
        let Unset::Value(text) = decl.unset else {
            panic!("`{key}` has no default in KEYS");
        };
        env_value(key, decl.kind, text)
            .ok()
            .and_then(|v| T::deserialize(v).ok())
            .unwrap_or_else(|| panic!("the default of `{key}` is not a {}", decl.kind.name()))
    }

    /// A duration such as `"30m"`: as given, else the declared default.
    fn duration(&mut self, key: &str) -> Duration {
        let text: String = self.get(key);
        match humantime::parse_duration(&text) {
            Ok(d) => d,
            Err(e) => {
                self.invalid(key, format!("{e} (write e.g. \"30m\", \"90s\")"));
                self.flat.remove(key);
                self.get::<String>(key)
                    .parse::<humantime::Duration>()
                    .map(Into::into)
                    .expect("a valid default duration")
            }
        }
    }

    /// A size such as `"4 GiB"`, of at least [`SIZE_FLOOR`]: as given, else the declared
    /// default (and a problem).
    fn size(&mut self, key: &str) -> u64 {
        let text: String = self.get(key);
        if let Some(n) = parse_size(&text).filter(|n| *n >= SIZE_FLOOR) {
            return n;
        }
        self.invalid(
            key,
            format!(
                "`{text}`: expected a size of at least 64 MiB, such as \"512 MiB\" or \"4 GiB\""
            ),
        );
        let default: String = self.get(key);
        parse_size(&default).expect("a valid default size")
    }

    /// A duration within `range` (else the default, and a problem saying `expected`).
    fn duration_within(
        &mut self,
        key: &str,
        range: std::ops::RangeInclusive<Duration>,
        expected: &str,
    ) -> Duration {
        let d = self.duration(key);
        if range.contains(&d) {
            return d;
        }
        self.invalid(key, expected);
        let default: String = self.get(key);
        humantime::parse_duration(&default).expect("a valid default duration")
    }

    /// One of `choices` (`(word, value)`), else `fallback` and a problem saying `expected`.
    fn choice<T: Copy>(
        &mut self,
        key: &str,
        choices: &[(&str, T)],
        fallback: T,
        expected: impl Fn(&str) -> String,
    ) -> T {
        let Some(word) = self.given::<String>(key) else {
            return fallback;
        };
        match choices.iter().find(|(w, _)| *w == word) {
            Some((_, v)) => *v,
            None => {
                self.invalid(key, expected(&word));
                fallback
            }
        }
    }

    /// A required key: as given, else a problem with `hint` and `stand_in`.
    fn required<T: DeserializeOwned>(&mut self, key: &str, hint: &str, stand_in: T) -> T {
        match self.given(key) {
            Some(v) => v,
            None => {
                if !self.problems.iter().any(|p| p.key() == Some(key)) {
                    self.missing(key, hint);
                }
                stand_in
            }
        }
    }

    /// A whole number in `range` (else the default, and a problem naming the range and
    /// `what` it counts).
    fn number_within(
        &mut self,
        key: &str,
        range: std::ops::RangeInclusive<i64>,
        what: &str,
    ) -> i64 {
        match self.flat.get(key) {
            Some(Value::Integer(n)) if range.contains(n) => {}
            None => {}
            Some(other) => {
                let message = format!(
                    "expected {what} from {} to {}, found `{other}`",
                    range.start(),
                    range.end()
                );
                self.flat.remove(key);
                self.invalid(key, message);
            }
        }
        self.get(key)
    }

    /// A list of `T`, each item checked by `item` (which says what is wrong with one).
    fn list<T>(&mut self, key: &str, item: impl Fn(Value) -> Result<T, String>) -> Option<Vec<T>> {
        let items: Vec<Value> = self.given(key)?;
        let mut out = Vec::new();
        for v in items {
            match item(v) {
                Ok(t) => out.push(t),
                Err(message) => self.invalid(key, message),
            }
        }
        Some(out)
    }
}

/// A stand-in for a bad secret while the remaining keys are checked (never used to run).
pub(super) const FALLBACK_SECRET: &str = "planbot-fallback-secret-0123456789";

/// The config from the keys' values, one section at a time, in the order problems are
/// reported in.
pub(super) fn build(v: &mut Values) -> Config {
    let listen = listen(v);
    let server = server(v);
    let data_dir = PathBuf::from(v.get::<String>("data_dir"));
    let public_url = v.given::<String>("public_url").and_then(|u| {
        match crate::core::links::PublicUrl::parse(&u) {
            Ok(u) => Some(u),
            Err(e) => {
                v.invalid("public_url", e);
                None
            }
        }
    });
    let fingerprint_key = fingerprint_key(v);
    let gitlab = gitlab(v);
    let engine = engine(v);
    let sandbox = sandbox(v);
    let store = store(v, &data_dir);
    let (pages, metrics) = pages(v, public_url.as_ref());
    let apply = ApplyConfig {
        job_name: v.get("apply.job_name"),
        open_issue_on_failure: v.get("apply.open_issue_on_failure"),
    };
    let drift = drift(v);
    let plan = plan(v);
    let proxmox = proxmox(v);
    let state = state(v);
    let modules = modules(v);
    let policy_sets = policy_sets(v);
    let log = log(v);
    debug_assert!(
        v.flat.is_empty(),
        "keys declared but never read: {:?}",
        v.flat.keys().collect::<Vec<_>>()
    );
    Config {
        log,
        listen,
        server,
        data_dir,
        public_url,
        fingerprint_key: Secret::new(fingerprint_key),
        gitlab,
        engine,
        apply,
        drift,
        plan,
        proxmox,
        sandbox,
        pages,
        metrics,
        store,
        state,
        modules,
        policy_sets,
    }
}

/// `listen`: an address like `0.0.0.0:8080`.
fn listen(v: &mut Values) -> SocketAddr {
    let text: String = v.get("listen");
    text.parse().unwrap_or_else(|_| {
        v.invalid(
            "listen",
            format!("`{text}` is not an address like 0.0.0.0:8080"),
        );
        SocketAddr::from(([0, 0, 0, 0], 8080))
    })
}

/// `fingerprint_key`: required, at least 16 characters.
fn fingerprint_key(v: &mut Values) -> String {
    let key = v.required(
        "fingerprint_key",
        "a long random server secret, e.g. `openssl rand -hex 32` (keep it stable: reviewed plans are matched by it)",
        FALLBACK_SECRET.to_string(),
    );
    if key.len() < 16 {
        v.invalid(
            "fingerprint_key",
            "too short: use at least 16 random characters (`openssl rand -hex 32`)",
        );
    }
    key
}

/// `[gitlab]`: the URL, the token, how webhooks are authenticated, and the projects.
fn gitlab(v: &mut Values) -> GitlabConfig {
    let url: String = v.required(
        "gitlab.url",
        "the GitLab base URL, e.g. https://gitlab.example.com",
        "https://gitlab.invalid".into(),
    );
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        v.invalid(
            "gitlab.url",
            "expected a URL like https://gitlab.example.com",
        );
    }
    let token: String = v.required(
        "gitlab.token",
        "a token with api scope (or set PLANBOT_GITLAB_TOKEN / gitlab.token_file)",
        FALLBACK_SECRET.into(),
    );
    let webhook_secret = v.given::<String>("gitlab.webhook_secret").map(Secret::new);
    let signing_token = v.given::<String>("gitlab.signing_token");
    if let Some(t) = &signing_token {
        if crate::core::webhook::decode_signing_token(t).is_none() {
            v.invalid(
                "gitlab.signing_token",
                "expected `whsec_` followed by base64 (as GitLab shows it)",
            );
        }
    }
    if webhook_secret.is_none() && signing_token.is_none() {
        v.missing(
            "gitlab.webhook_secret",
            "set the webhook's secret token (and/or gitlab.signing_token); unauthenticated webhooks are not accepted",
        );
    }
    let projects = projects(v);
    GitlabConfig {
        url: url.trim_end_matches('/').to_string(),
        token: Secret::new(token),
        webhook_secret,
        signing_token: signing_token.map(Secret::new),
        projects: Allowlist(projects),
    }
}

/// `gitlab.projects`: a non-empty list of project paths and numeric ids.
fn projects(v: &mut Values) -> Vec<ProjectRef> {
    let projects = v.list("gitlab.projects", |item| match item {
        Value::Integer(n) if n > 0 => Ok(ProjectRef::Id(n as u64)),
        Value::String(s) if s.trim().parse::<u64>().is_ok() => {
            Ok(ProjectRef::Id(s.trim().parse().unwrap_or(0)))
        }
        Value::String(s) if !s.trim().is_empty() => {
            Ok(ProjectRef::Path(s.trim().trim_matches('/').to_string()))
        }
        other => Err(format!(
            "`{other}` is neither a project path nor a numeric id"
        )),
    });
    match projects {
        Some(p) if !p.is_empty() => p,
        // A bad list is reported already: a stand-in, so it is not also called missing.
        _ if v
            .problems
            .iter()
            .any(|p| p.key() == Some("gitlab.projects")) =>
        {
            vec![ProjectRef::Id(0)]
        }
        _ => {
            v.missing("gitlab.projects", "list the projects planbot serves, e.g. [\"infra/homelab\"]; every other project is ignored");
            Vec::new()
        }
    }
}

/// `[engine]`, `[engine.plan]`, `[engine.apply]`: the binary, its time limits, its environment
/// and the provider mirror.
fn engine(v: &mut Values) -> EngineConfig {
    let binary = v.given::<String>("engine.binary");
    let timeout = v.duration("engine.timeout");
    let lock_timeout = v.duration("engine.lock_timeout");
    let grace = v.duration("engine.grace");
    let env = env_table(v, "engine.env");
    let plan_env = env_table(v, "engine.plan.env");
    let apply_env = env_table(v, "engine.apply.env");
    let provider_mirror = v.given::<String>("engine.provider_mirror");
    let max_plan_json_mib =
        v.number_within("engine.max_plan_json_mib", 1..=4096, "a number of MiB") as u64;
    if let Some(m) = &provider_mirror {
        if !(m.starts_with("https://") || m.starts_with('/')) {
            v.invalid("engine.provider_mirror", "expected an https:// URL (network mirror) or an absolute directory (filesystem mirror)");
        }
    }
    let secret_env = v
        .list("engine.secret_env", |item| match item {
            Value::String(n)
                if !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
            {
                Ok(n)
            }
            other => Err(format!("`{other}` is not an environment variable name")),
        })
        .unwrap_or_default();
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

/// One table of engine environment variables (`engine.env`, `engine.plan.env`, …).
fn env_table(v: &mut Values, path: &str) -> BTreeMap<String, Secret> {
    let table: BTreeMap<String, Value> = v.given(path).unwrap_or_default();
    let mut env = BTreeMap::new();
    for (k, value) in table {
        let Value::String(s) = value else {
            v.invalid(
                format!("{path}.{k}"),
                format!("expected a string, found {}", value.type_str()),
            );
            continue;
        };
        let forbidden = k.starts_with("TF_CLI_ARGS")
            || k.starts_with("TF_LOG")
            || ["PATH", "HOME", "TMPDIR", "TF_CLI_CONFIG_FILE"].contains(&k.as_str());
        if forbidden || k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            v.invalid(format!("{path}.{k}"), "not allowed: planbot sets PATH/HOME/TMPDIR/TF_CLI_CONFIG_FILE itself and never passes TF_CLI_ARGS*/TF_LOG*");
            continue;
        }
        env.insert(k, Secret::new(s));
    }
    env
}

/// `[sandbox]`.
fn sandbox(v: &mut Values) -> SandboxConfig {
    let switch = |v: &mut Values, key: &str| {
        v.choice(
            key,
            &[
                ("auto", LandlockSetting::Auto),
                ("off", LandlockSetting::Off),
            ],
            LandlockSetting::Auto,
            |other| format!("`{other}`: expected \"auto\" or \"off\""),
        )
    };
    let memory_max = v.size("sandbox.memory_max");
    let disk_max = v.size("sandbox.disk_max");
    let job_memory_max = v.size("sandbox.job_memory_max");
    let job_tasks_max =
        v.number_within("sandbox.job_tasks_max", 16..=4_194_304, "a number of tasks") as u64;
    SandboxConfig {
        required: v.get("sandbox.required"),
        landlock: switch(v, "sandbox.landlock"),
        connect_ports: v
            .list("sandbox.connect_ports", |item| match item {
                Value::Integer(n) if (1..=65535).contains(&n) => Ok(n as u16),
                other => Err(format!("`{other}` is not a TCP port (1 to 65535)")),
            })
            .unwrap_or_else(|| v.get("sandbox.connect_ports")),
        read_paths: v
            .list("sandbox.read_paths", |item| match item {
                Value::String(p) if p.starts_with('/') => Ok(PathBuf::from(p)),
                other => Err(format!("`{other}` is not an absolute path")),
            })
            .unwrap_or_default(),
        namespaces: switch(v, "sandbox.namespaces"),
        memory_max,
        disk_max,
        cgroup: switch(v, "sandbox.cgroup"),
        job_memory_max,
        job_tasks_max,
    }
}

/// The least a size key takes (`sandbox.memory_max`, `disk_max`, `job_memory_max`): less
/// leaves an engine no room to start.
const SIZE_FLOOR: u64 = 64 << 20;

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

/// `[store]`: where deliveries, the queue, runs and applies live (the embedded SQLite file in
/// `data_dir` unless `url` says PostgreSQL), the PostgreSQL password, and its TLS (the URL's
/// `sslmode` and the CA, checked here: `prefer`/`allow` are refused).
fn store(v: &mut Values, data_dir: &std::path::Path) -> StoreConfig {
    let default_store = StoreUrl::Sqlite(data_dir.join("planbot.db"));
    let url = match v.given::<String>("store.url") {
        None => default_store,
        Some(text) => StoreUrl::parse(&text).unwrap_or_else(|message| {
            v.invalid("store.url", message);
            default_store
        }),
    };
    let store = StoreConfig {
        url,
        password: v.given::<String>("store.password").map(Secret::new),
        ca_file: v.given::<String>("store.ca_file").map(PathBuf::from),
        lease: v.duration_within(
            "store.lease",
            Duration::from_secs(1)..=Duration::from_secs(600),
            "expected a duration from 1s to 10m, e.g. \"30s\"",
        ),
    };
    if let Some(Err(message)) = store.tls() {
        let key = if message.contains("store.ca_file") {
            "store.ca_file"
        } else {
            "store.url"
        };
        v.invalid(key, message);
    }
    store
}

/// `[pages]`, `[gitlab.oauth]` and `[metrics]`.
fn pages(
    v: &mut Values,
    public_url: Option<&crate::core::links::PublicUrl>,
) -> (PagesConfig, MetricsConfig) {
    let client_id = v.given::<String>("gitlab.oauth.client_id");
    let client_secret = v.given::<String>("gitlab.oauth.client_secret");
    let oauth = match (client_id, client_secret) {
        (None, None) => None,
        (Some(id), Some(secret)) if !id.trim().is_empty() && !secret.is_empty() => {
            Some(OAuthConfig {
                client_id: id.trim().to_string(),
                client_secret: Secret::new(secret),
            })
        }
        _ => {
            v.missing("gitlab.oauth.client_id", "[gitlab.oauth] needs both client_id and client_secret (or client_secret_file): the Application ID and Secret GitLab shows for the application");
            None
        }
    };
    let auth = v.choice(
        "pages.auth",
        &[
            ("gitlab", PagesAuth::Gitlab),
            ("loopback", PagesAuth::Loopback),
            ("none", PagesAuth::None),
        ],
        if oauth.is_some() {
            PagesAuth::Gitlab
        } else {
            PagesAuth::Loopback
        },
        |other| format!("`{other}`: expected \"gitlab\", \"loopback\" or \"none\""),
    );
    let auth = match auth {
        PagesAuth::Gitlab if oauth.is_none() => {
            v.missing("gitlab.oauth.client_id", "pages.auth = \"gitlab\" signs users in with GitLab: register planbot as a GitLab application and set [gitlab.oauth] client_id and client_secret_file");
            PagesAuth::Loopback
        }
        PagesAuth::Gitlab if public_url.is_none() => {
            v.missing("public_url", "signing in with GitLab needs planbot's own address: GitLab sends users back to <public_url>/auth/callback");
            PagesAuth::Loopback
        }
        auth => auth,
    };
    let session_lifetime = v.duration_within(
        "pages.session_lifetime",
        Duration::from_secs(60)..=Duration::from_secs(30 * 86400),
        "expected a duration from 1m to 30d, e.g. \"8h\"",
    );
    let token = v.given::<String>("metrics.token");
    if let Some(t) = &token {
        if t.len() < 16 || !t.bytes().all(|b| b.is_ascii_graphic()) {
            v.invalid(
                "metrics.token",
                "use at least 16 printable characters without spaces (`openssl rand -hex 32`)",
            );
        }
    }
    (
        PagesConfig {
            auth,
            oauth,
            session_lifetime,
        },
        MetricsConfig {
            token: token.map(Secret::new),
        },
    )
}

/// `[server]`: the header and body timeouts (1s to 10m), the connection limit, the trusted
/// proxies.
fn server(v: &mut Values) -> ServerConfig {
    let range = Duration::from_secs(1)..=Duration::from_secs(600);
    ServerConfig {
        header_timeout: v.duration_within(
            "server.header_timeout",
            range.clone(),
            "expected a duration from 1s to 10m, e.g. \"10s\"",
        ),
        body_timeout: v.duration_within(
            "server.body_timeout",
            range,
            "expected a duration from 1s to 10m, e.g. \"30s\"",
        ),
        max_connections: v.number_within("server.max_connections", 1..=1_000_000, "a number")
            as usize,
        trusted_proxies: v
            .list("server.trusted_proxies", |item| match item {
                Value::String(s) => super::IpNet::parse(&s),
                other => Err(format!("`{other}` is not an IP address or a CIDR range")),
            })
            .unwrap_or_default(),
    }
}

/// `plan.max_concurrent_plans`: from 1 to 64.
/// `[plan]`: the worker pool, each author's share of it, the job deadline.
fn plan(v: &mut Values) -> PlanConfig {
    let max_concurrent_plans =
        v.number_within("plan.max_concurrent_plans", 1..=64, "a number") as usize;
    let workers_per_author = match v.flat.get("plan.workers_per_author") {
        Some(Value::Integer(n)) if (1..=64).contains(n) => *n as usize,
        None => max_concurrent_plans.saturating_sub(1).max(1),
        Some(other) => {
            let message = format!("expected a number from 1 to 64, found `{other}`");
            v.flat.remove("plan.workers_per_author");
            v.invalid("plan.workers_per_author", message);
            max_concurrent_plans.saturating_sub(1).max(1)
        }
    };
    v.flat.remove("plan.workers_per_author");
    let job_timeout = v.duration_within(
        "plan.job_timeout",
        std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(24 * 3600),
        "expected a duration from 1s to 24h",
    );
    PlanConfig {
        max_concurrent_plans,
        workers_per_author,
        job_timeout,
    }
}

/// `[proxmox]`, `[proxmox.plan]`, `[proxmox.apply]`: the endpoints and the apply's SSH.
fn proxmox(v: &mut Values) -> ProxmoxConfig {
    let apply_ssh = apply_ssh(v);
    ProxmoxConfig {
        default: endpoint(v, "proxmox").unwrap_or_default(),
        plan: endpoint(v, "proxmox.plan"),
        apply: endpoint(v, "proxmox.apply"),
        apply_ssh,
    }
}

/// The endpoint keys of one `[proxmox…]` section: `None` when none is set.
fn endpoint(v: &mut Values, section: &str) -> Option<ProxmoxEndpoint> {
    let k = |name: &str| format!("{section}.{name}");
    let endpoint = v.given::<String>(&k("endpoint"));
    let api_token = v.given::<String>(&k("api_token")).map(Secret::new);
    let insecure = v.given::<bool>(&k("insecure"));
    let ca_file = v.given::<String>(&k("ca_file")).map(PathBuf::from);
    if endpoint.is_none() && api_token.is_none() && insecure.is_none() && ca_file.is_none() {
        return None;
    }
    if let Some(e) = &endpoint {
        if !(e.starts_with("https://") || e.starts_with("http://")) {
            v.invalid(
                k("endpoint"),
                "expected a URL like https://pve.example.com:8006",
            );
        }
    }
    Some(ProxmoxEndpoint {
        endpoint,
        api_token,
        insecure: insecure.unwrap_or(false),
        ca_file,
    })
}

/// `[proxmox.apply] ssh_username`, `ssh_private_key(_file)`, `ssh_agent_socket`.
fn apply_ssh(v: &mut Values) -> Option<SshConfig> {
    let username = v.given::<String>("proxmox.apply.ssh_username");
    let private_key = v.given::<String>("proxmox.apply.ssh_private_key");
    let agent_socket = v
        .given::<String>("proxmox.apply.ssh_agent_socket")
        .map(PathBuf::from);
    let Some(username) = username else {
        if private_key.is_some() || agent_socket.is_some() {
            v.missing(
                "proxmox.apply.ssh_username",
                "the user the provider logs in as on the nodes (e.g. \"root\")",
            );
        }
        return None;
    };
    if private_key.is_none() && agent_socket.is_none() {
        v.missing(
            "proxmox.apply.ssh_private_key_file",
            "the SSH private key for that user (or ssh_agent_socket)",
        );
        return None;
    }
    if let Some(k) = &private_key {
        if !k.contains("PRIVATE KEY-----") {
            v.invalid(
                "proxmox.apply.ssh_private_key",
                "not a PEM/OpenSSH private key (it must contain `-----BEGIN … PRIVATE KEY-----`)",
            );
            return None;
        }
    }
    Some(SshConfig {
        username,
        private_key: private_key.map(|k| Secret::new(k + "\n")),
        agent_socket,
    })
}

/// `[<section>] username` and `token` (or `token_file`): `None` without a token. GitLab reads
/// only the token of a personal, project or group access token; the user name defaults.
fn credential(v: &mut Values, section: &str) -> Option<GitlabCredential> {
    let username: String = v.get(&format!("{section}.username"));
    let token = v.given::<String>(&format!("{section}.token"))?;
    if username.trim().is_empty() || username.contains(':') {
        v.invalid(format!("{section}.username"), "expected a user name without `:` (any word for an access token; the token's user name for a deploy token)");
    }
    Some(GitlabCredential {
        username: username.trim().to_string(),
        token: Secret::new(token.trim()),
    })
}

/// `[state]`: the default for roots that say nothing, and the tokens per trust level.
fn state(v: &mut Values) -> StateConfig {
    let default = v.choice(
        "state.default",
        &[("own", StateDefault::Own), ("gitlab", StateDefault::Gitlab)],
        StateDefault::Own,
        |other| format!("`{other}`: expected \"own\" (the backend each root configures) or \"gitlab\" (the project's GitLab-managed state named after the root)"),
    );
    StateConfig {
        default,
        plan: credential(v, "state.plan"),
        apply: credential(v, "state.apply"),
    }
}

/// `[drift]`: the drift issue's labels (at least one, none blank) and the schedule (checked
/// whether or not it is enabled, so a typo shows before it is switched on).
fn drift(v: &mut Values) -> DriftConfig {
    let labels = v.list("drift.labels", |item| match item {
        Value::String(s) if !s.trim().is_empty() && !s.contains(',') => Ok(s.trim().to_string()),
        other => Err(format!(
            "`{other}` is not a label (a non-empty name without a comma)"
        )),
    });
    let labels = match labels {
        Some(l) if !l.is_empty() => l,
        Some(_) => {
            v.invalid(
                "drift.labels",
                "the drift issue needs at least one label: it is found again by the first",
            );
            vec!["drift".to_string()]
        }
        None => {
            let default: Vec<String> = v.get("drift.labels");
            default
        }
    };
    let enabled: bool = v.get("drift.enabled");
    let schedule_text: String = v.get("drift.schedule");
    let time_zone: String = v.get("drift.time_zone");
    let schedule = match DriftSchedule::parse(&schedule_text, &time_zone) {
        Ok(s) => enabled.then_some(s),
        Err(errors) => {
            for e in errors {
                let key = match e {
                    ScheduleError::Cron { .. } => "drift.schedule",
                    ScheduleError::TimeZone { .. } => "drift.time_zone",
                };
                v.invalid(key, e.to_string());
            }
            None
        }
    };
    DriftConfig {
        labels,
        schedule,
        schedule_text,
        time_zone,
    }
}

/// `[modules]`: the module projects (for `doctor`) and the tokens per trust level.
fn modules(v: &mut Values) -> ModulesConfig {
    let projects = v
        .list("modules.projects", |item| match item {
            Value::String(s) if !s.trim().trim_matches('/').is_empty() => {
                Ok(s.trim().trim_matches('/').to_string())
            }
            other => Err(format!(
                "`{other}` is not a project path like \"infra/modules\""
            )),
        })
        .unwrap_or_default();
    ModulesConfig {
        projects,
        plan: credential(v, "modules.plan"),
        apply: credential(v, "modules.apply"),
    }
}

/// `log_format` (`text` or `json`) and `log_level` (an `EnvFilter` directive).
fn log(v: &mut Values) -> LogConfig {
    let format = v.choice(
        "log_format",
        &[("text", LogFormat::Text), ("json", LogFormat::Json)],
        LogFormat::Text,
        |other| format!("expected \"text\" or \"json\", found `{other}`"),
    );
    let level = v.given::<String>("log_level");
    if let Some(level) = &level {
        if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(level) {
            v.invalid(
                "log_level",
                format!("{e} (write e.g. \"info\", \"warn\" or \"info,planbot=debug\")"),
            );
        }
    }
    LogConfig { format, level }
}

/// `[[policy_sets]]`: each with a unique name, an absolute `path` (a directory on planbot's
/// host), `owners`, `roots` (root names, in any repository) and a Rego `namespace`.
fn policy_sets(v: &mut Values) -> Vec<PolicySetSpec> {
    let items = match v.flat.remove(POLICY_SETS) {
        None => return Vec::new(),
        Some(Value::Array(items)) => items,
        Some(other) => {
            v.invalid(
                POLICY_SETS,
                format!(
                    "expected [[policy_sets]] tables, found {}",
                    other.type_str()
                ),
            );
            return Vec::new();
        }
    };
    let mut sets: Vec<PolicySetSpec> = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        let mut entry = PolicySetEntry {
            index,
            table: toml::Table::new(),
            problems: &mut v.problems,
        };
        let Value::Table(table) = item else {
            entry.invalid("name", "expected a table".into());
            continue;
        };
        entry.table = table;
        if let Some(set) = entry.read(&sets) {
            sets.push(set);
        }
    }
    sets
}

/// One `[[policy_sets]]` table as it is read: its keys are taken one by one, each problem
/// reported at `policy_sets[index].key`.
struct PolicySetEntry<'a> {
    index: usize,
    table: toml::Table,
    problems: &'a mut Vec<ConfigError>,
}

impl PolicySetEntry<'_> {
    /// The keys a policy set has.
    const KNOWN: [&'static str; 5] = ["name", "path", "owners", "roots", "namespace"];

    fn key(&self, k: &str) -> String {
        format!("{POLICY_SETS}[{}].{k}", self.index)
    }

    fn invalid(&mut self, k: &str, message: String) {
        let key = self.key(k);
        self.problems.push(ConfigError::Invalid { key, message });
    }

    fn missing(&mut self, k: &str, hint: &str) {
        let key = self.key(k);
        self.problems.push(ConfigError::Missing {
            key,
            hint: hint.into(),
        });
    }

    /// The set, unless its name or path is missing; every problem with it reported (a set
    /// named like one of `earlier` too).
    fn read(&mut self, earlier: &[PolicySetSpec]) -> Option<PolicySetSpec> {
        let name = self.string("name");
        let path = self.string("path");
        let namespace = self
            .string("namespace")
            .unwrap_or_else(|| policy::DEFAULT_NAMESPACE.to_string());
        let owners = self.list("owners");
        let roots = self.list("roots");
        self.report_unknown_keys();
        let name = self.checked_name(name, earlier)?;
        let path = self.checked_path(path)?;
        if let Err(e) = policy::sets::check_namespace(&namespace) {
            self.invalid("namespace", e);
        }
        let owners = owners
            .iter()
            .filter_map(|o| {
                policy::Owner::parse(o)
                    .map_err(|e| self.invalid("owners", e))
                    .ok()
            })
            .collect();
        Some(PolicySetSpec {
            name,
            path,
            owners,
            roots,
            namespace,
        })
    }

    /// Key `k`, a string (else a problem).
    fn string(&mut self, k: &str) -> Option<String> {
        match self.table.remove(k) {
            None => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                self.invalid(k, format!("expected a string, found {}", other.type_str()));
                None
            }
        }
    }

    /// Key `k`, a list of strings (each item that is not one, a problem).
    fn list(&mut self, k: &str) -> Vec<String> {
        match self.table.remove(k) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .filter_map(|v| match v {
                    Value::String(s) => Some(s),
                    other => {
                        self.invalid(k, format!("`{other}` is not a string"));
                        None
                    }
                })
                .collect(),
            Some(other) => {
                self.invalid(k, format!("expected a list, found {}", other.type_str()));
                Vec::new()
            }
        }
    }

    /// Every key left: not one a policy set has (with the nearest that is).
    fn report_unknown_keys(&mut self) {
        let unknown: Vec<String> = self.table.keys().cloned().collect();
        for k in unknown {
            let hint = match crate::core::suggest::nearest(&k, Self::KNOWN) {
                Some(near) => format!("did you mean `{near}`?"),
                None => format!("known keys here: {}", Self::KNOWN.join(", ")),
            };
            self.invalid(&k, format!("unknown key ({hint})"));
        }
    }

    /// The name: required, valid, and not one of an `earlier` set.
    fn checked_name(&mut self, name: Option<String>, earlier: &[PolicySetSpec]) -> Option<String> {
        let Some(name) = name else {
            self.missing("name", "each policy set needs a name, shown on the MR");
            return None;
        };
        if let Err(e) = policy::sets::check_name(&name) {
            self.invalid("name", e);
        } else if earlier.iter().any(|s| s.name == name) {
            self.invalid(
                "name",
                format!("`{name}` is used twice; names must be unique"),
            );
        }
        Some(name)
    }

    /// The path: required, and absolute (a directory on planbot's host).
    fn checked_path(&mut self, path: Option<String>) -> Option<String> {
        let Some(path) = path else {
            self.missing(
                "path",
                "the directory of .rego files on planbot's host, e.g. /etc/planbot/policies",
            );
            return None;
        };
        if !path.starts_with('/') {
            self.invalid(
                "path",
                format!("`{path}` is not an absolute path (a directory on planbot's host)"),
            );
        }
        Some(path)
    }
}
