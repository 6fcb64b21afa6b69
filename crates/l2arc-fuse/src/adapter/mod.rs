//! The one FUSE file system: a skeleton over a namespace.
//!
//! Both mounts answer the kernel the same way: an open becomes a number in
//! one bounded table of open files and listings (`crate::handles`), a read
//! finds its open file, revalidates it at most once an attribute timeout,
//! reads through the cache and answers, a listing is read whole at opendir
//! and served from that snapshot, and a release or releasedir forgets the
//! number. That is written here once; what the storage decides (names,
//! attributes, what an open is, how wide a read is and when to read ahead)
//! is asked of the namespace (`crate::namespace`). The FUSE callbacks are
//! in `filesystem.rs`; the answers of a namespace that cannot be changed,
//! in `read_only.rs`.
//!
//! The read is the path that matters: it runs once per request that misses
//! the kernel's pages. Its order is fixed here, for both namespaces: the
//! handle, the revalidation, the namespace's plan (its read-ahead claims,
//! its widening to a whole record), the read, the namespace's look at what
//! is served, the answer, and only then what may wait on the kernel (it may
//! hold pages locked until it has the answer).

use std::sync::Arc;
use std::time::Duration;

use fuser::{Errno, FileHandle, ReplyData};

use crate::handles::HandleTable;
use crate::namespace::{Namespace, OpenFile};

mod filesystem;
mod read_only;

/// The open files and listings of a mount over namespace `N`.
type Files<N> = HandleTable<OpenFile<<N as Namespace>::FileState>, <N as Namespace>::Listing>;

/// A FUSE file system serving namespace `N` through the cache.
pub(crate) struct FuseAdapter<N: Namespace> {
    namespace: N,
    files: Files<N>,
    /// The kernel's `max_background` asked for at init (`crate::mount`).
    pub(crate) max_background: u16,
}

impl<N: Namespace> FuseAdapter<N> {
    pub(crate) fn new(namespace: N) -> Self {
        let files = HandleTable::new(namespace.serving().max_open_handles);
        Self {
            namespace,
            files,
            max_background: crate::MAX_BACKGROUND_MIN,
        }
    }

    pub(crate) fn namespace(&self) -> &N {
        &self.namespace
    }

    /// Open files and directories now.
    pub(crate) fn open_handles(&self) -> usize {
        self.files.len()
    }

    fn ttl(&self) -> Duration {
        self.namespace.serving().attr_timeout
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<OpenFile<N::FileState>>, Errno> {
        self.files.file(fh.0)
    }

    /// The open file `fh` names, if it does (the kernel may name one it
    /// has released).
    fn file_if_open(&self, fh: Option<FileHandle>) -> Option<Arc<OpenFile<N::FileState>>> {
        fh.and_then(|fh| self.file(fh).ok())
    }

    /// Reads `size` bytes at `offset` through open file `fh` and answers
    /// (see the module comment for the order).
    fn read_file(&self, fh: FileHandle, offset: u64, size: u32, reply: ReplyData) {
        let namespace = &self.namespace;
        let serving = namespace.serving();
        let cache = &serving.cache;
        let timer = cache.analytics().start();
        let file = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        if let Err(e) = file.revalidate_if_due(cache, serving.attr_timeout) {
            return reply.error((serving.errno)(&e));
        }
        let plan = namespace.plan_read(&file, offset, size);
        assert!(plan.read_at <= offset, "a read plan starts after its read");
        let view = match cache.read_view_continuing(
            &file.handle,
            plan.read_at,
            plan.read_len,
            plan.continues,
        ) {
            Ok(v) => v,
            Err(e) => return reply.error((serving.errno)(&e)),
        };
        // What the request asked for, within what was read.
        let skip_bytes = (offset - plan.read_at) as usize;
        let served_bytes = view.len().saturating_sub(skip_bytes).min(size as usize);
        namespace.read_served(&file, offset, served_bytes);
        match view.as_single_slice() {
            Some(bytes) => reply.data(&bytes[skip_bytes.min(bytes.len())..][..served_bytes]),
            None => {
                let mut buf = vec![0u8; view.len()];
                view.copy_to(&mut buf);
                reply.data(&buf[skip_bytes.min(buf.len())..][..served_bytes]);
            }
        }
        namespace.after_read(&file, plan.after, plan.read_at, view);
        cache.analytics().frontend.finish(timer);
    }
}
