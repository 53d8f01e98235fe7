//! `planbot check-config FILE`: validates a repo `.planbot.toml` and prints its roots.

use anyhow::Result;
use std::path::Path;
use std::process::ExitCode;

pub fn main(file: &Path) -> Result<ExitCode> {
    let _ = file;
    anyhow::bail!("`planbot check-config` is not built yet (issue 3)")
}
