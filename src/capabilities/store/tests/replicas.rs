//! N replicas on one PostgreSQL: two `Store`s on one database stand in for two planbot
//! processes. Each semantic the issue asks for, against the real server.

use super::backends::{postgres_db, sqlite_db, TestDb, TEST_LEASE};
use super::{delivery, plan};
use crate::capabilities::store::*;
use crate::core::events::{Job, PlanReason};
use crate::core::ids::{CommitSha, JobId, MrIid, ProjectId};
use std::collections::BTreeSet;
use std::time::Duration;

async fn two_replicas() -> Option<(TestDb, Store, Store)> {
    let db = postgres_db().await?;
    let a = db.replica("replica-a").await;
    let b = db.replica("replica-b").await;
    Some((db, a, b))
}

/// Longer than a lease: a replica that stopped renewing is gone by then.
async fn lease_expires() {
    tokio::time::sleep(TEST_LEASE + Duration::from_millis(400)).await;
}

/// A plain client of the test database, to read and write it behind the store's back.
async fn client_of(db: &TestDb) -> tokio_postgres::Client {
    let StoreUrl::Postgres(url) = &db.url else {
        unreachable!()
    };
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// What a newer planbot's start-up leaves in the database: one more migration recorded.
async fn a_newer_planbot_migrates(db: &TestDb) {
    let client = client_of(db).await;
    client
        .execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
             VALUES ($1, 'future', '2030-01-01T00:00:00Z', '0')",
            &[&(PG_SCHEMA_VERSION as i32 + 1)],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn the_same_delivery_on_two_replicas_at_once_is_one_row_and_one_job() {
    let Some((_db, a, b)) = two_replicas().await else {
        return;
    };
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            store
                .record_delivery(delivery("same-key"), vec![plan(1, 'a')])
                .await
                .unwrap()
        }));
    }
    let mut fresh = 0;
    for t in tasks {
        if !t.await.unwrap().duplicate {
            fresh += 1;
        }
    }
    assert_eq!(fresh, 1, "exactly one replica recorded it");
    assert_eq!(a.delivery_count().await.unwrap(), 1);
    assert_eq!(b.queue_depth().await.unwrap(), 1);
}

#[tokio::test]
async fn replicas_catching_up_on_one_head_at_once_queue_one_plan_and_spare_a_running_one() {
    let Some((_db, a, b)) = two_replicas().await else {
        return;
    };
    // Start-up reconciles and catch-ups on both replicas, for the same head, all at once.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let reason = match i % 3 {
            0 => PlanReason::Reconcile,
            1 => PlanReason::MissedHead,
            _ => PlanReason::NewCommits,
        };
        let job = super::with_reason(plan(1, 'a'), reason);
        tasks.push(tokio::spawn(
            async move { store.enqueue(job).await.unwrap() },
        ));
    }
    let mut queued = 0;
    for t in tasks {
        let e = t.await.unwrap();
        assert!(e.cancel_running.is_empty());
        queued += usize::from(e.id.is_some());
    }
    assert_eq!(queued, 1, "one plan of the head");
    // It runs on one replica; the other replica's reconcile leaves it alone.
    let running = a.claim_next().await.unwrap().unwrap();
    let again = b
        .enqueue(super::with_reason(plan(1, 'a'), PlanReason::Reconcile))
        .await
        .unwrap();
    assert_eq!((again.id, again.cancel_running.len()), (None, 0));
    assert_eq!(b.job(running.id).await.unwrap().unwrap().state, "running");
}

#[tokio::test]
async fn replicas_claiming_at_once_never_take_the_same_job() {
    let Some((_db, a, b)) = two_replicas().await else {
        return;
    };
    for mr in 1..=12 {
        a.enqueue(plan(mr, 'a')).await.unwrap();
    }
    let claim_all = |s: Store| {
        tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(c) = s.claim_next().await.unwrap() {
                got.push(c.id);
            }
            got
        })
    };
    let (ga, gb) = (claim_all(a.clone()), claim_all(b.clone()));
    let (ga, gb) = (ga.await.unwrap(), gb.await.unwrap());
    let all: BTreeSet<_> = ga.iter().chain(&gb).copied().collect();
    assert_eq!(ga.len() + gb.len(), 12, "a: {ga:?}, b: {gb:?}");
    assert_eq!(all.len(), 12, "no job was claimed twice");
}

