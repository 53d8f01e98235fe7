//! The GitLab client against the fake GitLab: retries, typed errors, pagination, job tokens,
//! statuses, members, and the GitLab-managed Terraform state API with locking.

use crate::support::fake_gitlab::{FakeGitLab, FakeJob, FakeProject, DEVELOPER, MAINTAINER};
use planbot::capabilities::gitlab::{
    AccessLevel, CommitStatus, GitLab, GitLabError, IssueStateEvent, RetryPolicy, StatusState,
};
use planbot::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId, UserId};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const NOTES: &str = "POST /api/v4/projects/{id}/merge_requests/{iid}/notes";
const LIST_NOTES: &str = "GET /api/v4/projects/{id}/merge_requests/{iid}/notes";
const EDIT_NOTE: &str = "PUT /api/v4/projects/{id}/merge_requests/{iid}/notes/{note_id}";

fn client(fake: &FakeGitLab) -> GitLab {
    GitLab::new(fake.url(), fake.bot_token())
        .unwrap()
        .with_retry_policy(RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_secs(3),
        })
}

fn setup() -> (FakeGitLab, FakeProject, u64) {
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(&project, "feature/vm", &[("main.tf", "# vm\n")]);
    let iid = fake.open_mr(&project, "feature/vm", "main");
    (fake, project, iid)
}

fn pid(p: &FakeProject) -> ProjectId {
    ProjectId(p.id)
}

#[tokio::test]
async fn a_note_is_posted_once_when_gitlab_answers_500_twice_then_ok() {
    let (fake, project, iid) = setup();
    fake.fail_next(NOTES, 2, 500);
    let note = client(&fake)
        .create_mr_note(pid(&project), MrIid(iid), "plan: 1 to add")
        .await
        .expect("third attempt succeeds");
    assert_eq!(fake.calls(NOTES), 3, "two failures then one success");
    let notes = fake.notes(&project, iid);
    assert_eq!(notes.len(), 1, "exactly one note on the MR");
    assert_eq!(notes[0].body, "plan: 1 to add");
    assert_eq!(notes[0].id, note.id.0);
    assert_eq!(notes[0].author_id, fake.bot().id);
    assert_eq!(note.author.unwrap().username, "planbot-bot");
}

#[tokio::test]
async fn a_note_gitlab_stored_before_answering_502_is_not_posted_again() {
    let (fake, project, iid) = setup();
    // A human's identical comment earlier does not count as the bot's note.
    let alice = fake.create_user("alice");
    fake.add_note(&project, iid, &alice, "plan: 1 to add");
    fake.fail_next_after_write(NOTES, 2, 502);
    let note = client(&fake)
        .create_mr_note(pid(&project), MrIid(iid), "plan: 1 to add")
        .await
        .expect("the stored note is the answer");
    let bots: Vec<_> = fake
        .notes(&project, iid)
        .into_iter()
        .filter(|n| n.author_id == fake.bot().id)
        .collect();
    assert_eq!(bots.len(), 1, "exactly one bot note: {bots:?}");
    assert_eq!(bots[0].id, note.id.0);
    assert_eq!(
        fake.calls(NOTES),
        1,
        "found after the first 502, not posted again"
    );
}

#[tokio::test]
async fn an_issue_gitlab_stored_before_timing_out_is_not_opened_again() {
    let (fake, project, _) = setup();
    const ISSUES: &str = "POST /api/v4/projects/{id}/issues";
    let gl = client(&fake);
    // The same issue opened before this post (an earlier failure) is not this post.
    gl.create_issue(pid(&project), "apply failed", "details")
        .await
        .unwrap();
    fake.fail_next_after_write(ISSUES, 1, 504);
    let issue = gl
        .create_issue(pid(&project), "apply failed", "details")
        .await
        .unwrap();
    let issues = fake.issues(&project);
    assert_eq!(issues.len(), 2, "{issues:?}");
    assert_eq!(issue.iid, 2);
    assert_eq!(fake.calls(ISSUES), 2);

    // Failed before the write, with an identical issue the newest: posted again, once.
    fake.fail_next(ISSUES, 1, 503);
    gl.create_issue(pid(&project), "apply failed", "details")
        .await
        .unwrap();
    assert_eq!(fake.issues(&project).len(), 3);
}

