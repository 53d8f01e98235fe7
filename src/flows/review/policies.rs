//! Policy checks of a review: the sets a plan run checks (planbot's own, read from its host,
//! then the default branch's `[[policy_sets]]`, read from git: never the MR's), each root's
//! verdict recorded with its plan's fingerprint, the `planbot/policy` status, and the
//! `planbot approve policies` command an owner of a failing set comments.

use crate::capabilities::gitlab::{CommitStatus, StatusState};
use crate::capabilities::store::PolicyApproval;
use crate::core::findings::Finding;
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, ProjectId, UserId};
use crate::core::policy::review::{
    owned_by_user, ApprovalView, ClearedApproval, PolicySection, RecordedSet, RecordedVerdict,
    SetOrigin, SetSource,
};
use crate::core::policy::{
    evaluate_document, InputReads, Outcome, Owner, PlanDocument, PolicyError, PolicyFile,
    PolicySet, PolicySetSpec, SetVerdict, Verdict, DEFAULT_LIMIT,
};
use crate::core::redact::Scrubber;
use crate::core::repo_config::RepoConfig;
use crate::flows::context::app_state::App;
use anyhow::{Context, Result};
use minijinja::context;
use std::path::Path;

/// The largest `.rego` file read from a repository.
const MAX_POLICY_FILE: u64 = 1 << 20;

/// One set of a plan run: its configuration, where it comes from, and its files (or why they
/// could not be read: then the set errors, and blocks the apply like a failure).
pub(crate) struct LoadedSet {
    pub spec: PolicySetSpec,
    pub origin: SetOrigin,
    pub files: Result<Vec<PolicyFile>, String>,
}

/// Every set one plan run checks: planbot's own first (no repository can switch them off),
/// then the default branch's.
#[derive(Default)]
pub(crate) struct PolicySets {
    pub sets: Vec<LoadedSet>,
    /// The default branch the repository's sets were read from.
    pub branch: String,
}

impl PolicySets {
    /// The operator's sets from planbot's host, and `repo`'s (the DEFAULT branch's config)
    /// from the project's mirror at `refs/heads/{default_branch}`.
    pub async fn load(
        app: &App,
        project: ProjectId,
        default_branch: &str,
        repo: &RepoConfig,
    ) -> Result<PolicySets> {
        let mut sets: Vec<LoadedSet> = app
            .config
            .policy_sets
            .iter()
            .map(|spec| LoadedSet {
                spec: spec.clone(),
                origin: SetOrigin::Operator,
                files: read_operator_set(spec),
            })
            .collect();
        for spec in &repo.policy_sets {
            let files = if sets.iter().any(|s| s.spec.name == spec.name) {
                Err(format!(
                    "the name `{}` is taken by one of planbot's own policy sets: rename this set in .planbot.toml",
                    spec.name
                ))
            } else {
                let rev = format!("refs/heads/{default_branch}");
                match app
                    .workspace
                    .read_dir_at(project, &rev, &spec.path, ".rego", MAX_POLICY_FILE)
                    .await
                {
                    Ok(Some(files)) => Ok(files
                        .into_iter()
                        .map(|(path, text)| PolicyFile {
                            path,
                            text: String::from_utf8_lossy(&text).into_owned(),
                        })
                        .collect()),
                    Ok(None) => Err(format!(
                        "`{}` is not a directory on `{default_branch}`",
                        spec.path
                    )),
                    Err(e) => Err(format!("{e:#}")),
                }
            };
            sets.push(LoadedSet {
                spec: spec.clone(),
                origin: SetOrigin::Repository,
                files,
            });
        }
        Ok(PolicySets {
            sets,
            branch: default_branch.to_string(),
        })
    }

