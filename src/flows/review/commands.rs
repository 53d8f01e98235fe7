//! The queue's non-plan jobs: merged, closed, comment commands, fork notices, start-up reconciliation.

use crate::capabilities::gitlab::{AccessLevel, MergeRequest};
use crate::core::config::ProjectRef;
use crate::core::events::{Command, Job, PlanArgs, PlanJob, PlanReason};
use crate::core::ids::{CommitSha, MrIid, NoteId, ProjectId, UserId};
use crate::core::render::NOTE_MARKER;
use crate::core::repo_config::{ForkMrs, RepoConfig};
use crate::core::targeting::{Targeting, ALLOWED_FLAGS};
use crate::flows::context::app_state::App;
use crate::flows::review::gitlab_calls::gl;
use crate::flows::review::policies;
use anyhow::{Context, Result};
use minijinja::context;
use tokio_util::sync::CancellationToken;

/// Marks planbot's fork notice so it is posted once per MR.
pub const FORK_NOTICE_MARKER: &str = "<!-- planbot:fork-notice -->";
/// Marks planbot's help note: one per MR, kept up to date.
pub const HELP_MARKER: &str = "<!-- planbot:help -->";
/// The reaction on a command whose reply is already on the MR as it would be again (a
/// repeated `planbot help`, a repeated refusal): seen, answered above.
pub const SEEN_EMOJI: &str = "eyes";
/// The reaction on a command from a user with no role on the project (no note for them).
pub const NO_ROLE_EMOJI: &str = "no_entry_sign";
/// Marks the merged banner inside the plan note.
pub use crate::core::render::MERGED_BANNER_MARKER;

fn render(name: &str, ctx: minijinja::Value) -> Result<String> {
    Ok(
        crate::core::templates::render(&format!("comments/{name}.md.j2"), ctx)?
            .trim_end()
            .to_string()
            + "\n",
    )
}

/// Run one non-plan job.
pub async fn run(app: &App, job: &Job, cancel: &CancellationToken) -> Result<()> {
    match job {
        Job::Closed { project, mr } => closed(app, *project, *mr).await,
        Job::MarkMerged {
            project,
            mr,
            merge_commit,
            target_branch,
        } => {
            mark_merged(
                app,
                *project,
                *mr,
                merge_commit.as_ref(),
                target_branch.as_deref(),
            )
            .await
        }
        Job::Command {
            project,
            project_path,
            mr,
            note,
            author,
            command,
            head,
            written_at,
            plan_args,
            ..
        } => {
            let asked = Asked {
                project: *project,
                project_path: project_path.clone(),
                mr: *mr,
                note: *note,
                author: *author,
                command: *command,
                head: head.clone(),
                written_at: *written_at,
                plan_args: plan_args.clone(),
            };
            run_command(app, asked).await
        }
        Job::ForkNotice { project, mr, .. } => fork_notice(app, *project, *mr).await,
        Job::Reconcile => reconcile(app, cancel).await,
        Job::Plan(_) | Job::PlanRoot(_) => unreachable!("plan jobs go to flows::review::plan"),
        Job::DriftTick { .. } => unreachable!("drift ticks go to flows::drift::schedule"),
    }
}

/// The engine's name for the help note: `engine.binary`'s file name, else the one on `PATH`
/// (`tofu`, else `terraform`).
fn engine_name(binary: Option<&str>) -> String {
    crate::capabilities::engine::configured_binary(binary)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "OpenTofu or Terraform".to_string())
}

async fn closed(app: &App, project: ProjectId, mr: MrIid) -> Result<()> {
    // Queued and running work of the MR was cancelled when this job was enqueued (same
    // transaction); a cancelled plan's checkout is removed when its job stops (checkouts are
    // per job). The project's shared mirror stays for the other MRs; the MR's own plugin
    // cache goes, and so do its plans kept for reuse.
    app.drop_mr_plugin_cache(project, mr);
    crate::flows::context::plan_reuse::forget(app, project, mr).await;
    tracing::info!(
        project = project.0,
        mr = mr.0,
        "merge request closed: queued work dropped"
    );
    Ok(())
}

