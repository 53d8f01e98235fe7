//! Stories of what a flood costs: comment commands on an MR (one help note, one refusal per
//! author, nothing for a stranger, a bounded number of GitLab calls), wrong job tokens at the
//! widgets and apply endpoints (429 with `Retry-After`, no `GET /job`), and an apply whose task
//! panics (its status ends at once).

use crate::support::fake_gitlab::{FakeNote, DEVELOPER, REPORTER};
use crate::support::service::TestService;
use crate::support::world::{call_apply, verdict, World};
use planbot::flows::context::limits::{
    COMMANDS_PER_AUTHOR, COMMANDS_PER_MR, WRONG_TOKENS_PER_CLIENT,
};
use planbot::flows::review::commands::{HELP_MARKER, NO_ROLE_EMOJI, SEEN_EMOJI};

/// What one help or refusal costs GitLab at most: the author's role, the MR, its notes (one
/// page), then a note posted (the newest note read first, then the post), edited, or a reaction.
const CALLS_PER_REPLY: u32 = 5;
/// What a command from a user with no role costs: the role, then a reaction.
const CALLS_PER_STRANGER: u32 = 2;

/// An MR of alice's, open, with no plan asked for (no webhook of its opening).
fn quiet_mr(w: &World) -> u64 {
    w.gitlab
        .commit_files(&w.project, "feature", &[("README.md", "change\n")]);
    w.gitlab
        .open_mr_by(&w.project, "feature", "main", &w.alice())
}

/// Every API call the fake GitLab has answered so far.
fn calls(w: &World) -> u32 {
    w.gitlab.all_calls().values().sum()
}

/// The bot's notes on the MR.
fn bot_notes(w: &World, iid: u64) -> Vec<FakeNote> {
    let bot = w.gitlab.bot().id;
    w.gitlab
        .notes(&w.project, iid)
        .into_iter()
        .filter(|n| n.author_id == bot)
        .collect()
}

/// The comments that got the bot's reaction `emoji`.
fn reacted(w: &World, iid: u64, emoji: &str) -> usize {
    let bot = w.gitlab.bot().id;
    w.gitlab
        .notes(&w.project, iid)
        .iter()
        .filter(|n| n.awards.iter().any(|(by, e)| *by == bot && e == emoji))
        .count()
}

/// Wait until no comment command is queued or running.
async fn commands_done(s: &TestService) {
    let store = s.app.store.clone();
    s.after_job_ends("every command job ended", 120, || {
        let store = store.clone();
        async move {
            store
                .recent_jobs(500)
                .await
                .unwrap()
                .iter()
                .filter(|j| j.kind == "command")
                .all(|j| !matches!(j.state.as_str(), "queued" | "running"))
        }
    })
    .await;
}

