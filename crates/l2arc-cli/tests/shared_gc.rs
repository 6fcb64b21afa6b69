//! `l2arc shared-cache gc` against a real S3 server (versitygw, started
//! per test by l2arc-testkit; missing, the tests fail): a cache prefix of
//! 40 blocks of known sizes and ages (versitygw's posix back end reports a
//! file's mtime as the object's last-modified, so the test sets it rather
//! than sleep between puts) beside objects that are not blocks, inside the
//! prefix and out of it. `--max-size` deletes exactly the oldest blocks
//! down to the bound, `--max-age` exactly the older batch, `--dry-run`
//! nothing, and no other object is ever touched; a block the store refuses
//! to delete is counted and the others still go (exit code nonzero); a bad
//! URL, an unreachable endpoint, a missing bucket, a bad size or duration
//! fail in a clear line.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime};

use l2arc_testkit::s3::{FaultProxy, S3Server};

const BUCKET: &str = "cache";
const PREFIX: &str = "fleet/c1";

/// The 64-hex-digit directory of block `i` (distinct, not in key order of
/// age, so that the listing's order is not the age order).
fn hash_hex(i: usize) -> String {
    let x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("{x:016x}").repeat(4)
}

/// A block: its key under the prefix, its size, its age.
struct TestBlock {
    rel: String,
    size_bytes: usize,
    age: Duration,
}

/// Puts `blocks` under `prefix` and sets each one's last-modified.
fn put_blocks(server: &S3Server, prefix: &str, blocks: &[TestBlock]) {
    for (i, b) in blocks.iter().enumerate() {
        let key = join(prefix, &b.rel);
        server.put(BUCKET, &key, &vec![i as u8; b.size_bytes]);
        set_age(server, &key, b.age);
    }
}

fn join(prefix: &str, rel: &str) -> String {
    if prefix.is_empty() {
        rel.to_string()
    } else {
        format!("{prefix}/{rel}")
    }
}

fn object_path(server: &S3Server, key: &str) -> PathBuf {
    server.data_dir().join(BUCKET).join(key)
}

fn exists(server: &S3Server, key: &str) -> bool {
    object_path(server, key).is_file()
}

/// versitygw's posix back end: an object is a file, its last-modified the
/// file's mtime.
fn set_age(server: &S3Server, key: &str, age: Duration) {
    let path = object_path(server, key);
    let file = std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.set_modified(SystemTime::now() - age).unwrap();
}

/// 40 blocks, block i `1000 + 37 i` bytes and `40 - i` minutes old (block
/// 0 the oldest).
fn forty_blocks() -> Vec<TestBlock> {
    (0..40)
        .map(|i| TestBlock {
            rel: format!("{}/{}", hash_hex(i), i % 7),
            size_bytes: 1000 + 37 * i,
            age: Duration::from_secs(60 * (40 - i as u64)),
        })
        .collect()
}

/// Keys under the prefix that are not blocks, and keys outside it (block
/// keys of another prefix, and at the bucket's root); all older than any
/// block, so that a gc that took them for blocks would delete them first.
fn others(prefix: &str) -> (Vec<String>, Vec<String>) {
    let hex = hash_hex(1000);
    let inside = vec![
        join(prefix, "readme.txt"),
        join(prefix, &format!("{hex}/01")),
        join(prefix, &format!("{}/1", hex.to_uppercase())),
        join(prefix, &format!("x/{hex}/1")),
        join(prefix, &format!("{}/1", &hex[1..])),
    ];
    let outside = vec![
        format!("fleet/other/{hex}/1"),
        format!("{hex}/2"),
        "data/file.bin".to_string(),
    ];
    (inside, outside)
}

fn put_others(server: &S3Server, keys: &[String]) {
    for key in keys {
        server.put(BUCKET, key, b"not a block");
        set_age(server, key, Duration::from_secs(30 * 86_400));
    }
}

