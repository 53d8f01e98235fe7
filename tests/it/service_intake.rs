//! Stories of `POST /webhooks/gitlab` against a real service on loopback with a real SQLite file.

use crate::support::service::*;
use planbot::core::events::{Job, PlanReason};
use planbot::flows::service::server::Options;

const MR: &str = "Merge Request Hook";

fn quiet() -> Options {
    // No workers: the queue stays as the deliveries left it, so the test can look at it.
    Options {
        workers: false,
        reconcile: false,
    }
}

async fn jobs(s: &TestService) -> Vec<planbot::capabilities::store::JobRow> {
    s.app.store.recent_jobs(100).await.unwrap()
}

#[tokio::test]
async fn a_wrong_or_missing_token_is_refused_and_nothing_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    let body = fixture("webhooks/merge_request_open.json");

    let status = s
        .deliver(&body, &token_headers(MR, "k-bad", "not-the-secret"))
        .await;
    assert_eq!(status, 401);
    let mut no_token = token_headers(MR, "k-none", "x");
    no_token.retain(|(k, _)| *k != "X-Gitlab-Token");
    assert_eq!(s.deliver(&body, &no_token).await, 401);

    assert_eq!(s.app.store.delivery_count().await.unwrap(), 0);
    assert!(jobs(&s).await.is_empty());
    let metrics = s.metrics().await;
    assert!(
        metrics.contains(
            r#"planbot_webhook_deliveries_total{event="merge_request",outcome="unauthorized"} 2"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_right_token_records_the_delivery_and_queues_a_plan_for_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    let body = fixture("webhooks/merge_request_open.json");
    let started = std::time::Instant::now();
    let status = s
        .deliver(
            &body,
            &token_headers(MR, "a5461c4d-9c7f-4af9-add6-cddebe3c426f", WEBHOOK_SECRET),
        )
        .await;
    assert_eq!(status, 200);
    assert!(started.elapsed() < std::time::Duration::from_secs(2));

    let jobs = jobs(&s).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].kind, "plan");
    assert_eq!(jobs[0].state, "queued");
    match &jobs[0].job {
        Some(Job::Plan(p)) => {
            assert_eq!(p.project.0, 2);
            assert_eq!(p.mr.0, 16);
            assert_eq!(p.head.as_str(), "e59094b8de0f2f91abbe4760a52d9137260252d8");
            assert_eq!(p.reason, PlanReason::Opened);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.app
            .store
            .delivery_outcome("a5461c4d-9c7f-4af9-add6-cddebe3c426f")
            .await
            .unwrap()
            .as_deref(),
        Some("enqueued")
    );
}

#[tokio::test]
async fn a_standard_webhooks_signature_with_several_entries_one_right_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), true), quiet()).await;
    let body = fixture("webhooks/merge_request_open.json");
    let headers = signed_headers(
        MR,
        "msg-1",
        &body,
        unix_now(),
        &["v1,c29tZSBvdGhlciBrZXkncyBzaWduYXR1cmU=", "v1,bm9wZQ=="],
    );
    assert_eq!(s.deliver(&body, &headers).await, 200);
    assert_eq!(jobs(&s).await.len(), 1);

    // With a signing token configured, the plain token alone is not enough.
    let status = s
        .deliver(&body, &token_headers(MR, "msg-2", WEBHOOK_SECRET))
        .await;
    assert_eq!(status, 401);
    // A body changed after signing is refused.
    let headers = signed_headers(MR, "msg-3", &body, unix_now(), &[]);
    assert_eq!(
        s.deliver(&body.replace("booking", "b00king"), &headers)
            .await,
        401
    );
    assert_eq!(s.app.store.delivery_count().await.unwrap(), 1);
}

#[tokio::test]
async fn a_signature_older_than_five_minutes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), true), quiet()).await;
    let body = fixture("webhooks/merge_request_open.json");
    let headers = signed_headers(MR, "msg-old", &body, unix_now() - 301, &[]);
    assert_eq!(s.deliver(&body, &headers).await, 401);
    let headers = signed_headers(MR, "msg-ok", &body, unix_now() - 240, &[]);
    assert_eq!(s.deliver(&body, &headers).await, 200);
    assert_eq!(s.app.store.delivery_count().await.unwrap(), 1);
}