/// Put the merged banner on the plan note, then re-plan the other open MRs of the same target
/// branch (their plans were made against a base that just changed).
async fn mark_merged(
    app: &App,
    project: ProjectId,
    mr: MrIid,
    merge_commit: Option<&CommitSha>,
    target_branch: Option<&str>,
) -> Result<()> {
    app.drop_mr_plugin_cache(project, mr);
    crate::flows::context::plan_reuse::forget(app, project, mr).await;
    let target = target_branch.unwrap_or("main");
    let banner = format!(
        "{MERGED_BANNER_MARKER}\n{}",
        render(
            "merged_banner",
            context! {
                target_branch => target,
                job_name => &app.config.apply.job_name,
                merge_commit => merge_commit.map(|s| s.short().to_string()),
            },
        )?
    );
    // The plan note: its cached id first, else a search among the notes the bot user wrote
    // (anyone can write the marker in a comment of their own).
    if let Some(note) = app.planbot_note(project, mr, NOTE_MARKER).await? {
        let (note_id, body) = (note.id, note.body);
        if !body.contains(MERGED_BANNER_MARKER) {
            let new_body = match body.split_once(NOTE_MARKER) {
                Some((before, after)) => format!("{before}{NOTE_MARKER}\n{banner}{after}"),
                None => format!("{banner}\n{body}"),
            };
            gl(
                app,
                "edit_mr_note",
                app.gitlab
                    .edit_mr_note(project, mr, note_id, &new_body)
                    .await,
            )?;
        }
    }
    let open = gl(
        app,
        "open_merge_requests",
        app.gitlab.open_merge_requests(project).await,
    )?;
    for other in open {
        if other.iid == mr || other.target_branch != target || other.is_fork() {
            continue;
        }
        if let Some(job) = plan_job_for(
            project,
            None,
            &other,
            PlanReason::SiblingMerged { merged: mr },
            None,
        ) {
            app.enqueue(Job::Plan(job)).await?;
        }
    }
    Ok(())
}

fn plan_job_for(
    project: ProjectId,
    project_path: Option<String>,
    mr: &MergeRequest,
    reason: PlanReason,
    requested_by: Option<UserId>,
) -> Option<PlanJob> {
    Some(PlanJob {
        project,
        project_path,
        mr: mr.iid,
        head: mr.sha.clone()?,
        target_branch: Some(mr.target_branch.clone()).filter(|b| !b.is_empty()),
        source_project: mr.source_project_id,
        fork: mr.is_fork(),
        draft: mr.draft,
        reason,
        requested_by,
    })
}

/// Post a note on the MR (counted as a GitLab error when it fails).
async fn post_note(app: &App, project: ProjectId, mr: MrIid, body: &str) -> Result<()> {
    gl(
        app,
        "create_mr_note",
        app.gitlab.create_mr_note(project, mr, body).await,
    )?;
    Ok(())
}

/// A comment command, as the Note Hook told it.
struct Asked {
    project: ProjectId,
    project_path: Option<String>,
    mr: MrIid,
    /// The comment itself (for a reaction).
    note: Option<NoteId>,
    author: UserId,
    command: Command,
    /// The MR's head when the comment was made (`merge_request.last_commit.id` of the event).
    head: Option<CommitSha>,
    /// When the comment was written (unix ms, GitLab's clock), when the event said.
    written_at: Option<i64>,
    /// The engine flags of a targeted `planbot plan [ROOT] -- …`.
    plan_args: Option<PlanArgs>,
}

