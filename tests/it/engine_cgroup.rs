//! Per-run cgroups (issue 34, "jobs cannot take the service down"): every engine process of a
//! run, and all it starts, in a cgroup made for the run with a memory and a tasks limit,
//! killed and removed when the run ends. Stand-in engines (scripts) do what MR code can: start
//! eight processes of 250 MiB, start processes until the kernel refuses, escape the process
//! group with `setsid`.
//!
//! These tests need a cgroup planbot may manage (cgroup v2 delegated with `memory` and `pids`,
//! or cgroup v1 `memory` and `pids` it may write: run them as root, or under systemd with
//! `Delegate=yes`). Where there is none they fail saying so; `PLANBOT_SKIP_CGROUP_TESTS=1`
//! skips them explicitly (never under `CI=true`).

use crate::support::fake_engine as fake;

use fake::{fake_engine, running_with, TERRAFORM_VERSION_JSON};
use planbot::capabilities::engine::{
    CgroupSupport, Engine, EngineError, JobCgroups, PlanRequest, Step,
};
use std::path::PathBuf;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// The host's cgroups with these limits; `None` only when skipping is asked for (never on CI).
fn cgroups(memory_max: u64, tasks_max: u64) -> Option<JobCgroups> {
    match CgroupSupport::prepare() {
        CgroupSupport::Unavailable { reason } => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            if !ci && std::env::var("PLANBOT_SKIP_CGROUP_TESTS").is_ok_and(|v| v == "1") {
                eprintln!("cgroup test NOT RUN: PLANBOT_SKIP_CGROUP_TESTS=1 ({reason})");
                return None;
            }
            panic!(
                "this host gives planbot no cgroup to manage ({reason}). Run the tests as root \
                 (cgroup v1 `memory` and `pids` writable, or cgroup v2 with both controllers), or \
                 under systemd with a delegated cgroup (`systemd-run --user -p Delegate=yes \
                 --pty cargo test ...`); or skip them with PLANBOT_SKIP_CGROUP_TESTS=1"
            )
        }
        s => Some(JobCgroups::new(s, memory_max, tasks_max).expect("available")),
    }
}

/// The cgroup directories a process listed in its `/proc/self/cgroup` copy is in, for the
/// controllers a run's cgroup has (v2: the `0::` line; v1: `memory` and `pids`).
fn run_cgroup_dirs(proc_self_cgroup: &str) -> Vec<PathBuf> {
    let support = CgroupSupport::prepare();
    let own = |controller: &str| {
        proc_self_cgroup.lines().find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, c, path) = (p.next()?, p.next()?, p.next()?);
            let hit = if controller.is_empty() {
                c.is_empty()
            } else {
                c.split(',').any(|x| x == controller)
            };
            hit.then(|| path.rsplit('/').next().unwrap_or_default().to_string())
        })
    };
    match support {
        CgroupSupport::V2 { parent } => vec![parent.join(own("").expect("0:: line"))],
        CgroupSupport::V1 { memory, pids } => vec![
            memory.join(own("memory").expect("memory line")),
            pids.join(own("pids").expect("pids line")),
        ],
        CgroupSupport::Unavailable { .. } => unreachable!(),
    }
}

