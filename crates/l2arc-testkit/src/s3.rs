//! A real S3 server for the tests and the benchmark, and a TCP proxy in
//! front of it that makes it behave like a distant object store.
//!
//! The server is versitygw over a local directory (`scripts/setup.sh`
//! installs it with `go install` into `$HOME/go/bin`). A test that needs it
//! and does not find it fails loudly: a skipped S3 test would read as a
//! passed one.
//!
//! The proxy works on TCP, below HTTP, so that every system under test
//! (l2arc, rclone, mountpoint-s3) pays the same: a request is the first
//! bytes a client sends after the server last answered on that connection
//! (S3 clients do not pipeline). Each request waits a delay drawn from a
//! range before it is forwarded (a 20-50 ms round trip to a bucket);
//! injected faults replace the next requests with a 503 SlowDown answer or
//! a dropped connection. An optional cap on the bytes it passes down, all
//! connections together, is the link to a bucket in another region. It counts requests by method, which is how the
//! benchmark counts the GETs a system issued.
//!
//! A hung server is the server stopped (SIGSTOP, [`S3Server::pause`]): the
//! kernel still accepts connections and takes requests, and nothing ever
//! answers, which is what a client sees of a wedged or partitioned store.
//! [`NotS3Server`] is an HTTP server that is not S3 at all (a web server at
//! a mistyped endpoint): it answers every request 404 with an HTML page.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The root credentials every test server takes.
pub const ACCESS_KEY: &str = "l2arctestaccess";
/// The secret key that goes with [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "l2arctestsecret0123456789";

/// versitygw's path: `$VERSITYGW`, `$HOME/go/bin/versitygw`, or on PATH.
/// Panics (fails the test) with what to run when it is nowhere.
pub fn versitygw_path() -> PathBuf {
    if let Some(p) = std::env::var_os("VERSITYGW") {
        return PathBuf::from(p);
    }
    if let Some(home) = std::env::var_os("HOME") {
        let p = Path::new(&home).join("go/bin/versitygw");
        if p.is_file() {
            return p;
        }
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join("versitygw");
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "versitygw is not installed: run scripts/setup.sh (it runs `go install github.com/versity/versitygw/cmd/versitygw@v1.8.0` into $HOME/go/bin)"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
}

/// A versitygw process serving a temporary directory; killed on drop.
pub struct S3Server {
    child: Child,
    root: tempfile::TempDir,
    addr: SocketAddr,
    client: Client,
}

impl S3Server {
    /// Starts a server on a free local port and waits until it answers.
    ///
    /// One start at a time in a process: between `free_port` letting its
    /// port go and versitygw binding it, a server of a test running beside
    /// this one could pick the same port. The loser exits, but its test
    /// could meanwhile connect to the winner and go on with another test's
    /// server, which disappears when that test ends.
    pub fn start() -> Self {
        static ONE_START_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ONE_START_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let bin = versitygw_path();
        let root = tempfile::tempdir().expect("temp dir");
        let data = root.path().join("data");
        std::fs::create_dir(&data).expect("data dir");
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
            let mut child = Command::new(&bin)
                .args(["--access", ACCESS_KEY, "--secret", SECRET_KEY])
                .args(["--port", &addr.to_string(), "--quiet", "posix"])
                .arg(&data)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    last_error = format!("versitygw exited ({status}): {err}");
                    break;
                }
                if TcpStream::connect(addr).is_ok() && matches!(child.try_wait(), Ok(None)) {
                    let endpoint = format!("http://{addr}");
                    return Self {
                        child,
                        root,
                        addr,
                        client: Client::new(&endpoint),
                    };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("versitygw did not start: {last_error}");
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// "http://127.0.0.1:PORT".
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The directory versitygw serves (buckets are its subdirectories).
    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    /// Makes a bucket (the posix back end: a directory under the root).
    pub fn create_bucket(&self, bucket: &str) {
        std::fs::create_dir_all(self.data_dir().join(bucket)).expect("bucket dir");
    }

    /// Writes an object through the S3 API (a PUT, new ETag).
    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        self.client.put(bucket, key, data);
    }

    /// Deletes an object through the S3 API.
    pub fn delete(&self, bucket: &str, key: &str) {
        self.client.delete(bucket, key);
    }

    /// Stops the server process (SIGSTOP): connections are still accepted
    /// by the kernel, requests are taken, and nothing answers until
    /// [`Self::resume`]. Dropping a paused server kills it all the same.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} versitygw: {status}");
    }

    /// Environment for a child process that reaches this server with the
    /// AWS tools' conventions.
    pub fn aws_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP server that is not S3: every request is answered 404 with an
/// HTML page, as a web server at a mistyped endpoint would. Stops on drop.
pub struct NotS3Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl NotS3Server {
    /// Listens on a free local port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
        let addr = listener.local_addr().expect("addr");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                std::thread::spawn(move || {
                    let _ = answer_404(&mut conn);
                });
            }
        });
        Self { addr, stop }
    }

    /// "http://127.0.0.1:PORT".
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for NotS3Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr); // wake the accept loop
    }
}

