//! The Proxmox plan lint rules against bpg-shaped `show -json` fixtures: each rule fires
//! exactly where the catalogue says, stays silent otherwise, and tells the user what to paste.

use planbot::core::proxmox::findings::{self, Facts, Finding, Severity};
use planbot::core::proxmox::lint;

fn fired(findings: &[Finding]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = findings
        .iter()
        .map(|f| (f.rule.to_string(), f.address.clone()))
        .collect();
    v.sort();
    v
}

fn expect(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(r, a)| (r.to_string(), a.to_string()))
        .collect();
    v.sort();
    v
}

/// What a reviewer reads, one finding after the other.
fn as_text(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| {
            format!(
                "[{} {}] {}\n{}\nFix:\n{}\n",
                f.rule,
                f.severity.as_str(),
                f.address,
                f.message,
                f.fix
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_debian_cloud_image_downloaded_for_import_the_right_way_gets_no_finding() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/seed_debian_qcow2_import"),
        &[],
    );
    assert_eq!(findings, vec![], "{}", as_text(&findings));
}

#[test]
fn talos_raw_xz_with_decompression_for_import_is_two_errors() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/seed_talos_raw_xz_decompress"),
        &[],
    );
    assert_eq!(
        fired(&findings),
        expect(&[
            ("PVE001", "proxmox_download_file.talos"),
            ("PVE003", "proxmox_download_file.talos"),
        ])
    );
    assert!(findings::has_errors(&findings));
    let text = as_text(&findings);
    assert!(
        text.contains("`nocloud-amd64.raw.xz` (named after the URL)"),
        "{text}"
    );
    assert!(text.contains("file_name = \"nocloud-amd64.raw\""), "{text}");
    assert!(text.contains("drop `.xz`"), "{text}");
    insta::assert_snapshot!(text);
}

#[test]
fn flatcar_img_for_import_from_the_current_channel() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/seed_flatcar_img_import"),
        &[],
    );
    let a = "proxmox_virtual_environment_download_file.flatcar";
    assert_eq!(
        fired(&findings),
        expect(&[("PVE001", a), ("PVE006", a), ("PVE007", a)])
    );
    // errors first
    assert_eq!(findings[0].severity, Severity::Error);
    let text = as_text(&findings);
    assert!(text.contains("file_name = \"flatcar_production_qemu_image.qcow2\""));
    assert!(text.contains("overwrite = false"));
    insta::assert_snapshot!(text);
}

#[test]
fn an_iso_typed_image_used_as_a_disk_is_an_error_by_reference_and_by_id() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/seed_iso_as_import_from"),
        &[],
    );
    assert_eq!(
        fired(&findings),
        expect(&[
            ("PVE005", "proxmox_virtual_environment_vm.app"),
            ("PVE005", "proxmox_virtual_environment_vm.legacy"),
        ])
    );
    let text = as_text(&findings);
    assert!(text.contains("uses `proxmox_virtual_environment_download_file.debian_iso` as a disk (`disk[0].import_from`"));
    assert!(text.contains(
        "`local:iso/ubuntu-24.04-server-cloudimg-amd64.img` as a disk (`disk[0].file_id`"
    ));
    assert!(text.contains("has wrong type 'iso' - needs to be 'images' or 'import'"));
    insta::assert_snapshot!(text);
}

#[test]
fn a_for_each_refactor_prints_the_moved_block_to_paste() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/seed_for_each_refactor"),
        &[],
    );
    assert_eq!(
        fired(&findings),
        expect(&[(
            "PVE010",
            "proxmox_virtual_environment_download_file.debian[\"pve01\"]"
        )])
    );
    let fix = &findings[0].fix;
    assert!(
        fix.contains(
            "moved {\n  from = proxmox_virtual_environment_download_file.debian\n  to   = proxmox_virtual_environment_download_file.debian[\"pve01\"]\n}"
        ),
        "{fix}"
    );
    assert!(findings[0].message.contains("4.5 GB re-download"));
    insta::assert_snapshot!(as_text(&findings));
}

#[test]
fn no_moved_hint_once_the_move_is_done_or_when_the_name_changed() {
    assert_eq!(
        lint::lint(
            &crate::support::fixtures::plan("bpg/refactor_with_moved_block"),
            &[]
        ),
        vec![]
    );
    assert_eq!(
        lint::lint(
            &crate::support::fixtures::plan("bpg/rename_not_an_index_change"),
            &[]
        ),
        vec![]
    );
}

