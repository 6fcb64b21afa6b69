//! The NBD wire protocol as pure functions and state machines: no sockets,
//! no threads, no clocks.
//!
//! Why pure. An NBD server's first and most exposed job is to parse bytes
//! that anyone who can reach the socket may send. Keeping every decision
//! about those bytes here, over plain buffers, makes the parser something a
//! test can drive with arbitrary input (the proptest fuzz in `tests/`) and a
//! checked-in corpus of hostile streams, and leaves the server (`server.rs`)
//! with nothing to get wrong but moving bytes and calling the cache.
//!
//! The protocol (NetworkBlockDevice `doc/proto.md`) has two phases:
//!
//! - The handshake ([`Handshake`]): the server greets with `NBDMAGIC`,
//!   `IHAVEOPT` and its handshake flags; the client answers with its flags
//!   and then sends options, each `IHAVEOPT, option, length, data`, until
//!   one of them (`NBD_OPT_EXPORT_NAME` or `NBD_OPT_GO`) enters transmission
//!   or `NBD_OPT_ABORT` ends the session. Only fixed newstyle is spoken;
//!   unknown options get `NBD_REP_ERR_UNSUP` and haggling goes on.
//! - Transmission ([`RequestDecoder`], [`encode_simple_reply`]): 28-byte
//!   requests (a write carries its payload after the header), answered by
//!   16-byte simple replies (a read's data follows its reply). Replies may
//!   come back in any order; the client matches them by cookie.
//!
//! Bounds. Every length the client sends is checked before anything is
//! allocated for it: option data is at most [`OPTION_DATA_MAX_BYTES`]
//! (longer options are skipped without buffering and answered with
//! `NBD_REP_ERR_TOO_BIG`), names at most [`NAME_MAX_BYTES`], a handshake at
//! most [`OPTIONS_MAX`] options, a request payload at most the decoder's
//! `max_payload_bytes` (longer write payloads are read and thrown away so
//! that the stream stays in step, and the request is answered EINVAL).
//! Range checks against the export size ([`check_request`]) turn into error
//! replies, never disconnects: a confused client keeps its connection. Only
//! a broken framing (bad magic, unknown client flags) ends the session,
//! because after that no later byte can be trusted to be where it seems.

use std::fmt;

/// `NBDMAGIC`: first 8 bytes of the greeting.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the greeting's second word and the magic of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of every request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of every simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flags (server).
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Server supports `NBD_FLAG_C_NO_ZEROES` (no 124 zero bytes after export info).
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags.
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client asks for no zero padding after the export info.
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
/// The export refuses writes.
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
/// The server answers `NBD_CMD_FLUSH`.
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
/// The server honours `NBD_CMD_FLAG_FUA` on writes.
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
/// The export behaves like a rotating disk (hint to the client's scheduler).
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
/// The server answers `NBD_CMD_TRIM`.
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
/// The server answers `NBD_CMD_WRITE_ZEROES`.
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Several connections to the export see each other's writes (flush on one covers all).
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// The server answers `NBD_CMD_CACHE` (prefetch).
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;

/// Options.
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
/// Option: end the handshake, no export.
pub const NBD_OPT_ABORT: u32 = 2;
/// Option: list the exports.
pub const NBD_OPT_LIST: u32 = 3;
/// Option: start TLS (refused: no TLS here).
pub const NBD_OPT_STARTTLS: u32 = 5;
/// Option: describe an export without entering it.
pub const NBD_OPT_INFO: u32 = 6;
/// Option: describe an export and enter transmission.
pub const NBD_OPT_GO: u32 = 7;
/// Option: structured replies (refused: simple replies only).
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;

/// Option reply types.
pub const NBD_REP_ACK: u32 = 1;
/// Reply: one export's name (to `NBD_OPT_LIST`).
pub const NBD_REP_SERVER: u32 = 2;
/// Reply: one piece of information about an export.
pub const NBD_REP_INFO: u32 = 3;
const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
/// Error reply: option not supported.
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR | 1;
/// Error reply: refused by policy.
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR | 2;
/// Error reply: malformed option.
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR | 3;
/// Error reply: no such export.
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR | 6;
/// Error reply: request too big.
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR | 9;

/// Information types in `NBD_REP_INFO`.
pub const NBD_INFO_EXPORT: u16 = 0;
/// Info: the export's name.
pub const NBD_INFO_NAME: u16 = 1;
/// Info: the export's description.
pub const NBD_INFO_DESCRIPTION: u16 = 2;
/// Info: block size constraints (minimum, preferred, maximum).
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

/// Commands.
pub const NBD_CMD_READ: u16 = 0;
/// Command: write the payload.
pub const NBD_CMD_WRITE: u16 = 1;
/// Command: disconnect after the requests in flight.
pub const NBD_CMD_DISC: u16 = 2;
/// Command: make written data durable.
pub const NBD_CMD_FLUSH: u16 = 3;
/// Command: discard a range (reads then return zeros).
pub const NBD_CMD_TRIM: u16 = 4;
/// Command: prefetch a range into the cache.
pub const NBD_CMD_CACHE: u16 = 5;
/// Command: write zeros to a range.
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;

/// Command flags.
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag on `NBD_CMD_WRITE_ZEROES`: keep the range allocated.
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;

