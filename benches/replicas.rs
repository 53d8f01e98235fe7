//! Plans benchmark (not a test): how fast `planbot serve` turns pushes into plan notes, against
//! the fake GitLab on loopback with the real engine.
//!
//! `cargo bench --bench replicas` measures, on this machine:
//! 1. **Plans per minute** with 1 replica and with 3 replicas on one PostgreSQL (and 1 replica
//!    given the 3 replicas' worker count): MRs opened at once, hooks spread over the replicas,
//!    the clock stops when the last MR's status is green. Engine-bound: the point is that
//!    nothing in planbot serialises the plans.
//! 2. **Push-to-note overhead**: the time from a push's hook to its plan note on one replica
//!    (SQLite store), against the bare engine on the same root (`init` + `plan -out` +
//!    `show -json`, run directly in a copy of it); the median of several pushes each.
//!
//! PostgreSQL: `PLANBOT_BENCH_POSTGRES_URL` or `PLANBOT_TEST_POSTGRES_URL` (a server URL; a
//! fresh database is made per run). The engine: `PLANBOT_TEST_ENGINE`, or `tofu`/`terraform`.
//! Under `cargo test --all-targets` (no `--bench`) it runs once with a few MRs, to stay fast.

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};
use support::fake_gitlab::{FakeGitLab, FakeProject};

const INFRA: &str = "infra/homelab";

/// A root of `n` resources whose inputs depend on `tag`: each push changes every one.
fn root_tf(n: usize, tag: &str) -> String {
    format!(
        r#"variable "tag" {{
  default = "{tag}"
}}

resource "terraform_data" "vm" {{
  count = {n}
  input = {{
    name   = "vm-${{count.index}}"
    tag    = var.tag
    cores  = 2
    memory = 2048
  }}
}}
"#
    )
}

