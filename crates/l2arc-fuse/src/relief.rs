//! Relief for a full node table: when to ask the kernel to forget nodes.
//!
//! Both mounts keep a bounded table of the nodes the kernel holds (one per
//! name it looked up, until it sends FORGET). The kernel forgets a node only
//! when it drops the dentries naming it, and it drops dentries under memory
//! pressure, not when our table fills: a client that stats many names would
//! fill the table and lock every new name out (ENFILE) for as long as the
//! kernel's dentry cache has room. So near the bound the mount asks the
//! kernel to drop the entries of idle nodes (`FUSE_NOTIFY_INVAL_ENTRY`), a
//! batch at a time, as the kernel's own LRU would under pressure; the
//! forgets that follow make room.
//!
//! This clock decides when, and which nodes count as idle, with no list to
//! keep in order: every lookup is a tick and stamps its node. Relief starts
//! two batches short of the bound (a batch is 1/16 of it) and hands out one
//! batch per batch of lookups, so it keeps pace with new names without
//! flooding the kernel, and at least one per `RELIEF_INTERVAL` while lookups
//! come, so a full table that nobody floods (its clients gone, their nodes
//! idle) drains too. Idle: not stamped in the last `len - batch - 1` ticks;
//! at most that many nodes were stamped in them, so more than a batch
//! qualify (one of them may be the root, which is never picked).
//!
//! Past the bound a lookup still fails with ENFILE: nodes that open files or
//! working directories pin cannot be forgotten.

use std::time::{Duration, Instant};

/// Longest a table near its bound goes without relief while looked up.
pub(crate) const RELIEF_INTERVAL: Duration = Duration::from_millis(50);

/// The lookup clock of one node table (see the module comment).
#[derive(Debug)]
pub(crate) struct ReliefClock {
    max_nodes: usize,
    /// Lookups so far, refused ones too.
    lookup_tick: u64,
    /// `lookup_tick` and the time when relief was last handed out.
    relief_tick: u64,
    relief_at: Option<Instant>,
}

/// Relief that is due now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Relief {
    /// Nodes to pick at most.
    pub batch: usize,
    /// A node whose stamp is at or before this tick is idle.
    pub idle_since: u64,
}

impl ReliefClock {
    pub(crate) fn new(max_nodes: usize) -> Self {
        assert!(max_nodes >= 2, "a table holds the root and one more");
        Self {
            max_nodes,
            lookup_tick: 0,
            relief_tick: 0,
            relief_at: None,
        }
    }

    /// Counts one lookup; returns the stamp for the node it found or made.
    pub(crate) fn tick(&mut self) -> u64 {
        self.lookup_tick += 1;
        self.lookup_tick
    }

    /// Whether relief is due for a table of `len` nodes, and for which.
    pub(crate) fn due(&mut self, len: usize) -> Option<Relief> {
        let batch = (self.max_nodes / 16).max(1);
        if len + 2 * batch < self.max_nodes {
            return None;
        }
        let now = Instant::now();
        let due = self.lookup_tick >= self.relief_tick + batch as u64
            || (self.lookup_tick > self.relief_tick
                && self
                    .relief_at
                    .is_none_or(|at| now.duration_since(at) >= RELIEF_INTERVAL));
        if !due {
            return None;
        }
        self.relief_tick = self.lookup_tick;
        self.relief_at = Some(now);
        let recent_window = len.saturating_sub(batch + 1) as u64;
        Some(Relief {
            batch,
            idle_since: self.lookup_tick.saturating_sub(recent_window),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_near_the_bound_a_batch_per_batch_of_lookups_or_per_interval() {
        let mut clock = ReliefClock::new(64); // batch 4: due from 56 nodes on
        for _ in 0..100 {
            clock.tick();
        }
        assert_eq!(clock.due(55), None, "not near the bound");
        let relief = clock.due(64).expect("near the bound");
        assert_eq!(relief.batch, 4);
        assert_eq!(relief.idle_since, 100 - 59, "the last 59 ticks are recent");
        assert_eq!(clock.due(64), None, "no lookup since");
        clock.tick();
        assert_eq!(clock.due(64), None, "one lookup inside the interval");
        for _ in 0..3 {
            clock.tick();
        }
        assert!(clock.due(64).is_some(), "a batch of lookups");
        std::thread::sleep(RELIEF_INTERVAL);
        assert_eq!(clock.due(64), None, "idle: no lookup, no relief");
        clock.tick();
        assert!(clock.due(64).is_some(), "one lookup after the interval");
    }
}
