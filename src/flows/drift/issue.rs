//! A root's drift issue kept in step with one check: found again by its hidden marker among the
//! issues carrying the drift label that planbot's bot user opened (anyone can write the marker
//! and the label into an issue of their own), then opened, edited, closed or left alone.

use crate::capabilities::gitlab::{GitLab, Issue, IssueStateEvent};
use crate::core::drift::{self, DriftIssue, DriftVerdict};
use crate::core::ids::{ProjectId, UserId};
use crate::core::redact::Scrubber;
use anyhow::Context;
use std::time::SystemTime;

/// Which root of which project a check was about, and what its issue shows.
pub struct DriftTarget<'a> {
    pub project: ProjectId,
    pub project_path: &'a str,
    pub root: &'a str,
    pub branch: &'a str,
    pub sha: &'a str,
    /// The labels of the issue; the first is the one it is found by.
    pub labels: &'a [String],
    pub job_name: &'a str,
    /// The fingerprint of the plan that brings reality back to the branch.
    pub fingerprint: Option<&'a str>,
    /// The bot's GitLab user: whose comments on an issue are planbot's.
    pub bot: UserId,
    /// This check's run page, or where its log is on the planbot host
    /// (`App::run_url`, `App::run_hint`).
    pub run_url: Option<&'a str>,
    pub run_hint: Option<&'a str>,
}

/// What [`report`] did to the root's issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssueAction {
    Opened(u64),
    Edited(u64),
    Closed(u64),
    /// No open issue and nothing worth opening one for (clean, waiting for an apply, or a
    /// check that could not run).
    None,
}

/// Bring the root's issue in line with `verdict`, checked at `now`.
pub async fn report(
    gitlab: &GitLab,
    target: &DriftTarget<'_>,
    verdict: &DriftVerdict,
    scrubber: &Scrubber,
    now: SystemTime,
) -> anyhow::Result<IssueAction> {
    let label = target.labels.first().map_or("drift", String::as_str);
    let mut issues = open_issues(gitlab, target.project, label, target.root, target.bot)
        .await
        .with_context(|| format!("listing the issues labelled {label}"))?
        .into_iter();
    let open = issues.next();
    let duplicates: Vec<Issue> = issues.collect();
    let now = humantime::format_rfc3339_seconds(now).to_string();
    let first_seen = open
        .as_ref()
        .map_or_else(|| now.clone(), |issue| issue.created_at.clone());
    let texts = DriftIssue {
        project: target.project_path,
        root: target.root,
        branch: target.branch,
        sha: target.sha,
        verdict,
        first_seen: &first_seen,
        last_seen: &now,
        fingerprint: target.fingerprint,
        job_name: target.job_name,
        run_url: target.run_url,
        run_hint: target.run_hint,
    };
    // Two checks that ran at once (the schedule and a `planbot drift` from cron) both found no
    // issue and opened one: the oldest is kept, the others are closed pointing to it.
    if let Some(kept) = &open {
        for duplicate in &duplicates {
            let note = drift::render_duplicate_note(&texts, kept.iid, scrubber);
            close_with_note(gitlab, target, duplicate, &note).await?;
        }
    }
    let body = drift::render_body(&texts, scrubber);
    match (verdict, open) {
        (DriftVerdict::Clean, Some(issue)) => {
            let note = drift::render_closing_note(&texts, scrubber);
            close_with_note(gitlab, target, &issue, &note).await?;
            Ok(IssueAction::Closed(issue.iid))
        }
        (_, Some(issue)) => {
            gitlab
                .edit_issue(target.project, issue.iid, &body, None)
                .await
                .context("editing the drift issue")?;
            Ok(IssueAction::Edited(issue.iid))
        }
        (DriftVerdict::Drifted { .. }, None) => {
            let title = drift::render_title(&texts, scrubber);
            let issue = gitlab
                .create_labelled_issue(target.project, &title, &body, target.labels)
                .await
                .context("opening the drift issue")?;
            Ok(IssueAction::Opened(issue.iid))
        }
        (_, None) => Ok(IssueAction::None),
    }
}

