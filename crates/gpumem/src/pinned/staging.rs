//! Pageable copies through a ring of pinned staging buffers.
//!
//! The driver's own pageable path copies through a small pinned bounce buffer with one
//! thread, one chunk at a time (a fraction of the link's rate: BENCHMARKS.md, "Pinned host
//! memory and transfers"). [`StagingRing`] does the same
//! with `buffers` pinned chunks of `chunk_bytes`, each filled (or drained) by a persistent
//! pool of `threads` threads that each `memcpy` a share of the chunk, while the copy engine
//! DMAs the chunk before it: host copies overlap DMA, and the host side scales with threads.
//! One CUDA event per buffer says when the DMA reading (or writing) it has finished.
//!
//! The DMA side is a trait, [`StagingDma`], so the ring runs the same against CUDA
//! (`cuMemcpyHtoDAsync` + `cuEventRecord`) and against a fake that copies host to host
//! (tests).
//!
//! ```
//! use gpumem::pinned::{CopyKind, NullDma, StagingConfig, StagingRing};
//! let config = StagingConfig { chunk_bytes: 1 << 20, buffers: 2, threads: 2, copy: CopyKind::Libc };
//! // With CUDA: StagingRing::new_cuda(&host, config)?.copy_pageable_to_device(&src, &dev, 0, &stream)
//! if let Ok(mut ring) = StagingRing::new_locked(config) {
//!     let src = vec![1u8; 5 << 20];
//!     ring.stage_h2d(&src, &mut NullDma).unwrap(); // the host side alone
//! }
//! ```

use super::{HostAllocFlags, PinnedBuffer, PinnedError, Result};
use crate::cuda::{CudaContext, DeviceBuffer, Event, Stream};
use std::sync::mpsc;
use std::thread::JoinHandle;

/// How host threads copy into and out of the staging buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum CopyKind {
    /// `memcpy` (`ptr::copy_nonoverlapping`).
    #[default]
    Libc,
    /// Non-temporal (streaming) stores on x86-64 (`memcpy` elsewhere): the destination
    /// lines bypass the cache and need no read-for-ownership, which saves memory bandwidth,
    /// but the DMA engine then reads them from DRAM rather than the last-level cache.
    NonTemporal,
}

impl std::fmt::Display for CopyKind {
    /// The spelling of the CLI's `--stage-copy` flag: `libc` or `nt`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CopyKind::Libc => "libc",
            CopyKind::NonTemporal => "nt",
        })
    }
}

/// Copies `len` bytes from `src` to `dst` with `kind`.
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes; the ranges do not overlap.
unsafe fn copy_bytes(dst: *mut u8, src: *const u8, len: usize, kind: CopyKind) {
    // SAFETY: the caller upholds the # Safety contract of this function.
    unsafe {
        match kind {
            CopyKind::Libc => std::ptr::copy_nonoverlapping(src, dst, len),
            CopyKind::NonTemporal => copy_nt(dst, src, len),
        }
    }
}

