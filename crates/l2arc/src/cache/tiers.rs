//! The tiers below the ARC, as the cache holds them: cache devices added
//! and removed, and what the ARC tells them.

use std::io;

use std::sync::Arc;

use super::Cache;
use super::config::*;
use crate::l2arc::device::{DeviceIo, FileDevice};
use crate::l2arc::ring::IoEngine;
use crate::l2arc::{DeviceOpen, L2Arc};

impl Cache {
    /// The L2ARC, once a cache device has been added.
    #[cfg(feature = "internals")]
    pub fn l2arc(&self) -> Option<&Arc<L2Arc>> {
        self.l2.get()
    }

    /// Adds a cache device (L2ARC): reused and rebuilt if it holds an L2ARC
    /// log, initialised if blank, refused if it holds anything else. Starts
    /// the feeder with the first device.
    pub fn add_cache_device(
        self: &Arc<Self>,
        io: Box<dyn DeviceIo>,
    ) -> io::Result<(u8, DeviceOpen)> {
        let l2 = self.l2.get_or_init(|| {
            let expected_records =
                (self.config.arc_max_bytes / u64::from(RECORDSIZE_MIN_BYTES)) as usize;
            let mut config = self.config.l2arc.clone();
            if self.ioengine() != IoEngine::IoUring {
                // Polling is through io_uring too: psync means no ring.
                config.l2arc_read_poll_us = 0;
            }
            Arc::new(L2Arc::new(config, expected_records.min(1 << 20)))
        });
        self.arc
            .set_eviction_sink(Box::new(crate::l2arc::writeback::CacheEvictionSink(
                Arc::downgrade(self),
            )));
        let added = l2.add_device(io)?;
        crate::l2arc::feeder::spawn_device_feeder(
            Arc::downgrade(self),
            Arc::clone(&self.feed_wake),
            l2,
            added.0,
        )?;
        Ok(added)
    }

    /// Adds a cache file or block device by path, creating a file of
    /// `create_size_bytes` if it does not exist.
    pub fn add_cache_path(
        self: &Arc<Self>,
        path: impl AsRef<std::path::Path>,
        create_size_bytes: Option<u64>,
    ) -> io::Result<(u8, DeviceOpen)> {
        let device = FileDevice::open(path, create_size_bytes)?;
        self.add_cache_device(Box::new(device))
    }

    /// Removes a cache device; waits for reads in flight on it.
    pub fn remove_cache_device(&self, slot: u8) -> io::Result<()> {
        match self.l2.get() {
            Some(l2) => l2.remove_device(slot),
            None => Err(io::Error::new(io::ErrorKind::NotFound, "no cache devices")),
        }
    }
}
