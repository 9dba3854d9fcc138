//! [`DevicePool`]: a thread-safe, stream-ordered pool over one device and one
//! [`gpumem_core::Allocator`], with a sharded cache of recently freed blocks.
//!
//! Reuse rule (PyTorch's): a block freed on stream A goes into a cache keyed by
//! `(A, size class)` and is reusable at once by an allocation on A. It reaches other streams
//! only through the allocator, and only after an event recorded on A (after the free, in A's
//! order) has completed; blocks used on other streams too ([`DeviceBlock::record_stream`])
//! wait for an event on each of them. Events are recorded once per flush of a cache, not per
//! free, so the hit path costs two uncontended mutex operations and a `Vec` push/pop.
//!
//! Lock order: a cache shard, then (after releasing it) the central lock; the two are never
//! held together, so there is no deadlock. The hit path takes only the shard of the calling
//! thread (threads are spread over [`SHARDS`] shards round-robin).
//!
//! Out of memory: the pool flushes every cache, waits for the pending events, returns those
//! blocks to the allocator, asks it to release what it caches ([`gpumem_core::Allocator::
//! release_cached`]) and retries once. The CUDA driver API keeps no "last error" slot (unlike
//! the runtime's cudaGetLastError): CUDA_ERROR_OUT_OF_MEMORY is not sticky, so nothing is left
//! pending in the context after a handled failure.
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gpumem_core::{AllocError, Allocator, Device, DeviceError, Stats};
use serde::Serialize;

use super::events::StreamEvents;

/// Number of cache shards (threads map to them round-robin).
pub const SHARDS: usize = 64;
/// Smallest size class, in bytes (cudaMalloc's alignment).
pub const MIN_CLASS_BYTES: u64 = 256;
/// Sub-classes per power of two: rounding wastes at most 1/4 of a block.
pub const SUBCLASSES_LOG2: u32 = 2;

/// Rounds `size_bytes` up to its size class: 256 B at least, then 4 classes per power of two
/// (e.g. 320, 384, 448, 512, 640, ...).
pub fn class_bytes(size_bytes: u64) -> u64 {
    if size_bytes <= MIN_CLASS_BYTES {
        return MIN_CLASS_BYTES;
    }
    let p = 63 - (size_bytes - 1).leading_zeros(); // size-1 in [2^p, 2^(p+1))
    let step = 1u64 << (p - SUBCLASSES_LOG2);
    size_bytes.div_ceil(step).saturating_mul(step)
}

/// Index of a size class (0 for 256 B, increasing with size).
pub fn class_index(size_bytes: u64) -> usize {
    let c = class_bytes(size_bytes);
    if c == MIN_CLASS_BYTES {
        return 0;
    }
    let q = 63 - (c - 1).leading_zeros(); // c-1 in [2^q, 2^(q+1))
    let k = (c - (1u64 << q)) >> (q - SUBCLASSES_LOG2); // 1..=4
    1 + ((q - 8) as usize) * (1 << SUBCLASSES_LOG2) + (k as usize - 1)
}

/// Settings of a [`DevicePool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PoolOptions {
    /// Bytes allocated and freed at construction so the allocator keeps them cached (the
    /// seed's pre-reserved 256 MiB pool); 0 for none.
    pub reserve_bytes: u64,
    /// Reserved bytes above which freed memory is given back to the device at the next slow
    /// path (cudaMemPool's release threshold); `u64::MAX` keeps everything.
    pub release_threshold_bytes: u64,
    /// Largest block kept in the per-thread caches, in bytes; larger ones go straight to
    /// the allocator (after their stream's event).
    pub max_cached_block_bytes: u64,
    /// Bytes one cache shard may hold before it is flushed to the allocator.
    pub shard_cache_bytes: u64,
    /// Alignment of every block, in bytes.
    pub align_bytes: u64,
    /// Row pitch alignment for pitched allocations, in bytes (see [`super::pitch`]).
    pub pitch_align_bytes: u64,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            reserve_bytes: 256 << 20,
            release_threshold_bytes: u64::MAX,
            max_cached_block_bytes: 1 << 30,
            shard_cache_bytes: 2 << 30,
            align_bytes: gpumem_core::DEFAULT_ALIGN,
            pitch_align_bytes: super::pitch::DEFAULT_PITCH_ALIGN,
        }
    }
}

