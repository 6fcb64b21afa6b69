//! The ARC's shape on disk: what makes the DRAM tier adaptive, kept across
//! a restart.
//!
//! Why. The persistent L2ARC brings the flash tier back in seconds, but the
//! ARC itself starts empty, and an empty ARC is not merely cold: it has
//! forgotten which records were hot (MFU) and which were seen once (MRU),
//! in what order, which keys it had just evicted (the ghosts) and where it
//! had settled between recency and frequency (`p`). All of that is small,
//! keys and sizes only, tens of bytes a record, so it is saved at a clean
//! stop and checkpointed while running; at start the ghosts and `p` are put
//! back as they were and the records are read back from flash in the saved
//! order (`cache::prewarm`).
//!
//! Never trusted. The file is outside input: a crash may tear it, a disk may
//! flip a bit, an operator may copy it from another host. So it is framed
//! as the L2ARC's log blocks are: a fixed header with a magic, a version,
//! lengths and two CRC-32Cs (one over the header, one over the payload),
//! and every index inside is checked against the tables it points into
//! before anything is used. A file that fails any check is rejected with a
//! reason (`ShapeRejected`) and the cache starts cold. Even an intact file
//! only names candidates: each record is still looked up on flash under
//! the object's current generation token before it is read, so a shape
//! saved before an object changed can never bring back old bytes.
//!
//! Layout (little-endian; docs/format.md, "ARC checkpoint"): a 64-byte
//! header, then the payload: the datasets' stable uids, the objects (the
//! dataset they belong to, the primary's object id, the generation token
//! their records were read under, and the name they are reopened by),
//! then per shard `p`, `c` and the four lists hot to cold: resident
//! entries by object index, ghosts by (dataset, object, record).

use crate::l2arc::format::log_block_content_crc;

/// The first 8 bytes of a checkpoint.
pub const SHAPE_MAGIC: [u8; 8] = *b"L2ARCSHP";
/// The version this code writes and reads.
pub const SHAPE_VERSION: u32 = 1;
/// Bytes of the fixed header.
pub const SHAPE_HEADER_BYTES: usize = 64;
/// The largest checkpoint written (the coldest entries are left out past
/// it) or read.
pub const SHAPE_BYTES_MAX: u64 = 64 << 20;
/// The longest object name kept (longer names: the object is left out).
pub const SHAPE_NAME_BYTES_MAX: usize = 4096;
/// Most shards a checkpoint may describe (`Cache::new` allows 1024).
pub const SHAPE_SHARDS_MAX: u32 = 1024;
/// The largest record size accepted in an entry (a 1 MiB record takes its
/// aligned allocation; anything far beyond is corruption).
pub const SHAPE_RECORD_BYTES_MAX: u32 = 16 << 20;

/// Bytes an encoded resident entry takes.
pub const SHAPE_RECORD_ENTRY_BYTES: u64 = 4 + 8 + 4 + 1;
/// Bytes an encoded ghost entry takes.
pub const SHAPE_GHOST_ENTRY_BYTES: u64 = 4 + 8 + 8 + 4;

/// An object of the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedObject {
    /// Index into `SavedShape::datasets`.
    pub dataset: u32,
    /// The primary's object id (inode, hash of a key).
    pub object: u64,
    /// The generation token its records were read under.
    pub token: u64,
    /// Its name relative to the dataset (to reopen it).
    pub name: String,
}

/// A resident record of the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedRecord {
    /// Index into `SavedShape::objects`.
    pub object: u32,
    /// Record number within the object.
    pub record: u64,
    /// DRAM the record took.
    pub size_bytes: u32,
    /// Brought in by read-ahead and not yet demanded.
    pub prefetched: bool,
}

/// A ghost of the checkpoint (a key only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedGhost {
    /// Index into `SavedShape::datasets`.
    pub dataset: u32,
    /// The primary's object id.
    pub object: u64,
    /// Record number within the object.
    pub record: u64,
    /// DRAM the record took when it was resident.
    pub size_bytes: u32,
}

/// One shard of the checkpoint; every list hot to cold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedShard {
    /// `p`: the shard's MRU target.
    pub p_bytes: u64,
    /// `c`: the shard's size.
    pub c_bytes: u64,
    /// T1, hot to cold.
    pub mru: Vec<SavedRecord>,
    /// T2, hot to cold.
    pub mfu: Vec<SavedRecord>,
    /// B1, hot to cold.
    pub mru_ghost: Vec<SavedGhost>,
    /// B2, hot to cold.
    pub mfu_ghost: Vec<SavedGhost>,
}

