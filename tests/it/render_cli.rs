//! `planbot render` through the real binary: JSON and Markdown output, stdin, the fingerprint
//! key, the engine named in the footer, and bad input answered with exit code 2 and one line.

use planbot::core::fingerprint::Fingerprint;
use planbot::core::plan::Plan;
use planbot::core::render::NOTE_MARKER;
use planbot::flows::cli::render::LOCAL_FINGERPRINT_KEY;
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
fn without_a_key_it_uses_the_documented_local_key_without_a_warning() {
    let path = fixture_path("moved");
    let out = planbot(&["render", &path, "--format", "json"], None);
    assert!(out.status.success());
    // A local command is not nagged on every run; docs/workflow.md says what the local key means.
    assert_eq!(text(&out.stderr), "");
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

/// The footer line of a note.
fn footer(note: &str) -> String {
    note.lines()
        .find(|l| l.starts_with("<sub>fingerprint"))
        .unwrap_or_else(|| panic!("no footer in:\n{note}"))
        .to_string()
}

#[test]
fn the_footer_names_the_engine_that_wrote_a_real_plan() {
    let engine = require_engine!();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("main.tf"),
        "resource \"terraform_data\" \"vm\" {\n  input = \"blocky\"\n}\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(&engine)
            .args(args)
            .current_dir(dir.path())
            .env("TF_IN_AUTOMATION", "1")
            .env_remove("TF_CLI_ARGS")
            .env_remove("TF_LOG")
            .output()
            .expect("engine runs");
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        out.stdout
    };
    let version = planbot::capabilities::engine::EngineVersion::from_version_json(
        &run(&["version", "-json"]),
        &engine,
    )
    .expect("version -json");
    run(&["init", "-input=false", "-no-color"]);
    run(&["plan", "-input=false", "-no-color", "-out=plan.bin"]);
    let json = run(&["show", "-json", "plan.bin"]);
    let out = planbot(&["render", "-", "--fingerprint-key", "k"], Some(&json));
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Terraform (≥ 1.8) writes `applyable`/`complete`; OpenTofu (≥ 1.8) has neither beside its
    // `timestamp`. Either way the footer says which one, as `planbot plan` would (last: a
    // local render has no "comment to re-plan" hint after it).
    assert!(
        footer(&text(&out.stdout)).contains(&format!(" · {version}</sub>")),
        "{version}: {}",
        footer(&text(&out.stdout))
    );
}

#[test]
fn an_opentofu_plan_says_opentofu_and_unsure_stays_neutral() {
    // OpenTofu's shape: providers from its registry, no `applyable`/`complete`.
    let drift = fixture_path("drift");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&drift).unwrap()).unwrap();
    assert!(json.get("applyable").is_none());
    let out = planbot(&["render", &drift, "--fingerprint-key", "k"], None);
    assert!(footer(&text(&out.stdout)).contains(" · OpenTofu 1.10.6</sub>"));

    // Terraform's own output, reshaped as OpenTofu writes it (no `applyable`/`complete`, a
    // `timestamp`): OpenTofu, also with only built-in providers.
    let mut tf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture_path("changes")).unwrap()).unwrap();
    let out = planbot(
        &["render", "-", "--fingerprint-key", "k"],
        Some(tf.to_string().as_bytes()),
    );
    assert!(footer(&text(&out.stdout)).contains(" · Terraform 1.11.4</sub>"));
    let obj = tf.as_object_mut().unwrap();
    obj.remove("applyable");
    obj.remove("complete");
    assert!(obj.contains_key("timestamp"));
    let tofu_shaped = tf.to_string();
    let out = planbot(
        &["render", "-", "--fingerprint-key", "k"],
        Some(tofu_shaped.as_bytes()),
    );
    assert!(footer(&text(&out.stdout)).contains(" · OpenTofu 1.11.4</sub>"));

    // `--engine-name` wins over what the document seems to say.
    let out = planbot(
        &[
            "render",
            "-",
            "--fingerprint-key",
            "k",
            "--engine-name",
            "terraform",
        ],
        Some(tofu_shaped.as_bytes()),
    );
    assert!(footer(&text(&out.stdout)).contains(" · Terraform 1.11.4</sub>"));

    // Evidence both ways (hand-made: Terraform's fields and OpenTofu's registry): neutral.
    let mixed = fixture_path("bpg/seed_talos_raw_xz_decompress");
    let out = planbot(&["render", &mixed, "--fingerprint-key", "k"], None);
    let f = footer(&text(&out.stdout));
    assert!(f.contains(" · engine 1.10.6</sub>"), "{f}");
    let out = planbot(
        &[
            "render",
            &mixed,
            "--fingerprint-key",
            "k",
            "--engine-name",
            "tofu",
        ],
        None,
    );
    assert!(footer(&text(&out.stdout)).contains(" · OpenTofu 1.10.6</sub>"));

    let out = planbot(&["render", &mixed, "--engine-name", "pulumi"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("possible values: tofu, terraform"));
}

