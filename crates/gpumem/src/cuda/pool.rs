//! [`DevicePool`]: a thread-safe, stream-ordered pool over one device and one
//! [`gpumem_core::Allocator`], with a sharded cache of recently freed blocks.
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
//!    hit path takes no lock: one `compare_exchange` on a flag that only [`DevicePool::trim`]
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
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gpumem_core::{AllocError, Allocator, Device, DeviceError, Stats};
use serde::Serialize;

use super::events::StreamEvents;

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

/// Rounds `size_bytes` up to its size class: 256 B at least, then 4 classes per power of two
/// (e.g. 320, 384, 448, 512, 640, ...).
pub fn class_bytes(size_bytes: u64) -> u64 {
    if size_bytes <= MIN_CLASS_BYTES {
        return MIN_CLASS_BYTES;
    }
    let p = 63 - (size_bytes - 1).leading_zeros(); // size-1 in [2^p, 2^(p+1))
    let mask = (1u64 << (p - SUBCLASSES_LOG2)) - 1; // the step is a power of two: no division
    size_bytes.checked_add(mask).map_or(u64::MAX, |x| x & !mask)
}

/// Index of a size class (0 for 256 B, increasing with size).
pub fn class_index(size_bytes: u64) -> usize {
    index_of_class(class_bytes(size_bytes))
}

/// Index of `class_bytes`, which must already be a size class (a value of [`class_bytes`]).
fn index_of_class(c: u64) -> usize {
    if c <= MIN_CLASS_BYTES {
        return 0;
    }
    let q = 63 - (c - 1).leading_zeros(); // c-1 in [2^q, 2^(q+1))
    let k = (c - (1u64 << q)) >> (q - SUBCLASSES_LOG2); // 1..=4
    1 + ((q - 8) as usize) * (1 << SUBCLASSES_LOG2) + (k as usize - 1)
}

/// Settings of a [`DevicePool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PoolConfig {
    /// Bytes allocated and freed at construction so the allocator keeps them cached (the
    /// seed's pre-reserved 256 MiB pool); 0 for none.
    pub reserve_bytes: u64,
    /// Reserved bytes above which freed memory is given back to the device at the next slow
    /// path (cudaMemPool's release threshold); `u64::MAX` keeps everything.
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
    /// Row pitch alignment for pitched allocations, in bytes (see [`super::pitch`]).
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
    /// Pops a cached block of `stream` and class index `idx`.
    fn pop(&mut self, stream: u64, idx: usize) -> Option<Cached> {
        let c = self
            .streams
            .iter_mut()
            .find(|s| s.stream == stream)
            .and_then(|s| s.classes.get_mut(idx))
            .and_then(Vec::pop)?;
        self.bytes -= c.class;
        self.blocks -= 1;
        Some(c)
    }

    /// Caches `c` (class index `idx`) for `stream`.
    fn push(&mut self, stream: u64, idx: usize, c: Cached) {
        let pos = match self.streams.iter().position(|s| s.stream == stream) {
            Some(p) => p,
            None => {
                self.streams.push(StreamCache {
                    stream,
                    classes: Vec::new(),
                });
                self.streams.len() - 1
            }
        };
        let sc = &mut self.streams[pos];
        if sc.classes.len() <= idx {
            sc.classes.resize_with(idx + 1, Vec::new);
        }
        sc.classes[idx].push(c);
        self.bytes += c.class;
        self.blocks += 1;
    }

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

/// A thread slot's cache shard, with its block count readable without the lock (so that
/// stealing skips empty shards).
#[derive(Debug, Default)]
struct ShardSlot {
    shard: Mutex<Shard>,
    /// Blocks in `shard` (written under its lock).
    blocks: AtomicU64,
}

/// Per-slot cache of one stream's blocks (see the module docs): per class index, a stack of
/// addresses whose storage is allocated once, on the class's first push.
struct Magazine {
    /// Stream of every block in the magazine.
    stream: u64,
    /// Blocks in the magazine.
    blocks: u64,
    /// Bytes of those blocks (their size classes).
    bytes: u64,
    hits: u64,
    live_blocks: i64,
    live_requested: i64,
    /// Addresses per class index (at most [`MAGAZINE_CLASSES`] entries, each at most
    /// [`MAGAZINE_BLOCKS`] long).
    addrs: Vec<Vec<u64>>,
}

