//! What a store backend does: the [`StoreBackend`] trait, implemented by SQLite and PostgreSQL
//! alike, so the [`Store`](super::Store) the flows hold behaves the same on either.

use super::types::{
    ApplyId, ApplyRecord, ApplyState, ClaimedJob, DeliveryOutcome, Enqueued, JobEnd, JobRow, Lease,
    NewApply, NewDelivery, NewRun, QueueJobId, RunEnd, RunQuery, RunRecord, ShownFingerprint,
};
use super::types::{
    DriftRootRecord, PlanTargeting, PolicyApproval, PolicyVerdictRecord, VerdictRow, WidgetReports,
};
use super::{Dump, ProjectLock};
use crate::core::events::Job;
use crate::core::ids::{CommitSha, JobId, MrIid, NoteId, ProjectId, RunId};
use crate::core::plan_digest::PlanDigest;
use anyhow::Result;
use std::time::Duration;

/// One store backend. Every method is one transaction: its answer comes after the COMMIT.
/// Texts handed in (logs, notes, errors, details) are already scrubbed of secrets.
///
/// The `Store` facade dispatches to one of the two implementations without boxing, so these
/// `async fn`s keep their futures' `Send` (the tests of `store::tests` run against both).
#[allow(async_fn_in_trait)]
pub(crate) trait StoreBackend: Send + Sync {
    /// A quick liveness query for `/readyz`.
    async fn ping(&self) -> Result<()>;

    /// Record one delivery and enqueue its jobs atomically; a key seen before (by any replica)
    /// is a duplicate and enqueues nothing.
    async fn record_delivery(&self, d: NewDelivery, jobs: Vec<Job>) -> Result<DeliveryOutcome>;
    async fn delivery_count(&self) -> Result<u64>;
    async fn delivery_outcome(&self, key: String) -> Result<Option<String>>;

    /// Enqueue a job outside a delivery (with supersede, as [`Job::supersedes`] says).
    async fn enqueue(&self, job: Job) -> Result<Enqueued>;
    /// Take the oldest claimable job (queued, or running on a replica whose lease expired) of
    /// an author and an MR that hold fewer than `share` running jobs ([`Job::author`]).
    async fn claim_next(&self, share: usize) -> Result<Option<ClaimedJob>>;
    /// Extend this replica's lease of a running job, and say whether it should go on.
    async fn heartbeat(&self, id: QueueJobId) -> Result<Lease>;
    /// How often a running job must call [`StoreBackend::heartbeat`]; `None` when nothing
    /// outside this process can take or cancel a job (SQLite).
    fn heartbeat_every(&self) -> Option<Duration>;
    async fn finish_job(&self, id: QueueJobId, end: JobEnd) -> Result<()>;
    async fn cancel_mr(
        &self,
        project: ProjectId,
        mr: MrIid,
        why: String,
    ) -> Result<Vec<QueueJobId>>;
    /// At start-up: jobs whose runner is gone go back to the queue and their runs become
    /// `interrupted`.
    async fn requeue_interrupted(&self) -> Result<usize>;
    async fn queue_depth(&self) -> Result<u64>;
    async fn job(&self, id: QueueJobId) -> Result<Option<JobRow>>;
    async fn recent_jobs(&self, limit: u32) -> Result<Vec<JobRow>>;
    async fn head_has_plan(&self, project: ProjectId, mr: MrIid, sha: CommitSha) -> Result<bool>;

    async fn start_run(&self, run: NewRun) -> Result<RunId>;
    async fn finish_run(&self, id: RunId, end: RunEnd) -> Result<()>;
    async fn run(&self, id: RunId) -> Result<Option<RunRecord>>;
    async fn recent_runs(&self, limit: u32) -> Result<Vec<RunRecord>>;
    async fn run_projects(&self) -> Result<Vec<(ProjectId, Option<String>)>>;
    async fn runs_page(&self, q: RunQuery) -> Result<Vec<RunRecord>>;
    async fn runs_for_mr(&self, project: ProjectId, mr: MrIid) -> Result<Vec<RunRecord>>;

