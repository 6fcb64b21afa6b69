//! Fuzz targets: every decoder that takes bytes from outside the process.
//!
//! Why here. The NBD socket, the cache devices, the control socket and the
//! config file all hand l2arc bytes that someone else wrote: a hostile
//! client, a device that lies or was written by another version, an
//! operator's typo. Each decoder must turn any input into a value or an
//! error, never a panic, a hang or an unbounded allocation. A target here
//! drives one decoder the way its caller does and checks what can be
//! checked of its answer (bounds on what it buffers, and decode(encode(x))
//! == x where an encoder exists). The same functions are driven three
//! ways: by AFL++ with coverage (`fuzz/`, outside the workspace because it
//! needs `cargo afl`), by the mutation loop of the `l2arc-fuzz` binary, and
//! by the test suite, which replays the corpus kept in `corpus/` (seeds,
//! and every input that once crashed a target) on every `cargo test`.
//!
//! Checksums would stop a fuzzer at the first check of a device block, so
//! the block targets fix the CRC of their input when its first byte says so
//! and reach the checks that follow it.

use l2arc::internals::format::{
    self, DeviceHeader, LogBlockHeader, LogEntry, decode_compressed_frame, decode_log_block,
    encode_log_block, log_block_size_bytes,
};
use l2arc_nbd::protocol::{
    self, Decoded, ExportInfo, Handshake, HandshakeStatus, OPTION_DATA_MAX_BYTES, PayloadMode,
    Request, RequestDecoder,
};

/// A fuzz target: any bytes in, a panic only for a bug.
pub type Target = fn(&[u8]);

/// Every target, by name (the names of `corpus/` subdirectories and of the
/// AFL harnesses).
pub const TARGETS: &[(&str, Target)] = &[
    ("nbd_handshake", nbd_handshake),
    ("nbd_requests", nbd_requests),
    ("device_header", device_header),
    ("log_block", log_block),
    ("control", control),
    ("config", config),
    ("arc_shape", arc_shape),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// Byte offset of the CRC field in a device header and a log block.
const CRC_FIELD: usize = 124;

/// Splits `data` into pieces whose sizes follow `seed` (1 to 64 bytes, or
/// everything at once when the seed is 0), as reads from a socket would.
fn pieces(data: &[u8], seed: u8) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    let mut state = u32::from(seed);
    std::iter::from_fn(move || {
        if at >= data.len() {
            return None;
        }
        let len = if seed == 0 {
            data.len() - at
        } else {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (1 + (state >> 16) as usize % 64).min(data.len() - at)
        };
        let piece = &data[at..at + len];
        at += len;
        Some(piece)
    })
}

fn export() -> ExportInfo {
    ExportInfo {
        name: String::new(),
        description: "l2arc".into(),
        size_bytes: 1 << 30,
        transmission_flags: ExportInfo::flags_for(false),
        block_size_min_bytes: 1,
        block_size_preferred_bytes: 4096,
        block_size_max_bytes: 32 << 20,
    }
}

/// The NBD handshake, fed in socket-sized pieces (first byte: piece sizes).
pub fn nbd_handshake(data: &[u8]) {
    let Some((&seed, input)) = data.split_first() else {
        return;
    };
    let mut hs = Handshake::new(export());
    let _ = hs.greeting();
    let mut out = Vec::new();
    for piece in pieces(input, seed) {
        let mut at = 0;
        while at < piece.len() {
            let before = out.len();
            match hs.push(&piece[at..], &mut out) {
                Ok((used, status)) => {
                    assert!(used <= piece.len() - at, "consumed more than given");
                    assert!(
                        hs.buffered_bytes() <= OPTION_DATA_MAX_BYTES as usize + 16,
                        "buffered {} bytes",
                        hs.buffered_bytes()
                    );
                    // Every reply is a whole option reply or the export's
                    // EXPORT_NAME answer; at most one per consumed option.
                    assert!(out.len() - before <= 4 * (20 + 4096 + 16) + 134);
                    if status != HandshakeStatus::Negotiating {
                        assert!(hs.push(&[0], &mut out).is_err(), "pushed after the end");
                        return;
                    }
                    assert!(used > 0, "negotiating yet consumed nothing");
                    at += used;
                }
                Err(_) => return,
            }
        }
        // Replies the server would have sent by now.
        out.clear();
    }
}

