//! The L2ARC index: where each record cached on flash lives, kept in DRAM.
//!
//! Budget. Every record on a cache device costs one index entry in DRAM, so
//! the index, not the flash, bounds how large an L2ARC a machine can afford:
//! OpenZFS spends 96 bytes per record (an L2-only `arc_buf_hdr_t`), i.e.
//! 1 GiB of DRAM per ~11 M records; CacheLib's block cache index ~12. Our
//! target is at most 16 bytes per record at 10 M and 100 M records, all
//! overheads included (table slack, shard structs).
//!
//! What a record needs. A log entry of the device format (`docs/format.md`)
//! is `key_hash: u64`, `location: u64` (block, lap, device, size,
//! compression and tail: all 64 bits used) and `checksum: u32`. Location
//! and checksum must be kept whole: 12 bytes. The key need not: the index
//! keeps a fingerprint of it, and a slot is 15 bytes, location, checksum
//! and a 3-byte tag.
//!
//! Why the dropped key bits are safe. The record checksum is
//! `crc32c(key_hash ++ stored bytes)` and every flash read is checked
//! against it with the key the reader asked for (format.rs, "THE RECORD
//! CHECKSUM COVERS key_hash"). The index keeps a key's shard bits (the top
//! `shard_bits`) and its low 32 bits, the fingerprint; two keys K and K'
//! with one fingerprint differ only in bits 32..64 - shard_bits, one burst
//! of at most 32 bits of the checksummed message. CRC-32C detects every
//! burst of 32 bits or less (the error polynomial is x^i e(x) with
//! deg e < 32, never a multiple of the degree-32 generator), so a read of K
//! that lands on K''s entry reads K''s bytes and always fails the checksum:
//! a miss, never K''s bytes. Two rules keep that the worst case: at most one
//! entry per fingerprint (an insert of K replaces K''s entry: K' is lost, a
//! miss), and `get`, `insert` and `remove` find an entry by the same search,
//! so the entry a get of K could find is the one a `remove(K)` (a write's
//! invalidation) removes: no stale entry of K can outlive a write to K. The
//! price is counted in records, not bytes: with N entries and 32 + s kept
//! bits (s = 6 for 64 shards), ~N^2 / 2^(33+s) records share a fingerprint
//! with a later one and are lost (~18,000 of 100 M, 0.018%), and a lookup of
//! an absent key finds another's entry with probability N / 2^(32+s) (3.6e-4
//! at 100 M): a wasted flash read, counted in `l2_cksum_bad`, that drops the
//! other record's entry (and the feeder's `contains` skips that key).
//!
//! Quotienting. The tag need not hold all 32 low bits either. A shard of n
//! slots sends a key to home slot `fastrange(low) = low * n >> 32`, so a
//! home spans at most ceil(2^32 / n) values of `low`; from 2^16 slots on,
//! that is at most 2^16, and the home (the slot minus the entry's
//! displacement) plus `low`'s bits 0..16 give `low` back exactly: the
//! unique value congruent to them in the home's span (`low_at`). A lookup
//! never needs that: same home (same displacement at the same probe
//! position) and same 16 bits is the same `low`, so the probe compares two
//! bytes and no division is on the lookup path; only a resize divides, to
//! place an entry in a table of another size. The tag's first byte is the
//! displacement + 1 (0 marks an empty slot, so no key value is reserved
//! and no control byte is needed), the other two `low`'s bits 0..16. Shards
//! of fewer than 2^16 slots (below ~4 M entries in 64 shards) keep `low`'s
//! bits 16..32 in a `high` array beside the slots, 17 bytes a slot: small
//! indexes are not what the budget is about, and they stay exact too.
//!
//! Why 15 bytes and 0.96. With open addressing bytes per entry are
//! `slot / load`. A 16-byte slot (a whole u32 of tag) costs 16.7 bytes at
//! 0.96: over. A 14-byte one leaves one byte of `low` beside the
//! displacement: at 10 M records (~2^15 values of `low` per home) 7 bits
//! of `low` would be dropped, 128 times the collisions, and detection only
//! probabilistic (the dropped low bits and high bits are not one burst).
//! At 15 bytes, 0.95 load gives 15.95 bytes per record at 10 M pre-sized
//! (the headroom below adds 1%): within budget by a hair; 0.96 gives 15.8
//! and 0.97 15.6. Robin Hood's mean displacement grows as the load nears
//! 1 (~9.5 slots at 0.95, 12 at 0.96, 16 at 0.97, simulated for 164 k and
//! 1.6 M-slot shards) and a get reads the slots from home to its entry, ~13
//! slots (~200 bytes, three or four adjacent cache lines) at 0.96 against
//! ~5.5 (110 bytes) with 20-byte slots at 0.90. Measured (below), gets
//! came out 2-5% slower than the 20-byte index at 10 M and ~40% faster at
//! 100 M (the table is 30% smaller: fewer TLB and cache misses on the way
//! to the home slot, which is most of a lookup's cost), and inserts one at
//! a time 12% slower at 10 M (longer runs to shift) and faster at 100 M;
//! either is small next to the flash read that follows a hit (tens of
//! microseconds). Between 0.95, 0.96 and 0.97 this machine could not tell
//! (`measure_memory_and_throughput` at 10 M under another engineer's load
//! of 5-9: gets 3.8-4.8 M/s, 3.2-3.9 and 3.1-4.2), so the margin decided:
//! 0.96 keeps 0.2 bytes of it at 10 M.
//!
//! Displacement cap. One byte holds displacements 0..=254. Simulated
//! maximum displacements at 0.96 were 60-155 for shards of 1 k to 1.6 M
//! slots (growing like log n), so uniform keys do not meet the cap. Keys
//! that crowd one home could: an insert that would move an entry past the
//! cap grows the shard if it is at least half full, and otherwise refuses
//! the entry (`insert` returns it as the entry that left, so a caller's
//! accounting nets to zero; a bulk insert marks it not inserted). Growth
//! cannot part keys whose low words are that close, and the rule bounds
//! what they cost: a shard grows for the cap only while at least half full
//! (load 0.48), so it never falls below 0.384 load (39 bytes per entry)
//! for it. A resize that would put an entry past the cap grows further
//! (or, for a shrink, is not done).
//!
//! Why Robin Hood at high load. Plain linear probing degrades badly at
//! 0.96 (an unsuccessful search probes ~ (1 + 1/(1-a)^2) / 2 = 313 slots,
//! and tombstones make it worse); Robin Hood ordering (an insert takes the
//! slot of the first entry that is closer to its home than the insert is)
//! keeps every cluster sorted by home slot, so a search stops as soon as it
//! meets an entry closer to its home than the probe is: a miss costs about
//! what a hit does, with a small variance. Deletion shifts the following
//! entries of the cluster back by one (backward-shift deletion), so there
//! are no tombstones. Home slots are chosen by `fastrange`, which keeps the
//! home order equal to the order of `low`: slot counts need not be powers
//! of two, and a rehash into another size is a merge in one sequential pass.
//!
//! Load range. A shard grows by 1.25x when an insert would take it past the
//! maximum load of 0.96, so a shard grown from empty sits between
//! 0.96 / 1.25 = 0.768 and 0.96 load: 15.6 to 19.5 bytes per entry, plus
//! one 64-byte shard struct per shard (0.004 bytes per entry at 1 M entries
//! in 64 shards). Grown from empty the index is over 16 bytes at the low
//! point of each cycle; the L2ARC does not grow it that way: `L2Arc::new`
//! sizes it for the expected records and a rebuild `reserve`s what the log
//! holds before its first insert. Pre-sized with the expected entry count,
//! each shard gets room for its mean share plus four standard deviations (a
//! uniform hash gives each shard a binomial share) at 0.96 load: a
//! correctly sized index does not grow, and sits at ~0.95 load with a few
//! large shards, less with many small ones.
//!
//! Why not hashbrown. `HashMap<u64, (u64, u32)>` stores 24-byte buckets (the
//! tuple pads to 16) plus one control byte each, in a power-of-two bucket
//! count at most 7/8 full: 25 / 0.875 = 28.6 bytes per entry just before it
//! doubles and 57.1 just after, a 2x sawtooth that `with_capacity` cannot
//! avoid (1 M entries need 2^21 buckets: 52.4 bytes per entry; 10 M need
//! 2^24: 41.9).
//!
//! Measured (`l2arc bench --scenario l2-index`, docs/benchmarks.md, each
//! build in a fresh process, one thread, 64 shards; a shared 2-vCPU VM,
//! both indexes back to back at load 0.4-3; `memory_bytes`, confirmed by
//! RSS):
//!
//! | | 20-byte slots (before) | 15-byte slots |
//! |---|---|---|
//! | 1 M entries, pre-sized | 22.9 B | 18.3 B (17-byte slots: small shards) |
//! | 10 M, pre-sized / grown from empty | 22.4 B / 25.3 B | 15.8 B / 19.0 B |
//! | 100 M, pre-sized / grown from empty | 22.3 B / 23.5 B | 15.7 B / 17.7 B |
//! | insert, pre-sized, 10 M / 100 M | 6.6 / 4.5 M/s | 5.8 / 5.5 M/s |
//! | get hit / miss, pre-sized, 10 M | 5.6 / 5.9 M/s | 5.5 / 5.6 M/s |
//! | get hit / miss, pre-sized, 100 M | 3.6 / 3.6 M/s | 4.9 / 5.1 M/s |
//! | rebuild of 100 M records (`l2-rebuild`) | 5.9-7.9 s | 6.4-7.9 s |
//! | records lost to a collision, 1 / 10 / 100 M | 0 | 4 / 177 / 18,340 |
//!
//! (Under another engineer's fio load of 25-31 the pairs compared alike
//! for bytes and lookups; rates there are noise.)
//!
//! Concurrency. The key space is split by the top bits of `key_hash` into a
//! power-of-two number of shards, each a `Mutex` around its own table, padded
//! to a cache line (which is why a shard does not cache its maximum entry
//! count: the `high` array's pointer took those bytes). Every operation
//! locks one shard; `retain` and `clear` lock one shard at a time, so a
//! sweep never stops the whole index. A shard grows (or, after a sweep,
//! shrinks) alone: the transient peak is one shard's old and new arrays
//! together. `len` and `memory_bytes` read per-shard counters published
//! under the shard lock, without locking.
//!
//! Bulk inserts. A rebuild restores up to hundreds of millions of entries
//! at once; one at a time, each lands at a random slot of a table of GBs
//! and waits on DRAM (~0.5 us here with 4 KiB pages in a VM: 2.1 M/s at
//! 100 M entries). `sort_run` orders a run by shard and home slot, to the
//! grain of `RUN_BUCKET_SLOTS` (a counting sort: two passes, stable, so
//! the newest entry of a key, and so of a fingerprint, stays first), and
//! `insert_sorted_if_absent` inserts it shard by shard, prefetching the
//! home slots of the entries `RUN_PREFETCH_DISTANCE` ahead, the shards
//! split between threads. Large slot arrays ask for transparent huge pages
//! (`slots_zeroed`), which cuts the TLB misses and first-write faults of
//! random access 512-fold. `reserve` sizes every shard for a total, as
//! `new` does, in one step.
//!
//! Shrinking. `remove` never shrinks. `retain` shrinks a shard whose load fell
//! below 1/2 back to 0.768 (the load a growth leaves), never below the size
//! `new` gave it, so after mass removals the bytes per entry come back down
//! at the next sweep. `retain`'s predicate sees a `StoredEntry`, location
//! and checksum: the index has no key to show it.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::lock_order::{RankedMutex, RankedMutexGuard, rank};

