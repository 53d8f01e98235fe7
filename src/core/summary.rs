//! The plan summary: counts exactly as OpenTofu's own summary line, plus the JSON report shape.

use crate::core::plan::{ActionKind, Plan};
use crate::core::proxmox::findings::Finding;
use serde::Serialize;

/// Counts over managed `resource_changes`: the note's table and the JSON report's `summary`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub add: usize,
    pub change: usize,
    pub destroy: usize,
    pub replace: usize,
    pub import: usize,
    #[serde(rename = "move")]
    pub moved: usize,
    pub forget: usize,
}

impl Summary {
    pub fn of(plan: &Plan) -> Summary {
        let mut s = Summary::default();
        for rc in plan.managed_changes() {
            let actions = &rc.change.actions;
            let has = |a: &str| actions.iter().any(|x| x == a);
            if has("create") {
                s.add += 1;
            }
            if has("delete") {
                s.destroy += 1;
            }
            match rc.kind() {
                ActionKind::Update => s.change += 1,
                k if k.is_replace() => s.replace += 1,
                _ => {}
            }
            if rc.is_import() {
                s.import += 1;
            }
            if rc.is_move() {
                s.moved += 1;
            }
            if has("forget") {
                s.forget += 1;
            }
        }
        s
    }

    /// True when nothing at all would change in resources.
    pub fn is_empty(&self) -> bool {
        *self == Summary::default()
    }

    /// One line for commit statuses and headlines: "2 to add, 1 to change, 1 to destroy".
    pub fn one_line(&self) -> String {
        let mut parts = Vec::new();
        let mut push = |n: usize, what: &str| {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        };
        push(self.import, "to import");
        push(self.add, "to add");
        push(self.change, "to change");
        push(self.destroy, "to destroy");
        push(self.moved, "moved");
        push(self.forget, "to forget");
        if parts.is_empty() {
            "no changes".to_string()
        } else {
            parts.join(", ")
        }
    }
}

/// One resource in the JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct ResourceReport {
    pub address: String,
    pub previous_address: Option<String>,
    pub actions: Vec<String>,
    pub action_reason: Option<String>,
}

/// The `--format json` report (its shape: docs/workflow.md, "Render a plan without GitLab").
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    pub summary: Summary,
    pub errored: bool,
    pub fingerprint: String,
    pub resources: Vec<ResourceReport>,
    pub findings: Vec<Finding>,
}

impl PlanReport {
    pub fn new(plan: &Plan, fingerprint: String, findings: Vec<Finding>) -> PlanReport {
        let resources = plan
            .managed_changes()
            .filter(|rc| rc.has_change())
            .map(|rc| ResourceReport {
                address: rc.address.clone(),
                previous_address: rc.previous_address.clone(),
                actions: rc.change.actions.clone(),
                action_reason: rc.action_reason.clone(),
            })
            .collect();
        PlanReport {
            summary: Summary::of(plan),
            errored: plan.errored,
            fingerprint,
            resources,
            findings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(json: &str) -> Plan {
        Plan::from_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn counts_like_the_engine_summary_line() {
        let p = plan(
            r#"{"format_version":"1.2","resource_changes":[
          {"address":"a.create","mode":"managed","change":{"actions":["create"]}},
          {"address":"a.update","mode":"managed","change":{"actions":["update"]}},
          {"address":"a.replace","mode":"managed","change":{"actions":["delete","create"]}},
          {"address":"a.cbd","mode":"managed","change":{"actions":["create","delete"]}},
          {"address":"a.delete","mode":"managed","change":{"actions":["delete"]}},
          {"address":"a.forget","mode":"managed","change":{"actions":["forget"]}},
          {"address":"a.fc","mode":"managed","change":{"actions":["forget","create"]}},
          {"address":"a.imp","mode":"managed","change":{"actions":["no-op"],"importing":{"id":"x"}}},
          {"address":"a.noimp","mode":"managed","change":{"actions":["no-op"],"importing":null}},
          {"address":"a.new","previous_address":"a.old","mode":"managed","change":{"actions":["no-op"]}},
          {"address":"a.same","previous_address":"a.same","mode":"managed","change":{"actions":["no-op"]}},
          {"address":"data.x.y","mode":"data","change":{"actions":["read"]}},
          {"address":"data.x.z","mode":"data","change":{"actions":["create"]}},
          {"address":"e.x","mode":"ephemeral","change":{"actions":["create"]}}
        ]}"#,
        );
        let s = Summary::of(&p);
        assert_eq!(
            s,
            Summary {
                add: 4,
                change: 1,
                destroy: 3,
                replace: 2,
                import: 1,
                moved: 1,
                forget: 2
            }
        );
        assert_eq!(
            s.one_line(),
            "1 to import, 4 to add, 1 to change, 3 to destroy, 1 moved, 2 to forget"
        );
    }

    #[test]
    fn an_empty_plan_says_no_changes() {
        let s = Summary::of(&plan(r#"{"format_version":"0.1","resource_changes":[]}"#));
        assert!(s.is_empty());
        assert_eq!(s.one_line(), "no changes");
    }
}