#[test]
fn a_local_render_has_no_hint_to_comment_on_a_merge_request() {
    let out = planbot(&["render", &fixture_path("changes")], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let note = text(&out.stdout);
    assert!(note.contains("plan for a local run"), "{note}");
    assert!(!note.contains("planbot plan`"), "{note}");
    assert!(!note.contains("re-plan"), "{note}");
}

#[test]
fn a_binary_plan_file_is_named_as_such_with_what_to_run() {
    let dir = tempfile::tempdir().unwrap();
    // What `tofu plan -out=plan.tfplan` writes: a zip archive.
    let planfile = dir.path().join("plan.tfplan");
    std::fs::write(&planfile, b"PK\x03\x04\x14\x00\x08\x00tfplan...").unwrap();
    let out = planbot(&["render", planfile.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("is a binary plan file"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "tofu show -json {} > plan.json && planbot render plan.json",
            planfile.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("planbot plan DIR"), "{stderr}");
    assert!(out.stdout.is_empty());
}

/// `planbot ARGS` with stdout on a terminal (a pseudo-terminal made by `script`).
fn planbot_on_a_terminal(args: &[&str]) -> String {
    let command = std::iter::once(env!("CARGO_BIN_EXE_planbot"))
        .chain(args.iter().copied())
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("script")
        .args(["--quiet", "--return", "--command", &command, "/dev/null"])
        .env_remove("PLANBOT_FINGERPRINT_KEY")
        .stdin(Stdio::null())
        .output()
        .expect("`script` (util-linux) runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn render_and_plan_print_the_same_format_by_default_text_on_a_terminal_markdown_when_piped() {
    let path = fixture_path("changes");
    let piped = text(&planbot(&["render", &path], None).stdout);
    assert!(piped.starts_with(NOTE_MARKER), "{piped}");
    let on_terminal = planbot_on_a_terminal(&["render", &path]);
    let as_text = text(&planbot(&["render", &path, "--format", "text"], None).stdout);
    assert!(!on_terminal.contains(NOTE_MARKER), "{on_terminal}");
    assert_eq!(
        on_terminal.replace("\r\n", "\n").trim_end(),
        as_text.trim_end(),
        "on a terminal, render prints what --format text prints"
    );
    // `planbot plan --help` documents the same default.
    let help = text(&planbot(&["plan", "--help"], None).stdout);
    assert!(
        help.contains("Default: `text` on a terminal, `markdown` when piped"),
        "{help}"
    );
}

/// The entries (`  NAME  description`) of the `Arguments:` and `Options:` sections of a help text.
fn help_entries(help: &str) -> Vec<(String, String)> {
    let mut entries: Vec<(String, String)> = Vec::new();
    let mut in_list = false;
    for line in help.lines() {
        if line == "Arguments:" || line == "Options:" {
            in_list = true;
            continue;
        }
        if !line.starts_with(' ') {
            in_list = false;
            continue;
        }
        if !in_list {
            continue;
        }
        let trimmed = line.trim_start();
        // clap's notes below a description in the long layout (`[default: …]`, `[env: …]`)
        // belong to the argument above, they are not one.
        let note = ["[default:", "[env:", "[possible values:", "[aliases:"]
            .iter()
            .any(|n| trimmed.starts_with(n));
        if !note
            && (trimmed.starts_with('-') || trimmed.starts_with('<') || trimmed.starts_with('['))
        {
            // An argument (`<DIR>`, `--engine <ENGINE>`, `-h, --help`), maybe with its text.
            let (name, rest) = trimmed.split_once("  ").unwrap_or((trimmed, ""));
            entries.push((name.to_string(), rest.trim().to_string()));
        } else if let Some(last) = entries.last_mut() {
            // Its description on the lines below (clap's layout for long help texts).
            if last.1.is_empty() {
                last.1 = trimmed.to_string();
            }
        }
    }
    entries
}

#[test]
fn every_argument_of_every_command_has_a_description_in_help() {
    let top = text(&planbot(&["--help"], None).stdout);
    let mut commands: Vec<Vec<&str>> = Vec::new();
    let mut in_commands = false;
    for line in top.lines() {
        if line == "Commands:" {
            in_commands = true;
            continue;
        }
        if in_commands {
            match line.split_whitespace().next() {
                Some(name) if line.starts_with("  ") && name != "help" => commands.push(vec![name]),
                _ if !line.starts_with(' ') => in_commands = false,
                _ => {}
            }
        }
    }
    assert!(commands.len() >= 7, "{top}");
    commands.push(vec!["store", "migrate"]);
    let mut undocumented = Vec::new();
    for command in &commands {
        let mut args = command.clone();
        args.push("--help");
        let out = planbot(&args, None);
        let help = text(&out.stdout);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let entries = help_entries(&help);
        assert!(!entries.is_empty(), "{args:?}:\n{help}");
        for (name, description) in entries {
            if description.is_empty() {
                undocumented.push(format!("planbot {} {name}", command.join(" ")));
            }
        }
    }
    assert!(
        undocumented.is_empty(),
        "arguments without a description in --help: {undocumented:?}"
    );
}

/// A plan of `n` updates whose diffs together are far past GitLab's note budget.
fn plan_past_the_note_budget(n: usize) -> String {
    let text = |w: &str| {
        (0..40)
            .map(|l| format!("{w} line {l} of the cloud-init file\n"))
            .collect::<String>()
    };
    let changes: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "address": format!("terraform_data.vm[{i}]"), "mode": "managed",
                "type": "terraform_data", "name": "vm", "index": i,
                "change": {"actions": ["update"],
                    "before": {"id": format!("id-{i}"), "input": {"user_data": text("old")}},
                    "after": {"id": format!("id-{i}"), "input": {"user_data": text("new")}},
                    "after_unknown": {}, "before_sensitive": {}, "after_sensitive": {}}
            })
        })
        .collect();
    serde_json::json!({"format_version": "1.2", "resource_changes": changes}).to_string()
}

