//! Proxmox preflight PVE101–PVE114, the pure half: what a plan needs from the cluster
//! ([`needs`]), and the findings once the facts have been fetched ([`evaluate`]).
//!
//! The fetching (read-only API calls) lives in `flows::preflight`.

use crate::core::plan::{ActionKind, Json, Plan};
use crate::core::proxmox::access::{self, Need, Privileges};
use crate::core::proxmox::capacity;
use crate::core::proxmox::findings::{
    finding_with, render_macro, sort_findings, Facts, Finding, Severity,
};
use crate::core::proxmox::ha;
use crate::core::proxmox::model::{
    after, before, block_len, is_created, is_planned, Attr, Kind, Res,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// A storage a resource uses, and for what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageNeed {
    pub address: String,
    pub storage: String,
    pub node: Option<String>,
    /// The content type it must allow (`import`, `iso`, `vztmpl`, `snippets`, `images`, `rootdir`).
    pub content: Option<String>,
    /// A file is stored (the storage must be directory based).
    pub file: bool,
}

/// Everything the plan needs from the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    /// node → the resources that use it.
    pub nodes: BTreeMap<String, Vec<String>>,
    pub storages: Vec<StorageNeed>,
    /// Downloads created: (address, storage, node).
    pub downloads: Vec<(String, String, String)>,
    /// Import downloads/files: (address, file name) — need Proxmox VE ≥ 8.4.
    pub imports: Vec<(String, String)>,
    /// Snippets created: (address, storage).
    pub snippets: Vec<(String, String)>,
    /// Guests created with a fixed id: (address, vmid).
    pub vmids: Vec<(String, u64)>,
    /// Privileged containers / VM startup blocks: (address, "container" | "startup").
    pub sys_modify: Vec<(String, &'static str)>,
    /// What the plan adds to and frees from each node and storage (capacity, PVE108).
    pub demand: capacity::Demand,
    /// (node, bridge) → the guests that attach a NIC to it (PVE109).
    pub bridges: BTreeMap<(String, String), Vec<String>>,
    /// Containers that set or change feature flags other than `nesting`: (address, flags).
    pub root_features: Vec<(String, Vec<String>)>,
    /// VMs created as full clones (PVE111).
    pub clones: Vec<CloneNeed>,
    /// Guests moved to another node in place (PVE112: through HA when HA manages them).
    pub ha_moves: Vec<ha::HaMove>,
    /// HA groups created (PVE113: replaced by rules on PVE 9).
    pub ha_groups: Vec<String>,
    /// The SDN objects the plan changes, the VNets it creates, and whether it applies them
    /// (PVE114; a bridge named after a VNet the plan creates is not missing).
    pub sdn: crate::core::proxmox::model::SdnChanges,
}

/// A VM created by cloning `template`: where it goes, and where the plan says the template is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneNeed {
    pub address: String,
    pub template: u64,
    /// `node_name` of the new VM.
    pub node: String,
    /// `clone.node_name`, when set.
    pub source_node: Option<String>,
    /// The storages the plan puts its disks on (`disk[*].datastore_id`, `clone.datastore_id`).
    pub storages: Vec<String>,
}

impl Needs {
    pub fn is_empty(&self) -> bool {
        *self == Needs::default()
    }

    /// The ACL paths whose effective privileges the checks read (one API call each).
    pub fn permission_paths(&self) -> BTreeSet<String> {
        let mut p = BTreeSet::new();
        for (_, storage, node) in &self.downloads {
            p.insert("/".to_string());
            p.insert(format!("/nodes/{node}"));
            p.insert(format!("/storage/{storage}"));
        }
        for (_, storage) in &self.snippets {
            p.insert(format!("/storage/{storage}"));
        }
        for s in &self.storages {
            p.insert(format!("/storage/{}", s.storage));
        }
        if !self.sys_modify.is_empty() {
            p.insert("/".to_string());
        }
        p
    }
}

fn known(rc: &Res, path: &str) -> Option<String> {
    after(rc, path).str().map(str::to_string)
}

/// The fixed VM/CT id of a guest, if set and known.
fn vmid(rc: &Res) -> Option<u64> {
    if let Attr::Known(v) = after(rc, "vm_id") {
        return v.as_u64().filter(|id| *id > 0);
    }
    // The framework `proxmox_vm` calls it `id`.
    if rc.resource_type == "proxmox_vm" {
        if let Attr::Known(v) = after(rc, "id") {
            return v.as_u64();
        }
    }
    None
}