#[tokio::test]
async fn a_dead_replicas_job_is_taken_by_another_after_its_lease() {
    let Some((db, a, b)) = two_replicas().await else {
        return;
    };
    let id = a.enqueue(plan(1, 'a')).await.unwrap().id.unwrap();
    let claimed = a.claim_next().await.unwrap().unwrap();
    assert_eq!(claimed.id, id);
    let run = a
        .start_run(NewRun {
            job: Some(id),
            kind: RunKind::Plan,
            project: ProjectId(1),
            project_path: None,
            mr: Some(MrIid(1)),
            root: "core".into(),
            sha: CommitSha("a".repeat(40)),
        })
        .await
        .unwrap();
    // While a renews its lease, b finds nothing to take.
    for _ in 0..3 {
        tokio::time::sleep(TEST_LEASE / 3).await;
        assert_eq!(a.heartbeat(id).await.unwrap(), Lease::Held);
        assert!(b.claim_next().await.unwrap().is_none());
    }
    // a dies (stops renewing): after the lease, b takes the job, and a's run is over.
    drop(a);
    lease_expires().await;
    let again = b.claim_next().await.unwrap().expect("b takes the job");
    assert_eq!((again.id, again.attempts), (id, 2));
    assert_eq!(
        b.run(run).await.unwrap().unwrap().state,
        RunState::Interrupted
    );
    // Were a still running somewhere, its heartbeat says it lost the job, and its end is ignored.
    let a_again = db.replica("replica-a-zombie").await;
    assert_eq!(a_again.heartbeat(id).await.unwrap(), Lease::Lost);
    a_again
        .finish_job(id, JobEnd::Failed("zombie".into()))
        .await
        .unwrap();
    assert_eq!(b.job(id).await.unwrap().unwrap().state, "running");
    assert_eq!(b.heartbeat(id).await.unwrap(), Lease::Held);
    b.finish_job(id, JobEnd::Done).await.unwrap();
    assert_eq!(b.job(id).await.unwrap().unwrap().state, "done");
}

#[tokio::test]
async fn a_restarting_replica_requeues_only_the_jobs_of_dead_replicas() {
    let Some((db, a, b)) = two_replicas().await else {
        return;
    };
    a.enqueue(plan(1, 'a')).await.unwrap();
    b.enqueue(plan(2, 'b')).await.unwrap();
    let ja = a.claim_next().await.unwrap().unwrap();
    let jb = b.claim_next().await.unwrap().unwrap();
    // A third replica starts while a and b run their jobs: nothing is taken from them.
    let c = db.replica("replica-c").await;
    assert_eq!(c.requeue_interrupted().await.unwrap(), 0);
    assert!(c.mark_interrupted_applies().await.unwrap().is_empty());
    // a dies; once its lease is over, the next start requeues a's job only.
    drop(a);
    lease_expires().await;
    assert_eq!(b.heartbeat(jb.id).await.unwrap(), Lease::Held);
    assert_eq!(c.requeue_interrupted().await.unwrap(), 1);
    assert_eq!(c.job(ja.id).await.unwrap().unwrap().state, "queued");
    assert_eq!(c.job(jb.id).await.unwrap().unwrap().state, "running");
}

#[tokio::test]
async fn a_newer_head_on_one_replica_cancels_the_plan_running_on_another() {
    let Some((_db, a, b)) = two_replicas().await else {
        return;
    };
    let old = a.enqueue(plan(1, 'a')).await.unwrap().id.unwrap();
    assert_eq!(a.claim_next().await.unwrap().unwrap().id, old);
    assert_eq!(a.heartbeat(old).await.unwrap(), Lease::Held);
    // The push of a newer head reaches b.
    let newer = b
        .record_delivery(delivery("push-b"), vec![plan(1, 'b')])
        .await
        .unwrap();
    assert_eq!(newer.cancel_running, vec![old]);
    // a hears of it on its next heartbeat (its worker then fires the job's token).
    assert_eq!(a.heartbeat(old).await.unwrap(), Lease::Canceled);
    a.finish_job(old, JobEnd::Done).await.unwrap();
    assert_eq!(a.job(old).await.unwrap().unwrap().state, "canceled");
    // And the newer head's plan is what either replica claims next.
    let next = a.claim_next().await.unwrap().unwrap();
    assert_eq!(next.job.sha().unwrap().0, "b".repeat(40));
}

