//! The shared cache tier (`--shared-cache`) end to end: `l2arc mount`
//! processes, each with its own cache file, in front of a data bucket,
//! sharing a cache bucket, on real S3 servers (versitygw, started per
//! test by l2arc-testkit; missing, the tests fail).
//!
//! - three nodes: node 1 reads everything from the data bucket, nodes 2
//!   and 3 then read it all with no data GET, every byte right; an object
//!   overwritten in place is read new on every node after the TTL;
//! - a block rewritten in the cache bucket with other bytes and a valid
//!   CRC but no HMAC is refused with a fleet key; truncated and garbage
//!   blocks are misses without one; each counted by reason, the right
//!   bytes from the data bucket;
//! - the cache server hung mid-run: reads go to the data bucket with no
//!   error, timeouts are counted, and the tier is used again once back;
//! - `--shared-cache-admit mfu`: a record read once is not written; read
//!   twice (evicted in between or not) it is;
//! - two `serve-nbd` exports of an image object: the second reads it
//!   all from the tier, in its own band of the analytics (`shared_hit`:
//!   `/api/stats`, `/metrics`, `/api/history`, and the live page's heat
//!   map in headless Chromium, `tests/browser/shared_band.py`), not the
//!   L2ARC's;
//! - start-up refusals in one line.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use l2arc_testkit::nbd::pattern;
use l2arc_testkit::s3::{S3Server, gets_in_log as data_gets};
use l2arc_testkit::service::{Running, Service};
use l2arc_testkit::{ctl, kstat};

const DATA: &str = "data";
const CACHE: &str = "cache";
const PREFIX: &str = "fleet";
const TTL_SECS: f64 = 1.0;
const RECORD: usize = 256 << 10;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_l2arc"))
}

fn records(len: usize) -> u64 {
    len.div_ceil(RECORD) as u64
}

/// One `l2arc mount` of the data bucket with the shared tier.
struct Node {
    running: Running,
    log: Arc<Mutex<String>>,
    mnt: PathBuf,
    control: PathBuf,
}

impl Node {
    /// Node `n` of the fleet under `dir`: its own cache file (unless
    /// `extra` says otherwise), control socket and mountpoint.
    fn mount(data: &S3Server, cache_endpoint: &str, dir: &Path, n: usize, extra: &[&str]) -> Node {
        let mnt = dir.join(format!("mnt{n}"));
        std::fs::create_dir_all(&mnt).unwrap();
        let control = dir.join(format!("ctl{n}.sock"));
        let cache_file = dir.join(format!("l2-{n}.img"));
        let shared = format!("s3://{CACHE}/{PREFIX}");
        let mut service = Service::mount(bin(), format!("s3://{DATA}"), &mnt)
            .args(["--s3-endpoint", &data.endpoint()])
            .args(["--shared-cache", &shared])
            .args(["--shared-cache-endpoint", cache_endpoint])
            .args(["--recordsize", "256K"])
            .args(["--metadata-ttl", &TTL_SECS.to_string()])
            .args(["--control", control.to_str().unwrap()])
            .env_remove("AWS_PROFILE")
            .env("HOME", "/nonexistent-l2arc-test-home");
        if !extra.contains(&"--no-cache-file") {
            service = service
                .args(["--cache", cache_file.to_str().unwrap()])
                .args(["--cache-size", "64MiB"]);
        }
        if !extra.contains(&"--arc-max") {
            service = service.args(["--arc-max", "64MiB"]);
        }
        service = service.args(["--http", "127.0.0.1:0"]);
        service = service.args(extra.iter().filter(|a| **a != "--no-cache-file"));
        for (k, v) in data.aws_env() {
            service = service.env(k, v);
        }
        let mut running = service
            .ready_within(Duration::from_secs(30))
            .try_start()
            .unwrap_or_else(|why| panic!("node {n}: {why}"));
        let log = running.gather_stderr();
        Node {
            running,
            log,
            mnt,
            control,
        }
    }

    fn stats(&self) -> String {
        ctl(bin(), &self.control, &["stats"])
    }

    fn kstat(&self, name: &str) -> u64 {
        kstat(&self.stats(), name)
    }

