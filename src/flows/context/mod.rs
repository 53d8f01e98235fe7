//! What review, apply and the service all stand on: the shared application state (`App`), the
//! root locks, the engine slots and each author's share of them, the CPU pool, the job queue, the metrics, the pages' sign-in sessions, the
//! policy sets (loaded and evaluated for a review and for an apply) and the bounded read of
//! request bodies, the per-minute limits a flood of comments or wrong job tokens meets, and
//! what the root units of one plan job share on a replica.
pub mod app_state;
pub mod by_job;
pub mod cpu;
pub mod engine_slots;
pub mod limits;
pub mod locks;
pub mod metrics;
pub mod plan_reuse;
pub mod policy_sets;
pub mod queue;
pub mod request_body;
pub mod session;
