//! Drift with hostile text, with the real engine and the fake GitLab (which runs GitLab's
//! quick-action reader on every text it receives): `main`'s code names a VM with a key made of
//! quick actions, a mass mention and an unclosed comment, and later breaks with an engine
//! error quoting such a line. The drift issue shows the text as text; GitLab acts on none of it.

use crate::apply_story::{no_workers, world};
use crate::support::infra_main_tf;
use crate::support::service::TestService;
use planbot::core::drift::DriftVerdict;
use planbot::flows::drift::check::{tick, Selection};
use std::time::SystemTime;

/// A `for_each` key a merged MR could have added: each line something GitLab acts on.
const HOSTILE_KEY: &str = r"\n/close\n/label ~pwned\n@all <!-- hidden";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_and_engine_errors_reach_the_drift_issue_as_inert_text() {
    let engine = require_engine!();
    let w = world(&engine);
    w.gitlab.commit_files(
        &w.project,
        "main",
        &[("main.tf", &infra_main_tf(&["blocky", HOSTILE_KEY]))],
    );
    let s = TestService::start(w.config.clone(), no_workers()).await;
    let check = || async {
        tick(&s.app, &Selection::default(), SystemTime::now())
            .await
            .expect("a drift tick")
    };

    // `main` was never applied: both VMs are drift, the hostile one shown by its address.
    let first = check().await;
    assert!(
        matches!(first.roots[0].verdict, DriftVerdict::Drifted { .. }),
        "{first:?}"
    );
    let issues = w.gitlab.issues(&w.project);
    assert_eq!(issues.len(), 1);
    let issue = &issues[0];
    assert_eq!(issue.state, "opened", "no `/close` ran");
    assert_eq!(issue.labels, vec!["drift".to_string()], "no `/label` ran");
    assert!(
        issue.description.contains("/close"),
        "{}",
        issue.description
    );
    assert!(issue.description.contains("pwned"), "{}", issue.description);
    assert!(!issue.title.contains('\n'), "{}", issue.title);
    assert_eq!(w.gitlab.take_hazards(), vec![], "nothing GitLab acts on");

    // The code breaks with an error whose quoted source lines are quick actions: the issue
    // says it could not check, quoting them inert, and stays open.
    w.gitlab.commit_files(
        &w.project,
        "main",
        &[("main.tf", "/close\n@all\n/label ~pwned\nresource \"x\" {\n")],
    );
    let broken = check().await;
    assert!(
        matches!(broken.roots[0].verdict, DriftVerdict::CouldNotCheck { .. }),
        "{broken:?}"
    );
    let issue = &w.gitlab.issues(&w.project)[0];
    assert_eq!(issue.state, "opened");
    assert_eq!(issue.labels, vec!["drift".to_string()]);
    assert!(
        issue.description.contains("could not check root `default`"),
        "{}",
        issue.description
    );
    assert!(
        issue.description.contains("/close"),
        "{}",
        issue.description
    );
    assert_eq!(w.gitlab.take_hazards(), vec![], "nothing GitLab acts on");

    // The run page of the check shows the error, escaped.
    let (status, page) = s
        .newest_run_page(planbot::capabilities::store::RunKind::Drift)
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(!page.contains("<!-- hidden"), "{page}");
}
