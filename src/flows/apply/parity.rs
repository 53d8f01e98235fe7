//! Apply stage 3: plan every root again on the merged commit, with the apply credentials and
//! each under its root lock, and decide by parity: a root is applied only when its fresh plan's
//! fingerprint is the one shown on the MR (or confirmed); one refusal refuses the whole apply
//! and shows what changed.

use super::{refuse, ApplyCtx, JobLog, Verdict};
use crate::capabilities::engine::PlannedRun;
use crate::capabilities::gitlab::StatusState;
use crate::capabilities::store::{ApplyId, ApplyState, NewRun, RunKind, RunState};
use crate::capabilities::workspace::RootFiles;
use crate::core::apply::{parity, ApplyRefusal, Parity};
use crate::core::apply_note::{render_plan_changed, PlanChangedNote};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::MrIid;
use crate::core::plan::{ActionKind, Plan};
use crate::core::plan_digest::{delta, PlanDigest};
use crate::core::render::{render_note, NoteContext, RootOutcome, RootSection, NOTE_MARKER};
use crate::core::repo_config::Root;
use crate::core::state::{self, Backend, HeldLock};
use crate::core::summary::Summary;
use crate::core::targeting::Targeting;
use crate::flows::confinement::credentials::Trust;
use crate::flows::confinement::plan_request;
use crate::flows::context::cpu::cpu_bound;
use crate::flows::context::locks::RootGuard;
use anyhow::Result;
use minijinja::context;
use std::path::Path;

/// One root after planning.
pub(super) struct Decided {
    pub root: String,
    pub run: crate::core::ids::RunId,
    pub fingerprint: Fingerprint,
    pub summary: Summary,
    pub plan_log: String,
    /// The plan to apply; `None` when there is nothing to apply.
    pub planned: Option<PlannedRun>,
    pub guard: Option<RootGuard>,
    pub refusal: Option<ApplyRefusal>,
    pub error: Option<String>,
    /// Applied on a `PLANBOT_CONFIRM` of its fingerprint, not as the plan reviewed on the MR.
    pub confirmed: bool,
}

/// Stage 3: plan every root (each under its lock) and decide. Nothing is applied unless every
/// root with changes is the reviewed plan: a half-applied main helps nobody. `Err(verdict)`
/// ends the apply here (a root failed to plan, or a refusal), already recorded and reported.
pub(super) async fn plan_and_decide(
    ctx: &ApplyCtx,
    apply_id: ApplyId,
    roots: &[&Root],
    checkout: &Path,
    confirm: Option<&str>,
    log: &JobLog,
) -> Result<Result<Vec<Decided>, Verdict>> {
    // 0. A root whose state would be written into this throwaway checkout is refused before
    //    any engine runs.
    if let Some(refusal) = roots
        .iter()
        .find_map(|r| ctx.state_in_checkout(r, checkout))
    {
        return Ok(Err(refuse_apply(ctx, apply_id, &[], refusal, log).await?));
    }
    // 1. Plan every root (each under its lock) and decide; nothing is applied unless every
    //    root with changes is the reviewed plan: a half-applied main helps nobody.
    let mut decided: Vec<Decided> = Vec::new();
    for root in roots {
        match ctx.plan_root(root, checkout, confirm).await {
            Ok(d) => decided.push(d),
            Err(failure) => {
                let verdict = Verdict::Failed(failure.clone());
                ctx.finish(apply_id, &decided, &verdict, Some(&failure))
                    .await;
                return Ok(Err(verdict));
            }
        }
    }
    if let Some(refusal) = decided.iter().find_map(|d| d.refusal.clone()) {
        return Ok(Err(
            refuse_apply(ctx, apply_id, &decided, refusal, log).await?
        ));
    }

    Ok(Ok(decided))
}

