//! Server-rendered pages: `GET /runs` and `GET /runs/{id}` (minijinja, HTML-escaped, no JavaScript).
//!
//! Who may read them is decided by [`crate::flows::service::signin::gate`] in front of these handlers; a
//! signed-in user sees only runs of projects they can see in GitLab, and a run of any other
//! project answers exactly like a run that does not exist (404). The plan note is rendered from
//! Markdown and sanitised ([`crate::core::note_html`]); every other value is escaped by minijinja.

use crate::capabilities::store::{RunQuery, RunRecord, RunState};
use crate::core::ids::{MrIid, ProjectId, RunId};
use crate::flows::context::app_state::App;
use crate::flows::context::session::Viewer;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::Extension;
use minijinja::context;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// How many runs one page of `/runs` lists.
pub const PER_PAGE: u32 = 50;

/// The pages' stylesheet, served at `/assets/pages.css` (the CSP allows no inline style).
pub const STYLESHEET: &str = crate::core::templates::STYLESHEET;

/// The states a run can be in, in the order the filter lists them.
const STATES: [RunState; 6] = [
    RunState::Running,
    RunState::Succeeded,
    RunState::Failed,
    RunState::Canceled,
    RunState::Refused,
    RunState::Interrupted,
];

/// A run as the pages show it.
#[derive(Serialize)]
struct RunView {
    id: u64,
    kind: &'static str,
    project: String,
    mr: Option<u64>,
    root: String,
    sha: String,
    short_sha: String,
    state: &'static str,
    started: String,
    duration: String,
    /// The summary as HTML: escaped, its `code spans` as `<code>` (rendered with `|safe`).
    summary_html: Option<String>,
    fingerprint: Option<String>,
    /// The note as sanitised HTML (rendered with `|safe`).
    note_html: Option<String>,
    log: String,
    log_lines: usize,
    /// Links back to GitLab, when the project's path is known.
    mr_url: Option<String>,
    commit_url: Option<String>,
    project_url: Option<String>,
}

fn utc(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replace('T', " ")
        .trim_end_matches('Z')
        .to_string()
}

fn duration(ms: Option<i64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms < 1000 => format!("{ms} ms"),
        Some(ms) => {
            humantime::format_duration(Duration::from_secs((ms as u64).div_ceil(1000))).to_string()
        }
    }
}

/// Where pages link to: the GitLab instance (`gitlab.url`), for links back to MRs and commits,
/// and the path prefix planbot itself is served under (`public_url`'s path, `""` for none), for
/// its own links.
#[derive(Clone, Copy)]
pub struct Links<'a> {
    pub gitlab: &'a str,
    pub base: &'a str,
}

