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

use std::path::PathBuf;
use std::time::Duration;

/// How often a running step's directories are added up.
pub(super) const EVERY: Duration = Duration::from_millis(200);

/// What one entry (file, directory, link) counts at the least: its inode and directory entry.
pub(super) const ENTRY_MIN: u64 = 4096;

/// The directories of one run that count against its quota, and the quota.
#[derive(Debug, Clone)]
pub(super) struct Quota {
    pub(super) dirs: Vec<PathBuf>,
    pub(super) max: u64,
}

impl Quota {
    /// Whether the directories hold more than `max` (blocks allocated, [`ENTRY_MIN`] at the
    /// least per entry; symbolic links are not followed).
    pub(super) fn exceeded(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let mut used: u64 = 0;
        let mut stack: Vec<PathBuf> = self.dirs.clone();
        while let Some(path) = stack.pop() {
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue; // gone meanwhile
            };
            used = used.saturating_add((meta.blocks() * 512).max(ENTRY_MIN));
            if used > self.max {
                return true;
            }
            if meta.is_dir() {
                if let Ok(entries) = std::fs::read_dir(&path) {
                    stack.extend(entries.flatten().map(|e| e.path()));
                }
            }
        }
        false
    }
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
            dirs: vec![dir.path().to_path_buf()],
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
}
