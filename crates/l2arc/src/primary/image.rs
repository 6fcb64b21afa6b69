//! One image file or block device as primary storage.
//!
//! The point of a read cache in front of a disk image is that the cache, not
//! the kernel, decides what stays in memory. Buffered reads would keep a
//! second copy of every block in the page cache, fighting the ARC for the
//! same DRAM and hiding the real cost of a primary read from benchmarks. So
//! the image is opened with O_DIRECT wherever the file system allows it, and
//! falls back to buffered I/O where it does not (EINVAL on open or on the
//! first read, or a direct-I/O alignment larger than our 4 KiB buffers).
//!
//! O_DIRECT needs offset, length and buffer address aligned to the logical
//! block size. The read path always asks for whole 4 KiB blocks into
//! `AlignedBuf`s, and those go straight to the device; a read of the block
//! that holds EOF comes back short with the exact count. Anything unaligned
//! (a caller that does not know, a write of a few bytes) goes through an
//! aligned bounce buffer: slower, never wrong. An unaligned write is a
//! read-modify-write of whole blocks, so two writes touching one block could
//! lose each other's bytes; every direct write therefore takes one mutex.
//! Writes are rare here (write-through of a read cache), reads never take it.
//! A write that ends inside the last block of a file also writes the block's
//! tail padding and then truncates the file back to its real size; a reader
//! racing that write may briefly see zeros past the real end.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::dir::read_full_at;
use super::{Generation, ObjectInfo, Primary, PrimaryObject};
use crate::buf::{AlignedBuf, BUF_ALIGN_BYTES};
use crate::lock_order::{RankedMutex, rank};

/// Alignment of direct I/O requests: every logical block size we accept divides it.
const DIRECT_ALIGN_BYTES: usize = BUF_ALIGN_BYTES;
/// Largest bounce buffer for unaligned requests; bigger ones go in pieces.
const BOUNCE_MAX_BYTES: usize = 1 << 20;

// <linux/fs.h>: _IOR(0x12, 114, size_t).
#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
const BLKGETSIZE64: u64 = 0x4008_1272;
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
const BLKGETSIZE64: u64 = 0x8008_1272;

/// A single image file or block device, exposed as one object named "".
pub struct ImagePrimary {
    path: PathBuf,
    writable: bool,
    object: Arc<ImageObject>,
}

impl ImagePrimary {
    /// Opens the image, with O_DIRECT if the file system supports it.
    pub fn open(path: impl AsRef<Path>, writable: bool) -> io::Result<Self> {
        Self::open_with(path.as_ref(), writable, true, false)
    }

    /// As [`Self::open`], and a block device is claimed (`O_EXCL`): while
    /// it is open nothing can mount it or claim it, and a device that is
    /// mounted or claimed already is refused (`EBUSY`). A plain open for
    /// writing by another process is not stopped (`block_writers.rs`).
    pub fn open_claimed(path: impl AsRef<Path>, writable: bool) -> io::Result<Self> {
        Self::open_with(path.as_ref(), writable, true, true)
    }

    fn open_with(path: &Path, writable: bool, try_direct: bool, claim: bool) -> io::Result<Self> {
        let ctx = |e: io::Error| io::Error::new(e.kind(), format!("image {}: {e}", path.display()));
        let meta = std::fs::metadata(path).map_err(ctx)?;
        let block_device = meta.file_type().is_block_device();
        if !meta.is_file() && !block_device {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "image {} is neither a regular file nor a block device",
                    path.display()
                ),
            ));
        }
        let open = |direct: bool| {
            let mut opts = OpenOptions::new();
            opts.read(true).write(writable);
            let exclusive = if claim && block_device {
                libc::O_EXCL
            } else {
                0
            };
            opts.custom_flags(exclusive | if direct { libc::O_DIRECT } else { 0 });
            opts.open(path)
        };
        let mut direct_file = None;
        if try_direct {
            match open(true) {
                Ok(f) => {
                    if direct_usable(&f, block_device) {
                        direct_file = Some(f);
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(ctx(e)),
            }
        }
        let direct = direct_file.is_some();
        let file = match direct_file {
            Some(f) => f,
            None => open(false).map_err(ctx)?,
        };
        let object = Arc::new(ImageObject {
            file,
            path: path.display().to_string(),
            direct,
            block_device,
            writable,
            write_lock: RankedMutex::new(()),
        });
        Ok(Self {
            path: path.to_path_buf(),
            writable,
            object,
        })
    }

    /// True if reads and writes bypass the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.object.direct
    }

    /// The image file or block device.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Primary for ImagePrimary {
    fn open(&self, name: &str, writable: bool) -> io::Result<Arc<dyn PrimaryObject>> {
        if !name.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} has one object, named \"\", not {name:?}",
                    self.describe()
                ),
            ));
        }
        if writable && !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} was opened read-only", self.describe()),
            ));
        }
        Ok(self.object.clone())
    }

    fn describe(&self) -> String {
        format!("image {}", self.path.display())
    }
}

