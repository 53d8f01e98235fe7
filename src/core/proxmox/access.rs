//! The Proxmox VE privileges planbot's checks need, defined once: the live preflight
//! (`core::proxmox::preflight`) and `planbot doctor` (`flows::cli::doctor`) both test and grant exactly these.
//!
//! Each [`Need`] names the privileges Proxmox checks for an API call (`requires`, from the API
//! viewer's "Required permissions") and the role planbot tells the user to create (`grants`:
//! the required privileges plus what lets the token see the object).

use std::collections::{BTreeMap, BTreeSet};

/// A set of privileges on one path, and the custom role that grants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// The custom role the fix creates.
    pub role: &'static str,
    /// What Proxmox checks (all of them).
    pub requires: &'static [&'static str],
    /// What the role holds (`requires` and more).
    pub grants: &'static [&'static str],
}

impl Need {
    /// The required privileges `privs` lacks on `path`, in the order of `requires`.
    pub fn missing(&self, privs: &Privileges, path: &str) -> Vec<&'static str> {
        self.requires
            .iter()
            .copied()
            .filter(|p| !privs.has(path, p))
            .collect()
    }

    pub fn met(&self, privs: &Privileges, path: &str) -> bool {
        self.missing(privs, path).is_empty()
    }
}

/// A download (`POST /nodes/{node}/storage/{storage}/download-url`), on the storage:
/// `Datastore.AllocateTemplate`; `Datastore.Audit` lets the token see the storage at all.
pub const DOWNLOAD_STORAGE: Need = Need {
    role: "PlanbotTemplates",
    requires: &["Datastore.AllocateTemplate"],
    grants: &["Datastore.AllocateTemplate", "Datastore.Audit"],
};

/// A download, on `/`: `Sys.Audit` + `Sys.Modify` (or [`DOWNLOAD_NODE`] on the node).
pub const DOWNLOAD_ROOT: Need = Need {
    role: "PlanbotDownload",
    requires: &["Sys.Audit", "Sys.Modify"],
    grants: &["Sys.Audit", "Sys.Modify"],
};

/// A download, the narrow alternative to [`DOWNLOAD_ROOT`]: on `/nodes/{node}`.
pub const DOWNLOAD_NODE: Need = Need {
    role: "PlanbotNetwork",
    requires: &["Sys.AccessNetwork"],
    grants: &["Sys.AccessNetwork"],
};

/// A snippet upload, on the storage (the provider reads the storage config, then uploads
/// over SSH).
pub const SNIPPETS: Need = Need {
    role: "PlanbotSnippets",
    requires: &["Datastore.Allocate"],
    grants: &["Datastore.Allocate", "Datastore.Audit"],
};

/// A privileged container or a VM `startup` block, on `/`.
pub const SYS_MODIFY: Need = Need {
    role: "PlanbotSysModify",
    requires: &["Sys.Modify"],
    grants: &["Sys.Modify"],
};

/// Seeing a storage at all (`GET /storage` lists only these): either privilege, on the storage.
pub const STORAGE_VISIBLE_ANY: &[&str] = &["Datastore.Audit", "Datastore.AllocateSpace"];
/// The built-in role that makes a storage visible (and usable for disks).
pub const STORAGE_VISIBLE_ROLE: &str = "PVEDatastoreUser";

/// What every plan's refresh reads, on `/` (the built-in `PVEAuditor` role has it).
pub const READ: Need = Need {
    role: "PVEAuditor",
    requires: &["Sys.Audit", "VM.Audit", "Datastore.Audit"],
    grants: &["Sys.Audit", "VM.Audit", "Datastore.Audit"],
};

/// What a typical apply (VMs with imported disks and cloud-init) needs on `/vms`.
pub const VMS: Need = Need {
    role: "PlanbotVMs",
    requires: VM_PRIVS,
    grants: VM_PRIVS,
};

const VM_PRIVS: &[&str] = &[
    "VM.Allocate",
    "VM.Audit",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Cloudinit",
    "VM.Config.Disk",
    "VM.Config.HWType",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.PowerMgmt",
];

/// Effective privileges by ACL path, as `GET /access/permissions?path=` answers them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Privileges(pub BTreeMap<String, BTreeSet<String>>);

impl Privileges {
    pub fn has(&self, path: &str, privilege: &str) -> bool {
        self.0.get(path).is_some_and(|p| p.contains(privilege))
    }

    pub fn knows(&self, path: &str) -> bool {
        self.0.contains_key(path)
    }

    pub fn insert(&mut self, path: String, privs: BTreeSet<String>) {
        self.0.insert(path, privs);
    }

    pub fn storage_visible(&self, storage: &str) -> bool {
        let path = format!("/storage/{storage}");
        STORAGE_VISIBLE_ANY.iter().any(|p| self.has(&path, p))
    }
}

