//! Stage 3 of a plan run: render the ONE plan note from every root's result (scrubbed of every
//! known secret, the plans' own included) and create or edit it on the MR.

use super::prepare::Prepared;
use super::roots::{Outcome, RootResult, RootsPlanned};
use super::shared::upsert_note;
use crate::capabilities::store::PolicyApproval;
use crate::core::engine_checks::RootChecks;
use crate::core::events::PlanJob;
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::CommitSha;
use crate::core::policy::review::{PolicySection, RecordedVerdict};
use crate::core::redact::{Scrubber, Secrets};
use crate::core::render::{render_note, NoteContext, RootOutcome, RootSection};
use crate::core::retire::RetiredBecause;
use crate::flows::confinement::credentials::Trust;
use crate::flows::confinement::network;
use crate::flows::context::app_state::App;
use crate::flows::context::cpu::cpu_bound;
use crate::flows::context::policy_sets::PolicySets;
use crate::flows::review::policies;
use anyhow::Result;
use std::collections::BTreeMap;
use std::time::Duration;

/// The note as posted, with what the later stages take from it.
pub(super) struct Posted {
    pub body: String,
    /// Every known secret, the plans' own included.
    pub scrubber: Scrubber,
    /// Each cleanly planned root's policy verdict ([`policy_verdicts`]).
    pub policies: Vec<(String, Fingerprint, RecordedVerdict)>,
    /// The MR's approvals of failing policy sets (read only when a set checks a plan).
    pub approvals: Vec<PolicyApproval>,
    /// The first root's run page.
    pub run_url: Option<String>,
}

impl Posted {
    /// The policy verdict recorded for `root`'s plan (no set in it when none checks the root).
    pub fn verdict_of(&self, root: &str) -> RecordedVerdict {
        self.policies
            .iter()
            .find(|(r, _, _)| r == root)
            .map(|(_, _, v)| v.clone())
            .unwrap_or_default()
    }
}

/// Stage 3: the ONE note of every root's result, `took` after the run started, posted.
pub(super) async fn post(
    app: &App,
    job: &PlanJob,
    prepared: &Prepared,
    planned: &RootsPlanned,
    took: Duration,
) -> Result<Posted> {
    // One scrubber over every known secret, the plans' included.
    let secrets = secrets_of(app.config.secrets(), &planned.results);
    let scrubber = cpu_bound(|| secrets.scrubber());
    let first_run = planned.results.iter().find_map(|r| match &r.outcome {
        Outcome::Planned { run, .. } | Outcome::Failed { run, .. } => Some(*run),
        Outcome::Skipped { .. } => None,
    });
    let run_url = first_run.and_then(|r| app.run_url(r));
    // The reached roots upstream first, with the arrows of their picture.
    let (reach, root_edges) =
        crate::core::reach::in_order(&prepared.config.graph(), planned.reach.clone());
    let policies = policy_verdicts(&prepared.policies, &planned.results, &scrubber);
    let approvals = if policies.iter().any(|(_, _, v)| !v.sets.is_empty()) {
        app.store.policy_approvals(job.project, job.mr).await?
    } else {
        Vec::new()
    };
    let ctx = NoteContext {
        sha: Some(prepared.commit.sha.as_str().to_string()),
        draft: prepared.mr.draft,
        engine: prepared.version.clone(),
        duration: Some(took),
        run_url: run_url.clone(),
        run_hint: first_run.and_then(|r| app.run_hint(r)),
        banners: retired_banners(app, prepared, &planned.results, &scrubber)
            .into_iter()
            .chain(targeted_banners(&planned.results, &scrubber))
            .chain(prepared.banners.iter().cloned())
            .collect(),
        preflight_note: Some(planned.preflight_notes.join(" · ")).filter(|n| !n.is_empty()),
        capacity: planned.capacity.clone(),
        reach,
        root_edges,
        depends_hints: planned.depends_hints.clone(),
        in_no_root: planned.in_no_root.clone(),
        fmt_outside: planned.fmt_outside.clone(),
        hints: sandbox_hints(app, &planned.results),
        planned_before: planned_before(&prepared.config, &planned.results),
        reused: planned
            .results
            .iter()
            .filter_map(|r| match &r.outcome {
                Outcome::Planned {
                    reused: Some(head), ..
                } => Some((r.name.clone(), head.short().to_string())),
                _ => None,
            })
            .collect(),
        invalid_file: prepared
            .proposed_invalid
            .as_ref()
            .map(|_| crate::core::repo_config::FILE_NAME.to_string()),
        policies: policy_sections(&policies, &job.head, &approvals, &prepared.policies),
        waits: planned.waits.clone(),
        ..NoteContext::default()
    };
    let body = compose_note(ctx, &planned.results, &scrubber);
    upsert_note(app, job.project, job.mr, &body).await?;
    Ok(Posted {
        body,
        scrubber,
        policies,
        approvals,
        run_url,
    })
}

