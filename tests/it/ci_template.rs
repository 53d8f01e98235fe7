//! The CI/CD component infra repos include: a manual job on the default branch whose script
//! calls planbot with the job token and passes only on planbot's success line. Its inputs are
//! interpolated as GitLab does, the result is checked against GitLab's CI schema, and the
//! script is run for real with `sh` and `curl` against a stand-in planbot on loopback, as is
//! `planbot apply-job`, which takes the same variables.

use axum::{extract::State, http::HeaderMap, routing::post, Router};
use std::process::Command;
use std::sync::{Arc, Mutex};

pub(crate) const TEMPLATE: &str = include_str!("../../templates/planbot-apply.yml");

/// The component's `spec:` header and its body.
fn parts(template: &str) -> (serde_yaml::Value, &str) {
    let (head, body) = template
        .split_once("\n---\n")
        .expect("a component: `spec:`, then `---`, then the jobs");
    (serde_yaml::from_str(head).expect("the spec is YAML"), body)
}

/// What GitLab makes of the component with `inputs`: every `$[[ inputs.NAME ]]` replaced by the
/// given value or the input's default; a missing required input or an unknown one is an error.
pub(crate) fn interpolate(template: &str, inputs: &[(&str, &str)]) -> Result<String, String> {
    let (spec, body) = parts(template);
    let declared = spec["spec"]["inputs"].as_mapping().expect("spec: inputs:");
    for (name, _) in inputs {
        if !declared.contains_key(*name) {
            return Err(format!("unknown input {name}"));
        }
    }
    let mut out = body.to_string();
    for (name, decl) in declared {
        let name = name.as_str().unwrap();
        let value = match inputs.iter().find(|(n, _)| *n == name) {
            Some((_, v)) => v.to_string(),
            None => match &decl["default"] {
                serde_yaml::Value::String(d) => d.clone(),
                _ => return Err(format!("required input {name} not given")),
            },
        };
        // GitLab refuses a value that is not one of the input's `options`.
        if let Some(options) = decl["options"].as_sequence() {
            if !options.iter().any(|o| o.as_str() == Some(value.as_str())) {
                return Err(format!("input {name}: `{value}` is not one of {options:?}"));
            }
        }
        out = out.replace(&format!("$[[ inputs.{name} ]]"), &value);
    }
    assert!(
        !out.contains("$[["),
        "an input the spec does not declare:\n{out}"
    );
    Ok(out)
}

fn jobs(inputs: &[(&str, &str)]) -> serde_yaml::Value {
    serde_yaml::from_str(&interpolate(TEMPLATE, inputs).unwrap()).expect("the jobs are YAML")
}

fn job() -> serde_yaml::Value {
    jobs(&[("planbot_url", "https://planbot.example.com")])["planbot-apply"].clone()
}