/// End the apply refused: its runs, the job log's hint and verdict, the stored apply and the
/// `planbot/apply` status.
async fn refuse_apply(
    ctx: &ApplyCtx,
    apply_id: ApplyId,
    decided: &[Decided],
    refusal: ApplyRefusal,
    log: &JobLog,
) -> Result<Verdict> {
    let verdict = refuse(log, &refusal);
    let Verdict::Refused(why) = &verdict else {
        unreachable!("refuse gives a refusal")
    };
    // The run pages say why, as the status and the job's log do.
    let because = ctx.say(
        "refused_because",
        context! { refusal => minijinja::Value::from_safe_string(why.clone()) },
    );
    for d in decided {
        ctx.end_run(d.run, RunState::Refused, &because, &d.plan_log)
            .await;
    }
    let hint = crate::core::templates::scrubbing(&ctx.app.scrubber, || refusal.hint());
    ctx.app
        .store
        .finish_apply(apply_id, ApplyState::Refused, Some(why.clone()))
        .await?;
    // `failed`: the job did not apply. A retried job's `running` then starts a new status
    // (GitLab updates only a pending/running one), so the commit shows the retry's outcome.
    ctx.status(
        StatusState::Failed,
        &ctx.say(
            "refused_because",
            context! { refusal => minijinja::Value::from_safe_string(why.clone()) },
        ),
    )
    .await;
    ctx.report_refused(decided, why, &hint).await;
    Ok(verdict)
}

impl ApplyCtx {
    /// The refusal of a root whose state is a file in the checkout, as its files declare it
    /// (read before any engine runs; a root with GitLab-managed state never is one). `None`
    /// also when the files cannot be read as HCL: then `init` tells ([`Self::plan_root`]).
    fn state_in_checkout(&self, root: &Root, checkout: &Path) -> Option<ApplyRefusal> {
        if state::gitlab_state_name(root, self.app.config.state.default).is_some() {
            return None;
        }
        let files = RootFiles::open(checkout, &root.dir)
            .and_then(|f| f.config_files())
            .ok()?;
        Backend::declared(&files)
            .filter(Backend::is_local)
            .map(|_| ApplyRefusal::StateInCheckout {
                root: root.name.clone(),
            })
    }

    /// When the engine's sandbox refused what a run needed: why, and the setting that allows
    /// it, in the job log and planbot's log.
    pub(super) fn explain_denial(&self, report: &str) {
        if let Some(hint) = crate::flows::confinement::network::explain(
            &self.app.config,
            Trust::DefaultBranch,
            report,
        ) {
            tracing::warn!(project = self.project.0, explanation = %hint, "the engine's sandbox refused what an apply needed");
            self.log.say(
                "hint",
                context! { hint => minijinja::Value::from_safe_string(hint) },
            );
        }
    }

    /// `lock` with who holds it and since when, from GitLab for GitLab-managed state (the
    /// engine's `http` backend names only the lock's ID); as it is when GitLab cannot tell.
    async fn who_holds(&self, root: &Root, lock: HeldLock) -> HeldLock {
        let Some(name) = state::gitlab_state_name(root, self.app.config.state.default) else {
            return lock;
        };
        match self
            .app
            .gitlab
            .terraform_state_lock(&self.project_path, &name)
            .await
        {
            Ok(Some(held)) => lock.held_by(&held.username, &held.locked_at),
            Ok(None) => lock,
            Err(e) => {
                self.app.metrics.gitlab_error("terraform_state_lock");
                tracing::warn!(error = %e, "could not ask GitLab who holds a state lock");
                lock
            }
        }
    }

    /// The root's lock, saying so in the job log when a plan or apply of it holds it.
    pub(super) async fn lock_root(&self, root: &Root) -> RootGuard {
        match self.app.root_locks.try_lock(self.project, &root.name) {
            Some(g) => g,
            None => {
                self.log.say("waiting", context! { root => &root.name });
                self.app.root_locks.lock(self.project, &root.name).await
            }
        }
    }

