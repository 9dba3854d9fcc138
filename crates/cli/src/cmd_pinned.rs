//! `gpumem bench transfer`, `bench pinned`, `advise` (pinned host memory). STUB.
use anyhow::{bail, Result};
use clap::Args;

/// Arguments of `gpumem bench transfer`.
#[derive(Args)]
pub struct BenchTransferArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}
/// Arguments of `gpumem bench pinned`.
#[derive(Args)]
pub struct BenchPinnedArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}
/// Arguments of `gpumem advise`.
#[derive(Args)]
pub struct AdviseArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn bench_transfer(_a: BenchTransferArgs) -> Result<()> {
    bail!("not implemented yet")
}
pub fn bench_pinned(_a: BenchPinnedArgs) -> Result<()> {
    bail!("not implemented yet")
}
pub fn advise(_a: AdviseArgs) -> Result<()> {
    bail!("not implemented yet")
}
