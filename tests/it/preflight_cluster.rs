//! The cluster-aware preflight of issue 36 against the stateful fake Proxmox API (PVE 8.4 and
//! 9.x shapes): what a plan takes from the cluster (PVE108, the note's capacity table,
//! `data.planbot.capacity` for policies), and the read-only checks PVE109–PVE114.

use crate::support::fake_proxmox::{Cluster, FakeProxmox, NodeHardware, GIB};
use crate::support::world::PlanbotConfig;
use planbot::capabilities::proxmox::ProxmoxEndpoint;
use planbot::core::fingerprint::Fingerprint;
use planbot::core::policy::{evaluate_document_with, Outcome, PlanDocument, PolicyFile, PolicySet};
use planbot::core::proxmox::findings::{Finding, Severity};
use planbot::core::redact::Secrets;
use planbot::core::render::{render_note, NoteContext, RootOutcome, RootSection};
use planbot::flows::preflight::{for_plan, PlanPreflight};
use std::collections::BTreeMap;
use std::time::Duration;

const TOKEN: &str = "tofu@pve!plan";
const SECRET: &str = "6f1c1e0a-7a52-4d1e-9c55-0d5b3f2e9a41";

fn endpoint(fake: &FakeProxmox) -> ProxmoxEndpoint {
    let mut ep = ProxmoxEndpoint::new(&fake.url, format!("{TOKEN}={SECRET}"));
    ep.timeout = Duration::from_secs(5);
    ep
}

fn rules(findings: &[Finding]) -> Vec<(&str, Severity, &str)> {
    let mut v: Vec<_> = findings
        .iter()
        .map(|f| (f.rule, f.severity, f.address.as_str()))
        .collect();
    v.sort();
    v
}

/// The homelab cluster as PVE `version` with `pve01` short of memory (64 GiB, 52 used: 12 free)
/// and `local-lvm` short of space (100 GiB, 20 used: 80 free); the plan token is an auditor.
fn tight(version: &str) -> Cluster {
    let mut c = Cluster::homelab().token(TOKEN, SECRET, &[("/", "PVEAuditor")]);
    c.version = version.into();
    c.hardware.insert(
        "pve01".into(),
        NodeHardware {
            mem_total: 64 * GIB,
            mem_used: 52 * GIB,
            cpus: 16,
        },
    );
    let lvm = c.storages.iter_mut().find(|s| s.id == "local-lvm").unwrap();
    lvm.total = 100 * GIB;
    lvm.used = 20 * GIB;
    c
}

async fn preflight_of(fake: &FakeProxmox, fixture: &str) -> PlanPreflight {
    for_plan(
        Some(endpoint(fake)),
        &crate::support::fixtures::plan(fixture),
    )
    .await
}

/// The `**Capacity**` section of the note for `fixture` with `capacity` as the root's.
fn capacity_section(fixture: &str, pf: &PlanPreflight) -> String {
    let plan = crate::support::fixtures::plan(fixture);
    let fp =
        Fingerprint::from_hex("9c41e07a2b3d5f6a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c")
            .unwrap();
    let ctx = NoteContext {
        sha: Some("3f9a2c1e5b7d9f0a1c3e5b7d9f0a1c3e5b7d9f0a".into()),
        preflight_note: Some(pf.note.clone()),
        capacity: pf
            .capacity
            .clone()
            .map(|c| BTreeMap::from([("core".to_string(), c)]))
            .unwrap_or_default(),
        ..NoteContext::default()
    };
    let note = render_note(
        &ctx,
        &[RootSection {
            name: "core".into(),
            outcome: RootOutcome::Planned {
                plan: &plan,
                findings: &pf.findings,
                fingerprint: &fp,
            },
        }],
        &Secrets::from_plan(&plan).scrubber(),
    );
    let start = note
        .find("**Capacity**")
        .unwrap_or_else(|| panic!("no table in:\n{note}"));
    let rest = &note[start..];
    let end = rest
        .find("\n\n\n")
        .or_else(|| rest.find("\n\n<"))
        .unwrap_or(rest.len());
    // Every row of the table has six cells, like the note's other tables.
    for line in rest[..end].lines().filter(|l| l.starts_with('|')) {
        assert_eq!(line.matches('|').count(), 7, "{line}");
    }
    rest[..end].trim().to_string()
}

