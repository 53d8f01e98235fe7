//! The store's tests through its facade, each run against both backends (SQLite, and the
//! PostgreSQL named by `PLANBOT_TEST_POSTGRES_URL`): queue semantics, restarts, reviews and
//! applies; then what only N replicas on one PostgreSQL can do, and TLS to that server.

use super::*;
use crate::core::events::{Job, PlanJob, PlanReason};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId};

pub(crate) mod backends;
mod replicas;
mod tls;

use backends::test_dbs;

pub(crate) fn plan(mr: u64, head: char) -> Job {
    Job::Plan(PlanJob {
        project: ProjectId(1),
        project_path: Some("infra/homelab".into()),
        mr: MrIid(mr),
        head: CommitSha(head.to_string().repeat(40)),
        target_branch: Some("main".into()),
        source_project: Some(ProjectId(1)),
        fork: false,
        draft: false,
        reason: PlanReason::Opened,
        requested_by: None,
    })
}

pub(crate) fn delivery(key: &str) -> NewDelivery {
    NewDelivery {
        key: key.into(),
        event: "merge_request".into(),
        outcome: "enqueued".into(),
        project: Some(ProjectId(1)),
        mr: Some(MrIid(1)),
    }
}

#[tokio::test]
async fn duplicate_deliveries_enqueue_once() {
    for db in test_dbs().await {
        let store = db.open().await;
        let a = store
            .record_delivery(delivery("k1"), vec![plan(1, 'a')])
            .await
            .unwrap();
        assert!(!a.duplicate);
        assert_eq!(a.enqueued.len(), 1);
        let b = store
            .record_delivery(delivery("k1"), vec![plan(1, 'a')])
            .await
            .unwrap();
        assert!(b.duplicate);
        assert_eq!(store.queue_depth().await.unwrap(), 1);
        assert_eq!(store.delivery_count().await.unwrap(), 1);
    }
}

#[tokio::test]
async fn a_newer_head_supersedes_queued_and_running_plans_of_the_mr_only() {
    for db in test_dbs().await {
        let store = db.open().await;
        let first = store.enqueue(plan(1, 'a')).await.unwrap().id.unwrap();
        let other_mr = store.enqueue(plan(2, 'b')).await.unwrap().id.unwrap();
        let claimed = store.claim_next().await.unwrap().unwrap();
        assert_eq!(claimed.id, first);
        let queued_old = store.enqueue(plan(1, 'c')).await.unwrap();
        // The running plan of head a is superseded (its token must fire).
        assert_eq!(queued_old.cancel_running, vec![first]);
        let newest = store.enqueue(plan(1, 'd')).await.unwrap();
        assert!(newest.cancel_running.is_empty());
        assert_eq!(
            store
                .job(queued_old.id.unwrap())
                .await
                .unwrap()
                .unwrap()
                .state,
            "canceled"
        );
        assert_eq!(store.job(first).await.unwrap().unwrap().state, "canceled");
        assert_eq!(store.job(other_mr).await.unwrap().unwrap().state, "queued");
        // A canceled job that finishes later stays canceled.
        store.finish_job(first, JobEnd::Done).await.unwrap();
        assert_eq!(store.job(first).await.unwrap().unwrap().state, "canceled");
        // An identical queued job is not added twice.
        assert_eq!(store.enqueue(plan(1, 'd')).await.unwrap().id, None);
    }
}

fn with_reason(job: Job, reason: PlanReason) -> Job {
    match job {
        Job::Plan(p) => Job::Plan(PlanJob { reason, ..p }),
        other => other,
    }
}

#[tokio::test]
async fn a_second_plan_of_a_head_is_dropped_unless_its_inputs_changed_or_a_person_asked() {
    for db in test_dbs().await {
        let store = db.open().await;
        let first = store.enqueue(plan(1, 'a')).await.unwrap().id.unwrap();
        assert_eq!(store.claim_next().await.unwrap().unwrap().id, first);
        // The same head again (an `update` hook of the head it already has): nothing new, and
        // the running plan goes on.
        let again = with_reason(plan(1, 'a'), PlanReason::NewCommits);
        let e = store.enqueue(again).await.unwrap();
        assert_eq!((e.id, e.cancel_running.len()), (None, 0));
        // A catch-up of that head is dropped too, while it runs and after it is done.
        let missed = with_reason(plan(1, 'a'), PlanReason::MissedHead);
        assert_eq!(store.enqueue(missed.clone()).await.unwrap().id, None);
        store.finish_job(first, JobEnd::Done).await.unwrap();
        assert_eq!(store.enqueue(missed).await.unwrap().id, None);
        let reconcile = with_reason(plan(1, 'a'), PlanReason::Reconcile);
        assert_eq!(store.enqueue(reconcile).await.unwrap().id, None);
        // A person asking, or a new target, plans the head again.
        let asked = with_reason(plan(1, 'a'), PlanReason::Command);
        assert!(store.enqueue(asked).await.unwrap().id.is_some());
        let retarget = with_reason(plan(1, 'a'), PlanReason::TargetBranchChanged);
        assert!(store.enqueue(retarget).await.unwrap().id.is_some());
        // A catch-up of a head nobody planned is queued.
        let unplanned = with_reason(plan(1, 'b'), PlanReason::MissedHead);
        assert!(store.enqueue(unplanned).await.unwrap().id.is_some());
    }
}