#[tokio::test]
async fn a_gitlab_that_keeps_failing_gives_a_status_error_after_the_last_attempt() {
    let (fake, project, iid) = setup();
    fake.fail_next(NOTES, 100, 503);
    let err = client(&fake)
        .create_mr_note(pid(&project), MrIid(iid), "x")
        .await
        .unwrap_err();
    assert!(
        matches!(err, GitLabError::Status { code: 503, .. }),
        "{err:?}"
    );
    assert_eq!(fake.calls(NOTES), 4, "max_attempts calls, then give up");
    assert!(fake.notes(&project, iid).is_empty());
}

#[tokio::test]
async fn a_rate_limit_is_retried_after_the_time_gitlab_asks_for() {
    let (fake, project, iid) = setup();
    fake.rate_limit_next(NOTES, 1, 1);
    let started = Instant::now();
    client(&fake)
        .create_mr_note(pid(&project), MrIid(iid), "after the rate limit")
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "waited {:?}, Retry-After asked for 1 s (base delay is 5 ms)",
        started.elapsed()
    );
    assert_eq!(fake.calls(NOTES), 2);
    assert_eq!(fake.notes(&project, iid).len(), 1);
}

#[tokio::test]
async fn other_client_errors_are_not_retried() {
    let (fake, project, iid) = setup();
    fake.fail_next(NOTES, 1, 422);
    let err = client(&fake)
        .create_mr_note(pid(&project), MrIid(iid), "x")
        .await
        .unwrap_err();
    assert!(
        matches!(err, GitLabError::Status { code: 422, .. }),
        "{err:?}"
    );
    assert_eq!(fake.calls(NOTES), 1);
}

#[tokio::test]
async fn editing_a_note_a_user_deleted_says_not_found_so_the_caller_can_recreate_it() {
    let (fake, project, iid) = setup();
    let gl = client(&fake);
    let note = gl
        .create_mr_note(pid(&project), MrIid(iid), "first plan")
        .await
        .unwrap();
    let edited = gl
        .edit_mr_note(pid(&project), MrIid(iid), note.id, "second plan")
        .await
        .unwrap();
    assert_eq!(edited.body, "second plan");
    assert_eq!(fake.notes(&project, iid)[0].edits, 1);

    fake.delete_note(&project, iid, note.id.0);
    let err = gl
        .edit_mr_note(pid(&project), MrIid(iid), note.id, "third plan")
        .await
        .unwrap_err();
    assert!(matches!(err, GitLabError::NotFound), "{err:?}");
    assert_eq!(fake.calls(EDIT_NOTE), 2, "the 404 was not retried");
}

#[tokio::test]
async fn all_notes_are_read_in_creation_order_across_pages_even_after_edits() {
    // GitLab lists notes newest first by default and orders by `created_at` unless told
    // `updated_at`; 20 a page unless `per_page` (docs: "List all merge request notes").
    let (fake, project, iid) = setup();
    let alice = fake.create_user("alice");
    let ids: Vec<u64> = (0..230)
        .map(|i| fake.add_note(&project, iid, &alice, &format!("comment {i}")))
        .collect();
    let gl = client(&fake);
    // The bot's note is edited after a later note: by update time it would be the newest.
    gl.create_mr_note(pid(&project), MrIid(iid), "bot note")
        .await
        .unwrap();
    let bot_id = fake.notes(&project, iid).last().unwrap().id;
    let first = fake.add_note(&project, iid, &alice, "after the bot");
    let calls = fake.calls(LIST_NOTES);
    let notes = gl.mr_notes(pid(&project), MrIid(iid)).await.unwrap();
    let got: Vec<u64> = notes.iter().map(|n| n.id.0).collect();
    let mut want = ids.clone();
    want.push(bot_id);
    want.push(first);
    assert_eq!(got, want);
    assert_eq!(fake.calls(LIST_NOTES) - calls, 3, "three pages of 100");
    gl.edit_mr_note(
        pid(&project),
        MrIid(iid),
        NoteId(bot_id),
        "bot note, edited",
    )
    .await
    .unwrap();
    let again: Vec<u64> = gl
        .mr_notes(pid(&project), MrIid(iid))
        .await
        .unwrap()
        .iter()
        .map(|n| n.id.0)
        .collect();
    assert_eq!(again, want, "an edit does not move a note");
}

