//! [`PinnedPool`]: a capped caching allocator for pinned host memory.
//!
//! Like PyTorch's `CachingHostAllocator`, each block is one pinned allocation
//! (`cuMemHostAlloc`, or mmap + mlock without CUDA) that goes back to a per-size-class free
//! list when its user drops it, so a warm request is a lock and a `Vec::pop`. Unlike it, the
//! size classes are 32 per power of two ([`super::size_class`]), not powers of two, so the
//! bytes pinned stay within 1/32 of the bytes requested for requests ≥ 128 KiB, and the
//! total is capped (default: half of RAM or of the cgroup limit): past the cap the pool
//! first releases cached blocks, then fails with [`PinnedError::CapExceeded`].
//!
//! A block used by an asynchronous copy carries events ([`PooledBuffer::record_stream`] or
//! [`PooledBuffer::record_event`]); it is handed out again only once they have completed.
//!
//! ```
//! use gpumem::pinned::{PinnedError, PinnedPool, PinnedPoolConfig};
//! // CUDA where a driver is present, else page-locked memory through mlock.
//! let pool = PinnedPool::new(PinnedPoolConfig::auto(0));
//! match pool.alloc(3 << 20) {
//!     Ok(mut block) => {
//!         block.fill(7); // a &mut [u8] of exactly 3 MiB
//!         let addr = block.as_ptr();
//!         drop(block); // back to the cache, not to the OS
//!         let again = pool.alloc(3 << 20).unwrap(); // no driver call
//!         assert_eq!(again.as_ptr(), addr);
//!         let s = pool.stats();
//!         assert_eq!((s.cache_hits, s.cache_misses), (1, 1));
//!         assert!(s.pinned_over_requested() <= 1.05);
//!     }
//!     // An unprivileged process with a small RLIMIT_MEMLOCK and no CUDA.
//!     Err(e) => assert!(matches!(e, PinnedError::MemlockLimit { .. })),
//! }
//! ```

use super::size_class::class_bytes;
use super::sysinfo::default_pinned_cap_bytes;
use super::{HostAllocFlags, PinnedBuffer, PinnedError, Result};
use crate::cuda::{CudaContext, Event, Stream};
use crate::pool::StreamEvents;
use gpumem_core::stats::Counter;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Where a pool's memory comes from.
#[derive(Debug, Clone)]
pub enum PinnedSource {
    /// `cuMemHostAlloc` with these flags in this device's context.
    Cuda(CudaContext, HostAllocFlags),
    /// Anonymous memory locked with `mlock` (no CUDA).
    Locked,
}

/// How to build a [`PinnedPool`].
#[derive(Debug, Clone)]
pub struct PinnedPoolConfig {
    /// Where blocks come from.
    pub source: PinnedSource,
    /// Most bytes the pool may hold pinned (live and cached); `None` takes
    /// [`super::sysinfo::default_pinned_cap_bytes`] (half of RAM or of the cgroup limit).
    pub cap_bytes: Option<u64>,
}

impl PinnedPoolConfig {
    /// CUDA device `ordinal` with default flags if a driver is present, else the mlock
    /// fallback; default cap.
    pub fn auto(ordinal: usize) -> Self {
        let source = match CudaContext::new(ordinal) {
            Ok(h) => PinnedSource::Cuda(h, HostAllocFlags::DEFAULT),
            Err(_) => PinnedSource::Locked,
        };
        Self {
            source,
            cap_bytes: None,
        }
    }

    /// The mlock fallback with a cap of `cap_bytes`.
    pub fn locked(cap_bytes: u64) -> Self {
        Self {
            source: PinnedSource::Locked,
            cap_bytes: Some(cap_bytes),
        }
    }
}