impl<'a> Links<'a> {
    /// This planbot's links: `gitlab.url` and `public_url`'s path prefix.
    pub fn of(app: &'a App) -> Links<'a> {
        Links {
            gitlab: &app.config.gitlab.url,
            base: base_of(app),
        }
    }
}

/// The path prefix planbot is served under: `public_url`'s path (`""` for none).
pub fn base_of(app: &App) -> &str {
    app.config.public_url.as_ref().map_or("", |u| u.base_path())
}

fn view(r: &RunRecord, links: Links<'_>, with_note: bool) -> RunView {
    let project_url = r
        .project_path
        .as_ref()
        .map(|p| format!("{}/{}", links.gitlab.trim_end_matches('/'), p));
    RunView {
        id: r.id.0,
        kind: r.kind.as_str(),
        project: r
            .project_path
            .clone()
            .unwrap_or_else(|| r.project.to_string()),
        mr: r.mr.map(|m| m.0),
        root: r.root.clone(),
        sha: r.sha.to_string(),
        short_sha: r.sha.short().to_string(),
        state: r.state.as_str(),
        started: utc(r.started_at),
        duration: duration(r.duration_ms()),
        summary_html: r
            .summary
            .as_deref()
            .map(crate::core::note_html::inline_code_to_html),
        fingerprint: r.fingerprint.clone(),
        note_html: if with_note {
            r.note_markdown
                .as_deref()
                .map(crate::core::note_html::note_to_html)
        } else {
            None
        },
        log: if with_note {
            r.log.clone()
        } else {
            String::new()
        },
        log_lines: r.log.lines().count(),
        mr_url: project_url
            .as_ref()
            .zip(r.mr)
            .map(|(p, mr)| format!("{p}/-/merge_requests/{mr}")),
        commit_url: project_url
            .as_ref()
            .map(|p| format!("{p}/-/commit/{}", r.sha)),
        project_url,
    }
}

/// What the list is filtered by (`/runs?project=…&mr=…&state=…&before=…`).
#[derive(Debug, Default, Deserialize, Serialize, Clone)]
pub struct RunsQuery {
    #[serde(default)]
    pub project: Option<String>,
    #[serde(default)]
    pub mr: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub before: Option<String>,
}

impl RunsQuery {
    fn nonempty(v: &Option<String>) -> Option<&str> {
        v.as_deref().map(str::trim).filter(|s| !s.is_empty())
    }
    /// The list's address below `base` with these filters, `before` replaced.
    fn href(&self, base: &str, before: Option<u64>) -> String {
        let mut s = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("project", &self.project),
            ("mr", &self.mr),
            ("state", &self.state),
        ] {
            if let Some(v) = Self::nonempty(v) {
                s.append_pair(k, v);
            }
        }
        if let Some(b) = before {
            s.append_pair("before", &b.to_string());
        }
        let q = s.finish();
        if q.is_empty() {
            format!("{base}/runs")
        } else {
            format!("{base}/runs?{q}")
        }
    }
}

/// Everything `/runs` shows.
pub struct RunsPage<'a> {
    pub runs: &'a [RunRecord],
    /// The projects the viewer may filter by: (id, path).
    pub projects: &'a [(ProjectId, Option<String>)],
    pub query: &'a RunsQuery,
    /// The id to continue from ("Older runs"), when there are more.
    pub older: Option<u64>,
    pub user: Option<&'a str>,
    pub links: Links<'a>,
}

/// The `/runs` page.
pub fn render_runs_page(page: &RunsPage<'_>) -> String {
    let views: Vec<RunView> = page
        .runs
        .iter()
        .map(|r| view(r, page.links, false))
        .collect();
    let projects: Vec<String> = page
        .projects
        .iter()
        .map(|(id, path)| path.clone().unwrap_or_else(|| id.to_string()))
        .collect();
    let filtered = [&page.query.project, &page.query.mr, &page.query.state]
        .iter()
        .any(|v| RunsQuery::nonempty(v).is_some());
    crate::core::templates::get("pages/runs.html")
        .and_then(|t| {
            t.render(context! {
                runs => views,
                projects => projects,
                states => STATES.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                q => page.query,
                filtered => filtered,
                paged => RunsQuery::nonempty(&page.query.before).is_some(),
                older => page.older.map(|b| page.query.href(page.links.base, Some(b))),
                newest => page.query.href(page.links.base, None),
                user => page.user,
                base => page.links.base,
            })
        })
        .unwrap_or_else(|e| format!("template error: {e}"))
}

/// The `/runs` page for these runs (newest first), unfiltered.
pub fn render_runs(runs: &[RunRecord]) -> String {
    render_runs_page(&RunsPage {
        runs,
        projects: &[],
        query: &RunsQuery::default(),
        older: None,
        user: None,
        links: Links {
            gitlab: "https://gitlab.example.com",
            base: "",
        },
    })
}

/// The `/runs/{id}` page.
pub fn render_run_page(run: &RunRecord, links: Links<'_>, user: Option<&str>) -> String {
    crate::core::templates::get("pages/run.html")
        .and_then(|t| {
            t.render(context! { r => view(run, links, true), user => user, base => links.base })
        })
        .unwrap_or_else(|e| format!("template error: {e}"))
}

/// The `/runs/{id}` page (links to an example GitLab).
pub fn render_run(run: &RunRecord) -> String {
    render_run_page(
        run,
        Links {
            gitlab: "https://gitlab.example.com",
            base: "",
        },
        None,
    )
}