    fn for_root<'a>(&'a self, root: &'a str) -> impl Iterator<Item = &'a LoadedSet> + 'a {
        self.sets.iter().filter(move |s| s.spec.applies_to(root))
    }

    /// The plan document (`show -json`) read for the sets that check `root`; `None` when no
    /// set does (nothing is read then). The costly part of a check, free to run on another
    /// thread while lint and the fingerprint run ([`Self::evaluate`] takes it afterwards).
    pub fn read_document(
        &self,
        root: &str,
        plan_json: &[u8],
    ) -> Option<Result<PlanDocument, PolicyError>> {
        self.for_root(root).next()?;
        let reads = InputReads::of(
            self.for_root(root)
                .filter_map(|l| l.files.as_ref().ok())
                .flatten()
                .map(|f| f.text.as_str()),
        );
        Some(
            std::str::from_utf8(plan_json)
                .map_err(|e| PolicyError::Input(e.to_string()))
                .and_then(|json| PlanDocument::read_for(json, &reads)),
        )
    }

    /// The verdict of the sets that check `root` over its plan `document` (from
    /// [`Self::read_document`]) and findings, in their order; no set in it when none checks the
    /// root. A set whose files could not be read errors.
    pub fn evaluate(
        &self,
        root: &str,
        document: Option<Result<PlanDocument, PolicyError>>,
        findings: &[Finding],
    ) -> Verdict {
        let sets: Vec<&LoadedSet> = self.for_root(root).collect();
        let failed = |loaded: &LoadedSet, e: PolicyError| SetVerdict {
            name: loaded.spec.name.clone(),
            namespace: loaded.spec.namespace.clone(),
            outcome: Outcome::Error(e),
        };
        let doc = match document {
            None if sets.is_empty() => return Verdict { sets: Vec::new() },
            None => Err(PolicyError::Input("the plan was not read".into())),
            Some(doc) => doc,
        };
        let doc = match doc {
            Ok(doc) => doc,
            Err(e) => {
                return Verdict {
                    sets: sets.iter().map(|l| failed(l, e.clone())).collect(),
                }
            }
        };
        // Every readable set in one evaluation (side by side), then each in its place.
        let readable: Vec<PolicySet> = sets
            .iter()
            .filter_map(|l| {
                let files = l.files.as_ref().ok()?;
                Some(l.spec.with_files(files.clone(), DEFAULT_LIMIT))
            })
            .collect();
        let mut evaluated = evaluate_document(&doc, findings, root, &readable)
            .sets
            .into_iter();
        let verdicts = sets
            .iter()
            .map(|l| match &l.files {
                Err(why) => failed(l, PolicyError::Unreadable(why.clone())),
                Ok(_) => evaluated
                    .next()
                    .expect("one verdict per readable set, in order"),
            })
            .collect();
        Verdict { sets: verdicts }
    }

    /// `verdict` (from [`Self::evaluate`] for `root`) as recorded: scrubbed, cut to size, with
    /// each set's owners and origin.
    pub fn record(&self, root: &str, verdict: &Verdict, scrubber: &Scrubber) -> RecordedVerdict {
        let sources: Vec<SetSource<'_>> = self
            .for_root(root)
            .map(|s| SetSource {
                spec: &s.spec,
                origin: s.origin,
            })
            .collect();
        RecordedVerdict::record(verdict, &sources, &|m| scrubber.scrub(m).into_owned())
    }
}

/// An operator set's files, shown as `{set name}/{path in its directory}` (no host path in a
/// note); why they cannot be read otherwise.
fn read_operator_set(spec: &PolicySetSpec) -> Result<Vec<PolicyFile>, String> {
    let dir = Path::new(&spec.path);
    let files = read_policy_dir(dir).map_err(|e| {
        format!(
            "planbot's directory of this set cannot be read: {}",
            short_error(&e, dir, &spec.name)
        )
    })?;
    Ok(files
        .into_iter()
        .map(|f| PolicyFile {
            path: relative_to(&f.path, dir, &spec.name),
            text: f.text,
        })
        .collect())
}

fn relative_to(path: &str, dir: &Path, name: &str) -> String {
    match Path::new(path).strip_prefix(dir) {
        Ok(rest) => format!("{name}/{}", rest.display()),
        Err(_) => path.to_string(),
    }
}

/// The error without the host's directory (the operator reads it in `serve --check`).
fn short_error(e: &anyhow::Error, dir: &Path, name: &str) -> String {
    format!("{e:#}").replace(&dir.display().to_string(), name)
}

