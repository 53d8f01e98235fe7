//! What the queue runs ([`Job`]), serialized as JSON into the store, and what enqueuing one does
//! to the other jobs of its MR ([`Supersede`]).

use super::commands::Command;
use crate::core::ids::{CommitSha, MrIid, NoteId, ProjectId, UserId};
use serde::{Deserialize, Serialize};

/// Why a plan was asked for (shown on run pages, and lets the plan flow narrow its work).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanReason {
    Opened,
    Reopened,
    NewCommits,
    TargetBranchChanged,
    MarkedReady,
    /// `planbot plan` on the MR, by this user (access already checked by the command job).
    Command,
    /// Another MR was merged into the target branch: this plan may be stale.
    SiblingMerged {
        merged: MrIid,
    },
    /// Start-up reconciliation: the head had no plan (a webhook was lost).
    Reconcile,
    /// A plan of an older head found the MR at this head, which had no plan: its webhook was
    /// lost, or arrived before the older head's (GitLab does not promise their order).
    MissedHead,
}

/// Plan one MR at one head commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanJob {
    pub project: ProjectId,
    pub project_path: Option<String>,
    pub mr: MrIid,
    pub head: CommitSha,
    pub target_branch: Option<String>,
    pub source_project: Option<ProjectId>,
    /// From a fork: untrusted code; only planned on a maintainer's command, with plan credentials.
    pub fork: bool,
    pub draft: bool,
    pub reason: PlanReason,
    pub requested_by: Option<UserId>,
}

/// One root of an MR's plan job, planned by whichever replica takes it (docs/architecture.md,
/// "One MR's roots over every replica"); the plan job that queued it (`parent`) plans the
/// roots nobody took, and puts the note together from every root's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootUnit {
    #[serde(flatten)]
    pub plan: PlanJob,
    /// The queue job of the MR's plan (the store's id).
    pub parent: i64,
    pub root: String,
    /// The commit the plan job planned (GitLab's merge result or the head).
    pub commit: CommitSha,
    /// The default branch whose `.planbot.toml` and policy sets the plan job read, at `config_at`.
    pub default_branch: String,
    pub config_at: CommitSha,
}

/// The top-level fields of a job's JSON payload that hold [`Job::author`], in the order the
/// store's claim reads them (a test here keeps the two in step).
pub const AUTHOR_FIELDS: [&str; 2] = ["requested_by", "author"];

/// Everything the queue runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Job {
    Plan(PlanJob),
    /// One root of a plan job, for any replica to plan.
    PlanRoot(RootUnit),
    /// The MR was merged: banner on its note, then re-plan the other open MRs of the project.
    MarkMerged {
        project: ProjectId,
        mr: MrIid,
        merge_commit: Option<CommitSha>,
        target_branch: Option<String>,
    },
    /// The MR was closed: queued work is already dropped; remove the workspace.
    Closed {
        project: ProjectId,
        mr: MrIid,
    },
    /// `planbot plan` / `planbot help` in a note; the job checks Developer+ access and ignores the bot's own notes.
    Command {
        project: ProjectId,
        project_path: Option<String>,
        mr: MrIid,
        note: Option<NoteId>,
        author: UserId,
        command: Command,
        /// The MR head at the time of the note, when the payload had it (the job re-reads the MR).
        head: Option<CommitSha>,
        /// When the note was written (`object_attributes.created_at`, unix ms on GitLab's clock):
        /// an approval is for the plan note as it was then.
        #[serde(default)]
        written_at: Option<i64>,
        fork: bool,
        /// The engine flags of a targeted `planbot plan [ROOT] -- …` (checked by the job).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        plan_args: Option<super::commands::PlanArgs>,
    },
    /// A fork MR was opened/updated: say once that a maintainer must run `planbot plan`.
    ForkNotice {
        project: ProjectId,
        mr: MrIid,
        head: Option<CommitSha>,
    },
    /// Start-up: plan every open MR of the allowed projects whose head has no plan.
    Reconcile,
    /// A drift check of every root of every configured project, for the `[drift] schedule`'s
    /// occurrence `at` (unix milliseconds), claimed by exactly one replica.
    DriftTick {
        at: i64,
    },
}

