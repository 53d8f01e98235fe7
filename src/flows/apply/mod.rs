//! The apply gate (docs/workflow.md, "Apply from main"): a manual CI job on protected `main`
//! asks planbot to apply; planbot applies a root only if its fresh plan is the plan reviewed on
//! the MR. Its rooms, each using only those below it (tests/it/architecture.rs):
//!
//! - [`endpoint`]: `POST /api/v1/apply`, streaming the job's log;
//! - [`job`]: one request to its verdict, the stages in order —
//!   1. [`verify::verify_job`]: who the job is (GitLab `GET /job`), checked against the gate;
//!   2. [`verify::find_reviewed_mr`]: the merged MR that landed the commit;
//!   3. the checkout and the repo config at that commit, the policy gate ([`policy`]), the
//!      apply recorded once per CI job;
//!   4. [`parity::plan_and_decide`]: every root planned again with the apply credentials,
//!      upstream roots first (`depends_on`), and decided;
//!   5. [`run::apply_all`]: the checked plans applied upstream roots first; a root whose
//!      upstream applied is planned again and decided again ([`order::replan`]); a failure
//!      stops the roots below it, not the others;
//!   6. [`report::report`]: store, MR note, commit status, failure issue;
//! - [`decide`]: the one decision of a root's plan (applied, nothing to apply, refused,
//!   failed), which stages 4 and 5 both ask; on [`plan`] (the engine's plan), [`judge`] (the
//!   policy sets, the preflight) and [`shown`] (what a refused plan shows);
//! - [`ctx`]: what every stage works with ([`ctx::ApplyCtx`]);
//! - [`log`], the bottom: the job's log ([`JobLog`]), its last line ([`Verdict`]; always
//!   `planbot: apply succeeded` / `refused: ...` / `failed: ...`), the texts, the failures.

mod ctx;
mod decide;
mod endpoint;
mod job;
mod judge;
mod log;
mod order;
mod parity;
mod plan;
mod policy;
mod rails;
mod report;
mod retire;
mod run;
mod shown;
mod verify;

pub use decide::plan_has_changes;
pub use endpoint::{handler, KEEPALIVE_EVERY};
pub use job::{run, ApplyBody};
pub use log::{JobLog, JobLogLines, Verdict, JOB_LOG_PENDING_MAX};
pub use report::report_interrupted;
#[cfg(debug_assertions)]
#[doc(hidden)]
pub use run::PANIC_WHILE_APPLYING_JOB;

/// The CI/CD component with the manual `planbot-apply` job (served at `/ci/planbot.gitlab-ci.yml`).
pub const CI_TEMPLATE: &str = crate::core::templates::APPLY_CI;