/// The note's section for `verdict` of `root`'s plan (`fingerprint`, shown for `sha`): the
/// approvals of that very plan count, those of an earlier plan are listed as cleared.
pub(crate) fn section(
    verdict: &RecordedVerdict,
    root: &str,
    sha: &CommitSha,
    fingerprint: &Fingerprint,
    approvals: &[PolicyApproval],
    branch: &str,
) -> PolicySection {
    let mut counting = Vec::new();
    let mut cleared: Vec<ClearedApproval> = Vec::new();
    for a in approvals.iter().filter(|a| a.root == root) {
        if &a.sha == sha && &a.fingerprint == fingerprint {
            counting.push(ApprovalView {
                set: a.set.clone(),
                approver: a.approver.clone(),
            });
        } else if !cleared
            .iter()
            .any(|c| c.set == a.set && c.approver == a.approver)
        {
            cleared.push(ClearedApproval {
                set: a.set.clone(),
                approver: a.approver.clone(),
                sha: a.sha.short().to_string(),
            });
        }
    }
    PolicySection::new(verdict, &counting, &cleared, branch)
}

/// One line of the policy texts (`templates/policy.txt.j2`), its values scrubbed.
fn text(scrubber: &Scrubber, kind: &str, ctx: minijinja::Value) -> String {
    crate::core::templates::scrubbing(scrubber, || {
        crate::core::templates::text("policy.txt.j2", kind, ctx)
            .trim()
            .to_string()
    })
}

/// `planbot/policy` on `sha` from the verdicts of its plans (`(root, verdict, fingerprint)`)
/// and the approvals of the MR: failed while a failing set waits for its owners. Nothing is
/// posted when no set checks any of the plans.
pub(crate) async fn set_status(
    app: &App,
    project: ProjectId,
    sha: &CommitSha,
    status_ref: Option<String>,
    verdicts: &[(String, Fingerprint, RecordedVerdict)],
    approvals: &[PolicyApproval],
) {
    if verdicts.iter().all(|(_, _, v)| v.sets.is_empty()) {
        return;
    }
    let mut waiting: Option<(&str, &RecordedSet)> = None;
    let mut approved = 0;
    let mut passed = 0;
    for (root, fingerprint, v) in verdicts {
        let ok = PolicyApproval::sets_for(approvals, root, sha, fingerprint);
        passed += v.sets.iter().filter(|s| !s.blocks()).count();
        approved += v
            .blocking()
            .filter(|s| ok.contains(&s.name.as_str()))
            .count();
        if waiting.is_none() {
            waiting = v.first_unapproved(&ok).map(|s| (root.as_str(), s));
        }
    }
    let (state, description) = match waiting {
        Some((root, set)) => (
            StatusState::Failed,
            text(
                &app.scrubber,
                "status_failed",
                context! { root => root, set => &set.name, message => set.first_message() },
            ),
        ),
        None => (
            StatusState::Success,
            text(
                &app.scrubber,
                "status_passed",
                context! { passed => passed, approved => approved },
            ),
        ),
    };
    let status = CommitStatus {
        state,
        name: crate::core::commit_status::POLICY.into(),
        description: Some(description.chars().take(255).collect()),
        target_url: None,
        ref_: status_ref,
        pipeline_id: None,
    };
    if let Err(e) = app.gitlab.set_commit_status(project, sha, &status).await {
        app.metrics.gitlab_error("set_commit_status");
        tracing::warn!(project = project.0, sha = %sha.short(), error = %e, "could not set the policy status");
    }
}

