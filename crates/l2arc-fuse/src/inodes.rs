//! The inode table: FUSE node ids to source inodes, each pinned by an
//! `O_PATH` descriptor.
//!
//! The kernel names files by node id and expects one id per file, however
//! many names the file has: hard links share an id, a renamed file keeps
//! its id, and an open file whose last name was unlinked is still its id
//! until the kernel forgets it. So a node is a *source inode*, keyed by
//! (st_dev, st_ino), and holds an `O_PATH | O_NOFOLLOW` descriptor of it
//! (as libfuse's passthrough_ll does). Every operation acts on that
//! descriptor, or on a leaf name relative to the parent's descriptor:
//!
//! - no path is ever rebuilt, so a tree may be as deep as the source
//!   allows (no PATH_MAX beneath the mount);
//! - a rename anywhere (through the mount or behind it) needs no
//!   bookkeeping: the descriptor follows the inode;
//! - an unlinked but open file keeps working (fstat says nlink 0,
//!   ftruncate and I/O go on), as on the source;
//! - the descriptor holds a reference to the inode, so its number cannot
//!   be reused by a new file while the kernel still knows the node: the
//!   (dev, ino) key never names two files at once.
//!
//! Node ids are the source's inode numbers where they can be (the kernel
//! reports the node id as `st_ino`, so `ls -i`, `find -inum` and `cp -a`'s
//! hard-link detection see the source's numbers); inodes of other file
//! systems mounted inside the tree, and a source inode numbered 1 (the
//! kernel's root id), get ids from a counter above 2^63 instead.
//!
//! The table is bounded (`max_nodes`); near the bound it asks the kernel
//! to forget idle nodes (`crate::relief`), and past it a lookup fails with
//! ENFILE.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use l2arc::primary::Generation;

use crate::relief::{Relief, ReliefClock};

/// The root's node id (FUSE_ROOT_ID).
pub(crate) const ROOT_ID: u64 = 1;

/// Ids handed out by counter (inodes whose own number cannot be the id).
const SYNTHETIC_ID_BASE: u64 = 1 << 63;

/// The node id of source inode (dev, ino) when it is the inode's own
/// number (see the module comment); None when the id comes from the
/// counter. The root's own (dev, ino) is ROOT_ID, which the caller checks.
pub(crate) fn own_number_id(root_dev: u64, dev: u64, ino: u64) -> Option<u64> {
    (dev == root_dev && ino > ROOT_ID && ino < SYNTHETIC_ID_BASE).then_some(ino)
}

/// What kind of file an inode is (fixed for its life).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Directory,
    Regular,
    Symlink,
    /// FIFOs, sockets, device nodes: metadata only.
    Special,
}

impl Kind {
    pub(crate) fn of_mode(mode: u32) -> Self {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Directory,
            libc::S_IFREG => Kind::Regular,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Special,
        }
    }
}

/// One source inode the kernel holds.
pub(crate) struct Inode {
    pub id: u64,
    /// `O_PATH | O_NOFOLLOW` descriptor of the source inode.
    fd: OwnedFd,
    pub kind: Kind,
    dev: u64,
    ino: u64,
    /// Lookups the kernel holds (each entry reply is one; `forget` drops them).
    nlookup: Mutex<u64>,
    /// The lookup tick when the kernel last looked this node up (how
    /// recently it was used, for `InodeTable::relief`).
    last_lookup_tick: AtomicU64,
    /// The generation that the kernel's page cache of this file reflects
    /// (what we last let it keep); None until the file is first opened.
    pub page_generation: Mutex<Option<Generation>>,
    /// An open file of this inode, if any: revalidates the cache's records
    /// when a change is noticed by a getattr or lookup without a handle.
    pub open_file: Mutex<Weak<crate::namespace::dir::TreeFile>>,
    /// Bumped after every change the kernel's pages of this file must not
    /// outlive (a writer opened, a truncate, a change behind the mount): a
    /// store of whole records into those pages (`crate::namespace::dir`)
    /// taken at an older count is dropped.
    pub store_epoch: AtomicU64,
    /// Handles open for writing: none may be, for records to be stored.
    pub writers: std::sync::atomic::AtomicUsize,
    /// When the mount itself last changed the file, on the watcher's clock
    /// (0: never): its inotify events are then its own (`crate::watch`).
    pub own_change_ms: AtomicU64,
}

