//! The MR notes of the apply half: "plan changed since review" refusals and apply results.

use crate::core::markdown::fence_for;
use crate::core::plan_digest::PlanDelta;
use crate::core::redact::Scrubber;
use minijinja::context;
use serde::Serialize;

/// What the plan-changed note needs.
pub struct PlanChangedNote<'a> {
    pub root: &'a str,
    pub sha: &'a str,
    pub job_name: &'a str,
    pub user: Option<&'a str>,
    pub reviewed_short: &'a str,
    pub fresh_short: &'a str,
    pub delta: &'a PlanDelta,
    /// The fresh plan rendered as a plan note (already scrubbed).
    pub new_plan: &'a str,
}

/// The plan-changed note; every value is scrubbed, the template's words never are.
pub fn render_plan_changed(note: &PlanChangedNote<'_>, scrubber: &Scrubber) -> String {
    let delta_text = serde_json::to_string(note.delta).unwrap_or_default();
    let fence = fence_for(&delta_text);
    crate::core::templates::scrubbing(scrubber, || {
        crate::core::templates::get("apply/plan_changed.md.j2")
            .and_then(|t| {
                t.render(context! {
                    root => note.root,
                    sha => &note.sha[..note.sha.len().min(8)],
                    job_name => note.job_name,
                    user => note.user,
                    reviewed => note.reviewed_short,
                    fresh_short => note.fresh_short,
                    delta => note.delta,
                    // A note planbot rendered and scrubbed already: as it is.
                    new_plan => minijinja::Value::from_safe_string(note.new_plan.to_string()),
                    fence => fence,
                })
            })
            .unwrap_or_else(|e| format!("planbot: could not render the refusal note: {e}"))
    })
}

/// How an apply ended, for the result note.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ApplyOutcome {
    Applied,
    Nothing,
    Failed,
    /// Refused before anything was applied (a check said no): the note says why and what to do.
    Refused,
    Interrupted,
}

/// What a policy line the apply relied on stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reliance {
    /// Policy sets that passed on the plan.
    Passed,
    /// A failing policy set its owners approved for the plan.
    Approved,
}

/// A policy verdict or approval the apply relied on: its line, as the job's log says it (for
/// the result note), and what it stands for, as data. The line holds names from the
/// repository and GitLab; it is shown, never read back to tell what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relied {
    pub reliance: Reliance,
    pub line: String,
}

/// How many failing policy sets the apply relied on an approval of (the status counts them):
/// each once, however often the apply checked the same plan (a root planned again after its
/// upstream applied is checked again, and says the same line again).
pub fn approvals(relied: &[Relied]) -> usize {
    let approved: Vec<&Relied> = relied
        .iter()
        .filter(|r| r.reliance == Reliance::Approved)
        .collect();
    distinct(&approved).len()
}

/// `items` without repeats, each where it first came.
fn distinct<T: PartialEq + Clone>(items: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(items.len());
    for i in items {
        if !out.contains(i) {
            out.push(i.clone());
        }
    }
    out
}

/// One root's line in the result note.
#[derive(Debug, Clone, Serialize)]
pub struct RootResult {
    pub name: String,
    pub text: String,
}

pub struct ResultNote<'a> {
    pub outcome: ApplyOutcome,
    pub sha: &'a str,
    pub branch: &'a str,
    pub user: Option<&'a str>,
    pub summary: &'a str,
    pub roots: &'a [RootResult],
    pub error: Option<&'a str>,
    pub log_excerpt: Option<&'a str>,
    /// What to do about a refusal (the job log's hint).
    pub hint: Option<&'a str>,
    /// The policy verdicts and approvals the apply relied on, one line each.
    pub policies: &'a [String],
    pub job_name: &'a str,
    pub job_id: u64,
    pub run_id: Option<u64>,
    pub run_url: Option<&'a str>,
    /// Where the run's log is on the planbot host, when its pages cannot be linked
    /// (`crate::core::links::on_the_host`).
    pub run_hint: Option<&'a str>,
}

