//! Settings shared by the long-running services (`l2arc mount`,
//! `l2arc serve-nbd`): the cache's tunables as flags and as a TOML file.
//!
//! A service is started by hand once and then by a unit file for years, so
//! its settings must be writable down in one place (`--config FILE`) and
//! overridable for a single run (a flag wins over the file). Names are ZFS's
//! (`arc_max`, `recordsize`, `l2arc_noprefetch`, ...) so that an operator who
//! knows ZFS knows them already; flags are the same names with dashes.
//! Unknown keys in the file are an error naming the key: a misspelt tunable
//! silently ignored is how caches end up misconfigured for years.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use l2arc::Compression;
use l2arc::primary::emulated_hdd::HddConfig;
use l2arc::{Cache, CacheConfig, CacheMode, DatasetConfig, L2ArcConfig};
use serde::Deserialize;

/// Cache flags; every one may also be set in `--config FILE`.
#[derive(Args, Clone, Debug, Default)]
pub struct CacheOptions {
    /// TOML file of settings (keys as the flags, with underscores: arc_max = "1GiB").
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Unix socket for `l2arc ctl` (stats, adding and removing cache devices while running).
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Read-only HTTP endpoint: /metrics (Prometheus), / (live page): HOST:PORT (a name such as
    /// localhost resolves); loopback only without --allow-remote.
    #[arg(long)]
    pub http: Option<String>,
    /// Keep the analytics' history (per second for an hour, per minute for
    /// 7 days) in this file (about 16 MiB, fixed); the live page shows it.
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// `arc_max`: DRAM for cached records: a size, or auto (the default): the ARC grows into
    /// free memory and shrinks when others need it, up to all but 1GiB of RAM or the memory
    /// cgroup's limit less arc_sys_free (docs/operations.md).
    #[arg(long, value_parser = parse_arc_max)]
    pub arc_max: Option<u64>,
    /// `arc_min`: with arc_max auto, the least the ARC shrinks to (default 64MiB; never above
    /// the ceiling).
    #[arg(long, value_parser = parse_size)]
    pub arc_min: Option<u64>,
    /// `arc_sys_free`: with arc_max auto, memory the ARC leaves free for other programs
    /// (default 1/32 of the memory limit, at least 256MiB).
    #[arg(long, value_parser = parse_size)]
    pub arc_sys_free: Option<u64>,
    /// ARC shards (locks); default 4 per core.
    #[arg(long)]
    pub arc_shards: Option<usize>,
    /// `zfs_prefetch_disable`: no read-ahead of sequential readers (default false).
    #[arg(long)]
    pub zfs_prefetch_disable: Option<bool>,
    /// `zfetch_max_distance`: most bytes one read-ahead reads beyond the record asked for (default 8MiB; also at most 1/32 of arc_max).
    #[arg(long, value_parser = parse_size)]
    pub zfetch_max_distance: Option<u64>,
    /// `recordsize`: cache granularity, a power of two from 4K to 1M (default 128K for mount, 64K for serve-nbd).
    #[arg(long, value_parser = parse_size)]
    pub recordsize: Option<u64>,
    /// `primarycache`: all or none.
    #[arg(long, value_parser = parse_cache_mode)]
    pub primarycache: Option<CacheMode>,
    /// `secondarycache`: all or none.
    #[arg(long, value_parser = parse_cache_mode)]
    pub secondarycache: Option<CacheMode>,
    /// How records are stored on cache devices: lz4 (default), zstd or off.
    #[arg(long, value_parser = parse_compression)]
    pub compression: Option<Compression>,
    /// Records at least this long, stored uncompressed on a cache device,
    /// get a table of 4 KiB checksums there (one block more), so that a
    /// small read of one only flash holds reads its piece, not the whole
    /// record (default 128K for serve-nbd, 256K for mount; at least 64K).
    #[arg(long, value_parser = parse_size)]
    pub sector_table_min: Option<u64>,
    /// L2ARC cache device (file or block device); repeatable.
    #[arg(long)]
    pub cache: Vec<PathBuf>,
    /// Size of a cache file created when a --cache path does not exist (default 1GiB).
    #[arg(long, value_parser = parse_size)]
    pub cache_size: Option<u64>,
    /// `l2arc_write_max`: most bytes per feed (0 = no cap).
    #[arg(long, value_parser = parse_size_or_off)]
    pub l2arc_write_max: Option<u64>,
    /// `l2arc_headroom`: feeder scan depth in multiples of the write size.
    #[arg(long)]
    pub l2arc_headroom: Option<u32>,
    /// `l2arc_noprefetch`: do not write read-ahead records to the L2ARC (default true).
    #[arg(long)]
    pub l2arc_noprefetch: Option<bool>,
    /// `l2arc_mfuonly`: write only MFU records to the L2ARC.
    #[arg(long)]
    pub l2arc_mfuonly: Option<bool>,
    /// `l2arc_feed_again`: feed again at once while there is more to write, and early under eviction pressure (default true).
    #[arg(long)]
    pub l2arc_feed_again: Option<bool>,
    /// `l2arc_rebuild_enabled`: restore the L2ARC index from the devices at start (default true).
    #[arg(long)]
    pub l2arc_rebuild_enabled: Option<bool>,
    /// `l2arc_dwpd`: device writes per day budget (0 = unlimited).
    #[arg(long)]
    pub l2arc_dwpd: Option<f64>,
    /// `l2arc_ioengine`: how pipelined reads read cache devices: auto (io_uring where the kernel allows, else psync), io_uring, psync.
    #[arg(long, value_parser = parse_ioengine)]
    pub l2arc_ioengine: Option<l2arc::IoEngine>,
    /// `l2arc_read_poll_us`: longest a lone blocking flash read polls for its completion before it sleeps (default 100; 0 = never poll).
    #[arg(long)]
    pub l2arc_read_poll_us: Option<u64>,
    /// `l2arc_writeback_max`: most bytes of evicted records held for the feeder (DRAM beyond arc_max; default 32MiB, 0 = off).
    #[arg(long, value_parser = parse_size_or_off)]
    pub l2arc_writeback_max: Option<u64>,
    /// `l2arc_feed_secs`: feeder period when there is nothing to write, seconds (default 1; 0.001 to 3600).
    #[arg(long)]
    pub l2arc_feed_secs: Option<f64>,
    /// `l2arc_feed_min_ms`: feeder period while it finds records to write (default 200; 1 to 3600000).
    #[arg(long)]
    pub l2arc_feed_min_ms: Option<u64>,
    /// `l2arc_stop_budget_secs`: seconds a clean stop (SIGTERM, SIGINT) may spend writing what only
    /// the ARC holds to the cache devices, after the drain (default 5; 0 = no flush; up to 3600).
    #[arg(long)]
    pub l2arc_stop_budget_secs: Option<f64>,
    /// `l2arc_prewarm`: at start, read the records the ARC held at the last
    /// stop or checkpoint back from flash, in the background (default true).
    #[arg(long)]
    pub l2arc_prewarm: Option<bool>,
    /// `l2arc_arc_checkpoint_secs`: save the ARC's shape every this many
    /// seconds while running (default 60; 0 = only at a clean stop).
    #[arg(long)]
    pub l2arc_arc_checkpoint_secs: Option<u64>,
    /// `arc_checkpoint`: where the ARC's shape is saved (default: the first
    /// cache device's path with `.arc` appended, when it is a regular file).
    #[arg(long)]
    pub arc_checkpoint: Option<PathBuf>,
    /// `force_init_foreign`: initialise a cache device that holds data that is not an l2arc
    /// cache (its contents are lost); without it such a device is refused.
    #[arg(long)]
    pub force_init_foreign: bool,
    /// `dram_policy`: arc (default) or lru (a baseline for benchmarks).
    #[arg(long, value_parser = parse_dram_policy)]
    pub dram_policy: Option<l2arc::arc::DramPolicy>,
    /// `log_level`: error, warn, info (default) or debug; changes on reload (SIGHUP).
    #[arg(long, value_parser = crate::log_sink::parse_level)]
    pub log_level: Option<log::LevelFilter>,
    /// Make the primary behave like an HDD array (benchmarks): number of spindles; 0 = off.
    #[arg(long)]
    pub emulate_hdd_spindles: Option<usize>,
    /// Emulated HDD positioning time range, ms (default 4 to 12).
    #[arg(long)]
    pub emulate_hdd_seek_ms_min: Option<f64>,
    /// Longest emulated positioning time, ms.
    #[arg(long)]
    pub emulate_hdd_seek_ms_max: Option<f64>,
}

/// The same settings as read from a TOML file.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileOptions {
    arc_max: Option<SizeValue>,
    arc_min: Option<SizeValue>,
    arc_sys_free: Option<SizeValue>,
    arc_shards: Option<usize>,
    zfs_prefetch_disable: Option<bool>,
    zfetch_max_distance: Option<SizeValue>,
    recordsize: Option<SizeValue>,
    primarycache: Option<String>,
    secondarycache: Option<String>,
    compression: Option<String>,
    sector_table_min: Option<SizeValue>,
    control: Option<PathBuf>,
    http: Option<String>,
    history: Option<PathBuf>,
    l2arc_feed_secs: Option<f64>,
    l2arc_feed_min_ms: Option<u64>,
    l2arc_stop_budget_secs: Option<f64>,
    l2arc_prewarm: Option<bool>,
    l2arc_arc_checkpoint_secs: Option<u64>,
    arc_checkpoint: Option<PathBuf>,
    force_init_foreign: Option<bool>,
    dram_policy: Option<String>,
    log_level: Option<String>,
    // The front ends' own settings (flags win; checked where they are used).
    listen: Option<String>,
    read_only: Option<bool>,
    export_name: Option<String>,
    max_connections: Option<usize>,
    stop_timeout: Option<f64>,
    allow_remote: Option<bool>,
    allow_other: Option<bool>,
    threads: Option<usize>,
    #[serde(default)]
    cache: Vec<PathBuf>,
    cache_size: Option<SizeValue>,
    l2arc_write_max: Option<SizeValue>,
    l2arc_headroom: Option<u32>,
    l2arc_noprefetch: Option<bool>,
    l2arc_mfuonly: Option<bool>,
    l2arc_feed_again: Option<bool>,
    l2arc_rebuild_enabled: Option<bool>,
    l2arc_dwpd: Option<f64>,
    l2arc_ioengine: Option<String>,
    l2arc_read_poll_us: Option<u64>,
    l2arc_writeback_max: Option<SizeValue>,
    emulate_hdd_spindles: Option<usize>,
    emulate_hdd_seek_ms_min: Option<f64>,
    emulate_hdd_seek_ms_max: Option<f64>,
    s3_endpoint: Option<String>,
    s3_region: Option<String>,
    s3_virtual_host: Option<bool>,
    metadata_ttl: Option<f64>,
    s3_retries: Option<u32>,
    s3_timeout: Option<f64>,
    s3_read_deadline: Option<f64>,
    stale_if_error: Option<bool>,
    shared_cache: Option<String>,
    shared_cache_endpoint: Option<String>,
    shared_cache_region: Option<String>,
    shared_cache_profile: Option<String>,
    shared_cache_key_file: Option<PathBuf>,
    shared_cache_admit: Option<String>,
    shared_cache_timeout: Option<f64>,
    shared_cache_put_timeout: Option<f64>,
}

