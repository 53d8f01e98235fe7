//! Plan reuse across pushes (docs/workflow.md, "Plans reused across pushes"): the last plan of
//! each root of each open MR, kept in the store without a secret, so that a push that does not
//! reach a root shows that root's plan again instead of planning it anew, on whichever replica
//! takes the push and after a restart. What is kept is the plan as shown, redacted
//! (`core::kept_plan`: every secret replaced, the plan's secrets as keyed digests that still
//! scrub every text shown beside it), with its findings, verdict, checks and fingerprint; a
//! reused plan is still planned again and compared at apply time.
//!
//! Whether a root's plan may be reused is decided by the plan flow
//! (`flows::review::plan::reuse`): the changes between the two commits do not reach it
//! (`core::reach`, as for any change) and every [`Unchanged`] input is equal.

use crate::capabilities::engine::{KeptShown, ShownPlan};
use crate::capabilities::store::KeptPlanRow;
use crate::core::engine_checks::RootChecks;
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use crate::core::plan_digest::PlanDigest;
use crate::core::policy::Verdict;
use crate::core::proxmox::capacity::Capacity;
use crate::core::proxmox::findings::Finding;
use crate::core::redact::{DigestKey, Scrubber, SecretDigests};
use crate::core::state::Backend;
use crate::core::targeting::Targeting;
use crate::flows::context::app_state::App;
use crate::flows::context::cpu::cpu_bound;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A plan whose `show -json` is larger is not kept (it is planned again at the next push): the
/// engine's own default bound on it (`DEFAULT_MAX_PLAN_JSON`). Redacting holds about the
/// document's size again (a 12 MiB document of 10,000 resources: +12.4 MiB, 0.19 s).
pub const MAX_DOCUMENT_BYTES: usize = 32 * 1024 * 1024;

/// What must be equal for a plan to be reused, besides the changes not reaching its root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unchanged {
    /// The target branch's and the default branch's heads (the merge result, the config and
    /// the policy sets come from them).
    pub target_head: CommitSha,
    pub default_head: CommitSha,
    /// The root's entry in `.planbot.toml`, as planbot read it.
    pub entry: String,
    /// The engine's version line.
    pub engine: String,
    /// The flags a comment asked for at the head (empty: the full plan).
    pub targeting: String,
    /// The serial of the root's GitLab-managed state (`None`: not written yet); an apply, a
    /// drift fix or an import changes it.
    pub state_serial: Option<u64>,
}

/// One root's plan as the note showed it, with what the note and the status need of it.
pub struct Reusable {
    /// The commit planned (the merge result or the head).
    pub planned_commit: CommitSha,
    /// The MR head it was planned for (the note names it).
    pub head: CommitSha,
    pub unchanged: Unchanged,
    pub shown: PlanShown,
}

/// A clean plan as shown, with its checks: what a kept plan and a root unit's result hold.
#[derive(Clone)]
pub struct PlanShown {
    pub planned: Arc<ShownPlan>,
    pub findings: Vec<Finding>,
    pub fingerprint: Fingerprint,
    pub policy: Option<Verdict>,
    pub checks: RootChecks,
    pub capacity: Option<Capacity>,
    pub preflight_note: String,
}

/// A [`PlanShown`] as text that holds no secret the scrubber it was written with knows: the
/// redacted document, its secrets as digests, and everything else scrubbed.
#[derive(Serialize, Deserialize)]
pub struct ShownText {
    /// What the note and the statuses show of it besides the plan (JSON).
    pub outcome: String,
    /// The redacted `show -json` document.
    pub document: String,
    /// Its secrets as keyed digests (JSON).
    pub digests: String,
}

/// What is kept of a plan besides its document, its fingerprint and its inputs: every text
/// scrubbed before it is written.
#[derive(Serialize, Deserialize)]
struct KeptOutcome {
    findings: Vec<Finding>,
    policy: Option<Verdict>,
    checks: RootChecks,
    capacity: Option<Capacity>,
    preflight_note: String,
    log: String,
    lock_file: Option<String>,
    parallelism: Option<u16>,
    targeting: Targeting,
    backend: Backend,
    digest: PlanDigest,
}