impl Inode {
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether an open file of this inode is live (its node cannot be
    /// forgotten while the kernel holds the file open).
    fn is_open(&self) -> bool {
        self.open_file.lock().expect("poisoned").strong_count() > 0
    }
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("dev", &self.dev)
            .field("ino", &self.ino)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub(crate) struct InodeTable {
    nodes: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<(u64, u64), u64>,
    root_dev: u64,
    next_synthetic: u64,
    max_nodes: usize,
    relief: ReliefClock,
}

impl InodeTable {
    /// A table holding the root, whose descriptor is `root_fd` (an `O_PATH`
    /// descriptor of the source root) with the given (dev, ino).
    pub(crate) fn new(root_fd: OwnedFd, root_dev: u64, root_ino: u64, max_nodes: usize) -> Self {
        assert!(max_nodes >= 2, "the table must hold the root and one more");
        let root = Arc::new(Inode {
            id: ROOT_ID,
            fd: root_fd,
            kind: Kind::Directory,
            dev: root_dev,
            ino: root_ino,
            nlookup: Mutex::new(1),
            last_lookup_tick: AtomicU64::new(0),
            page_generation: Mutex::new(None),
            open_file: Mutex::new(Weak::new()),
            store_epoch: AtomicU64::new(0),
            writers: std::sync::atomic::AtomicUsize::new(0),
            own_change_ms: AtomicU64::new(0),
        });
        Self {
            nodes: HashMap::from([(ROOT_ID, root)]),
            by_key: HashMap::from([((root_dev, root_ino), ROOT_ID)]),
            root_dev,
            next_synthetic: SYNTHETIC_ID_BASE,
            max_nodes,
            relief: ReliefClock::new(max_nodes),
        }
    }

    /// Up to a batch of idle nodes (no open file; never the root) whose
    /// entries the caller should ask the kernel to drop, when relief is due
    /// (`crate::relief`).
    pub(crate) fn relief(&mut self) -> Vec<Arc<Inode>> {
        let Some(Relief { batch, idle_since }) = self.relief.due(self.nodes.len()) else {
            return Vec::new();
        };
        let picked: Vec<Arc<Inode>> = self
            .nodes
            .values()
            .filter(|inode| {
                inode.id != ROOT_ID
                    && inode.last_lookup_tick.load(Ordering::Relaxed) <= idle_since
                    && !inode.is_open()
            })
            .take(batch)
            .cloned()
            .collect();
        debug_assert!(picked.len() <= batch);
        picked
    }

    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The inode of a node id the kernel holds.
    pub(crate) fn get(&self, id: u64) -> Option<Arc<Inode>> {
        self.nodes.get(&id).cloned()
    }

    /// The node of the inode (dev, ino) that `fd` pins, taking one lookup
    /// reference (an entry reply). A known inode keeps its descriptor and
    /// `fd` is dropped. None when the table is full.
    pub(crate) fn lookup(
        &mut self,
        fd: OwnedFd,
        dev: u64,
        ino: u64,
        mode: u32,
    ) -> Option<Arc<Inode>> {
        let tick = self.relief.tick();
        if let Some(&id) = self.by_key.get(&(dev, ino)) {
            let inode = Arc::clone(self.nodes.get(&id).expect("by_key names a live node"));
            *inode.nlookup.lock().expect("poisoned") += 1;
            inode.last_lookup_tick.store(tick, Ordering::Relaxed);
            return Some(inode);
        }
        if self.nodes.len() >= self.max_nodes {
            return None;
        }
        let id = if let Some(id) = own_number_id(self.root_dev, dev, ino) {
            id
        } else {
            self.next_synthetic += 1;
            self.next_synthetic
        };
        assert!(!self.nodes.contains_key(&id), "node id {id} in use twice");
        let inode = Arc::new(Inode {
            id,
            fd,
            kind: Kind::of_mode(mode),
            dev,
            ino,
            nlookup: Mutex::new(1),
            last_lookup_tick: AtomicU64::new(tick),
            page_generation: Mutex::new(None),
            open_file: Mutex::new(Weak::new()),
            store_epoch: AtomicU64::new(0),
            writers: std::sync::atomic::AtomicUsize::new(0),
            own_change_ms: AtomicU64::new(0),
        });
        self.nodes.insert(id, Arc::clone(&inode));
        self.by_key.insert((dev, ino), id);
        Some(inode)
    }

    /// The kernel dropped `count` references; the node goes at zero (its
    /// descriptor closes once no operation in flight holds it).
    pub(crate) fn forget(&mut self, id: u64, count: u64) {
        if id == ROOT_ID {
            return; // the root lives as long as the mount
        }
        let Some(inode) = self.nodes.get(&id) else {
            return;
        };
        let mut nlookup = inode.nlookup.lock().expect("poisoned");
        *nlookup = nlookup.saturating_sub(count);
        if *nlookup == 0 {
            let key = (inode.dev, inode.ino);
            drop(nlookup);
            self.nodes.remove(&id);
            let removed = self.by_key.remove(&key);
            assert_eq!(removed, Some(id), "by_key and nodes disagree on {key:?}");
        }
    }

    /// Checks that the two maps agree (tests; O(nodes)).
    pub(crate) fn assert_consistent(&self) {
        assert_eq!(self.nodes.len(), self.by_key.len());
        for (key, id) in &self.by_key {
            let inode = self.nodes.get(id).expect("by_key names a live node");
            assert_eq!((inode.dev, inode.ino), *key);
            assert_eq!(inode.id, *id);
        }
        assert!(self.nodes.len() <= self.max_nodes);
        assert!(self.nodes.contains_key(&ROOT_ID));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path_fd(path: &std::path::Path) -> (OwnedFd, u64, u64, u32) {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path).unwrap();
        let fd = crate::sys::open_path(path).unwrap();
        (fd, meta.dev(), meta.ino(), meta.mode())
    }

    #[test]
    fn one_node_per_inode_bounded_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"x").unwrap();
        std::fs::hard_link(dir.path().join("a"), dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("c"), b"y").unwrap();
        let (root, dev, ino, _) = path_fd(dir.path());
        let mut t = InodeTable::new(root, dev, ino, 2);

        let (fd, dev, ino, mode) = path_fd(&dir.path().join("a"));
        let a = t.lookup(fd, dev, ino, mode).unwrap();
        assert_eq!(a.id, ino, "the node id is the source's inode number");
        assert_eq!(a.kind, Kind::Regular);
        let (fd, dev, ino, mode) = path_fd(&dir.path().join("b"));
        let b = t.lookup(fd, dev, ino, mode).unwrap();
        assert_eq!(a.id, b.id, "hard links share a node");
        assert!(Arc::ptr_eq(&a, &b));
        let (fd, dev, ino, mode) = path_fd(&dir.path().join("c"));
        assert!(t.lookup(fd, dev, ino, mode).is_none(), "table full");
        t.assert_consistent();

        t.forget(a.id, 1);
        assert!(t.get(a.id).is_some(), "one reference left");
        t.forget(a.id, 1);
        assert!(t.get(a.id).is_none());
        t.forget(ROOT_ID, 100);
        assert!(t.get(ROOT_ID).is_some(), "the root is never forgotten");
        let (fd, dev, ino, mode) = path_fd(&dir.path().join("c"));
        assert!(t.lookup(fd, dev, ino, mode).is_some(), "room again");
        t.assert_consistent();
    }

