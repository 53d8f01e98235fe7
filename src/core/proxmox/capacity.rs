//! What a plan takes from the cluster and gives back (issue 36, "capacity"): per node, the
//! memory and cores of the bpg guests it creates, deletes or resizes; per datastore, the disk
//! space. Pure: [`demand`] reads the plan, [`report`] sets it next to what the API said is free
//! now (`GET /nodes/{n}/status`, `GET /nodes/{n}/storage/{s}/status`, fetched by
//! `flows::preflight`), and [`findings`] warns (PVE108) where the plan takes more than is free.
//!
//! Units are the bpg provider's: memory in MiB (`memory.dedicated`), disks in GiB (`disk.size`,
//! which the provider calls GB and Proxmox reads as `G`). The report's numbers are what
//! policies see as `data.planbot.capacity` (docs/policies.md).

use crate::core::plan::Json;
use crate::core::plan::{ActionKind, Plan, ResourceChange};
use crate::core::proxmox::findings::{finding, Finding};
use crate::core::proxmox::model::{unknown_at, Kind};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// What a guest uses on one side of a change (before or after).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Usage {
    node: Option<String>,
    /// Counted only while the guest runs (`started`, not a template); `None` when unknown.
    memory_mib: Option<u64>,
    cores: Option<u64>,
    /// storage → GiB.
    disks: BTreeMap<String, u64>,
}

/// What the plan adds to and frees on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDemand {
    pub memory_adds_mib: u64,
    pub memory_frees_mib: u64,
    pub cores_adds: u64,
    pub cores_frees: u64,
    /// The guests that add something here.
    pub guests: BTreeSet<String>,
}

/// What the plan adds to and frees on one storage of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageDemand {
    pub adds_gb: u64,
    pub frees_gb: u64,
    pub guests: BTreeSet<String>,
}

/// What the whole plan adds and frees, by node and by (node, storage).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Demand {
    pub nodes: BTreeMap<String, NodeDemand>,
    pub storages: BTreeMap<(String, String), StorageDemand>,
    /// Guests whose node is known only after apply: not counted.
    pub unplaced: BTreeSet<String>,
}

impl Demand {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.storages.is_empty()
    }
}

