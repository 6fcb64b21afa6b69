//! The L2ARC index: where each record cached on flash lives, kept in DRAM.
//!
//! Budget. Every record on a cache device costs one index entry in DRAM, so
//! the index, not the flash, bounds how large an L2ARC a machine can afford:
//! OpenZFS spends 96 bytes per record (an L2-only `arc_buf_hdr_t`), i.e.
//! 1 GiB of DRAM per ~11 M records. Our target is at most 32 bytes per
//! record, all overheads included (table slack, shard structs).
//!
//! Why 20 bytes. An entry is exactly a log entry of the device format
//! (`docs/format.md`): `key_hash: u64`, `location: u64` (block, lap, device,
//! size, compression and tail packed into one word), `checksum: u32`. Nothing
//! else is needed to read the record back and verify it, and the key is its
//! own hash, so the table stores no separate hash. A slot is `[u32; 5]`:
//! alignment 4, no padding to 24 as a `(u64, u64, u32)` struct would get.
//! `key_hash == 0` marks an empty slot (callers map a zero hash to 1), so
//! there is no control byte either.
//!
//! Why Robin Hood at high load. With open addressing, bytes per entry are
//! `20 / load`, so the load factor is the whole game: at 0.90 a slot array
//! costs 22.2 bytes per entry. Plain linear probing degrades badly there (an
//! unsuccessful search probes ~ (1 + 1/(1-a)^2) / 2 = 50 slots at 0.90, and
//! tombstones make it worse); Robin Hood ordering (an insert takes the slot of
//! the first entry that is closer to its home than the insert is) keeps every
//! cluster sorted by home slot, so a search stops as soon as it meets an
//! entry closer to its home than the probe is: a miss costs about what a hit
//! does, ~ (1 + 1/(1-a)) / 2 = 5.5 slots (110 bytes, two or three cache
//! lines) at 0.90, with a small variance. Deletion shifts the following
//! entries of the cluster back by one (backward-shift deletion), so there are
//! no tombstones. Home slots are chosen by `fastrange` (multiply-high of the
//! low 32 bits of `key_hash` by the slot count), which keeps the home order
//! equal to the hash order: slot counts need not be powers of two, and a
//! rehash into another size is a merge in one sequential pass.
//!
//! Load range. A shard grows by 1.25x when an insert would take it past the
//! maximum load of 0.90, so a shard grown from empty sits between
//! 0.90 / 1.25 = 0.72 and 0.90 load: 22.2 to 27.8 bytes per entry, plus one
//! 64-byte shard struct per shard (0.004 bytes per entry at 1 M entries in
//! 64 shards, 0.26 in 4096). The growth step is bounded by the budget: 1.4x
//! would reach 31.1 bytes at its low point and 1.5x 33.3 (over). A larger
//! step allocates less over a build (g / (g - 1) times the final size: 5x at
//! 1.25, 3.5x at 1.4) and first-touch page faults of new arrays are most of
//! the cost of growth, but measured at 10 M entries the insert rates of 1.25x
//! and 1.4x were within the noise of this (shared) machine, so the step with
//! the most headroom wins. Pre-sized with the expected entry count, each
//! shard gets room for its mean share plus four standard deviations (a
//! uniform hash gives each shard a binomial share) at 0.90 load: a correctly
//! sized index does not grow, and sits at ~0.89 load with a few shards, less
//! with many small ones (4096 shards x 244 entries: 0.71).
//!
//! Why not hashbrown. `HashMap<u64, (u64, u32)>` stores 24-byte buckets (the
//! tuple pads to 16) plus one control byte each, in a power-of-two bucket
//! count at most 7/8 full: 25 / 0.875 = 28.6 bytes per entry just before it
//! doubles and 57.1 just after, a 2x sawtooth that `with_capacity` cannot
//! avoid (1 M entries need 2^21 buckets: 52.4 bytes per entry; 10 M need
//! 2^24: 41.9).
//!
//! Measured (`measure_memory_and_throughput` and
//! `one_million_entries_within_32_bytes_each`; bytes per entry from
//! `memory_bytes`, confirmed by RSS; a shared 2-vCPU VM, test profile, one
//! thread, 64 shards unless said):
//!
//! | | index, pre-sized | index, grown from empty | std `HashMap` |
//! |---|---|---|---|
//! | 1 M entries | 22.9 B (4096 shards: 28.4) | 27.1 B (22.6..27.1 from 200 k) | 52.4 B |
//! | 10 M entries | 22.4 B | 25.3 B | 41.9 B (28.6..57.1 over a cycle) |
//! | insert, 10 M | 6.0 M/s | 3.4 M/s | 12.9 M/s; grown 10.6 M/s |
//! | get, 10 M | 5.2 M/s hit, 5.5 M/s miss | | 15.9 M/s; behind a `Mutex` 10.7 |
//!
//! Lookups are bound by cache misses along the probe. At 0.89 load (how a
//! pre-sized index ends up) a get takes ~200 ns here, about twice what it
//! takes at 0.64 load (31 bytes per entry), where it matches a locked
//! hashbrown: the price of the memory, and small next to the flash read
//! that follows a hit (tens of microseconds).
//!
//! Concurrency. The key space is split by the top bits of `key_hash` into a
//! power-of-two number of shards, each a `Mutex` around its own table, padded
//! to a cache line. Every operation locks one shard; `retain` and `clear`
//! lock one shard at a time, so a sweep never stops the whole index. A shard
//! grows (or, after a sweep, shrinks) alone: the transient peak is one
//! shard's old and new arrays together. `len` and `memory_bytes` read
//! per-shard counters published under the shard lock, without locking.
//!
//! Bulk inserts. A rebuild restores up to hundreds of millions of entries
//! at once; one at a time, each lands at a random slot of a table of GBs
//! and waits on DRAM (~0.5 us here with 4 KiB pages in a VM: 2.1 M/s at
//! 100 M entries). `sort_run` orders a run by shard and home slot, to the
//! grain of `RUN_BUCKET_SLOTS` (a counting sort: two passes, stable, so
//! the newest entry of a key stays first), and `insert_sorted_if_absent`
//! inserts it shard by shard, prefetching the home slots of the entries
//! `RUN_PREFETCH_DISTANCE` ahead, the shards split between threads. Large
//! slot arrays ask for transparent huge pages (`slots_zeroed`), which cuts
//! the TLB misses and first-write faults of random access 512-fold.
//! `reserve` sizes every shard for a total, as `new` does, in one step.
//!
//! Shrinking. `remove` never shrinks. `retain` shrinks a shard whose load fell
//! below 1/2 back to 0.72 (the load a growth leaves), never below the size
//! `new` gave it, so after mass removals the bytes per entry come back within
//! budget at the next sweep.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Most shards an index may have (`shards` is a power of two up to this).
pub const SHARDS_MAX: usize = 4096;
const SHARD_BITS_MAX: u32 = SHARDS_MAX.trailing_zeros();

/// One slot: `key_hash` (low, high), `location` (low, high), `checksum`.
type Slot = [u32; 5];
/// Bytes of DRAM per slot.
pub const SLOT_BYTES: usize = 20;
const _: () = assert!(size_of::<Slot>() == SLOT_BYTES);
const _: () = assert!(align_of::<Slot>() == 4);

const SLOT_EMPTY: Slot = [0; 5];

/// Maximum load: entries / slots never exceeds 9/10.
const MAX_LOAD_NUMERATOR: usize = 9;
const MAX_LOAD_DENOMINATOR: usize = 10;
/// A full shard grows to 5/4 of its slots.
const GROWTH_NUMERATOR: usize = 5;
const GROWTH_DENOMINATOR: usize = 4;
/// `retain` shrinks a shard below 1/2 load (above 40 bytes per entry).
const SHRINK_LOAD_NUMERATOR: usize = 1;
const SHRINK_LOAD_DENOMINATOR: usize = 2;
/// Smallest shard: small enough that 4096 empty shards cost 1.3 MiB.
const SHARD_SLOTS_MIN: usize = 16;
/// Largest shard: `fastrange` maps the low 32 bits of `key_hash`.
const SHARD_SLOTS_MAX: usize = 1 << 32;
/// Standard deviations of headroom per shard when pre-sizing.
const PRESIZE_SIGMAS: f64 = 4.0;

