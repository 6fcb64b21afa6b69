/*!
 * Trace loading.
 *
 * A replay is only as good as the trace it is fed, and the numbers we want
 * to reproduce were published for specific encodings: the ARC paper's `.lis`
 * page traces, where one line stands for a run of consecutive 512-byte pages,
 * and libCacheSim's `oracleGeneral` binary records, where every request
 * carries its own object size in bytes.  The loader turns each of them into
 * one flat `Vec<Request>` up front.  Replaying from memory keeps the timing
 * of a policy free of decompression and parsing costs, and lets several
 * policies and cache sizes share one immutable copy of the trace across
 * threads.
 *
 * Every request is counted: a `.lis` run of `nblocks` pages expands to
 * `nblocks` unit-size requests, because that is how the ARC paper counts its
 * hit ratios ("hits / page requests").  Sizes stay in the trace's own unit
 * (pages for page traces, bytes for oracleGeneral) and the cache size given
 * to a replay must be in the same unit.
 *
 * Parsing is strict.  A half-read or mistyped trace silently replayed gives
 * hit ratios that look plausible and are wrong, which is worse than no
 * answer; so a malformed line is an error naming the file and the line, and
 * a binary trace whose length is not a whole number of records is an error
 * naming the byte offset of the torn record.
 *
 * Files ending in `.zst` are decompressed while they are read (streaming, so
 * a trace never needs to exist uncompressed on disk or whole in memory as
 * bytes).
 */

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// One cache request: an object (or page) key and its size in the trace's
/// unit (1 for page traces, bytes for oracleGeneral traces).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    /// The object or page.
    pub key: u64,
    /// Its size in the trace's unit.
    pub size: u64,
}

/// The on-disk encodings `load_trace` understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    /// ARC-paper page trace: `start_block nblocks [ignored [request_no]]`
    /// per line, meaning `nblocks` unit-size requests to pages
    /// `start_block .. start_block + nblocks - 1`.
    Lis,
    /// libCacheSim oracleGeneral binary: 24-byte little-endian records
    /// `<u32 timestamp, u64 object id, u32 size in bytes, i64 next access>`.
    Oracle,
    /// `key,size` or `key` per line; a non-numeric first line is a header.
    Csv,
    /// `key` or `key size` per line (whitespace separated); blank lines and
    /// lines starting with `#` are ignored.
    Txt,
}

impl TraceFormat {
    /// All formats, in the order they are listed in messages.
    pub const ALL: [TraceFormat; 4] = [
        TraceFormat::Lis,
        TraceFormat::Oracle,
        TraceFormat::Csv,
        TraceFormat::Txt,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Lis => "lis",
            TraceFormat::Oracle => "oracle",
            TraceFormat::Csv => "csv",
            TraceFormat::Txt => "txt",
        }
    }

    /// Guesses the format from a file name, looking through a trailing
    /// `.zst`: `*.lis` is Lis, `*.bin` / `*.oracleGeneral` is Oracle,
    /// `*.csv` is Csv, `*.txt` is Txt.  `None` when the name says nothing.
    pub fn from_path(path: &Path) -> Option<TraceFormat> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let name = name.strip_suffix(".zst").unwrap_or(&name);
        let ext = name.rsplit_once('.').map(|(_, e)| e)?;
        match ext {
            "lis" => Some(TraceFormat::Lis),
            "bin" | "oraclegeneral" => Some(TraceFormat::Oracle),
            "csv" => Some(TraceFormat::Csv),
            "txt" => Some(TraceFormat::Txt),
            _ => None,
        }
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TraceFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "lis" => Ok(TraceFormat::Lis),
            "oracle" | "oraclegeneral" => Ok(TraceFormat::Oracle),
            "csv" => Ok(TraceFormat::Csv),
            "txt" => Ok(TraceFormat::Txt),
            _ => Err(format!(
                "unknown trace format `{s}` (expected one of: lis, oracle, csv, txt)"
            )),
        }
    }
}