/// Whether `plan` touches Proxmox, so that the live preflight concerns it: a resource or data
/// source of the bpg provider (`proxmox_virtual_environment_*`, the short `proxmox_*` names) or
/// of Telmate's (`proxmox_vm_qemu`, `proxmox_lxc`, …), changed, drifted or in the
/// configuration (modules included), or a change the engine names as from either provider.
/// Anything that looks like one counts: a root that may need the preflight keeps it.
pub fn touches_proxmox(plan: &Plan) -> bool {
    fn proxmox_type(t: &str) -> bool {
        t.starts_with("proxmox_")
    }
    fn proxmox_provider(p: &str) -> bool {
        let p = p.to_ascii_lowercase();
        p.ends_with("bpg/proxmox") || p.ends_with("telmate/proxmox")
    }
    fn in_module(m: &crate::core::plan::ConfigModule) -> bool {
        m.resources.iter().any(|r| {
            r.get("type")
                .and_then(Value::as_str)
                .is_some_and(proxmox_type)
        }) || m.module_calls.values().any(|c| in_module(&c.module))
    }
    plan.resource_changes
        .iter()
        .chain(&plan.resource_drift)
        .any(|rc| {
            proxmox_type(&rc.resource_type)
                || rc.provider_name.as_deref().is_some_and(proxmox_provider)
        })
        || plan.configuration.as_ref().is_some_and(|c| {
            in_module(&c.root_module)
                || c.provider_config
                    .values()
                    .filter_map(|p| p.full_name.as_deref())
                    .any(proxmox_provider)
        })
}

/// Read what the plan needs from the cluster (only resources that are created or changed).
pub fn needs(plan: &Plan) -> Needs {
    let mut n = Needs::default();
    for rc in plan.managed_changes().filter(|rc| rc.deposed.is_none()) {
        let Some(kind) = Kind::of(rc) else { continue };
        if !is_planned(rc) {
            continue;
        }
        // One resource's values at a time.
        let rc = &Res::parse(rc);
        let planned = Planned {
            rc,
            node: known(rc, "node_name"),
        };
        planned.add_needs(&mut n, kind);
    }
    n.ha_groups = created_ha_groups(plan);
    n.sdn = crate::core::proxmox::model::sdn_changes(plan);
    n.demand = capacity::demand(plan);
    n
}

/// One resource the plan creates or changes, read for [`needs`]: its values and its node.
struct Planned<'a, 'p> {
    rc: &'a Res<'p>,
    node: Option<String>,
}

impl Planned<'_, '_> {
    /// What this resource of `kind` needs: its node, its storages, and what its kind asks.
    fn add_needs(&self, n: &mut Needs, kind: Kind) {
        let rc = self.rc;
        if let Some(node) = &self.node {
            n.nodes
                .entry(node.clone())
                .or_default()
                .push(rc.address.clone());
        }
        match kind {
            Kind::DownloadFile | Kind::File => self.add_file_needs(n, kind),
            Kind::Vm | Kind::ClonedVm => self.add_vm_needs(n),
            Kind::Container => self.add_container_needs(n),
        }
        if kind != Kind::DownloadFile && kind != Kind::File && rc.kind() == ActionKind::Create {
            if let Some(id) = vmid(rc) {
                n.vmids.push((rc.address.clone(), id));
            }
        }
        if kind.is_vm() || kind == Kind::Container {
            n.ha_moves.extend(ha_move(rc, kind));
        }
    }

    /// A need of `storage`, when set, on this resource's node: for `content`, a file's or a
    /// guest disk's.
    fn storage(&self, n: &mut Needs, storage: Option<String>, content: Option<&str>, file: bool) {
        if let Some(s) = storage {
            n.storages.push(StorageNeed {
                address: self.rc.address.clone(),
                storage: s,
                node: self.node.clone(),
                content: content.map(str::to_string),
                file,
            });
        }
    }

    /// The storage of each `block.N.datastore_id`, for guest disks of `content`.
    fn disks(&self, n: &mut Needs, block: &str, content: &str) {
        for i in 0..block_len(self.rc, block) {
            self.storage(
                n,
                known(self.rc, &format!("{block}.{i}.datastore_id")),
                Some(content),
                false,
            );
        }
    }

    /// A file or a download: its storage, an import's file name, and a created download's or
    /// snippet's storage.
    fn add_file_needs(&self, n: &mut Needs, kind: Kind) {
        let rc = self.rc;
        let content = known(rc, "content_type");
        self.storage(n, known(rc, "datastore_id"), content.as_deref(), true);
        let created = is_created(rc);
        let ds = known(rc, "datastore_id");
        if content.as_deref() == Some("import") {
            let name = known(rc, "file_name")
                .or_else(|| known(rc, "source_raw.0.file_name"))
                .unwrap_or_default();
            n.imports.push((rc.address.clone(), name));
        }
        if let (true, Some(ds)) = (created, ds) {
            if kind == Kind::DownloadFile {
                if let Some(node) = &self.node {
                    n.downloads.push((rc.address.clone(), ds, node.clone()));
                }
            } else if content.as_deref() == Some("snippets") {
                n.snippets.push((rc.address.clone(), ds));
            }
        }
    }