#[tokio::test]
async fn applies_of_one_project_are_serialised_across_replicas() {
    let Some((_db, a, b)) = two_replicas().await else {
        return;
    };
    let held = a.lock_project(ProjectId(7)).await.unwrap();
    // Another project is not held up.
    drop(b.lock_project(ProjectId(8)).await.unwrap());
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.lock_project(ProjectId(7)).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!waiting.is_finished(), "b waits while a applies");
    drop(held);
    let b_lock = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("b gets the lock once a releases it")
        .unwrap();
    // b dies holding it: the lock frees when b's lease expires, and a gets it then.
    std::mem::forget(b_lock);
    drop(b);
    let got = tokio::time::timeout(TEST_LEASE * 4, a.lock_project(ProjectId(7)))
        .await
        .expect("a dead replica's lock frees after its lease");
    drop(got.unwrap());
}

#[tokio::test]
async fn a_ci_job_applies_once_across_replicas() {
    let Some((_db, a, b)) = two_replicas().await else {
        return;
    };
    let apply = |s: Store| {
        tokio::spawn(async move {
            s.begin_apply(NewApply {
                ci_job: JobId(4242),
                project: ProjectId(1),
                mr: Some(MrIid(3)),
                sha: CommitSha("c".repeat(40)),
                roots: vec!["core".into()],
            })
            .await
            .unwrap()
        })
    };
    let tasks: Vec<_> = (0..8)
        .map(|i| apply(if i % 2 == 0 { a.clone() } else { b.clone() }))
        .collect();
    let mut began = 0;
    for t in tasks {
        began += usize::from(t.await.unwrap().is_some());
    }
    assert_eq!(began, 1);
}

#[tokio::test]
async fn a_database_from_a_newer_planbot_is_refused() {
    let Some(db) = postgres_db().await else {
        return;
    };
    let store = db.open().await;
    drop(store);
    a_newer_planbot_migrates(&db).await;
    let err = match Store::connect(&db.url, None).await {
        Ok(_) => panic!("a newer schema was opened"),
        Err(e) => e,
    };
    match err.downcast_ref::<SchemaError>() {
        Some(SchemaError::TooNew { found, known }) => {
            assert_eq!((*found, *known), (PG_SCHEMA_VERSION + 1, PG_SCHEMA_VERSION));
        }
        other => panic!("not TooNew: {other:?} ({err:#})"),
    }
}

/// A rolling upgrade: a newer planbot migrates the database while an older replica still runs.
/// The older one must not run jobs whose rows it may no longer understand, and must say why.
#[tokio::test]
async fn a_running_replica_takes_no_more_jobs_once_a_newer_planbot_migrates_the_database() {
    let Some(db) = postgres_db().await else {
        return;
    };
    let old = db.open().await;
    old.ping().await.expect("ready before the upgrade");
    old.enqueue(plan(1, 'a')).await.unwrap().id.unwrap();
    a_newer_planbot_migrates(&db).await;
    // The replica's heartbeat (every third of the lease) reads the schema version.
    let deadline = std::time::Instant::now() + TEST_LEASE * 10;
    let err = loop {
        match old.ping().await {
            Err(e) => break e,
            Ok(()) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "still ready on a newer schema"
                );
                tokio::time::sleep(TEST_LEASE / 10).await;
            }
        }
    };
    assert!(
        format!("{err:#}").contains("written by a newer planbot"),
        "{err:#}"
    );
    match err.downcast_ref::<SchemaError>() {
        Some(SchemaError::TooNew { found, known }) => {
            assert_eq!((*found, *known), (PG_SCHEMA_VERSION + 1, PG_SCHEMA_VERSION));
        }
        other => panic!("not TooNew: {other:?} ({err:#})"),
    }
    assert_eq!(
        old.queue_depth().await.unwrap(),
        1,
        "the job is still queued"
    );
    assert!(
        old.claim_next().await.unwrap().is_none(),
        "the older replica claimed a job on a newer schema"
    );
    assert_eq!(
        old.queue_depth().await.unwrap(),
        1,
        "left for the newer replicas"
    );
}

