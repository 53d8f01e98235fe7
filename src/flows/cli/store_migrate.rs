//! `planbot store migrate --from URL --to URL`: copy every row of one store into another, empty
//! one (SQLite → PostgreSQL when moving to several replicas), keeping ids.

use crate::capabilities::store::{PgOptions, Store};
use crate::core::config::StoreUrl;
use anyhow::{Context, Result};
use std::path::Path;
use std::process::ExitCode;

/// Copies `from` into `to` (both migrated to this binary's schema first); prints what it copied.
/// Stop every planbot using `from` first: rows written during the copy are not copied.
/// `ca_file` is `store.ca_file` for a PostgreSQL end (TLS as its URL's `sslmode` says).
pub fn main(
    from: &str,
    to: &str,
    password_file: Option<&Path>,
    ca_file: Option<&Path>,
) -> Result<ExitCode> {
    let from = StoreUrl::parse(from).map_err(|e| anyhow::anyhow!("--from: {e}"))?;
    let to = StoreUrl::parse(to).map_err(|e| anyhow::anyhow!("--to: {e}"))?;
    let password = password_file
        .map(|p| {
            std::fs::read_to_string(p)
                .map(|s| s.trim_end_matches(['\n', '\r']).to_string())
                .with_context(|| format!("reading --password-file {}", p.display()))
        })
        .transpose()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async {
        let open =
            |url| Store::connect_tls(url, password.as_deref(), ca_file, PgOptions::default());
        let source = open(&from).await?;
        let target = open(&to).await?;
        let dump = source
            .export()
            .await
            .with_context(|| format!("reading {from}"))?;
        target
            .import(dump.clone())
            .await
            .with_context(|| format!("writing {to} (it must be empty)"))?;
        println!("copied {from} to {to}:");
        for (table, rows) in dump.counts() {
            println!("  {table}: {rows} rows");
        }
        Ok(ExitCode::SUCCESS)
    })
}
