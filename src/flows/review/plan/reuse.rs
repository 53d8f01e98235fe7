//! Stage 2's second step: which roots of this head show the plan of an earlier push again
//! (docs/workflow.md, "Plans reused across pushes"). A root's last plan (kept in the store
//! without a secret, `flows::context::plan_reuse`) is reused when the changes between the commit it was
//! planned at and this one reach neither it nor a root it depends on (`core::reach`, the one
//! decision of what a change reaches: its files, the local modules it uses, its
//! `when_modified`), and every [`Unchanged`] input is equal: the target and default branches'
//! heads, its `.planbot.toml` entry, the engine, a comment's flags, and its GitLab-managed
//! state's serial (an apply or a drift fix makes a new version). `planbot plan` plans every
//! root again; a root whose state is not GitLab-managed is always planned (its state cannot be
//! told unchanged), and so is one whose providers no committed lock file pins ([`keeps`]).

use super::prepare::Prepared;
use crate::core::events::{PlanJob, PlanReason};
use crate::core::reach::{self, Decision, ModuleGraph};
use crate::core::repo_config::Root;
use crate::flows::context::app_state::App;
use crate::flows::context::plan_reuse::{self, Candidate, Reusable, Unchanged};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What this head reuses, and what a fresh plan of each root is kept with.
#[derive(Default)]
pub(super) struct Reuse {
    /// The roots whose last plan is shown again.
    pub reused: BTreeMap<String, Arc<Reusable>>,
    /// Each affected root's inputs now (none for a root whose state cannot be told unchanged):
    /// a fresh plan is kept with them.
    pub unchanged: BTreeMap<String, Unchanged>,
    /// The affected roots with no committed dependency lock file at this commit: a fresh plan
    /// that installed providers is not kept ([`keeps`]).
    pub unlocked: BTreeSet<String>,
}

/// Whether a root's clean fresh plan is kept for the next push: not when it installed
/// providers (`installed`: it left a lock file) that no committed lock file pins (`locked`),
/// as a newer provider release, which the next `init` would pick, could change its plan.
pub(super) fn keeps(locked: bool, installed: bool) -> bool {
    locked || !installed
}

/// The path of `dir`'s dependency lock file in the repository.
fn lock_path(dir: &str) -> String {
    let dir = dir.trim_start_matches("./").trim_end_matches('/');
    match dir {
        "" | "." => crate::capabilities::engine::LOCK_FILE.to_string(),
        dir => format!("{dir}/{}", crate::capabilities::engine::LOCK_FILE),
    }
}

/// Which of `roots` have no committed lock file at `prepared`'s commit (all of them when git
/// cannot tell: their plans are then not kept).
async fn unlocked(
    app: &App,
    job: &PlanJob,
    prepared: &Prepared,
    roots: &[&Root],
) -> BTreeSet<String> {
    if roots.is_empty() {
        return BTreeSet::new();
    }
    let paths: Vec<String> = roots.iter().map(|r| lock_path(&r.dir)).collect();
    let asked: Vec<&str> = paths.iter().map(String::as_str).collect();
    let committed = app
        .workspace
        .paths_at(job.project, prepared.commit.sha.as_str(), &asked)
        .await
        .unwrap_or_default();
    roots
        .iter()
        .zip(&paths)
        .filter(|(_, path)| !committed.contains(*path))
        .map(|(root, _)| root.name.clone())
        .collect()
}

