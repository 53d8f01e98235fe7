//! Test helper: stand-in engine executables (small sh scripts written by the test) for what a
//! real engine cannot be made to do on demand: hang, ignore SIGTERM, dump its environment.
//! This is the only place a shell is used, and only as a fake engine.
#![allow(dead_code)]

use planbot::capabilities::engine::SandboxMode;
use std::path::{Path, PathBuf};

/// No sandbox, for a fake engine that records what it saw into the test's own directory
/// (outside any job's sandbox). These tests are about process supervision and the
/// environment; `tests/it/sandbox.rs` proves the sandbox, and the hanging-engine test here runs
/// sandboxed to show the supervision reaches into it.
pub fn unsandboxed() -> SandboxMode {
    SandboxMode::Off {
        reason: "a fake engine recording into the test's directory".into(),
    }
}

/// Terraform's `version -json`.
pub const TERRAFORM_VERSION_JSON: &str = r#"{"terraform_version":"1.11.4","platform":"linux_amd64","provider_selections":{},"terraform_outdated":false}"#;
/// OpenTofu's `version -json` (same key, no `terraform_outdated`).
pub const TOFU_VERSION_JSON: &str =
    r#"{"terraform_version":"1.10.6","platform":"linux_amd64","provider_selections":{}}"#;

/// A minimal valid `show -json` plan with one create.
pub const PLAN_JSON: &str = r#"{"format_version":"1.2","terraform_version":"1.11.4","resource_changes":[{"address":"terraform_data.fake","mode":"managed","type":"terraform_data","name":"fake","change":{"actions":["create"],"before":null,"after":{"input":"x"},"after_unknown":{"id":true},"before_sensitive":false,"after_sensitive":{}}}],"errored":false}"#;

/// Write an executable `name` in `dir` running `body` (sh) with `$1` = the subcommand.
/// `version` is answered with `version_json` unless the body handles it first.
pub fn fake_engine(dir: &Path, name: &str, version_json: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = version ]; then echo '{version_json}'; exit 0; fi\n{body}\n"
    );
    std::fs::write(&path, script).expect("write fake engine");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// The `-out=FILE` handling of a fake `plan`: writes a dummy plan file.
pub const WRITE_PLAN_FILE: &str =
    r#"for a in "$@"; do case "$a" in -out=*) echo fake-binary-plan > "${a#-out=}";; esac; done"#;

/// Whether process `pid` is gone (or only a zombie nobody reaped yet).
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

/// The live processes (not zombies) whose command line holds `marker`, seen from outside any
/// namespace: a sandboxed engine sees its own pids, which mean nothing here.
pub fn running_with(marker: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(marker) && !process_gone(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// Every entry left in `dir` (recursively listed names), for "nothing left behind" checks.
pub fn leftovers(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            out.push(e.path().display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(leftovers(&e.path()));
            }
        }
    }
    out
}
