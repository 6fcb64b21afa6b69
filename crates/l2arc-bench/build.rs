//! Stamps the binary with the commit it is built from: `git rev-parse
//! HEAD` of the tree, and whether `crates/` had uncommitted changes then
//! (the code that goes into it). Every `--json` report carries both.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "HEAD"]).filter(|c| !c.is_empty());
    let dirty = commit.is_some()
        && git(&["status", "--porcelain", "--untracked-files=no", "--", "../"])
            .is_some_and(|s| !s.is_empty());
    println!(
        "cargo:rustc-env=L2ARC_BENCH_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    println!("cargo:rustc-env=L2ARC_BENCH_DIRTY={dirty}");
    // Again when the code changes or another commit is checked out.
    println!("cargo:rerun-if-changed=../");
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
