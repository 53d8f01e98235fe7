//! Stage 4 and 5 of a plan run: once the note that shows them is up, store every run's end,
//! the fingerprints and digests of the clean plans; then set the commit statuses from what was
//! recorded.

use super::note::{root_checks, Posted};
use super::roots::{Outcome, RootResult};
use super::shared::{set_status, text};
use crate::capabilities::engine::ShownPlan;
use crate::capabilities::gitlab::{CommitStatus, StatusState};
use crate::capabilities::store::{PolicyVerdictRecord, RunEnd, RunState, ShownFingerprint};
use crate::core::engine_checks::TestsStatus;
use crate::core::events::PlanJob;
use crate::core::proxmox::findings::Finding;
use crate::core::proxmox::lint;
use crate::core::redact::Scrubber;
use crate::core::repo_config::RepoConfigError;
use crate::core::summary::Summary;
use crate::flows::context::app_state::App;
use crate::flows::context::cpu::cpu_bound;
use crate::flows::review::gitlab_calls::set_commit_status;
use crate::flows::review::policies;
use anyhow::Result;

/// What the final status is decided from.
#[derive(Default)]
pub(super) struct Recorded {
    /// Roots whose plan failed or errored.
    pub failed: usize,
    /// Roots planned (errored or not).
    pub planned: usize,
    /// Every finding of every planned root.
    pub findings: Vec<Finding>,
    /// `{name, state, summary}` per planned or failed root, for the status description.
    pub roots: Vec<minijinja::Value>,
    /// What the roots' tests said (`None`: no root has tests).
    pub tests: Option<TestsStatus>,
    /// How many changed configuration files no root claims (the description counts them).
    pub in_no_root: usize,
}

/// Stage 4: finish every run (its summary, scrubbed log and the note; failed when the plan
/// errored, a finding is an error, or `blocked`: the MR's `.planbot.toml` is broken) and, for the clean plans,
/// store the fingerprint shown on the MR and the secret-free digest a refused apply compares
/// with; what the roots' tests said is kept for `planbot/test`. The plan files go away as the
/// results are consumed.
pub(super) async fn record(
    app: &App,
    job: &PlanJob,
    results: Vec<RootResult>,
    note: &Posted,
    blocked: bool,
) -> Result<Recorded> {
    let checks = results
        .iter()
        .filter_map(|r| root_checks(r).map(|c| (r.name.as_str(), c)));
    let mut rec = Recorded {
        tests: TestsStatus::of(checks),
        ..Recorded::default()
    };
    for r in results {
        let (name, targeted, retired) = (r.name, r.targeting.counts(), r.retired.is_some());
        match r.outcome {
            Outcome::Planned {
                run,
                planned,
                findings,
                fingerprint,
                ..
            } => {
                rec.planned += 1;
                let errored = planned.plan().errored;
                let summary = Summary::of(planned.plan()).one_line();
                let log = note.scrubber.scrub(planned.log()).into_owned();
                // The run's outcome is the verdict the status and the headline carry: an
                // error finding (STATE001, a lint error) or a broken `.planbot.toml` in the MR
                // fails them, so it fails the run too.
                let state = if errored || blocked || lint::status_description(&findings).is_some() {
                    RunState::Failed
                } else {
                    RunState::Succeeded
                };
                let end = RunEnd {
                    state,
                    summary: Some(summary.clone()),
                    log,
                    note_markdown: Some(note.body.clone()),
                    fingerprint: (!errored).then(|| fingerprint.clone()),
                };
                app.store.finish_run(run, end).await?;
                if errored {
                    rec.failed += 1;
                    rec.roots.push(minijinja::context! { name => &name, state => "errored", targeted, retired });
                } else {
                    let shown = ShownFingerprint {
                        project: job.project,
                        mr: job.mr,
                        root: name.clone(),
                        sha: job.head.clone(),
                        fingerprint,
                        run: Some(run),
                    };
                    record_clean(app, note, shown, &planned).await?;
                    rec.roots.push(minijinja::context! { name => &name, state => "planned", summary, targeted, retired });
                }
                rec.findings.extend(findings);
                drop(planned); // the plan file goes with it
            }
            Outcome::Failed { run, end, .. } => {
                // Its run page shows the note that says why it failed.
                let end = RunEnd {
                    note_markdown: Some(note.body.clone()),
                    ..end
                };
                app.store.finish_run(run, end).await?;
                rec.failed += 1;
                rec.roots.push(
                    minijinja::context! { name => &name, state => "failed", targeted, retired },
                );
            }
            Outcome::Skipped { .. } => {}
        }
    }
    Ok(rec)
}

/// A clean plan, as `shown` on the MR: its policy verdict first (a fingerprint the apply can
/// find always has the verdict it is gated by, with no set when none checked the plan), the
/// fingerprint, and the secret-free digest, so a refused apply can show what changed.
async fn record_clean(
    app: &App,
    note: &Posted,
    shown: ShownFingerprint,
    planned: &ShownPlan,
) -> Result<()> {
    let verdict = note.verdict_of(&shown.root);
    app.store
        .record_policy_verdict(PolicyVerdictRecord {
            project: shown.project,
            mr: shown.mr,
            root: shown.root.clone(),
            sha: shown.sha.clone(),
            fingerprint: shown.fingerprint.clone(),
            verdict,
        })
        .await?;
    let (project, mr, root, sha) = (
        shown.project,
        shown.mr,
        shown.root.clone(),
        shown.sha.clone(),
    );
    app.store.record_fingerprint(shown).await?;
    let key = app.config.fingerprint_key.expose().as_bytes();
    let digest = cpu_bound(|| planned.digest(key).scrubbed(&note.scrubber));
    app.store
        .record_digest(project, mr, &root, &sha, &digest)
        .await?;
    Ok(())
}

