//! The store's public types: what callers hand in and get back, independent of SQL.

use crate::core::events::{Job, Supersede};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, JobId, MrIid, ProjectId, RunId, UserId};
use crate::core::policy::review::RecordedVerdict;
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// A job in planbot's own queue (not a CI job).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct QueueJobId(pub i64);

impl fmt::Display for QueueJobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An apply record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct ApplyId(pub i64);

/// A stored text that names no known kind or state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?} in the store")]
pub struct UnknownValue {
    pub what: &'static str,
    pub value: String,
}

/// Enums stored as text: `as_str` is the stored text, `FromStr` reads it back.
macro_rules! stored_enum {
    ($(#[$doc:meta])* $name:ident, $what:literal { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The text stored in the database.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, UnknownValue> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownValue { what: $what, value: s.to_string() }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

stored_enum!(
    /// What a queue job does; the stored form of [`Job::kind`].
    QueueJobKind, "queue job kind" {
        Plan => "plan",
        PlanRoot => "plan_root",
        MarkMerged => "mark_merged",
        Closed => "closed",
        Command => "command",
        ForkNotice => "fork_notice",
        Reconcile => "reconcile",
        DriftTick => "drift_tick",
    }
);

impl QueueJobKind {
    pub fn of(job: &Job) -> QueueJobKind {
        match job {
            Job::Plan(_) => QueueJobKind::Plan,
            Job::PlanRoot(_) => QueueJobKind::PlanRoot,
            Job::MarkMerged { .. } => QueueJobKind::MarkMerged,
            Job::Closed { .. } => QueueJobKind::Closed,
            Job::Command { .. } => QueueJobKind::Command,
            Job::ForkNotice { .. } => QueueJobKind::ForkNotice,
            Job::Reconcile => QueueJobKind::Reconcile,
            Job::DriftTick { .. } => QueueJobKind::DriftTick,
        }
    }
}

stored_enum!(
    /// Where a queue job is: `queued` → `running` → `done` | `failed` | `canceled`.
    QueueJobState, "queue job state" {
        Queued => "queued",
        Running => "running",
        Done => "done",
        Failed => "failed",
        Canceled => "canceled",
    }
);

/// What enqueuing did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enqueued {
    /// The new job; `None` if an identical job was already queued.
    pub id: Option<QueueJobId>,
    /// Running jobs this one superseded: their tokens must be cancelled.
    pub cancel_running: Vec<QueueJobId>,
}

/// One delivery to record.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    /// `Idempotency-Key` / `webhook-id` (or a hash of the body when GitLab sent neither).
    pub key: String,
    /// The `X-Gitlab-Event` label (`merge_request`, `note`, …).
    pub event: String,
    /// `enqueued`, `ignored: …`, `unparseable: …`.
    pub outcome: String,
    pub project: Option<ProjectId>,
    pub mr: Option<MrIid>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryOutcome {
    /// The key was seen before; nothing was enqueued.
    pub duplicate: bool,
    pub enqueued: Vec<QueueJobId>,
    /// Running jobs superseded by this delivery.
    pub cancel_running: Vec<QueueJobId>,
}

/// A job taken from the queue.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub id: QueueJobId,
    pub job: Job,
    /// 1 on the first run; more after restarts.
    pub attempts: u32,
}

/// How a job ended.
#[derive(Debug, Clone)]
pub enum JobEnd {
    Done,
    Failed(String),
    Canceled(String),
}

impl JobEnd {
    /// The state it leaves the job in.
    pub fn state(&self) -> QueueJobState {
        match self {
            JobEnd::Done => QueueJobState::Done,
            JobEnd::Failed(_) => QueueJobState::Failed,
            JobEnd::Canceled(_) => QueueJobState::Canceled,
        }
    }

    /// Why it failed or was canceled.
    pub fn detail(&self) -> Option<&str> {
        match self {
            JobEnd::Done => None,
            JobEnd::Failed(d) | JobEnd::Canceled(d) => Some(d),
        }
    }
}

/// A job as stored. `kind` and `state` are the stored texts (what pages and logs show);
/// [`JobRow::queue_kind`] and [`JobRow::queue_state`] give them typed, to branch on.
#[derive(Debug, Clone, Serialize)]
pub struct JobRow {
    pub id: QueueJobId,
    pub kind: String,
    pub project: Option<ProjectId>,
    pub mr: Option<MrIid>,
    pub sha: Option<String>,
    pub state: String,
    pub attempts: u32,
    pub detail: Option<String>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    #[serde(skip)]
    pub job: Option<Job>,
}

impl JobRow {
    pub fn queue_kind(&self) -> Result<QueueJobKind, UnknownValue> {
        self.kind.parse()
    }

    pub fn queue_state(&self) -> Result<QueueJobState, UnknownValue> {
        self.state.parse()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    Plan,
    Apply,
    /// A drift check of the default branch's head (`planbot drift`, the schedule).
    Drift,
}

impl RunKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Plan => "plan",
            RunKind::Apply => "apply",
            RunKind::Drift => "drift",
        }
    }

    /// Anything but `apply` or `drift` reads as a plan.
    pub(super) fn parse(s: &str) -> RunKind {
        match s {
            "apply" => RunKind::Apply,
            "drift" => RunKind::Drift,
            _ => RunKind::Plan,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Running,
    Succeeded,
    Failed,
    Canceled,
    Refused,
    Interrupted,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Canceled => "canceled",
            RunState::Refused => "refused",
            RunState::Interrupted => "interrupted",
        }
    }

    /// An unknown text reads as `running`.
    pub(super) fn parse(s: &str) -> RunState {
        match s {
            "succeeded" => RunState::Succeeded,
            "failed" => RunState::Failed,
            "canceled" => RunState::Canceled,
            "refused" => RunState::Refused,
            "interrupted" => RunState::Interrupted,
            _ => RunState::Running,
        }
    }
}

