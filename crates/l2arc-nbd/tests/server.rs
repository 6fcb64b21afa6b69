//! The server over a Unix socket with an in-process client: handshake
//! variants, I/O through the cache, errors that keep the connection, and
//! hostile clients that lose only their own connection.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use l2arc_testkit::nbd::{NbdClient, NbdError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use l2arc::primary::image::ImagePrimary;
use l2arc::{Cache, CacheConfig, DatasetConfig};
use l2arc_nbd::protocol::*;
use l2arc_nbd::{ListenAddr, Listener, Server, ServerConfig};

const IMAGE_BYTES: usize = 4 << 20;

struct Running {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    image: PathBuf,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    server: Arc<Server>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2])
        .collect()
}

fn start(config: ServerConfig) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    std::fs::write(&image, pattern(IMAGE_BYTES)).unwrap();
    let (cache, handle) = image_cache(&image, !config.read_only, (8 << 20, 4), None);
    serve(dir, image, cache, handle, config)
}

/// A cache over `image` (64 KiB records) with `arc_max_bytes` of ARC in
/// `arc_shards` and, with `cache_device`, a cache file of 32 MiB there;
/// the image's handle.
fn image_cache(
    image: &Path,
    writable: bool,
    arc: (u64, usize),
    cache_device: Option<&Path>,
) -> (Arc<Cache>, l2arc::ObjectHandle) {
    let primary = Arc::new(ImagePrimary::open(image, writable).unwrap());
    primary_cache(primary, writable, arc, cache_device)
}

/// `image_cache` over any primary (a slowed-down image, say).
fn primary_cache(
    primary: Arc<dyn l2arc::primary::Primary>,
    writable: bool,
    (arc_max_bytes, arc_shards): (u64, usize),
    cache_device: Option<&Path>,
) -> (Arc<Cache>, l2arc::ObjectHandle) {
    let cache = Cache::new(
        CacheConfig::default()
            .arc_max_bytes(arc_max_bytes)
            .arc_shards(arc_shards),
    )
    .unwrap();
    if let Some(path) = cache_device {
        cache.add_cache_path(path, Some(32 << 20)).unwrap();
    }
    let ds = cache
        .add_dataset(
            "nbd",
            primary,
            DatasetConfig::default().recordsize_bytes(64 << 10),
        )
        .unwrap();
    let handle = cache.open(ds, "", writable).unwrap();
    (cache, handle)
}

/// Serves `handle` of `cache` on a Unix socket in `dir` until dropped.
fn serve(
    dir: tempfile::TempDir,
    image: PathBuf,
    cache: Arc<Cache>,
    handle: l2arc::ObjectHandle,
    config: ServerConfig,
) -> Running {
    let socket = dir.path().join("nbd.sock");
    let server = Arc::new(Server::new(cache, handle, config).unwrap());
    let listener = Listener::bind(&ListenAddr::Unix(socket.clone())).unwrap();
    let stop = server.stop_flag();
    let s = Arc::clone(&server);
    let thread = std::thread::spawn(move || s.serve(listener));
    Running {
        _dir: dir,
        socket,
        image,
        stop,
        thread: Some(thread),
        server,
    }
}

/// A client in transmission on the default export, whose size it checks.
fn open(socket: &Path) -> NbdClient {
    let mut c = NbdClient::connect(socket).unwrap();
    assert_eq!(c.go("").unwrap().size_bytes, IMAGE_BYTES as u64);
    c
}

/// The data of `NBD_OPT_INFO` for export `name`, asking for block sizes.
fn info(name: &str) -> Vec<u8> {
    let mut data = Vec::new();
    encode_info_request(&mut data, name, &[NBD_INFO_BLOCK_SIZE]);
    data
}

/// 0 if the request succeeded, else the errno it was answered with.
fn errno(result: Result<(), NbdError>) -> u32 {
    match result {
        Ok(()) => 0,
        Err(e) => e.errno().unwrap_or_else(|| panic!("no errno reply: {e}")),
    }
}

