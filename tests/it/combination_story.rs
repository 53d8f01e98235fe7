//! One story per merge method (fast-forward, merge commit, squash) of everything together, as a
//! team sees it: planbot run with the README's five-minute-start config (GitLab-managed state, no
//! backend block anywhere), a repository of three roots `network` → `vms` → `dns` that read each
//! other's outputs with `terraform_remote_state` at GitLab's own address (as GitLab's docs write
//! it) and share the local module `modules/vm`, and a policy set on `main`. An MR changes the
//! module and the network: the note says why each root was planned, draws the graph, marks the
//! roots planned against an upstream before its apply, and shows each plan with the values read
//! from the states; a targeted `planbot plan` comment says so at the note's top, and a plain one
//! plans in full again; then the merge, and the apply job applies `network`, plans `vms` again
//! against its new outputs and applies it, then `dns`, each behind the policy gate.

use crate::support::service::TestService;
use crate::support::world::{
    call_apply, documented_block, log_shows, verdict, with_workers, World,
};

/// `main`'s `.planbot.toml`: the roots as docs/workflow.md ("Several roots") writes them, and the
/// policy set.
fn planbot_toml() -> String {
    let roots = crate::support::doc_block("docs/workflow.md", r#"depends_on = ["vms"]"#);
    format!(
        "{roots}\n[[policy_sets]]\nname = \"vm-sizes\"\npath = \"policy\"\nowners = [\"group:infra/capacity\"]\n"
    )
}

/// `main`'s policy: no VM above 8 cores.
const VM_SIZES_REGO: &str = r#"package main

import rego.v1

deny contains msg if {
	some rc in input.resource_changes
	rc.type == "terraform_data"
	rc.name == "vm"
	rc.change.after.input.cores > 8
	msg := sprintf("%s asks for %d cores; 8 at most", [rc.address, rc.change.after.input.cores])
}
"#;

/// How the project merges (Settings → Merge requests), and whether the MR squashes.
#[derive(Clone, Copy, Debug)]
enum Method {
    /// `ff`: `main` moves to the MR's head.
    FastForward,
    /// `merge`: a merge commit of `main` and the MR's head.
    MergeCommit,
    /// `ff` with "Squash commits": one new commit with the MR's changes lands on `main`.
    Squash,
}

/// The world of every story: planbot configured as the README's five-minute start says, the
/// project merging the `how` way, carol in `infra/capacity` (the policy's owners), and `main`
/// with `.planbot.toml` and the policy but no code yet.
fn world(how: Method) -> World {
    let w = World::builder()
        .five_minute_start()
        .group_member("infra/capacity", "carol", 30)
        .planbot_toml(&planbot_toml())
        .file("policy/vm_sizes.rego", VM_SIZES_REGO)
        .build();
    let method = match how {
        Method::MergeCommit => "merge",
        Method::FastForward | Method::Squash => "ff",
    };
    w.gitlab.set_merge_method(&w.project, method);
    w
}

/// GitLab's address of the project's state `name`, the project by `id` or by its URL-encoded
/// path, as GitLab's docs write it.
fn gitlab_state(w: &World, project: &str, name: &str) -> String {
    format!(
        "{}/api/v4/projects/{project}/terraform/state/{name}",
        w.gitlab.url()
    )
}

/// The project's path as GitLab's API takes it in place of its id (`infra%2Fhomelab`).
fn by_path(w: &World) -> String {
    w.project.path.replace('/', "%2F")
}

/// `modules/vm` as it lands on day one: a VM (a `terraform_data` stands in for the Proxmox VM)
/// with 2 cores on `subnet`.
const MODULE_VM: &str = r#"variable "name" {
  type = string
}

variable "subnet" {
  type    = string
  default = "isolated"
}

resource "terraform_data" "vm" {
  input = {
    name   = var.name
    subnet = var.subnet
    cores  = 2
  }
}

output "name" {
  value = var.name
}

output "subnet" {
  value = terraform_data.vm.output.subnet
}
"#;

