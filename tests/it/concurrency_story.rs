//! No MR waits on another MR's code (docs/workflow.md, "What runs at the same time"): an MR
//! whose code waits (here a provider that runs a program of the root, as `hashicorp/external`
//! does, and that program waits) holds no lock another author's MR plan waits for, and one
//! author's plans hold at most their share of the engine slots. Real engine, the fake GitLab's
//! managed state; the waiting program is held by the test itself: it connects to a listener of
//! the test and reads until the test answers, so "A's code runs" and "A's code may go on" are
//! both the test's own markers, never a guess of time.

use crate::state_story::{vms_tf, world};
use crate::support::fake_gitlab::DEVELOPER;
use crate::support::gate::{gate_mirror, gate_sh, gated_tf, Gate};
use crate::support::service::TestService;
use crate::support::world::{with_workers, World};
use std::path::Path;

/// A world with `planbot_toml` and `files` on main, the gate provider in the operator's mirror,
/// the gate's port open to the engine's sandbox, and bob a Developer beside alice.
fn gated_world(
    engine: &Path,
    planbot_toml: &str,
    files: &[(&str, &str)],
    mirror: &Path,
    port: u16,
) -> World {
    let mirror = format!("\"{}\"", mirror.display());
    world(engine, planbot_toml)
        .files(files)
        .member("bob", DEVELOPER)
        .config(move |c| {
            c.set("engine", "provider_mirror", &mirror)
                .sandbox_reaches(port)
        })
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_whose_code_waits_does_not_hold_up_another_authors_plan_of_the_same_root() {
    let engine = require_engine!();
    let mirror = gate_mirror();
    let mut gate = Gate::start().await;
    let config = "[[roots]]\nname = \"core\"\ndir = \"stacks/core\"\n";
    let main_tf = vms_tf(&["blocky"]);
    let files = [("stacks/core/main.tf", main_tf.as_str())];
    let w = gated_world(&engine, config, &files, mirror.path(), gate.port);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    // Alice's MR runs a program of hers that waits (until the test lets it go).
    let a = w
        .open_mr(
            &s,
            "alice-waits",
            &[
                ("stacks/core/main.tf", &gated_tf(&vms_tf(&["blocky"]))),
                ("stacks/core/gate.sh", &gate_sh(gate.port, "core")),
            ],
        )
        .await;
    assert_eq!(gate.next_arrival(120).await, "core");

    // Bob's MR changes the same root: it is planned, and its note posted, while Alice's
    // program still waits.
    let b = w
        .open_mr_by(
            &s,
            &w.user("bob"),
            "bob-adds-a-vm",
            &[("stacks/core/main.tf", &vms_tf(&["blocky", "gitlab"]))],
        )
        .await;
    let b_head = w.gitlab.mr_sha(&w.project, b);
    let started = std::time::Instant::now();
    let (gitlab, project) = (&w.gitlab, &w.project);
    s.after_job_ends("Bob's plan while Alice's program waits", 45, || async {
        gitlab
            .status(project, &b_head, "planbot/plan")
            .is_some_and(|st| !matches!(st.state.as_str(), "pending" | "running"))
    })
    .await;
    let b_took = started.elapsed();
    let b_note = w.note(b);
    assert!(
        w.status_says(&b_head, "planbot/plan")
            .starts_with("success"),
        "{b_note}"
    );
    assert!(b_note.contains("gitlab"), "{b_note}");
    // Bob's plan waited for nothing: the note says no wait.
    assert!(!b_note.contains("waited"), "{b_note}");
    let a_head = w.gitlab.mr_sha(&w.project, a);
    assert!(
        w.status_says(&a_head, "planbot/plan")
            .starts_with("running"),
        "Alice's plan still runs (her program waits)"
    );
    eprintln!("Bob's plan took {b_took:?} while Alice's program waited");

    // Alice's program goes on: it is no provider, so her plan fails, saying why.
    gate.open();
    let (a_note, a_status) = w.plan_of(&s, a).await;
    assert!(a_status.starts_with("failed"), "{a_status}\n{a_note}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_authors_waiting_plans_hold_their_share_of_engine_slots_and_the_note_says_what_waited()
{
    let engine = require_engine!();
    let mirror = gate_mirror();
    let mut gate = Gate::start().await;
    let config = "[[roots]]\nname = \"a\"\ndir = \"a\"\n\n[[roots]]\nname = \"b\"\ndir = \"b\"\n\n[[roots]]\nname = \"c\"\ndir = \"c\"\n";
    let (a_tf, b_tf, c_tf) = (vms_tf(&["a1"]), vms_tf(&["b1"]), vms_tf(&["c1"]));
    let files = [
        ("a/main.tf", a_tf.as_str()),
        ("b/main.tf", &b_tf),
        ("c/main.tf", &c_tf),
    ];
    let w = gated_world(&engine, config, &files, mirror.path(), gate.port);
    // Two engine slots; one author's plans hold at most one of them.
    assert_eq!(
        (
            w.config.plan.max_concurrent_plans,
            w.config.plan.workers_per_author
        ),
        (2, 1)
    );
    let s = TestService::start(w.config.clone(), with_workers()).await;

    // Alice's MR changes two independent roots whose programs both wait: one of them runs.
    let alice = w
        .open_mr(
            &s,
            "alice-waits-twice",
            &[
                ("a/main.tf", &gated_tf(&vms_tf(&["a1"]))),
                ("a/gate.sh", &gate_sh(gate.port, "a")),
                ("b/main.tf", &gated_tf(&vms_tf(&["b1"]))),
                ("b/gate.sh", &gate_sh(gate.port, "b")),
            ],
        )
        .await;
    let first = gate.next_arrival(120).await;
    let first_arrived = tokio::time::Instant::now();

    // Bob's MR of a third root gets the other slot and its note meanwhile.
    let bob = w
        .open_mr_by(
            &s,
            &w.user("bob"),
            "bob-adds-a-vm",
            &[("c/main.tf", &vms_tf(&["c1", "c2"]))],
        )
        .await;
    let bob_head = w.gitlab.mr_sha(&w.project, bob);
    let (gitlab, project) = (&w.gitlab, &w.project);
    s.after_job_ends("Bob's plan while Alice's program waits", 45, || async {
        gitlab
            .status(project, &bob_head, "planbot/plan")
            .is_some_and(|st| !matches!(st.state.as_str(), "pending" | "running"))
    })
    .await;
    let bob_note = w.note(bob);
    assert!(
        w.status_says(&bob_head, "planbot/plan")
            .starts_with("success"),
        "{bob_note}"
    );
    // Alice's other root never ran: it waits for her share, not for Bob's slot.
    assert_eq!(
        gate.arrived_already(),
        None,
        "{first} ran, and another of Alice's roots"
    );

    // Her program goes on: her other root gets her share, and the note says what it waited for.
    // Its wait must be one the note says (a second or more): Bob's plan took longer than that
    // on every machine seen, so this never waits there; it sets the wait's length, it does not
    // synchronise anything.
    tokio::time::sleep_until(first_arrived + std::time::Duration::from_millis(1500)).await;
    gate.open();
    let (note, _) = w.plan_of(&s, alice).await;
    let other = if first == "a" { "b" } else { "a" };
    let said = format!("`{other}` waited ");
    let line = note
        .lines()
        .find(|l| l.contains(&said))
        .unwrap_or_else(|| panic!("the note says {other}'s wait:\n{note}"));
    assert!(
        line.contains("for this author's other plans (their share: 1 engine slot)"),
        "{line}"
    );
    assert!(!line.contains(&format!("`{first}` waited")), "{line}");
    eprintln!("Alice's note says: {line}");
}