/// Error values in replies (Linux errno numbers, as the protocol fixes them).
pub const NBD_EPERM: u32 = 1;
/// Error: I/O error.
pub const NBD_EIO: u32 = 5;
/// Error: out of memory.
pub const NBD_ENOMEM: u32 = 12;
/// Error: invalid request.
pub const NBD_EINVAL: u32 = 22;
/// Error: no space left.
pub const NBD_ENOSPC: u32 = 28;
/// Error: request beyond the export or too long.
pub const NBD_EOVERFLOW: u32 = 75;
/// Error: command not supported.
pub const NBD_ENOTSUP: u32 = 95;
/// Error: the server is shutting down.
pub const NBD_ESHUTDOWN: u32 = 108;

/// Most option data buffered for one option; longer options are skipped.
pub const OPTION_DATA_MAX_BYTES: u32 = 64 * 1024;
/// Longest export name (proto.md: strings MUST be at most 4096 bytes).
pub const NAME_MAX_BYTES: usize = 4096;
/// Most options in one handshake (a client haggling forever is hostile).
pub const OPTIONS_MAX: u32 = 1024;
/// Most information requests in one `NBD_OPT_INFO`/`NBD_OPT_GO`.
const INFO_REQUESTS_MAX: usize = 64;
/// Bytes of the server's greeting.
pub const GREETING_BYTES: usize = 18;
/// Bytes of a request header.
pub const REQUEST_BYTES: usize = 28;
/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Bytes of an option header: `IHAVEOPT`, the option, the data's length.
pub const OPTION_HEADER_BYTES: usize = 16;
/// Bytes of an option reply header: magic, option, reply type, length.
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;
/// Bytes of the export data that answers `NBD_OPT_EXPORT_NAME` (size and
/// transmission flags), before the 124 zeroes a client may ask to skip.
pub const EXPORT_NAME_REPLY_BYTES: usize = 10;
/// Default largest request (read length or write payload).
pub const PAYLOAD_MAX_BYTES_DEFAULT: u32 = 32 << 20;

/// Why a session must end: the framing is broken or the client is hostile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("client flags {0:#x} include bits this server does not know")]
    /// Client flags with bits this server does not know.
    UnknownClientFlags(u32),
    #[error("option magic {0:#018x} is not IHAVEOPT")]
    /// An option without the `IHAVEOPT` magic.
    BadOptionMagic(u64),
    #[error("more than {OPTIONS_MAX} options in one handshake")]
    /// More than `OPTIONS_MAX` options in one handshake.
    TooManyOptions,
    #[error("option {0} is not allowed without fixed newstyle negotiation")]
    /// An option sent without fixed newstyle negotiation.
    NotFixedNewstyle(u32),
    #[error("NBD_OPT_EXPORT_NAME asked for an unknown export")]
    /// `NBD_OPT_EXPORT_NAME` for an export that does not exist.
    UnknownExport,
    #[error("the server turned the client away (NBD_OPT_EXPORT_NAME has no error reply)")]
    /// `NBD_OPT_EXPORT_NAME` to a handshake that refuses every session.
    Refused,
    #[error("request magic {0:#010x} is not NBD_REQUEST_MAGIC")]
    /// A request without the request magic.
    BadRequestMagic(u32),
    #[error("the session has already ended")]
    /// Input after the session ended.
    Finished,
    #[error("greeting {0:#018x} is not NBDMAGIC with IHAVEOPT")]
    /// A greeting that is not fixed newstyle (seen by a client).
    BadGreeting(u64),
    #[error("option reply magic {0:#018x} is not the option reply magic")]
    /// An option reply without its magic (seen by a client).
    BadOptionReplyMagic(u64),
    #[error("reply magic {0:#010x} is not NBD_SIMPLE_REPLY_MAGIC")]
    /// A reply without the simple reply magic (seen by a client).
    BadReplyMagic(u32),
}

/// What the server exports, as the handshake announces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    /// The export's name.
    pub name: String,
    /// A line describing the export.
    pub description: String,
    /// Size of the export.
    pub size_bytes: u64,
    /// `NBD_FLAG_*` transmission flags.
    pub transmission_flags: u16,
    /// Smallest request the client should send.
    pub block_size_min_bytes: u32,
    /// Request size that performs best.
    pub block_size_preferred_bytes: u32,
    /// Largest request the server takes.
    pub block_size_max_bytes: u32,
}

impl ExportInfo {
    /// The transmission flags for a cache-backed image: everything this
    /// server implements, and `NBD_FLAG_READ_ONLY` when asked.
    pub fn flags_for(read_only: bool) -> u16 {
        let mut flags = NBD_FLAG_HAS_FLAGS
            | NBD_FLAG_SEND_FLUSH
            | NBD_FLAG_SEND_FUA
            | NBD_FLAG_CAN_MULTI_CONN
            | NBD_FLAG_SEND_CACHE;
        if read_only {
            flags |= NBD_FLAG_READ_ONLY;
        } else {
            flags |= NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES;
        }
        flags
    }
}

/// Where the handshake stands after a [`Handshake::push`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeStatus {
    /// Needs more input.
    Negotiating,
    /// The export was chosen; bytes after the consumed ones are requests.
    Transmission,
    /// The client asked to end (`NBD_OPT_ABORT`, answered): close the socket.
    Aborted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HandshakeState {
    ClientFlags,
    OptionHeader,
    OptionData { option: u32, length_bytes: u32 },
    Discard { option: u32, remaining_bytes: u32 },
    Done,
}

