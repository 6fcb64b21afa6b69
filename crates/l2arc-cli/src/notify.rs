//! systemd's readiness protocol (`sd_notify`), without libsystemd.
//!
//! A unit of `Type=notify` is started when the service says so, not when
//! its process exists: a client ordered after `l2arc-nbd@.service` must
//! find the export listening. The protocol is one datagram per message to
//! the socket named in `NOTIFY_SOCKET` (a path, or `@name` for the abstract
//! namespace): `READY=1`, `STATUS=...`, `STOPPING=1`, `RELOADING=1`, and
//! `WATCHDOG=1` at least every `WATCHDOG_USEC` when the unit has
//! `WatchdogSec=` (we send at half of it, as sd_watchdog_enabled(3) advises).
//! Without `NOTIFY_SOCKET` every call does nothing. A send that fails is
//! ignored: the service serves whether or not its manager listens.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Where notifications go, and the watchdog's period, from the environment.
pub(crate) struct Notifier {
    socket: Option<(UnixDatagram, SocketAddr)>,
    watchdog_interval: Option<Duration>,
}

impl Notifier {
    /// From `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`.
    pub(crate) fn from_env() -> Self {
        let socket = std::env::var_os("NOTIFY_SOCKET").and_then(|name| {
            let addr = notify_addr(name.to_str()?)?;
            Some((UnixDatagram::unbound().ok()?, addr))
        });
        let for_us = std::env::var("WATCHDOG_PID")
            .ok()
            .is_none_or(|pid| pid.trim() == std::process::id().to_string());
        let watchdog_interval = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|usec| usec.trim().parse::<u64>().ok())
            .filter(|&usec| usec > 0 && for_us && socket.is_some())
            .map(|usec| Duration::from_micros(usec / 2).max(Duration::from_millis(1)));
        Self {
            socket,
            watchdog_interval,
        }
    }

    /// Sends `state` (`KEY=VALUE` lines) if there is a socket.
    pub(crate) fn send(&self, state: &str) {
        debug_assert!(state.contains('='), "sd_notify states are KEY=VALUE");
        if let Some((socket, addr)) = &self.socket {
            let _ = socket.send_to_addr(state.as_bytes(), addr);
        }
    }

    /// Half of `WATCHDOG_USEC`, when the manager asked for keep-alives.
    pub(crate) fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog_interval
    }
}

/// The address `NOTIFY_SOCKET` names: a path, or `@name` (abstract).
fn notify_addr(name: &str) -> Option<SocketAddr> {
    if let Some(abstract_name) = name.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        return SocketAddr::from_abstract_name(abstract_name.as_bytes()).ok();
    }
    if !name.starts_with('/') {
        return None; // vsock: and other forms are not ours to speak
    }
    SocketAddr::from_pathname(name).ok()
}

/// `MONOTONIC_USEC=` for `RELOADING=1` (systemd 253 asks for it).
pub(crate) fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_MONOTONIC is always there");
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_abstract_names_are_reached() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            socket: Some((
                UnixDatagram::unbound().unwrap(),
                notify_addr(path.to_str().unwrap()).unwrap(),
            )),
            watchdog_interval: None,
        };
        n.send("READY=1");
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
        let name = format!("l2arc-notify-test-{}", std::process::id());
        let addr = notify_addr(&format!("@{name}")).unwrap();
        let server = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier {
            socket: Some((UnixDatagram::unbound().unwrap(), addr)),
            watchdog_interval: None,
        };
        n.send("WATCHDOG=1");
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
        assert!(notify_addr("vsock:2:1").is_none());
    }
}
