//! Damaged, foreign, shrunk and newer-format cache devices: what `add_cache_*`
//! does with them, what a rebuild restores from a damaged log, and that the
//! cache serves primary's bytes afterwards in every case.

mod l2arc_util;

use std::collections::HashSet;
use std::path::Path;

use l2arc::internals::format::{BLOCK_BYTES, Compression, DeviceHeader, HEADER_COPY_OFFSETS};
use l2arc::{DeviceOpen, L2ArcConfig, L2Stats};
use l2arc_util::*;

/// A device filled with one object's records, the cache shut down.
struct Prepared {
    world: World,
    data: Vec<u8>,
    device: std::path::PathBuf,
    /// The log, newest block first, as the filled device holds it.
    chain: Vec<LogBlock>,
}

fn prepared(seed: u64) -> Prepared {
    let mut world = World::new();
    let data = world.add_file("f", 4 << 20, seed);
    let device = world.device_path("cache.dev");
    let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
    let (_, open) = add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
    assert_eq!(open, DeviceOpen::Initialised);
    let f = cache.open(ds, "f", false).unwrap();
    fill(&cache, &f, &data);
    assert!(l2(&cache).get("l2_bufs") as usize >= records(&data) * 9 / 10);
    drop(f);
    shutdown(cache);
    let chain = log_chain(&device);
    assert!(chain.len() >= 8, "only {} log blocks", chain.len());
    assert_eq!(chain.last().unwrap().header.sequence, 1);
    Prepared {
        world,
        data,
        device,
        chain,
    }
}

fn distinct_keys(blocks: &[LogBlock]) -> usize {
    blocks
        .iter()
        .flat_map(|b| b.entries.iter().map(|e| e.key_hash))
        .collect::<HashSet<u64>>()
        .len()
}

/// Opens the device in a new cache, waits for its rebuild, reads the object
/// twice (every byte checked), and checks primary. Returns the cache's L2
/// statistics right after the rebuild, and after the reads. Then refills
/// the device and checks it serves hits.
fn reopen(p: &Prepared, config: L2ArcConfig, expect: DeviceOpen) -> (L2Stats, L2Stats) {
    let (cache, ds) = new_cache(&p.world.src, Compression::Lz4, config);
    let (_, open) = add_path(&cache, &p.device, None).unwrap();
    assert_eq!(open, expect);
    wait_rebuild(&cache);
    let rebuilt = l2(&cache);
    let f = cache.open(ds, "f", false).unwrap();
    check_all(&cache, &f, &p.data, "reopened");
    check_all(&cache, &f, &p.data, "reopened, again");
    let read = l2(&cache);
    // The device works on: new records go to it and come back.
    fill(&cache, &f, &p.data);
    let hits = read.get("l2_hits");
    check_all(&cache, &f, &p.data, "refilled");
    let refilled = l2(&cache);
    assert!(refilled.get("l2_bufs") > 0, "{refilled:?}");
    assert!(refilled.get("l2_hits") > hits, "{refilled:?}");
    assert_eq!(refilled.get("l2_cksum_bad"), 0);
    drop(f);
    shutdown(cache);
    p.world.assert_primary_intact();
    (rebuilt, read)
}

/// Flips one byte inside the checksummed part of a header copy.
fn corrupt_header_copy(device: &Path, copy: usize) {
    let offset = HEADER_COPY_OFFSETS[copy] + 40;
    let mut byte = read_at(device, offset, 1);
    byte[0] ^= 0x5a;
    write_at(device, offset, &byte);
}

#[test]
fn baseline_rebuild_restores_the_whole_log() {
    let p = prepared(1000);
    let all = distinct_keys(&p.chain);
    let (rebuilt, read) = reopen(&p, quiet_l2(), DeviceOpen::Rebuilding);
    assert_eq!(rebuilt.get("l2_rebuild_bufs") as usize, all);
    assert_eq!(rebuilt.get("l2_rebuild_log_blks") as usize, p.chain.len());
    assert_eq!(rebuilt.get("l2_rebuild_cksum_lb_errors"), 0);
    assert!(read.get("l2_hits") as usize >= all - 16, "{read:?}");
}

