//! `l2arc serve-nbd` under a memory bomb: the service's memory stays within
//! the budget docs/nbd.md states, and a good client is served meanwhile.
//!
//! Why a separate test binary: it measures the server process's RSS
//! (`/proc/PID/status`), and it runs its own server process so that no other
//! test's memory is counted; it sits alone in this file so that the other
//! NBD tests do not compete with its clients for the two cores.

use std::path::Path;
use std::time::{Duration, Instant};

use l2arc_nbd::protocol::{NBD_CMD_READ, NBD_CMD_WRITE};
use l2arc_testkit::nbd::NbdClient;
use l2arc_testkit::service::{Running, Service};

const IMAGE_BYTES: usize = 64 << 20;
const ARC_MAX_BYTES: u64 = 32 << 20;
const POOL_BYTES: u64 = 128 << 20;
const MAX_CONNECTIONS: u64 = 64;
/// The fixed part of the formula in docs/nbd.md: program, libraries, the
/// cache's own structures and thread bookkeeping.
const FIXED_BYTES: u64 = 64 << 20;
const PAYLOAD_MAX_BYTES: u32 = 32 << 20;
const HOSTILE_CLIENTS: usize = 32;

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2])
        .collect()
}

/// What each open descriptor of `pid` points at (for a failure message).
fn fd_targets(pid: u32) -> Vec<String> {
    let mut targets: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|t| t.display().to_string())
        .collect();
    targets.sort();
    targets
}

fn threads_and_fds(pid: u32) -> (usize, usize) {
    let count = |dir: String| std::fs::read_dir(dir).unwrap().count();
    (
        count(format!("/proc/{pid}/task")),
        count(format!("/proc/{pid}/fd")),
    )
}

/// Connects and enters transmission on the default export, with a
/// minute's timeouts (the bomb makes the server slow on purpose).
fn open(socket: &Path) -> NbdClient {
    let c = NbdClient::open(socket).unwrap();
    c.set_timeout(Some(Duration::from_secs(60))).unwrap();
    c
}

/// `serve-nbd` with the bounds the budget is computed from; it has said
/// them in its memory line.
fn serve(dir: &Path) -> Running {
    let image = dir.join("disk.img");
    std::fs::write(&image, pattern(IMAGE_BYTES)).unwrap();
    let served = Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), &image)
        .listen_unix(&dir.join("nbd.sock"))
        .args(["--arc-max", &format!("{}MiB", ARC_MAX_BYTES >> 20)])
        .args(["--nbd-buffer-max", &format!("{}MiB", POOL_BYTES >> 20)])
        .args(["--max-connections", &MAX_CONNECTIONS.to_string()])
        .ready_within(Duration::from_secs(30))
        .start();
    let memory = served
        .next_line("l2arc: memory:", Duration::from_secs(5))
        .expect("a memory line after the ready line");
    assert!(
        memory.starts_with("l2arc: memory: arc_max 32 MiB"),
        "{memory}"
    );
    assert!(memory.contains("NBD buffers 128 MiB"), "{memory}");
    served
}

