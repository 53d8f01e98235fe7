//! PVE010: a destroy + create that only renames an instance key, where a `moved` block would do.

use super::model::{before, local_address, without_index};
use super::{finding, Finding, LintInput};
use crate::core::plan::{ActionKind, ResourceChange};
use serde_json::{json, Value};
use std::collections::HashMap;

/// The creates that could stand in for a destroy: same type, same module, same address but
/// for the instance key. Each destroy (in plan order) takes the create most like it, where
/// likeness is the number of non-null top-level values of the destroyed object's `before`
/// equal in the create's `after`; on a tie, the first create in plan order.
///
/// Likeness is counted through buckets (top-level key, value) → creates, so a destroy only
/// visits the creates that share a value with it, and skips the buckets that hold every
/// create still free (they add the same to all and cannot change the choice).
struct Group<'p> {
    /// The creates of the group in plan order, and whether each is still free.
    creates: Vec<&'p ResourceChange>,
    free: Vec<bool>,
    free_count: usize,
    /// The first position that may still be free.
    first_free: usize,
    /// (key, hash of the value) → the buckets with that key and a value of that hash.
    buckets: HashMap<(&'p str, u64), Vec<usize>>,
    /// Per bucket: its value, its creates, and how many of them are still free.
    members: Vec<(&'p Value, Vec<usize>, usize)>,
    /// Per create: the buckets it is in.
    create_buckets: Vec<Vec<usize>>,
    /// The positions of the creates at each address.
    by_address: HashMap<&'p str, Vec<usize>>,
    /// Scratch: likeness per create for the destroy at hand.
    score: Vec<u32>,
}

impl<'p> Group<'p> {
    fn new(creates: Vec<&'p ResourceChange>) -> Group<'p> {
        let mut buckets = HashMap::new();
        let mut members: Vec<(&Value, Vec<usize>, usize)> = Vec::new();
        let mut create_buckets = Vec::with_capacity(creates.len());
        for (n, new) in creates.iter().enumerate() {
            let mut mine = Vec::new();
            for (k, v) in new.change.after.as_object().into_iter().flatten() {
                if v.is_null() {
                    continue;
                }
                let same_hash: &mut Vec<usize> =
                    buckets.entry((k.as_str(), value_hash(v))).or_default();
                let b = match same_hash.iter().find(|&&b| members[b].0 == v) {
                    Some(&b) => b,
                    None => {
                        members.push((v, Vec::new(), 0));
                        same_hash.push(members.len() - 1);
                        members.len() - 1
                    }
                };
                members[b].1.push(n);
                members[b].2 += 1;
                mine.push(b);
            }
            create_buckets.push(mine);
        }
        let len = creates.len();
        let mut by_address: HashMap<&str, Vec<usize>> = HashMap::new();
        for (n, new) in creates.iter().enumerate() {
            by_address.entry(new.address.as_str()).or_default().push(n);
        }
        Group {
            by_address,
            creates,
            free: vec![true; len],
            free_count: len,
            first_free: 0,
            buckets,
            members,
            create_buckets,
            score: vec![0; len],
        }
    }

    /// Take the free create most like `old` (never one at `old`'s own address).
    fn take_best(&mut self, old: &ResourceChange) -> Option<&'p ResourceChange> {
        let mut touched: Vec<usize> = Vec::new();
        for (k, v) in old.change.before.as_object().into_iter().flatten() {
            if v.is_null() {
                continue;
            }
            let Some(b) = self
                .buckets
                .get(&(k.as_str(), value_hash(v)))
                .and_then(|same| same.iter().copied().find(|&b| self.members[b].0 == v))
            else {
                continue;
            };
            let (_, list, free_in_bucket) = &self.members[b];
            if *free_in_bucket == self.free_count {
                continue;
            }
            for &n in list {
                if self.free[n] {
                    if self.score[n] == 0 {
                        touched.push(n);
                    }
                    self.score[n] += 1;
                }
            }
        }
        // A create at the destroy's own address never pairs with it (compared only for the
        // creates that share the address, which is almost never any).
        let same_address = self.by_address.get(old.address.as_str());
        let eligible = |n: usize| same_address.is_none_or(|same| !same.contains(&n));
        // Highest likeness, then first in plan order; a create that shares no counted value
        // scores below every touched one.
        let best_touched = touched
            .iter()
            .copied()
            .filter(|&n| eligible(n))
            .max_by(|&a, &b| self.score[a].cmp(&self.score[b]).then(b.cmp(&a)));
        let best = best_touched.or_else(|| {
            (self.first_free..self.creates.len()).find(|&n| self.free[n] && eligible(n))
        });
        for n in touched {
            self.score[n] = 0;
        }
        let n = best?;
        self.free[n] = false;
        self.free_count -= 1;
        for &b in &self.create_buckets[n] {
            self.members[b].2 -= 1;
        }
        while self.first_free < self.free.len() && !self.free[self.first_free] {
            self.first_free += 1;
        }
        Some(self.creates[n])
    }
}

/// A hash of a JSON value that agrees with `==` (object entries combined in any order), and
/// allocates nothing.
fn value_hash(v: &Value) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let leaf = |tag: u8, f: &dyn Fn(&mut DefaultHasher)| {
        let mut h = DefaultHasher::new();
        tag.hash(&mut h);
        f(&mut h);
        h.finish()
    };
    match v {
        Value::Null => 1,
        Value::Bool(b) => 2 + u64::from(*b),
        Value::Number(n) => leaf(4, &|h| n.hash(h)),
        Value::String(s) => leaf(5, &|h| s.hash(h)),
        Value::Array(items) => items
            .iter()
            .fold(leaf(6, &|h| items.len().hash(h)), |acc, x| {
                acc.rotate_left(5) ^ value_hash(x).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            }),
        Value::Object(m) => m.iter().fold(leaf(7, &|h| m.len().hash(h)), |acc, (k, x)| {
            let entry = leaf(8, &|h| k.hash(h)) ^ value_hash(x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            acc.wrapping_add(entry.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
        }),
    }
}

pub fn pve010(input: &LintInput) -> Vec<Finding> {
    let changes = input.index.live();
    let mut groups: HashMap<(&str, Option<&str>, &str), Group> = HashMap::new();
    {
        let mut creates: HashMap<(&str, Option<&str>, &str), Vec<&ResourceChange>> = HashMap::new();
        for &rc in changes {
            if rc.kind() == ActionKind::Create && !rc.is_import() {
                creates.entry(group_key(rc)).or_default().push(rc);
            }
        }
        for (key, list) in creates {
            groups.insert(key, Group::new(list));
        }
    }
    let mut out = Vec::new();
    for &old in changes.iter().filter(|rc| rc.kind() == ActionKind::Delete) {
        let Some(group) = groups.get_mut(&group_key(old)) else {
            continue;
        };
        let Some(new) = group.take_best(old) else {
            continue;
        };
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

/// (type, module, address without its instance key): the creates a destroy may pair with.
fn group_key(rc: &ResourceChange) -> (&str, Option<&str>, &str) {
    (
        rc.resource_type.as_str(),
        rc.module_address.as_deref(),
        without_index(&rc.address),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::lint::Facts;
    use crate::core::plan::Plan;

    /// The pairing as first written (every destroy scans every create): the reference the
    /// bucketed pairing must agree with.
    fn reference_pairs(input: &LintInput) -> Vec<(String, String)> {
        let likeness = |old: &ResourceChange, new: &ResourceChange| -> usize {
            let (Some(b), Some(a)) = (old.change.before.as_object(), new.change.after.as_object())
            else {
                return 0;
            };
            b.iter()
                .filter(|(k, v)| !v.is_null() && a.get(*k) == Some(v))
                .count()
        };
        let changes = input.index.live();
        let mut created: Vec<&ResourceChange> = changes
            .iter()
            .copied()
            .filter(|rc| rc.kind() == ActionKind::Create && !rc.is_import())
            .collect();
        let mut out = Vec::new();
        for &old in changes.iter().filter(|rc| rc.kind() == ActionKind::Delete) {
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
            out.push((old.address.clone(), new.address.clone()));
        }
        out
    }

    /// Plans of destroys and creates under two bases and two types, with attributes drawn
    /// from tiny domains (many ties), nulls, non-object values and repeated addresses.
    fn random_plan(seed: u64) -> Plan {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = move |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let mut changes = Vec::new();
        for _ in 0..(5 + next(40)) {
            let rtype = ["proxmox_vm", "terraform_data"][next(2) as usize];
            let name = ["a", "b"][next(2) as usize];
            let address = format!("{rtype}.{name}[{}]", next(12));
            let mut obj = serde_json::Map::new();
            for key in ["x", "y", "z", "w"] {
                match next(5) {
                    0 => {}
                    1 => {
                        obj.insert(key.into(), Value::Null);
                    }
                    _ => {
                        obj.insert(key.into(), json!(next(3)));
                    }
                }
            }
            let value = if next(8) == 0 {
                json!("not an object")
            } else {
                Value::Object(obj)
            };
            let (actions, before, after) = if next(2) == 0 {
                (json!(["delete"]), value, Value::Null)
            } else {
                (json!(["create"]), Value::Null, value)
            };
            changes.push(json!({
                "address": address, "mode": "managed", "type": rtype, "name": name,
                "change": {"actions": actions, "before": before, "after": after},
            }));
        }
        let doc = json!({"format_version": "1.2", "resource_changes": changes});
        Plan::from_json(doc.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn bucketed_pairing_agrees_with_the_scan_over_every_create() {
        let facts = Facts::default();
        let mut paired = 0;
        for seed in 0..400 {
            let plan = random_plan(seed);
            let input = LintInput::new(&plan, &facts);
            let expected = reference_pairs(&input);
            // One finding per paired destroy, in destroy order, on the create it pairs with.
            let got: Vec<String> = pve010(&input).into_iter().map(|f| f.address).collect();
            let want: Vec<String> = expected.iter().map(|(_, new)| new.clone()).collect();
            assert_eq!(got, want, "seed {seed}");
            paired += expected.len();
        }
        assert!(paired > 1000, "the generated plans pair often ({paired})");
    }
}