#[tokio::test]
async fn running_jobs_are_requeued_after_a_restart() {
    for db in test_dbs().await {
        {
            let store = db.open().await;
            store.enqueue(plan(1, 'a')).await.unwrap();
            let c = store.claim_next().await.unwrap().unwrap();
            let run = store
                .start_run(NewRun {
                    job: Some(c.id),
                    kind: RunKind::Plan,
                    project: ProjectId(1),
                    project_path: None,
                    mr: Some(MrIid(1)),
                    root: "core".into(),
                    sha: CommitSha("a".repeat(40)),
                })
                .await
                .unwrap();
            assert_eq!(
                store.run(run).await.unwrap().unwrap().state,
                RunState::Running
            );
        }
        let store = db.open().await;
        assert_eq!(store.requeue_interrupted().await.unwrap(), 1);
        let again = store.claim_next().await.unwrap().unwrap();
        assert_eq!(again.attempts, 2);
        assert_eq!(
            store.recent_runs(10).await.unwrap()[0].state,
            RunState::Interrupted
        );
    }
}

#[tokio::test]
async fn fingerprints_note_ids_and_applies() {
    for db in test_dbs().await {
        let store = db.open().await;
        let fp = |c: char| Fingerprint::from_hex(&c.to_string().repeat(64)).unwrap();
        for (sha, f) in [('1', 'a'), ('2', 'b')] {
            store
                .record_fingerprint(ShownFingerprint {
                    project: ProjectId(1),
                    mr: MrIid(3),
                    root: "core".into(),
                    sha: CommitSha(sha.to_string().repeat(40)),
                    fingerprint: fp(f),
                    run: None,
                })
                .await
                .unwrap();
        }
        let last = store
            .last_shown_fingerprint(ProjectId(1), MrIid(3), "core")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(last.fingerprint, fp('b'));
        assert!(store
            .last_shown_fingerprint(ProjectId(1), MrIid(3), "edge")
            .await
            .unwrap()
            .is_none());
        let exact = store
            .fingerprint_for(ProjectId(1), MrIid(3), "core", CommitSha("1".repeat(40)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(exact.fingerprint, fp('a'));

        assert_eq!(store.mr_note(ProjectId(1), MrIid(3)).await.unwrap(), None);
        store
            .set_mr_note(ProjectId(1), MrIid(3), NoteId(77))
            .await
            .unwrap();
        assert_eq!(
            store.mr_note(ProjectId(1), MrIid(3)).await.unwrap(),
            Some(NoteId(77))
        );

        let a = NewApply {
            ci_job: JobId(9),
            project: ProjectId(1),
            mr: Some(MrIid(3)),
            sha: CommitSha("2".repeat(40)),
            roots: vec!["core".into()],
        };
        let id = store.begin_apply(a.clone()).await.unwrap().unwrap();
        assert_eq!(
            store.begin_apply(a).await.unwrap(),
            None,
            "one CI job applies once"
        );
        let interrupted = store.mark_interrupted_applies().await.unwrap();
        assert_eq!(interrupted.len(), 1);
        assert_eq!(interrupted[0].id, id);
        assert_eq!(interrupted[0].state, ApplyState::Interrupted);
        assert_eq!(
            store.apply_for_job(JobId(9)).await.unwrap().unwrap().roots,
            vec!["core"]
        );
    }
}

#[tokio::test]
async fn policy_verdicts_per_head_and_approvals_per_plan() {
    use crate::core::ids::UserId;
    use crate::core::policy::review::{RecordedSet, RecordedVerdict, SetOrigin, SetState};
    for db in test_dbs().await {
        let store = db.open().await;
        let fp = |c: char| Fingerprint::from_hex(&c.to_string().repeat(64)).unwrap();
        let head = CommitSha("1".repeat(40));
        let failed = RecordedVerdict {
            sets: vec![RecordedSet {
                name: "no-deletes".into(),
                origin: SetOrigin::Repository,
                path: "policies".into(),
                namespace: "main".into(),
                owners: vec![crate::core::policy::Owner::User("alice".into())],
                state: SetState::Failed,
                failures: vec!["vm 101 destroyed".into()],
                failures_more: 0,
                warnings: vec![],
                warnings_more: 0,
                error: None,
            }],
        };
        let record = |root: &str, f: char, verdict: RecordedVerdict| PolicyVerdictRecord {
            project: ProjectId(1),
            mr: MrIid(4),
            root: root.into(),
            sha: head.clone(),
            fingerprint: fp(f),
            verdict,
        };
        store
            .record_policy_verdict(record("core", 'a', RecordedVerdict::default()))
            .await
            .unwrap();
        // A re-plan of the same head replaces the root's verdict.
        store
            .record_policy_verdict(record("core", 'b', failed.clone()))
            .await
            .unwrap();
        store
            .record_policy_verdict(record("edge", 'c', RecordedVerdict::default()))
            .await
            .unwrap();
        let read = store
            .policy_verdicts(ProjectId(1), MrIid(4), &head)
            .await
            .unwrap();
        assert_eq!(
            read,
            vec![
                record("core", 'b', failed),
                record("edge", 'c', RecordedVerdict::default())
            ]
        );
        assert!(store
            .policy_verdicts(ProjectId(1), MrIid(4), &CommitSha("2".repeat(40)))
            .await
            .unwrap()
            .is_empty());

        let approval = PolicyApproval {
            project: ProjectId(1),
            mr: MrIid(4),
            root: "core".into(),
            sha: head.clone(),
            fingerprint: fp('b'),
            set: "no-deletes".into(),
            approver_id: UserId(7),
            approver: "alice".into(),
            approved_at: 0,
        };
        assert!(store
            .record_policy_approval(approval.clone())
            .await
            .unwrap());
        assert!(
            !store
                .record_policy_approval(approval.clone())
                .await
                .unwrap(),
            "the same approval twice is recorded once"
        );
        let later = PolicyApproval {
            sha: CommitSha("2".repeat(40)),
            fingerprint: fp('d'),
            ..approval.clone()
        };
        assert!(store.record_policy_approval(later.clone()).await.unwrap());
        let all = store
            .policy_approvals(ProjectId(1), MrIid(4))
            .await
            .unwrap();
        assert_eq!(all.len(), 2);
        assert!(all[0].approved_at > 0, "the store sets the time");
        let strip = |a: &PolicyApproval| PolicyApproval {
            approved_at: 0,
            ..a.clone()
        };
        assert_eq!(
            all.iter().map(strip).collect::<Vec<_>>(),
            [approval, later],
            "oldest first"
        );
        assert!(store
            .policy_approvals(ProjectId(1), MrIid(5))
            .await
            .unwrap()
            .is_empty());
    }
}

#[tokio::test]
async fn job_rows_read_back_typed() {
    for db in test_dbs().await {
        let store = db.open().await;
        let id = store.enqueue(plan(1, 'a')).await.unwrap().id.unwrap();
        let row = store.job(id).await.unwrap().unwrap();
        assert_eq!(row.queue_kind(), Ok(QueueJobKind::Plan));
        assert_eq!(row.queue_state(), Ok(QueueJobState::Queued));
        store.claim_next().await.unwrap().unwrap();
        store
            .finish_job(id, JobEnd::Failed("no".into()))
            .await
            .unwrap();
        let row = store.job(id).await.unwrap().unwrap();
        assert_eq!(row.queue_state(), Ok(QueueJobState::Failed));
        assert_eq!(row.detail.as_deref(), Some("no"));
    }
}

#[test]
fn a_log_longer_than_the_store_keeps_is_cut_in_the_middle_and_says_so() {
    let log = format!(
        "{}é{}",
        "a".repeat(3 * 1024 * 1024),
        "z".repeat(1024 * 1024)
    );
    let kept = head_and_tail(&log, STORED_LOG_MAX);
    assert!(kept.len() < STORED_LOG_MAX + 200, "{}", kept.len());
    assert!(kept.starts_with(&"a".repeat(1024 * 1024)));
    assert!(kept.ends_with(&"z".repeat(1024 * 1024)));
    assert!(
        kept.contains("\n(… 2.0 MiB of this log left out: planbot keeps the first and the last 1 MiB of a stored log …)\n"),
        "{}",
        &kept[1024 * 1024 - 10..1024 * 1024 + 120]
    );
}

#[tokio::test]
async fn a_drift_tick_is_claimed_once_with_its_job_and_is_the_last_tick() {
    for db in test_dbs().await {
        let store = db.open().await;
        assert_eq!(store.last_drift_tick().await.unwrap(), None);
        let job = store.claim_drift_tick(1_000).await.unwrap().unwrap();
        assert_eq!(store.claim_drift_tick(1_000).await.unwrap(), None);
        let claimed = store.claim_next().await.unwrap().unwrap();
        assert_eq!(claimed.id, job);
        assert_eq!(claimed.job, Job::DriftTick { at: 1_000 });
        assert_eq!(store.last_drift_tick().await.unwrap(), Some(1_000));
        // The claim is kept after a restart: no replica claims that tick again.
        drop(store);
        let store = db.open().await;
        assert_eq!(store.claim_drift_tick(1_000).await.unwrap(), None);
        assert_eq!(store.last_drift_tick().await.unwrap(), Some(1_000));
    }
}

#[tokio::test]
async fn a_roots_last_drift_check_is_kept_and_a_failed_check_keeps_the_last_complete_one() {
    for db in test_dbs().await {
        let store = db.open().await;
        let check = |root: &str, outcome, drifted, at, ok| DriftRootRecord {
            project: ProjectId(7),
            project_path: "infra/homelab".into(),
            root: root.into(),
            outcome,
            drifted,
            checked_at: at,
            checked_ok_at: ok,
        };
        store
            .record_drift_root(check("core", DriftOutcome::Drifted, 3, 1_000, Some(1_000)))
            .await
            .unwrap();
        store
            .record_drift_root(check("lab", DriftOutcome::Clean, 0, 1_000, Some(1_000)))
            .await
            .unwrap();
        // A later check of core could not run: its last complete check stays the first one.
        store
            .record_drift_root(check("core", DriftOutcome::CouldNotCheck, 0, 2_000, None))
            .await
            .unwrap();
        let roots = store.drift_roots().await.unwrap();
        assert_eq!(
            roots,
            vec![
                check("core", DriftOutcome::CouldNotCheck, 0, 2_000, Some(1_000)),
                check("lab", DriftOutcome::Clean, 0, 1_000, Some(1_000)),
            ],
            "{}",
            db.kind
        );
        // The repository stops checking lab.
        store
            .forget_drift_roots(ProjectId(7), vec!["core".into()])
            .await
            .unwrap();
        let roots = store.drift_roots().await.unwrap();
        assert_eq!(roots.len(), 1, "{}", db.kind);
        assert_eq!(roots[0].root, "core");
    }
}

/// A plan of MR `mr` (project 1) whose author is `author`.
fn plan_by(mr: u64, head: char, author: u64) -> Job {
    let Job::Plan(mut p) = plan(mr, head) else {
        unreachable!()
    };
    p.requested_by = Some(crate::core::ids::UserId(author));
    Job::Plan(p)
}

#[tokio::test]
async fn a_claim_skips_the_jobs_of_an_author_or_an_mr_that_holds_its_share() {
    for db in test_dbs().await {
        let store = db.open().await;
        let id = |e: Enqueued| e.id.unwrap();
        let x1 = id(store.enqueue(plan_by(1, 'a', 7)).await.unwrap());
        let x2 = id(store.enqueue(plan_by(2, 'b', 7)).await.unwrap());
        // Someone else's command on MR 1, and planbot's own re-plan of MR 4.
        let cmd = id(store
            .enqueue(Job::Command {
                project: ProjectId(1),
                project_path: None,
                mr: MrIid(1),
                note: None,
                author: crate::core::ids::UserId(9),
                command: crate::core::events::Command::Help,
                head: None,
                written_at: None,
                fork: false,
                plan_args: None,
            })
            .await
            .unwrap());
        let y = id(store.enqueue(plan_by(3, 'c', 8)).await.unwrap());
        let own = id(store.enqueue(plan(4, 'd')).await.unwrap());
        let claim = || async { store.claim_within(1).await.unwrap().map(|c| c.id) };
        assert_eq!(claim().await, Some(x1));
        // Author 7 holds one (x2 waits), MR 1 holds one (the command waits).
        assert_eq!(claim().await, Some(y));
        assert_eq!(claim().await, Some(own));
        assert_eq!(
            claim().await,
            None,
            "x2 and the command wait for their share"
        );
        assert_eq!(store.queue_depth().await.unwrap(), 2);
        // Whoever's it is, `claim_next` takes the oldest.
        store.finish_job(x1, JobEnd::Done).await.unwrap();
        assert_eq!(claim().await, Some(x2));
        assert_eq!(store.claim_next().await.unwrap().map(|c| c.id), Some(cmd));
    }
}

#[tokio::test]
async fn a_targeting_is_kept_per_head_and_root_and_the_next_comment_replaces_it() {
    use crate::core::targeting::Targeting;
    for db in test_dbs().await {
        let store = db.open().await;
        let (p, mr) = (ProjectId(1), MrIid(6));
        let (h1, h2) = (CommitSha("1".repeat(40)), CommitSha("2".repeat(40)));
        let t = Targeting::parse(&["-exclude=terraform_data.b"]).unwrap();
        let author = crate::core::ids::UserId(7);
        let both = [("core".to_string(), t.clone()), ("dns".into(), t.clone())];
        store
            .set_plan_targeting(p, mr, &h1, author, &both)
            .await
            .unwrap();
        assert_eq!(store.plan_targeting(p, mr, &h1, "core").await.unwrap(), t);
        assert_eq!(store.plan_targeting(p, mr, &h1, "dns").await.unwrap(), t);
        // Another head, another root, another MR: a full plan.
        let full = Targeting::default();
        assert_eq!(
            store.plan_targeting(p, mr, &h2, "core").await.unwrap(),
            full
        );
        assert_eq!(
            store.plan_targeting(p, mr, &h1, "edge").await.unwrap(),
            full
        );
        assert_eq!(
            store
                .plan_targeting(p, MrIid(7), &h1, "core")
                .await
                .unwrap(),
            full
        );
        // The next comment (on a newer head) replaces every row of the MR.
        let one = [(
            "dns".to_string(),
            Targeting::parse(&["-target=a.b"]).unwrap(),
        )];
        store
            .set_plan_targeting(p, mr, &h2, author, &one)
            .await
            .unwrap();
        assert_eq!(
            store.plan_targeting(p, mr, &h1, "core").await.unwrap(),
            full
        );
        assert_eq!(
            store.plan_targeting(p, mr, &h2, "dns").await.unwrap(),
            one[0].1
        );
        // A plain `planbot plan`: every root in full.
        store
            .set_plan_targeting(p, mr, &h2, author, &[])
            .await
            .unwrap();
        assert_eq!(store.plan_targeting(p, mr, &h2, "dns").await.unwrap(), full);
        // `planbot store migrate` copies the rows.
        store
            .set_plan_targeting(p, mr, &h2, author, &one)
            .await
            .unwrap();
        let dump = store.export().await.unwrap();
        let rows = dump
            .tables
            .iter()
            .find(|(t, _)| t == "plan_targeting")
            .map(|(_, r)| r.len());
        assert_eq!(rows, Some(1));
    }
}

#[tokio::test]
async fn widget_reports_are_served_once_the_heads_plan_job_has_ended() {
    for db in test_dbs().await {
        let store = db.open().await;
        let head = CommitSha("a".repeat(40));
        let (p, mr) = (ProjectId(1), MrIid(1));
        let none = store.widgets_for(p, mr, head.clone()).await.unwrap();
        assert_eq!(none, WidgetReports::default(), "{}", db.kind);
        store.enqueue(plan(1, 'a')).await.unwrap();
        let claimed = store.claim_next().await.unwrap().unwrap();
        let report = |create| crate::core::widgets::RootWidgets {
            terraform: crate::core::widgets::TerraformReport {
                create,
                update: 0,
                delete: 1,
            },
            issues: vec![],
        };
        store
            .record_widgets(p, mr, "prod", &head, &report(2))
            .await
            .unwrap();
        store
            .record_widgets(p, mr, "lab", &head, &report(1))
            .await
            .unwrap();
        // Written while the job runs: the reports are not whole yet.
        let running = store.widgets_for(p, mr, head.clone()).await.unwrap();
        assert!(running.pending, "{}", db.kind);
        store.finish_job(claimed.id, JobEnd::Done).await.unwrap();
        // Replaced by a second record of the same (root, head); other heads and MRs apart.
        store
            .record_widgets(p, mr, "lab", &head, &report(3))
            .await
            .unwrap();
        store
            .record_widgets(p, MrIid(2), "lab", &head, &report(9))
            .await
            .unwrap();
        let done = store.widgets_for(p, mr, head.clone()).await.unwrap();
        assert!(!done.pending, "{}", db.kind);
        assert_eq!(
            done.roots,
            vec![
                ("lab".to_string(), report(3)),
                ("prod".to_string(), report(2))
            ],
            "{}",
            db.kind
        );
        let other_head = store
            .widgets_for(p, mr, CommitSha("b".repeat(40)))
            .await
            .unwrap();
        assert!(other_head.roots.is_empty(), "{}", db.kind);
    }
}