#[tokio::test]
async fn three_vms_on_a_node_and_storage_with_less_free_give_the_warning_and_the_table() {
    for version in ["8.4.1", "9.1.2"] {
        let fake = FakeProxmox::start(tight(version)).await;
        let pf = preflight_of(&fake, "bpg/capacity_three_vms").await;
        let pve108: Vec<&Finding> = pf.findings.iter().filter(|f| f.rule == "PVE108").collect();
        assert_eq!(pve108.len(), 2, "{version}: {:#?}", pf.findings);
        assert!(pve108.iter().all(|f| f.severity == Severity::Warning));
        let memory = pve108[0].message.as_str();
        assert!(
            memory.contains("takes 24 GiB of memory on node `pve01`"),
            "{version}: {memory}"
        );
        let disk = pve108[1].message.as_str();
        assert!(
            disk.contains("takes 120 GB on storage `local-lvm` (lvmthin) of node `pve01`")
                && disk.contains("80 GB is free now"),
            "{version}: {disk}"
        );
        assert!(
            disk.contains("`proxmox_virtual_environment_vm.web3`"),
            "{disk}"
        );
        let capacity = pf.capacity.clone().expect("a capacity report");
        assert_eq!(capacity.nodes[0].memory_adds_mib, 3 * 8192);
        assert_eq!(capacity.nodes[0].cores_adds, 12);
        assert_eq!(capacity.storages[0].disk_adds_gb, 120);
        // Read-only, one status call per node and per storage.
        let reqs = fake.requests();
        assert!(reqs.iter().all(|(m, _)| m == "GET"), "{reqs:?}");
        let status_calls: Vec<&String> = reqs
            .iter()
            .map(|(_, p)| p)
            .filter(|p| p.ends_with("/status"))
            .collect();
        assert_eq!(
            status_calls,
            vec![
                "/api2/json/nodes/pve01/status",
                "/api2/json/nodes/pve01/storage/local-lvm/status"
            ],
            "{version}"
        );
        let table = capacity_section("bpg/capacity_three_vms", &pf);
        let name = format!("capacity_table_pve{}", &version[..1]);
        insta::assert_snapshot!(name.as_str(), table);
    }
}

#[tokio::test]
async fn with_room_to_spare_there_is_a_table_and_no_warning() {
    let mut c = tight("8.4.1");
    c.hardware.get_mut("pve01").unwrap().mem_used = 8 * GIB;
    c.storages
        .iter_mut()
        .find(|s| s.id == "local-lvm")
        .unwrap()
        .total = 500 * GIB;
    let fake = FakeProxmox::start(c).await;
    let pf = preflight_of(&fake, "bpg/capacity_three_vms").await;
    assert_eq!(rules(&pf.findings), vec![], "{:#?}", pf.findings);
    let capacity = pf.capacity.expect("a capacity report");
    assert!(!capacity.nodes[0].exceeds && !capacity.storages[0].exceeds);
    assert_eq!(capacity.nodes[0].memory_free_mib, Some(56 * 1024));
}

#[tokio::test]
async fn a_token_that_may_not_read_a_nodes_status_gets_unknown_not_a_failure() {
    // Datastore.Audit only: the node's status is refused (403, as PVE words it).
    let mut c = tight("9.1.2");
    c.acls.clear();
    let c = c
        .role("StorageAudit", &["Datastore.Audit"])
        .user("tofu@pve", &[("/", "StorageAudit")]);
    let mut c = c;
    c.acls.push(crate::support::fake_proxmox::Acl {
        path: "/".into(),
        subject: crate::support::fake_proxmox::Subject::Token(TOKEN.into()),
        role: "StorageAudit".into(),
        propagate: true,
    });
    let fake = FakeProxmox::start(c).await;
    let pf = preflight_of(&fake, "bpg/capacity_three_vms").await;
    let capacity = pf.capacity.clone().expect("a capacity report");
    assert_eq!(capacity.nodes[0].memory_free_mib, None);
    assert_eq!(
        capacity.nodes[0].unknown.as_deref(),
        Some("Permission check failed (/nodes/pve01, Sys.Audit)")
    );
    // Only the disk warning: memory is unknown, which is not a finding and not a failure.
    assert_eq!(
        rules(&pf.findings)
            .into_iter()
            .filter(|(r, _, _)| *r != "PVE102")
            .collect::<Vec<_>>(),
        vec![("PVE108", Severity::Warning, "")],
        "{:#?}",
        pf.findings
    );
    let table = capacity_section("bpg/capacity_three_vms", &pf);
    assert!(
        table.contains("unknown: Permission check failed (/nodes/pve01, Sys.Audit)"),
        "{table}"
    );
}

const CAPACITY_POLICY: &str = r#"package main

import rego.v1

deny contains msg if {
	some n in data.planbot.capacity.nodes
	n.memory_adds_mib - n.memory_frees_mib > n.memory_free_mib
	msg := sprintf("node %s: the plan needs %d MiB, %d MiB are free", [n.node, n.memory_adds_mib - n.memory_frees_mib, n.memory_free_mib])
}

deny contains msg if {
	some s in data.planbot.capacity.storages
	s.exceeds
	msg := sprintf("storage %s is too small for %d guests", [s.storage, count(s.guests)])
}
"#;

