//! Many-roots benchmark (not a test): a repository of N roots that all call one local module
//! (GitLab-managed state, `plan.max_concurrent_plans = 4`), served by `planbot serve` against
//! the fake GitLab on loopback with the real engine.
//!
//! `cargo bench --bench roots` measures, for 40 roots and then 200:
//! 1. **A module change**: an MR that changes `modules/vm`, which every root calls: its hook to
//!    its green `planbot/plan` (every root planned), against the bare engine doing `init` +
//!    `plan -out` + `show -json` for the N roots one after the other in copies of them;
//! 2. **A push to one root**: the same MR's next push, which changes `stacks/r07/main.tf` only:
//!    its hook to its green status (one root planned, the others' plans reused).
//!
//! Each with the engine's checks beside each plan (the default) and without them; each figure
//! the median of three rounds (`PLANBOT_BENCH_RUNS`), with its range, and the bare engine's CPU
//! time, which divided by the cores is the floor of any schedule of the same engine processes.
//!
//! 3. **One MR over replicas**: the module change on 1, 2 and 3 replicas on one PostgreSQL
//!    (each with 4 engine slots; the hook goes to the first), and how many of the roots each
//!    replica planned (the roots of one MR are units any replica may take); then the same with
//!    each replica and its engines pinned to a core of its own (`taskset`), as many replicas as
//!    cores: replicas on machines of their own, which sharing one machine's cores cannot show.
//!
//! Under `cargo test --all-targets` (no `--bench`) it runs once with 4 roots (and 1 and 2
//! replicas on PostgreSQL), to stay fast.

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};
use support::fake_gitlab::{FakeGitLab, FakeProject};

const INFRA: &str = "infra/homelab";

/// The module every root calls: one `terraform_data` whose input depends on `tag`.
fn module_tf(tag: &str) -> String {
    format!(
        "variable \"name\" {{}}\n\nresource \"terraform_data\" \"vm\" {{\n  input = {{\n    name = var.name\n    tag  = \"{tag}\"\n  }}\n}}\n"
    )
}

/// Root `i`: its own resource (input `tag`) and the module.
fn root_tf(i: usize, tag: &str) -> String {
    format!(
        "resource \"terraform_data\" \"own\" {{\n  input = \"r{i:02}-{tag}\"\n}}\n\nmodule \"vm\" {{\n  source = \"../../modules/vm\"\n  name   = \"r{i:02}\"\n}}\n"
    )
}

/// The roots' `.planbot.toml`; `checks`: with the engine's checks beside each plan (the
/// default: `fmt` after each plan, one more engine process per root; `validate` runs only
/// after a failed plan, none fails here).
fn planbot_toml(roots: usize, checks: bool) -> String {
    let off = match checks {
        true => "",
        false => "checks = { validate = false, fmt = false, test = false }\n",
    };
    (0..roots)
        .map(|i| format!("[[roots]]\nname = \"r{i:02}\"\ndir = \"stacks/r{i:02}\"\n{off}\n"))
        .collect()
}

