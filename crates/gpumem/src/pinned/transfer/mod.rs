//! Measurements behind `gpumem bench transfer` and `gpumem bench pinned`.
//!
//! Copies are timed with CUDA events around the copy on its stream (median of repeats, after
//! one warm-up copy); allocation calls with the host's monotonic clock.

use super::advise::{AllocPoint, Direction, MemoryKind};
use super::staging::{StagingConfig, StagingRing};
use super::sysinfo::{numa_node_of_address, numa_node_of_pci};
use super::{HostAllocFlags, HostRegistration, PinnedBuffer, PinnedError, PinnedPool, Result};
use super::{PinnedPoolConfig, DEFAULT_REGISTER_CHUNK_BYTES};
use crate::cuda::{driver, CopyKernel, CudaContext, DeviceBuffer, Event, Stream};
use crate::measure::median;
use std::time::Instant;

mod sweep;

pub use sweep::{
    host_side, sweep, StagingRate, SweepConfig, SweepProgress, SweepReport, TransferRow,
};

/// How mapped (zero-copy) memory is read by the device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum MappedMethod {
    /// A kernel (`copy16`, JIT-compiled PTX) reads (or writes) the mapped host memory.
    Kernel,
    /// The kernel could not be loaded (the error is given): `cuMemcpyDtoDAsync` from the
    /// mapped device address, which the copy engine serves over PCIe like a pinned copy.
    DtoD(String),
}

/// Copy threads of a staging ring when none are asked for: two below the CPU count (as in
/// [`sweep_grid`]), between 1 and 12.
pub fn default_copy_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(4, std::num::NonZeroUsize::get);
    cpus.saturating_sub(2).clamp(1, 12)
}

/// The staging settings a sweep tries: chunk × buffers × threads × copy kind. Copy threads
/// stay at least two below the CPU count: the caller's thread and the driver's need cores too,
/// and a ring whose copy threads have to share cores collapses, even minutes after a sweep
/// measured it fast (`docs/decisions.md`, "Staging copy threads two below the CPU count").
pub fn sweep_grid() -> Vec<StagingConfig> {
    let cpus = std::thread::available_parallelism().map_or(4, std::num::NonZeroUsize::get);
    let max_threads = cpus.saturating_sub(2).max(1);
    let mut thread_counts: Vec<usize> = [4usize, 8, 12, 16]
        .into_iter()
        .filter(|&t| t <= max_threads)
        .collect();
    if thread_counts.is_empty() {
        thread_counts.push(max_threads);
    }
    let mut grid = Vec::new();
    for chunk in [1usize << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20] {
        for buffers in [2usize, 4, 8] {
            for &threads in &thread_counts {
                for copy in [super::CopyKind::Libc, super::CopyKind::NonTemporal] {
                    grid.push(StagingConfig {
                        chunk_bytes: chunk,
                        buffers,
                        threads,
                        copy,
                    });
                }
            }
        }
    }
    grid
}

/// The bandwidth chart of `gpumem bench transfer --plot`: one line per series of
/// `(bytes, GB/s)` points, size on a log axis.
pub fn bandwidth_chart(series: &[(String, Vec<(u64, f64)>)], device: &str) -> crate::plot::Chart {
    use crate::plot::{Chart, Series, PALETTE};
    Chart {
        title: format!("{device} — host↔device bandwidth"),
        x_label: "transfer size".into(),
        log_x: true,
        panels: vec![(
            String::new(),
            "GB/s".into(),
            series
                .iter()
                .enumerate()
                .map(|(i, (label, pts))| Series {
                    label: label.clone(),
                    color: PALETTE[i % PALETTE.len()].into(),
                    dashed: false,
                    width: 1.6,
                    points: pts.iter().map(|&(b, g)| (b as f64, g)).collect(),
                })
                .collect(),
        )],
        ..Chart::default()
    }
}

