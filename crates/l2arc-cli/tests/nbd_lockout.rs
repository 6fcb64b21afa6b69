//! `l2arc serve-nbd` under clients that hold slots without using them: a
//! good client (nbdinfo) must get in within 3 s while 64 hostile ones take
//! every slot, and a client turned away is told why, in an NBD error reply
//! and in the server's log.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use l2arc_nbd::protocol::NBD_CMD_READ;

use l2arc_testkit::nbd::NbdClient;
use l2arc_testkit::service::{Running, Service};

const IMAGE_BYTES: usize = 64 << 20;
/// serve-nbd's default `--max-connections`.
const SLOTS: usize = 64;
/// How long a good client may take to get in.
const GET_IN_WITHIN: Duration = Duration::from_secs(3);

struct Served {
    _dir: tempfile::TempDir,
    nbd: Running,
}

impl Served {
    fn start(extra: &[&str]) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, vec![7u8; IMAGE_BYTES]).unwrap();
        let nbd = Service::serve_nbd(Path::new(env!("CARGO_BIN_EXE_l2arc")), &image)
            .listen_unix(&dir.path().join("nbd.sock"))
            .args(["--arc-max", "16MiB"])
            .args(extra)
            .start();
        Served { _dir: dir, nbd }
    }

    fn socket(&self) -> &Path {
        self.nbd.socket()
    }

    /// Runs nbdinfo until it answers, for at most `GET_IN_WITHIN`; how long
    /// it took, or the last failure.
    fn good_client_gets_in(&self) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            let out = l2arc_testkit::tool("nbdinfo", "libnbd-bin")
                .arg("--size")
                .arg(self.nbd.uri())
                .output()
                .expect("nbdinfo runs");
            let took = started.elapsed();
            if out.status.success() {
                let size = String::from_utf8_lossy(&out.stdout);
                assert_eq!(size.trim(), IMAGE_BYTES.to_string());
                return Ok(took);
            }
            if took >= GET_IN_WITHIN {
                return Err(String::from_utf8_lossy(&out.stderr).into_owned());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// 64 clients that take the greeting and never answer hold every slot:
/// held for good, and renewed (each closed and opened again) every 9.5 s
/// and every second. A good client gets in within 3 s each time.
#[test]
fn clients_that_never_answer_the_greeting_cannot_lock_others_out() {
    let served = Served::start(&[]);
    for renew_every in [
        None,
        Some(Duration::from_millis(9500)),
        Some(Duration::from_secs(1)),
    ] {
        let stop = Arc::new(AtomicBool::new(false));
        let hostile: Vec<_> = (0..SLOTS)
            .map(|i| {
                let (socket, stop) = (served.socket().to_path_buf(), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let Some(period) = renew_every else {
                        // Takes the greeting, says nothing more.
                        let held = NbdClient::greeted(&socket).unwrap();
                        while !stop.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        return drop(held);
                    };
                    // Staggered, so that renewals are spread over the period.
                    std::thread::sleep(period * i as u32 / SLOTS as u32);
                    while !stop.load(Ordering::Relaxed) {
                        let held = UnixStream::connect(&socket).unwrap();
                        let until = Instant::now() + period;
                        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        drop(held);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1500));
        for attempt in 0..5 {
            let took = served.good_client_gets_in().unwrap_or_else(|e| {
                panic!("renewing every {renew_every:?}, attempt {attempt}: locked out: {e}")
            });
            assert!(took < GET_IN_WITHIN, "{took:?}");
        }
        stop.store(true, Ordering::Relaxed);
        for t in hostile {
            t.join().unwrap();
        }
    }
}

/// On a Unix socket, 64 clients each ask for 1 MiB and never read the
/// reply, so every slot has a request "in flight" for as long as the idle
/// timeout. A connection whose reply has not moved for 2 s is not busy:
/// eight good clients in a row each get in within 3 s.
#[test]
fn clients_that_leave_replies_unread_cannot_lock_others_out() {
    let served = Served::start(&[]);
    let mut hostile: Vec<NbdClient> = (0..SLOTS)
        .map(|i| {
            let mut s = NbdClient::open(served.socket()).unwrap();
            s.send(NBD_CMD_READ, 0, i as u64, (i as u64) << 20, 1 << 20, &[])
                .unwrap();
            s
        })
        .collect();
    // Eight good clients in a row, each keeping its connection: each must
    // take the slot of a hostile one.
    let mut good = Vec::new();
    for attempt in 0..8 {
        let took = served
            .good_client_gets_in()
            .unwrap_or_else(|e| panic!("attempt {attempt}: locked out: {e}"));
        assert!(took < GET_IN_WITHIN, "{took:?}");
        let started = Instant::now();
        let mut session = loop {
            match NbdClient::open(served.socket()) {
                Ok(s) => break s,
                Err(e) if started.elapsed() >= GET_IN_WITHIN => {
                    panic!("attempt {attempt}: a session was locked out: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        assert_eq!(session.read(0, 4096).unwrap(), [7u8; 4096]);
        good.push(session);
    }
    // The hostile ones that lost their slots were told by a closed socket.
    let mut closed = 0;
    for s in &mut hostile {
        s.set_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut sink = vec![0u8; 2 << 20];
        let mut total = 0;
        loop {
            match s.stream().read(&mut sink) {
                Ok(0) => {
                    closed += 1;
                    break;
                }
                Ok(n) => total += n,
                Err(_) => break,
            }
        }
        assert!(total <= (1 << 20) + 16, "one reply at most");
    }
    assert!(closed >= 8, "{closed} hostile clients lost their slots");
}

/// With every slot busy (two clients reading all the time), a third is
/// turned away with the reason in an NBD error reply that nbdinfo prints,
/// and serve-nbd logs the refusal.
#[test]
fn a_client_turned_away_is_told_why_and_the_refusal_is_logged() {
    let served = Served::start(&["--max-connections", "2"]);
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let mut s = NbdClient::open(served.socket()).unwrap();
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    s.read(0, 4096).unwrap();
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .collect();
    let nbdinfo = l2arc_testkit::tool("nbdinfo", "libnbd-bin")
        .arg("--size")
        .arg(served.nbd.uri())
        .output()
        .unwrap();
    let qemu_img = l2arc_testkit::tool("qemu-img", "qemu-utils")
        .arg("info")
        .arg(served.nbd.uri())
        .output()
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    for t in busy {
        t.join().unwrap();
    }
    assert!(!nbdinfo.status.success(), "the third client was let in");
    assert!(!qemu_img.status.success(), "the fourth client was let in");
    // qemu prints what the server said (libnbd only with LIBNBD_DEBUG=1).
    let said = String::from_utf8_lossy(&qemu_img.stderr);
    assert!(
        said.contains("server reported: l2arc: server busy: all 2 connections are in use"),
        "qemu-img said: {said}"
    );
    let logged =
        std::iter::from_fn(|| served.nbd.stderr.recv_timeout(Duration::from_secs(10)).ok())
            .find(|line| line.contains("client(s) away"))
            .expect("the refusal was logged");
    assert!(
        logged.starts_with("l2arc: warning: turned 1 client(s) away: all 2 connections")
            && logged.contains("--max-connections"),
        "{logged}"
    );
}
