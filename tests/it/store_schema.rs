//! The store opens databases made by older planbots (real ones, made by that code:
//! `tests/fixtures/store/README.md`) and keeps every row: one from before versioned migrations,
//! and SQLite and PostgreSQL ones at schema 5 by the hand-written runners that refinery
//! replaced, which must be recognised as migrated. It refuses a database from a newer planbot.

use planbot::capabilities::store::{
    ApplyState, Dump, JobEnd, QueueJobKind, QueueJobState, RunKind, RunState, SchemaError, Store,
    Value, SCHEMA_VERSION,
};
use planbot::core::config::StoreUrl;
use planbot::core::events::Job;
use planbot::core::fingerprint::Fingerprint;
use planbot::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId, RunId};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/store");

/// A copy of the fixture `name` (the fixture itself is never opened for writing).
fn copy_of(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join("planbot.db");
    std::fs::copy(format!("{FIXTURES}/{name}"), &path).unwrap();
    path
}

fn old_database(dir: &Path) -> PathBuf {
    copy_of(dir, "v0.db")
}

/// Every row of a store, as the fixtures keep what the older planbot exported.
fn rows(dump: Dump) -> serde_json::Value {
    let value = |v: Value| match v {
        Value::Null => serde_json::Value::Null,
        Value::Int(n) => n.into(),
        Value::Text(t) => t.into(),
    };
    dump.tables
        .into_iter()
        .map(|(table, rows)| {
            let rows: Vec<Vec<_>> = rows
                .into_iter()
                .map(|r| r.into_iter().map(value).collect())
                .collect();
            serde_json::json!([table, rows])
        })
        .collect()
}

/// `dump`'s rows without the tables migrations after schema 5 made, which must be empty (a
/// store at schema 5 has no row for them).
fn rows_of_schema_5(dump: Dump) -> serde_json::Value {
    let all = rows(dump);
    let mut kept = Vec::new();
    for table in all.as_array().unwrap() {
        if table[0] == "kept_plans" || table[0] == "unit_results" {
            assert_eq!(
                table[1],
                serde_json::json!([]),
                "migration 6's and 7's tables are new"
            );
        } else {
            kept.push(table.clone());
        }
    }
    serde_json::Value::Array(kept)
}

fn fixture_rows(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap()).unwrap()
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
    // migration 3's drift tables, migration 4's targeted plans, migration 5's widget reports,
    // migration 6's kept plans, migration 7's unit results and refinery's record of them, and
    // the same as a new database's.
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
            "sqlite_autoindex_kept_plans_1",
            "sqlite_autoindex_plan_targeting_1",
            "sqlite_autoindex_policy_approvals_1",
            "sqlite_autoindex_policy_verdicts_1",
            "sqlite_autoindex_refinery_schema_history_1",
            "sqlite_autoindex_widget_reports_1",
            "unit_results_parent",
            "drift_roots",
            "drift_ticks",
            "kept_plans",
            "plan_targeting",
            "policy_approvals",
            "policy_verdicts",
            "refinery_schema_history",
            "unit_results",
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

#[tokio::test]
async fn a_sqlite_store_at_schema_5_by_the_hand_written_runner_is_recognised_and_keeps_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_of(dir.path(), "v5.db");
    assert_eq!(user_version(&path), 5);
    let before = schema(&path);
    let store = Store::open(&path).unwrap();
    assert_eq!(
        rows_of_schema_5(store.export().await.unwrap()),
        fixture_rows("v5.db.rows.json")
    );
    // Recognised as migrated: refinery records the five, and nothing of them ran again (the
    // schema is what it was, plus refinery's table and migrations 6's and 7's).
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut st = conn
        .prepare("SELECT version FROM refinery_schema_history ORDER BY version")
        .unwrap();
    let versions: Vec<u32> = st
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    let added: Vec<_> = schema(&path)
        .into_iter()
        .filter(|row| !before.contains(row))
        .map(|(_, name, _)| name)
        .collect();
    assert_eq!(
        added,
        [
            "sqlite_autoindex_kept_plans_1",
            "sqlite_autoindex_refinery_schema_history_1",
            "unit_results_parent",
            "kept_plans",
            "refinery_schema_history",
            "unit_results"
        ]
    );
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    // And it goes on where the older planbot stopped.
    assert_eq!(store.requeue_interrupted().await.unwrap(), 1);
    let next = store.enqueue(Job::Reconcile).await.unwrap();
    assert_eq!(
        next.id, None,
        "the reconcile it left queued is still queued"
    );
    let claimed = store.claim_next().await.unwrap().unwrap();
    assert_eq!((claimed.id.0, claimed.attempts), (4, 2));
}

