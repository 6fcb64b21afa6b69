//! A shared tier's blocks: their keys in the bucket, and their bytes.
//!
//! Why the key holds everything that names the bytes. A node finds a
//! block by its key alone, with no index to ask: the key must change
//! whenever the bytes a record stands for may change. So it is a digest
//! of the format version, the object's identity (endpoint, bucket, key),
//! its version (ETag and version id: an overwritten object has a new ETag,
//! so a new key, and its old blocks are never found again), the
//! recordsize (another recordsize cuts other records) and the compression
//! (kept in the block's bytes), then the record's index. A 256-bit digest
//! (SHA-256): two different names never meet, even if someone picks them.
//!
//! Why the block repeats the name. The key is only where the block was
//! put: anyone with write access to the bucket can put anything there. So
//! the block says what it is (a digest of the object's identity, its ETag,
//! its offset and length, its compression) and the reader checks that
//! against what it asked for; a CRC-32C over header and payload catches
//! what a disk or a wire did; and with a fleet key (a secret every node
//! holds and the bucket does not), an HMAC-SHA256 over the same bytes
//! catches what a writer without the key did. A block that fails any
//! check is a miss, counted by its reason ([`BadReason`]); the record then
//! comes from primary storage, so a bad block costs a GET, never a wrong
//! byte. The layout is in docs/format.md ("Shared tier blocks").

use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::buf::AlignedBuf;
use crate::l2arc::format::{Compression, compress, crc32c_bulk_append, decompress};
use crate::primary::SourceIdentity;

/// The block format's version: part of every key, so a new format never
/// meets the blocks of an old one.
pub(crate) const FORMAT_VERSION: u16 = 1;
/// The first bytes of every block.
pub(crate) const MAGIC: [u8; 8] = *b"L2ARCSHB";
/// The fixed part of the header, before the ETag's bytes.
pub(crate) const HEADER_FIXED_BYTES: usize = 68;
/// The longest version string (ETag and version id) a block carries.
pub(crate) const VERSION_BYTES_MAX: usize = 1024;
/// The CRC-32C at the end of every block.
const CRC_BYTES: usize = 4;
/// The HMAC-SHA256 after it, in a keyed block.
pub(crate) const HMAC_BYTES: usize = 32;
/// The shortest fleet key taken (256 bits).
pub(crate) const FLEET_KEY_BYTES_MIN: usize = 32;
/// Flag: the block carries an HMAC.
const FLAG_HMAC: u8 = 1;

/// Why a block was refused (each a miss, counted as `shared_bad_<reason>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadReason {
    /// Shorter than its header says, or than any block.
    Short,
    /// Not a block of ours (wrong magic).
    Magic,
    /// A block format this build does not read.
    Version,
    /// Another object, version, record, recordsize or compression.
    Identity,
    /// The CRC-32C does not match.
    Crc,
    /// A fleet key is set and the HMAC is missing or wrong.
    Hmac,
    /// The payload does not decompress to the record's length.
    Length,
}

/// Every reason, in the order of `shared_bad_*` kstats.
pub(crate) const BAD_REASONS: [BadReason; 7] = [
    BadReason::Short,
    BadReason::Magic,
    BadReason::Version,
    BadReason::Identity,
    BadReason::Crc,
    BadReason::Hmac,
    BadReason::Length,
];

/// The kstat of each reason, in [`BAD_REASONS`]' order.
pub(crate) const BAD_KSTATS: [&str; 7] = [
    "shared_bad_short",
    "shared_bad_magic",
    "shared_bad_version",
    "shared_bad_identity",
    "shared_bad_crc",
    "shared_bad_hmac",
    "shared_bad_length",
];

impl BadReason {
    /// Its slot in [`BAD_REASONS`].
    pub(crate) fn index(self) -> usize {
        let index = self as usize;
        debug_assert_eq!(BAD_REASONS[index], self);
        index
    }
}