/// Answers each request on `conn` (headers read up to the blank line; the
/// clients send no bodies here) with a 404 HTML page.
fn answer_404(conn: &mut TcpStream) -> io::Result<()> {
    let body = "<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n<body><h1>Not Found</h1><p>The requested URL was not found on this server.</p></body></html>\n";
    let answer = format!(
        "HTTP/1.1 404 Not Found\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut buf = vec![0u8; 64 * 1024];
    let mut held = Vec::new();
    loop {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        held.extend_from_slice(&buf[..n]);
        while let Some(end) = held.windows(4).position(|w| w == b"\r\n\r\n") {
            held.drain(..end + 4);
            conn.write_all(answer.as_bytes())?;
        }
    }
}

/// Writes and deletes through the S3 API (OpenDAL on a small runtime).
pub struct Client {
    endpoint: String,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    /// A client of the server at `endpoint`, with the test credentials.
    pub fn new(endpoint: &str) -> Self {
        opendal::install_default();
        Self {
            endpoint: endpoint.to_string(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime"),
        }
    }

    fn op(&self, bucket: &str) -> opendal::Operator {
        let _guard = self.runtime.enter();
        opendal::Operator::via_iter(
            "s3",
            [
                ("bucket", bucket),
                ("endpoint", self.endpoint.as_str()),
                ("region", "us-east-1"),
                ("access_key_id", ACCESS_KEY),
                ("secret_access_key", SECRET_KEY),
                ("disable_config_load", "true"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .expect("operator")
    }

    /// Writes (or overwrites) an object; panics on failure.
    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        let op = self.op(bucket);
        let data = data.to_vec();
        self.runtime
            .block_on(op.write(key, data))
            .unwrap_or_else(|e| panic!("PUT {bucket}/{key}: {e}"));
    }

    /// Deletes an object; panics on failure.
    pub fn delete(&self, bucket: &str, key: &str) {
        let op = self.op(bucket);
        self.runtime
            .block_on(op.delete(key))
            .unwrap_or_else(|e| panic!("DELETE {bucket}/{key}: {e}"));
    }
}

/// Counts of what went through a [`FaultProxy`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ProxyCounts {
    /// Requests received.
    pub requests: u64,
    /// GETs among them (listings included).
    pub gets: u64,
    /// Listings among the GETs (a GET of a bucket, not of an object): a
    /// node's GETs of data are `gets - lists`.
    pub lists: u64,
    /// HEADs among them.
    pub heads: u64,
    /// Bytes from the server to the clients.
    pub bytes_down: u64,
    /// Requests answered 503 SlowDown by the proxy.
    pub injected_503: u64,
    /// Connections closed unanswered by the proxy.
    pub dropped: u64,
}

#[derive(Default)]
struct ProxyState {
    delay_ms: Mutex<(u64, u64)>,
    /// Added to every PUT, on top of `delay_ms`.
    put_delay_ms: AtomicU64,
    /// GETs of objects still to be slowed down by `slow_get_ms` (a tail).
    slow_gets: AtomicU64,
    slow_get_ms: AtomicU64,
    /// Bytes a second down, all connections together, and when the link
    /// is free again (`None`: no cap).
    link: Mutex<Option<(f64, Instant)>>,
    fail_503: AtomicU64,
    drop_next: AtomicU64,
    requests: AtomicU64,
    gets: AtomicU64,
    lists: AtomicU64,
    heads: AtomicU64,
    bytes_down: AtomicU64,
    injected_503: AtomicU64,
    dropped: AtomicU64,
    stop: AtomicBool,
    seed: AtomicU64,
}

/// A TCP proxy with per-request delay and injected faults.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
}

impl FaultProxy {
    /// Listens on a free local port and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listener");
        let addr = listener.local_addr().expect("proxy addr");
        let state = Arc::new(ProxyState::default());
        state.seed.store(0x2545_f491_4f6c_dd1d, Ordering::Relaxed);
        let st = Arc::clone(&state);
        std::thread::Builder::new()
            .name("s3-proxy".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if st.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(client) = conn else { continue };
                    let st = Arc::clone(&st);
                    std::thread::spawn(move || {
                        let _ = serve(client, upstream, &st);
                    });
                }
            })
            .expect("proxy thread");
        Self { addr, state }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL clients use to go through the proxy.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request waits a delay drawn uniformly from [min, max] ms.
    pub fn set_delay_ms(&self, min_ms: u64, max_ms: u64) {
        assert!(min_ms <= max_ms);
        *self.state.delay_ms.lock().expect("proxy poisoned") = (min_ms, max_ms);
    }

    /// Every PUT waits `ms` more (a store slow to take writes).
    pub fn set_put_delay_ms(&self, ms: u64) {
        self.state.put_delay_ms.store(ms, Ordering::Relaxed);
    }

    /// The next `n` GETs of objects (listings apart) wait `ms` more each:
    /// a store's tail latency, on top of every request's delay.
    pub fn slow_next_gets(&self, n: u64, ms: u64) {
        self.state.slow_get_ms.store(ms, Ordering::SeqCst);
        self.state.slow_gets.store(n, Ordering::SeqCst);
    }

    /// Answers go down at most `mib_per_sec` MiB a second, all connections
    /// together (0: no cap).
    pub fn set_link_mib_per_sec(&self, mib_per_sec: f64) {
        assert!(mib_per_sec >= 0.0 && mib_per_sec.is_finite());
        *self.state.link.lock().expect("proxy poisoned") =
            (mib_per_sec > 0.0).then(|| (mib_per_sec * (1u64 << 20) as f64, Instant::now()));
    }

    /// The next `n` requests are answered 503 SlowDown (never forwarded).
    pub fn fail_next_with_503(&self, n: u64) {
        self.state.fail_503.store(n, Ordering::SeqCst);
    }

    /// The next `n` requests see their connection closed, unanswered.
    pub fn drop_next(&self, n: u64) {
        self.state.drop_next.store(n, Ordering::SeqCst);
    }

    /// What went through so far.
    pub fn counts(&self) -> ProxyCounts {
        let s = &self.state;
        ProxyCounts {
            requests: s.requests.load(Ordering::Relaxed),
            gets: s.gets.load(Ordering::Relaxed),
            lists: s.lists.load(Ordering::Relaxed),
            heads: s.heads.load(Ordering::Relaxed),
            bytes_down: s.bytes_down.load(Ordering::Relaxed),
            injected_503: s.injected_503.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr); // wake the accept loop
    }
}