/// `modules/vm` as the MR changes it: `cores` cores, and each VM's name in the lab's domain,
/// which the module reads from `network`'s outputs (GitLab's address, the project by path).
fn module_vm_v2(w: &World, cores: u32) -> String {
    MODULE_VM
        .replace("    cores  = 2\n", &format!("    cores  = {cores}\n"))
        .replace(
            "    name   = var.name\n",
            "    name   = var.name\n    fqdn   = \"${var.name}.${data.terraform_remote_state.network.outputs.domain}\"\n",
        )
        + &format!(
            r#"
# The lab's domain, from `network`'s outputs.
data "terraform_remote_state" "network" {{
  backend = "http"
  config = {{
    address = "{}"
  }}
}}
"#,
            gitlab_state(w, &by_path(w), "network")
        )
}

/// `network`: the subnet and the lab's domain, as outputs.
fn network_tf(subnet: &str) -> String {
    format!(
        r#"resource "terraform_data" "subnet" {{
  input = "{subnet}"
}}

output "subnet" {{
  value = terraform_data.subnet.output
}}

output "domain" {{
  value = "lab.internal"
}}
"#
    )
}

/// `vms`: the template VM, then `web` on `network`'s subnet. `network`'s state is read with the
/// recipe of docs/workflow.md ("Reading another root's outputs") as written — GitLab's address,
/// the project by id, the credentials from variables (which planbot's runs leave unset) — at
/// this GitLab and project, once the template is made (its `depends_on`): when the template
/// changes, at apply time, after `network` applied.
fn vms_tf(w: &World) -> String {
    let recipe = documented_block("remote state recipe: stacks/vms/network.tf");
    let (read, _) = recipe
        .split_once("\n\nresource ")
        .expect("the recipe's data block, then its resource");
    let read = read
        .replace("https://gitlab.example.com", w.gitlab.url())
        .replace("/projects/42/", &format!("/projects/{}/", w.project.id));
    let (read, end) = read.rsplit_once('}').unwrap();
    assert_eq!(end, "", "the data block ends the recipe's first part");
    format!(
        r#"variable "gitlab_username" {{
  type    = string
  default = null
}}

variable "gitlab_token" {{
  type      = string
  default   = null
  sensitive = true
}}

# The template the other VMs are cloned from: made first, on no network.
module "template" {{
  source = "../../modules/vm"
  name   = "template"
}}

{read}  depends_on = [module.template]
}}

module "web" {{
  source = "../../modules/vm"
  name   = "web"
  subnet = data.terraform_remote_state.network.outputs.subnet
}}

output "web" {{
  value = {{
    name   = module.web.name
    subnet = module.web.subnet
  }}
}}
"#
    )
}

/// `dns`: its resolver VM, and the reverse zone of the subnet `web` is on, read from `vms`'s
/// state (the address a variable's default, the project by path) once the resolver is made.
fn dns_tf(w: &World) -> String {
    format!(
        r#"variable "vms_state" {{
  description = "GitLab's address of the state of vms"
  type        = string
  default     = "{address}"
}}

module "resolver" {{
  source = "../../modules/vm"
  name   = "resolver"
}}

data "terraform_remote_state" "vms" {{
  backend = "http"
  config = {{
    address = var.vms_state
  }}
  depends_on = [module.resolver]
}}

resource "terraform_data" "reverse_zone" {{
  input = {{
    subnet = data.terraform_remote_state.vms.outputs.web.subnet
    hosts  = [data.terraform_remote_state.vms.outputs.web.name]
  }}
}}
"#,
        address = gitlab_state(w, &by_path(w), "vms"),
    )
}