#[test]
fn a_vm_replaced_by_an_ignition_change_and_a_too_new_ignition_spec() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/seed_ignition_replace_triggered_by"),
        &[],
    );
    assert_eq!(
        fired(&findings),
        expect(&[
            ("PVE008", "proxmox_virtual_environment_vm.blocky"),
            ("PVE012", "proxmox_virtual_environment_file.blocky_ignition"),
        ])
    );
    let text = as_text(&findings);
    assert!(text.contains("will be replaced because `replace_triggered_by` fired — its disks"));
    assert!(text.contains("spec 3.6.0, newer than 3.5.0"));
    insta::assert_snapshot!(text);
}

#[test]
fn iso_and_container_template_extensions() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/extensions_iso_vztmpl"),
        &[],
    );
    assert_eq!(
        fired(&findings),
        expect(&[
            ("PVE002", "proxmox_download_file.alpine_zip"),
            (
                "PVE002",
                "proxmox_virtual_environment_download_file.debian_iso"
            ),
        ])
    );
    insta::assert_snapshot!(as_text(&findings));
}

#[test]
fn half_a_checksum_is_an_error_and_unknown_values_never_fire() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/checksum_and_unknowns"),
        &[],
    );
    assert_eq!(
        fired(&findings),
        expect(&[(
            "PVE004",
            "proxmox_virtual_environment_download_file.half_checksum"
        )])
    );
    assert!(findings[0]
        .message
        .contains("sets `checksum` without `checksum_algorithm`"));
}

#[test]
fn a_destroyed_vm_warns_and_an_in_place_update_does_not() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/vm_destroyed_and_updated"),
        &[],
    );
    assert_eq!(
        fired(&findings),
        expect(&[
            ("PVE008", "proxmox_virtual_environment_vm.old_db"),
            ("PVE008", "proxmox_vm.scratch"),
            // Not replaced (no PVE008), but its memory grows on a running VM without
            // memory hotplug: that waits for a reboot.
            ("PVE019", "proxmox_virtual_environment_vm.web"),
        ])
    );
    assert!(findings[0]
        .message
        .contains("will be destroyed because its resource block was removed from the configuration — its disks and everything on them are lost"));
}

#[test]
fn a_replaced_download_names_the_vms_that_go_with_it() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/download_replaced_with_user"),
        &[],
    );
    assert_eq!(
        fired(&findings),
        expect(&[
            ("PVE008", "proxmox_virtual_environment_vm.runner"),
            ("PVE009", "proxmox_virtual_environment_download_file.debian"),
        ])
    );
    let text = as_text(&findings);
    assert!(text.contains("(because of `url`)"), "{text}");
    assert!(
        text.contains(
            "the VMs that use it (`proxmox_virtual_environment_vm.runner`) are replaced too"
        ),
        "{text}"
    );
    assert!(
        text.contains("because `disk[0].file_id` cannot change in place"),
        "{text}"
    );
    insta::assert_snapshot!(text);
}

#[test]
fn cloud_init_files_must_be_snippets_on_the_vms_node() {
    let plan = crate::support::fixtures::plan("bpg/cloud_init_files");
    let findings = lint::lint(&plan, &[]);
    assert_eq!(
        fired(&findings),
        expect(&[
            ("PVE011", "proxmox_virtual_environment_vm.iso_user"),
            ("PVE011", "proxmox_virtual_environment_vm.other_node"),
        ])
    );
    let text = as_text(&findings);
    assert!(text.contains("runs on node `pve01` but reads `user_data_file_id` from `proxmox_virtual_environment_file.cloud_a`, a snippet on node `pve02`"), "{text}");
    insta::assert_snapshot!(text);

    // When the API says `local` is shared, the other node can read it.
    let facts = Facts {
        shared_storages: ["local".to_string()].into(),
        ..Facts::default()
    };
    let findings = lint::lint_with(&plan, &[], &facts);
    assert_eq!(
        fired(&findings),
        expect(&[("PVE011", "proxmox_virtual_environment_vm.iso_user")])
    );
}

#[test]
fn only_ignition_specs_newer_than_3_5_fire() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/ignition_snippets"),
        &[],
    );
    assert_eq!(
        fired(&findings),
        expect(&[("PVE012", "proxmox_virtual_environment_file.ign_new")])
    );
}

