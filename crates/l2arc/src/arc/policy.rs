//! The ARC replacement policy as a pure state machine.
//!
//! Megiddo and Modha's Adaptive Replacement Cache (FAST 2003) keeps two LRU
//! lists of resident records: MRU (T1, seen once recently) and MFU (T2, seen
//! at least twice), and two "ghost" lists (B1, B2) that remember only the keys
//! of records recently evicted from each. A miss that lands in a ghost list is
//! evidence that the corresponding resident list was too small: a B1 hit grows
//! the MRU target `p`, a B2 hit shrinks it, each by the ratio of the ghost list
//! sizes (at least one record). So the cache moves between recency and
//! frequency on its own, and a one-time scan can never flush the MFU side.
//!
//! ZFS adapted the algorithm to variable-size buffers by accounting in bytes;
//! so do we. Every bound of the paper becomes a bound in bytes, and with
//! unit-size records the code below reduces step for step to the paper's
//! pseudo-code (Figure 4), which is how the trace tests reproduce its tables:
//! - `L1 = T1 + B1 <= c` and `T1 + T2 + B1 + B2 <= 2c` (directory bounds);
//! - `T1 + T2 <= c` (resident bytes never exceed the target);
//! - `0 <= p <= c`.
//!
//! Two ZFS refinements the paper lacks:
//! - Prefetched records are flagged. A prefetch that hits does not promote a
//!   record to MFU (read-ahead is not evidence of reuse); a demand read of a
//!   flagged record clears the flag and the next demand hit promotes it.
//! - A record a reader still references cannot be evicted. The caller says
//!   which records are evictable; eviction skips the rest (a bounded scan), and
//!   an insert that cannot make room is refused rather than overshooting `c`.
//!
//! An LRU mode exists for one reason: to measure what ARC itself buys. The
//! benchmarks run the same live cache, the same L2ARC and the same feeder with
//! only the DRAM replacement switched to plain LRU, so any difference in the
//! figures is the policy's. In LRU mode every resident record stays on the
//! MRU list, a hit moves it to the head, eviction takes the tail, and no ghost
//! is kept; byte accounting, the prefetch flag (which the L2ARC feeder reads)
//! and the rule that referenced records are never evicted all stay. The ARC
//! path pays one predictable branch for it.
//!
//! The policy holds no I/O and no data of its own: the value `V` is opaque
//! (a buffer in the live cache, `()` in trace replay), so the same code runs
//! live and in replay. Entries live in a slab with intrusive `u32` links, so
//! an access allocates nothing once the slab has grown to its working size.

use std::hash::Hash;

use crate::hash::FastHashMap;

const NIL: u32 = u32::MAX;

/// How many entries eviction looks past at the cold end of a list when the
/// coldest ones are referenced by readers, before trying the other list.
pub const EVICT_SCAN_MAX: usize = 64;

/// How the DRAM tier chooses what to evict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DramPolicy {
    /// The adaptive replacement cache (the default, and what ZFS runs).
    #[default]
    Arc,
    /// Plain least-recently-used with byte accounting: a baseline for
    /// benchmarks. Only the MRU list is used and no ghosts are kept.
    Lru,
}

/// The four lists of the ARC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ListId {
    /// T1: resident, seen once recently.
    Mru = 0,
    /// T2: resident, seen at least twice.
    Mfu = 1,
    /// B1: keys recently evicted from MRU.
    MruGhost = 2,
    /// B2: keys recently evicted from MFU.
    MfuGhost = 3,
}

impl ListId {
    /// The four lists, resident first.
    pub const ALL: [ListId; 4] = [ListId::Mru, ListId::Mfu, ListId::MruGhost, ListId::MfuGhost];

    /// Whether this list remembers keys only (no data).
    pub fn is_ghost(self) -> bool {
        matches!(self, ListId::MruGhost | ListId::MfuGhost)
    }
}

/// Why a record is being read: a reader asked for it, or read-ahead guessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    /// A read that a client asked for.
    Demand,
    /// A read ahead of the client (read-ahead, prefetch).
    Prefetch,
}

/// What a resident hit found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    /// The list the record was in before this access.
    pub list: ListId,
    /// The record had been brought in by prefetch and not yet demanded.
    pub was_prefetched: bool,
}

/// What an insert did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertOutcome {
    /// Inserted. `ghost` names the ghost list the key was found in, if any
    /// (a ghost hit, which adapted `p`).
    Inserted {
        /// The ghost list that remembered the key.
        ghost: Option<ListId>,
    },
    /// Larger than the whole cache; not inserted.
    TooLarge,
    /// Every candidate for eviction is referenced; not inserted.
    NoRoom {
        /// The ghost list that remembered the key.
        ghost: Option<ListId>,
    },
}

/// A record pushed out of the resident lists by an insert.
#[derive(Debug)]
pub struct Evicted<K, V> {
    /// The entry's key.
    pub key: K,
    /// The entry's value (in the live ARC, the record buffer).
    pub value: V,
    /// Bytes the entry charges against the target size.
    pub size_bytes: u64,
    /// The list it was evicted from (MRU or MFU).
    pub from: ListId,
    /// It had been brought in by prefetch and never demanded.
    pub prefetched: bool,
}

struct Entry<K, V> {
    key: K,
    size_bytes: u64,
    prev: u32,
    next: u32,
    list: ListId,
    prefetched: bool,
    /// `Some` while resident, `None` in a ghost list or on the free list.
    value: Option<V>,
}

#[derive(Clone, Copy, Default)]
struct List {
    /// Most recently used end.
    head: u32,
    /// Least recently used end (eviction end).
    tail: u32,
    size_bytes: u64,
    len: u64,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        size_bytes: 0,
        len: 0,
    };
}

