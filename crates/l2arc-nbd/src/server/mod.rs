//! The NBD server: listener, connection table, and the threads of each
//! connection.
//!
//! Threads. The engine is synchronous: a read that misses blocks its
//! thread on primary storage (milliseconds on a disk). A client such as
//! QEMU or fio keeps many requests in flight on one connection (queue depth
//! 32 is common) and expects them served in parallel, in any order. So each
//! connection has one reader thread (`connection.rs`), which decodes
//! requests, serves reads of cached data itself through its read queue
//! (`cached_reads.rs`: ARC hits at once, flash reads in flight together on
//! one io_uring that also watches the socket), and hands what may block to
//! a pool of workers (`workers.rs`). Replies go out whole under the
//! connection's writer mutex (`reply.rs`); the client matches them by
//! cookie. Every connection shares the one `Cache` and the one object
//! handle, so a record one client warmed is a hit for all (and
//! `NBD_FLAG_CAN_MULTI_CONN` is honest: a write, trim or flush on one
//! connection is visible to reads on every other, because all of them go
//! through the same write-through cache).
//!
//! What a connection costs. Asleep, nothing: its reader blocks on the
//! socket (or, with reads in flight, in its ring), its workers on their
//! queue. Busy, one wake-up per event. No thread polls on a timer: with
//! 128 connections a design that did spent 80% of the CPU in the kernel.
//!
//! Bounds. A hostile or broken client must not take the server down,
//! stall the other clients, or make the server allocate without limit:
//! - connections: at most `max_connections` at once; a newcomer who finds
//!   the table full takes the slot of a client that is not using its own
//!   (still negotiating, not reading its replies, or idle: `admission.rs`), and
//!   only when none is found is it turned away, with an NBD error that says
//!   why (`NBD_REP_ERR_POLICY`) and a line in the log. A client quiet for
//!   `idle_timeout` with nothing in flight is disconnected, and one that
//!   does not read its replies for that long loses its connection (the
//!   reply write times out);
//! - the handshake has a deadline (`handshake_timeout`) and the protocol
//!   module bounds option sizes and counts;
//! - every write payload and read reply buffer is charged, before it is
//!   allocated, to one pool of `buffer_max_bytes` shared by all
//!   connections (`pool.rs`), and per connection to `max_in_flight_bytes`,
//!   with at most `max_in_flight_requests` queued requests for its workers
//!   and `read_queue_depth` in its read queue; past that the reader stops
//!   reading the socket (TCP flow control pushes back on that client). A
//!   connection whose client keeps its pool memory from coming back (a
//!   reply unread or a payload not sent for `stall_timeout`) is
//!   disconnected when another waits for memory;
//! - requests longer than `max_payload_bytes` (the advertised maximum) are
//!   served by splitting, as the reference nbd-server serves them: a read
//!   streams its reply in pieces of `SPLIT_CHUNK_BYTES` (at most the
//!   maximum payload; an error after the reply header went out ends the
//!   connection, as the protocol requires), a write is taken and written
//!   in pieces; either holds one piece of the pool at a time;
//! - ranges are checked against the export size before the cache sees
//!   them (EINVAL for reads, ENOSPC for writes): nothing outside the image
//!   is ever read or written.
//!
//! A framing error (bad request magic) disconnects that client only. A
//! stop (SIGTERM in the CLI) drains: the listener closes, every request
//! in flight is answered, a request that arrives after the stop began is
//! answered `NBD_ESHUTDOWN` (the protocol's soft disconnect: the client
//! should finish and disconnect), and the server waits for the clients to
//! leave, at most `stop_timeout`; then it shuts the remaining sockets
//! down and joins every thread (`DrainReport` says how it went). A client
//! whose sockets were shut under it mid-request, as before, saw its
//! requests lost (fio: `err=-1 ... func=get_events`).
//!
//! Modules. Policy is pure code, decided on plain data and unit-tested:
//! `admission.rs` (who gets a slot, whom a newcomer bumps, when a quiet
//! client is let go) and `budget.rs` (what each request is charged, whom
//! to reclaim memory from; the pool's own grant order is in `pool.rs`).
//! Mechanism carries it out: `listener.rs` (sockets, accepting),
//! `table.rs` (the slots), `connection.rs` (handshake and reader),
//! `cached_reads.rs` (the reader's read queue), `workers.rs` (requests
//! that block) and `reply.rs` (replies written whole).

