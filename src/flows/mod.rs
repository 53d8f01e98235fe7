//! Flows: orchestration of capabilities (commands, intake, queue, plan, apply).
pub mod apply_job;
pub mod check_config;
pub mod doctor;
pub mod local_plan;
pub mod locks;
pub mod report;
pub mod serve;
