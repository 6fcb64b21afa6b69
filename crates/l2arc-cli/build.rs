//! Stamps the binary with what it was built from, for `l2arc --version`:
//! the commit (`git rev-parse HEAD`), whether the files that go into it
//! (`crates/`, the workspace manifest and lock file) had uncommitted
//! changes then, and the profile (the engine's features are its own
//! `l2arc::FEATURES`). The commit comes from crates/git_stamp.rs, shared
//! with the bench's build script.

include!("../git_stamp.rs");

fn main() {
    let (commit, dirty) = git_stamp(&["../", "../../Cargo.toml", "../../Cargo.lock"]);
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=L2ARC_COMMIT={commit}{suffix}");
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".to_string());
    println!("cargo:rustc-env=L2ARC_PROFILE={profile}");
}
