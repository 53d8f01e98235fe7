//! A stateful fake Proxmox VE API (axum on 127.0.0.1:0) speaking the real JSON shapes, with
//! PVE's permission model: users, groups, roles, ACLs on users, groups and API tokens with
//! inheritance and the `propagate` flag, privilege-separated tokens limited to what their
//! user also has, `root@pam` unconfined; nodes that go offline (calls proxied to them fail),
//! faults injected per path (a status, or no answer at all), slow 401s, and an "old release"
//! mode whose error bodies carry no `message`. [`Cluster::pveum`] runs the `pveum`/`pvesm`
//! commands a fix tells the user to paste.
//!
//! The model follows the Proxmox VE admin guide, chapter "User Management"
//! (<https://pve.proxmox.com/pve-docs/chapter-pveum.html>): "Permission Management" and its
//! "Inheritance" rules, "API Tokens" (privilege separation), and the API viewer's
//! `GET /access/permissions` (<https://pve.proxmox.com/pve-docs/api-viewer/#/access/permissions>).
#![allow(dead_code)]

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct FakeStorage {
    pub id: String,
    pub storage_type: String,
    pub content: Vec<String>,
    /// Empty = every node.
    pub nodes: Vec<String>,
    pub disabled: bool,
    pub shared: bool,
    /// Bytes, as `GET /nodes/{n}/storage/{s}/status` reports them (every node alike).
    pub total: u64,
    pub used: u64,
}

impl FakeStorage {
    pub fn new(id: &str, storage_type: &str, content: &[&str]) -> FakeStorage {
        FakeStorage {
            id: id.into(),
            storage_type: storage_type.into(),
            content: content.iter().map(|s| s.to_string()).collect(),
            nodes: Vec::new(),
            disabled: false,
            shared: matches!(storage_type, "nfs" | "cifs" | "cephfs" | "rbd"),
            total: 100 * GIB,
            used: 20 * GIB,
        }
    }
}

pub const GIB: u64 = 1 << 30;

/// A guest of the cluster (`qemu` or `lxc`), as `/cluster/resources` shows it.
#[derive(Debug, Clone)]
pub struct FakeGuest {
    pub vmid: u64,
    pub name: String,
    pub node: String,
    pub kind: &'static str,
    pub template: bool,
    /// The running configuration (`cores`, `memory`, …) and what waits for a reboot.
    pub config: BTreeMap<String, Value>,
    pub pending: BTreeMap<String, Value>,
}

impl Cluster {
    /// Add a guest (and take its id).
    pub fn guest(self, vmid: u64, name: &str, node: &str, template: bool) -> Cluster {
        self.guest_of("qemu", vmid, name, node, template)
    }

    /// Add a container (and take its id).
    pub fn container(self, vmid: u64, name: &str, node: &str) -> Cluster {
        self.guest_of("lxc", vmid, name, node, false)
    }

    fn guest_of(
        mut self,
        kind: &'static str,
        vmid: u64,
        name: &str,
        node: &str,
        template: bool,
    ) -> Cluster {
        self.guests.retain(|g| g.vmid != vmid);
        self.guests.push(FakeGuest {
            vmid,
            name: name.into(),
            node: node.into(),
            kind,
            template,
            config: BTreeMap::from([
                ("name".to_string(), json!(name)),
                ("cores".to_string(), json!(2)),
                ("memory".to_string(), json!("2048")),
            ]),
            pending: BTreeMap::new(),
        });
        self
    }
}

/// An HA-managed guest (`sid` = `vm:105`) and where HA may run it: one state shown in both
/// releases' shapes — before PVE 9 as the resource's `group` (`GET /cluster/ha/groups`, a
/// `restricted` group), from PVE 9 on as a node-affinity rule (`GET /cluster/ha/rules`, `strict`),
/// since 9.0 migrates groups to rules.
#[derive(Debug, Clone)]
pub struct FakeHa {
    pub sid: String,
    /// (group or rule name, nodes, restricted/strict).
    pub placement: Option<(String, Vec<String>, bool)>,
}

impl Cluster {
    /// Make `sid` an HA resource, placed on `nodes` by group/rule `name` when given.
    pub fn ha(mut self, sid: &str, placement: Option<(&str, &[&str], bool)>) -> Cluster {
        self.ha.push(FakeHa {
            sid: sid.into(),
            placement: placement.map(|(name, nodes, strict)| {
                (
                    name.into(),
                    nodes.iter().map(|n| n.to_string()).collect(),
                    strict,
                )
            }),
        });
        self
    }
}

/// What `GET /nodes/{node}/status` reports of a node's memory and CPUs.
#[derive(Debug, Clone)]
pub struct NodeHardware {
    pub mem_total: u64,
    pub mem_used: u64,
    pub cpus: u64,
}

impl Default for NodeHardware {
    fn default() -> NodeHardware {
        NodeHardware {
            mem_total: 64 * GIB,
            mem_used: 16 * GIB,
            cpus: 16,
        }
    }
}

/// Who an ACL entry is for (`pveum acl modify PATH --users/--groups/--tokens`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    User(String),
    Group(String),
    Token(String),
}

#[derive(Debug, Clone)]
pub struct Acl {
    pub path: String,
    pub subject: Subject,
    pub role: String,
    pub propagate: bool,
}

/// An API token (`pveum user token add USER NAME --privsep 1`).
#[derive(Debug, Clone)]
pub struct FakeToken {
    pub secret: String,
    /// Privilege separated (the default): its own ACLs, intersected with its user's privileges.
    /// Otherwise it has exactly its user's privileges.
    pub privsep: bool,
}

/// What a request to a path gets instead of its answer.
#[derive(Debug, Clone)]
pub enum Fault {
    /// An error status with this reason phrase (e.g. 500, or 595 from the proxy).
    Status(u16, String),
    /// No answer at all (the client's timeout decides).
    Hang,
}

