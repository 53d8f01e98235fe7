//! Several roots in one MR (docs/workflow.md, "Several roots"): independent roots plan at the
//! same time, a root waits for the roots it `depends_on`, and a root planned below a root that
//! changes in the same MR says so in the note. Real engine, the fake GitLab's managed state (the
//! documented recipe: every root's state is named after it), held requests as the sync marker.

use crate::state_story::{vms_tf, with_workers, world, World};
use crate::support::service::TestService;

/// A root whose plan creates a resource and two outputs: `name` (known now) and `id` (known
/// only after its apply).
fn with_outputs(name: &str) -> String {
    format!(
        "{}\noutput \"name\" {{\n  value = \"{name}\"\n}}\n\noutput \"id\" {{\n  value = terraform_data.vm[\"{name}\"].id\n}}\n",
        vms_tf(&[name])
    )
}

/// The state path of root `name` in the fake GitLab's project.
fn state_path(w: &World, name: &str) -> String {
    format!("/api/v4/projects/{}/terraform/state/{name}", w.project.id)
}

/// The roots' names in the order the state API saw their requests.
fn state_order(w: &World) -> Vec<String> {
    w.gitlab
        .state_requests()
        .into_iter()
        .map(|r| r.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_roots_plan_at_the_same_time_and_a_dependent_waits_for_its_upstream() {
    let engine = require_engine!();
    let config = "[[roots]]\nname = \"a\"\ndir = \"a\"\n\n[[roots]]\nname = \"b\"\ndir = \"b\"\n\n[[roots]]\nname = \"c\"\ndir = \"c\"\ndepends_on = [\"a\"]\n";
    let w = world(&engine, config)
        .files(&[
            ("a/main.tf", &vms_tf(&["a1"])),
            ("b/main.tf", &vms_tf(&["b1"])),
            ("c/main.tf", &vms_tf(&["c1"])),
        ])
        // Three engine slots: one author's plans hold two of them (their share).
        .config(|c| c.plan_slots(3))
        .build();
    assert_eq!(
        (
            w.config.plan.max_concurrent_plans,
            w.config.plan.workers_per_author
        ),
        (3, 2),
        "two engine slots for this author"
    );
    let s = TestService::start(w.config.clone(), with_workers()).await;
    // Each engine's `plan` reads its root's state (after `init` read it once, and inits take
    // turns on the plugin cache): that read waits at GitLab until released. While `a`'s is
    // held, `b`'s arriving too means both engines run at once; one root at a time, `b`'s would
    // never come while `a`'s is held.
    let hold_a = w.gitlab.hold_after("GET", &state_path(&w, "a"), 1);
    let hold_b = w.gitlab.hold_after("GET", &state_path(&w, "b"), 1);
    let iid = w
        .open_mr(
            &s,
            "three",
            &[
                ("a/main.tf", &vms_tf(&["a1", "a2"])),
                ("b/main.tf", &vms_tf(&["b1", "b2"])),
                ("c/main.tf", &vms_tf(&["c1", "c2"])),
            ],
        )
        .await;
    assert!(
        hold_a.arrived(120).await,
        "a's plan reads its state: {:?}",
        state_order(&w)
    );
    assert!(
        hold_b.arrived(120).await,
        "b's plan reads its state while a's is still running"
    );
    // `c` depends on `a`, which has not finished: `c` has not started.
    assert!(
        !state_order(&w).iter().any(|n| n == "c"),
        "{:?}",
        state_order(&w)
    );
    hold_a.release();
    hold_b.release();
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}\n{note}");
    // Every request of `c`'s plan came after the last of `a`'s: it started once `a` ended.
    let order = state_order(&w);
    let last_a = order
        .iter()
        .rposition(|n| n == "a")
        .expect("a read its state");
    let first_c = order
        .iter()
        .position(|n| n == "c")
        .expect("c read its state");
    assert!(last_a < first_c, "{order:?}");
    // `a` changes only resources (no outputs): `c` is marked, with no output to name.
    assert!(
        note.contains("⏳ Planned against `a` before its apply: re-planned by the apply job. `a`'s plan changes no output."),
        "{note}"
    );
    assert!(!note.contains("Planned against `b`"), "{note}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_changing_network_and_vms_marks_vms_as_planned_before_networks_apply() {
    let engine = require_engine!();
    let config = "[[roots]]\nname = \"network\"\ndir = \"network\"\n\n[[roots]]\nname = \"vms\"\ndir = \"vms\"\ndepends_on = [\"network\"]\n\n[[roots]]\nname = \"dns\"\ndir = \"dns\"\ndepends_on = [\"vms\"]\n";
    let w = world(&engine, config)
        .files(&[
            ("network/main.tf", &vms_tf(&["lan"])),
            ("vms/main.tf", &vms_tf(&["web"])),
            ("dns/main.tf", &vms_tf(&["web.lan"])),
        ])
        .build();
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "network-and-vms",
            &[
                ("network/main.tf", &with_outputs("lan")),
                ("vms/main.tf", &vms_tf(&["web", "db"])),
            ],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}\n{note}");
    let vms = note
        .split("#### Root `vms`")
        .nth(1)
        .and_then(|s| s.split("#### Root").next())
        .unwrap_or_else(|| panic!("a section for vms:\n{note}"));
    assert!(
        vms.contains("⏳ Planned against `network` before its apply: re-planned by the apply job. `network`'s plan changes the outputs `id` (new, known after its apply), `name` (new)."),
        "{vms}"
    );
    // network is marked by nothing; dns is not planned (nothing of it changed).
    assert_eq!(note.matches("⏳ Planned against").count(), 1, "{note}");
    let order = state_order(&w);
    let last_network = order.iter().rposition(|n| n == "network").unwrap();
    let first_vms = order.iter().position(|n| n == "vms").unwrap();
    assert!(last_network < first_vms, "{order:?}");
}

/// A new user's mistake (issue 43): a root's `dir` misspelled (`stacks/nework` beside
/// `stacks/network`). An MR changing `stacks/network/main.tf` reaches no root; it used to get a
/// green "no root affected" and nothing said. The note names the file no root takes, its
/// headline is yellow, and the status counts it; a file of a root that is planned is not named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_in_no_root_is_named_in_the_note_and_counted_in_the_status() {
    let engine = require_engine!();
    let config = "[[roots]]\nname = \"network\"\ndir = \"stacks/nework\"\n\n[[roots]]\nname = \"vms\"\ndir = \"stacks/vms\"\n";
    let w = world(&engine, config)
        .files(&[
            ("stacks/network/main.tf", &vms_tf(&["lan"])),
            ("stacks/vms/main.tf", &vms_tf(&["web"])),
        ])
        .build();
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "network",
            &[("stacks/network/main.tf", &vms_tf(&["lan", "dmz"]))],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert_eq!(
        status,
        "success: planbot: no root affected by this change; 1 changed file in no root, not planned",
        "{note}"
    );
    assert!(note.contains("### 🟡 planbot"), "{note}");
    assert!(
        note.contains("⚠️ **Changed in no root, not planned:** `stacks/network/main.tf`. No root's `dir`, local module or `when_modified` in `.planbot.toml` takes it: check the `dir` of the root meant (`planbot check-repo-config`)."),
        "{note}"
    );

    // A push that also changes `vms`: vms is planned, the stray file still named and counted.
    w.push(
        &s,
        iid,
        "network",
        &[("stacks/vms/main.tf", &vms_tf(&["web", "db"]))],
    )
    .await;
    let head = w.gitlab.mr_sha(&w.project, iid);
    w.final_statuses(&s, &head, &["planbot/plan"]).await;
    let status = w.status_says(&head, "planbot/plan");
    let note = w.note(iid);
    assert!(
        status.starts_with("success: vms: ")
            && status.ends_with("; 1 changed file in no root, not planned"),
        "{status}"
    );
    assert!(note.contains("`stacks/network/main.tf`"), "{note}");
    assert!(!note.contains("`stacks/vms/main.tf`. No root"), "{note}");
}
