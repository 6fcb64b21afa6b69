//! The L2ARC end to end on real files: fill, hit, restart, rebuild.

use std::sync::Arc;

mod l2arc_util;
use l2arc_util::content;

use l2arc::Compression;
use l2arc::primary::dir::DirPrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig};

fn setup(dir: &std::path::Path, compression: Compression) -> (Arc<Cache>, l2arc::DatasetId) {
    let cache = Cache::new(CacheConfig::default().arc_max_bytes(1 << 20).arc_shards(2)).unwrap();
    let ds = cache
        .add_dataset(
            "data",
            Arc::new(DirPrimary::new(dir.join("src")).unwrap()),
            DatasetConfig::default()
                .recordsize_bytes(64 << 10)
                .compression(compression),
        )
        .unwrap();
    (cache, ds)
}

#[test]
fn records_go_to_flash_come_back_and_survive_a_restart() {
    for compression in [Compression::Off, Compression::Lz4, Compression::Zstd] {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("src")).unwrap();
        let data = content(16 << 20, 7);
        std::fs::write(tmp.path().join("src/f"), &data).unwrap();
        let device_path = tmp.path().join("cache.dev");
        {
            let (cache, ds) = setup(tmp.path(), compression);
            cache.add_cache_path(&device_path, Some(64 << 20)).unwrap();
            let f = cache.open(ds, "f", false).unwrap();
            let mut buf = vec![0u8; 64 << 10];
            for (i, chunk) in data.chunks(64 << 10).enumerate() {
                let n = cache.read(&f, (i * (64 << 10)) as u64, &mut buf).unwrap();
                assert_eq!(&buf[..n], chunk);
                if i % 4 == 3 {
                    cache.feed_l2arc();
                }
            }
            let primary_before = cache.stats().primary_reads;
            for (i, chunk) in data.chunks(64 << 10).enumerate() {
                let n = cache.read(&f, (i * (64 << 10)) as u64, &mut buf).unwrap();
                assert_eq!(&buf[..n], chunk, "record {i} ({compression})");
            }
            let stats = cache.stats();
            let l2 = stats.l2.clone().unwrap();
            eprintln!(
                "{compression}: l2_hits {} l2_misses {} primary reads in 2nd pass {} l2_size {} l2_asize {} hdr {}",
                l2.get("l2_hits"),
                l2.get("l2_misses"),
                stats.primary_reads - primary_before,
                l2.get("l2_size"),
                l2.get("l2_asize"),
                l2.get("l2_hdr_size")
            );
            assert!(l2.get("l2_hits") > 200, "{l2:?}");
            assert_eq!(l2.get("l2_cksum_bad"), 0);
            if compression != Compression::Off {
                assert!(l2.get("l2_asize") < l2.get("l2_size") * 9 / 10, "{l2:?}");
            }
        }
        // Restart: the index comes back from the device's log.
        let (cache, ds) = setup(tmp.path(), compression);
        cache.add_cache_path(&device_path, None).unwrap();
        assert!(
            cache
                .l2arc()
                .unwrap()
                .wait_for_rebuild(std::time::Duration::from_secs(10))
        );
        let l2 = cache.stats().l2.unwrap();
        eprintln!(
            "rebuilt {} records from {} log blocks",
            l2.get("l2_rebuild_bufs"),
            l2.get("l2_rebuild_log_blks")
        );
        assert!(l2.get("l2_rebuild_bufs") > 200, "{l2:?}");
        let f = cache.open(ds, "f", false).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        for (i, chunk) in data.chunks(64 << 10).enumerate() {
            let n = cache.read(&f, (i * (64 << 10)) as u64, &mut buf).unwrap();
            assert_eq!(&buf[..n], chunk);
        }
        let l2 = cache.stats().l2.unwrap();
        assert!(l2.get("l2_hits") > 200, "after restart: {l2:?}");
    }
}
