//! `l2arc mount SRC MNT` (being built).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use crate::service::CacheOptions;

#[derive(Args, Debug)]
pub struct MountArgs {
    /// Directory tree to serve.
    pub src: PathBuf,
    /// Mount point.
    pub mnt: PathBuf,
    #[command(flatten)]
    pub cache: CacheOptions,
}

pub fn run(args: MountArgs) -> Result<()> {
    let _ = args.cache.resolve(128 << 10)?;
    bail!("mount is not built yet")
}