#[cfg(target_arch = "x86_64")]
unsafe fn copy_nt(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller upholds the # Safety contract of this function.
    unsafe {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // Head: up to the first 16-byte aligned destination byte.
        let head = (dst.align_offset(16)).min(len);
        std::ptr::copy_nonoverlapping(src, dst, head);
        let mut off = head;
        // Body: 64 bytes (a cache line) per step, streaming stores (SSE2: always on x86-64).
        while off + 64 <= len {
            let s = src.add(off).cast::<__m128i>();
            let d = dst.add(off).cast::<__m128i>();
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
            off += 64;
        }
        // Make the streaming stores visible before anyone (the DMA engine) reads them.
        _mm_sfence();
        std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn copy_nt(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller upholds the # Safety contract of this function.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len);
    }
}

struct Job {
    dst: usize,
    src: usize,
    len: usize,
    kind: CopyKind,
}

/// How long a waiting thread spins before it sleeps: a staged copy hands out a chunk every
/// 20–500 µs, and waking a sleeping thread costs several µs of futex and scheduler latency
/// per chunk and thread.
const SPIN: std::time::Duration = std::time::Duration::from_micros(200);
/// For how long of [`SPIN`] the thread spins without yielding the CPU.
const SPIN_HOT: std::time::Duration = std::time::Duration::from_micros(20);

/// Receives from `rx`, spinning for up to [`SPIN`] (yielding after [`SPIN_HOT`], so that an
/// oversubscribed machine still makes progress) before blocking; `None` once the sender is
/// gone.
fn recv_spinning<T>(rx: &mpsc::Receiver<T>) -> Option<T> {
    let t0 = std::time::Instant::now();
    loop {
        match rx.try_recv() {
            Ok(v) => return Some(v),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) => {
                let waited = t0.elapsed();
                if waited > SPIN {
                    return rx.recv().ok();
                } else if waited > SPIN_HOT {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

/// A persistent pool of threads that copy one buffer together, each its share.
pub struct CopyPool {
    senders: Vec<mpsc::Sender<Job>>,
    done: mpsc::Receiver<()>,
    handles: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for CopyPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyPool")
            .field("threads", &self.threads())
            .finish()
    }
}

/// Below this, a share is not worth a thread (bytes).
const MIN_SHARE_BYTES: usize = 256 << 10;

impl CopyPool {
    /// Starts `threads − 1` workers (the calling thread copies a share too); 0 counts as 1,
    /// and more than the CPUs available (`available_parallelism`) count as that many, since
    /// waiting workers spin.
    ///
    /// # Errors
    /// [`PinnedError::Os`] if a thread cannot be spawned.
    pub fn new(threads: usize) -> Result<Self> {
        let cpus = std::thread::available_parallelism().map_or(threads, |n| n.get());
        let threads = threads.clamp(1, cpus.max(1));
        let (done_tx, done) = mpsc::channel::<()>();
        let mut senders = Vec::new();
        let mut handles = Vec::new();
        for i in 1..threads {
            let (tx, rx) = mpsc::channel::<Job>();
            let done_tx = done_tx.clone();
            let h = std::thread::Builder::new()
                .name(format!("gpumem-stage-{i}"))
                .spawn(move || {
                    while let Some(job) = recv_spinning(&rx) {
                        // SAFETY: `CopyPool::copy` keeps both ranges borrowed and disjoint
                        // until every worker has answered on `done`.
                        unsafe {
                            copy_bytes(job.dst as *mut u8, job.src as *const u8, job.len, job.kind)
                        };
                        if done_tx.send(()).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|os| PinnedError::Os {
                    call: "thread spawn",
                    bytes: 0,
                    os,
                })?;
            senders.push(tx);
            handles.push(h);
        }
        Ok(Self {
            senders,
            done,
            handles,
        })
    }

    /// Threads that copy (workers and the caller).
    pub fn threads(&self) -> usize {
        self.senders.len() + 1
    }

    /// Copies `src` into `dst` (equal lengths) with up to [`CopyPool::threads`] threads and
    /// returns when all shares are done (`&mut self`: one copy at a time, so the answers of
    /// the workers cannot mix).
    ///
    /// # Errors
    /// [`PinnedError::InvalidArgument`] if the lengths differ; [`PinnedError::Internal`] if a
    /// worker died.
    pub fn copy(&mut self, dst: &mut [u8], src: &[u8], kind: CopyKind) -> Result<()> {
        if dst.len() != src.len() {
            return Err(PinnedError::InvalidArgument(format!(
                "copy of {} B into {} B",
                src.len(),
                dst.len()
            )));
        }
        // SAFETY: the slices are valid, disjoint (one is &mut) and borrowed for the call.
        unsafe { self.copy_raw(dst.as_mut_ptr(), src.as_ptr(), src.len(), kind) }
    }

    /// As [`CopyPool::copy`] with raw pointers.
    ///
    /// # Safety
    /// `src` readable and `dst` writable for `len` bytes until the call returns; disjoint.
    pub unsafe fn copy_raw(
        &mut self,
        dst: *mut u8,
        src: *const u8,
        len: usize,
        kind: CopyKind,
    ) -> Result<()> {
        // SAFETY: the caller upholds the # Safety contract of this function.
        unsafe {
            let parts = self.threads().min(len / MIN_SHARE_BYTES).max(1);
            // Shares in whole cache lines.
            let share = len.div_ceil(parts).div_ceil(64) * 64;
            let mut sent = 0;
            let mut off = share; // the caller takes [0, share)
            for tx in self.senders.iter().take(parts - 1) {
                if off >= len {
                    break;
                }
                let n = share.min(len - off);
                let job = Job {
                    dst: dst.add(off) as usize,
                    src: src.add(off) as usize,
                    len: n,
                    kind,
                };
                if tx.send(job).is_err() {
                    // Wait for those already sent before reporting, so no worker outlives the
                    // borrow.
                    for _ in 0..sent {
                        let _ = self.done.recv();
                    }
                    return Err(PinnedError::Internal("a staging thread died".into()));
                }
                sent += 1;
                off += n;
            }
            copy_bytes(dst, src, share.min(len), kind);
            let mut lost = false;
            for _ in 0..sent {
                if recv_spinning(&self.done).is_none() {
                    lost = true;
                }
            }
            if lost {
                return Err(PinnedError::Internal("a staging thread died".into()));
            }
            Ok(())
        }
    }
}

impl Drop for CopyPool {
    fn drop(&mut self) {
        self.senders.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Waits for the DMA of every slot below `nbuf`, also after an error, so that no DMA reads or
/// writes a buffer the ring uses again; returns `result`, or else the first wait's error.
fn drain(dma: &mut dyn StagingDma, nbuf: usize, mut result: Result<()>) -> Result<()> {
    for slot in 0..nbuf {
        let w = dma.wait(slot);
        if result.is_ok() {
            result = w;
        }
    }
    result
}

/// The DMA side of a staged copy: starts copies between a staging buffer and the device and
/// says when the last one through a buffer has finished.
pub trait StagingDma {
    /// Queues a copy of `len` bytes from staging buffer `slot` (host address `src`) to
    /// device offset `dst_offset`, and marks `slot` busy until it completes.
    ///
    /// # Safety
    /// `src` stays readable and unchanged for `len` bytes until [`StagingDma::wait`] on `slot`
    /// returns.
    unsafe fn start_h2d(
        &mut self,
        slot: usize,
        src: *const u8,
        dst_offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Queues a copy of `len` bytes from device offset `src_offset` into staging buffer
    /// `slot` (host address `dst`), and marks `slot` busy until it completes.
    ///
    /// # Safety
    /// `dst` stays writable, and untouched by anyone else, for `len` bytes until
    /// [`StagingDma::wait`] on `slot` returns.
    unsafe fn start_d2h(
        &mut self,
        slot: usize,
        src_offset: usize,
        dst: *mut u8,
        len: usize,
    ) -> Result<()>;

    /// Waits until the last copy queued through `slot` has finished (at once if none).
    ///
    /// # Errors
    /// The backend's error.
    fn wait(&mut self, slot: usize) -> Result<()>;
}

/// How to build a [`StagingRing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StagingConfig {
    /// Bytes per staging buffer (one DMA per chunk).
    pub chunk_bytes: usize,
    /// Staging buffers in the ring (≥ 2 to overlap).
    pub buffers: usize,
    /// Host threads that fill or drain a chunk together (the caller included; at most the
    /// CPUs available).
    pub threads: usize,
    /// How they copy.
    pub copy: CopyKind,
}

impl Default for StagingConfig {
    /// 16 MiB chunks, 4 buffers, 12 threads, non-temporal stores: for a 16-core host;
    /// `gpumem bench transfer --staging-sweep` measures the alternatives.
    fn default() -> Self {
        Self {
            chunk_bytes: 16 << 20,
            buffers: 4,
            threads: 12,
            copy: CopyKind::NonTemporal,
        }
    }
}

/// A ring of pinned staging buffers with a persistent copy pool.
pub struct StagingRing {
    bufs: Vec<PinnedBuffer>,
    events: Vec<Event>,
    pool: CopyPool,
    config: StagingConfig,
}

impl std::fmt::Debug for StagingRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagingRing")
            .field("config", &self.config)
            .finish()
    }
}

impl StagingRing {
    fn check(config: &StagingConfig) -> Result<()> {
        if config.chunk_bytes == 0 || config.buffers == 0 || config.threads == 0 {
            return Err(PinnedError::InvalidArgument(format!(
                "staging ring needs chunk, buffers and threads > 0: {config:?}"
            )));
        }
        Ok(())
    }

    /// A ring of `cuMemHostAlloc` buffers (default flags) in `host`'s context, one event each.
    ///
    /// # Errors
    /// [`PinnedError::InvalidArgument`] for zero sizes; driver errors.
    pub fn new_cuda(host: &CudaContext, config: StagingConfig) -> Result<Self> {
        Self::check(&config)?;
        let mut bufs = Vec::with_capacity(config.buffers);
        let mut events = Vec::with_capacity(config.buffers);
        for _ in 0..config.buffers {
            bufs.push(PinnedBuffer::new_cuda(
                host,
                config.chunk_bytes,
                HostAllocFlags::DEFAULT,
            )?);
            events.push(Event::new(host, false)?);
        }
        Self::with_buffers(bufs, events, config)
    }

    /// A ring of mlock'ed buffers, for use with a host-side [`StagingDma`] (tests, no CUDA).
    ///
    /// # Errors
    /// [`PinnedError::InvalidArgument`] for zero sizes; [`PinnedError::MemlockLimit`].
    pub fn new_locked(config: StagingConfig) -> Result<Self> {
        Self::check(&config)?;
        let bufs = (0..config.buffers)
            .map(|_| PinnedBuffer::new_locked(config.chunk_bytes))
            .collect::<Result<Vec<_>>>()?;
        Self::with_buffers(bufs, Vec::new(), config)
    }

    /// The ring of `bufs` (and their `events`, if any) with its copy threads started.
    fn with_buffers(
        bufs: Vec<PinnedBuffer>,
        events: Vec<Event>,
        config: StagingConfig,
    ) -> Result<Self> {
        let pool = CopyPool::new(config.threads)?;
        // The threads started, which the CPUs available bound: what the ring measures with.
        let config = StagingConfig {
            threads: pool.threads(),
            ..config
        };
        Ok(Self {
            bufs,
            events,
            pool,
            config,
        })
    }

    /// The configuration, with `threads` as started: at most the CPUs available, whatever
    /// was asked.
    pub fn config(&self) -> StagingConfig {
        self.config
    }

    /// Streams `src` (pageable) to the device through the ring: for each chunk, waits until
    /// its buffer's previous DMA is done, fills it with all threads, queues its DMA. Returns
    /// when every DMA has finished.
    ///
    /// # Errors
    /// The DMA backend's or the copy pool's error; the ring stays usable.
    pub fn stage_h2d(&mut self, src: &[u8], dma: &mut dyn StagingDma) -> Result<()> {
        let result = self.queue_h2d(src, dma);
        drain(dma, self.bufs.len(), result)
    }

    /// The chunks of [`StagingRing::stage_h2d`], up to the first error; leaves the DMAs in
    /// flight.
    fn queue_h2d(&mut self, src: &[u8], dma: &mut dyn StagingDma) -> Result<()> {
        let chunk = self.config.chunk_bytes;
        let nbuf = self.bufs.len();
        for (i, piece) in src.chunks(chunk).enumerate() {
            let slot = i % nbuf;
            dma.wait(slot)?;
            let buf = &mut self.bufs[slot][..piece.len()];
            self.pool.copy(buf, piece, self.config.copy)?;
            // SAFETY: the buffer is owned by the ring and not written again before
            // `dma.wait(slot)` returns (next round, or the drain in `stage_h2d`).
            unsafe { dma.start_h2d(slot, buf.as_ptr(), i * chunk, piece.len()) }?;
        }
        Ok(())
    }

    /// Streams device memory into `dst` (pageable) through the ring: queues the DMAs of the
    /// first `buffers` chunks, then for each chunk waits for its DMA, drains the buffer with
    /// all threads and queues the DMA of the chunk `buffers` ahead into it.
    ///
    /// # Errors
    /// As [`StagingRing::stage_h2d`].
    pub fn stage_d2h(&mut self, dst: &mut [u8], dma: &mut dyn StagingDma) -> Result<()> {
        let result = self.queue_d2h(dst, dma);
        drain(dma, self.bufs.len(), result)
    }

    /// The chunks of [`StagingRing::stage_d2h`], up to the first error; leaves the DMAs in
    /// flight.
    fn queue_d2h(&mut self, dst: &mut [u8], dma: &mut dyn StagingDma) -> Result<()> {
        let chunk = self.config.chunk_bytes;
        let nbuf = self.bufs.len();
        let total = dst.len();
        let nchunks = total.div_ceil(chunk);
        let piece_len = |i: usize| chunk.min(total - i * chunk);
        for i in 0..nchunks.min(nbuf) {
            let p = self.bufs[i].as_mut_ptr();
            // SAFETY: the buffer is not touched before `dma.wait(i)`.
            unsafe { dma.start_d2h(i, i * chunk, p, piece_len(i)) }?;
        }
        for (i, out) in dst.chunks_mut(chunk).enumerate() {
            let slot = i % nbuf;
            dma.wait(slot)?;
            self.pool
                .copy(out, &self.bufs[slot][..out.len()], self.config.copy)?;
            let next = i + nbuf;
            if next < nchunks {
                let p = self.bufs[slot].as_mut_ptr();
                // SAFETY: as above.
                unsafe { dma.start_d2h(slot, next * chunk, p, piece_len(next)) }?;
            }
        }
        Ok(())
    }

    /// Copies pageable `src` into `dst` at `dst_offset` on `stream` through the ring, and
    /// returns when the data is on the device (like a pageable `cuMemcpyHtoD`).
    ///
    /// # Errors
    /// [`PinnedError::InvalidArgument`] if the range passes the end of `dst` or the ring was
    /// made without CUDA; driver errors.
    pub fn copy_pageable_to_device(
        &mut self,
        src: &[u8],
        dst: &DeviceBuffer,
        dst_offset: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.through_cuda(
            "cuMemcpyHtoDAsync",
            dst,
            dst_offset,
            src.len(),
            stream,
            |ring, dma| ring.stage_h2d(src, dma),
        )
    }

    /// Copies `src` at `src_offset` on the device into pageable `dst` through the ring, and
    /// returns when `dst` holds the data.
    ///
    /// # Errors
    /// As [`StagingRing::copy_pageable_to_device`].
    pub fn copy_device_to_pageable(
        &mut self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &mut [u8],
        stream: &Stream,
    ) -> Result<()> {
        self.through_cuda(
            "cuMemcpyDtoHAsync",
            src,
            src_offset,
            dst.len(),
            stream,
            |ring, dma| ring.stage_d2h(dst, dma),
        )
    }

    /// Runs `stage` with the ring's events as a [`CudaDma`] on `stream` to or from
    /// `len` bytes at `offset` of a device buffer (`call` names the copy in the error of a
    /// range that passes the buffer's end), and takes the events back.
    fn through_cuda(
        &mut self,
        call: &'static str,
        buf: &DeviceBuffer,
        offset: usize,
        len: usize,
        stream: &Stream,
        stage: impl FnOnce(&mut Self, &mut CudaDma<'_>) -> Result<()>,
    ) -> Result<()> {
        buf.check_range(call, offset, len)
            .map_err(|e| PinnedError::InvalidArgument(e.to_string()))?;
        let events = std::mem::take(&mut self.events);
        let mut dma = CudaDma::new(events, stream, buf.device_ptr() + offset as u64)?;
        let r = stage(self, &mut dma);
        self.events = dma.events;
        r
    }
}

/// A [`StagingDma`] that copies nothing: measures the host side of a staged copy alone
/// (the ceiling the ring can reach whatever the link).
#[derive(Debug, Default, Clone, Copy)]
pub struct NullDma;

impl StagingDma for NullDma {
    unsafe fn start_h2d(&mut self, _: usize, _: *const u8, _: usize, _: usize) -> Result<()> {
        Ok(())
    }
    unsafe fn start_d2h(&mut self, _: usize, _: usize, _: *mut u8, _: usize) -> Result<()> {
        Ok(())
    }
    fn wait(&mut self, _: usize) -> Result<()> {
        Ok(())
    }
}

/// [`StagingDma`] on a CUDA stream: `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` then
/// `cuEventRecord` of the slot's event; waiting is `cuEventSynchronize`.
struct CudaDma<'s> {
    events: Vec<Event>,
    stream: &'s Stream,
    device: u64,
}

impl<'s> CudaDma<'s> {
    fn new(events: Vec<Event>, stream: &'s Stream, device: u64) -> Result<Self> {
        if events.is_empty() {
            return Err(PinnedError::InvalidArgument(
                "this staging ring was made without CUDA (StagingRing::new_locked)".into(),
            ));
        }
        Ok(Self {
            events,
            stream,
            device,
        })
    }

    fn event(&mut self, slot: usize) -> Result<&mut Event> {
        self.events
            .get_mut(slot)
            .ok_or_else(|| PinnedError::Internal(format!("no event for staging slot {slot}")))
    }
}

impl StagingDma for CudaDma<'_> {
    unsafe fn start_h2d(
        &mut self,
        slot: usize,
        src: *const u8,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        // SAFETY: the caller upholds the # Safety contract of this function.
        unsafe {
            self.stream
                .copy_h2d_raw(self.device + dst_offset as u64, src, len)?;
            let stream = self.stream;
            Ok(self.event(slot)?.record(stream)?)
        }
    }

    unsafe fn start_d2h(
        &mut self,
        slot: usize,
        src_offset: usize,
        dst: *mut u8,
        len: usize,
    ) -> Result<()> {
        // SAFETY: the caller upholds the # Safety contract of this function.

        unsafe {
            self.stream
                .copy_d2h_raw(dst, self.device + src_offset as u64, len)?;
            let stream = self.stream;
            Ok(self.event(slot)?.record(stream)?)
        }
    }

    fn wait(&mut self, slot: usize) -> Result<()> {
        Ok(self.event(slot)?.synchronize()?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn copy_pool_copies_every_byte_with_both_kinds() {
        let mut pool = CopyPool::new(4).unwrap();
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert_eq!(pool.threads(), 4.min(cpus));
        for kind in [CopyKind::Libc, CopyKind::NonTemporal] {
            for len in [0usize, 1, 63, 64, 65, 1000, (1 << 20) + 17, 3 << 20] {
                let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
                let mut dst = vec![0u8; len + 3];
                // An unaligned destination exercises the head and tail of the NT copy.
                pool.copy(&mut dst[3..], &src, kind).unwrap();
                assert_eq!(&dst[3..], &src[..], "{kind:?} {len}");
                assert_eq!(&dst[..3], &[0, 0, 0]);
            }
        }
        let mut small = [0u8; 3];
        assert!(pool.copy(&mut small, &[1, 2], CopyKind::Libc).is_err());
    }

    /// The ring's configuration says the threads it started (at most one per CPU), not the
    /// number asked for (`bench transfer --stage-threads 100000` printed "threads 100000").
    #[test]
    fn the_ring_reports_the_threads_it_started() {
        let cpus = std::thread::available_parallelism().unwrap().get();
        let asked = StagingConfig {
            chunk_bytes: 4096,
            buffers: 2,
            threads: cpus + 100,
            copy: CopyKind::Libc,
        };
        let Ok(ring) = StagingRing::new_locked(asked) else {
            eprintln!("skipped: 8 KiB cannot be locked here (RLIMIT_MEMLOCK)");
            return;
        };
        assert_eq!(ring.config().threads, cpus);
        assert_eq!(
            StagingConfig {
                threads: asked.threads,
                ..ring.config()
            },
            asked
        );
    }
}
