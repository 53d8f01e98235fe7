//! Helpers shared by the integration tests: finding the engine and the shared GitLab fixtures.
#![allow(dead_code)]

pub mod fake_proxmox;

use std::path::PathBuf;

/// The engine binary for tests: `PLANBOT_TEST_ENGINE`, else `tofu`, else `terraform` on PATH.
///
/// Without one the calling test **fails** (it never passes without running): install OpenTofu
/// or Terraform, or point `PLANBOT_TEST_ENGINE` at one.
pub fn engine() -> PathBuf {
    if let Some(p) = std::env::var_os("PLANBOT_TEST_ENGINE") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "PLANBOT_TEST_ENGINE={} is not a file: this engine test cannot run",
            p.display()
        );
        return p;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["tofu", "terraform"] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "no tofu or terraform on PATH and PLANBOT_TEST_ENGINE is not set: this engine test \
         cannot run (install OpenTofu or Terraform, or set PLANBOT_TEST_ENGINE)"
    );
}

/// The engine binary of an engine test; the test fails when there is none (see [`engine`]).
#[macro_export]
macro_rules! require_engine {
    () => {
        $crate::support::engine()
    };
}

/// A GitLab fixture file from `tests/fixtures/gitlab/` (copied from GitLab's docs, see its
/// README), e.g. `gitlab_fixture("webhooks/merge_request_open.json")`.
pub fn gitlab_fixture(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gitlab")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

pub mod fake_gitlab;

/// Processes whose working directory lies under `dir`: the engine a SIGKILLed planbot left
/// behind, which a crash test must stop itself (nothing else would).
pub fn processes_under(dir: &std::path::Path) -> Vec<i32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if std::fs::read_link(e.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir)) {
            pids.push(pid);
        }
    }
    pids
}
