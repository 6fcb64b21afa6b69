//! Fuzzing the parsers: arbitrary byte streams into the handshake state
//! machine and the request decoder never panic and never buffer more than
//! their bounds. Failures found by proptest are kept in
//! `fuzz.proptest-regressions` beside this file; hostile inputs worth
//! keeping by hand live in `corpus/` (one file per input, replayed below
//! and, against a live server, in `server.rs`).

use l2arc_nbd::protocol::*;
use proptest::prelude::*;

const MAX_PAYLOAD: u32 = 1 << 16;

fn export() -> ExportInfo {
    ExportInfo {
        name: String::new(),
        description: String::new(),
        size_bytes: 1 << 30,
        transmission_flags: ExportInfo::flags_for(false),
        block_size_min_bytes: 1,
        block_size_preferred_bytes: 4096,
        block_size_max_bytes: MAX_PAYLOAD,
    }
}

/// Feeds `input` in `chunk`-byte pieces; checks the bounds after each.
fn drive_handshake(input: &[u8], chunk: usize) {
    let mut hs = Handshake::new(export());
    let mut out = Vec::new();
    let mut at = 0;
    while at < input.len() {
        let piece = &input[at..input.len().min(at + chunk.max(1))];
        match hs.push(piece, &mut out) {
            Ok((used, HandshakeStatus::Negotiating)) => {
                assert!(used > 0, "no progress");
                at += used;
            }
            Ok((used, _)) => {
                // In transmission: the rest is requests.
                drive_decoder(&input[at + used..], chunk);
                return;
            }
            Err(_) => return,
        }
        assert!(hs.buffered_bytes() <= OPTION_DATA_MAX_BYTES as usize + 16);
        // Each option provokes at most a few replies of at most a name each.
        assert!(out.len() <= (OPTIONS_MAX as usize + 1) * 20 * 1024);
    }
}

fn drive_decoder(input: &[u8], chunk: usize) {
    let mut decoder = RequestDecoder::new(MAX_PAYLOAD);
    for piece in input.chunks(chunk.max(1)) {
        let mut at = 0;
        while at < piece.len() {
            match decoder.push(&piece[at..]) {
                Ok((used, decoded)) => {
                    assert!(used > 0 || decoded.is_some(), "no progress");
                    at += used;
                    if let Some(Decoded::Request { request, payload }) = decoded {
                        assert!(payload.len() <= MAX_PAYLOAD as usize);
                        let _ = check_request(&request, 1 << 30, false, MAX_PAYLOAD);
                    }
                }
                Err(_) => return,
            }
            assert!(decoder.buffered_bytes() <= MAX_PAYLOAD as usize);
        }
    }
}

/// Streams that start well-formed and then go wrong, so the fuzzer gets
/// past the magic numbers.
fn option_stream() -> impl Strategy<Value = Vec<u8>> {
    let opt = (
        prop_oneof![
            Just(1u32),
            Just(2),
            Just(3),
            Just(6),
            Just(7),
            Just(8),
            any::<u32>()
        ],
        prop::collection::vec(any::<u8>(), 0..64),
        prop_oneof![Just(None), any::<u32>().prop_map(Some)],
    )
        .prop_map(|(option, data, length)| {
            // The announced length may lie: the header is well formed,
            // what follows it need not be.
            let mut v = option_header(option, length.unwrap_or(data.len() as u32)).to_vec();
            v.extend_from_slice(&data);
            v
        });
    (
        any::<u32>().prop_map(|f| f & 3),
        prop::collection::vec(opt, 0..8),
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(flags, options, tail)| {
            let mut v = flags.to_be_bytes().to_vec();
            for o in options {
                v.extend(o);
            }
            v.extend(tail);
            v
        })
}

fn request_stream() -> impl Strategy<Value = Vec<u8>> {
    let req = (
        any::<u16>(),
        0u16..10,
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<bool>(),
        prop::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(|(flags, command, cookie, offset, length, small, junk)| {
            let length = if small { length % 64 } else { length };
            let mut v = Request {
                flags,
                command,
                cookie,
                offset_bytes: offset,
                length_bytes: length,
            }
            .encode()
            .to_vec();
            if command == NBD_CMD_WRITE && small {
                v.extend(std::iter::repeat_n(0xabu8, length as usize));
            }
            if junk.len() > 36 {
                v.extend(junk);
            }
            v
        });
    prop::collection::vec(req, 0..16).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn handshake_survives_arbitrary_bytes(input in prop::collection::vec(any::<u8>(), 0..2048), chunk in 1usize..300) {
        drive_handshake(&input, chunk);
    }

    #[test]
    fn handshake_survives_mangled_options(input in option_stream(), chunk in 1usize..300) {
        drive_handshake(&input, chunk);
    }

    #[test]
    fn decoder_survives_arbitrary_bytes(input in prop::collection::vec(any::<u8>(), 0..2048), chunk in 1usize..300) {
        drive_decoder(&input, chunk);
    }

    #[test]
    fn decoder_survives_mangled_requests(input in request_stream(), chunk in 1usize..300) {
        drive_decoder(&input, chunk);
    }
}

/// The checked-in seeds: every file is a hostile handshake+request stream.
fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

#[test]
fn corpus_replays_without_panic() {
    let seeds = corpus();
    assert!(
        seeds.len() >= 10,
        "the corpus lost its seeds: {}",
        seeds.len()
    );
    for (name, bytes) in seeds {
        for chunk in [1, 3, 16, 4096, usize::MAX] {
            drive_handshake(&bytes, chunk.min(bytes.len().max(1)));
            drive_decoder(&bytes, chunk.min(bytes.len().max(1)));
        }
        eprintln!("replayed {name} ({} bytes)", bytes.len());
    }
}