    /// Reads `key` through the mount, bypassing the page cache (each read
    /// reaches the daemon).
    fn read(&self, key: &str) -> Vec<u8> {
        let out = Command::new("dd")
            .arg(format!("if={}", self.mnt.join(key).display()))
            .args(["bs=1M", "iflag=direct", "status=none"])
            .output()
            .expect("run dd");
        assert!(out.status.success(), "dd {key}: {out:?}");
        out.stdout
    }

    /// Waits until the writes queued so far are done: `shared_writes`
    /// reaches `at_least` and nothing is queued.
    fn wait_writes(&self, at_least: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.stats();
            if kstat(&s, "shared_writes") >= at_least && kstat(&s, "shared_writeq_size") == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "writes never came:\n{s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, wait, and return the log.
    fn stop(mut self) -> String {
        let (status, _) = self.running.stop();
        std::thread::sleep(Duration::from_millis(100));
        let log = self.log.lock().unwrap().clone();
        assert!(status.success(), "exit {status}: {log}");
        log
    }
}

fn server() -> S3Server {
    let server = S3Server::start();
    server.create_bucket(DATA);
    server.create_bucket(CACHE);
    server
}

/// The blocks in the cache bucket of `server`: (key, path on disk).
fn blocks(server: &S3Server) -> Vec<(String, PathBuf)> {
    let root = server.data_dir().join(CACHE).join(PREFIX);
    let mut out = Vec::new();
    let Ok(digests) = std::fs::read_dir(&root) else {
        return out;
    };
    for digest in digests {
        let digest = digest.unwrap().path();
        for block in std::fs::read_dir(&digest).unwrap() {
            let path = block.unwrap().path();
            if path.is_file() {
                let key = path
                    .strip_prefix(server.data_dir().join(CACHE))
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                out.push((key, path));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_fleet_reads_the_data_bucket_once_and_sees_overwrites() {
    let data = server();
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<(String, Vec<u8>)> = vec![
        ("top.txt".into(), b"hello from the fleet\n".to_vec()),
        ("a/one.bin".into(), pattern(3 * 1024 * 1024 + 17, 1)),
        ("a/b/two.bin".into(), pattern(200_000, 2)),
        ("c/three.bin".into(), pattern(1 << 20, 3)),
        ("z/last".into(), pattern(4096, 4)),
    ];
    for (key, bytes) in &files {
        data.put(DATA, key, bytes);
    }
    let total_records: u64 = files.iter().map(|(_, b)| records(b.len())).sum();
    let node1 = Node::mount(&data, &data.endpoint(), dir.path(), 1, &[]);
    for (key, bytes) in &files {
        assert!(node1.read(key) == *bytes, "node 1: {key} differs");
    }
    node1.wait_writes(total_records);
    assert_eq!(blocks(&data).len() as u64, total_records);
    assert!(node1.kstat("primary_reads") > 0);
    let nodes = [
        Node::mount(&data, &data.endpoint(), dir.path(), 2, &[]),
        Node::mount(&data, &data.endpoint(), dir.path(), 3, &[]),
    ];
    for node in &nodes {
        for (key, bytes) in &files {
            assert!(node.read(key) == *bytes, "{key} differs");
        }
        let s = node.stats();
        assert_eq!(kstat(&s, "primary_reads"), 0, "a data GET:\n{s}");
        assert_eq!(kstat(&s, "shared_hits"), total_records, "{s}");
        assert_eq!(kstat(&s, "shared_bad"), 0, "{s}");
        // Found in the tier: not written back.
        assert_eq!(kstat(&s, "shared_writes"), 0, "{s}");
    }
    // /metrics: the tier's counters with their own help lines, and its
    // read latency as a series of the tiers' histogram; promtool is happy.
    let addr = nodes[0].running.http().expect("an HTTP endpoint");
    let (status, page) = l2arc_testkit::http_get(addr, "/metrics");
    assert_eq!(status, 200);
    let samples = l2arc_testkit::prometheus_samples(&page);
    assert_eq!(
        samples["l2arc_arcstats_shared_hits_total"],
        total_records as f64
    );
    assert!(samples.contains_key("l2arc_arcstats_shared_bad_hmac_total"));
    assert!(
        samples[r#"l2arc_read_latency_seconds_count{tier="shared"}"#] >= total_records as f64,
        "{page}"
    );
    assert!(
        !page
            .lines()
            .any(|l| l.contains("arcstats_shared") && l.contains("An arcstats counter")),
        "a shared kstat without its own help line"
    );
    l2arc_testkit::promtool_check(&page);
    // An object overwritten in place (same size, a new ETag): every node
    // reads the new bytes once the TTL has passed.
    let (key, old) = &files[3];
    let new = pattern(old.len(), 33);
    data.put(DATA, key, &new);
    std::thread::sleep(Duration::from_secs_f64(TTL_SECS + 0.5));
    for node in std::iter::once(&node1).chain(&nodes) {
        let got = node.read(key);
        assert!(got == new, "old bytes after the TTL on {:?}", node.mnt);
    }
    // Each version has its own blocks.
    node1.wait_writes(total_records);
    for node in nodes {
        let log = node.stop();
        // The overwritten object, at most once per node: the rest never.
        assert!(data_gets(&log) <= records(new.len()), "{log}");
    }
    let log = node1.stop();
    assert!(data_gets(&log) >= files.len() as u64 - 1, "{log}");
    assert!(log.contains("l2arc: shared cache tier s3://cache/fleet (admit all, not keyed"));
}

/// `block` with other payload bytes, its HMAC and keyed flag gone and
/// its CRC made valid again: what a writer without the key can make.
fn forged(block: &[u8]) -> Vec<u8> {
    const HMAC_BYTES: usize = 32;
    const HEADER_BYTES: usize = 68;
    let mut forged = block[..block.len() - HMAC_BYTES].to_vec();
    forged[11] = 0; // no HMAC
    let version_len = u16::from_le_bytes([forged[64], forged[65]]) as usize;
    let payload = HEADER_BYTES + version_len;
    for byte in &mut forged[payload..payload + 100] {
        *byte ^= 0x5a;
    }
    let crc_at = forged.len() - 4;
    let crc = crc32c::crc32c(&forged[..crc_at]);
    forged[crc_at..].copy_from_slice(&crc.to_le_bytes());
    forged
}

#[test]
fn forged_truncated_and_garbage_blocks_are_refused_and_counted() {
    let data = server();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("fleet.key");
    std::fs::write(
        &key_file,
        "0123456789abcdef0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    let keyed = ["--shared-cache-key-file", key_file.to_str().unwrap()];
    let bytes = pattern(4 * RECORD, 7); // random: stored plain
    data.put(DATA, "obj", &bytes);
    let node1 = Node::mount(&data, &data.endpoint(), dir.path(), 1, &keyed);
    assert!(node1.read("obj") == bytes);
    node1.wait_writes(4);
    let log = node1.stop();
    assert!(log.contains("keyed: blocks signed and checked"), "{log}");
    let blocks = blocks(&data);
    assert_eq!(blocks.len(), 4, "{blocks:?}");
    let block_of = |index: u64| {
        blocks
            .iter()
            .find(|(key, _)| key.ends_with(&format!("/{index}")))
            .unwrap()
            .clone()
    };
    // Record 1 forged: other bytes, a valid CRC, no HMAC.
    let (key1, path1) = block_of(1);
    data.put(CACHE, &key1, &forged(&std::fs::read(&path1).unwrap()));
    // With the key: refused, counted, the right bytes from the data bucket.
    let node2 = Node::mount(&data, &data.endpoint(), dir.path(), 2, &keyed);
    assert!(node2.read("obj") == bytes, "a forged block was served");
    let s = node2.stats();
    assert_eq!(kstat(&s, "shared_bad_hmac"), 1, "{s}");
    assert_eq!(kstat(&s, "shared_hits"), 3, "{s}");
    assert_eq!(kstat(&s, "primary_reads"), 1, "{s}");
    // The record read from the data bucket instead replaced the forgery
    // with a signed block.
    node2.wait_writes(1);
    node2.stop();
    let healed = std::fs::read(&path1).unwrap();
    assert_eq!(
        healed[11], 1,
        "the forged block was not replaced by a signed one"
    );
    // Without a key: a truncated block and a garbage block are misses.
    let (key2, path2) = block_of(2);
    let whole = std::fs::read(&path2).unwrap();
    data.put(CACHE, &key2, &whole[..whole.len() / 2]);
    let (key3, _) = block_of(3);
    data.put(CACHE, &key3, &pattern(4096, 99));
    let (key0, path0) = block_of(0);
    let mut flipped = std::fs::read(&path0).unwrap();
    let at = flipped.len() / 2;
    flipped[at] ^= 1;
    data.put(CACHE, &key0, &flipped);
    let node3 = Node::mount(&data, &data.endpoint(), dir.path(), 3, &[]);
    assert!(node3.read("obj") == bytes, "a bad block was served");
    let s = node3.stats();
    assert_eq!(kstat(&s, "shared_bad_short"), 1, "{s}");
    assert_eq!(kstat(&s, "shared_bad_magic"), 1, "{s}");
    assert_eq!(kstat(&s, "shared_bad_crc"), 1, "{s}");
    assert_eq!(kstat(&s, "shared_bad"), 3, "{s}");
    // Three records from the data bucket (adjacent ones may share a GET).
    assert!((2..=3).contains(&kstat(&s, "primary_reads")), "{s}");
    assert_eq!(kstat(&s, "primary_read_bytes"), 3 * RECORD as u64, "{s}");
    assert_eq!(kstat(&s, "shared_hits"), 1, "{s}");
    node3.stop();
}

#[test]
fn a_hung_cache_server_is_skipped_and_used_again_once_back() {
    let data = server();
    let cache = S3Server::start();
    cache.create_bucket(CACHE);
    let dir = tempfile::tempdir().unwrap();
    let objects: Vec<(String, Vec<u8>)> = (0..3)
        .map(|i| (format!("obj{i}"), pattern(2 * RECORD, 10 + i)))
        .collect();
    for (key, bytes) in &objects {
        data.put(DATA, key, bytes);
    }
    let put_timeout = ["--shared-cache-put-timeout", "0.75"];
    let node1 = Node::mount(&data, &cache.endpoint(), dir.path(), 1, &put_timeout);
    for (key, bytes) in &objects {
        assert!(node1.read(key) == *bytes);
    }
    node1.wait_writes(6);
    let log = node1.stop();
    assert!(log.contains("timeout 200 ms, put timeout 750 ms)"), "{log}");
    let node2 = Node::mount(&data, &cache.endpoint(), dir.path(), 2, &[]);
    assert!(node2.read("obj0") == objects[0].1);
    assert_eq!(node2.kstat("shared_hits"), 2);
    cache.pause();
    // Hung: every read answered from the data bucket, none an error, and
    // the tier's own timeout (0.2 s) well under the data bucket's.
    let started = Instant::now();
    assert!(node2.read("obj1") == objects[1].1, "while the cache hangs");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let s = node2.stats();
    assert!(
        kstat(&s, "shared_timeouts") + kstat(&s, "shared_errors") >= 1,
        "{s}"
    );
    assert_eq!(kstat(&s, "shared_hits"), 2, "{s}");
    // (Both records may come in one GET: the mount reads ahead.)
    let primary_reads = kstat(&s, "primary_reads");
    assert!((1..=2).contains(&primary_reads), "{s}");
    cache.resume();
    // Backing off at most 5 s; then the tier is tried and used again: the
    // object node 2 never read comes from it.
    std::thread::sleep(Duration::from_secs(6));
    assert!(node2.read("obj2") == objects[2].1);
    let s = node2.stats();
    assert_eq!(kstat(&s, "shared_hits"), 4, "{s}");
    assert_eq!(kstat(&s, "primary_reads"), primary_reads, "{s}");
    let log = node2.stop();
    assert!(
        log.contains("timeout 200 ms, put timeout 5000 ms)"),
        "{log}"
    );
}

/// The ARC's rule `|MRU| + |MRU ghosts| <= c` sets the sizes: with 4 MiB
/// in MFU, the MRU list holds 4 MiB and its ghosts up to 4 MiB, so the
/// 2 MiB that 4 MiB of fillers push out of MRU are still ghosts when
/// read again.
#[test]
fn admit_mfu_writes_only_what_the_arc_saw_twice() {
    let data = server();
    let dir = tempfile::tempdir().unwrap();
    let mb = |seed: u64| pattern(1 << 20, seed);
    let (once, evicted) = (mb(1), mb(2));
    data.put(DATA, "once", &once);
    data.put(DATA, "evicted", &evicted);
    let set = |name: &str, n: u64, seed: u64| -> Vec<(String, Vec<u8>)> {
        (0..n)
            .map(|i| (format!("{name}{i}"), mb(seed + i)))
            .collect()
    };
    let (twice, first, second) = (set("twice", 4, 10), set("fill", 4, 20), set("more", 8, 30));
    for (key, bytes) in twice.iter().chain(&first).chain(&second) {
        data.put(DATA, key, bytes);
    }
    let mfu = [
        "--shared-cache-admit",
        "mfu",
        "--no-cache-file",
        "--arc-max",
        "8MiB",
        "--arc-shards",
        "1",
    ];
    let node1 = Node::mount(&data, &data.endpoint(), dir.path(), 1, &mfu);
    // Read twice while resident: to MFU (4 MiB).
    for (key, bytes) in &twice {
        assert!(node1.read(key) == *bytes);
        assert!(node1.read(key) == *bytes);
    }
    assert!(node1.read("once") == once);
    assert!(node1.read("evicted") == evicted);
    // Fillers, read once, push "once" and "evicted" out of MRU.
    for (key, _) in &first {
        node1.read(key);
    }
    std::thread::sleep(Duration::from_secs(1));
    let s = node1.stats();
    assert_eq!(
        kstat(&s, "shared_writes"),
        0,
        "a record seen once was written:\n{s}"
    );
    assert_eq!(kstat(&s, "shared_writeq_size"), 0, "{s}");
    // "evicted", read again, is a ghost hit: written at its fill.
    assert!(node1.read("evicted") == evicted);
    node1.wait_writes(4);
    assert!(node1.kstat("mru_ghost_hits") >= 4);
    // More fillers, each read twice, push "twice*" out of MFU, which
    // writes them (and the fillers after them).
    for (key, _) in &second {
        node1.read(key);
        node1.read(key);
    }
    node1.wait_writes(20);
    std::thread::sleep(Duration::from_secs(1));
    node1.wait_writes(20);
    node1.stop();
    // A second node (admit all) finds "evicted" and "twice*" in the tier,
    // and reads "once" from the data bucket.
    let node2 = Node::mount(&data, &data.endpoint(), dir.path(), 2, &[]);
    assert!(node2.read("evicted") == evicted);
    for (key, bytes) in &twice {
        assert!(node2.read(key) == *bytes);
    }
    let s = node2.stats();
    assert_eq!(kstat(&s, "primary_reads"), 0, "{s}");
    assert_eq!(kstat(&s, "shared_hits"), 20, "{s}");
    assert!(node2.read("once") == once);
    let s = node2.stats();
    assert!(kstat(&s, "primary_reads") >= 1, "{s}");
    assert_eq!(kstat(&s, "shared_hits"), 20, "{s}");
    node2.stop();
}

/// `serve-nbd s3://BUCKET/KEY` of the image, with the shared tier and a
/// cache file, and `extra` arguments. (A miss is read by the blocking
/// path; the read queue's own fills of the tiers after the L2ARC are
/// checked by the engine's test, tests/object_store.rs.)
fn serve_nbd(data: &S3Server, dir: &Path, n: usize, extra: &[&str]) -> (Running, PathBuf) {
    let socket = dir.join(format!("nbd{n}.sock"));
    let control = dir.join(format!("nbdctl{n}.sock"));
    let cache_file = dir.join(format!("nbd-l2-{n}.img"));
    let mut service = Service::serve_nbd(bin(), format!("s3://{DATA}/disk.img"))
        .listen_unix(&socket)
        .args(["--read-only", "--s3-endpoint", &data.endpoint()])
        .args(["--shared-cache", &format!("s3://{CACHE}/{PREFIX}")])
        .args([
            "--cache",
            cache_file.to_str().unwrap(),
            "--cache-size",
            "64MiB",
        ])
        .args(["--arc-max", "64MiB", "--control", control.to_str().unwrap()])
        .args(extra)
        .env_remove("AWS_PROFILE")
        .env("HOME", "/nonexistent-l2arc-test-home");
    for (k, v) in data.aws_env() {
        service = service.env(k, v);
    }
    (service.start(), control)
}

#[test]
fn two_nbd_exports_of_an_image_object_share_the_tier() {
    let data = server();
    let dir = tempfile::tempdir().unwrap();
    let bytes = pattern(8 << 20, 21);
    let image = dir.path().join("disk.img");
    std::fs::write(&image, &bytes).unwrap();
    data.put(DATA, "disk.img", &bytes);
    let compare = |socket: &Path| {
        let uri = format!("nbd+unix:///?socket={}", socket.display());
        l2arc_testkit::run(
            l2arc_testkit::tool("qemu-img", "qemu-utils")
                .args(["compare", "-f", "raw", "-F", "raw", &uri])
                .arg(&image),
        );
    };
    let (mut first, control1) = serve_nbd(&data, dir.path(), 1, &[]);
    compare(first.socket());
    let deadline = Instant::now() + Duration::from_secs(30);
    while kstat(&ctl(bin(), &control1, &["stats"]), "shared_writes") < 8 {
        assert!(Instant::now() < deadline, "writes never came");
        std::thread::sleep(Duration::from_millis(100));
    }
    first.stop();
    let history = dir.path().join("history2.bin");
    let (mut second, control2) = serve_nbd(
        &data,
        dir.path(),
        2,
        &[
            "--http",
            "127.0.0.1:0",
            "--history",
            history.to_str().unwrap(),
        ],
    );
    let addr = second.http().expect("an HTTP endpoint");
    // A history sample before the reads, so that the history's rates
    // (deltas between samples) see them.
    wait_for_history(addr, |h| !h["samples"].as_array().unwrap().is_empty());
    compare(second.socket());
    let s = ctl(bin(), &control2, &["stats"]);
    assert_eq!(kstat(&s, "primary_reads"), 0, "{s}");
    assert_eq!(kstat(&s, "shared_hits"), 8, "{s}");
    check_shared_band(addr, 8);
    second.stop();
}

/// `/api/history?window=60` once `ok` holds of it (10 s at most).
fn wait_for_history(
    addr: std::net::SocketAddr,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = l2arc_testkit::http_get(addr, "/api/history?window=60");
        assert_eq!(status, 200, "{body}");
        let h: serde_json::Value = serde_json::from_str(&body).unwrap();
        if ok(&h) {
            return h;
        }
        assert!(Instant::now() < deadline, "history never held: {h}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The `hits` records the shared tier served are in its own analytics
/// band and nowhere else below the ARC: the `shared_hit` histogram of
/// `/api/stats` and `/metrics`, the dataset's `shared_hits`, the history's
/// `shared_hit` heat rows and `shared_hits` counter, and the live page's
/// heat map (the 1 h window, from the history) in headless Chromium.
fn check_shared_band(addr: std::net::SocketAddr, hits: u64) {
    let (status, body) = l2arc_testkit::http_get(addr, "/api/stats");
    assert_eq!(status, 200);
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    let histograms = &stats["histograms"];
    assert_eq!(histograms["shared_hit"]["count"], hits, "{histograms}");
    assert_eq!(histograms["l2_hit"]["count"], 0, "{histograms}");
    assert_eq!(histograms["primary"]["count"], 0, "{histograms}");
    assert_eq!(stats["datasets"][0]["shared_hits"], hits, "{stats}");
    let (_, page) = l2arc_testkit::http_get(addr, "/metrics");
    let samples = l2arc_testkit::prometheus_samples(&page);
    assert_eq!(
        samples[r#"l2arc_read_latency_seconds_count{tier="shared_hit"}"#],
        hits as f64
    );
    assert_eq!(
        samples[r#"l2arc_read_latency_seconds_count{tier="l2_hit"}"#],
        0.0
    );
    // Per dataset, as in /api/stats (the export's one dataset).
    let per_dataset = |family: &str| -> Vec<f64> {
        let prefix = format!("{family}{{dataset=");
        (samples.iter())
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(_, v)| *v)
            .collect()
    };
    assert_eq!(
        per_dataset("l2arc_dataset_shared_hits_total"),
        [hits as f64]
    );
    let bytes = stats["datasets"][0]["shared_read_bytes"].as_u64().unwrap();
    assert!(bytes >= hits, "{stats}");
    let read_bytes = per_dataset("l2arc_dataset_shared_read_bytes_total");
    assert_eq!(read_bytes, [bytes as f64]);
    // The history: the band's rows of the newest sample hold every hit.
    let history = wait_for_history(addr, |h| {
        let tier = h["tiers"]
            .as_array()
            .unwrap()
            .iter()
            .position(|t| t == "shared_hit")
            .expect("a shared_hit tier in the history");
        h["samples"].as_array().unwrap().last().is_some_and(|s| {
            s[3][tier]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap())
                .sum::<u64>()
                == hits
        })
    });
    let field = history["fields"]
        .as_array()
        .unwrap()
        .iter()
        .position(|f| f == "shared_hits")
        .expect("shared_hits in the history's fields");
    let newest = history["samples"].as_array().unwrap().last().unwrap();
    assert_eq!(newest[2][field], hits, "{newest}");
    // The live page draws the band from the history, with no error.
    let dir = tempfile::tempdir().unwrap();
    let (stdout, _) = l2arc_testkit::browse(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/shared_band.py"),
        &format!("http://{addr}/"),
        &dir.path().join("shared.png"),
    );
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(result["errors"].as_array().unwrap().is_empty(), "{result}");
    assert!(result["shared_events"].as_u64().unwrap() > 0, "{result}");
    assert_eq!(result["l2_events"], 0, "{result}");
}

#[test]
fn start_up_refuses_a_bad_shared_cache_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let short_key = dir.path().join("short.key");
    std::fs::write(&short_key, "too short\n").unwrap();
    let data = server();
    let run = |src: &str, extra: &[&str]| {
        let mut c = Command::new(bin());
        c.arg("mount").arg(src).arg(&mnt).args(extra);
        c.args(["--s3-endpoint", &data.endpoint()]);
        c.env_remove("AWS_PROFILE")
            .env("HOME", "/nonexistent-l2arc-test-home");
        for (k, v) in data.aws_env() {
            c.env(k, v);
        }
        c.output().expect("run l2arc")
    };
    let local = dir.path().join("src");
    std::fs::create_dir_all(&local).unwrap();
    let out = run(local.to_str().unwrap(), &["--shared-cache", "s3://cache"]);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "needs an s3:// source");
    let s3 = format!("s3://{DATA}");
    let out = run(&s3, &["--shared-cache", "http://cache"]);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "expected s3://BUCKET[/PREFIX]");
    let out = run(&s3, &["--shared-cache", "s3://"]);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "no bucket name");
    let out = run(
        &s3,
        &[
            "--shared-cache",
            "s3://cache",
            "--shared-cache-key-file",
            short_key.to_str().unwrap(),
        ],
    );
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "at least 32");
    let missing = dir.path().join("missing.key");
    let out = run(
        &s3,
        &[
            "--shared-cache",
            "s3://cache",
            "--shared-cache-key-file",
            missing.to_str().unwrap(),
        ],
    );
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "missing.key");
    let out = run(
        &s3,
        &[
            "--shared-cache",
            "s3://cache",
            "--shared-cache-admit",
            "lru",
        ],
    );
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "all or mfu");
    for bad in ["0", "0.05", "601", "NaN", "inf"] {
        let out = run(
            &s3,
            &[
                "--shared-cache",
                "s3://cache",
                "--shared-cache-put-timeout",
                bad,
            ],
        );
        l2arc_testkit::assert_one_line_error(&out, "l2arc", "--shared-cache-put-timeout");
    }
    assert!(!l2arc_fuse::is_mounted(&mnt).unwrap());
}