#[test]
fn privileged_containers_and_startup_blocks_need_sys_modify() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/sys_modify_needed"),
        &[],
    );
    assert_eq!(
        fired(&findings),
        expect(&[
            ("PVE013", "proxmox_virtual_environment_container.privileged"),
            ("PVE013", "proxmox_virtual_environment_vm.ordered"),
        ])
    );
    insta::assert_snapshot!(as_text(&findings));
}

#[test]
fn an_imported_disk_without_a_size_gets_the_8_gb_default() {
    let findings = lint::lint(&crate::support::fixtures::plan("bpg/import_size"), &[]);
    assert_eq!(
        fired(&findings),
        expect(&[("PVE014", "proxmox_virtual_environment_vm.nosize")])
    );
    // Without the configuration in the plan, the provider's default size is the tell.
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/import_size_without_configuration"),
        &[],
    );
    assert_eq!(
        fired(&findings),
        expect(&[("PVE014", "proxmox_virtual_environment_vm.nosize")])
    );
}

#[test]
fn other_providers_proxmox_resources_are_left_alone() {
    assert_eq!(
        lint::lint(&crate::support::fixtures::plan("bpg/other_provider"), &[]),
        vec![]
    );
}

#[test]
fn a_root_can_disable_rules() {
    let plan = crate::support::fixtures::plan("bpg/seed_flatcar_img_import");
    let findings = lint::lint(&plan, &["PVE006".to_string(), "pve007".to_string()]);
    assert_eq!(
        fired(&findings),
        expect(&[(
            "PVE001",
            "proxmox_virtual_environment_download_file.flatcar"
        )])
    );
}

#[test]
fn the_status_line_names_the_first_error() {
    let findings = lint::lint(
        &crate::support::fixtures::plan("bpg/seed_talos_raw_xz_decompress"),
        &[],
    );
    let d = lint::status_description(&findings).unwrap();
    assert!(d.starts_with("PVE001 proxmox_download_file.talos: "), "{d}");
    assert!(d.ends_with("(+1 more error)"), "{d}");
    assert!(!d.contains('\n'));
}

#[test]
fn inside_a_module_references_resolve_and_the_moved_block_is_local() {
    let findings = lint::lint(&crate::support::fixtures::plan("bpg/module_nested"), &[]);
    assert_eq!(
        fired(&findings),
        expect(&[
            (
                "PVE005",
                "module.stack[\"prod\"].proxmox_virtual_environment_vm.app"
            ),
            (
                "PVE010",
                "module.stack[\"prod\"].proxmox_virtual_environment_download_file.base[\"pve01\"]"
            ),
        ])
    );
    let moved = findings.iter().find(|f| f.rule == "PVE010").unwrap();
    assert!(
        moved.fix.contains("# inside the module's own .tf files (the module called as `module.stack[\"prod\"]`):\nmoved {\n  from = proxmox_virtual_environment_download_file.base\n  to   = proxmox_virtual_environment_download_file.base[\"pve01\"]\n}"),
        "{}",
        moved.fix
    );
}

#[test]
fn a_snippet_upload_warns_only_when_the_apply_has_no_ssh() {
    let plan = crate::support::fixtures::plan("bpg/ignition_snippets");
    let snippets = |facts: &Facts| -> Vec<String> {
        lint::lint_with(&plan, &[], facts)
            .into_iter()
            .filter(|f| f.rule == "PVE015")
            .map(|f| f.address)
            .collect()
    };
    // Unknown (a local run): silent. SSH configured: silent.
    assert_eq!(snippets(&Facts::default()), Vec::<String>::new());
    let with_ssh = Facts {
        apply_ssh: Some(true),
        ..Facts::default()
    };
    assert_eq!(snippets(&with_ssh), Vec::<String>::new());
    // The service knows the apply has none: every snippet upload says so, with the fix.
    let without = Facts {
        apply_ssh: Some(false),
        ..Facts::default()
    };
    let fired = snippets(&without);
    assert!(!fired.is_empty());
    assert!(fired
        .iter()
        .all(|a| a.starts_with("proxmox_virtual_environment_file.")));
    let text = as_text(
        &lint::lint_with(&plan, &[], &without)
            .into_iter()
            .filter(|f| f.rule == "PVE015")
            .collect::<Vec<_>>(),
    );
    assert!(text.contains("over SSH"), "{text}");
    assert!(text.contains("ssh_private_key_file"), "{text}");
}

// ----- issue 36: the apply failures bpg users still hit (fixtures: bpg/cluster_rules.py) -------