#[tokio::test]
async fn a_postgres_store_at_schema_5_by_the_hand_written_runner_is_recognised_and_keeps_every_row()
{
    let Some(url) = crate::support::postgres::fresh_database("planbot_upgrade").await else {
        return;
    };
    // Loaded on a connection of its own: the dump empties the session's search_path.
    crate::support::postgres::connect(&url)
        .await
        .batch_execute(&std::fs::read_to_string(format!("{FIXTURES}/v5-postgres.sql")).unwrap())
        .await
        .unwrap();
    let client = crate::support::postgres::connect(&url).await;
    // The dump's replica died when the dump was made; a replica dead for a day is forgotten
    // at the next heartbeat, so the dump's clock is moved to now: it died a second ago.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    client
        .execute(
            "UPDATE replicas SET started_at = $1, expires_at = $2 WHERE owner = 'replica-a'",
            &[&(now_ms - 2_000), &(now_ms - 1_000)],
        )
        .await
        .unwrap();
    let columns = || async {
        client
            .query(
                "SELECT table_name::text, column_name::text, data_type::text
                 FROM information_schema.columns WHERE table_schema = 'public'
                 ORDER BY 1, 2",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r.get::<_, String>(0),
                    r.get::<_, String>(1),
                    r.get::<_, String>(2),
                )
            })
            .collect::<Vec<_>>()
    };
    let versions = |table: &'static str| {
        let client = &client;
        async move {
            let sql = format!("SELECT version FROM {table} ORDER BY version");
            client
                .query(&sql, &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<_, i32>(0) as u32)
                .collect::<Vec<_>>()
        }
    };
    let before = columns().await;
    let store = Store::connect(&StoreUrl::parse(&url).unwrap(), None)
        .await
        .unwrap();
    assert_eq!(
        rows_of_schema_5(store.export().await.unwrap()),
        fixture_rows("v5-postgres.rows.json")
    );
    // Recognised as migrated: refinery records the five, the old record is kept, and nothing
    // of them ran again (the tables are what they were, plus refinery's and migrations 6's and
    // 7's).
    let all: Vec<u32> = (1..=SCHEMA_VERSION).collect();
    assert_eq!(versions("refinery_schema_history").await, all);
    assert_eq!(versions("schema_migrations").await, all);
    let added: BTreeSet<_> = columns()
        .await
        .into_iter()
        .filter(|c| !before.contains(c))
        .map(|(table, _, _)| table)
        .collect();
    assert_eq!(
        added,
        BTreeSet::from([
            "kept_plans".to_string(),
            "refinery_schema_history".to_string(),
            "unit_results".to_string()
        ])
    );
    // What only PostgreSQL keeps: the dead replica's row, and its project lock, which a live
    // replica now takes over.
    let replicas: i64 = client
        .query_one(
            "SELECT COUNT(*) FROM replicas WHERE owner = 'replica-a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(replicas, 1);
    assert!(store
        .try_lock_project(ProjectId(1))
        .await
        .unwrap()
        .is_some());
    let next = store.enqueue(Job::Reconcile).await.unwrap();
    assert_eq!(
        next.id, None,
        "the reconcile it left queued is still queued"
    );
}