/// The whole simulated cluster. Tests build it, start the server, and may change it later.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub version: String,
    /// Errors carry only the status line (no `"message"`, no `"errors"`), as before PVE 7.
    pub old_release: bool,
    pub unauthorized_delay: Duration,
    /// node → status (`online`, `offline`).
    pub nodes: BTreeMap<String, String>,
    pub storages: Vec<FakeStorage>,
    /// node → its memory and CPUs (a node missing here has [`NodeHardware::default`]).
    pub hardware: BTreeMap<String, NodeHardware>,
    /// node → its bridges (a node missing here has `vmbr0` only).
    pub bridges: BTreeMap<String, BTreeSet<String>>,
    /// SDN VNets (applied, in zone `lab`), usable as a bridge on every node.
    pub vnets: BTreeSet<String>,
    /// SDN VNets created in the SDN configuration but not applied yet (`state: new`, zone `lab`):
    /// `GET /cluster/sdn/vnets/{vnet}` shows them, no node has their bridge.
    pub pending_vnets: BTreeSet<String>,
    /// Every guest of the cluster: `GET /cluster/resources?type=vm` lists those the token has
    /// `VM.Audit` on, `GET /cluster/nextid?vmid=` refuses the id of any of them.
    pub guests: Vec<FakeGuest>,
    /// HA resources and their placement.
    pub ha: Vec<FakeHa>,
    pub roles: BTreeMap<String, BTreeSet<String>>,
    /// user id → the groups it is a member of.
    pub users: BTreeMap<String, BTreeSet<String>>,
    pub groups: BTreeSet<String>,
    /// token id `user@realm!name` → token.
    pub tokens: BTreeMap<String, FakeToken>,
    pub acls: Vec<Acl>,
    /// API path (without `/api2/json`) → what it answers instead.
    pub faults: BTreeMap<String, Fault>,
    /// Every request: (method, path?query).
    pub requests: Vec<(String, String)>,
    /// Every authenticated request: (token id, path).
    pub seen_tokens: Vec<(String, String)>,
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Proxmox VE 8.4's built-in roles (the ones the tests use), as `pveum role list` shows them.
pub fn builtin_roles() -> BTreeMap<String, BTreeSet<String>> {
    let vm_admin = [
        "VM.Allocate",
        "VM.Audit",
        "VM.Backup",
        "VM.Clone",
        "VM.Config.CDROM",
        "VM.Config.CPU",
        "VM.Config.Cloudinit",
        "VM.Config.Disk",
        "VM.Config.HWType",
        "VM.Config.Memory",
        "VM.Config.Network",
        "VM.Config.Options",
        "VM.Console",
        "VM.GuestAgent.Audit",
        "VM.Migrate",
        "VM.PowerMgmt",
        "VM.Replicate",
        "VM.Snapshot",
        "VM.Snapshot.Rollback",
    ];
    let mut pve_admin: Vec<&str> = vec![
        "Datastore.Allocate",
        "Datastore.AllocateSpace",
        "Datastore.AllocateTemplate",
        "Datastore.Audit",
        "Group.Allocate",
        "Mapping.Audit",
        "Mapping.Use",
        "Pool.Allocate",
        "Pool.Audit",
        "Realm.AllocateUser",
        "SDN.Allocate",
        "SDN.Audit",
        "SDN.Use",
        "Sys.Audit",
        "Sys.Console",
        "Sys.Syslog",
        "User.Modify",
    ];
    pve_admin.extend(vm_admin);
    let mut administrator = pve_admin.clone();
    administrator.extend([
        "Sys.Modify",
        "Sys.PowerMgmt",
        "Sys.AccessNetwork",
        "Sys.Incoming",
        "Realm.Allocate",
        "Permissions.Modify",
        "Mapping.Modify",
    ]);
    BTreeMap::from([
        ("Administrator".to_string(), set(&administrator)),
        ("PVEAdmin".to_string(), set(&pve_admin)),
        (
            "PVESysAdmin".to_string(),
            set(&[
                "Permissions.Modify",
                "Sys.Audit",
                "Sys.Console",
                "Sys.Syslog",
            ]),
        ),
        (
            "PVEAuditor".to_string(),
            set(&[
                "Datastore.Audit",
                "Mapping.Audit",
                "Pool.Audit",
                "SDN.Audit",
                "Sys.Audit",
                "VM.Audit",
            ]),
        ),
        (
            "PVEDatastoreUser".to_string(),
            set(&["Datastore.AllocateSpace", "Datastore.Audit"]),
        ),
        ("PVEVMAdmin".to_string(), set(&vm_admin)),
        ("NoAccess".to_string(), BTreeSet::new()),
        ("PVESDNUser".to_string(), set(&["SDN.Audit", "SDN.Use"])),
        (
            "PVESDNAdmin".to_string(),
            set(&["SDN.Allocate", "SDN.Audit", "SDN.Use"]),
        ),
    ])
}

impl Cluster {
    /// Two online nodes, `local` (dir: iso, vztmpl, backup — no import, no snippets),
    /// `local-lvm` (lvmthin: images, rootdir), `nfs-images` (shared nfs, everything),
    /// VM 100 (`dns-old` on `pve01`) existing, PVE 8.4.1, no users or tokens yet (but `root@pam`).
    pub fn homelab() -> Cluster {
        let mut nfs = FakeStorage::new(
            "nfs-images",
            "nfs",
            &["images", "import", "iso", "snippets", "vztmpl"],
        );
        nfs.shared = true;
        Cluster {
            version: "8.4.1".into(),
            old_release: false,
            unauthorized_delay: Duration::from_millis(200),
            nodes: BTreeMap::from([
                ("pve01".to_string(), "online".to_string()),
                ("pve02".to_string(), "online".to_string()),
            ]),
            storages: vec![
                FakeStorage::new("local", "dir", &["iso", "vztmpl", "backup"]),
                FakeStorage::new("local-lvm", "lvmthin", &["images", "rootdir"]),
                nfs,
            ],
            hardware: BTreeMap::new(),
            bridges: BTreeMap::new(),
            vnets: BTreeSet::new(),
            pending_vnets: BTreeSet::new(),
            guests: Vec::new(),
            ha: Vec::new(),
            roles: builtin_roles(),
            users: BTreeMap::from([("root@pam".to_string(), BTreeSet::new())]),
            groups: BTreeSet::new(),
            tokens: BTreeMap::new(),
            acls: Vec::new(),
            faults: BTreeMap::new(),
            requests: Vec::new(),
            seen_tokens: Vec::new(),
        }
        .guest(100, "dns-old", "pve01", false)
    }

