//! Page-aligned byte buffers.
//!
//! O_DIRECT reads (image files, block devices and, later, cache devices) need
//! buffers whose address, length and file offset are multiples of the logical
//! block size. Every record buffer in the cache is therefore allocated with a
//! 4 KiB alignment once, filled in place by the primary read, and then shared
//! read-only by reference count: the bytes a reader gets are the bytes the
//! device wrote, with no copy in between.
//!
//! Recycling. On the hot path of a warm cache every flash read allocates a
//! record buffer and every ARC insert frees an evicted one, at up to 10^5 a
//! second per thread; a 4 KiB-aligned allocation from the system allocator
//! splits and coalesces chunks (`memalign`) and was a tenth of a read
//! queue's CPU time. So each thread keeps the small buffers it frees (at
//! most `RECYCLED_BYTES_MAX` per thread, capacities up to
//! `RECYCLED_CAPACITY_MAX`) and hands them out again, without locks; a
//! thread's list is freed when the thread ends. Buffers filled by a read
//! that overwrites all of them need not be zeroed either
//! ([`AlignedBuf::for_overwrite`]).
//!
//! Large buffers (records of 128 KiB and up, a shared-tier block's
//! compressed payload) are freed on one thread and made on another: the
//! ARC evicts on the thread that inserts, the feeder frees the copies it
//! wrote, a compressed payload dies where it was decompressed. Each one
//! is mapped on its own (glibc's `M_MMAP_THRESHOLD` is pinned so that
//! evicted records leave the process), so without reuse every 1 MiB
//! record cost a `mmap`, 256 page faults with their zeroing, and a
//! `munmap` with its TLB shootdown: measured on a node reading a shared
//! tier, a third of the machine's CPU. So large buffers freed by any thread go to one pool that any
//! thread takes from, by exact capacity (a process uses a handful:
//! its recordsizes, a block), at most `POOLED_BYTES_MAX` in all, which is
//! what the RSS formula allows for it; what does not fit is unmapped as
//! before, and [`release_pooled`] empties the pool when the ARC shrinks
//! to give memory back.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::cell::RefCell;
use std::ptr::NonNull;

use crate::lock_order::{RankedMutex, rank};

/// Alignment of every [`AlignedBuf`]: the largest logical block size in use.
pub(crate) const BUF_ALIGN_BYTES: usize = 4096;

/// A heap buffer whose start is aligned to [`BUF_ALIGN_BYTES`] and whose
/// capacity is a multiple of it. `len_bytes` is the valid length (at most the
/// capacity), so a short record at the end of an object keeps an aligned
/// allocation while exposing only its real bytes.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity_bytes: usize,
    len_bytes: usize,
    /// Came from this thread's recycled buffers (not yet zeroed).
    recycled: bool,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

/// Largest capacity a thread keeps for reuse.
pub(crate) const RECYCLED_CAPACITY_MAX: usize = 64 << 10;
/// Most bytes of freed buffers a thread keeps for reuse.
pub(crate) const RECYCLED_BYTES_MAX: usize = 512 << 10;
/// Size classes kept: 4, 8, 16, 32 and 64 KiB.
const RECYCLED_CLASSES: usize = 5;

/// Largest capacity the shared pool keeps: a record of the largest
/// recordsize (16 MiB) with its block's page.
pub(crate) const POOLED_CAPACITY_MAX: usize = (16 << 20) + BUF_ALIGN_BYTES;
/// Most bytes of freed large buffers the process keeps for reuse: two
/// feed batches. A feeder copies a batch's records in a burst and frees
/// them in a burst; with room for one batch (16 MiB) beside the readers'
/// churn, most of its copies missed the pool (nodes reading a shared
/// tier: 364-419 MiB/s at 16 MiB, 449 at 32, docs/notes/fleet.md).
/// (`l2arc/mod.rs` asserts it holds two of its batches.)
pub(crate) const POOLED_BYTES_MAX: usize = 32 << 20;
/// Most distinct capacities the pool keeps at once.
const POOLED_SIZES_MAX: usize = 8;

/// A freed buffer's address, owned by the pool.
struct FreeBuf(NonNull<u8>);

