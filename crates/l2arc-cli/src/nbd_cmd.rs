//! `l2arc serve-nbd IMAGE`: export an image file or block device through
//! the cache over NBD.
//!
//! Runs in the foreground until SIGINT or SIGTERM, like any service a unit
//! file starts. It listens on loopback (or a Unix socket) unless told
//! otherwise: NBD has no authentication, so exposing a disk to the network
//! must be a deliberate choice (`--allow-remote`). Once it accepts clients
//! it prints `l2arc: serving IMAGE on ADDR` to stderr (scripts and tests
//! wait for that line) and tells systemd (`READY=1`, `life`). A stop
//! drains the export (`--stop-timeout`) and says so, then writes what only
//! the ARC holds to flash (`stop`); SIGHUP reloads the config file
//! (`reload`). On exit it prints the cache's statistics under their
//! arcstats names.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use l2arc::primary::image::ImagePrimary;
use l2arc_nbd::{ListenAddr, Listener, Server, ServerConfig};

use crate::service::{CacheOptions, FrontEndFileOptions, ResolvedOptions};

#[derive(Args, Debug)]
pub(crate) struct ServeNbdArgs {
    /// Image file or block device to export, or s3://BUCKET/KEY (an image
    /// object, exported read-only).
    pub image: PathBuf,
    /// Where to listen: unix:PATH or HOST:PORT (loopback only without
    /// --allow-remote; default 127.0.0.1:10809).
    #[arg(long)]
    pub listen: Option<ListenAddr>,
    /// Allow listening on a non-loopback address (NBD has no authentication; also --http).
    #[arg(long)]
    pub allow_remote: bool,
    /// Export read-only: writes, trims and zeroing are refused (EPERM).
    #[arg(long)]
    pub read_only: bool,
    /// Name of the export (NBD_OPT_LIST shows it; other names are refused; default "").
    #[arg(long)]
    pub export_name: Option<String>,
    /// Most client connections at once (default 64).
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Seconds a stop (SIGTERM, SIGINT) waits for the clients to take the
    /// replies of their requests in flight and disconnect (later requests
    /// are answered ESHUTDOWN) before it closes their connections (default 10).
    #[arg(long)]
    pub stop_timeout: Option<f64>,
    /// Most worker threads per connection (requests served in parallel on
    /// one connection; each of 8 at first, more while all are busy).
    #[arg(long, default_value_t = l2arc_nbd::server::WORKERS_DEFAULT)]
    pub workers: usize,
    /// Reads per connection kept in flight on flash by one thread (io_uring),
    /// for reads of cached data; 0 sends every read to the workers.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub read_queue_depth: u16,
    /// Seconds a client may stay silent with nothing in flight (or leave a
    /// reply unread) before it is disconnected. When every slot is taken, a
    /// new client takes the slot of the longest-idle one anyway.
    #[arg(long, default_value_t = 600.0)]
    pub idle_timeout: f64,
    /// Bytes for the request payloads and read replies of all connections
    /// together (a size: 256MiB). A client that does not read its replies
    /// or stalls in a write waits for this pool, and is disconnected if it
    /// holds it while others wait; peak RSS formula in docs/nbd.md.
    #[arg(long, value_parser = crate::service::parse_size, default_value = "256MiB")]
    pub nbd_buffer_max: u64,
    /// Seconds between checks of the image file for changes made behind
    /// the export, besides inotify's events and every flush (0: only
    /// those). A change drops every record cached of the image.
    #[arg(long, default_value_t = 1.0)]
    pub revalidate_secs: f64,
    /// Export a block device that another process holds open for writing
    /// (or that is mounted read-write, or has a driver stacked on it).
    /// Writes made behind the export are not seen: the export may serve
    /// bytes they replaced. Without it such a device is refused.
    #[arg(long)]
    pub shared_writer_unsafe: bool,
    #[command(flatten)]
    pub cache: CacheOptions,
    #[command(flatten)]
    pub s3: crate::s3_opts::S3Options,
}

