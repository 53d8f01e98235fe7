//! What an operator sees of drift after a check: `/metrics` gauges per root, `planbot doctor`'s
//! Drift section, the drift runs on the run pages; and what happens to the issue of a root the
//! repository stops checking (`drift = false`): closed with a note saying why, its gauges gone.

use crate::apply_story::{no_workers, world};
use crate::support::service::TestService;
use planbot::flows::drift::check::{tick, Selection};
use std::time::SystemTime;

async fn check(s: &TestService) {
    tick(&s.app, &Selection::default(), SystemTime::now())
        .await
        .expect("a drift tick");
}

/// The value of the metric line that starts with `series` (name and labels).
fn metric(text: &str, series: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drift_check_shows_on_metrics_doctor_and_run_pages_and_an_opted_out_root_closes_its_issue(
) {
    let engine = require_engine!();
    let w = world(&engine);
    let s = TestService::start(w.config.clone(), no_workers()).await;
    let before = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;

    // `main` was pushed and never applied: its one root drifted by one resource per instance.
    check(&s).await;
    let issues = w.gitlab.issues(&w.project);
    assert_eq!(issues.len(), 1);
    let series = r#"{project="infra/homelab",root="default"}"#;
    let text = s.metrics().await;
    let drifted = metric(&text, &format!("planbot_drift_resources{series}"))
        .unwrap_or_else(|| panic!("no drift gauge:\n{text}"));
    assert!(drifted > 0, "{text}");
    let checked = metric(
        &text,
        &format!("planbot_drift_last_check_timestamp_seconds{series}"),
    )
    .unwrap();
    let ok = metric(
        &text,
        &format!("planbot_drift_last_success_timestamp_seconds{series}"),
    )
    .unwrap();
    assert!(checked >= before && ok == checked, "{text}");

    // The run pages list the check as a drift run of the root; its page says what it found.
    let (status, runs) = s.get_text("/runs").await;
    assert_eq!(status, 200, "{runs}");
    assert!(runs.contains("<td>drift</td>"), "{runs}");
    let (status, page) = s
        .newest_run_page(planbot::capabilities::store::RunKind::Drift)
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("drift of <code>default</code>"), "{page}");
    assert!(
        page.contains(&format!("drift: {drifted} resource")),
        "{page}"
    );

    // `planbot doctor` on the same config says when drift ran and what it found.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("planbot.toml");
    std::fs::write(&file, w.planbot.text()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args(["doctor", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let doctor = String::from_utf8_lossy(&out.stdout);
    let line = doctor
        .lines()
        .find(|l| l.contains("infra/homelab root default:"))
        .unwrap_or_else(|| panic!("doctor names the root's drift:\n{doctor}"));
    assert!(
        line.starts_with(&format!(
            "  INFO  infra/homelab root default: DRIFTED ({drifted} resource"
        )),
        "{line}"
    );
    assert!(line.contains(", checked 20"), "{line}");

    // The repository stops checking drift: the next check closes the root's issue, saying why,
    // and its gauges are gone.
    w.gitlab
        .commit_files(&w.project, "main", &[(".planbot.toml", "drift = false\n")]);
    check(&s).await;
    let issue = &w.gitlab.issues(&w.project)[0];
    assert_eq!(issue.state, "closed");
    let note = &issue.notes.last().expect("a closing note").2;
    assert!(
        note.starts_with("planbot: root `default` is no longer checked for drift:"),
        "{note}"
    );
    let text = s.metrics().await;
    assert!(!text.contains("planbot_drift_resources{"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_that_cannot_be_checked_is_named_and_the_others_are_still_checked() {
    let engine = require_engine!();
    let w = world(&engine);
    // A second project whose default branch has a .planbot.toml that does not parse.
    let broken = w.gitlab.create_project("infra/broken");
    w.gitlab.commit_files(
        &broken,
        "main",
        &[("main.tf", "# nothing\n"), (".planbot.toml", "roots = [\n")],
    );
    let config = w
        .planbot
        .clone()
        .projects(&["infra/broken", "infra/homelab"])
        .load();
    let s = TestService::start(config, no_workers()).await;

    let t = tick(&s.app, &Selection::default(), SystemTime::now())
        .await
        .expect("a tick");
    assert_eq!(t.failed.len(), 1, "{t:?}");
    assert_eq!(t.failed[0].project, "infra/broken");
    assert!(t.failed[0].error.contains(".planbot.toml"), "{t:?}");
    // The project after it was checked all the same: its root drifted.
    assert_eq!(t.roots.len(), 1, "{t:?}");
    assert_eq!(t.roots[0].project_path, "infra/homelab");
    assert_eq!(t.exit_code(), 2);
    let text = t.render_text(&s.app.scrubber, "planbot-apply");
    assert!(
        text.starts_with(
            "infra/broken: COULD NOT CHECK (this is not \"no drift\"):\n    .planbot.toml"
        ),
        "{text}"
    );
    assert!(text.contains("infra/homelab · root default"), "{text}");
}
