//! Building allocators by name.
use crate::config::AllocatorConfig;
use crate::Allocator;

/// Names accepted by [`build`], in report order.
pub const NAMES: [&str; 6] = ["buddy", "tlsf", "best-fit", "torch", "paged", "paged-lazy"];

/// An unknown allocator name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown allocator `{0}`: expected one of buddy, tlsf, best-fit, torch, paged, paged-lazy, or all")]
pub struct UnknownAllocator(pub String);

/// Builds the allocator called `name` (see [`NAMES`]).
///
/// # Errors
/// [`UnknownAllocator`] for any other name.
pub fn build(name: &str, config: &AllocatorConfig) -> Result<Box<dyn Allocator>, UnknownAllocator> {
    Ok(match name {
        "buddy" => Box::new(crate::segmented::SegmentedPool::buddy(config)),
        "tlsf" => Box::new(crate::segmented::SegmentedPool::tlsf(config)),
        "best-fit" | "bestfit" | "best_fit" => {
            Box::new(crate::segmented::SegmentedPool::best_fit(config))
        }
        "torch" => Box::new(crate::torch::TorchCachingPool::new(config)),
        "paged" => Box::new(crate::paged::PagedPool::new(config)),
        "paged-lazy" | "paged_lazy" | "lazy" => match config.lazy.placement {
            crate::config::LazyPlacement::Segments => {
                Box::new(crate::torch::TorchCachingPool::paged_lazy(config))
            }
            crate::config::LazyPlacement::Pages => {
                Box::new(crate::paged_lazy::LazyPagedPool::new(config))
            }
        },
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
    // `all,tlsf` names tlsf twice: keep the first mention of each.
    let mut seen = Vec::with_capacity(out.len());
    out.retain(|n| {
        let first = !seen.contains(n);
        seen.push(*n);
        first
    });
    if out.is_empty() {
        return Err(UnknownAllocator(list.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_given_twice_runs_once() {
        assert_eq!(parse_list("all,tlsf").unwrap(), NAMES.to_vec());
        assert_eq!(
            parse_list("tlsf,paged,tlsf,bestfit").unwrap(),
            vec!["tlsf", "paged", "best-fit"]
        );
        assert!(parse_list("tlsf,nope").is_err());
        assert!(parse_list(",").is_err());
    }
}