#[tokio::test]
async fn a_policy_over_data_planbot_capacity_denies_the_plan() {
    let set = PolicySet {
        name: "capacity".into(),
        namespace: "main".into(),
        files: vec![PolicyFile {
            path: "capacity.rego".into(),
            text: CAPACITY_POLICY.into(),
        }],
        limit: Duration::from_secs(10),
    };
    let json = crate::support::fixtures::text("plans/bpg/capacity_three_vms.json");
    let doc = PlanDocument::read(&json).unwrap();
    let verdict_for = |pf: &PlanPreflight| {
        let data = pf.capacity.as_ref().map(|c| c.to_value());
        let verdict = evaluate_document_with(
            &doc,
            &pf.findings,
            "core",
            data.as_ref(),
            std::slice::from_ref(&set),
        );
        match &verdict.sets[0].outcome {
            Outcome::Checked(r) => r.failures.iter().map(|m| m.msg.clone()).collect::<Vec<_>>(),
            Outcome::Error(e) => panic!("{e}"),
        }
    };
    let fake = FakeProxmox::start(tight("8.4.1")).await;
    let denied = verdict_for(&preflight_of(&fake, "bpg/capacity_three_vms").await);
    assert_eq!(
        denied,
        vec![
            "node pve01: the plan needs 24576 MiB, 12288 MiB are free".to_string(),
            "storage local-lvm is too small for 3 guests".to_string(),
        ]
    );
    // The same plan on a cluster with room passes the same policy.
    let mut roomy = tight("8.4.1");
    roomy.hardware.get_mut("pve01").unwrap().mem_used = 8 * GIB;
    roomy
        .storages
        .iter_mut()
        .find(|s| s.id == "local-lvm")
        .unwrap()
        .total = 500 * GIB;
    let fake = FakeProxmox::start(roomy).await;
    assert_eq!(
        verdict_for(&preflight_of(&fake, "bpg/capacity_three_vms").await),
        Vec::<String>::new()
    );
}

// ---- PVE109: bridges, asked per bridge on the guest's node ----

/// The three-VM plan with `web3`'s NIC on `bridge`.
fn three_vms_with_web3_on(bridge: &str) -> planbot::core::plan::Plan {
    let mut v: serde_json::Value = serde_json::from_str(&crate::support::fixtures::text(
        "plans/bpg/capacity_three_vms.json",
    ))
    .unwrap();
    v["resource_changes"][2]["change"]["after"]["network_device"][0]["bridge"] = bridge.into();
    planbot::core::plan::Plan::from_json(v.to_string().as_bytes()).unwrap()
}

fn roomy(version: &str) -> Cluster {
    let mut c = tight(version);
    c.hardware.get_mut("pve01").unwrap().mem_used = 8 * GIB;
    c.storages
        .iter_mut()
        .find(|s| s.id == "local-lvm")
        .unwrap()
        .total = 500 * GIB;
    c
}

#[tokio::test]
async fn a_bridge_the_9_2_5_list_omits_is_found_by_asking_for_it() {
    let fake = FakeProxmox::start(roomy("9.2.5")).await;
    let pf = for_plan(Some(endpoint(&fake)), &three_vms_with_web3_on("vmbr0")).await;
    assert_eq!(rules(&pf.findings), vec![], "{:#?}", pf.findings);
    let reqs = fake.requests();
    assert!(
        reqs.iter()
            .any(|(_, p)| p == "/api2/json/nodes/pve01/network/vmbr0"),
        "{reqs:?}"
    );
}

#[tokio::test]
async fn a_bridge_missing_on_the_vms_node_is_an_error_naming_the_ones_it_has() {
    let mut c = roomy("8.4.1");
    c.bridges.insert(
        "pve01".into(),
        ["vmbr0".to_string(), "vmbr9".to_string()].into(),
    );
    let fake = FakeProxmox::start(c).await;
    let pf = for_plan(Some(endpoint(&fake)), &three_vms_with_web3_on("vmbr2")).await;
    assert_eq!(
        rules(&pf.findings),
        vec![(
            "PVE109",
            Severity::Error,
            "proxmox_virtual_environment_vm.web3"
        )],
        "{:#?}",
        pf.findings
    );
    let f = &pf.findings[0];
    assert_eq!(
        f.message,
        "`proxmox_virtual_environment_vm.web3` attaches a network device to bridge `vmbr2`, \
         which does not exist on node `pve01` (it has `vmbr0`, `vmbr9`): the guest is created \
         but cannot start (`bridge 'vmbr2' does not exist`)."
    );
    assert!(f.fix.contains("create `vmbr2` on `pve01`"), "{}", f.fix);
    // An applied SDN VNet of that name is a bridge on every node (that the plan token, an
    // auditor, may not use it is PVE114's business).
    fake.with(|c| c.vnets.insert("vmbr2".into()));
    let pf = for_plan(Some(endpoint(&fake)), &three_vms_with_web3_on("vmbr2")).await;
    assert!(
        !pf.findings.iter().any(|f| f.rule == "PVE109"),
        "{:#?}",
        pf.findings
    );
}

// ---- planbot preflight PLAN_JSON --config FILE ----

/// `dir/planbot.toml`: the operator's config (a GitLab the preflight never asks), then
/// `proxmox` (the `[proxmox]` tables).
fn write_config(dir: &std::path::Path, proxmox: &str) -> std::path::PathBuf {
    PlanbotConfig::deployed(
        "https://gitlab.example.com",
        "glpat-not-used-by-the-preflight-0000",
        dir,
    )
    .raw(proxmox)
    .write(dir)
}

fn pve_config(fake: &FakeProxmox) -> String {
    format!(
        "[proxmox]\nendpoint = \"{}\"\napi_token = \"root@pam!apply=aaaa-bbbb\"\n\n[proxmox.plan]\napi_token = \"{TOKEN}={SECRET}\"\n",
        fake.url
    )
}

