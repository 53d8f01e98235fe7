//! GitLab's merge request widgets, fed from a reviewed plan: the Terraform report (the plan's
//! counts, `{"create": n, "update": n, "delete": n}`, the shape GitLab's parser requires) and
//! the Code Quality report (lint, preflight and policy findings in GitLab's subset of the
//! CodeClimate format). Recorded per root when the plan note is posted
//! (`flows::review::plan`), served to the CI job of the MR pipeline (`flows::widgets`).
//!
//! Only counts, rule ids, resource addresses, file names and finding messages go in: no value
//! of the plan. Every text is scrubbed by the caller's scrubber (the plan's sensitive values,
//! the configured secrets) and defused like a note.

use crate::core::policy::review::{RecordedVerdict, SetOrigin};
use crate::core::proxmox::findings::{Finding, Severity};
use crate::core::summary::Summary;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The most issues one root contributes (a plan of thousands of VMs each with a warning would
/// otherwise make a report GitLab refuses); the last one says how many were left out.
pub const MAX_ISSUES_PER_ROOT: usize = 500;

/// A description is cut at this many characters.
const MAX_DESCRIPTION: usize = 1000;

/// GitLab's Terraform report: what `artifacts:reports:terraform` reads (all three keys).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerraformReport {
    pub create: usize,
    pub update: usize,
    pub delete: usize,
}

impl TerraformReport {
    /// The note's table in GitLab's words: add → create, change → update, destroy → delete (a
    /// replacement counts in create and delete, as the engine's summary line and GitLab's own
    /// `jq` filter both count it).
    pub fn of(summary: &Summary) -> TerraformReport {
        TerraformReport {
            create: summary.add,
            update: summary.change,
            delete: summary.destroy,
        }
    }

    /// Several roots in one report: GitLab keeps one Terraform report per job.
    pub fn sum<'a>(reports: impl IntoIterator<Item = &'a TerraformReport>) -> TerraformReport {
        reports
            .into_iter()
            .fold(TerraformReport::default(), |a, r| TerraformReport {
                create: a.create + r.create,
                update: a.update + r.update,
                delete: a.delete + r.delete,
            })
    }
}

/// One Code Quality issue, the fields GitLab reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeQualityIssue {
    pub description: String,
    pub check_name: String,
    /// Stable across pipelines (root, rule, address, message): GitLab compares the head's
    /// issues with the target branch's by it.
    pub fingerprint: String,
    /// `info`, `minor`, `major`, `critical` or `blocker`.
    pub severity: String,
    pub location: Location,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    /// From the repository top.
    pub path: String,
    pub lines: Lines,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lines {
    pub begin: usize,
}

/// What one root's reviewed plan gives the widgets, as recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootWidgets {
    pub terraform: TerraformReport,
    pub issues: Vec<CodeQualityIssue>,
}

impl RootWidgets {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_json(text: &str) -> Option<RootWidgets> {
        serde_json::from_str(text).ok()
    }
}

/// A configuration file of a root (`.tf`, `.tofu`), its path from the repository top.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub path: String,
    pub text: String,
}

/// GitLab's severity for planbot's: an error fails the plan and blocks the apply (critical), a
/// warning asks for a look (major), an info is one (info).
pub fn severity(s: Severity) -> &'static str {
    match s {
        Severity::Error => "critical",
        Severity::Warning => "major",
        Severity::Info => "info",
    }
}

/// Where the block of `address` is: the `resource`/`data` block of a root module resource, the
/// `module` block of a resource inside a module, by scanning `files` (the engine's JSON plan
/// has no line numbers: `show -json`'s `configuration` carries none). `None` when no block
/// matches (a resource written in `.tf.json`, a generated one).
pub fn locate(address: &str, files: &[ConfigFile]) -> Option<(String, usize)> {
    let segments = segments(address);
    let labels: Vec<&str> = match segments.as_slice() {
        ["module", name, ..] => vec!["module", name],
        ["data", ty, name, ..] => vec!["data", ty, name],
        [ty, name, ..] => vec!["resource", ty, name],
        _ => return None,
    };
    files.iter().find_map(|f| {
        f.text
            .lines()
            .position(|line| opens_block(line, &labels))
            .map(|i| (f.path.clone(), i + 1))
    })
}

