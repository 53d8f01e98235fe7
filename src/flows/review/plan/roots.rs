//! Stage 2 of a plan run: plan every affected root of the repo config in `depends_on` order
//! (independent roots at once, each in one engine slot of its author's share, under no root
//! lock: an MR plan only reads), each in its own stored run: the engine, then the Proxmox
//! preflight and the lint.

use super::prepare::Prepared;
use super::shared::finish;
use crate::capabilities::engine::{
    CancelToken, Engine, EngineChecks, EngineError, FmtOfRoots, PlannedRun, ShownPlan,
};
use crate::capabilities::proxmox::ProxmoxEndpoint;
use crate::capabilities::state_gate::GateProject;
use crate::capabilities::store::{NewRun, QueueJobId, RunEnd, RunKind, RunState, UnitProgress};
use crate::core::engine_checks::CheckSet;
use crate::core::engine_checks::{fmt_outside, Check, RootChecks, StepCheck, FMT_FILE_ENDINGS};
use crate::core::events::PlanJob;
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::CommitSha;
use crate::core::ids::RunId;
use crate::core::policy::Verdict;
use crate::core::proxmox::capacity::Capacity;
use crate::core::proxmox::findings::{self, Finding};
use crate::core::proxmox::lint;
use crate::core::reach::{self, Decision};
use crate::core::render::{PlanWait, WaitOn};
use crate::core::repo_config::{RepoConfig, Root};
use crate::core::retire::RetiredBecause;
use crate::core::state;
use crate::core::targeting::Targeting;
use crate::flows::confinement::credentials::{apply_has_ssh, Trust};
use crate::flows::confinement::plan_request::{self, JobRuns, RootRun};
use crate::flows::context::app_state::App;
use crate::flows::context::cpu::cpu_bound;
use crate::flows::context::engine_slots::{EngineSlot, Waited, WaitedFor};
use crate::flows::context::plan_reuse::{PlanShown, Reusable};
use crate::flows::context::policy_sets::PolicySets;
use crate::flows::preflight;
use anyhow::Result;
use std::collections::BTreeMap;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// One root's result, kept until the note is rendered and the runs are recorded.
pub(super) enum Outcome {
    Planned {
        run: RunId,
        /// The plan as shown (its plan file is gone: an MR's plan is never applied); shared
        /// with the reuse cache.
        planned: std::sync::Arc<ShownPlan>,
        /// The head it was planned at, when reused from an earlier push
        /// (`flows::context::plan_reuse`): nothing it depends on changed since.
        reused: Option<crate::core::ids::CommitSha>,
        findings: Vec<Finding>,
        fingerprint: Fingerprint,
        /// The policy sets' verdict on the plan (no set when none checks the root); `None`
        /// when the plan errored (it cannot be applied, so nothing is checked).
        policy: Option<Verdict>,
        /// What the engine's checks said (redacted).
        checks: RootChecks,
    },
    Failed {
        run: RunId,
        error: String,
        /// How the run was ended (before the note existed); recorded again with the note.
        end: RunEnd,
        /// What the engine's checks said (redacted): they run after a failed plan too.
        checks: RootChecks,
    },
    Skipped {
        reason: String,
    },
}

pub(super) struct RootResult {
    pub name: String,
    pub outcome: Outcome,
    /// Why the MR retires the root, when it does: its outcome is the plan of its destroy from
    /// the target branch's code (`core::retire`).
    pub retired: Option<RetiredBecause>,
    /// The flags a `planbot plan [ROOT] -- …` comment asked for at this head (empty: in full).
    pub targeting: Targeting,
}

/// What stage 2 hands on: every root's result, in the repo config's order, and the preflight's
/// one-line notes (each once).
#[derive(Default)]
pub(super) struct RootsPlanned {
    pub results: Vec<RootResult>,
    pub preflight_notes: Vec<String>,
    /// What each root's plan takes from the Proxmox cluster, by root name (the note's table).
    pub capacity: BTreeMap<String, Capacity>,
    /// The roots the changes reach and why each was planned (the note's list and picture).
    pub reach: Vec<reach::Reached>,
    /// The `depends_on` lines the repo config lacks (a root reads another's managed state).
    pub depends_hints: Vec<reach::DependsHint>,
    /// The changed configuration files no root claims (the note lists them).
    pub in_no_root: Vec<String>,
    /// The MR's changed files outside every root that are not formatted (`fmt -check`).
    pub fmt_outside: Vec<String>,
    /// What each root's plan waited for before its engine ran, in the repo config's order.
    pub waits: Vec<PlanWait>,
    /// The clean fresh plans to keep for the next push, by root name: written once the note
    /// is up, with its scrubber (`flows::context::plan_reuse::keep`).
    pub to_keep: Vec<(String, Reusable)>,
}

