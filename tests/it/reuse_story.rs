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

/// `root`'s section of the note.
fn section<'a>(note: &'a str, root: &str) -> Option<&'a str> {
    let section = note.split(&format!("#### Root `{root}`")).nth(1)?;
    Some(section.split("#### Root ").next().unwrap_or(section))
}

/// The "Reused" line of `root`'s section, if any.
fn reused_at(note: &str, root: &str) -> Option<String> {
    let section = section(note, root)?;
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

/// A secret of root `a`'s plan, shown by root `b`'s code in a plain attribute (`b` does not
/// know it is one): the note scrubs it because `a`'s plan knows it.
const A_PASSWORD: &str = "kept-plan-canary-5e1f9a";
const A_TOKEN: &str = "kept-plan-token-77c3d0";

fn secret_root_tf() -> String {
    format!(
        "variable \"password\" {{\n  type      = string\n  sensitive = true\n  default   = \"{A_PASSWORD}\"\n}}\n\
         resource \"terraform_data\" \"vm\" {{\n  input = {{\n    password = var.password\n    token    = sensitive(\"{A_TOKEN}\")\n  }}\n}}\n\
         output \"password\" {{\n  value     = var.password\n  sensitive = true\n}}\n"
    )
}

fn showing_root_tf(label: &str) -> String {
    format!(
        "resource \"terraform_data\" \"shows\" {{\n  input = \"{label}: {A_PASSWORD} and {A_TOKEN}\"\n}}\n"
    )
}

/// Every byte of the store's database files (the SQLite file and its write-ahead log).
fn store_bytes(w: &World) -> String {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(w.data_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("planbot.db") {
            all.extend(std::fs::read(&path).unwrap());
        }
    }
    assert!(!all.is_empty(), "the store's files are in the data dir");
    String::from_utf8_lossy(&all).into_owned()
}

fn assert_no_secret(what: &str, text: &str) {
    use base64::Engine as _;
    for secret in [A_PASSWORD, A_TOKEN] {
        let b64 = base64::engine::general_purpose::STANDARD.encode(secret);
        let at = text.find(secret).or_else(|| text.find(&b64));
        assert!(
            at.is_none(),
            "{what} holds {secret}: …{}…",
            at.map(|i| text[i.saturating_sub(300)..]
                .chars()
                .take(400)
                .collect::<String>())
                .unwrap_or_default()
        );
    }
}

/// The kept plans live in the store without a secret: a restarted planbot reuses `a`'s plan,
/// and the note still scrubs `a`'s secrets where `b` shows them (the kept plan knows them by
/// their digests only); no byte of the database holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_plan_holds_no_secret_survives_a_restart_and_still_scrubs_its_secrets_elsewhere() {
    let engine = require_engine!();
    let w = World::builder()
        .engine(&engine)
        .managed_state()
        .planbot_toml(
            "[[roots]]\nname = \"a\"\ndir = \"stacks/a\"\n\n[[roots]]\nname = \"b\"\ndir = \"stacks/b\"\n",
        )
        .files(&[
            ("stacks/a/versions.tf", "terraform {}\n"),
            ("stacks/b/versions.tf", "terraform {}\n"),
        ])
        .build();
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "secrets",
            &[
                ("stacks/a/main.tf", &secret_root_tf()),
                ("stacks/b/main.tf", &showing_root_tf("first")),
            ],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}");
    assert_no_secret("the first note", &note);
    assert!(
        note.contains("first: (sensitive value) and (sensitive value)"),
        "{note}"
    );
    let first = w.gitlab.mr_sha(&w.project, iid);

    // planbot restarts; a push to `b` alone: `a`'s plan is read back from the store.
    s.kill().await;
    let s = TestService::start(w.config.clone(), with_workers()).await;
    w.push(
        &s,
        iid,
        "secrets",
        &[("stacks/b/main.tf", &showing_root_tf("second"))],
    )
    .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}");
    assert_eq!(
        reused_at(&note, "a").as_deref(),
        Some(&first[..8]),
        "{note}"
    );
    assert_eq!(reused_at(&note, "b"), None, "{note}");
    assert_no_secret("the note with a's kept plan", &note);
    assert!(
        note.contains("second: (sensitive value) and (sensitive value)"),
        "b's plan, a's secrets scrubbed: {note}"
    );
    // `a`'s section reads as it did: its sensitive values masked.
    let a = section(&note, "a").unwrap();
    assert!(a.contains("input.password = (sensitive value)"), "{a}");
    assert_no_secret("the store", &store_bytes(&w));
    s.kill().await;
}

/// A kept plan that does not read back (a row damaged in the store) is never shown: its root is
/// planned again, and the note and status are those of a plan; a closed MR's plans are
/// forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_plan_that_does_not_read_back_is_planned_again() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "damaged",
            &[
                ("stacks/a/main.tf", &root_tf("a1", false)),
                ("stacks/b/main.tf", &root_tf("b1", false)),
                ("stacks/c/main.tf", &root_tf("c1", false)),
            ],
        )
        .await;
    let (_, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}");
    let first = w.gitlab.mr_sha(&w.project, iid);
    let damaged = rusqlite::Connection::open(w.data_dir().join("planbot.db"))
        .unwrap()
        .execute(
            "UPDATE kept_plans SET document = '{\"format_version\": ' WHERE root = 'a'",
            [],
        )
        .unwrap();
    assert_eq!(damaged, 1, "a's plan was kept");
    let before = state_reads(&w, "a");

    w.push(
        &s,
        iid,
        "damaged",
        &[("stacks/b/main.tf", &root_tf("b2", false))],
    )
    .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert!(status.starts_with("success"), "{status}");
    assert_eq!(reused_at(&note, "a"), None, "{note}");
    assert!(state_reads(&w, "a") > before, "a planned again");
    assert_eq!(
        reused_at(&note, "c").as_deref(),
        Some(&first[..8]),
        "the others are still reused: {note}"
    );
    assert!(note.contains("\"a1\"") && note.contains("\"b2\""), "{note}");

    // The MR is closed: its kept plans are forgotten.
    let kept = |w: &World| -> i64 {
        rusqlite::Connection::open(w.data_dir().join("planbot.db"))
            .unwrap()
            .query_row(
                "SELECT COUNT(*) FROM kept_plans WHERE mr_iid = ?1",
                [iid as i64],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_eq!(kept(&w), 3, "every root's plan of the last push is kept");
    w.gitlab.close_mr(&w.project, iid);
    let body = w.gitlab.mr_webhook(&w.project, iid).action("close").body();
    w.hook(&s, "Merge Request Hook", "close", &body).await;
    s.after_job_ends("the MR's close", 60, || async { kept(&w) == 0 })
        .await;
}
