//! Shell completions and man pages, generated from the CLI definition
//! itself (clap_complete, clap_mangen) so that they can never disagree with
//! the flags the binary takes. `l2arc completions SHELL` prints a script;
//! the hidden `l2arc manpages DIR` writes `l2arc.1` and one page per
//! subcommand (`l2arc-serve-nbd.1`, `l2arc-ctl-devices.1`, ...), which
//! scripts/install.sh and scripts/package.sh install.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Arguments of `l2arc completions`.
#[derive(Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to write the completion script for.
    shell: clap_complete::Shell,
}

/// Arguments of `l2arc manpages`.
#[derive(Args)]
pub(crate) struct ManpagesArgs {
    /// The directory to write the pages into (created if missing).
    dir: PathBuf,
}

/// Prints the completion script for `args.shell` on stdout. A closed pipe
/// (`| head`) ends it quietly, as every Unix filter does.
pub(crate) fn completions(args: CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<()> {
    let mut script = Vec::with_capacity(64 * 1024);
    clap_complete::generate(args.shell, &mut cmd, "l2arc", &mut script);
    assert!(!script.is_empty(), "clap_complete wrote no script");
    let mut out = std::io::stdout().lock();
    match out.write_all(&script).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing the completion script to stdout"),
    }
}

/// Writes a section-1 man page for `l2arc` and every visible subcommand
/// into `args.dir` and names each file written on stdout.
pub(crate) fn manpages(args: ManpagesArgs, cmd: clap::Command) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    clap_mangen::generate_to(cmd, &args.dir)
        .with_context(|| format!("writing man pages into {}", args.dir.display()))?;
    let mut names: Vec<String> = std::fs::read_dir(&args.dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("l2arc") && n.ends_with(".1"))
        .collect();
    names.sort();
    anyhow::ensure!(
        !names.is_empty(),
        "no man page written into {}",
        args.dir.display()
    );
    for name in names {
        println!("{}", args.dir.join(name).display());
    }
    Ok(())
}
