//! The apply gate, pure: which CI jobs may apply, and whether a fresh plan is the reviewed one.
//!
//! Every refusal is an [`ApplyRefusal`] naming the check that failed; the flow turns it into
//! the last line of the job log (`planbot: apply refused: ...`) and the hint under it.

use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, JobId, ProjectId};
use serde::Serialize;

/// What GitLab told us about the job behind a `CI_JOB_TOKEN` (`GET /api/v4/job`), plus the facts
/// about the project and branch that the checks compare it with.
#[derive(Debug, Clone)]
pub struct JobFacts {
    pub job_id: JobId,
    pub job_name: String,
    pub status: String,
    pub git_ref: String,
    pub tag: bool,
    pub pipeline_project_id: ProjectId,
    pub pipeline_sha: CommitSha,
    /// Who clicked the manual job.
    pub username: Option<String>,
}

/// The project-side facts the job is checked against.
#[derive(Debug, Clone)]
pub struct GateFacts {
    pub allowed_projects: Vec<ProjectId>,
    pub default_branch: String,
    /// Whether the job's ref is a protected branch (from `GET /repository/branches/:ref`).
    pub ref_protected: bool,
    /// The current head of the default branch.
    pub default_branch_head: CommitSha,
    pub expected_job_name: String,
    /// The job id has been used for an apply before.
    pub job_already_applied: bool,
}

/// Why an apply was refused. Each names the check and says what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "check", rename_all = "snake_case")]
pub enum ApplyRefusal {
    InvalidJobToken,
    JobNotRunning {
        status: String,
    },
    ProjectNotAllowed {
        project_id: ProjectId,
    },
    TagPipeline,
    NotDefaultBranch {
        git_ref: String,
        default_branch: String,
    },
    BranchNotProtected {
        branch: String,
    },
    WrongJobName {
        name: String,
        expected: String,
    },
    StalePipeline {
        pipeline_sha: String,
        branch: String,
        head: String,
    },
    JobAlreadyApplied {
        job_id: JobId,
    },
    RootBusy {
        root: String,
    },
    NothingReviewed {
        sha: String,
    },
    RootNotReviewed {
        root: String,
    },
    PlanChanged {
        root: String,
        reviewed: String,
        fresh: String,
    },
    PreflightFailed {
        root: String,
        finding: String,
    },
    BadConfirm {
        given: String,
    },
    /// The root keeps its state in the checkout (a `local` backend, or none): an apply would
    /// write it into a throwaway directory and lose it.
    StateInCheckout {
        root: String,
    },
    /// A policy set failed on the reviewed plan (or could not be evaluated) and none of its
    /// owners approved that plan.
    PolicyFailed {
        root: String,
        set: String,
        message: String,
        /// Who may approve (`alice`, `group:infra/admins`); empty: no one can.
        owners: Vec<String>,
    },
    /// A plan no merge request's verdict covers (confirmed by hand, or on a root the sets did
    /// not check at review) failed a set when it was checked at apply, with the sets of the
    /// default branch before the merge and planbot's own, and none of its owners approved it.
    PolicyFailedAtApply(Box<PolicyAtApply>),
    /// A GitLab deploy freeze holds now (Settings → CI/CD → Deploy freezes).
    DeployFreeze {
        start: String,
        end: String,
        zone: String,
        /// When it ends, in its time zone; none when its end never comes again.
        ends: Option<String>,
    },
    /// Whether a deploy freeze holds could not be told (GitLab did not answer, or a period
    /// cannot be read): a check that guards the apply could not run.
    FreezeUnknown {
        why: String,
    },
    /// `[apply] approvals`: the merge request that landed the commit has fewer approvals that
    /// count (`core::approvals`: by a Developer or above other than its author, given after its
    /// last push) than the apply waits for.
    ApprovalsMissing {
        mr: u64,
        needed: u32,
        counted: u32,
        /// The merge request's last push, as `core::approvals::shown` writes it.
        last_push: String,
        /// Who approves it now, each with whether it counts.
        approvals: Vec<crate::core::approvals::Approval>,
    },
    /// `[apply] approvals`: no merge request landed the commit, so no one approved it.
    ApprovalsWithoutMr {
        needed: u32,
    },
    /// Whether the merge request's approvals count could not be told (GitLab did not answer,
    /// a time that cannot be read): a check that guards the apply could not run.
    ApprovalsUnknown {
        mr: u64,
        why: String,
    },
    /// The reviewed plan of the root was targeted (`planbot plan -- -target=…`/`-exclude=…`):
    /// the changes it left out would remain unapplied; applied only when confirmed.
    TargetedPlan {
        root: String,
        /// What the flags did, in a few words (`1 excluded`).
        left_out: String,
        /// The flags, as the engine got them.
        flags: Vec<String>,
        fresh: String,
    },
}

