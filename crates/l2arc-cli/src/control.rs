//! The control socket of a running service, and `l2arc ctl` that talks to it.
//!
//! A cache in front of production storage runs for months; an operator must
//! be able to look at it (the arcstats counters) and to swap a cache device
//! (a worn SSD out, a new one in) without restarting it, which would drop
//! the DRAM tier and every client's connection. ZFS does this with
//! `zpool add/remove` and kstat files; a standalone daemon has neither, so it
//! listens on a Unix socket (mode 0600: only its owner may reconfigure it).
//!
//! The protocol is one text command per connection, one answer, then close:
//! trivially scriptable (`socat`, `nc -U`), nothing to keep in sync. The
//! answer's first line is `ok` or `error: <why>`. A command line is at most
//! `COMMAND_BYTES_MAX` bytes and must arrive within `COMMAND_TIMEOUT`; the
//! listener serves one connection at a time, so a stuck client delays other
//! control clients by at most that long and never touches the data path.
//!
//! Every change made through it (a device added or removed, a property
//! set) is logged once through `log` and kept in the administrative
//! history (`ctl history`, as `zpool history`): [`record_history`], which
//! other parts of the service (a reload) call for their own changes.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use l2arc::Cache;

const COMMAND_BYTES_MAX: u64 = 4096;
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Default size of a cache file that `add-cache` creates.
const ADD_CACHE_DEFAULT_BYTES: u64 = 1 << 30;
/// Entries `ctl history` keeps (the oldest go first past it).
const HISTORY_ENTRIES_MAX: usize = 10_000;
/// Where `ctl` and `stat` find the socket when `-S` is not given.
pub const SOCKET_ENV: &str = "L2ARC_SOCKET";

/// The administrative changes since start: (local time, event), oldest first.
static HISTORY: Mutex<VecDeque<(String, String)>> = Mutex::new(VecDeque::new());

/// Records an administrative change (`set nbd primarycache=none`, `reload
/// /etc/l2arc.toml: ...`), one line, in the history that `ctl history`
/// lists, with the local time. It does not log: the caller logs its change
/// once in its own words (the control socket's as `ctl: EVENT`). Bounded:
/// past `HISTORY_ENTRIES_MAX` entries the oldest is dropped.
pub fn record_history(event: &str) {
    assert!(!event.contains('\n'), "a history event is one line");
    let mut history = HISTORY.lock().unwrap_or_else(|e| e.into_inner());
    if history.len() >= HISTORY_ENTRIES_MAX {
        history.pop_front();
    }
    history.push_back((history_time(), event.to_string()));
}

