//! The on-device format of an L2ARC cache device, version 2 (reads 1): pure encode and
//! decode, no I/O. The byte layout is specified in `docs/format.md`; this
//! comment explains why it is shaped the way it is.
//!
//! A cache device is a circular log. The feeder appends *batches* at the
//! write hand and wraps at the end of the data area, overwriting the oldest
//! batches, so eviction from the device is free: it is simply the hand coming
//! round again. Nothing on the device is ever updated in place except the
//! device header.
//!
//! TWO HEADER COPIES. The header (where the hand is, which log block is the
//! newest) is the only block that is rewritten. A crash during that write
//! can tear it, and a torn sole copy would lose the whole cache. So header
//! number `sequence` goes to copy `sequence % 2`: a write never touches the
//! copy that holds the previous header, and at open the valid copy with the
//! higher sequence wins. A torn write costs at most the last batch, which is
//! then simply not rebuilt.
//!
//! A BATCH ENDS IN ITS LOG BLOCK. Each batch is one sequential write of
//! record payloads followed by the log block that lists them (key hash,
//! location, checksum) and points back at the previous log block. Writing the
//! log block in the same I/O, after the payloads, means that a log block
//! that reads back valid describes payloads that were written with it, and
//! the chain of log blocks from the header backwards is the whole index: at
//! rebuild it is walked newest first, without reading any payload (as in
//! OpenZFS's l2arc_log_blk_phys_t chain). One log block per batch also
//! amortises the index over many records.
//!
//! THE RECORD CHECKSUM COVERS `key_hash`. A record's checksum is
//! `crc32c(key_hash ++ stored bytes)`. A location can go stale (the hand has
//! overwritten it, the index entry was restored from an old log block, an
//! I/O was misdirected): what is there then may be a perfectly well-formed
//! record of *another* key. Mixing the key into the checksum turns every such
//! case into a checksum failure, which the read path treats as a miss, so
//! the cache never returns another record's bytes.
//!
//! EVERYTHING IS 4 KiB ALIGNED. Cache devices are read and written with
//! O_DIRECT, which requires offsets, lengths and buffer addresses aligned to
//! the logical block size; 4 KiB covers every device in use (512e and 4Kn)
//! and is the flash page size, so a batch never shares a page with another
//! and payloads can be read straight into the cache's aligned buffers. The
//! byte-exact stored length of a record is kept in the location word
//! (`tail_bytes`), so alignment costs padding on the device, not precision.
//!
//! SECTOR TABLES FOR LARGE PLAIN RECORDS. A 4 KiB read of a 1 MiB record
//! that the ARC does not hold would otherwise read the whole megabyte from
//! flash, check it, and push a megabyte out of DRAM to keep it: random
//! small reads then run at the flash's bandwidth divided by 256. So a
//! plain record of 256 KiB or more is followed by one block of per-block
//! checksums (each mixing in the key and the block's index, for the reason
//! the record checksum mixes in the key), and a small read takes the
//! blocks under it and that table, nothing else. The table costs a block
//! per record (0.4% at 1 MiB) and no DRAM; a compressed record cannot be
//! read in pieces and gets none.
//!
//! Decoding is defensive: every decoder of bytes read from a device returns a
//! [`FormatError`] rather than panicking, and allocates only after checking a
//! length field against the size of the buffer it came in.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

/// The unit of every offset and size on a cache device.
pub const BLOCK_BYTES: u64 = 4096;
/// Device offsets of header copies A and B.
pub const HEADER_COPY_OFFSETS: [u64; 2] = [0, 4096];
/// Start of the data area (version 1 requires exactly this value).
pub const DATA_START_BYTES: u64 = 1 << 20;
/// The format version of the device header this module writes (it reads 1
/// and 2: version 2 adds `batch_blocks_max`).
pub const FORMAT_VERSION: u32 = 2;
/// The version of log blocks this module writes (it reads 1 and 2: version
/// 2 adds records stored with a sector table, stored-as value 3).
pub const LOG_BLOCK_VERSION: u32 = 2;
/// Offset of `batch_blocks_max` in a version 2 header.
const HEADER_BATCH_BLOCKS_FIELD: usize = 104;

/// The largest batch of a device laid out by this build: about 1/64 of the
/// data area (so the window kept ahead of the write hand costs under 2% of
/// the device), at least a 1 MiB record with its log block, at most
/// [`BATCH_BYTES_MAX`](crate::l2arc::BATCH_BYTES_MAX), and at most a quarter
/// of the data area.
pub fn batch_blocks_for(data_blocks: u32) -> u32 {
    let max = (crate::l2arc::BATCH_BYTES_MAX / BLOCK_BYTES) as u32;
    let one_record = ((1 << 20) / BLOCK_BYTES) as u32 + 2;
    (data_blocks / 64)
        .max(one_record)
        .min(max)
        .min(data_blocks / 4)
        .max(1)
}

/// The largest batch a version 1 header implies (it was not stored).
pub fn legacy_batch_blocks(data_blocks: u32) -> u32 {
    ((crate::l2arc::BATCH_BYTES_MAX / BLOCK_BYTES) as u32).min(data_blocks / 4)
}
/// Bytes of a device header block that are used (the rest of the 4 KiB is zero).
pub const DEVICE_HEADER_BYTES: usize = 128;
/// Size of a log block's fixed header.
pub const LOG_BLOCK_HEADER_BYTES: usize = 128;
/// Size of one log entry.
pub const LOG_ENTRY_BYTES: usize = 20;
/// Size of the `[psize u32][lsize u32]` prefix of a compressed payload.
pub const COMPRESSED_FRAME_HEADER_BYTES: usize = 8;
/// Largest `asize_blocks` a location can hold (9 bits).
pub const MAX_ASIZE_BLOCKS: u16 = 511;
/// Number of device indices a location can hold (4 bits).
pub const MAX_DEVICES: u8 = 16;
/// zstd level used by [`compress`]: 3, the default of OpenZFS's
/// `compression=zstd` and of the zstd tool. On 128 KiB text-like records it
/// compressed as fast as level 1 here (about 0.5 GB/s) with a 10% better
/// ratio and faster decompression; the feeder compresses in the background,
/// while the ratio is capacity on every read. A dataset that wants the
/// fastest codec asks for lz4.
pub const ZSTD_LEVEL: i32 = 3;

const HEADER_MAGIC: [u8; 8] = *b"L2ARCHDR";
const LOG_MAGIC: [u8; 8] = *b"L2ARCLOG";
/// Offset of the CRC field in both the device header and the log block header.
const CRC_FIELD: usize = 124;

/// Everything that can be wrong with bytes read from a cache device.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Fewer bytes than the structure needs.
    #[error("truncated: need {needed} bytes, got {got}")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// Not a structure of ours.
    #[error("bad magic: not a {what} (found {found:02x?})")]
    BadMagic {
        /// What was expected.
        what: &'static str,
        /// The first eight bytes found.
        found: [u8; 8],
    },
    #[error(
        "unsupported format version {0} (this build reads headers and log blocks of versions 1 and 2)"
    )]
    /// A version this build does not read.
    UnsupportedVersion(u32),
    /// Header flags this build does not know.
    #[error("unsupported header flags {0:#x}")]
    UnsupportedFlags(u32),
    /// The stored CRC does not match the bytes.
    #[error("bad checksum in {what}: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum {
        /// What was checked.
        what: &'static str,
        /// The CRC stored.
        stored: u32,
        /// The CRC of the bytes read.
        computed: u32,
    },
    /// A log block whose size field disagrees with what was read.
    #[error("log block size field is {field} bytes but the buffer holds {buffer}")]
    SizeMismatch {
        /// The size the block says it has.
        field: u64,
        /// The bytes read.
        buffer: usize,
    },
    /// A log block claiming more entries than it has room for.
    #[error("log block has {count} entries but its {size} bytes hold at most {capacity}")]
    TooManyEntries {
        /// Entries claimed.
        count: u32,
        /// Size of the block.
        size: usize,
        /// Entries that fit.
        capacity: usize,
    },
    /// A log block of another device (a stale or misdirected block).
    #[error("log block belongs to device {found:032x}, expected {expected:032x}")]
    ForeignDevice {
        /// This device's identity.
        expected: u128,
        /// The identity in the block.
        found: u128,
    },
    /// Fields that contradict each other.
    #[error("inconsistent {0}")]
    Inconsistent(String),
    /// Neither copy of the device header is valid.
    #[error("no valid device header: copy A: {a}; copy B: {b}")]
    NoValidHeader {
        /// What is wrong with copy A.
        a: Box<FormatError>,
        /// What is wrong with copy B.
        b: Box<FormatError>,
    },
    /// Stored bytes that do not decompress.
    #[error("decompression failed: {0}")]
    Decompress(String),
    /// A compression name this build does not know.
    #[error("unknown compression {0:?} (expected off, lz4 or zstd)")]
    UnknownCompression(String),
}

fn inconsistent(what: impl Into<String>) -> FormatError {
    FormatError::Inconsistent(what.into())
}

// ---------------------------------------------------------------------------
// Little-endian field access. Callers check the buffer length first; the
// fixed-size array parameters make the bounds visible to the compiler.

#[inline]
fn rd_u32<const N: usize>(b: &[u8; N], off: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(v)
}

#[inline]
fn rd_u64<const N: usize>(b: &[u8; N], off: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(v)
}

#[inline]
fn rd_u128<const N: usize>(b: &[u8; N], off: usize) -> u128 {
    let mut v = [0u8; 16];
    v.copy_from_slice(&b[off..off + 16]);
    u128::from_le_bytes(v)
}

#[inline]
fn wr(b: &mut [u8], off: usize, bytes: &[u8]) {
    b[off..off + bytes.len()].copy_from_slice(bytes);
}

// ---------------------------------------------------------------------------
// Compression

/// How a record payload is stored (2 bits of the location word).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compression {
    /// Records stored as they are.
    Off = 0,
    /// LZ4 (fast; the default, as in ZFS).
    Lz4 = 1,
    /// Zstandard level 1.
    Zstd = 2,
}

impl Compression {
    /// The value for the 2-bit field; `None` for the invalid value 3.
    pub fn from_bits(bits: u8) -> Option<Compression> {
        match bits {
            0 => Some(Compression::Off),
            1 => Some(Compression::Lz4),
            2 => Some(Compression::Zstd),
            _ => None,
        }
    }

    /// The name used in configs and stats ("off", "lz4", "zstd").
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::Off => "off",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Compression {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Compression::Off),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            _ => Err(FormatError::UnknownCompression(s.to_owned())),
        }
    }
}

// ---------------------------------------------------------------------------
// Location word

const BLOCK_SHIFT: u32 = 0;
const LAP_SHIFT: u32 = 32;
const DEVICE_SHIFT: u32 = 37;
const ASIZE_SHIFT: u32 = 41;
const COMPRESSION_SHIFT: u32 = 50;
const TAIL_SHIFT: u32 = 52;

const LAP_MASK: u64 = (1 << 5) - 1;
const DEVICE_MASK: u64 = (1 << 4) - 1;
const ASIZE_MASK: u64 = (1 << 9) - 1;
const COMPRESSION_MASK: u64 = (1 << 2) - 1;
const TAIL_MASK: u64 = (1 << 12) - 1;
/// The stored-as value of a plain payload followed by a sector table.
const STORED_SECTORED: u64 = 3;

/// The packed u64 location word of `docs/format.md`: where a record payload
/// lies on which device, how big it is and how it is stored.
///
/// A `Location` built from arbitrary bits (e.g. `Location(raw)`) never makes
/// an accessor panic; [`decode_log_block`] rejects entries whose location is
/// not one [`Location::new`] could have built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Location(pub u64);

impl Location {
    /// Packs a location. `lap` is stored modulo 32. Panics on out-of-range
    /// arguments (they are programming errors): `device < 16`,
    /// `1 <= asize_blocks <= 511`, `tail_bytes < 4096`.
    pub fn new(
        block: u32,
        lap: u32,
        device: u8,
        asize_blocks: u16,
        compression: Compression,
        tail_bytes: u16,
    ) -> Location {
        assert!(device < MAX_DEVICES, "device index {device} out of range");
        assert!(
            (1..=MAX_ASIZE_BLOCKS).contains(&asize_blocks),
            "asize_blocks {asize_blocks} out of range 1..=511"
        );
        assert!(
            u64::from(tail_bytes) < BLOCK_BYTES,
            "tail_bytes {tail_bytes} out of range 0..4096"
        );
        Location(
            (u64::from(block) << BLOCK_SHIFT)
                | ((u64::from(lap) & LAP_MASK) << LAP_SHIFT)
                | (u64::from(device) << DEVICE_SHIFT)
                | (u64::from(asize_blocks) << ASIZE_SHIFT)
                | ((compression as u64) << COMPRESSION_SHIFT)
                | (u64::from(tail_bytes) << TAIL_SHIFT),
        )
    }

