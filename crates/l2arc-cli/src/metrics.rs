//! What the HTTP endpoint serves: Prometheus text and the live page's JSON.
//!
//! Prometheus users of ZFS know node_exporter's flat arcstats gauges; we
//! keep ZFS's names (`hits`, `l2_size`, ...) under an `l2arc_arcstats_`
//! prefix so that a dashboard query reads like `arc_summary`, and add what
//! node_exporter cannot give: units in every name (`_bytes`, `_seconds`,
//! counters in `_total`, as `promtool check metrics` requires), latency as
//! real Prometheus histograms by tier (`l2arc_read_latency_seconds{tier=}`),
//! and labels per dataset and per cache device.
//!
//! Every value comes from one `Cache::stats()` snapshot, the same that
//! `l2arc ctl stats` prints, so the two agree when taken at one moment.
//!
//! Hygiene, as `promtool check metrics` and Prometheus' naming guide want
//! it: a flag is a gauge, a byte counter ends in `_bytes_total`, every
//! family has a HELP sentence that names its unit, the process is
//! described by the standard `process_*` families and `l2arc_build_info`.
//! A counter never falls on the page because it never falls below: the
//! engine keeps a removed device's counts in its totals (`l2arc::kstat_kind`
//! says which kstats are counters). The one reset is that of a device's own
//! series when the device is attached again: a new attachment counts from
//! zero, which Prometheus' `rate` and `increase` read as the reset it is
//! (holding the old value instead would show no reads until the new count
//! passed it). Front ends add their own families (NBD's requests and their latency, FUSE's
//! operations) through [`register`].
//! The histograms' Prometheus buckets are the engine's octave boundaries
//! (64 ns to 64 s, each bucket twice the last): exact sums of the engine's
//! finer buckets, few enough to scrape every second.

use std::fmt::Write;
use std::sync::{Arc, RwLock};

use l2arc::Cache;
use l2arc::latency::{BUCKETS, HistogramSnapshot, bucket_low_ns};
use serde_json::{Value, json};

/// Objects listed in the page's drill-down.
const TOP_OBJECTS_SHOWN: usize = 20;

/// Octaves exported as Prometheus buckets: `le` = 2^k ns for k in this range.
const PROMETHEUS_OCTAVES: std::ops::RangeInclusive<u32> = 6..=36;

/// How a kstat is exported: counter or gauge, and its unit.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Counter,
    CounterBytes,
    GaugeBytes,
    Gauge,
    /// A counter in microseconds, exported in seconds.
    CounterMicros,
    /// A counter in milliseconds, exported in seconds.
    CounterMillis,
    /// A gauge in seconds (`_secs`), exported as `_seconds`.
    GaugeSeconds,
}

fn kind_of(name: &str) -> Kind {
    match name {
        "l2_ioengine_uring" => Kind::Gauge,
        // Bytes, without `_bytes` in ZFS's names (`evict_mru` and
        // `evict_mfu` count records).
        n if n.starts_with("evict_l2_") => Kind::CounterBytes,
        "size"
        | "c"
        | "c_max"
        | "c_min"
        | "p"
        | "arc_sys_free"
        | "memory_available_bytes"
        | "l2_size"
        | "l2_asize"
        | "l2_hdr_size"
        | "l2_dwpd_credit"
        | "l2_dwpd_limit" => Kind::GaugeBytes,
        "arc_no_grow" => Kind::Gauge,
        n if n.ends_with("_size") => Kind::GaugeBytes,
        "entries" | "l2_bufs" | "l2_devices" => Kind::Gauge,
        "arc_checkpoint_bytes" => Kind::GaugeBytes,
        "arc_prewarm_active" | "arc_prewarm_queued_records" | "arc_checkpoint_records" => {
            Kind::Gauge
        }
        "l2_rebuild_time_us" => Kind::CounterMicros,
        "l2_stop_flush_ms" => Kind::CounterMillis,
        "arc_prewarm_ms" => Kind::CounterMillis,
        "arc_checkpoint_age_secs" => Kind::GaugeSeconds,
        n if n.ends_with("_bytes") => Kind::CounterBytes,
        _ => Kind::Counter,
    }
}