/// Whether direct I/O on `file` works with our 4 KiB-aligned buffers: the
/// file system's advertised alignment (statx) must divide 4 KiB, and one
/// aligned read must not fail with EINVAL (some file systems accept
/// O_DIRECT at open and refuse it at the first read).
fn direct_usable(file: &File, block_device: bool) -> bool {
    let fd = file.as_raw_fd();
    // SAFETY: statx is plain data, filled by the kernel on success.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, empty path with AT_EMPTY_PATH, writable statx.
    let ret = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if ret == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 {
        let mem = stx.stx_dio_mem_align as usize;
        let off = stx.stx_dio_offset_align as usize;
        // 0 means "no direct I/O on this file".
        if mem == 0 || off == 0 || mem > DIRECT_ALIGN_BYTES || off > DIRECT_ALIGN_BYTES {
            return false;
        }
    }
    if block_device {
        let mut lbs: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int.
        let ret = unsafe { libc::ioctl(fd, libc::BLKSSZGET as _, &mut lbs) };
        if ret == 0 && (lbs <= 0 || lbs as usize > DIRECT_ALIGN_BYTES) {
            return false;
        }
    }
    let mut probe = AlignedBuf::zeroed(DIRECT_ALIGN_BYTES);
    loop {
        match file.read_at(probe.as_mut_capacity(), 0) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return e.raw_os_error() != Some(libc::EINVAL),
            Ok(_) => return true,
        }
    }
}

/// The open image; shared by every `open("")`.
struct ImageObject {
    file: File,
    path: String,
    direct: bool,
    block_device: bool,
    writable: bool,
    /// Serialises direct writes (read-modify-write of shared blocks).
    write_lock: RankedMutex<(), { rank::PRIMARY }>,
}

fn is_aligned(offset: u64, buf: &[u8]) -> bool {
    let a = DIRECT_ALIGN_BYTES;
    offset.is_multiple_of(a as u64)
        && buf.len().is_multiple_of(a)
        && (buf.as_ptr() as usize).is_multiple_of(a)
}

fn align_down(x: u64) -> u64 {
    x & !(DIRECT_ALIGN_BYTES as u64 - 1)
}

/// Rejects ranges that `pread`/`pwrite` cannot address (past i64::MAX).
fn check_range(offset: u64, len: usize) -> io::Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= i64::MAX as u64 - DIRECT_ALIGN_BYTES as u64 => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("range {offset}+{len} is beyond the largest file offset"),
        )),
    }
}