// SAFETY: the pool owns the allocation exclusively; any thread may free it.
unsafe impl Send for FreeBuf {}

/// Large buffers freed by any thread, by exact capacity (see the module
/// comment).
struct Pooled {
    sizes: Vec<(usize, Vec<FreeBuf>)>,
    bytes: usize,
}

static POOL: RankedMutex<Pooled, { rank::BUF_POOL }> = RankedMutex::new(Pooled {
    sizes: Vec::new(),
    bytes: 0,
});

impl Pooled {
    fn take(&mut self, capacity_bytes: usize) -> Option<NonNull<u8>> {
        let (_, list) = self.sizes.iter_mut().find(|(c, _)| *c == capacity_bytes)?;
        let FreeBuf(ptr) = list.pop()?;
        self.bytes -= capacity_bytes;
        Some(ptr)
    }

    /// Keeps `ptr` if the bounds allow; gives it back otherwise.
    fn keep(&mut self, ptr: NonNull<u8>, capacity_bytes: usize) -> Result<(), NonNull<u8>> {
        if self.bytes + capacity_bytes > POOLED_BYTES_MAX {
            return Err(ptr);
        }
        let at = match self.sizes.iter().position(|(c, _)| *c == capacity_bytes) {
            Some(at) => at,
            None => {
                // A size no longer freed gives its place to a new one.
                if self.sizes.len() == POOLED_SIZES_MAX {
                    let Some(empty) = self.sizes.iter().position(|(_, l)| l.is_empty()) else {
                        return Err(ptr);
                    };
                    self.sizes.swap_remove(empty);
                }
                self.sizes.push((capacity_bytes, Vec::new()));
                self.sizes.len() - 1
            }
        };
        self.sizes[at].1.push(FreeBuf(ptr));
        self.bytes += capacity_bytes;
        debug_assert!(self.bytes <= POOLED_BYTES_MAX && self.sizes.len() <= POOLED_SIZES_MAX);
        Ok(())
    }

    fn pooled(capacity_bytes: usize) -> bool {
        capacity_bytes > RECYCLED_CAPACITY_MAX && capacity_bytes <= POOLED_CAPACITY_MAX
    }
}

/// Frees every buffer in the large-buffer pool (after the ARC shrank, so
/// that what it let go leaves the process): the bytes freed.
pub(crate) fn release_pooled() -> usize {
    let freed: Vec<(usize, Vec<FreeBuf>)> = {
        let mut pool = POOL.lock().expect("buffer pool poisoned");
        pool.bytes = 0;
        std::mem::take(&mut pool.sizes)
    };
    let mut bytes = 0;
    for (capacity_bytes, list) in freed {
        let layout = Layout::from_size_align(capacity_bytes, BUF_ALIGN_BYTES)
            .expect("a pooled capacity is a valid layout");
        for FreeBuf(ptr) in list {
            // SAFETY: every pooled pointer was allocated with this layout.
            unsafe { dealloc(ptr.as_ptr(), layout) }
            bytes += capacity_bytes;
        }
    }
    bytes
}

/// Bytes of freed large buffers the pool holds now.
#[cfg(test)]
fn pooled_bytes() -> usize {
    POOL.lock().expect("buffer pool poisoned").bytes
}

/// One thread's freed buffers, by size class (see the module comment).
struct Recycled {
    classes: [Vec<NonNull<u8>>; RECYCLED_CLASSES],
    bytes: usize,
}

impl Recycled {
    /// The class of an exact power-of-two capacity it keeps, if any.
    fn class(capacity_bytes: usize) -> Option<usize> {
        (capacity_bytes.is_power_of_two() && capacity_bytes <= RECYCLED_CAPACITY_MAX)
            .then(|| (capacity_bytes / BUF_ALIGN_BYTES).trailing_zeros() as usize)
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        for (class, list) in self.classes.iter_mut().enumerate() {
            let layout = Layout::from_size_align(BUF_ALIGN_BYTES << class, BUF_ALIGN_BYTES)
                .expect("a class is a valid layout");
            for ptr in list.drain(..) {
                // SAFETY: every kept pointer was allocated with this layout.
                unsafe { dealloc(ptr.as_ptr(), layout) }
            }
        }
    }
}

