//! What the root units of one plan job running at once on this replica share (the checkout of
//! the commit, its repo config, policy sets and engine): made by the first unit that needs it,
//! found by the others while one of them holds it, and dropped with the last.

use anyhow::Result;
use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Weak};

/// The live shared values, by key (a plan job and the commits it planned).
#[derive(Default)]
pub struct ByJob {
    live: tokio::sync::Mutex<HashMap<String, Weak<dyn Any + Send + Sync>>>,
}

impl ByJob {
    /// The value of `key` a running unit still holds, else the one `make` makes (one at a time:
    /// a unit starting meanwhile waits for it rather than making its own).
    pub async fn get_or_make<T, Fut>(
        &self,
        key: String,
        make: impl FnOnce() -> Fut,
    ) -> Result<Arc<T>>
    where
        T: Any + Send + Sync,
        Fut: Future<Output = Result<T>>,
    {
        let mut live = self.live.lock().await;
        live.retain(|_, held| held.strong_count() > 0);
        let found = live.get(&key).and_then(Weak::upgrade);
        if let Some(found) = found.and_then(|a| a.downcast::<T>().ok()) {
            return Ok(found);
        }
        let made = Arc::new(make().await?);
        let erased: Arc<dyn Any + Send + Sync> = made.clone();
        live.insert(key, Arc::downgrade(&erased));
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_value_is_shared_while_held_and_made_again_once_dropped() {
        let by_job = ByJob::default();
        let made = std::sync::atomic::AtomicUsize::new(0);
        let make = || async {
            made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(String::from("checkout"))
        };
        let first: Arc<String> = by_job.get_or_make("3:abc".into(), make).await.unwrap();
        let second: Arc<String> = by_job.get_or_make("3:abc".into(), make).await.unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        let other: Arc<String> = by_job.get_or_make("4:abc".into(), make).await.unwrap();
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 2);
        drop((first, second));
        let again: Arc<String> = by_job.get_or_make("3:abc".into(), make).await.unwrap();
        assert_eq!(*again, "checkout");
        assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
