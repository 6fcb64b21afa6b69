//! `l2arc iostat`: `zpool iostat -v -l` for a running mount or export.
//!
//! A ZFS administrator judges a cache device by `zpool iostat -v 1`: per
//! vdev the capacity (alloc, free), the operations and the bandwidth per
//! second, and with `-l` how long they wait. The same layout is printed
//! here for the two places this cache reads from below the ARC: primary
//! storage (the "pool") and each cache device under `cache`. The numbers
//! come from one `iostat` answer of the control socket per interval; as
//! zpool's, the first report averages over the whole life of the service
//! and each later one over its interval. Latency is per tier (the engine
//! times reads by the tier that served them, not by device): the `cache`
//! line carries the L2ARC's, the `primary` line primary storage's; the
//! per-device lines show `-`. `wait` is the mean, `p50`/`p99` the
//! histogram's percentiles over the report's span.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::Value;

use crate::stat::{Scale, pretty};
use l2arc_cli::control::{output_error, request, socket_path};

/// Shortest and longest interval, seconds.
const INTERVAL_SECS_MIN: f64 = 0.1;
const INTERVAL_SECS_MAX: f64 = 86_400.0;
/// Widths of the name column (at least) and of each number.
const NAME_WIDTH_MIN: usize = 12;
const NAME_WIDTH_MAX: usize = 40;
const NUMBER_WIDTH: usize = 5;

#[derive(Args, Debug)]
pub(crate) struct IostatArgs {
    /// The service's control socket (its --control PATH; default $L2ARC_SOCKET).
    #[arg(short = 'S', long)]
    pub socket: Option<PathBuf>,
    /// A line per cache device too (zpool's -v).
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Latency columns: mean wait, p50 and p99 of reads (zpool's -l).
    #[arg(short = 'l', long)]
    pub latency: bool,
    /// Parsable: exact numbers (bytes, nanoseconds), no scaling (zpool's -p).
    #[arg(short = 'p', long)]
    pub parsable: bool,
    /// Seconds between reports (none: one report, averaged since start).
    pub interval: Option<f64>,
    /// Reports to print (default: until interrupted when an interval is given).
    pub count: Option<u64>,
}

/// One sample of the service's `iostat` answer.
struct Sample {
    json: Value,
}

impl Sample {
    fn take(socket: &std::path::Path) -> Result<Self> {
        let text = request(socket, "iostat")?;
        let json = serde_json::from_str(text.trim()).with_context(|| {
            format!(
                "control socket {}: malformed iostat answer",
                socket.display()
            )
        })?;
        Ok(Self { json })
    }

