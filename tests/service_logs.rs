//! The log `planbot serve` writes when run by systemd, a container runtime or a shell redirect:
//! plain text without ANSI colour codes, or one JSON object per line with `log_format = "json"`.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A config for a planbot that starts and serves; GitLab is a closed port (it only logs that).
fn config(dir: &std::path::Path, port: u16, extra: &str) -> std::path::PathBuf {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = format!(
        r#"{extra}
listen = "127.0.0.1:{port}"
data_dir = "{data}"
fingerprint_key = "fingerprint-key-0123456789abcdef"

[gitlab]
url = "http://127.0.0.1:{closed}"
token = "glpat-log-test-token"
webhook_secret = "webhook-secret-log-test"
projects = ["infra/homelab"]

[engine]
binary = "{engine}"

[sandbox]
required = false
"#,
        data = dir.join("data").display(),
        engine = support::engine().display(),
    );
    let path = dir.join("planbot.toml");
    std::fs::write(&path, text).unwrap();
    path
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
