//! The engine's locks, the one order in which they nest, and the wrappers
//! that check it.
//!
//! Why one order. Two threads deadlock only when each holds a lock the
//! other waits for; that cannot happen if every thread takes locks in one
//! global order. So every lock in the engine has a [`Rank`], and a thread
//! holding a lock may take only locks of a strictly greater rank. Locks of
//! one rank are never nested: they are "held alone" (an ARC shard and an
//! index shard are both leaves, so no code holds one while it takes the
//! other).
//!
//! Why checked. A written order that nothing checks drifts from the code
//! (this one had: the eviction sink held `datasets` around the index and
//! the write-back queue, which the text called "one at a time"). In debug
//! builds, and so in every test, each thread keeps the ranks it holds, and
//! an acquisition out of order panics at once with both ranks named, the
//! way the kernel's lockdep reports an inversion before it ever deadlocks.
//! Release builds keep the rank (a byte) and check nothing.
//!
//! The order, outermost first (the why of each is beside its variant):
//! `CommitOrder` < `DeviceWriter` < `Invalidations` < `ObjectGeneration`
//! = `Streams` < `Pace` < `Datasets` < `FeedWake` < `Objects` <
//! `Primary`* < `Leaf` < `BufPool`. Condition variables wait on a held lock
//! (`RankedCondvar`): while waiting the thread is still counted as holding
//! it, which is right, as it holds nothing else it could block on.

#[cfg(debug_assertions)]
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::sync::{
    Condvar, LockResult, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
    WaitTimeoutResult,
};
use std::time::Duration;

/// The ranks, outermost first: a thread may take a lock only while every
/// lock it holds ranks strictly lower. The rank is part of the lock's
/// type (`RankedMutex<T, { rank::LEAF }>`), so it costs no memory and
/// the field's declaration says where it stands.
pub(crate) mod rank {
    /// `CacheDevice::commit_order`: a device feeder holds it for a whole
    /// burst of batches, so that their headers chain in order; it takes
    /// everything a feed takes below it.
    pub(crate) const COMMIT_ORDER: u8 = 1;
    /// `CacheDevice::writer`: the device's header as last written, its log
    /// sequence and sweep mark; held while a batch is laid out.
    pub(crate) const DEVICE_WRITER: u8 = 2;
    /// `Cache::invalidations`: the log of recent writes. A write holds it
    /// while it drops its records from every tier; a feed holds it while it
    /// decides what of its batch to index and indexes it.
    pub(crate) const INVALIDATIONS: u8 = 3;
    /// `ObjectState::generation` (one per object): the last generation
    /// seen; the token is derived under it.
    pub(crate) const OBJECT_GENERATION: u8 = 4;
    /// `ObjectState::streams`: a demand read holds it while it notes
    /// itself in its stream and claims the stream's next span (ARC lookups
    /// below it). Beside `ObjectGeneration`, never around it: same rank.
    pub(crate) const STREAMS: u8 = OBJECT_GENERATION;
    /// A sequential stream's pace (`Pace`): taken under `Streams`.
    pub(crate) const PACE: u8 = 5;
    /// `Cache::datasets` (read-mostly): held by the eviction sink while it
    /// hands records to the tiers, which take their leaves under it.
    pub(crate) const DATASETS: u8 = 6;
    /// `FeedWake::wakeups`: the feeders' sleep; notified under the
    /// eviction sink.
    pub(crate) const FEED_WAKE: u8 = 7;
    /// `Cache::objects`, the table of object states; `Tiers::appending`.
    pub(crate) const OBJECTS: u8 = 8;
    /// Primary storage's own locks, outermost first: an object store's
    /// table of open objects around one object's view.
    pub(crate) const PRIMARY_OBJECTS: u8 = 9;
    /// One open object's view of an object store (`ObjectView`).
    pub(crate) const PRIMARY_OBJECT: u8 = 10;
    /// Primary storage's caches and state held alone.
    pub(crate) const PRIMARY: u8 = 11;
    /// Held alone and briefly, never around another lock: the ARC shards
    /// and a fill's result slot, the L2ARC index shards, its device list,
    /// endurance budget, feed claims, write-back queue and sector-table
    /// slots, the span fillers' queue, the rebuild's queue, the analytics'
    /// tables.
    pub(crate) const LEAF: u8 = 12;
    /// `buf`'s pool of freed large buffers: a buffer is made or freed
    /// under any lock (an ARC shard evicts under its own), so it ranks
    /// innermost; nothing is taken under it.
    pub(crate) const BUF_POOL: u8 = 13;

