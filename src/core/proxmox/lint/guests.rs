//! Rules on one guest's own settings that the apply trips over: disk edits (PVE017), CPU or
//! memory changes that wait for a reboot (PVE019), UEFI without an EFI disk (PVE020), and names
//! Proxmox refuses (PVE022).
//!
//! Each looks at one VM or container at a time (`Check::Each`).

use super::model::{after, before, block_len, is_created, is_planned, Attr, Kind, Res};
use super::vm::unchanged;
use super::{finding, Finding, LintInput};
use crate::core::plan::ActionKind;
use crate::core::plan::Json;
use crate::core::proxmox::findings::{finding_with, Severity};
use serde_json::{json, Value};

fn is_vm(rc: &Res) -> bool {
    Kind::of(rc).is_some_and(Kind::is_vm)
}

/// A size in GB as the provider writes it (a number; older versions a string like `"40G"`).
fn gigabytes(v: &Json) -> Option<f64> {
    match v {
        Json::Number(n) => n.as_f64(),
        Json::Str(s) => s.trim().trim_end_matches(['G', 'g']).parse().ok(),
        _ => None,
    }
}

/// A number as the note shows it (`40`, `2.5`).
fn shown(n: f64) -> Value {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        json!(n as i64)
    } else {
        json!(n)
    }
}

/// PVE017: an update that shrinks a disk (an error: Proxmox refuses) or moves it to another
/// storage (a warning: the provider stops the VM for the move). Disks are matched by
/// `interface`, else by position; a disk that is new has nothing to compare.
pub fn pve017(_: &LintInput, rc: &Res) -> Vec<Finding> {
    let mut out = Vec::new();
    if !is_vm(rc) || rc.kind() != ActionKind::Update {
        return out;
    }
    let before_disks = before(rc, "disk")
        .and_then(Json::as_array)
        .unwrap_or_default();
    for i in 0..block_len(rc, "disk") {
        let interface = after(rc, &format!("disk.{i}.interface")).str();
        let old = match interface {
            Some(name) => before_disks
                .iter()
                .find(|d| d.get("interface").as_str() == Some(name)),
            None => before_disks.get(i),
        };
        let Some(old) = old else { continue };
        if let (Some(from), Attr::Known(to)) = (
            gigabytes(old.get("size")),
            after(rc, &format!("disk.{i}.size")),
        ) {
            if let Some(to) = gigabytes(to).filter(|to| *to < from) {
                out.push(finding_with(
                    "PVE017",
                    Severity::Error,
                    &rc.address,
                    json!({
                        "what": "shrink",
                        "disk": i,
                        "interface": interface,
                        "from": shown(from),
                        "to": shown(to),
                    }),
                ));
            }
        }
        let from_store = old.get("datastore_id").as_str();
        let to_store = after(rc, &format!("disk.{i}.datastore_id")).str();
        if let (Some(from), Some(to)) = (from_store.filter(|s| !s.is_empty()), to_store) {
            if from != to {
                out.push(finding(
                    "PVE017",
                    &rc.address,
                    json!({
                        "what": "move",
                        "disk": i,
                        "interface": interface,
                        "from": from,
                        "to": to,
                        "vm_id": before(rc, "vm_id"),
                    }),
                ));
            }
        }
    }
    out
}

/// Proxmox's `hotplug` default when the VM does not set it.
const DEFAULT_HOTPLUG: &str = "network,disk,usb";

