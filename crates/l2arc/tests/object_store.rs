//! The object-store primary against a real S3 server (versitygw, started
//! per test; a missing versitygw fails the test): ranged GETs aligned to
//! records, freshness by ETag (TTL, conditional GETs, 412), deleted
//! objects, throttling and dropped connections through a fault proxy,
//! wrong credentials and a missing bucket, and the L2ARC kept across a
//! restart while ETags match.

mod l2arc_util;

use std::sync::Arc;
use std::time::Duration;

use l2arc::Compression;
use l2arc::primary::Primary;
use l2arc::primary::object_store::{ObjectStoreConfig, ObjectStorePrimary, S3Location};
use l2arc::{Cache, CacheConfig, DatasetConfig, DatasetId};
use l2arc_testkit::s3::{FaultProxy, S3Server};
use l2arc_util::*;

const BUCKET: &str = "data";

fn config(endpoint: &str, bucket: &str, ttl_ms: u64) -> ObjectStoreConfig {
    let mut c = ObjectStoreConfig::s3(&S3Location {
        bucket: bucket.to_string(),
        endpoint: Some(endpoint.to_string()),
        region: Some("us-east-1".to_string()),
        ..S3Location::default()
    });
    c.options.extend(
        [
            ("access_key_id", l2arc_testkit::s3::ACCESS_KEY),
            ("secret_access_key", l2arc_testkit::s3::SECRET_KEY),
            ("disable_config_load", "true"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    c.metadata_ttl_ms = ttl_ms;
    c.backoff_base_ms = 5;
    c.request_timeout_ms = 5_000;
    c
}

fn primary(endpoint: &str, ttl_ms: u64) -> Arc<ObjectStorePrimary> {
    let p = ObjectStorePrimary::new(config(endpoint, BUCKET, ttl_ms)).unwrap();
    p.check().unwrap();
    Arc::new(p)
}

/// No read-ahead: these tests count GETs record by record and say which
/// records were fetched when.
fn cache_over(primary: Arc<dyn Primary>) -> (Arc<Cache>, DatasetId) {
    let cache = Cache::new(
        CacheConfig::default()
            .arc_max_bytes(4 << 20)
            .arc_shards(2)
            .l2arc(quiet_l2())
            .zfs_prefetch_disable(true),
    )
    .unwrap();
    let ds = cache
        .add_dataset(
            "s3",
            primary,
            DatasetConfig::default()
                .recordsize_bytes(RS as u32)
                .compression(Compression::Lz4),
        )
        .unwrap();
    (cache, ds)
}

/// An object whose every byte says which version and record it is: a
/// record of version `v` is `v` in its first byte, then a pattern.
fn versioned(len: usize, version: u8) -> Vec<u8> {
    let mut data = content(len, u64::from(version));
    for (i, chunk) in data.chunks_mut(RS).enumerate() {
        chunk[0] = version;
        if chunk.len() > 1 {
            chunk[1] = i as u8;
        }
    }
    data
}

fn read_all(cache: &Cache, handle: &l2arc::ObjectHandle) -> Vec<u8> {
    let mut out = vec![0u8; handle.size_bytes() as usize];
    let n = cache.read(handle, 0, &mut out).unwrap();
    out.truncate(n);
    out
}

#[test]
fn objects_read_through_the_cache_one_aligned_get_per_record() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let sizes = [0usize, 1, RS - 1, RS, RS * 3 + RS / 2];
    let objects: Vec<(String, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| (format!("dir/obj{i}"), content(len, i as u64 + 7)))
        .collect();
    for (key, data) in &objects {
        server.put(BUCKET, key, data);
    }
    let store = primary(&server.endpoint(), 60_000);
    let (cache, ds) = cache_over(store.clone());
    let mut records_total = 0u64;
    for (key, data) in &objects {
        let handle = cache.open(ds, key, false).unwrap();
        assert_eq!(handle.size_bytes(), data.len() as u64);
        check_all(&cache, &handle, data, key);
        // Unaligned reads across record boundaries, from the ARC.
        let mut rng = Rng(data.len() as u64 + 1);
        for _ in 0..20 {
            if data.is_empty() {
                break;
            }
            let off = rng.below(data.len() as u64) as usize;
            let len = 1 + rng.below((data.len() - off) as u64) as usize;
            let mut buf = vec![0u8; len];
            assert_eq!(cache.read(&handle, off as u64, &mut buf).unwrap(), len);
            assert_eq!(buf, data[off..off + len], "{key} at {off}+{len}");
        }
        records_total += records(data) as u64;
    }
    let s = store.stats();
    assert_eq!(s.gets, records_total, "one GET per record: {s:?}");
    assert_eq!(
        s.get_bytes,
        objects.iter().map(|(_, d)| d.len() as u64).sum::<u64>()
    );
    // A second pass is all ARC hits: no more GETs.
    for (key, data) in &objects {
        let handle = cache.open(ds, key, false).unwrap();
        check_all(&cache, &handle, data, key);
    }
    assert_eq!(store.stats().gets, records_total);
    // Listing: one level at a time, objects with their sizes.
    let top = store.list_dir("").unwrap();
    assert_eq!(top.len(), 1);
    assert!(top[0].is_dir && top[0].name == "dir");
    let dir = store.list_dir("dir").unwrap();
    let names: Vec<&str> = dir.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["obj0", "obj1", "obj2", "obj3", "obj4"]);
    assert_eq!(dir[4].meta.as_ref().unwrap().size_bytes, sizes[4] as u64);
    // Read-only.
    assert_eq!(
        store.open("dir/obj1", true).err().unwrap().kind(),
        std::io::ErrorKind::ReadOnlyFilesystem
    );
}

#[test]
fn an_overwrite_is_served_after_the_ttl_and_never_mixed() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let len = RS * 6;
    let v1 = versioned(len, 1);
    server.put(BUCKET, "obj", &v1);
    let ttl_ms = 400;
    let store = primary(&server.endpoint(), ttl_ms);
    let (cache, ds) = cache_over(store.clone());
    let handle = cache.open(ds, "obj", false).unwrap();
    // Half of the records cached under version 1.
    for index in 0..3 {
        check_record(&cache, &handle, &v1, index, "v1");
    }
    let v2 = versioned(len, 2);
    server.put(BUCKET, "obj", &v2);
    // Within the TTL the cache may serve version 1, but a record it must
    // fetch is conditional on version 1's ETag: 412, re-stat, and from
    // then on only version 2. Every record is one version, never a mix.
    cache.revalidate(&handle).unwrap();
    let got = read_all(&cache, &handle);
    let mut versions = Vec::new();
    for (i, chunk) in got.chunks(RS).enumerate() {
        let v = chunk[0];
        let expected = if v == 1 { &v1 } else { &v2 };
        assert!(v == 1 || v == 2, "record {i}: version byte {v}");
        assert_eq!(
            chunk,
            &expected[i * RS..(i + 1) * RS],
            "record {i} is not whole version {v}"
        );
        versions.push(v);
    }
    assert_eq!(
        &versions[3..],
        &[2, 2, 2],
        "records fetched after the overwrite must be version 2"
    );
    assert!(
        store.stats().precondition_failed >= 1,
        "{:?}",
        store.stats()
    );
    assert!(cache.stats().primary_stale >= 1);
    // The 412 made the object's generation new: every older record is a
    // miss at once.
    assert_eq!(read_all(&cache, &handle), v2);
    // After the TTL, a revalidate sees version 3 without any read failing.
    let v3 = versioned(len, 3);
    server.put(BUCKET, "obj", &v3);
    std::thread::sleep(Duration::from_millis(ttl_ms + 100));
    cache.revalidate(&handle).unwrap();
    assert_eq!(read_all(&cache, &handle), v3);
    // A new open after the TTL sees a size change too.
    let v4 = versioned(RS * 2 + 5, 4);
    server.put(BUCKET, "obj", &v4);
    std::thread::sleep(Duration::from_millis(ttl_ms + 100));
    let handle = cache.open(ds, "obj", false).unwrap();
    assert_eq!(handle.size_bytes(), v4.len() as u64);
    assert_eq!(read_all(&cache, &handle), v4);
}