/// Close, with a note saying why, every open drift issue of `project` whose root is not in
/// `checked` (gone from `.planbot.toml`, or `drift = false`); returns (root, iid) of each.
pub async fn close_unchecked(
    gitlab: &GitLab,
    target: &DriftTarget<'_>,
    checked: &[String],
    scrubber: &Scrubber,
    now: SystemTime,
) -> anyhow::Result<Vec<(String, u64)>> {
    let label = target.labels.first().map_or("drift", String::as_str);
    let issues = gitlab
        .issues_labelled(target.project, label)
        .await
        .with_context(|| format!("listing the issues labelled {label}"))?;
    let now = humantime::format_rfc3339_seconds(now).to_string();
    let mut closed = Vec::new();
    for issue in issues
        .into_iter()
        .filter(|i| i.state == "opened" && by_bot(i, target.bot))
    {
        let Some(root) = drift::root_of_marker(&issue.description) else {
            continue;
        };
        if checked.contains(&root) {
            continue;
        }
        let texts = DriftIssue {
            project: target.project_path,
            root: &root,
            branch: target.branch,
            sha: target.sha,
            verdict: &DriftVerdict::Clean,
            first_seen: &issue.created_at,
            last_seen: &now,
            fingerprint: None,
            job_name: target.job_name,
            run_url: None,
            run_hint: None,
        };
        let note = drift::render_unchecked_note(&texts, scrubber);
        close_with_note(gitlab, target, &issue, &note).await?;
        closed.push((root, issue.iid));
    }
    Ok(closed)
}

/// Post `body` (an apply's result) on the root's open drift issue (opened by `bot`, planbot's
/// bot user), when it has one; returns the issue's iid.
pub async fn note_on_open_issue(
    gitlab: &GitLab,
    project: ProjectId,
    labels: &[String],
    root: &str,
    body: &str,
    bot: UserId,
) -> anyhow::Result<Option<u64>> {
    let label = labels.first().map_or("drift", String::as_str);
    let Some(issue) = open_issue(gitlab, project, label, root, bot).await? else {
        return Ok(None);
    };
    gitlab
        .create_issue_note(project, issue.iid, body)
        .await
        .context("commenting on the drift issue")?;
    Ok(Some(issue.iid))
}

/// Comment `note` on `issue`, then close it (its description unchanged). When planbot's newest
/// comment on the issue is already a closing note (GitLab failed after it, before the close),
/// only the close is left to do: the note is not posted twice.
async fn close_with_note(
    gitlab: &GitLab,
    target: &DriftTarget<'_>,
    issue: &Issue,
    note: &str,
) -> anyhow::Result<()> {
    let project = target.project;
    if !closing_note_posted(gitlab, project, issue.iid, target.bot).await? {
        gitlab
            .create_issue_note(project, issue.iid, note)
            .await
            .with_context(|| format!("commenting on drift issue #{}", issue.iid))?;
    }
    gitlab
        .edit_issue(
            project,
            issue.iid,
            &issue.description,
            Some(IssueStateEvent::Close),
        )
        .await
        .with_context(|| format!("closing drift issue #{}", issue.iid))?;
    Ok(())
}

/// Whether the bot's newest comment on the issue is a closing note.
async fn closing_note_posted(
    gitlab: &GitLab,
    project: ProjectId,
    iid: u64,
    bot: UserId,
) -> anyhow::Result<bool> {
    let notes = gitlab
        .newest_issue_notes(project, iid, 20)
        .await
        .with_context(|| format!("reading the comments of drift issue #{iid}"))?;
    Ok(notes
        .iter()
        .find(|n| !n.system && n.author.as_ref().is_some_and(|a| a.id == bot))
        .is_some_and(|n| n.body.contains(drift::CLOSING_MARKER)))
}

/// The root's open drift issue (the oldest, when two checks at once opened two).
async fn open_issue(
    gitlab: &GitLab,
    project: ProjectId,
    label: &str,
    root: &str,
    bot: UserId,
) -> anyhow::Result<Option<Issue>> {
    Ok(open_issues(gitlab, project, label, root, bot)
        .await?
        .into_iter()
        .next())
}

/// Whether `bot` (planbot's bot user) opened the issue: only those are planbot's to edit or close.
fn by_bot(issue: &Issue, bot: UserId) -> bool {
    issue.author.as_ref().is_some_and(|a| a.id == bot)
}

/// The root's open drift issues, oldest first: labelled `label`, opened by `bot`, their
/// description holding the root's marker.
async fn open_issues(
    gitlab: &GitLab,
    project: ProjectId,
    label: &str,
    root: &str,
    bot: UserId,
) -> anyhow::Result<Vec<Issue>> {
    let marker = drift::marker(root);
    let mut open: Vec<Issue> = gitlab
        .issues_labelled(project, label)
        .await?
        .into_iter()
        .filter(|issue| {
            issue.state == "opened" && by_bot(issue, bot) && issue.description.contains(&marker)
        })
        .collect();
    open.sort_by_key(|issue| issue.iid);
    Ok(open)
}