struct World {
    gitlab: FakeGitLab,
    project: FakeProject,
    /// The `planbot serve` processes (one, unless on PostgreSQL); hooks go to the first.
    serve: Vec<(Child, u16)>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl World {
    /// `replicas` processes on PostgreSQL store `store`, or one on SQLite (`None`); `pinned`:
    /// replica `i` and its engines on core `i` alone (`taskset`), one machine of one core each.
    fn start(
        engine: &Path,
        roots: usize,
        checks: bool,
        store: Option<&str>,
        replicas: usize,
        pinned: bool,
    ) -> World {
        let gitlab = FakeGitLab::start();
        let project = gitlab.create_project(INFRA);
        let mut files = vec![
            (".planbot.toml".to_string(), planbot_toml(roots, checks)),
            ("modules/vm/main.tf".to_string(), module_tf("v1")),
        ];
        for i in 0..roots {
            files.push((format!("stacks/r{i:02}/main.tf"), root_tf(i, "v1")));
        }
        let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (&p[..], &t[..])).collect();
        gitlab.commit_files(&project, "main", &files);
        let dir = tempfile::tempdir().unwrap();
        let serve = (0..replicas)
            .map(|i| {
                let file = dir.path().join(format!("planbot-{i}.toml"));
                let data = dir.path().join(format!("data-{i}"));
                let config = support::service::bench_config(&data, &gitlab, INFRA, engine)
                    .plan_slots(4)
                    .set("plan", "workers_per_author", "4");
                let config = match store {
                    Some(url) => config.set("store", "url", &format!("\"{url}\"")),
                    None => config,
                };
                std::fs::write(&file, config.text()).unwrap();
                match pinned {
                    false => support::spawn_serve(&file),
                    true => {
                        let mut cmd = std::process::Command::new("taskset");
                        cmd.args(["-c", &i.to_string(), env!("CARGO_BIN_EXE_planbot")])
                            .args(["serve", "--config"])
                            .arg(&file)
                            .env("RUST_LOG", "warn,planbot::flows::service::server=info");
                        support::ServeProcess::spawn(cmd).into_child()
                    }
                }
            })
            .collect();
        World {
            serve,
            gitlab,
            project,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    async fn deliver(&self, body: Vec<u8>, key: &str) {
        support::service::deliver_mr_hook(&self.http, self.serve[0].1, body, key).await;
    }

    async fn planned(&self, sha: &str) {
        support::plan_turns_green(&self.gitlab, &self.project, sha, 1800).await;
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for (child, _) in &mut self.serve {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The bare engine on the N roots, one after the other: `init`, `plan -out`, `show -json` in
/// a copy of each (local state: nothing to read), as planbot runs them, with `go` in their
/// environment besides this process's (none: the engine's defaults).
fn bare_engine(engine: &Path, roots: usize, go: &[(&str, String)]) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("modules/vm");
    std::fs::create_dir_all(&module).unwrap();
    std::fs::write(module.join("main.tf"), module_tf("v2")).unwrap();
    let started = Instant::now();
    for i in 0..roots {
        let root = dir.path().join(format!("stacks/r{i:02}"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("main.tf"), root_tf(i, "v1")).unwrap();
        let run = |args: &[&str]| support::run_engine(engine, &root, go.iter().cloned(), args);
        run(&["init", "-input=false", "-no-color"]);
        run(&["plan", "-input=false", "-no-color", "-out=plan.bin"]);
        run(&["show", "-json", "-no-color", "plan.bin"]);
    }
    started.elapsed()
}

/// The CPU time (user and system) of this process's children waited for so far.
fn children_cpu() -> Duration {
    // SAFETY: `getrusage` fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// (the module change's hook to green, the push to one root's hook to green).
async fn planbot(engine: &Path, roots: usize, checks: bool) -> (Duration, Duration) {
    let w = World::start(engine, roots, checks, None, 1, false);
    let (iid, head, module_change) = module_change(&w).await;

    let one = if roots > 7 { 7 } else { 0 };
    let tf = root_tf(one, "v2");
    let path = format!("stacks/r{one:02}/main.tf");
    let new = w.gitlab.push(&w.project, "vm-v2", &[(&path, &tf)]);
    let body = w
        .gitlab
        .mr_webhook(&w.project, iid)
        .action("update")
        .oldrev(&head)
        .body();
    let started = Instant::now();
    w.deliver(body, "push").await;
    w.planned(&new).await;
    let one_root = started.elapsed();
    let note = w.gitlab.plan_note(&w.project, iid).expect("a plan note");
    let reused = note.matches("♻️ _Reused: planned at").count();
    assert_eq!(reused, roots - 1, "every other root's plan is reused");
    (module_change, one_root)
}

/// The MR that changes the module every root calls, opened: (its iid, its head, its hook to
/// its green status).
async fn module_change(w: &World) -> (u64, String, Duration) {
    w.gitlab.commit_files(
        &w.project,
        "vm-v2",
        &[("modules/vm/main.tf", &module_tf("v2"))],
    );
    let iid = w.gitlab.open_mr(&w.project, "vm-v2", "main");
    let head = w.gitlab.mr_sha(&w.project, iid);
    let body = w.gitlab.mr_webhook(&w.project, iid).action("open").body();
    let started = Instant::now();
    w.deliver(body, "open").await;
    w.planned(&head).await;
    (iid, head, started.elapsed())
}

/// The module change on `replicas` replicas on a fresh PostgreSQL database: its hook to green,
/// and how many roots each replica planned (most first); `None` when PostgreSQL is not there.
async fn over_replicas(
    engine: &Path,
    roots: usize,
    replicas: usize,
    pinned: bool,
) -> Option<(Duration, Vec<usize>)> {
    let store = support::postgres::fresh_database("planbot_bench").await?;
    let w = World::start(engine, roots, true, Some(&store), replicas, pinned);
    let (_, head, took) = module_change(&w).await;
    let db = support::postgres::connect(&store).await;
    let rows = db
        .query(
            "SELECT count(*) FROM runs WHERE sha = $1 AND kind = 'plan' GROUP BY owner
             ORDER BY count(*) DESC",
            &[&head],
        )
        .await
        .unwrap();
    let per_replica: Vec<usize> = rows.iter().map(|r| r.get::<_, i64>(0) as usize).collect();
    assert_eq!(
        per_replica.iter().sum::<usize>(),
        roots,
        "every root planned once"
    );
    Some((took, per_replica))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let engine: PathBuf = support::engine();
    // `PLANBOT_BENCH_ROOTS=200` measures one size only (a profile of it, say).
    let one: Option<usize> = std::env::var("PLANBOT_BENCH_ROOTS")
        .ok()
        .and_then(|n| n.parse().ok());
    let sizes: Vec<usize> = match (full, one) {
        (true, Some(n)) => vec![n],
        (true, None) => vec![40, 200],
        (false, _) => vec![4],
    };
    // Each figure is the median of this many rounds (bare engine, checks on, checks off, one
    // after the other in each round, so that the machine's drift hits all three alike).
    let rounds: usize = match full {
        true => std::env::var("PLANBOT_BENCH_RUNS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(3),
        false => 1,
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // What planbot's engine runs get from the default caps (`sandbox.memory_max`, 4 GiB).
    let tuned = planbot::capabilities::engine::go_runtime_env(Some(4 << 30));
    println!(
        "roots bench: engine {}, {cores} cores, plan.max_concurrent_plans = 4, median of {rounds} \
         round(s) (min-max)",
        engine.display(),
    );
    // `PLANBOT_BENCH_ONLY=replicas`: the figures over replicas alone.
    let only_replicas = std::env::var("PLANBOT_BENCH_ONLY").is_ok_and(|v| v == "replicas");
    for roots in sizes {
        if only_replicas {
            let bare = bare_engine(&engine, roots, &[]).as_secs_f64();
            println!("{roots} roots, bare engine (one round): {bare:.1} s");
            replicas_figures(&engine, roots, rounds, full, bare).await;
            continue;
        }
        let mut figures = Figures::default();
        for _ in 0..rounds {
            let cpu_before = children_cpu();
            figures
                .bare
                .push(bare_engine(&engine, roots, &[]).as_secs_f64());
            figures
                .bare_cpu
                .push((children_cpu() - cpu_before).as_secs_f64());
            let cpu_before = children_cpu();
            figures
                .bare_tuned
                .push(bare_engine(&engine, roots, &tuned).as_secs_f64());
            figures
                .bare_tuned_cpu
                .push((children_cpu() - cpu_before).as_secs_f64());
            for checks in [true, false] {
                let cpu_before = children_cpu();
                let (module_change, one_root) = planbot(&engine, roots, checks).await;
                let i = usize::from(!checks);
                figures.cpu[i].push((children_cpu() - cpu_before).as_secs_f64());
                figures.module_change[i].push(module_change.as_secs_f64());
                figures.one_root[i].push(one_root.as_secs_f64());
            }
        }
        let (bare, cpu) = (median(&figures.bare), median(&figures.bare_cpu));
        let floor = cpu / cores as f64;
        println!(
            "{roots} roots, bare engine: {}, {} of CPU: no schedule of the same engine processes \
             on {cores} cores takes under {floor:.1} s ({:.2}x)",
            spread(&figures.bare),
            spread(&figures.bare_cpu),
            floor / bare,
        );
        let tuned_cpu = median(&figures.bare_tuned_cpu);
        println!(
            "{roots} roots, bare engine with planbot's Go collector settings ({}): {}, {} of CPU \
             (floor {:.1} s)",
            tuned
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            spread(&figures.bare_tuned),
            spread(&figures.bare_tuned_cpu),
            tuned_cpu / cores as f64,
        );
        for (i, what) in [
            "checks on (one fmt for the roots, validate only after a failed plan)",
            "checks off",
        ]
        .iter()
        .enumerate()
        {
            println!(
                "{roots} roots, {what}: module change (every root planned) {} ({:.2}x the bare \
                 engine); push to one root (the others reused) {}; CPU of the processes the round \
                 started (planbot, its engines, the fake GitLab's git) {}",
                spread(&figures.module_change[i]),
                median(&figures.module_change[i]) / bare,
                spread(&figures.one_root[i]),
                spread(&figures.cpu[i]),
            );
        }
        replicas_figures(&engine, roots, rounds, full, bare).await;
    }
}

/// The module change's figures on 1, 2 and 3 replicas on PostgreSQL (1 and 2 outside
/// `--bench`), each the median of `rounds`, beside the one replica on SQLite and the bare
/// engine.
async fn replicas_figures(engine: &Path, roots: usize, rounds: usize, full: bool, bare: f64) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut runs: Vec<(usize, bool)> = match full {
        true => vec![(1, false), (2, false), (3, false)],
        false => vec![(1, false), (2, false)],
    };
    // One machine of one core per replica: as many as the cores (under `--bench`).
    if full {
        runs.extend((1..=cores.min(3)).map(|n| (n, true)));
    }
    for (replicas, pinned) in runs {
        let mut took = Vec::new();
        let mut shares = Vec::new();
        for _ in 0..rounds {
            let Some((t, per_replica)) = over_replicas(engine, roots, replicas, pinned).await
            else {
                println!("{roots} roots over replicas on PostgreSQL: NOT RUN (no PostgreSQL)");
                return;
            };
            took.push(t.as_secs_f64());
            shares.push(per_replica);
        }
        let on = match pinned {
            true => "each replica and its engines pinned to a core of its own",
            false => "sharing the machine's cores",
        };
        println!(
            "{roots} roots, module change on {replicas} replica(s) on PostgreSQL (4 engine slots \
             each, {on}): {} ({:.2}x the bare engine); roots planned per replica, each round: \
             {shares:?}",
            spread(&took),
            median(&took) / bare,
        );
    }
}

/// Seconds of each round: the bare engine's wall and CPU time, and planbot's times and CPU
/// with the checks on (`[0]`) and off (`[1]`).
#[derive(Default)]
struct Figures {
    bare: Vec<f64>,
    bare_cpu: Vec<f64>,
    /// The same with planbot's Go runtime settings (`capabilities::engine::go_runtime_env`).
    bare_tuned: Vec<f64>,
    bare_tuned_cpu: Vec<f64>,
    module_change: [Vec<f64>; 2],
    one_root: [Vec<f64>; 2],
    /// The CPU time of the processes a round started and waited for: `planbot serve` and every
    /// process it started (its engines), and the fake GitLab's `git`: the machine's work, which
    /// its noise moves less than wall time.
    cpu: [Vec<f64>; 2],
}

fn median(seconds: &[f64]) -> f64 {
    let mut sorted = seconds.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// `7.4 s (7.1-7.9 s)`: the median, and the range when there are several rounds.
fn spread(seconds: &[f64]) -> String {
    let (min, max) = (
        seconds.iter().copied().fold(f64::INFINITY, f64::min),
        seconds.iter().copied().fold(0.0, f64::max),
    );
    match seconds.len() {
        1 => format!("{:.1} s", seconds[0]),
        _ => format!("{:.1} s ({min:.1}-{max:.1} s)", median(seconds)),
    }
}
