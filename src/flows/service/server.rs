//! The HTTP application: routes, start-up recovery, workers; `Application::build(config)` then `run_until_stopped()`.

use crate::core::config::Config;
use crate::core::events::Job;
use crate::flows::context::app_state::{wipe_temp_root, App};
use crate::flows::service::{intake, pages, signin};
use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Knobs for tests; `Options::default()` is what `planbot serve` uses.
#[derive(Debug, Clone)]
pub struct Options {
    /// Start the job workers (tests turn them off to look at the queue as it is).
    pub workers: bool,
    /// Enqueue the start-up reconciliation job (open MRs whose head has no plan).
    pub reconcile: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            workers: true,
            reconcile: true,
        }
    }
}

/// A built service: the listener is bound, the store open and recovered.
pub struct Application {
    app: Arc<App>,
    listener: Option<TcpListener>,
    port: u16,
    options: Options,
    /// When this replica started: the drift schedule's "last tick" while none was ever claimed.
    started: chrono::DateTime<chrono::Utc>,
    /// When the drift schedule looks at the clock next (start-up's look already ran).
    drift_next: Option<chrono::DateTime<chrono::Utc>>,
    shutdown: CancellationToken,
    workers: Vec<JoinHandle<()>>,
}

impl Application {
    pub async fn build(config: Config) -> Result<Application> {
        Application::build_with(config, Options::default()).await
    }

