//! PVE010: a destroy + create that only renames an instance key, where a `moved` block would do.

use super::model::{before, local_address, without_index, Res};
use super::{finding, Finding, LintInput};
use crate::core::plan::Json;
use crate::core::plan::{ActionKind, ResourceChange};
use serde_json::json;
use std::collections::{HashMap, HashSet};

/// (type, module, address without its instance key): the creates a destroy may pair with.
type GroupKey<'p> = (&'p str, Option<&'p str>, &'p str);

/// One non-null top-level value of an object: (hash of its key, hash of its value).
type Entry = (u64, u64);

/// A destroy or a create as PVE010 sees it: its change and its non-null top-level values (of
/// `before` for a destroy, of `after` for a create), as hashes, so that the values themselves
/// need not be kept once the lint pass has moved on.
pub struct Candidate<'p> {
    rc: &'p ResourceChange,
    /// Its entries: `Candidates::entries[entries.0..entries.1]`.
    entries: (u32, u32),
    /// A destroyed object's `size` (shown in the finding).
    size: Option<u64>,
}

/// The destroys and creates of the groups that have both, in plan order.
#[derive(Default)]
pub struct Candidates<'p> {
    deletes: Vec<Candidate<'p>>,
    creates: Vec<Candidate<'p>>,
    /// The entries of every candidate, one after the other (one allocation, not one each:
    /// they outlive the values they come from, which are freed around them).
    entries: Vec<Entry>,
}

impl Candidates<'_> {
    fn entries_of(&self, c: &Candidate) -> &[Entry] {
        &self.entries[c.entries.0 as usize..c.entries.1 as usize]
    }
}

fn is_create(rc: &ResourceChange) -> bool {
    rc.kind() == ActionKind::Create && !rc.is_import()
}

/// The groups (see [`GroupKey`]) that have at least one destroy and one create: only their
/// members need their values read.
pub fn pairable_groups<'p>(live: &[&'p ResourceChange]) -> HashSet<GroupKey<'p>> {
    let mut deletes = HashSet::new();
    let mut creates = HashSet::new();
    for &rc in live {
        if rc.kind() == ActionKind::Delete {
            deletes.insert(group_key(rc));
        } else if is_create(rc) {
            creates.insert(group_key(rc));
        }
    }
    deletes.intersection(&creates).copied().collect()
}

/// Whether PVE010 needs this change's values.
pub fn is_candidate(rc: &ResourceChange, pairable: &HashSet<GroupKey>) -> bool {
    (rc.kind() == ActionKind::Delete || is_create(rc)) && pairable.contains(&group_key(rc))
}

impl<'p> Candidates<'p> {
    /// Note a destroy or create (anything else is ignored).
    pub fn add(&mut self, res: &Res<'p>) {
        let (list, object) = if res.kind() == ActionKind::Delete {
            (&mut self.deletes, &res.values().before)
        } else if is_create(res) {
            (&mut self.creates, &res.values().after)
        } else {
            return;
        };
        let start = self.entries.len() as u32;
        self.entries.extend(
            object
                .as_object()
                .into_iter()
                .flat_map(|m| m.iter())
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (str_hash(k), value_hash(v))),
        );
        list.push(Candidate {
            rc: res.rc,
            entries: (start, self.entries.len() as u32),
            size: before(res, "size").and_then(Json::as_u64),
        });
    }
}

/// The creates that could stand in for a destroy: same type, same module, same address but
/// for the instance key. Each destroy (in plan order) takes the create most like it, where
/// likeness is the number of non-null top-level values of the destroyed object's `before`
/// equal in the create's `after`; on a tie, the first create in plan order.
///
/// Likeness is counted through buckets (top-level key, value) → creates, so a destroy only
/// visits the creates that share a value with it, and skips the buckets that hold every
/// create still free (they add the same to all and cannot change the choice). Buckets and
/// their members are kept in flat arrays (most buckets hold one create: a VM's own name).
struct Group<'c, 'p> {
    /// The creates of the group in plan order, and whether each is still free.
    creates: Vec<&'c Candidate<'p>>,
    free: Vec<bool>,
    free_count: usize,
    /// The first position that may still be free.
    first_free: usize,
    /// (key, value) → its bucket.
    buckets: HashMap<Entry, u32>,
    /// The creates of bucket `b` are `members[member_start[b]..member_start[b + 1]]`.
    member_start: Vec<u32>,
    members: Vec<u32>,
    /// Per bucket: how many of its creates are still free.
    free_in_bucket: Vec<u32>,
    /// The buckets of create `n` are `create_buckets[bucket_start[n]..bucket_start[n + 1]]`.
    bucket_start: Vec<u32>,
    create_buckets: Vec<u32>,
    /// The positions of the creates at each address.
    by_address: HashMap<&'p str, Vec<usize>>,
    /// Scratch: likeness per create for the destroy at hand.
    score: Vec<u32>,
}

