//! What the sandbox costs per engine process: `/bin/true` started bare, under Landlock, and
//! under Landlock in its own user, mount and PID namespaces with its rlimits — each timed from
//! building the sandbox (the ruleset, the mount plan) to the process's exit, as planbot does it
//! for every `init`, `plan`, `show` and `apply`.
//!
//! `cargo bench --bench sandbox_cost` runs 200 of each, interleaved (so a busy machine weighs on
//! all three alike), and prints the median, min and max of each and the median cost of the
//! namespaces per plan (three engine processes: `init`, `plan`, `show`). Under `cargo test
//! --all-targets` (no `--bench`) it runs three of each, to stay fast.

use planbot::capabilities::engine::sandbox::{Isolation, Policy, Profile, Support};
use planbot::capabilities::namespaces::{Limits, NsSupport};
use std::time::{Duration, Instant};

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
            let mut cmd = tokio::process::Command::new("/bin/true");
            cmd.current_dir(work.path()).env_clear();
            match v {
                Variant::Bare => {}
                Variant::Landlock => policy.prepare(landlock).unwrap().install(&mut cmd),
                Variant::Namespaces => policy
                    .prepare_isolated(landlock, &isolation, work.path())
                    .unwrap()
                    .install(&mut cmd),
            }
            let status = rt
                .block_on(async { cmd.status().await })
                .expect("/bin/true starts");
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
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
