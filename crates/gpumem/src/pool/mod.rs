//! The stream-ordered device pools, device-agnostic: [`DevicePool`] (size-class caches per
//! stream, this note) and [`DirectPool`] (PyTorch's immediate same-stream reuse, in
//! `direct.rs`) run over any [`gpumem_core::Device`] (the CUDA device, the simulated one)
//! with any [`gpumem_core::Allocator`] strategy and any [`StreamEvents`]; [`RawPool`] is
//! their one interface for callers that pick a pool at run time.
//!
//! Where things are: the hot path in `device_pool.rs` (`alloc_raw`, `free_raw`), the
//! magazine in `magazine.rs`, the cache shard in `shard.rs`, thread slots in `slots.rs`,
//! stream events in `events.rs`, row pitch in [`pitch`]; the size classes below. CUDA-only
//! pieces (peer access per block) are in [`crate::cuda`].
//!
//! ## Note [Stream-ordered reuse]
//!
//! Reuse rule (PyTorch's): a block freed on stream A goes into a cache keyed by
//! `(A, size class)` and is reusable at once by an allocation on A. It reaches other streams
//! only through the allocator, and only after an event recorded on A (after the free, in A's
//! order) has completed; blocks used on other streams too ([`DeviceBlock::record_stream`])
//! wait for an event on each of them. Events are recorded once per flush of a cache, not per
//! free.
//!
//! Caches, fastest first:
//! 1. a **magazine** per thread slot: up to [`MAGAZINE_BLOCKS`] addresses per size class,
//!    in a stack indexed by class, for one stream at a time (the stream the thread last freed on). The
//!    hit path takes no lock: one `compare_exchange` on a flag that only [`DevicePool::empty_cache`]
//!    and [`DevicePool::stats`] contend on, and a release store; if the flag is taken the
//!    call falls through to the shard (it never waits). A full class, or a free on another
//!    stream while the magazine holds blocks of its stream, goes to the shard; when the
//!    thread frees on a new stream the magazine's blocks move to the shard first (so they
//!    stay reusable on their own stream only).
//! 2. a **shard** per thread slot (a `Mutex`): any number of streams and classes.
//! 3. on a miss, the other slots' magazines and shards are searched (taking each only if
//!    free, skipping empty ones) for a block of the same stream and class, then the central
//!    allocator is asked.
//!
//! Thread slots (there are [`SHARDS`]) are taken from a free list when a thread first uses
//! a pool and given back when it exits, so short-lived threads inherit the caches of those
//! before them instead of spreading blocks over new slots. Magazines and shards live in the
//! pool, not in thread-local storage, so `trim` and drop reclaim every cached block.
//!
//! Lock order: a magazine flag or a cache shard, then (after releasing it) the central lock;
//! they are never held together with the central lock, so there is no deadlock. A magazine
//! releases the flag before it takes the shard lock; stealing only ever tries (never waits)
//! and holds one magazine or shard at a time.
//!
//! Out of memory: the pool flushes every cache, waits for the pending events, returns those
//! blocks to the allocator, asks it to release what it caches ([`gpumem_core::Allocator::
//! empty_cache`]) and retries once. The CUDA driver API keeps no "last error" slot (unlike
//! the runtime's cudaGetLastError): CUDA_ERROR_OUT_OF_MEMORY is not sticky, so nothing is left
//! pending in the context after a handled failure.
use gpumem_core::size_class::LogLinear;
use gpumem_core::{AllocError, DeviceError, Stats};
use serde::Serialize;

mod device_pool;
mod direct;
pub(crate) mod events;
mod magazine;
pub mod pitch;
mod raw_pool;
mod shard;
mod slots;

pub use device_pool::{DeviceBlock, DevicePool, PitchedBlock, RawBlock, SharedPool};
pub use direct::{Deferral, Deferred, DirectPool};
pub use events::{ManualEvents, StreamEvents};
pub use raw_pool::RawPool;

/// Number of thread slots, each with a magazine and a cache shard (threads beyond this share
/// slots).
pub const SHARDS: usize = 64;
/// Blocks per size class in a thread slot's magazine (more go to its shard).
pub const MAGAZINE_BLOCKS: usize = 64;
/// Size classes a magazine holds (class indices below this: blocks up to 4 GiB); larger
/// blocks use the shard only.
pub const MAGAZINE_CLASSES: usize = 97;
/// Smallest size class, in bytes (cudaMalloc's alignment).
pub const MIN_CLASS_BYTES: u64 = 256;
/// Sub-classes per power of two: rounding wastes at most 1/4 of a block.
pub const SUBCLASSES_LOG2: u32 = 2;

