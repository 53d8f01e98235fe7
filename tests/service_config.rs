//! `planbot serve --check` stories: the real binary reads the file, the environment and secret files.

use std::process::Command;

fn planbot() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_planbot"));
    // Only what the test sets: no PLANBOT_* from the developer's shell.
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    c
}

const BASE: &str = r#"
listen = "127.0.0.1:9999"
data_dir = "/tmp/planbot-check-test"
fingerprint_key = "fingerprint-key-from-file-0123456789"

[gitlab]
url = "https://gitlab.example.com"
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
    let out = planbot()
        .args(["serve", "--check", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown config key `gitlab.webhook_secert`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("webhook_secret"),
        "the known keys are listed: {stderr}"
    );
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