fn gc(server: &S3Server, endpoint: &str, uri: &str, extra: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_l2arc"));
    c.args(["shared-cache", "gc", uri])
        .args(["--s3-endpoint", endpoint])
        .args(extra)
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ENDPOINT_URL_S3")
        .env("HOME", "/nonexistent-l2arc-test-home");
    for (k, v) in server.aws_env() {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// Runs gc, expects success and returns its one line of output.
fn gc_ok(server: &S3Server, uri: &str, extra: &[&str]) -> String {
    let out = gc(server, &server.endpoint(), uri, extra);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "gc {extra:?} failed ({}): {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    stdout.trim_end().to_string()
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn setup() -> S3Server {
    let server = S3Server::start();
    server.create_bucket(BUCKET);
    server
}

#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn gc_deletes_exactly_the_oldest_blocks_down_to_max_size_and_nothing_else() {
    let server = setup();
    let blocks = forty_blocks();
    put_blocks(&server, PREFIX, &blocks);
    let (inside, outside) = others(PREFIX);
    put_others(&server, &inside);
    put_others(&server, &outside);
    let total: usize = blocks.iter().map(|b| b.size_bytes).sum();
    // Keep the 25 youngest: the bound is their size exactly.
    let kept: usize = blocks[15..].iter().map(|b| b.size_bytes).sum();
    let uri = format!("s3://{BUCKET}/{PREFIX}");
    let max_size = kept.to_string();

    let dry = gc_ok(&server, &uri, &["--max-size", &max_size, "--dry-run"]);
    let victims = total - kept;
    assert_eq!(
        dry,
        format!(
            "shared-cache gc {uri} (dry run): 40 blocks, {} before; would delete 15 blocks, {} (0 by age, 15 by size); 25 blocks, {} after; {} other objects left alone; nothing was deleted",
            mib(total),
            mib(victims),
            mib(kept),
            inside.len()
        )
    );
    for b in &blocks {
        assert!(
            exists(&server, &join(PREFIX, &b.rel)),
            "dry run deleted {}",
            b.rel
        );
    }

    // Through a proxy that counts requests: the 15 deletes go in one
    // DeleteObjects request (a POST; the check and the listing are GETs).
    let proxy = FaultProxy::start(server.addr());
    let out = gc(&server, &proxy.endpoint(), &uri, &["--max-size", &max_size]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
    let counts = proxy.counts();
    assert_eq!(
        counts.requests - counts.gets - counts.heads,
        1,
        "{counts:?}"
    );
    assert_eq!(
        line,
        format!(
            "shared-cache gc {uri}: 40 blocks, {} before; deleted 15 blocks, {} (0 by age, 15 by size); 25 blocks, {} now; {} other objects left alone",
            mib(total),
            mib(victims),
            mib(kept),
            inside.len()
        )
    );
    for (i, b) in blocks.iter().enumerate() {
        let there = exists(&server, &join(PREFIX, &b.rel));
        assert_eq!(
            there,
            i >= 15,
            "block {i} ({} min old)",
            b.age.as_secs() / 60
        );
    }
    let left: usize = blocks
        .iter()
        .filter(|b| exists(&server, &join(PREFIX, &b.rel)))
        .map(|b| b.size_bytes)
        .sum();
    assert!(left <= kept);
    for key in inside.iter().chain(&outside) {
        assert!(
            exists(&server, key),
            "{key} is not a block of {uri} and went"
        );
    }

    // Under the bound now: a second run deletes nothing.
    let again = gc_ok(&server, &uri, &["--max-size", &max_size]);
    assert!(
        again.contains("; deleted 0 blocks, 0.0 MiB (0 by age, 0 by size); 25 blocks"),
        "{again}"
    );
    // One byte less: the next oldest goes, and only it.
    let line = gc_ok(&server, &uri, &["--max-size", &(kept - 1).to_string()]);
    assert!(line.contains("; deleted 1 blocks,"), "{line}");
    assert!(!exists(&server, &join(PREFIX, &blocks[15].rel)));
    assert!(exists(&server, &join(PREFIX, &blocks[16].rel)));
}

#[test]
fn gc_max_age_deletes_exactly_the_older_batch() {
    let server = setup();
    let old: Vec<TestBlock> = (0..12)
        .map(|i| TestBlock {
            rel: format!("{}/{i}", hash_hex(i)),
            size_bytes: 4096,
            age: Duration::from_secs(3 * 86_400 + 60 * i as u64),
        })
        .collect();
    let young: Vec<TestBlock> = (12..40)
        .map(|i| TestBlock {
            rel: format!("{}/{i}", hash_hex(i)),
            size_bytes: 4096,
            // 84 to 138 minutes old, 2 minutes apart.
            age: Duration::from_secs(3_600 + 120 * i as u64),
        })
        .collect();
    put_blocks(&server, PREFIX, &old);
    put_blocks(&server, PREFIX, &young);
    let uri = format!("s3://{BUCKET}/{PREFIX}");

    let dry = gc_ok(
        &server,
        &uri,
        &["--max-size", "1TiB", "--max-age", "2d", "--dry-run"],
    );
    assert!(
        dry.contains("would delete 12 blocks, 0.0 MiB (12 by age, 0 by size)"),
        "{dry}"
    );
    assert!(old.iter().all(|b| exists(&server, &join(PREFIX, &b.rel))));

    let line = gc_ok(&server, &uri, &["--max-size", "1TiB", "--max-age", "2d"]);
    assert!(
        line.contains("40 blocks, 0.2 MiB before; deleted 12 blocks, 0.0 MiB (12 by age, 0 by size); 28 blocks"),
        "{line}"
    );
    for b in &old {
        assert!(
            !exists(&server, &join(PREFIX, &b.rel)),
            "{} is 3 days old",
            b.rel
        );
    }
    for b in &young {
        assert!(
            exists(&server, &join(PREFIX, &b.rel)),
            "{} is hours old",
            b.rel
        );
    }
    // Both bounds: older than 101 minutes are young[9..] (102 to 138
    // minutes; young[8] is 100, clear of the bound), 19 by age; then the 4
    // oldest of the 9 left, by size, down to 5 blocks.
    let line = gc_ok(
        &server,
        &uri,
        &["--max-size", &(5 * 4096).to_string(), "--max-age", "101m"],
    );
    assert!(
        line.contains("deleted 23 blocks, 0.1 MiB (19 by age, 4 by size); 5 blocks"),
        "{line}"
    );
    for (i, b) in young.iter().enumerate() {
        assert_eq!(
            exists(&server, &join(PREFIX, &b.rel)),
            i < 5,
            "young block {i}"
        );
    }
}

#[test]
fn gc_of_a_whole_bucket_touches_only_block_keys_at_its_root() {
    let server = setup();
    let blocks: Vec<TestBlock> = forty_blocks().into_iter().take(10).collect();
    put_blocks(&server, "", &blocks);
    let (inside, outside) = others(PREFIX);
    put_others(&server, &inside);
    put_others(&server, &outside);
    let uri = format!("s3://{BUCKET}");
    let line = gc_ok(&server, &uri, &["--max-size", "0"]);
    // Every block at the root goes; of the others, `HEX/2` at the root is a
    // block key too (and goes); nothing else does.
    assert!(line.contains("11 blocks,"), "{line}");
    assert!(line.contains("deleted 11 blocks,"), "{line}");
    assert!(
        line.ends_with(&format!(
            "0 blocks, 0.0 MiB now; {} other objects left alone",
            inside.len() + 2
        )),
        "{line}"
    );
    for b in &blocks {
        assert!(!exists(&server, &b.rel), "{}", b.rel);
    }
    for key in inside.iter().chain(&outside[..1]).chain(&outside[2..]) {
        assert!(
            exists(&server, key),
            "{key} is not a block at the root and went"
        );
    }
}

#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn gc_fails_clearly_on_a_bad_url_an_unreachable_endpoint_a_missing_bucket_and_bad_bounds() {
    let server = setup();
    let key = format!("{PREFIX}/{}/0", hash_hex(0));
    server.put(BUCKET, &key, b"block");
    let ok_uri = format!("s3://{BUCKET}/{PREFIX}");
    let endpoint = server.endpoint();
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();

    let out = gc(
        &server,
        &endpoint,
        "http://cache/fleet",
        &["--max-size", "0"],
    );
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "not an s3:// URI");
    let out = gc(&server, &endpoint, "s3:///fleet", &["--max-size", "0"]);
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "no bucket name");
    let out = gc(
        &server,
        &endpoint,
        "s3://no-such-bucket/p",
        &["--max-size", "0"],
    );
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "NoSuchBucket");

    // Nothing listens there: a clear error, within the request bounds.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let start = Instant::now();
    let out = gc(
        &server,
        &dead,
        &ok_uri,
        &["--max-size", "0", "--s3-timeout", "1", "--s3-retries", "1"],
    );
    l2arc_testkit::assert_one_line_error(&out, "l2arc", &ok_uri);
    assert!(stderr(&out).contains("cannot reach"), "{}", stderr(&out));
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );

    for (flag, value, says) in [
        ("--max-size", "lots", "lots"),
        ("--max-age", "7x", "not a duration"),
        ("--max-age", "0d", "must be positive"),
    ] {
        let mut extra = vec![flag, value];
        if flag != "--max-size" {
            extra.extend(["--max-size", "1GiB"]);
        }
        let out = gc(&server, &endpoint, &ok_uri, &extra);
        assert!(!out.status.success(), "{flag} {value}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(says),
            "{flag} {value}: {}",
            stderr(&out)
        );
    }
    let out = gc(&server, &endpoint, &ok_uri, &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--max-size"), "{}", stderr(&out));
    // None of it deleted the block.
    assert!(exists(&server, &key));

    // A server that takes requests and never answers: the same, within
    // the request bounds.
    server.pause();
    let start = Instant::now();
    let out = gc(
        &server,
        &endpoint,
        &ok_uri,
        &["--max-size", "0", "--s3-timeout", "1", "--s3-retries", "1"],
    );
    l2arc_testkit::assert_one_line_error(&out, "l2arc", &ok_uri);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    server.resume();
    assert!(exists(&server, &key));
}