#[test]
fn a_deleted_object_reads_as_not_found_and_is_remembered_missing() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let data = content(RS * 4, 3);
    server.put(BUCKET, "gone", &data);
    let ttl_ms = 300;
    let store = primary(&server.endpoint(), ttl_ms);
    let (cache, ds) = cache_over(store.clone());
    let handle = cache.open(ds, "gone", false).unwrap();
    check_record(&cache, &handle, &data, 0, "before delete");
    server.delete(BUCKET, "gone");
    let mut buf = vec![0u8; RS];
    let e = cache.read(&handle, RS as u64, &mut buf).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    // Missing keys are cached negatively for the TTL.
    assert_eq!(
        store.stat("never").unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    let heads = store.stats().heads;
    assert_eq!(
        store.stat("never").unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    assert_eq!(store.stats().heads, heads, "a missing key asked twice");
    server.put(BUCKET, "never", b"now here");
    std::thread::sleep(Duration::from_millis(ttl_ms + 100));
    assert_eq!(store.stat("never").unwrap().size_bytes, 8);
    assert!(cache.open(ds, "gone", false).is_err());
}

#[test]
fn throttling_and_dropped_connections_are_retried_within_a_bound() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let data = content(RS * 8, 5);
    server.put(BUCKET, "obj", &data);
    let proxy = FaultProxy::start(server.addr());
    let store = primary(&proxy.endpoint(), 60_000);
    let (cache, ds) = cache_over(store.clone());
    let handle = cache.open(ds, "obj", false).unwrap();
    proxy.fail_next_with_503(3);
    check_record(&cache, &handle, &data, 0, "after 503s");
    assert_eq!(proxy.counts().injected_503, 3);
    proxy.drop_next(2);
    check_record(&cache, &handle, &data, 1, "after dropped connections");
    assert_eq!(proxy.counts().dropped, 2);
    assert!(store.stats().retries >= 5, "{:?}", store.stats());
    // Past the bound the read fails (EIO-like), in bounded time, and
    // returns no bytes.
    proxy.fail_next_with_503(1000);
    let started = std::time::Instant::now();
    let mut buf = vec![0u8; RS];
    let e = cache.read(&handle, 2 * RS as u64, &mut buf).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "{e}");
    assert!(
        e.to_string().contains("SlowDown") && e.to_string().contains("gave up"),
        "{e}"
    );
    proxy.fail_next_with_503(0);
    // And the next read works.
    check_record(&cache, &handle, &data, 2, "after the storm");
}

