//! What the stages of a plan run share, below them all: a line of the plan's texts
//! (`templates/plan_status.txt.j2`), the `planbot/plan` status, the ONE note upserted by its
//! marker, and a run's end.

use crate::capabilities::gitlab::{CommitStatus, GitLabError, StatusState};
use crate::capabilities::store::{RunEnd, RunState};
use crate::core::events::PlanJob;
use crate::core::ids::{MrIid, NoteId, ProjectId, RunId};
use crate::core::redact::Scrubber;
use crate::core::render::NOTE_MARKER;
use crate::flows::context::app_state::App;
use crate::flows::review::gitlab_calls::{gl, set_commit_status};
use anyhow::Result;

/// One line of the plan flow (`kind` selects it in `templates/plan_status.txt.j2`): its values
/// scrubbed with `scrubber`, its words as written (no secret alters a status description).
pub(super) fn text(scrubber: &Scrubber, kind: &str, ctx: minijinja::Value) -> String {
    let ctx = minijinja::context! { kind => kind, ..ctx };
    crate::core::templates::scrubbing(scrubber, || {
        crate::core::templates::render("plan_status.txt.j2", ctx)
            .map(|t| t.trim().to_string())
            .unwrap_or_else(|e| format!("planbot: {kind} ({e})"))
    })
}

/// `planbot/plan` on `job`'s head; a GitLab refusal is counted and logged, never the run's end.
pub(super) async fn set_status(
    app: &App,
    job: &PlanJob,
    state: StatusState,
    description: &str,
    target_url: Option<String>,
    ref_: Option<String>,
) {
    // Planbot's text, its values scrubbed when it was rendered ([`text`]).
    let status = CommitStatus {
        state,
        name: crate::core::commit_status::PLAN.into(),
        description: Some(description.to_string()),
        target_url,
        ref_,
        pipeline_id: None,
    };
    set_commit_status(app, job.project, &job.head, &status, "commit status").await;
}

/// End a run (scrubbed); returns what was recorded, so it can be recorded again with the note.
pub(super) async fn finish(
    app: &App,
    run: RunId,
    state: RunState,
    summary: &str,
    log: &str,
    note: Option<String>,
) -> Result<RunEnd> {
    let end = RunEnd {
        state,
        summary: Some(app.scrubber.scrub(summary).into_owned()),
        log: app.scrubber.scrub(log).into_owned(),
        note_markdown: note,
        fingerprint: None,
    };
    app.store.finish_run(run, end.clone()).await?;
    Ok(end)
}

/// Create the ONE note once, then edit it: by the stored id, else found again by its marker
/// (the stored id was lost), else re-created (a user deleted it).
pub(super) async fn upsert_note(
    app: &App,
    project: ProjectId,
    mr: MrIid,
    body: &str,
) -> Result<NoteId> {
    if let Some(id) = app.store.mr_note(project, mr).await? {
        match app.gitlab.edit_mr_note(project, mr, id, body).await {
            Ok(n) => return Ok(n.id),
            Err(GitLabError::NotFound) => {
                tracing::info!(
                    project = project.0,
                    mr = mr.0,
                    "the plan note was deleted: posting it again"
                );
            }
            Err(e) => return gl(app, "edit_mr_note", Err(e)),
        }
    }
    // Only a note the bot user wrote is planbot's: anyone can write the marker in a comment.
    let bot = app.bot_user().await?;
    let notes = gl(app, "mr_notes", app.gitlab.mr_notes(project, mr).await)?;
    let ours = notes.iter().rev().find(|n| {
        n.body.starts_with(NOTE_MARKER) && n.author.as_ref().is_some_and(|a| a.id == bot)
    });
    let edited = match ours {
        Some(n) => match app.gitlab.edit_mr_note(project, mr, n.id, body).await {
            Ok(n) => Some(n.id),
            Err(GitLabError::NotFound) => None,
            Err(e) => return gl(app, "edit_mr_note", Err(e)),
        },
        None => None,
    };
    let id = match edited {
        Some(id) => id,
        None => {
            let created = app.gitlab.create_mr_note(project, mr, body).await;
            gl(app, "create_mr_note", created)?.id
        }
    };
    app.store.set_mr_note(project, mr, id).await?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::engine_checks::TestsStatus;
    use minijinja::context;

    #[test]
    fn status_and_commit_texts_come_from_the_template() {
        let none = Scrubber::none();
        let all = [
            text(&none, "queued", context! {}),
            text(&none, "planning", context! { roots => "" }),
            text(&none, "superseded", context! {}),
            text(&none, "closed", context! {}),
            text(&none, "no_root", context! {}),
            text(&none, "no_root", context! { in_no_root => 2 }),
            text(
                &none,
                "error",
                context! { error => "fetching the repository: git fetch failed" },
            ),
            text(&none, "past_deadline", context! { limit => "2h" }),
            text(
                &none,
                "invalid_config",
                context! { file => ".planbot.toml", branch => "main", problem => "line 3, column 1: key `roots[0].directory`: unknown key" },
            ),
            text(
                &none,
                "invalid_proposed",
                context! { file => ".planbot.toml", problem => "line 6, column 1: key `roots[0].when_modifed`: unknown key `when_modifed`", more => 2 },
            ),
            text(
                &none,
                "result",
                context! { roots => vec![
                    context! { name => "core", state => "planned", summary => "1 to add, 0 to change, 0 to destroy", targeted => "1 excluded" },
                    context! { name => "edge", state => "planned", summary => "no changes", targeted => "" },
                ] },
            ),
            text(
                &none,
                "result",
                context! { roots => vec![
                    context! { name => "vms", state => "planned", summary => "1 to add, 0 to change, 0 to destroy", targeted => "" },
                ], in_no_root => 1 },
            ),
            text(
                &none,
                "result",
                context! { roots => vec![
                    context! { name => "core", state => "planned", summary => "1 to add, 0 to change, 0 to destroy" },
                    context! { name => "dns", state => "failed" },
                    context! { name => "edge", state => "errored" },
                ] },
            ),
            text(
                &none,
                "tests",
                context! { t => TestsStatus { ok: true, roots: 2, passed: 7, skipped: 1, ..TestsStatus::default() } },
            ),
            text(
                &none,
                "tests",
                context! { t => TestsStatus { ok: false, roots: 1, passed: 1, failed: 1, failing: vec!["core".into()], not_run: vec!["dns".into()], ..TestsStatus::default() } },
            ),
            text(
                &none,
                "tests",
                context! { t => TestsStatus { ok: false, not_run: vec!["dns".into()], ..TestsStatus::default() } },
            ),
            text(
                &none,
                "commit_line",
                context! { planned => "merge", sha => "5717fb1e", head => "e4cd905a", target => "main", reason => None::<String> },
            ),
            text(
                &none,
                "commit_line",
                context! { planned => "head", sha => "e4cd905a", head => "e4cd905a", target => "main", reason => "the MR has conflicts, or GitLab has not computed its merge result yet" },
            ),
            text(
                &none,
                "commit_line",
                context! { planned => "head", sha => "e4cd905a", head => "e4cd905a", target => "main", reason => None::<String> },
            ),
        ];
        for t in &all {
            assert!(!t.is_empty() && !t.contains('\n'), "one line each: {t:?}");
            assert!(t.chars().count() <= 255 || t.starts_with('_'), "{t}");
        }
        insta::assert_snapshot!("plan_status_texts", all.join("\n"));
    }
}
