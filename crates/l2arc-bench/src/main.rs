//! `l2arc-bench`: the benchmarks (also run as `l2arc bench`).
//!
//! Errors are printed as one line (`l2arc-bench: <what went wrong>`) with a
//! nonzero exit, like the `l2arc` command's.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "l2arc-bench",
    version,
    about = "Benchmark the l2arc cache against its baselines and peers, side by side in one run",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: l2arc_bench::BenchArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Regenerate the benchmarks table in docs/benchmarks.md from the
    /// committed reports (run from the repository's root).
    Table {
        /// The reports: one <scenario>.json per scenario, each listing its runs.
        #[arg(long, default_value = "docs/benchmarks/reports")]
        reports: PathBuf,
        /// The Markdown file whose generated table is replaced.
        #[arg(long, default_value = "docs/benchmarks.md")]
        doc: PathBuf,
        /// Only check that the file's table is the one the reports make.
        #[arg(long)]
        check: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Table {
            reports,
            doc,
            check,
        }) => l2arc_bench::table::run(&doc, &reports, check),
        None => l2arc_bench::run(cli.args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("l2arc-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