#[test]
fn a_local_render_prints_the_whole_plan_unless_asked_for_gitlabs_budget() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big-plan.json");
    std::fs::write(&file, plan_past_the_note_budget(8000)).unwrap();
    let file_arg = file.to_str().unwrap();
    // Locally: every resource, nothing left out.
    let whole = text(&planbot(&["render", file_arg, "--format", "markdown"], None).stdout);
    assert!(
        !whole.contains("left out**"),
        "{}",
        &whole[..2000.min(whole.len())]
    );
    // In Markdown an address's brackets are entities (no link forms from a value).
    assert!(whole.contains("terraform_data.vm&#91;7999&#93;"));
    // `--budget gitlab`: the note GitLab would get, and the hint names the file given.
    let cut = text(
        &planbot(
            &[
                "render", file_arg, "--format", "markdown", "--budget", "gitlab",
            ],
            None,
        )
        .stdout,
    );
    // Under GitLab's note limit (1,000,000 characters), the whole plan is not.
    let (cut_chars, whole_chars) = (cut.chars().count(), whole.chars().count());
    assert!(
        cut_chars < 1_000_000 && whole_chars > 1_000_000,
        "{cut_chars} / {whole_chars} characters"
    );
    assert!(
        cut.contains("left out**"),
        "the plan is not past the budget"
    );
    assert!(
        cut.contains(&format!("full plan (`planbot render {file_arg}`)")),
        "{}",
        &cut[cut.len().saturating_sub(800)..]
    );
}

/// A plan whose one sensitive value is `secret`: a password on one resource.
fn plan_with_sensitive(secret: &str) -> String {
    serde_json::json!({"format_version": "1.2", "resource_changes": [{
        "address": "terraform_data.vm", "mode": "managed", "type": "terraform_data",
        "name": "vm",
        "change": {"actions": ["create"], "before": null,
            "after": {"input": {"password": secret, "cores": 2}},
            "after_unknown": {}, "before_sensitive": false,
            "after_sensitive": {"input": {"password": true}}}
    }]})
    .to_string()
}

/// `--format json` stays JSON whatever a secret is: scrubbing the report's text hit its
/// `false` and `null` too (a sensitive `false` printed `"errored": (sensitive value)`).
#[test]
fn the_json_report_stays_json_whatever_the_secret_reads_as() {
    for secret in ["false", "null", "true", "\"terraform_data.vm\","] {
        let out = planbot(
            &["render", "-", "--format", "json"],
            Some(plan_with_sensitive(secret).as_bytes()),
        );
        assert!(out.status.success(), "{secret}: {}", text(&out.stderr));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{secret}: {e}: {}", text(&out.stdout)));
        assert_eq!(report["errored"], false, "{secret}");
        assert_eq!(report["summary"]["add"], 1, "{secret}");
        assert_eq!(
            report["resources"][0]["address"], "terraform_data.vm",
            "{secret}"
        );
        assert!(report["resources"][0]["previous_address"].is_null());
    }
}