/// One reply to a read, in any order: checks it succeeded with the
/// bytes of `image` at what `requested(cookie)` says the read asked
/// for (offset, length); returns the cookie.
fn check_read_reply(
    c: &mut NbdClient,
    image: &[u8],
    requested: impl FnOnce(u64) -> (u64, u32),
) -> u64 {
    let SimpleReply { cookie, error } = c.reply().unwrap();
    assert_eq!(error, 0, "cookie {cookie}");
    let (offset, len) = requested(cookie);
    let mut data = vec![0u8; len as usize];
    c.read_data(&mut data).unwrap();
    assert_eq!(
        data,
        image[offset as usize..][..len as usize],
        "{offset}+{len}"
    );
    cookie
}

#[test]
fn handshake_variants() {
    let srv = start(ServerConfig {
        export_name: "disk".into(),
        ..ServerConfig::default()
    });
    // LIST names the export; unknown options are refused and haggling goes on.
    let mut c = NbdClient::connect(&srv.socket).unwrap();
    c.send_option(NBD_OPT_LIST, &[]).unwrap();
    let (ty, data) = c.option_reply(NBD_OPT_LIST).unwrap();
    assert_eq!((ty, &data[4..]), (NBD_REP_SERVER, &b"disk"[..]));
    assert_eq!(c.option_reply(NBD_OPT_LIST).unwrap().0, NBD_REP_ACK);
    c.send_option(NBD_OPT_STRUCTURED_REPLY, &[]).unwrap();
    assert_eq!(
        c.option_reply(NBD_OPT_STRUCTURED_REPLY).unwrap().0,
        NBD_REP_ERR_UNSUP
    );
    c.send_option(NBD_OPT_INFO, &info("disk")).unwrap();
    let mut saw_block_size = false;
    loop {
        let (ty, data) = c.option_reply(NBD_OPT_INFO).unwrap();
        if ty == NBD_REP_ACK {
            break;
        }
        if data[0..2] == NBD_INFO_BLOCK_SIZE.to_be_bytes() {
            let v: Vec<u32> = data[2..]
                .chunks(4)
                .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(v, vec![1, 4096, PAYLOAD_MAX_BYTES_DEFAULT]);
            saw_block_size = true;
        }
    }
    assert!(saw_block_size);
    assert_eq!(
        c.go("other").unwrap_err().refusal(),
        Some(NBD_REP_ERR_UNKNOWN)
    );
    let export = c.go("disk").unwrap();
    let flags = export.transmission_flags;
    assert_eq!(export.size_bytes, IMAGE_BYTES as u64);
    assert_ne!(flags & NBD_FLAG_CAN_MULTI_CONN, 0);
    assert_eq!(flags & NBD_FLAG_READ_ONLY, 0);
    assert_eq!(c.read(0, 4096).unwrap(), pattern(4096));

    // EXPORT_NAME (old style entry), without zeroes.
    let mut c = NbdClient::connect(&srv.socket).unwrap();
    assert_eq!(
        c.export_name("disk").unwrap().size_bytes,
        IMAGE_BYTES as u64
    );
    assert_eq!(c.read(4096, 100).unwrap(), pattern(4196)[4096..]);
    // EXPORT_NAME of an unknown export: the session ends.
    let mut c = NbdClient::connect(&srv.socket).unwrap();
    c.send_option(NBD_OPT_EXPORT_NAME, b"nope").unwrap();
    assert!(c.closed());
    // ABORT is acknowledged, then the connection closes.
    let mut c = NbdClient::connect(&srv.socket).unwrap();
    c.send_option(NBD_OPT_ABORT, &[]).unwrap();
    assert_eq!(c.option_reply(NBD_OPT_ABORT).unwrap().0, NBD_REP_ACK);
    assert!(c.closed());
}

