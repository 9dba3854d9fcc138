//! [`DirectPool`]: a device pool stream-ordered the way PyTorch's own allocator is (the
//! plug-in's default, `mode=direct`): a block freed on the device's main stream goes straight
//! back to the strategy and is reusable at once, by a request of any size, on that stream.
//!
//! Why not [`DevicePool`](super::DevicePool) (the plug-in's `mode=pool`): it hands a freed
//! block back to the strategy only after an event recorded at the free has completed (blocks
//! of up to `max_cached_block` bytes are reused sooner, but only by requests of their own size
//! class on their own stream). In PyTorch training the CPU runs a whole step ahead of the GPU,
//! so those events complete late: the pool then reserves more than PyTorch does, and recording
//! and polling one event per free of a large block costs step time (BENCHMARKS.md, "Plug-in in
//! training", has the figures).
//!
//! What makes immediate reuse safe here:
//! - **Same stream.** Work on one stream runs in order, so a block freed on stream S and
//!   handed out again on S is touched by the new owner only after the old owner's kernels.
//! - **Deferred unmapping.** The strategy may unmap pages when a block is freed
//!   (`paged` does for runs of whole pages). cuMemUnmap and cuMemRelease do not wait for work
//!   in flight (unlike cuMemFree), so [`Deferred`] postpones each cuMemUnmap of a free behind an
//!   event recorded on the freeing stream, and carries it out once the event has completed —
//!   or at once, after waiting for the event, when the strategy maps new pages over that
//!   range or frees the address range, or when the device is out of memory. The strategy's
//!   own view is unchanged: to it the pages are unmapped.
//! - **Other streams.** The first stream that allocates on a device is its main stream. A
//!   block freed on another stream waits behind an event (as in the pool) before the
//!   strategy gets it back. A block handed out on another stream may hold memory freed on the
//!   main stream, so such an allocation first waits (on the CPU) for the main stream's work
//!   at that moment, if the main stream freed anything since the last such wait.
//!   Side streams are rare in single-GPU training; they pay that wait.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use gpumem_core::adaptor::Metered;
use gpumem_core::{forward_device, Allocator, Device, DeviceError, DriverCounters, PhysHandle};

use super::{PoolError, PoolStats, RawBlock, StreamEvents};

/// An unmap postponed until `event` (recorded on the freeing stream) completes.
#[derive(Debug, Clone, Copy)]
struct LateUnmap {
    event: u64,
    va: u64,
    bytes: u64,
}

/// A [`Device`] adaptor that postpones every cuMemUnmap the strategy makes until the GPU work
/// queued on the device's main stream at that time has completed (an event recorded there),
/// unless [`Deferred::set_immediate`] says the GPU is known to be idle. Everything else
/// passes through.
pub struct Deferred<D> {
    inner: D,
    events: Arc<dyn StreamEvents>,
    /// The main stream, once known; unmaps are immediate before that (no block was used).
    stream: Option<u64>,
    /// Unmaps are carried out at once (the caller waited for the GPU).
    immediate: bool,
    late: VecDeque<LateUnmap>,
    /// Unmaps postponed so far, and how many had to wait for their event on the CPU.
    postponed: u64,
    waited: u64,
}

impl<D: Device> Deferred<D> {
    /// Wraps `inner`; events come from `events`.
    pub fn new(inner: D, events: Arc<dyn StreamEvents>) -> Self {
        Deferred {
            inner,
            events,
            stream: None,
            immediate: false,
            late: VecDeque::new(),
            postponed: 0,
            waited: 0,
        }
    }

    /// Unmaps from now on wait for the work queued on `stream` (the main stream).
    pub fn set_stream(&mut self, stream: u64) {
        self.stream = Some(stream);
    }

    /// While `on`, unmaps are carried out at once: only after waiting for the main stream.
    pub fn set_immediate(&mut self, on: bool) {
        self.immediate = on;
    }

    /// Waits for the work queued on the main stream, then carries out every postponed unmap.
    ///
    /// # Errors
    /// A failed event call or cuMemUnmap.
    pub fn wait_idle(&mut self) -> Result<(), DeviceError> {
        if let Some(s) = self.stream {
            let e = self.events.record(s)?;
            let r = self.events.synchronize(e);
            self.events.recycle(e);
            r?;
        }
        self.settle_all()
    }

    /// Unmaps still postponed.
    pub fn postponed_now(&self) -> usize {
        self.late.len()
    }