/// Host and device buffers and streams for transfer measurements, allocated once for the
/// largest size.
pub struct TransferBench {
    host: CudaContext,
    s1: Stream,
    s2: Stream,
    start: Event,
    end: Event,
    join: Event,
    dev_a: DeviceBuffer,
    dev_b: DeviceBuffer,
    pageable_a: Vec<u8>,
    pageable_b: Vec<u8>,
    pinned_a: Option<PinnedBuffer>,
    pinned_b: Option<PinnedBuffer>,
    wc: Option<PinnedBuffer>,
    wc_b: Option<PinnedBuffer>,
    mapped_a: Option<PinnedBuffer>,
    mapped_b: Option<PinnedBuffer>,
    staging: Option<StagingRing>,
    /// Two rings with half the threads each, for staged copies both ways at once (made on
    /// first use).
    staging_both: Option<(StagingRing, StagingRing)>,
    kernel: Option<CopyKernel>,
    mapped_method: MappedMethod,
    max_bytes: usize,
}

impl std::fmt::Debug for TransferBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferBench")
            .field("max_bytes", &self.max_bytes)
            .field("mapped_method", &self.mapped_method)
            .finish()
    }
}

impl TransferBench {
    /// Allocates two device buffers and, for each kind in `kinds`, two host buffers of
    /// `max_bytes` (pageable ones touched), plus a staging ring with `staging`.
    ///
    /// # Errors
    /// Driver errors (out of memory, ...).
    pub fn new(
        host: &CudaContext,
        max_bytes: usize,
        kinds: &[MemoryKind],
        staging: StagingConfig,
    ) -> Result<Self> {
        let has = |k| kinds.contains(&k);
        let pinned = |flags| PinnedBuffer::new_cuda(host, max_bytes, flags);
        let both = |flags| -> Result<(Option<PinnedBuffer>, Option<PinnedBuffer>)> {
            Ok((Some(pinned(flags)?), Some(pinned(flags)?)))
        };
        let (pinned_a, pinned_b) = if has(MemoryKind::Pinned) {
            both(HostAllocFlags::DEFAULT)?
        } else {
            (None, None)
        };
        let (mapped_a, mapped_b) = if has(MemoryKind::Mapped) {
            both(HostAllocFlags::MAPPED)?
        } else {
            (None, None)
        };
        let (wc, wc_b) = if has(MemoryKind::WriteCombined) {
            both(HostAllocFlags::WRITE_COMBINED)?
        } else {
            (None, None)
        };
        let needs_pageable = has(MemoryKind::Pageable) || has(MemoryKind::Staged);
        let pageable_len = if needs_pageable { max_bytes } else { 0 };
        let (kernel, mapped_method) = if has(MemoryKind::Mapped) {
            match CopyKernel::load(host) {
                Ok(k) => (Some(k), MappedMethod::Kernel),
                Err(e) => (None, MappedMethod::DtoD(e.to_string())),
            }
        } else {
            (None, MappedMethod::Kernel)
        };
        let staging = if has(MemoryKind::Staged) {
            Some(StagingRing::new_cuda(host, staging)?)
        } else {
            None
        };
        Ok(Self {
            host: host.clone(),
            s1: Stream::new(host)?,
            s2: Stream::new(host)?,
            start: Event::new(host, true)?,
            end: Event::new(host, true)?,
            join: Event::new(host, false)?,
            dev_a: DeviceBuffer::new(host, max_bytes)?,
            dev_b: DeviceBuffer::new(host, max_bytes)?,
            // Written, so every page is present before timing.
            pageable_a: vec![0x5a; pageable_len],
            pageable_b: vec![0xa5; pageable_len],
            pinned_a,
            pinned_b,
            wc,
            wc_b,
            mapped_a,
            mapped_b,
            staging,
            staging_both: None,
            kernel,
            mapped_method,
            max_bytes,
        })
    }

    /// How mapped memory is measured.
    pub fn mapped_method(&self) -> &MappedMethod {
        &self.mapped_method
    }

    /// The staging ring's configuration, if there is one.
    pub fn staging_config(&self) -> Option<StagingConfig> {
        self.staging.as_ref().map(|s| s.config())
    }