/// A set's failure on a plan checked at apply ([`ApplyRefusal::PolicyFailedAtApply`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyAtApply {
    pub root: String,
    pub set: String,
    /// planbot's own set (else the repository's).
    pub operator: bool,
    /// The default branch and the commit (short) the repository's sets were read from.
    pub branch: String,
    pub base: String,
    pub message: String,
    pub owners: Vec<String>,
    /// The merge request an owner approves on; none for a direct push.
    pub mr: Option<u64>,
}

impl ApplyRefusal {
    /// A short stable name of the failed check, for records, metrics and tests.
    pub fn check(&self) -> String {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) => map
                .get("check")
                .and_then(|c| c.as_str())
                .unwrap_or_default()
                .to_string(),
            _ => String::new(),
        }
    }

    /// Whether `PLANBOT_CONFIRM` set to the root's fresh fingerprint lifts this refusal: a plan
    /// nobody reviewed, a plan changed since review, a targeted plan.
    pub fn confirmable(&self) -> bool {
        matches!(
            self,
            ApplyRefusal::NothingReviewed { .. }
                | ApplyRefusal::RootNotReviewed { .. }
                | ApplyRefusal::PlanChanged { .. }
                | ApplyRefusal::TargetedPlan { .. }
        )
    }

    /// What the person who clicked the job should do next (from `templates/apply/refusal.j2`).
    pub fn hint(&self) -> String {
        render_refusal("hint", self)
    }
}

impl std::fmt::Display for ApplyRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&render_refusal("reason", self))
    }
}

impl std::error::Error for ApplyRefusal {}

fn render_refusal(which: &str, refusal: &ApplyRefusal) -> String {
    let rendered = crate::core::templates::call_macro(
        "apply/refusal.j2",
        which,
        &minijinja::Value::from_serialize(refusal),
    );
    match rendered {
        Ok(text) => text.split_whitespace().collect::<Vec<_>>().join(" "),
        Err(e) => format!("apply refused ({}; template error: {e})", refusal.check()),
    }
}

/// Check a job against the project before anything else happens. The order is the order in
/// which a user would want to hear about problems: is this a job at all, is it ours, is it the
/// apply job of the current head of a protected default branch, and has it applied before.
pub fn check_job(job: &JobFacts, gate: &GateFacts) -> Result<(), ApplyRefusal> {
    if job.status != "running" {
        return Err(ApplyRefusal::JobNotRunning {
            status: job.status.clone(),
        });
    }
    if !gate.allowed_projects.contains(&job.pipeline_project_id) {
        return Err(ApplyRefusal::ProjectNotAllowed {
            project_id: job.pipeline_project_id,
        });
    }
    if job.tag {
        return Err(ApplyRefusal::TagPipeline);
    }
    if job.git_ref != gate.default_branch {
        return Err(ApplyRefusal::NotDefaultBranch {
            git_ref: job.git_ref.clone(),
            default_branch: gate.default_branch.clone(),
        });
    }
    if !gate.ref_protected {
        return Err(ApplyRefusal::BranchNotProtected {
            branch: job.git_ref.clone(),
        });
    }
    if job.job_name != gate.expected_job_name {
        return Err(ApplyRefusal::WrongJobName {
            name: job.job_name.clone(),
            expected: gate.expected_job_name.clone(),
        });
    }
    if job.pipeline_sha != gate.default_branch_head {
        return Err(ApplyRefusal::StalePipeline {
            pipeline_sha: job.pipeline_sha.short().to_string(),
            branch: gate.default_branch.clone(),
            head: gate.default_branch_head.short().to_string(),
        });
    }
    if gate.job_already_applied {
        return Err(ApplyRefusal::JobAlreadyApplied { job_id: job.job_id });
    }
    Ok(())
}

/// Validate the request's `confirm` value: 8 to 64 hex characters.
pub fn parse_confirm(confirm: Option<&str>) -> Result<Option<String>, ApplyRefusal> {
    match confirm.map(str::trim) {
        None | Some("") => Ok(None),
        Some(c) if (8..=64).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(Some(c.to_ascii_lowercase()))
        }
        Some(c) => Err(ApplyRefusal::BadConfirm {
            given: c.chars().take(70).collect(),
        }),
    }
}

/// What to do with one root's fresh plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parity {
    /// Nothing to apply: an empty plan needs no review.
    NothingToApply,
    /// The fresh plan is the reviewed one (or was confirmed): apply it.
    Apply { confirmed: bool },
    /// Refuse: the plan differs, or nothing was reviewed.
    Refuse(ApplyRefusal),
}

