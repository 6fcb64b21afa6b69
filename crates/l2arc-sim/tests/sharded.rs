//! The live sharded ARC against the single-shard policy on the OLTP trace.
//!
//! `LiveArc` splits the key space by hash into independent ARCs of
//! `arc_max / shards` bytes each. The claim (see `l2arc::arc::live`) is that
//! with a well-mixed hash the hit ratio stays within a fraction of a point of
//! one big ARC; and with one shard the live wrapper must make exactly the
//! pure policy's decisions. Both are checked here on the ARC paper's OLTP
//! trace, with every page costing one 4 KiB buffer.
//!
//! A missing trace fails the test, as in tests/reproduce.rs.

use std::sync::{Arc, OnceLock};

use l2arc::arc::{AccessKind, DramPolicy};
use l2arc::internals::AlignedBuf;
use l2arc::internals::{ArcConfig, LiveArc, Lookup, Record, RecordKey};
use l2arc_sim::{PolicyName, Request, TraceFormat, load_trace, replay};

/// Cache size in pages, as in the ARC paper's Table IV.
const PAGES: u64 = 10_000;
/// What one record buffer costs the live ARC: `AlignedBuf::zeroed(0)` has
/// one 4 KiB block of capacity.
const PAGE_BYTES: u64 = 4096;

fn oltp() -> &'static [Request] {
    static T: OnceLock<Vec<Request>> = OnceLock::new();
    T.get_or_init(|| {
        let path = l2arc_testkit::reference_trace("OLTP.lis.zst");
        let trace = load_trace(&path, TraceFormat::Lis).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(trace.len(), 914_145, "OLTP trace has the wrong length");
        assert!(
            trace.iter().all(|r| r.size == 1),
            "OLTP is a unit-size trace"
        );
        trace
    })
}

/// Replays the trace through a live ARC of `shards` shards holding `PAGES`
/// 4 KiB buffers in all; returns the hits.
fn live_hits(trace: &[Request], shards: usize) -> u64 {
    let arc = LiveArc::new(ArcConfig {
        arc_max_bytes: PAGES * PAGE_BYTES,
        shards,
        dram_policy: DramPolicy::Arc,
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
            Lookup::Claimed(claim) => {
                let record = Arc::new(Record {
                    data: AlignedBuf::zeroed(0),
                    generation_token: 1,
                    fill_sequence: 0,
                });
                assert_eq!(record.size_bytes(), PAGE_BYTES);
                claim.complete(Ok(record));
            }
            Lookup::InFlight(_) => panic!("a fill in flight with one thread, at key {}", r.key),
        }
    }
    let stats = arc.stats();
    assert_eq!(stats.hits, hits);
    assert_eq!(stats.hits + stats.misses, trace.len() as u64);
    assert_eq!(stats.iohits, 0);
    assert_eq!(stats.stale_drops, 0);
    assert_eq!(
        stats.insert_no_room, 0,
        "nothing is referenced, so nothing is refused"
    );
    assert!(
        stats.size <= PAGES * PAGE_BYTES,
        "size {} over arc_max",
        stats.size
    );
    arc.assert_consistent();
    hits
}

fn percent(hits: u64, requests: usize) -> f64 {
    hits as f64 * 100.0 / requests as f64
}

/// One live shard is the pure policy, decision for decision.
#[test]
fn one_live_shard_equals_the_policy() {
    let trace = oltp();
    let policy = replay(trace, PolicyName::Arc, PAGES);
    let live = live_hits(trace, 1);
    println!(
        "OLTP c={PAGES}: policy {} hits ({:.3}%), live 1 shard {live} hits ({:.3}%)",
        policy.hits,
        policy.hit_ratio * 100.0,
        percent(live, trace.len())
    );
    assert_eq!(
        live, policy.hits,
        "the live wrapper changed the policy's decisions"
    );
}

/// Sixteen shards of 625 pages stay within half a point of one ARC of 10000.
#[test]
fn sixteen_shards_stay_close_to_one() {
    let trace = oltp();
    let one = replay(trace, PolicyName::Arc, PAGES).hit_ratio * 100.0;
    let sixteen = percent(live_hits(trace, 16), trace.len());
    println!(
        "OLTP c={PAGES}: 1 shard {one:.3}%, 16 shards {sixteen:.3}% ({:+.3} points)",
        sixteen - one
    );
    assert!(
        (sixteen - one).abs() <= 0.5,
        "16 shards {sixteen:.3}% vs 1 shard {one:.3}%: more than 0.5 points apart"
    );
}
