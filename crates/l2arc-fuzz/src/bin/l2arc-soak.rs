//! `l2arc-soak`: both front ends under a long mixed load, with hostile
//! clients and cache-device faults, outside CI.
//!
//! Why. Unit tests show each bound holds once; a service runs for months
//! with all of them pressed at once. This runs `l2arc serve-nbd` and
//! `l2arc mount` (each with a cache file on flash) for minutes with good
//! clients that check every byte they read, hostile NBD clients (replies
//! never read, writes stopped one byte short, garbage, oversized requests,
//! idle holders), a swarm of slot holders that fills the connection table
//! (clients that take the greeting and go quiet, and clients that ask for
//! 1 MiB and never read it, renewed every 9.5 s), a probe that connects
//! every 2 s and measures how long it takes to get in, and faults on the
//! cache devices (random blocks overwritten behind the cache, a device
//! removed and added back), and an `s3://` mount whose server (versitygw)
//! hangs for 10 s every 30 s, read by clients that time every read, then
//! reports: errors seen by good clients, wrong bytes, the longest a new
//! client was kept out, the longest S3 read against its deadline, each
//! service's RSS against its budget, threads and descriptors before and
//! after.
//!
//! ```text
//! l2arc-soak L2ARC_BINARY WORK_DIR SECONDS [NBD_CLIENTS FUSE_CLIENTS HOSTILE SWARM]
//! ```
//!
//! Defaults: 96 NBD clients (of which 8 writers and HOSTILE=8 hostile), 32
//! FUSE readers and a swarm of 128 slot holders: with the good clients,
//! more than the 160 slots.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use l2arc_nbd::protocol::{NBD_CMD_FLAG_FUA, NBD_CMD_READ, NBD_CMD_WRITE};
use l2arc_testkit::nbd::{NbdClient, NbdError};
use l2arc_testkit::service::{Running, Service};

const IMAGE_BYTES: u64 = 256 << 20;
/// The last part of the image, split among the writers.
const WRITER_AREA_BYTES: u64 = 32 << 20;
const FUSE_FILES: usize = 8;
const FUSE_FILE_BYTES: u64 = 32 << 20;
const ARC_MAX_MIB: u64 = 64;
const NBD_POOL_MIB: u64 = 128;
const NBD_MAX_CONNECTIONS: u64 = 160;
/// How long the swarm's holders keep a connection before renewing it.
const SWARM_RENEW: Duration = Duration::from_millis(9500);
/// Longest a new client may be kept out.
const LOCKOUT_MAX: Duration = Duration::from_secs(3);
/// The S3 mount's objects, their size, its readers, and `--s3-read-deadline`.
const S3_OBJECTS: usize = 8;
const S3_OBJECT_BYTES: u64 = 16 << 20;
const S3_READERS: u64 = 8;
const S3_READ_DEADLINE: Duration = Duration::from_secs(4);
/// How often the S3 server hangs, and for how long.
const S3_HANG_EVERY: Duration = Duration::from_secs(30);
const S3_HANG_FOR: Duration = Duration::from_secs(10);
/// Slack a read may take past its deadline (scheduling on a loaded
/// machine); longer is a read past its deadline.
const S3_DEADLINE_SLACK: Duration = Duration::from_secs(2);
/// How long a service may take to print its ready line (the image and
/// the cache devices are written first).
const SERVICE_READY_WITHIN: Duration = Duration::from_secs(60);

/// The expected byte at `offset` of pattern `seed` (cheap to recompute).
fn expected(seed: u64, offset: u64) -> u8 {
    let mut x = (offset >> 3) ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x.to_le_bytes()[(offset & 7) as usize]
}

fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = expected(seed, offset + i as u64);
    }
}

