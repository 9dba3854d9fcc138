//! The flags the trace commands (`replay`, `tune`, `report`, `map`) share, with one meaning
//! each.
use clap::Args;
use gpumem::trace::{ReadConfig, Trace, TraceError};

/// Flags of every trace command.
#[derive(Args, Clone, Copy, Debug)]
pub struct TraceArgs {
    /// Device capacity (e.g. 80GiB, 141GB; K/M/G/T alone are binary like KiB/MiB/GiB/TiB,
    /// KB/MB/GB/TB decimal, a bare number is bytes; default: the H200's 139.8 GiB as
    /// cuMemGetInfo reports it). Allocations that still do not fit after the pool released
    /// its cache count as OOMs and are dropped (with their frees); it is also the torch
    /// emulation's memory limit (as `torch.cuda.set_per_process_memory_fraction` sets it),
    /// under which `tune` tries the garbage_collection_threshold settings too.
    // A negative-looking size reaches parse_size, which says why it is refused.
    #[arg(long, value_parser = crate::units::parse_positive_size, allow_hyphen_values = true)]
    pub capacity: Option<u64>,
    /// Skip and count malformed events instead of stopping at the first; salvage a truncated
    /// snapshot (the events read before the cut are kept).
    #[arg(long)]
    pub lenient: bool,
}

impl TraceArgs {
    /// Reads the trace at `path` (`-`: stdin) as these flags ask: `--lenient` or not, no
    /// frames kept.
    ///
    /// # Errors
    /// As [`gpumem::trace::read_path`].
    pub fn read(&self, path: &std::path::Path) -> Result<Trace, TraceError> {
        gpumem::trace::read_path(
            path,
            ReadConfig {
                lenient: self.lenient,
                ..ReadConfig::default()
            },
        )
    }
}
