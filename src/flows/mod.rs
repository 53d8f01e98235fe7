//! Flows: orchestration of capabilities (commands, intake, queue, plan, apply).
pub mod check_config;
pub mod doctor;
pub mod local_plan;
pub mod preflight;
pub mod report;
pub mod serve;
