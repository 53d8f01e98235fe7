//! Issue 35, "green means green, everywhere": one table, a row per outcome a plan (and its
//! apply) can have, each produced end to end against one service (real engine, real git, the
//! fake GitLab, workers on). For every row the surfaces a user reads must say the same thing:
//! the commit statuses (state and description), the plan note's headline and banner, the run
//! pages (read as a signed-in member) and `/metrics` (the plan outcome counted once, the apply
//! outcome counted once). A new outcome is a new row.
//!
//! The Proxmox preflight rows need a plan that touches Proxmox (a resource of the bpg or
//! Telmate provider). The real engine cannot plan one here: every resource needs its provider's
//! schema, and this machine has neither a registry nor a provider mirror holding `bpg/proxmox`
//! (a provider is a go-plugin gRPC server, which no stand-in script can be). So the service's
//! engine is a wrapper: in a root that commits a `plan.json` (only `pve`), `init`/`plan`/`show`
//! hand that plan JSON over, as `apply_story`'s PVE023 test does; everywhere else it `exec`s the
//! real engine. The preflight itself is planbot's, against the stateful fake Proxmox API.

use crate::support::fake_proxmox::{Cluster, FakeProxmox, Fault};
use crate::support::service::TestService;
use crate::support::world::{with_workers, World};
use planbot::core::ids::{MrIid, ProjectId};
use planbot::flows::context::session::Session;

/// `main`'s repository config: `core` (GitLab-managed state, checked by the `new-vms` policy),
/// `dns` (no resources: its plans have no changes), `lab` (state kept in the checkout:
/// STATE001) and `slow` (whose state read the test holds to act while it plans).
const PLANBOT_TOML: &str = r#"[[roots]]
name = "core"
dir = "core"

[[roots]]
name = "dns"
dir = "dns"

[[roots]]
name = "lab"
dir = "lab"
state = "own"

[[roots]]
name = "slow"
dir = "slow"

[[roots]]
name = "pve"
dir = "pve"

[[policy_sets]]
name = "new-vms"
path = "policies"
owners = ["group:infra/capacity"]
"#;

/// Every new `terraform_data.vm` needs the capacity team's approval.
const NEW_VMS_REGO: &str = r#"package main

import rego.v1

deny contains msg if {
	some rc in input.resource_changes
	rc.type == "terraform_data"
	rc.name == "vm"
	"create" in rc.change.actions
	msg := sprintf("%s is a new VM: the capacity team approves new VMs", [rc.address])
}
"#;

fn data(name: &str, input: &str) -> String {
    format!("resource \"terraform_data\" \"{name}\" {{\n  input = \"{input}\"\n}}\n")
}

