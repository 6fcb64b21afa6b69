//! The read-only HTTP endpoint of a service (`--http 127.0.0.1:PORT`):
//! `/metrics` for Prometheus, `/` the live page, `/api/stats` its JSON,
//! `/api/history?window=SECS[&end=MS]` the recorded history (`--history`).
//!
//! Why a small server of our own rather than a crate: the endpoint serves
//! three GET routes, and what matters is that a hostile or broken client
//! cannot hurt the cache it watches. Every bound is explicit here: a
//! request head of at most `REQUEST_HEAD_BYTES_MAX` (more is a 431), at
//! most `CONNECTIONS_MAX` connections served at once (more get a 503 and
//! are closed), `IO_TIMEOUT` on every read and write (a silent client is
//! dropped), one request per connection (`Connection: close`), no body
//! accepted (413). tiny_http, the small sync choice, has no bound on a
//! request head's size; axum would bring a runtime into a binary that has
//! none. The listener binds loopback unless the service was given
//! `--allow-remote`, as NBD's does: the page shows file names and load.
//!
//! Nothing here writes to the cache: the endpoint is read-only by
//! construction (it only calls `Cache::stats` and the analytics).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use l2arc::Cache;

use crate::history::History;

/// Largest request head (request line and headers).
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;
/// Connections served at once.
pub const CONNECTIONS_MAX: usize = 16;
/// Longest wait for a client to send its request or take the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// After answering, unread request bytes are drained (at most this many,
/// for at most this long) so that the close does not reset the answer away.
const DRAIN_BYTES_MAX: usize = 1 << 20;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the acceptor checks for stop when idle.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// The live page's template; the shared chart code is inlined once.
const PAGE_TEMPLATE: &str = include_str!("web/index.html");

fn page_html() -> &'static str {
    static PAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PAGE.get_or_init(|| l2arc_web::inline_charts(PAGE_TEMPLATE))
}

/// A listening endpoint; stops on drop.
pub struct HttpServer {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    /// Listens on `addr`; a non-loopback address needs `allow_remote`.
    pub(crate) fn start(
        cache: Arc<Cache>,
        history: Option<Arc<History>>,
        addr: SocketAddr,
        allow_remote: bool,
    ) -> Result<Self> {
        if !addr.ip().is_loopback() && !allow_remote {
            bail!(
                "--http {addr} is not a loopback address: the page shows the cache's load and names; add --allow-remote to serve it to the network"
            );
        }
        let listener = TcpListener::bind(addr).with_context(|| format!("--http {addr}"))?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopping);
        let active = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name("l2arc-http".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => accept(&cache, history.as_ref(), stream, &active),
                        Err(_) => std::thread::sleep(ACCEPT_POLL),
                    }
                }
            })?;
        Ok(Self {
            addr,
            stopping,
            thread: Some(thread),
        })
    }

    /// Where it listens (the port chosen when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Serves one connection on a thread of its own, or refuses it when
/// `CONNECTIONS_MAX` are being served.
fn accept(
    cache: &Arc<Cache>,
    history: Option<&Arc<History>>,
    stream: TcpStream,
    active: &Arc<AtomicUsize>,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    if active.fetch_add(1, Ordering::SeqCst) >= CONNECTIONS_MAX {
        active.fetch_sub(1, Ordering::SeqCst);
        let _ = respond(&stream, 503, "text/plain", b"too many connections\n", false);
        return;
    }
    let cache = Arc::clone(cache);
    let history = history.cloned();
    let active_for_thread = Arc::clone(active);
    let spawned = std::thread::Builder::new()
        .name("l2arc-http-conn".into())
        .spawn(move || {
            let _ = serve(&cache, history.as_deref(), &stream);
            active_for_thread.fetch_sub(1, Ordering::SeqCst);
        });
    if spawned.is_err() {
        active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub method: String,
    pub path: String,
    /// What follows `?` in the target ("" if nothing).
    pub query: String,
    pub content_length: u64,
}

/// Why a request head was refused: the status and a one-line reason.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refusal(pub u16, pub &'static str);

/// Parses a request head (without the final blank line).
pub(crate) fn parse_head(head: &[u8]) -> Result<Request, Refusal> {
    let text = std::str::from_utf8(head).map_err(|_| Refusal(400, "request is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal(400, "malformed request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(Refusal(400, "only HTTP/1.x is spoken here"));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(Refusal(400, "malformed method"));
    }
    if !target.starts_with('/') {
        return Err(Refusal(400, "request target must be a path"));
    }
    let mut content_length = 0;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(Refusal(400, "malformed header line"));
        };
        if name.eq_ignore_ascii_case("content-length") {
            content_length = value
                .trim()
                .parse()
                .map_err(|_| Refusal(400, "malformed Content-Length"))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Refusal(413, "request bodies are not accepted"));
        }
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        query: query.to_string(),
        content_length,
    })
}

