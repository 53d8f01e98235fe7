//! `planbot plan DIR` as a user runs it: the quickstart plans, var files and `--var` change what
//! is planned, a broken root or a missing var file exits 1 with a clear redacted error, a
//! non-plan exits 2, a hanging engine is stopped, no file is left behind, and a big plan is
//! printed whole unless `--budget gitlab` asks for the note GitLab would get.

use crate::support::fake_engine as fake;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn planbot_plan(dir: &Path, tmpdir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_planbot"))
        .arg("plan")
        .arg(dir)
        .args(extra)
        .env("TMPDIR", tmpdir)
        .output()
        .expect("run planbot")
}

fn quickstart_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quickstart");
    for e in std::fs::read_dir(src).unwrap().flatten() {
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

#[test]
fn the_quickstart_plans_and_prints_the_note_and_the_json_report() {
    let engine = require_engine!();
    let root = quickstart_copy();
    let tmp = tempfile::tempdir().unwrap();
    let engine_arg = engine.to_str().unwrap();

    let out = planbot_plan(root.path(), tmp.path(), &["--engine", engine_arg]);
    let note = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{note}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        note.starts_with(planbot::core::render::NOTE_MARKER),
        "{note}"
    );
    assert!(note.contains("| 4 | 0 | 0 | 0 | 0 |"), "4 to add: {note}");
    for vm in ["backup", "blocky", "gitlab"] {
        assert!(note.contains(&format!("+ input.name = \"{vm}\"")), "{note}");
    }
    assert!(note.contains("+ input = (sensitive value)"), "{note}");
    assert!(
        note.contains("Terraform 1.") || note.contains("OpenTofu 1."),
        "{note}"
    );
    assert!(!note.contains("quickstart-not-a-real-secret"), "{note}");
    // The quickstart keeps its state next to the code: fine on your machine, lost in planbot's
    // service. A local run only warns (and still exits 0).
    assert!(
        note.contains("⚠️ **STATE001**: Root `")
            && note.contains("keeps its state in the checkout (it has no backend block"),
        "{note}"
    );

    let out = planbot_plan(
        root.path(),
        tmp.path(),
        &["--engine", engine_arg, "--format", "json"],
    );
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(report["summary"]["add"], 4);
    assert_eq!(report["errored"], false);
    let fp = report["fingerprint"].as_str().unwrap();
    assert_eq!(fp.len(), 64);
    assert!(fp
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    assert_eq!(report["resources"].as_array().unwrap().len(), 4);
    assert!(
        note.contains(&format!("fingerprint `{}`", &fp[..12])),
        "the note shows the same fingerprint: {note}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("quickstart-not-a-real-secret"));

    // Same code, same state: same fingerprint; another key: another one.
    let again = planbot_plan(
        root.path(),
        tmp.path(),
        &["--engine", engine_arg, "--format", "json"],
    );
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again["fingerprint"], report["fingerprint"]);
    let keyed = planbot_plan(
        root.path(),
        tmp.path(),
        &[
            "--engine",
            engine_arg,
            "--format",
            "json",
            "--fingerprint-key",
            "another",
        ],
    );
    let keyed: serde_json::Value = serde_json::from_slice(&keyed.stdout).unwrap();
    assert_ne!(keyed["fingerprint"], report["fingerprint"]);

    assert_eq!(fake::leftovers(tmp.path()), Vec::<String>::new());
}

#[test]
fn a_var_file_and_a_var_change_what_the_note_shows_and_a_sensitive_value_stays_hidden() {
    let engine = require_engine!();
    let root = quickstart_copy();
    let tmp = tempfile::tempdir().unwrap();
    // The var file lives outside the root, beside where the user runs planbot; it is named
    // relative to that directory, as a user types it.
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(
        cwd.path().join("prod.tfvars"),
        r#"
vms = {
  web  = { node = "pve03", cores = 2, memory = 4096 }
  mail = { node = "pve03", cores = 1, memory = 1024 }
}
root_password = "cli-canary-var-file-5e2"
"#,
    )
    .unwrap();
    let plan = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_planbot"))
            .arg("plan")
            .arg(root.path())
            .args(["--engine", engine.to_str().unwrap()])
            .args(extra)
            .current_dir(cwd.path())
            .env("TMPDIR", tmp.path())
            .output()
            .expect("run planbot")
    };

    let out = plan(&["--var-file", "prod.tfvars"]);
    let note = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{note}\n{stderr}");
    assert!(
        note.contains("| 3 | 0 | 0 | 0 | 0 |"),
        "2 VMs + the password: {note}"
    );
    assert!(note.contains("+ input.name = \"web\""), "{note}");
    assert!(note.contains("+ input.node_name = \"pve03\""), "{note}");
    assert!(
        !note.contains("\"blocky\""),
        "the default map is replaced: {note}"
    );
    assert!(note.contains("+ input = (sensitive value)"), "{note}");
    for text in [&note, &stderr] {
        assert!(!text.contains("cli-canary-var-file-5e2"), "{text}");
    }

    // `--var` wins over the var file, and JSON output lists what would be created.
    let out = plan(&[
        "--var-file",
        "prod.tfvars",
        "--var",
        r#"vms={ mx = { node = "pve04", cores = 1, memory = 512 } }"#,
        "--format",
        "json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let addresses: Vec<&str> = report["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["address"].as_str().unwrap())
        .collect();
    assert_eq!(
        addresses,
        ["terraform_data.root_password", "terraform_data.vm[\"mx\"]"]
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("cli-canary-var-file-5e2"));
    assert_eq!(fake::leftovers(tmp.path()), Vec::<String>::new());
}

/// A variable the user exported in their shell (`TF_VAR_*`) does not reach the engine, whose
/// environment is explicit: planbot names it, and `--var` passes it.
#[test]
fn the_shells_tf_var_variables_are_named_with_how_to_pass_them() {
    let engine = require_engine!();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        root.path().join("main.tf"),
        "variable \"region\" {}\noutput \"region\" {\n  value = var.region\n}\n",
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let plan = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_planbot"))
            .arg("plan")
            .arg(root.path())
            .args(["--engine", engine.to_str().unwrap()])
            .args(extra)
            .env("TF_VAR_region", "eu-shell-value-41")
            .env("TMPDIR", tmp.path())
            .output()
            .expect("run planbot")
    };
    let out = plan(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let note = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{note}\n{stderr}");
    assert!(
        stderr.contains("these variables of your shell are not passed to it: TF_VAR_region. Pass them with `--var region=VALUE` or in a file with `--var-file FILE`."),
        "{stderr}"
    );
    assert!(
        !stderr.contains("eu-shell-value-41"),
        "a value was printed: {stderr}"
    );
    let out = plan(&["--var", "region=eu-central"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("eu-central"));
}

#[test]
fn a_missing_var_file_exits_1_naming_it_before_the_engine_runs() {
    let engine = require_engine!();
    let root = quickstart_copy();
    let tmp = tempfile::tempdir().unwrap();
    let out = planbot_plan(
        root.path(),
        tmp.path(),
        &[
            "--engine",
            engine.to_str().unwrap(),
            "--var-file",
            "/nonexistent/prod.tfvars",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("planbot: --var-file /nonexistent/prod.tfvars: cannot read it: No such file or directory"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no note for bad input");
    assert!(
        !root.path().join(".terraform").exists(),
        "the engine did not even init"
    );

    // A bad `--var` is refused by the argument parser, with what is expected.
    let out = planbot_plan(
        root.path(),
        tmp.path(),
        &["--engine", engine.to_str().unwrap(), "--var", "vms"],
    );
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected NAME=VALUE"));
    assert_eq!(fake::leftovers(tmp.path()), Vec::<String>::new());
}

#[test]
fn a_broken_root_exits_1_with_the_redacted_error_in_the_note() {
    let engine = require_engine!();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        root.path().join("main.tf"),
        r#"
variable "root_password" {
  type      = string
  sensitive = true
  default   = "cli-canary-broken-root-81d"
}
resource "terraform_data" "vm" {
  input = "x"
  lifecycle {
    precondition {
      condition     = length(var.root_password) > 64
      error_message = "root_password ${nonsensitive(var.root_password)} is too short"
    }
  }
}
"#,
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for format in ["markdown", "json"] {
        let out = planbot_plan(
            root.path(),
            tmp.path(),
            &["--engine", engine.to_str().unwrap(), "--format", format],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains("Resource precondition failed"), "{text}");
        assert!(
            text.contains("root_password (sensitive value) is too short"),
            "{text}"
        );
        assert!(!text.contains("cli-canary-broken-root-81d"), "{text}");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("cli-canary-broken-root-81d"));
    }
    assert_eq!(fake::leftovers(tmp.path()), Vec::<String>::new());
}

#[test]
fn output_that_is_not_a_plan_exits_2() {
    let bin_dir = tempfile::tempdir().unwrap();
    let body = format!(
        r#"case "$1" in
  plan) {};;
  show) echo 'this is not json';;
esac"#,
        fake::WRITE_PLAN_FILE
    );
    let bin = fake::fake_engine(
        bin_dir.path(),
        "terraform",
        fake::TERRAFORM_VERSION_JSON,
        &body,
    );
    let root = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = planbot_plan(
        root.path(),
        tmp.path(),
        &["--engine", bin.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("not a plan"));
    assert_eq!(fake::leftovers(tmp.path()), Vec::<String>::new());
}

#[test]
fn a_hanging_engine_is_stopped_after_the_timeout_and_nothing_is_left() {
    let bin_dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    // Its pids are its namespace's: the processes are found by their command lines.
    let child = format!("301.{}", std::process::id());
    let body = format!(
        r#"if [ "$1" = plan ]; then
  {write}
  trap '' TERM
  sleep {child} &
  wait
fi"#,
        write = fake::WRITE_PLAN_FILE,
    );
    let bin = fake::fake_engine(
        bin_dir.path(),
        "terraform",
        fake::TERRAFORM_VERSION_JSON,
        &body,
    );
    let tmp = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let out = planbot_plan(
        root.path(),
        tmp.path(),
        &["--engine", bin.to_str().unwrap(), "--timeout", "1s"],
    );
    let took = started.elapsed();
    let note = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{note}");
    assert!(note.contains("`plan` timed out after 1s"), "{note}");
    // 1 s timeout + 1 s grace (the CLI's grace is capped by the timeout) + slack.
    assert!(took < Duration::from_secs(7), "{took:?}");
    for marker in [bin.display().to_string(), format!("sleep\0{child}")] {
        assert_eq!(
            fake::running_with(&marker),
            Vec::<u32>::new(),
            "{marker} survived"
        );
    }
    assert_eq!(fake::leftovers(tmp.path()), Vec::<String>::new());
}

#[test]
fn a_missing_engine_is_a_clear_error() {
    let root = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = planbot_plan(root.path(), tmp.path(), &["--engine", "/nonexistent/tofu"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/tofu is not an executable file"),
        "{err}"
    );
}

#[test]
fn on_a_terminal_the_note_is_plain_text_and_progress_goes_to_stderr() {
    let engine = require_engine!();
    let root = quickstart_copy();
    let tmp = tempfile::tempdir().unwrap();
    let engine_arg = engine.to_str().unwrap();

    // What a terminal gets by default (`--format text`), here asked for explicitly.
    let out = planbot_plan(
        root.path(),
        tmp.path(),
        &["--engine", engine_arg, "--format", "text"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}\n{stderr}");
    assert!(
        text.contains("\n▸ + terraform_data.vm[\"backup\"] — created\n"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("root "))
        .unwrap_or_else(|| panic!("no table header: {text}"));
    assert_eq!(
        row, "root        add  change  destroy  import  moved",
        "{text}"
    );
    for raw in ["<details>", "<code>", "&quot;", "|---|", "```", "<!--"] {
        assert!(!text.contains(raw), "{raw} in the terminal text:\n{text}");
    }
    // A local run has no "comment to re-plan" hint.
    assert!(!text.contains("re-plan"), "{text}");
    // Progress, step by step, on stderr only.
    for line in ["planbot: init…", "planbot: plan…", "planbot: show -json…"] {
        assert!(stderr.contains(line), "{line}: {stderr}");
    }
    assert!(stderr.contains("planbot: show -json done in "), "{stderr}");
    assert!(!text.contains("planbot: init"), "{text}");

    // On a real terminal (util-linux `script` gives the command one) the default is text.
    let cmd = format!(
        "{} plan {} --engine {}",
        env!("CARGO_BIN_EXE_planbot"),
        root.path().display(),
        engine_arg
    );
    let tty = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("TMPDIR", tmp.path())
        .output()
        .expect("script (util-linux) runs");
    let screen = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{screen}");
    assert!(
        screen.contains("▸ + terraform_data.vm[\"backup\"]"),
        "{screen}"
    );
    assert!(!screen.contains("<details>"), "{screen}");

    // Piped without --format: Markdown, as before.
    let out = planbot_plan(root.path(), tmp.path(), &["--engine", engine_arg]);
    let note = String::from_utf8_lossy(&out.stdout);
    assert!(note.contains("<details>"), "{note}");
    assert!(!note.contains("re-plan"), "{note}");
}

#[test]
fn an_engine_not_found_names_the_flag_that_chose_it() {
    // `--engine` is how `planbot plan` is told which engine: a misspelt one names the flag, not
    // the service's `engine.binary`.
    let root = quickstart_copy();
    let tmp = tempfile::tempdir().unwrap();
    let out = planbot_plan(root.path(), tmp.path(), &["--engine", "tofuu"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("`tofuu` is not on PATH") && stderr.contains("--engine"),
        "{stderr}"
    );
    assert!(!stderr.contains("engine.binary"), "{stderr}");
}

#[test]
fn help_names_check_config_as_check_repo_configs_earlier_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_planbot"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let line = help
        .lines()
        .find(|l| l.trim_start().starts_with("check-repo-config"))
        .unwrap_or_else(|| panic!("{help}"));
    assert!(
        line.contains("(`check-config`, its earlier name, still works)"),
        "{line}"
    );
}

#[test]
fn a_local_plan_prints_the_whole_plan_unless_asked_for_gitlabs_budget() {
    // Issue 35 item 9: locally there is no GitLab note limit. 2,000 creates with a 40-line input
    // each: a note of about 2.2 million characters, past planbot's note budget (500,000) and
    // GitLab's limit (1,000,000); the engine plans it in about 3 s.
    let engine = require_engine!();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        root.path().join("main.tf"),
        r#"resource "terraform_data" "vm" {
  count = 2000
  input = join("\n", [for l in range(40) : "line ${l} of vm ${count.index}"])
}
"#,
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let engine_arg = engine.to_str().unwrap();
    let plan = |extra: &[&str]| {
        let mut args = vec!["--engine", engine_arg, "--format", "markdown"];
        args.extend_from_slice(extra);
        let out = planbot_plan(root.path(), tmp.path(), &args);
        let note = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}\n{}",
            &note[..2000.min(note.len())],
            String::from_utf8_lossy(&out.stderr)
        );
        note
    };
    let tail = |note: &str| note[note.len().saturating_sub(1500)..].to_string();

    // Without a flag: every resource with its diff, nothing left out.
    let whole = plan(&[]);
    assert!(!whole.contains("left out"), "{}", tail(&whole));
    assert!(
        whole.contains("terraform_data.vm&#91;1999&#93;") && whole.contains("line 39 of vm 1999"),
        "the last resource's diff is missing: {}",
        tail(&whole)
    );

    // `--budget gitlab`: the note GitLab would get, under its limit, with diffs left out.
    let cut = plan(&["--budget", "gitlab"]);
    let (cut_chars, whole_chars) = (cut.chars().count(), whole.chars().count());
    assert!(
        cut_chars <= planbot::core::render::NOTE_BUDGET && whole_chars > 1_000_000,
        "{cut_chars} / {whole_chars} characters"
    );
    assert!(cut.contains("left out"), "{}", tail(&cut));
}
