//! Apply stage 4's first check, before any engine runs: what the apply waits for besides its
//! plans, as the default branch's `.planbot.toml` says under `[apply]`: GitLab's deploy freezes
//! (`deploy_freezes`, on unless turned off).

use super::ctx::ApplyCtx;
use crate::core::apply::ApplyRefusal;
use crate::core::freeze;

/// Why the apply must not run now, when it must not: a deploy freeze holds, or whether one
/// holds could not be told (GitLab's answer, a period planbot cannot read): refused, never
/// applied on a guess.
pub(super) async fn held(ctx: &ApplyCtx) -> Option<ApplyRefusal> {
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
