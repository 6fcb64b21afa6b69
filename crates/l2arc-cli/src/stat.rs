//! `l2arc stat`: arcstat for a running mount or export.
//!
//! ZFS users watch a cache with `arcstat 1` (`zarcstat` in OpenZFS 2.3):
//! one line per second of rates and sizes under short column names
//! (`read`, `hit%`, `miss%`, `arcsz`, `c`, `l2read`, `l2hit%`, `l2size`,
//! ...). `l2arc ctl stats` only gives the raw counters, so an operator had
//! to diff them by hand. This prints arcstat's columns, with its names,
//! widths and units (rates per second, sizes scaled by 1024 with K/M/G
//! suffixes, percentages), from the deltas of the counters that the
//! service's control socket returns, and takes zarcstat's options: `-f`,
//! `-a`, `-v`, `-x` (extended), `-z` (zfetch), `-p` (parsable), `-s SEP`,
//! `-o FILE`. The socket is `-S`/`--socket` or `L2ARC_SOCKET`, since `-s`
//! is arcstat's separator. The columns arcstat has and we have no counter
//! for (metadata, memory pressure) are left out rather than printed as
//! zeros; a few of our own are added (`dkread`, `dkbytes`: reads of the
//! primary storage, the "disk"). Rates divide by the measured time between
//! two samples, not the nominal interval, so that a slow control answer
//! does not skew them. L2ARC columns asked for by `-f` without a cache
//! device are refused with arcstat's words ("No L2ARC Here").
//!
//! Output: the table (header repeated every `HEADER_EVERY_LINES` lines, as
//! arcstat does on a pipe), `--csv` (header once, raw numbers), or
//! `--json` (one object per line, raw numbers, with the interval's
//! length). A reader that goes away (`| head -2`) ends it quietly with
//! exit 0, as any Unix filter.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

use l2arc_cli::control::{open_output, output_error, request, socket_path};

/// arcstat repeats its header every 20 lines when not on a terminal.
const HEADER_EVERY_LINES: usize = 20;
/// Shortest and longest interval, seconds.
const INTERVAL_SECS_MIN: f64 = 0.1;
const INTERVAL_SECS_MAX: f64 = 86_400.0;

#[derive(Args, Debug)]
pub(crate) struct StatArgs {
    /// The service's control socket (its --control PATH; default $L2ARC_SOCKET).
    #[arg(short = 'S', long)]
    pub socket: Option<PathBuf>,
    /// Seconds between lines (default 1).
    pub interval: Option<f64>,
    /// Lines to print (default: until interrupted; 1 when no interval is given).
    pub count: Option<u64>,
    /// Fields to print, comma-separated (see -v).
    #[arg(short = 'f', long, value_delimiter = ',', conflicts_with_all = ["extended", "zfetch"])]
    pub fields: Vec<String>,
    /// Every field.
    #[arg(short = 'a', long)]
    pub all: bool,
    /// List the fields and what they mean, then exit.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Extended fields: the ARC lists' hits and the L2ARC eligibility of evictions.
    #[arg(short = 'x', long, conflicts_with = "zfetch")]
    pub extended: bool,
    /// zfetch (read-ahead) fields.
    #[arg(short = 'z', long)]
    pub zfetch: bool,
    /// Parsable: raw numbers, no padding or K/M/G scaling.
    #[arg(short = 'p', long)]
    pub parsable: bool,
    /// Field separator (default two spaces).
    #[arg(short = 's', long)]
    pub separator: Option<String>,
    /// Write to FILE instead of standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub outfile: Option<PathBuf>,
    /// CSV: comma-separated raw numbers, the header once.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// How lines are laid out.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Format {
    /// arcstat's: scaled and padded (`pretty`), or raw (`-p`), joined by `sep`.
    Table { pretty: bool, sep: String },
    /// Raw, comma-separated, header once.
    Csv,
    /// One object per line.
    Json,
}

/// How a column's value is scaled in the table (arcstat's "scale").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Scale {
    Time,
    /// Counts: K, M, G in powers of 1000.
    Count,
    /// Bytes: K, M, G in powers of 1024.
    Bytes,
    Percent,
}

/// A column: name, table width, scale, meaning.
struct Column {
    name: &'static str,
    width: usize,
    scale: Scale,
    about: &'static str,
    /// Needs cache devices (left out of the defaults and -a without them).
    l2: bool,
}

