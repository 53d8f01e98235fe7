//! The engine runner's process handling, with stand-in engines (scripts) that misbehave on
//! purpose: hanging, ignoring SIGTERM, spawning children, racing on init, and a fake `tofu`
//! to see where the plan-encryption key goes.

use crate::support::fake_engine as fake;

use fake::{
    fake_engine, leftovers, running_with, PLAN_JSON, TERRAFORM_VERSION_JSON, TOFU_VERSION_JSON,
    WRITE_PLAN_FILE,
};
use planbot::capabilities::engine::{
    CancelHandle, Engine, EngineError, PlanEncryption, PlanRequest, Step,
};
use std::time::{Duration, Instant};

struct Setup {
    bin_dir: tempfile::TempDir,
    root: tempfile::TempDir,
    temp_root: tempfile::TempDir,
}

fn setup() -> Setup {
    Setup {
        bin_dir: tempfile::tempdir().unwrap(),
        root: tempfile::tempdir().unwrap(),
        temp_root: tempfile::tempdir().unwrap(),
    }
}

#[tokio::test]
async fn a_hanging_engine_that_ignores_sigterm_is_killed_with_its_children_after_the_grace() {
    let s = setup();
    // Sandboxed (the default): its pids are its namespace's, so the processes are found by
    // their command lines (the engine's unique path, the child's unique argument).
    let child = format!("300.{}", std::process::id());
    let body = format!(
        r#"if [ "$1" = init ]; then
  trap '' TERM
  sleep {child} &
  echo "initialising forever"
  wait
fi"#
    );
    let bin = fake_engine(s.bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
    let engine = Engine::builder(&bin, s.temp_root.path())
        .timeout(Duration::from_millis(1500))
        .grace(Duration::from_millis(1000))
        .build()
        .unwrap();

    let started = Instant::now();
    let err = engine
        .plan(s.root.path(), &PlanRequest::default())
        .await
        .unwrap_err();
    let took = started.elapsed();

    let EngineError::TimedOut {
        step,
        after,
        ref log,
    } = err
    else {
        panic!("expected a timeout, got {err:?}");
    };
    assert_eq!(step, Step::Init);
    assert_eq!(after, Duration::from_millis(1500));
    assert!(log.contains("initialising forever"), "{log}");
    assert!(
        err.to_string().contains("timed out after 1s 500ms"),
        "{err}"
    );
    // Timeout + grace, plus a little scheduling slack; not the 300 s the script wanted.
    assert!(took >= Duration::from_millis(2500), "{took:?}");
    assert!(took < Duration::from_millis(6000), "{took:?}");
    for marker in [bin.display().to_string(), format!("sleep\0{child}")] {
        assert_eq!(
            running_with(&marker),
            Vec::<u32>::new(),
            "{marker} survived"
        );
    }
    assert_eq!(leftovers(s.temp_root.path()), Vec::<String>::new());
}

#[tokio::test]
async fn an_engine_that_stops_on_sigterm_gets_exactly_one_and_no_kill() {
    let s = setup();
    let terms = s.bin_dir.path().join("terms");
    let body = format!(
        r#"if [ "$1" = plan ]; then
  {WRITE_PLAN_FILE}
  trap 'echo TERM >> {terms}; echo "stopping gracefully"; sleep 0.3; exit 130' TERM
  while true; do sleep 0.05; done
fi"#,
        terms = terms.display()
    );
    let bin = fake_engine(s.bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
    let engine = Engine::builder(&bin, s.temp_root.path())
        .sandbox(fake::unsandboxed())
        .timeout(Duration::from_millis(800))
        .grace(Duration::from_secs(20))
        .build()
        .unwrap();

    let started = Instant::now();
    let err = engine
        .plan(s.root.path(), &PlanRequest::default())
        .await
        .unwrap_err();
    let took = started.elapsed();

    assert!(
        matches!(
            err,
            EngineError::TimedOut {
                step: Step::Plan,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.log().unwrap().contains("stopping gracefully"));
    assert_eq!(
        std::fs::read_to_string(&terms).unwrap(),
        "TERM\n",
        "one SIGTERM"
    );
    assert!(
        took < Duration::from_secs(5),
        "no waiting for the grace period: {took:?}"
    );
    assert_eq!(leftovers(s.temp_root.path()), Vec::<String>::new());
}

#[tokio::test]
async fn cancelling_a_run_stops_the_engine_the_same_way() {
    let s = setup();
    // The engine says when it is in `plan` (with its TERM trap set) through a FIFO: the
    // test cancels on that signal, not after a guessed time.
    let fifo = s.bin_dir.path().join("in-plan");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let body = format!(
        r#"if [ "$1" = plan ]; then
  trap 'echo "cancelled, lock released"; exit 1' TERM
  echo started > {fifo}
  while true; do sleep 0.05; done
fi"#,
        fifo = fifo.display()
    );
    let bin = fake_engine(s.bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
    let engine = Engine::builder(&bin, s.temp_root.path())
        .sandbox(fake::unsandboxed())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let (handle, token) = CancelHandle::new();
    let req = PlanRequest {
        cancel: Some(token),
        ..PlanRequest::default()
    };
    // Read-write, so that the read waits for the engine's line instead of seeing EOF.
    let rx = tokio::net::unix::pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(&fifo)
        .unwrap();
    let canceller = tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut said = String::new();
        tokio::io::BufReader::new(rx)
            .read_line(&mut said)
            .await
            .unwrap();
        assert_eq!(said.trim(), "started");
        handle.cancel();
    });
    let started = Instant::now();
    let err = engine.plan(s.root.path(), &req).await.unwrap_err();
    // (Had the engine never said it plans, the canceller would still wait: stop it.)
    canceller.abort();
    let _ = canceller.await;
    assert!(
        matches!(
            err,
            EngineError::Cancelled {
                step: Step::Plan,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.log().unwrap().contains("cancelled, lock released"));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(leftovers(s.temp_root.path()), Vec::<String>::new());
}

#[tokio::test]
async fn init_is_serialised_per_plugin_cache_dir() {
    let s = setup();
    let spans = s.bin_dir.path().join("spans");
    let body = format!(
        r#"case "$1" in
  init) echo "start $(date +%s%N)" >> {spans}; sleep 0.4; echo "end $(date +%s%N)" >> {spans};;
  plan) {WRITE_PLAN_FILE};;
  show) echo '{PLAN_JSON}';;
esac"#,
        spans = spans.display()
    );
    let bin = fake_engine(s.bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
    let cache = s.bin_dir.path().join("plugin-cache");
    let engine = Engine::builder(&bin, s.temp_root.path())
        .sandbox(fake::unsandboxed())
        .plugin_cache_dir(&cache)
        .build()
        .unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let req = PlanRequest::default();
    let (ra, rb) = tokio::join!(engine.plan(a.path(), &req), engine.plan(b.path(), &req));
    ra.unwrap();
    rb.unwrap();
    let text = std::fs::read_to_string(&spans).unwrap();
    let kinds: Vec<&str> = text.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(
        kinds,
        vec!["start", "end", "start", "end"],
        "no overlap:\n{text}"
    );
    assert!(cache.is_dir(), "the cache dir is created");
}

#[tokio::test]
async fn on_opentofu_the_plan_file_is_encrypted_with_a_per_run_key_that_never_shows() {
    let s = setup();
    let dumps = s.bin_dir.path();
    let body = format!(
        r#"printf '%s' "$TF_ENCRYPTION" > {dumps}/enc-$1
case "$1" in
  plan) {WRITE_PLAN_FILE}; echo "key in use: $TF_ENCRYPTION";;
  show) echo '{PLAN_JSON}';;
  apply) echo "applying with $TF_ENCRYPTION"; echo "Apply complete!";;
esac"#,
        dumps = dumps.display()
    );
    let bin = fake_engine(s.bin_dir.path(), "tofu", TOFU_VERSION_JSON, &body);
    let engine = Engine::builder(&bin, s.temp_root.path())
        .sandbox(fake::unsandboxed())
        .build()
        .unwrap();

    let run = engine
        .plan(s.root.path(), &PlanRequest::default())
        .await
        .unwrap();
    assert_eq!(run.version().to_string(), "OpenTofu 1.10.6");
    assert_eq!(run.encryption(), PlanEncryption::PerRunKey);
    let first = run
        .secrets()
        .iter()
        .find(|s| s.len() == 64)
        .map(str::to_string);
    let mut lines = Vec::new();
    run.apply_streaming(|l| lines.push(l.to_string()))
        .await
        .unwrap();

    let enc = |step: &str| std::fs::read_to_string(dumps.join(format!("enc-{step}"))).unwrap();
    let plan_enc = enc("plan");
    assert!(
        plan_enc.contains(r#"method "aes_gcm" "planbot_run""#),
        "{plan_enc}"
    );
    assert!(plan_enc.contains("plan {"), "{plan_enc}");
    assert_eq!(
        enc("show"),
        plan_enc,
        "show reads the plan with the same key"
    );
    assert_eq!(
        enc("apply"),
        plan_enc,
        "apply reads the plan with the same key"
    );
    let pass = plan_enc
        .lines()
        .find_map(|l| l.trim().strip_prefix("passphrase    = \""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap()
        .to_string();
    assert_eq!(Some(pass.clone()), first);
    let streamed = lines.join("\n");
    assert!(streamed.contains("Apply complete!"));
    assert!(!streamed.contains(&pass), "{streamed}");

    // The next run gets another key.
    let run2 = engine
        .plan(s.root.path(), &PlanRequest::default())
        .await
        .unwrap();
    assert!(!run2.log().contains(&pass));
    assert_ne!(enc("plan"), plan_enc);
    drop(run2);
    assert_eq!(leftovers(s.temp_root.path()), Vec::<String>::new());
}

#[tokio::test]
async fn terraform_gets_no_tf_encryption_and_an_operator_setup_is_left_alone() {
    let s = setup();
    let dumps = s.bin_dir.path();
    let body = format!(
        r#"printf '%s' "${{TF_ENCRYPTION-unset}}" > {dumps}/enc-$1
case "$1" in
  plan) {WRITE_PLAN_FILE};;
  show) echo '{PLAN_JSON}';;
esac"#,
        dumps = dumps.display()
    );
    let tf = fake_engine(s.bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
    let run = Engine::builder(&tf, s.temp_root.path())
        .sandbox(fake::unsandboxed())
        .build()
        .unwrap()
        .plan(s.root.path(), &PlanRequest::default())
        .await
        .unwrap();
    assert_eq!(run.encryption(), PlanEncryption::Unsupported);
    assert_eq!(
        std::fs::read_to_string(dumps.join("enc-plan")).unwrap(),
        "unset"
    );

    let tofu = fake_engine(s.bin_dir.path(), "tofu", TOFU_VERSION_JSON, &body);
    let own = "key_provider \"pbkdf2\" \"ops\" { passphrase = \"operator-managed-passphrase\" }";
    let run = Engine::builder(&tofu, s.temp_root.path())
        .sandbox(fake::unsandboxed())
        .env([("TF_ENCRYPTION".to_string(), own.to_string())].into())
        .build()
        .unwrap()
        .plan(s.root.path(), &PlanRequest::default())
        .await
        .unwrap();
    assert_eq!(run.encryption(), PlanEncryption::Configured);
    assert_eq!(
        std::fs::read_to_string(dumps.join("enc-plan")).unwrap(),
        own
    );
}

#[tokio::test]
async fn a_show_that_prints_no_plan_is_a_bad_plan_json() {
    let s = setup();
    let body = format!(
        r#"case "$1" in
  plan) {WRITE_PLAN_FILE};;
  show) echo '{{"format_version":"1.0","values":{{}}}}';;
esac"#
    );
    let bin = fake_engine(s.bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
    let err = Engine::builder(&bin, s.temp_root.path())
        .sandbox(fake::unsandboxed())
        .build()
        .unwrap()
        .plan(s.root.path(), &PlanRequest::default())
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::BadPlanJson { .. }), "{err:?}");
    assert!(err.to_string().contains("state file"), "{err}");
    assert_eq!(leftovers(s.temp_root.path()), Vec::<String>::new());
}

