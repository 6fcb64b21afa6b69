//! A connection's reply side.
//!
//! Replies of one connection come from several threads (its reader, which
//! answers reads of cached data itself, and its workers) in any order; the
//! client matches them by cookie. Each reply goes out whole under one
//! mutex, so two replies never interleave on the wire. Writing is where a
//! client that does not read shows itself: every piece of at most
//! `REPLY_PIECE_BYTES` is marked in the connection's pool account while it
//! waits for the client, which is how the server tells a stuck reply
//! (the client's doing) from a slow disk (its own).

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::Conn;
use crate::pool::{Account, BufferPool};
use crate::protocol;

/// Largest piece of a reply written to the socket at once (progress is
/// noted after each).
const REPLY_PIECE_BYTES: usize = 1 << 20;

/// The connection's reply side: each reply written whole under the mutex.
pub(super) struct Replier {
    conn: Mutex<Conn>,
    /// Set after a write fails: the connection is going away.
    broken: AtomicBool,
    /// Where the client's taking of reply bytes counts as progress.
    account: Arc<Account>,
    pool: Arc<BufferPool>,
}

impl Replier {
    pub(super) fn new(conn: Conn, account: Arc<Account>, pool: Arc<BufferPool>) -> Self {
        Self {
            conn: Mutex::new(conn),
            broken: AtomicBool::new(false),
            account,
            pool,
        }
    }

    /// Whether a write failed or the connection was hung up.
    pub(super) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// The socket, for a caller that writes several parts as one reply.
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `parts` back to back, in pieces of at most
    /// `REPLY_PIECE_BYTES`, noting progress after each. False if the
    /// connection broke (it is then shut down).
    pub(super) fn write_parts(&self, conn: &mut Conn, parts: &[&[u8]]) -> bool {
        if self.is_broken() {
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

    pub(super) fn send(&self, bytes: &[u8]) {
        let mut conn = self.lock();
        self.write_parts(&mut conn, &[bytes]);
    }

    pub(super) fn reply(&self, cookie: u64, error: u32) {
        self.send(&protocol::simple_reply(cookie, error));
    }

    /// Ends the connection at once (a hard disconnect).
    pub(super) fn hang_up(&self) {
        self.broken.store(true, Ordering::Relaxed);
        self.lock().shutdown();
    }
}

/// Writes to the client; `io::Write` for `write_all`.
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
