//! The index keeps a fingerprint of each key (its shard bits and low 32
//! bits), not the key: two keys equal in every kept bit share one entry.
//! Forced collisions through the whole read path: a read of one key that
//! finds the other's entry is a miss (the record checksum covers the key),
//! never the other's bytes; an insert of one replaces the other; and an
//! invalidation of either removes whatever entry a read of the other would
//! find, so no stale entry of a key outlives a write to it.

mod l2arc_util;

use std::sync::Arc;

use l2arc::FileDevice;
use l2arc::internals::format::Compression;
use l2arc::internals::{FeedRecord, L2Arc};
use l2arc_util::*;

const RECORD_BYTES: usize = 8192;

/// A key and a partner equal to it in every bit the index keeps: they
/// differ in bits 32..52 only (dropped for up to 4096 shards), a single
/// burst the record's CRC-32C always detects.
fn colliding_pair(l2: &L2Arc, n: u64) -> (u64, u64) {
    let k = l2arc::hash::mix64(n).max(1);
    let partner = k ^ (0x000F_0F0F_0000_0000 | (1 << 40));
    assert_ne!(k, partner);
    assert_eq!(l2.index_fingerprint(k), l2.index_fingerprint(partner));
    (k, partner)
}

fn write(l2: &L2Arc, key_hash: u64, data: &[u8]) {
    let record = FeedRecord {
        key_hash,
        data,
        compression: Compression::Off,
        sector_table_min_bytes: l2arc::internals::format::SECTOR_TABLE_RECORD_BYTES_MIN as u32,
    };
    let (_, written) = l2.write_batch(&[record]).unwrap();
    assert_eq!(written, 1);
}

fn read(l2: &L2Arc, key_hash: u64) -> Option<Vec<u8>> {
    l2.read(key_hash, RECORD_BYTES as u32)
        .map(|buf| buf.as_slice().to_vec())
}

#[test]
fn colliding_keys_are_misses_never_each_others_bytes() {
    let world = World::new();
    let path = world.device_path("fingerprint.dev");
    let l2 = Arc::new(L2Arc::new(quiet_l2(), 1000));
    let device = FileDevice::open(&path, Some(DEVICE_BYTES)).unwrap();
    l2.add_device(Box::new(device)).unwrap();
    let (a, b) = (content(RECORD_BYTES, 1), content(RECORD_BYTES, 2));

    // A read of K' finds K's entry: a miss, never K's bytes; the entry is
    // dropped as any entry that fails its checksum.
    let (k, partner) = colliding_pair(&l2, 1);
    write(&l2, k, &a);
    assert!(read(&l2, k) == Some(a.clone()));
    assert!(l2.contains(partner), "the partner finds K's entry");
    assert!(read(&l2, partner).is_none());
    let stats = l2.stats();
    assert_eq!(
        stats.get("l2_cksum_bad"),
        1,
        "the collision fails the checksum"
    );
    assert!(
        read(&l2, k).is_none(),
        "K's entry went with the failed read"
    );
    assert_eq!(l2.len(), 0);

    // An insert of K' replaces K's entry: K' is a hit, K a miss (whose
    // failed read then drops K''s entry).
    write(&l2, k, &a);
    write(&l2, partner, &b);
    assert_eq!(l2.len(), 1);
    assert!(read(&l2, partner) == Some(b.clone()));
    assert_eq!(l2.len(), 1);
    assert!(read(&l2, k).is_none());
    assert_eq!(l2.len(), 0, "K's failed read dropped K''s entry");

    // Invalidating K removes the entry K' put there, which a read of K
    // would find: no stale entry is left for either.
    let (k, partner) = colliding_pair(&l2, 2);
    write(&l2, partner, &b);
    l2.invalidate(k);
    assert_eq!(l2.len(), 0);
    assert!(read(&l2, partner).is_none());
    assert!(read(&l2, k).is_none());

    // Invalidating K' removes K's entry: K's old bytes are never served
    // after a write to K either way, and K's new bytes are.
    let (k, partner) = colliding_pair(&l2, 3);
    write(&l2, k, &a);
    l2.invalidate(partner);
    assert!(read(&l2, k).is_none());
    write(&l2, k, &b);
    assert!(read(&l2, k) == Some(b.clone()));
    l2.invalidate(k);
    assert!(read(&l2, k).is_none());
    assert_eq!(l2.len(), 0);

    // Many pairs, both written, in either order: every read is the last
    // writer's bytes or a miss, never the other key's.
    for n in 10..200u64 {
        let (k, partner) = colliding_pair(&l2, n);
        let (first, second) = if n % 2 == 0 {
            (k, partner)
        } else {
            (partner, k)
        };
        let (first_data, second_data) = (content(RECORD_BYTES, n), content(RECORD_BYTES, !n));
        write(&l2, first, &first_data);
        write(&l2, second, &second_data);
        assert!(read(&l2, first).is_none(), "pair {n}");
        // The failed read of `first` dropped `second`'s entry.
        assert!(read(&l2, second).is_none(), "pair {n}");
        write(&l2, second, &second_data);
        assert!(read(&l2, second) == Some(second_data.clone()), "pair {n}");
    }
    l2.stop();
}
