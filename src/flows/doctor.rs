//! `planbot doctor`: checks GitLab, the webhook, the engine and the Proxmox token, and prints fixes.

use anyhow::Result;
use std::path::Path;
use std::process::ExitCode;

pub fn main(config: &Path) -> Result<ExitCode> {
    let _ = config;
    anyhow::bail!("`planbot doctor` is not built yet (issue 5)")
}
