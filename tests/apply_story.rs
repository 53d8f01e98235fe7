//! Stories of the apply half: the manual `planbot-apply` job on protected `main` calls planbot
//! with its job token; planbot checks the job with (fake) GitLab, re-plans with the real
//! engine against GitLab-managed state (the engine's `http` backend), and applies only the
//! plan that was reviewed on the merge request.

mod service_support;
mod support;

use planbot::core::config::Config;
use planbot::flows::server::Options;
use service_support::TestService;
use support::fake_gitlab::{FakeGitLab, FakeJob, FakeProject, FakeUser};

const INFRA: &str = "infra/homelab";

/// The infra repo's root: three "VMs" and GitLab-managed state, exactly as a real project.
fn main_tf(vms: &[&str]) -> String {
    let vms: Vec<String> = vms.iter().map(|v| format!("\"{v}\"")).collect();
    format!(
        r#"terraform {{
  backend "http" {{}}
}}

variable "vms" {{
  type    = set(string)
  default = [{}]
}}

variable "admin_password" {{
  type      = string
  sensitive = true
  default   = "apply-canary-password-7f3a"
}}

resource "terraform_data" "vm" {{
  for_each = var.vms
  input = {{
    name  = each.key
    cores = 2
  }}
}}

resource "terraform_data" "password" {{
  input = var.admin_password
}}
"#,
        vms.join(", ")
    )
}

struct World {
    gitlab: FakeGitLab,
    project: FakeProject,
    alice: FakeUser,
    _data: tempfile::TempDir,
    config: Config,
}

fn config_for(
    data_dir: &std::path::Path,
    gitlab: &FakeGitLab,
    project: &FakeProject,
    engine: &std::path::Path,
) -> Config {
    let state = format!(
        "{}/api/v4/projects/{}/terraform/state/core",
        gitlab.url(),
        project.id
    );
    let text = format!(
        r#"
listen = "127.0.0.1:0"
data_dir = "{data}"
public_url = "http://planbot.test"
fingerprint_key = "test-fingerprint-key-0123456789"

[gitlab]
url = "{url}"
token = "{token}"
webhook_secret = "{secret}"
projects = ["{INFRA}"]

[engine]
binary = "{engine}"
timeout = "5m"

[engine.env]
TF_HTTP_ADDRESS = "{state}"
TF_HTTP_LOCK_ADDRESS = "{state}/lock"
TF_HTTP_UNLOCK_ADDRESS = "{state}/lock"
TF_HTTP_LOCK_METHOD = "POST"
TF_HTTP_UNLOCK_METHOD = "DELETE"
TF_HTTP_USERNAME = "planbot-bot"
TF_HTTP_PASSWORD = "{token}"

[plan]
max_concurrent_plans = 2
"#,
        data = data_dir.display(),
        url = gitlab.url(),
        token = gitlab.bot_token(),
        secret = service_support::WEBHOOK_SECRET,
        engine = engine.display(),
    );
    Config::load(&text, &[], &|_| Err("no files".into())).expect("test config is valid")
}

fn world(engine: &std::path::Path) -> World {
    let gitlab = FakeGitLab::start();
    let project = gitlab.create_project(INFRA);
    let alice = gitlab.create_user("alice");
    gitlab.add_member(&project, &alice, 40);
    gitlab.commit_files(&project, "main", &[("main.tf", &main_tf(&["blocky"]))]);
    let data = tempfile::tempdir().unwrap();
    let config = config_for(data.path(), &gitlab, &project, engine);
    World {
        gitlab,
        project,
        alice,
        _data: data,
        config,
    }
}

impl World {
    /// A running manual job of the newest pipeline on `main`, clicked by alice.
    fn apply_job(&self, id: u64) -> FakeJob {
        FakeJob {
            token: format!("glcbt-job-{id}"),
            id,
            name: "planbot-apply".into(),
            status: "running".into(),
            ref_: "main".into(),
            tag: false,
            user: Some(self.alice.clone()),
            pipeline_id: 1000 + id,
            project_id: self.project.id,
            sha: self.gitlab.branch_head(&self.project, "main").unwrap(),
        }
    }
}

