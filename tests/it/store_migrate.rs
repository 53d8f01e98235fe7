//! `planbot store migrate --from sqlite://… --to postgres://…`: the binary copies every table of
//! a SQLite store into an empty PostgreSQL database, and refuses a target that is not empty.
//! Needs PostgreSQL: the server `PLANBOT_TEST_POSTGRES_URL` names, else one the tests start
//! themselves from the system's `initdb` and `postgres`; without either this test fails saying
//! what to install (always under `CI=true`; elsewhere `PLANBOT_SKIP_POSTGRES_TESTS=1` skips it).

use planbot::capabilities::store::{JobEnd, NewApply, NewDelivery, Store};
use planbot::core::config::StoreUrl;
use planbot::core::events::Job;
use planbot::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId};
use std::process::Command;

fn migrate(from: &str, to: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_planbot"))
        .args(["store", "migrate", "--from", from, "--to", to])
        .output()
        .expect("planbot runs")
}

#[tokio::test]
async fn store_migrate_copies_a_sqlite_store_into_postgres() {
    let Some(pg) = crate::support::postgres::fresh_database("planbot_migrate").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("planbot.db");
    {
        let store = Store::open(&path).unwrap();
        store
            .record_delivery(
                NewDelivery {
                    key: "k1".into(),
                    event: "merge_request".into(),
                    outcome: "enqueued".into(),
                    project: Some(ProjectId(1)),
                    mr: Some(MrIid(2)),
                },
                vec![Job::Reconcile],
            )
            .await
            .unwrap();
        let job = store.claim_next().await.unwrap().unwrap();
        store.finish_job(job.id, JobEnd::Done).await.unwrap();
        store
            .set_mr_note(ProjectId(1), MrIid(2), NoteId(33))
            .await
            .unwrap();
        store
            .begin_apply(NewApply {
                ci_job: JobId(5),
                project: ProjectId(1),
                mr: Some(MrIid(2)),
                sha: CommitSha("a".repeat(40)),
                roots: vec!["core".into()],
            })
            .await
            .unwrap();
    }
    let from = format!("sqlite://{}", path.display());
    let out = migrate(&from, &pg);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("deliveries: 1 rows"), "{stdout}");
    assert!(stdout.contains("jobs: 1 rows"), "{stdout}");
    assert!(stdout.contains("applies: 1 rows"), "{stdout}");

    let copy = Store::connect(&StoreUrl::Postgres(pg.clone()), None)
        .await
        .unwrap();
    let source = Store::open(&path).unwrap();
    assert_eq!(copy.export().await.unwrap(), source.export().await.unwrap());
    assert_eq!(
        copy.mr_note(ProjectId(1), MrIid(2)).await.unwrap(),
        Some(NoteId(33))
    );
    assert!(copy.apply_for_job(JobId(5)).await.unwrap().is_some());

    // A second copy into the same (now full) database is refused, and changes nothing.
    let again = migrate(&from, &pg);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("not empty"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(copy.delivery_count().await.unwrap(), 1);
}

#[tokio::test]
async fn with_no_server_named_the_tests_start_their_own_postgresql_with_tls() {
    // What `cargo test` on a fresh clone does: a throwaway cluster, superuser on loopback,
    // TLS offered with a certificate its own CA signed.
    let server = crate::support::throwaway_postgres::throwaway().unwrap_or_else(|e| panic!("{e}"));
    let client = crate::support::postgres::connect(&server.url).await;
    let row = client
        .query_one(
            "SELECT current_setting('ssl'), rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "on");
    assert!(
        row.get::<_, bool>(1),
        "a superuser: each test creates its database"
    );
    let ca = std::fs::read_to_string(&server.ca).unwrap();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
}
