//! The library side of `gpumem bench alloc`: alloc+free pairs timed through any backend
//! (a [`DevicePool`], raw cuMemAlloc/cuMemFree, cuMemAllocAsync/cuMemFreeAsync) at several
//! thread counts.
//!
//! Method: each thread repeats batches of [`BATCH`] alloc+free pairs of one size on its own
//! stream and times each batch with `Instant`; latency figures are the median and 99th
//! percentile of per-pair time over all batches of all threads; throughput is the timed
//! pairs of all threads over the wall time from the moment every thread has warmed up (a
//! barrier) to the end of the last one. The mixed case allocates [`MIXED_LIVE`] blocks of
//! 1 KiB to 4 MiB (log-uniform, fixed seed) and then frees them all; one round is one sample,
//! divided by the allocations in it. Warm-up (not timed, not counted): one pair of a fixed
//! size, the first round of the mixed case (it fills the caches of a new stream from the
//! device).
//!
//! Raw driver baselines ([`AllocBackend::times_each_call`]) are timed the way the C++
//! baseline program does (`scripts/bench/baselines/alloc_costs.cu`): every cuMemAlloc and every
//! cuMemFree on its own, the pair's figure being the median allocation plus the median free.
//! Timing large pairs as one batch instead made the driver look several times slower than
//! the C++ program does, and inflated every speedup quoted against it.
use std::time::{Duration, Instant};

use gpumem_core::Device;
use serde::Serialize;

use super::driver::{self, CUcontext, CUstream};
use super::CudaDevice;
use crate::pool::{DevicePool, RawBlock};

/// Pairs per timed batch.
pub const BATCH: usize = 16;
/// Live allocations in one round of the mixed case.
pub const MIXED_LIVE: usize = 1000;

/// One workload: a fixed size, or the mixed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Case {
    /// Alloc+free pairs of this many bytes.
    Fixed(u64),
    /// [`MIXED_LIVE`] live allocations of 1 KiB..4 MiB, then all freed.
    Mixed,
}

impl Case {
    /// Label for tables (`256 B`, `1 GiB`, `mixed`).
    pub fn label(&self) -> String {
        match self {
            Case::Fixed(b) => crate::units::bytes_compact(*b),
            Case::Mixed => "mixed".into(),
        }
    }
}

/// Something that allocates and frees device memory.
pub trait AllocBackend: Sync {
    /// What a free needs back.
    type Token: Send;
    /// Name in the table (`tlsf`, `cuMemAlloc`, `cuMemAllocAsync`).
    fn label(&self) -> String;
    /// Called once on each benchmark thread before it starts (binds a CUDA context).
    ///
    /// # Errors
    /// A message if the thread cannot use the device.
    fn thread_init(&self) -> Result<(), String> {
        Ok(())
    }
    /// The stream thread `i` uses.
    fn stream(&self, i: usize) -> u64 {
        let _ = i;
        0
    }
    /// Allocates `bytes` on `stream`.
    ///
    /// # Errors
    /// A message naming what failed.
    fn alloc(&self, bytes: u64, stream: u64) -> Result<Self::Token, String>;
    /// Frees.
    ///
    /// # Errors
    /// A message naming what failed.
    fn free(&self, t: Self::Token, stream: u64) -> Result<(), String>;
    /// Whether each call is timed on its own (the driver baselines, whose calls take
    /// microseconds to milliseconds) rather than in batches of [`BATCH`] pairs.
    fn times_each_call(&self) -> bool {
        false
    }
}