#[test]
fn a_missing_bucket_or_refused_credentials_fail_the_check() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let missing = ObjectStorePrimary::new(config(&server.endpoint(), "nosuchbucket", 1000))
        .unwrap()
        .check()
        .unwrap_err();
    assert!(missing.to_string().contains("no such bucket"), "{missing}");
    let mut bad = config(&server.endpoint(), BUCKET, 1000);
    for (k, v) in &mut bad.options {
        if k == "secret_access_key" {
            *v = "wrong-secret-000000".to_string();
        }
    }
    let refused = ObjectStorePrimary::new(bad).unwrap().check().unwrap_err();
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::PermissionDenied,
        "{refused}"
    );
    assert!(!refused.to_string().contains("wrong-secret"), "{refused}");
    assert!(!refused.to_string().contains('\n'), "{refused}");
}

#[test]
fn the_l2arc_stays_valid_across_a_restart_while_etags_match() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let same = content(RS * 16, 11);
    let changed_old = content(RS * 16, 12);
    server.put(BUCKET, "same", &same);
    server.put(BUCKET, "changed", &changed_old);
    let world = World::new();
    let device = world.device_path("cache.dev");
    {
        let store = primary(&server.endpoint(), 60_000);
        let (cache, ds) = cache_over(store.clone());
        add_path(&cache, &device, Some(DEVICE_BYTES)).unwrap();
        for (key, data) in [("same", &same), ("changed", &changed_old)] {
            let handle = cache.open(ds, key, false).unwrap();
            fill(&cache, &handle, data);
        }
        assert!(l2(&cache).get("l2_bufs") >= 30, "{:?}", l2(&cache));
        shutdown(cache);
    }
    // While the cache is down, one object changes.
    let changed_new = content(RS * 16, 13);
    server.put(BUCKET, "changed", &changed_new);

    let store = primary(&server.endpoint(), 60_000);
    let (cache, ds) = cache_over(store.clone());
    add_path(&cache, &device, None).unwrap();
    wait_rebuild(&cache);
    let handle = cache.open(ds, "same", false).unwrap();
    check_all(&cache, &handle, &same, "unchanged object after restart");
    assert_eq!(store.stats().gets, 0, "the unchanged object went to S3");
    assert_eq!(l2(&cache).get("l2_hits"), 16);
    let handle = cache.open(ds, "changed", false).unwrap();
    check_all(
        &cache,
        &handle,
        &changed_new,
        "changed object after restart",
    );
    assert_eq!(store.stats().gets, 16, "{:?}", store.stats());
    assert_eq!(l2(&cache).get("l2_hits"), 16, "old records served");
    shutdown(cache);
}

#[test]
fn records_of_one_object_are_fetched_concurrently_behind_a_slow_store() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let data = content(RS * 8, 21);
    server.put(BUCKET, "obj", &data);
    let proxy = FaultProxy::start(server.addr());
    let store = primary(&proxy.endpoint(), 60_000);
    let (cache, ds) = cache_over(store.clone());
    let handle = cache.open(ds, "obj", false).unwrap();
    let delay_ms = 300;
    proxy.set_delay_ms(delay_ms, delay_ms);
    // Eight readers of eight records at once (what the mount's read-ahead
    // pool does): the GETs overlap, so the whole takes about one delay,
    // not eight.
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for index in 0..8u64 {
            let (cache, handle) = (&cache, &handle);
            scope.spawn(move || cache.prefetch(handle, index * RS as u64, RS).unwrap());
        }
    });
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_millis(delay_ms * 4),
        "8 records took {elapsed:?} behind a {delay_ms} ms store"
    );
    assert_eq!(store.stats().gets, 8);
    proxy.set_delay_ms(0, 0);
    check_all(&cache, &handle, &data, "after concurrent fills");
    assert_eq!(store.stats().gets, 8, "the prefetched records were hits");
}