/// The Prometheus name and type of a kstat.
fn prometheus_name(prefix: &str, name: &str) -> (String, &'static str) {
    match kind_of(name) {
        Kind::Counter => (format!("{prefix}{name}_total"), "counter"),
        Kind::CounterBytes if name.ends_with("_bytes") => {
            (format!("{prefix}{name}_total"), "counter")
        }
        Kind::CounterBytes => (format!("{prefix}{name}_bytes_total"), "counter"),
        Kind::GaugeBytes if name.ends_with("_bytes") => (format!("{prefix}{name}"), "gauge"),
        Kind::GaugeBytes => (format!("{prefix}{name}_bytes"), "gauge"),
        Kind::Gauge => (format!("{prefix}{name}"), "gauge"),
        Kind::CounterMicros => (
            format!("{prefix}{}_seconds_total", name.trim_end_matches("_us")),
            "counter",
        ),
        Kind::CounterMillis => (
            format!("{prefix}{}_seconds_total", name.trim_end_matches("_ms")),
            "counter",
        ),
        Kind::GaugeSeconds => (
            format!("{prefix}{}_seconds", name.trim_end_matches("_secs")),
            "gauge",
        ),
    }
}

fn exported_value(name: &str, value: u64) -> String {
    match kind_of(name) {
        Kind::CounterMicros => format!("{}", value as f64 / 1e6),
        Kind::CounterMillis => format!("{}", value as f64 / 1e3),
        _ => value.to_string(),
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A front end's families, appended to every `/metrics` page.
type Source = Arc<dyn Fn(&mut String) + Send + Sync>;

/// The sources registered now, by registration number.
static SOURCES: RwLock<Vec<(u64, Source)>> = RwLock::new(Vec::new());
static NEXT_SOURCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Keeps a source registered; unregisters it when dropped.
pub struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        let mut sources = SOURCES.write().unwrap_or_else(|e| e.into_inner());
        sources.retain(|(id, _)| *id != self.0);
    }
}

/// Adds `source` (it writes whole families: HELP, TYPE and samples, with
/// names no other source uses) to `/metrics` while the result lives. One
/// service runs per process, so the registry is the process's.
pub fn register(source: impl Fn(&mut String) + Send + Sync + 'static) -> Registration {
    let id = NEXT_SOURCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut sources = SOURCES.write().unwrap_or_else(|e| e.into_inner());
    sources.push((id, Arc::new(source)));
    Registration(id)
}

/// The whole `/metrics` page.
pub fn prometheus(cache: &Cache) -> String {
    let stats = cache.stats();
    let mut out = String::with_capacity(16 << 10);
    for (name, value) in stats.kstats() {
        let (metric, kind) = prometheus_name("l2arc_arcstats_", name);
        write_family_head(&mut out, &metric, kind, &help_of(name, ""));
        let _ = writeln!(out, "{metric} {}", exported_value(name, value));
    }
    write_latency(&mut out, cache);
    write_datasets(&mut out, cache);
    if let Some(l2) = &stats.l2 {
        write_devices(&mut out, &l2.devices);
    }
    write_build_info(&mut out);
    write_process(&mut out);
    let sources: Vec<Source> = SOURCES
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(_, s)| Arc::clone(s))
        .collect();
    for source in sources {
        source(&mut out);
    }
    out
}

/// `l2arc_build_info{version,commit} 1`.
fn write_build_info(out: &mut String) {
    write_family_head(
        out,
        "l2arc_build_info",
        "gauge",
        "The running l2arc's version and commit, as labels (value 1).",
    );
    let _ = writeln!(
        out,
        "l2arc_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        escape(env!("CARGO_PKG_VERSION")),
        escape(option_env!("L2ARC_COMMIT").unwrap_or("unknown"))
    );
}

/// A family's HELP and TYPE lines.
pub(crate) fn write_family_head(out: &mut String, metric: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {metric} {help}");
    let _ = writeln!(out, "# TYPE {metric} {kind}");
}

/// HELP of a kstat: one sentence, its unit, and its arcstats name.
fn help_of(name: &str, of_what: &str) -> String {
    let unit = match kind_of(name) {
        Kind::Counter => "count",
        Kind::CounterBytes | Kind::GaugeBytes => "bytes",
        Kind::CounterMicros | Kind::CounterMillis | Kind::GaugeSeconds => "seconds",
        Kind::Gauge if name == "l2_ioengine_uring" || name == "arc_prewarm_active" => "0 or 1",
        Kind::Gauge => "count",
    };
    format!("{}{of_what} ({unit}; arcstats {name}).", about(name))
}

