//! The inode table: FUSE node ids to paths beneath the source root.
//!
//! The kernel names files by node id; the source names them by path. We
//! keep the mapping one way only that survives changes made behind the
//! mount: a node is a *path*, not a source inode. When a file is replaced
//! behind our back (a new inode under the same name) the node still names
//! the same path and simply reaches the new file, whose new generation the
//! cache then notices; a table keyed by source inode would hand out stale
//! ids instead. Renames made through the mount move the paths of the node
//! and everything below it; nodes whose name was unlinked or overwritten
//! are detached (no path: every operation on them is ENOENT) and freed when
//! the kernel forgets them.
//!
//! Node ids are never reused (a 64-bit counter), so the FUSE generation is
//! always 0. The table is bounded: past `max_nodes` a lookup fails with
//! ENFILE rather than growing without limit; the kernel forgets nodes
//! under memory pressure, so a full table drains.

use std::collections::HashMap;

/// The root's node id (FUSE_ROOT_ID).
pub const ROOT_ID: u64 = 1;

#[derive(Debug)]
struct Node {
    /// Relative path ("" = the root); None once unlinked or overwritten.
    path: Option<String>,
    /// Lookups the kernel holds (each entry reply is one; `forget` drops them).
    nlookup: u64,
}

#[derive(Debug)]
pub struct InodeTable {
    nodes: HashMap<u64, Node>,
    by_path: HashMap<String, u64>,
    next_id: u64,
    max_nodes: usize,
}

/// Joins a directory path and a leaf name.
pub fn child_path(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

/// Splits a path into its parent directory and leaf ("" for the root's children).
pub fn split_path(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

impl InodeTable {
    pub fn new(max_nodes: usize) -> Self {
        assert!(max_nodes >= 2, "the table must hold the root and one more");
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT_ID,
            Node {
                path: Some(String::new()),
                nlookup: 1,
            },
        );
        let mut by_path = HashMap::new();
        by_path.insert(String::new(), ROOT_ID);
        Self {
            nodes,
            by_path,
            next_id: ROOT_ID + 1,
            max_nodes,
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The path of a node, None if unknown or detached.
    pub fn path(&self, id: u64) -> Option<String> {
        self.nodes.get(&id).and_then(|n| n.path.clone())
    }

    /// The node of a path, taking one lookup reference (an entry reply).
    /// None when the table is full.
    pub fn lookup(&mut self, path: &str) -> Option<u64> {
        if let Some(&id) = self.by_path.get(path) {
            let node = self.nodes.get_mut(&id).expect("by_path names a live node");
            node.nlookup += 1;
            return Some(id);
        }
        if self.nodes.len() >= self.max_nodes {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.nodes.insert(
            id,
            Node {
                path: Some(path.to_string()),
                nlookup: 1,
            },
        );
        self.by_path.insert(path.to_string(), id);
        Some(id)
    }

    /// The kernel dropped `count` references; the node goes at zero.
    pub fn forget(&mut self, id: u64, count: u64) {
        if id == ROOT_ID {
            return; // the root lives as long as the mount
        }
        let Some(node) = self.nodes.get_mut(&id) else {
            return;
        };
        node.nlookup = node.nlookup.saturating_sub(count);
        if node.nlookup == 0 {
            let node = self.nodes.remove(&id).expect("present");
            if let Some(path) = node.path {
                let removed = self.by_path.remove(&path);
                assert_eq!(removed, Some(id), "by_path and nodes disagree on {path:?}");
            }
        }
    }

    /// `path` no longer names anything (unlink, rmdir): detach its node.
    pub fn detach(&mut self, path: &str) {
        if let Some(id) = self.by_path.remove(path) {
            self.nodes.get_mut(&id).expect("live node").path = None;
        }
    }

    /// A rename through the mount: `from` (and everything below it) is now
    /// `to`; whatever `to` named before is gone.
    pub fn rename(&mut self, from: &str, to: &str) {
        assert!(
            !from.is_empty() && !to.is_empty(),
            "the root is never renamed"
        );
        self.detach_tree(to);
        let prefix = format!("{from}/");
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.as_str() == from || p.starts_with(&prefix))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        for (old, id) in moved {
            self.by_path.remove(&old);
            let new = format!("{to}{}", &old[from.len()..]);
            self.nodes.get_mut(&id).expect("live node").path = Some(new.clone());
            self.by_path.insert(new, id);
        }
    }

    /// Both names swapped places (RENAME_EXCHANGE).
    pub fn exchange(&mut self, a: &str, b: &str) {
        let tmp = format!("{a}\0exchange");
        self.rename(a, &tmp);
        self.rename(b, a);
        self.rename(&tmp, b);
    }

    fn detach_tree(&mut self, path: &str) {
        let prefix = format!("{path}/");
        let gone: Vec<String> = self
            .by_path
            .keys()
            .filter(|p| p.as_str() == path || p.starts_with(&prefix))
            .cloned()
            .collect();
        for p in gone {
            self.detach(&p);
        }
    }

    /// Checks that the two maps agree (tests; O(nodes)).
    pub fn assert_consistent(&self) {
        for (path, id) in &self.by_path {
            let node = self.nodes.get(id).expect("by_path names a live node");
            assert_eq!(node.path.as_deref(), Some(path.as_str()));
        }
        let attached = self.nodes.values().filter(|n| n.path.is_some()).count();
        assert_eq!(attached, self.by_path.len());
        assert!(self.nodes.len() <= self.max_nodes);
        assert!(self.nodes.contains_key(&ROOT_ID));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_forget_and_bound() {
        let mut t = InodeTable::new(3);
        let a = t.lookup("a").unwrap();
        assert_eq!(t.lookup("a"), Some(a));
        let b = t.lookup("a/b").unwrap();
        assert_ne!(a, b);
        assert_eq!(t.lookup("c"), None, "table full");
        t.forget(b, 1);
        let c = t.lookup("c").unwrap();
        assert!(c > b, "ids are never reused");
        t.forget(a, 1);
        assert_eq!(t.path(a).as_deref(), Some("a"), "one reference left");
        t.forget(a, 1);
        assert_eq!(t.path(a), None);
        t.forget(ROOT_ID, 100);
        assert_eq!(t.path(ROOT_ID).as_deref(), Some(""));
        t.assert_consistent();
    }

    #[test]
    fn rename_moves_subtree_and_detaches_target() {
        let mut t = InodeTable::new(100);
        let d = t.lookup("d").unwrap();
        let f = t.lookup("d/f").unwrap();
        let dd = t.lookup("dd/x").unwrap();
        let target = t.lookup("e").unwrap();
        let below = t.lookup("e/old").unwrap();
        t.rename("d", "e");
        assert_eq!(t.path(d).as_deref(), Some("e"));
        assert_eq!(t.path(f).as_deref(), Some("e/f"));
        assert_eq!(
            t.path(dd).as_deref(),
            Some("dd/x"),
            "prefix is per component"
        );
        assert_eq!(t.path(target), None);
        assert_eq!(t.path(below), None);
        t.assert_consistent();
        t.exchange("e/f", "dd/x");
        assert_eq!(t.path(f).as_deref(), Some("dd/x"));
        assert_eq!(t.path(dd).as_deref(), Some("e/f"));
        t.detach("dd/x");
        assert_eq!(t.path(f), None);
        t.forget(f, 1);
        t.assert_consistent();
        assert_eq!(split_path("a/b/c"), ("a/b", "c"));
        assert_eq!(split_path("c"), ("", "c"));
        assert_eq!(child_path("", "c"), "c");
        assert_eq!(child_path("a", "c"), "a/c");
    }
}