fn take_one(counter: &AtomicU64) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn slow_down_answer() -> Vec<u8> {
    let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
    format!(
        "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Idle time of a capped link credited to the next bytes.
const LINK_BURST: Duration = Duration::from_millis(10);

impl ProxyState {
    /// Waits the delay of a request whose first bytes are `request`.
    fn delay_request(&self, request: &[u8]) {
        let put_delay_ms = self.put_delay_ms.load(Ordering::Relaxed);
        if put_delay_ms > 0 && request.starts_with(b"PUT ") {
            std::thread::sleep(Duration::from_millis(put_delay_ms));
        }
        if request.starts_with(b"GET ") && !is_listing(request) && take_one(&self.slow_gets) {
            let ms = self.slow_get_ms.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(ms));
        }
        let (lo, hi) = *self.delay_ms.lock().expect("proxy poisoned");
        if hi > 0 {
            let x = self
                .seed
                .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
                .wrapping_mul(0xbf58_476d_1ce4_e5b9);
            let ms = lo + (x >> 33) % (hi - lo + 1);
            std::thread::sleep(Duration::from_millis(ms));
        }
    }

    /// Waits until the capped link has carried `bytes` (each chunk takes
    /// its turn on the one link).
    fn wait_for_link(&self, bytes: usize) {
        let wait = {
            let mut link = self.link.lock().expect("proxy poisoned");
            let Some((bytes_per_sec, free_at)) = link.as_mut() else {
                return;
            };
            let now = Instant::now();
            // Up to LINK_BURST of idle link is credited: a sleep that ran
            // long does not lower the rate below the cap.
            let start = (*free_at).max(now.checked_sub(LINK_BURST).unwrap_or(now));
            *free_at = start + Duration::from_secs_f64(bytes as f64 / *bytes_per_sec);
            free_at.saturating_duration_since(now)
        };
        std::thread::sleep(wait);
    }
}

fn serve(client: TcpStream, upstream: SocketAddr, st: &Arc<ProxyState>) -> io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    // Set by the server->client pump when an answer went out: the next
    // bytes from the client start a new request.
    let answered = Arc::new(AtomicBool::new(true));
    let (mut s_read, mut c_write) = (server.try_clone()?, client.try_clone()?);
    let answered_down = Arc::clone(&answered);
    let st_down = Arc::clone(st);
    let down = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match s_read.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    st_down.bytes_down.fetch_add(n as u64, Ordering::Relaxed);
                    st_down.wait_for_link(n);
                    answered_down.store(true, Ordering::Release);
                    if c_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = c_write.shutdown(Shutdown::Write);
    });
    let (mut c_read, mut s_write) = (client.try_clone()?, server.try_clone()?);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match c_read.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if answered.swap(false, Ordering::AcqRel) {
            // A new request.
            st.requests.fetch_add(1, Ordering::Relaxed);
            if buf[..n].starts_with(b"GET ") {
                st.gets.fetch_add(1, Ordering::Relaxed);
                if is_listing(&buf[..n]) {
                    st.lists.fetch_add(1, Ordering::Relaxed);
                }
            } else if buf[..n].starts_with(b"HEAD ") {
                st.heads.fetch_add(1, Ordering::Relaxed);
            }
            if take_one(&st.drop_next) {
                st.dropped.fetch_add(1, Ordering::Relaxed);
                break;
            }
            if take_one(&st.fail_503) {
                st.injected_503.fetch_add(1, Ordering::Relaxed);
                let mut c = client.try_clone()?;
                let _ = c.write_all(&slow_down_answer());
                break;
            }
            st.delay_request(&buf[..n]);
        }
        if s_write.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
    let _ = down.join();
    Ok(())
}