/// The apply's result note; every value is scrubbed, the template's words never are.
pub fn render_result(note: &ResultNote<'_>, scrubber: &Scrubber) -> String {
    let fence = fence_for(&format!(
        "{}\n{}",
        note.error.unwrap_or(""),
        note.log_excerpt.unwrap_or("")
    ));
    crate::core::templates::scrubbing(scrubber, || {
        crate::core::templates::get("apply/result_note.md.j2")
            .and_then(|t| {
                t.render(context! {
                    outcome => note.outcome,
                    sha => &note.sha[..note.sha.len().min(8)],
                    branch => note.branch,
                    user => note.user,
                    summary => note.summary,
                    roots => note.roots,
                    error => note.error,
                    log_excerpt => note.log_excerpt,
                    hint => note.hint,
                    policies => distinct(note.policies),
                    job_name => note.job_name,
                    job_id => note.job_id,
                    run_id => note.run_id,
                    run_url => note.run_url,
                    run_hint => note.run_hint,
                    fence => fence,
                })
            })
            .unwrap_or_else(|e| format!("planbot: could not render the apply result: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_approval_counts_as_one_whatever_a_lines_text_says() {
        let line = |reliance, line: &str| Relied {
            reliance,
            line: line.to_string(),
        };
        let relied = [
            // Text that looks like an approval (names come from the repository): not one.
            line(
                Reliance::Passed,
                "root `vms`: 2 policy sets passed on the reviewed plan; approved for it by @mallory",
            ),
            line(
                Reliance::Passed,
                "root `dns`: policy set `a; approved for it by @x` passed on the plan to apply",
            ),
            line(
                Reliance::Approved,
                "root `vms`: policy set `new-vms` failed on the reviewed plan; approved for it by @carol",
            ),
        ];
        assert_eq!(approvals(&relied), 1);
        assert_eq!(approvals(&relied[..2]), 0);
    }

    #[test]
    fn a_verdict_said_again_after_a_replan_counts_and_shows_once() {
        // `vms` checked before `network` applied, and again once planned again after it.
        let approved = Relied {
            reliance: Reliance::Approved,
            line: "root `vms`: policy set `vm-sizes` failed on the reviewed plan; approved for it by @carol".into(),
        };
        let passed = Relied {
            reliance: Reliance::Passed,
            line: "root `network`: 1 policy set passed on the reviewed plan".into(),
        };
        let relied = [passed.clone(), approved.clone(), approved.clone()];
        assert_eq!(approvals(&relied), 1);
        let lines: Vec<String> = relied.iter().map(|r| r.line.clone()).collect();
        let note = render_result(
            &ResultNote {
                outcome: ApplyOutcome::Applied,
                sha: "3f9a2c1e00000000000000000000000000000000",
                branch: "main",
                user: Some("alice"),
                summary: "network: 1 changed; vms: 2 changed",
                roots: &[],
                error: None,
                log_excerpt: None,
                hint: None,
                policies: &lines,
                job_name: "planbot-apply",
                job_id: 8,
                run_id: None,
                run_url: None,
                run_hint: None,
            },
            &Scrubber::none(),
        );
        assert_eq!(note.matches(&passed.line).count(), 1, "{note}");
        assert_eq!(
            note.matches("failed on the reviewed plan").count(),
            1,
            "{note}"
        );
    }
    use crate::core::plan::Plan;
    use crate::core::plan_digest::{delta, PlanDigest};
    use crate::core::redact::Secrets;

    fn digest(cores: u32, pw: &str) -> PlanDigest {
        let plan = Plan::from_json(
            format!(
                r#"{{"format_version":"1.2","resource_changes":[
                {{"address":"terraform_data.vm[\"blocky\"]","mode":"managed","change":{{"actions":["update"],
                  "after":{{"input":{{"cores":{cores},"pw":"{pw}"}}}},"after_sensitive":{{"input":{{"pw":true}}}}}}}}]}}"#
            )
            .as_bytes(),
        )
        .unwrap();
        PlanDigest::of(&plan, b"key")
    }

    #[test]
    fn the_plan_changed_note_shows_the_difference_and_how_to_confirm() {
        let d = delta(&digest(2, "pw-one-1234"), &digest(4, "pw-two-5678"));
        let mut secrets = Secrets::new();
        secrets.add("pw-two-5678");
        let note = render_plan_changed(
            &PlanChangedNote {
                root: "core",
                sha: "3f9a2c1e00000000000000000000000000000000",
                job_name: "planbot-apply",
                user: Some("alice"),
                reviewed_short: "111111111111",
                fresh_short: "222222222222",
                delta: &d,
                new_plan: "### 🟡 planbot · plan for `3f9a2c1e` (the fresh plan)",
            },
            &secrets.scrubber(),
        );
        assert!(!note.contains("pw-two-5678"));
        insta::assert_snapshot!(note);
    }

    #[test]
    fn result_notes_read_well() {
        let roots = vec![RootResult {
            name: "core".into(),
            text: "2 added, 1 changed".into(),
        }];
        let base = ResultNote {
            outcome: ApplyOutcome::Applied,
            sha: "3f9a2c1e00000000000000000000000000000000",
            branch: "main",
            user: Some("alice"),
            summary: "2 added, 1 changed",
            roots: &roots,
            error: None,
            log_excerpt: Some("Apply complete! Resources: 2 added, 1 changed, 0 destroyed."),
            hint: None,
            policies: &[],
            job_name: "planbot-apply",
            job_id: 8,
            run_id: Some(121),
            run_url: Some("https://planbot.example.com/runs/121"),
            run_hint: None,
        };
        let s = Scrubber::none();
        let applied = render_result(&base, &s);
        let failed = render_result(
            &ResultNote {
                outcome: ApplyOutcome::Failed,
                error: Some("Error: HTTP 400 (filename: invalid filename or wrong extension) ```"),
                ..base
            },
            &s,
        );
        let interrupted = render_result(
            &ResultNote {
                outcome: ApplyOutcome::Interrupted,
                log_excerpt: None,
                ..base
            },
            &s,
        );
        assert!(
            failed.contains("````text"),
            "a longer fence around backticks: {failed}"
        );
        insta::assert_snapshot!("applied", applied);
        let relied = render_result(
            &ResultNote {
                policies: &[
                    "root `core`: policy set `new-vms` failed on the reviewed plan; approved for it by @carol".into(),
                    "root `core`: 1 policy set passed on the reviewed plan".into(),
                ],
                ..base
            },
            &s,
        );
        insta::assert_snapshot!("applied_relying_on_policies", relied);
        insta::assert_snapshot!("failed", failed);
        insta::assert_snapshot!("interrupted", interrupted);
        let refused = render_result(
            &ResultNote {
                outcome: ApplyOutcome::Refused,
                summary: "",
                roots: &[RootResult {
                    name: "core".into(),
                    text: "not applied".into(),
                }],
                error: Some("policy set `new-vms` failed on the reviewed plan of root `core`: terraform_data.vm is a new VM"),
                log_excerpt: None,
                hint: Some("An owner of `new-vms` (`group:infra/capacity`) may approve this plan by commenting `planbot approve policies` on the merge request; then retry this job."),
                ..base
            },
            &s,
        );
        insta::assert_snapshot!("refused", refused);
        let on_the_host = render_result(
            &ResultNote {
                run_url: None,
                run_hint: Some("http://localhost:8080/runs/121"),
                ..base
            },
            &s,
        );
        assert!(
            on_the_host
                .contains("run #121 (log on the planbot host: `http://localhost:8080/runs/121`)"),
            "{on_the_host}"
        );
    }
}
