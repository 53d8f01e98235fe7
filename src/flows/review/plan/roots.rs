//! Stage 2 of a plan run: plan every affected root of the repo config in `depends_on` order
//! (independent roots at once, each under its root's lock and one engine slot), each in its own
//! stored run: the engine, then the Proxmox preflight and the lint.

use super::{finish, Prepared};
use crate::capabilities::engine::{CancelToken, EngineError, PlannedRun};
use crate::capabilities::proxmox::ProxmoxEndpoint;
use crate::capabilities::state_gate::GateProject;
use crate::capabilities::store::{NewRun, QueueJobId, RunEnd, RunKind, RunState};
use crate::core::engine_checks::RootChecks;
use crate::core::events::PlanJob;
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::RunId;
use crate::core::policy::Verdict;
use crate::core::proxmox::findings::{self, Finding};
use crate::core::proxmox::lint;
use crate::core::reach;
use crate::core::repo_config::Root;
use crate::core::state;
use crate::core::targeting::Targeting;
use crate::flows::confinement::credentials::Trust;
use crate::flows::confinement::plan_request::{self, JobRuns, RootRun};
use crate::flows::context::app_state::App;
use crate::flows::context::cpu::cpu_bound;
use crate::flows::preflight;
use anyhow::Result;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// One root's result, kept until the note is rendered and the runs are recorded.
pub(super) enum Outcome {
    Planned {
        run: RunId,
        planned: Box<PlannedRun>,
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
    /// The flags a `planbot plan [ROOT] -- …` comment asked for at this head (empty: in full).
    pub targeting: Targeting,
}

/// What stage 2 hands on: every root's result, in the repo config's order, and the preflight's
/// one-line notes (each once).
pub(super) struct RootsPlanned {
    pub results: Vec<RootResult>,
    pub preflight_notes: Vec<String>,
    /// What each root's plan takes from the Proxmox cluster, by root name (the note's table).
    pub capacity: std::collections::BTreeMap<String, crate::core::proxmox::capacity::Capacity>,
    /// The roots the changes reach and why each was planned (the note's list and picture).
    pub reach: Vec<crate::core::reach::Reached>,
    /// The `depends_on` lines the repo config lacks (a root reads another's managed state).
    pub depends_hints: Vec<reach::DependsHint>,
}

/// Stage 2: plan the roots the changed files affect; the others are listed as skipped with the
/// reason. The affected roots plan in their `depends_on` order ([`crate::core::root_graph`]): a
/// root starts once every affected root above it has finished, roots with no path between them
/// plan at once, each holding one of the service's engine slots ([`App::engine_slot`], shared
/// with every other job) after its root's lock. Results stay in the repo config's order. A root
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
    // Every root's request, with the plan credentials and the job's one state gate.
    let job_runs = JobRuns::new(
        &app.config,
        Trust::MergeRequest,
        GateProject {
            id: job.project.0,
            path: prepared.project_path.clone(),
        },
        &prepared.commit.sha,
        prepared.checkout.path(),
    )
    .cancelled_by(token);
    // The live Proxmox preflight with the plan credentials ([proxmox.plan]); skipped, and said
    // so, when no endpoint is configured.
    let pve =
        preflight::endpoint_from_config(&app.config.proxmox.for_plan(), &app.config.engine.env);
    // Which roots the changes reach: their own files, the local modules they use (read from
    // the checkout), their `when_modified` patterns.
    let modules = super::reach::module_graph(prepared.checkout.path(), &prepared.config).await;
    let decisions = reach::decide(&prepared.config, &prepared.changed, &modules);
    let reached: Vec<reach::Reached> = decisions.iter().filter_map(|d| d.reached()).collect();
    let depends_hints = reach::depends_on_hints(
        &prepared.config,
        &modules,
        reach::OwnProject {
            id: job.project.0,
            path: prepared.project_path.as_deref(),
        },
        |root| crate::core::state::gitlab_state_name(root, app.config.state.default),
    );
    let graph = prepared.config.graph();
    let affected: Vec<&str> = decisions
        .iter()
        .filter(|d| d.affected)
        .map(|d| d.root.name.as_str())
        .collect();
    // Each affected root's "finished" signal: its sender is dropped when it ends, however it
    // ends (planned, failed, cancelled, an error), which lets the roots below it start.
    let mut finished: std::collections::BTreeMap<&str, watch::Receiver<()>> = Default::default();
    let mut senders: std::collections::BTreeMap<&str, watch::Sender<()>> = Default::default();
    for name in &affected {
        let (tx, rx) = watch::channel(());
        senders.insert(name, tx);
        finished.insert(name, rx);
    }
    let started_runs = std::sync::Mutex::new(&mut *runs);
    let root_plans = decisions.iter().filter(|d| d.affected).map(|decision| {
        let root = decision.root;
        let done = senders.remove(root.name.as_str());
        let upstream: Vec<watch::Receiver<()>> = graph
            .upstream_of(&root.name)
            .into_iter()
            .filter_map(|u| finished.get(u).cloned())
            .collect();
        let (job_runs, pve, started_runs) = (&job_runs, &pve, &started_runs);
        async move {
            let _done = done;
            for mut up in upstream {
                // Closed (the upstream root ended): nothing more to wait for.
                let _ = up.changed().await;
            }
            if cancel.is_cancelled() {
                return Ok(None);
            }
            let _guard = app.root_locks.lock(job.project, &root.name).await;
            let _slot = app.engine_slot().await;
            if cancel.is_cancelled() {
                return Ok(None);
            }
            let run = app
                .store
                .start_run(NewRun {
                    job: queue_job,
                    kind: RunKind::Plan,
                    project: job.project,
                    project_path: prepared.project_path.clone(),
                    mr: Some(job.mr),
                    root: root.name.clone(),
                    sha: job.head.clone(),
                })
                .await?;
            started_runs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(run);
            let started = std::time::Instant::now();
            // The targeting a comment asked for at this head (a re-run and a replica read it too).
            let targeting = app
                .store
                .plan_targeting(job.project, job.mr, &job.head, &root.name)
                .await?;
            let mut notes = Vec::new();
            let mut capacity = std::collections::BTreeMap::new();
            let outcome = plan_root(
                app,
                prepared,
                (root, &targeting),
                run,
                job_runs,
                pve,
                &mut notes,
                &mut capacity,
            )
            .await?;
            log_root(job, &root.name, run, &outcome, started.elapsed());
            anyhow::Ok(Some((outcome, notes, capacity, targeting)))
        }
    });
    let mut planned = futures::future::join_all(root_plans).await.into_iter();