#[tokio::test]
async fn editing_someone_elses_note_is_forbidden() {
    let (fake, project, iid) = setup();
    let alice = fake.create_user("alice");
    fake.add_member(&project, &alice, DEVELOPER);
    let note = fake.add_note(&project, iid, &alice, "looks good");
    let err = client(&fake)
        .edit_mr_note(pid(&project), MrIid(iid), NoteId(note), "hijacked")
        .await
        .unwrap_err();
    assert!(matches!(err, GitLabError::Forbidden), "{err:?}");
    assert_eq!(fake.notes(&project, iid)[0].body, "looks good");
}

#[tokio::test]
async fn all_150_notes_are_read_oldest_first_over_two_pages() {
    let (fake, project, iid) = setup();
    let alice = fake.create_user("alice");
    for i in 0..150 {
        fake.add_note(&project, iid, &alice, &format!("comment {i}"));
    }
    let notes = client(&fake)
        .mr_notes(pid(&project), MrIid(iid))
        .await
        .unwrap();
    assert_eq!(notes.len(), 150);
    assert_eq!(notes[0].body, "comment 0");
    assert_eq!(notes[149].body, "comment 149");
    assert_eq!(notes[10].author.as_ref().unwrap().username, "alice");
    assert_eq!(fake.calls(LIST_NOTES), 2, "per_page=100: two pages");
}

#[tokio::test]
async fn a_running_jobs_token_identifies_the_job_and_a_finished_one_is_unauthorized() {
    let (fake, project, _) = setup();
    let carol = fake.create_user("carol");
    let main = fake.branch_head(&project, "main").unwrap();
    fake.register_job(FakeJob {
        token: "job-token-123".into(),
        id: 4242,
        name: "planbot-apply".into(),
        status: "running".into(),
        ref_: "main".into(),
        tag: false,
        user: Some(carol.clone()),
        pipeline_id: 77,
        project_id: project.id,
        sha: main.clone(),
    });
    let gl = client(&fake);
    let job = gl.job_for_token("job-token-123").await.unwrap();
    assert_eq!(job.id, JobId(4242));
    assert_eq!(job.name, "planbot-apply");
    assert_eq!(job.status, "running");
    assert_eq!(job.ref_, "main");
    assert!(!job.tag);
    assert_eq!(job.user.unwrap().id, UserId(carol.id));
    assert_eq!(job.pipeline.id, 77);
    assert_eq!(job.pipeline.project_id, pid(&project));
    assert_eq!(job.pipeline.sha, CommitSha(main));

    assert!(matches!(
        gl.job_for_token("not-a-token").await,
        Err(GitLabError::Unauthorized)
    ));
    fake.set_job_status("job-token-123", "success");
    assert!(matches!(
        gl.job_for_token("job-token-123").await,
        Err(GitLabError::Unauthorized)
    ));
}

#[tokio::test]
async fn the_job_lookup_does_not_use_the_bot_token() {
    let (fake, _, _) = setup();
    // The bot's own token is not a job token: GET /job must answer 401 for it.
    let err = client(&fake)
        .job_for_token(fake.bot_token())
        .await
        .unwrap_err();
    assert!(matches!(err, GitLabError::Unauthorized));
}

