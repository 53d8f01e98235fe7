//! Rules on `download_file` resources (PVE001–PVE004, PVE006, PVE007, PVE009).

use super::model::{
    after, before, block_len, is_floating_url, is_planned, normalise_file_name, Attr, Index, Kind,
    Res,
};
use super::{finding, Finding, LintInput};
use crate::core::plan::Json;
use crate::core::plan::ResourceChange;
use serde_json::{json, Value};
use std::collections::HashMap;

/// Extensions Proxmox accepts for `import` content (case-sensitive).
const IMPORT_EXT: &[&str] = &[".qcow2", ".raw", ".vmdk", ".ova"];
const ISO_EXT: &[&str] = &[".iso", ".img"];
const VZTMPL_EXT: &[&str] = &[".tar", ".tar.gz", ".tar.xz", ".tar.zst", ".tar.bz2"];
const COMPRESSION_EXT: &[&str] = &[".xz", ".gz", ".zst", ".bz2", ".lzo"];

fn planned_downloads<'a>(input: &'a LintInput) -> impl Iterator<Item = &'a Res<'a>> + 'a {
    input
        .index
        .files(Kind::DownloadFile)
        .filter(|rc| is_planned(rc))
}

/// What to name an import image: its real format's extension, no compression suffix.
fn suggest_import_name(name: &str) -> String {
    let mut stem = name.to_string();
    while let Some(ext) = COMPRESSION_EXT.iter().find(|e| stem.ends_with(*e)) {
        stem.truncate(stem.len() - ext.len());
    }
    let lower = stem.to_ascii_lowercase();
    if let Some(ext) = IMPORT_EXT.iter().find(|e| lower.ends_with(*e)) {
        return format!("{}{}", &stem[..stem.len() - ext.len()], ext);
    }
    for ext in [".img", ".iso"] {
        if lower.ends_with(ext) {
            return format!("{}.qcow2", &stem[..stem.len() - ext.len()]);
        }
    }
    format!("{stem}.qcow2")
}

/// PVE001: `content_type = "import"` with a name that does not end in a disk image extension.
pub fn pve001(input: &LintInput) -> Vec<Finding> {
    planned_downloads(input)
        .filter_map(|rc| {
            if after(rc, "content_type").str()? != "import" {
                return None;
            }
            let raw = input.index.download_name(rc)?;
            let name = normalise_file_name(&raw);
            if IMPORT_EXT.iter().any(|e| name.ends_with(e)) {
                return None;
            }
            Some(finding(
                "PVE001",
                &rc.address,
                json!({
                    "name": name,
                    "from_url": after(rc, "file_name").str().is_none(),
                    "suggested": suggest_import_name(&name),
                    "flatcar": name.ends_with("_image.img"),
                }),
            ))
        })
        .collect()
}

/// PVE002: `iso` not ending in .iso/.img, `vztmpl` not ending in a tar archive extension.
pub fn pve002(input: &LintInput) -> Vec<Finding> {
    planned_downloads(input)
        .filter_map(|rc| {
            let content = after(rc, "content_type").str()?;
            let name = normalise_file_name(&input.index.download_name(rc)?);
            let ok = match content {
                "iso" => {
                    let lower = name.to_ascii_lowercase();
                    ISO_EXT.iter().any(|e| lower.ends_with(e))
                }
                "vztmpl" => VZTMPL_EXT.iter().any(|e| name.ends_with(e)),
                _ => return None,
            };
            if ok {
                return None;
            }
            let disk_image = IMPORT_EXT
                .iter()
                .any(|e| name.to_ascii_lowercase().ends_with(e));
            Some(finding(
                "PVE002",
                &rc.address,
                json!({
                    "name": name,
                    "content_type": content,
                    "disk_image": disk_image,
                    "iso_name": format!("{}.img", name.rsplit_once('.').map_or(name.as_str(), |(s, _)| s)),
                }),
            ))
        })
        .collect()
}

/// PVE003: `decompression_algorithm` with a content type other than `iso`.
pub fn pve003(input: &LintInput) -> Vec<Finding> {
    planned_downloads(input)
        .filter_map(|rc| {
            let algo = after(rc, "decompression_algorithm").str()?;
            let content = after(rc, "content_type").str()?;
            if content == "iso" {
                return None;
            }
            let url = after(rc, "url").str().unwrap_or_default();
            let suffix = format!(".{}", algo);
            let known_suffix = COMPRESSION_EXT
                .iter()
                .find(|e| url.ends_with(*e))
                .map(|s| s.to_string());
            Some(finding(
                "PVE003",
                &rc.address,
                json!({
                    "algorithm": algo,
                    "content_type": content,
                    "url_suffix": known_suffix.unwrap_or(suffix),
                }),
            ))
        })
        .collect()
}

/// PVE004: exactly one of `checksum` / `checksum_algorithm`.
pub fn pve004(input: &LintInput) -> Vec<Finding> {
    planned_downloads(input)
        .filter_map(|rc| {
            let sum = after(rc, "checksum");
            let algo = after(rc, "checksum_algorithm");
            if sum.is_unknown() || algo.is_unknown() || sum.is_set() == algo.is_set() {
                return None;
            }
            Some(finding(
                "PVE004",
                &rc.address,
                json!({
                    "missing": if sum.is_set() { "checksum_algorithm" } else { "checksum" },
                    "present": if sum.is_set() { "checksum" } else { "checksum_algorithm" },
                }),
            ))
        })
        .collect()
}

