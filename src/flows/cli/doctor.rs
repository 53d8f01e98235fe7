//! `planbot doctor`: checks GitLab, the webhook, the engine, the store and the Proxmox token, and prints fixes.
//!
//! Every check prints one line `OK`/`FAIL`/`SKIP`/`INFO` and, when something is to be done, the
//! fix (texts in `templates/doctor.j2`). Exit code 1 when any check failed. Only read-only calls.

use crate::capabilities::engine::{Engine, Namespaces, SandboxMode};
use crate::capabilities::gitlab::{AccessLevel, GitLab, GitLabError, Hook, User as GitLabUser};
use crate::capabilities::proxmox::{
    Node as ProxmoxNode, Proxmox, ProxmoxEndpoint, ProxmoxError, StorageConfig,
};
use crate::capabilities::store::{Store, StoreProbe};
use crate::core::config::{env_name, Config, ConfigError, Origin, Problem, StoreUrl};
use crate::core::proxmox::access::{self, Privileges};
use crate::core::redact::Secrets;
use anyhow::Result;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// The result of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Status {
    Ok,
    Fail,
    /// Could not be checked (not configured, or not visible to the token): not a failure.
    Skip,
    /// Facts worth knowing (storages, a hint): not a failure.
    Info,
    /// Works, but less safely than it should (no sandbox by the operator's choice).
    Warn,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
            Status::Info => "INFO",
            Status::Warn => "WARN",
        }
    }
}

/// One printed line (and its fix).
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub section: String,
    pub status: Status,
    pub line: String,
    pub fix: Option<String>,
}

fn render(name: &str, d: &Value) -> Option<String> {
    crate::core::templates::with_state("doctor.j2", |state| {
        state.lookup(name)?;
        state
            .call_macro(name, &[minijinja::Value::from_serialize(d)])
            .ok()
            .map(|s| s.trim().to_string())
    })
    .ok()
    .flatten()
}

/// Collects check lines section by section.
#[derive(Default)]
struct Report {
    section: String,
    checks: Vec<Check>,
    /// GitLab did not answer the GitLab section's first call: every later check that needs it
    /// says "not checked" instead of blaming its token.
    gitlab_down: bool,
}

impl Report {
    fn section(&mut self, name: &str) {
        self.section = name.to_string();
    }

    fn add(&mut self, status: Status, id: &str, d: Value) {
        let line = render(id, &d).unwrap_or_else(|| id.to_string());
        let fix = if matches!(status, Status::Ok) {
            None
        } else {
            render(&format!("{id}_fix"), &d).filter(|f| !f.is_empty())
        };
        self.checks.push(Check {
            section: self.section.clone(),
            status,
            line,
            fix,
        });
    }
}

