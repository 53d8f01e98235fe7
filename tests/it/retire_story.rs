//! Retiring a root (issue 44, docs/workflow.md "Retiring a root"): two roots `infra` and `old`
//! on GitLab-managed state. An MR that removes `old` (its directory and its `[[roots]]` entry,
//! or the entry alone) gets the plan of `old`'s destroy from `main`'s code in its note; after
//! the merge the apply job destroys it as reviewed, deletes its state, and leaves `infra` as it
//! is. A rename keeps everything (the note says how the state follows); a destroy that fails
//! part-way keeps the state and says what is left.

use crate::support::service::TestService;
use crate::support::world::{log_shows, verdict, with_workers, World};

const TWO_ROOTS: &str = r#"
[[roots]]
name = "infra"
dir = "stacks/infra"

[[roots]]
name = "old"
dir = "stacks/old"
"#;

/// A commit's changes: each path with its new text, `None` to delete it.
type Changes<'a> = &'a [(&'a str, Option<&'a str>)];

const INFRA_ONLY: &str = r#"
[[roots]]
name = "infra"
dir = "stacks/infra"
"#;

/// `terraform_data` resources named `names` (no provider to download).
fn resources(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("resource \"terraform_data\" \"{n}\" {{\n  input = \"{n}\"\n}}\n\n"))
        .collect()
}

/// A resource whose destroy fails (a destroy-time provisioner that exits 3).
const STUCK_DB: &str = r#"
resource "terraform_data" "db" {
  input = "db"
  provisioner "local-exec" {
    when    = destroy
    command = "echo the disk is busy >&2; exit 3"
  }
}
"#;

/// Both roots on `main`, GitLab-managed state, nothing managed yet.
fn world(engine: &std::path::Path) -> World {
    World::builder()
        .engine(engine)
        .managed_state()
        .planbot_toml(TWO_ROOTS)
        .files(&[
            ("stacks/infra/versions.tf", "terraform {}\n"),
            ("stacks/old/versions.tf", "terraform {}\n"),
        ])
        .build()
}

/// Alice commits `changes` (`None` deletes a file) on `branch`, opens an MR, GitLab delivers
/// the webhook; the MR's iid.
async fn mr_with(
    w: &World,
    s: &TestService,
    branch: &str,
    changes: &[(&str, Option<&str>)],
) -> u64 {
    w.gitlab
        .commit_changes(&w.project, branch, changes, "change the roots");
    let iid = w.gitlab.open_mr_by(&w.project, branch, "main", &w.alice());
    let body = w.gitlab.mr_webhook(&w.project, iid).action("open").body();
    s.deliver_mr_opened(&body, iid).await;
    iid
}

/// `infra` manages `gateway`, `old` manages `old_main` (reviewed, merged, applied by job 50).
async fn both_applied(w: &World, s: &TestService, old_main: &str) {
    let infra = resources(&["gateway"]);
    let changes = [
        ("stacks/infra/main.tf", Some(infra.as_str())),
        ("stacks/old/main.tf", Some(old_main)),
    ];
    let iid = mr_with(w, s, "start", &changes).await;
    let (note, status) = w.plan_of(s, iid).await;
    assert!(status.starts_with("success"), "{status}\n{note}");
    let log = w.merge_and_apply(s, iid, 50).await;
    assert_eq!(verdict(&log), "planbot: apply succeeded", "{log}");
    assert!(w.state("old").is_some_and(|s| s.contains("\"db\"")));
}

