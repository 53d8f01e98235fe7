//! Rails for a team (issue 44): what an apply of `main` waits for besides its reviewed plan.
//! GitLab's deploy freezes hold it (Settings → CI/CD → Deploy freezes), unless the default
//! branch's `.planbot.toml` says `[apply] deploy_freezes = false`.
//! And `[apply] approvals = N` has it wait for N approvals of the merged merge request by
//! Developers or above other than its author, each given after its last push.

use crate::apply_story::vms_mr;
use crate::support::service::TestService;
use crate::support::world::{log_shows, verdict, with_workers, World};

/// A freeze that holds now and until next New Year: it started at the last minute's start and
/// ends on 1 January at 00:00 (UTC).
fn freeze_until_new_year(w: &World) {
    w.gitlab
        .add_freeze_period(&w.project, "* * * * *", "0 0 1 1 *", "UTC");
}

/// New Year after now, as planbot says it (`YYYY-01-01 00:00 UTC`).
fn next_new_year() -> String {
    use chrono::Datelike;
    format!("{}-01-01 00:00 UTC", chrono::Utc::now().year() + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_during_a_deploy_freeze_is_refused_naming_it_unless_the_repository_opts_out() {
    let engine = require_engine!();
    for (toml, held) in [("", true), ("[apply]\ndeploy_freezes = false\n", false)] {
        let w = World::homelab(&engine).planbot_toml(toml).build();
        let s = TestService::start(w.config.clone(), with_workers()).await;
        freeze_until_new_year(&w);
        let iid = vms_mr(&w, &s, "add-gitlab-vm", &["blocky", "gitlab"]).await;
        w.wait_for_plan(&s, iid).await;
        let log = w.merge_and_apply(&s, iid, 51).await;
        let landed = w.head("main");
        let state = w.state("core").unwrap_or_default();
        if !held {
            assert_eq!(verdict(&log), "planbot: apply succeeded", "{log}");
            assert!(state.contains("\"gitlab\""), "{state}");
            continue;
        }
        let why = format!(
            "a deploy freeze holds: from `* * * * *` to `0 0 1 1 *` (UTC), until {}",
            next_new_year()
        );
        assert_eq!(
            verdict(&log),
            format!("planbot: apply refused: {why}"),
            "{log}"
        );
        assert!(
            log.contains(&format!(
                "Run this job again after {} (Settings → CI/CD → Deploy freezes); nothing was applied.",
                next_new_year()
            )),
            "{log}"
        );
        assert!(!log.contains("planning"), "no engine ran: {log}");
        assert_eq!(
            w.status_says(&landed, "planbot/apply"),
            format!("failed: not applied: {why}")
        );
        assert!(!state.contains("\"gitlab\""), "nothing applied: {state}");
    }
}

/// What happens on the merge request before it is merged, in the approvals story.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Approved {
    /// No one approves it.
    ByNoOne,
    /// Its author, alice, approves it.
    ByTheAuthor,
    /// bob (a Developer) approves it, then alice pushes again.
    BeforeThePush,
    /// alice pushes again, then bob approves it.
    AfterThePush,
    /// As `AfterThePush`, but GitLab refuses to list the approvals when the apply asks.
    UnreadAtTheApply,
}

/// A time GitLab wrote (`2026-01-01T00:01:52.000Z`) as planbot says it.
fn shown(gitlab_time: &str) -> String {
    let t = chrono::DateTime::parse_from_rfc3339(gitlab_time).unwrap();
    t.with_timezone(&chrono::Utc)
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string()
}

/// What the plan note says above the plans when `[apply] approvals = 1`.
const WAITS: &str = "_The apply of this merge request waits for 1 approval by a Developer or \
                     above other than its author, given after its last push._";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_waits_for_an_approval_by_another_developer_given_after_the_last_push() {
    use crate::support::fake_gitlab::DEVELOPER;
    let engine = require_engine!();
    for case in [
        Approved::ByNoOne,
        Approved::ByTheAuthor,
        Approved::BeforeThePush,
        Approved::AfterThePush,
        Approved::UnreadAtTheApply,
    ] {
        let w = World::homelab(&engine)
            .member("bob", DEVELOPER)
            .planbot_toml("[apply]\napprovals = 1\n")
            .build();
        let s = TestService::start(w.config.clone(), with_workers()).await;
        let iid = vms_mr(&w, &s, "add-gitlab-vm", &["blocky", "gitlab"]).await;
        w.wait_for_plan(&s, iid).await;
        let bob_approved = (case == Approved::BeforeThePush)
            .then(|| w.gitlab.approve(&w.project, iid, &w.user("bob")));
        let main_tf = crate::support::infra_main_tf(&["blocky", "gitlab", "dns"]);
        w.push(&s, iid, "add-gitlab-vm", &[("main.tf", &main_tf)])
            .await;
        let note = w.wait_for_plan(&s, iid).await;
        match case {
            Approved::ByTheAuthor => w.approve(iid, "alice"),
            Approved::AfterThePush | Approved::UnreadAtTheApply => w.approve(iid, "bob"),
            _ => {}
        }
        if case == Approved::UnreadAtTheApply {
            w.gitlab.fail_next(
                "GET /api/v4/projects/{id}/merge_requests/{iid}/approvals",
                1,
                403,
            );
        }
        let last_push = shown(&w.gitlab.last_push(&w.project, iid));
        let log = w.merge_and_apply(&s, iid, 51).await;
        let landed = w.head("main");
        let state = w.state("core").unwrap_or_default();
        if case == Approved::AfterThePush {
            assert_eq!(verdict(&log), "planbot: apply succeeded", "{log}");
            assert!(state.contains("\"dns\""), "{state}");
            assert!(
                w.status_says(&landed, "planbot/apply")
                    .starts_with("success"),
                "{case:?}"
            );
            assert_eq!(w.notes_containing(iid, "planbot · applied").len(), 1);
            assert!(note.contains(WAITS), "{note}");
            continue;
        }
        let who = match case {
            Approved::ByNoOne => "no one approved it".to_string(),
            Approved::ByTheAuthor => "alice (the author) does not count".to_string(),
            Approved::UnreadAtTheApply => String::new(),
            _ => format!(
                "bob approved at {}, before it",
                shown(&w.gitlab.time(bob_approved.unwrap()))
            ),
        };
        let why = if case == Approved::UnreadAtTheApply {
            // A check that guards the apply and cannot run refuses it (fail closed).
            format!(
                "planbot could not tell whether merge request !{iid} has the approvals the \
                 apply waits for: GitLab answered 403 Forbidden (the token lacks the role or \
                 scope)"
            )
        } else {
            format!(
                "merge request !{iid} needs 1 approval from a Developer or above other than \
                 its author, given after its last push ({last_push}): {who}"
            )
        };
        assert_eq!(
            verdict(&log),
            format!("planbot: apply refused: {why}"),
            "{case:?}: {log}"
        );
        log_shows(&log, &["Nothing was applied."]);
        assert!(!log.contains("planning"), "no engine ran: {log}");
        assert_eq!(
            w.status_says(&landed, "planbot/apply"),
            format!("failed: not applied: {why}"),
            "{case:?}"
        );
        // The apply's note on the merge request says it; the plan note said what it waits for.
        assert_eq!(w.notes_containing(iid, &why).len(), 1, "{case:?}");
        assert!(note.contains(WAITS), "{note}");
        assert!(!state.contains("\"gitlab\""), "nothing applied: {state}");
    }
}

/// An MR cannot loosen `[apply]` for its own apply: one that lowers `approvals` from 1 to 0 and
/// turns deploy freezes off, merged without an approval during a freeze, is refused by the
/// default branch's settings before the merge (the stricter of before and after holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mr_cannot_loosen_apply_settings_for_its_own_apply() {
    let engine = require_engine!();
    let w = World::homelab(&engine)
        .planbot_toml("[apply]\napprovals = 1\n")
        .build();
    let s = TestService::start(w.config.clone(), with_workers()).await;
    let main_tf = crate::support::infra_main_tf(&["blocky", "gitlab"]);
    let loosened = "[apply]\napprovals = 0\ndeploy_freezes = false\n";
    let iid = w
        .open_mr(
            &s,
            "loosen",
            &[("main.tf", main_tf.as_str()), (".planbot.toml", loosened)],
        )
        .await;
    w.wait_for_plan(&s, iid).await;
    let log = w.merge_and_apply(&s, iid, 61).await;
    assert!(
        verdict(&log).starts_with(&format!(
            "planbot: apply refused: merge request !{iid} needs 1 approval from a Developer or above other than its author"
        )),
        "{log}"
    );
    assert!(!w.state("core").unwrap_or_default().contains("\"gitlab\""));

    // The freezes too: turned off by the MR, they still hold its apply.
    let w = World::homelab(&engine).build();
    let s = TestService::start(w.config.clone(), with_workers()).await;
    freeze_until_new_year(&w);
    let iid = w
        .open_mr(
            &s,
            "unfreeze",
            &[("main.tf", main_tf.as_str()), (".planbot.toml", loosened)],
        )
        .await;
    w.wait_for_plan(&s, iid).await;
    let log = w.merge_and_apply(&s, iid, 62).await;
    assert!(
        verdict(&log).starts_with("planbot: apply refused: a deploy freeze holds"),
        "{log}"
    );
}