/// The pool's binning: [`gpumem_core::size_class::LogLinear`] with 4 classes per power of
/// two.
pub type PoolClasses = LogLinear<SUBCLASSES_LOG2>;

/// Bin of the smallest class ([`MIN_CLASS_BYTES`]); class index 0.
const MIN_CLASS_BIN: u32 = PoolClasses::floor(MIN_CLASS_BYTES);

/// Rounds `size_bytes` up to its size class: 256 B at least, then 4 classes per power of two
/// (e.g. 320, 384, 448, 512, 640, ...); `u64::MAX` past the last class.
#[inline]
pub fn class_bytes(size_bytes: u64) -> u64 {
    if size_bytes <= MIN_CLASS_BYTES {
        return MIN_CLASS_BYTES;
    }
    PoolClasses::round_up(size_bytes).unwrap_or(u64::MAX)
}

/// Index of a size class (0 for 256 B, increasing with size).
pub fn class_index(size_bytes: u64) -> usize {
    index_of_class(class_bytes(size_bytes))
}

/// Index of `class_bytes`, which must already be a size class (a value of [`class_bytes`]).
#[inline]
fn index_of_class(c: u64) -> usize {
    PoolClasses::floor(c.max(MIN_CLASS_BYTES)).saturating_sub(MIN_CLASS_BIN) as usize
}

/// Bytes of size class index `idx` (inverse of [`class_index`]).
#[inline]
fn class_of_index(idx: usize) -> u64 {
    let bin = MIN_CLASS_BIN.saturating_add(u32::try_from(idx).unwrap_or(u32::MAX));
    PoolClasses::min_bytes(bin.min(PoolClasses::BIN_COUNT - 1))
}

/// `u64::MAX` (no threshold) as JSON `null`, any other value as its number: a script reading
/// `release_threshold_bytes` should not mistake "none" for 16 EiB.
fn max_as_null<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    if *v == u64::MAX {
        s.serialize_none()
    } else {
        s.serialize_u64(*v)
    }
}

/// Settings of a [`DevicePool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PoolConfig {
    /// Bytes allocated and freed at construction so the allocator keeps them cached (the
    /// classic pre-reserved 256 MiB pool); 0 for none.
    pub reserve_bytes: u64,
    /// Reserved bytes above which freed memory is given back to the device at the next slow
    /// path (cudaMemPool's release threshold); `u64::MAX` keeps everything (`null` in JSON).
    #[serde(serialize_with = "max_as_null")]
    pub release_threshold_bytes: u64,
    /// Largest block kept in the per-thread caches, in bytes; larger ones go straight to
    /// the allocator (after their stream's event).
    pub max_cached_block_bytes: u64,
    /// Bytes one cache shard may hold before it is flushed to the allocator; a thread
    /// slot's magazine holds at most as many again (a free that would pass it goes to the
    /// shard).
    pub shard_cache_bytes: u64,
    /// Alignment of every block, in bytes.
    pub align_bytes: u64,
    /// Row pitch alignment for pitched allocations, in bytes (see [`pitch`]).
    pub pitch_align_bytes: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            reserve_bytes: 256 << 20,
            release_threshold_bytes: u64::MAX,
            max_cached_block_bytes: 1 << 30,
            shard_cache_bytes: 2 << 30,
            align_bytes: gpumem_core::DEFAULT_ALIGN,
            pitch_align_bytes: pitch::DEFAULT_PITCH_ALIGN,
        }
    }
}

/// Errors of the pool.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoolError {
    /// Out of memory even after flushing caches, releasing cached memory and retrying. The
    /// message gives the sizes in binary units, the request also in exact bytes (it is what
    /// the PyTorch plug-in prints on stderr: `requested 20.00 GiB (21,474,836,480 B)`).
    #[error(
        "out of memory on {pool}: requested {}; pool holds {} reserved, {} allocated, {} cached, largest free block {} ({source})",
        crate::units::bytes_exact(*.requested_bytes),
        crate::units::bytes(*.reserved_bytes),
        crate::units::bytes(*.allocated_bytes),
        crate::units::bytes(*.cached_bytes),
        crate::units::bytes(*.largest_free_bytes)
    )]
    OutOfMemory {
        /// Pool (strategy) name.
        pool: &'static str,
        /// Bytes asked for.
        requested_bytes: u64,
        /// Bytes the allocator holds from the device.
        reserved_bytes: u64,
        /// Bytes in live blocks of the allocator (cached blocks included).
        allocated_bytes: u64,
        /// Bytes in the pool's caches after the flush (0 unless a flush failed).
        cached_bytes: u64,
        /// Largest free block in the allocator.
        largest_free_bytes: u64,
        /// The allocator's or driver's error.
        source: AllocError,
    },
    /// The allocator failed for another reason.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// A device or event call failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A pitched request whose size overflows.
    #[error("pitched allocation {width_bytes} B x {height} x {depth} overflows")]
    PitchOverflow {
        /// Row width in bytes.
        width_bytes: u64,
        /// Rows.
        height: u64,
        /// Slices.
        depth: u64,
    },
    /// A lock was poisoned by a panic in another thread.
    #[error("pool lock poisoned")]
    Poisoned,
}