#[tokio::test]
async fn the_same_idempotency_key_twice_makes_one_job() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    let body = fixture("webhooks/merge_request_open.json");
    for _ in 0..2 {
        // GitLab's retries and manual resends keep the Idempotency-Key (the webhook UUID changes).
        assert_eq!(
            s.deliver(&body, &token_headers(MR, "same-key", WEBHOOK_SECRET))
                .await,
            200
        );
    }
    assert_eq!(jobs(&s).await.len(), 1);
    assert_eq!(s.app.store.delivery_count().await.unwrap(), 1);
    let metrics = s.metrics().await;
    assert!(metrics.contains(r#"outcome="duplicate"} 1"#), "{metrics}");
}

#[tokio::test]
async fn an_authentic_body_planbot_cannot_parse_is_answered_200_and_recorded_as_unparseable() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    let status = s
        .deliver(
            "{\"object_kind\": \"merge_request\", truncated",
            &token_headers(MR, "garbled", WEBHOOK_SECRET),
        )
        .await;
    assert_eq!(status, 200, "GitLab disables hooks that answer 4xx/5xx");
    assert!(jobs(&s).await.is_empty());
    let outcome = s
        .app
        .store
        .delivery_outcome("garbled")
        .await
        .unwrap()
        .unwrap();
    assert!(outcome.starts_with("unparseable:"), "{outcome}");
    let metrics = s.metrics().await;
    assert!(
        metrics.contains(r#"{event="merge_request",outcome="unparseable"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn events_of_projects_outside_the_allowlist_are_ignored_with_200() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_config(dir.path(), &dead_url())
        .set("gitlab", "projects", r#"["infra/homelab", 4242]"#)
        .load();
    let s = TestService::start(cfg, quiet()).await;
    let body = fixture("webhooks/merge_request_open.json");
    assert_eq!(
        s.deliver(&body, &token_headers(MR, "other-project", WEBHOOK_SECRET))
            .await,
        200
    );
    assert!(jobs(&s).await.is_empty());
    let outcome = s
        .app
        .store
        .delivery_outcome("other-project")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        outcome,
        "ignored: project flightjs/flight-management is not in gitlab.projects"
    );
}

#[tokio::test]
async fn label_and_review_updates_are_recorded_but_plan_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    for (i, f) in [
        "webhooks/merge_request_unapproved_system.partial.json",
        "webhooks/merge_request_reviewers_state.partial.json",
        "webhooks/merge_request_review_submitted.partial.json",
        "webhooks/merge_request_update_oldrev.partial.json",
    ]
    .iter()
    .enumerate()
    {
        let status = s
            .deliver(
                &fixture(f),
                &token_headers(MR, &format!("partial-{i}"), WEBHOOK_SECRET),
            )
            .await;
        assert_eq!(status, 200, "{f}");
    }
    let push = fixture("webhooks/push.json");
    assert_eq!(
        s.deliver(&push, &token_headers("Push Hook", "push-1", WEBHOOK_SECRET))
            .await,
        200
    );
    assert_eq!(s.app.store.delivery_count().await.unwrap(), 5);
    assert!(jobs(&s).await.is_empty());
}

#[tokio::test]
async fn a_push_with_a_newer_head_supersedes_the_queued_plan_of_the_older_head() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    let old = "e59094b8de0f2f91abbe4760a52d9137260252d8";
    let new = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";
    assert_eq!(
        s.deliver(
            &mr_event(old, "open"),
            &token_headers(MR, "d-open", WEBHOOK_SECRET)
        )
        .await,
        200
    );
    assert_eq!(
        s.deliver(
            &mr_event(new, "update"),
            &token_headers(MR, "d-push", WEBHOOK_SECRET)
        )
        .await,
        200
    );
    let jobs = jobs(&s).await;
    assert_eq!(jobs.len(), 2);
    let by_sha = |sha: &str| jobs.iter().find(|j| j.sha.as_deref() == Some(sha)).unwrap();
    assert_eq!(by_sha(old).state, "canceled");
    assert!(by_sha(old)
        .detail
        .as_deref()
        .unwrap()
        .contains("superseded by a newer plan of c0ffee00"));
    assert_eq!(by_sha(new).state, "queued");
    match &by_sha(new).job {
        Some(Job::Plan(p)) => assert_eq!(p.reason, PlanReason::NewCommits),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.app.store.queue_depth().await.unwrap(), 1);
}

