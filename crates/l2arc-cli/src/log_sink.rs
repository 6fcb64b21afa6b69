//! Where the library's log lines go: standard error, one line each.
//!
//! The engine and the front ends report events that happen while a
//! service runs (a client turned away, an image changed behind an export)
//! through the `log` facade, so that a library user routes them where
//! their program logs; the `l2arc` command prints them as it prints its
//! other lines (`l2arc: ...`), warnings and errors marked as such, so a
//! service manager's journal keeps them beside the ready and stop lines.

use std::io::Write;

struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Info
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let kind = match record.level() {
            log::Level::Error => "error: ",
            log::Level::Warn => "warning: ",
            _ => "",
        };
        // One write per line: lines of several threads never interleave.
        let line = format!("l2arc: {kind}{}\n", record.args());
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

static STDERR: Stderr = Stderr;

/// Sends the library's log lines to standard error (once per process).
pub fn install() {
    if log::set_logger(&STDERR).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}