/// `zpool history`'s time stamp: local `YYYY-MM-DD.HH:MM:SS`.
fn history_time() -> String {
    // SAFETY: time(NULL) and localtime_r only write the struct we pass.
    let tm = unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        tm
    };
    format!(
        "{:04}-{:02}-{:02}.{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

fn history_text() -> String {
    let history = HISTORY.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = String::from("History for 'l2arc':\n");
    for (time, event) in history.iter() {
        out.push_str(&format!("{time} {event}\n"));
    }
    out
}

/// The control socket: `-S PATH`, else `$L2ARC_SOCKET`.
pub fn socket_path(flag: Option<PathBuf>) -> Result<PathBuf> {
    match flag.or_else(|| std::env::var_os(SOCKET_ENV).map(PathBuf::from)) {
        Some(path) if !path.as_os_str().is_empty() => Ok(path),
        _ => bail!(
            "no control socket given: add -S PATH (the service's --control PATH) or set {SOCKET_ENV}"
        ),
    }
}

/// A listening control socket; stops and removes the socket file on drop.
pub struct ControlServer {
    path: PathBuf,
    stopping: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Listens on `path` (an existing socket file there is replaced only if
    /// nothing answers on it: two services must not share one).
    pub fn start(cache: Arc<Cache>, path: &Path) -> Result<Self> {
        started();
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                bail!(
                    "control socket {}: another service is listening there",
                    path.display()
                );
            }
            std::fs::remove_file(path)
                .with_context(|| format!("control socket {}", path.display()))?;
        }
        let listener = UnixListener::bind(path)
            .with_context(|| format!("control socket {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopping);
        let thread = std::thread::Builder::new()
            .name("l2arc-control".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            // Errors concern one client only: its answer is lost.
                            let _ = serve_one(&cache, stream);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            stopping,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve_one(cache: &Arc<Cache>, stream: UnixStream) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(COMMAND_TIMEOUT))?;
    stream.set_write_timeout(Some(COMMAND_TIMEOUT))?;
    let mut line = String::new();
    let read = BufReader::new((&stream).take(COMMAND_BYTES_MAX)).read_line(&mut line);
    let answer = match read {
        Ok(_) if !line.ends_with('\n') => {
            format!("error: a command is one line of at most {COMMAND_BYTES_MAX} bytes\n")
        }
        Ok(_) => match execute(cache, line.trim_end()) {
            Ok(body) => format!("ok\n{body}"),
            Err(e) => format!("error: {e:#}\n"),
        },
        Err(e) => format!("error: {e}\n"),
    };
    (&stream).write_all(answer.as_bytes())
}

/// One control command, as decoded from the line a client sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlCommand {
    /// `stats`: every counter.
    Stats,
    /// `devices`: the cache devices.
    Devices,
    /// `datasets`: datasets and their properties.
    Datasets,
    /// `set DATASET PROPERTY=VALUE`.
    Set {
        /// The dataset.
        dataset: String,
        /// The property (`primarycache`, `secondarycache`, `compression`).
        property: String,
        /// The new value.
        value: String,
    },
    /// `add-cache PATH SIZE_BYTES`.
    AddCache {
        /// The cache file or device.
        path: String,
        /// Size of a file created there.
        size_bytes: u64,
    },
    /// `remove-cache SLOT`.
    RemoveCache {
        /// The device's slot.
        slot: u8,
    },
    /// `history`: the administrative changes since start.
    History,
    /// `iostat`: operations, bytes and latency histograms of primary
    /// storage and each cache device, as one JSON object (`l2arc iostat`).
    Iostat,
    /// `get [TUNABLE]`: the live tunables in force (`name value` lines).
    Get(Option<String>),
}

impl ControlCommand {
    /// Decodes one command line (without its newline): the decoder of
    /// outside bytes on the control socket, pure so that the fuzz targets
    /// (crates/l2arc-fuzz) can drive it.
    pub fn parse(line: &str) -> Result<Self> {
        let words: Vec<&str> = line.split_whitespace().collect();
        Ok(match words.as_slice() {
            ["stats"] => ControlCommand::Stats,
            ["devices"] => ControlCommand::Devices,
            ["datasets"] => ControlCommand::Datasets,
            ["history"] => ControlCommand::History,
            ["iostat"] => ControlCommand::Iostat,
            ["set", dataset, assignment] => {
                let (property, value) = assignment.split_once('=').ok_or_else(|| {
                    anyhow::anyhow!(
                        "`{assignment}` is not PROPERTY=VALUE (e.g. secondarycache=none)"
                    )
                })?;
                ControlCommand::Set {
                    dataset: dataset.to_string(),
                    property: property.to_string(),
                    value: value.to_string(),
                }
            }
            ["add-cache", path] | ["add-cache", path, _] => ControlCommand::AddCache {
                path: path.to_string(),
                size_bytes: match words.get(2) {
                    Some(s) => l2arc_sim::parse_size(s).map_err(anyhow::Error::msg)?,
                    None => ADD_CACHE_DEFAULT_BYTES,
                },
            },
            ["remove-cache", slot] => ControlCommand::RemoveCache {
                slot: slot.parse().map_err(|_| {
                    anyhow::anyhow!("`{slot}` is not a device slot (see `devices`)")
                })?,
            },
            ["get"] | ["get", _] => ControlCommand::Get(words.get(1).map(|s| s.to_string())),
            _ => bail!(
                "unknown command `{line}`: expected stats, devices, datasets, history, iostat, set DATASET PROPERTY=VALUE, get [TUNABLE], add-cache PATH [SIZE] or remove-cache SLOT"
            ),
        })
    }

    /// The command as a line that [`Self::parse`] reads back to itself.
    pub fn to_line(&self) -> String {
        match self {
            ControlCommand::Stats => "stats".into(),
            ControlCommand::Devices => "devices".into(),
            ControlCommand::Datasets => "datasets".into(),
            ControlCommand::History => "history".into(),
            ControlCommand::Iostat => "iostat".into(),
            ControlCommand::Set {
                dataset,
                property,
                value,
            } => format!("set {dataset} {property}={value}"),
            ControlCommand::AddCache { path, size_bytes } => {
                format!("add-cache {path} {size_bytes}")
            }
            ControlCommand::RemoveCache { slot } => format!("remove-cache {slot}"),
            ControlCommand::Get(name) => format!("get {}", name.as_deref().unwrap_or("")),
        }
    }
}

/// Runs one command and returns the answer's body.
fn execute(cache: &Arc<Cache>, line: &str) -> Result<String> {
    match ControlCommand::parse(line)? {
        ControlCommand::Stats => {
            let mut out = String::new();
            for (name, value) in cache.stats().kstats() {
                out.push_str(&format!("{name} {value}\n"));
            }
            Ok(out)
        }
        ControlCommand::Devices => Ok(devices(cache)),
        ControlCommand::Set {
            dataset,
            property,
            value,
        } => {
            cache.set_dataset_property(&dataset, &property, &value)?;
            Ok(changed(&format!("set {dataset} {property}={value}")))
        }
        ControlCommand::Datasets => {
            let mut out = String::new();
            for (_, name, c) in cache.dataset_list() {
                out.push_str(&format!(
                    "{name} recordsize={} primarycache={} secondarycache={} compression={}\n",
                    c.recordsize_bytes,
                    mode_name(c.primarycache),
                    mode_name(c.secondarycache),
                    c.compression
                ));
            }
            Ok(out)
        }
        ControlCommand::AddCache { path, size_bytes } => {
            // The engine's errors name the device already.
            let (slot, open) = cache.add_cache_path(&path, Some(size_bytes))?;
            Ok(changed(&format!(
                "added cache device {path} as slot {slot} ({})",
                format!("{open:?}").to_lowercase()
            )))
        }
        ControlCommand::RemoveCache { slot } => {
            cache.remove_cache_device(slot)?;
            Ok(changed(&format!("removed cache device {slot}")))
        }
        ControlCommand::History => Ok(history_text()),
        ControlCommand::Iostat => Ok(format!("{}\n", iostat_json(cache))),
        ControlCommand::Get(name) => get_tunables(cache, name.as_deref()),
    }
}

/// What `l2arc iostat` needs in one answer: per cache device its capacity,
/// operations and bytes; primary storage's; the latency histograms by tier;
/// the seconds since the service started (its first report averages over them).
fn iostat_json(cache: &Cache) -> serde_json::Value {
    let stats = cache.stats();
    let devices: Vec<serde_json::Value> = stats
        .l2
        .iter()
        .flat_map(|l2| &l2.devices)
        .map(|d| {
            let get = |name: &str| {
                d.kstats
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or(0, |(_, v)| *v)
            };
            serde_json::json!({
                "slot": d.slot,
                "device": d.description,
                "state": d.state,
                "size_bytes": d.size_bytes,
                "alloc_bytes": get("l2_asize"),
                "reads": get("l2_hits"),
                "read_bytes": get("l2_read_bytes"),
                "writes": get("l2_writes_sent"),
                "write_bytes": get("l2_write_bytes"),
            })
        })
        .collect();
    serde_json::json!({
        "uptime_secs": started().elapsed().as_secs_f64(),
        "primary": {
            "reads": stats.primary_reads,
            "read_bytes": stats.primary_read_bytes,
            "writes": stats.writes,
            "write_bytes": stats.write_bytes,
        },
        "devices": devices,
        "histograms": crate::metrics::json_histograms(cache),
    })
}

/// When the process started serving control commands (first call: at the
/// control socket's start).
fn started() -> std::time::Instant {
    static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *STARTED.get_or_init(std::time::Instant::now)
}

/// A change made: logged, kept in the history, and said to the client.
fn changed(event: &str) -> String {
    log::info!("ctl: {event}");
    record_history(event);
    format!("{event}\n")
}

/// `get [TUNABLE]`: `name value` lines of the live tunables (or of one).
fn get_tunables(cache: &Cache, name: Option<&str>) -> Result<String> {
    let list = cache.tunables();
    let chosen: Vec<_> = list
        .iter()
        .filter(|(n, _)| name.is_none_or(|want| want == *n))
        .collect();
    if chosen.is_empty() {
        bail!(
            "{}",
            l2arc::TunableError::Unknown(name.unwrap_or("").to_string())
        );
    }
    Ok(chosen.iter().map(|(n, v)| format!("{n} {v}\n")).collect())
}

fn mode_name(mode: l2arc::CacheMode) -> &'static str {
    match mode {
        l2arc::CacheMode::All => "all",
        l2arc::CacheMode::None => "none",
    }
}

fn devices(cache: &Cache) -> String {
    let mut out = String::new();
    if let Some(l2) = cache.stats().l2 {
        for d in l2.devices {
            let get = |name: &str| {
                d.kstats
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or(0, |(_, v)| *v)
            };
            out.push_str(&format!(
                "{} {} size_bytes={} l2_asize={} l2_hits={} {}\n",
                d.slot,
                d.state,
                d.size_bytes,
                get("l2_asize"),
                get("l2_hits"),
                d.description
            ));
        }
    }
    out
}

/// Sends one command and returns the answer's body, or the service's error.
pub fn request(socket: &Path, command: &str) -> Result<String> {
    assert!(!command.contains('\n'), "one command per line");
    let mut stream = UnixStream::connect(socket).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            anyhow::anyhow!(
                "control socket {}: permission denied: it is mode 0600, owned by the service's user; run this as that user (or root)",
                socket.display()
            )
        } else {
            anyhow::anyhow!(
                "control socket {}: {e}: is the service running with --control?",
                socket.display()
            )
        }
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    stream.write_all(format!("{command}\n").as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    match answer.split_once('\n') {
        Some(("ok", body)) => Ok(body.to_string()),
        Some((first, _)) if first.starts_with("error: ") => {
            bail!("{}", &first["error: ".len()..])
        }
        _ => bail!("control socket {}: malformed answer", socket.display()),
    }
}

/// Standard output was closed by its reader (`| head`): the command ends
/// quietly with success, as a Unix filter does (`main` checks for it).
#[derive(Debug)]
pub struct OutputClosed;

impl std::fmt::Display for OutputClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("output closed")
    }
}

