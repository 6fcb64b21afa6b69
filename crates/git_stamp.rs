// The commit a binary is built from, for the build scripts that stamp it
// (`include!`d by crates/l2arc-cli/build.rs and crates/l2arc-bench/build.rs;
// a build script cannot share a module any other way without a crate of
// its own). git when there is one, no network, "unknown" without git.

/// `git ARGS` run in the crate's directory: its trimmed stdout on success.
fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The commit (`git rev-parse HEAD`, "unknown" without git) and whether
/// `inputs` (paths relative to the crate) had uncommitted changes; asks
/// cargo to run the build script again when they change or another commit
/// is checked out.
fn git_stamp(inputs: &[&str]) -> (String, bool) {
    let commit = git(&["rev-parse", "HEAD"]).filter(|c| !c.is_empty());
    let mut status = vec!["status", "--porcelain", "--untracked-files=no", "--"];
    status.extend(inputs);
    let dirty = commit.is_some() && git(&status).is_some_and(|s| !s.is_empty());
    for input in inputs {
        println!("cargo:rerun-if-changed={input}");
    }
    for file in ["HEAD", "index"] {
        if let Some(path) = git(&["rev-parse", "--git-path", file]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(path) = git(&["rev-parse", "--git-path", &head])
        && std::path::Path::new(&path).exists()
    {
        println!("cargo:rerun-if-changed={path}");
    }
    (commit.unwrap_or_else(|| "unknown".to_string()), dirty)
}
