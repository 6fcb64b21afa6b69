//! `Cache::discard` (TRIM) below the NBD server: the hole reads as zeros
//! through every tier, including records the L2ARC copied before it.

use std::sync::Arc;

use l2arc::primary::Primary;
use l2arc::primary::image::ImagePrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig};

const IMAGE_BYTES: usize = 8 << 20;
const RECORD_BYTES: usize = 64 << 10;

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] | 1)
        .collect()
}

fn stat(cache: &Cache, name: &str) -> u64 {
    cache
        .stats()
        .kstats()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| v)
}

#[test]
fn image_punch_hole_keeps_size_and_reads_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img");
    std::fs::write(&path, pattern(IMAGE_BYTES)).unwrap();
    let image = ImagePrimary::open(&path, true).unwrap();
    let object = image.open("", true).unwrap();
    object.punch_hole(4096 + 100, 10_000).unwrap();
    let file = std::fs::read(&path).unwrap();
    assert_eq!(file.len(), IMAGE_BYTES);
    assert!(file[4196..14_196].iter().all(|&b| b == 0));
    assert_eq!(file[..4196], pattern(IMAGE_BYTES)[..4196]);
    assert_eq!(file[14_196..], pattern(IMAGE_BYTES)[14_196..]);
    // Read-only images refuse.
    let ro = ImagePrimary::open(&path, false).unwrap();
    let e = ro.open("", false).unwrap().punch_hole(0, 4096).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
}

#[test]
fn discard_drops_arc_and_l2arc_copies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img");
    let original = pattern(IMAGE_BYTES);
    std::fs::write(&path, &original).unwrap();
    let cache = Cache::new(CacheConfig::default().arc_max_bytes(1 << 20).arc_shards(1)).unwrap();
    cache
        .add_cache_path(dir.path().join("l2.bin"), Some(64 << 20))
        .unwrap();
    let ds = cache
        .add_dataset(
            "nbd",
            Arc::new(ImagePrimary::open(&path, true).unwrap()),
            DatasetConfig::default().recordsize_bytes(RECORD_BYTES as u32),
        )
        .unwrap();
    let handle = cache.open(ds, "", true).unwrap();
    let mut buf = vec![0u8; IMAGE_BYTES];
    // Warm the L2ARC: every record read, fed, evicted from the small ARC.
    for _ in 0..20 {
        for off in (0..IMAGE_BYTES).step_by(RECORD_BYTES) {
            cache
                .read(&handle, off as u64, &mut buf[off..off + RECORD_BYTES])
                .unwrap();
            cache.feed_l2arc();
        }
        if stat(&cache, "l2_hits") > 16 {
            break;
        }
    }
    assert_eq!(buf, original);
    assert!(
        stat(&cache, "l2_hits") > 16,
        "the L2ARC serves records: {:?}",
        cache.stats().kstats()
    );
    // Discard a range that spans whole and partial records.
    let (at, len) = (3 * RECORD_BYTES + 1000, 5 * RECORD_BYTES);
    cache.discard(&handle, at as u64, len as u64).unwrap();
    let mut expect = original.clone();
    expect[at..at + len].fill(0);
    for _ in 0..3 {
        for off in (0..IMAGE_BYTES).step_by(RECORD_BYTES) {
            cache
                .read(&handle, off as u64, &mut buf[off..off + RECORD_BYTES])
                .unwrap();
            cache.feed_l2arc();
        }
        assert!(
            buf == expect,
            "no tier serves the bytes from before the discard"
        );
    }
    assert_eq!(handle.size_bytes(), IMAGE_BYTES as u64);
    cache.discard(&handle, 0, 0).unwrap();
    assert!(cache.discard(&handle, u64::MAX, 2).is_err());
}
