//! Stage 3 of a plan run: render the ONE plan note from every root's result (scrubbed of every
//! known secret, the plans' own included) and create or edit it on the MR.

use super::gl;
use super::roots::{Outcome, RootResult};
use crate::capabilities::gitlab::GitLabError;
use crate::capabilities::store::PolicyApproval;
use crate::core::engine_checks::RootChecks;
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, NoteId, ProjectId};
use crate::core::policy::review::{PolicySection, RecordedVerdict};
use crate::core::redact::{Scrubber, Secrets};
use crate::core::render::{render_note, NoteContext, RootOutcome, RootSection, NOTE_MARKER};
use crate::flows::confinement::credentials::Trust;
use crate::flows::confinement::network;
use crate::flows::context::app_state::App;
use crate::flows::context::cpu::cpu_bound;
use crate::flows::context::policy_sets::PolicySets;
use crate::flows::review::policies;
use anyhow::Result;
use std::collections::BTreeMap;

/// The scrubber for the note and the stored logs: every configured secret plus every value the
/// plans marked sensitive.
pub(super) fn scrubber_for(configured: Vec<String>, results: &[RootResult]) -> Scrubber {
    let mut secrets = Secrets::new();
    secrets.extend(configured);
    for r in results {
        if let Outcome::Planned { planned, .. } = &r.outcome {
            secrets.extend(planned.secrets().iter().map(str::to_string));
        }
    }
    cpu_bound(|| secrets.scrubber())
}

/// For each root that failed because the engine's sandbox refused a connection or a file, the
/// explanation with the setting that allows it (`network::explain`), also logged for the
/// operator.
pub(super) fn sandbox_hints(app: &App, results: &[RootResult]) -> BTreeMap<String, String> {
    let mut hints = BTreeMap::new();
    for r in results {
        let output = match &r.outcome {
            Outcome::Failed { error, .. } => error.as_str(),
            Outcome::Planned { planned, .. } if planned.plan().errored => planned.log(),
            _ => continue,
        };
        if let Some(hint) = network::explain(&app.config, Trust::MergeRequest, output) {
            tracing::warn!(root = %r.name, explanation = %hint, "the engine's sandbox refused what a plan needed");
            hints.insert(r.name.clone(), hint);
        }
    }
    hints
}

/// Each root planned in this MR below a root (`depends_on`) whose plan here changes something:
/// those roots and their output changes, for the note's mark.
pub(super) fn planned_before(
    config: &crate::core::repo_config::RepoConfig,
    results: &[RootResult],
) -> BTreeMap<String, Vec<crate::core::render::planned_before::PlannedBefore>> {
    let plans: BTreeMap<&str, &crate::core::plan::Plan> = results
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Planned { planned, .. } if !planned.plan().errored => {
                Some((r.name.as_str(), planned.plan()))
            }
            _ => None,
        })
        .collect();
    crate::core::render::planned_before::planned_before(&config.graph(), &plans)
}

/// Each cleanly planned root's policy verdict as recorded (scrubbed with `scrubber`), with
/// its plan's fingerprint: `(root, fingerprint, verdict)`, no set in it when none checks the
/// root.
pub(super) fn policy_verdicts(
    sets: &PolicySets,
    results: &[RootResult],
    scrubber: &Scrubber,
) -> Vec<(String, Fingerprint, RecordedVerdict)> {
    results
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Planned {
                fingerprint,
                policy: Some(verdict),
                ..
            } => Some((
                r.name.clone(),
                fingerprint.clone(),
                sets.record(&r.name, verdict, scrubber),
            )),
            _ => None,
        })
        .collect()
}

/// The "Policies" section of each root some set checks, with the approvals of the MR.
pub(super) fn policy_sections(
    verdicts: &[(String, Fingerprint, RecordedVerdict)],
    head: &CommitSha,
    approvals: &[PolicyApproval],
    sets: &PolicySets,
) -> BTreeMap<String, PolicySection> {
    verdicts
        .iter()
        .filter(|(_, _, v)| !v.sets.is_empty())
        .map(|(root, fingerprint, v)| {
            (
                root.clone(),
                policies::section(v, root, head, fingerprint, approvals, &sets.branch),
            )
        })
        .collect()
}

/// The note's Markdown for these results; `ctx` carries the header (commit, engine, banners,
/// run link); the errored plans' logs are added to it here, scrubbed.
pub(super) fn compose_note(
    mut ctx: NoteContext,
    results: &[RootResult],
    scrubber: &Scrubber,
) -> String {
    for r in results {
        if let Outcome::Planned { planned, .. } = &r.outcome {
            if planned.plan().errored {
                ctx.plan_errors
                    .insert(r.name.clone(), scrubber.scrub(planned.log()).into_owned());
            }
        }
        if let Some(checks) = root_checks(r) {
            ctx.checks.insert(r.name.clone(), checks.clone());
        }
    }
    let sections: Vec<RootSection<'_>> = results
        .iter()
        .map(|r| RootSection {
            name: r.name.clone(),
            outcome: match &r.outcome {
                Outcome::Planned {
                    planned,
                    findings,
                    fingerprint,
                    ..
                } => RootOutcome::Planned {
                    plan: planned.plan(),
                    findings,
                    fingerprint,
                },
                Outcome::Failed { error, .. } => RootOutcome::Failed {
                    error: error.clone(),
                },
                Outcome::Skipped { reason } => RootOutcome::Skipped {
                    reason: reason.clone(),
                },
            },
        })
        .collect();
    cpu_bound(|| render_note(&ctx, &sections, scrubber))
}

/// What the engine's checks said of a planned or failed root.
pub(super) fn root_checks(r: &RootResult) -> Option<&RootChecks> {
    match &r.outcome {
        Outcome::Planned { checks, .. } | Outcome::Failed { checks, .. } => Some(checks),
        Outcome::Skipped { .. } => None,
    }
}

/// Create the ONE note once, then edit it: by the stored id, else found again by its marker
/// (the stored id was lost), else re-created (a user deleted it).
pub async fn upsert_note(app: &App, project: ProjectId, mr: MrIid, body: &str) -> Result<NoteId> {
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
    let id = match ours {
        Some(n) => match app.gitlab.edit_mr_note(project, mr, n.id, body).await {
            Ok(n) => n.id,
            Err(GitLabError::NotFound) => {
                gl(
                    app,
                    "create_mr_note",
                    app.gitlab.create_mr_note(project, mr, body).await,
                )?
                .id
            }
            Err(e) => return gl(app, "edit_mr_note", Err(e)),
        },
        None => {
            gl(
                app,
                "create_mr_note",
                app.gitlab.create_mr_note(project, mr, body).await,
            )?
            .id
        }
    };
    app.store.set_mr_note(project, mr, id).await?;
    Ok(id)
}
