//! [`DevicePool`] itself: the central allocator behind a mutex, the events pending before
//! blocks go back to it, and the hot path ([`DevicePool::alloc_raw`], [`DevicePool::free_raw`])
//! over the thread slot's magazine and shard.
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use gpumem_core::{Allocator, Device};

use super::magazine::MagazineSlot;
use super::shard::{Cached, Padded, Shard, ShardSlot};
use super::slots::my_shard;
use super::{
    class_bytes, index_of_class, PoolConfig, PoolError, PoolStats, StreamEvents, MAGAZINE_CLASSES,
    SHARDS,
};

struct Pending {
    blocks: Vec<Cached>,
    events: Vec<u64>,
}

pub(crate) struct Central<D> {
    alloc: Box<dyn Allocator>,
    pub(crate) dev: D,
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

impl RawBlock {
    /// A block at `addr` of `class_bytes` for `requested_bytes` asked for on `stream`, used on
    /// no other stream yet.
    pub(crate) fn new(addr: u64, requested_bytes: u64, class_bytes: u64, stream: u64) -> Self {
        Self {
            addr,
            requested_bytes,
            class_bytes,
            stream,
            other_streams: Vec::new(),
        }
    }
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

    pub(crate) fn central(&self) -> Result<MutexGuard<'_, Central<D>>, PoolError> {
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
            return self.alloc_miss(si, size_bytes, size_bytes, stream);
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
                        return Ok(RawBlock::new(addr, size_bytes, class, stream));
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
                return self.alloc_miss(si, size_bytes, class, stream);
            }
        };
        if stolen {
            let mut sh = self.shard(si)?;
            sh.hits += 1;
            sh.live_blocks += 1;
            sh.live_requested += size_bytes as i64;
        }
        Ok(RawBlock::new(addr, size_bytes, class, stream))
    }

    /// A block of `class` bytes for `size_bytes` requested on `stream` from the driver, when
    /// no cached block serves it; counted as a miss of shard `si`.
    fn alloc_miss(
        &self,
        si: usize,
        size_bytes: u64,
        class: u64,
        stream: u64,
    ) -> Result<RawBlock, PoolError> {
        let addr = self.alloc_slow(class, stream)?;
        self.count_miss(si, size_bytes)?;
        Ok(RawBlock::new(addr, size_bytes, class, stream))
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
    /// The allocator's [`gpumem_core::AllocError::Internal`].
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

/// A pool handle that can be shared as `Arc` (for threads that outlive a scope).
pub type SharedPool<D> = Arc<DevicePool<D>>;
