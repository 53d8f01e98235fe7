//! Rules on VMs and containers (PVE005, PVE008, PVE011, PVE013, PVE014).
//!
//! Each rule looks at one VM or container at a time (`Check::Each`): the lint pass parses its
//! values, shows it to every such rule, and drops it.

use super::download::path_text;
use super::model::{after, before, block_len, is_created, is_planned, Attr, Kind, Res, VolumeId};
use super::{finding, Finding, LintInput};
use crate::core::plan::ActionKind;
use crate::core::plan::Json;
use serde_json::{json, Value};

fn is_vm(rc: &Res) -> bool {
    Kind::of(rc).is_some_and(Kind::is_vm)
}

/// The content type a file resource stores (`content_type`), if known.
fn file_content<'a>(rc: &'a Res) -> Option<&'a str> {
    after(rc, "content_type")
        .str()
        .or_else(|| before(rc, "content_type").and_then(Json::as_str))
}

/// PVE005: a disk imported from (or `file_id` pointing at) an `iso` volume.
pub fn pve005(input: &LintInput, rc: &Res) -> Vec<Finding> {
    let mut out = Vec::new();
    if !is_vm(rc) || !is_created(rc) {
        return out;
    }
    {
        for i in 0..block_len(rc, "disk") {
            for attr in ["import_from", "file_id"] {
                let path = format!("disk.{i}.{attr}");
                let source = match after(rc, &path) {
                    Attr::Known(Json::Str(id)) => VolumeId::parse(id)
                        .filter(|v| v.content == "iso")
                        .map(|_| (format!("`{id}`"), None)),
                    Attr::Unknown => input
                        .index
                        .referenced_files(rc, &path)
                        .into_iter()
                        .find(|r| file_content(r) == Some("iso"))
                        .map(|r| (format!("`{}`", r.address), Some(r.address.clone()))),
                    _ => None,
                };
                if let Some((source, source_address)) = source {
                    let interface = after(rc, &format!("disk.{i}.interface")).str();
                    out.push(finding(
                        "PVE005",
                        &rc.address,
                        json!({
                            "attribute": format!("disk[{i}].{attr}"),
                            "interface": interface,
                            "source": source,
                            "source_address": source_address,
                        }),
                    ));
                }
            }
        }
    }
    out
}

/// PVE008: a VM is replaced or destroyed; say why. When what forces the replacement is a
/// cloud-init file id whose snippet the plan replaces (the file resource is immutable: new
/// content is a new file with an id known only after apply), name the snippet and the
/// attribute; when it is a `disk {}` block added or removed, say which.
pub fn pve008(input: &LintInput, rc: &Res) -> Vec<Finding> {
    std::iter::once(rc)
        .filter(|rc| is_vm(rc) && rc.kind().is_destructive())
        .map(|rc| {
            let replace_paths: &[Vec<Value>] = rc.change.replace_paths.as_deref().unwrap_or(&[]);
            let paths: Vec<String> = replace_paths.iter().map(|p| path_text(p)).collect();
            let snippets = if rc.kind().is_replace() {
                snippet_causes(input, rc, replace_paths)
            } else {
                Vec::new()
            };
            // Whether every path forcing the replacement is a snippet's file id.
            let only_snippets = !snippets.is_empty()
                && replace_paths.iter().all(|p| {
                    snippets
                        .iter()
                        .any(|s| s["path"].as_str() == Some(path_text(p).as_str()))
                });
            let disks = if rc.kind().is_replace() {
                disk_blocks_changed(rc, replace_paths)
            } else {
                None
            };
            finding(
                "PVE008",
                &rc.address,
                json!({
                    "replaced": rc.kind().is_replace(),
                    "reason": rc.action_reason,
                    "paths": paths,
                    "name": after(rc, "name").str().or_else(|| before(rc, "name").and_then(Json::as_str)),
                    "snippets": snippets,
                    "only_snippets": only_snippets,
                    "disks": disks,
                }),
            )
        })
        .collect()
}

/// The replace paths of `rc` that are a cloud-init file id (`initialization[i].*_file_id`)
/// pointing at a snippet the plan replaces: `{path, snippet}` for each.
fn snippet_causes(input: &LintInput, rc: &Res, replace_paths: &[Vec<Value>]) -> Vec<Value> {
    let mut out = Vec::new();
    for p in replace_paths {
        let [Value::String(block), Value::Number(i), Value::String(attr)] = p.as_slice() else {
            continue;
        };
        if block != "initialization" || !CLOUD_INIT_FILES.contains(&attr.as_str()) {
            continue;
        }
        let path = format!("initialization.{i}.{attr}");
        let replaced: Vec<&Res> = input
            .index
            .referenced_files(rc, &path)
            .into_iter()
            .filter(|f| f.kind().is_replace())
            .collect();
        for f in replaced {
            out.push(json!({"path": path_text(p), "snippet": f.address}));
        }
    }
    out
}