mod admission;
mod budget;
mod cached_reads;
mod connection;
mod listener;
mod reply;
mod table;
mod workers;

use crate::watch;

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use l2arc::latency::{HistogramSnapshot, LatencyHistogram};
use l2arc::{Cache, ObjectHandle};

use crate::pool::{BufferPool, Charge};
use crate::protocol::{
    self, Command, ExportInfo, Handshake, HandshakeStatus, PAYLOAD_MAX_BYTES_DEFAULT, Request,
    SIMPLE_REPLY_BYTES,
};
use admission::{Admission, Unused};
pub use connection::WORKERS_INITIAL;
use listener::{Conn, accept_within_poll};
pub use listener::{ListenAddr, Listener};
use table::{Slot, Table};

/// Deepest read queue of one connection.
pub const READ_QUEUE_DEPTH_MAX: usize = 1024;
/// Bytes read from a socket at a time.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// Piece size of a request over `max_payload_bytes`, served by splitting.
pub const SPLIT_CHUNK_BYTES: u32 = 4 << 20;
/// Default of `ServerConfig::buffer_max_bytes`.
pub const BUFFER_MAX_BYTES_DEFAULT: u64 = 256 << 20;
/// Memory a connection's read queue holds: the freed record buffers a
/// thread keeps for reuse (the engine's 512 KiB at most), its ring and
/// tables.
const READ_QUEUE_BYTES: u64 = (512 + 128) << 10;
/// Default of `ServerConfig::workers_per_connection`: enough primary reads
/// in flight from one connection at queue depth 32 that a disk array is
/// kept busy (with 8, the seed workload's 4 emulated spindles ran at 84%
/// of their rate; with 32, at 97%).
pub const WORKERS_DEFAULT: usize = 32;
/// Workers whose touched stacks the fixed 1 MiB of a connection covers
/// (with its reader); each one more is budgeted `WORKER_GROWN_BYTES`.
const WORKERS_IN_BASE: usize = 8;
/// Touched stack of a worker past `WORKERS_IN_BASE` (measured: 8–12 KiB
/// each from smaps with 32 busy workers; budgeted at 16).
const WORKER_GROWN_BYTES: u64 = 16 << 10;
/// Memory a connection holds outside the buffer pool, for the RSS budget
/// (docs/nbd.md), with up to `workers_max` workers: its socket read
/// buffer, the handshake buffer, the touched stack pages of its reader and
/// first workers (measured: 64 connections idle after the handshake add
/// under 1.3 MiB each) and of the workers it grows, and its read queue.
pub const fn connection_fixed_bytes(workers_max: usize) -> u64 {
    let grown = workers_max.saturating_sub(WORKERS_IN_BASE) as u64;
    (READ_CHUNK_BYTES + connection::HANDSHAKE_BUF_BYTES) as u64
        + (1 << 20)
        + grown * WORKER_GROWN_BYTES
        + READ_QUEUE_BYTES
}
/// [`connection_fixed_bytes`] at the default number of workers.
pub const CONNECTION_FIXED_BYTES: u64 = connection_fixed_bytes(WORKERS_DEFAULT);
/// Most clients being turned away at once (each gets a short handshake
/// that says why); past that, a refused client is closed without a word.
const REFUSALS_MAX: usize = 8;
/// How long a refused client's handshake may take.
const REFUSAL_DEADLINE: Duration = Duration::from_secs(1);

