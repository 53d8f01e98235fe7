//! `planbot serve`: loads the config, then builds the application (store, queue, workers, HTTP) and runs it.

use crate::core::config::{Config, Loaded, Problem, StoreUrl};
use crate::core::store_tls::SslMode;
use crate::flows::service::server::Application;
use anyhow::{Context, Result};
use std::path::Path;
use std::process::ExitCode;

/// Every problem, one after the other, each with where to fix it.
pub fn format_problems(file: &str, problems: &[Problem]) -> String {
    format_list(file, "problem", problems)
}

/// `{file}: N {what}s in the configuration`, then each with where it came from.
fn format_list(file: &str, what: &str, problems: &[Problem]) -> String {
    let n = problems.len();
    let mut out = format!(
        "{file}: {n} {what}{} in the configuration\n",
        if n == 1 { "" } else { "s" }
    );
    for p in problems {
        out.push('\n');
        for line in p.describe(file).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

/// The config with every problem found, as [`Config::load_all`] gives it.
pub fn load_all(path: &Path) -> Result<Loaded> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("PLANBOT_") || k == crate::core::config::CREDENTIALS_DIRECTORY
        })
        .collect();
    let read = |p: &str| std::fs::read_to_string(p).map_err(|e| e.to_string());
    Ok(Config::load_all(&text, &env, &read))
}

/// What `--check` prints: the effective config (secrets as `(set)`) and what the service would do.
pub fn check_report(config: &Config) -> String {
    let mut out = String::from("planbot: the config is valid.\n\n");
    out.push_str(&config.describe());
    out.push_str("\nplanbot serve would:\n");
    for line in what_serve_would_do(config) {
        out.push_str(&format!("- {line}\n"));
    }
    out
}

/// What the service would do with `config`, a line each: where it listens, whom it believes,
/// what it plans and where it keeps it, how it confines the engine, what it applies, shows and
/// checks.
fn what_serve_would_do(config: &Config) -> Vec<String> {
    let projects: Vec<String> = config
        .gitlab
        .projects
        .0
        .iter()
        .map(|p| p.to_string())
        .collect();
    let mut lines = vec![
        format!(
            "listen on http://{} (POST /webhooks/gitlab, /healthz, /readyz, /metrics, /runs)",
            config.listen
        ),
        webhook_auth(config).to_string(),
        format!(
            "plan merge requests of {} via {} (other projects are ignored)",
            projects.join(", "),
            config.gitlab.url
        ),
        format!(
            "keep {} and run at most {} plan(s) at a time with {} (timeout {})",
            store_text(config),
            config.plan.max_concurrent_plans,
            match &config.engine.binary {
                Some(b) => format!("`{b}`"),
                None => "`tofu`, else `terraform` (engine.binary is not set)".to_string(),
            },
            humantime::format_duration(config.engine.timeout)
        ),
        format!(
            "run every engine process sandboxed: {}",
            crate::flows::confinement::sandbox::service_mode(
                config,
                crate::flows::confinement::credentials::Trust::MergeRequest
            )
            .describe()
        ),
        format!(
            "cgroup: {}",
            crate::flows::confinement::sandbox::CgroupStatus::probe(config).describe(config)
        ),
    ];
    lines.extend(engine_connections(config));
    lines.extend(shared_state_token(config));
    lines.push(format!(
        "accept applies only from the CI job named `{}` on a protected default branch",
        config.apply.job_name
    ));
    lines.push(pages_line(config));
    lines.push(match config.proxmox.for_plan().endpoint {
        Some(e) => format!("run the Proxmox preflight against {e}"),
        None => "skip the Proxmox preflight (no [proxmox] endpoint)".to_string(),
    });
    lines.push(drift_line(config));
    lines
}

/// What a webhook delivery must carry to be believed.
fn webhook_auth(config: &Config) -> &'static str {
    match (&config.gitlab.signing_token, &config.gitlab.webhook_secret) {
        (Some(_), _) => {
            "require a valid webhook-signature (Standard Webhooks, ±5 minutes) on every delivery"
        }
        (None, Some(_)) => {
            "require X-Gitlab-Token to equal gitlab.webhook_secret on every delivery"
        }
        (None, None) => "accept nothing (no webhook credential configured)",
    }
}

/// The store, and for PostgreSQL how it is reached.
fn store_text(config: &Config) -> String {
    match (&config.store.url, config.store.tls()) {
        (StoreUrl::Sqlite(path), _) => format!("its SQLite store at {}", path.display()),
        (StoreUrl::Postgres(_), tls) => format!(
            "its store in PostgreSQL {} {}",
            config.store.url,
            match tls.and_then(Result::ok).map(|t| t.mode) {
                Some(SslMode::Disable) => "in plaintext (sslmode=disable)".to_string(),
                Some(mode) => format!("over TLS (sslmode={})", mode.as_str()),
                None => "(its TLS settings are invalid)".to_string(),
            }
        ),
    }
}