#[test]
fn reads_writes_trim_and_zeroes_go_through_the_cache() {
    let srv = start(ServerConfig::default());
    let mut a = open(&srv.socket);
    let mut b = open(&srv.socket);
    let image = pattern(IMAGE_BYTES);
    assert_eq!(a.read(100_000, 200_000).unwrap(), image[100_000..300_000]);
    // A write on one connection is seen by a read on another (multi-conn).
    let data = vec![0xabu8; 10_000];
    assert_eq!(
        errno(a.command(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 123_456, 10_000, &data)),
        0
    );
    assert_eq!(b.read(123_456, 10_000).unwrap(), data);
    assert_eq!(errno(b.command(NBD_CMD_FLUSH, 0, 0, 0, &[])), 0);
    let on_disk = std::fs::read(&srv.image).unwrap();
    assert_eq!(on_disk[123_456..133_456], data[..]);
    // TRIM then reads zeros (the image file is on a file system that punches holes).
    assert_eq!(
        a.read(1 << 20, 65536).unwrap(),
        image[1 << 20..(1 << 20) + 65536]
    );
    assert_eq!(errno(a.command(NBD_CMD_TRIM, 0, 1 << 20, 65536, &[])), 0);
    assert_eq!(b.read(1 << 20, 65536).unwrap(), vec![0u8; 65536]);
    // WRITE_ZEROES with and without NO_HOLE.
    for (flags, at) in [(0, 2 << 20), (NBD_CMD_FLAG_NO_HOLE, 3 << 20)] {
        assert_eq!(
            a.read(at, 5000).unwrap(),
            image[at as usize..at as usize + 5000]
        );
        assert_eq!(
            errno(a.command(NBD_CMD_WRITE_ZEROES, flags, at, 5000, &[])),
            0
        );
        assert_eq!(
            b.read(at - 10, 5020).unwrap()[10..5010],
            vec![0u8; 5000][..]
        );
    }
    // CACHE (prefetch) is accepted.
    assert_eq!(errno(a.command(NBD_CMD_CACHE, 0, 0, 1 << 20, &[])), 0);
    // Pipelined requests come back, each whole, matched by cookie.
    for i in 0..32u64 {
        a.send(NBD_CMD_READ, 0, 1000 + i, i * 65536, 4096, &[])
            .unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..32 {
        let SimpleReply { cookie, error } = a.reply().unwrap();
        assert_eq!(error, 0);
        let mut d = vec![0u8; 4096];
        a.read_data(&mut d).unwrap();
        let i = (cookie - 1000) as usize;
        assert!(seen.insert(i));
        let now = std::fs::read(&srv.image).unwrap();
        assert_eq!(d, now[i * 65536..i * 65536 + 4096]);
    }
    a.disconnect().unwrap();
    assert!(a.closed());
}

#[test]
fn out_of_range_requests_get_errors_and_others_keep_working() {
    let srv = start(ServerConfig {
        max_payload_bytes: 1 << 20,
        max_in_flight_bytes: 4 << 20,
        ..ServerConfig::default()
    });
    let mut bad = open(&srv.socket);
    let mut good = open(&srv.socket);
    let size = IMAGE_BYTES as u64;
    assert_eq!(
        bad.read(size - 10, 20).unwrap_err().errno(),
        Some(NBD_EINVAL)
    );
    assert_eq!(
        bad.read(u64::MAX - 5, 20).unwrap_err().errno(),
        Some(NBD_EINVAL)
    );
    assert_eq!(
        errno(bad.command(NBD_CMD_WRITE, 0, size - 1, 2, b"xy")),
        NBD_ENOSPC
    );
    assert_eq!(
        errno(bad.command(NBD_CMD_TRIM, 0, size, 1, &[])),
        NBD_ENOSPC
    );
    assert_eq!(
        errno(bad.command(NBD_CMD_WRITE_ZEROES, 0, 1, u32::MAX, &[])),
        NBD_ENOSPC
    );
    assert_eq!(errno(bad.command(77, 0, 0, 0, &[])), NBD_EINVAL);
    assert_eq!(
        errno(bad.command(NBD_CMD_READ, 0xff00, 0, 1, &[])),
        NBD_EINVAL
    );
    // A write past the end: its payload is skipped, the stream stays in step.
    let big = vec![1u8; (1 << 20) + 4096];
    assert_eq!(
        errno(bad.command(NBD_CMD_WRITE, 0, size - 4096, big.len() as u32, &big)),
        NBD_ENOSPC
    );
    assert_eq!(good.read(0, 4096).unwrap(), pattern(4096));
    assert_eq!(
        bad.read(size - 4096, 4096).unwrap(),
        pattern(IMAGE_BYTES)[IMAGE_BYTES - 4096..]
    );
    assert_eq!(
        std::fs::read(&srv.image).unwrap(),
        pattern(IMAGE_BYTES),
        "nothing was written"
    );
}

#[test]
fn garbage_disconnects_only_that_client() {
    let srv = start(ServerConfig::default());
    let mut good = open(&srv.socket);
    let mut bad = open(&srv.socket);
    bad.stream()
        .write_all(b"this is not an NBD request, not at all")
        .unwrap();
    assert!(bad.closed());
    assert_eq!(good.read(8192, 4096).unwrap(), pattern(12288)[8192..]);
    // A client that connects and says nothing does not hold up anyone.
    let _silent = UnixStream::connect(&srv.socket).unwrap();
    let mut late = open(&srv.socket);
    assert_eq!(late.read(0, 10).unwrap(), pattern(10));
    assert!(srv.server.stats().protocol_errors >= 1);
}

#[test]
fn read_only_refuses_changes() {
    let srv = start(ServerConfig {
        read_only: true,
        ..ServerConfig::default()
    });
    let mut c = NbdClient::connect(&srv.socket).unwrap();
    let flags = c.go("").unwrap().transmission_flags;
    assert_ne!(flags & NBD_FLAG_READ_ONLY, 0);
    assert_eq!(flags & NBD_FLAG_SEND_TRIM, 0);
    assert_eq!(errno(c.command(NBD_CMD_WRITE, 0, 0, 3, b"abc")), NBD_EPERM);
    assert_eq!(errno(c.command(NBD_CMD_TRIM, 0, 0, 4096, &[])), NBD_EPERM);
    assert_eq!(
        errno(c.command(NBD_CMD_WRITE_ZEROES, 0, 0, 4096, &[])),
        NBD_EPERM
    );
    assert_eq!(errno(c.command(NBD_CMD_FLUSH, 0, 0, 0, &[])), 0);
    assert_eq!(c.read(0, 3).unwrap(), pattern(3));
    assert_eq!(std::fs::read(&srv.image).unwrap(), pattern(IMAGE_BYTES));
}

#[test]
fn connection_limit_holds() {
    let srv = start(ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    });
    let mut a = open(&srv.socket);
    let _b = open(&srv.socket);
    // A third is told why it is turned away, in an error reply to its
    // option (both others are busy: they just finished their handshakes).
    let mut third = NbdClient::connect(&srv.socket).unwrap();
    let NbdError::Refused {
        reply_type,
        message,
    } = third.go("").unwrap_err()
    else {
        panic!("the third client was not refused");
    };
    assert_eq!(reply_type, NBD_REP_ERR_POLICY);
    assert!(
        message.contains("all 2 connections are in use"),
        "{message}"
    );
    assert_eq!(srv.server.stats().connections_refused, 1);
    assert_eq!(a.read(0, 10).unwrap(), pattern(10));
    drop(a);
    // A slot frees once a client leaves.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if NbdClient::greeted(&srv.socket).is_ok() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "slot never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn corpus_against_a_live_server() {
    let srv = start(ServerConfig {
        handshake_timeout: Duration::from_secs(2),
        ..ServerConfig::default()
    });
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 10);
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        let mut greeted = NbdClient::greeted(&srv.socket).unwrap();
        let s = greeted.stream();
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        // Whatever the server answers, it ends the connection (EOF from us,
        // a protocol error, or the handshake deadline).
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
        let mut c = open(&srv.socket);
        assert_eq!(
            c.read(0, 64).unwrap(),
            pattern(64),
            "after {}",
            path.display()
        );
    }
    assert_eq!(std::fs::read(&srv.image).unwrap().len(), IMAGE_BYTES);
}

