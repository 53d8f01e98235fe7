//! Every key of `planbot.toml`, declared once: its type, default, whether it is a secret, what it
//! does and how `--check` shows it. The parser, the `PLANBOT_*` variables, `describe`, the secret
//! list and the settings table in the docs are all read from [`KEYS`].

use super::problem::ConfigError;
use super::{Config, GitlabCredential, LandlockSetting, ProxmoxEndpoint, Secret, StateDefault};
use std::collections::BTreeMap;
use std::path::PathBuf;
use toml::Value;

/// What a value of a key is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Str,
    Int,
    Bool,
    /// A duration string such as `"30m"` or `"90s"`.
    Duration,
    /// A size string such as `"512 MiB"` or `"4 GiB"`.
    Size,
    /// A list; in a variable, a TOML array or a comma-separated list.
    List,
    /// A free-form table of strings (`engine.env`); in variables, one `<VAR>_<NAME>` per entry.
    Table,
}

impl Kind {
    /// As the settings table names it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Str => "string",
            Kind::Int => "integer",
            Kind::Bool => "true/false",
            Kind::Duration => "duration",
            Kind::Size => "size",
            Kind::List => "list",
            Kind::Table => "table",
        }
    }

    /// What a value of the wrong type was expected to be, for the error.
    pub fn expected(self) -> &'static str {
        match self {
            Kind::Str | Kind::Duration | Kind::Size => "a string",
            Kind::Int => "a whole number",
            Kind::Bool => "true or false",
            Kind::List => "a list",
            Kind::Table => "a table",
        }
    }
}

/// What a key is when it is not set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unset {
    /// Nothing: the feature is off.
    Empty,
    /// This value, written as in a variable (the loader reads it like one).
    Value(&'static str),
    /// Worked out from other keys, as said here (for the docs).
    Derived(&'static str),
    /// `serve` does not start without it.
    Required,
}

/// One key: what the parser accepts, what the docs say, how `--check` shows it.
pub struct Key {
    /// Dotted path, e.g. `gitlab.token`.
    pub path: &'static str,
    pub kind: Kind,
    /// Never printed, scrubbed from all output, and can be given as `<key>_file` / `<VAR>_FILE`.
    pub secret: bool,
    pub unset: Unset,
    /// One paragraph for the settings table.
    pub description: &'static str,
    /// The effective value in a loaded config (a secret's values go to the scrubber).
    show: fn(&Config) -> Shown,
}

impl Key {
    /// The variable that overrides it: `gitlab.webhook_secret` → `PLANBOT_GITLAB_WEBHOOK_SECRET`
    /// (`PLANBOT_ENGINE_ENV_<NAME>` for a table).
    pub fn env(&self) -> String {
        if self.kind == Kind::Table {
            format!("{}_<NAME>", env_name(self.path))
        } else {
            env_name(self.path)
        }
    }

    /// The section it is in (`""` for the top level).
    pub fn section(&self) -> &'static str {
        self.path.rsplit_once('.').map_or("", |(s, _)| s)
    }

    /// The default as the settings table shows it.
    pub fn default_text(&self) -> String {
        match self.unset {
            Unset::Empty => "(not set)".into(),
            Unset::Value(v) => format!("`{v}`"),
            Unset::Derived(d) => d.into(),
            Unset::Required => "required".into(),
        }
    }
}

/// How `--check` shows a value, and the secrets in it.
pub struct Shown {
    text: String,
    secrets: Vec<String>,
}

impl Shown {
    fn plain(text: impl ToString) -> Shown {
        Shown {
            text: text.to_string(),
            secrets: Vec::new(),
        }
    }

    fn option(value: Option<impl ToString>) -> Shown {
        Shown::plain(value.map_or_else(|| NOT_SET.to_string(), |v| v.to_string()))
    }

    fn path(value: Option<&PathBuf>) -> Shown {
        Shown::option(value.map(|p| p.display()))
    }

    fn debug(value: &impl std::fmt::Debug) -> Shown {
        Shown::plain(format!("{value:?}"))
    }

    fn duration(d: std::time::Duration) -> Shown {
        Shown::plain(humantime::format_duration(d))
    }

    /// `(set)` or `(not set)`; the value goes to the scrubber.
    fn secret(value: Option<&Secret>) -> Shown {
        Shown {
            text: if value.is_some() { "(set)" } else { NOT_SET }.into(),
            secrets: value.map(|s| s.expose().to_string()).into_iter().collect(),
        }
    }

