//! Stamps the binary with the commit it is built from: `git rev-parse
//! HEAD` of the tree, and whether `crates/` had uncommitted changes then
//! (the code that goes into it). Every `--json` report carries both.

include!("../git_stamp.rs");

fn main() {
    let (commit, dirty) = git_stamp(&["../"]);
    println!("cargo:rustc-env=L2ARC_BENCH_COMMIT={commit}");
    println!("cargo:rustc-env=L2ARC_BENCH_DIRTY={dirty}");
}