const fn col(name: &'static str, width: usize, scale: Scale, about: &'static str) -> Column {
    Column {
        name,
        width,
        scale,
        about,
        l2: false,
    }
}

const fn l2col(name: &'static str, width: usize, scale: Scale, about: &'static str) -> Column {
    Column {
        name,
        width,
        scale,
        about,
        l2: true,
    }
}

use Scale::{Bytes, Count, Percent, Time};

/// arcstat's columns that we have counters for (same names, widths and
/// units), then ours.
const COLUMNS: &[Column] = &[
    col("time", 8, Time, "Time"),
    col("hits", 4, Count, "ARC hits per second"),
    col(
        "iohs",
        4,
        Count,
        "ARC I/O hits per second (reads that joined a miss in flight)",
    ),
    col("miss", 4, Count, "ARC misses per second"),
    col("read", 4, Count, "Total ARC accesses per second"),
    col("hit%", 4, Percent, "ARC hit percentage"),
    col("ioh%", 4, Percent, "ARC I/O hit percentage"),
    col("miss%", 5, Percent, "ARC miss percentage"),
    col("dhit", 4, Count, "Demand hits per second"),
    col("dmis", 4, Count, "Demand misses per second"),
    col("dh%", 3, Percent, "Demand hit percentage"),
    col("dm%", 3, Percent, "Demand miss percentage"),
    col("ddhit", 5, Count, "Demand data hits per second"),
    col("ddmis", 5, Count, "Demand data misses per second"),
    col("ddread", 6, Count, "Demand data accesses per second"),
    col("ddh%", 4, Percent, "Demand data hit percentage"),
    col("ddm%", 4, Percent, "Demand data miss percentage"),
    col("phit", 4, Count, "Prefetch hits per second"),
    col("pmis", 4, Count, "Prefetch misses per second"),
    col("ph%", 3, Percent, "Prefetch hits percentage"),
    col("pm%", 3, Percent, "Prefetch miss percentage"),
    col("dread", 5, Count, "Demand accesses per second"),
    col("pread", 5, Count, "Prefetch accesses per second"),
    col("arcsz", 5, Bytes, "ARC size"),
    col("size", 5, Bytes, "ARC size"),
    col("c", 5, Bytes, "ARC target size"),
    col("avail", 5, Bytes, "ARC available memory"),
    col("grow", 4, Count, "ARC grow disabled"),
    col("mfu", 4, Count, "MFU list hits per second"),
    col("mru", 4, Count, "MRU list hits per second"),
    col("mfug", 4, Count, "MFU ghost list hits per second"),
    col("mrug", 4, Count, "MRU ghost list hits per second"),
    col("mfusz", 5, Bytes, "MFU size"),
    col("mrusz", 5, Bytes, "MRU size"),
    col("mfugsz", 6, Bytes, "MFU ghost size"),
    col("mrugsz", 6, Bytes, "MRU ghost size"),
    col(
        "el2skip",
        7,
        Bytes,
        "Size of L2 eligible evictions skipped (feed queue full) per second",
    ),
    col(
        "el2cach",
        7,
        Bytes,
        "Size of L2 cached evictions per second",
    ),
    col(
        "el2el",
        5,
        Bytes,
        "Size of L2 eligible evictions per second",
    ),
    col(
        "el2mfu",
        6,
        Bytes,
        "Size of L2 eligible MFU evictions per second",
    ),
    col(
        "el2mru",
        6,
        Bytes,
        "Size of L2 eligible MRU evictions per second",
    ),
    col(
        "el2inel",
        7,
        Bytes,
        "Size of L2 ineligible evictions per second",
    ),
    col("zhits", 5, Count, "zfetch stream hits per second"),
    col("zissued", 7, Count, "zfetch prefetches issued per second"),
    l2col("l2hits", 6, Count, "L2ARC hits per second"),
    l2col("l2miss", 6, Count, "L2ARC misses per second"),
    l2col("l2read", 6, Count, "Total L2ARC accesses per second"),
    l2col("l2hit%", 6, Percent, "L2ARC access hit percentage"),
    l2col("l2miss%", 7, Percent, "L2ARC access miss percentage"),
    l2col("l2asize", 7, Bytes, "Actual (compressed) size of the L2ARC"),
    l2col("l2size", 6, Bytes, "Size of the L2ARC"),
    l2col("l2bytes", 7, Bytes, "Bytes read per second from the L2ARC"),
    l2col(
        "l2wbytes",
        8,
        Bytes,
        "Bytes written per second to the L2ARC",
    ),
    l2col(
        "l2hsz",
        5,
        Bytes,
        "L2 header size (DRAM of the L2ARC index)",
    ),
    // Ours.
    col("p", 5, Bytes, "ARC MRU target size (p) [l2arc]"),
    col("ops", 5, Count, "Front-end reads per second [l2arc]"),
    col(
        "rbytes",
        6,
        Bytes,
        "Front-end bytes read per second [l2arc]",
    ),
    col(
        "dkread",
        6,
        Count,
        "Primary storage (disk) reads per second [l2arc]",
    ),
    col(
        "dkbytes",
        7,
        Bytes,
        "Primary storage bytes read per second [l2arc]",
    ),
    col(
        "pwrm",
        5,
        Bytes,
        "Bytes per second the prewarm reads from flash into the ARC [l2arc]",
    ),
    col(
        "pwq",
        5,
        Count,
        "Saved records the prewarm has still to consider [l2arc]",
    ),
    col(
        "shit",
        5,
        Count,
        "Shared cache tier hits per second [l2arc]",
    ),
    col(
        "smis",
        5,
        Count,
        "Shared cache tier misses per second (bad blocks included) [l2arc]",
    ),
    col(
        "sbad",
        5,
        Count,
        "Shared cache tier blocks refused by a check per second [l2arc]",
    ),
    col(
        "sbytes",
        6,
        Bytes,
        "Bytes per second read from the shared cache tier [l2arc]",
    ),
    col(
        "swr",
        5,
        Count,
        "Shared cache tier writes per second [l2arc]",
    ),
    col(
        "sdrop",
        5,
        Count,
        "Records per second not written to the shared cache tier (queue full, backing off) [l2arc]",
    ),
];