    /// Replaces the staging ring (for a sweep over its settings).
    ///
    /// # Errors
    /// Driver errors.
    pub fn set_staging(&mut self, config: StagingConfig) -> Result<()> {
        self.staging = None; // free the old rings first
        self.staging_both = None;
        self.staging = Some(StagingRing::new_cuda(&self.host, config)?);
        Ok(())
    }

    /// NUMA node of the GPU and of the host buffers of each kind allocated (`None` where the
    /// OS does not say).
    pub fn numa(&self) -> (Option<i32>, Vec<(MemoryKind, Option<i32>)>) {
        let gpu = self
            .host
            .pci_bus_id()
            .ok()
            .and_then(|b| numa_node_of_pci(&b));
        let mut host = Vec::new();
        let mut add = |k, p: Option<*const u8>| {
            if let Some(p) = p {
                host.push((k, numa_node_of_address(p as usize)));
            }
        };
        add(
            MemoryKind::Pageable,
            (!self.pageable_a.is_empty()).then_some(self.pageable_a.as_ptr()),
        );
        add(
            MemoryKind::Pinned,
            self.pinned_a.as_ref().map(|b| b.as_ptr()),
        );
        add(
            MemoryKind::WriteCombined,
            self.wc.as_ref().map(|b| b.as_ptr()),
        );
        add(
            MemoryKind::Mapped,
            self.mapped_a.as_ref().map(|b| b.as_ptr()),
        );
        (gpu, host)
    }

    fn check_size(&self, bytes: usize) -> Result<()> {
        if bytes == 0 || bytes > self.max_bytes {
            return Err(PinnedError::InvalidArgument(format!(
                "{bytes} B: sizes must be in 1..={} B",
                self.max_bytes
            )));
        }
        Ok(())
    }

