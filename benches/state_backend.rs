//! State backend benchmark (not a test): what GitLab-managed state costs a plan.
//!
//! `cargo bench --bench state_backend` plans one root of 30 resources, already applied, with the
//! real engine exactly as the service does (the service's engine runner for the trust level,
//! strict sandbox, a fresh `.terraform` each time as in a fresh checkout: `init`, `plan -out`,
//! `show -json`), with its state
//! 1. in a local `terraform.tfstate` next to the code (what STATE001 refuses in the service),
//! 2. in GitLab-managed state (the fake GitLab's state API on loopback, the `http` backend,
//!    through the job's state gate as in the service), read only with the Developer's token
//!    and `-lock=false` (an MR's plan),
//! 3. the same with the Maintainer's token and locking (the default branch's plan before an
//!    apply: lock, read, unlock).
//!
//! 11 runs of each, interleaved; it prints min, median and max. Under `cargo test --all-targets`
//! (no `--bench`) it runs each once, to stay fast. The engine: `PLANBOT_TEST_ENGINE`, or
//! `tofu`/`terraform` on `PATH`.

#[path = "../tests/it/support/mod.rs"]
mod support;

use planbot::capabilities::engine::{Engine, PlanRequest};
use planbot::core::config::Config;
use planbot::core::ids::{MrIid, ProjectId};
use planbot::core::repo_config::RepoConfig;
use planbot::flows::confinement::credentials::Trust;
use planbot::flows::confinement::plan_request::JobRuns;
use planbot::flows::context::app_state::App;
use std::time::{Duration, Instant};
use support::fake_gitlab::{FakeGitLab, DEVELOPER, MAINTAINER};

const ROOT: &str = r#"resource "terraform_data" "vm" {
  count = 30
  input = {
    name   = "vm-${count.index}"
    cores  = 2
    memory = 2048
  }
}
"#;

/// One way of keeping the root's state.
struct Variant {
    name: &'static str,
    engine: Engine,
    dir: tempfile::TempDir,
    request: PlanRequest,
}

impl Variant {
    /// One plan from a fresh `.terraform`, as in a fresh checkout: its wall time.
    async fn plan(&self) -> Duration {
        let _ = std::fs::remove_dir_all(self.dir.path().join(".terraform"));
        let started = Instant::now();
        let run = self
            .engine
            .plan(self.dir.path(), &self.request)
            .await
            .unwrap_or_else(|e| panic!("{}: {}", self.name, e.report(30)));
        let took = started.elapsed();
        assert_eq!(
            run.plan()
                .managed_changes()
                .filter(|rc| rc.has_change())
                .count(),
            0,
            "{}: the state holds the applied root",
            self.name
        );
        took
    }
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let runs = if quick { 1 } else { 11 };
    let engine_bin = support::engine();
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project("infra/homelab");
    let reader = gitlab.member_with_role(&project, "state-reader", DEVELOPER);
    let writer = gitlab.member_with_role(&project, "state-writer", MAINTAINER);
    let data = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
data_dir = "{data}"
fingerprint_key = "bench-fingerprint-key-0123456789"
[gitlab]
url = "{url}"
token = "{bot}"
webhook_secret = "bench-secret"
projects = ["infra/homelab"]
[engine]
binary = "{engine}"
[state]
default = "gitlab"
[state.plan]
token = "{reader}"
[state.apply]
token = "{writer}"
"#,
        data = data.path().display(),
        url = gitlab.url(),
        bot = gitlab.bot_token(),
        engine = engine_bin.display(),
        reader = reader.token,
        writer = writer.token,
    );
    let config = Config::load(&text, &[], &|_| Err("no files".into())).unwrap();
    let app = App::new(config.clone()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mr_engine = app.mr_engine(ProjectId(project.id), MrIid(1)).unwrap();
    let main_engine = app.default_branch_engine().unwrap();
    let root = &RepoConfig::absent().roots[0];

    // Each variant's root, its state made by applying it once.
    let local = tempfile::tempdir().unwrap();
    std::fs::write(local.path().join("main.tf"), ROOT).unwrap();
    let http = tempfile::tempdir().unwrap();
    std::fs::write(http.path().join("main.tf"), ROOT).unwrap();
    // Each variant's pass through a state gate (as a job's runs get one), kept for every run
    // of the variant.
    let sha = planbot::core::ids::CommitSha("0".repeat(40));
    let gate = |trust| {
        let project = planbot::capabilities::state_gate::GateProject {
            id: project.id,
            path: None,
        };
        runtime.block_on(async {
            JobRuns::new(&config, trust, project, &sha, http.path())
                .request(root, &Default::default())
                .await
                .unwrap()
                .request
                .state_gate
                .unwrap()
        })
    };
    let (read_gate, write_gate) = (gate(Trust::MergeRequest), gate(Trust::DefaultBranch));
    runtime.block_on(async {
        for (dir, state_gate) in [
            (local.path(), None),
            (http.path(), Some(write_gate.clone())),
        ] {
            let req = PlanRequest {
                extra_env: state_gate.as_ref().map(|g| g.env()).unwrap_or_default(),
                state_gate,
                ..PlanRequest::default()
            };
            main_engine
                .plan(dir, &req)
                .await
                .unwrap()
                .apply()
                .await
                .unwrap();
        }
    });
    let http_lock = tempfile::tempdir().unwrap();
    for f in ["main.tf", planbot::core::state::OVERRIDE_FILE] {
        std::fs::copy(http.path().join(f), http_lock.path().join(f)).unwrap();
    }
    let variants = [
        Variant {
            name: "local terraform.tfstate",
            engine: mr_engine.clone(),
            dir: local,
            request: PlanRequest {
                no_lock: true,
                ..PlanRequest::default()
            },
        },
        Variant {
            name: "GitLab-managed, read only (-lock=false, an MR's plan)",
            engine: mr_engine,
            dir: http,
            request: PlanRequest {
                no_lock: true,
                extra_env: read_gate.env(),
                state_gate: Some(read_gate),
                ..PlanRequest::default()
            },
        },
        Variant {
            name: "GitLab-managed, locked (the default branch's plan)",
            engine: main_engine,
            dir: http_lock,
            request: PlanRequest {
                extra_env: write_gate.env(),
                state_gate: Some(write_gate),
                ..PlanRequest::default()
            },
        },
    ];
    let setup_calls = gitlab.state_requests().len();
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    runtime.block_on(async {
        for _ in 0..runs {
            for (v, t) in variants.iter().zip(times.iter_mut()) {
                t.push(v.plan().await);
            }
        }
    });
    println!("plan of 30 applied resources, {runs} run(s) each, interleaved:");
    for (v, t) in variants.iter().zip(times.iter_mut()) {
        t.sort();
        let ms = |d: &Duration| d.as_millis();
        println!(
            "  {:<55} median {:>5} ms (min {} ms, max {} ms)",
            v.name,
            ms(&t[t.len() / 2]),
            ms(&t[0]),
            ms(&t[t.len() - 1])
        );
    }
    let calls = gitlab.state_requests().split_off(setup_calls);
    assert!(
        calls.iter().all(|c| c.status < 400),
        "every measured state request succeeded: {calls:?}"
    );
}