/// GETs an `l2arc mount s3://` or `serve-nbd s3://` says it issued of its
/// source, from its closing line (`l2arc: s3 requests: N GETs ...`).
pub fn gets_in_log(log: &str) -> u64 {
    const PREFIX: &str = "l2arc: s3 requests: ";
    let line = log
        .lines()
        .find(|l| l.starts_with(PREFIX))
        .unwrap_or_else(|| panic!("no s3 requests line in:\n{log}"));
    line[PREFIX.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of GETs in {line:?}"))
}

/// Whether a request (its first bytes) is a GET of a bucket (a listing)
/// rather than of an object: path style, its path (before any `?`) names
/// one segment at most.
fn is_listing(request: &[u8]) -> bool {
    let Some(target) = request
        .strip_prefix(b"GET ")
        .and_then(|rest| rest.split(|&b| b == b' ').next())
    else {
        return false;
    };
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    path.split(|&b| b == b'/').filter(|s| !s.is_empty()).count() <= 1
}

#[cfg(test)]
mod listing_tests {
    #[test]
    fn a_get_of_a_bucket_is_a_listing_and_of_an_object_is_not() {
        assert!(super::is_listing(
            b"GET /b?list-type=2&prefix=x%2F HTTP/1.1\r\n"
        ));
        assert!(super::is_listing(b"GET /b/ HTTP/1.1\r\n"));
        assert!(!super::is_listing(b"GET /b/f0 HTTP/1.1\r\n"));
        assert!(!super::is_listing(b"GET /b/dir/f0?x=1 HTTP/1.1\r\n"));
        assert!(!super::is_listing(b"HEAD /b HTTP/1.1\r\n"));
    }
}
