//! Proxmox HA in the preflight (PVE112, PVE113), the pure half: which guests the plan moves to
//! another node, what `GET /cluster/ha/resources` and the placement of PVE 8 (HA groups,
//! `GET /cluster/ha/groups`) or PVE 9 (node-affinity rules, `GET /cluster/ha/rules`) say about
//! them, and the findings.

use crate::core::proxmox::findings::{finding_with, Finding, Severity};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A guest the plan moves to another node in place (`node_name` changes on an update).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaMove {
    pub address: String,
    /// The HA service id (`vm:105`, `ct:120`).
    pub sid: String,
    pub vmid: u64,
    pub from: String,
    pub to: String,
}

/// Where HA may run a resource: a PVE 8 group or a PVE 9 node-affinity rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// `group` or `rule`.
    pub kind: &'static str,
    pub name: String,
    pub nodes: Vec<String>,
    /// A restricted group / strict rule: HA runs the resource only on `nodes`.
    pub strict: bool,
}

/// What the HA reads said: the HA-managed service ids, each with its placement (if any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HaFacts {
    pub resources: BTreeMap<String, Option<Placement>>,
}

fn nodes_of(v: &Value) -> Vec<String> {
    // `pve01:2,pve02` (a node with an optional priority).
    v.as_str()
        .unwrap_or_default()
        .split(',')
        .map(|n| n.split(':').next().unwrap_or_default().trim().to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

fn flag(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0) != 0,
        Some(Value::String(s)) => !matches!(s.as_str(), "" | "0"),
        _ => false,
    }
}

/// The HA facts from `GET /cluster/ha/resources` and, on PVE 9, `GET /cluster/ha/rules`
/// (`placement` = the rules) or, before, `GET /cluster/ha/groups` (`placement` = the groups).
pub fn ha_facts(resources: &[Value], placement: &[Value], pve9: bool) -> HaFacts {
    let mut out = HaFacts::default();
    for r in resources {
        let Some(sid) = r.get("sid").and_then(Value::as_str) else {
            continue;
        };
        let place = if pve9 {
            placement
                .iter()
                .filter(|rule| rule.get("type").and_then(Value::as_str) == Some("node-affinity"))
                .filter(|rule| !flag(rule.get("disable")))
                .find(|rule| {
                    rule.get("resources")
                        .and_then(Value::as_str)
                        .is_some_and(|list| list.split(',').any(|s| s.trim() == sid))
                })
                .map(|rule| Placement {
                    kind: "rule",
                    name: rule
                        .get("rule")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .into(),
                    nodes: nodes_of(rule.get("nodes").unwrap_or(&Value::Null)),
                    strict: flag(rule.get("strict")),
                })
        } else {
            r.get("group").and_then(Value::as_str).and_then(|g| {
                let group = placement
                    .iter()
                    .find(|x| x.get("group").and_then(Value::as_str) == Some(g))?;
                Some(Placement {
                    kind: "group",
                    name: g.into(),
                    nodes: nodes_of(group.get("nodes").unwrap_or(&Value::Null)),
                    strict: flag(group.get("restricted")),
                })
            })
        };
        out.resources.insert(sid.to_string(), place);
    }
    out
}

/// PVE112: a guest the plan moves to another node must move through HA when HA manages it.
/// `ha` is what the reads said, or why they were refused (then each move gets a warning that the
/// check could not run: never silence).
pub fn pve112(moves: &[HaMove], ha: Option<&Result<HaFacts, String>>, token: &str) -> Vec<Finding> {
    let Some(ha) = ha else { return Vec::new() };
    let mut out = Vec::new();
    for m in moves {
        let base = json!({"sid": m.sid, "vmid": m.vmid, "from": m.from, "to": m.to});
        let (severity, mut d) = match ha {
            Err(why) => (
                Severity::Warning,
                json!({"unread": why, "token": token,
                       "user": crate::core::proxmox::access::token_user(token)}),
            ),
            Ok(facts) => match facts.resources.get(&m.sid) {
                None => continue,
                Some(None) => (Severity::Warning, json!({})),
                Some(Some(p)) => {
                    let allowed = p.nodes.iter().any(|n| n == &m.to);
                    let severity = if !allowed && p.strict {
                        Severity::Error
                    } else {
                        Severity::Warning
                    };
                    (
                        severity,
                        json!({"placement": {"kind": p.kind, "name": p.name, "nodes": p.nodes,
                                              "strict": p.strict, "allowed": allowed}}),
                    )
                }
            },
        };
        if let (Some(o), Some(b)) = (d.as_object_mut(), base.as_object()) {
            o.extend(b.clone());
        }
        out.push(finding_with("PVE112", severity, &m.address, d));
    }
    out
}

/// PVE113: an HA group created on Proxmox VE 9 or later, where node-affinity rules replace them.
pub fn pve113(groups: &[String], version: Option<&str>) -> Vec<Finding> {
    let Some(v) = version else { return Vec::new() };
    let major: Option<u64> = v.split('.').next().and_then(|m| m.parse().ok());
    if major.is_none_or(|m| m < 9) {
        return Vec::new();
    }
    groups
        .iter()
        .map(|address| finding_with("PVE113", Severity::Warning, address, json!({"version": v})))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_comes_from_the_group_on_8_and_the_rule_on_9() {
        let res8 = [json!({"sid": "vm:105", "group": "prod", "state": "started"})];
        let groups = [json!({"group": "prod", "nodes": "pve01:2,pve03", "restricted": 1})];
        let f = ha_facts(&res8, &groups, false);
        let p = f.resources["vm:105"].clone().unwrap();
        assert_eq!(
            (p.kind, p.nodes.clone(), p.strict),
            ("group", vec!["pve01".into(), "pve03".into()], true)
        );
        let res9 = [json!({"sid": "vm:105", "state": "started", "failback": 1})];
        let rules = [
            json!({"rule": "apart", "type": "resource-affinity", "resources": "vm:105,vm:106", "affinity": "negative"}),
            json!({"rule": "pin-db", "type": "node-affinity", "resources": "vm:104,vm:105", "nodes": "pve01,pve03", "strict": 0}),
        ];
        let f = ha_facts(&res9, &rules, true);
        let p = f.resources["vm:105"].clone().unwrap();
        assert_eq!(
            (p.kind, p.name.as_str(), p.strict),
            ("rule", "pin-db", false)
        );
    }
}