    /// The engine's plan of the root at the merged commit, with the apply credentials; a
    /// failure ends the run and is the whole apply's failure.
    pub(super) async fn plan_fresh(
        &self,
        root: &Root,
        _checkout: &Path,
        run: crate::core::ids::RunId,
        targeting: &Targeting,
    ) -> Result<PlannedRun, String> {
        self.log.say(
            "planning",
            context! { root => &root.name, dir => &root.dir },
        );
        let engine = self
            .app
            .default_branch_engine()
            .map_err(|e| format!("{e:#}"))?;
        let run_of_root = match self.runs.request(root, targeting).await {
            Ok(r) => r,
            Err(not_planned) => {
                let why = not_planned.to_string();
                self.end_run(run, RunState::Failed, &why, "").await;
                return Err(self.say(
                    "root_plan_failed",
                    context! { root => &root.name, error => why },
                ));
            }
        };
        let request = run_of_root.request;
        let slot = self.app.engine_slot().await;
        let planned = engine.plan(&run_of_root.dir, &request).await;
        drop(slot);
        match planned {
            Ok(p) => Ok(p),
            Err(e) => {
                let report = plan_request::failure_report(&request, &e);
                let report = self.app.scrubber.scrub(&report).into_owned();
                self.end_run(
                    run,
                    RunState::Failed,
                    &self.say("plan_failed", context! {}),
                    &report,
                )
                .await;
                self.log.line(&report);
                self.explain_denial(&report);
                let error = match HeldLock::from_engine_output(&report) {
                    // Someone else holds the state's lock: who, since when, and how to free it.
                    Some(lock) => {
                        let lock = self.who_holds(root, lock).await;
                        let waited =
                            humantime::format_duration(self.app.config.engine.lock_timeout);
                        let state = |kind| {
                            crate::core::templates::scrubbing(&self.app.scrubber, || {
                                crate::core::templates::text(
                                    "state.txt.j2",
                                    kind,
                                    context! {
                                        root => &root.name,
                                        who => &lock.who,
                                        created => &lock.created,
                                        id => &lock.id,
                                        waited => waited.to_string(),
                                    },
                                )
                            })
                        };
                        self.log.say(
                            "hint",
                            context! { hint => minijinja::Value::from_safe_string(state("locked_hint")) },
                        );
                        minijinja::Value::from_safe_string(state("locked"))
                    }
                    None => minijinja::Value::from(self.first_error_line(&report)),
                };
                Err(self.say(
                    "root_plan_failed",
                    context! { root => &root.name, error => error },
                ))
            }
        }
    }