/// arcstat's classic default line, with the L2ARC's columns when there are cache devices.
const DEFAULT_FIELDS: &[&str] = &[
    "time", "read", "miss", "miss%", "dmis", "dm%", "pmis", "pm%", "arcsz", "c", "l2read",
    "l2hit%", "l2size",
];

/// `-x`: zarcstat's extended line, of the columns we have, and the
/// L2ARC eligibility of what the ARC evicts.
const EXTENDED_FIELDS: &[&str] = &[
    "time", "mfu", "mru", "mfug", "mrug", "el2skip", "el2cach", "el2el", "el2inel", "dread",
    "pread", "read",
];

/// `-z`: zarcstat's zfetch line, of the columns we have.
const ZFETCH_FIELDS: &[&str] = &["time", "zhits", "zissued", "pread", "phit", "pmis"];

type Counters = HashMap<String, u64>;

fn column(name: &str) -> Option<&'static Column> {
    COLUMNS.iter().find(|c| c.name == name)
}

fn parse_counters(text: &str) -> Result<Counters> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (name, value) = line
                .split_once(' ')
                .with_context(|| format!("malformed stats line `{line}`"))?;
            let value = value
                .trim()
                .parse()
                .with_context(|| format!("malformed stats line `{line}`"))?;
            Ok((name.to_string(), value))
        })
        .collect()
}