fn lint_fixture(name: &str) -> Vec<Finding> {
    lint::lint(&crate::support::fixtures::plan(&format!("bpg/{name}")), &[])
}

/// A healthy twin of a triggering plan gives no finding at all.
fn assert_silent(name: &str) {
    let findings = lint_fixture(name);
    assert_eq!(findings, vec![], "{name}:\n{}", as_text(&findings));
}

#[test]
fn several_full_clones_from_one_storage_warn_and_suggest_parallelism_1() {
    let findings = lint_fixture("clones_parallel");
    assert_eq!(
        fired(&findings),
        expect(&[("PVE016", "proxmox_virtual_environment_vm.k8s[\"w1\"]")])
    );
    assert_eq!(findings[0].severity, Severity::Warning);
    let text = as_text(&findings);
    assert!(
        text.contains("3 VMs are full-cloned from template 9000"),
        "{text}"
    );
    assert!(text.contains("storage `local-lvm`"), "{text}");
    assert!(
        text.contains(
            "can't lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout"
        ),
        "{text}"
    );
    assert!(
        findings[0].fix.lines().any(|l| l == "parallelism = 1"),
        "{text}"
    );
    insta::assert_snapshot!(text);
    // The root already runs one change at a time: nothing to say.
    let plan = crate::support::fixtures::plan("bpg/clones_parallel");
    let one_at_a_time = Facts {
        parallelism: Some(1),
        ..Facts::default()
    };
    assert_eq!(lint::lint_with(&plan, &[], &one_at_a_time), vec![]);
    let two = Facts {
        parallelism: Some(2),
        ..Facts::default()
    };
    let with_two = lint::lint_with(&plan, &[], &two);
    assert!(
        with_two[0].message.contains("2 at a time"),
        "{}",
        with_two[0].message
    );
    // With the preflight's storage types, the storage is named with its type.
    let typed = Facts {
        storage_types: [("local-lvm".to_string(), "lvmthin".to_string())].into(),
        ..Facts::default()
    };
    let with_type = lint::lint_with(&plan, &[], &typed);
    assert!(
        with_type[0]
            .message
            .contains("onto storage `local-lvm` (`lvmthin`)"),
        "{}",
        with_type[0].message
    );
    // One clone (and a VM that is not cloned): none.
    assert_silent("clones_one");
}

#[test]
fn a_changed_snippet_that_replaces_the_vm_names_the_snippet_and_how_to_keep_the_vm() {
    let findings = lint_fixture("snippet_replaces_vm");
    assert_eq!(
        fired(&findings),
        expect(&[("PVE008", "proxmox_virtual_environment_vm.web")])
    );
    let f = &findings[0];
    assert!(
        f.message.contains("only because snippet `proxmox_virtual_environment_file.web_user_data` gets new content"),
        "{}",
        f.message
    );
    assert!(
        f.message
            .contains("`initialization[0].user_data_file_id` forces replacement"),
        "{}",
        f.message
    );
    assert!(
        f.fix
            .contains("ignore_changes = [initialization[0].user_data_file_id]"),
        "{}",
        f.fix
    );
    insta::assert_snapshot!(as_text(&findings));
    // The VM ignores the file id: only the snippet is replaced, nothing to say.
    assert_silent("snippet_replaced_vm_kept");
}

#[test]
fn disk_edits_a_shrink_is_an_error_a_move_a_warning_an_added_disk_a_replacement() {
    let findings = lint_fixture("disk_edits");
    assert_eq!(
        fired(&findings),
        expect(&[
            ("PVE008", "proxmox_virtual_environment_vm.app"),
            ("PVE017", "proxmox_virtual_environment_vm.db"),
            ("PVE017", "proxmox_virtual_environment_vm.files"),
        ])
    );
    let by = |a: &str| findings.iter().find(|f| f.address.ends_with(a)).unwrap();
    let shrink = by(".db");
    assert_eq!(shrink.severity, Severity::Error);
    assert!(
        shrink.message.contains("from 40 GB to 20 GB"),
        "{}",
        shrink.message
    );
    assert!(
        shrink
            .message
            .contains("`shrinking disks is not supported`"),
        "{}",
        shrink.message
    );
    assert!(shrink.fix.starts_with("size = 40"), "{}", shrink.fix);
    let moved = by(".files");
    assert_eq!(moved.severity, Severity::Warning);
    assert!(
        moved.message.contains("from storage `local-lvm` to `ceph`"),
        "{}",
        moved.message
    );
    assert!(
        moved.fix.contains("qm disk move 131 scsi0 ceph"),
        "{}",
        moved.fix
    );
    let added = by(".app");
    assert!(
        added
            .message
            .contains("a `disk {}` block is added (`virtio1`)"),
        "{}",
        added.message
    );
    assert!(
        added.fix.contains("ignore_changes = [disk]"),
        "{}",
        added.fix
    );
    assert!(findings::has_errors(&findings));
    insta::assert_snapshot!(as_text(&findings));
    assert_silent("disk_grown");
}

