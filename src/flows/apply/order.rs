//! Apply stage 4's dependency order (docs/workflow.md, "Several roots"): which roots an
//! upstream's failure stops, and the re-plan of a dependent after its upstream applied.
//!
//! A dependent was planned and checked against the review with every other root before
//! anything applied ([`super::parity::plan_and_decide`]); once an upstream it depends on has
//! applied, it is planned again, against the upstream's new outputs. That re-plan is applied
//! when it is the reviewed plan (or confirmed), or when it differs from the checked plan only in
//! values the checked plan showed as "known after apply" ([`crate::core::replan`]); anything
//! else is refused as a changed plan.

use super::parity::Decided;
use super::ApplyCtx;
use crate::capabilities::store::RunState;
use crate::core::apply::{parity, ApplyRefusal, Parity};
use crate::core::replan::{compare, Replan};
use crate::core::repo_config::Root;
use crate::core::summary::Summary;
use crate::flows::context::cpu::cpu_bound;
use minijinja::context;
use std::collections::BTreeMap;
use std::path::Path;

/// How a root that did not apply stops the roots below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum How {
    Failed,
    Refused,
}

impl How {
    fn name(&self) -> &'static str {
        match self {
            How::Failed => "failed",
            How::Refused => "refused",
        }
    }
}

/// The roots this apply did not get to, each with the root whose failure or refusal stopped it
/// (the first cause up its dependencies) and the root below that cause it came through.
#[derive(Default)]
pub(super) struct Stops {
    /// Root → (cause, how the cause ended). A cause is its own entry's cause.
    stopped: BTreeMap<String, (String, How)>,
}

/// Why a root is not applied because of an upstream.
pub(super) struct Stopped {
    pub cause: String,
    pub how: How,
    /// The direct upstream it came through, when that is not the cause itself.
    pub via: Option<String>,
}

impl Stops {
    /// `root` failed or was refused: it stops the roots below it.
    pub fn ended(&mut self, root: &str, how: How) {
        self.stopped
            .insert(root.to_string(), (root.to_string(), how));
    }

    /// Whether one of `upstreams` (a root's direct upstreams, in order) stops it, and why.
    pub fn stopping(&self, upstreams: &[String]) -> Option<Stopped> {
        upstreams.iter().find_map(|up| {
            self.stopped.get(up).map(|(cause, how)| Stopped {
                cause: cause.clone(),
                how: how.clone(),
                via: (cause != up).then(|| up.clone()),
            })
        })
    }

    /// Record that `root` was stopped, so the roots below it are too.
    pub fn stop(&mut self, root: &str, why: &Stopped) {
        self.stopped
            .insert(root.to_string(), (why.cause.clone(), why.how.clone()));
    }

    pub fn is_empty(&self) -> bool {
        self.stopped.is_empty()
    }
}

impl ApplyCtx {
    /// A stopped root's text: in the job's log, on its run, in the note and the status.
    pub(super) fn stopped_text(&self, why: &Stopped) -> String {
        self.say(
            "upstream_stopped",
            context! { cause => &why.cause, how => why.how.name(), via => &why.via },
        )
    }

    /// A re-plan that could not be decided (the store or the policy sets failed): its run
    /// ends failed, and `error` is the apply's failure text.
    async fn replan_failed(&self, d: &mut Decided, error: String) -> String {
        d.planned = None;
        self.end_run(
            d.run,
            RunState::Failed,
            &self.say("plan_failed", context! {}),
            &d.plan_log,
        )
        .await;
        error
    }

