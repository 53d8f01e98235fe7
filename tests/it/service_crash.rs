//! planbot SIGKILLed in the middle of a plan: the accepted delivery is not lost, the plan runs
//! again after the restart, and the MR ends with exactly one plan note and a final status.

use crate::support::fake_gitlab::FakeGitLab;
use crate::support::service::{config_for, token_headers, TestService, WEBHOOK_SECRET};
use planbot::core::render::NOTE_MARKER;
use planbot::flows::service::server::Options;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

/// A stand-in engine for this story only: the real engine, with a `plan` slow enough to crash in.
fn slow_engine(dir: &std::path::Path, real: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("slow-tofu");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nif [ \"$1\" = plan ]; then sleep 4; fi\nexec {} \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_plan_and_restarted_the_mr_gets_exactly_one_plan_note() {
    let real = require_engine!();
    let tools = tempfile::tempdir().unwrap();
    let engine = slow_engine(tools.path(), &real);
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(
        &project,
        "main",
        &[(
            "main.tf",
            "resource \"terraform_data\" \"vm\" {\n  input = \"blocky\"\n}\n",
        )],
    );
    fake.commit_files(
        &project,
        "more-vms",
        &[(
            "main.tf",
            "resource \"terraform_data\" \"vm\" {\n  input = \"blocky-v2\"\n}\n",
        )],
    );
    let iid = fake.open_mr(&project, "more-vms", "main");
    let head = fake.mr_sha(&project, iid);
    let data = tempfile::tempdir().unwrap();

    // planbot as a real process, so that it can be SIGKILLed.
    let config_file = tools.path().join("planbot.toml");
    let config = config_for(data.path(), &fake, "infra/homelab", &engine);
    std::fs::write(&config_file, config.text()).unwrap();
    let (mut child, port) = crate::support::spawn_serve(&config_file);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    // It said it serves: its socket is bound and answers.
    let health = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert!(health.status().is_success());
    let body = fake.mr_webhook(&project, iid).action("open").body();
    let mut req = http.post(format!("{base}/webhooks/gitlab")).body(body);
    for (k, v) in token_headers("Merge Request Hook", "crash-1", WEBHOOK_SECRET) {
        req = req.header(k, v);
    }
    assert_eq!(req.send().await.unwrap().status(), 200, "accepted");

    // The plan is under way (status running, engine sleeping in `plan`): crash.
    let deadline = Instant::now() + Duration::from_secs(30);
    while fake
        .status(&project, &head, "planbot/plan")
        .is_none_or(|s| s.state != "running")
    {
        assert!(Instant::now() < deadline, "the plan never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    for pid in crate::support::processes_under(data.path()) {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(fake
        .notes(&project, iid)
        .iter()
        .all(|n| !n.body.contains(NOTE_MARKER)));

    // Restarted on the same data dir: the interrupted job runs again, to one final note.
    let s = TestService::start(
        config.load(),
        Options {
            workers: true,
            reconcile: false,
        },
    )
    .await;
    let (f, p) = (&fake, &project);
    s.after_job_ends("a final planbot/plan status", 60, || async {
        f.status(p, &head, "planbot/plan")
            .is_some_and(|st| st.state == "success")
    })
    .await;
    let notes: Vec<_> = fake
        .notes(&project, iid)
        .into_iter()
        .filter(|n| n.body.contains(NOTE_MARKER))
        .collect();
    assert_eq!(notes.len(), 1, "exactly one plan note");
    assert!(notes[0].body.contains("blocky-v2"), "{}", notes[0].body);
    s.after_job_ends("the plan job to be recorded done", 30, || {
        s.jobs_all_ended()
    })
    .await;
    let jobs = s.app.store.recent_jobs(10).await.unwrap();
    // (The start-up reconcile may have queued a plan that the webhook's then superseded.)
    let plan_jobs: Vec<_> = jobs
        .iter()
        .filter(|j| j.kind == "plan" && j.state != "canceled")
        .collect();
    assert_eq!(
        plan_jobs.len(),
        1,
        "one job, run again after the crash: {plan_jobs:?}"
    );
    assert_eq!(plan_jobs[0].state, "done");
    assert_eq!(plan_jobs[0].attempts, 2);
}
