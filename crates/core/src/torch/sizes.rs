//! PyTorch's size rules: how a request is rounded (`round_size`), which pool serves it
//! (`get_pool`), how big a new segment is (`get_allocation_size`) and when a block is split
//! (`should_split`), with PyTorch's constants.
use serde::Serialize;

use crate::config::TorchConfig;

/// Every block size is a multiple of this, in bytes (`kMinBlockSize`).
pub const MIN_BLOCK_BYTES: u64 = 512;
/// Largest rounded request served by the small pool, in bytes (`kSmallSize`, 1 MiB).
pub const SMALL_SIZE_BYTES: u64 = 1 << 20;
/// Size of a small-pool segment, and the page of a small-pool expandable segment, in bytes
/// (`kSmallBuffer`, 2 MiB).
pub const SMALL_BUFFER_BYTES: u64 = 2 << 20;
/// Size of the segment made for a request between 1 and 10 MiB, and the page of a large-pool
/// expandable segment, in bytes (`kLargeBuffer`, 20 MiB).
pub const LARGE_BUFFER_BYTES: u64 = 20 << 20;
/// Requests from this size on get a segment of their own size, in bytes
/// (`kMinLargeAlloc`, 10 MiB).
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 << 20;
/// Larger segments are rounded up to a multiple of this, in bytes (`kRoundLarge`, 2 MiB).
pub const ROUND_LARGE_BYTES: u64 = 2 << 20;

/// PyTorch's `round_size` with default settings: `size_bytes` rounded up to a multiple of
/// [`MIN_BLOCK_BYTES`], at least [`MIN_BLOCK_BYTES`]; `None` on overflow.
pub fn round_size(size_bytes: u64) -> Option<u64> {
    round_size_with(size_bytes, &TorchConfig::default())
}

/// PyTorch's `round_size` under `conf`: below 512 B, 512 B; where the size's interval has
/// more than one `roundup_power2_divisions` and the size is above 512 B × divisions, the next
/// division of its power-of-two interval ([`roundup_power2_next_division`]); else the next
/// multiple of 512 B. `None` on overflow.
pub fn round_size_with(size_bytes: u64, conf: &TorchConfig) -> Option<u64> {
    if size_bytes < MIN_BLOCK_BYTES {
        return Some(MIN_BLOCK_BYTES);
    }
    let divisions = conf.divisions_for(size_bytes);
    if divisions > 1 && size_bytes > MIN_BLOCK_BYTES.saturating_mul(divisions) {
        roundup_power2_next_division(size_bytes, divisions)
    } else {
        crate::align::align_up(size_bytes, MIN_BLOCK_BYTES)
    }
}

/// PyTorch's `roundup_power2_next_division`: `size_bytes` rounded up to the next of
/// `divisions` equal steps between the powers of two around it (1200 with 4 divisions: the
/// steps are 1024, 1280, 1536, 1792, so 1280). A power of two stays. `None` on overflow.
pub fn roundup_power2_next_division(size_bytes: u64, divisions: u64) -> Option<u64> {
    if size_bytes == 0 || crate::align::is_pow2(size_bytes) {
        return Some(size_bytes);
    }
    let floor = 1u64 << (63 - size_bytes.leading_zeros());
    let step = floor >> (63 - divisions.max(1).leading_zeros());
    if step == 0 {
        return floor.checked_mul(2);
    }
    let down = size_bytes & !(step - 1);
    if down == size_bytes {
        Some(size_bytes)
    } else {
        down.checked_add(step)
    }
}

/// PyTorch's `get_allocation_size`: bytes of the segment cudaMalloc'd for a rounded request
/// of `rounded_bytes` when no cached block fits; `None` on overflow.
pub fn allocation_size(rounded_bytes: u64) -> Option<u64> {
    if rounded_bytes <= SMALL_SIZE_BYTES {
        Some(SMALL_BUFFER_BYTES)
    } else if rounded_bytes < MIN_LARGE_ALLOC_BYTES {
        Some(LARGE_BUFFER_BYTES)
    } else {
        crate::align::align_up(rounded_bytes, ROUND_LARGE_BYTES)
    }
}

/// Which of PyTorch's two block pools a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Blocks of segments made for requests up to 1 MiB (`small_blocks`).
    Small,
    /// Everything else (`large_blocks`).
    Large,
}

