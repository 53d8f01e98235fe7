//! A real browser on a run page: Debian's headless Chromium signs in to the fake GitLab, follows
//! planbot's sign-in through GitLab's OAuth redirects, opens a run page, and the test checks the
//! DOM the browser built (the rendered table, the folded diff, no raw Markdown, no hostile markup
//! run) and keeps a screenshot in `target/browser/run-page.png`.
//!
//! Needs `chromium` on PATH (`scripts/install-test-tools.sh` installs Debian's package when it is missing); without it
//! this test fails rather than passing unseen.

use crate::support::fake_gitlab::{FakeGitLab, REPORTER};
use planbot::capabilities::store::{NewRun, RunEnd, RunKind, RunState};
use planbot::core::config::Config;
use planbot::core::ids::{CommitSha, MrIid, ProjectId};
use planbot::flows::service::server::{Application, Options};
use std::path::PathBuf;

const PUBLIC_URL: &str = "http://planbot.test";

const NOTE: &str = "<!-- planbot:mr-note v1 -->\n### 🟡 planbot · plan for `3f9a2c1e` · 1 root with changes\n\n| root | add | change | destroy | import | moved |\n|---|---:|---:|---:|---:|---:|\n| `dns` | 2 | 0 | 2 ⚠️ | 0 | 0 |\n| `core` | – skipped: no files changed | | | | |\n\n> ⚠️ **Destructive changes**\n> - `proxmox_virtual_environment_vm.blocky` (VM 1000 `blocky` on `pve01`) will be **replaced**.\n\n<details><summary><code>-/+ proxmox_virtual_environment_vm.blocky</code> — replace (triggered by <code>proxmox_virtual_environment_file.ignition</code>)</summary>\n\n```diff\n  name    = \"blocky\"\n  vm_id   = 1000\n~ id      = \"1000\" -> (known after apply)\n```\n</details>\n\nHostile: <img src=x onerror=\"document.title='pwned'\"> [click](javascript:document.title='pwned')\n\n<sub>fingerprint `9c41e07a2b3d` · OpenTofu 1.10.6 · planned in 8.2 s · re-plan: comment `planbot plan`</sub>\n";

fn chromium() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["chromium", "chromium-browser"] {
        for dir in std::env::split_paths(&path) {
            if dir.join(name).is_file() {
                return dir.join(name);
            }
        }
    }
    panic!("no chromium on PATH: run scripts/install-test-tools.sh (Debian's `chromium` package) to run the browser test");
}

/// Run headless Chromium on `url` with `mode` (`--dump-dom` or `--screenshot=…`); planbot.test
/// resolves to the test service.
async fn browse(port: u16, mode: &str, url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--hide-scrollbars",
            "--window-size=1200,1400",
            "--virtual-time-budget=10000",
            &format!("--host-resolver-rules=MAP planbot.test 127.0.0.1:{port}"),
            &format!("--user-data-dir={}", profile.path().display()),
            mode,
            url,
        ])
        .env("HOME", profile.path())
        .kill_on_drop(true)
        .output()
        .await
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_signs_in_with_gitlab_and_sees_the_rendered_run() {
    let fake = FakeGitLab::start();
    let app_reg = fake.register_oauth_app(&format!("{PUBLIC_URL}/auth/callback"), &["read_user"]);
    let homelab = fake.create_project("infra/homelab");
    let alice = fake.create_user("alice");
    fake.add_member(&homelab, &alice, REPORTER);
    let data = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
listen = "127.0.0.1:0"
data_dir = "{}"
public_url = "{PUBLIC_URL}"
fingerprint_key = "test-fingerprint-key-0123456789"

[gitlab]
url = "{}"
token = "{}"
webhook_secret = "whatever-secret-value"
projects = ["infra/homelab"]

[gitlab.oauth]
client_id = "{}"
client_secret = "{}"
"#,
        data.path().display(),
        fake.url(),
        fake.bot_token(),
        app_reg.client_id,
        app_reg.secret,
    );
    let config = Config::load(&text, &[], &|_| Err("no files".into())).expect("config");
    let application = Application::build_with(
        config,
        Options {
            workers: false,
            reconcile: false,
        },
    )
    .await
    .expect("build");
    let port = application.port();
    let app = application.app();
    let _server = tokio::spawn(application.run_until_stopped());
    let id = app
        .store
        .start_run(NewRun {
            job: None,
            kind: RunKind::Plan,
            project: ProjectId(homelab.id),
            project_path: Some(homelab.path.clone()),
            mr: Some(MrIid(7)),
            root: "dns".into(),
            sha: CommitSha("3f9a2c1e5b7d9f0a1c3e5b7d9f0a1c3e5b7d9f0a".into()),
        })
        .await
        .unwrap();
    app.store
        .finish_run(
            id,
            RunEnd {
                state: RunState::Succeeded,
                summary: Some("2 to add, 0 to change, 2 to destroy".into()),
                log: "Initializing...\nPlan: 2 to add, 0 to change, 2 to destroy.".into(),
                note_markdown: Some(NOTE.into()),
                fingerprint: None,
            },
        )
        .await
        .unwrap();
    let start =
        |fake: &FakeGitLab| fake.browser_sign_in_url(&alice, &format!("{PUBLIC_URL}/runs/{id}"));

    let dom = browse(port, "--dump-dom", &start(&fake)).await;
    assert!(
        dom.contains(&format!("<title>planbot: run #{id}</title>")),
        "the browser ended on the run page:\n{dom}"
    );
    assert!(
        dom.contains("Signed in as <strong>@alice</strong>"),
        "{dom}"
    );
    assert!(
        dom.contains("<th align=\"right\">destroy</th>"),
        "a rendered table:\n{dom}"
    );
    assert!(dom.contains("<td><code>dns</code></td>"), "{dom}");
    assert!(
        dom.contains("<details><summary><code>-/+ proxmox_virtual_environment_vm.blocky</code>"),
        "the diff is folded:\n{dom}"
    );
    assert!(dom.contains("<strong>replaced</strong>"), "{dom}");
    for raw in ["|---|", "```", "&lt;details&gt;", "**Destructive"] {
        assert!(
            !dom.contains(raw),
            "raw Markdown `{raw}` on the page:\n{dom}"
        );
    }
    assert!(
        !dom.contains("pwned"),
        "hostile markup ran or survived:\n{dom}"
    );
    assert_eq!(fake.oauth_token_errors(), Vec::<String>::new());

    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/browser");
    std::fs::create_dir_all(&dir).unwrap();
    let shot = dir.join("run-page.png");
    let _ = std::fs::remove_file(&shot);
    browse(
        port,
        &format!("--screenshot={}", shot.display()),
        &start(&fake),
    )
    .await;
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot: {} bytes",
        png.len()
    );
    assert_eq!(
        fake.oauth_tokens_issued(),
        2,
        "both browsers signed in through GitLab"
    );
}
