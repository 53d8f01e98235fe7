//! A root planned in the same MR as a root above it (`depends_on`): its plan reads the upstream's
//! state as it is *before* the upstream's apply, so the note marks it ("planned against `network`
//! before its apply: re-planned by the apply job") with the upstream's output changes, the values
//! that will move under it. Pure: from the roots' graph and their plans.

use crate::core::plan::{ActionKind, Plan};
use crate::core::root_graph::RootGraph;
use crate::core::summary::Summary;
use serde::Serialize;
use std::collections::BTreeMap;

/// An upstream root whose plan in the same MR changes something, as a dependent's section shows
/// it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedBefore {
    /// The upstream root.
    pub root: String,
    /// Its plan's output changes (no-ops left out), by name.
    pub outputs: Vec<OutputMoved>,
}

/// One output the upstream's plan changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutputMoved {
    pub name: String,
    /// `create`, `update` or `delete` (`ActionKind`'s words).
    pub kind: ActionKind,
    /// Its new value is known only after the upstream's apply.
    pub after_apply: bool,
}

/// For each planned root, the roots above it (directly or not, in configuration order) whose
/// plans in the same MR change something (a resource or an output): `plans` are the roots
/// planned cleanly, by name. A root with none is left out.
pub fn planned_before(
    graph: &RootGraph,
    plans: &BTreeMap<&str, &Plan>,
) -> BTreeMap<String, Vec<PlannedBefore>> {
    let changes = |plan: &Plan| {
        !Summary::of(plan).is_empty()
            || plan
                .output_changes
                .values()
                .any(|o| o.kind() != ActionKind::NoOp)
    };
    let mut out = BTreeMap::new();
    for name in plans.keys() {
        let above: Vec<PlannedBefore> = graph
            .upstream_of(name)
            .into_iter()
            .filter_map(|up| plans.get(up).map(|p| (up, p)))
            .filter(|(_, p)| changes(p))
            .map(|(up, p)| PlannedBefore {
                root: up.to_string(),
                outputs: p
                    .output_changes
                    .iter()
                    .filter(|(_, o)| o.kind() != ActionKind::NoOp)
                    .map(|(n, o)| OutputMoved {
                        name: n.clone(),
                        kind: o.kind(),
                        after_apply: o.after_unknown == serde_json::Value::Bool(true),
                    })
                    .collect(),
            })
            .collect();
        if !above.is_empty() {
            out.insert(name.to_string(), above);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(json: &str) -> Plan {
        Plan::from_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn a_root_below_a_changed_root_gets_its_output_changes_and_others_nothing() {
        let graph = RootGraph::new(&[
            ("network", &[][..]),
            ("vms", &["network".to_string()][..]),
            ("dns", &["vms".to_string()][..]),
            ("solo", &[][..]),
        ])
        .unwrap();
        let network = plan(
            r#"{"format_version":"1.2","resource_changes":[{"address":"terraform_data.net","mode":"managed","type":"terraform_data","name":"net","change":{"actions":["create"],"before":null,"after":{},"after_unknown":{"id":true}}}],
            "output_changes":{"subnet":{"actions":["create"],"before":null,"after":null,"after_unknown":true},"name":{"actions":["update"],"before":"a","after":"b","after_unknown":false},"same":{"actions":["no-op"],"before":"x","after":"x","after_unknown":false}}}"#,
        );
        let unchanged = plan(r#"{"format_version":"1.2","resource_changes":[]}"#);
        let plans: BTreeMap<&str, &Plan> = [
            ("network", &network),
            ("vms", &unchanged),
            ("dns", &unchanged),
            ("solo", &unchanged),
        ]
        .into_iter()
        .collect();
        let marked = planned_before(&graph, &plans);
        let network_before = PlannedBefore {
            root: "network".into(),
            outputs: vec![
                OutputMoved {
                    name: "name".into(),
                    kind: ActionKind::Update,
                    after_apply: false,
                },
                OutputMoved {
                    name: "subnet".into(),
                    kind: ActionKind::Create,
                    after_apply: true,
                },
            ],
        };
        // vms has no changes of its own: dns is marked for network only.
        assert_eq!(
            marked,
            [
                ("dns".to_string(), vec![network_before.clone()]),
                ("vms".to_string(), vec![network_before]),
            ]
            .into_iter()
            .collect()
        );
        // network not planned in this MR (or failed): nothing to mark.
        let plans: BTreeMap<&str, &Plan> = [("vms", &unchanged)].into_iter().collect();
        assert!(planned_before(&graph, &plans).is_empty());
    }
}
