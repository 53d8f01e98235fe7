//! Render benchmark: a generated 10,000-resource plan through `planbot render`'s code path.
//!
//! `cargo bench --bench render` first runs the `planbot render` binary as a user would, on the
//! generated plan written to a file, on one of half its size and on an empty plan (best of five
//! runs each), and prints wall time and peak RSS (GNU time's `%M` when `/usr/bin/time` exists);
//! then, in this process, the time of each step of one `planbot render` run and the peak RSS of
//! parsing, rendering and the whole path (VmHWM from /proc/self/status, reset just before, the
//! JSON already in memory); then criterion times `render_note` on 10,000 resources (note over
//! budget: summaries only) and on 1,000 resources (every diff computed), and `lint` on 10,000
//! resources (`cargo bench --bench render -- lint` for that one alone).
//! Under `cargo test --all-targets` (no `--bench`) it runs once on small plans, to stay fast.

use criterion::{black_box, Criterion};
use planbot::core::fingerprint::Fingerprint;
use planbot::core::plan::Plan;
use planbot::core::redact::{Scrubber, Secrets};
use planbot::core::render::{render_note, NoteContext, RootOutcome, RootSection};
use planbot::flows::cli::render::{report, Format};
use std::io::Write;
use synth_plan::synth_plan;

#[path = "support/synth_plan.rs"]
mod synth_plan;
use std::time::{Duration, Instant};

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn ctx() -> NoteContext {
    NoteContext {
        sha: Some("3f9a2c1e5b7d9f0a1c3e5b7d9f0a1c3e5b7d9f0a".into()),
        engine: Some("OpenTofu 1.10.6".into()),
        run_url: Some("https://planbot.example.com/runs/1".into()),
        ..NoteContext::default()
    }
}

fn render(plan: &Plan, fp: &Fingerprint, scrubber: &Scrubber) -> String {
    let roots = [RootSection {
        name: "fleet".into(),
        outcome: RootOutcome::Planned {
            plan,
            findings: &[],
            fingerprint: fp,
        },
    }];
    render_note(&ctx(), &roots, scrubber)
}

