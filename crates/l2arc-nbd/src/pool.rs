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
//! the most of the pool among those whose *client* keeps it from coming
//! back ([`Account::is_stalled`]): a reply it has not read for the stall
//! time, or a write payload it stopped sending (or sends slower than
//! [`PAYLOAD_RATE_MIN_BYTES_PER_SEC`]). Time the server spends on the cache
//! never counts, so a slow disk under load cannot make a good client look
//! hostile. Such a client stalls itself, and loses its connection only
//! when others need the memory. Charges are taken whole, before any byte
//! of the request is buffered, and a connection waiting for the pool is
//! charged nothing meanwhile, so a waiting connection holds only complete
//! requests, which finish on their own: good clients cannot deadlock one
//! another.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a charge waits on a full pool before it asks for a reclaim
/// (and again after each reclaim).
pub const RECLAIM_WAIT: Duration = Duration::from_millis(500);
/// How often a waiting charge looks again (besides wake-ups on release).
const WAIT_POLL: Duration = Duration::from_millis(100);
/// Least time between two trims of the allocator.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// Buffers at least this large are mapped and unmapped on their own
/// (glibc's `M_MMAP_THRESHOLD`), never kept in an arena.
pub const MMAP_THRESHOLD_BYTES: i32 = 1 << 20;

/// Makes glibc map every allocation of [`MMAP_THRESHOLD_BYTES`] or more on
/// its own and unmap it on free, for the whole process. By default glibc
/// raises that threshold to the size of the largest buffer freed (up to
/// 32 MiB), after which such buffers come from its arenas and stay there:
/// measured under the memory bomb, RSS stayed 130 MiB above the ARC after
/// every client had left, even after `malloc_trim`. A service calls this
/// once at start (`l2arc serve-nbd` does).
pub fn map_large_buffers_alone() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes glibc's allocation policy.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
    }
}

/// What the pool's mutex guards.
#[derive(Default)]
struct PoolState {
    used_bytes: u64,
    /// Large charges waiting: (bytes, ticket). At most one per connection
    /// (only its reader charges), so bounded by the connection limit.
    waiting: Vec<(u64, u64)>,
    next_ticket: u64,
    /// Charges asleep on `BufferPool::freed`: a release wakes them only if
    /// there are some (a wake-up is a system call, and most releases have
    /// nobody to wake).
    sleepers: usize,
}

/// The shared byte budget.
pub struct BufferPool {
    max_bytes: u64,
    state: Mutex<PoolState>,
    freed: Condvar,
    high_water_bytes: AtomicU64,
    started: Instant,
    /// A charge was given back since the last trim.
    released_since_trim: AtomicBool,
    /// When the allocator was last trimmed, in the pool's ms.
    last_trim_ms: AtomicU64,
}