/// The value of `column` over an interval of `secs` from `prev` to `cur`.
fn value(column: &str, prev: &Counters, cur: &Counters, secs: f64) -> f64 {
    let now = |n: &str| cur.get(n).copied().unwrap_or(0) as f64;
    let rate = |n: &str| {
        let (a, b) = (
            prev.get(n).copied().unwrap_or(0),
            cur.get(n).copied().unwrap_or(0),
        );
        b.saturating_sub(a) as f64 / secs
    };
    let pct = |part: f64, whole: f64| {
        if whole > 0.0 {
            100.0 * part / whole
        } else {
            0.0
        }
    };
    let read = rate("hits") + rate("iohits") + rate("misses");
    let dread = rate("demand_data_hits") + rate("demand_data_misses");
    let pread = rate("prefetch_data_hits") + rate("prefetch_data_misses");
    let l2read = rate("l2_hits") + rate("l2_misses");
    match column {
        "hits" => rate("hits"),
        "iohs" => rate("iohits"),
        "miss" => rate("misses"),
        "read" => read,
        "hit%" => pct(rate("hits"), read),
        "ioh%" => pct(rate("iohits"), read),
        "miss%" if read > 0.0 => 100.0 - pct(rate("hits"), read) - pct(rate("iohits"), read),
        "miss%" => 0.0,
        "dhit" | "ddhit" => rate("demand_data_hits"),
        "dmis" | "ddmis" => rate("demand_data_misses"),
        "dread" | "ddread" => dread,
        "dh%" | "ddh%" => pct(rate("demand_data_hits"), dread),
        "dm%" | "ddm%" => pct(rate("demand_data_misses"), dread),
        "phit" => rate("prefetch_data_hits"),
        "pmis" => rate("prefetch_data_misses"),
        "pread" => pread,
        "ph%" => pct(rate("prefetch_data_hits"), pread),
        "pm%" => pct(rate("prefetch_data_misses"), pread),
        "arcsz" | "size" => now("size"),
        "c" => now("c"),
        "avail" => now("memory_available_bytes"),
        "grow" => now("arc_no_grow"),
        "p" => now("p"),
        "mfu" => rate("mfu_hits"),
        "mru" => rate("mru_hits"),
        "mfug" => rate("mfu_ghost_hits"),
        "mrug" => rate("mru_ghost_hits"),
        "mfusz" => now("mfu_size"),
        "mrusz" => now("mru_size"),
        "mfugsz" => now("mfu_ghost_size"),
        "mrugsz" => now("mru_ghost_size"),
        "l2hits" => rate("l2_hits"),
        "l2miss" => rate("l2_misses"),
        "l2read" => l2read,
        "l2hit%" => pct(rate("l2_hits"), l2read),
        "l2miss%" if l2read > 0.0 => 100.0 - pct(rate("l2_hits"), l2read),
        "l2miss%" => 0.0,
        "l2asize" => now("l2_asize"),
        "l2size" => now("l2_size"),
        "l2bytes" => rate("l2_read_bytes"),
        "l2wbytes" => rate("l2_write_bytes"),
        "l2hsz" => now("l2_hdr_size"),
        "ops" => rate("reads"),
        "rbytes" => rate("read_bytes"),
        "dkread" => rate("primary_reads"),
        "dkbytes" => rate("primary_read_bytes"),
        "pwrm" => rate("arc_prewarm_bytes"),
        "pwq" => now("arc_prewarm_queued_records"),
        other => rate(counter_of(other)),
    }
}

/// The counter behind a rate column of zarcstat's `-x` and `-z` lines
/// (`el2*`: the L2ARC eligibility of evictions, `z*`: zfetch).
fn counter_of(column: &str) -> &'static str {
    match column {
        "el2skip" => "evict_l2_skip",
        "el2cach" => "evict_l2_cached",
        "el2el" => "evict_l2_eligible",
        "el2mfu" => "evict_l2_eligible_mfu",
        "el2mru" => "evict_l2_eligible_mru",
        "el2inel" => "evict_l2_ineligible",
        "zhits" => "zfetch_hits",
        "zissued" => "zfetch_io_issued",
        "shit" => "shared_hits",
        "smis" => "shared_misses",
        "sbad" => "shared_bad",
        "sbytes" => "shared_read_bytes",
        "swr" => "shared_writes",
        "sdrop" => "shared_write_drops",
        other => unreachable!("column {other} checked at start"),
    }
}

/// arcstat's `prettynum`: scaled to fit `width`, with a K/M/G suffix.
pub(crate) fn pretty(width: usize, scale: Scale, mut num: f64) -> String {
    const SUFFIX: [&str; 8] = ["", "K", "M", "G", "T", "P", "E", "Z"];
    let mut index = 0;
    let base = match scale {
        Scale::Count => 1000.0,
        Scale::Bytes => 1024.0,
        _ => 0.0,
    };
    if base > 0.0 {
        while num.abs() > base && index < 5 {
            num /= base;
            index += 1;
        }
    }
    let width = width - usize::from(index > 0);
    let int_len = format!("{num:.0}").len();
    let decimals = if num.fract() == 0.0 || width < int_len + 2 {
        0
    } else {
        1
    };
    format!("{num:>width$.decimals$}{}", SUFFIX[index])
}

fn local_time() -> String {
    // SAFETY: time(NULL) and localtime_r only write the struct we pass.
    let tm = unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        tm
    };
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

fn usage_of_fields() -> String {
    let mut out = String::from("Field definitions are as follows:\n");
    for c in COLUMNS {
        out.push_str(&format!("{:>11} : {}\n", c.name, c.about));
    }
    out
}

