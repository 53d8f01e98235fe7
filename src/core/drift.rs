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
use serde_json::Value;

/// The longest before/after value shown for one attribute; a longer one is cut with `…`.
const VALUE_CHARS: usize = 80;

/// One attribute of a drifted resource: its name, what `main` says (the state its last apply
/// left, or its code) and what reality is, as compact JSON (or `(sensitive)` when the plan marks
/// either side sensitive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DriftedAttribute {
    pub name: String,
    pub main: String,
    pub reality: String,
}

/// One resource the check found different from `main`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DriftedResource {
    pub address: String,
    /// `changed outside` for a `resource_drift` entry, else the planned actions (`update`,
    /// `delete, create`).
    pub change: String,
    pub attributes: Vec<DriftedAttribute>,
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
    let values = rc.change.values();
    let empty = serde_json::Map::new();
    let before = values.before.as_object().unwrap_or(&empty);
    let after = values.after.as_object().unwrap_or(&empty);
    let mut names: Vec<&String> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    let attributes = names
        .into_iter()
        // A missing attribute and a `null` one are the same: not a difference to show.
        .filter(|name| {
            before.get(*name).unwrap_or(&Value::Null) != after.get(*name).unwrap_or(&Value::Null)
                || marked(&values.after_unknown, name)
        })
        .map(|name| {
            let sensitive =
                marked(&values.before_sensitive, name) || marked(&values.after_sensitive, name);
            let shown = |v: Option<&Value>| {
                if sensitive {
                    "(sensitive)".to_string()
                } else {
                    short(v.unwrap_or(&Value::Null))
                }
            };
            // An attribute the engine knows only after the apply is not `null`.
            let after_shown = if marked(&values.after_unknown, name) {
                "(known after apply)".to_string()
            } else {
                shown(after.get(name))
            };
            let before_shown = shown(before.get(name));
            let (main, reality) = match main_side {
                Side::Before => (before_shown, after_shown),
                Side::After => (after_shown, before_shown),
            };
            DriftedAttribute {
                name: name.clone(),
                main,
                reality,
            }
        })
        .collect();
    DriftedResource {
        address: rc.address.clone(),
        change,
        attributes,
    }
}

/// Whether a sensitivity mask marks anything under attribute `name`.
fn marked(mask: &Value, name: &str) -> bool {
    fn any_true(v: &Value) -> bool {
        match v {
            Value::Bool(b) => *b,
            Value::Array(items) => items.iter().any(any_true),
            Value::Object(map) => map.values().any(any_true),
            _ => false,
        }
    }
    match mask {
        Value::Bool(b) => *b,
        Value::Object(map) => map.get(name).is_some_and(any_true),
        _ => false,
    }
}

fn short(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(VALUE_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
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
                    first_seen => issue.first_seen,
                    last_seen => issue.last_seen,
                    fingerprint => issue.fingerprint,
                    prefix => issue.fingerprint.map(|f| &f[..f.len().min(12)]),
                    job_name => issue.job_name,
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
            resources[0].attributes,
            vec![DriftedAttribute {
                name: "input".into(),
                main: "(sensitive)".into(),
                reality: "(sensitive)".into(),
            }]
        );
        assert_eq!(verdict.exit_code(), 2);
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
            resources[0].attributes[0].main, r#""x""#,
            "main's code creates it"
        );
        assert_eq!(
            resources[0].attributes[0].reality, "null",
            "reality lacks it"
        );
        assert_eq!(resources[0].attributes.len(), 1, "no null = null row");
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
        let output = &resources[0].attributes[1];
        assert_eq!(output.name, "output");
        assert_eq!(output.main, "(known after apply)");
        assert_eq!(output.reality, "2");
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
    fn a_long_value_is_cut() {
        let long = Value::String("x".repeat(200));
        let shown = short(&long);
        assert_eq!(shown.chars().count(), VALUE_CHARS + 1);
        assert!(shown.ends_with('…'));
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
