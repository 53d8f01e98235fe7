//! The long-running service, the top floor: it builds the application, accepts connections (bounded), takes webhooks in, serves
//! the run pages and sign-in, and its workers hand each queued job to review or apply.
pub mod connections;
pub mod intake;
pub mod pages;
pub mod server;
pub mod signin;
pub mod worker;