/// Whether `user` (id and name) is among `owners`: by name, or a member of an owning group as
/// GitLab answers.
async fn owns(app: &App, owners: &[Owner], user: UserId, username: &str) -> Result<bool> {
    if owned_by_user(owners, username) {
        return Ok(true);
    }
    for owner in owners {
        if let Owner::Group(group) = owner {
            let member = app
                .gitlab
                .group_member(group, user)
                .await
                .with_context(|| format!("asking GitLab for the members of {group}"))?;
            if member {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// A failing set of one root's plan, for the replies.
#[derive(serde::Serialize)]
struct Waiting {
    root: String,
    set: String,
    owners: Vec<Owner>,
}

/// `planbot approve policies` by `author` on the MR: every failing set of the plans shown for
/// the MR's head that the author owns is approved for those plans (their fingerprints); a
/// reply says what was approved and what still waits, or who may approve.
pub(crate) async fn approve(
    app: &App,
    project: ProjectId,
    mr: MrIid,
    author: UserId,
    head: &CommitSha,
) -> Result<String> {
    let user = app
        .gitlab
        .user(author)
        .await
        .context("asking GitLab who wrote the note")?;
    let mut shown = Vec::new();
    for v in app.store.policy_verdicts(project, mr, head).await? {
        // Only the plan the note shows (and the apply compares with) for that root.
        let current = app
            .store
            .fingerprint_for(project, mr, &v.root, head.clone())
            .await?;
        if current.is_some_and(|c| c.fingerprint == v.fingerprint) {
            shown.push(v);
        }
    }
    let approvals = app.store.policy_approvals(project, mr).await?;
    let mut approved: Vec<Waiting> = Vec::new();
    let mut waiting: Vec<Waiting> = Vec::new();
    for v in &shown {
        let ok = PolicyApproval::sets_for(&approvals, &v.root, head, &v.fingerprint);
        for set in v.verdict.blocking() {
            let entry = Waiting {
                root: v.root.clone(),
                set: set.name.clone(),
                owners: set.owners.clone(),
            };
            if owns(app, &set.owners, author, &user.username).await? {
                app.store
                    .record_policy_approval(PolicyApproval {
                        project,
                        mr,
                        root: v.root.clone(),
                        sha: head.clone(),
                        fingerprint: v.fingerprint.clone(),
                        set: set.name.clone(),
                        approver_id: author,
                        approver: user.username.clone(),
                        approved_at: 0,
                    })
                    .await?;
                approved.push(entry);
            } else if !ok.contains(&set.name.as_str()) {
                waiting.push(entry);
            }
        }
    }
    let kind = if shown.is_empty() {
        "reply_no_plan"
    } else if approved.is_empty() && waiting.is_empty() {
        "reply_nothing_fails"
    } else if approved.is_empty() {
        "reply_not_owner"
    } else {
        "reply_approved"
    };
    tracing::info!(
        project = project.0,
        mr = mr.0,
        user = %user.username,
        approved = approved.len(),
        waiting = waiting.len(),
        "planbot approve policies"
    );
    if !approved.is_empty() {
        let approvals = app.store.policy_approvals(project, mr).await?;
        let verdicts: Vec<(String, Fingerprint, RecordedVerdict)> = shown
            .into_iter()
            .map(|v| (v.root, v.fingerprint, v.verdict))
            .collect();
        set_status(app, project, head, None, &verdicts, &approvals).await;
    }
    let body = crate::core::templates::scrubbing(&app.scrubber, || {
        crate::core::templates::render(
            "comments/policy_approval.md.j2",
            context! {
                kind => kind,
                username => &user.username,
                sha => head.short(),
                approved => approved,
                waiting => waiting,
            },
        )
    })?;
    Ok(body.trim_end().to_string() + "\n")
}

/// Every `.rego` file under `dir` (recursively, in path order), with its path shown as
/// `dir/sub/file.rego`. A symbolic link is refused rather than followed: a policy directory
/// must not read files elsewhere (their text would end up in parse errors).
pub fn read_policy_dir(dir: &Path) -> Result<Vec<PolicyFile>> {
    let meta = std::fs::symlink_metadata(dir)
        .with_context(|| format!("cannot read the policy directory {}", dir.display()))?;
    if !meta.is_dir() {
        anyhow::bail!("{} is not a directory of .rego files", dir.display());
    }
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let entries =
            std::fs::read_dir(&d).with_context(|| format!("cannot read {}", d.display()))?;
        for entry in entries {
            let path = entry
                .with_context(|| format!("cannot read {}", d.display()))?
                .path();
            let meta = std::fs::symlink_metadata(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            if meta.file_type().is_symlink() {
                anyhow::bail!(
                    "{} is a symbolic link; policy files must be regular files in the directory",
                    path.display()
                );
            }
            if meta.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rego") {
                if meta.len() > MAX_POLICY_FILE {
                    anyhow::bail!("{} is larger than 1 MiB", path.display());
                }
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                files.push(PolicyFile {
                    path: path.display().to_string(),
                    text,
                });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}