    /// A Proxmox API token: the whole token and its secret part (`user@realm!id=uuid`: the
    /// uuid alone is a secret too).
    fn pve_token(value: Option<&Secret>) -> Shown {
        let mut shown = Shown::secret(value);
        if let Some((_, uuid)) = value.and_then(|t| t.expose().rsplit_once('=')) {
            shown.secrets.push(uuid.to_string());
        }
        shown
    }

    /// A table of engine variables: a secret one (by its name or `engine.secret_env`) as
    /// `(set)`, a user name or an address as it is.
    fn env(config: &Config, table: &BTreeMap<String, Secret>) -> Shown {
        let mut secrets = Vec::new();
        let entries: Vec<String> = table
            .iter()
            .map(|(k, v)| {
                if config.engine.is_secret(k) {
                    secrets.push(v.expose().to_string());
                    format!("{k} = (set)")
                } else {
                    format!("{k} = {:?}", v.expose())
                }
            })
            .collect();
        Shown {
            text: format!("{{ {} }}", entries.join(", ")),
            secrets,
        }
    }

    fn username(c: &Option<GitlabCredential>) -> Shown {
        Shown::option(c.as_ref().map(|c| c.username.clone()))
    }

    fn token(c: &Option<GitlabCredential>) -> Shown {
        Shown::secret(c.as_ref().map(|c| &c.token))
    }

    fn switch(s: LandlockSetting) -> Shown {
        Shown::plain(match s {
            LandlockSetting::Auto => "auto",
            LandlockSetting::Off => "off",
        })
    }
}

const NOT_SET: &str = "(not set)";

/// The environment variable that overrides `path`: `gitlab.webhook_secret` →
/// `PLANBOT_GITLAB_WEBHOOK_SECRET`.
pub fn env_name(path: &str) -> String {
    format!("PLANBOT_{}", path.replace('.', "_").to_ascii_uppercase())
}

/// The declaration of `path`.
pub fn key(path: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.path == path)
}