/// Merge MR `iid` the project's way (as alice); GitLab tells planbot. Returns the commit that
/// landed on `main`, after checking it is what GitLab lands for that way.
async fn merge(w: &World, s: &TestService, iid: u64, how: Method) -> String {
    let before = w.head("main");
    let head = w.gitlab.mr_sha(&w.project, iid);
    w.gitlab
        .set_squash(&w.project, iid, matches!(how, Method::Squash));
    let landed = w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let mr = w.gitlab.mr_json(&w.project, iid);
    let parent = |n: u8| w.gitlab.ref_sha(&w.project, &format!("{landed}^{n}"));
    match how {
        Method::FastForward => {
            assert_eq!(landed, head, "main's head is the MR's head");
            assert!(mr["merge_commit_sha"].is_null(), "{mr}");
        }
        Method::MergeCommit => {
            assert_eq!(mr["merge_commit_sha"], landed.as_str(), "{mr}");
            assert_eq!((parent(1), parent(2)), (Some(before), Some(head)));
        }
        Method::Squash => {
            assert_eq!(mr["squash_commit_sha"], landed.as_str(), "{mr}");
            assert!(mr["merge_commit_sha"].is_null(), "{mr}");
            assert_ne!(landed, head);
            assert_eq!((parent(1), parent(2)), (Some(before), None), "one commit");
        }
    }
    let hook = w.gitlab.mr_webhook(&w.project, iid).action("merge").body();
    w.hook(s, "Merge Request Hook", &format!("merge-{iid}"), &hook)
        .await;
    landed
}

/// Alice clicks the apply job `id` of `main`'s head: its log, which planbot streams.
async fn click_apply(w: &World, s: &TestService, id: u64) -> String {
    let job = w.click_apply(id);
    let (status, log) = call_apply(s, &job.token, "").await;
    assert_eq!(status, 200, "{log}");
    log
}

/// The world, planbot serving it, and day one: the lab's code lands through a first MR (every
/// root planned from no state), merged the project's way and applied in order, so `network`,
/// `vms` and `dns` have their states in GitLab.
async fn day_one(how: Method) -> (World, TestService) {
    let w = world(how);
    let s = w.serve(with_workers()).await;
    let iid = w
        .open_mr(
            &s,
            "the-lab",
            &[
                ("modules/vm/main.tf", MODULE_VM),
                ("stacks/network/main.tf", &network_tf("10.0.1.0/24")),
                ("stacks/vms/main.tf", &vms_tf(&w)),
                ("stacks/dns/main.tf", &dns_tf(&w)),
            ],
        )
        .await;
    let (note, status) = w.plan_of(&s, iid).await;
    assert_eq!(
        status, "success: network: 1 to add; vms: 2 to add; dns: 2 to add",
        "{note}"
    );
    merge(&w, &s, iid, how).await;
    let log = click_apply(&w, &s, 11).await;
    assert_eq!(verdict(&log), "planbot: apply succeeded", "{log}");
    assert!(w.state("dns").unwrap().contains("10.0.1.0/24"), "{log}");
    (w, s)
}

/// The root's section of a note: from its `#### Root` heading to the next root's, or the footer.
fn section<'a>(note: &'a str, root: &str) -> &'a str {
    let start = note
        .find(&format!("#### Root `{root}`"))
        .unwrap_or_else(|| panic!("no section of `{root}` in:\n{note}"));
    let rest = &note[start + 1..];
    let end = rest
        .find("#### Root `")
        .or_else(|| rest.find("<sub>"))
        .unwrap_or(rest.len());
    &note[start..start + 1 + end]
}

/// Root `root`'s fingerprint in the note's footer (12 characters).
fn fingerprint(note: &str, root: &str) -> String {
    let at = format!("fingerprint `{root}` `");
    let i = note.find(&at).unwrap_or_else(|| panic!("{at}: {note}")) + at.len();
    note[i..i + 12].to_string()
}

/// The position of the first line of `log` containing `text` (the test fails without one).
fn line_of(log: &str, text: &str) -> usize {
    log.lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("no line with {text:?} in:\n{log}"))
}

/// Alice comments `text` on MR `iid`; the plan note once planbot planned the same head again
/// into a note `done` accepts, and what `planbot/plan` says then.
async fn comment_and_replan(
    w: &World,
    s: &TestService,
    iid: u64,
    text: &str,
    done: impl Fn(&str) -> bool,
) -> (String, String) {
    let head = w.gitlab.mr_sha(&w.project, iid);
    w.say(s, iid, &w.alice(), text).await;
    s.after_job_ends(&format!("the plan after `{text}`"), 90, || async {
        w.gitlab
            .plan_note(&w.project, iid)
            .is_some_and(|n| done(&n))
            && w.status(&head, "planbot/plan")
                .is_some_and(|st| !matches!(st.state.as_str(), "pending" | "running"))
    })
    .await;
    (w.note(iid), w.status_says(&head, "planbot/plan"))
}