/// The proxy's link cap (the fleet benchmark's far bucket) holds: an
/// object comes through no faster than the cap allows, and whole.
#[test]
fn a_capped_proxy_link_carries_no_more_than_its_rate() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let data = content(RS * 8, 23);
    server.put(BUCKET, "obj", &data);
    let proxy = FaultProxy::start(server.addr());
    let mib_per_sec = 4.0;
    proxy.set_link_mib_per_sec(mib_per_sec);
    let store = primary(&proxy.endpoint(), 60_000);
    let (cache, ds) = cache_over(store.clone());
    let handle = cache.open(ds, "obj", false).unwrap();
    let before = proxy.counts().bytes_down;
    let started = std::time::Instant::now();
    check_all(&cache, &handle, &data, "through a capped link");
    let elapsed = started.elapsed();
    let carried = proxy.counts().bytes_down - before;
    assert!(carried >= data.len() as u64, "{carried} bytes carried");
    // A lower bound only (a loaded machine is slower, never faster); the
    // 10 ms of idle link the proxy credits come off it.
    let floor = carried as f64 / (mib_per_sec * (1u64 << 20) as f64) - 0.02;
    assert!(
        elapsed.as_secs_f64() >= floor,
        "{carried} bytes in {elapsed:?} through a {mib_per_sec} MiB/s link"
    );
    shutdown(cache);
}

/// Runs `read` on a thread of its own and waits for it at most `within`:
/// a read that outlives its deadline fails the test at the bound instead
/// of holding it for the old sequence's minutes.
fn read_within<T: Send + 'static>(
    within: Duration,
    read: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let started = std::time::Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(read());
    });
    let result = rx
        .recv_timeout(within)
        .unwrap_or_else(|_| panic!("no answer within {within:?}"));
    (result, started.elapsed())
}

#[test]
fn a_hung_store_fails_a_read_at_its_deadline_with_one_retry_sequence() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let data = content(RS * 4, 31);
    server.put(BUCKET, "obj", &data);
    let proxy = FaultProxy::start(server.addr());
    let mut c = config(&proxy.endpoint(), BUCKET, 60_000);
    // A request timeout far beyond the deadline, and tries to spare: the
    // deadline alone must end the read.
    c.request_timeout_ms = 20_000;
    c.retries_max = 6;
    c.read_deadline_ms = 2_000;
    let store = Arc::new(ObjectStorePrimary::new(c).unwrap());
    store.check().unwrap();
    let (cache, ds) = cache_over(store.clone());
    let handle = cache.open(ds, "obj", false).unwrap();
    server.pause();
    let gets = proxy.counts().gets;
    let (result, took) = {
        let (cache, handle) = (Arc::clone(&cache), handle.clone());
        read_within(Duration::from_millis(2_000 + 3_000), move || {
            let mut buf = vec![0u8; RS];
            cache.read(&handle, 0, &mut buf)
        })
    };
    let e = result.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    assert!(took >= Duration::from_millis(1_900), "{took:?}: {e}");
    assert_eq!(proxy.counts().gets - gets, 1, "one try fits the deadline");
    // The store did not answer: the next reads (the kernel asks again at
    // once when a read fails) fail at once, without a request of their own.
    let gets = proxy.counts().gets;
    for index in [0u64, 1, 2] {
        let mut buf = vec![0u8; RS];
        let (result, took) = {
            let (cache, handle) = (Arc::clone(&cache), handle.clone());
            read_within(Duration::from_secs(3), move || {
                cache.read(&handle, index * RS as u64, &mut buf)
            })
        };
        let e = result.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(
            took < Duration::from_secs(1),
            "record {index}: {took:?}: {e}"
        );
    }
    assert_eq!(proxy.counts().gets, gets, "reads while the store is down");
    // Back: a probe finds it, and reads go to it again.
    server.resume();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let mut buf = vec![0u8; RS];
        match cache.read(&handle, 0, &mut buf) {
            Ok(n) => {
                assert_eq!(&buf[..n], &data[..RS]);
                break;
            }
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "still failing 15 s after the store came back: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    check_all(&cache, &handle, &data, "after the store came back");
}

