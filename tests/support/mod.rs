//! Helpers shared by the integration tests: finding the engine and the shared GitLab fixtures.
#![allow(dead_code)]

pub mod fake_proxmox;

use std::path::PathBuf;

/// The engine binary for tests: `PLANBOT_TEST_ENGINE`, else `tofu`, else `terraform` on PATH.
/// `None` (and a loud message on stderr) when there is none: the caller returns early, skipped.
pub fn engine() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PLANBOT_TEST_ENGINE") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for name in ["tofu", "terraform"] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    eprintln!("\n!!! SKIPPED: no tofu or terraform found (set PLANBOT_TEST_ENGINE): engine tests did not run !!!\n");
    None
}

/// Skip the current test (return early) when no engine is installed.
#[macro_export]
macro_rules! require_engine {
    () => {
        match $crate::support::engine() {
            Some(e) => e,
            None => return,
        }
    };
}

/// `../shared/` beside the repository (CI lays it there), or `PLANBOT_SHARED_DIR`.
pub fn shared_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("PLANBOT_SHARED_DIR") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared")
}

/// A GitLab fixture file, e.g. `gitlab_fixture("webhooks/merge_request_open.json")`.
pub fn gitlab_fixture(rel: &str) -> String {
    let path = shared_dir().join("fixtures/gitlab").join(rel);
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