    /// Packs the location of a plain payload of `payload_blocks` followed
    /// by its sector table block. Panics as [`Location::new`] does, and
    /// unless `1 <= payload_blocks <= 510`.
    pub fn new_sectored(
        block: u32,
        lap: u32,
        device: u8,
        payload_blocks: u16,
        tail_bytes: u16,
    ) -> Location {
        assert!(
            (1..MAX_ASIZE_BLOCKS).contains(&payload_blocks),
            "payload_blocks {payload_blocks} out of range 1..511"
        );
        let plain = Location::new(
            block,
            lap,
            device,
            payload_blocks + 1,
            Compression::Off,
            tail_bytes,
        );
        Location(plain.0 | (STORED_SECTORED << COMPRESSION_SHIFT))
    }

    /// 4 KiB block number from the start of the device.
    pub fn block(self) -> u32 {
        (self.0 >> BLOCK_SHIFT) as u32
    }

    /// The lap the block was written in, modulo 32.
    pub fn lap_mod32(self) -> u8 {
        ((self.0 >> LAP_SHIFT) & LAP_MASK) as u8
    }

    /// The device slot (0..16).
    pub fn device(self) -> u8 {
        ((self.0 >> DEVICE_SHIFT) & DEVICE_MASK) as u8
    }

    /// 4 KiB blocks the payload occupies.
    pub fn asize_blocks(self) -> u16 {
        ((self.0 >> ASIZE_SHIFT) & ASIZE_MASK) as u16
    }

    /// How the payload is coded. A record stored with a sector table
    /// (stored-as value 3) is stored as it is: `Some(Off)`.
    pub fn compression(self) -> Option<Compression> {
        if self.sectored() {
            return Some(Compression::Off);
        }
        Compression::from_bits(((self.0 >> COMPRESSION_SHIFT) & COMPRESSION_MASK) as u8)
    }

    /// Whether the payload is followed by a sector table (stored-as value
    /// 3, log blocks of version 2): then 4 KiB pieces of it can be read
    /// and checked alone.
    pub fn sectored(self) -> bool {
        (self.0 >> COMPRESSION_SHIFT) & COMPRESSION_MASK == STORED_SECTORED
    }

    /// Device offset of the sector table (the last block), if there is one.
    pub fn sector_table_offset_bytes(self) -> Option<u64> {
        self.sectored()
            .then(|| (self.end_block() - 1) * BLOCK_BYTES)
    }

    /// 4 KiB blocks of the payload alone (without a sector table).
    pub fn payload_blocks(self) -> u16 {
        self.asize_blocks()
            .saturating_sub(u16::from(self.sectored()))
    }

    /// Zero padding after the stored bytes in the last block.
    pub fn tail_bytes(self) -> u16 {
        ((self.0 >> TAIL_SHIFT) & TAIL_MASK) as u16
    }

    /// The same location on device `device` (panics unless `device < 16`).
    pub fn with_device(self, device: u8) -> Location {
        assert!(device < MAX_DEVICES, "device index {device} out of range");
        Location((self.0 & !(DEVICE_MASK << DEVICE_SHIFT)) | (u64::from(device) << DEVICE_SHIFT))
    }

    /// Length of the stored payload: `payload_blocks * 4096 - tail_bytes`
    /// (0 for the invalid `asize_blocks == 0`).
    pub fn stored_bytes(self) -> usize {
        (usize::from(self.payload_blocks()) * BLOCK_BYTES as usize)
            .saturating_sub(usize::from(self.tail_bytes()))
    }

    /// Device offset of the payload in bytes.
    pub fn offset_bytes(self) -> u64 {
        u64::from(self.block()) * BLOCK_BYTES
    }

    /// Length of the payload on the device (whole blocks) in bytes.
    pub fn asize_bytes(self) -> usize {
        usize::from(self.asize_blocks()) * BLOCK_BYTES as usize
    }

    /// First block after the payload (`block + asize_blocks`, as u64 so it
    /// cannot overflow).
    pub fn end_block(self) -> u64 {
        u64::from(self.block()) + u64::from(self.asize_blocks())
    }
}

/// One index entry of a log block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// Hash of the record's identity (dataset, object, record, generation).
    pub key_hash: u64,
    /// Where the stored bytes are.
    pub location: Location,
    /// [`record_checksum`] of the stored payload.
    pub checksum: u32,
}

impl LogEntry {
    fn encode(&self, out: &mut [u8; LOG_ENTRY_BYTES]) {
        wr(out, 0, &self.key_hash.to_le_bytes());
        wr(out, 8, &self.location.0.to_le_bytes());
        wr(out, 16, &self.checksum.to_le_bytes());
    }

    fn decode(b: &[u8; LOG_ENTRY_BYTES]) -> LogEntry {
        LogEntry {
            key_hash: rd_u64(b, 0),
            location: Location(rd_u64(b, 8)),
            checksum: rd_u32(b, 16),
        }
    }
}

// ---------------------------------------------------------------------------
// Pointers to log blocks

/// Where a log block is and what its whole content checksums to
/// (`crc32c` of all `size_bytes`, including its own CRC field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPointer {
    /// Offset of the log block on the device.
    pub offset_bytes: u64,
    /// Size of the log block.
    pub size_bytes: u32,
    /// CRC-32C of the whole log block.
    pub crc: u32,
}

impl LogPointer {
    fn encode(ptr: Option<LogPointer>, out: &mut [u8], off: usize) {
        let p = ptr.unwrap_or(LogPointer {
            offset_bytes: 0,
            size_bytes: 0,
            crc: 0,
        });
        wr(out, off, &p.offset_bytes.to_le_bytes());
        wr(out, off + 8, &p.size_bytes.to_le_bytes());
        wr(out, off + 12, &p.crc.to_le_bytes());
    }

    /// Reads a pointer and checks what can be checked without knowing the
    /// data area: offset 0 means none (then size and crc must be 0 too),
    /// otherwise the offset is 4 KiB aligned and in the data area, and the
    /// size a nonzero multiple of 4 KiB.
    fn decode<const N: usize>(
        b: &[u8; N],
        off: usize,
        what: &str,
    ) -> Result<Option<LogPointer>, FormatError> {
        let p = LogPointer {
            offset_bytes: rd_u64(b, off),
            size_bytes: rd_u32(b, off + 8),
            crc: rd_u32(b, off + 12),
        };
        if p.offset_bytes == 0 {
            if p.size_bytes != 0 || p.crc != 0 {
                return Err(inconsistent(format!(
                    "{what}: null pointer with size {} and crc {:#x}",
                    p.size_bytes, p.crc
                )));
            }
            return Ok(None);
        }
        if !p.offset_bytes.is_multiple_of(BLOCK_BYTES) || p.offset_bytes < DATA_START_BYTES {
            return Err(inconsistent(format!(
                "{what}: offset {} is not a 4 KiB aligned offset in the data area",
                p.offset_bytes
            )));
        }
        if p.size_bytes == 0 || !u64::from(p.size_bytes).is_multiple_of(BLOCK_BYTES) {
            return Err(inconsistent(format!(
                "{what}: size {} is not a nonzero multiple of 4 KiB",
                p.size_bytes
            )));
        }
        Ok(Some(p))
    }

    /// Device offset just past the log block.
    pub fn end_bytes(self) -> u64 {
        self.offset_bytes + u64::from(self.size_bytes)
    }
}

/// The CRC-32C of a log block's whole content: the value a [`LogPointer`]
/// to it carries. Check it against the pointer after reading the block.
pub fn log_block_content_crc(buf: &[u8]) -> u32 {
    crc32c_bulk_append(0, buf)
}

/// The CRC-32C of `data` continued from `crc`, as `crc32c::crc32c_append`
/// computes it, for the bulk of what is checked: record payloads, sector
/// blocks, log blocks. `crc-fast` folds the data with carry-less multiplies
/// (AVX-512 where the CPU has it) where the `crc32c` crate runs the CRC
/// instruction: measured here, 8 KiB in cache in 66 ns against 329 ns, and,
/// in the read queue, on bytes the device has just written, ~1300 CPU
/// cycles against ~1930. Same polynomial, same values (a test checks them
/// against each other); small header fields keep the `crc32c` crate.
pub(crate) fn crc32c_bulk_append(crc: u32, data: &[u8]) -> u32 {
    let mut digest =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    digest.update(data);
    digest.finalize() as u32
}

// ---------------------------------------------------------------------------
// Device header

/// The device header (both copies have this layout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceHeader {
    /// Identity of the cache the device belongs to.
    pub cache_guid: u128,
    /// Identity of this device (log blocks carry it).
    pub device_guid: u128,
    /// Size of the device when formatted.
    pub device_size_bytes: u64,
    /// First byte of the circular log.
    pub data_start_bytes: u64,
    /// End of the circular log (exclusive).
    pub data_end_bytes: u64,
    /// Bumped at every header write; the copy with the higher valid sequence wins.
    pub sequence: u64,
    /// The 4 KiB block number where the next batch starts.
    pub hand_block: u32,
    /// How many times the hand has wrapped.
    pub lap: u32,
    /// The largest batch the writer may write, in blocks: the window ahead
    /// of the hand that a crash mid-batch may have torn (version 2; for a
    /// version 1 header, [`legacy_batch_blocks`]).
    pub batch_blocks_max: u32,
    /// The newest log block: where a rebuild starts walking.
    pub newest_log: Option<LogPointer>,
}

impl DeviceHeader {
    /// Which header copy (index into [`HEADER_COPY_OFFSETS`]) this header is
    /// written to: `sequence % 2`.
    pub fn copy_index(&self) -> usize {
        (self.sequence % 2) as usize
    }

    /// Encodes into a whole 4 KiB header block, zero-filling the unused part.
    pub fn encode(&self, out: &mut [u8; 4096]) {
        out.fill(0);
        wr(out, 0, &HEADER_MAGIC);
        wr(out, 8, &FORMAT_VERSION.to_le_bytes());
        // 12: flags, 0
        wr(out, 16, &self.cache_guid.to_le_bytes());
        wr(out, 32, &self.device_guid.to_le_bytes());
        wr(out, 48, &self.device_size_bytes.to_le_bytes());
        wr(out, 56, &self.data_start_bytes.to_le_bytes());
        wr(out, 64, &self.data_end_bytes.to_le_bytes());
        wr(out, 72, &self.sequence.to_le_bytes());
        wr(out, 80, &self.hand_block.to_le_bytes());
        wr(out, 84, &self.lap.to_le_bytes());
        LogPointer::encode(self.newest_log, out, 88);
        wr(
            out,
            HEADER_BATCH_BLOCKS_FIELD,
            &self.batch_blocks_max.to_le_bytes(),
        );
        // 108..124: reserved, 0
        let crc = crc32c::crc32c(&out[..CRC_FIELD]);
        wr(out, CRC_FIELD, &crc.to_le_bytes());
    }

    /// Decodes and validates a header block (only its first 128 bytes are
    /// read; a longer buffer, e.g. the whole 4 KiB block, is fine). Checks, in
    /// order: length, magic, version, CRC, flags, then internal consistency:
    /// data area start == [`DATA_START_BYTES`], end a multiple of 4 KiB with
    /// start < end <= device size and at most 2^32 blocks, hand within
    /// `[start/4096, end/4096]`, newest log block (if any) 4 KiB aligned,
    /// nonzero multiple of 4 KiB, and inside the data area.
    pub fn decode(block: &[u8]) -> Result<DeviceHeader, FormatError> {
        let b = checked_preamble(block, HEADER_MAGIC, "device header", &[1, FORMAT_VERSION])?;
        let version = rd_u32(b, 8);
        let stored = rd_u32(b, CRC_FIELD);
        let computed = crc32c::crc32c(&b[..CRC_FIELD]);
        if stored != computed {
            return Err(FormatError::BadChecksum {
                what: "device header",
                stored,
                computed,
            });
        }
        let flags = rd_u32(b, 12);
        if flags != 0 {
            return Err(FormatError::UnsupportedFlags(flags));
        }
        let h = DeviceHeader {
            cache_guid: rd_u128(b, 16),
            device_guid: rd_u128(b, 32),
            device_size_bytes: rd_u64(b, 48),
            data_start_bytes: rd_u64(b, 56),
            data_end_bytes: rd_u64(b, 64),
            sequence: rd_u64(b, 72),
            hand_block: rd_u32(b, 80),
            lap: rd_u32(b, 84),
            batch_blocks_max: rd_u32(b, HEADER_BATCH_BLOCKS_FIELD),
            newest_log: LogPointer::decode(b, 88, "device header newest log pointer")?,
        };
        let h = if version == 1 {
            let data_blocks = (h.data_end_bytes.saturating_sub(h.data_start_bytes) / BLOCK_BYTES)
                .min(u64::from(u32::MAX)) as u32;
            DeviceHeader {
                batch_blocks_max: legacy_batch_blocks(data_blocks),
                ..h
            }
        } else {
            h
        };
        h.check()?;
        Ok(h)
    }

