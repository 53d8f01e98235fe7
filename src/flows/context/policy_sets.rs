//! The policy sets a plan is checked by, loaded and evaluated: planbot's own (read from its
//! host) and a repository's `[[policy_sets]]` with their `.rego` files read from git at one
//! commit (the default branch's head for a review, the commit before the merge for an apply;
//! never the MR's), and the sets that check one root.

use crate::core::ids::ProjectId;
use crate::core::policy::review::{RecordedVerdict, SetOrigin, SetSource};
use crate::core::policy::{
    evaluate_document_with, InputReads, Outcome, PlanDocument, PolicyError, PolicyFile, PolicySet,
    PolicySetSpec, SetVerdict, Verdict, DEFAULT_LIMIT,
};
use crate::core::proxmox::findings::Finding;
use crate::core::redact::Scrubber;
use crate::core::repo_config::RepoConfig;
use crate::flows::context::app_state::App;
use anyhow::{Context, Result};
use std::path::Path;

/// The largest `.rego` file read from a repository.
const MAX_POLICY_FILE: u64 = 1 << 20;

/// One set of a plan run: its configuration, where it comes from, and its files (or why they
/// could not be read: then the set errors, and blocks the apply like a failure).
#[derive(Clone)]
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
        let rev = format!("refs/heads/{default_branch}");
        Self::load_at(app, project, &rev, default_branch, repo).await
    }

    /// The operator's sets, and `repo`'s (the config of commit `rev` of `default_branch`) with
    /// their files read from `rev`.
    pub async fn load_at(
        app: &App,
        project: ProjectId,
        rev: &str,
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
                match app
                    .workspace
                    .read_dir_at(project, rev, &spec.path, ".rego", MAX_POLICY_FILE)
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

    /// The sets that check root `name` at `dir` of a merged config, each set and `before` (the
    /// roots' `(name, dir)`) being the default branch's before the merge
    /// ([`PolicySetSpec::covers`]): a copy holding only those, each checking every root.
    pub fn covering(&self, name: &str, dir: &str, before: &[(String, String)]) -> PolicySets {
        PolicySets {
            sets: self
                .sets
                .iter()
                .filter(|s| s.spec.covers(name, dir, before))
                .map(|s| {
                    let mut s = s.clone();
                    s.spec.roots.clear();
                    s
                })
                .collect(),
            branch: self.branch.clone(),
        }
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
        capacity: Option<&serde_json::Value>,
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
        let mut evaluated = evaluate_document_with(&doc, findings, root, capacity, &readable)
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
