//! Drift of one root: a plan of the default branch's head read as "does reality still match
//! `main`", the hidden marker that finds the root's drift issue again, and that issue's texts.
//!
//! A plan of `main` says two different things. Its `resource_drift` lists objects changed
//! outside the engine (someone resized a VM by hand); its `resource_changes` list what an apply
//! would do. Planned changes are drift only when `main` has no merge still waiting for its
//! apply job: a merged MR whose apply has not run yet explains them, and the issue says so
//! instead of calling it drift.

use crate::core::markdown::fence_for;
use crate::core::plan::{Plan, ResourceChange};
use crate::core::redact::Scrubber;
use minijinja::context;
use serde::Serialize;

/// How many characters of attribute diffs the drift issue holds (GitLab takes descriptions of
/// up to 1,000,000); the resources past it are listed with their diff left out, and
/// `planbot drift` prints them whole.
pub const ISSUE_DIFF_CHARS: usize = 200_000;

/// One resource the check found different from `main`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DriftedResource {
    pub address: String,
    /// `changed outside` for a `resource_drift` entry, else the planned actions (`update`,
    /// `delete, create`).
    pub change: String,
    /// What differs, from `main` to reality, as the MR note's diffs show it: one line per
    /// changed attribute path (`~ input.cores = 2 -> 8`, however deep in an object or list),
    /// a long text as a line diff, a sensitive value as `(sensitive value)` only.
    pub diff: String,
    /// How many attribute paths differ.
    pub changed: usize,
}

/// What one check of one root found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum DriftVerdict {
    /// Reality matches `main`.
    Clean,
    /// Reality differs from `main`: objects changed outside the engine, or changes an apply
    /// would make while no merge is waiting for its apply.
    Drifted { resources: Vec<DriftedResource> },
    /// Changes that the apply of merge request `!mr` (merged, not yet applied) will make.
    WaitingForApply { mr: u64 },
    /// The plan did not run to the end (provider down, Proxmox unreachable): nothing is known,
    /// which is never "no drift".
    CouldNotCheck { error: String },
}

impl DriftVerdict {
    /// Read a finished plan of the default branch's head. `unapplied_merge` is the newest merge
    /// request merged into it whose apply has not run.
    pub fn of_plan(plan: &Plan, unapplied_merge: Option<u64>) -> Self {
        let outside: Vec<DriftedResource> = plan
            .resource_drift
            .iter()
            .map(|rc| drifted(rc, "changed outside".to_string(), Side::Before))
            .collect();
        let planned: Vec<&ResourceChange> = plan
            .resource_changes
            .iter()
            .filter(|rc| !is_noop(&rc.change.actions))
            .collect();
        if outside.is_empty() && planned.is_empty() {
            return Self::Clean;
        }
        if outside.is_empty() {
            if let Some(mr) = unapplied_merge {
                return Self::WaitingForApply { mr };
            }
        }
        let mut resources = outside;
        for rc in planned {
            if !resources.iter().any(|r| r.address == rc.address) {
                resources.push(drifted(rc, rc.change.actions.join(", "), Side::After));
            }
        }
        Self::Drifted { resources }
    }

    /// The exit code of `planbot drift` for this verdict alone: 0 clean (waiting for an
    /// apply is not drift), 2 drift, 1 could not check.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Clean | Self::WaitingForApply { .. } => 0,
            Self::Drifted { .. } => 2,
            Self::CouldNotCheck { .. } => 1,
        }
    }
}

fn is_noop(actions: &[String]) -> bool {
    actions.iter().all(|a| a == "no-op" || a == "read")
}

/// Which side of a change is `main`: a `resource_drift` entry goes from the state `main`'s apply
/// left (before) to reality (after); a planned change goes from reality (before, refreshed) to
/// `main`'s code (after).
#[derive(Clone, Copy)]
enum Side {
    Before,
    After,
}

fn drifted(rc: &ResourceChange, change: String, main_side: Side) -> DriftedResource {
    // Read from `main` to reality: a planned change goes from reality to `main`'s code, so it
    // is read backwards.
    let values = rc.change.values();
    let body = crate::core::render::attribute_diff(values.get(), matches!(main_side, Side::After));
    DriftedResource {
        address: rc.address.clone(),
        change,
        diff: body.text,
        changed: body.changed,
    }
}

