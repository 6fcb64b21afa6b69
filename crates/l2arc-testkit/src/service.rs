//! `l2arc serve-nbd` and `l2arc mount` started by tests and the soak, and
//! awaited until they say they are ready.
//!
//! Why a builder. A service is usable only once it prints its ready line
//! (`l2arc: serving IMAGE on ADDR`, `l2arc: mounted SOURCE at MNT`), so
//! every test that starts one must spawn it with its stderr piped, read
//! that stderr on a thread (a full pipe would block the service), wait for
//! the line with a deadline, and kill it on the way out whatever happens.
//! Seventeen places did that by hand, each a little differently. Here the
//! command line is built from what the test says (`serve_nbd`, `mount`,
//! `listen_unix`, `arg`), and `start` returns a [`Running`] service that
//! has printed its ready line, with the lines it printed before (the
//! memory line, the HTTP address) kept and the later ones still coming.
//! Tests whose point is the CLI's own argument handling build their argv
//! by hand, on purpose.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long `start` waits for the ready line unless told.
pub const READY_WITHIN_DEFAULT: Duration = Duration::from_secs(20);

/// Which service, and what its ready line must name.
#[derive(Clone, Debug)]
enum Kind {
    /// `serve-nbd`; the Unix socket it listens on, if one was given.
    ServeNbd { socket: Option<PathBuf> },
    /// `mount`; its mount point.
    Mount { mountpoint: PathBuf },
}

/// A service's command line, not started yet.
pub struct Service {
    command: Command,
    kind: Kind,
    ready_within: Duration,
}

impl Service {
    /// `l2arc serve-nbd IMAGE` (the binary `l2arc`); add `listen_unix` or
    /// `--listen` and the options with the other methods.
    pub fn serve_nbd(l2arc: &Path, image: impl AsRef<OsStr>) -> Service {
        let mut command = Command::new(l2arc);
        command.arg("serve-nbd").arg(image);
        Service {
            command,
            kind: Kind::ServeNbd { socket: None },
            ready_within: READY_WITHIN_DEFAULT,
        }
    }

    /// `l2arc mount SOURCE MOUNTPOINT` (SOURCE a directory or `s3://...`).
    pub fn mount(l2arc: &Path, source: impl AsRef<OsStr>, mountpoint: &Path) -> Service {
        let mut command = Command::new(l2arc);
        command.arg("mount").arg(source).arg(mountpoint);
        Service {
            command,
            kind: Kind::Mount {
                mountpoint: mountpoint.to_path_buf(),
            },
            ready_within: READY_WITHIN_DEFAULT,
        }
    }

    /// `--listen unix:SOCKET` (serve-nbd): the ready line must name it.
    pub fn listen_unix(mut self, socket: &Path) -> Service {
        let Kind::ServeNbd { socket: listening } = &mut self.kind else {
            panic!("listen_unix is an option of serve-nbd");
        };
        *listening = Some(socket.to_path_buf());
        self.command
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()));
        self
    }

    /// One more argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Service {
        self.command.arg(arg);
        self
    }

    /// More arguments.
    pub fn args<I, S>(mut self, args: I) -> Service
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command.args(args);
        self
    }

    /// An environment variable of the service.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Service {
        self.command.env(key, value);
        self
    }

    /// Removes an environment variable the service would inherit.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Service {
        self.command.env_remove(key);
        self
    }

    /// The command line so far, for what the builder does not say.
    pub fn command_mut(&mut self) -> &mut Command {
        &mut self.command
    }

    /// The command line, to run by hand (a test of how it fails).
    pub fn into_command(self) -> Command {
        self.command
    }

    /// How long `start` waits for the ready line.
    pub fn ready_within(mut self, within: Duration) -> Service {
        self.ready_within = within;
        self
    }

    /// Starts the service (stdout discarded, stderr read line by line) and
    /// waits for its ready line; fails the test with the lines it printed
    /// if it exits or stays silent past the deadline.
    pub fn start(self) -> Running {
        self.try_start().unwrap_or_else(|why| panic!("{why}"))
    }

    /// As [`Self::start`], for a test that expects it may not start: `Err`
    /// says how it ended and what it printed.
    pub fn try_start(mut self) -> Result<Running, String> {
        let mut child = self
            .command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {:?}: {e}", self.command));
        let stderr = crate::stderr_lines(&mut child);
        let mut running = Running {
            child,
            stderr,
            before_ready: Vec::new(),
            ready_line: String::new(),
            kind: self.kind,
        };
        let (prefix, names) = running.ready_line_wanted();
        let deadline = Instant::now() + self.ready_within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match running.stderr.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => {
                    assert!(
                        names.as_ref().is_none_or(|n| line.contains(n.as_str())),
                        "the ready line names another place than {names:?}: {line}"
                    );
                    running.ready_line = line;
                    return Ok(running);
                }
                Ok(line) => running.before_ready.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "{:?} printed no `{prefix}` line within {:?}; it said:\n{}",
                        self.command,
                        self.ready_within,
                        running.before_ready.join("\n")
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!(
                        "{:?} exited ({:?}) before its ready line; it said:\n{}",
                        self.command,
                        running.child.wait(),
                        running.before_ready.join("\n")
                    ));
                }
            }
        }
    }
}