    fn check(&self) -> Result<(), FormatError> {
        let (start, end) = (self.data_start_bytes, self.data_end_bytes);
        if start != DATA_START_BYTES {
            return Err(inconsistent(format!(
                "device header: data area start {start} is not {DATA_START_BYTES}"
            )));
        }
        if !end.is_multiple_of(BLOCK_BYTES) || end <= start || end > self.device_size_bytes {
            return Err(inconsistent(format!(
                "device header: data area end {end} is not a 4 KiB multiple in ({start}, {}]",
                self.device_size_bytes
            )));
        }
        if end / BLOCK_BYTES > u64::from(u32::MAX) {
            return Err(inconsistent(format!(
                "device header: data area end {end} is beyond block 2^32 - 1"
            )));
        }
        let hand = u64::from(self.hand_block);
        if hand < start / BLOCK_BYTES || hand > end / BLOCK_BYTES {
            return Err(inconsistent(format!(
                "device header: hand block {hand} outside the data area [{}, {}]",
                start / BLOCK_BYTES,
                end / BLOCK_BYTES
            )));
        }
        let data_blocks = (end - start) / BLOCK_BYTES;
        if self.batch_blocks_max == 0 || u64::from(self.batch_blocks_max) > data_blocks / 2 {
            return Err(inconsistent(format!(
                "device header: batch of {} blocks does not fit twice in a data area of {data_blocks}",
                self.batch_blocks_max
            )));
        }
        if let Some(p) = self.newest_log
            && p.end_bytes() > end
        {
            return Err(inconsistent(format!(
                "device header: newest log block {}+{} ends beyond the data area end {end}",
                p.offset_bytes, p.size_bytes
            )));
        }
        Ok(())
    }

    /// Picks the newer valid copy of two header blocks (copy A at offset 0,
    /// copy B at 4096). Returns the header and which copy it came from (0 for
    /// `a`, 1 for `b`); with equal sequences (not written by this format's
    /// writer) the copy `sequence % 2` wins. Fails with
    /// [`FormatError::NoValidHeader`], carrying both reasons, if neither copy
    /// is valid.
    ///
    /// The caller should also check that both copies, if valid, carry the
    /// same cache and device guids; this function does not, so that a header
    /// rewritten by a re-initialisation still opens.
    pub fn choose(a: &[u8], b: &[u8]) -> Result<(DeviceHeader, usize), FormatError> {
        match (Self::decode(a), Self::decode(b)) {
            (Ok(ha), Ok(hb)) => {
                let pick_b = match hb.sequence.cmp(&ha.sequence) {
                    std::cmp::Ordering::Greater => true,
                    std::cmp::Ordering::Less => false,
                    std::cmp::Ordering::Equal => ha.sequence % 2 == 1,
                };
                Ok(if pick_b { (hb, 1) } else { (ha, 0) })
            }
            (Ok(ha), Err(_)) => Ok((ha, 0)),
            (Err(_), Ok(hb)) => Ok((hb, 1)),
            (Err(ea), Err(eb)) => Err(FormatError::NoValidHeader {
                a: Box::new(ea),
                b: Box::new(eb),
            }),
        }
    }
}

// ---------------------------------------------------------------------------
// Log blocks

/// The fixed header of a log block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogBlockHeader {
    /// The device the log block was written on.
    pub device_guid: u128,
    /// 1 for the first log block of a device, then +1 each.
    pub sequence: u64,
    /// The lap when written (full u32; entries carry it modulo 32).
    pub lap: u32,
    /// First block of the batch: the batch spans from there to the end of
    /// this log block.
    pub first_block: u32,
    /// The previous log block (older batch), if any.
    pub prev: Option<LogPointer>,
    /// Hints: the log blocks 2, 3 and 4 back, so that a rebuild can read
    /// them ahead of the chain (which still decides what it walks: a hint
    /// is used only if it equals the pointer the chain reaches). Stored in
    /// what format version 2 reserved; a malformed hint reads as none.
    pub read_ahead: [Option<LogPointer>; LOG_READ_AHEAD_POINTERS],
    /// Entries in the block.
    pub entry_count: u32,
    /// Size of the whole block.
    pub size_bytes: u32,
}

/// Read-ahead hints in a log block (see [`LogBlockHeader::read_ahead`]).
pub const LOG_READ_AHEAD_POINTERS: usize = 3;
/// Offset of the first read-ahead hint in a log block (16 bytes each).
const LOG_READ_AHEAD_FIELD: usize = 68;
const _: () = assert!(LOG_READ_AHEAD_FIELD + 16 * LOG_READ_AHEAD_POINTERS <= CRC_FIELD);

/// The 128-byte preamble of a header or log block, once its magic and
/// version are right (both structures start the same way).
fn checked_preamble<'a>(
    buf: &'a [u8],
    expected_magic: [u8; 8],
    what: &'static str,
    versions: &[u32],
) -> Result<&'a [u8; 128], FormatError> {
    const _: () = assert!(DEVICE_HEADER_BYTES == 128 && LOG_BLOCK_HEADER_BYTES == 128);
    let b: &[u8; 128] = buf.first_chunk().ok_or(FormatError::Truncated {
        needed: 128,
        got: buf.len(),
    })?;
    let magic: [u8; 8] = *b.first_chunk().expect("128 >= 8");
    if magic != expected_magic {
        return Err(FormatError::BadMagic { what, found: magic });
    }
    let version = rd_u32(b, 8);
    if !versions.contains(&version) {
        return Err(FormatError::UnsupportedVersion(version));
    }
    Ok(b)
}

/// Size of a log block holding `entries` entries: `128 + 20 n` rounded up to
/// a multiple of 4096.
pub fn log_block_size_bytes(entries: usize) -> usize {
    (LOG_BLOCK_HEADER_BYTES + LOG_ENTRY_BYTES * entries).next_multiple_of(BLOCK_BYTES as usize)
}

/// Most entries a log block of `size_bytes` can hold.
pub fn log_block_capacity(size_bytes: usize) -> usize {
    size_bytes.saturating_sub(LOG_BLOCK_HEADER_BYTES) / LOG_ENTRY_BYTES
}

/// Encodes a log block into `out`, overwriting all of it, and returns the
/// CRC-32C of the whole block (the value that goes into a [`LogPointer`] to
/// it).
///
/// Panics (programming errors) unless `out.len() ==
/// log_block_size_bytes(entries.len())`, `header.entry_count ==
/// entries.len()` and `header.size_bytes == out.len()`.
pub fn encode_log_block(header: &LogBlockHeader, entries: &[LogEntry], out: &mut [u8]) -> u32 {
    let size = log_block_size_bytes(entries.len());
    assert_eq!(out.len(), size, "log block buffer has the wrong size");
    assert_eq!(
        header.entry_count as usize,
        entries.len(),
        "log block header entry_count does not match the entries"
    );
    assert_eq!(
        header.size_bytes as usize, size,
        "log block header size_bytes does not match the entries"
    );
    out.fill(0);
    wr(out, 0, &LOG_MAGIC);
    wr(out, 8, &LOG_BLOCK_VERSION.to_le_bytes());
    wr(out, 12, &header.entry_count.to_le_bytes());
    wr(out, 16, &header.device_guid.to_le_bytes());
    wr(out, 32, &header.sequence.to_le_bytes());
    wr(out, 40, &header.lap.to_le_bytes());
    wr(out, 44, &header.first_block.to_le_bytes());
    LogPointer::encode(header.prev, out, 48);
    wr(out, 64, &header.size_bytes.to_le_bytes());
    for (i, hint) in header.read_ahead.iter().enumerate() {
        LogPointer::encode(*hint, out, LOG_READ_AHEAD_FIELD + 16 * i);
    }
    // 116..124: reserved, 0; 124: CRC, 0 while computing it.
    let body = &mut out[LOG_BLOCK_HEADER_BYTES..];
    for (entry, slot) in entries.iter().zip(body.chunks_exact_mut(LOG_ENTRY_BYTES)) {
        entry.encode(slot.try_into().expect("chunk of LOG_ENTRY_BYTES"));
    }
    // One pass over the body serves both CRCs: the self CRC (field as 0) and
    // the content CRC (field as written).
    let head_crc = crc32c::crc32c(&out[..CRC_FIELD]);
    let body_crc = crc32c_bulk_append(0, &out[LOG_BLOCK_HEADER_BYTES..]);
    let body_len = out.len() - LOG_BLOCK_HEADER_BYTES;
    let self_crc =
        crc32c::crc32c_combine(crc32c::crc32c_append(head_crc, &[0; 4]), body_crc, body_len);
    let self_crc_bytes = self_crc.to_le_bytes();
    wr(out, CRC_FIELD, &self_crc_bytes);
    crc32c::crc32c_combine(
        crc32c::crc32c_append(head_crc, &self_crc_bytes),
        body_crc,
        body_len,
    )
}

/// Decodes and validates a log block read from the device. Checks, in order:
/// length (at least a header, [`FormatError::Truncated`] if the size field
/// says more than the buffer holds), magic, version, size field equal to
/// `buf.len()` and a multiple of 4 KiB, self CRC, device guid, entry count
/// (fits, and the size is exactly `log_block_size_bytes(count)`), sequence
/// nonzero, previous pointer well formed, and every entry: `key_hash != 0`,
/// `asize_blocks >= 1`, a valid compression, lap equal to the block's lap
/// modulo 32, and inside the batch (`first_block <= block` and the payload
/// ends before the 2^32 block limit).
///
/// It does not check the content CRC a pointer carries: compare
/// [`log_block_content_crc`] of the buffer with it.
pub fn decode_log_block(
    buf: &[u8],
    expected_device_guid: u128,
) -> Result<(LogBlockHeader, Vec<LogEntry>), FormatError> {
    let b = checked_preamble(buf, LOG_MAGIC, "log block", &[1, LOG_BLOCK_VERSION])?;
    let version = rd_u32(b, 8);
    let size_bytes = check_log_block_size(b, buf)?;
    let size = size_bytes as usize;
    check_log_block_crc(b, buf)?;
    let device_guid = rd_u128(b, 16);
    if device_guid != expected_device_guid {
        return Err(FormatError::ForeignDevice {
            expected: expected_device_guid,
            found: device_guid,
        });
    }
    let entry_count = rd_u32(b, 12);
    let capacity = log_block_capacity(size);
    if entry_count as usize > capacity {
        return Err(FormatError::TooManyEntries {
            count: entry_count,
            size,
            capacity,
        });
    }
    let n = entry_count as usize;
    if log_block_size_bytes(n) != size {
        return Err(inconsistent(format!(
            "log block: {size} bytes for {n} entries, which need {}",
            log_block_size_bytes(n)
        )));
    }
    let header = LogBlockHeader {
        device_guid,
        sequence: rd_u64(b, 32),
        lap: rd_u32(b, 40),
        first_block: rd_u32(b, 44),
        prev: LogPointer::decode(b, 48, "log block previous pointer")?,
        read_ahead: std::array::from_fn(|i| {
            LogPointer::decode(b, LOG_READ_AHEAD_FIELD + 16 * i, "read-ahead hint")
                .ok()
                .flatten()
        }),
        entry_count,
        size_bytes,
    };
    if header.sequence == 0 {
        return Err(inconsistent("log block: sequence 0"));
    }
    let entries = decode_log_entries(
        &buf[LOG_BLOCK_HEADER_BYTES..LOG_BLOCK_HEADER_BYTES + n * LOG_ENTRY_BYTES],
        &header,
        version,
    )?;
    Ok((header, entries))
}

