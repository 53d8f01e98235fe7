//! Stories of the apply in dependency order (docs/workflow.md, "Several roots"): roots
//! `network` → `vms` → `dns` (`depends_on` in `.planbot.toml`), each with its own state in the
//! fake GitLab's managed state (the engine's `http` backend, written by each root's `backend`
//! block). `vms` reads `network`'s output `subnet` with a `terraform_remote_state` on that state,
//! read at apply time (its `depends_on` on a resource of `vms` that the MR changes defers the
//! read): applied after `network`, `vms` gets the subnet `network` just wrote.

use crate::apply_story::{call_apply, config_text_for, last_line, with_workers};
use crate::support::fake_gitlab::{FakeGitLab, FakeJob, FakeProject, FakeUser, MAINTAINER};
use crate::support::service::TestService;
use planbot::core::config::Config;

const INFRA: &str = "infra/homelab";

struct World {
    gitlab: FakeGitLab,
    project: FakeProject,
    alice: FakeUser,
    _data: tempfile::TempDir,
    config: Config,
}

/// `.planbot.toml`: the roots listed dependents first, so config order is not the apply order.
const PLANBOT_TOML: &str = r#"
[[roots]]
name = "dns"
dir = "stacks/dns"
depends_on = ["vms"]

[[roots]]
name = "vms"
dir = "stacks/vms"
depends_on = ["network"]

[[roots]]
name = "network"
dir = "stacks/network"

[[roots]]
name = "backup"
dir = "stacks/backup"
"#;

impl World {
    fn new(engine: &std::path::Path) -> World {
        let gitlab = FakeGitLab::start();
        let project = gitlab.create_project(INFRA);
        let alice = gitlab.member_with_role(&project, "alice", MAINTAINER);
        let data = tempfile::tempdir().unwrap();
        let text = config_text_for(data.path(), &gitlab, &project, engine, "127.0.0.1:0");
        let config =
            Config::load(&text, &[], &|_| Err("no files".into())).expect("test config is valid");
        let w = World {
            gitlab,
            project,
            alice,
            _data: data,
            config,
        };
        // On main: every root with its state backend and nothing to manage yet.
        let files: Vec<(String, String)> = ["network", "vms", "dns", "backup"]
            .iter()
            .map(|r| (format!("stacks/{r}/backend.tf"), w.backend(r)))
            .chain([(".planbot.toml".to_string(), PLANBOT_TOML.to_string())])
            .collect();
        let files: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        w.gitlab.commit_files(&w.project, "main", &files);
        w
    }

    /// The address of state `name` in the fake GitLab.
    fn state_url(&self, name: &str) -> String {
        format!(
            "{}/api/v4/projects/{}/terraform/state/{name}",
            self.gitlab.url(),
            self.project.id
        )
    }

    /// Root `name`'s `backend "http"` on its own managed state (user and password come from
    /// the engine's environment: a reader's token for MR plans, a writer's for applies).
    fn backend(&self, name: &str) -> String {
        let url = self.state_url(name);
        format!(
            "terraform {{\n  backend \"http\" {{\n    address        = \"{url}\"\n    lock_address   = \"{url}/lock\"\n    unlock_address = \"{url}/lock\"\n  }}\n}}\n"
        )
    }

    /// `network`: the subnet, as an output (`fail`: its apply fails after the subnet).
    fn network_tf(subnet: &str, fail: bool) -> String {
        let mut tf = format!(
            "resource \"terraform_data\" \"subnet\" {{\n  input = \"{subnet}\"\n}}\n\noutput \"subnet\" {{\n  value = terraform_data.subnet.output\n}}\n"
        );
        if fail {
            tf.push_str(
                "\nresource \"terraform_data\" \"router\" {\n  input = terraform_data.subnet.output\n  provisioner \"local-exec\" {\n    command = \"echo the router refused the subnet >&2; exit 3\"\n  }\n}\n",
            );
        }
        tf
    }

