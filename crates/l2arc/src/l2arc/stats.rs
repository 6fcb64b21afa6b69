//! L2ARC statistics under ZFS's arcstats names (`l2_hits`, `l2_size`,
//! `l2_asize`, `l2_rebuild_*`, ...), in total and per device.

use std::sync::atomic::{AtomicU64, Ordering};

use super::cache_device::*;
use super::format::BLOCK_BYTES;
use super::space::Held;
use super::*;

/// A snapshot of one device's statistics.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DeviceStats {
    /// The device's slot (0..16).
    pub slot: u8,
    /// One line describing the device.
    pub description: String,
    /// "online", "rebuilding", "faulted" or "removing".
    pub state: &'static str,
    /// Size of the device.
    pub size_bytes: u64,
    /// The device's counters, under arcstats' `l2_*` names.
    pub kstats: Vec<(&'static str, u64)>,
}

/// L2ARC statistics, summed over devices, with ZFS's names.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct L2Stats {
    /// Counters of the whole L2ARC, under arcstats' `l2_*` names.
    pub kstats: Vec<(&'static str, u64)>,
    /// One entry per cache device.
    pub devices: Vec<DeviceStats>,
}

impl L2Stats {
    /// One counter by name; 0 if there is none of that name.
    pub fn get(&self, name: &str) -> u64 {
        // One counter per name.
        debug_assert!(self.kstats.iter().filter(|(n, _)| *n == name).count() <= 1);
        self.kstats
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    }
}

pub(super) fn device_kstats_names() -> Vec<&'static str> {
    let dummy = DeviceCounters::default();
    let names: Vec<&'static str> = kstats_of(&dummy, Held::default())
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    debug_assert!(
        names.iter().all(|n| n.starts_with("l2_")),
        "arcstats' names"
    );
    names
}

pub(super) fn device_kstats(device: &CacheDevice) -> Vec<(&'static str, u64)> {
    debug_assert!(usize::from(device.slot) < DEVICES_MAX);
    kstats_of(&device.counters, device.space.held())
}

/// A device's kstats: its counters, and what it holds now (`held`).
pub(super) fn kstats_of(c: &DeviceCounters, held: Held) -> Vec<(&'static str, u64)> {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let plain = held.plain_bytes;
    let compressed = held.compressed_bytes;
    let ratio = if get(&c.compressed_asize_written) == 0 {
        1.0
    } else {
        get(&c.compressed_lsize_written) as f64 / get(&c.compressed_asize_written) as f64
    };
    // The written counters only grow: a second load is not 0 either.
    debug_assert!(ratio.is_finite() && ratio >= 0.0);
    vec![
        ("l2_hits", get(&c.hits)),
        ("l2_sector_hits", get(&c.sector_hits)),
        ("l2_feeds", get(&c.feeds)),
        ("l2_read_bytes", get(&c.read_bytes)),
        ("l2_write_bytes", get(&c.write_bytes)),
        ("l2_writes_sent", get(&c.writes_sent)),
        ("l2_writes_pipelined", get(&c.writes_pipelined)),
        ("l2_writes_error", get(&c.writes_error)),
        ("l2_evict_reading", get(&c.evict_reading)),
        ("l2_cksum_bad", get(&c.cksum_bad)),
        ("l2_io_error", get(&c.io_error)),
        ("l2_size", plain + (compressed as f64 * ratio) as u64),
        ("l2_asize", plain + compressed),
        ("l2_bufs", held.entries),
        ("l2_rebuild_success", get(&c.rebuild_success)),
        ("l2_rebuild_bufs", get(&c.rebuild_bufs)),
        ("l2_rebuild_bufs_precached", get(&c.rebuild_bufs_precached)),
        ("l2_rebuild_log_blks", get(&c.rebuild_log_blks)),
        (
            "l2_rebuild_cksum_lb_errors",
            get(&c.rebuild_cksum_lb_errors),
        ),
        ("l2_rebuild_io_errors", get(&c.rebuild_io_errors)),
        ("l2_rebuild_dh_errors", get(&c.rebuild_dh_errors)),
        ("l2_rebuild_unsupported", get(&c.rebuild_unsupported)),
        ("l2_rebuild_time_us", get(&c.rebuild_ns) / 1000),
    ]
}

