//! Engine slots: how many engines this process runs at once (`plan.max_concurrent_plans`,
//! every job's together), and how many of them one author's plans may hold
//! (`plan.workers_per_author`, the same share as of the workers).
//!
//! An MR's code may wait as long as the engine's timeout (a program an `external` data source
//! runs, a provider, a `credential_process`): one author's MRs with many roots would otherwise
//! hold every slot while another author's plan waits. A plan first waits for its author's share
//! (holding nothing), then for a slot; an apply takes a slot without a share (reviewed code,
//! started by a maintainer). A holder knows what it waited for and how long ([`Waited`]), for
//! the note.

use crate::core::ids::UserId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a plan waited for before its engine ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitedFor {
    /// Its author's other plans held the author's share of the slots.
    AuthorShare,
    /// Every slot was held (by anyone's plans, drift checks or applies).
    Slot,
}

/// One wait before a slot: on what, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waited {
    pub on: WaitedFor,
    pub took: Duration,
}

/// The process's engine slots and each author's share of them.
#[derive(Debug)]
pub struct EngineSlots {
    all: Arc<Semaphore>,
    total: usize,
    share: usize,
    /// Each author's share (`None`: planbot's own work, one bucket), while any plan of theirs
    /// holds or waits for it.
    authors: Mutex<HashMap<Option<UserId>, Arc<Semaphore>>>,
}

/// One engine slot, held until dropped, and the waits it took to get it.
#[derive(Debug)]
pub struct EngineSlot {
    _slot: OwnedSemaphorePermit,
    _share: Option<OwnedSemaphorePermit>,
    /// The waits before the slot, in order (the author's share, then a slot); none where it was
    /// free at once.
    pub waited: Vec<Waited>,
}

impl EngineSlots {
    /// `total` slots (at least 1), of which one author holds at most `share` (at least 1).
    pub fn new(total: usize, share: usize) -> EngineSlots {
        let total = total.max(1);
        EngineSlots {
            all: Arc::new(Semaphore::new(total)),
            total,
            share: share.clamp(1, total),
            authors: Mutex::default(),
        }
    }

    /// How many slots there are.
    pub fn total(&self) -> usize {
        self.total
    }

    /// How many slots one author's plans hold at most.
    pub fn share(&self) -> usize {
        self.share
    }

    /// How many slots are free right now.
    pub fn free(&self) -> usize {
        self.all.available_permits()
    }

    /// A slot for a plan of `author` (`None`: planbot's own work): waited for within the
    /// author's share first, then among all.
    pub async fn for_author(&self, author: Option<UserId>) -> EngineSlot {
        let bucket = self.bucket(author);
        let (share, waited_share) = take(bucket, WaitedFor::AuthorShare).await;
        let mut slot = self.any().await;
        slot.waited.splice(0..0, waited_share);
        self.forget_idle();
        EngineSlot {
            _share: Some(share),
            ..slot
        }
    }

    /// A slot for a plan of `author` when one is free right now, within the author's share;
    /// `None` when it would have to wait.
    pub fn try_for_author(&self, author: Option<UserId>) -> Option<EngineSlot> {
        let share = self.bucket(author).try_acquire_owned().ok();
        let slot = share
            .as_ref()
            .and_then(|_| self.all.clone().try_acquire_owned().ok());
        let found = match (share, slot) {
            (Some(share), Some(slot)) => Some(EngineSlot {
                _slot: slot,
                _share: Some(share),
                waited: Vec::new(),
            }),
            _ => None,
        };
        self.forget_idle();
        found
    }

    /// A slot outside any author's share (an apply's plan and apply).
    pub async fn any(&self) -> EngineSlot {
        let (slot, waited) = take(self.all.clone(), WaitedFor::Slot).await;
        EngineSlot {
            _slot: slot,
            _share: None,
            waited: waited.into_iter().collect(),
        }
    }

    fn bucket(&self, author: Option<UserId>) -> Arc<Semaphore> {
        let mut authors = self.authors.lock().unwrap_or_else(|p| p.into_inner());
        authors
            .entry(author)
            .or_insert_with(|| Arc::new(Semaphore::new(self.share)))
            .clone()
    }