#[tokio::test]
async fn a_status_moves_forward_in_place_and_a_final_one_is_followed_by_a_new_one() {
    // GitLab updates a pending/running status of the same name, ref and user, and creates a
    // new status after a final one (docs: "Set the pipeline status of a commit").
    let (fake, project, iid) = setup();
    let sha = CommitSha(fake.mr_sha(&project, iid));
    let gl = client(&fake);
    let status = |state, description: &str| CommitStatus {
        state,
        name: "planbot/plan".into(),
        description: Some(description.into()),
        target_url: Some("https://planbot.example.com/runs/1".into()),
        ref_: Some("feature/vm".into()),
        pipeline_id: None,
    };
    let post = |state, d: &'static str| {
        let gl = gl.clone();
        let sha = sha.clone();
        let st = status(state, d);
        let p = pid(&project);
        async move { gl.set_commit_status(p, &sha, &st).await }
    };
    post(StatusState::Pending, "queued").await.unwrap();
    post(StatusState::Running, "planning").await.unwrap();
    // The same state again: GitLab answers 400 "Cannot transition status"; done for the client.
    post(StatusState::Running, "planning").await.unwrap();
    let long: &'static str = "x".repeat(400).leak();
    post(StatusState::Success, long).await.unwrap();
    let rows = fake.status_rows(&project, sha.as_str());
    assert_eq!(rows.len(), 1, "one status, moved forward: {rows:?}");
    assert_eq!(rows[0].state, "success");
    assert_eq!(rows[0].description.as_ref().unwrap().chars().count(), 255);
    assert_eq!(rows[0].ref_.as_deref(), Some("feature/vm"));
    assert_eq!(
        rows[0].target_url.as_deref(),
        Some("https://planbot.example.com/runs/1")
    );
    let states: Vec<String> = fake
        .statuses(&project, sha.as_str())
        .into_iter()
        .map(|s| s.state)
        .collect();
    assert_eq!(states, ["pending", "running", "success"]);

    // After a final state, a retry shows the truth: a new status, running then failed.
    post(StatusState::Running, "again").await.unwrap();
    post(StatusState::Failed, "broke").await.unwrap();
    let rows = fake.status_rows(&project, sha.as_str());
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        fake.status(&project, sha.as_str(), "planbot/plan")
            .unwrap()
            .state,
        "failed"
    );

    // The list shows the latest status per name and ref.
    let listed = gl.commit_statuses(pid(&project), &sha).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].status, "failed");
}

