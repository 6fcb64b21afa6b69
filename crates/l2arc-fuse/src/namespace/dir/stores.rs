//! Whole records into the kernel's page cache.
//!
//! A random 4 KiB read that misses the kernel's pages costs a FUSE round
//! trip and fills one page, so a random reader warms the page cache one
//! page per miss (the seed workload took 2.9x a pass over the disks to
//! reach the page cache's rate). After answering such a read, the record
//! under it is handed to the kernel whole (`notify_store`), from the
//! notification thread, so each record read fills all its pages. A store
//! is the one write into the kernel's pages that no request orders, so it
//! is fenced:
//!
//! - it is taken only while no handle of the file is open for writing
//!   (`Inode::writers`): a buffered write holds its pages locked while it
//!   waits for our answer, so a store must never be in flight then;
//! - every change the pages must not outlive (an open for writing, a
//!   truncate, a change seen behind the mount, an open without
//!   KEEP_CACHE) bumps the inode's `store_epoch` after the change and then
//!   waits, before its answer, for the notification thread to pass a
//!   barrier (`DirTree::fence_stores`): a store taken before the change
//!   has then landed before the kernel hears of it, and a store taken at
//!   the old epoch is dropped;
//! - the waits are bounded; a store that lands after its epoch moved
//!   anyway is followed at once by an invalidation of its range.
//!
//! Stores wait in the notification thread's queue, bounded in jobs and in
//! bytes (`StoreBudget`) so that they never crowd invalidations out of it
//! nor hold much DRAM.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use fuser::INodeNo;

use super::coherence::INVALIDATE_QUEUE_LEN;
use super::{DirTree, TreeFile};
use crate::inodes::Inode;

/// Largest record stored whole into the kernel's pages on a small read.
const STORE_RECORD_BYTES_MAX: u64 = 128 << 10;
/// Most record bytes held by stores waiting for the notification thread.
const STORE_BYTES_MAX: usize = 32 << 20;
/// Most stores waiting (a quarter of the queue: invalidations keep room).
const STORE_JOBS_MAX: usize = INVALIDATE_QUEUE_LEN / 4;

/// A record to store into the kernel's pages of `inode` at `offset_bytes`,
/// if its store epoch is still `epoch` and no writer is open.
pub(super) struct StoreJob {
    pub(super) inode: Arc<Inode>,
    pub(super) epoch: u64,
    pub(super) offset_bytes: u64,
    pub(super) view: l2arc::ReadView,
    /// Released from `StoreBudget` when the job is done or dropped.
    pub(super) budget: Arc<StoreBudget>,
}

impl Drop for StoreJob {
    fn drop(&mut self) {
        self.budget.release(self.view.len());
    }
}

/// Bounds the record bytes (and jobs) held by queued stores, so that they
/// never crowd invalidations out of the queue nor hold much DRAM.
#[derive(Default)]
pub(super) struct StoreBudget {
    bytes: AtomicUsize,
    jobs: AtomicUsize,
}

impl StoreBudget {
    pub(super) fn try_take(&self, bytes: usize) -> bool {
        if self.jobs.fetch_add(1, Ordering::SeqCst) >= STORE_JOBS_MAX {
            self.jobs.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        if self.bytes.fetch_add(bytes, Ordering::SeqCst) + bytes > STORE_BYTES_MAX {
            self.release(bytes);
            return false;
        }
        true
    }

    fn release(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::SeqCst);
        self.jobs.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Stores `job`'s record into the kernel's pages unless a writer is open
/// or its epoch moved; invalidates the range again if the epoch moved
/// while it was being stored.
pub(super) fn store_record(notifier: &fuser::Notifier, job: &StoreJob) {
    let inode = &job.inode;
    let current = || {
        inode.writers.load(Ordering::SeqCst) == 0
            && inode.store_epoch.load(Ordering::SeqCst) == job.epoch
    };
    if !current() {
        return;
    }
    let mut at = job.offset_bytes;
    for slice in job.view.slices() {
        // ENOENT: the kernel forgot the inode; nothing to fill.
        if notifier.store(INodeNo(inode.id), at, slice).is_err() {
            break;
        }
        at += slice.len() as u64;
    }
    if !current() {
        let _ = notifier.inval_inode(
            INodeNo(inode.id),
            job.offset_bytes as i64,
            job.view.len() as i64,
        );
    }
}

impl DirTree {
    /// The record to read whole and store into the kernel's pages for a
    /// read of `size` at `offset` (see the module comment): a small read
    /// inside one record of at most `STORE_RECORD_BYTES_MAX`, of a file
    /// with no writer open. Larger records are read in sectors from flash,
    /// and reading them whole for one page would cost more than it saves.
    pub(super) fn record_to_store(
        &self,
        file: &TreeFile,
        offset: u64,
        size: u32,
    ) -> Option<(u64, usize)> {
        let record_bytes = u64::from(file.handle.recordsize_bytes());
        let file_bytes = file.handle.size_bytes();
        if !self.options.store_whole_records
            || record_bytes > STORE_RECORD_BYTES_MAX
            || u64::from(size) >= record_bytes
            || offset >= file_bytes
            || file.state.inode.writers.load(Ordering::SeqCst) != 0
            || self.serving.notifier.get().is_none()
        {
            return None;
        }
        let start = offset / record_bytes * record_bytes;
        if offset + u64::from(size) > start + record_bytes {
            return None; // crosses into the next record
        }
        Some((start, (file_bytes - start).min(record_bytes) as usize))
    }
}
