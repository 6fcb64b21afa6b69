//! `l2arc mount SRC MNT`: serve the directory tree SRC at MNT through the
//! cache (FUSE). SRC may be `s3://BUCKET[/PREFIX]`: the bucket is then
//! served read-only (`l2arc_fuse::ObjectFs`, docs/object-storage.md).
//!
//! Runs in the foreground until SIGINT or SIGTERM, like any service a unit
//! file starts, and then unmounts. The mount also asks for fusermount3's
//! auto_unmount, which releases it if this process is killed where the
//! watcher survives; if a mount is ever left behind ("Transport endpoint is
//! not connected"), `fusermount3 -u MNT` or `umount -l MNT` removes it. Once the mount is
//! ready it prints `l2arc: mounted SRC at MNT` to stderr (scripts and tests
//! wait for that line) and tells systemd (`READY=1`, `life`); SIGHUP
//! reloads the config file (`reload`); once unmounted it writes what only
//! the ARC holds to flash (`stop`), and on exit it prints the cache's
//! statistics under their arcstats names.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use l2arc::primary::dir::DirPrimary;
use l2arc_fuse::{CachedFs, FsOptions, MountOptions, Session};

use crate::s3_opts::{S3Options, is_s3};
use crate::service::{CacheOptions, ResolvedOptions};

/// Read-ahead window of the directory mount when not given, in records
/// (it ramps up to it from one).
const DIR_READAHEAD_RECORDS: u32 = 8;

#[derive(Args, Debug)]
pub(crate) struct MountArgs {
    /// Directory tree to serve, or s3://BUCKET[/PREFIX] (read-only).
    pub src: PathBuf,
    /// Mount point.
    pub mnt: PathBuf,
    /// Seconds the kernel may cache attributes and names (a `stat` of a
    /// name changed behind the mount may show the old attributes that
    /// long; open files and new opens see changes sooner: docs/mount.md).
    #[arg(long, default_value_t = 1.0)]
    pub attr_timeout: f64,
    /// Largest read-ahead window for sequential readers, in records (0 =
    /// off). Default: 8, ramping up from 1; for s3:// 64 MiB, opened at once
    /// (at most half of the ARC either way for s3://).
    #[arg(long)]
    pub readahead_records: Option<u32>,
    /// After a small read of a record of 128 KiB or less, hand the kernel
    /// the whole record for its page cache, so that a random reader warms
    /// the page cache a record per miss (never while the file is open for
    /// writing). Directory mounts only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub store_whole_records: bool,
    /// Threads serving FUSE requests: also how many reads that miss may
    /// wait on primary storage at once, and how many the kernel is asked
    /// to send at once (32 keep 4 disks busy under 32 random readers; 16
    /// left them a tenth idle, 4 a third).
    #[arg(long, default_value_t = l2arc_fuse::MountOptions::default().threads)]
    pub threads: usize,
    /// Most nodes (files and directories) the kernel may hold; a lookup
    /// past it fails with ENFILE. Also at most half the descriptors the
    /// process may open. Peak RSS formula in docs/mount.md.
    #[arg(long, default_value_t = FsOptions::default().max_nodes)]
    pub max_nodes: usize,
    /// Most open files plus open directories; an open past it fails with
    /// EMFILE. Also at most a quarter of the descriptors the process may open.
    #[arg(long, default_value_t = FsOptions::default().max_open_handles)]
    pub max_open_handles: usize,
    /// Bytes of directory listings all open directories hold together (a
    /// size: 64MiB); an opendir past it fails with ENOMEM.
    #[arg(long, value_parser = crate::service::parse_size, default_value = "64MiB")]
    pub dir_listing_max: u64,
    /// Let every user use the mount (allow_other), with the kernel checking
    /// permissions (default_permissions). Default: root and the mounting user only.
    #[arg(long)]
    pub allow_other: bool,
    /// Allow --http on a non-loopback address (the page shows file names and load).
    #[arg(long)]
    pub allow_remote: bool,
    #[command(flatten)]
    pub cache: CacheOptions,
    #[command(flatten)]
    pub s3: S3Options,
}