    /// Queues (or, for pageable and staged memory, performs) one copy of `kind` and
    /// `direction`; `Ok(false)` for combinations not measured.
    fn issue(&mut self, kind: MemoryKind, dir: Direction, bytes: usize) -> Result<bool> {
        let (da, db) = (self.dev_a.device_ptr(), self.dev_b.device_ptr());
        let h2d = |s: &Stream, p: *const u8| {
            // SAFETY: `p` points into a host buffer of `max_bytes ≥ bytes` owned by self, which
            // outlives the copy (every measurement synchronises before returning).
            unsafe { s.copy_h2d_raw(da, p, bytes) }
        };
        let d2h = |s: &Stream, p: *mut u8| {
            // SAFETY: as above; nothing reads the buffer while the copy runs.
            unsafe { s.copy_d2h_raw(p, db, bytes) }
        };
        match (kind, dir) {
            (MemoryKind::Pageable, Direction::H2d) => h2d(&self.s1, self.pageable_a.as_ptr())?,
            (MemoryKind::Pageable, Direction::D2h) => d2h(&self.s1, self.pageable_b.as_mut_ptr())?,
            (MemoryKind::Pageable, Direction::Both) => {
                h2d(&self.s1, self.pageable_a.as_ptr())?;
                d2h(&self.s2, self.pageable_b.as_mut_ptr())?;
            }
            (MemoryKind::Pinned, _) => {
                let (Some(a), Some(b)) = (&self.pinned_a, &mut self.pinned_b) else {
                    return Ok(false);
                };
                match dir {
                    Direction::H2d => h2d(&self.s1, a.as_ptr())?,
                    Direction::D2h => d2h(&self.s1, b.as_mut_ptr())?,
                    Direction::Both => {
                        h2d(&self.s1, a.as_ptr())?;
                        d2h(&self.s2, b.as_mut_ptr())?;
                    }
                }
            }
            (MemoryKind::WriteCombined, Direction::H2d) => {
                let Some(w) = &self.wc else { return Ok(false) };
                h2d(&self.s1, w.as_ptr())?;
            }
            (MemoryKind::WriteCombined, Direction::D2h) => {
                let Some(w) = &mut self.wc else {
                    return Ok(false);
                };
                d2h(&self.s1, w.as_mut_ptr())?;
            }
            (MemoryKind::Mapped, _) => {
                let (Some(a), Some(b)) = (&self.mapped_a, &self.mapped_b) else {
                    return Ok(false);
                };
                let (Some(ma), Some(mb)) = (a.device_ptr(), b.device_ptr()) else {
                    return Err(PinnedError::Internal(
                        "mapped buffer without device address".into(),
                    ));
                };
                let run = |s: &Stream, dst: u64, src: u64| -> Result<()> {
                    match &self.kernel {
                        // SAFETY: both ranges are live allocations of ≥ bytes, 16-byte aligned
                        // (page-aligned starts), disjoint; synchronised before return.
                        Some(k) => Ok(unsafe { k.launch(s, dst, src, bytes) }?),
                        // SAFETY: as above.
                        None => Ok(unsafe { s.copy_d2d_raw(dst, src, bytes) }?),
                    }
                };
                match dir {
                    Direction::H2d => run(&self.s1, da, ma)?,
                    Direction::D2h => run(&self.s1, mb, db)?,
                    Direction::Both => {
                        run(&self.s1, da, ma)?;
                        run(&self.s2, mb, db)?;
                    }
                }
            }
            (MemoryKind::Staged, Direction::H2d) => {
                let Some(ring) = &mut self.staging else {
                    return Ok(false);
                };
                ring.copy_pageable_to_device(&self.pageable_a[..bytes], &self.dev_a, 0, &self.s1)?;
            }
            (MemoryKind::Staged, Direction::D2h) => {
                let Some(ring) = &mut self.staging else {
                    return Ok(false);
                };
                ring.copy_device_to_pageable(
                    &self.dev_b,
                    0,
                    &mut self.pageable_b[..bytes],
                    &self.s1,
                )?;
            }
            (MemoryKind::WriteCombined, Direction::Both) => {
                let (Some(a), Some(b)) = (&self.wc, &mut self.wc_b) else {
                    return Ok(false);
                };
                h2d(&self.s1, a.as_ptr())?;
                d2h(&self.s2, b.as_mut_ptr())?;
            }
            (MemoryKind::Staged, Direction::Both) => {
                let Some(ring) = &self.staging else {
                    return Ok(false);
                };
                if self.staging_both.is_none() {
                    let mut c = ring.config();
                    c.threads = (c.threads / 2).max(1);
                    self.staging_both = Some((
                        StagingRing::new_cuda(&self.host, c)?,
                        StagingRing::new_cuda(&self.host, c)?,
                    ));
                }
                let Some((ra, rb)) = &mut self.staging_both else {
                    return Ok(false);
                };
                let (src, dst) = (&self.pageable_a[..bytes], &mut self.pageable_b[..bytes]);
                let (dev_a, dev_b, s1, s2) = (&self.dev_a, &self.dev_b, &self.s1, &self.s2);
                std::thread::scope(|scope| -> Result<()> {
                    let d2h = scope.spawn(move || rb.copy_device_to_pageable(dev_b, 0, dst, s2));
                    let h2d = ra.copy_pageable_to_device(src, dev_a, 0, s1);
                    let d2h = d2h
                        .join()
                        .map_err(|_| PinnedError::Internal("staging thread panicked".into()))?;
                    h2d.and(d2h)
                })?;
            }
        }
        Ok(true)
    }

    /// [`TransferBench::measure`] as the sweeps use it: at most 5 repeats from 256 MiB up (one
    /// such copy is long enough on its own), and the rate in decimal GB/s of the bytes moved
    /// (twice `bytes` for `Both`). Returns `(median seconds, GB/s)`, `None` for kinds not
    /// allocated.
    ///
    /// # Errors
    /// As [`TransferBench::measure`].
    pub fn measure_rate(
        &mut self,
        kind: MemoryKind,
        dir: Direction,
        bytes: u64,
        repeats: usize,
    ) -> Result<Option<(f64, f64)>> {
        let repeats = if bytes >= 256 << 20 {
            repeats.min(5)
        } else {
            repeats
        };
        let n = usize::try_from(bytes).map_err(|_| {
            PinnedError::InvalidArgument(format!("{bytes} bytes do not fit this machine's usize"))
        })?;
        let moved = if dir == Direction::Both {
            2 * bytes
        } else {
            bytes
        };
        Ok(self
            .measure(kind, dir, n, repeats)?
            .map(|s| (s, moved as f64 / s / 1e9)))
    }