/// The object-store settings of the config file (keys as the `--s3-*`
/// flags, `metadata_ttl` and `stale_if_error`), for sources of the form
/// s3://; the flags win over them (`s3_opts`). Checked where they are
/// used, with the flags.
#[derive(Clone, Debug, Default)]
pub struct S3FileOptions {
    /// `s3_endpoint`.
    pub endpoint: Option<String>,
    /// `s3_region`.
    pub region: Option<String>,
    /// `s3_virtual_host`.
    pub virtual_host: Option<bool>,
    /// `metadata_ttl`, seconds.
    pub metadata_ttl: Option<f64>,
    /// `s3_retries`.
    pub retries: Option<u32>,
    /// `s3_timeout`, seconds.
    pub timeout: Option<f64>,
    /// `s3_read_deadline`, seconds.
    pub read_deadline: Option<f64>,
    /// `stale_if_error`.
    pub stale_if_error: Option<bool>,
    /// `shared_cache` (s3://BUCKET[/PREFIX]).
    pub shared_cache: Option<String>,
    /// `shared_cache_endpoint`.
    pub shared_cache_endpoint: Option<String>,
    /// `shared_cache_region`.
    pub shared_cache_region: Option<String>,
    /// `shared_cache_profile`.
    pub shared_cache_profile: Option<String>,
    /// `shared_cache_key_file`.
    pub shared_cache_key_file: Option<PathBuf>,
    /// `shared_cache_admit` (all, mfu).
    pub shared_cache_admit: Option<String>,
    /// `shared_cache_timeout`, seconds.
    pub shared_cache_timeout: Option<f64>,
    /// `shared_cache_put_timeout`, seconds.
    pub shared_cache_put_timeout: Option<f64>,
}