pub(crate) fn run(mut args: MountArgs) -> Result<()> {
    if is_s3(&args.src) {
        return run_s3(args);
    }
    let resolved = args.cache.resolve(DIR_RECORDSIZE_DEFAULT_BYTES)?;
    merge_file_options(&mut args, &resolved);
    check_local_args(&args)?;
    args.s3
        .refuse_shared_cache(&resolved.s3, &args.src.display().to_string())?;
    let primary = Arc::new(DirPrimary::new(&args.src)?);
    let cache = resolved.build_cache()?;
    // `l2arc ctl` (stats, cache devices) when --control is given.
    let _control = resolved.start_control(&cache)?;
    // FUSE's family on /metrics while mounted.
    let _metrics = l2arc_cli::metrics::register(l2arc_cli::metrics::fuse_source());
    let _http = resolved.start_http(&cache, args.allow_remote)?;
    let dataset = cache.add_dataset(
        "mount",
        resolved.wrap_primary(Arc::clone(&primary) as Arc<dyn l2arc::primary::Primary>)?,
        resolved.dataset_config,
    )?;
    // The ARC's shape of the last run, prewarmed in the background.
    let shape = crate::shape::start(&cache, &resolved);
    let fs = CachedFs::new(
        Arc::clone(&cache),
        dataset,
        primary,
        FsOptions {
            attr_timeout: Duration::from_secs_f64(args.attr_timeout),
            readahead_max_records: args.readahead_records.unwrap_or(DIR_READAHEAD_RECORDS),
            store_whole_records: args.store_whole_records,
            max_nodes: args.max_nodes,
            max_open_handles: args.max_open_handles,
            max_dir_listing_bytes: usize::try_from(args.dir_listing_max).unwrap_or(usize::MAX),
            ..FsOptions::default()
        },
    )
    .with_context(|| format!("source {}", args.src.display()))?;
    // The bounds in force (the descriptor limit may have lowered the
    // node and handle bounds), for the peak RSS formula in docs/mount.md.
    let bounds = fs.options();
    eprintln!(
        "l2arc: memory: {} + L2 index (l2_hdr_size) + l2arc_writeback_max + {} threads x 1 MiB + 32 MiB of records for the page cache + listings {} MiB + {} nodes + {} handles (docs/mount.md)",
        crate::service::arc_max_text(&cache),
        args.threads,
        bounds.max_dir_listing_bytes >> 20,
        bounds.max_nodes,
        bounds.max_open_handles,
    );
    // Signals first: a SIGTERM right after the ready line must unmount.
    let signals = crate::life::Signals::register(Arc::new(AtomicBool::new(false)))?;
    let session = l2arc_fuse::mount(fs, &args.mnt, &mount_options(&args))
        .with_context(|| mount_failed(&args.src.display().to_string(), &args))?;
    eprintln!(
        "l2arc: mounted {} at {}",
        args.src.display(),
        args.mnt.display()
    );
    let what = args.src.display().to_string();
    let reloader = reloader(
        &args,
        DIR_RECORDSIZE_DEFAULT_BYTES,
        "mount",
        &cache,
        resolved,
    );
    serve_until_stopped(session, &args, &signals, &what, reloader)?;
    // Unmounted: no reader is left, so the ARC may go to flash.
    crate::stop::stop_cache(&cache, shape);
    print_kstats(&cache);
    Ok(())
}

/// Records of a directory mount unless set.
const DIR_RECORDSIZE_DEFAULT_BYTES: u64 = 128 << 10;

/// The file's `allow_other`, `threads` and `allow_remote` where no flag
/// was given (a flag left at its default counts as not given), and the
/// log level.
fn merge_file_options(args: &mut MountArgs, resolved: &ResolvedOptions) {
    let file = &resolved.front_end;
    args.allow_other |= file.allow_other == Some(true);
    args.allow_remote |= file.allow_remote == Some(true);
    if args.threads == l2arc_fuse::MountOptions::default().threads
        && let Some(threads) = file.threads
    {
        args.threads = threads;
    }
    l2arc_cli::log_sink::set_level(resolved.log_level);
}