#[tokio::test]
async fn a_status_without_ref_needs_a_branch_holding_the_commit() {
    let (fake, project, iid) = setup();
    let sha = CommitSha(fake.mr_sha(&project, iid));
    let gl = client(&fake);
    let mut status = CommitStatus {
        state: StatusState::Success,
        name: "planbot/apply".into(),
        description: None,
        target_url: None,
        ref_: None,
        pipeline_id: None,
    };
    // On a branch: GitLab picks that branch.
    gl.set_commit_status(pid(&project), &sha, &status)
        .await
        .unwrap();
    let row = fake
        .status(&project, sha.as_str(), "planbot/apply")
        .unwrap();
    assert_eq!(row.ref_.as_deref(), Some("feature/vm"));

    // A commit on no branch (only an MR ref holds it): 404 without a ref.
    let repo = fake.repo_path(&project);
    let orphan = String::from_utf8(
        std::process::Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args([
                "commit-tree",
                "-m",
                "detached",
                &format!("{}^{{tree}}", sha.as_str()),
            ])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    let orphan = CommitSha(orphan);
    let err = gl
        .set_commit_status(pid(&project), &orphan, &status)
        .await
        .unwrap_err();
    assert!(matches!(err, GitLabError::NotFound), "{err:?}");
    status.ref_ = Some("main".into());
    gl.set_commit_status(pid(&project), &orphan, &status)
        .await
        .unwrap();
}

#[tokio::test]
async fn member_roles_are_read_and_a_non_member_has_none() {
    let (fake, project, _) = setup();
    let alice = fake.create_user("alice");
    let mallory = fake.create_user("mallory");
    fake.add_member(&project, &alice, MAINTAINER);
    let gl = client(&fake);
    let level = gl
        .member_access(pid(&project), UserId(alice.id))
        .await
        .unwrap();
    assert_eq!(level, Some(AccessLevel::MAINTAINER));
    assert!(level.unwrap().is_developer_or_more());
    assert_eq!(
        gl.member_access(pid(&project), UserId(mallory.id))
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn group_membership_is_direct_or_inherited_and_a_group_planbot_cannot_see_has_no_members() {
    let fake = FakeGitLab::start();
    let (carol, dave, erin) = (
        fake.create_user("carol"),
        fake.create_user("dave"),
        fake.create_user("erin"),
    );
    fake.create_group("infra/capacity", "internal");
    fake.add_group_member("infra/capacity", &carol, 30);
    // dave is a member of the parent group: GitLab's `members/all` counts him.
    fake.add_group_member("infra", &dave, 10);
    fake.create_group("secret/admins", "private");
    fake.add_group_member("secret/admins", &erin, 50);
    let gl = client(&fake);
    assert!(gl
        .group_member("infra/capacity", UserId(carol.id))
        .await
        .unwrap());
    assert!(gl
        .group_member("infra/capacity", UserId(dave.id))
        .await
        .unwrap());
    assert!(!gl
        .group_member("infra/capacity", UserId(erin.id))
        .await
        .unwrap());
    assert!(!gl.group_member("infra", UserId(carol.id)).await.unwrap());
    // The bot is no member of a private group: GitLab answers 404, as for a stranger.
    assert!(!gl
        .group_member("secret/admins", UserId(erin.id))
        .await
        .unwrap());
    assert!(!gl
        .group_member("no/such-group", UserId(carol.id))
        .await
        .unwrap());
    assert_eq!(gl.user(UserId(carol.id)).await.unwrap().username, "carol");
    assert!(matches!(
        gl.user(UserId(999_999)).await,
        Err(GitLabError::NotFound)
    ));
}

#[tokio::test]
async fn projects_branches_and_merge_requests_read_as_gitlab_returns_them() {
    let (fake, project, iid) = setup();
    let gl = client(&fake);
    let me = gl.current_user().await.unwrap();
    assert_eq!(me.username, "planbot-bot");

    let p = gl.project("infra/homelab").await.unwrap();
    assert_eq!(p.id, pid(&project));
    assert_eq!(p.default_branch.as_deref(), Some("main"));
    assert_eq!(p.http_url_to_repo, fake.clone_url(&project));
    assert_eq!(gl.project(&project.id.to_string()).await.unwrap().id, p.id);
    assert!(matches!(
        gl.project("infra/other").await,
        Err(GitLabError::NotFound)
    ));

    let main = gl.branch(p.id, "main").await.unwrap();
    assert!(main.protected && main.default);
    assert_eq!(
        main.commit.id.as_str(),
        fake.branch_head(&project, "main").unwrap()
    );
    let feature = gl.branch(p.id, "feature/vm").await.unwrap();
    assert!(!feature.protected && !feature.default);

    let mr = gl.merge_request(p.id, MrIid(iid)).await.unwrap();
    assert_eq!(mr.state, "opened");
    assert_eq!(mr.source_branch, "feature/vm");
    assert_eq!(
        mr.sha.as_ref().unwrap().as_str(),
        fake.mr_sha(&project, iid)
    );
    assert!(!mr.is_fork());
    assert_eq!(gl.open_merge_requests(p.id).await.unwrap().len(), 1);

    let landed = fake.merge_mr(&project, iid, None);
    let merged = gl
        .commit_merge_requests(p.id, &CommitSha(landed.clone()))
        .await
        .unwrap();
    assert_eq!(merged.len(), 1);
    assert_eq!(merged[0].state, "merged");
    assert_eq!(
        merged[0].merge_commit_sha.as_ref().unwrap().as_str(),
        landed
    );
    assert!(gl.open_merge_requests(p.id).await.unwrap().is_empty());
}

#[tokio::test]
async fn issues_are_created_and_hooks_need_maintainer() {
    let (fake, project, _) = setup();
    let gl = client(&fake);
    let issue = gl
        .create_issue(pid(&project), "planbot: apply interrupted", "details")
        .await
        .unwrap();
    assert_eq!(issue.iid, 1);
    assert_eq!(fake.issues(&project)[0].title, "planbot: apply interrupted");

    fake.add_hook(
        &project,
        "https://planbot.example.com/webhooks/gitlab",
        true,
        true,
    );
    assert!(matches!(
        gl.project_hooks(pid(&project)).await,
        Err(GitLabError::Forbidden)
    ));
    fake.add_member(&project, &fake.bot().clone(), MAINTAINER);
    let hooks = gl.project_hooks(pid(&project)).await.unwrap();
    assert_eq!(hooks.len(), 1);
    assert!(hooks[0].merge_requests_events && hooks[0].note_events);
}

#[tokio::test]
async fn a_wrong_token_is_unauthorized_and_never_shown_in_the_error() {
    let (fake, _, _) = setup();
    let gl = GitLab::new(fake.url(), "glpat-wrong-secret-token").unwrap();
    let err = gl.current_user().await.unwrap_err();
    assert!(matches!(err, GitLabError::Unauthorized));
    assert!(!format!("{err} {err:?}").contains("glpat-wrong-secret-token"));
}

#[tokio::test]
async fn an_unreachable_gitlab_is_a_transport_error_after_retries() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let gl = GitLab::new(&url, "glpat-secret")
        .unwrap()
        .with_retry_policy(RetryPolicy {
            max_attempts: 2,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(10),
        });
    let err = gl.current_user().await.unwrap_err();
    assert!(matches!(err, GitLabError::Transport(_)), "{err:?}");
    assert!(!err.to_string().contains("glpat-secret"));
    // The cause, named: not just "error sending request".
    let addr = url.trim_start_matches("http://");
    assert!(
        err.to_string().contains(&format!(
            "connection refused by {addr} (nothing listens there)"
        )),
        "{err}"
    );
}

/// A client of `url` that tries once and waits at most `timeout`.
fn impatient(url: &str, timeout: Duration) -> GitLab {
    GitLab::new(url, "glpat-secret")
        .unwrap()
        .with_retry_policy(RetryPolicy {
            max_attempts: 1,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(1),
        })
        .with_timeout(timeout)
        .unwrap()
}

#[tokio::test]
async fn a_gitlab_outage_names_its_cause_dns_tls_or_timeout() {
    // DNS: `.invalid` never resolves (RFC 6761).
    let err = impatient("https://gitlab.planbot.invalid", Duration::from_secs(10))
        .current_user()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("DNS lookup failed for gitlab.planbot.invalid"),
        "{err}"
    );

    // TLS: an https:// URL whose server speaks plain HTTP.
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = plain.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut conn, _)) = plain.accept().await {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let err = impatient(&format!("https://{addr}"), Duration::from_secs(10))
        .current_user()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("TLS handshake with {addr} failed")),
        "{err}"
    );

    // A timeout: a server that accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = silent.accept().await {
            keep.lock().unwrap().push(conn);
        }
    });
    let err = impatient(&format!("http://{addr}"), Duration::from_millis(300))
        .current_user()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("timed out waiting for {addr}")),
        "{err}"
    );
}