/// Whether the server has closed `c` (an open but quiet connection reads
/// nothing for 300 ms).
fn is_closed(c: &mut NbdClient) -> bool {
    c.closed_within(Duration::from_millis(300))
}

#[test]
fn idle_holders_cannot_lock_out_a_new_client() {
    let srv = start(ServerConfig {
        max_connections: 4,
        ..ServerConfig::default()
    });
    let mut holders: Vec<NbdClient> = (0..4).map(|_| open(&srv.socket)).collect();
    // Past the quiet time after which an idle holder gives up its slot.
    std::thread::sleep(Duration::from_millis(2500));
    let mut newcomer = open(&srv.socket);
    assert_eq!(newcomer.read(0, 4096).unwrap(), pattern(4096));
    let closed: Vec<bool> = holders.iter_mut().map(is_closed).collect();
    assert_eq!(
        closed.iter().filter(|&&c| c).count(),
        1,
        "exactly one idle holder gives way"
    );
    assert_eq!(srv.server.stats().connections_evicted, 1);
    // The others keep working.
    for (c, _) in holders.iter_mut().zip(&closed).filter(|(_, c)| !**c) {
        assert_eq!(c.read(4096, 512).unwrap(), pattern(4096 + 512)[4096..]);
    }
}

#[test]
fn quiet_clients_are_disconnected_after_the_idle_timeout() {
    let srv = start(ServerConfig {
        idle_timeout: Duration::from_secs(1),
        ..ServerConfig::default()
    });
    let mut quiet = open(&srv.socket);
    let mut busy = open(&srv.socket);
    for i in 0..6u64 {
        assert_eq!(
            busy.read(i * 512, 512).unwrap(),
            pattern(4096)[(i * 512) as usize..][..512]
        );
        std::thread::sleep(Duration::from_millis(400));
    }
    assert!(
        is_closed(&mut quiet),
        "a client quiet for the idle timeout stays connected"
    );
    assert!(!is_closed(&mut busy), "an active client was disconnected");
    assert_eq!(busy.read(0, 16).unwrap(), pattern(16));
    assert_eq!(srv.server.stats().connections_idle_closed, 1);
}

