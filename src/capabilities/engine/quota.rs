//! The disk quota of a plan run: the directories it may write on disk — the checkout, its
//! plan-file directory and the MR's plugin cache — hold at most `max` bytes together.
//!
//! No unprivileged way gives one job a filesystem of its own that outlives each engine
//! process (a tmpfs mounted in a process's namespace is gone when `init` exits, and `plan`
//! needs what `init` wrote), so the quota is kept by accounting: while a step runs, planbot
//! adds up what those directories hold every [`EVERY`], and past `max` the step's process
//! group is killed at once and the run fails saying so. Each file is also capped at `max`
//! (`RLIMIT_FSIZE`), so what is written between two looks is bounded by what the disk writes
//! in that time, never by the size of one file. Each entry counts at least [`ENTRY_MIN`]
//! bytes: a million empty files fill a quota as surely as one large one, and the count stops
//! as soon as it passes `max`, so counting costs at most `max / ENTRY_MIN` entries.
//!
//! The runs of one job plan side by side in one checkout, and each counts the whole checkout:
//! so what the checkout (and the plugin cache) held is counted once per [`EVERY`] for all of
//! them ([`SharedCount`]), not once per running step. N roots planned four at a time would
//! otherwise walk an N-root checkout several times per root: a cost that grows with N².

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often a running step's directories are added up.
pub(super) const EVERY: Duration = Duration::from_millis(200);

/// What one entry (file, directory, link) counts at the least: its inode and directory entry.
pub(super) const ENTRY_MIN: u64 = 4096;

/// The directories of one run that count against its quota, and the quota.
#[derive(Debug, Clone)]
pub(super) struct Quota {
    /// The checkout and the plugin cache: counted for every run in them together.
    pub(super) shared: Arc<SharedCount>,
    /// The run's own directories (its plan-file directory).
    pub(super) own: Vec<PathBuf>,
    pub(super) max: u64,
}

impl Quota {
    /// Whether the directories hold more than `max` (blocks allocated, [`ENTRY_MIN`] at the
    /// least per entry; symbolic links are not followed). The shared directories' count is at
    /// most [`EVERY`] old.
    pub(super) fn exceeded(&self) -> bool {
        let shared = self.shared.used(self.max);
        shared > self.max || shared.saturating_add(count(&self.own, self.max - shared)) > self.max
    }
}

/// The directories several runs share, with what they held at the last count, taken again
/// when it is older than `fresh_for` (by whichever run asks first; the others wait for it).
#[derive(Debug)]
pub(super) struct SharedCount {
    dirs: Vec<PathBuf>,
    fresh_for: Duration,
    last: Mutex<Option<(Instant, u64)>>,
}

impl SharedCount {
    pub(super) fn new(dirs: Vec<PathBuf>, fresh_for: Duration) -> SharedCount {
        SharedCount {
            dirs,
            fresh_for,
            last: Mutex::new(None),
        }
    }

    /// What the directories hold (past `max`: some count above it, the walk stopped there).
    fn used(&self, max: u64) -> u64 {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match *last {
            Some((at, used)) if at.elapsed() < self.fresh_for => used,
            _ => {
                let used = count(&self.dirs, max);
                *last = Some((Instant::now(), used));
                used
            }
        }
    }
}

/// The shared counts of the runs alive, by the directories they share: a run joins the count
/// of a run already counting the same checkout. Each is taken again when older than
/// `fresh_for` ([`EVERY`]).
#[derive(Debug)]
pub(super) struct SharedCounts {
    fresh_for: Duration,
    live: Mutex<HashMap<Vec<PathBuf>, Weak<SharedCount>>>,
}

impl Default for SharedCounts {
    fn default() -> SharedCounts {
        SharedCounts::fresh_for(EVERY)
    }
}

impl SharedCounts {
    pub(super) fn fresh_for(fresh_for: Duration) -> SharedCounts {
        SharedCounts {
            fresh_for,
            live: Mutex::default(),
        }
    }

    /// The count of `dirs`, shared with every live run over the same ones.
    pub(super) fn of(&self, dirs: Vec<PathBuf>) -> Arc<SharedCount> {
        let mut counts = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(live) = counts.get(&dirs).and_then(Weak::upgrade) {
            return live;
        }
        counts.retain(|_, c| c.strong_count() > 0);
        let count = Arc::new(SharedCount::new(dirs.clone(), self.fresh_for));
        counts.insert(dirs, Arc::downgrade(&count));
        count
    }
}

/// What `dirs` hold, counting stopped as soon as it passes `max`.
fn count(dirs: &[PathBuf], max: u64) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut used: u64 = 0;
    let mut stack: Vec<PathBuf> = dirs.to_vec();
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue; // gone meanwhile
        };
        used = used.saturating_add((meta.blocks() * 512).max(ENTRY_MIN));
        if used > max {
            return used;
        }
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_small_files_count_like_one_large_one_and_links_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![1u8; 4 << 20]).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        let quota = Quota {
            shared: Arc::new(SharedCount::new(Vec::new(), Duration::ZERO)),
            own: vec![dir.path().to_path_buf()],
            max: 64 * ENTRY_MIN,
        };
        assert!(
            !quota.exceeded(),
            "a link to 4 MiB elsewhere costs one entry"
        );
        for i in 0..64 {
            std::fs::write(dir.path().join(format!("f{i}")), b"").unwrap();
        }
        assert!(
            quota.exceeded(),
            "64 empty files and the rest pass 64 entries"
        );
    }

    #[test]
    fn runs_over_one_checkout_share_its_count_and_each_adds_its_own_directory() {
        let (checkout, own_a, own_b) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        // Counts that stay fresh for the whole test: what a look within [`EVERY`] sees.
        let counts = SharedCounts::fresh_for(Duration::from_secs(3600));
        let shared = || counts.of(vec![checkout.path().to_path_buf()]);
        let quota = |own: &tempfile::TempDir| Quota {
            shared: shared(),
            own: vec![own.path().to_path_buf()],
            max: 16 * ENTRY_MIN,
        };
        let (a, b) = (quota(&own_a), quota(&own_b));
        assert!(
            Arc::ptr_eq(&a.shared, &b.shared),
            "one count for the checkout"
        );
        assert!(!a.exceeded() && !b.exceeded());
        // Each run's own directory is counted at every look: `a` passes, `b` does not.
        std::fs::write(own_a.path().join("big"), vec![1u8; 16 * ENTRY_MIN as usize]).unwrap();
        assert!(a.exceeded());
        assert!(!b.exceeded());
        // The checkout is counted again once its count is older than `fresh_for`
        // (here: never fresh), and then for both.
        let never_fresh = Quota {
            shared: Arc::new(SharedCount::new(
                vec![checkout.path().to_path_buf()],
                Duration::ZERO,
            )),
            own: Vec::new(),
            max: 16 * ENTRY_MIN,
        };
        std::fs::write(
            checkout.path().join("big"),
            vec![1u8; 16 * ENTRY_MIN as usize],
        )
        .unwrap();
        assert!(never_fresh.exceeded());
        // A count still fresh is not taken again: the runs sharing it see it at their next
        // look once it is older than `fresh_for`.
        assert!(!b.exceeded(), "within `fresh_for` of the last count");
        // Once no run holds it, the next run over the checkout counts afresh.
        drop((a, b));
        assert!(quota(&own_b).exceeded());
    }
}
