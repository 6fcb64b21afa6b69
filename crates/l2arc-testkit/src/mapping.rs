//! A shared mapping of a file, for tests of readers and writers that make
//! no system call on the file: a program that reads a file only through
//! `mmap` asks its file system nothing once its pages are in, and one that
//! writes through a mapping raises no inotify event.

use std::os::fd::AsRawFd;

/// A shared mapping of the first `len` bytes of a file, unmapped on drop.
pub struct SharedMapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl SharedMapping {
    /// Maps `len` bytes (a multiple of 8) of `file`, readable, and
    /// writable if `writable` (the file must be open for writing then).
    pub fn new(file: &std::fs::File, len: usize, writable: bool) -> SharedMapping {
        assert!(len > 0 && len.is_multiple_of(8));
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a fresh shared mapping of an open file, unmapped on drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        SharedMapping { ptr, len }
    }

    /// The mapping's bytes now, copied word by word with volatile loads:
    /// the kernel may replace its pages under us at any time.
    pub fn bytes(&self) -> Vec<u8> {
        let words = self.ptr.cast::<u64>();
        let mut out = Vec::with_capacity(self.len);
        for i in 0..self.len / 8 {
            // SAFETY: in bounds of a live, readable, page-aligned mapping.
            let word = unsafe { std::ptr::read_volatile(words.add(i)) };
            out.extend_from_slice(&word.to_ne_bytes());
        }
        out
    }

    /// Stores `bytes` at `offset` through the mapping and writes them back
    /// to the file (`msync`): the file's mtime moves, no `write(2)` ran.
    pub fn write_and_sync(&self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= self.len);
        // SAFETY: in bounds of a live mapping, writable by construction
        // (mmap refuses PROT_WRITE on a file open for reading only).
        unsafe {
            let dst = std::slice::from_raw_parts_mut(self.ptr.cast::<u8>(), self.len);
            dst[offset..offset + bytes.len()].copy_from_slice(bytes);
            assert_eq!(libc::msync(self.ptr, self.len, libc::MS_SYNC), 0);
        }
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, of this length.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}