    /// Plan `d`'s root again now that `upstream` (one it depends on) has applied, and decide
    /// again: `d` then holds the plan to apply (or none), or its refusal. `Err`: the re-plan
    /// failed (already recorded on the run), with the apply's failure text.
    pub(super) async fn replan(
        &self,
        d: &mut Decided,
        root: &Root,
        checkout: &Path,
        confirm: Option<&str>,
        upstream: &str,
    ) -> Result<(), String> {
        self.log.say(
            "replanning",
            context! { root => &root.name, upstream => upstream },
        );
        let guard = match d.guard.take() {
            Some(g) => g,
            None => self.lock_root(root).await,
        };
        let reviewed = match &self.mr {
            Some(m) => self
                .app
                .store
                .last_shown_fingerprint(self.project, m.iid, &root.name)
                .await
                .map_err(|e| format!("{e:#}")),
            None => Ok(None),
        };
        let reviewed = match reviewed {
            Ok(r) => r,
            Err(e) => return Err(self.replan_failed(d, e).await),
        };
        // Planned again with the flags the reviewed plan was made with (h-target's targeting).
        let targeting = match (&self.mr, &reviewed) {
            (Some(m), Some(r)) => match self
                .app
                .store
                .plan_targeting(self.project, m.iid, &r.sha, &root.name)
                .await
            {
                Ok(t) => t,
                Err(e) => return Err(self.replan_failed(d, format!("{e:#}")).await),
            },
            _ => Default::default(),
        };
        let planned = self.plan_fresh(root, checkout, d.run, &targeting).await?;
        let key = self.app.config.fingerprint_key.expose().as_bytes();
        let fingerprint = cpu_bound(|| planned.fingerprint(key));
        let plan = planned.plan();
        let summary = Summary::of(plan);
        let has_changes = super::plan_has_changes(plan);
        self.log.say(
            "planned",
            context! {
                root => &root.name,
                summary => summary.one_line(),
                fingerprint => fingerprint.short(),
            },
        );
        d.plan_log = format!("{}\n{}", d.plan_log, planned.log());
        if plan.errored || planned.backend().is_local() {
            let report = planned.log().to_string();
            self.end_run(
                d.run,
                RunState::Failed,
                &self.say("plan_errored", context! {}),
                &report,
            )
            .await;
            d.planned = None;
            return Err(self.say("root_plan_errored", context! { root => &root.name }));
        }
        let mut decision = parity(
            &root.name,
            &fingerprint,
            !has_changes,
            self.mr.is_some(),
            reviewed.as_ref().map(|r| &r.fingerprint),
            confirm,
            &self.sha,
        );
        // The reviewed verdict of the policy sets covers the re-plan only when it is the
        // reviewed plan itself.
        let mut policy_reviewed = reviewed
            .as_ref()
            .filter(|r| r.fingerprint.ct_eq(&fingerprint));
        if let (Parity::Refuse(_), Some(checked)) = (&decision, d.planned.as_ref()) {
            match cpu_bound(|| compare(checked.plan(), planned.plan())) {
                Replan::Same => {
                    decision = Parity::Apply {
                        confirmed: d.confirmed,
                    }
                }
                Replan::Resolved(paths) => {
                    self.log.say(
                        "replan_resolved",
                        context! { root => &root.name, upstream => upstream, paths => paths },
                    );
                    decision = Parity::Apply {
                        confirmed: d.confirmed,
                    };
                    policy_reviewed = None;
                }
                Replan::Differs(diff) => self.log.say(
                    "replan_differs",
                    context! {
                        root => &root.name,
                        upstream => upstream,
                        diff => diff.kind.name(),
                        address => &diff.address,
                        path => diff.kind.path(),
                    },
                ),
            }
        }
        if let Parity::Apply { confirmed } = decision {
            let policy = match self
                .policy_refusal(root, confirmed, policy_reviewed, &planned, &fingerprint)
                .await
            {
                Ok(p) => p,
                Err(e) => return Err(self.replan_failed(d, format!("{e:#}")).await),
            };
            if let Some(refusal) = policy {
                decision = Parity::Refuse(refusal);
            } else if let Some(refusal) = self.preflight_refusal(&root.name, planned.plan()).await {
                decision = Parity::Refuse(refusal);
            }
        }
        d.fingerprint = fingerprint.clone();
        d.summary = summary;
        d.planned = None;
        match decision {
            Parity::NothingToApply => {}
            Parity::Apply { confirmed } => {
                self.say_why_applied(root, confirmed, &fingerprint);
                d.confirmed = confirmed;
                d.planned = Some(planned);
                d.guard = Some(guard);
            }
            Parity::Refuse(refusal) => {
                self.print_plan(&planned, root);
                if let (ApplyRefusal::PlanChanged { .. }, Some(mr), Some(reviewed)) =
                    (&refusal, &self.mr, &reviewed)
                {
                    self.post_plan_changed(mr.iid, root, &planned, &fingerprint, reviewed)
                        .await;
                }
                d.refusal = Some(refusal);
            }
        }
        Ok(())
    }
}
