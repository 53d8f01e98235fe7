//! Helpers shared by the integration tests: the world builder (`world`), the fakes (GitLab,
//! Proxmox, engines, PostgreSQL), the running service, the engine to test with, the docs' recipes.
#![allow(dead_code)]

pub mod fake_proxmox;
pub mod postgres;
pub mod throwaway_postgres;

use std::path::{Path, PathBuf};

/// The engine binary for tests: `PLANBOT_TEST_ENGINE`, else `tofu`, else `terraform` on PATH.
///
/// Without one the calling test **fails** (it never passes without running): install OpenTofu
/// or Terraform, or point `PLANBOT_TEST_ENGINE` at one.
pub fn engine() -> PathBuf {
    if let Some(p) = std::env::var_os("PLANBOT_TEST_ENGINE") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "PLANBOT_TEST_ENGINE={} is not a file: this engine test cannot run",
            p.display()
        );
        return p;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["tofu", "terraform"] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "no tofu or terraform on PATH and PLANBOT_TEST_ENGINE is not set: this engine test \
         cannot run (install OpenTofu or Terraform, or set PLANBOT_TEST_ENGINE)"
    );
}

/// The engine binary of an engine test; the test fails when there is none (see [`engine`]).
#[macro_export]
macro_rules! require_engine {
    () => {
        $crate::support::engine()
    };
}

/// A GitLab fixture file from `tests/fixtures/gitlab/` (copied from GitLab's docs, see its
/// README), e.g. `gitlab_fixture("webhooks/merge_request_open.json")`.
pub fn gitlab_fixture(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gitlab")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

pub mod fake_engine;
pub mod fake_gitlab;
pub mod fixtures;
pub mod gate;
pub mod gitlab_reading;
pub mod service;
pub mod tf_root;
pub mod world;

/// Wait until `f` holds (checked every 25 ms), or panic after `secs` saying what never happened.
pub async fn eventually<F, Fut>(what: &str, secs: u64, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// The infra repo's root used by the apply stories: `vms` as `terraform_data` "VMs", a
/// sensitive canary password, and GitLab-managed state (the `http` backend), as a real project.
pub fn infra_main_tf(vms: &[&str]) -> String {
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

/// Processes whose working directory lies under `dir`: the engine a SIGKILLed planbot left
/// behind, which a crash test must stop itself (nothing else would).
pub fn processes_under(dir: &std::path::Path) -> Vec<i32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if std::fs::read_link(e.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir)) {
            pids.push(pid);
        }
    }
    pids
}

/// `planbot serve --config FILE` as its own process (so a test can SIGKILL it), its config
/// listening on port 0; returns the child and the port planbot says it bound ("planbot is
/// serving" in its log) — no port is guessed and rebound.
pub fn spawn_serve(config_file: &std::path::Path) -> (std::process::Child, u16) {
    let serve = ServeProcess::start(
        config_file,
        &[("RUST_LOG", "warn,planbot::flows::service::server=info")],
    );
    serve.into_child()
}