impl BufferPool {
    /// A pool that lends at most `max_bytes`.
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            state: Mutex::new(PoolState::default()),
            freed: Condvar::new(),
            high_water_bytes: AtomicU64::new(0),
            started: Instant::now(),
            released_since_trim: AtomicBool::new(false),
            last_trim_ms: AtomicU64::new(0),
        }
    }

    /// The largest charge that can ever be granted: large charges may use
    /// seven eighths of the pool.
    pub fn largest_charge_bytes(&self) -> u64 {
        limit_bytes_for(self.max_bytes, u64::MAX)
    }

    /// Bytes charged now.
    pub fn used_bytes(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .used_bytes
    }

    /// Most bytes ever charged at once.
    pub fn high_water_bytes(&self) -> u64 {
        self.high_water_bytes.load(Ordering::Relaxed)
    }

    /// Milliseconds since the pool was made (the clock of [`Account`]).
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Asks for the next [`Self::trim_if_due`] to trim: a connection ended
    /// (its buffers, threads and decoder are freed after its last charge).
    pub fn want_trim(&self) {
        self.released_since_trim.store(true, Ordering::Relaxed);
    }

    /// Gives the allocator's free memory back to the kernel, at most once
    /// per [`TRIM_INTERVAL`] and only if a buffer was given back (or a
    /// connection ended) since the last trim. glibc keeps freed buffers in its arenas, and with many
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
        let _state = self.state.lock().unwrap_or_else(|p| p.into_inner());
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
            bytes <= self.largest_charge_bytes(),
            "a charge of {bytes} bytes can never fit a pool of {}",
            self.max_bytes
        );
        if !wait_for_account_room(account, bytes, account_max_bytes) {
            return None;
        }
        if !self.wait_for_pool_room(account, bytes, reclaim) {
            return None;
        }
        let mut held = account.held.lock().unwrap_or_else(|p| p.into_inner());
        Some(self.grant(account, &mut held, bytes))
    }

    /// Adds `bytes`, already taken from the pool, to the account whose
    /// `held` count is locked: the charge that gives both back.
    fn grant(self: &Arc<Self>, account: &Arc<Account>, held: &mut u64, bytes: u64) -> Charge {
        *held += bytes;
        account.held_bytes.store(*held, Ordering::Relaxed);
        Charge {
            pool: Arc::clone(self),
            account: Arc::clone(account),
            account_bytes: bytes,
            pool_bytes: bytes,
        }
    }

    /// As [`Self::charge`], but never waits: `None` when the account or the
    /// pool has no room now (or large charges wait that go first). For a
    /// thread that must not sleep while it holds work only it can finish
    /// (an NBD reader with reads in flight): it finishes that first and then
    /// waits with `charge`.
    pub fn try_charge(
        self: &Arc<Self>,
        account: &Arc<Account>,
        bytes: u64,
        account_max_bytes: u64,
    ) -> Option<Charge> {
        assert!(bytes <= self.largest_charge_bytes());
        let mut held = account.held.lock().unwrap_or_else(|p| p.into_inner());
        if account.closed.load(Ordering::SeqCst)
            || !account_has_room(*held, bytes, account_max_bytes)
        {
            return None;
        }
        {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            // A ticket later than any: every large charge waiting no
            // larger than this one goes first.
            if !may_grant(
                self.max_bytes,
                state.used_bytes,
                bytes,
                &state.waiting,
                u64::MAX,
            ) {
                return None;
            }
            state.used_bytes += bytes;
            self.high_water_bytes
                .fetch_max(state.used_bytes, Ordering::Relaxed);
        }
        Some(self.grant(account, &mut held, bytes))
    }

    /// Waits for room in the shared pool and takes `bytes` of it. Waiting
    /// here does not count as holding: a connection is a reclaim victim only
    /// for what it already holds. False if the account closed meanwhile.
    fn wait_for_pool_room(&self, account: &Account, bytes: u64, reclaim: &dyn Fn()) -> bool {
        let limit_bytes = limit_bytes_for(self.max_bytes, bytes);
        let large = is_large(self.max_bytes, bytes);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        let mut waited_since = Instant::now();
        let mut waiting = false;
        loop {
            if may_grant(
                self.max_bytes,
                state.used_bytes,
                bytes,
                &state.waiting,
                ticket,
            ) {
                break;
            }
            if account.closed.load(Ordering::SeqCst) {
                state.waiting.retain(|&(_, t)| t != ticket);
                self.freed.notify_all();
                return false;
            }
            if large && !waiting {
                state.waiting.push((bytes, ticket));
                waiting = true;
            }
            state.sleepers += 1;
            state = self
                .freed
                .wait_timeout(state, WAIT_POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            state.sleepers -= 1;
            if state.used_bytes + bytes > limit_bytes && waited_since.elapsed() >= RECLAIM_WAIT {
                drop(state);
                reclaim();
                waited_since = Instant::now();
                state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            }
        }
        if waiting {
            state.waiting.retain(|&(_, t)| t != ticket);
            // The next smallest may go now.
            self.freed.notify_all();
        }
        state.used_bytes += bytes;
        self.high_water_bytes
            .fetch_max(state.used_bytes, Ordering::Relaxed);
        drop(state);
        true
    }
}