/// Slot arrays this large ask for transparent huge pages (`slots_zeroed`):
/// a few huge pages at least, so that a small index keeps paying RSS only
/// for the 4 KiB pages it touches.
const HUGE_PAGE_ARRAY_BYTES_MIN: usize = 8 << 20;
/// A sorted run is bucketed at the grain of this many slots (20 B each:
/// 1.25 MiB of table, about L2), see `sort_run`. Measured at 20 M entries
/// with huge pages: 2 Ki slots made the sort's scatter (64 Ki buckets) cost
/// as much as the inserts saved; 64 Ki slots was fastest, 256 Ki slower.
const RUN_BUCKET_SLOTS: usize = 65536;
/// At most 2^16 buckets: a 256 KiB count array.
const RUN_BUCKET_BITS_MAX: u32 = 16;
/// Most entries of a run inserted under one shard lock.
const RUN_LOCK_ENTRIES_MAX: usize = 4096;
/// Inserts of a run look this many entries ahead to prefetch their home
/// slots: a random insert waits ~100 ns on DRAM (more through the VM's
/// nested page tables), and this many misses overlap.
const RUN_PREFETCH_DISTANCE: usize = 16;
/// A run shorter than this is inserted by one thread.
const RUN_PARALLEL_ENTRIES_MIN: usize = 1 << 16;

const _: () = assert!(MAX_LOAD_NUMERATOR < MAX_LOAD_DENOMINATOR);
const _: () = assert!(GROWTH_NUMERATOR > GROWTH_DENOMINATOR);
const _: () = assert!(
    SHRINK_LOAD_NUMERATOR * MAX_LOAD_DENOMINATOR * GROWTH_DENOMINATOR
        < SHRINK_LOAD_DENOMINATOR * MAX_LOAD_NUMERATOR * GROWTH_NUMERATOR,
    "a shrunk shard must come out above the shrink load (hysteresis)"
);
// A shard always keeps one empty slot, so every probe loop terminates.
const _: () =
    assert!(SHARD_SLOTS_MIN * MAX_LOAD_NUMERATOR / MAX_LOAD_DENOMINATOR < SHARD_SLOTS_MIN);

/// One index entry, identical to one log entry on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Identity of the record (`l2arc::hash`); never 0.
    pub key_hash: u64,
    /// The packed location word (`docs/format.md`, "Location word").
    pub location: u64,
    /// CRC-32C of `key_hash` and the stored bytes.
    pub checksum: u32,
}

#[inline]
fn slot_pack(entry: &IndexEntry) -> Slot {
    [
        entry.key_hash as u32,
        (entry.key_hash >> 32) as u32,
        entry.location as u32,
        (entry.location >> 32) as u32,
        entry.checksum,
    ]
}

#[inline]
fn slot_unpack(slot: &Slot) -> IndexEntry {
    IndexEntry {
        key_hash: slot_key_hash(slot),
        location: u64::from(slot[2]) | (u64::from(slot[3]) << 32),
        checksum: slot[4],
    }
}

#[inline]
fn slot_key_hash(slot: &Slot) -> u64 {
    u64::from(slot[0]) | (u64::from(slot[1]) << 32)
}

#[inline]
fn slot_is_empty(slot: &Slot) -> bool {
    slot[0] | slot[1] == 0
}

/// Most entries a shard of `slots_count` slots may hold.
fn entries_max(slots_count: usize) -> usize {
    let max = slots_count / MAX_LOAD_DENOMINATOR * MAX_LOAD_NUMERATOR
        + slots_count % MAX_LOAD_DENOMINATOR * MAX_LOAD_NUMERATOR / MAX_LOAD_DENOMINATOR;
    debug_assert!(max < slots_count);
    max
}

/// Fewest slots (at least `SHARD_SLOTS_MIN`) that hold `entries` at `MAX_LOAD`.
fn slots_for_entries(entries: usize) -> usize {
    let slots_count = entries
        .checked_mul(MAX_LOAD_DENOMINATOR)
        .map(|x| x.div_ceil(MAX_LOAD_NUMERATOR))
        .expect("L2ARC index: entry count overflows")
        .max(SHARD_SLOTS_MIN);
    assert!(
        slots_count <= SHARD_SLOTS_MAX,
        "L2ARC index: {entries} entries exceed one shard's {SHARD_SLOTS_MAX} slots; use more shards"
    );
    debug_assert!(entries_max(slots_count) >= entries);
    slots_count
}

/// Slots per shard for `entries_total` entries over `shards` shards. A
/// uniform hash gives each shard a binomial share: mean m, standard
/// deviation ~sqrt(m). Room for m + 4 sigma makes growth unlikely in any
/// shard of a correctly sized index.
fn shard_slots_for_total(entries_total: usize, shards: usize) -> usize {
    let share_mean = entries_total.div_ceil(shards);
    let share_headroom = (PRESIZE_SIGMAS * (share_mean as f64).sqrt()).ceil() as usize;
    slots_for_entries(share_mean.saturating_add(share_headroom))
}

/// One shard: a Robin Hood table over `slots`, sorted by home slot within
/// every cluster, with at least one empty slot.
struct Shard {
    slots: Box<[Slot]>,
    entries_count: usize,
    /// `entries_max(slots.len())`, cached.
    entries_max: usize,
}