/// The secrets of the note and the stored logs: every configured secret plus every value the
/// plans marked sensitive (a kept plan's as digests).
fn secrets_of(configured: Vec<String>, results: &[RootResult]) -> Secrets {
    let mut secrets = Secrets::new();
    secrets.extend(configured);
    for r in results {
        if let Outcome::Planned { planned, .. } = &r.outcome {
            secrets.merge(planned.secrets());
        }
    }
    secrets
}

/// The line above the headline for each root the MR retires: why, from which code its destroy
/// was planned, how many resources it destroys (listed in its section), and what the apply
/// does after the merge.
fn retired_banners(
    app: &App,
    prepared: &Prepared,
    results: &[RootResult],
    scrubber: &Scrubber,
) -> Vec<String> {
    let Some((from, _)) = &prepared.retired_from else {
        return Vec::new();
    };
    results
        .iter()
        .filter_map(|r| Some((r, r.retired?, prepared.retirements.retired(&r.name)?)))
        .map(|(r, because, retired)| {
            let destroys = match &r.outcome {
                Outcome::Planned { planned, .. } if !planned.plan().errored => {
                    Some(crate::core::summary::Summary::of(planned.plan()).destroy)
                }
                _ => None,
            };
            let state =
                crate::core::state::gitlab_state_name(&retired.root, app.config.state.default);
            let (because, entry_kept) = match because {
                RetiredBecause::EntryRemoved => ("entry", false),
                RetiredBecause::DirectoryGone { entry_kept } => ("directory", entry_kept),
            };
            super::shared::text(
                scrubber,
                "retired",
                minijinja::context! {
                    root => &r.name, dir => &retired.root.dir, because, entry_kept,
                    target => &prepared.mr.target_branch, sha => from.short(),
                    destroys, state,
                },
            )
        })
        .collect()
}

/// The line above the headline for each root planned with a comment's flags (`-target`,
/// `-exclude`, `-replace`): a targeted plan never reads as the full plan. The root is named
/// when the repo config has several.
fn targeted_banners(results: &[RootResult], scrubber: &Scrubber) -> Vec<String> {
    let several = results.len() > 1;
    results
        .iter()
        .filter(|r| r.retired.is_none() && !r.targeting.is_empty())
        .filter(|r| !matches!(r.outcome, Outcome::Skipped { .. }))
        .map(|r| {
            crate::core::templates::scrubbing(scrubber, || {
                r.targeting.banner(several.then_some(r.name.as_str()))
            })
        })
        .collect()
}

/// For each root that failed because the engine's sandbox refused a connection or a file, the
/// explanation with the setting that allows it (`network::explain`), also logged for the
/// operator.
fn sandbox_hints(app: &App, results: &[RootResult]) -> BTreeMap<String, String> {
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
fn planned_before(
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
fn policy_verdicts(
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
fn policy_sections(
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
fn compose_note(mut ctx: NoteContext, results: &[RootResult], scrubber: &Scrubber) -> String {
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
