//! `POST /api/v1/widgets/REPORT`: the reviewed plan of a merge request head as GitLab's
//! Terraform report (`terraform`) or Code Quality report (`codequality`), for the job the CI
//! component adds to merge request pipelines (`artifacts:reports`). The job is verified with
//! GitLab through its `CI_JOB_TOKEN`, as the apply's is, and gets only its own project's
//! merge request, the one of its pipeline, at the commit of its pipeline (the MR's head for a
//! merged-results pipeline).

use crate::capabilities::gitlab::{GitLabError, Job, MergeRequest};
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use crate::core::repo_config::ForkMrs;
use crate::core::widgets::{
    mr_pipeline_ref, unplanned, MrPipelineRef, MrSource, TerraformReport, Unplanned, UnplannedHead,
    WEBHOOK_GRACE_MS,
};
use crate::flows::context::app_state::App;
use anyhow::Context;
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
    let peer = parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
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
    // A client past its wrong job tokens is not asked about to GitLab (each costs a `GET /job`).
    let trusted = &app.config.server.trusted_proxies;
    let client = crate::flows::context::limits::client(peer, &parts.headers, trusted);
    if let Some(wait) = app.limits.wrong_tokens_blocked(client) {
        let seconds = wait.as_secs().max(1);
        tracing::info!(%client, seconds, "widgets: too many wrong job tokens from this client (429)");
        let text = say(
            &app,
            "too_many_wrong_tokens",
            context! { seconds => seconds },
        );
        let mut r = plain(StatusCode::TOO_MANY_REQUESTS, text);
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        return r;
    }
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
    match serve(&app, &token, client, &report).await {
        Ok(r) | Err(NoReport::Answer(r)) => r,
        Err(NoReport::Failed(e)) => {
            tracing::warn!(error = %app.scrubber.scrub(&format!("{e:#}")), "widgets: could not serve");
            plain(
                StatusCode::BAD_GATEWAY,
                say(&app, "gitlab_error", context! {}),
            )
        }
    }
}

/// Why a job gets no report: the answer it gets instead, or a GitLab call (or the store) failed.
enum NoReport {
    Answer(Response),
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for NoReport {
    fn from(e: anyhow::Error) -> NoReport {
        NoReport::Failed(e)
    }
}

/// The merge request head a pipeline's job asks about.
struct Head {
    project: ProjectId,
    mr: MrIid,
    sha: CommitSha,
    /// The MR as GitLab has it now, when it was read already (a merged-results pipeline).
    read: Option<MergeRequest>,
}

impl Head {
    /// `503` with `Retry-After`: the head's plan is queued or runs, or may still come.
    fn retry(&self, app: &App, kind: &str) -> Response {
        let seconds = RETRY_AFTER_SECONDS;
        let ctx = context! { mr => self.mr.0, sha => self.sha.short(), seconds => seconds };
        let text = say(app, kind, ctx);
        let mut r = plain(StatusCode::SERVICE_UNAVAILABLE, text);
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        r
    }
}

/// Verify the job with GitLab, find its merge request head, and answer with the report.
async fn serve(
    app: &App,
    token: &str,
    client: std::net::IpAddr,
    report: &str,
) -> Result<Response, NoReport> {
    let job = running_job(app, token, client).await?;
    let head = pipeline_head(app, &job).await?;
    let found = app
        .store
        .widgets_for(head.project, head.mr, head.sha.clone())
        .await?;
    if found.pending {
        return Err(NoReport::Answer(head.retry(app, "pending")));
    }
    if found.roots.is_empty() {
        return Err(NoReport::Answer(no_widgets(app, &job, head).await?));
    }
    let (project, mr, sha) = (head.project, head.mr, &head.sha);
    tracing::info!(project = project.0, mr = mr.0, sha = %sha.short(), report, roots = found.roots.len(), "widgets: report served");
    let json = if report == "terraform" {
        serde_json::to_string(&TerraformReport::sum(
            found.roots.iter().map(|(_, w)| &w.terraform),
        ))
    } else {
        let issues: Vec<_> = found.roots.iter().flat_map(|(_, w)| &w.issues).collect();
        serde_json::to_string(&issues)
    };
    let json = json.map_err(anyhow::Error::from)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], json + "\n").into_response())
}

