//! Targeted plans from an MR comment (`planbot plan [ROOT] -- -target=ADDR`), as a reviewer
//! and the apply job see them, with the real engine against GitLab-managed state on the fake
//! GitLab: flags outside the allow-list are refused with the list, the note and the status
//! say the plan is targeted, its fingerprint is not the full plan's, a new push plans in full
//! again, and the apply refuses the targeted plan until `PLANBOT_CONFIRM` names it, then
//! applies only what it planned.
//!
//! The engine here is Terraform, which has no `-exclude` (OpenTofu's): `-target` stands in for
//! it in the apply (what is left out stays unapplied either way), and `-exclude` is refused
//! with the reason.

use crate::apply_story::{call_apply, last_line, vms_mr, with_workers, world, World};
use crate::support::service::TestService;

impl World {
    /// Comment `body` and wait for planbot's answer: a new note that says it was not run.
    async fn refused(&self, s: &TestService, iid: u64, body: &str) -> String {
        let before = self.notes_containing(iid, "was not run").len();
        self.say(s, iid, &self.alice(), body).await;
        s.after_job_ends("planbot's refusal of the comment", 60, || async {
            self.notes_containing(iid, "was not run").len() > before
        })
        .await;
        self.notes_containing(iid, "was not run").pop().unwrap()
    }

    /// Comment `body` and wait for the plan note of the same head to be edited with a plan
    /// whose note satisfies `done` (the head's status final again).
    async fn replanned(
        &self,
        s: &TestService,
        iid: u64,
        body: &str,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let head = self.gitlab.mr_sha(&self.project, iid);
        self.say(s, iid, &self.alice(), body).await;
        s.after_job_ends("the re-plan of the same head", 90, || async {
            self.gitlab
                .plan_note(&self.project, iid)
                .is_some_and(|n| done(&n))
                && self
                    .gitlab
                    .status(&self.project, &head, "planbot/plan")
                    .is_some_and(|st| st.state == "success")
        })
        .await;
        self.gitlab.plan_note(&self.project, iid).unwrap()
    }

    fn plan_status(&self, iid: u64) -> String {
        let head = self.gitlab.mr_sha(&self.project, iid);
        self.gitlab
            .status(&self.project, &head, "planbot/plan")
            .and_then(|s| s.description)
            .unwrap_or_default()
    }
}

/// The 12 characters of the note's `fingerprint `…`` (one root).
fn fingerprint(note: &str) -> String {
    let at = note.find("fingerprint `").expect("a fingerprint") + "fingerprint `".len();
    note[at..at + 12].to_string()
}