/// The `oom_score_adj` of process `pid`, read from outside its namespaces.
fn oom_score_adj(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
        .unwrap_or_else(|e| format!("unreadable: {e}"))
        .trim()
        .to_string()
}

/// The process group of process `pid` (field 5 of its stat line).
fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

#[tokio::test]
async fn every_engine_process_is_the_oom_killers_first_choice_and_planbot_is_not() {
    // Sandboxed (the service's way: its own namespaces, no /proc inside, so the score is read
    // from here, the parent's side) and unsandboxed: every process of the engine's group.
    for sandboxed in [true, false] {
        let s = setup();
        let marker = format!("4242.{}{}", std::process::id(), u8::from(sandboxed));
        let body = format!(r#"if [ "$1" = init ]; then sleep {marker}; fi"#);
        let bin = fake_engine(s.bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
        let mut builder =
            Engine::builder(&bin, s.temp_root.path()).timeout(Duration::from_secs(60));
        if !sandboxed {
            builder = builder.sandbox(fake::unsandboxed());
        }
        let engine = builder.build().unwrap();
        let (handle, token) = CancelHandle::new();
        let req = PlanRequest {
            cancel: Some(token),
            ..PlanRequest::default()
        };
        let watcher = tokio::spawn(async move {
            let sleep_marker = format!("sleep\0{marker}");
            crate::support::eventually("the engine's child to run", 30, || {
                let found = !running_with(&sleep_marker).is_empty();
                std::future::ready(found)
            })
            .await;
            let child = running_with(&sleep_marker)[0];
            let group = process_group(child).expect("the child's process group");
            let members: Vec<(u32, String)> = std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
                .filter(|pid| process_group(*pid) == Some(group))
                .map(|pid| (pid, oom_score_adj(pid)))
                .collect();
            handle.cancel();
            (child, members)
        });
        let err = engine
            .plan(s.root.path(), &req)
            .await
            .expect_err("cancelled");
        assert!(matches!(err, EngineError::Cancelled { .. }), "{err:?}");
        let (child, members) = watcher.await.unwrap();
        assert!(
            members.iter().any(|(pid, _)| *pid == child),
            "sandboxed={sandboxed}: {members:?}"
        );
        // The engine and what it started (its `sleep`): both of them.
        assert!(members.len() >= 2, "{members:?}");
        for (pid, adj) in &members {
            assert_eq!(
                adj,
                std::str::from_utf8(planbot::capabilities::engine::ENGINE_OOM_SCORE_ADJ).unwrap(),
                "sandboxed={sandboxed}: process {pid} of the engine's group: {members:?}"
            );
        }
        // planbot itself (this process) keeps its own score: the engine is chosen first.
        assert_ne!(oom_score_adj(std::process::id()), "1000");
    }
}

#[tokio::test]
async fn a_sandboxed_engine_process_is_planbots_own_child_and_pid_1_of_its_namespace() {
    let s = setup();
    // `init` says it runs through the FIFO `started`, then waits on `looked` until this test
    // has looked at it.
    let (started, looked) = (s.root.path().join("started"), s.root.path().join("looked"));
    for fifo in [&started, &looked] {
        nix::unistd::mkfifo(fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    }
    let body = format!(
        r#"if [ "$1" = init ]; then
  echo "$$" > '{started}'
  read -r _ < '{looked}'
  exit 1
fi"#,
        started = started.display(),
        looked = looked.display(),
    );
    let bin = fake_engine(s.bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
    // Sandboxed (the default): in its own user, mount and PID namespaces.
    let engine = Engine::builder(&bin, s.temp_root.path())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let root = s.root.path().to_path_buf();
    let plan = tokio::spawn(async move { engine.plan(&root, &PlanRequest::default()).await });
    let said = tokio::task::spawn_blocking(move || std::fs::read_to_string(started))
        .await
        .unwrap()
        .unwrap();
    let marker = bin.display().to_string();
    let pids = running_with(&marker);
    let status = |pid: u32, key: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
            .unwrap()
    };
    let seen: Vec<(String, String)> = pids
        .iter()
        .map(|p| (status(*p, "PPid:"), status(*p, "NSpid:")))
        .collect();
    tokio::task::spawn_blocking(move || std::fs::write(looked, "done\n"))
        .await
        .unwrap()
        .unwrap();
    plan.await.unwrap().unwrap_err();

    // One process: the engine, started by planbot itself (no copy of planbot between them,
    // alive for the step), the first process of its PID namespace.
    assert_eq!(said.trim(), "1", "the engine's pid in its namespace");
    assert_eq!(pids.len(), 1, "{seen:?}");
    let (parent, nspid) = &seen[0];
    assert_eq!(
        parent,
        &std::process::id().to_string(),
        "its parent: {seen:?}"
    );
    assert_eq!(
        nspid.split_whitespace().nth(1),
        Some("1"),
        "its pids, outside then inside: {nspid}"
    );
}
