//! One-shot commands of the `planbot` binary: `serve`, `render`, `plan`, `check-repo-config`,
//! `doctor`, `drift` (one drift check now), `apply-job` (the CI side of the manual apply), `store migrate`, `policy test` and `preflight` (the Proxmox preflight over a plan).
pub mod apply_job;
pub mod check_repo_config;
pub mod doctor;
pub mod drift;
pub mod plan;
pub mod policy;
pub mod preflight;
pub mod render;
pub mod serve;
pub mod serve_check;
pub mod store_migrate;
