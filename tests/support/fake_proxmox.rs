//! A stateful fake Proxmox VE API (axum on 127.0.0.1:0) speaking the real JSON shapes:
//! nodes, storages, taken VM ids, roles, API tokens and ACLs with Proxmox's inheritance (the
//! deepest ACL on a path replaces what is inherited), slow 401s, and an "old release" mode whose
//! error bodies carry no `message`.
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
        }
    }
}

#[derive(Debug, Clone)]
pub struct Acl {
    pub path: String,
    /// A token id `user@realm!name`.
    pub token: String,
    pub role: String,
    pub propagate: bool,
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
    pub vmids: BTreeSet<u64>,
    pub roles: BTreeMap<String, BTreeSet<String>>,
    /// token id → secret.
    pub tokens: BTreeMap<String, String>,
    pub acls: Vec<Acl>,
    /// Every request: (method, path?query).
    pub requests: Vec<(String, String)>,
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Proxmox VE 8.4's built-in roles (the ones the tests use).
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
    ])
}

impl Cluster {
    /// Two online nodes, `local` (dir: iso, vztmpl, backup — no import, no snippets),
    /// `local-lvm` (lvmthin: images, rootdir), `nfs-images` (shared nfs, everything),
    /// VM 100 existing, PVE 8.4.1, no tokens yet.
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
            vmids: BTreeSet::from([100]),
            roles: builtin_roles(),
            tokens: BTreeMap::new(),
            acls: Vec::new(),
            requests: Vec::new(),
        }
    }

    /// Add a token with `roles` on paths: `[("/", "PVEAdmin"), ("/nodes/pve01", "PVEAuditor")]`.
    pub fn token(mut self, id: &str, secret: &str, grants: &[(&str, &str)]) -> Cluster {
        self.tokens.insert(id.into(), secret.into());
        for (path, role) in grants {
            self.acls.push(Acl {
                path: path.to_string(),
                token: id.into(),
                role: role.to_string(),
                propagate: true,
            });
        }
        self
    }

    pub fn role(mut self, name: &str, privs: &[&str]) -> Cluster {
        self.roles.insert(name.into(), set(privs));
        self
    }

    /// The token's effective privileges on `path`: walk from `/` down; at each level where
    /// the token has ACL entries, they replace what was inherited.
    pub fn privileges(&self, token: &str, path: &str) -> BTreeMap<String, u8> {
        let mut levels = vec!["/".to_string()];
        let mut acc = String::new();
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            acc.push('/');
            acc.push_str(seg);
            levels.push(acc.clone());
        }
        let mut current: BTreeMap<String, u8> = BTreeMap::new();
        for (i, level) in levels.iter().enumerate() {
            let here: Vec<&Acl> = self
                .acls
                .iter()
                .filter(|a| a.token == token && &a.path == level)
                .filter(|a| a.propagate || i == levels.len() - 1)
                .collect();
            if here.is_empty() {
                continue;
            }
            current.clear();
            for acl in here {
                for p in self.roles.get(&acl.role).into_iter().flatten() {
                    current.insert(p.clone(), u8::from(acl.propagate));
                }
            }
        }
        current
    }
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
            .route("/api2/json/access/permissions", get(permissions))
            .route("/api2/json/cluster/nextid", get(nextid))
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
            .filter(|(id, secret)| c.tokens.get(*id).is_some_and(|s| s == secret))
            .map(|(id, _)| id.to_string());
        (presented, c.unauthorized_delay)
    };
    match token {
        Some(t) => Ok(t),
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
                   "shared": u8::from(st.shared), "total": 100_000_000_000u64,
                   "used": 20_000_000_000u64, "avail": 80_000_000_000u64})
        })
        .collect();
    Json(json!({"data": data})).into_response()
}

async fn permissions(
    State(s): State<Shared>,
    Query(q): Query<BTreeMap<String, String>>,
    m: Method,
    u: Uri,
    h: HeaderMap,
) -> Response {
    let token = authed!(s, m, u, h);
    let c = s.lock().unwrap();
    let mut data = serde_json::Map::new();
    match q.get("path") {
        Some(p) => {
            data.insert(p.clone(), json!(c.privileges(&token, p)));
        }
        None => {
            let mut paths: BTreeSet<String> = c
                .acls
                .iter()
                .filter(|a| a.token == token)
                .map(|a| a.path.clone())
                .collect();
            paths.insert("/".into());
            for p in paths {
                data.insert(p.clone(), json!(c.privileges(&token, &p)));
            }
        }
    }
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
        Some(id) if c.vmids.contains(&id) => pve_error(
            &c,
            StatusCode::BAD_REQUEST,
            "Parameter verification failed.",
            Some(json!({"vmid": format!("VM {id} already exists")})),
        ),
        Some(id) => Json(json!({"data": id.to_string()})).into_response(),
        None => {
            let free = (100..).find(|i| !c.vmids.contains(i)).unwrap();
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