/// What `planbot/plan` says of the MR's full plan.
const FULL_PLAN: &str = "success: network: 1 to change; vms: 2 to change; dns: 2 to change";

/// Alice's MR: every VM gets `cores` cores and its name in the lab's domain (`modules/vm`), the
/// network a new subnet. Returns it once its plan and policy statuses are final.
async fn open_the_mr(w: &World, s: &TestService, cores: u32) -> u64 {
    let iid = w
        .open_mr(
            s,
            "cores-and-subnet",
            &[
                ("modules/vm/main.tf", &module_vm_v2(w, cores)),
                ("stacks/network/main.tf", &network_tf("10.0.2.0/24")),
            ],
        )
        .await;
    let head = w.gitlab.mr_sha(&w.project, iid);
    w.final_statuses(s, &head, &["planbot/plan", "planbot/policy"])
        .await;
    iid
}

/// The review of 4 cores a VM and the new subnet: the note says why each root was planned,
/// draws the roots, marks the dependants with the upstream outputs that move under them, shows
/// each plan with the values read from the states, and the policy; the statuses say the same.
/// Returns the MR and its note.
async fn review(w: &World, s: &TestService) -> (u64, String) {
    let iid = open_the_mr(w, s, 4).await;
    let head = w.gitlab.mr_sha(&w.project, iid);
    let note = w.note(iid);
    log_shows(
        &note,
        &[
            " · 3 of 3 roots with changes",
            "| <code>network</code> | 0 | 1 | 0 | 0 | 0 |",
            "| <code>vms</code> | 0 | 2 | 0 | 0 | 0 |",
            "| <code>dns</code> | 0 | 2 | 0 | 0 | 0 |",
            "**Why these roots were planned**\n\n\
             - `network`: its files changed (`stacks/network/main.tf`)\n\
             - `vms`: uses `modules/vm`, changed (`modules/vm/main.tf`)\n\
             - `dns`: uses `modules/vm`, changed (`modules/vm/main.tf`)\n",
            "```mermaid\ngraph LR\n  r0[\"network\"]\n  r1[\"vms\"]\n  r2[\"dns\"]\n  r0 --> r1\n  r1 --> r2\n```",
        ],
    );
    // Each root reads the states it depends on: no `depends_on` to suggest.
    assert!(!note.contains("💡"), "{note}");
    // Every file is formatted, planbot's own in the checkout being none of the MR's.
    assert!(!note.contains("Not formatted"), "{note}");

    let network = section(&note, "network");
    log_shows(
        network,
        &[
            "- ✅ `vm-sizes` (`policy`): passed",
            "~ input = \"10.0.1.0/24\" -> \"10.0.2.0/24\"",
            "~ subnet = \"10.0.1.0/24\" -> (known after apply)",
        ],
    );
    assert!(!network.contains("⏳"), "nothing above network: {network}");
    let against_network = "⏳ Planned against `network` before its apply: re-planned by the apply job. `network`'s plan changes the output `subnet` (changed, known after its apply).";
    log_shows(
        section(&note, "vms"),
        &[
            "- ✅ `vm-sizes` (`policy`): passed",
            against_network,
            "<code>~ module.template.terraform_data.vm</code> — updated in place",
            "<code>~ module.web.terraform_data.vm</code> — updated in place",
            "~ input.cores = 2 -> 4",
            // The domain, read from `network`'s state when the MR planned, through the module.
            "+ input.fqdn = \"template.lab.internal\"",
            "+ input.fqdn = \"web.lab.internal\"",
            // The subnet, read once the template is made: after `network`'s apply.
            "~ input.subnet = \"10.0.1.0/24\" -> (known after apply)",
            "~ web.subnet = \"10.0.1.0/24\" -> (known after apply)",
        ],
    );
    log_shows(
        section(&note, "dns"),
        &[
            "- ✅ `vm-sizes` (`policy`): passed",
            against_network,
            "⏳ Planned against `vms` before its apply: re-planned by the apply job. `vms`'s plan changes the output `web` (changed).",
            "<code>~ terraform_data.reverse_zone</code> — updated in place",
            "~ input.subnet = \"10.0.1.0/24\" -> (known after apply)",
            "+ input.fqdn = \"resolver.lab.internal\"",
        ],
    );

    assert_eq!(w.status_says(&head, "planbot/plan"), FULL_PLAN);
    assert_eq!(
        w.status_says(&head, "planbot/policy"),
        "success: 3 policy sets passed"
    );
    (iid, note)
}

