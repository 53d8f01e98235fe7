//! planbot's memory stays within its caps whatever a plan leaves or prints: a FIFO streaming
//! zeros as the lock file, a lock file of 512 MiB, 256 MB of `show -json`, a million numbers in
//! one resource (under the byte cap, over the value budget), a log line of 256 MB, and a 40 MB
//! value planned by the real engine. Each case measures this process's
//! peak resident memory (the kernel's high-water mark, reset before the case) against what it
//! held before; the engine is a child process and does not count.
//!
//! One test on purpose: the cases run one after the other, alone in a process of their own (the
//! test binary run again for this test only), so the peak is theirs.

use crate::support::fake_engine as fake;

use fake::{fake_engine, running_with, PLAN_JSON, TERRAFORM_VERSION_JSON, WRITE_PLAN_FILE};
use planbot::capabilities::checkout_file::CheckoutFileError;
use planbot::capabilities::engine::{Engine, EngineError, PlanRequest, PlannedRun};
use std::path::Path;
use std::time::Duration;

/// What planbot may hold above its resting size: the 32 MiB of `show -json` it accepts, and
/// room for the runtime. Every case below offers far more.
const BOUND: u64 = 64 * 1024 * 1024;

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// How far above its resident size before `f` this process peaked while running `f`.
fn peak_growth<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> (u64, T) {
    // "5" resets the peak resident size to the current one (proc(5), clear_refs).
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
    let before = status_kib("VmRSS:");
    // A plan that blocks its thread (a read of a FIFO) fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    rt.spawn(async move {
        let _ = tx.send(f.await);
    });
    let out = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the plan ended within 2 minutes");
    let peak = status_kib("VmHWM:");
    (peak.saturating_sub(before) * 1024, out)
}

fn engine_doing(dir: &Path, after_plan: &str, show: &str) -> std::path::PathBuf {
    let body = format!(
        "case \"$1\" in\n  plan)\n    {WRITE_PLAN_FILE}\n    {after_plan}\n    ;;\n  show) {show} ;;\nesac"
    );
    fake_engine(dir, "terraform", TERRAFORM_VERSION_JSON, &body)
}

