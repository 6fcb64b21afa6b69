//! Unit tests of the pure protocol code: handshake variants, request
//! decoding, request checks.

use l2arc_nbd::protocol::*;

fn export(name: &str) -> ExportInfo {
    ExportInfo {
        name: name.to_string(),
        description: "test".into(),
        size_bytes: 1 << 20,
        transmission_flags: ExportInfo::flags_for(false),
        block_size_min_bytes: 1,
        block_size_preferred_bytes: 4096,
        block_size_max_bytes: 32 << 20,
    }
}

/// One option with its data, as a client sends it.
fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    encode_option(&mut v, option, data);
    v
}

/// The data of `NBD_OPT_INFO` / `NBD_OPT_GO`.
fn info_data(name: &str, requests: &[u16]) -> Vec<u8> {
    let mut v = Vec::new();
    encode_info_request(&mut v, name, requests);
    v
}

/// Parsed option replies: (option, type, data).
fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut all = Vec::new();
    while !out.is_empty() {
        let header =
            OptionReplyHeader::decode(out[..OPTION_REPLY_HEADER_BYTES].try_into().unwrap())
                .unwrap();
        let data = &out[OPTION_REPLY_HEADER_BYTES..][..header.length_bytes as usize];
        all.push((header.option, header.reply_type, data.to_vec()));
        out = &out[OPTION_REPLY_HEADER_BYTES + data.len()..];
    }
    all
}

fn run(
    hs: &mut Handshake,
    input: &[u8],
) -> (Result<(usize, HandshakeStatus), ProtocolError>, Vec<u8>) {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        match hs.push(&input[at..], &mut out) {
            Ok((used, status)) => {
                at += used;
                if status != HandshakeStatus::Negotiating || at == input.len() {
                    return (Ok((at, status)), out);
                }
            }
            Err(e) => return (Err(e), out),
        }
    }
}

const FLAGS: [u8; 4] = [0, 0, 0, 3]; // fixed newstyle, no zeroes

#[test]
fn greeting_is_fixed_newstyle() {
    let hs = Handshake::new(export(""));
    let g = hs.greeting();
    assert_eq!(&g[0..8], b"NBDMAGIC");
    assert_eq!(&g[8..16], b"IHAVEOPT");
    assert_eq!(
        u16::from_be_bytes([g[16], g[17]]),
        NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES
    );
}

#[test]
fn list_then_info_then_go() {
    let mut hs = Handshake::new(export("disk"));
    let mut input = FLAGS.to_vec();
    input.extend(option(NBD_OPT_LIST, &[]));
    input.extend(option(
        NBD_OPT_INFO,
        &info_data("disk", &[NBD_INFO_BLOCK_SIZE]),
    ));
    input.extend(option(NBD_OPT_GO, &info_data("disk", &[NBD_INFO_NAME])));
    input.extend_from_slice(b"request bytes");
    let (r, out) = run(&mut hs, &input);
    let (used, status) = r.unwrap();
    assert_eq!(status, HandshakeStatus::Transmission);
    assert_eq!(
        &input[used..],
        b"request bytes",
        "bytes after GO are left for transmission"
    );
    let rs = replies(&out);
    assert_eq!(
        rs[0],
        (
            NBD_OPT_LIST,
            NBD_REP_SERVER,
            [&4u32.to_be_bytes()[..], b"disk"].concat()
        )
    );
    assert_eq!(rs[1], (NBD_OPT_LIST, NBD_REP_ACK, vec![]));
    // INFO: export info, block sizes, ACK.
    assert_eq!(rs[2].1, NBD_REP_INFO);
    assert_eq!(&rs[2].2[0..2], &NBD_INFO_EXPORT.to_be_bytes());
    assert_eq!(
        u64::from_be_bytes(rs[2].2[2..10].try_into().unwrap()),
        1 << 20
    );
    assert_eq!(rs[3].2[0..2], NBD_INFO_BLOCK_SIZE.to_be_bytes());
    let bs: Vec<u32> = rs[3].2[2..]
        .chunks(4)
        .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(bs, vec![1, 4096, 32 << 20]);
    assert_eq!(rs[4], (NBD_OPT_INFO, NBD_REP_ACK, vec![]));
    // GO: export, block size, name, ACK.
    assert_eq!(
        rs[7],
        (
            NBD_OPT_GO,
            NBD_REP_INFO,
            [&NBD_INFO_NAME.to_be_bytes()[..], b"disk"].concat()
        )
    );
    assert_eq!(rs[8], (NBD_OPT_GO, NBD_REP_ACK, vec![]));
    assert!(matches!(
        hs.push(b"x", &mut Vec::new()),
        Err(ProtocolError::Finished)
    ));
}

