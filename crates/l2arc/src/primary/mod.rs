//! Primary storage: where the authoritative bytes live.
//!
//! The cache never owns data; it holds copies of records that a `Primary`
//! can always produce again. So the contract below is small: open an object
//! by name, read a range of it, write through to it, and say which version of
//! the object is current. That version (`Generation`) is what makes a cached
//! record trustworthy: a record remembers the generation it was read under,
//! and a record whose object has since changed behind the cache (a file
//! replaced, rewritten while the cache was down) is a miss, never a hit.
//!
//! Back ends:
//! - [`dir::DirPrimary`]: a directory tree of files (objects are relative paths
//!   that may not leave the directory);
//! - [`image::ImagePrimary`]: one image file or block device, O_DIRECT where
//!   the file system allows it (one object, named "");
//! - [`emulated_hdd::EmulatedHdd`]: wraps another primary and makes it behave
//!   like an array of spinning disks, for benchmarks on machines with no HDD;
//! - `object_store::ObjectStorePrimary` (cargo feature `object-store`): a
//!   bucket of an object store (S3 and the other OpenDAL services), read by
//!   ranged GETs made conditional on the ETag the cached records carry.

use std::io;
use std::sync::Arc;

pub mod block_writers;
pub mod dir;
pub mod emulated_hdd;
pub mod image;
#[cfg(feature = "object-store")]
pub mod object_store;

/// Which version of an object the cache saw: for a file, inode, size,
/// modification time and change time. Any difference means the cached bytes
/// may be stale.
///
/// The change time is what makes the token exact: `touch -r`, `cp -p`,
/// rsync and tar set a file's mtime back after rewriting it, but no user can
/// set ctime, and every write, truncate or attribute change moves it. (Linux
/// keeps its finer change counter, i_version, to itself: statx does not
/// report it.) A ctime change that is not a content change (chmod, a new
/// hard link) costs a needless miss, never a wrong hit.
///
/// Objects of an object store have no inode and no ctime: what names a
/// version there is the ETag (and the version id in a versioned bucket).
/// `version_hash` carries a stable 64-bit hash of those (see
/// [`Generation::version_hash_of`]); it is zero for files, and a zero keeps
/// the token of a file exactly what it was before the field existed, so
/// persistent caches written then stay valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Generation {
    /// Inode number (0 where the primary has none).
    pub ino: u64,
    /// Size of the object.
    pub size_bytes: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
    /// Change time, ns since the epoch.
    pub ctime_ns: i64,
    /// Hash of the object store's version (ETag, version id); 0 for files.
    pub version_hash: u64,
}

impl Generation {
    /// The generation of a file as `fstat` describes it.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            ino: meta.ino(),
            size_bytes: meta.size(),
            mtime_ns: nanos(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: nanos(meta.ctime(), meta.ctime_nsec()),
            version_hash: 0,
        }
    }

    /// The same from a raw `struct stat` (front ends that call fstatat).
    pub fn of_stat(st: &libc::stat) -> Self {
        Self {
            ino: st.st_ino,
            size_bytes: st.st_size as u64,
            mtime_ns: nanos(st.st_mtime, st.st_mtime_nsec),
            ctime_ns: nanos(st.st_ctime, st.st_ctime_nsec),
            version_hash: 0,
        }
    }

    /// A stable (same in every process, every run) nonzero hash of an
    /// object store's version strings: the ETag, then the version id (empty
    /// where the bucket keeps no versions). FNV-1a, with a separator byte
    /// that cannot occur in either string, so ("ab", "c") and ("a", "bc")
    /// differ.
    pub fn version_hash_of(etag: &str, version_id: &str) -> u64 {
        const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut h = FNV_OFFSET;
        for b in etag.bytes().chain([0u8]).chain(version_id.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
        h.max(1)
    }
}

fn nanos(sec: i64, nsec: i64) -> i64 {
    sec.saturating_mul(1_000_000_000).saturating_add(nsec)
}

/// What `stat` says about an object now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Stable identity within the primary (the inode number for files).
    /// Two names that are the same file share it, so they share cached records.
    pub id: u64,
    /// The version of the object seen now.
    pub generation: Generation,
}

impl ObjectInfo {
    /// Size of the object.
    pub fn size_bytes(&self) -> u64 {
        self.generation.size_bytes
    }
}

/// Where an object lives beyond this machine, and which version of it:
/// what a cache tier that a fleet shares names its records by (every node
/// that reads the same object of the same store names it the same).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceIdentity {
    /// The store's endpoint as configured ("https://s3.us-east-1.amazonaws.com").
    pub endpoint: String,
    /// The bucket.
    pub bucket: String,
    /// The object's full key in the bucket (prefix included).
    pub key: String,
    /// The version: the ETag, and the version id in a versioned bucket.
    pub version: String,
}

impl SourceIdentity {
    /// An identity from its parts.
    pub fn new(endpoint: String, bucket: String, key: String, version: String) -> Self {
        Self {
            endpoint,
            bucket,
            key,
            version,
        }
    }
}