/// The NBD request stream, gated or not, with every payload mode. First
/// byte: piece sizes; second: decoder settings and payload modes.
pub fn nbd_requests(data: &[u8]) {
    let [seed, settings, input @ ..] = data else {
        return;
    };
    let max_payload_bytes = 1u32 << (6 + (settings & 7)); // 64 B .. 8 KiB
    let gated = settings & 8 != 0;
    let mut check = RequestChecker {
        decoder: if gated {
            RequestDecoder::gated(max_payload_bytes)
        } else {
            RequestDecoder::new(max_payload_bytes)
        },
        max_payload_bytes,
        gated,
        seed: *seed,
        mode_pick: *settings >> 4,
        split: None,
    };
    for piece in pieces(input, *seed) {
        let mut at = 0;
        while at < piece.len() {
            let (used, decoded) = match check.decoder.push(&piece[at..]) {
                Ok(r) => r,
                Err(_) => {
                    assert!(
                        check.decoder.push(&[0; 28]).is_err(),
                        "decoder not failed for good"
                    );
                    return;
                }
            };
            assert!(used > 0 || decoded.is_some(), "no progress");
            assert!(used <= piece.len() - at);
            at += used;
            assert!(
                check.decoder.buffered_bytes() <= max_payload_bytes.max(28) as usize,
                "buffered {} bytes over the payload limit {max_payload_bytes}",
                check.decoder.buffered_bytes()
            );
            if let Some(decoded) = decoded {
                check.decoded(decoded);
            }
        }
    }
}

/// What `nbd_requests` knows while it feeds a decoder.
struct RequestChecker {
    decoder: RequestDecoder,
    max_payload_bytes: u32,
    gated: bool,
    seed: u8,
    /// Picks the payload mode of each gated write.
    mode_pick: u8,
    /// The write taken in pieces now: (request, bytes so far).
    split: Option<(Request, u64)>,
}

impl RequestChecker {
    /// Checks one decoded item against what the stream allows.
    fn decoded(&mut self, decoded: Decoded) {
        let max_payload_bytes = self.max_payload_bytes;
        match decoded {
            Decoded::Request { request, payload } => {
                assert_eq!(Request::decode(&request.encode()), Ok(request));
                if request.command == protocol::NBD_CMD_WRITE {
                    assert_eq!(payload.len(), request.length_bytes as usize);
                    assert!(request.length_bytes <= max_payload_bytes);
                } else {
                    assert!(payload.is_empty());
                }
                let _ = protocol::check_request(&request, 1 << 20, false, max_payload_bytes);
                let _ = protocol::check_request(&request, u64::MAX, true, u32::MAX);
            }
            Decoded::Oversized(request) => {
                assert_eq!(request.command, protocol::NBD_CMD_WRITE);
            }
            Decoded::WriteHeader(request) => self.write_header(request),
            Decoded::WriteChunk {
                request,
                at_bytes,
                data,
                last,
            } => {
                let (expected, done) = self.split.as_mut().expect("a chunk without its header");
                assert_eq!(request, *expected);
                assert_eq!(u64::from(at_bytes), *done);
                assert!(!data.is_empty() && data.len() <= max_payload_bytes as usize);
                *done += data.len() as u64;
                assert!(*done <= u64::from(request.length_bytes));
                assert_eq!(last, *done == u64::from(request.length_bytes));
                if last {
                    self.split = None;
                }
            }
        }
    }

    /// A gated write's header: choose how to take its payload.
    fn write_header(&mut self, request: Request) {
        assert!(self.gated && request.command == protocol::NBD_CMD_WRITE);
        assert!(request.length_bytes > 0);
        let mode = match self.mode_pick % 4 {
            0 => PayloadMode::Buffer,
            1 => PayloadMode::Discard,
            2 => PayloadMode::Chunks { chunk_bytes: 0 },
            _ => PayloadMode::Chunks {
                chunk_bytes: u32::from(self.seed) * 7 + 1,
            },
        };
        self.mode_pick = self.mode_pick.rotate_left(1) ^ self.seed;
        assert!(self.decoder.choose_payload(mode));
        assert!(!self.decoder.choose_payload(mode), "chose twice");
        if matches!(mode, PayloadMode::Chunks { .. }) {
            self.split = Some((request, 0));
        }
    }
}

