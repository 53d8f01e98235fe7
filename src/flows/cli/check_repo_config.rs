//! `planbot check-repo-config FILE`: validates a repo `.planbot.toml` against the repository it
//! sits in (every root's `dir` must be one of its directories) and prints its roots.

use crate::core::repo_config::{render_check_config, render_check_config_error, RepoConfig};
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// At most this many directories of the repository are listed (a root's `dir` beyond them is
/// said absent, with no suggestion).
const MAX_DIRS: usize = 50_000;

/// Prints the roots (stdout, exit 0) or every problem with its line and key (stderr, exit 1).
pub fn main(file: &Path) -> Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let shown = file.display().to_string();
    let top = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match RepoConfig::parse_in(&text, &directories(top)) {
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

/// The directories below `top` (the repository the file sits at the top of), repo-relative,
/// hidden ones (`.git`, `.terraform`) and symbolic links not entered, at most [`MAX_DIRS`].
fn directories(top: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut queue = vec![(top.to_path_buf(), String::new())];
    while let Some((dir, rel)) = queue.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if !is_dir || name.starts_with('.') || found.len() >= MAX_DIRS {
                continue;
            }
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            found.insert(path.clone());
            queue.push((entry.path(), path));
        }
    }
    found
}