#[test]
fn a_burst_of_too_many_options_gets_every_reply_due_before_the_close() {
    let srv = start(ServerConfig::default());
    let mut c = NbdClient::connect(&srv.socket).unwrap();
    let mut burst = Vec::new();
    for _ in 0..=OPTIONS_MAX {
        encode_option(&mut burst, NBD_OPT_LIST, &[]);
    }
    c.stream().write_all(&burst).unwrap();
    for i in 0..OPTIONS_MAX {
        // NBD_OPT_LIST: one NBD_REP_SERVER for the export, then the ACK.
        let (first, _) = c.option_reply(NBD_OPT_LIST).unwrap();
        assert_ne!(first, NBD_REP_ACK, "option {i}: the export is listed first");
        let (ack, _) = c.option_reply(NBD_OPT_LIST).unwrap();
        assert_eq!(ack, NBD_REP_ACK, "option {i}");
    }
    assert!(
        c.closed(),
        "the option past the limit closes the connection"
    );
}

/// Requests over the advertised maximum payload are served by splitting
/// (as the reference nbd-server serves them, and as nbd-tester-client's
/// `integrityhuge` expects), with one piece of buffer memory at a time; the
/// connection stays usable, and requests outside the export still get
/// their errors with the stream in step.
#[test]
fn oversized_requests_are_served_by_splitting_and_the_connection_stays_usable() {
    let max_payload = 1u32 << 20;
    let srv = start(ServerConfig {
        max_payload_bytes: max_payload,
        max_in_flight_bytes: 2 << 20,
        buffer_max_bytes: 2 << 20,
        ..ServerConfig::default()
    });
    let mut c = open(&srv.socket);
    let image = pattern(IMAGE_BYTES);
    // A read of 3.5 pieces, unaligned, then a small one behind it.
    let (at, len) = (12_345usize, 3 * (1 << 20) + (1 << 19));
    assert_eq!(c.read(at as u64, len as u32).unwrap(), image[at..at + len]);
    assert_eq!(c.read(0, 4096).unwrap(), image[..4096]);
    // A write of 3 pieces and a bit (FUA), pipelined with a read behind it.
    let data: Vec<u8> = (0..3 * (1 << 20) + 777).map(|i| (i % 251) as u8).collect();
    c.send(
        NBD_CMD_WRITE,
        NBD_CMD_FLAG_FUA,
        1,
        100,
        data.len() as u32,
        &data,
    )
    .unwrap();
    c.send(NBD_CMD_READ, 0, 2, IMAGE_BYTES as u64 - 4096, 4096, &[])
        .unwrap();
    let mut replies = std::collections::HashMap::new();
    for _ in 0..2 {
        let SimpleReply { cookie, error } = c.reply().unwrap();
        assert_eq!(error, 0);
        if cookie == 2 {
            let mut d = vec![0u8; 4096];
            c.read_data(&mut d).unwrap();
            assert_eq!(d, image[IMAGE_BYTES - 4096..]);
        }
        replies.insert(cookie, error);
    }
    assert_eq!(replies.len(), 2);
    let on_disk = std::fs::read(&srv.image).unwrap();
    assert_eq!(on_disk[100..100 + data.len()], data[..]);
    let mut other = open(&srv.socket);
    assert_eq!(
        other.read(100, data.len() as u32).unwrap(),
        data,
        "a second connection reads the split write back"
    );
    // Oversized and outside the export: errors, the stream stays in step.
    let big = vec![9u8; 3 << 20];
    assert_eq!(
        errno(c.command(
            NBD_CMD_WRITE,
            0,
            (IMAGE_BYTES - (1 << 20)) as u64,
            big.len() as u32,
            &big
        )),
        NBD_ENOSPC
    );
    assert_eq!(
        c.read((IMAGE_BYTES - (1 << 20)) as u64, 3 << 20)
            .unwrap_err()
            .errno(),
        Some(NBD_EINVAL)
    );
    assert_eq!(c.read(0, 4096).unwrap(), on_disk[..4096]);
    let stats = srv.server.stats();
    assert_eq!(stats.requests_split, 3, "{stats:?}");
    assert!(
        stats.buffer_high_water_bytes <= 2 << 20,
        "never more than the pool: {stats:?}"
    );
    assert_eq!(stats.protocol_errors, 0);
}

