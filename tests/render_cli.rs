//! `planbot render` through the real binary: JSON and Markdown output, stdin, the fingerprint
//! key, and bad input answered with exit code 2 and one clear line.

use planbot::core::fingerprint::Fingerprint;
use planbot::core::plan::Plan;
use planbot::core::render::NOTE_MARKER;
use planbot::flows::report::LOCAL_FINGERPRINT_KEY;
use std::io::Write;
use std::process::{Command, Output, Stdio};

fn fixture_path(name: &str) -> String {
    format!(
        "{}/tests/fixtures/plans/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn planbot(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args(args)
        .env_remove("PLANBOT_FINGERPRINT_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("planbot runs");
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.unwrap_or_default()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn json_format_gives_the_summary_resources_and_keyed_fingerprint() {
    let path = fixture_path("changes");
    let out = planbot(
        &[
            "render",
            &path,
            "--format",
            "json",
            "--fingerprint-key",
            "server-secret",
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "", "no warning when a key is given");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(
        report["summary"],
        serde_json::json!({"add": 5, "change": 1, "destroy": 2, "replace": 1, "import": 0, "move": 0, "forget": 0})
    );
    assert_eq!(report["errored"], false);
    let plan = Plan::from_json(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        report["fingerprint"],
        Fingerprint::of(&plan, b"server-secret").as_hex()
    );
    let addresses: Vec<&str> = report["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["address"].as_str().unwrap())
        .collect();
    assert_eq!(
        addresses,
        [
            "terraform_data.app[\"alpha\"]",
            "terraform_data.app[\"beta\"]",
            "terraform_data.db",
            "terraform_data.old_worker",
            "terraform_data.web",
            "terraform_data.worker[0]",
            "terraform_data.worker[1]"
        ]
    );
    let db = &report["resources"][2];
    assert_eq!(db["actions"], serde_json::json!(["delete", "create"]));
    assert_eq!(db["action_reason"], "replace_because_cannot_update");
    assert!(report["findings"].is_array());
}

#[test]
fn without_a_key_it_warns_once_and_uses_the_documented_local_key() {
    let path = fixture_path("moved");
    let out = planbot(&["render", &path, "--format", "json"], None);
    assert!(out.status.success());
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("not keyed by a server secret"), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let plan = Plan::from_json(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        report["fingerprint"],
        Fingerprint::of(&plan, LOCAL_FINGERPRINT_KEY.as_bytes()).as_hex()
    );
    assert_eq!(
        report["resources"][0]["previous_address"],
        "terraform_data.blocky"
    );
}

#[test]
fn markdown_from_stdin_is_the_mr_note_without_secrets() {
    let plan = std::fs::read(fixture_path("outputs")).unwrap();
    let out = planbot(&["render", "-", "--fingerprint-key", "k"], Some(&plan));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let note = text(&out.stdout);
    assert!(note.starts_with(NOTE_MARKER), "{note}");
    assert!(
        note.contains("| <code>.</code> | 0 | 1 | 0 | 0 | 0 |"),
        "{note}"
    );
    assert!(note.contains("~ token = (sensitive value)"));
    // The sensitive variable's value is in clear in the plan JSON; it never reaches the output.
    assert!(String::from_utf8_lossy(&plan).contains("tok-after-1111-canary"));
    assert!(!note.contains("tok-after-1111-canary") && !note.contains("tok-before-0000-canary"));
}

#[test]
fn input_that_is_not_a_plan_exits_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("terraform.tfstate.json");
    std::fs::write(
        &state,
        br#"{"format_version":"1.0","values":{"root_module":{}}}"#,
    )
    .unwrap();
    let garbage = dir.path().join("plan.json");
    std::fs::write(&garbage, b"Error: no plan here\n").unwrap();
    for (path, says) in [
        (state.to_str().unwrap(), "is not a plan document"),
        (garbage.to_str().unwrap(), "is not JSON"),
        ("-", "stdin is not JSON"),
    ] {
        let out = planbot(&["render", path], Some(b""));
        assert_eq!(out.status.code(), Some(2), "{path}");
        let stderr = text(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{path}: {stderr}");
        assert!(
            stderr.starts_with("planbot: ") && stderr.contains(says),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"));
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn a_missing_file_is_one_line_too() {
    let out = planbot(&["render", "/nonexistent/plan.json"], None);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot read /nonexistent/plan.json"),
        "{stderr}"
    );
}