/// The MR's retired-root line for `old`, as the note says it.
fn retired_line(note: &str) -> &str {
    note.lines()
        .find(|l| l.contains("**Root `old` is removed by this MR**"))
        .unwrap_or_else(|| panic!("no retired line in the note:\n{note}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_root_is_a_reviewed_destroy_and_its_state_is_deleted_after_the_merge() {
    let engine = require_engine!();
    let old_main = resources(&["web", "db"]);
    // The directory and the entry removed; the entry alone (the directory stays, unplanned).
    let cases: [(Changes, &str); 2] = [
        (
            &[(".planbot.toml", Some(INFRA_ONLY)), ("stacks/old/main.tf", None), ("stacks/old/versions.tf", None)],
            "its directory `stacks/old` and its `[[roots]]` entry are removed",
        ),
        (
            &[(".planbot.toml", Some(INFRA_ONLY))],
            "its `[[roots]]` entry is removed; its directory `stacks/old` stays, planned by no root",
        ),
    ];
    for (changes, because) in cases {
        let w = world(&engine);
        let s = TestService::start(w.config.clone(), with_workers()).await;
        both_applied(&w, &s, &old_main).await;
        let main_before = w.head("main");
        let iid = mr_with(&w, &s, "retire-old", changes).await;
        let (note, status) = w.plan_of(&s, iid).await;

        // The note: what is removed, from which code, and every resource it destroys.
        let line = retired_line(&note);
        assert_eq!(
            line,
            format!(
                "🗑️ **Root `old` is removed by this MR** ({because}): its destroy, planned from \
                 `main`'s code at `{}`, **destroys 2 resources** (listed in its section). After \
                 the merge the apply job destroys them as reviewed, then deletes its \
                 GitLab-managed state `old`.",
                &main_before[..8]
            )
        );
        assert!(
            note.contains("terraform_data.web") && note.contains("terraform_data.db"),
            "{note}"
        );
        assert!(!note.contains("does not exist"), "{note}");
        assert!(status.starts_with("success"), "{status}");
        assert!(status.contains("old (removed): 2 to destroy"), "{status}");

        // The apply: `old` destroyed as reviewed, its state deleted; `infra` untouched.
        let log = w.merge_and_apply(&s, iid, 51).await;
        assert_eq!(verdict(&log), "planbot: apply succeeded", "{log}");
        log_shows(
            &log,
            &[
                &format!("planbot: root `old` is removed by the merge: planning its destroy from the code before the merge (`{}`), as its merge request did", &main_before[..8]),
                "planbot: root `old`: 2 to destroy · fingerprint",
                &format!("planbot: root `old`: the plan is the one reviewed on !{iid}"),
                "planbot: root `old`: removed by the merge: its GitLab-managed state `old` holds no resource and is deleted",
                "planbot: root `infra`: no changes, nothing to apply",
            ],
        );
        assert_eq!(w.state("old"), None, "the state is deleted");
        assert!(w.state("infra").unwrap().contains("\"gateway\""));
        assert!(
            w.state_calls()
                .contains(&"DELETE state state-writer 200".to_string()),
            "{:?}",
            w.state_calls()
        );
        let landed = w.head("main");
        assert!(w
            .status_says(&landed, "planbot/apply")
            .starts_with("success"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_directory_removed_with_its_entry_kept_plans_the_destroy_and_fails_the_config() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;
    both_applied(&w, &s, &resources(&["web", "db"])).await;
    let changes = [
        ("stacks/old/main.tf", None),
        ("stacks/old/versions.tf", None),
    ];
    let iid = mr_with(&w, &s, "drop-old-dir", &changes).await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(
        retired_line(&note).contains(
            "(its directory `stacks/old` is removed, but `.planbot.toml` still lists it: remove its `[[roots]]` entry too)"
        ),
        "{note}"
    );
    assert!(
        retired_line(&note).contains("**destroys 2 resources**"),
        "{note}"
    );
    // Merged as is, `main`'s config would name a directory it does not have.
    assert!(
        status.starts_with("failed: .planbot.toml in this MR is invalid"),
        "{status}"
    );
    assert!(status.contains("stacks/old"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_root_destroys_nothing_and_the_note_says_how_its_state_follows() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;
    both_applied(&w, &s, &resources(&["web", "db"])).await;
    let renamed = TWO_ROOTS.replace("name = \"old\"", "name = \"legacy\"");
    let iid = mr_with(&w, &s, "rename-old", &[(".planbot.toml", Some(&renamed))]).await;
    let (note, _) = w.plan_of(&s, iid).await;
    assert!(!note.contains("removed by this MR"), "{note}");
    assert!(
        note.contains(
            "⚠️ **Root `old` is renamed `legacy`** (same directory `stacks/old`): nothing is \
             destroyed, but its GitLab-managed state is named after the root: as written, \
             `legacy` would read the empty state `legacy` and plan every resource anew (the \
             apply job refuses a plan not reviewed). To keep its state, add \
             `state = { gitlab = \"old\" }` to `legacy`'s `[[roots]]` entry in this MR."
        ),
        "{note}"
    );
    // As the note says: the entry names the old state.
    let kept = renamed.replace(
        "name = \"legacy\"\ndir = \"stacks/old\"\n",
        "name = \"legacy\"\ndir = \"stacks/old\"\nstate = { gitlab = \"old\" }\n",
    );
    w.push(&s, iid, "rename-old", &[(".planbot.toml", &kept)])
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(
        note.contains(
            "♻️ **Root `old` is renamed `legacy`** (same directory `stacks/old`): nothing is \
             destroyed, and its state stays where it is (GitLab-managed state `old`)."
        ),
        "{note}"
    );
    assert!(status.starts_with("success"), "{status}");
    let log = w.merge_and_apply(&s, iid, 51).await;
    assert_eq!(verdict(&log), "planbot: apply succeeded", "{log}");
    log_shows(
        &log,
        &["planbot: root `legacy`: no changes, nothing to apply"],
    );
    assert!(w
        .state("old")
        .is_some_and(|s| s.contains("\"web\"") && s.contains("\"db\"")));
    assert!(!w
        .state_calls()
        .iter()
        .any(|c| c.starts_with("DELETE state")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroy_that_fails_part_way_keeps_the_state_and_says_what_is_left() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let old_main = format!("{}{STUCK_DB}", resources(&["web"]));
    both_applied(&w, &s, &old_main).await;
    let changes = [
        (".planbot.toml", Some(INFRA_ONLY)),
        ("stacks/old/main.tf", None),
        ("stacks/old/versions.tf", None),
    ];
    let iid = mr_with(&w, &s, "retire-old", &changes).await;
    let (note, _) = w.plan_of(&s, iid).await;
    assert!(
        retired_line(&note).contains("**destroys 2 resources**"),
        "{note}"
    );
    let log = w.merge_and_apply(&s, iid, 51).await;
    let left = "removed by the merge: the destroy failed part-way: its GitLab-managed \
                state `old` is kept, with 1 resource left (`terraform_data.db`); fix the error, \
                then run the apply job of a new pipeline on the default branch";
    assert!(
        verdict(&log).starts_with("planbot: apply failed: "),
        "{log}"
    );
    log_shows(
        &log,
        &["the disk is busy", &format!("planbot: root `old`: {left}")],
    );
    let state = w.state("old").expect("the state is kept");
    assert!(
        state.contains("\"db\"") && !state.contains("\"web\""),
        "{state}"
    );
    assert!(!w
        .state_calls()
        .iter()
        .any(|c| c.starts_with("DELETE state")));
    let landed = w.head("main");
    assert!(w
        .status_says(&landed, "planbot/apply")
        .starts_with("failed"));
    let result = w
        .notes_containing(iid, "planbot · ")
        .into_iter()
        .find(|n| n.contains(left))
        .unwrap_or_else(|| {
            panic!(
                "no note says what is left: {:?}",
                w.gitlab.notes(&w.project, iid)
            )
        });
    assert!(result.contains("`old`"), "{result}");
}
