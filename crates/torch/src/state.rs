//! [`Plugin`]: what the C entry points act on, in safe Rust. One pool per device (a
//! [`RawPool`]: [`DirectPool`] or [`DevicePool`]), created on first use from the [`Conf`]; a
//! map of the live blocks (so that `free` learns a block's size class and stream, and a
//! pointer the pool does not own is caught rather than
//! handed to the strategy); PyTorch-named counters; the JSON-lines recorder.
//!
//! Failures never panic: a failed allocation returns `None` (NULL at the C boundary, which
//! PyTorch turns into `torch.OutOfMemoryError`) after the pool has flushed its caches, released
//! cached memory and retried once; a bad free is counted and ignored. Each kind of failure is
//! written to stderr the first time it happens (see [`Report`]) and counted in the statistics.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use gpumem::cuda::CudaEvents;
use gpumem::pool::{Deferred, ManualEvents, StreamEvents};
use gpumem::pool::{DevicePool, DirectPool, PoolError, PoolStats, RawBlock, RawPool};
use gpumem_core::adaptor::{Metered, Reserved};
use gpumem_core::sim::SimDevice;
use gpumem_core::{Device, DriverCall, DriverCounters};
use serde_json::{json, Map, Value};

use crate::conf::{Backend, Conf, Mode};

mod live;
mod profile;

use live::{Live, LiveMap};
use profile::Profile;

/// Devices a process may use (ordinals `0..MAX_DEVICES`).
pub const MAX_DEVICES: usize = 64;

/// Kinds of failure, each written to stderr once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// `free` of a pointer no pool handed out (or already freed).
    BadFree,
    /// An allocation refused: out of memory after release and retry.
    OutOfMemory,
    /// A negative size or a device ordinal out of range.
    BadArgument,
    /// A pool could not be created (no driver, no device, reservation failed).
    DeviceOpen,
    /// Another pool or device error.
    PoolError,
    /// A panic caught at the C boundary.
    Panic,
    /// `GPUMEM_CONF` held an unknown key or a bad value.
    Conf,
}

const REPORT_KINDS: usize = 7;

/// A current value and its peak (PyTorch's `.current` / `.peak`).
#[derive(Debug, Default)]
struct Gauge {
    current: AtomicI64,
    peak: AtomicI64,
}

impl Gauge {
    fn add(&self, n: i64) {
        let now = self.current.fetch_add(n, Ordering::Relaxed) + n;
        if n > 0 {
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
    }
    fn reset_peak(&self) {
        self.peak
            .store(self.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    fn get(&self) -> (i64, i64) {
        (
            self.current.load(Ordering::Relaxed),
            self.peak.load(Ordering::Relaxed),
        )
    }
}

#[derive(Debug, Default)]
struct Counters {
    requested: Gauge,
    allocated: Gauge,
    blocks: Gauge,
    alloc_calls: AtomicU64,
    free_calls: AtomicU64,
    ooms: AtomicU64,
    bad_frees: AtomicU64,
    errors: AtomicU64,
    zero_byte_requests: AtomicU64,
}

/// One device's pool and figures.
struct DeviceState {
    pool: Box<dyn RawPool>,
    reserved: Arc<Reserved>,
    live: LiveMap,
    counters: Counters,
}

struct Recorder {
    out: BufWriter<File>,
    t0: Instant,
    path: String,
    lines: u64,
}

impl Recorder {
    fn line(&mut self, v: Value) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, &v)?;
        self.out.write_all(b"\n")?;
        self.lines += 1;
        Ok(())
    }
    fn now_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }
}

/// Errors of the recorder and the maintenance calls.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The trace file could not be created or written.
    #[error("trace `{path}`: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `record_start` while a recording is running.
    #[error("already recording to `{0}`: stop it first")]
    AlreadyRecording(String),
    /// A pool call failed.
    #[error("device {device}: {source}")]
    Pool {
        /// Device ordinal.
        device: usize,
        /// The pool's error.
        source: PoolError,
    },
    /// A lock was poisoned by a panic in another thread.
    #[error("plug-in lock poisoned")]
    Poisoned,
}

