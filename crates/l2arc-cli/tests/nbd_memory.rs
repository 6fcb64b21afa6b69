//! `l2arc serve-nbd` under a memory bomb: the service's memory stays within
//! the budget docs/nbd.md states, and a good client is served meanwhile.
//!
//! Why a separate test binary: it measures the server process's RSS
//! (`/proc/PID/status`), and it runs its own server process so that no other
//! test's memory is counted; it sits alone in this file so that the other
//! NBD tests do not compete with its clients for the two cores.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const IMAGE_BYTES: usize = 64 << 20;
const ARC_MAX_BYTES: u64 = 32 << 20;
const POOL_BYTES: u64 = 128 << 20;
const MAX_CONNECTIONS: u64 = 64;
/// The fixed part of the formula in docs/nbd.md: program, libraries, the
/// cache's own structures and thread bookkeeping.
const FIXED_BYTES: u64 = 64 << 20;
const PAYLOAD_MAX_BYTES: u32 = 32 << 20;
const HOSTILE_CLIENTS: usize = 32;

const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const NBD_OPT_GO: u32 = 7;
const NBD_REP_ACK: u32 = 1;
const NBD_CMD_READ: u16 = 0;
const NBD_CMD_WRITE: u16 = 1;

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2])
        .collect()
}

fn threads_and_fds(pid: u32) -> (usize, usize) {
    let count = |dir: String| std::fs::read_dir(dir).unwrap().count();
    (
        count(format!("/proc/{pid}/task")),
        count(format!("/proc/{pid}/fd")),
    )
}

/// Connects and enters transmission with NBD_OPT_GO on the default export.
fn open(socket: &Path) -> UnixStream {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
    let mut hello = 3u32.to_be_bytes().to_vec(); // fixed newstyle, no zeroes
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
    hello.extend_from_slice(&6u32.to_be_bytes());
    hello.extend_from_slice(&[0u8; 6]); // empty name, no info requests
    s.write_all(&hello).unwrap();
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        let reply_type = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let mut data = vec![0u8; len];
        s.read_exact(&mut data).unwrap();
        if reply_type == NBD_REP_ACK {
            return s;
        }
        assert!(reply_type < 1 << 31, "GO refused: {reply_type:#x}");
    }
}

fn request(command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut v = REQUEST_MAGIC.to_be_bytes().to_vec();
    v.extend_from_slice(&0u16.to_be_bytes());
    v.extend_from_slice(&command.to_be_bytes());
    v.extend_from_slice(&cookie.to_be_bytes());
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(&length.to_be_bytes());
    v
}

struct Server {
    child: Child,
    stderr: mpsc::Receiver<String>,
    _dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    std::fs::write(&image, pattern(IMAGE_BYTES)).unwrap();
    let socket = dir.path().join("nbd.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_l2arc"))
        .arg("serve-nbd")
        .arg(&image)
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .args(["--arc-max", &format!("{}MiB", ARC_MAX_BYTES >> 20)])
        .args(["--nbd-buffer-max", &format!("{}MiB", POOL_BYTES >> 20)])
        .args(["--max-connections", &MAX_CONNECTIONS.to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = l2arc_testkit::stderr_lines(&mut child);
    let ready = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(ready.starts_with("l2arc: serving "), "{ready}");
    let memory = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(
        memory.starts_with("l2arc: memory: arc_max 32 MiB"),
        "{memory}"
    );
    assert!(memory.contains("NBD buffers 128 MiB"), "{memory}");
    Server {
        child,
        stderr: rx,
        _dir: dir,
        socket,
    }
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
    let server = serve();
    let pid = server.child.id();
    let (threads_before, fds_before) = threads_and_fds(pid);
    let (rss_before_bytes, _) = l2arc_testkit::rss_and_peak_bytes(pid);
    let budget_bytes = ARC_MAX_BYTES
        + POOL_BYTES
        + MAX_CONNECTIONS * l2arc_nbd::server::CONNECTION_FIXED_BYTES
        + FIXED_BYTES;

    let mut hostile = Vec::new();
    for i in 0..HOSTILE_CLIENTS {
        let mut s = open(&server.socket);
        s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
        let keep = s.try_clone().unwrap();
        let t = std::thread::spawn(move || {
            if i % 2 == 0 {
                // Four such replies fill exactly the seven eighths of the
                // pool that large charges may use, so the good client's
                // large reads find it full.
                let len = (POOL_BYTES * 7 / 8 / 4) as u32 - 16;
                let mut v = request(NBD_CMD_READ, 1, 0, len);
                v.extend(request(NBD_CMD_READ, 2, 32 << 20, len));
                let _ = s.write_all(&v);
            } else {
                let mut v = request(NBD_CMD_WRITE, 3, 0, PAYLOAD_MAX_BYTES);
                v.resize(v.len() + PAYLOAD_MAX_BYTES as usize - 1, 0x5a);
                // Blocks while the server makes this client wait; the write
                // times out or fails when the connection is reclaimed.
                let _ = s.write_all(&v);
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
    let mut good = open(&server.socket);
    for i in 0..32u64 {
        let offset = (i * 1_987_654) % (IMAGE_BYTES as u64 - 65536);
        good.write_all(&request(NBD_CMD_READ, 100 + i, offset, 65536))
            .unwrap();
        let mut h = [0u8; 16];
        good.read_exact(&mut h).unwrap();
        assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0);
        assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), 100 + i);
        let mut data = vec![0u8; 65536];
        good.read_exact(&mut data).unwrap();
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
        good.write_all(&request(NBD_CMD_READ, 200 + i, offset, len))
            .unwrap();
        let mut h = [0u8; 16];
        good.read_exact(&mut h).unwrap();
        assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0);
        let mut data = vec![0u8; len as usize];
        good.read_exact(&mut data).unwrap();
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
        let _ = s.shutdown(std::net::Shutdown::Both);
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
            "threads {threads_before} -> {threads}, descriptors {fds_before} -> {fds} after every client left"
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
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(server.child.wait().unwrap().success());
    let stopped = server
        .stderr
        .iter()
        .find(|l| l.starts_with("l2arc: stopped:"))
        .expect("a stop line");
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