/// How a SIGHUP re-reads the settings of this mount.
fn reloader(
    args: &MountArgs,
    default_recordsize_bytes: u64,
    dataset: &str,
    cache: &Arc<l2arc::Cache>,
    applied: ResolvedOptions,
) -> crate::reload::Reloader {
    let s3 = is_s3(&args.src);
    crate::reload::Reloader {
        flags: args.cache.clone(),
        default_recordsize_bytes,
        adjust: Box::new(move |r: &mut ResolvedOptions| {
            if s3 && !r.l2arc_noprefetch_set {
                r.cache_config.l2arc.l2arc_noprefetch = false;
            }
        }),
        dataset: dataset.to_string(),
        cache: Arc::clone(cache),
        applied,
    }
}

/// Checks every front end shares: the thread count and the mount point.
fn check_common_args(args: &MountArgs) -> Result<()> {
    if !(1..=64).contains(&args.threads) {
        bail!("--threads must be between 1 and 64, not {}", args.threads);
    }
    let mnt_meta = std::fs::metadata(&args.mnt)
        .with_context(|| format!("mount point {}", args.mnt.display()))?;
    if !mnt_meta.is_dir() {
        bail!("mount point {} is not a directory", args.mnt.display());
    }
    Ok(())
}

/// Checks of a directory-tree mount: its TTL, bounds and where it sits.
fn check_local_args(args: &MountArgs) -> Result<()> {
    if !(args.attr_timeout.is_finite() && (0.0..=3600.0).contains(&args.attr_timeout)) {
        bail!(
            "--attr-timeout must be between 0 and 3600 seconds, not {}",
            args.attr_timeout
        );
    }
    check_common_args(args)?;
    if args.max_nodes < 2 || args.max_open_handles < 1 {
        bail!(
            "--max-nodes must be at least 2 and --max-open-handles at least 1, not {} and {}",
            args.max_nodes,
            args.max_open_handles
        );
    }
    // A mount point inside the tree would make our own lookups of it
    // re-enter the mount (and wait on themselves).
    if let (Ok(src), Ok(mnt)) = (args.src.canonicalize(), args.mnt.canonicalize())
        && mnt.starts_with(&src)
    {
        bail!(
            "mount point {} is inside the source tree {}: choose a mount point outside it",
            args.mnt.display(),
            args.src.display()
        );
    }
    Ok(())
}

fn mount_options(args: &MountArgs) -> MountOptions {
    MountOptions {
        allow_other: args.allow_other,
        threads: args.threads,
    }
}

fn mount_failed(src: &str, args: &MountArgs) -> String {
    format!(
        "mount {src} at {} (is fusermount3 installed? scripts/setup.sh installs it)",
        args.mnt.display()
    )
}

/// Serves until a signal or an outside unmount, then unmounts (or
/// detaches a busy mount) and waits for the session's threads. The
/// housekeeping thread (`life`) runs meanwhile: this loop is its heartbeat.
fn serve_until_stopped(
    session: Session,
    args: &MountArgs,
    signals: &crate::life::Signals,
    what: &str,
    mut reloader: crate::reload::Reloader,
) -> Result<()> {
    let heartbeat = crate::life::Heartbeat::new();
    heartbeat.beat();
    let beat = heartbeat.clone();
    let cache = Arc::clone(&reloader.cache);
    let duties = crate::life::Duties {
        heartbeat_age_ms: Box::new(move || beat.age_ms()),
        reload: Box::new(move || reloader.reload()),
        errors: Box::new(move || crate::events::ErrorSample::of_cache(&cache)),
    };
    let status = format!("serving {what} at {}", args.mnt.display());
    let life = crate::life::Life::start(signals, &status, duties)?;
    let stop = &signals.stop;
    while !stop.load(Ordering::Relaxed) && !session.guard.is_finished() {
        heartbeat.beat();
        std::thread::sleep(Duration::from_millis(50));
    }
    life.stopping();
    if !session.guard.is_finished()
        && let Err(e) = l2arc_fuse::unmount(&args.mnt)
    {
        // Busy (a process still has its cwd or a file there): detach it so
        // the name is free now and the kernel lets go when it is idle.
        eprintln!("l2arc: unmount {}: {e}; detaching it", args.mnt.display());
        if let Err(e) = l2arc_fuse::detach_mount(&args.mnt) {
            bail!(
                "could not unmount {}: {e}; run `fusermount3 -u {0}` or `umount -l {0}`",
                args.mnt.display()
            );
        }
    }
    // Unmounted (by us or from outside): the session's threads end.
    if let Err(e) = session.join() {
        eprintln!("l2arc: FUSE session ended with an error: {e}");
    }
    drop(life);
    eprintln!("l2arc: unmounted {}", args.mnt.display());
    Ok(())
}

