//! NBD front end: exports one image through the l2arc cache over the
//! Network Block Device protocol.
//!
//! Block-level clients (QEMU, nbdcopy, fio's nbd engine, Linux's
//! nbd-client) then read through the ARC and L2ARC without knowing about
//! them. `protocol` is the wire format as pure code (no I/O, fuzzed);
//! `server` moves bytes between sockets and the cache.

pub mod pool;
pub mod protocol;
pub mod server;
mod watch;

pub use server::{DrainReport, ListenAddr, Listener, Server, ServerConfig, ServerStats};
