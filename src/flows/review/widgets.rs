//! `POST /api/v1/widgets/REPORT`: the reviewed plan of a merge request head as GitLab's
//! Terraform report (`terraform`) or Code Quality report (`codequality`), for the job the CI
//! component adds to merge request pipelines (`artifacts:reports`). The job is verified with
//! GitLab through its `CI_JOB_TOKEN`, as the apply's is, and gets only its own project's
//! merge request, the one of its pipeline, at the commit of its pipeline (the MR's head for a
//! merged-results pipeline).

use crate::capabilities::gitlab::{GitLabError, MergeRequest};
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use crate::core::repo_config::ForkMrs;
use crate::core::widgets::{
    mr_pipeline_ref, unplanned, MrPipelineRef, MrSource, TerraformReport, Unplanned, UnplannedHead,
    WEBHOOK_GRACE_MS,
};
use crate::flows::context::app_state::App;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use minijinja::context;
use std::sync::Arc;

/// The request body (nothing, or `{}`) is tiny: at most this many bytes.
pub const BODY_LIMIT: usize = 1024;

/// How long the job is told to wait while the plan of its head runs (`Retry-After`).
pub const RETRY_AFTER_SECONDS: u64 = 15;

/// One answer line (`templates/widgets.txt.j2`), its values scrubbed.
fn say(app: &App, kind: &str, ctx: minijinja::Value) -> String {
    crate::core::templates::scrubbing(&app.scrubber, || {
        crate::core::templates::text("widgets.txt.j2", kind, ctx)
    })
}

fn plain(status: StatusCode, text: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{text}\n"),
    )
        .into_response()
}

/// The handler: refusals are plain text with their status (401 no or a dead token, 403 a job
/// that may not have this, 404 nothing reviewed and nothing coming: a fork's head, a
/// superseded head, a closed MR, a webhook that never came; 503 with `Retry-After` while the
/// head's plan is queued or runs, or for [`WEBHOOK_GRACE_MS`] after the job was created while
/// planbot has not heard of the head), a report is JSON.
pub async fn handler(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
    axum::extract::Path(report): axum::extract::Path<String>,
    request: axum::extract::Request,
) -> Response {
    if report != "terraform" && report != "codequality" {
        return plain(
            StatusCode::NOT_FOUND,
            say(&app, "unknown_report", context! { report => report }),
        );
    }
    let (parts, body) = request.into_parts();
    let Some(token) = parts
        .headers
        .get("job-token")
        .and_then(|v| v.to_str().ok())
        .filter(|t| !t.is_empty())
        .map(str::to_string)
    else {
        return plain(
            StatusCode::UNAUTHORIZED,
            say(&app, "missing_token", context! {}),
        );
    };
    let body = match crate::flows::context::request_body::read(
        &parts.headers,
        body,
        BODY_LIMIT,
        app.config.server.body_timeout,
        &app.bodies,
    )
    .await
    {
        Ok(b) => b.bytes,
        Err(refusal) => {
            let text = say(&app, "bad_body", context! { error => refusal.to_string() });
            return plain(refusal.status(), text);
        }
    };
    if !body.iter().all(u8::is_ascii_whitespace) {
        let parsed = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&body);
        let problem = match parsed {
            Ok(m) if m.is_empty() => None,
            Ok(_) => Some("it has fields".to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(error) = problem {
            return plain(
                StatusCode::BAD_REQUEST,
                say(&app, "bad_body", context! { error => error }),
            );
        }
    }
    match serve(&app, &token, &report).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %app.scrubber.scrub(&format!("{e:#}")), "widgets: could not serve");
            plain(
                StatusCode::BAD_GATEWAY,
                say(&app, "gitlab_error", context! {}),
            )
        }
    }
}