/// Why a trace could not be loaded.  `Display` is always one line that
/// names the file.
#[derive(Debug)]
pub enum TraceError {
    /// The file could not be opened.
    Open {
        /// The trace file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Reading (or decompressing) failed part way.
    Read {
        /// The trace file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A text line could not be parsed; `line` is 1-based.
    Parse {
        /// The trace file.
        path: PathBuf,
        /// The line.
        line: u64,
        /// What is wrong with it.
        message: String,
    },
    /// A binary trace ends inside a record.
    PartialRecord {
        /// The trace file.
        path: PathBuf,
        /// Byte offset (in the decompressed stream) where the torn record starts.
        offset: u64,
        /// How many bytes of it are present.
        present: usize,
        /// Bytes of a whole record.
        record_bytes: usize,
    },
}

/// `io::Error`'s Display appends " (os error N)"; the brief wants the plain
/// strerror text ("No such file or directory").
fn io_message(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Open { path, source } => {
                write!(f, "cannot open {}: {}", path.display(), io_message(source))
            }
            TraceError::Read { path, source } => {
                write!(f, "{}: read error: {}", path.display(), io_message(source))
            }
            TraceError::Parse {
                path,
                line,
                message,
            } => write!(f, "{}: line {}: {}", path.display(), line, message),
            TraceError::PartialRecord {
                path,
                offset,
                present,
                record_bytes,
            } => write!(
                f,
                "{}: truncated record at byte offset {}: {} of {} bytes present",
                path.display(),
                offset,
                present,
                record_bytes
            ),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TraceError::Open { source, .. } | TraceError::Read { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Size of one oracleGeneral record.
pub const ORACLE_RECORD_BYTES: usize = 24;

/// Longest `.lis` run accepted on one line, in pages.  Real traces have runs
/// of at most a few hundred pages; a larger count is a corrupt line, and
/// expanding it would exhaust memory instead of reporting the error.
pub const LIS_MAX_RUN_PAGES: u64 = 1 << 24;

/// Loads a whole trace into memory.  Files whose name ends in `.zst` are
/// decompressed on the fly.
pub fn load_trace(path: &Path, format: TraceFormat) -> Result<Vec<Request>, TraceError> {
    let file = File::open(path).map_err(|source| TraceError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let is_zst = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("zst"));
    let reader: Box<dyn Read> = if is_zst {
        let dec = zstd::stream::read::Decoder::new(file).map_err(|source| TraceError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Box::new(dec)
    } else {
        Box::new(file)
    };
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    match format {
        TraceFormat::Oracle => read_oracle(path, &mut reader),
        TraceFormat::Lis => read_lines(path, &mut reader, parse_lis_line),
        TraceFormat::Txt => read_lines(path, &mut reader, parse_txt_line),
        TraceFormat::Csv => read_csv(path, &mut reader),
    }
}

fn read_err(path: &Path, source: io::Error) -> TraceError {
    TraceError::Read {
        path: path.to_path_buf(),
        source,
    }
}

fn parse_err(path: &Path, line: u64, message: String) -> TraceError {
    TraceError::Parse {
        path: path.to_path_buf(),
        line,
        message,
    }
}

/*
 * oracleGeneral: fixed 24-byte records.  The record's own next-access field
 * is ignored; MIN computes next use itself so that it works for every
 * format.
 *
 * A size of 0 is replayed as size 1.  libCacheSim's reader instead drops
 * zero-size requests by default (`ignore_size_zero_req`), which changes the
 * request count; we keep every request counted, as the hit ratios here are
 * defined per request, and a zero-byte object still occupies a cache entry
 * (and would divide nothing by zero in byte accounting).  The cloudPhysics
 * trace has no zero-size records, so the choice does not affect the
 * libCacheSim comparison.
 */
fn read_oracle(path: &Path, reader: &mut impl Read) -> Result<Vec<Request>, TraceError> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; ORACLE_RECORD_BYTES * 8192];
    let mut filled = 0usize; // bytes in buf not yet consumed
    let mut offset = 0u64; // stream offset of buf[0]
    loop {
        let n = match reader.read(&mut buf[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_err(path, e)),
        };
        if n == 0 {
            break;
        }
        filled += n;
        let whole = filled / ORACLE_RECORD_BYTES * ORACLE_RECORD_BYTES;
        for rec in buf[..whole].chunks_exact(ORACLE_RECORD_BYTES) {
            out.push(decode_oracle(rec));
        }
        buf.copy_within(whole..filled, 0);
        filled -= whole;
        offset += whole as u64;
    }
    if filled != 0 {
        return Err(TraceError::PartialRecord {
            path: path.to_path_buf(),
            offset,
            present: filled,
            record_bytes: ORACLE_RECORD_BYTES,
        });
    }
    Ok(out)
}

fn decode_oracle(rec: &[u8]) -> Request {
    let mut key = [0u8; 8];
    key.copy_from_slice(&rec[4..12]);
    let mut size = [0u8; 4];
    size.copy_from_slice(&rec[12..16]);
    let size = u64::from(u32::from_le_bytes(size));
    Request {
        key: u64::from_le_bytes(key),
        size: size.max(1),
    }
}

/// Calls `parse` on every line (1-based line numbers, trailing `\r\n` or
/// `\n` removed).  Lines must be UTF-8.
fn for_each_line(
    path: &Path,
    reader: &mut impl BufRead,
    mut parse: impl FnMut(u64, &str) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    let mut raw = Vec::with_capacity(256);
    let mut line_no = 0u64;
    loop {
        raw.clear();
        let n = reader
            .read_until(b'\n', &mut raw)
            .map_err(|e| read_err(path, e))?;
        if n == 0 {
            return Ok(());
        }
        line_no += 1;
        let mut bytes = &raw[..];
        if let Some(b) = bytes.strip_suffix(b"\n") {
            bytes = b;
        }
        if let Some(b) = bytes.strip_suffix(b"\r") {
            bytes = b;
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|_| parse_err(path, line_no, "line is not valid UTF-8".into()))?;
        parse(line_no, text)?;
    }
}

type LineParser = fn(&str, &mut Vec<Request>) -> Result<(), String>;

fn read_lines(
    path: &Path,
    reader: &mut impl BufRead,
    parse: LineParser,
) -> Result<Vec<Request>, TraceError> {
    let mut out = Vec::new();
    for_each_line(path, reader, |line_no, text| {
        parse(text, &mut out).map_err(|m| parse_err(path, line_no, m))
    })?;
    Ok(out)
}

fn is_skippable(text: &str) -> bool {
    let t = text.trim_start();
    t.is_empty() || t.starts_with('#')
}

fn parse_u64(field: &str, what: &str) -> Result<u64, String> {
    field
        .parse::<u64>()
        .map_err(|_| format!("{what} `{field}` is not a non-negative integer"))
}

fn parse_size_field(field: &str) -> Result<u64, String> {
    let size = parse_u64(field, "size")?;
    if size == 0 {
        return Err("size 0: a request must have a size of at least 1".into());
    }
    Ok(size)
}

/*
 * `.lis`: the ARC paper's traces carry four fields, of which only the first
 * two matter.  Two or three fields are accepted too (some copies drop the
 * trailing bookkeeping), more than four are not.  The ignored fields must
 * still be integers: a line with garbage in it is a damaged line.  A run of
 * zero pages is legal and requests nothing.
 */
fn parse_lis_line(text: &str, out: &mut Vec<Request>) -> Result<(), String> {
    if is_skippable(text) {
        return Ok(());
    }
    let mut fields = [""; 4];
    let mut n = 0usize;
    for f in text.split_ascii_whitespace() {
        if n < 4 {
            fields[n] = f;
        }
        n += 1;
    }
    if !(2..=4).contains(&n) {
        return Err(format!(
            "expected 2 to 4 fields `start nblocks [_ [_]]`, found {n}"
        ));
    }
    let start = parse_u64(fields[0], "start block")?;
    let nblocks = parse_u64(fields[1], "block count")?;
    for (i, f) in fields.iter().enumerate().take(n).skip(2) {
        f.parse::<i64>()
            .map_err(|_| format!("field {} `{f}` is not an integer", i + 1))?;
    }
    if nblocks > LIS_MAX_RUN_PAGES {
        return Err(format!(
            "block count {nblocks} exceeds the limit of {LIS_MAX_RUN_PAGES} pages per line"
        ));
    }
    if nblocks > 0 && start.checked_add(nblocks - 1).is_none() {
        return Err(format!(
            "block run {start}+{nblocks} overflows a 64-bit block number"
        ));
    }
    out.extend((start..start + nblocks).map(|key| Request { key, size: 1 }));
    Ok(())
}

fn parse_txt_line(text: &str, out: &mut Vec<Request>) -> Result<(), String> {
    if is_skippable(text) {
        return Ok(());
    }
    let mut it = text.split_ascii_whitespace();
    let key = it.next().unwrap_or("");
    let size = it.next();
    if it.next().is_some() {
        let n = text.split_ascii_whitespace().count();
        return Err(format!("expected 1 or 2 fields `key [size]`, found {n}"));
    }
    let key = parse_u64(key, "key")?;
    let size = match size {
        Some(s) => parse_size_field(s)?,
        None => 1,
    };
    out.push(Request { key, size });
    Ok(())
}

fn parse_csv_fields(text: &str) -> Result<Request, String> {
    let fields: Vec<&str> = text.split(',').map(str::trim).collect();
    match fields.as_slice() {
        [key] => Ok(Request {
            key: parse_u64(key, "key")?,
            size: 1,
        }),
        [key, size] => Ok(Request {
            key: parse_u64(key, "key")?,
            size: parse_size_field(size)?,
        }),
        _ => Err(format!(
            "expected 1 or 2 fields `key[,size]`, found {}",
            fields.len()
        )),
    }
}

/*
 * CSV: a header is recognised only on the first non-blank line, and only
 * when its first field is not a number; everywhere else a non-numeric field
 * is an error, so a stray header pasted mid-file is reported, not skipped.
 */
fn read_csv(path: &Path, reader: &mut impl BufRead) -> Result<Vec<Request>, TraceError> {
    let mut out = Vec::new();
    let mut seen_first = false;
    for_each_line(path, reader, |line_no, text| {
        if text.trim().is_empty() {
            return Ok(());
        }
        let first = !seen_first;
        seen_first = true;
        if first {
            let head = text.split(',').next().unwrap_or("").trim();
            let numeric_start =
                head.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+');
            if !head.is_empty() && !numeric_start {
                return Ok(()); // header
            }
        }
        let req = parse_csv_fields(text).map_err(|m| parse_err(path, line_no, m))?;
        out.push(req);
        Ok(())
    })?;
    Ok(out)
}
