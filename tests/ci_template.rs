//! The CI template infra repos include: a manual job on the default branch whose script calls
//! planbot with the job token and passes only on planbot's success line. The script is run for
//! real with `sh` and `curl` against a stand-in planbot on loopback.

use axum::{extract::State, http::HeaderMap, routing::post, Router};
use std::process::Command;
use std::sync::{Arc, Mutex};

const TEMPLATE: &str = include_str!("../templates/gitlab-ci/planbot.gitlab-ci.yml");

fn job() -> serde_yaml::Value {
    let doc: serde_yaml::Value = serde_yaml::from_str(TEMPLATE).expect("template is YAML");
    doc["planbot-apply"].clone()
}

#[test]
fn the_job_is_manual_and_only_on_the_default_branch() {
    let job = job();
    let rules = job["rules"].as_sequence().expect("rules");
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0]["if"].as_str(),
        Some("$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH")
    );
    assert_eq!(rules[0]["when"].as_str(), Some("manual"));
    assert_eq!(job["allow_failure"].as_bool(), Some(false));
    // No secret in the template: it only uses the job's own token and the public URL.
    assert!(TEMPLATE.contains("JOB-TOKEN: $CI_JOB_TOKEN"));
    assert!(!TEMPLATE.to_lowercase().contains("proxmox_ve_api_token"));
}

#[derive(Default)]
struct Seen {
    token: Option<String>,
    body: Option<String>,
}

/// A stand-in for planbot's apply endpoint that answers with a fixed log.
async fn stand_in(log: &'static str) -> (String, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let app =
        Router::new()
            .route(
                "/api/v1/apply",
                post(
                    move |State(seen): State<Arc<Mutex<Seen>>>,
                          headers: HeaderMap,
                          body: String| async move {
                        let mut s = seen.lock().unwrap();
                        s.token = headers
                            .get("job-token")
                            .map(|v| v.to_str().unwrap().to_string());
                        s.body = Some(body);
                        log
                    },
                ),
            )
            .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

/// Run a job command off the runtime (the stand-in serves on it): did it pass, and its stdout.
async fn run_job_command(cmd: Command) -> (bool, String) {
    let (ok, stdout, _) = run_job_command_err(cmd).await;
    (ok, stdout)
}

/// [`run_job_command`] with stderr too.
async fn run_job_command_err(mut cmd: Command) -> (bool, String, String) {
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Run the job's script the way a runner would: `sh -c` with the CI variables set.
async fn run_script(url: &str, confirm: Option<&str>) -> (bool, String) {
    let (ok, stdout, _) = run_script_err(url, confirm).await;
    (ok, stdout)
}

/// [`run_script`] with stderr too. The script needs `curl`: without it the test fails here
/// (a job that fails for want of curl proves nothing about the script).
async fn run_script_err(url: &str, confirm: Option<&str>) -> (bool, String, String) {
    let curl = Command::new("curl").arg("--version").output();
    assert!(
        curl.is_ok_and(|o| o.status.success()),
        "these tests run the job script, which needs curl on PATH"
    );
    let script = job()["script"][0].as_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(script)
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("PLANBOT_URL", url)
        .env("CI_JOB_TOKEN", "glcbt-test-job-token");
    if let Some(c) = confirm {
        cmd.env("PLANBOT_CONFIRM", c);
    }
    run_job_command_err(cmd).await
}

#[tokio::test]
async fn the_job_passes_on_planbots_success_line_and_prints_the_log() {
    let (url, seen) = stand_in(
        "planbot: verifying job 8\nterraform_data.vm: Creating...\nplanbot: still working (30 s)\nplanbot: apply succeeded\n",
    )
    .await;
    let (ok, stdout) = run_script(&url, None).await;
    assert!(ok, "{stdout}");
    assert!(
        stdout.contains("terraform_data.vm: Creating..."),
        "{stdout}"
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.token.as_deref(), Some("glcbt-test-job-token"));
    assert_eq!(seen.body.as_deref(), Some("{}"));
}

#[tokio::test]
async fn the_job_fails_on_a_refusal() {
    let (url, _) = stand_in(
        "planbot: apply refused: the plan of root `core` is not the plan reviewed on the merge request\n",
    )
    .await;
    let (ok, stdout) = run_script(&url, None).await;
    assert!(!ok);
    assert!(stdout.contains("apply refused"), "{stdout}");
}

#[tokio::test]
async fn the_job_fails_when_the_stream_is_cut() {
    let (url, seen) = stand_in("planbot: verifying job 8\nplanbot: still working (30 s)\n").await;
    let (ok, stdout) = run_script(&url, None).await;
    assert!(!ok);
    // It did reach planbot and print the log: it failed on the missing success line.
    assert!(stdout.contains("planbot: verifying job 8"), "{stdout}");
    assert_eq!(
        seen.lock().unwrap().token.as_deref(),
        Some("glcbt-test-job-token")
    );
}

#[tokio::test]
async fn a_confirm_value_reaches_planbot_and_a_bad_one_never_leaves_the_job() {
    let (url, seen) = stand_in("planbot: apply succeeded\n").await;
    let (ok, _) = run_script(&url, Some("9c41e07a2b3d")).await;
    assert!(ok);
    assert_eq!(
        seen.lock().unwrap().body.as_deref(),
        Some(r#"{"confirm": "9c41e07a2b3d"}"#)
    );

    let (url, seen) = stand_in("planbot: apply succeeded\n").await;
    let (ok, stdout) = run_script(&url, Some("\"}, \"roots\": [\"x")).await;
    assert!(!ok);
    assert!(stdout.contains("must be hexadecimal"), "{stdout}");
    assert!(seen.lock().unwrap().body.is_none(), "nothing was sent");
}

#[tokio::test]
async fn the_job_fails_when_planbot_is_unreachable() {
    let (ok, stdout, stderr) = run_script_err("http://127.0.0.1:9", None).await;
    assert!(!ok);
    // curl itself said why (exit 7: could not connect), and no success line was printed.
    assert!(stderr.contains("curl: (7)"), "{stderr}");
    assert!(!stdout.contains("apply succeeded"), "{stdout}");
}

/// `planbot apply-job`, the alternative to the curl script, behaves the same.
async fn run_apply_job(url: &str, confirm: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_planbot"));
    cmd.arg("apply-job")
        .env_clear()
        .env("PLANBOT_URL", url)
        .env("CI_JOB_TOKEN", "glcbt-test-job-token");
    if let Some(c) = confirm {
        cmd.env("PLANBOT_CONFIRM", c);
    }
    run_job_command(cmd).await
}

#[tokio::test]
async fn planbot_apply_job_streams_the_log_and_exits_by_the_last_line() {
    let (url, seen) = stand_in(
        "terraform_data.vm: Creating...\nplanbot: apply succeeded\nplanbot: still working (1 s)\n",
    )
    .await;
    let (ok, stdout) = run_apply_job(&url, Some("9c41e07a2b3d")).await;
    assert!(ok, "{stdout}");
    assert!(stdout.contains("terraform_data.vm: Creating..."));
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.token.as_deref(), Some("glcbt-test-job-token"));
        assert_eq!(seen.body.as_deref(), Some(r#"{"confirm":"9c41e07a2b3d"}"#));
    }

    let (url, _) = stand_in("planbot: apply refused: the job is `success`, not `running`\n").await;
    let (ok, stdout) = run_apply_job(&url, None).await;
    assert!(!ok);
    assert!(stdout.contains("apply refused"));
}
