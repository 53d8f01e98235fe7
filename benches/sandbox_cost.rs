//! What the sandbox costs per engine process: `/bin/true` started bare, under Landlock, and
//! under Landlock in its own user, mount and PID namespaces with its rlimits — each timed from
//! building the sandbox (the ruleset, the mount plan) to the process's exit, as planbot does it
//! for every `init`, `plan`, `show` and `apply`.
//!
//! `cargo bench --bench sandbox_cost` runs 200 of each, interleaved (so a busy machine weighs on
//! all three alike), and prints the median, min and max of each and the median cost of the
//! namespaces per plan (three engine processes: `init`, `plan`, `show`). Under `cargo test
//! --all-targets` (no `--bench`) it runs three of each, to stay fast.
//!
//! Then the cost of one `listen()` through planbot's guard (the namespaces' seccomp filter hands
//! every `listen()` to a supervisor thread of planbot, which performs it on the process's UNIX
//! socket): a Perl process making 1,000 `listen()` calls on one UNIX socket, under Landlock alone
//! (the kernel's own call) and in the namespaces (each through the guard), interleaved; the
//! difference of the medians, less the namespaces' own cost, over 1,000.

use planbot::capabilities::engine::child::{EngineChild, Launch};
use planbot::capabilities::engine::sandbox::PreparedSandbox;
use planbot::capabilities::engine::sandbox::{Isolation, Policy, Profile, Support};
use planbot::capabilities::namespaces::{Limits, NsSupport};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// `program args` started as planbot starts an engine process, with no environment, run to
/// its end (its output read and dropped).
async fn run(
    program: &str,
    args: &[&str],
    dir: &Path,
    sandbox: Option<&PreparedSandbox>,
) -> ExitStatus {
    use tokio::io::AsyncReadExt;
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    let mut child = EngineChild::spawn(&Launch {
        program: Path::new(program),
        args: &args,
        env: &BTreeMap::new(),
        dir,
        cgroup: &[],
        sandbox,
    })
    .unwrap_or_else(|e| panic!("{program} starts: {e:?}"));
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let _ = tokio::join!(out.read_to_end(&mut a), err.read_to_end(&mut b));
    child.wait().await.expect("waited for")
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Bare,
    Landlock,
    Namespaces,
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let runs = if benching { 200 } else { 3 };
    let landlock = Support::probe();
    assert!(
        landlock.abi().is_some(),
        "no Landlock: {}",
        landlock.describe()
    );
    assert_eq!(NsSupport::probe(), NsSupport::Available, "no namespaces");
    let work = tempfile::tempdir().expect("a temp dir");
    let root = tempfile::tempdir().expect("a temp dir");
    let mut policy = Policy::base(Profile::Strict);
    policy.allow_write(work.path());
    let isolation = Isolation {
        limits: Limits::default(),
        root: Some(root.path().to_path_buf()),
        seccomp: true,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let variants = [Variant::Bare, Variant::Landlock, Variant::Namespaces];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    for _ in 0..runs {
        for (i, v) in variants.iter().enumerate() {
            let started = Instant::now();
            let prepared = match v {
                Variant::Bare => None,
                Variant::Landlock => Some(policy.prepare(landlock).unwrap()),
                Variant::Namespaces => Some(
                    policy
                        .prepare_isolated(landlock, &isolation, work.path())
                        .unwrap(),
                ),
            };
            let status = rt.block_on(run("/bin/true", &[], work.path(), prepared.as_ref()));
            assert!(status.success(), "{v:?}: {status}");
            times[i].push(started.elapsed());
        }
    }
    let mut medians = Vec::new();
    for (v, t) in variants.iter().zip(&mut times) {
        t.sort();
        let median = t[t.len() / 2];
        medians.push(median);
        println!(
            "{v:?}: median {:.2} ms, min {:.2} ms, max {:.2} ms ({} runs)",
            ms(median),
            ms(t[0]),
            ms(t[t.len() - 1]),
            t.len()
        );
    }
    println!(
        "namespaces over Landlock: {:.2} ms per engine process, {:.2} ms per plan (init, plan, show)",
        ms(medians[2].saturating_sub(medians[1])),
        3.0 * ms(medians[2].saturating_sub(medians[1]))
    );

    const LISTENS: u32 = 1000;
    let script = format!(
        "unlink 'bench.sock'; socket(S, 1, 1, 0) or die $!; bind(S, pack_sockaddr_un('bench.sock')) or die $!; \
         for (1..{LISTENS}) {{ listen(S, 5) or die \"listen: $!\" }}"
    );
    let runs = if benching { 50 } else { 2 };
    let mut listen_times: Vec<Vec<Duration>> = vec![Vec::new(); 2];
    for _ in 0..runs {
        for (i, isolated) in [false, true].into_iter().enumerate() {
            let started = Instant::now();
            let prepared = if isolated {
                policy.prepare_isolated(landlock, &isolation, work.path())
            } else {
                policy.prepare(landlock)
            }
            .unwrap();
            let args = ["-MSocket", "-e", &script];
            let status = rt.block_on(run("/usr/bin/perl", &args, work.path(), Some(&prepared)));
            assert!(
                status.success(),
                "listen loop (isolated: {isolated}): {status}"
            );
            listen_times[i].push(started.elapsed());
        }
    }
    let mut listen_medians = Vec::new();
    for (name, t) in ["Landlock", "Namespaces"].iter().zip(&mut listen_times) {
        t.sort();
        let median = t[t.len() / 2];
        listen_medians.push(median);
        println!(
            "{LISTENS} listen() calls, {name}: median {:.2} ms ({} runs)",
            ms(median),
            t.len()
        );
    }
    let guard = listen_medians[1]
        .saturating_sub(listen_medians[0])
        .saturating_sub(medians[2].saturating_sub(medians[1]));
    println!(
        "one listen() through planbot's guard: {:.1} µs over the kernel's own",
        ms(guard) * 1000.0 / LISTENS as f64
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
