//! What every room of the review calls GitLab through: a call's error counted in the metrics
//! and named ([`gl`]), and a commit status set, a refusal counted and logged, never the end of
//! the flow ([`set_commit_status`]).

use crate::capabilities::gitlab::{CommitStatus, GitLabError};
use crate::core::ids::{CommitSha, ProjectId};
use crate::flows::context::app_state::App;
use anyhow::Result;

/// A GitLab call's result, its error counted under `op` and named in the context.
pub(crate) fn gl<T>(app: &App, op: &str, r: Result<T, GitLabError>) -> Result<T> {
    r.map_err(|e| {
        app.metrics.gitlab_error(op);
        anyhow::Error::new(e).context(op.to_string())
    })
}

/// Set `status` on `sha`; a refusal is counted and logged (`what`: which status it was).
pub(crate) async fn set_commit_status(
    app: &App,
    project: ProjectId,
    sha: &CommitSha,
    status: &CommitStatus,
    what: &str,
) {
    if let Err(e) = app.gitlab.set_commit_status(project, sha, status).await {
        app.metrics.gitlab_error("set_commit_status");
        tracing::warn!(project = project.0, sha = %sha.short(), error = %e, "could not set the {what}");
    }
}
