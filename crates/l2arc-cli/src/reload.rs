//! SIGHUP: re-read the `--config` file and apply what can change live.
//!
//! A reload must never make a running cache worse: the file is read and
//! checked whole first, and an invalid file changes nothing (one error
//! line says why). What the engine can change while serving is applied:
//! the dataset properties (`primarycache`, `secondarycache`,
//! `compression`), the L2ARC feed tunables (`Cache::set_tunable`: the
//! feeder reads them at its next pass) and the log level. What it cannot
//! (the ARC's size, the recordsize, the devices, the sockets, ...) is kept
//! and named in one line, so the operator knows a restart is needed. Flags
//! given on the command line still win over the file, as at start.

use std::sync::Arc;

use l2arc::Cache;
use l2arc_cli::log_sink;
use l2arc_cli::service::{CacheOptions, ResolvedOptions};
use log::Level;

/// A service's settings as started, and how to read them again.
pub(crate) struct Reloader {
    /// The command line's flags (with `--config`).
    pub flags: CacheOptions,
    /// The front end's default recordsize.
    pub default_recordsize_bytes: u64,
    /// The front end's adjustments of the resolved settings (its defaults).
    pub adjust: Box<dyn Fn(&mut ResolvedOptions) + Send>,
    /// The front end's dataset.
    pub dataset: String,
    /// The cache being served.
    pub cache: Arc<Cache>,
    /// The settings in force.
    pub applied: ResolvedOptions,
}

impl Reloader {
    /// Re-reads the file and applies it; logs what changed, what did not.
    pub(crate) fn reload(&mut self) {
        let Some(path) = self.flags.config.clone() else {
            log_sink::line(
                Level::Info,
                "reload: no --config file to re-read; nothing changed",
            );
            return;
        };
        let mut new = match self.flags.resolve(self.default_recordsize_bytes) {
            Ok(r) => r,
            Err(e) => {
                let line = format!("reload: {e:#}; nothing changed");
                log_sink::line(Level::Error, &line);
                return;
            }
        };
        (self.adjust)(&mut new);
        let fixed = fixed_changes(&self.applied, &new);
        let changed = self.apply(&new);
        let what = if changed.is_empty() {
            "nothing changed".to_string()
        } else {
            format!("changed {}", changed.join(", "))
        };
        let event = format!("reloaded {}: {what}", path.display());
        log_sink::line(Level::Info, &event);
        // `ctl history` lists reloads beside the socket's own changes.
        l2arc_cli::control::record_history(&event);
        if !fixed.is_empty() {
            log_sink::line(
                Level::Warn,
                &format!(
                    "reload: not applied (a restart changes them; the running values are kept): {}",
                    fixed.join(", ")
                ),
            );
        }
    }

    /// Applies the live settings of `new`: `what old -> new` for each.
    fn apply(&mut self, new: &ResolvedOptions) -> Vec<String> {
        let mut changed = Vec::new();
        let (old_ds, new_ds) = (&self.applied.dataset_config, &new.dataset_config);
        let properties = [
            (
                "primarycache",
                mode(old_ds.primarycache),
                mode(new_ds.primarycache),
            ),
            (
                "secondarycache",
                mode(old_ds.secondarycache),
                mode(new_ds.secondarycache),
            ),
            (
                "compression",
                old_ds.compression.to_string(),
                new_ds.compression.to_string(),
            ),
        ];
        for (property, old, value) in properties {
            if old == value {
                continue;
            }
            match self
                .cache
                .set_dataset_property(&self.dataset, property, &value)
            {
                Ok(()) => changed.push(format!("{property} {old} -> {value}")),
                Err(e) => log_sink::line(Level::Error, &format!("reload: {property}: {e}")),
            }
        }
        let live: Vec<(&str, String)> = self.cache.tunables();
        for (name, value) in tunable_values(&new.cache_config.l2arc) {
            let Some((_, old)) = live.iter().find(|(n, _)| *n == name) else {
                continue;
            };
            if *old == value {
                continue;
            }
            match self.cache.set_tunable(name, &value) {
                Ok(()) => changed.push(format!("{name} {old} -> {value}")),
                Err(e) => log_sink::line(Level::Error, &format!("reload: {e}")),
            }
        }
        if new.log_level != self.applied.log_level {
            changed.push(format!(
                "log_level {} -> {}",
                self.applied.log_level, new.log_level
            ));
            log_sink::set_level(new.log_level);
        }
        // The live parts are now the new ones; the fixed ones stay as started.
        let applied = &mut self.applied;
        applied.dataset_config.primarycache = new_ds.primarycache;
        applied.dataset_config.secondarycache = new_ds.secondarycache;
        applied.dataset_config.compression = new_ds.compression;
        applied.log_level = new.log_level;
        changed
    }
}

fn mode(m: l2arc::CacheMode) -> String {
    match m {
        l2arc::CacheMode::All => "all",
        l2arc::CacheMode::None => "none",
    }
    .to_string()
}