/// What one record's block is: the object, its version, the record.
#[derive(Clone, Debug)]
pub(crate) struct BlockName {
    /// SHA-256 of the object's identity (endpoint, bucket, key).
    pub(crate) source_digest: [u8; 32],
    /// The object's version (ETag, version id), as the store spelled it.
    pub(crate) version: String,
    pub(crate) index: u64,
    pub(crate) recordsize_bytes: u32,
    pub(crate) compression: Compression,
    /// The digest that names every record of this object version in the
    /// bucket (see the module comment).
    pub(crate) key_digest: [u8; 32],
}

/// Feeds one field to a digest, length first: ("ab", "c") and ("a", "bc")
/// are different names.
fn field(hasher: &mut Sha256, bytes: &[u8]) {
    debug_assert!(bytes.len() <= u32::MAX as usize, "a name's field");
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

impl BlockName {
    /// The name of record `index` of `source` (None: a version string too
    /// long to carry).
    pub(crate) fn new(
        source: &SourceIdentity,
        index: u64,
        recordsize_bytes: u32,
        compression: Compression,
    ) -> Option<Self> {
        if source.version.len() > VERSION_BYTES_MAX {
            return None;
        }
        let mut hasher = Sha256::new();
        field(&mut hasher, source.endpoint.as_bytes());
        field(&mut hasher, source.bucket.as_bytes());
        field(&mut hasher, source.key.as_bytes());
        let source_digest: [u8; 32] = hasher.finalize().into();
        let mut hasher = Sha256::new();
        field(&mut hasher, &FORMAT_VERSION.to_le_bytes());
        field(&mut hasher, source.endpoint.as_bytes());
        field(&mut hasher, source.bucket.as_bytes());
        field(&mut hasher, source.key.as_bytes());
        field(&mut hasher, source.version.as_bytes());
        field(&mut hasher, &recordsize_bytes.to_le_bytes());
        field(&mut hasher, &[compression as u8]);
        let key_digest: [u8; 32] = hasher.finalize().into();
        debug_assert_ne!(source_digest, key_digest);
        Some(Self {
            source_digest,
            version: source.version.clone(),
            index,
            recordsize_bytes,
            compression,
            key_digest,
        })
    }

    /// The block's key in the bucket: `PREFIX/` + hex digest + `/` + index.
    pub(crate) fn object_key(&self, prefix: &str) -> String {
        use std::fmt::Write;
        let mut key = String::with_capacity(prefix.len() + 1 + 64 + 1 + 20);
        if !prefix.is_empty() {
            key.push_str(prefix);
            key.push('/');
        }
        for byte in self.key_digest {
            let _ = write!(key, "{byte:02x}");
        }
        let _ = write!(key, "/{}", self.index);
        debug_assert!(key.len() >= 64 + 2);
        key
    }
}

type HmacSha256 = hmac::Hmac<Sha256>;

fn hmac_of(fleet_key: &[u8], bytes: &[u8]) -> [u8; HMAC_BYTES] {
    debug_assert!(fleet_key.len() >= FLEET_KEY_BYTES_MIN);
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(fleet_key).expect("HMAC takes any key");
    mac.update(bytes);
    mac.finalize().into_bytes().into()
}

/// Encodes `data` (record `name.index`, at most a record) as a block:
/// compressed as `name.compression` says when that saves, with its CRC,
/// and its HMAC when a fleet key is given.
pub(crate) fn encode(name: &BlockName, data: &[u8], fleet_key: Option<&[u8]>) -> Vec<u8> {
    assert!(data.len() <= name.recordsize_bytes as usize, "one record");
    let mut compressed = Vec::new();
    let (compression, payload) = if compress(data, name.compression, &mut compressed) {
        (name.compression, compressed.as_slice())
    } else {
        (Compression::Off, data)
    };
    let version = name.version.as_bytes();
    let total = HEADER_FIXED_BYTES
        + version.len()
        + payload.len()
        + CRC_BYTES
        + fleet_key.map_or(0, |_| HMAC_BYTES);
    let mut block = Vec::with_capacity(total);
    block.extend_from_slice(&MAGIC);
    block.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    block.push(compression as u8);
    block.push(if fleet_key.is_some() { FLAG_HMAC } else { 0 });
    block.extend_from_slice(&name.recordsize_bytes.to_le_bytes());
    block.extend_from_slice(&name.source_digest);
    block.extend_from_slice(&(name.index * u64::from(name.recordsize_bytes)).to_le_bytes());
    block.extend_from_slice(&(data.len() as u32).to_le_bytes());
    block.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    block.extend_from_slice(&(version.len() as u16).to_le_bytes());
    block.extend_from_slice(&[0, 0]);
    debug_assert_eq!(block.len(), HEADER_FIXED_BYTES);
    block.extend_from_slice(version);
    block.extend_from_slice(payload);
    let crc = crc32c_bulk_append(0, &block);
    block.extend_from_slice(&crc.to_le_bytes());
    if let Some(fleet_key) = fleet_key {
        let mac = hmac_of(fleet_key, &block);
        block.extend_from_slice(&mac);
    }
    assert_eq!(block.len(), total);
    block
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    debug_assert!(at + 2 <= b.len());
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    debug_assert!(at + 4 <= b.len());
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Decodes a whole block in memory (see [`Decoder`]).
#[cfg(test)]
pub(crate) fn decode(
    name: &BlockName,
    block: &[u8],
    fleet_key: Option<&[u8]>,
) -> Result<AlignedBuf, BadReason> {
    let mut decoder = Decoder::new(name, fleet_key);
    decoder.feed(block)?;
    decoder.finish()
}

/// Runs the CRC and the HMAC (if any) over the block's next signed bytes.
fn absorb(crc: &mut u32, mac: &mut Option<HmacSha256>, bytes: &[u8]) {
    *crc = crc32c_bulk_append(*crc, bytes);
    if let Some(mac) = mac {
        mac.update(bytes);
    }
}

/// A block decoded as its bytes arrive: the record's bytes, in a buffer
/// of their own, if the block is record `name.index` of the object and
/// version `name` names, intact, and signed with `fleet_key` when one is
/// given.
///
/// Why as they arrive. A GET's body comes in pieces; gathering them into
/// one block buffer and then checking it copied every record twice and
/// held two buffers of a record per GET in flight. Here the header and
/// the trailer (a few bytes) are gathered apart, the CRC and the HMAC run
/// over the pieces, and the payload goes straight into its buffer, which
/// for a block stored plain is the record's own. Nothing is handed out
/// before [`finish`](Self::finish) has checked it all; a block longer
/// than it says, or than a record's block can be, is refused as soon as
/// its bytes show it (the rest of the GET is not read).
pub(crate) struct Decoder<'a> {
    name: &'a BlockName,
    /// The header, fixed part then version, gathered until whole.
    header: Vec<u8>,
    /// Known once the fixed header is in: header, payload, trailer.
    layout: Option<Layout>,
    payload: AlignedBuf,
    payload_filled: usize,
    trailer: [u8; CRC_BYTES + HMAC_BYTES],
    trailer_filled: usize,
    crc: u32,
    mac: Option<HmacSha256>,
}

#[derive(Clone, Copy)]
struct Layout {
    header_bytes: usize,
    payload_bytes: usize,
    trailer_bytes: usize,
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(name: &'a BlockName, fleet_key: Option<&'a [u8]>) -> Self {
        debug_assert!(fleet_key.is_none_or(|k| k.len() >= FLEET_KEY_BYTES_MIN));
        Self {
            name,
            header: Vec::with_capacity(HEADER_FIXED_BYTES),
            layout: None,
            payload: AlignedBuf::for_overwrite(0),
            payload_filled: 0,
            trailer: [0; CRC_BYTES + HMAC_BYTES],
            trailer_filled: 0,
            crc: 0,
            mac: fleet_key
                .map(|k| <HmacSha256 as KeyInit>::new_from_slice(k).expect("HMAC takes any key")),
        }
    }

    /// Takes the next bytes of the block. An error is final: the block is
    /// refused, and the rest need not be read.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> Result<(), BadReason> {
        while !bytes.is_empty() {
            let Some(layout) = self.layout else {
                let want = (HEADER_FIXED_BYTES - self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..want]);
                bytes = &bytes[want..];
                if self.header.len() == HEADER_FIXED_BYTES {
                    let layout = self.fixed_header_read()?;
                    self.layout = Some(layout);
                    if layout.header_bytes == HEADER_FIXED_BYTES {
                        absorb(&mut self.crc, &mut self.mac, &self.header);
                    }
                }
                continue;
            };
            if self.header.len() < layout.header_bytes {
                let want = (layout.header_bytes - self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..want]);
                bytes = &bytes[want..];
                if self.header.len() == layout.header_bytes {
                    absorb(&mut self.crc, &mut self.mac, &self.header);
                }
            } else if self.payload_filled < layout.payload_bytes {
                let want = (layout.payload_bytes - self.payload_filled).min(bytes.len());
                let at = self.payload_filled;
                let piece = &mut self.payload.as_mut_slice()[at..at + want];
                piece.copy_from_slice(&bytes[..want]);
                absorb(&mut self.crc, &mut self.mac, piece);
                self.payload_filled += want;
                bytes = &bytes[want..];
            } else {
                let want = (layout.trailer_bytes - self.trailer_filled).min(bytes.len());
                if want < bytes.len() {
                    return Err(BadReason::Short); // longer than it says
                }
                let at = self.trailer_filled;
                self.trailer[at..at + want].copy_from_slice(bytes);
                self.trailer_filled += want;
                bytes = &[];
            }
        }
        Ok(())
    }

    /// The fixed header is in: checks what frames the rest (magic,
    /// format, lengths within a record's block) and sizes the payload.
    fn fixed_header_read(&mut self) -> Result<Layout, BadReason> {
        let h = &self.header;
        debug_assert_eq!(h.len(), HEADER_FIXED_BYTES);
        if h[..8] != MAGIC {
            return Err(BadReason::Magic);
        }
        if u16_at(h, 8) != FORMAT_VERSION {
            return Err(BadReason::Version);
        }
        let version_bytes = usize::from(u16_at(h, 64));
        if version_bytes > VERSION_BYTES_MAX {
            return Err(BadReason::Short); // past any block's bound
        }
        let payload_bytes = u32_at(h, 60) as usize;
        if payload_bytes > self.name.recordsize_bytes as usize {
            // Stored plain or compressed, a payload is at most a record.
            return Err(BadReason::Length);
        }
        let keyed = h[11] & FLAG_HMAC != 0;
        self.payload = AlignedBuf::for_overwrite(payload_bytes);
        Ok(Layout {
            header_bytes: HEADER_FIXED_BYTES + version_bytes,
            payload_bytes,
            trailer_bytes: CRC_BYTES + if keyed { HMAC_BYTES } else { 0 },
        })
    }

    /// The record, once every byte has come and every check holds.
    pub(crate) fn finish(mut self) -> Result<AlignedBuf, BadReason> {
        let Some(layout) = self.layout else {
            return Err(BadReason::Short);
        };
        if self.header.len() < layout.header_bytes
            || self.payload_filled < layout.payload_bytes
            || self.trailer_filled < layout.trailer_bytes
        {
            return Err(BadReason::Short);
        }
        let crc = u32_at(&self.trailer, 0);
        if self.crc != crc {
            return Err(BadReason::Crc);
        }
        if let Some(mut mac) = self.mac.take() {
            let keyed = layout.trailer_bytes > CRC_BYTES;
            mac.update(&self.trailer[..CRC_BYTES]);
            // Compared in constant time (`verify_slice`).
            if !keyed
                || mac
                    .verify_slice(&self.trailer[CRC_BYTES..layout.trailer_bytes])
                    .is_err()
            {
                return Err(BadReason::Hmac);
            }
        }
        let h = &self.header;
        let name = self.name;
        let length = u32_at(h, 56) as usize;
        let compression = Compression::from_bits(h[10]);
        let offset = u64::from_le_bytes(h[48..56].try_into().expect("8 bytes"));
        let same = h[16..48] == name.source_digest
            && &h[HEADER_FIXED_BYTES..] == name.version.as_bytes()
            && u32_at(h, 12) == name.recordsize_bytes
            && Some(offset) == name.index.checked_mul(u64::from(name.recordsize_bytes))
            && compression.is_some_and(|c| c == name.compression || c == Compression::Off);
        if !same {
            return Err(BadReason::Identity);
        }
        if length > name.recordsize_bytes as usize {
            return Err(BadReason::Length);
        }
        let compression = compression.expect("checked above");
        if compression == Compression::Off {
            // The payload is the record: no copy.
            if layout.payload_bytes != length {
                return Err(BadReason::Length);
            }
            debug_assert_eq!(self.payload.len(), length);
            return Ok(self.payload);
        }
        // Every byte is written (`decompress` fails on any other length),
        // so the buffer need not be zeroed first.
        let mut out = AlignedBuf::for_overwrite(length);
        if decompress(compression, &self.payload, out.as_mut_slice()).is_err() {
            return Err(BadReason::Length);
        }
        debug_assert_eq!(out.len(), length);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(version: &str) -> SourceIdentity {
        SourceIdentity::new(
            "http://127.0.0.1:7070".into(),
            "data".into(),
            "dir/obj.bin".into(),
            version.into(),
        )
    }

    fn name(version: &str, index: u64) -> BlockName {
        BlockName::new(&source(version), index, 131_072, Compression::Lz4).unwrap()
    }

    fn text(len: usize) -> Vec<u8> {
        (0..len).map(|i| b"the quick brown fox "[i % 20]).collect()
    }

    #[test]
    fn round_trips_compressed_plain_keyed_and_short() {
        let key = [7u8; 32];
        let random: Vec<u8> = (0..100_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for data in [text(131_072), random, text(5), Vec::new()] {
            for fleet_key in [None, Some(&key[..])] {
                let n = name("\"etag1\"\0", 3);
                let block = encode(&n, &data, fleet_key);
                let out = decode(&n, &block, fleet_key).unwrap();
                assert_eq!(&out[..], &data[..]);
                // A keyed block reads without a key too (the CRC still holds).
                let out = decode(&n, &block, None).unwrap();
                assert_eq!(&out[..], &data[..]);
            }
        }
        let compressed = encode(&name("e", 0), &text(131_072), None);
        assert!(compressed.len() < 131_072 / 2, "lz4 as the dataset says");
    }

    #[test]
    fn every_corruption_is_refused_by_its_reason() {
        let key = [9u8; 32];
        let n = name("e1", 2);
        let data = text(65_536);
        let block = encode(&n, &data, None);
        let bad = |b: &[u8], k: Option<&[u8]>| decode(&n, b, k).unwrap_err();
        assert_eq!(bad(&block[..block.len() - 1], None), BadReason::Short);
        assert_eq!(bad(&block[..10], None), BadReason::Short);
        assert_eq!(bad(&[], None), BadReason::Short);
        assert_eq!(bad(&vec![0x5a; 4096], None), BadReason::Magic);
        let mut v = block.clone();
        v[8] = 2;
        assert_eq!(bad(&v, None), BadReason::Version);
        let mut flipped = block.clone();
        let at = flipped.len() / 2;
        flipped[at] ^= 1;
        assert_eq!(bad(&flipped, None), BadReason::Crc);
        // Other bytes with a valid CRC and no HMAC: refused with a key.
        let forged = encode(&n, &text(65_000), None);
        decode(&n, &forged, None).unwrap();
        assert_eq!(bad(&forged, Some(&key)), BadReason::Hmac);
        // Signed with another key: refused.
        let other = encode(&n, &data, Some(&[1u8; 32]));
        assert_eq!(bad(&other, Some(&key)), BadReason::Hmac);
        // Signed with ours, then a payload byte changed and the CRC fixed.
        let mut signed = encode(&n, &data, Some(&key));
        let crc_at = signed.len() - HMAC_BYTES - CRC_BYTES;
        signed[HEADER_FIXED_BYTES + 10] ^= 0xff;
        let crc = crc32c::crc32c(&signed[..crc_at]);
        signed[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(bad(&signed, Some(&key)), BadReason::Hmac);
        // Another record, version or recordsize under this key: identity.
        for other in [
            name("e1", 3),
            name("e2", 2),
            BlockName::new(&source("e1"), 2, 65_536, Compression::Lz4).unwrap(),
        ] {
            let r = decode(&other, &block, None).map(|_| ());
            assert_eq!(r, Err(BadReason::Identity));
        }
        // A length past the record, CRC fixed: refused.
        let mut long = block.clone();
        long[56..60].copy_from_slice(&(1u32 << 20).to_le_bytes());
        let crc_at = long.len() - CRC_BYTES;
        let crc = crc32c::crc32c(&long[..crc_at]);
        long[crc_at..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(bad(&long, None), BadReason::Length);
    }

    /// Feeds `block` in pieces of `piece` bytes (the last may be shorter).
    fn decode_in_pieces(
        n: &BlockName,
        block: &[u8],
        fleet_key: Option<&[u8]>,
        piece: usize,
    ) -> Result<AlignedBuf, BadReason> {
        let mut decoder = Decoder::new(n, fleet_key);
        for chunk in block.chunks(piece) {
            decoder.feed(chunk)?;
        }
        decoder.finish()
    }

    #[test]
    fn a_block_in_pieces_of_any_size_decodes_as_a_whole_one() {
        let key = [3u8; 32];
        let random: Vec<u8> = (0..70_001u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        // An empty version: the header ends with its fixed part.
        for version in ["", "\"etag\""] {
            for data in [text(131_072), random.clone(), text(3), Vec::new()] {
                for fleet_key in [None, Some(&key[..])] {
                    let n = name(version, 5);
                    let block = encode(&n, &data, fleet_key);
                    for piece in [1, 7, 67, 68, 69, 4096, 65_537, block.len()] {
                        let out =
                            decode_in_pieces(&n, &block, fleet_key, piece).unwrap_or_else(|r| {
                                panic!("{version:?} {} {piece}: {r:?}", data.len())
                            });
                        assert_eq!(&out[..], &data[..]);
                    }
                    // A flipped byte anywhere is refused, whatever the pieces.
                    for at in [
                        0,
                        11,
                        40,
                        HEADER_FIXED_BYTES,
                        block.len() / 2,
                        block.len() - 1,
                    ] {
                        let mut bad = block.clone();
                        bad[at] ^= 0x10;
                        for piece in [1, 4096] {
                            assert!(decode_in_pieces(&n, &bad, fleet_key, piece).is_err());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_block_is_refused_as_soon_as_its_bytes_show_it() {
        let n = name("e1", 2);
        let block = encode(&n, &text(65_536), None);
        // Longer than it says: refused at the first byte past its end.
        let mut decoder = Decoder::new(&n, None);
        decoder.feed(&block).unwrap();
        assert_eq!(decoder.feed(&[0]), Err(BadReason::Short));
        // Not a block: refused with its fixed header, before any payload.
        let mut decoder = Decoder::new(&n, None);
        assert_eq!(
            decoder.feed(&[0x5a; HEADER_FIXED_BYTES]),
            Err(BadReason::Magic)
        );
        // A payload longer than a record, or a version past the bound.
        let mut long = block.clone();
        long[60..64].copy_from_slice(&(n.recordsize_bytes + 1).to_le_bytes());
        let mut decoder = Decoder::new(&n, None);
        assert_eq!(
            decoder.feed(&long[..HEADER_FIXED_BYTES]),
            Err(BadReason::Length)
        );
        let mut long = block.clone();
        long[64..66].copy_from_slice(&(VERSION_BYTES_MAX as u16 + 1).to_le_bytes());
        let mut decoder = Decoder::new(&n, None);
        assert_eq!(
            decoder.feed(&long[..HEADER_FIXED_BYTES]),
            Err(BadReason::Short)
        );
        // Cut anywhere: short.
        for cut in [
            0,
            9,
            HEADER_FIXED_BYTES,
            HEADER_FIXED_BYTES + 2,
            block.len() - 1,
        ] {
            assert_eq!(
                decode_in_pieces(&n, &block[..cut], None, 1000).unwrap_err(),
                BadReason::Short
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

        /// Whatever the pieces and whatever bytes are changed, a block
        /// yields its own record or a refusal, never other bytes; arbitrary
        /// bytes never panic.
        #[test]
        fn a_changed_block_in_any_pieces_is_never_other_bytes(
            len in 0usize..70_000,
            compressible in proptest::prelude::any::<bool>(),
            keyed in proptest::prelude::any::<bool>(),
            pieces in proptest::collection::vec(1usize..9000, 1..40),
            flips in proptest::collection::vec((proptest::prelude::any::<usize>(), 1u8..=255), 0..3),
            garbage in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        ) {
            let key = [5u8; 32];
            let fleet_key = keyed.then_some(&key[..]);
            let data: Vec<u8> = if compressible {
                text(len)
            } else {
                (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3]).collect()
            };
            let n = name("\"v\"", 1);
            let mut block = encode(&n, &data, fleet_key);
            for &(at, xor) in &flips {
                let at = at % block.len();
                block[at] ^= xor;
            }
            let mut decoder = Decoder::new(&n, fleet_key);
            let mut rest = &block[..];
            let mut fed = Ok(());
            for &piece in pieces.iter().cycle() {
                if rest.is_empty() || fed.is_err() {
                    break;
                }
                let (head, tail) = rest.split_at(piece.min(rest.len()));
                fed = decoder.feed(head);
                rest = tail;
            }
            let decoded = fed.and_then(|()| decoder.finish());
            if flips.is_empty() {
                proptest::prop_assert_eq!(&decoded.expect("an intact block")[..], &data[..]);
            } else if let Ok(out) = decoded {
                // A change the checks cannot see is one that changed nothing
                // (a flip undone by another).
                proptest::prop_assert_eq!(&out[..], &data[..]);
            }
            let _ = decode(&n, &garbage, fleet_key);
        }
    }

    #[test]
    fn keys_change_with_version_recordsize_source_and_compression() {
        let base = name("e1", 0).object_key("pfx");
        assert!(base.starts_with("pfx/") && base.ends_with("/0"));
        assert_eq!(base.len(), "pfx/".len() + 64 + 2);
        assert_eq!(base, name("e1", 0).object_key("pfx"), "stable");
        assert_eq!(
            name("e1", 7).object_key(""),
            base[4..base.len() - 1].to_string() + "7"
        );
        let others = [
            name("e2", 0),
            BlockName::new(&source("e1"), 0, 65_536, Compression::Lz4).unwrap(),
            BlockName::new(&source("e1"), 0, 131_072, Compression::Zstd).unwrap(),
            BlockName::new(
                &SourceIdentity::new(
                    "http://127.0.0.1:7070".into(),
                    "data".into(),
                    "dir/obj.bin2".into(),
                    "e1".into(),
                ),
                0,
                131_072,
                Compression::Lz4,
            )
            .unwrap(),
            BlockName::new(
                &SourceIdentity::new(
                    "http://other:7070".into(),
                    "data".into(),
                    "dir/obj.bin".into(),
                    "e1".into(),
                ),
                0,
                131_072,
                Compression::Lz4,
            )
            .unwrap(),
        ];
        for other in &others {
            assert_ne!(other.object_key("pfx"), base);
        }
        // Fields cannot run into each other.
        let a = SourceIdentity::new("e".into(), "ab".into(), "c".into(), "v".into());
        let b = SourceIdentity::new("e".into(), "a".into(), "bc".into(), "v".into());
        let (a, b) = (
            BlockName::new(&a, 0, 4096, Compression::Off).unwrap(),
            BlockName::new(&b, 0, 4096, Compression::Off).unwrap(),
        );
        assert_ne!(a.key_digest, b.key_digest);
        assert_ne!(a.source_digest, b.source_digest);
    }
}