impl Job {
    /// Short kind name, as stored and shown.
    pub fn kind(&self) -> &'static str {
        match self {
            Job::Plan(_) => "plan",
            Job::PlanRoot(_) => "plan_root",
            Job::MarkMerged { .. } => "mark_merged",
            Job::Closed { .. } => "closed",
            Job::Command { .. } => "command",
            Job::ForkNotice { .. } => "fork_notice",
            Job::Reconcile => "reconcile",
            Job::DriftTick { .. } => "drift_tick",
        }
    }

    /// The MR this job is about, if any.
    pub fn mr(&self) -> Option<(ProjectId, MrIid)> {
        match self {
            Job::Plan(p) | Job::PlanRoot(RootUnit { plan: p, .. }) => Some((p.project, p.mr)),
            Job::MarkMerged { project, mr, .. }
            | Job::Closed { project, mr }
            | Job::Command { project, mr, .. }
            | Job::ForkNotice { project, mr, .. } => Some((*project, *mr)),
            Job::Reconcile | Job::DriftTick { .. } => None,
        }
    }

    /// Whose work this job is, for the queue's fair share of workers: a plan's `requested_by`
    /// (the MR's author, or who commented `planbot plan`), a command's author. `None` for
    /// planbot's own work (re-plans after a merge, reconcile, drift, notices), which shares
    /// one bucket. The store reads it from the stored payload by [`AUTHOR_FIELDS`].
    pub fn author(&self) -> Option<UserId> {
        match self {
            Job::Plan(p) | Job::PlanRoot(RootUnit { plan: p, .. }) => p.requested_by,
            Job::Command { author, .. } => Some(*author),
            _ => None,
        }
    }

    /// The commit this job is about, if any.
    pub fn sha(&self) -> Option<&CommitSha> {
        match self {
            Job::Plan(p) | Job::PlanRoot(RootUnit { plan: p, .. }) => Some(&p.head),
            Job::MarkMerged { merge_commit, .. } => merge_commit.as_ref(),
            Job::Command { head, .. } | Job::ForkNotice { head, .. } => head.as_ref(),
            _ => None,
        }
    }
}

/// What enqueuing a job does to the other jobs of the same MR (applied by the store atomically).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Supersede {
    /// Nothing.
    None,
    /// Cancel queued and running plans of this MR for any other head.
    OtherHeads,
    /// Cancel every queued or running job of this MR (close).
    All,
}

/// When a new job is redundant with the plans of its head already in the store (checked by the
/// store atomically with the enqueue, so replicas enqueuing at once agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redundant {
    /// Never: it always runs (and supersedes, as [`Job::supersedes`] says).
    Never,
    /// While a plan job of the same head is queued or running: that one will post the note.
    WhileHeadQueuedOrRunning,
    /// Once the head has any plan (queued, running, or done): a catch-up that is not needed.
    OnceHeadPlanned,
}

impl Job {
    /// Whether this job adds nothing to the plans of its head already known.
    pub fn redundant(&self) -> Redundant {
        let Job::Plan(p) = self else {
            return Redundant::Never;
        };
        match p.reason {
            // New inputs for the same commit, or a person asked: plan again.
            PlanReason::TargetBranchChanged
            | PlanReason::SiblingMerged { .. }
            | PlanReason::MarkedReady
            | PlanReason::Command => Redundant::Never,
            PlanReason::Opened | PlanReason::Reopened | PlanReason::NewCommits => {
                Redundant::WhileHeadQueuedOrRunning
            }
            PlanReason::Reconcile | PlanReason::MissedHead => Redundant::OnceHeadPlanned,
        }
    }

    pub fn supersedes(&self) -> Supersede {
        match self {
            Job::Plan(_) | Job::MarkMerged { .. } => Supersede::OtherHeads,
            Job::Closed { .. } => Supersede::All,
            _ => Supersede::None,
        }
    }

    /// What the jobs this one supersedes say when canceled (their run's and job's reason).
    pub fn supersede_reason(&self) -> String {
        match (self.supersedes(), self) {
            (Supersede::All, _) => "the merge request was closed".to_string(),
            (_, Job::Plan(PlanJob { head, .. })) => {
                format!("superseded by a newer plan of {}", head.short())
            }
            _ => "superseded".to_string(),
        }
    }
}

#[cfg(test)]
mod author_tests {
    use super::*;

    /// The store's claim reads a job's author from its stored payload by [`AUTHOR_FIELDS`]:
    /// the first of them a payload has is [`Job::author`], for every kind of job.
    #[test]
    fn the_author_fields_of_a_payload_are_the_jobs_author() {
        let plan = PlanJob {
            project: ProjectId(1),
            project_path: None,
            mr: MrIid(2),
            head: CommitSha("a".repeat(40)),
            target_branch: None,
            source_project: None,
            fork: false,
            draft: false,
            reason: PlanReason::Opened,
            requested_by: Some(UserId(7)),
        };
        let jobs = [
            Job::Plan(plan.clone()),
            Job::PlanRoot(RootUnit {
                plan: PlanJob {
                    requested_by: Some(UserId(5)),
                    ..plan.clone()
                },
                parent: 3,
                root: "a".into(),
                commit: CommitSha("b".repeat(40)),
                default_branch: "main".into(),
                config_at: CommitSha("c".repeat(40)),
            }),
            Job::Plan(PlanJob {
                requested_by: None,
                ..plan
            }),
            Job::Command {
                project: ProjectId(1),
                project_path: None,
                mr: MrIid(2),
                note: None,
                author: UserId(9),
                command: Command::Help,
                head: None,
                written_at: None,
                fork: false,
                plan_args: None,
            },
            Job::Closed {
                project: ProjectId(1),
                mr: MrIid(2),
            },
            Job::Reconcile,
            Job::DriftTick { at: 1 },
        ];
        for job in jobs {
            let v = serde_json::to_value(&job).unwrap();
            let stored = AUTHOR_FIELDS
                .iter()
                .find_map(|f| v.get(f).filter(|a| !a.is_null()))
                .map(|a| UserId(a.as_u64().expect("a user id is a number")));
            assert_eq!(stored, job.author(), "{v}");
        }
    }
}