/// Stage 2: plan the roots the changed files affect; the others are listed as skipped with the
/// reason. The affected roots plan in their `depends_on` order ([`crate::core::root_graph`]): a
/// root starts once every affected root above it has finished, roots with no path between them
/// plan at once, each holding one of the service's engine slots within its author's share
/// ([`App::engine_slot_of`], shared with every other job). No root lock: an MR plan only reads
/// the state, and its code (which may wait until `engine.timeout`) must hold up no other MR's
/// plan; applies and drift checks exclude each other by it. Results stay in the repo config's
/// order. A root
/// not started yet when `cancel` fires is left out, and a running engine is killed. Every run
/// started is pushed to `runs` as soon as it exists, so a failure later still closes it.
pub(super) async fn plan_roots(
    app: &App,
    job: &PlanJob,
    queue_job: Option<QueueJobId>,
    prepared: &Prepared,
    cancel: &CancellationToken,
    runs: &mut Vec<RunId>,
) -> Result<RootsPlanned> {
    // Bridge the queue's cancellation to the engine's (SIGTERM, grace, SIGKILL).
    let (token, _following) = CancelToken::following(cancel);
    let super::reach::Reach {
        mut decisions,
        depends_hints,
        in_no_root,
        modules,
    } = super::reach::decide(app, job, prepared).await;
    // A retired root is planned as its destroy, from the target branch's code, never as a root
    // of the MR's.
    let retirements = &prepared.retirements;
    decisions.retain(|d| retirements.retired(&d.root.name).is_none());
    let gate_project = GateProject {
        id: job.project.0,
        path: prepared.project_path.clone(),
    };
    let retired_runs = prepared.retired_from.as_ref().map(|(sha, checkout)| {
        JobRuns::new(
            &app.config,
            Trust::MergeRequest,
            gate_project.clone(),
            sha,
            checkout.path(),
        )
        .cancelled_by(token.clone())
    });
    let reuse = super::reuse::decide(app, job, prepared, &decisions, &modules).await;
    let job_runs = JobRuns::new(
        &app.config,
        Trust::MergeRequest,
        gate_project,
        &prepared.commit.sha,
        prepared.checkout.path(),
    )
    .cancelled_by(token);
    let planned_fresh = decisions
        .iter()
        .filter(|d| d.affected && !reuse.reused.contains_key(&d.root.name))
        .map(|d| d.root);
    let (fmt, fmt_run) = fmt_of_roots(prepared, &job_runs, planned_fresh);
    let units = super::units::Units::of(app, job, queue_job, prepared).await;
    let (pve, apply_identity) = proxmox_endpoints(app);
    let planner = RootPlanner {
        fmt_shares: &fmt.shares,
        reuse: &reuse,
        app,
        job,
        queue_job,
        of_job: OfJob::of(prepared),
        units: units.as_ref(),
        fmt_by_job: false,
        cancel,
        runs: job_runs,
        retired_runs,
        pve,
        apply_identity,
        started: std::sync::Mutex::new(runs),
    };
    let retired: Vec<&Root> = retirements.retired.iter().map(|r| &r.root).collect();
    let planning = async {
        futures::join!(
            fmt_run,
            planner.in_order(&decisions),
            futures::future::join_all(retired.iter().map(|root| planner.plan_in_slot(root, true)))
        )
    };
    let ((), in_order, destroys) = match &units {
        None => planning.await,
        Some(units) => units.while_planning(app, planning).await,
    };
    let mut planned = gather(&decisions, in_order)?;
    for (retired, destroy) in retirements.retired.iter().zip(destroys) {
        gather_one(
            &mut planned,
            retired.root.name.clone(),
            destroy?,
            Some(retired.because),
        );
    }
    across_roots(prepared, &planned.capacity, &mut planned.results);
    planned.depends_hints = depends_hints;
    planned.in_no_root = in_no_root;
    planned.fmt_outside = fmt.outside();
    Ok(planned)
}

/// The job's one `fmt -check` ([`fmt_of_roots`]).
struct FmtOfJob {
    /// Each root's share of it, by root name.
    shares: BTreeMap<String, FmtOfRoots>,
    /// What it gave, once it ended.
    ran: watch::Receiver<Option<std::sync::Arc<StepCheck>>>,
}

impl FmtOfJob {
    /// The files it listed outside every root directory it was given: the MR's changed files
    /// outside its roots that are not formatted (none when it gave no list).
    fn outside(&self) -> Vec<String> {
        let dirs: Vec<&str> = self.shares.values().map(|s| s.dir.as_str()).collect();
        match &*self.ran.borrow() {
            Some(ran) => fmt_outside(ran, &dirs),
            None => Vec::new(),
        }
    }
}

/// The most changed files outside the roots one `fmt` is given (each an argument).
const FMT_OUTSIDE_MAX: usize = 500;

/// One `fmt -check` for every root of `roots` whose `fmt` check is on, and the MR's changed
/// files that no root of the repo config holds (a shared module's, [`changed_outside_roots`]),
/// from the checkout's top (`Engine::fmt_of_roots`): the job's [`FmtOfJob`], and the run
/// itself, to be driven beside the plans. A root's checks wait for it after its plan; it takes
/// no engine slot (one short process per job: a root waiting for it in its slot must never
/// wait for a slot, or every slot could be waiting). A root runs its own when that run gave no
/// list (a file it cannot parse: then the root whose file it is says so) or was stopped.
fn fmt_of_roots<'a>(
    prepared: &'a Prepared,
    runs: &JobRuns,
    roots: impl Iterator<Item = &'a Root>,
) -> (FmtOfJob, impl std::future::Future<Output = ()> + 'a) {
    let roots: Vec<&Root> = roots
        .filter(|r| r.checks.fmt && runs.in_checkout(&r.dir, true))
        .collect();
    let (tx, rx) = watch::channel(None);
    let shares = roots
        .iter()
        .map(|r| {
            let share = FmtOfRoots {
                ran: rx.clone(),
                dir: r.dir.clone(),
            };
            (r.name.clone(), share)
        })
        .collect();
    let mut dirs: Vec<String> = roots.iter().map(|r| r.dir.clone()).collect();
    dirs.sort_unstable();
    dirs.dedup();
    let files = changed_outside_roots(prepared, runs);
    let job = FmtOfJob { shares, ran: rx };
    let request = runs.checkout_request();
    let run = async move {
        let targets: Vec<&str> = dirs.iter().chain(&files).map(String::as_str).collect();
        if targets.is_empty() {
            return;
        }
        let engine = &prepared.engine;
        let ran = engine
            .fmt_of_roots(prepared.checkout.path(), &targets, &request)
            .await;
        let _ = tx.send(Some(std::sync::Arc::new(ran)));
    };
    (job, run)
}