/// 32 connections that never read their replies: half ask for two 32 MiB
/// reads, half send a 32 MiB write one byte short. A good client reads and
/// checks its bytes meanwhile (small reads at once, large ones once the
/// stalled holders are reclaimed); the server's peak RSS stays within
/// arc_max + L2 index (none here) + the pool + the per-connection part +
/// the fixed part, and after the hostile clients leave, their threads and
/// descriptors are gone.
#[test]
#[allow(clippy::too_many_lines, reason = "a scenario that reads top to bottom")]
fn a_memory_bomb_of_clients_that_never_read_stays_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path());
    let pid = server.pid();
    // The baseline once the server serves: its accept loop opens the
    // image's inotify watch after the ready line, and on a loaded machine
    // a sample taken at once saw one thread and one descriptor fewer.
    let settled = Instant::now() + Duration::from_secs(10);
    while !fd_targets(pid).iter().any(|t| t == "anon_inode:inotify") && Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (threads_before, fds_before) = threads_and_fds(pid);
    let fd_targets_before = fd_targets(pid);
    let (rss_before_bytes, _) = l2arc_testkit::rss_and_peak_bytes(pid);
    let budget_bytes = ARC_MAX_BYTES
        + POOL_BYTES
        + MAX_CONNECTIONS * l2arc_nbd::server::CONNECTION_FIXED_BYTES
        + FIXED_BYTES;

    let mut hostile = Vec::new();
    for i in 0..HOSTILE_CLIENTS {
        let mut s = open(server.socket());
        let keep = s.try_clone().unwrap();
        let t = std::thread::spawn(move || {
            if i % 2 == 0 {
                // Four such replies fill exactly the seven eighths of the
                // pool that large charges may use, so the good client's
                // large reads find it full.
                let len = (POOL_BYTES * 7 / 8 / 4) as u32 - 16;
                let _ = s.send(NBD_CMD_READ, 0, 1, 0, len, &[]);
                let _ = s.send(NBD_CMD_READ, 0, 2, 32 << 20, len, &[]);
            } else {
                let short = vec![0x5a; PAYLOAD_MAX_BYTES as usize - 1];
                // Blocks while the server makes this client wait; the write
                // times out or fails when the connection is reclaimed.
                let _ = s.send(NBD_CMD_WRITE, 0, 3, 0, PAYLOAD_MAX_BYTES, &short);
            }
        });
        hostile.push((keep, t));
    }

    // Sample the server's RSS while the bomb sits there.
    let watch_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let stop = std::sync::Arc::clone(&watch_stop);
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(l2arc_testkit::rss_and_peak_bytes(pid).0);
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        })
    };
    std::thread::sleep(Duration::from_secs(2));

    // A good client is served meanwhile, every byte right.
    let image = pattern(IMAGE_BYTES);
    let started = Instant::now();
    let mut good = open(server.socket());
    for i in 0..32u64 {
        let offset = (i * 1_987_654) % (IMAGE_BYTES as u64 - 65536);
        let data = good.read(offset, 65536).unwrap();
        assert_eq!(data, image[offset as usize..offset as usize + 65536]);
    }
    let good_secs = started.elapsed().as_secs_f64();
    assert!(
        good_secs < 5.0,
        "small reads are served from the pool's reserved eighth at once; the good client waited {good_secs:.1} s for 32"
    );
    // Large reads need the part the bomb holds: served once the server has
    // reclaimed it from clients that stalled it.
    let started = Instant::now();
    for i in 0..2u64 {
        let (offset, len) = (i * (8 << 20), 8u32 << 20);
        let data = good.read(offset, len).unwrap();
        assert!(data == image[offset as usize..offset as usize + len as usize]);
    }
    let large_secs = started.elapsed().as_secs_f64();
    assert!(
        large_secs < 30.0,
        "the good client waited {large_secs:.1} s for two 8 MiB reads"
    );
    // Let the bomb sit a while longer, then measure.
    std::thread::sleep(Duration::from_secs(3));
    watch_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sampled_peak_bytes = watcher.join().unwrap();
    let (_, hwm_bytes) = l2arc_testkit::rss_and_peak_bytes(pid);
    eprintln!(
        "memory bomb: good client: 32 x 64 KiB in {good_secs:.2} s, 2 x 8 MiB in {large_secs:.2} s; server peak RSS {} MiB (sampled {} MiB), budget {} MiB",
        hwm_bytes >> 20,
        sampled_peak_bytes >> 20,
        budget_bytes >> 20
    );
    assert!(
        hwm_bytes <= budget_bytes,
        "peak RSS {} MiB over the budget {} MiB",
        hwm_bytes >> 20,
        budget_bytes >> 20
    );

    // The hostile clients leave: their threads and descriptors go.
    for (s, _) in &hostile {
        s.shutdown();
    }
    for (_, t) in hostile {
        t.join().unwrap();
    }
    drop(good);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (threads, fds) = threads_and_fds(pid);
        if threads <= threads_before && fds <= fds_before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "threads {threads_before} -> {threads}, descriptors {fds_before} -> {fds} after every client left: {fd_targets_before:?} -> {:?}",
            fd_targets(pid)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The allocator is trimmed at most once a second.
    std::thread::sleep(Duration::from_secs(3));
    let (rss_after_bytes, _) = l2arc_testkit::rss_and_peak_bytes(pid);
    eprintln!(
        "memory bomb: server RSS {} MiB before, {} MiB after the clients left",
        rss_before_bytes >> 20,
        rss_after_bytes >> 20
    );
    // What the hostile clients made the allocator take is given back
    // (glibc's arenas are trimmed once no buffer is charged): what stays
    // is the ARC they warmed and the fixed part.
    assert!(
        rss_after_bytes <= ARC_MAX_BYTES + (24 << 20),
        "RSS {} MiB after every client left: more than arc_max + 24 MiB",
        rss_after_bytes >> 20
    );
    // The stop line counts the connections reclaimed for the good client.
    let mut server = server;
    let stopped = server.stop_line();
    eprintln!("{stopped}");
    let reclaimed: u64 = stopped
        .split(", ")
        .find_map(|part| part.strip_suffix(" reclaimed"))
        .and_then(|n| n.rsplit(' ').next())
        .expect("a reclaimed count")
        .parse()
        .unwrap();
    assert!(
        reclaimed >= 1,
        "the full pool was freed for the good client by reclaiming stalled holders: {stopped}"
    );
}
