//! Adding and removing cache devices.
//!
//! A device that holds an L2ARC log of ours is reused (and its index rebuilt
//! in the background); a blank one, or one of ours whose headers are both
//! unreadable, is initialised; one that holds anything else is refused
//! untouched unless `force_init_foreign`. A device attached already (the
//! same file or block device, by any path: `DeviceIdentity`) is refused:
//! two slots on one device overwrite each other's records. Each add and
//! removal is logged once (`log`), and a removed device's counters stay in
//! the cache-wide totals (`stats`). Removal takes the device out of
//! the rotor and the read path first, waits for reads in flight on it, and
//! only then drops its index entries and frees its slot.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::cache_device::*;
use super::device::DeviceIo;
use super::format::{self, BLOCK_BYTES, DATA_START_BYTES, DeviceHeader, Location};
use super::*;
use crate::buf::AlignedBuf;

/// What happened when a device was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceOpen {
    /// The header was valid: the index is being rebuilt from the log.
    Rebuilding,
    /// The header was valid but rebuild is off: the device starts empty.
    Reused,
    /// Blank, or ours but unreadable: initialised empty.
    Initialised,
}

/// The first free device slot, growing the list up to `DEVICES_MAX`.
fn free_slot(devices: &mut Vec<Option<Arc<CacheDevice>>>) -> io::Result<u8> {
    let slot = match devices.iter().position(Option::is_none) {
        Some(slot) => slot,
        None if devices.len() < DEVICES_MAX => {
            devices.push(None);
            devices.len() - 1
        }
        None => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("at most {DEVICES_MAX} cache devices"),
            ));
        }
    };
    assert!(slot < DEVICES_MAX);
    Ok(slot as u8)
}

