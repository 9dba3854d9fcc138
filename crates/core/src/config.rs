//! Settings shared by the allocators, kept apart from [`crate::registry`] so that the
//! allocators and the registry that builds them by name do not import each other.

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
    pub torch: crate::torch::TorchConfig,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            segment_bytes: 256 << 20,
            min_block_bytes: 256,
            page_cache_pages: 1024,
            torch: crate::torch::TorchConfig::default(),
        }
    }
}
