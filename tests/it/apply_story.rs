//! Stories of the apply half: the manual `planbot-apply` job on protected `main` calls planbot
//! with its job token; planbot checks the job with (fake) GitLab, re-plans with the real
//! engine against GitLab-managed state (the engine's `http` backend), and applies only the
//! plan that was reviewed on the merge request.

use crate::support::fake_gitlab::FakeJob;
use crate::support::fake_proxmox::{Cluster, FakeProxmox, Fault};
use crate::support::service::TestService;
pub(crate) use crate::support::world::{
    call_apply, no_workers, verdict as last_line, with_workers, World,
};

/// Alice pushes `main.tf` with the VMs `vms` on `branch` and opens an MR; GitLab delivers the
/// webhook.
pub(crate) async fn vms_mr(w: &World, s: &TestService, branch: &str, vms: &[&str]) -> u64 {
    let main_tf = crate::support::infra_main_tf(vms);
    w.open_mr(s, branch, &[("main.tf", &main_tf)]).await
}

/// The apply stories' world ([`World::homelab`]).
pub(crate) fn world(engine: &std::path::Path) -> World {
    World::homelab(engine).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_that_may_not_apply_are_refused_each_with_its_own_reason() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), no_workers()).await;

    // planbot serves the CI template the infra repo includes.
    let (status, yaml) = s.get_text("/ci/planbot.gitlab-ci.yml").await;
    assert_eq!(status, 200);
    // The CI/CD component, its inputs defaulting to this planbot's URL and apply job name.
    assert!(
        yaml.contains("\"$[[ inputs.job_name ]]\":") && yaml.contains("when: $[[ inputs.when ]]")
    );
    assert!(yaml.contains("      default: manual\n"), "{yaml}");
    assert!(
        yaml.contains("      default: \"http://planbot.test\"\n"),
        "{yaml}"
    );
    assert!(
        yaml.contains("      default: \"planbot-apply\"\n"),
        "{yaml}"
    );

    let other = w.gitlab.create_project("someone/else");
    let cases: Vec<(&str, FakeJob, &str)> = vec![
        (
            "a job token of another project",
            FakeJob {
                project_id: other.id,
                ..w.apply_job(1)
            },
            "is not one of planbot's allowed projects",
        ),
        (
            "a tag pipeline",
            FakeJob {
                tag: true,
                ref_: "v1.0".into(),
                ..w.apply_job(2)
            },
            "the pipeline is for a tag",
        ),
        (
            "a pipeline on another branch",
            FakeJob {
                ref_: "feature".into(),
                ..w.apply_job(3)
            },
            "is not the default branch `main`",
        ),
        (
            "a job with another name",
            FakeJob {
                name: "deploy".into(),
                ..w.apply_job(4)
            },
            "the job is named `deploy`; only `planbot-apply` may apply",
        ),
    ];
    for (what, job, reason) in cases {
        let token = job.token.clone();
        w.gitlab.register_job(job);
        let (status, log) = call_apply(&s, &token, "{}").await;
        assert_eq!(status, 200, "{what}: the refusal is streamed");
        assert!(
            last_line(&log).starts_with("planbot: apply refused:")
                && last_line(&log).contains(reason),
            "{what}: {log}"
        );
    }

    // An older pipeline: main moved on after the job's pipeline started.
    let old = w.apply_job(5);
    w.gitlab.register_job(old.clone());
    w.gitlab
        .commit_files(&w.project, "main", &[("README.md", "moved on\n")]);
    let (_, log) = call_apply(&s, &old.token, "{}").await;
    assert!(
        last_line(&log).contains("an older pipeline cannot apply"),
        "{log}"
    );

    // An unprotected main.
    w.gitlab.protect_branch(&w.project, "main", false);
    let job = w.apply_job(6);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert!(
        last_line(&log).contains("the branch `main` is not protected"),
        "{log}"
    );
    w.gitlab.protect_branch(&w.project, "main", true);

    // A token GitLab does not know, or none at all.
    let (_, log) = call_apply(&s, "glcbt-made-up", "{}").await;
    assert!(
        last_line(&log).contains("the job token is not valid"),
        "{log}"
    );
    let r = s.http.post(s.url("/api/v1/apply")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);

    // A confirm that is not a fingerprint prefix never reaches the engine.
    let job = w.apply_job(7);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, r#"{"confirm": "nothex!!"}"#).await;
    assert!(
        last_line(&log).contains("`confirm` must be 8 to 64 hexadecimal"),
        "{log}"
    );

    // Nothing of that touched the state.
    assert_eq!(w.gitlab.terraform_state(&w.project, "core").0, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_push_has_nothing_reviewed_and_applies_only_when_confirmed_once_per_job() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), no_workers()).await;

    // Someone pushed straight to main: no MR, so no plan was reviewed.
    let job = w.apply_job(21);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert!(
        last_line(&log)
            .contains("did not come from a merge request, so no plan of it was reviewed"),
        "{log}"
    );
    assert!(
        log.contains("+ terraform_data.vm[\"blocky\"] (created)"),
        "the job log shows the plan: {log}"
    );
    let fingerprint = fingerprint_in(&log);
    assert_eq!(
        w.gitlab.terraform_state(&w.project, "core").0,
        None,
        "nothing applied"
    );
    let refused = w
        .gitlab
        .status(&w.project, &job.sha, "planbot/apply")
        .expect("a planbot/apply status");
    assert_eq!(refused.state, "failed");
    assert!(
        refused
            .description
            .as_deref()
            .is_some_and(|d| d.starts_with("not applied: ")),
        "{refused:?}"
    );
    assert_eq!(refused.ref_.as_deref(), Some("main"));

    // The same job again: one job id applies (or tries) once.
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert!(
        last_line(&log).contains("job 21 has already applied once"),
        "{log}"
    );

    // A retry (a new job) with the confirm the log printed applies exactly that plan.
    let retry = w.apply_job(22);
    w.gitlab.register_job(retry.clone());
    let (_, log) = call_apply(
        &s,
        &retry.token,
        &format!(r#"{{"confirm": "{fingerprint}"}}"#),
    )
    .await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(
        log.contains("Apply complete!"),
        "the engine's output is streamed: {log}"
    );
    assert!(
        !log.contains("apply-canary-password-7f3a"),
        "no secret in the job log"
    );
    let (state, lock) = w.gitlab.terraform_state(&w.project, "core");
    let state = String::from_utf8(state.expect("state was written")).unwrap();
    assert!(state.contains("blocky"));
    assert!(lock.is_none(), "the state lock is released");
    let status = w
        .gitlab
        .status(&w.project, &retry.sha, "planbot/apply")
        .expect("a planbot/apply status");
    assert_eq!(status.state, "success");
    // The refusal's status stays as it was; the retry's is a new one, and the one shown.
    let rows: Vec<(String, Option<String>)> = w
        .gitlab
        .status_rows(&w.project, &retry.sha)
        .into_iter()
        .filter(|r| r.name == "planbot/apply")
        .map(|r| (r.state, r.ref_))
        .collect();
    assert_eq!(
        rows,
        [
            ("failed".to_string(), Some("main".to_string())),
            ("success".to_string(), Some("main".to_string()))
        ]
    );

    // Applying again: the plan is now empty and needs no review.
    let again = w.apply_job(23);
    w.gitlab.register_job(again.clone());
    let (_, log) = call_apply(&s, &again.token, "{}").await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(log.contains("no changes, nothing to apply"), "{log}");

    // No plan file and no secret is left in the data dir.
    assert_nothing_left(&w.config.data_dir);
}

