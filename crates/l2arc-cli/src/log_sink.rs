//! Where the library's log lines go: standard error, one line each, with
//! the priority journald understands when standard error is the journal.
//!
//! The engine and the front ends report events that happen while a
//! service runs (a client turned away, an image changed behind an export)
//! through the `log` facade, so that a library user routes them where
//! their program logs; the `l2arc` command prints them as it prints its
//! other lines (`l2arc: ...`), so a service manager's journal keeps them
//! beside the ready and stop lines. Under systemd, standard error is a
//! stream to journald and `JOURNAL_STREAM` names it (`dev:ino`); a line
//! then starts with sd-daemon(3)'s `<N>` prefix (`<3>` error, `<4>`
//! warning, `<6>` info, `<7>` debug), which journald turns into the
//! entry's priority (`journalctl -p warning` finds it), instead of the
//! words `error:`/`warning:` a terminal reader needs. The level is the
//! `log_level` setting (error, warn, info, debug), changeable on reload.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

struct Stderr {
    /// Standard error is the journal (checked once, at install).
    journal: AtomicBool,
}

impl log::Log for Stderr {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let journal = self.journal.load(Ordering::Relaxed);
        let line = format_line(record.level(), journal, &record.args().to_string());
        // One write per line: lines of several threads never interleave.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

static STDERR: Stderr = Stderr {
    journal: AtomicBool::new(false),
};

/// One log line as written: `<N>l2arc: ...` for the journal, `l2arc:
/// error: ...` on a terminal; several lines of one message each get the
/// prefix (journald reads line by line).
pub fn format_line(level: log::Level, journal: bool, message: &str) -> String {
    let mut out = String::with_capacity(message.len() + 16);
    for line in message.lines() {
        if journal {
            let priority = match level {
                log::Level::Error => 3,
                log::Level::Warn => 4,
                log::Level::Info => 6,
                log::Level::Debug | log::Level::Trace => 7,
            };
            out.push_str(&format!("<{priority}>l2arc: {line}\n"));
        } else {
            let kind = match level {
                log::Level::Error => "error: ",
                log::Level::Warn => "warning: ",
                _ => "",
            };
            out.push_str(&format!("l2arc: {kind}{line}\n"));
        }
    }
    debug_assert!(message.is_empty() || out.ends_with('\n'));
    out
}

/// Whether standard error is the stream `JOURNAL_STREAM` (`dev:ino`) names.
fn stderr_is_journal() -> bool {
    use std::os::fd::AsRawFd;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    // SAFETY: a stat buffer of zeros is a valid one (plain integers).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes the stat buffer it is given.
    if unsafe { libc::fstat(std::io::stderr().as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    dev.parse::<u64>().ok() == Some(st.st_dev) && ino.parse::<u64>().ok() == Some(st.st_ino)
}

/// Sends the library's log lines to standard error (once per process),
/// at level info.
pub fn install() {
    STDERR.journal.store(stderr_is_journal(), Ordering::Relaxed);
    if log::set_logger(&STDERR).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}

/// Sets the level lines are written from (`log_level`).
pub fn set_level(level: log::LevelFilter) {
    log::set_max_level(level);
}

/// A `log_level` value: error, warn, info or debug.
pub fn parse_level(s: &str) -> Result<log::LevelFilter, String> {
    match s {
        "error" => Ok(log::LevelFilter::Error),
        "warn" | "warning" => Ok(log::LevelFilter::Warn),
        "info" => Ok(log::LevelFilter::Info),
        "debug" => Ok(log::LevelFilter::Debug),
        _ => Err(format!(
            "`{s}` is not a log level: expected error, warn, info or debug"
        )),
    }
}

/// Writes one line at `level` as the log does, whatever the logger (the
/// CLI's own lines: reload, summaries).
pub fn line(level: log::Level, message: &str) {
    if level > log::max_level() {
        return;
    }
    let journal = STDERR.journal.load(Ordering::Relaxed);
    let _ = std::io::stderr()
        .lock()
        .write_all(format_line(level, journal, message).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_lines_carry_the_priority_and_terminal_lines_the_word() {
        use log::Level::*;
        assert_eq!(format_line(Error, true, "x"), "<3>l2arc: x\n");
        assert_eq!(format_line(Warn, true, "x"), "<4>l2arc: x\n");
        assert_eq!(format_line(Info, true, "x"), "<6>l2arc: x\n");
        assert_eq!(format_line(Debug, true, "x"), "<7>l2arc: x\n");
        assert_eq!(format_line(Error, false, "x"), "l2arc: error: x\n");
        assert_eq!(format_line(Warn, false, "x"), "l2arc: warning: x\n");
        assert_eq!(format_line(Info, false, "x"), "l2arc: x\n");
        assert_eq!(
            format_line(Warn, true, "a\nb"),
            "<4>l2arc: a\n<4>l2arc: b\n"
        );
        assert_eq!(parse_level("debug"), Ok(log::LevelFilter::Debug));
        assert!(
            parse_level("loud")
                .unwrap_err()
                .contains("error, warn, info or debug")
        );
    }
}
