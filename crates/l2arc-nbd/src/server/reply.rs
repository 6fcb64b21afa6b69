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

use std::io::{self, IoSlice, Write};

use smallvec::SmallVec;
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

    /// Writes `parts` back to back, one system call (`writev`) per piece
    /// of at most `REPLY_PIECE_BYTES`, noting progress after each. False
    /// if the connection broke (it is then shut down).
    pub(super) fn write_parts(&self, conn: &mut Conn, parts: &[&[u8]]) -> bool {
        if self.is_broken() {
            return false;
        }
        let mut at = (0usize, 0usize); // (part, offset in it)
        loop {
            let piece = gather_piece(parts, at);
            if piece.is_empty() {
                return true;
            }
            self.account.writing(&self.pool, true);
            let written = conn.write_vectored(&piece);
            self.account.writing(&self.pool, false);
            match written {
                Ok(n) if n > 0 => at = advance(parts, at, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => {
                    self.broken.store(true, Ordering::Relaxed);
                    conn.shutdown();
                    return false;
                }
            }
        }
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

/// The next piece to write from `at`: slices of `parts`, at most
/// `REPLY_PIECE_BYTES` in all, empty ones left out.
fn gather_piece<'a>(
    parts: &[&'a [u8]],
    (mut part, mut offset): (usize, usize),
) -> SmallVec<[IoSlice<'a>; 4]> {
    let mut piece = SmallVec::new();
    let mut budget_bytes = REPLY_PIECE_BYTES;
    while part < parts.len() && budget_bytes > 0 {
        let rest = &parts[part][offset..];
        let take = rest.len().min(budget_bytes);
        if take > 0 {
            piece.push(IoSlice::new(&rest[..take]));
            budget_bytes -= take;
        }
        (part, offset) = (part + 1, 0);
    }
    piece
}

/// Where `at` moves after `n` more bytes of `parts` went out.
fn advance(
    parts: &[&[u8]],
    (mut part, mut offset): (usize, usize),
    mut n: usize,
) -> (usize, usize) {
    while n > 0 {
        let rest = parts[part].len() - offset;
        if n < rest {
            return (part, offset + n);
        }
        n -= rest;
        (part, offset) = (part + 1, 0);
    }
    (part, offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_every_byte_once_and_stay_under_the_bound() {
        let big = vec![1u8; REPLY_PIECE_BYTES + 100];
        let parts: [&[u8]; 4] = [b"header..", &[], &big, b"tail"];
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut at = (0, 0);
        let mut sent = Vec::new();
        // Short writes of 7 bytes, then whatever is left of each piece.
        for short in [true, false, false, false] {
            let piece = gather_piece(&parts, at);
            let len: usize = piece.iter().map(|s| s.len()).sum();
            assert!(len <= REPLY_PIECE_BYTES);
            let n = if short { 7 } else { len };
            let flat: Vec<u8> = piece.iter().flat_map(|s| s.iter().copied()).collect();
            sent.extend_from_slice(&flat[..n]);
            at = advance(&parts, at, n);
        }
        assert!(gather_piece(&parts, at).is_empty(), "all sent");
        let want: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(sent.len(), total);
        assert_eq!(sent, want);
    }
}
