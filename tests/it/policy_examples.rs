//! `examples/policies/`, the Proxmox library users copy, against real `show -json` documents
//! (the repository's bpg fixtures): a destroyed or replaced guest fails until approved, a VM over
//! the memory or core cap fails, a guest on another node or a disk on another storage fails, a
//! planbot finding becomes a blocker, and a plan that respects all of it passes.

use planbot::core::plan::Plan;
use planbot::core::policy::{evaluate, PlanInput, PolicyFile, PolicySet, Results};
use planbot::core::proxmox::lint::lint;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn library() -> PolicySet {
    let mut files: Vec<PolicyFile> = std::fs::read_dir(repo("examples/policies"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rego"))
        .map(|p| PolicyFile {
            path: p.file_name().unwrap().to_string_lossy().into_owned(),
            text: std::fs::read_to_string(&p).unwrap(),
        })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    assert!(files.len() >= 4, "the library's files: {files:?}");
    PolicySet {
        name: "proxmox".into(),
        namespace: "main".into(),
        files,
        limit: planbot::core::policy::DEFAULT_LIMIT,
    }
}

/// The library over a plan document, with planbot's lint findings as `data.planbot`.
fn check(plan_json: &str) -> Results {
    let plan = Plan::from_json(plan_json.as_bytes()).unwrap();
    let findings = lint(&plan, &[]);
    let verdict = evaluate(
        &PlanInput {
            plan_json,
            findings: &findings,
            root: "core",
        },
        &[library()],
    );
    match verdict.sets[0].results() {
        Some(r) => r.clone(),
        None => panic!("{:?}", verdict.sets[0].error()),
    }
}

fn failures(r: &Results) -> Vec<String> {
    let mut f: Vec<String> = r.failures.iter().map(|m| m.msg.clone()).collect();
    f.sort();
    f
}

#[test]
fn a_destroyed_or_replaced_guest_fails_until_an_owner_approves() {
    let r = check(&crate::support::fixtures::text(
        "plans/bpg/vm_destroyed_and_updated.json",
    ));
    assert_eq!(
        failures(&r),
        [
            "proxmox_virtual_environment_vm.old_db would be destroyed: a guest is destroyed only with a policy owner's approval",
            "proxmox_vm.scratch would be destroyed: a guest is destroyed only with a policy owner's approval",
        ]
    );
    // The in-place update of `web` is not a failure; PVE008 is repeated as a warning.
    assert_eq!(r.warnings.len(), 2, "{r:?}");

    let r = check(&crate::support::fixtures::text("plans/proxmox.json"));
    assert_eq!(
        failures(&r),
        [
            "proxmox_virtual_environment_container.pihole would be destroyed: a guest is destroyed only with a policy owner's approval",
            "proxmox_virtual_environment_vm.blocky would be replaced (destroyed and created again): a guest is destroyed only with a policy owner's approval",
        ]
    );
    let r = check(&crate::support::fixtures::text(
        "plans/bpg/other_provider.json",
    ));
    assert_eq!(
        failures(&r),
        [
            "proxmox_vm.x would be destroyed: a guest is destroyed only with a policy owner's approval",
            "proxmox_vm_qemu.old would be destroyed: a guest is destroyed only with a policy owner's approval",
        ]
    );
}

#[test]
fn guests_only_on_the_allowed_nodes_and_storages() {
    let r = check(&crate::support::fixtures::text(
        "plans/bpg/preflight_guests.json",
    ));
    assert_eq!(
        failures(&r),
        [
            "proxmox_virtual_environment_vm.ghost puts a disk on storage ceph-fast; allowed storages: ceph, local, local-lvm",
            "proxmox_virtual_environment_vm.ghost would run on node pve03; allowed nodes: pve01, pve02",
        ]
    );
}

#[test]
fn memory_and_cores_over_the_caps_fail() {
    // The same real document, with `dns` grown past both caps.
    let mut doc: Value = serde_json::from_str(&crate::support::fixtures::text(
        "plans/bpg/preflight_guests.json",
    ))
    .unwrap();
    let dns = doc["resource_changes"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|rc| rc["address"] == "proxmox_virtual_environment_vm.dns")
        .unwrap();
    dns["change"]["after"]["memory"][0]["dedicated"] = 32768.into();
    dns["change"]["after"]["cpu"][0]["cores"] = 6.into();
    dns["change"]["after"]["cpu"][0]["sockets"] = 2.into();
    let r = check(&doc.to_string());
    let f = failures(&r);
    assert!(
        f.contains(&"proxmox_virtual_environment_vm.dns asks for 32768 MiB of memory; the cap is 16384 MiB".to_string()),
        "{f:?}"
    );
    assert!(
        f.contains(
            &"proxmox_virtual_environment_vm.dns asks for 12 cores; the cap is 8".to_string()
        ),
        "{f:?}"
    );
    assert_eq!(f.len(), 4, "and ghost's two: {f:?}");
}

#[test]
fn a_planbot_finding_becomes_a_blocker() {
    let r = check(&crate::support::fixtures::text(
        "plans/bpg/seed_flatcar_img_import.json",
    ));
    let f = failures(&r);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0].starts_with("PVE006 proxmox_virtual_environment_download_file.")
            && f[0].ends_with("(a blocker in this repository)"),
        "{f:?}"
    );
}

#[test]
fn a_plan_within_the_rules_passes_every_test() {
    let r = check(&crate::support::fixtures::text(
        "plans/bpg/checksum_and_unknowns.json",
    ));
    assert!(r.failures.is_empty() && r.warnings.is_empty(), "{r:?}");
    assert_eq!(r.successes, r.tests());
    assert!(
        r.successes >= 6,
        "each deny and warn definition counts: {r:?}"
    );
}