impl L2Arc {
    /// Adds a cache device: reuses and rebuilds it if it holds an L2ARC log,
    /// initialises it if blank, refuses it if it holds something else (unless
    /// `force_init_foreign`) or is attached already (by whatever path).
    /// Returns the device slot and what was done. The rebuild, if any, runs
    /// in a background thread.
    pub fn add_device(self: &Arc<Self>, io: Box<dyn DeviceIo>) -> io::Result<(u8, DeviceOpen)> {
        let name = io.name();
        let named = |e: io::Error| io::Error::new(e.kind(), format!("cache device {name}: {e}"));
        // Before reading it (no I/O on a device in use), and again under
        // the lock that serialises adds: of two racing adds, one wins.
        refuse_attached(
            &self.devices.read().expect("device list poisoned").slots,
            io.as_ref(),
        )?;
        let counters = DeviceCounters::default();
        let (header, open) = self.choose_header(io.as_ref(), &counters)?;
        let mut devices = self.devices.write().expect("device list poisoned");
        refuse_attached(&devices.slots, io.as_ref())?;
        let slot = free_slot(&mut devices.slots).map_err(named)?;
        debug_assert!(devices.slots[usize::from(slot)].is_none(), "a free slot");
        let device = Arc::new(CacheDevice::new(slot, io, &header, counters));
        if open != DeviceOpen::Rebuilding {
            device.write_header(&header).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cache device {name}: cannot write its header: {e}"),
                )
            })?;
            device.io.sync().map_err(named)?;
            device.state.store(STATE_ONLINE, Ordering::SeqCst);
        }
        devices.slots[usize::from(slot)] = Some(Arc::clone(&device));
        drop(devices);
        log::info!(
            "cache device {slot} ({name}, {} data area): attached, {}",
            human_bytes(device.data_blocks() * BLOCK_BYTES),
            match open {
                DeviceOpen::Rebuilding => "rebuilding its index from its log",
                DeviceOpen::Reused => "reused empty (l2arc_rebuild_enabled is off)",
                DeviceOpen::Initialised => "initialised",
            }
        );
        if open == DeviceOpen::Rebuilding {
            let l2 = Arc::clone(self);
            std::thread::Builder::new()
                .name(format!("l2arc-rebuild-{slot}"))
                .spawn(move || l2.rebuild(&device))
                .map_err(named)?;
        }
        Ok((slot, open))
    }

    /// Reads a device's two header copies and decides what to do with it:
    /// rebuild from its log, reuse it empty, initialise it, or refuse it
    /// (too small, a newer format, or someone else's data).
    fn choose_header(
        &self,
        io: &dyn DeviceIo,
        counters: &DeviceCounters,
    ) -> io::Result<(DeviceHeader, DeviceOpen)> {
        let size_bytes = io.size_bytes();
        let name = io.describe();
        if size_bytes < DATA_START_BYTES + DEVICE_DATA_BYTES_MIN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "cache device {name}: {size_bytes} bytes is too small (at least {} MiB)",
                    (DATA_START_BYTES + DEVICE_DATA_BYTES_MIN) >> 20
                ),
            ));
        }
        debug_assert!(size_bytes >= DATA_START_BYTES + DEVICE_DATA_BYTES_MIN);
        let mut headers = AlignedBuf::zeroed(2 * BLOCK_BYTES as usize);
        io.read_at(0, headers.as_mut_slice()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cache device {name}: cannot read its header: {e}"),
            )
        })?;
        let (a, b) = headers.split_at(BLOCK_BYTES as usize);
        // A copy of a newer format (our magic, a good checksum, another
        // version) means a newer build owns the device: never overwrite it,
        // whatever the other copy holds.
        let crc_at = format::DEVICE_HEADER_BYTES - 4;
        for copy in [a, b] {
            if let Err(e @ format::FormatError::UnsupportedVersion(_)) = DeviceHeader::decode(copy)
                && copy[crc_at..crc_at + 4] == crc32c::crc32c(&copy[..crc_at]).to_le_bytes()
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("cache device {name}: {e}; refusing to overwrite a newer format"),
                ));
            }
        }
        Ok(match DeviceHeader::choose(a, b) {
            Ok((header, _)) if header.device_size_bytes <= size_bytes => {
                if self.config.l2arc_rebuild_enabled {
                    (header, DeviceOpen::Rebuilding)
                } else {
                    (
                        self.fresh_header(size_bytes, Some(header.sequence)),
                        DeviceOpen::Reused,
                    )
                }
            }
            Ok(_) => {
                // The device shrank: its log may point past the end.
                counters.rebuild_dh_errors.fetch_add(1, Ordering::Relaxed);
                (self.fresh_header(size_bytes, None), DeviceOpen::Initialised)
            }
            Err(e) => {
                let ours = a.starts_with(b"L2ARCHDR") || b.starts_with(b"L2ARCHDR");
                let blank = headers.iter().all(|&x| x == 0);
                if ours {
                    counters.rebuild_dh_errors.fetch_add(1, Ordering::Relaxed);
                } else if !blank && !self.config.force_init_foreign {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "cache device {name} holds data that is not an l2arc cache ({e}); \
                             refusing to overwrite it (--force-init-foreign or force_init_foreign = true uses it anyway, losing its contents)"
                        ),
                    ));
                }
                (self.fresh_header(size_bytes, None), DeviceOpen::Initialised)
            }
        })
    }

    pub(super) fn fresh_header(&self, size_bytes: u64, old_sequence: Option<u64>) -> DeviceHeader {
        // Block numbers are 32 bits (the location word, the hand): a
        // device past 2^32 blocks (16 TiB) is used up to its last
        // addressable block, never wrapped into a small one.
        let end = (size_bytes / BLOCK_BYTES).min(u64::from(u32::MAX)) * BLOCK_BYTES;
        let data_blocks = (end.saturating_sub(DATA_START_BYTES) / BLOCK_BYTES) as u32;
        // The data area is whole blocks within the device, after the headers.
        debug_assert!(end <= size_bytes && end.is_multiple_of(BLOCK_BYTES));
        DeviceHeader {
            cache_guid: self.cache_guid,
            device_guid: random_u128(),
            device_size_bytes: size_bytes,
            data_start_bytes: DATA_START_BYTES,
            data_end_bytes: end,
            sequence: old_sequence.map_or(1, |s| s + 1),
            hand_block: (DATA_START_BYTES / BLOCK_BYTES) as u32,
            lap: 0,
            batch_blocks_max: super::format::batch_blocks_for(data_blocks),
            newest_log: None,
        }
    }

    /// Takes a device out: new reads stop using it, reads in flight finish,
    /// then its index entries are dropped and its slot is freed (its
    /// counters stay in the cache-wide totals).
    pub fn remove_device(&self, slot: u8) -> io::Result<()> {
        let device = self.device(slot).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no cache device in slot {slot}"),
            )
        })?;
        device.state.store(STATE_REMOVED, Ordering::SeqCst);
        while device.inflight_reads.load(Ordering::SeqCst) != 0
            || device.commits_in_flight.load(Ordering::SeqCst) != 0
        {
            std::thread::sleep(Duration::from_micros(100));
        }
        // The feeder may be mid-batch on it: wait for the writer to let go.
        drop(device.writer.lock().expect("writer poisoned"));
        self.forget_device(&device);
        // Out for good: nothing of it is counted as held any more.
        debug_assert_eq!(device.space.held(), super::space::Held::default());
        if self.retire_device(&device) {
            log::info!("cache device {slot} ({}): removed", device.io.name());
        }
        Ok(())
    }

    pub(super) fn forget_device(&self, device: &CacheDevice) {
        let slot = device.slot;
        self.index.retain(|e| Location(e.location).device() != slot);
        // Forgotten only once it is out for good: faulted or removed
        // (neither state is ever left).
        debug_assert!(!device.is_online());
        device.space.clear();
    }
}

/// Refuses a device that is attached already, naming the slot that holds
/// it: two slots on one device overwrite each other's records (every read
/// then fails its checksum).
fn refuse_attached(slots: &[Option<Arc<CacheDevice>>], io: &dyn DeviceIo) -> io::Result<()> {
    // The list holds at most `DEVICES_MAX` slots (`free_slot`).
    debug_assert!(slots.len() <= DEVICES_MAX);
    let Some(identity) = io.identity() else {
        return Ok(());
    };
    match slots
        .iter()
        .flatten()
        .find(|d| d.io.identity() == Some(identity))
    {
        Some(holder) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "cache device {} is already attached as cache device {} ({})",
                io.name(),
                holder.slot,
                holder.io.name()
            ),
        )),
        None => Ok(()),
    }
}

/// Bytes in the largest binary unit under 1024 of it ("63.0 MiB").
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    debug_assert!(unit < UNITS.len() && (unit == UNITS.len() - 1 || value < 1024.0));
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
