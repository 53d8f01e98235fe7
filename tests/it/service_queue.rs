//! Stories of the durable queue: restarts, crashes, supersede of running jobs, reconcile, probes.

use crate::support::gate::{gate_mirror, gate_sh, gated_tf, Gate};
use crate::support::service::*;
use crate::support::world::PlanbotConfig;
use planbot::capabilities::store::{NewRun, RunEnd, RunKind, RunState};
use planbot::core::config::Config;
use planbot::core::events::{Job, PlanReason};
use planbot::core::ids::{CommitSha, MrIid, ProjectId};
use planbot::flows::service::server::Options;

const MR: &str = "Merge Request Hook";
const HEAD: &str = "e59094b8de0f2f91abbe4760a52d9137260252d8";

fn quiet() -> Options {
    Options {
        workers: false,
        reconcile: false,
    }
}

fn workers() -> Options {
    Options {
        workers: true,
        reconcile: false,
    }
}

/// The test service's config watching `flightjs/flight-management`, as `edit` varies it.
fn with(
    edit: impl Fn(PlanbotConfig) -> PlanbotConfig,
    dir: &std::path::Path,
    gitlab: &str,
) -> Config {
    edit(test_config(dir, gitlab).projects(&["flightjs/flight-management"])).load()
}

#[tokio::test]
async fn a_queued_job_survives_a_restart_and_then_runs() {
    let dir = tempfile::tempdir().unwrap();
    let gitlab = dead_url();
    let s = TestService::start(config(dir.path(), &gitlab, false), quiet()).await;
    assert_eq!(
        s.deliver(
            &mr_event(HEAD, "open"),
            &token_headers(MR, "r-1", WEBHOOK_SECRET)
        )
        .await,
        200
    );
    assert_eq!(s.app.store.queue_depth().await.unwrap(), 1);
    s.kill().await;

    // A new process on the same data_dir, this time with workers.
    let s = TestService::start(config(dir.path(), &gitlab, false), workers()).await;
    let store = s.app.store.clone();
    s.after_job_ends("the queued plan job to be run", 10, || {
        let store = store.clone();
        async move {
            let jobs = store.recent_jobs(10).await.unwrap();
            jobs.len() == 1 && jobs[0].state != "queued" && jobs[0].state != "running"
        }
    })
    .await;
    let jobs = store.recent_jobs(10).await.unwrap();
    // Run exactly once, by the new process (GitLab is unreachable here, so the plan itself
    // fails; `service_e2e` tells the same story with a fake GitLab and the real engine).
    assert_eq!(jobs[0].attempts, 1);
    assert_eq!(jobs[0].sha.as_deref(), Some(HEAD));
    assert!(jobs[0].started_at.is_some());
    assert_eq!(store.queue_depth().await.unwrap(), 0);
}

#[tokio::test]
async fn a_job_running_when_the_process_died_is_run_again_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let gitlab = dead_url();
    let s = TestService::start(config(dir.path(), &gitlab, false), quiet()).await;
    s.deliver(
        &mr_event(HEAD, "open"),
        &token_headers(MR, "crash-1", WEBHOOK_SECRET),
    )
    .await;
    // A worker took it, and then the process died mid-plan.
    let claimed = s.app.store.claim_next().await.unwrap().unwrap();
    assert_eq!(
        s.app.store.job(claimed.id).await.unwrap().unwrap().state,
        "running"
    );
    s.kill().await;

    let s = TestService::start(config(dir.path(), &gitlab, false), workers()).await;
    let store = s.app.store.clone();
    let id = claimed.id;
    s.after_job_ends("the interrupted job to run again", 10, || {
        let store = store.clone();
        async move {
            let j = store.job(id).await.unwrap().unwrap();
            j.attempts == 2 && j.state != "running" && j.state != "queued"
        }
    })
    .await;
}

