//! `data.planbot`: what planbot found on the plan, for policies that turn a finding into a
//! blocker (`deny contains msg if { some f in data.planbot.findings; f.rule == "PVE008" … }`).
//!
//! The shape (documented in docs/policies.md, kept stable):
//! `{"root": "core", "findings": [{"rule", "severity", "title", "address", "message", "fix"}]}`,
//! and `"capacity"` (`core::proxmox::capacity::Capacity`) when the Proxmox preflight read it.

use crate::core::proxmox::findings::{self, Finding};
use serde_json::{json, Value};

/// The `data.planbot` object for one root's plan.
pub fn planbot_data(found: &[Finding], root: &str) -> Value {
    planbot_data_with(found, root, None)
}

/// [`planbot_data`] with what the plan takes from the cluster (`data.planbot.capacity`).
pub fn planbot_data_with(found: &[Finding], root: &str, capacity: Option<&Value>) -> Value {
    let findings: Vec<Value> = found
        .iter()
        .map(|f| {
            json!({
                "rule": f.rule,
                "severity": f.severity.as_str(),
                "title": findings::rule(f.rule).map_or("", |r| r.title),
                "address": f.address,
                "message": f.message,
                "fix": f.fix,
            })
        })
        .collect();
    let mut data = json!({ "root": root, "findings": findings });
    if let Some(c) = capacity {
        data["capacity"] = c.clone();
    }
    data
}