/// Where the engine may connect, when anywhere beyond what every run may.
fn engine_connections(config: &Config) -> Option<String> {
    let needs = crate::flows::confinement::network::needs(config);
    if needs.is_empty() {
        return None;
    }
    let list: Vec<String> = needs
        .iter()
        .map(|n| format!("{}:{} ({}, {})", n.host, n.port, n.what, n.key))
        .collect();
    Some(format!("let the engine connect to {}", list.join(", ")))
}

/// The drift schedule, and its next tick.
fn drift_line(config: &Config) -> String {
    match &config.drift.schedule {
        Some(schedule) => format!(
            "check every root for drift on `{}` ({}), one replica per tick; next: {}",
            config.drift.schedule_text,
            config.drift.time_zone,
            schedule
                .next_after(chrono::Utc::now())
                .map(|t| schedule.local(t))
                .unwrap_or_else(|| "never".into())
        ),
        None => "check no drift on a schedule (drift.enabled is false; `planbot drift` checks now)"
            .to_string(),
    }
}

/// What `--check` says when one `[state.plan]` token serves several projects: the state gate
/// keeps it from MR code, but the token itself reads them all (`planbot doctor` asks GitLab).
fn shared_state_token(config: &Config) -> Option<String> {
    let projects = &config.gitlab.projects.0;
    (config.state.plan.is_some() && projects.len() > 1).then(|| {
        crate::core::templates::text(
            "state.txt.j2",
            "shared_plan_token",
            minijinja::context! {
                projects => projects.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "),
                count => projects.len(),
            },
        )
    })
}

/// What `--check` says about who may read the run pages (a warning for `auth = "none"`).
fn pages_line(config: &Config) -> String {
    use crate::core::config::PagesAuth;
    let pages = match config.pages.auth {
        PagesAuth::Gitlab => format!(
            "serve /runs to users signed in with GitLab ({}), each seeing only the runs of projects where they are Reporter or more",
            config.public_url.as_ref().map(|u| u.callback()).unwrap_or_default(),
        ),
        PagesAuth::Loopback => "serve /runs only to this host (loopback, no proxy); plan notes say where the log is instead of linking it (set [gitlab.oauth] for sign-in)".into(),
        PagesAuth::None => "WARNING: serve /runs to ANYONE who can reach it ([pages] auth = \"none\"): every plan of every project can be read without signing in".into(),
    };
    let metrics = if config.metrics.token.is_some() {
        "/metrics requires the [metrics] bearer token"
    } else {
        "/metrics is off (404): set [metrics] token_file to serve it to a scraper with that bearer token"
    };
    format!("{pages}; {metrics}")
}

/// `serve --check`: the config's problems and the host's (engine, data_dir, placeholders), all
/// at once on stderr with exit 1; else the report on stdout.
fn check(path: &Path) -> Result<ExitCode> {
    let loaded = load_all(path)?;
    let file = path.display().to_string();
    if !loaded.warnings.is_empty() {
        eprintln!(
            "planbot: warning: {}",
            format_list(&file, "warning", &loaded.warnings)
        );
    }
    let mut problems = loaded.problems.clone();
    let mut engine = None;
    if let Some(cfg) = &loaded.config {
        let host = crate::flows::cli::serve_check::check_host(&loaded, cfg);
        problems.extend(host.problems);
        engine = host.engine;
    }
    match loaded.config {
        Some(cfg) if problems.is_empty() => {
            let mut report = check_report(&cfg);
            if let Some(engine) = engine {
                report.push_str(&format!("- run the engine {engine}\n"));
            }
            print!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            eprint!(
                "planbot: {}\nplanbot serve would not start. Fix these and run `planbot serve --config {file} --check` again.\n",
                format_problems(&file, &problems)
            );
            Ok(ExitCode::from(1))
        }
    }
}

pub fn main(config: &Path, check: bool) -> Result<ExitCode> {
    if check {
        return self::check(config);
    }
    let loaded = load_all(config)?;
    let warnings = loaded.warnings.clone();
    let file = config.display().to_string();
    let cfg = loaded
        .into_result()
        .map_err(|problems| anyhow::anyhow!(format_problems(&file, &problems)))?;
    // Never serve where the engines' sandbox can reach planbot (`serve --check` says so too).
    if let Some(text) = crate::flows::confinement::network::own_port_reachable(&cfg) {
        anyhow::bail!("{file}: {text}");
    }
    init_logging(&cfg.log);
    for w in &warnings {
        tracing::warn!(config = %file, "{}", w.describe(&file).replace("\n    ", "; "));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let app = Application::build(cfg).await?;
        let stop = app.stopper();
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("stopping: finishing in-flight requests");
            stop.cancel();
        });
        app.run_until_stopped().await
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The service's log on stderr: `RUST_LOG` when set, else `log_level`, else `info`; plain text
/// (ANSI colours only when stderr is a terminal) or, with `log_format = "json"`, one JSON object
/// per line for a log shipper.
pub fn init_logging(log: &crate::core::config::LogConfig) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::builder()
            .parse(log.level.as_deref().unwrap_or("info"))
            .unwrap_or_else(|_| EnvFilter::new("info"))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match log.format {
        crate::core::config::LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        crate::core::config::LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
    };
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