async fn planbot_preflight(
    plan: &std::path::Path,
    config: &std::path::Path,
) -> std::process::Output {
    let (plan, config) = (plan.to_path_buf(), config.to_path_buf());
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_planbot"))
            .arg("preflight")
            .arg(&plan)
            .arg("--config")
            .arg(&config)
            .args(["--format", "json"])
            .env_remove("PROXMOX_VE_ENDPOINT")
            .env_remove("PROXMOX_VE_API_TOKEN")
            .env_remove("PM_VE_ENDPOINT")
            .env_remove("PM_VE_API_TOKEN")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn planbot_preflight_gives_the_services_findings_and_exits_by_severity() {
    let dir = tempfile::tempdir().unwrap();
    let plan_file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/plans/bpg/capacity_three_vms.json");
    let fake = FakeProxmox::start(tight("8.4.1")).await;
    let config = write_config(dir.path(), &pve_config(&fake));

    // Warnings only (capacity): exit 0, the same findings as the service's preflight.
    let out = planbot_preflight(&plan_file, &config).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let service = preflight_of(&fake, "bpg/capacity_three_vms").await;
    assert_eq!(printed, serde_json::to_value(&service.findings).unwrap());
    assert_eq!(printed.as_array().unwrap().len(), 2, "{stdout}");
    for f in printed.as_array().unwrap() {
        let mut keys: Vec<&String> = f.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["address", "fix", "message", "rule", "severity"]);
    }
    assert!(!stdout.contains(SECRET) && !stdout.contains("aaaa-bbbb"));

    // An error finding (no vmbr0 on pve01): exit 1.
    fake.with(|c| {
        c.bridges
            .insert("pve01".into(), ["vmbr9".to_string()].into())
    });
    let out = planbot_preflight(&plan_file, &config).await;
    assert_eq!(out.status.code(), Some(1));
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(printed
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["rule"] == "PVE109" && f["severity"] == "error"));

    // The API fails: exit 2, and the finding says why.
    fake.with(|c| {
        c.faults.insert(
            "/version".into(),
            crate::support::fake_proxmox::Fault::Status(500, "pveproxy is restarting".into()),
        )
    });
    let out = planbot_preflight(&plan_file, &config).await;
    assert_eq!(out.status.code(), Some(2));
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed[0]["rule"], "PVE101");

    // No endpoint in the config: exit 2, said on stderr.
    let bare = write_config(dir.path(), "");
    let out = planbot_preflight(&plan_file, &bare).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no Proxmox endpoint configured"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- PVE110: container feature flags other than nesting need root@pam ----

fn container(features: serde_json::Value) -> planbot::core::plan::Plan {
    let rc = serde_json::json!({
        "address": "proxmox_virtual_environment_container.docker", "mode": "managed",
        "type": "proxmox_virtual_environment_container", "name": "docker",
        "provider_name": "registry.opentofu.org/bpg/proxmox",
        "change": {"actions": ["create"], "before": null, "after": {
            "node_name": "pve01", "unprivileged": true, "started": true, "vm_id": 120,
            "cpu": [{"cores": 2}], "memory": [{"dedicated": 1024, "swap": 0}],
            "disk": [{"datastore_id": "local-lvm", "size": 8}],
            "network_interface": [{"name": "eth0", "bridge": "vmbr0", "enabled": true}],
            "features": [features]
        }, "after_unknown": {"id": true}}
    });
    let text = serde_json::json!({"format_version": "1.2", "resource_changes": [rc]}).to_string();
    planbot::core::plan::Plan::from_json(text.as_bytes()).unwrap()
}

#[tokio::test]
async fn keyctl_on_a_container_is_refused_to_any_token_and_nesting_is_not() {
    let fake = FakeProxmox::start(roomy("9.1.2")).await;
    let docker =
        container(serde_json::json!({"nesting": true, "keyctl": true, "fuse": false, "mount": []}));
    let pf = planbot::flows::preflight::for_plan_as(
        Some(endpoint(&fake)),
        Some("root@pam!tofu".into()),
        &docker,
    )
    .await;
    assert_eq!(
        rules(&pf.findings),
        vec![(
            "PVE110",
            Severity::Error,
            "proxmox_virtual_environment_container.docker"
        )],
        "{:#?}",
        pf.findings
    );
    let f = &pf.findings[0];
    assert!(
        f.message.contains("the apply acts as `root@pam!tofu`")
            && f.message
                .contains("`changing feature flags (except nesting) is only allowed for root@pam`"),
        "{}",
        f.message
    );
    assert!(
        f.fix
            .contains("pct set <vmid> --features nesting=1,keyctl=1"),
        "{}",
        f.fix
    );
    // The twins: nesting alone, or the root@pam user itself.
    let nesting = container(
        serde_json::json!({"nesting": true, "keyctl": false, "fuse": false, "mount": []}),
    );
    let pf = for_plan(Some(endpoint(&fake)), &nesting).await;
    assert_eq!(rules(&pf.findings), vec![], "{:#?}", pf.findings);
    let pf = planbot::flows::preflight::for_plan_as(
        Some(endpoint(&fake)),
        Some("root@pam".into()),
        &docker,
    )
    .await;
    assert_eq!(rules(&pf.findings), vec![], "{:#?}", pf.findings);
}

// ---- PVE111: a clone from a template on another node ----