/// Sets the CRC of a header (first 124 bytes) or log block (all of it,
/// with the field as zero) so that decoding reaches the later checks.
fn fix_crc(block: &mut [u8], whole: bool) {
    if block.len() < 128 {
        return;
    }
    block[CRC_FIELD..CRC_FIELD + 4].fill(0);
    let crc = if whole {
        crc32c::crc32c(block)
    } else {
        crc32c::crc32c(&block[..CRC_FIELD])
    };
    block[CRC_FIELD..CRC_FIELD + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A device header as read at start (first byte: bit 0 fixes the CRC).
/// Also the compressed-frame decoder over the same bytes.
pub fn device_header(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut block = rest.to_vec();
    if flags & 1 != 0 {
        fix_crc(&mut block, false);
    }
    if let Ok(header) = DeviceHeader::decode(&block) {
        let mut out = [0u8; 4096];
        header.encode(&mut out);
        assert_eq!(
            DeviceHeader::decode(&out).expect("an encoded header decodes"),
            header
        );
    }
    if let Ok((lsize, compressed)) = decode_compressed_frame(rest, 1 << 20) {
        assert!((1..=1 << 20).contains(&lsize));
        assert_eq!(compressed.len() + 8, rest.len());
    }
}

/// An ARC checkpoint as read at start (`l2arc::arc::shape`; first byte:
/// bit 0 fixes its payload length and both CRCs, so that the checks past
/// them are reached). What decodes must encode to the same bytes' shape.
pub fn arc_shape(data: &[u8]) {
    use l2arc::arc::shape::{self, SHAPE_HEADER_BYTES};
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut file = rest.to_vec();
    if flags & 1 != 0 && file.len() >= SHAPE_HEADER_BYTES {
        let payload_bytes = (file.len() - SHAPE_HEADER_BYTES) as u64;
        let payload_crc = crc32c::crc32c(&file[SHAPE_HEADER_BYTES..]);
        file[16..24].copy_from_slice(&payload_bytes.to_le_bytes());
        file[24..28].copy_from_slice(&payload_crc.to_le_bytes());
        let header_crc = crc32c::crc32c(&file[..60]);
        file[60..64].copy_from_slice(&header_crc.to_le_bytes());
    }
    if let Ok(decoded) = shape::decode(&file) {
        let encoded = shape::encode(&decoded);
        assert_eq!(encoded.len() as u64, decoded.encoded_bytes());
        assert_eq!(
            shape::decode(&encoded).expect("an encoded shape decodes"),
            decoded
        );
    }
}

fn seeds_arc_shape() -> Vec<Vec<u8>> {
    use l2arc::arc::shape::*;
    let shape = SavedShape {
        created_unix_secs: 1_700_000_000,
        datasets: vec![11, 12],
        objects: vec![
            SavedObject {
                dataset: 0,
                object: 5,
                token: 99,
                name: "a/b".into(),
            },
            SavedObject {
                dataset: 1,
                object: 6,
                token: 100,
                name: String::new(),
            },
        ],
        shards: vec![
            SavedShard {
                p_bytes: 1 << 16,
                c_bytes: 1 << 20,
                mru: vec![SavedRecord {
                    object: 1,
                    record: 2,
                    size_bytes: 65536,
                    prefetched: true,
                }],
                mfu: vec![SavedRecord {
                    object: 0,
                    record: 0,
                    size_bytes: 4096,
                    prefetched: false,
                }],
                mru_ghost: vec![SavedGhost {
                    dataset: 1,
                    object: 7,
                    record: 3,
                    size_bytes: 65536,
                }],
                mfu_ghost: vec![],
            },
            SavedShard::default(),
        ],
    };
    let encoded = encode(&shape);
    [0u8, 1]
        .iter()
        .map(|&flags| {
            std::iter::once(flags)
                .chain(encoded.iter().copied())
                .collect()
        })
        .collect()
}

/// A log block as read by the rebuild (first byte: bit 0 fixes the CRC,
/// bit 1 expects the device guid the block names, as a rebuild of the
/// right device would).
pub fn log_block(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut block = rest.to_vec();
    if flags & 1 != 0 {
        fix_crc(&mut block, true);
    }
    let guid = match block.get(16..32) {
        Some(b) if flags & 2 != 0 => u128::from_le_bytes(b.try_into().expect("16 bytes")),
        _ => 0,
    };
    let Ok((header, entries)) = decode_log_block(&block, guid) else {
        return;
    };
    assert_eq!(header.entry_count as usize, entries.len());
    assert_eq!(header.size_bytes as usize, block.len());
    let again = encode_decode(&header, &entries, guid);
    assert_eq!(again, (header, entries), "decode(encode(x)) != x");
}

fn encode_decode(
    header: &LogBlockHeader,
    entries: &[LogEntry],
    guid: u128,
) -> (LogBlockHeader, Vec<LogEntry>) {
    let mut out = vec![0u8; log_block_size_bytes(entries.len())];
    let crc = encode_log_block(header, entries, &mut out);
    assert_eq!(format::log_block_content_crc(&out), crc);
    decode_log_block(&out, guid).expect("an encoded log block decodes")
}

/// One control-socket command line, as the control server reads it.
pub fn control(data: &[u8]) {
    let data = &data[..data.len().min(4096)];
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(line) = text.lines().next() else {
        return;
    };
    if let Ok(command) = l2arc_cli::control::ControlCommand::parse(line.trim_end()) {
        let again = l2arc_cli::control::ControlCommand::parse(&command.to_line())
            .expect("a command's own line parses");
        assert_eq!(again, command, "parse(to_line(x)) != x");
    }
}

/// A TOML config file, resolved as `--config FILE` would be.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let options = l2arc_cli::service::CacheOptions::default();
    let _ = options.resolve_toml(text, 64 << 10);
}

/// Seed inputs for `name`: well-formed inputs that reach deep into the
/// decoder (the fuzzers mutate these). `l2arc-fuzz seed` writes them to
/// `corpus/NAME/`.
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "nbd_handshake" => seeds_handshake(),
        "nbd_requests" => seeds_requests(),
        "device_header" => seeds_header(),
        "log_block" => seeds_log_block(),
        "arc_shape" => seeds_arc_shape(),
        "control" => [
            "stats\n",
            "devices\n",
            "add-cache /tmp/c.img 1GiB\n",
            "remove-cache 1\n",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect(),
        "config" => vec![
            b"arc_max = \"256MiB\"\nrecordsize = 16384\ncompression = \"zstd\"\ncache = [\"/tmp/x\"]\nl2arc_noprefetch = false\nsecondarycache = \"none\"\n".to_vec(),
            b"arc_max = 1073741824\narc_shards = 8\nl2arc_write_max = \"32MiB\"\nl2arc_headroom = 8\nl2arc_dwpd = 1.5\nemulate_hdd_spindles = 4\nemulate_hdd_seek_ms_min = 4.0\nemulate_hdd_seek_ms_max = 12.0\n".to_vec(),
        ],
        _ => Vec::new(),
    }
}

fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    protocol::encode_option(&mut v, option, data);
    v
}

fn seeds_handshake() -> Vec<Vec<u8>> {
    let mut go = Vec::new();
    protocol::encode_info_request(
        &mut go,
        "",
        &[protocol::NBD_INFO_BLOCK_SIZE, protocol::NBD_INFO_NAME],
    );
    let mut all = Vec::new();
    let mut s = vec![0u8]; // one piece
    s.extend_from_slice(&3u32.to_be_bytes());
    s.extend(option(protocol::NBD_OPT_LIST, &[]));
    s.extend(option(protocol::NBD_OPT_INFO, &go));
    s.extend(option(protocol::NBD_OPT_STRUCTURED_REPLY, &[]));
    s.extend(option(protocol::NBD_OPT_GO, &go));
    all.push(s);
    let mut s = vec![17u8];
    s.extend_from_slice(&1u32.to_be_bytes());
    s.extend(option(protocol::NBD_OPT_EXPORT_NAME, b""));
    all.push(s);
    let mut s = vec![3u8];
    s.extend_from_slice(&3u32.to_be_bytes());
    s.extend(option(protocol::NBD_OPT_ABORT, &[]));
    all.push(s);
    all
}

fn request(command: u16, flags: u16, offset: u64, length: u32) -> Vec<u8> {
    Request {
        flags,
        command,
        cookie: 0x0102_0304_0506_0708,
        offset_bytes: offset,
        length_bytes: length,
    }
    .encode()
    .to_vec()
}