#[test]
fn cpu_and_memory_changes_without_hotplug_wait_for_a_reboot() {
    let findings = lint_fixture("cpu_memory_without_hotplug");
    assert_eq!(
        fired(&findings),
        expect(&[("PVE019", "proxmox_virtual_environment_vm.k8s_w1")])
    );
    let text = as_text(&findings);
    assert!(text.contains("`cpu.cores` 2 → 4"), "{text}");
    assert!(text.contains("`memory.dedicated` 4096 → 8192"), "{text}");
    assert!(text.contains("`reboot_after_update`"), "{text}");
    assert!(text.contains("qm reboot 140"), "{text}");
    insta::assert_snapshot!(text);
    // CPU and memory hotplug on, NUMA on: the change is live.
    assert_silent("cpu_memory_hotplug");
}

#[test]
fn uefi_without_an_efi_disk_warns_with_the_block_to_add() {
    let findings = lint_fixture("ovmf_without_efi_disk");
    assert_eq!(
        fired(&findings),
        expect(&[("PVE020", "proxmox_virtual_environment_vm.win11")])
    );
    let text = as_text(&findings);
    assert!(text.contains("`bios = \"ovmf\"`"), "{text}");
    assert!(text.contains("efi_disk {"), "{text}");
    insta::assert_snapshot!(text);
    assert_silent("ovmf_with_efi_disk");
}

#[test]
fn names_that_are_not_dns_names_are_errors_with_proxmoxs_text() {
    let findings = lint_fixture("names_not_dns");
    assert_eq!(
        fired(&findings),
        expect(&[
            ("PVE022", "proxmox_virtual_environment_container.db"),
            ("PVE022", "proxmox_virtual_environment_vm.web_01"),
        ])
    );
    assert!(findings.iter().all(|f| f.severity == Severity::Error));
    let text = as_text(&findings);
    assert!(
        text.contains("`name: invalid format - value does not look like a valid DNS name`"),
        "{text}"
    );
    assert!(text.contains("`hostname: invalid format"), "{text}");
    assert!(text.contains("name = \"web-01\""), "{text}");
    assert!(text.contains("hostname = \"db-01.lab\""), "{text}");
    insta::assert_snapshot!(text);
    assert_silent("names_dns");
}

#[test]
fn one_vm_id_asked_for_twice_in_a_plan_is_an_error() {
    let findings = lint_fixture("vm_id_twice");
    assert_eq!(
        fired(&findings),
        expect(&[("PVE023", "proxmox_virtual_environment_vm.a")])
    );
    let text = as_text(&findings);
    assert!(
        text.contains("`proxmox_virtual_environment_vm.a` and `proxmox_virtual_environment_container.b` all ask for VM id 201"),
        "{text}"
    );
    assert!(
        text.contains("`unable to create VM 201 - VM 201 already exists on node"),
        "{text}"
    );
    insta::assert_snapshot!(text);
    assert_silent("vm_id_distinct");
}

