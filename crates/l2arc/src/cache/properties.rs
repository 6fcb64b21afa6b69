//! Dataset properties that change while the cache runs.
//!
//! The seed articles turned the L2ARC off and on (`zfs set
//! secondarycache=none`) and watched the effect live: L2ARC hits fall to
//! zero, the disk takes the load, and everything comes back when it is
//! turned on again (the records stayed on flash). A standalone cache needs
//! the same switch without a restart, which would empty the ARC. So
//! `primarycache`, `secondarycache` and `compression` of a dataset live in
//! relaxed atomics that the read path and the feeder read on every use;
//! `recordsize` stays fixed (records already cached are cut to it).
//!
//! What a change means, as in ZFS: `secondarycache=none` stops L2ARC reads
//! and feeds of the dataset but keeps its records on the devices (`all`
//! finds them again); `primarycache=none` sends reads past the ARC, whose
//! records of the dataset age out; `compression` applies to records fed
//! from then on.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::cache::{CacheMode, DatasetConfig};
use crate::l2arc::format::Compression;

/// The changeable properties of one dataset.
pub(crate) struct LiveProperties {
    primarycache: AtomicU8,
    secondarycache: AtomicU8,
    compression: AtomicU8,
}

/// A property change that was refused: a one-line reason.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PropertyError {
    #[error("no dataset named {0:?}")]
    /// No dataset of that name.
    NoDataset(String),
    #[error("`{0}` cannot be set while running: primarycache, secondarycache and compression can")]
    /// No property of that name.
    Unknown(String),
    #[error("`{value}` is not a value of {property}: expected {expected}")]
    /// A value the property does not take.
    Value {
        /// The property.
        property: &'static str,
        /// The value given.
        value: String,
        /// What the property takes.
        expected: &'static str,
    },
}

fn mode_bits(mode: CacheMode) -> u8 {
    let bits = match mode {
        CacheMode::All => 0,
        CacheMode::None => 1,
    };
    debug_assert!(bits <= 1);
    bits
}

fn mode_of(bits: u8) -> CacheMode {
    debug_assert!(bits <= 1, "only `mode_bits` are stored");
    if bits == 1 {
        CacheMode::None
    } else {
        CacheMode::All
    }
}

impl LiveProperties {
    pub(crate) fn new(config: &DatasetConfig) -> Self {
        let props = Self {
            primarycache: AtomicU8::new(mode_bits(config.primarycache)),
            secondarycache: AtomicU8::new(mode_bits(config.secondarycache)),
            compression: AtomicU8::new(config.compression as u8),
        };
        // They read back as configured.
        debug_assert!(
            props.primarycache() == config.primarycache
                && props.secondarycache() == config.secondarycache
                && props.compression() == config.compression
        );
        props
    }

    #[inline]
    pub(crate) fn primarycache(&self) -> CacheMode {
        let bits = self.primarycache.load(Ordering::Relaxed);
        debug_assert!(bits <= 1);
        mode_of(bits)
    }

    #[inline]
    pub(crate) fn secondarycache(&self) -> CacheMode {
        let bits = self.secondarycache.load(Ordering::Relaxed);
        debug_assert!(bits <= 1);
        mode_of(bits)
    }

    pub(crate) fn compression(&self) -> Compression {
        let bits = self.compression.load(Ordering::Relaxed);
        let compression = Compression::from_bits(bits).expect("only valid values are stored");
        debug_assert_eq!(compression as u8, bits);
        compression
    }

    /// `config` with the current values of the changeable properties.
    pub(crate) fn current(&self, config: &DatasetConfig) -> DatasetConfig {
        let current = DatasetConfig {
            primarycache: self.primarycache(),
            secondarycache: self.secondarycache(),
            compression: self.compression(),
            ..*config
        };
        // What may change while running never makes a valid config invalid.
        debug_assert!(current.validate().is_ok() || config.validate().is_err());
        current
    }

    /// Sets `property` to `value` (ZFS's names and values).
    pub(crate) fn set(&self, property: &str, value: &str) -> Result<(), PropertyError> {
        let mode = |property: &'static str| match value {
            "all" => Ok(CacheMode::All),
            "none" => Ok(CacheMode::None),
            _ => Err(PropertyError::Value {
                property,
                value: value.to_string(),
                expected: "all or none",
            }),
        };
        match property {
            "primarycache" => {
                let m = mode("primarycache")?;
                self.primarycache.store(mode_bits(m), Ordering::Relaxed);
            }
            "secondarycache" => {
                let m = mode("secondarycache")?;
                self.secondarycache.store(mode_bits(m), Ordering::Relaxed);
            }
            "compression" => {
                let c: Compression = value.parse().map_err(|_| PropertyError::Value {
                    property: "compression",
                    value: value.to_string(),
                    expected: "lz4, zstd or off",
                })?;
                // Only values `compression` can read back are stored.
                debug_assert_eq!(Compression::from_bits(c as u8), Some(c));
                self.compression.store(c as u8, Ordering::Relaxed);
            }
            other => return Err(PropertyError::Unknown(other.to_string())),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_change_and_bad_values_are_refused() {
        let config = DatasetConfig::default();
        let p = LiveProperties::new(&config);
        assert_eq!(p.secondarycache(), CacheMode::All);
        p.set("secondarycache", "none").unwrap();
        p.set("primarycache", "none").unwrap();
        p.set("compression", "zstd").unwrap();
        let now = p.current(&config);
        assert_eq!(now.secondarycache, CacheMode::None);
        assert_eq!(now.primarycache, CacheMode::None);
        assert_eq!(now.compression, Compression::Zstd);
        assert_eq!(now.recordsize_bytes, config.recordsize_bytes);
        assert!(matches!(
            p.set("secondarycache", "some"),
            Err(PropertyError::Value { .. })
        ));
        assert!(matches!(
            p.set("compression", "gzip"),
            Err(PropertyError::Value { .. })
        ));
        assert_eq!(
            p.set("recordsize", "4K"),
            Err(PropertyError::Unknown("recordsize".into()))
        );
        p.set("secondarycache", "all").unwrap();
        assert_eq!(p.secondarycache(), CacheMode::All);
    }
}