/// The pool's figures, in PyTorch's vocabulary (current and peak, in bytes unless said).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PinnedStats {
    /// Bytes asked for by live blocks.
    pub requested_bytes: Counter,
    /// Bytes of the size classes of live blocks.
    pub allocated_bytes: Counter,
    /// Bytes pinned (live and cached blocks): what the OS has locked for the pool.
    pub pinned_bytes: Counter,
    /// Bytes pinned in free blocks kept for reuse.
    pub cached_bytes: Counter,
    /// Live blocks.
    pub allocation_count: Counter,
    /// Pinned allocations held (live and cached).
    pub segment_count: Counter,
    /// Requests served (cumulative).
    pub alloc_calls: u64,
    /// Blocks given back (cumulative).
    pub free_calls: u64,
    /// Requests served from the cache (cumulative).
    pub cache_hits: u64,
    /// Requests that pinned new memory (cumulative).
    pub cache_misses: u64,
    /// Cached blocks released to the OS (cumulative).
    pub released_blocks: u64,
    /// Times a request released cached blocks to stay under the cap or after the OS
    /// refused memory, then retried (cumulative).
    pub alloc_retries: u64,
    /// Cached blocks skipped because a copy still used them (cumulative).
    pub busy_skips: u64,
    /// Bytes leaked on purpose because a copy might still use them (a failed
    /// [`PooledBuffer::release_after`]); they stay pinned and counted in `pinned_bytes`.
    pub leaked_bytes: u64,
    /// Blocks leaked so (counted in `segment_count`).
    pub leaked_blocks: u64,
    /// The cap, in bytes.
    pub cap_bytes: u64,
}

impl PinnedStats {
    /// Bytes pinned ÷ bytes requested by live blocks (1.0 when nothing is requested).
    pub fn pinned_over_requested(&self) -> f64 {
        if self.requested_bytes.current == 0 {
            1.0
        } else {
            self.pinned_bytes.current as f64 / self.requested_bytes.current as f64
        }
    }
}

/// What keeps a cached block from reuse: a CUDA event (recycled by the pool once complete),
/// or an event of any [`StreamEvents`] (the device pool's abstraction; given back to it once
/// complete).
enum Guard {
    Event(Event),
    Stream(Arc<dyn StreamEvents>, u64),
}

impl Guard {
    fn is_complete(&self) -> Result<bool> {
        match self {
            Guard::Event(e) => Ok(e.query()?),
            Guard::Stream(events, id) => Ok(events.query(*id)?),
        }
    }
}

struct Cached {
    buf: PinnedBuffer,
    fences: Vec<Guard>,
}

/// Most idle events a pool keeps for reuse.
const MAX_IDLE_EVENTS: usize = 64;

#[derive(Default)]
struct State {
    free: HashMap<u64, Vec<Cached>>,
    /// Completed events, recorded again by the next `record_stream` (no cuEventCreate).
    events: Vec<Event>,
    stats: PinnedStats,
}

impl State {
    /// Keeps the events of completed guards for reuse (the others are dropped).
    fn recycle(&mut self, guards: Vec<Guard>) {
        for g in guards {
            match g {
                Guard::Event(e) => {
                    if self.events.len() < MAX_IDLE_EVENTS {
                        self.events.push(e);
                    }
                }
                Guard::Stream(events, id) => events.recycle(id),
            }
        }
    }
}

struct Inner {
    state: Mutex<State>,
    source: PinnedSource,
    cap: u64,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // breaks memory safety; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pin(&self, bytes: u64) -> Result<PinnedBuffer> {
        let len = usize::try_from(bytes)
            .map_err(|_| PinnedError::InvalidArgument(format!("{bytes} B does not fit usize")))?;
        match &self.source {
            PinnedSource::Cuda(host, flags) => PinnedBuffer::new_cuda(host, len, *flags),
            PinnedSource::Locked => PinnedBuffer::new_locked(len),
        }
    }
}

/// Releases cached blocks whose fences completed, largest first, until `needed` more bytes fit
/// under `cap` (or all when `needed` is `None`). Returns the blocks to drop outside the lock.
fn evict_cached(st: &mut State, cap: u64, needed: Option<u64>) -> Vec<PinnedBuffer> {
    let mut out = Vec::new();
    let mut classes: Vec<u64> = st.free.keys().copied().collect();
    classes.sort_unstable_by(|a, b| b.cmp(a));
    for class in classes {
        if let Some(n) = needed {
            if st.stats.pinned_bytes.current.saturating_add(n) <= cap {
                break;
            }
        }
        let Some(list) = st.free.get_mut(&class) else {
            continue;
        };
        let mut i = 0;
        while i < list.len() {
            if let Some(n) = needed {
                if st.stats.pinned_bytes.current.saturating_add(n) <= cap {
                    break;
                }
            }
            let done = list[i]
                .fences
                .iter()
                .all(|f| f.is_complete().unwrap_or(false));
            if done {
                let c = list.swap_remove(i);
                st.stats.pinned_bytes.sub(class);
                st.stats.cached_bytes.sub(class);
                st.stats.segment_count.sub(1);
                st.stats.released_blocks += 1;
                out.push(c);
            } else {
                i += 1;
            }
        }
    }
    let mut bufs = Vec::with_capacity(out.len());
    for c in out {
        st.recycle(c.fences);
        bufs.push(c.buf);
    }
    bufs
}