/// The key of the kept plans' secret digests.
pub fn digest_key(app: &App) -> DigestKey {
    DigestKey::derive(app.config.fingerprint_key.expose().as_bytes())
}

/// What decides whether the last plan kept of a root is reused: the commit and head it was
/// planned at, and its inputs.
pub struct Candidate {
    pub planned_commit: CommitSha,
    pub head: CommitSha,
    pub unchanged: Unchanged,
}

/// What decides whether the last plan kept of `root` of the MR is reused, without reading the
/// plan ([`last`] reads it); `None` when none is kept or it does not read.
pub async fn candidate(app: &App, project: ProjectId, mr: MrIid, root: &str) -> Option<Candidate> {
    let read = app.store.kept_plan_inputs(project, mr, root).await;
    let (head, planned_commit, inputs) = match read {
        Ok(row) => row?,
        Err(e) => {
            tracing::warn!(project = project.0, mr = mr.0, root, error = %format!("{e:#}"), "could not read the root's kept plan: it is planned");
            return None;
        }
    };
    match serde_json::from_str(&inputs) {
        Ok(unchanged) => Some(Candidate {
            planned_commit,
            head,
            unchanged,
        }),
        Err(e) => {
            tracing::warn!(project = project.0, mr = mr.0, root, error = %e, "the root's kept plan does not read: it is planned");
            None
        }
    }
}

/// The last plan kept of `root` of the MR, when one is kept and reads back (one that does not
/// is logged, and the root is planned).
pub async fn last(app: &App, project: ProjectId, mr: MrIid, root: &str) -> Option<Arc<Reusable>> {
    let row = match app.store.kept_plan(project, mr, root).await {
        Ok(row) => row?,
        Err(e) => {
            tracing::warn!(project = project.0, mr = mr.0, root, error = %format!("{e:#}"), "could not read the root's kept plan: it is planned");
            return None;
        }
    };
    match cpu_bound(|| read_back(row, digest_key(app))) {
        Ok(kept) => Some(Arc::new(kept)),
        Err(e) => {
            tracing::warn!(project = project.0, mr = mr.0, root, error = %format!("{e:#}"), "the root's kept plan does not read: it is planned");
            None
        }
    }
}

fn read_back(row: KeptPlanRow, key: DigestKey) -> Result<Reusable> {
    let unchanged: Unchanged = serde_json::from_str(&row.inputs).context("its inputs")?;
    let text = ShownText {
        outcome: row.outcome,
        document: row.document,
        digests: row.digests,
    };
    Ok(Reusable {
        planned_commit: row.planned_commit,
        head: row.head,
        unchanged,
        shown: shown_from_text(text, key)?,
    })
}

/// The plan a [`ShownText`] holds, as [`shown_text`] wrote it.
pub fn shown_from_text(text: ShownText, key: DigestKey) -> Result<PlanShown> {
    let mut outcome: serde_json::Value =
        serde_json::from_str(&text.outcome).context("its outcome")?;
    let fingerprint: Fingerprint = serde_json::from_value(
        outcome
            .as_object_mut()
            .and_then(|o| o.remove("fingerprint"))
            .context("its fingerprint")?,
    )
    .context("its fingerprint")?;
    let outcome: KeptOutcome = serde_json::from_value(outcome).context("its outcome")?;
    let digests: SecretDigests = serde_json::from_str(&text.digests).context("its digests")?;
    let planned = ShownPlan::kept(KeptShown {
        document: text.document.into_bytes(),
        log: outcome.log,
        lock_file: outcome.lock_file.map(String::into_bytes),
        parallelism: outcome.parallelism,
        targeting: outcome.targeting,
        backend: outcome.backend,
        digests,
        key,
        digest: outcome.digest,
    })
    .context("its document")?;
    Ok(PlanShown {
        planned: Arc::new(planned),
        findings: outcome.findings,
        fingerprint,
        policy: outcome.policy,
        checks: outcome.checks,
        capacity: outcome.capacity,
        preflight_note: outcome.preflight_note,
    })
}