    /// A VM: its disks' storages, a startup block set (root only), its bridges, its clone.
    fn add_vm_needs(&self, n: &mut Needs) {
        let rc = self.rc;
        for block in ["disk", "initialization", "efi_disk", "tpm_state"] {
            self.disks(n, block, "images");
        }
        let startup = matches!(after(rc, "startup"), Attr::Known(Json::Array(a)) if !a.is_empty());
        let startup_changed =
            rc.kind() != ActionKind::Update || before(rc, "startup") != after_value(rc, "startup");
        if startup && startup_changed {
            n.sys_modify.push((rc.address.clone(), "startup"));
        }
        bridges(n, rc, self.node.as_deref(), "network_device");
        if let Some(c) = clone_need(rc, self.node.as_deref()) {
            n.clones.push(c);
        }
    }

    /// A container: its disks' storages, privileged (root only), its bridges, and feature
    /// flags only root may set.
    fn add_container_needs(&self, n: &mut Needs) {
        let rc = self.rc;
        self.disks(n, "disk", "rootdir");
        let privileged = match after(rc, "unprivileged") {
            Attr::Absent => true,
            a => a.bool() == Some(false),
        };
        let changed = rc.kind() != ActionKind::Update
            || before(rc, "unprivileged") != after_value(rc, "unprivileged");
        if privileged && changed {
            n.sys_modify.push((rc.address.clone(), "container"));
        }
        bridges(n, rc, self.node.as_deref(), "network_interface");
        let flags = root_only_features(rc);
        if !flags.is_empty() {
            n.root_features.push((rc.address.clone(), flags));
        }
    }
}

/// The HA groups the plan creates (PVE113).
fn created_ha_groups(plan: &Plan) -> Vec<String> {
    plan.managed_changes()
        .filter(|rc| is_created(rc))
        .filter(|rc| {
            let t = rc.resource_type.as_str();
            t == "proxmox_virtual_environment_hagroup" || t == "proxmox_hagroup"
        })
        .map(|rc| rc.address.clone())
        .collect()
}

/// A guest updated in place whose `node_name` changes: the provider migrates it (PVE112).
fn ha_move(rc: &Res, kind: Kind) -> Option<ha::HaMove> {
    if rc.kind() != ActionKind::Update {
        return None;
    }
    let from = before(rc, "node_name")?.as_str()?.to_string();
    let to = known(rc, "node_name")?;
    let vmid = before(rc, "vm_id")
        .or_else(|| before(rc, "id"))
        .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))?;
    (from != to).then(|| ha::HaMove {
        address: rc.address.clone(),
        sid: format!(
            "{}:{vmid}",
            if kind == Kind::Container { "ct" } else { "vm" }
        ),
        vmid,
        from,
        to,
    })
}

/// A created VM's `clone {}` block, when its template id and node are known.
fn clone_need(rc: &Res, node: Option<&str>) -> Option<CloneNeed> {
    if !is_created(rc) || block_len(rc, "clone") == 0 {
        return None;
    }
    let template = match after(rc, "clone.0.vm_id") {
        Attr::Known(v) => v.as_u64()?,
        _ => return None,
    };
    if after(rc, "clone.0.node_name").is_unknown() {
        return None;
    }
    let mut storages: Vec<String> = (0..block_len(rc, "disk"))
        .filter_map(|i| known(rc, &format!("disk.{i}.datastore_id")))
        .chain(known(rc, "clone.0.datastore_id"))
        .collect();
    storages.dedup();
    Some(CloneNeed {
        address: rc.address.clone(),
        template,
        node: node?.to_string(),
        source_node: known(rc, "clone.0.node_name"),
        storages,
    })
}

/// The container feature flags other than `nesting` that `rc` sets or changes (`keyctl`,
/// `fuse`, `mount`): Proxmox lets only `root@pam` change them.
fn root_only_features(rc: &Res) -> Vec<String> {
    let mut flags = Vec::new();
    for flag in ["keyctl", "fuse", "mount"] {
        let path = format!("features.0.{flag}");
        let set = match after(rc, &path) {
            Attr::Known(Json::Bool(b)) => *b,
            Attr::Known(Json::Array(a)) => !a.is_empty(),
            Attr::Known(Json::Str(s)) => !s.is_empty(),
            _ => false,
        };
        let was = before(rc, &path);
        let now = after_value(rc, &path);
        let changed = rc.kind() != ActionKind::Update || was != now;
        if set && changed {
            flags.push(flag.to_string());
        }
    }
    flags
}

/// Record the bridges a guest's NICs (`block`) attach to on its node, when both are known and
/// the NICs are new or changed.
fn bridges(n: &mut Needs, rc: &Res, node: Option<&str>, block: &str) {
    let Some(node) = node else { return };
    if rc.kind() == ActionKind::Update
        && before(rc, block) == after_value(rc, block)
        && before(rc, "node_name") == after_value(rc, "node_name")
    {
        return;
    }
    for i in 0..block_len(rc, block) {
        let enabled = after(rc, &format!("{block}.{i}.enabled")).bool() != Some(false);
        if let (true, Some(bridge)) = (enabled, known(rc, &format!("{block}.{i}.bridge"))) {
            let users = n.bridges.entry((node.to_string(), bridge)).or_default();
            if !users.contains(&rc.address) {
                users.push(rc.address.clone());
            }
        }
    }
}

