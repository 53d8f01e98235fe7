//! The plan flow for one MR head (design §1): workspace, roots, engine, note, statuses, fingerprints.
//!
//! Order: status `planbot/plan` pending → running; mirror fetch; `.planbot.toml` from the DEFAULT
//! branch (invalid ⇒ a note saying what is wrong, status failed); the commit to plan (GitLab's
//! merge result or the head, said in the note); changed files against the merge base ⇒ affected
//! roots; per root (serialized with other plans/applies of it): engine plan in a private dir,
//! lint, a stored run; ONE note upserted by its marker; fingerprints stored once the note is up;
//! final status success/failed with a one-line description and the run page as target.

use crate::capabilities::engine::{CancelHandle, EngineError, PlanRequest, PlannedRun};
use crate::capabilities::gitlab::{CommitStatus, GitLabError, MergeRequest, StatusState};
use crate::capabilities::store::{NewRun, RunEnd, RunKind, RunState, ShownFingerprint};
use crate::capabilities::workspace::PlannedRef;
use crate::core::events::PlanJob;
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, NoteId, ProjectId, RunId};
use crate::core::lint::{self, Finding};
use crate::core::plan_digest::PlanDigest;
use crate::core::redact::Scrubber;
use crate::core::render::{render_note, NoteContext, RootOutcome, RootSection, NOTE_MARKER};
use crate::core::repo_config::{self, CheckoutMode, RepoConfig, RepoConfigError};
use crate::core::summary::Summary;
use crate::flows::app::App;
use crate::flows::app::Trust;
use crate::flows::cpu::cpu_bound;
use crate::flows::queue::CancellationToken;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Instant;

/// The commit status planbot sets for plans.
pub const STATUS_NAME: &str = "planbot/plan";

/// One line of the plan flow (`kind` selects it in `templates/plan_status.txt.j2`).
fn text(kind: &str, ctx: minijinja::Value) -> String {
    let ctx = minijinja::context! { kind => kind, ..ctx };
    crate::core::templates::render("plan_status.txt.j2", ctx)
        .map(|t| t.trim().to_string())
        .unwrap_or_else(|e| format!("planbot: {kind} ({e})"))
}

/// One root's result, kept until the note is rendered.
enum Outcome {
    Planned {
        run: RunId,
        planned: Box<PlannedRun>,
        findings: Vec<Finding>,
        fingerprint: Fingerprint,
    },
    Failed {
        run: RunId,
        error: String,
    },
    Skipped {
        reason: String,
    },
}

struct RootResult {
    name: String,
    outcome: Outcome,
}

/// Plan `job` (one MR at one head commit). Stops promptly (killing the engine) when `cancel`
/// fires: a newer head superseded this one, or the MR was closed.
pub async fn run(app: &App, job: &PlanJob, cancel: &CancellationToken) -> Result<()> {
    let started = Instant::now();
    let mut runs: Vec<RunId> = Vec::new();
    let result = plan(app, job, cancel, &mut runs).await;
    let outcome = match &result {
        Ok(o) => *o,
        Err(_) => "error",
    };
    app.metrics.plan_finished(started.elapsed(), outcome);
    if let Err(e) = &result {
        // Whatever broke, the MR must not keep a `running` status forever.
        let error = app.scrubber.scrub(&format!("{e:#}")).into_owned();
        if runs.is_empty() {
            // Before any root ran: one failed run for the MR head, so the run pages show why.
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
                .await;
            if let Ok(run) = run {
                let _ = finish(app, run, RunState::Failed, &error, "", None).await;
            }
        }
        set_status(
            app,
            job.project,
            &job.head,
            StatusState::Failed,
            &text("error", minijinja::context! { error => error }),
            None,
            None,
        )
        .await;
    }
    result.map(|_| ())
}

fn gl<T>(app: &App, op: &str, r: Result<T, GitLabError>) -> Result<T> {
    r.map_err(|e| {
        app.metrics.gitlab_error(op);
        anyhow::Error::new(e).context(op.to_string())
    })
}

