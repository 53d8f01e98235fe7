//! Stories of the policy gate with the real engine, real git and the fake GitLab: the default
//! branch's policy checks the MR's plan even when the MR rewrites it, the apply of the reviewed
//! plan is refused naming the set, an owner's `planbot approve policies` (a member of the
//! owning group, as GitLab answers) lets a retried apply job apply, a non-owner is told who may
//! approve, and a push clears an approval. planbot's own (operator) sets check every plan. An MR
//! that renames its root and drops its set is judged at apply by the sets of the default branch
//! before the merge, with or without a confirm; an approval binds to the head its comment saw.

use crate::support::fake_gitlab::{FakeJob, DEVELOPER};
use crate::support::service::TestService;
use crate::support::world::{verdict, with_workers, World};

/// The repository's policy: every new VM needs the capacity team's approval.
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

/// What the MR writes over it: a policy that lets everything through.
const RELAXED_REGO: &str = r#"package main

import rego.v1

deny contains msg if {
	false
	msg := "never"
}
"#;

/// planbot's own set, in the older syntax: a warning on every VM.
const OPERATOR_REGO: &str = r#"package main

warn[msg] {
	rc := input.resource_changes[_]
	rc.type == "terraform_data"
	rc.name == "vm"
	msg := sprintf("%s: no backup job is declared for it", [rc.address])
}
"#;

const PLANBOT_TOML: &str = r#"[[policy_sets]]
name = "new-vms"
path = "policies"
owners = ["group:infra/capacity"]
"#;

/// `main` with the policy `new-vms` (owned by `infra/capacity`: carol is in it) and a root
/// with no VM; bob a Developer; planbot's own set `backups`; the state backend by hand.
fn world(engine: &std::path::Path) -> World {
    World::builder()
        .engine(engine)
        .state_by_hand()
        .member("bob", DEVELOPER)
        .group_member("infra/capacity", "carol", 30)
        .planbot_toml(PLANBOT_TOML)
        .files(&[
            ("policies/new_vms.rego", NEW_VMS_REGO),
            ("main.tf", &crate::support::infra_main_tf(&[])),
        ])
        .operator_policy("backups", &[("backups.rego", OPERATOR_REGO)])
        .build()
}

/// The plan note of the MR's head once its plan and policy statuses are final.
async fn planned(w: &World, s: &TestService, iid: u64) -> String {
    let head = w.gitlab.mr_sha(&w.project, iid);
    w.final_statuses(s, &head, &["planbot/plan", "planbot/policy"])
        .await;
    w.note(iid)
}

/// What `sha`'s `planbot/policy` status says: `(state, description)`.
fn policy_status(w: &World, sha: &str) -> (String, String) {
    w.status_of(sha, "planbot/policy")
        .expect("a planbot/policy status")
}

/// The state `core`, "" when there is none.
fn core_state(w: &World) -> String {
    w.state("core").unwrap_or_default()
}

/// What the CI job sees: the streamed log.
async fn call_apply(s: &TestService, job: &FakeJob) -> String {
    call_apply_with(s, job, "{}").await
}

/// The same with a request body (`{"confirm": …}`: the job's `PLANBOT_CONFIRM`).
async fn call_apply_with(s: &TestService, job: &FakeJob, body: &str) -> String {
    let (status, log) = crate::support::world::call_apply(s, &job.token, body).await;
    assert_eq!(status, 200);
    log
}

