//! Every lock of the engine has a place in the written lock order.
//!
//! `lock_order.rs` checks the order of the locks it wraps; a lock taken
//! from `std::sync` directly would escape the check. This test reads the
//! engine's sources and fails on any `std::sync` lock outside
//! `lock_order.rs` and the unit tests at the end of a file.

use std::path::Path;

fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("read the engine's sources") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            out.push((path.display().to_string(), text));
        }
    }
}

/// The lines of `text` before its `#[cfg(test)]` module, comments left out.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, line)| line.trim() != "#[cfg(test)]")
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
}

fn unranked_locks(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in code_lines(text) {
        for lock in ["Mutex", "RwLock", "Condvar"] {
            let mut rest = line;
            while let Some(at) = rest.find(lock) {
                let before = &rest[..at];
                let after = &rest[at + lock.len()..];
                let word_start = !before.ends_with(|c: char| c.is_alphanumeric() || c == '_');
                let word_end = !after.starts_with(|c: char| c.is_alphanumeric() || c == '_');
                if word_start && word_end {
                    found.push((n + 1, line.trim().to_string()));
                }
                rest = after;
            }
        }
    }
    found
}

#[test]
fn the_scan_finds_a_raw_lock_and_ignores_ranked_ones_comments_and_tests() {
    let text = "use std::sync::Mutex;\n\
                // a Mutex in a comment\n\
                struct A { x: RankedMutex<u8, 1>, y: RankedCondvar }\n\
                #[cfg(test)]\n\
                mod tests { use std::sync::RwLock; }\n";
    let found = unranked_locks(text);
    assert_eq!(found, vec![(1, "use std::sync::Mutex;".to_string())]);
}

#[test]
fn every_engine_lock_is_ranked() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(files.len() > 20, "the engine's sources were not found");
    let mut raw = Vec::new();
    for (path, text) in &files {
        if path.ends_with("lock_order.rs") {
            continue;
        }
        for (line, code) in unranked_locks(text) {
            raw.push(format!("{path}:{line}: {code}"));
        }
    }
    assert!(
        raw.is_empty(),
        "locks outside the lock order (use lock_order::RankedMutex, RankedRwLock, RankedCondvar):\n{}",
        raw.join("\n")
    );
}
