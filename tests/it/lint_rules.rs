//! The Proxmox plan lint rules against bpg-shaped `show -json` fixtures: each rule fires
//! exactly where the catalogue says, stays silent otherwise, and tells the user what to paste.

use planbot::core::findings::{self, Facts, Finding, Severity};
use planbot::core::lint;

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