/// `module.net["a.b"].proxmox_vm.web[0]` → `module`, `net`, `proxmox_vm`, `web`: the index
/// keys (which may hold dots) left out.
fn segments(address: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut depth = 0usize;
    let mut quoted = false;
    let bytes = address.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if quoted {
            if b == b'\\' {
                i += 1;
            } else if b == b'"' {
                quoted = false;
            }
        } else {
            match b {
                b'"' => quoted = true,
                b'[' => {
                    if depth == 0 && i > start {
                        out.push(&address[start..i]);
                    }
                    depth += 1;
                }
                b']' => {
                    depth = depth.saturating_sub(1);
                    start = i + 1;
                }
                b'.' if depth == 0 => {
                    if i > start {
                        out.push(&address[start..i]);
                    }
                    start = i + 1;
                }
                _ => {}
            }
        }
        i += 1;
    }
    if depth == 0 && start < address.len() {
        out.push(&address[start..]);
    }
    out
}

/// Whether `line` opens a block with exactly these labels (`resource "t" "n" {`, labels
/// quoted or not).
fn opens_block(line: &str, labels: &[&str]) -> bool {
    let mut rest = line.trim_start();
    for (i, label) in labels.iter().enumerate() {
        let word = if i == 0 {
            rest.strip_prefix(label)
        } else {
            rest.strip_prefix('"')
                .and_then(|r| r.strip_prefix(label))
                .and_then(|r| r.strip_prefix('"'))
                .or_else(|| rest.strip_prefix(label))
        };
        let Some(after) = word else {
            return false;
        };
        if !after.starts_with([' ', '\t', '{', '"']) {
            return false;
        }
        rest = after.trim_start();
    }
    rest.starts_with('{')
}

/// The widgets of one root's reviewed plan: its counts, and an issue per finding (at the block
/// of its resource, or at the root's first file for a finding on the whole plan) and per policy
/// failure or warning (at the root's first file). Every text goes through `clean` (scrub and
/// defuse) before it is kept; the fingerprint is a hash of the cleaned texts.
pub fn root_widgets(
    root: &str,
    summary: &Summary,
    findings: &[Finding],
    policy: &RecordedVerdict,
    files: &[ConfigFile],
    root_dir: &str,
    clean: &dyn Fn(&str) -> String,
) -> RootWidgets {
    let fallback = files
        .first()
        .map(|f| f.path.clone())
        .unwrap_or_else(|| root_dir.to_string());
    let mut issues = Vec::new();
    for f in findings {
        let (path, line) = locate(&f.address, files).unwrap_or((fallback.clone(), 1));
        let address = clean(&f.address);
        let message = clean(&f.message);
        let description = if address.is_empty() {
            format!("{}: {message}", f.rule)
        } else {
            format!("{} {address}: {message}", f.rule)
        };
        issues.push(issue(
            root,
            f.rule,
            &address,
            &description,
            severity(f.severity),
            path,
            line,
        ));
    }
    for set in &policy.sets {
        let check = format!("policy/{}", clean(&set.name));
        let origin = match set.origin {
            SetOrigin::Repository => "policy set",
            SetOrigin::Operator => "planbot's policy set",
        };
        let failures = set.failures.iter().chain(set.error.iter());
        for (messages, sev) in [
            (failures.collect::<Vec<_>>(), "critical"),
            (set.warnings.iter().collect(), "major"),
        ] {
            for m in messages {
                let description = format!("{origin} `{}`: {}", clean(&set.name), clean(m));
                issues.push(issue(
                    root,
                    &check,
                    "",
                    &description,
                    sev,
                    fallback.clone(),
                    1,
                ));
            }
        }
    }
    if issues.len() > MAX_ISSUES_PER_ROOT {
        let left = issues.len() - (MAX_ISSUES_PER_ROOT - 1);
        issues.truncate(MAX_ISSUES_PER_ROOT - 1);
        let description = format!(
            "root `{root}`: {left} more findings are not listed here; the plan note has them all"
        );
        issues.push(issue(
            root,
            "planbot/more",
            "",
            &description,
            "info",
            fallback.clone(),
            1,
        ));
    }
    RootWidgets {
        terraform: TerraformReport::of(summary),
        issues,
    }
}