/// PVE019: an update of a running VM changes `cpu.cores`, `cpu.sockets` or
/// `memory.dedicated`, and the VM cannot take it hot: its `hotplug` lacks `cpu` (or `memory`),
/// or, for memory, NUMA is off. Proxmox keeps the change pending until a reboot, and the
/// provider may not reboot (bpg #2516).
pub fn pve019(_: &LintInput, rc: &Res) -> Vec<Finding> {
    if !is_vm(rc) || rc.kind() != ActionKind::Update {
        return Vec::new();
    }
    // A stopped VM takes the new values at its next start.
    if after(rc, "started").bool() == Some(false) {
        return Vec::new();
    }
    let hotplug = match after(rc, "hotplug") {
        Attr::Unknown => return Vec::new(),
        Attr::Known(Json::Str(s)) if !s.trim().is_empty() => s.trim().to_string(),
        _ => DEFAULT_HOTPLUG.to_string(),
    };
    // `1` is Proxmox's default set, `0` none.
    let features: Vec<String> = match hotplug.as_str() {
        "1" => DEFAULT_HOTPLUG.split(',').map(str::to_string).collect(),
        "0" => Vec::new(),
        h => h
            .split(',')
            .map(|f| f.trim().to_ascii_lowercase())
            .collect(),
    };
    let has = |f: &str| features.iter().any(|x| x == f);
    let numa = after(rc, "cpu.0.numa").bool() == Some(true);
    let mut changes = Vec::new();
    // What keeps them from being hot: hotplug features missing, NUMA off.
    let mut missing: Vec<&str> = Vec::new();
    let mut numa_off = false;
    for (path, attribute, feature) in [
        ("cpu.0.cores", "cpu.cores", "cpu"),
        ("cpu.0.sockets", "cpu.sockets", "cpu"),
        ("memory.0.dedicated", "memory.dedicated", "memory"),
    ] {
        let (Some(from), Attr::Known(to)) = (before(rc, path), after(rc, path)) else {
            continue;
        };
        if from == to || from.as_f64().is_none() || to.as_f64().is_none() {
            continue;
        }
        let needs_numa = feature == "memory" && !numa;
        if has(feature) && !needs_numa {
            continue;
        }
        if !has(feature) && !missing.contains(&feature) {
            missing.push(feature);
        }
        numa_off |= needs_numa;
        changes.push(json!({"attribute": attribute, "from": from, "to": to}));
    }
    if changes.is_empty() {
        return Vec::new();
    }
    vec![finding(
        "PVE019",
        &rc.address,
        json!({
            "changes": changes,
            "hotplug": hotplug,
            "missing": missing,
            "numa_off": numa_off,
            "vm_id": before(rc, "vm_id"),
        }),
    )]
}

/// PVE020: `bios = "ovmf"` and no `efi_disk {}`, on a VM created or whose firmware settings
/// change (a VM left as it is was reported when it was planned).
pub fn pve020(_: &LintInput, rc: &Res) -> Vec<Finding> {
    if !is_vm(rc) || !is_planned(rc) || after(rc, "bios").str() != Some("ovmf") {
        return Vec::new();
    }
    if after(rc, "efi_disk").is_unknown() || block_len(rc, "efi_disk") > 0 {
        return Vec::new();
    }
    if !is_created(rc) && unchanged(rc, "bios") && unchanged(rc, "efi_disk") {
        return Vec::new();
    }
    let storage = after(rc, "disk.0.datastore_id")
        .str()
        .unwrap_or("local-lvm");
    vec![finding(
        "PVE020",
        &rc.address,
        json!({ "storage": storage }),
    )]
}

/// Whether Proxmox's `dns-name` format accepts `name` (pve-common `pve_verify_dns_name`:
/// labels of letters, digits and `-`, not starting or ending with `-`, joined by `.`).
pub fn is_dns_name(name: &str) -> bool {
    name.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
    })
}

/// A DNS name close to `name`: every other character becomes `-`, labels trimmed of `-`,
/// empty labels dropped.
fn dns_suggestion(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let labels: Vec<&str> = mapped
        .split('.')
        .map(|l| l.trim_matches('-'))
        .filter(|l| !l.is_empty())
        .collect();
    if labels.is_empty() {
        "guest".to_string()
    } else {
        labels.join(".")
    }
}

/// PVE022: a VM `name` or a container `initialization.hostname` that is not a DNS name, on a
/// guest created or renamed.
pub fn pve022(_: &LintInput, rc: &Res) -> Vec<Finding> {
    let (path, attribute, parameter) = match Kind::of(rc) {
        Some(k) if k.is_vm() => ("name", "name", "name"),
        Some(Kind::Container) => (
            "initialization.0.hostname",
            "initialization.hostname",
            "hostname",
        ),
        _ => return Vec::new(),
    };
    if !is_planned(rc) {
        return Vec::new();
    }
    let Some(name) = after(rc, path).str() else {
        return Vec::new();
    };
    if is_dns_name(name) || (!is_created(rc) && unchanged(rc, path)) {
        return Vec::new();
    }
    vec![finding(
        "PVE022",
        &rc.address,
        json!({
            "name": name,
            "attribute": attribute,
            "parameter": parameter,
            "container": Kind::of(rc) == Some(Kind::Container),
            "suggested": dns_suggestion(name),
        }),
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_as_proxmox_checks_them() {
        for ok in ["web-01", "web01", "a", "db.lab.example", "9lives", "A-b"] {
            assert!(is_dns_name(ok), "{ok}");
        }
        for bad in [
            "web_01", "-web", "web-", "a..b", "", "web 01", "wéb", ".a", "a.",
        ] {
            assert!(!is_dns_name(bad), "{bad}");
        }
        assert_eq!(dns_suggestion("web_01"), "web-01");
        assert_eq!(dns_suggestion("_db_.lab"), "db.lab");
        assert_eq!(dns_suggestion("__"), "guest");
        assert!(is_dns_name(&dns_suggestion("my vm (test)")));
    }
}