pub(crate) fn run(args: StatArgs) -> Result<()> {
    let mut out = open_output(args.outfile.as_deref())?;
    if args.verbose {
        return write!(out, "{}", usage_of_fields())
            .and_then(|()| out.flush())
            .map_err(output_error);
    }
    let socket = socket_path(args.socket.clone())?;
    let (interval_secs, count) = interval_and_count(&args)?;
    if let Some(bad) = args.fields.iter().find(|f| column(f).is_none()) {
        bail!("unknown field `{bad}` in -f: `l2arc stat -v` lists the fields");
    }
    let mut prev = parse_counters(&request(&socket, "stats")?)?;
    let has_l2 = prev.get("l2_devices").is_some_and(|&n| n > 0);
    let fields = chosen_fields(&args, has_l2)?;
    let format = format_of(&args);
    write_header(&mut out, &format, &fields).map_err(output_error)?;
    out.flush().map_err(output_error)?;
    let interval = Duration::from_secs_f64(interval_secs);
    let start = Instant::now();
    let mut prev_at = start;
    let mut printed: u64 = 0;
    loop {
        let next = start + interval.mul_f64((printed + 1) as f64);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let cur = parse_counters(&request(&socket, "stats")?)?;
        let now = Instant::now();
        let secs = now.duration_since(prev_at).as_secs_f64().max(1e-6);
        let line = format_line(&format, &fields, &prev, &cur, secs);
        printed += 1;
        writeln!(out, "{line}").map_err(output_error)?;
        if matches!(format, Format::Table { .. })
            && printed.is_multiple_of(HEADER_EVERY_LINES as u64)
            && count.is_none_or(|n| printed < n)
        {
            write_header(&mut out, &format, &fields).map_err(output_error)?;
        }
        out.flush().map_err(output_error)?;
        if count.is_some_and(|n| printed >= n) {
            return Ok(());
        }
        prev = cur;
        prev_at = now;
    }
}

fn format_of(args: &StatArgs) -> Format {
    if args.json {
        Format::Json
    } else if args.csv {
        Format::Csv
    } else {
        Format::Table {
            pretty: !args.parsable,
            sep: args.separator.clone().unwrap_or_else(|| "  ".into()),
        }
    }
}

/// The interval (arcstat's default 1 s) and how many lines: one without an
/// interval, endless with an interval and no count.
fn interval_and_count(args: &StatArgs) -> Result<(f64, Option<u64>)> {
    let interval_secs = args.interval.unwrap_or(1.0);
    if !(INTERVAL_SECS_MIN..=INTERVAL_SECS_MAX).contains(&interval_secs) {
        bail!(
            "interval must be from {INTERVAL_SECS_MIN} to {INTERVAL_SECS_MAX} seconds, not {interval_secs}"
        );
    }
    let count = match (args.interval, args.count) {
        (_, Some(0)) => bail!("count must be at least 1"),
        (_, Some(n)) => Some(n),
        (Some(_), None) => None,
        (None, None) => Some(1),
    };
    Ok((interval_secs, count))
}

/// `-f` fields, else all (`-a`), `-x`'s, `-z`'s or the default ones;
/// L2ARC columns only when the service has a cache device (asked for by
/// name without one: refused in arcstat's words).
fn chosen_fields(args: &StatArgs, has_l2: bool) -> Result<Vec<&'static Column>> {
    let named = |names: &[&str]| -> Vec<&'static Column> {
        names
            .iter()
            .filter_map(|f| column(f))
            .filter(|c| has_l2 || !c.l2)
            .collect()
    };
    if !args.fields.is_empty() {
        let fields: Vec<&'static Column> = args.fields.iter().filter_map(|f| column(f)).collect();
        let incompatible: Vec<&str> = fields
            .iter()
            .filter(|c| c.l2 && !has_l2)
            .map(|c| c.name)
            .collect();
        if !incompatible.is_empty() {
            bail!(
                "No L2ARC Here: incompatible field specified: {} (the service has no cache device; `l2arc ctl add-cache` adds one)",
                incompatible.join(",")
            );
        }
        return Ok(fields);
    }
    Ok(if args.all {
        COLUMNS.iter().filter(|c| has_l2 || !c.l2).collect()
    } else if args.extended {
        named(EXTENDED_FIELDS)
    } else if args.zfetch {
        named(ZFETCH_FIELDS)
    } else {
        named(DEFAULT_FIELDS)
    })
}