/// A zeroed slot array. `vec![[0u32; 5]; n]` is a zeroed allocation
/// (calloc): pages of a pre-sized table cost no RSS until an entry lands in
/// them. One of `HUGE_PAGE_ARRAY_BYTES_MIN` or more asks for transparent
/// huge pages: inserts and lookups land at random in it, and with 4 KiB
/// pages each is a TLB miss walked through the guest's and the host's page
/// tables, and each first write a page fault (a copy of the zero page and
/// a TLB flush on every core); with 2 MiB pages, 512 times fewer of both.
fn slots_zeroed(slots_count: usize) -> Box<[Slot]> {
    let slots = vec![SLOT_EMPTY; slots_count].into_boxed_slice();
    let bytes = slots_count * SLOT_BYTES;
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_PAGE_ARRAY_BYTES_MIN {
        const PAGE_BYTES: usize = 4096;
        let start = slots.as_ptr() as usize;
        let aligned = start.next_multiple_of(PAGE_BYTES);
        let len = (start + bytes - aligned) / PAGE_BYTES * PAGE_BYTES;
        // SAFETY: advice on whole pages inside the allocation just made,
        // which does not change its contents (zeros) or validity; a failure
        // (THP off) leaves normal pages.
        unsafe {
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
    }
    let _ = bytes;
    slots
}

impl Shard {
    fn with_slots(slots_count: usize) -> Shard {
        assert!((SHARD_SLOTS_MIN..=SHARD_SLOTS_MAX).contains(&slots_count));
        Shard {
            slots: slots_zeroed(slots_count),
            entries_count: 0,
            entries_max: entries_max(slots_count),
        }
    }

    /// The home slot of `key_hash`: `fastrange` of its low 32 bits.
    #[inline]
    fn home(&self, key_hash: u64) -> usize {
        ((u64::from(key_hash as u32) * self.slots.len() as u64) >> 32) as usize
    }

    /// Asks the CPU to fetch the home slot of `key_hash` (and the slots
    /// a probe meets next) into cache, without waiting for it.
    #[inline]
    fn prefetch(&self, key_hash: u64) {
        let home = self.home(key_hash);
        let last = (home + 3).min(self.slots.len() - 1);
        #[cfg(target_arch = "x86_64")]
        for index in [home, last] {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            // SAFETY: a prefetch is a hint that never faults nor reads into
            // the program; SSE is part of the x86_64 baseline.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.slots[index].as_ptr().cast()) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (home, last);
    }

    #[inline]
    fn next(&self, index: usize) -> usize {
        debug_assert!(index < self.slots.len());
        let next = index + 1;
        if next == self.slots.len() { 0 } else { next }
    }

    /// Slots between `key_hash`'s home and `index` (wrapping).
    #[inline]
    fn distance(&self, index: usize, key_hash: u64) -> usize {
        let home = self.home(key_hash);
        if index >= home {
            index - home
        } else {
            index + self.slots.len() - home
        }
    }

    fn find(&self, key_hash: u64) -> Option<usize> {
        let mut index = self.home(key_hash);
        let mut distance = 0;
        loop {
            let slot = &self.slots[index];
            if slot_is_empty(slot) {
                return None;
            }
            let slot_key_hash = slot_key_hash(slot);
            if slot_key_hash == key_hash {
                return Some(index);
            }
            // Robin Hood: every entry from here on has its home after ours.
            if self.distance(index, slot_key_hash) < distance {
                return None;
            }
            index = self.next(index);
            distance += 1;
            debug_assert!(distance < self.slots.len());
        }
    }

    /// Inserts `entry`, or finds the entry with its `key_hash` and, if
    /// `overwrite`, replaces it. Returns the entry found.
    fn insert(&mut self, entry: &IndexEntry, overwrite: bool) -> Option<IndexEntry> {
        let key_hash = entry.key_hash;
        debug_assert!(key_hash != 0);
        debug_assert!(self.entries_count <= self.entries_max);
        if self.entries_count == self.entries_max {
            // Full: grow only if the key is new.
            if let Some(index) = self.find(key_hash) {
                let old = slot_unpack(&self.slots[index]);
                if overwrite {
                    self.slots[index] = slot_pack(entry);
                }
                return Some(old);
            }
            self.grow();
        }
        let mut index = self.home(key_hash);
        let mut distance = 0;
        loop {
            let slot = self.slots[index];
            if slot_is_empty(&slot) {
                self.slots[index] = slot_pack(entry);
                self.entries_count += 1;
                return None;
            }
            let slot_key_hash = slot_key_hash(&slot);
            if slot_key_hash == key_hash {
                if overwrite {
                    self.slots[index] = slot_pack(entry);
                }
                return Some(slot_unpack(&slot));
            }
            if self.distance(index, slot_key_hash) < distance {
                // The key is absent and belongs here, before the entries
                // whose home comes after its own: shift them up by one.
                self.slots[index] = slot_pack(entry);
                self.shift_up(self.next(index), slot);
                self.entries_count += 1;
                return None;
            }
            index = self.next(index);
            distance += 1;
            debug_assert!(distance < self.slots.len());
        }
    }

    /// Inserts a key known to be absent, into a shard known to have room.
    fn insert_absent(&mut self, slot_new: Slot) {
        debug_assert!(self.entries_count < self.entries_max);
        let key_hash = slot_key_hash(&slot_new);
        let mut index = self.home(key_hash);
        let mut distance = 0;
        loop {
            let slot = self.slots[index];
            if slot_is_empty(&slot) {
                self.slots[index] = slot_new;
                break;
            }
            debug_assert!(slot_key_hash(&slot) != key_hash);
            if self.distance(index, slot_key_hash(&slot)) < distance {
                self.slots[index] = slot_new;
                self.shift_up(self.next(index), slot);
                break;
            }
            index = self.next(index);
            distance += 1;
            debug_assert!(distance < self.slots.len());
        }
        self.entries_count += 1;
    }

    /// Puts `carried` at `index` and moves the rest of the cluster up by one
    /// slot, into the first empty slot.
    fn shift_up(&mut self, mut index: usize, mut carried: Slot) {
        for _ in 0..self.slots.len() {
            let slot = std::mem::replace(&mut self.slots[index], carried);
            if slot_is_empty(&slot) {
                return;
            }
            carried = slot;
            index = self.next(index);
        }
        unreachable!("L2ARC index: a shard always has an empty slot");
    }

    /// Removes the entry at `index`; backward shift: the following entries
    /// of its cluster that are not at home move back by one slot.
    fn remove_at(&mut self, index: usize) -> IndexEntry {
        debug_assert!(!slot_is_empty(&self.slots[index]));
        let removed = slot_unpack(&self.slots[index]);
        let mut hole = index;
        loop {
            let next = self.next(hole);
            let slot = self.slots[next];
            if slot_is_empty(&slot) || self.distance(next, slot_key_hash(&slot)) == 0 {
                break;
            }
            self.slots[hole] = slot;
            hole = next;
            debug_assert!(hole != index);
        }
        self.slots[hole] = SLOT_EMPTY;
        self.entries_count -= 1;
        removed
    }

    fn grow(&mut self) {
        let slots_count = self.slots.len();
        assert!(
            slots_count < SHARD_SLOTS_MAX,
            "L2ARC index: a shard is full at {SHARD_SLOTS_MAX} slots; use more shards"
        );
        let grown = (slots_count / GROWTH_DENOMINATOR * GROWTH_NUMERATOR)
            .max(slots_count + 1)
            .min(SHARD_SLOTS_MAX);
        self.resize(grown);
    }

    /// The first slot that is empty or holds an entry at its home: no
    /// cluster crosses it, so a walk over all slots from here meets every
    /// cluster whole and the entries in home order.
    fn cluster_boundary(&self) -> usize {
        (0..self.slots.len())
            .find(|&index| {
                let slot = &self.slots[index];
                slot_is_empty(slot) || self.distance(index, slot_key_hash(slot)) == 0
            })
            .expect("L2ARC index: a shard always has an empty slot")
    }

    /// Rehashes every entry into `slots_count` slots.
    fn resize(&mut self, slots_count: usize) {
        assert!(entries_max(slots_count) >= self.entries_count);
        let boundary = self.cluster_boundary();
        let old = std::mem::replace(&mut self.slots, slots_zeroed(slots_count));
        let entries_count = self.entries_count;
        self.entries_count = 0;
        self.entries_max = entries_max(slots_count);
        // A merge, not a rehash: read from a cluster boundary, the old slots
        // come in home order, and fastrange (monotonic in the low 32 bits)
        // keeps the new homes in that order, but for entries that shared an
        // old home. So each entry goes to its new home or right after the
        // previous one, without probing. An entry whose new home is below the
        // previous one, or that runs past the end, is inserted by probing.
        let mut home_max = 0;
        let mut free_first = 0; // Below it, the merge has filled every slot.
        let mut overflow: Vec<Slot> = Vec::new();
        let (old_tail, old_head) = old.split_at(boundary);
        for slot in old_head.iter().chain(old_tail) {
            if slot_is_empty(slot) {
                continue;
            }
            let home = self.home(slot_key_hash(slot));
            if home < home_max {
                self.insert_absent(*slot);
                // Its shift, if any, ended in the first free slot.
                if free_first < slots_count && !slot_is_empty(&self.slots[free_first]) {
                    free_first += 1;
                }
                continue;
            }
            home_max = home;
            let index = home.max(free_first);
            if index < slots_count {
                debug_assert!(slot_is_empty(&self.slots[index]));
                self.slots[index] = *slot;
                self.entries_count += 1;
                free_first = index + 1;
            } else {
                overflow.push(*slot);
            }
        }
        for slot in overflow {
            self.insert_absent(slot);
        }
        assert_eq!(self.entries_count, entries_count);
    }

    /// Removes the entries `keep` rejects; shrinks if very underloaded, not
    /// below `slots_min`. Returns how many were removed.
    fn retain(&mut self, keep: &mut impl FnMut(&IndexEntry) -> bool, slots_min: usize) -> usize {
        let slots_count = self.slots.len();
        // Start at a cluster boundary: a backward shift then never moves an
        // entry from the start of the sweep to its end, so each entry is
        // offered to `keep` exactly once.
        let start = self.cluster_boundary();
        let mut removed_count = 0;
        let mut index = start;
        for _ in 0..slots_count {
            // After a removal the next entry has shifted into `index`.
            while !slot_is_empty(&self.slots[index]) && !keep(&slot_unpack(&self.slots[index])) {
                self.remove_at(index);
                removed_count += 1;
            }
            index = self.next(index);
        }
        let slots_min = slots_min.max(SHARD_SLOTS_MIN);
        if slots_count > slots_min
            && self.entries_count * SHRINK_LOAD_DENOMINATOR < slots_count * SHRINK_LOAD_NUMERATOR
        {
            // Back to the load a growth leaves behind: MAX_LOAD / GROWTH.
            let shrunk = slots_for_entries(self.entries_count)
                .saturating_mul(GROWTH_NUMERATOR)
                .div_ceil(GROWTH_DENOMINATOR)
                .max(slots_min);
            if shrunk < slots_count {
                self.resize(shrunk);
            }
        }
        removed_count
    }

    /// Checks the Robin Hood invariants, and that `belongs` holds for every
    /// key (it is in the right shard).
    fn assert_consistent(&self, belongs: impl Fn(u64) -> bool) {
        let slots_count = self.slots.len();
        assert!((SHARD_SLOTS_MIN..=SHARD_SLOTS_MAX).contains(&slots_count));
        assert_eq!(self.entries_max, entries_max(slots_count));
        assert!(self.entries_count <= self.entries_max);
        assert!(self.entries_max < slots_count);
        let mut entries_count = 0;
        for index in 0..slots_count {
            let slot = &self.slots[index];
            if slot_is_empty(slot) {
                assert_eq!(*slot, SLOT_EMPTY, "an empty slot is all zeros");
                continue;
            }
            entries_count += 1;
            let key_hash = slot_key_hash(slot);
            assert!(belongs(key_hash), "entry in the wrong shard");
            // Reachable: the search from its home stops exactly here (this
            // also rules out a duplicate further along).
            assert_eq!(self.find(key_hash), Some(index), "entry not reachable");
            // Probe distances: no gap between home and here, and along a
            // cluster a distance rises by at most one per slot.
            let distance = self.distance(index, key_hash);
            let previous = (index + slots_count - 1) % slots_count;
            if distance > 0 {
                let previous_slot = &self.slots[previous];
                assert!(!slot_is_empty(previous_slot), "gap between home and entry");
                assert!(
                    self.distance(previous, slot_key_hash(previous_slot)) + 1 >= distance,
                    "Robin Hood order broken"
                );
            }
        }
        assert_eq!(entries_count, self.entries_count);
    }
}

/// A zero `key_hash` would be stored as an empty slot: refused before any
/// lock is taken (a panic under the lock would poison the shard).
fn assert_key_hash_stored(key_hash: u64) {
    assert!(key_hash != 0, "L2ARC index: key_hash 0 marks an empty slot");
}

/// A shard with its lock and published counters, alone on its cache line.
#[repr(align(64))]
struct ShardCell {
    shard: Mutex<Shard>,
    /// Copies of `entries_count` and `slots.len()`, stored under the lock,
    /// read without it by `len` and `memory_bytes`.
    entries_count: AtomicUsize,
    slots_count: AtomicUsize,
}

const SHARD_CELL_BYTES: usize = size_of::<ShardCell>();
const _: () = assert!(SHARD_CELL_BYTES == 64);

impl ShardCell {
    fn lock(&self) -> MutexGuard<'_, Shard> {
        self.shard.lock().expect("L2ARC index shard lock poisoned")
    }

    fn publish(&self, shard: &Shard) {
        self.entries_count
            .store(shard.entries_count, Ordering::Relaxed);
        self.slots_count.store(shard.slots.len(), Ordering::Relaxed);
    }
}

/// The DRAM index of every record cached on the L2ARC devices: a sharded
/// Robin Hood table of 20-byte entries keyed by `key_hash`.
pub struct L2Index {
    cells: Box<[ShardCell]>,
    /// `log2(cells.len())`: the shard is the top `shard_bits` of `key_hash`.
    shard_bits: u32,
    /// Slots per shard as `new` sized them (`clear` returns to this size and
    /// `retain` never shrinks below it).
    shard_slots_initial: usize,
}

impl L2Index {
    /// An index of `shards` shards (a power of two, 1..=4096), each sized to
    /// hold its share of `expected_entries` without growing.
    pub fn new(shards: usize, expected_entries: usize) -> L2Index {
        assert!(
            shards.is_power_of_two() && shards <= SHARDS_MAX,
            "L2ARC index: shards must be a power of two from 1 to {SHARDS_MAX}, not {shards}"
        );
        let shard_bits = shards.trailing_zeros();
        assert!(shard_bits <= SHARD_BITS_MAX);
        let shard_slots_initial = shard_slots_for_total(expected_entries, shards);
        let cells: Box<[ShardCell]> = (0..shards)
            .map(|_| {
                let shard = Shard::with_slots(shard_slots_initial);
                ShardCell {
                    shard: Mutex::new(shard),
                    entries_count: AtomicUsize::new(0),
                    slots_count: AtomicUsize::new(shard_slots_initial),
                }
            })
            .collect();
        L2Index {
            cells,
            shard_bits,
            shard_slots_initial,
        }
    }

    /// The shard of `key_hash`: its top `shard_bits` bits.
    #[inline]
    fn shard_index(&self, key_hash: u64) -> usize {
        // Two shifts, so that 0 shard bits never shifts a u64 by 64.
        ((key_hash >> 32) >> (32 - self.shard_bits)) as usize
    }

    #[inline]
    fn cell(&self, key_hash: u64) -> &ShardCell {
        &self.cells[self.shard_index(key_hash)]
    }

    /// The entry for a key.
    pub fn get(&self, key_hash: u64) -> Option<IndexEntry> {
        debug_assert!(key_hash != 0, "L2ARC index: key_hash 0 is never stored");
        let shard = self.cell(key_hash).lock();
        shard
            .find(key_hash)
            .map(|index| slot_unpack(&shard.slots[index]))
    }

    /// Inserts `entry`, replacing the entry with the same `key_hash`, which
    /// is returned. Panics if `entry.key_hash` is 0.
    pub fn insert(&self, entry: IndexEntry) -> Option<IndexEntry> {
        assert_key_hash_stored(entry.key_hash);
        let cell = self.cell(entry.key_hash);
        let mut shard = cell.lock();
        let old = shard.insert(&entry, true);
        cell.publish(&shard);
        old
    }

    /// Inserts `entry` unless an entry with its `key_hash` is present (for
    /// rebuild, which walks from newest to oldest). Returns whether inserted.
    pub fn insert_if_absent(&self, entry: IndexEntry) -> bool {
        assert_key_hash_stored(entry.key_hash);
        let cell = self.cell(entry.key_hash);
        let mut shard = cell.lock();
        let found = shard.insert(&entry, false);
        cell.publish(&shard);
        found.is_none()
    }

    /// Makes room, in every shard, for its share of `entries_total`
    /// entries without growing: a shard smaller than `new` would have made
    /// it for that count grows to that size now, in one merge pass, while
    /// it is still small. Never shrinks a shard.
    pub fn reserve(&self, entries_total: usize) {
        let slots_count = shard_slots_for_total(entries_total, self.cells.len());
        for cell in self.cells.iter() {
            let mut shard = cell.lock();
            if shard.slots.len() < slots_count {
                shard.resize(slots_count);
                cell.publish(&shard);
            }
        }
    }

    /// A bijection of `key_hash` whose order is the index's order: shard
    /// first (the top `shard_bits`), then home slot (the low 32 bits, which
    /// `fastrange` maps monotonically), then the rest of the key.
    #[inline]
    fn order_key(&self, key_hash: u64) -> u64 {
        let shard_bits = self.shard_bits;
        let high = key_hash >> 32;
        let low = key_hash & 0xFFFF_FFFF;
        let shard = high >> (32 - shard_bits);
        let rest = high & ((1u64 << (32 - shard_bits)) - 1);
        (((u128::from(shard)) << (64 - shard_bits)) as u64) | (low << (32 - shard_bits)) | rest
    }

    /// Bits of `order_key` that a run is bucketed by: enough that a bucket
    /// covers about `RUN_BUCKET_SLOTS` slots of the table, at most
    /// `RUN_BUCKET_BITS_MAX`.
    fn run_bucket_bits(&self) -> u32 {
        let slots_total: usize = self
            .cells
            .iter()
            .map(|cell| cell.slots_count.load(Ordering::Relaxed))
            .sum();
        let buckets = (slots_total / RUN_BUCKET_SLOTS).max(1);
        (usize::BITS - (buckets - 1).leading_zeros()).min(RUN_BUCKET_BITS_MAX)
    }

    /// Orders `run` into `sorted` (cleared first) by shard and home slot, at
    /// the grain of a bucket of ~`RUN_BUCKET_SLOTS` slots: a counting sort,
    /// two passes over the run, stable, so entries of one key keep their
    /// order in `run`. `counts` is scratch (`1 << RUN_BUCKET_BITS_MAX` at
    /// most).
    pub fn sort_run(
        &self,
        run: &[IndexEntry],
        sorted: &mut Vec<IndexEntry>,
        counts: &mut Vec<u32>,
    ) {
        sorted.clear();
        let bucket_bits = self.run_bucket_bits();
        let shift = 64 - bucket_bits;
        let bucket = |e: &IndexEntry| {
            if bucket_bits == 0 {
                0
            } else {
                (self.order_key(e.key_hash) >> shift) as usize
            }
        };
        counts.clear();
        counts.resize(1 << bucket_bits, 0);
        for e in run {
            counts[bucket(e)] += 1;
        }
        let mut at = 0u32;
        for count in counts.iter_mut() {
            let n = *count;
            *count = at;
            at += n;
        }
        debug_assert_eq!(at as usize, run.len());
        let empty = IndexEntry {
            key_hash: 0,
            location: 0,
            checksum: 0,
        };
        sorted.resize(run.len(), empty);
        for e in run {
            let b = bucket(e);
            sorted[counts[b] as usize] = *e;
            counts[b] += 1;
        }
    }

    /// Inserts a run sorted by [`sort_run`](Self::sort_run), each entry
    /// unless its key is present already (in the index, or earlier in the
    /// run): for rebuild, which meets the newest entry of a record first.
    /// Entries not inserted get `key_hash` 0 in `sorted`, so the caller can
    /// account the rest. Locks each shard once per `RUN_LOCK_ENTRIES_MAX`
    /// entries at most, so a reader waits for no more than that many
    /// inserts; `threads` (1 or more) split the shards between them.
    /// Returns how many were inserted.
    pub fn insert_sorted_if_absent(&self, sorted: &mut [IndexEntry], threads: usize) -> usize {
        if threads <= 1 || sorted.len() < RUN_PARALLEL_ENTRIES_MIN {
            return self.insert_sorted_if_absent_one(sorted);
        }
        // Split at shard boundaries near equal shares.
        let mut parts: Vec<&mut [IndexEntry]> = Vec::with_capacity(threads);
        let mut rest = sorted;
        for part in (1..threads).rev() {
            let share = rest.len() / (part + 1);
            let Some(pivot) = rest.get(share) else { break };
            let shard = self.shard_index(pivot.key_hash);
            let cut = rest.partition_point(|e| self.shard_index(e.key_hash) < shard);
            let cut = if cut == 0 {
                rest.partition_point(|e| self.shard_index(e.key_hash) <= shard)
            } else {
                cut
            };
            let (head, tail) = rest.split_at_mut(cut);
            parts.push(head);
            rest = tail;
        }
        parts.push(rest);
        std::thread::scope(|scope| {
            let mut parts = parts.into_iter();
            let first = parts.next().expect("at least one part");
            let others: Vec<_> = parts
                .map(|part| scope.spawn(move || self.insert_sorted_if_absent_one(part)))
                .collect();
            let mut inserted = self.insert_sorted_if_absent_one(first);
            for other in others {
                inserted += other.join().expect("an insert thread panicked");
            }
            inserted
        })
    }

    fn insert_sorted_if_absent_one(&self, sorted: &mut [IndexEntry]) -> usize {
        let mut inserted = 0;
        let mut rest = sorted;
        while let Some(first) = rest.first() {
            assert_key_hash_stored(first.key_hash);
            let shard_index = self.shard_index(first.key_hash);
            let end = rest
                .iter()
                .take(RUN_LOCK_ENTRIES_MAX)
                .position(|e| self.shard_index(e.key_hash) != shard_index)
                .unwrap_or(rest.len().min(RUN_LOCK_ENTRIES_MAX));
            let (chunk, tail) = rest.split_at_mut(end);
            let cell = &self.cells[shard_index];
            let mut shard = cell.lock();
            for i in 0..chunk.len() {
                if let Some(ahead) = chunk.get(i + RUN_PREFETCH_DISTANCE) {
                    shard.prefetch(ahead.key_hash);
                }
                let e = &mut chunk[i];
                debug_assert_eq!(self.shard_index(e.key_hash), shard_index);
                if shard.insert(e, false).is_none() {
                    inserted += 1;
                } else {
                    e.key_hash = 0;
                }
            }
            cell.publish(&shard);
            drop(shard);
            rest = tail;
        }
        inserted
    }

    /// Removes a key's entry and returns it.
    pub fn remove(&self, key_hash: u64) -> Option<IndexEntry> {
        self.remove_if(key_hash, |_| true)
    }

    /// Removes the entry of `key_hash` only if `pred` holds for it (e.g. it
    /// still points at the location the caller knows).
    pub fn remove_if(
        &self,
        key_hash: u64,
        pred: impl FnOnce(&IndexEntry) -> bool,
    ) -> Option<IndexEntry> {
        debug_assert!(key_hash != 0, "L2ARC index: key_hash 0 is never stored");
        let cell = self.cell(key_hash);
        let mut shard = cell.lock();
        let index = shard.find(key_hash)?;
        if !pred(&slot_unpack(&shard.slots[index])) {
            return None;
        }
        let removed = shard.remove_at(index);
        cell.publish(&shard);
        Some(removed)
    }

    /// Removes every entry `keep` rejects, one shard (one lock) at a time;
    /// shrinks shards left below 1/2 load. Returns how many were removed.
    pub fn retain(&self, mut keep: impl FnMut(&IndexEntry) -> bool) -> usize {
        let mut removed_count = 0;
        for cell in self.cells.iter() {
            let mut shard = cell.lock();
            removed_count += shard.retain(&mut keep, self.shard_slots_initial);
            cell.publish(&shard);
        }
        removed_count
    }

    /// Bits of `key_hash` the index keeps to tell keys apart (all 64).
    pub fn fingerprint_bits(&self) -> u32 {
        64
    }

    /// Entries in the index (a sum of per-shard counts, not a snapshot while
    /// other threads write).
    pub fn len(&self) -> usize {
        self.cells
            .iter()
            .map(|cell| cell.entries_count.load(Ordering::Relaxed))
            .sum()
    }

    /// Whether the index holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of DRAM the index holds: slot arrays and shard structs
    /// (`l2_hdr_size`). Excludes the `L2Index` struct itself (32 bytes).
    pub fn memory_bytes(&self) -> usize {
        let slots_count: usize = self
            .cells
            .iter()
            .map(|cell| cell.slots_count.load(Ordering::Relaxed))
            .sum();
        slots_count * SLOT_BYTES + self.cells.len() * SHARD_CELL_BYTES
    }

    /// Removes every entry and returns each shard to its initial size.
    pub fn clear(&self) {
        for cell in self.cells.iter() {
            let mut shard = cell.lock();
            *shard = Shard::with_slots(self.shard_slots_initial);
            cell.publish(&shard);
        }
    }

    /// Checks every shard's invariants (for tests; O(slots)): counts, load,
    /// every entry in its shard and reachable from its home, Robin Hood order.
    pub fn assert_consistent(&self) {
        for (shard_index, cell) in self.cells.iter().enumerate() {
            let shard = cell.lock();
            shard.assert_consistent(|key_hash| self.shard_index(key_hash) == shard_index);
            assert_eq!(
                cell.entries_count.load(Ordering::Relaxed),
                shard.entries_count
            );
            assert_eq!(cell.slots_count.load(Ordering::Relaxed), shard.slots.len());
            assert!(shard.slots.len() >= self.shard_slots_initial);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Instant;

    use proptest::prelude::*;

    use super::*;
    use crate::hash::{FastHashMap, mix64};

    fn entry(key_hash: u64, n: u64) -> IndexEntry {
        IndexEntry {
            key_hash,
            location: mix64(n ^ 0x5555),
            checksum: n as u32,
        }
    }

    /// The `n`-th key of a test: well mixed, as `l2arc::hash` makes them.
    fn key(n: u64) -> u64 {
        mix64(n).max(1)
    }

    /// Key `k` of a small key space, in three shapes: well mixed; raw small
    /// integers (all in shard 0, all at home slot 0: one long cluster); and
    /// low 32 bits near `u32::MAX` (home at the last slot: clusters wrap).
    fn small_key(k: u16) -> u64 {
        let k = u64::from(k);
        let key_hash = match k % 4 {
            1 => k,
            2 => (mix64(k) & !0xFFFF_FFFF) | (0xFFFF_FFFF - k % 16),
            _ => mix64(k),
        };
        key_hash.max(1)
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u16, u64),
        InsertIfAbsent(u16, u64),
        Remove(u16),
        /// Removes if the location's low bit equals the flag.
        RemoveIf(u16, bool),
        Get(u16),
        /// Keeps entries whose `location % modulus != remainder`.
        Retain(u64, u64),
        Clear,
    }

    const SMALL_KEYS: u16 = 300;

    fn op_strategy() -> impl Strategy<Value = Op> {
        let k = || 0..SMALL_KEYS;
        prop_oneof![
            30 => (k(), any::<u64>()).prop_map(|(k, n)| Op::Insert(k, n)),
            20 => (k(), any::<u64>()).prop_map(|(k, n)| Op::InsertIfAbsent(k, n)),
            12 => k().prop_map(Op::Remove),
            8 => (k(), any::<bool>()).prop_map(|(k, bit)| Op::RemoveIf(k, bit)),
            15 => k().prop_map(Op::Get),
            2 => (1..6u64).prop_flat_map(|m| (Just(m), 0..m)).prop_map(|(m, r)| Op::Retain(m, r)),
            1 => Just(Op::Clear),
        ]
    }

    fn run_model(shards: usize, expected_entries: usize, ops: &[Op]) {
        let index = L2Index::new(shards, expected_entries);
        let mut model: HashMap<u64, IndexEntry> = HashMap::new();
        for op in ops {
            match *op {
                Op::Insert(k, n) => {
                    let e = entry(small_key(k), n);
                    assert_eq!(index.insert(e), model.insert(e.key_hash, e), "{op:?}");
                }
                Op::InsertIfAbsent(k, n) => {
                    let e = entry(small_key(k), n);
                    let absent = !model.contains_key(&e.key_hash);
                    if absent {
                        model.insert(e.key_hash, e);
                    }
                    assert_eq!(index.insert_if_absent(e), absent, "{op:?}");
                }
                Op::Remove(k) => {
                    let key_hash = small_key(k);
                    assert_eq!(index.remove(key_hash), model.remove(&key_hash), "{op:?}");
                }
                Op::RemoveIf(k, bit) => {
                    let key_hash = small_key(k);
                    let pred = |e: &IndexEntry| (e.location & 1 == 1) == bit;
                    let expected = match model.get(&key_hash) {
                        Some(e) if pred(e) => model.remove(&key_hash),
                        _ => None,
                    };
                    assert_eq!(index.remove_if(key_hash, pred), expected, "{op:?}");
                }
                Op::Get(k) => {
                    let key_hash = small_key(k);
                    assert_eq!(index.get(key_hash), model.get(&key_hash).copied(), "{op:?}");
                }
                Op::Retain(modulus, remainder) => {
                    let keep = |e: &IndexEntry| e.location % modulus != remainder;
                    let before = model.len();
                    model.retain(|_, e| keep(e));
                    let mut offered = 0;
                    let removed = index.retain(|e| {
                        offered += 1;
                        keep(e)
                    });
                    assert_eq!(removed, before - model.len(), "{op:?}");
                    assert_eq!(offered, before, "each entry is offered to keep once");
                }
                Op::Clear => {
                    model.clear();
                    index.clear();
                }
            }
            index.assert_consistent();
            assert_eq!(index.len(), model.len());
            assert_eq!(index.is_empty(), model.is_empty());
            assert!(index.memory_bytes() >= index.len() * SLOT_BYTES + shards * 64);
        }
        for k in 0..SMALL_KEYS {
            let key_hash = small_key(k);
            assert_eq!(index.get(key_hash), model.get(&key_hash).copied());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(150))]

        #[test]
        fn matches_hashmap_model(
            shards in prop_oneof![Just(1usize), Just(2), Just(4), Just(16)],
            expected_entries in prop_oneof![Just(0usize), 0..400usize],
            ops in prop::collection::vec(op_strategy(), 1..500),
        ) {
            run_model(shards, expected_entries, &ops);
        }
    }

    /// The bulk path (`sort_run` then `insert_sorted_if_absent`, run by
    /// run) against `insert_if_absent` of every entry in run order.
    fn run_bulk_model(
        shards: usize,
        expected_entries: usize,
        runs: &[Vec<(u16, u64)>],
        threads: usize,
    ) {
        let bulk = L2Index::new(shards, expected_entries);
        let model = L2Index::new(shards, expected_entries);
        let (mut sorted, mut counts) = (Vec::new(), Vec::new());
        for run in runs {
            let run: Vec<IndexEntry> = run.iter().map(|&(k, n)| entry(small_key(k), n)).collect();
            let mut inserted_model = HashMap::new();
            for e in &run {
                if model.insert_if_absent(*e) {
                    inserted_model.insert(e.key_hash, *e);
                }
            }
            bulk.sort_run(&run, &mut sorted, &mut counts);
            assert_eq!(sorted.len(), run.len());
            let inserted = bulk.insert_sorted_if_absent(&mut sorted, threads);
            assert_eq!(inserted, inserted_model.len());
            // Exactly the inserted entries keep their key.
            let kept: HashMap<u64, IndexEntry> = sorted
                .iter()
                .filter(|e| e.key_hash != 0)
                .map(|e| (e.key_hash, *e))
                .collect();
            assert_eq!(kept, inserted_model);
            bulk.assert_consistent();
        }
        assert_eq!(bulk.len(), model.len());
        for k in 0..SMALL_KEYS {
            assert_eq!(bulk.get(small_key(k)), model.get(small_key(k)));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]

        #[test]
        fn bulk_inserts_match_inserts_in_order(
            shards in prop_oneof![Just(1usize), Just(4), Just(64)],
            expected_entries in prop_oneof![Just(0usize), 0..400usize],
            runs in prop::collection::vec(
                prop::collection::vec((0..SMALL_KEYS, any::<u64>()), 0..300), 1..6),
        ) {
            run_bulk_model(shards, expected_entries, &runs, 1);
        }
    }

    #[test]
    fn bulk_inserts_split_between_threads_match_inserts_in_order() {
        // Large enough runs to be split; keys repeat within and across runs.
        let index = L2Index::new(64, 0);
        let model = L2Index::new(64, 0);
        let (mut sorted, mut counts) = (Vec::new(), Vec::new());
        for run_number in 0..3u64 {
            let run: Vec<IndexEntry> = (0..200_000u64)
                .map(|i| entry(key(mix64(i ^ run_number) % 300_000), i + run_number))
                .collect();
            let expected = run.iter().filter(|e| model.insert_if_absent(**e)).count();
            index.sort_run(&run, &mut sorted, &mut counts);
            assert_eq!(index.insert_sorted_if_absent(&mut sorted, 2), expected);
        }
        index.assert_consistent();
        assert_eq!(index.len(), model.len());
        for n in 0..300_000 {
            assert_eq!(index.get(key(n)), model.get(key(n)));
        }
    }

    #[test]
    fn order_key_is_shard_then_home_order() {
        for shards in [1usize, 2, 64, SHARDS_MAX] {
            let index = L2Index::new(shards, 0);
            let mut keys: Vec<u64> = (0..20_000u64).map(key).collect();
            keys.extend([1, u64::MAX, 1 << 63, 0xFFFF_FFFF, 1 << 32]);
            keys.sort_unstable();
            keys.dedup();
            let mut order: Vec<u64> = keys.iter().map(|&k| index.order_key(k)).collect();
            order.sort_unstable();
            order.dedup();
            assert_eq!(order.len(), keys.len(), "order_key is one to one");
            keys.sort_by_key(|&k| index.order_key(k));
            let shard = Shard::with_slots(1_000_003);
            for pair in keys.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                let (sa, sb) = (index.shard_index(a), index.shard_index(b));
                assert!(sa <= sb);
                if sa == sb {
                    assert!(shard.home(a) <= shard.home(b));
                }
            }
        }
    }

    #[test]
    fn reserve_sizes_as_new_and_keeps_entries() {
        const N: u64 = 300_000;
        let index = L2Index::new(64, 0);
        for n in 1..=1000 {
            index.insert(entry(key(n), n));
        }
        index.reserve(N as usize);
        assert_eq!(
            index.memory_bytes(),
            L2Index::new(64, N as usize).memory_bytes()
        );
        let memory_bytes = index.memory_bytes();
        for n in 1..=1000 {
            assert_eq!(index.get(key(n)), Some(entry(key(n), n)));
        }
        let run: Vec<IndexEntry> = (1001..=N).map(|n| entry(key(n), n)).collect();
        let (mut sorted, mut counts) = (Vec::new(), Vec::new());
        index.sort_run(&run, &mut sorted, &mut counts);
        index.insert_sorted_if_absent(&mut sorted, 2);
        assert_eq!(index.len(), N as usize);
        assert_eq!(
            index.memory_bytes(),
            memory_bytes,
            "a reserved index does not grow"
        );
        // Never shrinks.
        index.reserve(10);
        assert_eq!(index.memory_bytes(), memory_bytes);
        index.assert_consistent();
    }

    #[test]
    fn empty_index_sizes() {
        let index = L2Index::new(1, 0);
        assert_eq!(index.memory_bytes(), 64 + SHARD_SLOTS_MIN * SLOT_BYTES);
        let index = L2Index::new(SHARDS_MAX, 0);
        assert_eq!(
            index.memory_bytes(),
            SHARDS_MAX * (64 + SHARD_SLOTS_MIN * SLOT_BYTES)
        );
        assert!(index.is_empty());
        assert_eq!(index.get(1), None);
        assert_eq!(index.remove(1), None);
        assert_eq!(index.retain(|_| false), 0);
        index.assert_consistent();
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn shards_must_be_a_power_of_two() {
        L2Index::new(3, 0);
    }

    #[test]
    #[should_panic(expected = "key_hash 0")]
    fn zero_key_hash_is_refused() {
        L2Index::new(1, 0).insert(entry(0, 1));
    }

    #[test]
    fn extreme_keys_use_every_shard_bit() {
        let index = L2Index::new(SHARDS_MAX, 0);
        for key_hash in [1, u64::MAX, u64::MAX - 1, 1 << 63, 0xFFFF_FFFF, 1 << 32] {
            assert_eq!(index.insert(entry(key_hash, 7)), None);
            assert_eq!(index.get(key_hash), Some(entry(key_hash, 7)));
        }
        assert_eq!(index.shard_index(u64::MAX), SHARDS_MAX - 1);
        assert_eq!(index.shard_index(1), 0);
        index.assert_consistent();
    }

    #[test]
    fn grows_from_tiny_to_100k_and_shrinks_back() {
        const N: u64 = 100_000;
        let index = L2Index::new(4, 0);
        for n in 1..=N {
            assert_eq!(index.insert(entry(key(n), n)), None);
        }
        index.assert_consistent();
        assert_eq!(index.len(), N as usize);
        for n in 1..=N {
            assert_eq!(index.get(key(n)), Some(entry(key(n), n)));
        }
        assert_eq!(index.get(key(N + 1)), None);
        let bytes_per_entry = index.memory_bytes() as f64 / N as f64;
        assert!(
            (20.0 / 0.9..=20.0 / 0.72 + 0.1).contains(&bytes_per_entry),
            "{bytes_per_entry}"
        );
        // Replace and insert_if_absent on a full index never grow it.
        let memory_bytes = index.memory_bytes();
        for n in 1..=N {
            assert_eq!(index.insert(entry(key(n), n + 1)), Some(entry(key(n), n)));
            assert!(!index.insert_if_absent(entry(key(n), n)));
        }
        assert_eq!(index.memory_bytes(), memory_bytes);
        // Sweep away three quarters: shards shrink back within budget.
        let removed = index.retain(|e| e.checksum % 4 == 0);
        assert_eq!(removed, (N - N / 4) as usize);
        index.assert_consistent();
        let bytes_per_entry = index.memory_bytes() as f64 / index.len() as f64;
        assert!(bytes_per_entry < 32.0, "{bytes_per_entry}");
        for n in 1..=N {
            let expected = ((n + 1) % 4 == 0).then(|| entry(key(n), n + 1));
            assert_eq!(index.get(key(n)), expected);
        }
        index.clear();
        assert!(index.is_empty());
        assert_eq!(
            index.memory_bytes(),
            4 * (64 + SHARD_SLOTS_MIN * SLOT_BYTES)
        );
        index.assert_consistent();
    }

    #[test]
    fn threads_share_the_index() {
        const THREADS: u64 = 4;
        const PER_THREAD: u64 = 20_000;
        let index = L2Index::new(8, 0);
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let index = &index;
                scope.spawn(move || {
                    let first = thread * PER_THREAD + 1;
                    for n in first..first + PER_THREAD {
                        assert_eq!(index.insert(entry(key(n), n)), None);
                    }
                    // Remove every other one, the rest only if unchanged.
                    for n in (first..first + PER_THREAD).step_by(2) {
                        assert_eq!(index.remove(key(n)), Some(entry(key(n), n)));
                        let kept = index.remove_if(key(n + 1), |e| e.checksum != n as u32 + 1);
                        assert_eq!(kept, None);
                    }
                });
            }
            // A concurrent sweep that keeps everything.
            scope.spawn(|| index.retain(|_| true));
        });
        index.assert_consistent();
        assert_eq!(index.len(), (THREADS * PER_THREAD / 2) as usize);
        for n in 1..=THREADS * PER_THREAD {
            assert_eq!(index.get(key(n)).is_some(), n % 2 == 0);
        }
    }

    /// Inserts `key(1..=entries)`; returns (memory bytes, seconds).
    fn fill(index: &L2Index, entries: u64) -> (usize, f64) {
        let start = Instant::now();
        for n in 1..=entries {
            index.insert(entry(key(n), n));
        }
        (index.memory_bytes(), start.elapsed().as_secs_f64())
    }

    #[test]
    fn one_million_entries_within_32_bytes_each() {
        const N: u64 = 1_000_000;
        for shards in [1, 64, 1024, SHARDS_MAX] {
            // Pre-sized: no shard grows.
            let index = L2Index::new(shards, N as usize);
            let memory_bytes_initial = index.memory_bytes();
            let (memory_bytes, _) = fill(&index, N);
            assert_eq!(memory_bytes, memory_bytes_initial, "{shards} shards grew");
            let presized = memory_bytes as f64 / N as f64;
            assert!(presized <= 32.0, "{shards} shards, pre-sized: {presized}");
            // Grown from empty, checked all along the growth cycle.
            let index = L2Index::new(shards, 0);
            let mut grown_min = f64::MAX;
            let mut grown_max = 0.0f64;
            for n in 1..=N {
                index.insert(entry(key(n), n));
                if n >= 200_000 && n % 1000 == 0 {
                    let bytes_per_entry = index.memory_bytes() as f64 / n as f64;
                    grown_min = grown_min.min(bytes_per_entry);
                    grown_max = grown_max.max(bytes_per_entry);
                }
            }
            let grown = index.memory_bytes() as f64 / N as f64;
            assert!(grown_max <= 32.0, "{shards} shards, grown: {grown_max}");
            println!(
                "l2index 1M, {shards:4} shards: pre-sized {presized:.1} B/entry; grown {grown:.1} \
                 (range {grown_min:.1}..{grown_max:.1} over 200k..1M)"
            );
        }
    }

    /// Resident set size of this process, bytes (other tests running at
    /// the same time blur it; a cross-check only).
    fn rss_bytes() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<usize>()
                    .ok()
            })
            .map_or(0, |kib| kib * 1024)
    }

    /// Bytes hashbrown allocates for a `HashMap` of this capacity: buckets of
    /// `bucket_bytes` plus one control byte each, plus 16 trailing control
    /// bytes; a table of 8 or more buckets has capacity 7/8 of them.
    fn hashmap_bytes(capacity: usize, bucket_bytes: usize) -> usize {
        let buckets = if capacity < 8 {
            (capacity + 1).next_power_of_two()
        } else {
            capacity / 7 * 8
        };
        assert!(buckets.is_power_of_two());
        buckets * (bucket_bytes + 1) + 16
    }

    type StdMap = FastHashMap<u64, (u64, u32)>;
    const STD_BUCKET_BYTES: usize = size_of::<(u64, (u64, u32))>();

    fn mops(count: u64, seconds: f64) -> f64 {
        count as f64 / seconds / 1e6
    }

    /// Gets `key(from..from + count)`; returns (found, seconds).
    fn get_all(get: impl Fn(u64) -> bool, from: u64, count: u64) -> (u64, f64) {
        let start = Instant::now();
        let found = (from..from + count).filter(|&n| get(key(n))).count() as u64;
        (found, start.elapsed().as_secs_f64())
    }

    /// Prints (run with `--nocapture`) DRAM per entry and single-threaded
    /// throughput at 10 M entries, the index against hashbrown. About 5 s.
    #[test]
    #[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
    fn measure_memory_and_throughput() {
        const N: u64 = 10_000_000;
        const GETS: u64 = 1_000_000;
        const SHARDS: usize = 64;
        assert_eq!(STD_BUCKET_BYTES, 24);

        // The index, pre-sized.
        let rss_before = rss_bytes();
        let index = L2Index::new(SHARDS, N as usize);
        let (memory_bytes, insert_seconds) = fill(&index, N);
        let rss_delta = rss_bytes().saturating_sub(rss_before);
        let (found, hit_seconds) = get_all(|k| index.get(k).is_some(), 1, GETS);
        assert_eq!(found, GETS);
        let (found, miss_seconds) = get_all(|k| index.get(k).is_some(), N + 1, GETS);
        assert_eq!(found, 0);
        println!(
            "l2index 10M, {SHARDS} shards, pre-sized: {:.1} B/entry (RSS delta {:.1}); \
             insert {:.1} M/s, get hit {:.1} M/s, get miss {:.1} M/s",
            memory_bytes as f64 / N as f64,
            rss_delta as f64 / N as f64,
            mops(N, insert_seconds),
            mops(GETS, hit_seconds),
            mops(GETS, miss_seconds),
        );
        drop(index);

        // The index, grown from empty.
        let index = L2Index::new(SHARDS, 0);
        let (memory_bytes, insert_seconds) = fill(&index, N);
        println!(
            "l2index 10M, {SHARDS} shards, grown from empty: {:.1} B/entry; insert {:.1} M/s",
            memory_bytes as f64 / N as f64,
            mops(N, insert_seconds),
        );
        drop(index);

        // hashbrown (std HashMap with the crate's hasher), pre-sized and grown.
        for presize in [true, false] {
            let rss_before = rss_bytes();
            let mut map = if presize {
                StdMap::with_capacity_and_hasher(N as usize, Default::default())
            } else {
                StdMap::default()
            };
            let start = Instant::now();
            for n in 1..=N {
                map.insert(key(n), (mix64(n ^ 0x5555), n as u32));
            }
            let insert_seconds = start.elapsed().as_secs_f64();
            let rss_delta = rss_bytes().saturating_sub(rss_before);
            let bytes_per_entry = hashmap_bytes(map.capacity(), STD_BUCKET_BYTES) as f64 / N as f64;
            if !presize {
                println!(
                    "std HashMap 10M, grown from empty: {bytes_per_entry:.1} B/entry (RSS delta {:.1}); insert {:.1} M/s",
                    rss_delta as f64 / N as f64,
                    mops(N, insert_seconds),
                );
                continue;
            }
            let (found, hit_seconds) = get_all(|k| map.contains_key(&k), 1, GETS);
            assert_eq!(found, GETS);
            // The index must be shared, so the fair comparison takes a lock.
            let map = Mutex::new(map);
            let (found, locked_seconds) = get_all(
                |k| map.lock().expect("not poisoned").contains_key(&k),
                1,
                GETS,
            );
            assert_eq!(found, GETS);
            println!(
                "std HashMap 10M, with_capacity: {bytes_per_entry:.1} B/entry (RSS delta {:.1}); \
                 insert {:.1} M/s, get hit {:.1} M/s (behind a Mutex: {:.1} M/s)",
                rss_delta as f64 / N as f64,
                mops(N, insert_seconds),
                mops(GETS, hit_seconds),
                mops(GETS, locked_seconds),
            );
        }

        // hashbrown's sawtooth, grown from empty: just below and just above a
        // doubling (2^17 buckets hold 7/8 of 2^17 entries); and 1 M entries,
        // for which even `with_capacity` allocates 2^21 buckets.
        for entries in [114_688usize, 114_689] {
            let mut map = StdMap::default();
            for n in 1..=entries as u64 {
                map.insert(key(n), (n, n as u32));
            }
            println!(
                "std HashMap {entries:>7} entries, grown: {:.1} B/entry",
                hashmap_bytes(map.capacity(), STD_BUCKET_BYTES) as f64 / entries as f64,
            );
        }
        let map = StdMap::with_capacity_and_hasher(1_000_000, Default::default());
        println!(
            "std HashMap 1M, with_capacity: {:.1} B/entry",
            hashmap_bytes(map.capacity(), STD_BUCKET_BYTES) as f64 / 1e6,
        );
    }
}