/// Waits until `account` may hold `bytes` more: a connection's own limit,
/// freed by its own requests finishing. False if the account closed.
fn wait_for_account_room(account: &Account, bytes: u64, account_max_bytes: u64) -> bool {
    // Only the connection's reader charges its account, so room seen here
    // is still there once the pool grants the bytes.
    let mut held = account.held.lock().unwrap_or_else(|p| p.into_inner());
    while !account_has_room(*held, bytes, account_max_bytes) {
        if account.closed.load(Ordering::SeqCst) {
            return false;
        }
        // Counted under the lock a release takes before it looks.
        account.sleepers.fetch_add(1, Ordering::Relaxed);
        held = account
            .freed
            .wait_timeout(held, WAIT_POLL)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        account.sleepers.fetch_sub(1, Ordering::Relaxed);
    }
    true
}

/// One connection's share: what it holds, and whether its client is what
/// keeps it from giving it back.
#[derive(Default)]
pub struct Account {
    held: Mutex<u64>,
    freed: Condvar,
    /// Charges asleep on `freed` (changed and read under `held`'s lock).
    sleepers: AtomicUsize,
    /// A copy of `held` readable without the lock (for choosing a victim).
    held_bytes: AtomicU64,
    /// Since when a reply write has waited for the client to take bytes
    /// (pool ms + 1; 0: no write under way).
    writing_since_ms: AtomicU64,
    /// A charged write payload being received: when it began and when
    /// bytes (or the server's work on a piece) last moved it on (pool ms +
    /// 1; 0: none), and its length.
    receiving_started_ms: AtomicU64,
    receiving_last_ms: AtomicU64,
    receiving_bytes: AtomicU64,
    /// Set when the connection is going away: waiting charges give up.
    closed: AtomicBool,
}

/// Slowest payload a client may send while others wait for memory: a
/// write of N bytes has `stall + N / this` to arrive whole.
pub const PAYLOAD_RATE_MIN_BYTES_PER_SEC: u64 = 1 << 20;

impl Account {
    /// A connection's empty account.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes this account holds now.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// True if the connection holds pool memory that its client keeps
    /// from coming back: a reply write waiting `stall_ms` for the client to
    /// read, or a write payload with no byte for `stall_ms` or arriving
    /// slower than [`PAYLOAD_RATE_MIN_BYTES_PER_SEC`]. Time the server
    /// spends on the cache does not count: under load, a slow disk must
    /// not make a good client look hostile.
    pub fn is_stalled(&self, pool: &BufferPool, stall_ms: u64) -> bool {
        let progress = Progress {
            held_bytes: self.held_bytes(),
            now_ms: pool.now_ms() + 1,
            writing_since_ms: self.writing_since_ms.load(Ordering::Relaxed),
            receiving_started_ms: self.receiving_started_ms.load(Ordering::Relaxed),
            receiving_last_ms: self.receiving_last_ms.load(Ordering::Relaxed),
            receiving_bytes: self.receiving_bytes.load(Ordering::Relaxed),
        };
        stalled(&progress, stall_ms)
    }

    /// How long the reply piece being written has waited for the client to
    /// take it, in ms (0: no write under way). A piece is at most 1 MiB,
    /// which a client that reads at all takes in well under a second.
    pub fn reply_stuck_ms(&self, pool: &BufferPool) -> u64 {
        match self.writing_since_ms.load(Ordering::Relaxed) {
            0 => 0,
            at => (pool.now_ms() + 1).saturating_sub(at),
        }
    }

    /// A reply write to the client begins (`true`) or ends (`false`).
    pub fn writing(&self, pool: &BufferPool, under_way: bool) {
        let at = if under_way { pool.now_ms() + 1 } else { 0 };
        self.writing_since_ms.store(at, Ordering::Relaxed);
    }

    /// A write payload of `bytes` is now awaited from the client.
    pub fn receiving(&self, pool: &BufferPool, bytes: u64) {
        let now = pool.now_ms() + 1;
        self.receiving_bytes.store(bytes, Ordering::Relaxed);
        self.receiving_last_ms.store(now, Ordering::Relaxed);
        self.receiving_started_ms.store(now, Ordering::Relaxed);
    }

