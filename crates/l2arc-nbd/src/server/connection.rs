//! One client, from greeting to close: the handshake, then the reader.
//!
//! The reader is the connection's one thread that touches its socket for
//! input. It decodes requests (`protocol.rs`), answers malformed or
//! out-of-range ones at once, serves reads of cached data itself through
//! its read queue (`cached_reads`), and hands everything that may block
//! (reads that need primary storage, writes, flushes, trims) to the
//! connection's workers. It sleeps on the socket when nothing of its own
//! is in flight and in its ring (which watches the socket too) when reads
//! are, so an idle connection costs no CPU and a busy one wakes once per
//! event.
//!
//! Every request's buffer is charged to the shared pool before it is
//! allocated (`pool.rs`); a charge that must wait, or a full workers'
//! queue, first lets the reader finish its own reads in flight (the rule in
//! `cached_reads`). Past its bounds the reader stops reading the socket,
//! and TCP pushes back on that client only.

use std::io::{self, Read};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};

use super::admission::{self, Quiet};
use super::budget::{self, WritePlan, read_piece_bytes, split_piece_bytes, write_plan};
use super::cached_reads::CachedReads;
use super::reply::Replier;
use super::table::Slot;
use super::workers::Workers;
use super::{Conn, Job, READ_CHUNK_BYTES, Shared};
use crate::pool::Charge;
use crate::protocol::{
    self, Command, Decoded, Handshake, HandshakeStatus, NBD_CMD_FLAG_FUA, NBD_CMD_WRITE,
    NBD_EINVAL, NBD_ESHUTDOWN, PayloadMode, Request, RequestDecoder,
};

/// Bytes of the handshake's read buffer.
pub(super) const HANDSHAKE_BUF_BYTES: usize = 64 * 1024;
/// Workers a connection starts with; more are started, up to
/// `ServerConfig::workers_per_connection`, while every one is busy. Few:
/// reads of cached data do not need them.
pub const WORKERS_INITIAL: usize = 2;

/// One client, from greeting to close.
pub(super) fn connection(shared: &Arc<Shared>, mut conn: Conn, slot: &Arc<Slot>) {
    match handshake(shared, &mut conn, slot) {
        Ok(Some(leftover)) => {
            slot.last_active_ms
                .store(shared.now_ms(), Ordering::Relaxed);
            slot.transmitting.store(true, Ordering::SeqCst);
            transmission(shared, conn, leftover, slot);
        }
        Ok(None) => conn.shutdown(),
        Err(_) => {
            shared
                .counters
                .protocol_errors
                .fetch_add(1, Ordering::Relaxed);
            conn.shutdown();
        }
    }
}

/// Runs the handshake. `Some(bytes)`: in transmission, with the request
/// bytes that arrived behind the last option; `None`: the client aborted
/// or went away.
fn handshake(shared: &Shared, conn: &mut Conn, slot: &Slot) -> io::Result<Option<Vec<u8>>> {
    let deadline = std::time::Instant::now() + shared.config.handshake_timeout;
    let mut hs = Handshake::new(shared.export.clone());
    conn.set_timeouts(Some(shared.config.handshake_timeout))?;
    io::Write::write_all(conn, &hs.greeting())?;
    let mut buf = vec![0u8; HANDSHAKE_BUF_BYTES];
    let mut out = Vec::new();
    loop {
        if std::time::Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "handshake took too long",
            ));
        }
        let n = match conn.read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        slot.last_active_ms
            .store(shared.now_ms(), Ordering::Relaxed);
        let (at, status) = negotiate(conn, &mut hs, &buf[..n], &mut out)?;
        match status {
            HandshakeStatus::Negotiating => {}
            HandshakeStatus::Aborted => return Ok(None),
            HandshakeStatus::Transmission => {
                conn.set_timeouts(Some(shared.config.idle_timeout))?;
                return Ok(Some(buf[at..n].to_vec()));
            }
        }
    }
}

/// Feeds `input` to the handshake and sends its replies, until the input
/// is used or the handshake is over: the bytes used and where it stands.
/// The replies already due go out even when the next option breaks a
/// limit (the `Err`): the client gets every answer it earned.
pub(super) fn negotiate(
    conn: &mut Conn,
    hs: &mut Handshake,
    input: &[u8],
    out: &mut Vec<u8>,
) -> io::Result<(usize, HandshakeStatus)> {
    let mut at = 0;
    while at < input.len() {
        let pushed = hs.push(&input[at..], out);
        io::Write::write_all(conn, out)?;
        out.clear();
        let (used, status) = pushed.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        at += used;
        if status != HandshakeStatus::Negotiating {
            return Ok((at, status));
        }
    }
    Ok((at, HandshakeStatus::Negotiating))
}

