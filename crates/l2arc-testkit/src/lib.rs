//! What several test suites of the workspace need alike, kept in one place
//! so that a message or a rule changes once: where the reference traces
//! are (and the one clear failure when they are not), and what a command's
//! error must look like to a user (one line, prefixed with the program's
//! name, no panic or backtrace). A dev-dependency only.

use std::path::{Path, PathBuf};
use std::process::Output;

/// A reference trace from `shared/traces/` beside the repository. Fails the
/// test with a message that says where it was looked for, never skips.
pub fn reference_trace(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "reference trace {} is missing: this repository must be checked out \
         beside shared/ (shared/traces/{name}); see shared/traces/README.md",
        path.display()
    );
    path
}

/// A failed command printed exactly one line, `PROGRAM: ...` containing
/// `must_contain`, with no panic or backtrace, and exited nonzero.
pub fn assert_one_line_error(out: &Output, program: &str, must_contain: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert_eq!(
        stderr.lines().count(),
        1,
        "expected one line of error, got: {stderr:?}"
    );
    assert!(
        stderr.starts_with(&format!("{program}: ")),
        "error not prefixed with {program}: {stderr:?}"
    );
    assert!(
        stderr.contains(must_contain),
        "error {stderr:?} lacks {must_contain:?}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
}