/// Adds a device's counters (not its gauges) to `retired`.
fn retire(retired: &mut Vec<(&'static str, u64)>, kstats: &[(&'static str, u64)]) {
    for &(name, value) in kstats {
        if crate::stats::kstat_kind(name) != crate::stats::KstatKind::Counter {
            continue;
        }
        match retired.iter_mut().find(|(n, _)| *n == name) {
            Some(sum) => sum.1 += value,
            None => retired.push((name, value)),
        }
    }
}

impl L2Arc {
    /// Takes a device out of its slot (if it still holds it), its
    /// counters into the retired sums, under one hold of the list lock.
    pub(super) fn retire_device(&self, device: &Arc<CacheDevice>) -> bool {
        let mut devices = self.devices.write().expect("device list poisoned");
        let slot = usize::from(device.slot);
        // Only this device leaves its slot: a second removal of the slot
        // that raced with this one may have freed it already, and an add
        // may have filled it since with another device, which stays.
        let held = devices.slots[slot]
            .as_ref()
            .is_some_and(|d| Arc::ptr_eq(d, device));
        if held {
            let kstats = device_kstats(device);
            retire(&mut devices.retired, &kstats);
            devices.slots[slot] = None;
        }
        debug_assert!(
            devices.slots[slot]
                .as_ref()
                .is_none_or(|d| !Arc::ptr_eq(d, device))
        );
        held
    }

    /// Statistics, in total and per device. The totals of counters are
    /// the devices' plus those of devices removed: they never fall.
    pub fn stats(&self) -> L2Stats {
        let (attached, retired) = {
            let list = self.devices.read().expect("device list poisoned");
            (super::all_of(&list.slots), list.retired.clone())
        };
        let mut devices = Vec::new();
        let mut total: Vec<(&'static str, u64)> =
            device_kstats_names().into_iter().map(|n| (n, 0)).collect();
        for t in &mut total {
            if let Some((_, v)) = retired.iter().find(|(n, _)| *n == t.0) {
                t.1 += v;
            }
        }
        for device in attached {
            let kstats = device_kstats(&device);
            debug_assert!(total.iter().zip(&kstats).all(|(t, k)| t.0 == k.0));
            for (t, (_, v)) in total.iter_mut().zip(&kstats) {
                t.1 += v;
            }
            devices.push(DeviceStats {
                slot: device.slot,
                description: device.io.describe(),
                state: match device.state.load(Ordering::SeqCst) {
                    STATE_REBUILDING => "rebuilding",
                    STATE_ONLINE => "online",
                    STATE_FAULTED => "faulted",
                    _ => "removed",
                },
                size_bytes: device.data_blocks() * BLOCK_BYTES,
                kstats,
            });
        }
        let mut kstats = vec![
            ("l2_hits", self.hits.load(Ordering::Relaxed)),
            ("l2_misses", self.misses.load(Ordering::Relaxed)),
            ("l2_read_polled", self.reads_polled.load(Ordering::Relaxed)),
            (
                "l2_read_poll_slept",
                self.reads_poll_slept.load(Ordering::Relaxed),
            ),
            ("l2_hdr_size", self.index.memory_bytes() as u64),
            ("l2_devices", devices.len() as u64),
            ("l2_feed_wakeups", self.feed_wakeups.load(Ordering::Relaxed)),
            ("l2_writeback_size", self.writeback.held_bytes()),
            ("l2_dwpd_limit", self.dwpd_bytes_per_day()),
            ("l2_dwpd_credit", self.dwpd_credit_bytes()),
        ];
        kstats.extend(self.evict_counters.kstats());
        kstats.extend(self.stop_flush_counters.kstats());
        kstats.extend(total.into_iter().filter(|(n, _)| *n != "l2_hits"));
        // At most `DEVICES_MAX` devices; every name once.
        debug_assert!(devices.len() <= DEVICES_MAX);
        debug_assert!(
            kstats
                .iter()
                .enumerate()
                .all(|(i, (n, _))| kstats[..i].iter().all(|(m, _)| m != n))
        );
        L2Stats { kstats, devices }
    }
}
