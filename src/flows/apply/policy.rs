//! The apply's policy gate: which sets judge what is applied. The sets and the roots they
//! check come from the default branch *before* the merge (and planbot's own), never from the
//! merged commit, which the merge request wrote: a merge request that renames its root, moves
//! it, drops or edits its sets cannot take itself out of them. Their verdict on a plan is
//! [`super::judge`]'s.

use super::log::{say, Verdict};
use crate::capabilities::gitlab::MergeRequest;
use crate::core::ids::{CommitSha, ProjectId};
use crate::core::repo_config::{ApplySettings, RepoConfig, Root};
use crate::flows::context::app_state::App;
use crate::flows::context::policy_sets::PolicySets;
use anyhow::{Context, Result};
use minijinja::context;

/// The sets that judge an apply, as the default branch had them before the merge.
pub(super) struct PolicyGate {
    /// planbot's sets, then the repository's of the commit before the merge (files from it).
    pub sets: PolicySets,
    /// The roots `(name, dir)` of that commit's `.planbot.toml`.
    pub before_roots: Vec<(String, String)>,
    /// That commit's `[apply]` (the defaults for a first commit): the merged commit's cannot
    /// loosen it ([`crate::core::repo_config::ApplySettings::stricter`]).
    pub before_apply: ApplySettings,
    /// The commit before the merge; `None` for a first commit pushed straight to the branch.
    pub base: Option<CommitSha>,
    /// That commit's `.planbot.toml` (the roots a merge may retire: `core::retire`).
    pub before: Option<RepoConfig>,
}

impl PolicyGate {
    /// The gate of the apply of `sha` on `branch`, landed by `mr` (none: a direct push).
    /// `Err(verdict)` when the commit before the merge cannot be told or its config is invalid:
    /// then nothing is applied.
    pub async fn load(
        app: &App,
        project: ProjectId,
        branch: &str,
        sha: &CommitSha,
        mr: Option<&MergeRequest>,
    ) -> Result<Result<PolicyGate, Verdict>> {
        let say = |kind, ctx| Verdict::Failed(say(&app.scrubber, kind, ctx));
        let Some(base) = before_merge(app, project, sha, mr).await? else {
            if let Some(m) = mr {
                return Ok(Err(say(
                    "no_base",
                    context! { branch => branch, mr => m.iid.0, sha => sha.short() },
                )));
            }
            // The branch's first commit, pushed: nothing came before it but planbot's sets.
            let sets = PolicySets::load_at(app, project, sha.as_str(), branch, &no_sets())
                .await
                .context("reading planbot's policy sets")?;
            return Ok(Ok(PolicyGate {
                sets,
                before_roots: Vec::new(),
                before_apply: ApplySettings::default(),
                base: None,
                before: None,
            }));
        };
        let before = match app
            .workspace
            .repo_config_at(project, base.as_str())
            .await
            .context("reading .planbot.toml before the merge")?
        {
            Ok(c) => c,
            Err(e) => {
                return Ok(Err(say(
                    "invalid_base_config",
                    context! { branch => branch, base => base.short(), error => e.to_string() },
                )))
            }
        };
        let sets = PolicySets::load_at(app, project, base.as_str(), branch, &before)
            .await
            .context("reading the policy sets before the merge")?;
        Ok(Ok(PolicyGate {
            sets,
            before_apply: before.apply,
            before_roots: before
                .roots
                .iter()
                .map(|r| (r.name.clone(), r.dir.clone()))
                .collect(),
            base: Some(base),
            before: Some(before),
        }))
    }

    /// The sets that check `root` of the merged config.
    pub fn covering(&self, root: &Root) -> PolicySets {
        self.sets
            .covering(&root.name, &root.dir, &self.before_roots)
    }
}

/// A config with no repository set, for a branch's first commit.
fn no_sets() -> RepoConfig {
    let mut c = RepoConfig::absent();
    c.policy_sets.clear();
    c
}

/// The default branch before `sha` landed: the first parent of GitLab's merge (or squash)
/// commit or of a pushed commit; for a fast-forward merge, where the MR's own commits are the
/// first parents, the base GitLab gives the MR's diff (which `sha` must descend from).
async fn before_merge(
    app: &App,
    project: ProjectId,
    sha: &CommitSha,
    mr: Option<&MergeRequest>,
) -> Result<Option<CommitSha>> {
    let by_merge_commit = mr.is_none_or(|m| {
        m.merge_commit_sha.as_ref() == Some(sha) || m.squash_commit_sha.as_ref() == Some(sha)
    });
    if by_merge_commit {
        return app
            .workspace
            .rev_parse(project, &format!("{}^1", sha.as_str()))
            .await;
    }
    let iid = mr
        .map(|m| m.iid)
        .expect("a fast-forward has its merge request");
    let full = app
        .gitlab
        .merge_request(project, iid)
        .await
        .context("GET /merge_requests/:iid (the base of its diff)")?;
    let Some(base) = full.diff_refs.and_then(|d| d.base_sha) else {
        return Ok(None);
    };
    if &base == sha || !app.workspace.is_ancestor(project, &base, sha).await? {
        return Ok(None);
    }
    Ok(Some(base))
}