/// What the CI job sees: the HTTP status and the streamed log.
async fn call_apply(s: &TestService, token: &str, body: &str) -> (u16, String) {
    let r = s
        .http
        .post(s.url("/api/v1/apply"))
        .header("JOB-TOKEN", token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("POST /api/v1/apply");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

fn last_line(log: &str) -> &str {
    log.lines()
        .rev()
        .find(|l| !l.starts_with("planbot: still working"))
        .unwrap_or("")
}

fn no_workers() -> Options {
    Options {
        workers: false,
        reconcile: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_that_may_not_apply_are_refused_each_with_its_own_reason() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), no_workers()).await;

    let other = w.gitlab.create_project("someone/else");
    let cases: Vec<(&str, FakeJob, &str)> = vec![
        (
            "a job token of another project",
            FakeJob {
                project_id: other.id,
                ..w.apply_job(1)
            },
            "is not one of planbot's allowed projects",
        ),
        (
            "a tag pipeline",
            FakeJob {
                tag: true,
                ref_: "v1.0".into(),
                ..w.apply_job(2)
            },
            "the pipeline is for a tag",
        ),
        (
            "a pipeline on another branch",
            FakeJob {
                ref_: "feature".into(),
                ..w.apply_job(3)
            },
            "is not the default branch `main`",
        ),
        (
            "a job with another name",
            FakeJob {
                name: "deploy".into(),
                ..w.apply_job(4)
            },
            "the job is named `deploy`; only `planbot-apply` may apply",
        ),
    ];
    for (what, job, reason) in cases {
        let token = job.token.clone();
        w.gitlab.register_job(job);
        let (status, log) = call_apply(&s, &token, "{}").await;
        assert_eq!(status, 200, "{what}: the refusal is streamed");
        assert!(
            last_line(&log).starts_with("planbot: apply refused:")
                && last_line(&log).contains(reason),
            "{what}: {log}"
        );
    }

    // An older pipeline: main moved on after the job's pipeline started.
    let old = w.apply_job(5);
    w.gitlab.register_job(old.clone());
    w.gitlab
        .commit_files(&w.project, "main", &[("README.md", "moved on\n")]);
    let (_, log) = call_apply(&s, &old.token, "{}").await;
    assert!(
        last_line(&log).contains("an older pipeline cannot apply"),
        "{log}"
    );

    // An unprotected main.
    w.gitlab.protect_branch(&w.project, "main", false);
    let job = w.apply_job(6);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert!(
        last_line(&log).contains("the branch `main` is not protected"),
        "{log}"
    );
    w.gitlab.protect_branch(&w.project, "main", true);

    // A token GitLab does not know, or none at all.
    let (_, log) = call_apply(&s, "glcbt-made-up", "{}").await;
    assert!(
        last_line(&log).contains("the job token is not valid"),
        "{log}"
    );
    let r = s.http.post(s.url("/api/v1/apply")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);

    // A confirm that is not a fingerprint prefix never reaches the engine.
    let job = w.apply_job(7);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, r#"{"confirm": "nothex!!"}"#).await;
    assert!(
        last_line(&log).contains("`confirm` must be 8 to 64 hexadecimal"),
        "{log}"
    );

    // Nothing of that touched the state.
    assert_eq!(w.gitlab.terraform_state(&w.project, "core").0, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_push_has_nothing_reviewed_and_applies_only_when_confirmed_once_per_job() {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), no_workers()).await;

    // Someone pushed straight to main: no MR, so no plan was reviewed.
    let job = w.apply_job(21);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert!(
        last_line(&log)
            .contains("did not come from a merge request, so no plan of it was reviewed"),
        "{log}"
    );
    assert!(
        log.contains("+ terraform_data.vm[\"blocky\"] (created)"),
        "the job log shows the plan: {log}"
    );
    let fingerprint = log
        .lines()
        .find_map(|l| l.split("fingerprint `").nth(1))
        .map(|rest| rest.trim_end_matches('`').to_string())
        .expect("the log names the fingerprint");
    assert_eq!(
        w.gitlab.terraform_state(&w.project, "core").0,
        None,
        "nothing applied"
    );

    // The same job again: one job id applies (or tries) once.
    let (_, log) = call_apply(&s, &job.token, "{}").await;
    assert!(
        last_line(&log).contains("job 21 has already applied once"),
        "{log}"
    );

    // A retry (a new job) with the confirm the log printed applies exactly that plan.
    let retry = w.apply_job(22);
    w.gitlab.register_job(retry.clone());
    let (_, log) = call_apply(
        &s,
        &retry.token,
        &format!(r#"{{"confirm": "{fingerprint}"}}"#),
    )
    .await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(
        log.contains("Apply complete!"),
        "the engine's output is streamed: {log}"
    );
    assert!(
        !log.contains("apply-canary-password-7f3a"),
        "no secret in the job log"
    );
    let (state, lock) = w.gitlab.terraform_state(&w.project, "core");
    let state = String::from_utf8(state.expect("state was written")).unwrap();
    assert!(state.contains("blocky"));
    assert!(lock.is_none(), "the state lock is released");
    let status = w
        .gitlab
        .status(&w.project, &retry.sha, "planbot/apply")
        .expect("a planbot/apply status");
    assert_eq!(status.state, "success");

    // Applying again: the plan is now empty and needs no review.
    let again = w.apply_job(23);
    w.gitlab.register_job(again.clone());
    let (_, log) = call_apply(&s, &again.token, "{}").await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    assert!(log.contains("no changes, nothing to apply"), "{log}");

    // No plan file and no secret is left in the data dir.
    let leftovers = scan(&w.config.data_dir);
    assert!(
        leftovers.plan_files.is_empty(),
        "{:?}",
        leftovers.plan_files
    );
    assert!(
        !leftovers.secret_seen,
        "a secret was written to the data dir"
    );
}

struct Scan {
    plan_files: Vec<std::path::PathBuf>,
    secret_seen: bool,
}

/// Walk the data dir: plan files anywhere, and the canary in any file (the SQLite file included).
fn scan(dir: &std::path::Path) -> Scan {
    let mut out = Scan {
        plan_files: Vec::new(),
        secret_seen: false,
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                // Provider plug-ins and git objects are not ours to scan.
                if !p.ends_with("plugin-cache") && !p.ends_with("objects") {
                    stack.push(p);
                }
                continue;
            }
            if p.file_name()
                .is_some_and(|n| n == "plan" || n.to_string_lossy().ends_with(".tfplan"))
            {
                out.plan_files.push(p.clone());
            }
            if let Ok(bytes) = std::fs::read(&p) {
                if bytes
                    .windows(b"apply-canary-password-7f3a".len())
                    .any(|w| w == b"apply-canary-password-7f3a")
                {
                    out.secret_seen = true;
                    eprintln!("canary found in {}", p.display());
                }
            }
        }
    }
    out
}
