//! What every front end does with its cache at a clean stop, once it has
//! drained (`serve-nbd`) or unmounted (`mount`), before it prints its
//! statistics and exits.
//!
//! Why one place. A stop is a sequence whose order matters, and three
//! front ends (the NBD export, the directory mount, the S3 mount) must run
//! the same one: each step needs the readers gone (nothing may read or
//! evict while the ARC is written out), and the process must not exit
//! before the last step is durable. Steps, in order:
//!
//! 1. The stop flush (`Cache::flush_arc_to_l2`): what only the ARC holds
//!    goes to the cache devices, within `l2arc_stop_budget_secs`, so that
//!    a restart finds it on flash instead of primary storage. One stop
//!    line says what was written and what was left, and why.
//!
//! Then the caller drops the cache, which stops the tiers: the L2ARC's log
//! is consistent at every batch, so nothing else needs closing.
//!
//! The budget is the unit's too: systemd waits `TimeoutStopSec` for the
//! whole stop (the drain's `--stop-timeout`, then this), and the packaged
//! units leave room for both (docs/operations.md, "Stopping").

use std::time::Duration;

use l2arc::{Cache, StopFlush, StopFlushCut};

/// The stop sequence of a front end whose readers are gone (see the
/// module comment).
pub(crate) fn stop_cache(cache: &Cache) {
    flush_at_stop(cache, cache.l2arc_stop_budget());
}

/// Step 1: the stop flush within `budget`, and its stop line. `None`
/// (and no line) when the cache has no cache device.
pub(crate) fn flush_at_stop(cache: &Cache, budget: Duration) -> Option<StopFlush> {
    cache.stats().l2.as_ref()?;
    let flushed = cache.flush_arc_to_l2(budget);
    eprintln!("l2arc: stopping: {}", describe(&flushed));
    Some(flushed)
}

/// The stop line after `l2arc: stopping: `.
fn describe(f: &StopFlush) -> String {
    let mib = |bytes: u64| bytes as f64 / f64::from(1u32 << 20);
    let why = match f.cut {
        None => "",
        Some(StopFlushCut::Budget) if f.budget.is_zero() => {
            ", no flush: l2arc_stop_budget_secs is 0"
        }
        Some(StopFlushCut::Budget) => ", cut by the stop budget l2arc_stop_budget_secs",
        Some(StopFlushCut::Dwpd) => ", cut by the endurance budget l2arc_dwpd",
        Some(StopFlushCut::NoDevice) => ", no cache device took writes",
        Some(_) => ", cut short",
    };
    format!(
        "wrote {} ARC records ({:.1} MiB) to flash in {} ms; {} records ({:.1} MiB) left (budget {} s{why})",
        f.records_written,
        mib(f.bytes_written),
        f.elapsed.as_millis(),
        f.records_left,
        mib(f.bytes_left),
        f.budget.as_secs_f64(),
    )
}
