//! The apply's policy gate: which sets judge what is applied, and their verdict. The sets and
//! the roots they check come from the default branch *before* the merge (and planbot's own),
//! never from the merged commit, which the merge request wrote: a merge request that renames
//! its root, moves it, drops or edits its sets cannot take itself out of them. The reviewed
//! plan is judged by the verdict recorded on the merge request when that verdict holds every
//! set that checks the root now; any other plan (confirmed with `PLANBOT_CONFIRM`, a root the
//! sets did not check at review) is checked here, and waits for an owner where a set fails.

use super::{ApplyCtx, Verdict};
use crate::capabilities::engine::PlannedRun;
use crate::capabilities::gitlab::MergeRequest;
use crate::capabilities::store::{PolicyApproval, PolicyVerdictRecord, ShownFingerprint};
use crate::core::apply::{ApplyRefusal, PolicyAtApply};
use crate::core::apply_note::Reliance;
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, ProjectId};
use crate::core::policy::review::{RecordedVerdict, SetOrigin};
use crate::core::repo_config::{RepoConfig, Root};
use crate::flows::context::app_state::App;
use crate::flows::context::cpu::cpu_bound;
use crate::flows::context::policy_sets::PolicySets;
use anyhow::{Context, Result};
use minijinja::context;

/// The sets that judge an apply, as the default branch had them before the merge.
pub(super) struct PolicyGate {
    /// planbot's sets, then the repository's of the commit before the merge (files from it).
    pub sets: PolicySets,
    /// The roots `(name, dir)` of that commit's `.planbot.toml`.
    pub before_roots: Vec<(String, String)>,
    /// The commit before the merge; `None` for a first commit pushed straight to the branch.
    pub base: Option<CommitSha>,
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
        let say = |kind, ctx| Verdict::Failed(super::say(&app.scrubber, kind, ctx));
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
                base: None,
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
            before_roots: before
                .roots
                .iter()
                .map(|r| (r.name.clone(), r.dir.clone()))
                .collect(),
            base: Some(base),
        }))
    }

    /// The sets that check `root` of the merged config.
    fn covering(&self, root: &Root) -> PolicySets {
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

impl ApplyCtx {
    /// The policy gate of one root's plan to apply (`planned`, `fingerprint`): the verdict
    /// recorded for the reviewed plan when it holds every set that checks the root now (and
    /// the owners' approvals of that plan); else the sets' verdict on this plan, recorded on
    /// the merge request so that an owner can approve it there.
    pub(super) async fn policy_refusal(
        &self,
        root: &Root,
        confirmed: bool,
        reviewed: Option<&ShownFingerprint>,
        planned: &PlannedRun,
        fingerprint: &Fingerprint,
    ) -> Result<Option<ApplyRefusal>> {
        let sets = self.policy.covering(root);
        if let (false, Some(r), Some(mr)) = (confirmed, reviewed, &self.mr) {
            let store = &self.app.store;
            let verdict = store
                .policy_verdicts(self.project, mr.iid, &r.sha)
                .await?
                .into_iter()
                .find(|v| v.root == root.name && v.fingerprint == r.fingerprint)
                .filter(|v| {
                    sets.sets
                        .iter()
                        .all(|s| v.verdict.sets.iter().any(|rs| rs.name == s.spec.name))
                });
            if let Some(v) = verdict {
                return self.reviewed_verdict(&root.name, r, &v.verdict).await;
            }
        }
        if sets.sets.is_empty() {
            return Ok(None);
        }
        self.log.say(
            "policy_check_now",
            context! {
                root => &root.name,
                branch => &self.branch,
                base => self.policy.base.as_ref().map(|b| b.short().to_string()),
            },
        );
        let facts = crate::core::proxmox::findings::Facts {
            parallelism: root.parallelism,
            ..Default::default()
        };
        let findings = cpu_bound(|| {
            crate::core::proxmox::lint::lint_with(planned.plan(), &root.lint_disable, &facts)
        });
        let recorded = cpu_bound(|| {
            let document = sets.read_document(&root.name, planned.plan_json());
            // As with the preflight's findings, what the plan takes from the cluster is read
            // at plan time: a verdict made here (none was recorded) sees lint findings only.
            let verdict = sets.evaluate(&root.name, document, &findings, None);
            sets.record(&root.name, &verdict, planned.scrubber())
        });
        let mut approvals = Vec::new();
        if let Some(mr) = &self.mr {
            self.app
                .store
                .record_policy_verdict(PolicyVerdictRecord {
                    project: self.project,
                    mr: mr.iid,
                    root: root.name.clone(),
                    sha: self.sha.clone(),
                    fingerprint: fingerprint.clone(),
                    verdict: recorded.clone(),
                })
                .await?;
            approvals = self
                .app
                .store
                .policy_approvals(self.project, mr.iid)
                .await?;
        }
        let ok = PolicyApproval::sets_for(&approvals, &root.name, &self.sha, fingerprint);
        for set in &recorded.sets {
            if !set.blocks() {
                self.relied_on(
                    Reliance::Passed,
                    "policy_now_passed",
                    context! { root => &root.name, set => &set.name },
                );
            } else if ok.contains(&set.name.as_str()) {
                let approvers: Vec<&str> = approvals
                    .iter()
                    .filter(|a| a.root == root.name && a.sha == self.sha && a.set == set.name)
                    .filter(|a| &a.fingerprint == fingerprint)
                    .map(|a| a.approver.as_str())
                    .collect();
                self.relied_on(
                    Reliance::Approved,
                    "policy_now_approved",
                    context! { root => &root.name, set => &set.name, approvers => approvers },
                );
            }
        }
        Ok(recorded.first_unapproved(&ok).map(|set| {
            ApplyRefusal::PolicyFailedAtApply(Box::new(PolicyAtApply {
                root: root.name.clone(),
                set: set.name.clone(),
                operator: set.origin == SetOrigin::Operator,
                branch: self.branch.clone(),
                base: self
                    .policy
                    .base
                    .as_ref()
                    .map(|b| b.short().to_string())
                    .unwrap_or_default(),
                message: set.first_message(),
                owners: set.owners.iter().map(|o| o.to_string()).collect(),
                mr: self.mr.as_ref().map(|m| m.iid.0),
            }))
        }))
    }

    /// The gate of the reviewed plan `r`: its recorded verdict and the approvals of that plan.
    async fn reviewed_verdict(
        &self,
        root: &str,
        r: &ShownFingerprint,
        verdict: &RecordedVerdict,
    ) -> Result<Option<ApplyRefusal>> {
        let Some(mr) = &self.mr else { return Ok(None) };
        let approvals = self
            .app
            .store
            .policy_approvals(self.project, mr.iid)
            .await?;
        let ok = PolicyApproval::sets_for(&approvals, root, &r.sha, &r.fingerprint);
        for set in verdict.blocking().filter(|s| ok.contains(&s.name.as_str())) {
            let approvers: Vec<&str> = approvals
                .iter()
                .filter(|a| a.root == root && a.sha == r.sha && a.set == set.name)
                .filter(|a| a.fingerprint == r.fingerprint)
                .map(|a| a.approver.as_str())
                .collect();
            self.relied_on(
                Reliance::Approved,
                "policy_approved",
                context! { root => root, set => &set.name, approvers => approvers },
            );
        }
        let passed = verdict.sets.iter().filter(|s| !s.blocks()).count();
        if passed > 0 {
            self.relied_on(
                Reliance::Passed,
                "policies_passed",
                context! { root => root, count => passed },
            );
        }
        Ok(verdict
            .first_unapproved(&ok)
            .map(|set| ApplyRefusal::PolicyFailed {
                root: root.to_string(),
                set: set.name.clone(),
                message: set.first_message(),
                owners: set.owners.iter().map(|o| o.to_string()).collect(),
            }))
    }
}
