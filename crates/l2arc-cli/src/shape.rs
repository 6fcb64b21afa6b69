//! The ARC's shape across restarts, for every front end: restored (and
//! prewarmed) at start, checkpointed while running, saved at a clean stop.
//!
//! Where it lives. The checkpoint belongs with the cache device whose
//! records it names: by default the first cache device's path with `.arc`
//! appended, when that device is a regular file. A block device has no
//! directory beside it to write to, so then there is none unless
//! `--arc-checkpoint PATH` says where (the packaged units put it under
//! their StateDirectory), and the start line says so.
//!
//! When. The restore runs after the cache devices and the dataset are
//! added (it maps the saved datasets to them) and before the front end
//! serves; the prewarm runs in the background, and a thread prints its
//! done line. The save at stop runs after the front end drained and
//! after the stop's flush of DRAM to flash (`stop`), so that the shape
//! saved is the one the last reads left.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use l2arc::{ArcCheckpointer, Cache, RestoreError};
use l2arc_cli::service::ResolvedOptions;

/// The checkpoint of a running service: its path and its thread.
pub(crate) struct ShapeKeeper {
    path: Option<PathBuf>,
    checkpointer: Option<ArcCheckpointer>,
}

/// Where the checkpoint lives: the setting, else beside the first cache
/// device when it is a regular file.
fn checkpoint_path(resolved: &ResolvedOptions) -> Option<PathBuf> {
    if let Some(path) = &resolved.arc_checkpoint {
        return Some(path.clone());
    }
    let first = resolved.cache_devices.first()?;
    let is_file = std::fs::metadata(first).is_ok_and(|m| m.is_file());
    if !is_file {
        eprintln!(
            "l2arc: the ARC's shape is not kept across restarts: the first cache device {} is not a regular file; set --arc-checkpoint PATH (docs/operations.md)",
            first.display()
        );
        return None;
    }
    let mut path = first.clone().into_os_string();
    path.push(".arc");
    Some(PathBuf::from(path))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// Restores the ARC's shape (and starts the prewarm) and starts the
/// checkpoints; call after the cache devices and the dataset are added.
pub(crate) fn start(cache: &Arc<Cache>, resolved: &ResolvedOptions) -> ShapeKeeper {
    let Some(path) = checkpoint_path(resolved) else {
        return ShapeKeeper {
            path: None,
            checkpointer: None,
        };
    };
    restore(cache, &path, resolved.prewarm);
    let checkpointer = match cache.start_arc_checkpoints(&path, resolved.arc_checkpoint_secs) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!(
                "l2arc: ARC checkpoints to {}: {e}; saved at stop only",
                path.display()
            );
            None
        }
    };
    ShapeKeeper {
        path: Some(path),
        checkpointer,
    }
}

fn restore(cache: &Arc<Cache>, path: &Path, prewarm: bool) {
    match cache.restore_arc_shape(path, prewarm) {
        Ok(r) if r.prewarm_started => {
            eprintln!(
                "l2arc: prewarm: {} records ({:.1} MiB) of {} saved {} s ago",
                r.records,
                mib(r.resident_bytes),
                path.display(),
                r.age_secs
            );
            let weak = Arc::downgrade(cache);
            let spawned = std::thread::Builder::new()
                .name("l2arc-prewarm-log".into())
                .spawn(move || report_when_done(weak));
            if let Err(e) = spawned {
                eprintln!("l2arc: prewarm: no thread to report its end: {e}");
            }
        }
        Ok(r) => eprintln!(
            "l2arc: ARC shape of {} restored ({} ghosts, saved {} s ago); prewarm {}",
            path.display(),
            r.ghosts,
            r.age_secs,
            if prewarm {
                "has nothing to read"
            } else {
                "off (l2arc_prewarm)"
            }
        ),
        Err(RestoreError::Missing) => eprintln!(
            "l2arc: no ARC checkpoint at {} yet: the ARC starts cold",
            path.display()
        ),
        Err(e) => eprintln!(
            "l2arc: ARC checkpoint {}: {e}; the ARC starts cold",
            path.display()
        ),
    }
}

/// Prints the prewarm's done line once it ends (or the cache goes away).
fn report_when_done(weak: std::sync::Weak<Cache>) {
    loop {
        let Some(cache) = weak.upgrade() else { return };
        if cache.wait_for_prewarm(Duration::from_millis(200)) {
            let s = cache.stats().shape;
            eprintln!(
                "l2arc: prewarm: done: {} records ({:.1} MiB) in {} ms, {} stale, {} not on flash, {} joined by demand reads",
                s.prewarm_records,
                mib(s.prewarm_bytes),
                s.prewarm_ms,
                s.prewarm_stale,
                s.prewarm_missing,
                s.prewarm_joined
            );
            return;
        }
    }
}

/// Saves the ARC's shape at a clean stop (after the front end drained):
/// the checkpoints stop first, then one last save.
pub(crate) fn save_at_stop(keeper: ShapeKeeper, cache: &Cache) {
    let ShapeKeeper { path, checkpointer } = keeper;
    drop(checkpointer);
    let Some(path) = path else { return };
    match cache.save_arc_shape(&path) {
        Ok(Some(s)) => eprintln!(
            "l2arc: stopping: saved the ARC's shape ({} records, {} KiB) to {}",
            s.records,
            s.file_bytes.div_ceil(1024),
            path.display()
        ),
        Ok(None) => eprintln!(
            "l2arc: stopping: the prewarm had not finished: the ARC's shape in {} is kept as it was",
            path.display()
        ),
        Err(e) => eprintln!(
            "l2arc: stopping: could not save the ARC's shape to {}: {e}",
            path.display()
        ),
    }
}
