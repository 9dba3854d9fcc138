//! `gpumem info`, `inspect`, `vmm`, `bench alloc` (CUDA backend). STUB.
use anyhow::{bail, Result};
use clap::Args;

/// Arguments of `gpumem info`.
#[derive(Args)]
pub struct InfoArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}
/// Arguments of `gpumem inspect`.
#[derive(Args)]
pub struct InspectArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}
/// Arguments of `gpumem vmm`.
#[derive(Args)]
pub struct VmmArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}
/// Arguments of `gpumem bench alloc`.
#[derive(Args)]
pub struct BenchAllocArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn info(_a: InfoArgs) -> Result<()> {
    bail!("not implemented yet")
}
pub fn inspect(_a: InspectArgs) -> Result<()> {
    bail!("not implemented yet")
}
pub fn vmm(_a: VmmArgs) -> Result<()> {
    bail!("not implemented yet")
}
pub fn bench_alloc(_a: BenchAllocArgs) -> Result<()> {
    bail!("not implemented yet")
}

/// Opens CUDA device `ordinal` for `gpumem replay --device cuda:N` (capacity is ignored:
/// the real device has its own). STUB until the CUDA backend lands.
pub fn open_replay_device(ordinal: usize, _capacity: u64) -> Result<Box<dyn gpumem::core::Device>> {
    bail!("CUDA device {ordinal}: the CUDA backend is not built yet; use --device sim")
}