#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn stale_if_error_serves_what_is_cached_while_the_store_cannot_be_reached() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let data = content(RS * 6, 41);
    server.put(BUCKET, "obj", &data);
    server.put(BUCKET, "gone", &data[..RS]);
    let ttl_ms = 300;
    let primary_with = |stale_if_error: bool| {
        let mut c = config(&server.endpoint(), BUCKET, ttl_ms);
        c.request_timeout_ms = 1_000;
        c.retries_max = 1;
        c.read_deadline_ms = 1_500;
        c.stale_if_error = stale_if_error;
        let p = Arc::new(ObjectStorePrimary::new(c).unwrap());
        p.check().unwrap();
        p
    };
    let (stale, strict) = (primary_with(true), primary_with(false));
    let (cache, ds) = cache_over(stale.clone());
    let (strict_cache, strict_ds) = cache_over(strict.clone());
    let handle = cache.open(ds, "obj", false).unwrap();
    let strict_handle = strict_cache.open(strict_ds, "obj", false).unwrap();
    // Four of the six records cached by both.
    for index in 0..4 {
        check_record(&cache, &handle, &data, index, "stale, before");
        check_record(
            &strict_cache,
            &strict_handle,
            &data,
            index,
            "strict, before",
        );
    }
    server.pause();
    std::thread::sleep(Duration::from_millis(ttl_ms + 100));
    let (revalidated, _) = {
        let (cache, handle) = (Arc::clone(&strict_cache), strict_handle.clone());
        read_within(Duration::from_secs(8), move || cache.revalidate(&handle))
    };
    let e = revalidated.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "strict: {e}");
    let (revalidated, _) = {
        let (cache, handle) = (Arc::clone(&cache), handle.clone());
        read_within(Duration::from_secs(8), move || cache.revalidate(&handle))
    };
    revalidated.expect("stale-if-error: the last version is served");
    for index in 0..4 {
        check_record(&cache, &handle, &data, index, "stale, store down");
    }
    assert_eq!(stale.stat("obj").unwrap().size_bytes, data.len() as u64);
    assert!(
        stale.stats().stale_if_error_hits >= 2,
        "{:?}",
        stale.stats()
    );
    // Never invented: a record that was not cached still fails.
    let mut buf = vec![0u8; RS];
    let e = cache.read(&handle, 5 * RS as u64, &mut buf).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    // Never stale when the store answers that the object changed or is
    // gone.
    server.resume();
    let v2 = content(RS * 6, 42);
    server.put(BUCKET, "obj", &v2);
    server.delete(BUCKET, "gone");
    // Until its probe finds the store back, it is served stale still.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while stale.is_unreachable() {
        assert!(
            std::time::Instant::now() < deadline,
            "no probe found the store back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(ttl_ms + 100));
    cache.revalidate(&handle).unwrap();
    check_all(&cache, &handle, &v2, "after the overwrite");
    let e = stale.stat("gone").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    // The store answered: once it is unreachable again, "gone" stays gone
    // and the object's new version is what is served.
    server.pause();
    std::thread::sleep(Duration::from_millis(ttl_ms + 100));
    let (stat, _) = {
        let stale = Arc::clone(&stale);
        read_within(Duration::from_secs(8), move || stale.stat("gone"))
    };
    assert_eq!(stat.unwrap_err().kind(), std::io::ErrorKind::NotFound);
    check_all(&cache, &handle, &v2, "stale after the overwrite");
    server.resume();
}

#[test]
fn the_check_names_each_cause_apart() {
    use std::io::ErrorKind as K;
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    let with = |endpoint: &str, bucket: &str, key: &str, secret: &str| {
        let mut c = config(endpoint, bucket, 1000);
        c.request_timeout_ms = 2_000;
        c.options
            .retain(|(k, _)| k != "access_key_id" && k != "secret_access_key");
        for (k, v) in [("access_key_id", key), ("secret_access_key", secret)] {
            if !v.is_empty() {
                c.options.push((k.to_string(), v.to_string()));
            }
        }
        c
    };
    // One line, the kind, the words it must hold and those it must not.
    let expect = |c: ObjectStoreConfig, kind: Option<K>, has: &[&str], lacks: &[&str]| {
        let e = ObjectStorePrimary::new(c).unwrap().check().unwrap_err();
        let text = e.to_string();
        assert!(kind.is_none_or(|k| k == e.kind()), "{:?}: {text}", e.kind());
        for word in has {
            assert!(text.contains(word), "{word:?} missing: {text}");
        }
        let secrets = [l2arc_testkit::s3::SECRET_KEY, "wrong-secret", "\n"];
        for word in lacks.iter().chain(&secrets) {
            assert!(!text.contains(word), "{word:?} present: {text}");
        }
    };
    let (key, secret) = (l2arc_testkit::s3::ACCESS_KEY, l2arc_testkit::s3::SECRET_KEY);
    let endpoint = server.endpoint();
    let bucket_words = ["NoSuchBucket", "no such bucket"];
    expect(
        with(&endpoint, "nosuchbucket", key, secret),
        Some(K::NotFound),
        &bucket_words,
        &[],
    );
    let unknown = ["access key", "not known"];
    let config = with(&endpoint, BUCKET, "nobody", secret);
    expect(config, Some(K::PermissionDenied), &unknown, &["bucket"]);
    let config = with(&endpoint, BUCKET, key, "wrong-secret-000000");
    let signature = ["SignatureDoesNotMatch", "secret key"];
    expect(config, Some(K::PermissionDenied), &signature, &["bucket"]);
    let not_s3 = l2arc_testkit::s3::NotS3Server::start();
    let config = with(&not_s3.endpoint(), BUCKET, key, secret);
    expect(
        config,
        None,
        &["404", "HTML page", "not an S3 server"],
        &["bucket?", "<html>"],
    );
    // A port nothing listens on.
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let config = with(&refused, BUCKET, key, secret);
    let words = ["Connection refused (os error 111)", refused.as_str()];
    expect(config, Some(K::ConnectionRefused), &words, &["sourc"]);
    // No credentials anywhere (the environment and files not looked at).
    let names = [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_PROFILE",
        "~/.aws/credentials",
    ];
    expect(
        with(&endpoint, BUCKET, "", ""),
        Some(K::PermissionDenied),
        &names,
        &[],
    );
}