/// Pipelined reads on one connection: those of data the cache holds are
/// served by the connection's read-queue thread, those that need the image
/// by the workers, and every reply carries its own request's bytes, in any
/// order. With `read_queue_depth` 0 the workers serve every read.
#[test]
fn pipelined_reads_of_cached_data_go_through_the_read_queue() {
    for depth in [64, 0] {
        let srv = start(ServerConfig {
            read_queue_depth: depth,
            ..ServerConfig::default()
        });
        let image = pattern(IMAGE_BYTES);
        let mut c = open(&srv.socket);
        // The first 1 MiB into the ARC (the ARC holds 8 MiB).
        for at in (0..1 << 20).step_by(64 << 10) {
            assert_eq!(
                c.read(at, 64 << 10).unwrap(),
                image[at as usize..][..64 << 10]
            );
        }
        let before = srv.server.stats();
        // 48 reads in flight at once: 32 of cached data, 16 of the rest.
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut expected = std::collections::HashMap::new();
        for cookie in 0..48u64 {
            let (base, span) = if cookie < 32 {
                (0, 1 << 20)
            } else {
                (1 << 20, IMAGE_BYTES as u64 - (1 << 20))
            };
            let len = (next() % 3 + 1) as u32 * 4096 - (next() % 100) as u32;
            let offset = base + next() % (span - u64::from(len));
            c.send(NBD_CMD_READ, 0, cookie, offset, len, &[]).unwrap();
            expected.insert(cookie, (offset, len));
        }
        for _ in 0..48 {
            check_read_reply(&mut c, &image, |cookie| {
                expected.remove(&cookie).expect("one reply per request")
            });
        }
        let after = srv.server.stats();
        let (queued, passed_on) = (
            after.reads_queued - before.reads_queued,
            after.reads_passed_on - before.reads_passed_on,
        );
        if depth == 0 {
            assert_eq!((queued, passed_on), (0, 0), "{after:?}");
        } else {
            assert!(queued >= 32, "cached reads through the queue: {after:?}");
            assert!(
                passed_on >= 1,
                "reads of the image to the workers: {after:?}"
            );
            assert_eq!(queued + passed_on, 48, "{after:?}");
        }
        assert_eq!(after.request_errors, 0);
    }
}