impl Magazine {
    fn new() -> Self {
        Magazine {
            stream: 0,
            blocks: 0,
            bytes: 0,
            hits: 0,
            live_blocks: 0,
            live_requested: 0,
            addrs: Vec::new(),
        }
    }

    /// Pops a block of class index `idx` and size `class` bytes.
    #[inline]
    fn pop(&mut self, idx: usize, class: u64) -> Option<u64> {
        let addr = self.addrs.get_mut(idx)?.pop()?;
        self.blocks -= 1;
        self.bytes -= class;
        Some(addr)
    }

    /// Pushes a block; false if its class is full or not held here.
    #[inline]
    fn push(&mut self, idx: usize, addr: u64, class: u64) -> bool {
        if idx >= MAGAZINE_CLASSES {
            return false;
        }
        if self.addrs.len() <= idx {
            self.addrs.resize_with(idx + 1, Vec::new);
        }
        let v = &mut self.addrs[idx];
        if v.len() >= MAGAZINE_BLOCKS {
            return false;
        }
        if v.capacity() == 0 {
            v.reserve_exact(MAGAZINE_BLOCKS);
        }
        v.push(addr);
        self.blocks += 1;
        self.bytes += class;
        true
    }

    /// Empties the magazine into `out` (one entry per block: class index and block).
    fn drain_into(&mut self, out: &mut Vec<(usize, Cached)>) {
        if self.blocks == 0 {
            return;
        }
        for (idx, v) in self.addrs.iter_mut().enumerate() {
            let class = class_of_index(idx);
            out.extend(v.drain(..).map(|addr| (idx, Cached { addr, class })));
        }
        self.blocks = 0;
        self.bytes = 0;
    }
}

/// Bytes of size class index `idx` (inverse of [`class_index`]).
fn class_of_index(idx: usize) -> u64 {
    if idx == 0 {
        return MIN_CLASS_BYTES;
    }
    let per = 1usize << SUBCLASSES_LOG2;
    let q = (idx - 1) / per + 8;
    let k = (idx - 1) % per + 1;
    (1u64 << q) + ((k as u64) << (q as u32 - SUBCLASSES_LOG2))
}

/// A magazine behind an ownership flag: the thread of the slot takes it with one
/// `compare_exchange` and gives up at once if it is taken; `trim` and `stats` wait for it.
struct MagazineSlot {
    busy: AtomicBool,
    /// Blocks in `mag`, stored by the holder of `busy` (read without it to skip empty
    /// magazines when stealing).
    blocks: AtomicU64,
    mag: UnsafeCell<Magazine>,
}

// SAFETY: `mag` is only reached through a `MagazineGuard`, which exists only while `busy`
// was switched from false to true by its creator (acquire) and is switched back on drop
// (release): at most one thread touches the magazine at a time, and each sees the writes of
// the previous one. `Magazine` holds plain integers (it is `Send`).
unsafe impl Sync for MagazineSlot {}

struct MagazineGuard<'a>(&'a MagazineSlot);

impl MagazineSlot {
    fn new() -> Self {
        MagazineSlot {
            busy: AtomicBool::new(false),
            blocks: AtomicU64::new(0),
            mag: UnsafeCell::new(Magazine::new()),
        }
    }

    /// Takes the magazine if no one holds it.
    #[inline]
    fn try_take(&self) -> Option<MagazineGuard<'_>> {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| MagazineGuard(self))
    }

    /// Takes the magazine, yielding while another thread holds it (holders keep it for a
    /// few instructions, or for a move to the shard).
    fn take(&self) -> MagazineGuard<'_> {
        loop {
            if let Some(g) = self.try_take() {
                return g;
            }
            std::thread::yield_now();
        }
    }
}