    /// A rank's name, for the message of a violation (checked in debug
    /// builds only: a release build has no use for it).
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    pub(crate) fn name(rank: u8) -> &'static str {
        match rank {
            COMMIT_ORDER => "CommitOrder",
            DEVICE_WRITER => "DeviceWriter",
            INVALIDATIONS => "Invalidations",
            OBJECT_GENERATION => "ObjectGeneration or Streams",
            PACE => "Pace",
            DATASETS => "Datasets",
            FEED_WAKE => "FeedWake",
            OBJECTS => "Objects",
            PRIMARY_OBJECTS => "PrimaryObjects",
            PRIMARY_OBJECT => "PrimaryObject",
            PRIMARY => "Primary",
            LEAF => "Leaf",
            BUF_POOL => "BufPool",
            _ => "unranked",
        }
    }
}

#[cfg(debug_assertions)]
thread_local! {
    /// The ranks this thread holds, in the order it took them.
    static HELD: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Notes that this thread takes a lock of `rank`; panics if it holds one
/// of the same or a greater rank (debug builds).
#[inline]
fn acquire(rank: u8) {
    // (`try_with`: a buffer freed by a thread-local's destructor, after
    // this list is gone, takes the pool's lock unchecked.)
    #[cfg(debug_assertions)]
    let _ = HELD.try_with(|held| {
        let mut held = held.borrow_mut();
        if let Some(&top) = held.iter().max() {
            assert!(
                top < rank,
                "lock order violated: taking a {} lock while holding a {} lock \
                 (held, in order: {:?}; see lock_order.rs)",
                rank::name(rank),
                rank::name(top),
                held.iter().map(|&r| rank::name(r)).collect::<Vec<_>>(),
            );
        }
        held.push(rank);
    });
    #[cfg(not(debug_assertions))]
    let _ = rank;
}

/// Notes that this thread let go of a lock of `rank`.
#[inline]
fn release(rank: u8) {
    #[cfg(debug_assertions)]
    let _ = HELD.try_with(|held| {
        let mut held = held.borrow_mut();
        let at = held
            .iter()
            .rposition(|&r| r == rank)
            .expect("a lock is let go by the thread that took it");
        held.remove(at);
    });
    #[cfg(not(debug_assertions))]
    let _ = rank;
}

/// How many locks this thread holds now (debug builds; 0 in release).
#[cfg(test)]
pub(crate) fn held_count() -> usize {
    #[cfg(debug_assertions)]
    return HELD.with(|held| held.borrow().len());
    #[cfg(not(debug_assertions))]
    0
}

/// A `Mutex` with a place in the lock order, `RANK` (see [`rank`]).
#[derive(Debug, Default)]
pub(crate) struct RankedMutex<T, const RANK: u8> {
    inner: Mutex<T>,
}

/// The guard of a [`RankedMutex`]; lets go of the rank when dropped.
pub(crate) struct RankedMutexGuard<'a, T, const RANK: u8> {
    // `None` only while a condition variable waits with it.
    inner: Option<MutexGuard<'a, T>>,
}

impl<T, const RANK: u8> RankedMutex<T, RANK> {
    pub(crate) const fn new(value: T) -> Self {
        Self {
            inner: Mutex::new(value),
        }
    }

    /// Locks it, checking the order first (a violation panics before it
    /// can deadlock). Poisoned as `Mutex::lock` is.
    pub(crate) fn lock(&self) -> LockResult<RankedMutexGuard<'_, T, RANK>> {
        acquire(RANK);
        match self.inner.lock() {
            Ok(guard) => Ok(RankedMutexGuard { inner: Some(guard) }),
            Err(poisoned) => Err(PoisonError::new(RankedMutexGuard {
                inner: Some(poisoned.into_inner()),
            })),
        }
    }

    /// Locks it if it is free, checking the order as `lock` does.
    pub(crate) fn try_lock(&self) -> Option<RankedMutexGuard<'_, T, RANK>> {
        acquire(RANK);
        match self.inner.try_lock() {
            Ok(guard) => Some(RankedMutexGuard { inner: Some(guard) }),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(RankedMutexGuard {
                inner: Some(poisoned.into_inner()),
            }),
            Err(std::sync::TryLockError::WouldBlock) => {
                release(RANK);
                None
            }
        }
    }
}