fn after_value<'a>(rc: &'a Res, path: &str) -> Option<&'a Json<'a>> {
    match after(rc, path) {
        Attr::Known(v) => Some(v),
        _ => None,
    }
}

/// A node as `GET /nodes` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFact {
    pub name: String,
    pub online: bool,
    pub status: String,
}

/// A storage as `GET /storage` (+ `GET /nodes/{n}/storage`) describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageFact {
    pub id: String,
    pub storage_type: String,
    pub content: Vec<String>,
    /// Limited to these nodes; empty = every node.
    pub nodes: Vec<String>,
    pub enabled: bool,
    pub shared: bool,
    pub file_based: bool,
}

/// What the API said, fetched by `flows::preflight`.
#[derive(Debug, Clone, Default)]
pub struct ClusterFacts {
    /// `user@realm!name` (never the secret).
    pub token_id: String,
    /// The release (`8.4.1`).
    pub version: Option<String>,
    pub nodes: Vec<NodeFact>,
    pub storages: Vec<StorageFact>,
    /// node → storage ids usable there (`GET /nodes/{n}/storage`), when fetched.
    pub node_storages: BTreeMap<String, BTreeSet<String>>,
    /// ACL path → the token's effective privileges on exactly that path.
    pub privileges: Privileges,
    /// vmids the cluster already uses (of those asked about).
    pub taken_vmids: BTreeSet<u64>,
    /// A free id to suggest.
    pub free_vmid: Option<u64>,
    /// What is free now on the nodes and storages the plan adds to or frees (capacity).
    pub free: capacity::Free,
    /// (node, bridge) pairs the plan uses that the node does not have, neither as an interface
    /// (`GET /nodes/{n}/network/{iface}`) nor as an SDN VNet; with the bridges it does have,
    /// when the list could be read.
    pub missing_bridges: BTreeMap<(String, String), Vec<String>>,
    /// Who the apply acts as (`user@realm!token` or `user@realm`): its token's id when known,
    /// else the token the preflight runs with.
    pub apply_identity: Option<String>,
    /// The guests `GET /cluster/resources?type=vm` lists (the token sees those it has
    /// `VM.Audit` on), by vmid, when the plan creates a guest with a fixed id or clones.
    pub guests: BTreeMap<u64, GuestFact>,
    /// The SDN VNets the plan's guests attach to (found as bridges): their zone, pending state
    /// and whether the apply may use them (PVE114).
    pub vnets: BTreeMap<String, VnetFact>,
    /// Why `GET /cluster/sdn/vnets?pending=1` could not be read (refused), when it could not.
    pub vnets_unread: Option<String>,
    /// What HA says about the guests the plan moves (PVE112), or why it could not be read (a
    /// refused read); `None` when nothing was asked.
    pub ha: Option<Result<ha::HaFacts, String>>,
    /// The ids that list may hide from the token ([`access::hidden_guests`]); `None`: any.
    /// An id it does not show and may hide is asked about one by one
    /// (`GET /cluster/nextid?vmid=`), and a template it does not show and may hide is not judged.
    pub hidden_guests: Option<BTreeSet<u64>>,
}

impl ClusterFacts {
    /// Whether guest `id` may exist without the guest list showing it.
    pub fn may_hide(&self, id: u64) -> bool {
        self.hidden_guests.as_ref().is_none_or(|h| h.contains(&id))
    }
}

/// An SDN VNet a guest attaches to, as `GET /cluster/sdn/vnets?pending=1` lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VnetFact {
    pub zone: Option<String>,
    /// `new`, `changed` or `deleted` while the SDN configuration is not applied.
    pub state: Option<String>,
    /// Whether the apply's identity has `SDN.Use` on `/sdn/zones/{zone}/{vnet}`, or why that
    /// could not be read; `None` when not asked (zone unknown).
    pub may_use: Option<Result<bool, String>>,
}

/// A guest as `GET /cluster/resources?type=vm` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestFact {
    pub node: String,
    pub name: String,
    /// `qemu` or `lxc`.
    pub kind: String,
    pub template: bool,
}

impl ClusterFacts {
    /// The storages marked shared, for the lint rules.
    pub fn lint_facts(&self) -> Facts {
        Facts {
            shared_storages: self
                .storages
                .iter()
                .filter(|s| s.shared)
                .map(|s| s.id.clone())
                .collect(),
            storage_types: self
                .storages
                .iter()
                .map(|s| (s.id.clone(), s.storage_type.clone()))
                .collect(),
            ..Facts::default()
        }
    }
}

fn check(id: &'static str, severity: Severity, address: &str, d: Value) -> Finding {
    finding_with(id, severity, address, d)
}

fn version_at_least(version: &str, want: (u64, u64)) -> Option<bool> {
    let mut p = version.split(['.', '-']);
    let major: u64 = p.next()?.parse().ok()?;
    let minor: u64 = p.next()?.parse().ok()?;
    Some((major, minor) >= want)
}

