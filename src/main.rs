//! The `planbot` binary: a thin command-line front over the library's flows.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "planbot",
    version,
    about = "Review-before-apply for OpenTofu on GitLab"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum SandboxArg {
    /// Read anything but /proc; write only the root, the run's temp dir and the plugin cache.
    Local,
    /// The service's profile: also a private HOME and planbot's own CLI config.
    Strict,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// The note in Markdown, as posted on the merge request.
    Markdown,
    /// The JSON summary.
    Json,
    /// The note as plain aligned text, for a terminal.
    Text,
}

impl From<Format> for planbot::flows::cli::render::Format {
    fn from(f: Format) -> Self {
        match f {
            Format::Markdown => planbot::flows::cli::render::Format::Markdown,
            Format::Json => planbot::flows::cli::render::Format::Json,
            Format::Text => planbot::flows::cli::render::Format::Text,
        }
    }
}

/// `--budget` of `planbot render` and `planbot plan`: which size limit the note is cut to.
#[derive(Clone, Copy, ValueEnum)]
enum BudgetArg {
    /// GitLab's note size budget, as planbot posts it on a merge request.
    Gitlab,
}

/// `--engine-name` of `planbot render`.
#[derive(Clone, Copy, ValueEnum)]
enum EngineName {
    #[value(alias = "opentofu")]
    Tofu,
    Terraform,
}

