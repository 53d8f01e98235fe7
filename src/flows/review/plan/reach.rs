//! Stage 2's first step: which roots the MR's changes reach. Every root's module calls are read
//! from the job's checkout (`capabilities::workspace::module_graph`: bounded, never through a
//! link out of it) into `core::reach::ModuleGraph`, which decides.

use super::prepare::Prepared;
use crate::core::events::PlanJob;
use crate::core::reach::{self, Decision, DependsHint, ModuleGraph, OwnProject};
use crate::core::repo_config::RepoConfig;
use crate::flows::context::app_state::App;
use std::path::Path;

/// What the changes reach.
pub(super) struct Reach<'a> {
    /// Each root of the repo config and whether the changes reach it (its own files, the
    /// local modules it uses, its `when_modified` patterns).
    pub decisions: Vec<Decision<'a>>,
    /// The `depends_on` lines the repo config lacks (a root reads another's managed state).
    pub depends_hints: Vec<DependsHint>,
    /// The changed configuration files no root claims ([`reach::in_no_root`]).
    pub in_no_root: Vec<String>,
    /// Every root's module calls in the checkout (what a change between two pushes reaches is
    /// decided on them too: `super::reuse`).
    pub modules: ModuleGraph,
}

/// What the MR's changes reach ([`Reach`]).
pub(super) async fn decide<'a>(app: &App, job: &PlanJob, prepared: &'a Prepared) -> Reach<'a> {
    let config = &prepared.config;
    let modules = module_graph(prepared.checkout.path(), config).await;
    let decisions = reach::decide(config, &prepared.changed, &modules);
    let own = OwnProject {
        id: job.project.0,
        path: prepared.project_path.as_deref(),
    };
    let hints = reach::depends_on_hints(config, &modules, own, |root| {
        crate::core::state::gitlab_state_name(root, app.config.state.default)
    });
    let in_no_root = reach::in_no_root(&decisions, &prepared.changed, &modules);
    Reach {
        decisions,
        depends_hints: hints,
        in_no_root,
        modules,
    }
}

/// The module graph of `config`'s roots in the checkout at `checkout`.
async fn module_graph(checkout: &Path, config: &RepoConfig) -> ModuleGraph {
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
