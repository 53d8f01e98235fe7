//! `planbot plan DIR`: init + plan + show with the real engine, printed as the note or JSON.
//!
//! Exit codes: 0 planned, 1 the engine failed (the note says why, redacted) or a `--var-file`
//! is missing (said on stderr, before the engine runs), 2 the engine's output was not a plan.
//! With `--policy DIR`, the policies are checked after the plan as `planbot policy test` does
//! (1 a policy failed, 2 they could not be evaluated). With `--config FILE`, the service's
//! Proxmox preflight runs after the plan (its findings and capacity table in the note; 1 an
//! error finding, 2 it could not run, as `planbot preflight`). The binary plan file lives in a private
//! temp dir that is deleted before this returns, also on error, timeout and Ctrl-C.

use crate::capabilities::engine::sandbox::Support;
use crate::capabilities::engine::{
    self, CancelHandle, CliConfig, Engine, EngineError, PlanRequest, PlannedRun, SandboxMode,
    SandboxProfile, StepProgress,
};
use crate::core::fingerprint::Fingerprint;
use crate::core::plan::Plan;
use crate::core::proxmox::findings::Finding;
use crate::core::proxmox::lint::lint;
use crate::core::redact::Scrubber;
use crate::core::render::{render_note, NoteContext, RootOutcome, RootSection, NO_BUDGET};
use crate::core::summary::PlanReport;
use crate::flows::cli::policy::PolicyOptions;
use crate::flows::cli::render::{local_fingerprint_key, Format};
use crate::flows::confinement::plan_request;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// How long the engine gets to stop after SIGTERM before its process group is killed.
const GRACE: Duration = Duration::from_secs(20);

/// Variables given on the command line: `--var-file FILE` (relative to the current directory,
/// like any path argument) and `--var NAME=VALUE`, passed to the engine's `plan` in that order.
#[derive(Debug, Clone, Default)]
pub struct Variables {
    pub var_files: Vec<PathBuf>,
    pub vars: Vec<(String, String)>,
}

/// Each var file as an absolute path, checked before anything runs: a missing or unreadable
/// file is a clear error naming it (its content is never quoted).
fn resolve_var_files(files: &[PathBuf]) -> Result<Vec<PathBuf>> {
    files
        .iter()
        .map(|f| {
            let path = std::fs::canonicalize(f)
                .with_context(|| format!("--var-file {}: cannot read it", f.display()))?;
            if !path.is_file() {
                anyhow::bail!("--var-file {}: not a file", f.display());
            }
            std::fs::File::open(&path)
                .with_context(|| format!("--var-file {}: cannot read it", f.display()))?;
            Ok(path)
        })
        .collect()
}

/// What a local run prints: the note in `format` (the whole plan, or cut to GitLab's note
/// budget with `gitlab_budget`), then, with `--policy`, the policies' result.
#[derive(Debug, Clone)]
pub struct Printed {
    pub format: Format,
    pub policy: Option<PolicyOptions>,
    /// `--budget gitlab`: cut the note as on a merge request. Locally there is no GitLab limit.
    pub gitlab_budget: bool,
    /// `--config FILE`: run the service's Proxmox preflight after the plan, with this service
    /// config's plan endpoint (as `planbot preflight`).
    pub preflight_config: Option<PathBuf>,
}

pub fn plan_command(
    dir: &Path,
    engine: Option<&str>,
    printed: Printed,
    fingerprint_key: Option<&str>,
    timeout: Duration,
    variables: Variables,
    sandbox: Option<SandboxProfile>,
) -> Result<ExitCode> {
    let Printed {
        format,
        policy,
        gitlab_budget,
        preflight_config,
    } = printed;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let key = local_fingerprint_key(fingerprint_key).to_vec();
    let local = LocalRun {
        format,
        key: &key,
        policy: policy.as_ref(),
        gitlab_budget,
        preflight_config: preflight_config.as_deref(),
    };
    rt.block_on(run(dir, engine, local, timeout, variables, sandbox))
}

/// How a local run's result is printed: the note's format, the fingerprint key, the policies
/// checked after the plan (`--policy`), and whether the note is cut to GitLab's budget.
struct LocalRun<'a> {
    format: Format,
    key: &'a [u8],
    policy: Option<&'a PolicyOptions>,
    gitlab_budget: bool,
    preflight_config: Option<&'a Path>,
}