#[tokio::test]
async fn closing_an_mr_cancels_its_running_job_and_frees_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    // GitLab stops answering: the command job hangs on its first API call.
    let hung = MiniGitLab::start(vec![], true).await;
    let cfg = with(
        |c| {
            c.plan_slots(1)
                .set("engine", "grace", "\"0s\"")
                .projects(&["gitlab-org/gitlab-test"])
        },
        dir.path(),
        &hung.url,
    );
    let s = TestService::start(cfg, workers()).await;
    let mut note: serde_json::Value =
        serde_json::from_str(&fixture("webhooks/note_merge_request.json")).unwrap();
    note["object_attributes"]["note"] = "planbot help".into();
    s.deliver(
        &note.to_string(),
        &token_headers("Note Hook", "cmd-1", WEBHOOK_SECRET),
    )
    .await;
    let store = s.app.store.clone();
    let app = s.app.clone();
    // Claimed in the store first, then registered with its cancellation token: wait for both.
    s.eventually("the command job to be running", || {
        let (store, app) = (store.clone(), app.clone());
        async move {
            app.queue.running() == 1
                && store
                    .recent_jobs(10)
                    .await
                    .unwrap()
                    .iter()
                    .any(|j| j.kind == "command" && j.state == "running")
        }
    })
    .await;

    // Close MR !1 of project 5 (the note's MR).
    let mut close: serde_json::Value =
        serde_json::from_str(&fixture("webhooks/merge_request_open.json")).unwrap();
    close["project"]["id"] = 5.into();
    close["project"]["path_with_namespace"] = "gitlab-org/gitlab-test".into();
    close["object_attributes"]["iid"] = 1.into();
    close["object_attributes"]["action"] = "close".into();
    assert_eq!(
        s.deliver(
            &close.to_string(),
            &token_headers(MR, "close-1", WEBHOOK_SECRET)
        )
        .await,
        200
    );

    // The single worker is freed and runs the close job.
    s.after_job_ends("the close job to finish on the freed worker", 10, || {
        let store = store.clone();
        async move {
            store
                .recent_jobs(10)
                .await
                .unwrap()
                .iter()
                .any(|j| j.kind == "closed" && j.state == "done")
        }
    })
    .await;
    let jobs = store.recent_jobs(10).await.unwrap();
    let cmd = jobs.iter().find(|j| j.kind == "command").unwrap();
    assert_eq!(cmd.state, "canceled");
    assert_eq!(cmd.detail.as_deref(), Some("the merge request was closed"));
    assert_eq!(s.app.queue.running(), 0);
}

#[tokio::test]
async fn start_up_reconciliation_plans_open_mrs_whose_head_has_no_plan() {
    let dir = tempfile::tempdir().unwrap();
    let planned = "1111111111111111111111111111111111111111";
    let missed = "2222222222222222222222222222222222222222";
    let fork = "3333333333333333333333333333333333333333";
    let gitlab = MiniGitLab::start(
        vec![
            open_mr(16, planned, 2),
            open_mr(17, missed, 2),
            open_mr(18, fork, 77),
        ],
        false,
    )
    .await;
    // Before the downtime, MR !16 was planned at its head.
    let s = TestService::start(with(|c| c, dir.path(), &gitlab.url), quiet()).await;
    finished_run(&s, 16, planned, RunState::Succeeded, "").await;
    s.kill().await;

    let s = TestService::start(
        with(|c| c, dir.path(), &gitlab.url),
        Options {
            workers: true,
            reconcile: true,
        },
    )
    .await;
    let store = s.app.store.clone();
    s.after_job_ends("the reconcile job to finish", 10, || {
        let store = store.clone();
        async move {
            store
                .recent_jobs(20)
                .await
                .unwrap()
                .iter()
                .any(|j| j.kind == "reconcile" && j.state == "done")
        }
    })
    .await;
    let plans: Vec<_> = store
        .recent_jobs(20)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|j| match j.job {
            Some(Job::Plan(p)) => Some(p),
            _ => None,
        })
        .collect();
    let reconciled: Vec<_> = plans
        .iter()
        .filter(|p| p.reason == PlanReason::Reconcile)
        .collect();
    assert_eq!(reconciled.len(), 1, "{plans:?}");
    assert_eq!(reconciled[0].mr.0, 17);
    assert_eq!(reconciled[0].head.as_str(), missed);
    assert_eq!(
        reconciled[0].project_path.as_deref(),
        Some("flightjs/flight-management")
    );
    assert!(
        !plans.iter().any(|p| p.head.as_str() == fork),
        "fork MRs are never planned automatically"
    );
}

