//! Creating files as the caller.
//!
//! The daemon runs as root, but a file made through the mount must belong
//! to whoever made it, as on the source: `mkdir` by uid 1000 gives a
//! directory owned by 1000, with the group of the caller or, below a
//! set-group-ID directory, of the directory. Creating as root and then
//! chowning gets that wrong (chown clears set-user-ID bits, and the file
//! briefly belongs to root), so the creating call itself runs with the
//! caller's file-system ids: Linux's fsuid and fsgid are per thread, so one
//! FUSE thread can act for one caller while the others act for others.
//!
//! Permission to create was already checked by the kernel against the
//! caller's full credentials, supplementary groups included
//! (`default_permissions`, which `--allow-other` turns on); the thread keeps
//! its capabilities while its fsuid changes (SECBIT_NO_SETUID_FIXUP), so
//! the source does not check a second time with a partial view of the
//! caller (no supplementary groups) and refuse what the kernel allowed.
//!
//! Without root none of this is possible: files are created as the
//! mounting user, which is then the only user the mount admits.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set once by `keep_capabilities`: whether fsuid switching is in use.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Lets the calling thread, and the threads it starts from now on, change
/// fsuid/fsgid without losing capabilities. True when running as root and
/// the kernel allowed it; otherwise creation stays as the daemon's user.
pub(crate) fn keep_capabilities() -> bool {
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } != 0 {
        return false;
    }
    const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
    // SAFETY: prctl with integer arguments.
    let bits = unsafe { libc::prctl(libc::PR_GET_SECUREBITS) };
    if bits < 0 {
        return false;
    }
    let bits = bits as libc::c_ulong | SECBIT_NO_SETUID_FIXUP;
    // SAFETY: as above.
    let ok = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits) } == 0;
    ENABLED.store(ok, Ordering::Relaxed);
    ok
}

/// While alive, the current thread's file-system ids are the caller's.
pub(crate) struct AsCaller {
    switched: bool,
}

/// Acts as `uid`/`gid` for file creation until the guard drops.
pub(crate) fn as_caller(uid: u32, gid: u32) -> AsCaller {
    if !ENABLED.load(Ordering::Relaxed) || (uid == 0 && gid == 0) {
        return AsCaller { switched: false };
    }
    // SAFETY: per-thread id changes; the previous values are 0 (root),
    // restored on drop.
    unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(uid);
    }
    AsCaller { switched: true }
}

impl Drop for AsCaller {
    fn drop(&mut self) {
        if self.switched {
            // SAFETY: back to root's ids, which this thread had before.
            unsafe {
                libc::setfsuid(0);
                libc::setfsgid(0);
            }
            // setfsuid reports the previous id, not errors: read it back.
            // SAFETY: -1 changes nothing and returns the current fsuid.
            let now = unsafe { libc::setfsuid(u32::MAX) };
            assert_eq!(now, 0, "fsuid must return to root after a creation");
        }
    }
}
