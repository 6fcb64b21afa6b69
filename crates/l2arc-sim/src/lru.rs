/*!
 * LRU with size accounting: the baseline every adaptive policy is measured
 * against.
 *
 * The cache holds at most `capacity` units (pages or bytes, whatever the
 * trace counts in).  A hit moves the object to the MRU end; a miss inserts
 * it there and evicts from the LRU end until the total fits again.  An
 * object larger than the whole cache is never inserted (it would flush
 * everything and still not fit), so its request is a miss that leaves the
 * cache untouched, matching libCacheSim's `cache_can_insert_default`.
 *
 * Recency is an intrusive doubly linked list threaded through a slab
 * (`Vec<Node>`) with u32 links, plus a key -> slot map.  Everything is O(1)
 * per request, there is no allocation per request once the slab is warm
 * (freed slots are reused through a free list), and u32 links keep a node
 * at 24 bytes so that millions of cached pages stay cache-friendly.
 *
 * When a cached object is requested with a different size (possible in
 * real byte traces, although oracleGeneral traces have sizes normalised
 * away), the request is a hit served from the cache and the cached size is
 * updated to the new one, evicting from the LRU end if the cache now
 * overflows.  If the new size alone exceeds the cache, the object is
 * dropped and the request counted as a miss, since it could not have been
 * served from a cache that cannot hold it.
 */

use l2arc::hash::FastHashMap;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node {
    key: u64,
    size: u64,
    prev: u32, // towards MRU
    next: u32, // towards LRU
}

/// A byte- (or unit-) accounted LRU cache of keys.
pub struct Lru {
    capacity: u64,
    used: u64,
    nodes: Vec<Node>,
    free: Vec<u32>,
    map: FastHashMap<u64, u32>,
    head: u32, // MRU
    tail: u32, // LRU
}

impl Lru {
    /// An empty cache holding at most `capacity` units.
    pub fn new(capacity: u64) -> Self {
        Lru {
            capacity,
            used: 0,
            nodes: Vec::new(),
            free: Vec::new(),
            map: FastHashMap::with_capacity_and_hasher(0, Default::default()),
            head: NIL,
            tail: NIL,
        }
    }

    /// Units currently held.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// True if `key` is cached (does not touch recency).
    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head;
        {
            let n = &mut self.nodes[i as usize];
            n.prev = NIL;
            n.next = old;
        }
        if old == NIL {
            self.tail = i;
        } else {
            self.nodes[old as usize].prev = i;
        }
        self.head = i;
    }

    fn evict_lru(&mut self) {
        let i = self.tail;
        if i == NIL {
            return;
        }
        self.unlink(i);
        let n = self.nodes[i as usize];
        self.used -= n.size;
        self.map.remove(&n.key);
        self.free.push(i);
    }

    fn remove_slot(&mut self, i: u32) {
        self.unlink(i);
        let n = self.nodes[i as usize];
        self.used -= n.size;
        self.map.remove(&n.key);
        self.free.push(i);
    }

    /// Requests `key` of `size` units; returns true on a hit.  A miss
    /// inserts the object unless it is larger than the whole cache.
    pub fn access(&mut self, key: u64, size: u64) -> bool {
        if let Some(&i) = self.map.get(&key) {
            let old = self.nodes[i as usize].size;
            if old != size {
                if size > self.capacity {
                    self.remove_slot(i);
                    return false;
                }
                self.nodes[i as usize].size = size;
                self.used = self.used - old + size;
            }
            if self.head != i {
                self.unlink(i);
                self.push_front(i);
            }
            // The object is now MRU, so the loop stops before reaching it.
            while self.used > self.capacity {
                self.evict_lru();
            }
            return true;
        }
        if size > self.capacity {
            return false;
        }
        while self.used + size > self.capacity {
            self.evict_lru();
        }
        let node = Node {
            key,
            size,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                // u32 links: a slab of 4 G objects is ~128 GiB of nodes,
                // far beyond any trace this replays; past it, bypass.
                if self.nodes.len() >= NIL as usize {
                    return false;
                }
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.push_front(i);
        self.map.insert(key, i);
        self.used += size;
        false
    }
}

/// Replays `trace` through an LRU of `capacity` units; returns the hit count.
pub fn count_hits(trace: &[crate::Request], capacity: u64) -> u64 {
    let mut lru = Lru::new(capacity);
    let mut hits = 0u64;
    for r in trace {
        hits += u64::from(lru.access(r.key, r.size));
    }
    hits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recent_first() {
        let mut c = Lru::new(3);
        assert!(!c.access(1, 1));
        assert!(!c.access(2, 1));
        assert!(!c.access(3, 1));
        assert!(c.access(1, 1)); // 1 is MRU now; LRU order 2,3,1
        assert!(!c.access(4, 1)); // evicts 2
        assert!(!c.contains(2));
        assert!(c.contains(1) && c.contains(3) && c.contains(4));
        assert_eq!(c.used(), 3);
    }

    #[test]
    fn byte_accounting_evicts_until_fit() {
        let mut c = Lru::new(10);
        c.access(1, 4);
        c.access(2, 4);
        c.access(3, 2);
        assert_eq!(c.used(), 10);
        assert!(!c.access(4, 7)); // needs 7: evicts 1 (4) and 2 (4) -> 2 + 7 = 9
        assert!(!c.contains(1) && !c.contains(2));
        assert!(c.contains(3) && c.contains(4));
        assert_eq!(c.used(), 9);
    }

    #[test]
    fn oversized_object_is_a_miss_and_not_inserted() {
        let mut c = Lru::new(10);
        c.access(1, 5);
        assert!(!c.access(2, 11));
        assert!(!c.contains(2));
        assert!(c.contains(1));
        assert!(!c.access(2, 11));
    }

    #[test]
    fn size_change_on_hit_updates_accounting() {
        let mut c = Lru::new(10);
        c.access(1, 3);
        c.access(2, 3);
        c.access(3, 3);
        assert!(c.access(3, 6)); // grows: 3+3+6 = 12 > 10, evict 1 (LRU)
        assert!(!c.contains(1));
        assert_eq!(c.used(), 9);
        assert!(c.access(3, 1)); // shrinks
        assert_eq!(c.used(), 4);
        assert!(!c.access(3, 20)); // no longer fits at all: dropped, miss
        assert!(!c.contains(3));
        assert_eq!(c.used(), 3);
    }

    #[test]
    fn slots_are_reused() {
        let mut c = Lru::new(2);
        for k in 0..1000 {
            c.access(k, 1);
        }
        assert_eq!(c.len(), 2);
        assert!(c.nodes.len() <= 3);
    }

    #[test]
    fn zero_capacity_never_hits() {
        let mut c = Lru::new(0);
        for _ in 0..3 {
            assert!(!c.access(7, 1));
        }
        assert!(c.is_empty());
    }
}
