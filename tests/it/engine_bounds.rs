//! What MR code leaves in its checkout, or makes the engine print, cannot block or bloat
//! planbot: the lock file as a FIFO held open, a link, a file of hundreds of megabytes; a
//! `show -json` past the cap; a line of megabytes in the log. Stand-in engines (scripts) do
//! what MR code did in the attack: it runs inside the engine's `plan`, so a fake `plan` does it.

use crate::support::fake_engine as fake;

use fake::{fake_engine, running_with, PLAN_JSON, TERRAFORM_VERSION_JSON, WRITE_PLAN_FILE};
use planbot::capabilities::checkout_file::CheckoutFileError;
use planbot::capabilities::engine::{Engine, EngineError, PlanRequest, LINE_MAX_BYTES};
use std::path::Path;
use std::time::Duration;

/// A fake engine whose `plan` writes its plan file and then runs `after_plan` in the root, and
/// whose `show` prints `show` (a shell command).
fn engine_doing(dir: &Path, after_plan: &str, show: &str) -> std::path::PathBuf {
    let body = format!(
        r#"case "$1" in
  plan)
    {WRITE_PLAN_FILE}
    {after_plan}
    ;;
  show) {show} ;;
esac"#
    );
    fake_engine(dir, "terraform", TERRAFORM_VERSION_JSON, &body)
}

/// A fake engine doing `after_plan` and `show` (see [`engine_doing`]), built by `build` from
/// its builder, with a root and temp root of its own.
struct Stage {
    engine: Engine,
    root: tempfile::TempDir,
    _dirs: [tempfile::TempDir; 2],
}

fn stage(
    after_plan: &str,
    show: &str,
    build: impl FnOnce(
        planbot::capabilities::engine::EngineBuilder,
    ) -> planbot::capabilities::engine::EngineBuilder,
) -> Stage {
    let (bin_dir, temp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let bin = engine_doing(bin_dir.path(), after_plan, show);
    Stage {
        engine: build(Engine::builder(&bin, temp.path())).build().unwrap(),
        root: tempfile::tempdir().unwrap(),
        _dirs: [bin_dir, temp],
    }
}

impl Stage {
    async fn plan(&self) -> Result<planbot::capabilities::engine::PlannedRun, EngineError> {
        self.engine
            .plan(self.root.path(), &PlanRequest::default())
            .await
    }
}

fn print_plan() -> String {
    format!("echo '{PLAN_JSON}'")
}

/// A command line no other process has: `sleep` for 120 s and this test process's id in
/// thousandths, so the process a fake engine leaves behind is found again (its own pid is the
/// sandbox's, which means nothing here).
fn left_behind_sleep() -> String {
    format!("sleep 120.{:06}", std::process::id() % 1_000_000)
}

/// Kill what a fake engine left behind on purpose (found by its command line).
fn kill_left_behind(marker: &str) {
    for pid in running_with(marker) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[test]
fn a_fifo_held_open_as_the_lock_file_does_not_block_the_job() {
    // A process MR code leaves behind (its own session) holds the lock file's FIFO open for
    // writing and never writes. (Where the sandbox has a PID namespace it ends with the job,
    // and a plain read waits for a writer that never comes: blocked all the same.)
    let writer = left_behind_sleep();
    let s = stage(
        &format!(
            r#"rm -f .terraform.lock.hcl; mkfifo .terraform.lock.hcl
    setsid sh -c 'touch writer.started; exec {writer} 3>.terraform.lock.hcl' </dev/null >/dev/null 2>&1 &
    while [ ! -e writer.started ]; do sleep 0.01; done"#
        ),
        &print_plan(),
        |b| b.timeout(Duration::from_secs(5)),
    );
    // On a thread and runtime of its own: a read that blocks them cannot keep this test from
    // giving up on it.
    let (tx, rx) = std::sync::mpsc::channel();
    let (engine, dir) = (s.engine.clone(), s.root.path().to_path_buf());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _ = tx.send(rt.block_on(engine.plan(&dir, &PlanRequest::default())));
    });
    let planned = rx.recv_timeout(Duration::from_secs(30));
    kill_left_behind(&writer);
    let result = planned.expect(
        "the plan ended within 30 s (a plain read of the FIFO blocks until a writer comes and goes)",
    );
    match result {
        Err(EngineError::CheckoutFile(e @ CheckoutFileError::NotRegular { .. })) => assert_eq!(
            e.to_string(),
            "`.terraform.lock.hcl` is a FIFO (named pipe), not a regular file: planbot reads only regular files of a checkout"
        ),
        other => panic!("expected the lock file refused, got {other:?}"),
    }
}

