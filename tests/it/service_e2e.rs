//! The whole service end to end: signed-off webhooks over HTTP → SQLite queue → workers → the plan
//! flow with the real engine against the fake GitLab (real git repos), across a restart. A wait
//! that times out prints the queue and what the fake GitLab received.

use crate::support::fake_gitlab::{FakeGitLab, FakeProject, FakeUser};
use crate::support::service::{config_for, fixture, token_headers, TestService, WEBHOOK_SECRET};
use planbot::core::config::Config;
use planbot::flows::service::server::Options;

const MAIN_TF: &str = r#"resource "terraform_data" "vm" {
  input = "blocky"
}
"#;

/// planbot on the fake GitLab's `infra/homelab` with the real engine, two plans at a time.
fn service_config(data: &std::path::Path, fake: &FakeGitLab, engine: &std::path::Path) -> Config {
    config_for(data, fake, "infra/homelab", engine)
        .plan_slots(2)
        .load()
}

/// The documented Merge Request Hook payload, pointed at the fake's project and MR.
fn mr_hook(fake: &FakeGitLab, p: &FakeProject, iid: u64, action: &str) -> String {
    fake.merge_request_hook(p, iid, action)
}

/// The documented Note Hook payload: `user` comments `body` on MR `iid`.
fn note_hook(fake: &FakeGitLab, p: &FakeProject, iid: u64, user: &FakeUser, body: &str) -> String {
    let note_id = fake.add_note(p, iid, user, body);
    let mut v: serde_json::Value =
        serde_json::from_str(&fixture("webhooks/note_merge_request.json")).unwrap();
    v["project_id"] = p.id.into();
    v["project"]["id"] = p.id.into();
    v["project"]["path_with_namespace"] = p.path.clone().into();
    v["user"]["id"] = user.id.into();
    v["object_attributes"]["id"] = note_id.into();
    v["object_attributes"]["note"] = body.into();
    v["object_attributes"]["author_id"] = user.id.into();
    v["merge_request"]["iid"] = iid.into();
    v["merge_request"]["source_project_id"] = p.id.into();
    v["merge_request"]["target_project_id"] = p.id.into();
    v["merge_request"]["last_commit"]["id"] = fake.mr_sha(p, iid).into();
    v.to_string()
}

fn plan_note(fake: &FakeGitLab, p: &FakeProject, iid: u64) -> Option<String> {
    fake.plan_note(p, iid)
}

/// What the queue and the fake GitLab hold: printed when a wait times out, so a slow or stuck
/// run says where it stands (which jobs ran, failed or were never enqueued; what GitLab got).
struct Story<'a> {
    fake: &'a FakeGitLab,
    project: &'a FakeProject,
    mrs: Vec<u64>,
    store: planbot::capabilities::store::Store,
}