/// The standard `process_*` families (as the Prometheus client libraries
/// write them), from /proc/self: CPU, memory, descriptors, start time.
fn write_process(out: &mut String) {
    let Some(p) = ProcessStats::read() else {
        return;
    };
    let families: [(&str, &str, &str, f64); 6] = [
        (
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time spent by the process, in seconds.",
            p.cpu_seconds,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory of the process, in bytes.",
            p.resident_bytes as f64,
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory of the process, in bytes.",
            p.virtual_bytes as f64,
        ),
        (
            "process_open_fds",
            "gauge",
            "File descriptors the process has open, a count.",
            p.open_fds as f64,
        ),
        (
            "process_max_fds",
            "gauge",
            "The process's limit of open file descriptors (RLIMIT_NOFILE), a count.",
            p.max_fds as f64,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "When the process started, in seconds since the Unix epoch.",
            p.start_time_seconds,
        ),
    ];
    for (name, kind, help, value) in families {
        write_family_head(out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
}

/// What /proc says of this process.
struct ProcessStats {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    open_fds: u64,
    max_fds: u64,
    start_time_seconds: f64,
}

impl ProcessStats {
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which may hold spaces: `pid (comm) state ...`.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
        // SAFETY: sysconf and getrlimit only read or write what we pass.
        let (ticks, page_bytes, max_fds) = unsafe {
            let mut limit: libc::rlimit = std::mem::zeroed();
            let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                limit.rlim_cur
            } else {
                0
            };
            (
                libc::sysconf(libc::_SC_CLK_TCK).max(1) as f64,
                libc::sysconf(libc::_SC_PAGESIZE).max(1) as u64,
                max,
            )
        };
        let boot_seconds: f64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(Self {
            cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
            virtual_bytes: field(23)?,
            resident_bytes: field(24)? * page_bytes,
            open_fds: std::fs::read_dir("/proc/self/fd").ok()?.count() as u64,
            max_fds,
            start_time_seconds: boot_seconds + field(22)? as f64 / ticks,
        })
    }
}

/// Latency by the tier that served a read.
fn write_latency(out: &mut String, cache: &Cache) {
    let metric = "l2arc_read_latency_seconds";
    let help = format!(
        "Read latency by the tier that served it (arc_hit sampled 1 in {}, weighted), and of front-end requests, in seconds.",
        l2arc::analytics::ARC_HIT_SAMPLE_PERIOD
    );
    write_family_head(out, metric, "histogram", &help);
    for (tier, h) in cache.analytics().histograms() {
        write_histogram(out, metric, &format!("tier=\"{tier}\""), &h);
    }
    // The shared tier's GETs that found a block (always timed).
    if let Some(h) = cache.shared_read_latency() {
        write_histogram(out, metric, "tier=\"shared\"", &h);
    }
}

/// Properties and counters per dataset.
fn write_datasets(out: &mut String, cache: &Cache) {
    let datasets = cache.dataset_list();
    let families: [(&str, &str, &str); 7] = [
        (
            "l2arc_dataset_info",
            "gauge",
            "A dataset's properties, as labels (value 1).",
        ),
        (
            "l2arc_dataset_recordsize_bytes",
            "gauge",
            "A dataset's recordsize, in bytes.",
        ),
        (
            "l2arc_dataset_l2_hits_total",
            "counter",
            "Reads of the dataset served by a cache device, a count.",
        ),
        (
            "l2arc_dataset_shared_hits_total",
            "counter",
            "Reads of the dataset served by the shared cache tier, a count.",
        ),
        (
            "l2arc_dataset_shared_read_bytes_total",
            "counter",
            "Bytes of the dataset read from the shared cache tier, in bytes.",
        ),
        (
            "l2arc_dataset_primary_reads_total",
            "counter",
            "Reads of primary storage for the dataset, a count.",
        ),
        (
            "l2arc_dataset_primary_read_bytes_total",
            "counter",
            "Bytes read from primary storage for the dataset, in bytes.",
        ),
    ];
    for (family, kind, help) in families {
        write_family_head(out, family, kind, help);
        for (id, name, config) in &datasets {
            let label = format!("dataset=\"{}\"", escape(name));
            let a = cache.analytics().dataset(dataset_index(&datasets, *id));
            let line = match family {
                "l2arc_dataset_info" => format!(
                    "{family}{{{label},primarycache=\"{}\",secondarycache=\"{}\",compression=\"{}\"}} 1",
                    mode(config.primarycache),
                    mode(config.secondarycache),
                    format!("{:?}", config.compression).to_lowercase()
                ),
                "l2arc_dataset_recordsize_bytes" => {
                    format!("{family}{{{label}}} {}", config.recordsize_bytes)
                }
                "l2arc_dataset_l2_hits_total" => counter(family, &label, a.l2_hits),
                "l2arc_dataset_shared_hits_total" => counter(family, &label, a.shared_hits),
                "l2arc_dataset_shared_read_bytes_total" => {
                    counter(family, &label, a.shared_read_bytes)
                }
                "l2arc_dataset_primary_reads_total" => counter(family, &label, a.primary_reads),
                _ => counter(family, &label, a.primary_read_bytes),
            };
            let _ = writeln!(out, "{line}");
        }
    }
}

/// A counter's sample line.
fn counter(family: &str, labels: &str, value: u64) -> String {
    format!("{family}{{{labels}}} {value}")
}