    /// Median seconds of one copy of `bytes` bytes of `kind` in `direction` over `repeats`
    /// (after one warm-up), timed with CUDA events on the copy stream; for `Both`, from before
    /// the first to after the last of the two streams' copies (staged: two rings with half
    /// the threads each, one per direction, on two host threads). `None` for kinds not
    /// allocated.
    ///
    /// # Errors
    /// [`PinnedError::InvalidArgument`] for sizes past the buffers; driver errors.
    pub fn measure(
        &mut self,
        kind: MemoryKind,
        dir: Direction,
        bytes: usize,
        repeats: usize,
    ) -> Result<Option<f64>> {
        self.check_size(bytes)?;
        let mut times = Vec::with_capacity(repeats);
        // One direction: start, copy, end on one stream, as a plain cudaMemcpyAsync is timed.
        // Both: the second stream waits for `start` and `end` waits for the second stream.
        let two = dir == Direction::Both;
        for r in 0..=repeats.max(1) {
            self.start.record(&self.s1)?;
            if two {
                self.s2.wait_event(&self.start)?;
            }
            if !self.issue(kind, dir, bytes)? {
                self.s1.synchronize()?;
                return Ok(None);
            }
            if two {
                self.join.record(&self.s2)?;
                self.s1.wait_event(&self.join)?;
            }
            self.end.record(&self.s1)?;
            self.end.synchronize()?;
            if r > 0 {
                times.push(f64::from(self.end.elapsed_ms_since(&self.start)?) * 1e-3);
            }
        }
        Ok(Some(median(&mut times)))
    }

    /// Copy/compute overlap: how much of an H2D copy of `bytes` of `kind` (pageable or pinned)
    /// is hidden behind device-to-device copies running on another stream. The device work is
    /// sized to take about as long as the copy alone.
    ///
    /// # Errors
    /// Driver errors; [`PinnedError::InvalidArgument`] for kinds other than pageable/pinned.
    pub fn overlap(&mut self, kind: MemoryKind, bytes: usize, repeats: usize) -> Result<Overlap> {
        if !matches!(kind, MemoryKind::Pageable | MemoryKind::Pinned) {
            return Err(PinnedError::InvalidArgument(
                "overlap is measured for pageable and pinned memory".into(),
            ));
        }
        self.check_size(bytes)?;
        let p = match kind {
            MemoryKind::Pageable => self.pageable_a.as_ptr(),
            _ => self
                .pinned_a
                .as_ref()
                .map(|b| b.as_ptr())
                .ok_or_else(|| PinnedError::InvalidArgument("pinned not allocated".into()))?,
        };
        let dev_a = self.dev_a.device_ptr();
        let copy = |s: &Stream| -> Result<()> {
            // SAFETY: the host buffer is owned by self and outlives the copy, which is
            // synchronised before the measurement returns.
            Ok(unsafe { s.copy_h2d_raw(dev_a, p, bytes) }?)
        };
        // Device-to-device copies between the two halves of dev_b (the H2D copy writes dev_a).
        let half = (self.max_bytes / 2) & !15;
        if half == 0 {
            return Err(PinnedError::InvalidArgument(
                "buffers too small for --overlap".into(),
            ));
        }
        let src = self.dev_b.device_ptr();
        let dst = src + half as u64;
        let dd = |s: &Stream| {
            // SAFETY: both halves lie inside dev_b, which outlives every use, and do not
            // overlap.
            unsafe { s.copy_d2d_raw(dst, src, half) }
        };
        // All three timings on the host clock, since two streams are involved.
        let mut t_copy = Vec::new();
        let mut t_dd = Vec::new();
        for _ in 0..3 {
            let (t, r) = time(|| copy(&self.s1).and_then(|()| Ok(self.s1.synchronize()?)));
            r?;
            t_copy.push(t);
            let (t, r) = time(|| dd(&self.s2).and_then(|()| self.s2.synchronize()));
            r?;
            t_dd.push(t);
        }
        let reps =
            ((median(&mut t_copy) / median(&mut t_dd).max(1e-9)).ceil() as usize).clamp(1, 10_000);
        let mut alone_copy = Vec::new();
        let mut alone = Vec::new();
        let mut both = Vec::new();
        for _ in 0..repeats.max(1) {
            let (t, r) = time(|| copy(&self.s1).and_then(|()| Ok(self.s1.synchronize()?)));
            r?;
            alone_copy.push(t);
            let (t, r) = time(|| -> Result<()> {
                for _ in 0..reps {
                    dd(&self.s2)?;
                }
                Ok(self.s2.synchronize()?)
            });
            r?;
            alone.push(t);
            let (t, r) = time(|| -> Result<()> {
                for _ in 0..reps {
                    dd(&self.s2)?;
                }
                copy(&self.s1)?;
                self.s1.synchronize()?;
                Ok(self.s2.synchronize()?)
            });
            r?;
            both.push(t);
        }
        let copy_s = median(&mut alone_copy);
        let device_s = median(&mut alone);
        let both_s = median(&mut both);
        let hidden = ((copy_s + device_s - both_s) / copy_s).clamp(0.0, 1.0);
        Ok(Overlap {
            kind,
            bytes: bytes as u64,
            copy_s,
            device_s,
            both_s,
            hidden_fraction: hidden,
        })
    }