    /// `vms`: one VM on `network`'s subnet, read from its state when `vms` applies.
    fn vms_tf(&self, release: &str) -> String {
        format!(
            r#"resource "terraform_data" "release" {{
  input = "{release}"
}}

data "terraform_remote_state" "network" {{
  backend = "http"
  config = {{
    address = "{network}"
  }}
  depends_on = [terraform_data.release]
}}

resource "terraform_data" "vm" {{
  input = {{
    name   = "vm1"
    subnet = data.terraform_remote_state.network.outputs.subnet
  }}
}}
"#,
            network = self.state_url("network"),
        )
    }

    /// Alice pushes `files` on `branch`, opens an MR, GitLab delivers the webhook; the plan
    /// note once the head's `planbot/plan` status is final.
    async fn reviewed_mr(&self, s: &TestService, branch: &str, files: &[(&str, &str)]) -> u64 {
        self.gitlab.commit_files(&self.project, branch, files);
        let iid = self
            .gitlab
            .open_mr_by(&self.project, branch, "main", &self.alice);
        let body = self
            .gitlab
            .mr_webhook(&self.project, iid)
            .action("open")
            .body();
        s.deliver_mr_opened(&body, iid).await;
        let head = self.gitlab.mr_sha(&self.project, iid);
        let (gitlab, project) = (&self.gitlab, &self.project);
        s.after_job_ends("a final planbot/plan status", 120, || async {
            gitlab
                .status(project, &head, "planbot/plan")
                .is_some_and(|st| st.state == "success" || st.state == "failed")
        })
        .await;
        let status = self
            .gitlab
            .status(&self.project, &head, "planbot/plan")
            .unwrap();
        assert_eq!(status.state, "success", "{status:?}");
        iid
    }

    /// Merge the MR and run the manual apply job of `main`'s new head: its log, and the
    /// `planbot/apply` status of the merged commit (`state: description`).
    async fn merge_and_apply(&self, s: &TestService, iid: u64, job_id: u64) -> (String, String) {
        let landed = self.gitlab.merge_mr(&self.project, iid, Some(&self.alice));
        let job = FakeJob {
            token: format!("glcbt-job-{job_id}"),
            id: job_id,
            name: "planbot-apply".into(),
            status: "running".into(),
            ref_: "main".into(),
            tag: false,
            user: Some(self.alice.clone()),
            pipeline_id: 1000 + job_id,
            project_id: self.project.id,
            sha: landed.clone(),
        };
        self.gitlab.register_job(job.clone());
        let (status, log) = call_apply(s, &job.token, "").await;
        assert_eq!(status, 200, "{log}");
        let st = self
            .gitlab
            .status(&self.project, &landed, "planbot/apply")
            .expect("a planbot/apply status");
        (
            log,
            format!("{}: {}", st.state, st.description.unwrap_or_default()),
        )
    }

    /// Alice's reviewed MR of `network` and a VM on its subnet (`vms`), merged and applied by
    /// job `job_id`: the MR, the job's log and the `planbot/apply` status.
    async fn network_and_vms_applied(
        &self,
        s: &TestService,
        network: &str,
        job_id: u64,
    ) -> (u64, String, String) {
        let vms = self.vms_tf("v1");
        let files = [
            ("stacks/network/main.tf", network),
            ("stacks/vms/main.tf", vms.as_str()),
        ];
        let iid = self.reviewed_mr(s, "subnet-and-vm", &files).await;
        let (log, status) = self.merge_and_apply(s, iid, job_id).await;
        (iid, log, status)
    }

    /// The note on MR `iid` that contains `text` (the test fails without one).
    fn note_with(&self, iid: u64, text: &str) -> String {
        self.gitlab
            .notes(&self.project, iid)
            .into_iter()
            .map(|n| n.body)
            .find(|b| b.contains(text))
            .unwrap_or_else(|| panic!("no note of !{iid} contains {text:?}"))
    }

    fn state(&self, name: &str) -> Option<String> {
        self.gitlab
            .terraform_state(&self.project, name)
            .0
            .map(|s| String::from_utf8(s).unwrap())
    }
}

