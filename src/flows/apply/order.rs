//! The apply's dependency order (docs/workflow.md, "Several roots"): the roots upstream first
//! ([`dependency_order`]), which roots an upstream's failure or refusal stops ([`Stops`]), and
//! the re-plan of a dependent after its upstream applied ([`replan`]).
//!
//! A dependent was planned and checked against the review with every other root before
//! anything applied ([`super::parity::plan_and_decide`]); once an upstream it depends on has
//! applied, it is planned again, against the upstream's new outputs, and decided again by the
//! same decision ([`super::decide`]), the plan checked before as its `checked` plan: applied
//! when it is the reviewed plan (or confirmed), or when it differs from the checked plan only in
//! values the checked plan showed as "known after apply" ([`crate::core::replan`]); anything
//! else is refused as a changed plan.

use super::ctx::ApplyCtx;
use super::decide::{decide_root, CheckedPlan, Decided, Outcome};
use super::log::ApplyFailure;
use crate::core::apply_note::Relied;
use crate::core::repo_config::{RepoConfig, Root};
use minijinja::context;
use std::collections::BTreeMap;

/// The roots of the apply in dependency order, each with the roots it depends on directly and
/// transitively (by name; not all of them need be roots of this apply).
pub(super) struct Order<'a> {
    pub roots: Vec<&'a Root>,
    upstreams: BTreeMap<String, Vec<String>>,
    above: BTreeMap<String, Vec<String>>,
}

impl<'a> Order<'a> {
    /// The roots `root` depends on directly.
    pub fn upstreams(&self, root: &str) -> &[String] {
        self.upstreams.get(root).map_or(&[], Vec::as_slice)
    }

    /// The roots `root` depends on, directly or not.
    pub fn above(&self, root: &str) -> &[String] {
        self.above.get(root).map_or(&[], Vec::as_slice)
    }

    /// The roots a merge retires, last (every other root applies first, and may stop reading
    /// them), each with no upstream; a root of the same name is theirs.
    pub fn with_retired(mut self, retired: &'a [Root]) -> Order<'a> {
        self.roots
            .retain(|r| !retired.iter().any(|gone| gone.name == r.name));
        self.roots.extend(retired.iter());
        self
    }

    pub fn root(&self, name: &str) -> &Root {
        self.roots
            .iter()
            .find(|r| r.name == name)
            .expect("every decided root is in the order")
    }
}

/// The roots this apply asked for (`only`: by name; empty: all), upstream roots first
/// (`depends_on`; among roots with no path between them, the config's order), each with what
/// it depends on directly and transitively.
pub(super) fn dependency_order<'a>(config: &'a RepoConfig, only: &[String]) -> Order<'a> {
    let graph = config.graph();
    let asked = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let roots: Vec<&Root> = graph
        .order()
        .into_iter()
        .filter(|name| asked(name))
        .filter_map(|name| config.roots.iter().find(|r| r.name == name))
        .collect();
    let names = |list: Vec<&str>| list.into_iter().map(str::to_string).collect::<Vec<_>>();
    Order {
        upstreams: roots
            .iter()
            .map(|r| (r.name.clone(), names(graph.depends_on(&r.name))))
            .collect(),
        above: roots
            .iter()
            .map(|r| (r.name.clone(), names(graph.upstream_of(&r.name))))
            .collect(),
        roots,
    }
}

/// How a root that did not apply stops the roots below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum How {
    Failed,
    Refused,
}

impl How {
    fn name(&self) -> &'static str {
        match self {
            How::Failed => "failed",
            How::Refused => "refused",
        }
    }
}

/// The roots this apply did not get to, each with the root whose failure or refusal stopped it
/// (the first cause up its dependencies) and the root below that cause it came through.
#[derive(Default)]
pub(super) struct Stops {
    /// Root → (cause, how the cause ended). A cause is its own entry's cause.
    stopped: BTreeMap<String, (String, How)>,
}

/// Why a root is not applied because of an upstream.
pub(super) struct Stopped {
    pub cause: String,
    pub how: How,
    /// The direct upstream it came through, when that is not the cause itself.
    pub via: Option<String>,
}

impl Stops {
    /// `root` failed or was refused: it stops the roots below it.
    pub fn ended(&mut self, root: &str, how: How) {
        self.stopped
            .insert(root.to_string(), (root.to_string(), how));
    }

    /// Whether one of `upstreams` (a root's direct upstreams, in order) stops it, and why.
    pub fn stopping(&self, upstreams: &[String]) -> Option<Stopped> {
        upstreams.iter().find_map(|up| {
            self.stopped.get(up).map(|(cause, how)| Stopped {
                cause: cause.clone(),
                how: how.clone(),
                via: (cause != up).then(|| up.clone()),
            })
        })
    }

    /// Record that `root` was stopped, so the roots below it are too.
    pub fn stop(&mut self, root: &str, why: &Stopped) {
        self.stopped
            .insert(root.to_string(), (why.cause.clone(), why.how.clone()));
    }

    pub fn is_empty(&self) -> bool {
        self.stopped.is_empty()
    }
}

impl Stopped {
    /// A stopped root's text: in the job's log, on its run, in the note and the status.
    pub fn text(&self, ctx: &ApplyCtx) -> String {
        ctx.say(
            "upstream_stopped",
            context! { cause => &self.cause, how => self.how.name(), via => &self.via },
        )
    }
}

/// Plan `d`'s root again now that `upstream` (one it depends on) has applied, and decide
/// again, with the plan checked before: `d` then holds the new decision (a plan to apply, none,
/// or its refusal), and the policy reliances it said are returned. `Err`: the re-plan failed
/// (its run ended; `d` has nothing to apply).
pub(super) async fn replan(
    ctx: &ApplyCtx,
    d: &mut Decided,
    root: &Root,
    confirm: Option<&str>,
    upstream: &str,
) -> Result<Vec<Relied>, ApplyFailure> {
    ctx.log.say(
        "replanning",
        context! { root => &root.name, upstream => upstream },
    );
    let (checked, guard) = match std::mem::replace(&mut d.outcome, Outcome::Nothing) {
        Outcome::Apply {
            planned,
            confirmed,
            guard,
        } => (Some((planned, confirmed)), guard),
        _ => (None, ctx.lock_root(root).await),
    };
    let checked = checked.as_ref().map(|(plan, confirmed)| CheckedPlan {
        plan,
        confirmed: *confirmed,
        upstream,
    });
    let mut again = decide_root(ctx, root, d.run, guard, confirm, checked).await?;
    let relied = std::mem::take(&mut again.relied);
    again.plan_log = format!("{}\n{}", d.plan_log, again.plan_log);
    *d = again;
    Ok(relied)
}