fn print_kstats(cache: &l2arc::Cache) {
    for (name, value) in cache.stats().kstats() {
        eprintln!("{name:<28} {value}");
    }
}

/// Records of object store datasets: 1 MiB by default, the block size of
/// mountpoint-s3's cache, so that a miss is one GET of a size that S3
/// serves at full speed (measured in docs/benchmarks.md).
const S3_RECORDSIZE_DEFAULT_BYTES: u64 = 1 << 20;

fn run_s3(mut args: MountArgs) -> Result<()> {
    let uri = args.src.to_str().expect("is_s3 checked UTF-8").to_string();
    let mut resolved = args.cache.resolve(S3_RECORDSIZE_DEFAULT_BYTES)?;
    merge_file_options(&mut args, &resolved);
    if !resolved.l2arc_noprefetch_set {
        // A read-ahead record of an object cost a GET: worth keeping on
        // flash (OpenZFS's default of leaving prefetches out assumes a disk).
        resolved.cache_config.l2arc.l2arc_noprefetch = false;
    }
    check_common_args(&args)?;
    // Fails here, before anything is mounted, with one line: no bucket,
    // credentials refused, endpoint unreachable.
    let store = args.s3.connect(&uri, false, &resolved.s3)?;
    // Checked before the cache is built: a bad key file or URL is one line.
    args.s3.shared_tier(&resolved.s3)?;
    let cache = resolved.build_cache()?;
    crate::s3_opts::attach_shared_tier(&args.s3, &resolved.s3, &cache)?;
    let _control = resolved.start_control(&cache)?;
    // FUSE's family on /metrics while mounted.
    let _metrics = l2arc_cli::metrics::register(l2arc_cli::metrics::fuse_source());
    let _http = resolved.start_http(&cache, args.allow_remote)?;
    let recordsize_bytes = resolved.dataset_config.recordsize_bytes;
    let dataset = cache.add_dataset(
        "s3",
        Arc::clone(&store) as Arc<dyn l2arc::primary::Primary>,
        resolved.dataset_config,
    )?;
    // The ARC's shape of the last run, prewarmed in the background.
    let shape = crate::shape::start(&cache, &resolved);
    let reloader = reloader(&args, S3_RECORDSIZE_DEFAULT_BYTES, "s3", &cache, resolved);
    let ttl = Duration::from_millis(store.config().metadata_ttl_ms);
    let fs = l2arc_fuse::ObjectFs::new(
        Arc::clone(&cache),
        dataset,
        Arc::clone(&store),
        l2arc_fuse::ObjectFsOptions {
            attr_timeout: ttl,
            readahead_window_bytes: args
                .readahead_records
                .map_or(l2arc_fuse::READAHEAD_WINDOW_DEFAULT_BYTES, |records| {
                    u64::from(records) * u64::from(recordsize_bytes)
                }),
            max_nodes: args.max_nodes,
            max_open_handles: args.max_open_handles,
            ..l2arc_fuse::ObjectFsOptions::default()
        },
    )?;
    let signals = crate::life::Signals::register(Arc::new(AtomicBool::new(false)))?;
    let session = l2arc_fuse::mount_objects(fs, &args.mnt, &mount_options(&args))
        .with_context(|| mount_failed(&uri, &args))?;
    eprintln!(
        "l2arc: mounted {uri} at {} (read-only: writes fail with EROFS; metadata trusted for {} s)",
        args.mnt.display(),
        ttl.as_secs_f64()
    );
    serve_until_stopped(session, &args, &signals, &uri, reloader)?;
    // Unmounted: no reader is left, so the ARC may go to flash.
    crate::stop::stop_cache(&cache, shape);
    crate::s3_opts::print_requests(&store);
    print_kstats(&cache);
    Ok(())
}