/// The CI job of `token`, as GitLab has it, while it runs; a token GitLab refuses (or of a job
/// no longer running) counts against `client`.
async fn running_job(app: &App, token: &str, client: std::net::IpAddr) -> Result<Job, NoReport> {
    match app.gitlab.job_for_token(token).await {
        Ok(j) if j.status == "running" => Ok(j),
        Ok(_) | Err(GitLabError::Unauthorized) | Err(GitLabError::Forbidden) => {
            app.limits.wrong_token(client);
            Err(NoReport::Answer(plain(
                StatusCode::UNAUTHORIZED,
                say(app, "invalid_token", context! {}),
            )))
        }
        Err(e) => {
            app.metrics.gitlab_error("job_for_token");
            Err(anyhow::Error::new(e).context("GET /api/v4/job").into())
        }
    }
}

/// The merge request head `job`'s pipeline is for, in a project planbot serves: the
/// pipeline's commit, or for a merged-results pipeline the MR's head (the commit reviewed).
async fn pipeline_head(app: &App, job: &Job) -> Result<Head, NoReport> {
    let project_id = job.pipeline.project_id;
    // A job of a project planbot does not serve is refused from memory after the first time.
    let Some(project) = app
        .served_project(project_id)
        .await
        .context("GET /projects/:id")?
    else {
        let text = say(
            app,
            "project_not_allowed",
            context! { project_id => project_id.0 },
        );
        return Err(NoReport::Answer(plain(StatusCode::FORBIDDEN, text)));
    };
    let project = project.id;
    match mr_pipeline_ref(&job.pipeline.ref_) {
        Some(MrPipelineRef::Head(iid)) => Ok(Head {
            project,
            mr: MrIid(iid),
            sha: job.pipeline.sha.clone(),
            read: None,
        }),
        Some(MrPipelineRef::MergedResult(iid)) => {
            let m = merge_request(app, project, MrIid(iid)).await?;
            let Some((m, sha)) = m.and_then(|m| m.sha.clone().map(|sha| (m, sha))) else {
                return Err(NoReport::Answer(mr_not_found(app, iid)));
            };
            Ok(Head {
                project,
                mr: MrIid(iid),
                sha,
                read: Some(m),
            })
        }
        None => {
            let text = say(
                app,
                "not_mr_pipeline",
                context! { git_ref => &job.pipeline.ref_ },
            );
            Err(NoReport::Answer(plain(StatusCode::FORBIDDEN, text)))
        }
    }
}

/// The answer for a head with no widgets: `404` when it was planned (a plan that shows none)
/// or no plan will come; `503` while one may still come. GitLab starts the pipeline and sends
/// the webhook at the same time, and the job may ask first; but some heads are never planned
/// by themselves (a fork's, a superseded one, a closed MR's), and a webhook does not come
/// after ten minutes: those get a definitive answer rather than an hour of retries.
async fn no_widgets(app: &App, job: &Job, mut head: Head) -> anyhow::Result<Response> {
    let (project, mr, sha) = (head.project, head.mr, head.sha.clone());
    if app.store.head_has_plan(project, mr, sha.clone()).await? {
        return Ok(no_plan(app, mr, &sha));
    }
    let m = match head.read.take() {
        Some(m) => m,
        None => match merge_request(app, project, mr).await? {
            Some(m) => m,
            None => return Ok(mr_not_found(app, mr.0)),
        },
    };
    let source = if !m.is_fork() {
        MrSource::Project
    } else {
        match crate::flows::review::commands::fork_policy(app, project).await? {
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
        return Ok(head.retry(app, why.kind()));
    }
    tracing::info!(project = project.0, mr = mr.0, sha = %sha.short(), why = why.kind(), "widgets: no plan will come for this head");
    let (state, moved_to) = match &why {
        Unplanned::NotOpen(state) => (Some(state.as_str()), None),
        Unplanned::Moved(head) => (None, head.as_ref().map(|h| h.short().to_string())),
        _ => (None, None),
    };
    let text = say(
        app,
        why.kind(),
        context! {
            mr => mr.0,
            sha => sha.short(),
            state => state,
            head => moved_to,
            minutes => WEBHOOK_GRACE_MS / 60_000,
        },
    );
    Ok(plain(StatusCode::NOT_FOUND, text))
}

/// The merge request, `None` when GitLab has none by that iid in the project (or hides it).
async fn merge_request(
    app: &App,
    project: ProjectId,
    mr: MrIid,
) -> anyhow::Result<Option<MergeRequest>> {
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