impl From<EngineName> for planbot::core::engine_kind::EngineKind {
    fn from(e: EngineName) -> Self {
        match e {
            EngineName::Tofu => planbot::core::engine_kind::EngineKind::OpenTofu,
            EngineName::Terraform => planbot::core::engine_kind::EngineKind::Terraform,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the service (webhooks, plan queue, apply endpoint, run pages).
    Serve {
        /// The service's config file (every key can also come from a PLANBOT_* variable).
        #[arg(long, value_name = "FILE", default_value = "/etc/planbot/planbot.toml")]
        config: PathBuf,
        /// Validate the config, print what the service would do, and exit.
        #[arg(long)]
        check: bool,
    },
    /// Render a `show -json` plan document (`-` = stdin) as the MR note or the JSON summary.
    Render(RenderArgs),
    /// Run init + plan + show in DIR with the real engine and print the same output.
    Plan(PlanArgs),
    /// Rego policies over plans, as conftest runs them.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// The Proxmox preflight of the service over a `show -json` plan (`-` = stdin), with the
    /// config's `[proxmox]` endpoint and plan token: exit 0 without an error finding, 1 with
    /// one, 2 when it could not run.
    Preflight {
        /// The plan as `tofu show -json` (or `terraform show -json`) prints it.
        #[arg(value_name = "PLAN_JSON")]
        plan_json: PathBuf,
        /// The service's config file: its Proxmox endpoint and plan token.
        #[arg(long, value_name = "FILE", default_value = "/etc/planbot/planbot.toml")]
        config: PathBuf,
        /// `json`: the `findings` array of `planbot render --format json`. Default: `text` on a
        /// terminal, `markdown` when piped.
        #[arg(long, value_enum)]
        format: Option<Format>,
    },
    /// Check the GitLab token, webhook, engine binary and Proxmox token; print fixes.
    Doctor {
        /// The service's config file, as `planbot serve` reads it.
        #[arg(long, value_name = "FILE", default_value = "/etc/planbot/planbot.toml")]
        config: PathBuf,
    },
    /// Check every root of the configured projects for drift now, as the schedule does: plan
    /// the default branch's head, keep each root's drift issue and the `planbot/drift` status
    /// in step. Exit 0 clean, 2 drift, 1 could not check.
    Drift {
        /// The service's config file, as `planbot serve` reads it.
        #[arg(long, value_name = "FILE", default_value = "/etc/planbot/planbot.toml")]
        config: PathBuf,
        /// Only this project (its path or numeric id, as listed in `gitlab.projects`).
        #[arg(long)]
        project: Option<String>,
        /// Only roots of this name.
        #[arg(long)]
        root: Option<String>,
        /// Plan and print only: no issue, status or run is written.
        #[arg(long)]
        dry_run: bool,
    },
    /// Validate a repository's `.planbot.toml` and print the roots it defines (`check-config`,
    /// its earlier name, still works).
    #[command(visible_alias = "check-config")]
    CheckRepoConfig {
        /// The repository's `.planbot.toml`.
        file: PathBuf,
    },
    /// Manage the store: `planbot store migrate --from sqlite://… --to postgres://…`.
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// Client for the manual `planbot-apply` CI job: calls planbot with `CI_JOB_TOKEN`, streams
    /// the log, exits 0 only when planbot reports `planbot: apply succeeded`.
    ApplyJob {
        /// planbot's public URL (default: `$PLANBOT_URL`).
        #[arg(long)]
        url: Option<String>,
        /// Fingerprint prefix of a changed plan you read and accept (default: `$PLANBOT_CONFIRM`).
        #[arg(long)]
        confirm: Option<String>,
        /// Apply only this root (as named in `.planbot.toml`); repeatable. Default: every root.
        #[arg(long = "root", value_name = "ROOT")]
        roots: Vec<String>,
    },
}

// The arguments of `planbot render` (its help text is the doc comment of `Command::Render`).
#[derive(Args)]
struct RenderArgs {
    /// The JSON of `tofu show -json PLANFILE` (not the binary plan file itself); `-` reads stdin.
    #[arg(value_name = "PLAN_JSON")]
    plan_json: PathBuf,
    /// Default: `text` on a terminal, `markdown` when piped (as `planbot plan`).
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Key of the plan fingerprint (HMAC-SHA256); without it a fixed, public local key is used.
    #[arg(long, env = "PLANBOT_FINGERPRINT_KEY", hide_env_values = true)]
    fingerprint_key: Option<String>,
    /// The engine that wrote the plan, for the footer (default: told from the document when
    /// it says so clearly, else only the version is shown).
    #[arg(long, value_enum)]
    engine_name: Option<EngineName>,
    /// `gitlab`: cut the note to GitLab's size budget, as on a merge request (default: the
    /// whole plan; locally there is no GitLab limit).
    #[arg(long, value_enum)]
    budget: Option<BudgetArg>,
}

// The arguments of `planbot plan` (its help text is the doc comment of `Command::Plan`).
#[derive(Args)]
struct PlanArgs {
    /// The root module to plan (a directory with `.tf` files).
    dir: PathBuf,
    /// Engine binary: `tofu` (preferred), `terraform`, or a path.
    #[arg(long)]
    engine: Option<String>,
    /// Default: `text` on a terminal, `markdown` when piped.
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Key of the plan fingerprint (HMAC-SHA256); without it a fixed, public local key is used.
    #[arg(long, env = "PLANBOT_FINGERPRINT_KEY", hide_env_values = true)]
    fingerprint_key: Option<String>,
    /// Give up (SIGTERM, then kill after a grace period) after this long.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
    /// A variable file for the engine's `plan` (`-var-file`); repeatable, later files win.
    #[arg(long = "var-file", value_name = "FILE")]
    var_files: Vec<PathBuf>,
    /// A variable (`-var NAME=VALUE`); repeatable; wins over every `--var-file`.
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
    vars: Vec<(String, String)>,
    /// The engine's sandbox: `local` (read anything but /proc, write only the root, the
    /// run's temp dir and plugin cache) or `strict` (the service's profile).
    #[arg(
        long,
        value_enum,
        default_value = "local",
        conflicts_with = "no_sandbox"
    )]
    sandbox: SandboxArg,
    /// Run the engine without a sandbox.
    #[arg(long)]
    no_sandbox: bool,
    /// After the plan, check it with the Rego policies of this directory (as
    /// `planbot policy test` does).
    #[arg(long, value_name = "DIR")]
    policy: Option<PathBuf>,
    /// The Rego package of the policies' rules.
    #[arg(long, default_value = "main", requires = "policy")]
    namespace: String,
    /// `gitlab`: cut the note to GitLab's size budget, as on a merge request (default: the
    /// whole plan; locally there is no GitLab limit).
    #[arg(long, value_enum)]
    budget: Option<BudgetArg>,
    /// After the plan, run the service's Proxmox preflight with this service config's
    /// `[proxmox]` endpoint and plan token (as `planbot preflight`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// `NAME=VALUE` of `--var` (the value may hold `=`; the name is checked before the engine runs).
fn parse_var(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if planbot::capabilities::engine::is_variable_name(name) => {
            Ok((name.to_string(), value.to_string()))
        }
        Some((name, _)) => Err(format!(
            "{name:?} is not a variable name (letters, digits, `-` and `_`, starting with a letter or `_`)"
        )),
        None => Err("expected NAME=VALUE".to_string()),
    }
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Evaluate a directory of Rego policies over a `show -json` document (`-` = stdin) and
    /// print the result as conftest does; exit 1 when a policy fails.
    Test {
        plan_json: PathBuf,
        /// The directory of `.rego` files (read recursively).
        #[arg(long, value_name = "DIR")]
        policy: PathBuf,
        /// The Rego package of the rules (`deny`, `violation`, `warn`).
        #[arg(long, default_value = "main")]
        namespace: String,
        #[arg(long, value_enum, default_value = "text")]
        output: PolicyOutput,
        /// The root name the policies see as `data.planbot.root`.
        #[arg(long, default_value = ".")]
        root: String,
        /// Stop the evaluation (an error, never a pass) after this long.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        limit: std::time::Duration,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum PolicyOutput {
    Text,
    Json,
}

impl From<PolicyOutput> for planbot::flows::cli::policy::Output {
    fn from(o: PolicyOutput) -> Self {
        match o {
            PolicyOutput::Text => planbot::flows::cli::policy::Output::Text,
            PolicyOutput::Json => planbot::flows::cli::policy::Output::Json,
        }
    }
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Copy every row of one store into another, empty one (stop planbot first), keeping ids.
    Migrate {
        /// The store to copy: `sqlite:///var/lib/planbot/planbot.db`.
        #[arg(long)]
        from: String,
        /// The empty store to fill: `postgres://planbot@db.internal/planbot`.
        #[arg(long)]
        to: String,
        /// A file holding the PostgreSQL password (else the URL's, or none).
        #[arg(long)]
        password_file: Option<PathBuf>,
        /// The CA (PEM) the PostgreSQL server's certificate must chain to, as `store.ca_file`
        /// (or `sslrootcert=` in the URL; TLS as the URL's `sslmode` says).
        #[arg(long)]
        ca_file: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Every text comes from `templates/`: a broken template stops planbot here, not on the
    // first webhook.
    if let Err(e) = planbot::core::templates::check() {
        eprintln!("planbot: templates/ are broken: {e:#}");
        return ExitCode::from(1);
    }
    match cli.command.run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("planbot: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// `--format` as chosen, else `text` on a terminal and `markdown` when piped.
fn chosen_format(format: Option<Format>) -> planbot::flows::cli::render::Format {
    format
        .map(Into::into)
        .unwrap_or_else(planbot::flows::cli::render::Format::for_stdout)
}

impl Command {
    /// Run the subcommand: its flow in the library.
    fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            Command::Serve { config, check } => planbot::flows::cli::serve::main(&config, check),
            Command::Render(args) => args.run(),
            Command::Plan(args) => args.run(),
            Command::Policy {
                command:
                    PolicyCommand::Test {
                        plan_json,
                        policy,
                        namespace,
                        output,
                        root,
                        limit,
                    },
            } => planbot::flows::cli::policy::test_command(
                &plan_json,
                &root,
                &planbot::flows::cli::policy::PolicyOptions {
                    dir: policy,
                    namespace,
                    limit,
                    output: output.into(),
                },
            ),
            Command::Preflight {
                plan_json,
                config,
                format,
            } => planbot::flows::cli::preflight::main(&plan_json, &config, chosen_format(format)),
            Command::Doctor { config } => planbot::flows::cli::doctor::main(&config),
            Command::Drift {
                config,
                project,
                root,
                dry_run,
            } => planbot::flows::cli::drift::main(
                &config,
                planbot::flows::drift::check::Selection {
                    project,
                    root,
                    dry_run,
                    ..Default::default()
                },
            ),
            Command::CheckRepoConfig { file } => {
                planbot::flows::cli::check_repo_config::main(&file)
            }
            Command::Store {
                command:
                    StoreCommand::Migrate {
                        from,
                        to,
                        password_file,
                        ca_file,
                    },
            } => planbot::flows::cli::store_migrate::main(
                &from,
                &to,
                password_file.as_deref(),
                ca_file.as_deref(),
            ),
            Command::ApplyJob {
                url,
                confirm,
                roots,
            } => planbot::flows::cli::apply_job::main(url, confirm, roots),
        }
    }
}

impl RenderArgs {
    /// `planbot render`: the plan document as the note or the JSON summary.
    fn run(self) -> anyhow::Result<ExitCode> {
        planbot::flows::cli::render::render_command(
            &self.plan_json,
            chosen_format(self.format),
            self.fingerprint_key.as_deref(),
            self.engine_name.map(Into::into),
            matches!(self.budget, Some(BudgetArg::Gitlab)),
        )
    }
}

impl PlanArgs {
    /// `planbot plan`: init, plan and show in the directory, printed as `render` prints.
    fn run(self) -> anyhow::Result<ExitCode> {
        let printed = planbot::flows::cli::plan::Printed {
            format: chosen_format(self.format),
            policy: self
                .policy
                .map(|dir| planbot::flows::cli::policy::PolicyOptions {
                    dir,
                    namespace: self.namespace,
                    limit: planbot::core::policy::DEFAULT_LIMIT,
                    output: planbot::flows::cli::policy::Output::Text,
                }),
            gitlab_budget: matches!(self.budget, Some(BudgetArg::Gitlab)),
            preflight_config: self.config,
        };
        let sandbox = match (self.no_sandbox, self.sandbox) {
            (true, _) => None,
            (false, SandboxArg::Local) => {
                Some(planbot::capabilities::engine::SandboxProfile::Local)
            }
            (false, SandboxArg::Strict) => {
                Some(planbot::capabilities::engine::SandboxProfile::Strict)
            }
        };
        planbot::flows::cli::plan::plan_command(
            &self.dir,
            self.engine.as_deref(),
            printed,
            self.fingerprint_key.as_deref(),
            self.timeout,
            planbot::flows::cli::plan::Variables {
                var_files: self.var_files,
                vars: self.vars,
            },
            sandbox,
        )
    }
}