/// The three-VM plan with `web1` a full clone of VM 8000 (with `clone.node_name` = `source`)
/// onto `pve02`, its disk on `storage`.
fn clone_of_8000(source: Option<&str>, storage: &str) -> planbot::core::plan::Plan {
    let mut v: serde_json::Value = serde_json::from_str(&crate::support::fixtures::text(
        "plans/bpg/capacity_three_vms.json",
    ))
    .unwrap();
    let after = &mut v["resource_changes"][0]["change"]["after"];
    after["node_name"] = "pve02".into();
    after["clone"] = serde_json::json!([{"vm_id": 8000, "node_name": source, "full": true,
                                          "datastore_id": null, "retries": 1}]);
    after["disk"][0]["datastore_id"] = storage.into();
    planbot::core::plan::Plan::from_json(v.to_string().as_bytes()).unwrap()
}

#[tokio::test]
async fn a_clone_from_a_template_on_another_node_needs_its_node_and_shared_storage() {
    let fake = FakeProxmox::start(roomy("8.4.1").guest(8000, "debian-12-tpl", "pve01", true)).await;
    let web1 = "proxmox_virtual_environment_vm.web1";
    let clone_findings = |pf: &PlanPreflight| -> Vec<Finding> {
        pf.findings
            .iter()
            .filter(|f| f.rule == "PVE111")
            .cloned()
            .collect()
    };
    // No clone.node_name: PVE looks for the template on pve02.
    let pf = for_plan(Some(endpoint(&fake)), &clone_of_8000(None, "nfs-images")).await;
    let f = clone_findings(&pf);
    assert_eq!(
        rules(&f),
        vec![("PVE111", Severity::Error, web1)],
        "{:#?}",
        pf.findings
    );
    assert!(
        f[0].message.contains(
            "clones VM 8000, which lives on `pve01`, onto `pve02` without `clone {} node_name`: \
             the apply fails with `unable to find configuration file for VM 8000 on node 'pve02'`"
        ),
        "{}",
        f[0].message
    );
    assert!(f[0].fix.contains("node_name = \"pve01\""), "{}", f[0].fix);
    // clone.node_name right, but the disk goes to local-lvm (not shared) on another node.
    let pf = for_plan(
        Some(endpoint(&fake)),
        &clone_of_8000(Some("pve01"), "local-lvm"),
    )
    .await;
    let f = clone_findings(&pf);
    assert_eq!(rules(&f), vec![("PVE111", Severity::Error, web1)]);
    assert!(
        f[0].message
            .contains("`Can't clone to non-shared storage 'local-lvm'`"),
        "{}",
        f[0].message
    );
    // The healthy twin: the template's node named, shared storage.
    let pf = for_plan(
        Some(endpoint(&fake)),
        &clone_of_8000(Some("pve01"), "nfs-images"),
    )
    .await;
    assert_eq!(clone_findings(&pf), vec![], "{:#?}", pf.findings);
    assert!(fake
        .requests()
        .iter()
        .any(|(_, p)| p == "/api2/json/cluster/resources?type=vm"));
}

// ---- PVE106 against /cluster/resources: every fixed id checked against one list ----

/// The three-VM plan (web1–3 created with the fixed ids 301–303 on pve01).
fn three_vms() -> planbot::core::plan::Plan {
    crate::support::fixtures::plan("bpg/capacity_three_vms")
}

fn nextid_calls(fake: &FakeProxmox) -> usize {
    fake.requests()
        .iter()
        .filter(|(_, p)| p.starts_with("/api2/json/cluster/nextid?vmid="))
        .count()
}

#[tokio::test]
async fn fixed_ids_are_checked_against_one_cluster_resources_read() {
    // 302 is a container the plan does not know, on pve02.
    let fake = FakeProxmox::start(roomy("9.1.2").container(302, "mqtt", "pve02")).await;
    let pf = for_plan(Some(endpoint(&fake)), &three_vms()).await;
    assert_eq!(
        rules(&pf.findings),
        vec![(
            "PVE106",
            Severity::Error,
            "proxmox_virtual_environment_vm.web2"
        )],
        "{:#?}",
        pf.findings
    );
    let f = &pf.findings[0];
    assert!(
        f.message.contains(
            "creates VM id 302, which the container `mqtt` on node `pve02` already has: the apply \
             fails with `CT 302 already exists on node 'pve02'`"
        ),
        "{}",
        f.message
    );
    assert!(f.fix.contains("vm_id = 101"), "{}", f.fix);
    // One read of the guests for the three ids, no per-id call.
    let reqs = fake.requests();
    let resources = reqs
        .iter()
        .filter(|(_, p)| p == "/api2/json/cluster/resources?type=vm")
        .count();
    assert_eq!((resources, nextid_calls(&fake)), (1, 0), "{reqs:?}");

    // The healthy twin: the container gone, every id free, still no per-id call.
    fake.with(|c| c.guests.retain(|g| g.vmid != 302));
    let pf = for_plan(Some(endpoint(&fake)), &three_vms()).await;
    assert_eq!(rules(&pf.findings), vec![], "{:#?}", pf.findings);
    assert_eq!(nextid_calls(&fake), 0);
}

