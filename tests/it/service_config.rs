//! `planbot serve --check` stories: the real binary reads the file, the environment and secret files.

use std::process::Command;

fn planbot() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_planbot"));
    // Only what the test sets: no PLANBOT_* from the developer's shell. `--check` runs the
    // engine for its version: the test engine.
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PLANBOT_ENGINE_BINARY", crate::support::engine());
    c
}

/// `planbot serve --check --config CFG`, run to the end.
fn serve_check(cfg: &std::path::Path) -> std::process::Output {
    planbot()
        .args(["serve", "--check", "--config"])
        .arg(cfg)
        .output()
        .unwrap()
}

const BASE: &str = r#"
listen = "127.0.0.1:9999"
data_dir = "/tmp/planbot-check-test"
fingerprint_key = "fingerprint-key-from-file-0123456789"

[gitlab]
url = "https://gitlab.corp.test"
token = "glpat-in-the-file"
webhook_secret = "webhook-secret-in-the-file"
projects = ["infra/homelab"]
"#;

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn check_prints_the_config_with_secrets_hidden_and_what_it_would_do() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "planbot.toml", BASE);
    let out = planbot()
        .args(["serve", "--config"])
        .arg(&cfg)
        .arg("--check")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("planbot: the config is valid."));
    assert!(stdout.contains("gitlab.token = (set)"), "{stdout}");
    assert!(
        stdout.contains("listen on http://127.0.0.1:9999"),
        "{stdout}"
    );
    assert!(stdout.contains("require X-Gitlab-Token"), "{stdout}");
    assert!(
        stdout.contains("- check no drift on a schedule (drift.enabled is false"),
        "{stdout}"
    );
    assert!(
        stdout.contains("- run every engine process sandboxed: Landlock ABI"),
        "{stdout}"
    );
    for secret in [
        "glpat-in-the-file",
        "webhook-secret-in-the-file",
        "fingerprint-key-from-file",
    ] {
        assert!(!stdout.contains(secret), "{secret} printed:\n{stdout}");
    }
}

#[test]
fn an_unknown_key_is_an_error_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "planbot.toml",
        &BASE.replace("[gitlab]", "[gitlab]\nwebhook_secert = \"typo\""),
    );
    let out = serve_check(&cfg);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The file and line of the typo, and the key it was meant to be.
    let f = cfg.display().to_string();
    assert!(
        stderr.contains(&format!(
            "  unknown config key `gitlab.webhook_secert` (did you mean `gitlab.webhook_secret`?)\n      from {f}, line 7\n"
        )),
        "{stderr}"
    );
}

#[test]
fn a_misspelled_planbot_variable_is_a_warning_in_check_and_doctor() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "planbot.toml", BASE);
    let out = planbot()
        .args(["serve", "--check", "--config"])
        .arg(&cfg)
        .env("PLANBOT_GITLAB_TOKN", "glpat-meant-for-the-token")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "a warning does not fail the check: {stderr}"
    );
    assert!(
        stderr.contains("environment variable `PLANBOT_GITLAB_TOKN` sets nothing: no config key reads it (did you mean `PLANBOT_GITLAB_TOKEN`?)"),
        "{stderr}"
    );
    assert!(!stderr.contains("glpat-meant-for-the-token"), "{stderr}");

    let out = planbot()
        .args(["doctor", "--config"])
        .arg(&cfg)
        .env("PLANBOT_GITLAB_TOKN", "glpat-meant-for-the-token")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("PLANBOT_GITLAB_TOKN"))
        .unwrap_or_else(|| panic!("doctor does not name the variable:\n{stdout}"));
    assert!(
        line.trim_start().starts_with("WARN")
            && line.contains("did you mean `PLANBOT_GITLAB_TOKEN`?"),
        "{stdout}"
    );
    assert!(!stdout.contains("glpat-meant-for-the-token"), "{stdout}");
}

