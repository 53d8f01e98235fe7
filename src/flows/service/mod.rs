//! The long-running service: shared state, HTTP routes, webhook intake, the job queue and its workers.
//! Also the root locks, metrics, the run pages and who may read them.
pub mod app;
pub mod application;
pub mod cpu;
pub mod intake;
pub mod locks;
pub mod metrics;
pub mod pages;
pub mod queue;
pub mod session;
pub mod signin;
pub mod worker;