/// The server side of the fixed newstyle handshake, over byte buffers.
///
/// Feed it whatever arrived with [`Self::push`]; it appends what to send to
/// `out` and says how many input bytes it used. It buffers at most one
/// option header and [`OPTION_DATA_MAX_BYTES`] of option data.
pub struct Handshake {
    export: ExportInfo,
    state: HandshakeState,
    pending: Vec<u8>,
    no_zeroes: bool,
    fixed_newstyle: bool,
    options_seen: u32,
    /// Set for a client the server turns away: why, sent with every error.
    refusal: Option<Vec<u8>>,
}

impl Handshake {
    /// A handshake for one export.
    pub fn new(export: ExportInfo) -> Self {
        assert!(export.name.len() <= NAME_MAX_BYTES);
        assert!(
            export.block_size_min_bytes >= 1
                && export.block_size_min_bytes <= export.block_size_preferred_bytes
                && export.block_size_preferred_bytes <= export.block_size_max_bytes
        );
        Self {
            export,
            state: HandshakeState::ClientFlags,
            pending: Vec::new(),
            no_zeroes: false,
            fixed_newstyle: false,
            options_seen: 0,
            refusal: None,
        }
    }

    /// A handshake that turns the client away: every option that can take
    /// an error reply gets `NBD_REP_ERR_POLICY` with `reason` (clients such
    /// as nbdinfo print it), `NBD_OPT_ABORT` is acknowledged, and
    /// `NBD_OPT_EXPORT_NAME`, which has no error reply, ends the session.
    pub fn refusing(export: ExportInfo, reason: &str) -> Self {
        let mut hs = Self::new(export);
        let text = &reason.as_bytes()[..reason.len().min(NAME_MAX_BYTES)];
        hs.refusal = Some(text.to_vec());
        hs
    }