/// A run to start.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub job: Option<QueueJobId>,
    pub kind: RunKind,
    pub project: ProjectId,
    pub project_path: Option<String>,
    pub mr: Option<MrIid>,
    pub root: String,
    pub sha: CommitSha,
}

/// How a run ended; every text already scrubbed.
#[derive(Debug, Clone)]
pub struct RunEnd {
    pub state: RunState,
    /// One line, e.g. "2 to add, 1 to change, 0 to destroy".
    pub summary: Option<String>,
    /// The redacted engine log.
    pub log: String,
    /// The rendered note (markdown) this run produced.
    pub note_markdown: Option<String>,
    pub fingerprint: Option<Fingerprint>,
}

/// What [`Store::runs_page`](super::Store::runs_page) lists.
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    pub projects: Vec<ProjectId>,
    pub mr: Option<MrIid>,
    pub state: Option<RunState>,
    pub before: Option<RunId>,
    pub limit: u32,
}

/// A run as stored.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    pub id: RunId,
    pub job: Option<QueueJobId>,
    pub kind: RunKind,
    pub project: ProjectId,
    pub project_path: Option<String>,
    pub mr: Option<MrIid>,
    pub root: String,
    pub sha: CommitSha,
    pub state: RunState,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub summary: Option<String>,
    pub log: String,
    pub note_markdown: Option<String>,
    pub fingerprint: Option<String>,
}

impl RunRecord {
    pub fn duration_ms(&self) -> Option<i64> {
        self.finished_at.map(|f| (f - self.started_at).max(0))
    }
}

stored_enum!(
    /// What a root's last drift check found (`core::drift::DriftVerdict`, without its details).
    DriftOutcome, "drift outcome" {
        Clean => "clean",
        Drifted => "drifted",
        Waiting => "waiting",
        CouldNotCheck => "could_not_check",
    }
);

/// A root's last drift check, as `/metrics` and `planbot doctor` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriftRootRecord {
    pub project: ProjectId,
    pub project_path: String,
    pub root: String,
    pub outcome: DriftOutcome,
    /// Resources that differ (0 unless drifted).
    pub drifted: u32,
    /// The last check (unix ms).
    pub checked_at: i64,
    /// The last check that could check (unix ms): any outcome but could-not-check.
    pub checked_ok_at: Option<i64>,
}

/// A fingerprint shown on an MR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownFingerprint {
    pub project: ProjectId,
    pub mr: MrIid,
    pub root: String,
    pub sha: CommitSha,
    pub fingerprint: Fingerprint,
    pub run: Option<RunId>,
}