#[test]
fn env_overrides_and_secret_files_are_used() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = write(dir.path(), "gitlab-token", "glpat-from-a-file\n");
    let cfg = write(
        dir.path(),
        "planbot.toml",
        &BASE.replace(
            "token = \"glpat-in-the-file\"",
            "token = \"to-be-overridden\"",
        ),
    );
    let out = planbot()
        .args(["serve", "--check", "--config"])
        .arg(&cfg)
        .env("PLANBOT_LISTEN", "127.0.0.1:7777")
        .env("PLANBOT_GITLAB_TOKEN_FILE", &token_file)
        .env("PLANBOT_GITLAB_PROJECTS", "infra/homelab,infra/edge")
        .env("PLANBOT_PLAN_MAX_CONCURRENT_PLANS", "3")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("listen = 127.0.0.1:7777"), "{stdout}");
    assert!(
        stdout.contains(r#"gitlab.projects = ["infra/homelab", "infra/edge"]"#),
        "{stdout}"
    );
    assert!(stdout.contains("plan.max_concurrent_plans = 3"), "{stdout}");
    assert!(!stdout.contains("glpat-from-a-file"));

    // The file is really read: a missing one is named.
    let out = planbot()
        .args(["serve", "--check", "--config"])
        .arg(&cfg)
        .env("PLANBOT_GITLAB_TOKEN_FILE", dir.path().join("nope"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("gitlab.token_file") && stderr.contains("nope"),
        "{stderr}"
    );
}

#[test]
fn a_missing_config_file_is_named() {
    let out = planbot()
        .args(["serve", "--check", "--config", "/nonexistent/planbot.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/planbot.toml"));
}

#[test]
fn check_runs_the_engine_for_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "planbot.toml", BASE);
    let out = serve_check(&cfg);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let engine = crate::support::engine();
    let line = stdout
        .lines()
        .find(|l| l.starts_with("- run the engine "))
        .unwrap_or_else(|| panic!("no engine line:\n{stdout}"));
    assert!(
        (line.contains("OpenTofu ") || line.contains("Terraform "))
            && line.ends_with(&format!(" at {}", engine.display())),
        "{line}"
    );
}