fn is_block_device(path: &std::path::Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// serve-nbd's `sector_table_min` unless set: records of 128 KiB and up.
const NBD_SECTOR_TABLE_MIN_BYTES: u32 = 128 << 10;

pub(crate) fn run(mut args: ServeNbdArgs) -> Result<()> {
    l2arc_nbd::pool::map_large_buffers_alone();
    // Objects: 1 MiB records (one GET a MiB), as for an s3:// mount.
    let s3 = crate::s3_opts::is_s3(&args.image);
    let default_recordsize_bytes = if s3 { 1 << 20 } else { 64 << 10 };
    let mut resolved = args.cache.resolve(default_recordsize_bytes)?;
    adjust_defaults(s3)(&mut resolved);
    merge_file_options(&mut args, &resolved.front_end)?;
    l2arc_cli::log_sink::set_level(resolved.log_level);
    check_args(&args, s3)?;
    let writable = !args.read_only;
    let store = connect_store(&args, &resolved.s3, s3)?;
    let primary = match &store {
        Some(store) => Arc::clone(store) as Arc<dyn l2arc::primary::Primary>,
        None => {
            let image = open_image(&args, writable)?;
            resolved.wrap_primary(Arc::new(image))?
        }
    };
    let cache = resolved.build_cache()?;
    if s3 {
        crate::s3_opts::attach_shared_tier(&args.s3, &resolved.s3, &cache)?;
    }
    let _control = resolved.start_control(&cache)?;
    let _http = resolved.start_http(&cache, args.allow_remote)?;
    let dataset = cache.add_dataset("nbd", primary, resolved.dataset_config)?;
    let handle = cache
        .open(dataset, "", writable)
        .with_context(|| format!("open {}", args.image.display()))?;
    // The ARC's shape of the last run, prewarmed in the background.
    let shape = crate::shape::start(&cache, &resolved);
    let server = Server::new(Arc::clone(&cache), handle, server_config(&args))
        .context("--nbd-buffer-max")?;
    // NBD's families on /metrics while it serves.
    let _metrics =
        l2arc_cli::metrics::register(l2arc_cli::metrics::nbd_source(server.stats_reader()));
    let signals = crate::life::Signals::register(server.stop_flag())?;
    let listen = listen_addr(&args);
    let listener = Listener::bind(&listen).with_context(|| format!("listen on {listen}"))?;
    let addr = listener.local_addr()?;
    eprintln!("l2arc: serving {} on {addr}", args.image.display());
    print_notes(&args, &cache, s3);
    let status = format!(
        "serving {} on {addr}, {} cache devices",
        args.image.display(),
        resolved.cache_devices.len()
    );
    let reloader = crate::reload::Reloader {
        flags: args.cache.clone(),
        default_recordsize_bytes,
        adjust: Box::new(adjust_defaults(s3)),
        dataset: "nbd".into(),
        cache: Arc::clone(&cache),
        applied: resolved,
    };
    let life = crate::life::Life::start(&signals, &status, duties(&server, &cache, reloader))?;
    server.serve(listener)?;
    life.stopping();
    drop(life);
    print_drained(&server);
    // Drained: no reader is left, so the ARC may go to flash.
    crate::stop::stop_cache(&cache, shape);
    if let Some(store) = &store {
        crate::s3_opts::print_requests(store);
    }
    print_stopped(&server, &cache);
    Ok(())
}

/// serve-nbd's own defaults over the resolved settings (at start and at
/// each reload).
/// The object store of an s3:// image (None for a file or device), its
/// shared cache checked before the cache is built (a bad key file or URL
/// is one line); a shared cache without an s3:// image is refused.
fn connect_store(
    args: &ServeNbdArgs,
    file: &l2arc_cli::service::S3FileOptions,
    s3: bool,
) -> Result<Option<Arc<l2arc::primary::object_store::ObjectStorePrimary>>> {
    if !s3 {
        args.s3
            .refuse_shared_cache(file, &args.image.display().to_string())?;
        return Ok(None);
    }
    let uri = args.image.to_str().expect("is_s3 checked UTF-8");
    let store = args.s3.connect(uri, true, file)?;
    args.s3.shared_tier(file)?;
    Ok(Some(store))
}

fn adjust_defaults(s3: bool) -> impl Fn(&mut ResolvedOptions) + Send + 'static {
    move |resolved: &mut ResolvedOptions| {
        if !resolved.sector_table_min_set {
            // A volume is read in small pieces at random: a 4 KiB read of a
            // 128 KiB record that only flash holds reads 8 KiB, not 128.
            resolved.dataset_config.sector_table_min_bytes = NBD_SECTOR_TABLE_MIN_BYTES;
        }
        if s3 && !resolved.l2arc_noprefetch_set {
            // A read-ahead record of an object cost a GET: worth keeping on
            // flash (OpenZFS's default of leaving prefetches out assumes a disk).
            resolved.cache_config.l2arc.l2arc_noprefetch = false;
        }
    }
}