/// Reads a request head of at most `REQUEST_HEAD_BYTES_MAX` bytes.
fn read_head(mut stream: &TcpStream) -> Result<Vec<u8>, Refusal> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(end);
            return Ok(head);
        }
        if head.len() >= REQUEST_HEAD_BYTES_MAX {
            return Err(Refusal(431, "request head larger than 8 KiB"));
        }
        let want = (REQUEST_HEAD_BYTES_MAX + 4 - head.len()).min(chunk.len());
        match stream.read(&mut chunk[..want]) {
            Ok(0) => return Err(Refusal(400, "connection closed before the request ended")),
            Ok(n) => head.extend_from_slice(&chunk[..n]),
            Err(_) => return Err(Refusal(408, "request not received in time")),
        }
    }
}

fn serve(cache: &Cache, history: Option<&History>, stream: &TcpStream) -> std::io::Result<()> {
    let request = read_head(stream).and_then(|head| parse_head(&head));
    let request = match request {
        Ok(r) => r,
        Err(Refusal(status, why)) => {
            return respond(
                stream,
                status,
                "text/plain",
                format!("{why}\n").as_bytes(),
                false,
            );
        }
    };
    let head_only = request.method == "HEAD";
    if request.method != "GET" && !head_only {
        return respond(
            stream,
            405,
            "text/plain",
            b"read-only: GET and HEAD only\n",
            false,
        );
    }
    if request.content_length > 0 {
        return respond(
            stream,
            413,
            "text/plain",
            b"request bodies are not accepted\n",
            false,
        );
    }
    let (status, content_type, body) = route(cache, history, &request);
    respond(stream, status, content_type, &body, head_only)
}

/// The answer to a well-formed GET: status, content type and body.
fn route(
    cache: &Cache,
    history: Option<&History>,
    request: &Request,
) -> (u16, &'static str, Vec<u8>) {
    const JSON: &str = "application/json";
    const TEXT: &str = "text/plain";
    match request.path.as_str() {
        "/" | "/index.html" => (
            200,
            "text/html; charset=utf-8",
            page_html().as_bytes().to_vec(),
        ),
        "/metrics" => (
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            crate::metrics::prometheus(cache).into_bytes(),
        ),
        "/api/stats" => (
            200,
            JSON,
            stats_json(cache, history).to_string().into_bytes(),
        ),
        "/api/history" => match history_json(history, &request.query) {
            Ok(json) => (200, JSON, json.to_string().into_bytes()),
            Err(Refusal(status, why)) => (status, TEXT, format!("{why}\n").into_bytes()),
        },
        _ => (
            404,
            TEXT,
            b"not found: /, /metrics, /api/stats and /api/history are served\n".to_vec(),
        ),
    }
}

/// `/api/stats`: the live snapshot, and whether a history is kept.
fn stats_json(cache: &Cache, history: Option<&History>) -> serde_json::Value {
    let mut json = crate::metrics::json_snapshot(cache);
    json["history_enabled"] = serde_json::Value::Bool(history.is_some());
    // The breakdown by dataset charts reads and misses too.
    if let Some(datasets) = json["datasets"].as_array_mut() {
        for (i, d) in datasets.iter_mut().enumerate() {
            let a = cache.analytics().dataset(i);
            d["reads"] = a.reads.into();
            d["misses"] = a.misses.into();
        }
    }
    json["device_histograms"] = device_histograms_json(cache);
    json
}

/// The L2ARC-hit histogram of each cache-device slot that has one, as
/// sparse `[low_ns, count]` buckets (the per-device heat maps).
fn device_histograms_json(cache: &Cache) -> serde_json::Value {
    let slots: serde_json::Map<String, serde_json::Value> = cache
        .analytics()
        .device_histograms()
        .into_iter()
        .map(|(slot, h)| {
            let buckets: Vec<[u64; 2]> = h
                .counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(b, c)| [l2arc::latency::bucket_low_ns(b), *c])
                .collect();
            (slot.to_string(), serde_json::json!({ "buckets": buckets }))
        })
        .collect();
    slots.into()
}

