//! Counters of the FUSE requests the kernel sent, by operation, for
//! `/metrics` (`l2arc_fuse_requests_total{op=...}`): which calls a
//! workload makes (lookups and getattrs dwarf reads in a build tree, a
//! media server only reads) decides what the cache can do for it. One
//! relaxed atomic add per request; the counters are the process's (one
//! mount per service; mounts in one process add up).

use std::sync::atomic::{AtomicU64, Ordering};

/// `Op` and `OPERATIONS` from one list, so a variant's index is its name's.
macro_rules! operations {
    ($($variant:ident => $name:literal,)*) => {
        /// An operation counted: its index in [`OPERATIONS`].
        #[derive(Clone, Copy, Debug)]
        pub(crate) enum Op {
            $(
                #[doc = $name]
                $variant,
            )*
        }

        /// The operations counted, by their FUSE names.
        pub const OPERATIONS: [&str; [$($name),*].len()] = [$($name),*];
    };
}

operations! {
    Lookup => "lookup",
    Forget => "forget",
    Getattr => "getattr",
    Open => "open",
    Read => "read",
    Release => "release",
    Opendir => "opendir",
    Readdir => "readdir",
    Releasedir => "releasedir",
    Statfs => "statfs",
    Access => "access",
    Setattr => "setattr",
    Readlink => "readlink",
    Mknod => "mknod",
    Mkdir => "mkdir",
    Unlink => "unlink",
    Rmdir => "rmdir",
    Symlink => "symlink",
    Rename => "rename",
    Link => "link",
    Create => "create",
    Write => "write",
    Flush => "flush",
    Fsync => "fsync",
    Fsyncdir => "fsyncdir",
    Setxattr => "setxattr",
    Getxattr => "getxattr",
    Listxattr => "listxattr",
    Removexattr => "removexattr",
    Getlk => "getlk",
    Setlk => "setlk",
    Fallocate => "fallocate",
    Lseek => "lseek",
}

static COUNTS: [AtomicU64; OPERATIONS.len()] = [const { AtomicU64::new(0) }; OPERATIONS.len()];

/// Counts one request of `operation`: one relaxed add, no lookup.
pub(crate) fn count(operation: Op) {
    COUNTS[operation as usize].fetch_add(1, Ordering::Relaxed);
}

/// Requests so far, by operation, in the order of [`OPERATIONS`].
pub fn requests() -> [(&'static str, u64); OPERATIONS.len()] {
    std::array::from_fn(|i| (OPERATIONS[i], COUNTS[i].load(Ordering::Relaxed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_counts_under_its_own_name() {
        let before = requests();
        count(Op::Read);
        count(Op::Lseek);
        let after = requests();
        for (i, ((name, b), (_, a))) in before.iter().zip(after.iter()).enumerate() {
            let want = u64::from(*name == "read" || *name == "lseek");
            // Other tests' mounts may count too: at least ours.
            assert!(a - b >= want, "{name} (index {i}): {b} -> {a}");
        }
        assert_eq!(OPERATIONS[Op::Read as usize], "read");
        assert_eq!(OPERATIONS[Op::Lseek as usize], "lseek");
    }
}