/// The ARC state machine over keys `K` with opaque values `V`.
pub struct ArcPolicy<K, V> {
    entries: Vec<Entry<K, V>>,
    free_slots: Vec<u32>,
    index: FastHashMap<K, u32>,
    lists: [List; 4],
    capacity_bytes: u64,
    /// Target size of the MRU list in bytes. A real number as in the paper:
    /// ghost-hit deltas are ratios, and rounding them would bias adaptation.
    target_mru_bytes: f64,
    /// `true` in [`DramPolicy::Lru`] mode: one flag, tested where ARC and
    /// LRU differ (promotion on a hit, eviction on an insert).
    lru: bool,
}

impl<K: Hash + Eq + Copy, V> ArcPolicy<K, V> {
    /// An empty cache of `capacity_bytes` (the paper's `c`).
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_policy(capacity_bytes, DramPolicy::Arc)
    }

    /// An empty cache of `capacity_bytes` run as ARC or as plain LRU.
    pub fn with_policy(capacity_bytes: u64, policy: DramPolicy) -> Self {
        assert!(capacity_bytes > 0, "ARC capacity must be positive");
        Self {
            entries: Vec::new(),
            free_slots: Vec::new(),
            index: FastHashMap::default(),
            lists: [List::EMPTY; 4],
            capacity_bytes,
            target_mru_bytes: 0.0,
            lru: policy == DramPolicy::Lru,
        }
    }

    /// The replacement policy this cache runs.
    pub fn policy(&self) -> DramPolicy {
        if self.lru {
            DramPolicy::Lru
        } else {
            DramPolicy::Arc
        }
    }

    /// `c`: the most bytes the resident lists may hold.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// `p`: the adaptive target for the MRU list.
    pub fn target_mru_bytes(&self) -> u64 {
        self.target_mru_bytes as u64
    }

    /// Bytes on one list.
    pub fn list_bytes(&self, list: ListId) -> u64 {
        self.lists[list as usize].size_bytes
    }

    /// Entries on one list.
    pub fn list_len(&self, list: ListId) -> u64 {
        self.lists[list as usize].len
    }

    /// Bytes held by resident records (T1 + T2).
    pub fn resident_bytes(&self) -> u64 {
        self.list_bytes(ListId::Mru) + self.list_bytes(ListId::Mfu)
    }

    /// Entries on the two resident lists.
    pub fn resident_len(&self) -> u64 {
        self.list_len(ListId::Mru) + self.list_len(ListId::Mfu)
    }

    /// The list a key is in, without touching recency.
    pub fn list_of(&self, key: &K) -> Option<ListId> {
        self.index
            .get(key)
            .map(|&slot| self.entries[slot as usize].list)
    }

    /// The value of a resident key, without touching recency.
    pub fn peek(&self, key: &K) -> Option<&V> {
        let slot = *self.index.get(key)?;
        self.entries[slot as usize].value.as_ref()
    }

    /// A demand or prefetch access to a key. Returns the value and what was hit
    /// if the key is resident; `None` for a miss (including a ghost hit, which
    /// the following [`Self::insert`] accounts for).
    pub fn get(&mut self, key: &K, kind: AccessKind) -> Option<(&V, Hit)> {
        let slot = *self.index.get(key)?;
        let entry = &self.entries[slot as usize];
        let list = entry.list;
        if list.is_ghost() {
            return None;
        }
        let was_prefetched = entry.prefetched;
        let destination = if was_prefetched || kind == AccessKind::Prefetch || self.lru {
            // Read-ahead is not evidence of reuse: refresh in place. (In LRU
            // mode every hit refreshes in place: `list` is always MRU.)
            list
        } else {
            ListId::Mfu
        };
        if was_prefetched && kind == AccessKind::Demand {
            self.entries[slot as usize].prefetched = false;
        }
        self.unlink(slot);
        self.push_head(slot, destination);
        let value = self.entries[slot as usize]
            .value
            .as_ref()
            .expect("resident entry has a value");
        Some((
            value,
            Hit {
                list,
                was_prefetched,
            },
        ))
    }

    /// Inserts a record just read from below after a miss on `key`.
    ///
    /// Evicted records are appended to `evicted` (the caller frees or demotes
    /// them). `evictable` says whether a resident record may be evicted now
    /// (false while a reader references it).
    pub fn insert(
        &mut self,
        key: K,
        size_bytes: u64,
        value: V,
        kind: AccessKind,
        mut evictable: impl FnMut(&K, &V) -> bool,
        evicted: &mut Vec<Evicted<K, V>>,
    ) -> InsertOutcome {
        let size_bytes = size_bytes.max(1);
        if size_bytes > self.capacity_bytes {
            return InsertOutcome::TooLarge;
        }
        let c = self.capacity_bytes;
        let mut ghost = None;
        if let Some(&slot) = self.index.get(&key) {
            match self.entries[slot as usize].list {
                // Already resident (a racing fill): replace it as a new miss.
                ListId::Mru | ListId::Mfu => self.remove_slot(slot),
                ghost_list => ghost = Some(ghost_list),
            }
        }

        match ghost {
            Some(ListId::MruGhost) => {
                let b1 = self.list_bytes(ListId::MruGhost) as f64;
                let b2 = self.list_bytes(ListId::MfuGhost) as f64;
                let ratio = if b1 >= b2 { 1.0 } else { b2 / b1 };
                self.target_mru_bytes =
                    (self.target_mru_bytes + size_bytes as f64 * ratio).min(c as f64);
            }
            Some(ListId::MfuGhost) => {
                let b1 = self.list_bytes(ListId::MruGhost) as f64;
                let b2 = self.list_bytes(ListId::MfuGhost) as f64;
                let ratio = if b2 >= b1 { 1.0 } else { b1 / b2 };
                self.target_mru_bytes =
                    (self.target_mru_bytes - size_bytes as f64 * ratio).max(0.0);
            }
            _ => {}
        }

        let room = match ghost {
            Some(ghost_list) => {
                let made_room = self.replace(
                    size_bytes,
                    ghost_list == ListId::MfuGhost,
                    &mut evictable,
                    evicted,
                );
                let slot = self.index[&key];
                self.remove_slot(slot);
                made_room
            }
            None if self.lru => self.evict_lru(size_bytes, &mut evictable, evicted),
            None => self.make_room_for_new(size_bytes, &mut evictable, evicted),
        };
        if !room {
            return InsertOutcome::NoRoom { ghost };
        }

        // A ghost hit is the second sighting: straight to MFU, unless it is
        // only read-ahead.
        let list = if ghost.is_some() && kind == AccessKind::Demand {
            ListId::Mfu
        } else {
            ListId::Mru
        };
        let slot = self.alloc_slot(Entry {
            key,
            size_bytes,
            prev: NIL,
            next: NIL,
            list,
            prefetched: kind == AccessKind::Prefetch,
            value: Some(value),
        });
        self.index.insert(key, slot);
        self.push_head(slot, list);
        self.trim_ghosts();
        self.debug_check();
        InsertOutcome::Inserted { ghost }
    }

    /// Forgets a key entirely (resident or ghost), returning a resident value.
    /// Used when the record's data changed: its history no longer applies.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let slot = *self.index.get(key)?;
        let value = self.entries[slot as usize].value.take();
        self.remove_slot(slot);
        value
    }

    /// Changes `c` while running (the breathing ARC, `arc::breathe`).
    ///
    /// A shrink evicts as REPLACE does (from MRU while it is over `p`, else
    /// from MFU; LRU mode from its one list), leaving ghosts, then forgets
    /// the ghosts that no longer fit the directory bounds of the new `c`
    /// and clips `p` to it, so every bound of the module comment holds at
    /// once. A record the caller may not evict stays: `c` then stops above
    /// the bytes still resident, and the capacity set is returned (never
    /// below `capacity_bytes`, never below what is resident). A grow only
    /// raises `c`: new records fill it.
    pub fn set_capacity(
        &mut self,
        capacity_bytes: u64,
        mut evictable: impl FnMut(&K, &V) -> bool,
        evicted: &mut Vec<Evicted<K, V>>,
    ) -> u64 {
        assert!(capacity_bytes > 0, "ARC capacity must be positive");
        self.capacity_bytes = capacity_bytes;
        self.target_mru_bytes = self.target_mru_bytes.min(capacity_bytes as f64);
        if self.resident_bytes() > capacity_bytes {
            let room = if self.lru {
                self.evict_lru(0, &mut evictable, evicted)
            } else {
                self.replace(0, false, &mut evictable, evicted)
            };
            if !room {
                // Pinned records at the cold ends: c stays above them.
                self.capacity_bytes = self.resident_bytes();
            }
        }
        self.trim_ghosts();
        self.debug_check();
        assert!(self.capacity_bytes >= capacity_bytes);
        self.capacity_bytes
    }

    /// Resident keys from the eviction (cold) end of `list` towards the hot
    /// end, with their sizes, values and prefetch flags.
    pub fn iter_from_cold_end(
        &self,
        list: ListId,
    ) -> impl Iterator<Item = (&K, u64, &V, bool)> + '_ {
        self.iter_resident(list, false)
    }

    /// Resident keys from the most recently used (hot) end of `list`
    /// towards the eviction end: [`Self::iter_from_cold_end`] reversed.
    pub fn iter_from_hot_end(
        &self,
        list: ListId,
    ) -> impl Iterator<Item = (&K, u64, &V, bool)> + '_ {
        debug_assert!(
            matches!(list, ListId::Mru | ListId::Mfu),
            "a ghost list holds no value"
        );
        self.iter_resident(list, true)
    }

    /// The resident entries of `list` from its hot end (`from_hot`) or
    /// its cold end, with their sizes, values and prefetch flags.
    fn iter_resident(
        &self,
        list: ListId,
        from_hot: bool,
    ) -> impl Iterator<Item = (&K, u64, &V, bool)> + '_ {
        let ends = &self.lists[list as usize];
        let mut slot = if from_hot { ends.head } else { ends.tail };
        std::iter::from_fn(move || {
            while slot != NIL {
                let entry = &self.entries[slot as usize];
                slot = if from_hot { entry.next } else { entry.prev };
                if let Some(value) = entry.value.as_ref() {
                    return Some((&entry.key, entry.size_bytes, value, entry.prefetched));
                }
            }
            None
        })
    }

    /// Every entry of `list` (resident or ghost) from the hot end to the
    /// cold end, with its size and prefetch flag: the order a saved shape
    /// keeps (`arc::shape`).
    pub fn iter_entries_from_hot_end(
        &self,
        list: ListId,
    ) -> impl Iterator<Item = (&K, u64, Option<&V>, bool)> + '_ {
        let mut slot = self.lists[list as usize].head;
        std::iter::from_fn(move || {
            if slot == NIL {
                return None;
            }
            let entry = &self.entries[slot as usize];
            debug_assert_eq!(entry.list, list, "a list holds its own entries");
            slot = entry.next;
            Some((
                &entry.key,
                entry.size_bytes,
                entry.value.as_ref(),
                entry.prefetched,
            ))
        })
    }

    /// Sets `p` (a restored shape's), clipped to `[0, c]`.
    pub fn set_target_mru_bytes(&mut self, target_mru_bytes: u64) {
        self.target_mru_bytes = target_mru_bytes.min(self.capacity_bytes) as f64;
        debug_assert!((0.0..=self.capacity_bytes as f64).contains(&self.target_mru_bytes));
    }

    /// Appends a key the directory does not know at the COLD end of a
    /// ghost list (a restored shape's ghosts, saved hot to cold), if the
    /// directory bounds allow it (`T1 + B1 <= c`, the whole `<= 2c`).
    /// No data, no adaptation. False if refused.
    pub fn push_ghost_cold(&mut self, key: K, size_bytes: u64, list: ListId) -> bool {
        assert!(list.is_ghost(), "only a ghost list takes a bare key");
        let size_bytes = size_bytes.max(1);
        if self.lru || self.index.contains_key(&key) {
            return false;
        }
        let c = self.capacity_bytes;
        let total: u64 = ListId::ALL.iter().map(|&l| self.list_bytes(l)).sum();
        let l1 = self.list_bytes(ListId::Mru) + self.list_bytes(ListId::MruGhost);
        if total + size_bytes > 2 * c || (list == ListId::MruGhost && l1 + size_bytes > c) {
            return false;
        }
        let slot = self.alloc_slot(Entry {
            key,
            size_bytes,
            prev: NIL,
            next: NIL,
            list,
            prefetched: false,
            value: None,
        });
        self.index.insert(key, slot);
        self.push_tail(slot, list);
        self.debug_check();
        true
    }

    /// Inserts a record at the COLD end of a resident list (a prewarm from
    /// a saved shape, walked hot to cold, so that the lists come back in
    /// the saved order while demand reads meanwhile land at the hot ends).
    /// No ghost adaptation and no eviction: refused (false) if the key is
    /// resident already or the record does not fit under `c` as it is. A
    /// ghost of the key is replaced; ghosts beyond the directory bounds
    /// are trimmed from their cold ends, as after any insert.
    pub fn insert_cold(
        &mut self,
        key: K,
        size_bytes: u64,
        value: V,
        list: ListId,
        prefetched: bool,
    ) -> bool {
        assert!(!list.is_ghost(), "a record goes on a resident list");
        let size_bytes = size_bytes.max(1);
        let list = if self.lru { ListId::Mru } else { list };
        if self.resident_bytes() + size_bytes > self.capacity_bytes {
            return false;
        }
        if let Some(&slot) = self.index.get(&key) {
            if !self.entries[slot as usize].list.is_ghost() {
                return false;
            }
            self.remove_slot(slot);
        }
        let slot = self.alloc_slot(Entry {
            key,
            size_bytes,
            prev: NIL,
            next: NIL,
            list,
            prefetched,
            value: Some(value),
        });
        self.index.insert(key, slot);
        self.push_tail(slot, list);
        self.trim_ghosts();
        self.debug_check();
        true
    }

    /// LRU mode: evict from the MRU tail, leaving no ghost, until
    /// `size_bytes` fits.
    fn evict_lru(
        &mut self,
        size_bytes: u64,
        evictable: &mut impl FnMut(&K, &V) -> bool,
        evicted: &mut Vec<Evicted<K, V>>,
    ) -> bool {
        while self.resident_bytes() + size_bytes > self.capacity_bytes {
            let Some(slot) = self.find_victim(ListId::Mru, evictable) else {
                return false;
            };
            self.evict_slot(slot, false, evicted);
        }
        true
    }

    /// Case IV of the paper: a key seen in no list.
    fn make_room_for_new(
        &mut self,
        size_bytes: u64,
        evictable: &mut impl FnMut(&K, &V) -> bool,
        evicted: &mut Vec<Evicted<K, V>>,
    ) -> bool {
        let c = self.capacity_bytes;
        let l1_bytes = self.list_bytes(ListId::Mru) + self.list_bytes(ListId::MruGhost);
        if l1_bytes + size_bytes > c {
            // Case A: L1 is full. Forget the oldest MRU ghosts; if there are
            // none, T1 alone fills the cache and its coldest records go
            // without leaving a ghost.
            loop {
                let l1_bytes = self.list_bytes(ListId::Mru) + self.list_bytes(ListId::MruGhost);
                if l1_bytes + size_bytes <= c {
                    break;
                }
                if self.list_len(ListId::MruGhost) > 0 {
                    // With unit sizes this drops exactly one ghost, as the paper does.
                    let slot = self.lists[ListId::MruGhost as usize].tail;
                    self.remove_slot(slot);
                } else {
                    let Some(slot) = self.find_victim(ListId::Mru, evictable) else {
                        return false;
                    };
                    self.evict_slot(slot, false, evicted);
                }
            }
        } else {
            // Case B: L1 has room; keep the whole directory within 2c.
            let total_bytes: u64 = ListId::ALL.iter().map(|&l| self.list_bytes(l)).sum();
            if total_bytes + size_bytes > c {
                let mut total_bytes = total_bytes;
                while total_bytes + size_bytes > 2 * c && self.list_len(ListId::MfuGhost) > 0 {
                    let slot = self.lists[ListId::MfuGhost as usize].tail;
                    total_bytes -= self.entries[slot as usize].size_bytes;
                    self.remove_slot(slot);
                }
            }
        }
        self.replace(size_bytes, false, evictable, evicted)
    }

    /// The paper's REPLACE, repeated until `size_bytes` fits: evict from MRU
    /// when it is over its target `p`, else from MFU.
    fn replace(
        &mut self,
        size_bytes: u64,
        hit_in_mfu_ghost: bool,
        evictable: &mut impl FnMut(&K, &V) -> bool,
        evicted: &mut Vec<Evicted<K, V>>,
    ) -> bool {
        while self.resident_bytes() + size_bytes > self.capacity_bytes {
            let t1_bytes = self.list_bytes(ListId::Mru) as f64;
            let prefer_mru = self.list_len(ListId::Mru) > 0
                && ((hit_in_mfu_ghost && t1_bytes == self.target_mru_bytes)
                    || t1_bytes > self.target_mru_bytes);
            let (first, second) = if prefer_mru {
                (ListId::Mru, ListId::Mfu)
            } else {
                (ListId::Mfu, ListId::Mru)
            };
            let victim = self
                .find_victim(first, evictable)
                .or_else(|| self.find_victim(second, evictable));
            let Some(slot) = victim else {
                return false;
            };
            self.evict_slot(slot, true, evicted);
        }
        true
    }

    /// The coldest evictable record of a resident list, looking at most
    /// [`EVICT_SCAN_MAX`] entries in.
    fn find_victim(&self, list: ListId, evictable: &mut impl FnMut(&K, &V) -> bool) -> Option<u32> {
        let mut slot = self.lists[list as usize].tail;
        for _ in 0..EVICT_SCAN_MAX {
            if slot == NIL {
                return None;
            }
            let entry = &self.entries[slot as usize];
            let value = entry.value.as_ref().expect("resident entry has a value");
            if evictable(&entry.key, value) {
                return Some(slot);
            }
            slot = entry.prev;
        }
        None
    }

    /// Moves a resident record out: to its ghost list, or out of the
    /// directory entirely (`to_ghost == false`).
    fn evict_slot(&mut self, slot: u32, to_ghost: bool, evicted: &mut Vec<Evicted<K, V>>) {
        let from = self.entries[slot as usize].list;
        debug_assert!(!from.is_ghost());
        let entry = &mut self.entries[slot as usize];
        let value = entry.value.take().expect("resident entry has a value");
        evicted.push(Evicted {
            key: entry.key,
            value,
            size_bytes: entry.size_bytes,
            from,
            prefetched: entry.prefetched,
        });
        if to_ghost {
            let ghost = if from == ListId::Mru {
                ListId::MruGhost
            } else {
                ListId::MfuGhost
            };
            self.entries[slot as usize].prefetched = false;
            self.unlink(slot);
            self.push_head(slot, ghost);
        } else {
            self.remove_slot(slot);
        }
    }

    /// Keeps the directory bounds when sizes vary (a ghost that comes back
    /// larger than it left). Never acts with unit sizes.
    fn trim_ghosts(&mut self) {
        let c = self.capacity_bytes;
        while self.list_bytes(ListId::Mru) + self.list_bytes(ListId::MruGhost) > c
            && self.list_len(ListId::MruGhost) > 0
        {
            self.remove_slot(self.lists[ListId::MruGhost as usize].tail);
        }
        loop {
            let total_bytes: u64 = ListId::ALL.iter().map(|&l| self.list_bytes(l)).sum();
            if total_bytes <= 2 * c {
                break;
            }
            let ghost = if self.list_len(ListId::MfuGhost) > 0 {
                ListId::MfuGhost
            } else if self.list_len(ListId::MruGhost) > 0 {
                ListId::MruGhost
            } else {
                break;
            };
            self.remove_slot(self.lists[ghost as usize].tail);
        }
    }

    fn alloc_slot(&mut self, entry: Entry<K, V>) -> u32 {
        if let Some(slot) = self.free_slots.pop() {
            self.entries[slot as usize] = entry;
            slot
        } else {
            let slot = u32::try_from(self.entries.len()).expect("more than 2^32 ARC entries");
            assert!(slot != NIL);
            self.entries.push(entry);
            slot
        }
    }

    fn remove_slot(&mut self, slot: u32) {
        self.unlink(slot);
        let entry = &mut self.entries[slot as usize];
        entry.value = None;
        let key = entry.key;
        self.index.remove(&key);
        self.free_slots.push(slot);
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next, list, size_bytes) = {
            let e = &self.entries[slot as usize];
            (e.prev, e.next, e.list, e.size_bytes)
        };
        let l = &mut self.lists[list as usize];
        if prev == NIL {
            l.head = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        let l = &mut self.lists[list as usize];
        if next == NIL {
            l.tail = prev;
        } else {
            self.entries[next as usize].prev = prev;
        }
        let l = &mut self.lists[list as usize];
        l.size_bytes -= size_bytes;
        l.len -= 1;
        let e = &mut self.entries[slot as usize];
        e.prev = NIL;
        e.next = NIL;
    }

    fn push_head(&mut self, slot: u32, list: ListId) {
        let old_head = self.lists[list as usize].head;
        {
            let e = &mut self.entries[slot as usize];
            e.list = list;
            e.prev = NIL;
            e.next = old_head;
        }
        if old_head != NIL {
            self.entries[old_head as usize].prev = slot;
        }
        let size_bytes = self.entries[slot as usize].size_bytes;
        let l = &mut self.lists[list as usize];
        l.head = slot;
        if l.tail == NIL {
            l.tail = slot;
        }
        l.size_bytes += size_bytes;
        l.len += 1;
    }

    fn push_tail(&mut self, slot: u32, list: ListId) {
        let old_tail = self.lists[list as usize].tail;
        {
            let e = &mut self.entries[slot as usize];
            e.list = list;
            e.prev = old_tail;
            e.next = NIL;
        }
        if old_tail != NIL {
            self.entries[old_tail as usize].next = slot;
        }
        let size_bytes = self.entries[slot as usize].size_bytes;
        let l = &mut self.lists[list as usize];
        l.tail = slot;
        if l.head == NIL {
            l.head = slot;
        }
        l.size_bytes += size_bytes;
        l.len += 1;
    }

    #[inline]
    fn debug_check(&self) {
        if cfg!(debug_assertions) {
            self.assert_bounds();
        }
    }

    /// The ARC's bounds, cheap enough to assert after every insert in debug
    /// builds: resident within `c`, L1 within `c`, the directory within `2c`,
    /// `p` within `[0, c]`.
    pub fn assert_bounds(&self) {
        let c = self.capacity_bytes;
        assert!(
            self.resident_bytes() <= c,
            "resident {} > c {c}",
            self.resident_bytes()
        );
        let l1 = self.list_bytes(ListId::Mru) + self.list_bytes(ListId::MruGhost);
        assert!(l1 <= c, "L1 {l1} > c {c}");
        let total: u64 = ListId::ALL.iter().map(|&l| self.list_bytes(l)).sum();
        assert!(total <= 2 * c, "directory {total} > 2c {}", 2 * c);
        assert!(
            (0.0..=c as f64).contains(&self.target_mru_bytes),
            "p {} outside [0, {c}]",
            self.target_mru_bytes
        );
        if self.lru {
            assert_eq!(
                total,
                self.list_bytes(ListId::Mru),
                "LRU mode holds records outside the MRU list"
            );
        }
    }

    /// Walks every list and checks links, sizes and the index against each
    /// other. O(n): for tests.
    pub fn assert_consistent(&self) {
        self.assert_bounds();
        let mut seen = 0usize;
        for list in ListId::ALL {
            let l = &self.lists[list as usize];
            let (mut slot, mut prev, mut bytes, mut len) = (l.head, NIL, 0u64, 0u64);
            while slot != NIL {
                let e = &self.entries[slot as usize];
                assert_eq!(e.list, list);
                assert_eq!(e.prev, prev);
                assert_eq!(e.value.is_some(), !list.is_ghost());
                assert_eq!(self.index.get(&e.key), Some(&slot));
                bytes += e.size_bytes;
                len += 1;
                prev = slot;
                slot = e.next;
            }
            assert_eq!(l.tail, prev);
            assert_eq!(l.size_bytes, bytes);
            assert_eq!(l.len, len);
            seen += len as usize;
        }
        assert_eq!(seen, self.index.len());
    }
}