/// An apply to begin.
#[derive(Debug, Clone)]
pub struct NewApply {
    pub ci_job: JobId,
    pub project: ProjectId,
    pub mr: Option<MrIid>,
    pub sha: CommitSha,
    pub roots: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyState {
    Running,
    Succeeded,
    Failed,
    Refused,
    Interrupted,
}

impl ApplyState {
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyState::Running => "running",
            ApplyState::Succeeded => "succeeded",
            ApplyState::Failed => "failed",
            ApplyState::Refused => "refused",
            ApplyState::Interrupted => "interrupted",
        }
    }

    /// An unknown text reads as `running`.
    pub(super) fn parse(s: &str) -> ApplyState {
        match s {
            "succeeded" => ApplyState::Succeeded,
            "failed" => ApplyState::Failed,
            "refused" => ApplyState::Refused,
            "interrupted" => ApplyState::Interrupted,
            _ => ApplyState::Running,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ApplyRecord {
    pub id: ApplyId,
    pub ci_job: JobId,
    pub project: ProjectId,
    pub mr: Option<MrIid>,
    pub sha: CommitSha,
    pub roots: Vec<String>,
    pub state: ApplyState,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub detail: Option<String>,
}

/// Why a store's schema could not be brought up to date (either backend).
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "the store has schema version {found}, newer than this planbot knows (up to {known}): \
         it was written by a newer planbot; run that version, or restore a backup made by this one"
    )]
    TooNew { found: u32, known: u32 },
    #[error("running the store's migrations")]
    Runner(#[from] refinery::Error),
    #[error("reading or recording the store's schema version")]
    Sqlite(#[from] rusqlite::Error),
    #[error("reading or recording the store's schema version")]
    Postgres(#[from] tokio_postgres::Error),
}

/// What `planbot doctor` reads of a store without changing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreProbe {
    /// The server and its version (`PostgreSQL 15.18`); `None` for SQLite.
    pub server: Option<String>,
    /// Whether the session is encrypted (PostgreSQL); `None` for SQLite.
    pub tls: Option<bool>,
    /// The schema version found: 0 when planbot has not created the store yet.
    pub schema: u32,
    /// The schema version this planbot writes.
    pub known: u32,
    /// The replicas whose heartbeat is current (PostgreSQL).
    pub live_replicas: Vec<String>,
    /// The newest claimed drift tick (unix ms), and each root's last drift check.
    pub last_drift_tick: Option<i64>,
    pub drift_roots: Vec<DriftRootRecord>,
}

/// What a running job's heartbeat found in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// Still this replica's job, running: its lease is extended.
    Held,
    /// Canceled (superseded, closed) while it ran, wherever the cancel came from: stop it.
    Canceled,
    /// No longer this replica's (its lease expired and another replica took it, or it ended):
    /// stop it without recording an end.
    Lost,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ids::NoteId;

    #[test]
    fn queue_kinds_and_states_read_back_what_they_store() {
        for k in QueueJobKind::ALL {
            assert_eq!(k.as_str().parse::<QueueJobKind>(), Ok(*k));
        }
        for s in QueueJobState::ALL {
            assert_eq!(s.as_str().parse::<QueueJobState>(), Ok(*s));
        }
        assert!("sleeping".parse::<QueueJobState>().is_err());
    }

    #[test]
    fn a_jobs_stored_kind_is_its_events_kind() {
        let (p, m) = (ProjectId(1), MrIid(2));
        let jobs = [
            Job::MarkMerged {
                project: p,
                mr: m,
                merge_commit: None,
                target_branch: None,
            },
            Job::Closed { project: p, mr: m },
            Job::Command {
                project: p,
                project_path: None,
                mr: m,
                note: Some(NoteId(3)),
                author: crate::core::ids::UserId(4),
                command: crate::core::events::Command::Help,
                head: None,
                written_at: None,
                fork: false,
                plan_args: None,
            },
            Job::ForkNotice {
                project: p,
                mr: m,
                head: None,
            },
            Job::Reconcile,
            Job::DriftTick { at: 1 },
        ];
        for job in &jobs {
            assert_eq!(QueueJobKind::of(job).as_str(), job.kind());
        }
    }
}

/// The policy verdict of one root's plan as shown on the MR for one head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyVerdictRecord {
    pub project: ProjectId,
    pub mr: MrIid,
    pub root: String,
    /// The MR head the plan was shown for.
    pub sha: CommitSha,
    /// The fingerprint of the plan the verdict is about.
    pub fingerprint: Fingerprint,
    /// Its messages already scrubbed.
    pub verdict: RecordedVerdict,
}

/// An owner's approval of one failing set, for one root's plan at one head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyApproval {
    pub project: ProjectId,
    pub mr: MrIid,
    pub root: String,
    pub sha: CommitSha,
    pub fingerprint: Fingerprint,
    /// The policy set's name.
    pub set: String,
    pub approver_id: UserId,
    /// The approver's GitLab user name when they approved.
    pub approver: String,
    /// Milliseconds since the epoch (set by the store).
    pub approved_at: i64,
}

impl PolicyApproval {
    /// The names of the sets approved for exactly this plan (`sha`, `fingerprint`) of `root`.
    pub fn sets_for<'a>(
        approvals: &'a [PolicyApproval],
        root: &str,
        sha: &CommitSha,
        fingerprint: &Fingerprint,
    ) -> Vec<&'a str> {
        approvals
            .iter()
            .filter(|a| a.root == root && &a.sha == sha && &a.fingerprint == fingerprint)
            .map(|a| a.set.as_str())
            .collect()
    }
}

/// The kinds of its MR's queued and running jobs that enqueuing `job` cancels
/// ([`Job::supersedes`]): `None` nothing, `Some(None)` every kind, `Some(Some(kind))` one.
pub(super) fn superseded_kinds(job: &Job) -> Option<Option<QueueJobKind>> {
    match job.supersedes() {
        Supersede::None => None,
        Supersede::OtherHeads => Some(Some(QueueJobKind::Plan)),
        Supersede::All => Some(None),
    }
}

/// What the store holds for GitLab's MR widgets of one MR head: each root's report (those that
/// do not parse are left out), and whether a plan of that head is still queued or running.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WidgetReports {
    pub pending: bool,
    /// By root name, in name order.
    pub roots: Vec<(String, crate::core::widgets::RootWidgets)>,
}

impl WidgetReports {
    pub(super) fn from_rows(pending: bool, rows: Vec<(String, String)>) -> WidgetReports {
        WidgetReports {
            pending,
            roots: rows
                .into_iter()
                .filter_map(|(root, json)| {
                    crate::core::widgets::RootWidgets::from_json(&json).map(|r| (root, r))
                })
                .collect(),
        }
    }
}
