//! What several test suites of the workspace need alike, kept in one place
//! so that a message or a rule changes once: where the reference traces
//! are (and the one clear failure when they are not), and what a command's
//! error must look like to a user (one line, prefixed with the program's
//! name, no panic or backtrace). A dev-dependency only.

pub mod mapping;
pub mod nbd;
pub mod s3;
pub mod service;

use std::path::{Path, PathBuf};
use std::process::Output;

/// A reference trace from `shared/traces/` beside the repository. Fails the
/// test with a message that says where it was looked for, never skips.
pub fn reference_trace(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "reference trace {} is missing: this repository must be checked out \
         beside shared/ (shared/traces/{name}); see shared/traces/README.md",
        path.display()
    );
    path
}

/// A failed command printed exactly one line, `PROGRAM: ...` containing
/// `must_contain`, with no panic or backtrace, and exited nonzero.
pub fn assert_one_line_error(out: &Output, program: &str, must_contain: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert_eq!(
        stderr.lines().count(),
        1,
        "expected one line of error, got: {stderr:?}"
    );
    assert!(
        stderr.starts_with(&format!("{program}: ")),
        "error not prefixed with {program}: {stderr:?}"
    );
    assert!(
        stderr.contains(must_contain),
        "error {stderr:?} lacks {must_contain:?}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
}

/// A command for an outside tool the tests drive (fio, qemu-io, promtool,
/// ...). Fails the test, never skips it, when the tool is not installed,
/// naming `installs`: what `scripts/setup.sh` installs that provides it.
pub fn tool(name: &str, installs: &str) -> std::process::Command {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{name}` is not installed: run scripts/setup.sh (it installs {installs})"
    );
    std::process::Command::new(name)
}

/// Runs a command that must succeed; its output, or a failure that shows
/// the command, its status and both its outputs.
pub fn run(cmd: &mut std::process::Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `BIN ctl --socket SOCKET ARGS...`: its standard output (the test
/// fails if it fails).
pub fn ctl(bin: &std::path::Path, socket: &std::path::Path, args: &[&str]) -> String {
    let out = run(std::process::Command::new(bin)
        .arg("ctl")
        .arg("--socket")
        .arg(socket)
        .args(args));
    String::from_utf8(out.stdout).expect("ctl prints UTF-8")
}

/// The value of the kstat `name` in lines of `name value` (`ctl stats`,
/// or a stop's counters); the test fails if it is not there.
pub fn kstat(lines: &str, name: &str) -> u64 {
    lines
        .lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some(name)).then(|| words.next().map(str::parse::<u64>))
        })
        .flatten()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("no {name} in:\n{lines}"))
}

/// The lines a spawned child writes to its stderr (piped), as they come,
/// read by a thread of their own so the child never blocks on a full pipe.
pub fn stderr_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().expect("the child's stderr is piped");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// A spawned child's stderr (piped) gathered line by line into a shared
/// log, by a thread of its own; the receiver gets one message when a line
/// that starts with `ready` arrives (a service's ready line).
pub fn stderr_log(
    child: &mut std::process::Child,
    ready: &str,
) -> (
    std::sync::Arc<std::sync::Mutex<String>>,
    std::sync::mpsc::Receiver<()>,
) {
    let lines = stderr_lines(child);
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = std::sync::Arc::clone(&log);
    let ready = ready.to_string();
    std::thread::spawn(move || {
        for line in lines {
            if line.starts_with(&ready) {
                let _ = tx.send(());
            }
            let mut log = sink.lock().expect("log poisoned");
            log.push_str(&line);
            log.push('\n');
        }
    });
    (log, rx)
}

/// `GET path` from a service's HTTP endpoint: the status and the body
/// (10 s at most for the answer).
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the HTTP endpoint");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("a read timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("send the request");
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

/// The samples of a Prometheus text page by series (name with labels).
pub fn prometheus_samples(page: &str) -> std::collections::HashMap<String, f64> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a series and a value");
            (series.to_string(), value.parse().expect("a number"))
        })
        .collect()
}

/// Checks a Prometheus text page with `promtool check metrics` (Debian
/// `prometheus`); fails with promtool's words if it says anything at all,
/// an error or a lint.
pub fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = tool("promtool", "prometheus, which has promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool ran");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Silent: a lint is printed with a zero exit, and is a failure here.
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}"
    );
}

/// Waits (20 s at most) for a spawned service's ready line, a stderr line
/// starting with `ready`; returns the address of its HTTP endpoint when it
/// printed one before (`l2arc: http on http://ADDR/`).
pub fn wait_ready(
    rx: &std::sync::mpsc::Receiver<String>,
    ready: &str,
) -> Option<std::net::SocketAddr> {
    let mut http = None;
    loop {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no `{ready}` line within 20 s"));
        if let Some(rest) = line.strip_prefix("l2arc: http on http://") {
            http = Some(rest.trim_end_matches('/').parse().expect("an address"));
        }
        if line.starts_with(ready) {
            return http;
        }
    }
}

/// Runs a Playwright-for-Python `script` (in the Python environment that
/// `scripts/setup.sh` makes in `.tools/venv`, driving the system Chromium)
/// on `target` (a URL or a file), and returns what it printed (the page's
/// findings as JSON) and where its screenshot went: `$L2ARC_SCREENSHOT` if
/// set, else `screenshot`. Fails, never skips, when a tool is missing, and
/// when the script fails (its outputs shown).
pub fn browse(script: &Path, target: &str, screenshot: &Path) -> (String, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".tools/venv/bin/python");
    for (path, what) in [
        (&python, "the Python environment with Playwright"),
        (&script.to_path_buf(), "the browser script"),
    ] {
        assert!(
            path.exists(),
            "{what} ({}) is missing: run scripts/setup.sh",
            path.display()
        );
    }
    drop(tool("chromium", "chromium"));
    let screenshot = std::env::var_os("L2ARC_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| screenshot.to_path_buf());
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(target)
        .arg(&screenshot)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{target} failed in Chromium:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (stdout, screenshot)
}

/// VmRSS and VmHWM of `pid` (from /proc), in bytes.
pub fn rss_and_peak_bytes(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .map(|v| v.trim().parse::<u64>().unwrap() * 1024)
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Calls `probe` every 2 ms until it holds or `limit` passes: how long it
/// took, or `None`. For liveness bounds ("seen within 2 s"), not speed.
pub fn within(
    limit: std::time::Duration,
    mut probe: impl FnMut() -> bool,
) -> Option<std::time::Duration> {
    let start = std::time::Instant::now();
    loop {
        if probe() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}