/// Whether `path` is a section (`gitlab`, `proxmox.plan`): a key's section or one above it.
pub fn is_section(path: &str) -> bool {
    KEYS.iter().any(|k| {
        k.path
            .strip_prefix(path)
            .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// Every section, in declaration order.
pub fn sections() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for k in KEYS {
        let mut s = k.section();
        while !s.is_empty() {
            if !out.contains(&s) {
                out.push(s);
            }
            s = s.rsplit_once('.').map_or("", |(p, _)| p);
        }
    }
    out
}

/// The settings table of the docs (Markdown), one row per key in declaration order.
pub fn reference_table() -> String {
    let mut out = String::from(
        "| Setting | Environment variable | Type | Default | What it does |\n|---|---|---|---|---|\n",
    );
    for k in KEYS {
        let (setting, env) = match (k.secret, k.kind) {
            (true, Kind::Table) => (
                format!("`{}` (or `{}_file`)", k.path, k.path),
                format!("`{}`", k.env()),
            ),
            (true, _) => (
                format!("`{}` (or `{}_file`)", k.path, k.path),
                format!("`{}` (or `{}_FILE`)", k.env(), k.env()),
            ),
            (false, _) => (format!("`{}`", k.path), format!("`{}`", k.env())),
        };
        let kind = if k.secret {
            format!("{}, secret", k.kind.name())
        } else {
            k.kind.name().to_string()
        };
        out.push_str(&format!(
            "| {setting} | {env} | {kind} | {} | {} |\n",
            k.default_text().replace('|', "\\|"),
            k.description.replace('|', "\\|")
        ));
    }
    out
}

impl Config {
    /// The config as `--check` prints it: every key with its effective value, secrets as
    /// `(set)`; then the store's TLS and the operator's policy sets.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for k in KEYS {
            out.push_str(&format!("{} = {}\n", k.path, (k.show)(self).text));
        }
        let tls = match self.store.tls() {
            None => "(SQLite: no network)".into(),
            Some(Ok(tls)) => tls.to_string(),
            Some(Err(e)) => format!("(invalid: {e})"),
        };
        out.push_str(&format!("store TLS = {tls}\n"));
        for set in &self.policy_sets {
            let owners: Vec<String> = set.owners.iter().map(|o| o.to_string()).collect();
            out.push_str(&format!(
                "policy_sets.{} = {{ path = {:?}, namespace = {:?}, owners = {owners:?}, roots = {:?} }}\n",
                set.name, set.path, set.namespace, set.roots
            ));
        }
        out
    }

    /// Every secret the config holds, for the scrubber: the values of the secret keys (and a
    /// password written into `store.url`).
    pub fn secrets(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for k in KEYS {
            for s in (k.show)(self).secrets {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
        out
    }
}

fn endpoint_of(c: &Config, section: &str) -> ProxmoxEndpoint {
    match section {
        "plan" => c.proxmox.for_plan(),
        "apply" => c.proxmox.for_apply(),
        _ => c.proxmox.default.clone(),
    }
}

/// Every key planbot reads, in the order `--check` and the docs list them.
/// `[[policy_sets]]` (an array of tables) is read by `build::policy_sets`.
pub static KEYS: &[Key] = &[
    Key {
        path: "listen",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("0.0.0.0:8080"),
        description: "Address to listen on (webhooks, apply endpoint, probes, run pages).",
        show: |c| Shown::plain(c.listen),
    },
    Key {
        path: "server.header_timeout",
        kind: Kind::Duration,
        secret: false,
        unset: Unset::Value("10s"),
        description: "How long a client has to send a request's headers, from the connection's opening or the end of its previous response; so also how long an idle keep-alive connection stays open (1s to 10m). Then the connection is closed.",
        show: |c| Shown::duration(c.server.header_timeout),
    },
    Key {
        path: "server.body_timeout",
        kind: Kind::Duration,
        secret: false,
        unset: Unset::Value("30s"),
        description: "How long a client has to send a whole request body, webhook or apply (1s to 10m); then 408.",
        show: |c| Shown::duration(c.server.body_timeout),
    },
    Key {
        path: "server.max_connections",
        kind: Kind::Int,
        secret: false,
        unset: Unset::Value("1000"),
        description: "Connections open at once. At the limit a new connection closes the one idle the longest (none idle: the new one is closed). Keep it under the open-files limit (planbot raises its soft limit to the hard one at start; the unit sets LimitNOFILE=65536).",
        show: |c| Shown::plain(c.server.max_connections),
    },
    Key {
        path: "server.trusted_proxies",
        kind: Kind::List,
        secret: false,
        unset: Unset::Empty,
        description: "Reverse proxies in front of planbot (addresses or CIDR ranges, e.g. `[\"10.0.0.5\", \"fd00::/8\"]`) whose `X-Forwarded-For` names the client: the limit of wrong job tokens is per client (the widgets and apply endpoints). From any other peer the header is ignored and the peer's address is the client; with none listed every client is its peer.",
        show: |c| Shown::debug(&c.server.trusted_proxies),
    },
    Key {
        path: "data_dir",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("/var/lib/planbot"),
        description: "The SQLite store, git workspaces and the private temp root for plan files.",
        show: |c| Shown::plain(c.data_dir.display()),
    },
    Key {
        path: "public_url",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Empty,
        description: "How GitLab users reach planbot: every link planbot writes (notes, statuses, issues, run pages, the sign-in's redirect URI) is built from it, with its port and path prefix (`https://example.com:8443/planbot`: planbot answers under the prefix too), never from `listen`.",
        show: |c| Shown::option(c.public_url.as_ref()),
    },
    Key {
        path: "log_format",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("text"),
        description: "The log on stderr: \"text\" (colours only on a terminal) or \"json\" (one object per line, for a log shipper: Loki, Elasticsearch, journald's JSON export...).",
        show: |c| {
            Shown::plain(match c.log.format {
                super::LogFormat::Text => "text",
                super::LogFormat::Json => "json",
            })
        },
    },
    Key {
        path: "log_level",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Derived("`info` (the RUST_LOG environment variable wins when set)"),
        description: "What is logged: \"error\", \"warn\", \"info\", \"debug\", or a filter per module such as \"info,planbot=debug\". The RUST_LOG environment variable wins when it is set.",
        show: |c| {
            Shown::plain(
                c.log
                    .level
                    .clone()
                    .unwrap_or_else(|| "(not set: info, or RUST_LOG)".into()),
            )
        },
    },
    Key {
        path: "fingerprint_key",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Required,
        description: "Server secret keying the plan fingerprint (HMAC-SHA256). Keep it stable: the apply job compares fingerprints made with it. Generate with `openssl rand -hex 32`.",
        show: |c| Shown::secret(Some(&c.fingerprint_key)),
    },
    Key {
        path: "gitlab.url",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Required,
        description: "Base URL of the GitLab instance.",
        show: |c| Shown::plain(&c.gitlab.url),
    },
    Key {
        path: "gitlab.token",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Required,
        description: "API token of the bot user (scope `api`; Developer or higher on every project).",
        show: |c| Shown::secret(Some(&c.gitlab.token)),
    },
    Key {
        path: "gitlab.webhook_secret",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Derived("required unless `signing_token` is set"),
        description: "The webhook's \"Secret token\" (sent as X-Gitlab-Token, compared in constant time).",
        show: |c| Shown::secret(c.gitlab.webhook_secret.as_ref()),
    },
    Key {
        path: "gitlab.signing_token",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Empty,
        description: "The webhook's signing token (`whsec_...`, Standard Webhooks `webhook-signature`). When set, every delivery must carry a valid signature no more than 5 minutes from now, and a delivery is recorded once per signed `webhook-id` (a replay with another Idempotency-Key runs nothing).",
        show: |c| Shown::secret(c.gitlab.signing_token.as_ref()),
    },
    Key {
        path: "gitlab.projects",
        kind: Kind::List,
        secret: false,
        unset: Unset::Required,
        description: "Projects planbot serves, by path or numeric id; events of every other project are ignored.",
        show: |c| {
            let projects: Vec<String> = c.gitlab.projects.0.iter().map(|p| p.to_string()).collect();
            Shown::debug(&projects)
        },
    },
    Key {
        path: "engine.binary",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Derived("`tofu` on `PATH`, else `terraform` (as `planbot plan` finds it)"),
        description: "`tofu`, `terraform`, or an absolute path. Unset, planbot runs `tofu` when it is on `PATH`, else `terraform`; `serve --check` and `planbot doctor` say which they found.",
        show: |c| Shown::option(c.engine.binary.as_ref()),
    },
    Key {
        path: "engine.timeout",
        kind: Kind::Duration,
        secret: false,
        unset: Unset::Value("30m"),
        description: "Give up a plan or apply after this long (SIGTERM, then SIGKILL after `grace`).",
        show: |c| Shown::duration(c.engine.timeout),
    },
    Key {
        path: "engine.lock_timeout",
        kind: Kind::Duration,
        secret: false,
        unset: Unset::Value("5m"),
        description: "Passed as -lock-timeout: how long to wait for the engine's own state lock.",
        show: |c| Shown::duration(c.engine.lock_timeout),
    },
    Key {
        path: "engine.grace",
        kind: Kind::Duration,
        secret: false,
        unset: Unset::Value("30s"),
        description: "Time between SIGTERM and SIGKILL when the engine must stop (timeout, superseded plan).",
        show: |c| Shown::duration(c.engine.grace),
    },
    Key {
        path: "engine.env",
        kind: Kind::Table,
        secret: true,
        unset: Unset::Empty,
        description: "Environment handed to the engine (and nothing else but PATH, HOME, TF_IN_AUTOMATION, TF_INPUT, TF_PLUGIN_CACHE_DIR, and where a memory cap applies GOGC=400 and GOMEMLIMIT at half the cap, which set here replaces). A value is a secret, scrubbed from all output and shown as (set), when its name says so (it contains PASS, TOKEN, SECRET, KEY, CREDENTIAL, PRIVATE or AUTH, or is TF_ENCRYPTION) or `secret_env` lists it; a user name or an address is not. A file of NAME=value lines can be given instead as `env_file = \"engine-env\"`. \"change-me\" is a placeholder: planbot refuses to start until it is replaced.",
        show: |c| Shown::env(c, &c.engine.env),
    },
    Key {
        path: "engine.provider_mirror",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Empty,
        description: "Install providers from a mirror instead of their registries: an https:// URL (network mirror) or an absolute directory (filesystem mirror). Each run gets a CLI config written by planbot, so a repository's terraform.d/plugins or .terraformrc is never used.",
        show: |c| Shown::option(c.engine.provider_mirror.as_ref()),
    },
    Key {
        path: "engine.max_plan_json_mib",
        kind: Kind::Int,
        secret: false,
        unset: Unset::Value("32"),
        description: "The most of a plan's `show -json` planbot accepts, in MiB (1..4096): a plan that prints more (a value of tens of megabytes) fails with a note that says so, and nothing of it is kept. The 10,000-resource benchmark plan is 12 MiB.",
        show: |c| Shown::plain(c.engine.max_plan_json_mib),
    },
    Key {
        path: "engine.plan.env",
        kind: Kind::Table,
        secret: true,
        unset: Unset::Empty,
        description: "Extra environment for MR plans only (untrusted code: everything here is visible to MR authors, so only read-only credentials), on top of [engine] env, key by key.",
        show: |c| Shown::env(c, &c.engine.plan_env),
    },
    Key {
        path: "engine.apply.env",
        kind: Kind::Table,
        secret: true,
        unset: Unset::Empty,
        description: "Extra environment for the default branch's plans and applies (reviewed code only).",
        show: |c| Shown::env(c, &c.engine.apply_env),
    },
    Key {
        path: "engine.secret_env",
        kind: Kind::List,
        secret: false,
        unset: Unset::Empty,
        description: "More variables of [engine] env, [engine.plan] env and [engine.apply] env whose values are secrets although their names do not say so.",
        show: |c| Shown::debug(&c.engine.secret_env),
    },
    Key {
        path: "sandbox.required",
        kind: Kind::Bool,
        secret: false,
        unset: Unset::Value("true"),
        description: "Refuse to plan or apply where the kernel offers no Landlock, or does not let planbot make unprivileged user, mount and PID namespaces. `false` plans without them instead (every note says so, `planbot doctor` warns).",
        show: |c| Shown::plain(c.sandbox.required),
    },
    Key {
        path: "sandbox.landlock",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("auto"),
        description: "`auto` uses Landlock when the kernel has it; `off` acts as if it had none.",
        show: |c| Shown::switch(c.sandbox.landlock),
    },
    Key {
        path: "sandbox.connect_ports",
        kind: Kind::List,
        secret: false,
        unset: Unset::Value("[443]"),
        description: "TCP ports the engine may connect to (besides the Proxmox endpoints' and the mirror's).",
        show: |c| Shown::debug(&c.sandbox.connect_ports),
    },
    Key {
        path: "sandbox.read_paths",
        kind: Kind::List,
        secret: false,
        unset: Unset::Empty,
        description: "Further paths the engine may read (e.g. a CA bundle outside /etc/ssl/certs).",
        show: |c| Shown::debug(&c.sandbox.read_paths),
    },
    Key {
        path: "sandbox.namespaces",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("auto"),
        description: "`auto` runs every engine process in its own namespaces where the kernel allows them; `off` acts as if it did not.",
        show: |c| Shown::switch(c.sandbox.namespaces),
    },
    Key {
        path: "sandbox.memory_max",
        kind: Kind::Size,
        secret: false,
        unset: Unset::Value("4 GiB"),
        description: "The memory one engine process may allocate (RLIMIT_DATA); past it the plan ends with a note that says so.",
        show: |c| Shown::plain(format!("{} MiB", c.sandbox.memory_max >> 20)),
    },
    Key {
        path: "sandbox.disk_max",
        kind: Kind::Size,
        secret: false,
        unset: Unset::Value("4 GiB"),
        description: "What one plan run may write to disk: its checkout, plan file and plugin cache together (and the largest file). Past it the engine is killed within a fraction of a second, the plan ends with a note that says so, and what it wrote is removed with the checkout. A commit whose files alone would take more (sized from git) is never checked out (plans, drift checks and applies).",
        show: |c| Shown::plain(format!("{} MiB", c.sandbox.disk_max >> 20)),
    },
    Key {
        path: "sandbox.cgroup",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("auto"),
        description: "`auto` runs all engine processes of one run (a root's plan, or its apply) in a cgroup of their own, capped by `job_memory_max` and `job_tasks_max`, where the host gives planbot one (cgroup v2 delegated, as the shipped unit's `Delegate=memory pids` does; or cgroup v1 `memory` and `pids` it may write); without one planbot warns at start and `planbot doctor` says why. `off` makes none.",
        show: |c| Shown::switch(c.sandbox.cgroup),
    },
    Key {
        path: "sandbox.job_memory_max",
        kind: Kind::Size,
        secret: false,
        unset: Unset::Value("4 GiB"),
        description: "The memory all engine processes of one run may use together (the run's cgroup); past it the kernel ends them and the plan fails with a note that names this cap.",
        show: |c| Shown::plain(format!("{} MiB", c.sandbox.job_memory_max >> 20)),
    },
    Key {
        path: "sandbox.job_tasks_max",
        kind: Kind::Int,
        secret: false,
        unset: Unset::Value("4096"),
        description: "The processes and threads one run may have at once (the run's cgroup); a fork past it fails, and the plan's note names this cap.",
        show: |c| Shown::plain(c.sandbox.job_tasks_max),
    },
    Key {
        path: "apply.job_name",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("planbot-apply"),
        description: "The only CI job allowed to call POST /api/v1/apply.",
        show: |c| Shown::plain(&c.apply.job_name),
    },
    Key {
        path: "apply.open_issue_on_failure",
        kind: Kind::Bool,
        secret: false,
        unset: Unset::Value("false"),
        description: "Open a GitLab issue when an apply on the default branch fails.",
        show: |c| Shown::plain(c.apply.open_issue_on_failure),
    },
    Key {
        path: "drift.enabled",
        kind: Kind::Bool,
        secret: false,
        unset: Unset::Value("false"),
        description: "Check every root for drift on `drift.schedule` inside `planbot serve` (one replica runs each tick).",
        show: |c| Shown::plain(c.drift.schedule.is_some()),
    },
    Key {
        path: "drift.schedule",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("0 6 * * *"),
        description: "When drift is checked: cron, five fields (minute hour day-of-month month day-of-week), read in `drift.time_zone`.",
        show: |c| Shown::plain(&c.drift.schedule_text),
    },
    Key {
        path: "drift.time_zone",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("UTC"),
        description: "The IANA time zone `drift.schedule` is read in, e.g. \"Europe/Berlin\".",
        show: |c| Shown::plain(&c.drift.time_zone),
    },
    Key {
        path: "drift.labels",
        kind: Kind::List,
        secret: false,
        unset: Unset::Value("[\"drift\"]"),
        description: "The labels of a root's drift issue; the first is the one the issue is found again by.",
        show: |c| Shown::debug(&c.drift.labels),
    },
    Key {
        path: "plan.max_concurrent_plans",
        kind: Kind::Int,
        secret: false,
        unset: Unset::Value("2"),
        description: "Bounded worker pool: how many jobs run at the same time (1..64), and how many engines run at once across all of them: the roots of one MR plan side by side up to it ([Several roots](workflow.md#several-roots)).",
        show: |c| Shown::plain(c.plan.max_concurrent_plans),
    },
    Key {
        path: "plan.workers_per_author",
        kind: Kind::Int,
        secret: false,
        unset: Unset::Derived("`max_concurrent_plans` - 1, at least 1"),
        description: "The most workers one author's jobs (or one MR's) hold at once (1..64), and the most engine slots one author's plans hold: the others stay free for everyone else, so one author's slow plans never make another MR wait for its note ([what runs at the same time](workflow.md#what-runs-at-the-same-time)). Jobs planbot queues itself (re-plans after a merge, drift) count as one author.",
        show: |c| Shown::plain(c.plan.workers_per_author),
    },
    Key {
        path: "plan.job_timeout",
        kind: Kind::Duration,
        secret: false,
        unset: Unset::Value("2h"),
        description: "The deadline of a whole job (checkout, every root's init, plan and show, the note): past it the job is stopped as `engine.timeout` stops one run (SIGTERM, SIGKILL after `grace`), its commit status says so, and its worker is free again (1s..24h).",
        show: |c| Shown::duration(c.plan.job_timeout),
    },
    Key {
        path: "proxmox.endpoint",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Empty,
        description: "The Proxmox VE API, e.g. https://pve.example.com:8006.",
        show: |c| Shown::option(endpoint_of(c, "").endpoint),
    },
    Key {
        path: "proxmox.api_token",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Empty,
        description: "The API token as `user@realm!tokenid=secret`, e.g. `planbot@pve!plan=<uuid>` (what `pveum user token add planbot@pve plan` prints; no `PVEAPIToken=` prefix). Read-only privileges are enough for plans.",
        show: |c| Shown::pve_token(endpoint_of(c, "").api_token.as_ref()),
    },
    Key {
        path: "proxmox.insecure",
        kind: Kind::Bool,
        secret: false,
        unset: Unset::Value("false"),
        description: "Skip TLS verification (self-signed PVE certificates). Prefer `ca_file`.",
        show: |c| Shown::plain(endpoint_of(c, "").insecure),
    },
    Key {
        path: "proxmox.ca_file",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Empty,
        description: "PEM file with the CA that signed the PVE certificate.",
        show: |c| Shown::path(endpoint_of(c, "").ca_file.as_ref()),
    },
    Key {
        path: "proxmox.plan.endpoint",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Derived("`proxmox.endpoint`"),
        description: "`proxmox.endpoint` for plans only.",
        show: |c| Shown::option(endpoint_of(c, "plan").endpoint),
    },
    Key {
        path: "proxmox.plan.api_token",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Derived("`proxmox.api_token`"),
        description: "`proxmox.api_token` for plans only.",
        show: |c| Shown::pve_token(endpoint_of(c, "plan").api_token.as_ref()),
    },
    Key {
        path: "proxmox.plan.insecure",
        kind: Kind::Bool,
        secret: false,
        unset: Unset::Derived("`proxmox.insecure`"),
        description: "`proxmox.insecure` for plans only.",
        show: |c| Shown::plain(endpoint_of(c, "plan").insecure),
    },
    Key {
        path: "proxmox.plan.ca_file",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Derived("`proxmox.ca_file`"),
        description: "`proxmox.ca_file` for plans only.",
        show: |c| Shown::path(endpoint_of(c, "plan").ca_file.as_ref()),
    },
    Key {
        path: "proxmox.apply.endpoint",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Derived("`proxmox.endpoint`"),
        description: "`proxmox.endpoint` for applies only.",
        show: |c| Shown::option(endpoint_of(c, "apply").endpoint),
    },
    Key {
        path: "proxmox.apply.api_token",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Derived("`proxmox.api_token`"),
        description: "`proxmox.api_token` for applies only.",
        show: |c| Shown::pve_token(endpoint_of(c, "apply").api_token.as_ref()),
    },
    Key {
        path: "proxmox.apply.insecure",
        kind: Kind::Bool,
        secret: false,
        unset: Unset::Derived("`proxmox.insecure`"),
        description: "`proxmox.insecure` for applies only.",
        show: |c| Shown::plain(endpoint_of(c, "apply").insecure),
    },
    Key {
        path: "proxmox.apply.ca_file",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Derived("`proxmox.ca_file`"),
        description: "`proxmox.ca_file` for applies only.",
        show: |c| Shown::path(endpoint_of(c, "apply").ca_file.as_ref()),
    },
    Key {
        path: "proxmox.apply.ssh_username",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Empty,
        description: "The user the bpg provider logs in as over SSH to upload snippets (cloud-init, Ignition); given to the engine on the default branch's runs only, never to MR plans.",
        show: |c| Shown::option(c.proxmox.apply_ssh.as_ref().map(|s| &s.username)),
    },
    Key {
        path: "proxmox.apply.ssh_private_key",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Empty,
        description: "That user's SSH private key (OpenSSH or PEM).",
        show: |c| Shown::secret(c.proxmox.apply_ssh.as_ref().and_then(|s| s.private_key.as_ref())),
    },
    Key {
        path: "proxmox.apply.ssh_agent_socket",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Empty,
        description: "Or an ssh-agent socket that holds the key, instead of the key.",
        show: |c| Shown::path(c.proxmox.apply_ssh.as_ref().and_then(|s| s.agent_socket.as_ref())),
    },
    Key {
        path: "gitlab.oauth.client_id",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Empty,
        description: "The Application ID GitLab shows for planbot (sign-in with GitLab for the run pages).",
        show: |c| Shown::option(c.pages.oauth.as_ref().map(|o| &o.client_id)),
    },
    Key {
        path: "gitlab.oauth.client_secret",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Empty,
        description: "The application's Secret.",
        show: |c| Shown::secret(c.pages.oauth.as_ref().map(|o| &o.client_secret)),
    },
    Key {
        path: "pages.auth",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Derived("`gitlab` with [gitlab.oauth], else `loopback`"),
        description: "`gitlab` (sign in with GitLab), `loopback` (only the planbot host itself) or `none` (anyone who reaches planbot: private networks only, `serve --check` and `planbot doctor` warn).",
        show: |c| Shown::plain(c.pages.auth.as_str()),
    },
    Key {
        path: "pages.session_lifetime",
        kind: Kind::Duration,
        secret: false,
        unset: Unset::Value("8h"),
        description: "How long a sign-in lasts (1m to 30d).",
        show: |c| Shown::duration(c.pages.session_lifetime),
    },
    Key {
        path: "metrics.token",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Empty,
        description: "GET /metrics answers only `Authorization: Bearer <token>` (Prometheus: `authorization: { credentials_file: ... }`); unset, /metrics answers 404. At least 16 characters (`openssl rand -hex 32`).",
        show: |c| Shown::secret(c.metrics.token.as_ref()),
    },
    Key {
        path: "store.url",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Derived("`sqlite://<data_dir>/planbot.db`"),
        description: "Where planbot keeps deliveries, the job queue, runs and applies. An embedded SQLite file serves one planbot; `postgres://user@host/db` lets several replicas share one PostgreSQL (jobs are leased, applies serialised per project). TLS as libpq's `?sslmode=`: `verify-full` (the default for a network host), `verify-ca`, `require` (the chain is verified all the same) or `disable` (the default for a Unix socket or a loopback host); `prefer` and `allow` are refused. A password written in the URL is scrubbed like a secret, but is better given as `password_file`.",
        show: |c| Shown {
            text: c.store.url.to_string(),
            secrets: c.store.url.embedded_password().into_iter().collect(),
        },
    },
    Key {
        path: "store.password",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Empty,
        description: "The PostgreSQL password (not needed for SQLite, or when the server trusts the client).",
        show: |c| Shown::secret(c.store.password.as_ref()),
    },
    Key {
        path: "store.ca_file",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Empty,
        description: "The CA (a PEM bundle) the PostgreSQL server's certificate must chain to, also written `sslrootcert=` in the URL; without either, the public web roots (webpki-roots).",
        show: |c| Shown::path(c.store.ca_file.as_ref()),
    },
    Key {
        path: "store.lease",
        kind: Kind::Duration,
        secret: false,
        unset: Unset::Value("30s"),
        description: "PostgreSQL: how long a job stays a replica's without that replica's heartbeat (renewed every third of it; 1s to 10m). A replica that dies leaves its job for this long, then another replica plans it.",
        show: |c| Shown::duration(c.store.lease),
    },
    Key {
        path: "state.default",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("own"),
        description: "What a root whose `.planbot.toml` entry says nothing about its state gets: \"own\" (the backend its code configures) or \"gitlab\" (the project's GitLab-managed state named after the root).",
        show: |c| {
            Shown::plain(match c.state.default {
                StateDefault::Own => "own",
                StateDefault::Gitlab => "gitlab",
            })
        },
    },
    Key {
        path: "state.plan.username",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("planbot"),
        description: "The HTTP user name sent with the token (any word for a personal, project or group access token).",
        show: |c| Shown::username(&c.state.plan),
    },
    Key {
        path: "state.plan.token",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Empty,
        description: "A token with the Developer role on each project and scope `read_api` (a project access token is the narrowest): reads the state for MR plans. MR authors can read it (an MR's code sees its plan's environment): give it no more.",
        show: |c| Shown::token(&c.state.plan),
    },
    Key {
        path: "state.apply.username",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("planbot"),
        description: "The HTTP user name sent with the token.",
        show: |c| Shown::username(&c.state.apply),
    },
    Key {
        path: "state.apply.token",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Empty,
        description: "A token with the Maintainer role on each project and scope `api`: locks, writes and unlocks the state for the default branch's plans and applies (reviewed code only).",
        show: |c| Shown::token(&c.state.apply),
    },
    Key {
        path: "modules.projects",
        kind: Kind::List,
        secret: false,
        unset: Unset::Empty,
        description: "The projects modules come from: `planbot doctor` checks that each token can read them.",
        show: |c| Shown::debug(&c.modules.projects),
    },
    Key {
        path: "modules.plan.username",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("planbot"),
        description: "The HTTP user name sent with the token (a deploy token's own user name for a deploy token).",
        show: |c| Shown::username(&c.modules.plan),
    },
    Key {
        path: "modules.plan.token",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Empty,
        description: "A read-only token for MR plans' `init` (scopes `read_repository` and `read_api`, Reporter on the module projects only): MR code never sees the token, but an MR can have `init` fetch anything it can read and show it in the plan.",
        show: |c| Shown::token(&c.modules.plan),
    },
    Key {
        path: "modules.apply.username",
        kind: Kind::Str,
        secret: false,
        unset: Unset::Value("planbot"),
        description: "The HTTP user name sent with the token.",
        show: |c| Shown::username(&c.modules.apply),
    },
    Key {
        path: "modules.apply.token",
        kind: Kind::Str,
        secret: true,
        unset: Unset::Empty,
        description: "A read-only token for the default branch's `init` (the same scopes).",
        show: |c| Shown::token(&c.modules.apply),
    },
];

/// The array of tables of the operator's policy sets (read by `build::policy_sets`; not a key: its tables are checked as a whole).
pub(super) const POLICY_SETS: &str = "policy_sets";

/// A variable's text as a value of `kind` (a default is read the same way).
pub(super) fn env_value(path: &str, kind: Kind, value: &str) -> Result<Value, ConfigError> {
    let invalid = |m: &str| ConfigError::Invalid {
        key: path.to_string(),
        message: m.to_string(),
    };
    Ok(match kind {
        Kind::Str | Kind::Duration | Kind::Size | Kind::Table => Value::String(value.to_string()),
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
        Kind::List => {
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
