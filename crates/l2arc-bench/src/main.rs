//! `l2arc-bench`: the benchmarks (also run as `l2arc bench`).
//!
//! Errors are printed as one line (`l2arc-bench: <what went wrong>`) with a
//! nonzero exit, like the `l2arc` command's.

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "l2arc-bench",
    version,
    about = "Benchmark the l2arc cache against its baselines and peers, side by side in one run"
)]
struct Cli {
    #[command(flatten)]
    args: l2arc_bench::BenchArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match l2arc_bench::run(cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("l2arc-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
