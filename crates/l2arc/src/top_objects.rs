//! Which objects (files, images) the work goes to: the drill-down of the
//! live analytics, like the appliance's breakdown of ARC accesses by file.
//!
//! A counter per object on every read would put a lock or a map lookup on
//! the ARC hit path, and an unbounded map would grow with every file ever
//! read. So: at most `TOP_OBJECTS_MAX` objects are tracked, in one map
//! under a mutex; an object enters on a miss (a fill from the L2ARC or the
//! primary storage, which costs microseconds to milliseconds: the lock is
//! noise there), and when the map is full it takes the place of the
//! tracked object with the least work (a Space-Saving-like rule, so heavy
//! hitters stay). A flash read takes ~10 µs of CPU, not milliseconds, and
//! with many reader threads on few cores a holder preempted under the lock
//! stalls every reader behind it (measured: 32 readers of a warm L2ARC fell
//! from 1.2x to 0.7x of fio's IOPS, p99 from 1 to 21 ms), so fills take the
//! map with `try_lock` too: a busy map drops the count, never the read.
//! ARC hits are counted from the sampled reads only (one in
//! `ARC_HIT_SAMPLE_PERIOD`, weighted), with `try_lock` (a busy map skips
//! the sample rather than wait), and only for objects already tracked.
//! Counts are totals since start; rates come from their deltas.

use crate::hash::FastHashMap;
use crate::lock_order::{RankedMutex, rank};

/// Objects tracked at once.
pub const TOP_OBJECTS_MAX: usize = 1024;
/// Longest name kept for an object.
const NAME_BYTES_MAX: usize = 512;

/// Work done for one object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectCounts {
    /// Dataset index.
    pub dataset: u32,
    /// Object identity within the dataset.
    pub object: u64,
    /// The name it was opened by, when known (`Cache::open`).
    pub name: Option<String>,
    /// Demand reads: fills plus sampled ARC hits (estimated).
    pub reads: u64,
    /// Reads that missed the ARC.
    pub misses: u64,
    /// Reads served by the L2ARC.
    pub l2_hits: u64,
    /// Reads that went to primary storage.
    pub primary_reads: u64,
    /// Bytes read below the ARC (L2ARC, shared tier, primary storage).
    pub bytes_below: u64,
}

/// The tier below the ARC that served a record, as the analytics count
/// it: the latency band it goes to (`crate::analytics`), and the counts
/// of the drill-down here. Kept in this leaf module so that the tiers
/// (`crate::tier`), which name their band, need not import the analytics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Below {
    /// The L2ARC (cache devices): the `l2_hit` band.
    L2Arc,
    /// The shared tier (a cache bucket): the `shared_hit` band.
    Shared,
    /// Primary storage: the `primary` band.
    Primary,
}

#[derive(Default)]
pub(crate) struct TopObjects {
    objects: RankedMutex<FastHashMap<(u32, u64), ObjectCounts>, { rank::LEAF }>,
    names: RankedMutex<FastHashMap<(u32, u64), String>, { rank::LEAF }>,
}

impl TopObjects {
    /// Remembers the name an object was opened by (bounded like the counts).
    pub(crate) fn name(&self, dataset: u32, object: u64, name: &str) {
        let mut names = self.names.lock().expect("names poisoned");
        if names.len() < TOP_OBJECTS_MAX || names.contains_key(&(dataset, object)) {
            let mut end = name.len().min(NAME_BYTES_MAX);
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            names.insert((dataset, object), name[..end].to_string());
        }
    }

    /// A fill from below the ARC, `from` the tier that served it (a
    /// shared-tier hit counts as a miss and bytes below only).
    pub(crate) fn fill(&self, dataset: u32, object: u64, from: Below, bytes: u64) {
        let Some(mut objects) = self.objects.try_lock() else {
            return; // busy: the count is dropped, the read goes on
        };
        if !objects.contains_key(&(dataset, object)) && objects.len() >= TOP_OBJECTS_MAX {
            let least = objects
                .iter()
                .min_by_key(|(_, c)| c.reads + c.misses)
                .map(|(k, _)| *k);
            if let Some(least) = least {
                objects.remove(&least);
            }
        }
        let c = objects
            .entry((dataset, object))
            .or_insert_with(|| ObjectCounts {
                dataset,
                object,
                ..ObjectCounts::default()
            });
        c.reads += 1;
        c.misses += 1;
        c.bytes_below += bytes;
        match from {
            Below::L2Arc => c.l2_hits += 1,
            Below::Primary => c.primary_reads += 1,
            Below::Shared => {}
        }
    }

    /// A sampled ARC hit, counted `weight` times, if the object is tracked
    /// and the map is free.
    #[inline]
    pub(crate) fn sampled_hit(&self, dataset: u32, object: u64, weight: u64) {
        if let Some(mut objects) = self.objects.try_lock()
            && let Some(c) = objects.get_mut(&(dataset, object))
        {
            c.reads += weight;
        }
    }

    /// The `n` objects with the most reads, most first.
    pub(crate) fn top(&self, n: usize) -> Vec<ObjectCounts> {
        let mut all: Vec<ObjectCounts> = self
            .objects
            .lock()
            .expect("top objects poisoned")
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| b.reads.cmp(&a.reads).then(a.object.cmp(&b.object)));
        all.truncate(n);
        let names = self.names.lock().expect("names poisoned");
        for c in &mut all {
            c.name = names.get(&(c.dataset, c.object)).cloned();
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_objects_stay_and_the_map_stays_bounded() {
        let t = TopObjects::default();
        t.name(0, 7, "hot.dat");
        for _ in 0..100 {
            t.fill(0, 7, Below::Primary, 4096);
        }
        t.sampled_hit(0, 7, 64);
        t.sampled_hit(0, 99_999, 64); // untracked: ignored
        for object in 0..(TOP_OBJECTS_MAX as u64 * 3) {
            t.fill(1, 1000 + object, Below::L2Arc, 10);
        }
        let top = t.top(3);
        assert_eq!(top[0].object, 7);
        assert_eq!(top[0].name.as_deref(), Some("hot.dat"));
        assert_eq!(top[0].reads, 164);
        assert_eq!(top[0].misses, 100);
        assert_eq!(top[0].primary_reads, 100);
        assert_eq!(top[0].bytes_below, 409_600);
        assert_eq!(top[1].l2_hits, 1);
        assert_eq!(t.objects.lock().unwrap().len(), TOP_OBJECTS_MAX);
        assert!(t.top(usize::MAX).iter().all(|c| c.object != 99_999));
    }
}
