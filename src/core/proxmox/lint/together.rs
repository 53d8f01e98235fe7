//! Rules on several guests at once: full clones onto one storage in one apply (PVE016), and one
//! `vm_id` asked for twice, in one plan or across the roots planned for one MR (PVE023).
//!
//! The lint pass gathers what these rules need from each VM and container while it has them
//! parsed ([`Clones::add`], [`VmIds::add`]); the rules then read the gathered lists.

use super::model::{after, block_len, is_created, Attr, Kind, Res};
use super::{finding, Finding, Gather, LintInput};
use crate::core::plan::Json;
use crate::core::plan::{ActionKind, Plan};
use crate::core::proxmox::findings::{is_disabled, sort_findings, Facts};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// One full clone the plan creates.
#[derive(Debug, Clone)]
struct FullClone {
    address: String,
    /// `clone.vm_id`: the template, when known.
    template: Option<i64>,
    /// Where its disks land: `clone.datastore_id`, else the first disk's `datastore_id`; `None`
    /// when neither is known (then the template's own storage).
    storage: Option<String>,
}

/// The full clones of a plan, in plan order.
#[derive(Debug, Default)]
pub struct Clones(Vec<FullClone>);

impl Clones {
    /// Note `rc` when it is a VM the plan creates as a full clone (`clone {}` without
    /// `full = false`: the provider's default is a full clone).
    pub fn add(&mut self, rc: &Res) {
        if !Kind::of(rc).is_some_and(Kind::is_vm) || !is_created(rc) {
            return;
        }
        if block_len(rc, "clone") == 0 || after(rc, "clone.0.full").bool() == Some(false) {
            return;
        }
        let storage = after(rc, "clone.0.datastore_id")
            .str()
            .or_else(|| after(rc, "disk.0.datastore_id").str())
            .map(str::to_string);
        let template = match after(rc, "clone.0.vm_id") {
            Attr::Known(v) => v.as_i64(),
            _ => None,
        };
        self.0.push(FullClone {
            address: rc.address.clone(),
            template,
            storage,
        });
    }
}

/// PVE016: two or more full clones onto one storage (or, their storage unknown, from one
/// template) in one apply. Proxmox holds the storage's lock for each whole copy and gives up
/// waiting for it after 10 s. Silent when the root runs one change at a time
/// (`parallelism = 1`).
pub fn pve016(input: &LintInput) -> Vec<Finding> {
    if input.facts.parallelism == Some(1) {
        return Vec::new();
    }
    // Grouped by storage; clones whose storage is unknown, by template.
    let mut groups: BTreeMap<(Option<&str>, Option<i64>), Vec<&FullClone>> = BTreeMap::new();
    for c in &input.clones.0 {
        let key = match &c.storage {
            Some(s) => (Some(s.as_str()), None),
            None => (None, c.template),
        };
        groups.entry(key).or_default().push(c);
    }
    groups
        .into_iter()
        .filter(|(_, clones)| clones.len() >= 2)
        .map(|((storage, _), clones)| {
            let mut templates: Vec<i64> = clones.iter().filter_map(|c| c.template).collect();
            templates.sort_unstable();
            templates.dedup();
            let vms: Vec<&str> = clones.iter().map(|c| c.address.as_str()).collect();
            finding(
                "PVE016",
                clones[0].address.as_str(),
                json!({
                    "count": clones.len(),
                    "vms": vms,
                    "templates": templates,
                    "storage": storage,
                    // Its type as the preflight read it (`lvmthin`, `zfspool`, `dir`, …).
                    "storage_type": storage.and_then(|s| input.facts.storage_types.get(s)),
                    "parallelism": input.facts.parallelism,
                }),
            )
        })
        .collect()
}

/// One guest's claim on a VM id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Claim {
    address: String,
    /// The plan creates it (a create, or the create half of a replacement): the apply asks
    /// Proxmox for the id. A guest kept as it is already holds its id.
    created: bool,
}

