//! The DRAM tier: the ARC policy and the live, sharded cache of record buffers.
//!
//! `policy` is the pure replacement algorithm (no I/O, no data), shared by
//! the live cache and trace replay. `live` wraps it with reference-counted
//! buffers, per-shard locks and single-flight fills.

pub(crate) mod live;
pub mod policy;

pub use policy::{AccessKind, ArcPolicy, DramPolicy, ListId};