    /// The server's greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
    pub fn greeting(&self) -> [u8; GREETING_BYTES] {
        let mut g = [0u8; GREETING_BYTES];
        g[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
        g[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        g[16..18].copy_from_slice(&(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES).to_be_bytes());
        g
    }

    /// The export the client chose (valid once in transmission).
    pub fn export(&self) -> &ExportInfo {
        &self.export
    }

    /// Bytes buffered (for tests: never more than one option).
    pub fn buffered_bytes(&self) -> usize {
        self.pending.len()
    }

    /// How many more bytes the current step needs (at least 1 while negotiating).
    fn wanted_bytes(&self) -> usize {
        match self.state {
            HandshakeState::ClientFlags => 4 - self.pending.len(),
            HandshakeState::OptionHeader => OPTION_HEADER_BYTES - self.pending.len(),
            HandshakeState::OptionData { length_bytes, .. } => {
                length_bytes as usize - self.pending.len()
            }
            HandshakeState::Discard {
                remaining_bytes, ..
            } => remaining_bytes as usize,
            HandshakeState::Done => 0,
        }
    }

    /// Consumes input, appends replies to `out`. Returns bytes consumed and
    /// the status; after `Transmission` or `Aborted` nothing more is consumed.
    pub fn push(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(usize, HandshakeStatus), ProtocolError> {
        let mut used = 0usize;
        loop {
            if self.state == HandshakeState::Done {
                return Err(ProtocolError::Finished);
            }
            let want = self.wanted_bytes();
            let take = want.min(input.len() - used);
            if let HandshakeState::Discard {
                option,
                remaining_bytes,
            } = self.state
            {
                let left = remaining_bytes - take as u32;
                used += take;
                if left > 0 {
                    self.state = HandshakeState::Discard {
                        option,
                        remaining_bytes: left,
                    };
                    return Ok((used, HandshakeStatus::Negotiating));
                }
                option_reply(out, option, NBD_REP_ERR_TOO_BIG, b"option data too long");
                self.state = HandshakeState::OptionHeader;
                continue;
            }
            self.pending.extend_from_slice(&input[used..used + take]);
            used += take;
            if take < want {
                return Ok((used, HandshakeStatus::Negotiating));
            }
            debug_assert!(self.pending.len() <= OPTION_DATA_MAX_BYTES as usize);
            let status = self.step(out)?;
            self.pending.clear();
            if status != HandshakeStatus::Negotiating {
                self.state = HandshakeState::Done;
                self.pending = Vec::new();
                return Ok((used, status));
            }
            if used == input.len() && self.wanted_bytes() > 0 {
                return Ok((used, HandshakeStatus::Negotiating));
            }
        }
    }

    /// Handles one complete unit in `pending`.
    fn step(&mut self, out: &mut Vec<u8>) -> Result<HandshakeStatus, ProtocolError> {
        match self.state {
            HandshakeState::ClientFlags => {
                let flags = be_u32(&self.pending[0..4]);
                if flags & !(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES) != 0 {
                    return Err(ProtocolError::UnknownClientFlags(flags));
                }
                self.fixed_newstyle = flags & NBD_FLAG_C_FIXED_NEWSTYLE != 0;
                self.no_zeroes = flags & NBD_FLAG_C_NO_ZEROES != 0;
                self.state = HandshakeState::OptionHeader;
                Ok(HandshakeStatus::Negotiating)
            }
            HandshakeState::OptionHeader => {
                let magic = be_u64(&self.pending[0..8]);
                if magic != IHAVEOPT {
                    return Err(ProtocolError::BadOptionMagic(magic));
                }
                self.options_seen += 1;
                if self.options_seen > OPTIONS_MAX {
                    return Err(ProtocolError::TooManyOptions);
                }
                let option = be_u32(&self.pending[8..12]);
                let length_bytes = be_u32(&self.pending[12..16]);
                if !self.fixed_newstyle && option != NBD_OPT_EXPORT_NAME {
                    return Err(ProtocolError::NotFixedNewstyle(option));
                }
                self.state = if length_bytes > OPTION_DATA_MAX_BYTES {
                    if option == NBD_OPT_EXPORT_NAME {
                        // No error reply exists for EXPORT_NAME: end the session.
                        return Err(ProtocolError::UnknownExport);
                    }
                    HandshakeState::Discard {
                        option,
                        remaining_bytes: length_bytes,
                    }
                } else {
                    HandshakeState::OptionData {
                        option,
                        length_bytes,
                    }
                };
                // An option with no data is complete now.
                if length_bytes == 0 {
                    self.pending.clear();
                    return self.step(out);
                }
                Ok(HandshakeStatus::Negotiating)
            }
            HandshakeState::OptionData { option, .. } => {
                self.state = HandshakeState::OptionHeader;
                let data = std::mem::take(&mut self.pending);
                let status = self.option(option, &data, out);
                self.pending = data;
                status
            }
            HandshakeState::Discard { .. } | HandshakeState::Done => {
                unreachable!("handled in push")
            }
        }
    }

    fn option(
        &mut self,
        option: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<HandshakeStatus, ProtocolError> {
        if let Some(reason) = &self.refusal {
            return match option {
                NBD_OPT_ABORT => {
                    option_reply(out, option, NBD_REP_ACK, &[]);
                    Ok(HandshakeStatus::Aborted)
                }
                NBD_OPT_EXPORT_NAME => Err(ProtocolError::Refused),
                _ => {
                    option_reply(out, option, NBD_REP_ERR_POLICY, reason);
                    Ok(HandshakeStatus::Negotiating)
                }
            };
        }
        match option {
            NBD_OPT_EXPORT_NAME => {
                if data != self.export.name.as_bytes() {
                    return Err(ProtocolError::UnknownExport);
                }
                out.extend_from_slice(&self.export.size_bytes.to_be_bytes());
                out.extend_from_slice(&self.export.transmission_flags.to_be_bytes());
                if !self.no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                Ok(HandshakeStatus::Transmission)
            }
            NBD_OPT_ABORT => {
                option_reply(out, option, NBD_REP_ACK, &[]);
                Ok(HandshakeStatus::Aborted)
            }
            NBD_OPT_LIST => {
                if !data.is_empty() {
                    option_reply(out, option, NBD_REP_ERR_INVALID, b"LIST takes no data");
                    return Ok(HandshakeStatus::Negotiating);
                }
                let name = self.export.name.as_bytes();
                let mut reply = Vec::with_capacity(4 + name.len());
                reply.extend_from_slice(&(name.len() as u32).to_be_bytes());
                reply.extend_from_slice(name);
                option_reply(out, option, NBD_REP_SERVER, &reply);
                option_reply(out, option, NBD_REP_ACK, &[]);
                Ok(HandshakeStatus::Negotiating)
            }
            NBD_OPT_INFO | NBD_OPT_GO => self.info_or_go(option, data, out),
            _ => {
                option_reply(out, option, NBD_REP_ERR_UNSUP, b"option not supported");
                Ok(HandshakeStatus::Negotiating)
            }
        }
    }

    fn info_or_go(
        &mut self,
        option: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<HandshakeStatus, ProtocolError> {
        let Some(request) = parse_info_request(data) else {
            option_reply(
                out,
                option,
                NBD_REP_ERR_INVALID,
                b"malformed INFO/GO request",
            );
            return Ok(HandshakeStatus::Negotiating);
        };
        if request.name != self.export.name.as_bytes() {
            option_reply(out, option, NBD_REP_ERR_UNKNOWN, b"no such export");
            return Ok(HandshakeStatus::Negotiating);
        }
        let e = &self.export;
        let mut info = Vec::with_capacity(12);
        info.extend_from_slice(&NBD_INFO_EXPORT.to_be_bytes());
        info.extend_from_slice(&e.size_bytes.to_be_bytes());
        info.extend_from_slice(&e.transmission_flags.to_be_bytes());
        option_reply(out, option, NBD_REP_INFO, &info);
        // Sent whether asked or not: the constraints are advisory (we
        // accept any alignment) and clients such as nbdinfo show them.
        let mut info = Vec::with_capacity(14);
        info.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
        info.extend_from_slice(&e.block_size_min_bytes.to_be_bytes());
        info.extend_from_slice(&e.block_size_preferred_bytes.to_be_bytes());
        info.extend_from_slice(&e.block_size_max_bytes.to_be_bytes());
        option_reply(out, option, NBD_REP_INFO, &info);
        if request.wants(NBD_INFO_NAME) {
            let mut info = Vec::with_capacity(2 + e.name.len());
            info.extend_from_slice(&NBD_INFO_NAME.to_be_bytes());
            info.extend_from_slice(e.name.as_bytes());
            option_reply(out, option, NBD_REP_INFO, &info);
        }
        if request.wants(NBD_INFO_DESCRIPTION) && !e.description.is_empty() {
            let text = &e.description.as_bytes()[..e.description.len().min(NAME_MAX_BYTES)];
            let mut info = Vec::with_capacity(2 + text.len());
            info.extend_from_slice(&NBD_INFO_DESCRIPTION.to_be_bytes());
            info.extend_from_slice(text);
            option_reply(out, option, NBD_REP_INFO, &info);
        }
        option_reply(out, option, NBD_REP_ACK, &[]);
        Ok(if option == NBD_OPT_GO {
            HandshakeStatus::Transmission
        } else {
            HandshakeStatus::Negotiating
        })
    }
}

/// The data of `NBD_OPT_INFO` / `NBD_OPT_GO`.
struct InfoRequest<'a> {
    name: &'a [u8],
    requests: &'a [u8],
}

impl InfoRequest<'_> {
    fn wants(&self, info: u16) -> bool {
        self.requests
            .chunks_exact(2)
            .any(|c| u16::from_be_bytes([c[0], c[1]]) == info)
    }
}

/// `u32 name length, name, u16 count, count × u16`; exactly that long.
fn parse_info_request(data: &[u8]) -> Option<InfoRequest<'_>> {
    let name_len = be_u32(data.get(0..4)?) as usize;
    if name_len > NAME_MAX_BYTES {
        return None;
    }
    let name = data.get(4..4 + name_len)?;
    let count_at = 4 + name_len;
    let count = u16::from_be_bytes(data.get(count_at..count_at + 2)?.try_into().ok()?) as usize;
    if count > INFO_REQUESTS_MAX {
        return None;
    }
    let requests = data.get(count_at + 2..)?;
    if requests.len() != 2 * count {
        return None;
    }
    Some(InfoRequest { name, requests })
}

/// Appends one option reply.
pub fn option_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, data: &[u8]) {
    assert!(data.len() <= OPTION_DATA_MAX_BYTES as usize);
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b.try_into().expect("4 bytes"))
}

fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().expect("8 bytes"))
}

/// A request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// `NBD_CMD_FLAG_*` bits.
    pub flags: u16,
    /// `NBD_CMD_*` value.
    pub command: u16,
    /// The client's handle, echoed in the reply.
    pub cookie: u64,
    /// Offset into the export.
    pub offset_bytes: u64,
    /// Bytes to read, write, trim or zero.
    pub length_bytes: u32,
}

impl Request {
    /// Decodes a 28-byte request header.
    pub fn decode(header: &[u8; REQUEST_BYTES]) -> Result<Self, ProtocolError> {
        let magic = be_u32(&header[0..4]);
        if magic != REQUEST_MAGIC {
            return Err(ProtocolError::BadRequestMagic(magic));
        }
        Ok(Self {
            flags: u16::from_be_bytes([header[4], header[5]]),
            command: u16::from_be_bytes([header[6], header[7]]),
            cookie: be_u64(&header[8..16]),
            offset_bytes: be_u64(&header[16..24]),
            length_bytes: be_u32(&header[24..28]),
        })
    }

    /// The 28 bytes on the wire.
    pub fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut h = [0u8; REQUEST_BYTES];
        h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&self.flags.to_be_bytes());
        h[6..8].copy_from_slice(&self.command.to_be_bytes());
        h[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        h[16..24].copy_from_slice(&self.offset_bytes.to_be_bytes());
        h[24..28].copy_from_slice(&self.length_bytes.to_be_bytes());
        h
    }
}

/// One decoded request.
#[derive(Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A request; `payload` holds a write's data (empty for other commands).
    Request {
        /// The header.
        request: Request,
        /// A write's data.
        payload: Vec<u8>,
    },
    /// A write whose data was read and thrown away: longer than the payload
    /// limit, or [`PayloadMode::Discard`] was chosen. Answer it with an error.
    Oversized(Request),
    /// Only from a [`RequestDecoder::gated`] decoder: the header of a write
    /// with data. Nothing of its payload is buffered until the caller says
    /// how to take it ([`RequestDecoder::choose_payload`]), so the caller can
    /// charge the memory (or refuse the write) before a byte is held.
    WriteHeader(Request),
    /// One piece of a write taken with [`PayloadMode::Chunks`]: `data` goes
    /// at `at_bytes` from the request's offset; `last` on the final piece.
    WriteChunk {
        /// The write's header.
        request: Request,
        /// Where this piece goes, from the request's offset.
        at_bytes: u32,
        /// The piece.
        data: Vec<u8>,
        /// Whether this is the final piece.
        last: bool,
    },
}

/// How the payload announced by [`Decoded::WriteHeader`] is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadMode {
    /// Whole, in one buffer ([`Decoded::Request`]). A payload over the
    /// decoder's `max_payload_bytes` is discarded instead.
    Buffer,
    /// In pieces of at most `chunk_bytes` ([`Decoded::WriteChunk`]), for a
    /// write larger than any one buffer should be; `chunk_bytes` is clamped
    /// to 1..=`max_payload_bytes`.
    Chunks {
        /// Largest piece.
        chunk_bytes: u32,
    },
    /// Read and thrown away; ends with [`Decoded::Oversized`].
    Discard,
}

impl fmt::Debug for Decoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decoded::Request { request, payload } => f
                .debug_struct("Request")
                .field("request", request)
                .field("payload_bytes", &payload.len())
                .finish(),
            Decoded::Oversized(r) => f.debug_tuple("Oversized").field(r).finish(),
            Decoded::WriteHeader(r) => f.debug_tuple("WriteHeader").field(r).finish(),
            Decoded::WriteChunk {
                request,
                at_bytes,
                data,
                last,
            } => f
                .debug_struct("WriteChunk")
                .field("request", request)
                .field("at_bytes", at_bytes)
                .field("data_bytes", &data.len())
                .field("last", last)
                .finish(),
        }
    }
}

