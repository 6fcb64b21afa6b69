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
//! tier, a third of the machine's CPU. So large buffers freed by any
//! thread go to one pool that any thread takes from, by capacity (a
//! process uses a handful: its recordsizes, a record read with its sector
//! table, a feed batch), at most `POOLED_BYTES_MAX` in all, which is what
//! the RSS formula allows for it; what does not fit is unmapped as
//! before, and [`release_pooled`] empties the pool when the ARC shrinks
//! to give memory back. A request takes its own capacity or one slightly
//! larger (`pooled_slack_bytes`), and a full pool makes room for a size
//! that is asked for by letting go of sizes asked for less recently: kept
//! by exact size alone, the pool of a node reading a shared tier filled
//! with records read back from flash (one block larger) and a feeder's
//! outgrown batch buffers, and 35-57% of its 1 MiB requests missed.

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

/// One capacity the pool keeps: its free buffers, and when it was last
/// asked for.
struct PooledSize {
    capacity_bytes: usize,
    free: Vec<FreeBuf>,
    /// The pool's clock at the last request this size could serve.
    wanted_at: u64,
}

/// Large buffers freed by any thread, by capacity (see the module
/// comment).
struct Pooled {
    sizes: Vec<PooledSize>,
    bytes: usize,
    /// Counts requests: the order in which sizes were wanted.
    clock: u64,
}

static POOL: RankedMutex<Pooled, { rank::BUF_POOL }> = RankedMutex::new(Pooled {
    sizes: Vec::new(),
    bytes: 0,
    clock: 0,
});

/// How much larger than asked a pooled buffer may be: a record read with
/// its sector table (one block more) or a batch rounded up serves a plain
/// record of the same size, at most 1/64 more memory (charged to the ARC,
/// which counts capacity).
fn pooled_slack_bytes(capacity_bytes: usize) -> usize {
    let slack = (capacity_bytes / 64).max(2 * BUF_ALIGN_BYTES);
    debug_assert!(slack >= 2 * BUF_ALIGN_BYTES && slack <= capacity_bytes.max(2 * BUF_ALIGN_BYTES));
    slack
}

impl Pooled {
    /// A free buffer of `capacity_bytes`, or the smallest up to its slack
    /// larger: its address and capacity. Marks the size as wanted either
    /// way, so that its freed buffers are kept before those of sizes no
    /// one asks for.
    fn take(&mut self, capacity_bytes: usize) -> Option<(NonNull<u8>, usize)> {
        self.clock += 1;
        let clock = self.clock;
        match self
            .sizes
            .iter_mut()
            .find(|s| s.capacity_bytes == capacity_bytes)
        {
            Some(size) => size.wanted_at = clock,
            None => self.note_new_size(capacity_bytes, clock),
        }
        let most = capacity_bytes + pooled_slack_bytes(capacity_bytes);
        let size = self
            .sizes
            .iter_mut()
            .filter(|s| (capacity_bytes..=most).contains(&s.capacity_bytes) && !s.free.is_empty())
            .min_by_key(|s| s.capacity_bytes)?;
        size.wanted_at = clock;
        let FreeBuf(ptr) = size.free.pop().expect("a size with free buffers");
        let taken_bytes = size.capacity_bytes;
        self.bytes -= taken_bytes;
        debug_assert!(taken_bytes >= capacity_bytes && taken_bytes <= most);
        Some((ptr, taken_bytes))
    }

    /// Remembers that a size with no entry yet was asked for, so that its
    /// first freed buffers may make room for themselves: in a free slot,
    /// or in place of the empty size asked for least recently.
    fn note_new_size(&mut self, capacity_bytes: usize, clock: u64) {
        let size = PooledSize {
            capacity_bytes,
            free: Vec::new(),
            wanted_at: clock,
        };
        if self.sizes.len() < POOLED_SIZES_MAX {
            self.sizes.push(size);
        } else if let Some(oldest) = self
            .sizes
            .iter_mut()
            .filter(|s| s.free.is_empty())
            .min_by_key(|s| s.wanted_at)
        {
            *oldest = size;
        }
        debug_assert!(self.sizes.len() <= POOLED_SIZES_MAX);
    }

