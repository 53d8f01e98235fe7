//! The log `planbot serve` writes when run by systemd, a container runtime or a shell redirect:
//! plain text without ANSI colour codes, or one JSON object per line with `log_format = "json"`;
//! at `info` it tells the story of every webhook, job, plan, note, status and apply, with ids.

use crate::support::world::PlanbotConfig;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A config for a planbot that starts and serves, `extra` top-level keys (e.g. `log_level`);
/// GitLab is a closed port (it only logs that).
fn config(dir: &std::path::Path, port: u16, extra: &str) -> std::path::PathBuf {
    let closed = free_port();
    PlanbotConfig::for_gitlab(
        &format!("http://127.0.0.1:{closed}"),
        "glpat-log-test-token",
    )
    .set(
        "",
        "fingerprint_key",
        "\"fingerprint-key-0123456789abcdef\"",
    )
    .set("gitlab", "webhook_secret", "\"webhook-secret-log-test\"")
    .set("", "listen", &format!("\"127.0.0.1:{port}\""))
    .set(
        "",
        "data_dir",
        &format!("\"{}\"", dir.join("data").display()),
    )
    .lines("", extra)
    .set(
        "engine",
        "binary",
        &format!("\"{}\"", crate::support::engine().display()),
    )
    .set("sandbox", "required", "false")
    .write(dir)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start `planbot serve` with stderr on a pipe (not a terminal), collect its stderr until a
/// line contains `wait_for` (or, when it is empty, until the port answers), then stop it.
fn serve_log(config: &std::path::Path, env: &[(&str, &str)], port: u16, wait_for: &str) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_planbot"));
    cmd.args(["serve", "--config"])
        .arg(config)
        .env_remove("RUST_LOG")
        .env_remove("PLANBOT_LOG_FORMAT")
        .env_remove("PLANBOT_LOG_LEVEL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child: Child = cmd.spawn().unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            Instant::now() < deadline,
            "planbot serve did not log {wait_for:?} in time:\n{}",
            lines.join("\n")
        );
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            let found = !wait_for.is_empty() && line.contains(wait_for);
            lines.push(line);
            if found {
                break;
            }
        }
        if wait_for.is_empty() && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
    }
    // Stop it as an operator would (SIGTERM) and read stderr to its end: every line it wrote
    // before exiting is in `lines`, with no guess at how long logging takes.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    lines.extend(rx.iter());
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(
        stdout.is_empty(),
        "the log goes to stderr, not stdout: {stdout}"
    );
    lines.join("\n")
}

#[test]
fn the_log_is_plain_text_without_colour_codes_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), port, "");
    let log = serve_log(&cfg, &[], port, "planbot is serving");
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escape codes in the log:\n{log:?}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("planbot is serving"))
        .unwrap();
    assert!(
        line.contains(" INFO ") && line.contains(&format!("port={port}")),
        "{line}"
    );
    assert!(!log.contains("glpat-log-test-token"), "{log}");
}

#[test]
fn log_format_json_writes_one_object_per_line_from_the_file_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, env) in [
        ("log_format = \"json\"", vec![]),
        ("", vec![("PLANBOT_LOG_FORMAT", "json")]),
    ] {
        let port = free_port();
        let cfg = config(dir.path(), port, extra);
        let log = serve_log(&cfg, &env, port, "planbot is serving");
        assert!(!log.trim().is_empty());
        let mut serving = None;
        for line in log.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            assert!(
                v["timestamp"].is_string() && v["level"].is_string(),
                "{line}"
            );
            if v["message"] == "planbot is serving" {
                serving = Some(v);
            }
        }
        let serving = serving.unwrap_or_else(|| panic!("no start line in:\n{log}"));
        assert_eq!(serving["level"], "INFO");
        assert_eq!(serving["port"], port);
    }
}

#[test]
fn log_level_sets_what_is_logged_and_rust_log_wins() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), port, "log_level = \"warn\"");
    let log = serve_log(&cfg, &[], port, "");
    assert!(
        !log.contains("planbot is serving") && !log.contains(" INFO "),
        "info lines with log_level = \"warn\":\n{log}"
    );
    let port = free_port();
    let cfg = config(dir.path(), port, "log_level = \"warn\"");
    let log = serve_log(&cfg, &[("RUST_LOG", "info")], port, "planbot is serving");
    assert!(log.contains("planbot is serving"), "{log}");
}

// ---------------------------------------------------------------------------------------------
// The story at info level: what an operator reads in `journalctl -u planbot`.

use crate::support::fake_gitlab::{FakeGitLab, DEVELOPER};

const MAIN_TF: &str = "resource \"terraform_data\" \"vm\" {\n  input = \"blocky\"\n}\n";

/// What a story run leaves: the whole log, `/metrics` after it, and the ids to look for.
struct Told {
    log: Vec<String>,
    metrics: String,
    project: u64,
    /// The MRs whose plan succeeds, and the one whose engine run fails.
    good: [u64; 2],
    broken: u64,
}