#[tokio::test]
async fn closing_the_mr_drops_its_queued_plan() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    let head = "e59094b8de0f2f91abbe4760a52d9137260252d8";
    s.deliver(
        &mr_event(head, "open"),
        &token_headers(MR, "c-open", WEBHOOK_SECRET),
    )
    .await;
    s.deliver(
        &mr_event(head, "close"),
        &token_headers(MR, "c-close", WEBHOOK_SECRET),
    )
    .await;
    let jobs = jobs(&s).await;
    let plan = jobs.iter().find(|j| j.kind == "plan").unwrap();
    assert_eq!(plan.state, "canceled");
    assert_eq!(plan.detail.as_deref(), Some("the merge request was closed"));
    assert_eq!(
        jobs.iter().find(|j| j.kind == "closed").unwrap().state,
        "queued"
    );
}

#[tokio::test]
async fn a_planbot_plan_comment_queues_a_command_job_and_other_comments_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_config(dir.path(), &dead_url())
        .projects(&["gitlab-org/gitlab-test"])
        .load();
    let s = TestService::start(cfg, quiet()).await;
    let note = fixture("webhooks/note_merge_request.json");
    assert_eq!(
        s.deliver(&note, &token_headers("Note Hook", "n-1", WEBHOOK_SECRET))
            .await,
        200
    );
    assert!(
        jobs(&s).await.is_empty(),
        "\"This MR needs work.\" is not a command"
    );
    let mut v: serde_json::Value = serde_json::from_str(&note).unwrap();
    v["object_attributes"]["note"] = "planbot plan".into();
    assert_eq!(
        s.deliver(
            &v.to_string(),
            &token_headers("Note Hook", "n-2", WEBHOOK_SECRET)
        )
        .await,
        200
    );
    let jobs = jobs(&s).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].kind, "command");
}

#[tokio::test]
async fn a_body_over_25_mib_is_refused_without_recording() {
    let dir = tempfile::tempdir().unwrap();
    let s = TestService::start(config(dir.path(), &dead_url(), false), quiet()).await;
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(25 * 1024 * 1024 + 10));
    let status = s
        .deliver(&big, &token_headers(MR, "big", WEBHOOK_SECRET))
        .await;
    assert_eq!(status, 413);
    assert_eq!(s.app.store.delivery_count().await.unwrap(), 0);
    // Just under the limit is fine (and parsed off the async threads).
    let ok = format!(
        "{{\"object_kind\": \"push\", \"pad\": \"{}\"}}",
        "x".repeat(24 * 1024 * 1024)
    );
    assert_eq!(
        s.deliver(&ok, &token_headers("Push Hook", "big-ok", WEBHOOK_SECRET))
            .await,
        200
    );
}

#[tokio::test]
async fn a_replayed_signed_delivery_with_a_new_idempotency_key_runs_one_job() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_config(dir.path(), &dead_url())
        .signing()
        .projects(&["gitlab-org/gitlab-test"])
        .load();
    let s = TestService::start(cfg, quiet()).await;
    let mut v: serde_json::Value =
        serde_json::from_str(&fixture("webhooks/note_merge_request.json")).unwrap();
    v["object_attributes"]["note"] = "planbot plan".into();
    let body = v.to_string();
    // One delivery GitLab signed, captured and sent five times, each with another
    // Idempotency-Key (a header the signature does not cover).
    let signed = signed_headers("Note Hook", "msg-captured", &body, unix_now(), &[]);
    for i in 0..5 {
        let mut headers = signed.clone();
        for (k, v) in headers.iter_mut() {
            if *k == "Idempotency-Key" {
                *v = format!("replay-{i}");
            }
        }
        assert_eq!(s.deliver(&body, &headers).await, 200, "replay {i}");
    }
    let jobs = jobs(&s).await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].kind, "command");
    assert_eq!(s.app.store.delivery_count().await.unwrap(), 1);
    let metrics = s.metrics().await;
    assert!(
        metrics.contains(r#"{event="note",outcome="duplicate"} 4"#),
        "{metrics}"
    );
}