/// A comment command: from a user with no role on the project, a reaction and no note; refused
/// (said once per MR and author) when its author lacks the role it needs; else run.
async fn run_command(app: &App, asked: Asked) -> Result<()> {
    if asked.author == app.bot_user().await? {
        return Ok(()); // our own note
    }
    let access = gl(
        app,
        "member_access",
        app.gitlab.member_access(asked.project, asked.author).await,
    )?;
    // An approval is checked against the sets' owners, who need no role on the project.
    if access.is_none() && asked.command != Command::ApprovePolicies {
        tracing::info!(
            project = asked.project.0,
            mr = asked.mr.0,
            user = asked.author.0,
            command = asked.command.name(),
            "comment command from a user with no role on the project: not run, no note (a reaction)"
        );
        return react(app, &asked, NO_ROLE_EMOJI).await;
    }
    let mr = gl(
        app,
        "merge_request",
        app.gitlab.merge_request(asked.project, asked.mr).await,
    )?;
    if let Some(body) = refused_for_access(&asked, &mr, access)? {
        let marker = refusal_marker(asked.author);
        return reply_once(app, &asked, &marker, &format!("{marker}\n{body}")).await;
    }
    match asked.command {
        Command::Help => help(app, &asked, &mr).await,
        Command::ApprovePolicies => approve_policies(app, &asked, &mr).await,
        Command::Plan => plan_on_comment(app, asked, &mr).await,
    }
}

/// The hidden marker of the refusal note of `author` on an MR (one per MR and author).
fn refusal_marker(author: UserId) -> String {
    format!("<!-- planbot:refused user:{} -->", author.0)
}

/// The reply `body` (holding `marker`) kept once on the MR: posted when the bot has no note
/// with `marker` there, edited when that note says something else, and when it already says
/// this, only a reaction on the comment (no note, no notification).
async fn reply_once(app: &App, asked: &Asked, marker: &str, body: &str) -> Result<()> {
    let (project, mr) = (asked.project, asked.mr);
    // Two commands of a storm may run on two workers: one reply, not two.
    let _one_at_a_time = app
        .root_locks
        .lock(project, &format!("\0reply !{mr} {marker}"))
        .await;
    match app.planbot_note(project, mr, marker).await? {
        None => post_note(app, project, mr, body).await,
        Some(note) if note.body.trim_end() == crate::capabilities::gitlab::outgoing(body) => {
            react(app, asked, SEEN_EMOJI).await
        }
        Some(note) => {
            gl(
                app,
                "edit_mr_note",
                app.gitlab.edit_mr_note(project, mr, note.id, body).await,
            )?;
            Ok(())
        }
    }
}

/// Award `emoji` on the command's comment (when the event named it); a failure is logged and
/// counted, never retried by the job.
async fn react(app: &App, asked: &Asked, emoji: &str) -> Result<()> {
    let Some(note) = asked.note else {
        return Ok(());
    };
    let awarded = app
        .gitlab
        .award_note_emoji(asked.project, asked.mr, note, emoji)
        .await;
    if let Err(e) = awarded {
        app.metrics.gitlab_error("award_note_emoji");
        tracing::warn!(project = asked.project.0, mr = asked.mr.0, error = %e, "could not react to a comment command");
    }
    Ok(())
}

/// The reply refusing `asked` when its author (with `access` on the project) has less than
/// Developer (Maintainer for `planbot plan` on a fork MR); an approval is checked against the
/// sets' owners instead (who need no role on the project).
fn refused_for_access(
    asked: &Asked,
    mr: &MergeRequest,
    access: Option<AccessLevel>,
) -> Result<Option<String>> {
    let needed = if mr.is_fork() && asked.command == Command::Plan {
        AccessLevel::MAINTAINER
    } else {
        AccessLevel::DEVELOPER
    };
    if asked.command == Command::ApprovePolicies || access.is_some_and(|a| a >= needed) {
        return Ok(None);
    }
    tracing::info!(
        project = asked.project.0,
        mr = asked.mr.0,
        user = asked.author.0,
        "comment command refused: not enough access"
    );
    render(
        "command_refused",
        context! {
            command => asked.command.name(),
            reason => if needed == AccessLevel::MAINTAINER { "fork" } else { "developer" },
            username => Option::<String>::None,
        },
    )
    .map(Some)
}

/// `planbot help`: what planbot does here and the commands, in one note per MR.
async fn help(app: &App, asked: &Asked, mr: &MergeRequest) -> Result<()> {
    let body = render(
        "help",
        context! {
            engine => engine_name(app.config.engine.binary.as_deref()),
            job_name => &app.config.apply.job_name,
            target_branch => &mr.target_branch,
            runs_url => app.page_url("/runs"),
        },
    )?;
    reply_once(app, asked, HELP_MARKER, &body).await
}

