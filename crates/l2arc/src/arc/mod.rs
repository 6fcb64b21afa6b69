//! The DRAM tier: the ARC policy and the live, sharded cache of record buffers.
//!
//! `policy` is the pure replacement algorithm (no I/O, no data), shared by
//! the live cache and trace replay. `live` wraps it with reference-counted
//! buffers, per-shard locks and single-flight fills. `shape` is the on-disk
//! form of the ARC's lists, ghosts and `p`, saved at a stop and read back at
//! start (`cache::prewarm`).

pub(crate) mod live;
pub mod policy;
pub mod shape;

pub use policy::{AccessKind, ArcPolicy, DramPolicy, ListId};