/// Errors of the pool.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoolError {
    /// Out of memory even after flushing caches, releasing cached memory and retrying.
    #[error("out of memory on {pool}: requested {requested_bytes} B; pool holds {reserved_bytes} B reserved, {allocated_bytes} B allocated, {cached_bytes} B cached, largest free block {largest_free_bytes} B ({source})")]
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

#[derive(Debug, Clone, Copy)]
struct Cached {
    addr: u64,
    class: u64,
}

#[derive(Debug, Default)]
struct StreamCache {
    stream: u64,
    /// Free blocks per size class index.
    classes: Vec<Vec<Cached>>,
}

#[derive(Debug, Default)]
struct Shard {
    streams: Vec<StreamCache>,
    bytes: u64,
    blocks: u64,
    live_blocks: i64,
    live_requested: i64,
    hits: u64,
    misses: u64,
}

impl Shard {
    fn take_all(&mut self) -> Vec<(u64, Vec<Cached>)> {
        let mut out = Vec::new();
        for sc in &mut self.streams {
            let mut v = Vec::new();
            for c in &mut sc.classes {
                v.append(c);
            }
            if !v.is_empty() {
                out.push((sc.stream, v));
            }
        }
        self.bytes = 0;
        self.blocks = 0;
        out
    }
}

#[repr(align(128))]
#[derive(Debug, Default)]
struct Padded<T>(T);

struct Pending {
    blocks: Vec<Cached>,
    events: Vec<u64>,
}

struct Central<D> {
    alloc: Box<dyn Allocator>,
    dev: D,
    pending: Vec<Pending>,
    oom_recoveries: u64,
}

struct Shared<D> {
    // Field order is drop order: events before the device they belong to.
    events: Box<dyn StreamEvents>,
    shards: Box<[Padded<Mutex<Shard>>]>,
    central: Mutex<Central<D>>,
    name: &'static str,
    opts: PoolOptions,
}

/// A thread-safe device pool: one allocator strategy over one device, with stream-ordered
/// reuse. Share it between threads by reference (it is `Sync`); blocks borrow it.
pub struct DevicePool<D: Device> {
    shared: Shared<D>,
}

/// A block of device memory; goes back to its pool when dropped.
pub struct DeviceBlock<'p, D: Device> {
    pool: &'p DevicePool<D>,
    raw: RawBlock,
}

/// A block without a borrow of its pool (for C ABIs and benchmarks): give it back with
/// [`DevicePool::free_raw`].
#[derive(Debug, PartialEq, Eq)]
pub struct RawBlock {
    /// Device address.
    pub addr: u64,
    /// Bytes asked for.
    pub requested_bytes: u64,
    /// Bytes of its size class (what the allocator set aside, at least).
    pub class_bytes: u64,
    /// Stream it was allocated on.
    pub stream: u64,
    /// Other streams it was used on ([`DeviceBlock::record_stream`]).
    pub other_streams: Vec<u64>,
}

/// A pitched 2-D or 3-D block: rows of `pitch_bytes`, `height` rows per slice, `depth` slices.
pub struct PitchedBlock<'p, D: Device> {
    /// The underlying block (`pitch_bytes * height * depth` bytes).
    pub block: DeviceBlock<'p, D>,
    /// Bytes from one row to the next (≥ the width, aligned).
    pub pitch_bytes: u64,
    /// Row width asked for, in bytes.
    pub width_bytes: u64,
    /// Rows per slice.
    pub height: u64,
    /// Slices (1 for 2-D).
    pub depth: u64,
}

impl<D: Device> PitchedBlock<'_, D> {
    /// Address of element row `y` of slice `z`.
    pub fn row_addr(&self, y: u64, z: u64) -> u64 {
        self.block.addr() + (z * self.height + y) * self.pitch_bytes
    }
}

thread_local! {
    static SHARD_ID: Cell<usize> = const { Cell::new(usize::MAX) };
}
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

fn my_shard() -> usize {
    SHARD_ID.with(|c| {
        let v = c.get();
        if v != usize::MAX {
            return v;
        }
        let v = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
        c.set(v);
        v
    })
}