impl PoolKind {
    /// PyTorch's `get_pool`: the pool serving a rounded request of `rounded_bytes`.
    pub fn for_size(rounded_bytes: u64) -> PoolKind {
        if rounded_bytes <= SMALL_SIZE_BYTES {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    /// Index of the pool in per-pool arrays (small 0, large 1).
    pub(crate) fn index(self) -> usize {
        match self {
            PoolKind::Small => 0,
            PoolKind::Large => 1,
        }
    }

    /// Page size of this pool's expandable segments, in bytes (2 MiB small, 20 MiB large).
    pub fn expandable_page_bytes(self) -> u64 {
        match self {
            PoolKind::Small => SMALL_BUFFER_BYTES,
            PoolKind::Large => LARGE_BUFFER_BYTES,
        }
    }
}

/// PyTorch's `should_split` with default settings: whether a free block of `block_bytes`
/// chosen for a rounded request of `rounded_bytes` in `pool` is split. Small pool: when at
/// least [`MIN_BLOCK_BYTES`] remain; large pool: when more than [`SMALL_SIZE_BYTES`] remain.
pub fn should_split(pool: PoolKind, block_bytes: u64, rounded_bytes: u64) -> bool {
    should_split_with(pool, block_bytes, rounded_bytes, &TorchConfig::default())
}

/// PyTorch's `should_split` under `conf`: with expandable segments, and in the small pool,
/// a block is split when at least [`MIN_BLOCK_BYTES`] remain; in the large pool of plain
/// segments only a request below `max_split_size` splits, and only when more than
/// [`SMALL_SIZE_BYTES`] remain.
pub fn should_split_with(
    pool: PoolKind,
    block_bytes: u64,
    rounded_bytes: u64,
    conf: &TorchConfig,
) -> bool {
    let remaining = block_bytes.saturating_sub(rounded_bytes);
    if pool == PoolKind::Small || conf.expandable_segments {
        remaining >= MIN_BLOCK_BYTES
    } else {
        rounded_bytes < conf.max_split_size_bytes && remaining > SMALL_SIZE_BYTES
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn power2_divisions_as_pytorch_documents() {
        // The example of PyTorch's comment: 1200 with 4 divisions is 1280.
        assert_eq!(roundup_power2_next_division(1200, 4), Some(1280));
        assert_eq!(roundup_power2_next_division(1024, 4), Some(1024));
        assert_eq!(roundup_power2_next_division(1280, 4), Some(1280));
        assert_eq!(roundup_power2_next_division(1281, 4), Some(1536));
        assert_eq!(roundup_power2_next_division(1793, 4), Some(2048));
        // More divisions than the interval has bytes: the next power of two.
        assert_eq!(roundup_power2_next_division(3, 8), Some(4));
        let c = TorchConfig::parse("roundup_power2_divisions:4").unwrap();
        // At most 512 B × 4 = 2048 B: plain 512-byte rounding.
        assert_eq!(round_size_with(1200, &c), Some(1536));
        assert_eq!(round_size_with(2048, &c), Some(2048));
        assert_eq!(round_size_with(2049, &c), Some(2560));
        assert_eq!(round_size_with(5 * MIB + 1, &c), Some(6 * MIB));
        assert_eq!(round_size_with(100 * MIB, &c), Some(112 * MIB));
        let one = TorchConfig::parse("roundup_power2_divisions:1").unwrap();
        assert_eq!(round_size_with(100 * MIB + 1, &one), Some(100 * MIB + 512));
        assert_eq!(roundup_power2_next_division(u64::MAX, 2), None);
    }

    #[test]
    fn split_rules_under_options() {
        let m = TorchConfig::parse("max_split_size_mb:128").unwrap();
        assert!(should_split_with(PoolKind::Large, 200 * MIB, 100 * MIB, &m));
        assert!(!should_split_with(
            PoolKind::Large,
            300 * MIB,
            150 * MIB,
            &m
        ));
        assert!(should_split_with(PoolKind::Small, 2 * MIB, MIB, &m));
        let e = TorchConfig::parse("expandable_segments:True").unwrap();
        assert!(should_split_with(
            PoolKind::Large,
            20 * MIB,
            20 * MIB - 512,
            &e
        ));
        assert!(!should_split_with(PoolKind::Large, 20 * MIB, 20 * MIB, &e));
        assert!(!should_split(PoolKind::Large, 20 * MIB, 20 * MIB - 512));
    }
}
