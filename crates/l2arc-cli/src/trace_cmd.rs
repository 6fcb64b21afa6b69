//! `l2arc trace`: replay a trace through the policies at several sizes.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use l2arc_sim::{
    PolicyName, TraceFormat, format_table, load_trace, parse_policy_list, parse_size_list,
    replay_many,
};

#[derive(Args)]
pub(crate) struct TraceArgs {
    /// Trace file (`.zst` is decompressed on the fly).
    file: PathBuf,
    /// lis (ARC paper page traces), oracle (libCacheSim oracleGeneral), csv (`key[,size]`), txt (`key [size]`).
    #[arg(long, value_parser = parse_format)]
    format: Option<TraceFormat>,
    /// Comma-separated policies: arc, lru, min.
    #[arg(long, default_value = "arc,lru,min")]
    policy: String,
    /// Comma-separated cache sizes: pages for page traces, bytes (with K/M/G, KiB/MiB/GiB) for sized traces.
    #[arg(long)]
    sizes: String,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_format(s: &str) -> Result<TraceFormat, String> {
    s.parse::<TraceFormat>().map_err(|e| e.to_string())
}

pub(crate) fn run(args: TraceArgs) -> Result<()> {
    let format = match args.format {
        Some(f) => f,
        None => TraceFormat::from_path(&args.file).with_context(|| {
            format!(
                "cannot tell the format of {} from its name: pass --format lis|oracle|csv|txt",
                args.file.display()
            )
        })?,
    };
    let policies: Vec<PolicyName> =
        parse_policy_list(&args.policy).map_err(|e| anyhow::anyhow!("--policy: {e}"))?;
    let sizes = parse_size_list(&args.sizes).map_err(|e| anyhow::anyhow!("--sizes: {e}"))?;
    // The OS error once, with the path (the loader's own message repeats it).
    std::fs::File::open(&args.file)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", args.file.display()))?;
    let trace = load_trace(&args.file, format)?;
    anyhow::ensure!(
        !trace.is_empty(),
        "{}: the trace holds no requests",
        args.file.display()
    );
    let results = replay_many(&trace, &policies, &sizes);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print!("{}", format_table(&results));
    }
    Ok(())
}