/// Three MRs opened (one with a broken `main.tf`), then a Developer comments `planbot help`;
/// planbot runs as its own process with `log_format` as given and no `RUST_LOG`.
async fn three_plans_and_a_comment(log_format: &str) -> Told {
    let engine = require_engine!();
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(&project, "main", &[("main.tf", MAIN_TF)]);
    fake.commit_files(
        &project,
        "feature/a",
        &[("main.tf", &MAIN_TF.replace("blocky", "a"))],
    );
    fake.commit_files(
        &project,
        "feature/b",
        &[("b.tf", "resource \"terraform_data\" \"b\" {}\n")],
    );
    fake.commit_files(
        &project,
        "feature/broken",
        &[(
            "main.tf",
            "resource \"terraform_data\" \"vm\" {\n  input = var.missing\n}\n",
        )],
    );
    let a = fake.open_mr(&project, "feature/a", "main");
    let b = fake.open_mr(&project, "feature/b", "main");
    let broken = fake.open_mr(&project, "feature/broken", "main");
    let dev = fake.create_user("dev");
    fake.add_member(&project, &dev, DEVELOPER);

    let dir = tempfile::tempdir().unwrap();
    let config = PlanbotConfig::serving(fake.url(), fake.bot_token(), &dir.path().join("data"))
        .set(
            "",
            "fingerprint_key",
            "\"fingerprint-key-0123456789abcdef\"",
        )
        .set("", "log_format", &format!("\"{log_format}\""))
        .set("gitlab", "webhook_secret", "\"webhook-secret-log-test\"")
        .set("engine", "binary", &format!("\"{}\"", engine.display()))
        .metrics()
        .managed_state(&fake, &project)
        .write(dir.path());
    let serve = crate::support::ServeProcess::start(&config, &[]);
    let http = reqwest::Client::new();
    let deliver = |event: &'static str, key: String, body: Vec<u8>| {
        let req = http
            .post(serve.url("/webhooks/gitlab"))
            .header("X-Gitlab-Event", event)
            .header("X-Gitlab-Token", "webhook-secret-log-test")
            .header("Idempotency-Key", key)
            .header("content-type", "application/json")
            .body(body);
        async move { assert_eq!(req.send().await.unwrap().status(), 200) }
    };
    for iid in [a, b, broken] {
        deliver(
            "Merge Request Hook",
            format!("open-{iid}"),
            fake.merge_request_hook(&project, iid, "open").into_bytes(),
        )
        .await;
    }
    let final_status = |iid: u64| {
        let sha = fake.mr_sha(&project, iid);
        fake.statuses(&project, &sha)
            .iter()
            .any(|s| s.name == "planbot/plan" && (s.state == "success" || s.state == "failed"))
    };
    crate::support::eventually("three plans with their final status", 180, || {
        let done = [a, b, broken].iter().all(|iid| final_status(*iid));
        async move { done }
    })
    .await;
    let hook = fake.note_webhook(&project, a, &dev, "planbot help");
    deliver(
        "Note Hook",
        "note-help".into(),
        hook.to_string().into_bytes(),
    )
    .await;
    crate::support::eventually("the help note", 60, || {
        let answered = fake
            .notes(&project, a)
            .iter()
            .any(|n| n.body.contains("<!-- planbot:help -->"));
        async move { answered }
    })
    .await;
    // The worker records each job's end (and logs it) just after the flow's last word.
    let log_of = |serve: &crate::support::ServeProcess| serve.log().join("\n");
    crate::support::eventually("every job's end in the log", 30, || {
        let ended = log_of(&serve).matches("job finished").count() >= 4;
        async move { ended }
    })
    .await;
    let metrics = http
        .get(serve.url("/metrics"))
        .bearer_auth(crate::support::service::METRICS_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    Told {
        log: serve.stop(),
        metrics,
        project: project.id,
        good: [a, b],
        broken,
    }
}

/// One log line as level, message and fields, from the text format (`... INFO target: message
/// k=v k="v"`) or the JSON one.
#[derive(Debug)]
struct Event {
    level: String,
    message: String,
    line: String,
    json: Option<serde_json::Value>,
}

impl Event {
    fn parse(line: &str) -> Event {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            return Event {
                level: v["level"].as_str().unwrap_or_default().to_string(),
                message: v["message"].as_str().unwrap_or_default().to_string(),
                line: line.to_string(),
                json: Some(v),
            };
        }
        let level = ["ERROR", "WARN", "INFO", "DEBUG"]
            .into_iter()
            .find(|l| line.contains(&format!(" {l} ")))
            .unwrap_or_default();
        Event {
            level: level.to_string(),
            message: line.to_string(),
            line: line.to_string(),
            json: None,
        }
    }

    /// Whether the event has field `k` with value `v` (text: `k=v` or `k="v"`).
    fn has(&self, k: &str, v: &serde_json::Value) -> bool {
        match &self.json {
            Some(j) => &j[k] == v || j[k].as_str() == Some(&v.to_string()),
            None => {
                let plain = v
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string());
                self.line.contains(&format!(" {k}={plain}"))
                    || self.line.contains(&format!(" {k}=\"{plain}\""))
            }
        }
    }

    fn is(&self, message: &str) -> bool {
        match &self.json {
            Some(_) => self.message == message,
            None => self.message.contains(&format!(": {message}")),
        }
    }
}

