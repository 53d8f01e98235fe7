//! Plan reuse across pushes (docs/workflow.md, "Plans reused across pushes"): the last plan of
//! each root of each open MR, kept in this replica's memory, so that a push that does not reach
//! a root shows that root's plan again instead of planning it anew. Only the plan as shown is
//! kept ([`ShownPlan`]: no plan file, no sandbox), bounded in entries and bytes, and never
//! written anywhere; a reused plan is still planned again and compared at apply time.
//!
//! Whether a root's plan may be reused is decided by the plan flow
//! (`flows::review::plan::reuse`): the changes between the two commits do not reach it
//! (`core::reach`, as for any change) and every [`Unchanged`] input is equal.

use crate::capabilities::engine::ShownPlan;
use crate::core::engine_checks::RootChecks;
use crate::core::fingerprint::Fingerprint;
use crate::core::ids::{CommitSha, MrIid, ProjectId};
use crate::core::policy::Verdict;
use crate::core::proxmox::capacity::Capacity;
use crate::core::proxmox::findings::Finding;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// At most this many plans are kept (the least recently used go first).
pub const MAX_ENTRIES: usize = 512;

/// At most this many bytes of plan JSON and logs are kept.
pub const MAX_BYTES: usize = 256 * 1024 * 1024;

/// What must be equal for a plan to be reused, besides the changes not reaching its root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unchanged {
    /// The target branch's and the default branch's heads (the merge result, the config and
    /// the policy sets come from them).
    pub target_head: CommitSha,
    pub default_head: CommitSha,
    /// The root's entry in `.planbot.toml`, as planbot read it.
    pub entry: String,
    /// The engine's version line.
    pub engine: String,
    /// The flags a comment asked for at the head (empty: the full plan).
    pub targeting: String,
    /// The serial of the root's GitLab-managed state (`None`: not written yet); an apply, a
    /// drift fix or an import changes it.
    pub state_serial: Option<u64>,
}

/// One root's plan as the note showed it, with what the note and the status need of it.
pub struct Reusable {
    /// The commit planned (the merge result or the head).
    pub planned_commit: CommitSha,
    /// The MR head it was planned for (the note names it).
    pub head: CommitSha,
    pub unchanged: Unchanged,
    pub planned: Arc<ShownPlan>,
    pub findings: Vec<Finding>,
    pub fingerprint: Fingerprint,
    pub policy: Option<Verdict>,
    pub checks: RootChecks,
    pub capacity: Option<Capacity>,
    pub preflight_note: String,
}

type Key = (ProjectId, MrIid, String);

/// The kept plans, one per root of an MR (the last).
#[derive(Default)]
pub struct PlanReuse {
    inner: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    entries: BTreeMap<Key, (u64, Arc<Reusable>)>,
    bytes: usize,
    tick: u64,
}

impl PlanReuse {
    /// The last plan of `root` of the MR, when one is kept.
    pub fn last(&self, project: ProjectId, mr: MrIid, root: &str) -> Option<Arc<Reusable>> {
        let mut kept = self.lock();
        kept.tick += 1;
        let tick = kept.tick;
        let entry = kept.entries.get_mut(&(project, mr, root.to_string()))?;
        entry.0 = tick;
        Some(entry.1.clone())
    }

    /// Keep `plan` as the last plan of `root` of the MR (replacing the one before), then drop
    /// the least recently used until both bounds hold.
    pub fn keep(&self, project: ProjectId, mr: MrIid, root: &str, plan: Arc<Reusable>) {
        let mut kept = self.lock();
        kept.tick += 1;
        let (tick, weight) = (kept.tick, plan.planned.weight());
        if let Some((_, old)) = kept
            .entries
            .insert((project, mr, root.to_string()), (tick, plan))
        {
            kept.bytes -= old.planned.weight();
        }
        kept.bytes += weight;
        while kept.entries.len() > MAX_ENTRIES || kept.bytes > MAX_BYTES {
            let Some(oldest) = kept
                .entries
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((_, gone)) = kept.entries.remove(&oldest) {
                kept.bytes -= gone.planned.weight();
            }
        }
    }

    /// Forget every plan of the MR (it was closed or merged).
    pub fn forget(&self, project: ProjectId, mr: MrIid) {
        let mut kept = self.lock();
        let gone: Vec<Key> = kept
            .entries
            .keys()
            .filter(|(p, m, _)| *p == project && *m == mr)
            .cloned()
            .collect();
        for key in gone {
            if let Some((_, plan)) = kept.entries.remove(&key) {
                kept.bytes -= plan.planned.weight();
            }
        }
    }

    /// How many plans are kept, and their bytes.
    pub fn size(&self) -> (usize, usize) {
        let kept = self.lock();
        (kept.entries.len(), kept.bytes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(bytes: usize, head: &str) -> Arc<Reusable> {
        let sha = CommitSha(head.repeat(40));
        Arc::new(Reusable {
            planned_commit: sha.clone(),
            head: sha.clone(),
            unchanged: Unchanged {
                target_head: sha.clone(),
                default_head: sha,
                entry: String::new(),
                engine: String::new(),
                targeting: String::new(),
                state_serial: None,
            },
            planned: Arc::new(ShownPlan::of_size(bytes)),
            findings: Vec::new(),
            fingerprint: Fingerprint::from_hex(&"a".repeat(64)).unwrap(),
            policy: None,
            checks: RootChecks::default(),
            capacity: None,
            preflight_note: String::new(),
        })
    }

    #[test]
    fn one_plan_per_root_the_least_recently_used_go_first_and_a_closed_mr_is_forgotten() {
        let (p, mr) = (ProjectId(1), MrIid(7));
        let kept = PlanReuse::default();
        kept.keep(p, mr, "a", plan(10, "a"));
        kept.keep(p, mr, "a", plan(20, "b"));
        assert_eq!(
            kept.size(),
            (1, 20),
            "the last plan of a root replaces the one before"
        );
        assert_eq!(kept.last(p, mr, "a").unwrap().head.as_str(), "b".repeat(40));
        for i in 0..MAX_ENTRIES + 5 {
            kept.keep(p, MrIid(100 + i as u64), "r", plan(1, "c"));
            if i % 100 == 0 {
                // Used again: not among the least recently used.
                kept.last(p, mr, "a");
            }
        }
        assert_eq!(kept.size().0, MAX_ENTRIES);
        assert!(kept.last(p, mr, "a").is_some());
        assert!(kept.last(p, MrIid(101), "r").is_none(), "among the oldest");
        kept.keep(p, MrIid(1), "big", plan(MAX_BYTES, "d"));
        assert!(kept.size().1 <= MAX_BYTES);
        kept.forget(p, MrIid(1));
        assert!(kept.last(p, MrIid(1), "big").is_none());
    }
}