fn transmission(shared: &Arc<Shared>, mut conn: Conn, leftover: Vec<u8>, slot: &Arc<Slot>) {
    let replier = match conn.try_clone() {
        Ok(c) => Arc::new(Replier::new(
            c,
            Arc::clone(&slot.account),
            Arc::clone(&shared.pool),
        )),
        Err(_) => {
            conn.shutdown();
            return;
        }
    };
    let (tx, rx) = sync_channel::<Job>(shared.config.max_in_flight_requests);
    let Some(workers) = Workers::start(shared, rx, &replier, slot, WORKERS_INITIAL) else {
        conn.shutdown();
        return;
    };
    let mut link = Link {
        shared,
        workers: &tx,
        reads: CachedReads::new(shared),
        replier: &replier,
        slot,
    };
    if reader(shared, &mut conn, leftover, &mut link).is_err() {
        shared
            .counters
            .protocol_errors
            .fetch_add(1, Ordering::Relaxed);
        // Broken framing: the client is gone for us; do not finish its work.
        conn.shutdown();
    }
    // Reads in flight are answered (a client that sent NBD_CMD_DISC behind
    // them still gets them); on a dead socket the replies fail at once.
    link.finish_reads();
    drop(link);
    drop(tx);
    workers.join_all();
    slot.account.close(&shared.pool);
    conn.shutdown();
    shared.pool.want_trim();
}

/// Where the reader's requests go: its own read queue, the workers, or an
/// answer at once.
struct Link<'a> {
    shared: &'a Shared,
    workers: &'a SyncSender<Job>,
    /// The connection's read queue, if reads of flash go through io_uring.
    reads: Option<CachedReads<'a>>,
    replier: &'a Replier,
    slot: &'a Slot,
}

/// What one look at the client gave.
enum Input {
    /// Bytes arrived.
    Bytes(usize),
    /// Nothing yet (a read completed, a signal): look again.
    Again,
    /// The client left, or the connection must end.
    Closed,
}

impl Link<'_> {
    /// Waits for the client's next bytes: in the read queue's ring (which
    /// also answers reads as they complete) while reads are in flight, on
    /// the socket otherwise.
    fn next_input(&mut self, conn: &mut Conn, buf: &mut [u8]) -> Input {
        if let Some(reads) = self.reads.as_mut()
            && reads.pending() > 0
        {
            match reads.wait(self.shared, self.replier, self.slot, conn.as_fd()) {
                Ok(true) => {}
                Ok(false) => return Input::Again,
                Err(_) => {
                    reads.abandon(self.replier, self.slot);
                    return Input::Closed;
                }
            }
            return match conn.recv_now(buf) {
                Ok(0) => Input::Closed,
                Ok(n) => Input::Bytes(n),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    Input::Again
                }
                Err(_) => Input::Closed,
            };
        }
        match conn.read(buf) {
            Ok(0) => Input::Closed,
            Ok(n) => Input::Bytes(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Input::Again,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                // Quiet for idle_timeout: idle if nothing is in flight
                // (a client waiting on slow replies is not idle).
                let in_flight = self.slot.in_flight.load(Ordering::SeqCst);
                match admission::quiet_for_idle_timeout(in_flight) {
                    Quiet::Close => {
                        self.shared
                            .counters
                            .connections_idle_closed
                            .fetch_add(1, Ordering::Relaxed);
                        Input::Closed
                    }
                    Quiet::Keep => Input::Again,
                }
            }
            Err(_) => Input::Closed,
        }
    }

    /// Answers every read of the read queue in flight; on a queue failure
    /// the connection ends.
    fn finish_reads(&mut self) {
        if let Some(reads) = self.reads.as_mut()
            && reads
                .finish_all(self.shared, self.replier, self.slot)
                .is_err()
        {
            reads.abandon(self.replier, self.slot);
        }
    }

    /// Charges `bytes` of buffer memory; if that must wait, the reads in
    /// flight are finished first. `None`: the connection is closing.
    fn charge(&mut self, bytes: u64) -> Option<Charge> {
        if let Some(charge) = self.shared.try_charge(self.slot, bytes) {
            return Some(charge);
        }
        self.finish_reads();
        self.shared.charge(self.slot, bytes)
    }

    /// Hands a request to the workers (counted in flight until they are
    /// done with it); if their queue is full, the reads in flight are
    /// finished before waiting for room. False: the connection is closing.
    fn pass_to_workers(&mut self, job: Job) -> bool {
        self.slot.in_flight.fetch_add(1, Ordering::SeqCst);
        let sent = match self.workers.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(job)) => {
                self.finish_reads();
                self.workers.send(job).is_ok()
            }
            Err(TrySendError::Disconnected(_)) => false,
        };
        if !sent {
            self.slot.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        sent
    }

    /// A read of at most one buffer: started in the read queue if its
    /// records are cached, else handed to the workers. False: the
    /// connection is closing.
    fn read(&mut self, job: Job) -> bool {
        let Some(reads) = self.reads.as_mut() else {
            return self.pass_to_workers(job);
        };
        self.slot.in_flight.fetch_add(1, Ordering::SeqCst);
        if self.replier.is_broken() || self.slot.account.is_closed() {
            self.slot.in_flight.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        match reads.take(self.shared, job, self.replier, self.slot) {
            Ok(None) => true,
            Ok(Some(job)) => {
                self.slot.in_flight.fetch_sub(1, Ordering::SeqCst);
                self.pass_to_workers(job)
            }
            Err(_) => {
                reads.abandon(self.replier, self.slot);
                false
            }
        }
    }
}