/// Most shards an index may have (`shards` is a power of two up to this).
pub const SHARDS_MAX: usize = 4096;
const SHARD_BITS_MAX: u32 = SHARDS_MAX.trailing_zeros();

/// One slot, little-endian: the tag (3 bytes: displacement + 1 in the
/// first, bits 0..16 of the key's low word in the next two; a first byte
/// of 0 marks an empty slot), `location` (8), `checksum` (4).
type Slot = [u8; SLOT_BYTES];
/// Bytes of DRAM per slot (shards of `SHARD_SLOTS_EXACT_MIN` slots or more).
pub const SLOT_BYTES: usize = 15;
const _: () = assert!(size_of::<Slot>() == SLOT_BYTES);
const SLOT_EMPTY: Slot = [0; SLOT_BYTES];
/// Bytes per slot of a shard's `high` array (shards below
/// `SHARD_SLOTS_EXACT_MIN` slots).
const HIGH_BYTES: usize = 2;

/// Farthest an entry may sit from its home slot: the first tag byte holds
/// the displacement + 1 (0 marks an empty slot).
const DISPLACEMENT_MAX: usize = 254;
/// From this many slots up, a home spans at most 2^16 values of the key's
/// low word, so the home and the low word's bits 0..16 give back all 32.
/// Smaller shards keep bits 16..32 in a `high` array too.
const SHARD_SLOTS_EXACT_MIN: usize = 1 << 16;

