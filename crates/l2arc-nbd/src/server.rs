//! The NBD server: listener, connections, request dispatch onto the cache.
//!
//! Why threads. The engine is synchronous: a read that misses blocks its
//! thread on primary storage (milliseconds on a disk). An NBD client such
//! as QEMU or fio keeps many requests in flight on one connection (queue
//! depth 32 is common) and expects them served in parallel, in any order.
//! So each connection gets one reader thread, which only decodes requests
//! (`protocol.rs`) and queues them, and a pool of worker threads (8 at
//! first, growing while all are busy: a read that misses holds its worker
//! while primary storage answers, so the pool is how many such reads a
//! client keeps on the disks at once), which call the cache and write each
//! reply whole under the connection's
//! writer mutex (replies of different requests never interleave on the
//! wire, and the client matches them by cookie). Every connection shares
//! the one `Cache` and the one object handle, so a record one client warmed
//! is a hit for all (and `NBD_FLAG_CAN_MULTI_CONN` is honest: a write,
//! trim or flush on one connection is visible to reads on every other,
//! because all of them go through the same write-through cache).
//!
//! Bounds. A hostile or broken client must not take the server down,
//! stall the other clients, or make the server allocate without limit:
//! - connections: at most `max_connections` at once. When the table is
//!   full, a new client takes the slot of the longest-idle one (no request
//!   in flight, quiet for at least `IDLE_EVICT_MIN`), so idle holders cannot
//!   lock everybody else out; if none is idle the new client is closed at
//!   accept. A client quiet for `idle_timeout` with nothing in flight is
//!   disconnected, and one that does not read its replies for that long
//!   loses its connection (the reply write times out);
//! - the handshake has a deadline (`handshake_timeout`) and the protocol
//!   module bounds option sizes and counts;
//! - every write payload and read reply buffer is charged, before it is
//!   allocated, to one pool of `buffer_max_bytes` shared by all connections
//!   (`pool.rs`), and per connection to `max_in_flight_bytes`, with at most
//!   `max_in_flight_requests` queued requests in each of its queues (the
//!   workers' and the read-queue thread's); past that the reader stops
//!   reading the socket (TCP flow control pushes back on that client). A
//!   connection whose client keeps its pool memory from coming back (a
//!   reply unread or a payload not sent for `stall_timeout`) is
//!   disconnected when another waits for memory;
//! - requests longer than `max_payload_bytes` (the advertised maximum) are
//!   served by splitting, as the reference nbd-server serves them: a read
//!   streams its reply in pieces of `SPLIT_CHUNK_BYTES` (at most the
//!   maximum payload; an error after the
//!   reply header went out ends the connection, as the protocol requires),
//!   a write is taken and written in pieces; either holds one piece of
//!   the pool at a time;
//! - ranges are checked against the export size before the cache sees
//!   them (EINVAL for reads, ENOSPC for writes): nothing outside the image
//!   is ever read or written.
//!
//! Reads of cached data. Where the cache reads flash through io_uring,
//! each connection also gets a read-queue thread (`read_queue_thread`):
//! reads whose records are all in the ARC or on flash go there and are
//! kept in flight together on the device through one `ReadQueue`, without
//! a worker thread blocked on each (the reads a client pipelines overlap
//! on flash at the cost of one thread, and no hand-off per request). A
//! read that needs primary storage goes on to the workers, so a slow disk
//! never holds up reads of cached data behind it. The thread never blocks
//! on the workers' queue: a worker may be waiting for a record the read
//! queue is reading, which completes only when this thread reaps it, so a
//! read the full queue refuses waits in the thread's own bounded list
//! (and the thread takes no new reads meanwhile).
//!
//! A framing error (bad request magic) disconnects that client only; a
//! stop (SIGTERM in the CLI) shuts every socket down, lets the workers
//! finish the requests they hold, and joins every thread.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use l2arc::{Cache, ObjectHandle};

use crate::pool::{Account, BufferPool, Charge};
use crate::protocol::{
    self, Command, Decoded, ExportInfo, Handshake, HandshakeStatus, NBD_CMD_FLAG_FUA,
    NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE, NBD_EINVAL, NBD_ESHUTDOWN, PAYLOAD_MAX_BYTES_DEFAULT,
    PayloadMode, Request, RequestDecoder, SIMPLE_REPLY_BYTES,
};