/// How a row's outcome is produced.
enum Produce {
    /// Like `MergedAndApplied`, with files made at run time, applying root `pve`.
    MergedAndAppliedPve(fn() -> Vec<(String, String)>),
    /// An MR pushing these files, planned.
    Mr(&'static [(&'static str, &'static str)]),
    /// An MR pushing these files, planned; then `core`'s new VM approved by an owner.
    Approved(&'static [(&'static str, &'static str)]),
    /// An MR on `slow` whose plan is running (its state read held) when a newer push arrives.
    Superseded,
    /// An MR on `slow` whose plan is running when the MR is closed.
    Closed,
    /// An MR pushing these files, planned, merged, and the apply job of `main` run.
    MergedAndApplied(&'static [(&'static str, &'static str)]),
}

/// What one commit status must say: its state, and words its description holds.
type Status = Option<(&'static str, &'static str)>;

/// A row: an outcome, how to produce it, and what each surface must say.
struct Row {
    outcome: &'static str,
    /// The Proxmox API does not answer while the row is produced (`GET /version` fails).
    pve_down: bool,
    produce: Produce,
    /// `planbot/plan` of the (first) head.
    plan: Status,
    /// `planbot/policy` of the head (None: no policy status at all).
    policy: Status,
    /// `planbot/apply` of `main`'s head after the merge.
    apply: Status,
    /// The note's headline starts with this (None: no plan note for this head).
    headline: Option<&'static str>,
    /// Words the note's banner (the quote above the headline) holds; "" = no banner.
    banner: &'static str,
    /// The states of the MR's runs on their pages, oldest first (plan runs of the head, then
    /// apply runs), and words each page's summary or note holds.
    runs: &'static [(&'static str, &'static str)],
    /// The apply's result note on the MR: its headline starts with this (None: no apply).
    apply_note: Option<&'static str>,
    /// The `planbot_plan_duration_seconds_count{outcome}` that grows by one (each row plans once).
    plan_metric: &'static str,
    /// The `planbot_applies_total{outcome}` that grows by one ("" = no apply).
    apply_metric: &'static str,
}

const PLANNED: &[(&str, &str)] = &[(
    "core/main.tf",
    "resource \"terraform_data\" \"a\" {\n  input = \"two\"\n}\n",
)];
const NO_CHANGES: &[(&str, &str)] = &[("dns/main.tf", "locals {\n  zone = \"lab.home.arpa\"\n}\n")];
const README: &[(&str, &str)] = &[("README.md", "# homelab\n")];
const BROKEN: &[(&str, &str)] = &[(
    ".planbot.toml",
    "[[roots]]\nname = \"core\"\ndir = \"core\"\nwhen_modifed = [\"*.tf\"]\n\n[lint]\ndisable = [\"PVE999\"]\n",
)];
const ENGINE_ERROR: &[(&str, &str)] = &[("core/main.tf", "resource \"terraform_data\" {\n")];
const LOCAL_STATE: &[(&str, &str)] = &[(
    "lab/main.tf",
    "resource \"terraform_data\" \"lab\" {\n  input = \"two\"\n}\n",
)];
/// A bpg VM: `pve/plan.json` is the plan the wrapper engine shows (see the module's doc).
fn bpg_vm(name: &str, node: &str, vm_id: u32) -> String {
    format!(
        r#"{{"format_version":"1.2","terraform_version":"1.11.4","resource_changes":[{{"address":"proxmox_virtual_environment_vm.{name}","mode":"managed","type":"proxmox_virtual_environment_vm","name":"{name}","provider_name":"registry.opentofu.org/bpg/proxmox","change":{{"actions":["create"],"before":null,"after":{{"name":"{name}","node_name":"{node}","vm_id":{vm_id},"started":true,"template":false,"cpu":[{{"cores":2,"sockets":1,"type":"x86-64-v2-AES"}}],"memory":[{{"dedicated":2048,"floating":0}}],"disk":[{{"datastore_id":"local-lvm","interface":"virtio0","size":20,"file_id":"","import_from":""}}],"network_device":[{{"bridge":"vmbr0","enabled":true,"model":"virtio"}}]}},"after_unknown":{{"id":true}},"before_sensitive":false,"after_sensitive":{{}}}}}}],"errored":false}}"#
    )
}

/// The `pve` root's code: only a backend (the wrapper engine shows `plan.json`).
const PVE_MAIN: &str = "terraform {\n  backend \"http\" {}\n}\n";

/// A VM on `pve03`, a node the cluster does not have: PVE102, an error.
fn ghost_vm() -> Vec<(String, String)> {
    vec![
        ("pve/main.tf".into(), PVE_MAIN.into()),
        ("pve/plan.json".into(), bpg_vm("ghost", "pve03", 190)),
    ]
}

/// A VM on `pve01`, which exists: fine, when the preflight can run.
fn web_vm() -> Vec<(String, String)> {
    vec![
        ("pve/main.tf".into(), PVE_MAIN.into()),
        ("pve/plan.json".into(), bpg_vm("web", "pve01", 191)),
    ]
}

/// `core` gains a resource (`a` as main has it after the `applied` row).
const PLANNED_AGAIN: &[(&str, &str)] = &[(
    "core/main.tf",
    "resource \"terraform_data\" \"a\" {\n  input = \"two\"\n}\nresource \"terraform_data\" \"probe\" {\n  input = \"x\"\n}\n",
)];

const NEW_VM: &[(&str, &str)] = &[(
    "core/main.tf",
    "resource \"terraform_data\" \"a\" {\n  input = \"one\"\n}\nresource \"terraform_data\" \"vm\" {\n  input = \"blocky\"\n}\n",
)];

fn table() -> Vec<Row> {
    vec![
        Row {
            pve_down: false,
            outcome: "planned (changes)",
            produce: Produce::Mr(PLANNED),
            plan: Some(("success", "core: 1 to add")),
            policy: Some(("success", "passed")),
            apply: None,
            headline: Some("🟢 planbot · plan for"),
            banner: "",
            runs: &[("succeeded", "1 to add")],
            apply_note: None,
            plan_metric: "succeeded",
            apply_metric: "",
        },
        Row {
            pve_down: false,
            outcome: "no changes",
            produce: Produce::Mr(NO_CHANGES),
            plan: Some(("success", "dns: no changes")),
            policy: Some(("success", "passed")),
            apply: None,
            headline: Some("🟢 planbot · plan for"),
            banner: "",
            runs: &[("succeeded", "no changes")],
            apply_note: None,
            plan_metric: "succeeded",
            apply_metric: "",
        },
        Row {
            pve_down: false,
            outcome: "no root affected",
            produce: Produce::Mr(README),
            plan: Some(("success", "no root affected by this change")),
            policy: None,
            apply: None,
            headline: None,
            banner: "",
            runs: &[],
            apply_note: None,
            plan_metric: "succeeded",
            apply_metric: "",
        },
        Row {
            pve_down: false,
            outcome: "broken .planbot.toml",
            produce: Produce::Mr(BROKEN),
            plan: Some(("failed", ".planbot.toml in this MR is invalid (2 problems")),
            policy: None,
            apply: None,
            headline: Some("🔴 planbot · plan for"),
            banner: "",
            runs: &[],
            apply_note: None,
            plan_metric: "failed",
            apply_metric: "",
        },
        Row {
            pve_down: false,
            outcome: "engine error",
            produce: Produce::Mr(ENGINE_ERROR),
            plan: Some(("failed", "core: failed")),
            policy: None,
            apply: None,
            headline: Some("🔴 planbot · plan for"),
            banner: "",
            runs: &[("failed", "")],
            apply_note: None,
            plan_metric: "failed",
            apply_metric: "",
        },
        Row {
            pve_down: false,
            outcome: "STATE001",
            produce: Produce::Mr(LOCAL_STATE),
            plan: Some(("failed", "STATE001")),
            // The policy judged the plan, and it passed: true, and no green check by itself.
            policy: Some(("success", "passed")),
            apply: None,
            headline: Some("🔴 planbot · plan for"),
            banner: "",
            runs: &[("failed", "STATE001")],
            apply_note: None,
            plan_metric: "failed",
            apply_metric: "",
        },
        Row {
            pve_down: false,
            outcome: "policy failed",
            produce: Produce::Mr(NEW_VM),
            plan: Some(("success", "core: 2 to add")),
            policy: Some(("failed", "policy set new-vms failed (root core)")),
            apply: None,
            headline: Some("🔴 planbot · plan for"),
            banner: "",
            runs: &[("succeeded", "2 to add")],
            apply_note: None,
            plan_metric: "succeeded",
            apply_metric: "",
        },
        Row {
            pve_down: false,
            outcome: "policy approved",
            produce: Produce::Approved(NEW_VM),
            plan: Some(("success", "core: 2 to add")),
            policy: Some(("success", "1 failing policy set approved")),
            apply: None,
            headline: Some("🟡 planbot · plan for"),
            banner: "Policies approved",
            runs: &[("succeeded", "2 to add")],
            apply_note: None,
            plan_metric: "succeeded",
            apply_metric: "",
        },
        Row {
            pve_down: false,
            outcome: "superseded",
            produce: Produce::Superseded,
            plan: Some(("canceled", "superseded by a newer commit")),
            policy: None,
            apply: None,
            headline: None,
            banner: "",
            runs: &[("canceled", "superseded by a newer commit")],
            apply_note: None,
            plan_metric: "canceled",
            apply_metric: "",
        },
        Row {
            pve_down: false,
            outcome: "cancelled (MR closed)",
            produce: Produce::Closed,
            plan: Some(("canceled", "the merge request was closed")),
            policy: None,
            apply: None,
            headline: None,
            banner: "",
            runs: &[("canceled", "the merge request was closed")],
            apply_note: None,
            plan_metric: "canceled",
            apply_metric: "",
        },
        Row {
            pve_down: false,
            outcome: "applied",
            produce: Produce::MergedAndApplied(PLANNED),
            plan: Some(("success", "core: 1 to add")),
            policy: Some(("success", "passed")),
            apply: Some(("success", "applied")),
            headline: Some("🟢 planbot · plan for"),
            banner: "Merged and applied",
            runs: &[("succeeded", "1 to add"), ("succeeded", "")],
            apply_note: Some("🟢 planbot · applied `"),
            plan_metric: "succeeded",
            apply_metric: "succeeded",
        },
        Row {
            pve_down: false,
            outcome: "apply refused (policy not approved)",
            produce: Produce::MergedAndApplied(NEW_VM),
            // `a` was applied by the row above: the VM is the one new resource.
            plan: Some(("success", "core: 1 to add, 1 to change")),
            policy: Some(("failed", "policy set new-vms failed (root core)")),
            apply: Some(("failed", "not applied")),
            headline: Some("🔴 planbot · plan for"),
            banner: "the apply was refused",
            runs: &[
                ("succeeded", "1 to add"),
                ("refused", "not applied: policy set"),
            ],
            apply_note: Some("🔴 planbot · apply of `"),
            plan_metric: "succeeded",
            apply_metric: "refused",
        },
        Row {
            pve_down: false,
            outcome: "preflight error (PVE102)",
            produce: Produce::MergedAndAppliedPve(ghost_vm),
            plan: Some(("failed", "PVE102 proxmox_virtual_environment_vm.ghost: `proxmox_virtual_environment_vm.ghost` uses node `pve03`, which the cluster does not have")),
            policy: Some(("success", "passed")),
            apply: Some(("failed", "not applied")),
            headline: Some("🔴 planbot · plan for"),
            banner: "the apply was refused",
            runs: &[("failed", "PVE102"), ("refused", "not applied")],
            apply_note: Some("🔴 planbot · apply of `"),
            plan_metric: "failed",
            apply_metric: "refused",
        },
        Row {
            pve_down: true,
            outcome: "preflight could not run (Proxmox down, a plan that touches Proxmox)",
            produce: Produce::MergedAndAppliedPve(web_vm),
            plan: Some(("failed", "PVE101: The Proxmox preflight could not run: the Proxmox API answered 503")),
            policy: Some(("success", "passed")),
            apply: Some(("failed", "not applied")),
            headline: Some("🔴 planbot · plan for"),
            banner: "the apply was refused",
            runs: &[("failed", "could not run"), ("refused", "not applied")],
            apply_note: Some("🔴 planbot · apply of `"),
            plan_metric: "failed",
            apply_metric: "refused",
        },
        Row {
            pve_down: true,
            outcome: "planned, Proxmox down, a plan without Proxmox resources",
            produce: Produce::Mr(PLANNED_AGAIN),
            plan: Some(("success", "core: 1 to add")),
            policy: Some(("success", "passed")),
            apply: None,
            headline: Some("🟢 planbot · plan for"),
            banner: "",
            runs: &[("succeeded", "1 to add")],
            apply_note: None,
            plan_metric: "succeeded",
            apply_metric: "",
        },
    ]
}

/// The service's engine: the real one, except in a root that commits a `plan.json` (see the
/// module's doc), where `init`, `plan` and `show` hand that plan over.
fn wrapper_engine(dir: &std::path::Path, real: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("terraform");
    std::fs::write(
        &path,
        format!(
            r#"#!/bin/sh
if [ "$1" != version ] && [ -f plan.json ]; then
  case "$1" in
    init) mkdir -p .terraform && echo '{{"backend":{{"type":"http"}}}}' > .terraform/terraform.tfstate; exit 0 ;;
    plan) for a in "$@"; do case "$a" in -out=*) cp plan.json "${{a#-out=}}" ;; esac; done; exit 0 ;;
    show) cat "$3"; exit 0 ;;
  esac
  echo "the plan.json stand-in does not run $1" >&2
  exit 1
fi
exec {real} "$@"
"#,
            real = real.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

const PVE_TOKEN: &str = "tofu@pve!planbot";
const PVE_SECRET: &str = "5e5b7b1e-0000-4000-8000-00000000pve0";

/// `main` with every root and the `new-vms` policy (owned by `infra/capacity`, carol in it),
/// GitLab-managed state, planbot signing users in for its run pages, the fake Proxmox.
fn world(engine: &std::path::Path, pve: &FakeProxmox) -> World {
    World::builder()
        .engine(engine)
        .engine_lines("grace = \"2s\"")
        .managed_state()
        .signin()
        .group_member("infra/capacity", "carol", 30)
        .planbot_toml(PLANBOT_TOML)
        .files(&[
            ("policies/new_vms.rego", NEW_VMS_REGO),
            ("core/main.tf", &data("a", "one")),
            ("dns/main.tf", "locals {\n  zone = \"home.arpa\"\n}\n"),
            ("lab/main.tf", &data("lab", "one")),
            ("slow/main.tf", &data("slow", "one")),
            ("pve/main.tf", PVE_MAIN),
        ])
        .config(|c| c.proxmox(&pve.url, &format!("{PVE_TOKEN}={PVE_SECRET}")))
        .build()
}

impl World {
    /// Produce `row`'s outcome; returns the MR, the head whose statuses the row checks and
    /// `main`'s head after the merge (for apply rows).
    async fn produce(&self, s: &TestService, n: usize, row: &Row) -> (u64, String, Option<String>) {
        let branch = format!("row-{n}");
        match &row.produce {
            Produce::Mr(files) => {
                let iid = self.open_mr(s, &branch, files).await;
                let head = self.gitlab.mr_sha(&self.project, iid);
                self.final_statuses(s, &head, &["planbot/plan"]).await;
                (iid, head, None)
            }
            Produce::Approved(files) => {
                let iid = self.open_mr(s, &branch, files).await;
                let head = self.gitlab.mr_sha(&self.project, iid);
                self.final_statuses(s, &head, &["planbot/plan"]).await;
                self.final_statuses(s, &head, &["planbot/policy"]).await;
                // The plan job ends before the owner reads the note: an approval written while
                // the job may still edit its note is (rightly) refused as written on another
                // note, which made this row fail once in six full runs.
                s.after_job_ends("the MR's plan job ended", 120, || s.jobs_all_ended())
                    .await;
                let reply = self
                    .comment(s, iid, &self.user("carol"), "planbot approve policies")
                    .await;
                assert!(
                    reply.contains("approved, for the plan shown for"),
                    "{reply}"
                );
                (iid, head, None)
            }
            Produce::Superseded | Produce::Closed => {
                // The engine's read of `slow`'s state waits at GitLab until released: the plan
                // is running while the test pushes (or closes), no timer involved.
                let path = format!("/api/v4/projects/{}/terraform/state/slow", self.project.id);
                let hold = self.gitlab.hold("GET", &path);
                let iid = self
                    .open_mr(s, &branch, &[("slow/main.tf", &data("slow", "two"))])
                    .await;
                let head = self.gitlab.mr_sha(&self.project, iid);
                if !hold.arrived(120).await {
                    panic!(
                        "{}: the plan never read {path}: statuses {:?}, state requests {:?}, jobs {:?}",
                        row.outcome,
                        self.gitlab.statuses(&self.project, &head),
                        self.gitlab.state_requests(),
                        s.app.store.recent_jobs(5).await.unwrap()
                    );
                }
                assert_eq!(
                    self.status_of(&head, "planbot/plan")
                        .map(|s| s.0)
                        .as_deref(),
                    Some("running")
                );
                if matches!(row.produce, Produce::Superseded) {
                    self.gitlab.push(
                        &self.project,
                        &branch,
                        &[("slow/main.tf", &data("slow", "three"))],
                    );
                    let body = self
                        .gitlab
                        .mr_webhook(&self.project, iid)
                        .action("update")
                        .oldrev(&head)
                        .body();
                    self.hook(s, "Merge Request Hook", &format!("push-{iid}"), &body)
                        .await;
                } else {
                    self.gitlab.close_mr(&self.project, iid);
                    let body = self
                        .gitlab
                        .mr_webhook(&self.project, iid)
                        .action("close")
                        .body();
                    self.hook(s, "Merge Request Hook", &format!("close-{iid}"), &body)
                        .await;
                }
                hold.release();
                self.final_statuses(s, &head, &["planbot/plan"]).await;
                if matches!(row.produce, Produce::Superseded) {
                    // The newer head is planned to the end (its own, ordinary outcome).
                    let newer = self.gitlab.mr_sha(&self.project, iid);
                    self.final_statuses(s, &newer, &["planbot/plan"]).await;
                }
                (iid, head, None)
            }
            Produce::MergedAndApplied(_) | Produce::MergedAndAppliedPve(_) => {
                let owned: Vec<(String, String)> = match &row.produce {
                    Produce::MergedAndAppliedPve(make) => make(),
                    Produce::MergedAndApplied(files) => files
                        .iter()
                        .map(|(p, t)| (p.to_string(), t.to_string()))
                        .collect(),
                    _ => unreachable!(),
                };
                let files: Vec<(&str, &str)> = owned
                    .iter()
                    .map(|(p, t)| (p.as_str(), t.as_str()))
                    .collect();
                let root = files[0].0.split('/').next().unwrap().to_string();
                let iid = self.open_mr(s, &branch, &files).await;
                let head = self.gitlab.mr_sha(&self.project, iid);
                self.final_statuses(s, &head, &["planbot/plan"]).await;
                self.final_statuses(s, &head, &["planbot/policy"]).await;
                let landed = self
                    .gitlab
                    .merge_mr(&self.project, iid, Some(&self.alice()));
                let body = self
                    .gitlab
                    .mr_webhook(&self.project, iid)
                    .action("merge")
                    .body();
                self.hook(s, "Merge Request Hook", &format!("merge-{iid}"), &body)
                    .await;
                let (gitlab, project) = (&self.gitlab, &self.project);
                s.after_job_ends("the merged banner", 60, || async {
                    gitlab
                        .plan_note(project, iid)
                        .is_some_and(|n| n.contains("<!-- planbot:merged -->"))
                })
                .await;
                let job = self.click_apply(900 + n as u64);
                let r = s
                    .http
                    .post(s.url("/api/v1/apply"))
                    .header("JOB-TOKEN", &job.token)
                    .header("content-type", "application/json")
                    // Only the row's root (`lab` keeps its state in the checkout: its apply
                    // would be refused).
                    .body(format!(r#"{{"roots": ["{root}"]}}"#))
                    .send()
                    .await
                    .expect("POST /api/v1/apply");
                assert_eq!(r.status().as_u16(), 200);
                let log = r.text().await.unwrap();
                assert!(log.contains("planbot: apply "), "{log}");
                self.final_statuses(s, &landed, &["planbot/apply"]).await;
                (iid, head, Some(landed))
            }
        }
    }
}

/// `planbot_<name>{outcome="<label>"}`'s value in a `/metrics` text (0 when absent).
fn metric(text: &str, name: &str, label: &str) -> u64 {
    let prefix = format!("planbot_{name}{{outcome=\"{label}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse::<f64>().unwrap() as u64)
        .unwrap_or(0)
}

const PLAN_OUTCOMES: &[&str] = &["succeeded", "failed", "canceled", "skipped", "error"];
const APPLY_OUTCOMES: &[&str] = &["succeeded", "failed", "refused", "interrupted"];

/// The status check of one surface against the row: `(state, words)`.
fn check_status(
    problems: &mut Vec<String>,
    what: &str,
    got: Option<(String, String)>,
    want: Status,
) {
    match (got, want) {
        (None, None) => {}
        (Some((state, description)), Some((want_state, words))) => {
            if state != want_state || !description.contains(words) {
                problems.push(format!(
                    "{what} is {state} \"{description}\", want {want_state} with \"{words}\""
                ));
            }
        }
        (got, want) => problems.push(format!("{what}: {got:?}, want {want:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_says_the_same_on_statuses_note_run_pages_and_metrics() {
    let real = require_engine!();
    let bin = tempfile::tempdir().unwrap();
    let engine = wrapper_engine(bin.path(), &real);
    let pve =
        FakeProxmox::start(Cluster::homelab().token(PVE_TOKEN, PVE_SECRET, &[("/", "PVEAdmin")]))
            .await;
    let w = world(&engine, &pve);
    let s = w.serve(with_workers()).await;
    // Alice, signed in (the session cookie planbot gives her after GitLab's sign-in).
    let cookie = s.app.signin.session_cookie(&Session {
        user_id: w.alice().id,
        username: w.alice().username,
        expires: u64::MAX / 2,
    });
    let cookie = cookie
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();

    let mut problems: Vec<String> = Vec::new();
    for (n, row) in table().iter().enumerate() {
        let before = s.metrics().await;
        pve.with(|c| {
            if row.pve_down {
                c.faults.insert(
                    "/version".into(),
                    Fault::Status(503, "Service Unavailable".into()),
                );
            } else {
                c.faults.remove("/version");
            }
        });
        let (iid, head, landed) = w.produce(&s, n, row).await;
        let mut p: Vec<String> = Vec::new();

        // The commit statuses.
        check_status(
            &mut p,
            "planbot/plan",
            w.status_of(&head, "planbot/plan"),
            row.plan,
        );
        check_status(
            &mut p,
            "planbot/policy",
            w.status_of(&head, "planbot/policy"),
            row.policy,
        );
        let apply = landed
            .as_ref()
            .and_then(|l| w.status_of(l, "planbot/apply"));
        check_status(&mut p, "planbot/apply", apply, row.apply);

        // The note: its headline and banner. A head that was stopped has no note of its own.
        let note = w.gitlab.plan_note(&w.project, iid).unwrap_or_default();
        let headline = note
            .lines()
            .find_map(|l| l.strip_prefix("### "))
            .unwrap_or("")
            .to_string();
        let banner: String = note
            .lines()
            .take_while(|l| !l.starts_with("### "))
            .filter(|l| l.starts_with('>'))
            .collect::<Vec<_>>()
            .join("\n");
        match row.headline {
            Some(want) => {
                if !headline.starts_with(want) {
                    p.push(format!("headline \"{headline}\", want \"{want}…\""));
                }
                if !note.contains(&head[..8]) {
                    p.push(format!("the note is not of {head:.8}: \"{headline}\""));
                }
            }
            None => {
                if note.contains(&format!("plan for `{}`", &head[..8])) {
                    p.push(format!("a plan note for a stopped head: \"{headline}\""));
                }
            }
        }
        if row.banner.is_empty() != banner.is_empty() || !banner.contains(row.banner) {
            p.push(format!(
                "banner \"{banner}\", want \"{}\" in:\n{note}",
                row.banner
            ));
        }
        // The apply's result note (planbot's newest note that is not the plan note).
        let apply_note = w
            .gitlab
            .notes(&w.project, iid)
            .into_iter()
            .rev()
            .map(|n| n.body)
            .find(|b| !b.contains(planbot::core::render::NOTE_MARKER) && b.starts_with("### "));
        let apply_headline = apply_note
            .as_deref()
            .and_then(|b| b.lines().next())
            .map(|l| l.trim_start_matches("### ").to_string());
        match (row.apply_note, &apply_headline) {
            (None, None) => {}
            (Some(want), Some(got)) if got.starts_with(want) => {
                let refused = row.apply_metric == "refused";
                if refused != got.contains("refused") {
                    p.push(format!(
                        "apply note \"{got}\" for a {} apply",
                        row.apply_metric
                    ));
                }
            }
            (want, got) => p.push(format!("apply note {got:?}, want {want:?}")),
        }
        // Whatever the colour, a red headline goes with a failed status and back.
        let failed_status = ["planbot/plan", "planbot/policy"]
            .iter()
            .any(|name| w.status_of(&head, name).is_some_and(|st| st.0 == "failed"));
        if row.headline.is_some() && headline.starts_with('🔴') != failed_status {
            p.push(format!(
                "headline \"{headline}\" with a failed status: {failed_status}"
            ));
        }

        // The run pages, as alice sees them: the head's plan runs, then the apply runs.
        let runs = s
            .app
            .store
            .runs_for_mr(ProjectId(w.project.id), MrIid(iid))
            .await
            .unwrap();
        let mut runs: Vec<_> = runs
            .into_iter()
            .filter(|r| r.sha.0 == head || Some(&r.sha.0) == landed.as_ref())
            .collect();
        runs.sort_by_key(|r| r.id.0);
        if runs.len() != row.runs.len() {
            p.push(format!(
                "{} runs ({:?}), want {}",
                runs.len(),
                runs.iter().map(|r| r.state.as_str()).collect::<Vec<_>>(),
                row.runs.len()
            ));
        }
        for (run, (want, words)) in runs.iter().zip(row.runs) {
            let r = s
                .http
                .get(s.url(&format!("/runs/{}", run.id.0)))
                .header("cookie", &cookie)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{}: run page {}", row.outcome, run.id.0);
            let page = r.text().await.unwrap().replace("&#x2f;", "/");
            let badge = format!("state badge state-{want}\">{want}</span>");
            if !page.contains(&badge) || !page.contains(words) {
                p.push(format!(
                    "run {} page says {} (summary {:?}), want {want} with \"{words}\"",
                    run.id.0,
                    run.state.as_str(),
                    run.summary
                ));
            }
        }
        // A status that links a run page links one of these.
        for name in ["planbot/plan", "planbot/apply"] {
            let sha = if name == "planbot/apply" {
                landed.as_deref()
            } else {
                Some(head.as_str())
            };
            let Some(st) = sha.and_then(|sha| w.gitlab.status(&w.project, sha, name)) else {
                continue;
            };
            if let Some(url) = st.target_url {
                let linked = runs
                    .iter()
                    .any(|r| url == format!("http://planbot.test/runs/{}", r.id.0));
                if !linked {
                    p.push(format!("{name} links {url}, not a run of this row"));
                }
            }
        }

        // /metrics: the plan counted once under its outcome, the apply once under its own.
        let after = s.metrics().await;
        for label in PLAN_OUTCOMES {
            let grew = metric(&after, "plan_duration_seconds_count", label)
                - metric(&before, "plan_duration_seconds_count", label);
            let want = match row.produce {
                // The newer head is planned too, to the end.
                Produce::Superseded if *label == "succeeded" => 1,
                _ => u64::from(*label == row.plan_metric),
            };
            if grew != want {
                p.push(format!("plan outcome {label} grew by {grew}, want {want}"));
            }
        }
        for label in APPLY_OUTCOMES {
            let grew =
                metric(&after, "applies_total", label) - metric(&before, "applies_total", label);
            let want = u64::from(*label == row.apply_metric);
            if grew != want {
                p.push(format!("apply outcome {label} grew by {grew}, want {want}"));
            }
        }
        for x in &p {
            eprintln!("{}: {x}", row.outcome);
        }
        problems.extend(p.into_iter().map(|x| format!("{}: {x}", row.outcome)));
        // Closed quietly (no webhook): a later row's merge re-plans no MR of this one.
        if !matches!(
            row.produce,
            Produce::MergedAndApplied(_) | Produce::MergedAndAppliedPve(_) | Produce::Closed
        ) {
            w.gitlab.close_mr(&w.project, iid);
        }
    }
    assert!(
        problems.is_empty(),
        "surfaces that disagree:\n{}",
        problems.join("\n")
    );
}