/// Which affected roots of `decisions` reuse their last plan ([`Reuse`]).
pub(super) async fn decide(
    app: &App,
    job: &PlanJob,
    prepared: &Prepared,
    decisions: &[Decision<'_>],
    modules: &ModuleGraph,
) -> Reuse {
    let mut reuse = Reuse::default();
    let affected: Vec<&Root> = decisions
        .iter()
        .filter(|d| d.affected)
        .map(|d| d.root)
        .collect();
    for root in &affected {
        if let Some(now) = unchanged(app, job, prepared, root).await {
            reuse.unchanged.insert(root.name.clone(), now);
        }
    }
    // Only a root with its inputs told can have its fresh plan kept: only those are asked.
    let keepable: Vec<&Root> = affected
        .iter()
        .copied()
        .filter(|r| reuse.unchanged.contains_key(&r.name))
        .collect();
    reuse.unlocked = unlocked(app, job, prepared, &keepable).await;
    if job.reason == PlanReason::Command {
        return reuse;
    }
    // The files each earlier planned commit differs in, asked once per commit.
    let mut between: BTreeMap<String, Option<BTreeSet<String>>> = BTreeMap::new();
    let graph = prepared.config.graph();
    for name in graph.order() {
        let Some(root) = affected.iter().find(|r| r.name == name) else {
            continue;
        };
        let (Some(now), Some(last)) = (
            reuse.unchanged.get(name),
            plan_reuse::candidate(app, job.project, job.mr, name).await,
        ) else {
            continue;
        };
        if &last.unchanged != now {
            continue;
        }
        let from = last.planned_commit.as_str().to_string();
        if !between.contains_key(&from) {
            let files = changed_since(app, job, prepared, &last).await;
            between.insert(from.clone(), files);
        }
        let Some(Some(changed)) = between.get(&from) else {
            continue;
        };
        let changed: Vec<String> = changed.iter().cloned().collect();
        let reached = reach::decide(&prepared.config, &changed, modules)
            .iter()
            .any(|d| d.affected && d.root.name == root.name);
        // A root it depends on planned again may have new outputs: this one is planned too.
        let upstream_planned = graph
            .upstream_of(name)
            .into_iter()
            .any(|u| affected.iter().any(|a| a.name == u) && !reuse.reused.contains_key(u));
        if reached || upstream_planned {
            continue;
        }
        // The plan itself is read only now; one that does not read is planned.
        if let Some(kept) = plan_reuse::last(app, job.project, job.mr, name).await {
            if kept.head == last.head {
                reuse.reused.insert(root.name.clone(), kept);
            }
        }
    }
    reuse
}

/// The files that differ between the commit `last` was planned at and the one planned now;
/// `None` when git cannot tell (the root is then planned). Two merge results of one target
/// head (an equal [`Unchanged::target_head`] was checked) whose older one this replica's mirror
/// never fetched (GitLab's merge ref has moved on since another replica planned it) differ at
/// most in the files the two heads differ in and those their merge bases differ in.
async fn changed_since(
    app: &App,
    job: &PlanJob,
    prepared: &Prepared,
    last: &Candidate,
) -> Option<BTreeSet<String>> {
    let ws = &app.workspace;
    let now = &prepared.commit.sha;
    if let Ok(files) = ws
        .files_between(job.project, &last.planned_commit, now)
        .await
    {
        return Some(files.into_iter().collect());
    }
    let merges = last.planned_commit != last.head && *now != job.head;
    if !merges {
        return None;
    }
    let target = &last.unchanged.target_head;
    let heads = ws
        .files_between(job.project, &last.head, &job.head)
        .await
        .ok()?;
    let base_then = ws.merge_base(job.project, target, &last.head).await.ok()?;
    let base_now = ws.merge_base(job.project, target, &job.head).await.ok()?;
    let bases = ws
        .files_between(job.project, &base_then, &base_now)
        .await
        .ok()?;
    Some(heads.into_iter().chain(bases).collect())
}

/// `root`'s inputs at this head besides its files; `None` when its state is not
/// GitLab-managed, or GitLab cannot say its serial (then it is planned, and not kept).
async fn unchanged(
    app: &App,
    job: &PlanJob,
    prepared: &Prepared,
    root: &Root,
) -> Option<Unchanged> {
    let state = crate::core::state::gitlab_state_name(root, app.config.state.default)?;
    let path = prepared.project_path.as_deref()?;
    let serial = match app.gitlab.terraform_state_serial(path, &state).await {
        Ok(serial) => serial,
        Err(e) => {
            app.metrics.gitlab_error("terraform_state_serial");
            tracing::warn!(project = job.project.0, root = %root.name, error = %e, "could not read the state's serial: the root is planned");
            return None;
        }
    };
    let targeting = app
        .store
        .plan_targeting(job.project, job.mr, &job.head, &root.name)
        .await
        .ok()?;
    Some(Unchanged {
        target_head: prepared.target_head.clone(),
        default_head: prepared.default_head.clone()?,
        entry: entry_text(root),
        engine: prepared.version.clone().unwrap_or_default(),
        targeting: targeting.canonical(),
        state_serial: serial,
    })
}

/// Every field of a root's `.planbot.toml` entry, as planbot read it.
fn entry_text(root: &Root) -> String {
    format!(
        "{:?}",
        (
            &root.name,
            &root.dir,
            &root.patterns,
            &root.var_files,
            &root.workspace,
            &root.lint_disable,
            &root.state,
            root.parallelism,
            root.checks,
            &root.depends_on,
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_is_kept_unless_it_installed_providers_no_committed_lock_file_pins() {
        assert!(keeps(true, true), "a committed lock file pins them");
        assert!(keeps(false, false), "no provider installed: nothing to pin");
        assert!(keeps(true, false));
        assert!(
            !keeps(false, true),
            "the next init could pick a newer release"
        );
    }

    #[test]
    fn a_roots_lock_file_is_in_its_directory() {
        assert_eq!(lock_path("stacks/a"), "stacks/a/.terraform.lock.hcl");
        assert_eq!(lock_path("./stacks/a/"), "stacks/a/.terraform.lock.hcl");
        assert_eq!(lock_path("."), ".terraform.lock.hcl");
        assert_eq!(lock_path(""), ".terraform.lock.hcl");
    }
}