thread_local! {
    static RECYCLED: RefCell<Recycled> = const {
        RefCell::new(Recycled {
            classes: [const { Vec::new() }; RECYCLED_CLASSES],
            bytes: 0,
        })
    };
}

impl AlignedBuf {
    /// A zeroed buffer of `len_bytes` valid bytes; the capacity is rounded up
    /// to the alignment (at least one block, so the pointer is never dangling).
    pub fn zeroed(len_bytes: usize) -> Self {
        let mut buf = Self::allocate(len_bytes);
        if buf.recycled {
            buf.as_mut_capacity().fill(0);
            buf.recycled = false;
        }
        buf
    }

    /// A buffer of `len_bytes` whose contents are unspecified (old bytes of
    /// a freed buffer, or zeros), for a read that overwrites all of them.
    pub fn for_overwrite(len_bytes: usize) -> Self {
        let mut buf = Self::allocate(len_bytes);
        buf.recycled = false;
        buf
    }

    /// A recycled buffer of this thread's (`recycled` set), or a new one.
    fn allocate(len_bytes: usize) -> Self {
        let capacity_bytes = len_bytes.max(1).next_multiple_of(BUF_ALIGN_BYTES);
        if let Some(class) = Recycled::class(capacity_bytes)
            && let Ok(Some(ptr)) = RECYCLED.try_with(|r| {
                let mut r = r.borrow_mut();
                let ptr = r.classes[class].pop();
                if ptr.is_some() {
                    r.bytes -= capacity_bytes;
                }
                ptr
            })
        {
            return Self {
                ptr,
                capacity_bytes,
                len_bytes,
                recycled: true,
            };
        }
        if Pooled::pooled(capacity_bytes)
            && let Some(ptr) = POOL
                .lock()
                .expect("buffer pool poisoned")
                .take(capacity_bytes)
        {
            return Self {
                ptr,
                capacity_bytes,
                len_bytes,
                recycled: true,
            };
        }
        let layout = Layout::from_size_align(capacity_bytes, BUF_ALIGN_BYTES)
            .expect("buffer size overflows a Layout");
        // SAFETY: layout has a nonzero size. (Zeroed: a buffer never
        // exposes memory that was never written.)
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self {
            ptr,
            capacity_bytes,
            len_bytes,
            recycled: false,
        }
    }

    /// A buffer holding a copy of `data` (and zeros past it).
    pub fn copy_from(data: &[u8]) -> Self {
        let mut buf = Self::allocate(data.len());
        let recycled = std::mem::replace(&mut buf.recycled, false);
        let capacity = buf.as_mut_capacity();
        capacity[..data.len()].copy_from_slice(data);
        if recycled {
            capacity[data.len()..].fill(0);
        }
        buf
    }

    /// Bytes in use.
    pub fn len(&self) -> usize {
        self.len_bytes
    }

    /// Whether no byte is in use.
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// Bytes allocated (a multiple of the alignment).
    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    /// Shrinks or grows the valid length within the capacity (after a short read).
    pub fn set_len(&mut self, len_bytes: usize) {
        assert!(
            len_bytes <= self.capacity_bytes,
            "length {len_bytes} exceeds capacity {}",
            self.capacity_bytes
        );
        self.len_bytes = len_bytes;
    }