#[test]
fn unknown_options_get_unsup_and_haggling_goes_on() {
    let mut hs = Handshake::new(export(""));
    let mut input = FLAGS.to_vec();
    input.extend(option(NBD_OPT_STRUCTURED_REPLY, &[]));
    input.extend(option(NBD_OPT_STARTTLS, &[]));
    input.extend(option(0xdead, b"whatever"));
    input.extend(option(NBD_OPT_LIST, b"junk"));
    input.extend(option(NBD_OPT_GO, &info_data("other", &[])));
    input.extend(option(NBD_OPT_GO, b"\0\0"));
    input.extend(option(NBD_OPT_GO, &info_data("", &[])));
    let (r, out) = run(&mut hs, &input);
    assert_eq!(r.unwrap().1, HandshakeStatus::Transmission);
    let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
    assert_eq!(
        &types[..6],
        &[
            NBD_REP_ERR_UNSUP,
            NBD_REP_ERR_UNSUP,
            NBD_REP_ERR_UNSUP,
            NBD_REP_ERR_INVALID,
            NBD_REP_ERR_UNKNOWN,
            NBD_REP_ERR_INVALID
        ]
    );
    assert_eq!(*types.last().unwrap(), NBD_REP_ACK);
}

#[test]
fn export_name_with_and_without_zeroes() {
    for (flags, tail) in [([0u8, 0, 0, 1], 124usize), (FLAGS, 0)] {
        let mut hs = Handshake::new(export("img"));
        let mut input = flags.to_vec();
        input.extend(option(NBD_OPT_EXPORT_NAME, b"img"));
        let (r, out) = run(&mut hs, &input);
        assert_eq!(r.unwrap(), (input.len(), HandshakeStatus::Transmission));
        assert_eq!(out.len(), 10 + tail);
        assert_eq!(u64::from_be_bytes(out[0..8].try_into().unwrap()), 1 << 20);
        assert_eq!(
            u16::from_be_bytes([out[8], out[9]]),
            ExportInfo::flags_for(false)
        );
    }
    // Unknown name: no reply exists, the session ends.
    let mut hs = Handshake::new(export("img"));
    let mut input = FLAGS.to_vec();
    input.extend(option(NBD_OPT_EXPORT_NAME, b"nope"));
    assert_eq!(run(&mut hs, &input).0, Err(ProtocolError::UnknownExport));
}

#[test]
fn abort_is_acknowledged() {
    let mut hs = Handshake::new(export(""));
    let mut input = FLAGS.to_vec();
    input.extend(option(NBD_OPT_ABORT, &[]));
    let (r, out) = run(&mut hs, &input);
    assert_eq!(r.unwrap().1, HandshakeStatus::Aborted);
    assert_eq!(replies(&out), vec![(NBD_OPT_ABORT, NBD_REP_ACK, vec![])]);
}

#[test]
fn framing_errors_end_the_session() {
    let mut hs = Handshake::new(export(""));
    assert_eq!(
        run(&mut hs, &[0, 0, 0, 0x10]).0,
        Err(ProtocolError::UnknownClientFlags(0x10))
    );
    let mut hs = Handshake::new(export(""));
    let mut input = FLAGS.to_vec();
    input.extend_from_slice(b"NOTMAGIC\0\0\0\x01\0\0\0\0");
    assert!(matches!(
        run(&mut hs, &input).0,
        Err(ProtocolError::BadOptionMagic(_))
    ));
    // Old (non-fixed) newstyle clients may only send EXPORT_NAME.
    let mut hs = Handshake::new(export(""));
    let mut input = vec![0, 0, 0, 0];
    input.extend(option(NBD_OPT_LIST, &[]));
    assert_eq!(
        run(&mut hs, &input).0,
        Err(ProtocolError::NotFixedNewstyle(NBD_OPT_LIST))
    );
    // Endless haggling.
    let mut hs = Handshake::new(export(""));
    let mut input = FLAGS.to_vec();
    for _ in 0..=OPTIONS_MAX {
        input.extend(option(NBD_OPT_LIST, &[]));
    }
    assert_eq!(run(&mut hs, &input).0, Err(ProtocolError::TooManyOptions));
}