/// Clears the immutable flag it set, whatever the test's outcome (the
/// server's directory could not be removed otherwise).
struct Immutable(PathBuf);

impl Immutable {
    /// `chattr +i`: not even root can delete the file (versitygw's delete
    /// of that object fails), as a store that refuses one key.
    fn set(path: PathBuf) -> Immutable {
        let out = l2arc_testkit::tool("chattr", "e2fsprogs")
            .arg("+i")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "chattr +i {}: this test needs root and a file system with immutable files (ext4, xfs, btrfs): {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Immutable(path)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

#[test]
fn a_delete_refused_for_one_block_is_counted_and_the_others_still_go() {
    let server = setup();
    let blocks: Vec<TestBlock> = forty_blocks().into_iter().take(12).collect();
    put_blocks(&server, PREFIX, &blocks);
    let stuck = join(PREFIX, &blocks[2].rel);
    let _immutable = Immutable::set(object_path(&server, &stuck));
    let uri = format!("s3://{BUCKET}/{PREFIX}");
    // Keep the 4 youngest: 8 to delete, block 2 among them.
    let kept: usize = blocks[8..].iter().map(|b| b.size_bytes).sum();
    let out = gc(
        &server,
        &server.endpoint(),
        &uri,
        &["--max-size", &kept.to_string(), "--s3-retries", "1"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout} {stderr}");
    assert!(
        stdout.contains("12 blocks,") && stdout.contains("; deleted 7 blocks,"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(0 by age, 8 by size); 5 blocks,"),
        "{stdout}"
    );
    assert!(
        stdout.trim_end().ends_with("; 1 deletes failed"),
        "{stdout}"
    );
    l2arc_testkit::assert_one_line_error(&out, "l2arc", "1 of 8 deletes failed");
    assert!(stderr.contains(&blocks[2].rel), "{stderr}");
    for (i, b) in blocks.iter().enumerate() {
        let there = exists(&server, &join(PREFIX, &b.rel));
        assert_eq!(there, i >= 8 || i == 2, "block {i}");
    }
}