/// The front ends' own settings as read from the file: `serve-nbd`'s
/// `listen`, `read_only`, `export_name`, `max_connections`,
/// `stop_timeout`; `mount`'s `allow_other`, `threads`; both's
/// `allow_remote`. A flag wins over each.
#[derive(Clone, Debug, Default)]
pub struct FrontEndFileOptions {
    /// `listen`.
    pub listen: Option<String>,
    /// `read_only`.
    pub read_only: Option<bool>,
    /// `export_name`.
    pub export_name: Option<String>,
    /// `max_connections`.
    pub max_connections: Option<usize>,
    /// `stop_timeout`, seconds.
    pub stop_timeout: Option<f64>,
    /// `allow_remote`.
    pub allow_remote: Option<bool>,
    /// `allow_other`.
    pub allow_other: Option<bool>,
    /// `threads`.
    pub threads: Option<usize>,
}

/// Longest poll a blocking flash read may be given (`l2arc_read_poll_us`).
const L2ARC_READ_POLL_US_MAX: u64 = 10_000;

fn parse_ioengine(s: &str) -> Result<l2arc::IoEngine, String> {
    s.parse()
}

/// A size in a config file: a number of bytes or a string such as "1GiB".
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

impl SizeValue {
    fn bytes(&self, key: &str) -> Result<u64> {
        match self {
            SizeValue::Bytes(b) => Ok(*b),
            SizeValue::Text(s) => parse_size(s).map_err(|e| anyhow::anyhow!("{key}: {e}")),
        }
    }
}

/// A size given as a flag (bytes) or as a config-file value ("64MiB").
fn size_of(flag: Option<u64>, key: &str, value: &Option<SizeValue>) -> Result<Option<u64>> {
    match flag {
        Some(v) => Ok(Some(v)),
        None => value.as_ref().map(|v| v.bytes(key)).transpose(),
    }
}

/// A service's HTTP endpoint and history recorder; both stop when dropped
/// (the endpoint first).
pub struct Observers {
    _http: Option<crate::http::HttpServer>,
    _recorder: Option<crate::history::Recorder>,
}

/// Everything a service needs to build its cache.
#[derive(Clone, Debug)]
pub struct ResolvedOptions {
    /// The cache's settings.
    pub cache_config: CacheConfig,
    /// The one dataset's settings.
    pub dataset_config: DatasetConfig,
    /// Cache devices to add, in order.
    pub cache_devices: Vec<PathBuf>,
    /// Size of a cache file created where none exists.
    pub cache_size_bytes: u64,
    /// Where to listen for `l2arc ctl`.
    pub control_socket: Option<PathBuf>,
    /// Where to serve /metrics and the live page: HOST:PORT, resolved
    /// when the endpoint starts (the decoder touches no network).
    pub http: Option<String>,
    /// `log_level`.
    pub log_level: log::LevelFilter,
    /// The front ends' own settings from the file.
    pub front_end: FrontEndFileOptions,
    /// Where to keep the analytics' history.
    pub history: Option<PathBuf>,
    /// Some: wrap the primary in an emulated HDD array.
    pub emulate_hdd: Option<HddConfig>,
    /// `l2arc_noprefetch` was set (flag or file), not left at its default.
    pub l2arc_noprefetch_set: bool,
    /// `sector_table_min` was set (flag or file), not left at its default.
    pub sector_table_min_set: bool,
    /// The file's object-store settings (the flags are merged over them
    /// where the store is opened).
    pub s3: S3FileOptions,
    /// `l2arc_prewarm`.
    pub prewarm: bool,
    /// `l2arc_arc_checkpoint_secs`.
    pub arc_checkpoint_secs: u64,
    /// `arc_checkpoint` as given (None: the default, see `crate::shape`).
    pub arc_checkpoint: Option<PathBuf>,
}

impl CacheOptions {
    /// Merges flags over the config file over defaults, and checks the result.
    /// `default_recordsize_bytes` differs by front end (files vs a block image).
    pub fn resolve(&self, default_recordsize_bytes: u64) -> Result<ResolvedOptions> {
        let file = match &self.config {
            Some(path) => read_config_file(path)?,
            None => FileOptions::default(),
        };
        self.resolve_with(file, default_recordsize_bytes)
    }

    /// [`Self::resolve`] with the config file's text given (`self.config`
    /// is not read): the decoder of outside bytes that the fuzz targets
    /// (crates/l2arc-fuzz) drive. Touches no file.
    pub fn resolve_toml(
        &self,
        text: &str,
        default_recordsize_bytes: u64,
    ) -> Result<ResolvedOptions> {
        let file = parse_config(text).map_err(|e| anyhow::anyhow!("config file: {e}"))?;
        self.resolve_with(file, default_recordsize_bytes)
    }

