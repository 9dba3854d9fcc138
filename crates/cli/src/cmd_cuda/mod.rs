//! `gpumem info`, `inspect`, `vmm`, `bench alloc`: the CUDA backend's commands. Each takes
//! `--device sim|cuda|cuda:N|all`; without a CUDA driver the CUDA choices fail with a clear
//! error pointing at `--device sim`.
//!
//! One file per subcommand: `info.rs`, `inspect.rs`, `vmm.rs`, `bench_alloc.rs`; what they
//! share is here.
use anyhow::Result;
use gpumem::cuda::{self, DeviceSel};

mod bench_alloc;
mod info;
mod inspect;
mod vmm;

pub use bench_alloc::{bench_alloc, BenchAllocArgs};
pub use info::{info, InfoArgs};
pub use inspect::{inspect, InspectArgs};
pub use vmm::{vmm, VmmArgs};

/// "yes" or "no", for tables.
pub(crate) fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

pub(crate) fn ordinals(sel: DeviceSel) -> Result<Vec<usize>> {
    Ok(sel.ordinals()?)
}

// ---------------------------------------------------------------- info

/// Opens CUDA device `ordinal` for `gpumem replay --device cuda:N`, limited to `capacity`
/// bytes (or the device's own memory if smaller), so OOM points match the trace's device.
pub fn open_replay_device(ordinal: usize, capacity: u64) -> Result<Box<dyn gpumem::core::Device>> {
    let dev = cuda::open(ordinal)?;
    Ok(Box::new(gpumem::core::adaptor::Capped::new(dev, capacity)))
}