/// A capped caching allocator of pinned host memory. Cheap to clone (shared state);
/// thread-safe.
#[derive(Clone)]
pub struct PinnedPool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedPool")
            .field("source", &self.inner.source)
            .field("stats", &self.stats())
            .finish()
    }
}

impl PinnedPool {
    /// Creates an empty pool.
    pub fn new(config: PinnedPoolConfig) -> Self {
        let cap = config.cap_bytes.unwrap_or_else(default_pinned_cap_bytes);
        let state = State {
            stats: PinnedStats {
                cap_bytes: cap,
                ..PinnedStats::default()
            },
            ..State::default()
        };
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                source: config.source,
                cap,
            }),
        }
    }

    /// The cap on pinned bytes.
    pub fn cap_bytes(&self) -> u64 {
        self.inner.cap
    }

    /// Whether blocks come from the CUDA driver (else from the mlock fallback).
    pub fn is_cuda(&self) -> bool {
        matches!(self.inner.source, PinnedSource::Cuda(..))
    }

    /// A block of at least `bytes` bytes (its slice is exactly `bytes` long; 0 is allowed).
    /// Served from the cache when a free block of the same size class is idle (no driver
    /// call), else newly pinned.
    ///
    /// # Errors
    /// [`PinnedError::CapExceeded`] if the class does not fit under the cap even after
    /// releasing idle cached blocks; the backend's error if pinning fails twice (once more
    /// after releasing the cache); [`PinnedError::InvalidArgument`] for sizes past `u64`.
    pub fn alloc(&self, bytes: usize) -> Result<PooledBuffer> {
        let requested = bytes as u64;
        let class = class_bytes(requested)
            .ok_or_else(|| PinnedError::InvalidArgument(format!("{bytes} B is too large")))?;
        let mut to_release = Vec::new();
        {
            let mut st = self.inner.lock();
            if let Some(buf) = Self::take_cached(&mut st, class)? {
                st.stats.cache_hits += 1;
                Self::count_alloc(&mut st.stats, requested, class);
                st.stats.cached_bytes.sub(class);
                drop(st);
                return Ok(self.wrap(buf, bytes, class));
            }
            if st.stats.pinned_bytes.current.saturating_add(class) > self.inner.cap {
                to_release = evict_cached(&mut st, self.inner.cap, Some(class));
                st.stats.alloc_retries += 1;
                if st.stats.pinned_bytes.current.saturating_add(class) > self.inner.cap {
                    let err = PinnedError::CapExceeded {
                        requested_bytes: requested,
                        class_bytes: class,
                        pinned_bytes: st.stats.pinned_bytes.current,
                        cap_bytes: self.inner.cap,
                    };
                    drop(st);
                    drop(to_release);
                    return Err(err);
                }
            }
            // Reserve the bytes under the lock, pin outside it.
            st.stats.pinned_bytes.add(class);
            st.stats.segment_count.add(1);
        }
        drop(to_release);
        let buf = match self.inner.pin(class) {
            Ok(b) => Ok(b),
            Err(_) => {
                // The OS or driver refused: give back every idle cached block and retry once.
                let released = {
                    let mut st = self.inner.lock();
                    st.stats.alloc_retries += 1;
                    evict_cached(&mut st, self.inner.cap, None)
                };
                drop(released);
                self.inner.pin(class)
            }
        };
        let mut st = self.inner.lock();
        match buf {
            Ok(buf) => {
                st.stats.cache_misses += 1;
                Self::count_alloc(&mut st.stats, requested, class);
                drop(st);
                Ok(self.wrap(buf, bytes, class))
            }
            Err(e) => {
                st.stats.pinned_bytes.sub(class);
                st.stats.segment_count.sub(1);
                Err(e)
            }
        }
    }

    fn take_cached(st: &mut State, class: u64) -> Result<Option<PinnedBuffer>> {
        let Some(list) = st.free.get_mut(&class) else {
            return Ok(None);
        };
        // Newest first: the hot path is a pop of a block with no fences.
        let mut skipped = 0;
        let mut found = None;
        for i in (0..list.len()).rev() {
            let mut ready = true;
            for f in &list[i].fences {
                if !f.is_complete()? {
                    ready = false;
                    break;
                }
            }
            if ready {
                found = Some(i);
                break;
            }
            skipped += 1;
        }
        st.stats.busy_skips += skipped;
        let Some(i) = found else {
            return Ok(None);
        };
        let c = list.swap_remove(i);
        if !c.fences.is_empty() {
            st.recycle(c.fences);
        }
        Ok(Some(c.buf))
    }

    fn count_alloc(stats: &mut PinnedStats, requested: u64, class: u64) {
        stats.requested_bytes.add(requested);
        stats.allocated_bytes.add(class);
        stats.allocation_count.add(1);
        stats.alloc_calls += 1;
    }

    fn wrap(&self, buf: PinnedBuffer, len: usize, class: u64) -> PooledBuffer {
        PooledBuffer {
            buf: Some(buf),
            len,
            class,
            fences: Vec::new(),
            pool: Arc::clone(&self.inner),
        }
    }

    /// Releases every idle cached block to the OS (`cuMemFreeHost` / munmap); blocks whose
    /// copies are still running stay. Returns the bytes released.
    pub fn empty_cache(&self) -> u64 {
        let released = {
            let mut st = self.inner.lock();
            evict_cached(&mut st, self.inner.cap, None)
        };
        released.iter().map(|b| b.len() as u64).sum()
    }

    /// A snapshot of the figures.
    pub fn stats(&self) -> PinnedStats {
        self.inner.lock().stats
    }

    /// Checks the bookkeeping (empty free lists are kept, so a warm pop never reallocates):
    /// cached bytes and block counts against the free lists, pinned
    /// = allocated + cached, classes as keyed.
    ///
    /// # Errors
    /// [`PinnedError::Internal`] naming the first mismatch.
    pub fn validate(&self) -> Result<()> {
        let st = self.inner.lock();
        let mut cached = 0u64;
        let mut blocks = 0u64;
        for (&class, list) in &st.free {
            for c in list {
                if c.buf.len() as u64 != class {
                    return Err(PinnedError::Internal(format!(
                        "a {} B block in the {class} B list",
                        c.buf.len()
                    )));
                }
                cached += class;
                blocks += 1;
            }
        }
        let s = &st.stats;
        let check = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(PinnedError::Internal(format!("{what}: {s:?}")))
            }
        };
        check(s.cached_bytes.current == cached, "cached bytes")?;
        check(
            s.pinned_bytes.current == s.allocated_bytes.current + cached + s.leaked_bytes,
            "pinned != allocated + cached + leaked",
        )?;
        check(
            s.segment_count.current == s.allocation_count.current + blocks + s.leaked_blocks,
            "segments != live + cached + leaked blocks",
        )?;
        check(s.pinned_bytes.current <= s.cap_bytes, "over the cap")?;
        check(
            s.requested_bytes.current <= s.allocated_bytes.current,
            "requested > allocated",
        )
    }
}

