//! `planbot check-repo-config FILE` through the real binary: a valid file lists its roots, an invalid
//! one names the line and key and exits 1; plus the MR-note texts for a broken or changed config.

use planbot::core::repo_config::{render_error_note, render_preview, RepoConfig};
use std::process::Command;

fn check_config(content: &str) -> (i32, String, String) {
    check_config_as("check-repo-config", content)
}

/// The command under one of its names (`check-config` is its earlier one), in a repository
/// that holds every directory a `dir = "…"` line of `content` names.
fn check_config_as(command: &str, content: &str) -> (i32, String, String) {
    let dirs: Vec<&str> = content
        .lines()
        .filter_map(|l| l.trim().strip_prefix("dir = \""))
        .filter_map(|l| l.split('"').next())
        .collect();
    check_config_in(command, content, &dirs)
}

/// The command in a repository holding `dirs` (and nothing else) beside the file.
fn check_config_in(command: &str, content: &str, dirs: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    for d in dirs {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    std::fs::write(dir.path().join(".planbot.toml"), content).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args([command, ".planbot.toml"])
        .current_dir(dir.path())
        .env_clear()
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const DESIGN_EXAMPLE: &str = r#"[[roots]]
name = "core"
dir = "tofu/stacks/core"
when_modified = ["*.tf", "*.tofu", "*.tfvars", "../../modules/**"]   # relative to dir
var_files = ["terraform.tfvars"]
workspace = "default"

[[roots]]
name = "dns"
dir = "tofu/stacks/dns"
lint_disable = ["PVE003"]
checks = { fmt = false, test = false }

[plan]
checkout = "merge"
fork_mrs = "comment"
"#;

#[test]
fn a_valid_file_prints_its_roots_and_exits_0() {
    let (code, stdout, stderr) = check_config(DESIGN_EXAMPLE);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    insta::assert_snapshot!("check_config_valid", stdout);
}

#[test]
fn the_earlier_name_check_config_still_works() {
    let (code, stdout, stderr) = check_config_as("check-config", DESIGN_EXAMPLE);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, check_config(DESIGN_EXAMPLE).1);
    let (code, _, stderr) = check_config_as("check-config", "[[roots]]\nname = 1\n");
    assert_eq!(code, 1);
    assert!(stderr.contains("check-repo-config"), "{stderr}");
}

#[test]
fn an_unknown_key_is_named_with_its_line_and_exits_1() {
    let (code, stdout, stderr) = check_config(
        "[[roots]]\nname = \"core\"\ndir = \"tofu/stacks/core\"\nwhen_modifed = [\"*.tf\"]\n",
    );
    assert_eq!(code, 1);
    assert!(stdout.is_empty());
    assert!(stderr.contains("line 4"), "{stderr}");
    assert!(stderr.contains("`roots[0].when_modifed`"), "{stderr}");
    insta::assert_snapshot!("check_config_unknown_key", stderr);
}

#[test]
fn every_validation_problem_is_listed_at_once() {
    let (code, _, stderr) = check_config(
        "[[roots]]\nname = \"core\"\ndir = \"../elsewhere\"\n\n[[roots]]\nname = \"core\"\nwhen_modified = [\"{a,b\"]\n",
    );
    assert_eq!(code, 1);
    insta::assert_snapshot!("check_config_validation", stderr);
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args(["check-repo-config", "nope.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot read nope.toml"), "{stderr}");
}

#[test]
fn the_mr_note_says_what_is_wrong_with_the_default_branchs_config() {
    let err = RepoConfig::parse("[plan]\ncheckout = \"rebase\"\n").unwrap_err();
    insta::assert_snapshot!("repo_config_error_note", render_error_note("main", &err));
}

#[test]
fn an_mr_that_changes_the_config_gets_a_preview_valid_or_not() {
    let ok = RepoConfig::parse(DESIGN_EXAMPLE);
    insta::assert_snapshot!("repo_config_preview_valid", render_preview(&ok, "main"));
    let bad = RepoConfig::parse("[[roots]]\nname = \"a b\"\n");
    insta::assert_snapshot!("repo_config_preview_invalid", render_preview(&bad, "main"));
}

#[test]
fn a_rule_id_planbot_does_not_have_is_refused_with_the_nearest_real_one() {
    let text = "[lint]\ndisable = [\"PVE999\", \"PVE010\"]\n\n[[roots]]\nname = \"core\"\ndir = \"tofu\"\nlint_disable = [\"PVE01\"]\n";
    let (code, stdout, stderr) = check_config(text);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stderr.contains("line 2, column 12: key `lint.disable`: `PVE999` is not a rule planbot has (did you mean `PVE009`?)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("line 7, column 17: key `roots[0].lint_disable`: `PVE01` is not a rule planbot has (did you mean `PVE001`?)"),
        "{stderr}"
    );
    // The default branch's note says the same.
    let note = render_error_note("main", &RepoConfig::parse(text).unwrap_err());
    assert!(
        note.contains("`PVE999` is not a rule planbot has (did you mean `PVE009`?)"),
        "{note}"
    );
}

/// Issue 35 item 11: one run names every problem, the unknown key with the rest (it used to
/// stop at the unknown key and show the others only on the next run).
#[test]
fn one_run_reports_the_unknown_key_and_every_other_problem() {
    let (code, _, stderr) = check_config(
        "[[roots]]\nname = \"core\"\nwhen_modifed = [\"*.tf\"]\nlint_disable = [\"PVE999\"]\n\n[[roots]]\nname = \"core\"\ndir = \"dns\"\n",
    );
    assert_eq!(code, 1, "{stderr}");
    for problem in [
        "line 3, column 1: key `roots[0].when_modifed`: unknown key `when_modifed`",
        "line 4, column 17: key `roots[0].lint_disable`: `PVE999` is not a rule planbot has",
        "line 7, column 8: key `roots[1].name`: root name `core` is used twice",
    ] {
        assert!(
            stderr.contains(problem),
            "{problem} missing from:\n{stderr}"
        );
    }
}

#[test]
fn depends_on_prints_the_order_and_a_circle_or_an_unknown_name_is_an_error_at_its_line() {
    let valid = "[[roots]]\nname = \"dns\"\ndir = \"dns\"\ndepends_on = [\"vms\"]\n\n[[roots]]\nname = \"network\"\ndir = \"network\"\n\n[[roots]]\nname = \"vms\"\ndir = \"vms\"\ndepends_on = [\"network\"]\n\n[[roots]]\nname = \"storage\"\ndir = \"storage\"\n";
    let (code, stdout, stderr) = check_config(valid);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("order: network and storage, then vms, then dns"),
        "{stdout}"
    );
    insta::assert_snapshot!("check_config_depends_on", stdout);

    let circle = "[[roots]]\nname = \"network\"\ndir = \"network\"\ndepends_on = [\"dns\"]\n\n[[roots]]\nname = \"vms\"\ndir = \"vms\"\ndepends_on = [\"network\"]\n\n[[roots]]\nname = \"dns\"\ndir = \"dns\"\ndepends_on = [\"vms\", \"netwrok\"]\n";
    let (code, stdout, stderr) = check_config(circle);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("line 4, column 15: key `roots[0].depends_on`: the roots depend on each other in a circle: `network` → `dns` → `vms` → `network`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("line 14, column 22: key `roots[2].depends_on`: no root is named `netwrok` (did you mean `network`?)"),
        "{stderr}"
    );
    insta::assert_snapshot!("check_config_depends_on_errors", stderr);
}

/// A root whose directory is not in the repository (a typo beside the real one) is an error at
/// its line, with the directory meant; the file is otherwise valid.
#[test]
fn a_root_directory_the_repository_does_not_have_is_an_error_with_the_one_meant() {
    let config = "[[roots]]\nname = \"network\"\ndir = \"stacks/nework\"\n\n[[roots]]\nname = \"top\"\ndir = \".\"\n";
    let (code, stdout, stderr) = check_config_in(
        "check-repo-config",
        config,
        &["stacks/network", "stacks/vms", "modules/vm"],
    );
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stderr.contains("line 3, column 7: key `roots[0].dir`: the directory `stacks/nework` does not exist on this branch (did you mean `stacks/network`?)"),
        "{stderr}"
    );
    // With the directory there, the same file is valid.
    let (code, _, stderr) = check_config_in("check-repo-config", config, &["stacks/nework"]);
    assert_eq!(code, 0, "{stderr}");
}