/// No plan file and no secret is left anywhere in the data dir.
fn assert_nothing_left(dir: &std::path::Path) {
    let leftovers = scan(dir);
    assert!(
        leftovers.plan_files.is_empty(),
        "{:?}",
        leftovers.plan_files
    );
    assert!(
        !leftovers.secret_seen,
        "a secret was written to the data dir"
    );
}

/// The fingerprint the job log names (`... · fingerprint `abc123...``).
/// A direct push that changes two roots (issue 43): each root has its own fingerprint and one
/// `PLANBOT_CONFIRM` confirms one root's, so the refusal names each root with the
/// `PLANBOT_ROOTS` and `PLANBOT_CONFIRM` that apply it (it used to say "the fingerprint shown"
/// while the log showed two); retried as it says, root by root, both apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_several_roots_names_each_roots_fingerprint_with_planbot_roots() {
    let engine = require_engine!();
    let w = World::builder()
        .engine(&engine)
        .managed_state()
        .planbot_toml("[[roots]]\nname = \"core\"\ndir = \"core\"\n\n[[roots]]\nname = \"edge\"\ndir = \"edge\"\n")
        .file("core/main.tf", &crate::support::infra_main_tf(&["blocky"]))
        .file("edge/main.tf", &crate::support::infra_main_tf(&["proxy"]))
        .build();
    let s = TestService::start(w.config.clone(), no_workers()).await;
    let job = w.apply_job(31);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    let fingerprints: Vec<(String, String)> = log
        .lines()
        .filter_map(|l| {
            let root = l.split("root `").nth(1)?.split('`').next()?;
            let fp = l.split("fingerprint `").nth(1)?.trim_end_matches('`');
            Some((root.to_string(), fp[..12].to_string()))
        })
        .collect();
    assert_eq!(fingerprints.len(), 2, "{log}");
    let expected = format!(
        "planbot: 2 roots have a plan no one reviewed as it is now, each with its own fingerprint, and PLANBOT_CONFIRM confirms one root's: read each plan above, then retry this job once per root with the CI/CD variables PLANBOT_ROOTS=core PLANBOT_CONFIRM={}, then PLANBOT_ROOTS=edge PLANBOT_CONFIRM={}; or open a merge request so the plans are reviewed",
        fingerprints[0].1, fingerprints[1].1
    );
    assert!(log.lines().any(|l| l == expected), "{log}");
    assert!(!log.contains("the fingerprint shown"), "{log}");

    // Retried as the hint says, one root a job: each applies.
    for (n, (root, fp)) in fingerprints.iter().enumerate() {
        let retry = w.apply_job(32 + n as u64);
        w.gitlab.register_job(retry.clone());
        let body = format!(r#"{{"confirm": "{fp}", "roots": ["{root}"]}}"#);
        let (_, log) = call_apply(&s, &retry.token, &body).await;
        assert_eq!(last_line(&log), "planbot: apply succeeded", "{root}: {log}");
        assert!(w.state(root).is_some(), "{root}'s state was written");
    }
}

fn fingerprint_in(log: &str) -> String {
    log.lines()
        .find_map(|l| l.split("fingerprint `").nth(1))
        .map(|rest| rest.trim_end_matches('`').to_string())
        .expect("the log names the fingerprint")
}

struct Scan {
    plan_files: Vec<std::path::PathBuf>,
    secret_seen: bool,
}