/// The size field: equal to the buffer's length and whole 4 KiB blocks.
fn check_log_block_size(b: &[u8; LOG_BLOCK_HEADER_BYTES], buf: &[u8]) -> Result<u32, FormatError> {
    let size_bytes = rd_u32(b, 64);
    let size = size_bytes as usize;
    if size > buf.len() {
        return Err(FormatError::Truncated {
            needed: size,
            got: buf.len(),
        });
    }
    if size != buf.len() {
        return Err(FormatError::SizeMismatch {
            field: u64::from(size_bytes),
            buffer: buf.len(),
        });
    }
    if !(size as u64).is_multiple_of(BLOCK_BYTES) {
        return Err(inconsistent(format!(
            "log block: size {size} is not a multiple of 4 KiB"
        )));
    }
    Ok(size_bytes)
}

/// The block's own CRC, computed with its CRC field as zeros.
fn check_log_block_crc(b: &[u8; LOG_BLOCK_HEADER_BYTES], buf: &[u8]) -> Result<(), FormatError> {
    let stored = rd_u32(b, CRC_FIELD);
    let computed = crc32c_bulk_append(
        crc32c::crc32c_append(crc32c::crc32c(&b[..CRC_FIELD]), &[0; 4]),
        &buf[LOG_BLOCK_HEADER_BYTES..],
    );
    if stored != computed {
        return Err(FormatError::BadChecksum {
            what: "log block",
            stored,
            computed,
        });
    }
    Ok(())
}

/// Every entry of a log block, each checked against its block's header.
fn decode_log_entries(
    raw_entries: &[u8],
    header: &LogBlockHeader,
    version: u32,
) -> Result<Vec<LogEntry>, FormatError> {
    debug_assert!(raw_entries.len().is_multiple_of(LOG_ENTRY_BYTES));
    let lap_mod32 = (header.lap % 32) as u8;
    // The caller checked the count against the block's capacity, so this
    // allocation is bounded by the buffer's length.
    let mut entries = Vec::with_capacity(raw_entries.len() / LOG_ENTRY_BYTES);
    for (i, raw) in raw_entries.chunks_exact(LOG_ENTRY_BYTES).enumerate() {
        let e = LogEntry::decode(raw.try_into().expect("chunk of LOG_ENTRY_BYTES"));
        let loc = e.location;
        let problem = if e.key_hash == 0 {
            Some("key_hash 0")
        } else if loc.asize_blocks() == 0 {
            Some("asize_blocks 0")
        } else if loc.sectored() && version < 2 {
            Some("stored-as 3 (a sector table) in a version 1 log block")
        } else if loc.sectored() && loc.asize_blocks() < 2 {
            Some("a sector table without a payload block")
        } else if loc.lap_mod32() != lap_mod32 {
            Some("lap differs from the log block's")
        } else if loc.block() < header.first_block {
            Some("block before the batch's first block")
        } else if loc.end_block() > 1 << 32 {
            Some("payload beyond 2^32 blocks")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(inconsistent(format!(
                "log block entry {i}: {problem} (location {:#018x})",
                loc.0
            )));
        }
        entries.push(e);
    }
    Ok(entries)
}

// ---------------------------------------------------------------------------
// Record payloads

/// A record's checksum: `crc32c(key_hash as 8 LE bytes ++ stored)`, where
/// `stored` is the payload exactly as stored (`Location::stored_bytes` long,
/// without the padding).
pub fn record_checksum(key_hash: u64, stored: &[u8]) -> u32 {
    crc32c_bulk_append(crc32c::crc32c(&key_hash.to_le_bytes()), stored)
}

// ---------------------------------------------------------------------------
// Sector tables

/// Plain records at least this long are written with a sector table, so
/// that a small read can take 4 KiB pieces of them from flash instead of
/// the whole record, unless the dataset says otherwise
/// (`DatasetConfig::sector_table_min_bytes`). The table costs a block:
/// under 1.6% from here up.
pub const SECTOR_TABLE_RECORD_BYTES_MIN: usize = 256 * 1024;

/// The smallest records a dataset may ask sector tables for: a table block
/// costs 1/16 of a 64 KiB record, and a small read is one of at most 1/16
/// of its record.
pub const SECTOR_TABLE_RECORD_BYTES_FLOOR: usize = 64 * 1024;

/// The checksum of payload block `index` of a record in its sector table:
/// `crc32c(key_hash as 8 LE bytes ++ index as 4 LE bytes ++ the 4096
/// bytes as stored, padding included)`. The key and the position are
/// mixed in for the reason the record checksum mixes the key in: a block
/// of another record, or of another place in this one, fails the check.
pub fn sector_checksum(key_hash: u64, index: u32, block: &[u8]) -> u32 {
    debug_assert_eq!(block.len(), BLOCK_BYTES as usize);
    let seed = crc32c::crc32c_append(
        crc32c::crc32c(&key_hash.to_le_bytes()),
        &index.to_le_bytes(),
    );
    crc32c_bulk_append(seed, block)
}

/// Fills `table` (one 4 KiB block) with the [`sector_checksum`] of every
/// 4 KiB block of `payload` (whole blocks, padding included), as u32 LE
/// from offset 0, and zeros after them.
pub fn encode_sector_table(key_hash: u64, payload: &[u8], table: &mut [u8]) {
    assert_eq!(table.len(), BLOCK_BYTES as usize);
    assert!(payload.len().is_multiple_of(BLOCK_BYTES as usize));
    let blocks = payload.len() / BLOCK_BYTES as usize;
    assert!(
        blocks * 4 <= table.len(),
        "{blocks} blocks do not fit one table"
    );
    for (i, block) in payload.chunks_exact(BLOCK_BYTES as usize).enumerate() {
        let crc = sector_checksum(key_hash, i as u32, block);
        table[i * 4..i * 4 + 4].copy_from_slice(&crc.to_le_bytes());
    }
    table[blocks * 4..].fill(0);
}

/// Checks payload blocks `first..` (`blocks`, whole 4 KiB blocks read from
/// the device) against a sector table block.
pub fn check_sectors(key_hash: u64, table: &[u8], first: u32, blocks: &[u8]) -> bool {
    blocks
        .chunks_exact(BLOCK_BYTES as usize)
        .enumerate()
        .all(|(i, block)| {
            let index = first + i as u32;
            let at = index as usize * 4;
            table.get(at..at + 4).is_some_and(|stored| {
                stored == sector_checksum(key_hash, index, block).to_le_bytes()
            })
        })
}

/// Writes a compressed payload `[psize u32][lsize u32][compressed]` into
/// `out` and returns its stored length (`8 + compressed.len()`). Zeroes
/// `out` after that up to the next 4 KiB boundary (or its end), so a buffer
/// of whole blocks is ready to write. Panics if `out` is too small or
/// `compressed` is longer than `u32::MAX`.
pub fn encode_compressed_frame(lsize: u32, compressed: &[u8], out: &mut [u8]) -> usize {
    let psize = u32::try_from(compressed.len()).expect("compressed payload over 4 GiB");
    let stored = COMPRESSED_FRAME_HEADER_BYTES + compressed.len();
    assert!(
        out.len() >= stored,
        "compressed frame of {stored} bytes does not fit in {}",
        out.len()
    );
    wr(out, 0, &psize.to_le_bytes());
    wr(out, 4, &lsize.to_le_bytes());
    out[COMPRESSED_FRAME_HEADER_BYTES..stored].copy_from_slice(compressed);
    let pad_end = stored.next_multiple_of(BLOCK_BYTES as usize).min(out.len());
    out[stored..pad_end].fill(0);
    stored
}

/// Splits a stored compressed payload into its logical size and compressed
/// bytes. `stored` must be exactly the stored bytes (`Location::stored_bytes`
/// long): `8 + psize` must equal its length, and `1 <= lsize <= lsize_max`.
pub fn decode_compressed_frame(stored: &[u8], lsize_max: u32) -> Result<(u32, &[u8]), FormatError> {
    let Some((head, compressed)) = stored.split_first_chunk::<COMPRESSED_FRAME_HEADER_BYTES>()
    else {
        return Err(FormatError::Truncated {
            needed: COMPRESSED_FRAME_HEADER_BYTES,
            got: stored.len(),
        });
    };
    let psize = rd_u32(head, 0);
    let lsize = rd_u32(head, 4);
    if psize as usize > compressed.len() {
        return Err(FormatError::Truncated {
            needed: COMPRESSED_FRAME_HEADER_BYTES + psize as usize,
            got: stored.len(),
        });
    }
    if psize as usize != compressed.len() {
        return Err(inconsistent(format!(
            "compressed frame: psize {psize} but {} bytes stored after the frame header",
            compressed.len()
        )));
    }
    if lsize == 0 || lsize > lsize_max {
        return Err(inconsistent(format!(
            "compressed frame: lsize {lsize} outside 1..={lsize_max}"
        )));
    }
    Ok((lsize, compressed))
}