impl std::ops::Deref for MagazineGuard<'_> {
    type Target = Magazine;
    fn deref(&self) -> &Magazine {
        // SAFETY: the guard holds the flag (see `impl Sync for MagazineSlot`).
        unsafe { &*self.0.mag.get() }
    }
}

impl std::ops::DerefMut for MagazineGuard<'_> {
    fn deref_mut(&mut self) -> &mut Magazine {
        // SAFETY: the guard holds the flag, and `&mut self` makes this the only reference.
        unsafe { &mut *self.0.mag.get() }
    }
}

impl Drop for MagazineGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the guard still holds the flag.
        let blocks = unsafe { (*self.0.mag.get()).blocks };
        self.0.blocks.store(blocks, Ordering::Relaxed);
        self.0.busy.store(false, Ordering::Release);
    }
}

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
    mags: Box<[Padded<MagazineSlot>]>,
    shards: Box<[Padded<ShardSlot>]>,
    central: Mutex<Central<D>>,
    name: &'static str,
    opts: PoolConfig,
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

/// A thread's slot index; given back to [`FREE_SLOTS`] when the thread exits.
struct SlotId(usize);

impl Drop for SlotId {
    fn drop(&mut self) {
        if let Ok(mut f) = FREE_SLOTS.lock() {
            f.push(self.0);
        }
    }
}

thread_local! {
    static SLOT: SlotId = SlotId(take_slot());
}
/// Slots of exited threads, reused before new ones.
static FREE_SLOTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

fn take_slot() -> usize {
    if let Some(i) = FREE_SLOTS.lock().ok().and_then(|mut f| f.pop()) {
        return i;
    }
    NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SHARDS
}