/// Replicas started at once on a new database: one migrates, the others wait for it and find
/// nothing left to do. Without the migration lock the others run the migrations too, and fail
/// on the tables the first one made.
#[tokio::test]
async fn replicas_starting_together_migrate_once() {
    let Some(db) = postgres_db().await else {
        return;
    };
    let opens: Vec<_> = (0..6)
        .map(|i| {
            let url = db.url.clone();
            tokio::spawn(async move {
                let opts = PgOptions {
                    lease: TEST_LEASE,
                    replica: format!("r{i}"),
                    pool_size: 2,
                };
                Store::connect_with(&url, None, opts).await
            })
        })
        .collect();
    let mut replicas = Vec::new();
    for (i, open) in opens.into_iter().enumerate() {
        match open.await.unwrap() {
            Ok(store) => replicas.push(store),
            Err(e) => panic!("replica r{i} did not start: {e:#}"),
        }
    }
    // The database's own record: each migration once, all in one transaction (one replica's).
    let client = client_of(&db).await;
    let rows = client
        .query(
            "SELECT version, xmin::text FROM refinery_schema_history ORDER BY version",
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, (1..=PG_SCHEMA_VERSION as i32).collect::<Vec<_>>());
    let writers: BTreeSet<String> = rows.iter().map(|r| r.get(1)).collect();
    assert_eq!(writers.len(), 1, "recorded by one transaction: {writers:?}");
    // And every replica works: each queues a job, and they claim each one once between them.
    for (i, store) in replicas.iter().enumerate() {
        store.ping().await.unwrap();
        store.enqueue(plan(i as u64 + 1, 'a')).await.unwrap();
    }
    let mut claimed = BTreeSet::new();
    for store in replicas.iter().cycle().take(replicas.len() * 2) {
        if let Some(c) = store.claim_next().await.unwrap() {
            assert!(claimed.insert(c.id), "{:?} claimed twice", c.id);
        }
    }
    assert_eq!(claimed.len(), replicas.len());
}

/// `planbot store migrate`'s core: every row of a SQLite store, copied into PostgreSQL, reads
/// back the same (and new rows get new ids).
#[tokio::test]
async fn a_sqlite_store_copies_into_postgres_with_every_row() {
    let Some(pg) = postgres_db().await else {
        return;
    };
    let lite = sqlite_db();
    let from = lite.open().await;
    from.record_delivery(delivery("d1"), vec![plan(1, 'a')])
        .await
        .unwrap();
    from.enqueue(plan(2, 'b')).await.unwrap();
    let claimed = from.claim_next().await.unwrap().unwrap();
    let run = from
        .start_run(NewRun {
            job: Some(claimed.id),
            kind: RunKind::Plan,
            project: ProjectId(1),
            project_path: Some("infra/x".into()),
            mr: Some(MrIid(1)),
            root: "core".into(),
            sha: CommitSha("a".repeat(40)),
        })
        .await
        .unwrap();
    from.finish_run(
        run,
        RunEnd {
            state: RunState::Succeeded,
            summary: Some("1 to add".into()),
            log: "log text".into(),
            note_markdown: Some("note".into()),
            fingerprint: None,
        },
    )
    .await
    .unwrap();
    from.finish_job(claimed.id, JobEnd::Done).await.unwrap();
    from.record_fingerprint(ShownFingerprint {
        project: ProjectId(1),
        mr: MrIid(1),
        root: "core".into(),
        sha: CommitSha("a".repeat(40)),
        fingerprint: crate::core::fingerprint::Fingerprint::from_hex(&"e".repeat(64)).unwrap(),
        run: Some(run),
    })
    .await
    .unwrap();
    from.set_mr_note(ProjectId(1), MrIid(1), crate::core::ids::NoteId(5))
        .await
        .unwrap();
    from.begin_apply(NewApply {
        ci_job: JobId(77),
        project: ProjectId(1),
        mr: Some(MrIid(1)),
        sha: CommitSha("a".repeat(40)),
        roots: vec!["core".into()],
    })
    .await
    .unwrap();
    let dump = from.export().await.unwrap();
    let to = pg.open().await;
    to.import(dump.clone()).await.unwrap();
    assert_eq!(to.export().await.unwrap(), dump);
    // Copying twice is refused (the target is not empty).
    assert!(to.import(dump).await.is_err());
    // The copy works as a store: reads, and new ids after the copied ones.
    assert_eq!(to.run(run).await.unwrap().unwrap().log, "log text");
    assert_eq!(
        to.mr_note(ProjectId(1), MrIid(1)).await.unwrap(),
        Some(crate::core::ids::NoteId(5))
    );
    let next = to.enqueue(Job::Reconcile).await.unwrap().id.unwrap();
    assert!(next.0 > claimed.id.0);
    assert!(to
        .begin_apply(NewApply {
            ci_job: JobId(77),
            project: ProjectId(1),
            mr: None,
            sha: CommitSha("a".repeat(40)),
            roots: vec![],
        })
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn replicas_waking_for_one_drift_tick_at_once_queue_it_once() {
    let Some((_db, a, b)) = two_replicas().await else {
        return;
    };
    let tick = 1_796_450_400_000; // 2026-12-05 06:00 UTC
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            store.claim_drift_tick(tick).await.unwrap()
        }));
    }
    let mut claimed = Vec::new();
    for t in tasks {
        claimed.extend(t.await.unwrap());
    }
    assert_eq!(claimed.len(), 1, "exactly one replica claims the tick");
    let job = b.job(claimed[0]).await.unwrap().unwrap();
    assert_eq!(job.kind, "drift_tick");
    assert_eq!(a.queue_depth().await.unwrap(), 1);
    assert_eq!(a.last_drift_tick().await.unwrap(), Some(tick));
    // The next occurrence is a new tick.
    assert!(b
        .claim_drift_tick(tick + 86_400_000)
        .await
        .unwrap()
        .is_some());
    assert_eq!(a.last_drift_tick().await.unwrap(), Some(tick + 86_400_000));
}

