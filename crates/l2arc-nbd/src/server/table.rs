//! The connection table: who holds a slot, and who gives it up.
//!
//! Why. Slots are bounded (`max_connections`) so that memory and threads
//! are, but a bound is something to hold hostage: 64 clients that connect
//! and then do nothing would keep everyone else out. So a slot is held
//! only while it is used, and a newcomer who finds the table full takes
//! the slot of a client that is not using its own ("bumps" it). Not using
//! a slot means one of three things, each the client's doing, never the
//! server's (a slow disk under load must not make a good client look
//! hostile):
//!
//! - negotiating for longer than `HANDSHAKE_BUMP_MIN`: a real client
//!   finishes the handshake in a few round trips; one that took the
//!   greeting and went quiet is not a client yet;
//! - a reply that has waited `STUCK_BUMP_MIN` for the client to read it:
//!   its requests are "in flight" only because it does not take the answer
//!   (on a Unix socket 64 clients that each ask for 1 MiB and never read
//!   held every slot "busy" for the whole idle timeout);
//! - idle: nothing in flight and quiet for `STUCK_BUMP_MIN`.
//!
//! Among those, a negotiating one goes first (it was never admitted), then
//! a stuck one, then an idle one (a quiet client may be a VM whose disk
//! just has nothing to do); within a kind, the one useless the longest.
//! Only when no slot is bumpable is the newcomer turned away, and told why
//! (the caller's doing).
//!
//! The same table answers the buffer pool's question when a charge has
//! waited for memory: which connection holds the most while its client
//! keeps it from coming back (`reclaim`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Conn, Shared};
use crate::pool::{Account, BufferPool, Charge};

/// A connection still negotiating after this long may be bumped.
pub(super) const HANDSHAKE_BUMP_MIN: Duration = Duration::from_millis(500);
/// A connection idle, or whose reply has not moved, for this long may be
/// bumped.
pub(super) const STUCK_BUMP_MIN: Duration = Duration::from_secs(2);

/// One client's place in the connection table.
pub(super) struct Slot {
    /// A clone of the client's socket, to shut it down from outside.
    pub(super) conn: Conn,
    /// When the client connected, in ms since the server started.
    pub(super) connected_ms: u64,
    /// When the client last sent anything, in ms since the server started.
    pub(super) last_active_ms: AtomicU64,
    /// Requests queued or being served.
    pub(super) in_flight: AtomicUsize,
    /// Past the handshake.
    pub(super) transmitting: AtomicBool,
    /// Its share of the buffer pool.
    pub(super) account: Arc<Account>,
}

impl Slot {
    pub(super) fn new(conn: Conn, now_ms: u64) -> Self {
        Self {
            conn,
            connected_ms: now_ms,
            last_active_ms: AtomicU64::new(now_ms),
            in_flight: AtomicUsize::new(0),
            transmitting: AtomicBool::new(false),
            account: Arc::new(Account::new()),
        }
    }

    /// Ends the connection from outside: the socket is shut down and
    /// charges waiting for it give up.
    pub(super) fn close(&self, pool: &BufferPool) {
        self.account.close(pool);
        self.conn.shutdown();
    }

    /// Why this slot may be given to a newcomer, and since when (ms), if
    /// it may. Lower kinds go first.
    fn bumpable(&self, now_ms: u64, pool: &BufferPool) -> Option<(Unused, u64)> {
        if !self.transmitting.load(Ordering::SeqCst) {
            let negotiating_ms = now_ms.saturating_sub(self.connected_ms);
            return (negotiating_ms >= HANDSHAKE_BUMP_MIN.as_millis() as u64)
                .then_some((Unused::Negotiating, self.connected_ms));
        }
        let stuck_min_ms = STUCK_BUMP_MIN.as_millis() as u64;
        let stuck_ms = self.account.reply_stuck_ms(pool);
        if stuck_ms >= stuck_min_ms {
            return Some((Unused::ReplyUnread, now_ms.saturating_sub(stuck_ms)));
        }
        let last_ms = self.last_active_ms.load(Ordering::Relaxed);
        let idle = self.in_flight.load(Ordering::SeqCst) == 0
            && now_ms.saturating_sub(last_ms) >= stuck_min_ms;
        idle.then_some((Unused::Idle, last_ms))
    }
}

/// How a slot goes unused, in the order they are bumped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Unused {
    /// Took the greeting and did not finish the handshake.
    Negotiating,
    /// A reply waits for the client to read it.
    ReplyUnread,
    /// Nothing in flight, nothing sent.
    Idle,
}

/// Every open connection.
#[derive(Default)]
pub(super) struct Table {
    open: Mutex<HashMap<u64, Arc<Slot>>>,
    /// Slots taken (a bumped slot counts until its thread ends).
    active: AtomicUsize,
}

impl Table {
    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Slots taken now.
    pub(super) fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Lists a new connection.
    pub(super) fn insert(&self, id: u64, slot: Arc<Slot>) {
        self.active.fetch_add(1, Ordering::SeqCst);
        let replaced = self.open().insert(id, slot);
        assert!(replaced.is_none(), "connection ids are never reused");
    }

    /// Frees a connection's slot.
    pub(super) fn remove(&self, id: u64) {
        let removed = self.open().remove(&id);
        assert!(removed.is_some(), "a slot freed twice");
        let before = self.active.fetch_sub(1, Ordering::SeqCst);
        assert!(before > 0);
    }

    /// Shuts down every connection (the server is stopping).
    pub(super) fn shut_all_down(&self) {
        for slot in self.open().values() {
            slot.conn.shutdown();
        }
    }

    /// Shuts down one connection by id, if it is still open.
    pub(super) fn shut_down(&self, id: u64) {
        if let Some(slot) = self.open().get(&id) {
            slot.conn.shutdown();
        }
    }

    /// Closes the slot that has gone unused the longest (see the module
    /// comment for the order). Its thread then ends and frees the slot;
    /// the newcomer is let in at once, so the table may hold one more for
    /// that moment. The kind bumped, if one was.
    pub(super) fn bump_unused(&self, now_ms: u64, pool: &BufferPool) -> Option<Unused> {
        let open = self.open();
        let (victim, unused) = open
            .values()
            .filter(|s| !s.account.is_closed())
            .filter_map(|s| s.bumpable(now_ms, pool).map(|u| (s, u)))
            .min_by_key(|&(_, unused)| unused)?;
        victim.close(pool);
        Some(unused.0)
    }
}

impl Shared {
    /// Called by a charge that has waited on a full pool: disconnects the
    /// connection holding the most pool memory among those its client has
    /// stalled for `stall_timeout` (not `asking`, not one already
    /// closing). Its buffers come back as its threads see the closed
    /// socket.
    fn reclaim(&self, asking: &Account) {
        let stall_min_ms = self.config.stall_timeout.as_millis() as u64;
        let open = self.table.open();
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

    /// Charges `bytes` of buffer memory to `slot`, waiting as `pool.rs`
    /// says; `None` if the connection is closing.
    pub(super) fn charge(&self, slot: &Slot, bytes: u64) -> Option<Charge> {
        self.pool.charge(
            &slot.account,
            bytes,
            self.config.max_in_flight_bytes,
            &|| self.reclaim(&slot.account),
        )
    }

    /// As [`Self::charge`], without waiting.
    pub(super) fn try_charge(&self, slot: &Slot, bytes: u64) -> Option<Charge> {
        self.pool
            .try_charge(&slot.account, bytes, self.config.max_in_flight_bytes)
    }
}
