//! Building allocators by name.
use crate::Allocator;

/// Names accepted by [`build`], in report order.
pub const NAMES: [&str; 5] = ["buddy", "tlsf", "best-fit", "torch", "paged"];

/// Settings shared by the allocators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Bytes a segmented pool (buddy, tlsf, best-fit) reserves per segment when a request
    /// is smaller (the seed's 256 MiB pre-allocated pool).
    pub segment_bytes: u64,
    /// Smallest block of the buddy system, in bytes (256).
    pub min_block_bytes: u64,
    /// Free physical pages the `paged` strategy keeps cached before releasing them.
    pub page_cache_pages: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            segment_bytes: 256 << 20,
            min_block_bytes: 256,
            page_cache_pages: 1024,
        }
    }
}

/// An unknown allocator name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown allocator `{0}`: expected one of buddy, tlsf, best-fit, torch, paged, or all")]
pub struct UnknownAllocator(pub String);

/// Builds the allocator called `name` (see [`NAMES`]).
///
/// # Errors
/// [`UnknownAllocator`] for any other name.
pub fn build(name: &str, config: &Config) -> Result<Box<dyn Allocator>, UnknownAllocator> {
    Ok(match name {
        "buddy" => Box::new(crate::segmented::SegmentedPool::buddy(config)),
        "tlsf" => Box::new(crate::segmented::SegmentedPool::tlsf(config)),
        "best-fit" | "bestfit" | "best_fit" => {
            Box::new(crate::segmented::SegmentedPool::best_fit(config))
        }
        "torch" => Box::new(crate::torch::TorchCaching::new(config)),
        "paged" => Box::new(crate::paged::Paged::new(config)),
        other => return Err(UnknownAllocator(other.to_string())),
    })
}

/// Parses a comma-separated list (`tlsf,paged` or `all`) into names.
///
/// # Errors
/// [`UnknownAllocator`] naming the first unknown entry.
pub fn parse_list(list: &str) -> Result<Vec<&'static str>, UnknownAllocator> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if part == "all" {
            out.extend(NAMES);
            continue;
        }
        let canon = match part {
            "bestfit" | "best_fit" => "best-fit",
            p => p,
        };
        match NAMES.iter().find(|n| **n == canon) {
            Some(n) => out.push(*n),
            None => return Err(UnknownAllocator(part.to_string())),
        }
    }
    out.dedup();
    if out.is_empty() {
        return Err(UnknownAllocator(list.to_string()));
    }
    Ok(out)
}