/// Print the checks as the terminal shows them.
pub fn format_report(config_path: &str, checks: &[Check]) -> String {
    let mut out = render("header", &json!({"config": config_path})).unwrap_or_default();
    out.push('\n');
    let mut section = "";
    for c in checks {
        if c.section != section {
            section = &c.section;
            out.push('\n');
            out.push_str(section);
            out.push('\n');
        }
        out.push_str(&format!("  {:<5} {}\n", c.status.label(), c.line));
        if let Some(fix) = &c.fix {
            let mut lines = fix.lines();
            if let Some(first) = lines.next() {
                out.push_str(&format!("        fix: {first}\n"));
            }
            for l in lines {
                out.push_str(&format!("             {l}\n"));
            }
        }
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    let skipped = checks.iter().filter(|c| c.status == Status::Skip).count();
    out.push('\n');
    out.push_str(
        &render("summary", &json!({"failed": failed, "skipped": skipped})).unwrap_or_default(),
    );
    out.push('\n');
    out
}

/// `planbot doctor --config FILE`.
pub fn main(config: &Path) -> Result<ExitCode> {
    let file = config.display().to_string();
    let loaded = crate::flows::cli::serve::load_all(config)?;
    let warnings = config_checks(&file, &loaded.warnings, Status::Warn);
    let cfg = match loaded.into_result() {
        Ok(cfg) => cfg,
        Err(problems) => {
            // Nothing else can be checked with a config planbot would not start with.
            let mut checks = config_checks(&file, &problems, Status::Fail);
            checks.extend(warnings);
            print!("{}", format_report(&file, &checks));
            return Ok(ExitCode::from(1));
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut checks = warnings;
    checks.extend(runtime.block_on(run_checks(&cfg)));
    let mut secrets = Secrets::new();
    secrets.extend(cfg.secrets());
    // The report's words as written, every value in it scrubbed.
    let text = crate::core::templates::scrubbing(&secrets.scrubber(), || {
        format_report(&config.display().to_string(), &checks)
    });
    print!("{text}");
    Ok(if checks.iter().any(|c| c.status == Status::Fail) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// One line per config problem (`status`: FAIL for a problem, WARN for a warning), with the fix
/// for its kind and where to make it.
pub fn config_checks(file: &str, problems: &[Problem], status: Status) -> Vec<Check> {
    let mut r = Report::default();
    r.section("Config");
    for p in problems {
        let key = p.error.key().unwrap_or_default();
        let kind = match &p.error {
            ConfigError::Syntax(_) => "syntax",
            ConfigError::UnknownKey { .. } | ConfigError::UnknownSection { .. } => "unknown",
            ConfigError::UnknownVariable { .. } => "unknown_variable",
            ConfigError::Missing { .. } => "missing",
            ConfigError::Both { .. } => "both",
            ConfigError::SecretFile { .. } => "secret_file",
            ConfigError::Invalid { message, .. } if message == "is empty" => "empty",
            ConfigError::Invalid { message, .. } if message.contains("placeholder") => {
                "placeholder"
            }
            ConfigError::Invalid { .. }
                if key.ends_with("api_token") || key.ends_with("PROXMOX_VE_API_TOKEN") =>
            {
                "pve_token"
            }
            ConfigError::Invalid { .. } => "other",
        };
        // Where the value is to be fixed: the secret file itself, the variable, or the file line.
        let place = match &p.origin {
            Some(Origin::SecretFile { path, .. }) => path.clone(),
            Some(o) => o.describe(file),
            None => file.to_string(),
        };
        let whence = match &p.origin {
            Some(o) => o.describe(file),
            None if kind == "missing" => "not set".to_string(),
            None => file.to_string(),
        };
        let secret_env = if key.starts_with("engine.env.") {
            format!(
                "PLANBOT_ENGINE_ENV_{}",
                key.trim_start_matches("engine.env.")
            )
        } else {
            env_name(key)
        };
        r.add(
            status,
            "config_problem",
            json!({"error": p.error.to_string(), "whence": whence, "place": place,
                   "key": key, "env": secret_env, "kind": kind, "file": file}),
        );
    }
    r.checks
}

/// Run every check of `config`.
pub async fn run_checks(config: &Config) -> Vec<Check> {
    let mut r = Report::default();
    gitlab_checks(config, &mut r).await;
    state_checks(config, &mut r).await;
    engine_checks(config, &mut r).await;
    network_checks(config, &mut r);
    store_checks(config, &mut r).await;
    proxmox_checks(config, &mut r).await;
    pages_checks(config, &mut r);
    r.checks
}

/// The GitLab-managed state and module tokens, each with the role it needs and no more for
/// MR plans: `[state.plan]` reads the state of every project (Developer, exactly), `[state.apply]`
/// is a Maintainer, the module tokens can fetch the module projects. Read-only calls.
async fn state_checks(config: &Config, r: &mut Report) {
    let (state, modules) = (&config.state, &config.modules);
    let managed = state.default == crate::core::config::StateDefault::Gitlab
        || state.plan.is_some()
        || state.apply.is_some();
    if !managed && modules.plan.is_none() && modules.apply.is_none() {
        return;
    }
    r.section("State and modules");
    for (section, cred) in [("plan", &state.plan), ("apply", &state.apply)] {
        match cred {
            Some(c) => state_token(config, section, c, r).await,
            None if managed => r.add(Status::Fail, "state_no_token", json!({"use": section})),
            None => {}
        }
    }
    for (setting, cred) in [
        ("modules.plan", &modules.plan),
        ("modules.apply", &modules.apply),
    ] {
        let Some(c) = cred else { continue };
        let Some((client, user)) =
            credential_user(config, setting, c, None, "read_repository and read_api", r).await
        else {
            continue;
        };
        if modules.projects.is_empty() {
            r.add(Status::Skip, "modules_unnamed", json!({}));
        }
        for project in &modules.projects {
            let d = json!({"setting": setting, "project": project, "username": user.username});
            match client.repository_readable(project, &c.username).await {
                Ok(()) => r.add(Status::Ok, "module_ok", d),
                Err(e) => {
                    let mut d = d;
                    d["error"] = e.to_string().into();
                    r.add(Status::Fail, "module_unreadable", d);
                }
            }
        }
    }
}

/// A client acting with `cred`'s token and the user it belongs to (reported when refused).
async fn credential_user(
    config: &Config,
    setting: &str,
    cred: &crate::core::config::GitlabCredential,
    role: Option<&str>,
    scope: &str,
    r: &mut Report,
) -> Option<(GitLab, GitLabUser)> {
    let refused = |r: &mut Report, error: String| {
        r.add(
            Status::Fail,
            "cred_refused",
            json!({"setting": setting, "error": error, "role": role, "scope": scope}),
        )
    };
    let unreachable = |r: &mut Report| {
        r.add(
            Status::Skip,
            "needs_gitlab",
            json!({"setting": setting, "url": config.gitlab.url}),
        )
    };
    if r.gitlab_down {
        unreachable(r);
        return None;
    }
    let client = match GitLab::new(&config.gitlab.url, cred.token.expose()).and_then(|c| {
        c.with_retry_policy(crate::capabilities::gitlab::RetryPolicy {
            max_attempts: 1,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        })
        .with_timeout(Duration::from_secs(15))
    }) {
        Ok(c) => c,
        Err(e) => {
            refused(r, e.to_string());
            return None;
        }
    };
    match client.current_user().await {
        Ok(u) => Some((client, u)),
        // No answer is not a refusal: nothing is known of the token.
        Err(GitLabError::Transport(_)) => {
            unreachable(r);
            None
        }
        Err(e) => {
            refused(r, e.to_string());
            None
        }
    }
}

/// One state token on every allowed project: the plan token is exactly Developer and reads the
/// state; the apply token is Maintainer or more.
async fn state_token(
    config: &Config,
    section: &str,
    cred: &crate::core::config::GitlabCredential,
    r: &mut Report,
) {
    let setting = format!("state.{section}");
    let (role, scope) = if section == "plan" {
        ("Developer", "read_api")
    } else {
        ("Maintainer", "api")
    };
    let Some((client, user)) = credential_user(config, &setting, cred, Some(role), scope, r).await
    else {
        return;
    };
    let mut readable: Vec<String> = Vec::new();
    for project_ref in allowed_projects(config) {
        let mut d = json!({"setting": setting, "project": project_ref, "username": user.username, "role": role});
        let project = match client.project(&project_ref).await {
            Ok(p) => p,
            Err(_) => {
                r.add(Status::Fail, "cred_no_project", d);
                continue;
            }
        };
        if !project.path_with_namespace.is_empty() {
            d["project"] = project.path_with_namespace.clone().into();
        }
        let level = match client.member_access(project.id, user.id).await {
            Ok(l) => l,
            Err(e) => {
                d["error"] = e.to_string().into();
                r.add(Status::Fail, "cred_no_project", d);
                continue;
            }
        };
        d["level"] = level.map_or("not a member".into(), level_name).into();
        let n = level.map_or(0, |l| l.0);
        match section {
            "plan" if n < 30 => r.add(Status::Fail, "state_plan_low", d),
            "plan" if n > 30 => r.add(Status::Fail, "state_plan_high", d),
            "plan" => match client.terraform_state_readable(project.id).await {
                Ok(()) => {
                    readable.push(d["project"].as_str().unwrap_or_default().to_string());
                    r.add(Status::Ok, "state_plan_ok", d)
                }
                Err(e) => {
                    d["error"] = e.to_string().into();
                    r.add(Status::Fail, "state_plan_unreadable", d);
                }
            },
            _ if n >= 40 => r.add(Status::Ok, "state_apply_ok", d),
            _ => r.add(Status::Fail, "state_apply_low", d),
        }
    }
    // One plan token that reads several projects' state: the state gate keeps it from MR
    // code, but whoever holds it reads them all.
    if readable.len() > 1 {
        r.add(
            Status::Warn,
            "state_plan_shared",
            json!({"username": user.username, "projects": readable.join(", "), "count": readable.len()}),
        );
    }
}

/// Where the config says the engine connects, each against its sandbox's allow-list (no
/// network calls).
fn network_checks(config: &Config, r: &mut Report) {
    let needs = crate::flows::confinement::network::needs(config);
    let own = crate::flows::confinement::network::own_port_reachable(config);
    if needs.is_empty() && own.is_none() {
        return;
    }
    r.section("Network");
    if let Some(text) = own {
        r.add(Status::Fail, "net_own_port", json!({ "text": text }));
    }
    for n in needs {
        let mut wanted = config.sandbox.connect_ports.clone();
        wanted.push(n.port);
        wanted.sort_unstable();
        wanted.dedup();
        let d = json!({
            "host": n.host, "port": n.port, "what": n.what, "key": n.key,
            "setting": format!("connect_ports = {wanted:?}"),
        });
        if n.allowed {
            r.add(Status::Ok, "net_ok", d);
        } else {
            r.add(Status::Fail, "net_blocked", d);
        }
    }
}

/// Who can read the run pages and `/metrics` (no network calls).
fn pages_checks(config: &Config, r: &mut Report) {
    use crate::core::config::PagesAuth;
    r.section("Run pages");
    match config.pages.auth {
        PagesAuth::Gitlab => r.add(
            Status::Ok,
            "pages_gitlab",
            json!({"callback": config.public_url.as_ref().map(|u| u.callback()).unwrap_or_default()}),
        ),
        // Notes say "log on the planbot host" instead of linking: fine for a planbot on a
        // desk, a dead end for MR authors when planbot is published behind a proxy.
        PagesAuth::Loopback => match config.public_url.as_ref().filter(|u| !u.is_loopback()) {
            Some(public) => r.add(
                Status::Warn,
                "pages_need_signin",
                json!({"port": config.listen.port(), "public_url": public.as_str(), "callback": public.callback()}),
            ),
            None => r.add(
                Status::Info,
                "pages_loopback",
                json!({"port": config.listen.port()}),
            ),
        },
        PagesAuth::None => r.add(Status::Warn, "pages_open", json!({})),
    }
    if config.metrics.token.is_none() {
        r.add(Status::Info, "metrics_open", json!({}));
    }
}

fn level_name(level: AccessLevel) -> String {
    match level.0 {
        10 => "Guest".into(),
        20 => "Reporter".into(),
        30 => "Developer".into(),
        40 => "Maintainer".into(),
        50 => "Owner".into(),
        n => format!("access level {n}"),
    }
}

/// GitLab, in steps: a client with the token, who the token is, then each allowed project
/// ([`project_checks`]).
async fn gitlab_checks(config: &Config, r: &mut Report) {
    r.section("GitLab");
    let url = config.gitlab.url.clone();
    let Some(client) = gitlab_client(config, &url, r) else {
        r.gitlab_down = true;
        return;
    };
    let Some(user) = gitlab_user(&client, &url, r).await else {
        return;
    };
    let hook_url = config.public_url.as_ref().map(|u| u.webhook());
    if hook_url.is_none() {
        r.add(Status::Skip, "no_public_url", json!({}));
    }
    for project_ref in allowed_projects(config) {
        project_checks(&client, &project_ref, &user, hook_url.as_deref(), r).await;
    }
}

/// A client for `url` with the configured token (one attempt per call, 15 s each); `None`,
/// reported, when the token or the URL cannot be used at all.
fn gitlab_client(config: &Config, url: &str, r: &mut Report) -> Option<GitLab> {
    // A token GitLab could never accept is the token's fault, not the URL's.
    let token = config.gitlab.token.expose();
    if token.trim().is_empty() || reqwest::header::HeaderValue::from_str(token).is_err() {
        r.add(
            Status::Fail,
            "gitlab_token_unusable",
            json!({"empty": token.trim().is_empty()}),
        );
        return None;
    }
    let client = match GitLab::new(url, config.gitlab.token.expose()) {
        Ok(c) => c.with_retry_policy(crate::capabilities::gitlab::RetryPolicy {
            max_attempts: 1,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        }),
        Err(e) => {
            r.add(
                Status::Fail,
                "gitlab_unreachable",
                json!({"url": url, "error": e.to_string()}),
            );
            return None;
        }
    };
    match client.with_timeout(Duration::from_secs(15)) {
        Ok(c) => Some(c),
        Err(e) => {
            r.add(
                Status::Fail,
                "gitlab_unreachable",
                json!({"url": url, "error": e.to_string()}),
            );
            None
        }
    }
}

/// The token's user: GitLab reachable and the token accepted (reported either way).
async fn gitlab_user(client: &GitLab, url: &str, r: &mut Report) -> Option<GitLabUser> {
    match client.current_user().await {
        Ok(u) => {
            r.add(Status::Ok, "gitlab_reachable", json!({"url": url}));
            r.add(
                Status::Ok,
                "gitlab_token",
                json!({"username": u.username, "id": u.id.0}),
            );
            Some(u)
        }
        Err(GitLabError::Transport(e)) => {
            r.add(
                Status::Fail,
                "gitlab_unreachable",
                json!({"url": url, "error": e}),
            );
            r.gitlab_down = true;
            None
        }
        Err(e) => {
            r.add(Status::Ok, "gitlab_reachable", json!({"url": url}));
            r.add(
                Status::Fail,
                "gitlab_token_bad",
                json!({"error": e.to_string()}),
            );
            None
        }
    }
}

/// One project: it exists, the token's user is Developer or more, and (with a public URL)
/// its webhook to planbot is there with the right events.
async fn project_checks(
    client: &GitLab,
    project_ref: &str,
    user: &GitLabUser,
    hook_url: Option<&str>,
    r: &mut Report,
) {
    let base = json!({"project": project_ref, "username": user.username});
    let project = match client.project(project_ref).await {
        Ok(p) => p,
        Err(e) => {
            let mut d = base.clone();
            d["error"] = e.to_string().into();
            r.add(Status::Fail, "project_missing", d);
            return;
        }
    };
    let name = if project.path_with_namespace.is_empty() {
        project_ref.to_string()
    } else {
        project.path_with_namespace.clone()
    };
    let mut d = json!({"project": name, "username": user.username});
    match client.member_access(project.id, user.id).await {
        Ok(Some(level)) if level.is_developer_or_more() => {
            d["level"] = level_name(level).into();
            r.add(Status::Ok, "project_access", d.clone());
        }
        Ok(level) => {
            d["level"] = level.map_or("not a member".into(), level_name).into();
            r.add(Status::Fail, "project_access_low", d.clone());
        }
        Err(e) => {
            d["error"] = e.to_string().into();
            r.add(Status::Fail, "project_missing", d.clone());
            return;
        }
    }
    // The apply job reads the deploy freezes with the bot's token (Reporter or more).
    let mut f = d.clone();
    match client.freeze_periods(project.id).await {
        Ok(periods) => {
            f["count"] = periods.len().into();
            r.add(Status::Ok, "freezes_readable", f);
        }
        Err(e) => {
            f["error"] = e.to_string().into();
            r.add(Status::Fail, "freezes_unreadable", f);
        }
    }
    let Some(hook_url) = hook_url else { return };
    d["url"] = hook_url.into();
    match client.project_hooks(project.id).await {
        Ok(hooks) => hook_check(&hooks, hook_url, d, r),
        Err(GitLabError::Forbidden) => r.add(Status::Skip, "hook_unreadable", d),
        Err(e) => {
            d["error"] = e.to_string().into();
            r.add(Status::Skip, "hook_unreadable", d);
        }
    }
}

/// The project's webhook to `hook_url`: present, enabled, and sending MR and comment events.
fn hook_check(hooks: &[Hook], hook_url: &str, mut d: Value, r: &mut Report) {
    let same = |u: &str| u.trim_end_matches('/') == hook_url.trim_end_matches('/');
    match hooks.iter().find(|h| same(&h.url)) {
        None => {
            d["others"] = json!(hooks.iter().map(|h| &h.url).collect::<Vec<_>>());
            r.add(Status::Fail, "hook_missing", d);
        }
        Some(h) => {
            let mut missing = Vec::new();
            if !h.merge_requests_events {
                missing.push("\"Merge request events\"");
            }
            if !h.note_events {
                missing.push("\"Comments\"");
            }
            let disabled = h
                .alert_status
                .as_deref()
                .filter(|s| *s == "disabled" || *s == "temporarily_disabled");
            if let Some(status) = disabled {
                d["status"] = status.replace('_', " ").into();
                r.add(Status::Fail, "hook_disabled", d);
            } else if !missing.is_empty() {
                d["missing"] = json!(missing);
                r.add(Status::Fail, "hook_events", d);
            } else {
                r.add(Status::Ok, "hook_ok", d);
            }
        }
    }
}

/// The allowlist as strings (`group/project` or a numeric id).
fn allowed_projects(config: &Config) -> Vec<String> {
    config
        .gitlab
        .projects
        .0
        .iter()
        .map(|p| p.to_string())
        .collect()
}

async fn engine_checks(config: &Config, r: &mut Report) {
    r.section("Engine");
    let temp = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => {
            r.add(
                Status::Fail,
                "engine_broken",
                json!({"path": config.engine.binary.as_deref().unwrap_or("tofu"), "error": e.to_string()}),
            );
            return;
        }
    };
    let mode = crate::flows::confinement::sandbox::service_mode(
        config,
        crate::flows::confinement::credentials::Trust::MergeRequest,
    );
    match &mode {
        SandboxMode::Landlock {
            namespaces: Namespaces::Off { reason },
            ..
        } => r.add(
            Status::Warn,
            "sandbox_no_namespaces",
            json!({"level": mode.describe(), "reason": reason}),
        ),
        SandboxMode::Landlock { .. } => {
            r.add(Status::Ok, "sandbox_ok", json!({"level": mode.describe()}))
        }
        SandboxMode::Off { reason } => {
            r.add(Status::Warn, "sandbox_off", json!({"reason": reason}))
        }
        SandboxMode::Refused { reason } => {
            r.add(Status::Fail, "sandbox_refused", json!({"reason": reason}));
            return;
        }
    }
    {
        use crate::capabilities::engine::CgroupSupport;
        use crate::flows::confinement::sandbox::CgroupStatus;
        let status = CgroupStatus::probe(config);
        let line = status.describe(config);
        match status {
            CgroupStatus::Auto(CgroupSupport::Unavailable { .. }) => {
                r.add(Status::Warn, "cgroup_none", json!({"line": line}))
            }
            _ => r.add(Status::Ok, "cgroup_ok", json!({"line": line})),
        }
    }
    let engine =
        match crate::capabilities::engine::configured_binary(config.engine.binary.as_deref())
            .and_then(|binary| Engine::builder(binary, temp.path()).sandbox(mode).build())
        {
            Ok(e) => e,
            Err(e) => {
                r.add(
                    Status::Fail,
                    "engine_missing",
                    json!({"error": e.to_string()}),
                );
                return;
            }
        };
    let path = engine.binary().display().to_string();
    match engine.version().await {
        Ok(v) => r.add(
            Status::Ok,
            "engine_ok",
            json!({"version": v.to_string(), "path": path}),
        ),
        Err(e) => r.add(
            Status::Fail,
            "engine_broken",
            json!({"path": path, "error": e.to_string()}),
        ),
    }
}

/// The store `serve` would open, read without creating or migrating anything: reachable (with
/// the TLS it asks for), its schema against this planbot's, and the live replicas.
async fn store_checks(config: &Config, r: &mut Report) {
    r.section("Store");
    let store = &config.store;
    let url = store.url.to_string();
    let kind = match store.url {
        StoreUrl::Sqlite(_) => "SQLite",
        StoreUrl::Postgres(_) => "PostgreSQL",
    };
    let password = store.password.as_ref().map(|p| p.expose());
    let probe = match Store::probe(&store.url, password, store.ca_file.as_deref()).await {
        Ok(p) => p,
        Err(e) => {
            r.add(
                Status::Fail,
                "store_unreachable",
                json!({"kind": kind, "url": url, "error": format!("{e:#}")}),
            );
            return;
        }
    };
    let mode = store.tls().and_then(Result::ok).map(|t| t.to_string());
    r.add(
        Status::Ok,
        "store_ok",
        json!({"kind": kind, "url": url, "server": probe.server, "tls": probe.tls, "mode": mode}),
    );
    let d = json!({"found": probe.schema, "known": probe.known});
    match probe.schema {
        0 => r.add(Status::Info, "store_schema_none", d),
        v if v == probe.known => r.add(Status::Ok, "store_schema_ok", d),
        v if v < probe.known => r.add(Status::Info, "store_schema_older", d),
        _ => r.add(Status::Fail, "store_schema_newer", d),
    }
    if matches!(store.url, StoreUrl::Postgres(_)) {
        r.add(
            Status::Info,
            "store_replicas",
            json!({"names": probe.live_replicas}),
        );
    }
    drift_checks(config, &probe, r);
}

/// When drift was last checked, root by root (from the store), and when the schedule runs next.
fn drift_checks(config: &Config, probe: &StoreProbe, r: &mut Report) {
    r.section("Drift");
    let at = |ms: i64| {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
        humantime::format_rfc3339_seconds(t).to_string()
    };
    let next = config.drift.schedule.as_ref().map(|s| {
        s.next_after(chrono::Utc::now())
            .map_or_else(|| "never".to_string(), |t| s.local(t))
    });
    r.add(
        Status::Info,
        "drift_schedule",
        json!({
            "schedule": config.drift.schedule_text,
            "time_zone": config.drift.time_zone,
            "next": next,
            "last_tick": probe.last_drift_tick.map(at),
        }),
    );
    if probe.drift_roots.is_empty() {
        r.add(Status::Info, "drift_never", json!({}));
    }
    for root in &probe.drift_roots {
        r.add(
            Status::Info,
            "drift_root",
            json!({
                "project": root.project_path,
                "root": root.root,
                "outcome": root.outcome.as_str(),
                "drifted": root.drifted,
                "checked": at(root.checked_at),
                "checked_ok": root.checked_ok_at.map(at),
            }),
        );
    }
}

async fn proxmox_checks(config: &Config, r: &mut Report) {
    let plan = crate::flows::preflight::endpoint_from_config(
        &config.proxmox.for_plan(),
        &config.engine.env,
    );
    let apply = crate::flows::preflight::endpoint_from_config(
        &config.proxmox.for_apply(),
        &config.engine.env,
    );
    let same = match (&plan, &apply) {
        (Some(p), Some(a)) => p.url == a.url && p.api_token == a.api_token,
        _ => false,
    };
    match (plan, apply) {
        (None, None) => {
            r.section("Proxmox");
            r.add(Status::Skip, "pve_none", json!({}));
        }
        (Some(p), Some(_)) if same => {
            r.section("Proxmox (plan and apply)");
            proxmox_endpoint(p, true, true, r).await;
        }
        (p, a) => {
            if let Some(p) = p {
                r.section("Proxmox (plan)");
                proxmox_endpoint(p, true, false, r).await;
            }
            if let Some(a) = a {
                r.section("Proxmox (apply)");
                proxmox_endpoint(a, false, true, r).await;
            }
        }
    }
}

/// One Proxmox endpoint, in steps: reach it, its nodes, the token's privileges on the paths
/// that matter, what the token may read (and, for applies, write), and the storages.
async fn proxmox_endpoint(ep: ProxmoxEndpoint, for_plan: bool, for_apply: bool, r: &mut Report) {
    let token_id = ep.api_token.id().to_string();
    let Some(client) = pve_connect(ep, &token_id, r).await else {
        return;
    };
    let nodes = match client.nodes().await {
        Ok(n) => n,
        Err(e) => return pve_read_failed(r, "GET /nodes", e),
    };
    pve_nodes(&nodes, r);
    let storages: Vec<StorageConfig> = match client.storage().await {
        Ok(s) => s,
        Err(e) => return pve_read_failed(r, "GET /storage", e),
    };
    let perms = match pve_privileges(&client, &nodes, &storages).await {
        Ok(perms) => perms,
        Err((what, e)) => return pve_read_failed(r, &what, e),
    };
    let template_storages: Vec<&StorageConfig> = storages
        .iter()
        .filter(|s| !s.disable && s.content.iter().any(|c| c == "import" || c == "iso"))
        .collect();
    let no_template: Vec<&str> = template_storages
        .iter()
        .filter(|s| !access::DOWNLOAD_STORAGE.met(&perms, &format!("/storage/{}", s.storage)))
        .map(|s| s.storage.as_str())
        .collect();
    let can_write = access::VMS
        .requires
        .iter()
        .any(|p| *p != "VM.Audit" && perms.has("/vms", p))
        || perms.has("/", "Sys.Modify")
        || template_storages.len() > no_template.len();
    pve_read_access(&perms, &token_id, for_plan && !for_apply, can_write, r);
    if for_apply {
        pve_write_access(&perms, &token_id, &nodes, &no_template, r);
    }
    pve_storages(&storages, r);
}

/// A read that fails is a FAIL: the checks after it would judge from nothing.
fn pve_read_failed(r: &mut Report, what: &str, e: ProxmoxError) {
    r.add(
        Status::Fail,
        "pve_read_failed",
        json!({"what": what, "error": e.to_string()}),
    );
}

/// The client for `ep`, when the endpoint answers `GET /version` to the token (reported
/// either way).
async fn pve_connect(ep: ProxmoxEndpoint, token_id: &str, r: &mut Report) -> Option<Proxmox> {
    let url = ep.url.clone();
    let client = match Proxmox::new(ep) {
        Ok(c) => c,
        Err(e) => {
            r.add(Status::Fail, "pve_config", json!({"error": e.to_string()}));
            return None;
        }
    };
    let base_url = client.base_url().to_string();
    let version = match client.version().await {
        Ok(v) => v,
        Err(ProxmoxError::Unauthorized { status, .. }) => {
            let user = token_id.split('!').next().unwrap_or_default();
            r.add(
                Status::Fail,
                "pve_unauthorized",
                json!({"token": token_id, "status": status, "user": user}),
            );
            return None;
        }
        Err(e) => {
            let error = e.to_string();
            let tls = error.contains("certificate") || error.contains("UnknownIssuer");
            // The port the endpoint names (8006 is only Proxmox's default).
            let port = reqwest::Url::parse(&url)
                .ok()
                .and_then(|u| u.port_or_known_default())
                .unwrap_or(8006);
            r.add(
                Status::Fail,
                "pve_unreachable",
                json!({"url": url, "error": error, "tls": tls, "port": port}),
            );
            return None;
        }
    };
    let old = version.major_minor().is_some_and(|v| v < (8, 4));
    r.add(
        Status::Ok,
        "pve_reachable",
        json!({"url": base_url, "version": version.version, "old": old}),
    );
    Some(client)
}

/// The cluster's nodes: a FAIL when one is offline.
fn pve_nodes(nodes: &[ProxmoxNode], r: &mut Report) {
    let node_list: Vec<Value> = nodes
        .iter()
        .map(|n| json!({"name": n.node, "status": n.status.clone().unwrap_or_else(|| "unknown".into())}))
        .collect();
    let offline: Vec<&str> = nodes
        .iter()
        .filter(|n| !n.is_online())
        .map(|n| n.node.as_str())
        .collect();
    if offline.is_empty() {
        r.add(Status::Ok, "pve_nodes", json!({"nodes": node_list}));
    } else {
        r.add(
            Status::Fail,
            "pve_nodes_offline",
            json!({"nodes": node_list, "offline": offline}),
        );
    }
}

/// The token's privileges on `/`, `/vms`, every node and every storage; on a failed read,
/// what was read and the error.
async fn pve_privileges(
    client: &Proxmox,
    nodes: &[ProxmoxNode],
    storages: &[StorageConfig],
) -> Result<Privileges, (String, ProxmoxError)> {
    let mut paths: BTreeSet<String> = ["/".to_string(), "/vms".to_string()].into();
    for n in nodes {
        paths.insert(format!("/nodes/{}", n.node));
    }
    for s in storages {
        paths.insert(format!("/storage/{}", s.storage));
    }
    let mut perms = Privileges::default();
    for p in &paths {
        match client.privileges_on(p).await {
            Ok(set) => perms.insert(p.clone(), set),
            Err(e) => return Err((format!("GET /access/permissions?path={p}"), e)),
        }
    }
    Ok(perms)
}

/// Reading: what every plan's refresh needs. A plan-only token that could also write is
/// pointed out (`can_write`).
fn pve_read_access(
    perms: &Privileges,
    token_id: &str,
    plan_only: bool,
    can_write: bool,
    r: &mut Report,
) {
    let user = crate::core::proxmox::access::token_user(token_id).to_string();
    let read_missing: Vec<String> = access::READ
        .missing(perms, "/")
        .iter()
        .map(|p| access::all_on(&[*p], "/"))
        .collect();
    if read_missing.is_empty() {
        r.add(
            Status::Ok,
            "pve_read_ok",
            json!({"token": token_id, "read_only": plan_only && !can_write}),
        );
    } else {
        r.add(
            Status::Fail,
            "pve_read_missing",
            json!({"token": token_id, "user": user, "role": access::READ.role,
                   "missing": read_missing}),
        );
    }
    if plan_only && can_write {
        let mut extra: Vec<String> = access::VMS
            .requires
            .iter()
            .filter(|p| **p != "VM.Audit" && perms.has("/vms", p))
            .map(|p| p.to_string())
            .take(3)
            .collect();
        if perms.has("/", "Sys.Modify") {
            extra.push("Sys.Modify".into());
        }
        r.add(
            Status::Info,
            "pve_plan_can_write",
            json!({"token": token_id, "extra": extra}),
        );
    }
}

/// Writing, for the apply token: managing VMs, downloading templates (to the storages in
/// `no_template`, which it may not yet), and the grants that fix what is missing.
fn pve_write_access(
    perms: &Privileges,
    token_id: &str,
    nodes: &[ProxmoxNode],
    no_template: &[&str],
    r: &mut Report,
) {
    let user = crate::core::proxmox::access::token_user(token_id).to_string();
    let vm_missing: Vec<&str> = access::VMS.missing(perms, "/vms");
    let root_download = access::DOWNLOAD_ROOT.met(perms, "/");
    let nodes_without_net: Vec<&str> = nodes
        .iter()
        .filter(|n| !access::DOWNLOAD_NODE.met(perms, &format!("/nodes/{}", n.node)))
        .map(|n| n.node.as_str())
        .collect();
    let download_blocked = !root_download && !nodes_without_net.is_empty();
    let mut missing = Vec::new();
    let mut grants = Vec::new();
    // Each role is created once (`pveum role add` fails for an existing role).
    let mut roles_added = BTreeSet::new();
    let mut grant = |need: &access::Need, path: &str| {
        json!({"role": need.role, "privs": need.grants, "path": path,
               "add_role": roles_added.insert(need.role)})
    };
    if !vm_missing.is_empty() {
        missing.push(access::each_on(&vm_missing, "/vms"));
        grants.push(grant(&access::VMS, "/vms"));
    }
    for s in no_template {
        let path = format!("/storage/{s}");
        missing.push(access::all_on(access::DOWNLOAD_STORAGE.requires, &path));
        grants.push(grant(&access::DOWNLOAD_STORAGE, &path));
    }
    if download_blocked {
        let node_paths: Vec<String> = nodes_without_net
            .iter()
            .map(|n| format!("/nodes/{n}"))
            .collect();
        missing.push(access::all_on_root_or_nodes(
            access::DOWNLOAD_ROOT.requires,
            access::DOWNLOAD_NODE.requires,
            &node_paths,
        ));
        grants.push(grant(&access::DOWNLOAD_ROOT, "/"));
    }
    if missing.is_empty() {
        r.add(Status::Ok, "pve_write_ok", json!({"token": token_id}));
    } else {
        r.add(
            Status::Fail,
            "pve_write_missing",
            json!({"token": token_id, "user": user, "missing": missing, "grants": grants}),
        );
    }
}

/// The storages, and a hint when none takes `import` or `snippets` content.
fn pve_storages(storages: &[StorageConfig], r: &mut Report) {
    for s in storages {
        r.add(
            Status::Info,
            "pve_storage",
            json!({"id": s.storage, "type": s.storage_type, "content": s.content,
                   "nodes": s.nodes, "shared": s.shared, "disabled": s.disable}),
        );
    }
    for (content, id) in [("import", "pve_no_import"), ("snippets", "pve_no_snippets")] {
        let usable: Vec<&StorageConfig> = storages
            .iter()
            .filter(|s| !s.disable && s.is_file_based())
            .collect();
        if !storages.is_empty()
            && !usable
                .iter()
                .any(|s| s.content.iter().any(|c| c == content))
        {
            if let Some(first) = usable.first() {
                let mut new_list = first.content.clone();
                new_list.push(content.to_string());
                r.add(
                    Status::Info,
                    id,
                    json!({"storage": first.storage, "new_list": new_list}),
                );
            }
        }
    }
}