/// The position of the first line of `log` containing `text` (the test fails without one).
fn line_of(log: &str, text: &str) -> usize {
    log.lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("no line with {text:?} in:\n{log}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apply_job_applies_network_then_replans_vms_against_its_new_outputs_then_dns() {
    let engine = require_engine!();
    let w = World::new(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    let network = World::network_tf("10.0.2.0/24", false);
    let (iid, log, status) = w.network_and_vms_applied(&s, &network, 41).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(status.starts_with("success"), "{status}");

    // Upstream first, whatever the config's order; then the dependents, each planned again.
    let network_applied = line_of(&log, "root `network`: applying the reviewed plan");
    let vms_replanned = line_of(
        &log,
        "root `vms`: `network`, which it depends on, applied: planning it again against its new outputs",
    );
    let vms_applied = line_of(&log, "root `vms`: applying the reviewed plan");
    let dns_replanned = line_of(
        &log,
        "root `dns`: `vms`, which it depends on, applied: planning it again",
    );
    assert!(
        network_applied < vms_replanned
            && vms_replanned < vms_applied
            && vms_applied < dns_replanned,
        "{log}"
    );
    assert!(
        log.lines()
            .skip(dns_replanned)
            .any(|l| l == "planbot: root `dns`: no changes, nothing to apply"),
        "{log}"
    );
    // The VM was made with the subnet `network` had just written.
    let vms_state = w.state("vms").expect("vms has a state");
    assert!(vms_state.contains("10.0.2.0/24"), "{vms_state}");
    let note = w.note_with(iid, "planbot · applied");
    assert!(note.contains("- root `vms`: 2 added"), "{note}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_network_apply_stops_vms_and_dns_and_says_why_and_backup_still_applies() {
    let engine = require_engine!();
    let w = World::new(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    let network = World::network_tf("10.0.2.0/24", true);
    let vms = w.vms_tf("v1");
    let backup = "resource \"terraform_data\" \"nightly\" {\n  input = \"02:00\"\n}\n";
    let iid = w
        .reviewed_mr(
            &s,
            "subnet-vm-and-backup",
            &[
                ("stacks/network/main.tf", &network),
                ("stacks/vms/main.tf", &vms),
                ("stacks/backup/main.tf", backup),
            ],
        )
        .await;
    let (log, status) = w.merge_and_apply(&s, iid, 42).await;
    println!("--- the job's log ---\n{log}--- planbot/apply: {status}");

    assert!(log.contains("the router refused the subnet"), "{log}");
    let stopped = "roots below, not applied: `vms`, `dns`";
    assert!(
        last_line(&log).starts_with("planbot: apply failed: root `network`: ")
            && last_line(&log).ends_with(stopped),
        "{log}"
    );
    assert!(
        log.contains("planbot: root `vms`: not applied: `network`, which it depends on, failed\n"),
        "{log}"
    );
    assert!(
        log.contains(
            "planbot: root `dns`: not applied: `network`, which it depends on through `vms`, failed\n"
        ),
        "{log}"
    );
    assert!(!log.contains("root `vms`: applying"), "{log}");
    // `backup` depends on nothing that failed: applied.
    assert!(
        log.contains("root `backup`: applying the reviewed plan"),
        "{log}"
    );
    assert!(w.state("backup").is_some_and(|s| s.contains("02:00")));
    assert!(w.state("vms").is_none(), "vms was not applied");
    assert!(
        status.starts_with("failed: root `network`: ") && status.ends_with(stopped),
        "{status}"
    );
    let note = w.note_with(iid, "apply of");
    assert!(note.contains("- root `network`: apply failed"), "{note}");
    assert!(
        note.contains("- root `vms`: not applied: `network`, which it depends on, failed"),
        "{note}"
    );
    assert!(
        note.contains(
            "- root `dns`: not applied: `network`, which it depends on through `vms`, failed"
        ),
        "{note}"
    );
    assert!(note.contains("- root `backup`: 1 added"), "{note}");
}

/// `vms` reading `network`'s subnet when it plans (no deferred read): its reviewed plan holds
/// the subnet as it was before `network`'s apply.
fn vms_reading_now_tf(network: &str) -> String {
    format!(
        r#"data "terraform_remote_state" "network" {{
  backend = "http"
  config = {{
    address = "{network}"
  }}
}}

resource "terraform_data" "vm" {{
  input = {{
    name   = "vm1"
    subnet = data.terraform_remote_state.network.outputs.subnet
  }}
}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replan_whose_known_value_changed_is_refused_below_roots_stop_and_a_confirm_applies_it() {
    let engine = require_engine!();
    let w = World::new(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;
    // First the subnet alone, reviewed and applied.
    let first = World::network_tf("10.0.1.0/24", false);
    let iid = w
        .reviewed_mr(&s, "subnet", &[("stacks/network/main.tf", &first)])
        .await;
    let (log, _) = w.merge_and_apply(&s, iid, 43).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");

    // Then a new subnet, and a VM reviewed on the old one.
    let network = World::network_tf("10.0.2.0/24", false);
    let vms = vms_reading_now_tf(&w.state_url("network"));
    let iid = w
        .reviewed_mr(
            &s,
            "new-subnet-and-vm",
            &[
                ("stacks/network/main.tf", &network),
                ("stacks/vms/main.tf", &vms),
            ],
        )
        .await;
    let (log, status) = w.merge_and_apply(&s, iid, 44).await;
    println!("--- the job's log ---\n{log}--- planbot/apply: {status}");
    assert!(
        log.contains("planbot: root `vms`: after `network` applied, the new plan differs from the checked one in more than values known after apply: `terraform_data.vm` `input.subnet` has another value\n"),
        "{log}"
    );
    assert!(
        log.contains("planbot: root `dns`: not applied: `vms`, which it depends on, was refused\n"),
        "{log}"
    );
    assert!(
        last_line(&log).starts_with("planbot: apply refused: ")
            && last_line(&log).ends_with("a root below, not applied: `dns`"),
        "{log}"
    );
    assert!(status.starts_with("failed: "), "{status}");
    assert!(w.state("network").unwrap().contains("10.0.2.0/24"));
    assert!(w.state("vms").is_none(), "vms was not applied");
    let confirm = log
        .lines()
        .find_map(|l| l.split("PLANBOT_CONFIRM=").nth(1))
        .map(|c| c.trim_end_matches('.').to_string())
        .expect("the log says how to confirm");

    // A new job with the confirmation: `network` has nothing left, `vms` applies on the new subnet.
    let job = FakeJob {
        token: "glcbt-job-45".into(),
        id: 45,
        name: "planbot-apply".into(),
        status: "running".into(),
        ref_: "main".into(),
        tag: false,
        user: Some(w.alice.clone()),
        pipeline_id: 1045,
        project_id: w.project.id,
        sha: w.gitlab.branch_head(&w.project, "main").unwrap(),
    };
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, &format!(r#"{{"confirm":"{confirm}"}}"#)).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(w.state("vms").unwrap().contains("10.0.2.0/24"));
}

/// `network` with a step whose apply writes into `vms`'s directory: a `backend "local"`
/// override (and the `.terraform` its `init` left), so `vms`'s plan after `network` applied
/// keeps its state in the checkout, where its first plan did not.
fn network_moving_vms_state_tf() -> String {
    let mut tf = World::network_tf("10.0.2.0/24", false);
    tf.push_str(
        r#"
resource "terraform_data" "generator" {
  input = "vms"
  provisioner "local-exec" {
    command = "echo 'terraform {' > ../vms/local_override.tf; echo '  backend \"local\" {}' >> ../vms/local_override.tf; echo '}' >> ../vms/local_override.tf; rm -rf ../vms/.terraform"
  }
}
"#,
    );
    tf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replan_that_finds_the_state_in_the_checkout_is_refused_as_the_first_plan_would_be() {
    let engine = require_engine!();
    let w = World::new(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let network = network_moving_vms_state_tf();
    let (iid, log, status) = w.network_and_vms_applied(&s, &network, 46).await;
    println!("--- the job's log ---\n{log}--- planbot/apply: {status}");

    // `vms` was checked with its state in GitLab; after `network` applied, its state would
    // be a file of the throwaway checkout: refused, as its first plan would have been.
    let refusal = "root `vms` keeps its state in the checkout (a `local` backend, or no backend at all): planbot applies in a throwaway checkout, so the new state would be lost";
    line_of(
        &log,
        "root `vms`: `network`, which it depends on, applied: planning it again",
    );
    assert_eq!(
        last_line(&log),
        format!("planbot: apply refused: {refusal}; a root below, not applied: `dns`"),
        "{log}"
    );
    assert!(
        log.contains("planbot: root `dns`: not applied: `vms`, which it depends on, was refused\n"),
        "{log}"
    );
    assert!(!log.contains("root `vms`: applying"), "{log}");
    assert_eq!(
        status,
        format!("failed: {refusal}; a root below, not applied: `dns`")
    );
    assert!(w.state("network").unwrap().contains("10.0.2.0/24"));
    assert!(w.state("vms").is_none(), "vms was not applied");
    let note = w.note_with(iid, "apply of");
    assert!(
        note.contains(&format!("- root `vms`: not applied: {refusal}")),
        "{note}"
    );
}