impl<T, const RANK: u8> Deref for RankedMutexGuard<'_, T, RANK> {
    type Target = T;
    fn deref(&self) -> &T {
        self.inner.as_ref().expect("guard held")
    }
}

impl<T, const RANK: u8> DerefMut for RankedMutexGuard<'_, T, RANK> {
    fn deref_mut(&mut self) -> &mut T {
        self.inner.as_mut().expect("guard held")
    }
}

impl<T, const RANK: u8> Drop for RankedMutexGuard<'_, T, RANK> {
    fn drop(&mut self) {
        // The lock first, then the rank: a thread is never counted out
        // while it still holds the lock.
        drop(self.inner.take());
        release(RANK);
    }
}

/// A condition variable over a [`RankedMutex`].
#[derive(Debug, Default)]
pub(crate) struct RankedCondvar(Condvar);

impl RankedCondvar {
    pub(crate) const fn new() -> Self {
        Self(Condvar::new())
    }

    /// `Condvar::wait`.
    pub(crate) fn wait<'a, T, const RANK: u8>(
        &self,
        mut guard: RankedMutexGuard<'a, T, RANK>,
    ) -> LockResult<RankedMutexGuard<'a, T, RANK>> {
        let inner = guard.inner.take().expect("guard held");
        match self.0.wait(inner) {
            Ok(inner) => {
                guard.inner = Some(inner);
                Ok(guard)
            }
            Err(poisoned) => {
                guard.inner = Some(poisoned.into_inner());
                Err(PoisonError::new(guard))
            }
        }
    }

    /// `Condvar::wait_timeout`.
    pub(crate) fn wait_timeout<'a, T, const RANK: u8>(
        &self,
        mut guard: RankedMutexGuard<'a, T, RANK>,
        timeout: Duration,
    ) -> LockResult<(RankedMutexGuard<'a, T, RANK>, WaitTimeoutResult)> {
        let inner = guard.inner.take().expect("guard held");
        match self.0.wait_timeout(inner, timeout) {
            Ok((inner, result)) => {
                guard.inner = Some(inner);
                Ok((guard, result))
            }
            Err(poisoned) => {
                let (inner, result) = poisoned.into_inner();
                guard.inner = Some(inner);
                Err(PoisonError::new((guard, result)))
            }
        }
    }

    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }
}

/// An `RwLock` with a place in the lock order (readers and writers alike).
#[derive(Debug, Default)]
pub(crate) struct RankedRwLock<T, const RANK: u8> {
    inner: RwLock<T>,
}

/// The read guard of a [`RankedRwLock`].
pub(crate) struct RankedReadGuard<'a, T, const RANK: u8> {
    inner: Option<RwLockReadGuard<'a, T>>,
}

/// The write guard of a [`RankedRwLock`].
pub(crate) struct RankedWriteGuard<'a, T, const RANK: u8> {
    inner: Option<RwLockWriteGuard<'a, T>>,
}

impl<T, const RANK: u8> RankedRwLock<T, RANK> {
    pub(crate) const fn new(value: T) -> Self {
        Self {
            inner: RwLock::new(value),
        }
    }

    pub(crate) fn read(&self) -> LockResult<RankedReadGuard<'_, T, RANK>> {
        acquire(RANK);
        match self.inner.read() {
            Ok(guard) => Ok(RankedReadGuard { inner: Some(guard) }),
            Err(poisoned) => Err(PoisonError::new(RankedReadGuard {
                inner: Some(poisoned.into_inner()),
            })),
        }
    }

    pub(crate) fn write(&self) -> LockResult<RankedWriteGuard<'_, T, RANK>> {
        acquire(RANK);
        match self.inner.write() {
            Ok(guard) => Ok(RankedWriteGuard { inner: Some(guard) }),
            Err(poisoned) => Err(PoisonError::new(RankedWriteGuard {
                inner: Some(poisoned.into_inner()),
            })),
        }
    }
}