#[test]
fn both_header_copies_zeroed_is_a_blank_device() {
    let p = prepared(1100);
    write_at(&p.device, 0, &[0u8; 2 * BLOCK_BYTES as usize]);
    let (rebuilt, read) = reopen(&p, quiet_l2(), DeviceOpen::Initialised);
    assert_eq!(rebuilt.get("l2_rebuild_bufs"), 0);
    assert_eq!(rebuilt.get("l2_bufs"), 0);
    assert_eq!(rebuilt.get("l2_rebuild_dh_errors"), 0, "blank is no error");
    assert_eq!(read.get("l2_hits"), 0);
    // Re-initialised with a new identity: the old log blocks in the data
    // area belong to another device and are never read back as ours.
    let (header, _) = header(&p.device);
    assert!(header.sequence >= 1);
    let (cache, ds) = new_cache(&p.world.src, Compression::Lz4, quiet_l2());
    assert_eq!(
        add_path(&cache, &p.device, None).unwrap().1,
        DeviceOpen::Rebuilding
    );
    wait_rebuild(&cache);
    let again = l2(&cache);
    assert_eq!(again.get("l2_rebuild_cksum_lb_errors"), 0, "{again:?}");
    let f = cache.open(ds, "f", false).unwrap();
    check_all(&cache, &f, &p.data, "after the second restart");
    drop(f);
    shutdown(cache);
}

#[test]
fn newest_header_copy_corrupted_rebuilds_from_the_other() {
    let p = prepared(1200);
    let (newest, copy) = header(&p.device);
    let (a, b) = header_blocks(&p.device);
    let other = DeviceHeader::decode(if copy == 0 { &b } else { &a }).unwrap();
    assert_eq!(other.sequence + 1, newest.sequence);
    corrupt_header_copy(&p.device, copy);
    // The older copy points at the log block before the newest one.
    assert_eq!(other.newest_log, Some(p.chain[1].pointer));
    let (rebuilt, read) = reopen(&p, quiet_l2(), DeviceOpen::Rebuilding);
    assert_eq!(
        rebuilt.get("l2_rebuild_log_blks") as usize,
        p.chain.len() - 1,
        "{rebuilt:?}"
    );
    assert_eq!(
        rebuilt.get("l2_rebuild_bufs") as usize,
        distinct_keys(&p.chain[1..])
    );
    assert_eq!(rebuilt.get("l2_rebuild_cksum_lb_errors"), 0);
    assert_eq!(rebuilt.get("l2_rebuild_dh_errors"), 0);
    assert!(read.get("l2_hits") > 0);
}

#[test]
fn older_header_copy_corrupted_changes_nothing() {
    let p = prepared(1300);
    let (_, copy) = header(&p.device);
    corrupt_header_copy(&p.device, 1 - copy);
    let (rebuilt, read) = reopen(&p, quiet_l2(), DeviceOpen::Rebuilding);
    assert_eq!(rebuilt.get("l2_rebuild_log_blks") as usize, p.chain.len());
    assert_eq!(
        rebuilt.get("l2_rebuild_bufs") as usize,
        distinct_keys(&p.chain)
    );
    assert!(read.get("l2_hits") > 0);
}

#[test]
fn both_header_copies_corrupted_reinitialise_empty() {
    let p = prepared(1400);
    corrupt_header_copy(&p.device, 0);
    corrupt_header_copy(&p.device, 1);
    let (a, b) = header_blocks(&p.device);
    assert!(a.starts_with(b"L2ARCHDR") && b.starts_with(b"L2ARCHDR"));
    let (rebuilt, read) = reopen(&p, quiet_l2(), DeviceOpen::Initialised);
    assert_eq!(rebuilt.get("l2_rebuild_dh_errors"), 1, "{rebuilt:?}");
    assert_eq!(rebuilt.get("l2_rebuild_bufs"), 0);
    assert_eq!(rebuilt.get("l2_bufs"), 0);
    assert_eq!(read.get("l2_hits"), 0);
}

#[test]
fn device_shrunk_below_its_recorded_size_reinitialises() {
    let p = prepared(1500);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&p.device)
        .unwrap();
    file.set_len(DEVICE_BYTES - (8 << 20)).unwrap();
    drop(file);
    let (rebuilt, read) = reopen(&p, quiet_l2(), DeviceOpen::Initialised);
    assert_eq!(rebuilt.get("l2_rebuild_dh_errors"), 1, "{rebuilt:?}");
    assert_eq!(rebuilt.get("l2_rebuild_bufs"), 0);
    assert_eq!(read.get("l2_hits"), 0);
    let (header, _) = header(&p.device);
    assert_eq!(header.device_size_bytes, DEVICE_BYTES - (8 << 20));
}

