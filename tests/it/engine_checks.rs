//! The engine's checks beside an MR's plan, against the fake GitLab and the real engine: a
//! root's tests (one passing, one failing run), its unformatted files and validation errors in
//! the note's "Checks" part; the engine's warnings (grouped) and a failing `check {}` block;
//! the `planbot/test` status; every check switched off per root in `.planbot.toml`.

use crate::support::world::World;

const CANARY: &str = "canary-secret-checks-41c7";

const REPO_CONFIG: &str = r#"[[roots]]
name = "tested"
dir = "tested"

[[roots]]
name = "plain"
dir = "plain"

[[roots]]
name = "broken"
dir = "broken"
"#;

const CHECKS_OFF: &str = r#"[[roots]]
name = "tested"
dir = "tested"
checks = { validate = false, fmt = false, test = false }

[[roots]]
name = "plain"
dir = "plain"
checks = { validate = false }

[[roots]]
name = "broken"
dir = "broken"
checks = { validate = false, fmt = false }
"#;

/// A root with tests: one run passes, one fails its assertion (which quotes a secret the
/// engine's env holds: the note must not). `extra.tf` is not formatted.
const TESTED_MAIN: &str = r#"variable "n" {
  type    = number
  default = 2
}

variable "token" {
  type      = string
  sensitive = true
  default   = "unset"
}

resource "terraform_data" "a" {
  input = var.n
}
"#;

const TESTED_EXTRA: &str = "output \"doubled\" {\nvalue = terraform_data.a.input * 2\n}\n";

const TESTED_TEST: &str = r#"run "passes" {
  command = plan

  assert {
    condition     = terraform_data.a.input == 2
    error_message = "input is not 2"
  }
}

run "fails" {
  command = plan

  assert {
    condition     = terraform_data.a.input == 3
    error_message = "input is not 3 (token ${nonsensitive(var.token)})"
  }
}
"#;

/// No tests; a `check {}` block that fails, and a child module with an empty provider block:
/// Terraform 1.11 warns that it is deprecated, once per use (two uses here).
const PLAIN_MAIN: &str = r#"variable "n" {
  type    = number
  default = 2
}

resource "terraform_data" "b" {
  input = var.n
}

module "one" {
  source = "./modules/m"
}

module "two" {
  source = "./modules/m2"
}

check "health" {
  assert {
    condition     = var.n > 5
    error_message = "n must be above 5"
  }
}
"#;

const PLAIN_MODULE: &str = "provider \"terraform\" {}\n\nresource \"terraform_data\" \"m\" {}\n";

/// A validation error on line 3.
const BROKEN_MAIN: &str = r#"resource "terraform_data" "c" {
  input  = 1
  colour = "red"
}
"#;

fn world(engine: &std::path::Path) -> World {
    World::builder()
        .project("infra/checks")
        .no_members()
        .engine(engine)
        .managed_state()
        .config(|c| {
            c.set(
                "engine",
                "env",
                &format!("{{ TF_VAR_token = \"{CANARY}\" }}"),
            )
        })
        .planbot_toml(REPO_CONFIG)
        .files(&[
            ("tested/main.tf", TESTED_MAIN),
            ("plain/main.tf", PLAIN_MAIN),
            ("plain/modules/m/main.tf", PLAIN_MODULE),
            ("plain/modules/m2/main.tf", PLAIN_MODULE),
            ("broken/README.md", "a root to be\n"),
        ])
        .build()
}