    /// Lock the root, plan it with the apply credentials, and decide by parity.
    ///
    /// About a hundred lines on purpose: plan, fingerprint, reviewed fingerprint, parity and the
    /// preflight decide one `Decided` together, and the refusal path needs all of them.
    async fn plan_root(
        &self,
        root: &Root,
        checkout: &Path,
        confirm: Option<&str>,
    ) -> Result<Decided, String> {
        let guard = self.lock_root(root).await;
        let run = self
            .app
            .store
            .start_run(NewRun {
                job: None,
                kind: RunKind::Apply,
                project: self.project,
                project_path: Some(self.project_path.clone()),
                mr: self.mr_iid(),
                root: root.name.clone(),
                sha: self.sha.clone(),
            })
            .await
            .map_err(|e| format!("recording the run: {e:#}"))?;
        // The plan reviewed on the MR, and the flags it was made with (a targeted plan is
        // planned again with the same ones; the head's full plan otherwise).
        let reviewed = match &self.mr {
            Some(m) => self
                .app
                .store
                .last_shown_fingerprint(self.project, m.iid, &root.name)
                .await
                .map_err(|e| format!("{e:#}"))?,
            None => None,
        };
        let targeting = match (&self.mr, &reviewed) {
            (Some(m), Some(r)) => self
                .app
                .store
                .plan_targeting(self.project, m.iid, &r.sha, &root.name)
                .await
                .map_err(|e| format!("{e:#}"))?,
            _ => Targeting::default(),
        };
        if !targeting.is_empty() {
            self.log.say(
                "targeted",
                context! { root => &root.name, flags => targeting.engine_args().join(" ") },
            );
        }
        let planned = self.plan_fresh(root, checkout, run, &targeting).await?;
        if planned.backend().is_local() {
            // What the files did not tell, `init` did: the state would be lost. Nothing applies.
            return Ok(Decided {
                root: root.name.clone(),
                run,
                fingerprint: planned
                    .fingerprint(self.app.config.fingerprint_key.expose().as_bytes()),
                summary: Summary::of(planned.plan()),
                plan_log: planned.log().to_string(),
                planned: None,
                guard: None,
                refusal: Some(ApplyRefusal::StateInCheckout {
                    root: root.name.clone(),
                }),
                error: None,
                confirmed: false,
            });
        }
        let key_bytes = self.app.config.fingerprint_key.expose().as_bytes();
        let fingerprint = cpu_bound(|| planned.fingerprint(key_bytes));
        let plan = planned.plan();
        let summary = Summary::of(plan);
        let has_changes = plan_has_changes(plan);
        self.log.say(
            "planned",
            context! {
                root => &root.name,
                summary => summary.one_line(),
                fingerprint => fingerprint.short(),
            },
        );
        if plan.errored {
            let report = planned.log().to_string();
            self.end_run(
                run,
                RunState::Failed,
                &self.say("plan_errored", context! {}),
                &report,
            )
            .await;
            return Err(self.say("root_plan_errored", context! { root => &root.name }));
        }
        let decision = parity(
            &root.name,
            &fingerprint,
            !has_changes,
            self.mr.is_some(),
            reviewed.as_ref().map(|r| &r.fingerprint),
            confirm,
            &self.sha,
        );
        let plan_log = planned.log().to_string();
        let mut decided = Decided {
            root: root.name.clone(),
            run,
            fingerprint: fingerprint.clone(),
            summary,
            plan_log,
            planned: None,
            guard: None,
            refusal: None,
            error: None,
            confirmed: false,
        };
        let decision = match decision {
            Parity::Apply { confirmed } => {
                let policy = self
                    .policy_refusal(root, confirmed, reviewed.as_ref(), &planned, &fingerprint)
                    .await
                    .map_err(|e| format!("{e:#}"))?;
                match policy {
                    Some(refusal) => Parity::Refuse(refusal),
                    None => match self.preflight_refusal(&root.name, planned.plan()).await {
                        Some(refusal) => Parity::Refuse(refusal),
                        None => decision,
                    },
                }
            }
            other => other,
        };
        let decision = targeted_gate(decision, &root.name, &targeting, &fingerprint, confirm);
        match decision {
            Parity::NothingToApply => {}
            Parity::Apply { confirmed } => {
                self.say_why_applied(root, confirmed, &fingerprint);
                if targeting.is_partial() {
                    self.log.say(
                        "targeted_confirmed",
                        context! { root => &root.name, fingerprint => fingerprint.short() },
                    );
                }
                decided.confirmed = confirmed;
                decided.planned = Some(planned);
                decided.guard = Some(guard);
            }
            Parity::Refuse(refusal) => {
                self.print_plan(&planned, root);
                let changed = matches!(refusal, ApplyRefusal::PlanChanged { .. });
                if let (true, Some(mr), Some(reviewed)) = (changed, &self.mr, &reviewed) {
                    self.post_plan_changed(mr.iid, root, &planned, &fingerprint, reviewed)
                        .await;
                }
                decided.refusal = Some(refusal);
            }
        }
        Ok(decided)
    }

    /// Say in the job log why this root may be applied: confirmed by fingerprint, or the plan
    /// reviewed on the MR.
    pub(super) fn say_why_applied(&self, root: &Root, confirmed: bool, fingerprint: &Fingerprint) {
        if confirmed {
            self.log.say(
                "confirmed",
                context! { root => &root.name, fingerprint => fingerprint.short() },
            );
        } else {
            self.log.say(
                "reviewed",
                context! {
                    root => &root.name,
                    mr => self.mr_iid().map(|m| m.0).unwrap_or_default(),
                },
            );
        }
    }

    /// The Proxmox preflight with the apply credentials, just before applying: an error
    /// finding refuses the apply (no endpoint configured: nothing to check).
    pub(super) async fn preflight_refusal(&self, root: &str, plan: &Plan) -> Option<ApplyRefusal> {
        let config = &self.app.config;
        let endpoint = crate::flows::preflight::endpoint_from_config(
            &config.proxmox.for_apply(),
            &config.engine.env,
        );
        match crate::flows::preflight::before_apply(endpoint, plan).await {
            Ok(findings) => {
                for f in findings {
                    self.log.say(
                        "finding",
                        context! { rule => f.rule, address => &f.address, message => &f.message },
                    );
                }
                None
            }
            Err(why) => Some(ApplyRefusal::PreflightFailed {
                root: root.to_string(),
                finding: why,
            }),
        }
    }

