//! Root locks: applies and drift checks of the same (project, root) never run at the same time.
//!
//! Apply-style work takes a [`RootGuard`] value; the functions that touch state require one,
//! so "apply without the lock" does not compile. The engine's own state lock (`-lock-timeout`)
//! still guards against other tools; this one keeps planbot from racing itself, lets a second
//! apply wait its turn instead of failing on the state lock, and keeps a drift check from
//! reading a state half applied. MR plans take no lock: they only read the state
//! (`-lock=false`, through a read-only state gate) and run MR code, which may wait as long as
//! `engine.timeout`; a lock they held would make another MR's plan wait on that code. The
//! holders all run the default branch's reviewed code.

use crate::core::ids::ProjectId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{Mutex as AsyncMutex, Notify, OwnedMutexGuard};

/// Which root a lock is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RootKey {
    pub project: ProjectId,
    pub root: String,
}

/// The table's locks by key.
type Table = Arc<Mutex<HashMap<RootKey, Arc<AsyncMutex<()>>>>>;

/// Proof that the holder alone works on `key` until it is dropped.
#[derive(Debug)]
pub struct RootGuard {
    key: RootKey,
    guard: Option<OwnedMutexGuard<()>>,
    table: Table,
}

impl Drop for RootGuard {
    /// Free the lock, and forget it once no one else holds or waits for it: the table holds
    /// only locks in use (its keys include one per merge request for replies).
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if map
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            map.remove(&self.key);
        }
    }
}

impl RootGuard {
    pub fn key(&self) -> &RootKey {
        &self.key
    }
}

/// The process-wide table of root locks.
#[derive(Debug, Clone, Default)]
pub struct RootLocks {
    locks: Table,
    /// How many callers wait in [`RootLocks::lock`] per root, and a signal when that changes
    /// (a synchronisation point for tests: "the second apply now waits").
    waiting: Arc<Mutex<HashMap<RootKey, usize>>>,
    changed: Arc<Notify>,
}

/// Counts one caller as waiting for a root while it lives.
struct Waiting<'a> {
    locks: &'a RootLocks,
    key: RootKey,
}

impl<'a> Waiting<'a> {
    fn new(locks: &'a RootLocks, key: &RootKey) -> Waiting<'a> {
        *locks
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default() += 1;
        locks.changed.notify_waiters();
        Waiting {
            locks,
            key: key.clone(),
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(n) = self
            .locks
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&self.key)
        {
            *n = n.saturating_sub(1);
        }
        let mut waiting = self.locks.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if waiting.get(&self.key) == Some(&0) {
            waiting.remove(&self.key);
        }
        drop(waiting);
        self.locks.changed.notify_waiters();
    }
}

impl RootLocks {
    pub fn new() -> RootLocks {
        RootLocks::default()
    }

    fn slot(&self, key: &RootKey) -> Arc<AsyncMutex<()>> {
        let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key.clone()).or_default().clone()
    }

    /// Wait until `root` of `project` is free, then hold it.
    pub async fn lock(&self, project: ProjectId, root: &str) -> RootGuard {
        let key = RootKey {
            project,
            root: root.to_string(),
        };
        let slot = self.slot(&key);
        let waiting = Waiting::new(self, &key);
        let guard = slot.lock_owned().await;
        drop(waiting);
        RootGuard {
            key,
            guard: Some(guard),
            table: self.locks.clone(),
        }
    }

    /// How many callers wait for `root` of `project` right now.
    pub fn waiting(&self, project: ProjectId, root: &str) -> usize {
        let key = RootKey {
            project,
            root: root.to_string(),
        };
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .copied()
            .unwrap_or(0)
    }

    /// Return once at least `n` callers wait for `root` of `project`.
    pub async fn until_waiting(&self, project: ProjectId, root: &str, n: usize) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.waiting(project, root) >= n {
                return;
            }
            notified.await;
        }
    }

    /// Hold `root` of `project` if it is free right now.
    pub fn try_lock(&self, project: ProjectId, root: &str) -> Option<RootGuard> {
        let key = RootKey {
            project,
            root: root.to_string(),
        };
        let guard = self.slot(&key).try_lock_owned().ok();
        let Some(guard) = guard else {
            // Not taken: forget the lock again if this call made it.
            let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            if map.get(&key).is_some_and(|l| Arc::strong_count(l) == 1) {
                map.remove(&key);
            }
            return None;
        };
        Some(RootGuard {
            key,
            guard: Some(guard),
            table: self.locks.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_holder_per_root_and_roots_are_independent() {
        let locks = RootLocks::new();
        let core = locks.lock(ProjectId(1), "core").await;
        assert!(locks.try_lock(ProjectId(1), "core").is_none());
        assert!(locks.try_lock(ProjectId(1), "dns").is_some());
        assert!(locks.try_lock(ProjectId(2), "core").is_some());
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move { locks.lock(ProjectId(1), "core").await.key().root.clone() })
        };
        // The waiter says it waits; while `core` is held it keeps waiting, whatever runs.
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            locks.until_waiting(ProjectId(1), "core", 1),
        )
        .await
        .expect("the second caller waits for the root");
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(locks.waiting(ProjectId(1), "core"), 1);
        assert!(!waiter.is_finished());
        drop(core);
        assert_eq!(waiter.await.unwrap(), "core");
        assert_eq!(locks.waiting(ProjectId(1), "core"), 0);
    }

    #[tokio::test]
    async fn a_lock_no_one_holds_or_waits_for_is_forgotten() {
        let locks = RootLocks::new();
        let held = locks.lock(ProjectId(1), "\0reply !7 help").await;
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move { drop(locks.lock(ProjectId(1), "\0reply !7 help").await) })
        };
        locks
            .until_waiting(ProjectId(1), "\0reply !7 help", 1)
            .await;
        drop(held);
        waiter.await.unwrap();
        assert!(locks.try_lock(ProjectId(1), "core").is_some());
        let sizes = || {
            let table = locks.locks.lock().unwrap().len();
            let waiting = locks.waiting.lock().unwrap().len();
            (table, waiting)
        };
        assert_eq!(sizes(), (0, 0), "every lock released and forgotten");
    }
}
