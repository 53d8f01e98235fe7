//! `planbot preflight PLAN_JSON --config planbot.toml`: the service's Proxmox preflight over a
//! `show -json` plan, run locally with the config's `[proxmox]` endpoint and plan token, so an
//! operator can check a plan against the cluster before pushing it. Also what
//! `planbot plan DIR --config planbot.toml` runs after a local plan.
//!
//! Exit codes: 0 no error finding, 1 an error finding, 2 the preflight could not run (no
//! endpoint, a config planbot would not start with, a plan that is not a plan document, the API
//! refusing or not answering).

use crate::capabilities::proxmox::ProxmoxEndpoint;
use crate::core::plan::Plan;
use crate::core::proxmox::findings::{has_errors, render_macro};
use crate::core::redact::Secrets;
use crate::flows::cli::render::Format;
use crate::flows::preflight::{endpoint_from_config, for_plan_as, PlanPreflight};
use anyhow::{Context, Result};
use serde_json::json;
use std::path::Path;
use std::process::ExitCode;

/// The plan endpoint of the service config at `config` (`[proxmox.plan]` over `[proxmox]`,
/// then the provider's variables), who the apply acts as (the apply token's id), and the
/// config's secrets; `Err(why)` when the config cannot be used or names no endpoint.
pub fn plan_endpoint(config: &Path) -> Result<(ProxmoxEndpoint, Option<String>, Secrets), String> {
    let loaded = crate::flows::cli::serve::load_all(config).map_err(|e| format!("{e:#}"))?;
    let file = config.display().to_string();
    let cfg = loaded.into_result().map_err(|problems| {
        let list: Vec<String> = problems.iter().map(|p| p.describe(&file)).collect();
        format!("the config is not valid:\n{}", list.join("\n"))
    })?;
    let mut secrets = Secrets::new();
    secrets.extend(cfg.secrets());
    let ep = endpoint_from_config(&cfg.proxmox.for_plan(), &cfg.engine.env)
        .ok_or_else(|| render_macro("preflight_skipped", &json!({})))?;
    let apply = endpoint_from_config(&cfg.proxmox.for_apply(), &cfg.engine.env)
        .map(|a| a.api_token.id().to_string());
    Ok((ep, apply, secrets))
}

/// The exit code of a preflight: 2 when it could not run, 1 with an error finding, else 0.
pub fn exit_code(pf: &PlanPreflight) -> ExitCode {
    if pf.failed.is_some() {
        ExitCode::from(2)
    } else if has_errors(&pf.findings) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The preflight's output: JSON is the `findings` array of `planbot render --format json`;
/// Markdown is the note's preflight line, findings and capacity table; text is that Markdown
/// as plain text.
pub fn format_report(pf: &PlanPreflight, format: Format, secrets: &Secrets) -> String {
    let scrubber = secrets.scrubber();
    match format {
        Format::Json => scrubber.pretty_json(&pf.findings, b"  "),
        Format::Markdown | Format::Text => {
            let markdown = crate::core::templates::scrubbing(&scrubber, || {
                render_macro(
                    "preflight_report",
                    &json!({"note": pf.note, "findings": pf.findings, "capacity": pf.capacity}),
                )
            });
            if format == Format::Text {
                crate::core::render::terminal::note_as_text(&markdown)
            } else {
                markdown
            }
        }
    }
}

/// `planbot preflight PLAN_JSON --config FILE [--format]`.
pub fn main(plan_json: &Path, config: &Path, format: Format) -> Result<ExitCode> {
    let bytes = if plan_json == Path::new("-") {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut b)
            .context("cannot read stdin")?;
        b
    } else {
        std::fs::read(plan_json).with_context(|| format!("cannot read {}", plan_json.display()))?
    };
    let plan = match Plan::from_json(&bytes) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("planbot: {} is {e}", plan_json.display());
            return Ok(ExitCode::from(2));
        }
    };
    drop(bytes);
    let (ep, apply, secrets) = match plan_endpoint(config) {
        Ok(v) => v,
        Err(why) => {
            eprintln!("planbot: the preflight cannot run: {why}");
            return Ok(ExitCode::from(2));
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let pf = runtime.block_on(for_plan_as(Some(ep), apply, &plan));
    println!("{}", format_report(&pf, format, &secrets));
    Ok(exit_code(&pf))
}
