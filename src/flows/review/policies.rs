//! Policy checks of a review: each root's verdict (by the sets of
//! [`crate::flows::context::policy_sets`]: planbot's own and the default branch's, never the
//! MR's) recorded with its plan's fingerprint, the note's section, the `planbot/policy` status,
//! and the `planbot approve policies` command an owner of a failing set comments.

use crate::capabilities::gitlab::{CommitStatus, StatusState};
use crate::capabilities::store::{PolicyApproval, PolicyVerdictRecord};
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, ProjectId, UserId};
use crate::core::policy::review::{
    owned_by_user, ApprovalView, ClearedApproval, PolicySection, RecordedSet, RecordedVerdict,
};
use crate::core::policy::Owner;
use crate::core::redact::Scrubber;
use crate::flows::context::app_state::App;
use crate::flows::review::gitlab_calls::set_commit_status;
use anyhow::{Context, Result};
use minijinja::context;

/// The note's section for `verdict` of `root`'s plan (`fingerprint`, shown for `sha`): the
/// approvals of that very plan count, those of an earlier plan are listed as cleared.
pub(crate) fn section(
    verdict: &RecordedVerdict,
    root: &str,
    sha: &CommitSha,
    fingerprint: &Fingerprint,
    approvals: &[PolicyApproval],
    branch: &str,
) -> PolicySection {
    let mut counting = Vec::new();
    let mut cleared: Vec<ClearedApproval> = Vec::new();
    for a in approvals.iter().filter(|a| a.root == root) {
        if &a.sha == sha && &a.fingerprint == fingerprint {
            counting.push(ApprovalView {
                set: a.set.clone(),
                approver: a.approver.clone(),
            });
        } else if !cleared
            .iter()
            .any(|c| c.set == a.set && c.approver == a.approver)
        {
            cleared.push(ClearedApproval {
                set: a.set.clone(),
                approver: a.approver.clone(),
                sha: a.sha.short().to_string(),
            });
        }
    }
    PolicySection::new(verdict, &counting, &cleared, branch)
}

/// One line of the policy texts (`templates/policy.txt.j2`), its values scrubbed.
fn text(scrubber: &Scrubber, kind: &str, ctx: minijinja::Value) -> String {
    crate::core::templates::scrubbing(scrubber, || {
        crate::core::templates::text("policy.txt.j2", kind, ctx)
            .trim()
            .to_string()
    })
}

/// `planbot/policy` on `sha` from the verdicts of its plans (`(root, verdict, fingerprint)`)
/// and the approvals of the MR: failed while a failing set waits for its owners. Nothing is
/// posted when no set checks any of the plans.
pub(crate) async fn set_status(
    app: &App,
    project: ProjectId,
    sha: &CommitSha,
    status_ref: Option<String>,
    verdicts: &[(String, Fingerprint, RecordedVerdict)],
    approvals: &[PolicyApproval],
) {
    if verdicts.iter().all(|(_, _, v)| v.sets.is_empty()) {
        return;
    }
    let mut waiting: Option<(&str, &RecordedSet)> = None;
    let mut approved = 0;
    let mut passed = 0;
    for (root, fingerprint, v) in verdicts {
        let ok = PolicyApproval::sets_for(approvals, root, sha, fingerprint);
        passed += v.sets.iter().filter(|s| !s.blocks()).count();
        approved += v
            .blocking()
            .filter(|s| ok.contains(&s.name.as_str()))
            .count();
        if waiting.is_none() {
            waiting = v.first_unapproved(&ok).map(|s| (root.as_str(), s));
        }
    }
    let (state, description) = match waiting {
        Some((root, set)) => (
            StatusState::Failed,
            text(
                &app.scrubber,
                "status_failed",
                context! { root => root, set => &set.name, message => set.first_message() },
            ),
        ),
        None => (
            StatusState::Success,
            text(
                &app.scrubber,
                "status_passed",
                context! { passed => passed, approved => approved },
            ),
        ),
    };
    let status = CommitStatus {
        state,
        name: crate::core::commit_status::POLICY.into(),
        description: Some(description.chars().take(255).collect()),
        target_url: None,
        ref_: status_ref,
        pipeline_id: None,
    };
    set_commit_status(app, project, sha, &status, "policy status").await;
}

