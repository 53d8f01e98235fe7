//! Run pages for project members only: a browser (a cookie jar, redirects followed by hand) signs
//! in with GitLab through the fake GitLab's OAuth endpoints; members read the rendered run, others
//! get 404 and an empty list; missing, forged and expired sessions go back to sign-in; a tampered
//! `state` is refused; hostile plan values are inert; without sign-in the pages are loopback-only;
//! `/metrics` can require a bearer token.

use crate::support::fake_gitlab::{FakeProject, FakeUser, GUEST, REPORTER};
use crate::support::service::{TestService, METRICS_TOKEN};
use crate::support::world::{no_workers, World};
use planbot::capabilities::store::{NewRun, RunEnd, RunKind, RunState};
use planbot::core::ids::{CommitSha, MrIid, ProjectId, RunId};
use planbot::flows::context::session::Session;
use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};
use reqwest::StatusCode;
use std::sync::Arc;

const PUBLIC_URL: &str = "http://planbot.test";

/// A plan note as planbot writes it (table, folded diff, footer).
const NOTE: &str = "<!-- planbot:mr-note v1 -->\n### 🟡 planbot · plan for `3f9a2c1e` · 1 root with changes\n\n| root | add | change | destroy |\n|---|---:|---:|---:|\n| `dns` | 2 | 0 | 2 ⚠️ |\n\n<details><summary><code>-/+ proxmox_virtual_environment_vm.blocky</code> — replace</summary>\n\n```diff\n  name    = \"blocky\"\n~ id      = \"1000\" -> (known after apply)\n```\n</details>\n\n<sub>fingerprint `9c41e07a2b3d` · re-plan: comment `planbot plan`</sub>\n";

/// planbot serving its pages (no workers) for `infra/homelab` and `infra/other`, nobody a
/// member yet; with `signin`, planbot is registered in the fake GitLab as an OAuth application.
async fn world(signin: bool, extra: &str) -> (World, TestService) {
    let mut b = World::builder()
        .no_members()
        .config(|c| c.projects(&["infra/homelab", "infra/other"]).raw(extra));
    if signin {
        b = b.signin();
    }
    let w = b.build();
    let s = w.serve(no_workers()).await;
    (w, s)
}

/// A finished plan run of `project`'s MR !`mr`, as the plan flow stores it.
async fn run(s: &TestService, project: &FakeProject, mr: u64, note: &str, log: &str) -> RunId {
    let id = s
        .app
        .store
        .start_run(NewRun {
            job: None,
            kind: RunKind::Plan,
            project: ProjectId(project.id),
            project_path: Some(project.path.clone()),
            mr: Some(MrIid(mr)),
            root: "dns".into(),
            sha: CommitSha("3f9a2c1e5b7d9f0a1c3e5b7d9f0a1c3e5b7d9f0a".into()),
        })
        .await
        .unwrap();
    s.app
        .store
        .finish_run(
            id,
            RunEnd {
                state: RunState::Succeeded,
                summary: Some("2 to add, 0 to change, 2 to destroy".into()),
                log: log.into(),
                note_markdown: Some(note.into()),
                fingerprint: None,
            },
        )
        .await
        .unwrap();
    id
}