fn all_notes(w: &World, iid: u64) -> String {
    w.gitlab
        .notes(&w.project, iid)
        .iter()
        .map(|n| n.body.as_str())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_help_comments_gets_one_help_note_and_costs_gitlab_a_bounded_number_of_calls() {
    let mut b = World::builder().member("dev", DEVELOPER);
    for i in 0..12 {
        b = b.member(&format!("dev{i}"), DEVELOPER);
    }
    let (w, s) = b.start().await;
    let iid = quiet_mr(&w);
    let before = calls(&w);
    // One developer comments `planbot help` 30 times, then 12 others once each.
    let dev = w.user("dev");
    for _ in 0..30 {
        w.say(&s, iid, &dev, "planbot help").await;
    }
    for i in 0..12 {
        w.say(&s, iid, &w.user(&format!("dev{i}")), "planbot help")
            .await;
    }
    commands_done(&s).await;

    let notes = bot_notes(&w, iid);
    assert_eq!(notes.len(), 1, "one help note: {}", all_notes(&w, iid));
    assert!(notes[0].body.starts_with(HELP_MARKER), "{}", notes[0].body);
    // The commands run (COMMANDS_PER_MR in the minute) after the first got a reaction.
    assert_eq!(reacted(&w, iid, SEEN_EMOJI), COMMANDS_PER_MR as usize - 1);
    let spent = calls(&w) - before;
    assert!(
        spent <= COMMANDS_PER_MR * CALLS_PER_REPLY + 1,
        "{spent} GitLab calls for the storm: {:?}",
        w.gitlab.all_calls()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_no_role_gets_no_note_only_a_reaction_within_the_limit() {
    let (w, s) = World::builder().start().await;
    let iid = quiet_mr(&w);
    let stranger = w.gitlab.create_user("stranger");
    let before = calls(&w);
    for _ in 0..15 {
        w.say(&s, iid, &stranger, "planbot plan").await;
    }
    commands_done(&s).await;

    assert!(
        bot_notes(&w, iid).is_empty(),
        "no note for a stranger: {}",
        all_notes(&w, iid)
    );
    assert_eq!(
        reacted(&w, iid, NO_ROLE_EMOJI),
        COMMANDS_PER_AUTHOR as usize
    );
    let spent = calls(&w) - before;
    assert!(
        spent <= COMMANDS_PER_AUTHOR * CALLS_PER_STRANGER + 1,
        "{spent} GitLab calls: {:?}",
        w.gitlab.all_calls()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reporters_commands_get_one_refusal_kept_up_to_date() {
    let (w, s) = World::builder().member("rita", REPORTER).start().await;
    let iid = quiet_mr(&w);
    let rita = w.user("rita");
    for text in ["planbot plan", "planbot plan", "planbot help"] {
        w.say(&s, iid, &rita, text).await;
        commands_done(&s).await;
    }
    let notes = bot_notes(&w, iid);
    assert_eq!(notes.len(), 1, "one refusal: {}", all_notes(&w, iid));
    let refusal = &notes[0];
    assert!(
        refusal.body.contains("`planbot help` was not run")
            && refusal.body.contains("needs the Developer role"),
        "{}",
        refusal.body
    );
    assert_eq!(refusal.edits, 1, "edited once, for `planbot help`");
    assert_eq!(
        reacted(&w, iid, SEEN_EMOJI),
        1,
        "the repeated `planbot plan`"
    );
}

/// `POST /api/v1/widgets/terraform` with `token`, through `forwarded_for` when given.
async fn widgets(s: &TestService, token: &str, forwarded_for: Option<&str>) -> reqwest::Response {
    let mut r = s
        .http
        .post(s.url("/api/v1/widgets/terraform"))
        .header("JOB-TOKEN", token);
    if let Some(ip) = forwarded_for {
        r = r.header("X-Forwarded-For", ip);
    }
    r.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_wrong_job_tokens_gets_429_without_asking_gitlab() {
    let (w, s) = World::builder().start().await;
    for i in 0..WRONG_TOKENS_PER_CLIENT {
        let token = format!("glcbt-wrong-{i}");
        let (status, log) = if i % 2 == 0 {
            let r = widgets(&s, &token, None).await;
            (r.status().as_u16(), r.text().await.unwrap())
        } else {
            call_apply(&s, &token, "").await
        };
        assert!(
            matches!(status, 200 | 401),
            "{status}: {log} (asked GitLab)"
        );
    }
    assert_eq!(
        w.gitlab.calls("GET /api/v4/job"),
        WRONG_TOKENS_PER_CLIENT,
        "one GET /job per wrong token"
    );
    // Past the limit: 429 with Retry-After at both endpoints, whatever X-Forwarded-For says
    // (no trusted proxy is configured), and GitLab is not asked.
    let r = widgets(&s, "glcbt-wrong-x", Some("198.51.100.9")).await;
    assert_eq!(r.status().as_u16(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let text = r.text().await.unwrap();
    assert!(
        text.contains("too many requests with a job token"),
        "{text}"
    );
    let r = s
        .http
        .post(s.url("/api/v1/apply"))
        .header("JOB-TOKEN", "glcbt-wrong-y")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let log = r.text().await.unwrap();
    assert!(verdict(&log).starts_with("planbot: apply refused"), "{log}");
    assert_eq!(
        w.gitlab.calls("GET /api/v4/job"),
        WRONG_TOKENS_PER_CLIENT,
        "no GET /job past the limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_limit() {
    let (w, s) = World::builder()
        .config(|c| c.set("server", "trusted_proxies", "[\"127.0.0.0/8\"]"))
        .start()
        .await;
    for i in 0..WRONG_TOKENS_PER_CLIENT {
        let r = widgets(&s, &format!("glcbt-wrong-{i}"), Some("198.51.100.1")).await;
        assert_eq!(r.status().as_u16(), 401);
    }
    let r = widgets(&s, "glcbt-wrong-x", Some("198.51.100.1")).await;
    assert_eq!(r.status().as_u16(), 429, "the flooding client");
    let r = widgets(&s, "glcbt-wrong-y", Some("198.51.100.2")).await;
    assert_eq!(
        r.status().as_u16(),
        401,
        "another client behind the same proxy"
    );
    assert_eq!(
        w.gitlab.calls("GET /api/v4/job"),
        WRONG_TOKENS_PER_CLIENT + 1
    );
}

/// Needs a debug build (CI's `cargo test` is one): the panic is asked for through
/// `planbot::flows::apply::PANIC_WHILE_APPLYING_JOB`, which only a debug build of planbot has.
/// In a release build (`cargo test --release`) this test fails saying so; it never passes
/// without running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_that_panics_ends_its_status_and_note_as_interrupted_at_once() {
    #[cfg(not(debug_assertions))]
    panic!(
        "this test needs a debug build of planbot (its panic hook, PANIC_WHILE_APPLYING_JOB, \
         exists only under debug_assertions): run it without --release"
    );
    #[cfg(debug_assertions)]
    an_apply_that_panics().await;
}

/// The story of [`an_apply_that_panics_ends_its_status_and_note_as_interrupted_at_once`].
#[cfg(debug_assertions)]
async fn an_apply_that_panics() {
    use planbot::capabilities::store::ApplyState;
    let engine = require_engine!();
    let w = World::homelab(&engine).build();
    let s = w.serve(crate::support::world::with_workers()).await;
    let main_tf = crate::support::infra_main_tf(&["blocky", "gitlab"]);
    let iid = w.open_mr(&s, "add-gitlab", &[("main.tf", &main_tf)]).await;
    w.wait_for_plan(&s, iid).await;
    let landed = w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let job = w.apply_job(4545);
    w.gitlab.register_job(job.clone());
    // A bug in the apply: its task panics once `planbot/apply` says it is applying.
    planbot::flows::apply::PANIC_WHILE_APPLYING_JOB
        .store(job.id, std::sync::atomic::Ordering::SeqCst);
    let (status, log) = call_apply(&s, &job.token, "").await;
    assert_eq!(status, 200);
    assert!(
        verdict(&log).starts_with("planbot: apply failed")
            && verdict(&log).contains("internal error (a panic)"),
        "{log}"
    );
    // At once, not at planbot's next start: the status, the note and the record say so.
    let says = w.status_says(&landed, "planbot/apply");
    assert!(
        says.starts_with("failed: interrupted by an internal error of planbot (a panic)"),
        "{says}"
    );
    assert_eq!(
        w.notes_containing(iid, "was interrupted").len(),
        1,
        "{}",
        all_notes(&w, iid)
    );
    let record = s
        .app
        .store
        .apply_for_job(planbot::core::ids::JobId(job.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, ApplyState::Interrupted);
}
