//! GitLab events: webhook payloads (`payloads`), what a delivery means (`decision`), MR comment
//! commands (`commands`) and the queue's [`Job`] (`job`).

mod commands;
mod decision;
mod job;
mod payloads;

pub use commands::{parse_command, plan_args, Command, PlanArgs};
pub use decision::{decide, event_label, Decision, EventKind, OutcomeKind};
pub use job::{Job, PlanJob, PlanReason, Redundant, RootUnit, Supersede, AUTHOR_FIELDS};
pub use payloads::{
    gitlab_time_ms, Change, Commit, MergeRequestHook, MrAttributes, MrChanges, NoteAttributes,
    NoteHook, Project, User,
};