impl ImageObject {
    fn size_bytes(&self) -> io::Result<u64> {
        if self.block_device {
            let mut size: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64.
            let ret = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKGETSIZE64 as _, &mut size) };
            if ret < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(size)
        } else {
            Ok(self.file.metadata()?.size())
        }
    }

    fn ctx(&self, what: &str, offset: u64) -> impl Fn(io::Error) -> io::Error + '_ {
        let what = what.to_string();
        move |e| {
            io::Error::new(
                e.kind(),
                format!("{what} image {} at {offset}: {e}", self.path),
            )
        }
    }

    /// Direct read into an aligned buffer at an aligned offset. Short only at
    /// EOF: a direct read of the block holding EOF returns the exact count.
    fn read_direct_aligned(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0usize;
        let mut stalls = 0;
        while done < buf.len() {
            let pos = offset + done as u64;
            if !done.is_multiple_of(DIRECT_ALIGN_BYTES) {
                // A short read that stopped mid-block is normally EOF; if the
                // file is longer (it grew meanwhile), reread that block.
                if pos >= self.size_bytes()? {
                    break;
                }
                stalls += 1;
                if stalls > 4 {
                    return Err(io::Error::other(
                        "direct read keeps stopping short before the end of the image",
                    ));
                }
                done -= done % DIRECT_ALIGN_BYTES;
                continue;
            }
            match self.file.read_at(&mut buf[done..], pos) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Unaligned direct read through an aligned bounce buffer.
    fn read_bounced(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let first = align_down(offset);
        let span = (offset - first) as usize + buf.len();
        let mut bounce = AlignedBuf::zeroed(span.min(BOUNCE_MAX_BYTES));
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let block = align_down(pos);
            let skip = (pos - block) as usize;
            let want = (buf.len() - done + skip)
                .min(BOUNCE_MAX_BYTES)
                .next_multiple_of(DIRECT_ALIGN_BYTES);
            let chunk = &mut bounce.as_mut_capacity()[..want];
            let n = self.read_direct_aligned(block, chunk)?;
            if n <= skip {
                break;
            }
            let take = (n - skip).min(buf.len() - done);
            buf[done..done + take].copy_from_slice(&chunk[skip..skip + take]);
            done += take;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    /// Reads one aligned block for a read-modify-write; zeros past EOF.
    fn fill_block(&self, offset: u64, block: &mut [u8]) -> io::Result<()> {
        let n = self.read_direct_aligned(offset, block)?;
        block[n..].fill(0);
        Ok(())
    }

    /// Direct write of arbitrary alignment; caller holds `write_lock`.
    fn write_direct(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let old_size_bytes = if self.block_device {
            0
        } else {
            self.size_bytes()?
        };
        let end = offset + data.len() as u64;
        let mut written_end = end;
        if is_aligned(offset, data) {
            self.file.write_all_at(data, offset)?;
        } else {
            let first = align_down(offset);
            let span = (offset - first) as usize + data.len();
            let mut bounce = AlignedBuf::zeroed(span.min(BOUNCE_MAX_BYTES));
            let mut done = 0usize;
            let a = DIRECT_ALIGN_BYTES;
            while done < data.len() {
                let pos = offset + done as u64;
                let block = align_down(pos);
                let skip = (pos - block) as usize;
                let want = (data.len() - done + skip)
                    .min(BOUNCE_MAX_BYTES)
                    .next_multiple_of(a);
                let take = (want - skip).min(data.len() - done);
                let chunk = &mut bounce.as_mut_capacity()[..want];
                // Only the first and last blocks keep bytes we do not overwrite.
                if skip != 0 {
                    self.fill_block(block, &mut chunk[..a])?;
                }
                if !(skip + take).is_multiple_of(a) && (want > a || skip == 0) {
                    self.fill_block(block + (want - a) as u64, &mut chunk[want - a..])?;
                }
                chunk[skip..skip + take].copy_from_slice(&data[done..done + take]);
                self.file.write_all_at(chunk, block)?;
                done += take;
                written_end = block + want as u64;
            }
        }
        // Whole-block writes may have extended a file past its real end.
        let real_end = old_size_bytes.max(end);
        if !self.block_device && written_end > real_end {
            self.file.set_len(real_end)?;
        }
        Ok(())
    }
}

impl PrimaryObject for ImageObject {
    fn info(&self) -> io::Result<ObjectInfo> {
        let ctx = |e: io::Error| io::Error::new(e.kind(), format!("stat image {}: {e}", self.path));
        let meta = self.file.metadata().map_err(ctx)?;
        let size_bytes = if self.block_device {
            self.size_bytes().map_err(ctx)?
        } else {
            meta.size()
        };
        Ok(ObjectInfo {
            id: meta.ino(),
            generation: Generation {
                size_bytes,
                ..Generation::of(&meta)
            },
        })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        check_range(offset, buf.len())?;
        if buf.is_empty() {
            return Ok(0);
        }
        let r = if !self.direct {
            read_full_at(&self.file, offset, buf)
        } else if is_aligned(offset, buf) {
            self.read_direct_aligned(offset, buf)
        } else {
            self.read_bounced(offset, buf)
        };
        r.map_err(self.ctx("read", offset))
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("image {} was opened read-only", self.path),
            ));
        }
        check_range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let r = if self.direct {
            let _guard = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
            self.write_direct(offset, data)
        } else {
            self.file.write_all_at(data, offset)
        };
        r.map_err(self.ctx("write", offset))
    }

    fn sync(&self) -> io::Result<()> {
        self.file
            .sync_data()
            .map_err(|e| io::Error::new(e.kind(), format!("sync image {}: {e}", self.path)))
    }

    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)` on files; block devices (where
    /// BLKDISCARD would be the tool) and file systems without hole punching
    /// say `Unsupported`. Under `write_lock`: a direct read-modify-write of
    /// a block the hole covers must not write the old bytes back over it.
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("image {} was opened read-only", self.path),
            ));
        }
        if self.block_device {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("image {}: no hole punching on block devices", self.path),
            ));
        }
        let too_far = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("range {offset}+{len} is beyond the largest file offset"),
            )
        };
        let end = offset.checked_add(len).ok_or_else(too_far)?;
        if end > i64::MAX as u64 {
            return Err(too_far());
        }
        if len == 0 {
            return Ok(());
        }
        let _guard = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            // SAFETY: fallocate on an fd we own; both values fit in off_t (checked above).
            let ret = unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            };
            if ret == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("image {}: hole punching: {e}", self.path),
                    ));
                }
                _ => return Err(self.ctx("punch hole in", offset)(e)),
            }
        }
    }

    fn read_alignment_bytes(&self) -> usize {
        if self.direct { DIRECT_ALIGN_BYTES } else { 1 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: usize = 10_000;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
            .collect()
    }

    fn make_image(dir: &Path) -> (PathBuf, Vec<u8>) {
        let path = dir.join("disk.img");
        let data = pattern(SIZE, 0);
        std::fs::write(&path, &data).unwrap();
        (path, data)
    }

    /// The whole suite for one image, in whichever mode it opened.
    fn exercise(img: &ImagePrimary, path: &Path, mut expect: Vec<u8>) {
        let obj = img.open("", true).unwrap();
        assert_eq!(
            obj.read_alignment_bytes(),
            if img.is_direct() { 4096 } else { 1 }
        );
        assert_eq!(obj.info().unwrap().size_bytes(), SIZE as u64);
        assert_eq!(
            obj.info().unwrap().generation.ino,
            std::fs::metadata(path).unwrap().ino()
        );

        // Aligned whole blocks, as the cache reads them; the last one holds EOF.
        let mut buf = AlignedBuf::zeroed(3 * 4096);
        assert_eq!(obj.read_at(0, buf.as_mut_capacity()).unwrap(), SIZE);
        assert_eq!(&buf.as_mut_capacity()[..SIZE], &expect[..]);
        let mut blk = AlignedBuf::zeroed(4096);
        assert_eq!(obj.read_at(4096, blk.as_mut_capacity()).unwrap(), 4096);
        assert_eq!(&blk[..], &expect[4096..8192]);
        assert_eq!(
            obj.read_at(8192, blk.as_mut_capacity()).unwrap(),
            SIZE - 8192
        );
        assert_eq!(&blk[..SIZE - 8192], &expect[8192..]);
        // At and past the end.
        assert_eq!(obj.read_at(12288, blk.as_mut_capacity()).unwrap(), 0);
        assert_eq!(obj.read_at(1 << 30, blk.as_mut_capacity()).unwrap(), 0);
        let mut small = [0u8; 10];
        assert_eq!(obj.read_at(SIZE as u64, &mut small).unwrap(), 0);
        assert_eq!(obj.read_at(SIZE as u64 + 5, &mut small).unwrap(), 0);

        // Unaligned reads: odd offsets, odd lengths, unaligned buffers.
        let mut v = vec![0u8; 9000];
        for (off, len) in [
            (1usize, 100usize),
            (4095, 2),
            (100, 8000),
            (9990, 100),
            (5000, 5000),
            (0, 1),
        ] {
            let n = obj.read_at(off as u64, &mut v[3..3 + len]).unwrap();
            let want = len.min(SIZE - off);
            assert_eq!(n, want, "read {off}+{len}");
            assert_eq!(&v[3..3 + n], &expect[off..off + n], "read {off}+{len}");
        }

        // Unaligned writes, inside, straddling blocks, at and past EOF.
        let writes: [(usize, usize); 5] =
            [(10, 5), (4090, 20), (100, 9000), (9995, 10), (12000, 3)];
        for (i, (off, len)) in writes.into_iter().enumerate() {
            let data = pattern(len, 0x55 + i as u8);
            obj.write_at(off as u64, &data).unwrap();
            if expect.len() < off + len {
                expect.resize(off + len, 0);
            }
            expect[off..off + len].copy_from_slice(&data);
            obj.sync().unwrap();
            assert_eq!(
                std::fs::read(path).unwrap(),
                expect,
                "after write {off}+{len}"
            );
            assert_eq!(obj.info().unwrap().size_bytes(), expect.len() as u64);
        }
        // An aligned write of whole blocks.
        let data = AlignedBuf::copy_from(&pattern(4096, 0x77));
        obj.write_at(4096, &data).unwrap();
        expect[4096..8192].copy_from_slice(&data);
        assert_eq!(std::fs::read(path).unwrap(), expect);
        // And the image reads back what std::fs sees.
        let mut all = AlignedBuf::zeroed(expect.len());
        assert_eq!(obj.read_at(0, all.as_mut_capacity()).unwrap(), expect.len());
        assert_eq!(&all[..], &expect[..]);
    }

    #[test]
    fn image_on_tempdir() {
        let tmp = tempfile::tempdir().unwrap();
        let (path, data) = make_image(tmp.path());
        let img = ImagePrimary::open(&path, true).unwrap();
        eprintln!(
            "image on {}: direct = {}",
            tmp.path().display(),
            img.is_direct()
        );
        exercise(&img, &path, data);
    }

    #[test]
    fn image_buffered() {
        let tmp = tempfile::tempdir().unwrap();
        let (path, data) = make_image(tmp.path());
        let img = ImagePrimary::open_with(&path, true, false, false).unwrap();
        assert!(!img.is_direct());
        exercise(&img, &path, data);
    }

    /// An image on tmpfs, where O_DIRECT is refused: the open falls back
    /// to buffered reads. Needs a writable /dev/shm, and fails (never
    /// skips) without one.
    #[test]
    fn image_on_dev_shm() {
        let shm = Path::new("/dev/shm");
        assert!(
            shm.is_dir(),
            "/dev/shm is missing: this test needs a tmpfs there (mount -t tmpfs tmpfs /dev/shm)"
        );
        let tmp = tempfile::tempdir_in(shm).unwrap_or_else(|e| {
            panic!("/dev/shm is not writable ({e}): this test needs a writable tmpfs there")
        });
        let (path, data) = make_image(tmp.path());
        let img = ImagePrimary::open(&path, true).unwrap();
        eprintln!("image on /dev/shm: direct = {}", img.is_direct());
        exercise(&img, &path, data);
    }

    #[test]
    fn names_modes_and_bad_inputs() {
        let tmp = tempfile::tempdir().unwrap();
        let (path, _) = make_image(tmp.path());
        let img = ImagePrimary::open(&path, false).unwrap();
        assert_eq!(img.describe(), format!("image {}", path.display()));
        let a = img.open("", false).unwrap();
        let b = img.open("", false).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let e = img.open("x", false).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let e = img.open("", true).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(a.write_at(0, b"x").is_err());
        let mut buf = [0u8; 4];
        assert!(a.read_at(u64::MAX - 1, &mut buf).is_err());
        assert_eq!(a.read_at(0, &mut []).unwrap(), 0);

        let e = ImagePrimary::open(tmp.path(), false).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = ImagePrimary::open(tmp.path().join("missing"), false)
            .err()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn empty_image() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("empty.img");
        std::fs::write(&path, b"").unwrap();
        let img = ImagePrimary::open(&path, true).unwrap();
        let obj = img.open("", true).unwrap();
        let mut blk = AlignedBuf::zeroed(4096);
        assert_eq!(obj.read_at(0, blk.as_mut_capacity()).unwrap(), 0);
        obj.write_at(3, b"abc").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"\0\0\0abc");
    }

    #[test]
    fn large_unaligned_transfer_spans_bounce_chunks() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("big.img");
        let mut expect = pattern(3 << 20, 9);
        std::fs::write(&path, &expect).unwrap();
        let img = ImagePrimary::open(&path, true).unwrap();
        let obj = img.open("", true).unwrap();
        let mut v = vec![0u8; (2 << 20) + 777];
        assert_eq!(obj.read_at(333, &mut v).unwrap(), v.len());
        assert_eq!(&v[..], &expect[333..333 + v.len()]);
        let data = pattern((2 << 20) + 4097, 3);
        obj.write_at(4095, &data).unwrap();
        expect[4095..4095 + data.len()].copy_from_slice(&data);
        assert_eq!(std::fs::read(&path).unwrap(), expect);
    }

    /// A loop device over a backing file, detached when dropped.
    struct LoopDevice {
        path: PathBuf,
    }

    impl LoopDevice {
        /// `losetup --find --show [--sector-size N] backing`. Fails the test
        /// (never skips) if that is impossible: it needs root and util-linux.
        fn attach(backing: &Path, sector_size: Option<u32>) -> Self {
            let mut cmd = std::process::Command::new("losetup");
            if let Some(n) = sector_size {
                cmd.arg("--sector-size").arg(n.to_string());
            }
            cmd.arg("--find").arg("--show").arg(backing);
            let out = cmd.output().unwrap_or_else(|e| {
                panic!(
                    "cannot run losetup ({e}): the block-device test needs util-linux's \
                     losetup, root and loop devices"
                )
            });
            assert!(
                out.status.success(),
                "{cmd:?} failed ({}): {}; the block-device test needs root and free loop devices",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            assert!(
                std::fs::metadata(&path).is_ok_and(|m| m.file_type().is_block_device()),
                "{cmd:?} printed {path:?}, which is not a block device"
            );
            Self { path }
        }
    }

    impl Drop for LoopDevice {
        fn drop(&mut self) {
            // With the device still open somewhere, the kernel detaches it
            // at the last close (autoclear).
            match std::process::Command::new("losetup")
                .arg("--detach")
                .arg(&self.path)
                .status()
            {
                Ok(status) if status.success() => {}
                other => eprintln!("losetup --detach {}: {other:?}", self.path.display()),
            }
        }
    }

    /// The image checks on a real block device: a loop device over a sparse
    /// file, with 512-byte or 4 KiB logical sectors.
    #[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
    fn block_device(sector_size: Option<u32>) {
        const DEV_SIZE: u64 = 4 << 20;
        let tmp = tempfile::tempdir().unwrap();
        let backing = tmp.path().join("backing.img");
        {
            // Sparse but for a pattern at the start.
            let f = File::create(&backing).unwrap();
            f.set_len(DEV_SIZE).unwrap();
            f.write_all_at(&pattern(3 * 4096 + 100, 0x42), 0).unwrap();
            f.sync_all().unwrap();
        }
        let lo = LoopDevice::attach(&backing, sector_size);
        let dev = lo.path.clone();
        if let Some(n) = sector_size {
            let f = File::open(&dev).unwrap();
            let mut lbs: libc::c_int = 0;
            // SAFETY: BLKSSZGET writes one int.
            let ret = unsafe { libc::ioctl(f.as_raw_fd(), libc::BLKSSZGET as _, &mut lbs) };
            assert_eq!(ret, 0, "BLKSSZGET on {}", dev.display());
            assert_eq!(lbs as u32, n, "logical sector size of {}", dev.display());
        }

        let img = ImagePrimary::open(&dev, true).unwrap();
        eprintln!("{}: direct = {}", img.describe(), img.is_direct());
        assert!(img.is_direct(), "{} must take O_DIRECT", dev.display());
        let obj = img.open("", true).unwrap();
        assert_eq!(obj.read_alignment_bytes(), 4096);
        let size = obj.info().unwrap().size_bytes();
        assert_eq!(size, DEV_SIZE, "BLKGETSIZE64 of {}", dev.display());
        let mut expect = std::fs::read(&dev).unwrap();
        assert_eq!(size, expect.len() as u64);
        assert!(
            expect[..3 * 4096 + 100] == pattern(3 * 4096 + 100, 0x42)[..],
            "the device shows the backing file's bytes"
        );
        assert!(expect[3 * 4096 + 100..].iter().all(|&b| b == 0));
        let mut all = AlignedBuf::zeroed(expect.len() + 4096);
        assert_eq!(obj.read_at(0, all.as_mut_capacity()).unwrap(), expect.len());
        assert!(
            all[..expect.len()] == expect[..],
            "direct read of the whole device"
        );

        // Unaligned writes and reads, through bounce buffers.
        for (off, len, seed) in [
            (1234usize, 5000usize, 0x31u8),
            (4095, 2, 0x32),
            (100_000, 9000, 0x33),
        ] {
            let data = pattern(len, seed);
            obj.write_at(off as u64, &data).unwrap();
            expect[off..off + len].copy_from_slice(&data);
        }
        // The last bytes of the device, unaligned.
        let data = pattern(10, 0x34);
        obj.write_at(size - 10, &data).unwrap();
        expect[size as usize - 10..].copy_from_slice(&data);
        obj.sync().unwrap();
        for (off, len) in [
            (1usize, 7000usize),
            (4000, 200),
            (99_999, 9002),
            (size as usize - 4097, 4097),
        ] {
            let mut v = vec![0u8; len];
            assert_eq!(
                obj.read_at(off as u64, &mut v).unwrap(),
                len,
                "read {off}+{len}"
            );
            assert!(
                v[..] == expect[off..off + len],
                "read {off}+{len}: wrong bytes"
            );
        }
        assert_eq!(
            obj.info().unwrap().size_bytes(),
            size,
            "a block device does not grow"
        );
        let e = obj
            .write_at(size - 2, b"abc")
            .expect_err("write past the end");
        eprintln!("write past the end: {e}");
        // Like pwrite, the part that fits may have landed before the error.
        let mut tail = AlignedBuf::zeroed(4096);
        assert_eq!(
            obj.read_at(size - 4096, tail.as_mut_capacity()).unwrap(),
            4096
        );
        let end = size as usize;
        assert!(
            tail[4094..] == expect[end - 2..] || &tail[4094..] == b"ab",
            "write past the end left {:?} in the last two bytes",
            &tail[4094..]
        );
        assert!(tail[..4094] == expect[end - 4096..end - 2]);
        expect[end - 2..].copy_from_slice(&tail[4094..]);
        let mut v = vec![0u8; 7000];
        assert_eq!(obj.read_at(size, &mut v).unwrap(), 0);
        assert_eq!(obj.read_at(size - 3, &mut v).unwrap(), 3);
        let mut blk = AlignedBuf::zeroed(8192);
        assert_eq!(
            obj.read_at(size - 4096, blk.as_mut_capacity()).unwrap(),
            4096
        );
        assert!(blk[..4096] == expect[size as usize - 4096..]);
        assert_eq!(obj.read_at(size, blk.as_mut_capacity()).unwrap(), 0);

        // Everything reached the device: read it back around the image.
        drop(obj);
        drop(img);
        assert!(std::fs::read(&dev).unwrap() == expect, "device contents");
        drop(lo);
        assert!(
            std::fs::read(&backing).unwrap() == expect,
            "backing file contents"
        );
    }

    #[test]
    fn block_device_512_byte_sectors() {
        block_device(None);
    }

    #[test]
    fn block_device_4k_sectors() {
        block_device(Some(4096));
    }
}