fn floating_url<'a>(rc: &'a Res) -> Option<&'a str> {
    after(rc, "url").str().filter(|u| is_floating_url(u))
}

/// PVE006: a floating URL and no checksum.
pub fn pve006(input: &LintInput) -> Vec<Finding> {
    planned_downloads(input)
        .filter_map(|rc| {
            let url = floating_url(rc)?;
            if !after(rc, "checksum").is_unset() {
                return None;
            }
            Some(finding("PVE006", &rc.address, json!({ "url": url })))
        })
        .collect()
}

/// PVE007: a floating URL with `overwrite` true (the provider's default).
pub fn pve007(input: &LintInput) -> Vec<Finding> {
    planned_downloads(input)
        .filter_map(|rc| {
            let url = floating_url(rc)?;
            let overwrite = match after(rc, "overwrite") {
                Attr::Absent => true,
                a => a.bool()?,
            };
            if !overwrite {
                return None;
            }
            Some(finding("PVE007", &rc.address, json!({ "url": url })))
        })
        .collect()
}

/// Attribute paths as a user writes them: `["url"]` → `url`, `["disk",0,"size"]` → `disk[0].size`.
pub(crate) fn path_text(path: &[Value]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Value::Number(n) => out.push_str(&format!("[{n}]")),
            Value::String(s) if !out.is_empty() => {
                out.push('.');
                out.push_str(s);
            }
            Value::String(s) => out.push_str(s),
            other => out.push_str(&other.to_string()),
        }
    }
    out
}

/// PVE009: a download_file is replaced; name the VMs that use it.
pub fn pve009(input: &LintInput) -> Vec<Finding> {
    let replaced: Vec<&Res> = input
        .index
        .files(Kind::DownloadFile)
        .filter(|rc| rc.kind().is_replace())
        .collect();
    let uses = &input.file_uses;
    replaced
        .into_iter()
        .map(|rc| {
            let old_id = before(rc, "id").and_then(Json::as_str);
            let users: Vec<String> = uses
                .users(old_id, &rc.address)
                .into_iter()
                .map(|vm| vm.address.clone())
                .collect();
            let paths: Vec<String> = rc
                .change
                .replace_paths
                .iter()
                .flatten()
                .map(|p| path_text(p))
                .collect();
            finding(
                "PVE009",
                &rc.address,
                json!({
                    "paths": paths,
                    "users": users,
                    "url": after(rc, "url").str(),
                }),
            )
        })
        .collect()
}

/// Which VMs use which file in a disk (`import_from` / `file_id`), by the file's known id or
/// by a reference in the VM's configuration; the VMs' positions in plan order. Gathered by the
/// lint pass, one VM at a time.
#[derive(Default)]
pub struct FileUses<'p> {
    vms: Vec<&'p ResourceChange>,
    by_id: HashMap<String, Vec<usize>>,
    by_reference: HashMap<&'p str, Vec<usize>>,
}

impl<'p> FileUses<'p> {
    /// Note the files `vm` uses (anything but a VM is ignored).
    pub fn add(&mut self, index: &Index<'p>, vm: &Res<'p>) {
        if !Kind::of(vm).is_some_and(Kind::is_vm) {
            return;
        }
        let n = self.vms.len();
        self.vms.push(vm.rc);
        fn note<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Vec<usize>>, key: K, n: usize) {
            let list = map.entry(key).or_default();
            if list.last() != Some(&n) {
                list.push(n);
            }
        }
        let disks = block_len(vm, "disk").max(
            vm.values()
                .before
                .get("disk")
                .as_array()
                .map_or(0, <[Json]>::len),
        );
        for i in 0..disks {
            for attr in ["import_from", "file_id"] {
                let path = format!("disk.{i}.{attr}");
                if let Some(id) = after(vm, &path).str() {
                    note(&mut self.by_id, id.to_string(), n);
                }
                if let Some(id) = before(vm, &path).and_then(Json::as_str) {
                    note(&mut self.by_id, id.to_string(), n);
                }
                for r in index.referenced_files(vm.rc, &path) {
                    note(&mut self.by_reference, r.rc.address.as_str(), n);
                }
            }
        }
    }

    /// The VMs (in plan order) that use the file at `address` whose id was `old_id`.
    fn users(&self, old_id: Option<&str>, address: &str) -> Vec<&'p ResourceChange> {
        let mut found: Vec<usize> = old_id
            .and_then(|id| self.by_id.get(id))
            .into_iter()
            .chain(self.by_reference.get(address))
            .flatten()
            .copied()
            .collect();
        found.sort_unstable();
        found.dedup();
        found.into_iter().map(|n| self.vms[n]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_the_real_format() {
        assert_eq!(
            suggest_import_name("flatcar_production_qemu_image.img"),
            "flatcar_production_qemu_image.qcow2"
        );
        assert_eq!(suggest_import_name("metal-amd64.raw.xz"), "metal-amd64.raw");
        assert_eq!(suggest_import_name("disk.QCOW2"), "disk.qcow2");
        assert_eq!(suggest_import_name("noext"), "noext.qcow2");
    }

    #[test]
    fn paths_read_like_hcl() {
        assert_eq!(
            path_text(&[json!("disk"), json!(0), json!("size")]),
            "disk[0].size"
        );
    }
}