/// The local plan of `dir`, in steps: the engine for a local run ([`local_engine`]), the plan
/// with Ctrl-C and progress wired ([`plan_interruptibly`]), the note printed ([`print_result`]).
async fn run(
    dir: &Path,
    engine: Option<&str>,
    local: LocalRun<'_>,
    timeout: Duration,
    variables: Variables,
    sandbox: Option<SandboxProfile>,
) -> Result<ExitCode> {
    if !dir.is_dir() {
        anyhow::bail!("{} is not a directory", dir.display());
    }
    let operator_var_files = resolve_var_files(&variables.var_files)?;
    if let Some(line) = not_passed(std::env::vars_os().map(|(k, _)| k)) {
        eprintln!("{line}");
    }
    let binary = match engine {
        Some(b) => PathBuf::from(b),
        None => engine::default_binary("pass its path with --engine")?,
    };
    // A private temp root of our own (0700, unique), removed with everything in it at the end.
    let temp_root = tempfile::Builder::new()
        .prefix("planbot-")
        .tempdir()
        .context("creating a private temp dir")?;
    let runner = local_engine(binary, temp_root.path(), timeout, sandbox)?;
    let version = runner.version().await?;
    let (result, started) =
        plan_interruptibly(&runner, dir, operator_var_files, variables.vars).await;
    // `--config`: the service's preflight over the plan, before anything is printed.
    let preflight = match (&result, local.preflight_config) {
        (Ok(run), Some(config)) => {
            Some(match crate::flows::cli::preflight::plan_endpoint(config) {
                Ok((ep, apply, _)) => {
                    crate::flows::preflight::for_plan_as(Some(ep), apply, run.plan()).await
                }
                Err(why) => crate::flows::preflight::PlanPreflight {
                    note: why.clone(),
                    failed: Some(why),
                    ..Default::default()
                },
            })
        }
        _ => None,
    };
    let ctx = NoteContext {
        local_run: true,
        engine: Some(version.to_string()),
        duration: Some(started.elapsed()),
        // Locally there is no GitLab limit: the whole plan, unless `--budget gitlab` asks for
        // the note GitLab would get (0 is GitLab's budget).
        budget: if local.gitlab_budget { 0 } else { NO_BUDGET },
        plan_dir: Some(dir.display().to_string()),
        preflight_note: preflight
            .as_ref()
            .map(|p| p.note.clone())
            .filter(|n| !n.is_empty()),
        capacity: preflight
            .as_ref()
            .and_then(|p| p.capacity.clone())
            .map(|c| std::collections::BTreeMap::from([(root_name(dir), c)]))
            .unwrap_or_default(),
        ..NoteContext::default()
    };
    print_result(result, &runner, &root_name(dir), ctx, local, preflight)
}

/// At most this many names of `TF_VAR_*` variables [`not_passed`] lists.
const NOT_PASSED_SHOWN: usize = 10;

/// The stderr line naming the shell's `TF_VAR_*` variables (of `names`, the environment's)
/// that the engine does not get — its environment is explicit — and how to pass them; `None`
/// when there is none. Their values are never read.
fn not_passed(names: impl Iterator<Item = std::ffi::OsString>) -> Option<String> {
    let mut vars: Vec<String> = names
        .filter_map(|k| k.into_string().ok())
        .filter_map(|k| k.strip_prefix("TF_VAR_").map(str::to_string))
        .filter(|k| !k.is_empty())
        .collect();
    if vars.is_empty() {
        return None;
    }
    vars.sort();
    let more = vars.len().saturating_sub(NOT_PASSED_SHOWN);
    vars.truncate(NOT_PASSED_SHOWN);
    Some(crate::core::templates::text(
        "local_progress.txt.j2",
        "not_passed",
        minijinja::context! { vars => vars, more => more },
    ))
}

