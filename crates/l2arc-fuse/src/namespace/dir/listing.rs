//! The tree's directory listings: read whole at opendir, charged to the
//! mount's listing budget while they are read.
//!
//! A listing is a snapshot: readdir serves it by offset, so entries added
//! or removed behind the mount meanwhile neither repeat nor vanish mid-way
//! through a reader's walk. Snapshots of huge directories cost memory for
//! as long as they are open, so they are bounded: entries per listing
//! (`max_dir_entries`) and bytes of all open listings together
//! (`max_dir_listing_bytes`, ENOMEM beyond). The bytes are charged as the
//! directory is read, never after: a charge after the read let each
//! serving thread hold a whole listing beyond the bound.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use fuser::{Errno, INodeNo};

use super::DirTree;
use super::attr::{dirent_type, err};
use crate::namespace::DirEntry;
use crate::sys;

/// Bytes of listing charged at a time while a directory is read.
const LISTING_CHARGE_STEP: usize = 64 << 10;

/// An open directory's entries, read at opendir and charged to the mount's
/// listing budget until the last reference goes.
pub(crate) struct DirListing {
    entries: Vec<DirEntry>,
    charged_bytes: usize,
    held_bytes: Arc<AtomicUsize>,
}

impl DirListing {
    /// What an entry costs in RSS: its slot in the listing and its name's
    /// allocation as glibc's malloc makes it (8 bytes of header, 16-byte
    /// steps, 32 at least): the name's length alone charged an entry with
    /// a short name two thirds of what it holds.
    fn cost_bytes(name_len: usize) -> usize {
        std::mem::size_of::<DirEntry>() + (name_len + 8).next_multiple_of(16).max(32)
    }
}

impl AsRef<[DirEntry]> for DirListing {
    fn as_ref(&self) -> &[DirEntry] {
        &self.entries
    }
}

impl Drop for DirListing {
    fn drop(&mut self) {
        let before = self
            .held_bytes
            .fetch_sub(self.charged_bytes, Ordering::SeqCst);
        debug_assert!(before >= self.charged_bytes, "listing budget underflow");
    }
}

impl DirTree {
    /// Reads directory `ino` whole (see the module comment).
    pub(super) fn list_dir(&self, ino: INodeNo) -> Result<DirListing, Errno> {
        let inode = self.inode(ino)?;
        let fd = sys::open_at(
            inode.fd(),
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK,
            0,
        )
        .map_err(err)?;
        // The listing's drop gives the charge back.
        let mut listing = DirListing {
            entries: Vec::new(),
            charged_bytes: 0,
            held_bytes: Arc::clone(&self.dir_listing_bytes),
        };
        let max_bytes = self.options.max_dir_listing_bytes;
        let mut uncharged = 0;
        let charge = |bytes: usize, listing: &mut DirListing| {
            let held = self.dir_listing_bytes.fetch_add(bytes, Ordering::SeqCst);
            listing.charged_bytes += bytes;
            if held + bytes > max_bytes {
                return Err(io::Error::from_raw_os_error(libc::ENOMEM));
            }
            Ok(())
        };
        let raw = sys::read_dir(fd, self.options.max_dir_entries, |e| {
            uncharged += DirListing::cost_bytes(e.name.len());
            if uncharged < LISTING_CHARGE_STEP {
                return Ok(());
            }
            charge(std::mem::take(&mut uncharged), &mut listing)
        })
        .map_err(err)?;
        charge(uncharged, &mut listing).map_err(err)?;
        listing.entries = raw
            .into_iter()
            .map(|e| DirEntry {
                name: e.name,
                kind: dirent_type(e.d_type),
                ino: e.ino,
            })
            .collect();
        // The slots as charged: no growth slack held for the handle's life.
        listing.entries.shrink_to_fit();
        Ok(listing)
    }
}