#[test]
fn device_shrunk_below_the_minimum_is_refused_by_name() {
    let p = prepared(1600);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&p.device)
        .unwrap();
    file.set_len(3 << 20).unwrap();
    drop(file);
    let before = file_bytes(&p.device);
    let (cache, ds) = new_cache(&p.world.src, Compression::Lz4, quiet_l2());
    let err = add_path(&cache, &p.device, None).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&p.device.display().to_string()),
        "error does not name the device: {message}"
    );
    assert!(message.contains("too small"), "{message}");
    assert_eq!(
        file_bytes(&p.device),
        before,
        "a refused device was written"
    );
    // The cache goes on without an L2ARC.
    let f = cache.open(ds, "f", false).unwrap();
    check_all(&cache, &f, &p.data, "without the refused device");
    drop(f);
    shutdown(cache);
    p.world.assert_primary_intact();
}

/// A file full of someone else's data: refused, untouched; with
/// `force_init_foreign` it is taken and works.
#[test]
fn foreign_device_is_refused_unless_forced() {
    let mut world = World::new();
    let data = world.add_file("f", 2 << 20, 1700);
    let device = world.device_path("foreign.img");
    let foreign = content(16 << 20, 1701);
    std::fs::write(&device, &foreign).unwrap();

    let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
    let err = add_path(&cache, &device, None).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("not an l2arc cache"), "{message}");
    assert!(message.contains("refusing to overwrite"), "{message}");
    assert!(message.contains(&device.display().to_string()), "{message}");
    assert!(
        file_bytes(&device) == foreign,
        "a foreign device was written"
    );
    let f = cache.open(ds, "f", false).unwrap();
    check_all(&cache, &f, &data, "foreign device refused");
    drop(f);
    shutdown(cache);

    let forced = quiet_l2().force_init_foreign(true);
    let (cache, ds) = new_cache(&world.src, Compression::Lz4, forced);
    let (_, open) = add_path(&cache, &device, None).unwrap();
    assert_eq!(open, DeviceOpen::Initialised);
    let f = cache.open(ds, "f", false).unwrap();
    fill(&cache, &f, &data);
    check_all(&cache, &f, &data, "forced foreign device");
    let stats = l2(&cache);
    assert!(stats.get("l2_hits") > 0, "{stats:?}");
    drop(f);
    shutdown(cache);
    let (a, _) = header_blocks(&device);
    assert!(a.starts_with(b"L2ARCHDR") || header(&device).0.sequence > 0);
    world.assert_primary_intact();
}

/// Rewrites the version field of a header copy, with a valid CRC.
fn set_header_version(device: &Path, copy: usize, version: u32) {
    let offset = HEADER_COPY_OFFSETS[copy];
    let mut block = read_at(device, offset, BLOCK_BYTES as usize);
    block[8..12].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c(&block[..124]);
    block[124..128].copy_from_slice(&crc.to_le_bytes());
    write_at(device, offset, &block);
}

/// A header of a newer format version (valid checksum): refused with an
/// error that says so, and the device is not written.
#[test]
fn newer_format_version_is_refused_and_untouched() {
    let p = prepared(1800);
    // The newest copy only (as a newer writer would leave it), then both.
    let (_, copy) = header(&p.device);
    for copies in [vec![copy], vec![0, 1]] {
        for &c in &copies {
            set_header_version(&p.device, c, 3);
        }
        let before = file_bytes(&p.device);
        let (cache, ds) = new_cache(&p.world.src, Compression::Lz4, quiet_l2());
        let err = add_path(&cache, &p.device, None).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("version 3"), "{copies:?}: {message}");
        assert!(
            message.contains(&p.device.display().to_string()),
            "{message}"
        );
        assert!(
            file_bytes(&p.device) == before,
            "{copies:?}: a newer-format device was written"
        );
        let f = cache.open(ds, "f", false).unwrap();
        check_all(&cache, &f, &p.data, "newer format refused");
        drop(f);
        shutdown(cache);
    }
    p.world.assert_primary_intact();
}

/// Flips one byte in the entries of a log block.
fn corrupt_log_block(device: &Path, block: &LogBlock) {
    let offset = block.pointer.offset_bytes + 128 + 5;
    let mut byte = read_at(device, offset, 1);
    byte[0] ^= 0x01;
    write_at(device, offset, &byte);
}