/// Stage 5: `planbot/plan` from what was recorded (failed when the MR breaks `.planbot.toml`:
/// merged as is, nothing could be planned), `planbot/test` when a root has tests, and
/// `planbot/policy` from the verdicts and the approvals on the note; returns the plan's state.
pub(super) async fn set_statuses(
    app: &App,
    job: &PlanJob,
    rec: &Recorded,
    note: &Posted,
    status_ref: &Option<String>,
    proposed_invalid: Option<&RepoConfigError>,
) -> StatusState {
    let (state, description) = match proposed_invalid {
        Some(err) => (
            StatusState::Failed,
            text(
                &app.scrubber,
                "invalid_proposed",
                minijinja::context! {
                    file => crate::core::repo_config::FILE_NAME,
                    problem => err.problems.first().map(|p| p.to_string()).unwrap_or_default(),
                    more => err.problems.len().saturating_sub(1),
                },
            ),
        ),
        None => final_status(rec, &app.scrubber),
    };
    let url = note.run_url.clone();
    set_status(app, job, state, &description, url, status_ref.clone()).await;
    if let Some(tests) = &rec.tests {
        set_test_status(app, job, tests, status_ref.clone()).await;
    }
    let (verdicts, approvals) = (&note.policies, &note.approvals);
    let (project, head) = (job.project, &job.head);
    policies::set_status(app, project, head, status_ref.clone(), verdicts, approvals).await;
    state
}

/// `planbot/test`: success when every root's tests ran and passed, failed when one failed,
/// errored or did not run; the description counts them. Only called when a root has tests.
async fn set_test_status(app: &App, job: &PlanJob, tests: &TestsStatus, ref_: Option<String>) {
    let description = text(&app.scrubber, "tests", minijinja::context! { t => tests });
    let status = CommitStatus {
        state: if tests.ok {
            StatusState::Success
        } else {
            StatusState::Failed
        },
        name: crate::core::commit_status::TEST.into(),
        description: Some(description.chars().take(255).collect()),
        target_url: None,
        ref_,
        pipeline_id: None,
    };
    set_commit_status(app, job.project, &job.head, &status, "test status").await;
}

/// Stage 5's decision: failed when a root failed or a lint error blocks the apply, else success
/// (saying so when no root was affected); the description is one line.
/// Its values are scrubbed with `scrubber`, its words never.
pub(super) fn final_status(rec: &Recorded, scrubber: &Scrubber) -> (StatusState, String) {
    let lint_error =
        crate::core::templates::scrubbing(scrubber, || lint::status_description(&rec.findings));
    if rec.failed > 0 {
        (
            StatusState::Failed,
            text(
                scrubber,
                "result",
                minijinja::context! { roots => &rec.roots, in_no_root => rec.in_no_root },
            ),
        )
    } else if let Some(lint_error) = lint_error {
        (StatusState::Failed, lint_error)
    } else if rec.planned == 0 {
        (
            StatusState::Success,
            text(
                scrubber,
                "no_root",
                minijinja::context! { in_no_root => rec.in_no_root },
            ),
        )
    } else {
        (
            StatusState::Success,
            text(
                scrubber,
                "result",
                minijinja::context! { roots => &rec.roots, in_no_root => rec.in_no_root },
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::proxmox::findings::Severity;

    fn planned(name: &str) -> minijinja::Value {
        minijinja::context! { name => name, state => "planned", summary => "1 to add, 0 to change, 0 to destroy" }
    }

    #[test]
    fn a_failed_root_fails_the_status_and_names_the_root() {
        let rec = Recorded {
            failed: 1,
            planned: 1,
            roots: vec![
                planned("core"),
                minijinja::context! { name => "dns", state => "failed" },
            ],
            ..Recorded::default()
        };
        let (state, text) = final_status(&rec, &Scrubber::none());
        assert_eq!(state, StatusState::Failed);
        assert!(text.contains("dns") && text.contains("core"), "{text}");
    }

    #[test]
    fn nothing_affected_is_a_success_that_says_so() {
        let none = Scrubber::none();
        let (state, text) = final_status(&Recorded::default(), &none);
        assert_eq!(state, StatusState::Success);
        assert_eq!(text, super::text(&none, "no_root", minijinja::context! {}));
    }

    #[test]
    fn a_lint_error_fails_an_otherwise_clean_plan() {
        let clean = Recorded {
            planned: 1,
            roots: vec![planned("core")],
            ..Recorded::default()
        };
        assert_eq!(
            final_status(&clean, &Scrubber::none()).0,
            StatusState::Success
        );
        let finding = Finding {
            rule: "PVE001",
            severity: Severity::Error,
            address: "proxmox_virtual_environment_vm.web".into(),
            message: "the VM's disk is on a storage the node does not have".into(),
            fix: "move the disk".into(),
        };
        let blocked = Recorded {
            findings: vec![finding],
            ..clean
        };
        let (state, text) = final_status(&blocked, &Scrubber::none());
        assert_eq!(state, StatusState::Failed);
        assert_eq!(Some(text), lint::status_description(&blocked.findings));
    }
}
