//! The generated plan the benchmarks share (`benches/render.rs`, `benches/policy.rs`).

use serde_json::json;

/// A `show -json` document with `n` resource changes in the documented shape: ~10 attributes
/// each, some nested, a multi-line cloud-init on every fourth, a sensitive password, and a mix
/// of 40% create, 30% update, 20% replace, 10% delete. Written resource by resource.
pub fn synth_plan(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 2500);
    out.extend_from_slice(
        br#"{"format_version":"1.2","terraform_version":"1.10.6","resource_changes":["#,
    );
    for i in 0..n {
        if i > 0 {
            out.push(b',');
        }
        let cloud_init = |extra: &str| {
            format!(
                "#cloud-config\nhostname: vm-{i}\nusers:\n  - name: ops\n    groups: [sudo]\npackages:\n  - qemu-guest-agent\n  - curl{extra}\nruncmd:\n  - systemctl enable --now qemu-guest-agent\n"
            )
        };
        let vm = |cores: u32, store: &str, extra: &str| {
            let mut v = json!({
                "vm_id": 1000 + i, "name": format!("vm-{i}"), "node_name": format!("pve0{}", i % 3),
                "cores": cores, "started": true, "tags": ["prod", "web"],
                "description": format!("Managed by planbot bench, VM number {i}"),
                "memory": [{"dedicated": 2048, "floating": 0}],
                "disk": [{"datastore_id": store, "interface": "scsi0", "size": 8, "iothread": true}],
                "network_device": [{"bridge": "vmbr0", "model": "virtio", "vlan_id": 10 + i % 5}],
                "initialization": [{"user_account": [{"username": "ops", "password": format!("pw-{i}-secret")}],
                                    "dns": [{"servers": ["9.9.9.9", "1.1.1.1"]}]}],
            });
            if i % 4 == 0 {
                v["initialization"][0]["user_data"] = json!(cloud_init(extra));
            }
            v
        };
        let sens = json!({"initialization": [{"user_account": [{"password": true}]}]});
        let (actions, before, after, reason, replace_paths) = match i % 10 {
            0..=3 => (
                json!(["create"]),
                json!(null),
                vm(2, "local-lvm", ""),
                None,
                None,
            ),
            4..=6 => (
                json!(["update"]),
                vm(2, "local-lvm", ""),
                vm(4, "local-lvm", "\n  - docker.io"),
                None,
                None,
            ),
            7 | 8 => (
                json!(["delete", "create"]),
                vm(2, "local-lvm", ""),
                vm(2, "ceph", ""),
                Some("replace_because_cannot_update"),
                Some(json!([["disk", 0, "datastore_id"]])),
            ),
            _ => (
                json!(["delete"]),
                vm(2, "local-lvm", ""),
                json!(null),
                Some("delete_because_count_index"),
                None,
            ),
        };
        let mut before = before;
        if before.is_object() {
            before["id"] = json!(format!("{}", 1000 + i));
        }
        let rc = json!({
            "address": format!("proxmox_virtual_environment_vm.fleet[{i}]"),
            "mode": "managed", "type": "proxmox_virtual_environment_vm", "name": "fleet", "index": i,
            "provider_name": "registry.opentofu.org/bpg/proxmox",
            "action_reason": reason,
            "change": {
                "actions": actions, "before": before, "after": after,
                "after_unknown": if after.is_null() { json!(false) } else { json!({"id": true, "ipv4_addresses": true}) },
                "before_sensitive": if i % 10 < 4 { json!(false) } else { sens.clone() },
                "after_sensitive": if i % 10 == 9 { json!(false) } else { sens },
                "replace_paths": replace_paths,
            }
        });
        serde_json::to_writer(&mut out, &rc).unwrap();
    }
    out.extend_from_slice(br#"],"errored":false}"#);
    out
}

/// [`synth_plan`] as `tofu show -json` writes it: with the sections beside `resource_changes`
/// that a real document carries (measured on the fixtures: `resource_changes` is ~40% of it):
/// `planned_values` (each resource's planned values), `prior_state` (each existing resource's
/// values) and `configuration` (the one `count`ed resource block). Used where the size of the
/// whole document matters (reading it into the policy interpreter).
#[allow(dead_code)] // only the policy benchmark reads the whole document
pub fn synth_show_json(n: usize) -> Vec<u8> {
    let mut doc: serde_json::Value =
        serde_json::from_slice(&synth_plan(n)).expect("the synthetic plan is JSON");
    let changes = doc["resource_changes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let resource = |rc: &serde_json::Value, values: &serde_json::Value| {
        json!({
            "address": rc["address"], "mode": "managed", "type": rc["type"], "name": rc["name"],
            "index": rc["index"], "provider_name": rc["provider_name"], "schema_version": 0,
            "values": values, "sensitive_values": {},
        })
    };
    let planned: Vec<_> = changes
        .iter()
        .filter(|rc| !rc["change"]["after"].is_null())
        .map(|rc| resource(rc, &rc["change"]["after"]))
        .collect();
    let prior: Vec<_> = changes
        .iter()
        .filter(|rc| !rc["change"]["before"].is_null())
        .map(|rc| resource(rc, &rc["change"]["before"]))
        .collect();
    doc["planned_values"] = json!({"root_module": {"resources": planned}});
    doc["prior_state"] = json!({
        "format_version": "1.0", "terraform_version": "1.10.6",
        "values": {"root_module": {"resources": prior}},
    });
    doc["configuration"] = json!({
        "provider_config": {"proxmox": {"name": "proxmox", "full_name": "registry.opentofu.org/bpg/proxmox"}},
        "root_module": {"resources": [{
            "address": "proxmox_virtual_environment_vm.fleet", "mode": "managed",
            "type": "proxmox_virtual_environment_vm", "name": "fleet",
            "provider_config_key": "proxmox", "count_expression": {"constant_value": n},
            "expressions": {"node_name": {"references": ["count.index"]}}, "schema_version": 0,
        }]},
    });
    serde_json::to_vec(&doc).expect("the document serialises")
}
