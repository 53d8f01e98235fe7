//! Flows: orchestration of capabilities, grouped by what a reader looks for.
//! `service` runs the server, `review` plans MRs, `apply` gates applies, `cli` holds one-shot commands, `confinement` decides what an engine run may see.
pub mod apply;
pub mod cli;
pub mod confinement;
pub mod drift;
pub mod review;
pub mod service;