#[tokio::test]
async fn an_id_taken_by_a_guest_the_token_cannot_see_is_still_found() {
    // The plan token may not audit VM 302 (NoAccess on /vms/302): the list does not show it, so
    // the list is not trusted for ids it does not show, and those are asked about one by one.
    let mut c = roomy("8.4.1").container(302, "mqtt", "pve02");
    c.acls.push(crate::support::fake_proxmox::Acl {
        path: "/vms/302".into(),
        subject: crate::support::fake_proxmox::Subject::Token(TOKEN.into()),
        role: "NoAccess".into(),
        propagate: true,
    });
    let fake = FakeProxmox::start(c).await;
    let pf = for_plan(Some(endpoint(&fake)), &three_vms()).await;
    assert_eq!(
        rules(&pf.findings),
        vec![(
            "PVE106",
            Severity::Error,
            "proxmox_virtual_environment_vm.web2"
        )],
        "{:#?}",
        pf.findings
    );
    assert!(
        pf.findings[0]
            .message
            .contains("which is taken (by a guest the token cannot see)"),
        "{}",
        pf.findings[0].message
    );
    // Only the id with an ACL of its own is asked about (the ACL list shows the rest are seen).
    assert_eq!(nextid_calls(&fake), 1);
}

#[tokio::test]
async fn a_clone_of_a_template_the_cluster_does_not_have_fails() {
    let fake = FakeProxmox::start(roomy("9.1.2")).await;
    let pf = for_plan(
        Some(endpoint(&fake)),
        &clone_of_8000(Some("pve01"), "nfs-images"),
    )
    .await;
    let f: Vec<&Finding> = pf.findings.iter().filter(|f| f.rule == "PVE111").collect();
    assert_eq!(f.len(), 1, "{:#?}", pf.findings);
    assert!(
        f[0].message.contains(
            "clones VM 8000, which the cluster does not have: the apply fails with \
             `unable to find configuration file for VM 8000 on node 'pve01'`"
        ),
        "{}",
        f[0].message
    );
    // A token that cannot see every guest does not judge a template it does not see.
    let mut c = roomy("9.1.2");
    c.acls.push(crate::support::fake_proxmox::Acl {
        path: "/vms/8000".into(),
        subject: crate::support::fake_proxmox::Subject::Token(TOKEN.into()),
        role: "NoAccess".into(),
        propagate: true,
    });
    let fake = FakeProxmox::start(c.guest(8000, "debian-12-tpl", "pve01", true)).await;
    let pf = for_plan(
        Some(endpoint(&fake)),
        &clone_of_8000(Some("pve01"), "nfs-images"),
    )
    .await;
    assert!(
        !pf.findings.iter().any(|f| f.rule == "PVE111"),
        "{:#?}",
        pf.findings
    );
}

// ---- PVE114: SDN VNets pending, and SDN.Use for the apply ----

#[tokio::test]
async fn a_vm_on_a_pending_vnet_or_on_one_the_apply_may_not_use_fails() {
    const APPLY: &str = "tofu@pve!apply";
    const WEB3: &str = "proxmox_virtual_environment_vm.web3";
    // The apply token may manage VMs but not use SDN; lab10 is created but never applied.
    let mut c = roomy("9.1.2").token_only(APPLY, "apply-secret", true, &[("/", "PVEVMAdmin")]);
    c.pending_vnets.insert("lab10".into());
    let fake = FakeProxmox::start(c).await;
    let plan = three_vms_with_web3_on("lab10");
    let run =
        || planbot::flows::preflight::for_plan_as(Some(endpoint(&fake)), Some(APPLY.into()), &plan);
    let pf = run().await;
    let f: Vec<Finding> = pf
        .findings
        .iter()
        .filter(|f| f.rule == "PVE114")
        .cloned()
        .collect();
    assert_eq!(
        rules(&f),
        vec![
            ("PVE114", Severity::Error, WEB3),
            ("PVE114", Severity::Error, WEB3)
        ],
        "{:#?}",
        pf.findings
    );
    let text: Vec<&str> = f.iter().map(|f| f.message.as_str()).collect();
    assert!(
        text.iter().any(|m| m.contains(
            "attaches to VNet `lab10`, which is pending in the SDN configuration (`new`: created \
             but never applied)"
        )),
        "{text:#?}"
    );
    let use_finding = f
        .iter()
        .find(|f| f.message.contains("lacks `SDN.Use`"))
        .expect("the SDN.Use finding");
    assert!(
        use_finding.message.contains(
            "the apply acts as `tofu@pve!apply`, which lacks `SDN.Use` on `/sdn/zones/lab/lab10`: \
             the apply fails with `403 Permission check failed (/sdn/zones/lab/lab10, SDN.Use)`"
        ),
        "{}",
        use_finding.message
    );
    // Paste the fix, apply the SDN configuration: nothing left.
    let fix = use_finding.fix.clone();
    fake.with(|c| {
        c.paste(&fix).unwrap();
        c.pending_vnets.clear();
        c.vnets.insert("lab10".into());
    });
    let pf = run().await;
    assert!(
        !pf.findings.iter().any(|f| f.rule == "PVE114"),
        "{:#?}",
        pf.findings
    );
    // A plan token that may not read the apply token's privileges (no Sys.Audit on /access):
    // the check says it could not run.
    fake.with(|c| {
        c.acls.push(crate::support::fake_proxmox::Acl {
            path: "/access".into(),
            subject: crate::support::fake_proxmox::Subject::Token(TOKEN.into()),
            role: "NoAccess".into(),
            propagate: true,
        })
    });
    let pf = run().await;
    let f: Vec<&Finding> = pf.findings.iter().filter(|f| f.rule == "PVE114").collect();
    assert_eq!(f.len(), 1, "{:#?}", pf.findings);
    assert_eq!(f[0].severity, Severity::Warning);
    assert!(
        f[0].message
            .contains("could not be checked: reading its privileges was refused")
            && f[0]
                .message
                .contains("Permission check failed (/access, Sys.Audit)"),
        "{}",
        f[0].message
    );
}