/// One row of results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchRow {
    /// Backend label.
    pub backend: String,
    /// Workload.
    pub case: Case,
    /// Threads.
    pub threads: usize,
    /// Timed pairs done by all threads (warm-up excluded).
    pub pairs: u64,
    /// Median time of one alloc+free pair, in nanoseconds.
    pub median_ns: f64,
    /// 99th percentile, in nanoseconds.
    pub p99_ns: f64,
    /// Timed pairs per second over all threads (warm-up excluded), by the wall clock: it
    /// counts the time the threads waited for a core, which the median (of batches or calls,
    /// a few of them slowed) does not.
    pub pairs_per_s: f64,
    /// CPU seconds the timed threads ran ÷ (wall seconds × threads), when the platform tells
    /// each thread's CPU time: below 1 when the host gave the threads less than a core each
    /// (other work, or more threads than cores), and then `pairs_per_s` is that much below
    /// what the medians make. Calls that wait for the GPU lower it too.
    pub cpu_share: Option<f64>,
}

/// Stop rule for one measurement.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Time per measurement (each thread stops after it).
    pub time: Duration,
    /// Most pairs per thread.
    pub max_pairs: u64,
}

fn mixed_sizes(seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    (0..MIXED_LIVE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // log-uniform 2^10 .. 2^22
            let e = 10.0 + (x % 12_000) as f64 / 1000.0;
            (2f64.powf(e) as u64).clamp(1 << 10, 4 << 20)
        })
        .collect()
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Measures `case` on `threads` threads.
///
/// # Errors
/// The first backend error of any thread.
pub fn measure<B: AllocBackend>(
    b: &B,
    case: Case,
    threads: usize,
    budget: Budget,
) -> Result<BenchRow, String> {
    let n = threads.max(1);
    let barrier = std::sync::Barrier::new(n);
    let barrier = &barrier;
    let results: Vec<Result<ThreadRun, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|t| s.spawn(move || run_thread(b, case, t, budget, barrier)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("benchmark thread panicked".into()))
            })
            .collect()
    });
    let mut samples = Vec::new();
    let mut free_samples = Vec::new();
    let mut pairs = 0;
    let mut span: Option<(Instant, Instant)> = None;
    let mut cpu = Some(0.0);
    for r in results {
        let r = r?;
        cpu = cpu.zip(r.cpu_seconds).map(|(a, b)| a + b);
        samples.extend(r.samples);
        free_samples.extend(r.free_samples);
        pairs += r.pairs;
        span = Some(match span {
            None => (r.start, r.end),
            Some((s0, e0)) => (s0.min(r.start), e0.max(r.end)),
        });
    }
    let wall = span.map_or(0.0, |(s0, e0)| (e0 - s0).as_secs_f64());
    samples.sort_by(f64::total_cmp);
    free_samples.sort_by(f64::total_cmp);
    // Calls timed on their own: the pair is the median allocation plus the median free.
    let q = |x: f64| {
        percentile(&samples, x)
            + if free_samples.is_empty() {
                0.0
            } else {
                percentile(&free_samples, x)
            }
    };
    Ok(BenchRow {
        backend: b.label(),
        case,
        threads: n,
        pairs,
        median_ns: q(0.5),
        p99_ns: q(0.99),
        pairs_per_s: pairs as f64 / wall.max(1e-9),
        cpu_share: cpu
            .filter(|_| wall > 0.0)
            .map(|c| (c / (wall * n as f64)).min(1.0)),
    })
}

/// What one benchmark thread measured after its warm-up.
struct ThreadRun {
    /// Per-pair times, or per-allocation times when each call is timed.
    samples: Vec<f64>,
    /// Per-free times when each call is timed; empty otherwise.
    free_samples: Vec<f64>,
    pairs: u64,
    start: Instant,
    end: Instant,
    /// CPU seconds of the thread from `start` to `end`, when the platform tells.
    cpu_seconds: Option<f64>,
}