// ----- the GitLab-managed Terraform state API -------------------------------------------------

fn basic(user: &str, token: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{token}"))
    )
}

/// GitLab-managed state as GitLab serves it: Basic auth with a token, the Developer role reads,
/// Maintainer locks, writes, unlocks and deletes; a held lock answers 409 with who holds it;
/// every write is a new version and must carry the held lock's ID.
#[tokio::test]
async fn terraform_state_follows_gitlab_roles_locks_and_versions() {
    let (fake, project, _) = setup();
    let http = reqwest::Client::new();
    let state_url = format!(
        "{}/api/v4/projects/{}/terraform/state/core",
        fake.url(),
        project.id
    );
    let lock_url = format!("{state_url}/lock");
    let reader = fake.member_with_role(&project, "state-reader", DEVELOPER);
    let writer = fake.member_with_role(&project, "state-writer", MAINTAINER);
    let outsider = fake.create_user("outsider");
    // GitLab reads only the token: the user name is any word.
    let dev = basic("planbot", &reader.token);
    let maint = basic("planbot", &writer.token);
    let send = |method: &str, url: &str, auth: &str, body: Option<Value>| {
        let mut r = http
            .request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url)
            .header("authorization", auth);
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move { r.send().await.unwrap() }
    };

    // No credentials: 401; a user who is no member: 404, as for a private project.
    assert_eq!(http.get(&state_url).send().await.unwrap().status(), 401);
    let r = send("GET", &state_url, &basic("x", &outsider.token), None).await;
    assert_eq!(r.status(), 404);
    // A state never written: 404, which the http backend reads as "no state yet".
    assert_eq!(send("GET", &state_url, &dev, None).await.status(), 404);

    // A Developer may read but not lock, write or delete.
    let lock_a = json!({"ID": "lock-a", "Operation": "OperationTypeApply", "Who": "ci@runner", "Version": "1.11.4", "Path": "", "Info": "", "Created": "2025-06-01T09:00:00Z"});
    let r = send("POST", &lock_url, &dev, Some(lock_a.clone())).await;
    assert_eq!(r.status(), 403);
    let state = json!({"version": 4, "serial": 1, "lineage": "l-1", "resources": []});
    assert_eq!(
        send("POST", &state_url, &dev, Some(state.clone()))
            .await
            .status(),
        403
    );
    assert_eq!(send("DELETE", &state_url, &dev, None).await.status(), 403);

    // A Maintainer locks; a second lock is told who holds it (GitLab's user, not the client's
    // `Who`) and since when.
    let r = send("POST", &lock_url, &maint, Some(lock_a.clone())).await;
    assert_eq!(r.status(), 200);
    let r = send(
        "POST",
        &lock_url,
        &maint,
        Some(json!({"ID": "lock-b", "Operation": "OperationTypePlan"})),
    )
    .await;
    assert_eq!(r.status(), 409);
    let held: Value = r.json().await.unwrap();
    assert_eq!(held["ID"], "lock-a");
    assert_eq!(held["Who"], "state-writer");
    assert!(
        held["Created"]
            .as_str()
            .is_some_and(|c| c.starts_with("20")),
        "{held}"
    );
    assert_eq!(held["Operation"], "OperationTypePlan");
    // The lock created the state record: GET answers 204 (empty) now, to a Developer too.
    assert_eq!(send("GET", &state_url, &dev, None).await.status(), 204);

    // A write must name the held lock; then it is a new version. No serial: 422.
    assert_eq!(
        send("POST", &state_url, &maint, Some(state.clone()))
            .await
            .status(),
        409
    );
    let with_id = format!("{state_url}?ID=lock-a");
    let r = send("POST", &with_id, &maint, Some(json!({"version": 4}))).await;
    assert_eq!(r.status(), 422);
    assert_eq!(
        send("POST", &with_id, &maint, Some(state.clone()))
            .await
            .status(),
        200
    );
    let state2 = json!({"version": 4, "serial": 2, "lineage": "l-1", "resources": []});
    assert_eq!(
        send("POST", &with_id, &maint, Some(state2.clone()))
            .await
            .status(),
        200
    );
    assert_eq!(fake.terraform_state_versions(&project, "core"), [1, 2]);
    let r = send("GET", &state_url, &dev, None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), state2);

    // Unlocking with another ID conflicts; a Developer may not; the holder's ID frees it.
    let r = send("DELETE", &lock_url, &maint, Some(json!({"ID": "lock-b"}))).await;
    assert_eq!(r.status(), 409);
    assert_eq!(
        send("DELETE", &lock_url, &dev, Some(lock_a.clone()))
            .await
            .status(),
        403
    );
    assert_eq!(
        send("DELETE", &lock_url, &maint, Some(lock_a))
            .await
            .status(),
        200
    );
    assert!(fake.terraform_state(&project, "core").1.is_none());
    // force-unlock sends no ID: it frees any lock.
    fake.lock_terraform_state(&project, "core", &outsider, "stale");
    assert_eq!(send("DELETE", &lock_url, &maint, None).await.status(), 200);
    assert!(fake.terraform_state(&project, "core").1.is_none());

    assert_eq!(send("DELETE", &state_url, &maint, None).await.status(), 200);
    assert!(fake.terraform_state(&project, "core").0.is_none());
    assert_eq!(send("GET", &state_url, &dev, None).await.status(), 404);

    // Every answer was recorded, with the user whose token it was.
    let requests = fake.state_requests();
    assert!(requests.iter().any(|r| r.method == "POST"
        && r.target == "lock"
        && r.user.as_deref() == Some("state-reader")
        && r.status == 403));
}