fn issue(
    root: &str,
    check: &str,
    address: &str,
    description: &str,
    severity: &str,
    path: String,
    line: usize,
) -> CodeQualityIssue {
    let mut hash = Sha256::new();
    for part in [root, check, address, description] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    let description = if description.chars().count() > MAX_DESCRIPTION {
        let cut: String = description.chars().take(MAX_DESCRIPTION - 1).collect();
        format!("{cut}…")
    } else {
        description.to_string()
    };
    CodeQualityIssue {
        description: format!("[{root}] {description}"),
        check_name: check.to_string(),
        fingerprint: hex::encode(hash.finalize()),
        severity: severity.to_string(),
        location: Location {
            path,
            lines: Lines { begin: line },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> Vec<ConfigFile> {
        vec![
            ConfigFile {
                path: "lab/main.tf".into(),
                text: "terraform {}\n\nresource \"proxmox_virtual_environment_vm\" \"web\" {\n}\n\
                       data \"proxmox_virtual_environment_vm\" \"web\" {}\n"
                    .into(),
            },
            ConfigFile {
                path: "lab/net.tf".into(),
                text: "# resource \"x\" \"y\" {\n  module   \"net\"   {\n  resource x y {\n".into(),
            },
        ]
    }

    #[test]
    fn a_resource_a_data_source_and_a_module_resource_are_found_at_their_block() {
        let f = files();
        assert_eq!(
            locate("proxmox_virtual_environment_vm.web[\"a.b\"]", &f),
            Some(("lab/main.tf".into(), 3))
        );
        assert_eq!(
            locate("data.proxmox_virtual_environment_vm.web", &f),
            Some(("lab/main.tf".into(), 5))
        );
        assert_eq!(
            locate("module.net[0].proxmox_virtual_environment_vm.db", &f),
            Some(("lab/net.tf".into(), 2))
        );
        assert_eq!(locate("x.y", &f), Some(("lab/net.tf".into(), 3)));
        // A comment is not a block, a prefix is not the name, nothing is no address.
        assert_eq!(locate("proxmox_virtual_environment_vm.we", &f), None);
        assert_eq!(locate("", &f), None);
    }

    #[test]
    fn counts_are_the_notes_columns_and_findings_keep_their_severity() {
        let summary = Summary {
            add: 2,
            change: 1,
            destroy: 1,
            replace: 1,
            ..Summary::default()
        };
        let finding = Finding {
            rule: "PVE008",
            severity: Severity::Warning,
            address: "proxmox_virtual_environment_vm.web".into(),
            message: "VM replaced: secret-1 lost".into(),
            fix: String::new(),
        };
        let w = root_widgets(
            "lab",
            &summary,
            &[finding],
            &RecordedVerdict::default(),
            &files(),
            "lab",
            &|t| t.replace("secret-1", "[redacted]"),
        );
        assert_eq!(
            w.terraform,
            TerraformReport {
                create: 2,
                update: 1,
                delete: 1
            }
        );
        let i = &w.issues[0];
        assert_eq!(i.severity, "major");
        assert_eq!(i.location.path, "lab/main.tf");
        assert_eq!(i.location.lines.begin, 3);
        assert_eq!(
            i.description,
            "[lab] PVE008 proxmox_virtual_environment_vm.web: VM replaced: [redacted] lost"
        );
        assert_eq!(i.fingerprint.len(), 64);
    }
}

/// Which commit of a merge request a pipeline ref stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrPipelineRef {
    /// `refs/merge-requests/IID/head`: the pipeline's commit is the MR's head.
    Head(u64),
    /// `refs/merge-requests/IID/merge` or `/train`: a merged result; its commit is not the
    /// head, so the MR's current head is the one reviewed.
    MergedResult(u64),
}

/// The merge request of a merge request pipeline's ref; `None` for any other ref (a branch, a
/// tag).
pub fn mr_pipeline_ref(git_ref: &str) -> Option<MrPipelineRef> {
    let rest = git_ref.strip_prefix("refs/merge-requests/")?;
    let (iid, kind) = rest.split_once('/')?;
    if iid.is_empty() || !iid.bytes().all(|b| b.is_ascii_digit()) || iid.len() > 18 {
        return None;
    }
    let iid: u64 = iid.parse().ok()?;
    match kind {
        "head" => Some(MrPipelineRef::Head(iid)),
        "merge" | "train" => Some(MrPipelineRef::MergedResult(iid)),
        _ => None,
    }
}

#[cfg(test)]
mod ref_tests {
    use super::*;

    #[test]
    fn only_merge_request_refs_name_a_merge_request() {
        assert_eq!(
            mr_pipeline_ref("refs/merge-requests/12/head"),
            Some(MrPipelineRef::Head(12))
        );
        assert_eq!(
            mr_pipeline_ref("refs/merge-requests/7/merge"),
            Some(MrPipelineRef::MergedResult(7))
        );
        assert_eq!(
            mr_pipeline_ref("refs/merge-requests/7/train"),
            Some(MrPipelineRef::MergedResult(7))
        );
        for other in [
            "main",
            "refs/merge-requests/x/head",
            "refs/merge-requests//head",
            "refs/merge-requests/1/head/x",
            "refs/merge-requests/+1/head",
            "refs/heads/refs/merge-requests/1/head",
        ] {
            assert_eq!(mr_pipeline_ref(other), None, "{other}");
        }
    }
}

/// How long after its job was created a merge request head planbot has no plan job or run of
/// may still be waiting for GitLab's webhook: GitLab starts the pipeline and sends the webhook
/// at the same time (the webhook through its background queue, which can lag a few minutes).
/// Past it, the webhook is not coming: the widgets job is told so instead of waiting its hour.
pub const WEBHOOK_GRACE_MS: i64 = 10 * 60 * 1000;

/// What GitLab says of a merge request head planbot has no plan job or run of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnplannedHead<'a> {
    /// The commit the widgets job asks for.
    pub sha: &'a crate::core::ids::CommitSha,
    /// The MR's `state` (`opened`, `closed`, `locked`, `merged`).
    pub state: &'a str,
    /// The MR's current head.
    pub head: Option<&'a crate::core::ids::CommitSha>,
    /// Where the MR comes from, and for a fork what the repo config says of forks.
    pub source: MrSource,
    /// How long ago the job was created (ms; negative for a clock ahead of planbot's), `None`
    /// when GitLab did not say.
    pub job_age_ms: Option<i64>,
}