thread_local! {
    static ZSTD_COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { RefCell::new(None) };
    static ZSTD_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// Compresses `data` into `out` (the raw LZ4 block or zstd frame, without
/// the `[psize][lsize]` prefix: pass it to [`encode_compressed_frame`]) if
/// that saves at least 1/8 of the record once framed:
/// `psize + 8 <= lsize - lsize / 8`. Returns false, with `out` cleared, when
/// it does not (store the record uncompressed), for `Compression::Off`, and
/// for inputs over 4 GiB. zstd uses [`ZSTD_LEVEL`] and a per-thread context.
pub fn compress(data: &[u8], compression: Compression, out: &mut Vec<u8>) -> bool {
    out.clear();
    let lsize = data.len();
    if compression == Compression::Off || u32::try_from(lsize).is_err() {
        return false;
    }
    let budget = lsize - lsize / 8;
    let Some(max_psize) = budget.checked_sub(COMPRESSED_FRAME_HEADER_BYTES) else {
        return false;
    };
    if looks_incompressible(data) {
        return false;
    }
    let psize = match compression {
        Compression::Off => None,
        Compression::Lz4 => {
            // lz4_flex wants room for the worst case; the budget is checked after.
            out.resize(lz4_flex::block::get_maximum_output_size(lsize), 0);
            lz4_flex::block::compress_into(data, out).ok()
        }
        Compression::Zstd => {
            // zstd stops with an error as soon as the output exceeds the budget.
            out.resize(max_psize, 0);
            ZSTD_COMPRESSOR.with(|cell| {
                let mut slot = cell.borrow_mut();
                if slot.is_none() {
                    *slot = zstd::bulk::Compressor::new(ZSTD_LEVEL).ok();
                }
                slot.as_mut()?
                    .compress_to_buffer(data, out.as_mut_slice())
                    .ok()
            })
        }
    };
    match psize {
        Some(psize) if psize <= max_psize => {
            out.truncate(psize);
            true
        }
        _ => {
            out.clear();
            false
        }
    }
}

/// Records at least this long are probed before they are compressed.
const COMPRESS_PROBE_RECORD_BYTES_MIN: usize = 32 * 1024;
/// Bytes of each probe sample.
const COMPRESS_PROBE_SAMPLE_BYTES: usize = 4096;

/// Early abort: whether LZ4 saves less than 1/8 on a 4 KiB sample at the
/// start of a record and on one in its middle. Incompressible records
/// (media, encrypted or already compressed data) are then stored as they
/// are without compressing them whole, which on such data cost the feeder
/// most of its time (it kept a 256 MiB re-read over NBD from flash: with
/// LZ4 attempted on random bytes, 88-95% L2 hits on the second pass, with
/// compression off 100%). A record that compresses in neither sample but
/// would as a whole is stored plain: capacity, never correctness.
fn looks_incompressible(data: &[u8]) -> bool {
    if data.len() < COMPRESS_PROBE_RECORD_BYTES_MIN {
        return false;
    }
    let mut out = [0u8; lz4_flex::block::get_maximum_output_size(COMPRESS_PROBE_SAMPLE_BYTES)];
    let middle = (data.len() / 2) / COMPRESS_PROBE_SAMPLE_BYTES * COMPRESS_PROBE_SAMPLE_BYTES;
    [0, middle].into_iter().all(|at| {
        let sample = &data[at..at + COMPRESS_PROBE_SAMPLE_BYTES];
        lz4_flex::block::compress_into(sample, &mut out).map_or(true, |n| {
            n > COMPRESS_PROBE_SAMPLE_BYTES - COMPRESS_PROBE_SAMPLE_BYTES / 8
        })
    })
}

/// Decompresses `compressed` (the bytes of a frame, as returned by
/// [`decode_compressed_frame`]) into `out`, which must be exactly the
/// logical size. Corrupt input or a size other than `out.len()` is an error,
/// never a panic. `Compression::Off` copies (the lengths must match).
pub fn decompress(
    compression: Compression,
    compressed: &[u8],
    out: &mut [u8],
) -> Result<(), FormatError> {
    let produced = match compression {
        Compression::Off => {
            if compressed.len() == out.len() {
                out.copy_from_slice(compressed);
            }
            compressed.len()
        }
        Compression::Lz4 => lz4_flex::block::decompress_into(compressed, out)
            .map_err(|e| FormatError::Decompress(format!("lz4: {e}")))?,
        Compression::Zstd => ZSTD_DECOMPRESSOR.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                *slot = Some(
                    zstd::bulk::Decompressor::new()
                        .map_err(|e| FormatError::Decompress(format!("zstd context: {e}")))?,
                );
            }
            slot.as_mut()
                .expect("just set")
                .decompress_to_buffer(compressed, out)
                .map_err(|e| FormatError::Decompress(format!("zstd: {e}")))
        })?,
    };
    if produced != out.len() {
        return Err(FormatError::Decompress(format!(
            "{compression}: {produced} bytes produced, expected {}",
            out.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Deterministic splitmix64 stream for test data.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            crate::hash::mix64(self.0)
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// Text-like data: words from a small vocabulary, spaces and newlines.
    fn text_like(n: usize, seed: u64) -> Vec<u8> {
        const WORDS: &[&str] = &[
            "the",
            "cache",
            "device",
            "record",
            "block",
            "hand",
            "lap",
            "header",
            "log",
            "entry",
            "checksum",
            "flash",
            "read",
            "write",
            "batch",
            "adaptive",
            "replacement",
            "ghost",
            "list",
            "evict",
            "prefetch",
            "dataset",
            "object",
            "offset",
            "size",
        ];
        let mut rng = Rng(seed);
        let mut out = Vec::with_capacity(n + 16);
        while out.len() < n {
            let w = WORDS[(rng.next() % WORDS.len() as u64) as usize];
            out.extend_from_slice(w.as_bytes());
            out.push(if rng.next().is_multiple_of(12) {
                b'\n'
            } else {
                b' '
            });
            if rng.next().is_multiple_of(40) {
                out.extend_from_slice(format!("{}", rng.next() % 100_000).as_bytes());
                out.push(b' ');
            }
        }
        out.truncate(n);
        out
    }

    #[test]
    fn version_1_headers_still_open_with_the_batch_they_imply() {
        let header = sample_header();
        let mut block = [0u8; 4096];
        header.encode(&mut block);
        assert_eq!(DeviceHeader::decode(&block).unwrap(), header);
        // The same header as version 1 wrote it: no batch field.
        block[8..12].copy_from_slice(&1u32.to_le_bytes());
        block[HEADER_BATCH_BLOCKS_FIELD..HEADER_BATCH_BLOCKS_FIELD + 4].fill(0);
        let crc = crc32c::crc32c(&block[..CRC_FIELD]);
        block[CRC_FIELD..CRC_FIELD + 4].copy_from_slice(&crc.to_le_bytes());
        let old = DeviceHeader::decode(&block).unwrap();
        let data_blocks = ((old.data_end_bytes - old.data_start_bytes) / BLOCK_BYTES) as u32;
        assert_eq!(old.batch_blocks_max, legacy_batch_blocks(data_blocks));
        assert_eq!(
            old.batch_blocks_max, 4032,
            "a quarter of 63 MiB, as version 1 laid it out"
        );
        assert_eq!(
            DeviceHeader {
                batch_blocks_max: header.batch_blocks_max,
                ..old
            },
            header
        );
        // Version 3 is refused, and so is a batch that does not fit.
        block[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert!(matches!(
            DeviceHeader::decode(&block),
            Err(FormatError::UnsupportedVersion(3))
        ));
        for batch in [0, (63 << 20) / 4096] {
            let mut bad = [0u8; 4096];
            DeviceHeader {
                batch_blocks_max: batch,
                ..header.clone()
            }
            .encode(&mut bad);
            assert!(DeviceHeader::decode(&bad).is_err(), "batch {batch}");
        }
    }

    /// The window kept free ahead of the hand (one largest batch) costs at
    /// most 2% of any device of 64 MiB or more, and a batch always holds a
    /// 1 MiB record with its log block where the device allows it.
    #[test]
    fn the_batch_window_costs_at_most_2_percent_from_64_mib() {
        for size_mib in [64u64, 65, 100, 128, 256, 512, 1000, 1024, 4096, 1 << 20] {
            let data_blocks = (((size_mib << 20) - DATA_START_BYTES) / BLOCK_BYTES) as u32;
            let batch = batch_blocks_for(data_blocks);
            let share = f64::from(batch) / f64::from(data_blocks);
            assert!(share <= 0.02, "{size_mib} MiB: {:.2}%", 100.0 * share);
            assert!(u64::from(batch) * BLOCK_BYTES >= (1 << 20) + 2 * BLOCK_BYTES);
            assert!(u64::from(batch) * BLOCK_BYTES <= crate::l2arc::BATCH_BYTES_MAX);
        }
        // Small devices: a quarter of the data area, as before.
        assert_eq!(batch_blocks_for(1024), 256);
    }

    fn sample_header() -> DeviceHeader {
        DeviceHeader {
            cache_guid: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
            device_guid: 0xdead_beef_0000_1111_2222_3333_4444_5555,
            device_size_bytes: 64 << 20,
            data_start_bytes: DATA_START_BYTES,
            data_end_bytes: 64 << 20,
            sequence: 7,
            hand_block: 300,
            lap: 3,
            batch_blocks_max: 256,
            newest_log: Some(LogPointer {
                offset_bytes: 296 * BLOCK_BYTES,
                size_bytes: 4 * BLOCK_BYTES as u32,
                crc: 0x1234_5678,
            }),
        }
    }

    fn encode_header(h: &DeviceHeader) -> Vec<u8> {
        let mut block = [0u8; 4096];
        h.encode(&mut block);
        block.to_vec()
    }

    /// Recomputes a device header's CRC after a deliberate change.
    fn reseal_header(block: &mut [u8]) {
        let crc = crc32c::crc32c(&block[..CRC_FIELD]);
        block[CRC_FIELD..CRC_FIELD + 4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Recomputes a log block's self CRC after a deliberate change.
    fn reseal_log(buf: &mut [u8]) {
        if buf.len() < LOG_BLOCK_HEADER_BYTES {
            return;
        }
        buf[CRC_FIELD..CRC_FIELD + 4].fill(0);
        let crc = crc32c::crc32c(buf);
        buf[CRC_FIELD..CRC_FIELD + 4].copy_from_slice(&crc.to_le_bytes());
    }

    const GUID: u128 = 0xdead_beef_0000_1111_2222_3333_4444_5555;

    fn sample_entries(n: usize, first_block: u32, lap: u32) -> Vec<LogEntry> {
        let mut rng = Rng(n as u64);
        (0..n)
            .map(|i| LogEntry {
                key_hash: rng.next() | 1,
                location: Location::new(
                    first_block + 2 * i as u32,
                    lap,
                    (i % 16) as u8,
                    (i % 511 + 1) as u16,
                    [Compression::Off, Compression::Lz4, Compression::Zstd][i % 3],
                    (rng.next() % 4096) as u16,
                ),
                checksum: rng.next() as u32,
            })
            .collect()
    }

    fn sample_log(n: usize) -> (LogBlockHeader, Vec<LogEntry>, Vec<u8>, u32) {
        let size = log_block_size_bytes(n);
        let header = LogBlockHeader {
            device_guid: GUID,
            sequence: 42,
            lap: 37,
            first_block: 1000,
            prev: Some(LogPointer {
                offset_bytes: 900 * BLOCK_BYTES,
                size_bytes: 8192,
                crc: 0xabcd_ef01,
            }),
            read_ahead: [
                Some(LogPointer {
                    offset_bytes: 800 * BLOCK_BYTES,
                    size_bytes: 4096,
                    crc: 0x1234_5678,
                }),
                None,
                Some(LogPointer {
                    offset_bytes: 700 * BLOCK_BYTES,
                    size_bytes: 8192,
                    crc: 7,
                }),
            ],
            entry_count: n as u32,
            size_bytes: size as u32,
        };
        let entries = sample_entries(n, header.first_block, header.lap);
        let mut buf = vec![0xa5u8; size];
        let crc = encode_log_block(&header, &entries, &mut buf);
        (header, entries, buf, crc)
    }

    // ---- location ----

    #[test]
    fn location_fields_round_trip_at_their_limits() {
        let comps = [Compression::Off, Compression::Lz4, Compression::Zstd];
        for block in [0, 1, u32::MAX] {
            for lap in [0u32, 1, 31, 32, 33, u32::MAX] {
                for device in [0u8, 1, 15] {
                    for asize in [1u16, 2, 510, 511] {
                        for comp in comps {
                            for tail in [0u16, 1, 4095] {
                                let l = Location::new(block, lap, device, asize, comp, tail);
                                assert_eq!(l.block(), block);
                                assert_eq!(u32::from(l.lap_mod32()), lap % 32);
                                assert_eq!(l.device(), device);
                                assert_eq!(l.asize_blocks(), asize);
                                assert_eq!(l.compression(), Some(comp));
                                assert_eq!(l.tail_bytes(), tail);
                                assert_eq!(l.offset_bytes(), u64::from(block) * 4096);
                                assert_eq!(
                                    l.stored_bytes(),
                                    usize::from(asize) * 4096 - usize::from(tail)
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn location_fields_are_independent() {
        // Each field at its maximum alone occupies exactly its documented bits.
        let zero = Location::new(0, 0, 0, 1, Compression::Off, 0);
        assert_eq!(zero.0, 1 << 41);
        assert_eq!(
            Location::new(u32::MAX, 0, 0, 1, Compression::Off, 0).0 ^ zero.0,
            0xffff_ffff
        );
        assert_eq!(
            Location::new(0, 31, 0, 1, Compression::Off, 0).0 ^ zero.0,
            0x1f << 32
        );
        assert_eq!(
            Location::new(0, 0, 15, 1, Compression::Off, 0).0 ^ zero.0,
            0xf << 37
        );
        assert_eq!(
            Location::new(0, 0, 0, 511, Compression::Off, 0).0,
            0x1ff << 41
        );
        assert_eq!(
            Location::new(0, 0, 0, 1, Compression::Zstd, 0).0 ^ zero.0,
            2 << 50
        );
        assert_eq!(
            Location::new(0, 0, 0, 1, Compression::Off, 4095).0 ^ zero.0,
            0xfff << 52
        );
        // All fields at their maximum fill the word except the invalid compression bit.
        let max = Location::new(u32::MAX, 31, 15, 511, Compression::Zstd, 4095);
        assert_eq!(max.0, !(1 << 50));
    }

    #[test]
    fn location_helpers() {
        let l = Location::new(10, 5, 3, 4, Compression::Lz4, 100);
        let m = l.with_device(12);
        assert_eq!(m.device(), 12);
        assert_eq!(
            (
                m.block(),
                m.lap_mod32(),
                m.asize_blocks(),
                m.compression(),
                m.tail_bytes()
            ),
            (10, 5, 4, Some(Compression::Lz4), 100)
        );
        assert_eq!(m.with_device(3), l);
        assert_eq!(l.stored_bytes(), 4 * 4096 - 100);
        assert_eq!(l.asize_bytes(), 4 * 4096);
        assert_eq!(l.end_block(), 14);
        assert_eq!(l.offset_bytes(), 40960);
        // Arbitrary words never make an accessor panic.
        let junk = Location(u64::MAX);
        assert!(junk.sectored());
        assert_eq!(junk.compression(), Some(Compression::Off));
        assert_eq!(junk.stored_bytes(), 510 * 4096 - 4095);
        let zero_asize = Location(0xfff << 52);
        assert_eq!(zero_asize.asize_blocks(), 0);
        assert_eq!(zero_asize.stored_bytes(), 0);
        assert_eq!(Location(u64::MAX).end_block(), u64::from(u32::MAX) + 511);
    }

    #[test]
    #[should_panic(expected = "device index")]
    fn location_rejects_device_16() {
        Location::new(0, 0, 16, 1, Compression::Off, 0);
    }

    #[test]
    #[should_panic(expected = "asize_blocks")]
    fn location_rejects_asize_0() {
        Location::new(0, 0, 0, 0, Compression::Off, 0);
    }

    #[test]
    #[should_panic(expected = "asize_blocks")]
    fn location_rejects_asize_512() {
        Location::new(0, 0, 0, 512, Compression::Off, 0);
    }

    #[test]
    #[should_panic(expected = "tail_bytes")]
    fn location_rejects_tail_4096() {
        Location::new(0, 0, 0, 1, Compression::Off, 4096);
    }

    #[test]
    #[should_panic(expected = "device index")]
    fn with_device_rejects_16() {
        Location::new(0, 0, 0, 1, Compression::Off, 0).with_device(16);
    }

    #[test]
    fn compression_names() {
        for c in [Compression::Off, Compression::Lz4, Compression::Zstd] {
            assert_eq!(c.to_string().parse::<Compression>().unwrap(), c);
            assert_eq!(Compression::from_bits(c as u8), Some(c));
        }
        assert_eq!(Compression::from_bits(3), None);
        let err = "gzip".parse::<Compression>().unwrap_err();
        assert!(matches!(err, FormatError::UnknownCompression(ref s) if s == "gzip"));
        assert!(err.to_string().contains("gzip"));
    }

    // ---- device header ----

    #[test]
    fn header_round_trip() {
        let h = sample_header();
        let block = encode_header(&h);
        assert_eq!(&block[..8], b"L2ARCHDR");
        assert!(block[DEVICE_HEADER_BYTES..].iter().all(|&b| b == 0));
        assert_eq!(DeviceHeader::decode(&block).unwrap(), h);
        // Only the first 128 bytes matter.
        assert_eq!(DeviceHeader::decode(&block[..128]).unwrap(), h);

        let fresh = DeviceHeader {
            newest_log: None,
            hand_block: 256,
            lap: 0,
            batch_blocks_max: 256,
            sequence: 0,
            ..h.clone()
        };
        assert_eq!(DeviceHeader::decode(&encode_header(&fresh)).unwrap(), fresh);
        assert_eq!(fresh.copy_index(), 0);
        assert_eq!(h.copy_index(), 1);

        // Extremes: hand at the end, log block ending exactly at the end.
        let edge = DeviceHeader {
            hand_block: (64 << 20) / 4096,
            sequence: u64::MAX,
            lap: u32::MAX,
            batch_blocks_max: 256,
            cache_guid: u128::MAX,
            device_guid: 1,
            newest_log: Some(LogPointer {
                offset_bytes: (64 << 20) - 4096,
                size_bytes: 4096,
                crc: u32::MAX,
            }),
            ..h
        };
        assert_eq!(DeviceHeader::decode(&encode_header(&edge)).unwrap(), edge);
    }

    #[test]
    fn header_encode_overwrites_the_whole_block() {
        let mut block = [0xffu8; 4096];
        sample_header().encode(&mut block);
        assert!(block[DEVICE_HEADER_BYTES..].iter().all(|&b| b == 0));
        assert_eq!(block[104..108], 256u32.to_le_bytes(), "batch_blocks_max");
        assert!(block[108..124].iter().all(|&b| b == 0));
        assert_eq!(DeviceHeader::decode(&block).unwrap(), sample_header());
    }

    #[test]
    fn header_rejects_bad_magic_version_crc_flags_and_short_buffers() {
        let good = encode_header(&sample_header());

        let e = DeviceHeader::decode(&good[..127]).unwrap_err();
        assert!(
            matches!(
                e,
                FormatError::Truncated {
                    needed: 128,
                    got: 127
                }
            ),
            "{e}"
        );

        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(
            DeviceHeader::decode(&b),
            Err(FormatError::BadMagic { .. })
        ));

        let mut b = good.clone();
        b[8..12].copy_from_slice(&3u32.to_le_bytes());
        reseal_header(&mut b);
        assert!(matches!(
            DeviceHeader::decode(&b),
            Err(FormatError::UnsupportedVersion(3))
        ));

        let mut b = good.clone();
        b[72] ^= 1;
        assert!(matches!(
            DeviceHeader::decode(&b),
            Err(FormatError::BadChecksum { .. })
        ));

        let mut b = good.clone();
        b[12] = 1;
        reseal_header(&mut b);
        assert!(matches!(
            DeviceHeader::decode(&b),
            Err(FormatError::UnsupportedFlags(1))
        ));

        // Reserved bytes are covered by the CRC...
        let mut b = good.clone();
        b[110] = 1;
        assert!(matches!(
            DeviceHeader::decode(&b),
            Err(FormatError::BadChecksum { .. })
        ));
        // ... but bytes after 128 are not looked at.
        let mut b = good;
        b[200] = 1;
        assert!(DeviceHeader::decode(&b).is_ok());
    }

    #[test]
    #[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
    fn header_rejects_inconsistent_fields() {
        let base = sample_header();
        let bad = |h: DeviceHeader, why: &str| {
            let e = DeviceHeader::decode(&encode_header(&h)).unwrap_err();
            assert!(matches!(e, FormatError::Inconsistent(_)), "{why}: {e}");
        };
        let ptr = base.newest_log.unwrap();
        bad(
            DeviceHeader {
                data_start_bytes: 0,
                ..base.clone()
            },
            "start 0",
        );
        bad(
            DeviceHeader {
                data_start_bytes: 2 << 20,
                ..base.clone()
            },
            "start 2M",
        );
        bad(
            DeviceHeader {
                data_end_bytes: (64 << 20) - 1,
                ..base.clone()
            },
            "end unaligned",
        );
        bad(
            DeviceHeader {
                data_end_bytes: DATA_START_BYTES,
                newest_log: None,
                hand_block: 256,
                ..base.clone()
            },
            "empty",
        );
        bad(
            DeviceHeader {
                device_size_bytes: (64 << 20) - 4096,
                ..base.clone()
            },
            "end > size",
        );
        bad(
            DeviceHeader {
                device_size_bytes: u64::MAX,
                data_end_bytes: (1 << 44) + 4096,
                ..base.clone()
            },
            "> 2^32 blocks",
        );
        bad(
            DeviceHeader {
                device_size_bytes: u64::MAX,
                // Exactly 2^32 blocks: block 2^32 does not fit a u32.
                data_end_bytes: 1 << 44,
                ..base.clone()
            },
            "= 2^32 blocks",
        );
        bad(
            DeviceHeader {
                hand_block: 255,
                ..base.clone()
            },
            "hand before start",
        );
        bad(
            DeviceHeader {
                hand_block: (64 << 20) / 4096 + 1,
                ..base.clone()
            },
            "hand after end",
        );
        bad(
            DeviceHeader {
                newest_log: Some(LogPointer {
                    offset_bytes: 4096,
                    ..ptr
                }),
                ..base.clone()
            },
            "log in header area",
        );
        bad(
            DeviceHeader {
                newest_log: Some(LogPointer {
                    offset_bytes: ptr.offset_bytes + 512,
                    ..ptr
                }),
                ..base.clone()
            },
            "log unaligned",
        );
        bad(
            DeviceHeader {
                newest_log: Some(LogPointer {
                    size_bytes: 0,
                    ..ptr
                }),
                ..base.clone()
            },
            "log size 0",
        );
        bad(
            DeviceHeader {
                newest_log: Some(LogPointer {
                    size_bytes: 6000,
                    ..ptr
                }),
                ..base.clone()
            },
            "log size unaligned",
        );
        bad(
            DeviceHeader {
                newest_log: Some(LogPointer {
                    offset_bytes: 64 << 20,
                    ..ptr
                }),
                ..base.clone()
            },
            "log past end",
        );
        bad(
            DeviceHeader {
                newest_log: Some(LogPointer {
                    offset_bytes: (64 << 20) - 4096,
                    size_bytes: 8192,
                    ..ptr
                }),
                ..base.clone()
            },
            "log straddles end",
        );
        // A null pointer must be all zero.
        let mut b = encode_header(&DeviceHeader {
            newest_log: None,
            ..base
        });
        b[96] = 1;
        reseal_header(&mut b);
        assert!(matches!(
            DeviceHeader::decode(&b),
            Err(FormatError::Inconsistent(_))
        ));
    }

    fn two_copies(seq_a: u64, seq_b: u64) -> (Vec<u8>, Vec<u8>) {
        let a = DeviceHeader {
            sequence: seq_a,
            hand_block: 1000,
            ..sample_header()
        };
        let b = DeviceHeader {
            sequence: seq_b,
            hand_block: 2000,
            ..sample_header()
        };
        (encode_header(&a), encode_header(&b))
    }

    #[test]
    fn choose_picks_the_higher_sequence() {
        let (a, b) = two_copies(10, 11);
        let (h, which) = DeviceHeader::choose(&a, &b).unwrap();
        assert_eq!((h.sequence, h.hand_block, which), (11, 2000, 1));
        let (a, b) = two_copies(12, 11);
        let (h, which) = DeviceHeader::choose(&a, &b).unwrap();
        assert_eq!((h.sequence, h.hand_block, which), (12, 1000, 0));
        // Equal sequences (never written by us): copy sequence % 2 wins.
        let (a, b) = two_copies(5, 5);
        assert_eq!(DeviceHeader::choose(&a, &b).unwrap().1, 1);
        let (a, b) = two_copies(4, 4);
        assert_eq!(DeviceHeader::choose(&a, &b).unwrap().1, 0);
    }

    #[test]
    fn choose_survives_one_torn_copy() {
        let (a, b) = two_copies(10, 11);
        let mut rng = Rng(99);
        // The newer copy (B) torn in every way: the older one survives, and vice versa.
        let mut torn_versions: Vec<Vec<u8>> = vec![vec![0u8; 4096], rng.bytes(4096), Vec::new()];
        for i in 0..DEVICE_HEADER_BYTES * 8 {
            let mut t = b.clone();
            t[i / 8] ^= 1 << (i % 8);
            torn_versions.push(t);
        }
        // Torn in the middle: the first half of a new header over the old one.
        let mut half = a.clone();
        half[..64].copy_from_slice(&b[..64]);
        torn_versions.push(half);
        for torn in &torn_versions {
            let (h, which) = DeviceHeader::choose(&a, torn).unwrap();
            assert_eq!((h.sequence, which), (10, 0));
            let (h, which) = DeviceHeader::choose(torn, &b).unwrap();
            assert_eq!((h.sequence, which), (11, 1));
        }
    }

    #[test]
    fn choose_fails_clearly_when_both_copies_are_bad() {
        let (a, mut b) = two_copies(10, 11);
        b[80] ^= 0x10;
        let e = DeviceHeader::choose(&[0u8; 4096], &b).unwrap_err();
        let FormatError::NoValidHeader { a: ea, b: eb } = &e else {
            panic!("unexpected {e}");
        };
        assert!(matches!(**ea, FormatError::BadMagic { .. }));
        assert!(matches!(**eb, FormatError::BadChecksum { .. }));
        let msg = e.to_string();
        assert!(
            msg.contains("copy A: bad magic") && msg.contains("copy B: bad checksum"),
            "{msg}"
        );
        let e = DeviceHeader::choose(&a[..10], &[]).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
    }

    // ---- log blocks ----

    #[test]
    fn log_block_sizes() {
        assert_eq!(log_block_size_bytes(0), 4096);
        assert_eq!(log_block_size_bytes(198), 4096); // 128 + 3960 = 4088
        assert_eq!(log_block_size_bytes(199), 8192); // 4108
        assert_eq!(log_block_size_bytes(403), 8192); // 8188
        assert_eq!(log_block_size_bytes(404), 12288);
        assert_eq!(log_block_capacity(4096), 198);
        assert_eq!(log_block_capacity(8192), 403);
        assert_eq!(log_block_capacity(100), 0);
        for n in 0..2000 {
            let size = log_block_size_bytes(n);
            assert!(log_block_capacity(size) >= n);
            assert!(size == 4096 || log_block_capacity(size - 4096) < n);
        }
    }

    #[test]
    fn log_block_round_trip() {
        for n in [0usize, 1, 198, 199, 1000] {
            let (header, entries, buf, crc) = sample_log(n);
            assert_eq!(buf.len(), log_block_size_bytes(n));
            assert_eq!(crc, crc32c::crc32c(&buf));
            assert_eq!(crc, log_block_content_crc(&buf));
            assert!(
                buf[LOG_BLOCK_HEADER_BYTES + n * LOG_ENTRY_BYTES..]
                    .iter()
                    .all(|&b| b == 0)
            );
            // Reserved: after the read-ahead hints, up to the CRC.
            assert!(buf[116..124].iter().all(|&b| b == 0));
            let (h, e) = decode_log_block(&buf, GUID).unwrap();
            assert_eq!(h, header);
            assert_eq!(e, entries);
        }
        // The first log block of a device: no predecessor.
        let header = LogBlockHeader {
            device_guid: GUID,
            sequence: 1,
            lap: 0,
            first_block: 256,
            prev: None,
            read_ahead: [None; LOG_READ_AHEAD_POINTERS],
            entry_count: 3,
            size_bytes: 4096,
        };
        let entries = sample_entries(3, 256, 0);
        let mut buf = vec![0u8; 4096];
        encode_log_block(&header, &entries, &mut buf);
        assert_eq!(decode_log_block(&buf, GUID).unwrap(), (header, entries));
    }

    #[test]
    fn read_ahead_hints_are_only_hints() {
        // Written before hints existed (zeros): none.
        let (_, _, mut buf, _) = sample_log(3);
        buf[68..116].fill(0);
        reseal_log(&mut buf);
        let (h, _) = decode_log_block(&buf, GUID).unwrap();
        assert_eq!(h.read_ahead, [None; LOG_READ_AHEAD_POINTERS]);
        // A malformed hint (unaligned, or before the data area) is none;
        // the block and its other hints still decode.
        let (header, _, mut buf, _) = sample_log(3);
        buf[68..76].copy_from_slice(&(800 * BLOCK_BYTES + 1).to_le_bytes());
        buf[100..108].copy_from_slice(&4096u64.to_le_bytes());
        reseal_log(&mut buf);
        let (h, _) = decode_log_block(&buf, GUID).unwrap();
        assert_eq!(h.read_ahead, [None, None, None]);
        assert_eq!(h.prev, header.prev);
        let (header, _, mut buf, _) = sample_log(3);
        buf[68..76].copy_from_slice(&(800 * BLOCK_BYTES + 1).to_le_bytes());
        reseal_log(&mut buf);
        let (h, _) = decode_log_block(&buf, GUID).unwrap();
        assert_eq!(h.read_ahead, [None, None, header.read_ahead[2]]);
    }

    #[test]
    #[should_panic(expected = "wrong size")]
    fn encode_log_block_checks_buffer_size() {
        let (header, entries, _, _) = sample_log(3);
        encode_log_block(&header, &entries, &mut [0u8; 8192]);
    }

    #[test]
    #[should_panic(expected = "entry_count")]
    fn encode_log_block_checks_entry_count() {
        let (mut header, entries, mut buf, _) = sample_log(3);
        header.entry_count = 2;
        encode_log_block(&header, &entries, &mut buf);
    }

    #[test]
    fn log_block_rejects_any_flipped_bit() {
        let (_, _, buf, _) = sample_log(250); // two blocks
        assert_eq!(buf.len(), 8192);
        let mut t = buf.clone();
        for i in 0..buf.len() * 8 {
            t[i / 8] ^= 1 << (i % 8);
            assert!(decode_log_block(&t, GUID).is_err(), "bit {i} flip accepted");
            t[i / 8] ^= 1 << (i % 8);
        }
        assert!(decode_log_block(&t, GUID).is_ok());
    }

    #[test]
    fn log_block_rejects_foreign_truncated_and_resized_buffers() {
        let (_, _, buf, _) = sample_log(250);
        let e = decode_log_block(&buf, GUID ^ 1).unwrap_err();
        assert!(
            matches!(e, FormatError::ForeignDevice { expected, found } if expected == GUID ^ 1 && found == GUID),
            "{e}"
        );
        for len in [0, 50, 127, 128, 4096, 8191] {
            let e = decode_log_block(&buf[..len], GUID).unwrap_err();
            assert!(matches!(e, FormatError::Truncated { .. }), "len {len}: {e}");
        }
        let mut longer = buf.clone();
        longer.extend_from_slice(&[0u8; 4096]);
        let e = decode_log_block(&longer, GUID).unwrap_err();
        assert!(
            matches!(
                e,
                FormatError::SizeMismatch {
                    field: 8192,
                    buffer: 12288
                }
            ),
            "{e}"
        );
        // A block that is not a log block at all (e.g. record payload).
        let e = decode_log_block(&[0x42u8; 4096], GUID).unwrap_err();
        assert!(
            matches!(
                e,
                FormatError::BadMagic {
                    what: "log block",
                    ..
                }
            ),
            "{e}"
        );
        // Another version.
        let mut v3 = buf;
        v3[8] = 3;
        reseal_log(&mut v3);
        assert!(matches!(
            decode_log_block(&v3, GUID),
            Err(FormatError::UnsupportedVersion(3))
        ));
    }

    #[test]
    fn log_block_rejects_bad_counts_and_sizes_even_with_a_valid_crc() {
        let (_, _, buf, _) = sample_log(250);
        let patch = |off: usize, bytes: &[u8]| {
            let mut b = buf.clone();
            b[off..off + bytes.len()].copy_from_slice(bytes);
            reseal_log(&mut b);
            decode_log_block(&b, GUID).unwrap_err()
        };
        let e = patch(12, &404u32.to_le_bytes());
        assert!(
            matches!(
                e,
                FormatError::TooManyEntries {
                    count: 404,
                    size: 8192,
                    capacity: 403
                }
            ),
            "{e}"
        );
        let e = patch(12, &u32::MAX.to_le_bytes());
        assert!(matches!(e, FormatError::TooManyEntries { .. }), "{e}");
        // Fewer entries than the size implies: the block is bigger than it should be.
        let e = patch(12, &100u32.to_le_bytes());
        assert!(matches!(e, FormatError::Inconsistent(_)), "{e}");
        // Size field not a multiple of 4 KiB, with a buffer of that size.
        let mut odd = buf[..5000].to_vec();
        odd[64..68].copy_from_slice(&5000u32.to_le_bytes());
        reseal_log(&mut odd);
        let e = decode_log_block(&odd, GUID).unwrap_err();
        assert!(matches!(e, FormatError::Inconsistent(_)), "{e}");
        // Sequence 0, malformed previous pointer.
        assert!(matches!(
            patch(32, &0u64.to_le_bytes()),
            FormatError::Inconsistent(_)
        ));
        assert!(matches!(
            patch(48, &4097u64.to_le_bytes()),
            FormatError::Inconsistent(_)
        ));
        assert!(matches!(
            patch(56, &100u32.to_le_bytes()),
            FormatError::Inconsistent(_)
        ));
        assert!(matches!(patch(48, &[0u8; 8]), FormatError::Inconsistent(_)));
    }

    #[test]
    fn sectored_locations_and_tables_round_trip() {
        let l = Location::new_sectored(1000, 37, 3, 256, 0);
        assert!(l.sectored());
        assert_eq!(l.compression(), Some(Compression::Off));
        assert_eq!((l.asize_blocks(), l.payload_blocks()), (257, 256));
        assert_eq!(l.stored_bytes(), 1 << 20);
        assert_eq!(l.sector_table_offset_bytes(), Some(1256 * BLOCK_BYTES));
        let short = Location::new_sectored(5, 0, 0, 3, 100);
        assert_eq!(short.stored_bytes(), 3 * 4096 - 100);
        assert_eq!(short.end_block(), 9);
        let plain = Location::new(5, 0, 0, 3, Compression::Off, 100);
        assert!(!plain.sectored());
        assert_eq!(plain.sector_table_offset_bytes(), None);

        // Every block checks against its own entry only: not another
        // record's (key), not another place's (index), not damaged bytes.
        let mut rng = Rng(9);
        let payload: Vec<u8> = (0..8 * 4096).map(|_| rng.next() as u8).collect();
        let mut table = vec![0xffu8; 4096];
        encode_sector_table(77, &payload, &mut table);
        assert!(table[32..].iter().all(|&b| b == 0));
        assert!(check_sectors(77, &table, 0, &payload));
        assert!(check_sectors(77, &table, 3, &payload[3 * 4096..5 * 4096]));
        assert!(!check_sectors(78, &table, 3, &payload[3 * 4096..4 * 4096]));
        assert!(!check_sectors(77, &table, 4, &payload[3 * 4096..4 * 4096]));
        let mut damaged = payload[..4096].to_vec();
        damaged[4095] ^= 1;
        assert!(!check_sectors(77, &table, 0, &damaged));
        // Past the table's end (a corrupt location) is a failure, not a panic.
        assert!(!check_sectors(77, &table, 1024, &payload[..4096]));
    }

    /// The header of a one-block log of two entries, batch at block 1000.
    fn two_entry_header() -> LogBlockHeader {
        LogBlockHeader {
            device_guid: GUID,
            sequence: 2,
            lap: 37,
            first_block: 1000,
            prev: None,
            read_ahead: [None; LOG_READ_AHEAD_POINTERS],
            entry_count: 2,
            size_bytes: 4096,
        }
    }

    #[test]
    fn version_1_log_blocks_are_read_but_hold_no_sector_tables() {
        let header = two_entry_header();
        let plain = sample_entries(1, 1000, 37)[0];
        let sectored = LogEntry {
            location: Location::new_sectored(1010, 37, 0, 256, 0),
            ..plain
        };
        let as_version_1 = |entries: &[LogEntry]| {
            let mut buf = vec![0u8; 4096];
            encode_log_block(&header, entries, &mut buf);
            buf[8..12].copy_from_slice(&1u32.to_le_bytes());
            buf[124..128].fill(0);
            let crc = crc32c::crc32c(&buf);
            buf[124..128].copy_from_slice(&crc.to_le_bytes());
            buf
        };
        let mut v2 = vec![0u8; 4096];
        encode_log_block(&header, &[plain, sectored], &mut v2);
        assert_eq!(
            decode_log_block(&v2, GUID).unwrap().1,
            vec![plain, sectored]
        );
        let v1 = as_version_1(&[plain, plain]);
        assert_eq!(decode_log_block(&v1, GUID).unwrap().1, vec![plain, plain]);
        let msg = decode_log_block(&as_version_1(&[plain, sectored]), GUID)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("version 1 log block"), "{msg}");
    }

    #[test]
    fn log_block_rejects_impossible_entries() {
        let good = sample_entries(1, 1000, 37)[0];
        let raw = |loc: u64| LogEntry {
            location: Location(loc),
            ..good
        };
        let cases = [
            (
                "key_hash 0",
                LogEntry {
                    key_hash: 0,
                    ..good
                },
            ),
            ("asize_blocks 0", raw(good.location.0 & !(0x1ff << 41))),
            ("sector table without", raw(good.location.0 | (3 << 50))),
            (
                "lap",
                LogEntry {
                    location: Location::new(1000, 36, 0, 1, Compression::Off, 0),
                    ..good
                },
            ),
            (
                "before the batch",
                LogEntry {
                    location: Location::new(999, 37, 0, 1, Compression::Off, 0),
                    ..good
                },
            ),
            (
                "2^32",
                LogEntry {
                    location: Location::new(u32::MAX, 37, 0, 2, Compression::Off, 0),
                    ..good
                },
            ),
        ];
        for (why, bad) in cases {
            let header = two_entry_header();
            let mut buf = vec![0u8; 4096];
            encode_log_block(&header, &[good, bad], &mut buf);
            let e = decode_log_block(&buf, GUID).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, FormatError::Inconsistent(_)), "{why}: {msg}");
            assert!(msg.contains("entry 1") && msg.contains(why), "{why}: {msg}");
        }
        // The last block below 2^32 is fine.
        let edge = LogEntry {
            location: Location::new(u32::MAX, 37, 0, 1, Compression::Off, 0),
            ..good
        };
        let header = LogBlockHeader {
            device_guid: GUID,
            sequence: 2,
            lap: 37,
            first_block: 1000,
            prev: None,
            read_ahead: [None; LOG_READ_AHEAD_POINTERS],
            entry_count: 1,
            size_bytes: 4096,
        };
        let mut buf = vec![0u8; 4096];
        encode_log_block(&header, &[edge], &mut buf);
        assert_eq!(decode_log_block(&buf, GUID).unwrap().1, vec![edge]);
    }

    // ---- record payloads ----

    /// Records whose first and middle 4 KiB do not compress are not
    /// compressed at all; one compressible sample is enough to try.
    #[test]
    fn incompressible_records_are_not_compressed_whole() {
        let mut rng = Rng(5);
        let random: Vec<u8> = (0..64 * 1024).map(|_| rng.next() as u8).collect();
        let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog. "
            .iter()
            .copied()
            .cycle()
            .take(64 * 1024)
            .collect();
        let mut out = Vec::new();
        for c in [Compression::Lz4, Compression::Zstd] {
            assert!(!compress(&random, c, &mut out), "{c}");
            assert!(out.is_empty());
            assert!(compress(&text, c, &mut out), "{c}");
            // Compressible but for the two samples: stored as it is.
            let mut mixed = text.clone();
            mixed[..4096].copy_from_slice(&random[..4096]);
            mixed[32 * 1024..36 * 1024].copy_from_slice(&random[4096..8192]);
            assert!(!compress(&mixed, c, &mut out), "{c}");
            // Compressible in the middle sample only: compressed.
            mixed[32 * 1024..36 * 1024].copy_from_slice(&text[..4096]);
            assert!(compress(&mixed, c, &mut out), "{c}");
            // Small records are not probed: a 16 KiB text record compresses.
            assert!(compress(&text[..16 * 1024], c, &mut out), "{c}");
        }
    }

    #[test]
    fn bulk_crc_matches_the_crc32c_crate() {
        // Lengths around the folding widths and the small-input paths, at
        // several offsets within a 64-byte line, from several starting CRCs.
        let mut rng = Rng(7);
        let data: Vec<u8> = (0..(128 << 10) + 200).map(|_| rng.next() as u8).collect();
        let lengths = [
            0,
            1,
            7,
            8,
            15,
            16,
            31,
            63,
            64,
            127,
            128,
            255,
            256,
            511,
            1023,
            4095,
            4096,
            8192,
            12_289,
            128 << 10,
        ];
        for seed in [0, 1, 0xdead_beef, u32::MAX] {
            for &len in &lengths {
                for start in [0, 1, 3, 8, 33, 63] {
                    let slice = &data[start..start + len];
                    assert_eq!(
                        crc32c_bulk_append(seed, slice),
                        crc32c::crc32c_append(seed, slice),
                        "seed {seed:#x} length {len} at {start}"
                    );
                }
            }
        }
        assert_eq!(log_block_content_crc(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn record_checksum_covers_key_and_bytes() {
        let data = text_like(10_000, 1);
        let c = record_checksum(77, &data);
        let mut joined = 77u64.to_le_bytes().to_vec();
        joined.extend_from_slice(&data);
        assert_eq!(c, crc32c::crc32c(&joined));
        assert_ne!(c, record_checksum(78, &data));
        let mut other = data.clone();
        other[5000] ^= 4;
        assert_ne!(c, record_checksum(77, &other));
        assert_ne!(c, record_checksum(77, &data[..9999]));
        // CRC-32C check value.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn compressed_frame_round_trip_and_errors() {
        let payload = b"some compressed bytes".as_slice();
        let mut out = vec![0xffu8; 8192];
        let n = encode_compressed_frame(131_072, payload, &mut out);
        assert_eq!(n, 8 + payload.len());
        assert!(
            out[n..4096].iter().all(|&b| b == 0),
            "padding zeroed to the block end"
        );
        assert_eq!(out[4096], 0xff, "nothing past the block end touched");
        assert_eq!(
            decode_compressed_frame(&out[..n], 131_072).unwrap(),
            (131_072, payload)
        );
        // An empty payload still frames.
        let mut small = [1u8; 8];
        assert_eq!(encode_compressed_frame(5, &[], &mut small), 8);
        assert_eq!(decode_compressed_frame(&small, 5).unwrap(), (5, &[][..]));

        let err = |stored: &[u8], max: u32| decode_compressed_frame(stored, max).unwrap_err();
        assert!(matches!(
            err(&out[..7], 1 << 20),
            FormatError::Truncated { needed: 8, got: 7 }
        ));
        assert!(matches!(
            err(&out[..n - 1], 1 << 20),
            FormatError::Truncated { .. }
        ));
        assert!(matches!(
            err(&out[..n + 1], 1 << 20),
            FormatError::Inconsistent(_)
        ));
        assert!(matches!(
            err(&out[..n], 131_071),
            FormatError::Inconsistent(_)
        ));
        let mut zero_lsize = out[..n].to_vec();
        zero_lsize[4..8].fill(0);
        assert!(matches!(
            err(&zero_lsize, 1 << 20),
            FormatError::Inconsistent(_)
        ));
        let mut huge = out[..n].to_vec();
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(err(&huge, 1 << 20), FormatError::Truncated { .. }));
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn compressed_frame_encode_checks_room() {
        encode_compressed_frame(100, &[0u8; 10], &mut [0u8; 17]);
    }

    fn round_trip(data: &[u8], c: Compression) {
        let mut compressed = Vec::new();
        assert!(compress(data, c, &mut compressed), "{c} did not compress");
        let lsize = data.len();
        let mut frame = vec![0u8; (8 + compressed.len()).next_multiple_of(4096)];
        let stored = encode_compressed_frame(lsize as u32, &compressed, &mut frame);
        assert_eq!(stored, 8 + compressed.len());
        assert!(stored <= lsize - lsize / 8, "{c}: saved less than 1/8");
        let frame = &frame[..stored];
        let (l, bytes) = decode_compressed_frame(frame, 1 << 21).unwrap();
        assert_eq!(l as usize, lsize);
        assert_eq!(bytes, compressed);
        let mut out = vec![0u8; lsize];
        decompress(c, bytes, &mut out).unwrap();
        assert_eq!(out, data, "{c} round trip");
        // Wrong output sizes are errors, not panics.
        let mut short = vec![0u8; lsize - 1];
        assert!(decompress(c, bytes, &mut short).is_err(), "{c} short");
        let mut long = vec![0u8; lsize + 1];
        assert!(decompress(c, bytes, &mut long).is_err(), "{c} long");
    }

    #[test]
    fn compress_round_trips_text_like_data() {
        for size in [4096usize, 65_536, 131_072, 1 << 20] {
            let data = text_like(size, size as u64);
            round_trip(&data, Compression::Lz4);
            round_trip(&data, Compression::Zstd);
        }
        let zeros = vec![0u8; 131_072];
        round_trip(&zeros, Compression::Lz4);
        round_trip(&zeros, Compression::Zstd);
        // The output buffer is reused: stale content does not leak.
        let mut frame = vec![0xeeu8; 1 << 20];
        assert!(compress(&zeros, Compression::Lz4, &mut frame));
        assert!(frame.len() < 4096);
    }

    #[test]
    fn compress_declines_incompressible_and_tiny_data() {
        let random = Rng(5).bytes(131_072);
        let mut out = vec![1u8; 10];
        for c in [Compression::Off, Compression::Lz4, Compression::Zstd] {
            assert!(!compress(&random, c, &mut out), "{c}");
            assert!(out.is_empty());
            assert!(!compress(&[], c, &mut out), "{c} empty");
            assert!(!compress(&[0u8; 9], c, &mut out), "{c} tiny");
        }
        assert!(!compress(
            &text_like(131_072, 3),
            Compression::Off,
            &mut out
        ));
        // Exactly at the limit: half random, half zeros compresses by about 1/2.
        let mut mixed = Rng(6).bytes(65_536);
        mixed.resize(131_072, 0);
        assert!(compress(&mixed, Compression::Lz4, &mut out));
    }

    #[test]
    fn decompress_rejects_garbage() {
        let mut rng = Rng(11);
        let mut out = vec![0u8; 131_072];
        for len in [0usize, 1, 7, 100, 4096, 100_000] {
            for _ in 0..20 {
                let junk = rng.bytes(len);
                assert!(decompress(Compression::Lz4, &junk, &mut out).is_err());
                assert!(decompress(Compression::Zstd, &junk, &mut out).is_err());
            }
        }
        // A valid zstd frame of the wrong content size, and a truncated one.
        let data = text_like(131_072, 9);
        let mut frame = Vec::new();
        assert!(compress(&data, Compression::Zstd, &mut frame));
        let body = &frame[..];
        assert!(decompress(Compression::Zstd, &body[..body.len() / 2], &mut out).is_err());
        let mut small = vec![0u8; 4096];
        assert!(decompress(Compression::Zstd, body, &mut small).is_err());
        assert!(compress(&data, Compression::Lz4, &mut frame));
        let body = &frame[..];
        assert!(decompress(Compression::Lz4, &body[..body.len() / 2], &mut out).is_err());
        // Off copies only when sizes match.
        let mut four = [0u8; 4];
        decompress(Compression::Off, b"abcd", &mut four).unwrap();
        assert_eq!(&four, b"abcd");
        assert!(decompress(Compression::Off, b"abc", &mut four).is_err());
    }

    // ---- fuzz-style properties: decoders never panic ----

    /// Mutations applied to a valid encoding: (position, xor or overwrite value, overwrite?).
    fn mutations() -> impl Strategy<Value = Vec<(usize, u8, bool)>> {
        prop::collection::vec((any::<usize>(), any::<u8>(), any::<bool>()), 1..12)
    }

    fn mutate(buf: &mut [u8], muts: &[(usize, u8, bool)]) {
        if buf.is_empty() {
            return;
        }
        for &(pos, v, overwrite) in muts {
            let i = pos % buf.len();
            if overwrite {
                buf[i] = v;
            } else {
                buf[i] ^= v.max(1);
            }
        }
    }

    /// Runs the whole read path of a stored compressed record on untrusted bytes.
    fn decode_record(stored: &[u8], c: Compression) {
        if let Ok((lsize, bytes)) = decode_compressed_frame(stored, 1 << 18) {
            let mut out = vec![0u8; lsize as usize];
            let _ = decompress(c, bytes, &mut out);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn decoders_never_panic_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..9000)) {
            let _ = DeviceHeader::decode(&bytes);
            let _ = DeviceHeader::choose(&bytes, &bytes[bytes.len() / 2..]);
            let _ = decode_log_block(&bytes, GUID);
            decode_record(&bytes, Compression::Lz4);
            decode_record(&bytes, Compression::Zstd);
            let mut out = vec![0u8; 4096];
            let _ = decompress(Compression::Lz4, &bytes, &mut out);
            let _ = decompress(Compression::Zstd, &bytes, &mut out);
        }

        #[test]
        fn header_decode_never_panics_on_mutations(muts in mutations(), reseal in any::<bool>()) {
            let mut b = encode_header(&sample_header());
            mutate(&mut b[..DEVICE_HEADER_BYTES], &muts);
            if reseal {
                reseal_header(&mut b);
            }
            let original = encode_header(&sample_header());
            match DeviceHeader::decode(&b) {
                Ok(h) => {
                    // Without a reseal, only an unchanged header decodes.
                    prop_assert!(reseal || b == original);
                    // What decodes re-encodes to the same bytes, except the
                    // reserved ones (ignored on read, zero on write) and a
                    // version 1 header's, which is written as version 2
                    // with the batch it implied.
                    let mut expect = b[..DEVICE_HEADER_BYTES].to_vec();
                    expect[108..124].fill(0);
                    if expect[8..12] == 1u32.to_le_bytes() {
                        expect[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
                        expect[104..108].copy_from_slice(&h.batch_blocks_max.to_le_bytes());
                    }
                    reseal_header(&mut expect);
                    prop_assert_eq!(encode_header(&h)[..DEVICE_HEADER_BYTES].to_vec(), expect);
                }
                Err(_) => prop_assert!(b != original),
            }
        }

        #[test]
        fn log_decode_never_panics_on_mutations(
            n in 0usize..450,
            muts in mutations(),
            reseal in any::<bool>(),
            cut in any::<usize>(),
            do_cut in any::<bool>(),
        ) {
            let (_, _, mut buf, _) = sample_log(n);
            let original = buf.clone();
            mutate(&mut buf, &muts);
            if do_cut {
                buf.truncate(cut % (buf.len() + 1));
            }
            if reseal {
                reseal_log(&mut buf);
            }
            match decode_log_block(&buf, GUID) {
                Ok((h, e)) => {
                    prop_assert_eq!(h.entry_count as usize, e.len());
                    prop_assert_eq!(h.size_bytes as usize, buf.len());
                    prop_assert!(reseal || buf == original);
                }
                Err(_) => prop_assert!(buf != original),
            }
        }

        #[test]
        fn record_decode_never_panics_on_mutated_frames(
            muts in mutations(),
            zstd in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let c = if zstd { Compression::Zstd } else { Compression::Lz4 };
            let data = text_like(20_000, seed);
            let mut compressed = Vec::new();
            prop_assert!(compress(&data, c, &mut compressed));
            let mut frame = vec![0u8; 8 + compressed.len()];
            encode_compressed_frame(data.len() as u32, &compressed, &mut frame);
            mutate(&mut frame, &muts);
            decode_record(&frame, c);
            // Also with the frame header intact, so the codec sees the damage.
            let mut body = compressed;
            mutate(&mut body, &muts);
            let mut out = vec![0u8; data.len()];
            let _ = decompress(c, &body, &mut out);
        }
    }

    // ---- speed (not an assertion): cargo test -p l2arc --lib l2arc::format -- --ignored --nocapture
}
