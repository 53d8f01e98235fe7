//! A dependent root's re-plan after an upstream root's apply, compared with the plan that was
//! checked against the review (docs/workflow.md, "Several roots"): the apply job applies a
//! re-plan only when it does what the checked plan did, except that values the checked plan
//! showed as "known after apply" may now be known. Anything else — a known value that changed,
//! a known value that became unknown, a resource, action, move, import, replacement or output
//! added, removed or changed, a sensitivity that changed — is a changed plan.
//!
//! What is compared is what the fingerprint binds ([`crate::core::fingerprint`]): every managed
//! change that does something with its actions, `previous_address`, `importing`,
//! `replace_paths`, `after` and its masks, and every root output change that is not a no-op.
//! The provider lock file and the root's `parallelism`, also bound, are the same by
//! construction: both plans are made in the same checkout with the same config. No value is ever
//! part of the answer: only addresses and attribute paths.

use crate::core::plan::{mask_has_true, ActionKind, Plan, ResourceChange};
use serde_json::Value;
use std::collections::BTreeMap;

/// How a re-plan compares with the checked plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replan {
    /// The same plan.
    Same,
    /// The same plan except these values, unknown in the checked plan, now known: the
    /// upstream's outputs flowing in. Paths as `address.attribute[0]` (or `output.name`).
    Resolved(Vec<String>),
    /// Another plan: the first difference found.
    Differs(Difference),
}

/// Where a re-plan first differs from the checked plan (addresses and paths, never values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The resource address (with ` (deposed KEY)`) or `output.NAME`.
    pub address: String,
    pub kind: DifferenceKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DifferenceKind {
    /// The re-plan changes a resource (or output) the checked plan left alone.
    Added,
    /// The checked plan changed it; the re-plan does not.
    Removed,
    /// Other actions (`["update"]` became `["delete", "create"]`), another move, import or
    /// replacement reason.
    Actions,
    /// A value the checked plan knew is another value now, or unknown (`path` within it).
    Value { path: String },
    /// A value's sensitivity changed (`path` within it).
    Sensitivity { path: String },
    /// One plan errored.
    Errored,
}

impl DifferenceKind {
    /// The template kind naming it (`templates/apply/log.txt.j2`, `replan_*`).
    pub fn name(&self) -> &'static str {
        match self {
            DifferenceKind::Added => "added",
            DifferenceKind::Removed => "removed",
            DifferenceKind::Actions => "actions",
            DifferenceKind::Value { .. } => "value",
            DifferenceKind::Sensitivity { .. } => "sensitivity",
            DifferenceKind::Errored => "errored",
        }
    }

    /// The attribute path within the address, when the difference is one value.
    pub fn path(&self) -> Option<&str> {
        match self {
            DifferenceKind::Value { path } | DifferenceKind::Sensitivity { path } => Some(path),
            _ => None,
        }
    }
}

/// Compare `fresh` (the re-plan) with `checked` (the plan checked against the review, made
/// before the upstream's apply).
pub fn compare(checked: &Plan, fresh: &Plan) -> Replan {
    match differences(checked, fresh) {
        Ok(resolved) if resolved.is_empty() => Replan::Same,
        Ok(resolved) => Replan::Resolved(resolved),
        Err(d) => Replan::Differs(d),
    }
}

fn differences(checked: &Plan, fresh: &Plan) -> Result<Vec<String>, Difference> {
    if checked.errored || fresh.errored {
        return Err(Difference {
            address: String::new(),
            kind: DifferenceKind::Errored,
        });
    }
    let mut resolved = Vec::new();
    let before = changes(checked);
    let after = changes(fresh);
    for (address, rc) in &before {
        let Some(other) = after.get(address) else {
            return Err(Difference {
                address: address.clone(),
                kind: DifferenceKind::Removed,
            });
        };
        compare_change(address, rc, other, &mut resolved)?;
    }
    if let Some(address) = after.keys().find(|a| !before.contains_key(*a)) {
        return Err(Difference {
            address: address.clone(),
            kind: DifferenceKind::Added,
        });
    }
    compare_outputs(checked, fresh, &mut resolved)?;
    Ok(resolved)
}

/// The managed changes that do something, by display address (with the deposed key).
fn changes(plan: &Plan) -> BTreeMap<String, &ResourceChange> {
    plan.managed_changes()
        .filter(|rc| rc.has_change())
        .map(|rc| (rc.display_address(), rc))
        .collect()
}