/// A slow store of named objects.
pub trait Primary: Send + Sync + 'static {
    /// Opens an object. `writable` asks for write access (write-through).
    fn open(&self, name: &str, writable: bool) -> io::Result<Arc<dyn PrimaryObject>>;

    /// One line for logs and error messages ("dir /srv/data", "image /dev/sdb").
    fn describe(&self) -> String;

    /// Bytes one read of a sequential reader's read-ahead should ask of
    /// this store, when a request costs far more than its transfer (an
    /// object store: a GET's round trip and charge are worth megabytes):
    /// the cache then watches each object's readers and reads sequential
    /// ones ahead in spans of this size, one request a span (`zstream`).
    /// None (the default: files and disks): the read-ahead that grows with
    /// the stream in the demand reader's own read (`read_ahead`) alone.
    fn read_ahead_span_bytes(&self) -> Option<u64> {
        None
    }

    /// Adopts a file that the caller already opened in this primary's tree
    /// (a front end that resolves names itself, such as the FUSE mount,
    /// which holds a descriptor per inode). `writable` says whether `file`
    /// was opened for writing. Primaries that are not files refuse.
    fn open_file(&self, file: std::fs::File, writable: bool) -> io::Result<Arc<dyn PrimaryObject>> {
        let _ = (file, writable);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} cannot adopt an open file", self.describe()),
        ))
    }
}

/// An open object of a [`Primary`]. Shared by every reader of that object.
pub trait PrimaryObject: Send + Sync + 'static {
    /// Fresh identity and generation (an `fstat`, not a remembered value).
    fn info(&self) -> io::Result<ObjectInfo>;

    /// Reads like POSIX `pread` but retries short reads: fills `buf` from
    /// `offset` and returns fewer bytes only at the end of the object (0 at or
    /// past it). `offset` and `buf` honour [`Self::read_alignment_bytes`].
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Reads like [`Self::read_at`], but only from the version `expected`
    /// names: the generation the records being filled will carry, or `None`
    /// when the cache no longer knows which one that is (its token moved on
    /// while the fill was being claimed). Files ignore it (their staleness
    /// is caught by re-stating). An object store makes the read conditional
    /// (If-Match on the ETag) and returns `ErrorKind::StaleNetworkFileHandle`
    /// when the object is no longer that version, or when `expected` is
    /// `None`: the read path then re-stats and reads again under the new
    /// generation, so a record never holds bytes of two versions.
    fn read_at_generation(
        &self,
        offset: u64,
        buf: &mut [u8],
        expected: Option<&Generation>,
    ) -> io::Result<usize> {
        let _ = expected;
        self.read_at(offset, buf)
    }

    /// Reads `len` bytes at `offset` of the version `expected` names, under
    /// the rules of [`Self::read_at_generation`], and hands them to `sink`
    /// in order, in pieces of any size, as they arrive, for as long as it
    /// returns true. Returns the bytes handed over: fewer than `len` only
    /// at the end of the object or when `sink` said stop. On an error, what
    /// was handed over before it is of `expected` and good; the rest never
    /// comes (a stale object: `StaleNetworkFileHandle`, and no byte of the
    /// new version is handed over).
    ///
    /// The default reads the whole range at once and hands it over in one
    /// piece (a buffer of `len` bytes for the call). An object store
    /// streams one GET instead, so that the first records of a long span
    /// are served while the rest is still on the wire.
    fn read_span_at_generation(
        &self,
        offset: u64,
        len: usize,
        expected: Option<&Generation>,
        sink: &mut dyn FnMut(&[u8]) -> bool,
    ) -> io::Result<usize> {
        let mut buf = crate::buf::AlignedBuf::zeroed(len);
        let n = self.read_at_generation(offset, buf.as_mut_slice(), expected)?;
        sink(&buf.as_slice()[..n]);
        Ok(n)
    }

    /// The object's identity beyond this machine at the version
    /// `generation` names, for a tier a fleet shares. None (the default):
    /// the object has none (a file's path names it on this machine only),
    /// or `generation` is no version the object remembers.
    fn source_identity(&self, generation: &Generation) -> Option<SourceIdentity> {
        let _ = generation;
        None
    }

    /// Writes all of `data` at `offset` (write-through; the object may grow).
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Makes written data durable (fsync / fdatasync).
    fn sync(&self) -> io::Result<()>;

    /// Deallocates `len` bytes at `offset` (TRIM, discard): afterwards the
    /// range reads as zeros and the object keeps its size. Advisory: a
    /// primary that cannot punch holes returns `ErrorKind::Unsupported` and
    /// changes nothing.
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this primary cannot punch holes",
        ))
    }

    /// Alignment of offset, length and buffer address that `read_at` needs:
    /// 4096 with O_DIRECT, 1 otherwise. The read path reads whole records
    /// into page-aligned buffers, so it always honours 4096.
    fn read_alignment_bytes(&self) -> usize {
        1
    }
}