    fn resolve_with(
        &self,
        file: FileOptions,
        default_recordsize_bytes: u64,
    ) -> Result<ResolvedOptions> {
        let mut cache_config = CacheConfig::default();
        self.resolve_arc_size(&file, &mut cache_config)?;
        if let Some(v) = self.arc_shards.or(file.arc_shards) {
            cache_config.arc_shards = v;
        }
        if let Some(v) = self.zfs_prefetch_disable.or(file.zfs_prefetch_disable) {
            cache_config.zfs_prefetch_disable = v;
        }
        if let Some(v) = size_of(
            self.zfetch_max_distance,
            "zfetch_max_distance",
            &file.zfetch_max_distance,
        )? {
            cache_config.zfetch_max_distance_bytes = v;
        }
        match (self.dram_policy, &file.dram_policy) {
            (Some(p), _) => cache_config.dram_policy = p,
            (None, Some(s)) => {
                cache_config.dram_policy = parse_dram_policy(s).map_err(anyhow::Error::msg)?
            }
            (None, None) => {}
        }
        self.resolve_l2arc(&file, &mut cache_config.l2arc)?;
        self.resolve_feed(&file, &mut cache_config.l2arc)?;
        let dataset_config = self.resolve_dataset(&file, default_recordsize_bytes)?;
        let mut cache_devices = self.cache.clone();
        if cache_devices.is_empty() {
            cache_devices = file.cache.clone();
        }
        let cache_size_bytes =
            size_of(self.cache_size, "cache_size", &file.cache_size)?.unwrap_or(1 << 30);
        let arc_checkpoint_secs = self
            .l2arc_arc_checkpoint_secs
            .or(file.l2arc_arc_checkpoint_secs)
            .unwrap_or(60);
        if arc_checkpoint_secs > 86_400 {
            bail!(
                "l2arc_arc_checkpoint_secs must be seconds from 0 to 86400, not {arc_checkpoint_secs}"
            );
        }
        Ok(ResolvedOptions {
            prewarm: self.l2arc_prewarm.or(file.l2arc_prewarm).unwrap_or(true),
            arc_checkpoint_secs,
            arc_checkpoint: self.arc_checkpoint.clone().or(file.arc_checkpoint.clone()),
            cache_config,
            dataset_config,
            cache_devices,
            cache_size_bytes,
            control_socket: self.control.clone().or(file.control.clone()),
            http: self.http.clone().or(file.http.clone()),
            log_level: self.resolve_log_level(&file)?,
            front_end: front_end_options(&file),
            history: self.history.clone().or(file.history.clone()),
            emulate_hdd: self.resolve_emulated_hdd(&file)?,
            l2arc_noprefetch_set: self.l2arc_noprefetch.or(file.l2arc_noprefetch).is_some(),
            sector_table_min_set: self.sector_table_min.is_some()
                || file.sector_table_min.is_some(),
            s3: s3_file_options(file),
        })
    }

    /// `arc_max` (a size or auto), `arc_min`, `arc_sys_free`.
    fn resolve_arc_size(&self, file: &FileOptions, cache_config: &mut CacheConfig) -> Result<()> {
        let arc_max = match (self.arc_max, &file.arc_max) {
            (Some(v), _) => Some(v),
            (None, Some(SizeValue::Text(t))) => {
                Some(parse_arc_max(t).map_err(|e| anyhow::anyhow!("arc_max: {e}"))?)
            }
            (None, other) => size_of(None, "arc_max", other)?,
        };
        if let Some(v) = arc_max {
            cache_config.arc_max_bytes = v;
        }
        if let Some(v) = size_of(self.arc_min, "arc_min", &file.arc_min)? {
            cache_config.arc_min_bytes = v;
        }
        if let Some(v) = size_of(self.arc_sys_free, "arc_sys_free", &file.arc_sys_free)? {
            cache_config.arc_sys_free_bytes = v;
        }
        Ok(())
    }