/// The MR's changed files `fmt` reads (both engines' endings) that no root of the repo config
/// holds, still in the checkout (at most [`FMT_OUTSIDE_MAX`]): checked for format with the
/// roots when a root of the repo config checks it.
fn changed_outside_roots(prepared: &Prepared, runs: &JobRuns) -> Vec<String> {
    let roots = &prepared.config.roots;
    if !roots.iter().any(|r| r.checks.fmt) {
        return Vec::new();
    }
    let in_a_root = |file: &str| roots.iter().any(|r| reach::under(&r.dir, file));
    prepared
        .changed
        .iter()
        .filter(|f| FMT_FILE_ENDINGS.iter().any(|end| f.ends_with(end)))
        .filter(|f| !in_a_root(f) && runs.in_checkout(f, false))
        .take(FMT_OUTSIDE_MAX)
        .cloned()
        .collect()
}

/// The live Proxmox preflight's endpoint with the plan credentials ([proxmox.plan]; `None`:
/// skipped, and said so), and the API token id the apply would use, whose permissions the
/// preflight checks too.
fn proxmox_endpoints(app: &App) -> (Option<ProxmoxEndpoint>, Option<String>) {
    let env = &app.config.engine.env;
    let pve = preflight::endpoint_from_config(&app.config.proxmox.for_plan(), env);
    let apply = preflight::endpoint_from_config(&app.config.proxmox.for_apply(), env);
    (pve, apply.map(|ep| ep.api_token.id().to_string()))
}

/// What every root's plan of one job reads of it: its repo config, engine, policy sets, the
/// commit it plans and the project's path.
pub(super) struct OfJob<'a> {
    pub config: &'a RepoConfig,
    pub engine: &'a Engine,
    pub policies: &'a PolicySets,
    pub commit: &'a CommitSha,
    pub project_path: Option<String>,
}

impl OfJob<'_> {
    fn of(prepared: &Prepared) -> OfJob<'_> {
        OfJob {
            config: &prepared.config,
            engine: &prepared.engine,
            policies: &prepared.policies,
            commit: &prepared.commit.sha,
            project_path: prepared.project_path.clone(),
        }
    }
}

/// What every root's plan of one job shares.
pub(super) struct RootPlanner<'a> {
    /// Each root's share of the job's one `fmt -check` ([`fmt_of_roots`]), by name.
    fmt_shares: &'a BTreeMap<String, FmtOfRoots>,
    app: &'a App,
    job: &'a PlanJob,
    queue_job: Option<QueueJobId>,
    of_job: OfJob<'a>,
    /// The job's root units, when its roots are spread over the replicas.
    units: Option<&'a super::units::Units>,
    /// A unit's planner: its plan job's one `fmt -check` checks the root, not this replica.
    fmt_by_job: bool,
    cancel: &'a CancellationToken,
    /// Every root's request, with the plan credentials and the job's one state gate.
    runs: JobRuns,
    /// The retired roots' requests: the same credentials over the target branch's code.
    retired_runs: Option<JobRuns>,
    /// The roots whose plan of an earlier push is shown again, and what a fresh plan is kept
    /// with.
    reuse: &'a super::reuse::Reuse,
    /// The live Proxmox preflight with the plan credentials ([proxmox.plan]); skipped, and said
    /// so, when no endpoint is configured.
    pve: Option<ProxmoxEndpoint>,
    /// The API token id the apply would use, whose permissions the preflight checks too.
    apply_identity: Option<String>,
    /// Every run started, as soon as it exists.
    started: std::sync::Mutex<&'a mut Vec<RunId>>,
}

/// One affected root's plan, with what the note gathers of it.
pub(super) struct RootPlanned {
    outcome: Outcome,
    targeting: Targeting,
    /// The preflight's one-line note (empty: none).
    preflight_note: String,
    /// What the plan takes from the Proxmox cluster.
    capacity: Option<Capacity>,
    /// What the plan waited for before its engine ran.
    waited: Vec<PlanWait>,
    /// The plan to keep for the next push, when it is kept.
    kept: Option<Reusable>,
}

