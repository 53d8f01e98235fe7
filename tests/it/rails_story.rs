//! Rails for a team (issue 44): what an apply of `main` waits for besides its reviewed plan.
//! GitLab's deploy freezes hold it (Settings → CI/CD → Deploy freezes), unless the default
//! branch's `.planbot.toml` says `[apply] deploy_freezes = false`.

use crate::apply_story::vms_mr;
use crate::support::service::TestService;
use crate::support::world::{verdict, with_workers, World};

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