/// The preflight could not read what it needs (API unreachable, a 5xx, a timeout, a token
/// refused): one PVE101 error, so the plan status fails and an apply is refused (fail closed).
pub fn could_not_run(url: &str, error: &str) -> Finding {
    check(
        "PVE101",
        Severity::Error,
        "",
        json!({"url": url, "error": error}),
    )
}

/// The fix's details for `need` on `path`: the role and an ACL for the token and for its user
/// (a privilege-separated token gets only what both have; a full-privilege token, its user's).
fn grant(need: &Need, path: &str, token: &str) -> Value {
    json!({"role": need.role, "privs": need.grants, "path": path, "token": token,
           "user": access::token_user(token)})
}

/// The findings of PVE101–PVE114 for `needs`, given what the API said: one step per rule.
pub fn evaluate(needs: &Needs, facts: &ClusterFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(pve101_import_needs_8_4(needs, facts));
    let (node_findings, bad_nodes) = pve102_nodes(needs, facts);
    out.extend(node_findings);
    out.extend(pve103_storages(needs, facts, &bad_nodes));
    out.extend(pve104_downloads(needs, facts));
    out.extend(pve105_snippets(needs, facts));
    out.extend(pve106_fixed_vmids(needs, facts));
    out.extend(pve107_sys_modify(needs, facts));
    out.extend(capacity::findings(&capacity_of(needs, facts)));
    out.extend(pve109_bridges(needs, facts));
    out.extend(pve110_root_features(needs, facts));
    out.extend(pve111_clones(needs, facts));
    out.extend(pve114_vnets(needs, facts));
    out.extend(ha::pve112(
        &needs.ha_moves,
        facts.ha.as_ref(),
        &facts.token_id,
    ));
    out.extend(ha::pve113(&needs.ha_groups, facts.version.as_deref()));
    sort_findings(&mut out);
    out
}

/// What the plan takes from the cluster next to what is free (the note's table,
/// `data.planbot.capacity`); empty when the plan adds and frees nothing.
pub fn capacity_of(needs: &Needs, facts: &ClusterFacts) -> capacity::Capacity {
    capacity::report(&needs.demand, &facts.free)
}

/// PVE101: the release must support `import` content (8.4 or later).
fn pve101_import_needs_8_4(needs: &Needs, facts: &ClusterFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(v) = &facts.version {
        if version_at_least(v, (8, 4)) == Some(false) {
            for (address, name) in &needs.imports {
                out.push(check(
                    "PVE101",
                    Severity::Error,
                    address,
                    json!({"version": v, "name": name}),
                ));
            }
        }
    }
    out
}

/// PVE102: every node used exists and is online. Also returns the nodes that are not, whose
/// storages PVE103 then does not judge.
fn pve102_nodes(needs: &Needs, facts: &ClusterFacts) -> (Vec<Finding>, BTreeSet<String>) {
    let mut out = Vec::new();
    let mut bad_nodes = BTreeSet::new();
    for (node, users) in &needs.nodes {
        let fact = facts.nodes.iter().find(|n| &n.name == node);
        let d = match fact {
            None => {
                json!({"node": node, "known": facts.nodes.iter().map(|n| &n.name).collect::<Vec<_>>()})
            }
            Some(f) if !f.online => json!({"node": node, "offline": true, "status": f.status}),
            Some(_) => continue,
        };
        bad_nodes.insert(node.clone());
        // An offline node is an error too: its storages cannot be read, and the apply
        // cannot reach it (fail closed).
        for address in users {
            out.push(check("PVE102", Severity::Error, address, d.clone()));
        }
    }
    (out, bad_nodes)
}

/// PVE103: every storage used exists, is visible, enabled, on its node, and allows the content;
/// at most one finding per (resource, storage, content).
fn pve103_storages(
    needs: &Needs,
    facts: &ClusterFacts,
    bad_nodes: &BTreeSet<String>,
) -> Vec<Finding> {
    let mut seen = BTreeSet::new();
    needs
        .storages
        .iter()
        .filter(|need| {
            seen.insert((
                need.address.clone(),
                need.storage.clone(),
                need.content.clone(),
            ))
        })
        .filter_map(|need| storage_problem(need, facts, bad_nodes))
        .collect()
}