fn get<'v>(v: &'v Json<'v>, path: &str) -> Option<&'v Json<'v>> {
    let mut cur = v;
    for seg in path.split('.') {
        cur = match cur {
            Json::Object(m) => m.get(seg)?,
            Json::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    (!cur.is_null()).then_some(cur)
}

/// A known number at `path`, the default when the attribute is absent, `None` when unknown.
fn number(v: &Json, mask: &Json, path: &str, default: Option<u64>) -> Option<u64> {
    if unknown_at(mask, path) {
        return None;
    }
    match get(v, path) {
        Some(n) => n
            .as_u64()
            .or_else(|| n.as_f64().map(|f| f.max(0.0).ceil() as u64)),
        None => default,
    }
}

fn list_len(v: &Json, mask: &Json, path: &str) -> usize {
    let known = get(v, path)
        .and_then(Json::as_array)
        .map_or(0, <[Json]>::len);
    let unknown = get(mask, path)
        .and_then(Json::as_array)
        .map_or(0, <[Json]>::len);
    known.max(unknown)
}

/// What a bpg guest uses according to one side's values. A VM cloned from a template
/// (`clone` block, or `proxmox_virtual_environment_cloned_vm`) inherits what it does not set:
/// only what it sets is counted.
fn usage(kind: Kind, v: &Json, mask: &Json) -> Usage {
    let container = kind == Kind::Container;
    let cloned = kind == Kind::ClonedVm || list_len(v, mask, "clone") > 0;
    let node = if unknown_at(mask, "node_name") {
        None
    } else {
        get(v, "node_name")
            .and_then(Json::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let running = get(v, "started").and_then(Json::as_bool) != Some(false)
        && get(v, "template").and_then(Json::as_bool) != Some(true);
    let has = |block: &str| list_len(v, mask, block) > 0;
    // Proxmox's defaults: 512 MiB, one core, one socket; a clone inherits what it omits.
    let memory_mib = if !running {
        Some(0)
    } else if has("memory") || !cloned {
        number(v, mask, "memory.0.dedicated", Some(512))
    } else {
        None
    };
    let cores = if !running {
        Some(0)
    } else if has("cpu") || !cloned {
        let c = number(v, mask, "cpu.0.cores", Some(1));
        let s = if container {
            Some(1)
        } else {
            number(v, mask, "cpu.0.sockets", Some(1))
        };
        c.zip(s).map(|(c, s)| c * s)
    } else {
        None
    };
    let mut disks = BTreeMap::new();
    let (default_store, default_size) = if container {
        ("local", 4)
    } else {
        ("local-lvm", 8)
    };
    for i in 0..list_len(v, mask, "disk") {
        let store = if unknown_at(mask, &format!("disk.{i}.datastore_id")) {
            None
        } else {
            Some(
                get(v, &format!("disk.{i}.datastore_id"))
                    .and_then(Json::as_str)
                    .filter(|s| !s.is_empty())
                    .unwrap_or(default_store)
                    .to_string(),
            )
        };
        let size = number(v, mask, &format!("disk.{i}.size"), Some(default_size));
        if let (Some(store), Some(size)) = (store, size) {
            *disks.entry(store).or_insert(0) += size;
        }
    }
    Usage {
        node,
        memory_mib,
        cores,
        disks,
    }
}

/// What `plan` adds to and frees from the cluster: creates add their `after`, deletes free
/// their `before`, updates and replacements free the one and add the other where they differ.
pub fn demand(plan: &Plan) -> Demand {
    let mut d = Demand::default();
    for rc in plan.managed_changes().filter(|rc| rc.deposed.is_none()) {
        let Some(kind) = Kind::of(rc) else { continue };
        if kind.is_file() {
            continue;
        }
        add_change(&mut d, kind, rc);
    }
    d
}

fn add_change(d: &mut Demand, kind: Kind, rc: &ResourceChange) {
    let values = rc.change.values();
    let values = values.get();
    let (frees, adds) = match rc.kind() {
        ActionKind::Create => (false, true),
        ActionKind::Delete => (true, false),
        ActionKind::Update
        | ActionKind::DeleteThenCreate
        | ActionKind::CreateThenDelete
        | ActionKind::ForgetAndCreate => (!matches!(rc.kind(), ActionKind::ForgetAndCreate), true),
        _ => return,
    };
    let before = frees.then(|| usage(kind, &values.before, &Json::Null));
    let after = adds.then(|| usage(kind, &values.after, &values.after_unknown));
    let address = rc.address.as_str();
    if let Some(a) = &after {
        if a.node.is_none() {
            d.unplaced.insert(address.to_string());
        }
    }
    let same_node = matches!((&before, &after), (Some(b), Some(a)) if b.node == a.node);
    // Memory and cores: per node, only what changes.
    let mem = |u: &Option<Usage>| u.as_ref().and_then(|u| u.memory_mib);
    let cores = |u: &Option<Usage>| u.as_ref().and_then(|u| u.cores);
    let changed = |b: Option<u64>, a: Option<u64>| !same_node || b != a;
    if changed(mem(&before), mem(&after)) || changed(cores(&before), cores(&after)) {
        if let Some(b) = before.as_ref() {
            if let Some(node) = &b.node {
                let n = d.nodes.entry(node.clone()).or_default();
                if changed(mem(&before), mem(&after)) {
                    n.memory_frees_mib += b.memory_mib.unwrap_or(0);
                }
                if changed(cores(&before), cores(&after)) {
                    n.cores_frees += b.cores.unwrap_or(0);
                }
            }
        }
        if let Some(a) = after.as_ref() {
            if let Some(node) = &a.node {
                let n = d.nodes.entry(node.clone()).or_default();
                if changed(mem(&before), mem(&after)) {
                    n.memory_adds_mib += a.memory_mib.unwrap_or(0);
                }
                if changed(cores(&before), cores(&after)) {
                    n.cores_adds += a.cores.unwrap_or(0);
                }
                if a.memory_mib.unwrap_or(0) > 0 || a.cores.unwrap_or(0) > 0 {
                    n.guests.insert(address.to_string());
                }
            }
        }
    }
    // Disks: per (node, storage), only what changes.
    let stores: BTreeSet<&String> = before
        .iter()
        .chain(after.iter())
        .flat_map(|u| u.disks.keys())
        .collect();
    for store in stores {
        let b = before.as_ref().and_then(|u| u.disks.get(store).copied());
        let a = after.as_ref().and_then(|u| u.disks.get(store).copied());
        if same_node && a == b {
            continue;
        }
        if let (Some(gb), Some(node)) = (b, before.as_ref().and_then(|u| u.node.clone())) {
            d.storages
                .entry((node, store.clone()))
                .or_default()
                .frees_gb += gb;
        }
        if let (Some(gb), Some(node)) = (a, after.as_ref().and_then(|u| u.node.clone())) {
            let s = d.storages.entry((node, store.clone())).or_default();
            s.adds_gb += gb;
            s.guests.insert(address.to_string());
        }
    }
}

/// `GET /nodes/{node}/status`, the parts capacity reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeStatus {
    pub memory_total: u64,
    /// Bytes a new guest can have: `memory.available` (PVE 9), else `memory.free`.
    pub memory_free: u64,
    /// Logical CPUs (`cpuinfo.cpus`).
    pub cpus: u64,
}

/// `GET /nodes/{node}/storage/{storage}/status`, the parts capacity reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageStatus {
    pub storage_type: String,
    pub shared: bool,
    pub total: u64,
    pub avail: u64,
}

/// What the API said is free now; a read the token may not make is `Err(why)` (the row then
/// says "unknown" and why; it is not a failure of the preflight).
#[derive(Debug, Clone, Default)]
pub struct Free {
    pub nodes: BTreeMap<String, Result<NodeStatus, String>>,
    pub storages: BTreeMap<(String, String), Result<StorageStatus, String>>,
}

/// One node's row: the numbers policies read as `data.planbot.capacity.nodes[_]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRow {
    pub node: String,
    pub memory_adds_mib: u64,
    pub memory_frees_mib: u64,
    /// Free now (`null` when it could not be read).
    pub memory_free_mib: Option<u64>,
    pub memory_total_mib: Option<u64>,
    pub cores_adds: u64,
    pub cores_frees: u64,
    pub cpus: Option<u64>,
    pub guests: Vec<String>,
    /// Why the free numbers are unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
    /// The plan takes more memory than is free.
    pub exceeds: bool,
}