fn not_found(what: &str, user: Option<&str>, base: &str) -> Response {
    let body = crate::core::templates::get("pages/not_found.html")
        .and_then(|t| t.render(context! { what => what, user => user, base => base }))
        .unwrap_or_else(|e| format!("template error: {e}"));
    (StatusCode::NOT_FOUND, Html(body)).into_response()
}

/// A short page (`templates/pages/message.html`, one `kind` each): sign-in refused, signed out…
pub fn message(app: &App, status: StatusCode, kind: &str, ctx: minijinja::Value) -> Response {
    let body = crate::core::templates::get("pages/message.html")
        .and_then(|t| {
            t.render(context! {
                kind => kind,
                base => base_of(app),
                listen => app.config.listen.to_string(),
                port => app.config.listen.port(),
                ..ctx
            })
        })
        .unwrap_or_else(|e| format!("template error: {e}"));
    (status, Html(body)).into_response()
}

/// The answer to a remote client when the pages are for the planbot host only: why (no
/// sign-in configured; a request `relayed` by a proxy is never local) and the fix, with the
/// redirect URI the GitLab application needs.
pub fn loopback_only(app: &App, relayed: bool) -> Response {
    let callback = app.config.public_url.as_ref().map(|u| u.callback());
    message(
        app,
        StatusCode::FORBIDDEN,
        "loopback_only",
        context! { relayed => relayed, callback => callback },
    )
}

/// Middleware for every page and sign-in route: a strict Content-Security-Policy (no script at
/// all, styles only from `/assets/`), no sniffing, no referrer to other sites, no framing, and
/// no caching of private pages.
pub async fn security_headers(req: Request, next: Next) -> Response {
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    r
}

/// Middleware for every route: no content sniffing (an API answer or a refusal that echoes a
/// caller's text stays the `text/plain` or JSON it says it is).
pub async fn no_sniff(req: Request, next: Next) -> Response {
    let mut r = next.run(req).await;
    r.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// `GET /assets/pages.css`.
pub async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        STYLESHEET,
    )
        .into_response()
}