/// A job queued on one replica is told to the other the moment its transaction commits: the
/// other's idle workers need not wait for their next look at the queue.
#[tokio::test]
async fn a_job_queued_on_one_replica_is_told_to_the_other() {
    let Some((_db, a, b)) = two_replicas().await else {
        return;
    };
    let mut told = b.job_notices().expect("a shared store tells of new jobs");
    let wait = Duration::from_secs(30);
    // b listens (its first value says so).
    tokio::time::timeout(wait, told.wait_for(|n| *n >= 1))
        .await
        .expect("b listens")
        .unwrap();
    told.borrow_and_update();
    a.enqueue(plan(1, 'a')).await.unwrap();
    tokio::time::timeout(wait, told.changed())
        .await
        .expect("b is told of a's job")
        .unwrap();
    assert!(sqlite_db().open().await.job_notices().is_none());
}

/// A unit's end is told to the plan job's replica when it commits: the job need not look at
/// its units again to learn it.
#[tokio::test]
async fn a_units_end_is_told_to_its_plan_jobs_replica() {
    let Some((_db, a, b)) = two_replicas().await else {
        return;
    };
    let mut told = a
        .job_notices()
        .expect("a shared store tells of units' ends");
    let wait = Duration::from_secs(30);
    let (parent, id) = planning_with_a_unit(&a).await;
    assert_eq!(b.claim_within(1).await.unwrap().unwrap().id, id);
    // Every notice so far is in (a listening, then its two jobs), then b's end is told.
    tokio::time::timeout(wait, told.wait_for(|n| *n >= 3))
        .await
        .expect("a listens, and is told of its own jobs")
        .unwrap();
    assert!(b.finish_unit(id, parent, "sealed".into()).await.unwrap());
    tokio::time::timeout(wait, told.wait_for(|n| *n >= 4))
        .await
        .expect("a is told of the unit's end")
        .unwrap();
}

/// A plan job claimed on `a` and one root unit it queued: `(parent, unit)`.
async fn planning_with_a_unit(a: &Store) -> (QueueJobId, QueueJobId) {
    let parent = a.enqueue(plan(1, 'a')).await.unwrap().id.unwrap();
    assert_eq!(a.claim_next().await.unwrap().unwrap().id, parent);
    let unit = a
        .enqueue(unit(parent, "a", None))
        .await
        .unwrap()
        .id
        .unwrap();
    (parent, unit)
}