#[tokio::test]
async fn probes_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    assert_eq!(s.get_text("/healthz").await.0, 200);
    let (status, body) = s.get_text("/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("store: ok"), "{body}");
    assert!(body.contains("gitlab: GET /user"), "{body}");
    assert!(!body.contains("glpat-test-token-not-real"));
    s.kill().await;

    let gitlab = MiniGitLab::start(vec![], false).await;
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &gitlab.url, false), quiet()).await;
    let (status, body) = s.get_text("/readyz").await;
    assert_eq!(
        (status.as_u16(), body.as_str()),
        (200, "store: ok\ngitlab: ok\n")
    );
    let metrics = s.metrics().await;
    assert!(metrics.contains("planbot_queue_depth 0"), "{metrics}");
    assert!(
        metrics.contains("# TYPE planbot_plan_duration_seconds histogram"),
        "{metrics}"
    );
}

async fn finished_run(
    s: &TestService,
    mr: u64,
    sha: &str,
    state: RunState,
    log: &str,
) -> planbot::core::ids::RunId {
    let id = s
        .app
        .store
        .start_run(NewRun {
            job: None,
            kind: RunKind::Plan,
            project: ProjectId(2),
            project_path: Some("flightjs/flight-management".into()),
            mr: Some(MrIid(mr)),
            root: "tofu/stacks/core".into(),
            sha: CommitSha(sha.into()),
        })
        .await
        .unwrap();
    s.app
        .store
        .finish_run(
            id,
            RunEnd {
                state,
                summary: Some("1 to add, 0 to change, 0 to destroy".into()),
                log: log.into(),
                note_markdown: Some("<!-- planbot:mr-note v1 -->\n### Plan for <core>".into()),
                fingerprint: None,
            },
        )
        .await
        .unwrap();
    id
}

#[tokio::test]
async fn run_pages_list_runs_and_show_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    let (status, page) = s.get_text("/runs").await;
    assert_eq!(status, 200);
    assert!(page.contains("No runs yet"));
    let id = finished_run(
        &s,
        16,
        HEAD,
        RunState::Failed,
        "Error: <script>alert(1)</script>",
    )
    .await;
    let (status, page) = s.get_text("/runs").await;
    assert_eq!(status, 200);
    assert!(page.contains("flightjs&#x2f;flight-management"), "{page}");
    assert!(page.contains("!16"));
    assert!(page.contains("e59094b8"));
    assert!(page.contains("state-failed"));
    let (status, page) = s.get_text(&format!("/runs/{id}")).await;
    assert_eq!(status, 200);
    assert!(page.contains(HEAD));
    // The note is rendered the way GitLab renders it: a heading, and the raw `<core>` tag in
    // the Markdown dropped by the sanitiser (planbot's own notes escape such values).
    assert!(page.contains("<h3>Plan for </h3>"), "{page}");
    assert!(!page.contains("<core>"), "{page}");
    assert!(page.contains("Error: &lt;script&gt;"), "{page}");
    assert!(!page.contains("<script"));
    let (status, page) = s.get_text("/runs/999999").await;
    assert_eq!(status, 404);
    assert!(page.contains("Run #999999 does not exist"));
}

/// A root that plans one `terraform_data` with `input`.
fn data_root(input: &str) -> String {
    format!("resource \"terraform_data\" \"vm\" {{\n  input = \"{input}\"\n}}\n")
}

