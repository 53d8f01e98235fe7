//! The plan flow for one MR head (design §1): workspace, roots, engine, note, statuses, fingerprints.
//!
//! INITIAL BODY (service helper): it only records that the job ran, so the queue can be tested
//! end to end. The gitlab helper replaces the body; the signature is the queue's contract.

use crate::capabilities::store::{NewRun, RunEnd, RunKind, RunState};
use crate::core::events::PlanJob;
use crate::flows::app::App;
use crate::flows::queue::CancellationToken;
use anyhow::Result;

/// Plan `job` (one MR at one head commit). Must stop promptly (killing the engine) when
/// `cancel` fires: a newer head superseded this one, or the MR was closed.
///
/// What the full body must do, in order:
/// 1. set commit status `planbot/plan` = `pending`, then `running` (GitLab client);
/// 2. fetch the repo into a worktree of `job.head` (or the merge ref, `.planbot.toml` `[plan] checkout`),
///    read `.planbot.toml` from the DEFAULT branch, pick the roots touched by the changed files;
/// 3. per root: hold `app.root_locks.lock(job.project, root)`, `app.store.start_run(NewRun{..})`,
///    run the engine in a private dir under `app.temp_root()`, scrub everything with a scrubber
///    built from `app.config.secrets()` + `Secrets::from_plan`, `app.store.finish_run(run, RunEnd{..})`;
/// 4. render one note, upsert it by its marker (note id cached via `app.store.mr_note`/`set_mr_note`),
///    then `app.store.record_fingerprint(..)` per planned root (only once the note is posted);
/// 5. final status `success`/`failed`; count GitLab errors with `app.metrics.gitlab_error(op)`.
pub async fn run(app: &App, job: &PlanJob, cancel: &CancellationToken) -> Result<()> {
    let run = app
        .store
        .start_run(NewRun {
            job: None,
            kind: RunKind::Plan,
            project: job.project,
            project_path: job.project_path.clone(),
            mr: Some(job.mr),
            root: ".".into(),
            sha: job.head.clone(),
        })
        .await?;
    let (state, summary) = if cancel.is_cancelled() {
        (RunState::Canceled, "superseded before it started")
    } else {
        (
            RunState::Failed,
            "planning is not wired into the service yet",
        )
    };
    app.store
        .finish_run(
            run,
            RunEnd {
                state,
                summary: Some(summary.into()),
                log: String::new(),
                note_markdown: None,
                fingerprint: None,
            },
        )
        .await?;
    anyhow::bail!("{summary}")
}