impl RootPlanned {
    /// A plan shown as it was made elsewhere, in run `run`: kept from an earlier push
    /// (`reused`: the head it was planned at), or a root unit's.
    fn shown(
        run: RunId,
        shown: &PlanShown,
        reused: Option<crate::core::ids::CommitSha>,
    ) -> RootPlanned {
        RootPlanned {
            outcome: Outcome::Planned {
                run,
                planned: shown.planned.clone(),
                reused,
                findings: shown.findings.clone(),
                fingerprint: shown.fingerprint.clone(),
                policy: shown.policy.clone(),
                checks: shown.checks.clone(),
            },
            targeting: Targeting::default(),
            preflight_note: shown.preflight_note.clone(),
            capacity: shown.capacity.clone(),
            waited: Vec::new(),
            kept: None,
        }
    }

    /// A root whose plan failed (no preflight ran).
    fn failed(
        run: RunId,
        error: String,
        end: RunEnd,
        checks: RootChecks,
        targeting: Targeting,
    ) -> RootPlanned {
        RootPlanned {
            outcome: Outcome::Failed {
                run,
                error,
                end,
                checks,
            },
            targeting,
            preflight_note: String::new(),
            capacity: None,
            waited: Vec::new(),
            kept: None,
        }
    }
}

impl<'a> RootPlanner<'a> {
    /// The planner of one root unit on the replica that took it: nothing reused (its plan job
    /// decided that), its own `fmt -check`, no units of its own.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn of_unit(
        app: &'a App,
        job: &'a PlanJob,
        queue_job: QueueJobId,
        of_job: OfJob<'a>,
        runs: JobRuns,
        nothing: &'a (BTreeMap<String, FmtOfRoots>, super::reuse::Reuse),
        cancel: &'a CancellationToken,
        started: &'a mut Vec<RunId>,
    ) -> RootPlanner<'a> {
        let (pve, apply_identity) = proxmox_endpoints(app);
        RootPlanner {
            fmt_shares: &nothing.0,
            reuse: &nothing.1,
            app,
            job,
            queue_job: Some(queue_job),
            of_job,
            units: None,
            fmt_by_job: true,
            cancel,
            runs,
            retired_runs: None,
            pve,
            apply_identity,
            started: std::sync::Mutex::new(started),
        }
    }

    /// Every affected root of `decisions` planned, each once every affected root above it has
    /// finished; in `decisions`' order, `None` for a root not started (the job was cancelled).
    async fn in_order(&self, decisions: &[Decision<'_>]) -> Vec<Result<Option<RootPlanned>>> {
        let graph = self.of_job.config.graph();
        let affected = || decisions.iter().filter(|d| d.affected).map(|d| d.root);
        // Each affected root's "finished" signal: its sender is dropped when it ends, however it
        // ends (planned, failed, cancelled, an error), which lets the roots below it start.
        let mut senders = BTreeMap::new();
        let mut finished = BTreeMap::new();
        for root in affected() {
            let (tx, rx) = watch::channel(());
            senders.insert(root.name.as_str(), tx);
            finished.insert(root.name.as_str(), rx);
        }
        let plans = affected().map(|root| {
            let done = senders.remove(root.name.as_str());
            let upstream: Vec<watch::Receiver<()>> = graph
                .upstream_of(&root.name)
                .into_iter()
                .filter_map(|u| finished.get(u).cloned())
                .collect();
            async move {
                let _done = done;
                for mut up in upstream {
                    // Closed (the upstream root ended): nothing more to wait for.
                    let _ = up.changed().await;
                }
                self.plan_in_slot(root, false).await
            }
        });
        futures::future::join_all(plans).await
    }

    /// `root` planned in an engine slot of its author's share (no root lock), in a stored run
    /// (`retired`: its destroy, from the target branch's code); `None` when the job was
    /// cancelled before it started. When the job's roots are spread, by whichever replica
    /// comes to it first ([`RootPlanner::spread`]).
    pub(super) async fn plan_in_slot(
        &self,
        root: &Root,
        retired: bool,
    ) -> Result<Option<RootPlanned>> {
        if self.cancel.is_cancelled() {
            return Ok(None);
        }
        if let Some(last) = self.reuse.reused.get(&root.name).filter(|_| !retired) {
            return self.reused(root, last).await.map(Some);
        }
        if let Some(units) = self.units.filter(|_| !retired) {
            return self.spread(root, units).await;
        }
        match self.slot().await {
            Some(slot) => self.plan_holding(root, retired, slot).await,
            None => Ok(None),
        }
    }

    /// An engine slot of the job's author's share; `None` when the job was cancelled first (a
    /// job cancelled while it waits for a slot stops waiting).
    async fn slot(&self) -> Option<EngineSlot> {
        tokio::select! {
            slot = self.app.engine_slot_of(self.job.requested_by) => Some(slot),
            _ = self.cancel.cancelled() => None,
        }
    }

    /// `root` planned here, in `slot`.
    async fn plan_holding(
        &self,
        root: &Root,
        retired: bool,
        slot: EngineSlot,
    ) -> Result<Option<RootPlanned>> {
        let (app, job) = (self.app, self.job);
        for waited in &slot.waited {
            log_wait(job, &root.name, waited);
        }
        if self.cancel.is_cancelled() {
            return Ok(None);
        }
        let run = self.start_run(root).await?;
        let started = std::time::Instant::now();
        // The targeting a comment asked for at this head (a re-run and a replica read it too).
        let targeting = match retired {
            true => Targeting::destroy(),
            false => {
                app.store
                    .plan_targeting(job.project, job.mr, &job.head, &root.name)
                    .await?
            }
        };
        let mut planned = self.plan_root(root, targeting, run).await?;
        if !retired {
            planned.kept = self.to_keep(root, &planned);
        }
        planned.waited = slot
            .waited
            .iter()
            .map(|w| plan_wait(app, root, w))
            .collect();
        log_root(job, &root.name, run, &planned.outcome, started.elapsed());
        Ok(Some(planned))
    }

    /// `root` as a unit any replica may plan: planned here at once when a slot is free; else
    /// queued, then planned here when this replica has a slot for it before another replica
    /// took it (or once the one that took it is gone),
    /// else read from the result that replica sealed. A unit that cannot be queued, or that
    /// ended without a result that reads, is planned here.
    async fn spread(
        &self,
        root: &Root,
        units: &super::units::Units,
    ) -> Result<Option<RootPlanned>> {
        let (project, mr) = (self.job.project.0, self.job.mr.0);
        // A slot free right now: planned here, queued for nobody (only what would wait for a
        // slot of this replica goes to the others).
        if let Some(slot) = self.app.engine_slots.try_for_author(self.job.requested_by) {
            return self.plan_holding(root, false, slot).await;
        }
        let id = match units.queue(self.app, &root.name).await {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(project, mr, root = %root.name, error = %format!("{e:#}"), "root planned here: its unit could not be queued");
                return self.here(root).await;
            }
        };
        loop {
            tokio::select! {
                slot = self.slot() => {
                    let Some(slot) = slot else { return Ok(None) };
                    match self.app.store.take_unit(id, "planned by its MR's plan job").await {
                        Ok(true) => return self.plan_holding(root, false, slot).await,
                        Ok(false) => drop(slot),
                        Err(e) => {
                            tracing::warn!(project, mr, root = %root.name, error = %format!("{e:#}"), "root planned here: its unit could not be taken back");
                            return self.plan_holding(root, false, slot).await;
                        }
                    }
                }
                _ = units.settled(id) => {}
            }
            let settled = tokio::select! {
                settled = units.settled(id) => settled,
                _ = self.cancel.cancelled() => return Ok(None),
            };
            match settled {
                UnitProgress::Ended { result: true } => return self.read_unit(root, id).await,
                UnitProgress::Ended { result: false } => {
                    if self.cancel.is_cancelled() {
                        return Ok(None);
                    }
                    tracing::warn!(project, mr, root = %root.name, job = id.0, "root planned here: its unit ended on another replica without a result");
                    return self.here(root).await;
                }
                // The replica that took it is gone: take it back.
                UnitProgress::Queued | UnitProgress::Running { .. } => continue,
            }
        }
    }

    /// `root` planned here, outside its unit.
    async fn here(&self, root: &Root) -> Result<Option<RootPlanned>> {
        match self.slot().await {
            Some(slot) => self.plan_holding(root, false, slot).await,
            None => Ok(None),
        }
    }

    /// `root`'s plan as unit `id` sealed it on the replica that planned it; planned here when
    /// the result does not read.
    async fn read_unit(&self, root: &Root, id: QueueJobId) -> Result<Option<RootPlanned>> {
        let (app, job) = (self.app, self.job);
        let (project, mr) = (job.project.0, job.mr.0);
        let read = match app.store.take_unit_result(id).await {
            Ok(Some(sealed)) => cpu_bound(|| super::units::open(app, &sealed)),
            Ok(None) => Err(anyhow::anyhow!("its result is gone")),
            Err(e) => Err(e),
        };
        let planned = match read.and_then(|end| self.unit_ended(end)) {
            Ok(Some(planned)) => planned,
            Ok(None) => return self.here(root).await,
            Err(e) => {
                tracing::warn!(project, mr, root = %root.name, job = id.0, error = %format!("{e:#}"), "root planned here: its unit's result does not read");
                return self.here(root).await;
            }
        };
        let run = match &planned.outcome {
            Outcome::Planned { run, .. } | Outcome::Failed { run, .. } => *run,
            Outcome::Skipped { .. } => unreachable!("a unit's root is planned"),
        };
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(run);
        tracing::info!(project, mr, root = %root.name, run = run.0, job = id.0, "root's plan read from the replica that planned it");
        let mut planned = planned;
        if let Some(fmt) = self.fmt_of_job(root).await {
            if let Outcome::Planned { checks, .. } | Outcome::Failed { checks, .. } =
                &mut planned.outcome
            {
                checks.fmt = fmt;
                *checks = std::mem::take(checks).scrubbed(&self.app.scrubber);
            }
        }
        planned.kept = self.to_keep(root, &planned);
        Ok(Some(planned))
    }

    /// `root`'s `fmt -check`, as its share of the job's one says (a unit's replica runs none);
    /// `None` when the root's `fmt` check is off or the job's covers no directory of it.
    async fn fmt_of_job(&self, root: &Root) -> Option<Check<Vec<String>>> {
        if !root.checks.fmt {
            return None;
        }
        Some(match self.fmt_shares.get(&root.name)?.share().await {
            Some(share) => crate::core::engine_checks::fmt_check(&share),
            None => Check::NotRun {
                reason: "the MR's `fmt -check` could not read every file: a file it cannot parse \
                         is shown by `validate`"
                    .into(),
            },
        })
    }

    /// A unit's end as this job's result of its root (`None`: it never started).
    fn unit_ended(&self, end: super::units::UnitEnd) -> Result<Option<RootPlanned>> {
        use super::units::UnitEnd;
        Ok(match end {
            UnitEnd::Planned {
                run,
                shown,
                targeting,
                waited,
            } => {
                let key = crate::flows::context::plan_reuse::digest_key(self.app);
                let shown = crate::flows::context::plan_reuse::shown_from_text(shown, key)?;
                let mut planned = RootPlanned::shown(run, &shown, None);
                planned.targeting = targeting;
                planned.waited = waited;
                Some(planned)
            }
            UnitEnd::Failed {
                run,
                error,
                state,
                summary,
                log,
                checks,
                targeting,
            } => {
                let end = RunEnd {
                    state: UnitEnd::run_state(&state),
                    summary,
                    log,
                    note_markdown: None,
                    fingerprint: None,
                };
                Some(RootPlanned::failed(run, error, end, checks, targeting))
            }
            UnitEnd::NotStarted => None,
        })
    }

    /// What a unit hands back of `planned` (its plan redacted with every secret this replica
    /// knows: the configured ones and the plan's own).
    pub(super) fn unit_end(&self, planned: Option<RootPlanned>) -> Result<super::units::UnitEnd> {
        use super::units::UnitEnd;
        let Some(p) = planned else {
            return Ok(UnitEnd::NotStarted);
        };
        Ok(match p.outcome {
            Outcome::Planned {
                run,
                planned,
                findings,
                fingerprint,
                policy,
                checks,
                ..
            } => {
                let mut secrets = crate::core::redact::Secrets::new();
                secrets.extend(self.app.config.secrets());
                secrets.merge(planned.secrets());
                let scrubber = secrets.scrubber();
                let shown = PlanShown {
                    planned,
                    findings,
                    fingerprint,
                    policy,
                    checks,
                    capacity: p.capacity,
                    preflight_note: p.preflight_note,
                };
                let shown =
                    crate::flows::context::plan_reuse::shown_text(self.app, &shown, &scrubber)?;
                UnitEnd::Planned {
                    run,
                    shown,
                    targeting: p.targeting,
                    waited: p.waited,
                }
            }
            Outcome::Failed {
                run,
                error,
                end,
                checks,
            } => UnitEnd::Failed {
                run,
                error,
                state: end.state.as_str().to_string(),
                summary: end.summary,
                log: end.log,
                checks,
                targeting: p.targeting,
            },
            Outcome::Skipped { .. } => UnitEnd::NotStarted,
        })
    }

    /// `root`'s stored run of this head, pushed to the job's runs as soon as it exists.
    async fn start_run(&self, root: &Root) -> Result<RunId> {
        let job = self.job;
        let run = self
            .app
            .store
            .start_run(NewRun {
                job: self.queue_job,
                kind: RunKind::Plan,
                project: job.project,
                project_path: self.of_job.project_path.clone(),
                mr: Some(job.mr),
                root: root.name.clone(),
                sha: job.head.clone(),
            })
            .await?;
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(run);
        Ok(run)
    }

    /// The plan of an earlier push shown again for `root` (nothing it depends on changed), in a
    /// stored run of this head: no engine runs.
    async fn reused(&self, root: &Root, last: &std::sync::Arc<Reusable>) -> Result<RootPlanned> {
        let (app, job) = (self.app, self.job);
        let run = self.start_run(root).await?;
        let (project, mr, planned_at) = (job.project.0, job.mr.0, last.head.short());
        tracing::info!(project, mr, root = %root.name, run = run.0, planned_at, "root's plan reused: nothing it depends on changed since");
        let mut planned = RootPlanned::shown(run, &last.shown, Some(last.head.clone()));
        planned.targeting = app
            .store
            .plan_targeting(job.project, job.mr, &job.head, &root.name)
            .await?;
        Ok(planned)
    }

    /// What of a clean fresh plan of `root` is kept for the next push (with this head's
    /// inputs; nothing when they cannot be told).
    fn to_keep(&self, root: &Root, planned: &RootPlanned) -> Option<Reusable> {
        let unchanged = self.reuse.unchanged.get(&root.name)?;
        let Outcome::Planned {
            planned: shown,
            findings,
            fingerprint,
            policy,
            checks,
            ..
        } = &planned.outcome
        else {
            return None;
        };
        if shown.plan().errored {
            return None;
        }
        let locked = !self.reuse.unlocked.contains(&root.name);
        if !super::reuse::keeps(locked, shown.lock_file().is_some()) {
            let (project, mr) = (self.job.project.0, self.job.mr.0);
            tracing::info!(project, mr, root = %root.name, "root's plan not kept for the next push: its providers are not pinned by a committed lock file");
            return None;
        }
        Some(Reusable {
            planned_commit: self.of_job.commit.clone(),
            head: self.job.head.clone(),
            unchanged: unchanged.clone(),
            shown: PlanShown {
                planned: shown.clone(),
                findings: findings.clone(),
                fingerprint: fingerprint.clone(),
                policy: policy.clone(),
                checks: checks.clone(),
                capacity: planned.capacity.clone(),
                preflight_note: planned.preflight_note.clone(),
            },
        })
    }

    /// One affected root: the engine's plan in its directory (a root that cannot be planned, as
    /// its directory is missing, is a failed run), then the Proxmox preflight and lint.
    async fn plan_root(
        &self,
        root: &Root,
        targeting: Targeting,
        run: RunId,
    ) -> Result<RootPlanned> {
        let (runs, mut checks) = match (&self.retired_runs, targeting.destroy) {
            (Some(retired), true) => (retired, CheckSet::NONE),
            _ => (&self.runs, root.checks),
        };
        checks.fmt &= !self.fmt_by_job;
        let RootRun { dir, mut request } = match runs.request(root, &targeting).await {
            Ok(r) => r,
            Err(not_planned) => {
                let error = not_planned.to_string();
                let end = finish(self.app, run, RunState::Failed, &error, "", None).await?;
                let checks = RootChecks::default();
                return Ok(RootPlanned::failed(run, error, end, checks, targeting));
            }
        };
        request.fmt_of_roots = self.fmt_shares.get(&root.name).cloned();
        let engine = self.of_job.engine;
        let (planned, ran) = engine.plan_checked(&dir, &request, checks).await;
        match planned {
            Ok(planned) => Ok(self.checked(root, run, planned, &ran, targeting).await),
            Err(e) => {
                let checks = self.read_checks(&ran, None);
                // With what the job's state gate refused, and why: the note says it.
                let error = plan_request::failure_report(&request, &e);
                let error = self.app.scrubber.scrub(&error).into_owned();
                let state = if matches!(e, EngineError::Cancelled { .. }) {
                    RunState::Canceled
                } else {
                    RunState::Failed
                };
                let log = self.app.scrubber.scrub(e.log().unwrap_or_default());
                let end = finish(self.app, run, state, &e.to_string(), &log, None).await?;
                Ok(RootPlanned::failed(run, error, end, checks, targeting))
            }
        }
    }

    /// What the checks printed, read and redacted with every secret the run knows, planbot's
    /// configured ones too.
    fn read_checks(&self, ran: &EngineChecks, checks_json: Option<&[u8]>) -> RootChecks {
        let checks = cpu_bound(|| {
            RootChecks::read(&ran.validate, &ran.fmt, &ran.test, &ran.plan, checks_json)
                .scrubbed(&ran.scrubber)
        });
        checks.scrubbed(&self.app.scrubber)
    }

    /// A plan the engine made, checked: the Proxmox preflight and the lint, its fingerprint,
    /// and (unless it errored) the policy sets' verdict.
    async fn checked(
        &self,
        root: &Root,
        run: RunId,
        planned: PlannedRun,
        ran: &EngineChecks,
        targeting: Targeting,
    ) -> RootPlanned {
        // The plan's `checks` as its one parse kept them: the document is not read again.
        let checks = self.read_checks(ran, Some(planned.plan().checks_json()));
        let pf = preflight::for_plan_as(
            self.pve.clone(),
            self.apply_identity.clone(),
            planned.plan(),
        )
        .await;
        let mut facts = pf.lint_facts.clone();
        facts.apply_ssh = Some(apply_has_ssh(&self.app.config));
        facts.parallelism = root.parallelism;
        let (key, policies) = (
            self.app.config.fingerprint_key.expose(),
            self.of_job.policies,
        );
        // The policies' plan document is read on another core meanwhile.
        let check_policies = !planned.plan().errored;
        let (mut findings, fingerprint, document) = cpu_bound(|| {
            std::thread::scope(|scope| {
                let document = scope.spawn(|| {
                    check_policies
                        .then(|| policies.read_document(&root.name, planned.plan_json()))
                        .flatten()
                });
                let findings = lint::lint_with(planned.plan(), &root.lint_disable, &facts);
                let fingerprint = planned.fingerprint(key.as_bytes());
                let document = document.join().expect("reading the plan document");
                (findings, fingerprint, document)
            })
        });
        findings.extend(findings::without_disabled(pf.findings, &root.lint_disable));
        if planned.backend().is_local() {
            let backend = planned.backend();
            findings.push(state::state_in_checkout(
                &root.name, &root.dir, backend, true,
            ));
        }
        findings::sort_findings(&mut findings);
        let capacity_data = pf.capacity.as_ref().map(|c| c.to_value());
        let policy = check_policies.then(|| {
            cpu_bound(|| policies.evaluate(&root.name, document, &findings, capacity_data.as_ref()))
        });
        let planned = std::sync::Arc::new(planned.into_shown());
        RootPlanned {
            outcome: Outcome::Planned {
                run,
                planned,
                reused: None,
                findings,
                fingerprint,
                policy,
                checks,
            },
            targeting,
            preflight_note: pf.note,
            capacity: pf.capacity,
            waited: Vec::new(),
            kept: None,
        }
    }
}