/// One resource as the issue shows it: its diff neutralised and fenced, or left out past
/// [`ISSUE_DIFF_CHARS`].
#[derive(Serialize)]
struct ResourceView<'a> {
    address: &'a str,
    change: &'a str,
    diff: String,
    fence: String,
    changed: usize,
    left_out: bool,
}

fn resource_views(verdict: &DriftVerdict) -> Vec<ResourceView<'_>> {
    let DriftVerdict::Drifted { resources } = verdict else {
        return Vec::new();
    };
    let mut room = ISSUE_DIFF_CHARS;
    resources
        .iter()
        .map(|r| {
            let diff = crate::core::markdown::neutralise(r.diff.trim_end()).into_owned();
            let left_out = diff.len() > room;
            room = room.saturating_sub(if left_out { 0 } else { diff.len() });
            let (diff, fence) = if left_out {
                (String::new(), String::new())
            } else {
                let fence = fence_for(&diff);
                (diff, fence)
            };
            ResourceView {
                address: &r.address,
                change: &r.change,
                diff,
                fence,
                changed: r.changed,
                left_out,
            }
        })
        .collect()
}

/// The hidden line that finds a root's drift issue again among the project's issues.
pub fn marker(root: &str) -> String {
    format!(
        "<!-- planbot:drift root={} -->",
        root.replace("--", "-\u{2010}")
    )
}

/// The root an issue's marker names, if its description holds one.
pub fn root_of_marker(description: &str) -> Option<String> {
    let start = description.find("<!-- planbot:drift root=")? + "<!-- planbot:drift root=".len();
    let rest = &description[start..];
    let end = rest.find(" -->")?;
    Some(rest[..end].replace("-\u{2010}", "--"))
}

/// What the drift issue of one root needs.
pub struct DriftIssue<'a> {
    pub project: &'a str,
    pub root: &'a str,
    pub branch: &'a str,
    pub sha: &'a str,
    pub verdict: &'a DriftVerdict,
    /// When drift was first and last seen (RFC 3339, UTC).
    pub first_seen: &'a str,
    pub last_seen: &'a str,
    /// The fingerprint of the plan that brings reality back to `main`, when there is one.
    pub fingerprint: Option<&'a str>,
    pub job_name: &'a str,
    /// This check's run page (`<public_url>/runs/<id>`), or where its log is on the planbot
    /// host when the pages cannot be linked.
    pub run_url: Option<&'a str>,
    pub run_hint: Option<&'a str>,
}

/// The issue's title.
pub fn render_title(issue: &DriftIssue<'_>, scrubber: &Scrubber) -> String {
    render(issue, "title", scrubber)
}

/// The issue's description, ending with the hidden marker.
pub fn render_body(issue: &DriftIssue<'_>, scrubber: &Scrubber) -> String {
    format!(
        "{}\n\n{}\n",
        render(issue, "body", scrubber),
        marker(issue.root)
    )
}

/// The check as its run page shows it: the issue's description without the marker or the
/// first-seen time (known to the issue only).
pub fn render_run_note(issue: &DriftIssue<'_>, scrubber: &Scrubber) -> String {
    render(
        &DriftIssue {
            first_seen: "",
            run_url: None,
            run_hint: None,
            ..*issue
        },
        "body",
        scrubber,
    )
}

/// The hidden line that ends a note planbot leaves before it closes a drift issue: a check
/// that finds it as planbot's newest note knows the note is there and only the close is left
/// (GitLab failed between the two).
pub const CLOSING_MARKER: &str = "<!-- planbot:drift-closing -->";

/// The note left when a later check finds the root clean, before the issue is closed.
pub fn render_closing_note(issue: &DriftIssue<'_>, scrubber: &Scrubber) -> String {
    format!("{}\n\n{CLOSING_MARKER}", render(issue, "closed", scrubber))
}

/// The note left on the open issue of a root no longer checked (gone from `.planbot.toml`, or
/// `drift = false`), before it is closed.
pub fn render_unchecked_note(issue: &DriftIssue<'_>, scrubber: &Scrubber) -> String {
    format!(
        "{}\n\n{CLOSING_MARKER}",
        render(issue, "unchecked", scrubber)
    )
}