#[test]
fn one_vm_id_in_two_roots_of_an_mr_is_an_error_in_both() {
    let lab = crate::support::fixtures::plan("bpg/vm_id_root_lab");
    let prod = crate::support::fixtures::plan("bpg/vm_id_root_prod");
    // Each root alone is fine.
    assert_eq!(lint::lint(&lab, &[]), vec![]);
    assert_eq!(lint::lint(&prod, &[]), vec![]);
    let roots = |prod_disabled: &[String]| {
        lint::cross_root(&[
            lint::RootPlan {
                name: "lab",
                plan: &lab,
                disabled: &[],
            },
            lint::RootPlan {
                name: "prod",
                plan: &prod,
                disabled: prod_disabled,
            },
        ])
    };
    let found = roots(&[]);
    assert_eq!(
        fired(&found[0]),
        expect(&[("PVE023", "proxmox_virtual_environment_vm.lab_db")])
    );
    assert_eq!(
        fired(&found[1]),
        expect(&[("PVE023", "proxmox_virtual_environment_vm.db")])
    );
    assert!(
        found[0][0]
            .message
            .contains("`proxmox_virtual_environment_vm.db` in root `prod`"),
        "{}",
        found[0][0].message
    );
    assert_eq!(found[0][0].severity, Severity::Error);
    insta::assert_snapshot!(format!(
        "root lab:\n{}\nroot prod:\n{}",
        as_text(&found[0]),
        as_text(&found[1])
    ));
    // A root that disables the rule gets nothing, the other still does.
    let found = roots(&["PVE023".to_string()]);
    assert_eq!(found[0].len(), 1);
    assert!(found[1].is_empty());
    // Distinct ids across roots: nothing.
    let found = lint::cross_root(&[
        lint::RootPlan {
            name: "lab",
            plan: &lab,
            disabled: &[],
        },
        lint::RootPlan {
            name: "other",
            plan: &crate::support::fixtures::plan("bpg/clones_one"),
            disabled: &[],
        },
    ]);
    assert!(found.iter().all(Vec::is_empty), "{found:?}");
}

/// A VNet created with a VM on it (bpg-shaped: `proxmox_virtual_environment_sdn_vnet` whose `id`
/// is the VNet's name), with or without an SDN applier in the same plan.
fn vnet_plan(with_applier: bool) -> planbot::core::plan::Plan {
    let provider = "registry.opentofu.org/bpg/proxmox";
    let mut changes = vec![
        serde_json::json!({
            "address": "proxmox_virtual_environment_sdn_vnet.lab10", "mode": "managed",
            "type": "proxmox_virtual_environment_sdn_vnet", "name": "lab10",
            "provider_name": provider,
            "change": {"actions": ["create"], "before": null,
                       "after": {"id": "lab10", "zone": "lab", "alias": null, "tag": null,
                                 "vlan_aware": false, "isolate_ports": false},
                       "after_unknown": {}}
        }),
        serde_json::json!({
            "address": "proxmox_virtual_environment_vm.app", "mode": "managed",
            "type": "proxmox_virtual_environment_vm", "name": "app",
            "provider_name": provider,
            "change": {"actions": ["create"], "before": null,
                       "after": {"name": "app", "node_name": "pve01", "vm_id": 310,
                                 "started": true, "bios": "seabios",
                                 "network_device": [{"bridge": "lab10", "enabled": true,
                                                     "model": "virtio"}],
                                 "disk": [{"datastore_id": "local-lvm", "size": 20,
                                           "interface": "virtio0"}]},
                       "after_unknown": {"id": true}}
        }),
    ];
    if with_applier {
        changes.push(serde_json::json!({
            "address": "proxmox_virtual_environment_sdn_applier.sdn", "mode": "managed",
            "type": "proxmox_virtual_environment_sdn_applier", "name": "sdn",
            "provider_name": provider,
            "change": {"actions": ["create"], "before": null, "after": {},
                       "after_unknown": {"id": true}}
        }));
    }
    let text =
        serde_json::json!({"format_version": "1.2", "resource_changes": changes}).to_string();
    planbot::core::plan::Plan::from_json(text.as_bytes()).unwrap()
}

#[test]
fn an_sdn_vnet_created_without_an_applier_warns_naming_the_vm_on_it() {
    let findings = lint::lint(&vnet_plan(false), &[]);
    assert_eq!(
        fired(&findings),
        expect(&[("PVE018", "proxmox_virtual_environment_sdn_vnet.lab10")]),
        "{}",
        as_text(&findings)
    );
    let f = &findings[0];
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.message.contains(
            "`proxmox_virtual_environment_sdn_vnet.lab10` changes the SDN configuration (VNet \
             `lab10`), but nothing in this plan applies it"
        ) && f.message.contains(
            "so `proxmox_virtual_environment_vm.app` cannot start on the new VNet \
             (`bridge 'lab10' does not exist`)"
        ),
        "{}",
        f.message
    );
    assert!(
        f.fix
            .contains("resource \"proxmox_virtual_environment_sdn_applier\" \"sdn\"")
            && f.fix
                .contains("replace_triggered_by = [proxmox_virtual_environment_sdn_vnet.lab10]")
            && f.fix.contains("pvesh set /cluster/sdn"),
        "{}",
        f.fix
    );
    // The healthy twin: an applier changes with it.
    let findings = lint::lint(&vnet_plan(true), &[]);
    assert_eq!(findings, vec![], "{}", as_text(&findings));
}