#[test]
fn the_job_is_manual_and_only_on_the_default_branch() {
    let job = job();
    let rules = job["rules"].as_sequence().expect("rules");
    assert_eq!(rules.len(), 2);
    // GitLab's rule for deploy freezes first: a pipeline made during one has no apply job
    // (`during_freeze: manual` keeps it to click; planbot refuses it while the freeze holds).
    assert_eq!(
        rules[0]["if"].as_str(),
        Some("$CI_DEPLOY_FREEZE && $CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH")
    );
    assert_eq!(rules[0]["when"].as_str(), Some("never"));
    let kept = jobs(&[
        ("planbot_url", "https://planbot.example.com"),
        ("during_freeze", "manual"),
    ])["planbot-apply"]["rules"][0]["when"]
        .clone();
    assert_eq!(kept.as_str(), Some("manual"));
    assert_eq!(
        rules[1]["if"].as_str(),
        Some("$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH")
    );
    assert_eq!(rules[1]["when"].as_str(), Some("manual"));
    // A manual job that may not fail leaves every pipeline of the default branch "blocked"
    // until someone applies (GitLab's rule for `when: manual` with `allow_failure: false`).
    assert_eq!(
        job["allow_failure"].as_bool(),
        Some(true),
        "the manual apply job must not block the default branch's pipelines"
    );
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

#[test]
fn the_inputs_set_the_stage_the_job_name_the_image_and_the_url() {
    // Defaults: stage deploy, job planbot-apply, the curl image; the URL has no default.
    assert!(interpolate(TEMPLATE, &[])
        .unwrap_err()
        .contains("planbot_url"));
    let j = job();
    assert_eq!(j["stage"].as_str(), Some("deploy"));
    assert_eq!(
        j["image"].as_str(),
        Some("docker.io/curlimages/curl:8.11.1")
    );
    assert_eq!(
        j["variables"]["PLANBOT_URL"].as_str(),
        Some("https://planbot.example.com")
    );
    let custom = jobs(&[
        ("planbot_url", "https://pb.corp.test"),
        ("stage", "apply"),
        ("job_name", "infra-apply"),
        ("image", "registry.corp.test/planbot:1.2"),
    ]);
    let j = &custom["infra-apply"];
    assert_eq!(j["stage"].as_str(), Some("apply"));
    assert_eq!(j["image"].as_str(), Some("registry.corp.test/planbot:1.2"));
    assert_eq!(
        j["variables"]["PLANBOT_URL"].as_str(),
        Some("https://pb.corp.test")
    );
    assert!(custom.get("planbot-apply").is_none());
    assert!(interpolate(TEMPLATE, &[("planbot_url", "x"), ("stages", "y")]).is_err());
}

#[test]
fn the_when_input_makes_the_apply_run_by_itself_after_the_merge_or_wait_for_someone() {
    // Manual by default: someone runs it.
    let manual = job();
    assert_eq!(manual["rules"][1]["when"].as_str(), Some("manual"));
    // `on_success`: the job runs by itself in the pipeline of the merge on the default branch,
    // and only there; everything else is the same job (the script that sends the job token and
    // PLANBOT_CONFIRM, the resource group, the timeout).
    let auto = jobs(&[
        ("planbot_url", "https://planbot.example.com"),
        ("when", "on_success"),
    ])["planbot-apply"]
        .clone();
    let rules = auto["rules"].as_sequence().expect("rules");
    assert_eq!(rules.len(), 2);
    assert_eq!(
        rules[0]["when"].as_str(),
        Some("never"),
        "not during a freeze"
    );
    assert_eq!(
        rules[1]["if"].as_str(),
        Some("$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH")
    );
    assert_eq!(rules[1]["when"].as_str(), Some("on_success"));
    let mut same = auto.clone();
    same["rules"] = manual["rules"].clone();
    assert_eq!(same, manual, "only the rule's `when` differs");
    // Anything else is refused when the pipeline is created, as GitLab does with `options`.
    for bad in ["always", "delayed", "never", "on_failure", ""] {
        assert!(
            interpolate(
                TEMPLATE,
                &[("planbot_url", "https://x.test"), ("when", bad)]
            )
            .is_err(),
            "{bad:?} accepted"
        );
    }
    // Served by planbot, the default stays manual.
    let served = planbot::core::ci_component::served_component(
        TEMPLATE,
        Some("https://planbot.corp.test"),
        "planbot-apply",
    );
    let served: serde_yaml::Value =
        serde_yaml::from_str(&interpolate(&served, &[]).unwrap()).unwrap();
    assert_eq!(
        served["planbot-apply"]["rules"][1]["when"].as_str(),
        Some("manual")
    );
}

#[test]
fn the_component_passes_gitlabs_ci_schema() {
    let checker = ["check-jsonschema"]
        .iter()
        .find_map(|n| {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|d| d.join(n))
                .find(|p| p.is_file())
        })
        .expect("check-jsonschema is not installed: run scripts/install-test-tools.sh (pip install check-jsonschema==0.39.0)");
    let dir = tempfile::tempdir().unwrap();
    let head = TEMPLATE.split_once("\n---\n").unwrap().0;
    std::fs::write(dir.path().join("spec.yml"), head).unwrap();
    let served = planbot::core::ci_component::served_component(
        TEMPLATE,
        Some("https://planbot.corp.test"),
        "infra-apply",
    );
    for (name, text) in [
        (
            "jobs.yml",
            interpolate(TEMPLATE, &[("planbot_url", "https://x.test")]).unwrap(),
        ),
        ("served.yml", interpolate(&served, &[]).unwrap()),
        (
            "on_success.yml",
            interpolate(&served, &[("when", "on_success")]).unwrap(),
        ),
        (
            "no_widgets.yml",
            interpolate(&served, &[("widgets", "never")]).unwrap(),
        ),
    ] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let out = Command::new(checker)
        .args(["--builtin-schema", "vendor.gitlab-ci"])
        .args(
            [
                "spec.yml",
                "jobs.yml",
                "served.yml",
                "on_success.yml",
                "no_widgets.yml",
            ]
            .map(|f| dir.path().join(f)),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Served by planbot, it needs no inputs: its URL and job name are the defaults.
    let served: serde_yaml::Value =
        serde_yaml::from_str(&interpolate(&served, &[]).unwrap()).unwrap();
    assert_eq!(
        served["infra-apply"]["variables"]["PLANBOT_URL"].as_str(),
        Some("https://planbot.corp.test")
    );
}

/// What a job command did: passed?, the request body planbot got (parsed), its first stdout line.
async fn outcome(
    cmd: Command,
    seen: &Arc<Mutex<Seen>>,
) -> (bool, Option<serde_json::Value>, String) {
    let (ok, stdout) = run_job_command(cmd).await;
    let body = seen
        .lock()
        .unwrap()
        .body
        .take()
        .map(|b| serde_json::from_str(&b).unwrap_or_else(|e| panic!("not JSON ({e}): {b}")));
    (
        ok,
        body,
        stdout.lines().next().unwrap_or_default().to_string(),
    )
}

fn job_env(cmd: &mut Command, url: &str, vars: &[(&str, &str)]) {
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("PLANBOT_URL", url)
        .env("CI_JOB_TOKEN", "glcbt-test-job-token");
    for (k, v) in vars {
        cmd.env(k, v);
    }
}

#[tokio::test]
async fn the_curl_script_and_planbot_apply_job_take_the_same_inputs() {
    let script = job()["script"][0].as_str().unwrap().to_string();
    let cases: &[&[(&str, &str)]] = &[
        &[],
        &[("PLANBOT_CONFIRM", "9c41e07a2b3d")],
        &[("PLANBOT_CONFIRM", " 9C41E07A \n")],
        &[("PLANBOT_ROOTS", "core")],
        &[("PLANBOT_ROOTS", "core, dns  edge_1.v2")],
        &[
            ("PLANBOT_CONFIRM", "5d0e13f7"),
            ("PLANBOT_ROOTS", "core,dns"),
        ],
        &[("PLANBOT_CONFIRM", "yes")],
        &[("PLANBOT_CONFIRM", "\"}, \"roots\": [\"x")],
        &[("PLANBOT_ROOTS", "core \"]}")],
        &[("PLANBOT_ROOTS", "*")],
    ];
    for vars in cases {
        let (url, seen) = stand_in("planbot: apply succeeded\n").await;
        let dir = tempfile::tempdir().unwrap();
        let mut sh = Command::new("sh");
        sh.arg("-c").arg(&script).current_dir(dir.path());
        job_env(&mut sh, &url, vars);
        let by_script = outcome(sh, &seen).await;
        let mut bin = Command::new(env!("CARGO_BIN_EXE_planbot"));
        bin.arg("apply-job");
        job_env(&mut bin, &url, vars);
        let by_binary = outcome(bin, &seen).await;
        assert_eq!(
            by_script, by_binary,
            "curl script vs planbot apply-job with {vars:?}"
        );
        // And what they agree on is right: a bad value never leaves the job.
        let (ok, body, first) = by_script;
        if vars
            .iter()
            .any(|(_, v)| v.contains('"') || *v == "yes" || *v == "*")
        {
            assert!(!ok && body.is_none(), "{vars:?} was sent: {body:?}");
            assert!(first.starts_with("planbot: PLANBOT_"), "{first}");
        } else {
            assert!(ok, "{vars:?}: {first}");
        }
    }
    // Spot checks of the body both sent.
    let (url, seen) = stand_in("planbot: apply succeeded\n").await;
    let mut bin = Command::new(env!("CARGO_BIN_EXE_planbot"));
    bin.arg("apply-job");
    job_env(
        &mut bin,
        &url,
        &[
            ("PLANBOT_CONFIRM", " 9C41E07A \n"),
            ("PLANBOT_ROOTS", "core, dns"),
        ],
    );
    let (_, body, _) = outcome(bin, &seen).await;
    assert_eq!(
        body,
        Some(serde_json::json!({"confirm": "9C41E07A", "roots": ["core", "dns"]}))
    );
}

#[tokio::test]
async fn with_planbots_image_the_job_runs_planbot_apply_job() {
    // An image that has planbot on PATH (and no curl needed).
    let bin_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_planbot"),
        bin_dir.path().join("planbot"),
    )
    .unwrap();
    let (url, seen) = stand_in("planbot: apply succeeded\n").await;
    let script = job()["script"][0].as_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let mut sh = Command::new("sh");
    sh.arg("-c").arg(&script).current_dir(dir.path());
    job_env(&mut sh, &url, &[("PLANBOT_ROOTS", "core")]);
    let path = format!(
        "{}:{}",
        bin_dir.path().display(),
        std::env::var("PATH").unwrap()
    );
    sh.env("PATH", path);
    let (ok, stdout) = run_job_command(sh).await;
    assert!(ok, "{stdout}");
    // serde_json's compact body, not the curl script's `{"roots": ["core"]}`.
    assert_eq!(
        seen.lock().unwrap().body.as_deref(),
        Some(r#"{"roots":["core"]}"#)
    );
    assert!(
        !dir.path().join("planbot-apply.log").exists(),
        "the curl branch ran"
    );
}

#[test]
fn the_widgets_job_runs_in_merge_request_pipelines_and_widgets_never_leaves_it_out() {
    let all = jobs(&[("planbot_url", "https://planbot.example.com")]);
    let w = &all["planbot-widgets"];
    // Only merge request pipelines: GitLab shows an MR's widgets from its pipeline's reports.
    let rules = w["rules"].as_sequence().expect("rules");
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0]["if"].as_str(),
        Some("$CI_PIPELINE_SOURCE == \"merge_request_event\"")
    );
    assert_eq!(rules[0]["when"].as_str(), Some("on_success"));
    assert_eq!(w["allow_failure"].as_bool(), Some(true));
    assert_eq!(w["needs"].as_sequence().map(|n| n.len()), Some(0));
    assert_eq!(w["stage"].as_str(), Some("test"));
    assert_eq!(
        w["image"].as_str(),
        Some("docker.io/curlimages/curl:8.11.1")
    );
    assert_eq!(
        w["artifacts"]["reports"]["terraform"].as_str(),
        Some("planbot-terraform.json")
    );
    assert_eq!(
        w["artifacts"]["reports"]["codequality"].as_str(),
        Some("planbot-codequality.json")
    );
    // The job token, and no secret.
    let script = w["script"][0].as_str().unwrap();
    assert!(script.contains("JOB-TOKEN: $CI_JOB_TOKEN"), "{script}");
    // Switched off: the rule says never, whatever the pipeline; the apply job is unchanged.
    let off = jobs(&[
        ("planbot_url", "https://planbot.example.com"),
        ("widgets", "never"),
        ("widgets_stage", "review"),
    ]);
    assert_eq!(
        off["planbot-widgets"]["rules"][0]["when"].as_str(),
        Some("never")
    );
    assert_eq!(off["planbot-widgets"]["stage"].as_str(), Some("review"));
    assert_eq!(off["planbot-apply"], all["planbot-apply"]);
    assert!(interpolate(
        TEMPLATE,
        &[("planbot_url", "https://x.test"), ("widgets", "false")]
    )
    .is_err());
}