fn html(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

fn user_of(viewer: &Viewer) -> Option<&str> {
    match viewer {
        Viewer::User(s) => Some(s.username.as_str()),
        Viewer::Anyone => None,
    }
}

fn unavailable(e: anyhow::Error, what: &str) -> Response {
    tracing::error!(error = %format!("{e:#}"), "cannot read {what}");
    StatusCode::SERVICE_UNAVAILABLE.into_response()
}

/// The projects with runs that this viewer can see.
async fn visible_projects(
    app: &App,
    viewer: &Viewer,
) -> anyhow::Result<Vec<(ProjectId, Option<String>)>> {
    let all = app.store.run_projects().await?;
    let Viewer::User(s) = viewer else {
        return Ok(all);
    };
    let mut out = Vec::new();
    for (id, path) in all {
        if app
            .signin
            .can_see(&app.gitlab, &app.metrics, id, s.user_id)
            .await
        {
            out.push((id, path));
        }
    }
    Ok(out)
}

pub async fn runs(
    State(app): State<Arc<App>>,
    Extension(viewer): Extension<Viewer>,
    Query(q): Query<RunsQuery>,
) -> Response {
    let projects = match visible_projects(&app, &viewer).await {
        Ok(p) => p,
        Err(e) => return unavailable(e, "runs"),
    };
    let selected: Vec<ProjectId> = match RunsQuery::nonempty(&q.project) {
        None => projects.iter().map(|(id, _)| *id).collect(),
        Some(want) => projects
            .iter()
            .filter(|(id, path)| {
                id.to_string() == want
                    || path
                        .as_deref()
                        .is_some_and(|p| p.eq_ignore_ascii_case(want))
            })
            .map(|(id, _)| *id)
            .collect(),
    };
    let parse_u64 = |v: &Option<String>| {
        RunsQuery::nonempty(v).map(|s| s.trim_start_matches('!').parse::<u64>().ok())
    };
    let mr = parse_u64(&q.mr);
    let before = parse_u64(&q.before);
    let state =
        RunsQuery::nonempty(&q.state).map(|s| STATES.into_iter().find(|st| st.as_str() == s));
    // A filter that names nothing real lists nothing (rather than everything).
    let impossible =
        matches!(mr, Some(None)) || matches!(before, Some(None)) || matches!(state, Some(None));
    let mut runs = if impossible {
        Vec::new()
    } else {
        match app
            .store
            .runs_page(RunQuery {
                projects: selected,
                mr: mr.flatten().map(MrIid),
                state: state.flatten(),
                before: before.flatten().map(RunId),
                limit: PER_PAGE + 1,
            })
            .await
        {
            Ok(r) => r,
            Err(e) => return unavailable(e, "runs"),
        }
    };
    let older = if runs.len() > PER_PAGE as usize {
        runs.truncate(PER_PAGE as usize);
        runs.last().map(|r| r.id.0)
    } else {
        None
    };
    html(render_runs_page(&RunsPage {
        runs: &runs,
        projects: &projects,
        query: &q,
        older,
        user: user_of(&viewer),
        links: Links::of(&app),
    }))
}

pub async fn run(
    State(app): State<Arc<App>>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> Response {
    let user = user_of(&viewer);
    let Ok(id) = id.parse::<u64>() else {
        return not_found(&format!("Run {id}"), user, base_of(&app));
    };
    let what = format!("Run #{id}");
    match app.store.run(RunId(id)).await {
        Ok(Some(r)) => {
            if let Viewer::User(s) = &viewer {
                // Not 403: a run of a project the user cannot see does not exist for them.
                if !app
                    .signin
                    .can_see(&app.gitlab, &app.metrics, r.project, s.user_id)
                    .await
                {
                    return not_found(&what, user, base_of(&app));
                }
            }
            html(render_run_page(&r, Links::of(&app), user))
        }
        Ok(None) => not_found(&what, user, base_of(&app)),
        Err(e) => unavailable(e, "a run"),
    }
}

/// How many runs the landing page lists.
pub const HOME_RUNS: u32 = 10;

/// What `/` shows: this planbot, its latest runs, its health.
pub struct HomePage<'a> {
    pub version: &'a str,
    /// The configured projects (shown to the operator, not to a signed-in member).
    pub projects: &'a [String],
    pub sandbox: &'a str,
    pub store: &'a str,
    pub runs: &'a [RunRecord],
    /// `(name, None)` when healthy, `(name, Some(why))` when not.
    pub health: &'a [(&'a str, Option<String>)],
    pub queue_depth: Option<u64>,
    pub user: Option<&'a str>,
    pub links: Links<'a>,
}

/// The `/` page.
pub fn render_home_page(page: &HomePage<'_>) -> String {
    let runs: Vec<RunView> = page
        .runs
        .iter()
        .map(|r| view(r, page.links, false))
        .collect();
    let health: Vec<minijinja::Value> = page
        .health
        .iter()
        .map(|(name, error)| context! { name => name, error => error })
        .collect();
    crate::core::templates::get("pages/home.html")
        .and_then(|t| {
            t.render(context! {
                version => page.version,
                projects => page.projects,
                sandbox => page.sandbox,
                store => page.store,
                runs => runs,
                health => health,
                healthy => page.health.iter().all(|(_, e)| e.is_none()),
                queue_depth => page.queue_depth,
                user => page.user,
                base => page.links.base,
            })
        })
        .unwrap_or_else(|e| format!("template error: {e}"))
}