enum DecoderState {
    Header,
    Payload {
        request: Request,
        data: Vec<u8>,
    },
    Discard {
        request: Request,
        remaining_bytes: u32,
    },
    /// A gated decoder after a write header: waiting for a [`PayloadMode`].
    Gate {
        request: Request,
    },
    Chunks {
        request: Request,
        at_bytes: u32,
        chunk_bytes: u32,
        data: Vec<u8>,
    },
    Failed,
}

/// Splits the transmission byte stream into requests.
///
/// Holds at most one request header and one payload of at most
/// `max_payload_bytes`. After an error it stays failed.
pub struct RequestDecoder {
    max_payload_bytes: u32,
    header: [u8; REQUEST_BYTES],
    header_len: usize,
    state: DecoderState,
    /// Stop after each write header ([`Decoded::WriteHeader`]).
    gated: bool,
}

impl RequestDecoder {
    /// A decoder that takes payloads up to `max_payload_bytes`.
    pub fn new(max_payload_bytes: u32) -> Self {
        Self {
            max_payload_bytes,
            header: [0; REQUEST_BYTES],
            header_len: 0,
            state: DecoderState::Header,
            gated: false,
        }
    }

    /// A decoder that hands back every write's header before taking its
    /// payload ([`Decoded::WriteHeader`]); the caller then picks a
    /// [`PayloadMode`]. Pushing without choosing takes the payload as
    /// [`Self::new`] would (buffered if it fits, else discarded).
    pub fn gated(max_payload_bytes: u32) -> Self {
        Self {
            gated: true,
            ..Self::new(max_payload_bytes)
        }
    }

    /// Payload bytes buffered now (bounded by `max_payload_bytes`).
    pub fn buffered_bytes(&self) -> usize {
        match &self.state {
            DecoderState::Payload { data, .. } | DecoderState::Chunks { data, .. } => {
                data.capacity()
            }
            _ => self.header_len,
        }
    }

    /// Says how to take the payload announced by [`Decoded::WriteHeader`].
    /// False (and nothing changes) if the decoder is not waiting for that.
    pub fn choose_payload(&mut self, mode: PayloadMode) -> bool {
        let DecoderState::Gate { request } = self.state else {
            return false;
        };
        let length_bytes = request.length_bytes;
        self.state = match mode {
            PayloadMode::Buffer if length_bytes <= self.max_payload_bytes => {
                DecoderState::Payload {
                    request,
                    data: Vec::new(),
                }
            }
            PayloadMode::Chunks { chunk_bytes } => DecoderState::Chunks {
                request,
                at_bytes: 0,
                chunk_bytes: chunk_bytes.clamp(1, self.max_payload_bytes),
                data: Vec::new(),
            },
            PayloadMode::Buffer | PayloadMode::Discard => DecoderState::Discard {
                request,
                remaining_bytes: length_bytes,
            },
        };
        true
    }

    /// Consumes input up to the end of one request; returns bytes consumed
    /// and the request if one was completed.
    pub fn push(&mut self, input: &[u8]) -> Result<(usize, Option<Decoded>), ProtocolError> {
        let mut used = 0usize;
        loop {
            let step = match self.state {
                DecoderState::Failed => return Err(ProtocolError::Finished),
                DecoderState::Header => self.take_header(input, used)?,
                DecoderState::Gate { .. } => {
                    // No mode chosen: as an ungated decoder would.
                    let chosen = self.choose_payload(PayloadMode::Buffer);
                    debug_assert!(chosen);
                    Step::Again(used)
                }
                DecoderState::Chunks { .. } => self.take_chunk(input, used),
                DecoderState::Payload { .. } => self.take_payload(input, used),
                DecoderState::Discard { .. } => self.take_discarded(input, used),
            };
            match step {
                Step::Again(u) => used = u,
                Step::Done(u, decoded) => return Ok((u, decoded)),
            }
        }
    }

    /// Gathers a request header; a write with data goes on to its payload.
    fn take_header(&mut self, input: &[u8], mut used: usize) -> Result<Step, ProtocolError> {
        let take = (REQUEST_BYTES - self.header_len).min(input.len() - used);
        self.header[self.header_len..self.header_len + take]
            .copy_from_slice(&input[used..used + take]);
        self.header_len += take;
        used += take;
        if self.header_len < REQUEST_BYTES {
            return Ok(Step::Done(used, None));
        }
        self.header_len = 0;
        let request = match Request::decode(&self.header) {
            Ok(r) => r,
            Err(e) => {
                self.state = DecoderState::Failed;
                return Err(e);
            }
        };
        if request.command != NBD_CMD_WRITE || request.length_bytes == 0 {
            let payload = Vec::new();
            return Ok(Step::Done(
                used,
                Some(Decoded::Request { request, payload }),
            ));
        }
        self.state = DecoderState::Gate { request };
        if self.gated {
            return Ok(Step::Done(used, Some(Decoded::WriteHeader(request))));
        }
        Ok(Step::Again(used))
    }

