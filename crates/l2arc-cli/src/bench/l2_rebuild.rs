//! Placeholder: being written.

use anyhow::{Result, bail};

use super::BenchArgs;

pub fn run(_args: &BenchArgs) -> Result<()> {
    bail!("this scenario is not built yet")
}