/// State, capacity and every counter per cache device.
fn write_devices(out: &mut String, devices: &[l2arc::DeviceStats]) {
    let label = |d: &l2arc::DeviceStats| {
        format!("slot=\"{}\",device=\"{}\"", d.slot, escape(&d.description))
    };
    write_family_head(
        out,
        "l2arc_device_info",
        "gauge",
        "A cache device's state, as a label (value 1).",
    );
    for d in devices {
        let _ = writeln!(
            out,
            "l2arc_device_info{{{},state=\"{}\"}} 1",
            label(d),
            d.state
        );
    }
    write_family_head(
        out,
        "l2arc_device_capacity_bytes",
        "gauge",
        "The data area of a cache device, in bytes.",
    );
    for d in devices {
        let _ = writeln!(
            out,
            "l2arc_device_capacity_bytes{{{}}} {}",
            label(d),
            d.size_bytes
        );
    }
    let Some(first) = devices.first() else {
        return;
    };
    for (i, (name, _)) in first.kstats.iter().enumerate() {
        let (metric, kind) = prometheus_name("l2arc_device_", name);
        write_family_head(out, &metric, kind, &help_of(name, ", of one cache device"));
        for d in devices {
            let series = format!("{metric}{{{}}}", label(d));
            let value = exported_value(name, d.kstats[i].1);
            let _ = writeln!(out, "{series} {value}");
        }
    }
}

/// `serve-nbd`'s families: connections, requests by type, errors, and
/// request latency by type (histograms in seconds), from its server.
pub fn nbd_source(reader: l2arc_nbd::server::StatsReader) -> impl Fn(&mut String) + Send + Sync {
    move |out: &mut String| {
        let s = reader.stats();
        for (name, help, value) in nbd_counters(&s) {
            write_family_head(out, name, "counter", help);
            let _ = writeln!(out, "{name} {value}");
        }
        write_family_head(
            out,
            "l2arc_nbd_connections",
            "gauge",
            "Connections open now, a count.",
        );
        let _ = writeln!(out, "l2arc_nbd_connections {}", s.connections_current);
        write_family_head(
            out,
            "l2arc_nbd_buffer_used_bytes",
            "gauge",
            "The NBD buffer pool in use now, in bytes.",
        );
        let _ = writeln!(out, "l2arc_nbd_buffer_used_bytes {}", s.buffer_used_bytes);
        let family = "l2arc_nbd_requests_by_type_total";
        write_family_head(
            out,
            family,
            "counter",
            "Valid requests by NBD command type, a count.",
        );
        for (kind, value) in l2arc_nbd::server::REQUEST_TYPES
            .iter()
            .zip(s.requests_by_type)
        {
            let _ = writeln!(
                out,
                "{}",
                counter(family, &format!("type=\"{kind}\""), value)
            );
        }
        let metric = "l2arc_nbd_request_latency_seconds";
        write_family_head(
            out,
            metric,
            "histogram",
            "NBD request latency by command type, from the request to its reply, in seconds.",
        );
        for (kind, h) in reader.latency() {
            write_histogram(out, metric, &format!("type=\"{kind}\""), &h);
        }
    }
}

/// NBD's plain counters: (name, HELP, value).
fn nbd_counters(s: &l2arc_nbd::ServerStats) -> [(&'static str, &'static str, u64); 8] {
    [
        (
            "l2arc_nbd_connections_accepted_total",
            "Connections that finished the NBD handshake, a count.",
            s.connections_accepted,
        ),
        (
            "l2arc_nbd_connections_refused_total",
            "Connections turned away with the table full, a count.",
            s.connections_refused,
        ),
        (
            "l2arc_nbd_connections_bumped_total",
            "Unused connections closed to make room for a new client (idle, negotiating, reply unread), a count.",
            s.connections_evicted
                + s.connections_bumped_negotiating
                + s.connections_bumped_reply_unread,
        ),
        (
            "l2arc_nbd_connections_idle_closed_total",
            "Connections closed after idle_timeout of silence, a count.",
            s.connections_idle_closed,
        ),
        (
            "l2arc_nbd_requests_total",
            "Requests received, valid or not, a count.",
            s.requests,
        ),
        (
            "l2arc_nbd_request_errors_total",
            "Requests answered with an error, a count.",
            s.request_errors,
        ),
        (
            "l2arc_nbd_protocol_errors_total",
            "Sessions ended by broken framing, a count.",
            s.protocol_errors,
        ),
        (
            "l2arc_nbd_image_changes_total",
            "Times the image was found changed behind the export, a count.",
            s.image_changes,
        ),
    ]
}

