//! The DRAM tier: the ARC policy and the live, sharded cache of record buffers.
//!
//! `policy` is the pure replacement algorithm (no I/O, no data), shared by
//! the live cache and trace replay. `live` wraps it with reference-counted
//! buffers, per-shard locks and single-flight fills. `memory` reads the
//! system's memory and `breathe` moves the live cache's `c` with it
//! (`arc_max = auto`).

pub mod breathe;
pub(crate) mod live;
pub mod memory;
pub mod policy;

pub use policy::{AccessKind, ArcPolicy, DramPolicy, ListId};
