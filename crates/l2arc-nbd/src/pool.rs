//! One memory budget for the request and reply buffers of every connection.
//!
//! Why. Each NBD request may carry or ask for up to the maximum payload
//! (32 MiB): a write's data is held until it is written, a read's reply
//! until the client takes it off the socket. Per-connection limits alone
//! multiply by the number of connections: 64 clients that never read their
//! replies and leave a 32 MiB write one byte short once took the server to
//! 6.9 GB with a 64 MiB ARC. So every such buffer is charged, before it is
//! allocated, to one [`BufferPool`] of `max_bytes` shared by all
//! connections, and the service's memory is the ARC, the L2 index, this
//! pool, and a fixed part per connection (docs/nbd.md gives the formula).
//!
//! A full pool makes the asking connection wait (its reader stops reading
//! the socket: TCP pushes back on that client only). Waiting alone would
//! let hostile clients hold the pool for ever, so a charge that has waited
//! [`RECLAIM_WAIT`] asks the server to disconnect the connection holding
//! the most of the pool among those that have made no progress (no request
//! finished, no reply bytes taken by the client) for the stall time: a
//! client that does not read its replies or stops in the middle of a
//! write stalls itself, and loses its connection only when others need
//! the memory. Charges are taken whole, before any byte of the request is
//! buffered, so a waiting connection holds only complete requests, which
//! finish on their own: good clients cannot deadlock one another.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a charge waits on a full pool before it asks for a reclaim
/// (and again after each reclaim).
pub const RECLAIM_WAIT: Duration = Duration::from_millis(500);
/// How often a waiting charge looks again (besides wake-ups on release).
const WAIT_POLL: Duration = Duration::from_millis(100);
/// Least time between two trims of the allocator.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// The shared byte budget.
pub struct BufferPool {
    max_bytes: u64,
    used_bytes: Mutex<u64>,
    freed: Condvar,
    high_water_bytes: AtomicU64,
    started: Instant,
    /// A charge was given back since the last trim.
    released_since_trim: AtomicBool,
    /// When the allocator was last trimmed, in the pool's ms.
    last_trim_ms: AtomicU64,
}

