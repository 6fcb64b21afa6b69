//! A shrink of the ARC gives its memory back to the kernel: the process's
//! RSS falls by about what the shrink evicted.
//!
//! Why a test binary of its own: it measures this process's RSS, which no
//! other test may share. Record buffers freed by eviction go back to glibc,
//! which keeps chunks under its mmap threshold in its heaps (one arena per
//! reading thread); `breathe::release_freed_memory` (`malloc_trim(0)`) is
//! what returns the pages in the middle of a heap. The figure without it
//! is printed, for the record.

use std::sync::Arc;

use l2arc::arc::breathe::release_freed_memory;
use l2arc::arc::{AccessKind, DramPolicy};
use l2arc::internals::{AlignedBuf, ArcConfig, LiveArc, Lookup, Record, RecordKey};

const MIB: u64 = 1 << 20;
const ARC_MAX_BYTES: u64 = 512 * MIB;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .map(|v| v.trim().parse::<u64>().unwrap() * 1024)
        .expect("VmRSS in /proc/self/status")
}

/// Fills `arc` with twice its size of records from four threads (so that
/// eviction churns and later records come from glibc's heaps, not mmap).
fn fill(arc: &LiveArc, record_bytes: usize) {
    let records = 2 * ARC_MAX_BYTES / record_bytes as u64;
    std::thread::scope(|s| {
        for t in 0..4u64 {
            s.spawn(move || {
                for record in (t..records).step_by(4) {
                    let key = RecordKey {
                        dataset: 0,
                        object: 1,
                        record,
                    };
                    if let Lookup::Claimed(claim) = arc.lookup(key, 1, AccessKind::Demand) {
                        let mut data = AlignedBuf::for_overwrite(record_bytes);
                        data.as_mut_slice().fill(record as u8);
                        claim.complete(Ok(Arc::new(Record {
                            data,
                            generation_token: 1,
                            fill_sequence: 0,
                        })));
                    }
                }
            });
        }
    });
}

#[test]
fn a_shrink_returns_record_memory_to_the_kernel() {
    for record_bytes in [64 << 10, 128 << 10] {
        let arc = LiveArc::new(ArcConfig {
            arc_max_bytes: ARC_MAX_BYTES,
            shards: 8,
            dram_policy: DramPolicy::Arc,
        });
        fill(&arc, record_bytes);
        let held = arc.stats().size;
        assert!(held >= ARC_MAX_BYTES * 3 / 4, "the ARC holds {held}");
        let before = rss_bytes();
        let evicted = arc.set_target_bytes(16 * MIB);
        assert!(arc.stats().size <= 16 * MIB);
        assert_eq!(evicted, held - arc.stats().size);
        let untrimmed = rss_bytes();
        release_freed_memory();
        let after = rss_bytes();
        eprintln!(
            "{} KiB records: RSS {} MiB with {} MiB in the ARC; shrunk to 16 MiB ({} MiB evicted): RSS {} MiB before malloc_trim, {} MiB after",
            record_bytes >> 10,
            before >> 20,
            held >> 20,
            evicted >> 20,
            untrimmed >> 20,
            after >> 20
        );
        // At least 3/4 of what was evicted is back with the kernel.
        assert!(
            before.saturating_sub(after) >= evicted * 3 / 4,
            "RSS {} MiB -> {} MiB after evicting {} MiB",
            before >> 20,
            after >> 20,
            evicted >> 20
        );
        drop(arc);
    }
}
