//! The roots a merge retires (docs/workflow.md, "Retiring a root"; the decision is
//! `core::retire`'s): each is planned as its destroy (`-destroy`) from the code before the merge,
//! with the apply credentials, and applied only when that plan is the destroy reviewed on the MR;
//! once its state holds no resource, its GitLab-managed state is deleted.

use crate::capabilities::state_gate::GateProject;
use crate::capabilities::workspace::Checkout;
use crate::core::config::StateDefault;
use crate::core::ids::{CommitSha, ProjectId};
use crate::core::repo_config::{RepoConfig, Root};
use crate::core::retire::{self, Retired};
use crate::flows::confinement::credentials::Trust;
use crate::flows::confinement::plan_request::JobRuns;
use crate::flows::context::app_state::App;
use anyhow::{Context, Result};

/// The roots this apply retires, and what their destroys run with.
pub(super) struct Retiring {
    /// The retired roots as the config before the merge has them, dependents first (a root is
    /// destroyed before those it read from).
    pub roots: Vec<Root>,
    /// Their requests: the apply credentials over the checkout of the commit before the merge.
    pub runs: JobRuns,
    state_default: StateDefault,
    /// The checkout `runs` run in, kept as long as they may.
    _checkout: Checkout,
}

impl Retiring {
    /// The roots the merge of `sha` retires (`before`: the config before it, at `base`; `after`:
    /// the merged commit's), those of `only` when it names any; `None` when it retires none.
    pub async fn of(
        app: &App,
        project: GateProject,
        before: Option<(&RepoConfig, &CommitSha)>,
        after: &RepoConfig,
        sha: &CommitSha,
        only: &[String],
    ) -> Result<Option<Retiring>> {
        let Some((before, base)) = before else {
            return Ok(None);
        };
        let id = ProjectId(project.id);
        let ws = &app.workspace;
        let named: Vec<&str> = before.roots.iter().map(|r| r.dir.as_str()).collect();
        let mut dirs = ws
            .directories_at(id, sha.as_str())
            .await
            .context("listing the merged commit's directories")?;
        dirs.extend(
            ws.paths_at(id, sha.as_str(), &named)
                .await
                .context("listing the merged commit's root paths")?,
        );
        let dirs_before = ws
            .directories_at(id, base.as_str())
            .await
            .context("listing the directories before the merge")?;
        let trees = retire::Trees {
            before: &dirs_before,
            after: &dirs,
        };
        let state_default = app.config.state.default;
        let retired = retire::retirements(before, Some(after), trees, state_default).retired;
        let asked = |r: &&Retired| only.is_empty() || only.contains(&r.root.name);
        let mut named: Vec<&Retired> = retired.iter().filter(asked).collect();
        if named.is_empty() {
            return Ok(None);
        }
        // Dependents first: the reverse of the order the config before the merge applies in.
        let graph = before.graph();
        let order = graph.order();
        let at = |r: &&Retired| order.iter().position(|n| *n == r.root.name);
        named.sort_by_key(|r| std::cmp::Reverse(at(r)));
        let checkout = app
            .workspace
            .checkout(id, base)
            .await
            .context("checking out the commit before the merge")?;
        let runs = JobRuns::new(
            &app.config,
            Trust::DefaultBranch,
            project,
            base,
            checkout.path(),
        );
        Ok(Some(Retiring {
            roots: named.into_iter().map(|r| r.root.clone()).collect(),
            runs,
            state_default,
            _checkout: checkout,
        }))
    }

    /// Whether `root` is one this apply retires.
    pub fn retires(&self, root: &str) -> bool {
        self.roots.iter().any(|r| r.name == root)
    }

    /// The GitLab-managed state of retired `root` (`None`: not retired, or its own backend).
    pub fn state_of(&self, root: &str) -> Option<String> {
        let root = self.roots.iter().find(|r| r.name == root)?;
        crate::core::state::gitlab_state_name(root, self.state_default)
    }
}