/// A root unit of `parent`'s plan job.
fn unit(parent: QueueJobId, root: &str, author: Option<u64>) -> Job {
    let Job::Plan(mut p) = plan(1, 'a') else {
        unreachable!()
    };
    p.requested_by = author.map(crate::core::ids::UserId);
    Job::PlanRoot(crate::core::events::RootUnit {
        plan: p,
        parent: parent.0,
        root: root.into(),
        commit: CommitSha("c".repeat(40)),
        default_branch: "main".into(),
        config_at: CommitSha("d".repeat(40)),
    })
}

/// One MR's roots over the replicas: the units a plan job queues are never claimed by its own
/// replica's workers (its job plans them), another replica takes them within its share of
/// one author's units, the job takes back the rest, and a result is handed over once.
#[tokio::test]
async fn a_plan_jobs_units_go_to_other_replicas_and_back_to_it() {
    let Some((_db, a, b)) = two_replicas().await else {
        return;
    };
    let parent = a.enqueue(plan(1, 'a')).await.unwrap().id.unwrap();
    assert_eq!(a.claim_next().await.unwrap().unwrap().id, parent);
    let first = a
        .enqueue(unit(parent, "a", Some(7)))
        .await
        .unwrap()
        .id
        .unwrap();
    let second = a
        .enqueue(unit(parent, "b", Some(7)))
        .await
        .unwrap()
        .id
        .unwrap();
    // Not to a's workers; b takes one, then no more of author 7's (a share of 1).
    assert!(a.claim_next().await.unwrap().is_none());
    let taken = b.claim_within(1).await.unwrap().unwrap();
    assert_eq!(taken.id, first);
    assert!(matches!(taken.job, Job::PlanRoot(ref u) if u.root == "a"));
    assert!(b.claim_within(1).await.unwrap().is_none());
    // The plan job cannot take back the one b runs; it takes the other.
    assert!(!a.take_unit(first, "planned by its plan job").await.unwrap());
    assert!(a
        .take_unit(second, "planned by its plan job")
        .await
        .unwrap());
    assert!(b.claim_next().await.unwrap().is_none());
    // b hands its result over; the plan job reads it once.
    assert!(b.finish_unit(first, parent, "sealed".into()).await.unwrap());
    let progress = a.unit_progress(parent).await.unwrap();
    assert_eq!(
        progress,
        vec![
            (first, UnitProgress::Ended { result: true }),
            (second, UnitProgress::Ended { result: false }),
        ]
    );
    assert_eq!(
        a.take_unit_result(first).await.unwrap().as_deref(),
        Some("sealed")
    );
    assert_eq!(a.take_unit_result(first).await.unwrap(), None);
    // A unit canceled meanwhile hands nothing over.
    let third = a
        .enqueue(unit(parent, "c", Some(7)))
        .await
        .unwrap()
        .id
        .unwrap();
    assert_eq!(b.claim_within(1).await.unwrap().unwrap().id, third);
    a.end_units(parent, "its plan job ended", false)
        .await
        .unwrap();
    assert!(!b.finish_unit(third, parent, "late".into()).await.unwrap());
    assert_eq!(b.heartbeat(third).await.unwrap(), Lease::Canceled);
    assert_eq!(a.take_unit_result(third).await.unwrap(), None);
}

/// A unit whose replica is gone (its lease ran out) goes back to its plan job.
#[tokio::test]
async fn a_unit_of_a_dead_replica_goes_back_to_its_plan_job() {
    let Some((_db, a, b)) = two_replicas().await else {
        return;
    };
    let (parent, id) = planning_with_a_unit(&a).await;
    assert_eq!(b.claim_next().await.unwrap().unwrap().id, id);
    assert_eq!(
        a.unit_progress(parent).await.unwrap(),
        vec![(id, UnitProgress::Running { lapsed: false })]
    );
    drop(b);
    // a keeps its own job's lease; b's unit lapses.
    let keep = async {
        loop {
            a.heartbeat(parent).await.unwrap();
            tokio::time::sleep(TEST_LEASE / 4).await;
        }
    };
    tokio::select! {
        _ = keep => unreachable!(),
        _ = lease_expires() => {}
    }
    assert_eq!(
        a.unit_progress(parent).await.unwrap(),
        vec![(id, UnitProgress::Running { lapsed: true })]
    );
    assert!(a.take_unit(id, "planned by its plan job").await.unwrap());
}