/// PVE103 for one storage need: the first thing wrong, if any.
fn storage_problem(
    need: &StorageNeed,
    facts: &ClusterFacts,
    bad_nodes: &BTreeSet<String>,
) -> Option<Finding> {
    let token = facts.token_id.as_str();
    let finding = |d: Value| Some(check("PVE103", Severity::Error, &need.address, d));
    let Some(s) = facts.storages.iter().find(|s| s.id == need.storage) else {
        let path = format!("/storage/{}", need.storage);
        let visible = facts.privileges.storage_visible(&need.storage);
        if !visible && facts.privileges.knows(&path) {
            return finding(
                json!({"problem": "hidden", "storage": need.storage, "token": token,
                       "user": access::token_user(token), "role": access::STORAGE_VISIBLE_ROLE,
                       "privs": access::STORAGE_VISIBLE_ANY}),
            );
        }
        return finding(json!({"problem": "missing", "storage": need.storage,
                   "known": facts.storages.iter().map(|s| &s.id).collect::<Vec<_>>()}));
    };
    let base = json!({"storage": s.id, "type": s.storage_type, "node": need.node});
    let with = |problem: &str, extra: Value| {
        let mut d = base.clone();
        d["problem"] = problem.into();
        if let (Some(o), Some(e)) = (d.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        d
    };
    if !s.enabled {
        return finding(with("disabled", json!({})));
    }
    if let Some(node) = need.node.as_ref().filter(|n| !bad_nodes.contains(*n)) {
        let on_node = s.nodes.is_empty() || s.nodes.iter().any(|n| n == node);
        let listed = facts
            .node_storages
            .get(node)
            .is_none_or(|ids| ids.contains(&s.id));
        if !on_node || !listed {
            return finding(with("node", json!({"nodes": s.nodes})));
        }
    }
    if need.file && !s.file_based {
        return finding(with("not_file", json!({})));
    }
    if let Some(content) = &need.content {
        if !s.content.iter().any(|c| c == content) {
            let mut new_list = s.content.clone();
            new_list.push(content.clone());
            return finding(with(
                "content",
                json!({"content": content, "new_list": new_list}),
            ));
        }
    }
    None
}

/// PVE104: the token may download to each storage on each node a download is created on.
fn pve104_downloads(needs: &Needs, facts: &ClusterFacts) -> Vec<Finding> {
    let token = facts.token_id.as_str();
    let mut out = Vec::new();
    for (address, storage, node) in &needs.downloads {
        let Some(gap) = access::download_gap(&facts.privileges, storage, node) else {
            continue;
        };
        let sp = format!("/storage/{storage}");
        let np = format!("/nodes/{node}");
        let mut missing = Vec::new();
        let mut grants = Vec::new();
        if !gap.storage.is_empty() {
            missing.push(access::all_on(&gap.storage, &sp));
            grants.push(grant(&access::DOWNLOAD_STORAGE, &sp, token));
        }
        if !gap.root.is_empty() {
            missing.push(access::all_on_root_or_nodes(
                &gap.root,
                access::DOWNLOAD_NODE.requires,
                &[np],
            ));
            grants.push(grant(&access::DOWNLOAD_ROOT, "/", token));
        }
        out.push(check(
            "PVE104",
            Severity::Error,
            address,
            json!({"token": token, "storage": storage, "node": node, "missing": missing, "grants": grants}),
        ));
    }
    out
}

/// PVE105: the token may write snippets to each storage a snippet is created on.
fn pve105_snippets(needs: &Needs, facts: &ClusterFacts) -> Vec<Finding> {
    let token = facts.token_id.as_str();
    let mut out = Vec::new();
    for (address, storage) in &needs.snippets {
        let sp = format!("/storage/{storage}");
        if access::SNIPPETS.met(&facts.privileges, &sp) {
            continue;
        }
        let mut d = grant(&access::SNIPPETS, &sp, token);
        d["storage"] = storage.as_str().into();
        out.push(check("PVE105", Severity::Error, address, d));
    }
    out
}

/// PVE106: a guest created with a fixed VM id needs that id free.
fn pve106_fixed_vmids(needs: &Needs, facts: &ClusterFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    for (address, id) in &needs.vmids {
        if facts.taken_vmids.contains(id) {
            let holder = facts.guests.get(id).map(|g| {
                json!({"name": g.name, "node": g.node, "template": g.template,
                       "what": if g.kind == "lxc" { "CT" } else { "VM" }})
            });
            out.push(check(
                "PVE106",
                Severity::Error,
                address,
                json!({"vmid": id, "free": facts.free_vmid, "holder": holder}),
            ));
        }
    }
    out
}

/// PVE109: every bridge a NIC attaches to exists on the guest's node.
fn pve109_bridges(needs: &Needs, facts: &ClusterFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    for ((node, bridge), have) in &facts.missing_bridges {
        for address in needs
            .bridges
            .get(&(node.clone(), bridge.clone()))
            .into_iter()
            .flatten()
        {
            out.push(check(
                "PVE109",
                Severity::Error,
                address,
                json!({"node": node, "bridge": bridge, "have": have}),
            ));
        }
    }
    out
}

/// PVE110: feature flags other than `nesting` need the `root@pam` user itself (a password
/// login): any API token, `root@pam!x` included, is refused.
fn pve110_root_features(needs: &Needs, facts: &ClusterFacts) -> Vec<Finding> {
    let who = facts
        .apply_identity
        .clone()
        .unwrap_or_else(|| facts.token_id.clone());
    if who == "root@pam" {
        return Vec::new();
    }
    needs
        .root_features
        .iter()
        .map(|(address, flags)| {
            check(
                "PVE110",
                Severity::Error,
                address,
                json!({"flags": flags, "who": who}),
            )
        })
        .collect()
}

/// PVE111: a clone from a template on another node needs `clone.node_name` naming it, and can
/// only go to another node through shared storage.
fn pve111_clones(needs: &Needs, facts: &ClusterFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    for c in &needs.clones {
        // A template the token cannot see is not judged; one the cluster does not have fails.
        let Some(home) = facts.guests.get(&c.template).map(|g| &g.node) else {
            if !facts.may_hide(c.template) {
                out.push(check(
                    "PVE111",
                    Severity::Error,
                    &c.address,
                    json!({"problem": "missing", "template": c.template, "node": c.node,
                           "source": c.source_node.as_ref().unwrap_or(&c.node)}),
                ));
            }
            continue;
        };
        let d = |problem: &str, storage: Option<&String>| {
            json!({"problem": problem, "template": c.template, "home": home, "node": c.node,
                   "source": c.source_node, "storage": storage})
        };
        match &c.source_node {
            Some(src) if src != home => {
                out.push(check(
                    "PVE111",
                    Severity::Error,
                    &c.address,
                    d("wrong_source", None),
                ));
            }
            None if home != &c.node => {
                out.push(check(
                    "PVE111",
                    Severity::Error,
                    &c.address,
                    d("no_source", None),
                ));
            }
            _ if home != &c.node => {
                let local = c
                    .storages
                    .iter()
                    .find(|s| facts.storages.iter().any(|f| &&f.id == s && !f.shared));
                if let Some(storage) = local {
                    out.push(check(
                        "PVE111",
                        Severity::Error,
                        &c.address,
                        d("not_shared", Some(storage)),
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

/// PVE114: a VNet a guest attaches to must be applied (not pending) and usable by the apply
/// (`SDN.Use`); a read that was refused says the check could not run.
fn pve114_vnets(needs: &Needs, facts: &ClusterFacts) -> Vec<Finding> {
    let who = facts
        .apply_identity
        .clone()
        .unwrap_or_else(|| facts.token_id.clone());
    let mut out = Vec::new();
    for ((node, bridge), guests) in &needs.bridges {
        let Some(v) = facts.vnets.get(bridge) else {
            continue;
        };
        let base = json!({"vnet": bridge, "node": node, "zone": v.zone, "who": who,
                          "user": access::token_user(&who), "token": facts.token_id,
                          "plan_user": access::token_user(&facts.token_id)});
        let with = |problem: &str, extra: Value| {
            let mut d = base.clone();
            d["problem"] = problem.into();
            if let (Some(o), Some(e)) = (d.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            d
        };
        let mut found = Vec::new();
        if let Some(why) = &facts.vnets_unread {
            found.push((Severity::Warning, with("list_unread", json!({"why": why}))));
        }
        if v.state.as_deref() == Some("new") && !needs.sdn.applied {
            found.push((Severity::Error, with("pending", json!({"state": v.state}))));
        }
        match &v.may_use {
            Some(Ok(false)) => found.push((Severity::Error, with("sdn_use", json!({})))),
            Some(Err(why)) => {
                found.push((Severity::Warning, with("use_unread", json!({"why": why}))))
            }
            _ => {}
        }
        for (severity, d) in found {
            for address in guests {
                out.push(check("PVE114", severity, address, d.clone()));
            }
        }
    }
    out
}

/// PVE107: privileged containers and VM startup order need Sys.Modify on `/`.
fn pve107_sys_modify(needs: &Needs, facts: &ClusterFacts) -> Vec<Finding> {
    let token = facts.token_id.as_str();
    let mut out = Vec::new();
    if !access::SYS_MODIFY.met(&facts.privileges, "/") {
        for (address, what) in &needs.sys_modify {
            let mut d = grant(&access::SYS_MODIFY, "/", token);
            d["what"] = (*what).into();
            out.push(check("PVE107", Severity::Error, address, d));
        }
    }
    out
}

// ----- after the apply ---------------------------------------------------------------------

/// A guest the plan updates in place, as the API names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestRef {
    pub address: String,
    pub node: String,
    /// `qemu` or `lxc` (the API path's segment).
    pub kind: &'static str,
    pub vmid: u64,
}

/// The bpg guests `plan` updates in place whose node and id are known: after the apply, their
/// pending configuration says which changes wait for a reboot.
pub fn updated_guests(plan: &Plan) -> Vec<GuestRef> {
    let mut out = Vec::new();
    for rc in plan.managed_changes().filter(|rc| rc.deposed.is_none()) {
        let Some(kind) = Kind::of(rc) else { continue };
        if kind.is_file() || rc.kind() != ActionKind::Update {
            continue;
        }
        let rc = &Res::parse(rc);
        let id = before(rc, "vm_id")
            .or_else(|| before(rc, "id"))
            .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()));
        let node = known(rc, "node_name");
        if let (Some(vmid), Some(node)) = (id, node) {
            out.push(GuestRef {
                address: rc.address.clone(),
                node,
                kind: if kind == Kind::Container {
                    "lxc"
                } else {
                    "qemu"
                },
                vmid,
            });
        }
    }
    out
}

/// One change of a guest's configuration that waits for a reboot (`GET …/pending`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PendingChange {
    pub key: String,
    /// The running value (`None` when the key is new).
    pub from: Option<String>,
    /// The value after a reboot (`None` when the key is deleted then).
    pub to: Option<String>,
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The entries of a `GET /nodes/{n}/{qemu|lxc}/{id}/pending` answer that wait for a reboot:
/// those with a `pending` value or `delete` set.
pub fn waiting_changes(entries: &[Value]) -> Vec<PendingChange> {
    entries
        .iter()
        .filter_map(|e| {
            let key = e.get("key")?.as_str()?.to_string();
            let from = e.get("value").filter(|v| !v.is_null()).map(scalar);
            let deleted = e
                .get("delete")
                .is_some_and(|d| d.as_i64().unwrap_or(0) != 0 || d == &Value::Bool(true));
            let to = e.get("pending").filter(|v| !v.is_null()).map(scalar);
            // Never a password or key in a note: only that it changes.
            let secret = ["password", "sshkeys", "secret", "token"]
                .iter()
                .any(|s| key.contains(s));
            let hide = |v: Option<String>| {
                if secret {
                    v.map(|_| "(hidden)".into())
                } else {
                    v
                }
            };
            let (from, to) = (hide(from), hide(to));
            (deleted || to.is_some()).then_some(PendingChange {
                key,
                from,
                to: if deleted { None } else { to },
            })
        })
        .collect()
}

/// The apply note's words for the changes that wait for a reboot, per guest (`None`: none wait).
pub fn pending_note(waiting: &[(String, Vec<PendingChange>)]) -> Option<String> {
    let guests: Vec<Value> = waiting
        .iter()
        .filter(|(_, c)| !c.is_empty())
        .map(|(address, changes)| json!({"address": address, "changes": changes}))
        .collect();
    (!guests.is_empty()).then(|| render_macro("pending_reboot", &json!({"guests": guests})))
}

/// The note's line when no endpoint is configured.
pub fn skipped_note() -> String {
    render_macro("preflight_skipped", &json!({}))
}

/// The note's line when the preflight could not read what it needs: the apply is refused.
pub fn failed_note(url: &str, token_id: &str, error: &str) -> String {
    render_macro(
        "preflight_failed",
        &json!({"url": url, "token": token_id, "error": error}),
    )
}

/// The note's line when the preflight ran (`checks` read-only calls, `findings` found).
pub fn ran_note(url: &str, token_id: &str, findings: usize) -> String {
    render_macro(
        "preflight_ran",
        &json!({"url": url, "token": token_id, "findings": findings}),
    )
}

/// Why an apply is refused, naming the first error finding, or `None` when it may go ahead.
pub fn apply_refusal(findings: &[Finding]) -> Option<String> {
    let errors: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .collect();
    let first = errors.first()?;
    let text = render_macro(
        "apply_refusal",
        &json!({"rule": first.rule, "address": first.address, "message": first.message,
                "fix": first.fix, "more": errors.len() - 1}),
    );
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(changes: Value) -> Plan {
        let text = json!({"format_version": "1.2", "resource_changes": changes}).to_string();
        Plan::from_json(text.as_bytes()).expect("a plan")
    }

    #[test]
    fn only_plans_of_the_bpg_or_telmate_provider_touch_proxmox() {
        let rc = |mode: &str, t: &str, provider: &str| {
            json!({"address": format!("{t}.x"), "mode": mode, "type": t, "name": "x",
                   "provider_name": provider,
                   "change": {"actions": ["no-op"], "before": {}, "after": {}}})
        };
        let bpg = "registry.opentofu.org/bpg/proxmox";
        let telmate = "registry.terraform.io/telmate/proxmox";
        for (change, touches) in [
            (rc("managed", "proxmox_virtual_environment_vm", bpg), true),
            (rc("data", "proxmox_virtual_environment_nodes", bpg), true),
            (rc("managed", "proxmox_vm", bpg), true),
            (rc("managed", "proxmox_vm_qemu", telmate), true),
            (rc("data", "proxmox_lxc", telmate), true),
            (
                rc(
                    "managed",
                    "terraform_data",
                    "terraform.io/builtin/terraform",
                ),
                false,
            ),
            (
                rc(
                    "managed",
                    "dns_a_record_set",
                    "registry.terraform.io/hashicorp/dns",
                ),
                false,
            ),
        ] {
            let what = change.to_string();
            assert_eq!(
                touches_proxmox(&plan_of(json!([change]))),
                touches,
                "{what}"
            );
        }
        assert!(!touches_proxmox(&plan_of(json!([]))));
    }
}
