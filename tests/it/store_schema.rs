//! The store opens a database made by the schema before versioned migrations (a real file, made
//! by that code: `tests/fixtures/store/README.md`), keeps every row readable through the public
//! API, and refuses a database from a newer planbot.

use planbot::capabilities::store::{
    ApplyState, JobEnd, QueueJobKind, QueueJobState, RunKind, RunState, SchemaError, Store,
    SCHEMA_VERSION,
};
use planbot::core::events::Job;
use planbot::core::fingerprint::Fingerprint;
use planbot::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId, RunId};
use std::path::{Path, PathBuf};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/store/v0.db");

/// A copy of the fixture (the fixture itself is never opened for writing).
fn old_database(dir: &Path) -> PathBuf {
    let path = dir.join("planbot.db");
    std::fs::copy(FIXTURE, &path).unwrap();
    path
}

fn user_version(path: &Path) -> u32 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// Every table, index and its SQL, as SQLite keeps them.
fn schema(path: &Path) -> Vec<(String, String, Option<String>)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut st = conn
        .prepare("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

fn sha(c: char) -> CommitSha {
    CommitSha(c.to_string().repeat(40))
}

#[tokio::test]
async fn a_database_from_the_previous_schema_opens_with_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = old_database(dir.path());
    assert_eq!(user_version(&path), 0, "the fixture predates migrations");
    let old_schema = schema(&path);
    let store = Store::open(&path).unwrap();

    // Deliveries.
    assert_eq!(store.delivery_count().await.unwrap(), 2);
    assert_eq!(
        store
            .delivery_outcome("fixture-delivery-2")
            .await
            .unwrap()
            .as_deref(),
        Some("ignored: draft")
    );

    // Queue jobs, newest first: reconcile queued, plan running, plan canceled, command
    // failed, plan done.
    let jobs = store.recent_jobs(10).await.unwrap();
    let seen: Vec<_> = jobs
        .iter()
        .map(|j| {
            (
                j.id.0,
                j.queue_kind().unwrap(),
                j.queue_state().unwrap(),
                j.mr.map(|m| m.0),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (5, QueueJobKind::Reconcile, QueueJobState::Queued, None),
            (4, QueueJobKind::Plan, QueueJobState::Running, Some(2)),
            (3, QueueJobKind::Plan, QueueJobState::Canceled, Some(3)),
            (2, QueueJobKind::Command, QueueJobState::Failed, Some(1)),
            (1, QueueJobKind::Plan, QueueJobState::Done, Some(1)),
        ]
    );
    assert!(jobs.iter().all(|j| j.job.is_some()), "payloads still read");
    assert_eq!(jobs[1].attempts, 1);
    assert_eq!(
        jobs[2].detail.as_deref(),
        Some("the merge request was closed")
    );
    assert_eq!(jobs[3].detail.as_deref(), Some("gitlab said 502"));
    assert_eq!(store.queue_depth().await.unwrap(), 1);
    assert!(store
        .head_has_plan(ProjectId(1), MrIid(1), sha('a'))
        .await
        .unwrap());

    // Runs and their logs.
    let runs = store.recent_runs(10).await.unwrap();
    assert_eq!(runs.len(), 2);
    let plan = store.run(RunId(1)).await.unwrap().unwrap();
    assert_eq!(
        (plan.kind, plan.state, plan.root.as_str()),
        (RunKind::Plan, RunState::Succeeded, "core")
    );
    assert_eq!(plan.project_path.as_deref(), Some("infra/homelab"));
    assert_eq!(
        plan.summary.as_deref(),
        Some("1 to add, 0 to change, 0 to destroy")
    );
    assert_eq!(plan.log, "Plan: 1 to add, 0 to change, 0 to destroy.\n");
    assert_eq!(plan.note_markdown.as_deref(), Some("### core\n\n1 to add"));
    assert_eq!(plan.fingerprint, Some("f".repeat(64)));
    assert!(plan.duration_ms().is_some());
    assert_eq!(runs[0].kind, RunKind::Apply);
    assert_eq!(runs[0].state, RunState::Running);
    assert_eq!(
        store
            .runs_for_mr(ProjectId(1), MrIid(2))
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        store.run_projects().await.unwrap(),
        [(ProjectId(1), Some("infra/homelab".to_string()))]
    );

    // What the MR was shown for review.
    let shown = store
        .last_shown_fingerprint(ProjectId(1), MrIid(1), "core")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        shown.fingerprint,
        Fingerprint::from_hex(&"f".repeat(64)).unwrap()
    );
    assert_eq!((shown.sha, shown.run), (sha('a'), Some(RunId(1))));
    let digest = store
        .digest_for(ProjectId(1), MrIid(1), "core", &sha('a'))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(digest.outputs["greeting"], "\"hello\"");
    assert_eq!(
        store.mr_note(ProjectId(1), MrIid(1)).await.unwrap(),
        Some(NoteId(501))
    );

    // Applies.
    let done = store.apply_for_job(JobId(9001)).await.unwrap().unwrap();
    assert_eq!(done.state, ApplyState::Succeeded);
    assert_eq!(done.detail.as_deref(), Some("applied core"));
    let running = store.apply_for_job(JobId(9002)).await.unwrap().unwrap();
    assert_eq!(running.state, ApplyState::Running);
    assert_eq!(running.roots, ["edge", "core"]);

    // And it takes new writes where the old code left off.
    let next = store.enqueue(Job::Reconcile).await.unwrap();
    assert_eq!(next.id, None, "an identical reconcile is already queued");
    assert_eq!(store.requeue_interrupted().await.unwrap(), 1);
    let claimed = store.claim_next().await.unwrap().unwrap();
    assert_eq!((claimed.id.0, claimed.attempts), (4, 2));
    store.finish_job(claimed.id, JobEnd::Done).await.unwrap();
    let interrupted = store.mark_interrupted_applies().await.unwrap();
    assert_eq!(interrupted.len(), 1);
    assert_eq!(interrupted[0].ci_job, JobId(9002));
    drop(store);

    // The schema is what it was (migration 1 is that schema) plus migration 2's policy tables,
    // migration 3's drift tables, migration 4's targeted plans and migration 5's widget
    // reports, now with its version
    // recorded, and the same as a new database's.
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    let migrated = schema(&path);
    let added: Vec<&str> = migrated
        .iter()
        .filter(|row| !old_schema.contains(row))
        .map(|(_, name, _)| name.as_str())
        .collect();
    assert_eq!(
        added,
        [
            "policy_approvals_by_mr",
            "sqlite_autoindex_drift_roots_1",
            "sqlite_autoindex_plan_targeting_1",
            "sqlite_autoindex_policy_approvals_1",
            "sqlite_autoindex_policy_verdicts_1",
            "sqlite_autoindex_widget_reports_1",
            "drift_roots",
            "drift_ticks",
            "plan_targeting",
            "policy_approvals",
            "policy_verdicts",
            "widget_reports"
        ]
    );
    assert!(old_schema.iter().all(|row| migrated.contains(row)));
    let fresh = dir.path().join("fresh.db");
    drop(Store::open(&fresh).unwrap());
    assert_eq!(schema(&fresh), migrated);
    assert_eq!(user_version(&fresh), SCHEMA_VERSION);
}

#[tokio::test]
async fn a_database_from_a_newer_planbot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = old_database(dir.path());
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
    }
    let before = schema(&path);
    let err = match Store::open(&path) {
        Ok(_) => panic!("a newer schema was opened"),
        Err(e) => e,
    };
    match err.downcast_ref::<SchemaError>() {
        Some(SchemaError::TooNew { found, known }) => {
            assert_eq!((*found, *known), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
        }
        other => panic!("not TooNew: {other:?} ({err:#})"),
    }
    let text = format!("{err:#}");
    assert!(text.contains("newer than this planbot"), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
    // Left as it was.
    assert_eq!(user_version(&path), SCHEMA_VERSION + 1);
    assert_eq!(schema(&path), before);
}
