//! The live Proxmox preflight (PVE101–PVE107) against the stateful fake API: each check fires
//! exactly when the catalogue says, with commands a user can paste, and only GETs are sent.

use crate::support::fake_proxmox::{Cluster, FakeProxmox, Fault};
use planbot::capabilities::proxmox::{Proxmox, ProxmoxEndpoint, ProxmoxError};
use planbot::core::plan::Plan;
use planbot::core::proxmox::findings::{Finding, Severity};
use planbot::core::proxmox::preflight;
use planbot::flows::preflight::preflight;
use std::time::Duration;

const TOKEN: &str = "tofu@pve!plan";
const SECRET: &str = "6f1c1e0a-7a52-4d1e-9c55-0d5b3f2e9a41";

fn client(fake: &FakeProxmox) -> Proxmox {
    let mut ep = ProxmoxEndpoint::new(&fake.url, format!("{TOKEN}={SECRET}"));
    ep.timeout = Duration::from_secs(5);
    Proxmox::new(ep).unwrap()
}

fn rules(findings: &[Finding]) -> Vec<(&str, &str)> {
    let mut v: Vec<(&str, &str)> = findings
        .iter()
        .map(|f| (f.rule, f.address.as_str()))
        .collect();
    v.sort();
    v
}

fn text(findings: &[Finding]) -> String {
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

/// The preflight of the plan fixture `name` against `fake`, as the plan flow runs it.
async fn preflight_of(fake: &FakeProxmox, name: &str) -> Vec<Finding> {
    preflight(&client(fake), &crate::support::fixtures::plan(name))
        .await
        .unwrap()
}

/// The homelab cluster with `local` allowing `import` (so only privileges are in question).
fn with_import() -> Cluster {
    let mut c = Cluster::homelab();
    c.storages[0].content.push("import".into());
    c
}

const DEBIAN: &str = "proxmox_virtual_environment_download_file.debian";

#[tokio::test]
async fn a_storage_without_import_gets_the_full_pvesm_command() {
    let fake =
        FakeProxmox::start(Cluster::homelab().token(TOKEN, SECRET, &[("/", "Administrator")]))
            .await;
    let findings = preflight_of(&fake, "bpg/seed_debian_qcow2_import").await;
    assert_eq!(
        rules(&findings),
        vec![("PVE103", DEBIAN)],
        "{}",
        text(&findings)
    );
    let f = &findings[0];
    assert!(f
        .message
        .contains("storage 'local' is not configured for content-type 'import'"));
    assert!(
        f.fix
            .contains("pvesm set local --content iso,vztmpl,backup,import"),
        "{}",
        f.fix
    );
    // Read-only: every request was a GET, and each permission path was asked once.
    let reqs = fake.requests();
    assert!(reqs.iter().all(|(m, _)| m == "GET"), "{reqs:?}");
    let perms: Vec<&String> = reqs
        .iter()
        .map(|(_, p)| p)
        .filter(|p| p.contains("/access/permissions"))
        .collect();
    let unique: std::collections::BTreeSet<&&String> = perms.iter().collect();
    assert_eq!(perms.len(), unique.len(), "{perms:?}");
    assert!(perms.iter().any(|p| p.ends_with("path=%2F")), "{perms:?}");
    assert!(
        perms.iter().any(|p| p.ends_with("path=%2Fnodes%2Fpve01")),
        "{perms:?}"
    );
    assert!(
        perms.iter().any(|p| p.ends_with("path=%2Fstorage%2Flocal")),
        "{perms:?}"
    );
}

#[tokio::test]
async fn pveadmin_alone_cannot_download() {
    let fake = FakeProxmox::start(with_import().token(TOKEN, SECRET, &[("/", "PVEAdmin")])).await;
    let findings = preflight_of(&fake, "bpg/seed_debian_qcow2_import").await;
    assert_eq!(
        rules(&findings),
        vec![("PVE104", DEBIAN)],
        "{}",
        text(&findings)
    );
    let f = &findings[0];
    assert!(
        f.message
            .contains("lacks `Sys.Modify on / (or Sys.AccessNetwork on /nodes/pve01)`"),
        "{}",
        f.message
    );
    assert!(f
        .fix
        .contains("pveum role add PlanbotDownload --privs 'Sys.Audit,Sys.Modify'"));
    assert!(f
        .fix
        .contains("pveum acl modify / --tokens 'tofu@pve!plan' --roles PlanbotDownload"));
    assert!(!f.fix.contains(SECRET) && !f.message.contains(SECRET));
    insta::assert_snapshot!(text(&findings));
}

#[tokio::test]
async fn pveadmin_plus_pvesysadmin_still_lacks_sys_modify() {
    let fake = FakeProxmox::start(with_import().token(
        TOKEN,
        SECRET,
        &[("/", "PVEAdmin"), ("/", "PVESysAdmin")],
    ))
    .await;
    let findings = preflight_of(&fake, "bpg/seed_debian_qcow2_import").await;
    assert_eq!(rules(&findings), vec![("PVE104", DEBIAN)]);
}

#[tokio::test]
async fn a_custom_role_with_sys_modify_can_download() {
    let fake = FakeProxmox::start(
        with_import()
            .role("PlanbotDownload", &["Sys.Audit", "Sys.Modify"])
            .token(
                TOKEN,
                SECRET,
                &[("/", "PVEAdmin"), ("/", "PlanbotDownload")],
            ),
    )
    .await;
    let findings = preflight_of(&fake, "bpg/seed_debian_qcow2_import").await;
    assert_eq!(findings, vec![], "{}", text(&findings));
}

#[tokio::test]
async fn sys_access_network_on_the_node_is_the_narrow_alternative() {
    let fake = FakeProxmox::start(
        with_import()
            .role("NetDownload", &["Sys.AccessNetwork"])
            .token(
                TOKEN,
                SECRET,
                &[("/", "PVEAdmin"), ("/nodes/pve01", "NetDownload")],
            ),
    )
    .await;
    let findings = preflight_of(&fake, "bpg/seed_debian_qcow2_import").await;
    assert_eq!(findings, vec![], "{}", text(&findings));
}

#[tokio::test]
async fn a_node_level_acl_replaces_the_root_one() {
    // Sys.AccessNetwork granted on / would propagate to the node, but the node's own ACL
    // (PVEAuditor) replaces it there: the privileges do not add up.
    let fake = FakeProxmox::start(
        with_import()
            .role("NetDownload", &["Sys.AccessNetwork"])
            .token(
                TOKEN,
                SECRET,
                &[
                    ("/", "PVEAdmin"),
                    ("/", "NetDownload"),
                    ("/nodes/pve01", "PVEAuditor"),
                ],
            ),
    )
    .await;
    let findings = preflight_of(&fake, "bpg/seed_debian_qcow2_import").await;
    assert_eq!(
        rules(&findings),
        vec![("PVE104", DEBIAN)],
        "{}",
        text(&findings)
    );

    // Without the node's own ACL, the root grant reaches the node again.
    fake.with(|c| c.acls.retain(|a| a.path != "/nodes/pve01"));
    let findings = preflight_of(&fake, "bpg/seed_debian_qcow2_import").await;
    assert_eq!(findings, vec![]);
}

#[tokio::test]
async fn a_storage_acl_without_allocate_template_blocks_the_download() {
    let fake = FakeProxmox::start(
        with_import()
            .role("PlanbotDownload", &["Sys.Audit", "Sys.Modify"])
            .token(
                TOKEN,
                SECRET,
                &[
                    ("/", "PVEAdmin"),
                    ("/", "PlanbotDownload"),
                    ("/storage/local", "PVEDatastoreUser"),
                ],
            ),
    )
    .await;
    let findings = preflight_of(&fake, "bpg/seed_debian_qcow2_import").await;
    assert_eq!(
        rules(&findings),
        vec![("PVE104", DEBIAN)],
        "{}",
        text(&findings)
    );
    assert!(findings[0].fix.contains(
        "pveum acl modify /storage/local --tokens 'tofu@pve!plan' --roles PlanbotTemplates"
    ));
    assert!(
        !findings[0].fix.contains("PlanbotDownload"),
        "root privileges are fine: {}",
        findings[0].fix
    );
}

#[tokio::test]
async fn guests_nodes_storages_snippets_and_sys_modify() {
    let fake = FakeProxmox::start(Cluster::homelab().token(
        TOKEN,
        SECRET,
        &[("/", "PVEAdmin"), ("/storage/local", "PVEDatastoreUser")],
    ))
    .await;
    let findings = preflight_of(&fake, "bpg/preflight_guests").await;
    assert_eq!(
        rules(&findings),
        vec![
            ("PVE102", "proxmox_virtual_environment_vm.ghost"),
            ("PVE103", "proxmox_virtual_environment_file.dns_user_data"),
            ("PVE103", "proxmox_virtual_environment_vm.ghost"),
            ("PVE105", "proxmox_virtual_environment_file.dns_user_data"),
            ("PVE106", "proxmox_virtual_environment_vm.dns"),
            ("PVE107", "proxmox_virtual_environment_container.mqtt"),
            ("PVE107", "proxmox_virtual_environment_vm.ordered"),
        ],
        "{}",
        text(&findings)
    );
    let t = text(&findings);
    assert!(
        t.contains("uses node `pve03`, which the cluster does not have (nodes: pve01, pve02)"),
        "{t}"
    );
    assert!(
        t.contains("pvesm set local --content iso,vztmpl,backup,snippets"),
        "{t}"
    );
    assert!(
        t.contains("storage `ceph-fast`, which does not exist"),
        "{t}"
    );
    assert!(
        t.contains(
            "VM id 100, which the VM `dns-old` on node `pve01` already has: the apply fails with \
             `VM 100 already exists on node 'pve01'`"
        ),
        "{t}"
    );
    assert!(t.contains("vm_id = 101"), "{t}");
    insta::assert_snapshot!(t);

    // The fake keeps state: once VM 100 is gone, its id is free.
    fake.with(|c| c.guests.retain(|g| g.vmid != 100));
    let findings = preflight_of(&fake, "bpg/preflight_guests").await;
    assert!(!findings.iter().any(|f| f.rule == "PVE106"));
}

#[tokio::test]
async fn an_old_release_without_message_bodies_still_answers_each_check() {
    let mut cluster = with_import().token(TOKEN, SECRET, &[("/", "Administrator")]);
    cluster.version = "8.2.4".into();
    cluster.old_release = true;
    let fake = FakeProxmox::start(cluster).await;
    let findings = preflight_of(&fake, "bpg/seed_debian_qcow2_import").await;
    assert_eq!(
        rules(&findings),
        vec![("PVE101", DEBIAN)],
        "{}",
        text(&findings)
    );
    assert!(findings[0]
        .message
        .contains("Proxmox VE 8.2.4 cannot import"));
    // The taken id is found from the status line alone.
    let findings = preflight_of(&fake, "bpg/preflight_guests").await;
    assert!(
        findings.iter().any(|f| f.rule == "PVE106"),
        "{}",
        text(&findings)
    );
    let err = client(&fake).next_id(100).await;
    assert!(matches!(err, Ok(false)));
}

#[tokio::test]
async fn errors_read_the_message_or_the_status_line() {
    let fake =
        FakeProxmox::start(Cluster::homelab().token(TOKEN, SECRET, &[("/", "PVEAdmin")])).await;
    let err = client(&fake).node_storage("pve09").await.unwrap_err();
    assert!(matches!(err, ProxmoxError::Status { code: 500, .. }));
    assert!(
        err.to_string().contains("hostname lookup 'pve09' failed"),
        "{err}"
    );
    fake.with(|c| c.old_release = true);
    let err = client(&fake).node_storage("pve09").await.unwrap_err();
    // Only the reason phrase carries the text now.
    assert!(
        err.to_string()
            .contains("500 hostname lookup 'pve09' failed"),
        "{err}"
    );
}

#[tokio::test]
async fn a_wrong_token_is_a_slow_401_reported_without_the_secret() {
    let mut cluster = Cluster::homelab().token(TOKEN, "the-right-secret", &[("/", "PVEAdmin")]);
    cluster.unauthorized_delay = Duration::from_millis(300);
    let fake = FakeProxmox::start(cluster).await;
    let findings = preflight_of(&fake, "bpg/seed_debian_qcow2_import").await;
    assert_eq!(rules(&findings), vec![("PVE101", "")]);
    assert_eq!(findings[0].severity, Severity::Error);
    let t = text(&findings);
    assert!(
        t.contains("refused the token tofu@pve!plan (401 invalid token value!)"),
        "{t}"
    );
    assert!(!t.contains(SECRET));
}

#[tokio::test]
async fn a_timeout_is_a_finding_not_a_hang() {
    let mut cluster = Cluster::homelab();
    cluster.unauthorized_delay = Duration::from_secs(3);
    let fake = FakeProxmox::start(cluster).await;
    let mut ep = ProxmoxEndpoint::new(&fake.url, format!("{TOKEN}={SECRET}"));
    ep.timeout = Duration::from_millis(300);
    let findings = preflight(
        &Proxmox::new(ep).unwrap(),
        &crate::support::fixtures::plan("bpg/seed_debian_qcow2_import"),
    )
    .await
    .unwrap();
    assert_eq!(rules(&findings), vec![("PVE101", "")]);
    assert!(
        findings[0].message.contains("timed out"),
        "{}",
        findings[0].message
    );
}

#[tokio::test]
async fn an_apply_is_refused_naming_the_finding() {
    let fake = FakeProxmox::start(with_import().token(TOKEN, SECRET, &[("/", "PVEAdmin")])).await;
    let findings = preflight_of(&fake, "bpg/seed_debian_qcow2_import").await;
    let why = preflight::apply_refusal(&findings).unwrap();
    assert!(
        why.starts_with(&format!("Proxmox preflight PVE104 on {DEBIAN}: ")),
        "{why}"
    );
    assert!(why.contains("pveum role add PlanbotDownload"));
    assert_eq!(preflight::apply_refusal(&[]), None);
    assert!(preflight::skipped_note().contains("Proxmox preflight skipped"));
}

#[tokio::test]
async fn a_plan_without_proxmox_resources_only_asks_for_the_version() {
    let fake =
        FakeProxmox::start(Cluster::homelab().token(TOKEN, SECRET, &[("/", "PVEAuditor")])).await;
    let findings = preflight_of(&fake, "bpg/other_provider").await;
    assert_eq!(findings, vec![]);
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn the_plan_flow_helper_says_when_it_skipped_and_the_apply_helper_refuses() {
    let plan = crate::support::fixtures::plan("bpg/seed_debian_qcow2_import");
    let skipped = planbot::flows::preflight::for_plan(None, &plan).await;
    assert!(skipped.findings.is_empty());
    assert!(skipped
        .note
        .starts_with("Proxmox preflight skipped: no Proxmox endpoint configured"));
    assert!(planbot::flows::preflight::before_apply(None, &plan)
        .await
        .is_ok());

    let fake = FakeProxmox::start(with_import().token(TOKEN, SECRET, &[("/", "PVEAdmin")])).await;
    let ep = || ProxmoxEndpoint::new(&fake.url, format!("{TOKEN}={SECRET}"));
    let ran = planbot::flows::preflight::for_plan(Some(ep()), &plan).await;
    assert_eq!(rules(&ran.findings), vec![("PVE104", DEBIAN)]);
    assert!(
        ran.note.contains(&format!("as `{TOKEN}`: 1 finding")),
        "{}",
        ran.note
    );
    assert!(ran.lint_facts.shared_storages.contains("nfs-images"));
    let refused = planbot::flows::preflight::before_apply(Some(ep()), &plan)
        .await
        .unwrap_err();
    assert!(
        refused.starts_with(&format!("Proxmox preflight PVE104 on {DEBIAN}")),
        "{refused}"
    );
    assert!(!refused.contains(SECRET));
}

// ---- Fail closed: a preflight that cannot read what it needs refuses the apply. ----

/// The plan flow's note line and findings, and the apply's answer, for `plan` against `fake`.
async fn plan_and_apply(
    fake: &FakeProxmox,
    plan: &Plan,
) -> (
    planbot::flows::preflight::PlanPreflight,
    Result<Vec<Finding>, String>,
) {
    let ep = || {
        let mut ep = ProxmoxEndpoint::new(&fake.url, format!("{TOKEN}={SECRET}"));
        ep.timeout = Duration::from_millis(500);
        ep
    };
    let planned = planbot::flows::preflight::for_plan(Some(ep()), plan).await;
    let applied = planbot::flows::preflight::before_apply(Some(ep()), plan).await;
    (planned, applied)
}

#[tokio::test]
async fn a_5xx_on_a_read_the_checks_need_refuses_the_apply_and_the_note_says_so() {
    let fake =
        FakeProxmox::start(with_import().token(TOKEN, SECRET, &[("/", "Administrator")])).await;
    let plan = crate::support::fixtures::plan("bpg/seed_debian_qcow2_import");
    // All is well first: the apply may go ahead.
    let (planned, applied) = plan_and_apply(&fake, &plan).await;
    assert_eq!(planned.findings, vec![], "{}", text(&planned.findings));
    assert!(applied.is_ok());

    // pmxcfs hiccup: the storage configuration cannot be read.
    fake.with(|c| {
        c.faults.insert(
            "/storage".into(),
            Fault::Status(
                500,
                "cfs-lock 'file-storage_cfg' error: got lock timeout".into(),
            ),
        )
    });
    let (planned, applied) = plan_and_apply(&fake, &plan).await;
    assert_eq!(rules(&planned.findings), vec![("PVE101", "")]);
    assert_eq!(planned.findings[0].severity, Severity::Error);
    assert!(
        planned
            .note
            .contains(&format!("as `{TOKEN}` could not run: "))
            && planned.note.contains("got lock timeout")
            && planned.note.contains("The apply is refused until it runs."),
        "{}",
        planned.note
    );
    let why = applied.unwrap_err();
    assert!(
        why.starts_with("Proxmox preflight PVE101: The Proxmox preflight could not run: ")
            && why.contains("500 cfs-lock 'file-storage_cfg' error: got lock timeout"),
        "{why}"
    );
    assert!(!why.contains(SECRET) && !planned.note.contains(SECRET));
}

#[tokio::test]
async fn a_permission_read_that_times_out_refuses_the_apply() {
    let fake =
        FakeProxmox::start(with_import().token(TOKEN, SECRET, &[("/", "Administrator")])).await;
    fake.with(|c| c.faults.insert("/access/permissions".into(), Fault::Hang));
    let plan = crate::support::fixtures::plan("bpg/seed_debian_qcow2_import");
    let (planned, applied) = plan_and_apply(&fake, &plan).await;
    assert_eq!(rules(&planned.findings), vec![("PVE101", "")]);
    assert!(planned.note.contains("could not run: "), "{}", planned.note);
    assert!(planned.note.contains("timed out"), "{}", planned.note);
    let why = applied.unwrap_err();
    assert!(why.contains("timed out"), "{why}");
}

#[tokio::test]
async fn an_offline_node_the_plan_uses_refuses_the_apply() {
    let fake =
        FakeProxmox::start(with_import().token(TOKEN, SECRET, &[("/", "Administrator")])).await;
    fake.with(|c| c.nodes.insert("pve01".into(), "offline".into()));
    let plan = crate::support::fixtures::plan("bpg/seed_debian_qcow2_import");
    let (planned, applied) = plan_and_apply(&fake, &plan).await;
    assert_eq!(
        rules(&planned.findings),
        vec![
            ("PVE102", DEBIAN),
            ("PVE102", "proxmox_virtual_environment_vm.web")
        ]
    );
    assert!(planned
        .findings
        .iter()
        .all(|f| f.severity == Severity::Error));
    assert!(
        planned.findings[0]
            .message
            .contains("runs on node `pve01`, which is offline"),
        "{}",
        planned.findings[0].message
    );
    let why = applied.unwrap_err();
    assert!(
        why.starts_with(&format!("Proxmox preflight PVE102 on {DEBIAN}")),
        "{why}"
    );
    // The node's storages were not asked for (the call would fail: 595 from the proxy).
    assert!(!fake
        .requests()
        .iter()
        .any(|(_, p)| p.contains("/nodes/pve01/storage")));
    let err = client(&fake).node_storage("pve01").await.unwrap_err();
    assert!(err.to_string().contains("595"), "{err}");

    // Another node offline is none of this plan's business.
    fake.with(|c| {
        c.nodes.insert("pve01".into(), "online".into());
        c.nodes.insert("pve02".into(), "offline".into());
    });
    let (planned, applied) = plan_and_apply(&fake, &plan).await;
    assert_eq!(planned.findings, vec![], "{}", text(&planned.findings));
    assert!(applied.is_ok());
}

// ---- PVE's permission model: what the token really has, and fixes pasted as printed. ----

const USER: &str = "tofu@pve";

/// Paste every fix of `findings` into the cluster as a user would on a node (the same fix
/// block once).
fn paste_fixes(fake: &FakeProxmox, findings: &[Finding]) {
    let mut pasted = std::collections::BTreeSet::new();
    for f in findings.iter().filter(|f| pasted.insert(f.fix.clone())) {
        fake.with(|c| c.paste(&f.fix))
            .unwrap_or_else(|e| panic!("the fix of {} does not run: {e}\n{}", f.rule, f.fix));
    }
}

#[tokio::test]
async fn seed_pveadmin_and_pvesysadmin_lack_sys_modify_and_the_pasted_fix_works() {
    // The seed case: user and privilege-separated token both hold PVEAdmin + PVESysAdmin on /.
    let grants = [("/", "PVEAdmin"), ("/", "PVESysAdmin")];
    let fake = FakeProxmox::start(
        with_import()
            .user(USER, &grants)
            .token_only(TOKEN, SECRET, true, &grants),
    )
    .await;
    let plan = crate::support::fixtures::plan("bpg/seed_debian_qcow2_import");
    let findings = preflight(&client(&fake), &plan).await.unwrap();
    assert_eq!(
        rules(&findings),
        vec![("PVE104", DEBIAN)],
        "{}",
        text(&findings)
    );
    assert!(
        findings[0]
            .message
            .contains("lacks `Sys.Modify on / (or Sys.AccessNetwork on /nodes/pve01)`"),
        "{}",
        findings[0].message
    );
    paste_fixes(&fake, &findings);
    let after = preflight(&client(&fake), &plan).await.unwrap();
    assert_eq!(after, vec![], "after pasting:\n{}", text(&after));
}

#[tokio::test]
async fn a_privilege_separated_token_gets_only_what_its_user_also_has() {
    // The token's own ACL says Administrator, its user only PVEAdmin: no Sys.Modify.
    let fake = FakeProxmox::start(with_import().user(USER, &[("/", "PVEAdmin")]).token_only(
        TOKEN,
        SECRET,
        true,
        &[("/", "Administrator")],
    ))
    .await;
    let plan = crate::support::fixtures::plan("bpg/seed_debian_qcow2_import");
    let findings = preflight(&client(&fake), &plan).await.unwrap();
    assert_eq!(
        rules(&findings),
        vec![("PVE104", DEBIAN)],
        "{}",
        text(&findings)
    );

    // Granting the token alone (the fix without its --users line) changes nothing.
    let token_only: String = findings[0]
        .fix
        .lines()
        .filter(|l| !l.contains("--users"))
        .collect::<Vec<_>>()
        .join("\n");
    fake.with(|c| c.paste(&token_only)).unwrap();
    let still = preflight(&client(&fake), &plan).await.unwrap();
    assert_eq!(rules(&still), vec![("PVE104", DEBIAN)]);

    // The whole fix does it.
    fake.with(|c| c.acls.retain(|a| a.role != "PlanbotDownload"));
    fake.with(|c| c.roles.remove("PlanbotDownload"));
    paste_fixes(&fake, &findings);
    assert_eq!(preflight(&client(&fake), &plan).await.unwrap(), vec![]);
}

#[tokio::test]
async fn a_token_without_privilege_separation_has_exactly_its_users_privileges() {
    // No ACL on the token at all; the user holds Administrator through a group.
    let fake = FakeProxmox::start(
        with_import()
            .group("automation", &[USER], &[("/", "Administrator")])
            .token_only(TOKEN, SECRET, false, &[]),
    )
    .await;
    let plan = crate::support::fixtures::plan("bpg/seed_debian_qcow2_import");
    assert_eq!(preflight(&client(&fake), &plan).await.unwrap(), vec![]);

    // The user's own ACL on / replaces its groups' ACLs there: PVEAdmin only.
    fake.with(|c| {
        *c = c.clone().user(USER, &[("/", "PVEAdmin")]);
    });
    let findings = preflight(&client(&fake), &plan).await.unwrap();
    assert_eq!(
        rules(&findings),
        vec![("PVE104", DEBIAN)],
        "{}",
        text(&findings)
    );
    // The fix's token ACL would be ignored for this token, its user ACL is what counts.
    paste_fixes(&fake, &findings);
    assert_eq!(preflight(&client(&fake), &plan).await.unwrap(), vec![]);
}

#[tokio::test]
async fn propagate_0_and_no_access_are_honoured() {
    let fake = FakeProxmox::start(
        with_import()
            .role("PlanbotDownload", &["Sys.Audit", "Sys.Modify"])
            .token(
                TOKEN,
                SECRET,
                &[("/", "PVEAdmin"), ("/", "PlanbotDownload")],
            ),
    )
    .await;
    let plan = crate::support::fixtures::plan("bpg/seed_debian_qcow2_import");
    assert_eq!(preflight(&client(&fake), &plan).await.unwrap(), vec![]);

    // PVEAdmin on / no longer propagates: /storage/local has nothing.
    fake.with(|c| {
        for a in c.acls.iter_mut().filter(|a| a.role == "PVEAdmin") {
            a.propagate = false;
        }
    });
    let findings = preflight(&client(&fake), &plan).await.unwrap();
    let web = "proxmox_virtual_environment_vm.web";
    assert_eq!(
        rules(&findings),
        vec![("PVE103", DEBIAN), ("PVE103", web), ("PVE104", DEBIAN)],
        "{}",
        text(&findings)
    );
    assert!(
        findings[0]
            .message
            .contains("which the token `tofu@pve!plan` cannot see"),
        "{}",
        findings[0].message
    );
    // The root grant (PlanbotDownload) still propagates: only the storage is asked for.
    assert!(
        !findings[2].fix.contains("PlanbotDownload"),
        "{}",
        findings[2].fix
    );
    paste_fixes(&fake, &findings);
    assert_eq!(preflight(&client(&fake), &plan).await.unwrap(), vec![]);

    // NoAccess on the storage cancels every other role there, for the user and so the token.
    fake.with(|c| c.pveum("pveum acl modify /storage/local --users 'tofu@pve' --roles NoAccess"))
        .unwrap();
    let findings = preflight(&client(&fake), &plan).await.unwrap();
    assert_eq!(
        rules(&findings),
        vec![("PVE103", DEBIAN), ("PVE104", DEBIAN)],
        "{}",
        text(&findings)
    );
}

#[tokio::test]
async fn every_pasteable_fix_of_the_guests_plan_clears_its_finding() {
    let fake = FakeProxmox::start(Cluster::homelab().token(
        TOKEN,
        SECRET,
        &[("/", "PVEAdmin"), ("/storage/local", "PVEDatastoreUser")],
    ))
    .await;
    let plan = crate::support::fixtures::plan("bpg/preflight_guests");
    let findings = preflight(&client(&fake), &plan).await.unwrap();
    // Fixes that are commands (pvesm/pveum), pasted as printed.
    let pasteable: Vec<Finding> = findings
        .iter()
        .filter(|f| {
            f.fix
                .lines()
                .any(|l| l.starts_with("pveum ") || l.starts_with("pvesm "))
        })
        .cloned()
        .collect();
    assert_eq!(
        rules(&pasteable),
        vec![
            ("PVE103", "proxmox_virtual_environment_file.dns_user_data"),
            ("PVE105", "proxmox_virtual_environment_file.dns_user_data"),
            ("PVE107", "proxmox_virtual_environment_container.mqtt"),
            ("PVE107", "proxmox_virtual_environment_vm.ordered"),
        ],
        "{}",
        text(&findings)
    );
    // The two PVE107 fixes are one block, pasted once.
    paste_fixes(&fake, &pasteable);
    let after = preflight(&client(&fake), &plan).await.unwrap();
    assert_eq!(
        rules(&after),
        vec![
            ("PVE102", "proxmox_virtual_environment_vm.ghost"),
            ("PVE103", "proxmox_virtual_environment_vm.ghost"),
            ("PVE106", "proxmox_virtual_environment_vm.dns"),
        ],
        "{}",
        text(&after)
    );
}

/// Issue 35 item 5: with an endpoint that does not answer, a plan without any Proxmox resource
/// or data source gets no preflight at all (no finding, no note line, the apply goes ahead);
/// a plan with one still fails closed (PVE101, the apply refused).
#[tokio::test]
async fn an_unreachable_endpoint_fails_closed_only_for_plans_that_touch_proxmox() {
    let dead = ProxmoxEndpoint::new("https://127.0.0.1:9/", format!("{TOKEN}={SECRET}"));
    let plain = crate::support::fixtures::plan("changes");
    assert!(!planbot::core::proxmox::preflight::touches_proxmox(&plain));
    let pf = planbot::flows::preflight::for_plan(Some(dead.clone()), &plain).await;
    assert!(pf.findings.is_empty(), "{:?}", pf.findings);
    assert_eq!(pf.note, "");
    assert_eq!(
        planbot::flows::preflight::before_apply(Some(dead.clone()), &plain).await,
        Ok(vec![])
    );

    let pve = crate::support::fixtures::plan("bpg/seed_debian_qcow2_import");
    assert!(planbot::core::proxmox::preflight::touches_proxmox(&pve));
    let pf = planbot::flows::preflight::for_plan(Some(dead.clone()), &pve).await;
    assert_eq!(
        pf.findings.iter().map(|f| f.rule).collect::<Vec<_>>(),
        ["PVE101"]
    );
    assert!(planbot::flows::preflight::before_apply(Some(dead), &pve)
        .await
        .is_err());
}