/// Deepest read queue of one connection.
pub const READ_QUEUE_DEPTH_MAX: usize = 1024;
/// How long the read-queue thread waits on flash before it looks for new
/// requests again: a request arriving behind reads in flight waits at most
/// this long to be started.
const READ_QUEUE_POLL: Duration = Duration::from_micros(50);
/// Bytes read from a socket at a time.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// Piece size of a request over `max_payload_bytes`, served by splitting.
pub const SPLIT_CHUNK_BYTES: u32 = 4 << 20;
/// Largest piece of a reply written to the socket at once (progress is
/// noted after each).
const REPLY_PIECE_BYTES: usize = 1 << 20;
/// Default of `ServerConfig::buffer_max_bytes`.
pub const BUFFER_MAX_BYTES_DEFAULT: u64 = 256 << 20;
/// Bytes of the handshake's read buffer.
const HANDSHAKE_BUF_BYTES: usize = 64 * 1024;
/// Memory a connection's read-queue thread holds: the freed record buffers
/// a thread keeps for reuse (the engine's 512 KiB at most), its stack, ring
/// and tables.
const READ_QUEUE_THREAD_BYTES: u64 = (512 + 128) << 10;
/// Workers a connection starts with; more are started, up to
/// `ServerConfig::workers_per_connection`, while every one is busy.
pub const WORKERS_INITIAL: usize = 8;
/// Default of `ServerConfig::workers_per_connection`: enough primary reads
/// in flight from one connection at queue depth 32 that a disk array is
/// kept busy (with 8, the seed workload's 4 emulated spindles ran at 84%
/// of their rate; with 32, at 97%).
pub const WORKERS_DEFAULT: usize = 32;
/// Touched stack of a worker started past the initial ones (measured:
/// 8–12 KiB each from smaps with 32 busy workers; budgeted at 16).
const WORKER_GROWN_BYTES: u64 = 16 << 10;
/// Memory a connection holds outside the buffer pool, for the RSS budget
/// (docs/nbd.md), with up to `workers_max` workers: its socket read
/// buffer, the handshake buffer, the touched stack pages of its reader and
/// its first 8 workers (measured: 64 connections idle after the handshake
/// add under 1.3 MiB each) and of the workers it grows, and its
/// read-queue thread.
pub const fn connection_fixed_bytes(workers_max: usize) -> u64 {
    let grown = workers_max.saturating_sub(WORKERS_INITIAL) as u64;
    (READ_CHUNK_BYTES + HANDSHAKE_BUF_BYTES) as u64
        + (1 << 20)
        + grown * WORKER_GROWN_BYTES
        + READ_QUEUE_THREAD_BYTES
}
/// [`connection_fixed_bytes`] at the default number of workers.
pub const CONNECTION_FIXED_BYTES: u64 = connection_fixed_bytes(WORKERS_DEFAULT);
/// Largest write of zeros for `NBD_CMD_WRITE_ZEROES` when no hole is punched.
const ZERO_CHUNK_BYTES: usize = 1 << 20;
/// How often the accept loop looks at the stop flag.
const ACCEPT_POLL_MS: i32 = 100;
/// Shortest quiet time after which a connection may give its slot to a
/// new client when the table is full.
const IDLE_EVICT_MIN: Duration = Duration::from_secs(2);

/// Where to listen: `unix:PATH` or `HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// A unix socket path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path (unix:/run/l2arc.sock)".into());
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        use std::net::ToSocketAddrs;
        let addr = s
            .to_socket_addrs()
            .map_err(|e| format!("`{s}` is not unix:PATH or HOST:PORT: {e}"))?
            .next()
            .ok_or_else(|| format!("`{s}` resolves to no address"))?;
        Ok(ListenAddr::Tcp(addr))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// A bound listening socket.
pub enum Listener {
    /// A unix socket and the path it removes when dropped.
    Unix(UnixListener, PathBuf),
    /// A TCP socket.
    Tcp(TcpListener),
}

impl Listener {
    /// Binds `addr`. A Unix socket path that exists is replaced only if it
    /// is a socket nobody listens on (left behind by a crash).
    pub fn bind(addr: &ListenAddr) -> io::Result<Self> {
        match addr {
            ListenAddr::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path)
                    && meta.file_type().is_socket()
                    && UnixStream::connect(path).is_err()
                {
                    std::fs::remove_file(path)?;
                }
                Ok(Listener::Unix(UnixListener::bind(path)?, path.clone()))
            }
            ListenAddr::Tcp(a) => Ok(Listener::Tcp(TcpListener::bind(a)?)),
        }
    }

    /// The address actually bound (a TCP port 0 becomes the real port).
    pub fn local_addr(&self) -> io::Result<ListenAddr> {
        match self {
            Listener::Unix(_, p) => Ok(ListenAddr::Unix(p.clone())),
            Listener::Tcp(l) => Ok(ListenAddr::Tcp(l.local_addr()?)),
        }
    }

    fn raw_fd(&self) -> RawFd {
        match self {
            Listener::Unix(l, _) => l.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        }
    }

    fn accept(&self) -> io::Result<Conn> {
        match self {
            Listener::Unix(l, _) => Ok(Conn::Unix(l.accept()?.0)),
            Listener::Tcp(l) => {
                let s = l.accept()?.0;
                s.set_nodelay(true)?;
                Ok(Conn::Tcp(s))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// One client socket.
enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Conn::Unix(s) => s.shutdown(Shutdown::Both),
            Conn::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    fn set_timeouts(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Conn::Unix(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
            Conn::Tcp(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

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
    /// A connection holding pool memory whose client leaves a reply unread
    /// or sends no payload byte for this long (or a payload slower than
    /// `pool::PAYLOAD_RATE_MIN_BYTES_PER_SEC`) is disconnected when
    /// another connection waits for pool memory.
    pub stall_timeout: Duration,
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
}

#[derive(Default)]
struct Counters {
    connections_accepted: AtomicU64,
    connections_refused: AtomicU64,
    connections_evicted: AtomicU64,
    connections_idle_closed: AtomicU64,
    connections_reclaimed: AtomicU64,
    requests_split: AtomicU64,
    protocol_errors: AtomicU64,
    requests: AtomicU64,
    request_errors: AtomicU64,
    reads_queued: AtomicU64,
    reads_passed_on: AtomicU64,
    workers_started: AtomicU64,
}

struct Shared {
    cache: Arc<Cache>,
    handle: ObjectHandle,
    config: ServerConfig,
    export: ExportInfo,
    stop: Arc<AtomicBool>,
    /// Every open client: its socket (to shut it down on stop or to evict
    /// it) and how busy it is.
    open: Mutex<HashMap<u64, Arc<Slot>>>,
    /// The clock `Slot::last_active_ms` counts from.
    started: std::time::Instant,
    active: AtomicUsize,
    counters: Counters,
    /// Every connection's request and reply buffers.
    pool: Arc<BufferPool>,
}

/// An NBD server exporting one object of the cache.
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
                open: Mutex::new(HashMap::new()),
                started: std::time::Instant::now(),
                active: AtomicUsize::new(0),
                counters: Counters::default(),
                pool: Arc::new(BufferPool::new(config.buffer_max_bytes)),
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
        let c = &self.shared.counters;
        ServerStats {
            connections_accepted: c.connections_accepted.load(Ordering::Relaxed),
            connections_refused: c.connections_refused.load(Ordering::Relaxed),
            connections_evicted: c.connections_evicted.load(Ordering::Relaxed),
            connections_idle_closed: c.connections_idle_closed.load(Ordering::Relaxed),
            connections_reclaimed: c.connections_reclaimed.load(Ordering::Relaxed),
            buffer_used_bytes: self.shared.pool.used_bytes(),
            buffer_high_water_bytes: self.shared.pool.high_water_bytes(),
            requests_split: c.requests_split.load(Ordering::Relaxed),
            protocol_errors: c.protocol_errors.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            request_errors: c.request_errors.load(Ordering::Relaxed),
            reads_queued: c.reads_queued.load(Ordering::Relaxed),
            reads_passed_on: c.reads_passed_on.load(Ordering::Relaxed),
            workers_started: c.workers_started.load(Ordering::Relaxed),
        }
    }

    /// Accepts clients until the stop flag is set, then disconnects them
    /// all, waits for their threads, and flushes the image.
    pub fn serve(&self, listener: Listener) -> io::Result<()> {
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let mut next_id = 0u64;
        let result = loop {
            if self.shared.stop.load(Ordering::SeqCst) {
                break Ok(());
            }
            threads.retain(|t| !t.is_finished());
            self.shared.pool.trim_if_due();
            let conn = match accept_within_poll(&listener) {
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
        for slot in self
            .shared
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            slot.conn.shutdown();
        }
        for t in threads {
            let _ = t.join();
        }
        if !self.shared.config.read_only {
            self.shared.cache.sync(&self.shared.handle)?;
        }
        result
    }

    /// Gives a new client a slot (evicting the longest-idle client if the
    /// table is full) and a thread; `None` if it was turned away.
    fn admit(&self, conn: Conn, id: u64) -> Option<JoinHandle<()>> {
        let shared = &self.shared;
        if shared.active.load(Ordering::SeqCst) >= shared.config.max_connections
            && !shared.evict_longest_idle()
        {
            shared
                .counters
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            conn.shutdown();
            return None;
        }
        let clone = conn.try_clone().ok()?;
        let slot = Arc::new(Slot {
            conn: clone,
            last_active_ms: AtomicU64::new(shared.now_ms()),
            in_flight: AtomicUsize::new(0),
            transmitting: AtomicBool::new(false),
            account: Arc::new(Account::new()),
        });
        shared.active.fetch_add(1, Ordering::SeqCst);
        shared
            .counters
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        shared
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::clone(&slot));
        let for_thread = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                connection(&for_thread, conn, &slot);
                for_thread.close_slot(id);
            });
        match spawned {
            Ok(t) => Some(t),
            Err(_) => {
                if let Some(slot) = shared
                    .open
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&id)
                {
                    slot.conn.shutdown();
                }
                shared.close_slot(id);
                None
            }
        }
    }
}