/// Alice plans `vms` targeted at its template from a comment: the note says so at its top and
/// plans only the template there, the status too; then a plain `planbot plan` plans in full
/// again, the plan reviewed before.
async fn target_then_plan_in_full(w: &World, s: &TestService, iid: u64, full: &str) {
    let (targeted, status) = comment_and_replan(
        w,
        s,
        iid,
        "planbot plan vms -- -target=module.template",
        |n| n.contains("Targeted plan"),
    )
    .await;
    let top = targeted.split("### ").next().unwrap();
    assert!(
        top.contains("> ⚠️ **Targeted plan of root `vms`** — targeted: `module.template`.")
            && top.contains(
                "the apply job refuses this plan unless confirmed with `PLANBOT_CONFIRM`"
            )
            && top.contains("Comment `planbot plan` for the full plan"),
        "{targeted}"
    );
    log_shows(&targeted, &["| <code>vms</code> | 0 | 1 | 0 | 0 | 0 |"]);
    let vms = section(&targeted, "vms");
    assert!(
        vms.contains("module.template.terraform_data.vm")
            && !vms.contains("module.web.terraform_data.vm"),
        "{vms}"
    );
    assert_eq!(
        status,
        "success: network: 1 to change; vms (targeted plan: 1 targeted): 1 to change; dns: 2 to change"
    );
    assert_ne!(fingerprint(&targeted, "vms"), fingerprint(full, "vms"));

    let (again, status) =
        comment_and_replan(w, s, iid, "planbot plan", |n| !n.contains("Targeted plan")).await;
    assert_eq!(status, FULL_PLAN);
    for root in ["network", "vms", "dns"] {
        assert_eq!(fingerprint(&again, root), fingerprint(full, root), "{root}");
    }
}

/// The policy lines of the apply's result note (`- …` under "**Policies** this apply relied
/// on:").
fn relied_on(result: &str) -> Vec<&str> {
    result
        .split_once("**Policies** this apply relied on:")
        .map(|(_, after)| after.split("<sub>").next().unwrap())
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.strip_prefix("- "))
        .collect()
}

/// The newest result note of an apply on MR `iid`.
fn result_note(w: &World, iid: u64) -> String {
    w.notes_containing(iid, "planbot · ")
        .into_iter()
        .rfind(|n| !n.contains(planbot::core::render::NOTE_MARKER))
        .expect("an apply result note")
        .replace('\u{200B}', "")
}