impl<K: Hash + Eq + Copy> ArcPolicy<K, ()> {
    /// One demand access in trace replay: true on a hit; on a miss the key is
    /// inserted (with `size`, in the trace's unit) and the policy evicts.
    pub fn access(&mut self, key: K, size: u64) -> bool {
        if self.get(&key, AccessKind::Demand).is_some() {
            return true;
        }
        let mut evicted = Vec::new();
        self.insert(key, size, (), AccessKind::Demand, |_, _| true, &mut evicted);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn unit(c: u64) -> ArcPolicy<u64, ()> {
        ArcPolicy::new(c)
    }

    #[test]
    fn full_mru_drops_without_ghost_else_evicts_to_ghost() {
        // Paper case IV.A: T1 alone fills the cache; its LRU record is
        // dropped outright, leaving no ghost.
        let mut arc = unit(3);
        for k in 0..3 {
            assert!(!arc.access(k, 1));
        }
        assert!(!arc.access(3, 1));
        assert_eq!(arc.list_of(&0), None);
        assert_eq!(arc.resident_len(), 3);
        // With an MFU record present, REPLACE moves T1's LRU to B1.
        let mut arc = unit(3);
        arc.access(0, 1);
        arc.access(0, 1);
        arc.access(1, 1);
        arc.access(2, 1);
        arc.access(3, 1);
        assert_eq!(arc.list_of(&1), Some(ListId::MruGhost));
        assert_eq!(arc.list_of(&0), Some(ListId::Mfu));
        arc.assert_consistent();
    }

    #[test]
    fn second_access_promotes_to_mfu() {
        let mut arc = unit(4);
        arc.access(1, 1);
        assert_eq!(arc.list_of(&1), Some(ListId::Mru));
        assert!(arc.access(1, 1));
        assert_eq!(arc.list_of(&1), Some(ListId::Mfu));
    }

    #[test]
    fn mru_ghost_hit_grows_p_and_mfu_ghost_hit_shrinks_it() {
        let mut arc = unit(2);
        arc.access(1, 1);
        arc.access(1, 1); // 1 in T2
        arc.access(2, 1);
        arc.access(3, 1); // REPLACE: T1 > p = 0, so 2 -> B1
        assert_eq!(arc.list_of(&2), Some(ListId::MruGhost));
        assert_eq!(arc.target_mru_bytes(), 0);
        arc.access(2, 1); // B1 hit: p += 1, 2 -> T2
        assert_eq!(arc.target_mru_bytes(), 1);
        assert_eq!(arc.list_of(&2), Some(ListId::Mfu));
        // T1 = {3} = p, so REPLACE now takes T2's LRU (1) to B2.
        assert_eq!(arc.list_of(&1), Some(ListId::MfuGhost));
        arc.access(1, 1); // B2 hit: p -= 1
        assert_eq!(arc.target_mru_bytes(), 0);
        assert_eq!(arc.list_of(&1), Some(ListId::Mfu));
        arc.assert_consistent();
    }

    #[test]
    fn scan_does_not_flush_mfu() {
        let mut arc = unit(100);
        for _ in 0..2 {
            for k in 0..50 {
                arc.access(k, 1);
            }
        }
        for k in 1000..11000 {
            arc.access(k, 1);
        }
        let kept = (0..50).filter(|k| arc.peek(k).is_some()).count();
        assert_eq!(kept, 50, "a one-time scan evicted frequently used records");
    }

    #[test]
    fn prefetch_hit_does_not_promote() {
        let mut arc: ArcPolicy<u64, u32> = ArcPolicy::new(10);
        let mut ev = Vec::new();
        arc.insert(7, 1, 70, AccessKind::Prefetch, |_, _| true, &mut ev);
        assert!(arc.get(&7, AccessKind::Prefetch).is_some());
        assert_eq!(arc.list_of(&7), Some(ListId::Mru));
        let (_, hit) = arc.get(&7, AccessKind::Demand).unwrap();
        assert!(hit.was_prefetched);
        assert_eq!(
            arc.list_of(&7),
            Some(ListId::Mru),
            "first demand clears the flag only"
        );
        let (_, hit) = arc.get(&7, AccessKind::Demand).unwrap();
        assert!(!hit.was_prefetched);
        assert_eq!(arc.list_of(&7), Some(ListId::Mfu));
    }

    #[test]
    fn pinned_records_are_not_evicted() {
        let mut arc: ArcPolicy<u64, bool> = ArcPolicy::new(4);
        let mut ev = Vec::new();
        // value = pinned?
        for k in 0..4 {
            arc.insert(
                k,
                1,
                k == 0,
                AccessKind::Demand,
                |_, &pinned| !pinned,
                &mut ev,
            );
        }
        arc.insert(
            9,
            1,
            false,
            AccessKind::Demand,
            |_, &pinned| !pinned,
            &mut ev,
        );
        assert!(arc.peek(&0).is_some(), "pinned record evicted");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].key, 1);
        // Everything pinned: the insert is refused, nothing overshoots c.
        let mut arc: ArcPolicy<u64, bool> = ArcPolicy::new(2);
        arc.insert(1, 1, true, AccessKind::Demand, |_, &p| !p, &mut ev);
        arc.insert(2, 1, true, AccessKind::Demand, |_, &p| !p, &mut ev);
        let outcome = arc.insert(3, 1, true, AccessKind::Demand, |_, &p| !p, &mut ev);
        assert!(matches!(outcome, InsertOutcome::NoRoom { .. }));
        assert_eq!(arc.resident_bytes(), 2);
        arc.assert_consistent();
    }

    #[test]
    fn set_capacity_shrinks_by_evicting_and_grows_back() {
        let mut arc: ArcPolicy<u64, bool> = ArcPolicy::new(10);
        let mut ev = Vec::new();
        for k in 0..10 {
            arc.insert(k, 1, k == 9, AccessKind::Demand, |_, &p| !p, &mut ev);
        }
        for k in 0..5 {
            arc.get(&k, AccessKind::Demand); // 0..5 to MFU
        }
        ev.clear();
        assert_eq!(arc.set_capacity(4, |_, &p| !p, &mut ev), 4);
        assert_eq!(arc.resident_bytes(), 4);
        assert_eq!(ev.len(), 6);
        assert!(ev.iter().all(|e| !e.value), "the pinned record 9 stays");
        assert!(arc.peek(&9).is_some());
        assert!(arc.target_mru_bytes() <= 4);
        arc.assert_consistent();
        // Everything pinned: c stops at what is resident.
        let mut pinned: ArcPolicy<u64, bool> = ArcPolicy::new(4);
        for k in 0..4 {
            pinned.insert(k, 1, true, AccessKind::Demand, |_, &p| !p, &mut ev);
        }
        assert_eq!(pinned.set_capacity(1, |_, &p| !p, &mut ev), 4);
        pinned.assert_consistent();
        // A grow only raises c; new records fill it without evicting.
        assert_eq!(arc.set_capacity(12, |_, &p| !p, &mut ev), 12);
        ev.clear();
        for k in 100..108 {
            arc.insert(k, 1, false, AccessKind::Demand, |_, &p| !p, &mut ev);
        }
        assert_eq!(arc.resident_bytes(), 12);
        assert!(ev.is_empty());
        arc.assert_consistent();
    }

    #[test]
    fn cold_inserts_and_ghosts_keep_the_saved_order_and_the_bounds() {
        let mut arc: ArcPolicy<u64, ()> = ArcPolicy::new(4);
        assert!(arc.push_ghost_cold(10, 1, ListId::MruGhost));
        assert!(arc.push_ghost_cold(11, 1, ListId::MfuGhost));
        assert!(!arc.push_ghost_cold(10, 1, ListId::MfuGhost), "known key");
        for k in [1, 2] {
            assert!(arc.insert_cold(k, 1, (), ListId::Mfu, false));
        }
        assert!(arc.insert_cold(3, 1, (), ListId::Mru, true));
        // A demand insert lands at the hot end, before the prewarmed ones.
        arc.access(4, 1);
        let mru: Vec<u64> = arc
            .iter_entries_from_hot_end(ListId::Mru)
            .map(|e| *e.0)
            .collect();
        assert_eq!(mru, [4, 3]);
        let mfu: Vec<u64> = arc
            .iter_entries_from_hot_end(ListId::Mfu)
            .map(|e| *e.0)
            .collect();
        assert_eq!(mfu, [1, 2]);
        // Full: refused, never past c.
        assert!(!arc.insert_cold(5, 1, (), ListId::Mfu, false));
        assert!(!arc.insert_cold(1, 1, (), ListId::Mfu, false), "resident");
        arc.set_target_mru_bytes(99);
        assert_eq!(arc.target_mru_bytes(), 4, "p clipped to c");
        arc.assert_consistent();
    }

    #[test]
    fn too_large_is_refused() {
        let mut arc: ArcPolicy<u64, ()> = ArcPolicy::new(100);
        let mut ev = Vec::new();
        let outcome = arc.insert(1, 101, (), AccessKind::Demand, |_, _| true, &mut ev);
        assert_eq!(outcome, InsertOutcome::TooLarge);
        assert_eq!(arc.resident_bytes(), 0);
    }

    #[test]
    fn remove_forgets_resident_and_ghost() {
        let mut arc = unit(2);
        arc.access(1, 1);
        arc.access(1, 1);
        arc.access(2, 1);
        arc.access(3, 1);
        assert_eq!(arc.list_of(&2), Some(ListId::MruGhost));
        for k in 1..=3 {
            arc.remove(&k);
            assert_eq!(arc.list_of(&k), None);
        }
        assert_eq!(arc.resident_bytes(), 0);
        arc.assert_consistent();
    }

    #[derive(Clone, Debug)]
    enum Op {
        Get {
            key: u8,
            prefetch: bool,
        },
        Insert {
            key: u8,
            size: u16,
            prefetch: bool,
            pinned: bool,
        },
        Remove {
            key: u8,
        },
        SetCapacity {
            c: u16,
            pinned_ok: bool,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<u8>(), any::<bool>()).prop_map(|(key, prefetch)| Op::Get { key, prefetch }),
            4 => (any::<u8>(), 1u16..300, any::<bool>(), prop::bool::weighted(0.1))
                .prop_map(|(key, size, prefetch, pinned)| Op::Insert { key, size, prefetch, pinned }),
            1 => any::<u8>().prop_map(|key| Op::Remove { key }),
            1 => (1u16..2000, any::<bool>()).prop_map(|(c, pinned_ok)| Op::SetCapacity { c, pinned_ok }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Arbitrary sequences of variable-size accesses, prefetches, pins
        /// and removals keep every ARC bound and the lists consistent, and
        /// never evict a pinned record.
        #[test]
        fn bounds_hold_under_any_sequence(
            c in 1u64..2000,
            lru in any::<bool>(),
            ops in prop::collection::vec(op(), 1..400),
        ) {
            let policy = if lru { DramPolicy::Lru } else { DramPolicy::Arc };
            let mut arc: ArcPolicy<u8, bool> = ArcPolicy::with_policy(c, policy);
            let mut evicted = Vec::new();
            for op in ops {
                match op {
                    Op::Get { key, prefetch } => {
                        let kind = if prefetch { AccessKind::Prefetch } else { AccessKind::Demand };
                        let _ = arc.get(&key, kind);
                    }
                    Op::Insert { key, size, prefetch, pinned } => {
                        if arc.peek(&key).is_some() { continue; }
                        let kind = if prefetch { AccessKind::Prefetch } else { AccessKind::Demand };
                        evicted.clear();
                        let outcome = arc.insert(key, u64::from(size), pinned, kind, |_, &p| !p, &mut evicted);
                        prop_assert!(evicted.iter().all(|e| !e.value), "a pinned record was evicted");
                        match outcome {
                            InsertOutcome::Inserted { .. } => prop_assert!(arc.peek(&key).is_some()),
                            InsertOutcome::TooLarge => prop_assert!(u64::from(size) > arc.capacity_bytes()),
                            InsertOutcome::NoRoom { .. } => prop_assert!(arc.peek(&key).is_none()),
                        }
                    }
                    Op::Remove { key } => { arc.remove(&key); }
                    Op::SetCapacity { c: new_c, pinned_ok } => {
                        // A shrink or a grow while running: evicts only what
                        // may be evicted, and c lands on the request unless
                        // pinned bytes hold it up.
                        evicted.clear();
                        let set = arc.set_capacity(u64::from(new_c), |_, &p| !p || pinned_ok, &mut evicted);
                        prop_assert!(pinned_ok || evicted.iter().all(|e| !e.value), "a pinned record was evicted");
                        prop_assert!(set >= u64::from(new_c));
                        prop_assert!(set == u64::from(new_c) || set == arc.resident_bytes());
                        prop_assert_eq!(set, arc.capacity_bytes());
                        if pinned_ok {
                            prop_assert_eq!(set, u64::from(new_c), "nothing pinned: c is what was asked");
                        }
                    }
                }
                arc.assert_consistent();
            }
        }

        /// With unit sizes the ghost lists never hold more than c keys each
        /// side (|T1|+|B1| <= c, total <= 2c), and p moves by whole steps.
        #[test]
        fn unit_size_directory_bounds(c in 1u64..64, keys in prop::collection::vec(0u64..200, 1..2000)) {
            let mut arc = unit(c);
            for k in keys {
                arc.access(k, 1);
                prop_assert!(arc.list_len(ListId::Mru) + arc.list_len(ListId::MruGhost) <= c);
                prop_assert!(arc.resident_len() <= c);
                prop_assert!(arc.index.len() as u64 <= 2 * c);
            }
            arc.assert_consistent();
        }

        /// LRU mode is LRU: against a model (a deque, most recent first) on
        /// any sequence of unit-size accesses.
        #[test]
        fn lru_mode_matches_a_model_lru(c in 1u64..32, keys in prop::collection::vec(0u64..64, 1..1000)) {
            let mut arc: ArcPolicy<u64, ()> = ArcPolicy::with_policy(c, DramPolicy::Lru);
            let mut model: std::collections::VecDeque<u64> = Default::default();
            for k in keys {
                let model_hit = match model.iter().position(|&m| m == k) {
                    Some(i) => { model.remove(i); true }
                    None => { if model.len() as u64 == c { model.pop_back(); } false }
                };
                model.push_front(k);
                prop_assert_eq!(arc.access(k, 1), model_hit);
                let resident: Vec<u64> = arc.iter_from_cold_end(ListId::Mru).map(|(k, ..)| *k).collect();
                let expected: Vec<u64> = model.iter().rev().copied().collect();
                prop_assert_eq!(resident, expected);
            }
            arc.assert_consistent();
        }
    }

    #[test]
    fn lru_mode_hit_refreshes_in_mru_and_evicts_the_tail() {
        let mut lru: ArcPolicy<u64, ()> = ArcPolicy::with_policy(3, DramPolicy::Lru);
        assert_eq!(lru.policy(), DramPolicy::Lru);
        for k in 0..3 {
            assert!(!lru.access(k, 1));
        }
        assert!(lru.access(0, 1));
        assert!(lru.access(0, 1));
        assert_eq!(
            lru.list_of(&0),
            Some(ListId::Mru),
            "LRU mode never promotes"
        );
        assert!(!lru.access(3, 1)); // evicts 1, the least recent
        assert_eq!(lru.list_of(&1), None, "LRU mode keeps no ghost");
        assert!(lru.peek(&0).is_some() && lru.peek(&2).is_some());
        assert_eq!(lru.list_len(ListId::Mfu), 0);
        assert_eq!(lru.target_mru_bytes(), 0);
        lru.assert_consistent();
        // A one-time scan flushes LRU (the weakness ARC exists to fix).
        for k in 100..103 {
            lru.access(k, 1);
        }
        assert_eq!(lru.peek(&0), None);
    }

    #[test]
    fn lru_mode_keeps_the_prefetch_flag_and_pins() {
        let mut lru: ArcPolicy<u64, bool> = ArcPolicy::with_policy(3, DramPolicy::Lru);
        let mut ev = Vec::new();
        lru.insert(1, 1, true, AccessKind::Prefetch, |_, &p| !p, &mut ev);
        let flags: Vec<bool> = lru
            .iter_from_cold_end(ListId::Mru)
            .map(|(_, _, _, prefetched)| prefetched)
            .collect();
        assert_eq!(flags, [true]);
        let (_, hit) = lru.get(&1, AccessKind::Demand).unwrap();
        assert!(hit.was_prefetched);
        let (_, hit) = lru.get(&1, AccessKind::Demand).unwrap();
        assert!(!hit.was_prefetched, "the demand read cleared the flag");
        // 1 is pinned (value true) and the coldest: eviction skips it.
        lru.insert(2, 1, false, AccessKind::Demand, |_, &p| !p, &mut ev);
        lru.insert(3, 1, false, AccessKind::Demand, |_, &p| !p, &mut ev);
        lru.get(&2, AccessKind::Demand);
        lru.get(&3, AccessKind::Demand);
        let outcome = lru.insert(4, 1, false, AccessKind::Demand, |_, &p| !p, &mut ev);
        assert_eq!(outcome, InsertOutcome::Inserted { ghost: None });
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].key, 2);
        assert!(lru.peek(&1).is_some(), "pinned record evicted");
        lru.assert_consistent();
    }
}