impl<D: Device> DevicePool<D> {
    /// A pool of `alloc` over `dev`, with `events` for stream ordering; reserves
    /// `opts.reserve_bytes` up front.
    ///
    /// # Errors
    /// [`PoolError`] if the pre-reservation fails.
    pub fn new(
        alloc: Box<dyn Allocator>,
        dev: D,
        events: Box<dyn StreamEvents>,
        opts: PoolOptions,
    ) -> Result<Self, PoolError> {
        let name = alloc.name();
        let shards = (0..SHARDS).map(|_| Padded::default()).collect();
        let pool = DevicePool {
            shared: Shared {
                events,
                shards,
                central: Mutex::new(Central {
                    alloc,
                    dev,
                    pending: Vec::new(),
                    oom_recoveries: 0,
                }),
                name,
                opts,
            },
        };
        if opts.reserve_bytes > 0 {
            pool.reserve(opts.reserve_bytes)?;
        }
        Ok(pool)
    }

    /// Strategy name.
    pub fn name(&self) -> &'static str {
        self.shared.name
    }

    /// The options the pool was built with.
    pub fn options(&self) -> PoolOptions {
        self.shared.opts
    }

    fn central(&self) -> Result<MutexGuard<'_, Central<D>>, PoolError> {
        self.shared.central.lock().map_err(|_| PoolError::Poisoned)
    }

    fn shard(&self, i: usize) -> Result<MutexGuard<'_, Shard>, PoolError> {
        self.shared.shards[i]
            .0
            .lock()
            .map_err(|_| PoolError::Poisoned)
    }

    /// Makes the allocator take `bytes` from the device now and keep them cached: allocates
    /// one block of `bytes` and frees it at once (on stream 0, no event needed).
    ///
    /// # Errors
    /// [`PoolError`] from the allocator.
    pub fn reserve(&self, bytes: u64) -> Result<(), PoolError> {
        let mut c = self.central()?;
        let Central { alloc, dev, .. } = &mut *c;
        let b = alloc.allocate(dev, bytes, self.shared.opts.align_bytes, 0)?;
        alloc.deallocate(dev, b.addr)?;
        Ok(())
    }

    /// Allocates `size_bytes` for use on `stream`.
    ///
    /// # Errors
    /// [`PoolError::OutOfMemory`] with the pool's figures when even a flush, release and
    /// retry cannot supply it; other allocator or device errors.
    pub fn alloc(&self, size_bytes: u64, stream: u64) -> Result<DeviceBlock<'_, D>, PoolError> {
        let raw = self.alloc_raw(size_bytes, stream)?;
        Ok(DeviceBlock { pool: self, raw })
    }

    /// As [`DevicePool::alloc`], without the RAII guard.
    ///
    /// # Errors
    /// As [`DevicePool::alloc`].
    pub fn alloc_raw(&self, size_bytes: u64, stream: u64) -> Result<RawBlock, PoolError> {
        let opts = &self.shared.opts;
        let cacheable = size_bytes <= opts.max_cached_block_bytes;
        let class = if cacheable {
            class_bytes(size_bytes)
        } else {
            size_bytes
        };
        let si = my_shard();
        if cacheable {
            let idx = class_index(size_bytes);
            let mut sh = self.shard(si)?;
            let hit = sh
                .streams
                .iter_mut()
                .find(|s| s.stream == stream)
                .and_then(|s| s.classes.get_mut(idx))
                .and_then(Vec::pop);
            if let Some(c) = hit {
                sh.bytes -= c.class;
                sh.blocks -= 1;
                sh.hits += 1;
                sh.live_blocks += 1;
                sh.live_requested += size_bytes as i64;
                return Ok(RawBlock {
                    addr: c.addr,
                    requested_bytes: size_bytes,
                    class_bytes: c.class,
                    stream,
                    other_streams: Vec::new(),
                });
            }
        }
        let addr = self.alloc_slow(class, stream)?;
        let mut sh = self.shard(si)?;
        sh.misses += 1;
        sh.live_blocks += 1;
        sh.live_requested += size_bytes as i64;
        Ok(RawBlock {
            addr,
            requested_bytes: size_bytes,
            class_bytes: class,
            stream,
            other_streams: Vec::new(),
        })
    }

    fn alloc_slow(&self, class: u64, stream: u64) -> Result<u64, PoolError> {
        let align = self.shared.opts.align_bytes;
        {
            let mut c = self.central()?;
            self.drain_pending(&mut c, false)?;
            let Central { alloc, dev, .. } = &mut *c;
            match alloc.allocate(dev, class, align, stream) {
                Ok(b) => return Ok(b.addr),
                Err(e) if e.is_oom() => {}
                Err(e) => return Err(e.into()),
            }
        }
        // Out of memory: flush every cache, wait for their events, release, retry once.
        self.flush_all()?;
        let mut c = self.central()?;
        self.drain_pending(&mut c, true)?;
        c.oom_recoveries += 1;
        let Central { alloc, dev, .. } = &mut *c;
        alloc.release_cached(dev)?;
        match alloc.allocate(dev, class, align, stream) {
            Ok(b) => Ok(b.addr),
            Err(e) if e.is_oom() => {
                let s = alloc.stats();
                Err(PoolError::OutOfMemory {
                    pool: self.shared.name,
                    requested_bytes: class,
                    reserved_bytes: s.reserved_bytes.current,
                    allocated_bytes: s.allocated_bytes.current,
                    cached_bytes: self.cached_bytes(),
                    largest_free_bytes: s.largest_free_bytes,
                    source: e,
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Returns pending blocks whose events completed (all of them, waiting, if `wait`) to
    /// the allocator; then applies the release threshold.
    fn drain_pending(&self, c: &mut Central<D>, wait: bool) -> Result<(), PoolError> {
        if c.pending.is_empty() {
            return Ok(());
        }
        let ev = &self.shared.events;
        let mut i = 0;
        while i < c.pending.len() {
            let done = if wait {
                for &e in &c.pending[i].events {
                    ev.synchronize(e)?;
                }
                true
            } else {
                let mut all = true;
                for &e in &c.pending[i].events {
                    if !ev.query(e)? {
                        all = false;
                        break;
                    }
                }
                all
            };
            if done {
                let p = c.pending.swap_remove(i);
                for e in p.events {
                    ev.recycle(e);
                }
                let Central { alloc, dev, .. } = &mut *c;
                for b in p.blocks {
                    alloc.deallocate(dev, b.addr)?;
                }
            } else {
                i += 1;
            }
        }
        let Central { alloc, dev, .. } = &mut *c;
        if alloc.stats().reserved_bytes.current > self.shared.opts.release_threshold_bytes {
            alloc.release_cached(dev)?;
        }
        Ok(())
    }

    /// Hands `blocks` freed on `stream` (and used on `others`) to the central pending list
    /// behind one event per stream.
    fn to_pending(
        &self,
        stream: u64,
        others: &[u64],
        blocks: Vec<Cached>,
    ) -> Result<(), PoolError> {
        if blocks.is_empty() {
            return Ok(());
        }
        let ev = &self.shared.events;
        let mut events = Vec::with_capacity(1 + others.len());
        for &s in std::iter::once(&stream).chain(others) {
            match ev.record(s) {
                Ok(e) => events.push(e),
                Err(err) => {
                    for e in events {
                        ev.recycle(e);
                    }
                    // The blocks stay allocated (leaked to the allocator) rather than reused
                    // too early; report the error.
                    return Err(err.into());
                }
            }
        }
        let mut c = self.central()?;
        c.pending.push(Pending { blocks, events });
        self.drain_pending(&mut c, false)
    }

    /// Moves every cached block of every shard behind events.
    fn flush_all(&self) -> Result<(), PoolError> {
        for i in 0..SHARDS {
            let taken = self.shard(i)?.take_all();
            for (stream, blocks) in taken {
                self.to_pending(stream, &[], blocks)?;
            }
        }
        Ok(())
    }

    /// Returns a block (what [`DeviceBlock`]'s drop does).
    ///
    /// # Errors
    /// A device or allocator error while flushing a full cache or recording an event.
    pub fn free_raw(&self, b: RawBlock) -> Result<(), PoolError> {
        let si = my_shard();
        let opts = &self.shared.opts;
        let c = Cached {
            addr: b.addr,
            class: b.class_bytes,
        };
        let cacheable =
            b.requested_bytes <= opts.max_cached_block_bytes && b.other_streams.is_empty();
        let mut overflow = Vec::new();
        {
            let mut sh = self.shard(si)?;
            sh.live_blocks -= 1;
            sh.live_requested -= b.requested_bytes as i64;
            if cacheable {
                let idx = class_index(b.requested_bytes);
                let pos = match sh.streams.iter().position(|s| s.stream == b.stream) {
                    Some(p) => p,
                    None => {
                        sh.streams.push(StreamCache {
                            stream: b.stream,
                            classes: Vec::new(),
                        });
                        sh.streams.len() - 1
                    }
                };
                let sc = &mut sh.streams[pos];
                if sc.classes.len() <= idx {
                    sc.classes.resize_with(idx + 1, Vec::new);
                }
                sc.classes[idx].push(c);
                sh.bytes += c.class;
                sh.blocks += 1;
                if sh.bytes > opts.shard_cache_bytes {
                    overflow = sh.take_all();
                }
            }
        }
        if !cacheable {
            return self.to_pending(b.stream, &b.other_streams, vec![c]);
        }
        for (stream, blocks) in overflow {
            self.to_pending(stream, &[], blocks)?;
        }
        Ok(())
    }

    /// Allocates a pitched 2-D (`depth` = 1) or 3-D block: rows of `width_bytes` padded to
    /// [`PoolOptions::pitch_align_bytes`] (see [`super::pitch::pitch_bytes`]).
    ///
    /// # Errors
    /// [`PoolError::PitchOverflow`], or as [`DevicePool::alloc`].
    pub fn alloc_pitched(
        &self,
        width_bytes: u64,
        height: u64,
        depth: u64,
        stream: u64,
    ) -> Result<PitchedBlock<'_, D>, PoolError> {
        let overflow = PoolError::PitchOverflow {
            width_bytes,
            height,
            depth,
        };
        let pitch = super::pitch::pitch_bytes(width_bytes, self.shared.opts.pitch_align_bytes)
            .ok_or(overflow.clone())?;
        let total = pitch
            .checked_mul(height)
            .and_then(|x| x.checked_mul(depth.max(1)))
            .ok_or(overflow)?;
        let block = self.alloc(total, stream)?;
        Ok(PitchedBlock {
            block,
            pitch_bytes: pitch,
            width_bytes,
            height,
            depth: depth.max(1),
        })
    }

    /// Gives unused memory back to the device: flushes the caches, waits for their events,
    /// and has the allocator release what it caches. Returns the bytes released.
    ///
    /// # Errors
    /// A device or allocator error.
    pub fn trim(&self) -> Result<u64, PoolError> {
        self.flush_all()?;
        let mut c = self.central()?;
        self.drain_pending(&mut c, true)?;
        let Central { alloc, dev, .. } = &mut *c;
        Ok(alloc.release_cached(dev)?)
    }

    fn cached_bytes(&self) -> u64 {
        self.shared
            .shards
            .iter()
            .filter_map(|s| s.0.lock().ok().map(|g| g.bytes))
            .sum()
    }

    /// The pool's figures (locks every shard briefly).
    ///
    /// # Errors
    /// [`PoolError::Poisoned`].
    pub fn stats(&self) -> Result<PoolStats, PoolError> {
        let mut s = PoolStats::default();
        for i in 0..SHARDS {
            let sh = self.shard(i)?;
            s.cached_blocks += sh.blocks;
            s.cached_bytes += sh.bytes;
            s.live_blocks += sh.live_blocks;
            s.live_requested_bytes += sh.live_requested;
            s.cache_hits += sh.hits;
            s.cache_misses += sh.misses;
        }
        let c = self.central()?;
        s.allocator = c.alloc.stats();
        s.oom_recoveries = c.oom_recoveries;
        for p in &c.pending {
            s.pending_blocks += p.blocks.len() as u64;
            s.pending_bytes += p.blocks.iter().map(|b| b.class).sum::<u64>();
        }
        Ok(s)
    }

    /// Runs `f` on the device under the central lock (for device-specific queries).
    ///
    /// # Errors
    /// [`PoolError::Poisoned`].
    pub fn with_device<T>(&self, f: impl FnOnce(&mut D) -> T) -> Result<T, PoolError> {
        let mut c = self.central()?;
        Ok(f(&mut c.dev))
    }

    /// Checks the allocator's invariants.
    ///
    /// # Errors
    /// The allocator's [`AllocError::Internal`].
    pub fn validate(&self) -> Result<(), PoolError> {
        Ok(self.central()?.alloc.validate()?)
    }
}

impl<D: Device> Drop for DevicePool<D> {
    fn drop(&mut self) {
        // Every block is back (blocks borrow the pool); give the memory back.
        let _ = self.trim();
    }
}

impl<D: Device> std::fmt::Debug for DeviceBlock<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBlock")
            .field("pool", &self.pool.name())
            .field("block", &self.raw)
            .finish()
    }
}

impl<D: Device> std::fmt::Debug for DevicePool<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePool")
            .field("strategy", &self.shared.name)
            .field("options", &self.shared.opts)
            .field("stats", &self.stats().ok())
            .finish()
    }
}