impl<T, const RANK: u8> Deref for RankedReadGuard<'_, T, RANK> {
    type Target = T;
    fn deref(&self) -> &T {
        self.inner.as_ref().expect("guard held")
    }
}

impl<T, const RANK: u8> Drop for RankedReadGuard<'_, T, RANK> {
    fn drop(&mut self) {
        drop(self.inner.take());
        release(RANK);
    }
}

impl<T, const RANK: u8> Deref for RankedWriteGuard<'_, T, RANK> {
    type Target = T;
    fn deref(&self) -> &T {
        self.inner.as_ref().expect("guard held")
    }
}

impl<T, const RANK: u8> DerefMut for RankedWriteGuard<'_, T, RANK> {
    fn deref_mut(&mut self) -> &mut T {
        self.inner.as_mut().expect("guard held")
    }
}

impl<T, const RANK: u8> Drop for RankedWriteGuard<'_, T, RANK> {
    fn drop(&mut self) {
        drop(self.inner.take());
        release(RANK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_nesting_is_allowed_and_counted() {
        let outer = RankedMutex::<_, { rank::INVALIDATIONS }>::new(1);
        let inner = RankedRwLock::<_, { rank::LEAF }>::new(2);
        {
            let a = outer.lock().unwrap();
            let b = inner.read().unwrap();
            assert_eq!(*a + *b, 3);
            assert_eq!(held_count(), 2);
        }
        assert_eq!(held_count(), 0);
        // Let go out of the order taken: both are forgotten.
        let a = outer.lock().unwrap();
        let b = inner.write().unwrap();
        drop(a);
        drop(b);
        assert_eq!(held_count(), 0);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(
        expected = "lock order violated: taking a Invalidations lock while holding a Leaf lock"
    )]
    fn taking_two_locks_out_of_order_panics() {
        let outer = RankedMutex::<(), { rank::INVALIDATIONS }>::new(());
        let inner = RankedMutex::<(), { rank::LEAF }>::new(());
        let _leaf = inner.lock().unwrap();
        let _outer = outer.lock().unwrap();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "lock order violated: taking a Leaf lock while holding a Leaf lock")]
    fn two_leaves_are_never_nested() {
        let a = RankedMutex::<(), { rank::LEAF }>::new(());
        let b = RankedMutex::<(), { rank::LEAF }>::new(());
        let _a = a.lock().unwrap();
        let _b = b.lock().unwrap();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "taking a ObjectGeneration or Streams lock while holding")]
    fn a_stream_is_never_locked_around_a_generation() {
        let generation = RankedMutex::<(), { rank::OBJECT_GENERATION }>::new(());
        let streams = RankedMutex::<(), { rank::STREAMS }>::new(());
        let _streams = streams.lock().unwrap();
        let _generation = generation.lock().unwrap();
    }

    #[test]
    fn a_failed_try_lock_holds_nothing() {
        let m = std::sync::Arc::new(RankedMutex::<(), { rank::LEAF }>::new(()));
        let other = std::sync::Arc::clone(&m);
        let held = m.lock().unwrap();
        std::thread::spawn(move || {
            assert!(other.try_lock().is_none());
            assert_eq!(held_count(), 0);
        })
        .join()
        .unwrap();
        drop(held);
    }

    #[test]
    fn a_condvar_wait_keeps_the_lock_and_its_rank() {
        let pair = std::sync::Arc::new((
            RankedMutex::<bool, { rank::FEED_WAKE }>::new(false),
            RankedCondvar::new(),
        ));
        let other = std::sync::Arc::clone(&pair);
        let waker = std::thread::spawn(move || {
            *other.0.lock().unwrap() = true;
            other.1.notify_all();
        });
        let mut ready = pair.0.lock().unwrap();
        while !*ready {
            ready = pair
                .1
                .wait_timeout(ready, Duration::from_millis(50))
                .unwrap()
                .0;
        }
        assert_eq!(held_count(), 1);
        drop(ready);
        assert_eq!(held_count(), 0);
        waker.join().unwrap();
    }
}