/// What the apply did, as its log, GitLab's states, the status and the notes say: `network`
/// applied, `vms` planned again against its new outputs and applied, then `dns`, each plan the
/// one reviewed (`note`) and each passed by the policy set.
fn applied_in_order(w: &World, iid: u64, landed: &str, note: &str, log: &str) {
    assert_eq!(verdict(log), "planbot: apply succeeded", "{log}");
    log_shows(
        log,
        &[&format!(
            "planbot: commit `{}` is merge request !{iid}",
            &landed[..8]
        )],
    );
    for (root, changes) in [("network", 1), ("vms", 2), ("dns", 2)] {
        log_shows(
            log,
            &[
                &format!(
                    "planbot: root `{root}`: {changes} to change · fingerprint `{}`",
                    fingerprint(note, root)
                ),
                &format!("planbot: root `{root}`: the plan is the one reviewed on !{iid}"),
                &format!("planbot: root `{root}`: 1 policy set passed on the reviewed plan"),
            ],
        );
    }
    let order = [
        line_of(log, "planbot: root `network`: applying the reviewed plan"),
        line_of(
            log,
            "planbot: root `vms`: `network`, which it depends on, applied: planning it again against its new outputs",
        ),
        line_of(log, "planbot: root `vms`: applying the reviewed plan"),
        line_of(
            log,
            "planbot: root `dns`: `vms`, which it depends on, applied: planning it again against its new outputs",
        ),
        line_of(log, "planbot: root `dns`: applying the reviewed plan"),
    ];
    assert!(order.windows(2).all(|p| p[0] < p[1]), "{order:?}\n{log}");

    // GitLab's states hold the new outputs: `vms`'s VM is on the subnet `network` just wrote,
    // and `dns`'s zone is the one `vms` then wrote.
    assert!(w.state("network").unwrap().contains("\"10.0.2.0/24\""));
    let vms = w.state("vms").unwrap();
    assert!(
        vms.contains("\"10.0.2.0/24\"") && !vms.contains("10.0.1.0/24"),
        "{vms}"
    );
    assert!(vms.contains("\"web.lab.internal\""), "{vms}");
    let dns = w.state("dns").unwrap();
    assert!(
        dns.contains("\"10.0.2.0/24\"") && !dns.contains("10.0.1.0/24"),
        "{dns}"
    );

    // The status and the result note say the same, the note with each verdict relied on once.
    let summary = "network: 1 changed; vms: 2 changed; dns: 2 changed";
    assert_eq!(
        w.status_says(landed, "planbot/apply"),
        format!("success: applied: {summary}")
    );
    let result = result_note(w, iid);
    assert!(
        result.starts_with(&format!(
            "### 🟢 planbot · applied `{}` by @alice: {summary}\n\n- root `network`: 1 changed\n- root `vms`: 2 changed\n- root `dns`: 2 changed\n",
            &landed[..8]
        )),
        "{result}"
    );
    assert_eq!(
        relied_on(&result),
        [
            "root `network`: 1 policy set passed on the reviewed plan",
            "root `vms`: 1 policy set passed on the reviewed plan",
            "root `dns`: 1 policy set passed on the reviewed plan",
        ],
        "{result}"
    );
    let banner = w.gitlab.plan_note(&w.project, iid).unwrap();
    assert!(
        banner.contains("> **Merged and applied** by the `planbot-apply` [job 21](")
            && banner.contains(&format!("at `{}`", &landed[..8])),
        "{banner}"
    );
}