/// One datastore's row (`data.planbot.capacity.storages[_]`); a shared storage is one row for
/// every node (`node` is `null`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageRow {
    pub storage: String,
    pub node: Option<String>,
    #[serde(rename = "type")]
    pub storage_type: Option<String>,
    pub shared: bool,
    pub disk_adds_gb: u64,
    pub disk_frees_gb: u64,
    pub disk_free_gb: Option<u64>,
    pub disk_total_gb: Option<u64>,
    pub guests: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
    pub exceeds: bool,
}

/// The plan's demand next to what is free: the note's table and `data.planbot.capacity`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    pub nodes: Vec<NodeRow>,
    pub storages: Vec<StorageRow>,
    /// Guests whose node is known only after apply (not counted).
    pub unplaced: Vec<String>,
}

impl Capacity {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.storages.is_empty()
    }

    /// The object policies see as `data.planbot.capacity`.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Whether the net need (adds − frees) is more than is free.
fn exceeds(adds: u64, frees: u64, free: Option<u64>) -> bool {
    free.is_some_and(|free| adds.saturating_sub(frees) > free)
}

/// Set `demand` next to `free`. Rows where the plan neither adds nor frees anything are left
/// out; a shared storage's rows (one per node) are summed into one.
pub fn report(demand: &Demand, free: &Free) -> Capacity {
    let nodes = demand
        .nodes
        .iter()
        .filter(|(_, n)| n.memory_adds_mib + n.memory_frees_mib + n.cores_adds + n.cores_frees > 0)
        .map(|(node, n)| {
            let status = free.nodes.get(node);
            let ok = status.and_then(|s| s.as_ref().ok());
            let memory_free_mib = ok.map(|s| s.memory_free / MIB);
            NodeRow {
                node: node.clone(),
                memory_adds_mib: n.memory_adds_mib,
                memory_frees_mib: n.memory_frees_mib,
                memory_free_mib,
                memory_total_mib: ok.map(|s| s.memory_total / MIB),
                cores_adds: n.cores_adds,
                cores_frees: n.cores_frees,
                cpus: ok.map(|s| s.cpus),
                guests: n.guests.iter().cloned().collect(),
                unknown: status.and_then(|s| s.as_ref().err().cloned()),
                exceeds: exceeds(n.memory_adds_mib, n.memory_frees_mib, memory_free_mib),
            }
        })
        .collect();
    let mut rows: BTreeMap<(String, Option<String>), StorageRow> = BTreeMap::new();
    for ((node, storage), s) in &demand.storages {
        if s.adds_gb + s.frees_gb == 0 {
            continue;
        }
        let status = free.storages.get(&(node.clone(), storage.clone()));
        let ok = status.and_then(|s| s.as_ref().ok());
        let shared = ok.is_some_and(|s| s.shared);
        let key = (storage.clone(), (!shared).then(|| node.clone()));
        let row = rows.entry(key.clone()).or_insert_with(|| StorageRow {
            storage: storage.clone(),
            node: key.1.clone(),
            storage_type: ok.map(|s| s.storage_type.clone()),
            shared,
            disk_adds_gb: 0,
            disk_frees_gb: 0,
            disk_free_gb: ok.map(|s| s.avail / GIB),
            disk_total_gb: ok.map(|s| s.total / GIB),
            guests: Vec::new(),
            unknown: status.and_then(|s| s.as_ref().err().cloned()),
            exceeds: false,
        });
        row.disk_adds_gb += s.adds_gb;
        row.disk_frees_gb += s.frees_gb;
        for g in &s.guests {
            if !row.guests.contains(g) {
                row.guests.push(g.clone());
            }
        }
    }
    let storages = rows
        .into_values()
        .map(|mut r| {
            r.exceeds = exceeds(r.disk_adds_gb, r.disk_frees_gb, r.disk_free_gb);
            r
        })
        .collect();
    Capacity {
        nodes,
        storages,
        unplaced: demand.unplaced.iter().cloned().collect(),
    }
}