    /// The bytes in use.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity_bytes >= len_bytes initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// The bytes in use, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// The whole aligned capacity, for O_DIRECT reads that must ask for whole blocks.
    pub fn as_mut_capacity(&mut self) -> &mut [u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity_bytes) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let capacity_bytes = self.capacity_bytes;
        if let Some(class) = Recycled::class(capacity_bytes) {
            let ptr = self.ptr;
            let kept = RECYCLED.try_with(|r| {
                let mut r = r.borrow_mut();
                if r.bytes + capacity_bytes > RECYCLED_BYTES_MAX {
                    return false;
                }
                r.bytes += capacity_bytes;
                r.classes[class].push(ptr);
                true
            });
            if kept == Ok(true) {
                return;
            }
        }
        if Pooled::pooled(capacity_bytes) {
            let kept = POOL
                .lock()
                .expect("buffer pool poisoned")
                .keep(self.ptr, capacity_bytes);
            if kept.is_ok() {
                return;
            }
        }
        let layout = Layout::from_size_align(self.capacity_bytes, BUF_ALIGN_BYTES)
            .expect("layout was valid at allocation");
        // SAFETY: allocated in `zeroed` with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len_bytes", &self.len_bytes)
            .field("capacity_bytes", &self.capacity_bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_rounded() {
        for len in [0usize, 1, 4095, 4096, 4097, 131072] {
            let buf = AlignedBuf::zeroed(len);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.capacity_bytes() % BUF_ALIGN_BYTES, 0);
            assert!(buf.capacity_bytes() >= len.max(1));
            assert_eq!(buf.as_slice().as_ptr() as usize % BUF_ALIGN_BYTES, 0);
            assert!(buf.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn freed_buffers_are_reused_by_their_thread_and_zeroed_when_asked() {
        let mut first = AlignedBuf::zeroed(8192);
        first.as_mut_slice().fill(0xab);
        let address = first.as_slice().as_ptr() as usize;
        drop(first);
        let again = AlignedBuf::for_overwrite(8192);
        assert_eq!(again.as_slice().as_ptr() as usize, address, "reused");
        drop(again);
        let zeroed = AlignedBuf::zeroed(8000);
        assert_eq!(zeroed.as_slice().as_ptr() as usize, address, "reused");
        assert!(zeroed.as_slice().iter().all(|&b| b == 0));
        // Another thread does not see this thread's buffers.
        let other = std::thread::spawn(move || {
            AlignedBuf::for_overwrite(8192).as_slice().as_ptr() as usize
        });
        assert_ne!(other.join().unwrap(), address);
        // The per-thread bound holds.
        let many: Vec<AlignedBuf> = (0..200).map(|_| AlignedBuf::zeroed(4096)).collect();
        drop(many);
        RECYCLED.with(|r| assert!(r.borrow().bytes <= RECYCLED_BYTES_MAX));
    }

    #[test]
    fn large_buffers_freed_by_one_thread_are_reused_by_another_within_the_bound() {
        // A capacity no other test uses (the pool is the process's).
        let len = (3 << 20) + 3 * BUF_ALIGN_BYTES;
        let address = std::thread::spawn(move || {
            let mut buf = AlignedBuf::zeroed(len);
            buf.as_mut_slice().fill(0xcd);
            buf.as_slice().as_ptr() as usize
            // freed here, on this thread
        })
        .join()
        .unwrap();
        let again = AlignedBuf::for_overwrite(len);
        assert_eq!(again.as_slice().as_ptr() as usize, address, "reused");
        drop(again);
        let mut zeroed = AlignedBuf::zeroed(len - 100);
        assert_eq!(zeroed.as_slice().as_ptr() as usize, address, "reused");
        assert!(zeroed.as_mut_capacity().iter().all(|&b| b == 0));
        zeroed.as_mut_capacity().fill(0xee);
        drop(zeroed);
        // A copy into a reused buffer: the bytes, then zeros to its end.
        let data = vec![7u8; len - 100];
        let mut copy = AlignedBuf::copy_from(&data);
        assert_eq!(copy.as_slice().as_ptr() as usize, address, "reused");
        assert_eq!(&copy[..], &data[..]);
        assert!(copy.as_mut_capacity()[data.len()..].iter().all(|&b| b == 0));
        drop(copy);
        // Past the bound, freed buffers leave the process.
        let many: Vec<AlignedBuf> = (0..(POOLED_BYTES_MAX / len) + 3)
            .map(|_| AlignedBuf::for_overwrite(len))
            .collect();
        drop(many);
        assert!(pooled_bytes() <= POOLED_BYTES_MAX);
        assert!(pooled_bytes() >= len, "kept up to the bound");
        release_pooled();
        assert_eq!(pooled_bytes(), 0);
        let fresh = AlignedBuf::zeroed(len);
        assert!(fresh.iter().all(|&b| b == 0));
    }

    #[test]
    fn copy_and_shrink() {
        let mut buf = AlignedBuf::copy_from(b"hello world");
        assert_eq!(&buf[..], b"hello world");
        buf.set_len(5);
        assert_eq!(&buf[..], b"hello");
    }
}