    /// Checks that staged copies and the mapped path move the right bytes: a pattern goes
    /// host → device through the staging ring and back through a plain copy (and the reverse),
    /// and through the mapped path when allocated. Returns `(what, passed)` pairs.
    ///
    /// # Errors
    /// Driver errors.
    pub fn verify(&mut self, bytes: usize) -> Result<Vec<(&'static str, bool)>> {
        self.check_size(bytes)?;
        let mut out = Vec::new();
        let pattern = |i: usize| (i.wrapping_mul(2_654_435_761) >> 13) as u8;
        if let Some(ring) = &mut self.staging {
            for (i, x) in self.pageable_a[..bytes].iter_mut().enumerate() {
                *x = pattern(i);
            }
            ring.copy_pageable_to_device(&self.pageable_a[..bytes], &self.dev_a, 0, &self.s1)?;
            let mut back = vec![0u8; bytes];
            self.s1.copy_d2h(&mut back, &self.dev_a, 0)?;
            out.push(("staged_h2d", back == self.pageable_a[..bytes]));
            self.s1
                .copy_h2d(&self.dev_b, 0, &self.pageable_a[..bytes])?;
            self.pageable_b[..bytes].fill(0);
            ring.copy_device_to_pageable(&self.dev_b, 0, &mut self.pageable_b[..bytes], &self.s1)?;
            out.push((
                "staged_d2h",
                self.pageable_b[..bytes] == self.pageable_a[..bytes],
            ));
        }
        if let Some(a) = &mut self.mapped_a {
            for (i, x) in a[..bytes].iter_mut().enumerate() {
                *x = pattern(i + 7);
            }
            let r = self.issue(MemoryKind::Mapped, Direction::H2d, bytes & !15);
            r?;
            self.s1.synchronize()?;
            let mut back = vec![0u8; bytes & !15];
            self.s1.copy_d2h(&mut back, &self.dev_a, 0)?;
            let ok = self
                .mapped_a
                .as_ref()
                .is_some_and(|a| back[..] == a[..bytes & !15]);
            out.push(("mapped_read", ok));
        }
        Ok(out)
    }
}

