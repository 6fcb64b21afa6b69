//! The listening socket and the client sockets it hands out.
//!
//! Why a module of its own. The server's policy (who is admitted, who is
//! bumped, who is charged what) is pure code elsewhere; what is here is
//! the part that touches the kernel: binding, polling and accepting, and
//! the one socket type the rest of the server sees (`Conn`, a Unix or TCP
//! stream) so that no other module matches on the transport. The accept
//! loop polls with a timeout (`ACCEPT_POLL_MS`) rather than blocking in
//! `accept`, because a stop flag set by a signal handler must be seen
//! without a client arriving, and because the image watch's descriptor is
//! polled in the same call (one wake-up for both). Errors that a busy
//! server meets in the normal course (a client that left before it was
//! accepted, no descriptor left) are retried, never fatal: running out
//! of descriptors is relieved by connections closing.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// How often the accept loop looks at the stop flag.
const ACCEPT_POLL_MS: i32 = 100;

/// Where to listen: `unix:PATH` or `HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// A unix socket path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path (unix:/run/l2arc.sock)".into());
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        use std::net::ToSocketAddrs;
        let addr = s
            .to_socket_addrs()
            .map_err(|e| format!("`{s}` is not unix:PATH or HOST:PORT: {e}"))?
            .next()
            .ok_or_else(|| format!("`{s}` resolves to no address"))?;
        Ok(ListenAddr::Tcp(addr))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// A bound listening socket.
pub enum Listener {
    /// A unix socket and the path it removes when dropped.
    Unix(UnixListener, PathBuf),
    /// A TCP socket.
    Tcp(TcpListener),
}

impl Listener {
    /// Binds `addr`. A Unix socket path that exists is replaced only if it
    /// is a socket nobody listens on (left behind by a crash).
    pub fn bind(addr: &ListenAddr) -> io::Result<Self> {
        match addr {
            ListenAddr::Unix(path) => {
                if let Ok(meta) = std::fs::symlink_metadata(path)
                    && meta.file_type().is_socket()
                    && UnixStream::connect(path).is_err()
                {
                    std::fs::remove_file(path)?;
                }
                Ok(Listener::Unix(UnixListener::bind(path)?, path.clone()))
            }
            ListenAddr::Tcp(a) => Ok(Listener::Tcp(TcpListener::bind(a)?)),
        }
    }

    /// The address actually bound (a TCP port 0 becomes the real port).
    pub fn local_addr(&self) -> io::Result<ListenAddr> {
        match self {
            Listener::Unix(_, p) => Ok(ListenAddr::Unix(p.clone())),
            Listener::Tcp(l) => Ok(ListenAddr::Tcp(l.local_addr()?)),
        }
    }

    fn raw_fd(&self) -> RawFd {
        match self {
            Listener::Unix(l, _) => l.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        }
    }

    fn accept(&self) -> io::Result<Conn> {
        match self {
            Listener::Unix(l, _) => Ok(Conn::Unix(l.accept()?.0)),
            Listener::Tcp(l) => {
                let s = l.accept()?.0;
                s.set_nodelay(true)?;
                Ok(Conn::Tcp(s))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// One client socket.
pub(super) enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    pub(super) fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
        })
    }

    pub(super) fn shutdown(&self) {
        let _ = match self {
            Conn::Unix(s) => s.shutdown(Shutdown::Both),
            Conn::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    pub(super) fn set_timeouts(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Conn::Unix(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
            Conn::Tcp(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
        }
    }
}

impl Conn {
    /// Reads what the socket has now, without waiting (`WouldBlock` if
    /// nothing), whatever its timeouts.
    pub(super) fn recv_now(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let fd = self.as_fd().as_raw_fd();
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes; `fd` is
        // this socket's, open while `self` is.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Conn::Unix(s) => s.as_fd(),
            Conn::Tcp(s) => s.as_fd(),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

/// Waits up to one poll interval for a client, and for events on `also`
/// (whether there are some, second); `None` when no client came or the
/// error is one to retry (an interrupted call, a client that left, or no
/// descriptor left: connections closing will free some).
pub(super) fn accept_within_poll(
    listener: &Listener,
    also: Option<BorrowedFd<'_>>,
) -> (io::Result<Option<Conn>>, bool) {
    let mut pfds = [
        libc::pollfd {
            fd: listener.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: also.map_or(-1, |fd| fd.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds (a negative fd is ignored by poll).
    let ready = unsafe { libc::poll(pfds.as_mut_ptr(), 2, ACCEPT_POLL_MS) };
    if ready < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            (Ok(None), false)
        } else {
            (Err(e), false)
        };
    }
    let events_ready = pfds[1].revents != 0;
    if pfds[0].revents == 0 {
        return (Ok(None), events_ready);
    }
    (accept_ready(listener), events_ready)
}

/// Accepts the client poll saw.
fn accept_ready(listener: &Listener) -> io::Result<Option<Conn>> {
    match listener.accept() {
        Ok(c) => Ok(Some(c)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted
                    | io::ErrorKind::WouldBlock
                    | io::ErrorKind::ConnectionAborted
            ) =>
        {
            Ok(None)
        }
        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
            std::thread::sleep(Duration::from_millis(ACCEPT_POLL_MS as u64));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Writes to the client; `io::Write` for `write_all`.
impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Tcp(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write_vectored(bufs),
            Conn::Tcp(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