#[test]
fn huge_options_are_skipped_without_buffering() {
    let mut hs = Handshake::new(export(""));
    let mut out = Vec::new();
    let mut input = FLAGS.to_vec();
    let length = 100 * OPTION_DATA_MAX_BYTES;
    input.extend_from_slice(&option_header(NBD_OPT_GO, length));
    hs.push(&input, &mut out).unwrap();
    let chunk = vec![0x55u8; 1 << 20];
    let mut sent = 0u64;
    while sent < u64::from(length) {
        let n = (u64::from(length) - sent).min(chunk.len() as u64) as usize;
        let (used, status) = hs.push(&chunk[..n], &mut out).unwrap();
        assert_eq!((used, status), (n, HandshakeStatus::Negotiating));
        assert!(hs.buffered_bytes() <= 16);
        sent += n as u64;
    }
    assert_eq!(
        replies(&out),
        vec![(
            NBD_OPT_GO,
            NBD_REP_ERR_TOO_BIG,
            b"option data too long".to_vec()
        )]
    );
    out.clear();
    let (r, _) = run(&mut hs, &option(NBD_OPT_GO, &info_data("", &[])));
    assert_eq!(r.unwrap().1, HandshakeStatus::Transmission);
}

#[test]
fn byte_at_a_time_is_the_same_as_all_at_once() {
    let mut input = FLAGS.to_vec();
    input.extend(option(NBD_OPT_LIST, &[]));
    input.extend(option(
        NBD_OPT_INFO,
        &info_data("", &[NBD_INFO_NAME, NBD_INFO_DESCRIPTION]),
    ));
    input.extend(option(NBD_OPT_GO, &info_data("", &[])));
    let mut whole = Handshake::new(export(""));
    let (_, expected) = run(&mut whole, &input);
    let mut hs = Handshake::new(export(""));
    let mut out = Vec::new();
    let mut last = HandshakeStatus::Negotiating;
    for b in &input {
        let (used, status) = hs.push(std::slice::from_ref(b), &mut out).unwrap();
        assert_eq!(used, 1);
        last = status;
    }
    assert_eq!(last, HandshakeStatus::Transmission);
    assert_eq!(out, expected);
}

fn request(command: u16, flags: u16, offset: u64, length: u32) -> Request {
    Request {
        flags,
        command,
        cookie: 0x1122_3344_5566_7788,
        offset_bytes: offset,
        length_bytes: length,
    }
}

#[test]
fn decoder_splits_requests_and_payloads() {
    let mut stream = Vec::new();
    stream.extend(request(NBD_CMD_READ, 0, 4096, 512).encode());
    stream.extend(request(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 0, 5).encode());
    stream.extend_from_slice(b"hello");
    stream.extend(request(NBD_CMD_WRITE, 0, 0, 100).encode());
    stream.extend(vec![7u8; 100]);
    stream.extend(request(NBD_CMD_FLUSH, 0, 0, 0).encode());
    let mut decoder = RequestDecoder::new(64);
    let mut got = Vec::new();
    // Odd chunk sizes exercise every partial state.
    for chunk in stream.chunks(7) {
        let mut at = 0;
        while at < chunk.len() {
            let (used, d) = decoder.push(&chunk[at..]).unwrap();
            at += used;
            got.extend(d);
            assert!(decoder.buffered_bytes() <= 64);
        }
    }
    assert_eq!(got.len(), 4);
    assert_eq!(
        got[0],
        Decoded::Request {
            request: request(NBD_CMD_READ, 0, 4096, 512),
            payload: vec![]
        }
    );
    assert_eq!(
        got[1],
        Decoded::Request {
            request: request(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 0, 5),
            payload: b"hello".to_vec()
        }
    );
    assert_eq!(
        got[2],
        Decoded::Oversized(request(NBD_CMD_WRITE, 0, 0, 100))
    );
    assert_eq!(
        got[3],
        Decoded::Request {
            request: request(NBD_CMD_FLUSH, 0, 0, 0),
            payload: vec![]
        }
    );
}

#[test]
fn decoder_rejects_bad_magic_for_good() {
    let mut decoder = RequestDecoder::new(1024);
    let mut bad = request(NBD_CMD_READ, 0, 0, 1).encode();
    bad[0] ^= 0xff;
    assert!(matches!(
        decoder.push(&bad),
        Err(ProtocolError::BadRequestMagic(_))
    ));
    assert_eq!(
        decoder.push(&request(NBD_CMD_READ, 0, 0, 1).encode()),
        Err(ProtocolError::Finished)
    );
}