/// One bench world: the fake GitLab with the project, and `planbot serve` processes.
struct World {
    gitlab: FakeGitLab,
    project: FakeProject,
    replicas: Vec<(Child, u16)>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl World {
    /// `replicas` processes on `store` (`None`: each its own SQLite file), `workers` each.
    fn start(engine: &Path, store: Option<&str>, replicas: usize, workers: usize) -> World {
        let gitlab = FakeGitLab::start();
        let project = gitlab.create_project(INFRA);
        gitlab.commit_files(&project, "main", &[("main.tf", &root_tf(1, "main"))]);
        let dir = tempfile::tempdir().unwrap();
        let replicas = (0..replicas)
            .map(|i| {
                let data = dir.path().join(format!("replica-{i}"));
                let file = dir.path().join(format!("replica-{i}.toml"));
                std::fs::write(&file, config(&data, &gitlab, engine, store, workers)).unwrap();
                support::spawn_serve(&file)
            })
            .collect();
        World {
            gitlab,
            project,
            replicas,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    /// Deliver `body` (an MR hook) to replica `i`.
    async fn deliver(&self, i: usize, body: Vec<u8>, key: &str) {
        let port = self.replicas[i % self.replicas.len()].1;
        support::service::deliver_mr_hook(&self.http, port, body, key).await;
    }

    /// Wait (polling the fake every 5 ms) until `sha`'s plan status is green.
    async fn planned(&self, sha: &str) {
        support::plan_turns_green(&self.gitlab, &self.project, sha, 900).await;
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for (child, _) in &mut self.replicas {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn config(
    data: &Path,
    gitlab: &FakeGitLab,
    engine: &Path,
    store: Option<&str>,
    workers: usize,
) -> String {
    let config = support::service::bench_config(data, gitlab, INFRA, engine).plan_slots(workers);
    match store {
        Some(url) => config.set("store", "url", &format!("\"{url}\"")),
        None => config,
    }
    .text()
}

/// `mrs` MRs opened at once, their hooks spread over the replicas: plans per minute.
async fn plans_per_minute(
    engine: &Path,
    store: Option<String>,
    replicas: usize,
    workers: usize,
    mrs: usize,
    resources: usize,
) -> f64 {
    let w = World::start(engine, store.as_deref(), replicas, workers);
    let mut heads = Vec::new();
    let mut hooks = Vec::new();
    for m in 0..mrs {
        let branch = format!("mr-{m}");
        let tf = root_tf(resources, &branch);
        w.gitlab
            .commit_files(&w.project, &branch, &[("main.tf", &tf)]);
        let iid = w.gitlab.open_mr(&w.project, &branch, "main");
        heads.push(w.gitlab.mr_sha(&w.project, iid));
        hooks.push(w.gitlab.mr_webhook(&w.project, iid).action("open").body());
    }
    let started = Instant::now();
    for (m, body) in hooks.into_iter().enumerate() {
        w.deliver(m, body, &format!("open-{m}")).await;
    }
    for head in &heads {
        w.planned(head).await;
    }
    mrs as f64 / started.elapsed().as_secs_f64() * 60.0
}

/// The bare engine on `root_tf(resources, tag)`: `init`, `plan -out`, `show -json`, as planbot
/// runs them (no colour, no input), in a fresh copy each time.
fn bare_engine(engine: &Path, resources: usize, tag: &str) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.tf"), root_tf(resources, tag)).unwrap();
    let run = |args: &[&str]| {
        support::run_engine(engine, dir.path(), std::iter::empty::<(&str, &str)>(), args)
    };
    let started = Instant::now();
    run(&["init", "-input=false", "-no-color"]);
    run(&["plan", "-input=false", "-no-color", "-out=plan.bin"]);
    run(&["show", "-json", "-no-color", "plan.bin"]);
    started.elapsed()
}

/// Each push's time from its hook to a green plan status with its note, on one replica.
async fn push_to_note(engine: &Path, pushes: usize, resources: usize) -> Vec<Duration> {
    let w = World::start(engine, None, 1, 2);
    let tf = root_tf(resources, "push-0");
    w.gitlab
        .commit_files(&w.project, "change", &[("main.tf", &tf)]);
    let iid = w.gitlab.open_mr(&w.project, "change", "main");
    let body = w.gitlab.mr_webhook(&w.project, iid).action("open").body();
    w.deliver(0, body, "open").await;
    w.planned(&w.gitlab.mr_sha(&w.project, iid)).await;
    let mut times = Vec::new();
    for k in 1..=pushes {
        let old = w.gitlab.mr_sha(&w.project, iid);
        let tf = root_tf(resources, &format!("push-{k}"));
        let head = w.gitlab.push(&w.project, "change", &[("main.tf", &tf)]);
        let body = w
            .gitlab
            .mr_webhook(&w.project, iid)
            .action("update")
            .oldrev(&old)
            .body();
        let started = Instant::now();
        w.deliver(0, body, &format!("push-{k}")).await;
        w.planned(&head).await;
        times.push(started.elapsed());
        let note = w.gitlab.plan_note(&w.project, iid).expect("a plan note");
        assert!(note.contains(&head[..8]), "the note is the new head's");
    }
    times
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn postgres_server() -> Option<String> {
    std::env::var("PLANBOT_BENCH_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let engine: PathBuf = support::engine();
    if let Some(url) = postgres_server() {
        std::env::set_var("PLANBOT_TEST_POSTGRES_URL", url);
    }
    let (mrs, resources, pushes) = if full { (48, 50, 5) } else { (3, 5, 1) };
    println!(
        "replicas bench: engine {}, {mrs} MRs of {resources} resources, {} cores",
        engine.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // 1. Plans per minute: one replica on SQLite (the default), then on PostgreSQL one
    // replica, one replica with the three replicas' worker count, and three replicas.
    let sqlite = plans_per_minute(&engine, None, 1, 2, mrs, resources).await;
    println!("plans/min, 1 replica x 2 workers on SQLite: {sqlite:.1}");
    let runs: [(usize, usize); 3] = [(1, 2), (1, 6), (3, 2)];
    for (replicas, workers) in runs {
        let Some(store) = support::postgres::fresh_database("planbot_bench").await else {
            println!("plans/min on PostgreSQL: NOT RUN (PLANBOT_SKIP_POSTGRES_TESTS=1)");
            break;
        };
        let rate = plans_per_minute(&engine, Some(store), replicas, workers, mrs, resources).await;
        println!("plans/min, {replicas} replica(s) x {workers} workers on PostgreSQL: {rate:.1}");
    }

    // 2. Push-to-note overhead over the bare engine, on a small root and a large one.
    let sizes: &[usize] = if full { &[50, 1000] } else { &[resources] };
    for &size in sizes {
        let bare: Vec<Duration> = (0..pushes)
            .map(|k| bare_engine(&engine, size, &format!("bare-{k}")))
            .collect();
        let bare = median(bare);
        let planbot = median(push_to_note(&engine, pushes, size).await);
        let overhead = planbot.saturating_sub(bare);
        println!(
            "push-to-note, {size} resources: planbot {:.2} s, bare engine (init+plan+show) \
             {:.2} s, overhead {:.2} s ({:.0} %; goal <= max(10 %, 1 s))",
            planbot.as_secs_f64(),
            bare.as_secs_f64(),
            overhead.as_secs_f64(),
            overhead.as_secs_f64() / bare.as_secs_f64() * 100.0
        );
    }
}