    /// The awaited payload moved on (bytes arrived, or the server finished
    /// its work on a piece and waits for the client again).
    pub fn received_some(&self, pool: &BufferPool) {
        if self.receiving_started_ms.load(Ordering::Relaxed) != 0 {
            self.receiving_last_ms
                .store(pool.now_ms() + 1, Ordering::Relaxed);
        }
    }

    /// The awaited payload is complete.
    pub fn received_all(&self) {
        self.receiving_started_ms.store(0, Ordering::Relaxed);
        self.receiving_last_ms.store(0, Ordering::Relaxed);
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

    /// Whether the pool was closed (the server is stopping).
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
            let mut state = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
            assert!(
                state.used_bytes >= self.pool_bytes,
                "pool released more than it holds"
            );
            state.used_bytes -= self.pool_bytes;
            if state.sleepers > 0 {
                self.pool.freed.notify_all();
            }
            self.pool.released_since_trim.store(true, Ordering::Relaxed);
        }
        let mut held = self.account.held.lock().unwrap_or_else(|p| p.into_inner());
        assert!(
            *held >= self.account_bytes,
            "account released more than it holds"
        );
        *held -= self.account_bytes;
        self.account.held_bytes.store(*held, Ordering::Relaxed);
        if self.account.sleepers.load(Ordering::Relaxed) > 0 {
            self.account.freed.notify_all();
        }
    }
}

/// Whether an account holding `held_bytes` may take `bytes` more: within
/// `account_max_bytes`, or anything when it holds nothing (one request of
/// any size must be able to go).
fn account_has_room(held_bytes: u64, bytes: u64, account_max_bytes: u64) -> bool {
    held_bytes == 0 || held_bytes + bytes <= account_max_bytes
}

/// Whether a charge of `bytes` is large: over 1/128 of the pool.
fn is_large(max_bytes: u64, bytes: u64) -> bool {
    bytes > max_bytes / 128
}

/// How full the pool may be after a charge of `bytes`: large charges
/// leave the last eighth to small ones, so that clients asking for a few
/// KiB are served at once even while large requests (hostile or not) fill
/// the rest.
fn limit_bytes_for(max_bytes: u64, bytes: u64) -> u64 {
    if is_large(max_bytes, bytes) {
        max_bytes - max_bytes / 8
    } else {
        max_bytes
    }
}

/// Whether a charge of `bytes` holding `ticket` may be granted now, with
/// `used_bytes` of a pool of `max_bytes` lent and `waiting` the large
/// charges waiting (bytes, ticket). Among large charges, the smallest
/// waiting one goes first (the earliest of equal ones): a client asking
/// for a few MiB is not starved by hostile ones that take every 32 MiB
/// freed. A charge that never waited passes `u64::MAX`.
fn may_grant(
    max_bytes: u64,
    used_bytes: u64,
    bytes: u64,
    waiting: &[(u64, u64)],
    ticket: u64,
) -> bool {
    let first = !is_large(max_bytes, bytes)
        || !waiting
            .iter()
            .any(|&(b, t)| b < bytes || (b == bytes && t < ticket));
    first && used_bytes + bytes <= limit_bytes_for(max_bytes, bytes)
}

/// A connection's progress as [`stalled`] judges it: times are the pool's
/// ms + 1, 0 for "none under way".
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    held_bytes: u64,
    now_ms: u64,
    writing_since_ms: u64,
    receiving_started_ms: u64,
    receiving_last_ms: u64,
    receiving_bytes: u64,
}

