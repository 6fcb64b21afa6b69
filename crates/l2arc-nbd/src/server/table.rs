//! The connection table: every open client's slot, and the mechanism of
//! bumping and reclaiming.
//!
//! Why apart from the policy. Which slot to bump and which connection to
//! reclaim are decided by pure functions (`admission.rs`, `budget.rs`) on
//! a snapshot of the table taken under its lock; this module reads the
//! atomics of each slot into that snapshot and carries out the decision
//! (shuts the victim's socket and closes its pool account, so that its
//! waiting charges give up and its threads end). The lock is held from the
//! snapshot to the close, so the victim chosen is still in the table when
//! it is closed. A bumped slot counts as taken until its thread ends: the
//! newcomer is let in at once, so the table may hold one more than
//! `max_connections` for that moment.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::admission::{self, Admission, SlotState};
use super::budget::{self, HolderState};
use super::{Conn, Shared};
use crate::pool::{Account, BufferPool, Charge};

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

    /// The slot as the admission policy sees it now.
    fn state(&self, pool: &BufferPool) -> SlotState {
        if self.account.is_closed() {
            SlotState::Closing
        } else if !self.transmitting.load(Ordering::SeqCst) {
            SlotState::Negotiating {
                connected_ms: self.connected_ms,
            }
        } else {
            SlotState::Transmitting {
                last_active_ms: self.last_active_ms.load(Ordering::Relaxed),
                in_flight: self.in_flight.load(Ordering::SeqCst),
                reply_stuck_ms: self.account.reply_stuck_ms(pool),
            }
        }
    }
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

    /// Connections open and their requests in flight, now.
    pub(super) fn in_flight_now(&self) -> (u64, u64) {
        let open = self.open();
        let in_flight: usize = open
            .values()
            .map(|s| s.in_flight.load(Ordering::SeqCst))
            .sum();
        (open.len() as u64, in_flight as u64)
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

    /// Whether a newcomer gets in (`admission::admit` on the table now);
    /// a slot to bump is closed before this returns. Its thread then ends
    /// and frees the slot.
    pub(super) fn admit(
        &self,
        max_connections: usize,
        now_ms: u64,
        pool: &BufferPool,
    ) -> Admission {
        if self.active() < max_connections {
            // The common case, decided without taking the lock.
            return Admission::Admit;
        }
        let open = self.open();
        let slots: Vec<&Arc<Slot>> = open.values().collect();
        let states: Vec<SlotState> = slots.iter().map(|s| s.state(pool)).collect();
        let admission = admission::admit(self.active(), max_connections, &states, now_ms);
        if let Admission::Bump { victim, .. } = admission {
            assert_ne!(states[victim], SlotState::Closing, "a slot bumped twice");
            slots[victim].close(pool);
        }
        admission
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
        let slots: Vec<&Arc<Slot>> = open.values().collect();
        let holders: Vec<HolderState> = slots
            .iter()
            .map(|s| HolderState {
                asking: std::ptr::eq(Arc::as_ptr(&s.account), asking),
                closing: s.account.is_closed(),
                stalled: s.account.is_stalled(&self.pool, stall_min_ms),
                held_bytes: s.account.held_bytes(),
            })
            .collect();
        if let Some(victim) = budget::reclaim_victim(&holders) {
            slots[victim].close(&self.pool);
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