/// The engine for a local run: under the sandbox profile asked for (none with
/// `--no-sandbox`), with its run directories in `temp_root`.
fn local_engine(
    binary: PathBuf,
    temp_root: &Path,
    timeout: Duration,
    sandbox: Option<SandboxProfile>,
) -> Result<Engine> {
    let mode = match sandbox {
        None => SandboxMode::Off {
            reason: "--no-sandbox".into(),
        },
        Some(profile) => SandboxMode::with_profile(profile, Support::probe(), true, |reason| {
            crate::flows::confinement::sandbox::text(
                "refused_local",
                minijinja::context! { reason => reason },
            )
        }),
    };
    let runner = Engine::builder(binary, temp_root)
        .not_found_hint("pass its path with --engine")
        .timeout(timeout)
        .grace(GRACE.min(timeout))
        .sandbox(mode)
        // The strict profile is the service's: a private HOME and planbot's own CLI config.
        .cli_config(match sandbox {
            Some(SandboxProfile::Strict) => CliConfig::Owned {
                provider_mirror: None,
            },
            _ => CliConfig::User,
        })
        .build()?;
    Ok(runner)
}

/// The engine's plan of `dir`, with progress lines on stderr and Ctrl-C forwarded as a
/// graceful stop. Also returns when the plan started.
async fn plan_interruptibly(
    runner: &Engine,
    dir: &Path,
    operator_var_files: Vec<PathBuf>,
    vars: Vec<(String, String)>,
) -> (Result<PlannedRun, EngineError>, std::time::Instant) {
    // Ctrl-C: the engine runs in its own process group and does not see the terminal's SIGINT;
    // forward it as the same graceful stop a timeout gets.
    let (cancel, token) = CancelHandle::new();
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("planbot: interrupted, stopping the engine gracefully…");
            cancel.cancel();
        }
    });
    // Progress on stderr: the engine can take minutes.
    let (progress, mut steps) = tokio::sync::mpsc::unbounded_channel::<StepProgress>();
    let printer = tokio::spawn(async move {
        while let Some(p) = steps.recv().await {
            eprintln!("{}", progress_line(&p));
        }
    });
    // The directory as one root of its own (`.planbot.toml`'s absence), with the operator's
    // var files and variables: nothing of the service's credentials, the state locked as the
    // operator's own tools would.
    let whole = crate::core::repo_config::RepoConfig::absent();
    let req = PlanRequest {
        operator_var_files,
        vars,
        cancel: Some(token),
        progress: Some(progress),
        ..plan_request::root_request(&whole.roots[0], &Default::default(), false)
    };
    let started = std::time::Instant::now();
    let result = runner.plan(dir, &req).await;
    drop(req);
    let _ = printer.await;
    ctrl_c.abort();
    (result, started)
}

/// The note (or JSON) of the run on stdout, and the exit code: 0 planned, 1 the engine failed,
/// 2 its output was not a plan. An engine that could not start at all is an error. With
/// `--policy`, the policies' conftest output follows the note (on stderr when the note is
/// JSON, which stays one document), and the exit code is `policy test`'s when it is not 0.
fn print_result(
    result: Result<PlannedRun, EngineError>,
    runner: &Engine,
    root: &str,
    mut ctx: NoteContext,
    local: LocalRun<'_>,
    preflight: Option<crate::flows::preflight::PlanPreflight>,
) -> Result<ExitCode> {
    let format = local.format;
    let mut stdout = std::io::stdout().lock();
    match result {
        Ok(run) => {
            ctx.duration = Some(run.duration());
            let fingerprint = run.fingerprint(local.key);
            // A local state is fine here; planbot's service would lose it: a warning.
            let state = run
                .backend()
                .is_local()
                .then(|| crate::core::state::state_in_checkout(root, ".", run.backend(), false));
            let preflight_findings = preflight
                .as_ref()
                .map(|p| p.findings.clone())
                .unwrap_or_default();
            let text = render_planned(
                run.plan(),
                root,
                &fingerprint,
                &ctx,
                run.scrubber(),
                format,
                state.into_iter().chain(preflight_findings).collect(),
            )?;
            writeln!(stdout, "{text}")?;
            // With `--config`: the preflight's exit code when it is not 0 (1 an error finding,
            // 2 it could not run), as `planbot preflight` exits.
            let preflight_code = preflight
                .as_ref()
                .filter(|p| {
                    p.failed.is_some() || crate::core::proxmox::findings::has_errors(&p.findings)
                })
                .map(crate::flows::cli::preflight::exit_code);
            let Some(policy) = local.policy else {
                return Ok(preflight_code.unwrap_or(ExitCode::SUCCESS));
            };
            let plan_json = String::from_utf8_lossy(run.plan_json());
            let mut stderr = std::io::stderr().lock();
            let out: &mut dyn Write = if format == Format::Json {
                &mut stderr
            } else {
                writeln!(stdout)?;
                &mut stdout
            };
            let report = crate::flows::cli::policy::PlanReport {
                filename: root,
                plan_json: &plan_json,
                plan: run.plan(),
                root,
                scrubber: run.scrubber(),
            };
            let code = crate::flows::cli::policy::check_and_print(&report, policy, out)?;
            Ok(match preflight_code {
                Some(p) if code == ExitCode::SUCCESS => p,
                _ => code,
            })
        }
        Err(e @ EngineError::BadPlanJson { .. }) => {
            let text = render_failed(&e, root, &ctx, &runner.secrets().scrubber(), format)?;
            writeln!(stdout, "{text}")?;
            Ok(ExitCode::from(2))
        }
        Err(e @ (EngineError::NotFound(_) | EngineError::InvalidRequest(_))) => Err(e.into()),
        Err(e) => {
            let text = render_failed(&e, root, &ctx, &runner.secrets().scrubber(), format)?;
            writeln!(stdout, "{text}")?;
            Ok(ExitCode::from(1))
        }
    }
}