#[tokio::test]
async fn a_lock_file_that_is_a_link_or_of_hundreds_of_megabytes_is_refused_unread() {
    let cases = [
        (
            "ln -sf /etc/passwd .terraform.lock.hcl",
            "`.terraform.lock.hcl` is a symbolic link, or a directory on its way is: planbot does not follow links in a checkout after the engine ran there",
        ),
        (
            "truncate -s 600M .terraform.lock.hcl",
            "`.terraform.lock.hcl` is 600 MiB or more: planbot reads at most 1 MiB of it",
        ),
    ];
    for (after_plan, said) in cases {
        match stage(after_plan, &print_plan(), |b| b).plan().await {
            Err(e @ EngineError::CheckoutFile(_)) => assert_eq!(e.to_string(), said),
            other => panic!("{after_plan}: expected the lock file refused, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_show_json_past_the_cap_fails_the_plan_and_says_why() {
    // 20 MB of output (blanks) against a 1 MiB cap.
    let s = stage("", "yes ' ' | tr -d '\\n' | head -c 20000000", |b| {
        b.max_plan_json(1024 * 1024)
    });
    match s.plan().await {
        Err(e @ EngineError::OutputTooLarge { .. }) => assert_eq!(
            e.to_string(),
            "the plan is too large: `show -json` printed more than 1 MiB, the most planbot accepts (`engine.max_plan_json_mib`); nothing of it was kept"
        ),
        other => panic!("expected the plan refused as too large, got {other:?}"),
    }
}

#[tokio::test]
async fn a_line_of_megabytes_in_the_engine_output_is_cut_in_the_log() {
    let s = stage(
        "echo before; yes x | tr -d '\\n' | head -c 5000000; echo; echo after",
        &print_plan(),
        |b| b,
    );
    let planned = s.plan().await.expect("planned");
    let log = planned.log();
    assert!(log.len() < 2 * LINE_MAX_BYTES, "{} bytes kept", log.len());
    let line = log
        .lines()
        .find(|l| l.starts_with("xxx"))
        .expect("the long line");
    assert!(
        line.ends_with(
            " (… 4.7 MiB more of this line left out: planbot keeps the first 64 KiB of a line)"
        ),
        "{}",
        &line[LINE_MAX_BYTES - 10..]
    );
    assert!(
        log.contains("before\n") && log.contains("\nafter\n"),
        "{}",
        &log[..100]
    );
}

/// What the files under `dir` take on disk (allocated blocks; links not followed).
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        total += meta.blocks() * 512;
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        }
    }
    total
}

#[tokio::test]
async fn a_plan_that_writes_past_the_disk_quota_is_killed_and_says_why() {
    const MIB: u64 = 1 << 20;
    let quota = 32 * MIB;
    // MR code in `plan` writes 1 GiB into its checkout, one MiB at a time (each file well
    // under the file-size cap: the quota, not `RLIMIT_FSIZE`, must stop it).
    let s = stage(
        r#"i=0
    while [ $i -lt 1024 ]; do head -c 1048576 /dev/urandom > junk.$i || exit 1; i=$((i+1)); done
    echo "wrote the whole gigabyte""#,
        &print_plan(),
        |b| b.disk_max(Some(quota)),
    );
    let err = match s.plan().await {
        Err(e @ EngineError::OverQuota { .. }) => e,
        other => panic!("expected the plan stopped by the disk quota, got {other:?}"),
    };
    assert_eq!(
        err.to_string(),
        "`plan` was stopped: the run's files (its checkout, plan file and plugin cache) took more than 32 MiB, the most a job may write (`sandbox.disk_max`)"
    );
    assert!(!err.log().unwrap().contains("wrote the whole gigabyte"));
    // Killed within one look of passing the quota (every 200 ms): far from the gigabyte.
    let held = disk_usage(s.root.path());
    assert!(held > quota, "it did write past the quota: {held}");
    assert!(
        held < quota + 256 * MIB,
        "the checkout holds {} MiB against a quota of 32 MiB",
        held / MIB
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_check_beside_a_plan_is_bounded_in_time_and_output_and_the_plan_stands() {
    use planbot::core::engine_checks::{CheckSet, StepCheck};
    // `validate` hangs, `fmt` prints past the output cap, `test` answers: each check has its
    // own timeout and cap, what stopped says why, and the plan before them is kept.
    let hang = left_behind_sleep();
    let body = format!(
        r#"case "$1" in
  plan) {WRITE_PLAN_FILE} ;;
  show) echo '{PLAN_JSON}' ;;
  validate) exec {hang} ;;
  fmt) yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx | head -c 300000; exit 3 ;;
  test) echo '{{"type":"test_run","test_run":{{"path":"a.tftest.hcl","run":"ok","progress":"complete","status":"pass"}}}}' ;;
esac"#
    );
    let (bin_dir, temp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let bin = fake_engine(bin_dir.path(), "terraform", TERRAFORM_VERSION_JSON, &body);
    let engine = Engine::builder(&bin, temp.path())
        .timeout(Duration::from_secs(3))
        .grace(Duration::from_millis(500))
        .max_plan_json(100_000)
        .build()
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("a.tftest.hcl"), "run \"ok\" {}\n").unwrap();
    let started = std::time::Instant::now();
    let (planned, checks) = engine
        .plan_checked(root.path(), &PlanRequest::default(), CheckSet::ALL)
        .await;
    kill_left_behind(&hang);
    assert!(planned.is_ok(), "{planned:?}");
    assert_eq!(
        checks.validate,
        StepCheck::NotRun("`validate -json` timed out after 3s".into())
    );
    assert!(
        matches!(&checks.fmt, StepCheck::NotRun(why) if why.starts_with("`fmt -check` printed more than 97 KiB")),
        "{:?}",
        checks.fmt
    );
    assert!(
        matches!(&checks.test, StepCheck::Ran { exit: Some(0), stdout } if stdout.starts_with(b"{\"type\":\"test_run\"")),
        "{:?}",
        checks.test
    );
    assert!(started.elapsed() < Duration::from_secs(20));
}
