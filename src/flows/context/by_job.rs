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
    /// One slot per key: a unit making one key's value holds that key's slot alone, so units of
    /// other jobs (other keys) are not held up by its checkout.
    live: std::sync::Mutex<HashMap<String, Arc<Slot>>>,
}

type Slot = tokio::sync::Mutex<Weak<dyn Any + Send + Sync>>;

impl ByJob {
    /// The value of `key` a running unit still holds, else the one `make` makes (one at a time
    /// per key: a unit of the same key starting meanwhile waits for it rather than making its
    /// own; a unit of another key does not wait).
    pub async fn get_or_make<T, Fut>(
        &self,
        key: String,
        make: impl FnOnce() -> Fut,
    ) -> Result<Arc<T>>
    where
        T: Any + Send + Sync,
        Fut: Future<Output = Result<T>>,
    {
        let slot = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            // A slot nobody waits on whose value is gone is dropped.
            live.retain(|_, slot| {
                Arc::strong_count(slot) > 1
                    || slot.try_lock().map_or(true, |held| held.strong_count() > 0)
            });
            Arc::clone(live.entry(key).or_insert_with(|| {
                let none: Weak<dyn Any + Send + Sync> = Weak::<()>::new();
                Arc::new(tokio::sync::Mutex::new(none))
            }))
        };
        let mut held = slot.lock().await;
        if let Some(found) = held.upgrade().and_then(|a| a.downcast::<T>().ok()) {
            return Ok(found);
        }
        let made = Arc::new(make().await?);
        let erased: Arc<dyn Any + Send + Sync> = made.clone();
        *held = Arc::downgrade(&erased);
        Ok(made)
    }

    /// How many keys have a slot (values held, or being made): for tests.
    #[cfg(test)]
    fn slots(&self) -> usize {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).len()
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

    /// A key whose value is being made (a slow checkout) holds up units of that key only.
    #[tokio::test]
    async fn a_key_being_made_does_not_hold_up_another_key() {
        let by_job = Arc::new(ByJob::default());
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (started, has_started) = tokio::sync::oneshot::channel::<()>();
        let slow = tokio::spawn({
            let by_job = Arc::clone(&by_job);
            async move {
                by_job
                    .get_or_make("3:abc".into(), || async move {
                        let _ = started.send(());
                        let _ = released.await;
                        Ok(String::from("slow checkout"))
                    })
                    .await
            }
        });
        has_started.await.unwrap();
        // The first key is still being made: another key is made meanwhile.
        let other: Arc<String> = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            by_job.get_or_make("4:def".into(), || async { Ok(String::from("other")) }),
        )
        .await
        .expect("another key waited for the first key's make")
        .unwrap();
        assert_eq!(*other, "other");
        release.send(()).unwrap();
        let first = slow.await.unwrap().unwrap();
        assert_eq!(*first, "slow checkout");
        // Dropped values leave no slot behind once another call looks.
        drop((first, other));
        let _: Arc<String> = by_job
            .get_or_make("5:ghi".into(), || async { Ok(String::new()) })
            .await
            .unwrap();
        assert_eq!(by_job.slots(), 1);
    }
}
