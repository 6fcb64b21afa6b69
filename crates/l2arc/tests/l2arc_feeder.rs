//! The feeder keeps pace with eviction: with its timer out of the way
//! (an hour), a reader that turns the ARC over still gets its records onto
//! flash, because the ARC's intake wakes the feeder (`l2arc_feed_again`);
//! with that off, nothing is fed until the timer.

mod l2arc_util;

use std::time::{Duration, Instant};

use l2arc::l2arc::L2ArcConfig;
use l2arc::l2arc::format::Compression;
use l2arc_util::*;

fn timer_off(feed_again: bool) -> L2ArcConfig {
    L2ArcConfig {
        l2arc_feed_secs: 3600.0,
        l2arc_feed_min_ms: 3_600_000,
        l2arc_feed_again: feed_again,
        ..L2ArcConfig::default()
    }
}

/// Reads a 6 MiB file (6x the 1 MiB ARC) twice, then gives the feeder up
/// to 5 s; returns (l2_feed_wakeups, l2_size, l2_hits of a third pass).
fn turn_over(feed_again: bool) -> (u64, u64, u64) {
    let mut world = World::new();
    let data = world.add_file("f", 6 << 20, 7);
    let (cache, ds) = new_cache(&world.src, Compression::Off, timer_off(feed_again));
    add_path(&cache, &world.device_path("cache.dev"), Some(DEVICE_BYTES)).unwrap();
    let f = cache.open(ds, "f", false).unwrap();
    for _ in 0..2 {
        check_all(&cache, &f, &data, "turn over");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while feed_again
        && l2(&cache).get("l2_size") < (data.len() as u64) / 2
        && Instant::now() < deadline
    {
        check_all(&cache, &f, &data, "turn over, waiting for the feeder");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = l2(&cache).get("l2_hits");
    check_all(&cache, &f, &data, "third pass");
    let stats = l2(&cache);
    let result = (
        stats.get("l2_feed_wakeups"),
        stats.get("l2_size"),
        stats.get("l2_hits") - before,
    );
    drop(f);
    shutdown(cache);
    result
}

#[test]
fn eviction_pressure_wakes_the_feeder() {
    let (wakeups, size, hits) = turn_over(true);
    assert!(wakeups > 0, "the ARC's intake never woke the feeder");
    assert!(size >= 3 << 20, "only {size} bytes reached flash");
    assert!(hits > 0, "the third pass found nothing on flash");
}

#[test]
fn without_feed_again_the_timer_alone_feeds() {
    let (wakeups, size, _) = turn_over(false);
    assert_eq!(wakeups, 0);
    assert_eq!(size, 0, "fed without the timer or the intake");
}