/// Reads of records on flash claimed by the read queue while reads that
/// need the image (and cover the same records) fill the workers' queue:
/// a worker waits on a record the read queue is reading, so the read-queue
/// thread must never block handing reads to the workers (it alone can reap
/// that read). One worker and a workers' queue of two make the queue full
/// all the time; every reply must still come, with its bytes.
#[test]
fn reads_passed_on_to_busy_workers_never_wait_on_the_read_queue() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    let bytes = pattern(IMAGE_BYTES);
    std::fs::write(&image, &bytes).unwrap();
    let (cache, handle) = image_cache(
        &image,
        false,
        (1 << 20, 1),
        Some(&dir.path().join("cache.dev")),
    );
    feed_first_records(&cache, &handle, 32);
    let srv = serve(
        dir,
        image,
        cache,
        handle,
        ServerConfig {
            read_only: true,
            workers_per_connection: 1,
            max_in_flight_requests: 2,
            ..ServerConfig::default()
        },
    );
    let mut c = open(&srv.socket);
    let mut sender = c.try_clone().unwrap();
    // Pairs: 4 KiB inside flash record k (the read queue claims it), then
    // a read from inside record k to the uncached 3rd MiB (the workers).
    let requests: Vec<(u64, u32)> = (0..120u64)
        .flat_map(|i| {
            let k = i % 32;
            let at = k * (64 << 10);
            [
                (at + 4096, 4096),
                (at + 60_000, (3 << 20) - (at + 60_000) as u32),
            ]
        })
        .collect();
    let to_send = requests.clone();
    let writer = std::thread::spawn(move || {
        for (cookie, &(offset, len)) in to_send.iter().enumerate() {
            sender
                .send(NBD_CMD_READ, 0, cookie as u64, offset, len, &[])
                .unwrap();
        }
    });
    for _ in 0..requests.len() {
        check_read_reply(&mut c, &bytes, |cookie| requests[cookie as usize]);
    }
    writer.join().unwrap();
    let stats = srv.server.stats();
    assert!(
        stats.reads_queued > 0 && stats.reads_passed_on > 0,
        "{stats:?}"
    );
    drop(c);
}

/// Reads the image's first `records` (64 KiB each) twice and feeds them
/// to flash, so that at least half of them are there (a 1 MiB ARC holds 16).
fn feed_first_records(cache: &Cache, handle: &l2arc::ObjectHandle, records: u64) {
    let mut buf = vec![0u8; 64 << 10];
    for _ in 0..2 {
        for record in 0..records {
            cache.read(handle, record * (64 << 10), &mut buf).unwrap();
        }
        for _ in 0..8 {
            cache.feed_l2arc();
        }
    }
    let l2_bytes = cache.stats().l2.unwrap().get("l2_size");
    assert!(l2_bytes >= (records / 2) << 16, "{l2_bytes} bytes on flash");
}

/// Pipelined reads that all miss, on a primary that takes 200 ms a read:
/// a connection starts with 8 workers and starts another whenever all are
/// busy, so every read is on the primary at once (up to the bound), and
/// a quiet connection keeps its first 8.
#[test]
fn workers_grow_while_all_are_busy_up_to_the_bound() {
    use l2arc::primary::emulated_hdd::{EmulatedHdd, HddConfig};
    for workers_max in [32usize, 12] {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        let bytes = pattern(IMAGE_BYTES);
        std::fs::write(&image, &bytes).unwrap();
        let slow = EmulatedHdd::new(
            Arc::new(ImagePrimary::open(&image, false).unwrap()),
            HddConfig::constant(64, 200.0),
        )
        .unwrap();
        let (cache, handle) = primary_cache(Arc::new(slow), false, (8 << 20, 4), None);
        let srv = serve(
            dir,
            image,
            cache,
            handle,
            ServerConfig {
                workers_per_connection: workers_max,
                ..ServerConfig::default()
            },
        );
        let mut quiet = open(&srv.socket);
        assert_eq!(quiet.read(0, 4096).unwrap(), bytes[..4096]);
        let initial = l2arc_nbd::server::WORKERS_INITIAL as u64;
        assert_eq!(
            srv.server.stats().workers_started,
            initial,
            "a quiet connection"
        );
        let mut c = open(&srv.socket);
        // 32 reads of 32 other records (the image has 64), all at once.
        for cookie in 1..=32u64 {
            c.send(NBD_CMD_READ, 0, cookie, cookie << 16, 4096, &[])
                .unwrap();
        }
        for _ in 0..32 {
            check_read_reply(&mut c, &bytes, |cookie| (cookie << 16, 4096));
        }
        let started = srv.server.stats().workers_started - initial;
        if workers_max == 32 {
            assert!(
                started >= 24,
                "32 slow misses in flight start workers past the first ones: {started}"
            );
        } else {
            assert_eq!(started, 12, "never past --workers");
        }
        drop(quiet);
    }
}