fn run_thread<B: AllocBackend>(
    b: &B,
    case: Case,
    t: usize,
    budget: Budget,
    barrier: &std::sync::Barrier,
) -> Result<ThreadRun, String> {
    // Every thread reaches the barrier, even after an error, so that none waits forever.
    let warm = warm_up(b, case, t);
    barrier.wait();
    let (stream, sizes, mut live) = warm?;
    let cpu_start = crate::measure::thread_cpu_seconds();
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut free_samples = Vec::new();
    let mut pairs = 0u64;
    match case {
        Case::Fixed(bytes) if b.times_each_call() => {
            while pairs < budget.max_pairs && start.elapsed() < budget.time {
                let t0 = Instant::now();
                let tok = b.alloc(bytes, stream)?;
                let t1 = Instant::now();
                b.free(tok, stream)?;
                samples.push((t1 - t0).as_nanos() as f64);
                free_samples.push(t1.elapsed().as_nanos() as f64);
                pairs += 1;
            }
        }
        Case::Fixed(bytes) => {
            while pairs < budget.max_pairs && start.elapsed() < budget.time {
                let t0 = Instant::now();
                for _ in 0..BATCH {
                    let tok = b.alloc(bytes, stream)?;
                    b.free(tok, stream)?;
                }
                samples.push(t0.elapsed().as_nanos() as f64 / BATCH as f64);
                pairs += BATCH as u64;
            }
        }
        Case::Mixed => {
            let mut round = 0;
            while (round < 1 || start.elapsed() < budget.time)
                && pairs < budget.max_pairs.max(MIXED_LIVE as u64)
            {
                let t0 = Instant::now();
                for &s in &sizes {
                    live.push(b.alloc(s, stream)?);
                }
                for tok in live.drain(..) {
                    b.free(tok, stream)?;
                }
                samples.push(t0.elapsed().as_nanos() as f64 / sizes.len() as f64);
                pairs += sizes.len() as u64;
                round += 1;
            }
        }
    }
    let end = Instant::now();
    Ok(ThreadRun {
        samples,
        free_samples,
        pairs,
        start,
        end,
        cpu_seconds: cpu_start
            .zip(crate::measure::thread_cpu_seconds())
            .map(|(a, b)| (b - a).max(0.0)),
    })
}

/// Binds the thread, and runs the untimed warm-up: one pair of a fixed size, or one round of
/// the mixed case. Returns the stream, the mixed sizes (empty for a fixed size) and an empty
/// vector for the live blocks.
#[allow(clippy::type_complexity)]
fn warm_up<B: AllocBackend>(
    b: &B,
    case: Case,
    t: usize,
) -> Result<(u64, Vec<u64>, Vec<B::Token>), String> {
    b.thread_init()?;
    let stream = b.stream(t);
    match case {
        Case::Fixed(bytes) => {
            let w = b.alloc(bytes, stream)?;
            b.free(w, stream)?;
            Ok((stream, Vec::new(), Vec::new()))
        }
        Case::Mixed => {
            let sizes = mixed_sizes(0x9e37_79b9_7f4a_7c15 ^ t as u64);
            let mut live = Vec::with_capacity(sizes.len());
            for &s in &sizes {
                live.push(b.alloc(s, stream)?);
            }
            for tok in live.drain(..) {
                b.free(tok, stream)?;
            }
            Ok((stream, sizes, live))
        }
    }
}

/// A [`DevicePool`] as a backend; `streams[i]` is thread i's stream (0 when missing).
pub struct PoolBackend<'a, D: Device> {
    /// The pool.
    pub pool: &'a DevicePool<D>,
    /// Per-thread streams.
    pub streams: Vec<u64>,
    /// Context to bind on each thread (CUDA only).
    pub ctx: Option<ContextBinder>,
}

/// Binds a CUDA context on a thread.
#[derive(Debug, Clone, Copy)]
pub struct ContextBinder(CUcontext);
// SAFETY: a context pointer may be made current on any thread.
unsafe impl Send for ContextBinder {}
// SAFETY: as above; it is only read.
unsafe impl Sync for ContextBinder {}

impl ContextBinder {
    /// The binder of `dev`'s primary context (valid while `dev` lives).
    pub fn of(dev: &CudaDevice) -> Self {
        ContextBinder(dev.context_raw())
    }
    fn bind(&self) -> Result<(), String> {
        // SAFETY: the device that owns the context outlives the benchmark (callers keep it).
        unsafe { driver::ctx_set_current(self.0) }.map_err(|e| e.to_string())
    }
}