/// The calling thread's slot (0 while its thread-locals are being destroyed).
#[inline]
fn my_shard() -> usize {
    SLOT.try_with(|s| s.0).unwrap_or(0)
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
        opts: PoolConfig,
    ) -> Result<Self, PoolError> {
        let name = alloc.name();
        let shards = (0..SHARDS).map(|_| Padded::default()).collect();
        let mags = (0..SHARDS).map(|_| Padded(MagazineSlot::new())).collect();
        let pool = DevicePool {
            shared: Shared {
                events,
                mags,
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
    pub fn options(&self) -> PoolConfig {
        self.shared.opts
    }

    fn central(&self) -> Result<MutexGuard<'_, Central<D>>, PoolError> {
        self.shared.central.lock().map_err(|_| PoolError::Poisoned)
    }

    fn shard(&self, i: usize) -> Result<MutexGuard<'_, Shard>, PoolError> {
        self.shared.shards[i]
            .0
            .shard
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
        let si = my_shard();
        if size_bytes > self.shared.opts.max_cached_block_bytes {
            let addr = self.alloc_slow(size_bytes, stream)?;
            self.count_miss(si, size_bytes)?;
            return Ok(RawBlock {
                addr,
                requested_bytes: size_bytes,
                class_bytes: size_bytes,
                stream,
                other_streams: Vec::new(),
            });
        }
        let class = class_bytes(size_bytes);
        let idx = index_of_class(class);
        // 1. The magazine (no lock; skipped if trim or stats hold it).
        if idx < MAGAZINE_CLASSES {
            if let Some(mut m) = self.shared.mags[si].0.try_take() {
                if m.stream == stream {
                    if let Some(addr) = m.pop(idx, class) {
                        m.hits += 1;
                        m.live_blocks += 1;
                        m.live_requested += size_bytes as i64;
                        return Ok(RawBlock {
                            addr,
                            requested_bytes: size_bytes,
                            class_bytes: class,
                            stream,
                            other_streams: Vec::new(),
                        });
                    }
                }
            }
        }
        // 2. The thread's shard, 3. the other shards, then the allocator.
        let hit = {
            let mut sh = self.shard(si)?;
            let hit = sh.pop(stream, idx);
            if hit.is_some() {
                sh.hits += 1;
                sh.live_blocks += 1;
                sh.live_requested += size_bytes as i64;
                self.shared.shards[si]
                    .0
                    .blocks
                    .store(sh.blocks, Ordering::Relaxed);
            }
            hit
        };
        let (addr, stolen) = match hit.or_else(|| self.steal(si, stream, idx, class)) {
            Some(c) => (c.addr, hit.is_none()),
            None => {
                let addr = self.alloc_slow(class, stream)?;
                self.count_miss(si, size_bytes)?;
                return Ok(RawBlock {
                    addr,
                    requested_bytes: size_bytes,
                    class_bytes: class,
                    stream,
                    other_streams: Vec::new(),
                });
            }
        };
        if stolen {
            let mut sh = self.shard(si)?;
            sh.hits += 1;
            sh.live_blocks += 1;
            sh.live_requested += size_bytes as i64;
        }
        Ok(RawBlock {
            addr,
            requested_bytes: size_bytes,
            class_bytes: class,
            stream,
            other_streams: Vec::new(),
        })
    }

    fn count_miss(&self, si: usize, size_bytes: u64) -> Result<(), PoolError> {
        let mut sh = self.shard(si)?;
        sh.misses += 1;
        sh.live_blocks += 1;
        sh.live_requested += size_bytes as i64;
        Ok(())
    }

    /// Takes a cached block of `stream` and class index `idx` from another thread slot's
    /// magazine or shard (same stream, so reusable at once); skips empty and busy ones.
    fn steal(&self, own: usize, stream: u64, idx: usize, class: u64) -> Option<Cached> {
        let sh = self.shared.shards.iter();
        for (i, (slot, mag)) in sh.zip(self.shared.mags.iter()).enumerate() {
            if i == own {
                continue;
            }
            if mag.0.blocks.load(Ordering::Relaxed) > 0 {
                if let Some(mut m) = mag.0.try_take() {
                    if m.stream == stream {
                        if let Some(addr) = m.pop(idx, class) {
                            return Some(Cached { addr, class });
                        }
                    }
                }
            }
            if slot.0.blocks.load(Ordering::Relaxed) > 0 {
                if let Ok(mut sh) = slot.0.shard.try_lock() {
                    if let Some(c) = sh.pop(stream, idx) {
                        slot.0.blocks.store(sh.blocks, Ordering::Relaxed);
                        return Some(c);
                    }
                }
            }
        }
        None
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
        alloc.empty_cache(dev)?;
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
            alloc.empty_cache(dev)?;
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

    /// Moves every cached block of every magazine and shard behind events.
    fn flush_all(&self) -> Result<(), PoolError> {
        let mut blocks = Vec::new();
        for i in 0..SHARDS {
            let stream = {
                let mut m = self.shared.mags[i].0.take();
                m.drain_into(&mut blocks);
                m.stream
            };
            if !blocks.is_empty() {
                let v = blocks.drain(..).map(|(_, c)| c).collect();
                self.to_pending(stream, &[], v)?;
            }
            let taken = {
                let mut sh = self.shard(i)?;
                let t = sh.take_all();
                self.shared.shards[i].0.blocks.store(0, Ordering::Relaxed);
                t
            };
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
        if !cacheable {
            {
                let mut sh = self.shard(si)?;
                sh.live_blocks -= 1;
                sh.live_requested -= b.requested_bytes as i64;
            }
            return self.to_pending(b.stream, &b.other_streams, vec![c]);
        }
        let idx = index_of_class(c.class);
        // 1. The magazine, if it holds this stream (or nothing) and the class has room.
        let mut moved = Vec::new();
        let mut old_stream = b.stream;
        if idx < MAGAZINE_CLASSES {
            if let Some(mut m) = self.shared.mags[si].0.try_take() {
                if m.stream != b.stream {
                    // The thread moved to another stream: the magazine follows it, and its
                    // blocks go to the shard under their own stream (below).
                    old_stream = m.stream;
                    m.drain_into(&mut moved);
                    m.stream = b.stream;
                }
                if m.bytes + c.class <= opts.shard_cache_bytes && m.push(idx, c.addr, c.class) {
                    m.live_blocks -= 1;
                    m.live_requested -= b.requested_bytes as i64;
                    if moved.is_empty() {
                        return Ok(());
                    }
                    drop(m);
                    return self.to_shard(si, old_stream, moved, None);
                }
            }
        }
        // 2. The shard.
        self.to_shard(
            si,
            old_stream,
            moved,
            Some((b.stream, idx, c, b.requested_bytes)),
        )
    }

    /// Puts `moved` (blocks of `old_stream` out of a magazine) and `block` (stream, class
    /// index, block, requested bytes: a freed block) into shard `si`; flushes the shard if
    /// it grew past [`PoolConfig::shard_cache_bytes`].
    fn to_shard(
        &self,
        si: usize,
        old_stream: u64,
        moved: Vec<(usize, Cached)>,
        block: Option<(u64, usize, Cached, u64)>,
    ) -> Result<(), PoolError> {
        let overflow = {
            let mut sh = self.shard(si)?;
            for (idx, c) in moved {
                sh.push(old_stream, idx, c);
            }
            if let Some((stream, idx, c, requested)) = block {
                sh.push(stream, idx, c);
                sh.live_blocks -= 1;
                sh.live_requested -= requested as i64;
            }
            let overflow = if sh.bytes > self.shared.opts.shard_cache_bytes {
                sh.take_all()
            } else {
                Vec::new()
            };
            self.shared.shards[si]
                .0
                .blocks
                .store(sh.blocks, Ordering::Relaxed);
            overflow
        };
        for (stream, blocks) in overflow {
            self.to_pending(stream, &[], blocks)?;
        }
        Ok(())
    }

    /// Allocates a pitched 2-D (`depth` = 1) or 3-D block: rows of `width_bytes` padded to
    /// [`PoolConfig::pitch_align_bytes`] (see [`super::pitch::pitch_bytes`]).
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
    pub fn empty_cache(&self) -> Result<u64, PoolError> {
        self.flush_all()?;
        let mut c = self.central()?;
        self.drain_pending(&mut c, true)?;
        let Central { alloc, dev, .. } = &mut *c;
        Ok(alloc.empty_cache(dev)?)
    }

    fn cached_bytes(&self) -> u64 {
        let shards: u64 = self
            .shared
            .shards
            .iter()
            .filter_map(|s| s.0.shard.lock().ok().map(|g| g.bytes))
            .sum();
        let mags: u64 = self.shared.mags.iter().map(|m| m.0.take().bytes).sum();
        shards + mags
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
            drop(sh);
            let m = self.shared.mags[i].0.take();
            s.cached_blocks += m.blocks;
            s.cached_bytes += m.bytes;
            s.live_blocks += m.live_blocks;
            s.live_requested_bytes += m.live_requested;
            s.cache_hits += m.hits;
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
        let _ = self.empty_cache();
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

    #[test]
    fn magazine_caps_each_class_and_drains_everything() {
        let mut m = Magazine::new();
        let idx = class_index(4096);
        for i in 0..MAGAZINE_BLOCKS as u64 {
            assert!(m.push(idx, i * 4096, 4096));
        }
        assert!(!m.push(idx, 1 << 40, 4096), "a full class refuses");
        assert!(
            !m.push(MAGAZINE_CLASSES, 0, 8 << 30),
            "classes past the range refuse"
        );
        assert!(m.push(0, 1 << 41, 256));
        assert_eq!(
            (m.blocks, m.bytes),
            (MAGAZINE_BLOCKS as u64 + 1, 4096 * 64 + 256)
        );
        assert_eq!(m.pop(idx, 4096), Some((MAGAZINE_BLOCKS as u64 - 1) * 4096));
        let mut out = Vec::new();
        m.drain_into(&mut out);
        assert_eq!(out.len(), MAGAZINE_BLOCKS);
        assert!(out.iter().all(|(i, c)| c.class == class_of_index(*i)));
        assert_eq!((m.blocks, m.bytes), (0, 0));
        assert_eq!(m.pop(idx, 4096), None);
    }
}