// ---- PVE112/PVE113: HA-managed guests and PVE 9's rules ----

/// `web1` (VM 105) moved in place from `pve01` to `pve02` (`migrate = true`), alone in the plan.
fn web1_moved_to(node: &str) -> planbot::core::plan::Plan {
    let mut v: serde_json::Value = serde_json::from_str(&crate::support::fixtures::text(
        "plans/bpg/capacity_three_vms.json",
    ))
    .unwrap();
    let changes = v["resource_changes"].as_array_mut().unwrap();
    changes.truncate(1);
    let rc = &mut changes[0]["change"];
    rc["actions"] = serde_json::json!(["update"]);
    rc["after"]["vm_id"] = 105.into();
    rc["after"]["migrate"] = true.into();
    let mut before = rc["after"].clone();
    before["node_name"] = "pve01".into();
    rc["before"] = before;
    rc["after"]["node_name"] = node.into();
    planbot::core::plan::Plan::from_json(v.to_string().as_bytes()).unwrap()
}

fn ha_findings(pf: &PlanPreflight) -> Vec<Finding> {
    pf.findings
        .iter()
        .filter(|f| f.rule == "PVE112" || f.rule == "PVE113")
        .cloned()
        .collect()
}

#[tokio::test]
async fn an_ha_managed_vm_moved_by_the_plan_must_go_through_ha_on_8_and_9() {
    const WEB1: &str = "proxmox_virtual_environment_vm.web1";
    for (version, kind, placement_read, other_read) in [
        (
            "8.4.1",
            "group",
            "/api2/json/cluster/ha/groups",
            "/api2/json/cluster/ha/rules",
        ),
        (
            "9.1.2",
            "rule",
            "/api2/json/cluster/ha/rules",
            "/api2/json/cluster/ha/groups",
        ),
    ] {
        let c = roomy(version)
            .guest(105, "web1", "pve01", false)
            .ha("vm:105", Some(("prod", &["pve01", "pve03"], true)));
        let fake = FakeProxmox::start(c).await;
        let pf = for_plan(Some(endpoint(&fake)), &web1_moved_to("pve02")).await;
        let f = ha_findings(&pf);
        assert_eq!(
            rules(&f),
            vec![("PVE112", Severity::Error, WEB1)],
            "{version}: {:#?}",
            pf.findings
        );
        assert!(
            f[0].message.contains(&format!(
                "moves from `pve01` to `pve02`, but it is an HA resource (`vm:105`) placed by HA \
                 {kind} `prod` (only on `pve01`, `pve03`)"
            )) && f[0]
                .message
                .contains("`Requesting HA migration for VM 105 to node pve02`")
                && f[0]
                    .message
                    .contains("HA will not run it on `pve02` at all"),
            "{version}: {}",
            f[0].message
        );
        assert!(
            f[0].fix.contains("ha-manager migrate vm:105 pve02")
                && f[0]
                    .fix
                    .contains("lifecycle { ignore_changes = [node_name] }"),
            "{}",
            f[0].fix
        );
        let reqs = fake.requests();
        let asked = |p: &str| reqs.iter().any(|(_, q)| q == p);
        assert!(asked("/api2/json/cluster/ha/resources") && asked(placement_read));
        assert!(!asked(other_read), "{version}: {reqs:?}");

        // Moved to a node the placement allows: still through HA, a warning.
        let pf = for_plan(Some(endpoint(&fake)), &web1_moved_to("pve03")).await;
        assert_eq!(
            rules(&ha_findings(&pf)),
            vec![("PVE112", Severity::Warning, WEB1)],
            "{version}"
        );
        // The healthy twin: not an HA resource.
        fake.with(|c| c.ha.clear());
        let pf = for_plan(Some(endpoint(&fake)), &web1_moved_to("pve02")).await;
        assert_eq!(ha_findings(&pf), vec![], "{version}");
    }
}