/// A service that printed its ready line; killed on drop (a mount is
/// unmounted first).
pub struct Running {
    /// The service.
    pub child: Child,
    /// Its stderr lines after the ready line, as they come.
    pub stderr: Receiver<String>,
    /// Its stderr lines before the ready line.
    pub before_ready: Vec<String>,
    /// Its ready line.
    pub ready_line: String,
    kind: Kind,
}

impl Running {
    /// The ready line's start, and what it must name.
    fn ready_line_wanted(&self) -> (&'static str, Option<String>) {
        match &self.kind {
            Kind::ServeNbd { socket } => (
                "l2arc: serving ",
                socket.as_ref().map(|s| format!(" on unix:{}", s.display())),
            ),
            Kind::Mount { mountpoint } => (
                "l2arc: mounted ",
                Some(format!(" at {}", mountpoint.display())),
            ),
        }
    }

    /// The service's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The Unix socket a `serve-nbd` listens on (given to `listen_unix`).
    pub fn socket(&self) -> &Path {
        match &self.kind {
            Kind::ServeNbd {
                socket: Some(socket),
            } => socket,
            _ => panic!("not a serve-nbd listening on a Unix socket"),
        }
    }

    /// `nbd+unix:///?socket=SOCKET`.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket().display())
    }

    /// The mount point of a `mount`.
    pub fn mountpoint(&self) -> &Path {
        match &self.kind {
            Kind::Mount { mountpoint } => mountpoint,
            Kind::ServeNbd { .. } => panic!("not a mount"),
        }
    }

    /// The address of its HTTP endpoint, if it printed one before the
    /// ready line (`l2arc: http on http://ADDR/`).
    pub fn http(&self) -> Option<std::net::SocketAddr> {
        self.before_ready.iter().find_map(|line| {
            let rest = line.strip_prefix("l2arc: http on http://")?;
            Some(rest.trim_end_matches('/').parse().expect("an address"))
        })
    }

    /// The first line before the ready line that starts with `prefix`.
    pub fn line_before_ready(&self, prefix: &str) -> Option<&str> {
        self.before_ready
            .iter()
            .find(|l| l.starts_with(prefix))
            .map(String::as_str)
    }

    /// The next stderr line after the ready line that starts with
    /// `prefix`, waiting up to `within` for each line.
    pub fn next_line(&self, prefix: &str, within: Duration) -> Option<String> {
        std::iter::from_fn(|| self.stderr.recv_timeout(within).ok()).find(|l| l.starts_with(prefix))
    }

    /// Gathers every stderr line into one log, from the first (the lines
    /// before the ready line and the ready line are in it already) to the
    /// last, by a thread of its own; `stderr` receives nothing after this.
    pub fn gather_stderr(&mut self) -> Arc<Mutex<String>> {
        let mut text = String::new();
        for line in self.before_ready.iter().chain([&self.ready_line]) {
            text.push_str(line);
            text.push('\n');
        }
        let log = Arc::new(Mutex::new(text));
        let (_, closed) = std::sync::mpsc::channel();
        let lines = std::mem::replace(&mut self.stderr, closed);
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in lines {
                let mut log = sink.lock().expect("log poisoned");
                log.push_str(&line);
                log.push('\n');
            }
        });
        log
    }

    /// Sends SIGTERM and waits up to 20 s: the exit status and the stderr
    /// lines not taken yet.
    pub fn stop(&mut self) -> (ExitStatus, Vec<String>) {
        crate::run(Command::new("kill").args(["-TERM", &self.child.id().to_string()]));
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for the service") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the service did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader thread has the last lines once the pipe closes.
        let rest =
            std::iter::from_fn(|| self.stderr.recv_timeout(Duration::from_secs(5)).ok()).collect();
        (status, rest)
    }

    /// Stops it cleanly and returns its stop line (`l2arc: stopped: ...`).
    pub fn stop_line(&mut self) -> String {
        let (status, rest) = self.stop();
        assert!(status.success(), "the service exited with {status}");
        rest.into_iter()
            .find(|l| l.starts_with("l2arc: stopped:"))
            .expect("the service printed a stop line")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Kind::Mount { mountpoint } = &self.kind
            && matches!(self.child.try_wait(), Ok(None))
        {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(mountpoint)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