/// `planbot approve policies`, bound to the head its comment was made on
/// ([`crate::flows::review::policies::approve`]).
async fn approve_policies(app: &App, asked: &Asked, mr: &MergeRequest) -> Result<()> {
    let (project, iid) = (asked.project, asked.mr);
    // Before or after the merge: the MR's last head is the plan the apply compares.
    let Some(head) = mr.sha.clone() else {
        anyhow::bail!("merge request !{iid} has no head commit yet");
    };
    // An approval binds to the head its comment was made on: when the MR moved since (or the
    // event named no head), the owner never saw what would be approved.
    if asked.head.as_ref() != Some(&head) {
        tracing::info!(
            project = project.0,
            mr = iid.0,
            "`planbot approve policies` refused: the MR moved since the comment"
        );
        let user = gl(app, "user", app.gitlab.user(asked.author).await)?;
        let body = policies::moved_reply(&user.username, asked.head.as_ref(), &head)?;
        return post_note(app, project, iid, &body).await;
    }
    let landed = mr.landed_sha().filter(|_| mr.state == "merged").cloned();
    let (author, written_at) = (asked.author, asked.written_at);
    let body = policies::approve(
        app,
        project,
        iid,
        author,
        &head,
        landed.as_ref(),
        written_at,
    )
    .await?;
    post_note(app, project, iid, &body).await
}

/// `planbot plan [ROOT] -- …`: the MR's head planned (with the comment's targeting) when it
/// is open, still at the head the comment was made on, and not a fork MR the repo config
/// ignores.
async fn plan_on_comment(app: &App, asked: Asked, mr: &MergeRequest) -> Result<()> {
    let (project, iid) = (asked.project, asked.mr);
    if mr.state != "opened" {
        tracing::info!(project = project.0, mr = iid.0, state = %mr.state, "`planbot plan` on an MR that is not open: ignored");
        return Ok(());
    }
    if mr.is_fork() && fork_policy(app, project).await? == ForkMrs::Never {
        tracing::info!(
            project = project.0,
            mr = iid.0,
            "`planbot plan` on a fork MR with fork_mrs = \"never\": ignored"
        );
        return Ok(());
    }
    let reason = PlanReason::Command;
    let Some(job) = plan_job_for(project, asked.project_path, mr, reason, Some(asked.author))
    else {
        anyhow::bail!("merge request !{iid} has no head commit yet");
    };
    if let Some(body) = moved_since_comment(asked.head.as_ref(), mr, &job.head)? {
        tracing::info!(
            project = project.0,
            mr = iid.0,
            "`planbot plan` refused: the MR moved since the comment"
        );
        return post_note(app, project, iid, &body).await;
    }
    // The comment decides the head's targeting: a plain `planbot plan` plans in full again,
    // `planbot plan [ROOT] -- …` plans with its checked flags (else says why).
    let roots = match targeting_asked(app, project, iid, asked.plan_args.as_ref()).await? {
        Ok(roots) => roots,
        Err(body) => {
            tracing::info!(
                project = project.0,
                mr = iid.0,
                "`planbot plan --` refused: flags or root not allowed"
            );
            return post_note(app, project, iid, &body).await;
        }
    };
    app.store
        .set_plan_targeting(project, iid, &job.head, asked.author, &roots)
        .await?;
    app.enqueue(Job::Plan(job)).await?;
    Ok(())
}

/// `planbot plan` plans the commit the comment was made on, never one pushed after it (a fork's
/// author could push between a Maintainer's reading and the plan): the note that refuses, when
/// the MR's head is no longer the one the event named, or (from a fork) the event named none.
fn moved_since_comment(
    commented: Option<&CommitSha>,
    mr: &MergeRequest,
    now: &CommitSha,
) -> Result<Option<String>> {
    if commented == Some(now) || (commented.is_none() && !mr.is_fork()) {
        return Ok(None);
    }
    render(
        "command_moved",
        context! {
            commented => commented.map(|c| c.short().to_string()),
            head => now.short(),
            fork => mr.is_fork(),
        },
    )
    .map(Some)
}

