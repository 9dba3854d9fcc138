//! The allocator strategies, as one type: the names users type, the order reports list them
//! in, and how each is built from an [`AllocatorConfig`].
use std::fmt;
use std::str::FromStr;

use crate::config::{AllocatorConfig, LazyPlacement};
use crate::Allocator;

/// An allocator strategy. Adding one is one variant here: every `match` on it (building,
/// the settings each takes, the figures each reports) then names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Strategy {
    /// Power-of-two buddy allocation inside segments ([`crate::segmented::SegmentedPool::buddy`]).
    Buddy,
    /// Two-level segregated fit inside segments ([`crate::segmented::SegmentedPool::tlsf`]).
    Tlsf,
    /// Best fit inside segments ([`crate::segmented::SegmentedPool::best_fit`]).
    BestFit,
    /// The emulation of PyTorch's caching allocator ([`crate::torch::TorchCachingPool`]).
    Torch,
    /// Page-mapped blocks on the VMM API ([`crate::paged::PagedPool`]).
    Paged,
    /// Virtual ranges mapped as they are touched: PyTorch's expandable segments by default
    /// ([`crate::torch::TorchCachingPool::paged_lazy`]), or gpumem's page placement
    /// ([`crate::paged_lazy::LazyPagedPool`]) with [`LazyPlacement::Pages`].
    PagedLazy,
}

/// An unknown allocator name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown allocator `{0}`: expected one of buddy, tlsf, best-fit, torch, paged, paged-lazy, or all")]
pub struct UnknownAllocator(pub String);

impl Strategy {
    /// Every strategy, in report order (what `all` names).
    pub const ALL: [Strategy; 6] = [
        Strategy::Buddy,
        Strategy::Tlsf,
        Strategy::BestFit,
        Strategy::Torch,
        Strategy::Paged,
        Strategy::PagedLazy,
    ];

    /// The name users type and reports print (`best-fit`, `paged-lazy`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::Buddy => "buddy",
            Strategy::Tlsf => "tlsf",
            Strategy::BestFit => "best-fit",
            Strategy::Torch => "torch",
            Strategy::Paged => "paged",
            Strategy::PagedLazy => "paged-lazy",
        }
    }

    /// Whether the strategy sub-allocates fixed-size segments (`buddy`, `tlsf`, `best-fit`):
    /// the ones `segment_bytes` of [`AllocatorConfig`] sizes.
    pub const fn is_segmented(self) -> bool {
        matches!(self, Strategy::Buddy | Strategy::Tlsf | Strategy::BestFit)
    }

    /// The strategy `alloc` was built as, read from its [`Allocator::name`] (`None` for an
    /// allocator that no strategy builds, such as a test double).
    pub fn of(alloc: &dyn Allocator) -> Option<Strategy> {
        alloc.name().parse().ok()
    }

    /// Builds the allocator under `config`.
    pub fn build(self, config: &AllocatorConfig) -> Box<dyn Allocator> {
        match self {
            Strategy::Buddy => Box::new(crate::segmented::SegmentedPool::buddy(config)),
            Strategy::Tlsf => Box::new(crate::segmented::SegmentedPool::tlsf(config)),
            Strategy::BestFit => Box::new(crate::segmented::SegmentedPool::best_fit(config)),
            Strategy::Torch => Box::new(crate::torch::TorchCachingPool::new(config)),
            Strategy::Paged => Box::new(crate::paged::PagedPool::new(config)),
            Strategy::PagedLazy => match config.lazy.placement {
                LazyPlacement::Segments => {
                    Box::new(crate::torch::TorchCachingPool::paged_lazy(config))
                }
                LazyPlacement::Pages => Box::new(crate::paged_lazy::LazyPagedPool::new(config)),
            },
        }
    }

    /// Parses a comma-separated list (`tlsf,paged` or `all`), keeping the first mention of
    /// each strategy, in the order given.
    ///
    /// # Errors
    /// [`UnknownAllocator`] naming the first unknown entry, or the whole list when it names
    /// none.
    pub fn parse_list(list: &str) -> Result<Vec<Strategy>, UnknownAllocator> {
        let mut out = Vec::new();
        for part in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if part == "all" {
                out.extend(Strategy::ALL);
            } else {
                out.push(part.parse()?);
            }
        }
        // `all,tlsf` names tlsf twice: keep the first mention of each.
        let mut seen = Vec::with_capacity(out.len());
        out.retain(|s| {
            let first = !seen.contains(s);
            seen.push(*s);
            first
        });
        if out.is_empty() {
            return Err(UnknownAllocator(list.to_string()));
        }
        Ok(out)
    }
}

impl FromStr for Strategy {
    type Err = UnknownAllocator;

    /// One name, or one of its aliases (`bestfit`, `best_fit`, `paged_lazy`, `lazy`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "buddy" => Strategy::Buddy,
            "tlsf" => Strategy::Tlsf,
            "best-fit" | "bestfit" | "best_fit" => Strategy::BestFit,
            "torch" => Strategy::Torch,
            "paged" => Strategy::Paged,
            "paged-lazy" | "paged_lazy" | "lazy" => Strategy::PagedLazy,
            other => return Err(UnknownAllocator(other.to_string())),
        })
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for Strategy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_given_twice_runs_once() {
        assert_eq!(
            Strategy::parse_list("all,tlsf").unwrap(),
            Strategy::ALL.to_vec()
        );
        assert_eq!(
            Strategy::parse_list("tlsf,paged,tlsf,bestfit").unwrap(),
            vec![Strategy::Tlsf, Strategy::Paged, Strategy::BestFit]
        );
        assert!(Strategy::parse_list("tlsf,nope").is_err());
        assert!(Strategy::parse_list(",").is_err());
    }

    #[test]
    fn every_built_allocator_names_its_strategy() {
        let mut config = AllocatorConfig::default();
        for placement in [LazyPlacement::Segments, LazyPlacement::Pages] {
            config.lazy.placement = placement;
            for s in Strategy::ALL {
                assert_eq!(Strategy::of(s.build(&config).as_ref()), Some(s));
            }
        }
    }

    #[test]
    fn every_name_parses_back() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>(), Ok(s));
            assert_eq!(s.to_string(), s.name());
        }
        assert_eq!(
            "nope".parse::<Strategy>().unwrap_err().to_string(),
            "unknown allocator `nope`: expected one of buddy, tlsf, best-fit, torch, paged, paged-lazy, or all"
        );
    }
}
