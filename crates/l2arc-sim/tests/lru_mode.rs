//! The engine's LRU mode against l2arc-sim's reference LRU.
//!
//! The benchmarks put an LRU DRAM tier in front of our own L2ARC to show what
//! ARC buys; that comparison is only meaningful if the LRU mode is exactly
//! LRU. So the live cache, one shard, in `DramPolicy::Lru`, must make the
//! reference LRU's decisions hit for hit on the ARC paper's OLTP trace (one
//! 4 KiB buffer per page), at several sizes; and the pure policy in LRU mode
//! must do the same on a byte-sized trace.
//!
//! A missing trace fails the test, as in tests/reproduce.rs.

use std::sync::{Arc, OnceLock};

use l2arc::arc::{AccessKind, ArcPolicy, DramPolicy, ListId};
use l2arc::internals::{AlignedBuf, ArcConfig, LiveArc, Lookup, Record, RecordKey};
use l2arc_sim::{Request, TraceFormat, load_trace};

/// What one record buffer costs the live ARC: `AlignedBuf::zeroed(0)` has
/// one 4 KiB block of capacity.
const PAGE_BYTES: u64 = 4096;

fn load(name: &str, format: TraceFormat) -> Vec<Request> {
    let path = l2arc_testkit::reference_trace(name);
    load_trace(&path, format).unwrap_or_else(|e| panic!("{e}"))
}

fn oltp() -> &'static [Request] {
    static T: OnceLock<Vec<Request>> = OnceLock::new();
    T.get_or_init(|| {
        let trace = load("OLTP.lis.zst", TraceFormat::Lis);
        assert_eq!(trace.len(), 914_145, "OLTP trace has the wrong length");
        assert!(
            trace.iter().all(|r| r.size == 1),
            "OLTP is a unit-size trace"
        );
        trace
    })
}

/// Replays the trace through a one-shard live cache in LRU mode holding
/// `pages` 4 KiB buffers; returns the hits.
fn live_lru_hits(trace: &[Request], pages: u64) -> u64 {
    let arc = LiveArc::new(ArcConfig {
        arc_max_bytes: pages * PAGE_BYTES,
        shards: 1,
        dram_policy: DramPolicy::Lru,
    });
    let mut hits = 0u64;
    for r in trace {
        let key = RecordKey {
            dataset: 0,
            object: 0,
            record: r.key,
        };
        match arc.lookup(key, 1, AccessKind::Demand) {
            Lookup::Hit(_) => hits += 1,
            Lookup::Claimed(claim) => claim.complete(Ok(Arc::new(Record {
                data: AlignedBuf::zeroed(0),
                generation_token: 1,
                fill_sequence: 0,
            }))),
            Lookup::InFlight(_) => panic!("a fill in flight with one thread, at key {}", r.key),
        }
    }
    let stats = arc.stats();
    assert_eq!(stats.hits, hits);
    assert_eq!(stats.hits + stats.misses, trace.len() as u64);
    assert_eq!(stats.mfu_hits, 0, "LRU mode promoted to MFU");
    assert_eq!(stats.mru_ghost_hits + stats.mfu_ghost_hits, 0);
    assert_eq!(
        stats.mfu_size + stats.mru_ghost_size + stats.mfu_ghost_size,
        0
    );
    assert_eq!(stats.insert_no_room, 0);
    assert_eq!(stats.size, pages * PAGE_BYTES, "a warm LRU is full");
    arc.assert_consistent();
    hits
}

#[test]
fn live_lru_mode_equals_reference_lru_on_oltp() {
    let trace = oltp();
    for pages in [1000u64, 5000, 15000] {
        let reference = l2arc_sim::lru::count_hits(trace, pages);
        let live = live_lru_hits(trace, pages);
        println!(
            "OLTP c={pages}: reference LRU {reference} hits ({:.3}%), live LRU mode {live}",
            reference as f64 * 100.0 / trace.len() as f64
        );
        assert_eq!(live, reference, "LRU mode diverged from LRU at c={pages}");
    }
}

/// The pure policy in LRU mode, with byte sizes, against the reference LRU
/// on the CloudPhysics trace (variable-size objects, in bytes).
#[test]
fn policy_lru_mode_equals_reference_lru_with_sizes() {
    let trace = load("cloudPhysicsIO.oracleGeneral.bin.zst", TraceFormat::Oracle);
    // The reference LRU resizes an object whose size changes between
    // requests; the ARC policy keeps the size it was inserted with. The
    // comparison holds only for traces where a key keeps its size.
    let mut sizes = std::collections::HashMap::new();
    for r in &trace {
        assert_eq!(
            *sizes.entry(r.key).or_insert(r.size),
            r.size,
            "a key changes size"
        );
    }
    for capacity_bytes in [64u64 << 20, 256 << 20, 1 << 30] {
        let reference = l2arc_sim::lru::count_hits(&trace, capacity_bytes);
        let mut policy: ArcPolicy<u64, ()> =
            ArcPolicy::with_policy(capacity_bytes, DramPolicy::Lru);
        let hits = trace
            .iter()
            .filter(|r| policy.access(r.key, r.size))
            .count() as u64;
        assert_eq!(policy.list_len(ListId::Mfu), 0);
        policy.assert_consistent();
        println!("CloudPhysics {capacity_bytes} bytes: reference {reference}, LRU mode {hits}");
        assert_eq!(
            hits, reference,
            "LRU mode diverged at {capacity_bytes} bytes"
        );
    }
}