    /// Gathers one piece of a write taken in pieces.
    fn take_chunk(&mut self, input: &[u8], mut used: usize) -> Step {
        let DecoderState::Chunks {
            request,
            at_bytes,
            chunk_bytes,
            data,
        } = &mut self.state
        else {
            unreachable!("called in the Chunks state");
        };
        let left_bytes = request.length_bytes - *at_bytes;
        let piece_bytes = left_bytes.min(*chunk_bytes) as usize;
        if data.capacity() == 0 {
            // Allocated only once a byte of this piece is here.
            if used == input.len() {
                return Step::Done(used, None);
            }
            data.reserve_exact(piece_bytes);
        }
        let take = (piece_bytes - data.len()).min(input.len() - used);
        data.extend_from_slice(&input[used..used + take]);
        used += take;
        if data.len() < piece_bytes {
            return Step::Done(used, None);
        }
        let request = *request;
        let piece_at = *at_bytes;
        let data = std::mem::take(data);
        let last = piece_bytes as u32 == left_bytes;
        if last {
            self.state = DecoderState::Header;
        } else {
            *at_bytes += piece_bytes as u32;
        }
        let chunk = Decoded::WriteChunk {
            request,
            at_bytes: piece_at,
            data,
            last,
        };
        Step::Done(used, Some(chunk))
    }

    /// Gathers a whole write payload.
    fn take_payload(&mut self, input: &[u8], mut used: usize) -> Step {
        let DecoderState::Payload { request, data } = &mut self.state else {
            unreachable!("called in the Payload state");
        };
        let want = request.length_bytes as usize - data.len();
        if data.capacity() == 0 {
            // Allocated only once a byte of the payload is here.
            if used == input.len() {
                return Step::Done(used, None);
            }
            data.reserve_exact(request.length_bytes as usize);
        }
        let take = want.min(input.len() - used);
        data.extend_from_slice(&input[used..used + take]);
        used += take;
        if take < want {
            return Step::Done(used, None);
        }
        debug_assert_eq!(data.len(), request.length_bytes as usize);
        let request = *request;
        let payload = std::mem::take(data);
        self.state = DecoderState::Header;
        Step::Done(used, Some(Decoded::Request { request, payload }))
    }

    /// Skips a payload that will not be kept.
    fn take_discarded(&mut self, input: &[u8], mut used: usize) -> Step {
        let DecoderState::Discard {
            request,
            remaining_bytes,
        } = &mut self.state
        else {
            unreachable!("called in the Discard state");
        };
        let take = (*remaining_bytes as usize).min(input.len() - used);
        *remaining_bytes -= take as u32;
        used += take;
        if *remaining_bytes > 0 {
            return Step::Done(used, None);
        }
        let request = *request;
        self.state = DecoderState::Header;
        Step::Done(used, Some(Decoded::Oversized(request)))
    }
}

/// What one state of the decoder did with the input.
enum Step {
    /// Moved to another state; go on at this many bytes used.
    Again(usize),
    /// Return to the caller: bytes used, and a request if one completed.
    Done(usize, Option<Decoded>),
}

/// Appends a simple reply header.
pub fn encode_simple_reply(out: &mut Vec<u8>, cookie: u64, error: u32) {
    out.extend_from_slice(&simple_reply(cookie, error));
}

/// A simple reply header.
pub fn simple_reply(cookie: u64, error: u32) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut r = [0u8; SIMPLE_REPLY_BYTES];
    r[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    r[4..8].copy_from_slice(&error.to_be_bytes());
    r[8..16].copy_from_slice(&cookie.to_be_bytes());
    r
}

// The client's side: what a client sends and how it reads the answers
// (for the test kit's client, fuzzers and seeds; the server never calls
// these). Each is the inverse of the server's code above, and the tests
// check them against it.

/// An option header announcing `length_bytes` of data (a hostile client
/// may announce a length it does not send).
pub fn option_header(option: u32, length_bytes: u32) -> [u8; OPTION_HEADER_BYTES] {
    let mut h = [0u8; OPTION_HEADER_BYTES];
    h[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
    h[8..12].copy_from_slice(&option.to_be_bytes());
    h[12..16].copy_from_slice(&length_bytes.to_be_bytes());
    h
}

/// Appends one option with its data.
pub fn encode_option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    let length_bytes = u32::try_from(data.len()).expect("option data fits a u32 length");
    out.extend_from_slice(&option_header(option, length_bytes));
    out.extend_from_slice(data);
}

/// Appends the data of `NBD_OPT_INFO` or `NBD_OPT_GO`: the export's name
/// and the `NBD_INFO_*` items asked for.
pub fn encode_info_request(out: &mut Vec<u8>, name: &str, infos: &[u16]) {
    assert!(name.len() <= NAME_MAX_BYTES && infos.len() <= INFO_REQUESTS_MAX);
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for info in infos {
        out.extend_from_slice(&info.to_be_bytes());
    }
}

/// The handshake flags of a server's greeting, if it is a newstyle one.
pub fn decode_greeting(greeting: &[u8; GREETING_BYTES]) -> Result<u16, ProtocolError> {
    let (magic, option_magic) = (be_u64(&greeting[0..8]), be_u64(&greeting[8..16]));
    if magic != NBD_MAGIC || option_magic != IHAVEOPT {
        return Err(ProtocolError::BadGreeting(magic));
    }
    Ok(u16::from_be_bytes([greeting[16], greeting[17]]))
}

/// The header of an option reply; its data follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReplyHeader {
    /// The option answered.
    pub option: u32,
    /// `NBD_REP_*`; errors have bit 31 set.
    pub reply_type: u32,
    /// Bytes of data that follow.
    pub length_bytes: u32,
}