#[test]
fn check_reports_every_problem_at_once_with_where_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write(dir.path(), "gitlab-token", "\n");
    let not_a_dir = write(dir.path(), "a-file", "x");
    let text = format!(
        r#"data_dir = "{data}"
fingerprint_key = "fingerprint-key-from-file-0123456789"
public_url = "https://planbot.example.com"
[gitlab]
url = "https://gitlab.corp.test"
token_file = "{token}"
webhook_secret = "change-me"
projects = ["infra/homelab"]
[engine]
binary = "terrafrom"
[proxmox]
endpoint = "https://pve.corp.test:8006"
api_token = "PVEAPIToken=tofu@pve!planbot=d9a4c2b0-5e8f-4a71-93c6-1f2e3d4c5b6a"
"#,
        data = not_a_dir.join("planbot").display(),
        token = empty.display(),
    );
    let cfg = write(dir.path(), "planbot.toml", &text);
    let out = planbot()
        .args(["serve", "--check", "--config"])
        .arg(&cfg)
        .env_remove("PLANBOT_ENGINE_BINARY")
        .env("PLANBOT_PLAN_MAX_CONCURRENT_PLANS", "lots")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout when invalid");
    let f = cfg.display().to_string();
    for (problem, whence) in [
        (
            "config key `plan.max_concurrent_plans`: expected a whole number".to_string(),
            "from environment variable PLANBOT_PLAN_MAX_CONCURRENT_PLANS".to_string(),
        ),
        (
            "config key `gitlab.token`: is empty".into(),
            format!(
                "from secret file {} (named in {f}, line 6)",
                empty.display()
            ),
        ),
        (
            "config key `gitlab.webhook_secret`: is still the example's placeholder `change-me`"
                .into(),
            format!("from {f}, line 7"),
        ),
        (
            "config key `proxmox.api_token`: starts with `PVEAPIToken=`".into(),
            format!("from {f}, line 13"),
        ),
        (
            "config key `engine.binary`: engine binary not found: `terrafrom` is not on PATH"
                .into(),
            format!("from {f}, line 10"),
        ),
        (
            format!(
                "config key `data_dir`: {}/planbot cannot be created: {} is not a directory",
                not_a_dir.display(),
                not_a_dir.display()
            ),
            format!("from {f}, line 1"),
        ),
        (
            "config key `public_url`: `planbot.example.com` is the example's placeholder".into(),
            format!("from {f}, line 3"),
        ),
    ] {
        let at = stderr
            .lines()
            .position(|l| l.trim_start().starts_with(&problem))
            .unwrap_or_else(|| panic!("not reported: {problem}\n{stderr}"));
        assert_eq!(
            stderr.lines().nth(at + 1).map(str::trim),
            Some(whence.as_str()),
            "{stderr}"
        );
    }
    assert!(
        stderr.contains(": 7 problems in the configuration"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("d9a4c2b0"),
        "the Proxmox secret printed:\n{stderr}"
    );

    // doctor says the same, each with the fix for its kind, and checks nothing else.
    let out = planbot()
        .args(["doctor", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let fix_after = |needle: &str| -> String {
        let at = stdout
            .lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no FAIL line with {needle}:\n{stdout}"));
        stdout.lines().nth(at + 1).unwrap().trim().to_string()
    };
    assert_eq!(
        fix_after("`gitlab.token`: is empty"),
        format!("fix: Put the secret into {}: it is empty (an access token of the bot user with the `api` scope).", empty.display())
    );
    assert!(
        !stdout.contains("gitlab.url"),
        "an empty token is not a URL problem:\n{stdout}"
    );
    assert!(
        fix_after("`gitlab.webhook_secret`").starts_with(&format!(
            "fix: Replace `change-me` in {f}, line 7 with the real value"
        )),
        "{stdout}"
    );
    assert!(
        fix_after("`proxmox.api_token`").starts_with(&format!("fix: Write the token as user@realm!tokenid=secret in {f}, line 13, without `PVEAPIToken=`")),
        "{stdout}"
    );
    assert!(
        !stdout.contains("GitLab reachable") && !stdout.contains("\nEngine\n"),
        "{stdout}"
    );
    assert!(!stdout.contains("d9a4c2b0"), "{stdout}");
}

#[test]
fn doctor_blames_a_token_with_a_line_break_on_the_token_not_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "planbot.toml",
        // A token file with two lines pasted in: the line break stays inside.
        &BASE.replace("glpat-in-the-file", "glpat-line-one\\nline-two"),
    );
    let out = planbot()
        .args(["doctor", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let at = stdout
        .lines()
        .position(|l| l.contains("FAIL  the GitLab token has characters no HTTP header can carry"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(
        stdout.lines().nth(at + 1).map(str::trim),
        Some("fix: Set gitlab.token (or gitlab.token_file) to the bot user's access token with the `api` scope, nothing else on the line.")
    );
    assert!(!stdout.contains("gitlab.url"), "{stdout}");
    assert!(!stdout.contains("line-one"), "the token printed:\n{stdout}");
}

#[test]
fn check_reads_planbots_own_policy_sets_and_names_each_that_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("guardrails");
    std::fs::create_dir(&good).unwrap();
    write(
        &good,
        "sizes.rego",
        "package main\n\nimport rego.v1\n\ndeny contains msg if {\n\tsome rc in input.resource_changes\n\trc.change.after.memory > 16384\n\tmsg := rc.address\n}\n",
    );
    let broken = dir.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    write(
        &broken,
        "bad.rego",
        "package main\n\ndeny contains msg if {\n",
    );
    let sets = format!(
        "{BASE}\n[[policy_sets]]\nname = \"guardrails\"\npath = \"{}\"\n\n[[policy_sets]]\nname = \"broken\"\npath = \"{}\"\n\n[[policy_sets]]\nname = \"missing\"\npath = \"{}\"\n",
        good.display(),
        broken.display(),
        dir.path().join("nowhere").display(),
    );
    let cfg = write(dir.path(), "planbot.toml", &sets);
    let out = serve_check(&cfg);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("`policy_sets.broken`") && stderr.contains("bad.rego does not parse"),
        "{stderr}"
    );
    assert!(
        stderr.contains("`policy_sets.missing`")
            && stderr.contains("cannot read the policy directory"),
        "{stderr}"
    );
    assert!(!stderr.contains("policy_sets.guardrails"), "{stderr}");
}

#[test]
fn a_bad_drift_schedule_or_time_zone_is_a_check_error_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{BASE}\n[drift]\nenabled = true\nschedule = \"every morning\"\ntime_zone = \"Europe/Berln\"\n"
    );
    let cfg = write(dir.path(), "planbot.toml", &text);
    let out = serve_check(&cfg);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let f = cfg.display().to_string();
    assert!(
        stderr.contains("config key `drift.schedule`: `every morning` is not a cron schedule:"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "e.g. \"0 6 * * *\" for 06:00 every day)\n      from {f}, line 14\n"
                .replace("{f}", &f)
                .as_str()
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "config key `drift.time_zone`: `Europe/Berln` is not a time zone name (did you mean `Europe/Berlin`?) (an IANA name such as \"UTC\" or \"Europe/Berlin\")\n      from {f}, line 15\n"
        )),
        "{stderr}"
    );

    // docs/drift.md's example, as written: `--check` says when drift is checked.
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/drift.md"),
    )
    .unwrap();
    let example = page
        .split("<!-- drift-schedule-example:start -->\n```toml\n")
        .nth(1)
        .and_then(|rest| {
            rest.split("```\n<!-- drift-schedule-example:end -->")
                .next()
        })
        .expect("docs/drift.md shows the schedule's settings");
    let cfg = write(dir.path(), "planbot.toml", &format!("{BASE}\n{example}"));
    let out = serve_check(&cfg);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("drift.enabled = true"), "{stdout}");
    assert!(stdout.contains("drift.schedule = 0 6 * * 1-5"), "{stdout}");
    assert!(
        stdout.contains("drift.time_zone = Europe/Berlin"),
        "{stdout}"
    );
    assert!(
        stdout.contains("- check every root for drift on `0 6 * * 1-5` (Europe/Berlin), one replica per tick; next: 20"),
        "{stdout}"
    );
}

