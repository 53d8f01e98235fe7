//! Merge-request review: the plan of one MR head and its note, the Proxmox preflight,
//! and the other MR events (merged, closed, comment commands, fork notices, reconciliation).
pub mod commands;
pub mod plan;
pub mod preflight;
