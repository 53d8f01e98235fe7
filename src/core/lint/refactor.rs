//! PVE010: a destroy + create that only renames an instance key, where a `moved` block would do.

use super::model::{before, local_address, without_index};
use super::{finding, Finding, LintInput};
use crate::core::plan::{ActionKind, ResourceChange};
use serde_json::{json, Value};

/// How alike the destroyed object and the created one are: equal top-level values.
fn likeness(old: &ResourceChange, new: &ResourceChange) -> usize {
    let (Some(b), Some(a)) = (old.change.before.as_object(), new.change.after.as_object()) else {
        return 0;
    };
    b.iter()
        .filter(|(k, v)| !v.is_null() && a.get(*k) == Some(v))
        .count()
}

pub fn pve010(input: &LintInput) -> Vec<Finding> {
    let changes: Vec<&ResourceChange> = input
        .plan
        .managed_changes()
        .filter(|rc| rc.deposed.is_none())
        .collect();
    let deleted: Vec<&ResourceChange> = changes
        .iter()
        .copied()
        .filter(|rc| rc.kind() == ActionKind::Delete)
        .collect();
    let mut created: Vec<&ResourceChange> = changes
        .iter()
        .copied()
        .filter(|rc| rc.kind() == ActionKind::Create && !rc.is_import())
        .collect();
    let mut out = Vec::new();
    for old in deleted {
        let base = without_index(&old.address);
        let best = created
            .iter()
            .enumerate()
            .filter(|(_, new)| {
                new.resource_type == old.resource_type
                    && new.module_address == old.module_address
                    && new.address != old.address
                    && without_index(&new.address) == base
            })
            .max_by(|(ia, a), (ib, b)| likeness(old, a).cmp(&likeness(old, b)).then(ib.cmp(ia)))
            .map(|(i, _)| i);
        let Some(i) = best else { continue };
        let new = created.remove(i);
        let size = before(old, "size").and_then(Value::as_u64);
        out.push(finding(
            "PVE010",
            &new.address,
            json!({
                "from": local_address(old),
                "to": local_address(new),
                "module": old.module_address,
                "size_gb": size.map(|s| format!("{:.1}", s as f64 / 1e9)),
            }),
        ));
    }
    out
}
