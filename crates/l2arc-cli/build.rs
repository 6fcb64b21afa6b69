//! Stamps the binary with what it was built from, for `l2arc --version`:
//! the commit (`git rev-parse HEAD`), whether the files that go into it
//! (`crates/`, the workspace manifest and lock file) had uncommitted
//! changes then, and the profile (the engine's features are its own
//! `l2arc::FEATURES`). The same
//! approach as crates/l2arc-bench/build.rs: git when there is one, no
//! network, "unknown" from a tree without git.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    const INPUTS: [&str; 3] = ["../", "../../Cargo.toml", "../../Cargo.lock"];
    let commit = git(&["rev-parse", "HEAD"]).filter(|c| !c.is_empty());
    let mut status = vec!["status", "--porcelain", "--untracked-files=no", "--"];
    status.extend(INPUTS);
    let dirty = commit.is_some() && git(&status).is_some_and(|s| !s.is_empty());
    let commit = commit.unwrap_or_else(|| "unknown".to_string());
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=L2ARC_COMMIT={commit}{suffix}");
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".to_string());
    println!("cargo:rustc-env=L2ARC_PROFILE={profile}");
    // Again when the code changes or another commit is checked out.
    for input in INPUTS {
        println!("cargo:rerun-if-changed={input}");
    }
    for file in ["HEAD", "index"] {
        if let Some(path) = git(&["rev-parse", "--git-path", file]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(path) = git(&["rev-parse", "--git-path", &head])
        && Path::new(&path).exists()
    {
        println!("cargo:rerun-if-changed={path}");
    }
}
