//! Stories of the apply in dependency order (docs/workflow.md, "Several roots"): roots
//! `network` → `vms` → `dns` (`depends_on` in `.planbot.toml`), each with its own state in the
//! fake GitLab's managed state (the engine's `http` backend, written by each root's `backend`
//! block). `vms` reads `network`'s output `subnet` with a `terraform_remote_state` on that state,
//! read at apply time (its `depends_on` on a resource of `vms` that the MR changes defers the
//! read): applied after `network`, `vms` gets the subnet `network` just wrote.

use crate::apply_story::{call_apply, last_line, with_workers};
use crate::support::service::TestService;
use crate::support::world::World;

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

/// Every root on `main` with its state backend and nothing to manage yet.
fn world(engine: &std::path::Path) -> World {
    World::builder()
        .engine(engine)
        .state_by_hand()
        .prepare(|gitlab, p| {
            for r in ["network", "vms", "dns", "backup"] {
                let url = state_url(gitlab.url(), p.project.id, r);
                p.files
                    .push((format!("stacks/{r}/backend.tf"), backend(&url)));
            }
        })
        .planbot_toml(PLANBOT_TOML)
        .build()
}

/// The address of state `name` of project `id` in the fake GitLab at `gitlab`.
fn state_url(gitlab: &str, id: u64, name: &str) -> String {
    format!("{gitlab}/api/v4/projects/{id}/terraform/state/{name}")
}

/// A root's `backend "http"` on its own managed state at `url` (user and password come from
/// the engine's environment: a reader's token for MR plans, a writer's for applies).
fn backend(url: &str) -> String {
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
fn vms_tf(w: &World, release: &str) -> String {
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
        network = w.state_url("network"),
    )
}

/// Alice pushes `files` on `branch`, opens an MR, GitLab delivers the webhook; the MR once its
/// plan succeeded.
async fn reviewed_mr(w: &World, s: &TestService, branch: &str, files: &[(&str, &str)]) -> u64 {
    let iid = w.open_mr(s, branch, files).await;
    let (note, status) = w.plan_of(s, iid).await;
    assert!(status.starts_with("success: "), "{status}\n{note}");
    iid
}

/// Merge the MR and run the manual apply job of `main`'s new head: its log, and what the
/// `planbot/apply` status of the merged commit says (`state: description`).
async fn merge_and_apply(w: &World, s: &TestService, iid: u64, job_id: u64) -> (String, String) {
    let log = w.merge_and_apply(s, iid, job_id).await;
    (log, w.status_says(&w.head("main"), "planbot/apply"))
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
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    let network = network_tf("10.0.2.0/24", false);
    let vms = vms_tf(&w, "v1");
    let iid = reviewed_mr(
        &w,
        &s,
        "subnet-and-vm",
        &[
            ("stacks/network/main.tf", &network),
            ("stacks/vms/main.tf", &vms),
        ],
    )
    .await;
    let (log, status) = merge_and_apply(&w, &s, iid, 41).await;
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
    let note = w
        .gitlab
        .notes(&w.project, iid)
        .into_iter()
        .map(|n| n.body)
        .find(|b| b.contains("planbot · applied"))
        .expect("the result note");
    assert!(note.contains("- root `vms`: 2 added"), "{note}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_network_apply_stops_vms_and_dns_and_says_why_and_backup_still_applies() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    let network = network_tf("10.0.2.0/24", true);
    let vms = vms_tf(&w, "v1");
    let backup = "resource \"terraform_data\" \"nightly\" {\n  input = \"02:00\"\n}\n";
    let iid = reviewed_mr(
        &w,
        &s,
        "subnet-vm-and-backup",
        &[
            ("stacks/network/main.tf", &network),
            ("stacks/vms/main.tf", &vms),
            ("stacks/backup/main.tf", backup),
        ],
    )
    .await;
    let (log, status) = merge_and_apply(&w, &s, iid, 42).await;
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
    let note = w
        .gitlab
        .notes(&w.project, iid)
        .into_iter()
        .map(|n| n.body)
        .find(|b| b.contains("apply of"))
        .expect("the result note");
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
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;
    // First the subnet alone, reviewed and applied.
    let first = network_tf("10.0.1.0/24", false);
    let iid = reviewed_mr(&w, &s, "subnet", &[("stacks/network/main.tf", &first)]).await;
    let (log, _) = merge_and_apply(&w, &s, iid, 43).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");

    // Then a new subnet, and a VM reviewed on the old one.
    let network = network_tf("10.0.2.0/24", false);
    let vms = vms_reading_now_tf(&w.state_url("network"));
    let iid = reviewed_mr(
        &w,
        &s,
        "new-subnet-and-vm",
        &[
            ("stacks/network/main.tf", &network),
            ("stacks/vms/main.tf", &vms),
        ],
    )
    .await;
    let (log, status) = merge_and_apply(&w, &s, iid, 44).await;
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
    let job = w.click_apply(45);
    let (_, log) = call_apply(&s, &job.token, &format!(r#"{{"confirm":"{confirm}"}}"#)).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(w.state("vms").unwrap().contains("10.0.2.0/24"));
}

/// `network` with a step whose apply writes into `vms`'s directory: a `backend "local"`
/// override (and the `.terraform` its `init` left), so `vms`'s plan after `network` applied
/// keeps its state in the checkout, where its first plan did not.
fn network_moving_vms_state_tf() -> String {
    let mut tf = network_tf("10.0.2.0/24", false);
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
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let network = network_moving_vms_state_tf();
    let vms = vms_tf(&w, "v1");
    let files = [
        ("stacks/network/main.tf", network.as_str()),
        ("stacks/vms/main.tf", vms.as_str()),
    ];
    let iid = reviewed_mr(&w, &s, "subnet-and-vm", &files).await;
    let (log, status) = merge_and_apply(&w, &s, iid, 46).await;
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
    let note = w
        .gitlab
        .notes(&w.project, iid)
        .into_iter()
        .map(|n| n.body)
        .find(|b| b.contains("apply of"))
        .expect("the apply's result note");
    assert!(
        note.contains(&format!("- root `vms`: not applied: {refusal}")),
        "{note}"
    );
}