/// The note of a local render is written as it is rendered (never held whole): a reader that
/// stops reading part way gets planbot's one line on stderr and a failed exit, not a panic,
/// and the part it did read is the note's beginning.
#[test]
fn a_reader_that_stops_reading_a_streamed_note_gets_one_line_and_a_failed_exit() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big-plan.json");
    std::fs::write(&file, plan_past_the_note_budget(3000)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args(["render", file.to_str().unwrap(), "--format", "markdown"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("planbot runs");
    let mut head = vec![0; 4096];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut head).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(text(&head).starts_with(NOTE_MARKER), "{}", text(&head));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot write to stdout") && stderr.contains("Broken pipe"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// A plan in a `format_version` newer than planbot knows is read as tolerantly as any, and the
/// note (and the terminal's text) say that what is new in it is not shown (issue 43: it used to
/// render silently).
#[test]
fn a_plan_of_a_newer_format_version_is_said_in_the_note_and_on_the_terminal() {
    let plan = std::fs::read_to_string(fixture_path("changes")).unwrap();
    let (known, newer) = (r#""format_version":"1.2""#, r#""format_version":"1.3""#);
    let compact = plan.replace(r#""format_version": "1.2""#, known);
    assert!(compact.contains(known), "the fixture is of format 1.2");
    let said = "The plan of `.` is in format `1.3`, newer than planbot knows (up to 1.2): what is new in it is not shown. Update planbot to read all of it.";
    for format in ["markdown", "text"] {
        let args = ["render", "-", "--fingerprint-key", "k", "--format", format];
        let out = planbot(&args, Some(compact.replace(known, newer).as_bytes()));
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains(said),
            "{format}: {}",
            text(&out.stdout)
        );
        let out = planbot(&args, Some(compact.as_bytes()));
        assert!(
            !text(&out.stdout).contains("newer than planbot knows"),
            "{format}"
        );
    }
}

/// Every resource section of a note shows its own diff, whether the diffs are computed beside
/// the render (a local render: no budget) or before it (`--budget gitlab`, where the note
/// fits): 600 updates, moves (no diff) between them, and drift sections after them.
#[test]
fn every_section_shows_its_own_diff_with_and_without_a_budget() {
    let change = |address: String, actions: &[&str], before: &str, after: &str| {
        serde_json::json!({
            "address": address, "mode": "managed", "type": "terraform_data", "name": "vm",
            "change": {"actions": actions,
                "before": {"input": before}, "after": {"input": after},
                "after_unknown": {}, "before_sensitive": {}, "after_sensitive": {}}
        })
    };
    let mut changes = Vec::new();
    for i in 0..600 {
        changes.push(change(
            format!("terraform_data.vm[{i}]"),
            &["update"],
            &format!("old-{i}"),
            &format!("new-{i}"),
        ));
        if i % 7 == 3 {
            let mut moved = change(
                format!("terraform_data.moved[{i}]"),
                &["no-op"],
                "same",
                "same",
            );
            moved["previous_address"] = format!("terraform_data.was[{i}]").into();
            changes.push(moved);
        }
    }
    let drift: Vec<_> = (0..40)
        .map(|j| {
            change(
                format!("terraform_data.drifted[{j}]"),
                &["update"],
                &format!("was-{j}"),
                &format!("now-{j}"),
            )
        })
        .collect();
    let plan = serde_json::json!({
        "format_version": "1.2", "resource_changes": changes, "resource_drift": drift,
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plan.json");
    std::fs::write(&file, plan.to_string()).unwrap();
    let file_arg = file.to_str().unwrap();
    for budget in [&[][..], &["--budget", "gitlab"][..]] {
        let args = [&["render", file_arg, "--format", "markdown"][..], budget].concat();
        let note = text(&planbot(&args, None).stdout);
        let (mut updated, mut moved, mut drifted) = (0, 0, 0);
        for section in note.split("<details><summary>").skip(1) {
            let summary = section.lines().next().unwrap_or_default();
            let index = |name: &str| -> Option<String> {
                let start = summary.find(&format!("terraform_data.{name}&#91;"))?;
                let rest = &summary[start + name.len() + 20..];
                Some(rest[..rest.find("&#93;")?].to_string())
            };
            if let Some(i) = index("vm") {
                assert!(
                    section.contains(&format!("~ input = \"old-{i}\" -> \"new-{i}\"")),
                    "{budget:?}: the section of vm[{i}] shows another diff:\n{section}"
                );
                updated += 1;
            } else if let Some(i) = index("moved") {
                assert!(
                    !section.contains("```diff"),
                    "{budget:?}: moved[{i}] has no diff:\n{section}"
                );
                moved += 1;
            } else if let Some(j) = index("drifted") {
                assert!(
                    section.contains(&format!("~ input = \"was-{j}\" -> \"now-{j}\"")),
                    "{budget:?}: the section of drifted[{j}] shows another diff:\n{section}"
                );
                drifted += 1;
            }
        }
        assert_eq!((updated, moved, drifted), (600, 86, 40), "{budget:?}");
    }
}
