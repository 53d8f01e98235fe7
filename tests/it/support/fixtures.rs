//! The files under `tests/fixtures/`, read one way for every story: a panic names the file.

use planbot::core::plan::Plan;
use std::path::PathBuf;

/// The path of `rel` under `tests/fixtures/`.
pub fn path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// The text of `tests/fixtures/<rel>`.
pub fn text(rel: &str) -> String {
    let p = path(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

/// The plan of `tests/fixtures/plans/<name>.json`.
pub fn plan(name: &str) -> Plan {
    let p = path(&format!("plans/{name}.json"));
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()));
    Plan::from_json(&bytes).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}
