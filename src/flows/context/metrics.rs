//! Prometheus metrics (`GET /metrics`): deliveries by event and outcome, queue depth, plan durations, applies by outcome, GitLab API errors, each root's drift.

use crate::capabilities::store::DriftRootRecord;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// How a plan job ended: the one vocabulary of `planbot_plan_duration_seconds{outcome}` and of
/// the log's `plan finished` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanOutcome {
    /// Every affected root planned, no blocking finding: the status is green.
    Succeeded,
    /// A root's plan failed or errored, a lint error blocks the apply, or the repo config is
    /// invalid: the MR got a note saying why and a red status.
    Failed,
    /// A newer head or the MR's close stopped it.
    Canceled,
    /// Nothing to plan: the MR was no longer open.
    Skipped,
    /// planbot could not finish it (GitLab or git unreachable, the store): the job failed.
    Error,
}

impl PlanOutcome {
    pub fn label(self) -> &'static str {
        match self {
            PlanOutcome::Succeeded => "succeeded",
            PlanOutcome::Failed => "failed",
            PlanOutcome::Canceled => "canceled",
            PlanOutcome::Skipped => "skipped",
            PlanOutcome::Error => "error",
        }
    }
}

impl std::fmt::Display for PlanOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    event: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RootLabels {
    project: String,
    root: String,
}

/// All of planbot's metrics, registered once.
pub struct Metrics {
    registry: Registry,
    deliveries: Family<DeliveryLabels, Counter>,
    queue_depth: Gauge,
    running_jobs: Gauge,
    plan_duration: Family<OutcomeLabels, Histogram>,
    applies: Family<OutcomeLabels, Counter>,
    gitlab_errors: Family<OperationLabels, Counter>,
    drift_resources: Family<RootLabels, Gauge>,
    drift_checked: Family<RootLabels, Gauge>,
    drift_checked_ok: Family<RootLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("planbot");
        let deliveries = Family::<DeliveryLabels, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Webhook deliveries received, by X-Gitlab-Event and outcome",
            deliveries.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "Jobs waiting in the queue",
            queue_depth.clone(),
        );
        let running_jobs = Gauge::default();
        registry.register(
            "running_jobs",
            "Jobs being run by the workers",
            running_jobs.clone(),
        );
        let plan_duration = Family::<OutcomeLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.5, 2.0, 13))
        });
        registry.register(
            "plan_duration_seconds",
            "Wall time of plan jobs (all roots of one MR head), by outcome",
            plan_duration.clone(),
        );
        let applies = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "applies",
            "Apply requests (the CI job's call) ended, by outcome: succeeded, refused (nothing applied), failed, interrupted (by a restart)",
            applies.clone(),
        );
        let gitlab_errors = Family::<OperationLabels, Counter>::default();
        registry.register(
            "gitlab_api_errors",
            "Failed GitLab API calls (after retries), by operation",
            gitlab_errors.clone(),
        );
        let drift_resources = Family::<RootLabels, Gauge>::default();
        registry.register(
            "drift_resources",
            "Resources that differ from the default branch at the root's last drift check",
            drift_resources.clone(),
        );
        let drift_checked = Family::<RootLabels, Gauge>::default();
        registry.register(
            "drift_last_check_timestamp_seconds",
            "When the root was last checked for drift (whatever the outcome), unix seconds",
            drift_checked.clone(),
        );
        let drift_checked_ok = Family::<RootLabels, Gauge>::default();
        registry.register(
            "drift_last_success_timestamp_seconds",
            "When a drift check of the root last ran to the end (clean, drifted or waiting), unix seconds",
            drift_checked_ok.clone(),
        );
        Metrics {
            registry,
            deliveries,
            queue_depth,
            running_jobs,
            plan_duration,
            applies,
            gitlab_errors,
            drift_resources,
            drift_checked,
            drift_checked_ok,
        }
    }

    pub fn delivery(&self, event: &str, outcome: &str) {
        self.deliveries
            .get_or_create(&DeliveryLabels {
                event: event.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn set_queue_depth(&self, n: u64) {
        self.queue_depth.set(n as i64);
    }

    pub fn job_started(&self) {
        self.running_jobs.inc();
    }

    pub fn job_finished(&self) {
        self.running_jobs.dec();
    }

    /// One plan job ended after `d`: counted once, by the plan flow that knows how it ended.
    pub fn plan_finished(&self, d: Duration, outcome: PlanOutcome) {
        self.plan_duration
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label().to_string(),
            })
            .observe(d.as_secs_f64());
    }

    /// One apply request ended `outcome` (`succeeded`, `refused`, `failed`, `interrupted`):
    /// counted once, by the apply flow, with the verdict its job's log and status show.
    pub fn apply_finished(&self, outcome: &str) {
        self.applies
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// A GitLab API call failed (count it where the error is handled).
    pub fn gitlab_error(&self, operation: &str) {
        self.gitlab_errors
            .get_or_create(&OperationLabels {
                operation: operation.to_string(),
            })
            .inc();
    }

    /// Each root's last drift check, as the store has it (every replica shows the same; a root
    /// no longer checked has no series).
    pub fn set_drift(&self, roots: &[DriftRootRecord]) {
        self.drift_resources.clear();
        self.drift_checked.clear();
        self.drift_checked_ok.clear();
        for r in roots {
            let labels = RootLabels {
                project: r.project_path.clone(),
                root: r.root.clone(),
            };
            self.drift_resources
                .get_or_create(&labels)
                .set(i64::from(r.drifted));
            self.drift_checked
                .get_or_create(&labels)
                .set(r.checked_at / 1000);
            if let Some(ok) = r.checked_ok_at {
                self.drift_checked_ok.get_or_create(&labels).set(ok / 1000);
            }
        }
    }

    /// The Prometheus/OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_show_up_in_the_text_format() {
        let m = Metrics::new();
        m.delivery("merge_request", "accepted");
        m.delivery("merge_request", "accepted");
        m.delivery("note", "unauthorized");
        m.set_queue_depth(3);
        m.plan_finished(Duration::from_secs(3), PlanOutcome::Succeeded);
        m.gitlab_error("create_mr_note");
        m.apply_finished("refused");
        let text = m.encode();
        assert!(
            text.contains(
                r#"planbot_webhook_deliveries_total{event="merge_request",outcome="accepted"} 2"#
            ),
            "{text}"
        );
        assert!(text.contains(
            r#"planbot_webhook_deliveries_total{event="note",outcome="unauthorized"} 1"#
        ));
        assert!(text.contains("planbot_queue_depth 3"));
        assert!(text.contains(r#"planbot_plan_duration_seconds_count{outcome="succeeded"} 1"#));
        assert!(text.contains(r#"planbot_applies_total{outcome="refused"} 1"#));
        assert!(text.contains(r#"planbot_gitlab_api_errors_total{operation="create_mr_note"} 1"#));
    }
}
