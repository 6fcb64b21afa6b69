//! Noticing that the exported image changed behind the export.
//!
//! Why. A record is served only under the generation it was read from
//! (the file's inode, size, mtime and ctime), but the generation is
//! re-read only when something asks: an export that never asked served
//! 2.4 MB of old bytes, across 418 blocks, after another process rewrote
//! its image, until it was restarted. So the server asks (one `fstat`):
//!
//! - at once when inotify says the file was written, truncated or had its
//!   attributes changed (`IN_MODIFY`, `IN_ATTRIB`, `IN_CLOSE_WRITE`): the
//!   usual case, a `write(2)` by another process, is seen within the
//!   event's delivery;
//! - on every flush a client sends (in `workers.rs`): a client that
//!   flushes wants what is on the disk;
//! - every `revalidate_interval` for what inotify cannot see: writes
//!   through another process's shared mapping (they move the mtime when
//!   written back), an image on NFS written from another host.
//!
//! The cache's own writes move the generation too, and fire the same
//! events; `Cache::revalidate` leaves a moved generation to a write of
//! its own that is in flight, so they never drop the whole image.
//!
//! What is dropped is every record of the image (a new generation token,
//! O(1)): a changed file says nothing about which blocks changed. Between
//! the outside write and the check, reads may still get old bytes; a
//! client that needs the new ones at once flushes first.
//!
//! Block devices have no generation that moves on writes, so nothing here
//! can see another writer; `serve-nbd` refuses to start on one that
//! another process holds open for writing (docs/nbd.md).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Bytes read from the inotify descriptor at a time (events are only
/// counted, never parsed: any event means "check").
const EVENTS_BUF_BYTES: usize = 4096;

/// When the image's generation is due for a check.
pub(crate) struct ImageWatch {
    /// inotify on the image file, if it could be set up.
    inotify: Option<OwnedFd>,
    /// The timer's period (`None`: no timer).
    interval: Option<Duration>,
    last_check: Instant,
}

impl ImageWatch {
    /// A watch of `path` (inotify, where the file system supports it) with
    /// a check every `interval`. Without either it never asks.
    pub(crate) fn new(path: Option<&Path>, interval: Option<Duration>) -> Self {
        let inotify = path.and_then(|p| match inotify_on(p) {
            Ok(fd) => Some(fd),
            Err(e) => {
                log::info!(
                    "{}: no inotify watch ({e}); changes behind the export are seen every {:?} and at each flush",
                    p.display(),
                    interval.unwrap_or_default()
                );
                None
            }
        });
        Self {
            inotify,
            interval,
            last_check: Instant::now(),
        }
    }

    /// The descriptor to poll for events, if there is one.
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.inotify.as_ref().map(AsFd::as_fd)
    }

    /// Whether the generation should be checked now: events arrived (they
    /// are read and forgotten) or the timer ran out.
    pub(crate) fn due(&mut self, events_ready: bool) -> bool {
        let mut due = events_ready && self.drain_events();
        if let Some(interval) = self.interval {
            due |= self.last_check.elapsed() >= interval;
        }
        if due {
            self.last_check = Instant::now();
        }
        due
    }

    /// Reads every pending event; whether there was any.
    fn drain_events(&mut self) -> bool {
        let Some(fd) = &self.inotify else {
            return false;
        };
        let mut buf = [0u8; EVENTS_BUF_BYTES];
        let mut any = false;
        loop {
            // SAFETY: `buf` is valid for its length; `fd` is an open inotify
            // descriptor (non-blocking).
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return any;
            }
            any = true;
        }
    }
}

/// A non-blocking inotify descriptor watching `path` for writes and
/// attribute changes.
fn inotify_on(path: &Path) -> io::Result<OwnedFd> {
    // SAFETY: no pointers; the result is checked.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by inotify_init1 and is owned here.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mask = libc::IN_MODIFY | libc::IN_ATTRIB | libc::IN_CLOSE_WRITE;
    // SAFETY: `name` is a valid C string; `fd` is open.
    let wd = unsafe { libc::inotify_add_watch(owned.as_raw_fd(), name.as_ptr(), mask) };
    if wd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_an_event_and_the_timer_runs_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        std::fs::write(&path, b"old").unwrap();
        let mut watch = ImageWatch::new(Some(&path), None);
        assert!(watch.fd().is_some(), "inotify works on a local file");
        assert!(!watch.due(true), "no event yet");
        std::fs::write(&path, b"new").unwrap();
        assert!(watch.due(true), "the write is an event");
        assert!(!watch.due(true), "events are read once");
        let mut timed = ImageWatch::new(None, Some(Duration::from_millis(20)));
        assert!(timed.fd().is_none());
        assert!(!timed.due(false));
        std::thread::sleep(Duration::from_millis(30));
        assert!(timed.due(false), "the timer ran out");
        assert!(!timed.due(false), "and starts again");
    }
}