/// `mount`'s family: the FUSE requests the kernel sent, by operation.
pub fn fuse_source() -> impl Fn(&mut String) + Send + Sync {
    move |out: &mut String| {
        let family = "l2arc_fuse_requests_total";
        write_family_head(
            out,
            family,
            "counter",
            "FUSE requests from the kernel by operation, a count.",
        );
        for (op, value) in l2arc_fuse::ops::requests() {
            let line = counter(family, &format!("op=\"{op}\""), value);
            let _ = writeln!(out, "{line}");
        }
    }
}

/// One sentence on what a kstat counts (its unit is added by `help_of`).
fn about(name: &str) -> &'static str {
    match name {
        "hits" => "Reads served from the ARC (DRAM)",
        "misses" => "Reads the ARC did not hold, served from a cache device or primary storage",
        "iohits" => "Reads that found their record being read already and waited for it",
        "demand_data_hits" => "Demand reads served from the ARC",
        "demand_data_misses" => "Demand reads the ARC did not hold",
        "prefetch_data_hits" => "Read-ahead requests for records the ARC held",
        "prefetch_data_misses" => "Read-ahead requests for records the ARC did not hold",
        "mru_hits" => "ARC hits on the MRU list (records read once)",
        "mfu_hits" => "ARC hits on the MFU list (records read twice or more)",
        "mru_ghost_hits" => "Misses on records recently evicted from the MRU list",
        "mfu_ghost_hits" => "Misses on records recently evicted from the MFU list",
        "demand_iohit_predictive_prefetch" => "Demand reads that joined a read-ahead in flight",
        "stale_drops" => "Hits on records whose object changed since they were read, dropped",
        "evict_mru" => "Records evicted from the MRU list",
        "evict_mfu" => "Records evicted from the MFU list",
        "insert_no_room" => "Inserts refused because every eviction candidate was in use",
        "invalidated" => "Records dropped by writes and invalidation",
        "size" => "Data the ARC holds now",
        "c" => "The ARC's target size",
        "p" => "The ARC's target size of the MRU list",
        "mru_size" => "Data on the MRU list",
        "mfu_size" => "Data on the MFU list",
        "mru_ghost_size" => "Data the MRU ghost list remembers",
        "mfu_ghost_size" => "Data the MFU ghost list remembers",
        "entries" => "Records in the ARC",
        "c_max" => "The ARC's largest size (arc_max, or its ceiling with arc_max auto)",
        "c_min" => "The ARC's least target size (arc_min; arc_max when fixed)",
        "arc_no_grow" => "1 while the ARC may not grow (memory was short lately)",
        "memory_throttle_count" => "Samples that found free memory under arc_sys_free",
        "memory_available_bytes" => "Memory free at the last sample (host or cgroup, the lesser)",
        "arc_sys_free" => "Memory the ARC leaves free for others (arc_max auto)",
        "arc_shrinks" => "Shrinks of the ARC's target size for want of memory",
        "arc_shrunk_bytes" => "Data evicted by those shrinks",
        "reads" => "Reads by the front end",
        "read_bytes" => "Data read by the front end",
        "writes" => "Writes by the front end, passed through to primary storage",
        "write_bytes" => "Data written by the front end",
        "primary_reads" => "Reads of primary storage",
        "primary_read_bytes" => "Data read from primary storage",
        "primary_errors" => "Failed reads of primary storage",
        "primary_stale" => "Reads of primary storage retried because the object changed under them",
        "zfetch_hits" => {
            "Demand misses that continued a sequential stream and started a read-ahead"
        }
        "zfetch_io_issued" => "Records read ahead",
        "l2_ioengine_uring" => "Whether cache devices are read through io_uring",
        "evict_l2_cached" => "Data evicted from the ARC that a cache device held already",
        "evict_l2_eligible" => "Data evicted from the ARC that could go to a cache device",
        "evict_l2_eligible_mfu" => "Data evicted from the MFU list that could go to a cache device",
        "evict_l2_eligible_mru" => "Data evicted from the MRU list that could go to a cache device",
        "evict_l2_ineligible" => "Data evicted from the ARC that was not for a cache device",
        "evict_l2_skip" => "Eligible data dropped because the L2ARC feed queue was full",
        "evict_l2_queued" => "Eligible data queued for a cache device",
        n if n.starts_with("arc_prewarm_") || n.starts_with("arc_checkpoint") => about_shape(n),
        n if n.starts_with("shared_") => about_shared(n),
        _ => about_l2(name),
    }
}