/// Maximum load: entries / slots never exceeds 24/25.
const MAX_LOAD_NUMERATOR: usize = 24;
const MAX_LOAD_DENOMINATOR: usize = 25;
/// A full shard grows to 5/4 of its slots.
const GROWTH_NUMERATOR: usize = 5;
const GROWTH_DENOMINATOR: usize = 4;
/// `retain` shrinks a shard below 1/2 load (above 30 bytes per entry).
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
/// A sorted run is bucketed at the grain of this many slots (960 KiB of
/// table, about L2), see `sort_run`. Measured at 20 M entries with huge
/// pages and 20-byte slots: 2 Ki slots made the sort's scatter (64 Ki
/// buckets) cost as much as the inserts saved; 64 Ki slots was fastest,
/// 256 Ki slower.
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
const _: () = assert!(DISPLACEMENT_MAX < u8::MAX as usize);

/// One index entry, identical to one log entry on the device: what goes
/// into the index. An entry the index hands back carries the `key_hash`
/// the caller asked with: the index keeps only the key's fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Identity of the record (`l2arc::hash`); never 0.
    pub key_hash: u64,
    /// The packed location word (`docs/format.md`, "Location word").
    pub location: u64,
    /// CRC-32C of `key_hash` and the stored bytes.
    pub checksum: u32,
}

/// What the index keeps of an entry besides its key's fingerprint: what
/// `retain` shows its predicate (no key: the index does not know it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredEntry {
    /// The packed location word.
    pub location: u64,
    /// CRC-32C of the record's `key_hash` and stored bytes.
    pub checksum: u32,
}

impl StoredEntry {
    fn with_key(self, key_hash: u64) -> IndexEntry {
        IndexEntry {
            key_hash,
            location: self.location,
            checksum: self.checksum,
        }
    }
}

#[inline]
fn slot_pack(low: u32, displacement: usize, stored: StoredEntry) -> Slot {
    debug_assert!(displacement <= DISPLACEMENT_MAX);
    let mut slot = [0; SLOT_BYTES];
    slot[0] = displacement as u8 + 1;
    slot[1..3].copy_from_slice(&(low as u16).to_le_bytes());
    slot[3..11].copy_from_slice(&stored.location.to_le_bytes());
    slot[11..15].copy_from_slice(&stored.checksum.to_le_bytes());
    slot
}

#[inline]
fn slot_stored(slot: &Slot) -> StoredEntry {
    StoredEntry {
        location: u64::from_le_bytes(slot[3..11].try_into().expect("8 bytes")),
        checksum: u32::from_le_bytes(slot[11..15].try_into().expect("4 bytes")),
    }
}

#[inline]
fn slot_is_empty(slot: &Slot) -> bool {
    slot[0] == 0
}

/// Displacement of a slot's entry from its home (the slot is not empty).
#[inline]
fn slot_displacement(slot: &Slot) -> usize {
    debug_assert!(!slot_is_empty(slot));
    usize::from(slot[0]) - 1
}

