//! What the tests of `l2arc serve-nbd` share: the service started on a
//! Unix socket and stopped with SIGTERM, a loop device for the
//! block-device cases, and the deterministic bytes images are filled with.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Deterministic, incompressible-looking bytes (xorshift), different per
/// seed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// `l2arc serve-nbd` running on a Unix socket; killed on drop.
pub struct ServeNbd {
    /// The socket it listens on.
    pub socket: PathBuf,
    /// The service.
    pub child: Child,
    /// Its stderr lines after the ready line, as they come.
    pub stderr: mpsc::Receiver<String>,
    /// Its ready line (`l2arc: serving IMAGE on unix:SOCKET`).
    pub ready_line: String,
}

impl ServeNbd {
    /// Starts `l2arc` (the binary) `serve-nbd IMAGE --listen unix:SOCKET
    /// EXTRA...` and waits up to 20 s for its ready line.
    pub fn start(l2arc: &Path, image: &Path, socket: &Path, extra: &[&str]) -> ServeNbd {
        let mut child = Command::new(l2arc)
            .arg("serve-nbd")
            .arg(image)
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start l2arc serve-nbd");
        let stderr = crate::stderr_lines(&mut child);
        let ready_line = std::iter::from_fn(|| stderr.recv_timeout(Duration::from_secs(20)).ok())
            .find(|line| line.starts_with("l2arc: serving "))
            .expect("serve-nbd printed no ready line within 20 s");
        assert!(
            ready_line.ends_with(&format!(" on unix:{}", socket.display())),
            "{ready_line}"
        );
        ServeNbd {
            socket: socket.to_path_buf(),
            child,
            stderr,
            ready_line,
        }
    }

    /// `nbd+unix:///?socket=SOCKET`.
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// Sends SIGTERM and waits up to 20 s: the exit status and the stderr
    /// lines not taken yet.
    pub fn stop(&mut self) -> (ExitStatus, Vec<String>) {
        crate::run(Command::new("kill").args(["-TERM", &self.child.id().to_string()]));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for serve-nbd") {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "serve-nbd did not stop on SIGTERM"
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
        assert!(status.success(), "serve-nbd exited with {status}");
        rest.into_iter()
            .find(|l| l.starts_with("l2arc: stopped:"))
            .expect("serve-nbd printed a stop line")
    }
}

impl Drop for ServeNbd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loop device over a file, detached on drop.
pub struct LoopDevice(pub PathBuf);

impl LoopDevice {
    /// `losetup --find --show backing`: fails the test (never skips) if it
    /// cannot.
    pub fn attach(backing: &Path) -> LoopDevice {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .expect(
                "cannot run losetup: these tests need util-linux's losetup, root and loop devices",
            );
        assert!(
            out.status.success(),
            "losetup failed (needs root and loop devices): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        LoopDevice(PathBuf::from(
            String::from_utf8(out.stdout)
                .expect("losetup prints a path")
                .trim()
                .to_string(),
        ))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}
