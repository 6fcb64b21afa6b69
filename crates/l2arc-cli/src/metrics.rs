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
//! The histograms' Prometheus buckets are the engine's octave boundaries
//! (64 ns to 64 s, each bucket twice the last): exact sums of the engine's
//! finer buckets, few enough to scrape every second.

use std::fmt::Write;

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
    /// A gauge in microseconds, exported in seconds.
    GaugeMicros,
}

fn kind_of(name: &str) -> Kind {
    match name {
        "size" | "c" | "c_max" | "p" | "l2_size" | "l2_asize" | "l2_hdr_size"
        | "l2_dwpd_credit" | "l2_dwpd_limit" => Kind::GaugeBytes,
        n if n.ends_with("_size") => Kind::GaugeBytes,
        "entries" | "l2_bufs" | "l2_devices" | "l2_rebuild_success" => Kind::Gauge,
        "l2_rebuild_time_us" => Kind::GaugeMicros,
        n if n.ends_with("_bytes") => Kind::CounterBytes,
        _ => Kind::Counter,
    }
}

/// The Prometheus name and type of a kstat.
fn prometheus_name(prefix: &str, name: &str) -> (String, &'static str) {
    match kind_of(name) {
        Kind::Counter => (format!("{prefix}{name}_total"), "counter"),
        Kind::CounterBytes => (format!("{prefix}{name}_total"), "counter"),
        Kind::GaugeBytes => (format!("{prefix}{name}_bytes"), "gauge"),
        Kind::Gauge => (format!("{prefix}{name}"), "gauge"),
        Kind::GaugeMicros => (
            format!("{prefix}{}_seconds", name.trim_end_matches("_us")),
            "gauge",
        ),
    }
}

fn exported_value(name: &str, value: u64) -> String {
    match kind_of(name) {
        Kind::GaugeMicros => format!("{}", value as f64 / 1e6),
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

/// The whole `/metrics` page.
pub fn prometheus(cache: &Cache) -> String {
    let stats = cache.stats();
    let mut out = String::with_capacity(16 << 10);
    for (name, value) in stats.kstats() {
        let (metric, kind) = prometheus_name("l2arc_arcstats_", name);
        write_family_head(&mut out, &metric, kind, &format!("arcstats `{name}`."));
        let _ = writeln!(out, "{metric} {}", exported_value(name, value));
    }
    write_latency(&mut out, cache);
    write_datasets(&mut out, cache);
    if let Some(l2) = &stats.l2 {
        write_devices(&mut out, &l2.devices);
    }
    out
}

fn write_family_head(out: &mut String, metric: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {metric} {help}");
    let _ = writeln!(out, "# TYPE {metric} {kind}");
}

/// Latency by the tier that served a read.
fn write_latency(out: &mut String, cache: &Cache) {
    let metric = "l2arc_read_latency_seconds";
    let help = format!(
        "Read latency by the tier that served it (arc_hit sampled 1 in {}, weighted), and front-end requests.",
        l2arc::analytics::ARC_HIT_SAMPLE_PERIOD
    );
    write_family_head(out, metric, "histogram", &help);
    for (tier, h) in cache.analytics().histograms() {
        write_histogram(out, metric, &format!("tier=\"{tier}\""), &h);
    }
}

/// Properties and counters per dataset.
fn write_datasets(out: &mut String, cache: &Cache) {
    let datasets = cache.dataset_list();
    let families: [(&str, &str, &str); 5] = [
        (
            "l2arc_dataset_info",
            "gauge",
            "Dataset properties (value 1).",
        ),
        (
            "l2arc_dataset_recordsize_bytes",
            "gauge",
            "Dataset recordsize.",
        ),
        (
            "l2arc_dataset_l2_hits_total",
            "counter",
            "L2ARC hits of the dataset.",
        ),
        (
            "l2arc_dataset_primary_reads_total",
            "counter",
            "Primary storage reads of the dataset.",
        ),
        (
            "l2arc_dataset_primary_read_bytes_total",
            "counter",
            "Bytes read from primary storage for the dataset.",
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
                "l2arc_dataset_l2_hits_total" => format!("{family}{{{label}}} {}", a.l2_hits),
                "l2arc_dataset_primary_reads_total" => {
                    format!("{family}{{{label}}} {}", a.primary_reads)
                }
                _ => format!("{family}{{{label}}} {}", a.primary_read_bytes),
            };
            let _ = writeln!(out, "{line}");
        }
    }
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
        "Cache device state (value 1).",
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
        "Data area of the cache device.",
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
        write_family_head(
            out,
            &metric,
            kind,
            &format!("arcstats `{name}` of one cache device."),
        );
        for d in devices {
            let _ = writeln!(
                out,
                "{metric}{{{}}} {}",
                label(d),
                exported_value(name, d.kstats[i].1)
            );
        }
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
fn json_histograms(cache: &Cache) -> serde_json::Map<String, Value> {
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
            ("l2arc_device_l2_rebuild_time_seconds".into(), "gauge")
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