/// The story of one merge method, as the team lives it.
async fn story(how: Method) {
    let (w, s) = day_one(how).await;
    let (iid, note) = review(&w, &s).await;
    target_then_plan_in_full(&w, &s, iid, &note).await;
    let landed = merge(&w, &s, iid, how).await;
    s.after_job_ends("the merged banner", 60, || async {
        w.gitlab
            .plan_note(&w.project, iid)
            .is_some_and(|n| n.contains("Merged — waiting for the apply job on `main`"))
    })
    .await;
    let log = click_apply(&w, &s, 21).await;
    applied_in_order(&w, iid, &landed, &note, &log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_forward_network_vms_and_dns_reviewed_targeted_merged_and_applied_in_order() {
    require_engine!();
    story(Method::FastForward).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_commit_network_vms_and_dns_reviewed_targeted_merged_and_applied_in_order() {
    require_engine!();
    story(Method::MergeCommit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squash_network_vms_and_dns_reviewed_targeted_merged_and_applied_in_order() {
    require_engine!();
    story(Method::Squash).await;
}

/// The same MR asking 16 cores a VM: the policy set fails on `vms` and `dns`, and the note and
/// `planbot/policy` say so. Merged all the same, the apply job refuses before applying anything
/// (`network` neither), naming the set, its message and who may approve; carol, an owner,
/// approves on the merged MR, and the retried job applies in order relying on her approval of
/// each root, which the job's log, the result note and the status each say once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_policy_set_stops_the_ordered_apply_until_an_owner_approves() {
    require_engine!();
    let (w, s) = day_one(Method::MergeCommit).await;
    let iid = open_the_mr(&w, &s, 16).await;
    let note = w.note(iid);
    let head = w.gitlab.mr_sha(&w.project, iid);
    let too_big = "module.template.terraform_data.vm asks for 16 cores; 8 at most";
    assert!(
        section(&note, "network").contains("- ✅ `vm-sizes` (`policy`): passed"),
        "{note}"
    );
    for root in ["vms", "dns"] {
        log_shows(
            section(&note, root),
            &[
                "- ❌ `vm-sizes` (`policy`): failed",
                "comment `planbot approve policies`: members of `infra/capacity`",
            ],
        );
    }
    log_shows(section(&note, "vms"), &[too_big]);
    let (state, description) = w.status_of(&head, "planbot/policy").unwrap();
    assert_eq!(state, "failed", "{description}");
    assert!(
        description.starts_with("policy set vm-sizes failed (root vms): "),
        "{description}"
    );

    let landed = merge(&w, &s, iid, Method::MergeCommit).await;
    let log = click_apply(&w, &s, 21).await;
    assert!(
        verdict(&log).starts_with(
            "planbot: apply refused: policy set `vm-sizes` failed on the reviewed plan of root `vms`: "
        ) && verdict(&log).contains("asks for 16 cores; 8 at most"),
        "{log}"
    );
    log_shows(
        &log,
        &["planbot: An owner of `vm-sizes` (`group:infra/capacity`) may approve this plan by commenting `planbot approve policies` on the merge request; then retry this job."],
    );
    assert!(!log.contains("applying"), "nothing applied: {log}");
    assert!(w.state("network").unwrap().contains("\"10.0.1.0/24\""));
    assert!(w.state("vms").unwrap().contains("\"10.0.1.0/24\""));
    let refused = w.status_says(&landed, "planbot/apply");
    assert!(refused.starts_with("failed: "), "{refused}");
    let result = result_note(&w, iid);
    assert!(
        result.starts_with(&format!(
            "### 🔴 planbot · apply of `{}` refused: nothing was applied",
            &landed[..8]
        )),
        "{result}"
    );

    // Carol approves on the merged MR; the retried job applies, upstream first.
    let reply = w
        .comment(&s, iid, &w.user("carol"), "planbot approve policies")
        .await;
    assert!(
        reply.contains("- `vm-sizes` (root `vms`)") && reply.contains("- `vm-sizes` (root `dns`)"),
        "{reply}"
    );
    let log = click_apply(&w, &s, 22).await;
    assert_eq!(verdict(&log), "planbot: apply succeeded", "{log}");
    let approved = |root: &str| {
        format!("root `{root}`: policy set `vm-sizes` failed on the reviewed plan; approved for it by @carol")
    };
    let order = [
        line_of(
            &log,
            "planbot: root `network`: 1 policy set passed on the reviewed plan",
        ),
        line_of(&log, &approved("vms")),
        line_of(&log, &approved("dns")),
        line_of(&log, "planbot: root `network`: applying the reviewed plan"),
        line_of(&log, "planbot: root `vms`: applying the reviewed plan"),
        line_of(&log, "planbot: root `dns`: applying the reviewed plan"),
    ];
    assert!(order.windows(2).all(|p| p[0] < p[1]), "{order:?}\n{log}");
    let vms = w.state("vms").unwrap();
    assert!(
        vms.contains("\"10.0.2.0/24\"") && vms.contains("\"cores\": 16"),
        "{vms}"
    );
    assert_eq!(
        w.status_says(&landed, "planbot/apply"),
        "success: applied: network: 1 changed; vms: 2 changed; dns: 2 changed · 2 failing policy sets approved by their owners (the MR note names them)"
    );
    let result = result_note(&w, iid);
    assert_eq!(
        relied_on(&result),
        [
            "root `network`: 1 policy set passed on the reviewed plan".to_string(),
            approved("vms"),
            approved("dns"),
        ],
        "{result}"
    );
}