    /// The L2ARC tunables: flags over the file over ZFS's defaults.
    fn resolve_l2arc(&self, file: &FileOptions, l2: &mut L2ArcConfig) -> Result<()> {
        if let Some(v) = size_of(
            self.l2arc_write_max,
            "l2arc_write_max",
            &file.l2arc_write_max,
        )? {
            l2.l2arc_write_max_bytes = v;
        }
        if let Some(v) = self.l2arc_headroom.or(file.l2arc_headroom) {
            if v == 0 {
                bail!("l2arc_headroom must be at least 1");
            }
            l2.l2arc_headroom = v;
        }
        if let Some(v) = self.l2arc_noprefetch.or(file.l2arc_noprefetch) {
            l2.l2arc_noprefetch = v;
        }
        if let Some(v) = self.l2arc_mfuonly.or(file.l2arc_mfuonly) {
            l2.l2arc_mfuonly = v;
        }
        if let Some(v) = self.l2arc_feed_again.or(file.l2arc_feed_again) {
            l2.l2arc_feed_again = v;
        }
        if let Some(v) = self.l2arc_rebuild_enabled.or(file.l2arc_rebuild_enabled) {
            l2.l2arc_rebuild_enabled = v;
        }
        if let Some(v) = self.l2arc_dwpd.or(file.l2arc_dwpd) {
            if !(v.is_finite() && v >= 0.0) {
                bail!("l2arc_dwpd must be a number of at least 0, not {v}");
            }
            l2.l2arc_dwpd = v;
        }
        match (self.l2arc_ioengine, &file.l2arc_ioengine) {
            (Some(engine), _) => l2.l2arc_ioengine = engine,
            (None, Some(s)) => {
                l2.l2arc_ioengine = parse_ioengine(s).map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            (None, None) => {}
        }
        if let Some(v) = self.l2arc_read_poll_us.or(file.l2arc_read_poll_us) {
            if v > L2ARC_READ_POLL_US_MAX {
                bail!(
                    "l2arc_read_poll_us must be at most {L2ARC_READ_POLL_US_MAX} (a spin of 10 ms \
                     is a stalled device, not a fast read), not {v}"
                );
            }
            l2.l2arc_read_poll_us = v;
        }
        if let Some(v) = size_of(
            self.l2arc_writeback_max,
            "l2arc_writeback_max",
            &file.l2arc_writeback_max,
        )? {
            l2.l2arc_writeback_max_bytes = v;
        }
        Ok(())
    }

    /// `log_level`: the flag, else the file, else info.
    fn resolve_log_level(&self, file: &FileOptions) -> Result<log::LevelFilter> {
        Ok(match (self.log_level, &file.log_level) {
            (Some(l), _) => l,
            (None, Some(s)) => {
                crate::log_sink::parse_level(s).map_err(|e| anyhow::anyhow!("log_level: {e}"))?
            }
            (None, None) => log::LevelFilter::Info,
        })
    }

    /// The feeder's periods, the stop budget and `force_init_foreign`:
    /// flags over the file.
    fn resolve_feed(&self, file: &FileOptions, l2: &mut L2ArcConfig) -> Result<()> {
        if let Some(v) = self.l2arc_feed_secs.or(file.l2arc_feed_secs) {
            if !(v.is_finite() && (0.001..=3600.0).contains(&v)) {
                bail!("l2arc_feed_secs must be seconds from 0.001 to 3600, not {v}");
            }
            l2.l2arc_feed_secs = v;
        }
        if let Some(v) = self.l2arc_feed_min_ms.or(file.l2arc_feed_min_ms) {
            if !(1..=3_600_000).contains(&v) {
                bail!("l2arc_feed_min_ms must be ms from 1 to 3600000, not {v}");
            }
            l2.l2arc_feed_min_ms = v;
        }
        if let Some(v) = self.l2arc_stop_budget_secs.or(file.l2arc_stop_budget_secs) {
            if !(v.is_finite() && (0.0..=3600.0).contains(&v)) {
                bail!("l2arc_stop_budget_secs must be seconds from 0 to 3600, not {v}");
            }
            l2.l2arc_stop_budget_secs = v;
        }
        l2.force_init_foreign = self.force_init_foreign || file.force_init_foreign == Some(true);
        Ok(())
    }

    /// The dataset's properties: recordsize, primarycache, secondarycache,
    /// compression.
    fn resolve_dataset(
        &self,
        file: &FileOptions,
        default_recordsize_bytes: u64,
    ) -> Result<DatasetConfig> {
        let mode = |flag: Option<CacheMode>,
                    key: &str,
                    value: &Option<String>|
         -> Result<CacheMode> {
            match (flag, value) {
                (Some(m), _) => Ok(m),
                (None, Some(s)) => parse_cache_mode(s).map_err(|e| anyhow::anyhow!("{key}: {e}")),
                (None, None) => Ok(CacheMode::All),
            }
        };
        let recordsize = size_of(self.recordsize, "recordsize", &file.recordsize)?
            .unwrap_or(default_recordsize_bytes);
        let compression = match (self.compression, &file.compression) {
            (Some(c), _) => c,
            (None, Some(s)) => {
                parse_compression(s).map_err(|e| anyhow::anyhow!("compression: {e}"))?
            }
            (None, None) => Compression::Lz4,
        };
        let defaults = DatasetConfig::default();
        let sector_table_min = size_of(
            self.sector_table_min,
            "sector_table_min",
            &file.sector_table_min,
        )?
        .map_or(Ok(defaults.sector_table_min_bytes), u32::try_from)
        .map_err(|_| anyhow::anyhow!("sector_table_min: too large"))?;
        let config = DatasetConfig::default()
            .recordsize_bytes(l2arc::validate_recordsize(recordsize)?)
            .primarycache(mode(self.primarycache, "primarycache", &file.primarycache)?)
            .secondarycache(mode(
                self.secondarycache,
                "secondarycache",
                &file.secondarycache,
            )?)
            .compression(compression)
            .sector_table_min_bytes(sector_table_min);
        config.validate()?;
        Ok(config)
    }

    /// The emulated HDD array, if asked for (spindles > 0).
    fn resolve_emulated_hdd(&self, file: &FileOptions) -> Result<Option<HddConfig>> {
        let spindles = self
            .emulate_hdd_spindles
            .or(file.emulate_hdd_spindles)
            .unwrap_or(0);
        if spindles == 0 {
            return Ok(None);
        }
        let mut hdd = HddConfig {
            spindles,
            ..HddConfig::default()
        };
        if let Some(v) = self
            .emulate_hdd_seek_ms_min
            .or(file.emulate_hdd_seek_ms_min)
        {
            hdd.seek_ms_min = v;
        }
        if let Some(v) = self
            .emulate_hdd_seek_ms_max
            .or(file.emulate_hdd_seek_ms_max)
        {
            hdd.seek_ms_max = v;
        }
        hdd.validate()?;
        Ok(Some(hdd))
    }
}

/// The ARC's part of the memory line: `arc_max N MiB`, or what auto
/// resolved to ("arc_max auto: c_max X MiB (cgroup limit Y MiB - Z), arc_min
/// .., arc_sys_free ..").
pub fn arc_max_text(cache: &Cache) -> String {
    let Some(auto) = cache.arc_auto() else {
        return format!("arc_max {} MiB", cache.arc_max_bytes() >> 20);
    };
    let b = &auto.breathe;
    let mib = |bytes: u64| bytes >> 20;
    let host = auto
        .limits
        .mem_total_bytes
        .saturating_sub(l2arc::arc::breathe::HOST_RESERVE_BYTES);
    let from = match auto.limits.cgroup_limit_bytes {
        Some(limit) if b.c_max_bytes < host => format!(
            "cgroup limit {} MiB - {} MiB",
            mib(limit),
            mib(b.arc_sys_free_bytes)
        ),
        _ => format!(
            "MemTotal {} MiB - {} MiB",
            mib(auto.limits.mem_total_bytes),
            mib(l2arc::arc::breathe::HOST_RESERVE_BYTES)
        ),
    };
    let mut text = format!(
        "arc_max auto: c_max {} MiB ({from}), arc_min {} MiB, arc_sys_free {} MiB",
        mib(b.c_max_bytes),
        mib(b.c_min_bytes),
        mib(b.arc_sys_free_bytes)
    );
    for why in &auto.unarmed {
        text.push_str(&format!(" [not armed: {why}]"));
    }
    text
}

impl ResolvedOptions {
    /// Builds the cache and attaches the cache devices (rebuilding their
    /// index in the background). A device that cannot be attached (the
    /// same device twice included) stops the start with the engine's one
    /// line, which names the device already.
    pub fn build_cache(&self) -> Result<Arc<Cache>> {
        let cache = Cache::new(self.cache_config.clone())?;
        for path in &self.cache_devices {
            cache.add_cache_path(path, Some(self.cache_size_bytes))?;
        }
        if !self.cache_devices.is_empty() {
            match cache.ioengine_fallback_reason() {
                None => eprintln!(
                    "l2arc: cache devices read with {} (l2arc_ioengine)",
                    cache.ioengine().name()
                ),
                Some(why) => eprintln!("l2arc: cache devices read with psync: {why}"),
            }
        }
        Ok(cache)
    }

