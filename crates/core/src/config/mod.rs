//! Settings shared by the allocators, kept apart from [`crate::strategy`] so that the
//! allocators and the strategy type that builds them do not import each other. The
//! `torch` emulation's settings ([`TorchConfig`], a parsed `PYTORCH_CUDA_ALLOC_CONF`) live
//! here too, so that the arrow goes from the allocators to their settings only.

mod torch_conf;

pub use torch_conf::{ConfError, TorchConfig, MIN_SPLIT_SETTING_MIB, ROUNDUP_INTERVALS};

/// Settings shared by the allocators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocatorConfig {
    /// Bytes a segmented pool (buddy, tlsf, best-fit) reserves per segment when a request
    /// is smaller (a 256 MiB pre-allocated pool, as in the classic buddy design).
    pub segment_bytes: u64,
    /// Smallest block of the buddy system, in bytes (256).
    pub min_block_bytes: u64,
    /// Free physical pages the `paged` strategy keeps cached before releasing them.
    pub page_cache_pages: u64,
    /// The `PYTORCH_CUDA_ALLOC_CONF` the `torch` emulation follows (native by default).
    pub torch: TorchConfig,
    /// The trade between reserved memory and driver calls of the `paged-lazy` strategy.
    pub lazy: LazyConfig,
}

/// Where the `paged-lazy` strategy places blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LazyPlacement {
    /// PyTorch's expandable segments (one growing virtual range per stream and pool, its
    /// best fit and splitting rules), with one physical handle per growth instead of one
    /// per 20 MiB page, cut into smaller handles as the device fills
    /// ([`crate::torch::TorchCachingPool::paged_lazy`]): the default.
    #[default]
    Segments,
    /// gpumem's own page placement over one address space, which moves idle pages to hold
    /// the peak ([`crate::paged_lazy::LazyPagedPool`]); the other settings of
    /// [`LazyConfig`] are its.
    Pages,
}

impl LazyPlacement {
    /// The name in `--lazy-conf` / `GPUMEM_CONF` (`segments`, `pages`).
    pub fn name(self) -> &'static str {
        match self {
            LazyPlacement::Segments => "segments",
            LazyPlacement::Pages => "pages",
        }
    }
}

/// Settings of the `paged-lazy` strategy: where it places blocks
/// ([`LazyConfig::placement`]) and, for the page placement
/// ([`crate::paged_lazy::LazyPagedPool`]), how much memory it may hold above the peak of
/// allocated bytes and how it sizes physical handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LazyConfig {
    /// Where blocks go: PyTorch's expandable segments with coarse handles (the default) or
    /// gpumem's page placement.
    pub placement: LazyPlacement,
    /// Headroom in basis points (1/10,000) of the peak of allocated bytes: the pool creates
    /// new pages while it holds less than that peak × (1 + headroom), and moves idle pages
    /// above it. 0 (the default) moves pages as soon as creating one would raise the peak
    /// of reserved bytes; 100 = 1 %.
    pub headroom_bp: u32,
    /// Largest physical handle in bytes (a run of new pages is cut into handles of a power
    /// of two of pages, at most this). Default 1 GiB: smaller handles can hold a lower
    /// peak, but a repeated step can creep (`docs/decisions.md`, "Keeping freed pages mapped
    /// is a strategy of its own").
    pub handle_bytes: u64,
    /// Most bytes mapped ahead of a block while below the headroom. Default 1 GiB.
    pub ahead_bytes: u64,
    /// Segments placement: each growth of an expandable segment maps this share, in basis
    /// points (1/10,000) of the bytes the pool already holds, beyond what the request needs
    /// (taken only where the device has room for it). 0 (the default) maps what the request
    /// needs, as PyTorch does. A training run whose peak creeps up step after step grows in
    /// fewer, larger steps: fewer driver calls for a higher peak (BENCHMARKS.md, "Open
    /// targets: the default placement's peak and calls", has the figures).
    pub grow_ahead_bp: u32,
}

impl Default for LazyConfig {
    fn default() -> Self {
        LazyConfig {
            placement: LazyPlacement::Segments,
            headroom_bp: 0,
            handle_bytes: 1 << 30,
            ahead_bytes: 1 << 30,
            grow_ahead_bp: 0,
        }
    }
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            segment_bytes: 256 << 20,
            min_block_bytes: 256,
            page_cache_pages: 1024,
            torch: TorchConfig::default(),
            lazy: LazyConfig::default(),
        }
    }
}