/// One progress line (`templates/local_progress.txt.j2`).
fn progress_line(p: &StepProgress) -> String {
    let took = p.took.map(|d| format!("{:.1} s", d.as_secs_f64()));
    crate::core::templates::render(
        "local_progress.txt.j2",
        minijinja::context! { step => p.step.to_string(), took => took },
    )
    .unwrap_or_else(|e| format!("planbot: {} ({e})", p.step))
}

/// The root's name in the note: the directory's own name.
fn root_name(dir: &Path) -> String {
    std::fs::canonicalize(dir)
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| crate::flows::cli::render::DEFAULT_ROOT.to_string())
}

/// The note (or JSON report) of a successful plan: the same renderer as the MR note. The
/// fingerprint is the run's, bound to the provider lock file (as the service computes it).
fn render_planned(
    plan: &Plan,
    root: &str,
    fingerprint: &Fingerprint,
    ctx: &NoteContext,
    scrubber: &Scrubber,
    format: Format,
    extra: Vec<Finding>,
) -> Result<String> {
    let mut findings = lint(plan, &[]);
    findings.extend(extra);
    crate::core::proxmox::findings::sort_findings(&mut findings);
    match format {
        Format::Json => {
            let report = PlanReport::new(plan, fingerprint.as_hex().to_string(), findings);
            Ok(scrubber.pretty_json(&report, b"  "))
        }
        Format::Markdown | Format::Text => {
            let roots = [RootSection {
                name: root.to_string(),
                outcome: RootOutcome::Planned {
                    plan,
                    findings: &findings,
                    fingerprint,
                },
            }];
            Ok(as_format(render_note(ctx, &roots, scrubber), format))
        }
    }
}

/// The note (or JSON object) of a run that produced no plan, with the redacted error.
fn render_failed(
    error: &EngineError,
    root: &str,
    ctx: &NoteContext,
    scrubber: &Scrubber,
    format: Format,
) -> Result<String> {
    let report = scrubber.scrub(&error.report(60)).into_owned();
    match format {
        Format::Json => Ok(serde_json::to_string_pretty(&serde_json::json!({
            "errored": true,
            "error": report,
            "engine": ctx.engine,
        }))?),
        Format::Markdown | Format::Text => {
            let roots = [RootSection {
                name: root.to_string(),
                outcome: RootOutcome::Failed { error: report },
            }];
            Ok(as_format(render_note(ctx, &roots, scrubber), format))
        }
    }
}

/// The note as asked: Markdown as posted on an MR, or plain text for a terminal.
fn as_format(note: String, format: Format) -> String {
    match format {
        Format::Text => crate::core::render::terminal::note_as_text(&note),
        _ => note,
    }
}
