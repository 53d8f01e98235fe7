//! Flows: orchestration of capabilities (commands, intake, queue, plan, apply).
pub mod app;
pub mod apply_job;
pub mod check_config;
pub mod doctor;
pub mod intake;
pub mod jobs;
pub mod local_plan;
pub mod locks;
pub mod metrics;
pub mod pages;
pub mod plan;
pub mod preflight;
pub mod queue;
pub mod report;
pub mod serve;
pub mod server;