#[test]
fn requests_are_checked_against_the_export() {
    let size = 1 << 20;
    let max = 32 << 20;
    let check = |r: Request, ro: bool| check_request(&r, size, ro, max);
    assert_eq!(
        check(request(NBD_CMD_READ, 0, size - 512, 512), false),
        Ok(Command::Read)
    );
    assert_eq!(
        check(request(NBD_CMD_READ, 0, size - 511, 512), false),
        Err(NBD_EINVAL)
    );
    assert_eq!(
        check(request(NBD_CMD_READ, 0, u64::MAX, 1), false),
        Err(NBD_EINVAL)
    );
    assert_eq!(
        check(request(NBD_CMD_READ, 0, 0, max + 1), false),
        Err(NBD_EOVERFLOW)
    );
    assert_eq!(
        check(request(NBD_CMD_WRITE, 0, size, 1), false),
        Err(NBD_ENOSPC)
    );
    assert_eq!(
        check(request(NBD_CMD_WRITE, 0, 0, max + 1), false),
        Err(NBD_EINVAL)
    );
    assert_eq!(check(request(NBD_CMD_WRITE, 0, 0, 1), true), Err(NBD_EPERM));
    assert_eq!(check(request(NBD_CMD_TRIM, 0, 0, 1), true), Err(NBD_EPERM));
    assert_eq!(
        check(
            request(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_NO_HOLE, 0, 1 << 20),
            false
        ),
        Ok(Command::WriteZeroes)
    );
    assert_eq!(
        check(request(NBD_CMD_TRIM, 0, 1, u32::MAX), false),
        Err(NBD_ENOSPC)
    );
    assert_eq!(
        check(request(NBD_CMD_READ, NBD_CMD_FLAG_FUA, 0, 1), false),
        Err(NBD_EINVAL)
    );
    assert_eq!(check(request(99, 0, 0, 1), false), Err(NBD_EINVAL));
    assert_eq!(
        check(request(NBD_CMD_FLUSH, 0, u64::MAX, u32::MAX), true),
        Ok(Command::Flush)
    );
    assert_eq!(
        check(request(NBD_CMD_DISC, 0, 0, 0), true),
        Ok(Command::Disconnect)
    );
    assert_eq!(
        check(request(NBD_CMD_CACHE, 0, 0, 4096), true),
        Ok(Command::Cache)
    );
}

#[test]
fn replies_and_errnos() {
    let r = simple_reply(42, NBD_ENOSPC);
    assert_eq!(
        u32::from_be_bytes(r[0..4].try_into().unwrap()),
        SIMPLE_REPLY_MAGIC
    );
    assert_eq!(u32::from_be_bytes(r[4..8].try_into().unwrap()), 28);
    assert_eq!(u64::from_be_bytes(r[8..16].try_into().unwrap()), 42);
    assert_eq!(errno_of(&std::io::Error::from_raw_os_error(28)), NBD_ENOSPC);
    assert_eq!(errno_of(&std::io::Error::from_raw_os_error(2)), NBD_EIO);
    assert_eq!(
        errno_of(&std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "x"
        )),
        NBD_EPERM
    );
}

/// A refusing handshake never enters transmission: options that can take
/// an error reply get NBD_REP_ERR_POLICY with the reason, ABORT is
/// acknowledged, and EXPORT_NAME (no error reply exists) ends the session.
#[test]
fn a_refusing_handshake_says_why_and_never_transmits() {
    let reason = "server busy: all 2 connections are in use";
    let mut hs = Handshake::refusing(export(""), reason);
    let mut input = FLAGS.to_vec();
    input.extend(option(NBD_OPT_LIST, &[]));
    input.extend(option(NBD_OPT_INFO, &info_data("", &[])));
    input.extend(option(NBD_OPT_GO, &info_data("", &[])));
    input.extend(option(NBD_OPT_ABORT, &[]));
    let (r, out) = run(&mut hs, &input);
    assert_eq!(r.unwrap().1, HandshakeStatus::Aborted);
    let rs = replies(&out);
    let errors: Vec<_> = rs
        .iter()
        .take(3)
        .map(|(o, t, d)| (*o, *t, d.clone()))
        .collect();
    for (opt, (got_opt, ty, data)) in [NBD_OPT_LIST, NBD_OPT_INFO, NBD_OPT_GO]
        .into_iter()
        .zip(errors)
    {
        assert_eq!((got_opt, ty), (opt, NBD_REP_ERR_POLICY));
        assert_eq!(data, reason.as_bytes());
    }
    assert_eq!(rs[3], (NBD_OPT_ABORT, NBD_REP_ACK, Vec::new()));
    let mut hs = Handshake::refusing(export(""), reason);
    let mut input = FLAGS.to_vec();
    input.extend(option(NBD_OPT_EXPORT_NAME, b""));
    let (r, out) = run(&mut hs, &input);
    assert_eq!(r.unwrap_err(), ProtocolError::Refused);
    assert!(out.is_empty(), "no export data for a refused client");
}

