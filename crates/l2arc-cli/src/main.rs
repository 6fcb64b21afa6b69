//! The `l2arc` command.
//!
//! Every subcommand is a thin shell over the engine's public API: parse
//! arguments, call the library, print. Errors are printed as one line
//! (`l2arc: <what went wrong>`) with a nonzero exit, never as a panic or a
//! backtrace: a storage tool's users script it and read its logs. A
//! reader that closes the output early (`l2arc stat 1 | head -2`) ends a
//! command quietly with success, as it does any Unix filter.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod events;
mod gen_cmd;
mod iostat;
mod life;
mod mount_cmd;
mod nbd_cmd;
mod notify;
mod reload;
mod s3_opts;
mod shape;
mod shared_gc;
mod stat;
mod stop;
mod trace_cmd;

// The decoders of outside bytes live in the library (fuzzed there).
use l2arc_cli::{control, service};

/// `l2arc --version`: the version, the commit it was built from (`-dirty`
/// with uncommitted changes, stamped by build.rs), the engine's features
/// compiled in, and the profile.
fn long_version() -> String {
    let features: Vec<&str> = l2arc::FEATURES
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| *name)
        .collect();
    format!(
        "{}\ncommit: {}\nfeatures: {}\nprofile: {}",
        env!("CARGO_PKG_VERSION"),
        env!("L2ARC_COMMIT"),
        if features.is_empty() {
            "none".to_string()
        } else {
            features.join(",")
        },
        env!("L2ARC_PROFILE"),
    )
}

#[derive(Parser)]
#[command(
    name = "l2arc",
    version,
    about = "The ZFS ARC and L2ARC read cache, in front of any slow storage"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a block trace through ARC, LRU and Belady's MIN and print hit ratios.
    Trace(trace_cmd::TraceArgs),
    /// Benchmarks, side by side with baselines and peers (runs the l2arc-bench binary beside this one; `l2arc bench --help` lists them).
    #[command(disable_help_flag = true)]
    Bench {
        /// Arguments for l2arc-bench.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Mount a directory tree through the cache (FUSE): reads cached, writes passed through.
    Mount(mount_cmd::MountArgs),
    /// Export an image file or block device through the cache over NBD.
    ServeNbd(nbd_cmd::ServeNbdArgs),
    /// Talk to a running mount or serve-nbd through its --control socket: stats, cache devices.
    Ctl(control::CtlArgs),
    /// arcstat for a running mount or serve-nbd: one line of rates per interval (`l2arc stat -S SOCK 1 10`).
    Stat(stat::StatArgs),
    /// zpool iostat for a running mount or serve-nbd: operations, bandwidth and latency per cache device and primary storage (`l2arc iostat -S SOCK -v -l 1`).
    Iostat(iostat::IostatArgs),
    /// Keep a fleet's shared cache bucket bounded: `l2arc shared-cache gc s3://BUCKET/PREFIX --max-size 2TiB` deletes the oldest blocks.
    SharedCache(shared_gc::SharedCacheArgs),
    /// Print the shell completion script for bash, zsh or fish (`l2arc completions bash > /etc/bash_completion.d/l2arc`).
    Completions(gen_cmd::CompletionsArgs),
    /// Write the man pages (l2arc.1 and one per subcommand) into a directory.
    #[command(hide = true)]
    Manpages(gen_cmd::ManpagesArgs),
}

/// `l2arc bench ARGS` is `l2arc-bench ARGS`: the benchmarks and their
/// peers (foyer, its tokio runtime) live in their own crate and binary, so
/// that this one does not carry them.
fn run_bench(args: &[std::ffi::OsString]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let bench = exe.with_file_name("l2arc-bench");
    if !bench.is_file() {
        anyhow::bail!(
            "bench needs the l2arc-bench binary beside this one ({}): cargo build --release -p l2arc-bench",
            bench.display()
        );
    }
    // exec only returns on failure.
    let e = std::process::Command::new(&bench).args(args).exec();
    Err(anyhow::anyhow!("cannot run {}: {e}", bench.display()))
}

fn main() -> ExitCode {
    use clap::FromArgMatches;
    // Built once per run; clap keeps `&'static str`s.
    let version: &'static str = Box::leak(long_version().into_boxed_str());
    let matches = Cli::command().long_version(version).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    l2arc_cli::log_sink::install();
    let result = match cli.command {
        Command::Trace(args) => trace_cmd::run(args),
        Command::Bench { args } => run_bench(&args),
        Command::Mount(args) => mount_cmd::run(args),
        Command::ServeNbd(args) => nbd_cmd::run(args),
        Command::Ctl(args) => control::run(args),
        Command::Stat(args) => stat::run(args),
        Command::Iostat(args) => iostat::run(args),
        Command::SharedCache(args) => shared_gc::run(args),
        Command::Completions(args) => gen_cmd::completions(args, Cli::command()),
        Command::Manpages(args) => gen_cmd::manpages(args, Cli::command()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<control::OutputClosed>() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("l2arc: {e:#}");
            ExitCode::FAILURE
        }
    }
}