    #[test]
    fn relief_picks_the_idle_nodes_never_the_root() {
        const MAX: usize = 64; // batch 4; relief from 56 nodes on (2 batches short)
        let dir = tempfile::tempdir().unwrap();
        for i in 0..MAX {
            std::fs::write(dir.path().join(format!("f{i}")), b"x").unwrap();
        }
        let (root, dev, ino, _) = path_fd(dir.path());
        let mut t = InodeTable::new(root, dev, ino, MAX);
        let look = |t: &mut InodeTable, i: usize| {
            let (fd, dev, ino, mode) = path_fd(&dir.path().join(format!("f{i}")));
            t.lookup(fd, dev, ino, mode)
        };
        let nodes: Vec<_> = (0..54).map(|i| look(&mut t, i).unwrap()).collect();
        assert!(t.relief().is_empty(), "55 nodes: not near the bound yet");
        // f0 is looked up again: recent, not picked.
        look(&mut t, 0).unwrap();
        for i in 54..MAX - 1 {
            look(&mut t, i).unwrap();
        }
        assert!(
            look(&mut t, MAX - 1).is_none(),
            "full: the root and 63 files"
        );
        let picked = t.relief();
        assert_eq!(picked.len(), 4, "one batch");
        for inode in &picked {
            assert_ne!(inode.id, ROOT_ID);
            assert_ne!(inode.id, nodes[0].id, "looked up again: recent");
            assert!(
                nodes[1..8].iter().any(|n| n.id == inode.id),
                "the oldest nodes go first: {inode:?}"
            );
        }
        assert!(t.relief().is_empty(), "no lookup since: nothing new");
        t.assert_consistent();
    }

    #[test]
    fn other_devices_and_inode_one_get_synthetic_ids() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"x").unwrap();
        let (root, dev, ino, _) = path_fd(dir.path());
        let mut t = InodeTable::new(root, dev, ino, 16);
        let (fd, _, ino_a, mode) = path_fd(&dir.path().join("a"));
        let other_dev = t.lookup(fd, dev + 1, ino_a, mode).unwrap();
        assert!(other_dev.id > SYNTHETIC_ID_BASE);
        let (fd, _, _, mode) = path_fd(&dir.path().join("a"));
        let one = t.lookup(fd, dev, 1, mode).unwrap();
        assert!(one.id > SYNTHETIC_ID_BASE && one.id != other_dev.id);
        t.assert_consistent();
    }
}