    /// Starts the control socket when one was asked for; keep the result
    /// alive for as long as the service runs.
    pub fn start_control(
        &self,
        cache: &Arc<Cache>,
    ) -> Result<Option<crate::control::ControlServer>> {
        self.control_socket
            .as_ref()
            .map(|path| crate::control::ControlServer::start(Arc::clone(cache), path))
            .transpose()
    }

    /// Starts the history recorder and the HTTP endpoint when asked for,
    /// and says where it listens on stderr; keep the result alive for as
    /// long as the service runs.
    pub fn start_http(&self, cache: &Arc<Cache>, allow_remote: bool) -> Result<Observers> {
        let history = match &self.history {
            Some(path) => Some(Arc::new(crate::history::History::open(path)?)),
            None => None,
        };
        let http = match resolve_http(self.http.as_ref())? {
            Some(addr) => {
                let server = crate::http::HttpServer::start(
                    Arc::clone(cache),
                    history.clone(),
                    addr,
                    allow_remote,
                )?;
                eprintln!("l2arc: http on http://{}/", server.local_addr());
                Some(server)
            }
            None => None,
        };
        let recorder = match history {
            Some(h) => Some(crate::history::Recorder::start(Arc::clone(cache), h)?),
            None => None,
        };
        Ok(Observers {
            _http: http,
            _recorder: recorder,
        })
    }

    /// Wraps `primary` in the emulated HDD when asked to.
    pub fn wrap_primary(
        &self,
        primary: Arc<dyn l2arc::primary::Primary>,
    ) -> Result<Arc<dyn l2arc::primary::Primary>> {
        Ok(match &self.emulate_hdd {
            Some(hdd) => Arc::new(l2arc::primary::emulated_hdd::EmulatedHdd::new(
                primary,
                hdd.clone(),
            )?),
            None => primary,
        })
    }
}

fn read_config_file(path: &Path) -> Result<FileOptions> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("config file {}", path.display()))?;
    parse_config(&text).map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))
}

/// The file's settings; an unknown key is named with the closest known one.
fn parse_config(text: &str) -> Result<FileOptions, String> {
    toml::from_str(text).map_err(|e: toml::de::Error| {
        let message = e.message();
        match unknown_key(message) {
            Some((key, known)) => match closest(&key, &known) {
                Some(near) => format!("unknown key {key}; did you mean {near}?"),
                None => format!("unknown key {key} (docs/configuration.md lists the keys)"),
            },
            None => e.to_string(),
        }
    })
}

/// From serde's "unknown field `k`, expected one of `a`, `b`": k and the keys.
fn unknown_key(message: &str) -> Option<(String, Vec<String>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (key, rest) = rest.split_once('`')?;
    let known = rest
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    Some((key.to_string(), known))
}

/// Every key the config file takes.
pub fn config_keys() -> Vec<String> {
    let e = toml::from_str::<FileOptions>("no_such_key_at_all = 0").expect_err("not a key");
    let (_, known) = unknown_key(e.message()).expect("serde names the keys it takes");
    assert!(known.len() > 10, "{known:?}");
    known
}

/// The known key nearest `key` by edit distance, if near enough to be a typo.
fn closest<'a>(key: &str, known: &'a [String]) -> Option<&'a str> {
    let (distance, near) = known
        .iter()
        .map(|k| (edit_distance(key, k), k.as_str()))
        .min()?;
    (distance <= (key.len() / 3).max(2)).then_some(near)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The object-store keys, as the file gives them.
fn s3_file_options(file: FileOptions) -> S3FileOptions {
    S3FileOptions {
        endpoint: file.s3_endpoint,
        region: file.s3_region,
        virtual_host: file.s3_virtual_host,
        metadata_ttl: file.metadata_ttl,
        retries: file.s3_retries,
        timeout: file.s3_timeout,
        read_deadline: file.s3_read_deadline,
        stale_if_error: file.stale_if_error,
        shared_cache: file.shared_cache,
        shared_cache_endpoint: file.shared_cache_endpoint,
        shared_cache_region: file.shared_cache_region,
        shared_cache_profile: file.shared_cache_profile,
        shared_cache_key_file: file.shared_cache_key_file,
        shared_cache_admit: file.shared_cache_admit,
        shared_cache_timeout: file.shared_cache_timeout,
        shared_cache_put_timeout: file.shared_cache_put_timeout,
    }
}

/// The front ends' own keys, as the file gives them.
fn front_end_options(file: &FileOptions) -> FrontEndFileOptions {
    FrontEndFileOptions {
        listen: file.listen.clone(),
        read_only: file.read_only,
        export_name: file.export_name.clone(),
        max_connections: file.max_connections,
        stop_timeout: file.stop_timeout,
        allow_remote: file.allow_remote,
        allow_other: file.allow_other,
        threads: file.threads,
    }
}

/// `--http`/`http`: HOST:PORT, a host name resolved (the first address).
fn resolve_http(spec: Option<&String>) -> Result<Option<std::net::SocketAddr>> {
    use std::net::ToSocketAddrs;
    let Some(spec) = spec else { return Ok(None) };
    let mut addrs = spec.to_socket_addrs().map_err(|e| {
        anyhow::anyhow!("--http {spec}: {e}: give HOST:PORT, e.g. 127.0.0.1:9112 or localhost:9112")
    })?;
    // A loopback address first, if the name has one (localhost: ::1 and 127.0.0.1).
    let all: Vec<_> = addrs.by_ref().collect();
    let chosen = all.iter().find(|a| a.ip().is_loopback()).or(all.first());
    chosen
        .copied()
        .map(Some)
        .ok_or_else(|| anyhow::anyhow!("--http {spec}: the name has no address"))
}

fn parse_dram_policy(s: &str) -> Result<l2arc::arc::DramPolicy, String> {
    match s.to_ascii_lowercase().as_str() {
        "arc" => Ok(l2arc::arc::DramPolicy::Arc),
        "lru" => Ok(l2arc::arc::DramPolicy::Lru),
        _ => Err(format!("`{s}` is not a dram_policy: expected arc or lru")),
    }
}

/// `arc_max`: "auto" (0, as ZFS's `zfs_arc_max=0`) or a size.
pub fn parse_arc_max(s: &str) -> Result<u64, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(l2arc::ARC_MAX_AUTO);
    }
    parse_size(s)
}