/// The file's `listen`, `read_only`, ... where no flag was given.
fn merge_file_options(args: &mut ServeNbdArgs, file: &FrontEndFileOptions) -> Result<()> {
    if args.listen.is_none()
        && let Some(listen) = &file.listen
    {
        let addr = listen
            .parse()
            .map_err(|e| anyhow::anyhow!("listen = {listen:?} in the config file: {e}"))?;
        args.listen = Some(addr);
    }
    args.read_only |= file.read_only == Some(true);
    args.allow_remote |= file.allow_remote == Some(true);
    args.export_name = args.export_name.take().or(file.export_name.clone());
    args.max_connections = args.max_connections.or(file.max_connections);
    args.stop_timeout = args.stop_timeout.or(file.stop_timeout);
    Ok(())
}

fn listen_addr(args: &ServeNbdArgs) -> ListenAddr {
    args.listen
        .clone()
        .unwrap_or_else(|| "127.0.0.1:10809".parse().expect("a valid address"))
}

/// The memory line, and the warning about block devices.
fn print_notes(args: &ServeNbdArgs, cache: &l2arc::Cache, s3: bool) {
    eprintln!(
        "l2arc: memory: {} + L2 index (l2_hdr_size) + NBD buffers {} MiB + {} KiB per connection (docs/nbd.md)",
        crate::service::arc_max_text(cache),
        args.nbd_buffer_max >> 20,
        l2arc_nbd::server::connection_fixed_bytes(args.workers.clamp(1, 256)) >> 10,
    );
    if !s3 && is_block_device(&args.image) {
        eprintln!(
            "l2arc: {} is a block device: writes made to it by anything but this export are not detected, while l2arc runs or while it is stopped (a block device has no ctime that moves on writes); do not write to it behind l2arc, or start once with --l2arc-rebuild-enabled false after you did (docs/nbd.md)",
            args.image.display()
        );
    }
}

/// The housekeeping thread's duties for an export.
fn duties(
    server: &Server,
    cache: &Arc<l2arc::Cache>,
    mut reloader: crate::reload::Reloader,
) -> crate::life::Duties {
    let beat = server.clone();
    let errors = (server.clone(), Arc::clone(cache));
    crate::life::Duties {
        heartbeat_age_ms: Box::new(move || beat.heartbeat_age_ms()),
        reload: Box::new(move || reloader.reload()),
        errors: Box::new(move || {
            let mut sample = crate::events::ErrorSample::of_cache(&errors.1);
            sample.add("nbd", "protocol errors", errors.0.stats().protocol_errors);
            sample
        }),
    }
}

/// Opens the image; a block device is refused if something else may
/// write it and claimed while exported, unless `--shared-writer-unsafe`.
fn open_image(args: &ServeNbdArgs, writable: bool) -> Result<ImagePrimary> {
    if !is_block_device(&args.image) || args.shared_writer_unsafe {
        return Ok(ImagePrimary::open(&args.image, writable)?);
    }
    refuse_shared_writers(&args.image)?;
    ImagePrimary::open_claimed(&args.image, writable).map_err(|e| {
        if e.raw_os_error() == Some(libc::EBUSY) {
            anyhow::anyhow!(
                "{} is in use by the system (mounted, or claimed by another program): \
                 exporting it would serve bytes written behind the export; \
                 --shared-writer-unsafe exports it anyway (docs/nbd.md)",
                args.image.display()
            )
        } else {
            e.into()
        }
    })
}

/// Refuses a block device that something else may write: nothing moves
/// its generation, so those writes would never be seen (docs/nbd.md).
fn refuse_shared_writers(device: &std::path::Path) -> Result<()> {
    let writers = l2arc::primary::block_writers::other_writers(device)
        .with_context(|| format!("check who else writes {}", device.display()))?;
    if writers.is_empty() {
        return Ok(());
    }
    bail!(
        "{} may be written behind the export ({}): a block device shows no sign of such writes, \
         so the export would serve the bytes they replaced; stop the other writer, or start with \
         --shared-writer-unsafe if its writes never touch what is read here (docs/nbd.md)",
        device.display(),
        writers.join("; ")
    );
}

