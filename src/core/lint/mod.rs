//! Proxmox lint rules over the plan model: one function per rule, collected in one table.

use serde::Serialize;

/// How bad a finding is. Errors fail the commit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
    Info,
}

/// One rule firing on one resource (or on the whole plan when `address` is empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub rule: &'static str,
    pub severity: Severity,
    pub address: String,
    pub message: String,
    /// What to do, ready to paste where possible.
    pub fix: String,
}

/// Run every rule not in `disabled` over `plan`; findings sorted errors first.
/// (The rule table lands with issue 5; until then no rule fires.)
pub fn lint(plan: &crate::core::plan::Plan, disabled: &[String]) -> Vec<Finding> {
    let _ = (plan, disabled);
    Vec::new()
}