/// The targeting a `planbot plan` comment asks for, by root: none for a plain `planbot plan`;
/// for `planbot plan [ROOT] -- FLAGS`, the checked flags for ROOT, or for every root of the
/// repo config (the DEFAULT branch's: the MR's own cannot add a root to target). `Err` is the
/// reply when the flags, the root or the engine refuse it (nothing is planned then).
async fn targeting_asked(
    app: &App,
    project: ProjectId,
    mr: MrIid,
    args: Option<&PlanArgs>,
) -> Result<Result<Vec<(String, Targeting)>, String>> {
    let Some(args) = args else {
        return Ok(Ok(Vec::new()));
    };
    let refused = |kind: &str, error: String, root: Option<&str>, roots: Vec<String>| {
        render(
            "plan_args_refused",
            context! {
                kind => kind,
                error => error,
                root => root,
                roots => roots,
                allowed => ALLOWED_FLAGS,
            },
        )
    };
    let targeting = match Targeting::parse(&args.words) {
        Ok(t) => t,
        Err(e) => return Ok(Err(refused("flags", e.to_string(), None, vec![])?)),
    };
    // `-exclude` on an engine without it is said now, not as a failed plan.
    if let Ok(version) = app.mr_engine(project, mr)?.version().await {
        if let Err(e) = targeting.check_engine(version.name) {
            return Ok(Err(refused("flags", e.to_string(), None, vec![])?));
        }
    }
    let config = match default_config(app, project).await? {
        Some(Ok(config)) => config,
        _ => {
            let error = format!(
                "the default branch's `{}` could not be read, so planbot cannot tell its roots",
                crate::core::repo_config::FILE_NAME
            );
            return Ok(Err(refused("flags", error, None, vec![])?));
        }
    };
    let names: Vec<String> = config.roots.iter().map(|r| r.name.clone()).collect();
    let roots = match &args.root {
        Some(root) if names.contains(root) => vec![root.clone()],
        Some(root) => return Ok(Err(refused("root", String::new(), Some(root), names)?)),
        None => names,
    };
    Ok(Ok(roots
        .into_iter()
        .map(|r| (r, targeting.clone()))
        .collect()))
}

/// The repo config of the DEFAULT branch (the mirror fetched first); `None` when the project
/// has no default branch.
async fn default_config(
    app: &App,
    project: ProjectId,
) -> Result<Option<Result<RepoConfig, crate::core::repo_config::RepoConfigError>>> {
    let info = gl(
        app,
        "project",
        app.gitlab.project(&project.to_string()).await,
    )?;
    let Some(default_branch) = info.default_branch.clone() else {
        return Ok(None);
    };
    app.workspace
        .sync(project, &info.http_url_to_repo)
        .await
        .context("fetching the repository")?;
    Ok(Some(
        app.workspace
            .repo_config_at(project, &format!("refs/heads/{default_branch}"))
            .await?,
    ))
}

/// `[plan] fork_mrs` of the repo config on the DEFAULT branch (never the MR's own copy).
/// An unreadable or invalid config counts as `never`: no untrusted code runs on a doubt.
pub(crate) async fn fork_policy(app: &App, project: ProjectId) -> Result<ForkMrs> {
    let Some(config) = default_config(app, project).await? else {
        return Ok(ForkMrs::Never);
    };
    Ok(match config {
        Ok(cfg) => cfg.plan.fork_mrs,
        Err(e) => {
            tracing::warn!(project = project.0, error = %e, "invalid repo config: fork MRs are not planned");
            ForkMrs::Never
        }
    })
}

