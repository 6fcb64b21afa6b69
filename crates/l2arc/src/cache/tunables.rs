//! `Cache::set_tunable` and `Cache::tunables`: the live L2ARC feed
//! tunables (`l2arc/tunables.rs` holds them and says why they are live),
//! as a service's reload and `l2arc ctl get` reach them.

use crate::cache::Cache;
use crate::l2arc::tunables::{TUNABLE_NAMES, TunableError};

impl Cache {
    /// Sets a live L2ARC tunable by its ZFS name (`l2arc_write_max` in
    /// bytes, booleans as true/false): the feeder uses it from its next
    /// pass. Nothing changes on an error.
    pub fn set_tunable(&self, name: &str, value: &str) -> Result<(), TunableError> {
        self.tunables.set(name, value)?;
        // Whatever `set` takes, `tunables` lists (and `ctl get` shows).
        assert!(TUNABLE_NAMES.contains(&name), "{name} set but not listed");
        Ok(())
    }

    /// `l2arc_stop_budget_secs` in force: the budget a clean stop passes
    /// to [`Cache::flush_arc_to_l2`] (zero: no flush).
    pub fn l2arc_stop_budget(&self) -> std::time::Duration {
        let secs = self.tunables.stop_budget_secs();
        debug_assert!(secs.is_finite() && secs >= 0.0);
        std::time::Duration::from_secs_f64(secs)
    }

    /// The live tunables in force, as (name, value).
    pub fn tunables(&self) -> Vec<(&'static str, String)> {
        let list = self.tunables.list();
        debug_assert_eq!(list.len(), TUNABLE_NAMES.len());
        list
    }
}