/// Whether `user` (id and name) is among `owners`: by name, or a member of an owning group as
/// GitLab answers.
async fn owns(app: &App, owners: &[Owner], user: UserId, username: &str) -> Result<bool> {
    if owned_by_user(owners, username) {
        return Ok(true);
    }
    for owner in owners {
        if let Owner::Group(group) = owner {
            let member = app
                .gitlab
                .group_member(group, user)
                .await
                .with_context(|| format!("asking GitLab for the members of {group}"))?;
            if member {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// A failing set of one root's plan, for the replies.
#[derive(serde::Serialize)]
struct Waiting {
    root: String,
    set: String,
    owners: Vec<Owner>,
    /// The merged commit, for a plan the apply job checked there (not one shown for the head).
    at: Option<String>,
}

/// `planbot approve policies` by `author` on the MR: every failing set of the plans shown for
/// the MR's head that the author owns is approved for those plans (their fingerprints); once
/// merged (`landed`: the commit that landed on the default branch), also the plans the apply
/// job checked there (a confirmed plan, or a root the review did not cover). A reply says what
/// was approved and what still waits, or who may approve.
pub(crate) async fn approve(
    app: &App,
    project: ProjectId,
    mr: MrIid,
    author: UserId,
    head: &CommitSha,
    landed: Option<&CommitSha>,
    written_at: Option<i64>,
) -> Result<String> {
    let user = app
        .gitlab
        .user(author)
        .await
        .context("asking GitLab who wrote the note")?;
    let approving = Approving {
        app,
        project,
        mr,
        author,
        username: user.username,
        head,
    };
    let (shown, checked_at_apply) = approving.verdicts(landed).await?;
    // The same head may have been planned again since the comment was written (a `planbot
    // plan`, a re-plan after the default branch moved) and show another plan or verdict: the
    // approval is for the note its owner read. The note is edited before a plan's verdict is
    // recorded, so read after the verdicts: a verdict read here was shown by a note edit that
    // this check sees. Both times are GitLab's own.
    if let Some(edited) = plan_changed_since(app, project, mr, written_at).await? {
        tracing::info!(
            project = project.0,
            mr = mr.0,
            "`planbot approve policies` refused: the plan note changed since the comment"
        );
        return replanned_reply(&approving.username, head, edited.as_deref());
    }
    let (approved, waiting) = approving
        .owned_sets(shown.iter().chain(&checked_at_apply))
        .await?;
    let shown_any = !shown.is_empty() || !checked_at_apply.is_empty();
    let kind = if !shown_any {
        "reply_no_plan"
    } else if approved.is_empty() && waiting.is_empty() {
        "reply_nothing_fails"
    } else if approved.is_empty() {
        "reply_not_owner"
    } else {
        "reply_approved"
    };
    let username = &approving.username;
    tracing::info!(
        project = project.0,
        mr = mr.0,
        user = %username,
        approved = approved.len(),
        waiting = waiting.len(),
        "planbot approve policies"
    );
    if !approved.is_empty() {
        approving.show_approved(shown).await?;
    }
    let body = crate::core::templates::scrubbing(&app.scrubber, || {
        crate::core::templates::render(
            "comments/policy_approval.md.j2",
            context! {
                kind => kind,
                username => username,
                sha => head.short(),
                approved => approved,
                waiting => waiting,
            },
        )
    })?;
    Ok(body.trim_end().to_string() + "\n")
}

/// Who approves, on which MR head: what the steps of `planbot approve policies` share.
struct Approving<'a> {
    app: &'a App,
    project: ProjectId,
    mr: MrIid,
    author: UserId,
    username: String,
    head: &'a CommitSha,
}

impl Approving<'_> {
    /// The verdicts an approval is for: those of the plans the note shows for the head (one
    /// per root, the one of its shown fingerprint, which the apply compares with); and once
    /// merged (`landed`), the apply job's verdicts on the merged commit that the note does not
    /// show (the newest plan it checked per root).
    async fn verdicts(
        &self,
        landed: Option<&CommitSha>,
    ) -> Result<(Vec<PolicyVerdictRecord>, Vec<PolicyVerdictRecord>)> {
        let (store, project, mr, head) = (&self.app.store, self.project, self.mr, self.head);
        let mut shown = Vec::new();
        for v in store.policy_verdicts(project, mr, head).await? {
            let current = store
                .fingerprint_for(project, mr, &v.root, head.clone())
                .await?;
            if current.is_some_and(|c| c.fingerprint == v.fingerprint) {
                shown.push(v);
            }
        }
        let mut checked_at_apply = Vec::new();
        if let Some(landed) = landed {
            checked_at_apply = store.policy_verdicts(project, mr, landed).await?;
            checked_at_apply.retain(|v| !shown.contains(v));
        }
        Ok((shown, checked_at_apply))
    }

    /// Each failing set of `verdicts` the author owns, approved (recorded); and those still
    /// waiting for another owner.
    async fn owned_sets(
        &self,
        verdicts: impl Iterator<Item = &PolicyVerdictRecord>,
    ) -> Result<(Vec<Waiting>, Vec<Waiting>)> {
        let app = self.app;
        let approvals = app.store.policy_approvals(self.project, self.mr).await?;
        let (mut approved, mut waiting) = (Vec::new(), Vec::new());
        for v in verdicts {
            let ok = PolicyApproval::sets_for(&approvals, &v.root, &v.sha, &v.fingerprint);
            for set in v.verdict.blocking() {
                let entry = Waiting {
                    root: v.root.clone(),
                    set: set.name.clone(),
                    owners: set.owners.clone(),
                    at: (&v.sha != self.head).then(|| v.sha.short().to_string()),
                };
                if owns(app, &set.owners, self.author, &self.username).await? {
                    app.store
                        .record_policy_approval(PolicyApproval {
                            project: self.project,
                            mr: self.mr,
                            root: v.root.clone(),
                            sha: v.sha.clone(),
                            fingerprint: v.fingerprint.clone(),
                            set: set.name.clone(),
                            approver_id: self.author,
                            approver: self.username.clone(),
                            approved_at: 0,
                        })
                        .await?;
                    approved.push(entry);
                } else if !ok.contains(&set.name.as_str()) {
                    waiting.push(entry);
                }
            }
        }
        Ok((approved, waiting))
    }

    /// After an approval: `planbot/policy` again from the `shown` verdicts and every approval,
    /// and the plan note marked approved once nothing waits ([`mark_approved`]; a failure to
    /// edit it is logged).
    async fn show_approved(&self, shown: Vec<PolicyVerdictRecord>) -> Result<()> {
        let (app, project, mr, head) = (self.app, self.project, self.mr, self.head);
        let approvals = app.store.policy_approvals(project, mr).await?;
        let verdicts: Vec<(String, Fingerprint, RecordedVerdict)> = shown
            .into_iter()
            .map(|v| (v.root, v.fingerprint, v.verdict))
            .collect();
        set_status(app, project, head, None, &verdicts, &approvals).await;
        if let Err(e) = mark_approved(app, project, mr, head, &verdicts, &approvals).await {
            tracing::warn!(project = project.0, mr = mr.0, error = %format!("{e:#}"), "could not mark the approval on the plan note");
        }
        Ok(())
    }
}

/// Once no failing set of the plans shown for `head` waits for an owner (`verdicts`, with the
/// MR's `approvals`), the plan note says what its statuses say: each failing set approved,
/// nothing waiting, a banner naming the approvals, and no red headline unless the plans
/// themselves failed ([`crate::core::render::approved::approved_note`]). While a set still
/// waits the note is left as it is (it says so already). The edit is the note's newest: an
/// approval written before it is refused as written on another note (fail closed).
async fn mark_approved(
    app: &App,
    project: ProjectId,
    mr: MrIid,
    head: &CommitSha,
    verdicts: &[(String, Fingerprint, RecordedVerdict)],
    approvals: &[PolicyApproval],
) -> Result<()> {
    let mut approvers: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (root, fingerprint, v) in verdicts {
        let ok = PolicyApproval::sets_for(approvals, root, head, fingerprint);
        if v.first_unapproved(&ok).is_some() {
            return Ok(());
        }
        for set in v.blocking() {
            let names = approvers.entry(set.name.clone()).or_default();
            for a in approvals.iter().filter(|a| {
                &a.root == root
                    && &a.sha == head
                    && &a.fingerprint == fingerprint
                    && a.set == set.name
            }) {
                if !names.contains(&a.approver) {
                    names.push(a.approver.clone());
                }
            }
        }
    }
    if approvers.is_empty() {
        return Ok(());
    }
    let Some(note) = app
        .planbot_note(project, mr, crate::core::render::NOTE_MARKER)
        .await?
    else {
        return Ok(());
    };
    let runs = app.store.runs_for_mr(project, mr).await?;
    let plans: Vec<_> = runs
        .iter()
        .filter(|r| r.kind == crate::capabilities::store::RunKind::Plan && &r.sha == head)
        .map(|r| r.state)
        .collect();
    let plans_ok = !plans.is_empty()
        && plans
            .iter()
            .all(|s| *s == crate::capabilities::store::RunState::Succeeded);
    let body = crate::core::templates::scrubbing(&app.scrubber, || {
        crate::core::render::approved::approved_note(&note.body, head.short(), &approvers, plans_ok)
    });
    if body != note.body {
        app.gitlab
            .edit_mr_note(project, mr, note.id, &body)
            .await
            .inspect_err(|_| app.metrics.gitlab_error("edit_mr_note"))
            .context("editing the plan note")?;
    }
    Ok(())
}

/// `Some(when the plan note was last edited)` when it was edited at or after the comment was
/// written (`written_at`, unix ms), or when either time is unknown (the event said none, the note
/// is gone or GitLab gave no time): the owner cannot be shown to have read what is recorded
/// now. A second-precision `created_at` counts from the start of its second, so a note edited
/// in the same second refuses too.
async fn plan_changed_since(
    app: &App,
    project: ProjectId,
    mr: MrIid,
    written_at: Option<i64>,
) -> Result<Option<Option<String>>> {
    let note = app
        .planbot_note(project, mr, crate::core::render::NOTE_MARKER)
        .await?;
    let edited = note.and_then(|n| n.updated_at);
    let edited_ms = edited
        .as_deref()
        .and_then(crate::core::events::gitlab_time_ms);
    Ok(match (written_at, edited_ms) {
        (Some(written), Some(edited_ms)) if edited_ms < written => None,
        _ => Some(edited),
    })
}

/// The reply to `planbot approve policies` when the head's plan note changed after the comment
/// was written (`edited`: when, as GitLab says): nothing is recorded.
pub(crate) fn replanned_reply(
    username: &str,
    head: &CommitSha,
    edited: Option<&str>,
) -> Result<String> {
    let body = crate::core::templates::render(
        "comments/policy_approval.md.j2",
        context! {
            kind => "reply_replanned",
            username => username,
            sha => head.short(),
            edited => edited,
        },
    )?;
    Ok(body.trim_end().to_string() + "\n")
}

/// The reply to `planbot approve policies` when the MR is no longer at the head the comment
/// was made on (`commented`; `None`: the event named no head): nothing is recorded.
pub(crate) fn moved_reply(
    username: &str,
    commented: Option<&CommitSha>,
    head: &CommitSha,
) -> Result<String> {
    let body = crate::core::templates::render(
        "comments/policy_approval.md.j2",
        context! {
            kind => "reply_moved",
            username => username,
            commented => commented.map(|c| c.short().to_string()),
            sha => head.short(),
        },
    )?;
    Ok(body.trim_end().to_string() + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_replies_render() {
        let head = CommitSha("2222bbbb".repeat(5));
        let moved = [
            moved_reply("carol", Some(&CommitSha("1111aaaa".repeat(5))), &head).unwrap(),
            moved_reply("carol", None, &head).unwrap(),
        ];
        insta::assert_snapshot!("approval_moved", moved.join("\n"));
        let replanned = [
            replanned_reply("carol", &head, Some("2026-12-06T00:51:02.123Z")).unwrap(),
            replanned_reply("carol", &head, None).unwrap(),
        ];
        insta::assert_snapshot!("approval_replanned", replanned.join("\n"));
        let at_apply = crate::core::templates::render(
            "comments/policy_approval.md.j2",
            context! {
                kind => "reply_approved",
                username => "carol",
                sha => head.short(),
                approved => vec![Waiting {
                    root: "core2".into(),
                    set: "new-vms".into(),
                    owners: vec![Owner::Group("infra/capacity".into())],
                    at: Some("3333cccc".into()),
                }],
                waiting => vec![Waiting {
                    root: "core2".into(),
                    set: "sizes".into(),
                    owners: vec![Owner::User("dana".into())],
                    at: Some("3333cccc".into()),
                }],
            },
        )
        .unwrap();
        insta::assert_snapshot!("approval_at_apply", at_apply);
    }
}