/// Server settings; every bound has a default.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The one export's name ("" is the default export).
    pub export_name: String,
    /// Refuse writes, trims and zeroing (EPERM); advertise NBD_FLAG_READ_ONLY.
    pub read_only: bool,
    /// Most connections at once (`--max-connections`).
    pub max_connections: usize,
    /// Most threads serving one connection's requests: it starts with
    /// [`WORKERS_INITIAL`] and starts another whenever all are busy.
    pub workers_per_connection: usize,
    /// Reads of one connection kept in flight by its read-queue thread
    /// (0: every request goes to the workers). Used only where the cache
    /// reads flash through io_uring.
    pub read_queue_depth: usize,
    /// Most requests of one connection in flight.
    pub max_in_flight_requests: usize,
    /// Most bytes of one connection's requests in flight.
    pub max_in_flight_bytes: u64,
    /// Longest read or write request.
    pub max_payload_bytes: u32,
    /// The whole handshake must finish within this.
    pub handshake_timeout: Duration,
    /// After the handshake: a client with nothing in flight that sends
    /// nothing for this long is disconnected, and a reply the client does
    /// not read for this long ends the connection.
    pub idle_timeout: Duration,
    /// One pool for the write payloads and read replies of every
    /// connection: at most this many bytes at once.
    pub buffer_max_bytes: u64,
    /// The image's path: watched with inotify for writes behind the export
    /// (`watch.rs`); `None` for an object with no file (an object store's).
    pub image_path: Option<PathBuf>,
    /// How often the image's generation is checked for changes that
    /// inotify cannot see (and it is at every flush); `None`: only on
    /// events and flushes.
    pub revalidate_interval: Option<Duration>,
    /// A connection holding pool memory whose client leaves a reply unread
    /// or sends no payload byte for this long (or a payload slower than
    /// `pool::PAYLOAD_RATE_MIN_BYTES_PER_SEC`) is disconnected when
    /// another connection waits for pool memory.
    pub stall_timeout: Duration,
    /// At a stop, how long the clients are given to take their last
    /// replies and disconnect before their sockets are shut down.
    pub stop_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            export_name: String::new(),
            read_only: false,
            max_connections: 64,
            workers_per_connection: WORKERS_DEFAULT,
            read_queue_depth: 64,
            max_in_flight_requests: 64,
            max_in_flight_bytes: 64 << 20,
            max_payload_bytes: PAYLOAD_MAX_BYTES_DEFAULT,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(600),
            buffer_max_bytes: BUFFER_MAX_BYTES_DEFAULT,
            stall_timeout: Duration::from_secs(5),
            image_path: None,
            revalidate_interval: Some(Duration::from_secs(1)),
            stop_timeout: Duration::from_secs(10),
        }
    }
}

impl ServerConfig {
    fn validate(&self) -> io::Result<()> {
        let bad = |what: &str| {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                what.to_string(),
            ))
        };
        if self.export_name.len() > protocol::NAME_MAX_BYTES {
            return bad("export name is longer than 4096 bytes");
        }
        if self.max_connections == 0 || self.workers_per_connection == 0 {
            return bad("max_connections and workers_per_connection must be at least 1");
        }
        if self.max_in_flight_requests == 0 {
            return bad("max_in_flight_requests must be at least 1");
        }
        if self.read_queue_depth > READ_QUEUE_DEPTH_MAX {
            return bad(&format!(
                "read_queue_depth must be at most {READ_QUEUE_DEPTH_MAX}"
            ));
        }
        if self.max_payload_bytes < 4096
            || self.max_in_flight_bytes < u64::from(self.max_payload_bytes)
        {
            return bad("max_payload_bytes must be 4096 to max_in_flight_bytes");
        }
        let largest_charge_bytes = u64::from(self.max_payload_bytes) + SIMPLE_REPLY_BYTES as u64;
        let pool_bytes = BufferPool::new(self.buffer_max_bytes).largest_charge_bytes();
        if pool_bytes < largest_charge_bytes {
            return bad(&format!(
                "the buffer pool ({} bytes) must hold one largest request ({largest_charge_bytes} bytes) in seven eighths of it",
                self.buffer_max_bytes
            ));
        }
        Ok(())
    }
}