/// A whole checkpoint, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedShape {
    /// When it was made, seconds since the Unix epoch.
    pub created_unix_secs: u64,
    /// Datasets' stable uids.
    pub datasets: Vec<u64>,
    /// The objects resident records belong to.
    pub objects: Vec<SavedObject>,
    /// The shards, in order.
    pub shards: Vec<SavedShard>,
}

impl SavedShape {
    /// Resident entries, all shards.
    pub fn records(&self) -> u64 {
        let n: u64 = self
            .shards
            .iter()
            .map(|s| (s.mru.len() + s.mfu.len()) as u64)
            .sum();
        debug_assert!(self.shards.len() <= SHAPE_SHARDS_MAX as usize);
        n
    }

    /// Bytes of resident entries, all shards.
    pub fn resident_bytes(&self) -> u64 {
        let bytes = self
            .shards
            .iter()
            .flat_map(|s| s.mru.iter().chain(s.mfu.iter()))
            .map(|r| u64::from(r.size_bytes))
            .sum();
        debug_assert!(self.records() == 0 || bytes > 0);
        bytes
    }

    /// Bytes `encode` will produce.
    pub fn encoded_bytes(&self) -> u64 {
        let objects: u64 = self
            .objects
            .iter()
            .map(|o| 4 + 8 + 8 + 2 + o.name.len() as u64)
            .sum();
        let shards: u64 = self
            .shards
            .iter()
            .map(|s| {
                16 + 16
                    + (s.mru.len() + s.mfu.len()) as u64 * SHAPE_RECORD_ENTRY_BYTES
                    + (s.mru_ghost.len() + s.mfu_ghost.len()) as u64 * SHAPE_GHOST_ENTRY_BYTES
            })
            .sum();
        let total =
            SHAPE_HEADER_BYTES as u64 + 4 + 8 * self.datasets.len() as u64 + 4 + objects + shards;
        debug_assert!(total >= SHAPE_HEADER_BYTES as u64);
        total
    }
}

/// Why a checkpoint was not used (each counted as
/// `arc_checkpoint_rejected_<reason>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShapeRejected {
    /// Not a checkpoint (another file, or its first bytes are damaged).
    Magic,
    /// Written by a version this code does not read.
    Version(u32),
    /// A CRC does not match: damaged.
    Checksum,
    /// Shorter than its header says: torn.
    Truncated,
    /// Intact but inconsistent (an index out of range, a size no record has).
    Invalid(String),
}

impl ShapeRejected {
    /// The reason's name in the counter.
    pub fn reason(&self) -> &'static str {
        let reason = match self {
            ShapeRejected::Magic => "magic",
            ShapeRejected::Version(_) => "version",
            ShapeRejected::Checksum => "checksum",
            ShapeRejected::Truncated => "truncated",
            ShapeRejected::Invalid(_) => "invalid",
        };
        debug_assert!(SHAPE_REJECT_REASONS.contains(&reason));
        reason
    }
}

/// Every reason a checkpoint is rejected for.
pub const SHAPE_REJECT_REASONS: [&str; 5] =
    ["magic", "version", "checksum", "truncated", "invalid"];

impl std::fmt::Display for ShapeRejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShapeRejected::Magic => write!(f, "not an ARC checkpoint (bad magic)"),
            ShapeRejected::Version(v) => {
                write!(f, "version {v}, this build reads version {SHAPE_VERSION}")
            }
            ShapeRejected::Checksum => write!(f, "checksum mismatch (damaged)"),
            ShapeRejected::Truncated => write!(f, "shorter than its header says (torn)"),
            ShapeRejected::Invalid(why) => write!(f, "inconsistent: {why}"),
        }
    }
}

fn crc32c(bytes: &[u8]) -> u32 {
    log_block_content_crc(bytes)
}