/// `GET /`: what this planbot serves (projects, version, sandbox, store), its latest runs of
/// the projects the reader can see, and its health (the checks of `/readyz`). Behind the same
/// gate as the run pages.
pub async fn home(State(app): State<Arc<App>>, Extension(viewer): Extension<Viewer>) -> Response {
    let projects = match visible_projects(&app, &viewer).await {
        Ok(p) => p,
        Err(e) => return unavailable(e, "runs"),
    };
    let runs = match app
        .store
        .runs_page(RunQuery {
            projects: projects.iter().map(|(id, _)| *id).collect(),
            mr: None,
            state: None,
            before: None,
            limit: HOME_RUNS,
        })
        .await
    {
        Ok(r) => r,
        Err(e) => return unavailable(e, "runs"),
    };
    // A signed-in member sees the projects they can see; the operator, every configured one.
    let served: Vec<String> = match &viewer {
        Viewer::Anyone => app
            .config
            .gitlab
            .projects
            .0
            .iter()
            .map(|p| p.to_string())
            .collect(),
        Viewer::User(_) => projects
            .iter()
            .map(|(id, path)| path.clone().unwrap_or_else(|| id.to_string()))
            .collect(),
    };
    let config = app.clone();
    let sandbox = tokio::task::spawn_blocking(move || {
        crate::flows::confinement::sandbox::service_mode(
            &config.config,
            crate::flows::confinement::credentials::Trust::MergeRequest,
        )
        .describe()
    })
    .await
    .unwrap_or_default();
    let problem = |r: anyhow::Result<()>| {
        r.err()
            .map(|e| app.scrubber.scrub(&format!("{e:#}")).into_owned())
    };
    let health = [
        ("store", problem(app.store.ping().await)),
        ("gitlab", problem(app.gitlab_reachable().await)),
    ];
    let store = app.config.store.url.to_string();
    html(render_home_page(&HomePage {
        version: env!("CARGO_PKG_VERSION"),
        projects: &served,
        sandbox: &sandbox,
        store: &store,
        runs: &runs,
        health: &health,
        queue_depth: app.store.queue_depth().await.ok(),
        user: user_of(&viewer),
        links: Links::of(&app),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::store::{RunKind, RunState};
    use crate::core::ids::{CommitSha, MrIid, ProjectId};

    fn record(id: u64, state: RunState, log: &str, note: Option<&str>) -> RunRecord {
        RunRecord {
            id: RunId(id),
            job: None,
            kind: RunKind::Plan,
            project: ProjectId(7),
            project_path: Some("infra/homelab".into()),
            mr: Some(MrIid(12)),
            root: "tofu/stacks/core".into(),
            sha: CommitSha("e59094b8de0f2f91abbe4760a52d9137260252d8".into()),
            state,
            started_at: 1_764_680_000_000,
            finished_at: (state != RunState::Running).then_some(1_764_680_083_400),
            summary: Some("1 to add, 0 to change, 1 to destroy".into()),
            log: log.into(),
            note_markdown: note.map(str::to_string),
            fingerprint: Some("ab".repeat(32)),
        }
    }

    #[test]
    fn runs_page() {
        let runs = vec![
            record(2, RunState::Running, "", None),
            record(1, RunState::Succeeded, "Plan: 1 to add", Some("## Plan")),
        ];
        insta::assert_snapshot!(render_runs(&runs));
    }

    #[test]
    fn empty_runs_page_says_what_to_do() {
        assert!(render_runs(&[]).contains("No runs yet"));
    }

    #[test]
    fn run_page_escapes_everything() {
        let r = record(
            1,
            RunState::Failed,
            "Error: <script>alert(1)</script> in resource \"x\"",
            Some("<!-- planbot:mr-note v1 -->\n### Plan <b>x</b>\n\n| a | b |\n|---|---|\n| <script>alert(2)</script> | [x](javascript:alert(3)) |\n"),
        );
        let page = render_run(&r);
        assert!(!page.contains("<script>"), "{page}");
        assert!(!page.contains("javascript:"), "{page}");
        assert!(page.contains("&lt;script&gt;"));
        assert!(page.contains("<table>"), "the note is rendered: {page}");
        insta::assert_snapshot!(page);
    }

    #[test]
    fn pagination_keeps_the_filters() {
        let q = RunsQuery {
            project: Some("infra/homelab".into()),
            mr: Some("".into()),
            state: Some("failed".into()),
            before: Some("90".into()),
        };
        assert_eq!(
            q.href("", Some(40)),
            "/runs?project=infra%2Fhomelab&state=failed&before=40"
        );
        assert_eq!(RunsQuery::default().href("", None), "/runs");
        assert_eq!(
            RunsQuery::default().href("/planbot", Some(3)),
            "/planbot/runs?before=3"
        );
    }
}