/// What the reader holds between a write's header and its last byte.
#[derive(Default)]
struct PendingWrite {
    /// The charge for the payload being buffered (or the piece being taken).
    charge: Option<Charge>,
    /// The errno to answer a write whose payload is being thrown away.
    discard_errno: Option<u32>,
    /// A write served by splitting: the first error of its pieces.
    split_errno: Option<u32>,
}

/// Decodes requests and serves or queues them. `Err`: a protocol violation.
fn reader(
    shared: &Shared,
    conn: &mut Conn,
    leftover: Vec<u8>,
    link: &mut Link<'_>,
) -> Result<(), protocol::ProtocolError> {
    let mut decoder = RequestDecoder::gated(shared.config.max_payload_bytes);
    let mut pending = PendingWrite::default();
    // Bytes that arrived behind the handshake's last option come first.
    if !dispatch(shared, &mut decoder, &mut pending, &leftover, link)? {
        return Ok(());
    }
    drop(leftover);
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let n = match link.next_input(conn, &mut buf) {
            Input::Bytes(n) => n,
            Input::Again => continue,
            Input::Closed => return Ok(()),
        };
        link.slot
            .last_active_ms
            .store(shared.now_ms(), Ordering::Relaxed);
        link.slot.account.received_some(&shared.pool);
        if !dispatch(shared, &mut decoder, &mut pending, &buf[..n], link)? {
            return Ok(());
        }
    }
}