/// Encodes a checkpoint (header and payload).
pub fn encode(shape: &SavedShape) -> Vec<u8> {
    assert!(!shape.shards.is_empty() && shape.shards.len() <= SHAPE_SHARDS_MAX as usize);
    let mut out = Vec::with_capacity(shape.encoded_bytes() as usize);
    out.resize(SHAPE_HEADER_BYTES, 0);
    let put_u32 = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_le_bytes());
    let put_u64 = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(&v.to_le_bytes());
    put_u32(&mut out, shape.datasets.len() as u32);
    for &uid in &shape.datasets {
        put_u64(&mut out, uid);
    }
    put_u32(&mut out, shape.objects.len() as u32);
    for o in &shape.objects {
        assert!(o.name.len() <= SHAPE_NAME_BYTES_MAX);
        put_u32(&mut out, o.dataset);
        put_u64(&mut out, o.object);
        put_u64(&mut out, o.token);
        out.extend_from_slice(&(o.name.len() as u16).to_le_bytes());
        out.extend_from_slice(o.name.as_bytes());
    }
    for s in &shape.shards {
        put_u64(&mut out, s.p_bytes);
        put_u64(&mut out, s.c_bytes);
        for list in [&s.mru, &s.mfu] {
            put_u32(&mut out, list.len() as u32);
            for r in list {
                put_u32(&mut out, r.object);
                put_u64(&mut out, r.record);
                put_u32(&mut out, r.size_bytes);
                out.push(u8::from(r.prefetched));
            }
        }
        for list in [&s.mru_ghost, &s.mfu_ghost] {
            put_u32(&mut out, list.len() as u32);
            for g in list {
                put_u32(&mut out, g.dataset);
                put_u64(&mut out, g.object);
                put_u64(&mut out, g.record);
                put_u32(&mut out, g.size_bytes);
            }
        }
    }
    let payload_bytes = (out.len() - SHAPE_HEADER_BYTES) as u64;
    let payload_crc = crc32c(&out[SHAPE_HEADER_BYTES..]);
    let h = &mut out[..SHAPE_HEADER_BYTES];
    h[0..8].copy_from_slice(&SHAPE_MAGIC);
    h[8..12].copy_from_slice(&SHAPE_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(SHAPE_HEADER_BYTES as u32).to_le_bytes());
    h[16..24].copy_from_slice(&payload_bytes.to_le_bytes());
    h[24..28].copy_from_slice(&payload_crc.to_le_bytes());
    h[28..32].copy_from_slice(&(shape.shards.len() as u32).to_le_bytes());
    h[32..40].copy_from_slice(&shape.created_unix_secs.to_le_bytes());
    let header_crc = crc32c(&h[..60]);
    h[60..64].copy_from_slice(&header_crc.to_le_bytes());
    debug_assert_eq!(out.len() as u64, shape.encoded_bytes());
    out
}