    let mut results: Vec<RootResult> = Vec::new();
    let mut preflight_notes: Vec<String> = Vec::new();
    let mut capacity = std::collections::BTreeMap::new();
    let mut first_error = None;
    for decision in &decisions {
        let root = decision.root;
        if !decision.affected {
            results.push(RootResult {
                name: root.name.clone(),
                outcome: Outcome::Skipped {
                    reason: decision.skipped.clone(),
                },
                targeting: Targeting::default(),
            });
            continue;
        }
        match planned.next().expect("one result per affected root") {
            Ok(Some((outcome, notes, cap, targeting))) => {
                for note in notes {
                    if !preflight_notes.contains(&note) {
                        preflight_notes.push(note);
                    }
                }
                capacity.extend(cap);
                results.push(RootResult {
                    name: root.name.clone(),
                    outcome,
                    targeting,
                });
            }
            // Not started: the job was cancelled.
            Ok(None) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    across_roots(prepared, &capacity, &mut results);
    Ok(RootsPlanned {
        results,
        preflight_notes,
        capacity,
        reach: reached,
        depends_hints,
    })
}

/// The lint rules that need every root's plan (PVE023: one `vm_id` asked for in two roots of
/// the MR): their findings join each root's own, and a root that got one has its policies
/// checked again with them, so the verdict sees what the note shows.
fn across_roots(
    prepared: &Prepared,
    capacity: &std::collections::BTreeMap<String, crate::core::proxmox::capacity::Capacity>,
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

/// One affected root: the engine's plan in its directory (a root that cannot be planned, as
/// its directory is missing, is a failed run), then the Proxmox preflight and lint; the
/// preflight's note is added to `notes` once.
#[allow(clippy::too_many_arguments)]
async fn plan_root(
    app: &App,
    prepared: &Prepared,
    (root, targeting): (&Root, &Targeting),
    run: RunId,
    runs: &JobRuns,
    pve: &Option<ProxmoxEndpoint>,
    preflight_notes: &mut Vec<String>,
    capacity: &mut std::collections::BTreeMap<String, crate::core::proxmox::capacity::Capacity>,
) -> Result<Outcome> {
    let key = app.config.fingerprint_key.expose().as_bytes();
    let outcome = match runs.request(root, targeting).await {
        Err(not_planned) => {
            let error = not_planned.to_string();
            let end = finish(app, run, RunState::Failed, &error, "", None).await?;
            Outcome::Failed {
                run,
                error,
                end,
                checks: RootChecks::default(),
            }
        }
        Ok(RootRun { dir, request: req }) => {
            let (planned, ran) = prepared.engine.plan_checked(&dir, &req, root.checks).await;
            // What the checks printed, read and redacted with every secret the run knows, planbot's
            // configured ones too.
            let read_checks = |plan_json: Option<&[u8]>| {
                let checks = cpu_bound(|| {
                    RootChecks::read(&ran.validate, &ran.fmt, &ran.test, &ran.plan, plan_json)
                        .scrubbed(&ran.scrubber)
                });
                checks.scrubbed(&app.scrubber)
            };
            match planned {
                Ok(planned) => {
                    let checks = read_checks(Some(planned.plan_json()));
                    let apply_identity = preflight::endpoint_from_config(
                        &app.config.proxmox.for_apply(),
                        &app.config.engine.env,
                    )
                    .map(|ep| ep.api_token.id().to_string());
                    let pf =
                        preflight::for_plan_as(pve.clone(), apply_identity, planned.plan()).await;
                    let mut facts = pf.lint_facts.clone();
                    facts.apply_ssh = Some(crate::flows::confinement::credentials::apply_has_ssh(
                        &app.config,
                    ));
                    facts.parallelism = root.parallelism;
                    // The policies' plan document is read on another core meanwhile.
                    let check_policies = !planned.plan().errored;
                    let (mut findings, fingerprint, document) = cpu_bound(|| {
                        std::thread::scope(|scope| {
                            let document = scope.spawn(|| {
                                check_policies
                                    .then(|| {
                                        prepared
                                            .policies
                                            .read_document(&root.name, planned.plan_json())
                                    })
                                    .flatten()
                            });
                            let findings =
                                lint::lint_with(planned.plan(), &root.lint_disable, &facts);
                            let fingerprint = planned.fingerprint(key);
                            let document = document.join().expect("reading the plan document");
                            (findings, fingerprint, document)
                        })
                    });
                    findings.extend(findings::without_disabled(pf.findings, &root.lint_disable));
                    if planned.backend().is_local() {
                        findings.push(state::state_in_checkout(
                            &root.name,
                            &root.dir,
                            planned.backend(),
                            true,
                        ));
                    }
                    findings::sort_findings(&mut findings);
                    let capacity_data = pf.capacity.as_ref().map(|c| c.to_value());
                    let policy = check_policies.then(|| {
                        cpu_bound(|| {
                            prepared.policies.evaluate(
                                &root.name,
                                document,
                                &findings,
                                capacity_data.as_ref(),
                            )
                        })
                    });
                    if let Some(c) = pf.capacity.clone() {
                        capacity.insert(root.name.clone(), c);
                    }
                    if !pf.note.is_empty() && !preflight_notes.contains(&pf.note) {
                        preflight_notes.push(pf.note);
                    }
                    Outcome::Planned {
                        run,
                        planned: Box::new(planned),
                        findings,
                        fingerprint,
                        policy,
                        checks,
                    }
                }
                Err(e) => {
                    let checks = read_checks(None);
                    let state = if matches!(e, EngineError::Cancelled { .. }) {
                        RunState::Canceled
                    } else {
                        RunState::Failed
                    };
                    // With what the job's state gate refused, and why: the note says it.
                    let error = plan_request::failure_report(&req, &e);
                    let error = app.scrubber.scrub(&error).into_owned();
                    let log = app.scrubber.scrub(e.log().unwrap_or_default()).into_owned();
                    let end = finish(app, run, state, &e.to_string(), &log, None).await?;
                    Outcome::Failed {
                        run,
                        error,
                        end,
                        checks,
                    }
                }
            }
        }
    };
    Ok(outcome)
}