/// [`Account::is_stalled`] on a snapshot: memory held while a reply write
/// has waited `stall_ms`, or a payload has had no byte for `stall_ms` or
/// has taken longer than `stall_ms` plus its length at
/// [`PAYLOAD_RATE_MIN_BYTES_PER_SEC`].
fn stalled(p: &Progress, stall_ms: u64) -> bool {
    if p.held_bytes == 0 {
        return false;
    }
    let since = |at_ms: u64| match at_ms {
        0 => 0,
        at => p.now_ms.saturating_sub(at),
    };
    if since(p.writing_since_ms) >= stall_ms {
        return true;
    }
    if p.receiving_started_ms == 0 {
        return false;
    }
    let allowed_ms = stall_ms + p.receiving_bytes * 1000 / PAYLOAD_RATE_MIN_BYTES_PER_SEC;
    since(p.receiving_last_ms) >= stall_ms
        || p.now_ms.saturating_sub(p.receiving_started_ms) >= allowed_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL_BYTES: u64 = 128 << 20;

    #[test]
    fn an_account_holding_nothing_takes_any_size() {
        assert!(account_has_room(0, 1 << 30, 1 << 20));
        assert!(account_has_room(1 << 19, 1 << 19, 1 << 20));
        assert!(!account_has_room(1 << 19, (1 << 19) + 1, 1 << 20));
    }

    #[test]
    fn small_charges_may_use_the_last_eighth_and_large_ones_may_not() {
        let small = POOL_BYTES / 128;
        let large = small + 1;
        let seven_eighths = POOL_BYTES - POOL_BYTES / 8;
        assert!(may_grant(
            POOL_BYTES,
            POOL_BYTES - small,
            small,
            &[],
            u64::MAX
        ));
        assert!(!may_grant(
            POOL_BYTES,
            POOL_BYTES - small + 1,
            small,
            &[],
            u64::MAX
        ));
        assert!(may_grant(
            POOL_BYTES,
            seven_eighths - large,
            large,
            &[],
            u64::MAX
        ));
        assert!(!may_grant(
            POOL_BYTES,
            seven_eighths - large + 1,
            large,
            &[],
            u64::MAX
        ));
        assert_eq!(
            BufferPool::new(POOL_BYTES).largest_charge_bytes(),
            seven_eighths
        );
    }

    #[test]
    fn the_smallest_waiting_large_charge_goes_first_then_the_earliest() {
        let (mib, empty) = (1u64 << 20, 0);
        let waiting = [(8 * mib, 5), (32 * mib, 1)];
        // Room for all: order alone decides.
        assert!(may_grant(POOL_BYTES, empty, 8 * mib, &waiting, 5));
        assert!(
            !may_grant(POOL_BYTES, empty, 8 * mib, &waiting, 6),
            "a later equal one"
        );
        assert!(
            may_grant(POOL_BYTES, empty, 8 * mib, &waiting, 4),
            "an earlier equal one"
        );
        assert!(
            !may_grant(POOL_BYTES, empty, 32 * mib, &waiting, 1),
            "a smaller one waits"
        );
        assert!(
            !may_grant(POOL_BYTES, empty, 8 * mib, &waiting, u64::MAX),
            "never waited"
        );
        assert!(
            may_grant(POOL_BYTES, empty, 4 * mib, &waiting, u64::MAX),
            "smaller than all"
        );
        // Small charges never queue behind large ones.
        assert!(may_grant(POOL_BYTES, empty, 4096, &waiting, u64::MAX));
    }

    #[test]
    fn only_the_clients_doing_makes_a_holder_stalled() {
        let stall_ms = 5000;
        let base = Progress {
            held_bytes: 1 << 20,
            now_ms: 100_000,
            ..Progress::default()
        };
        assert!(
            !stalled(&base, stall_ms),
            "holding, nothing waits on the client"
        );
        let writing = |since| Progress {
            writing_since_ms: base.now_ms - since,
            ..base
        };
        assert!(!stalled(&writing(4999), stall_ms));
        assert!(stalled(&writing(5000), stall_ms));
        assert!(
            !stalled(
                &Progress {
                    held_bytes: 0,
                    ..writing(60_000)
                },
                stall_ms
            ),
            "holding nothing is never stalled"
        );
        // A 16 MiB payload: 5 s + 16 s at 1 MiB/s in all, 5 s between bytes.
        let receiving = |started_ago, last_ago| Progress {
            receiving_started_ms: base.now_ms - started_ago,
            receiving_last_ms: base.now_ms - last_ago,
            receiving_bytes: 16 << 20,
            ..base
        };
        assert!(!stalled(&receiving(20_999, 10), stall_ms));
        assert!(stalled(&receiving(21_000, 10), stall_ms), "too slow");
        assert!(
            stalled(&receiving(6000, 5000), stall_ms),
            "no byte for the stall time"
        );
        assert!(!stalled(&receiving(6000, 4999), stall_ms));
    }
}
