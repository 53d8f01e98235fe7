//! `planbot serve`: builds the application (store, queue, workers, HTTP) and runs it.

use anyhow::Result;
use std::path::Path;
use std::process::ExitCode;

pub fn main(config: &Path, check: bool) -> Result<ExitCode> {
    let _ = (config, check);
    anyhow::bail!("`planbot serve` is not built yet (issue 3)")
}