    /// Open the store, recover from a previous crash, and bind `config.listen`.
    pub async fn build_with(config: Config, options: Options) -> Result<Application> {
        let listen = config.listen;
        // Bind first: a port in use (another planbot, say) fails the start before the store is
        // touched — no interrupted job requeued, no reconcile queued by a service that never ran.
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let app = App::open(config).await?;
        {
            use crate::flows::confinement::sandbox::CgroupStatus;
            let status = CgroupStatus::prepare(&app.config);
            let line = status.describe(&app.config);
            match status {
                CgroupStatus::Auto(crate::capabilities::engine::CgroupSupport::Unavailable {
                    ..
                }) => tracing::warn!("{line}"),
                _ => tracing::info!("{line}"),
            }
        }
        wipe_temp_root(&app.temp_root())?;
        app.workspace
            .wipe_checkouts()
            .context("removing checkouts left by the last run")?;
        let requeued = app.store.requeue_interrupted().await?;
        if requeued > 0 {
            tracing::warn!(
                requeued,
                "jobs interrupted by the last shutdown are queued again"
            );
        }
        let interrupted = app.store.mark_interrupted_applies().await?;
        for a in &interrupted {
            tracing::error!(
                ci_job = a.ci_job.0,
                project = a.project.0,
                sha = %a.sha,
                "an apply was interrupted by the last shutdown; it is NOT re-run: check the state and retry the job"
            );
        }
        if options.reconcile {
            app.enqueue(Job::Reconcile).await?;
        }
        // A drift tick missed while every replica was down is queued now, before any worker
        // starts (once, whatever number of occurrences were missed).
        let started = chrono::Utc::now();
        let drift_next = crate::flows::drift::schedule::look(&app, started, started).await?;
        let port = listener.local_addr()?.port();
        let app = Arc::new(app);
        for record in interrupted {
            let app = app.clone();
            tokio::spawn(async move {
                crate::flows::apply::report_interrupted(&app, &record, false).await
            });
        }
        Ok(Application {
            app,
            listener: Some(listener),
            port,
            options,
            started,
            drift_next,
            shutdown: CancellationToken::new(),
            workers: Vec::new(),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The shared state (tests read the store through it).
    pub fn app(&self) -> Arc<App> {
        self.app.clone()
    }

    /// A token that stops the service gracefully when cancelled.
    pub fn stopper(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Serve HTTP and run the workers until the stopper fires (or the future is dropped).
    pub async fn run_until_stopped(mut self) -> Result<()> {
        if self.options.workers {
            let n = self.app.config.plan.max_concurrent_plans;
            self.workers = crate::flows::service::worker::spawn_workers(
                self.app.clone(),
                n,
                self.shutdown.clone(),
            );
        }
        if self.app.config.drift.schedule.is_some() {
            self.workers
                .push(tokio::spawn(crate::flows::drift::schedule::keep(
                    self.app.clone(),
                    self.started,
                    self.drift_next,
                    self.shutdown.clone(),
                )));
        }
        let listener = self.listener.take().context("already running")?;
        let router = router(self.app.clone());
        let stop = self.shutdown.clone();
        tracing::info!(port = self.port, "planbot is serving");
        // Each request carries its peer address: it decides the loopback-only run pages
        // (`pages.auth = "loopback"`).
        crate::flows::service::connections::serve(
            listener,
            router,
            self.app.config.server.clone(),
            stop,
        )
        .await;
        Ok(())
    }
}

impl Drop for Application {
    fn drop(&mut self) {
        self.shutdown.cancel();
        for w in &self.workers {
            w.abort();
        }
    }
}

/// Every route of the service, at `/` and, when `public_url` has a path (a proxy serving
/// planbot under `https://example.com/planbot`), under that path too: the proxy may pass the
/// prefix on or strip it.
pub fn router(app: Arc<App>) -> Router {
    let base = pages::base_of(&app).to_string();
    let routes = routes(app);
    if base.is_empty() {
        return routes;
    }
    let landing = base.clone();
    Router::new()
        // `/planbot/` leads to the landing page, `/planbot`.
        .route(
            &format!("{base}/"),
            get(move || async move { axum::response::Redirect::permanent(&landing) }),
        )
        .nest(&base, routes.clone())
        .merge(routes)
}

fn routes(app: Arc<App>) -> Router {
    Router::new()
        // Each reads its body itself, bounded (`flows::context::request_body`).
        .route("/webhooks/gitlab", post(intake::gitlab_webhook))
        .route("/api/v1/apply", post(crate::flows::apply::handler))
        .route(
            "/api/v1/widgets/{report}",
            post(crate::flows::review::widgets::handler),
        )
        .route("/ci/planbot.gitlab-ci.yml", get(ci_template))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(page_routes(app.clone()))
        // Every answer, not only the pages': some echo a caller's text (a report name, a
        // refusal) as `text/plain`, which a browser must never read as anything else.
        .layer(axum::middleware::from_fn(pages::no_sniff))
        .with_state(app)
}

/// The run pages (behind [`signin::gate`]), GitLab sign-in and the pages' stylesheet, all with
/// the pages' security headers.
fn page_routes(app: Arc<App>) -> Router<Arc<App>> {
    let gated = Router::new()
        .route("/", get(pages::home))
        .route("/runs", get(pages::runs))
        .route("/runs/{id}", get(pages::run))
        .route_layer(axum::middleware::from_fn_with_state(app, signin::gate));
    Router::new()
        .merge(gated)
        .route("/auth/login", get(signin::login))
        .route(
            crate::flows::context::session::CALLBACK_PATH,
            get(signin::callback),
        )
        .route("/auth/logout", post(signin::logout))
        .route("/assets/pages.css", get(pages::stylesheet))
        .layer(axum::middleware::from_fn(pages::security_headers))
}

/// The CI template infra repos include (`include: remote:`), served as planbot ships it.
/// The CI/CD component, with this planbot's URL and apply job name as the inputs' defaults.
async fn ci_template(State(app): State<Arc<App>>) -> Response {
    let text = crate::core::ci_component::served_component(
        crate::flows::apply::CI_TEMPLATE,
        app.config.public_url.as_ref().map(|u| u.as_str()),
        &app.config.apply.job_name,
    );
    ([(header::CONTENT_TYPE, "text/yaml; charset=utf-8")], text).into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    let store = app.store.ping().await;
    let gitlab = app.gitlab_reachable().await;
    let check = |name: &str, r: &Result<()>| {
        let error = r
            .as_ref()
            .err()
            .map(|e| app.scrubber.scrub(&format!("{e:#}")).into_owned());
        minijinja::context! { name, error }
    };
    let body = crate::core::templates::render(
        "readyz.txt.j2",
        minijinja::context! { checks => [check("store", &store), check("gitlab", &gitlab)] },
    )
    .unwrap_or_else(|e| format!("planbot: readyz ({e})\n"));
    let status = if store.is_ok() && gitlab.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body).into_response()
}

/// Whether the request carries `Authorization: Bearer <metrics.token>` (compared in constant
/// time, hashed so neither length nor content shows).
fn metrics_authorized(want: &str, headers: &axum::http::HeaderMap) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    let want = Sha256::digest(want.as_bytes());
    headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.strip_prefix("Bearer "))
        .any(|got| bool::from(Sha256::digest(got.trim().as_bytes()).ct_eq(&want)))
}

async fn metrics(State(app): State<Arc<App>>, headers: axum::http::HeaderMap) -> Response {
    // No token configured: /metrics is off (planbot serve --check and doctor say how to
    // turn it on).
    let Some(want) = &app.config.metrics.token else {
        return (
            StatusCode::NOT_FOUND,
            "/metrics is off: set [metrics] token_file and scrape with Authorization: Bearer <token>\n",
        )
            .into_response();
    };
    if !metrics_authorized(want.expose(), &headers) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"planbot metrics\"")],
            "metrics need Authorization: Bearer <[metrics] token>\n",
        )
            .into_response();
    }
    if let Ok(depth) = app.store.queue_depth().await {
        app.metrics.set_queue_depth(depth);
    }
    if let Ok(roots) = app.store.drift_roots().await {
        app.metrics.set_drift(&roots);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
        .into_response()
}