/// The shared tier as a library attaches it: a tier config over the
/// cache bucket, with the test server's credentials.
fn shared_config(endpoint: &str, fleet_key: Option<&[u8]>) -> l2arc::SharedTierConfig {
    let mut c = l2arc::SharedTierConfig::new(config(endpoint, "cache", 60_000));
    c.fleet_key = fleet_key.map(<[u8]>::to_vec);
    c
}

fn kstat_of(cache: &Cache, name: &str) -> u64 {
    let stats = cache.stats();
    stats
        .shared
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {name} in {:?}", stats.shared))
}

/// Reads every record of `handle` through a read queue (the NBD server's
/// path), all in flight at once.
fn read_all_queued(cache: &Cache, handle: &l2arc::ObjectHandle) -> Vec<u8> {
    let len = handle.size_bytes() as usize;
    let mut out = vec![0u8; len];
    let mut queue = cache.read_queue(64).unwrap();
    for (i, offset) in (0..len).step_by(RS).enumerate() {
        queue
            .submit(handle, offset as u64, RS.min(len - offset), i as u64)
            .unwrap();
    }
    let mut done = Vec::new();
    let mut seen = 0;
    while seen < len.div_ceil(RS) {
        queue.wait(1, &mut done).unwrap();
        for completion in done.drain(..) {
            let offset = completion.tag as usize * RS;
            let view = completion.result.unwrap();
            view.copy_to(&mut out[offset..offset + view.len()]);
            seen += 1;
        }
    }
    out
}

/// The shared tier's hits in its own analytics band, none in the L2ARC's,
/// by single blocking reads and by a read-ahead's span (its GETs in
/// flight together, `read_below_many`), each in a new cache over the
/// tier that holds `objects`.
fn shared_hits_by_single_reads_and_spans(
    server: &S3Server,
    key: &[u8],
    objects: &[(String, Vec<u8>)],
) {
    for how in ["read", "span"] {
        let store = primary(&server.endpoint(), 60_000);
        let (cache, ds) = cache_over(store.clone());
        cache
            .add_shared_tier(shared_config(&server.endpoint(), Some(key)))
            .unwrap();
        for (name, data) in objects {
            let handle = cache.open(ds, name, false).unwrap();
            if how == "span" {
                cache
                    .prefetch_span(&handle, 0, handle.size_bytes())
                    .unwrap();
            }
            assert!(read_all(&cache, &handle) == *data, "{how}: {name}");
        }
        assert_eq!(store.stats().gets, 0, "{how}");
        assert_shared_band(&cache, objects, how);
    }
}

/// Every record of `objects` was read once from the shared tier, and is
/// counted in its analytics band, none in the L2ARC's or primary's.
fn assert_shared_band(cache: &Cache, objects: &[(String, Vec<u8>)], how: &str) {
    let total: u64 = objects.iter().map(|(_, d)| records(d) as u64).sum();
    let bytes: u64 = objects.iter().map(|(_, d)| d.len() as u64).sum();
    let analytics = cache.analytics();
    assert_eq!(analytics.shared_hit.snapshot().count(), total, "{how}");
    assert_eq!(analytics.l2_hit.snapshot().count(), 0, "{how}");
    assert_eq!(analytics.primary.snapshot().count(), 0, "{how}");
    let d = analytics.dataset(0);
    assert_eq!(
        (d.shared_hits, d.l2_hits, d.misses),
        (total, 0, total),
        "{how}"
    );
    assert_eq!(d.shared_read_bytes, bytes, "{how}");
}