/// What a `planbot serve` process logged on stderr so far, one entry per line.
pub type ServeLog = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// A running `planbot serve` process and everything it logged on stderr so far (read by a
/// thread, so planbot never blocks on a full pipe).
pub struct ServeProcess {
    child: Option<std::process::Child>,
    pub port: u16,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl ServeProcess {
    /// Start it with `env` on top of this process's environment less every variable that
    /// changes the log (`RUST_LOG`, `PLANBOT_LOG_*`), and wait until it says it serves.
    pub fn start(config_file: &std::path::Path, env: &[(&str, &str)]) -> ServeProcess {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_planbot"));
        cmd.args(["serve", "--config"]).arg(config_file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        ServeProcess::spawn(cmd)
    }

    /// Run `cmd` (which ends up running `planbot serve`, e.g. a shell recipe) the same way.
    pub fn spawn(mut cmd: std::process::Command) -> ServeProcess {
        use std::io::BufRead;
        for var in ["RUST_LOG", "PLANBOT_LOG_FORMAT", "PLANBOT_LOG_LEVEL"] {
            if !cmd.get_envs().any(|(k, _)| k == var) {
                cmd.env_remove(var);
            }
        }
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let lines = log.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line.clone());
                lines.lock().unwrap().push(line);
            }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let port = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                let _ = child.kill();
                panic!(
                    "planbot serve did not say it serves within 60 s:\n{}",
                    log.lock().unwrap().join("\n")
                );
            };
            if let Some(port) = serving_port(&line) {
                break port;
            }
        };
        ServeProcess {
            child: Some(child),
            port,
            log,
            reader: Some(reader),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// What it logged so far, one entry per line.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The process, for a test that kills it itself (its log is still read, and dropped).
    pub fn into_child(self) -> (std::process::Child, u16) {
        let (child, port, _) = self.into_parts();
        (child, port)
    }

    /// The process, for a test that kills it itself, and its log as it is read.
    pub fn into_parts(mut self) -> (std::process::Child, u16, ServeLog) {
        (
            self.child.take().expect("running"),
            self.port,
            self.log.clone(),
        )
    }

    /// Stop it as an operator would (SIGTERM) and return its whole log, read to its end.
    pub fn stop(mut self) -> Vec<String> {
        if let Some(mut child) = self.child.take() {
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.log()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The port of planbot's "planbot is serving" line, in text (`port=40123`) or JSON.
fn serving_port(line: &str) -> Option<u16> {
    let plain = strip_ansi(line);
    if !plain.contains("planbot is serving") {
        return None;
    }
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&plain) {
        return v["port"].as_u64().and_then(|p| u16::try_from(p).ok());
    }
    plain
        .split("port=")
        .nth(1)
        .and_then(|p| p.split_whitespace().next())
        .and_then(|p| p.parse().ok())
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The fenced code block of `page` (the README, or a page under `docs/`) that holds `line` (a
/// line of its own), without fences: the recipe as a user copies it.
pub fn doc_block(page: &str, line: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {page}: {e}"));
    let mut blocks = text.split("\n```").skip(1).step_by(2);
    blocks
        .find(|b| b.lines().any(|l| l == line))
        .map(|b| {
            b.split_once('\n')
                .map(|(_, body)| body.to_string())
                .unwrap_or_default()
        })
        .unwrap_or_else(|| panic!("no code block in {page} with the line `{line}`"))
}

/// Every page a reader opens, as (path from the repository top, text): the README, then each
/// Markdown file under `docs/` in name order.
pub fn doc_pages() -> Vec<(String, String)> {
    let top = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> = std::fs::read_dir(top.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    names.sort();
    names.insert(0, "README.md".to_string());
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(top.join(&n)).unwrap();
            (n, text)
        })
        .collect()
}

/// `bash -euo pipefail -c SCRIPT` in `dir` — a recipe of the docs as a user runs it — with the
/// planbot just built first on `PATH`, as `planbot`.
pub fn recipe_command(dir: &std::path::Path, script: &str) -> std::process::Command {
    let bin = dir.join(".bin");
    std::fs::create_dir_all(&bin).unwrap();
    if !bin.join("planbot").exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_planbot"), bin.join("planbot")).unwrap();
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = std::process::Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path);
    cmd
}

/// Run a recipe of the docs (see [`recipe_command`]) to its end; `stdin` answers its prompt
/// (`cat > ...`). Panics with the recipe and its output when it fails.
pub fn run_recipe(dir: &std::path::Path, recipe: &str, stdin: &str) -> String {
    use std::io::Write;
    let mut child = recipe_command(dir, recipe)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the recipe failed ({}):\n{recipe}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Run a recipe of the docs to its end with a terminal as its standard input, on which each of
/// `pastes` is typed in turn, each followed by Enter and Ctrl-D: what a reader does at each
/// `cat > FILE   # paste ..., then Ctrl-D` line (one paste per such line, in order). Echo is
/// off, as for a password prompt. Panics with the recipe and its output when it fails.
pub fn run_recipe_pasting(dir: &std::path::Path, recipe: &str, pastes: &[&str]) -> String {
    use std::io::Write;
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, slave) = unsafe {
        let (mut m, mut s) = (0, 0);
        assert_eq!(
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null()
            ),
            0,
            "openpty: {}",
            std::io::Error::last_os_error()
        );
        let mut t: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(s, &mut t), 0);
        t.c_lflag &= !(libc::ECHO | libc::ECHONL);
        assert_eq!(libc::tcsetattr(s, libc::TCSANOW, &t), 0);
        (std::fs::File::from_raw_fd(m), OwnedFd::from_raw_fd(s))
    };
    for paste in pastes {
        // Canonical mode: the line ends at Enter; Ctrl-D on an empty line is `cat`'s EOF.
        master
            .write_all(format!("{}\n\x04", paste.trim_end()).as_bytes())
            .unwrap();
    }
    let out = recipe_command(dir, recipe)
        .stdin(std::process::Stdio::from(slave))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    drop(master);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the recipe failed ({}):\n{recipe}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A root whose one value, `terraform_data.vm`'s input, is 10 × 2²² bytes (about 40 MB), built
/// by doubling so that the engine plans it in seconds; `show -json` prints it twice.
pub fn forty_mb_value_tf() -> String {
    let mut tf = String::from("locals {\n  v0 = \"0123456789\"\n");
    for i in 1..=22 {
        let prev = i - 1;
        tf.push_str(&format!(
            "  v{i} = \"${{local.v{prev}}}${{local.v{prev}}}\"\n"
        ));
    }
    tf.push_str("}\nresource \"terraform_data\" \"vm\" {\n  input = local.v22\n}\n");
    tf
}

/// The variable that tells a re-run of this test binary which one test it runs alone.
const ALONE: &str = "PLANBOT_TEST_ALONE";

/// Run the calling test alone in a process of its own: for the few tests that need the whole
/// process (its environment, its peak memory), which one binary of many threads cannot give.
///
/// Called first in the test with the test's own name (`module::test`): in the test binary it
/// runs itself again as a child, with `env` added to the environment, for that test only, and
/// fails if the child fails; it returns `true` only inside that child, where the test's body
/// then runs.
pub fn alone_in_a_process(test: &str, env: &[(&str, &str)]) -> bool {
    if std::env::var(ALONE).is_ok_and(|t| t == test) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ALONE, test)
        .envs(env.iter().copied())
        .output()
        .expect("the test binary runs again");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test}, alone in its own process, failed:\n{stdout}\n{stderr}"
    );
    false
}

/// Run the engine with `args` in `dir` as planbot runs it (no input, no colour; `env` added),
/// its output dropped: the benchmarks' bare engine. Panics with its stderr when it fails.
pub fn run_engine<K, V>(
    engine: &Path,
    dir: &Path,
    env: impl IntoIterator<Item = (K, V)>,
    args: &[&str],
) where
    K: AsRef<std::ffi::OsStr>,
    V: AsRef<std::ffi::OsStr>,
{
    let out = std::process::Command::new(engine)
        .args(args)
        .current_dir(dir)
        .envs(env)
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_INPUT", "0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Wait (polling the fake every 5 ms, at most `secs`) until `sha`'s `planbot/plan` is green;
/// panics when it fails.
pub async fn plan_turns_green(
    gitlab: &fake_gitlab::FakeGitLab,
    project: &fake_gitlab::FakeProject,
    sha: &str,
    secs: u64,
) {
    eventually(&format!("the plan of {sha}"), secs, || async {
        match gitlab.status(project, sha, "planbot/plan").map(|s| s.state) {
            Some(s) if s == "success" => true,
            Some(s) if s == "failed" => panic!("the plan of {sha} failed"),
            _ => false,
        }
    })
    .await;
}