fn compare_change(
    address: &str,
    checked: &ResourceChange,
    fresh: &ResourceChange,
    resolved: &mut Vec<String>,
) -> Result<(), Difference> {
    let (a, b) = (&checked.change, &fresh.change);
    if a.actions != b.actions
        || checked.previous_address != fresh.previous_address
        || a.importing != b.importing
        || a.replace_paths != b.replace_paths
    {
        return Err(Difference {
            address: address.to_string(),
            kind: DifferenceKind::Actions,
        });
    }
    let (va, vb) = (a.after_values(), b.after_values());
    let paths = walk(
        &Side {
            value: &va.after,
            unknown: &va.after_unknown,
            sensitive: &va.after_sensitive,
        },
        &Side {
            value: &vb.after,
            unknown: &vb.after_unknown,
            sensitive: &vb.after_sensitive,
        },
        "",
    )
    .map_err(|kind| Difference {
        address: address.to_string(),
        kind,
    })?;
    resolved.extend(paths.iter().map(|p| join(address, p)));
    Ok(())
}

fn compare_outputs(
    checked: &Plan,
    fresh: &Plan,
    resolved: &mut Vec<String>,
) -> Result<(), Difference> {
    let live = |plan: &Plan| -> Vec<String> {
        plan.output_changes
            .iter()
            .filter(|(_, oc)| oc.kind() != ActionKind::NoOp)
            .map(|(n, _)| n.clone())
            .collect()
    };
    let (before, after) = (live(checked), live(fresh));
    for name in &before {
        let address = format!("output.{name}");
        let (Some(a), Some(b)) = (
            checked.output_changes.get(name),
            fresh
                .output_changes
                .get(name)
                .filter(|_| after.contains(name)),
        ) else {
            return Err(Difference {
                address,
                kind: DifferenceKind::Removed,
            });
        };
        if a.actions != b.actions {
            return Err(Difference {
                address,
                kind: DifferenceKind::Actions,
            });
        }
        // An output is sensitive whole: its sensitivity is one flag.
        let flag = |s: bool| Value::Bool(s);
        let (sa, sb) = (flag(a.is_sensitive()), flag(b.is_sensitive()));
        let paths = walk(
            &Side {
                value: &a.after,
                unknown: &a.after_unknown,
                sensitive: &sa,
            },
            &Side {
                value: &b.after,
                unknown: &b.after_unknown,
                sensitive: &sb,
            },
            "",
        )
        .map_err(|kind| Difference {
            address: address.clone(),
            kind,
        })?;
        resolved.extend(paths.iter().map(|p| join(&address, p)));
    }
    if let Some(name) = after.iter().find(|n| !before.contains(n)) {
        return Err(Difference {
            address: format!("output.{name}"),
            kind: DifferenceKind::Added,
        });
    }
    Ok(())
}

fn join(address: &str, path: &str) -> String {
    if path.is_empty() {
        address.to_string()
    } else if path.starts_with('[') {
        format!("{address}{path}")
    } else {
        format!("{address}.{path}")
    }
}

/// One value with its masks, at the same place in both plans.
struct Side<'a> {
    value: &'a Value,
    unknown: &'a Value,
    sensitive: &'a Value,
}

const NULL: Value = Value::Null;

impl<'a> Side<'a> {
    fn is_unknown(&self) -> bool {
        self.unknown == &Value::Bool(true)
    }

    fn child_key(&self, key: &str) -> Side<'a> {
        let get = |v: &'a Value| v.as_object().and_then(|m| m.get(key)).unwrap_or(&NULL);
        Side {
            value: get(self.value),
            unknown: get(self.unknown),
            sensitive: get(self.sensitive),
        }
    }

    fn child_index(&self, i: usize) -> Side<'a> {
        let get = |v: &'a Value| v.as_array().and_then(|a| a.get(i)).unwrap_or(&NULL);
        Side {
            value: get(self.value),
            unknown: get(self.unknown),
            sensitive: get(self.sensitive),
        }
    }

    fn keys(&self) -> Vec<&'a String> {
        [self.value, self.unknown, self.sensitive]
            .into_iter()
            .filter_map(Value::as_object)
            .flat_map(|m| m.keys())
            .collect()
    }

    fn len(&self) -> usize {
        [self.value, self.unknown, self.sensitive]
            .into_iter()
            .filter_map(Value::as_array)
            .map(Vec::len)
            .max()
            .unwrap_or(0)
    }
}

/// Walk both values together: `Ok(paths)` where the checked value was unknown and the fresh
/// one is (at least partly) known; `Err` at the first other difference.
fn walk(checked: &Side, fresh: &Side, path: &str) -> Result<Vec<String>, DifferenceKind> {
    let mut resolved = Vec::new();
    walk_into(checked, fresh, path, &mut resolved)?;
    Ok(resolved)
}

