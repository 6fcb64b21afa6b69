//! Open files and directory listings: one bounded table per mount.
//!
//! The kernel names an open file or directory by the number we answer its
//! open with. Both mounts keep their open files and their directory
//! listings in one table bounded by `max_open_handles` (EMFILE past it), so
//! a client that holds opens cannot grow the mount's memory without bound.
//! Numbers come from a counter and are never reused, so a handle the kernel
//! sends after its release can only miss (EBADF), never reach another open.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fuser::Errno;

/// An open file (`F`) or an open directory's listing (`D`).
pub(crate) enum Handle<F, D> {
    File(Arc<F>),
    Dir(Arc<D>),
}

pub(crate) struct HandleTable<F, D> {
    handles: Mutex<HashMap<u64, Handle<F, D>>>,
    next_fh: AtomicU64,
    max_open_handles: usize,
}

impl<F, D> HandleTable<F, D> {
    pub(crate) fn new(max_open_handles: usize) -> Self {
        assert!(max_open_handles > 0);
        Self {
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            max_open_handles,
        }
    }

    /// Registers an open; EMFILE when the table is full.
    pub(crate) fn add(&self, handle: Handle<F, D>) -> Result<u64, Errno> {
        let mut handles = self.handles.lock().expect("handle table poisoned");
        if handles.len() >= self.max_open_handles {
            return Err(Errno::EMFILE);
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let old = handles.insert(fh, handle);
        assert!(old.is_none(), "file handles are never reused");
        Ok(fh)
    }

    /// The open file `fh` names; EBADF for anything else.
    pub(crate) fn file(&self, fh: u64) -> Result<Arc<F>, Errno> {
        match self.handles.lock().expect("handle table poisoned").get(&fh) {
            Some(Handle::File(f)) => Ok(Arc::clone(f)),
            _ => Err(Errno::EBADF),
        }
    }

    /// The listing `fh` names; EBADF for anything else.
    pub(crate) fn dir(&self, fh: u64) -> Result<Arc<D>, Errno> {
        match self.handles.lock().expect("handle table poisoned").get(&fh) {
            Some(Handle::Dir(d)) => Ok(Arc::clone(d)),
            _ => Err(Errno::EBADF),
        }
    }

    /// Forgets `fh` (a release); what it held goes with its last user.
    pub(crate) fn remove(&self, fh: u64) {
        self.handles
            .lock()
            .expect("handle table poisoned")
            .remove(&fh);
    }

    pub(crate) fn len(&self) -> usize {
        self.handles.lock().expect("handle table poisoned").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_never_reused_and_typed() {
        let t: HandleTable<&str, u32> = HandleTable::new(2);
        let f = t.add(Handle::File(Arc::new("f"))).unwrap();
        let d = t.add(Handle::Dir(Arc::new(7))).unwrap();
        assert_eq!(t.add(Handle::Dir(Arc::new(8))).unwrap_err(), Errno::EMFILE);
        assert_eq!(*t.file(f).unwrap(), "f");
        assert_eq!(*t.dir(d).unwrap(), 7);
        assert_eq!(
            t.file(d).unwrap_err(),
            Errno::EBADF,
            "a listing is not a file"
        );
        assert_eq!(t.dir(f).unwrap_err(), Errno::EBADF);
        t.remove(f);
        assert_eq!(t.file(f).unwrap_err(), Errno::EBADF, "released");
        let again = t.add(Handle::File(Arc::new("g"))).unwrap();
        assert!(again != f && again != d, "numbers are never reused");
        assert_eq!(t.len(), 2);
    }
}