#[tokio::test]
async fn eight_engine_processes_of_250_mib_end_at_the_runs_memory_cap_and_the_service_lives() {
    let Some(cgroups) = cgroups(512 * MIB, 256) else {
        return;
    };
    let bin_dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let temp_root = tempfile::tempdir().unwrap();
    let seen = bin_dir.path().join("cgroup");
    // Eight children, each touching 250 MiB (2 GiB together): under the 4 GiB per-process cap,
    // four times the run's cap.
    let body = format!(
        r#"if [ "$1" = plan ]; then
  cat /proc/self/cgroup > {seen}
  for i in 1 2 3 4 5 6 7 8; do
    perl -e '$x = "a" x (250 * 1024 * 1024); sleep 2' &
    pids="$pids $!"
  done
  failed=0
  for p in $pids; do wait $p || failed=1; done
  exit $failed
fi"#,
        seen = seen.display()
    );
    let bin = fake_engine(bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
    let engine = Engine::builder(&bin, temp_root.path())
        .sandbox(fake::unsandboxed())
        .job_cgroups(Some(cgroups))
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();

    let err = engine
        .plan(root.path(), &PlanRequest::default())
        .await
        .unwrap_err();

    let EngineError::OverMemory { step, max, .. } = &err else {
        panic!("expected the run's memory cap, got {err:?}");
    };
    assert_eq!((*step, *max), (Step::Plan, 512 * MIB));
    // What the note shows names the cap and the key that sets it.
    let report = err.report(20);
    assert!(
        report.contains("more than 512 MiB") && report.contains("`sandbox.job_memory_max`"),
        "{report}"
    );
    // The test process (the service) lives on: it is here to check. The run's cgroup is gone.
    let seen = std::fs::read_to_string(&seen).expect("the stand-in recorded its cgroup");
    let dirs = run_cgroup_dirs(&seen);
    for dir in &dirs {
        assert!(
            dir.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("planbot-run-"),
            "the engine ran in {} (its /proc/self/cgroup: {seen})",
            dir.display()
        );
        assert!(!dir.exists(), "{} was left behind", dir.display());
    }
}

#[tokio::test]
async fn a_run_that_starts_processes_without_end_stops_at_the_tasks_cap_and_none_survives() {
    let Some(cgroups) = cgroups(1024 * MIB, 48) else {
        return;
    };
    let bin_dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let temp_root = tempfile::tempdir().unwrap();
    // Sandboxed (the default: Landlock and namespaces), so the cgroup is entered before the
    // namespaces are made. 300 processes, each in a session of its own (out of the engine's
    // process group, where planbot's group kill reaches), bounded so that this test cannot
    // hurt the machine when the cap is broken: 48 tasks stop it long before.
    let marker = format!("30.{}", std::process::id());
    let body = format!(
        r#"if [ "$1" = plan ]; then
  i=0
  while [ $i -lt 300 ]; do setsid sleep {marker} & i=$((i+1)); done
  wait
fi"#
    );
    let bin = fake_engine(bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
    let engine = Engine::builder(&bin, temp_root.path())
        .job_cgroups(Some(cgroups))
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();

    let err = engine
        .plan(root.path(), &PlanRequest::default())
        .await
        .unwrap_err();

    let EngineError::TooManyTasks { step, max, .. } = &err else {
        panic!("expected the run's tasks cap, got {err:?}");
    };
    assert_eq!((*step, *max), (Step::Plan, 48));
    assert!(
        err.report(5).contains("48 processes and threads")
            && err.to_string().contains("`sandbox.job_tasks_max`"),
        "{err}"
    );
    // The sleeps left the engine's process group: the cgroup's kill got them all.
    assert_eq!(
        running_with(&format!("sleep\0{marker}")),
        Vec::<u32>::new(),
        "processes of the run survived it"
    );
}

#[tokio::test]
async fn processes_that_leave_the_engines_group_are_killed_when_the_step_ends() {
    let Some(cgroups) = cgroups(1024 * MIB, 256) else {
        return;
    };
    let bin_dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let temp_root = tempfile::tempdir().unwrap();
    // Without the sandbox's PID namespace (whose end would kill them too), so only the run's
    // cgroup can find processes that left the engine's process group with `setsid`.
    let marker = format!("31.{}", std::process::id());
    let body = format!(
        r#"if [ "$1" = plan ]; then
  {write}
  for i in 1 2 3; do setsid sleep {marker} >/dev/null 2>&1 & done
fi
if [ "$1" = show ]; then echo '{json}'; fi"#,
        write = fake::WRITE_PLAN_FILE,
        json = fake::PLAN_JSON,
    );
    let bin = fake_engine(bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
    let engine = Engine::builder(&bin, temp_root.path())
        .sandbox(fake::unsandboxed())
        .job_cgroups(Some(cgroups))
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();

    let planned = engine
        .plan(root.path(), &PlanRequest::default())
        .await
        .expect("the plan succeeds");
    // The run is still held (its apply would run in the same cgroup), the step is over.
    assert_eq!(
        running_with(&format!("sleep\0{marker}")),
        Vec::<u32>::new(),
        "processes that left the engine's group outlived its step"
    );
    drop(planned);
}

/// The service story: an MR whose plan starts eight processes of 250 MiB (the service's
/// sandbox, its per-run cgroup capped at 512 MiB) fails with a note that names the cap, its
/// status fails, and planbot goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_whose_processes_pass_the_job_memory_cap_gets_a_note_naming_it() {
    use crate::support::fake_gitlab::FakeGitLab;
    use crate::support::service::{bench_config, TestService};
    if cgroups(512 * MIB, 256).is_none() {
        return;
    }
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    let root =
        |input: &str| format!("resource \"terraform_data\" \"vm\" {{\n  input = \"{input}\"\n}}\n");
    fake.commit_files(&project, "main", &[("main.tf", &root("main"))]);
    fake.commit_files(&project, "hog", &[("main.tf", &root("hog"))]);
    let iid = fake.open_mr(&project, "hog", "main");
    let bin = tempfile::tempdir().unwrap();
    let engine = fake_engine(
        bin.path(),
        "terraform",
        TERRAFORM_VERSION_JSON,
        r#"if [ "$1" = plan ]; then
  for i in 1 2 3 4 5 6 7 8; do
    perl -e '$x = "a" x (250 * 1024 * 1024); sleep 2' &
    pids="$pids $!"
  done
  failed=0
  for p in $pids; do wait $p || failed=1; done
  [ $failed = 0 ] && echo "all eight kept their memory"
  exit $failed
fi"#,
    );
    let data = tempfile::tempdir().unwrap();
    let cfg = bench_config(data.path(), &fake, "infra/homelab", &engine)
        .set("sandbox", "job_memory_max", "\"512 MiB\"")
        .load();
    let s = TestService::start(
        cfg,
        planbot::flows::service::server::Options {
            workers: true,
            reconcile: false,
        },
    )
    .await;
    s.deliver_mr_opened(&fake.mr_webhook(&project, iid).body(), iid)
        .await;
    s.after_job_ends("the plan job to end", 120, || s.jobs_all_ended())
        .await;
    let note = fake.plan_note(&project, iid).expect("the MR has its note");
    assert!(
        note.contains(
            "used more than 512 MiB, the most one job may use (`sandbox.job_memory_max`)"
        ),
        "{note}"
    );
    assert!(!note.contains("all eight kept their memory"), "{note}");
    let head = fake.mr_sha(&project, iid);
    assert_eq!(
        fake.status(&project, &head, "planbot/plan").unwrap().state,
        "failed"
    );
    // planbot lives on and answers.
    let r = s.http.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// A run cgroup left by a planbot that is gone (killed before it removed it) is removed when
/// the next one prepares its cgroups; one of a live process is kept.
#[test]
fn run_cgroups_of_a_planbot_that_is_gone_are_swept_at_start() {
    if cgroups(512 * MIB, 256).is_none() {
        return;
    }
    // A pid that no longer runs: a child that has exited and been reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let bases = match CgroupSupport::prepare() {
        CgroupSupport::V2 { parent } => vec![parent],
        CgroupSupport::V1 { memory, pids } => vec![memory, pids],
        CgroupSupport::Unavailable { .. } => unreachable!(),
    };
    let stale: Vec<PathBuf> = bases
        .iter()
        .map(|b| b.join(format!("planbot-run-{dead}-0")))
        .collect();
    let live: Vec<PathBuf> = bases
        .iter()
        .map(|b| b.join(format!("planbot-run-{}-999999", std::process::id())))
        .collect();
    for d in stale.iter().chain(&live) {
        std::fs::create_dir(d).unwrap();
    }
    planbot::capabilities::engine::sweep_stale_run_cgroups();
    for d in &stale {
        assert!(!d.exists(), "{} was left", d.display());
    }
    for d in &live {
        assert!(d.exists(), "{} of a live planbot was removed", d.display());
        std::fs::remove_dir(d).unwrap();
    }
}