/// One sentence on what a kstat of the ARC's checkpoints and prewarm
/// counts (docs/operations.md, "Restarts: the ARC comes back hot").
fn about_shape(name: &str) -> &'static str {
    match name {
        "arc_prewarm_records" => "Records the prewarm read back from flash into the ARC at start",
        "arc_prewarm_bytes" => "Data the prewarm read back from flash into the ARC at start",
        "arc_prewarm_ms" => {
            "Time the prewarms spent reading from flash (from the L2ARC rebuild's end), once each ended"
        }
        "arc_prewarm_reads" => {
            "Device reads the prewarm issued (records back to back on flash are read together)"
        }
        "arc_prewarm_joined" => "Reads that waited for the prewarm's read of their record",
        "arc_prewarm_stale" => {
            "Saved records not prewarmed because their object changed while stopped"
        }
        "arc_prewarm_missing" => "Saved records not prewarmed because no cache device held them",
        "arc_prewarm_active" => "Whether the prewarm runs now",
        "arc_prewarm_queued_records" => "Saved records the prewarm has still to consider",
        "arc_checkpoints" => "Checkpoints of the ARC's shape saved",
        "arc_checkpoint_bytes" => "Size of the last ARC checkpoint saved or restored",
        "arc_checkpoint_records" => "Records in the last ARC checkpoint saved or restored",
        "arc_checkpoint_age_secs" => "Age of the last ARC checkpoint saved or restored",
        "arc_checkpoint_unnamed_records" => {
            "ARC records left out of checkpoints because their object's name is unknown"
        }
        "arc_checkpoint_dropped_records" => "ARC entries left out of checkpoints by the size bound",
        "arc_checkpoint_rejected_magic" => "ARC checkpoints rejected at start: not a checkpoint",
        "arc_checkpoint_rejected_version" => "ARC checkpoints rejected at start: another version",
        "arc_checkpoint_rejected_checksum" => "ARC checkpoints rejected at start: damaged",
        "arc_checkpoint_rejected_truncated" => "ARC checkpoints rejected at start: torn",
        "arc_checkpoint_rejected_invalid" => "ARC checkpoints rejected at start: inconsistent",
        _ => "A counter of the ARC's checkpoints",
    }
}

/// One sentence on what a kstat of the shared tier counts
/// (docs/operations.md, "A cache tier shared by a fleet").
fn about_shared(name: &str) -> &'static str {
    match name {
        "shared_hits" => "Records read from the shared cache tier",
        "shared_misses" => {
            "Shared cache tier reads that found no usable block (bad blocks included)"
        }
        "shared_writes" => "Blocks written to the shared cache tier",
        "shared_write_drops" => {
            "Records not written to the shared cache tier: its queue was full or it was backing off"
        }
        "shared_errors" => "Shared cache tier requests that failed",
        "shared_timeouts" => "Shared cache tier reads past the tier's timeout",
        "shared_write_timeouts" => {
            "Shared cache tier writes past their bound (dropped; the tier is not skipped)"
        }
        "shared_skips" => "Reads that skipped the shared cache tier while it backed off",
        "shared_read_bytes" => "Data read from the shared cache tier",
        "shared_write_bytes" => "Blocks' bytes written to the shared cache tier",
        "shared_writeq_size" => "Data queued for the shared cache tier",
        "shared_bad" => "Shared cache tier blocks refused by a check, all reasons",
        "shared_bad_short" => "Shared cache tier blocks refused: truncated",
        "shared_bad_magic" => "Shared cache tier blocks refused: not a block",
        "shared_bad_version" => "Shared cache tier blocks refused: another format version",
        "shared_bad_identity" => {
            "Shared cache tier blocks refused: another object, version or record"
        }
        "shared_bad_crc" => "Shared cache tier blocks refused: CRC mismatch",
        "shared_bad_hmac" => "Shared cache tier blocks refused: HMAC missing or wrong",
        "shared_bad_length" => "Shared cache tier blocks refused: wrong length",
        _ => "A counter of the shared cache tier",
    }
}

