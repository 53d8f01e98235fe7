//! `planbot render`, and the output shared with `planbot plan`: the note or the JSON report.

use anyhow::Result;
use std::path::Path;
use std::process::ExitCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Markdown,
    Json,
}

/// `planbot render PLAN_JSON`: exit 0 on success, 2 when the input is not a plan document.
pub fn render_command(
    path: &Path,
    format: Format,
    fingerprint_key: Option<&str>,
) -> Result<ExitCode> {
    let _ = (path, format, fingerprint_key);
    anyhow::bail!("`planbot render` is not built yet (issue 2)")
}