    /// Show the fresh plan in the job log (for a direct push, this is the only review).
    pub(super) fn print_plan(&self, planned: &PlannedRun, root: &Root) {
        self.log.say("plan_is", context! { root => &root.name });
        for rc in planned
            .plan()
            .managed_changes()
            .filter(|rc| rc.has_change())
        {
            self.log.say(
                "change",
                context! {
                    symbol => rc.kind().symbol(),
                    address => rc.display_address(),
                    verb => rc.kind().verb(),
                },
            );
        }
    }

    pub(super) async fn post_plan_changed(
        &self,
        mr: MrIid,
        root: &Root,
        planned: &PlannedRun,
        fresh: &Fingerprint,
        reviewed: &crate::capabilities::store::ShownFingerprint,
    ) {
        let key = self.app.config.fingerprint_key.expose().as_bytes();
        let fresh_digest = cpu_bound(|| PlanDigest::of(planned.plan(), key));
        let reviewed_digest = self
            .app
            .store
            .digest_for(self.project, mr, &root.name, &reviewed.sha)
            .await
            .ok()
            .flatten();
        let d = reviewed_digest
            .map(|r| delta(&r, &fresh_digest))
            .unwrap_or_default();
        // The run's secrets: the config's (given to the run) and the plan's own.
        let scrubber = planned.scrubber();
        let facts = crate::core::proxmox::findings::Facts {
            parallelism: root.parallelism,
            ..Default::default()
        };
        let findings = cpu_bound(|| {
            crate::core::proxmox::lint::lint_with(planned.plan(), &root.lint_disable, &facts)
        });
        let new_plan = cpu_bound(|| {
            render_note(
                &NoteContext {
                    sha: Some(self.sha.0.clone()),
                    engine: Some(planned.version().to_string()),
                    ..NoteContext::default()
                },
                &[RootSection {
                    name: root.name.clone(),
                    outcome: RootOutcome::Planned {
                        plan: planned.plan(),
                        findings: &findings,
                        fingerprint: fresh,
                    },
                }],
                scrubber,
            )
        })
        .replace(NOTE_MARKER, "");
        let body = render_plan_changed(
            &PlanChangedNote {
                root: &root.name,
                sha: self.sha.as_str(),
                job_name: &self.app.config.apply.job_name,
                user: self.user.as_deref(),
                reviewed_short: reviewed.fingerprint.short(),
                fresh_short: fresh.short(),
                delta: &d,
                new_plan: &new_plan,
            },
            scrubber,
        );
        if let Err(e) = self
            .app
            .gitlab
            .create_mr_note(self.project, mr, &body)
            .await
        {
            self.app.metrics.gitlab_error("create_mr_note");
            tracing::warn!(error = %e, "could not post the plan-changed note");
        }
    }
}

/// A targeted plan (`-target` or `-exclude`) leaves changes of the root out: applied as
/// reviewed, they would remain unapplied without anyone having decided so at the apply. So it
/// is applied only when `PLANBOT_CONFIRM` names its fingerprint; otherwise refused, saying why.
/// A `-replace` alone plans every change, and passes as reviewed.
fn targeted_gate(
    decision: Parity,
    root: &str,
    targeting: &Targeting,
    fresh: &Fingerprint,
    confirm: Option<&str>,
) -> Parity {
    match decision {
        Parity::Apply { .. }
            if targeting.is_partial() && !confirm.is_some_and(|c| fresh.matches_prefix(c)) =>
        {
            Parity::Refuse(ApplyRefusal::TargetedPlan {
                root: root.to_string(),
                left_out: targeting.counts(),
                flags: targeting.engine_args(),
                fresh: fresh.as_hex().to_string(),
            })
        }
        other => other,
    }
}

/// Whether a plan changes anything at all (resources, moves, imports, outputs).
pub fn plan_has_changes(plan: &Plan) -> bool {
    plan.managed_changes().any(|rc| rc.has_change())
        || plan
            .output_changes
            .values()
            .any(|o| o.kind() != ActionKind::NoOp)
}
