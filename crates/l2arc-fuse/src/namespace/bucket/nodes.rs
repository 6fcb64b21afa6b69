//! The bucket's nodes: keys and prefixes the kernel has looked up.
//!
//! A bucket has no inodes, so a node is a key (an object) or a prefix
//! without its trailing '/' (a "directory" a delimited listing reported),
//! and its id is a stable hash of that path: the same in every mount, so
//! ids survive a remount and need no table to be handed out. Two paths
//! with one hash are refused (EIO) rather than served one for the other.
//!
//! The table holds only what the kernel holds (lookups not yet forgotten),
//! bounded by `max_nodes` (ENFILE beyond), with the clock that decides when
//! to ask the kernel to give idle nodes back (`crate::relief`).

use std::collections::HashMap;

use fuser::Errno;

use crate::relief::{Relief, ReliefClock};

pub(super) const ROOT_ID: u64 = 1;

pub(super) struct Node {
    /// Key (for objects) or prefix without trailing '/' (directories);
    /// "" for the root.
    pub(super) path: String,
    pub(super) is_dir: bool,
    /// Kernel references (lookups not yet forgotten).
    lookups: u64,
    /// When the kernel last looked it up (`crate::relief`).
    last_lookup_tick: u64,
    /// (version hash, size) the kernel's pages of this object reflect.
    pub(super) page_version: Option<(u64, u64)>,
}

/// Entries (parent id, name) the kernel is asked to drop.
pub(super) type ReliefJob = Vec<(u64, String)>;

/// A stable node id for a path: the same in every mount (1 is the root).
pub(super) fn node_id(path: &str) -> u64 {
    if path.is_empty() {
        return ROOT_ID;
    }
    // FNV-1a, never 0 or 1.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(2)
}

/// The path of `name` in directory `dir` ("" is the root).
pub(super) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// The nodes the kernel holds (see the module comment).
pub(super) struct NodeTable {
    pub(super) map: HashMap<u64, Node>,
    max_nodes: usize,
    relief: ReliefClock,
}

impl NodeTable {
    pub(super) fn new(max_nodes: usize) -> Self {
        let root = Node {
            path: String::new(),
            is_dir: true,
            lookups: 1,
            last_lookup_tick: 0,
            page_version: None,
        };
        Self {
            map: HashMap::from([(ROOT_ID, root)]),
            max_nodes,
            relief: ReliefClock::new(max_nodes),
        }
    }

    /// Counts a kernel reference to the node of `path` (made if new).
    pub(super) fn remember(&mut self, path: &str, is_dir: bool) -> Result<u64, Errno> {
        let tick = self.relief.tick();
        let ino = node_id(path);
        if let Some(node) = self.map.get_mut(&ino) {
            if node.path != path {
                // Two keys with one 64-bit hash: refuse the second rather
                // than serve one for the other.
                return Err(Errno::EIO);
            }
            node.lookups += 1;
            node.is_dir = is_dir;
            node.last_lookup_tick = tick;
            return Ok(ino);
        }
        if self.map.len() >= self.max_nodes {
            return Err(Errno::ENFILE);
        }
        let node = Node {
            path: path.to_string(),
            is_dir,
            lookups: 1,
            last_lookup_tick: tick,
            page_version: None,
        };
        self.map.insert(ino, node);
        Ok(ino)
    }

    /// Drops `nlookup` kernel references to `ino` (never the root's).
    pub(super) fn forget(&mut self, ino: u64, nlookup: u64) {
        if ino == ROOT_ID {
            return;
        }
        if let Some(node) = self.map.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(nlookup);
            if node.lookups == 0 {
                self.map.remove(&ino);
            }
        }
    }

    /// When relief is due, the entries (parent id, name) naming up to a
    /// batch of idle nodes; else none.
    pub(super) fn relief(&mut self) -> ReliefJob {
        let Some(Relief { batch, idle_since }) = self.relief.due(self.map.len()) else {
            return Vec::new();
        };
        self.map
            .iter()
            .filter(|(ino, node)| **ino != ROOT_ID && node.last_lookup_tick <= idle_since)
            .take(batch)
            .map(|(_, node)| match node.path.rsplit_once('/') {
                Some((dir, name)) => (node_id(dir), name.to_string()),
                None => (ROOT_ID, node.path.clone()),
            })
            .collect()
    }
}
