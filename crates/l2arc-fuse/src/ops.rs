//! Counters of the FUSE requests the kernel sent, by operation, for
//! `/metrics` (`l2arc_fuse_requests_total{op=...}`): which calls a
//! workload makes (lookups and getattrs dwarf reads in a build tree, a
//! media server only reads) decides what the cache can do for it. One
//! relaxed atomic add per request; the counters are the process's (one
//! mount per service; mounts in one process add up).

use std::sync::atomic::{AtomicU64, Ordering};

/// The operations counted, by their FUSE names.
pub const OPERATIONS: [&str; 33] = [
    "lookup",
    "forget",
    "getattr",
    "open",
    "read",
    "release",
    "opendir",
    "readdir",
    "releasedir",
    "statfs",
    "access",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "create",
    "write",
    "flush",
    "fsync",
    "fsyncdir",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "getlk",
    "setlk",
    "fallocate",
    "lseek",
];

static COUNTS: [AtomicU64; OPERATIONS.len()] = [const { AtomicU64::new(0) }; OPERATIONS.len()];

/// Counts one request of `operation` (one of [`OPERATIONS`]).
pub(crate) fn count(operation: &str) {
    let index = OPERATIONS.iter().position(|o| *o == operation);
    debug_assert!(index.is_some(), "uncounted FUSE operation {operation}");
    if let Some(i) = index {
        COUNTS[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Requests so far, by operation, in the order of [`OPERATIONS`].
pub fn requests() -> [(&'static str, u64); OPERATIONS.len()] {
    std::array::from_fn(|i| (OPERATIONS[i], COUNTS[i].load(Ordering::Relaxed)))
}