#[tokio::test]
async fn a_token_that_may_not_read_ha_gets_a_warning_that_the_check_could_not_run() {
    // Auditor on the nodes, storages and guests, but not on `/`: the HA reads are refused.
    let mut c = Cluster::homelab().token(
        TOKEN,
        SECRET,
        &[
            ("/nodes", "PVEAuditor"),
            ("/storage", "PVEAuditor"),
            ("/vms", "PVEAuditor"),
        ],
    );
    c.version = "9.1.2".into();
    let fake = FakeProxmox::start(c.ha("vm:105", None)).await;
    let pf = for_plan(Some(endpoint(&fake)), &web1_moved_to("pve02")).await;
    let f = ha_findings(&pf);
    assert_eq!(
        rules(&f),
        vec![(
            "PVE112",
            Severity::Warning,
            "proxmox_virtual_environment_vm.web1"
        )],
        "{:#?}",
        pf.findings
    );
    assert!(
        f[0].message
            .contains("could not be checked: reading `/cluster/ha/resources` was refused")
            && f[0]
                .message
                .contains("Permission check failed (/, Sys.Audit)"),
        "{}",
        f[0].message
    );
    assert!(
        f[0].fix
            .contains("pveum acl modify / --tokens 'tofu@pve!plan' --roles PVEAuditor"),
        "{}",
        f[0].fix
    );
}

#[tokio::test]
async fn an_ha_group_created_on_pve_9_gets_a_warning_and_on_8_none() {
    let group = |version: &str| {
        let _ = version;
        let rc = serde_json::json!({
            "address": "proxmox_virtual_environment_hagroup.prod", "mode": "managed",
            "type": "proxmox_virtual_environment_hagroup", "name": "prod",
            "provider_name": "registry.opentofu.org/bpg/proxmox",
            "change": {"actions": ["create"], "before": null,
                       "after": {"group": "prod", "nodes": {"pve01": 2, "pve02": 1},
                                 "restricted": true, "no_failback": false, "comment": null},
                       "after_unknown": {"id": true}}
        });
        let text =
            serde_json::json!({"format_version": "1.2", "resource_changes": [rc]}).to_string();
        planbot::core::plan::Plan::from_json(text.as_bytes()).unwrap()
    };
    let fake = FakeProxmox::start(roomy("9.1.2")).await;
    let pf = for_plan(Some(endpoint(&fake)), &group("9.1.2")).await;
    let f = ha_findings(&pf);
    assert_eq!(
        rules(&f),
        vec![(
            "PVE113",
            Severity::Warning,
            "proxmox_virtual_environment_hagroup.prod"
        )],
        "{:#?}",
        pf.findings
    );
    assert!(
        f[0].message
            .contains("Proxmox VE 9.1.2: since 9.0 HA groups are replaced by node-affinity rules"),
        "{}",
        f[0].message
    );
    assert!(f[0].fix.contains("proxmox_virtual_environment_harule"));
    let fake = FakeProxmox::start(roomy("8.4.1")).await;
    let pf = for_plan(Some(endpoint(&fake)), &group("8.4.1")).await;
    assert_eq!(ha_findings(&pf), vec![], "{:#?}", pf.findings);
}

// ---- After the apply: changes that wait for a reboot ----

#[tokio::test]
async fn after_the_apply_a_pending_cores_change_is_named_for_the_apply_note() {
    // The plan raised web1's cores 2 → 4 in place; the provider reported success but the VM runs
    // on with 2 until a reboot (bpg #2516).
    let mut v: serde_json::Value = serde_json::from_str(&crate::support::fixtures::text(
        "plans/bpg/capacity_three_vms.json",
    ))
    .unwrap();
    let rc = &mut v["resource_changes"][0]["change"];
    rc["actions"] = serde_json::json!(["update"]);
    let mut before = rc["after"].clone();
    before["cpu"][0]["cores"] = 2.into();
    rc["before"] = before;
    let plan = planbot::core::plan::Plan::from_json(v.to_string().as_bytes()).unwrap();
    let guests = planbot::core::proxmox::preflight::updated_guests(&plan);
    assert_eq!(guests.len(), 1, "{guests:?}");
    assert_eq!((guests[0].vmid, guests[0].kind), (301, "qemu"));

    let mut c = roomy("9.1.2").guest(301, "web1", "pve01", false);
    let web1 = c.guests.iter_mut().find(|g| g.vmid == 301).unwrap();
    web1.pending.insert("cores".into(), 4.into());
    web1.pending
        .insert("cipassword".into(), "s3cr3t-hash".into());
    let fake = FakeProxmox::start(c).await;
    let note = planbot::flows::preflight::pending_after_apply(Some(endpoint(&fake)), &guests)
        .await
        .expect("a change waits");
    assert!(
        note.starts_with("proxmox_virtual_environment_vm.web1 waits for a reboot to apply ")
            && note.contains("cores 2 → 4"),
        "{note}"
    );
    assert!(
        note.contains("cipassword (unset) → (hidden)") && !note.contains("s3cr3t"),
        "{note}"
    );
    assert!(fake.requests().iter().all(|(m, _)| m == "GET"));

    // Nothing pending: nothing to say.
    fake.with(|c| c.guests.iter_mut().for_each(|g| g.pending.clear()));
    assert_eq!(
        planbot::flows::preflight::pending_after_apply(Some(endpoint(&fake)), &guests).await,
        None
    );
    // A read that fails says so, instead of staying silent.
    fake.with(|c| c.guests.clear());
    let note = planbot::flows::preflight::pending_after_apply(Some(endpoint(&fake)), &guests)
        .await
        .expect("a failed read is said");
    assert!(note.contains("could not be read"), "{note}");
}
