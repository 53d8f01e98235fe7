//! Flows: orchestration of capabilities, grouped by what a reader looks for.
//! From the top: `cli` (one-shot commands) and `service` (the server) → `review` (plans MRs), `apply` (gates applies), `drift` → `context` (the state they share) and `preflight` (the Proxmox API read for the checks) → `confinement` (what an engine run may see).
pub mod apply;
pub mod cli;
pub mod confinement;
pub mod context;
pub mod drift;
pub mod preflight;
pub mod review;
pub mod service;