/// The real engine keeps its state in the fake's Terraform state API through the built-in
/// `http` backend, with locking, exactly as an infra repo root would on GitLab.
#[tokio::test]
async fn the_engine_keeps_state_in_the_fake_gitlab_and_waits_for_a_held_lock() {
    let engine = require_engine!();
    let (fake, project, _) = setup();
    let writer = fake.member_with_role(&project, "state-writer", MAINTAINER);
    let alice = fake.member_with_role(&project, "alice", MAINTAINER);
    let dir = tempfile::tempdir().unwrap();
    let address = format!(
        "{}/api/v4/projects/{}/terraform/state/core",
        fake.url(),
        project.id
    );
    std::fs::write(
        dir.path().join("main.tf"),
        format!(
            r#"terraform {{
  backend "http" {{
    address        = "{address}"
    lock_address   = "{address}/lock"
    unlock_address = "{address}/lock"
    lock_method    = "POST"
    unlock_method  = "DELETE"
    retry_wait_min = 1
  }}
}}
resource "terraform_data" "vm" {{
  input = "blocky"
}}
"#
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&engine)
            .args(args)
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .env("TF_IN_AUTOMATION", "1")
            .env("TF_INPUT", "0")
            .env("TF_HTTP_USERNAME", "planbot")
            .env("TF_HTTP_PASSWORD", &writer.token)
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, log) = run(&["init", "-input=false", "-no-color"]);
    assert!(ok, "init failed:\n{log}");
    let (ok, log) = run(&["apply", "-auto-approve", "-input=false", "-no-color"]);
    assert!(ok, "apply failed:\n{log}");

    let (stored, lock) = fake.terraform_state(&project, "core");
    let state: Value = serde_json::from_slice(&stored.expect("state stored in GitLab")).unwrap();
    assert_eq!(state["resources"][0]["type"], "terraform_data");
    assert_eq!(state["resources"][0]["name"], "vm");
    assert!(lock.is_none(), "the engine unlocked after apply");

    // Someone else holds the lock: the engine gives up after its lock timeout and says why.
    let r = reqwest::Client::new()
        .post(format!("{address}/lock"))
        .header("authorization", basic("x", &alice.token))
        .json(
            &json!({"ID": "other-apply", "Who": "alice@laptop", "Operation": "OperationTypeApply"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (ok, log) = run(&["plan", "-input=false", "-no-color", "-lock-timeout=2s"]);
    assert!(!ok, "plan must fail while the state is locked:\n{log}");
    assert!(log.contains("lock"), "{log}");
    assert!(
        log.contains("already locked: ID=other-apply"),
        "the holder is named:\n{log}"
    );
}

#[tokio::test]
async fn an_issue_is_found_by_its_label_edited_commented_and_closed_like_on_gitlab() {
    let (fake, project, _) = setup();
    let gl = client(&fake);
    let labels = vec!["drift".to_string()];
    let opened = gl
        .create_labelled_issue(pid(&project), "planbot: drift in core", "first", &labels)
        .await
        .unwrap();
    gl.create_issue(pid(&project), "unrelated", "no label")
        .await
        .unwrap();
    let found = gl.issues_labelled(pid(&project), "drift").await.unwrap();
    assert_eq!(found.len(), 1, "only the labelled issue: {found:?}");
    assert_eq!(
        (found[0].iid, found[0].state.as_str()),
        (opened.iid, "opened")
    );
    assert_eq!(found[0].labels, labels);

    gl.edit_issue(pid(&project), opened.iid, "second", None)
        .await
        .unwrap();
    gl.create_issue_note(pid(&project), opened.iid, "clean again")
        .await
        .unwrap();
    let closed = gl
        .edit_issue(
            pid(&project),
            opened.iid,
            "second",
            Some(IssueStateEvent::Close),
        )
        .await
        .unwrap();
    assert_eq!(closed.state, "closed");
    let stored = &fake.issues(&project)[0];
    assert_eq!(stored.description, "second");
    assert_eq!(stored.state, "closed");
    assert_eq!(stored.notes.len(), 1);
    assert_eq!(stored.notes[0].2, "clean again");
    let again = gl.issues_labelled(pid(&project), "drift").await.unwrap();
    assert_eq!(again[0].state, "closed", "a closed issue is still found");

    gl.edit_issue(
        pid(&project),
        opened.iid,
        "third",
        Some(IssueStateEvent::Reopen),
    )
    .await
    .unwrap();
    assert_eq!(fake.issues(&project)[0].state, "opened");
    assert!(matches!(
        gl.edit_issue(pid(&project), 99, "x", None).await,
        Err(GitLabError::NotFound)
    ));
}

#[tokio::test]
async fn an_issue_note_gitlab_stored_before_timing_out_is_not_posted_again() {
    let (fake, project, _) = setup();
    const ISSUE_NOTES: &str = "POST /api/v4/projects/{id}/issues/{iid}/notes";
    let gl = client(&fake);
    let issue = gl
        .create_issue(pid(&project), "planbot: drift in core", "drift")
        .await
        .unwrap();
    // The same text posted by an earlier run is not this post.
    gl.create_issue_note(pid(&project), issue.iid, "could not check")
        .await
        .unwrap();
    fake.fail_next_after_write(ISSUE_NOTES, 1, 504);
    gl.create_issue_note(pid(&project), issue.iid, "could not check")
        .await
        .unwrap();
    assert_eq!(fake.issues(&project)[0].notes.len(), 2);
    assert_eq!(
        fake.calls(ISSUE_NOTES),
        2,
        "found after the 504, not posted again"
    );
}