impl<D: Device> DeviceBlock<'_, D> {
    /// Device address.
    pub fn addr(&self) -> u64 {
        self.raw.addr
    }
    /// Bytes asked for.
    pub fn size_bytes(&self) -> u64 {
        self.raw.requested_bytes
    }
    /// Bytes of the block's size class.
    pub fn class_bytes(&self) -> u64 {
        self.raw.class_bytes
    }
    /// Stream it was allocated on.
    pub fn stream(&self) -> u64 {
        self.raw.stream
    }
    /// Marks the block as used on `stream` too (PyTorch's `record_stream`): when freed, it is
    /// reused only after events on its own stream and on every such stream have completed.
    pub fn record_stream(&mut self, stream: u64) {
        let r = &mut self.raw;
        if stream != r.stream && !r.other_streams.contains(&stream) {
            r.other_streams.push(stream);
        }
    }
    /// Gives up the RAII guard; return the block with [`DevicePool::free_raw`].
    pub fn into_raw(self) -> RawBlock {
        let mut me = std::mem::ManuallyDrop::new(self);
        RawBlock {
            addr: me.raw.addr,
            requested_bytes: me.raw.requested_bytes,
            class_bytes: me.raw.class_bytes,
            stream: me.raw.stream,
            other_streams: std::mem::take(&mut me.raw.other_streams),
        }
    }
}

