//! A one-thread NBD client with many connections, for measuring how a
//! server scales with connections apart from how its clients do.
//!
//! Why. fio's nbd engine gives each connection a thread of its own: with
//! 128 connections on a 2-CPU machine, fio's own CPU time per request
//! grows by half from 16 connections to 128 (its threads' switches and
//! cache misses), so the aggregate rate falls whatever the server does.
//! This client keeps every connection in one thread, sleeping in one
//! `epoll_wait` for all of them, so its cost per request does not grow
//! with the connections, and what is left of the fall is the server's.
//! Each connection keeps one random 4 KiB read in flight (queue depth 1,
//! as the fio jobs), and every reply is compared with the image's bytes.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use l2arc_nbd::protocol::{
    IHAVEOPT, NBD_CMD_READ, NBD_OPT_GO, NBD_REP_ACK, OPTION_REPLY_MAGIC, REQUEST_BYTES, Request,
    SIMPLE_REPLY_BYTES, SIMPLE_REPLY_MAGIC,
};

const BLOCK_BYTES: usize = 4096;
const REPLY_BYTES: usize = SIMPLE_REPLY_BYTES + BLOCK_BYTES;
/// Most events taken from one `epoll_wait`.
const EVENTS_MAX: usize = 256;

/// What one run measured.
pub(crate) struct OneThreadRun {
    pub(crate) iops: f64,
    pub(crate) latency_us_p50: f64,
    pub(crate) latency_us_p99: f64,
    pub(crate) latency_us_max: f64,
    pub(crate) reads: f64,
}

/// One connection's read in flight.
struct Conn {
    stream: UnixStream,
    offset_bytes: u64,
    sent_at: Instant,
    reply: Box<[u8; REPLY_BYTES]>,
    got_bytes: usize,
}

/// `connections` connections to the export at `socket`, one random 4 KiB
/// read in flight on each, for `secs`; every reply checked against
/// `image` (the export's bytes).
pub(crate) fn run(
    socket: &Path,
    connections: usize,
    image: &[u8],
    secs: f64,
    seed: u64,
) -> Result<OneThreadRun> {
    let blocks = (image.len() / BLOCK_BYTES) as u64;
    if blocks == 0 {
        bail!("the image is smaller than one block");
    }
    let mut rng = seed | 1;
    let mut next_offset = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % blocks * BLOCK_BYTES as u64
    };
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        let stream = open_session(socket)?;
        stream.set_nonblocking(true)?;
        conns.push(Conn {
            stream,
            offset_bytes: 0,
            sent_at: Instant::now(),
            reply: Box::new([0u8; REPLY_BYTES]),
            got_bytes: 0,
        });
    }
    let epoll = Epoll::new()?;
    for (i, c) in conns.iter().enumerate() {
        epoll.add(c.stream.as_raw_fd(), i as u64)?;
    }
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3)?;
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(secs);
    for c in &mut conns {
        send_read(c, next_offset())?;
    }
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS_MAX];
    while Instant::now() < until {
        for &event in epoll.wait(&mut events, 100)? {
            let c = &mut conns[event.u64 as usize];
            if !receive(c)? {
                continue;
            }
            check_reply(c, image)?;
            histogram.record(c.sent_at.elapsed().as_nanos() as u64 / 1000)?;
            send_read(c, next_offset())?;
        }
    }
    let elapsed_secs = started.elapsed().as_secs_f64();
    let reads = histogram.len() as f64;
    Ok(OneThreadRun {
        iops: reads / elapsed_secs,
        latency_us_p50: histogram.value_at_quantile(0.5) as f64,
        latency_us_p99: histogram.value_at_quantile(0.99) as f64,
        latency_us_max: histogram.max() as f64,
        reads,
    })
}