/// When a replacement is forced by the `disk` list and the number of disks changes: which
/// disks are added and which removed (by `interface`).
fn disk_blocks_changed(rc: &Res, replace_paths: &[Vec<Value>]) -> Option<Value> {
    let by_disk = replace_paths
        .iter()
        .any(|p| p.first().and_then(Value::as_str) == Some("disk"));
    if !by_disk {
        return None;
    }
    let names = |disks: Option<&Json>| -> Vec<String> {
        disks
            .and_then(Json::as_array)
            .unwrap_or_default()
            .iter()
            .filter_map(|d| d.get("interface").as_str())
            .map(str::to_string)
            .collect()
    };
    let old = names(before(rc, "disk"));
    let new = match after(rc, "disk") {
        Attr::Known(v) => names(Some(v)),
        _ => return None,
    };
    if old.len() == new.len() {
        return None;
    }
    let added: Vec<&String> = new.iter().filter(|n| !old.contains(n)).collect();
    let removed: Vec<&String> = old.iter().filter(|n| !new.contains(n)).collect();
    Some(json!({
        "added": added,
        "removed": removed,
        "vm_id": before(rc, "vm_id"),
    }))
}

const CLOUD_INIT_FILES: &[&str] = &[
    "user_data_file_id",
    "vendor_data_file_id",
    "network_data_file_id",
    "meta_data_file_id",
];

/// PVE011: cloud-init files that are not snippets, or snippets on another node.
pub fn pve011(input: &LintInput, rc: &Res) -> Vec<Finding> {
    let mut out = Vec::new();
    if !is_vm(rc) || !is_planned(rc) {
        return out;
    }
    {
        let vm_node = after(rc, "node_name").str();
        for i in 0..block_len(rc, "initialization") {
            for attr in CLOUD_INIT_FILES {
                let path = format!("initialization.{i}.{attr}");
                let files: Vec<&Res> = match after(rc, &path) {
                    Attr::Known(Json::Str(id)) if !id.is_empty() => {
                        if let Some(v) = VolumeId::parse(id) {
                            if v.content != "snippets" {
                                out.push(finding(
                                    "PVE011",
                                    &rc.address,
                                    json!({"attribute": attr, "source": id, "content_type": v.content, "vm_node": vm_node}),
                                ));
                                continue;
                            }
                        }
                        input.index.files_with_id(id)
                    }
                    Attr::Unknown => input.index.referenced_files(rc, &path),
                    _ => Vec::new(),
                };
                for f in files {
                    if let Some(content) = file_content(f).filter(|c| *c != "snippets") {
                        out.push(finding(
                            "PVE011",
                            &rc.address,
                            json!({"attribute": attr, "source": f.address, "content_type": content, "vm_node": vm_node}),
                        ));
                        continue;
                    }
                    let file_node = after(f, "node_name").str();
                    let storage = after(f, "datastore_id").str();
                    let shared = storage.is_some_and(|s| input.facts.shared_storages.contains(s));
                    if let (Some(vn), Some(fnode)) = (vm_node, file_node) {
                        if vn != fnode && !shared {
                            out.push(finding(
                                "PVE011",
                                &rc.address,
                                json!({"attribute": attr, "source": f.address, "file_node": fnode, "vm_node": vn, "storage": storage}),
                            ));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Whether an update leaves `path` as it was (then the rule has nothing new to say).
pub(super) fn unchanged(rc: &Res, path: &str) -> bool {
    rc.kind() == ActionKind::Update
        && before(rc, path)
            == match after(rc, path) {
                Attr::Known(v) => Some(v),
                _ => None,
            }
}

/// PVE013: privileged containers and VM `startup` blocks need `Sys.Modify` on `/`.
pub fn pve013(_: &LintInput, rc: &Res) -> Vec<Finding> {
    let mut out = Vec::new();
    if !is_planned(rc) {
        return out;
    }
    if Kind::of(rc) == Some(Kind::Container) {
        let privileged = match after(rc, "unprivileged") {
            Attr::Absent => true,
            a => a.bool() == Some(false),
        };
        if privileged && !unchanged(rc, "unprivileged") {
            out.push(finding("PVE013", &rc.address, json!({"what": "container"})));
        }
    } else if is_vm(rc)
        && matches!(after(rc, "startup"), Attr::Known(Json::Array(a)) if !a.is_empty())
        && !unchanged(rc, "startup")
    {
        out.push(finding("PVE013", &rc.address, json!({"what": "startup"})));
    }
    out
}

/// The size the bpg provider gives a disk when `size` is not set.
const DEFAULT_DISK_GB: i64 = 8;

/// PVE014: a disk with `import_from` and no explicit `size`.
pub fn pve014(input: &LintInput, rc: &Res) -> Vec<Finding> {
    let mut out = Vec::new();
    if !is_vm(rc) || !is_created(rc) {
        return out;
    }
    {
        let configured_disks = input
            .index
            .config_expr(rc, "disk")
            .and_then(Value::as_array);
        for i in 0..block_len(rc, "disk") {
            if !after(rc, &format!("disk.{i}.import_from")).is_set() {
                continue;
            }
            let size = after(rc, &format!("disk.{i}.size"));
            let explicit = match configured_disks {
                // The configuration says whether `size` was written.
                Some(disks) if input.index.config_of(rc).is_some() => {
                    disks.get(i).and_then(|d| d.get("size")).is_some()
                }
                // Without it, the provider's default value is the tell.
                _ => {
                    !matches!(size, Attr::Absent)
                        && size.bool().is_none()
                        && !matches!(size, Attr::Known(v) if v.as_i64() == Some(DEFAULT_DISK_GB))
                }
            };
            if explicit {
                continue;
            }
            let interface = after(rc, &format!("disk.{i}.interface")).str();
            out.push(finding(
                "PVE014",
                &rc.address,
                json!({"disk": i, "interface": interface}),
            ));
        }
    }
    out
}