/// The column names (a table's or CSV's; JSON has none).
fn write_header(out: &mut dyn Write, format: &Format, fields: &[&Column]) -> std::io::Result<()> {
    match format {
        Format::Table { pretty, sep } => {
            let names: Vec<String> = fields
                .iter()
                .map(|c| {
                    if *pretty {
                        format!("{:>w$}", c.name, w = c.width)
                    } else {
                        c.name.to_string()
                    }
                })
                .collect();
            writeln!(out, "{}", names.join(sep))
        }
        Format::Csv => {
            let names: Vec<&str> = fields.iter().map(|c| c.name).collect();
            writeln!(out, "{}", names.join(","))
        }
        Format::Json => Ok(()),
    }
}

/// One interval's line: rates from the counter deltas over `secs`.
fn format_line(
    format: &Format,
    fields: &[&Column],
    prev: &Counters,
    cur: &Counters,
    secs: f64,
) -> String {
    let time = local_time();
    let raw = |c: &Column| match c.scale {
        Scale::Time => time.clone(),
        _ => format_raw(value(c.name, prev, cur, secs)),
    };
    match format {
        Format::Table { pretty: true, sep } => fields
            .iter()
            .map(|c| match c.scale {
                Scale::Time => format!("{:>w$}", time, w = c.width),
                s => pretty(c.width, s, value(c.name, prev, cur, secs)),
            })
            .collect::<Vec<_>>()
            .join(sep),
        Format::Table { pretty: false, sep } => {
            fields.iter().map(|c| raw(c)).collect::<Vec<_>>().join(sep)
        }
        Format::Csv => fields.iter().map(|c| raw(c)).collect::<Vec<_>>().join(","),
        Format::Json => {
            let mut object = serde_json::Map::new();
            object.insert("interval_secs".into(), serde_json::json!(secs));
            for c in fields {
                let v = match c.scale {
                    Scale::Time => serde_json::json!(time),
                    _ => serde_json::json!(value(c.name, prev, cur, secs)),
                };
                object.insert(c.name.into(), v);
            }
            serde_json::Value::Object(object).to_string()
        }
    }
}

/// A raw number for CSV: integers as such, others with 3 decimals.
fn format_raw(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(pairs: &[(&str, u64)]) -> Counters {
        pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect()
    }

    #[test]
    fn rates_and_percentages_come_from_deltas() {
        let prev = counters(&[("hits", 100), ("misses", 50), ("l2_hits", 5)]);
        let cur = counters(&[
            ("hits", 400),
            ("misses", 150),
            ("iohits", 0),
            ("size", 3 << 20),
            ("l2_hits", 25),
            ("l2_misses", 80),
        ]);
        assert_eq!(value("read", &prev, &cur, 2.0), 200.0);
        assert_eq!(value("hits", &prev, &cur, 2.0), 150.0);
        assert_eq!(value("hit%", &prev, &cur, 2.0), 75.0);
        assert_eq!(value("miss%", &prev, &cur, 2.0), 25.0);
        assert_eq!(value("arcsz", &prev, &cur, 2.0), (3 << 20) as f64);
        assert_eq!(value("l2read", &prev, &cur, 1.0), 100.0);
        assert_eq!(value("l2hit%", &prev, &cur, 1.0), 20.0);
        // Nothing happened: 0, not NaN.
        assert_eq!(value("hit%", &cur, &cur, 1.0), 0.0);
        assert_eq!(value("miss%", &cur, &cur, 1.0), 0.0);
    }

    #[test]
    fn pretty_numbers_scale_like_arcstat() {
        assert_eq!(pretty(4, Scale::Count, 0.0), "   0");
        assert_eq!(pretty(4, Scale::Count, 137_000.0), "137K");
        assert_eq!(pretty(5, Scale::Bytes, (11u64 << 30) as f64), "  11G");
        assert_eq!(pretty(5, Scale::Bytes, 1536.0), " 1.5K");
        assert_eq!(pretty(4, Scale::Percent, 75.0), "  75");
        assert_eq!(pretty(4, Scale::Percent, 33.3), "33.3");
    }

    #[test]
    fn every_column_has_a_value_and_default_fields_exist() {
        let c = counters(&[]);
        for column in COLUMNS.iter().filter(|c| c.scale != Scale::Time) {
            assert!(
                value(column.name, &c, &c, 1.0).is_finite(),
                "{}",
                column.name
            );
        }
        for f in DEFAULT_FIELDS
            .iter()
            .chain(EXTENDED_FIELDS)
            .chain(ZFETCH_FIELDS)
        {
            assert!(column(f).is_some(), "{f}");
        }
        let names: std::collections::HashSet<_> = COLUMNS.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), COLUMNS.len(), "duplicate column");
    }
}