/// Bits 0..16 of the low word of a slot's key.
#[inline]
fn slot_low16(slot: &Slot) -> u16 {
    u16::from_le_bytes([slot[1], slot[2]])
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

/// Bytes of DRAM of a shard of `slots_count` slots (slot and `high` arrays).
fn shard_array_bytes(slots_count: usize) -> usize {
    let high = if slots_count < SHARD_SLOTS_EXACT_MIN {
        HIGH_BYTES
    } else {
        0
    };
    slots_count * (SLOT_BYTES + high)
}

/// One shard: a Robin Hood table over `slots`, sorted by home slot within
/// every cluster, with at least one empty slot. An entry is known by the
/// low 32 bits of its key (`low`): its home is `fastrange(low)`, and a slot
/// keeps the displacement from the home and `low`'s bits 0..16 (and, in a
/// small shard, bits 16..32 in `high`), from which `low` comes back whole.
struct Shard {
    slots: Box<[Slot]>,
    /// Bits 16..32 of each slot's `low`, in shards of fewer than
    /// `SHARD_SLOTS_EXACT_MIN` slots; empty in larger ones.
    high: Box<[u16]>,
    entries_count: usize,
}

/// What became of an insert.
#[derive(Debug, PartialEq, Eq)]
enum Inserted {
    /// A new entry.
    New,
    /// The key's fingerprint had an entry (returned); replaced if asked.
    Found(StoredEntry),
    /// No room within `DISPLACEMENT_MAX` and growing would not help: the
    /// entry is not stored (only for keys far from uniform).
    Refused,
}

/// The insert would move an entry past `DISPLACEMENT_MAX`; nothing changed.
struct OverCap;

/// A zeroed slot array. `vec![[0u8; 15]; n]` is a zeroed allocation
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
        let high_count = if slots_count < SHARD_SLOTS_EXACT_MIN {
            slots_count
        } else {
            0
        };
        Shard {
            slots: slots_zeroed(slots_count),
            high: vec![0; high_count].into_boxed_slice(),
            entries_count: 0,
        }
    }

    /// Most entries this shard may hold (`entries_max`; not cached, so
    /// that a shard cell fits a cache line).
    #[inline]
    fn entries_max(&self) -> usize {
        entries_max(self.slots.len())
    }

    /// The home slot of a key's low word: `fastrange`.
    #[inline]
    fn home(&self, low: u32) -> usize {
        ((u64::from(low) * self.slots.len() as u64) >> 32) as usize
    }

    /// Whether the entry at `index` has the low word `low`, given that
    /// `low`'s home is the entry's home.
    #[inline]
    fn low_matches(&self, index: usize, low: u32) -> bool {
        slot_low16(&self.slots[index]) == low as u16
            && self
                .high
                .get(index)
                .is_none_or(|&high| high == (low >> 16) as u16)
    }

    /// The low word of the key of the entry at `index`: its home slot and
    /// bits 0..16 (and `high`) give it back, as a home spans at most 2^16
    /// values in a shard without `high`.
    fn low_at(&self, index: usize) -> u32 {
        let slot = &self.slots[index];
        let low16 = slot_low16(slot);
        if let Some(&high) = self.high.get(index) {
            return (u32::from(high) << 16) | u32::from(low16);
        }
        let slots_count = self.slots.len();
        let home = (index + slots_count - slot_displacement(slot)) % slots_count;
        // The smallest low word whose home is `home`: ceil(home 2^32 / n).
        let base = ((home as u64) << 32).div_ceil(slots_count as u64);
        let low = base + u64::from(low16.wrapping_sub(base as u16));
        debug_assert_eq!(self.home(low as u32), home);
        low as u32
    }

    /// Asks the CPU to fetch the home slot of `low` (and the slots a probe
    /// meets next) into cache, without waiting for it.
    #[inline]
    fn prefetch(&self, low: u32) {
        let home = self.home(low);
        let last = self.slots.len() - 1;
        #[cfg(target_arch = "x86_64")]
        for index in [home, (home + 4).min(last), (home + 8).min(last)] {
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

    #[inline]
    fn previous(&self, index: usize) -> usize {
        if index == 0 {
            self.slots.len() - 1
        } else {
            index - 1
        }
    }

    /// The slot of the entry with the low word `low`.
    fn find(&self, low: u32) -> Option<usize> {
        let mut index = self.home(low);
        let mut distance = 0;
        loop {
            let slot = &self.slots[index];
            if slot_is_empty(slot) {
                return None;
            }
            let displacement = slot_displacement(slot);
            // Robin Hood: every entry from here on has its home after ours.
            if displacement < distance {
                return None;
            }
            // Same displacement at the same slot: same home.
            if displacement == distance && self.low_matches(index, low) {
                return Some(index);
            }
            index = self.next(index);
            distance += 1;
            if distance > DISPLACEMENT_MAX {
                return None;
            }
        }
    }

    /// Puts a new entry at `index`, `displacement` from its home.
    #[inline]
    fn put(&mut self, index: usize, low: u32, displacement: usize, stored: StoredEntry) {
        self.slots[index] = slot_pack(low, displacement, stored);
        if let Some(high) = self.high.get_mut(index) {
            *high = (low >> 16) as u16;
        }
    }

    /// Moves the entry at `from` to `to`, `displacement` from its home.
    #[inline]
    fn move_slot(&mut self, from: usize, to: usize, displacement: usize) {
        let mut slot = self.slots[from];
        slot[0] = displacement as u8 + 1;
        self.slots[to] = slot;
        if !self.high.is_empty() {
            self.high[to] = self.high[from];
        }
    }

    fn clear_slot(&mut self, index: usize) {
        self.slots[index] = SLOT_EMPTY;
        if let Some(high) = self.high.get_mut(index) {
            *high = 0;
        }
    }

    /// Inserts the entry of `low`, or finds the entry with that low word
    /// and, if `overwrite`, replaces its location and checksum. Grows the
    /// shard when full, or when an entry would land past
    /// `DISPLACEMENT_MAX` and the shard is at least half full (else the
    /// entry is refused: keys that crowd one home so, growth cannot part).
    fn insert(&mut self, low: u32, stored: StoredEntry, overwrite: bool) -> Inserted {
        loop {
            debug_assert!(self.entries_count <= self.entries_max());
            if self.entries_count == self.entries_max() {
                // Full: grow only if the key is new.
                if let Some(index) = self.find(low) {
                    return self.found(index, stored, overwrite);
                }
                self.grow();
            }
            match self.try_insert(low, stored, overwrite) {
                Ok(inserted) => return inserted,
                Err(OverCap) if self.entries_count * 2 >= self.entries_max() => self.grow(),
                Err(OverCap) => return Inserted::Refused,
            }
        }
    }

    fn found(&mut self, index: usize, stored: StoredEntry, overwrite: bool) -> Inserted {
        let old = slot_stored(&self.slots[index]);
        if overwrite {
            self.slots[index][3..11].copy_from_slice(&stored.location.to_le_bytes());
            self.slots[index][11..15].copy_from_slice(&stored.checksum.to_le_bytes());
        }
        Inserted::Found(old)
    }

    /// `insert` into a shard with room for one more entry.
    fn try_insert(
        &mut self,
        low: u32,
        stored: StoredEntry,
        overwrite: bool,
    ) -> Result<Inserted, OverCap> {
        debug_assert!(self.entries_count < self.entries_max());
        let mut index = self.home(low);
        let mut distance = 0;
        loop {
            let slot = &self.slots[index];
            if slot_is_empty(slot) {
                break;
            }
            let displacement = slot_displacement(slot);
            if displacement == distance && self.low_matches(index, low) {
                return Ok(self.found(index, stored, overwrite));
            }
            if displacement < distance {
                // The key is absent and belongs here, before the entries
                // whose home comes after its own: shift them up by one.
                if !self.shift_up(index) {
                    return Err(OverCap);
                }
                break;
            }
            index = self.next(index);
            distance += 1;
            if distance > DISPLACEMENT_MAX {
                return Err(OverCap);
            }
        }
        self.put(index, low, distance, stored);
        self.entries_count += 1;
        Ok(Inserted::New)
    }

    /// Moves the entries from `index` to the first empty slot up by one
    /// slot (one further from home each), freeing `index`; or, if one of
    /// them would land past `DISPLACEMENT_MAX`, changes nothing and
    /// returns false.
    fn shift_up(&mut self, index: usize) -> bool {
        let mut end = index;
        loop {
            let slot = &self.slots[end];
            if slot_is_empty(slot) {
                break;
            }
            if slot_displacement(slot) == DISPLACEMENT_MAX {
                return false;
            }
            end = self.next(end);
            debug_assert!(end != index, "a shard always has an empty slot");
        }
        if end > index {
            // No wrap (nearly always): one memmove, then each moved entry
            // one further from home. At 0.96 load a run to shift averages
            // twice what it did at 0.90, and moving it slot by slot cost a
            // rebuild of 100 M entries ~20% of its insert rate (measured
            // by a bulk-insert run, noisy: docs/benchmarks.md); the
            // memmove won it back.
            self.slots.copy_within(index..end, index + 1);
            for slot in &mut self.slots[index + 1..=end] {
                slot[0] += 1;
            }
            if !self.high.is_empty() {
                self.high.copy_within(index..end, index + 1);
            }
            return true;
        }
        while end != index {
            let from = self.previous(end);
            let displacement = slot_displacement(&self.slots[from]) + 1;
            self.move_slot(from, end, displacement);
            end = from;
        }
        true
    }

    /// Removes the entry at `index`; backward shift: the following entries
    /// of its cluster that are not at home move back by one slot.
    fn remove_at(&mut self, index: usize) -> StoredEntry {
        debug_assert!(!slot_is_empty(&self.slots[index]));
        let removed = slot_stored(&self.slots[index]);
        let mut hole = index;
        loop {
            let next = self.next(hole);
            let slot = &self.slots[next];
            // Empty (0) or at home (displacement 0, stored as 1).
            if slot[0] <= 1 {
                break;
            }
            let displacement = slot_displacement(slot) - 1;
            self.move_slot(next, hole, displacement);
            hole = next;
            debug_assert!(hole != index);
        }
        self.clear_slot(hole);
        self.entries_count -= 1;
        removed
    }

    /// Grows by `GROWTH` at least, more if the entries do not fit the
    /// larger size within `DISPLACEMENT_MAX`.
    fn grow(&mut self) {
        let mut slots_count = self.slots.len();
        loop {
            assert!(
                slots_count < SHARD_SLOTS_MAX,
                "L2ARC index: a shard is full at {SHARD_SLOTS_MAX} slots; use more shards"
            );
            slots_count = (slots_count / GROWTH_DENOMINATOR * GROWTH_NUMERATOR)
                .max(slots_count + 1)
                .min(SHARD_SLOTS_MAX);
            if let Some(grown) = self.resized(slots_count) {
                *self = grown;
                return;
            }
        }
    }

    /// The first slot that is empty or holds an entry at its home: no
    /// cluster crosses it, so a walk over all slots from here meets every
    /// cluster whole and the entries in home order.
    fn cluster_boundary(&self) -> usize {
        (0..self.slots.len())
            .find(|&index| self.slots[index][0] <= 1)
            .expect("L2ARC index: a shard always has an empty slot")
    }

    /// A shard of `slots_count` slots with every entry of this one, or
    /// `None` if one would land past `DISPLACEMENT_MAX` there.
    fn resized(&self, slots_count: usize) -> Option<Shard> {
        assert!(entries_max(slots_count) >= self.entries_count);
        let mut new = Shard::with_slots(slots_count);
        let boundary = self.cluster_boundary();
        // A merge, not a rehash: read from a cluster boundary, the old slots
        // come in home order, and fastrange (monotonic in the low word)
        // keeps the new homes in that order, but for entries that shared an
        // old home. So each entry goes to its new home or right after the
        // previous one, without probing. An entry whose new home is below the
        // previous one, or that runs past the end, is inserted by probing.
        let mut home_max = 0;
        let mut free_first = 0; // Below it, the merge has filled every slot.
        let mut overflow: Vec<(u32, StoredEntry)> = Vec::new();
        let old_len = self.slots.len();
        for index in (boundary..old_len).chain(0..boundary) {
            let slot = &self.slots[index];
            if slot_is_empty(slot) {
                continue;
            }
            let (low, stored) = (self.low_at(index), slot_stored(slot));
            let home = new.home(low);
            if home < home_max {
                new.try_insert(low, stored, false).ok()?;
                // Its shift, if any, ended in the first free slot.
                if free_first < slots_count && !slot_is_empty(&new.slots[free_first]) {
                    free_first += 1;
                }
                continue;
            }
            home_max = home;
            let at = home.max(free_first);
            if at >= slots_count {
                overflow.push((low, stored));
            } else if at - home > DISPLACEMENT_MAX {
                return None;
            } else {
                debug_assert!(slot_is_empty(&new.slots[at]));
                new.put(at, low, at - home, stored);
                new.entries_count += 1;
                free_first = at + 1;
            }
        }
        for (low, stored) in overflow {
            new.try_insert(low, stored, false).ok()?;
        }
        assert_eq!(new.entries_count, self.entries_count);
        Some(new)
    }

    /// Removes the entries `keep` rejects; shrinks if very underloaded, not
    /// below `slots_min`. Returns how many were removed.
    fn retain(&mut self, keep: &mut impl FnMut(&StoredEntry) -> bool, slots_min: usize) -> usize {
        let slots_count = self.slots.len();
        // Start at a cluster boundary: a backward shift then never moves an
        // entry from the start of the sweep to its end, so each entry is
        // offered to `keep` exactly once.
        let start = self.cluster_boundary();
        let mut removed_count = 0;
        let mut index = start;
        for _ in 0..slots_count {
            // After a removal the next entry has shifted into `index`.
            while !slot_is_empty(&self.slots[index]) && !keep(&slot_stored(&self.slots[index])) {
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
            // Not if an entry would land too far from home there.
            if shrunk < slots_count
                && let Some(shrunk) = self.resized(shrunk)
            {
                *self = shrunk;
            }
        }
        removed_count
    }

    /// Checks the Robin Hood invariants.
    fn assert_consistent(&self) {
        let slots_count = self.slots.len();
        assert!((SHARD_SLOTS_MIN..=SHARD_SLOTS_MAX).contains(&slots_count));
        assert!(self.entries_count <= self.entries_max());
        assert!(self.entries_max() < slots_count);
        let high_count = if slots_count < SHARD_SLOTS_EXACT_MIN {
            slots_count
        } else {
            0
        };
        assert_eq!(self.high.len(), high_count);
        let mut entries_count = 0;
        for index in 0..slots_count {
            let slot = &self.slots[index];
            if slot_is_empty(slot) {
                assert_eq!(*slot, SLOT_EMPTY, "an empty slot is all zeros");
                assert!(self.high.get(index).is_none_or(|&h| h == 0));
                continue;
            }
            entries_count += 1;
            let displacement = slot_displacement(slot);
            assert!(displacement <= DISPLACEMENT_MAX);
            // Reachable: the search from its home stops exactly here (this
            // also rules out a duplicate further along).
            let low = self.low_at(index);
            assert_eq!(
                (self.home(low) + displacement) % slots_count,
                index,
                "displacement is not the distance from home"
            );
            assert_eq!(self.find(low), Some(index), "entry not reachable");
            // Probe distances: no gap between home and here, and along a
            // cluster a distance rises by at most one per slot.
            if displacement > 0 {
                let previous_slot = &self.slots[self.previous(index)];
                assert!(!slot_is_empty(previous_slot), "gap between home and entry");
                assert!(
                    slot_displacement(previous_slot) + 1 >= displacement,
                    "Robin Hood order broken"
                );
            }
        }
        assert_eq!(entries_count, self.entries_count);
    }
}

/// A zero `key_hash` marks an entry not inserted in a bulk run
/// (`insert_sorted_if_absent`): refused before any lock is taken (a panic
/// under the lock would poison the shard).
fn assert_key_hash_stored(key_hash: u64) {
    assert!(key_hash != 0, "L2ARC index: key_hash 0 is never a key");
}

/// A shard with its lock and published counters, alone on its cache line.
#[repr(align(64))]
struct ShardCell {
    shard: RankedMutex<Shard, { rank::LEAF }>,
    /// Copies of `entries_count` and `slots.len()`, stored under the lock,
    /// read without it by `len` and `memory_bytes`.
    entries_count: AtomicUsize,
    slots_count: AtomicUsize,
}

const SHARD_CELL_BYTES: usize = size_of::<ShardCell>();
const _: () = assert!(SHARD_CELL_BYTES == 64);

impl ShardCell {
    fn lock(&self) -> RankedMutexGuard<'_, Shard, { rank::LEAF }> {
        self.shard.lock().expect("L2ARC index shard lock poisoned")
    }

    fn publish(&self, shard: &Shard) {
        self.entries_count
            .store(shard.entries_count, Ordering::Relaxed);
        self.slots_count.store(shard.slots.len(), Ordering::Relaxed);
    }
}

/// The DRAM index of every record cached on the L2ARC devices: a sharded
/// Robin Hood table of 15-byte slots keyed by a fingerprint of `key_hash`
/// (its shard bits and low 32 bits).
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
                    shard: RankedMutex::new(shard),
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

    /// The entry for a key's fingerprint (the key's shard bits and low 32
    /// bits, `fingerprint`): the key's own entry, or that of another key
    /// equal to it in every kept bit, which the record checksum (it covers
    /// `key_hash`) then rejects. Carries the `key_hash` asked with.
    pub fn get(&self, key_hash: u64) -> Option<IndexEntry> {
        debug_assert!(key_hash != 0, "L2ARC index: key_hash 0 is never stored");
        let shard = self.cell(key_hash).lock();
        shard
            .find(key_hash as u32)
            .map(|index| slot_stored(&shard.slots[index]).with_key(key_hash))
    }

    /// Inserts `entry`, replacing the entry of its fingerprint, which is
    /// returned (with `entry.key_hash`: it may have been another key's).
    /// If the index refuses the entry (keys far from uniform crowd one
    /// home), returns `entry` itself: it left at once. Either way the
    /// entry returned is the one that left the index. Panics if
    /// `entry.key_hash` is 0.
    pub fn insert(&self, entry: IndexEntry) -> Option<IndexEntry> {
        assert_key_hash_stored(entry.key_hash);
        let cell = self.cell(entry.key_hash);
        let mut shard = cell.lock();
        let inserted = shard.insert(entry.key_hash as u32, stored(&entry), true);
        cell.publish(&shard);
        match inserted {
            Inserted::New => None,
            Inserted::Found(old) => Some(old.with_key(entry.key_hash)),
            Inserted::Refused => Some(entry),
        }
    }

    /// Inserts `entry` unless an entry with its fingerprint is present (for
    /// rebuild, which walks from newest to oldest). Returns whether inserted.
    pub fn insert_if_absent(&self, entry: IndexEntry) -> bool {
        assert_key_hash_stored(entry.key_hash);
        let cell = self.cell(entry.key_hash);
        let mut shard = cell.lock();
        let inserted = shard.insert(entry.key_hash as u32, stored(&entry), false);
        cell.publish(&shard);
        inserted == Inserted::New
    }

    /// Bits of `key_hash` the index keeps to tell keys apart: the top
    /// `shard_bits` and the low 32. Keys equal in these share one entry.
    pub fn fingerprint_bits(&self) -> u32 {
        32 + self.shard_bits
    }

    /// `key_hash` with the bits the index drops cleared: two keys with
    /// the same fingerprint are one to the index.
    pub fn fingerprint(&self, key_hash: u64) -> u64 {
        let dropped = (u64::MAX >> self.shard_bits) & !0xFFFF_FFFF;
        key_hash & !dropped
    }

    /// Makes room, in every shard, for its share of `entries_total`
    /// entries without growing: a shard smaller than `new` would have made
    /// it for that count grows to that size now, in one merge pass, while
    /// it is still small. Never shrinks a shard.
    pub fn reserve(&self, entries_total: usize) {
        let slots_count = shard_slots_for_total(entries_total, self.cells.len());
        for cell in self.cells.iter() {
            let mut shard = cell.lock();
            // (If the entries do not fit that size, the shard grows later.)
            if shard.slots.len() < slots_count
                && let Some(resized) = shard.resized(slots_count)
            {
                *shard = resized;
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
                    shard.prefetch(ahead.key_hash as u32);
                }
                let e = &mut chunk[i];
                debug_assert_eq!(self.shard_index(e.key_hash), shard_index);
                if shard.insert(e.key_hash as u32, stored(e), false) == Inserted::New {
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

    /// Removes the entry of a key's fingerprint, the one `get` finds, and
    /// returns it (with `key_hash`).
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
        let index = shard.find(key_hash as u32)?;
        let found = slot_stored(&shard.slots[index]).with_key(key_hash);
        if !pred(&found) {
            return None;
        }
        shard.remove_at(index);
        cell.publish(&shard);
        Some(found)
    }

    /// Removes every entry `keep` rejects, one shard (one lock) at a time;
    /// shrinks shards left below 1/2 load. Returns how many were removed.
    /// `keep` sees what the index stores, which has no key.
    pub fn retain(&self, mut keep: impl FnMut(&StoredEntry) -> bool) -> usize {
        let mut removed_count = 0;
        for cell in self.cells.iter() {
            let mut shard = cell.lock();
            removed_count += shard.retain(&mut keep, self.shard_slots_initial);
            cell.publish(&shard);
        }
        removed_count
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

    /// Bytes of DRAM the index holds: slot (and `high`) arrays and shard
    /// structs (`l2_hdr_size`). Excludes the `L2Index` struct itself (32
    /// bytes).
    pub fn memory_bytes(&self) -> usize {
        let arrays: usize = self
            .cells
            .iter()
            .map(|cell| shard_array_bytes(cell.slots_count.load(Ordering::Relaxed)))
            .sum();
        arrays + self.cells.len() * SHARD_CELL_BYTES
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
    /// every entry reachable from its home, Robin Hood order.
    pub fn assert_consistent(&self) {
        for cell in self.cells.iter() {
            let shard = cell.lock();
            shard.assert_consistent();
            assert_eq!(
                cell.entries_count.load(Ordering::Relaxed),
                shard.entries_count
            );
            assert_eq!(cell.slots_count.load(Ordering::Relaxed), shard.slots.len());
            assert!(shard.slots.len() >= self.shard_slots_initial);
        }
    }
}

/// What the index stores of an entry.
#[inline]
fn stored(entry: &IndexEntry) -> StoredEntry {
    StoredEntry {
        location: entry.location,
        checksum: entry.checksum,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Instant;

    use proptest::prelude::*;

    use super::*;
    use crate::hash::mix64;

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
    /// Keys from `SMALL_KEYS_PARTNERS_FROM` on equal an earlier key in every
    /// bit an index of up to `SHARDS_MAX` shards keeps (they differ in bits
    /// 32..52 only): fingerprint collisions.
    fn small_key(k: u16) -> u64 {
        if k >= SMALL_KEYS_PARTNERS_FROM {
            let partner = small_key(k - SMALL_KEYS_PARTNERS_FROM);
            let k = u64::from(k);
            return partner ^ (((mix64(k) << 32) & 0x000F_FFFF_0000_0000) | (1 << 45));
        }
        let k = u64::from(k);
        let key_hash = match k % 4 {
            1 => k,
            2 => (mix64(k) & !0xFFFF_FFFF) | (0xFFFF_FFFF - k % 16),
            _ => mix64(k),
        };
        key_hash.max(1)
    }

    const SMALL_KEYS_PARTNERS_FROM: u16 = 240;

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

    /// The index against a `HashMap` keyed by fingerprint (the kept bits of
    /// the key): an entry returned carries the key asked with.
    fn run_model(shards: usize, expected_entries: usize, ops: &[Op]) {
        let index = L2Index::new(shards, expected_entries);
        let mut model: HashMap<u64, StoredEntry> = HashMap::new();
        let fp = |key_hash| index.fingerprint(key_hash);
        for op in ops {
            match *op {
                Op::Insert(k, n) => {
                    let e = entry(small_key(k), n);
                    let old = model.insert(fp(e.key_hash), stored(&e));
                    let expected = old.map(|old| old.with_key(e.key_hash));
                    assert_eq!(index.insert(e), expected, "{op:?}");
                }
                Op::InsertIfAbsent(k, n) => {
                    let e = entry(small_key(k), n);
                    let absent = !model.contains_key(&fp(e.key_hash));
                    if absent {
                        model.insert(fp(e.key_hash), stored(&e));
                    }
                    assert_eq!(index.insert_if_absent(e), absent, "{op:?}");
                }
                Op::Remove(k) => {
                    let key_hash = small_key(k);
                    let expected = model.remove(&fp(key_hash)).map(|e| e.with_key(key_hash));
                    assert_eq!(index.remove(key_hash), expected, "{op:?}");
                }
                Op::RemoveIf(k, bit) => {
                    let key_hash = small_key(k);
                    let pred = |e: &IndexEntry| (e.location & 1 == 1) == bit;
                    let expected = match model.get(&fp(key_hash)) {
                        Some(e) if pred(&e.with_key(key_hash)) => model.remove(&fp(key_hash)),
                        _ => None,
                    };
                    let expected = expected.map(|e| e.with_key(key_hash));
                    assert_eq!(index.remove_if(key_hash, pred), expected, "{op:?}");
                }
                Op::Get(k) => {
                    let key_hash = small_key(k);
                    let expected = model.get(&fp(key_hash)).map(|e| e.with_key(key_hash));
                    assert_eq!(index.get(key_hash), expected, "{op:?}");
                }
                Op::Retain(modulus, remainder) => {
                    let keep = |e: &StoredEntry| e.location % modulus != remainder;
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
            let expected = model.get(&fp(key_hash)).map(|e| e.with_key(key_hash));
            assert_eq!(index.get(key_hash), expected);
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

    /// A partner of `k`: equal in every bit an index of up to `SHARDS_MAX`
    /// shards keeps (differs in bits 32..52 only).
    fn partner(k: u64, n: u64) -> u64 {
        k ^ (((mix64(n) << 32) & 0x000F_FFFF_0000_0000) | (1 << 40))
    }

    #[test]
    fn fingerprint_collisions_share_one_entry() {
        for shards in [1usize, 64, SHARDS_MAX] {
            // Small shards (with `high`) and large ones.
            for expected_entries in [0usize, shards * 70_000] {
                let index = L2Index::new(shards, expected_entries);
                for n in 1..=3000u64 {
                    let (k, p) = (key(n), partner(key(n), n));
                    assert_ne!(k, p);
                    assert_eq!(index.fingerprint(k), index.fingerprint(p));
                    let (e, f) = (entry(k, n), entry(p, n + 1_000_000));
                    // K' finds K's entry, with its own key.
                    assert_eq!(index.insert(e), None);
                    assert_eq!(index.get(p), Some(stored(&e).with_key(p)));
                    // K' replaces it; K then finds K''s.
                    assert_eq!(index.insert(f), Some(stored(&e).with_key(p)));
                    assert!(!index.insert_if_absent(e));
                    assert_eq!(index.get(k), Some(stored(&f).with_key(k)));
                    // Removing either removes what a get of either finds.
                    if n % 2 == 0 {
                        assert_eq!(index.remove(k), Some(stored(&f).with_key(k)));
                    } else {
                        let at_f = |x: &IndexEntry| x.location == f.location;
                        assert_eq!(index.remove_if(k, |x| !at_f(x)), None);
                        assert_eq!(index.remove_if(k, at_f), Some(stored(&f).with_key(k)));
                    }
                    assert_eq!(index.get(p), None);
                    assert_eq!(index.get(k), None);
                    // Keep one of each pair, so the tables fill.
                    assert!(index.insert_if_absent(if n % 3 == 0 { e } else { f }));
                }
                assert_eq!(index.len(), 3000);
                index.assert_consistent();
                // A kept bit tells keys apart: bits 0, 16 and 31 always,
                // the top bit with more than one shard.
                let k = key(1);
                for bit in [0, 16, 31, 63] {
                    let other = k ^ (1 << bit);
                    let same = bit == 63 && shards == 1;
                    assert_eq!(index.fingerprint(k) == index.fingerprint(other), same);
                    if !same && index.get(k).is_some() {
                        assert!(
                            index
                                .get(other)
                                .is_none_or(|x| x.location != index.get(k).unwrap().location)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bulk_inserts_keep_the_newest_of_a_fingerprint() {
        let index = L2Index::new(64, 0);
        let k = key(7);
        let p = partner(k, 7);
        // Newest first: K, then K' (older), then K again (oldest).
        let run = [entry(k, 1), entry(p, 2), entry(k, 3), entry(key(8), 4)];
        let (mut sorted, mut counts) = (Vec::new(), Vec::new());
        index.sort_run(&run, &mut sorted, &mut counts);
        assert_eq!(index.insert_sorted_if_absent(&mut sorted, 1), 2);
        let kept: Vec<u64> = sorted
            .iter()
            .map(|e| e.key_hash)
            .filter(|&h| h != 0)
            .collect();
        assert_eq!(kept.len(), 2);
        assert!(kept.contains(&k) && kept.contains(&key(8)));
        assert_eq!(
            index.get(p),
            Some(entry(k, 1)).map(|e| stored(&e).with_key(p))
        );
        // A later run meets them present.
        let run = [entry(p, 5)];
        index.sort_run(&run, &mut sorted, &mut counts);
        assert_eq!(index.insert_sorted_if_absent(&mut sorted, 1), 0);
        assert_eq!(sorted[0].key_hash, 0);
        index.assert_consistent();
    }

    /// The `n`-th key of a test whose keys must differ in their low words
    /// (one shard keeps only those): a bijection of `n` there.
    fn key32(n: u64) -> u64 {
        let x = (n as u32).wrapping_mul(0x9E37_79B1);
        let low = (x ^ (x >> 15)).wrapping_mul(0x85EB_CA6B);
        (mix64(n) & !0xFFFF_FFFF) | u64::from(low) | 1 << 63
    }

    /// Keys whose low words all share home 0 of a large shard.
    fn crowded_key(n: u64) -> u64 {
        (mix64(n) & 0x0000_0FFF_0000_0000) | n
    }

    #[test]
    fn displacement_cap_refuses_in_a_sparse_shard_grows_a_loaded_one() {
        let index = L2Index::new(1, 100_000);
        let memory_bytes = index.memory_bytes();
        // 255 entries fit at displacements 0..=254, then none.
        for n in 1..=DISPLACEMENT_MAX as u64 + 1 {
            assert_eq!(index.insert(entry(crowded_key(n), n)), None);
        }
        let over = entry(crowded_key(300), 300);
        assert_eq!(index.insert(over), Some(over), "refused: it left at once");
        assert!(!index.insert_if_absent(over));
        let (mut sorted, mut counts) = (Vec::new(), Vec::new());
        index.sort_run(&[over], &mut sorted, &mut counts);
        assert_eq!(index.insert_sorted_if_absent(&mut sorted, 1), 0);
        assert_eq!(sorted[0].key_hash, 0);
        assert_eq!(index.get(over.key_hash), None);
        assert_eq!(index.len(), DISPLACEMENT_MAX + 1);
        assert_eq!(
            index.memory_bytes(),
            memory_bytes,
            "a sparse shard does not grow"
        );
        index.assert_consistent();
        // Room at the home once one of them goes.
        assert!(index.remove(crowded_key(1)).is_some());
        assert_eq!(index.insert(over), None);
        index.assert_consistent();
        // Loaded past half: the shard grows once (the crowd stays at home
        // 0 of the larger table), then refuses. (Keys homed among the crowd,
        // or just before it at the end of the table, would be refused too:
        // the others fill it.)
        let spread = |n: &u64| (1 << 24..u32::MAX - (1 << 24)).contains(&(key32(*n) as u32));
        for n in (1..=61_000).filter(spread) {
            assert_eq!(index.insert(entry(key32(n), n + 1_000_000)), None);
        }
        let over = entry(crowded_key(301), 301);
        assert_eq!(index.insert(over), Some(over));
        let grown = index.memory_bytes();
        assert!(
            grown > memory_bytes && grown <= memory_bytes * 5 / 4 + 64,
            "{grown}"
        );
        index.assert_consistent();
        for n in (1..=61_000).filter(spread) {
            assert_eq!(index.get(key32(n)), Some(entry(key32(n), n + 1_000_000)));
        }
        for n in 2..=DISPLACEMENT_MAX as u64 + 1 {
            assert_eq!(index.get(crowded_key(n)), Some(entry(crowded_key(n), n)));
        }
        // A sweep that leaves it sparse shrinks it where the crowd fits.
        let spread_count = (1..=61_000).filter(spread).count();
        assert!(spread_count > 55_000);
        assert_eq!(index.retain(|e| e.checksum < 1_000_000), spread_count);
        index.assert_consistent();
        assert_eq!(index.len(), DISPLACEMENT_MAX + 1);
        assert!(index.memory_bytes() < grown);
    }

    #[test]
    fn low_word_comes_back_exactly_at_home_edges() {
        for slots_count in [
            16usize,
            1000,
            65_535,
            65_536,
            65_537,
            100_003,
            (1 << 20) + 7,
        ] {
            let mut shard = Shard::with_slots(slots_count);
            let n = slots_count as u64;
            let base = |h: u64| (h << 32).div_ceil(n);
            let mut lows = Vec::new();
            for h in [0, 1, n / 3, n / 2, n - 2, n - 1] {
                lows.extend([base(h), base(h + 1) - 1, base(h) + 1]);
            }
            lows.sort_unstable();
            lows.dedup();
            for (i, &low) in lows.iter().enumerate() {
                let stored = StoredEntry {
                    location: i as u64,
                    checksum: low as u32,
                };
                assert_eq!(shard.insert(low as u32, stored, false), Inserted::New);
            }
            shard.assert_consistent();
            for &low in &lows {
                let index = shard.find(low as u32).expect("found");
                assert_eq!(u64::from(shard.low_at(index)), low, "{slots_count} slots");
                assert_eq!(slot_stored(&shard.slots[index]).checksum, low as u32);
            }
            // Neighbours not inserted are not found.
            for &low in &lows {
                for other in [low.wrapping_sub(2), low + 2] {
                    if other < 1 << 32 && !lows.contains(&other) {
                        assert_eq!(shard.find(other as u32), None);
                    }
                }
            }
        }
    }

    #[test]
    fn one_shard_grows_past_the_small_size_and_shrinks_below_it() {
        const N: u64 = 200_000;
        let index = L2Index::new(1, 0);
        for n in 1..=N {
            assert_eq!(index.insert(entry(key32(n), n)), None);
        }
        index.assert_consistent();
        assert!(
            index.memory_bytes() < (N as usize) * 20,
            "large shard: no `high`"
        );
        let removed = index.retain(|e| e.checksum % 20 == 0);
        assert_eq!(removed, (N - N / 20) as usize);
        index.assert_consistent();
        for n in 1..=N {
            let expected = (n % 20 == 0).then(|| entry(key32(n), n));
            assert_eq!(index.get(key32(n)), expected);
        }
        index.reserve(N as usize);
        index.assert_consistent();
        for n in (20..=N).step_by(20) {
            assert_eq!(index.remove(key32(n)), Some(entry(key32(n), n)));
        }
        assert!(index.is_empty());
        index.assert_consistent();
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
                    assert!(shard.home(a as u32) <= shard.home(b as u32));
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
        // A small shard keeps 2 more bytes a slot (`high`).
        let small_slot_bytes = SLOT_BYTES + HIGH_BYTES;
        assert_eq!(
            index.memory_bytes(),
            64 + SHARD_SLOTS_MIN * small_slot_bytes
        );
        let index = L2Index::new(SHARDS_MAX, 0);
        assert_eq!(
            index.memory_bytes(),
            SHARDS_MAX * (64 + SHARD_SLOTS_MIN * small_slot_bytes)
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
        // 25 k entries a shard: small shards, 17 bytes a slot, at 0.768 to
        // 0.96 load.
        let bytes_per_entry = index.memory_bytes() as f64 / N as f64;
        assert!(
            (17.0 / 0.96..=17.0 / 0.768 + 0.1).contains(&bytes_per_entry),
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
            4 * (64 + SHARD_SLOTS_MIN * (SLOT_BYTES + HIGH_BYTES))
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

    // DRAM per entry and throughput at 10 M entries, against a hash map,
    // are a benchmark, not a test: `l2arc-bench --scenario l2-index`.
}