fn seeds_requests() -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    for settings in [0x00u8, 0x08, 0x18, 0x28, 0x38] {
        let mut s = vec![5u8, settings | 2]; // 256-byte payload limit
        s.extend(request(protocol::NBD_CMD_READ, 0, 4096, 512));
        s.extend(request(
            protocol::NBD_CMD_WRITE,
            protocol::NBD_CMD_FLAG_FUA,
            0,
            5,
        ));
        s.extend_from_slice(b"hello");
        s.extend(request(protocol::NBD_CMD_WRITE, 0, 100, 700));
        s.extend(vec![7u8; 700]);
        s.extend(request(protocol::NBD_CMD_TRIM, 0, 0, 1 << 20));
        s.extend(request(protocol::NBD_CMD_FLUSH, 0, 0, 0));
        s.extend(request(protocol::NBD_CMD_DISC, 0, 0, 0));
        all.push(s);
    }
    all
}

fn sample_header() -> DeviceHeader {
    DeviceHeader {
        cache_guid: 0x1111_2222_3333_4444_5555_6666_7777_8888,
        device_guid: 0x9999_aaaa_bbbb_cccc_dddd_eeee_ffff_0001,
        device_size_bytes: 64 << 20,
        data_start_bytes: format::DATA_START_BYTES,
        data_end_bytes: 64 << 20,
        sequence: 7,
        hand_block: 300,
        lap: 2,
        batch_blocks_max: 256,
        newest_log: Some(format::LogPointer {
            offset_bytes: format::DATA_START_BYTES + (8 << 12),
            size_bytes: 4096,
            crc: 0xdead_beef,
        }),
    }
}

fn seeds_header() -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    for newest_log in [sample_header().newest_log, None] {
        let mut out = [0u8; 4096];
        DeviceHeader {
            newest_log,
            ..sample_header()
        }
        .encode(&mut out);
        let mut s = vec![1u8];
        s.extend_from_slice(&out[..128]);
        all.push(s);
    }
    all
}

fn seeds_log_block() -> Vec<Vec<u8>> {
    let guid = sample_header().device_guid;
    let mut all = Vec::new();
    for count in [1usize, 3, 200] {
        let first_block = 300u32;
        let entries: Vec<LogEntry> = (0..count)
            .map(|i| LogEntry {
                key_hash: 0x1234_5678_9abc_def0 ^ (i as u64 + 1),
                // Plain, LZ4, and plain with a sector table, in turn.
                location: if i % 3 == 2 {
                    format::Location::new_sectored(first_block + 2 * i as u32, 2, 0, 1, 100)
                } else {
                    format::Location::new(
                        first_block + 2 * i as u32,
                        2,
                        0,
                        1 + (i % 2) as u16,
                        if i % 2 == 0 {
                            format::Compression::Off
                        } else {
                            format::Compression::Lz4
                        },
                        (100 * (i % 3)) as u16,
                    )
                },
                checksum: i as u32 * 31,
            })
            .collect();
        let header = LogBlockHeader {
            device_guid: guid,
            sequence: 3,
            lap: 2,
            first_block,
            prev: Some(format::LogPointer {
                offset_bytes: format::DATA_START_BYTES,
                size_bytes: 4096,
                crc: 1,
            }),
            read_ahead: [None; format::LOG_READ_AHEAD_POINTERS],
            entry_count: count as u32,
            size_bytes: log_block_size_bytes(count) as u32,
        };
        let mut out = vec![0u8; log_block_size_bytes(count)];
        encode_log_block(&header, &entries, &mut out);
        let mut s = vec![3u8];
        s.extend(out);
        all.push(s);
    }
    all
}
