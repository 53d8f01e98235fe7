//! The drift schedule inside `planbot serve`: a first start runs nothing before the schedule's
//! next occurrence; a replica starting after ticks were missed runs the latest one, once; two
//! replicas on one PostgreSQL wake for one tick and exactly one drift check runs; a bad
//! schedule or time zone is a `serve --check` error naming the setting.

use crate::apply_story::no_workers;
use crate::support::service::TestService;
use crate::support::world::World;
use chrono::{Datelike, TimeZone, Utc};
use planbot::capabilities::store::{JobEnd, RunKind};
use planbot::flows::service::server::Options;

/// Once a year, at New Year's midnight: the latest occurrence is always in the past and the
/// next one never comes while a test runs.
pub(crate) const YEARLY: &str =
    "[drift]\nenabled = true\nschedule = \"0 0 1 1 *\"\ntime_zone = \"UTC\"\n";

/// This year's New Year's midnight, UTC, in unix ms: the tick a start-up finds missed.
pub(crate) fn this_new_year() -> i64 {
    Utc.with_ymd_and_hms(Utc::now().year(), 1, 1, 0, 0, 0)
        .unwrap()
        .timestamp_millis()
}

pub(crate) fn three_years_before(ms: i64) -> i64 {
    ms - 3 * 365 * 86_400_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_back_after_missed_ticks_checks_drift_once_and_a_first_start_waits() {
    let engine = require_engine!();
    let w = World::homelab(&engine).extra_toml(YEARLY).build();

    // First start, no tick ever claimed: nothing runs before the schedule's next occurrence.
    let s = TestService::start(w.config.clone(), no_workers()).await;
    assert_eq!(s.app.store.last_drift_tick().await.unwrap(), None);
    assert!(s.app.store.recent_jobs(10).await.unwrap().is_empty());

    // Its last tick ran three New Years ago; then every replica was down.
    let old = three_years_before(this_new_year());
    let job = s.app.store.claim_drift_tick(old).await.unwrap().unwrap();
    let claimed = s.app.store.claim_next().await.unwrap().unwrap();
    assert_eq!(claimed.id, job);
    s.app.store.finish_job(job, JobEnd::Done).await.unwrap();
    s.kill().await;

    // Back up: the latest missed tick is checked, once (not once per missed New Year).
    let s = TestService::start(w.config.clone(), Options::default()).await;
    s.after_job_ends("the missed drift tick is checked", 120, || async {
        s.jobs_all_ended().await
    })
    .await;
    assert_eq!(
        s.app.store.last_drift_tick().await.unwrap(),
        Some(this_new_year())
    );
    let ticks: Vec<_> = s
        .app
        .store
        .recent_jobs(50)
        .await
        .unwrap()
        .into_iter()
        .filter(|j| j.kind == "drift_tick")
        .collect();
    assert_eq!(ticks.len(), 2, "the old tick and one new one: {ticks:?}");
    assert!(ticks.iter().all(|j| j.state == "done"), "{ticks:?}");
    let drift_runs: Vec<_> = s
        .app
        .store
        .recent_runs(50)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == RunKind::Drift)
        .collect();
    assert_eq!(drift_runs.len(), 1, "one root, one check: {drift_runs:?}");
    // `main` was pushed and never applied: the check found drift and opened the root's issue.
    let issues = w.gitlab.issues(&w.project);
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert_eq!(
        issues[0].title,
        "planbot: drift in infra/homelab root default"
    );
    let head = w.gitlab.branch_head(&w.project, "main").unwrap();
    assert_eq!(
        w.gitlab
            .status(&w.project, &head, "planbot/drift")
            .unwrap()
            .state,
        "failed"
    );
}