/// The literal `vm_id`s the plan's VMs and containers have after the plan, by id.
#[derive(Debug, Default)]
pub struct VmIds(BTreeMap<i64, Vec<Claim>>);

impl VmIds {
    /// Note the `vm_id` of `rc` (a VM or container that exists after the plan) when it is
    /// known.
    pub fn add(&mut self, rc: &Res) {
        let guest = Kind::of(rc).is_some_and(|k| k.is_vm() || k == Kind::Container);
        if !guest || rc.deposed.is_some() {
            return;
        }
        if matches!(
            rc.kind(),
            ActionKind::Delete | ActionKind::Forget | ActionKind::Read | ActionKind::Unknown
        ) {
            return;
        }
        let Attr::Known(Json::Number(n)) = after(rc, "vm_id") else {
            return;
        };
        let Some(id) = n.as_i64().filter(|id| *id > 0) else {
            return;
        };
        self.0.entry(id).or_default().push(Claim {
            address: rc.address.clone(),
            created: is_created(rc),
        });
    }
}

/// PVE023 within one plan: two guests with the same `vm_id`, one of them created.
pub fn pve023(input: &LintInput) -> Vec<Finding> {
    input
        .vm_ids
        .0
        .iter()
        .filter(|(_, claims)| claims.len() >= 2 && claims.iter().any(|c| c.created))
        .map(|(id, claims)| {
            let first = claims.iter().find(|c| c.created).unwrap_or(&claims[0]);
            let others: Vec<&str> = claims
                .iter()
                .filter(|c| c.address != first.address)
                .map(|c| c.address.as_str())
                .collect();
            finding(
                "PVE023",
                &first.address,
                json!({ "id": id, "others": others }),
            )
        })
        .collect()
}

/// One root's plan, for the check across the roots planned for one MR.
pub struct RootPlan<'a> {
    pub name: &'a str,
    pub plan: &'a Plan,
    /// The root's `lint_disable` list: a root that disables PVE023 gets no finding from it.
    pub disabled: &'a [String],
}

/// PVE023 across the roots planned for one MR: a guest created in one root with a `vm_id`
/// that a guest of another root has too (both applies cannot succeed). The findings of each
/// root, in the order of `roots` (errors first within each).
pub fn cross_root(roots: &[RootPlan]) -> Vec<Vec<Finding>> {
    let facts = Facts::default();
    let ids: Vec<VmIds> = roots
        .iter()
        // Gathered for a root that disables the rule too: the other roots see its guests.
        .map(|r| {
            LintInput::scan(r.plan, &facts, &[], Gather::VM_IDS)
                .0
                .vm_ids
        })
        .collect();
    let mut out: Vec<Vec<Finding>> = roots.iter().map(|_| Vec::new()).collect();
    for (i, root) in roots.iter().enumerate() {
        if is_disabled("PVE023", root.disabled) {
            continue;
        }
        for (id, claims) in &ids[i].0 {
            // Who else, in the other roots, has this id.
            let elsewhere: Vec<(&str, &Claim)> = ids
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .flat_map(|(j, other)| {
                    other
                        .0
                        .get(id)
                        .into_iter()
                        .flatten()
                        .map(move |c| (roots[j].name, c))
                })
                .collect();
            if elsewhere.is_empty() {
                continue;
            }
            let any_created =
                claims.iter().any(|c| c.created) || elsewhere.iter().any(|(_, c)| c.created);
            if !any_created {
                continue;
            }
            let first = claims.iter().find(|c| c.created).unwrap_or(&claims[0]);
            let others: Vec<Value> = elsewhere
                .iter()
                .map(|(root, c)| json!({ "root": root, "address": c.address }))
                .collect();
            out[i].push(finding(
                "PVE023",
                &first.address,
                json!({
                    "id": id,
                    "root": root.name,
                    "created": first.created,
                    "others_created": elsewhere.iter().any(|(_, c)| c.created),
                    "other_roots": others,
                }),
            ));
        }
        sort_findings(&mut out[i]);
    }
    out
}