/// Decide whether a root's fresh plan may be applied (docs/workflow.md, "Apply from main").
///
/// `reviewed` is the last fingerprint shown on the merged MR for this root (None when the root
/// was not planned on it); `has_mr` is false for a direct push to the default branch.
pub fn parity(
    root: &str,
    fresh: &Fingerprint,
    plan_is_empty: bool,
    has_mr: bool,
    reviewed: Option<&Fingerprint>,
    confirm: Option<&str>,
    sha: &CommitSha,
) -> Parity {
    if plan_is_empty {
        return Parity::NothingToApply;
    }
    if reviewed == Some(fresh) {
        return Parity::Apply { confirmed: false };
    }
    if confirm.is_some_and(|c| fresh.matches_prefix(c)) {
        return Parity::Apply { confirmed: true };
    }
    Parity::Refuse(match (has_mr, reviewed) {
        (false, _) => ApplyRefusal::NothingReviewed {
            sha: sha.short().to_string(),
        },
        (true, None) => ApplyRefusal::RootNotReviewed {
            root: root.to_string(),
        },
        (true, Some(r)) => ApplyRefusal::PlanChanged {
            root: root.to_string(),
            reviewed: r.short().to_string(),
            fresh: fresh.as_hex().to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(c: char) -> CommitSha {
        CommitSha(c.to_string().repeat(40))
    }

    fn job() -> JobFacts {
        JobFacts {
            job_id: JobId(8),
            job_name: "planbot-apply".into(),
            status: "running".into(),
            git_ref: "main".into(),
            tag: false,
            pipeline_project_id: ProjectId(1),
            pipeline_sha: sha('a'),
            username: Some("root".into()),
        }
    }

    fn gate() -> GateFacts {
        GateFacts {
            allowed_projects: vec![ProjectId(1)],
            default_branch: "main".into(),
            ref_protected: true,
            default_branch_head: sha('a'),
            expected_job_name: "planbot-apply".into(),
            job_already_applied: false,
        }
    }

    #[test]
    fn the_apply_job_of_the_current_head_passes() {
        assert_eq!(check_job(&job(), &gate()), Ok(()));
    }

    #[test]
    fn each_check_refuses_with_its_own_reason() {
        let cases: Vec<(JobFacts, GateFacts, &str)> = vec![
            (
                JobFacts {
                    status: "success".into(),
                    ..job()
                },
                gate(),
                "job_not_running",
            ),
            (
                JobFacts {
                    pipeline_project_id: ProjectId(2),
                    ..job()
                },
                gate(),
                "project_not_allowed",
            ),
            (JobFacts { tag: true, ..job() }, gate(), "tag_pipeline"),
            (
                JobFacts {
                    git_ref: "feature".into(),
                    ..job()
                },
                gate(),
                "not_default_branch",
            ),
            (
                job(),
                GateFacts {
                    ref_protected: false,
                    ..gate()
                },
                "branch_not_protected",
            ),
            (
                JobFacts {
                    job_name: "deploy".into(),
                    ..job()
                },
                gate(),
                "wrong_job_name",
            ),
            (
                job(),
                GateFacts {
                    default_branch_head: sha('b'),
                    ..gate()
                },
                "stale_pipeline",
            ),
            (
                job(),
                GateFacts {
                    job_already_applied: true,
                    ..gate()
                },
                "job_already_applied",
            ),
        ];
        for (j, g, check) in cases {
            let refusal = check_job(&j, &g).unwrap_err();
            assert_eq!(refusal.check(), check, "{refusal}");
            assert!(!refusal.hint().is_empty());
        }
    }

    #[test]
    fn parity_applies_only_the_reviewed_or_confirmed_plan() {
        let fp = |c: char| Fingerprint::from_hex(&c.to_string().repeat(64)).unwrap();
        let s = sha('a');
        assert_eq!(
            parity("core", &fp('1'), true, true, None, None, &s),
            Parity::NothingToApply
        );
        assert_eq!(
            parity("core", &fp('1'), false, true, Some(&fp('1')), None, &s),
            Parity::Apply { confirmed: false }
        );
        let refused = parity("core", &fp('2'), false, true, Some(&fp('1')), None, &s);
        let Parity::Refuse(r) = refused else {
            panic!("{refused:?}")
        };
        assert_eq!(r.check(), "plan_changed");
        assert!(
            r.hint().contains("PLANBOT_CONFIRM=222222222222"),
            "{}",
            r.hint()
        );
        assert_eq!(
            parity(
                "core",
                &fp('2'),
                false,
                true,
                Some(&fp('1')),
                Some("22222222"),
                &s
            ),
            Parity::Apply { confirmed: true }
        );
        // A confirm for a different plan does not apply this one.
        assert!(matches!(
            parity(
                "core",
                &fp('2'),
                false,
                true,
                Some(&fp('1')),
                Some("11111111"),
                &s
            ),
            Parity::Refuse(_)
        ));
        assert!(matches!(
            parity("core", &fp('2'), false, false, None, None, &s),
            Parity::Refuse(ApplyRefusal::NothingReviewed { .. })
        ));
        assert!(matches!(
            parity("core", &fp('2'), false, true, None, None, &s),
            Parity::Refuse(ApplyRefusal::RootNotReviewed { .. })
        ));
    }

    #[test]
    fn confirm_values_must_be_hex_prefixes() {
        assert_eq!(parse_confirm(None), Ok(None));
        assert_eq!(parse_confirm(Some("  ")), Ok(None));
        assert_eq!(
            parse_confirm(Some("ABCDEF12")),
            Ok(Some("abcdef12".to_string()))
        );
        assert!(parse_confirm(Some("abc")).is_err());
        assert!(parse_confirm(Some("zzzzzzzz")).is_err());
        assert!(parse_confirm(Some("\"; rm -rf /")).is_err());
    }

    #[test]
    fn every_refusal_reads_well() {
        let all = vec![
            ApplyRefusal::InvalidJobToken,
            ApplyRefusal::JobNotRunning {
                status: "success".into(),
            },
            ApplyRefusal::ProjectNotAllowed {
                project_id: ProjectId(7),
            },
            ApplyRefusal::TagPipeline,
            ApplyRefusal::NotDefaultBranch {
                git_ref: "feature".into(),
                default_branch: "main".into(),
            },
            ApplyRefusal::BranchNotProtected {
                branch: "main".into(),
            },
            ApplyRefusal::WrongJobName {
                name: "deploy".into(),
                expected: "planbot-apply".into(),
            },
            ApplyRefusal::StalePipeline {
                pipeline_sha: "aaaaaaaa".into(),
                branch: "main".into(),
                head: "bbbbbbbb".into(),
            },
            ApplyRefusal::JobAlreadyApplied { job_id: JobId(8) },
            ApplyRefusal::RootBusy {
                root: "core".into(),
            },
            ApplyRefusal::NothingReviewed {
                sha: "aaaaaaaa".into(),
            },
            ApplyRefusal::RootNotReviewed { root: "dns".into() },
            ApplyRefusal::PlanChanged {
                root: "core".into(),
                reviewed: "111111111111".into(),
                fresh: "2".repeat(64),
            },
            ApplyRefusal::PreflightFailed {
                root: "core".into(),
                finding: "PVE104: the token cannot download".into(),
            },
            ApplyRefusal::BadConfirm {
                given: "xyz".into(),
            },
            ApplyRefusal::StateInCheckout { root: "lab".into() },
            ApplyRefusal::PolicyFailed {
                root: "core".into(),
                set: "no-deletes".into(),
                message: "proxmox_virtual_environment_vm.db would be destroyed".into(),
                owners: vec!["alice".into(), "group:infra/admins".into()],
            },
            ApplyRefusal::PolicyFailed {
                root: "core".into(),
                set: "guardrails".into(),
                message: "VM 101 asks for 64 GiB".into(),
                owners: vec![],
            },
            ApplyRefusal::PolicyFailedAtApply(Box::new(PolicyAtApply {
                root: "core2".into(),
                set: "new-vms".into(),
                operator: false,
                branch: "main".into(),
                base: "1111aaaa".into(),
                message: "terraform_data.vm is a new VM".into(),
                owners: vec!["group:infra/capacity".into()],
                mr: Some(7),
            })),
            ApplyRefusal::PolicyFailedAtApply(Box::new(PolicyAtApply {
                root: "core".into(),
                set: "no-destroy".into(),
                operator: true,
                branch: "main".into(),
                base: "1111aaaa".into(),
                message: "a VM is destroyed".into(),
                owners: vec!["group:infra/admins".into()],
                mr: None,
            })),
            ApplyRefusal::PolicyFailedAtApply(Box::new(PolicyAtApply {
                root: "core".into(),
                set: "sizes".into(),
                operator: false,
                branch: "main".into(),
                base: "1111aaaa".into(),
                message: "too big".into(),
                owners: vec![],
                mr: Some(7),
            })),
            ApplyRefusal::TargetedPlan {
                root: "core".into(),
                left_out: "1 excluded".into(),
                flags: vec!["-exclude=terraform_data.b".into()],
                fresh: "3".repeat(64),
            },
        ];
        let text: String = all
            .iter()
            .map(|r| {
                format!(
                    "[{}]\nplanbot: apply refused: {r}\n{}\n\n",
                    r.check(),
                    r.hint()
                )
            })
            .collect();
        insta::assert_snapshot!(text);
    }
}