/// PVE108: a warning for each node whose memory, and each storage whose space, the plan takes
/// more of than is free now. On the whole plan (no address): the message names the guests.
pub fn findings(capacity: &Capacity) -> Vec<Finding> {
    let mut out = Vec::new();
    for n in capacity.nodes.iter().filter(|n| n.exceeds) {
        out.push(finding(
            "PVE108",
            "",
            json!({"what": "memory", "node": n.node, "adds": n.memory_adds_mib,
                   "frees": n.memory_frees_mib, "free": n.memory_free_mib,
                   "guests": n.guests}),
        ));
    }
    for s in capacity.storages.iter().filter(|s| s.exceeds) {
        out.push(finding(
            "PVE108",
            "",
            json!({"what": "disk", "storage": s.storage, "node": s.node, "type": s.storage_type,
                   "adds": s.disk_adds_gb, "frees": s.disk_frees_gb, "free": s.disk_free_gb,
                   "guests": s.guests}),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(actions: &[&str], before: Value, after: Value) -> Value {
        json!({"address": "proxmox_virtual_environment_vm.x", "mode": "managed",
               "type": "proxmox_virtual_environment_vm", "name": "x",
               "provider_name": "registry.opentofu.org/bpg/proxmox",
               "change": {"actions": actions, "before": before, "after": after,
                          "after_unknown": {}}})
    }

    fn plan_of(changes: Vec<Value>) -> Plan {
        let text = json!({"format_version": "1.2", "resource_changes": changes}).to_string();
        Plan::from_json(text.as_bytes()).expect("a plan")
    }

    fn guest(node: &str, cores: u64, mem: u64, store: &str, gb: u64) -> Value {
        json!({"node_name": node, "started": true, "cpu": [{"cores": cores, "sockets": 1}],
               "memory": [{"dedicated": mem}],
               "disk": [{"datastore_id": store, "size": gb, "interface": "virtio0"}]})
    }

    #[test]
    fn creates_add_deletes_free_and_updates_count_what_changes() {
        let d = demand(&plan_of(vec![
            vm(
                &["create"],
                Value::Null,
                guest("pve01", 4, 8192, "local-lvm", 40),
            ),
            vm(
                &["delete"],
                guest("pve01", 2, 2048, "local-lvm", 10),
                Value::Null,
            ),
            // Only the tags changed: nothing counted.
            vm(
                &["update"],
                guest("pve02", 2, 2048, "local-lvm", 10),
                guest("pve02", 2, 2048, "local-lvm", 10),
            ),
            // Memory grown, disk grown.
            vm(
                &["update"],
                guest("pve02", 2, 2048, "local-lvm", 10),
                guest("pve02", 2, 4096, "local-lvm", 20),
            ),
        ]));
        let n1 = &d.nodes["pve01"];
        assert_eq!((n1.memory_adds_mib, n1.memory_frees_mib), (8192, 2048));
        assert_eq!((n1.cores_adds, n1.cores_frees), (4, 2));
        let n2 = &d.nodes["pve02"];
        assert_eq!((n2.memory_adds_mib, n2.memory_frees_mib), (4096, 2048));
        assert_eq!((n2.cores_adds, n2.cores_frees), (0, 0));
        let s1 = &d.storages[&("pve01".to_string(), "local-lvm".to_string())];
        assert_eq!((s1.adds_gb, s1.frees_gb), (40, 10));
        let s2 = &d.storages[&("pve02".to_string(), "local-lvm".to_string())];
        assert_eq!((s2.adds_gb, s2.frees_gb), (20, 10));
    }

    #[test]
    fn a_stopped_guest_takes_no_memory_and_a_move_frees_the_old_node() {
        let mut stopped = guest("pve01", 4, 8192, "local-lvm", 40);
        stopped["started"] = false.into();
        let d = demand(&plan_of(vec![
            vm(&["create"], Value::Null, stopped),
            vm(
                &["update"],
                guest("pve01", 2, 2048, "nfs", 10),
                guest("pve02", 2, 2048, "nfs", 10),
            ),
        ]));
        assert_eq!(d.nodes["pve01"].memory_adds_mib, 0);
        assert_eq!(d.nodes["pve01"].memory_frees_mib, 2048);
        assert_eq!(d.nodes["pve02"].memory_adds_mib, 2048);
    }

    #[test]
    fn the_net_need_is_compared_with_what_is_free() {
        let d = demand(&plan_of(vec![vm(
            &["create"],
            Value::Null,
            guest("pve01", 4, 8192, "local-lvm", 40),
        )]));
        let mut free = Free::default();
        free.nodes.insert(
            "pve01".into(),
            Ok(NodeStatus {
                memory_total: 64 * GIB,
                memory_free: 4 * GIB,
                cpus: 16,
            }),
        );
        free.storages.insert(
            ("pve01".into(), "local-lvm".into()),
            Err("the token lacks Datastore.Audit".into()),
        );
        let c = report(&d, &free);
        assert!(c.nodes[0].exceeds);
        assert_eq!(c.nodes[0].memory_free_mib, Some(4096));
        assert!(!c.storages[0].exceeds);
        assert!(c.storages[0].unknown.is_some());
        assert_eq!(findings(&c).len(), 1);
    }
}