fn unescaped(note: &str) -> String {
    note.replace("&quot;", "\"")
        .replace("&#91;", "[")
        .replace("&#93;", "]")
        .replace("&#96;", "`")
        .replace('\u{200B}', "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_branchs_policy_blocks_the_apply_until_an_owner_approves_the_reviewed_plan() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    // The MR adds two VMs and rewrites the policy that would stop them.
    let tf = crate::support::infra_main_tf(&["blocky", "gitlab"]);
    let iid = w
        .open_mr(
            &s,
            "two-vms",
            &[("main.tf", &tf), ("policies/new_vms.rego", RELAXED_REGO)],
        )
        .await;
    let note = unescaped(&planned(&w, &s, iid).await);
    assert!(
        note.contains("**Policies** · sets from the default branch `main`"),
        "{note}"
    );
    assert!(
        note.contains("- ❌ `new-vms` (`policies`): failed"),
        "the default branch's policy, not the MR's: {note}"
    );
    assert!(
        note.contains(
            "terraform_data.vm[\"gitlab\"] is a new VM: the capacity team approves new VMs"
        ),
        "{note}"
    );
    assert!(
        note.contains("comment `planbot approve policies`: members of `infra/capacity`"),
        "{note}"
    );
    // planbot's own set checks the plan too (older syntax, a warning only).
    assert!(
        note.contains("- ✅ `backups` (planbot's): passed"),
        "{note}"
    );
    assert!(
        note.contains("⚠️ terraform_data.vm[\"blocky\"]: no backup job is declared for it"),
        "{note}"
    );
    assert!(!note.contains("apply-canary-password-7f3a"));
    let head = w.gitlab.mr_sha(&w.project, iid);
    let (state, description) = policy_status(&w, &head);
    assert_eq!(state, "failed");
    assert!(
        description.starts_with("policy set new-vms failed (root default): terraform_data.vm"),
        "{description}"
    );

    // Bob is no owner: his approval is refused, and the reply says who may approve.
    let reply = w
        .comment(&s, iid, &w.user("bob"), "planbot approve policies")
        .await;
    assert!(
        reply.contains("was not recorded: you are not an owner"),
        "{reply}"
    );
    assert!(
        reply.contains("- `new-vms` (root `default`): members of `infra/capacity`"),
        "{reply}"
    );

    // Merged without an approval (the merge also relaxed the policy on main): refused, naming
    // the set, its message and who may approve. Nothing is applied.
    w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let log = call_apply(&s, &w.click_apply(41)).await;
    assert!(
        verdict(&log).starts_with(
            "planbot: apply refused: policy set `new-vms` failed on the reviewed plan of root `default`: terraform_data.vm["
        ),
        "{log}"
    );
    assert!(
        log.contains("An owner of `new-vms` (`group:infra/capacity`) may approve this plan by commenting `planbot approve policies` on the merge request; then retry this job."),
        "{log}"
    );
    assert_eq!(core_state(&w), "", "nothing applied");

    // Carol, a member of the owning group, approves after the merge.
    let reply = w
        .comment(&s, iid, &w.user("carol"), "planbot approve policies")
        .await;
    assert!(
        reply.contains("approved, for the plan shown for")
            && reply.contains("- `new-vms` (root `default`)")
            && reply.contains("A new push shows a new plan and clears this approval."),
        "{reply}"
    );
    let (state, description) = policy_status(&w, &head);
    assert_eq!(state, "success", "{description}");
    assert!(
        description.contains("1 failing policy set approved"),
        "{description}"
    );

    // The retried job applies the reviewed plan.
    let log = call_apply(&s, &w.click_apply(42)).await;
    assert_eq!(verdict(&log), "planbot: apply succeeded", "{log}");
    assert!(
        log.contains("policy set `new-vms` failed on the reviewed plan; approved for it by @carol"),
        "{log}"
    );
    let state = core_state(&w);
    assert!(
        state.contains("\"gitlab\"") && state.contains("\"blocky\""),
        "{state}"
    );
    // What the apply relied on is on the MR too (issue 34): the result note names the verdict
    // and the approval, and the status counts it.
    let result = w
        .gitlab
        .notes(&w.project, iid)
        .into_iter()
        .rev()
        .map(|n| unescaped(&n.body))
        .find(|b| b.starts_with("### 🟢 planbot · applied"))
        .expect("an apply result note");
    assert!(
        result.contains("**Policies** this apply relied on:")
            && result.contains(
                "policy set `new-vms` failed on the reviewed plan; approved for it by @carol"
            ),
        "{result}"
    );
    let landed = w.gitlab.branch_head(&w.project, "main").unwrap();
    let applied = w
        .gitlab
        .status(&w.project, &landed, "planbot/apply")
        .unwrap();
    assert!(
        applied
            .description
            .unwrap_or_default()
            .contains("1 failing policy set approved by its owners"),
        "the planbot/apply status counts the approval"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_after_the_approval_clears_it_and_the_apply_waits_again() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    let iid = w
        .open_mr(
            &s,
            "one-vm",
            &[("main.tf", &crate::support::infra_main_tf(&["blocky"]))],
        )
        .await;
    let note = planned(&w, &s, iid).await;
    assert!(note.contains("- ❌ `new-vms`"), "{note}");
    let first = w.gitlab.mr_sha(&w.project, iid);
    let reply = w
        .comment(&s, iid, &w.user("carol"), "planbot approve policies")
        .await;
    assert!(
        reply.contains("The apply of this plan may proceed"),
        "{reply}"
    );
    assert_eq!(policy_status(&w, &first).0, "success");

    // A new push: a new plan, which the approval does not cover; the note says so.
    w.push(
        &s,
        iid,
        "one-vm",
        &[(
            "main.tf",
            &crate::support::infra_main_tf(&["blocky", "dns"]),
        )],
    )
    .await;
    let note = planned(&w, &s, iid).await;
    assert!(
        note.contains("- ❌ `new-vms` (`policies`): failed"),
        "{note}"
    );
    assert!(
        note.contains(&format!(
            "The approval of `new-vms` by @carol was for the plan of `{}`: the new push cleared it.",
            &first[..8]
        )),
        "{note}"
    );
    let second = w.gitlab.mr_sha(&w.project, iid);
    assert_eq!(policy_status(&w, &second).0, "failed");

    w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let log = call_apply(&s, &w.click_apply(51)).await;
    assert!(
        verdict(&log).contains("policy set `new-vms` failed on the reviewed plan"),
        "{log}"
    );
    assert_eq!(core_state(&w), "", "nothing applied");
}

/// The fingerprint the job log prints for `root`'s fresh plan (what `PLANBOT_CONFIRM` takes).
fn fingerprint_in(log: &str, root: &str) -> String {
    let prefix = format!("planbot: root `{root}`: ");
    log.lines()
        .filter(|l| l.starts_with(&prefix))
        .find_map(|l| l.split("· fingerprint `").nth(1))
        .and_then(|rest| rest.split('`').next())
        .unwrap_or_else(|| panic!("no fingerprint of {root} in: {log}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_that_renames_its_root_and_drops_its_policy_set_is_judged_by_the_sets_before_the_merge(
) {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    // The MR renames the root, deletes the set's files and its `[[policy_sets]]`, and adds the
    // VM the set forbids.
    let tf = crate::support::infra_main_tf(&["gitlab"]);
    w.gitlab.commit_changes(
        &w.project,
        "escape",
        &[
            (
                ".planbot.toml",
                Some("[[roots]]\nname = \"core2\"\ndir = \".\"\n"),
            ),
            ("policies/new_vms.rego", None),
            ("main.tf", Some(tf.as_str())),
        ],
        "Rename the root, drop the policy",
    );
    let iid = w
        .gitlab
        .open_mr_by(&w.project, "escape", "main", &w.alice());
    let body = w.gitlab.mr_webhook(&w.project, iid).action("open").body();
    s.deliver_mr_opened(&body, iid).await;
    let note = unescaped(&planned(&w, &s, iid).await);
    assert!(
        note.contains("- ❌ `new-vms` (`policies`): failed"),
        "{note}"
    );
    w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));

    // After the merge the renamed root was never planned on the MR: refused, as before.
    let log = call_apply(&s, &w.click_apply(61)).await;
    assert!(
        verdict(&log)
            .contains("root `core2` has changes but was not planned on the merged merge request"),
        "{log}"
    );
    let fingerprint = fingerprint_in(&log, "core2");
    let confirm = format!(r#"{{"confirm": "{}"}}"#, &fingerprint[..12]);

    // With the confirm: the plan is checked by `main`'s set as it was before the merge (which
    // the merged commit no longer has), and refused until an owner approves.
    let log = call_apply_with(&s, &w.click_apply(62), &confirm).await;
    let base = w.gitlab.ref_sha(&w.project, "refs/heads/main^1").unwrap();
    assert!(
        log.contains("planbot: root `core2`: no merge request's policy verdict covers this plan; checking it with planbot's own policy sets and those of `main` before the merge"),
        "{log}"
    );
    assert!(
        verdict(&log).starts_with(&format!(
            "planbot: apply refused: policy set `new-vms` (`.planbot.toml` of `main` before the merge, at `{}`) failed on the plan of root `core2` to apply, which no merge request's policy verdict covers: terraform_data.vm[\"gitlab\"] is a new VM",
            &base[..8]
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!("planbot: An owner of `new-vms` (`group:infra/capacity`) may approve this plan by commenting `planbot approve policies` on merge request !{iid}; then retry this job")),
        "{log}"
    );
    assert!(
        log.contains("policy set `backups` passed on the plan to apply"),
        "planbot's own set checks it too: {log}"
    );
    assert_eq!(core_state(&w), "", "nothing applied");

    // Bob cannot approve it; carol, an owner, can (on the merged MR), and the retry applies.
    let reply = w
        .comment(&s, iid, &w.user("bob"), "planbot approve policies")
        .await;
    assert!(
        reply.contains("was not recorded: you are not an owner"),
        "{reply}"
    );
    let log = call_apply_with(&s, &w.click_apply(63), &confirm).await;
    assert!(verdict(&log).contains("policy set `new-vms`"), "{log}");
    assert_eq!(core_state(&w), "", "nothing applied");
    let reply = w
        .comment(&s, iid, &w.user("carol"), "planbot approve policies")
        .await;
    assert!(
        reply.contains("- `new-vms` (root `core2`, the plan the apply job checked at"),
        "{reply}"
    );
    let log = call_apply_with(&s, &w.click_apply(64), &confirm).await;
    assert_eq!(verdict(&log), "planbot: apply succeeded", "{log}");
    assert!(
        log.contains("policy set `new-vms` failed on the plan to apply; approved for it by @carol"),
        "{log}"
    );
    assert!(core_state(&w).contains("\"gitlab\""), "{}", core_state(&w));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_written_on_one_head_is_not_recorded_for_a_head_pushed_meanwhile() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    let iid = w
        .open_mr(
            &s,
            "one-vm",
            &[("main.tf", &crate::support::infra_main_tf(&["blocky"]))],
        )
        .await;
    planned(&w, &s, iid).await;
    let a = w.gitlab.mr_sha(&w.project, iid);
    assert_eq!(policy_status(&w, &a).0, "failed");

    // Carol reads the plan of A and comments; before planbot handles it, B is pushed.
    let before = w.gitlab.notes(&w.project, iid).len();
    let hook = w.gitlab.note_webhook(
        &w.project,
        iid,
        &w.user("carol"),
        "planbot approve policies",
    );
    w.push(
        &s,
        iid,
        "one-vm",
        &[(
            "main.tf",
            &crate::support::infra_main_tf(&["blocky", "huge"]),
        )],
    )
    .await;
    planned(&w, &s, iid).await;
    let b = w.gitlab.mr_sha(&w.project, iid);
    assert_ne!(a, b);
    assert_eq!(policy_status(&w, &b).0, "failed");

    let headers = crate::support::service::token_headers(
        "Note Hook",
        &format!("note-{iid}-{before}"),
        crate::support::service::WEBHOOK_SECRET,
    );
    assert_eq!(s.deliver(&hook.to_string(), &headers).await, 200);
    let (gitlab, project) = (&w.gitlab, &w.project);
    s.after_job_ends("planbot's reply", 60, || async {
        gitlab
            .notes(project, iid)
            .iter()
            .skip(before + 1)
            .any(|n| n.body.starts_with("@carol "))
    })
    .await;
    let reply = w
        .gitlab
        .notes(&w.project, iid)
        .into_iter()
        .skip(before + 1)
        .find(|n| n.body.starts_with("@carol "))
        .unwrap()
        .body;
    assert!(
        reply.contains(&format!(
            "`planbot approve policies` was not recorded: the comment was made when this merge request was at `{}`, and it is now at `{}`",
            &a[..8],
            &b[..8]
        )),
        "{reply}"
    );
    let (state, description) = policy_status(&w, &b);
    assert_eq!(state, "failed", "B was never approved: {description}");
    assert_eq!(policy_status(&w, &a).0, "failed");

    // Her comment on B is recorded for B.
    let reply = w
        .comment(&s, iid, &w.user("carol"), "planbot approve policies")
        .await;
    assert!(
        reply.contains("approved, for the plan shown for"),
        "{reply}"
    );
    assert_eq!(policy_status(&w, &b).0, "success");
}

/// The default branch's set after it moved: every new VM is also a capacity question, with
/// another message (the same set and owners, another failing verdict of the same plan).
const NEW_VMS_STRICTER_REGO: &str = r#"package main

import rego.v1

deny contains msg if {
	some rc in input.resource_changes
	rc.type == "terraform_data"
	rc.name == "vm"
	"create" in rc.change.actions
	msg := sprintf("%s needs rack space: the capacity team approves it", [rc.address])
}
"#;

/// The same head planned again with another failing verdict between Carol's reading and
/// planbot's handling of her comment: nothing is recorded for the verdict she never saw, the
/// reply says why, and a comment written on the new note approves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_written_on_one_plan_is_not_recorded_for_the_same_head_planned_again_meanwhile()
{
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    let iid = w
        .open_mr(
            &s,
            "one-vm",
            &[("main.tf", &crate::support::infra_main_tf(&["blocky"]))],
        )
        .await;
    let p1 = unescaped(&planned(&w, &s, iid).await);
    assert!(p1.contains("is a new VM"), "{p1}");
    let head = w.gitlab.mr_sha(&w.project, iid);
    assert_eq!(policy_status(&w, &head).0, "failed");

    // Carol reads P1 and comments; before planbot handles it, `main`'s set changes and Alice
    // asks for a new plan of the same head: P2 fails the set with another message.
    let before = w.gitlab.notes(&w.project, iid).len();
    let hook = w.gitlab.note_webhook(
        &w.project,
        iid,
        &w.user("carol"),
        "planbot approve policies",
    );
    w.gitlab.commit_files(
        &w.project,
        "main",
        &[("policies/new_vms.rego", NEW_VMS_STRICTER_REGO)],
    );
    let replan = w
        .gitlab
        .note_webhook(&w.project, iid, &w.alice(), "planbot plan");
    let headers = crate::support::service::token_headers(
        "Note Hook",
        &format!("note-{iid}-replan"),
        crate::support::service::WEBHOOK_SECRET,
    );
    assert_eq!(s.deliver(&replan.to_string(), &headers).await, 200);
    let (gitlab, project) = (&w.gitlab, &w.project);
    s.after_job_ends("the new plan of the same head", 90, || async {
        gitlab.notes(project, iid).iter().any(|n| {
            n.body.contains(planbot::core::render::NOTE_MARKER)
                && unescaped(&n.body).contains("needs rack space")
        })
    })
    .await;
    assert_eq!(w.gitlab.mr_sha(&w.project, iid), head, "the same head");
    let (state, description) = policy_status(&w, &head);
    assert_eq!(state, "failed", "{description}");
    assert!(description.contains("needs rack space"), "{description}");

    let headers = crate::support::service::token_headers(
        "Note Hook",
        &format!("note-{iid}-{before}"),
        crate::support::service::WEBHOOK_SECRET,
    );
    assert_eq!(s.deliver(&hook.to_string(), &headers).await, 200);
    s.after_job_ends("planbot's reply", 60, || async {
        gitlab
            .notes(project, iid)
            .iter()
            .skip(before + 1)
            .any(|n| n.body.starts_with("@carol "))
    })
    .await;
    let reply = w
        .gitlab
        .notes(&w.project, iid)
        .into_iter()
        .skip(before + 1)
        .find(|n| n.body.starts_with("@carol "))
        .unwrap()
        .body;
    assert!(
        reply.contains(&format!(
            "`planbot approve policies` was not recorded: the plan note of `{}` was updated at",
            &head[..8]
        )) && reply.contains("after the comment was written"),
        "{reply}"
    );
    let (state, description) = policy_status(&w, &head);
    assert_eq!(state, "failed", "P2 was never approved: {description}");
    assert!(description.contains("needs rack space"), "{description}");

    // Her comment on the note that shows P2 approves P2.
    let reply = w
        .comment(&s, iid, &w.user("carol"), "planbot approve policies")
        .await;
    assert!(
        reply.contains("approved, for the plan shown for"),
        "{reply}"
    );
    assert_eq!(policy_status(&w, &head).0, "success");
}

/// The same escape by a fast-forward merge (the MR's own commits become `main`'s first
/// parents), with the set kept but its rules relaxed and its owners rewritten to the author's
/// colleague: the set judging the apply is `main`'s before the merge, with its owners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_forwarded_mr_that_rewrites_its_set_and_renames_its_root_is_judged_by_the_sets_before_it(
) {
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab.set_merge_method(&w.project, "ff");
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let before = w.gitlab.branch_head(&w.project, "main").unwrap();

    let tf = crate::support::infra_main_tf(&["gitlab"]);
    let toml = "[[roots]]\nname = \"core2\"\ndir = \".\"\n\n[[policy_sets]]\nname = \"new-vms\"\npath = \"policies\"\nowners = [\"bob\"]\n";
    // Two commits: after the fast-forward, `main`'s first parent is the MR's first commit,
    // which already has the rewritten set.
    let iid = w
        .open_mr(
            &s,
            "rewrite",
            &[
                (".planbot.toml", toml),
                ("policies/new_vms.rego", RELAXED_REGO),
            ],
        )
        .await;
    w.push(&s, iid, "rewrite", &[("main.tf", &tf)]).await;
    let note = unescaped(&planned(&w, &s, iid).await);
    assert!(
        note.contains("- ❌ `new-vms` (`policies`): failed"),
        "{note}"
    );
    let landed = w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    assert_eq!(landed, w.gitlab.mr_sha(&w.project, iid), "a fast-forward");

    let log = call_apply(&s, &w.click_apply(71)).await;
    let confirm = format!(
        r#"{{"confirm": "{}"}}"#,
        &fingerprint_in(&log, "core2")[..12]
    );
    let log = call_apply_with(&s, &w.click_apply(72), &confirm).await;
    assert!(
        verdict(&log).starts_with(&format!(
            "planbot: apply refused: policy set `new-vms` (`.planbot.toml` of `main` before the merge, at `{}`) failed on the plan of root `core2` to apply",
            &before[..8]
        )),
        "{log}"
    );
    assert!(
        log.contains("An owner of `new-vms` (`group:infra/capacity`) may approve"),
        "main's owners, not the MR's: {log}"
    );
    // Bob, whom the MR made an owner, is none.
    let reply = w
        .comment(&s, iid, &w.user("bob"), "planbot approve policies")
        .await;
    assert!(
        reply.contains("was not recorded: you are not an owner"),
        "{reply}"
    );
    let log = call_apply_with(&s, &w.click_apply(73), &confirm).await;
    assert!(verdict(&log).contains("policy set `new-vms`"), "{log}");
    assert_eq!(core_state(&w), "", "nothing applied");
}
