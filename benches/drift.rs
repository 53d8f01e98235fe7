//! Drift benchmark (not a test): what a drift check costs beyond the engine's own plans.
//!
//! `cargo bench --bench drift` checks one project of 1 root and one of 20 roots (10
//! `terraform_data` resources each, GitLab-managed state in the fake GitLab, the real engine,
//! the sandbox as configured by default) with `flows::drift::check::tick`, as the schedule and
//! `planbot drift` run it (the repository fetched and checked out, every root planned with the
//! plan credentials and `-lock=false`, classified, its issue and run written, the status set),
//! and the bare engine on the same roots with the same state backend (`init`, `plan
//! -lock=false -out`, `show -json`, run directly in a copy of each root). It prints the medians
//! and planbot's overhead per root. Under `cargo test --all-targets` (no `--bench`) it checks 1
//! and 2 roots once, to stay fast.

#[path = "../tests/it/support/mod.rs"]
mod support;

use planbot::core::config::Config;
use planbot::core::state::{http_backend_env, state_address, OVERRIDE_FILE, OVERRIDE_TEXT};
use planbot::flows::context::app_state::App;
use planbot::flows::drift::check::{tick, Selection};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};
use support::fake_gitlab::{FakeGitLab, FakeProject};

const INFRA: &str = "infra/homelab";
const RESOURCES: usize = 10;

fn root_tf(n: usize) -> String {
    format!(
        r#"resource "terraform_data" "vm" {{
  count = {n}
  input = {{
    name   = "vm-${{count.index}}"
    cores  = 2
    memory = 2048
  }}
}}
"#
    )
}

/// A project of `roots` roots on the fake GitLab, and planbot's config for it.
fn world(engine: &Path, roots: usize, data: &Path) -> (FakeGitLab, FakeProject, Config) {
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project(INFRA);
    let mut files: Vec<(String, String)> = (0..roots)
        .map(|k| (format!("root{k}/main.tf"), root_tf(RESOURCES)))
        .collect();
    let repo_config: String = (0..roots)
        .map(|k| format!("[[roots]]\nname = \"root{k}\"\ndir = \"root{k}\"\n\n"))
        .collect();
    files.push((".planbot.toml".into(), repo_config));
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    gitlab.commit_files(&project, "main", &refs);
    let text = support::service::bench_config(data, &gitlab, INFRA, engine).text();
    let config = Config::load(&text, &[], &|_| Err("no files".into())).expect("the bench config");
    (gitlab, project, config)
}

/// The bare engine on every root, with the state backend planbot gives a drift check.
fn bare_engine(engine: &Path, config: &Config, project: &FakeProject, roots: usize) -> Duration {
    let credential = config.state.plan.as_ref().expect("[state.plan]");
    let started = Instant::now();
    for k in 0..roots {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("main.tf"), root_tf(RESOURCES)).unwrap();
        std::fs::write(dir.path().join(OVERRIDE_FILE), OVERRIDE_TEXT).unwrap();
        let address = state_address(&config.gitlab.url, project.id, &format!("root{k}"));
        let env = http_backend_env(&address, credential);
        let run = |args: &[&str]| support::run_engine(engine, dir.path(), &env, args);
        run(&["init", "-input=false", "-no-color", "-lock=false"]);
        run(&[
            "plan",
            "-input=false",
            "-no-color",
            "-lock=false",
            "-out=plan.bin",
        ]);
        run(&["show", "-json", "-no-color", "plan.bin"]);
    }
    started.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let engine = support::engine();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (sizes, runs): (&[usize], usize) = if benching {
        (&[1, 20], 5)
    } else {
        (&[1, 2], 1)
    };
    for &roots in sizes {
        let data = tempfile::tempdir().unwrap();
        let (_gitlab, project, config) = world(&engine, roots, data.path());
        let app = runtime
            .block_on(App::open(config.clone()))
            .expect("the app");
        let check = || {
            runtime.block_on(async {
                let started = Instant::now();
                let t = tick(&app, &Selection::default(), SystemTime::now())
                    .await
                    .expect("a drift tick");
                assert_eq!(t.roots.len(), roots);
                assert!(
                    t.roots.iter().all(|r| r.verdict.exit_code() == 2),
                    "every root drifts (nothing applied): {t:?}"
                );
                started.elapsed()
            })
        };
        // The first check opens the issues and warms the mirror; later ones edit them.
        check();
        let mut planbot = Vec::new();
        let mut bare = Vec::new();
        for _ in 0..runs {
            planbot.push(check());
            bare.push(bare_engine(&engine, &config, &project, roots));
        }
        let (planbot, bare) = (median(planbot), median(bare));
        let overhead = planbot.saturating_sub(bare);
        println!(
            "drift check, {roots} root(s) of {RESOURCES} resources: planbot {:.0} ms, bare engine \
             (init + plan + show per root) {:.0} ms: {:.0} ms more, {:.0} ms per root ({:.0}%)",
            planbot.as_secs_f64() * 1e3,
            bare.as_secs_f64() * 1e3,
            overhead.as_secs_f64() * 1e3,
            overhead.as_secs_f64() * 1e3 / roots as f64,
            overhead.as_secs_f64() / bare.as_secs_f64() * 100.0,
        );
    }
}