/// The live tunables of `l2` as `Cache::tunables` writes them.
fn tunable_values(l2: &l2arc::L2ArcConfig) -> [(&'static str, String); 9] {
    let values = [
        ("l2arc_write_max", l2.l2arc_write_max_bytes.to_string()),
        ("l2arc_headroom", l2.l2arc_headroom.to_string()),
        ("l2arc_noprefetch", l2.l2arc_noprefetch.to_string()),
        ("l2arc_mfuonly", l2.l2arc_mfuonly.to_string()),
        ("l2arc_feed_again", l2.l2arc_feed_again.to_string()),
        ("l2arc_dwpd", l2.l2arc_dwpd.to_string()),
        ("l2arc_feed_secs", l2.l2arc_feed_secs.to_string()),
        ("l2arc_feed_min_ms", l2.l2arc_feed_min_ms.to_string()),
        (
            "l2arc_stop_budget_secs",
            l2.l2arc_stop_budget_secs.to_string(),
        ),
    ];
    debug_assert!(values.iter().map(|v| v.0).eq(l2arc::TUNABLE_NAMES));
    values
}

/// Whether the ARC checkpoint's settings differ (read once, at start).
fn shape_changed(old: &ResolvedOptions, new: &ResolvedOptions) -> bool {
    (old.prewarm, old.arc_checkpoint_secs, &old.arc_checkpoint)
        != (new.prewarm, new.arc_checkpoint_secs, &new.arc_checkpoint)
}

/// The ARC's settings, fixed at start, and whether each differs.
fn arc_differs(oc: &l2arc::CacheConfig, nc: &l2arc::CacheConfig) -> [(&'static str, bool); 7] {
    [
        ("arc_max", oc.arc_max_bytes != nc.arc_max_bytes),
        ("arc_min", oc.arc_min_bytes != nc.arc_min_bytes),
        (
            "arc_sys_free",
            oc.arc_sys_free_bytes != nc.arc_sys_free_bytes,
        ),
        ("arc_shards", oc.arc_shards != nc.arc_shards),
        ("dram_policy", oc.dram_policy != nc.dram_policy),
        (
            "zfs_prefetch_disable",
            oc.zfs_prefetch_disable != nc.zfs_prefetch_disable,
        ),
        (
            "zfetch_max_distance",
            oc.zfetch_max_distance_bytes != nc.zfetch_max_distance_bytes,
        ),
    ]
}

/// The settings that differ in `new` but cannot change while running.
fn fixed_changes(old: &ResolvedOptions, new: &ResolvedOptions) -> Vec<&'static str> {
    let (oc, nc) = (&old.cache_config, &new.cache_config);
    let (ol, nl) = (&oc.l2arc, &nc.l2arc);
    let (od, nd) = (&old.dataset_config, &new.dataset_config);
    let (of, nf) = (&old.front_end, &new.front_end);
    let differs = [
        ("recordsize", od.recordsize_bytes != nd.recordsize_bytes),
        (
            "sector_table_min",
            od.sector_table_min_bytes != nd.sector_table_min_bytes,
        ),
        ("cache", old.cache_devices != new.cache_devices),
        ("cache_size", old.cache_size_bytes != new.cache_size_bytes),
        ("control", old.control_socket != new.control_socket),
        ("http", old.http != new.http),
        ("history", old.history != new.history),
        (
            "l2arc_prewarm and *arc_checkpoint*",
            shape_changed(old, new),
        ),
        (
            "l2arc_rebuild_enabled",
            ol.l2arc_rebuild_enabled != nl.l2arc_rebuild_enabled,
        ),
        ("l2arc_ioengine", ol.l2arc_ioengine != nl.l2arc_ioengine),
        (
            "l2arc_read_poll_us",
            ol.l2arc_read_poll_us != nl.l2arc_read_poll_us,
        ),
        (
            "l2arc_writeback_max",
            ol.l2arc_writeback_max_bytes != nl.l2arc_writeback_max_bytes,
        ),
        (
            "force_init_foreign",
            ol.force_init_foreign != nl.force_init_foreign,
        ),
        (
            "emulate_hdd_*",
            format!("{:?}", old.emulate_hdd) != format!("{:?}", new.emulate_hdd),
        ),
        (
            "s3_*, metadata_ttl and shared_cache_*",
            format!("{:?}", old.s3) != format!("{:?}", new.s3),
        ),
        ("listen", of.listen != nf.listen),
        ("read_only", of.read_only != nf.read_only),
        ("export_name", of.export_name != nf.export_name),
        ("max_connections", of.max_connections != nf.max_connections),
        ("stop_timeout", of.stop_timeout != nf.stop_timeout),
        ("allow_remote", of.allow_remote != nf.allow_remote),
        ("allow_other", of.allow_other != nf.allow_other),
        ("threads", of.threads != nf.threads),
    ];
    arc_differs(oc, nc)
        .into_iter()
        .chain(differs)
        .filter(|(_, d)| *d)
        .map(|(name, _)| name)
        .collect()
}