#[test]
fn planbot_stays_within_its_caps_whatever_a_plan_leaves_or_prints() {
    // The peak is the process's: the cases run alone in a process of their own.
    if !crate::support::alone_in_a_process(
        "memory_bounds::planbot_stays_within_its_caps_whatever_a_plan_leaves_or_prints",
        &[],
    ) {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let show_plan = format!("echo '{PLAN_JSON}'");
    // The writer left behind is found again by its command line: 256 MB and this process's id
    // in bytes (its pid is the sandbox's). The sandbox has no /dev/zero: `yes` makes the bytes.
    let writer = format!("head -c {}", 268_435_456 + std::process::id() % 1000);
    let fifo = format!(
        "rm -f .terraform.lock.hcl; mkfifo .terraform.lock.hcl\n    \
         setsid sh -c 'touch writer.started; yes 0 | tr -d \"\\n\" | {writer} > .terraform.lock.hcl' </dev/null >/dev/null 2>&1 &\n    \
         while [ ! -e writer.started ]; do sleep 0.01; done"
    );
    // Each case, and how its plan must end: proof that its hostile part happened.
    type Ends = fn(&Result<PlannedRun, EngineError>) -> bool;
    // A million one-digit numbers in one resource: 2 MB of JSON, under the byte cap.
    let million = "printf '{\"format_version\":\"1.2\",\"resource_changes\":[{\"address\":\"terraform_data.x\",\"mode\":\"managed\",\"type\":\"terraform_data\",\"name\":\"x\",\"change\":{\"actions\":[\"create\"],\"after\":{\"input\":['; yes 1, | head -n 999999 | tr -d '\\n'; printf '1]}}}]}'".to_string();
    let fakes: [(&str, &str, String, Ends); 5] = [
        (
            "a FIFO streaming 256 MB of zeros as the lock file",
            &fifo,
            show_plan.clone(),
            |r| {
                matches!(
                    r,
                    Err(EngineError::CheckoutFile(
                        CheckoutFileError::NotRegular { .. }
                    ))
                )
            },
        ),
        (
            "a lock file of 512 MiB",
            "truncate -s 512M .terraform.lock.hcl",
            show_plan.clone(),
            |r| {
                matches!(
                    r,
                    Err(EngineError::CheckoutFile(
                        CheckoutFileError::TooLarge { .. }
                    ))
                )
            },
        ),
        (
            "256 MB of show -json",
            "",
            "yes ' ' | tr -d '\\n' | head -c 268435456".to_string(),
            |r| matches!(r, Err(EngineError::OutputTooLarge { .. })),
        ),
        (
            "a million numbers in one resource (2 MB of show -json)",
            "",
            million,
            |r| {
                matches!(r, Err(e @ EngineError::TooManyValues { .. })
                    if e.to_string().starts_with("one resource or output of the plan has too many values"))
            },
        ),
        (
            "a log line of 256 MB",
            "yes x | tr -d '\\n' | head -c 268435456 >&2; echo >&2",
            show_plan.clone(),
            |r| {
                r.as_ref()
                    .is_ok_and(|p| p.log().contains("more of this line left out"))
            },
        ),
    ];
    // A first plan, so that what every plan needs (the runtime's threads, the engine's
    // version) is in place before anything is measured.
    let warm = tempfile::tempdir().unwrap();
    let bin = engine_doing(warm.path(), "", &show_plan);
    let (root, temp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let engine = Engine::builder(&bin, temp.path()).build().unwrap();
    rt.block_on(engine.plan(root.path(), &PlanRequest::default()))
        .expect("a plain plan");

    let mut report = Vec::new();
    for (what, after_plan, show, ends_as_it_must) in &fakes {
        let (bin_dir, root, temp) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let bin = engine_doing(bin_dir.path(), after_plan, show);
        let engine = Engine::builder(&bin, temp.path())
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let dir = root.path().to_path_buf();
        let (grew, result) = peak_growth(&rt, async move {
            engine.plan(&dir, &PlanRequest::default()).await
        });
        for pid in running_with(&writer) {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        let outcome = match &result {
            Ok(p) => format!("planned, log of {} bytes", p.log().len()),
            Err(e) => e.to_string(),
        };
        report.push(format!("{what}: +{} MiB ({outcome})", grew >> 20));
        assert!(ends_as_it_must(&result), "{what}: {outcome}");
        assert!(
            grew < BOUND,
            "{what}: planbot grew by {} MiB; {outcome}",
            grew >> 20
        );
    }

    // The real engine, a 40 MB value: `show -json` prints twice that, past the cap.
    let engine_bin = crate::support::engine();
    let (root, temp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(
        root.path().join("main.tf"),
        crate::support::forty_mb_value_tf(),
    )
    .unwrap();
    let engine = Engine::builder(&engine_bin, temp.path()).build().unwrap();
    let dir = root.path().to_path_buf();
    let (grew, result) = peak_growth(&rt, async move {
        engine.plan(&dir, &PlanRequest::default()).await
    });
    match &result {
        Err(e @ EngineError::OutputTooLarge { log, .. }) => {
            assert!(e.to_string().starts_with("the plan is too large"), "{e}");
            assert!(
                log.len() < 1024 * 1024 + 4096,
                "the log kept is {} bytes",
                log.len()
            );
        }
        other => panic!("a 40 MB value: expected the plan refused as too large, got {other:?}"),
    }
    report.push(format!("a 40 MB value (real engine): +{} MiB", grew >> 20));
    assert!(
        grew < BOUND,
        "a 40 MB value: planbot grew by {} MiB",
        grew >> 20
    );
    eprintln!("peak memory above resting size:\n  {}", report.join("\n  "));
}
