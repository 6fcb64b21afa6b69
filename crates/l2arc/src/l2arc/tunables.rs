//! The L2ARC feed tunables that change while the cache runs
//! (`Cache::set_tunable`, `Cache::tunables` in `cache/tunables.rs`).
//!
//! ZFS lets an administrator change `l2arc_write_max`, `l2arc_headroom`,
//! `l2arc_noprefetch`, ... at any time (`/sys/module/zfs/parameters`), and
//! the feeder uses the new value at its next pass. A standalone cache needs
//! the same without a restart (a restart empties the ARC): a service reloads
//! its config file on SIGHUP, and `l2arc ctl get` reads the values in force.
//! So these tunables live in relaxed atomics that the feeder, the writer's
//! budget and the eviction path read on every use; the rest of
//! `L2ArcConfig` (devices, the I/O engine, rebuild, write-back size) is
//! fixed at start. Every value is checked here, whichever way it came in
//! (the config at start, a reload, the library).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::l2arc::L2ArcConfig;

/// Longest feed period (`l2arc_feed_secs`), and longest `l2arc_feed_min_ms`.
const FEED_SECS_MAX: f64 = 3600.0;
/// Longest stop budget (`l2arc_stop_budget_secs`): a unit's stop timeout
/// waits for it, and an hour is past any an operator would set.
pub(crate) const STOP_BUDGET_SECS_MAX: f64 = 3600.0;

/// The names `Cache::set_tunable` takes, in the order `Cache::tunables`
/// lists them.
pub const TUNABLE_NAMES: [&str; 9] = [
    "l2arc_write_max",
    "l2arc_headroom",
    "l2arc_noprefetch",
    "l2arc_mfuonly",
    "l2arc_feed_again",
    "l2arc_dwpd",
    "l2arc_feed_secs",
    "l2arc_feed_min_ms",
    "l2arc_stop_budget_secs",
];

/// A tunable change that was refused: a one-line reason.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum TunableError {
    /// No live tunable of that name.
    #[error("`{0}` is not a tunable that changes while running: {names}", names = TUNABLE_NAMES.join(", "))]
    Unknown(String),
    /// A value out of range or of the wrong kind.
    #[error("{name} must be {expected}, not {value}")]
    Value {
        /// The tunable.
        name: &'static str,
        /// The value given.
        value: String,
        /// What it takes.
        expected: &'static str,
    },
}

/// The live tunables: one atomic each (f64 as its bits).
#[derive(Debug)]
pub(crate) struct LiveTunables {
    write_max_bytes: AtomicU64,
    headroom: AtomicU64,
    noprefetch: AtomicBool,
    mfuonly: AtomicBool,
    feed_again: AtomicBool,
    dwpd_bits: AtomicU64,
    feed_secs_bits: AtomicU64,
    feed_min_ms: AtomicU64,
    stop_budget_secs_bits: AtomicU64,
}

impl LiveTunables {
    /// The tunables of `config`, checked.
    pub(crate) fn from_config(config: &L2ArcConfig) -> Result<Self, TunableError> {
        let live = Self {
            write_max_bytes: AtomicU64::new(config.l2arc_write_max_bytes),
            headroom: AtomicU64::new(u64::from(config.l2arc_headroom)),
            noprefetch: AtomicBool::new(config.l2arc_noprefetch),
            mfuonly: AtomicBool::new(config.l2arc_mfuonly),
            feed_again: AtomicBool::new(config.l2arc_feed_again),
            dwpd_bits: AtomicU64::new(0),
            feed_secs_bits: AtomicU64::new(1f64.to_bits()),
            feed_min_ms: AtomicU64::new(200),
            stop_budget_secs_bits: AtomicU64::new(5f64.to_bits()),
        };
        live.set("l2arc_headroom", &config.l2arc_headroom.to_string())?;
        live.set("l2arc_dwpd", &config.l2arc_dwpd.to_string())?;
        live.set("l2arc_feed_secs", &config.l2arc_feed_secs.to_string())?;
        live.set("l2arc_feed_min_ms", &config.l2arc_feed_min_ms.to_string())?;
        live.set(
            "l2arc_stop_budget_secs",
            &config.l2arc_stop_budget_secs.to_string(),
        )?;
        Ok(live)
    }