/// A browser where `user` is signed in to GitLab (not yet to planbot).
fn browser(w: &World, user: &FakeUser) -> reqwest::Client {
    let jar = Arc::new(reqwest::cookie::Jar::default());
    jar.add_cookie_str(
        &format!("_gitlab_session={}", w.gitlab.browser_session(user)),
        &w.gitlab.url().parse().unwrap(),
    );
    reqwest::Client::builder()
        .cookie_provider(jar)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Where GitLab sends the browser back to, as the browser reaches this planbot.
fn local(s: &TestService, url: &str) -> String {
    url.replacen(PUBLIC_URL, &s.base, 1)
}

/// Open `path` signed out, follow the sign-in through GitLab by hand, and answer the
/// callback's response (before following its redirect) and the authorize redirect's target.
async fn sign_in_from(
    w: &World,
    s: &TestService,
    b: &reqwest::Client,
    path: &str,
) -> reqwest::Response {
    let r = b.get(s.url(path)).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::SEE_OTHER,
        "{path} redirects to sign-in"
    );
    let login = location(&r);
    assert!(login.starts_with("/auth/login?next="), "{login}");
    let r = b.get(s.url(&login)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let authorize = location(&r);
    assert!(
        authorize.starts_with(&format!("{}/oauth/authorize?", w.gitlab.url())),
        "{authorize}"
    );
    let r = b.get(&authorize).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::FOUND,
        "GitLab sends the browser back"
    );
    let callback = location(&r);
    assert!(
        callback.starts_with(&format!("{PUBLIC_URL}/auth/callback?")),
        "{callback}"
    );
    b.get(local(s, &callback)).send().await.unwrap()
}

/// Sign in from `path` and land on it: the page the user sees.
async fn sign_in_and_open(
    w: &World,
    s: &TestService,
    b: &reqwest::Client,
    path: &str,
) -> (StatusCode, String) {
    let r = sign_in_from(w, s, b, path).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "the callback signs in");
    assert_eq!(location(&r), path, "back where the user started");
    get(b, &s.url(path)).await
}

fn location(r: &reqwest::Response) -> String {
    r.headers()
        .get(LOCATION)
        .expect("a Location header")
        .to_str()
        .unwrap()
        .to_string()
}

/// The page's text, with the `/` minijinja escapes in attribute values read back.
async fn get(b: &reqwest::Client, url: &str) -> (StatusCode, String) {
    let r = b.get(url).send().await.unwrap();
    (r.status(), r.text().await.unwrap().replace("&#x2f;", "/"))
}

