//! Errors logged as rate-limited summaries, from the counters.
//!
//! A failing device fails every read of it: a line per event would flood
//! the journal (1,002 checksum errors in 10 s) and hide everything else,
//! and no line at all (as before) leaves an operator who reads the log
//! blind. So nothing on the I/O paths logs its errors; a thread samples
//! the counters every `SUMMARY_INTERVAL` and writes one line per error
//! class that grew ("cache device 0: 1002 checksum errors in the last
//! 10 s"), and nothing when none did. The arithmetic is pure, on two
//! samples, and unit-tested.

use std::collections::BTreeMap;
use std::time::Duration;

/// How often the counters are sampled and summarised.
pub(crate) const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// Error counters at one instant, keyed by (subject, what): ("cache
/// device 0", "checksum errors").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ErrorSample(BTreeMap<(String, &'static str), u64>);

impl ErrorSample {
    /// Notes one counter.
    pub(crate) fn add(&mut self, subject: &str, what: &'static str, count: u64) {
        *self.0.entry((subject.to_string(), what)).or_default() += count;
    }

    /// The error counters of a cache: per device (checksum, I/O and write
    /// errors) and of primary storage.
    pub(crate) fn of_cache(cache: &l2arc::Cache) -> Self {
        let stats = cache.stats();
        let mut sample = Self::default();
        sample.add("primary storage", "read errors", stats.primary_errors);
        for device in stats.l2.iter().flat_map(|l2| &l2.devices) {
            let subject = format!("cache device {}", device.slot);
            for (name, value) in &device.kstats {
                let what = match *name {
                    "l2_cksum_bad" => "checksum errors",
                    "l2_io_error" => "I/O errors",
                    "l2_writes_error" => "write errors",
                    _ => continue,
                };
                sample.add(&subject, what, *value);
            }
        }
        sample
    }
}

/// One line per counter that grew from `before` to `now` (a counter that
/// is new counts from 0; one that fell, a device replaced in its slot,
/// counts from 0 too).
pub(crate) fn summarise(
    before: &ErrorSample,
    now: &ErrorSample,
    interval: Duration,
) -> Vec<String> {
    let secs = interval.as_secs_f64().round() as u64;
    let lines: Vec<String> = now
        .0
        .iter()
        .filter_map(|(key, &count)| {
            let was = before.0.get(key).copied().unwrap_or(0);
            let grew = if count >= was { count - was } else { count };
            (grew > 0).then(|| format!("{}: {grew} {} in the last {secs} s", key.0, key.1))
        })
        .collect();
    debug_assert!(lines.len() <= now.0.len());
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_class_that_grew_and_none_when_quiet() {
        let mut before = ErrorSample::default();
        before.add("cache device 0", "checksum errors", 10);
        before.add("primary storage", "read errors", 3);
        let mut now = before.clone();
        assert!(summarise(&before, &now, SUMMARY_INTERVAL).is_empty());
        now = ErrorSample::default();
        now.add("cache device 0", "checksum errors", 1012);
        now.add("primary storage", "read errors", 3);
        now.add("nbd", "protocol errors", 2);
        let lines = summarise(&before, &now, SUMMARY_INTERVAL);
        assert_eq!(
            lines,
            [
                "cache device 0: 1002 checksum errors in the last 10 s",
                "nbd: 2 protocol errors in the last 10 s",
            ]
        );
        // A counter that fell (a new device in the slot) counts from 0.
        let mut fresh = ErrorSample::default();
        fresh.add("cache device 0", "checksum errors", 4);
        let lines = summarise(&now, &fresh, SUMMARY_INTERVAL);
        assert_eq!(
            lines,
            ["cache device 0: 4 checksum errors in the last 10 s"]
        );
    }
}
