//! Merge-request review: the plan of one MR head and its note, the policy checks, and the
//! other MR events (merged, closed, comment commands, fork notices…).
pub mod commands;
mod gitlab_calls;
pub mod plan;
pub mod policies;
pub mod widgets;