fn write_pattern(path: &Path, seed: u64, len: u64) {
    let f = std::fs::File::create(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        fill(seed, at, &mut buf[..n]);
        f.write_all_at(&buf[..n], at).unwrap();
        at += n as u64;
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Default)]
struct Tally {
    /// The first few errors good clients saw, for the report.
    first_errors: std::sync::Mutex<Vec<String>>,
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    wrong_bytes: AtomicU64,
    hostile_sessions: AtomicU64,
    faults: AtomicU64,
    /// Connections of the probe, the longest it took one to get in (ms),
    /// and how many took longer than `LOCKOUT_MAX`.
    probes: AtomicU64,
    probe_wait_ms_max: AtomicU64,
    lockouts: AtomicU64,
    /// S3 reads: answered, failed (EIO while the server hung or just
    /// after), the longest one (ms), and those past deadline + slack.
    s3_reads: AtomicU64,
    s3_failed: AtomicU64,
    s3_read_ms_max: AtomicU64,
    s3_past_deadline: AtomicU64,
    /// The S3 server is hung now.
    s3_hung: AtomicBool,
}

impl Tally {
    fn error(&self, what: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_errors.lock().unwrap_or_else(|p| p.into_inner());
        if first.len() < 8 {
            first.push(what.to_string());
        }
    }
}

/// A client in transmission on the default export, with a minute's
/// timeouts (the hostile load makes the server slow on purpose).
fn nbd_open(socket: &Path) -> Result<NbdClient, NbdError> {
    let c = NbdClient::open(socket)?;
    c.set_timeout(Some(Duration::from_secs(60)))?;
    Ok(c)
}

fn count_wrong(got: &[u8], want: impl Fn(usize) -> u8) -> u64 {
    got.iter()
        .enumerate()
        .filter(|(i, b)| **b != want(*i))
        .count() as u64
}