/// The client's encoders and decoders are the inverses of the server's:
/// options a client encodes drive the handshake, and what the server
/// sends decodes to what it said.
#[test]
fn the_clients_side_round_trips_through_the_servers() {
    let hs = Handshake::new(export("disk"));
    let greeting = hs.greeting();
    assert_eq!(
        decode_greeting(&greeting),
        Ok(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES)
    );
    let mut bad = greeting;
    bad[0] ^= 1;
    assert!(matches!(
        decode_greeting(&bad),
        Err(ProtocolError::BadGreeting(_))
    ));

    // GO of an export: its size and flags come back in NBD_INFO_EXPORT.
    let mut hs = Handshake::new(export("disk"));
    let mut input = FLAGS.to_vec();
    let mut go = Vec::new();
    encode_info_request(&mut go, "disk", &[NBD_INFO_BLOCK_SIZE]);
    encode_option(&mut input, NBD_OPT_GO, &go);
    assert_eq!(
        &input[4..][..OPTION_HEADER_BYTES],
        &option_header(NBD_OPT_GO, go.len() as u32)
    );
    let (r, out) = run(&mut hs, &input);
    assert_eq!(r.unwrap(), (input.len(), HandshakeStatus::Transmission));
    let rs = replies(&out);
    assert_eq!(
        decode_info_export(&rs[0].2),
        Some((1 << 20, ExportInfo::flags_for(false)))
    );
    assert_eq!(
        decode_info_export(&rs[1].2),
        None,
        "block sizes are no export info"
    );
    assert_eq!(rs.last().unwrap().1, NBD_REP_ACK);
    let header =
        OptionReplyHeader::decode(out[..OPTION_REPLY_HEADER_BYTES].try_into().unwrap()).unwrap();
    assert!(!header.is_error());
    let mut bad: [u8; OPTION_REPLY_HEADER_BYTES] =
        out[..OPTION_REPLY_HEADER_BYTES].try_into().unwrap();
    bad[0] ^= 1;
    assert!(matches!(
        OptionReplyHeader::decode(&bad),
        Err(ProtocolError::BadOptionReplyMagic(_))
    ));
    let mut refused = Vec::new();
    option_reply(&mut refused, NBD_OPT_GO, NBD_REP_ERR_POLICY, b"busy");
    let header =
        OptionReplyHeader::decode(refused[..OPTION_REPLY_HEADER_BYTES].try_into().unwrap())
            .unwrap();
    assert!(header.is_error());
    assert_eq!((header.option, header.length_bytes), (NBD_OPT_GO, 4));
}

/// What a server sends decodes to what it said: the export data of
/// EXPORT_NAME, option reply headers (errors flagged) and simple replies.
#[test]
fn replies_decode_to_what_the_server_encoded() {
    // EXPORT_NAME: size and flags, no zeroes.
    let mut hs = Handshake::new(export("img"));
    let mut input = FLAGS.to_vec();
    encode_option(&mut input, NBD_OPT_EXPORT_NAME, b"img");
    let (_, out) = run(&mut hs, &input);
    assert_eq!(
        decode_export_name_reply(out[..EXPORT_NAME_REPLY_BYTES].try_into().unwrap()),
        (1 << 20, ExportInfo::flags_for(false))
    );

    // Simple replies.
    assert_eq!(
        decode_simple_reply(&simple_reply(0x1234, NBD_ENOSPC)),
        Ok(SimpleReply {
            cookie: 0x1234,
            error: NBD_ENOSPC
        })
    );
    let mut bad = simple_reply(1, 0);
    bad[3] ^= 1;
    assert!(matches!(
        decode_simple_reply(&bad),
        Err(ProtocolError::BadReplyMagic(_))
    ));
}