    /// Forget the shares no plan holds or waits for (only the table refers to them): each time
    /// a plan gets its slot, so the table holds about the authors of the plans running or
    /// waiting, no more.
    fn forget_idle(&self) {
        let mut authors = self.authors.lock().unwrap_or_else(|p| p.into_inner());
        authors.retain(|_, s| Arc::strong_count(s) > 1);
    }
}

/// A permit of `semaphore`, and the wait for it when it was not free at once.
async fn take(semaphore: Arc<Semaphore>, on: WaitedFor) -> (OwnedSemaphorePermit, Option<Waited>) {
    if let Ok(permit) = semaphore.clone().try_acquire_owned() {
        return (permit, None);
    }
    let started = Instant::now();
    let permit = semaphore
        .acquire_owned()
        .await
        .expect("the engine slots are never closed");
    let took = started.elapsed();
    (permit, Some(Waited { on, took }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_taken_at_once_only_when_free_within_the_share() {
        let slots = EngineSlots::new(3, 2);
        let a = Some(UserId(1));
        let first = slots.try_for_author(a).expect("free");
        let second = slots.try_for_author(a).expect("free");
        assert!(
            slots.try_for_author(a).is_none(),
            "the author's share is held"
        );
        let other = slots
            .try_for_author(Some(UserId(2)))
            .expect("a slot is free");
        assert!(
            slots.try_for_author(Some(UserId(3))).is_none(),
            "every slot is held"
        );
        drop((first, second, other));
        assert_eq!(slots.free(), 3);
        assert!(slots.try_for_author(a).is_some());
    }

    #[tokio::test]
    async fn one_author_holds_at_most_their_share_and_says_what_a_plan_waited_for() {
        let slots = EngineSlots::new(3, 2);
        let (alice, bob) = (Some(UserId(1)), Some(UserId(2)));
        let a1 = slots.for_author(alice).await;
        let a2 = slots.for_author(alice).await;
        assert!(a1.waited.is_empty() && a2.waited.is_empty());
        // Alice's third plan waits for her share while a slot is free: Bob's takes it.
        let mut a3 = Box::pin(slots.for_author(alice));
        assert!(futures::poll!(a3.as_mut()).is_pending());
        assert_eq!(slots.free(), 1);
        let b1 = slots.for_author(bob).await;
        assert!(b1.waited.is_empty());
        drop((a1, a2, a3, b1));
        assert_eq!(slots.free(), 3);

        // Two slots, one each: Alice's plan and an apply hold them; Bob's plan waits for a
        // slot, Alice's second for her share.
        let slots = EngineSlots::new(2, 1);
        let (a1, apply) = (slots.for_author(alice).await, slots.any().await);
        let mut b1 = Box::pin(slots.for_author(bob));
        assert!(futures::poll!(b1.as_mut()).is_pending());
        let mut a2 = Box::pin(slots.for_author(alice));
        assert!(futures::poll!(a2.as_mut()).is_pending());
        // Alice's first plan ends: her second gets her share, Bob's (waiting first) the slot.
        drop(a1);
        assert!(futures::poll!(a2.as_mut()).is_pending());
        let b1 = b1.await;
        let on = |s: &EngineSlot| s.waited.iter().map(|w| w.on).collect::<Vec<_>>();
        assert_eq!(on(&b1), [WaitedFor::Slot]);
        drop(apply);
        let a2 = a2.await;
        assert_eq!(on(&a2), [WaitedFor::AuthorShare, WaitedFor::Slot]);
        // Only the shares of the plans that hold one are still in the table.
        drop(b1);
        let own = slots.for_author(None).await;
        assert_eq!(slots.authors.lock().unwrap().len(), 2);
        drop((a2, own));
    }

    #[test]
    fn the_share_is_at_least_one_and_at_most_every_slot() {
        assert_eq!(EngineSlots::new(2, 0).share(), 1);
        assert_eq!(EngineSlots::new(2, 5).share(), 2);
        assert_eq!(EngineSlots::new(0, 1).total(), 1);
    }
}