/// One sentence on what an L2ARC kstat counts.
fn about_l2(name: &str) -> &'static str {
    match name {
        "l2_hits" => "Reads served from a cache device",
        "l2_misses" => "ARC misses that no cache device held",
        "l2_read_polled" => "Cache device reads completed by polling",
        "l2_read_poll_slept" => "Cache device reads that slept while polled",
        "l2_hdr_size" => "DRAM of the L2ARC index",
        "l2_devices" => "Cache devices attached",
        "l2_feed_wakeups" => "Times the L2ARC feeder woke",
        "l2_writeback_size" => "Data queued for cache devices",
        "l2_dwpd_limit" => "The write budget of cache devices per day",
        "l2_dwpd_credit" => "Write budget left now",
        "l2_sector_hits" => "Cache device hits served by reading only the sectors asked for",
        "l2_feeds" => "L2ARC feed passes that wrote",
        "l2_read_bytes" => "Data read from cache devices",
        "l2_write_bytes" => "Data written to cache devices",
        "l2_writes_sent" => "Writes sent to cache devices",
        "l2_writes_pipelined" => "Cache device writes sent while another was in flight",
        "l2_writes_error" => "Cache device writes that failed",
        "l2_evict_reading" => "Cache device blocks overwritten while a read of them was in flight",
        "l2_cksum_bad" => "Cache device reads whose checksum did not match",
        "l2_io_error" => "Cache device reads that failed",
        "l2_size" => "Data held on cache devices, uncompressed",
        "l2_asize" => "Space taken on cache devices",
        "l2_bufs" => "Records held on cache devices",
        "l2_rebuild_success" => "Index rebuilds from a device's log that succeeded",
        "l2_rebuild_bufs" => "Records restored by index rebuilds",
        "l2_rebuild_bufs_precached" => "Records found in the ARC already during rebuilds",
        "l2_rebuild_log_blks" => "Log blocks read by index rebuilds",
        "l2_rebuild_cksum_lb_errors" => "Log blocks with a bad checksum met by rebuilds",
        "l2_rebuild_io_errors" => "Read errors met by index rebuilds",
        "l2_rebuild_dh_errors" => "Device headers that rebuilds could not use",
        "l2_rebuild_unsupported" => "Rebuilds refused for an unsupported log format",
        "l2_rebuild_time_us" => "Time the last index rebuild took",
        "l2_stop_flush_records" => {
            "Records only the ARC held that clean stops wrote to cache devices"
        }
        "l2_stop_flush_bytes" => "Data only the ARC held that clean stops wrote to cache devices",
        "l2_stop_flush_left_records" => {
            "Eligible records clean stops left unwritten (stop budget, endurance budget or no device)"
        }
        "l2_stop_flush_left_bytes" => "Eligible data clean stops left unwritten",
        "l2_stop_flush_ms" => "Time clean stops spent writing the ARC to cache devices",
        _ => "An arcstats counter",
    }
}

fn dataset_index(
    datasets: &[(l2arc::DatasetId, String, l2arc::DatasetConfig)],
    id: l2arc::DatasetId,
) -> usize {
    datasets.iter().position(|(d, _, _)| *d == id).unwrap_or(0)
}

fn mode(m: l2arc::CacheMode) -> &'static str {
    match m {
        l2arc::CacheMode::All => "all",
        l2arc::CacheMode::None => "none",
    }
}

fn write_histogram(out: &mut String, metric: &str, labels: &str, h: &HistogramSnapshot) {
    let mut cumulative = 0u64;
    let mut bucket = 0usize;
    for octave in PROMETHEUS_OCTAVES {
        let bound_ns = 1u64 << octave;
        while bucket < BUCKETS && bucket_low_ns(bucket) < bound_ns {
            cumulative += h.counts[bucket];
            bucket += 1;
        }
        let _ = writeln!(
            out,
            "{metric}_bucket{{{labels},le=\"{}\"}} {cumulative}",
            bound_ns as f64 / 1e9
        );
    }
    let count = h.count();
    let _ = writeln!(out, "{metric}_bucket{{{labels},le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{metric}_sum{{{labels}}} {}", h.sum_ns as f64 / 1e9);
    let _ = writeln!(out, "{metric}_count{{{labels}}} {count}");
}

/// The live page's snapshot: counters, histograms (sparse), datasets, devices.
pub fn json_snapshot(cache: &Cache) -> Value {
    let stats = cache.stats();
    let kstats: serde_json::Map<String, Value> = stats
        .kstats()
        .into_iter()
        .map(|(n, v)| (n.to_string(), json!(v)))
        .collect();
    let time_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    json!({
        "time_ms": time_ms,
        "analytics_enabled": cache.analytics().enabled(),
        "kstats": kstats,
        "histograms": json_histograms(cache),
        "datasets": json_datasets(cache),
        "devices": json_devices(&stats),
        "top_objects": json_top_objects(cache),
    })
}

/// Each tier's histogram as its non-empty buckets, `[low_ns, count]`.
pub(crate) fn json_histograms(cache: &Cache) -> serde_json::Map<String, Value> {
    cache
        .analytics()
        .histograms()
        .into_iter()
        .map(|(tier, h)| {
            let sparse: Vec<[u64; 2]> = h
                .counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(b, c)| [bucket_low_ns(b), *c])
                .collect();
            (
                tier.to_string(),
                json!({ "count": h.count(), "sum_ns": h.sum_ns, "buckets": sparse }),
            )
        })
        .collect()
}