/// Result of [`TransferBench::overlap`].
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Overlap {
    /// Host memory kind of the copy.
    pub kind: MemoryKind,
    /// Bytes copied.
    pub bytes: u64,
    /// Seconds of the copy alone.
    pub copy_s: f64,
    /// Seconds of the device-to-device work alone.
    pub device_s: f64,
    /// Seconds of both, started together.
    pub both_s: f64,
    /// `(copy + device − both) / copy`, clamped to 0..1: the share of the copy's time hidden
    /// behind the device work.
    pub hidden_fraction: f64,
}

/// Times `f` once with the monotonic clock, in seconds.
fn time<T>(f: impl FnOnce() -> T) -> (f64, T) {
    let t0 = Instant::now();
    let v = f();
    (t0.elapsed().as_secs_f64(), v)
}

/// Allocation costs of pinned memory at `bytes`, medians over `repeats`:
/// `cuMemHostAlloc`/`cuMemFreeHost` (raw, memory not touched), `cuMemHostRegister` of
/// touched `malloc` memory (64 GiB chunks) / unregister, `malloc` + first touch / `free`,
/// and the pool cold (a new pool: pins and zeroes) and warm (a block just freed).
/// Without `host`, the mlock fallback stands in for the CUDA calls (`mlock`, `pool_cold`,
/// `pool_warm` over mlock).
///
/// # Errors
/// Driver or OS errors ([`PinnedError::MemlockLimit`] on the fallback).
pub fn alloc_costs(
    host: Option<&CudaContext>,
    bytes: usize,
    repeats: usize,
) -> Result<Vec<AllocPoint>> {
    let repeats = repeats.max(1);
    let mut out = Vec::new();
    let mut push = |method: &str, a: &mut Vec<f64>, f: &mut Vec<f64>| {
        out.push(AllocPoint {
            method: method.to_string(),
            bytes: bytes as u64,
            alloc_s: median(a),
            free_s: median(f),
        });
    };
    let (mut a, mut f) = (Vec::new(), Vec::new());
    // malloc + first touch.
    for _ in 0..repeats {
        let (ta, v) = time(|| {
            let mut v: Vec<u8> = Vec::with_capacity(bytes);
            let p = v.spare_capacity_mut();
            for i in (0..bytes).step_by(4096) {
                p[i].write(1);
            }
            v
        });
        let (tf, ()) = time(|| drop(v));
        a.push(ta);
        f.push(tf);
    }
    push("malloc+touch", &mut a, &mut f);
    match host {
        Some(h) => {
            h.bind()?;
            let (mut a, mut f) = (Vec::new(), Vec::new());
            for _ in 0..repeats {
                // SAFETY: raw cuMemHostAlloc / cuMemFreeHost pair; the memory is never read.
                let (ta, p) = time(|| driver::mem_host_alloc(bytes, 0));
                let p = p?;
                // SAFETY: `p` came from cuMemHostAlloc above and is freed once.
                let (tf, r) = time(|| unsafe { driver::mem_free_host(p) });
                r?;
                a.push(ta);
                f.push(tf);
            }
            push("cuMemHostAlloc", &mut a, &mut f);
            let (mut a, mut f) = (Vec::new(), Vec::new());
            let mut mem = vec![1u8; bytes];
            for _ in 0..repeats {
                let (ta, r) = time(|| {
                    HostRegistration::new_cuda(
                        h,
                        &mut mem,
                        DEFAULT_REGISTER_CHUNK_BYTES,
                        false,
                        false,
                    )
                });
                let r = r?;
                let (tf, ()) = time(|| drop(r));
                a.push(ta);
                f.push(tf);
            }
            push("cuMemHostRegister", &mut a, &mut f);
        }
        None => {
            let (mut a, mut f) = (Vec::new(), Vec::new());
            for _ in 0..repeats {
                let (ta, b) = time(|| PinnedBuffer::new_locked(bytes));
                let b = b?;
                let (tf, ()) = time(|| drop(b));
                a.push(ta);
                f.push(tf);
            }
            push("mlock", &mut a, &mut f);
        }
    }
    let config = || match host {
        Some(h) => PinnedPoolConfig {
            source: super::pool::PinnedSource::Cuda(h.clone(), HostAllocFlags::DEFAULT),
            cap_bytes: None,
        },
        None => PinnedPoolConfig {
            source: super::pool::PinnedSource::Locked,
            cap_bytes: None,
        },
    };
    let (mut a, mut f) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let pool = PinnedPool::new(config());
        let (ta, b) = time(|| pool.alloc(bytes));
        let b = b?;
        drop(b);
        let (tf, released) = time(|| pool.empty_cache());
        if released == 0 {
            return Err(PinnedError::Internal("pool released nothing".into()));
        }
        a.push(ta);
        f.push(tf);
    }
    push("pool_cold", &mut a, &mut f);
    let pool = PinnedPool::new(config());
    drop(pool.alloc(bytes)?);
    let (mut a, mut f) = (Vec::new(), Vec::new());
    for _ in 0..repeats.max(1000) {
        let (ta, b) = time(|| pool.alloc(bytes));
        let b = b?;
        let (tf, ()) = time(|| drop(b));
        a.push(ta);
        f.push(tf);
    }
    push("pool_warm", &mut a, &mut f);
    Ok(out)
}

