//! `planbot policy test` and `planbot plan --policy` as a user runs them: conftest's text and
//! JSON, the exit codes, the errors on stderr; the recipe of docs/policies.md run as written with
//! the real engine; `planbot check-repo-config` listing and checking `[[policy_sets]]`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn planbot(dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args(args)
        .current_dir(dir)
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

/// `planbot policy test ARGS…` in `dir`.
fn policy_test(dir: &Path, args: &[&str]) -> Output {
    planbot(dir, &[&["policy", "test"], args].concat(), None)
}

/// `policy test PLAN --policy conftest_v1 --output json` in `dir`: it exits 0, and prints JSON.
fn passing_json(dir: &Path, plan: &str) -> serde_json::Value {
    let out = policy_test(dir, &[plan, "--policy", "conftest_v1", "--output", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).unwrap()
}

/// A work dir with the GKE plan as `gke.json` and conftest's example in both syntaxes.
fn gke_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        repo("tests/fixtures/policy/gke_show.json"),
        dir.path().join("gke.json"),
    )
    .unwrap();
    for v in ["conftest_v0", "conftest_v1"] {
        std::fs::create_dir(dir.path().join(v)).unwrap();
        std::fs::copy(
            repo(&format!("tests/fixtures/policy/{v}/base.rego")),
            dir.path().join(v).join("base.rego"),
        )
        .unwrap();
    }
    dir
}

/// A policy that warns of every updated resource.
const WARN_UPDATES: &str = "package main\n\nimport rego.v1\n\nwarn contains sprintf(\"%s changes\", [rc.address]) if {\n\tsome rc in input.resource_changes\n\trc.change.actions == [\"update\"]\n}\n";

const MSG: &str = "Terraform plan will change prohibited resources in the following namespaces: google_iam, google_container";

#[test]
fn a_failure_prints_like_conftest_and_exits_1() {
    let dir = gke_dir();
    for policy in ["conftest_v0", "conftest_v1"] {
        let out = policy_test(dir.path(), &["gke.json", "--policy", policy]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout),
            format!("FAIL - gke.json - main - {MSG}\n\n1 test, 0 passed, 0 warnings, 1 failure, 0 exceptions\n")
        );
        assert_eq!(text(&out.stderr), "");
    }
    // From stdin, conftest's `-` indicator.
    let plan = std::fs::read_to_string(dir.path().join("gke.json")).unwrap();
    let out = planbot(
        dir.path(),
        &["policy", "test", "-", "--policy", "conftest_v1"],
        Some(&plan),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).starts_with(&format!("FAIL - - main - {MSG}\n")),
        "{}",
        text(&out.stdout)
    );
}

/// conftest's JSON stays JSON whatever a secret of the plan holds: it is scrubbed string by
/// string, not as text (a password `json",` cut `"filename": "pve.json",` in two).
#[test]
fn json_output_stays_json_whatever_a_secret_holds() {
    let dir = gke_dir();
    let plan = serde_json::json!({"format_version": "1.2", "resource_changes": [{
        "address": "terraform_data.vm", "mode": "managed", "type": "terraform_data",
        "name": "vm",
        "change": {"actions": ["update"], "before": {"input": {"password": "old-secret-1"}},
            "after": {"input": {"password": "json\","}},
            "after_unknown": {}, "before_sensitive": {"input": {"password": true}},
            "after_sensitive": {"input": {"password": true}}}
    }]});
    std::fs::write(dir.path().join("pve.json"), plan.to_string()).unwrap();
    std::fs::write(dir.path().join("conftest_v1/warn.rego"), WARN_UPDATES).unwrap();
    std::fs::remove_file(dir.path().join("conftest_v1/base.rego")).unwrap();
    assert_eq!(
        passing_json(dir.path(), "pve.json"),
        serde_json::json!([{
            "filename": "pve.json",
            "namespace": "main",
            "successes": 0,
            "warnings": [{"msg": "terraform_data.vm changes"}],
        }])
    );
}