/// The note from its warnings to the first root's details: the part this feature adds.
fn checks_part(note: &str) -> &str {
    let start = note
        .find("<details><summary>⚠️")
        .or_else(|| note.find("**Checks**"))
        .unwrap_or(0);
    let end = note[start..]
        .find("#### Root")
        .map_or(note.len(), |e| start + e);
    note[start..end].trim()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tests_format_validation_and_warnings_are_in_the_note_and_the_test_status() {
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "feature/checks",
        &[
            ("tested/extra.tf", TESTED_EXTRA),
            ("tested/tests/a.tftest.hcl", TESTED_TEST),
            ("plain/README.md", "changed\n"),
            ("broken/main.tf", BROKEN_MAIN),
        ],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/checks", "main");
    let head = w.gitlab.mr_sha(&w.project, iid);
    let note = w.plan_note(iid).await;
    assert!(!note.contains(CANARY), "a secret leaked into the note");

    // The tests: counted, each run listed, the failed assertion with its place.
    assert!(
        note.contains("- ❌ `tested`: **Tests: 1 passed, 1 failed**"),
        "{note}"
    );
    assert!(
        note.contains("  - ✅ `tests/a.tftest.hcl` run `passes` passed"),
        "{note}"
    );
    assert!(
        note.contains("  - ❌ `tests/a.tftest.hcl` run `fails` failed\n    - Test assertion failed: input is not 3 (token (sensitive value))"),
        "the assertion's message, the secret it quotes redacted: {note}"
    );
    assert!(note.contains("(`tests/a.tftest.hcl:14`)"), "{note}");
    // A root without tests says nothing of tests.
    assert!(!note.contains("`plain`: **Tests"), "{note}");
    assert!(!note.contains("`broken`: **Tests"), "{note}");
    // The file not formatted, and no other.
    assert!(
        note.contains("- ⚠️ `tested`: **Not formatted** (`fmt -check`): `extra.tf`\n"),
        "{note}"
    );
    assert_eq!(note.matches("**Not formatted**").count(), 1, "{note}");
    // The validation error with its file and line.
    assert!(
        note.contains("- ❌ `broken`: **Validation failed** (`validate`):\n  - `main.tf:3`: Unsupported argument: An argument named &quot;colour&quot; is not expected here."),
        "{note}"
    );
    // The failing check block on its own line, the warning once with its count and places.
    assert!(
        note.contains("- ⚠️ `plain`: **check.health** failed: n must be above 5"),
        "{note}"
    );
    assert!(
        note.contains("<details><summary>⚠️ 2 warnings from Terraform</summary>"),
        "{note}"
    );
    // One warning per module call, each given once (the plan's own text repeats them): one
    // summary line, its two details (each names its module call) under it.
    assert_eq!(
        note.matches("**Redundant empty provider block**").count(),
        1,
        "{note}"
    );
    assert!(
        note.contains("- `plain`: **Redundant empty provider block** (2×)\n  - at `modules/m/main.tf:1`: Earlier versions of Terraform"),
        "{note}"
    );
    assert_eq!(
        note.matches("required_providers block of module.one")
            .count(),
        1,
        "{note}"
    );
    assert_eq!(
        note.matches("required_providers block of module.two")
            .count(),
        1,
        "{note}"
    );
    assert!(note.starts_with(planbot::core::render::NOTE_MARKER));
    assert!(
        note.contains("### 🔴"),
        "failed tests make the headline red: {note}"
    );
    insta::assert_snapshot!("engine_checks_note", checks_part(&note));

    // The test status: failed, with the counts; the plan status says what it says of plans.
    let test = w
        .gitlab
        .status(&w.project, &head, "planbot/test")
        .expect("planbot/test is posted when a root has tests");
    assert_eq!(test.state, "failed");
    assert_eq!(
        test.description.as_deref(),
        Some("tests failed: 1 passed, 1 failed (root tested)")
    );

    // Every check switched off: nothing of them in the note, no test status for the new head.
    w.gitlab
        .commit_files(&w.project, "main", &[(".planbot.toml", CHECKS_OFF)]);
    w.gitlab.push(
        &w.project,
        "feature/checks",
        &[("tested/extra.tf", &format!("{TESTED_EXTRA}\n"))],
    );
    let head2 = w.gitlab.mr_sha(&w.project, iid);
    assert_ne!(head, head2);
    let note = w.plan_note(iid).await;
    for gone in [
        "**Tests",
        "**Not formatted**",
        "**Validation failed**",
        "warnings from Terraform",
    ] {
        assert!(!note.contains(gone), "{gone}: {note}");
    }
    // `plain` keeps `fmt` and `test` (it has no tests) and its check block (from the plan).
    assert!(note.contains("**check.health** failed"), "{note}");
    assert!(w
        .gitlab
        .status(&w.project, &head2, "planbot/test")
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passing_tests_turn_the_test_status_green_and_say_how_many() {
    let engine = require_engine!();
    let w = world(&engine);
    let passing = TESTED_TEST.replace("== 3", "== 2");
    w.gitlab.commit_files(
        &w.project,
        "feature/green",
        &[("tested/tests/a.tftest.hcl", &passing)],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/green", "main");
    let head = w.gitlab.mr_sha(&w.project, iid);
    let note = w.plan_note(iid).await;
    assert!(
        note.contains("- ✅ `tested`: **Tests: 2 passed, 0 failed**"),
        "{note}"
    );
    let test = w.gitlab.status(&w.project, &head, "planbot/test").unwrap();
    assert_eq!(test.state, "success");
    assert_eq!(
        test.description.as_deref(),
        Some("tests passed: 2 passed, 0 failed")
    );
}

/// A value in `terraform.tfvars` for a variable the root does not declare (one removed from
/// the code, left in the file): Terraform warns when `plan` reads the file; `validate` reads no
/// var files and says nothing of it.
const UNDECLARED_TFVARS: &str = "n = 2\nold_setting = \"x\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warning_only_the_plan_gives_is_in_the_note_once() {
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "feature/tfvars",
        &[("plain/terraform.tfvars", UNDECLARED_TFVARS)],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/tfvars", "main");
    let note = w.plan_note(iid).await;

    // The plan's own warning, once; validation's two (the plan gives them again) not twice.
    assert!(
        note.contains("<details><summary>⚠️ 3 warnings from Terraform</summary>"),
        "{note}"
    );
    assert_eq!(
        note.matches("**Value for undeclared variable**").count(),
        1,
        "{note}"
    );
    assert!(
        note.contains("**Value for undeclared variable**\n  - The root module does not declare a variable named &quot;old_setting&quot; but a value was found in file &quot;terraform.tfvars&quot;."),
        "{note}"
    );
    assert!(
        note.contains("**Redundant empty provider block** (2×)"),
        "{note}"
    );
    // The failing check block on its own line only: not again as the plan's warning.
    assert_eq!(note.matches("**check.health** failed").count(), 1, "{note}");
    assert!(!note.contains("Check block assertion failed"), "{note}");

    // The run's log (its page, the job's log) reads as the engine's human view.
    let runs = w
        .app()
        .store
        .runs_for_mr(
            planbot::core::ids::ProjectId(w.project.id),
            planbot::core::ids::MrIid(iid),
        )
        .await
        .unwrap();
    let mut logs = String::new();
    for r in runs {
        logs.push_str(&w.app().store.run(r.id).await.unwrap().unwrap().log);
    }
    assert!(
        logs.contains("\nWarning: Value for undeclared variable\n\nThe root module does not declare a variable named \"old_setting\""),
        "{logs}"
    );
    assert!(
        logs.contains("Plan: 3 to add, 0 to change, 0 to destroy."),
        "{logs}"
    );
    assert!(!logs.contains("\"@message\""), "{logs}");
}

/// A clean plan has validated the whole configuration (the engine validates before it plans),
/// so `validate` is not run a second time: one engine process less per root. It still runs
/// after a plan that failed (its errors with their places are what the author needs) and for a
/// root with test files (`validate` reads those, the plan does not). The warnings validation
/// gives are the plan's too: a clean root's note loses none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_runs_again_only_when_the_plan_did_not_validate_the_root() {
    use planbot::capabilities::engine::{Engine, PlanRequest};
    use planbot::core::engine_checks::{Check, CheckSet, RootChecks, StepCheck};
    let engine_bin = require_engine!();
    let temp = tempfile::tempdir().unwrap();
    let engine = Engine::builder(&engine_bin, temp.path()).build().unwrap();
    let root = |files: &[(&str, &str)]| {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    };
    let read = |ran: &planbot::capabilities::engine::EngineChecks| {
        RootChecks::read(&ran.validate, &ran.fmt, &ran.test, &ran.plan, None)
    };

    // Clean: validated by the plan, its two warnings read from the plan's own lines.
    let plain = root(&[
        ("main.tf", PLAIN_MAIN),
        ("modules/m/main.tf", PLAIN_MODULE),
        ("modules/m2/main.tf", PLAIN_MODULE),
    ]);
    let (planned, ran) = engine
        .plan_checked(plain.path(), &PlanRequest::default(), CheckSet::ALL)
        .await;
    assert!(planned.is_ok(), "{:?}", planned.err());
    assert_eq!(ran.validate, StepCheck::ByThePlan);
    assert!(
        matches!(ran.fmt, StepCheck::Ran { exit: Some(0), .. }),
        "{:?}",
        ran.fmt
    );
    let checks = read(&ran);
    assert!(matches!(&checks.validate, Check::Ran { result } if result.is_empty()));
    let redundant = checks
        .warnings
        .iter()
        .find(|g| g.summary == "Redundant empty provider block");
    assert_eq!(redundant.map(|g| g.count), Some(2), "{:?}", checks.warnings);

    // Broken: the plan fails, `validate` runs and names the error's place.
    let broken = root(&[("main.tf", BROKEN_MAIN)]);
    let (planned, ran) = engine
        .plan_checked(broken.path(), &PlanRequest::default(), CheckSet::ALL)
        .await;
    assert!(planned.is_err());
    assert!(
        matches!(ran.validate, StepCheck::Ran { .. }),
        "{:?}",
        ran.validate
    );
    let checks = read(&ran);
    let errors = checks.validate.result().expect("validate ran");
    assert_eq!(errors[0].at.as_deref(), Some("main.tf:3"), "{errors:?}");

    // Clean, with test files, whose tests are switched off: `validate` still reads them.
    let tested = root(&[
        ("main.tf", TESTED_MAIN),
        ("tests/a.tftest.hcl", TESTED_TEST),
    ]);
    let no_tests = CheckSet {
        test: false,
        ..CheckSet::ALL
    };
    let (planned, ran) = engine
        .plan_checked(tested.path(), &PlanRequest::default(), no_tests)
        .await;
    assert!(planned.is_ok(), "{:?}", planned.err());
    assert!(
        matches!(ran.validate, StepCheck::Ran { exit: Some(0), .. }),
        "{:?}",
        ran.validate
    );
}

/// The real engine behind a script that notes each `fmt` it is asked for (its arguments) in
/// the MR's plugin cache: the one directory a plan's engine writes that outlives the job.
fn counting_engine(dir: &std::path::Path, real: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("terraform");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nif [ \"$1\" = fmt ]; then echo \"$*\" >> \"$TF_PLUGIN_CACHE_DIR/fmt-runs\" || exit 7; fi\nexec {} \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `fmt -check` runs once for all the roots an MR plans (from the checkout's top, each root's
/// directory after `--`, beside the plans: each root's checks wait for it), not once per root, and each root's note still lists its own files
/// only, relative to it; the MR's changed files outside every root (a shared module's) are
/// checked in the same run and listed on their own line. When that one run cannot read a file (it stops, listing nothing), each
/// root runs its own, and only the root whose file it is says `fmt` could not read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fmt_runs_once_for_the_roots_of_a_plan_and_each_root_lists_its_own_files() {
    let real = require_engine!();
    let bin = tempfile::tempdir().unwrap();
    let engine = counting_engine(bin.path(), &real);
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "feature/fmt",
        &[
            ("tested/extra.tf", TESTED_EXTRA),
            ("plain/modules/m/extra.tf", "locals {\nx = 1\n}\n"),
            ("broken/main.tf", BROKEN_MAIN),
            // A shared module, outside every root, that `tested` calls.
            ("modules/shared/main.tf", "locals {\ny = 2\n}\n"),
            (
                "tested/shared.tf",
                "module \"shared\" {\n  source = \"../modules/shared\"\n}\n",
            ),
        ],
    );
    let iid = w.gitlab.open_mr(&w.project, "feature/fmt", "main");
    // The MR's plugin cache is made by its first `init`; the script writes there from the
    // first engine process on.
    let cache = w
        .data_dir()
        .join(format!("plugin-cache/mr/p{}-mr{iid}", w.project.id));
    std::fs::create_dir_all(&cache).unwrap();
    let runs_file = cache.join("fmt-runs");
    let note = w.plan_note(iid).await;
    let runs = std::fs::read_to_string(&runs_file).expect("fmt ran");
    assert_eq!(
        runs.lines().collect::<Vec<_>>(),
        ["fmt -check -list=true -recursive -no-color -- broken plain tested modules/shared/main.tf"],
        "one fmt for the three roots and the changed file outside them"
    );
    assert!(
        note.contains("- ⚠️ **Not formatted** (`fmt -check`), changed outside the roots: `modules/shared/main.tf`\n"),
        "{note}"
    );
    assert!(
        note.contains("- ⚠️ `tested`: **Not formatted** (`fmt -check`): `extra.tf`\n"),
        "{note}"
    );
    assert!(
        note.contains("- ⚠️ `plain`: **Not formatted** (`fmt -check`): `modules/m/extra.tf`\n"),
        "{note}"
    );
    assert_eq!(note.matches("**Not formatted**").count(), 3, "{note}");
    insta::assert_snapshot!("engine_checks_fmt_of_roots", checks_part(&note));

    // A file `fmt` cannot parse, in `tested`: the one run (over the roots planned again:
    // `plain`'s plan is reused) lists nothing, so each root runs its own; `tested`'s `init`
    // fails on that file, so its own never runs and its note says so, and `broken` runs its own.
    std::fs::remove_file(&runs_file).unwrap();
    w.gitlab.push(
        &w.project,
        "feature/fmt",
        &[("tested/extra.tf", "output \"doubled\" {\n")],
    );
    let note = w.plan_note(iid).await;
    let runs = std::fs::read_to_string(&runs_file).expect("fmt ran");
    assert_eq!(
        runs.lines().collect::<Vec<_>>(),
        [
            "fmt -check -list=true -recursive -no-color -- broken tested modules/shared/main.tf",
            "fmt -check -list=true -recursive -no-color",
        ],
    );
    // That run listed nothing: the file outside the roots is not said to be unformatted.
    assert!(!note.contains("changed outside the roots"), "{note}");
    assert!(
        note.contains("- ⚠️ `tested`: **Format not checked**: `init` failed (exit code 1)\n"),
        "{note}"
    );
    assert!(
        note.contains("- ⚠️ `plain`: **Not formatted** (`fmt -check`): `modules/m/extra.tf`\n"),
        "{note}"
    );
    assert_eq!(note.matches("**Not formatted**").count(), 1, "{note}");
}