/// `/api/history?window=SECS[&end=MS]` (default: the last hour, now).
fn history_json(history: Option<&History>, query: &str) -> Result<serde_json::Value, Refusal> {
    let Some(history) = history else {
        return Err(Refusal(
            404,
            "no history: start the service with --history PATH",
        ));
    };
    let mut window_secs = crate::history::SECONDS_KEPT;
    let mut end_ms = crate::history::now_ms();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let number: u64 = value
            .parse()
            .map_err(|_| Refusal(400, "window and end take whole numbers"))?;
        match name {
            "window" if (1..=crate::history::WINDOW_SECS_MAX).contains(&number) => {
                window_secs = number;
            }
            "window" => return Err(Refusal(400, "window: 1 to 604800 seconds")),
            "end" => end_ms = number,
            _ => return Err(Refusal(400, "unknown parameter: window and end are taken")),
        }
    }
    history
        .window_json(end_ms, window_secs)
        .map_err(|_| Refusal(500, "the history file could not be read"))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

fn respond(
    mut stream: &TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n",
        reason(status),
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(body)?;
    }
    stream.flush()?;
    // Let the client read the answer before the close (unread request bytes
    // would otherwise turn it into a reset).
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(DRAIN_TIMEOUT));
    let mut drain = [0u8; 4096];
    let mut left = DRAIN_BYTES_MAX;
    while left > 0 {
        match stream.read(&mut drain) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use l2arc::CacheConfig;

    fn get(addr: SocketAddr, raw: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(raw);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn heads_parse_and_bad_ones_are_refused() {
        let r = parse_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a").unwrap();
        assert_eq!(r.path, "/metrics");
        assert_eq!(parse_head(b"GET /").unwrap_err().0, 400);
        assert_eq!(parse_head(b"GET / SPDY/3").unwrap_err().0, 400);
        assert_eq!(parse_head(b"GET http://x/ HTTP/1.1").unwrap_err().0, 400);
        assert_eq!(
            parse_head(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked")
                .unwrap_err()
                .0,
            413
        );
        assert_eq!(parse_head(b"GET / HTTP/1.1\r\nnocolon").unwrap_err().0, 400);
        assert_eq!(parse_head(&[0xff, 0xfe]).unwrap_err().0, 400);
    }

    #[test]
    fn serves_routes_refuses_abuse_and_keeps_serving() {
        let cache =
            Cache::new(CacheConfig::default().arc_max_bytes(16 << 20).arc_shards(2)).unwrap();
        let server = HttpServer::start(cache, None, "127.0.0.1:0".parse().unwrap(), false).unwrap();
        let addr = server.local_addr();
        let page = get(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
        assert!(page.contains("<canvas"), "the page is served");
        let metrics = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(
            metrics.contains("\nl2arc_arcstats_hits_total 0\n"),
            "{metrics}"
        );
        let json = get(addr, b"GET /api/stats HTTP/1.1\r\n\r\n");
        assert!(json.contains("\"kstats\""), "{json}");

        let huge = get(addr, &vec![b'G'; 64 * 1024]);
        assert!(huge.starts_with("HTTP/1.1 431 "), "{huge}");
        let junk = get(addr, b"\x00\x01garbage\r\n\r\n");
        assert!(junk.starts_with("HTTP/1.1 400 "), "{junk}");
        let post = get(
            addr,
            b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
        );
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        let missing = get(addr, b"GET /etc/passwd HTTP/1.1\r\n\r\n");
        assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");

        // Connections past the bound are refused, not queued forever.
        let silent: Vec<TcpStream> = (0..CONNECTIONS_MAX)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let refused = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(refused.starts_with("HTTP/1.1 503 "), "{refused}");
        drop(silent);
        std::thread::sleep(Duration::from_millis(300));
        let after = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(after.starts_with("HTTP/1.1 200 OK"), "{after}");
    }

    #[test]
    fn remote_addresses_need_allow_remote() {
        let cache =
            Cache::new(CacheConfig::default().arc_max_bytes(16 << 20).arc_shards(2)).unwrap();
        let e = HttpServer::start(cache, None, "0.0.0.0:0".parse().unwrap(), false)
            .err()
            .unwrap();
        assert!(format!("{e}").contains("--allow-remote"), "{e}");
    }
}