/// Counters of what the server did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections that finished the handshake.
    pub connections_accepted: u64,
    /// Connections turned away (table full).
    pub connections_refused: u64,
    /// Idle connections closed to make room for a new client.
    pub connections_evicted: u64,
    /// Connections still negotiating closed to make room for a new client.
    pub connections_bumped_negotiating: u64,
    /// Connections whose client left a reply unread, closed to make room
    /// for a new client.
    pub connections_bumped_reply_unread: u64,
    /// Connections closed after `idle_timeout` of silence.
    pub connections_idle_closed: u64,
    /// Connections closed because they held buffer memory without progress
    /// while another connection waited for it.
    pub connections_reclaimed: u64,
    /// Bytes of the buffer pool in use now.
    pub buffer_used_bytes: u64,
    /// Most bytes of the buffer pool in use at once.
    pub buffer_high_water_bytes: u64,
    /// Requests over the advertised maximum payload, served by splitting.
    pub requests_split: u64,
    /// Times the image was found changed behind the export (every record
    /// cached of it dropped).
    pub image_changes: u64,
    /// Sessions ended by broken framing.
    pub protocol_errors: u64,
    /// Requests served.
    pub requests: u64,
    /// Requests answered with an error.
    pub request_errors: u64,
    /// Reads served by a connection's read-queue thread (data in the ARC
    /// or on flash).
    pub reads_queued: u64,
    /// Reads the read-queue thread handed to the workers (they needed
    /// primary storage).
    pub reads_passed_on: u64,
    /// Worker threads started, over all connections: 8 per connection at
    /// first, and one more whenever all of a connection's are busy.
    pub workers_started: u64,
    /// Connections open now.
    pub connections_current: u64,
    /// Valid requests by type, in the order of [`REQUEST_TYPES`].
    pub requests_by_type: [u64; REQUEST_TYPES.len()],
}

/// The request types counted and timed, by their NBD names in lower case.
pub const REQUEST_TYPES: [&str; 6] = ["read", "write", "flush", "trim", "cache", "write_zeroes"];

/// Where a command is counted in [`REQUEST_TYPES`] (`None`: disconnect).
fn type_index(command: Command) -> Option<usize> {
    Some(match command {
        Command::Read => 0,
        Command::Write => 1,
        Command::Flush => 2,
        Command::Trim => 3,
        Command::Cache => 4,
        Command::WriteZeroes => 5,
        Command::Disconnect => return None,
    })
}

/// Request latency by type: from the whole request's arrival to its reply
/// (the job's drop). Writes over the payload limit, taken in pieces, are
/// counted but not timed.
type Latency = [LatencyHistogram; REQUEST_TYPES.len()];

/// Times one request; records into its type's histogram when dropped
/// with the job (the reply sent, or the connection gone).
struct RequestTimer {
    latency: Arc<Latency>,
    index: usize,
    started: std::time::Instant,
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        self.latency[self.index].record(self.started.elapsed().as_nanos() as u64);
    }
}

/// A handle on a server's counters that outlives borrows of it (the HTTP
/// endpoint reads it while `serve` runs).
#[derive(Clone)]
pub struct StatsReader(Arc<Shared>);

impl StatsReader {
    /// What the server did so far.
    pub fn stats(&self) -> ServerStats {
        self.0.stats()
    }

    /// Request latency by type, in the order of [`REQUEST_TYPES`].
    pub fn latency(&self) -> Vec<(&'static str, HistogramSnapshot)> {
        REQUEST_TYPES
            .iter()
            .zip(self.0.latency.iter())
            .map(|(name, h)| (*name, h.snapshot()))
            .collect()
    }
}

/// How a stop went: what was drained, and what the timeout cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Requests in flight when the stop began (all answered unless a
    /// connection was closed at the timeout).
    pub requests_in_flight: u64,
    /// Requests that arrived after the stop began, answered `NBD_ESHUTDOWN`.
    pub requests_refused: u64,
    /// Connections open when the stop began.
    pub connections: u64,
    /// Connections still open at `stop_timeout`, shut down then.
    pub connections_cut: u64,
    /// From the stop to the last connection gone, ms.
    pub elapsed_ms: u64,
    /// The timeout in force, ms.
    pub timeout_ms: u64,
}

#[derive(Default)]
struct Counters {
    /// Requests answered `NBD_ESHUTDOWN` because the server was stopping.
    shutdown_replies: AtomicU64,
    connections_accepted: AtomicU64,
    connections_refused: AtomicU64,
    connections_evicted: AtomicU64,
    connections_bumped_negotiating: AtomicU64,
    connections_bumped_reply_unread: AtomicU64,
    connections_idle_closed: AtomicU64,
    connections_reclaimed: AtomicU64,
    requests_split: AtomicU64,
    image_changes: AtomicU64,
    protocol_errors: AtomicU64,
    requests: AtomicU64,
    request_errors: AtomicU64,
    reads_queued: AtomicU64,
    reads_passed_on: AtomicU64,
    workers_started: AtomicU64,
    by_type: [AtomicU64; REQUEST_TYPES.len()],
}