/// Where a merge request comes from, as far as planning it by itself goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrSource {
    /// The project itself: planned on every push.
    Project,
    /// A fork, `fork_mrs = "comment"`: planned when a Maintainer comments `planbot plan`.
    ForkOnComment,
    /// A fork, `fork_mrs = "never"`: never planned.
    ForkNever,
}

/// Whether a plan of an unplanned head may still come, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unplanned {
    /// GitLab's webhook may still be on its way (the job is younger than
    /// [`WEBHOOK_GRACE_MS`], or GitLab gave no creation time): ask again.
    Expected,
    /// The MR is closed or merged: planbot plans open merge requests.
    NotOpen(String),
    /// The commit is no longer the MR's head: its plan was superseded (or never started).
    Moved(Option<crate::core::ids::CommitSha>),
    /// A fork MR: planned only when a Maintainer comments `planbot plan`.
    ForkOnComment,
    /// A fork MR of a project whose repo config says `fork_mrs = "never"`.
    ForkNever,
    /// The job is older than [`WEBHOOK_GRACE_MS`] and planbot never heard of the head.
    NeverHeard,
}

impl Unplanned {
    /// The kind of its line in `templates/widgets.txt.j2`.
    pub fn kind(&self) -> &'static str {
        match self {
            Unplanned::Expected => "unseen",
            Unplanned::NotOpen(_) => "not_open",
            Unplanned::Moved(_) => "moved",
            Unplanned::ForkOnComment => "fork",
            Unplanned::ForkNever => "fork_never",
            Unplanned::NeverHeard => "never_heard",
        }
    }
}