/// Connects and negotiates the default export (fixed newstyle, GO).
fn open_session(socket: &Path) -> Result<UnixStream> {
    let mut s =
        UnixStream::connect(socket).with_context(|| format!("connect to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting)?;
    if &greeting[..16] != b"NBDMAGICIHAVEOPT" {
        bail!("not an NBD server (fixed newstyle)");
    }
    let mut go = 3u32.to_be_bytes().to_vec(); // fixed newstyle, no zeroes
    go.extend_from_slice(&IHAVEOPT.to_be_bytes());
    go.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
    go.extend_from_slice(&6u32.to_be_bytes());
    go.extend_from_slice(&[0u8; 6]); // the default export, no info asked
    s.write_all(&go)?;
    loop {
        let mut header = [0u8; 20];
        s.read_exact(&mut header)?;
        if header[..8] != OPTION_REPLY_MAGIC.to_be_bytes() {
            bail!("bad option reply magic");
        }
        let reply_type = u32::from_be_bytes(header[12..16].try_into()?);
        let mut data = vec![0u8; u32::from_be_bytes(header[16..20].try_into()?) as usize];
        s.read_exact(&mut data)?;
        if reply_type == NBD_REP_ACK {
            return Ok(s);
        }
        if reply_type >= 1 << 31 {
            bail!("the server refused: {}", String::from_utf8_lossy(&data));
        }
    }
}

fn send_read(c: &mut Conn, offset_bytes: u64) -> Result<()> {
    let request: [u8; REQUEST_BYTES] = Request {
        flags: 0,
        command: NBD_CMD_READ,
        cookie: offset_bytes,
        offset_bytes,
        length_bytes: BLOCK_BYTES as u32,
    }
    .encode();
    c.offset_bytes = offset_bytes;
    c.got_bytes = 0;
    c.sent_at = Instant::now();
    // 28 bytes into an empty socket buffer at queue depth 1: never short.
    c.stream.write_all(&request).context("send a request")
}

/// Reads what the connection has; whether its reply is complete.
fn receive(c: &mut Conn) -> Result<bool> {
    loop {
        match c.stream.read(&mut c.reply[c.got_bytes..]) {
            Ok(0) => bail!("the server closed a connection"),
            Ok(n) => {
                c.got_bytes += n;
                if c.got_bytes == REPLY_BYTES {
                    return Ok(true);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("receive a reply"),
        }
    }
}

/// The reply answers the read in flight, without error, with the image's
/// bytes.
fn check_reply(c: &Conn, image: &[u8]) -> Result<()> {
    let r = &c.reply;
    let magic = u32::from_be_bytes(r[0..4].try_into()?);
    let error = u32::from_be_bytes(r[4..8].try_into()?);
    let cookie = u64::from_be_bytes(r[8..16].try_into()?);
    if magic != SIMPLE_REPLY_MAGIC || error != 0 || cookie != c.offset_bytes {
        bail!("bad reply: magic {magic:#x}, error {error}, cookie {cookie}");
    }
    let at = c.offset_bytes as usize;
    if r[SIMPLE_REPLY_BYTES..] != image[at..at + BLOCK_BYTES] {
        bail!("wrong bytes read at {at}");
    }
    Ok(())
}

/// An epoll instance, closed on drop.
struct Epoll(std::os::fd::OwnedFd);

impl Epoll {
    fn new() -> Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: no pointers; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("epoll_create1");
        }
        // SAFETY: `fd` was just returned and is owned here.
        Ok(Self(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    fn add(&self, fd: i32, data: u64) -> Result<()> {
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: data,
        };
        // SAFETY: `event` is valid for the call; both descriptors are open.
        let r = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if r < 0 {
            return Err(std::io::Error::last_os_error()).context("epoll_ctl");
        }
        Ok(())
    }

    /// Waits up to `timeout_ms` for events; the ones that came.
    fn wait<'e>(
        &self,
        events: &'e mut [libc::epoll_event],
        timeout_ms: i32,
    ) -> Result<&'e [libc::epoll_event]> {
        // SAFETY: `events` is valid for `events.len()` entries.
        let n = unsafe {
            libc::epoll_wait(
                self.0.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(&events[..0]);
            }
            return Err(e).context("epoll_wait");
        }
        Ok(&events[..n as usize])
    }
}