fn walk_into(
    checked: &Side,
    fresh: &Side,
    path: &str,
    resolved: &mut Vec<String>,
) -> Result<(), DifferenceKind> {
    if checked.is_unknown() {
        // "Known after apply" in the checked plan: whatever it is now is what flowed in.
        if !fresh.is_unknown() {
            resolved.push(path.to_string());
        }
        return Ok(());
    }
    if fresh.is_unknown() {
        return Err(DifferenceKind::Value {
            path: path.to_string(),
        });
    }
    let objects = [checked.value, checked.unknown, checked.sensitive]
        .into_iter()
        .chain([fresh.value, fresh.unknown, fresh.sensitive])
        .any(Value::is_object);
    let arrays = [checked.value, checked.unknown, checked.sensitive]
        .into_iter()
        .chain([fresh.value, fresh.unknown, fresh.sensitive])
        .any(Value::is_array);
    if objects && !arrays {
        if checked.value.is_object() != fresh.value.is_object() {
            return Err(DifferenceKind::Value {
                path: path.to_string(),
            });
        }
        let mut keys = checked.keys();
        keys.extend(fresh.keys());
        keys.sort();
        keys.dedup();
        for key in keys {
            let p = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            walk_into(&checked.child_key(key), &fresh.child_key(key), &p, resolved)?;
        }
        return Ok(());
    }
    if arrays && !objects {
        if checked.value.is_array() != fresh.value.is_array()
            || checked.value.as_array().map(Vec::len) != fresh.value.as_array().map(Vec::len)
        {
            return Err(DifferenceKind::Value {
                path: path.to_string(),
            });
        }
        for i in 0..checked.len().max(fresh.len()) {
            walk_into(
                &checked.child_index(i),
                &fresh.child_index(i),
                &format!("{path}[{i}]"),
                resolved,
            )?;
        }
        return Ok(());
    }
    // A leaf (or a mix of shapes, which only a changed value gives).
    if checked.value != fresh.value {
        return Err(DifferenceKind::Value {
            path: path.to_string(),
        });
    }
    if mask_has_true(checked.sensitive) != mask_has_true(fresh.sensitive)
        || mask_has_true(checked.unknown) != mask_has_true(fresh.unknown)
    {
        return Err(DifferenceKind::Sensitivity {
            path: path.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A plan of one `terraform_data.vm` created with `after` and `after_unknown`, and one
    /// output `subnet`.
    fn plan(after: Value, unknown: Value, output: Value, output_unknown: bool) -> Plan {
        plan_with(
            json!([change("terraform_data.vm", after, unknown)]),
            output,
            output_unknown,
        )
    }

    fn change(address: &str, after: Value, unknown: Value) -> Value {
        json!({
            "address": address,
            "mode": "managed",
            "type": "terraform_data",
            "name": address.rsplit('.').next().unwrap(),
            "change": {
                "actions": ["create"],
                "before": null,
                "after": after,
                "after_unknown": unknown,
                "before_sensitive": false,
                "after_sensitive": {}
            }
        })
    }

    fn plan_with(changes: Value, output: Value, output_unknown: bool) -> Plan {
        Plan::from_value(json!({
            "format_version": "1.2",
            "resource_changes": changes,
            "output_changes": {
                "subnet": {
                    "actions": ["create"],
                    "before": null,
                    "after": output,
                    "after_unknown": output_unknown,
                    "before_sensitive": false,
                    "after_sensitive": false
                }
            }
        }))
        .expect("a plan")
    }

    /// The dependent's plan as reviewed: its input read from the upstream is unknown.
    fn reviewed() -> Plan {
        plan(
            json!({"input": {"name": "vm1"}, "triggers_replace": null}),
            json!({"id": true, "input": {"subnet": true}, "output": true}),
            Value::Null,
            true,
        )
    }

    #[test]
    fn the_same_plan_is_the_same() {
        assert_eq!(compare(&reviewed(), &reviewed()), Replan::Same);
    }

    #[test]
    fn an_unknown_that_became_known_is_accepted_and_named() {
        let fresh = plan(
            json!({"input": {"name": "vm1", "subnet": "10.0.2.0/24"}, "triggers_replace": null}),
            json!({"id": true, "input": {}, "output": true}),
            json!("10.0.2.0/24"),
            false,
        );
        assert_eq!(
            compare(&reviewed(), &fresh),
            Replan::Resolved(vec![
                "terraform_data.vm.input.subnet".to_string(),
                "output.subnet".to_string()
            ])
        );
    }

    #[test]
    fn a_whole_unknown_object_may_become_a_known_one() {
        let checked = plan(json!({}), json!({"input": true}), json!("a"), false);
        let fresh = plan(
            json!({"input": {"subnet": "10.0.2.0/24", "tags": ["a", "b"]}}),
            json!({"input": {"tags": [false, false]}}),
            json!("a"),
            false,
        );
        assert_eq!(
            compare(&checked, &fresh),
            Replan::Resolved(vec!["terraform_data.vm.input".to_string()])
        );
    }

    #[test]
    fn a_known_value_that_changed_is_refused() {
        let checked = plan(
            json!({"input": {"name": "vm1", "subnet": "10.0.1.0/24"}}),
            json!({"id": true}),
            Value::Null,
            true,
        );
        let fresh = plan(
            json!({"input": {"name": "vm1", "subnet": "10.0.2.0/24"}}),
            json!({"id": true}),
            Value::Null,
            true,
        );
        assert_eq!(
            compare(&checked, &fresh),
            Replan::Differs(Difference {
                address: "terraform_data.vm".into(),
                kind: DifferenceKind::Value {
                    path: "input.subnet".into()
                }
            })
        );
    }

    #[test]
    fn an_unknown_next_to_a_changed_known_value_does_not_excuse_it() {
        let fresh = plan(
            json!({"input": {"name": "vm2", "subnet": "10.0.2.0/24"}, "triggers_replace": null}),
            json!({"id": true, "output": true}),
            json!("10.0.2.0/24"),
            false,
        );
        assert!(matches!(
            compare(&reviewed(), &fresh),
            Replan::Differs(Difference { kind: DifferenceKind::Value { ref path }, .. }) if path == "input.name"
        ));
    }

    #[test]
    fn a_known_value_that_became_unknown_is_refused() {
        let fresh = plan(
            json!({"input": {"subnet": null}, "triggers_replace": null}),
            json!({"id": true, "input": {"name": true, "subnet": true}, "output": true}),
            Value::Null,
            true,
        );
        assert!(matches!(
            compare(&reviewed(), &fresh),
            Replan::Differs(Difference { kind: DifferenceKind::Value { ref path }, .. }) if path == "input.name"
        ));
    }

    #[test]
    fn an_extra_resource_is_refused() {
        let r = reviewed();
        let vm = r
            .managed_changes()
            .next()
            .map(|rc| rc.change.after_values())
            .unwrap();
        let fresh = plan_with(
            json!([
                change(
                    "terraform_data.vm",
                    vm.after.clone(),
                    vm.after_unknown.clone()
                ),
                change(
                    "terraform_data.extra",
                    json!({"input": 1}),
                    json!({"id": true})
                )
            ]),
            Value::Null,
            true,
        );
        assert_eq!(
            compare(&r, &fresh),
            Replan::Differs(Difference {
                address: "terraform_data.extra".into(),
                kind: DifferenceKind::Added
            })
        );
    }

    #[test]
    fn a_resource_left_out_is_refused() {
        let fresh = plan_with(json!([]), Value::Null, true);
        assert_eq!(
            compare(&reviewed(), &fresh),
            Replan::Differs(Difference {
                address: "terraform_data.vm".into(),
                kind: DifferenceKind::Removed
            })
        );
    }

    #[test]
    fn other_actions_are_refused() {
        let mut c = change(
            "terraform_data.vm",
            json!({"input": {"name": "vm1"}, "triggers_replace": null}),
            json!({"id": true, "input": {"subnet": true}, "output": true}),
        );
        c["change"]["actions"] = json!(["delete", "create"]);
        let fresh = plan_with(json!([c]), Value::Null, true);
        assert_eq!(
            compare(&reviewed(), &fresh),
            Replan::Differs(Difference {
                address: "terraform_data.vm".into(),
                kind: DifferenceKind::Actions
            })
        );
    }

    #[test]
    fn a_value_that_became_sensitive_is_refused() {
        let checked = plan(json!({"input": "a"}), json!({}), json!("x"), false);
        let mut c = change("terraform_data.vm", json!({"input": "a"}), json!({}));
        c["change"]["after_sensitive"] = json!({"input": true});
        let fresh = plan_with(json!([c]), json!("x"), false);
        assert!(matches!(
            compare(&checked, &fresh),
            Replan::Differs(Difference {
                kind: DifferenceKind::Sensitivity { .. },
                ..
            })
        ));
    }

    #[test]
    fn a_changed_known_output_is_refused() {
        let checked = plan(
            json!({"input": "a"}),
            json!({}),
            json!("10.0.1.0/24"),
            false,
        );
        let fresh = plan(
            json!({"input": "a"}),
            json!({}),
            json!("10.0.2.0/24"),
            false,
        );
        assert_eq!(
            compare(&checked, &fresh),
            Replan::Differs(Difference {
                address: "output.subnet".into(),
                kind: DifferenceKind::Value {
                    path: String::new()
                }
            })
        );
    }
}