impl Counters {
    /// Counts a valid request of `command`.
    fn count(&self, command: Command) {
        if let Some(i) = type_index(command) {
            self.by_type[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Shared {
    cache: Arc<Cache>,
    handle: ObjectHandle,
    config: ServerConfig,
    export: ExportInfo,
    stop: Arc<AtomicBool>,
    /// Every open client: its socket (to shut it down on stop or to bump
    /// it) and how busy it is.
    table: Table,
    /// The clock `Slot::last_active_ms` counts from.
    started: std::time::Instant,
    /// Clients being turned away now (at most `REFUSALS_MAX`).
    refusing: AtomicUsize,
    /// Refused clients not yet logged, and when the last line went out
    /// (ms since `started`).
    refusals_unlogged: Mutex<(u64, u64)>,
    counters: Counters,
    latency: Arc<Latency>,
    /// Every connection's request and reply buffers.
    pool: Arc<BufferPool>,
    /// When the serving loop last went round (ms since `started`).
    heartbeat_ms: AtomicU64,
    /// How the last stop went.
    drain: Mutex<Option<DrainReport>>,
}

/// An NBD server exporting one object of the cache (a clone is another
/// handle on the same server: its stats, its heartbeat).
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    /// A server for `handle` (opened writable unless `config.read_only`).
    /// The export's size is the object's size now.
    pub fn new(cache: Arc<Cache>, handle: ObjectHandle, config: ServerConfig) -> io::Result<Self> {
        config.validate()?;
        let size_bytes = handle.size_bytes();
        let export = ExportInfo {
            name: config.export_name.clone(),
            description: "l2arc".to_string(),
            size_bytes,
            transmission_flags: ExportInfo::flags_for(config.read_only),
            block_size_min_bytes: 1,
            block_size_preferred_bytes: 4096,
            block_size_max_bytes: config.max_payload_bytes,
        };
        Ok(Self {
            shared: Arc::new(Shared {
                cache,
                handle,
                export,
                stop: Arc::new(AtomicBool::new(false)),
                table: Table::default(),
                started: std::time::Instant::now(),
                refusing: AtomicUsize::new(0),
                refusals_unlogged: Mutex::new((0, 0)),
                counters: Counters::default(),
                latency: Arc::default(),
                pool: Arc::new(BufferPool::new(config.buffer_max_bytes)),
                heartbeat_ms: AtomicU64::new(0),
                drain: Mutex::new(None),
                config,
            }),
        })
    }

    /// Set to true to stop [`Self::serve`] (signal handlers may set it).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.shared.stop)
    }

    /// Size of the export.
    pub fn export_size_bytes(&self) -> u64 {
        self.shared.export.size_bytes
    }

    /// What the server did so far.
    pub fn stats(&self) -> ServerStats {
        self.shared.stats()
    }

    /// A handle that reads the counters while [`Self::serve`] runs.
    pub fn stats_reader(&self) -> StatsReader {
        StatsReader(Arc::clone(&self.shared))
    }

    /// Milliseconds since the serving loop last went round (it goes round
    /// at least every 100 ms while it serves or drains): a watchdog's
    /// sign of life.
    pub fn heartbeat_age_ms(&self) -> u64 {
        let shared = &self.shared;
        shared
            .now_ms()
            .saturating_sub(shared.heartbeat_ms.load(Ordering::Relaxed))
    }

    /// How the stop went, once [`Self::serve`] returned.
    pub fn drain_report(&self) -> Option<DrainReport> {
        *self.shared.drain.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After the stop flag: waits for every connection to end (their
    /// requests answered, later ones refused), at most `stop_timeout`, then
    /// shuts the rest down and joins every thread.
    fn drain(&self, threads: Vec<JoinHandle<()>>) {
        let shared = &self.shared;
        let began = std::time::Instant::now();
        let refused_before = shared.counters.shutdown_replies.load(Ordering::SeqCst);
        let (connections, in_flight) = shared.table.in_flight_now();
        let mut threads = threads;
        let timeout = shared.config.stop_timeout;
        loop {
            shared
                .heartbeat_ms
                .store(shared.now_ms(), Ordering::Relaxed);
            threads.retain(|t| !t.is_finished());
            if threads.is_empty() || began.elapsed() >= timeout {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let cut = threads.len() as u64;
        shared.table.shut_all_down();
        for t in threads {
            let _ = t.join();
        }
        let report = DrainReport {
            requests_in_flight: in_flight,
            requests_refused: shared.counters.shutdown_replies.load(Ordering::SeqCst)
                - refused_before,
            connections,
            connections_cut: cut,
            elapsed_ms: began.elapsed().as_millis() as u64,
            timeout_ms: timeout.as_millis() as u64,
        };
        assert!(report.connections_cut <= report.connections || report.connections == 0);
        *shared.drain.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
    }

    /// Accepts clients until the stop flag is set, then drains them (see
    /// [`ServerConfig::stop_timeout`]) and flushes the image.
    pub fn serve(&self, listener: Listener) -> io::Result<()> {
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let mut next_id = 0u64;
        let config = &self.shared.config;
        let mut watch =
            watch::ImageWatch::new(config.image_path.as_deref(), config.revalidate_interval);
        let result = loop {
            self.shared
                .heartbeat_ms
                .store(self.shared.now_ms(), Ordering::Relaxed);
            if self.shared.stop.load(Ordering::SeqCst) {
                break Ok(());
            }
            threads.retain(|t| !t.is_finished());
            self.shared.pool.trim_if_due();
            self.shared.report_refusals();
            let (accepted, events_ready) = accept_within_poll(&listener, watch.fd());
            if watch.due(events_ready) {
                self.shared.check_image();
            }
            let conn = match accepted {
                Ok(Some(conn)) => conn,
                Ok(None) => continue,
                Err(e) => break Err(e),
            };
            if let Some(thread) = self.admit(conn, next_id) {
                threads.push(thread);
            }
            next_id += 1;
        };
        drop(listener);
        self.drain(threads);
        if !self.shared.config.read_only {
            self.shared.cache.sync(&self.shared.handle)?;
        }
        result
    }

    /// Gives a new client a slot (bumping an unused one if the table is
    /// full) and a thread; `None` if it was turned away.
    fn admit(&self, conn: Conn, id: u64) -> Option<JoinHandle<()>> {
        let shared = &self.shared;
        let now_ms = shared.now_ms();
        let admission = shared
            .table
            .admit(shared.config.max_connections, now_ms, &shared.pool);
        let bumped = match admission {
            Admission::Admit => None,
            Admission::Bump { unused, .. } => Some(unused),
            Admission::Refuse => {
                shared.turn_away(conn);
                return None;
            }
        };
        if let Some(unused) = bumped {
            let counter = match unused {
                Unused::Negotiating => &shared.counters.connections_bumped_negotiating,
                Unused::ReplyUnread => &shared.counters.connections_bumped_reply_unread,
                Unused::Idle => &shared.counters.connections_evicted,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let clone = conn.try_clone().ok()?;
        let slot = Arc::new(Slot::new(clone, now_ms));
        shared.table.insert(id, Arc::clone(&slot));
        shared
            .counters
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        let for_thread = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                connection::connection(&for_thread, conn, &slot);
                for_thread.table.remove(id);
            });
        match spawned {
            Ok(t) => Some(t),
            Err(_) => {
                shared.table.shut_down(id);
                shared.table.remove(id);
                None
            }
        }
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Re-reads the image's generation; if it changed behind the export,
    /// every record cached of it is a miss from now on (`watch.rs`).
    pub(super) fn check_image(&self) {
        let before = self.handle.generation_token();
        match self.cache.revalidate(&self.handle) {
            Ok(_) if self.handle.generation_token() != before => {
                self.counters.image_changes.fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "the image changed behind the export (another process wrote it): \
                     every record cached of it was dropped"
                );
            }
            Ok(_) => {}
            Err(e) => log::warn!("cannot check the image for changes: {e}"),
        }
    }

    /// Turns a client away because every slot is used: it gets a short
    /// handshake whose every option is answered `NBD_REP_ERR_POLICY` with
    /// the reason (nbdinfo and qemu print it), in a thread of its own, at
    /// most `REFUSALS_MAX` at once (past that it is closed without a
    /// word), and the refusal is logged (at most a line a second).
    fn turn_away(self: &Arc<Self>, conn: Conn) {
        self.counters
            .connections_refused
            .fetch_add(1, Ordering::Relaxed);
        let reason = format!(
            "l2arc: server busy: all {} connections are in use (none idle, negotiating or \
             leaving replies unread); try again later, or raise --max-connections",
            self.config.max_connections
        );
        self.refusals_unlogged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0 += 1;
        self.report_refusals();
        if self.refusing.fetch_add(1, Ordering::SeqCst) >= REFUSALS_MAX {
            self.refusing.fetch_sub(1, Ordering::SeqCst);
            conn.shutdown();
            return;
        }
        let shared = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("nbd-refuse".to_string())
            .spawn(move || {
                let mut conn = conn;
                let _ = refuse(&mut conn, shared.export.clone(), &reason);
                conn.shutdown();
                shared.refusing.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            self.refusing.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Logs the clients turned away since the last report, at most once
    /// per `REFUSAL_LOG_INTERVAL_MS` (at each refusal, and from the accept
    /// loop so that the last ones of a burst are reported too).
    fn report_refusals(&self) {
        let now_ms = self.now_ms();
        let mut unlogged = self
            .refusals_unlogged
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (count, last_ms) = &mut *unlogged;
        if !admission::refusal_log_due(*count, *last_ms, now_ms) {
            return;
        }
        log::warn!(
            "turned {count} client(s) away: all {} connections were in use (none idle, \
             negotiating or leaving replies unread); raise --max-connections if they are real clients",
            self.config.max_connections
        );
        *count = 0;
        *last_ms = now_ms.max(1);
    }
}

/// The handshake of a client turned away (see `Shared::turn_away`).
fn refuse(conn: &mut Conn, export: ExportInfo, reason: &str) -> io::Result<()> {
    let deadline = std::time::Instant::now() + REFUSAL_DEADLINE;
    conn.set_timeouts(Some(REFUSAL_DEADLINE))?;
    let mut hs = Handshake::refusing(export, reason);
    io::Write::write_all(conn, &hs.greeting())?;
    let mut buf = [0u8; 4096];
    let mut out = Vec::new();
    while std::time::Instant::now() < deadline {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        let (_, status) = connection::negotiate(conn, &mut hs, &buf[..n], &mut out)?;
        if status != HandshakeStatus::Negotiating {
            return Ok(());
        }
    }
    Ok(())
}

impl Shared {
    fn stats(&self) -> ServerStats {
        let c = &self.counters;
        ServerStats {
            connections_accepted: c.connections_accepted.load(Ordering::Relaxed),
            connections_refused: c.connections_refused.load(Ordering::Relaxed),
            connections_evicted: c.connections_evicted.load(Ordering::Relaxed),
            connections_bumped_negotiating: c
                .connections_bumped_negotiating
                .load(Ordering::Relaxed),
            connections_bumped_reply_unread: c
                .connections_bumped_reply_unread
                .load(Ordering::Relaxed),
            connections_idle_closed: c.connections_idle_closed.load(Ordering::Relaxed),
            connections_reclaimed: c.connections_reclaimed.load(Ordering::Relaxed),
            buffer_used_bytes: self.pool.used_bytes(),
            buffer_high_water_bytes: self.pool.high_water_bytes(),
            requests_split: c.requests_split.load(Ordering::Relaxed),
            image_changes: c.image_changes.load(Ordering::Relaxed),
            protocol_errors: c.protocol_errors.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            request_errors: c.request_errors.load(Ordering::Relaxed),
            reads_queued: c.reads_queued.load(Ordering::Relaxed),
            reads_passed_on: c.reads_passed_on.load(Ordering::Relaxed),
            workers_started: c.workers_started.load(Ordering::Relaxed),
            connections_current: self.table.active() as u64,
            requests_by_type: std::array::from_fn(|i| c.by_type[i].load(Ordering::Relaxed)),
        }
    }
}

struct Job {
    request: Request,
    command: Command,
    payload: Vec<u8>,
    /// Records the request's latency when the job is dropped.
    _timer: Option<RequestTimer>,
    /// The buffer memory this request holds; given back when the job is
    /// dropped (its reply sent, or the connection gone).
    _charge: Charge,
}
