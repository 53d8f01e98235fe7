//! Root locks: plans and applies of the same (project, root) never run at the same time.
//!
//! Apply-style work takes a [`RootGuard`] value; the functions that touch state require one,
//! so "apply without the lock" does not compile. The engine's own state lock (`-lock-timeout`)
//! still guards against other tools; this one keeps planbot from racing itself and lets a
//! second apply wait its turn instead of failing on the state lock.

use crate::core::ids::ProjectId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Which root a lock is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RootKey {
    pub project: ProjectId,
    pub root: String,
}

/// Proof that the holder alone works on `key` until it is dropped.
#[derive(Debug)]
pub struct RootGuard {
    key: RootKey,
    _guard: OwnedMutexGuard<()>,
}

impl RootGuard {
    pub fn key(&self) -> &RootKey {
        &self.key
    }
}

/// The process-wide table of root locks.
#[derive(Debug, Clone, Default)]
pub struct RootLocks {
    locks: Arc<Mutex<HashMap<RootKey, Arc<AsyncMutex<()>>>>>,
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
        let guard = self.slot(&key).lock_owned().await;
        RootGuard { key, _guard: guard }
    }

    /// Hold `root` of `project` if it is free right now.
    pub fn try_lock(&self, project: ProjectId, root: &str) -> Option<RootGuard> {
        let key = RootKey {
            project,
            root: root.to_string(),
        };
        let guard = self.slot(&key).try_lock_owned().ok()?;
        Some(RootGuard { key, _guard: guard })
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
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(core);
        assert_eq!(waiter.await.unwrap(), "core");
    }
}