/// Decide for an unplanned head: a plan is expected only for the open MR's current head from
/// the project itself, and only within [`WEBHOOK_GRACE_MS`] of the job's creation.
pub fn unplanned(h: &UnplannedHead<'_>) -> Unplanned {
    if h.state != "opened" {
        return Unplanned::NotOpen(h.state.to_string());
    }
    if h.head != Some(h.sha) {
        return Unplanned::Moved(h.head.cloned());
    }
    match h.source {
        MrSource::ForkNever => return Unplanned::ForkNever,
        MrSource::ForkOnComment => return Unplanned::ForkOnComment,
        MrSource::Project => {}
    }
    match h.job_age_ms {
        Some(age) if age >= WEBHOOK_GRACE_MS => Unplanned::NeverHeard,
        _ => Unplanned::Expected,
    }
}

#[cfg(test)]
mod unplanned_tests {
    use super::*;
    use crate::core::ids::CommitSha;

    #[test]
    fn only_an_open_mrs_current_head_from_the_project_itself_is_waited_for_and_only_a_while() {
        let sha = CommitSha("a".repeat(40));
        let newer = CommitSha("b".repeat(40));
        let base = UnplannedHead {
            sha: &sha,
            state: "opened",
            head: Some(&sha),
            source: MrSource::Project,
            job_age_ms: Some(0),
        };
        assert_eq!(unplanned(&base), Unplanned::Expected);
        let young = WEBHOOK_GRACE_MS - 1;
        for (what, h, want) in [
            (
                "young job",
                UnplannedHead {
                    job_age_ms: Some(young),
                    ..base.clone()
                },
                Unplanned::Expected,
            ),
            (
                "GitLab's clock ahead",
                UnplannedHead {
                    job_age_ms: Some(-5_000),
                    ..base.clone()
                },
                Unplanned::Expected,
            ),
            (
                "no creation time",
                UnplannedHead {
                    job_age_ms: None,
                    ..base.clone()
                },
                Unplanned::Expected,
            ),
            (
                "past the grace",
                UnplannedHead {
                    job_age_ms: Some(WEBHOOK_GRACE_MS),
                    ..base.clone()
                },
                Unplanned::NeverHeard,
            ),
            (
                "a fork, young job",
                UnplannedHead {
                    source: MrSource::ForkOnComment,
                    ..base.clone()
                },
                Unplanned::ForkOnComment,
            ),
            (
                "a fork, never planned",
                UnplannedHead {
                    source: MrSource::ForkNever,
                    ..base.clone()
                },
                Unplanned::ForkNever,
            ),
            (
                "a newer head",
                UnplannedHead {
                    head: Some(&newer),
                    source: MrSource::ForkOnComment,
                    ..base.clone()
                },
                Unplanned::Moved(Some(newer.clone())),
            ),
            (
                "no head",
                UnplannedHead {
                    head: None,
                    ..base.clone()
                },
                Unplanned::Moved(None),
            ),
            (
                "merged",
                UnplannedHead {
                    state: "merged",
                    ..base.clone()
                },
                Unplanned::NotOpen("merged".into()),
            ),
        ] {
            assert_eq!(unplanned(&h), want, "{what}");
        }
    }
}