    fn acl(&mut self, subject: Subject, grants: &[(&str, &str)]) {
        for (path, role) in grants {
            self.acls.push(Acl {
                path: path.to_string(),
                subject: subject.clone(),
                role: role.to_string(),
                propagate: true,
            });
        }
    }

    /// Add a user (if new) and ACLs for it: `[("/", "PVEAdmin")]`.
    pub fn user(mut self, userid: &str, grants: &[(&str, &str)]) -> Cluster {
        self.users.entry(userid.into()).or_default();
        self.acl(Subject::User(userid.into()), grants);
        self
    }

    /// Add a group with `members` (users created if new) and ACLs for it.
    pub fn group(mut self, name: &str, members: &[&str], grants: &[(&str, &str)]) -> Cluster {
        self.groups.insert(name.into());
        for m in members {
            self.users
                .entry(m.to_string())
                .or_default()
                .insert(name.into());
        }
        self.acl(Subject::Group(name.into()), grants);
        self
    }

    /// A privilege-separated token with ACLs `grants` — the usual setup: when its user does
    /// not exist yet, it is created with the same ACLs (so the token has exactly `grants`).
    pub fn token(mut self, id: &str, secret: &str, grants: &[(&str, &str)]) -> Cluster {
        let user = id.split('!').next().unwrap_or_default().to_string();
        if !self.users.contains_key(&user) {
            self = self.user(&user, grants);
        }
        self.token_only(id, secret, true, grants)
    }

    /// A token with ACLs `grants` and nothing else: its user must exist (or gets no ACLs).
    pub fn token_only(
        mut self,
        id: &str,
        secret: &str,
        privsep: bool,
        grants: &[(&str, &str)],
    ) -> Cluster {
        let user = id.split('!').next().unwrap_or_default().to_string();
        self.users.entry(user).or_default();
        self.tokens.insert(
            id.into(),
            FakeToken {
                secret: secret.into(),
                privsep,
            },
        );
        self.acl(Subject::Token(id.into()), grants);
        self
    }

    pub fn role(mut self, name: &str, privs: &[&str]) -> Cluster {
        self.roles.insert(name.into(), set(privs));
        self
    }