/// Refuses what would be unsafe or out of bounds before anything starts.
fn check_args(args: &ServeNbdArgs, s3: bool) -> Result<()> {
    if let ListenAddr::Tcp(addr) = &listen_addr(args)
        && !addr.ip().is_loopback()
        && !args.allow_remote
    {
        bail!(
            "--listen {addr} is not a loopback address: NBD has no authentication; add --allow-remote to export {} to the network",
            args.image.display()
        );
    }
    if !(args.idle_timeout.is_finite() && (1.0..=86_400.0).contains(&args.idle_timeout)) {
        bail!(
            "--idle-timeout must be from 1 to 86400 seconds, not {}",
            args.idle_timeout
        );
    }
    if !(args.revalidate_secs.is_finite() && (0.0..=86_400.0).contains(&args.revalidate_secs)) {
        bail!(
            "--revalidate-secs must be from 0 to 86400 seconds, not {}",
            args.revalidate_secs
        );
    }
    if args.export_name.as_ref().map_or(0, String::len) > l2arc_nbd::protocol::NAME_MAX_BYTES {
        bail!("--export-name is longer than 4096 bytes");
    }
    if let Some(t) = args.stop_timeout
        && !(t.is_finite() && (0.0..=3600.0).contains(&t))
    {
        bail!("--stop-timeout must be from 0 to 3600 seconds, not {t}");
    }
    if args.max_connections == Some(0) {
        bail!("--max-connections must be at least 1");
    }
    if s3 && !args.read_only {
        bail!(
            "{} is an object: exports of objects are read-only for now; add --read-only",
            args.image.display()
        );
    }
    Ok(())
}

fn server_config(args: &ServeNbdArgs) -> ServerConfig {
    ServerConfig {
        export_name: args.export_name.clone().unwrap_or_default(),
        read_only: args.read_only,
        max_connections: args.max_connections.unwrap_or(64),
        stop_timeout: std::time::Duration::from_secs_f64(args.stop_timeout.unwrap_or(10.0)),
        idle_timeout: std::time::Duration::from_secs_f64(args.idle_timeout),
        workers_per_connection: args.workers.clamp(1, 256),
        read_queue_depth: usize::from(args.read_queue_depth),
        buffer_max_bytes: args.nbd_buffer_max,
        image_path: (!crate::s3_opts::is_s3(&args.image)).then(|| args.image.clone()),
        revalidate_interval: (args.revalidate_secs > 0.0)
            .then(|| std::time::Duration::from_secs_f64(args.revalidate_secs)),
        ..ServerConfig::default()
    }
}

/// What the drain did, if the export drained.
fn print_drained(server: &Server) {
    if let Some(d) = server.drain_report() {
        eprintln!(
            "l2arc: stopping: drained {} requests in flight on {} connections in {} ms ({} requests sent after the stop answered ESHUTDOWN); {} connections closed after the {} s --stop-timeout",
            d.requests_in_flight,
            d.connections,
            d.elapsed_ms,
            d.requests_refused,
            d.connections_cut,
            d.timeout_ms as f64 / 1000.0
        );
    }
}

/// What the server and the cache did, printed at exit.
fn print_stopped(server: &Server, cache: &l2arc::Cache) {
    let s = server.stats();
    eprintln!(
        "l2arc: stopped: {} connections ({} refused; {} idle, {} negotiating and {} leaving replies unread bumped), {} requests ({} errors, {} split; reads: {} through read queues, {} passed on to workers; {} worker threads started), {} protocol errors, buffers: peak {} MiB, {} reclaimed, {} image changes seen behind the export",
        s.connections_accepted,
        s.connections_refused,
        s.connections_evicted,
        s.connections_bumped_negotiating,
        s.connections_bumped_reply_unread,
        s.requests,
        s.request_errors,
        s.requests_split,
        s.reads_queued,
        s.reads_passed_on,
        s.workers_started,
        s.protocol_errors,
        s.buffer_high_water_bytes >> 20,
        s.connections_reclaimed,
        s.image_changes
    );
    for (name, value) in cache.stats().kstats() {
        eprintln!("{name:<28} {value}");
    }
}
