//! Apply stage 4's first check, before any engine runs: what the apply waits for besides its
//! plans, as the default branch's `.planbot.toml` says under `[apply]` (the stricter of before
//! the merge and after it: an MR cannot loosen them for itself): GitLab's deploy freezes
//! (`deploy_freezes`, on unless turned off), then the merged merge request's approvals
//! (`approvals`, none unless asked for).

use super::ctx::ApplyCtx;
use crate::capabilities::gitlab::{GitLabError, MergeRequest};
use crate::core::apply::ApplyRefusal;
use crate::core::approvals::{self, Approver, Judged};
use crate::core::freeze;

/// The most pages of 100 notes read to find when each approver approved.
const NOTE_PAGES: u32 = 10;

/// Why the apply must not run now, when it must not: a deploy freeze holds, or the merged
/// merge request lacks the approvals the apply waits for; or either could not be told
/// (GitLab's answer, something planbot cannot read): refused, never applied on a guess.
pub(super) async fn held(ctx: &ApplyCtx) -> Option<ApplyRefusal> {
    if let Some(refusal) = frozen(ctx).await {
        return Some(refusal);
    }
    unapproved(ctx).await
}

/// A deploy freeze holds, or whether one holds could not be told.
async fn frozen(ctx: &ApplyCtx) -> Option<ApplyRefusal> {
    if !ctx.apply.deploy_freezes {
        return None;
    }
    let periods = match ctx.app.gitlab.freeze_periods(ctx.project).await {
        Ok(p) => p,
        Err(e) => {
            ctx.app.metrics.gitlab_error("freeze_periods");
            return Some(ApplyRefusal::FreezeUnknown {
                why: ctx.app.scrubber.scrub(&e.to_string()).into_owned(),
            });
        }
    };
    match freeze::holding(&periods, chrono::Utc::now()) {
        Ok(None) => None,
        Ok(Some(frozen)) => Some(ApplyRefusal::DeployFreeze {
            start: frozen.period.freeze_start,
            end: frozen.period.freeze_end,
            zone: frozen.period.cron_timezone,
            ends: frozen.ends_local,
        }),
        Err(e) => Some(ApplyRefusal::FreezeUnknown { why: e.to_string() }),
    }
}

/// `[apply] approvals = N`: the merged merge request lacks N approvals that count
/// (`core::approvals`), no merge request landed the commit, or GitLab could not tell.
async fn unapproved(ctx: &ApplyCtx) -> Option<ApplyRefusal> {
    let needed = ctx.apply.approvals;
    if needed == 0 {
        return None;
    }
    let Some(mr) = ctx.mr.as_ref() else {
        return Some(ApplyRefusal::ApprovalsWithoutMr { needed });
    };
    match judge_approvals(ctx, mr, needed).await {
        Ok(judged) if judged.enough() => None,
        Ok(judged) => Some(ApplyRefusal::ApprovalsMissing {
            mr: mr.iid.0,
            needed,
            counted: judged.counted,
            last_push: judged.last_push,
            approvals: judged.approvals,
        }),
        Err(why) => Some(ApplyRefusal::ApprovalsUnknown {
            mr: mr.iid.0,
            why: ctx.app.scrubber.scrub(&why).into_owned(),
        }),
    }
}

/// The merge request's approvals as GitLab has them now, judged: who approves it, when each
/// approved (their approval notes, newest first, read only until every approver's is found),
/// its last push (its newest diff version), and the role of each approver whose role decides.
async fn judge_approvals(ctx: &ApplyCtx, mr: &MergeRequest, needed: u32) -> Result<Judged, String> {
    let (gitlab, project, iid) = (&ctx.app.gitlab, ctx.project, mr.iid);
    let failed = |call: &'static str| {
        move |e: GitLabError| {
            ctx.app.metrics.gitlab_error(call);
            e.to_string()
        }
    };
    let author = mr
        .author
        .as_ref()
        .map(|a| a.id)
        .ok_or_else(|| format!("GitLab does not say who wrote merge request !{iid}"))?;
    let users = gitlab
        .mr_approvers(project, iid)
        .await
        .map_err(failed("mr_approvers"))?;
    let versions = gitlab
        .mr_diff_versions(project, iid)
        .await
        .map_err(failed("mr_diff_versions"))?;
    let last_push = approvals::last_push(versions.iter().map(|v| v.created_at.as_deref()))?;
    let found = |notes: &[crate::capabilities::gitlab::Note]| {
        let at = approvals::approved_at(notes.iter().filter_map(note_fact));
        users.iter().all(|u| at.contains_key(&u.id))
    };
    let notes = if users.is_empty() {
        Vec::new()
    } else {
        gitlab
            .newest_mr_notes(project, iid, NOTE_PAGES, found)
            .await
            .map_err(failed("mr_notes"))?
            .0
    };
    let at = approvals::approved_at(notes.iter().filter_map(note_fact));
    let mut approvers = Vec::with_capacity(users.len());
    for u in users {
        let mut a = Approver {
            id: u.id,
            username: u.username,
            approved_at: at.get(&u.id).copied(),
            access: None,
        };
        if approvals::needs_role(author, last_push, &a) {
            a.access = gitlab
                .member_access(project, a.id)
                .await
                .map_err(failed("member_access"))?
                .map(|l| l.0);
        }
        approvers.push(a);
    }
    Ok(approvals::judge(needed, author, last_push, &approvers))
}

/// A note as `core::approvals` reads it: system or not, body, author, when written.
fn note_fact(
    n: &crate::capabilities::gitlab::Note,
) -> Option<(bool, &str, crate::core::ids::UserId, &str)> {
    Some((
        n.system,
        n.body.as_str(),
        n.author.as_ref()?.id,
        n.created_at.as_deref()?,
    ))
}