    /// `/`, `/nodes`, `/nodes/pve01` for `/nodes/pve01`.
    fn levels(path: &str) -> Vec<String> {
        let mut levels = vec!["/".to_string()];
        let mut acc = String::new();
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            acc.push('/');
            acc.push_str(seg);
            levels.push(acc.clone());
        }
        levels
    }

    /// The roles of a user or a token's own ACLs on `path` (role → propagate), by the admin
    /// guide's inheritance rules: ACLs on deeper levels replace those inherited from an upper
    /// level (only propagating ones are inherited); at one level a user's (or token's) own
    /// ACLs replace its groups' ACLs; `NoAccess` cancels all other roles on a path.
    fn roles_on(&self, subject: &Subject, path: &str) -> BTreeMap<String, bool> {
        let levels = Self::levels(path);
        let groups: BTreeSet<String> = match subject {
            Subject::User(u) => self.users.get(u).cloned().unwrap_or_default(),
            _ => BTreeSet::new(),
        };
        let mut current: BTreeMap<String, bool> = BTreeMap::new();
        for (i, level) in levels.iter().enumerate() {
            let last = i == levels.len() - 1;
            let at = |want: &dyn Fn(&Subject) -> bool| -> BTreeMap<String, bool> {
                self.acls
                    .iter()
                    .filter(|a| &a.path == level && want(&a.subject))
                    .filter(|a| a.propagate || last)
                    .map(|a| (a.role.clone(), a.propagate))
                    .collect()
            };
            let own = at(&|s| s == subject);
            let here = if own.is_empty() {
                at(&|s| matches!(s, Subject::Group(g) if groups.contains(g)))
            } else {
                own
            };
            if !here.is_empty() {
                current = here;
            }
        }
        if current.contains_key("NoAccess") {
            current.clear();
        }
        current
    }

    fn privs_of(&self, roles: &BTreeMap<String, bool>) -> BTreeMap<String, u8> {
        let mut out = BTreeMap::new();
        for (role, propagate) in roles {
            for p in self.roles.get(role).into_iter().flatten() {
                let e = out.entry(p.clone()).or_insert(0u8);
                *e = (*e).max(u8::from(*propagate));
            }
        }
        out
    }

    /// The effective privileges of `authid` (a user id or a token id) on `path`, as
    /// `GET /access/permissions` reports them (privilege → propagate flag). `root@pam` has
    /// every privilege; a privilege-separated token has the intersection of its own and its
    /// user's privileges; a token without privilege separation has its user's.
    pub fn privileges(&self, authid: &str, path: &str) -> BTreeMap<String, u8> {
        let (user, token) = match authid.split_once('!') {
            Some((u, _)) => (u, self.tokens.get(authid)),
            None => (authid, None),
        };
        if !self.users.contains_key(user) {
            return BTreeMap::new();
        }
        let user_privs = if user == "root@pam" {
            self.roles
                .values()
                .flatten()
                .map(|p| (p.clone(), 1u8))
                .collect()
        } else {
            self.privs_of(&self.roles_on(&Subject::User(user.into()), path))
        };
        match token {
            None if authid.contains('!') => BTreeMap::new(),
            None => user_privs,
            Some(t) if !t.privsep => user_privs,
            Some(_) => self
                .privs_of(&self.roles_on(&Subject::Token(authid.into()), path))
                .into_iter()
                .filter(|(p, _)| user_privs.contains_key(p))
                .collect(),
        }
    }

    /// Run one command a fix tells the user to paste on a node, as `pveum`/`pvesm` would
    /// (`pveum role add`, `pveum acl modify --users/--groups/--tokens --roles [--propagate]`,
    /// `pvesm set --content/--disable/--nodes`); `#` lines and blank lines do nothing.
    /// `Err` is what the command would print.
    pub fn pveum(&mut self, line: &str) -> Result<(), String> {
        let words = shell_words(line);
        let Some(cmd) = words.first() else {
            return Ok(());
        };
        if cmd.starts_with('#') {
            return Ok(());
        }
        let opt = |name: &str| -> Option<String> {
            let i = words.iter().position(|w| w == name)?;
            words.get(i + 1).cloned()
        };
        let list = |v: Option<String>| -> Vec<String> {
            v.map(|v| {
                v.split([',', ' ', ';'])
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
        };
        match (
            cmd.as_str(),
            words.get(1).map(String::as_str),
            words.get(2).map(String::as_str),
        ) {
            ("pveum", Some("role"), Some("add")) => {
                let name = words.get(3).ok_or("role add: missing name")?.clone();
                if self.roles.contains_key(&name) {
                    return Err(format!("create role failed: role '{name}' already exists"));
                }
                self.roles
                    .insert(name, list(opt("--privs")).into_iter().collect());
                Ok(())
            }
            ("pveum", Some("acl"), Some("modify")) => {
                let path = words.get(3).ok_or("acl modify: missing path")?.clone();
                let roles = list(opt("--roles"));
                for r in &roles {
                    if !self.roles.contains_key(r) {
                        return Err(format!("role '{r}' does not exist"));
                    }
                }
                let propagate = opt("--propagate").is_none_or(|v| v != "0");
                let mut subjects = Vec::new();
                for u in list(opt("--users")) {
                    if !self.users.contains_key(&u) {
                        return Err(format!("user '{u}' does not exist"));
                    }
                    subjects.push(Subject::User(u));
                }
                for g in list(opt("--groups")) {
                    if !self.groups.contains(&g) {
                        return Err(format!("group '{g}' does not exist"));
                    }
                    subjects.push(Subject::Group(g));
                }
                for t in list(opt("--tokens")) {
                    if !self.tokens.contains_key(&t) {
                        return Err(format!("no such token '{t}'"));
                    }
                    subjects.push(Subject::Token(t));
                }
                for subject in subjects {
                    for role in &roles {
                        self.acls.retain(|a| {
                            !(a.path == path && a.subject == subject && &a.role == role)
                        });
                        self.acls.push(Acl {
                            path: path.clone(),
                            subject: subject.clone(),
                            role: role.clone(),
                            propagate,
                        });
                    }
                }
                Ok(())
            }
            ("pvesm", Some("set"), Some(id)) => {
                let id = id.to_string();
                let st = self
                    .storages
                    .iter_mut()
                    .find(|s| s.id == id)
                    .ok_or(format!("storage '{id}' does not exist"))?;
                if let Some(c) = opt("--content") {
                    st.content = list(Some(c));
                }
                if let Some(d) = opt("--disable") {
                    st.disabled = d != "0";
                }
                if let Some(n) = opt("--nodes") {
                    st.nodes = list(Some(n));
                }
                Ok(())
            }
            _ => Err(format!("not a command the fake knows: {line}")),
        }
    }

    /// Run every line of a fix (see [`Cluster::pveum`]).
    pub fn paste(&mut self, fix: &str) -> Result<(), String> {
        for line in fix.lines() {
            self.pveum(line)?;
        }
        Ok(())
    }
}

/// Split a command line as a POSIX shell would for the quoting fixes use ('…' and "…").
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.trim().chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

type Shared = Arc<Mutex<Cluster>>;

pub struct FakeProxmox {
    /// `http://127.0.0.1:PORT/` — what `PROXMOX_VE_ENDPOINT` would hold.
    pub url: String,
    pub state: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeProxmox {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeProxmox {
    pub async fn start(cluster: Cluster) -> FakeProxmox {
        let state: Shared = Arc::new(Mutex::new(cluster));
        let app = Router::new()
            .route("/api2/json/version", get(version))
            .route("/api2/json/nodes", get(nodes))
            .route("/api2/json/storage", get(storage))
            .route("/api2/json/nodes/{node}/storage", get(node_storage))
            .route("/api2/json/nodes/{node}/status", get(node_status))
            .route("/api2/json/nodes/{node}/network", get(node_network))
            .route(
                "/api2/json/nodes/{node}/network/{iface}",
                get(node_interface),
            )
            .route("/api2/json/cluster/sdn/vnets/{vnet}", get(sdn_vnet))
            .route("/api2/json/cluster/sdn/vnets", get(sdn_vnets))
            .route("/api2/json/cluster/resources", get(cluster_resources))
            .route(
                "/api2/json/nodes/{node}/{kind}/{vmid}/pending",
                get(guest_pending),
            )
            .route(
                "/api2/json/nodes/{node}/storage/{storage}/status",
                get(storage_status),
            )
            .route("/api2/json/access/permissions", get(permissions))
            .route("/api2/json/cluster/nextid", get(nextid))
            .route("/api2/json/access/acl", get(acl_list))
            .route("/api2/json/cluster/ha/resources", get(ha_resources))
            .route("/api2/json/cluster/ha/groups", get(ha_groups))
            .route("/api2/json/cluster/ha/rules", get(ha_rules))
            .fallback(fallback)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeProxmox {
            url: format!("http://{addr}/"),
            state,
            task,
        }
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut Cluster) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    pub fn requests(&self) -> Vec<(String, String)> {
        self.with(|c| c.requests.clone())
    }
}

/// A Proxmox error: the reason phrase carries the text; newer releases repeat it in
/// `"message"` (with `"errors"` per parameter), older ones send `{"data": null}` only.
fn pve_error(c: &Cluster, status: StatusCode, reason: &str, errors: Option<Value>) -> Response {
    let body = if c.old_release {
        json!({"data": null})
    } else {
        let mut b = json!({"data": null, "message": format!("{reason}\n")});
        if let Some(e) = errors {
            b["errors"] = e;
        }
        b
    };
    let mut resp = (status, Json(body)).into_response();
    if let Ok(r) = hyper::ext::ReasonPhrase::try_from(reason.as_bytes().to_vec()) {
        resp.extensions_mut().insert(r);
    }
    resp
}

/// Check the `PVEAPIToken=` header; `Err` is the (slow) 401.
async fn auth(
    state: &Shared,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<String, Response> {
    let (token, delay) = {
        let mut c = state.lock().unwrap();
        c.requests.push((
            method.to_string(),
            uri.path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default(),
        ));
        let presented = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("PVEAPIToken="))
            .and_then(|v| v.split_once('='))
            .filter(|(id, secret)| c.tokens.get(*id).is_some_and(|t| t.secret == *secret))
            .map(|(id, _)| id.to_string());
        if let Some(t) = &presented {
            c.seen_tokens.push((t.clone(), uri.path().to_string()));
        }
        (presented, c.unauthorized_delay)
    };
    match token {
        Some(t) => {
            let fault = {
                let c = state.lock().unwrap();
                let path = uri.path().trim_start_matches("/api2/json");
                c.faults.get(path).cloned()
            };
            match fault {
                None => Ok(t),
                Some(Fault::Hang) => std::future::pending().await,
                Some(Fault::Status(code, reason)) => {
                    let c = state.lock().unwrap();
                    Err(pve_error(
                        &c,
                        StatusCode::from_u16(code).unwrap(),
                        &reason,
                        None,
                    ))
                }
            }
        }
        None => {
            tokio::time::sleep(delay).await;
            let c = state.lock().unwrap();
            Err(pve_error(
                &c,
                StatusCode::UNAUTHORIZED,
                "invalid token value!",
                None,
            ))
        }
    }
}

macro_rules! authed {
    ($state:expr, $method:expr, $uri:expr, $headers:expr) => {
        match auth(&$state, &$method, &$uri, &$headers).await {
            Ok(t) => t,
            Err(resp) => return resp,
        }
    };
}

async fn version(State(s): State<Shared>, m: Method, u: Uri, h: HeaderMap) -> Response {
    let _ = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    let release = c
        .version
        .rsplit_once('.')
        .map_or(c.version.clone(), |(r, _)| r.to_string());
    Json(json!({"data": {"version": c.version, "release": release, "repoid": "2a5fa54a8503f96d"}}))
        .into_response()
}

async fn nodes(State(s): State<Shared>, m: Method, u: Uri, h: HeaderMap) -> Response {
    let _ = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    let data: Vec<Value> = c
        .nodes
        .iter()
        .map(|(n, status)| {
            json!({"node": n, "status": status, "type": "node", "id": format!("node/{n}"),
                   "level": "", "ssl_fingerprint": "AB:CD", "maxcpu": 8, "maxmem": 34359738368u64})
        })
        .collect();
    Json(json!({"data": data})).into_response()
}

fn visible(c: &Cluster, token: &str, storage: &str) -> bool {
    let p = c.privileges(token, &format!("/storage/{storage}"));
    p.contains_key("Datastore.Audit") || p.contains_key("Datastore.AllocateSpace")
}

async fn storage(State(s): State<Shared>, m: Method, u: Uri, h: HeaderMap) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    let data: Vec<Value> = c
        .storages
        .iter()
        .filter(|st| visible(&c, &token, &st.id))
        .map(|st| {
            let mut v = json!({"storage": st.id, "type": st.storage_type,
                               "content": st.content.join(","), "digest": "3e0a1c"});
            if st.storage_type == "dir" {
                v["path"] = "/var/lib/vz".into();
            }
            if !st.nodes.is_empty() {
                v["nodes"] = st.nodes.join(",").into();
            }
            if st.disabled {
                v["disable"] = 1.into();
            }
            if st.shared {
                v["shared"] = 1.into();
            }
            v
        })
        .collect();
    Json(json!({"data": data})).into_response()
}

async fn node_storage(
    State(s): State<Shared>,
    Path(node): Path<String>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    // A call for an offline node is proxied to it and fails there (pveproxy's 595).
    if c.nodes.get(&node).is_some_and(|st| st != "online") {
        return pve_error(
            &c,
            StatusCode::from_u16(595).unwrap(),
            &format!("Connection error 595: No route to host ({node})"),
            None,
        );
    }
    if !c.nodes.contains_key(&node) {
        return pve_error(
            &c,
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("hostname lookup '{node}' failed - failed to get address info for: {node}: Name or service not known"),
            None,
        );
    }
    let data: Vec<Value> = c
        .storages
        .iter()
        .filter(|st| st.nodes.is_empty() || st.nodes.contains(&node))
        .filter(|st| visible(&c, &token, &st.id))
        .map(|st| {
            json!({"storage": st.id, "type": st.storage_type, "content": st.content.join(","),
                   "enabled": u8::from(!st.disabled), "active": u8::from(!st.disabled),
                   "shared": u8::from(st.shared), "total": st.total,
                   "used": st.used, "avail": st.total - st.used})
        })
        .collect();
    Json(json!({"data": data})).into_response()
}

/// A major release ≥ 9 (the shapes that changed in PVE 9).
fn is_pve9(c: &Cluster) -> bool {
    c.version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok())
        .is_some_and(|m| m >= 9)
}

/// PVE's 403 for a privilege check (`Permission check failed (/nodes/pve01, Sys.Audit)`).
fn forbidden(c: &Cluster, path: &str, privs: &str) -> Response {
    pve_error(
        c,
        StatusCode::FORBIDDEN,
        &format!("Permission check failed ({path}, {privs})"),
        None,
    )
}

/// The node errors every `/nodes/{node}/…` call shares: offline (595 from the proxy) or unknown.
/// A read on `node` that needs `privilege` on `path`: the node's error when it is down or
/// unknown, else PVE's 403 when the token lacks the privilege.
fn node_and_privilege(
    c: &Cluster,
    token: &str,
    node: &str,
    path: &str,
    privilege: &str,
) -> Option<Response> {
    node_unreachable(c, node).or_else(|| {
        (!c.privileges(token, path).contains_key(privilege)).then(|| forbidden(c, path, privilege))
    })
}

fn node_unreachable(c: &Cluster, node: &str) -> Option<Response> {
    if c.nodes.get(node).is_some_and(|st| st != "online") {
        return Some(pve_error(
            c,
            StatusCode::from_u16(595).unwrap(),
            &format!("Connection error 595: No route to host ({node})"),
            None,
        ));
    }
    if !c.nodes.contains_key(node) {
        return Some(pve_error(
            c,
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("hostname lookup '{node}' failed - failed to get address info for: {node}: Name or service not known"),
            None,
        ));
    }
    None
}

/// `GET /nodes/{node}/status` (needs `Sys.Audit` on `/nodes/{node}`): PVE 8.4's shape, with
/// `memory.available` from PVE 9 on.
async fn node_status(
    State(s): State<Shared>,
    Path(node): Path<String>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    if let Some(r) = node_and_privilege(&c, &token, &node, &format!("/nodes/{node}"), "Sys.Audit") {
        return r;
    }
    let hw = c.hardware.get(&node).cloned().unwrap_or_default();
    let free = hw.mem_total - hw.mem_used;
    let mut memory = json!({"total": hw.mem_total, "used": hw.mem_used, "free": free});
    if is_pve9(&c) {
        // PVE 9 counts reclaimable page cache as available; `free` is what is unused.
        memory["available"] = (free + GIB / 2).min(hw.mem_total).into();
        memory["free"] = free.saturating_sub(GIB / 2).into();
    }
    Json(json!({"data": {
        "uptime": 864000, "idle": 0, "cpu": 0.031, "wait": 0.0,
        "loadavg": ["0.52", "0.61", "0.58"],
        "kversion": "Linux 6.8.12-9-pve #1 SMP PREEMPT_DYNAMIC PMX 6.8.12-9",
        "pveversion": format!("pve-manager/{}/2a5fa54a8503f96d", c.version),
        "cpuinfo": {"model": "AMD EPYC 7302P 16-Core Processor", "cpus": hw.cpus,
                    "cores": hw.cpus / 2, "sockets": 1, "mhz": "3000.000", "hvm": "1",
                    "user_hz": 100, "flags": "fpu vme de pse"},
        "memory": memory,
        "swap": {"total": 8 * GIB, "used": 0, "free": 8 * GIB},
        "rootfs": {"total": 100 * GIB, "used": 10 * GIB, "free": 90 * GIB, "avail": 85 * GIB},
        "ksm": {"shared": 0},
        "boot-info": {"mode": "efi", "secureboot": 0}
    }}))
    .into_response()
}

/// `GET /nodes/{node}/storage/{storage}/status` (needs `Datastore.Audit` or
/// `Datastore.AllocateSpace` on `/storage/{storage}`).
async fn storage_status(
    State(s): State<Shared>,
    Path((node, storage)): Path<(String, String)>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    if let Some(r) = node_unreachable(&c, &node) {
        return r;
    }
    let path = format!("/storage/{storage}");
    if !visible(&c, &token, &storage) {
        return forbidden(&c, &path, "Datastore.Audit|Datastore.AllocateSpace");
    }
    let Some(st) = c.storages.iter().find(|st| st.id == storage) else {
        return pve_error(
            &c,
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("storage '{storage}' does not exist"),
            None,
        );
    };
    if !(st.nodes.is_empty() || st.nodes.contains(&node)) {
        return pve_error(
            &c,
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("storage '{storage}' is not available on node '{node}'"),
            None,
        );
    }
    Json(json!({"data": {
        "type": st.storage_type, "content": st.content.join(","),
        "shared": u8::from(st.shared), "enabled": u8::from(!st.disabled),
        "active": u8::from(!st.disabled), "total": st.total, "used": st.used,
        "avail": st.total - st.used
    }}))
    .into_response()
}

impl Cluster {
    /// The bridges of `node`.
    pub fn bridges_of(&self, node: &str) -> BTreeSet<String> {
        self.bridges
            .get(node)
            .cloned()
            .unwrap_or_else(|| BTreeSet::from(["vmbr0".to_string()]))
    }
}

fn bridge_json(iface: &str) -> Value {
    json!({"iface": iface, "type": "bridge", "method": "static", "families": ["inet"],
           "autostart": 1, "active": 1, "bridge_ports": "eno1", "bridge_stp": "off",
           "bridge_fd": "0", "priority": 4})
}

/// `GET /nodes/{node}/network[?type=]` (needs `Sys.Audit` on `/nodes/{node}`): the physical NIC
/// and the bridges — except on PVE 9.2.5, whose list omits bridges (bpg #3029).
async fn node_network(
    State(s): State<Shared>,
    Path(node): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    if let Some(r) = node_and_privilege(&c, &token, &node, &format!("/nodes/{node}"), "Sys.Audit") {
        return r;
    }
    let mut data = Vec::new();
    let want = q.get("type").map(String::as_str);
    if matches!(want, None | Some("eth")) {
        data.push(
            json!({"iface": "eno1", "type": "eth", "method": "manual", "active": 1,
                         "families": ["inet"], "priority": 3}),
        );
    }
    if c.version != "9.2.5" && matches!(want, None | Some("bridge") | Some("any_bridge")) {
        data.extend(c.bridges_of(&node).iter().map(|b| bridge_json(b)));
    }
    Json(json!({"data": data})).into_response()
}

/// `GET /nodes/{node}/network/{iface}` (needs `Sys.Audit` on `/nodes/{node}`): 400
/// `interface does not exist` for an unknown one, as PVE's `raise_param_exc` answers.
async fn node_interface(
    State(s): State<Shared>,
    Path((node, iface)): Path<(String, String)>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    if let Some(r) = node_and_privilege(&c, &token, &node, &format!("/nodes/{node}"), "Sys.Audit") {
        return r;
    }
    if iface == "eno1" {
        return Json(
            json!({"data": {"iface": "eno1", "type": "eth", "method": "manual",
                                    "active": 1, "families": ["inet"]}}),
        )
        .into_response();
    }
    if !c.bridges_of(&node).contains(&iface) {
        return pve_error(
            &c,
            StatusCode::BAD_REQUEST,
            "Parameter verification failed.",
            Some(json!({"iface": "interface does not exist"})),
        );
    }
    Json(json!({"data": bridge_json(&iface)})).into_response()
}

/// `GET /cluster/sdn/vnets/{vnet}` (needs `SDN.Audit` on `/sdn`): 500 `sdn vnet '…' does not
/// exist` for an unknown one.
async fn sdn_vnet(
    State(s): State<Shared>,
    Path(vnet): Path<String>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    if !c.privileges(&token, "/sdn").contains_key("SDN.Audit") {
        return forbidden(&c, "/sdn", "SDN.Audit");
    }
    if !c.vnets.contains(&vnet) && !c.pending_vnets.contains(&vnet) {
        return pve_error(
            &c,
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("sdn vnet '{vnet}' does not exist"),
            None,
        );
    }
    Json(json!({"data": {"vnet": vnet, "zone": "lab", "type": "vnet", "digest": "a1b2"}}))
        .into_response()
}

/// `GET /cluster/sdn/vnets[?pending=1]`: the VNets the token has `SDN.Audit` or `SDN.Allocate`
/// on (`/sdn/zones/{zone}/{vnet}`). With `pending=1`, pve-network's pending view: a VNet not yet
/// applied has `state: new` and its values under `pending`; without it, the configuration as
/// written (pending ones included, without a state).
async fn sdn_vnets(
    State(s): State<Shared>,
    Query(q): Query<BTreeMap<String, String>>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    let pending = q.get("pending").is_some_and(|v| v == "1");
    let may = |vnet: &str| {
        let p = c.privileges(&token, &format!("/sdn/zones/lab/{vnet}"));
        p.contains_key("SDN.Audit") || p.contains_key("SDN.Allocate")
    };
    let mut data: Vec<Value> = c
        .vnets
        .iter()
        .filter(|v| may(v))
        .map(|v| json!({"vnet": v, "zone": "lab", "type": "vnet", "digest": "a1b2"}))
        .collect();
    data.extend(c.pending_vnets.iter().filter(|v| may(v)).map(|v| {
        if pending {
            json!({"vnet": v, "type": "vnet", "state": "new",
                   "pending": {"zone": "lab"}, "digest": "c3d4"})
        } else {
            json!({"vnet": v, "zone": "lab", "type": "vnet", "digest": "c3d4"})
        }
    }));
    Json(json!({"data": data})).into_response()
}

/// `GET /cluster/resources[?type=vm]`: the guests the token has `VM.Audit` on (PVE filters the
/// list, it does not refuse), in PVE 8.4/9's shape.
async fn cluster_resources(
    State(s): State<Shared>,
    Query(q): Query<BTreeMap<String, String>>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    if q.get("type").is_some_and(|t| t != "vm") {
        return pve_error(
            &c,
            StatusCode::NOT_IMPLEMENTED,
            "only type=vm is faked",
            None,
        );
    }
    let data: Vec<Value> = c
        .guests
        .iter()
        .filter(|g| {
            c.privileges(&token, &format!("/vms/{}", g.vmid))
                .contains_key("VM.Audit")
        })
        .map(|g| {
            json!({"id": format!("{}/{}", g.kind, g.vmid), "type": g.kind, "vmid": g.vmid,
                   "name": g.name, "node": g.node, "status": "stopped",
                   "template": u8::from(g.template), "maxcpu": 2, "maxmem": 2 * GIB,
                   "maxdisk": 32 * GIB, "cpu": 0, "mem": 0, "disk": 0, "uptime": 0,
                   "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0, "hastate": null})
        })
        .collect();
    Json(json!({"data": data})).into_response()
}

/// `GET /nodes/{node}/{qemu|lxc}/{vmid}/pending` (needs `VM.Audit` on `/vms/{vmid}`): every
/// key with its running `value`, and `pending` where a change waits for a reboot.
async fn guest_pending(
    State(s): State<Shared>,
    Path((node, kind, vmid)): Path<(String, String, u64)>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    if let Some(r) = node_and_privilege(&c, &token, &node, &format!("/vms/{vmid}"), "VM.Audit") {
        return r;
    }
    let dir = if kind == "lxc" { "lxc" } else { "qemu-server" };
    let Some(g) = c
        .guests
        .iter()
        .find(|g| g.vmid == vmid && g.node == node && g.kind == kind.as_str())
    else {
        return pve_error(
            &c,
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("Configuration file 'nodes/{node}/{dir}/{vmid}.conf' does not exist"),
            None,
        );
    };
    let mut keys: BTreeSet<&String> = g.config.keys().collect();
    keys.extend(g.pending.keys());
    let data: Vec<Value> = keys
        .into_iter()
        .map(|k| {
            let mut e = json!({"key": k});
            if let Some(v) = g.config.get(k) {
                e["value"] = v.clone();
            }
            match g.pending.get(k) {
                Some(Value::Null) => e["delete"] = 1.into(),
                Some(p) => e["pending"] = p.clone(),
                None => {}
            }
            e
        })
        .collect();
    Json(json!({"data": data})).into_response()
}

/// `GET /access/permissions[?path=][&userid=]`: the effective privileges of the caller, or of
/// `userid` (a user or token id; asking about anyone but oneself or one's own tokens needs
/// `Sys.Audit` on `/access`). Without `path`, PVE's top-level paths and every path an ACL is set
/// on, those with no privilege left out.
async fn permissions(
    State(s): State<Shared>,
    Query(q): Query<BTreeMap<String, String>>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    let who = match q.get("userid") {
        Some(other) if other != &token => {
            let own_user = token.split('!').next().unwrap_or_default();
            let owned = other.split('!').next() == Some(own_user) && !token.contains('!');
            if !owned && !c.privileges(&token, "/access").contains_key("Sys.Audit") {
                return forbidden(&c, "/access", "Sys.Audit");
            }
            other.clone()
        }
        _ => token.clone(),
    };
    let mut data = serde_json::Map::new();
    match q.get("path") {
        Some(p) => {
            data.insert(p.clone(), json!(c.privileges(&who, p)));
        }
        None => {
            let mut paths: BTreeSet<String> = c.acls.iter().map(|a| a.path.clone()).collect();
            paths.extend(
                [
                    "/",
                    "/access",
                    "/access/groups",
                    "/nodes",
                    "/pool",
                    "/sdn",
                    "/storage",
                    "/vms",
                ]
                .map(String::from),
            );
            for p in paths {
                let privs = c.privileges(&who, &p);
                if !privs.is_empty() {
                    data.insert(p.clone(), json!(privs));
                }
            }
        }
    }
    Json(json!({"data": data})).into_response()
}

/// The HA reads need `Sys.Audit` on `/` (pve-ha-manager's API).
fn ha_refused(c: &Cluster, token: &str) -> Option<Response> {
    (!c.privileges(token, "/").contains_key("Sys.Audit")).then(|| forbidden(c, "/", "Sys.Audit"))
}

/// `GET /cluster/ha/resources`: PVE 8 names each resource's `group`; PVE 9 has no groups (its
/// placement is in the rules) and a `failback` flag.
async fn ha_resources(State(s): State<Shared>, m: Method, u: Uri, h: HeaderMap) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    if let Some(r) = ha_refused(&c, &token) {
        return r;
    }
    let data: Vec<Value> =
        c.ha.iter()
            .map(|r| {
                let kind = r.sid.split(':').next().unwrap_or_default();
                let mut v = json!({"sid": r.sid, "type": kind, "state": "started",
                               "max_restart": 1, "max_relocate": 1, "digest": "7c1e"});
                if is_pve9(&c) {
                    v["failback"] = 1.into();
                } else if let Some((group, _, _)) = &r.placement {
                    v["group"] = group.clone().into();
                }
                v
            })
            .collect();
    Json(json!({"data": data})).into_response()
}

/// `GET /cluster/ha/groups`: before PVE 9 the groups (`nodes` with priorities, `restricted`);
/// on PVE 9 none are left (migrated to rules).
async fn ha_groups(State(s): State<Shared>, m: Method, u: Uri, h: HeaderMap) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    if let Some(r) = ha_refused(&c, &token) {
        return r;
    }
    let data: Vec<Value> = if is_pve9(&c) {
        Vec::new()
    } else {
        c.ha.iter()
            .filter_map(|r| r.placement.as_ref())
            .map(|(name, nodes, restricted)| {
                json!({"group": name, "type": "group", "nodes": nodes.iter().enumerate()
                           .map(|(i, n)| if i == 0 { format!("{n}:2") } else { n.clone() })
                           .collect::<Vec<_>>().join(","),
                       "restricted": u8::from(*restricted), "nofailback": 0, "digest": "5a0b"})
            })
            .collect()
    };
    Json(json!({"data": data})).into_response()
}

/// `GET /cluster/ha/rules` (PVE 9 only; older releases do not have it): node-affinity rules.
async fn ha_rules(State(s): State<Shared>, m: Method, u: Uri, h: HeaderMap) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    if !is_pve9(&c) {
        return pve_error(
            &c,
            StatusCode::NOT_IMPLEMENTED,
            &format!("Method 'GET {}' not implemented", u.path()),
            None,
        );
    }
    if let Some(r) = ha_refused(&c, &token) {
        return r;
    }
    let data: Vec<Value> =
        c.ha.iter()
            .filter_map(|r| r.placement.as_ref().map(|p| (r, p)))
            .enumerate()
            .map(|(i, (r, (name, nodes, strict)))| {
                json!({"rule": name, "type": "node-affinity", "resources": r.sid,
                   "nodes": nodes.join(","), "strict": u8::from(*strict), "order": i + 1,
                   "digest": "9d2f"})
            })
            .collect();
    Json(json!({"data": data})).into_response()
}