    async fn record_fingerprint(&self, shown: ShownFingerprint) -> Result<()>;
    async fn last_shown_fingerprint(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
    ) -> Result<Option<ShownFingerprint>>;
    async fn fingerprint_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
    ) -> Result<Option<ShownFingerprint>>;
    async fn record_digest(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
        digest_json: String,
    ) -> Result<()>;
    async fn digest_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
    ) -> Result<Option<PlanDigest>>;
    async fn record_widgets(
        &self,
        project: ProjectId,
        mr: MrIid,
        root: String,
        sha: CommitSha,
        report_json: String,
    ) -> Result<()>;
    async fn widgets_for(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<WidgetReports>;
    async fn set_mr_note(&self, project: ProjectId, mr: MrIid, note: NoteId) -> Result<()>;
    async fn mr_note(&self, project: ProjectId, mr: MrIid) -> Result<Option<NoteId>>;

    /// `None` if this CI job has applied (or tried to) before, on any replica.
    async fn begin_apply(&self, a: NewApply) -> Result<Option<ApplyId>>;
    async fn finish_apply(
        &self,
        id: ApplyId,
        state: ApplyState,
        detail: Option<String>,
    ) -> Result<()>;
    /// At start-up: applies whose runner is gone become `interrupted` (never re-run).
    async fn mark_interrupted_applies(&self) -> Result<Vec<ApplyRecord>>;
    async fn apply_for_job(&self, ci_job: JobId) -> Result<Option<ApplyRecord>>;
    /// Wait until this caller alone applies to `project` (across replicas); held until dropped.
    async fn lock_project(&self, project: ProjectId) -> Result<ProjectLock>;
    /// Take `project`'s apply lock if no other apply holds it; `None` when one does.
    async fn try_lock_project(&self, project: ProjectId) -> Result<Option<ProjectLock>>;

    /// Record (or replace) a root's policy verdict for one head; `verdict_json` is
    /// `record.verdict` as JSON.
    async fn record_policy_verdict(
        &self,
        record: PolicyVerdictRecord,
        verdict_json: String,
    ) -> Result<()>;
    /// The verdicts of one head of the MR: `(root, fingerprint, verdict JSON)`.
    async fn policy_verdicts(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
    ) -> Result<Vec<VerdictRow>>;
    /// `false` when that approver had already approved that set of that plan.
    async fn record_policy_approval(&self, approval: PolicyApproval) -> Result<bool>;
    /// Every approval of the MR, oldest first.
    async fn policy_approvals(&self, project: ProjectId, mr: MrIid) -> Result<Vec<PolicyApproval>>;

    /// Replace every targeting of the MR (all heads) by `set`'s, in one transaction.
    async fn set_plan_targeting(&self, set: PlanTargeting) -> Result<()>;
    /// One root's targeting (JSON) at one head of the MR, if a comment asked for one.
    async fn plan_targeting(
        &self,
        project: ProjectId,
        mr: MrIid,
        sha: CommitSha,
        root: String,
    ) -> Result<Option<String>>;

    /// Claim the drift schedule's tick of occurrence `at` (unix ms) and queue its job, at
    /// once: `None` when it was already claimed (by any replica).
    async fn claim_drift_tick(&self, at: i64) -> Result<Option<QueueJobId>>;
    /// The newest claimed drift tick (unix ms).
    async fn last_drift_tick(&self) -> Result<Option<i64>>;
    /// Record a root's drift check, replacing its last one.
    async fn record_drift_root(&self, root: DriftRootRecord) -> Result<()>;
    /// Forget the drift checks of `project`'s roots not in `keep`.
    async fn forget_drift_roots(&self, project: ProjectId, keep: Vec<String>) -> Result<()>;
    /// Every root's last drift check.
    async fn drift_roots(&self) -> Result<Vec<DriftRootRecord>>;

    /// Every row of every table, for `planbot store migrate`.
    async fn export(&self) -> Result<Dump>;
    /// Load a dump into an empty store, keeping ids.
    async fn import(&self, dump: Dump) -> Result<()>;
}