#[test]
fn json_output_is_conftests_shape() {
    let dir = gke_dir();
    let out = policy_test(
        dir.path(),
        &["gke.json", "--policy", "conftest_v1", "--output", "json"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stdout),
        format!("[\n\t{{\n\t\t\"filename\": \"gke.json\",\n\t\t\"namespace\": \"main\",\n\t\t\"successes\": 0,\n\t\t\"failures\": [\n\t\t\t{{\n\t\t\t\t\"msg\": \"{MSG}\"\n\t\t\t}}\n\t\t]\n\t}}\n]\n")
    );

    // A passing plan with a warning: exit 0, one success, the warning listed.
    std::fs::copy(
        repo("tests/fixtures/plans/bpg/vm_destroyed_and_updated.json"),
        dir.path().join("pve.json"),
    )
    .unwrap();
    std::fs::write(dir.path().join("conftest_v1/warn.rego"), WARN_UPDATES).unwrap();
    assert_eq!(
        passing_json(dir.path(), "pve.json"),
        serde_json::json!([{
            "filename": "pve.json",
            "namespace": "main",
            "successes": 1,
            "warnings": [{"msg": "proxmox_virtual_environment_vm.web changes"}],
        }])
    );
    let out = policy_test(dir.path(), &["pve.json", "--policy", "conftest_v1"]);
    assert_eq!(
        text(&out.stdout),
        "WARN - pve.json - main - proxmox_virtual_environment_vm.web changes\n\n2 tests, 1 passed, 1 warning, 0 failures, 0 exceptions\n"
    );
}