/// `GET /access/acl`: every ACL entry for a caller with `Sys.Audit` on `/access`; otherwise only
/// those on paths where it may modify permissions (`Permissions.Modify`), as PVE filters it.
async fn acl_list(State(s): State<Shared>, m: Method, u: Uri, h: HeaderMap) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    let audit = c.privileges(&token, "/access").contains_key("Sys.Audit");
    let data: Vec<Value> = c
        .acls
        .iter()
        .filter(|a| {
            audit
                || c.privileges(&token, &a.path)
                    .contains_key("Permissions.Modify")
        })
        .map(|a| {
            let (kind, ugid) = match &a.subject {
                Subject::User(u) => ("user", u.clone()),
                Subject::Group(g) => ("group", g.clone()),
                Subject::Token(t) => ("token", t.clone()),
            };
            json!({"path": a.path, "type": kind, "ugid": ugid, "roleid": a.role,
                   "propagate": u8::from(a.propagate)})
        })
        .collect();
    Json(json!({"data": data})).into_response()
}

async fn nextid(
    State(s): State<Shared>,
    Query(q): Query<BTreeMap<String, String>>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let _ = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    match q.get("vmid").and_then(|v| v.parse::<u64>().ok()) {
        Some(id) if c.guests.iter().any(|g| g.vmid == id) => pve_error(
            &c,
            StatusCode::BAD_REQUEST,
            "Parameter verification failed.",
            Some(json!({"vmid": format!("VM {id} already exists")})),
        ),
        Some(id) => Json(json!({"data": id.to_string()})).into_response(),
        None => {
            let free = (100..)
                .find(|i| !c.guests.iter().any(|g| g.vmid == *i))
                .unwrap();
            Json(json!({"data": free.to_string()})).into_response()
        }
    }
}

async fn fallback(State(s): State<Shared>, m: Method, u: Uri, h: HeaderMap) -> Response {
    let _ = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    pve_error(
        &c,
        StatusCode::NOT_IMPLEMENTED,
        &format!("Method '{m} {}' not implemented", u.path()),
        None,
    )
}