/// The note left on a second open issue of the same root (two checks that ran at once both
/// found none and opened one), before it is closed in favour of `kept`.
pub fn render_duplicate_note(issue: &DriftIssue<'_>, kept: u64, scrubber: &Scrubber) -> String {
    format!(
        "{}\n\n{CLOSING_MARKER}",
        render_with(issue, "duplicate", Some(kept), scrubber)
    )
}

fn render(issue: &DriftIssue<'_>, kind: &str, scrubber: &Scrubber) -> String {
    render_with(issue, kind, None, scrubber)
}

fn render_with(
    issue: &DriftIssue<'_>,
    kind: &str,
    kept: Option<u64>,
    scrubber: &Scrubber,
) -> String {
    let error = match issue.verdict {
        DriftVerdict::CouldNotCheck { error } => error.as_str(),
        _ => "",
    };
    let fence = fence_for(error);
    crate::core::templates::scrubbing(scrubber, || {
        crate::core::templates::get("drift/issue.md.j2")
            .and_then(|t| {
                t.render(context! {
                    kind => kind,
                    project => issue.project,
                    root => issue.root,
                    branch => issue.branch,
                    sha => &issue.sha[..issue.sha.len().min(8)],
                    drift => issue.verdict,
                    resources => resource_views(issue.verdict),
                    first_seen => issue.first_seen,
                    last_seen => issue.last_seen,
                    fingerprint => issue.fingerprint,
                    prefix => issue.fingerprint.map(|f| &f[..f.len().min(12)]),
                    job_name => issue.job_name,
                    run_url => issue.run_url,
                    run_hint => issue.run_hint,
                    fence => fence,
                    kept => kept,
                })
            })
            .unwrap_or_else(|e| format!("planbot: could not render the drift issue: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::redact::Secrets;

    const HAND_RESIZED: &str = r#"{"format_version":"1.2",
      "resource_drift":[{"address":"terraform_data.vm[\"blocky\"]","mode":"managed",
        "type":"terraform_data","name":"vm","change":{"actions":["update"],
        "before":{"id":"a1","input":{"cores":2,"pw":"pw-one-1234"}},
        "after":{"id":"a1","input":{"cores":4,"pw":"pw-one-1234"}},
        "before_sensitive":{"input":{"pw":true}},"after_sensitive":{"input":{"pw":true}}}}],
      "resource_changes":[{"address":"terraform_data.vm[\"blocky\"]","mode":"managed",
        "type":"terraform_data","name":"vm","change":{"actions":["update"],
        "before":{"id":"a1","input":{"cores":4}},"after":{"id":"a1","input":{"cores":2}}}},
        {"address":"terraform_data.dns","mode":"managed","type":"terraform_data","name":"dns",
        "change":{"actions":["no-op"],"before":{"id":"d"},"after":{"id":"d"}}}]}"#;

    const APPLY_PENDING: &str = r#"{"format_version":"1.2","resource_changes":[
        {"address":"terraform_data.dns","mode":"managed","type":"terraform_data","name":"dns",
         "change":{"actions":["create"],"before":null,"after":{"input":"x","triggers_replace":null}}}]}"#;

    fn plan(text: &str) -> Plan {
        Plan::from_json(text.as_bytes()).unwrap()
    }

    fn issue<'a>(verdict: &'a DriftVerdict) -> DriftIssue<'a> {
        DriftIssue {
            project: "infra/homelab",
            root: "core",
            branch: "main",
            sha: "3f9a2c1e0000000000000000000000000000beef",
            verdict,
            first_seen: "2026-12-05T01:00:00Z",
            last_seen: "2026-12-05T02:00:00Z",
            fingerprint: Some("9c41d07be2aa55f0c1d2e3f4a5b6c7d8"),
            job_name: "planbot-apply",
            run_url: Some("https://planbot.example.com:8443/planbot/runs/31"),
            run_hint: None,
        }
    }

    #[test]
    fn a_change_made_outside_the_engine_is_drift_attribute_by_attribute() {
        let verdict = DriftVerdict::of_plan(&plan(HAND_RESIZED), None);
        let DriftVerdict::Drifted { resources } = &verdict else {
            panic!("expected drift, got {verdict:?}");
        };
        assert_eq!(resources.len(), 1, "the no-op and the same address once");
        assert_eq!(resources[0].change, "changed outside");
        assert_eq!(
            resources[0].diff, "~ input.cores = 2 -> 4\n",
            "main -> reality, leaf by leaf; the unchanged password is not shown"
        );
        assert!(!resources[0].diff.contains("pw-one-1234"));
        assert_eq!(resources[0].changed, 1);
        assert_eq!(verdict.exit_code(), 2);
    }

    #[test]
    fn a_sensitive_value_changed_by_hand_shows_only_that_it_changed() {
        let changed = HAND_RESIZED.replacen(
            r#""cores":4,"pw":"pw-one-1234""#,
            r#""cores":4,"pw":"pw-two-5678""#,
            1,
        );
        let verdict = DriftVerdict::of_plan(&plan(&changed), None);
        let DriftVerdict::Drifted { resources } = &verdict else {
            panic!("expected drift, got {verdict:?}");
        };
        assert_eq!(
            resources[0].diff,
            "~ input.cores = 2 -> 4\n~ input.pw = (sensitive value)\n"
        );
        assert!(!resources[0].diff.contains("pw-"), "{}", resources[0].diff);
    }

    #[test]
    fn drift_outside_the_engine_is_drift_even_with_a_merge_waiting_for_its_apply() {
        let verdict = DriftVerdict::of_plan(&plan(HAND_RESIZED), Some(7));
        assert!(
            matches!(verdict, DriftVerdict::Drifted { .. }),
            "{verdict:?}"
        );
    }

    #[test]
    fn planned_changes_with_an_unapplied_merge_wait_for_its_apply() {
        let verdict = DriftVerdict::of_plan(&plan(APPLY_PENDING), Some(7));
        assert_eq!(verdict, DriftVerdict::WaitingForApply { mr: 7 });
        assert_eq!(verdict.exit_code(), 0);
        let verdict = DriftVerdict::of_plan(&plan(APPLY_PENDING), None);
        let DriftVerdict::Drifted { resources } = &verdict else {
            panic!("expected drift, got {verdict:?}");
        };
        assert_eq!(resources[0].change, "create");
        assert_eq!(
            resources[0].diff, "- input = \"x\"\n",
            "main's code creates it, reality lacks it; no null = null line"
        );
    }

    #[test]
    fn an_attribute_known_only_after_the_apply_is_not_null() {
        let update = r#"{"format_version":"1.2","resource_changes":[
            {"address":"terraform_data.vm","mode":"managed","type":"terraform_data","name":"vm",
             "change":{"actions":["update"],"before":{"input":8,"output":2},
             "after":{"input":2},"after_unknown":{"output":true}}}]}"#;
        let verdict = DriftVerdict::of_plan(&plan(update), None);
        let DriftVerdict::Drifted { resources } = &verdict else {
            panic!("expected drift, got {verdict:?}");
        };
        assert_eq!(
            resources[0].diff,
            "~ input = 2 -> 8\n~ output = (known after apply) -> 2\n"
        );
    }

    #[test]
    fn a_plan_of_no_ops_is_clean() {
        let clean = r#"{"format_version":"1.2","resource_changes":[
            {"address":"terraform_data.dns","mode":"managed","type":"terraform_data",
             "name":"dns","change":{"actions":["no-op"],"before":{"id":"d"},"after":{"id":"d"}}}]}"#;
        assert_eq!(
            DriftVerdict::of_plan(&plan(clean), None),
            DriftVerdict::Clean
        );
        assert_eq!(DriftVerdict::Clean.exit_code(), 0);
    }

    #[test]
    fn a_change_deep_in_a_big_value_is_shown_by_its_path() {
        let mut big = serde_json::Map::new();
        for i in 0..40 {
            big.insert(format!("key{i:02}"), format!("value number {i}").into());
        }
        let mut reality = big.clone();
        reality.insert("key39".into(), "changed by hand".into());
        let plan_json = serde_json::json!({"format_version":"1.2","resource_changes":[],"resource_drift":[{
            "address":"terraform_data.vm","mode":"managed","type":"terraform_data","name":"vm",
            "change":{"actions":["update"],"before":{"input":{"disks":[{"size":8},{"size":16}],"meta":big}},
            "after":{"input":{"disks":[{"size":8},{"size":32}],"meta":reality}}}}]});
        let verdict = DriftVerdict::of_plan(&plan(&plan_json.to_string()), None);
        let DriftVerdict::Drifted { resources } = &verdict else {
            panic!("expected drift, got {verdict:?}");
        };
        assert_eq!(
            resources[0].diff,
            "~ input.disks[1].size = 16 -> 32\n~ input.meta.key39 = \"value number 39\" -> \"changed by hand\"\n"
        );
    }

    #[test]
    fn diffs_past_the_issues_budget_are_left_out_and_say_so() {
        let resource = |n: usize| DriftedResource {
            address: format!("terraform_data.r{n}"),
            change: "changed outside".into(),
            diff: format!("~ input = \"{}\" -> 1\n", "x".repeat(ISSUE_DIFF_CHARS / 4)),
            changed: 1,
        };
        let verdict = DriftVerdict::Drifted {
            resources: (0..4).map(resource).collect(),
        };
        let views = resource_views(&verdict);
        let left: Vec<bool> = views.iter().map(|v| v.left_out).collect();
        assert_eq!(left, [false, false, false, true]);
        let body = render_body(&issue(&verdict), &Secrets::new().scrubber());
        assert!(body.len() < ISSUE_DIFF_CHARS + 10_000, "{}", body.len());
        assert!(body.contains("`terraform_data.r3` · changed outside · <em>diff left out"));
    }

    #[test]
    fn the_drift_issue_names_the_root_and_shows_how_to_apply_or_keep() {
        let verdict = DriftVerdict::of_plan(&plan(APPLY_PENDING), None);
        let scrubber = Secrets::new().scrubber();
        let body = render_body(&issue(&verdict), &scrubber);
        assert!(body.ends_with(&format!("{}\n", marker("core"))));
        assert!(body.contains("PLANBOT_CONFIRM=9c41d07be2aa"));
        insta::assert_snapshot!("title", render_title(&issue(&verdict), &scrubber));
        insta::assert_snapshot!("body", body);
    }

    #[test]
    fn could_not_check_shows_the_redacted_error_and_never_says_clean() {
        let verdict = DriftVerdict::CouldNotCheck {
            error: "Error: 401 authentication failure, token pw-two-5678".into(),
        };
        let mut secrets = Secrets::new();
        secrets.add("pw-two-5678");
        let body = render_body(&issue(&verdict), &secrets.scrubber());
        assert!(!body.contains("pw-two-5678"));
        assert!(body.contains("could not check"));
        insta::assert_snapshot!(body);
    }

    #[test]
    fn the_closing_note_says_the_root_matches_main_again() {
        let scrubber = Secrets::new().scrubber();
        insta::assert_snapshot!(render_closing_note(&issue(&DriftVerdict::Clean), &scrubber));
    }

    #[test]
    fn a_duplicate_issue_points_to_the_one_kept() {
        let scrubber = Secrets::new().scrubber();
        let note = render_duplicate_note(&issue(&DriftVerdict::Clean), 7, &scrubber);
        assert!(note.contains("#7"), "{note}");
        assert!(note.ends_with(CLOSING_MARKER), "{note}");
        insta::assert_snapshot!(note);
    }

    #[test]
    fn the_root_is_read_back_from_its_marker() {
        for root in ["core", "a--b", "lab-1"] {
            let body = format!("text\n\n{}\n", marker(root));
            assert_eq!(root_of_marker(&body).as_deref(), Some(root));
        }
        assert_eq!(root_of_marker("an issue someone wrote"), None);
    }

    #[test]
    fn the_marker_cannot_be_closed_early_by_a_root_name() {
        assert_eq!(marker("core"), "<!-- planbot:drift root=core -->");
        assert!(!marker("a-->b").contains("-->b"));
    }
}
