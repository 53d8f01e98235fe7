//! The queue's non-plan jobs: merged, closed, comment commands, fork notices, start-up reconciliation.

use crate::core::events::Job;
use crate::flows::app::App;
use crate::flows::queue::CancellationToken;
use anyhow::{Context, Result};

/// Run one non-plan job.
pub async fn run(app: &App, job: &Job, cancel: &CancellationToken) -> Result<()> {
    let _ = cancel;
    match job {
        Job::Closed { project, mr } => {
            // Queued and running work was cancelled when this job was enqueued (same transaction).
            let dir = app
                .workspaces_dir()
                .join(project.to_string())
                .join(format!("mr-{mr}"));
            if dir.exists() {
                tokio::fs::remove_dir_all(&dir)
                    .await
                    .with_context(|| format!("removing the workspace {}", dir.display()))?;
            }
            tracing::info!(
                project = project.0,
                mr = mr.0,
                "merge request closed: queued work dropped, workspace removed"
            );
            Ok(())
        }
        Job::Plan(_) => unreachable!("plan jobs go to flows::plan"),
        other => anyhow::bail!(
            "`{}` jobs need the GitLab client, which is not in this build yet",
            other.kind()
        ),
    }
}