/// What `planbot render plan.json` does after reading the file: parse, lint, fingerprint,
/// collect the secrets, render and scrub.
fn render_command_path(json: &[u8]) -> String {
    let plan = Plan::from_json(json).expect("the synthetic plan parses");
    report(
        &plan,
        &ctx(),
        &Secrets::new(),
        b"bench-key",
        Format::Markdown,
    )
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Run the `planbot render` binary on `path`: (wall time, its peak RSS in KiB).
///
/// The peak comes from GNU time's `%M` (`/usr/bin/time`, which forks a small process of its
/// own, about 1 MiB, and execs planbot in it). Without it, from `ru_maxrss` of RUSAGE_CHILDREN,
/// which is too high: a child spawned from this process shares its memory until it execs, and
/// the kernel counts that in the child's peak (then only the difference between two runs means
/// something).
fn run_binary(path: &std::path::Path) -> (Duration, u64, &'static str) {
    let gnu_time = std::path::Path::new("/usr/bin/time");
    let mut cmd = if gnu_time.exists() {
        let mut c = std::process::Command::new(gnu_time);
        c.args(["-f", "planbot-peak-rss-kib %M"])
            .arg(env!("CARGO_BIN_EXE_planbot"));
        c
    } else {
        std::process::Command::new(env!("CARGO_BIN_EXE_planbot"))
    };
    cmd.arg("render")
        .arg(path)
        .env("PLANBOT_FINGERPRINT_KEY", "bench-key");
    let t = Instant::now();
    let out = cmd.output().expect("the planbot binary runs");
    let wall = t.elapsed();
    assert!(out.status.success(), "planbot render failed: {:?}", out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(kib) = stderr
        .lines()
        .find_map(|l| l.strip_prefix("planbot-peak-rss-kib "))
        .and_then(|n| n.trim().parse().ok())
    {
        return (wall, kib, "GNU time %M");
    }
    // SAFETY: getrusage only writes into the zeroed struct passed to it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    (
        wall,
        usage.ru_maxrss as u64,
        "ru_maxrss, counts this process too",
    )
}

/// The fastest of `runs` runs of the binary on `path` (the machine is shared: the minimum is
/// the least disturbed), and the peak RSS of that run.
fn best_of(runs: usize, path: &std::path::Path) -> (Duration, u64, &'static str) {
    (0..runs)
        .map(|_| run_binary(path))
        .min_by_key(|r| r.0)
        .expect("at least one run")
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let (big, small) = if benching { (10_000, 1_000) } else { (200, 50) };
    let fp = Fingerprint::from_hex(&"ab".repeat(32)).unwrap();
    let json = synth_plan(big);
    let json_kib = json.len() as u64 / 1024;
    let x = |kib: u64| kib as f64 / json_kib.max(1) as f64;

    // The binary, as a user runs it on a file: on an empty plan (what the binary itself
    // takes), on the big plan, and on one of half its size (to compare with the renderers
    // timed on 5,000 resources).
    let runs = if benching { 5 } else { 1 };
    let empty = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(
        empty.path(),
        br#"{"format_version":"1.2","resource_changes":[]}"#,
    )
    .expect("the empty plan is written");
    let (_, bin_base, _) = best_of(runs, empty.path());
    let file = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(file.path(), &json).expect("the plan is written");
    if let Ok(keep) = std::env::var("PLANBOT_BENCH_KEEP_PLAN") {
        let _ = std::fs::copy(file.path(), keep);
    }
    let (bin_wall, bin_rss, rss_how) = best_of(runs, file.path());
    let half_json = synth_plan(big / 2);
    let half = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(half.path(), &half_json).expect("the plan is written");
    let (half_wall, half_rss, _) = best_of(runs, half.path());
    let half_kib = half_json.len() as u64 / 1024;
    drop(half_json);

    // Peak memory, measured from here (the JSON is already in memory): the whole `planbot
    // render` path (parse, lint, fingerprint, secrets, render, scrub), then parse, then
    // render_note with the plan parsed.
    let reset_peak = || {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    };
    let rss_before = status_kib("VmRSS:").unwrap_or(0);
    reset_peak();
    let t = Instant::now();
    let _ = render_command_path(&json);
    let once = t.elapsed();
    let peak_all = status_kib("VmHWM:").unwrap_or(0);
    reset_peak();
    let t = Instant::now();
    let plan = Plan::from_json(&json).unwrap();
    let parse = t.elapsed();
    let peak_parse = status_kib("VmHWM:").unwrap_or(0);
    let t = Instant::now();
    let scrubber = Secrets::from_plan(&plan).scrubber();
    let secrets = t.elapsed();
    reset_peak();
    let t = Instant::now();
    let note_len = render(&plan, &fp, &scrubber).len();
    let note = t.elapsed();
    let peak_render = status_kib("VmHWM:").unwrap_or(0);
    let t = Instant::now();
    let _ = Fingerprint::of_with_secrets(&plan, b"bench-key", None, &scrubber);
    let fingerprint = t.elapsed();
    let t = Instant::now();
    let _ = planbot::core::proxmox::lint::lint(&plan, &[]);
    let lint = t.elapsed();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "render bench: {big} resources, plan JSON {json_kib} KiB, note {note_len} chars\n\
         render bench: the binary, `planbot render FILE` (best of {runs}): {big} resources {}, peak RSS {bin_rss} KiB ({:.2}x the JSON; {rss_how}); {} resources ({half_kib} KiB) {}, peak RSS {half_rss} KiB ({:.2}x); an empty plan: peak RSS {bin_base} KiB\n\
         render bench: in process, one run each: parse {}, secrets + scrubber {}, render_note {}, Fingerprint::of {}, lint {}; whole `planbot render` path {}\n\
         render bench: in process, RSS before (JSON included) {rss_before} KiB; peak RSS of the whole path {peak_all} KiB ({:.1}x the JSON), \
         while parsing {peak_parse} KiB ({:.1}x), while rendering the note {peak_render} KiB ({:.1}x)",
        ms(bin_wall),
        x(bin_rss),
        big / 2,
        ms(half_wall),
        half_rss as f64 / half_kib.max(1) as f64,
        ms(parse),
        ms(secrets),
        ms(note),
        ms(fingerprint),
        ms(lint),
        ms(once),
        x(peak_all),
        x(peak_parse),
        x(peak_render),
    );
    drop(err);

    let small_json = synth_plan(small);
    let small_plan = Plan::from_json(&small_json).unwrap();
    let small_scrubber = Secrets::from_plan(&small_plan).scrubber();

    let mut c = Criterion::default().configure_from_args();
    c.bench_function(&format!("render_note {big} resources"), |b| {
        b.iter(|| black_box(render(&plan, &fp, &scrubber)))
    });
    c.bench_function(
        &format!("render_note {small} resources (every diff computed)"),
        |b| b.iter(|| black_box(render(&small_plan, &fp, &small_scrubber))),
    );
    // A kept plan's secrets are known by their digests only (`core::redact::SecretDigests`):
    // the same note, every text searched window by window.
    let key = planbot::core::redact::DigestKey::derive(b"bench-key");
    let mut digested = Secrets::new();
    digested.add_digests(key, &Secrets::from_plan(&small_plan).digests(key));
    let digested = digested.scrubber();
    c.bench_function(
        &format!("render_note {small} resources, its secrets known by digest only"),
        |b| b.iter(|| black_box(render(&small_plan, &fp, &digested))),
    );
    c.bench_function(&format!("lint {big} resources"), |b| {
        b.iter(|| black_box(planbot::core::proxmox::lint::lint(&plan, &[])))
    });
    c.final_summary();
}
