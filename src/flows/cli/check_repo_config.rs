//! `planbot check-repo-config FILE`: validates a repo `.planbot.toml` and prints its roots.

use crate::core::repo_config::{render_check_config, render_check_config_error, RepoConfig};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// Prints the roots (stdout, exit 0) or every problem with its line and key (stderr, exit 1).
pub fn main(file: &Path) -> Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let shown = file.display().to_string();
    match RepoConfig::parse(&text) {
        Ok(cfg) => {
            std::io::stdout().write_all(render_check_config(&shown, &cfg).as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            std::io::stderr().write_all(render_check_config_error(&shown, &err).as_bytes())?;
            Ok(ExitCode::from(1))
        }
    }
}