/// The plug-in's state: settings, pools per device, counters, recorder.
pub struct Plugin {
    conf: Conf,
    devices: Vec<OnceLock<Result<DeviceState, String>>>,
    recording: AtomicBool,
    /// Unrecorded allocations and frees in progress (see [`Plugin::record_start`]).
    in_flight: AtomicUsize,
    recorder: Mutex<Option<Recorder>>,
    reported: [AtomicBool; REPORT_KINDS],
    report_counts: [AtomicU64; REPORT_KINDS],
    first_reports: Mutex<Vec<String>>,
    quiet: bool,
    profile: Option<Profile>,
}

impl Plugin {
    /// A plug-in with settings `conf`; no device is opened until first used. With `quiet`,
    /// reports are kept for the statistics but not written to stderr (for tests).
    pub fn new(conf: Conf, quiet: bool) -> Self {
        Self::with_profile(conf, quiet, Profile::from_env())
    }

    fn with_profile(conf: Conf, quiet: bool, profile: Option<Profile>) -> Self {
        Plugin {
            conf,
            devices: (0..MAX_DEVICES).map(|_| OnceLock::new()).collect(),
            recording: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            recorder: Mutex::new(None),
            reported: Default::default(),
            report_counts: Default::default(),
            first_reports: Mutex::new(Vec::new()),
            quiet,
            profile,
        }
    }

    /// The settings.
    pub fn conf(&self) -> &Conf {
        &self.conf
    }

    /// Counts a failure of `kind` and writes `msg` to stderr if it is the first of its kind.
    pub fn report(&self, kind: Report, msg: impl FnOnce() -> String) {
        let k = kind as usize;
        self.report_counts[k].fetch_add(1, Ordering::Relaxed);
        if self.reported[k].swap(true, Ordering::Relaxed) {
            return;
        }
        let m = msg();
        if !self.quiet {
            eprintln!("gpumem_torch: {m} (reported once; gpumem_torch.memory_stats() counts them)");
        }
        if let Ok(mut v) = self.first_reports.lock() {
            v.push(m);
        }
    }

    fn device(&self, ordinal: i32) -> Option<&DeviceState> {
        let Some(slot) = usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
        else {
            self.report(Report::BadArgument, || {
                format!("device ordinal {ordinal} out of range 0..{MAX_DEVICES}")
            });
            return None;
        };
        match slot.get_or_init(|| open_device(ordinal as usize, &self.conf)) {
            Ok(d) => Some(d),
            Err(e) => {
                self.report(Report::DeviceOpen, || format!("device {ordinal}: {e}"));
                None
            }
        }
    }