async fn set_status(
    app: &App,
    project: ProjectId,
    sha: &CommitSha,
    state: StatusState,
    description: &str,
    target_url: Option<String>,
    ref_: Option<String>,
) {
    let status = CommitStatus {
        state,
        name: STATUS_NAME.into(),
        description: Some(app.scrubber.scrub(description).into_owned()),
        target_url,
        ref_,
        pipeline_id: None,
    };
    if let Err(e) = app.gitlab.set_commit_status(project, sha, &status).await {
        app.metrics.gitlab_error("set_commit_status");
        tracing::warn!(project = project.0, sha = %sha.short(), error = %e, "could not set the commit status");
    }
}

/// The whole flow; returns the outcome label for the metrics.
async fn plan(
    app: &App,
    job: &PlanJob,
    cancel: &CancellationToken,
    runs: &mut Vec<RunId>,
) -> Result<&'static str> {
    let started = Instant::now();
    let project = job.project;
    let iid = job.mr;
    let mr: MergeRequest = gl(
        app,
        "merge_request",
        app.gitlab.merge_request(project, iid).await,
    )?;
    if mr.state != "opened" {
        tracing::info!(project = project.0, mr = iid.0, state = %mr.state, "not planning: the MR is not open");
        return Ok("skipped");
    }
    if mr.sha.as_ref().is_some_and(|s| s != &job.head) {
        tracing::info!(
            project = project.0,
            mr = iid.0,
            "not planning: the MR has a newer head"
        );
        return Ok("superseded");
    }
    let status_ref = Some(mr.source_branch.clone()).filter(|s| !s.is_empty());
    let head = job.head.clone();
    set_status(
        app,
        project,
        &head,
        StatusState::Pending,
        &text("queued", minijinja::context! {}),
        None,
        status_ref.clone(),
    )
    .await;

    let info = gl(
        app,
        "project",
        app.gitlab.project(&project.to_string()).await,
    )?;
    let default_branch = info.default_branch.clone().unwrap_or_else(|| "main".into());
    let target = job
        .target_branch
        .clone()
        .or_else(|| Some(mr.target_branch.clone()).filter(|t| !t.is_empty()))
        .unwrap_or_else(|| default_branch.clone());

    // The shared workspace: its per-project lock keeps concurrent plans from racing on the mirror.
    let ws = &app.workspace;
    ws.sync(project, &info.http_url_to_repo)
        .await
        .context("fetching the repository")?;
    set_status(
        app,
        project,
        &head,
        StatusState::Running,
        &text("planning", minijinja::context! { roots => "" }),
        None,
        status_ref.clone(),
    )
    .await;

    // The repo config comes from the default branch only.
    let config_text = ws
        .read_file_at(
            project,
            &format!("refs/heads/{default_branch}"),
            repo_config::FILE_NAME,
        )
        .await?
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    let cfg = match RepoConfig::from_optional(config_text.as_deref()) {
        Ok(c) => c,
        Err(err) => return invalid_config(app, job, &default_branch, &err, status_ref).await,
    };

    let commit = ws
        .mr_commit(
            project,
            iid,
            &head,
            &target,
            cfg.plan.checkout == CheckoutMode::Merge,
        )
        .await?;
    let base = ws
        .branch_head(project, &target)
        .await?
        .with_context(|| format!("the target branch `{target}` does not exist"))?;
    let changed = ws.changed_files(project, &base, &head).await?;

    let mut banners = vec![text(
        "commit_line",
        minijinja::context! {
            planned => if commit.planned == PlannedRef::Merge { "merge" } else { "head" },
            sha => commit.sha.short(),
            head => commit.head.short(),
            target => &target,
            reason => &commit.reason,
        },
    )];
    if changed.iter().any(|f| f == repo_config::FILE_NAME) {
        let proposed = ws
            .read_file_at(project, head.as_str(), repo_config::FILE_NAME)
            .await?
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let preview: Result<RepoConfig, RepoConfigError> = match proposed {
            Some(t) => RepoConfig::parse(&t),
            None => Ok(RepoConfig::absent()),
        };
        banners.push(repo_config::render_preview(&preview, &default_branch));
    }

    let checkout = ws.checkout(project, &commit.sha).await?;
    let engine = app.engine(Trust::MergeRequest {
        project,
        mr: job.mr,
    })?;
    let version = engine.version().await.ok().map(|v| v.to_string());
    banners.extend(crate::flows::sandbox::note_banner(engine.sandbox()));

    // Bridge the queue's cancellation to the engine's (SIGTERM, grace, SIGKILL).
    let (handle, token) = CancelHandle::new();
    let watcher = {
        let cancel = cancel.clone();
        let handle: CancelHandle = handle;
        tokio::spawn(async move {
            cancel.cancelled().await;
            handle.cancel();
        })
    };

    let key = app.config.fingerprint_key.expose().as_bytes().to_vec();
    let mut results: Vec<RootResult> = Vec::new();
    // The live Proxmox preflight with the plan credentials ([proxmox.plan]); skipped, and said
    // so, when no endpoint is configured.
    let mut preflight_notes: Vec<String> = Vec::new();
    let pve = crate::flows::preflight::endpoint_from_config(
        &app.config.proxmox.for_plan(),
        &app.config.engine.env,
    );
    for decision in cfg.decide(&changed) {
        let root = decision.root;
        if !decision.affected {
            results.push(RootResult {
                name: root.name.clone(),
                outcome: Outcome::Skipped {
                    reason: decision.reason.clone(),
                },
            });
            continue;
        }
        if cancel.is_cancelled() {
            break;
        }
        let _guard = app.root_locks.lock(project, &root.name).await;
        let run = app
            .store
            .start_run(NewRun {
                job: None,
                kind: RunKind::Plan,
                project,
                project_path: job
                    .project_path
                    .clone()
                    .or_else(|| Some(info.path_with_namespace.clone())),
                mr: Some(iid),
                root: root.name.clone(),
                sha: head.clone(),
            })
            .await?;
        runs.push(run);
        let dir: PathBuf = if root.dir == "." {
            checkout.path().to_path_buf()
        } else {
            checkout.path().join(&root.dir)
        };
        let req = PlanRequest {
            var_files: root.var_files.iter().map(PathBuf::from).collect(),
            workspace: Some(root.workspace.clone()).filter(|w| w != "default"),
            extra_secrets: app.config.secrets(),
            cancel: Some(token.clone()),
            worktree: Some(checkout.path().to_path_buf()),
            ..PlanRequest::default()
        };
        let outcome = if !dir.is_dir() {
            let error = format!(
                "the root directory `{}` does not exist at {}",
                root.dir,
                commit.sha.short()
            );
            finish(app, run, RunState::Failed, &error, "", None).await?;
            Outcome::Failed { run, error }
        } else {
            match engine.plan(&dir, &req).await {
                Ok(planned) => {
                    let pf = crate::flows::preflight::for_plan(pve.clone(), planned.plan()).await;
                    let mut facts = pf.lint_facts.clone();
                    facts.apply_ssh = Some(crate::flows::credentials::apply_has_ssh(&app.config));
                    let (mut findings, fingerprint) = cpu_bound(|| {
                        (
                            lint::lint_with(planned.plan(), &root.lint_disable, &facts),
                            planned.fingerprint(&key),
                        )
                    });
                    findings.extend(lint::without_disabled(pf.findings, &root.lint_disable));
                    lint::sort_findings(&mut findings);
                    if !preflight_notes.contains(&pf.note) {
                        preflight_notes.push(pf.note);
                    }
                    Outcome::Planned {
                        run,
                        planned: Box::new(planned),
                        findings,
                        fingerprint,
                    }
                }
                Err(e) => {
                    let state = if matches!(e, EngineError::Cancelled { .. }) {
                        RunState::Canceled
                    } else {
                        RunState::Failed
                    };
                    let error = app.scrubber.scrub(&e.report(60)).into_owned();
                    let log = app.scrubber.scrub(e.log().unwrap_or_default()).into_owned();
                    finish(app, run, state, &e.to_string(), &log, None).await?;
                    Outcome::Failed { run, error }
                }
            }
        };
        results.push(RootResult {
            name: root.name.clone(),
            outcome,
        });
    }
    watcher.abort();

    if cancel.is_cancelled() {
        for r in &results {
            if let Outcome::Planned { run, .. } = &r.outcome {
                finish(app, *run, RunState::Canceled, "superseded", "", None).await?;
            }
        }
        set_status(
            app,
            project,
            &head,
            StatusState::Canceled,
            &text("superseded", minijinja::context! {}),
            None,
            status_ref,
        )
        .await;
        return Ok("canceled");
    }

    // The note: one scrubber over every known secret, the plans' included.
    let mut secrets = crate::core::redact::Secrets::new();
    secrets.extend(app.config.secrets());
    for r in &results {
        if let Outcome::Planned { planned, .. } = &r.outcome {
            secrets.extend(planned.secrets().iter().map(str::to_string));
        }
    }
    let scrubber: Scrubber = cpu_bound(|| secrets.scrubber());
    let first_run = results.iter().find_map(|r| match &r.outcome {
        Outcome::Planned { run, .. } | Outcome::Failed { run, .. } => Some(*run),
        Outcome::Skipped { .. } => None,
    });
    let run_url = first_run.and_then(|r| app.run_url(r));
    let mut ctx = NoteContext {
        sha: Some(commit.sha.as_str().to_string()),
        draft: mr.draft,
        engine: version,
        duration: Some(started.elapsed()),
        run_url: run_url.clone(),
        run_hint: first_run.and_then(|r| app.run_hint(r)),
        banners,
        preflight_note: Some(preflight_notes.join(" · ")).filter(|n| !n.is_empty()),
        ..NoteContext::default()
    };
    for r in &results {
        if let Outcome::Planned { planned, .. } = &r.outcome {
            if planned.plan().errored {
                ctx.plan_errors
                    .insert(r.name.clone(), scrubber.scrub(planned.log()).into_owned());
            }
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
    let body = cpu_bound(|| render_note(&ctx, &sections, &scrubber));
    drop(sections);

    upsert_note(app, project, iid, &body).await?;

    // Runs and fingerprints: stored once the note that shows them is up.
    let mut failed = 0usize;
    let mut all_findings: Vec<Finding> = Vec::new();
    let mut summaries: Vec<minijinja::Value> = Vec::new();
    let mut planned_roots = 0usize;
    for r in results {
        match r.outcome {
            Outcome::Planned {
                run,
                planned,
                findings,
                fingerprint,
            } => {
                planned_roots += 1;
                let errored = planned.plan().errored;
                let summary = Summary::of(planned.plan()).one_line();
                let log = scrubber.scrub(planned.log()).into_owned();
                let state = if errored {
                    RunState::Failed
                } else {
                    RunState::Succeeded
                };
                app.store
                    .finish_run(
                        run,
                        RunEnd {
                            state,
                            summary: Some(summary.clone()),
                            log,
                            note_markdown: Some(body.clone()),
                            fingerprint: (!errored).then(|| fingerprint.clone()),
                        },
                    )
                    .await?;
                if errored {
                    failed += 1;
                    summaries.push(minijinja::context! { name => &r.name, state => "errored" });
                } else {
                    app.store
                        .record_fingerprint(ShownFingerprint {
                            project,
                            mr: iid,
                            root: r.name.clone(),
                            sha: head.clone(),
                            fingerprint,
                            run: Some(run),
                        })
                        .await?;
                    // The secret-free digest, so a refused apply can show what changed.
                    let digest = PlanDigest::of(planned.plan(), &key);
                    app.store
                        .record_digest(project, iid, &r.name, &head, &digest)
                        .await?;
                    summaries.push(minijinja::context! { name => &r.name, state => "planned", summary => summary });
                }
                all_findings.extend(findings);
                drop(planned); // the plan file goes with it
            }
            Outcome::Failed { .. } => {
                failed += 1;
                summaries.push(minijinja::context! { name => &r.name, state => "failed" });
            }
            Outcome::Skipped { .. } => {}
        }
    }
    drop(checkout);

    let (state, description) = if failed > 0 {
        (
            StatusState::Failed,
            text("result", minijinja::context! { roots => &summaries }),
        )
    } else if let Some(lint_error) = lint::status_description(&all_findings) {
        (StatusState::Failed, lint_error)
    } else if planned_roots == 0 {
        (
            StatusState::Success,
            text("no_root", minijinja::context! {}),
        )
    } else {
        (
            StatusState::Success,
            text("result", minijinja::context! { roots => &summaries }),
        )
    };
    set_status(
        app,
        project,
        &head,
        state,
        &description,
        run_url,
        status_ref,
    )
    .await;
    Ok(if state == StatusState::Success {
        "success"
    } else {
        "failed"
    })
}

async fn finish(
    app: &App,
    run: RunId,
    state: RunState,
    summary: &str,
    log: &str,
    note: Option<String>,
) -> Result<()> {
    app.store
        .finish_run(
            run,
            RunEnd {
                state,
                summary: Some(app.scrubber.scrub(summary).into_owned()),
                log: app.scrubber.scrub(log).into_owned(),
                note_markdown: note,
                fingerprint: None,
            },
        )
        .await
}

/// The default branch's `.planbot.toml` is invalid: say what is wrong, plan nothing.
async fn invalid_config(
    app: &App,
    job: &PlanJob,
    default_branch: &str,
    err: &RepoConfigError,
    status_ref: Option<String>,
) -> Result<&'static str> {
    let body = format!(
        "{NOTE_MARKER}\n{}",
        app.scrubber
            .scrub(&repo_config::render_error_note(default_branch, err))
    );
    upsert_note(app, job.project, job.mr, &body).await?;
    let first = err
        .problems
        .first()
        .map(|p| p.to_string())
        .unwrap_or_default();
    set_status(
        app,
        job.project,
        &job.head,
        StatusState::Failed,
        &text(
            "invalid_config",
            minijinja::context! {
                file => repo_config::FILE_NAME,
                branch => default_branch,
                problem => first,
            },
        ),
        None,
        status_ref,
    )
    .await;
    Ok("failed")
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
    let bot = app.bot_user().await.ok();
    let notes = gl(app, "mr_notes", app.gitlab.mr_notes(project, mr).await)?;
    let ours = notes.iter().rev().find(|n| {
        n.body.starts_with(NOTE_MARKER) && (bot.is_none() || n.author.as_ref().map(|a| a.id) == bot)
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

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::context;

    #[test]
    fn status_and_commit_texts_come_from_the_template() {
        let all = [
            text("queued", context! {}),
            text("planning", context! { roots => "" }),
            text("superseded", context! {}),
            text("no_root", context! {}),
            text(
                "error",
                context! { error => "fetching the repository: git fetch failed" },
            ),
            text(
                "invalid_config",
                context! { file => ".planbot.toml", branch => "main", problem => "line 3, column 1: key `roots[0].directory`: unknown key" },
            ),
            text(
                "result",
                context! { roots => vec![
                    context! { name => "core", state => "planned", summary => "1 to add, 0 to change, 0 to destroy" },
                    context! { name => "dns", state => "failed" },
                    context! { name => "edge", state => "errored" },
                ] },
            ),
            text(
                "commit_line",
                context! { planned => "merge", sha => "5717fb1e", head => "e4cd905a", target => "main", reason => None::<String> },
            ),
            text(
                "commit_line",
                context! { planned => "head", sha => "e4cd905a", head => "e4cd905a", target => "main", reason => "the MR has conflicts, or GitLab has not computed its merge result yet" },
            ),
            text(
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
