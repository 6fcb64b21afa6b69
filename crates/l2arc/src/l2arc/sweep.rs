//! The sweep: dropping index entries the write hand has overwritten.
//!
//! Lookups already ignore such entries (lazy invalidation), so the sweep is
//! only about DRAM: it runs every sixteenth of a lap of the hand, so at
//! most a sixteenth of a device's worth of dead entries is ever held.
//! (They are not counted in the device's sizes meanwhile: `space` wrote
//! them off as the hand passed.)

use super::cache_device::*;
use super::format::Location;
use super::*;

impl L2Arc {
    /// Drops this device's index entries that the hand has overwritten.
    pub(super) fn sweep(&self, device: &CacheDevice) {
        let slot = device.slot;
        self.index.retain(|e| {
            let location = Location(e.location);
            if location.device() != slot || device.holds_location(location) {
                return true;
            }
            // Written off as the hand passed (`space`): a no-op but for
            // an entry the hand reached some other way.
            account_remove(device, location);
            false
        });
    }
}