    fn devices(&self) -> &[Value] {
        self.json["devices"].as_array().map_or(&[], Vec::as_slice)
    }
}

/// One line's numbers: operations and bytes per second, capacity, latency.
#[derive(Default)]
struct Row {
    name: String,
    alloc_bytes: Option<u64>,
    free_bytes: Option<u64>,
    reads: f64,
    writes: f64,
    read_bytes: f64,
    write_bytes: f64,
    /// Mean, p50, p99 of reads in ns (None: not timed for this line).
    latency_ns: Option<[f64; 3]>,
}

pub(crate) fn run(args: IostatArgs) -> Result<()> {
    let socket = socket_path(args.socket.clone())?;
    let interval = match args.interval {
        Some(secs) if !(INTERVAL_SECS_MIN..=INTERVAL_SECS_MAX).contains(&secs) => bail!(
            "interval must be from {INTERVAL_SECS_MIN} to {INTERVAL_SECS_MAX} seconds, not {secs}"
        ),
        Some(secs) => Some(Duration::from_secs_f64(secs)),
        None => None,
    };
    let count = match (interval, args.count) {
        (_, Some(0)) => bail!("count must be at least 1"),
        (None, _) => Some(1),
        (Some(_), n) => n,
    };
    let mut out = std::io::stdout().lock();
    let mut prev: Option<Sample> = None;
    let mut prev_at = Instant::now();
    let start = prev_at;
    let mut printed: u64 = 0;
    loop {
        let cur = Sample::take(&socket)?;
        let now = Instant::now();
        let rows = rows(
            &cur,
            prev.as_ref(),
            now.duration_since(prev_at),
            args.verbose,
        );
        let text = report(&rows, args.latency, args.parsable);
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(output_error)?;
        printed += 1;
        let Some(interval) = interval else {
            return Ok(());
        };
        if count.is_some_and(|n| printed >= n) {
            return Ok(());
        }
        prev = Some(cur);
        prev_at = now;
        let next = start + interval.mul_f64(printed as f64);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

/// The report's lines: primary, cache (the devices summed), each device
/// with -v; rates over `span` from `prev`, or since start without one.
fn rows(cur: &Sample, prev: Option<&Sample>, span: Duration, verbose: bool) -> Vec<Row> {
    let secs = match prev {
        Some(_) => span.as_secs_f64(),
        None => cur.json["uptime_secs"].as_f64().unwrap_or(1.0),
    }
    .max(1e-6);
    let delta = |now: &Value, before: Option<&Value>, key: &str| {
        let a = before.and_then(|b| b[key].as_u64()).unwrap_or(0);
        now[key].as_u64().unwrap_or(0).saturating_sub(a) as f64 / secs
    };
    let hist = |tier: &str| {
        latency(
            &cur.json["histograms"][tier],
            prev.map(|p| &p.json["histograms"][tier]),
        )
    };
    let primary = &cur.json["primary"];
    let before = prev.map(|p| &p.json["primary"]);
    let mut rows = vec![Row {
        name: "primary".into(),
        reads: delta(primary, before, "reads"),
        writes: delta(primary, before, "writes"),
        read_bytes: delta(primary, before, "read_bytes"),
        write_bytes: delta(primary, before, "write_bytes"),
        latency_ns: Some(hist("primary")),
        ..Row::default()
    }];
    let devices: Vec<Row> = cur
        .devices()
        .iter()
        .map(|d| {
            let before = prev.and_then(|p| p.devices().iter().find(|b| b["slot"] == d["slot"]));
            let size = d["size_bytes"].as_u64().unwrap_or(0);
            let alloc = d["alloc_bytes"].as_u64().unwrap_or(0);
            Row {
                name: format!("  {} {}", d["slot"], d["device"].as_str().unwrap_or("?")),
                alloc_bytes: Some(alloc),
                free_bytes: Some(size.saturating_sub(alloc)),
                reads: delta(d, before, "reads"),
                writes: delta(d, before, "writes"),
                read_bytes: delta(d, before, "read_bytes"),
                write_bytes: delta(d, before, "write_bytes"),
                latency_ns: None,
            }
        })
        .collect();
    if !devices.is_empty() {
        let sum = |f: &dyn Fn(&Row) -> f64| devices.iter().map(f).sum::<f64>();
        let sum_u64 = |f: &dyn Fn(&Row) -> Option<u64>| devices.iter().filter_map(f).sum::<u64>();
        rows.push(Row {
            name: "cache".into(),
            alloc_bytes: Some(sum_u64(&|r| r.alloc_bytes)),
            free_bytes: Some(sum_u64(&|r| r.free_bytes)),
            reads: sum(&|r| r.reads),
            writes: sum(&|r| r.writes),
            read_bytes: sum(&|r| r.read_bytes),
            write_bytes: sum(&|r| r.write_bytes),
            latency_ns: Some(hist("l2_hit")),
        });
        if verbose {
            rows.extend(devices);
        }
    }
    rows
}

/// Mean, p50 and p99 (ns) of a histogram's growth since `before`
/// (`{count, sum_ns, buckets: [[low_ns, count]...]}`); zeros when empty.
fn latency(now: &Value, before: Option<&Value>) -> [f64; 3] {
    let buckets = |h: Option<&Value>| -> HashMap<u64, u64> {
        h.and_then(|h| h["buckets"].as_array())
            .map(|b| {
                b.iter()
                    .filter_map(|p| Some((p[0].as_u64()?, p[1].as_u64()?)))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (old, new) = (buckets(before), buckets(Some(now)));
    let mut grown: Vec<(u64, u64)> = new
        .iter()
        .map(|(low, n)| (*low, n.saturating_sub(old.get(low).copied().unwrap_or(0))))
        .filter(|(_, n)| *n > 0)
        .collect();
    grown.sort_unstable();
    let count: u64 = grown.iter().map(|(_, n)| n).sum();
    if count == 0 {
        return [0.0; 3];
    }
    let sum_ns = now["sum_ns"].as_u64().unwrap_or(0)
        - before
            .and_then(|b| b["sum_ns"].as_u64())
            .unwrap_or(0)
            .min(now["sum_ns"].as_u64().unwrap_or(0));
    let quantile = |q: f64| {
        let rank = (q * count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        grown
            .iter()
            .find(|(_, n)| {
                seen += n;
                seen >= rank
            })
            .map_or(0.0, |(low, _)| *low as f64)
    };
    [sum_ns as f64 / count as f64, quantile(0.5), quantile(0.99)]
}

/// zpool's layout: two header lines, a rule, the rows, a rule.
fn report(rows: &[Row], latency: bool, parsable: bool) -> String {
    let name_width = rows
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(0)
        .clamp(NAME_WIDTH_MIN, NAME_WIDTH_MAX);
    let w = NUMBER_WIDTH;
    let pair = 2 * w + 2;
    let mut top = format!(
        "{:name_width$}  {:^pair$}  {:^pair$}  {:^pair$}",
        "", "capacity", "operations", "bandwidth"
    );
    let mut second = format!(
        "{:<name_width$}  {:>w$}  {:>w$}  {:>w$}  {:>w$}  {:>w$}  {:>w$}",
        "device", "alloc", "free", "read", "write", "read", "write"
    );
    let triple = 3 * w + 4;
    if latency {
        top.push_str(&format!("  {:^triple$}", "read latency"));
        second.push_str(&format!("  {:>w$}  {:>w$}  {:>w$}", "wait", "p50", "p99"));
    }
    let columns = 6 + if latency { 3 } else { 0 };
    let rule = format!(
        "{}{}\n",
        "-".repeat(name_width),
        format!("  {}", "-".repeat(w)).repeat(columns)
    );
    let mut out = format!("{}\n{second}\n{rule}", top.trim_end());
    for row in rows {
        out.push_str(&format_row(row, name_width, latency, parsable));
        out.push('\n');
    }
    out.push_str(&rule);
    out
}

fn format_row(row: &Row, name_width: usize, latency: bool, parsable: bool) -> String {
    let w = NUMBER_WIDTH;
    let bytes = |v: Option<f64>| match v {
        None => format!("{:>w$}", "-"),
        Some(v) if parsable => format!("{:>w$}", v.round() as u64),
        Some(v) => pretty(w, Scale::Bytes, v.round()),
    };
    let count = |v: f64| {
        if parsable {
            format!("{:>w$}", v.round() as u64)
        } else {
            pretty(w, Scale::Count, v.round())
        }
    };
    let name: String = if row.name.len() > name_width {
        format!("…{}", &row.name[row.name.len() - name_width + 1..])
    } else {
        row.name.clone()
    };
    let mut line = format!(
        "{name:<name_width$}  {}  {}  {}  {}  {}  {}",
        bytes(row.alloc_bytes.map(|v| v as f64)),
        bytes(row.free_bytes.map(|v| v as f64)),
        count(row.reads),
        count(row.writes),
        bytes(Some(row.read_bytes)),
        bytes(Some(row.write_bytes)),
    );
    if latency {
        for i in 0..3 {
            let cell = match row.latency_ns {
                None => "-".to_string(),
                Some(l) if parsable => format!("{}", l[i].round() as u64),
                Some(l) => nice_time(l[i]),
            };
            line.push_str(&format!("  {cell:>w$}"));
        }
    }
    line
}

/// zpool's time: the largest unit that keeps a whole number (`512us`, `8ms`).
fn nice_time(ns: f64) -> String {
    if ns <= 0.0 {
        return "0".into();
    }
    let (value, unit) = if ns < 1e3 {
        (ns, "ns")
    } else if ns < 1e6 {
        (ns / 1e3, "us")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    format!("{}{unit}", value.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn latency_is_the_histograms_growth() {
        let before = json!({"count": 1, "sum_ns": 1000, "buckets": [[1000, 1]]});
        let now = json!({"count": 101, "sum_ns": 1000 + 99 * 2000 + 9000,
            "buckets": [[1000, 1], [2000, 99], [8000, 1]]});
        let [mean, p50, p99] = latency(&now, Some(&before));
        assert_eq!(p50, 2000.0);
        assert_eq!(p99, 2000.0);
        assert!((mean - 2070.0).abs() < 1e-9, "{mean}");
        assert_eq!(latency(&now, Some(&now)), [0.0; 3]);
        assert_eq!(nice_time(8_400_000.0), "8ms");
        assert_eq!(nice_time(512_000.0), "512us");
    }

    #[test]
    fn the_report_has_zpools_layout() {
        let sample = Sample {
            json: json!({
                "uptime_secs": 2.0,
                "primary": {"reads": 20, "read_bytes": 2048, "writes": 0, "write_bytes": 0},
                "devices": [{"slot": 0, "device": "l2.img", "state": "online",
                    "size_bytes": 1 << 20, "alloc_bytes": 1 << 19,
                    "reads": 4, "read_bytes": 4096, "writes": 2, "write_bytes": 8192}],
                "histograms": {},
            }),
        };
        let rows = rows(&sample, None, Duration::ZERO, true);
        let text = report(&rows, true, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 7, "{text}");
        assert!(lines[0].contains("capacity") && lines[0].contains("read latency"));
        let words: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            words,
            [
                "device", "alloc", "free", "read", "write", "read", "write", "wait", "p50", "p99"
            ]
        );
        let primary: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(primary[..5], ["primary", "-", "-", "10", "0"], "{text}");
        let cache: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(cache[..3], ["cache", "512K", "512K"], "{text}");
        assert!(lines[5].starts_with("  0 l2.img"), "{text}");
    }
}
