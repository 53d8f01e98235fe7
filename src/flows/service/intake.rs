//! `POST /webhooks/gitlab`: check the headers, read the body (bounded), verify, parse, record,
//! enqueue — and answer within milliseconds.

use crate::capabilities::store::NewDelivery;
use crate::core::events::{self, Decision, Job, OutcomeKind};
use crate::core::webhook::{self, Presented};
use crate::flows::context::app_state::App;
use crate::flows::context::request_body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use std::sync::Arc;

/// Webhook bodies are at most 25 MiB (GitLab's own limit).
pub const BODY_LIMIT: usize = 25 * 1024 * 1024;

/// Bodies above this are parsed on the blocking pool so the runtime stays responsive.
const PARSE_INLINE_MAX: usize = 256 * 1024;

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

pub async fn gitlab_webhook(State(app): State<Arc<App>>, request: Request) -> StatusCode {
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let event_header = header(&headers, "x-gitlab-event");
    let event = events::event_label(event_header);
    let presented = Presented {
        gitlab_token: header(&headers, "x-gitlab-token"),
        webhook_id: header(&headers, "webhook-id"),
        webhook_timestamp: header(&headers, "webhook-timestamp"),
        webhook_signature: header(&headers, "webhook-signature"),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    // What the headers can prove is proven before one byte of the body is read: a wrong token
    // or a stale signature costs planbot nothing but the headers.
    if let Err(refusal) = webhook::precheck(&presented, &app.webhook, now) {
        return unauthorized(&app, event, &refusal);
    }
    // `read` holds the body's share of the shared budget until the delivery is recorded.
    let read = match read_body(&app, &headers, body, event).await {
        Ok(read) => read,
        Err(status) => return status,
    };
    let body = read.bytes.clone();
    let verified = match webhook::verify(&presented, &body, &app.webhook, now) {
        Ok(v) => v,
        Err(refusal) => return unauthorized(&app, event, &refusal),
    };
    let Some(decision) = decide(&app, event_header, &body).await else {
        return StatusCode::SERVICE_UNAVAILABLE;
    };
    // Signed: the signed webhook-id, whatever Idempotency-Key a replay carries.
    let key = webhook::dedup_key(
        verified,
        &presented,
        header(&headers, "idempotency-key"),
        &body,
    );
    let decision = within_command_limits(&app, decision);
    if decision.is_unparseable() {
        tracing::warn!(event, key, outcome = %decision.outcome, "authentic webhook that planbot cannot parse (answered 200)");
    }
    record(&app, event, key, decision).await
}

/// The delivery's comment command, when it is within the limits of
/// [`crate::flows::context::limits`] (per MR and per author on it, each minute); past them the
/// delivery is still recorded but queues nothing, so a storm of comments costs GitLab nothing.
fn within_command_limits(app: &App, mut decision: Decision) -> Decision {
    let before = decision.jobs.len();
    decision.jobs.retain(|job| {
        let Job::Command {
            project,
            mr,
            author,
            command,
            ..
        } = job
        else {
            return true;
        };
        let accepted = app.limits.command(*project, *mr, *author);
        if !accepted {
            tracing::info!(
                project = project.0,
                mr = mr.0,
                user = author.0,
                command = command.name(),
                "comment command over the limit of its merge request (or of its author there): not run"
            );
        }
        accepted
    });
    if before > 0 && decision.jobs.is_empty() {
        decision.kind = OutcomeKind::Ignored;
        decision.outcome = "ignored: comment commands over their limit".to_string();
    }
    decision
}

/// A delivery whose token or signature does not hold: 401.
fn unauthorized(app: &App, event: &str, refusal: &webhook::Refusal) -> StatusCode {
    tracing::warn!(event, reason = %refusal, "webhook refused (401)");
    app.metrics.delivery(event, "unauthorized");
    StatusCode::UNAUTHORIZED
}

/// The body, read whole within its limits (else the status that refuses it).
async fn read_body(
    app: &App,
    headers: &HeaderMap,
    body: axum::body::Body,
    event: &str,
) -> Result<request_body::ReadBody, StatusCode> {
    request_body::read(
        headers,
        body,
        BODY_LIMIT,
        app.config.server.body_timeout,
        &app.bodies,
    )
    .await
    .map_err(|refusal| {
        let status = refusal.status();
        tracing::warn!(event, reason = %refusal, status = status.as_u16(), "webhook body refused");
        app.metrics.delivery(event, "body_refused");
        status
    })
}

/// What the delivery means (a large body is parsed on the blocking pool); `None` when that
/// pool could not run it.
async fn decide(app: &Arc<App>, event_header: Option<&str>, body: &Bytes) -> Option<Decision> {
    if body.len() <= PARSE_INLINE_MAX {
        return Some(events::decide(
            event_header,
            body,
            &app.config.gitlab.projects,
        ));
    }
    let (app, body, event) = (app.clone(), body.clone(), event_header.map(str::to_string));
    tokio::task::spawn_blocking(move || {
        events::decide(event.as_deref(), &body, &app.config.gitlab.projects)
    })
    .await
    .ok()
}

/// Record the delivery and queue its jobs (a redelivery queues nothing again), and answer.
async fn record(app: &App, event: &'static str, key: String, decision: Decision) -> StatusCode {
    let kinds: Vec<&str> = decision.jobs.iter().map(|j| j.kind()).collect();
    let delivery_key = key.clone();
    let delivery = NewDelivery {
        key,
        event: event.to_string(),
        outcome: decision.outcome.clone(),
        project: decision.project,
        mr: decision.mr,
    };
    match app.store.record_delivery(delivery, decision.jobs).await {
        Ok(o) if o.duplicate => {
            tracing::info!(event, key = %delivery_key, "webhook already recorded (a redelivery): nothing queued again");
            app.metrics.delivery(event, "duplicate");
            StatusCode::OK
        }
        Ok(o) => {
            let queued: Vec<i64> = o.enqueued.iter().map(|j| j.0).collect();
            tracing::info!(
                event,
                project = decision.project.map(|p| p.0),
                mr = decision.mr.map(|m| m.0),
                outcome = %decision.outcome,
                jobs = ?kinds,
                queued = ?queued,
                "webhook accepted"
            );
            app.queue.cancel(&o.cancel_running);
            app.queue.jobs_added(o.enqueued.len());
            app.metrics.delivery(event, decision.kind.label());
            StatusCode::OK
        }
        Err(e) => {
            // Not committed: say so (GitLab counts it as a failure, which it is).
            tracing::error!(event, error = %format!("{e:#}"), "cannot record a webhook delivery");
            app.metrics.delivery(event, "store_error");
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}