    /// Keeps `ptr` if the bounds allow, making room by letting go of the
    /// buffers of sizes wanted less recently than its own (a feeder's
    /// outgrown batch buffer, a size no one reads any more): those go into
    /// `evicted` for the caller to free outside the lock. Gives `ptr` back
    /// if it does not fit.
    fn keep(
        &mut self,
        ptr: NonNull<u8>,
        capacity_bytes: usize,
        evicted: &mut Vec<(NonNull<u8>, usize)>,
    ) -> Result<(), NonNull<u8>> {
        if capacity_bytes > POOLED_BYTES_MAX {
            return Err(ptr);
        }
        let wanted_at = self
            .sizes
            .iter()
            .find(|s| s.capacity_bytes == capacity_bytes)
            .map_or(0, |s| s.wanted_at);
        while self.bytes + capacity_bytes > POOLED_BYTES_MAX {
            let Some(victim) = self
                .sizes
                .iter_mut()
                .filter(|s| {
                    s.capacity_bytes != capacity_bytes
                        && s.wanted_at < wanted_at
                        && !s.free.is_empty()
                })
                .min_by_key(|s| s.wanted_at)
            else {
                return Err(ptr);
            };
            let FreeBuf(old) = victim.free.pop().expect("a size with free buffers");
            self.bytes -= victim.capacity_bytes;
            evicted.push((old, victim.capacity_bytes));
        }
        let at = match self
            .sizes
            .iter()
            .position(|s| s.capacity_bytes == capacity_bytes)
        {
            Some(at) => at,
            None => {
                // A size no longer freed gives its place to a new one.
                if self.sizes.len() == POOLED_SIZES_MAX {
                    let Some(empty) = self.sizes.iter().position(|s| s.free.is_empty()) else {
                        return Err(ptr);
                    };
                    self.sizes.swap_remove(empty);
                }
                self.sizes.push(PooledSize {
                    capacity_bytes,
                    free: Vec::new(),
                    wanted_at,
                });
                self.sizes.len() - 1
            }
        };
        self.sizes[at].free.push(FreeBuf(ptr));
        self.bytes += capacity_bytes;
        debug_assert!(self.bytes <= POOLED_BYTES_MAX && self.sizes.len() <= POOLED_SIZES_MAX);
        Ok(())
    }

    fn pooled(capacity_bytes: usize) -> bool {
        capacity_bytes > RECYCLED_CAPACITY_MAX && capacity_bytes <= POOLED_CAPACITY_MAX
    }
}

/// Gives a buffer of `capacity_bytes` back to the system allocator.
fn free_pooled(ptr: NonNull<u8>, capacity_bytes: usize) {
    let layout = Layout::from_size_align(capacity_bytes, BUF_ALIGN_BYTES)
        .expect("layout was valid at allocation");
    // SAFETY: every buffer was allocated (`allocate`) with this layout:
    // its capacity and the alignment.
    unsafe { dealloc(ptr.as_ptr(), layout) }
}