/// A block of a [`PinnedPool`]; derefs to exactly the bytes requested and goes back to the
/// pool's cache on drop.
pub struct PooledBuffer {
    buf: Option<PinnedBuffer>,
    len: usize,
    class: u64,
    fences: Vec<Guard>,
    pool: Arc<Inner>,
}

impl std::fmt::Debug for PooledBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBuffer")
            .field("len", &self.len)
            .field("class_bytes", &self.class)
            .field("fences", &self.fences.len())
            .finish()
    }
}

impl PooledBuffer {
    /// Bytes of the size class pinned for this block (≥ its length).
    pub fn class_bytes(&self) -> u64 {
        self.class
    }

    /// The pinned allocation behind the block (its full class size).
    pub fn pinned(&self) -> Option<&PinnedBuffer> {
        self.buf.as_ref()
    }

    /// Device address of the block if the pool's flags are mapped.
    pub fn device_ptr(&self) -> Option<u64> {
        self.buf.as_ref().and_then(|b| b.device_ptr())
    }

    /// Marks the block as used by work queued on `stream` so far: an event is recorded there
    /// on this call (`cuEventRecord`; events are recycled by the pool, so no `cuEventCreate`
    /// once warm), and the block is not handed out again before it completes. Call it after
    /// queueing the last copy that uses the block.
    ///
    /// # Errors
    /// [`PinnedError::Cuda`] from event creation or recording.
    pub fn record_stream(&mut self, stream: &Stream) -> Result<()> {
        let idle = {
            let mut st = self.pool.lock();
            let pos = st
                .events
                .iter()
                .rposition(|e| e.context().same_context(stream.context()));
            pos.map(|i| st.events.swap_remove(i))
        };
        let mut ev = match idle {
            Some(e) => e,
            None => Event::new(stream.context(), false)?,
        };
        ev.record(stream)?;
        self.fences.push(Guard::Event(ev));
        Ok(())
    }

