//! Page-aligned byte buffers.
//!
//! O_DIRECT reads (image files, block devices and, later, cache devices) need
//! buffers whose address, length and file offset are multiples of the logical
//! block size. Every record buffer in the cache is therefore allocated with a
//! 4 KiB alignment once, filled in place by the primary read, and then shared
//! read-only by reference count: the bytes a reader gets are the bytes the
//! device wrote, with no copy in between.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

/// Alignment of every [`AlignedBuf`]: the largest logical block size in use.
pub const BUF_ALIGN_BYTES: usize = 4096;

/// A heap buffer whose start is aligned to [`BUF_ALIGN_BYTES`] and whose
/// capacity is a multiple of it. `len_bytes` is the valid length (at most the
/// capacity), so a short record at the end of an object keeps an aligned
/// allocation while exposing only its real bytes.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity_bytes: usize,
    len_bytes: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len_bytes` valid bytes; the capacity is rounded up
    /// to the alignment (at least one block, so the pointer is never dangling).
    pub fn zeroed(len_bytes: usize) -> Self {
        let capacity_bytes = len_bytes.max(1).next_multiple_of(BUF_ALIGN_BYTES);
        let layout = Layout::from_size_align(capacity_bytes, BUF_ALIGN_BYTES)
            .expect("buffer size overflows a Layout");
        // SAFETY: layout has a nonzero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self {
            ptr,
            capacity_bytes,
            len_bytes,
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn copy_from(data: &[u8]) -> Self {
        let mut buf = Self::zeroed(data.len());
        buf.as_mut_slice().copy_from_slice(data);
        buf
    }

    pub fn len(&self) -> usize {
        self.len_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

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

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity_bytes >= len_bytes initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }

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
    fn copy_and_shrink() {
        let mut buf = AlignedBuf::copy_from(b"hello world");
        assert_eq!(&buf[..], b"hello world");
        buf.set_len(5);
        assert_eq!(&buf[..], b"hello");
    }
}
