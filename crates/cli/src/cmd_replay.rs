//! `gpumem replay`. STUB.
use anyhow::{bail, Result};
use clap::Args;

/// Arguments of `gpumem replay`.
#[derive(Args)]
pub struct ReplayArgs {
    /// The trace file.
    pub trace: std::path::PathBuf,
}

pub fn run(_a: ReplayArgs) -> Result<()> {
    bail!("not implemented yet")
}
