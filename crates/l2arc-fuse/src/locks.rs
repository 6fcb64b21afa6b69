//! POSIX record locks (fcntl F_SETLK/F_GETLK) passed through to the source.
//!
//! A lock taken through the mount must conflict with locks that other
//! programs hold on the source itself, so the kernel's local lock
//! emulation is not enough: we take the lock on the source. The kernel
//! tells us the lock *owner* (one per process and file table), and POSIX
//! locks belong to owners, not descriptors: two descriptors of one owner
//! never conflict, and a close by the owner drops all its locks on the
//! file. Open-file-description locks (F_OFD_*) have exactly those
//! semantics per descriptor, so each (inode, owner) pair gets a descriptor
//! of its own and its locks are OFD locks on it. A close (FUSE flush,
//! which carries the owner) closes that descriptor, dropping its locks.
//!
//! A blocking request (F_SETLKW) waits on a thread of its own, so that
//! waiters never take all of the mount's request threads and block the
//! unlock they wait for; waiters are bounded (`WAITERS_MAX`, ENOLCK past
//! it), as are the descriptors (`max_owners`).
//!
//! Limits: deadlock detection (EDEADLK) is not done across owners, and a
//! waiter whose caller was interrupted by a signal still takes the lock
//! when it frees, until that owner's next close releases it.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fuser::Errno;

use crate::inodes::Inode;
use crate::sys;

/// Blocked lock requests waiting at once.
const WAITERS_MAX: usize = 64;

/// A lock request: its type (F_RDLCK, F_WRLCK, F_UNLCK) and byte range,
/// `end` inclusive (u64::MAX or OFFSET_MAX: to the end of the file).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LockRange {
    pub typ: i32,
    pub start: u64,
    pub end: u64,
}

/// A lock that conflicts with a test (F_GETLK).
pub(crate) struct Conflict {
    pub start: u64,
    pub end: u64,
    pub typ: i32,
    pub pid: u32,
}

pub(crate) struct LockTable {
    owners: Mutex<HashMap<(u64, u64), Arc<OwnedFd>>>,
    max_owners: usize,
    waiters: Arc<AtomicUsize>,
}

impl LockTable {
    pub(crate) fn new(max_owners: usize) -> Self {
        assert!(max_owners > 0);
        Self {
            owners: Mutex::new(HashMap::new()),
            max_owners,
            waiters: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The descriptor of `owner`'s locks on `inode`, opened on first use.
    fn owner_fd(&self, inode: &Inode, owner: u64) -> Result<Arc<OwnedFd>, Errno> {
        let mut owners = self.owners.lock().expect("lock table poisoned");
        if let Some(fd) = owners.get(&(inode.id, owner)) {
            return Ok(Arc::clone(fd));
        }
        if owners.len() >= self.max_owners {
            return Err(Errno::ENOLCK);
        }
        // Read and write locks need a descriptor open for reading and writing.
        let fd = sys::reopen(inode.fd(), libc::O_RDWR | libc::O_NONBLOCK)
            .or_else(|_| sys::reopen(inode.fd(), libc::O_RDONLY | libc::O_NONBLOCK))
            .map_err(|e| Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO)))?;
        let fd = Arc::new(fd);
        owners.insert((inode.id, owner), Arc::clone(&fd));
        Ok(fd)
    }

    /// F_GETLK: the first lock that would conflict with this one, if any.
    pub(crate) fn test(
        &self,
        inode: &Inode,
        owner: u64,
        lock: LockRange,
    ) -> Result<Option<Conflict>, Errno> {
        let fd = self.owner_fd(inode, owner)?;
        let fl = sys::ofd_lock(fd.as_raw_fd(), libc::F_OFD_GETLK, lock)
            .map_err(|e| Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO)))?;
        if i32::from(fl.l_type) == libc::F_UNLCK {
            return Ok(None);
        }
        let start = fl.l_start as u64;
        let end = if fl.l_len == 0 {
            i64::MAX as u64
        } else {
            start + fl.l_len as u64 - 1
        };
        Ok(Some(Conflict {
            start,
            end,
            typ: i32::from(fl.l_type),
            // OFD locks have no process (-1): report none.
            pid: u32::try_from(fl.l_pid).unwrap_or(0),
        }))
    }

    /// F_SETLK / F_SETLKW (`sleep`) / unlock (F_UNLCK). A blocking request
    /// that must wait replies from a waiter thread.
    pub(crate) fn set(
        &self,
        inode: &Inode,
        owner: u64,
        lock: LockRange,
        sleep: bool,
        reply: fuser::ReplyEmpty,
    ) {
        let fd = match self.owner_fd(inode, owner) {
            Ok(fd) => fd,
            Err(e) => return reply.error(e),
        };
        let to_errno = |e: std::io::Error| Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO));
        match sys::ofd_lock(fd.as_raw_fd(), libc::F_OFD_SETLK, lock) {
            Ok(_) => return reply.ok(),
            Err(e) if !sleep || lock.typ == libc::F_UNLCK => return reply.error(to_errno(e)),
            Err(e) if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {
                return reply.error(to_errno(e));
            }
            Err(_) => {}
        }
        if self.waiters.fetch_add(1, Ordering::AcqRel) >= WAITERS_MAX {
            self.waiters.fetch_sub(1, Ordering::AcqRel);
            return reply.error(Errno::ENOLCK);
        }
        let waiters = Arc::clone(&self.waiters);
        let spawned = std::thread::Builder::new()
            .name("l2arc-fuse-lockw".into())
            .spawn(move || {
                match sys::ofd_lock(fd.as_raw_fd(), libc::F_OFD_SETLKW, lock) {
                    Ok(_) => reply.ok(),
                    Err(e) => reply.error(to_errno(e)),
                }
                waiters.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            // The reply moved into the closure that never ran: the kernel
            // sees the request fail when fuser drops the unanswered reply.
            self.waiters.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A close by `owner`: its locks on `ino` go (the descriptor closes
    /// once no waiter holds it).
    pub(crate) fn release_owner(&self, ino: u64, owner: u64) {
        self.owners
            .lock()
            .expect("lock table poisoned")
            .remove(&(ino, owner));
    }
}
