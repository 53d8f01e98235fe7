//! Plans reused across pushes (issue 45, docs/workflow.md "Plans reused across pushes"):
//! three roots `a`, `b`, `c` on GitLab-managed state, `a` and `c` calling the local module
//! `modules/shared`. A push that changes only `b` plans `b` alone and the note still shows all
//! three, `a` and `c` marked with the head they were planned at; a push to the shared module
//! plans `a` and `c` again; a state written since (an apply elsewhere) and `planbot plan` plan
//! a root again.

use crate::support::service::TestService;
use crate::support::world::{with_workers, World};

const ROOTS: &str = r#"
[[roots]]
name = "a"
dir = "stacks/a"

[[roots]]
name = "b"
dir = "stacks/b"

[[roots]]
name = "c"
dir = "stacks/c"
"#;

/// A root's `main.tf`: a `terraform_data` with `input`, and the shared module when `shared`.
fn root_tf(input: &str, shared: bool) -> String {
    let module = if shared {
        "module \"shared\" {\n  source = \"../../modules/shared\"\n}\n"
    } else {
        ""
    };
    format!("resource \"terraform_data\" \"vm\" {{\n  input = \"{input}\"\n}}\n{module}")
}

fn shared_tf(input: &str) -> String {
    format!("resource \"terraform_data\" \"dns\" {{\n  input = \"{input}\"\n}}\n")
}

fn world(engine: &std::path::Path) -> World {
    World::builder()
        .engine(engine)
        .managed_state()
        .planbot_toml(ROOTS)
        .files(&[
            ("stacks/a/versions.tf", "terraform {}\n"),
            ("stacks/b/versions.tf", "terraform {}\n"),
            ("stacks/c/versions.tf", "terraform {}\n"),
            ("modules/shared/main.tf", &shared_tf("v1")),
        ])
        .build()
}

/// How many times the engine read state `name` through GitLab so far (each plan of the root
/// reads it; a reused plan does not).
fn state_reads(w: &World, name: &str) -> usize {
    w.gitlab
        .state_requests()
        .iter()
        .filter(|r| r.method == "GET" && r.target == "state" && r.name == name)
        .count()
}

/// The "Reused" line of `root`'s section, if any.
fn reused_at(note: &str, root: &str) -> Option<String> {
    let section = note.split(&format!("#### Root `{root}`")).nth(1)?;
    let section = section.split("#### Root ").next().unwrap_or(section);
    let line = section
        .lines()
        .find(|l| l.starts_with("♻️ _Reused: planned at `"))?;
    Some(line["♻️ _Reused: planned at `".len()..][..8].to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_plans_only_the_roots_it_reaches_and_the_note_still_shows_every_root() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let (a, b, c) = (
        root_tf("a1", true),
        root_tf("b1", false),
        root_tf("c1", true),
    );
    let iid = w
        .open_mr(
            &s,
            "three",
            &[
                ("stacks/a/main.tf", &a),
                ("stacks/b/main.tf", &b),
                ("stacks/c/main.tf", &c),
            ],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}");
    assert_eq!(reused_at(&note, "a"), None, "{note}");
    let first = w.gitlab.mr_sha(&w.project, iid);
    let reads = |w: &World| ["a", "b", "c"].map(|r| state_reads(w, r));
    let before = reads(&w);

    // A push to `b` alone: `b` planned again, `a` and `c` shown as planned at the first head.
    w.push(
        &s,
        iid,
        "three",
        &[("stacks/b/main.tf", &root_tf("b2", false))],
    )
    .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}");
    assert_eq!(
        reused_at(&note, "a").as_deref(),
        Some(&first[..8]),
        "{note}"
    );
    assert_eq!(
        reused_at(&note, "c").as_deref(),
        Some(&first[..8]),
        "{note}"
    );
    assert_eq!(reused_at(&note, "b"), None, "{note}");
    assert!(note.contains("\"b2\""), "b's new plan is shown: {note}");
    for root in ["a", "c"] {
        assert!(
            note.contains(&format!("| <code>{root}</code> | 2 |")),
            "{note}"
        );
    }
    let after = reads(&w);
    assert_eq!(
        (after[0], after[2]),
        (before[0], before[2]),
        "a and c not planned"
    );
    assert!(after[1] > before[1], "b planned");
    // The apply's plan is still compared with the plan shown: the fingerprint shown is stored
    // for this head too.
    let second = w.gitlab.mr_sha(&w.project, iid);
    let runs = w
        .app()
        .store
        .runs_for_mr(
            planbot::core::ids::ProjectId(w.project.id),
            planbot::core::ids::MrIid(iid),
        )
        .await
        .unwrap();
    assert_eq!(
        runs.iter().filter(|r| r.sha.as_str() == second).count(),
        3,
        "{runs:?}"
    );

    // A push to the shared module: `a` and `c`, which call it, are planned again; `b` is not.
    w.push(
        &s,
        iid,
        "three",
        &[("modules/shared/main.tf", &shared_tf("v2"))],
    )
    .await;
    let (note, _) = w.plan_of(&s, iid).await;
    let second = &second[..8];
    assert_eq!(reused_at(&note, "a"), None, "{note}");
    assert_eq!(reused_at(&note, "c"), None, "{note}");
    assert_eq!(reused_at(&note, "b").as_deref(), Some(second), "{note}");

    // `a`'s state written since (an apply elsewhere): `a` is planned again though its files
    // did not change; `c` is reused.
    let third = w.gitlab.mr_sha(&w.project, iid);
    w.gitlab.put_terraform_state(
        &w.project,
        "a",
        &serde_json::json!({"version": 4, "terraform_version": "1.11.4", "serial": 1,
            "lineage": "5b1e7c0a-0000-4000-8000-000000000001", "outputs": {}, "resources": []}),
    );
    w.push(
        &s,
        iid,
        "three",
        &[("stacks/b/main.tf", &root_tf("b3", false))],
    )
    .await;
    let (note, _) = w.plan_of(&s, iid).await;
    assert_eq!(reused_at(&note, "a"), None, "{note}");
    assert_eq!(
        reused_at(&note, "c").as_deref(),
        Some(&third[..8]),
        "{note}"
    );

    // `planbot plan` plans every root again.
    let alice = w.alice();
    w.say(&s, iid, &alice, "planbot plan").await;
    s.after_job_ends("the plan `planbot plan` asked for", 120, || async {
        let note = w.note(iid);
        ["a", "b", "c"]
            .iter()
            .all(|r| reused_at(&note, r).is_none())
    })
    .await;
}