impl Story<'_> {
    async fn tell(&self) -> String {
        use std::fmt::Write;
        let mut out = String::from("jobs, newest first:\n");
        for j in self.store.recent_jobs(50).await.unwrap_or_default() {
            let _ = writeln!(
                out,
                "  #{} {} mr={:?} {} attempts={} {}",
                j.id.0,
                j.kind,
                j.mr.map(|m| m.0),
                j.state,
                j.attempts,
                j.detail.unwrap_or_default()
            );
        }
        for iid in &self.mrs {
            let _ = writeln!(out, "notes on !{iid}:");
            for n in self.fake.notes(self.project, *iid) {
                let line = n
                    .body
                    .lines()
                    .find(|l| !l.trim().is_empty() && !l.starts_with("<!--"))
                    .unwrap_or_default();
                let _ = writeln!(out, "  #{} by user {}: {line}", n.id, n.author_id);
            }
        }
        let _ = writeln!(out, "GitLab API calls: {:?}", self.fake.all_calls());
        let git: Vec<String> = self
            .fake
            .git_requests()
            .iter()
            .map(|g| format!("{} {} {}", g.method, g.path, g.status))
            .collect();
        let _ = writeln!(out, "git requests: {git:?}");
        out
    }

    async fn wait_for(&self, what: &str, mut f: impl FnMut() -> bool) {
        self.wait_for_async(what, || std::future::ready(f())).await
    }

    async fn wait_for_async<F, Fut>(&self, what: &str, mut f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let started = tokio::time::Instant::now();
        let deadline = started + std::time::Duration::from_secs(120);
        while tokio::time::Instant::now() < deadline {
            if f().await {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!(
            "timed out after {:?} waiting for: {what}\n{}",
            started.elapsed(),
            self.tell().await
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_accepted_before_a_restart_is_planned_after_it_and_the_mr_gets_its_note() {
    let engine = require_engine!();
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(&project, "main", &[("main.tf", MAIN_TF)]);
    fake.commit_files(
        &project,
        "feature/vm",
        &[("main.tf", &MAIN_TF.replace("blocky", "blocky-v2"))],
    );
    let iid = fake.open_mr(&project, "feature/vm", "main");
    let head = fake.mr_sha(&project, iid);
    let data = tempfile::tempdir().unwrap();

    // planbot accepts the delivery, then stops before any worker took it.
    let quiet = Options {
        workers: false,
        reconcile: false,
    };
    let s = TestService::start(service_config(data.path(), &fake, &engine), quiet).await;
    let status = s
        .deliver(
            &mr_hook(&fake, &project, iid, "open"),
            &token_headers("Merge Request Hook", "e2e-1", WEBHOOK_SECRET),
        )
        .await;
    assert_eq!(status, 200);
    // Accepted means stored: the plan job waits in the queue for the next start.
    let queued: Vec<(String, String)> = s
        .app
        .store
        .recent_jobs(10)
        .await
        .unwrap()
        .into_iter()
        .map(|j| (j.kind, j.state))
        .collect();
    assert_eq!(queued, [("plan".to_string(), "queued".to_string())]);
    s.kill().await;

    // The next start runs it: one plan note for that head, and a successful status.
    let workers = Options {
        workers: true,
        reconcile: false,
    };
    let s = TestService::start(service_config(data.path(), &fake, &engine), workers).await;
    let story = Story {
        fake: &fake,
        project: &project,
        mrs: vec![iid],
        store: s.app.store.clone(),
    };
    story
        .wait_for("the plan note", || {
            plan_note(&fake, &project, iid).is_some()
        })
        .await;
    let note = plan_note(&fake, &project, iid).unwrap();
    assert!(
        note.contains(&head[..8]),
        "the note names the planned commit:\n{note}"
    );
    story
        .wait_for("planbot/plan success", || {
            fake.statuses(&project, &head)
                .iter()
                .any(|st| st.name == "planbot/plan" && st.state == "success")
        })
        .await;
    s.after_job_ends("the plan job to be recorded done", 120, || {
        s.jobs_all_ended()
    })
    .await;
    let jobs = s.app.store.recent_jobs(10).await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!((jobs[0].state.as_str(), jobs[0].attempts), ("done", 1));
    // The run page of that plan is served.
    let runs = s.app.store.recent_runs(10).await.unwrap();
    assert!(!runs.is_empty());
    let (code, page) = s.get_text(&format!("/runs/{}", runs[0].id)).await;
    assert_eq!(code, 200);
    assert!(page.contains(&head[..8]), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn comment_commands_check_access_and_a_merge_marks_the_note_and_replans_the_other_mr() {
    let engine = require_engine!();
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(&project, "main", &[("main.tf", MAIN_TF)]);
    fake.commit_files(
        &project,
        "feature/a",
        &[("main.tf", &MAIN_TF.replace("blocky", "blocky-a"))],
    );
    fake.commit_files(
        &project,
        "feature/b",
        &[("b.tf", "resource \"terraform_data\" \"b\" {}\n")],
    );
    let a = fake.open_mr(&project, "feature/a", "main");
    let b = fake.open_mr(&project, "feature/b", "main");
    let reporter = fake.create_user("rita");
    fake.add_member(&project, &reporter, 20);
    let developer = fake.create_user("dev");
    fake.add_member(&project, &developer, 30);
    let data = tempfile::tempdir().unwrap();
    let workers = Options {
        workers: true,
        reconcile: false,
    };
    let s = TestService::start(service_config(data.path(), &fake, &engine), workers).await;
    let mr = "Merge Request Hook";
    for (i, iid) in [a, b].into_iter().enumerate() {
        let st = s
            .deliver(
                &mr_hook(&fake, &project, iid, "open"),
                &token_headers(mr, &format!("open-{i}"), WEBHOOK_SECRET),
            )
            .await;
        assert_eq!(st, 200);
    }
    let store = s.app.store.clone();
    let story = Story {
        fake: &fake,
        project: &project,
        mrs: vec![a, b],
        store: store.clone(),
    };
    story
        .wait_for("the plan notes of both MRs", || {
            plan_note(&fake, &project, a).is_some() && plan_note(&fake, &project, b).is_some()
        })
        .await;

    // A Reporter may not drive planbot; the answer says why.
    let hook = note_hook(&fake, &project, a, &reporter, "planbot plan");
    assert_eq!(
        s.deliver(&hook, &token_headers("Note Hook", "note-1", WEBHOOK_SECRET))
            .await,
        200
    );
    story
        .wait_for("the refusal", || {
            fake.notes(&project, a)
                .iter()
                .any(|n| n.body.contains("was not run"))
        })
        .await;
    let refusal = fake
        .notes(&project, a)
        .into_iter()
        .find(|n| n.body.contains("was not run"))
        .unwrap();
    assert!(
        refusal.body.contains("needs the Developer role"),
        "{}",
        refusal.body
    );
    assert_eq!(refusal.author_id, fake.bot().id);

    // A Developer's `planbot help` is answered with the help.
    let hook = note_hook(&fake, &project, a, &developer, "planbot help");
    assert_eq!(
        s.deliver(&hook, &token_headers("Note Hook", "note-2", WEBHOOK_SECRET))
            .await,
        200
    );
    story
        .wait_for("the help note", || {
            fake.notes(&project, a)
                .iter()
                .any(|n| n.body.contains("<!-- planbot:help -->"))
        })
        .await;

    // The bot's own notes come back as webhooks and are ignored.
    let before = fake.notes(&project, a).len();
    let bot = fake.bot().clone();
    let hook = note_hook(&fake, &project, a, &bot, "planbot help");
    assert_eq!(
        s.deliver(&hook, &token_headers("Note Hook", "note-3", WEBHOOK_SECRET))
            .await,
        200
    );
    story
        .wait_for_async("the bot's command job to finish", || {
            let store = store.clone();
            async move {
                store
                    .recent_jobs(50)
                    .await
                    .unwrap()
                    .iter()
                    .filter(|j| j.kind == "command")
                    .all(|j| j.state == "done")
            }
        })
        .await;
    assert_eq!(
        fake.notes(&project, a).len(),
        before + 1,
        "only the bot's own comment was added"
    );

    // Merging A: its note says it waits for the apply job, and B is planned again.
    let plans_of_b = || {
        let store = store.clone();
        async move {
            store
                .recent_jobs(50)
                .await
                .unwrap()
                .iter()
                .filter(|j| j.kind == "plan" && j.mr.map(|m| m.0) == Some(b))
                .count()
        }
    };
    assert_eq!(plans_of_b().await, 1);
    fake.merge_mr(&project, a, Some(&developer));
    assert_eq!(
        s.deliver(
            &mr_hook(&fake, &project, a, "merge"),
            &token_headers(mr, "merge-a", WEBHOOK_SECRET)
        )
        .await,
        200
    );
    story
        .wait_for("the merged banner", || {
            plan_note(&fake, &project, a)
                .is_some_and(|n| n.contains("Merged — waiting for the apply job on `main`"))
        })
        .await;
    story
        .wait_for_async("a re-plan of B", || async { plans_of_b().await == 2 })
        .await;
}

/// `outsider/homelab`, a fork of `infra/homelab`, with an MR from its branch `evil` into `main`.
fn fork_mr(fake: &FakeGitLab) -> (FakeProject, FakeProject, u64) {
    let project = fake.create_project("infra/homelab");
    fake.commit_files(&project, "main", &[("main.tf", MAIN_TF)]);
    let fork = fake.fork_project(&project, "outsider/homelab");
    let outsider = fake.create_user("outsider");
    fake.commit_files(
        &fork,
        "evil",
        &[("main.tf", &MAIN_TF.replace("blocky", "blocky-fork"))],
    );
    let iid = fake.open_mr_from(&fork, "evil", &project, "main", &outsider);
    (project, fork, iid)
}

/// The Merge Request Hook of the fork MR, as GitLab sends it (source project: the fork).
fn fork_mr_hook(fake: &FakeGitLab, project: &FakeProject, fork: &FakeProject, iid: u64) -> String {
    let mut hook: serde_json::Value =
        serde_json::from_str(&mr_hook(fake, project, iid, "open")).unwrap();
    hook["object_attributes"]["source_project_id"] = fork.id.into();
    hook.to_string()
}

/// The plan jobs of the queue (any state), newest first.
async fn queued_plans(
    store: &planbot::capabilities::store::Store,
) -> Vec<planbot::core::events::PlanJob> {
    store
        .recent_jobs(20)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|j| match j.job {
            Some(planbot::core::events::Job::Plan(p)) => Some(p),
            _ => None,
        })
        .collect()
}

/// The fork-notice jobs, once none is left to run (whether one or two were enqueued).
async fn fork_notice_jobs_when_finished(
    store: &planbot::capabilities::store::Store,
) -> Option<Vec<planbot::capabilities::store::JobRow>> {
    let jobs: Vec<_> = store
        .recent_jobs(20)
        .await
        .unwrap()
        .into_iter()
        .filter(|j| j.kind == "fork_notice")
        .collect();
    let finished = !jobs.is_empty()
        && jobs
            .iter()
            .all(|j| j.state != "queued" && j.state != "running");
    finished.then_some(jobs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_mr_is_not_planned_until_a_maintainer_asks() {
    let engine = require_engine!();
    let fake = FakeGitLab::start();
    let (project, fork, iid) = fork_mr(&fake);
    let developer = fake.create_user("dev");
    fake.add_member(&project, &developer, 30);
    let maintainer = fake.create_user("maint");
    fake.add_member(&project, &maintainer, 40);
    let data = tempfile::tempdir().unwrap();
    let workers = Options {
        workers: true,
        reconcile: false,
    };
    let s = TestService::start(service_config(data.path(), &fake, &engine), workers).await;
    let store = s.app.store.clone();
    let story = Story {
        fake: &fake,
        project: &project,
        mrs: vec![iid],
        store: store.clone(),
    };

    // Someone writes planbot's hidden marker into a comment of their own first: it is not
    // planbot's notice, which is still posted.
    fake.add_note(
        &project,
        iid,
        &developer,
        &format!(
            "{}\nNothing to see here.",
            planbot::flows::review::commands::FORK_NOTICE_MARKER
        ),
    );
    let hook = fork_mr_hook(&fake, &project, &fork, iid);
    for key in ["fork-open-1", "fork-open-2"] {
        // Opened, then a push: the notice is posted once.
        assert_eq!(
            s.deliver(
                &hook,
                &token_headers("Merge Request Hook", key, WEBHOOK_SECRET)
            )
            .await,
            200
        );
    }
    let notices = || {
        fake.notes(&project, iid)
            .into_iter()
            .filter(|n| n.body.contains("comes from a fork"))
            .count()
    };
    // Two jobs when a worker took the first before the second delivery came, else one (an
    // identical job already waits: see the test below). Waiting for exactly two once made
    // this test hang under load.
    story
        .wait_for_async("the fork notice jobs to finish", || async {
            fork_notice_jobs_when_finished(&store).await.is_some()
        })
        .await;
    let jobs = fork_notice_jobs_when_finished(&store).await.unwrap();
    assert!(
        jobs.iter().all(|j| j.state == "done") && (1..=2).contains(&jobs.len()),
        "{}",
        story.tell().await
    );
    assert_eq!(notices(), 1, "{}", story.tell().await);
    // Never planned by itself: no plan job was even queued, and no run exists.
    let kinds: Vec<String> = store
        .recent_jobs(20)
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.kind)
        .collect();
    assert!(
        kinds.iter().all(|k| k == "fork_notice"),
        "{kinds:?}\n{}",
        story.tell().await
    );
    assert!(store.recent_runs(20).await.unwrap().is_empty());
    assert!(plan_note(&fake, &project, iid).is_none());

    // A Developer is not enough for fork code.
    let h = note_hook(&fake, &project, iid, &developer, "planbot plan");
    assert_eq!(
        s.deliver(
            &h,
            &token_headers("Note Hook", "fork-note-1", WEBHOOK_SECRET)
        )
        .await,
        200
    );
    story
        .wait_for("the refusal", || {
            fake.notes(&project, iid)
                .iter()
                .any(|n| n.body.contains("only a Maintainer"))
        })
        .await;

    // A Maintainer's command plans it.
    let h = note_hook(&fake, &project, iid, &maintainer, "planbot plan");
    let mut v: serde_json::Value = serde_json::from_str(&h).unwrap();
    v["merge_request"]["source_project_id"] = fork.id.into();
    assert_eq!(
        s.deliver(
            &v.to_string(),
            &token_headers("Note Hook", "fork-note-2", WEBHOOK_SECRET)
        )
        .await,
        200
    );
    story
        .wait_for("the plan note of the fork MR", || {
            plan_note(&fake, &project, iid).is_some()
        })
        .await;
    let plans = queued_plans(&store).await;
    assert_eq!(plans.len(), 1);
    assert!(plans[0].fork);
    assert_eq!(plans[0].requested_by.map(|u| u.0), Some(maintainer.id));
}

/// A Maintainer reads a fork MR at one commit and comments `planbot plan`; the fork's author
/// pushes before planbot runs the command. The commit pushed after the comment is not planned:
/// a note says so, and a new comment on the new head plans that head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_comment_plans_the_commit_it_was_made_on_not_one_pushed_after() {
    let engine = require_engine!();
    let fake = FakeGitLab::start();
    let (project, fork, iid) = fork_mr(&fake);
    let maintainer = fake.create_user("maint");
    fake.add_member(&project, &maintainer, 40);
    let data = tempfile::tempdir().unwrap();
    let workers = Options {
        workers: true,
        reconcile: false,
    };
    let s = TestService::start(service_config(data.path(), &fake, &engine), workers).await;
    let store = s.app.store.clone();
    let story = Story {
        fake: &fake,
        project: &project,
        mrs: vec![iid],
        store: store.clone(),
    };

    let read = fake.mr_sha(&project, iid);
    let comment = fake.note_webhook(&project, iid, &maintainer, "planbot plan");
    // The fork's author pushes between the comment and planbot's run of it.
    fake.commit_files(
        &fork,
        "evil",
        &[("main.tf", &MAIN_TF.replace("blocky", "pushed-after-review"))],
    );
    let moved = fake.mr_sha(&project, iid);
    assert_ne!(read, moved);
    let headers = token_headers("Note Hook", "moved-1", WEBHOOK_SECRET);
    assert_eq!(s.deliver(&comment.to_string(), &headers).await, 200);
    let refusal = |fake: &FakeGitLab| {
        fake.notes(&project, iid)
            .into_iter()
            .find(|n| n.author_id == fake.bot().id && n.body.contains("was not run"))
    };
    story
        .wait_for("the refusal note", || refusal(&fake).is_some())
        .await;
    let body = refusal(&fake).unwrap().body;
    assert!(
        body.contains(&format!("`{}`", &read[..8])) && body.contains(&format!("`{}`", &moved[..8])),
        "names the commented and the new head: {body}"
    );
    assert!(body.contains("comment `planbot plan` again"), "{body}");
    assert!(
        queued_plans(&store).await.is_empty(),
        "{}",
        story.tell().await
    );
    assert!(plan_note(&fake, &project, iid).is_none());

    // Read again, commented again: the head the comment names is planned.
    let comment = fake.note_webhook(&project, iid, &maintainer, "planbot plan");
    let headers = token_headers("Note Hook", "moved-2", WEBHOOK_SECRET);
    assert_eq!(s.deliver(&comment.to_string(), &headers).await, 200);
    story
        .wait_for("the plan note of the fork MR", || {
            plan_note(&fake, &project, iid).is_some()
        })
        .await;
    let plans = queued_plans(&store).await;
    assert_eq!(plans.len(), 1, "{}", story.tell().await);
    assert_eq!(plans[0].head.as_str(), moved);
    assert!(plan_note(&fake, &project, iid)
        .unwrap()
        .contains("pushed-after-review"));
}

/// The interleaving that hung the test above, made certain: both deliveries are recorded
/// before any worker runs, so the second finds an identical job waiting and adds none. One
/// job, one notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deliveries_of_a_fork_mr_before_a_worker_runs_make_one_job_and_one_notice() {
    let engine = require_engine!();
    let fake = FakeGitLab::start();
    let (project, fork, iid) = fork_mr(&fake);
    let data = tempfile::tempdir().unwrap();
    let quiet = Options {
        workers: false,
        reconcile: false,
    };
    let s = TestService::start(service_config(data.path(), &fake, &engine), quiet).await;
    let hook = fork_mr_hook(&fake, &project, &fork, iid);
    for key in ["fork-open-1", "fork-open-2"] {
        assert_eq!(
            s.deliver(
                &hook,
                &token_headers("Merge Request Hook", key, WEBHOOK_SECRET)
            )
            .await,
            200
        );
    }
    let jobs = s.app.store.recent_jobs(10).await.unwrap();
    let states: Vec<(&str, &str)> = jobs
        .iter()
        .map(|j| (j.kind.as_str(), j.state.as_str()))
        .collect();
    assert_eq!(states, [("fork_notice", "queued")]);
    s.kill().await;

    let workers = Options {
        workers: true,
        reconcile: false,
    };
    let s = TestService::start(service_config(data.path(), &fake, &engine), workers).await;
    let store = s.app.store.clone();
    let story = Story {
        fake: &fake,
        project: &project,
        mrs: vec![iid],
        store: store.clone(),
    };
    story
        .wait_for_async("the fork notice job to finish", || async {
            fork_notice_jobs_when_finished(&store).await.is_some()
        })
        .await;
    let jobs = fork_notice_jobs_when_finished(&store).await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].state, "done", "{}", story.tell().await);
    let notices = fake
        .notes(&project, iid)
        .into_iter()
        .filter(|n| n.body.contains("comes from a fork"))
        .count();
    assert_eq!(notices, 1);
    assert!(plan_note(&fake, &project, iid).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_that_arrive_out_of_order_still_end_with_the_plan_of_the_last_head() {
    let engine = require_engine!();
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(&project, "main", &[("main.tf", MAIN_TF)]);
    fake.commit_files(
        &project,
        "feature/vm",
        &[("main.tf", &MAIN_TF.replace("blocky", "blocky-v2"))],
    );
    let iid = fake.open_mr(&project, "feature/vm", "main");
    let first = fake.mr_sha(&project, iid);
    let opened = mr_hook(&fake, &project, iid, "open");
    let second = fake.push(
        &project,
        "feature/vm",
        &[("main.tf", &MAIN_TF.replace("blocky", "blocky-v3"))],
    );
    let pushed = fake
        .mr_webhook(&project, iid)
        .action("update")
        .oldrev(&first)
        .body();
    let data = tempfile::tempdir().unwrap();

    // GitLab delivers the push's hook before the open's (it does not promise an order).
    let quiet = Options {
        workers: false,
        reconcile: false,
    };
    let s = TestService::start(service_config(data.path(), &fake, &engine), quiet).await;
    let headers = |key: &str| token_headers("Merge Request Hook", key, WEBHOOK_SECRET);
    let late = std::str::from_utf8(&pushed).unwrap();
    assert_eq!(s.deliver(late, &headers("e2e-push")).await, 200);
    assert_eq!(s.deliver(&opened, &headers("e2e-open")).await, 200);
    s.kill().await;

    // The older head's job finds the MR further on: the last head is planned, once.
    let workers = Options {
        workers: true,
        reconcile: false,
    };
    let s = TestService::start(service_config(data.path(), &fake, &engine), workers).await;
    let story = Story {
        fake: &fake,
        project: &project,
        mrs: vec![iid],
        store: s.app.store.clone(),
    };
    story
        .wait_for("planbot/plan success on the last head", || {
            fake.status(&project, &second, "planbot/plan")
                .is_some_and(|st| st.state == "success")
        })
        .await;
    let note = plan_note(&fake, &project, iid).unwrap();
    assert!(note.contains(&second[..8]), "{note}");
    assert!(note.contains("blocky-v3"), "{note}");
    s.after_job_ends("every job ended", 120, || s.jobs_all_ended())
        .await;
    let notes = fake.notes(&project, iid);
    assert_eq!(notes.len(), 1, "one note");
    let planned_first = fake
        .statuses(&project, &first)
        .iter()
        .any(|st| st.name == "planbot/plan" && st.state == "running");
    assert!(!planned_first, "the older head is not planned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_plan_says_so_in_its_headline_and_its_run_page_shows_the_failure_note() {
    let engine = require_engine!();
    let fake = FakeGitLab::start();
    let project = fake.create_project("infra/homelab");
    fake.commit_files(&project, "main", &[("main.tf", MAIN_TF)]);
    // A reference to a variable that does not exist: the engine's plan fails.
    fake.commit_files(
        &project,
        "feature/broken",
        &[(
            "main.tf",
            "resource \"terraform_data\" \"vm\" {\n  input = var.missing\n}\n",
        )],
    );
    let iid = fake.open_mr(&project, "feature/broken", "main");
    let head = fake.mr_sha(&project, iid);
    let data = tempfile::tempdir().unwrap();
    let workers = Options {
        workers: true,
        reconcile: false,
    };
    let s = TestService::start(service_config(data.path(), &fake, &engine), workers).await;
    let story = Story {
        fake: &fake,
        project: &project,
        mrs: vec![iid],
        store: s.app.store.clone(),
    };
    assert_eq!(
        s.deliver(
            &mr_hook(&fake, &project, iid, "open"),
            &token_headers("Merge Request Hook", "broken-1", WEBHOOK_SECRET)
        )
        .await,
        200
    );
    story
        .wait_for("planbot/plan failed", || {
            fake.statuses(&project, &head)
                .iter()
                .any(|st| st.name == "planbot/plan" && st.state == "failed")
        })
        .await;
    let note = plan_note(&fake, &project, iid).unwrap();
    let headline = note.lines().find(|l| l.starts_with("### ")).unwrap();
    assert!(headline.ends_with("· planning failed"), "{headline}");
    assert!(!headline.contains("no changes"), "{headline}");

    // The run page of the failed root shows the note that was posted, and its summary reads
    // as text: the code spans are code, no backtick is left.
    let runs = s.app.store.recent_runs(10).await.unwrap();
    let run = runs.iter().find(|r| r.state.as_str() == "failed").unwrap();
    let (code, page) = s.get_text(&format!("/runs/{}", run.id)).await;
    assert_eq!(code, 200);
    assert!(!page.contains("produced no plan note"), "{page}");
    assert!(page.contains("planning failed"), "{page}");
    let outside_the_log = page.split("<pre>").next().unwrap();
    assert!(
        !outside_the_log.contains('`'),
        "raw backticks on the run page:\n{outside_the_log}"
    );
    assert!(
        outside_the_log.contains("<dt>Summary</dt><dd><code>plan</code> failed"),
        "{outside_the_log}"
    );
}
