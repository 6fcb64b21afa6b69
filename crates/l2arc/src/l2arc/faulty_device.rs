//! A cache device that fails on command, for tests (feature `test-utils`).
//!
//! Everything above the device layer must treat an error, a corrupt block or
//! a vanished device as "this copy is gone" and fall back to primary
//! storage. Proving that needs a real device whose faults the test switches
//! on and off while reads and feeds are in flight; this wrapper does real I/O
//! on the device inside it until told otherwise.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::device::DeviceIo;

/// Switches that make a [`FaultyDevice`] misbehave.
#[derive(Default)]
pub struct Faults {
    /// Every read fails with EIO.
    pub fail_reads: AtomicBool,
    /// Every write fails with EIO.
    pub fail_writes: AtomicBool,
    /// The next this many writes fail with EIO (a fault of a set length,
    /// whatever the caller is doing meanwhile).
    pub fail_next_writes: AtomicU64,
    /// Reads succeed but one byte of the returned data is flipped.
    pub corrupt_reads: AtomicBool,
    /// The device is gone: every operation fails with ENXIO.
    pub vanished: AtomicBool,
    /// Reads failed on purpose so far.
    pub reads_failed: AtomicU64,
    /// Writes hang until this is switched off (a device that stopped
    /// answering), then go on, or fail if a write fault was switched on
    /// meanwhile.
    pub stall_writes: AtomicBool,
    /// Writes that have hung on `stall_writes` so far.
    pub writes_stalled: AtomicU64,
    /// Every write takes at least this long (a slow device), microseconds.
    pub write_delay_us: AtomicU64,
    /// Every read takes at least this long (a slow device), microseconds.
    pub read_delay_us: AtomicU64,
    /// Reads longer than this fail with EIO (0: off): a device that fails
    /// large reads only (a merged read) and serves the same blocks one
    /// record at a time.
    pub fail_reads_longer_than_bytes: AtomicU64,
}

/// A device wrapper for tests: real I/O until a fault is switched on.
pub struct FaultyDevice {
    inner: Box<dyn DeviceIo>,
    /// The switches; clone the `Arc` to flip them while the cache owns the device.
    pub faults: std::sync::Arc<Faults>,
}

impl FaultyDevice {
    /// Wraps a device; no fault is on.
    pub fn new(inner: Box<dyn DeviceIo>) -> Self {
        Self {
            inner,
            faults: std::sync::Arc::new(Faults::default()),
        }
    }
}

impl FaultyDevice {
    /// The read faults switched on, applied around a read of the inner
    /// device however it was done (`read_at` or an io_uring).
    fn read_with_faults(
        &self,
        offset: u64,
        buf: &mut [u8],
        read: impl FnOnce(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let f = &self.faults;
        if f.vanished.load(Ordering::Relaxed) {
            f.reads_failed.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::from_raw_os_error(libc::ENXIO));
        }
        let longest_bytes = f.fail_reads_longer_than_bytes.load(Ordering::Relaxed);
        if f.fail_reads.load(Ordering::Relaxed)
            || (longest_bytes > 0 && buf.len() as u64 > longest_bytes)
        {
            f.reads_failed.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let delay_us = f.read_delay_us.load(Ordering::Relaxed);
        if delay_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay_us));
        }
        read(buf)?;
        if f.corrupt_reads.load(Ordering::Relaxed) && !buf.is_empty() {
            let at = (offset as usize / 7 + buf.len() / 3) % buf.len();
            buf[at] ^= 0x5a;
        }
        Ok(())
    }
}

impl DeviceIo for FaultyDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_with_faults(offset, buf, |buf| self.inner.read_at(offset, buf))
    }

    fn ring_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.ring_fd()
    }

    fn finish_ring_read(
        &self,
        offset: u64,
        buf: &mut [u8],
        result: io::Result<()>,
    ) -> io::Result<()> {
        // The ring read already happened; faults decide what it returned.
        self.read_with_faults(offset, buf, |buf| {
            self.inner.finish_ring_read(offset, buf, result)
        })
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let f = &self.faults;
        if f.vanished.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::ENXIO));
        }
        let counted_failure = f
            .fail_next_writes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if counted_failure || f.fail_writes.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let delay_us = f.write_delay_us.load(Ordering::Relaxed);
        if delay_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay_us));
        }
        if f.stall_writes.load(Ordering::SeqCst) {
            f.writes_stalled.fetch_add(1, Ordering::SeqCst);
            while f.stall_writes.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if f.fail_writes.load(Ordering::SeqCst) || f.vanished.load(Ordering::SeqCst) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        self.inner.write_at(offset, buf)
    }

    fn sync(&self) -> io::Result<()> {
        if self.faults.vanished.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::ENXIO));
        }
        self.inner.sync()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn name(&self) -> String {
        self.inner.name()
    }

    fn identity(&self) -> Option<super::device::DeviceIdentity> {
        self.inner.identity()
    }

    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::AlignedBuf;
    use crate::l2arc::device::FileDevice;

    #[test]
    fn faults_switch_on_and_off() {
        let dir = tempfile::tempdir().unwrap();
        let inner = FileDevice::open(dir.path().join("c"), Some(1 << 20)).unwrap();
        let dev = FaultyDevice::new(Box::new(inner));
        let block = AlignedBuf::copy_from(&[1u8; 4096]);
        dev.write_at(0, &block).unwrap();
        let mut back = AlignedBuf::zeroed(4096);
        dev.faults.fail_reads.store(true, Ordering::Relaxed);
        assert!(dev.read_at(0, back.as_mut_slice()).is_err());
        dev.faults.fail_reads.store(false, Ordering::Relaxed);
        dev.faults.corrupt_reads.store(true, Ordering::Relaxed);
        dev.read_at(0, back.as_mut_slice()).unwrap();
        assert_ne!(&back[..], &block[..]);
        dev.faults.corrupt_reads.store(false, Ordering::Relaxed);
        dev.read_at(0, back.as_mut_slice()).unwrap();
        assert_eq!(&back[..], &block[..]);
        dev.faults.fail_next_writes.store(2, Ordering::Relaxed);
        assert!(dev.write_at(0, &block).is_err());
        assert!(dev.write_at(0, &block).is_err());
        dev.write_at(0, &block).unwrap();
        assert_eq!(dev.faults.fail_next_writes.load(Ordering::Relaxed), 0);
    }
}
