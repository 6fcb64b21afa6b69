//! `l2arc serve-nbd IMAGE` (being built).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use crate::service::CacheOptions;

#[derive(Args, Debug)]
pub struct ServeNbdArgs {
    /// Image file or block device to export.
    pub image: PathBuf,
    #[command(flatten)]
    pub cache: CacheOptions,
}

pub fn run(args: ServeNbdArgs) -> Result<()> {
    let _ = args.cache.resolve(64 << 10)?;
    bail!("serve-nbd is not built yet")
}
