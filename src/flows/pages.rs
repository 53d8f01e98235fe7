//! Server-rendered pages: `GET /runs` and `GET /runs/{id}` (minijinja, HTML-escaped, no JavaScript).

use crate::capabilities::store::RunRecord;
use crate::core::ids::RunId;
use crate::flows::app::App;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use minijinja::{context, Environment};
use serde::Serialize;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

/// How many runs `/runs` lists.
const RECENT: u32 = 200;

fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        // `.html` templates are auto-escaped by minijinja's default callback.
        for (name, src) in [
            (
                "layout.html",
                include_str!("../../templates/pages/layout.html"),
            ),
            ("runs.html", include_str!("../../templates/pages/runs.html")),
            ("run.html", include_str!("../../templates/pages/run.html")),
            (
                "not_found.html",
                include_str!("../../templates/pages/not_found.html"),
            ),
        ] {
            env.add_template(name, src).expect("page templates parse");
        }
        env
    })
}

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
    summary: Option<String>,
    fingerprint: Option<String>,
    note_markdown: Option<String>,
    log: String,
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

fn view(r: &RunRecord) -> RunView {
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
        summary: r.summary.clone(),
        fingerprint: r.fingerprint.clone(),
        note_markdown: r.note_markdown.clone(),
        log: r.log.clone(),
    }
}

/// The `/runs` page for these runs (newest first).
pub fn render_runs(runs: &[RunRecord]) -> String {
    let views: Vec<RunView> = runs.iter().map(view).collect();
    env()
        .get_template("runs.html")
        .and_then(|t| t.render(context! { runs => views }))
        .unwrap_or_else(|e| format!("template error: {e}"))
}

/// The `/runs/{id}` page.
pub fn render_run(run: &RunRecord) -> String {
    env()
        .get_template("run.html")
        .and_then(|t| t.render(context! { r => view(run) }))
        .unwrap_or_else(|e| format!("template error: {e}"))
}

fn not_found(what: &str) -> Response {
    let body = env()
        .get_template("not_found.html")
        .and_then(|t| t.render(context! { what => what }))
        .unwrap_or_else(|e| format!("template error: {e}"));
    (StatusCode::NOT_FOUND, Html(body)).into_response()
}

fn html(body: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'",
            ),
        ],
        body,
    )
        .into_response()
}

pub async fn runs(State(app): State<Arc<App>>) -> Response {
    match app.store.recent_runs(RECENT).await {
        Ok(runs) => html(render_runs(&runs)),
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "cannot read runs");
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
    }
}

pub async fn run(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<u64>() else {
        return not_found(&format!("Run {id}"));
    };
    match app.store.run(RunId(id)).await {
        Ok(Some(r)) => html(render_run(&r)),
        Ok(None) => not_found(&format!("Run #{id}")),
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "cannot read a run");
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
    }
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
            Some("<!-- planbot:mr-note v1 -->\n### Plan <b>x</b>"),
        );
        let page = render_run(&r);
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;"));
        insta::assert_snapshot!(page);
    }
}
