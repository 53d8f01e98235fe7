//! `planbot drift --config FILE`: one drift tick now, exactly as the schedule runs it (the same
//! issues, statuses and runs; `--dry-run` writes none), printed for a terminal; the exit code
//! says 0 clean, 2 drift, 1 could not check.

use crate::flows::context::app_state::App;
use crate::flows::drift::check::{self, Selection};
use anyhow::{Context, Result};
use std::path::Path;
use std::process::ExitCode;

pub fn main(config: &Path, selection: Selection) -> Result<ExitCode> {
    let loaded = crate::flows::cli::serve::load_all(config)?;
    let file = config.display().to_string();
    let cfg = loaded.into_result().map_err(|problems| {
        anyhow::anyhow!(crate::flows::cli::serve::format_problems(&file, &problems))
    })?;
    crate::flows::cli::serve::init_logging(&cfg.log);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let app = App::open(cfg).await?;
        let tick = check::tick(&app, &selection, std::time::SystemTime::now()).await?;
        print!(
            "{}",
            tick.render_text(&app.scrubber, &app.config.apply.job_name)
        );
        Ok(ExitCode::from(tick.exit_code() as u8))
    })
}