impl std::error::Error for OutputClosed {}

/// An output error: `OutputClosed` for a broken pipe, else the error.
pub fn output_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        anyhow::Error::new(OutputClosed)
    } else {
        anyhow::Error::new(e).context("write output")
    }
}

/// Where lines go: standard output, or `-o FILE`.
pub fn open_output(outfile: Option<&std::path::Path>) -> Result<Box<dyn Write>> {
    Ok(match outfile {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot open {} for writing", path.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    })
}

/// `l2arc ctl`: commands to a running service.
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The service's control socket (its --control PATH; default $L2ARC_SOCKET); before or after the subcommand.
    #[arg(short = 'S', long, global = true)]
    pub socket: Option<PathBuf>,
    /// What to ask.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// The commands of `l2arc ctl`.
#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Print the counters (arcstats names), one `name value` per line.
    Stats,
    /// List cache devices: slot, state, size, bytes held, hits, path.
    Devices,
    /// Add a cache device (a file is created with SIZE if missing; default 1GiB).
    AddCache {
        /// The cache file or block device.
        path: PathBuf,
        /// Size of a file created there (e.g. 4GiB).
        size: Option<String>,
    },
    /// Remove a cache device by slot (waits for reads in flight on it).
    RemoveCache {
        /// The slot `devices` shows.
        slot: u8,
    },
    /// List datasets and their properties.
    Datasets,
    /// The administrative changes since start, with time stamps (as `zpool history`).
    History,
    /// Set a dataset property while running: primarycache=all|none,
    /// secondarycache=all|none, compression=lz4|zstd|off.
    Set {
        /// The dataset's name (`datasets` lists them).
        dataset: String,
        /// PROPERTY=VALUE
        assignment: String,
    },
    /// Print the live L2ARC tunables in force (or one), `name value` per line.
    Get {
        /// One tunable (l2arc_write_max, l2arc_dwpd, ...); all if omitted.
        tunable: Option<String>,
    },
}

/// Runs one `l2arc ctl` command and prints the answer.
pub fn run(args: CtlArgs) -> Result<()> {
    let command = match &args.command {
        CtlCommand::Stats => "stats".to_string(),
        CtlCommand::Devices => "devices".to_string(),
        CtlCommand::AddCache { path, size } => {
            let path = std::path::absolute(path)?;
            let path = path
                .to_str()
                .filter(|p| !p.contains(char::is_whitespace))
                .ok_or_else(|| anyhow::anyhow!("cache path must be UTF-8 without spaces"))?
                .to_string();
            match size {
                Some(size) => format!("add-cache {path} {size}"),
                None => format!("add-cache {path}"),
            }
        }
        CtlCommand::RemoveCache { slot } => format!("remove-cache {slot}"),
        CtlCommand::Datasets => "datasets".to_string(),
        CtlCommand::History => "history".to_string(),
        CtlCommand::Get { tunable } => format!("get {}", tunable.as_deref().unwrap_or("")),
        CtlCommand::Set {
            dataset,
            assignment,
        } => {
            if dataset.contains(char::is_whitespace) || assignment.contains(char::is_whitespace) {
                bail!("dataset names and PROPERTY=VALUE have no spaces");
            }
            format!("set {dataset} {assignment}")
        }
    };
    let answer = request(&socket_path(args.socket)?, &command)?;
    let mut out = std::io::stdout().lock();
    out.write_all(answer.as_bytes())
        .and_then(|()| out.flush())
        .map_err(output_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use l2arc::CacheConfig;

    fn cache() -> Arc<Cache> {
        Cache::new(CacheConfig::default().arc_max_bytes(16 << 20).arc_shards(2)).unwrap()
    }

    #[test]
    fn stats_devices_add_and_remove() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ctl.sock");
        let server = ControlServer::start(cache(), &socket).unwrap();
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let stats = request(&socket, "stats").unwrap();
        assert!(
            stats.lines().any(|l| l.starts_with("c_max 16777216")),
            "{stats}"
        );
        assert_eq!(request(&socket, "devices").unwrap(), "");

        let device = dir.path().join("l2.img");
        let added = request(&socket, &format!("add-cache {} 64MiB", device.display())).unwrap();
        assert!(
            added.starts_with(&format!(
                "added cache device {} as slot 0",
                device.display()
            )),
            "{added}"
        );
        assert_eq!(std::fs::metadata(&device).unwrap().len(), 64 << 20);
        let listed = request(&socket, "devices").unwrap();
        assert!(listed.contains(&device.display().to_string()), "{listed}");
        assert!(request(&socket, "stats").unwrap().contains("l2_devices 1"));

        assert_eq!(
            request(&socket, "remove-cache 0").unwrap(),
            "removed cache device 0\n"
        );
        assert!(request(&socket, "stats").unwrap().contains("l2_devices 0"));
        let history = request(&socket, "history").unwrap();
        assert!(history.starts_with("History for 'l2arc':\n"), "{history}");
        assert!(history.contains(" removed cache device 0\n"), "{history}");
        drop(server);
        assert!(!socket.exists(), "the socket file is removed on stop");
    }

    #[test]
    fn bad_commands_get_errors_and_the_server_lives_on() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ctl.sock");
        let _server = ControlServer::start(cache(), &socket).unwrap();
        let unknown = request(&socket, "format-disk").unwrap_err();
        assert!(
            format!("{unknown}").contains("unknown command"),
            "{unknown}"
        );
        let slot = request(&socket, "remove-cache seven").unwrap_err();
        assert!(format!("{slot}").contains("not a device slot"), "{slot}");
        let missing = request(&socket, "add-cache /nonexistent/dir/l2.img").unwrap_err();
        assert!(format!("{missing:#}").contains("/nonexistent/dir/l2.img"));

        // A line as long as allowed without its newline, then a silent client.
        // (Bytes beyond the limit would stay unread: the close resets them.)
        let mut long = UnixStream::connect(&socket).unwrap();
        long.write_all(&vec![b'x'; COMMAND_BYTES_MAX as usize])
            .unwrap();
        let mut answer = String::new();
        long.read_to_string(&mut answer).unwrap();
        assert!(
            answer.starts_with("error: a command is one line"),
            "{answer}"
        );
        let _silent = UnixStream::connect(&socket).unwrap();
        // Served after the silent client times out.
        assert!(request(&socket, "stats").unwrap().contains("c_max"));
    }

    #[test]
    fn a_second_service_cannot_take_a_live_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ctl.sock");
        let _first = ControlServer::start(cache(), &socket).unwrap();
        let second = ControlServer::start(cache(), &socket).err().unwrap();
        assert!(format!("{second}").contains("another service"), "{second}");
    }
}
