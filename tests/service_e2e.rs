//! The whole service end to end: signed-off webhooks over HTTP → SQLite queue → workers → the plan
//! flow with the real engine against the fake GitLab (real git repos), across a restart.

mod service_support;
mod support;

use planbot::core::config::Config;
use planbot::core::render::NOTE_MARKER;
use planbot::flows::server::Options;
use service_support::{fixture, token_headers, TestService, WEBHOOK_SECRET};
use support::fake_gitlab::{FakeGitLab, FakeProject, FakeUser};

const MAIN_TF: &str = r#"resource "terraform_data" "vm" {
  input = "blocky"
}
"#;

fn service_config(data: &std::path::Path, fake: &FakeGitLab, engine: &std::path::Path) -> Config {
    let text = format!(
        r#"
listen = "127.0.0.1:0"
data_dir = "{}"
public_url = "http://planbot.test"
fingerprint_key = "test-fingerprint-key-0123456789"

[gitlab]
url = "{}"
token = "{}"
webhook_secret = "{WEBHOOK_SECRET}"
projects = ["infra/homelab"]

[engine]
binary = "{}"
timeout = "5m"

[plan]
max_concurrent_plans = 2
"#,
        data.display(),
        fake.url(),
        fake.bot_token(),
        engine.display()
    );
    Config::load(&text, &[], &|_| Err("no files".into())).expect("config")
}

/// The documented Merge Request Hook payload, pointed at the fake's project and MR.
fn mr_hook(fake: &FakeGitLab, p: &FakeProject, iid: u64, action: &str) -> String {
    let mut v: serde_json::Value =
        serde_json::from_str(&fixture("webhooks/merge_request_open.json")).unwrap();
    v["project"]["id"] = p.id.into();
    v["project"]["path_with_namespace"] = p.path.clone().into();
    let a = &mut v["object_attributes"];
    a["iid"] = iid.into();
    a["action"] = action.into();
    a["source_project_id"] = p.id.into();
    a["target_project_id"] = p.id.into();
    a["target_branch"] = "main".into();
    a["last_commit"]["id"] = fake.mr_sha(p, iid).into();
    if action == "merge" {
        a["merge_commit_sha"] = fake.mr_json(p, iid)["merge_commit_sha"].clone();
    }
    v.to_string()
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
    fake.notes(p, iid)
        .into_iter()
        .find(|n| n.body.contains(NOTE_MARKER))
        .map(|n| n.body)
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    while tokio::time::Instant::now() < deadline {
        if f() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for: {what}");
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
    s.kill().await;
    assert!(plan_note(&fake, &project, iid).is_none());

    // The next start runs it: one plan note for that head, and a successful status.
    let workers = Options {
        workers: true,
        reconcile: false,
    };
    let s = TestService::start(service_config(data.path(), &fake, &engine), workers).await;
    wait_for("the plan note", || {
        plan_note(&fake, &project, iid).is_some()
    })
    .await;
    let note = plan_note(&fake, &project, iid).unwrap();
    assert!(
        note.contains(&head[..8]),
        "the note names the planned commit:\n{note}"
    );
    wait_for("planbot/plan success", || {
        fake.statuses(&project, &head)
            .iter()
            .any(|st| st.name == "planbot/plan" && st.state == "success")
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
    let both = wait_until(|| {
        plan_note(&fake, &project, a).is_some() && plan_note(&fake, &project, b).is_some()
    })
    .await;
    assert!(
        both,
        "no plan notes: jobs {:#?}\nnotes a {:?}\nnotes b {:?}",
        store.recent_jobs(10).await.unwrap(),
        fake.notes(&project, a),
        fake.notes(&project, b)
    );

    // A Reporter may not drive planbot; the answer says why.
    let hook = note_hook(&fake, &project, a, &reporter, "planbot plan");
    assert_eq!(
        s.deliver(&hook, &token_headers("Note Hook", "note-1", WEBHOOK_SECRET))
            .await,
        200
    );
    wait_for("the refusal", || {
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
    wait_for("the help note", || {
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
    wait_for_async("the bot's command job to finish", || {
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
    wait_for("the merged banner", || {
        plan_note(&fake, &project, a)
            .is_some_and(|n| n.contains("Merged — waiting for the apply job on `main`"))
    })
    .await;
    wait_for_async("a re-plan of B", || async { plans_of_b().await == 2 }).await;
}

async fn wait_until(mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    while tokio::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    false
}

async fn wait_for_async<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_mr_is_not_planned_until_a_maintainer_asks() {
    let engine = require_engine!();
    let fake = FakeGitLab::start();
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

    let mut hook: serde_json::Value =
        serde_json::from_str(&mr_hook(&fake, &project, iid, "open")).unwrap();
    hook["object_attributes"]["source_project_id"] = fork.id.into();
    for key in ["fork-open-1", "fork-open-2"] {
        // Opened, then a push: the notice is posted once.
        assert_eq!(
            s.deliver(
                &hook.to_string(),
                &token_headers("Merge Request Hook", key, WEBHOOK_SECRET)
            )
            .await,
            200
        );
    }
    let store = s.app.store.clone();
    let notices = || {
        fake.notes(&project, iid)
            .into_iter()
            .filter(|n| n.body.contains("comes from a fork"))
            .count()
    };
    wait_for_async("both fork notice jobs", || {
        let store = store.clone();
        async move {
            store
                .recent_jobs(10)
                .await
                .unwrap()
                .iter()
                .filter(|j| j.kind == "fork_notice" && j.state == "done")
                .count()
                == 2
        }
    })
    .await;
    assert_eq!(notices(), 1);
    assert!(
        plan_note(&fake, &project, iid).is_none(),
        "a fork MR is never planned by itself"
    );

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
    wait_for("the refusal", || {
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
    wait_for("the plan note of the fork MR", || {
        plan_note(&fake, &project, iid).is_some()
    })
    .await;
    let plans: Vec<_> = store
        .recent_jobs(20)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|j| match j.job {
            Some(planbot::core::events::Job::Plan(p)) => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(plans.len(), 1);
    assert!(plans[0].fork);
    assert_eq!(plans[0].requested_by.map(|u| u.0), Some(maintainer.id));
}