/// Every root's result in the repo config's order (a root the changes do not reach as skipped,
/// with why), the preflight's notes each once and what each plan takes from the cluster; the
/// first error when a root's plan had one.
fn gather(
    decisions: &[Decision<'_>],
    planned: Vec<Result<Option<RootPlanned>>>,
) -> Result<RootsPlanned> {
    let mut gathered = RootsPlanned {
        reach: decisions.iter().filter_map(|d| d.reached()).collect(),
        ..RootsPlanned::default()
    };
    let mut planned = planned.into_iter();
    let mut first_error = None;
    for decision in decisions {
        let name = decision.root.name.clone();
        if !decision.affected {
            gathered.results.push(RootResult {
                name,
                outcome: Outcome::Skipped {
                    reason: decision.skipped.clone(),
                },
                targeting: Targeting::default(),
                retired: None,
            });
            continue;
        }
        match planned.next().expect("one result per affected root") {
            Ok(p) => gather_one(&mut gathered, name, p, None),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(gathered),
    }
}

/// One planned root's result into `gathered` (`None`: not started, the job was cancelled).
fn gather_one(
    gathered: &mut RootsPlanned,
    name: String,
    planned: Option<RootPlanned>,
    retired: Option<RetiredBecause>,
) {
    let Some(p) = planned else { return };
    let notes = &mut gathered.preflight_notes;
    if !p.preflight_note.is_empty() && !notes.contains(&p.preflight_note) {
        notes.push(p.preflight_note);
    }
    if let Some(c) = p.capacity {
        gathered.capacity.insert(name.clone(), c);
    }
    gathered.waits.extend(p.waited);
    if let Some(kept) = p.kept {
        gathered.to_keep.push((name.clone(), kept));
    }
    gathered.results.push(RootResult {
        name,
        outcome: p.outcome,
        targeting: p.targeting,
        retired,
    });
}

/// The lint rules that need every root's plan (PVE023: one `vm_id` asked for in two roots of
/// the MR): their findings join each root's own, and a root that got one has its policies
/// checked again with them, so the verdict sees what the note shows.
fn across_roots(
    prepared: &Prepared,
    capacity: &BTreeMap<String, Capacity>,
    results: &mut [RootResult],
) {
    let mut at = Vec::new();
    let mut plans = Vec::new();
    for (i, r) in results.iter().enumerate() {
        let Outcome::Planned { planned, .. } = &r.outcome else {
            continue;
        };
        let Some(root) = prepared.config.roots.iter().find(|c| c.name == r.name) else {
            continue;
        };
        if !planned.plan().errored {
            at.push(i);
            plans.push(lint::RootPlan {
                name: &r.name,
                plan: planned.plan(),
                disabled: &root.lint_disable,
            });
        }
    }
    if plans.len() < 2 {
        return;
    }
    let found = cpu_bound(|| lint::cross_root(&plans));
    drop(plans);
    for (i, new) in at.into_iter().zip(found) {
        if new.is_empty() {
            continue;
        }
        let name = results[i].name.clone();
        if let Outcome::Planned {
            planned,
            findings,
            policy,
            ..
        } = &mut results[i].outcome
        {
            findings.extend(new);
            findings::sort_findings(findings);
            if policy.is_some() {
                *policy = Some(cpu_bound(|| {
                    let document = prepared.policies.read_document(&name, planned.plan_json());
                    let capacity_data = capacity.get(&name).map(|c| c.to_value());
                    prepared
                        .policies
                        .evaluate(&name, document, findings, capacity_data.as_ref())
                }));
            }
        }
    }
}

/// A wait of `root`'s plan, as the note says it.
fn plan_wait(app: &App, root: &Root, waited: &Waited) -> PlanWait {
    PlanWait {
        root: root.name.clone(),
        on: match waited.on {
            WaitedFor::AuthorShare => WaitOn::AuthorShare {
                share: app.engine_slots.share(),
            },
            WaitedFor::Slot => WaitOn::Slot {
                total: app.engine_slots.total(),
            },
        },
        took: waited.took,
    }
}

/// The log's line for a wait of a root's plan before its engine ran.
fn log_wait(job: &PlanJob, root: &str, waited: &Waited) {
    let (project, mr) = (job.project.0, job.mr.0);
    let waited_ms = waited.took.as_millis() as u64;
    let on = match waited.on {
        WaitedFor::AuthorShare => "author_share",
        WaitedFor::Slot => "engine_slot",
    };
    tracing::info!(
        project,
        mr,
        root,
        on,
        waited_ms,
        "root's plan waited before its engine ran"
    );
}

/// The log's line for one planned root: `root planned` (with its changes) or a warning.
fn log_root(job: &PlanJob, root: &str, run: RunId, outcome: &Outcome, took: std::time::Duration) {
    let (project, mr, duration_ms) = (job.project.0, job.mr.0, took.as_millis() as u64);
    match outcome {
        Outcome::Planned {
            planned, findings, ..
        } if !planned.plan().errored => {
            let changes = crate::core::summary::Summary::of(planned.plan()).one_line();
            let findings = findings.len();
            tracing::info!(project, mr, root, run = run.0, outcome = "planned", changes = %changes, findings, duration_ms, "root planned");
        }
        Outcome::Planned { .. } => {
            tracing::warn!(
                project,
                mr,
                root,
                run = run.0,
                outcome = "errored",
                duration_ms,
                "root planned with an engine error (see its run page)"
            );
        }
        Outcome::Failed { error, .. } => {
            let error = error.lines().next().unwrap_or_default();
            tracing::warn!(
                project,
                mr,
                root,
                run = run.0,
                outcome = "failed",
                duration_ms,
                error,
                "root failed to plan"
            );
        }
        Outcome::Skipped { .. } => {}
    }
}