/// A bounds-checked cursor over the payload.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], ShapeRejected> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| ShapeRejected::Invalid("an entry runs past the payload".into()))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        debug_assert!(self.at <= self.bytes.len());
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, ShapeRejected> {
        let b = self.take(1)?[0];
        debug_assert!(self.at >= 1);
        Ok(b)
    }

    fn u16(&mut self) -> Result<u16, ShapeRejected> {
        let b = self.take(2)?;
        debug_assert_eq!(b.len(), 2);
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, ShapeRejected> {
        let b = self.take(4)?;
        debug_assert_eq!(b.len(), 4);
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, ShapeRejected> {
        let b = self.take(8)?;
        debug_assert_eq!(b.len(), 8);
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// A count of entries of `entry_bytes` each, checked against what is
    /// left (so that a damaged count never allocates gigabytes).
    fn count(&mut self, entry_bytes: u64, what: &str) -> Result<usize, ShapeRejected> {
        let n = u64::from(self.u32()?);
        let left = (self.bytes.len() - self.at) as u64;
        if n * entry_bytes > left {
            return Err(ShapeRejected::Invalid(format!(
                "{n} {what} do not fit in the {left} bytes left"
            )));
        }
        debug_assert!(n <= u64::from(u32::MAX));
        Ok(n as usize)
    }
}

fn invalid(why: String) -> ShapeRejected {
    debug_assert!(!why.is_empty());
    ShapeRejected::Invalid(why)
}

fn check_size(size_bytes: u32) -> Result<u32, ShapeRejected> {
    if size_bytes == 0 || size_bytes > SHAPE_RECORD_BYTES_MAX {
        return Err(invalid(format!("a record of {size_bytes} bytes")));
    }
    debug_assert!((1..=SHAPE_RECORD_BYTES_MAX).contains(&size_bytes));
    Ok(size_bytes)
}

/// Checks the header and the payload's length and CRC: the payload, the
/// shard count and the creation time.
fn decode_header(bytes: &[u8]) -> Result<(&[u8], u32, u64), ShapeRejected> {
    if bytes.len() < SHAPE_MAGIC.len() {
        return Err(ShapeRejected::Truncated);
    }
    if bytes[..8] != SHAPE_MAGIC {
        return Err(ShapeRejected::Magic);
    }
    if bytes.len() < SHAPE_HEADER_BYTES {
        return Err(ShapeRejected::Truncated);
    }
    let h = &bytes[..SHAPE_HEADER_BYTES];
    let u32_at = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"));
    if crc32c(&h[..60]) != u32_at(60) {
        return Err(ShapeRejected::Checksum);
    }
    let version = u32_at(8);
    if version != SHAPE_VERSION {
        return Err(ShapeRejected::Version(version));
    }
    if u32_at(12) as usize != SHAPE_HEADER_BYTES {
        return Err(invalid(format!("a header of {} bytes", u32_at(12))));
    }
    let payload_bytes = u64_at(16);
    if payload_bytes > SHAPE_BYTES_MAX {
        return Err(invalid(format!("a payload of {payload_bytes} bytes")));
    }
    let end = SHAPE_HEADER_BYTES + payload_bytes as usize;
    if bytes.len() < end {
        return Err(ShapeRejected::Truncated);
    }
    if bytes.len() > end {
        return Err(invalid(format!(
            "{} bytes after the payload",
            bytes.len() - end
        )));
    }
    let payload = &bytes[SHAPE_HEADER_BYTES..end];
    if crc32c(payload) != u32_at(24) {
        return Err(ShapeRejected::Checksum);
    }
    let shards = u32_at(28);
    if shards == 0 || shards > SHAPE_SHARDS_MAX {
        return Err(invalid(format!("{shards} shards")));
    }
    Ok((payload, shards, u64_at(32)))
}

/// The dataset and object tables.
fn decode_tables(r: &mut Reader<'_>, shape: &mut SavedShape) -> Result<(), ShapeRejected> {
    let datasets = r.count(8, "datasets")?;
    for _ in 0..datasets {
        shape.datasets.push(r.u64()?);
    }
    let objects = r.count(4 + 8 + 8 + 2, "objects")?;
    for _ in 0..objects {
        let dataset = r.u32()?;
        if dataset as usize >= shape.datasets.len() {
            return Err(invalid(format!("an object of dataset {dataset}")));
        }
        let object = r.u64()?;
        let token = r.u64()?;
        let name_len = r.u16()? as usize;
        if name_len > SHAPE_NAME_BYTES_MAX {
            return Err(invalid(format!("a name of {name_len} bytes")));
        }
        let name = std::str::from_utf8(r.take(name_len)?)
            .map_err(|_| invalid("a name that is not UTF-8".into()))?
            .to_string();
        shape.objects.push(SavedObject {
            dataset,
            object,
            token,
            name,
        });
    }
    debug_assert_eq!(shape.objects.len(), objects);
    Ok(())
}

/// A resident list: entries whose object indices are checked.
fn decode_records(r: &mut Reader<'_>, objects: usize) -> Result<Vec<SavedRecord>, ShapeRejected> {
    let n = r.count(SHAPE_RECORD_ENTRY_BYTES, "records")?;
    let mut list = Vec::with_capacity(n);
    for _ in 0..n {
        let object = r.u32()?;
        if object as usize >= objects {
            return Err(invalid(format!("a record of object {object}")));
        }
        let record = r.u64()?;
        let size_bytes = check_size(r.u32()?)?;
        let flags = r.u8()?;
        if flags > 1 {
            return Err(invalid(format!("flags {flags:#x}")));
        }
        list.push(SavedRecord {
            object,
            record,
            size_bytes,
            prefetched: flags == 1,
        });
    }
    debug_assert_eq!(list.len(), n);
    Ok(list)
}

/// A ghost list: entries whose dataset indices are checked.
fn decode_ghosts(r: &mut Reader<'_>, datasets: usize) -> Result<Vec<SavedGhost>, ShapeRejected> {
    let n = r.count(SHAPE_GHOST_ENTRY_BYTES, "ghosts")?;
    let mut list = Vec::with_capacity(n);
    for _ in 0..n {
        let dataset = r.u32()?;
        if dataset as usize >= datasets {
            return Err(invalid(format!("a ghost of dataset {dataset}")));
        }
        list.push(SavedGhost {
            dataset,
            object: r.u64()?,
            record: r.u64()?,
            size_bytes: check_size(r.u32()?)?,
        });
    }
    debug_assert_eq!(list.len(), n);
    Ok(list)
}

/// Decodes and checks a checkpoint (see the module comment): any failure
/// is a reason to start cold.
pub fn decode(bytes: &[u8]) -> Result<SavedShape, ShapeRejected> {
    let (payload, shards, created_unix_secs) = decode_header(bytes)?;
    let mut r = Reader {
        bytes: payload,
        at: 0,
    };
    let mut shape = SavedShape {
        created_unix_secs,
        ..SavedShape::default()
    };
    decode_tables(&mut r, &mut shape)?;
    for _ in 0..shards {
        let (p_bytes, c_bytes) = (r.u64()?, r.u64()?);
        if p_bytes > c_bytes {
            return Err(invalid(format!("p {p_bytes} over c {c_bytes}")));
        }
        let mru = decode_records(&mut r, shape.objects.len())?;
        let mfu = decode_records(&mut r, shape.objects.len())?;
        let mru_ghost = decode_ghosts(&mut r, shape.datasets.len())?;
        let mfu_ghost = decode_ghosts(&mut r, shape.datasets.len())?;
        shape.shards.push(SavedShard {
            p_bytes,
            c_bytes,
            mru,
            mfu,
            mru_ghost,
            mfu_ghost,
        });
    }
    if r.at != payload.len() {
        return Err(invalid(format!("{} bytes left over", payload.len() - r.at)));
    }
    debug_assert_eq!(shape.encoded_bytes(), bytes.len() as u64);
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SavedShape {
        SavedShape {
            created_unix_secs: 1_700_000_000,
            datasets: vec![7, 9],
            objects: vec![SavedObject {
                dataset: 1,
                object: 42,
                token: 0xdead,
                name: "dir/file".into(),
            }],
            shards: vec![SavedShard {
                p_bytes: 4096,
                c_bytes: 1 << 20,
                mru: vec![SavedRecord {
                    object: 0,
                    record: 3,
                    size_bytes: 65536,
                    prefetched: true,
                }],
                mfu: vec![SavedRecord {
                    object: 0,
                    record: 1,
                    size_bytes: 65536,
                    prefetched: false,
                }],
                mru_ghost: vec![SavedGhost {
                    dataset: 0,
                    object: 5,
                    record: 6,
                    size_bytes: 4096,
                }],
                mfu_ghost: vec![],
            }],
        }
    }

    #[test]
    fn round_trip() {
        let shape = sample();
        let bytes = encode(&shape);
        assert_eq!(bytes.len() as u64, shape.encoded_bytes());
        assert_eq!(decode(&bytes).unwrap(), shape);
    }

    #[test]
    fn every_damage_is_rejected_with_its_reason() {
        let bytes = encode(&sample());
        // Any single flipped byte: rejected, never decoded.
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            let reason = decode(&bad).expect_err("a flipped byte is caught");
            if at < 8 {
                assert_eq!(reason, ShapeRejected::Magic);
            } else {
                assert_eq!(reason, ShapeRejected::Checksum, "byte {at}");
            }
        }
        // Any truncation: torn.
        for len in 8..bytes.len() {
            assert_eq!(
                decode(&bytes[..len]),
                Err(ShapeRejected::Truncated),
                "{len}"
            );
        }
        assert_eq!(decode(b"L2ARC"), Err(ShapeRejected::Truncated));
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(decode(&long), Err(ShapeRejected::Invalid(_))));
    }

    #[test]
    fn an_index_out_of_range_is_invalid_even_with_good_checksums() {
        let mut shape = sample();
        shape.shards[0].mfu[0].object = 5;
        assert!(matches!(
            decode(&encode(&shape)),
            Err(ShapeRejected::Invalid(_))
        ));
        let mut shape = sample();
        shape.shards[0].p_bytes = shape.shards[0].c_bytes + 1;
        assert!(matches!(
            decode(&encode(&shape)),
            Err(ShapeRejected::Invalid(_))
        ));
    }
}