/// Which guests `GET /cluster/resources?type=vm` may hide from the token: it lists only those
/// with `VM.Audit`. `all` is `GET /access/permissions` without a path (path → privilege →
/// propagate flag; PVE leaves out paths where nothing is left, so a `NoAccess` ACL does not show
/// there); `acl_paths` the paths of `GET /access/acl`, complete only with `Sys.Audit` on
/// `/access` (else PVE filters it). `Some(ids)`: the list shows every guest but those with an ACL
/// of their own (`/vms/{id}`); `None`: any guest may be missing from it (no propagating
/// `VM.Audit` on `/vms`, the ACL list unread or filtered, or an ACL on a pool, whose members
/// inherit it).
pub fn hidden_guests(
    all: &BTreeMap<String, BTreeMap<String, u8>>,
    acl_paths: Option<&[String]>,
) -> Option<BTreeSet<u64>> {
    let has = |path: &str, privilege: &str| all.get(path).and_then(|p| p.get(privilege)).copied();
    if has("/vms", "VM.Audit") != Some(1) || has("/access", "Sys.Audit").is_none() {
        return None;
    }
    let mut ids = BTreeSet::new();
    for path in acl_paths? {
        if path == "/pool" || path.starts_with("/pool/") {
            return None;
        }
        if let Some(id) = path.strip_prefix("/vms/") {
            ids.insert(id.parse().ok()?);
        }
    }
    Some(ids)
}

/// Whether the token can read every ACL (`Sys.Audit` on `/access`), from the same answer.
pub fn reads_every_acl(all: &BTreeMap<String, BTreeMap<String, u8>>) -> bool {
    all.get("/access")
        .is_some_and(|p| p.contains_key("Sys.Audit"))
}

/// What a download of a file to `storage` on `node` lacks; `None` when it may download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadGap {
    /// Missing on `/storage/{storage}` ([`DOWNLOAD_STORAGE`]).
    pub storage: Vec<&'static str>,
    /// Missing on `/` ([`DOWNLOAD_ROOT`]) when the node alternative is missing too.
    pub root: Vec<&'static str>,
}

pub fn download_gap(privs: &Privileges, storage: &str, node: &str) -> Option<DownloadGap> {
    let storage = DOWNLOAD_STORAGE.missing(privs, &format!("/storage/{storage}"));
    let root = if DOWNLOAD_NODE.met(privs, &format!("/nodes/{node}")) {
        Vec::new()
    } else {
        DOWNLOAD_ROOT.missing(privs, "/")
    };
    (!storage.is_empty() || !root.is_empty()).then_some(DownloadGap { storage, root })
}

/// "`A + B on PATH`": every one of `privs` is missing on `path` (`templates/privileges.j2`).
pub fn all_on(privs: &[&str], path: &str) -> String {
    phrase("all_on", serde_json::json!({"privs": privs, "path": path}))
}

/// "`A, B on PATH`": each of `privs` is missing on `path`.
pub fn each_on(privs: &[&str], path: &str) -> String {
    phrase("each_on", serde_json::json!({"privs": privs, "path": path}))
}

/// "`A on / (or B on /nodes/x, /nodes/y)`": `root` is missing on `/`, and the alternative
/// `node` on each of `node_paths`.
pub fn all_on_root_or_nodes(root: &[&str], node: &[&str], node_paths: &[String]) -> String {
    phrase(
        "all_on_root_or_nodes",
        serde_json::json!({"root": root, "node": node, "nodes": node_paths}),
    )
}

fn phrase(name: &str, d: serde_json::Value) -> String {
    crate::core::templates::call_macro("privileges.j2", name, &minijinja::Value::from_serialize(&d))
        .unwrap_or_else(|e| panic!("privileges.j2 macro {name}: {e}"))
}

/// The user a token belongs to (`tofu@pve` of `tofu@pve!plan`).
pub fn token_user(token: &str) -> &str {
    token.split_once('!').map_or(token, |(user, _)| user)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn privs(entries: &[(&str, &[&str])]) -> Privileges {
        Privileges(
            entries
                .iter()
                .map(|(p, s)| (p.to_string(), s.iter().map(|s| s.to_string()).collect()))
                .collect(),
        )
    }

    #[test]
    fn a_download_needs_the_storage_and_root_or_the_node() {
        let none = privs(&[]);
        let gap = download_gap(&none, "local", "pve01").unwrap();
        assert_eq!(gap.storage, vec!["Datastore.AllocateTemplate"]);
        assert_eq!(gap.root, vec!["Sys.Audit", "Sys.Modify"]);

        let node = privs(&[
            ("/storage/local", &["Datastore.AllocateTemplate"]),
            ("/nodes/pve01", &["Sys.AccessNetwork"]),
        ]);
        assert_eq!(download_gap(&node, "local", "pve01"), None);
        // Another node's Sys.AccessNetwork does not count.
        assert!(download_gap(&node, "local", "pve02").is_some());

        let root = privs(&[
            ("/storage/local", &["Datastore.AllocateTemplate"]),
            ("/", &["Sys.Audit"]),
        ]);
        assert_eq!(
            download_gap(&root, "local", "pve01").unwrap().root,
            vec!["Sys.Modify"]
        );
    }

    #[test]
    fn every_role_grants_what_it_requires() {
        for need in [
            DOWNLOAD_STORAGE,
            DOWNLOAD_ROOT,
            DOWNLOAD_NODE,
            SNIPPETS,
            SYS_MODIFY,
            READ,
            VMS,
        ] {
            for p in need.requires {
                assert!(need.grants.contains(p), "{} lacks {p}", need.role);
            }
        }
    }
}