impl<D: Device> AllocBackend for PoolBackend<'_, D> {
    type Token = RawBlock;
    fn label(&self) -> String {
        self.pool.name().to_string()
    }
    fn thread_init(&self) -> Result<(), String> {
        self.ctx.map_or(Ok(()), |c| c.bind())
    }
    fn stream(&self, i: usize) -> u64 {
        self.streams.get(i).copied().unwrap_or(0)
    }
    fn alloc(&self, bytes: u64, stream: u64) -> Result<RawBlock, String> {
        self.pool
            .alloc_raw(bytes, stream)
            .map_err(|e| e.to_string())
    }
    fn free(&self, t: RawBlock, _stream: u64) -> Result<(), String> {
        self.pool.free_raw(t).map_err(|e| e.to_string())
    }
}

/// Raw cuMemAlloc / cuMemFree.
pub struct RawCuda {
    /// Context of the device.
    pub ctx: ContextBinder,
}

impl AllocBackend for RawCuda {
    type Token = u64;
    fn label(&self) -> String {
        "cuMemAlloc".into()
    }
    fn thread_init(&self) -> Result<(), String> {
        self.ctx.bind()
    }
    fn alloc(&self, bytes: u64, _stream: u64) -> Result<u64, String> {
        driver::mem_alloc(bytes).map_err(|e| e.to_string())
    }
    fn free(&self, t: u64, _stream: u64) -> Result<(), String> {
        // SAFETY: `t` came from cuMemAlloc in `alloc` and is freed once.
        unsafe { driver::mem_free(t) }.map_err(|e| e.to_string())
    }
    fn times_each_call(&self) -> bool {
        true
    }
}

/// cuMemAllocAsync / cuMemFreeAsync on the device's default pool, with its release threshold
/// set to the maximum (so freed memory stays in the pool), one stream per thread.
pub struct AsyncCuda {
    /// Context of the device.
    pub ctx: ContextBinder,
    streams: Vec<usize>,
    pool: usize,
}

impl AsyncCuda {
    /// Sets the default pool's release threshold to `u64::MAX` and creates `threads` streams.
    ///
    /// # Errors
    /// A failed driver call.
    pub fn new(dev: &CudaDevice, threads: usize) -> Result<Self, String> {
        let ctx = ContextBinder::of(dev);
        ctx.bind()?;
        let pool = driver::default_mem_pool(dev.device_raw()).map_err(|e| e.to_string())?;
        // SAFETY: the device's default pool is live while the driver is.
        unsafe { driver::mem_pool_set_release_threshold(pool, u64::MAX) }
            .map_err(|e| e.to_string())?;
        let mut streams = Vec::new();
        for _ in 0..threads {
            streams.push(driver::stream_create().map_err(|e| e.to_string())? as usize);
        }
        Ok(AsyncCuda {
            ctx,
            streams,
            pool: pool as usize,
        })
    }
}

/// Synchronises then destroys each of `streams`, ignoring errors (for `Drop`).
///
/// # Safety
/// Each stream is live, belongs to the bound context and is not used again.
unsafe fn destroy_streams(streams: &[usize]) {
    for &s in streams {
        // SAFETY: as the caller promises.
        unsafe {
            let _ = driver::stream_synchronize(s as CUstream);
            let _ = driver::stream_destroy(s as CUstream);
        }
    }
}

impl Drop for AsyncCuda {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: our streams, destroyed only here.
            unsafe { destroy_streams(&self.streams) };
            // SAFETY: the default pool is live; give its cached memory back.
            unsafe {
                let _ = driver::mem_pool_trim(self.pool as driver::MemPool);
            }
        }
    }
}