impl<'c, 'p> Group<'c, 'p> {
    fn new(creates: Vec<&'c Candidate<'p>>, all: &Candidates) -> Group<'c, 'p> {
        let mut buckets: HashMap<Entry, u32> = HashMap::new();
        let mut bucket_start = Vec::with_capacity(creates.len() + 1);
        let mut create_buckets = Vec::new();
        let mut sizes: Vec<u32> = Vec::new();
        for new in &creates {
            bucket_start.push(create_buckets.len() as u32);
            for entry in all.entries_of(new) {
                let next = buckets.len() as u32;
                let b = *buckets.entry(*entry).or_insert(next);
                if b == next {
                    sizes.push(0);
                }
                // A key appears once per object, so a create joins a bucket at most once.
                sizes[b as usize] += 1;
                create_buckets.push(b);
            }
        }
        bucket_start.push(create_buckets.len() as u32);
        let mut member_start = Vec::with_capacity(sizes.len() + 1);
        let mut total = 0;
        for &size in &sizes {
            member_start.push(total);
            total += size;
        }
        member_start.push(total);
        let mut members = vec![0; total as usize];
        let mut fill = member_start.clone();
        for n in 0..creates.len() {
            for &b in &create_buckets[bucket_start[n] as usize..bucket_start[n + 1] as usize] {
                members[fill[b as usize] as usize] = n as u32;
                fill[b as usize] += 1;
            }
        }
        let len = creates.len();
        let mut by_address: HashMap<&str, Vec<usize>> = HashMap::new();
        for (n, new) in creates.iter().enumerate() {
            by_address
                .entry(new.rc.address.as_str())
                .or_default()
                .push(n);
        }
        Group {
            by_address,
            creates,
            free: vec![true; len],
            free_count: len,
            first_free: 0,
            buckets,
            member_start,
            members,
            free_in_bucket: sizes,
            bucket_start,
            create_buckets,
            score: vec![0; len],
        }
    }

    /// Take the free create most like `old` (never one at `old`'s own address).
    fn take_best(&mut self, old: &Candidate, all: &Candidates) -> Option<&'c Candidate<'p>> {
        let mut touched: Vec<usize> = Vec::new();
        for entry in all.entries_of(old) {
            let Some(&b) = self.buckets.get(entry) else {
                continue;
            };
            let b = b as usize;
            if self.free_in_bucket[b] as usize == self.free_count {
                continue;
            }
            let list =
                &self.members[self.member_start[b] as usize..self.member_start[b + 1] as usize];
            for &n in list {
                let n = n as usize;
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
        let same_address = self.by_address.get(old.rc.address.as_str());
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
        for &b in
            &self.create_buckets[self.bucket_start[n] as usize..self.bucket_start[n + 1] as usize]
        {
            self.free_in_bucket[b as usize] -= 1;
        }
        while self.first_free < self.free.len() && !self.free[self.first_free] {
            self.first_free += 1;
        }
        Some(self.creates[n])
    }
}

fn str_hash(s: &str) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// A hash of a JSON value that agrees with `==` (object entries combined in any order), and
/// allocates nothing. Two values are taken as equal when their hashes are (for a hint, a chance
/// of about one in 2^64 per pair is no concern).
fn value_hash(v: &Json) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let leaf = |tag: u8, f: &dyn Fn(&mut DefaultHasher)| {
        let mut h = DefaultHasher::new();
        tag.hash(&mut h);
        f(&mut h);
        h.finish()
    };
    match v {
        Json::Null => 1,
        Json::Bool(b) => 2 + u64::from(*b),
        Json::Number(n) => leaf(4, &|h| n.hash(h)),
        Json::Str(s) => leaf(5, &|h| s.hash(h)),
        Json::Array(items) => items
            .iter()
            .fold(leaf(6, &|h| items.len().hash(h)), |acc, x| {
                acc.rotate_left(5) ^ value_hash(x).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            }),
        Json::Object(m) => m.iter().fold(leaf(7, &|h| m.len().hash(h)), |acc, (k, x)| {
            let entry = leaf(8, &|h| k.hash(h)) ^ value_hash(x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            acc.wrapping_add(entry.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
        }),
    }
}

pub fn pve010(input: &LintInput) -> Vec<Finding> {
    let moves = &input.moves;
    let mut groups: HashMap<GroupKey, Group> = HashMap::new();
    {
        let mut creates: HashMap<GroupKey, Vec<&Candidate>> = HashMap::new();
        for c in &moves.creates {
            creates.entry(group_key(c.rc)).or_default().push(c);
        }
        for (key, list) in creates {
            groups.insert(key, Group::new(list, moves));
        }
    }
    let mut out = Vec::new();
    for old in &moves.deletes {
        let Some(group) = groups.get_mut(&group_key(old.rc)) else {
            continue;
        };
        let Some(new) = group.take_best(old, moves) else {
            continue;
        };
        out.push(finding(
            "PVE010",
            &new.rc.address,
            json!({
                "from": local_address(old.rc),
                "to": local_address(new.rc),
                "module": old.rc.module_address,
                "size_gb": old.size.map(|s| format!("{:.1}", s as f64 / 1e9)),
            }),
        ));
    }
    out
}

/// (type, module, address without its instance key): the creates a destroy may pair with.
fn group_key(rc: &ResourceChange) -> GroupKey<'_> {
    (
        rc.resource_type.as_str(),
        rc.module_address.as_deref(),
        without_index(&rc.address),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::plan::Plan;
    use crate::core::proxmox::findings::Facts;
    use serde_json::Value;

    /// The pairing as first written (every destroy scans every create): the reference the
    /// bucketed pairing must agree with.
    fn reference_pairs(input: &LintInput) -> Vec<(String, String)> {
        let likeness = |old: &ResourceChange, new: &ResourceChange| -> usize {
            let (before, after) = (old.change.values(), new.change.values());
            let (Some(b), Some(a)) = (
                before.get().before.as_object(),
                after.get().after.as_object(),
            ) else {
                return 0;
            };
            b.iter()
                .filter(|(k, v)| !v.is_null() && a.get(k) == Some(v))
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