/// A project with two roots, `slow` and `fast`, on the fake GitLab.
fn two_root_project(
    fake: &crate::support::fake_gitlab::FakeGitLab,
) -> crate::support::fake_gitlab::FakeProject {
    let project = fake.create_project("infra/homelab");
    let roots = "[[roots]]\nname = \"slow\"\ndir = \"slow\"\n\n[[roots]]\nname = \"fast\"\ndir = \"fast\"\n";
    fake.commit_files(
        &project,
        "main",
        &[
            (".planbot.toml", roots),
            ("slow/main.tf", &data_root("slow")),
            ("fast/main.tf", &data_root("fast")),
        ],
    );
    project
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_deadline_is_stopped_its_status_says_so_and_its_worker_is_free() {
    use crate::support::fake_gitlab::FakeGitLab;
    let engine = require_engine!();
    let fake = FakeGitLab::start();
    let project = two_root_project(&fake);
    fake.commit_files(&project, "x-one", &[("slow/main.tf", &data_root("x1"))]);
    let x1 = fake.open_mr(&project, "x-one", "main");
    let data = tempfile::tempdir().unwrap();
    let cfg = bench_config(data.path(), &fake, "infra/homelab", &engine)
        .plan_slots(2)
        .set("plan", "job_timeout", "\"2s\"")
        // A stopped job that does not end by itself is dropped after the grace (and 2 s).
        .set("engine", "grace", "\"1s\"")
        .load();
    let s = TestService::start(cfg, workers()).await;
    // The job never gets an engine slot (both held here for the whole test): only its deadline
    // ends it.
    let held = (s.app.engine_slot().await, s.app.engine_slot().await);
    s.deliver_mr_opened(&fake.mr_webhook(&project, x1).body(), x1)
        .await;
    s.after_job_ends("the job to end at its deadline", 60, || s.jobs_all_ended())
        .await;
    let jobs = s.app.store.recent_jobs(10).await.unwrap();
    assert_eq!(jobs[0].state, "failed", "{jobs:?}");
    assert_eq!(
        jobs[0].detail.as_deref(),
        Some("stopped after the job deadline of 2s (plan.job_timeout)")
    );
    let head = fake.mr_sha(&project, x1);
    let status = fake.status(&project, &head, "planbot/plan").unwrap();
    assert_eq!(
        (status.state.as_str(), status.description.as_deref()),
        (
            "failed",
            Some("planbot: stopped after the job deadline of 2s (plan.job_timeout)")
        )
    );
    assert_eq!(s.app.queue.running(), 0, "its worker is free again");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_authors_slow_plans_leave_a_worker_for_another_authors_mr() {
    use crate::support::fake_gitlab::{FakeGitLab, DEVELOPER};
    let engine = require_engine!();
    let fake = FakeGitLab::start();
    let project = two_root_project(&fake);
    let (xavier, yolanda) = (fake.create_user("xavier"), fake.create_user("yolanda"));
    fake.add_member(&project, &xavier, DEVELOPER);
    fake.add_member(&project, &yolanda, DEVELOPER);
    // Xavier's two MRs change the slow root, Yolanda's the fast one; the code of Xavier's first
    // waits (at the test's gate) as long as the test holds it.
    let (mirror, mut gate) = (gate_mirror(), Gate::start().await);
    let x1_files = [
        ("slow/main.tf", gated_tf(&data_root("x1"))),
        ("slow/gate.sh", gate_sh(gate.port, "slow")),
    ];
    let x1_files: Vec<(&str, &str)> = x1_files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    fake.commit_files(&project, "x-one", &x1_files);
    fake.commit_files(&project, "x-two", &[("slow/main.tf", &data_root("x2"))]);
    fake.commit_files(&project, "y-one", &[("fast/main.tf", &data_root("y1"))]);
    let x1 = fake.open_mr_by(&project, "x-one", "main", &xavier);
    let x2 = fake.open_mr_by(&project, "x-two", "main", &xavier);
    let y1 = fake.open_mr_by(&project, "y-one", "main", &yolanda);

    let data = tempfile::tempdir().unwrap();
    let cfg = bench_config(data.path(), &fake, "infra/homelab", &engine)
        .plan_slots(2)
        .set(
            "engine",
            "provider_mirror",
            &format!("\"{}\"", mirror.path().display()),
        )
        .sandbox_reaches(gate.port)
        .load();
    let s = TestService::start(cfg, workers()).await;

    // Xavier's first plan runs his code, which waits: his job keeps its worker meanwhile.
    s.deliver_mr_opened(&fake.mr_webhook(&project, x1).body(), x1)
        .await;
    assert_eq!(gate.next_arrival(120).await, "slow");
    s.deliver_mr_opened(&fake.mr_webhook(&project, x2).body(), x2)
        .await;
    s.deliver_mr_opened(&fake.mr_webhook(&project, y1).body(), y1)
        .await;

    // Yolanda's MR gets a worker and its note while Xavier's plans are still held up.
    let y_head = fake.mr_sha(&project, y1);
    s.eventually_for("Yolanda's plan to succeed", 120, || {
        let done = fake
            .statuses(&project, &y_head)
            .iter()
            .any(|st| st.name == "planbot/plan" && st.state == "success");
        std::future::ready(done)
    })
    .await;
    let note = fake
        .plan_note(&project, y1)
        .expect("Yolanda's MR has its note");
    assert!(note.contains("fast"), "{note}");
    let jobs = s.app.store.recent_jobs(10).await.unwrap();
    let state_of = |iid: u64| {
        jobs.iter()
            .find(|j| j.kind == "plan" && j.mr == Some(MrIid(iid)))
            .map(|j| j.state.clone())
    };
    assert_eq!(state_of(x1).as_deref(), Some("running"), "{jobs:?}");
    // Xavier holds one worker of two: his second MR waits its turn, not Yolanda's.
    assert_eq!(state_of(x2).as_deref(), Some("queued"), "{jobs:?}");
    assert!(fake.plan_note(&project, x1).is_none());

    // His code goes on: Xavier's MRs get their notes too, one after the other.
    gate.open();
    s.after_job_ends("every plan to end", 240, || s.jobs_all_ended())
        .await;
    for iid in [x1, x2] {
        assert!(
            fake.plan_note(&project, iid).is_some(),
            "Xavier's !{iid} has its note"
        );
    }
}

/// What the files under `dir` take on disk (allocated blocks; links not followed).
fn disk_usage(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        total += meta.blocks() * 512;
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_that_writes_past_the_disk_quota_fails_with_a_note_and_data_dir_keeps_none_of_it() {
    use crate::support::fake_engine::{fake_engine, TERRAFORM_VERSION_JSON};
    use crate::support::fake_gitlab::FakeGitLab;
    const MIB: u64 = 1 << 20;
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(&project, "main", &[("main.tf", &data_root("main"))]);
    fake.commit_files(&project, "fill", &[("main.tf", &data_root("fill"))]);
    let iid = fake.open_mr(&project, "fill", "main");
    // The MR's code runs in `plan` (a stand-in engine does what it did): 1 GiB into its
    // checkout, one MiB at a time.
    let bin = tempfile::tempdir().unwrap();
    let engine = fake_engine(
        bin.path(),
        "terraform",
        TERRAFORM_VERSION_JSON,
        r#"if [ "$1" = plan ]; then
  i=0
  while [ $i -lt 1024 ]; do head -c 1048576 /dev/urandom > junk.$i || exit 1; i=$((i+1)); done
  echo "wrote the whole gigabyte"
fi"#,
    );
    let data = tempfile::tempdir().unwrap();
    let cfg = bench_config(data.path(), &fake, "infra/homelab", &engine)
        .set("sandbox", "disk_max", "\"64 MiB\"")
        .load();
    let s = TestService::start(cfg, workers()).await;
    let before = disk_usage(data.path());
    // Measured while the job runs: the most data_dir held.
    let sampler = PeakSampler::start(data.path());
    s.deliver_mr_opened(&fake.mr_webhook(&project, iid).body(), iid)
        .await;
    s.after_job_ends("the plan job to end", 120, || s.jobs_all_ended())
        .await;
    let peak = sampler.stop().saturating_sub(before);
    let note = fake.plan_note(&project, iid).expect("the MR has its note");
    assert!(
        note.contains("took more than 64 MiB, the most a job may write (`sandbox.disk_max`)"),
        "{note}"
    );
    assert!(!note.contains("wrote the whole gigabyte"), "{note}");
    let head = fake.mr_sha(&project, iid);
    assert_eq!(
        fake.status(&project, &head, "planbot/plan").unwrap().state,
        "failed"
    );
    // data_dir held the quota and what was written in the moment before the engine was
    // killed, far from the gigabyte; once the job ended, nothing of it is left.
    assert!(peak > 32 * MIB, "the measure saw the writes: {peak}");
    assert!(
        peak < 64 * MIB + 192 * MIB,
        "data_dir grew by {} MiB at most",
        peak / MIB
    );
    let after = disk_usage(data.path()).saturating_sub(before);
    assert!(after < 4 * MIB, "data_dir kept {} KiB", after / 1024);
}

/// A few KiB of git objects can hold gigabytes of files: one blob named many times. The MR's
/// commit is sized from git before it is checked out, and refused when its files would take
/// more than a job may write: data_dir never holds them, and the note says why. (Before, the
/// checkout wrote every copy, unwatched: `sandbox.disk_max` is counted only while the engine
/// runs, and an MR of a few MiB of objects could fill the disk planbot's store lives on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_whose_files_would_take_more_than_the_disk_quota_is_never_checked_out() {
    use crate::support::fake_engine::{fake_engine, TERRAFORM_VERSION_JSON};
    use crate::support::fake_gitlab::FakeGitLab;
    const MIB: u64 = 1 << 20;
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(&project, "main", &[("main.tf", &data_root("main"))]);
    fake.commit_files(&project, "bomb", &[("main.tf", &data_root("bomb"))]);
    // 48 names of one 4 MiB blob: 192 MiB checked out, from a few KiB of objects.
    fake.commit_blob_copies(&project, "bomb", "junk", "0000000000000000", 4 * MIB, 48);
    let iid = fake.open_mr(&project, "bomb", "main");
    let bin = tempfile::tempdir().unwrap();
    let engine = fake_engine(bin.path(), "terraform", TERRAFORM_VERSION_JSON, "");
    let data = tempfile::tempdir().unwrap();
    let cfg = bench_config(data.path(), &fake, "infra/homelab", &engine)
        .set("sandbox", "disk_max", "\"64 MiB\"")
        .load();
    let s = TestService::start(cfg, workers()).await;
    let before = disk_usage(data.path());
    let sampler = PeakSampler::start(data.path());
    s.deliver_mr_opened(&fake.mr_webhook(&project, iid).body(), iid)
        .await;
    s.after_job_ends("the plan job to end", 120, || s.jobs_all_ended())
        .await;
    let peak = sampler.stop().saturating_sub(before);
    assert!(
        peak < 32 * MIB,
        "data_dir grew by {} MiB while the MR was handled",
        peak / MIB
    );
    let head = fake.mr_sha(&project, iid);
    let status = fake.status(&project, &head, "planbot/plan").unwrap();
    assert_eq!(status.state, "failed", "{status:?}");
    let said = format!(
        "{}\n{}",
        status.description.clone().unwrap_or_default(),
        fake.plan_note(&project, iid).unwrap_or_default()
    );
    assert!(
        said.contains("planbot could not plan: commit `")
            && said.contains("would take 192.0 MiB on disk checked out (")
            && said.contains("more than a job may write (`sandbox.disk_max`, 64 MiB)"),
        "{said}"
    );
}

/// The most a directory held while a story ran: measured every 5 ms on a thread of its own
/// (a measurement, not a synchronisation: the story waits on the job's own marker).
struct PeakSampler {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl PeakSampler {
    fn start(dir: &std::path::Path) -> PeakSampler {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (dir, stop) = (dir.to_path_buf(), done.clone());
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(disk_usage(&dir));
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            peak
        });
        PeakSampler { done, thread }
    }

    /// Stop measuring; the peak in bytes.
    fn stop(self) -> u64 {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}