impl<D: Device> Drop for DeviceBlock<'_, D> {
    fn drop(&mut self) {
        let r = RawBlock {
            addr: self.raw.addr,
            requested_bytes: self.raw.requested_bytes,
            class_bytes: self.raw.class_bytes,
            stream: self.raw.stream,
            other_streams: std::mem::take(&mut self.raw.other_streams),
        };
        // A failure here leaves the block out of reuse (never reused too early).
        let _ = self.pool.free_raw(r);
    }
}

impl DevicePool<super::CudaDevice> {
    /// Grants (`grant`) or revokes read-write access of device `peer_ordinal` to the pages
    /// under `block` (cuMemSetAccess with one descriptor, on every granularity page the block
    /// touches). Only blocks of a VMM strategy (`paged`) can be shared this way; pages are
    /// shared whole, so neighbours on the same page become visible too.
    ///
    /// # Errors
    /// `DeviceError::Unsupported` for a block in a cuMemAlloc segment (use peer contexts
    /// there) or when cuDeviceCanAccessPeer says no; a failed driver call.
    pub fn set_peer_access(
        &self,
        block: &DeviceBlock<'_, super::CudaDevice>,
        peer_ordinal: usize,
        grant: bool,
    ) -> Result<(), PoolError> {
        let mut c = self.central()?;
        let dev = &mut c.dev;
        let g = dev.granularity_bytes();
        if g == 0 || dev.vmm_book().mapping_of(block.addr()).is_none() {
            return Err(DeviceError::Unsupported(format!(
                "block {:#x} is not VMM-mapped ({} strategy): peer access per block needs the paged strategy",
                block.addr(),
                self.shared.name
            ))
            .into());
        }
        let start = block.addr() / g * g;
        let end = (block.addr() + block.size_bytes().max(1)).div_ceil(g) * g;
        Ok(dev.set_peer_access(start, end - start, peer_ordinal, grant)?)
    }
}

/// A pool handle that can be shared as `Arc` (for threads that outlive a scope).
pub type SharedPool<D> = Arc<DevicePool<D>>;

#[cfg(test)]
mod tests {
    use super::*;

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
}