fn json_datasets(cache: &Cache) -> Vec<Value> {
    cache
        .dataset_list()
        .into_iter()
        .enumerate()
        .map(|(i, (_, name, config))| {
            let a = cache.analytics().dataset(i);
            json!({
                "name": name,
                "recordsize_bytes": config.recordsize_bytes,
                "primarycache": mode(config.primarycache),
                "secondarycache": mode(config.secondarycache),
                "compression": format!("{:?}", config.compression).to_lowercase(),
                "l2_hits": a.l2_hits,
                "l2_read_bytes": a.l2_read_bytes,
                "shared_hits": a.shared_hits,
                "shared_read_bytes": a.shared_read_bytes,
                "primary_reads": a.primary_reads,
                "primary_read_bytes": a.primary_read_bytes,
            })
        })
        .collect()
}

fn json_devices(stats: &l2arc::CacheStats) -> Vec<Value> {
    stats
        .l2
        .iter()
        .flat_map(|l2| &l2.devices)
        .map(|d| {
            let k: serde_json::Map<String, Value> = d
                .kstats
                .iter()
                .map(|(n, v)| (n.to_string(), json!(v)))
                .collect();
            json!({
                "slot": d.slot,
                "device": d.description,
                "state": d.state,
                "size_bytes": d.size_bytes,
                "kstats": k,
            })
        })
        .collect()
}

fn json_top_objects(cache: &Cache) -> Vec<Value> {
    let names: Vec<String> = cache
        .dataset_list()
        .into_iter()
        .map(|(_, name, _)| name)
        .collect();
    cache
        .analytics()
        .top_objects(TOP_OBJECTS_SHOWN)
        .into_iter()
        .map(|o| {
            json!({
                "dataset": names.get(o.dataset as usize).cloned().unwrap_or_default(),
                "object": o.object,
                "name": o.name,
                "reads": o.reads,
                "misses": o.misses,
                "l2_hits": o.l2_hits,
                "primary_reads": o.primary_reads,
                "bytes_below": o.bytes_below,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exporter's counters are the engine's counters (`l2arc::kstat_kind`,
    /// which keeps them monotonic across a device's removal), no more, no less.
    #[test]
    fn counters_and_gauges_are_the_engines() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(l2arc::CacheConfig::default()).unwrap();
        cache
            .add_cache_path(dir.path().join("d.img"), Some(64 << 20))
            .unwrap();
        let stats = cache.stats();
        let kstats = stats.kstats();
        assert!(kstats.iter().any(|(n, _)| *n == "l2_rebuild_time_us"));
        let device = &stats.l2.as_ref().unwrap().devices[0].kstats;
        for (name, _) in kstats.iter().chain(device.iter()) {
            let ours = matches!(
                kind_of(name),
                Kind::Counter | Kind::CounterBytes | Kind::CounterMicros | Kind::CounterMillis
            );
            let engine = l2arc::kstat_kind(name) == l2arc::KstatKind::Counter;
            assert_eq!(
                ours, engine,
                "{name}: exported as counter {ours}, engine says {engine}"
            );
        }
    }

    #[test]
    fn names_carry_units_and_counter_suffixes() {
        assert_eq!(
            prometheus_name("l2arc_arcstats_", "hits"),
            ("l2arc_arcstats_hits_total".into(), "counter")
        );
        assert_eq!(
            prometheus_name("l2arc_arcstats_", "l2_read_bytes"),
            ("l2arc_arcstats_l2_read_bytes_total".into(), "counter")
        );
        assert_eq!(
            prometheus_name("l2arc_arcstats_", "mru_ghost_size"),
            ("l2arc_arcstats_mru_ghost_size_bytes".into(), "gauge")
        );
        assert_eq!(
            prometheus_name("l2arc_arcstats_", "c"),
            ("l2arc_arcstats_c_bytes".into(), "gauge")
        );
        assert_eq!(
            prometheus_name("l2arc_device_", "l2_rebuild_time_us"),
            (
                "l2arc_device_l2_rebuild_time_seconds_total".into(),
                "counter"
            )
        );
        assert_eq!(exported_value("l2_rebuild_time_us", 1_500_000), "1.5");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_the_count() {
        let h = l2arc::latency::LatencyHistogram::default();
        h.record(100); // 64 ns < 100 <= 128 ns
        h.record(10_000_000);
        let mut out = String::new();
        write_histogram(&mut out, "m", "tier=\"x\"", &h.snapshot());
        assert!(
            out.contains("m_bucket{tier=\"x\",le=\"0.000000064\"} 0\n"),
            "{out}"
        );
        assert!(
            out.contains("m_bucket{tier=\"x\",le=\"0.000000128\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("m_bucket{tier=\"x\",le=\"0.016777216\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("m_bucket{tier=\"x\",le=\"+Inf\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("m_count{tier=\"x\"} 2\n"), "{out}");
    }
}