/// The fixed request set of `gpumem bench pinned --json`: 1 MiB, 3 MiB, 5 MiB, 100 MiB,
/// 300 MiB, 1 GiB + 1 B, in bytes.
pub const OVERHEAD_REQUESTS: [u64; 6] = [
    1 << 20,
    3 << 20,
    5 << 20,
    100 << 20,
    300 << 20,
    (1 << 30) + 1,
];

/// Allocates every request of `requests` at once from a fresh pool (CUDA with `host`, else
/// the mlock fallback) and returns the pool's statistics while they are live: its
/// `pinned_over_requested()` is the bytes pinned ÷ bytes requested.
///
/// # Errors
/// The pool's errors (cap, driver, `RLIMIT_MEMLOCK`).
pub fn pool_overhead(host: Option<&CudaContext>, requests: &[u64]) -> Result<super::PinnedStats> {
    let source = match host {
        Some(h) => super::pool::PinnedSource::Cuda(h.clone(), HostAllocFlags::DEFAULT),
        None => super::pool::PinnedSource::Locked,
    };
    let pool = PinnedPool::new(PinnedPoolConfig {
        source,
        cap_bytes: None,
    });
    let mut live = Vec::new();
    for &r in requests {
        let n = usize::try_from(r)
            .map_err(|_| PinnedError::InvalidArgument(format!("{r} B does not fit usize")))?;
        live.push(pool.alloc(n)?);
    }
    let stats = pool.stats();
    drop(live);
    Ok(stats)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// `bench transfer --host-only` defaulted to 12 copy threads on a 2-core machine: the
    /// default stays two below the CPU count (at least 1, at most 12).
    #[test]
    fn default_copy_threads_fit_the_machine() {
        let cpus = std::thread::available_parallelism().map_or(4, std::num::NonZeroUsize::get);
        let t = default_copy_threads();
        assert!((1..=12).contains(&t));
        assert!(
            t <= cpus.saturating_sub(2).max(1),
            "{t} threads on {cpus} CPUs"
        );
        assert!(sweep_grid()
            .iter()
            .all(|c| c.threads <= cpus.saturating_sub(2).max(1)));
    }

    #[test]
    fn pool_overhead_of_small_requests_on_the_fallback() {
        // Small requests so the test passes under an 8 MiB RLIMIT_MEMLOCK too.
        let req = [100_000u64, 300_000, 1 << 20, (1 << 20) + 1];
        match pool_overhead(None, &req) {
            Ok(s) => {
                let classes: u64 = req
                    .iter()
                    .map(|&r| super::super::size_class::class_bytes(r).unwrap())
                    .sum();
                assert_eq!(s.pinned_bytes.current, classes);
                assert_eq!(s.requested_bytes.current, req.iter().sum::<u64>());
                assert!(s.pinned_over_requested() < 1.05, "{s:?}");
            }
            Err(e) => assert!(matches!(e, PinnedError::MemlockLimit { .. }), "{e}"),
        }
    }
}