#[test]
fn a_shared_tier_serves_a_second_cache_with_no_get() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    server.create_bucket("cache");
    let objects: Vec<(String, Vec<u8>)> = [1usize, RS, RS * 3 + 5]
        .iter()
        .enumerate()
        .map(|(i, &len)| (format!("o{i}"), content(len, i as u64 + 40)))
        .collect();
    for (key, data) in &objects {
        server.put(BUCKET, key, data);
    }
    let total: u64 = objects.iter().map(|(_, d)| records(d) as u64).sum();
    let key = [3u8; 32];
    // The first cache reads from the bucket and writes the tier.
    let store1 = primary(&server.endpoint(), 60_000);
    let (cache1, ds1) = cache_over(store1.clone());
    cache1
        .add_shared_tier(shared_config(&server.endpoint(), Some(&key)))
        .unwrap();
    let again = cache1.add_shared_tier(shared_config(&server.endpoint(), Some(&key)));
    assert_eq!(again.unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
    for (name, data) in &objects {
        let handle = cache1.open(ds1, name, false).unwrap();
        assert!(read_all(&cache1, &handle) == *data, "{name}");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while kstat_of(&cache1, "shared_writes") < total {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            cache1.stats().shared
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(store1.stats().gets, total);
    assert_eq!(cache1.analytics().shared_hit.snapshot().count(), 0);
    // The second reads through a read queue: all from the tier.
    let store2 = primary(&server.endpoint(), 60_000);
    let (cache2, ds2) = cache_over(store2.clone());
    cache2
        .add_shared_tier(shared_config(&server.endpoint(), Some(&key)))
        .unwrap();
    for (name, data) in &objects {
        let handle = cache2.open(ds2, name, false).unwrap();
        assert!(read_all_queued(&cache2, &handle) == *data, "{name}");
    }
    assert_eq!(store2.stats().gets, 0, "{:?}", cache2.stats().shared);
    assert_eq!(kstat_of(&cache2, "shared_hits"), total);
    assert_eq!(kstat_of(&cache2, "shared_writes"), 0, "not written back");
    assert!(cache2.shared_read_latency().unwrap().count() >= total);
    assert_shared_band(&cache2, &objects, "queue");
    shared_hits_by_single_reads_and_spans(&server, &key, &objects);
    // A third with another fleet key refuses every block: all from the bucket.
    let store3 = primary(&server.endpoint(), 60_000);
    let (cache3, ds3) = cache_over(store3.clone());
    cache3
        .add_shared_tier(shared_config(&server.endpoint(), Some(&[4u8; 32])))
        .unwrap();
    for (name, data) in &objects {
        let handle = cache3.open(ds3, name, false).unwrap();
        assert!(read_all(&cache3, &handle) == *data, "{name}");
    }
    assert_eq!(kstat_of(&cache3, "shared_bad_hmac"), total);
    assert_eq!(store3.stats().gets, total);
    // A key shorter than 32 bytes is refused.
    let (cache4, _) = cache_over(store3);
    let short = cache4.add_shared_tier(shared_config(&server.endpoint(), Some(&[1u8; 16])));
    assert_eq!(short.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
}

/// Waits (20 s at most) until `cache`'s shared-tier writes have all ended:
/// the queue empty and `done` of them counted as written or timed out.
fn wait_for_writes(cache: &Cache, done: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while kstat_of(cache, "shared_writes") + kstat_of(cache, "shared_write_timeouts") < done
        || kstat_of(cache, "shared_writeq_size") > 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            cache.stats().shared
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One GET of the shared tier past its timeout (a tail: a disk queue, a
/// store's p99.9) is a miss for its record, which comes from the source;
/// the tier is not put into backoff for it, so the records after it still
/// come from the tier. Three in a row (a store down or hung) are.
#[test]
fn one_slow_get_of_the_shared_tier_is_a_miss_and_three_in_a_row_a_backoff() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    server.create_bucket("cache");
    let records = 8u64;
    let data = content(RS * records as usize, 91);
    server.put(BUCKET, "obj", &data);
    // Node 1 fills the tier.
    let (cache1, ds1) = cache_over(primary(&server.endpoint(), 60_000));
    cache1
        .add_shared_tier(shared_config(&server.endpoint(), None))
        .unwrap();
    let handle = cache1.open(ds1, "obj", false).unwrap();
    assert!(read_all(&cache1, &handle) == data);
    wait_for_writes(&cache1, records);
    // Node 2 reaches the tier through a proxy that holds its first GET
    // 600 ms, past the tier's 200 ms.
    let proxy = FaultProxy::start(server.addr());
    let store2 = primary(&server.endpoint(), 60_000);
    let (cache2, ds2) = cache_over(store2.clone());
    let tier = shared_config(&proxy.endpoint(), None);
    assert_eq!(tier.timeout_ms, 200);
    cache2.add_shared_tier(tier).unwrap();
    proxy.slow_next_gets(1, 600);
    let handle = cache2.open(ds2, "obj", false).unwrap();
    assert!(read_all(&cache2, &handle) == data);
    let shared = || format!("{:?}", cache2.stats().shared);
    assert_eq!(kstat_of(&cache2, "shared_timeouts"), 1, "{}", shared());
    assert_eq!(kstat_of(&cache2, "shared_skips"), 0, "{}", shared());
    assert_eq!(
        kstat_of(&cache2, "shared_hits"),
        records - 1,
        "{}",
        shared()
    );
    assert_eq!(store2.stats().gets, 1, "the slow record, from the source");
    // Node 3: its first three GETs are held: the tier backs off, and the
    // next records go to the source without asking it.
    let store3 = primary(&server.endpoint(), 60_000);
    let (cache3, ds3) = cache_over(store3.clone());
    cache3
        .add_shared_tier(shared_config(&proxy.endpoint(), None))
        .unwrap();
    proxy.slow_next_gets(3, 600);
    let handle = cache3.open(ds3, "obj", false).unwrap();
    assert!(read_all(&cache3, &handle) == data);
    let shared = || format!("{:?}", cache3.stats().shared);
    assert_eq!(kstat_of(&cache3, "shared_timeouts"), 3, "{}", shared());
    assert!(kstat_of(&cache3, "shared_skips") >= 1, "{}", shared());
    assert_eq!(
        kstat_of(&cache3, "shared_hits") + kstat_of(&cache3, "shared_skips") + 3,
        records,
        "{}",
        shared()
    );
}

/// A store slow to take writes (every PUT 400 ms, over the 200 ms a read
/// may take) still gets every block, and the reads never skip the tier;
/// a PUT past its own bound is dropped and counted, and still does not
/// put the reads into backoff.
#[test]
fn slow_writes_to_the_shared_tier_neither_fail_nor_stop_its_reads() {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    server.create_bucket("cache");
    let data = content(RS * 4, 77);
    server.put(BUCKET, "obj", &data);
    let total = 4u64;
    let proxy = FaultProxy::start(server.addr());
    proxy.set_put_delay_ms(400);
    // Node 1: its PUTs take 400 ms each, under their 5 s bound.
    let (cache1, ds1) = cache_over(primary(&server.endpoint(), 60_000));
    let tier = shared_config(&proxy.endpoint(), None);
    assert_eq!(tier.timeout_ms, 200);
    cache1.add_shared_tier(tier).unwrap();
    let handle = cache1.open(ds1, "obj", false).unwrap();
    assert!(read_all(&cache1, &handle) == data);
    wait_for_writes(&cache1, total);
    assert_eq!(kstat_of(&cache1, "shared_writes"), total);
    assert_eq!(kstat_of(&cache1, "shared_write_timeouts"), 0);
    assert_eq!(kstat_of(&cache1, "shared_timeouts"), 0);
    // Node 2 reads every record from the tier.
    let store2 = primary(&server.endpoint(), 60_000);
    let (cache2, ds2) = cache_over(store2.clone());
    cache2
        .add_shared_tier(shared_config(&proxy.endpoint(), None))
        .unwrap();
    let handle = cache2.open(ds2, "obj", false).unwrap();
    assert!(read_all(&cache2, &handle) == data);
    assert_eq!(kstat_of(&cache2, "shared_hits"), total);
    assert_eq!(store2.stats().gets, 0);
    // Node 3 with a PUT bound under the store's 400 ms: its writes are
    // dropped and counted, and its reads are never skipped.
    server.put(BUCKET, "other", &data);
    let (cache3, ds3) = cache_over(primary(&server.endpoint(), 60_000));
    let mut tier = shared_config(&proxy.endpoint(), None);
    tier.put_timeout_ms = 100;
    cache3.add_shared_tier(tier).unwrap();
    let handle = cache3.open(ds3, "other", false).unwrap();
    assert!(read_all(&cache3, &handle) == data);
    wait_for_writes(&cache3, total);
    assert_eq!(kstat_of(&cache3, "shared_write_timeouts"), total);
    assert_eq!(kstat_of(&cache3, "shared_writes"), 0);
    let handle = cache3.open(ds3, "obj", false).unwrap();
    assert!(read_all(&cache3, &handle) == data);
    assert_eq!(
        kstat_of(&cache3, "shared_skips"),
        0,
        "{:?}",
        cache3.stats().shared
    );
    assert_eq!(kstat_of(&cache3, "shared_hits"), total);
}