/// Verify the job with GitLab, find its merge request head, and answer with the report.
async fn serve(app: &App, token: &str, report: &str) -> anyhow::Result<Response> {
    use anyhow::Context;
    let job = match app.gitlab.job_for_token(token).await {
        Ok(j) if j.status == "running" => j,
        Ok(_) | Err(GitLabError::Unauthorized) | Err(GitLabError::Forbidden) => {
            return Ok(plain(
                StatusCode::UNAUTHORIZED,
                say(app, "invalid_token", context! {}),
            ))
        }
        Err(e) => {
            app.metrics.gitlab_error("job_for_token");
            return Err(e).context("GET /api/v4/job");
        }
    };
    let project_id = job.pipeline.project_id;
    let not_allowed = || {
        Ok(plain(
            StatusCode::FORBIDDEN,
            say(
                app,
                "project_not_allowed",
                context! { project_id => project_id.0 },
            ),
        ))
    };
    // A job of a project planbot does not serve is refused from memory after the first time.
    let project = match app.served_project(project_id).await {
        Ok(Some(p)) => p,
        Ok(None) => return not_allowed(),
        Err(e) => return Err(e).context("GET /projects/:id"),
    };
    // The MR as GitLab has it now: read for a merged-results pipeline (its head is the commit
    // reviewed), and for a head planbot never heard of (whether a plan may still come).
    let mut mr_info = None;
    let (mr, sha) = match mr_pipeline_ref(&job.pipeline.ref_) {
        Some(MrPipelineRef::Head(iid)) => (MrIid(iid), job.pipeline.sha.clone()),
        Some(MrPipelineRef::MergedResult(iid)) => {
            let Some(m) = merge_request(app, project.id, MrIid(iid)).await? else {
                return Ok(mr_not_found(app, iid));
            };
            let Some(sha) = m.sha.clone() else {
                return Ok(mr_not_found(app, iid));
            };
            mr_info = Some(m);
            (MrIid(iid), sha)
        }
        None => {
            return Ok(plain(
                StatusCode::FORBIDDEN,
                say(
                    app,
                    "not_mr_pipeline",
                    context! { git_ref => &job.pipeline.ref_ },
                ),
            ))
        }
    };
    let found = app.store.widgets_for(project.id, mr, sha.clone()).await?;
    let retry = |kind: &str| {
        let mut r = plain(
            StatusCode::SERVICE_UNAVAILABLE,
            say(
                app,
                kind,
                context! { mr => mr.0, sha => sha.short(), seconds => RETRY_AFTER_SECONDS },
            ),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        r
    };
    if found.pending {
        return Ok(retry("pending"));
    }
    if found.roots.is_empty() {
        if app.store.head_has_plan(project.id, mr, sha.clone()).await? {
            return Ok(no_plan(app, mr, &sha));
        }
        // No plan job or run of this head. GitLab starts the pipeline and sends the webhook at
        // the same time, and the job may ask first; but some heads are never planned by
        // themselves (a fork's, a superseded one, a closed MR's), and a webhook does not come
        // after ten minutes: those get a definitive answer rather than an hour of retries.
        let m = match mr_info {
            Some(m) => m,
            None => match merge_request(app, project.id, mr).await? {
                Some(m) => m,
                None => return Ok(mr_not_found(app, mr.0)),
            },
        };
        let source = if !m.is_fork() {
            MrSource::Project
        } else {
            match crate::flows::review::commands::fork_policy(app, project.id).await? {
                ForkMrs::Comment => MrSource::ForkOnComment,
                ForkMrs::Never => MrSource::ForkNever,
            }
        };
        let job_age_ms = job
            .created_at
            .as_deref()
            .and_then(crate::core::events::gitlab_time_ms)
            .map(|created| crate::capabilities::store::now_ms() - created);
        let why = unplanned(&UnplannedHead {
            sha: &sha,
            state: &m.state,
            head: m.sha.as_ref(),
            source,
            job_age_ms,
        });
        if why == Unplanned::Expected {
            return Ok(retry(why.kind()));
        }
        tracing::info!(project = project.id.0, mr = mr.0, sha = %sha.short(), why = why.kind(), "widgets: no plan will come for this head");
        let (state, head) = match &why {
            Unplanned::NotOpen(state) => (Some(state.as_str()), None),
            Unplanned::Moved(head) => (None, head.as_ref().map(|h| h.short().to_string())),
            _ => (None, None),
        };
        return Ok(plain(
            StatusCode::NOT_FOUND,
            say(
                app,
                why.kind(),
                context! {
                    mr => mr.0,
                    sha => sha.short(),
                    state => state,
                    head => head,
                    minutes => WEBHOOK_GRACE_MS / 60_000,
                },
            ),
        ));
    }
    tracing::info!(project = project.id.0, mr = mr.0, sha = %sha.short(), report, roots = found.roots.len(), "widgets: report served");
    let json = if report == "terraform" {
        serde_json::to_string(&TerraformReport::sum(
            found.roots.iter().map(|(_, w)| &w.terraform),
        ))?
    } else {
        let issues: Vec<_> = found.roots.iter().flat_map(|(_, w)| &w.issues).collect();
        serde_json::to_string(&issues)?
    };
    Ok(([(header::CONTENT_TYPE, "application/json")], json + "\n").into_response())
}

/// The merge request, `None` when GitLab has none by that iid in the project (or hides it).
async fn merge_request(
    app: &App,
    project: ProjectId,
    mr: MrIid,
) -> anyhow::Result<Option<MergeRequest>> {
    use anyhow::Context;
    match app.gitlab.merge_request(project, mr).await {
        Ok(m) => Ok(Some(m)),
        Err(GitLabError::NotFound) | Err(GitLabError::Forbidden) => Ok(None),
        Err(e) => Err(e).context("GET /merge_requests/:iid"),
    }
}

fn mr_not_found(app: &App, iid: u64) -> Response {
    plain(
        StatusCode::NOT_FOUND,
        say(app, "mr_not_found", context! { mr => iid }),
    )
}

fn no_plan(app: &App, mr: MrIid, sha: &CommitSha) -> Response {
    plain(
        StatusCode::NOT_FOUND,
        say(app, "no_plan", context! { mr => mr.0, sha => sha.short() }),
    )
}