#[test]
fn serve_on_a_port_in_use_fails_before_it_touches_the_store() {
    // Another process holds the port: `serve` says so and leaves the data directory as it was
    // (no store made, no reconcile job queued that a later start would run).
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let text = BASE
        .replace("127.0.0.1:9999", &addr.to_string())
        .replace("/tmp/planbot-check-test", &data.display().to_string());
    let cfg = write(dir.path(), "planbot.toml", &text);
    let out = planbot()
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("binding {addr}")), "{stderr}");
    assert!(
        !data.join("planbot.db").exists(),
        "the store was opened before the bind failed:\n{stderr}"
    );
    drop(busy);
}

/// Issue 34: `--check` says which per-run cgroup mode planbot would use, or why none; `off`
/// says so; a tasks cap out of range is an error naming its key.
#[test]
fn check_says_which_per_run_cgroup_is_in_use_or_why_none() {
    use planbot::capabilities::engine::CgroupSupport;
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &str| {
        let cfg = write(dir.path(), "planbot.toml", &format!("{BASE}{extra}"));
        let out = serve_check(&cfg);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, text) = run("\n[sandbox]\njob_memory_max = \"2 GiB\"\njob_tasks_max = 512\n");
    assert!(ok, "{text}");
    let want = match CgroupSupport::probe() {
        CgroupSupport::Unavailable { reason } => format!("- cgroup: NO per-run cgroup ({reason})"),
        s => format!(
            "- cgroup: each run's engine processes in a cgroup of their own ({}): 2048 MiB of memory and 512 tasks per run",
            s.describe()
        ),
    };
    assert!(text.contains(&want), "want {want:?} in:\n{text}");

    let (ok, text) = run("\n[sandbox]\ncgroup = \"off\"\n");
    assert!(ok, "{text}");
    assert!(
        text.contains("- cgroup: no per-run cgroup: `[sandbox] cgroup = \"off\"`"),
        "{text}"
    );

    let (ok, text) = run("\n[sandbox]\njob_tasks_max = 3\n");
    assert!(!ok, "{text}");
    assert!(text.contains("sandbox.job_tasks_max"), "{text}");
}

/// Issue 43: planbot's own port on the engine sandbox's allow-list — written in
/// `connect_ports`, or brought by an endpoint of the config (a Proxmox endpoint on planbot's
/// port) — would let MR code reach planbot's pages and API from loopback: `--check` refuses the
/// config naming where the port came from, `serve` does not start, `doctor` fails it.
#[test]
fn planbots_own_port_on_the_sandboxs_allow_list_is_refused_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = BASE.replace("/tmp/planbot-check-test", &data.display().to_string());
    for (extra, source) in [
        (
            "[sandbox]\nconnect_ports = [443, 9999]\n",
            "`[sandbox] connect_ports` allows it",
        ),
        (
            "[proxmox]\nendpoint = \"https://127.0.0.1:9999/\"\napi_token = \"t@pve!p=0e7b5a9c-2d4f-4b8a-a1c3-9f8e7d6c5b4a\"\n",
            "`proxmox.endpoint` (the Proxmox API) allows it",
        ),
    ] {
        let cfg = write(dir.path(), "planbot.toml", &format!("{base}{extra}"));
        let want = format!("planbot listens on port 9999 (`listen`), and the engine's sandbox may connect to that port ({source}): MR code could reach planbot's own pages and API.");
        let out = serve_check(&cfg);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(&want), "{stderr}");
        let out = planbot()
            .args(["serve", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(&want), "{stderr}");
        assert!(!data.join("planbot.db").exists(), "serve started: {stderr}");
        let out = planbot()
            .args(["doctor", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(&format!("FAIL  {want}")), "{stdout}");
    }
    // Another port for planbot: nothing to say.
    let cfg = write(
        dir.path(),
        "planbot.toml",
        &format!("{base}[sandbox]\nconnect_ports = [443, 9998]\n"),
    );
    let out = serve_check(&cfg);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("planbot listens on port"), "{stderr}");
}
