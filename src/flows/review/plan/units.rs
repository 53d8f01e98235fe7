//! One MR's roots over every replica (docs/architecture.md, "One MR's roots over every
//! replica"): on a shared store with other replicas alive, a plan job queues each root it must
//! plan as a unit ([`RootUnit`]) once the roots above it have ended, plans it itself when it has
//! an engine slot first, and otherwise reads the result the replica that took it sealed
//! ([`UnitEnd`]). Here: the units' queueing, their progress as the job watches it, and the
//! sealed result.

use super::prepare::Prepared;
use crate::capabilities::store::{QueueJobId, RunState, UnitProgress};
use crate::core::engine_checks::RootChecks;
use crate::core::events::{Job, PlanJob, RootUnit};
use crate::core::ids::RunId;
use crate::core::render::PlanWait;
use crate::core::sealed::SealKey;
use crate::core::targeting::Targeting;
use crate::flows::context::app_state::App;
use crate::flows::context::plan_reuse::ShownText;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;

/// How often a plan job reads where its units are while it waits for one, when it is not told
/// of their ends (no listening connection).
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// How often it reads them when it is told: for a unit whose replica is gone (its lease runs
/// out, and nobody says so).
const PROGRESS_TOLD_EVERY: Duration = Duration::from_secs(1);

/// What a unit hands back to its plan job, sealed ([`seal`]): its plan redacted with the
/// secrets the unit knew (every other root's too are only known to the plan job, hence the
/// seal), or how it failed.
#[derive(Serialize, Deserialize)]
pub(super) enum UnitEnd {
    Planned {
        run: RunId,
        shown: ShownText,
        targeting: Targeting,
        waited: Vec<PlanWait>,
    },
    Failed {
        run: RunId,
        error: String,
        /// The run's end as the unit recorded it (`failed` or `canceled`), its summary and log.
        state: String,
        summary: Option<String>,
        log: String,
        checks: RootChecks,
        targeting: Targeting,
    },
    /// Cancelled before its engine started.
    NotStarted,
}

impl UnitEnd {
    /// The run state a failed unit recorded (`canceled`, else `failed`).
    pub(super) fn run_state(state: &str) -> RunState {
        match state == RunState::Canceled.as_str() {
            true => RunState::Canceled,
            false => RunState::Failed,
        }
    }
}

/// The key units are sealed with: derived from `fingerprint_key`, which is never stored.
fn seal_key(app: &App) -> SealKey {
    SealKey::derive(
        app.config.fingerprint_key.expose().as_bytes(),
        "root unit results",
    )
}

/// `end`, sealed for the store.
pub(super) fn seal(app: &App, end: &UnitEnd) -> Result<String> {
    let plain = serde_json::to_vec(end)?;
    Ok(seal_key(app).seal(&plain, rand::random()))
}

/// A sealed [`UnitEnd`], opened.
pub(super) fn open(app: &App, sealed: &str) -> Result<UnitEnd> {
    let plain = seal_key(app)
        .open(sealed)
        .context("opening the unit's result")?;
    serde_json::from_slice(&plain).context("reading the unit's result")
}

/// A plan job's units: what each is queued with, and where they are.
pub(super) struct Units {
    /// The plan job's queue job.
    pub parent: QueueJobId,
    template: RootUnit,
    progress: watch::Receiver<BTreeMap<QueueJobId, UnitProgress>>,
    tell: watch::Sender<BTreeMap<QueueJobId, UnitProgress>>,
}

impl Units {
    /// The units of `job` (queue job `parent`), when its roots are spread: the store is shared
    /// and another replica is alive to take them. Units an earlier attempt of the job left
    /// are ended first.
    pub async fn of(
        app: &App,
        job: &PlanJob,
        parent: Option<QueueJobId>,
        prepared: &Prepared,
    ) -> Option<Units> {
        let parent = parent?;
        let config_at = prepared.default_head.clone()?;
        match app.store.other_replicas().await {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot tell whether other replicas are alive: the MR's roots are planned here");
                return None;
            }
        }
        if let Err(e) = app
            .store
            .end_units(parent, "its plan job started again", true)
            .await
        {
            tracing::warn!(error = %format!("{e:#}"), "cannot end the units of an earlier attempt: the MR's roots are planned here");
            return None;
        }
        let (tell, progress) = watch::channel(BTreeMap::new());
        Some(Units {
            parent,
            template: RootUnit {
                plan: PlanJob {
                    project_path: prepared.project_path.clone(),
                    ..job.clone()
                },
                parent: parent.0,
                root: String::new(),
                commit: prepared.commit.sha.clone(),
                default_branch: prepared.default_branch.clone(),
                config_at,
            },
            progress,
            tell,
        })
    }

    /// Queue `root`'s unit for any replica to take.
    pub async fn queue(&self, app: &App, root: &str) -> Result<QueueJobId> {
        let unit = RootUnit {
            root: root.to_string(),
            ..self.template.clone()
        };
        let queued = app
            .store
            .enqueue(Job::PlanRoot(unit))
            .await
            .context("queueing the root's unit")?;
        queued.id.context("the root's unit was not queued")
    }

    /// Until `id` ends, or the replica that took it is gone: where it is then.
    pub async fn settled(&self, id: QueueJobId) -> UnitProgress {
        let mut progress = self.progress.clone();
        let settled = progress
            .wait_for(|all| {
                matches!(
                    all.get(&id),
                    Some(UnitProgress::Ended { .. } | UnitProgress::Running { lapsed: true })
                )
            })
            .await;
        match settled {
            Ok(all) => all[&id],
            // The watch ends with the job's planning: nothing more to wait for.
            Err(_) => UnitProgress::Ended { result: false },
        }
    }

    /// `planning` (the job's roots) driven to its end while the units are watched; then the
    /// units still live are ended, and the runs of those whose end was never read.
    pub async fn while_planning<T>(&self, app: &App, planning: impl Future<Output = T>) -> T {
        let planned = tokio::select! {
            planned = planning => planned,
            () = self.watch(app) => unreachable!("the units are watched until the job ends"),
        };
        let why = "its MR's plan job ended without reading it";
        if let Err(e) = app.store.end_units(self.parent, why, false).await {
            tracing::warn!(job = self.parent.0, error = %format!("{e:#}"), "cannot end the MR's root units");
        }
        planned
    }

    /// Read where every unit is, for as long as the job plans: when a unit's end is told
    /// (`Store::job_notices`), else every [`PROGRESS_EVERY`] (a failed read is logged, and
    /// read again).
    async fn watch(&self, app: &App) {
        let mut told = app.store.job_notices();
        loop {
            if let Some(told) = &mut told {
                told.borrow_and_update();
            }
            match app.store.unit_progress(self.parent).await {
                Ok(all) => {
                    self.tell.send_if_modified(|known| {
                        let all: BTreeMap<_, _> = all.into_iter().collect();
                        let changed = *known != all;
                        *known = all;
                        changed
                    });
                }
                Err(e) => {
                    tracing::warn!(job = self.parent.0, error = %format!("{e:#}"), "cannot read where the MR's root units are");
                }
            }
            match &mut told {
                Some(notices) => {
                    let heard = tokio::time::timeout(PROGRESS_TOLD_EVERY, notices.changed());
                    if let Ok(Err(_)) = heard.await {
                        // The listening connection is gone for good: look on our own.
                        told = None;
                    }
                }
                None => tokio::time::sleep(PROGRESS_EVERY).await,
            }
        }
    }
}