/// Keep `kept` as the last plan of `root` of the MR (replacing the one before), redacted with
/// `scrubber`, which knows every secret its note knew (every root's, the configured ones): its
/// document with each replaced, its own secrets as digests, every other text scrubbed. A plan
/// that cannot be kept is logged (the next push plans the root).
pub async fn keep(
    app: &App,
    project: ProjectId,
    mr: MrIid,
    root: &str,
    kept: &Reusable,
    scrubber: &Scrubber,
) {
    if kept.shown.planned.plan_json().len() > MAX_DOCUMENT_BYTES {
        tracing::info!(
            project = project.0,
            mr = mr.0,
            root,
            "root's plan not kept for the next push: its plan is too large"
        );
        return;
    }
    let row = cpu_bound(|| redacted_row(app, kept, scrubber));
    let result = match row {
        Ok(row) => app.store.keep_plan(project, mr, root, row).await,
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        let error = app.scrubber.scrub(&format!("{e:#}")).into_owned();
        tracing::warn!(project = project.0, mr = mr.0, root, error = %error, "could not keep the root's plan for the next push");
    }
}

fn redacted_row(app: &App, kept: &Reusable, scrubber: &Scrubber) -> Result<KeptPlanRow> {
    let text = shown_text(app, &kept.shown, scrubber)?;
    Ok(KeptPlanRow {
        head: kept.head.clone(),
        planned_commit: kept.planned_commit.clone(),
        inputs: serde_json::to_string(&kept.unchanged)?,
        outcome: text.outcome,
        document: text.document,
        digests: text.digests,
    })
}

/// `shown` as text without a secret `scrubber` knows: its document redacted
/// (`core::kept_plan`), its own secrets as keyed digests, every other text scrubbed.
pub fn shown_text(app: &App, shown: &PlanShown, scrubber: &Scrubber) -> Result<ShownText> {
    let plan = &shown.planned;
    let key = digest_key(app);
    let document = crate::core::kept_plan::redacted_document(plan.plan_json(), scrubber, key)
        .context("redacting the plan")?;
    let fingerprint_key = app.config.fingerprint_key.expose();
    let outcome = KeptOutcome {
        findings: shown.findings.clone(),
        policy: shown.policy.clone(),
        checks: shown.checks.clone(),
        capacity: shown.capacity.clone(),
        preflight_note: shown.preflight_note.clone(),
        log: plan.log().to_string(),
        lock_file: plan
            .lock_file()
            .and_then(|b| String::from_utf8(b.to_vec()).ok()),
        parallelism: plan.parallelism(),
        targeting: plan.targeting().clone(),
        backend: plan.backend().clone(),
        digest: plan.digest(fingerprint_key.as_bytes()),
    };
    let mut outcome = scrubber.scrub_json(&serde_json::to_value(&outcome)?);
    if let Some(o) = outcome.as_object_mut() {
        o.insert(
            "fingerprint".into(),
            serde_json::to_value(&shown.fingerprint)?,
        );
    }
    Ok(ShownText {
        outcome: outcome.to_string(),
        document: String::from_utf8(document).context("the redacted document")?,
        digests: serde_json::to_string(&plan.secrets().digests(key))?,
    })
}

/// Forget every plan kept of the MR (it was closed or merged).
pub async fn forget(app: &App, project: ProjectId, mr: MrIid) {
    if let Err(e) = app.store.forget_kept_plans(project, mr).await {
        tracing::warn!(project = project.0, mr = mr.0, error = %format!("{e:#}"), "could not forget the MR's kept plans");
    }
}