impl BufferPool {
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            used_bytes: Mutex::new(0),
            freed: Condvar::new(),
            high_water_bytes: AtomicU64::new(0),
            started: Instant::now(),
            released_since_trim: AtomicBool::new(false),
            last_trim_ms: AtomicU64::new(0),
        }
    }

    /// Bytes charged now.
    pub fn used_bytes(&self) -> u64 {
        *self.used_bytes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Most bytes ever charged at once.
    pub fn high_water_bytes(&self) -> u64 {
        self.high_water_bytes.load(Ordering::Relaxed)
    }

    /// Milliseconds since the pool was made (the clock of
    /// [`Account::last_progress_ms`]).
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Gives the allocator's free memory back to the kernel, at most once
    /// per [`TRIM_INTERVAL`] and only if a buffer was given back since the
    /// last trim. glibc keeps freed buffers in its arenas, and with many
    /// threads allocating buffers of many sizes, free space in the middle of
    /// an arena is never returned: under the soak (docs/benchmarks.md) the
    /// arenas of `serve-nbd` held 700 MiB while the pool held at most 128;
    /// after a memory bomb 55-74 MiB stayed after every client had left.
    /// `malloc_trim` returns the free pages of every arena, wherever they
    /// are. The accept loop calls this at each poll.
    pub fn trim_if_due(&self) {
        let now_ms = self.now_ms();
        let last_ms = self.last_trim_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last_ms) < TRIM_INTERVAL.as_millis() as u64
            || !self.released_since_trim.swap(false, Ordering::Relaxed)
        {
            return;
        }
        self.last_trim_ms.store(now_ms, Ordering::Relaxed);
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only releases free memory of glibc's heaps.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// Wakes every waiter (a connection is closing: its waiters give up).
    pub fn wake_all(&self) {
        let _held = self.used_bytes.lock().unwrap_or_else(|p| p.into_inner());
        self.freed.notify_all();
    }

    /// Charges `bytes` to `account` (at most `account_max_bytes` at once per
    /// connection, unless it holds nothing: one request of any size must be
    /// able to go) and to the pool. Waits while either is full; after each
    /// [`RECLAIM_WAIT`] of waiting on the pool calls `reclaim`. `None` if
    /// the account is closed meanwhile (the connection is going away).
    pub fn charge(
        self: &Arc<Self>,
        account: &Arc<Account>,
        bytes: u64,
        account_max_bytes: u64,
        reclaim: &dyn Fn(),
    ) -> Option<Charge> {
        assert!(
            bytes <= self.max_bytes,
            "a charge of {bytes} bytes can never fit a pool of {}",
            self.max_bytes
        );
        // The connection's own limit: freed by its own requests finishing.
        // Only the connection's reader charges its account, so room seen
        // here is still there once the pool grants the bytes.
        {
            let mut held = account.held.lock().unwrap_or_else(|p| p.into_inner());
            while *held > 0 && *held + bytes > account_max_bytes {
                if account.closed.load(Ordering::SeqCst) {
                    return None;
                }
                held = account
                    .freed
                    .wait_timeout(held, WAIT_POLL)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        // The shared pool. Waiting here does not count as holding: a
        // connection is a reclaim victim only for what it already holds.
        let mut used = self.used_bytes.lock().unwrap_or_else(|p| p.into_inner());
        let mut waited_since = Instant::now();
        while *used + bytes > self.max_bytes {
            if account.closed.load(Ordering::SeqCst) {
                return None;
            }
            used = self
                .freed
                .wait_timeout(used, WAIT_POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if *used + bytes > self.max_bytes && waited_since.elapsed() >= RECLAIM_WAIT {
                drop(used);
                reclaim();
                waited_since = Instant::now();
                used = self.used_bytes.lock().unwrap_or_else(|p| p.into_inner());
            }
        }
        *used += bytes;
        self.high_water_bytes.fetch_max(*used, Ordering::Relaxed);
        drop(used);
        let mut held = account.held.lock().unwrap_or_else(|p| p.into_inner());
        if *held == 0 {
            // Holding nothing until now: no stall has begun.
            account
                .last_progress_ms
                .store(self.now_ms(), Ordering::Relaxed);
        }
        *held += bytes;
        account.held_bytes.store(*held, Ordering::Relaxed);
        drop(held);
        Some(Charge {
            pool: Arc::clone(self),
            account: Arc::clone(account),
            account_bytes: bytes,
            pool_bytes: bytes,
        })
    }
}

/// One connection's share: what it holds and when it last made progress.
pub struct Account {
    held: Mutex<u64>,
    freed: Condvar,
    /// A copy of `held` readable without the lock (for choosing a victim).
    held_bytes: AtomicU64,
    /// When a request of this connection last finished or the client last
    /// took reply bytes, in the pool's ms.
    last_progress_ms: AtomicU64,
    /// Set when the connection is going away: waiting charges give up.
    closed: AtomicBool,
}

impl Account {
    pub fn new(pool: &BufferPool) -> Self {
        Self {
            held: Mutex::new(0),
            freed: Condvar::new(),
            held_bytes: AtomicU64::new(0),
            last_progress_ms: AtomicU64::new(pool.now_ms()),
            closed: AtomicBool::new(false),
        }
    }

    pub fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// Milliseconds without progress while holding memory (0 if it holds none).
    pub fn stalled_ms(&self, pool: &BufferPool) -> u64 {
        if self.held_bytes() == 0 {
            return 0;
        }
        pool.now_ms()
            .saturating_sub(self.last_progress_ms.load(Ordering::Relaxed))
    }

    /// The client took reply bytes (or a request finished).
    pub fn progressed(&self, pool: &BufferPool) {
        self.last_progress_ms
            .store(pool.now_ms(), Ordering::Relaxed);
    }

    /// The connection is going away: every charge waiting for it gives up.
    pub fn close(&self, pool: &BufferPool) {
        self.closed.store(true, Ordering::SeqCst);
        {
            let _held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            self.freed.notify_all();
        }
        pool.wake_all();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

/// Bytes held from the pool and an account; given back on drop.
pub struct Charge {
    pool: Arc<BufferPool>,
    account: Arc<Account>,
    account_bytes: u64,
    pool_bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.pool_bytes > 0 {
            let mut used = self
                .pool
                .used_bytes
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            assert!(*used >= self.pool_bytes, "pool released more than it holds");
            *used -= self.pool_bytes;
            self.pool.freed.notify_all();
            self.pool.released_since_trim.store(true, Ordering::Relaxed);
        }
        let mut held = self.account.held.lock().unwrap_or_else(|p| p.into_inner());
        assert!(
            *held >= self.account_bytes,
            "account released more than it holds"
        );
        *held -= self.account_bytes;
        self.account.held_bytes.store(*held, Ordering::Relaxed);
        self.account.progressed(&self.pool);
        self.account.freed.notify_all();
    }
}