const TARGET: &str = r#"planbot plan -- -target=terraform_data.vm["gitlab"]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_targeted_plan_says_so_is_fingerprinted_apart_and_applies_only_once_confirmed() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    // The MR adds two VMs; its full plan creates both (and what `main` has not applied yet).
    let iid = vms_mr(&w, &s, "two-vms", &["blocky", "gitlab", "backup"]).await;
    let full = w.wait_for_plan(&s, iid).await;
    let shown = crate::support::gitlab_reading::reading(&full).visible;
    assert!(shown.contains("terraform_data.vm[\"backup\"]"), "{full}");
    assert!(!full.contains("Targeted plan"), "{full}");
    let full_fp = fingerprint(&full);

    // A flag outside the allow-list is refused with the list; nothing is planned.
    let refused = w.refused(&s, iid, "planbot plan -- -chdir=/etc").await;
    assert!(
        refused.contains("`-chdir` is not a flag planbot passes to the engine"),
        "{refused}"
    );
    for flag in ["`-target`", "`-exclude`", "`-replace`"] {
        assert!(refused.contains(flag), "{refused}");
    }
    // A value that is not an address is refused too (it could be read as an option).
    let refused = w
        .refused(&s, iid, "planbot plan -- -target=-chdir=/etc")
        .await;
    assert!(refused.contains("is not a resource address"), "{refused}");
    // `-exclude` needs OpenTofu: Terraform is said so, not asked to fail.
    let refused = w
        .refused(
            &s,
            iid,
            r#"planbot plan -- -exclude=terraform_data.vm["backup"]"#,
        )
        .await;
    assert!(refused.contains("`-exclude` needs OpenTofu"), "{refused}");
    // A root the project does not have.
    let refused = w.refused(&s, iid, "planbot plan dns -- -target=a.b").await;
    assert!(
        refused.contains("no root named `dns` (its roots: `default`)"),
        "{refused}"
    );
    assert_eq!(
        w.gitlab.plan_note(&w.project, iid).unwrap(),
        full,
        "the plan note is untouched"
    );

    // The targeted plan: the note says so at its top and shows only the targeted VM; its
    // fingerprint is not the full plan's; the status says it too.
    let targeted = w
        .replanned(&s, iid, TARGET, |n| n.contains("Targeted plan"))
        .await;
    let visible = crate::support::gitlab_reading::reading(&targeted).visible;
    let top = targeted.split("### ").next().unwrap();
    assert!(
        top.contains("**Targeted plan** — targeted: `terraform_data.vm[\"gitlab\"]`"),
        "{targeted}"
    );
    assert!(top.contains("the apply job refuses this plan unless confirmed"));
    assert!(
        visible.contains("terraform_data.vm[\"gitlab\"]"),
        "{targeted}"
    );
    assert!(
        !visible.contains("terraform_data.vm[\"backup\"]"),
        "{targeted}"
    );
    let targeted_fp = fingerprint(&targeted);
    assert_ne!(targeted_fp, full_fp);
    let status = w.plan_status(iid);
    assert!(
        status.starts_with("default (targeted plan: 1 targeted): 1 to add"),
        "{status}"
    );
    // Targeting every change plans what the full plan does, and still is not the full plan:
    // its fingerprint binds the flags.
    let everything = w
        .replanned(
            &s,
            iid,
            "planbot plan -- -target=terraform_data.vm -target=terraform_data.password",
            |n| n.contains("targeted: `terraform_data.vm`"),
        )
        .await;
    let visible = crate::support::gitlab_reading::reading(&everything).visible;
    assert!(
        visible.contains("terraform_data.vm[\"backup\"]"),
        "{everything}"
    );
    assert_eq!(
        everything
            .split("### ")
            .nth(1)
            .and_then(|h| h.lines().next()),
        full.split("### ").nth(1).and_then(|h| h.lines().next()),
        "the same changes as the full plan"
    );
    assert_ne!(fingerprint(&everything), full_fp);

    // A new push drops the targeting: its head is planned in full.
    w.push(&s, iid, "two-vms", &[("README.md", "two VMs\n")])
        .await;
    let again = w.wait_for_plan(&s, iid).await;
    assert!(!again.contains("Targeted plan"), "{again}");
    let visible = crate::support::gitlab_reading::reading(&again).visible;
    assert!(visible.contains("terraform_data.vm[\"backup\"]"), "{again}");
    assert_eq!(fingerprint(&again), full_fp, "the same full plan");
    assert!(!w.plan_status(iid).contains("targeted"));

    // Targeted again on the new head, then merged.
    let targeted = w
        .replanned(&s, iid, TARGET, |n| n.contains("Targeted plan"))
        .await;
    assert_eq!(fingerprint(&targeted), targeted_fp);
    w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));

    // The apply re-plans with the same flags and refuses without a confirmation, saying why.
    let job = w.apply_job(41);
    w.gitlab.register_job(job.clone());
    let (status, log) = call_apply(&s, &job.token, "").await;
    assert_eq!(status, 200);
    assert!(
        last_line(&log).contains("is a targeted plan (1 targeted")
            && last_line(&log).contains("the changes it leaves out would remain unapplied"),
        "{log}"
    );
    assert!(
        log.contains(r#"planning it again with -target=terraform_data.vm["gitlab"]"#),
        "{log}"
    );
    let confirm = log
        .lines()
        .find_map(|l| l.split("PLANBOT_CONFIRM=").nth(1))
        .map(|c| c[..12].to_string())
        .expect("the log says how to confirm");
    assert_eq!(
        confirm, targeted_fp,
        "the reviewed targeted plan's fingerprint"
    );
    let (state, _) = w.gitlab.terraform_state(&w.project, "core");
    let state = state
        .map(|s| String::from_utf8(s).unwrap())
        .unwrap_or_default();
    assert!(!state.contains("\"gitlab\""), "nothing applied: {state}");

    // Confirmed: only the targeted VM is created; the rest stays unapplied.
    let retry = w.apply_job(42);
    w.gitlab.register_job(retry.clone());
    let (_, log) = call_apply(&s, &retry.token, &format!(r#"{{"confirm":"{confirm}"}}"#)).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(
        log.contains("the changes it leaves out remain unapplied"),
        "{log}"
    );
    let state = String::from_utf8(w.gitlab.terraform_state(&w.project, "core").0.unwrap()).unwrap();
    assert!(state.contains("\"gitlab\""), "{state}");
    assert!(
        !state.contains("\"backup\"") && !state.contains("\"blocky\""),
        "{state}"
    );
}

/// The engine gets each checked flag as one argv item (an address with a space in its key
/// stays one item: no shell reads it); a targeting that does not pass the checks again, or
/// that the engine lacks, runs nothing.
#[tokio::test]
async fn the_engine_gets_each_checked_flag_as_one_argv_item_and_a_forged_one_runs_nothing() {
    use planbot::capabilities::engine::{Engine, EngineError, PlanRequest};
    use planbot::core::targeting::Targeting;
    use std::os::unix::fs::PermissionsExt;
    let real = require_engine!();
    let bin = tempfile::tempdir().unwrap();
    let wrapper = bin.path().join("argv-engine");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \"$1\" in plan) for a in \"$@\"; do echo \"argv item: [$a]\" >&2; done ;; esac\nexec {} \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(
        root.path().join("main.tf"),
        "resource \"terraform_data\" \"vm\" {\n  for_each = toset([\"a b\", \"c\"])\n  input    = each.key\n}\n",
    )
    .unwrap();
    let temp_root = tempfile::tempdir().unwrap();
    let engine = Engine::builder(&wrapper, temp_root.path())
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .unwrap();

    let targeting = Targeting::parse(&[r#"-target=terraform_data.vm["a b"]"#]).unwrap();
    let req = PlanRequest {
        targeting: targeting.clone(),
        ..PlanRequest::default()
    };
    let run = engine.plan(root.path(), &req).await.unwrap();
    assert!(
        run.log()
            .contains(r#"argv item: [-target=terraform_data.vm["a b"]]"#),
        "{}",
        run.log()
    );
    let planned: Vec<&str> = run
        .plan()
        .managed_changes()
        .filter(|rc| rc.has_change())
        .map(|rc| rc.address.as_str())
        .collect();
    assert_eq!(planned, [r#"terraform_data.vm["a b"]"#]);
    assert_eq!(run.targeting(), &targeting);

    // Built by hand past the checks: refused before the engine runs.
    for forged in [
        Targeting {
            target: vec!["terraform_data.vm -chdir=/etc".into()],
            ..Targeting::default()
        },
        Targeting {
            replace: vec!["-lock=false".into()],
            ..Targeting::default()
        },
        // Terraform has no `-exclude`.
        Targeting::parse(&["-exclude=terraform_data.vm"]).unwrap(),
    ] {
        let req = PlanRequest {
            targeting: forged.clone(),
            ..PlanRequest::default()
        };
        match engine.plan(root.path(), &req).await {
            Err(EngineError::InvalidRequest(why)) => {
                assert!(why.starts_with("targeted plan: "), "{why}")
            }
            other => panic!("{forged:?} was not refused: {other:?}"),
        }
    }
}