/// A good NBD reader: random reads (4 KiB to 1 MiB, now and then 40 MiB,
/// over the maximum payload), every byte checked; reconnects now and then.
fn nbd_reader(socket: &Path, id: u64, stop: &AtomicBool, t: &Tally) {
    let mut rng = Rng(0x1234_5678 + id * 7919);
    let readable = IMAGE_BYTES - WRITER_AREA_BYTES;
    while !stop.load(Ordering::Relaxed) {
        let mut s = match nbd_open(socket) {
            Ok(s) => s,
            Err(e) => {
                t.error(format!("nbd reader {id}: connect: {e}"));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        for _ in 0..200 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let len = if rng.below(500) == 0 {
                40 << 20
            } else {
                4096 << rng.below(9)
            };
            let offset = rng.below(readable - len) & !511;
            match s.read(offset, len as u32) {
                Ok(data) => {
                    let wrong = count_wrong(&data, |j| expected(1, offset + j as u64));
                    t.wrong_bytes.fetch_add(wrong, Ordering::Relaxed);
                    t.ops.fetch_add(1, Ordering::Relaxed);
                    t.bytes.fetch_add(len, Ordering::Relaxed);
                }
                Err(e) => {
                    t.error(format!("nbd reader {id}: read {len} at {offset}: {e}"));
                    break;
                }
            }
        }
    }
}

/// A good NBD writer: owns one region, writes new contents (FUA), reads
/// them back on a second connection and checks them.
fn nbd_writer(socket: &Path, id: u64, writers: u64, stop: &AtomicBool, t: &Tally) {
    let region = WRITER_AREA_BYTES / writers;
    let base = IMAGE_BYTES - WRITER_AREA_BYTES + id * region;
    let mut rng = Rng(0xabcd + id);
    let mut version = 100 + id * 1_000_000;
    while !stop.load(Ordering::Relaxed) {
        let (mut w, mut r) = match (nbd_open(socket), nbd_open(socket)) {
            (Ok(w), Ok(r)) => (w, r),
            (w, r) => {
                t.error(format!(
                    "nbd writer {id}: connect: {:?} {:?}",
                    w.err(),
                    r.err()
                ));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        for _ in 0..100 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            version += 1;
            let len = (4096 << rng.below(7)).min(region);
            let offset = base + (rng.below(region - len + 1) & !4095);
            let mut data = vec![0u8; len as usize];
            fill(version, offset, &mut data);
            let written = w
                .command(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, offset, len as u32, &data)
                .is_ok();
            let back = if written {
                r.read(offset, len as u32).ok()
            } else {
                None
            };
            let Some(back) = back else {
                t.error(format!(
                    "nbd writer {id}: write/read back {len} at {offset}: written {written}"
                ));
                break;
            };
            let wrong = count_wrong(&back, |j| data[j]);
            t.wrong_bytes.fetch_add(wrong, Ordering::Relaxed);
            t.ops.fetch_add(2, Ordering::Relaxed);
            t.bytes.fetch_add(2 * len, Ordering::Relaxed);
        }
    }
}

/// A good reader on the FUSE mount: random ranges of random files.
fn fuse_reader(mnt: &Path, id: u64, stop: &AtomicBool, t: &Tally) {
    let mut rng = Rng(0x5555 + id * 104_729);
    while !stop.load(Ordering::Relaxed) {
        let file = rng.below(FUSE_FILES as u64);
        let f = match std::fs::File::open(mnt.join(format!("f{file}"))) {
            Ok(f) => f,
            Err(e) => {
                t.error(format!("fuse reader {id}: open f{file}: {e}"));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        for _ in 0..50 {
            let len = 4096 << rng.below(6);
            let offset = rng.below(FUSE_FILE_BYTES - len);
            let mut data = vec![0u8; len as usize];
            match f.read_exact_at(&mut data, offset) {
                Ok(()) => {
                    let wrong = count_wrong(&data, |j| expected(10 + file, offset + j as u64));
                    t.wrong_bytes.fetch_add(wrong, Ordering::Relaxed);
                    t.ops.fetch_add(1, Ordering::Relaxed);
                    t.bytes.fetch_add(len, Ordering::Relaxed);
                }
                Err(e) => {
                    t.error(format!(
                        "fuse reader {id}: read {len} at {offset} of f{file}: {e}"
                    ));
                    break;
                }
            }
        }
    }
}

/// A hostile NBD client: each session one misbehaviour, held a while.
fn hostile(socket: &Path, id: u64, stop: &AtomicBool, t: &Tally) {
    let mut rng = Rng(0x6666 + id);
    while !stop.load(Ordering::Relaxed) {
        let hold = Duration::from_millis(2000 + rng.below(8000));
        let kind = rng.below(5);
        let s = if kind == 4 {
            // Slowloris handshake: two bytes of the client flags, never
            // finished.
            NbdClient::greeted(socket).ok().map(|mut s| {
                let _ = s.stream().write_all(&[0, 0]);
                s
            })
        } else {
            nbd_open(socket).ok()
        };
        let Some(mut s) = s else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let _ = s.set_timeout(Some(hold));
        let _ = match kind {
            0 => {
                // Two 32 MiB reads whose replies are never read.
                s.send(NBD_CMD_READ, 0, 1, 0, 32 << 20, &[])
                    .and_then(|()| s.send(NBD_CMD_READ, 0, 2, 32 << 20, 32 << 20, &[]))
            }
            1 => {
                // A 32 MiB write, one byte short.
                let short = vec![0x5a; (32 << 20) - 1];
                s.send(NBD_CMD_WRITE, 0, 3, 0, 32 << 20, &short)
            }
            2 => {
                // Garbage framing.
                let v: Vec<u8> = (0..4096).map(|_| rng.next() as u8).collect();
                s.stream().write_all(&v)
            }
            _ => Ok(()), // Hold the slot, idle (or the unfinished handshake).
        };
        t.hostile_sessions.fetch_add(1, Ordering::Relaxed);
        let until = Instant::now() + hold;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Slot holders, `count` at once, renewed every `SWARM_RENEW`: half take
/// the greeting and say nothing more, half ask for 1 MiB and never read
/// the reply. With the good clients they are more than the slots.
fn swarm(socket: &Path, count: u64, stop: &AtomicBool, t: &Tally) {
    let mut held: Vec<(Instant, Option<NbdClient>)> = Vec::new();
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        held.retain(|(at, _)| at.elapsed() < SWARM_RENEW);
        while (held.len() as u64) < count && !stop.load(Ordering::Relaxed) {
            next += 1;
            let s = if next.is_multiple_of(2) {
                NbdClient::greeted(socket).ok()
            } else {
                nbd_open(socket).ok().map(|mut s| {
                    let _ = s.send(NBD_CMD_READ, 0, 1, (next % 200) << 20, 1 << 20, &[]);
                    s
                })
            };
            t.hostile_sessions.fetch_add(1, Ordering::Relaxed);
            // Spread the renewals over the period.
            held.push((Instant::now(), s));
            std::thread::sleep(SWARM_RENEW / count.max(1) as u32 / 2);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every 2 s a new client connects and is timed until it is in (retrying
/// while it is turned away); one kept out longer than `LOCKOUT_MAX` is a
/// lockout.
fn lockout_probe(socket: &Path, stop: &AtomicBool, t: &Tally) {
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_secs(2));
        let started = Instant::now();
        let got_in = loop {
            match nbd_open(socket) {
                Ok(mut s) => {
                    let data = s.read(0, 4096);
                    if let Ok(data) = &data {
                        let wrong = count_wrong(data, |j| expected(1, j as u64));
                        t.wrong_bytes.fetch_add(wrong, Ordering::Relaxed);
                    }
                    break data.is_ok();
                }
                Err(_) if started.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    t.error(format!("probe: kept out for 30 s: {e}"));
                    break false;
                }
            }
        };
        let waited = started.elapsed();
        t.probes.fetch_add(1, Ordering::Relaxed);
        t.probe_wait_ms_max
            .fetch_max(waited.as_millis() as u64, Ordering::Relaxed);
        if !got_in || waited > LOCKOUT_MAX {
            t.lockouts.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A reader of the S3 mount: random ranges of random objects, every byte
/// checked, every read timed. A read may fail (EIO) only while the server
/// hangs or in the few seconds after it comes back (the outage is over at
/// the next probe); no read may take longer than its deadline.
fn s3_reader(mnt: &Path, id: u64, stop: &AtomicBool, t: &Tally) {
    let mut rng = Rng(0x8888 + id * 31);
    while !stop.load(Ordering::Relaxed) {
        let object = rng.below(S3_OBJECTS as u64);
        let len = 4096 << rng.below(8);
        let offset = rng.below(S3_OBJECT_BYTES - len);
        let started = Instant::now();
        let read = std::fs::File::open(mnt.join(format!("o{object}"))).and_then(|f| {
            let mut data = vec![0u8; len as usize];
            f.read_exact_at(&mut data, offset).map(|()| data)
        });
        let took = started.elapsed();
        t.s3_read_ms_max
            .fetch_max(took.as_millis() as u64, Ordering::Relaxed);
        if took > S3_READ_DEADLINE + S3_DEADLINE_SLACK {
            t.s3_past_deadline.fetch_add(1, Ordering::Relaxed);
        }
        match read {
            Ok(data) => {
                let wrong = count_wrong(&data, |j| expected(100 + object, offset + j as u64));
                t.wrong_bytes.fetch_add(wrong, Ordering::Relaxed);
                t.s3_reads.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                t.s3_failed.fetch_add(1, Ordering::Relaxed);
                if e.raw_os_error() != Some(libc::EIO) {
                    t.error(format!("s3 reader {id}: {e} (not EIO)"));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Hangs the S3 server (SIGSTOP) for `S3_HANG_FOR` every `S3_HANG_EVERY`.
fn s3_hangs(server: &l2arc_testkit::s3::S3Server, stop: &AtomicBool, t: &Tally) {
    while !stop.load(Ordering::Relaxed) {
        let until = Instant::now() + S3_HANG_EVERY - S3_HANG_FOR;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        server.pause();
        t.s3_hung.store(true, Ordering::Relaxed);
        t.faults.fetch_add(1, Ordering::Relaxed);
        let until = Instant::now() + S3_HANG_FOR;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
        server.resume();
        t.s3_hung.store(false, Ordering::Relaxed);
    }
}

/// Device faults: random 4 KiB blocks of the cache files overwritten behind
/// the services (the checksums must catch them), and the NBD service's
/// cache device removed and added back.
fn faults(l2arc: &Path, dir: &Path, stop: &AtomicBool, t: &Tally) {
    let mut rng = Rng(0x7777);
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..50 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        round += 1;
        for (name, size) in [
            ("cache-nbd.img", 512u64 << 20),
            ("cache-fuse.img", 256 << 20),
        ] {
            if let Ok(f) = std::fs::OpenOptions::new().write(true).open(dir.join(name)) {
                for _ in 0..16 {
                    let block = (1 << 20) + (rng.below(size - (2 << 20)) & !4095);
                    let junk: Vec<u8> = (0..4096).map(|_| rng.next() as u8).collect();
                    let _ = f.write_all_at(&junk, block);
                }
                t.faults.fetch_add(16, Ordering::Relaxed);
            }
        }
        if round.is_multiple_of(3) {
            let ctl = dir.join("nbd-ctl.sock");
            let devices = ctl_run(l2arc, &ctl, &["devices"]);
            if let Some(slot) = devices
                .lines()
                .find_map(|l| l.strip_prefix("slot "))
                .and_then(|l| l.split_whitespace().next())
            {
                ctl_run(l2arc, &ctl, &["remove-cache", slot]);
                std::thread::sleep(Duration::from_secs(2));
                let cache = dir.join("cache-nbd.img");
                ctl_run(l2arc, &ctl, &["add-cache", cache.to_str().unwrap()]);
                t.faults.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn ctl_run(l2arc: &Path, socket: &Path, args: &[&str]) -> String {
    let out = Command::new(l2arc)
        .arg("ctl")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(_) => String::new(),
    }
}

fn kstat(stats: &str, name: &str) -> u64 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

#[derive(Clone, Copy, Debug)]
struct ProcStat {
    rss_mib: u64,
    hwm_mib: u64,
    threads: usize,
    fds: usize,
}

fn proc_stat(pid: u32) -> ProcStat {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let count = |d: String| std::fs::read_dir(d).map(|r| r.count()).unwrap_or(0);
    ProcStat {
        rss_mib: kib("VmRSS:") >> 10,
        hwm_mib: kib("VmHWM:") >> 10,
        threads: count(format!("/proc/{pid}/task")),
        fds: count(format!("/proc/{pid}/fd")),
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The command line: what to run against and for how long.
struct SoakArgs {
    l2arc: PathBuf,
    dir: PathBuf,
    secs: u64,
    nbd_clients: u64,
    fuse_clients: u64,
    hostiles: u64,
    swarm: u64,
    writers: u64,
}

impl SoakArgs {
    fn parse() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if args.len() < 3 {
            eprintln!(
                "usage: l2arc-soak L2ARC_BINARY WORK_DIR SECONDS [NBD_CLIENTS FUSE_CLIENTS HOSTILE SWARM]"
            );
            std::process::exit(2);
        }
        let arg = |i: usize, default: u64| args.get(i).map_or(default, |v| v.parse().unwrap());
        Self {
            l2arc: PathBuf::from(&args[0]),
            dir: PathBuf::from(&args[1]),
            secs: args[2].parse().expect("SECONDS"),
            nbd_clients: arg(3, 96),
            fuse_clients: arg(4, 32),
            hostiles: arg(5, 8),
            swarm: arg(6, 128),
            writers: 8,
        }
    }
}

/// The two services under test and their logs.
struct Services {
    nbd: Running,
    fuse: Running,
    s3_server: Arc<l2arc_testkit::s3::S3Server>,
    s3_mount: Running,
}

/// versitygw with a bucket of patterned objects, and `l2arc mount s3://`
/// of it with short timeouts and a read deadline of `S3_READ_DEADLINE`.
fn start_s3(dir: &Path, l2arc: &Path) -> (Arc<l2arc_testkit::s3::S3Server>, Running) {
    let server = l2arc_testkit::s3::S3Server::start();
    server.create_bucket("soak");
    for o in 0..S3_OBJECTS {
        let mut data = vec![0u8; S3_OBJECT_BYTES as usize];
        fill(100 + o as u64, 0, &mut data);
        server.put("soak", &format!("o{o}"), &data);
    }
    let mnt = dir.join("mnt-s3");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut mount = Service::mount(l2arc, "s3://soak", &mnt)
        .args(["--s3-endpoint", &server.endpoint()])
        .args(["--s3-timeout", "1", "--s3-retries", "2"])
        .args([
            "--s3-read-deadline",
            &S3_READ_DEADLINE.as_secs().to_string(),
        ])
        .args(["--metadata-ttl", "5", "--arc-max", "32MiB"])
        .args(["--cache-size", "128MiB"])
        .arg("--cache")
        .arg(dir.join("cache-s3.img"))
        .ready_within(SERVICE_READY_WITHIN);
    for (k, v) in server.aws_env() {
        mount = mount.env(k, v);
    }
    let _ = std::fs::remove_file(dir.join("cache-s3.img"));
    (Arc::new(server), mount.start())
}

/// Writes the image and the mount's files, and starts `serve-nbd` and
/// `mount` on them with fresh cache devices.
fn start_services(a: &SoakArgs) -> Services {
    let dir = &a.dir;
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::create_dir_all(dir.join("mnt")).unwrap();
    let image = dir.join("image.raw");
    write_pattern(&image, 1, IMAGE_BYTES);
    for f in 0..FUSE_FILES {
        write_pattern(
            &dir.join("src").join(format!("f{f}")),
            10 + f as u64,
            FUSE_FILE_BYTES,
        );
    }
    for name in ["cache-nbd.img", "cache-fuse.img"] {
        let _ = std::fs::remove_file(dir.join(name));
    }
    let arc = format!("{ARC_MAX_MIB}MiB");
    let nbd = Service::serve_nbd(&a.l2arc, &image)
        .listen_unix(&dir.join("nbd.sock"))
        .args(["--arc-max", &arc, "--cache-size", "512MiB"])
        .arg("--cache")
        .arg(dir.join("cache-nbd.img"))
        .arg("--control")
        .arg(dir.join("nbd-ctl.sock"))
        .args(["--nbd-buffer-max", &format!("{NBD_POOL_MIB}MiB")])
        .args(["--max-connections", &NBD_MAX_CONNECTIONS.to_string()])
        .ready_within(SERVICE_READY_WITHIN)
        .start();
    let fuse = Service::mount(&a.l2arc, dir.join("src"), &dir.join("mnt"))
        .args(["--arc-max", &arc, "--cache-size", "256MiB"])
        .arg("--cache")
        .arg(dir.join("cache-fuse.img"))
        .arg("--control")
        .arg(dir.join("fuse-ctl.sock"))
        .ready_within(SERVICE_READY_WITHIN)
        .start();
    let (s3_server, s3_mount) = start_s3(dir, &a.l2arc);
    Services {
        nbd,
        fuse,
        s3_server,
        s3_mount,
    }
}

/// Starts every client thread: NBD readers, writers and hostile clients,
/// FUSE readers, and the cache-device fault injector.
fn start_clients(
    a: &SoakArgs,
    s3_server: &Arc<l2arc_testkit::s3::S3Server>,
    stop: &Arc<AtomicBool>,
    good: &Arc<Tally>,
) -> Vec<JoinHandle<()>> {
    let mut threads = Vec::new();
    for i in 0..S3_READERS {
        let (mnt, stop, t) = (a.dir.join("mnt-s3"), Arc::clone(stop), Arc::clone(good));
        threads.push(std::thread::spawn(move || s3_reader(&mnt, i, &stop, &t)));
    }
    let (server, hang_stop, hang_tally) =
        (Arc::clone(s3_server), Arc::clone(stop), Arc::clone(good));
    threads.push(std::thread::spawn(move || {
        s3_hangs(&server, &hang_stop, &hang_tally)
    }));
    let socket = a.dir.join("nbd.sock");
    let (writers, readers) = (a.writers, a.nbd_clients - a.writers - a.hostiles);
    for i in 0..a.nbd_clients {
        let (socket, stop, t) = (socket.clone(), Arc::clone(stop), Arc::clone(good));
        threads.push(std::thread::spawn(move || {
            if i < readers {
                nbd_reader(&socket, i, &stop, &t)
            } else if i < readers + writers {
                nbd_writer(&socket, i - readers, writers, &stop, &t)
            } else {
                hostile(&socket, i, &stop, &t)
            }
        }));
    }
    for i in 0..a.fuse_clients {
        let (mnt, stop, t) = (a.dir.join("mnt"), Arc::clone(stop), Arc::clone(good));
        threads.push(std::thread::spawn(move || fuse_reader(&mnt, i, &stop, &t)));
    }
    let a_swarm = a.swarm;
    let (swarm_stop, swarm_tally, swarm_socket) =
        (Arc::clone(stop), Arc::clone(good), socket.clone());
    threads.push(std::thread::spawn(move || {
        swarm(&swarm_socket, a_swarm, &swarm_stop, &swarm_tally)
    }));
    let (probe_stop, probe_tally) = (Arc::clone(stop), Arc::clone(good));
    threads.push(std::thread::spawn(move || {
        lockout_probe(&socket, &probe_stop, &probe_tally)
    }));
    let (l2arc, dir, stop, t) = (
        a.l2arc.clone(),
        a.dir.clone(),
        Arc::clone(stop),
        Arc::clone(good),
    );
    threads.push(std::thread::spawn(move || faults(&l2arc, &dir, &stop, &t)));
    threads
}

/// Prints progress every 10 s until `secs` pass; returns the peak RSS of
/// `serve-nbd` and of `mount`, MiB.
fn watch(secs: u64, good: &Tally, nbd_pid: u32, fuse_pid: u32) -> (u64, u64) {
    let started = Instant::now();
    let (mut nbd_peak_rss, mut fuse_peak_rss) = (0, 0);
    while started.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(10));
        let (n, f) = (proc_stat(nbd_pid), proc_stat(fuse_pid));
        nbd_peak_rss = nbd_peak_rss.max(n.rss_mib);
        fuse_peak_rss = fuse_peak_rss.max(f.rss_mib);
        println!(
            "{:>4} s: good ops {} ({} MiB), errors {}, wrong bytes {}, hostile sessions {}, faults {}, longest wait to get in {} ms; nbd RSS {} MiB, {} threads, {} fds; fuse RSS {} MiB; load {}",
            started.elapsed().as_secs(),
            good.ops.load(Ordering::Relaxed),
            good.bytes.load(Ordering::Relaxed) >> 20,
            good.errors.load(Ordering::Relaxed),
            good.wrong_bytes.load(Ordering::Relaxed),
            good.hostile_sessions.load(Ordering::Relaxed),
            good.faults.load(Ordering::Relaxed),
            good.probe_wait_ms_max.load(Ordering::Relaxed),
            n.rss_mib,
            n.threads,
            n.fds,
            f.rss_mib,
            load_average()
        );
    }
    (nbd_peak_rss, fuse_peak_rss)
}

/// What the services looked like before, at their peak and after.
struct ServiceReport {
    before: ProcStat,
    after: ProcStat,
    peak_rss_mib: u64,
    stats: String,
}

/// The memory `serve-nbd` may use: arc_max + the L2 index + the buffer
/// pool + per-connection fixed costs + 64 MiB of code and stacks.
fn nbd_budget_mib(l2_hdr_bytes: u64) -> u64 {
    ARC_MAX_MIB
        + (l2_hdr_bytes >> 20)
        + NBD_POOL_MIB
        + ((NBD_MAX_CONNECTIONS * l2arc_nbd::server::CONNECTION_FIXED_BYTES) >> 20)
        + 64
}

fn report(good: &Tally, nbd: &ServiceReport, fuse: &ServiceReport, stop_line: &str) {
    println!("---");
    println!(
        "good clients: {} ops, {} MiB, {} errors, {} wrong bytes",
        good.ops.load(Ordering::Relaxed),
        good.bytes.load(Ordering::Relaxed) >> 20,
        good.errors.load(Ordering::Relaxed),
        good.wrong_bytes.load(Ordering::Relaxed)
    );
    for e in good.first_errors.lock().unwrap().iter() {
        println!("  error: {e}");
    }
    println!(
        "hostile sessions {}, device faults {} (blocks overwritten + device removals)",
        good.hostile_sessions.load(Ordering::Relaxed),
        good.faults.load(Ordering::Relaxed)
    );
    println!(
        "s3 mount, server hung {} s every {} s: {} reads, {} failed with EIO, the longest {} ms, {} past the {} s deadline + {} s",
        S3_HANG_FOR.as_secs(),
        S3_HANG_EVERY.as_secs(),
        good.s3_reads.load(Ordering::Relaxed),
        good.s3_failed.load(Ordering::Relaxed),
        good.s3_read_ms_max.load(Ordering::Relaxed),
        good.s3_past_deadline.load(Ordering::Relaxed),
        S3_READ_DEADLINE.as_secs(),
        S3_DEADLINE_SLACK.as_secs()
    );
    println!(
        "probe: {} new clients, the longest kept out {} ms, {} kept out longer than {} s",
        good.probes.load(Ordering::Relaxed),
        good.probe_wait_ms_max.load(Ordering::Relaxed),
        good.lockouts.load(Ordering::Relaxed),
        LOCKOUT_MAX.as_secs()
    );
    println!(
        "serve-nbd: peak RSS {} MiB (VmHWM {} MiB) against a budget of {} MiB; threads {} -> {}, fds {} -> {}",
        nbd.peak_rss_mib,
        nbd.after.hwm_mib,
        nbd_budget_mib(kstat(&nbd.stats, "l2_hdr_size")),
        nbd.before.threads,
        nbd.after.threads,
        nbd.before.fds,
        nbd.after.fds
    );
    println!(
        "mount: peak RSS {} MiB (VmHWM {} MiB); threads {} -> {}, fds {} -> {}",
        fuse.peak_rss_mib,
        fuse.after.hwm_mib,
        fuse.before.threads,
        fuse.after.threads,
        fuse.before.fds,
        fuse.after.fds
    );
    for (name, stats) in [("serve-nbd", &nbd.stats), ("mount", &fuse.stats)] {
        println!(
            "{name}: hits {} misses {} l2_hits {} l2_cksum_bad {} l2_io_error {} l2_size {} MiB",
            kstat(stats, "hits"),
            kstat(stats, "misses"),
            kstat(stats, "l2_hits"),
            kstat(stats, "l2_cksum_bad"),
            kstat(stats, "l2_io_error"),
            kstat(stats, "l2_size") >> 20
        );
    }
    println!("{stop_line}");
    println!("load {}", load_average());
}

fn main() {
    let a = SoakArgs::parse();
    let Services {
        mut nbd,
        mut fuse,
        s3_server,
        mut s3_mount,
    } = start_services(&a);
    let (nbd_pid, fuse_pid) = (nbd.pid(), fuse.pid());
    let (nbd_before, fuse_before) = (proc_stat(nbd_pid), proc_stat(fuse_pid));
    println!(
        "soak: {} s, {} NBD clients ({} writers, {} hostile) + a swarm of {} slot holders + {} FUSE readers; load {}",
        a.secs,
        a.nbd_clients,
        a.writers,
        a.hostiles,
        a.swarm,
        a.fuse_clients,
        load_average()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let good = Arc::new(Tally::default());
    let threads = start_clients(&a, &s3_server, &stop, &good);
    let (nbd_peak_rss_mib, fuse_peak_rss_mib) = watch(a.secs, &good, nbd_pid, fuse_pid);
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    // Let the services close what the clients left.
    std::thread::sleep(Duration::from_secs(5));
    let nbd_report = ServiceReport {
        before: nbd_before,
        after: proc_stat(nbd_pid),
        peak_rss_mib: nbd_peak_rss_mib,
        stats: ctl_run(&a.l2arc, &a.dir.join("nbd-ctl.sock"), &["stats"]),
    };
    let fuse_report = ServiceReport {
        before: fuse_before,
        after: proc_stat(fuse_pid),
        peak_rss_mib: fuse_peak_rss_mib,
        stats: ctl_run(&a.l2arc, &a.dir.join("fuse-ctl.sock"), &["stats"]),
    };
    for service in [&nbd, &fuse, &s3_mount] {
        let _ = Command::new("kill")
            .args(["-TERM", &service.pid().to_string()])
            .status();
    }
    let _ = nbd.child.wait();
    let _ = fuse.child.wait();
    let _ = s3_mount.child.wait();
    let s3_stop_line = s3_mount
        .stderr
        .try_iter()
        .filter(|l| l.starts_with("l2arc:"))
        .last()
        .unwrap_or_default();
    println!("s3 mount: {s3_stop_line}");
    drop(s3_server);
    let stop_line = nbd
        .stderr
        .try_iter()
        .find(|l| l.starts_with("l2arc: stopped"))
        .unwrap_or_default();
    let _ = fuse.stderr.try_iter().count();
    report(&good, &nbd_report, &fuse_report, &stop_line);
}