/// A stand-in whose stream breaks off (planbot killed, a proxy cut) right after a line that
/// reads as the verdict: the chunked body never ends. Answers one request.
async fn cut_stand_in(last: &'static str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        // The request head and its small body.
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = sock.read(&mut buf).await.unwrap();
            if n == 0 {
                return;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        let chunk = format!("planbot: root `core`: applying\n{last}\n");
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n";
        let body = format!("{head}{:x}\r\n{chunk}\r\n", chunk.len());
        sock.write_all(body.as_bytes()).await.unwrap();
        sock.flush().await.unwrap();
        // No terminating chunk: the connection just ends.
        drop(sock);
    });
    url
}

#[tokio::test]
async fn a_stream_cut_after_a_line_that_reads_as_the_verdict_fails_the_job() {
    let url = cut_stand_in("planbot: apply succeeded").await;
    let (ok, stdout, stderr) = run_script_err(&url, None).await;
    assert!(
        !ok,
        "the curl script passed a cut stream: {stdout} {stderr}"
    );
    assert!(
        stdout.contains("broke off before its verdict"),
        "{stdout} {stderr}"
    );
    let url = cut_stand_in("planbot: apply succeeded").await;
    let (ok, stdout) = run_apply_job(&url, None).await;
    assert!(!ok, "planbot apply-job passed a cut stream: {stdout}");
}