/// Figures of a pool: the allocator's, plus the caches'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PoolStats {
    /// The allocator's statistics (cached blocks count as allocated there).
    pub allocator: Stats,
    /// Blocks handed to users and not yet freed.
    pub live_blocks: i64,
    /// Bytes users asked for, over live blocks.
    pub live_requested_bytes: i64,
    /// Blocks sitting in the caches, reusable on their stream.
    pub cached_blocks: u64,
    /// Bytes of those blocks (their size classes).
    pub cached_bytes: u64,
    /// Blocks waiting for events before going back to the allocator.
    pub pending_blocks: u64,
    /// Bytes of those blocks.
    pub pending_bytes: u64,
    /// Allocations served from a cache.
    pub cache_hits: u64,
    /// Allocations that went to the allocator.
    pub cache_misses: u64,
    /// Times the pool recovered from out-of-memory by flushing and releasing.
    pub oom_recoveries: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The out-of-memory message read "requested 21474836480 B; pool holds 135291469824 B
    /// reserved, ...": the sizes are in binary units, the request also exact.
    #[test]
    fn out_of_memory_reads_in_units() {
        let e = PoolError::OutOfMemory {
            pool: "paged-lazy",
            requested_bytes: 20 << 30,
            reserved_bytes: 126 << 30,
            allocated_bytes: 122 << 30,
            cached_bytes: 0,
            largest_free_bytes: 2 << 20,
            source: AllocError::OutOfMemory {
                requested_bytes: 20 << 30,
                free_bytes: 4 << 30,
                largest_free_bytes: 2 << 20,
            },
        };
        assert_eq!(
            e.to_string(),
            "out of memory on paged-lazy: requested 20.00 GiB (21,474,836,480 B); pool holds 126.0 GiB \
             reserved, 122.0 GiB allocated, 0 B cached, largest free block 2.00 MiB (out of memory: \
             requested 20.00 GiB (21,474,836,480 B); 4.00 GiB (4,294,967,296 B) free in total, \
             largest free block 2.00 MiB (2,097,152 B))"
        );
    }

    #[test]
    fn size_classes_round_trip() {
        let mut xs = Vec::new();
        let mut s = 1u64;
        while s < (1 << 31) {
            xs.extend([s, s + 1, s + 7, s + 63]);
            s = s * 9 / 8 + 1;
        }
        xs.sort_unstable();
        xs.dedup();
        let (mut last_class, mut last_index) = (0, 0);
        for x in xs {
            let c = class_bytes(x);
            assert!(c >= x, "{x}");
            assert_eq!(class_bytes(c), c, "{x}");
            assert!(c - x <= x / 4 + 256, "waste {x} -> {c}");
            assert_eq!(c % 64, 0);
            let i = class_index(x);
            assert_eq!(i, class_index(c));
            if c > last_class && last_class > 0 {
                assert_eq!(i, last_index + 1, "classes are consecutive at {x}");
            } else if last_class > 0 {
                assert_eq!(i, last_index);
            }
            last_class = c;
            last_index = i;
        }
        assert_eq!(class_bytes(256), 256);
        assert_eq!(class_bytes(257), 320);
        assert_eq!(class_bytes(1000), 1024);
        assert_eq!(class_bytes(1025), 1280);
        assert_eq!(class_index(256), 0);
        assert_eq!(class_index(320), 1);
        assert_eq!(class_index(512), 4);
        assert_eq!(class_index(640), 5);
    }

    #[test]
    fn class_of_index_inverts_class_index() {
        for idx in 0..200 {
            let c = class_of_index(idx);
            assert_eq!(class_bytes(c), c, "{idx}");
            assert_eq!(class_index(c), idx, "{idx}");
            assert_eq!(index_of_class(c), idx, "{idx}");
        }
        assert_eq!(class_of_index(MAGAZINE_CLASSES - 1), 4 << 30);
    }
}
