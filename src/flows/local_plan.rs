//! `planbot plan DIR`: init + plan + show with the real engine, printed as the note or JSON.

use crate::flows::report::Format;
use anyhow::Result;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

pub fn plan_command(
    dir: &Path,
    engine: Option<&str>,
    format: Format,
    fingerprint_key: Option<&str>,
    timeout: Duration,
) -> Result<ExitCode> {
    let _ = (dir, engine, format, fingerprint_key, timeout);
    anyhow::bail!("`planbot plan` is not built yet (issue 2)")
}