#[test]
fn newest_log_block_corrupted_restores_nothing_and_stops_cleanly() {
    let p = prepared(1900);
    corrupt_log_block(&p.device, &p.chain[0]);
    let (rebuilt, read) = reopen(&p, quiet_l2(), DeviceOpen::Rebuilding);
    assert_eq!(rebuilt.get("l2_rebuild_cksum_lb_errors"), 1, "{rebuilt:?}");
    assert_eq!(rebuilt.get("l2_rebuild_log_blks"), 0);
    assert_eq!(rebuilt.get("l2_rebuild_bufs"), 0);
    assert_eq!(rebuilt.get("l2_rebuild_success"), 1);
    assert_eq!(read.get("l2_hits"), 0);
    // The unreadable chain is cut: batches written after it start a fresh
    // chain, which a later rebuild restores without meeting the bad block.
    let (cache, ds) = new_cache(&p.world.src, Compression::Lz4, quiet_l2());
    add_path(&cache, &p.device, None).unwrap();
    wait_rebuild(&cache);
    let again = l2(&cache);
    assert!(again.get("l2_rebuild_bufs") > 0, "{again:?}");
    assert_eq!(again.get("l2_rebuild_cksum_lb_errors"), 0, "{again:?}");
    let f = cache.open(ds, "f", false).unwrap();
    check_all(&cache, &f, &p.data, "second restart");
    assert!(l2(&cache).get("l2_hits") > 0);
    drop(f);
    shutdown(cache);
}

#[test]
fn middle_log_block_corrupted_restores_the_newer_ones() {
    let p = prepared(2000);
    let bad = 3;
    corrupt_log_block(&p.device, &p.chain[bad]);
    let (rebuilt, read) = reopen(&p, quiet_l2(), DeviceOpen::Rebuilding);
    assert_eq!(rebuilt.get("l2_rebuild_cksum_lb_errors"), 1, "{rebuilt:?}");
    assert_eq!(rebuilt.get("l2_rebuild_log_blks") as usize, bad);
    assert_eq!(
        rebuilt.get("l2_rebuild_bufs") as usize,
        distinct_keys(&p.chain[..bad])
    );
    assert!(read.get("l2_hits") as usize >= distinct_keys(&p.chain[..bad]) / 2);
}

/// A device of `size_bytes` that holds only what was written to it (reads
/// of the rest are zeros): a 17 TiB device in a few MiB of memory.
struct SparseDevice {
    size_bytes: u64,
    blocks: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u64, Vec<u8>>>>,
}

impl l2arc::DeviceIo for SparseDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let blocks = self.blocks.lock().unwrap();
        for (i, chunk) in buf.chunks_mut(BLOCK_BYTES as usize).enumerate() {
            let block = offset / BLOCK_BYTES + i as u64;
            match blocks.get(&block) {
                Some(bytes) => chunk.copy_from_slice(&bytes[..chunk.len()]),
                None => chunk.fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        assert!(offset.is_multiple_of(BLOCK_BYTES));
        assert!(
            offset + buf.len() as u64 <= self.size_bytes,
            "a write past the device's end"
        );
        let mut blocks = self.blocks.lock().unwrap();
        for (i, chunk) in buf.chunks(BLOCK_BYTES as usize).enumerate() {
            blocks.insert(offset / BLOCK_BYTES + i as u64, chunk.to_vec());
        }
        Ok(())
    }

    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn describe(&self) -> String {
        format!("sparse device of {} bytes", self.size_bytes)
    }
}

/// Block numbers are 32 bits: a device of 16 TiB or more is used up to
/// its last addressable block, and comes back after a restart (before, at
/// exactly 16 TiB the data area's end wrapped to block 0 and adding it
/// panicked; above, the area wrapped to a small one and the header failed
/// to decode at every restart, so the device was wiped).
#[test]
fn devices_of_16_tib_and_more_are_used_to_their_last_addressable_block() {
    for size_bytes in [1u64 << 44, (17 << 40) + 12_345] {
        let mut world = World::new();
        let data = world.add_file("f", 1 << 20, size_bytes);
        let blocks = std::sync::Arc::default();
        let device = || SparseDevice {
            size_bytes,
            blocks: std::sync::Arc::clone(&blocks),
        };
        let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
        let (_, open) = cache.add_cache_device(Box::new(device())).unwrap();
        assert_eq!(open, DeviceOpen::Initialised, "{size_bytes}");
        let f = cache.open(ds, "f", false).unwrap();
        fill(&cache, &f, &data);
        let stats = l2(&cache);
        assert!(
            stats.get("l2_bufs") > 0,
            "{size_bytes}: nothing reached the device"
        );
        drop(f);
        shutdown(cache);
        let (cache, ds) = new_cache(&world.src, Compression::Lz4, quiet_l2());
        let (_, open) = cache.add_cache_device(Box::new(device())).unwrap();
        assert_eq!(
            open,
            DeviceOpen::Rebuilding,
            "{size_bytes}: the header did not decode"
        );
        let f = cache.open(ds, "f", false).unwrap();
        let mut buf = vec![0u8; data.len()];
        assert_eq!(cache.read(&f, 0, &mut buf).unwrap(), data.len());
        assert!(buf == data, "{size_bytes}: wrong bytes after the restart");
        drop(f);
        shutdown(cache);
    }
}