/// Frees every buffer in the large-buffer pool (after the ARC shrank, so
/// that what it let go leaves the process): the bytes freed.
pub(crate) fn release_pooled() -> usize {
    let freed: Vec<PooledSize> = {
        let mut pool = POOL.lock().expect("buffer pool poisoned");
        pool.bytes = 0;
        std::mem::take(&mut pool.sizes)
    };
    let mut bytes = 0;
    for PooledSize {
        capacity_bytes,
        free,
        ..
    } in freed
    {
        let layout = Layout::from_size_align(capacity_bytes, BUF_ALIGN_BYTES)
            .expect("a pooled capacity is a valid layout");
        for FreeBuf(ptr) in free {
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
            && let Some((ptr, capacity_bytes)) = POOL
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
            let mut evicted = Vec::new();
            let kept = POOL.lock().expect("buffer pool poisoned").keep(
                self.ptr,
                capacity_bytes,
                &mut evicted,
            );
            for (ptr, capacity_bytes) in evicted {
                free_pooled(ptr, capacity_bytes);
            }
            if kept.is_ok() {
                return;
            }
        }
        free_pooled(self.ptr, self.capacity_bytes);
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

    /// A pool of its own (the process's is shared by every test thread).
    fn local_pool() -> Pooled {
        Pooled {
            sizes: Vec::new(),
            bytes: 0,
            clock: 0,
        }
    }

    fn raw(capacity_bytes: usize) -> NonNull<u8> {
        let layout = Layout::from_size_align(capacity_bytes, BUF_ALIGN_BYTES).unwrap();
        // SAFETY: a nonzero size.
        NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap()
    }

    fn empty(pool: Pooled) {
        for size in pool.sizes {
            for FreeBuf(ptr) in size.free {
                free_pooled(ptr, size.capacity_bytes);
            }
        }
    }

    #[test]
    fn a_request_takes_its_size_or_one_slightly_larger() {
        const MIB: usize = 1 << 20;
        let mut pool = local_pool();
        let mut evicted = Vec::new();
        let with_table = raw(MIB + BUF_ALIGN_BYTES);
        pool.keep(with_table, MIB + BUF_ALIGN_BYTES, &mut evicted)
            .unwrap();
        // Too small a request for it (its slack is under 16 KiB).
        assert!(pool.take(MIB - 64 * 1024).is_none());
        // A record of 1 MiB takes it, with its real capacity.
        assert_eq!(pool.take(MIB), Some((with_table, MIB + BUF_ALIGN_BYTES)));
        assert_eq!(pool.bytes, 0);
        // The exact size first, then the smallest larger one.
        let exact = raw(MIB);
        let larger = raw(MIB + 2 * BUF_ALIGN_BYTES);
        pool.keep(larger, MIB + 2 * BUF_ALIGN_BYTES, &mut evicted)
            .unwrap();
        pool.keep(with_table, MIB + BUF_ALIGN_BYTES, &mut evicted)
            .unwrap();
        pool.keep(exact, MIB, &mut evicted).unwrap();
        assert_eq!(pool.take(MIB), Some((exact, MIB)));
        assert_eq!(pool.take(MIB), Some((with_table, MIB + BUF_ALIGN_BYTES)));
        assert_eq!(pool.take(MIB), Some((larger, MIB + 2 * BUF_ALIGN_BYTES)));
        assert!(pool.take(MIB).is_none());
        assert!(evicted.is_empty());
        for (ptr, capacity) in [
            (exact, MIB),
            (with_table, MIB + BUF_ALIGN_BYTES),
            (larger, MIB + 2 * BUF_ALIGN_BYTES),
        ] {
            free_pooled(ptr, capacity);
        }
        empty(pool);
    }

    #[test]
    fn a_full_pool_makes_room_for_a_size_asked_for_over_one_that_is_not() {
        const MIB: usize = 1 << 20;
        let batch = 4 * MIB + BUF_ALIGN_BYTES;
        let mut pool = local_pool();
        let mut evicted = Vec::new();
        // A feeder's outgrown batch buffers, asked for once, fill the pool.
        assert!(pool.take(batch).is_none());
        let batches = POOLED_BYTES_MAX / batch;
        for _ in 0..batches {
            pool.keep(raw(batch), batch, &mut evicted).unwrap();
        }
        // A size never asked for does not displace them.
        let stray_bytes = 5 * MIB;
        let stray = raw(stray_bytes);
        assert!(pool.keep(stray, stray_bytes, &mut evicted).is_err());
        free_pooled(stray, stray_bytes);
        assert!(evicted.is_empty());
        // Records of 1 MiB are asked for (and missed): their freed buffers
        // now push the batch buffers out, one at a time as room is needed.
        assert!(pool.take(MIB).is_none());
        for _ in 0..8 {
            pool.keep(raw(MIB), MIB, &mut evicted).unwrap();
        }
        assert!(pool.bytes <= POOLED_BYTES_MAX);
        assert!(!evicted.is_empty() && evicted.iter().all(|&(_, c)| c == batch));
        let evicted_bytes: usize = evicted.iter().map(|&(_, c)| c).sum();
        assert_eq!(pool.bytes, batches * batch - evicted_bytes + 8 * MIB);
        for (ptr, capacity) in evicted.drain(..) {
            free_pooled(ptr, capacity);
        }
        // And the records are there for the next request.
        let (ptr, capacity) = pool.take(MIB).unwrap();
        assert_eq!(capacity, MIB);
        free_pooled(ptr, capacity);
        empty(pool);
    }

    #[test]
    fn copy_and_shrink() {
        let mut buf = AlignedBuf::copy_from(b"hello world");
        assert_eq!(&buf[..], b"hello world");
        buf.set_len(5);
        assert_eq!(&buf[..], b"hello");
    }
}