#[test]
fn what_cannot_be_evaluated_exits_2_with_the_reason() {
    let dir = gke_dir();
    // The rules are in `main`, not in `terraform`.
    let out = policy_test(
        dir.path(),
        &[
            "gke.json",
            "--policy",
            "conftest_v1",
            "--namespace",
            "terraform",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        "planbot: policy set conftest_v1 (package terraform) could not be evaluated: no deny, violation or warn rule in package `terraform` (packages found: main); set the namespace to the package of your rules\n"
    );

    // A policy that loops over too much stops at the limit.
    std::fs::create_dir(dir.path().join("slow")).unwrap();
    std::fs::write(
        dir.path().join("slow/loop.rego"),
        "package main\n\ndeny contains \"never\" if {\n\tcount([x | some i in numbers.range(1, 3000); some j in numbers.range(1, 3000); x := i * j]) < 0\n}\n",
    )
    .unwrap();
    let out = policy_test(
        dir.path(),
        &["gke.json", "--policy", "slow", "--limit", "100ms"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("could not be evaluated: evaluation stopped after 100ms"),
        "{}",
        text(&out.stderr)
    );

    // Not a plan.
    std::fs::write(
        dir.path().join("state.json"),
        "{\"format_version\": \"1.0\", \"values\": {}}",
    )
    .unwrap();
    let out = policy_test(dir.path(), &["state.json", "--policy", "conftest_v1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("state.json is not a plan document"),
        "{}",
        text(&out.stderr)
    );

    // A symbolic link in the policy directory is refused, not followed.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("conftest_v1/host.rego"))
            .unwrap();
        let out = policy_test(dir.path(), &["gke.json", "--policy", "conftest_v1"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(
            text(&out.stderr).contains("conftest_v1/host.rego is a symbolic link"),
            "{}",
            text(&out.stderr)
        );
    }
}

/// The fenced block of `lang` that follows `after` in docs/policies.md.
fn documented_block(after: &str, lang: &str) -> String {
    let page = std::fs::read_to_string(repo("docs/policies.md")).unwrap();
    let rest = page.split_once(after).expect(after).1;
    let start = format!("```{lang}\n");
    let body = rest.split_once(&start).expect(&start).1;
    body.split_once("\n```\n").unwrap().0.to_string() + "\n"
}

#[test]
fn the_documented_recipe_runs_as_written_with_the_real_engine() {
    let engine = require_engine!();
    let root = tempfile::tempdir().unwrap();
    let work = root.path().join("quickstart");
    std::fs::create_dir_all(work.join("policies")).unwrap();
    std::fs::copy(repo("examples/quickstart/main.tf"), work.join("main.tf")).unwrap();
    std::fs::write(
        work.join("policies/vm_size.rego"),
        documented_block("Put this in `policies/vm_size.rego`", "rego"),
    )
    .unwrap();
    let recipe = documented_block("then plan and check:", "sh");
    let expected = documented_block("then plan and check:", "text");
    let mut last = None;
    for line in recipe.lines() {
        let (command, redirect) = match line.split_once(" > ") {
            Some((c, file)) => (c, Some(file.trim())),
            None => (line, None),
        };
        let words: Vec<&str> = command.split_whitespace().collect();
        let program: PathBuf = match words[0] {
            "tofu" => engine.clone(),
            "planbot" => PathBuf::from(env!("CARGO_BIN_EXE_planbot")),
            other => panic!("the recipe runs {other}"),
        };
        let out = Command::new(program)
            .args(&words[1..])
            .current_dir(&work)
            .env("TF_IN_AUTOMATION", "1")
            .env("CHECKPOINT_DISABLE", "1")
            .output()
            .unwrap();
        if let Some(file) = redirect {
            std::fs::write(work.join(file), &out.stdout).unwrap();
        }
        if words[0] == "tofu" {
            assert!(out.status.success(), "{line}: {}", text(&out.stderr));
        }
        last = Some(out);
    }
    let out = last.unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), expected);

    // `planbot plan . --policy policies`: the note, then the same lines with the root's name.
    let out = Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args(["plan", ".", "--policy", "policies", "--engine"])
        .arg(&engine)
        .args(["--format", "markdown"])
        .current_dir(&work)
        .env("TMPDIR", root.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with(planbot::core::render::NOTE_MARKER),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(&format!(
            "\n\n{}",
            expected.replace("plan.json", "quickstart")
        )),
        "{stdout}"
    );

    // With the JSON report, stdout stays one JSON document and the policies go to stderr.
    let out = Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args(["plan", ".", "--policy", "policies", "--engine"])
        .arg(&engine)
        .args(["--format", "json"])
        .current_dir(&work)
        .env("TMPDIR", root.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(report["summary"]["add"], 4);
    assert!(
        text(&out.stderr).contains("FAIL - quickstart - main - terraform_data.vm[\"gitlab\"]"),
        "{}",
        text(&out.stderr)
    );
}

/// `check-repo-config` in a repository holding the roots' directories.
fn check_config(content: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    for root in ["tofu/core", "tofu/dns"] {
        std::fs::create_dir_all(dir.path().join(root)).unwrap();
    }
    std::fs::write(dir.path().join(".planbot.toml"), content).unwrap();
    planbot(dir.path(), &["check-repo-config", ".planbot.toml"], None)
}

#[test]
fn check_config_lists_the_policy_sets_and_names_what_is_wrong() {
    let out = check_config(
        r#"[[roots]]
name = "core"
dir = "tofu/core"

[[roots]]
name = "dns"
dir = "tofu/dns"

[[policy_sets]]
name = "proxmox-guardrails"
path = "policies/proxmox/"
owners = ["alice", "group:infra/admins"]
roots = ["core"]

[[policy_sets]]
name = "shared"
path = "policies/shared"
namespace = "terraform.shared"
"#,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    insta::assert_snapshot!("check_config_policy_sets", text(&out.stdout));

    let out = check_config(
        r#"[[roots]]
name = "core"

[[policy_sets]]
name = "a"
path = "../outside"
owners = ["two words"]
roots = ["nope"]
namespace = "x-y"

[[policy_sets]]
name = "a"
path = "policies"
"#,
    );
    assert_eq!(out.status.code(), Some(1));
    insta::assert_snapshot!("check_config_policy_sets_invalid", text(&out.stderr));

    let out = check_config("[[policy_sets]]\nname = \"a\"\npth = \"policies\"\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("line 3, column 1: key `policy_sets[0].pth`: unknown key `pth`"),
        "{}",
        text(&out.stderr)
    );
}