impl OptionReplyHeader {
    /// Decodes the 20 bytes on the wire.
    pub fn decode(header: &[u8; OPTION_REPLY_HEADER_BYTES]) -> Result<Self, ProtocolError> {
        match be_u64(&header[0..8]) {
            OPTION_REPLY_MAGIC => Ok(Self {
                option: be_u32(&header[8..12]),
                reply_type: be_u32(&header[12..16]),
                length_bytes: be_u32(&header[16..20]),
            }),
            magic => Err(ProtocolError::BadOptionReplyMagic(magic)),
        }
    }

    /// Whether the reply is an error (`NBD_REP_ERR_*`).
    pub fn is_error(&self) -> bool {
        self.reply_type & NBD_REP_FLAG_ERROR != 0
    }
}

/// The size and transmission flags in the data of an `NBD_REP_INFO` reply,
/// if it is `NBD_INFO_EXPORT`.
pub fn decode_info_export(data: &[u8]) -> Option<(u64, u16)> {
    if data.len() != 2 + EXPORT_NAME_REPLY_BYTES
        || u16::from_be_bytes([data[0], data[1]]) != NBD_INFO_EXPORT
    {
        return None;
    }
    Some(decode_export_name_reply(data[2..].try_into().ok()?))
}

/// The size and transmission flags that answer `NBD_OPT_EXPORT_NAME`.
pub fn decode_export_name_reply(data: &[u8; EXPORT_NAME_REPLY_BYTES]) -> (u64, u16) {
    (be_u64(&data[0..8]), u16::from_be_bytes([data[8], data[9]]))
}

/// A simple reply header; a successful read's data follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleReply {
    /// The request's cookie.
    pub cookie: u64,
    /// 0, or an `NBD_E*` errno.
    pub error: u32,
}

/// Decodes a simple reply header (what [`simple_reply`] encodes).
pub fn decode_simple_reply(
    header: &[u8; SIMPLE_REPLY_BYTES],
) -> Result<SimpleReply, ProtocolError> {
    match be_u32(&header[0..4]) {
        SIMPLE_REPLY_MAGIC => Ok(SimpleReply {
            error: be_u32(&header[4..8]),
            cookie: be_u64(&header[8..16]),
        }),
        magic => Err(ProtocolError::BadReplyMagic(magic)),
    }
}

/// What a valid request asks the server to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Read a range.
    Read,
    /// Write the payload.
    Write,
    /// End the session.
    Disconnect,
    /// Make writes durable.
    Flush,
    /// Discard a range.
    Trim,
    /// Prefetch a range.
    Cache,
    /// Write zeros to a range.
    WriteZeroes,
}

/// Checks a request against the export: a command the server implements,
/// flags that command allows, a range inside the export, a length within
/// the payload limit, and no change to a read-only export. `Err` is the
/// errno to reply with; the connection goes on.
pub fn check_request(
    request: &Request,
    export_size_bytes: u64,
    read_only: bool,
    max_payload_bytes: u32,
) -> Result<Command, u32> {
    let (command, allowed_flags, writes) = match request.command {
        NBD_CMD_READ => (Command::Read, 0, false),
        NBD_CMD_WRITE => (Command::Write, NBD_CMD_FLAG_FUA, true),
        NBD_CMD_DISC => return Ok(Command::Disconnect),
        NBD_CMD_FLUSH => (Command::Flush, 0, false),
        NBD_CMD_TRIM => (Command::Trim, NBD_CMD_FLAG_FUA, true),
        NBD_CMD_CACHE => (Command::Cache, 0, false),
        NBD_CMD_WRITE_ZEROES => (
            Command::WriteZeroes,
            NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE,
            true,
        ),
        _ => return Err(NBD_EINVAL),
    };
    if request.flags & !allowed_flags != 0 {
        return Err(NBD_EINVAL);
    }
    if writes && read_only {
        return Err(NBD_EPERM);
    }
    if command == Command::Flush {
        return Ok(command);
    }
    let carries_data = matches!(command, Command::Read | Command::Write);
    if carries_data && request.length_bytes > max_payload_bytes {
        return Err(if command == Command::Read {
            NBD_EOVERFLOW
        } else {
            NBD_EINVAL
        });
    }
    let in_range = request
        .offset_bytes
        .checked_add(u64::from(request.length_bytes))
        .is_some_and(|end| end <= export_size_bytes);
    if !in_range {
        return Err(if writes { NBD_ENOSPC } else { NBD_EINVAL });
    }
    Ok(command)
}

/// The reply errno for an I/O error from the cache.
pub fn errno_of(e: &std::io::Error) -> u32 {
    use std::io::ErrorKind;
    if let Some(code) = e.raw_os_error() {
        let code = code as u32;
        if [
            NBD_EPERM,
            NBD_EIO,
            NBD_ENOMEM,
            NBD_EINVAL,
            NBD_ENOSPC,
            NBD_EOVERFLOW,
            NBD_ENOTSUP,
            NBD_ESHUTDOWN,
        ]
        .contains(&code)
        {
            return code;
        }
    }
    match e.kind() {
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => NBD_EPERM,
        ErrorKind::InvalidInput => NBD_EINVAL,
        ErrorKind::OutOfMemory => NBD_ENOMEM,
        ErrorKind::StorageFull | ErrorKind::FileTooLarge => NBD_ENOSPC,
        ErrorKind::Unsupported => NBD_ENOTSUP,
        _ => NBD_EIO,
    }
}