    /// Gives the block back once the work queued on `stream` so far is done: records an
    /// event there and returns the block to the pool, which hands it out again only after
    /// that event has completed. Use it to free a block right after queueing its last copy.
    ///
    /// # Errors
    /// [`PinnedError::Cuda`]; the block goes back to the pool anyway, and since no event
    /// guards it then, the stream is synchronised first (`cuStreamSynchronize`) so that no
    /// copy still uses it; if that fails too, the block is leaked rather than reused.
    pub fn release_after(mut self, stream: &Stream) -> Result<()> {
        match self.record_stream(stream) {
            Ok(()) => Ok(()),
            Err(e) => {
                if stream.synchronize().is_err() {
                    // Never hand out memory a copy may still be using.
                    std::mem::forget(self.buf.take());
                    let mut st = self.pool.lock();
                    st.stats.requested_bytes.sub(self.len as u64);
                    st.stats.allocated_bytes.sub(self.class);
                    st.stats.allocation_count.sub(1);
                    st.stats.leaked_bytes += self.class;
                    st.stats.leaked_blocks += 1;
                    st.stats.free_calls += 1;
                }
                Err(e)
            }
        }
    }

    /// Adds an event, recorded by `events` after the block's last use, that must complete
    /// ([`StreamEvents::query`]) before the block is reused; it is given back to `events`
    /// ([`StreamEvents::recycle`]) once complete. Any backend's events work: a
    /// [`crate::cuda::CudaEvents`], or [`crate::pool::ManualEvents`] in tests.
    pub fn record_event(&mut self, events: Arc<dyn StreamEvents>, event: u64) {
        self.fences.push(Guard::Stream(events, event));
    }
}

impl std::ops::Deref for PooledBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b[..self.len],
            None => &[],
        }
    }
}