/// Every tag on the page (escaped text has no raw `<`, so each `<…>` is real markup).
fn tags(page: &str) -> Vec<&str> {
    page.split('<')
        .skip(1)
        .map(|t| t.split('>').next().unwrap_or(""))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_signs_in_and_reads_the_run_rendered_like_the_mr_note() {
    let (w, s) = world(true, "").await;
    let homelab = w.project.clone();
    let alice = w.gitlab.create_user("alice");
    w.gitlab.add_member(&homelab, &alice, REPORTER);
    let id = run(
        &s,
        &homelab,
        7,
        NOTE,
        "Plan: 2 to add, 0 to change, 2 to destroy.",
    )
    .await;
    let b = browser(&w, &alice);

    let r = sign_in_from(&w, &s, &b, &format!("/runs/{id}")).await;
    let cookie = r
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|c| c.starts_with("planbot_session="))
        .expect("a session cookie");
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/", "Max-Age=28800"] {
        assert!(cookie.contains(attr), "{attr} missing: {cookie}");
    }
    assert!(!cookie.contains("Secure"), "public_url is http: {cookie}");
    assert!(
        !cookie.contains("alice"),
        "the session is encrypted: {cookie}"
    );
    assert_eq!(location(&r), format!("/runs/{id}"));

    let (status, page) = get(&b, &s.url(&format!("/runs/{id}"))).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("Signed in as <strong>@alice</strong>"),
        "{page}"
    );
    // The note as GitLab shows it: a table, a folded diff, no raw Markdown.
    assert!(page.contains("<td><code>dns</code></td>"), "{page}");
    assert!(
        page.contains("<details><summary><code>-/+ proxmox_virtual_environment_vm.blocky</code> — replace</summary>"),
        "{page}"
    );
    assert!(!page.contains("|---|"), "{page}");
    assert!(!page.contains("&lt;details&gt;"), "{page}");
    // Links back to GitLab, and the log folded.
    assert!(
        page.contains(&format!(
            "href=\"{}/infra/homelab/-/merge_requests/7\"",
            w.gitlab.url()
        )),
        "{page}"
    );
    assert!(
        page.contains("<summary>1 line (secrets replaced)</summary>"),
        "{page}"
    );

    let (status, list) = get(&b, &s.url("/runs")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(list.contains(&format!("href=\"/runs/{id}\"")), "{list}");
    assert_eq!(w.gitlab.oauth_tokens_issued(), 1);

    // Signing out forgets the session.
    let r = b.post(s.url("/auth/logout")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = b.get(s.url("/runs")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "signed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someone_who_cannot_see_the_project_gets_404_and_an_empty_list() {
    let (w, s) = world(true, "").await;
    let homelab = w.project.clone();
    let other = w.gitlab.create_project("infra/other");
    let fork = w.gitlab.fork_project(&homelab, "bob/homelab");
    let bob = w.gitlab.create_user("bob");
    // Bob is Guest on homelab (cannot read its code), owns a fork of it, and is Reporter on other.
    w.gitlab.add_member(&homelab, &bob, GUEST);
    w.gitlab.add_member(&fork, &bob, REPORTER);
    w.gitlab.add_member(&other, &bob, REPORTER);
    // A plan of bob's fork MR is a run of the target project, homelab.
    let hidden = run(
        &s,
        &homelab,
        7,
        "### plan of infra/homelab secret-vm-name",
        "",
    )
    .await;
    let visible = run(&s, &other, 3, "### plan of infra/other", "").await;
    let b = browser(&w, &bob);

    let (status, page) = sign_in_and_open(&w, &s, &b, &format!("/runs/{visible}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");

    let (status, page) = get(&b, &s.url(&format!("/runs/{hidden}"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, missing) = get(&b, &s.url("/runs/999999")).await;
    assert_eq!(
        page.replace(&format!("#{hidden}"), "#N"),
        missing.replace("#999999", "#N"),
        "a hidden run looks exactly like one that does not exist"
    );
    assert!(!page.contains("secret-vm-name"));

    let (_, list) = get(&b, &s.url("/runs")).await;
    assert!(
        list.contains(&format!("href=\"/runs/{visible}\"")),
        "{list}"
    );
    assert!(
        !list.contains(&format!("href=\"/runs/{hidden}\"")),
        "{list}"
    );
    assert!(
        !list.contains("infra/homelab"),
        "not even in the filter: {list}"
    );
    // Filtering by the hidden project shows nothing either.
    let (_, list) = get(&b, &s.url("/runs?project=infra%2Fhomelab")).await;
    assert!(
        !list.contains(&format!("href=\"/runs/{hidden}\"")),
        "{list}"
    );
    assert!(list.contains("No runs match these filters"), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_forged_and_expired_sessions_go_back_to_sign_in() {
    let (w, s) = world(true, "").await;
    let homelab = w.project.clone();
    let id = run(&s, &homelab, 7, NOTE, "").await;
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let path = format!("/runs/{id}");

    let r = plain.get(s.url(&path)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&r), format!("/auth/login?next=%2Fruns%2F{id}"));

    let alice = w.gitlab.create_user("alice");
    w.gitlab.add_member(&homelab, &alice, REPORTER);
    let expired = s.app.signin.session_cookie(&Session {
        user_id: alice.id,
        username: "alice".into(),
        expires: 1_000_000,
    });
    let expired = expired
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let fresh = s.app.signin.session_cookie(&Session {
        user_id: alice.id,
        username: "alice".into(),
        expires: u64::MAX / 2,
    });
    let fresh = fresh
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    // Forged: a plain JSON session, and a real one with one character changed.
    let plain_json = format!(
        "planbot_session={{\"user_id\":{},\"username\":\"alice\",\"expires\":99999999999}}",
        alice.id
    );
    let mut flipped = fresh.clone().into_bytes();
    let i = flipped.len() - 5;
    flipped[i] = if flipped[i] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    for (what, cookie) in [
        ("expired", &expired),
        ("plain JSON", &plain_json),
        ("tampered", &flipped),
    ] {
        let r = plain
            .get(s.url(&path))
            .header("cookie", cookie.as_str())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{what} cookie");
        assert!(location(&r).starts_with("/auth/login"), "{what}");
        let cleared = r
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .any(|v| v.to_str().unwrap().starts_with("planbot_session=;"));
        assert!(cleared, "the {what} cookie is dropped");
    }
    // The same key with a live expiry is accepted: the refusals above are about the cookie.
    let r = plain
        .get(s.url(&path))
        .header("cookie", fresh.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_state_is_refused_without_asking_gitlab_for_a_token() {
    let (w, s) = world(true, "").await;
    let homelab = w.project.clone();
    let alice = w.gitlab.create_user("alice");
    w.gitlab.add_member(&homelab, &alice, REPORTER);
    let b = browser(&w, &alice);
    let r = b.get(s.url("/auth/login?next=/runs")).send().await.unwrap();
    let r = b.get(location(&r)).send().await.unwrap();
    let callback = location(&r);
    let url = url::Url::parse(&callback).unwrap();
    let state: String = url
        .query_pairs()
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.into_owned())
        .expect("GitLab hands the state back");
    let tampered = callback.replace(&state, &format!("{state}x"));
    let r = b.get(local(&s, &tampered)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let set: Vec<String> = r
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert!(
        !set.iter()
            .any(|c| c.starts_with("planbot_session=") && !c.starts_with("planbot_session=;")),
        "{set:?}"
    );
    let page = r.text().await.unwrap();
    assert!(page.contains("Sign-in refused"), "{page}");
    assert!(page.contains("does not match"), "{page}");
    assert_eq!(
        w.gitlab.oauth_tokens_issued(),
        0,
        "the code was not exchanged"
    );
    // A callback without the browser's login cookie (another browser) is refused too.
    let other = reqwest::Client::new();
    let (status, _) = get(&other, &local(&s, &callback)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(w.gitlab.oauth_tokens_issued(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_plan_values_are_inert_on_the_page() {
    let (w, s) = world(true, "").await;
    let homelab = w.project.clone();
    let alice = w.gitlab.create_user("alice");
    w.gitlab.add_member(&homelab, &alice, REPORTER);
    let note = "### plan\n\n| root | value |\n|---|---|\n| `dns` | <script>alert('note')</script> |\n\n[click me](javascript:alert('link')) <img src=x onerror=\"alert('img')\"> <a href=\"javascript:alert('a')\" onmouseover=\"alert('hover')\">x</a>\n\n```\n</code></pre><script>alert('fence')</script>\n```\n";
    let log = "Error: <script>alert('log')</script> <img src=x onerror=alert('logimg')>";
    let id = run(&s, &homelab, 7, note, log).await;
    let b = browser(&w, &alice);
    let r = sign_in_from(&w, &s, &b, &format!("/runs/{id}")).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = b.get(s.url(&format!("/runs/{id}"))).send().await.unwrap();
    let csp = r.headers()[CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("script-src"),
        "{csp}"
    );
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert!(r.headers().contains_key("referrer-policy"));
    let page = r.text().await.unwrap();
    for tag in tags(&page) {
        let t = tag.to_ascii_lowercase();
        let name = t.split_whitespace().next().unwrap_or("");
        assert!(
            !["script", "img", "iframe", "/script"].contains(&name),
            "<{tag}> is live on the page:\n{page}"
        );
        assert!(!t.contains(" on"), "an event handler in <{tag}>:\n{page}");
        assert!(!t.contains("javascript:"), "<{tag}>:\n{page}");
    }
    assert!(!page.contains("javascript:alert('link')"), "{page}");
    assert!(
        page.contains("&lt;script&gt;alert"),
        "the log shows the text: {page}"
    );
    assert!(page.contains("<table>"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sign_in_the_pages_answer_only_the_planbot_host_and_notes_do_not_link_them() {
    let (w, s) = world(false, "").await;
    let homelab = w.project.clone();
    let id = run(&s, &homelab, 7, NOTE, "").await;
    let http = reqwest::Client::new();
    let (status, page) = get(&http, &s.url(&format!("/runs/{id}"))).await;
    assert_eq!(status, StatusCode::OK, "a loopback client reads it");
    assert!(page.contains("<td><code>dns</code></td>"), "{page}");
    // Through a proxy on the same host, every client would look local: refused.
    let r = http
        .get(s.url("/runs"))
        .header("x-forwarded-for", "203.0.113.7")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let page = r.text().await.unwrap();
    assert!(page.contains("only served on the planbot host"), "{page}");
    assert!(!page.contains("dns"), "{page}");
    // Sign-in is off.
    let (status, _) = get(&http, &s.url("/auth/login")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Notes and statuses get no link nobody could open, but say where the log is.
    assert_eq!(s.app.run_url(RunId(12)), None);
    let port = s.app.config.listen.port();
    assert_eq!(
        s.app.run_hint(RunId(12)).as_deref(),
        Some(format!("http://localhost:{port}/runs/12").as_str())
    );
    let ctx = planbot::core::render::NoteContext {
        run_url: s.app.run_url(RunId(12)),
        run_hint: s.app.run_hint(RunId(12)),
        ..Default::default()
    };
    let note = planbot::core::render::render_note(
        &ctx,
        &[],
        &planbot::core::redact::Secrets::new().scrubber(),
    );
    assert!(
        note.contains(&format!(
            "log on the planbot host: `http://localhost:{port}/runs/12`"
        )),
        "{note}"
    );
    assert!(!note.contains("[run page]("), "{note}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_none_serves_anyone_and_check_warns() {
    let (w, s) = world(false, "[pages]\nauth = \"none\"\n").await;
    let homelab = w.project.clone();
    let id = run(&s, &homelab, 7, NOTE, "").await;
    let r = reqwest::Client::new()
        .get(s.url(&format!("/runs/{id}")))
        .header("x-forwarded-for", "203.0.113.7")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        s.app.run_url(RunId(12)).as_deref(),
        Some("http://planbot.test/runs/12")
    );
    let report = planbot::flows::cli::serve::check_report(&s.app.config);
    assert!(
        report.contains("WARNING: serve /runs to ANYONE"),
        "{report}"
    );
    let checks = planbot::flows::cli::doctor::run_checks(&s.app.config).await;
    let pages = checks
        .iter()
        .find(|c| c.section == "Run pages")
        .expect("doctor checks the run pages");
    assert_eq!(
        pages.status,
        planbot::flows::cli::doctor::Status::Warn,
        "{pages:?}"
    );
    assert!(pages.line.contains("ANYONE"), "{pages:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_require_the_bearer_token_when_one_is_configured() {
    let (_w, s) = world(false, "").await;
    let http = reqwest::Client::new();
    let (status, body) = get(&http, &s.url("/metrics")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!body.contains("planbot_"), "{body}");
    for wrong in [
        "Bearer nope",
        "Bearer metrics-token-0123456789abcdeX",
        METRICS_TOKEN,
    ] {
        let r = http
            .get(s.url("/metrics"))
            .header("authorization", wrong)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{wrong}");
    }
    let r = http
        .get(s.url("/metrics"))
        .bearer_auth(METRICS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().contains("# EOF"));
    // The token is a secret: never in --check.
    let report = planbot::flows::cli::serve::check_report(&s.app.config);
    assert!(!report.contains(METRICS_TOKEN));
    assert!(report.contains("metrics.token = (set)"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_of_every_route_says_nosniff_refusals_and_echoes_included() {
    let (_w, s) = world(false, "").await;
    let http = reqwest::Client::new();
    // A widgets report name a browser could sniff as HTML if it were echoed without the header.
    let sniffable = "/api/v1/widgets/%3Chtml%3E%3Cscript%3Ealert(1)%3C%2Fscript%3E";
    for (method, path) in [
        ("POST", "/webhooks/gitlab"),
        ("POST", "/api/v1/apply"),
        ("POST", "/api/v1/widgets/terraform"),
        ("POST", sniffable),
        ("GET", "/ci/planbot.gitlab-ci.yml"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/runs"),
        ("GET", "/no-such-route"),
    ] {
        let r = match method {
            "POST" => http.post(s.url(path)).body("{}").send().await.unwrap(),
            _ => http.get(s.url(path)).send().await.unwrap(),
        };
        assert_eq!(
            r.headers()
                .get("x-content-type-options")
                .map(|v| v.to_str().unwrap().to_string()),
            Some("nosniff".to_string()),
            "{method} {path} answered {} without nosniff",
            r.status()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_landing_page_says_what_this_planbot_serves_its_latest_runs_and_its_health() {
    let (w, s) = world(false, "").await;
    let homelab = w.project.clone();
    let first = run(&s, &homelab, 7, NOTE, "").await;
    let second = run(&s, &homelab, 8, NOTE, "").await;
    let http = reqwest::Client::new();
    let (status, page) = get(&http, &s.url("/")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    // What it serves: the version, the configured projects, the sandbox, the store.
    assert!(
        page.contains(&format!("<h1>planbot {}</h1>", env!("CARGO_PKG_VERSION"))),
        "{page}"
    );
    assert!(
        page.contains("<code>infra/homelab</code>, <code>infra/other</code>"),
        "{page}"
    );
    let sandbox = planbot::flows::confinement::sandbox::service_mode(
        &s.app.config,
        planbot::flows::confinement::credentials::Trust::MergeRequest,
    )
    .describe();
    assert!(
        page.contains(&format!("<dt>Sandbox</dt><dd>{sandbox}</dd>")),
        "{page}"
    );
    assert!(
        page.contains(&format!(
            "<code>sqlite://{}/planbot.db</code>",
            s.app.config.data_dir.display()
        )),
        "{page}"
    );
    // Its latest runs, newest first, each linking its page.
    let a = page
        .find(&format!("<a href=\"/runs/{second}\">"))
        .expect("the newest run");
    let b = page
        .find(&format!("<a href=\"/runs/{first}\">"))
        .expect("the older run");
    assert!(a < b, "newest first");
    // Its health: the checks of /readyz.
    assert!(
        page.contains("Store check</dt><dd class=\"state state-succeeded\">ok"),
        "{page}"
    );
    assert!(
        page.contains("GitLab check</dt><dd class=\"state state-succeeded\">ok"),
        "{page}"
    );
    assert!(page.contains(">healthy<"), "{page}");
    // Like the run pages, only for this host without sign-in.
    let r = http
        .get(s.url("/"))
        .header("x-forwarded-for", "203.0.113.7")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(!r.text().await.unwrap().contains("infra/homelab"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sign_in_the_landing_page_is_for_members_and_shows_only_their_projects() {
    let (w, s) = world(true, "").await;
    let homelab = w.project.clone();
    let other = w.gitlab.create_project("infra/other");
    w.gitlab.add_member(&homelab, w.gitlab.bot(), 30);
    w.gitlab.add_member(&other, w.gitlab.bot(), 30);
    let mine = run(&s, &homelab, 7, NOTE, "").await;
    let theirs = run(&s, &other, 9, NOTE, "").await;
    let alice = w.gitlab.create_user("alice");
    w.gitlab.add_member(&homelab, &alice, REPORTER);
    // Signed out: sent to sign in, like every run page.
    let b = browser(&w, &alice);
    let (status, page) = sign_in_and_open(&w, &s, &b, "/").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains(&format!("<a href=\"/runs/{mine}\">")),
        "{page}"
    );
    assert!(
        !page.contains(&format!("<a href=\"/runs/{theirs}\">")),
        "{page}"
    );
    assert!(page.contains("<code>infra/homelab</code>"), "{page}");
    assert!(
        !page.contains("infra/other"),
        "a project alice cannot see is named:\n{page}"
    );
    assert!(
        page.contains("Signed in as <strong>@alice</strong>"),
        "{page}"
    );
}
