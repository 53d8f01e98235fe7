//! planbot behind a TLS proxy that serves it under a path prefix on a port of its own: every link
//! it writes — the plan note, the `planbot/plan` and `planbot/drift` statuses, the drift issue,
//! the apply's result note, the sign-in's redirect URI, the run pages' own links — is built from
//! `public_url`, never from the bind address, and the pages answer under the prefix.

use crate::apply_story::{call_apply, last_line, vms_mr, with_workers, world};
use crate::support::service::TestService;
use planbot::flows::context::session::Session;
use planbot::flows::drift::check::{tick, Selection};
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use std::time::SystemTime;

const PUBLIC: &str = "https://planbot.example.com:8443/planbot";

/// Every `http(s)://` address in `text`.
fn addresses(text: &str) -> Vec<String> {
    regex::Regex::new(r#"https?://[^\s)"'<>`\]]+"#)
        .unwrap()
        .find_iter(text)
        .map(|m| m.as_str().to_string())
        .collect()
}

/// The run id of the first `<PUBLIC>/runs/<id>` link in `text`.
fn run_linked(text: &str) -> u64 {
    let re = regex::Regex::new(&format!(r"{}/runs/(\d+)", regex::escape(PUBLIC))).unwrap();
    re.captures(text)
        .unwrap_or_else(|| panic!("no run page link under {PUBLIC}: {text}"))[1]
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_proxy_with_a_prefix_and_a_port_every_link_uses_public_url_and_pages_answer_under_it(
) {
    let engine = require_engine!();
    let w = world(&engine);
    let oauth = w
        .gitlab
        .register_oauth_app(&format!("{PUBLIC}/auth/callback"), &["read_user"]);
    let config = w
        .planbot
        .clone()
        .set("", "public_url", &format!("\"{PUBLIC}/\""))
        .set(
            "gitlab.oauth",
            "client_id",
            &format!("\"{}\"", oauth.client_id),
        )
        .set(
            "gitlab.oauth",
            "client_secret",
            &format!("\"{}\"", oauth.secret),
        )
        .load();
    let s = TestService::start(config, with_workers()).await;
    let gitlab_url = w.gitlab.url();
    let ours_or_gitlabs = |text: &str| {
        for a in addresses(text) {
            assert!(
                a.starts_with(&format!("{PUBLIC}/")) || a.starts_with(gitlab_url),
                "a link not built from public_url: {a} in\n{text}"
            );
        }
    };

    // The plan note and its status link the run page under the prefix, on the proxy's port.
    let iid = vms_mr(&w, &s, "add-gitlab-vm", &["blocky", "gitlab"]).await;
    let note = w.wait_for_plan(&s, iid).await;
    let run = run_linked(&note);
    assert!(
        note.contains(&format!("[run page]({PUBLIC}/runs/{run})")),
        "{note}"
    );
    ours_or_gitlabs(&note);
    let head = w.gitlab.mr_sha(&w.project, iid);
    let status = w.gitlab.status(&w.project, &head, "planbot/plan").unwrap();
    assert_eq!(
        status.target_url.as_deref(),
        Some(format!("{PUBLIC}/runs/{run}").as_str())
    );

    // The apply's result note.
    w.gitlab.merge_mr(&w.project, iid, Some(&w.alice()));
    let job = w.apply_job(61);
    w.gitlab.register_job(job.clone());
    let (_, log) = call_apply(&s, &job.token, "").await;
    assert_eq!(last_line(&log), "planbot: apply succeeded", "{log}");
    ours_or_gitlabs(&log);
    let result = w.notes_containing(iid, "planbot · applied");
    assert_eq!(result.len(), 1);
    let applied = run_linked(&result[0]);
    assert!(
        result[0].contains(&format!("]({PUBLIC}/runs/{applied})")),
        "{}",
        result[0]
    );
    ours_or_gitlabs(&result[0]);

    // The drift issue and the `planbot/drift` status.
    w.drift("blocky", 8).await;
    let checked = tick(&s.app, &Selection::default(), SystemTime::now())
        .await
        .unwrap();
    let drift_run = checked.roots[0].run.unwrap().0;
    let issue = &w.gitlab.issues(&w.project)[0];
    assert!(
        issue
            .description
            .contains(&format!("[run page]({PUBLIC}/runs/{drift_run})")),
        "{}",
        issue.description
    );
    ours_or_gitlabs(&issue.description);
    let main = w.gitlab.branch_head(&w.project, "main").unwrap();
    let drift_status = w.gitlab.status(&w.project, &main, "planbot/drift").unwrap();
    assert_eq!(
        drift_status.target_url.as_deref(),
        Some(format!("{PUBLIC}/runs/{drift_run}").as_str())
    );

    // The pages answer under the prefix (a proxy that passes it on) and at `/` (one that strips
    // it), and link under the prefix.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let session = s.app.signin.session_cookie(&Session {
        user_id: w.alice().id,
        username: "alice".into(),
        expires: u64::MAX / 2,
    });
    let cookie = session
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(
        session.to_str().unwrap().contains("Path=/planbot"),
        "{session:?}"
    );
    for path in [format!("/planbot/runs/{run}"), format!("/runs/{run}")] {
        let r = http
            .get(s.url(&path))
            .header(COOKIE, &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let page = r.text().await.unwrap().replace("&#x2f;", "/");
        assert!(page.contains("href=\"/planbot/runs\""), "{page}");
        assert!(
            page.contains("href=\"/planbot/assets/pages.css\""),
            "{page}"
        );
        assert!(!page.contains("href=\"/runs"), "{page}");
    }
    let r = http
        .get(s.url("/planbot/assets/pages.css"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Signing in stays under the prefix, and GitLab is told to come back to it.
    let r = http
        .get(s.url(&format!("/planbot/runs/{run}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let login = r.headers()[LOCATION].to_str().unwrap().to_string();
    assert_eq!(login, format!("/planbot/auth/login?next=%2Fruns%2F{run}"));
    let r = http.get(s.url(&login)).send().await.unwrap();
    assert_eq!(r.status(), 303);
    let authorize = url::Url::parse(r.headers()[LOCATION].to_str().unwrap()).unwrap();
    let redirect_uri = authorize
        .query_pairs()
        .find(|(k, _)| k == "redirect_uri")
        .map(|(_, v)| v.into_owned());
    assert_eq!(
        redirect_uri.as_deref(),
        Some(format!("{PUBLIC}/auth/callback").as_str())
    );
    let login_cookie = r.headers()[SET_COOKIE].to_str().unwrap();
    assert!(
        login_cookie.contains("Path=/planbot/auth"),
        "{login_cookie}"
    );
}