    /// Sets one tunable from its text (sizes in bytes); nothing changes
    /// on an error.
    pub(crate) fn set(&self, name: &str, value: &str) -> Result<(), TunableError> {
        let bad = |name: &'static str, expected: &'static str| TunableError::Value {
            name,
            value: value.to_string(),
            expected,
        };
        let flag = |name: &'static str| parse_bool(value).ok_or_else(|| bad(name, "true or false"));
        match name {
            "l2arc_write_max" => {
                let v = value.parse().map_err(|_| bad("l2arc_write_max", "bytes"))?;
                self.write_max_bytes.store(v, Ordering::Relaxed);
            }
            "l2arc_headroom" => {
                let v: u32 = value.parse().map_err(|_| bad("l2arc_headroom", "from 1"))?;
                if v == 0 {
                    return Err(bad("l2arc_headroom", "at least 1"));
                }
                self.headroom.store(u64::from(v), Ordering::Relaxed);
            }
            "l2arc_noprefetch" => self
                .noprefetch
                .store(flag("l2arc_noprefetch")?, Ordering::Relaxed),
            "l2arc_mfuonly" => self
                .mfuonly
                .store(flag("l2arc_mfuonly")?, Ordering::Relaxed),
            "l2arc_feed_again" => self
                .feed_again
                .store(flag("l2arc_feed_again")?, Ordering::Relaxed),
            "l2arc_dwpd" => {
                let v = parse_f64(value).filter(|v| *v >= 0.0);
                let v = v.ok_or_else(|| bad("l2arc_dwpd", "a number of at least 0"))?;
                self.dwpd_bits.store(v.to_bits(), Ordering::Relaxed);
            }
            "l2arc_feed_secs" => {
                let v = parse_f64(value).filter(|v| *v >= 0.001 && *v <= FEED_SECS_MAX);
                let v = v.ok_or_else(|| bad("l2arc_feed_secs", "seconds from 0.001 to 3600"))?;
                self.feed_secs_bits.store(v.to_bits(), Ordering::Relaxed);
            }
            "l2arc_feed_min_ms" => {
                let v: u64 = value
                    .parse()
                    .map_err(|_| bad("l2arc_feed_min_ms", "ms from 1 to 3600000"))?;
                if !(1..=(FEED_SECS_MAX as u64) * 1000).contains(&v) {
                    return Err(bad("l2arc_feed_min_ms", "ms from 1 to 3600000"));
                }
                self.feed_min_ms.store(v, Ordering::Relaxed);
            }
            "l2arc_stop_budget_secs" => {
                let v = parse_f64(value).filter(|v| (0.0..=STOP_BUDGET_SECS_MAX).contains(v));
                let v = v.ok_or_else(|| bad("l2arc_stop_budget_secs", "seconds from 0 to 3600"))?;
                self.stop_budget_secs_bits
                    .store(v.to_bits(), Ordering::Relaxed);
            }
            _ => return Err(TunableError::Unknown(name.to_string())),
        }
        Ok(())
    }

    /// `l2arc_write_max`, bytes (0: no cap).
    pub(crate) fn write_max_bytes(&self) -> u64 {
        self.write_max_bytes.load(Ordering::Relaxed)
    }

    /// `l2arc_headroom`, at least 1.
    pub(crate) fn headroom(&self) -> u32 {
        let v = self.headroom.load(Ordering::Relaxed);
        debug_assert!(v >= 1 && v <= u64::from(u32::MAX));
        v as u32
    }

    /// `l2arc_noprefetch`.
    pub(crate) fn noprefetch(&self) -> bool {
        self.noprefetch.load(Ordering::Relaxed)
    }