    /// Carries out the postponed unmaps whose events have completed, oldest first, stopping
    /// at the first that has not.
    ///
    /// # Errors
    /// A failed cuEventQuery or cuMemUnmap.
    pub fn poll(&mut self) -> Result<(), DeviceError> {
        while let Some(l) = self.late.front().copied() {
            if !self.events.query(l.event)? {
                break;
            }
            self.late.pop_front();
            self.finish(l, false)?;
        }
        Ok(())
    }

    /// Waits for and carries out every postponed unmap.
    ///
    /// # Errors
    /// A failed cuEventSynchronize or cuMemUnmap.
    pub fn settle_all(&mut self) -> Result<(), DeviceError> {
        while let Some(l) = self.late.pop_front() {
            self.finish(l, true)?;
        }
        Ok(())
    }

    fn finish(&mut self, l: LateUnmap, wait: bool) -> Result<(), DeviceError> {
        if wait {
            self.waited += 1;
            self.events.synchronize(l.event)?;
        }
        self.events.recycle(l.event);
        self.inner.unmap(l.va, l.bytes)
    }

    /// Waits for and carries out the postponed unmaps that overlap `[va, va + bytes)`.
    fn settle_range(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        let end = va.saturating_add(bytes);
        let mut i = 0;
        while i < self.late.len() {
            let l = self.late[i];
            if l.va < end && va < l.va.saturating_add(l.bytes) {
                self.late.remove(i);
                self.finish(l, true)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }
}

forward_device! {
    impl<D: Device> Device for Deferred<D> => inner {
        fn alloc_segment(&mut self, bytes: u64) -> Result<u64, DeviceError> {
            match self.inner.alloc_segment(bytes) {
                Err(DeviceError::OutOfMemory { .. }) if !self.late.is_empty() => {
                    self.settle_all()?;
                    self.inner.alloc_segment(bytes)
                }
                r => r,
            }
        }
        fn free_segment(&mut self, addr: u64) -> Result<(), DeviceError> {
            // cuMemFree waits for the work in flight itself.
            self.inner.free_segment(addr)
        }
        fn free_va(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            self.settle_range(va, bytes)?;
            self.inner.free_va(va, bytes)
        }
        fn create_physical(&mut self, bytes: u64) -> Result<PhysHandle, DeviceError> {
            match self.inner.create_physical(bytes) {
                // Released handles still mapped behind a postponed unmap hold memory.
                Err(DeviceError::OutOfMemory { .. }) if !self.late.is_empty() => {
                    self.settle_all()?;
                    self.inner.create_physical(bytes)
                }
                r => r,
            }
        }
        fn release_physical(&mut self, handle: PhysHandle) -> Result<(), DeviceError> {
            // cuMemRelease of a handle still mapped frees its memory at the (postponed) unmap.
            self.inner.release_physical(handle)
        }
        fn map(&mut self, va: u64, bytes: u64, handle: PhysHandle) -> Result<(), DeviceError> {
            self.settle_range(va, bytes)?;
            match self.inner.map(va, bytes, handle) {
                // The handle may still be mapped at its old place (a device that allows one
                // mapping per handle refuses): carry out the postponed unmaps, then retry.
                Err(_) if !self.late.is_empty() => {
                    self.settle_all()?;
                    self.inner.map(va, bytes, handle)
                }
                r => r,
            }
        }
        fn unmap(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            match self.stream.filter(|_| !self.immediate) {
                Some(stream) => {
                    let event = self.events.record(stream)?;
                    self.late.push_back(LateUnmap { event, va, bytes });
                    self.postponed += 1;
                    Ok(())
                }
                None => self.inner.unmap(va, bytes),
            }
        }
    }
}

/// Counts of a [`DirectPool`]'s stream ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deferral {
    /// cuMemUnmap calls postponed behind an event and not carried out yet.
    pub unmaps_postponed_now: usize,
    /// cuMemUnmap calls postponed so far.
    pub unmaps_postponed: u64,
    /// Postponed unmaps whose event the CPU had to wait for.
    pub unmaps_waited: u64,
    /// Side-stream allocations that waited (on the CPU) for the main stream's work.
    pub side_stream_waits: u64,
    /// Blocks freed on a side stream, each given back behind an event.
    pub side_stream_frees: u64,
    /// The main stream (the first that allocated), once known.
    pub main_stream: Option<u64>,
}

/// Blocks freed on a side stream, waiting for `event` before the strategy gets them back.
struct SideFree {
    event: u64,
    addrs: Vec<u64>,
}

struct Inner<D> {
    alloc: Box<dyn Allocator>,
    dev: Metered<Deferred<D>>,
    /// The device's main stream: the first that allocated.
    main: Option<u64>,
    /// Whether the main stream freed a block since a side stream last waited for it.
    main_freed: bool,
    side: VecDeque<SideFree>,
    oom_recoveries: u64,
    side_waits: u64,
    /// Blocks freed on a side stream (each behind an event).
    side_frees: u64,
    live_blocks: i64,
    live_requested: i64,
}

/// A strategy over one device with PyTorch's stream semantics and immediate same-stream
/// reuse (see the module doc). Thread-safe: one lock, held for each call.
pub struct DirectPool<D: Device> {
    inner: Mutex<Inner<D>>,
    events: Arc<dyn StreamEvents>,
    align_bytes: u64,
}

impl<D: Device> DirectPool<D> {
    /// A pool of `alloc` over `dev` (already metered: see [`Metered`]), with `events` for
    /// stream ordering; takes `reserve_bytes` from the device now and keeps them cached.
    ///
    /// # Errors
    /// [`PoolError`] if the reservation fails.
    pub fn new(
        alloc: Box<dyn Allocator>,
        dev: Metered<Deferred<D>>,
        events: Arc<dyn StreamEvents>,
        align_bytes: u64,
        reserve_bytes: u64,
    ) -> Result<Self, PoolError> {
        let p = DirectPool {
            inner: Mutex::new(Inner {
                alloc,
                dev,
                main: None,
                main_freed: false,
                side: VecDeque::new(),
                oom_recoveries: 0,
                side_waits: 0,
                side_frees: 0,
                live_blocks: 0,
                live_requested: 0,
            }),
            events,
            align_bytes,
        };
        if reserve_bytes > 0 {
            let mut g = p.lock()?;
            let Inner { alloc, dev, .. } = &mut *g;
            let b = alloc.allocate(dev, reserve_bytes, align_bytes, 0)?;
            alloc.deallocate(dev, b.addr)?;
        }
        Ok(p)
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner<D>>, PoolError> {
        self.inner.lock().map_err(|_| PoolError::Poisoned)
    }

    /// Gives side-stream blocks whose events completed (all, waiting, if `wait`) back to the
    /// strategy.
    fn drain_side(&self, g: &mut Inner<D>, wait: bool) -> Result<(), PoolError> {
        while let Some(f) = g.side.front() {
            if wait {
                self.events.synchronize(f.event)?;
            } else if !self.events.query(f.event)? {
                break;
            }
            let f = g.side.pop_front().ok_or(PoolError::Poisoned)?;
            self.events.recycle(f.event);
            let Inner { alloc, dev, .. } = &mut *g;
            for a in f.addrs {
                alloc.deallocate(dev, a)?;
            }
        }
        Ok(())
    }

    /// Allocates `size_bytes` for use on `stream`.
    ///
    /// # Errors
    /// [`PoolError::OutOfMemory`] after waiting for side-stream frees and postponed unmaps,
    /// emptying the strategy's cache and retrying once; other strategy or device errors.
    pub fn alloc(&self, size_bytes: u64, stream: u64) -> Result<RawBlock, PoolError> {
        let mut g = self.lock()?;
        g.dev.inner_mut().poll()?;
        if !g.side.is_empty() {
            self.drain_side(&mut g, false)?;
        }
        let main = match g.main {
            Some(m) => m,
            None => {
                g.main = Some(stream);
                g.dev.inner_mut().set_stream(stream);
                stream
            }
        };
        let align = self.align_bytes;
        let block = {
            let Inner { alloc, dev, .. } = &mut *g;
            match alloc.allocate(dev, size_bytes, align, stream) {
                Ok(b) => b,
                Err(e) if e.is_oom() => {
                    self.drain_side(&mut g, true)?;
                    let Inner {
                        alloc,
                        dev,
                        oom_recoveries,
                        ..
                    } = &mut *g;
                    *oom_recoveries += 1;
                    dev.inner_mut().wait_idle()?;
                    dev.inner_mut().set_immediate(true);
                    let r = alloc
                        .empty_cache(dev)
                        .and_then(|_| alloc.allocate(dev, size_bytes, align, stream));
                    dev.inner_mut().set_immediate(false);
                    match r {
                        Ok(b) => b,
                        Err(e) if e.is_oom() => {
                            let s = alloc.stats();
                            return Err(PoolError::OutOfMemory {
                                pool: alloc.name(),
                                requested_bytes: size_bytes,
                                reserved_bytes: s.reserved_bytes.current,
                                allocated_bytes: s.allocated_bytes.current,
                                cached_bytes: 0,
                                largest_free_bytes: s.largest_free_bytes,
                                source: e,
                            });
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        };
        if stream != main && g.main_freed {
            // The block may hold memory the main stream freed: wait for its work so far.
            let e = self.events.record(main)?;
            let r = self.events.synchronize(e);
            self.events.recycle(e);
            r?;
            g.main_freed = false;
            g.side_waits += 1;
        }
        g.live_blocks += 1;
        g.live_requested += size_bytes as i64;
        Ok(RawBlock::new(
            block.addr,
            size_bytes,
            block.allocated_bytes,
            stream,
        ))
    }

    /// Gives back a block from [`DirectPool::alloc`]: at once on the main stream, behind an
    /// event on a side stream.
    ///
    /// # Errors
    /// A strategy or device error (the block then stays allocated).
    pub fn free(&self, b: &RawBlock) -> Result<(), PoolError> {
        let mut g = self.lock()?;
        g.dev.inner_mut().poll()?;
        g.live_blocks -= 1;
        g.live_requested -= b.requested_bytes as i64;
        if g.main.is_none_or(|m| m == b.stream) {
            g.main_freed = true;
            let Inner { alloc, dev, .. } = &mut *g;
            alloc.deallocate(dev, b.addr)?;
            if !g.side.is_empty() {
                self.drain_side(&mut g, false)?;
            }
        } else {
            g.side_frees += 1;
            let event = self.events.record(b.stream)?;
            g.side.push_back(SideFree {
                event,
                addrs: vec![b.addr],
            });
            self.drain_side(&mut g, false)?;
        }
        Ok(())
    }

    /// Waits for side-stream frees and the main stream's work, then has the strategy give its
    /// cache back to the device. Returns the bytes released.
    ///
    /// # Errors
    /// A strategy or device error.
    pub fn empty_cache(&self) -> Result<u64, PoolError> {
        let mut g = self.lock()?;
        self.drain_side(&mut g, true)?;
        let Inner { alloc, dev, .. } = &mut *g;
        dev.inner_mut().wait_idle()?;
        dev.inner_mut().set_immediate(true);
        let r = alloc.empty_cache(dev);
        dev.inner_mut().set_immediate(false);
        Ok(r?)
    }

    /// The strategy's figures, with this pool's in [`PoolStats`]' terms (`pending_*`: blocks
    /// of side streams waiting for their events; `cached_*`: 0, there is no cache above the
    /// strategy).
    ///
    /// # Errors
    /// [`PoolError::Poisoned`].
    pub fn stats(&self) -> Result<PoolStats, PoolError> {
        let g = self.lock()?;
        Ok(PoolStats {
            allocator: g.alloc.stats(),
            live_blocks: g.live_blocks,
            live_requested_bytes: g.live_requested,
            pending_blocks: g.side.iter().map(|f| f.addrs.len() as u64).sum(),
            oom_recoveries: g.oom_recoveries,
            ..PoolStats::default()
        })
    }

    /// How the stream ordering went so far: see [`Deferral`].
    ///
    /// # Errors
    /// [`PoolError::Poisoned`].
    pub fn deferral_counts(&self) -> Result<Deferral, PoolError> {
        let mut g = self.lock()?;
        let (side_waits, side_frees, main_stream) = (g.side_waits, g.side_frees, g.main);
        let d = g.dev.inner_mut();
        Ok(Deferral {
            unmaps_postponed_now: d.postponed_now(),
            unmaps_postponed: d.postponed,
            unmaps_waited: d.waited,
            side_stream_waits: side_waits,
            side_stream_frees: side_frees,
            main_stream,
        })
    }

    /// Checks the strategy's invariants.
    ///
    /// # Errors
    /// The strategy's `AllocError::Internal`.
    pub fn validate(&self) -> Result<(), PoolError> {
        Ok(self.lock()?.alloc.validate()?)
    }

    /// Driver calls so far.
    ///
    /// # Errors
    /// [`PoolError::Poisoned`].
    pub fn counters(&self) -> Result<DriverCounters, PoolError> {
        Ok(self.lock()?.dev.counters())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::ManualEvents;
    use gpumem_core::sim::SimDevice;

    fn pool(events: Arc<ManualEvents>) -> DirectPool<SimDevice> {
        let ev: Arc<dyn StreamEvents> = events;
        let dev = Deferred::new(SimDevice::new(1 << 30), Arc::clone(&ev));
        let (dev, _) = Metered::new(dev);
        let alloc = gpumem_core::strategy::Strategy::Paged.build(&Default::default());
        DirectPool::new(alloc, dev, ev, 256, 0).unwrap()
    }

    #[test]
    fn main_stream_reuses_at_once_and_unmaps_wait_for_the_gpu() {
        let ev = Arc::new(ManualEvents::new()); // events complete only when told
        let p = pool(Arc::clone(&ev));
        let a = p.alloc(64 << 20, 0).unwrap();
        p.free(&a).unwrap();
        // Same stream, another size: served at once from the freed range.
        let b = p.alloc(32 << 20, 0).unwrap();
        assert_eq!(b.addr, a.addr, "reused at once on its stream");
        // Many sizes: the strategy unmaps some freed pages; none before the GPU is done.
        let mut blocks = Vec::new();
        for i in 1..40u64 {
            blocks.push(p.alloc((i % 7 + 1) * (3 << 20), 0).unwrap());
            if blocks.len() > 6 {
                p.free(&blocks.remove(0)).unwrap();
            }
        }
        for x in blocks.drain(..) {
            p.free(&x).unwrap();
        }
        let d = p.deferral_counts().unwrap();
        let (now, postponed, waited) =
            (d.unmaps_postponed_now, d.unmaps_postponed, d.unmaps_waited);
        // Every unmap was postponed; one whose range or handle was needed again was waited
        // for (the events had not completed), never carried out early.
        assert!(
            postponed >= 1 && now as u64 + waited == postponed,
            "{now} {postponed} {waited}"
        );
        p.validate().unwrap();
        ev.complete_all();
        p.free(&b).unwrap(); // polls: the postponed unmaps are carried out now
        assert_eq!(p.deferral_counts().unwrap().unmaps_postponed_now, 0);
        p.empty_cache().unwrap();
        let s = p.stats().unwrap();
        assert_eq!(s.live_blocks, 0);
        assert_eq!(s.allocator.reserved_bytes.current, 0);
    }

    #[test]
    fn side_streams_wait_for_events() {
        let ev = Arc::new(ManualEvents::new());
        let p = pool(Arc::clone(&ev));
        let m = p.alloc(4 << 20, 0).unwrap(); // stream 0 is the main stream
        let a = p.alloc(4 << 20, 7).unwrap();
        p.free(&a).unwrap();
        assert_eq!(
            p.stats().unwrap().pending_blocks,
            1,
            "held until stream 7's event"
        );
        let b = p.alloc(4 << 20, 0).unwrap();
        assert_ne!(b.addr, a.addr, "not reused while stream 7 may still use it");
        ev.complete_stream(7);
        p.free(&b).unwrap();
        assert_eq!(p.stats().unwrap().pending_blocks, 0);
        // A side-stream allocation after a main-stream free waits for the main stream.
        let c = p.alloc(4 << 20, 9).unwrap();
        let d = p.deferral_counts().unwrap();
        assert_eq!((d.side_stream_waits, d.side_stream_frees), (1, 1));
        assert_eq!(d.main_stream, Some(0));
        p.free(&c).unwrap();
        p.free(&m).unwrap();
        ev.complete_all();
        p.empty_cache().unwrap();
        p.validate().unwrap();
        assert_eq!(p.stats().unwrap().live_blocks, 0);
    }

    #[test]
    fn out_of_memory_settles_postponed_unmaps_and_retries() {
        let ev = Arc::new(ManualEvents::new());
        let p = pool(Arc::clone(&ev));
        let a = p.alloc(768 << 20, 0).unwrap();
        p.free(&a).unwrap();
        let b = p.alloc(900 << 20, 0).unwrap();
        assert!(matches!(
            p.alloc(512 << 20, 0),
            Err(PoolError::OutOfMemory { .. })
        ));
        assert_eq!(p.stats().unwrap().oom_recoveries, 1);
        assert_eq!(
            p.deferral_counts().unwrap().unmaps_postponed_now,
            0,
            "settled while recovering"
        );
        p.free(&b).unwrap();
        let c = p.alloc(512 << 20, 0).unwrap();
        p.free(&c).unwrap();
        ev.complete_all();
        p.empty_cache().unwrap();
        p.validate().unwrap();
        assert_eq!(p.stats().unwrap().allocator.reserved_bytes.current, 0);
    }
}