/// A size such as `256MiB` or a number of bytes (for flags).
pub fn parse_size(s: &str) -> Result<u64, String> {
    l2arc_sim::parse_size(s)
}

/// A size whose 0 means "off" or "no cap" (`l2arc_write_max`,
/// `l2arc_writeback_max`), as the same keys accept in the config file.
fn parse_size_or_off(s: &str) -> Result<u64, String> {
    let zero = s.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if !zero.is_empty() && zero.bytes().all(|b| b == b'0') {
        return Ok(0);
    }
    parse_size(s)
}

fn parse_compression(s: &str) -> Result<Compression, String> {
    s.parse().map_err(|e: l2arc::FormatError| e.to_string())
}

fn parse_cache_mode(s: &str) -> Result<CacheMode, String> {
    match s {
        "all" => Ok(CacheMode::All),
        "none" => Ok(CacheMode::None),
        _ => Err(format!("`{s}` is not a cache mode: expected all or none")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_turns_off_the_sizes_that_say_so() {
        for zero in ["0", "0MiB", " 0 "] {
            assert_eq!(parse_size_or_off(zero), Ok(0), "{zero}");
        }
        assert_eq!(parse_size_or_off("32MiB"), Ok(32 << 20));
        assert!(parse_size_or_off("0.5MiB").is_err());
        assert!(parse_size_or_off("MiB").is_err());
        assert!(
            parse_size("0").is_err(),
            "arc_max and friends keep refusing 0"
        );
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            cache: CacheOptions,
        }
        use clap::Parser as _;
        let flags = Flags::try_parse_from(["x", "--l2arc-writeback-max", "0"]).unwrap();
        assert_eq!(flags.cache.l2arc_writeback_max, Some(0));
    }

    fn resolve_file(text: &str, flags: CacheOptions) -> Result<ResolvedOptions> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("l2arc.toml");
        std::fs::write(&path, text)?;
        CacheOptions {
            config: Some(path),
            ..flags
        }
        .resolve(128 << 10)
    }

    /// `arc_max` is auto unless a size is given; `auto` is a value of the
    /// key and of the flag; `arc_min` and `arc_sys_free` are sizes.
    #[test]
    fn arc_max_auto_is_the_default_and_a_value() {
        let r = resolve_file("", CacheOptions::default()).unwrap();
        assert_eq!(r.cache_config.arc_max_bytes, l2arc::ARC_MAX_AUTO);
        let r = resolve_file(
            "arc_max = \"auto\"\narc_min = \"128MiB\"\narc_sys_free = \"1GiB\"\n",
            CacheOptions::default(),
        )
        .unwrap();
        assert_eq!(r.cache_config.arc_max_bytes, l2arc::ARC_MAX_AUTO);
        assert_eq!(r.cache_config.arc_min_bytes, 128 << 20);
        assert_eq!(r.cache_config.arc_sys_free_bytes, 1 << 30);
        let r = resolve_file("arc_max = \"2GiB\"\n", CacheOptions::default()).unwrap();
        assert_eq!(r.cache_config.arc_max_bytes, 2 << 30);
        assert_eq!(parse_arc_max("auto"), Ok(l2arc::ARC_MAX_AUTO));
        assert_eq!(parse_arc_max("AUTO"), Ok(l2arc::ARC_MAX_AUTO));
        assert_eq!(parse_arc_max("1GiB"), Ok(1 << 30));
        assert!(parse_arc_max("lots").is_err());
        let bad = resolve_file("arc_max = \"sometimes\"\n", CacheOptions::default()).unwrap_err();
        assert!(format!("{bad:#}").contains("arc_max"), "{bad:#}");
    }

    #[test]
    fn file_settings_apply_and_flags_win() {
        let r = resolve_file(
            "arc_max = \"256MiB\"\nrecordsize = 16384\ncompression = \"zstd\"\ncache = [\"/tmp/x\"]\nl2arc_noprefetch = false\nsecondarycache = \"none\"\n",
            CacheOptions {
                arc_max: Some(64 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(r.cache_config.arc_max_bytes, 64 << 20);
        assert_eq!(r.dataset_config.recordsize_bytes, 16384);
        assert_eq!(r.dataset_config.compression, Compression::Zstd);
        assert_eq!(r.dataset_config.secondarycache, CacheMode::None);
        assert!(!r.cache_config.l2arc.l2arc_noprefetch);
        assert_eq!(r.cache_devices, vec![PathBuf::from("/tmp/x")]);
        assert!(!r.sector_table_min_set);
        assert_eq!(r.dataset_config.sector_table_min_bytes, 256 << 10);
        let r = resolve_file("sector_table_min = \"128K\"\n", CacheOptions::default()).unwrap();
        assert!(r.sector_table_min_set);
        assert_eq!(r.dataset_config.sector_table_min_bytes, 128 << 10);
        let flag = CacheOptions {
            sector_table_min: Some(1 << 20),
            ..Default::default()
        };
        let r = resolve_file("sector_table_min = \"128K\"\n", flag).unwrap();
        assert_eq!(r.dataset_config.sector_table_min_bytes, 1 << 20);
        assert_eq!(r.cache_config.l2arc.l2arc_read_poll_us, 100);
        let r = resolve_file("l2arc_read_poll_us = 0\n", CacheOptions::default()).unwrap();
        assert_eq!(r.cache_config.l2arc.l2arc_read_poll_us, 0);
        let flag = CacheOptions {
            l2arc_read_poll_us: Some(40),
            ..Default::default()
        };
        let r = resolve_file("l2arc_read_poll_us = 0\n", flag).unwrap();
        assert_eq!(r.cache_config.l2arc.l2arc_read_poll_us, 40);
        assert!(!r.cache_config.zfs_prefetch_disable);
        assert_eq!(r.cache_config.zfetch_max_distance_bytes, 8 << 20);
        let r = resolve_file(
            "zfs_prefetch_disable = true\nzfetch_max_distance = \"1MiB\"\n",
            CacheOptions::default(),
        )
        .unwrap();
        assert!(r.cache_config.zfs_prefetch_disable);
        assert_eq!(r.cache_config.zfetch_max_distance_bytes, 1 << 20);
    }

    #[test]
    fn object_store_keys_are_read_from_the_file() {
        let r = resolve_file(
            "s3_endpoint = \"http://127.0.0.1:7070\"\ns3_read_deadline = 12.5\ns3_timeout = 2\ns3_retries = 3\nstale_if_error = true\nmetadata_ttl = 5\ns3_virtual_host = true\ns3_region = \"eu-west-1\"\n",
            CacheOptions::default(),
        )
        .unwrap();
        assert_eq!(r.s3.endpoint.as_deref(), Some("http://127.0.0.1:7070"));
        assert_eq!(r.s3.read_deadline, Some(12.5));
        assert_eq!(r.s3.timeout, Some(2.0));
        assert_eq!(r.s3.retries, Some(3));
        assert_eq!(r.s3.stale_if_error, Some(true));
        assert_eq!(r.s3.metadata_ttl, Some(5.0));
        assert_eq!(r.s3.virtual_host, Some(true));
        assert_eq!(r.s3.region.as_deref(), Some("eu-west-1"));
        let unknown = resolve_file("s3_deadline = 3\n", CacheOptions::default()).unwrap_err();
        assert!(
            format!("{unknown:#}").contains("s3_deadline"),
            "{unknown:#}"
        );
    }

    #[test]
    fn bad_settings_are_one_clear_error() {
        let unknown = resolve_file("arc_maximum = 5\n", CacheOptions::default()).unwrap_err();
        assert!(
            format!("{unknown:#}").contains("arc_maximum"),
            "{unknown:#}"
        );
        let size = resolve_file("arc_max = \"lots\"\n", CacheOptions::default()).unwrap_err();
        assert!(format!("{size:#}").contains("arc_max"), "{size:#}");
        let rs = resolve_file("recordsize = 3000\n", CacheOptions::default()).unwrap_err();
        assert!(format!("{rs:#}").contains("recordsize"), "{rs:#}");
        let table =
            resolve_file("sector_table_min = \"16K\"\n", CacheOptions::default()).unwrap_err();
        assert!(
            format!("{table:#}").contains("sector_table_min"),
            "{table:#}"
        );
        let poll =
            resolve_file("l2arc_read_poll_us = 50000\n", CacheOptions::default()).unwrap_err();
        assert!(
            format!("{poll:#}").contains("l2arc_read_poll_us must be at most 10000"),
            "{poll:#}"
        );
        let mode = resolve_file("primarycache = \"some\"\n", CacheOptions::default()).unwrap_err();
        assert!(format!("{mode:#}").contains("primarycache"), "{mode:#}");
        let missing = CacheOptions {
            config: Some(PathBuf::from("/nonexistent/l2arc.toml")),
            ..Default::default()
        }
        .resolve(4096)
        .unwrap_err();
        assert!(format!("{missing:#}").contains("/nonexistent/l2arc.toml"));
    }

    #[test]
    fn new_keys_are_read_checked_and_a_typo_names_the_closest_key() {
        let r = resolve_file(
            "l2arc_feed_secs = 0.5\nl2arc_feed_min_ms = 50\ndram_policy = \"lru\"\nforce_init_foreign = true\nlog_level = \"debug\"\nlisten = \"unix:/tmp/x.sock\"\nread_only = true\nhttp = \"localhost:9112\"\n",
            CacheOptions::default(),
        )
        .unwrap();
        let l2 = &r.cache_config.l2arc;
        assert_eq!((l2.l2arc_feed_secs, l2.l2arc_feed_min_ms), (0.5, 50));
        assert!(l2.force_init_foreign);
        assert_eq!(r.cache_config.dram_policy, l2arc::arc::DramPolicy::Lru);
        assert_eq!(r.log_level, log::LevelFilter::Debug);
        assert_eq!(r.front_end.listen.as_deref(), Some("unix:/tmp/x.sock"));
        assert_eq!(r.front_end.read_only, Some(true));
        let http = resolve_http(r.http.as_ref()).unwrap().unwrap();
        assert!(http.ip().is_loopback() && http.port() == 9112);
        let e = resolve_http(Some(&"no-port".to_string())).unwrap_err();
        assert!(format!("{e:#}").contains("give HOST:PORT"), "{e:#}");
        for bad in ["nan", "0", "-1", "inf"] {
            let e = resolve_file(
                &format!("l2arc_feed_secs = {bad}\n"),
                CacheOptions::default(),
            )
            .unwrap_err();
            assert!(
                format!("{e:#}").contains("l2arc_feed_secs must be"),
                "{e:#}"
            );
        }
        let typo = resolve_file("arc_maxx = 5\n", CacheOptions::default()).unwrap_err();
        assert!(
            format!("{typo:#}").contains("unknown key arc_maxx; did you mean arc_max?"),
            "{typo:#}"
        );
        let far = resolve_file("colour = 5\n", CacheOptions::default()).unwrap_err();
        assert!(
            format!("{far:#}").contains("unknown key colour ("),
            "{far:#}"
        );
        assert!(config_keys().iter().any(|k| k == "l2arc_feed_min_ms"));
        assert_eq!(r.cache_config.l2arc.l2arc_stop_budget_secs, 5.0);
        let r = resolve_file("l2arc_stop_budget_secs = 0.5\n", CacheOptions::default()).unwrap();
        assert_eq!(r.cache_config.l2arc.l2arc_stop_budget_secs, 0.5);
        for bad in ["-1", "nan", "3601"] {
            let e = resolve_file(
                &format!("l2arc_stop_budget_secs = {bad}\n"),
                CacheOptions::default(),
            )
            .unwrap_err();
            assert!(
                format!("{e:#}").contains("l2arc_stop_budget_secs must be"),
                "{e:#}"
            );
        }
        assert_eq!(edit_distance("arc_maxx", "arc_max"), 1);
    }

    #[test]
    fn defaults_without_file() {
        let r = CacheOptions::default().resolve(64 << 10).unwrap();
        assert_eq!(r.dataset_config.recordsize_bytes, 64 << 10);
        assert_eq!(r.dataset_config.compression, Compression::Lz4);
        assert!(r.cache_devices.is_empty());
        assert!(r.emulate_hdd.is_none());
    }
}