    /// `l2arc_mfuonly`.
    pub(crate) fn mfuonly(&self) -> bool {
        self.mfuonly.load(Ordering::Relaxed)
    }

    /// `l2arc_feed_again`.
    pub(crate) fn feed_again(&self) -> bool {
        self.feed_again.load(Ordering::Relaxed)
    }

    /// `l2arc_dwpd` (0: unlimited), finite and at least 0.
    pub(crate) fn dwpd(&self) -> f64 {
        let v = f64::from_bits(self.dwpd_bits.load(Ordering::Relaxed));
        debug_assert!(v.is_finite() && v >= 0.0);
        v
    }

    /// `l2arc_feed_secs`, from 0.001 to 3600.
    pub(crate) fn feed_secs(&self) -> f64 {
        let v = f64::from_bits(self.feed_secs_bits.load(Ordering::Relaxed));
        debug_assert!((0.001..=FEED_SECS_MAX).contains(&v));
        v
    }

    /// `l2arc_feed_min_ms`, at least 1.
    pub(crate) fn feed_min_ms(&self) -> u64 {
        self.feed_min_ms.load(Ordering::Relaxed)
    }

    /// `l2arc_stop_budget_secs`, from 0 (no flush) to 3600.
    pub(crate) fn stop_budget_secs(&self) -> f64 {
        let v = f64::from_bits(self.stop_budget_secs_bits.load(Ordering::Relaxed));
        debug_assert!((0.0..=STOP_BUDGET_SECS_MAX).contains(&v));
        v
    }

    /// Every tunable as (name, value), in [`TUNABLE_NAMES`] order.
    pub(crate) fn list(&self) -> Vec<(&'static str, String)> {
        let values = [
            self.write_max_bytes().to_string(),
            self.headroom().to_string(),
            self.noprefetch().to_string(),
            self.mfuonly().to_string(),
            self.feed_again().to_string(),
            self.dwpd().to_string(),
            self.feed_secs().to_string(),
            self.feed_min_ms().to_string(),
            self.stop_budget_secs().to_string(),
        ];
        TUNABLE_NAMES.into_iter().zip(values).collect()
    }
}

fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "true" | "1" | "on" => Some(true),
        "false" | "0" | "off" => Some(false),
        _ => None,
    }
}

fn parse_f64(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_and_a_refusal_changes_nothing() {
        let live = LiveTunables::from_config(&L2ArcConfig::default()).unwrap();
        live.set("l2arc_write_max", "1048576").unwrap();
        assert_eq!(live.write_max_bytes(), 1 << 20);
        live.set("l2arc_noprefetch", "false").unwrap();
        assert!(!live.noprefetch());
        for (name, value) in [
            ("l2arc_feed_secs", "NaN"),
            ("l2arc_feed_secs", "0"),
            ("l2arc_feed_secs", "-1"),
            ("l2arc_headroom", "0"),
            ("l2arc_dwpd", "inf"),
            ("l2arc_feed_min_ms", "0"),
            ("l2arc_mfuonly", "maybe"),
            ("l2arc_stop_budget_secs", "-1"),
            ("l2arc_stop_budget_secs", "NaN"),
            ("l2arc_stop_budget_secs", "3601"),
        ] {
            let e = live.set(name, value).unwrap_err();
            assert!(e.to_string().starts_with(name), "{e}");
        }
        assert_eq!(live.feed_secs(), 1.0);
        assert_eq!(live.headroom(), 8);
        assert_eq!(live.stop_budget_secs(), 5.0);
        live.set("l2arc_stop_budget_secs", "0").unwrap();
        assert_eq!(live.stop_budget_secs(), 0.0);
        live.set("l2arc_stop_budget_secs", "0.25").unwrap();
        assert_eq!(live.stop_budget_secs(), 0.25);
        assert!(matches!(
            live.set("arc_max", "1"),
            Err(TunableError::Unknown(_))
        ));
        let bad = L2ArcConfig::default().l2arc_feed_secs(f64::NAN);
        assert!(LiveTunables::from_config(&bad).is_err());
    }
}