/// The events with `message` and every field of `fields`; panics with the log when none is.
fn find<'a>(
    events: &'a [Event],
    level: &str,
    message: &str,
    fields: &[(&str, serde_json::Value)],
) -> &'a Event {
    events
        .iter()
        .find(|e| e.is(message) && fields.iter().all(|(k, v)| e.has(k, v)))
        .inspect(|e| assert_eq!(e.level, level, "{}", e.line))
        .unwrap_or_else(|| {
            panic!(
                "no {level} `{message}` with {fields:?} in the log:\n{}",
                events
                    .iter()
                    .map(|e| e.line.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })
}

/// Fields an event must have, by name.
type Fields<'a> = Vec<(&'a str, serde_json::Value)>;

/// What the log must say about the story, whatever its format.
fn assert_the_story_is_told(told: &Told) {
    use serde_json::json;
    let events: Vec<Event> = told.log.iter().map(|l| Event::parse(l)).collect();
    let p = || ("project", json!(told.project));
    let mr = |iid: u64| ("mr", json!(iid));
    let plan = |s: &str| ("name", json!(s));
    let mut expected: Vec<(&str, &str, Fields)> = Vec::new();
    for iid in told.good.iter().chain([&told.broken]).copied() {
        let event = ("event", json!("merge_request"));
        expected.push(("INFO", "webhook accepted", vec![event, p(), mr(iid)]));
        expected.push((
            "INFO",
            "job started",
            vec![("kind", json!("plan")), p(), mr(iid)],
        ));
        expected.push(("INFO", "note posted", vec![p(), mr(iid)]));
    }
    for iid in told.good {
        let planned = ("outcome", json!("planned"));
        let root = ("root", json!("default"));
        expected.push(("INFO", "root planned", vec![p(), mr(iid), root, planned]));
        let succeeded = ("outcome", json!("succeeded"));
        expected.push(("INFO", "plan finished", vec![p(), mr(iid), succeeded]));
    }
    let (root, failed) = (("root", json!("default")), ("outcome", json!("failed")));
    let broken = told.broken;
    expected.push((
        "WARN",
        "root failed to plan",
        vec![p(), mr(broken), root, failed.clone()],
    ));
    expected.push(("INFO", "plan finished", vec![p(), mr(broken), failed]));
    for state in ["running", "failed", "success"] {
        let state = ("state", json!(state));
        expected.push((
            "INFO",
            "commit status set",
            vec![p(), plan("planbot/plan"), state],
        ));
    }
    // The comment: its delivery, its job, the answer.
    let (note, command) = (("event", json!("note")), ("kind", json!("command")));
    expected.push((
        "INFO",
        "webhook accepted",
        vec![note, p(), mr(told.good[0])],
    ));
    expected.push((
        "INFO",
        "job started",
        vec![command.clone(), mr(told.good[0])],
    ));
    expected.push((
        "INFO",
        "job finished",
        vec![command, ("state", json!("done"))],
    ));
    for (level, message, fields) in &expected {
        find(&events, level, message, fields);
    }
    assert_eq!(
        events
            .iter()
            .filter(|e| e.is("job finished") && e.has("kind", &json!("plan")))
            .count(),
        3,
        "one `job finished` per plan"
    );
    // Each plan's duration is there too.
    let finished = find(
        &events,
        "INFO",
        "plan finished",
        &[("outcome", json!("succeeded"))],
    );
    assert!(finished.line.contains("duration_ms"), "{}", finished.line);
    assert!(!told.log.join("\n").contains("webhook-secret-log-test"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_info_log_tells_the_story_of_webhooks_jobs_plans_notes_and_statuses() {
    let told = three_plans_and_a_comment("text").await;
    assert!(
        told.log.iter().all(|l| !l.starts_with('{')),
        "text, not JSON"
    );
    assert_the_story_is_told(&told);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_log_has_the_same_fields_and_metrics_count_each_plan_once() {
    let told = three_plans_and_a_comment("json").await;
    for line in &told.log {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
    }
    assert_the_story_is_told(&told);
    // Three plans: counted three times, in one vocabulary (two succeeded, one failed).
    let count = |outcome: &str| -> u64 {
        told.metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "planbot_plan_duration_seconds_count{{outcome=\"{outcome}\"}} "
                ))
            })
            .map(|n| n.trim().parse().unwrap())
            .unwrap_or(0)
    };
    let total: u64 = told
        .metrics
        .lines()
        .filter(|l| l.starts_with("planbot_plan_duration_seconds_count{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(
        (total, count("succeeded"), count("failed")),
        (3, 2, 1),
        "{}",
        told.metrics
    );
}
