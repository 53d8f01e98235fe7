//! Stage 2's first step: which roots the MR's changes reach. Every root's module calls are read
//! from the job's checkout (`capabilities::workspace::module_graph`: bounded, never through a
//! link out of it) into `core::reach::ModuleGraph`, which decides.

use crate::core::reach::ModuleGraph;
use crate::core::repo_config::RepoConfig;
use std::path::Path;

/// The module graph of `config`'s roots in the checkout at `checkout`.
pub(super) async fn module_graph(checkout: &Path, config: &RepoConfig) -> ModuleGraph {
    let top = checkout.to_path_buf();
    let dirs: Vec<String> = config.roots.iter().map(|r| r.dir.clone()).collect();
    let read = tokio::task::spawn_blocking(move || {
        crate::capabilities::workspace::module_graph(&top, &dirs)
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