/// Waits up to one poll interval for a client; `None` when none came or
/// the error is one to retry (an interrupted call, a client that left, or
/// no descriptor left: connections closing will free some).
fn accept_within_poll(listener: &Listener) -> io::Result<Option<Conn>> {
    let mut pfd = libc::pollfd {
        fd: listener.raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) };
    if ready < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(None)
        } else {
            Err(e)
        };
    }
    if ready == 0 {
        return Ok(None);
    }
    match listener.accept() {
        Ok(c) => Ok(Some(c)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted
                    | io::ErrorKind::WouldBlock
                    | io::ErrorKind::ConnectionAborted
            ) =>
        {
            Ok(None)
        }
        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
            std::thread::sleep(Duration::from_millis(ACCEPT_POLL_MS as u64));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// One client's place in the connection table.
struct Slot {
    /// A clone of the client's socket, to shut it down from outside.
    conn: Conn,
    /// When the client last sent anything, in ms since the server started.
    last_active_ms: AtomicU64,
    /// Requests queued or being served.
    in_flight: AtomicUsize,
    /// Past the handshake (which has its own deadline).
    transmitting: AtomicBool,
    /// Its share of the buffer pool.
    account: Arc<Account>,
}

impl Slot {
    /// Ends the connection from outside: the socket is shut down and
    /// charges waiting for it give up.
    fn close(&self, pool: &BufferPool) {
        self.account.close(pool);
        self.conn.shutdown();
    }
}

impl Shared {
    /// Frees a connection's slot in the table.
    fn close_slot(&self, id: u64) {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        self.active.fetch_sub(1, Ordering::SeqCst);
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Shuts down the connection that has been quiet the longest, if one is
    /// idle (nothing in flight, quiet for `IDLE_EVICT_MIN`). True if one was.
    /// Its thread then ends and frees the slot; the new client is let in
    /// at once, so the table may hold one more for that moment.
    fn evict_longest_idle(&self) -> bool {
        let now = self.now_ms();
        let quiet_min = IDLE_EVICT_MIN.as_millis() as u64;
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let victim = open
            .values()
            .filter(|s| {
                s.transmitting.load(Ordering::SeqCst)
                    && s.in_flight.load(Ordering::SeqCst) == 0
                    && now.saturating_sub(s.last_active_ms.load(Ordering::Relaxed)) >= quiet_min
            })
            .min_by_key(|s| s.last_active_ms.load(Ordering::Relaxed));
        let Some(victim) = victim else {
            return false;
        };
        victim.close(&self.pool);
        self.counters
            .connections_evicted
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Called by a charge that has waited on a full pool: disconnects the
    /// connection holding the most pool memory among those its client has
    /// stalled for `stall_timeout` (not `asking`, not one already closing). Its buffers
    /// come back as its threads see the closed socket.
    fn reclaim(&self, asking: &Account) {
        let stall_min_ms = self.config.stall_timeout.as_millis() as u64;
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let victim = open
            .values()
            .filter(|s| {
                !std::ptr::eq(Arc::as_ptr(&s.account), asking)
                    && !s.account.is_closed()
                    && s.account.is_stalled(&self.pool, stall_min_ms)
            })
            .max_by_key(|s| s.account.held_bytes());
        if let Some(victim) = victim {
            victim.close(&self.pool);
            self.counters
                .connections_reclaimed
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Charges `bytes` of buffer memory to `slot` (waiting as `pool.rs`
    /// says); `None` if the connection is closing.
    fn charge(&self, slot: &Slot, bytes: u64) -> Option<Charge> {
        self.pool.charge(
            &slot.account,
            bytes,
            self.config.max_in_flight_bytes,
            &|| self.reclaim(&slot.account),
        )
    }
}

/// One client, from greeting to close.
fn connection(shared: &Arc<Shared>, mut conn: Conn, slot: &Arc<Slot>) {
    match handshake(shared, &mut conn) {
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
fn handshake(shared: &Shared, conn: &mut Conn) -> io::Result<Option<Vec<u8>>> {
    let deadline = std::time::Instant::now() + shared.config.handshake_timeout;
    let mut hs = Handshake::new(shared.export.clone());
    conn.set_timeouts(Some(shared.config.handshake_timeout))?;
    conn.write_all(&hs.greeting())?;
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
        let mut at = 0;
        while at < n {
            let pushed = hs.push(&buf[at..n], &mut out);
            // The replies already due go out even when the next option
            // breaks a limit: the client gets every answer it earned.
            conn.write_all(&out)?;
            out.clear();
            let (used, status) =
                pushed.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            at += used;
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
}

struct Job {
    request: Request,
    command: Command,
    payload: Vec<u8>,
    /// The buffer memory this request holds; given back when the job is
    /// dropped (its reply sent, or the connection gone).
    _charge: Charge,
}

/// The connection's reply side: each reply written whole under the mutex.
struct Replier {
    conn: Mutex<Conn>,
    /// Set after a write fails: the connection is going away.
    broken: AtomicBool,
    /// Where the client's taking of reply bytes counts as progress.
    account: Arc<Account>,
    pool: Arc<BufferPool>,
}

impl Replier {
    /// Writes `parts` back to back, in pieces of at most
    /// `REPLY_PIECE_BYTES`, noting progress after each. False if the
    /// connection broke (it is then shut down).
    fn write_parts(&self, conn: &mut Conn, parts: &[&[u8]]) -> bool {
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        for part in parts {
            for piece in part.chunks(REPLY_PIECE_BYTES) {
                self.account.writing(&self.pool, true);
                let written = conn.write_all(piece);
                self.account.writing(&self.pool, false);
                if written.is_err() {
                    self.broken.store(true, Ordering::Relaxed);
                    conn.shutdown();
                    return false;
                }
            }
        }
        true
    }

    fn send(&self, bytes: &[u8]) {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        self.write_parts(&mut conn, &[bytes]);
    }

    fn reply(&self, cookie: u64, error: u32) {
        self.send(&protocol::simple_reply(cookie, error));
    }

    /// Ends the connection at once (a hard disconnect).
    fn hang_up(&self) {
        self.broken.store(true, Ordering::Relaxed);
        self.conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shutdown();
    }
}

fn transmission(shared: &Arc<Shared>, mut conn: Conn, leftover: Vec<u8>, slot: &Arc<Slot>) {
    let replier = match conn.try_clone() {
        Ok(c) => Arc::new(Replier {
            conn: Mutex::new(c),
            broken: AtomicBool::new(false),
            account: Arc::clone(&slot.account),
            pool: Arc::clone(&shared.pool),
        }),
        Err(_) => {
            conn.shutdown();
            return;
        }
    };
    let (tx, rx) = sync_channel::<Job>(shared.config.max_in_flight_requests);
    let workers = Arc::new(Workers {
        shared: Arc::clone(shared),
        rx: Mutex::new(rx),
        replier: Arc::clone(&replier),
        slot: Arc::clone(slot),
        workers_max: shared.config.workers_per_connection,
        started: AtomicUsize::new(0),
        idle: AtomicUsize::new(0),
        threads: Mutex::new(Vec::new()),
    });
    for _ in 0..WORKERS_INITIAL.min(workers.workers_max) {
        Workers::start_one(&workers);
    }
    if workers.started.load(Ordering::SeqCst) == 0 {
        conn.shutdown();
        return;
    }
    let (read_tx, read_thread) = spawn_read_queue_thread(shared, &tx, &replier, slot);
    let queue = Queue {
        tx: &tx,
        reads: read_tx.as_ref(),
        replier: &replier,
        slot,
    };
    let result = reader(shared, &mut conn, leftover, &queue);
    if result.is_err() {
        shared
            .counters
            .protocol_errors
            .fetch_add(1, Ordering::Relaxed);
        // Broken framing: the client is gone for us; do not finish its work.
        conn.shutdown();
    }
    // The read-queue thread first: it hands reads on to the workers.
    drop(read_tx);
    if let Some(t) = read_thread {
        let _ = t.join();
    }
    drop(tx);
    workers.join_all();
    slot.account.close(&shared.pool);
    conn.shutdown();
    shared.pool.want_trim();
}

/// Where the reader hands decoded requests: the workers' queue, the
/// replier for requests answered at once, and the connection's slot
/// (activity, requests in flight, its share of the buffer pool).
struct Queue<'a> {
    tx: &'a SyncSender<Job>,
    /// The read-queue thread, if the connection has one.
    reads: Option<&'a SyncSender<Job>>,
    replier: &'a Replier,
    slot: &'a Slot,
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

/// Decodes requests and queues them. `Err`: a protocol violation.
fn reader(
    shared: &Shared,
    conn: &mut Conn,
    leftover: Vec<u8>,
    queue: &Queue<'_>,
) -> Result<(), protocol::ProtocolError> {
    let mut decoder = RequestDecoder::gated(shared.config.max_payload_bytes);
    let mut pending = PendingWrite::default();
    // Bytes that arrived behind the handshake's last option come first.
    if !dispatch(shared, &mut decoder, &mut pending, &leftover, queue)? {
        return Ok(());
    }
    drop(leftover);
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                // Quiet for idle_timeout: idle if nothing is in flight
                // (a client waiting on slow replies is not idle).
                if queue.slot.in_flight.load(Ordering::SeqCst) == 0 {
                    shared
                        .counters
                        .connections_idle_closed
                        .fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                continue;
            }
            Err(_) => return Ok(()),
        };
        queue
            .slot
            .last_active_ms
            .store(shared.now_ms(), Ordering::Relaxed);
        queue.slot.account.received_some(&shared.pool);
        if !dispatch(shared, &mut decoder, &mut pending, &buf[..n], queue)? {
            return Ok(());
        }
    }
}

/// Decodes `bytes` into requests: errors are answered here, valid requests
/// go to the workers, writes over the payload limit are written here piece
/// by piece. `Ok(false)`: the client disconnected (NBD_CMD_DISC) or the
/// connection is closing.
fn dispatch(
    shared: &Shared,
    decoder: &mut RequestDecoder,
    pending: &mut PendingWrite,
    bytes: &[u8],
    queue: &Queue<'_>,
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
                match write_header(shared, queue.slot, pending, &request) {
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
                write_chunk(shared, queue, pending, &request, at_bytes, data, last);
                true
            }
            Decoded::Oversized(request) => {
                // A write whose payload was thrown away (refused at its header).
                counters.request_errors.fetch_add(1, Ordering::Relaxed);
                queue.replier.reply(
                    request.cookie,
                    pending.discard_errno.take().unwrap_or(NBD_EINVAL),
                );
                true
            }
            Decoded::Request { request, payload } => {
                submit(shared, queue, pending, request, payload)
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
    queue: &Queue<'_>,
    pending: &mut PendingWrite,
    request: &Request,
    at_bytes: u32,
    data: Vec<u8>,
    last: bool,
) {
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
    queue.slot.account.received_some(&shared.pool);
    if !last {
        return;
    }
    queue.slot.account.received_all();
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
    queue.replier.reply(request.cookie, errno);
}

/// Checks a whole request, charges its buffers and hands it to the
/// workers; errors are answered here. `false`: the client disconnected or
/// the connection is closing.
fn submit(
    shared: &Shared,
    queue: &Queue<'_>,
    pending: &mut PendingWrite,
    request: Request,
    payload: Vec<u8>,
) -> bool {
    let Queue {
        tx,
        reads,
        replier,
        slot,
    } = *queue;
    let config = &shared.config;
    let counters = &shared.counters;
    let charge = if request.command == NBD_CMD_WRITE && request.length_bytes > 0 {
        // Charged at its header; its payload is complete.
        slot.account.received_all();
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
        Ok(c) => c,
        Err(errno) => {
            counters.request_errors.fetch_add(1, Ordering::Relaxed);
            replier.reply(request.cookie, errno);
            return true;
        }
    };
    if shared.stop.load(Ordering::Relaxed) {
        replier.reply(request.cookie, NBD_ESHUTDOWN);
        return true;
    }
    let charge = match charge {
        Some(c) => c,
        None => {
            let bytes = match command {
                Command::Read if request.length_bytes > read_piece_bytes(config) => {
                    u64::from(split_piece_bytes(config))
                }
                Command::Read => u64::from(request.length_bytes) + SIMPLE_REPLY_BYTES as u64,
                _ => payload.len() as u64,
            };
            let Some(c) = shared.charge(slot, bytes) else {
                return false;
            };
            c
        }
    };
    let job = Job {
        request,
        command,
        payload,
        _charge: charge,
    };
    let to = match reads {
        Some(reads)
            if command == Command::Read && request.length_bytes <= read_piece_bytes(config) =>
        {
            reads
        }
        _ => tx,
    };
    slot.in_flight.fetch_add(1, Ordering::SeqCst);
    if to.send(job).is_err() {
        slot.in_flight.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    true
}

/// The largest read served from one buffer: the advertised maximum
/// payload; longer reads go out in pieces of [`split_piece_bytes`].
fn read_piece_bytes(config: &ServerConfig) -> u32 {
    config.max_payload_bytes
}

/// The piece size of a request served by splitting: `SPLIT_CHUNK_BYTES`,
/// never more than the advertised maximum payload.
fn split_piece_bytes(config: &ServerConfig) -> u32 {
    SPLIT_CHUNK_BYTES.min(config.max_payload_bytes)
}

/// Decides how a write's payload is taken, charging its memory first.
/// `None`: the connection is closing.
fn write_header(
    shared: &Shared,
    slot: &Slot,
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
        return refuse(pending, NBD_ESHUTDOWN);
    }
    let length_bytes = request.length_bytes;
    if length_bytes <= config.max_payload_bytes {
        pending.charge = Some(shared.charge(slot, u64::from(length_bytes))?);
        slot.account
            .receiving(&shared.pool, u64::from(length_bytes));
        return Some(PayloadMode::Buffer);
    }
    // Over the advertised maximum: served by splitting, one piece held at
    // a time, written by the reader before it reads on.
    shared
        .counters
        .requests_split
        .fetch_add(1, Ordering::Relaxed);
    let piece_bytes = split_piece_bytes(config);
    pending.charge = Some(shared.charge(slot, u64::from(piece_bytes))?);
    slot.account
        .receiving(&shared.pool, u64::from(length_bytes));
    pending.split_errno = None;
    Some(PayloadMode::Chunks {
        chunk_bytes: piece_bytes,
    })
}

/// Starts a connection's read-queue thread where it pays: reads of flash
/// through io_uring and a nonzero `read_queue_depth`.
fn spawn_read_queue_thread(
    shared: &Arc<Shared>,
    workers: &SyncSender<Job>,
    replier: &Arc<Replier>,
    slot: &Arc<Slot>,
) -> (Option<SyncSender<Job>>, Option<JoinHandle<()>>) {
    let depth = shared
        .config
        .read_queue_depth
        .min(shared.config.max_in_flight_requests);
    if depth == 0 || shared.cache.ioengine() != l2arc::IoEngine::IoUring {
        return (None, None);
    }
    let (tx, rx) = sync_channel::<Job>(shared.config.max_in_flight_requests);
    let (shared, workers, replier, slot) = (
        Arc::clone(shared),
        workers.clone(),
        Arc::clone(replier),
        Arc::clone(slot),
    );
    let spawned = std::thread::Builder::new()
        .name("nbd-reads".to_string())
        .spawn(move || read_queue_thread(&shared, depth, &rx, &workers, &replier, &slot));
    match spawned {
        Ok(t) => (Some(tx), Some(t)),
        Err(_) => (None, None),
    }
}

/// A request taken by the read-queue thread and not yet answered.
struct QueuedRead {
    job: Job,
    timer: l2arc::analytics::Timer,
}

/// Serves the reads the reader hands it through one read queue, `depth`
/// in flight at most; passes reads that need primary storage on to the
/// workers. Runs until the reader is done and every read is answered.
fn read_queue_thread(
    shared: &Shared,
    depth: usize,
    rx: &Receiver<Job>,
    workers: &SyncSender<Job>,
    replier: &Replier,
    slot: &Slot,
) {
    let mut queue = match shared.cache.read_queue(depth) {
        Ok(q) if q.ioengine() == l2arc::IoEngine::IoUring => q,
        _ => {
            // No ring after all: the workers serve every read.
            for job in rx {
                pass_on(workers, job, slot);
            }
            return;
        }
    };
    let mut taken: Vec<Option<QueuedRead>> = (0..depth).map(|_| None).collect();
    let mut free_tags: Vec<u64> = (0..depth as u64).rev().collect();
    let mut done = Vec::with_capacity(depth);
    // Reads for the workers that their full queue has not taken yet (at
    // most `depth`: no more are taken from the reader meanwhile).
    let mut passing: VecDeque<Job> = VecDeque::with_capacity(depth);
    let mut open = true;
    while open || queue.pending() > 0 || !passing.is_empty() {
        pass_on_without_blocking(workers, &mut passing, slot);
        let mut next = None;
        if open && queue.pending() == 0 && passing.is_empty() {
            // Nothing in flight: wait for a request.
            match rx.recv() {
                Ok(job) => next = Some(job),
                Err(_) => open = false,
            }
        }
        loop {
            let job = match next.take() {
                Some(job) => job,
                None if open && queue.has_room() && passing.len() < depth => match rx.try_recv() {
                    Ok(job) => job,
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                },
                None => break,
            };
            let taking = (&mut taken[..], &mut free_tags);
            if take_read(shared, &mut queue, job, taking, &mut passing, replier, slot).is_err() {
                return give_up(replier, &mut taken, passing, rx, slot);
            }
        }
        pass_on_without_blocking(workers, &mut passing, slot);
        if queue.pending() == 0 {
            if !passing.is_empty() {
                // The workers are busy (reads of primary storage take
                // milliseconds): look again shortly.
                std::thread::sleep(READ_QUEUE_POLL);
            }
            continue;
        }
        let waited = if open {
            queue.wait_timeout(1, &mut done, READ_QUEUE_POLL)
        } else {
            queue.wait(queue.pending(), &mut done)
        };
        for completion in done.drain(..) {
            let read = taken[completion.tag as usize]
                .take()
                .expect("a completion for a read this thread took");
            free_tags.push(completion.tag);
            answer_read(shared, replier, read, completion.result);
            let before = slot.in_flight.fetch_sub(1, Ordering::SeqCst);
            assert!(before > 0, "a request left that never came in");
        }
        if waited.is_err() {
            return give_up(replier, &mut taken, passing, rx, slot);
        }
    }
}

/// The read queue failed (its ring refused to submit or wait): reads in
/// flight cannot be trusted to finish, so the connection ends; the
/// requests taken or still queued are dropped with it.
fn give_up(
    replier: &Replier,
    taken: &mut [Option<QueuedRead>],
    passing: VecDeque<Job>,
    rx: &Receiver<Job>,
    slot: &Slot,
) {
    replier.hang_up();
    let dropped =
        taken.iter_mut().filter_map(Option::take).count() + passing.len() + rx.try_iter().count();
    slot.in_flight.fetch_sub(dropped, Ordering::SeqCst);
}

/// Starts one read in the queue, or passes it on to the workers if it
/// needs primary storage. `Err`: the queue failed (the request is
/// answered with the error).
fn take_read(
    shared: &Shared,
    queue: &mut l2arc::ReadQueue<'_>,
    job: Job,
    (taken, free_tags): (&mut [Option<QueuedRead>], &mut Vec<u64>),
    passing: &mut VecDeque<Job>,
    replier: &Replier,
    slot: &Slot,
) -> io::Result<()> {
    if replier.broken.load(Ordering::Relaxed) || slot.account.is_closed() {
        drop(job);
        slot.in_flight.fetch_sub(1, Ordering::SeqCst);
        return Ok(());
    }
    let tag = free_tags
        .pop()
        .expect("a free tag while the queue has room");
    let timer = shared.cache.analytics().start();
    let request = job.request;
    match queue.submit_if_cached(
        &shared.handle,
        request.offset_bytes,
        request.length_bytes as usize,
        tag,
    ) {
        Ok(true) => {
            shared.counters.reads_queued.fetch_add(1, Ordering::Relaxed);
            taken[tag as usize] = Some(QueuedRead { job, timer });
        }
        Ok(false) => {
            shared
                .counters
                .reads_passed_on
                .fetch_add(1, Ordering::Relaxed);
            free_tags.push(tag);
            passing.push_back(job);
        }
        Err(e) => {
            let failed = io::Error::new(e.kind(), e.to_string());
            answer_read(shared, replier, QueuedRead { job, timer }, Err(e));
            slot.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(failed);
        }
    }
    Ok(())
}

/// Hands a request to the workers (they count it out when done),
/// blocking while their queue is full.
fn pass_on(workers: &SyncSender<Job>, job: Job, slot: &Slot) {
    if workers.send(job).is_err() {
        slot.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Hands the workers what they have room for, without blocking: a worker
/// may be waiting on a record this thread's queue is reading, and that
/// read completes only when this thread reaps it.
fn pass_on_without_blocking(workers: &SyncSender<Job>, passing: &mut VecDeque<Job>, slot: &Slot) {
    while let Some(job) = passing.pop_front() {
        match workers.try_send(job) {
            Ok(()) => {}
            Err(std::sync::mpsc::TrySendError::Full(job)) => {
                passing.push_front(job);
                return;
            }
            Err(std::sync::mpsc::TrySendError::Disconnected(job)) => {
                drop(job);
                slot.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// Sends a read's reply: its bytes, zeros past a short read (the image
/// shrank behind us, as `read_piece` fills), or its error.
fn answer_read(
    shared: &Shared,
    replier: &Replier,
    read: QueuedRead,
    result: io::Result<l2arc::ReadView>,
) {
    let request = read.job.request;
    match result {
        Ok(view) => {
            let header = protocol::simple_reply(request.cookie, 0);
            let zeros = vec![0u8; (request.length_bytes as usize).saturating_sub(view.len())];
            let mut parts: smallvec::SmallVec<[&[u8]; 4]> = smallvec::SmallVec::new();
            parts.push(&header);
            parts.extend(view.slices());
            parts.push(&zeros);
            let mut conn = replier.conn.lock().unwrap_or_else(|p| p.into_inner());
            replier.write_parts(&mut conn, &parts);
            drop(conn);
            shared.cache.analytics().frontend.finish(read.timer);
        }
        Err(e) => {
            shared
                .counters
                .request_errors
                .fetch_add(1, Ordering::Relaxed);
            replier.reply(request.cookie, protocol::errno_of(&e));
        }
    }
}

/// A connection's workers: they share one queue of requests, and the pool
/// grows while every worker is busy, up to `workers_max`. A worker blocked
/// on primary storage holds a thread, so a client with 32 reads in flight
/// that all miss needs 32 workers to keep 32 primary reads going; a quiet
/// connection keeps its first few. Workers end with the connection.
struct Workers {
    shared: Arc<Shared>,
    rx: Mutex<Receiver<Job>>,
    replier: Arc<Replier>,
    slot: Arc<Slot>,
    workers_max: usize,
    /// Workers started (they never end before the connection does).
    started: AtomicUsize,
    /// Workers waiting for a request.
    idle: AtomicUsize,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Workers {
    /// Starts one more worker unless `workers_max` are running.
    fn start_one(workers: &Arc<Workers>) {
        let claimed = workers
            .started
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < workers.workers_max).then_some(n + 1)
            });
        let Ok(n) = claimed else {
            return;
        };
        let pool = Arc::clone(workers);
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-worker-{n}"))
            .spawn(move || worker(&pool));
        match spawned {
            Ok(t) => {
                workers
                    .shared
                    .counters
                    .workers_started
                    .fetch_add(1, Ordering::Relaxed);
                workers
                    .threads
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(t);
            }
            Err(_) => {
                workers.started.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Waits for every worker to end (the queue's sender is gone). A worker
    /// may start another while it runs; the one it starts is listed before
    /// its own join returns, so an empty list means none is left.
    fn join_all(&self) {
        loop {
            let next = self.threads.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let Some(thread) = next else {
                return;
            };
            let _ = thread.join();
        }
    }
}

fn worker(pool: &Arc<Workers>) {
    let (shared, replier, slot) = (&*pool.shared, &*pool.replier, &*pool.slot);
    loop {
        pool.idle.fetch_add(1, Ordering::SeqCst);
        let job = {
            let rx = pool.rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        let idle_before = pool.idle.fetch_sub(1, Ordering::SeqCst);
        let Ok(job) = job else {
            return;
        };
        if idle_before == 1 {
            // The last idle worker took this one: the next request would
            // wait behind busy ones.
            Workers::start_one(pool);
        }
        // A connection that is going away gets no more work done for it.
        if !replier.broken.load(Ordering::Relaxed) && !slot.account.is_closed() {
            serve_request(shared, replier, &job);
        }
        drop(job);
        let before = slot.in_flight.fetch_sub(1, Ordering::SeqCst);
        assert!(before > 0, "a request left that never came in");
    }
}

/// Reads `buf.len()` bytes at `offset_bytes`; a short read (the image
/// shrank behind us) leaves zeros, as a hole would read.
fn read_piece(shared: &Shared, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
    let n = shared.cache.read(&shared.handle, offset_bytes, buf)?;
    let len = buf.len();
    buf[n.min(len)..].fill(0);
    Ok(())
}

/// A read longer than the advertised maximum, served by splitting: the
/// first piece is read before the reply header goes out (so an early
/// error is a clean error reply); an error after that ends the connection,
/// as proto.md requires of simple replies. The connection's other replies
/// wait for this one (its pieces must not interleave with them).
fn serve_split_read(shared: &Shared, replier: &Replier, request: &Request) {
    shared
        .counters
        .requests_split
        .fetch_add(1, Ordering::Relaxed);
    let total_bytes = u64::from(request.length_bytes);
    let piece_max_bytes = u64::from(split_piece_bytes(&shared.config));
    let mut buf = vec![0u8; piece_max_bytes.min(total_bytes) as usize];
    let first_bytes = buf.len();
    if let Err(e) = read_piece(shared, request.offset_bytes, &mut buf[..first_bytes]) {
        shared
            .counters
            .request_errors
            .fetch_add(1, Ordering::Relaxed);
        replier.reply(request.cookie, protocol::errno_of(&e));
        return;
    }
    let mut conn = replier.conn.lock().unwrap_or_else(|p| p.into_inner());
    let header = protocol::simple_reply(request.cookie, 0);
    if !replier.write_parts(&mut conn, &[&header, &buf[..first_bytes]]) {
        return;
    }
    let mut done_bytes = first_bytes as u64;
    while done_bytes < total_bytes {
        let n = (total_bytes - done_bytes).min(piece_max_bytes) as usize;
        if read_piece(shared, request.offset_bytes + done_bytes, &mut buf[..n]).is_err() {
            shared
                .counters
                .request_errors
                .fetch_add(1, Ordering::Relaxed);
            drop(conn);
            replier.hang_up();
            return;
        }
        if !replier.write_parts(&mut conn, &[&buf[..n]]) {
            return;
        }
        done_bytes += n as u64;
    }
}

/// Runs one checked request against the cache and sends its reply.
fn serve_request(shared: &Shared, replier: &Replier, job: &Job) {
    let (request, command) = (job.request, job.command);
    debug_assert!(
        command == Command::Flush
            || request
                .offset_bytes
                .saturating_add(u64::from(request.length_bytes))
                <= shared.export.size_bytes
    );
    let result = match command {
        Command::Read if request.length_bytes > read_piece_bytes(&shared.config) => {
            serve_split_read(shared, replier, &request);
            return;
        }
        Command::Read => match serve_read(shared, replier, &request) {
            Ok(()) => return,
            Err(e) => Err(e),
        },
        _ => serve_update(shared, &request, command, &job.payload),
    };
    let error = match &result {
        Ok(()) => 0,
        Err(e) => {
            shared
                .counters
                .request_errors
                .fetch_add(1, Ordering::Relaxed);
            protocol::errno_of(e)
        }
    };
    replier.reply(request.cookie, error);
}

/// A read of at most one piece, answered with its data on success.
fn serve_read(shared: &Shared, replier: &Replier, request: &Request) -> io::Result<()> {
    let analytics = shared.cache.analytics();
    let timer = analytics.start();
    let mut reply = vec![0u8; SIMPLE_REPLY_BYTES + request.length_bytes as usize];
    read_piece(
        shared,
        request.offset_bytes,
        &mut reply[SIMPLE_REPLY_BYTES..],
    )?;
    reply[..SIMPLE_REPLY_BYTES].copy_from_slice(&protocol::simple_reply(request.cookie, 0));
    replier.send(&reply);
    analytics.frontend.finish(timer);
    Ok(())
}

/// Every command but reads: writes, flushes, trims, zeroing and prefetch.
fn serve_update(
    shared: &Shared,
    request: &Request,
    command: Command,
    payload: &[u8],
) -> io::Result<()> {
    let cache = &shared.cache;
    let handle = &shared.handle;
    let offset_bytes = request.offset_bytes;
    let length_bytes = u64::from(request.length_bytes);
    let fua = request.flags & NBD_CMD_FLAG_FUA != 0;
    let then_sync = |r: io::Result<()>| {
        if r.is_ok() && fua {
            cache.sync(handle)
        } else {
            r
        }
    };
    match command {
        Command::Write => {
            debug_assert_eq!(payload.len() as u64, length_bytes);
            then_sync(cache.write(handle, offset_bytes, payload))
        }
        Command::Flush => cache.sync(handle),
        Command::Trim => match cache.discard(handle, offset_bytes, length_bytes) {
            // TRIM is advisory: an image that cannot punch holes ignores it.
            Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(()),
            r => then_sync(r),
        },
        Command::WriteZeroes => {
            let punched = request.flags & NBD_CMD_FLAG_NO_HOLE == 0
                && cache.discard(handle, offset_bytes, length_bytes).is_ok();
            if punched {
                then_sync(Ok(()))
            } else {
                then_sync(write_zeroes(cache, handle, offset_bytes, length_bytes))
            }
        }
        Command::Cache => {
            let mut at = offset_bytes;
            let end = offset_bytes + length_bytes;
            while at < end {
                let n = (end - at).min(ZERO_CHUNK_BYTES as u64);
                cache.prefetch(handle, at, n as usize)?;
                at += n;
            }
            Ok(())
        }
        Command::Read | Command::Disconnect => {
            unreachable!("reads are served apart; the reader handles NBD_CMD_DISC")
        }
    }
}

fn write_zeroes(cache: &Cache, handle: &ObjectHandle, offset: u64, len: u64) -> io::Result<()> {
    // One buffer of zeros for the whole process (never written: its pages
    // stay the kernel's zero page), not one per request.
    static ZEROS: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let zeros = ZEROS.get_or_init(|| vec![0u8; ZERO_CHUNK_BYTES]);
    let mut at = offset;
    let end = offset + len;
    while at < end {
        let n = (end - at).min(zeros.len() as u64) as usize;
        cache.write(handle, at, &zeros[..n])?;
        at += n as u64;
    }
    Ok(())
}