/// Walk the data dir: plan files anywhere, and the canary in any file (the SQLite file included).
fn scan(dir: &std::path::Path) -> Scan {
    let mut out = Scan {
        plan_files: Vec::new(),
        secret_seen: false,
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                // Provider plug-ins and git objects are not ours to scan.
                if !p.ends_with("plugin-cache") && !p.ends_with("objects") {
                    stack.push(p);
                }
                continue;
            }
            if p.file_name()
                .is_some_and(|n| n == "plan" || n.to_string_lossy().ends_with(".tfplan"))
            {
                out.plan_files.push(p.clone());
            }
            if let Ok(bytes) = std::fs::read(&p) {
                if bytes
                    .windows(b"apply-canary-password-7f3a".len())
                    .any(|w| w == b"apply-canary-password-7f3a")
                {
                    out.secret_seen = true;
                    eprintln!("canary found in {}", p.display());
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reviewed_plan_is_applied_after_the_merge_and_a_drifted_one_only_once_confirmed() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    // Review: the MR adds a VM; the note shows the plan and its fingerprint.
    let iid = vms_mr(&w, &s, "add-gitlab-vm", &["blocky", "gitlab"]).await;
    let note = w.wait_for_plan(&s, iid).await;
    // As GitLab shows it: HTML entities in <summary> render as the characters.
    let shown = crate::support::gitlab_reading::reading(&note).visible;
    assert!(shown.contains("+ terraform_data.vm[\"gitlab\"]"), "{note}");
    assert!(!note.contains("apply-canary-password-7f3a"));

    // Merge (a merge commit, GitLab's default), then someone clicks the manual job on main.
    let landed = w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let job = w.apply_job(31);
    assert_eq!(job.sha, landed);
    w.gitlab.register_job(job.clone());
    let (status, log) = call_apply(&s, &job.token, "").await;
    assert_eq!(status, 200);
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(
        log.contains(&format!("the plan is the one reviewed on !{iid}")),
        "{log}"
    );
    assert!(!log.contains("apply-canary-password-7f3a"));
    let state = String::from_utf8(w.gitlab.terraform_state(&w.project, "core").0.unwrap()).unwrap();
    assert!(state.contains("\"gitlab\"") && state.contains("\"blocky\""));
    let result = w.notes_containing(iid, "planbot · applied");
    assert_eq!(result.len(), 1, "one result note on the merged MR");
    assert!(result[0].contains("by @alice"), "{}", result[0]);
    assert_eq!(
        w.gitlab
            .status(&w.project, &landed, "planbot/apply")
            .unwrap()
            .state,
        "success"
    );

    // A second MR is reviewed; then the state drifts before its apply.
    let iid2 = vms_mr(&w, &s, "add-backup-vm", &["blocky", "gitlab", "backup"]).await;
    w.wait_for_plan(&s, iid2).await;
    let landed2 = w.gitlab.merge_mr(&w.project, iid2, Some(&w.alice()));
    w.drift("blocky", 8).await;
    let job = w.apply_job(32);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert!(
        last_line(&log).contains("is not the plan reviewed on the merge request"),
        "{log}"
    );
    let confirm = log
        .lines()
        .find_map(|l| l.split("PLANBOT_CONFIRM=").nth(1))
        .map(|c| c.trim_end_matches('.').to_string())
        .expect("the log says how to confirm");
    let state = String::from_utf8(w.gitlab.terraform_state(&w.project, "core").0.unwrap()).unwrap();
    assert!(!state.contains("\"backup\""), "nothing was applied");
    // The MR learns what changed since review, attribute by attribute, and how to confirm.
    let refused = w.notes_containing(iid2, "apply refused");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        crate::support::gitlab_reading::reading(&refused[0])
            .visible
            .contains("terraform_data.vm[\"blocky\"]"),
        "{}",
        refused[0]
    );
    assert!(refused[0].contains("input.cores = 2"), "{}", refused[0]);
    assert!(
        refused[0].contains(&format!("`PLANBOT_CONFIRM` set to `{confirm}`")),
        "{}",
        refused[0]
    );
    assert!(
        !refused[0].contains(planbot::core::render::NOTE_MARKER),
        "not taken for the plan note"
    );

    // Retry with the confirm: applied, drift repaired by the plan that was read.
    let retry = w.apply_job(33);
    w.gitlab.register_job(retry.clone());
    let (_, log) = call_apply(&s, &retry.token, &format!(r#"{{"confirm":"{confirm}"}}"#)).await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    // Confirmed, not reviewed: the log says which.
    assert!(
        log.contains("applying the confirmed plan `")
            && !log.contains("applying the reviewed plan"),
        "{log}"
    );
    let state = String::from_utf8(w.gitlab.terraform_state(&w.project, "core").0.unwrap()).unwrap();
    assert!(state.contains("\"backup\""));
    assert_eq!(
        w.gitlab
            .status(&w.project, &landed2, "planbot/apply")
            .unwrap()
            .state,
        "success"
    );

    assert_nothing_left(&w.config.data_dir);
    for n in w.gitlab.notes(&w.project, iid2) {
        assert!(!n.body.contains("apply-canary-password-7f3a"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_apply_jobs_for_the_same_root_run_one_after_the_other() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), no_workers()).await;
    let (a, b) = (w.apply_job(41), w.apply_job(42));
    w.gitlab.register_job(a.clone());
    w.gitlab.register_job(b.clone());
    let head = w.gitlab.branch_head(&w.project, "main").unwrap();
    let fp_body = |fp: &str| format!(r#"{{"confirm":"{fp}"}}"#);
    // Learn the fingerprint of main's plan (a direct push: it needs a confirm).
    let probe = w.apply_job(40);
    w.gitlab.register_job(probe.clone());
    let (_, log) = call_apply(&s, &probe.token, "{}").await;
    let fp = fingerprint_in(&log);

    // Hold the root as another apply would, send both jobs, then let go.
    let guard = s
        .app
        .root_locks
        .lock(planbot::core::ids::ProjectId(w.project.id), "default")
        .await;
    let (ra, rb) = (fp_body(&fp), fp_body(&fp));
    let fa = call_apply(&s, &a.token, &ra);
    let fb = call_apply(&s, &b.token, &rb);
    // Let go once both jobs wait for the root (planbot's own signal, not a guess of time).
    let release = async {
        tokio::time::timeout(
            std::time::Duration::from_secs(60),
            s.app.root_locks.until_waiting(
                planbot::core::ids::ProjectId(w.project.id),
                "default",
                2,
            ),
        )
        .await
        .expect("both apply jobs wait for the root");
        drop(guard);
    };
    let ((_, la), (_, lb), ()) = tokio::join!(fa, fb, release);
    for l in [&la, &lb] {
        assert!(l.contains("waiting for it"), "{l}");
        assert_eq!(last_line(l), "planbot: apply succeeded", "{l}");
    }
    // Exactly one applied the change; the other found nothing left to do.
    let applied = [&la, &lb]
        .iter()
        .filter(|l| l.contains("Apply complete!"))
        .count();
    let nothing = [&la, &lb]
        .iter()
        .filter(|l| l.contains("no changes, nothing to apply"))
        .count();
    assert_eq!((applied, nothing), (1, 1), "{la}\n---\n{lb}");
    // Both jobs are recorded as succeeded applies of main's head.
    for job in [&a, &b] {
        let r = s
            .app
            .store
            .apply_for_job(planbot::core::ids::JobId(job.id))
            .await
            .unwrap()
            .expect("an apply record");
        assert_eq!(r.state, planbot::capabilities::store::ApplyState::Succeeded);
        assert_eq!(r.sha.as_str(), head);
    }
}

/// The infra root with a slow resource: its creation takes long enough to crash planbot in it.
fn slow_tf() -> String {
    format!(
        r#"{}
resource "terraform_data" "slow" {{
  input = "takes a while"
  provisioner "local-exec" {{
    command = "sleep 15"
  }}
}}
"#,
        crate::support::infra_main_tf(&["blocky"])
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planbot_killed_mid_apply_reports_it_interrupted_and_never_re_runs_it() {
    let engine = require_engine!();
    let w = world(&engine);
    let config_file = w.config.data_dir.with_extension("toml");
    std::fs::write(&config_file, w.planbot.text()).unwrap();
    // planbot as its own process, so that it can really be killed.
    let (mut child, port) = crate::support::spawn_serve(&config_file);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    // It said it serves: its socket is bound and answers.
    let health = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert!(health.status().is_success());

    // An MR adds the slow resource; it is reviewed and merged; the apply job starts.
    // Fast-forward merges, and a branch named to sort before `main`: the landed commit is on
    // both, and a status without `ref` would land on this branch.
    w.gitlab.set_merge_method(&w.project, "ff");
    w.gitlab
        .commit_files(&w.project, "add-slow", &[("main.tf", &slow_tf())]);
    let iid = w
        .gitlab
        .open_mr_by(&w.project, "add-slow", "main", &w.alice());
    let body = w.gitlab.mr_webhook(&w.project, iid).action("open").body();
    let mut req = http.post(format!("{base}/webhooks/gitlab")).body(body);
    for (k, v) in crate::support::service::token_headers(
        "Merge Request Hook",
        "slow-1",
        crate::support::service::WEBHOOK_SECRET,
    ) {
        req = req.header(k, v);
    }
    assert_eq!(req.send().await.unwrap().status(), 200);
    let head = w.gitlab.mr_sha(&w.project, iid);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while w
        .gitlab
        .status(&w.project, &head, "planbot/plan")
        .is_none_or(|s| s.state != "success")
    {
        assert!(std::time::Instant::now() < deadline, "no plan");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let job = w.apply_job(51);
    w.gitlab.register_job(job.clone());
    let mut resp = http
        .post(format!("{base}/api/v1/apply"))
        .header("JOB-TOKEN", &job.token)
        .send()
        .await
        .unwrap();
    // Read the streamed log until the slow resource is being created (bounded: a stream that
    // stalls or ends first fails the test).
    let mut log = String::new();
    tokio::time::timeout(std::time::Duration::from_secs(120), async {
        while !log.contains("Provisioning with 'local-exec'") {
            let chunk = resp.chunk().await.unwrap();
            let chunk = chunk.unwrap_or_else(|| panic!("the log ended early:\n{log}"));
            log.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the apply never reached the slow resource"));

    // Crash.
    child.kill().unwrap();
    child.wait().unwrap();
    for pid in crate::support::processes_under(&w.config.data_dir) {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }

    // Restarted: the apply is reported interrupted on the MR, its status and its run page.
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let (gitlab, project) = (&w.gitlab, &w.project);
    // The note is posted first, then the status: wait for both.
    s.eventually("the interrupted apply on the MR and its status", || async {
        gitlab
            .notes(project, iid)
            .iter()
            .any(|n| n.body.contains("was interrupted"))
            && gitlab
                .status(project, &job.sha, "planbot/apply")
                .is_some_and(|st| st.state == "failed")
    })
    .await;
    let status = w
        .gitlab
        .status(&w.project, &job.sha, "planbot/apply")
        .unwrap();
    assert_eq!(status.state, "failed");
    assert!(status
        .description
        .unwrap_or_default()
        .contains("not re-run"));
    // The apply's own `running` status moved to `failed`: nothing is left running.
    let rows: Vec<(String, Option<String>)> = w
        .gitlab
        .status_rows(&w.project, &job.sha)
        .into_iter()
        .filter(|r| r.name == "planbot/apply")
        .map(|r| (r.state, r.ref_))
        .collect();
    assert_eq!(rows, [("failed".to_string(), Some("main".to_string()))]);
    let record = s
        .app
        .store
        .apply_for_job(planbot::core::ids::JobId(51))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.state,
        planbot::capabilities::store::ApplyState::Interrupted
    );
    let runs = s.app.store.recent_runs(50).await.unwrap();
    let applies: Vec<_> = runs
        .iter()
        .filter(|r| r.kind == planbot::capabilities::store::RunKind::Apply)
        .collect();
    assert_eq!(applies.len(), 1, "never re-run by itself");
    assert_eq!(
        applies[0].state,
        planbot::capabilities::store::RunState::Interrupted
    );
    let (_, page) = s.get_text(&format!("/runs/{}", applies[0].id)).await;
    assert!(page.contains("interrupted"), "{page}");
    // A crash leaves no plan file: the temp root was wiped at start-up.
    assert!(scan(&w.config.data_dir).plan_files.is_empty());
}

/// The whole story for one merge method: the reviewed plan is found from the landed commit
/// and applied (parity holds); then `main` moves after a review, and the apply is refused.
async fn merge_method_story(engine: &std::path::Path, method: &str, squash: bool) {
    let w = world(engine);
    w.gitlab.set_merge_method(&w.project, method);
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let what = format!("{method}{}", if squash { " + squash" } else { "" });

    // Reviewed, merged, applied.
    let iid = vms_mr(&w, &s, "add-gitlab-vm", &["blocky", "gitlab"]).await;
    w.wait_for_plan(&s, iid).await;
    let head = w.gitlab.mr_sha(&w.project, iid);
    w.gitlab.set_squash(&w.project, iid, squash);
    let landed = w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let mr = w.gitlab.mr_json(&w.project, iid);
    match (method, squash) {
        ("ff", false) => assert_eq!(landed, head, "{what}"),
        ("ff", true) => assert_eq!(mr["squash_commit_sha"], landed.as_str(), "{what}"),
        _ => {
            assert_eq!(mr["merge_commit_sha"], landed.as_str(), "{what}");
            assert_ne!(landed, head, "{what}");
        }
    }
    // GitLab says it merged: the plan note's banner waits for the apply job.
    let hook = w.gitlab.mr_webhook(&w.project, iid).action("merge").body();
    let status = s
        .deliver(
            std::str::from_utf8(&hook).unwrap(),
            &crate::support::service::token_headers(
                "Merge Request Hook",
                &format!("merge-{iid}"),
                crate::support::service::WEBHOOK_SECRET,
            ),
        )
        .await;
    assert_eq!(status, 200);
    let banner = |note: &str| {
        note.lines()
            .skip_while(|l| *l != "<!-- planbot:merged -->")
            .nth(1)
            .map(str::to_string)
    };
    s.after_job_ends("the merged banner", 60, || async {
        w.gitlab
            .plan_note(&w.project, iid)
            .and_then(|n| banner(&n))
            .is_some_and(|b| b.contains("Merged — waiting for the apply job on `main`"))
    })
    .await;
    let job = w.apply_job(31);
    assert_eq!(job.sha, landed);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{what}: {log}");
    // Issue 35 item 4: the plan note's banner says the apply ended, with the job's link.
    let note = w.gitlab.plan_note(&w.project, iid).unwrap();
    let said = banner(&note).unwrap();
    let job_url = "/infra/homelab/-/jobs/31)";
    assert!(
        said.starts_with("> **Merged and applied** by the `planbot-apply` [job 31](")
            && said.contains(job_url)
            && said.contains(&format!("at `{}`", &landed[..8])),
        "{what}: {said}"
    );
    assert!(
        !note.contains("waiting for the apply job"),
        "{what}: {note}"
    );
    assert_eq!(note.matches("<!-- planbot:merged -->").count(), 1, "{note}");
    assert!(
        log.contains(&format!(
            "commit `{}` is merge request !{iid}",
            &landed[..8]
        )),
        "{what}: {log}"
    );
    assert!(
        log.contains(&format!("the plan is the one reviewed on !{iid}")),
        "{what}: {log}"
    );
    let state = String::from_utf8(w.gitlab.terraform_state(&w.project, "core").0.unwrap()).unwrap();
    assert!(state.contains("\"gitlab\""), "{what}");

    // A second MR is reviewed; then `main` moves: a new resource lands beside it unreviewed.
    let iid2 = vms_mr(&w, &s, "add-backup-vm", &["blocky", "gitlab", "backup"]).await;
    w.wait_for_plan(&s, iid2).await;
    w.gitlab.commit_files(
        &w.project,
        "main",
        &[(
            "extra.tf",
            "resource \"terraform_data\" \"unreviewed\" {}\n",
        )],
    );
    w.gitlab.set_squash(&w.project, iid2, squash);
    if method != "merge" {
        // GitLab refuses until the branch is rebased; the rebased head is not re-reviewed.
        let err = w.gitlab.try_merge_mr(&w.project, iid2, Some(&w.alice()));
        assert!(err.is_err(), "{what}: {err:?}");
        w.gitlab.rebase_mr(&w.project, iid2);
    }
    let landed2 = w.gitlab.merge_mr(&w.project, iid2, Some(&w.alice()));
    let job = w.apply_job(32);
    assert_eq!(job.sha, landed2);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert!(
        log.contains(&format!(
            "commit `{}` is merge request !{iid2}",
            &landed2[..8]
        )),
        "{what}: {log}"
    );
    assert!(
        last_line(&log).contains("is not the plan reviewed on the merge request"),
        "{what}: {log}"
    );
    let state = String::from_utf8(w.gitlab.terraform_state(&w.project, "core").0.unwrap()).unwrap();
    assert!(
        !state.contains("unreviewed") && !state.contains("\"backup\""),
        "{what}: nothing applied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_commit_the_reviewed_plan_is_applied_and_a_moved_main_refused() {
    let engine = require_engine!();
    merge_method_story(&engine, "merge", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squash_and_merge_commit_the_reviewed_plan_is_applied_and_a_moved_main_refused() {
    let engine = require_engine!();
    merge_method_story(&engine, "merge", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_forward_the_reviewed_plan_is_applied_and_a_rebased_unreviewed_head_refused() {
    let engine = require_engine!();
    merge_method_story(&engine, "ff", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squash_and_fast_forward_the_reviewed_plan_is_applied_and_a_moved_main_refused() {
    let engine = require_engine!();
    merge_method_story(&engine, "ff", true).await;
}

// ---- With `[proxmox]` configured: the preflight inside the flows, and the credential split. ----

const PLAN_TOKEN: &str = "tofu@pve!plan";
const PLAN_SECRET: &str = "3c1d5e7f-0a2b-4c6d-8e9f-a1b2c3d4e5f6";
const APPLY_TOKEN: &str = "tofu@pve!apply";
const APPLY_SECRET: &str = "9f8e7d6c-5b4a-4321-9876-fedcba012345";

/// A resource whose creation calls the Proxmox API with whatever token the engine was given
/// (the fake records which), as the provider would.
const PROBE_TF: &str = r#"
resource "terraform_data" "pve_probe" {
  input = "probe"
  provisioner "local-exec" {
    command = "curl -s -o /dev/null -H \"Authorization: PVEAPIToken=$PROXMOX_VE_API_TOKEN\" \"$PROXMOX_VE_ENDPOINT/api2/json/engine-probe\" || true"
  }
}
"#;

/// Which tokens the fake Proxmox saw on paths that start with `prefix`.
fn tokens_seen(pve: &FakeProxmox, prefix: &str) -> std::collections::BTreeSet<String> {
    pve.with(|c| {
        c.seen_tokens
            .iter()
            .filter(|(_, p)| p.starts_with(prefix))
            .map(|(t, _)| t.clone())
            .collect()
    })
}

/// Issue 35 item 5: a root whose plan has no Proxmox resource or data source (here only
/// `terraform_data`) neither runs nor waits for the Proxmox preflight: with the PVE API down its
/// MR is green, the note says nothing about Proxmox, and the apply goes ahead. (A Proxmox
/// root with the same endpoint is still refused: tests/it/preflight_checks.rs, fail closed.)
/// The engine still gets the apply token, and only that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_proxmox_down_a_root_without_proxmox_resources_is_green_and_applies_with_its_token() {
    let engine = require_engine!();
    let pve = FakeProxmox::start(
        Cluster::homelab()
            .token(PLAN_TOKEN, PLAN_SECRET, &[("/", "PVEAuditor")])
            .token_only(APPLY_TOKEN, APPLY_SECRET, true, &[("/", "PVEAdmin")]),
    )
    .await;
    // The Proxmox API does not answer what a preflight asks first.
    pve.with(|c| {
        c.faults.insert(
            "/version".into(),
            Fault::Status(503, "Service Unavailable".into()),
        )
    });
    let w = World::homelab(&engine)
        .config(|c| {
            c.proxmox(&pve.url, &format!("{APPLY_TOKEN}={APPLY_SECRET}"))
                .set(
                    "proxmox.plan",
                    "api_token",
                    &format!("\"{PLAN_TOKEN}={PLAN_SECRET}\""),
                )
        })
        .build();
    let s = TestService::start(w.config.clone(), with_workers()).await;

    w.gitlab
        .commit_files(&w.project, "add-probe", &[("probe.tf", PROBE_TF)]);
    let iid = vms_mr(&w, &s, "add-probe", &["blocky", "gitlab"]).await;
    let note = w.wait_for_plan(&s, iid).await;
    let head = w.gitlab.mr_sha(&w.project, iid);
    assert!(!note.contains("Proxmox"), "{note}");
    assert!(!note.contains("PVE101"), "{note}");
    assert!(note.contains("### 🟢"), "{note}");
    assert_eq!(
        w.gitlab
            .status(&w.project, &head, "planbot/plan")
            .unwrap()
            .state,
        "success"
    );
    assert!(
        tokens_seen(&pve, "/api2/json/").is_empty(),
        "no preflight request for a plan without Proxmox"
    );

    // Merged: the apply neither runs nor waits for the preflight, and applies.
    let landed = w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let job = w.apply_job(61);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(!log.contains("Proxmox preflight"), "{log}");
    assert!(
        !log.contains(APPLY_SECRET) && !log.contains(PLAN_SECRET),
        "{log}"
    );
    let state = String::from_utf8(w.gitlab.terraform_state(&w.project, "core").0.unwrap()).unwrap();
    assert!(state.contains("\"gitlab\""), "applied");
    assert_eq!(
        w.gitlab
            .status(&w.project, &landed, "planbot/apply")
            .unwrap()
            .state,
        "success"
    );
    assert!(tokens_seen(&pve, "/api2/json/version").is_empty());
    assert_eq!(
        tokens_seen(&pve, "/api2/json/engine-probe"),
        [APPLY_TOKEN.to_string()].into(),
        "what the apply's engine process sent to Proxmox"
    );
}

/// The real engine behind a wrapper that prints the arguments planbot gives it to `plan` and
/// `apply` on stderr (which the apply job's log shows), then runs it with them.
fn argv_engine(dir: &std::path::Path, real: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("argv-tofu");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\ncase \"$1\" in plan|apply) echo \"engine argv: $*\" >&2 ;; esac\nexec {} \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Issue 36 item 4: `.planbot.toml`'s `parallelism` reaches the apply's engine as
/// `-parallelism=N`, and is part of the plan: a setting changed on `main` after the review
/// makes the same resource changes another plan, and the apply refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roots_parallelism_reaches_the_apply_and_a_changed_one_is_a_changed_plan() {
    let real = require_engine!();
    let bin = tempfile::tempdir().unwrap();
    let engine = argv_engine(bin.path(), &real);
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "main",
        &[(".planbot.toml", "parallelism = 1\n")],
    );
    let s = TestService::start(w.config.clone(), with_workers()).await;

    // Reviewed with one change at a time, merged, applied with it.
    let iid = vms_mr(&w, &s, "add-gitlab-vm", &["blocky", "gitlab"]).await;
    w.wait_for_plan(&s, iid).await;
    w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let job = w.apply_job(31);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    let applied: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("engine argv: apply "))
        .collect();
    assert_eq!(applied.len(), 1, "{log}");
    assert!(
        applied[0].contains(" -parallelism=1 "),
        "the apply's engine gets the root's setting: {}",
        applied[0]
    );

    // A second MR is reviewed with `parallelism = 1`; then `main` says 2 before it lands.
    let iid2 = vms_mr(&w, &s, "add-backup-vm", &["blocky", "gitlab", "backup"]).await;
    w.wait_for_plan(&s, iid2).await;
    w.gitlab.commit_files(
        &w.project,
        "main",
        &[(".planbot.toml", "parallelism = 2\n")],
    );
    w.gitlab.merge_mr(&w.project, iid2, Some(&w.alice()));
    let job = w.apply_job(32);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert!(
        last_line(&log).contains("is not the plan reviewed on the merge request"),
        "{log}"
    );
    assert!(
        !log.contains("engine argv: apply "),
        "nothing was applied: {log}"
    );
    let state = String::from_utf8(w.gitlab.terraform_state(&w.project, "core").0.unwrap()).unwrap();
    assert!(!state.contains("\"backup\""), "nothing was applied");
    assert_eq!(w.notes_containing(iid2, "apply refused").len(), 1);
}

/// Issue 36, PVE023 across roots: an MR that plans two roots asking for the same `vm_id` gets
/// the finding in both roots' sections of its note, and the plan status fails. The engine here
/// stands in for `bpg/proxmox` plans (which need the provider): `show -json` prints the plan
/// committed in the root (`plan.json`, the lint fixtures of `tests/fixtures/plans/bpg/`); the
/// webhook, checkout, roots, lint, note and status are planbot's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_vm_id_in_two_roots_of_an_mr_fails_the_plan_and_both_roots_say_so() {
    let bin = tempfile::tempdir().unwrap();
    let engine = crate::support::fake_engine::fake_engine(
        bin.path(),
        "terraform",
        crate::support::fake_engine::TERRAFORM_VERSION_JSON,
        r#"case "$1" in
  init) mkdir -p .terraform && echo '{"backend":{"type":"http"}}' > .terraform/terraform.tfstate; exit 0 ;;
  plan) for a in "$@"; do case "$a" in -out=*) cp plan.json "${a#-out=}" ;; esac; done; exit 0 ;;
  show) cat "$3"; exit 0 ;;
esac
exit 1"#,
    );
    let w = world(&engine);
    let fixture = |name: &str| {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("tests/fixtures/plans/bpg/{name}.json")),
        )
        .unwrap()
    };
    let backend = "terraform {\n  backend \"http\" {}\n}\n";
    w.gitlab.commit_files(
        &w.project,
        "main",
        &[
            (
                ".planbot.toml",
                "[[roots]]\nname = \"lab\"\ndir = \"lab\"\n\n[[roots]]\nname = \"prod\"\ndir = \"prod\"\n",
            ),
            ("lab/main.tf", backend),
            ("prod/main.tf", backend),
        ],
    );
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let (lab, prod) = (fixture("vm_id_root_lab"), fixture("vm_id_root_prod"));
    w.gitlab.commit_files(
        &w.project,
        "vm-ids",
        &[("lab/plan.json", &lab), ("prod/plan.json", &prod)],
    );
    let iid = w
        .gitlab
        .open_mr_by(&w.project, "vm-ids", "main", &w.alice());
    let body = w.gitlab.mr_webhook(&w.project, iid).action("open").body();
    s.deliver_mr_opened(&body, iid).await;
    let note = w.wait_for_plan(&s, iid).await;
    let shown = crate::support::gitlab_reading::reading(&note).visible;
    assert_eq!(shown.matches("PVE023").count(), 2, "{shown}");
    // As GitLab shows it (code spans render as plain text).
    assert!(
        shown.contains("PVE023 proxmox_virtual_environment_vm.lab_db: proxmox_virtual_environment_vm.lab_db asks for VM id 201, which proxmox_virtual_environment_vm.db in root prod of this MR already has: the apply of root lab fails with unable to create VM 201"),
        "{shown}"
    );
    assert!(
        shown.contains("PVE023 proxmox_virtual_environment_vm.db: proxmox_virtual_environment_vm.db has VM id 201, which proxmox_virtual_environment_vm.lab_db in root lab of this MR also asks for"),
        "{shown}"
    );
    let head = w.gitlab.mr_sha(&w.project, iid);
    let status = w.gitlab.status(&w.project, &head, "planbot/plan").unwrap();
    assert_eq!(status.state, "failed", "{status:?}");
}

/// Two roots on `main`, `vms` and `dns`, each with its own GitLab-managed state (named after
/// it).
fn vms_and_dns_roots(w: &World) {
    let backend = |name: &str| {
        let url = format!(
            "{}/api/v4/projects/{}/terraform/state/{name}",
            w.gitlab.url(),
            w.project.id
        );
        format!(
            "terraform {{\n  backend \"http\" {{\n    address        = \"{url}\"\n    lock_address   = \"{url}/lock\"\n    unlock_address = \"{url}/lock\"\n  }}\n}}\n"
        )
    };
    let (vms_backend, dns_backend) = (backend("vms"), backend("dns"));
    w.gitlab.commit_files(
        &w.project,
        "main",
        &[
            (
                ".planbot.toml",
                "[[roots]]\nname = \"vms\"\ndir = \"vms\"\n\n[[roots]]\nname = \"dns\"\ndir = \"dns\"\n",
            ),
            ("vms/backend.tf", &vms_backend),
            ("dns/backend.tf", &dns_backend),
        ],
    );
}

/// Issue 36 item 5, as the user sees it: an MR changes two roots, each on its own managed
/// state; `vms` has a resource that never converges (`input = uuid()`: unknown at every plan,
/// so the plan right after the apply still updates it, as a provider that reports success
/// without doing the work would leave it), `dns` converges. The reviewed plan is applied (the
/// fingerprint holds: `uuid()` is unknown in the review's plan and in the apply's alike), the
/// apply succeeds and its status is green, and the apply note's line for `vms` (and the status
/// text, which repeats the root lines) says the apply left changes, with the address; the line
/// for `dns` does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_that_leaves_changes_says_so_on_its_roots_line_and_the_converged_root_does_not() {
    let engine = require_engine!();
    let w = world(&engine);
    vms_and_dns_roots(&w);
    let s = TestService::start(w.config.clone(), with_workers()).await;

    w.gitlab.commit_files(
        &w.project,
        "never-converges",
        &[
            (
                "vms/main.tf",
                "resource \"terraform_data\" \"vm\" {\n  input = \"web\"\n}\n\nresource \"terraform_data\" \"never_converges\" {\n  input = uuid()\n}\n",
            ),
            (
                "dns/main.tf",
                "resource \"terraform_data\" \"record\" {\n  input = \"web.lab\"\n}\n",
            ),
        ],
    );
    let iid = w
        .gitlab
        .open_mr_by(&w.project, "never-converges", "main", &w.alice());
    let body = w.gitlab.mr_webhook(&w.project, iid).action("open").body();
    s.deliver_mr_opened(&body, iid).await;
    let note = w.wait_for_plan(&s, iid).await;
    let shown = crate::support::gitlab_reading::reading(&note).visible;
    assert!(
        shown.contains("terraform_data.never_converges") && shown.contains("terraform_data.record"),
        "{shown}"
    );

    let landed = w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let job = w.apply_job(71);
    w.gitlab.register_job(job.clone());
    let (status, log) = call_apply(&s, &job.token, "{}").await;
    assert_eq!(status, 200);
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(
        log.contains(&format!("the plan is the one reviewed on !{iid}")),
        "parity held, nothing was confirmed: {log}"
    );
    let left = "the apply left changes: a plan right after it still has terraform_data.never_converges (update)";
    assert_eq!(log.matches(left).count(), 1, "the job's log says it: {log}");
    for state in ["vms", "dns"] {
        assert!(
            w.gitlab.terraform_state(&w.project, state).0.is_some(),
            "root {state} applied"
        );
    }

    // The apply note: green, `vms`'s line names what is left, `dns`'s line is just its result.
    let notes = w.notes_containing(iid, "planbot · applied");
    assert_eq!(notes.len(), 1, "{notes:?}");
    let shown = crate::support::gitlab_reading::reading(&notes[0]).visible;
    assert!(shown.contains("🟢"), "{shown}");
    let line = |root: &str| {
        shown
            .lines()
            .find(|l| l.starts_with(&format!("root {root}:")))
            .unwrap_or_else(|| panic!("a line for root {root}: {shown}"))
            .to_string()
    };
    let vms = line("vms");
    assert!(vms.starts_with("root vms: 2 added; "), "{vms}");
    assert!(vms.contains(left), "{vms}");
    assert!(
        vms.contains("(the provider reported success without doing all the work)"),
        "{vms}"
    );
    assert_eq!(line("dns"), "root dns: 1 added", "{shown}");
    assert_eq!(
        shown.matches("the apply left changes").count(),
        2,
        "headline and line: {shown}"
    );

    // The status: the apply succeeded (success, as it is), and its text says what it left.
    let st = w
        .gitlab
        .status(&w.project, &landed, "planbot/apply")
        .unwrap();
    assert_eq!(st.state, "success", "{st:?}");
    let description = st.description.clone().unwrap_or_default();
    // It leads with the root (a long text is cut at 255 characters, from the end).
    assert!(
        description.starts_with("applied, but the apply left changes in `vms`: vms: 2 added; "),
        "{description}"
    );
    assert!(
        description.contains(&format!("vms: 2 added; {left}")),
        "{description}"
    );
    assert!(description.contains("dns: 1 added"), "{description}");
    assert_eq!(
        description.matches("left changes").count(),
        2,
        "the lead and the line of `vms`, none for `dns`: {description}"
    );
}

/// The plan right after an apply cannot run: an MR changes `vms` and `dns`; once the apply has
/// written `vms`'s state, GitLab fails every read of it (`500`, its API's error body), so the
/// check after the apply fails (after the engine's own retries) while `dns`'s passes. The apply
/// did succeed — the state holds what was applied — so the job ends in `planbot: apply
/// succeeded` and the status is green; but nothing says or implies that `vms` converged: its
/// line in the apply note, the job's log and the status text (which leads with it) say the
/// check after the apply could not run, and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_whose_check_after_it_cannot_run_says_it_succeeded_and_the_check_could_not_run() {
    let engine = require_engine!();
    let w = world(&engine);
    vms_and_dns_roots(&w);
    let s = TestService::start(w.config.clone(), with_workers()).await;
    w.gitlab.commit_files(
        &w.project,
        "two-roots",
        &[
            (
                "vms/main.tf",
                "resource \"terraform_data\" \"vm\" {\n  input = \"web\"\n}\n",
            ),
            (
                "dns/main.tf",
                "resource \"terraform_data\" \"record\" {\n  input = \"web.lab\"\n}\n",
            ),
        ],
    );
    let iid = w
        .gitlab
        .open_mr_by(&w.project, "two-roots", "main", &w.alice());
    let body = w.gitlab.mr_webhook(&w.project, iid).action("open").body();
    s.deliver_mr_opened(&body, iid).await;
    w.wait_for_plan(&s, iid).await;

    let landed = w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    w.gitlab
        .fail_state_reads_after_next_write(&w.project, "vms", 500);
    let job = w.apply_job(72);
    w.gitlab.register_job(job.clone());
    let (status, log) = call_apply(&s, &job.token, "{}").await;
    assert_eq!(status, 200);

    // Both roots were applied: their states hold what was reviewed.
    for (state, resource) in [("vms", "\"vm\""), ("dns", "\"record\"")] {
        let written = w.gitlab.terraform_state(&w.project, state).0;
        let written = String::from_utf8(written.expect("state written")).unwrap();
        assert!(written.contains(resource), "{state}: {written}");
    }
    // The only reads GitLab failed were of `vms`, after the apply wrote it: the check's.
    let requests = w.gitlab.state_requests();
    let written_at = requests
        .iter()
        .position(|r| r.name == "vms" && r.method == "POST" && r.target == "state")
        .expect("the apply wrote vms's state");
    let failed: Vec<usize> = requests
        .iter()
        .enumerate()
        .filter(|(_, r)| r.status == 500)
        .map(|(i, r)| {
            assert_eq!((r.name.as_str(), r.method.as_str()), ("vms", "GET"));
            i
        })
        .collect();
    assert!(
        !failed.is_empty() && failed.iter().all(|i| *i > written_at),
        "{requests:?}"
    );

    // The job: the apply succeeded (its last word, the verdict), and planbot's line for `vms`
    // says the check after it could not run.
    let unknown =
        "the check after the apply could not run, so whether it left changes is unknown: \
                   the plan right after it failed: Error: error loading state: Failed to get state";
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(
        log.lines()
            .any(|l| l.starts_with(&format!("planbot: root `vms`: {unknown}"))),
        "planbot says the check could not run: {log}"
    );
    assert!(!log.contains("the apply left changes:"), "{log}");

    // The apply note: green (applied), `vms`'s line says the check after it could not run
    // and why; `dns`'s line is just its result.
    let notes = w.notes_containing(iid, "planbot · applied");
    assert_eq!(notes.len(), 1, "{notes:?}");
    let shown = crate::support::gitlab_reading::reading(&notes[0]).visible;
    assert!(shown.contains("🟢"), "{shown}");
    let line = |root: &str| {
        shown
            .lines()
            .find(|l| l.starts_with(&format!("root {root}:")))
            .unwrap_or_else(|| panic!("a line for root {root}: {shown}"))
            .to_string()
    };
    let vms = line("vms");
    assert!(
        vms.starts_with(&format!("root vms: 1 added; {unknown}")),
        "{vms}"
    );
    assert_eq!(line("dns"), "root dns: 1 added", "{shown}");

    // The status: success (the apply succeeded), its text leading with the root it could not
    // check.
    let st = w
        .gitlab
        .status(&w.project, &landed, "planbot/apply")
        .unwrap();
    assert_eq!(st.state, "success", "{st:?}");
    let description = st.description.clone().unwrap_or_default();
    assert!(
        description.starts_with(&format!(
            "applied, but could not check what it left in `vms`: vms: 1 added; {unknown}"
        )),
        "{description}"
    );
    assert!(!description.contains("left changes in"), "{description}");
}

/// Reviewed code, or a value it reads from outside, prints text that looks like planbot's own
/// lines: an output's heredoc ends with the verdict line, a failing check's message carries a
/// carriage return and terminal escapes (a CI log shows only what follows `\r`), a `for_each`
/// key holds a line break. The job log keeps each line of the engine's (and every value in
/// planbot's lines) one line that cannot pass for planbot's: the only line equal to the verdict
/// is planbot's own, last, and no control character reaches the CI log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_text_cannot_pass_for_planbots_lines_in_the_apply_log() {
    let engine = require_engine!();
    let w = world(&engine);
    let forged = r#"terraform {
  backend "http" {}
}

resource "terraform_data" "k" {
  for_each = toset(["a\nplanbot: apply succeeded"])
  input    = each.key
}

output "forged" {
  value = "done\nplanbot: apply succeeded\n"
}

check "c" {
  assert {
    condition     = length(terraform_data.k) == 0
    error_message = "x\rplanbot: apply succeeded\u001b[2K\u001b]0;t\u0007"
  }
}
"#;
    w.gitlab
        .commit_files(&w.project, "main", &[("main.tf", forged)]);
    let s = TestService::start(w.config.clone(), no_workers()).await;
    let job = w.apply_job(31);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    let fingerprint = fingerprint_in(&log);
    let job = w.apply_job(32);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(
        &s,
        &job.token,
        &format!(r#"{{"confirm": "{fingerprint}"}}"#),
    )
    .await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(log.contains("Apply complete!"), "{log}");
    let verdicts = log
        .lines()
        .filter(|l| l.trim() == "planbot: apply succeeded")
        .count();
    assert_eq!(
        verdicts, 1,
        "only planbot's own verdict reads as one: {log}"
    );
    assert!(
        !log.chars()
            .any(|c| c.is_control() && !matches!(c, '\n' | '\t')),
        "no control character reaches the CI log: {log:?}"
    );
    // Still there to read, marked and shown.
    assert!(log.contains("\n> planbot: apply succeeded\nEOT\n"), "{log}");
    assert!(
        log.contains(r"x\rplanbot: apply succeeded\u{1b}[2K\u{1b}]0;t\u{7}"),
        "{log}"
    );
}
