//! A change made to primary storage while the cache was down, with the
//! file's mtime set back afterwards (`touch -r`, `cp -p`, rsync, tar do
//! this): the persistent L2ARC must not serve the old records after the
//! restart. The generation includes ctime, which no user can set back.
//! Checked for a directory tree and for an image file.

mod l2arc_util;

use std::path::Path;
use std::sync::Arc;

use l2arc::Compression;
use l2arc::primary::Primary;
use l2arc::primary::dir::DirPrimary;
use l2arc::primary::image::ImagePrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig, DatasetId};
use l2arc_util::*;

/// Rewrites `path` in place with `bytes` (same size), then sets its access
/// and modification times back to what they were.
fn rewrite_keeping_mtime(path: &Path, bytes: &[u8]) {
    let before = std::fs::metadata(path).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    write_at(path, 0, bytes);
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_times(
            std::fs::FileTimes::new()
                .set_accessed(before.accessed().unwrap())
                .set_modified(before.modified().unwrap()),
        )
        .unwrap();
    let after = std::fs::metadata(path).unwrap();
    assert_eq!(after.modified().unwrap(), before.modified().unwrap());
    assert_eq!(after.len(), before.len());
}

fn cache_over(primary: Arc<dyn Primary>) -> (Arc<Cache>, DatasetId) {
    let cache = Cache::new(
        CacheConfig::default()
            .arc_max_bytes(1 << 20)
            .arc_shards(2)
            .l2arc(quiet_l2()),
    )
    .unwrap();
    let ds = cache
        .add_dataset(
            "data",
            primary,
            DatasetConfig::default()
                .recordsize_bytes(RS as u32)
                .compression(Compression::Lz4),
        )
        .unwrap();
    (cache, ds)
}

/// Fills a device from `name` of `primary`, stops, changes the file behind
/// the cache keeping its mtime, restarts over the same device and reads:
/// every byte must be the new one, and no L2 hit may be served.
fn check_restart(world: &World, primary: impl Fn() -> Arc<dyn Primary>, file: &Path, name: &str) {
    let old = std::fs::read(file).unwrap();
    let device = world.device_path("cache.dev");
    let (cache, ds) = cache_over(primary());
    add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
    let handle = cache.open(ds, name, false).unwrap();
    fill(&cache, &handle, &old);
    let on_flash = l2(&cache).get("l2_bufs") as usize;
    assert!(
        on_flash >= records(&old) * 9 / 10,
        "{on_flash} records on flash"
    );
    drop(handle);
    shutdown(cache);

    let new = content(old.len(), 99);
    rewrite_keeping_mtime(file, &new);

    let (cache, ds) = cache_over(primary());
    add_path(&cache, &device, None).unwrap();
    wait_rebuild(&cache);
    let rebuilt = l2(&cache).get("l2_rebuild_bufs");
    assert!(
        rebuilt as usize >= on_flash * 9 / 10,
        "rebuilt only {rebuilt}"
    );
    let handle = cache.open(ds, name, false).unwrap();
    check_all(&cache, &handle, &new, "after the change behind the cache");
    assert_eq!(
        l2(&cache).get("l2_hits"),
        0,
        "records of the old version were served from flash"
    );
    // The new version is cached in turn and served from flash after all.
    fill(&cache, &handle, &new);
    check_all(&cache, &handle, &new, "new version, cached");
    shutdown(cache);
}

#[test]
fn directory_tree_change_with_mtime_restored_is_a_miss_after_restart() {
    let mut world = World::new();
    world.add_file("f", 2 << 20, 1);
    let src = world.src.clone();
    let primary = || Arc::new(DirPrimary::new(&src).unwrap()) as Arc<dyn Primary>;
    check_restart(&world, primary, &world.src.join("f"), "f");
}

#[test]
fn image_change_with_mtime_restored_is_a_miss_after_restart() {
    let mut world = World::new();
    world.add_file("disk.img", 2 << 20, 2);
    let image = world.src.join("disk.img");
    let primary = || Arc::new(ImagePrimary::open(&image, false).unwrap()) as Arc<dyn Primary>;
    check_restart(&world, primary, &image, "");
}