    fn opened(&self) -> impl Iterator<Item = (usize, &DeviceState)> {
        self.devices
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.get().and_then(|r| r.as_ref().ok()).map(|d| (i, d)))
    }

    /// `gpumem_malloc`: a block of `size_bytes` on device `ordinal` for `stream`; its
    /// address, or `None` for 0 bytes (without touching the pool), a bad argument, or out of
    /// memory.
    pub fn malloc(&self, size_bytes: i64, ordinal: i32, stream: u64) -> Option<u64> {
        match &self.profile {
            None => self.malloc_unprofiled(size_bytes, ordinal, stream),
            Some(p) => {
                let t = Instant::now();
                let r = self.malloc_unprofiled(size_bytes, ordinal, stream);
                p.record(true, t);
                r
            }
        }
    }

    fn malloc_unprofiled(&self, size_bytes: i64, ordinal: i32, stream: u64) -> Option<u64> {
        if size_bytes <= 0 {
            if size_bytes == 0 {
                if let Some(Ok(d)) = usize::try_from(ordinal)
                    .ok()
                    .and_then(|i| self.devices.get(i))
                    .and_then(|s| s.get())
                {
                    d.counters
                        .zero_byte_requests
                        .fetch_add(1, Ordering::Relaxed);
                }
            } else {
                self.report(Report::BadArgument, || {
                    format!("malloc of a negative size ({size_bytes} B) refused")
                });
            }
            return None;
        }
        let d = self.device(ordinal)?;
        if self.recording.load(Ordering::Acquire) {
            return self.malloc_recorded(d, size_bytes as u64, ordinal, stream);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let r = if self.recording.load(Ordering::Acquire) {
            None // a recording started: redo below under the recorder's lock
        } else {
            Some(self.malloc_on(d, size_bytes as u64, ordinal, stream))
        };
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        match r {
            Some(r) => r,
            None => self.malloc_recorded(d, size_bytes as u64, ordinal, stream),
        }
    }

    fn malloc_recorded(
        &self,
        d: &DeviceState,
        size: u64,
        ordinal: i32,
        stream: u64,
    ) -> Option<u64> {
        let mut g = self.recorder.lock().ok();
        let r = self.malloc_on(d, size, ordinal, stream);
        if let Some(Some(rec)) = g.as_deref_mut() {
            let t = rec.now_us();
            let line = match r {
                Some(addr) => json!({"action": "alloc", "addr": addr, "size": size,
                    "stream": stream, "device": ordinal, "time_us": t}),
                None => json!({"action": "oom", "size": size, "stream": stream,
                    "device": ordinal, "time_us": t}),
            };
            if let Err(e) = rec.line(line) {
                let p = rec.path.clone();
                self.report(Report::PoolError, || format!("trace `{p}`: {e}"));
            }
        }
        r
    }

    fn malloc_on(&self, d: &DeviceState, size: u64, ordinal: i32, stream: u64) -> Option<u64> {
        d.counters.alloc_calls.fetch_add(1, Ordering::Relaxed);
        match d.pool.alloc_raw(size, stream) {
            Ok(b) => {
                let live = Live {
                    requested_bytes: size,
                    class_bytes: b.class_bytes,
                    stream,
                };
                if !d.live.insert(b.addr, live) {
                    self.report(Report::PoolError, || {
                        format!("device {ordinal}: the pool handed out {:#x} twice", b.addr)
                    });
                }
                d.counters.requested.add(size as i64);
                d.counters.allocated.add(b.class_bytes as i64);
                d.counters.blocks.add(1);
                Some(b.addr)
            }
            Err(e @ PoolError::OutOfMemory { .. }) => {
                d.counters.ooms.fetch_add(1, Ordering::Relaxed);
                self.report(Report::OutOfMemory, || format!("device {ordinal}: {e}"));
                None
            }
            Err(e) => {
                d.counters.errors.fetch_add(1, Ordering::Relaxed);
                self.report(Report::PoolError, || format!("device {ordinal}: {e}"));
                None
            }
        }
    }

    /// `gpumem_free`: gives back the block at `addr` of device `ordinal`. A null `addr` does
    /// nothing; an address the pool did not hand out (or already took back) is counted,
    /// reported once and ignored. `size_bytes` and `stream` are PyTorch's and are not
    /// needed: the block's own requested size and stream (recorded at allocation) are used.
    pub fn free(&self, addr: u64, size_bytes: i64, ordinal: i32, stream: u64) {
        match &self.profile {
            None => self.free_unprofiled(addr, size_bytes, ordinal),
            Some(p) => {
                let t = Instant::now();
                self.free_unprofiled(addr, size_bytes, ordinal);
                p.record(false, t);
            }
        }
        let _ = stream;
    }

    fn free_unprofiled(&self, addr: u64, size_bytes: i64, ordinal: i32) {
        if addr == 0 {
            return;
        }
        let d = usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
            .and_then(|s| s.get())
            .and_then(|r| r.as_ref().ok());
        let Some(d) = d else {
            self.report(Report::BadFree, || {
                format!("free of {addr:#x} ({size_bytes} B) on device {ordinal}, which has no pool: ignored")
            });
            return;
        };
        if self.recording.load(Ordering::Acquire) {
            return self.free_recorded(d, addr, size_bytes, ordinal);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let done = !self.recording.load(Ordering::Acquire);
        if done {
            self.free_on(d, addr, size_bytes, ordinal);
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        if !done {
            self.free_recorded(d, addr, size_bytes, ordinal);
        }
    }

    fn free_recorded(&self, d: &DeviceState, addr: u64, size: i64, ordinal: i32) {
        let mut g = self.recorder.lock().ok();
        let stream = self.free_on(d, addr, size, ordinal);
        if let (Some(Some(rec)), Some(stream)) = (g.as_deref_mut(), stream) {
            let t = rec.now_us();
            let line = json!({"action": "free", "addr": addr, "stream": stream,
                "device": ordinal, "time_us": t});
            if let Err(e) = rec.line(line) {
                let p = rec.path.clone();
                self.report(Report::PoolError, || format!("trace `{p}`: {e}"));
            }
        }
    }

    /// Frees; returns the block's stream if it was live.
    fn free_on(&self, d: &DeviceState, addr: u64, size: i64, ordinal: i32) -> Option<u64> {
        d.counters.free_calls.fetch_add(1, Ordering::Relaxed);
        let Some(l) = d.live.remove(addr) else {
            d.counters.bad_frees.fetch_add(1, Ordering::Relaxed);
            self.report(Report::BadFree, || {
                format!("free of {addr:#x} ({size} B) on device {ordinal}: not a live block of gpumem: ignored")
            });
            return None;
        };
        d.counters.requested.add(-(l.requested_bytes as i64));
        d.counters.allocated.add(-(l.class_bytes as i64));
        d.counters.blocks.add(-1);
        let raw = RawBlock {
            addr,
            requested_bytes: l.requested_bytes,
            class_bytes: l.class_bytes,
            stream: l.stream,
            other_streams: Vec::new(),
        };
        if let Err(e) = d.pool.free_raw(raw) {
            d.counters.errors.fetch_add(1, Ordering::Relaxed);
            self.report(Report::PoolError, || {
                format!("device {ordinal}: free of {addr:#x}: {e}")
            });
        }
        Some(l.stream)
    }

    /// Gives the cached memory of every opened device back to the driver; returns the bytes
    /// released.
    ///
    /// # Errors
    /// The first pool error (the other devices are still emptied).
    pub fn empty_cache(&self) -> Result<u64, PluginError> {
        let mut total = 0;
        let mut first = None;
        for (i, d) in self.opened() {
            match d.pool.empty_cache() {
                Ok(b) => total += b,
                Err(source) => {
                    first.get_or_insert(PluginError::Pool { device: i, source });
                }
            }
        }
        first.map_or(Ok(total), Err)
    }

    /// Sets every peak (allocated, requested, reserved, blocks) to its current value.
    pub fn reset_peak_stats(&self) {
        for (_, d) in self.opened() {
            d.counters.requested.reset_peak();
            d.counters.allocated.reset_peak();
            d.counters.blocks.reset_peak();
            d.reserved.reset_peak();
        }
    }

    /// Checks every opened pool's invariants.
    ///
    /// # Errors
    /// The first device whose pool fails [`DevicePool::validate`].
    pub fn validate(&self) -> Result<(), PluginError> {
        for (i, d) in self.opened() {
            d.pool
                .validate()
                .map_err(|source| PluginError::Pool { device: i, source })?;
        }
        Ok(())
    }

    /// Live blocks handed out and not freed, on device `ordinal` (0 for a device not opened).
    pub fn live_blocks(&self, ordinal: usize) -> usize {
        self.devices
            .get(ordinal)
            .and_then(|s| s.get())
            .and_then(|r| r.as_ref().ok())
            .map_or(0, |d| d.live.len())
    }

    /// Starts writing gpumem's JSON-lines trace to `path`: a `preexisting` line for every
    /// live block, then an `alloc`, `free` or `oom` line per call until
    /// [`Plugin::record_stop`]. While recording, allocations and frees are serialised
    /// (one lock).
    ///
    /// # Errors
    /// [`PluginError::AlreadyRecording`], [`PluginError::Io`].
    pub fn record_start(&self, path: &str) -> Result<(), PluginError> {
        let mut g = self.recorder.lock().map_err(|_| PluginError::Poisoned)?;
        if let Some(r) = g.as_ref() {
            return Err(PluginError::AlreadyRecording(r.path.clone()));
        }
        let io = |source| PluginError::Io {
            path: path.into(),
            source,
        };
        let f = File::create(path).map_err(io)?;
        let mut rec = Recorder {
            out: BufWriter::new(f),
            t0: Instant::now(),
            path: path.into(),
            lines: 0,
        };
        // From here on new calls wait for the lock we hold; wait for the ones already past
        // the flag, so that every block they made is in the live maps we list below.
        self.recording.store(true, Ordering::SeqCst);
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
        for (i, d) in self.opened() {
            for (addr, l) in d.live.snapshot() {
                rec.line(json!({"action": "preexisting", "addr": addr,
                    "size": l.requested_bytes, "stream": l.stream, "device": i}))
                    .map_err(io)?;
            }
        }
        *g = Some(rec);
        Ok(())
    }

    /// Stops the recording and closes the file; returns the lines written (0 if none was
    /// running).
    ///
    /// # Errors
    /// [`PluginError::Io`] if the last lines cannot be written.
    pub fn record_stop(&self) -> Result<u64, PluginError> {
        let mut g = self.recorder.lock().map_err(|_| PluginError::Poisoned)?;
        self.recording.store(false, Ordering::SeqCst);
        match g.take() {
            None => Ok(0),
            Some(mut r) => r
                .out
                .flush()
                .map(|_| r.lines)
                .map_err(|source| PluginError::Io {
                    path: r.path,
                    source,
                }),
        }
    }

    /// The figures of device `ordinal` under PyTorch's `memory_stats()` names where they
    /// exist, plus gpumem's (driver calls, fragmentation, caches, failures).
    pub fn stats_json(&self, ordinal: usize) -> Value {
        let mut m = Map::new();
        m.insert("device".into(), json!(ordinal));
        m.insert("strategy".into(), json!(self.conf.strategy));
        m.insert(
            "backend".into(),
            json!(match self.conf.backend {
                Backend::Cuda => "cuda",
                Backend::Sim => "sim",
            }),
        );
        let state = self.devices.get(ordinal).and_then(|s| s.get());
        m.insert("initialized".into(), json!(matches!(state, Some(Ok(_)))));
        if let Some(Err(e)) = state {
            m.insert("error".into(), json!(e));
        }
        let d = state.and_then(|r| r.as_ref().ok());
        let pair = |m: &mut Map<String, Value>, name: &str, (cur, peak): (i64, i64)| {
            m.insert(format!("{name}.all.current"), json!(cur));
            m.insert(format!("{name}.all.peak"), json!(peak));
        };
        let zero = (0, 0);
        let c = d.map(|d| &d.counters);
        pair(
            &mut m,
            "allocated_bytes",
            c.map_or(zero, |c| c.allocated.get()),
        );
        pair(
            &mut m,
            "requested_bytes",
            c.map_or(zero, |c| c.requested.get()),
        );
        pair(&mut m, "allocation", c.map_or(zero, |c| c.blocks.get()));
        let reserved = d.map_or(zero, |d| {
            (d.reserved.current() as i64, d.reserved.peak() as i64)
        });
        pair(&mut m, "reserved_bytes", reserved);
        let load = |f: fn(&Counters) -> &AtomicU64| c.map_or(0, |c| f(c).load(Ordering::Relaxed));
        m.insert("num_alloc_calls".into(), json!(load(|c| &c.alloc_calls)));
        m.insert("num_free_calls".into(), json!(load(|c| &c.free_calls)));
        m.insert("num_ooms".into(), json!(load(|c| &c.ooms)));
        m.insert("num_bad_frees".into(), json!(load(|c| &c.bad_frees)));
        m.insert("num_errors".into(), json!(load(|c| &c.errors)));
        m.insert(
            "num_zero_byte_requests".into(),
            json!(load(|c| &c.zero_byte_requests)),
        );
        m.insert("live_blocks".into(), json!(d.map_or(0, |d| d.live.len())));
        let ps = d.map(|d| d.pool.stats());
        let ps = match ps {
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                m.insert("error".into(), json!(e.to_string()));
                PoolStats::default()
            }
            None => PoolStats::default(),
        };
        m.insert("num_alloc_retries".into(), json!(ps.oom_recoveries));
        m.insert("pool_live_blocks".into(), json!(ps.live_blocks));
        m.insert("cached_blocks".into(), json!(ps.cached_blocks));
        m.insert("cached_bytes".into(), json!(ps.cached_bytes));
        m.insert("pending_blocks".into(), json!(ps.pending_blocks));
        m.insert("pending_bytes".into(), json!(ps.pending_bytes));
        m.insert("cache_hits".into(), json!(ps.cache_hits));
        m.insert("cache_misses".into(), json!(ps.cache_misses));
        let a = &ps.allocator;
        m.insert("segment.all.current".into(), json!(a.segment_count.current));
        m.insert("segment.all.peak".into(), json!(a.segment_count.peak));
        m.insert(
            "strategy_allocated_bytes.all.current".into(),
            json!(a.allocated_bytes.current),
        );
        m.insert(
            "internal_fragmentation".into(),
            json!(a.internal_fragmentation()),
        );
        m.insert(
            "external_fragmentation".into(),
            json!(a.external_fragmentation()),
        );
        // Unused share of what is held from the device (0 when nothing is reserved).
        let frag = if reserved.0 > 0 {
            1.0 - c.map_or(0, |c| c.allocated.get().0) as f64 / reserved.0 as f64
        } else {
            0.0
        };
        m.insert("fragmentation".into(), json!(frag));
        let dc = match d.map(|d| d.pool.counters()) {
            Some(Ok(dc)) => dc,
            _ => DriverCounters::default(),
        };
        let mut calls = Map::new();
        for k in DriverCall::ALL {
            calls.insert(k.cuda_name().into(), json!(dc.get(k)));
        }
        m.insert("driver_calls".into(), Value::Object(calls));
        m.insert("driver_calls.total".into(), json!(dc.total()));
        m.insert(
            "mode".into(),
            json!(match self.conf.mode {
                Mode::Direct => "direct",
                Mode::Pool => "pool",
            }),
        );
        if let Some(f) = d.and_then(|d| d.pool.deferral()) {
            m.insert("unmaps_postponed_now".into(), json!(f.unmaps_postponed_now));
            m.insert("unmaps_postponed".into(), json!(f.unmaps_postponed));
            m.insert("unmaps_waited".into(), json!(f.unmaps_waited));
            m.insert("side_stream_waits".into(), json!(f.side_stream_waits));
            m.insert("side_stream_frees".into(), json!(f.side_stream_frees));
            m.insert("main_stream".into(), json!(f.main_stream));
        }
        m.insert("driver_seconds".into(), json!(dc.seconds));
        let mut reports = Map::new();
        const NAMES: [&str; REPORT_KINDS] = [
            "bad_free",
            "out_of_memory",
            "bad_argument",
            "device_open",
            "pool_error",
            "panic",
            "conf",
        ];
        for (n, c) in NAMES.iter().zip(&self.report_counts) {
            reports.insert((*n).into(), json!(c.load(Ordering::Relaxed)));
        }
        m.insert("reports".into(), Value::Object(reports));
        let first = self
            .first_reports
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default();
        m.insert("first_reports".into(), json!(first));
        if let Some(p) = &self.profile {
            m.insert("profile".into(), p.json());
        }
        Value::Object(m)
    }
}

fn open_device(ordinal: usize, conf: &Conf) -> Result<DeviceState, String> {
    match conf.backend {
        Backend::Sim => {
            let events: Arc<dyn StreamEvents> = Arc::new(ManualEvents::immediate());
            make_state(
                SimDevice::new(conf.sim_capacity_bytes),
                events,
                conf,
                conf.pool,
            )
        }
        Backend::Cuda => {
            let mut dev = gpumem::cuda::open(ordinal).map_err(|e| e.to_string())?;
            // A tensor moved to another GPU is copied by that GPU's engines or kernels, which
            // need access to this device's VMM pages (PyTorch grants it for its expandable
            // segments too).
            dev.share_mappings_with_peers()
                .map_err(|e| format!("cuda:{ordinal}: peer access: {e}"))?;
            let events: Arc<dyn StreamEvents> =
                Arc::new(CudaEvents::new(&dev).map_err(|e| e.to_string())?);
            let opts = gpumem::pool::PoolConfig {
                pitch_align_bytes: dev.pitch_align_bytes(),
                ..conf.pool
            };
            make_state(dev, events, conf, opts)
        }
    }
}

/// Events shared between the pool and its device adaptor.
struct SharedEvents(Arc<dyn StreamEvents>);

impl StreamEvents for SharedEvents {
    fn record(&self, stream: u64) -> Result<u64, gpumem_core::DeviceError> {
        self.0.record(stream)
    }
    fn query(&self, event: u64) -> Result<bool, gpumem_core::DeviceError> {
        self.0.query(event)
    }
    fn synchronize(&self, event: u64) -> Result<(), gpumem_core::DeviceError> {
        self.0.synchronize(event)
    }
    fn recycle(&self, event: u64) {
        self.0.recycle(event)
    }
}

fn make_state<D: Device + 'static>(
    dev: D,
    events: Arc<dyn StreamEvents>,
    conf: &Conf,
    opts: gpumem::pool::PoolConfig,
) -> Result<DeviceState, String> {
    let alloc = conf.strategy.build(&conf.allocator);
    let fail = |e: PoolError| format!("{} pool: {e}", conf.strategy);
    let (pool, reserved): (Box<dyn RawPool>, _) = match conf.mode {
        Mode::Direct => {
            let (dev, reserved) = Metered::new(Deferred::new(dev, Arc::clone(&events)));
            let pool = DirectPool::new(alloc, dev, events, opts.align_bytes, opts.reserve_bytes)
                .map_err(fail)?;
            (Box::new(pool), reserved)
        }
        Mode::Pool => {
            let (dev, reserved) = Metered::new(dev);
            let pool =
                DevicePool::new(alloc, dev, Box::new(SharedEvents(events)), opts).map_err(fail)?;
            (Box::new(pool), reserved)
        }
    };
    Ok(DeviceState {
        pool,
        reserved,
        live: LiveMap::new(),
        counters: Counters::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::profile::SLOW_CALL_NS;
    use super::*;
    use crate::conf::parse_strict;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// Allocate this many bytes on stream index 0..3 (0 is the NULL stream).
        Alloc(i64, u8),
        /// Free the live block with this index (modulo the live count).
        Free(usize),
        /// Free an address gpumem never handed out.
        BadFree(u64),
        EmptyCache,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (0i64..(24 << 20), 0u8..3).prop_map(|(n, s)| Op::Alloc(n, s)),
            4 => any::<usize>().prop_map(Op::Free),
            1 => any::<u64>().prop_map(Op::BadFree),
            1 => Just(Op::EmptyCache),
        ]
    }

    fn check(conf: &str, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let p = Plugin::new(parse_strict(conf).unwrap(), true);
        let mut live: Vec<(u64, i64, u64)> = Vec::new();
        let mut bad = 0i64;
        for op in ops {
            match op {
                Op::Alloc(n, s) => {
                    let stream = [0, 0x700, 0x900][s as usize];
                    match p.malloc(n, 0, stream) {
                        Some(a) => {
                            prop_assert!(n > 0);
                            for &(b, m, _) in &live {
                                prop_assert!(a + n as u64 <= b || b + m as u64 <= a, "overlap");
                            }
                            live.push((a, n, stream));
                        }
                        None => prop_assert_eq!(n, 0, "a 1 GiB device never runs out here"),
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let (a, n, s) = live.swap_remove(i % live.len());
                    p.free(a, n, 0, s);
                }
                Op::Free(_) => {}
                Op::BadFree(a) => {
                    let a = a | 1; // odd: never a block address
                    p.free(a, 8, 0, 0);
                    if p.devices[0].get().is_some() {
                        bad += 1;
                    }
                }
                Op::EmptyCache => {
                    p.empty_cache().unwrap();
                }
            }
            p.validate().unwrap();
            let s = p.stats_json(0);
            prop_assert_eq!(s["live_blocks"].as_u64().unwrap(), live.len() as u64);
            prop_assert_eq!(
                s["requested_bytes.all.current"].as_i64().unwrap(),
                live.iter().map(|x| x.1).sum::<i64>()
            );
            prop_assert_eq!(s["num_bad_frees"].as_i64().unwrap(), bad);
            prop_assert_eq!(s["num_errors"].as_i64().unwrap(), 0);
        }
        for (a, n, s) in live.drain(..) {
            p.free(a, n, 0, s);
        }
        p.empty_cache().unwrap();
        let s = p.stats_json(0);
        prop_assert_eq!(s["live_blocks"].as_u64().unwrap(), 0);
        prop_assert_eq!(s["allocated_bytes.all.current"].as_i64().unwrap(), 0);
        if p.devices[0].get().is_some() {
            prop_assert_eq!(s["reserved_bytes.all.current"].as_i64().unwrap(), 0);
        }
        Ok(())
    }

    #[test]
    fn the_profile_counts_calls_and_time_only_when_on() {
        let conf = parse_strict("backend=sim,sim_capacity=1GiB,strategy=torch,reserve=0").unwrap();
        let off = Plugin::with_profile(conf, true, None);
        let a = off.malloc(1000, 0, 0).unwrap();
        off.free(a, 1000, 0, 0);
        assert!(off.stats_json(0).get("profile").is_none());

        let on = Plugin::with_profile(conf, true, Some(Profile::default()));
        let blocks: Vec<u64> = (1..=5)
            .map(|i| on.malloc(i * 4096, 0, 0).unwrap())
            .collect();
        for (i, b) in blocks.iter().enumerate().take(3) {
            on.free(*b, (i as i64 + 1) * 4096, 0, 0);
        }
        on.free(0, 0, 0, 0); // NULL: a call too, though it does nothing
        assert_eq!(on.malloc(0, 0, 0), None);
        let p = &on.stats_json(0)["profile"];
        assert_eq!(p["malloc_calls"].as_u64(), Some(6));
        assert_eq!(p["free_calls"].as_u64(), Some(4));
        assert!(p["malloc_ns"].as_u64().unwrap() > 0);
        assert!(
            p["max_ns"].as_u64().unwrap()
                <= p["malloc_ns"].as_u64().unwrap() + p["free_ns"].as_u64().unwrap()
        );

        // A call longer than the threshold counts as slow.
        let prof = Profile::default();
        let past = Instant::now()
            .checked_sub(std::time::Duration::from_nanos(3 * SLOW_CALL_NS))
            .unwrap();
        prof.record(false, past);
        prof.record(true, Instant::now());
        let j = prof.json();
        assert_eq!(j["slow_calls"].as_u64(), Some(1));
        assert!(j["slow_ns"].as_u64().unwrap() >= 3 * SLOW_CALL_NS);
        assert_eq!(j["slow_ns"], j["free_ns"]);
        assert_eq!(
            (j["malloc_calls"].as_u64(), j["free_calls"].as_u64()),
            (Some(1), Some(1))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn direct_mode_keeps_blocks_apart_and_figures_right(ops in prop::collection::vec(op(), 1..120)) {
            check("backend=sim,sim_capacity=1GiB,strategy=paged,reserve=0", ops)?;
        }

        #[test]
        fn pool_mode_keeps_blocks_apart_and_figures_right(ops in prop::collection::vec(op(), 1..120)) {
            check("backend=sim,sim_capacity=1GiB,strategy=tlsf,mode=pool,reserve=0", ops)?;
        }
    }
}