impl std::ops::DerefMut for PooledBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            Some(b) => &mut b[..self.len],
            None => &mut [],
        }
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else {
            return;
        };
        let fences = std::mem::take(&mut self.fences);
        let mut st = self.pool.lock();
        st.stats.requested_bytes.sub(self.len as u64);
        st.stats.allocated_bytes.sub(self.class);
        st.stats.allocation_count.sub(1);
        st.stats.free_calls += 1;
        st.stats.cached_bytes.add(self.class);
        st.free
            .entry(self.class)
            .or_default()
            .push(Cached { buf, fences });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::pool::ManualEvents;

    fn pool(cap: u64) -> PinnedPool {
        PinnedPool::new(PinnedPoolConfig::locked(cap))
    }

    /// The locked memory this test may use; tests return early (after checking the error
    /// is the clear one) where RLIMIT_MEMLOCK is tiny and the process unprivileged.
    fn lockable(e: &PinnedError) -> bool {
        matches!(e, PinnedError::MemlockLimit { .. })
    }

    #[test]
    fn warm_requests_reuse_the_block() {
        let p = pool(1 << 20);
        let a = match p.alloc(10_000) {
            Ok(a) => a,
            Err(e) => return assert!(lockable(&e), "{e}"),
        };
        assert_eq!(a.len(), 10_000);
        assert_eq!(a.class_bytes(), 12_288);
        let addr = a.as_ptr();
        drop(a);
        let b = p.alloc(9_000).unwrap(); // same class: 12 KiB
        assert_eq!(b.as_ptr(), addr);
        let s = p.stats();
        assert_eq!((s.cache_hits, s.cache_misses), (1, 1));
        assert_eq!(s.requested_bytes.current, 9_000);
        assert_eq!(s.requested_bytes.peak, 10_000);
        assert_eq!(s.pinned_bytes.current, 12_288);
        assert_eq!(s.cached_bytes.current, 0);
        p.validate().unwrap();
        drop(b);
        assert_eq!(p.stats().cached_bytes.current, 12_288);
        assert_eq!(p.empty_cache(), 12_288);
        let s = p.stats();
        assert_eq!((s.pinned_bytes.current, s.segment_count.current), (0, 0));
        p.validate().unwrap();
    }

    #[test]
    fn cap_releases_cache_then_fails_clearly() {
        let p = pool(64 << 10);
        let a = match p.alloc(40 << 10) {
            Ok(a) => a,
            Err(e) => return assert!(lockable(&e), "{e}"),
        };
        drop(a); // 40 KiB cached
                 // 32 KiB does not fit beside the cached 40 KiB: the cache is released first.
        let b = p.alloc(32 << 10).unwrap();
        let s = p.stats();
        assert_eq!(s.released_blocks, 1);
        assert_eq!(s.alloc_retries, 1);
        assert_eq!(s.pinned_bytes.current, 32 << 10);
        // 40 KiB beside a live 32 KiB block passes the 64 KiB cap: a clear error.
        let e = p.alloc(40 << 10).unwrap_err();
        match &e {
            PinnedError::CapExceeded {
                requested_bytes,
                class_bytes,
                pinned_bytes,
                cap_bytes,
            } => {
                assert_eq!(
                    (*requested_bytes, *class_bytes, *pinned_bytes, *cap_bytes),
                    (40 << 10, 40 << 10, 32 << 10, 64 << 10)
                );
            }
            other => panic!("{other}"),
        }
        assert!(e.to_string().contains("cap 64.00 KiB"), "{e}");
        p.validate().unwrap();
        drop(b);
        // Everything fits again; the whole cap can be taken at once.
        let c = p.alloc(64 << 10).unwrap();
        assert_eq!(c.class_bytes(), 64 << 10);
        p.validate().unwrap();
    }

    #[test]
    fn a_block_in_use_by_a_copy_is_not_handed_out_again() {
        let p = pool(1 << 20);
        let mut a = match p.alloc(8192) {
            Ok(a) => a,
            Err(e) => return assert!(lockable(&e), "{e}"),
        };
        let events = Arc::new(ManualEvents::new());
        let copy_stream = 7;
        let ev = events.record(copy_stream).unwrap();
        a.record_event(Arc::clone(&events) as Arc<dyn StreamEvents>, ev);
        let addr_a = a.as_ptr();
        drop(a);
        let b = p.alloc(8192).unwrap();
        assert_ne!(b.as_ptr(), addr_a, "the busy block was reused");
        assert_eq!(p.stats().busy_skips, 1);
        // The busy block also cannot be released to make room.
        assert_eq!(p.empty_cache(), 0);
        events.complete_stream(copy_stream);
        let c = p.alloc(8192).unwrap();
        assert_eq!(c.as_ptr(), addr_a);
        assert_eq!(events.live(), 0, "the completed event was not given back");
        p.validate().unwrap();
    }

    #[test]
    fn concurrent_users_keep_the_books_straight() {
        // Needs up to ≈2.2 MiB locked; unit tests run side by side under one RLIMIT_MEMLOCK.
        let budget = match super::super::memlock_limit().unwrap() {
            super::super::MemlockLimit::Unlimited => 4 << 20,
            super::super::MemlockLimit::Bytes(b) => (b / 2).min(4 << 20),
        };
        if budget < 3 << 20 {
            return; // too little lockable memory here; the other tests cover the error
        }
        let p = pool(budget);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for i in 0..200usize {
                        let n = 4096 * (1 + (i * 7 + t) % 16);
                        let mut b = p.alloc(n).unwrap();
                        b.fill(t as u8);
                        assert!(b.iter().all(|&x| x == t as u8), "blocks overlap");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = p.stats();
        assert_eq!(s.alloc_calls, 800);
        assert_eq!(s.free_calls, 800);
        assert_eq!(s.allocation_count.current, 0);
        assert!(s.allocation_count.peak <= 4);
        assert_eq!(s.cache_hits + s.cache_misses, 800);
        assert!(s.cache_misses <= 16 * 4, "misses {}", s.cache_misses);
        p.validate().unwrap();
    }

    #[test]
    fn zero_byte_requests_take_one_page() {
        let p = pool(1 << 20);
        match p.alloc(0) {
            Ok(b) => {
                assert!(b.is_empty());
                assert_eq!(b.class_bytes(), 4096);
            }
            Err(e) => assert!(lockable(&e), "{e}"),
        }
    }
}