impl AllocBackend for AsyncCuda {
    type Token = u64;
    fn label(&self) -> String {
        "cuMemAllocAsync".into()
    }
    fn thread_init(&self) -> Result<(), String> {
        self.ctx.bind()
    }
    fn stream(&self, i: usize) -> u64 {
        self.streams.get(i).copied().unwrap_or(0) as u64
    }
    fn alloc(&self, bytes: u64, stream: u64) -> Result<u64, String> {
        // SAFETY: `stream` is one of our live streams (or 0).
        unsafe { driver::mem_alloc_async(bytes, stream as CUstream) }.map_err(|e| e.to_string())
    }
    fn free(&self, t: u64, stream: u64) -> Result<(), String> {
        // SAFETY: `t` came from cuMemAllocAsync and is freed once, on the stream it was
        // allocated on.
        unsafe { driver::mem_free_async(t, stream as CUstream) }.map_err(|e| e.to_string())
    }
}

/// Streams for a pool benchmark on a CUDA device: one per thread, destroyed on drop.
pub struct BenchStreams {
    ctx: ContextBinder,
    streams: Vec<usize>,
}

impl BenchStreams {
    /// Creates `n` streams on `dev`.
    ///
    /// # Errors
    /// A failed driver call.
    pub fn new(dev: &CudaDevice, n: usize) -> Result<Self, String> {
        let ctx = ContextBinder::of(dev);
        ctx.bind()?;
        let mut streams = Vec::new();
        for _ in 0..n {
            streams.push(driver::stream_create().map_err(|e| e.to_string())? as usize);
        }
        Ok(BenchStreams { ctx, streams })
    }
    /// Stream ids.
    pub fn ids(&self) -> Vec<u64> {
        self.streams.iter().map(|&s| s as u64).collect()
    }
}

impl Drop for BenchStreams {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: our streams, destroyed only here.
            unsafe { destroy_streams(&self.streams) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_sizes_span_the_range() {
        let s = mixed_sizes(42);
        assert_eq!(s.len(), MIXED_LIVE);
        assert!(s.iter().all(|&x| (1 << 10..=4 << 20).contains(&x)));
        assert!(s.iter().any(|&x| x < 8 << 10));
        assert!(s.iter().any(|&x| x > 1 << 20));
        assert_eq!(s, mixed_sizes(42));
    }

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    /// A backend whose allocation takes 1 ms and whose free takes 2 ms.
    struct Slow {
        each_call: bool,
    }

    impl AllocBackend for Slow {
        type Token = ();
        fn label(&self) -> String {
            "slow".into()
        }
        fn alloc(&self, _: u64, _: u64) -> Result<(), String> {
            std::thread::sleep(Duration::from_millis(1));
            Ok(())
        }
        fn free(&self, _: (), _: u64) -> Result<(), String> {
            std::thread::sleep(Duration::from_millis(2));
            Ok(())
        }
        fn times_each_call(&self) -> bool {
            self.each_call
        }
    }

    #[test]
    fn calls_timed_on_their_own_give_the_pair_as_two_medians() {
        let budget = Budget {
            time: Duration::from_millis(40),
            max_pairs: 5,
        };
        let each = measure(&Slow { each_call: true }, Case::Fixed(1), 1, budget).unwrap();
        // At most 5 pairs, one at a time (batches would make it a multiple of 16).
        assert!(each.pairs >= 1 && each.pairs <= 5, "{each:?}");
        assert!(each.median_ns >= 3e6 && each.median_ns < 30e6, "{each:?}");
        let batched = measure(&Slow { each_call: false }, Case::Fixed(1), 1, budget).unwrap();
        assert_eq!(batched.pairs % BATCH as u64, 0, "{batched:?}");
        // The thread slept through its calls: it ran a small share of the wall time, which
        // is what makes pairs/s fall below the medians' rate on a busy host.
        for r in [&each, &batched] {
            let share = r.cpu_share.expect("Linux tells a thread's CPU time");
            assert!((0.0..0.5).contains(&share), "{r:?}");
        }
    }
}