/// Decodes `bytes` into requests: errors are answered here, valid requests
/// are served or queued, writes over the payload limit are written here
/// piece by piece. `Ok(false)`: the client disconnected (NBD_CMD_DISC) or
/// the connection is closing.
fn dispatch(
    shared: &Shared,
    decoder: &mut RequestDecoder,
    pending: &mut PendingWrite,
    bytes: &[u8],
    link: &mut Link<'_>,
) -> Result<bool, protocol::ProtocolError> {
    let counters = &shared.counters;
    let mut at = 0;
    while at < bytes.len() {
        let (used, decoded) = decoder.push(&bytes[at..])?;
        at += used;
        let Some(decoded) = decoded else { continue };
        let go_on = match decoded {
            Decoded::WriteHeader(request) => {
                counters.requests.fetch_add(1, Ordering::Relaxed);
                match write_header(shared, link, pending, &request) {
                    Some(mode) => {
                        decoder.choose_payload(mode);
                        true
                    }
                    None => false,
                }
            }
            Decoded::WriteChunk {
                request,
                at_bytes,
                data,
                last,
            } => {
                write_chunk(shared, link, pending, &request, at_bytes, data, last);
                true
            }
            Decoded::Oversized(request) => {
                // A write whose payload was thrown away (refused at its header).
                counters.request_errors.fetch_add(1, Ordering::Relaxed);
                link.replier.reply(
                    request.cookie,
                    pending.discard_errno.take().unwrap_or(NBD_EINVAL),
                );
                true
            }
            Decoded::Request { request, payload } => {
                submit(shared, link, pending, request, payload)
            }
        };
        if !go_on {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Writes one piece of a write taken in pieces; answers the request after
/// its last piece with the first error any piece met.
fn write_chunk(
    shared: &Shared,
    link: &mut Link<'_>,
    pending: &mut PendingWrite,
    request: &Request,
    at_bytes: u32,
    data: Vec<u8>,
    last: bool,
) {
    // The write blocks on primary storage: the reads in flight first.
    link.finish_reads();
    if pending.split_errno.is_none() {
        let r = shared.cache.write(
            &shared.handle,
            request.offset_bytes + u64::from(at_bytes),
            &data,
        );
        pending.split_errno = r.err().map(|e| protocol::errno_of(&e));
    }
    drop(data);
    // The piece is written: waiting for the client again.
    link.slot.account.received_some(&shared.pool);
    if !last {
        return;
    }
    link.slot.account.received_all();
    let fua = request.flags & NBD_CMD_FLAG_FUA != 0;
    if pending.split_errno.is_none()
        && fua
        && let Err(e) = shared.cache.sync(&shared.handle)
    {
        pending.split_errno = Some(protocol::errno_of(&e));
    }
    let errno = pending.split_errno.take().unwrap_or(0);
    if errno != 0 {
        shared
            .counters
            .request_errors
            .fetch_add(1, Ordering::Relaxed);
    }
    pending.charge = None;
    link.replier.reply(request.cookie, errno);
}

/// Checks a whole request, charges its buffers and serves or queues it;
/// errors are answered here. `false`: the client disconnected or the
/// connection is closing.
fn submit(
    shared: &Shared,
    link: &mut Link<'_>,
    pending: &mut PendingWrite,
    request: Request,
    payload: Vec<u8>,
) -> bool {
    let config = &shared.config;
    let counters = &shared.counters;
    let charge = if request.command == NBD_CMD_WRITE && request.length_bytes > 0 {
        // Charged at its header; its payload is complete.
        link.slot.account.received_all();
        pending.charge.take()
    } else {
        counters.requests.fetch_add(1, Ordering::Relaxed);
        None
    };
    let command = match protocol::check_request(
        &request,
        shared.export.size_bytes,
        config.read_only,
        u32::MAX, // longer requests are served by splitting
    ) {
        Ok(Command::Disconnect) => return false,
        Ok(c) => {
            counters.count(c);
            c
        }
        Err(errno) => {
            counters.request_errors.fetch_add(1, Ordering::Relaxed);
            link.replier.reply(request.cookie, errno);
            return true;
        }
    };
    if shared.stop.load(Ordering::Relaxed) {
        // Stopping: the soft disconnect (the client should finish and leave).
        counters.shutdown_replies.fetch_add(1, Ordering::Relaxed);
        link.replier.reply(request.cookie, NBD_ESHUTDOWN);
        return true;
    }
    let one_buffer_read =
        command == Command::Read && request.length_bytes <= read_piece_bytes(config);
    let charge = match charge {
        Some(c) => c,
        None => {
            let bytes = budget::request_charge_bytes(
                command,
                request.length_bytes,
                payload.len(),
                read_piece_bytes(config),
                split_piece_bytes(config),
            );
            let Some(c) = link.charge(bytes) else {
                return false;
            };
            c
        }
    };
    let job = Job {
        request,
        command,
        payload,
        _timer: super::type_index(command).map(|index| super::RequestTimer {
            latency: Arc::clone(&shared.latency),
            index,
            started: std::time::Instant::now(),
        }),
        _charge: charge,
    };
    if one_buffer_read {
        link.read(job)
    } else {
        link.pass_to_workers(job)
    }
}

/// Decides how a write's payload is taken, charging its memory first.
/// `None`: the connection is closing.
fn write_header(
    shared: &Shared,
    link: &mut Link<'_>,
    pending: &mut PendingWrite,
    request: &Request,
) -> Option<PayloadMode> {
    let config = &shared.config;
    let refuse = |pending: &mut PendingWrite, errno| {
        pending.discard_errno = Some(errno);
        Some(PayloadMode::Discard)
    };
    if let Err(errno) = protocol::check_request(
        request,
        shared.export.size_bytes,
        config.read_only,
        u32::MAX,
    ) {
        return refuse(pending, errno);
    }
    if shared.stop.load(Ordering::Relaxed) {
        shared
            .counters
            .shutdown_replies
            .fetch_add(1, Ordering::Relaxed);
        return refuse(pending, NBD_ESHUTDOWN);
    }
    let length_bytes = request.length_bytes;
    let plan = write_plan(
        length_bytes,
        config.max_payload_bytes,
        split_piece_bytes(config),
    );
    let (charge_bytes, mode) = match plan {
        WritePlan::Buffer { charge_bytes } => (charge_bytes, PayloadMode::Buffer),
        WritePlan::Split { piece_bytes } => {
            // Over the advertised maximum: served by splitting, one piece
            // held at a time, written by the reader before it reads on.
            shared
                .counters
                .requests_split
                .fetch_add(1, Ordering::Relaxed);
            shared.counters.count(Command::Write);
            let mode = PayloadMode::Chunks {
                chunk_bytes: piece_bytes,
            };
            (u64::from(piece_bytes), mode)
        }
    };
    pending.charge = Some(link.charge(charge_bytes)?);
    link.slot
        .account
        .receiving(&shared.pool, u64::from(length_bytes));
    if let WritePlan::Split { .. } = plan {
        pending.split_errno = None;
    }
    Some(mode)
}
