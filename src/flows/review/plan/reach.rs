//! Stage 2's first step: which roots the MR's changes reach. Every root's module calls are read
//! from the job's checkout (bounded, never through a link out of it) into
//! `core::reach::ModuleGraph`, which decides.

use crate::capabilities::workspace::RootFiles;
use crate::core::reach::{ModuleGraph, Read, MAX_DIR_BYTES};
use crate::core::repo_config::RepoConfig;
use std::path::Path;

/// The module graph of `config`'s roots in the checkout at `checkout`.
pub(super) async fn module_graph(checkout: &Path, config: &RepoConfig) -> ModuleGraph {
    let top = checkout.to_path_buf();
    let dirs: Vec<String> = config.roots.iter().map(|r| r.dir.clone()).collect();
    let read = tokio::task::spawn_blocking(move || {
        ModuleGraph::build(dirs.iter().map(String::as_str), |dir| read_dir(&top, dir))
    })
    .await;
    match read {
        Ok(graph) => graph,
        Err(e) => {
            tracing::warn!(error = %e, "reading the roots' module calls failed");
            ModuleGraph::default()
        }
    }
}

/// One directory of the checkout: its configuration files, or why not. No path of the
/// server's disk is put in a reason.
fn read_dir(top: &Path, dir: &str) -> Read {
    let path = if dir == "." {
        top.to_path_buf()
    } else {
        top.join(dir)
    };
    if !path.is_dir() {
        return Read::Missing;
    }
    let files = match RootFiles::open(top, dir) {
        Ok(files) => files,
        Err(_) => {
            return Read::Unreadable(
                "it resolves outside the repository through a symbolic link: not followed".into(),
            )
        }
    };
    match files.config_files_within(MAX_DIR_BYTES) {
        Ok(read) => Read::Files {
            real: files.repo_dir().to_string(),
            files: read,
        },
        Err(e) => Read::Unreadable(e.to_string()),
    }
}