async fn fork_notice(app: &App, project: ProjectId, mr: MrIid) -> Result<()> {
    // Two deliveries of the same fork MR may run on two workers: one notice, not two.
    let _one_at_a_time = app
        .root_locks
        .lock(project, &format!("\0fork-notice !{mr}"))
        .await;
    if fork_policy(app, project).await? == ForkMrs::Never {
        return Ok(()); // `fork_mrs = "never"`: fork MRs are ignored entirely
    }
    if app
        .planbot_note(project, mr, FORK_NOTICE_MARKER)
        .await?
        .is_some()
    {
        return Ok(());
    }
    let body = render("fork_notice", context! {})?;
    post_note(app, project, mr, &body).await
}

/// Start-up: GitLab does not re-deliver webhooks lost while planbot was down, so plan every
/// open (non-fork) MR of the allowed projects whose head has no plan yet.
async fn reconcile(app: &App, cancel: &CancellationToken) -> Result<()> {
    let mut failures = Vec::new();
    for p in &app.config.gitlab.projects.0 {
        if cancel.is_cancelled() {
            return Ok(());
        }
        let key = match p {
            ProjectRef::Id(id) => id.to_string(),
            ProjectRef::Path(path) => path.clone(),
        };
        let project = match app.gitlab.project(&key).await {
            Ok(pr) => pr,
            Err(e) => {
                app.metrics.gitlab_error("project");
                failures.push(format!("{key}: {e}"));
                continue;
            }
        };
        let open = match app.gitlab.open_merge_requests(project.id).await {
            Ok(o) => o,
            Err(e) => {
                app.metrics.gitlab_error("open_merge_requests");
                failures.push(format!("{key}: {e}"));
                continue;
            }
        };
        for mr in open {
            if mr.is_fork() {
                continue;
            }
            let Some(sha) = mr.sha.clone() else { continue };
            if app.store.head_has_plan(project.id, mr.iid, sha).await? {
                continue;
            }
            let path = Some(project.path_with_namespace.clone()).filter(|p| !p.is_empty());
            if let Some(job) = plan_job_for(project.id, path, &mr, PlanReason::Reconcile, None) {
                tracing::info!(project = %key, mr = mr.iid.0, "reconcile: open MR without a plan for its head");
                app.enqueue(Job::Plan(job)).await?;
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("reconcile could not read: {}", failures.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comment_templates_render() {
        let help = render(
            "help",
            context! { engine => "tofu", job_name => "planbot-apply", target_branch => "main", runs_url => "https://planbot.example.com/runs" },
        )
        .unwrap();
        insta::assert_snapshot!("help_note", help);
        let refused = render(
            "command_refused",
            context! { command => "plan", reason => "fork", username => "sjones" },
        )
        .unwrap();
        insta::assert_snapshot!("command_refused_fork", refused);
        let banner = render(
            "merged_banner",
            context! { target_branch => "main", job_name => "planbot-apply", merge_commit => "2222abcd" },
        )
        .unwrap();
        insta::assert_snapshot!("merged_banner", banner);
        insta::assert_snapshot!("fork_notice", render("fork_notice", context! {}).unwrap());
        let moved = [
            render(
                "command_moved",
                context! { commented => "1111aaaa", head => "2222bbbb", fork => true },
            )
            .unwrap(),
            render(
                "command_moved",
                context! { commented => "1111aaaa", head => "2222bbbb", fork => false },
            )
            .unwrap(),
            render(
                "command_moved",
                context! { commented => None::<String>, head => "2222bbbb", fork => true },
            )
            .unwrap(),
        ];
        insta::assert_snapshot!("command_moved", moved.join("\n"));
        let args_refused = [
            render(
                "plan_args_refused",
                context! {
                    kind => "flags",
                    error => Targeting::parse(&["-chdir=/etc"]).unwrap_err().to_string(),
                    allowed => ALLOWED_FLAGS,
                },
            )
            .unwrap(),
            render(
                "plan_args_refused",
                context! { kind => "root", root => "nope", roots => ["core", "dns"], allowed => ALLOWED_FLAGS },
            )
            .unwrap(),
        ];
        insta::assert_snapshot!("plan_args_refused", args_refused.join("\n"));
        assert!(render("fork_notice", context! {})
            .unwrap()
            .starts_with(FORK_NOTICE_MARKER));
        assert!(help.starts_with(HELP_MARKER));
    }
}
