//! `POST /api/v1/apply`: the HTTP side of the apply — the job token and the optional body in,
//! the job log streamed out as plain text with keep-alive lines, the verdict last.

use super::job::{run, ApplyBody};
use super::log::{log_text, say, JobLog, Verdict};
use crate::core::apply::ApplyRefusal;
use crate::flows::context::app_state::App;
use minijinja::context;
use std::sync::Arc;

/// The apply's JSON body (`confirm` and `roots`) is small: at most this many bytes.
pub const BODY_LIMIT: usize = 64 * 1024;

/// How often the stream says it is still alive while the engine is quiet.
pub const KEEPALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(20);

/// `POST /api/v1/apply`: take the job token and the optional body, start the apply, and stream
/// its log (with keep-alive lines) as plain text. The HTTP status is 200 once streaming starts;
/// a missing token or a body that is not the documented JSON is refused at once with 401/400.
pub async fn handler(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    let peer = parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    let headers = parts.headers;
    use axum::response::IntoResponse;
    let plain = [(
        axum::http::header::CONTENT_TYPE,
        "text/plain; charset=utf-8",
    )];
    // Refused at once, the verdict the only line.
    let refused = |status: axum::http::StatusCode, why: String| {
        let line = Verdict::Refused(why).last_line();
        (status, plain.clone(), format!("{line}\n")).into_response()
    };
    let bad_body = |error: String| say(&app.scrubber, "bad_body", context! { error => error });
    let Some(token) = headers
        .get("job-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .filter(|t| !t.is_empty())
    else {
        let why = crate::core::templates::scrubbing(&app.scrubber, || {
            ApplyRefusal::InvalidJobToken.to_string()
        });
        return refused(axum::http::StatusCode::UNAUTHORIZED, why);
    };
    // A client past its wrong job tokens is not asked about to GitLab (each costs a `GET /job`).
    let trusted = &app.config.server.trusted_proxies;
    let client = crate::flows::context::limits::client(peer, &headers, trusted);
    if let Some(wait) = app.limits.wrong_tokens_blocked(client) {
        let seconds = wait.as_secs().max(1);
        tracing::info!(%client, seconds, "apply: too many wrong job tokens from this client (429)");
        let why = say(
            &app.scrubber,
            "too_many_wrong_tokens",
            context! { seconds => seconds },
        );
        let mut r = refused(axum::http::StatusCode::TOO_MANY_REQUESTS, why);
        r.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, seconds.into());
        return r;
    }
    // The job token is checked by GitLab, so the body is read first; bounded and in time.
    let body = match crate::flows::context::request_body::read(
        &headers,
        body,
        BODY_LIMIT,
        app.config.server.body_timeout,
        &app.bodies,
    )
    .await
    {
        Ok(b) => b.bytes,
        Err(refusal) => return refused(refusal.status(), bad_body(refusal.to_string())),
    };
    let parsed: ApplyBody = if body.iter().all(u8::is_ascii_whitespace) {
        ApplyBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => return refused(axum::http::StatusCode::BAD_REQUEST, bad_body(e.to_string())),
        }
    };
    let (log, rx) = JobLog::new(app.scrubber.clone());
    tokio::spawn(run(app, token, parsed, log, client));
    let stream = futures::stream::unfold(
        (
            rx,
            tokio::time::interval_at(
                tokio::time::Instant::now() + KEEPALIVE_EVERY,
                KEEPALIVE_EVERY,
            ),
            std::time::Instant::now(),
        ),
        |(mut rx, mut tick, started)| async move {
            let item = tokio::select! {
                line = rx.recv() => line?,
                _ = tick.tick() => log_text(
                    "still_working",
                    context! { seconds => started.elapsed().as_secs() },
                ) + "\n",
            };
            Some((Ok::<_, std::convert::Infallible>(item), (rx, tick, started)))
        },
    );
    (plain, axum::body::Body::from_stream(stream)).into_response()
}
