//! Two GPUs at once: peer copies between [`DevicePool`] blocks checked byte for byte
//! ([`check_pool_peer_copies`]), and peer bandwidth against a plain cuMemcpyPeerAsync loop
//! and the link ([`peer_bandwidth`]).
//!
//! Timing: every figure is host wall-clock time around a batch of copies queued back to
//! back on each stream involved, from a synchronised start to the synchronisation of every
//! stream (CUDA events cannot time across two devices' streams); the batch moves at least
//! [`BATCH_BYTES`] per stream, so the queueing latency of the first copy is under 1 % at
//! large sizes. The baseline and gpumem's paths are timed the same way in the same run.
//! GB/s are 10^9 B/s of payload; "both" counts the bytes of both directions.
use std::time::Instant;

use gpumem_core::config::AllocatorConfig;
use gpumem_core::strategy::Strategy;
use gpumem_core::DeviceError;

use super::p2p::{
    enable_peer_access, link_bandwidth, p2p_attributes, peer_copy, verify_peer_copy, LinkEstimate,
    P2pAttributes, PeerCheck, PeerMethod, GUARD_BYTES,
};
use super::{CopyKernel, CudaContext, CudaDevice, CudaError, CudaEvents, DeviceBuffer, Stream};
use crate::measure::median;
use crate::pool::{DevicePool, PoolConfig, PoolError};

/// Bytes each stream moves per timed batch (at least one copy).
pub const BATCH_BYTES: u64 = 1 << 30;
/// Most copies in one timed batch (small sizes).
pub const MAX_BATCH_COPIES: u64 = 200;
/// The pool strategy over cuMemAlloc segments used for peer copies.
pub const SEGMENT_STRATEGY: Strategy = Strategy::BestFit;
/// The pool strategy over VMM pages (peer access per block with cuMemSetAccess).
pub const VMM_STRATEGY: Strategy = Strategy::Paged;

/// Errors of the two-device checks and benchmarks.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// Opening a device or loading the driver failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A pool call failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A driver call failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The two ordinals name the same device.
    #[error("peer copies need two different devices (got {0} twice)")]
    SameDevice(usize),
}

/// One device prepared for peer copies: its pool, a stream, the copy16 kernel.
struct Side {
    ctx: CudaContext,
    pool: DevicePool<CudaDevice>,
    stream: Stream,
    kernel: CopyKernel,
}

impl Side {
    fn open(ordinal: usize, strategy: Strategy) -> Result<Self, PeerError> {
        let dev = super::open(ordinal)?;
        let ctx = dev.context().clone();
        let events = CudaEvents::new(&dev)?;
        let cfg = PoolConfig {
            reserve_bytes: 0,
            ..PoolConfig::default()
        };
        let pool = DevicePool::new(
            strategy.build(&AllocatorConfig::default()),
            dev,
            Box::new(events),
            cfg,
        )?;
        let stream = Stream::new(&ctx)?;
        let kernel = CopyKernel::load(&ctx)?;
        Ok(Side {
            ctx,
            pool,
            stream,
            kernel,
        })
    }
}

/// Enables peer access both ways between the two contexts where the devices allow it;
/// whether both ways are on.
fn enable_both(a: &CudaContext, b: &CudaContext) -> Result<bool, DeviceError> {
    let mut on = true;
    for (x, y) in [(a, b), (b, a)] {
        match enable_peer_access(x, y) {
            Ok(_) => {}
            Err(DeviceError::Unsupported(_)) => on = false,
            Err(e) => return Err(e),
        }
    }
    Ok(on)
}

/// How a block was shared with the other device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// cuCtxEnablePeerAccess (cuMemAlloc memory): no per-block grant.
    Context,
    /// [`DevicePool::set_peer_access`]: cuMemSetAccess on the granularity pages under the block.
    Pages,
    /// The driver refused that range (it lies inside a larger mapping): cuMemSetAccess on the
    /// whole mappings under the block instead.
    Mappings,
}

/// The whole mappings under `[addr, addr + bytes)`: (start, bytes).
fn mappings_under(d: &CudaDevice, addr: u64, bytes: u64) -> Option<(u64, u64)> {
    let book = d.vmm_book();
    let (start, first) = book.mapping_of(addr)?;
    let mut end = start + first.bytes;
    while end < addr + bytes.max(1) {
        let (s, m) = book.mapping_of(end)?;
        end = s + m.bytes;
    }
    Some((start, end - start))
}

/// Grants or revokes `peer`'s access to `block`: per page through the pool first (`how` =
/// [`Grant::Pages`]), and on a driver refusal over the whole mappings under the block.
fn share_block(
    pool: &DevicePool<CudaDevice>,
    block: &crate::pool::DeviceBlock<'_, CudaDevice>,
    peer: usize,
    grant: bool,
    how: Grant,
) -> Result<Grant, PeerError> {
    if how == Grant::Pages {
        match pool.set_peer_access(block, peer, grant) {
            Ok(()) => return Ok(Grant::Pages),
            Err(PoolError::Device(DeviceError::Driver { .. })) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (addr, bytes) = (block.addr(), block.size_bytes());
    pool.with_device(|d| -> Result<(), DeviceError> {
        let (start, len) = mappings_under(d, addr, bytes).ok_or_else(|| DeviceError::Invalid {
            call: "cuMemSetAccess",
            detail: format!("block {addr:#x} +{bytes} B is not wholly VMM-mapped"),
        })?;
        d.set_peer_access(start, len, peer, grant)
    })??;
    Ok(Grant::Mappings)
}

/// One byte-for-byte check of a peer copy between two pool blocks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolPeerCheck {
    /// The pools' strategy (`best-fit`: cuMemAlloc segments; `paged`: VMM pages).
    pub strategy: String,
    /// Whether the blocks are VMM pages shared with cuMemSetAccess (else cuMemAlloc memory
    /// shared with cuCtxEnablePeerAccess).
    pub vmm: bool,
    /// How the blocks were shared with the other device.
    pub grant: Grant,
    /// The check.
    pub check: PeerCheck,
}

/// Peer copies between pool blocks on devices `a` and `b`, both ways, with every
/// [`PeerMethod`], each checked byte for byte ([`verify_peer_copy`]: pattern, canary guards
/// around the destination, source unchanged). Done twice: with pools over cuMemAlloc
/// segments ([`SEGMENT_STRATEGY`], peer access per context) and over VMM pages
/// ([`VMM_STRATEGY`], the source and destination blocks' pages granted to the other device
/// with cuMemSetAccess, revoked after). The kernel method is skipped where the devices
/// cannot access each other. Pools are validated after.
///
/// # Errors
/// [`PeerError::SameDevice`] for `a == b`; a failed open, pool or driver call.
pub fn check_pool_peer_copies(
    a: usize,
    b: usize,
    bytes: usize,
) -> Result<Vec<PoolPeerCheck>, PeerError> {
    if a == b {
        return Err(PeerError::SameDevice(a));
    }
    let bytes = bytes.max(16) / 16 * 16;
    let mut out = Vec::new();
    for strategy in [SEGMENT_STRATEGY, VMM_STRATEGY] {
        let vmm = strategy == VMM_STRATEGY;
        let sa = Side::open(a, strategy)?;
        let sb = Side::open(b, strategy)?;
        let peers = enable_both(&sa.ctx, &sb.ctx)?;
        let mut seed = 1u32;
        for (src, dst) in [(&sa, &sb), (&sb, &sa)] {
            let sblk = src.pool.alloc(bytes as u64, 0)?;
            let dblk = dst.pool.alloc((bytes + 2 * GUARD_BYTES) as u64, 0)?;
            let (mut sgrant, mut dgrant) = (Grant::Context, Grant::Context);
            if vmm && peers {
                sgrant = share_block(&src.pool, &sblk, dst.ctx.ordinal(), true, Grant::Pages)?;
                dgrant = share_block(&dst.pool, &dblk, src.ctx.ordinal(), true, Grant::Pages)?;
            }
            for method in [PeerMethod::Peer, PeerMethod::DtoD, PeerMethod::Kernel] {
                if method == PeerMethod::Kernel && !peers {
                    continue;
                }
                // Copy engines are driven from the source device; the kernel runs on the
                // destination and loads through the peer mapping.
                let (stream, kernel) = if method == PeerMethod::Kernel {
                    (&dst.stream, Some(&dst.kernel))
                } else {
                    (&src.stream, None)
                };
                // SAFETY: both blocks are live pool blocks of these contexts, held until the
                // end of this iteration and used by nothing else; pool blocks are 256-byte
                // aligned; with the kernel, peer access is enabled (segments) or the pages
                // granted (VMM) above; the blocks are on different devices.
                let check = unsafe {
                    verify_peer_copy(
                        method,
                        stream,
                        kernel,
                        &dst.ctx,
                        dblk.addr(),
                        &src.ctx,
                        sblk.addr(),
                        bytes,
                        seed,
                    )?
                };
                seed += 1;
                out.push(PoolPeerCheck {
                    strategy: strategy.to_string(),
                    vmm,
                    grant: if dgrant == Grant::Mappings {
                        dgrant
                    } else {
                        sgrant
                    },
                    check,
                });
            }
            if vmm && peers {
                share_block(&src.pool, &sblk, dst.ctx.ordinal(), false, sgrant)?;
                share_block(&dst.pool, &dblk, src.ctx.ordinal(), false, dgrant)?;
            }
        }
        sa.pool.validate()?;
        sb.pool.validate()?;
    }
    Ok(out)
}

/// Settings of [`peer_bandwidth`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerBenchConfig {
    /// Bytes per copy, each measured.
    pub sizes: Vec<u64>,
    /// Timed batches per point (median).
    pub repeats: usize,
    /// Bytes of the byte-for-byte checks (0: none).
    pub check_bytes: u64,
}

/// One measured point.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PeerRow {
    /// How the bytes moved.
    pub method: PeerMethod,
    /// `cuMemAlloc` (plain buffers: the baseline) or `pool` (blocks of a [`DevicePool`] over
    /// cuMemAlloc segments).
    pub memory: &'static str,
    /// `A->B`, `B->A` (ordinals) or `both` (the two at once).
    pub direction: String,
    /// Bytes per copy.
    pub bytes: u64,
    /// Median seconds of a batch.
    pub median_s: f64,
    /// Copies per stream in a batch.
    pub copies: u64,
    /// Payload GB/s (both directions summed for `both`).
    pub gbps: f64,
    /// Percent of the cuMemcpyPeerAsync baseline of the same direction and size.
    pub pct_of_baseline: Option<f64>,
    /// Percent of the link's bandwidth (per direction, twice that for `both`).
    pub pct_of_link: Option<f64>,
}

/// What [`peer_bandwidth`] measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PeerReport {
    /// The two device ordinals.
    pub devices: [usize; 2],
    /// Their names.
    pub names: [String; 2],
    /// Whether peer access is on both ways (cuCtxEnablePeerAccess); without it the kernel
    /// method is left out and copies may be staged through the host by the driver.
    pub peer_access: bool,
    /// cuDeviceGetP2PAttribute from the first to the second device, and back.
    pub attributes: [Option<P2pAttributes>; 2],
    /// The link's expected bandwidth, and where it comes from.
    pub link: LinkEstimate,
    /// Every point.
    pub rows: Vec<PeerRow>,
    /// Byte-for-byte checks of peer copies between pool blocks.
    pub checks: Vec<PoolPeerCheck>,
    /// At the largest size, the lowest percent of the baseline reached by pool-block copies
    /// (cuMemcpyDtoDAsync, what a pool block copy does) over the three directions.
    pub pool_min_pct_of_baseline: Option<f64>,
    /// Whether that is at least 90 %.
    pub target_pool_ge_90pct_of_baseline: Option<bool>,
}

/// One copy stream of a timed batch.
struct Job<'a> {
    stream: &'a Stream,
    kernel: Option<&'a CopyKernel>,
    dst_ctx: &'a CudaContext,
    dst: u64,
    src_ctx: &'a CudaContext,
    src: u64,
}

fn time_batch(
    method: PeerMethod,
    jobs: &[Job<'_>],
    bytes: usize,
    copies: u64,
) -> Result<f64, DeviceError> {
    for j in jobs {
        j.stream.synchronize()?;
    }
    let t0 = Instant::now();
    for _ in 0..copies {
        for j in jobs {
            // SAFETY: the buffers are live allocations of at least `bytes` bytes of these
            // contexts, held by the caller until after the synchronisation below; kernel jobs
            // are only built with peer access on; source and destination are on different
            // devices.
            unsafe {
                peer_copy(
                    method, j.stream, j.kernel, j.dst_ctx, j.dst, j.src_ctx, j.src, bytes,
                )?
            };
        }
    }
    for j in jobs {
        j.stream.synchronize()?;
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Sets each row's percent of the baseline (plain cuMemcpyPeerAsync between cuMemAlloc
/// buffers, same direction and size); returns the lowest of the pool's cuMemcpyDtoD copies
/// at the largest size.
fn set_pct_of_baseline(rows: &mut [PeerRow]) -> Option<f64> {
    // Percent of the baseline: plain cuMemcpyPeerAsync of the same direction and size.
    let base: Vec<(String, u64, f64)> = rows
        .iter()
        .filter(|r| r.memory == "cuMemAlloc" && r.method == PeerMethod::Peer)
        .map(|r| (r.direction.clone(), r.bytes, r.gbps))
        .collect();
    for r in rows.iter_mut() {
        if let Some((_, _, g)) = base
            .iter()
            .find(|(d, b, _)| *d == r.direction && *b == r.bytes)
        {
            if *g > 0.0 {
                r.pct_of_baseline = Some(100.0 * r.gbps / g);
            }
        }
    }
    let largest = rows.iter().map(|r| r.bytes).max();
    rows.iter()
        .filter(|r| Some(r.bytes) == largest && r.memory == "pool" && r.method == PeerMethod::DtoD)
        .filter_map(|r| r.pct_of_baseline)
        .reduce(f64::min)
}

/// Peer bandwidth between devices `a` and `b`: for each size, direction (`a->b`, `b->a`,
/// both at once) and method, the median GB/s of timed batches (see the module notes). The
/// baseline is a plain cuMemcpyPeerAsync loop between cuMemAlloc buffers; gpumem's copies
/// run between blocks of [`DevicePool`]s (cuMemAlloc segments) with every [`PeerMethod`].
/// `progress` is called with a label before each point. Peer access is enabled both ways
/// first (where the devices allow it).
///
/// # Errors
/// [`PeerError::SameDevice`] for `a == b`; a failed open, pool or driver call (an
/// out-of-memory error names the size: each device holds four buffers of the largest size).
pub fn peer_bandwidth(
    a: usize,
    b: usize,
    cfg: &PeerBenchConfig,
    progress: &mut dyn FnMut(&str),
) -> Result<PeerReport, PeerError> {
    if a == b {
        return Err(PeerError::SameDevice(a));
    }
    let max = usize::try_from(cfg.sizes.iter().copied().max().unwrap_or(0))
        .unwrap_or(usize::MAX)
        .max(16);
    let sa = Side::open(a, SEGMENT_STRATEGY)?;
    let sb = Side::open(b, SEGMENT_STRATEGY)?;
    let names = [
        sa.ctx.name().unwrap_or_default(),
        sb.ctx.name().unwrap_or_default(),
    ];
    let peers = enable_both(&sa.ctx, &sb.ctx)?;
    let attributes = [p2p_attributes(a, b).ok(), p2p_attributes(b, a).ok()];
    let link = link_bandwidth(a, b).unwrap_or_else(|e| LinkEstimate {
        kind: "unknown".into(),
        links: None,
        gbps_per_direction: None,
        source: format!("could not read the link: {e}"),
    });

    // Baseline buffers (cuMemAlloc) and pool blocks: one source and one destination per
    // direction on each device.
    let plain_a = [
        DeviceBuffer::new(&sa.ctx, max)?,
        DeviceBuffer::new(&sa.ctx, max)?,
    ];
    let plain_b = [
        DeviceBuffer::new(&sb.ctx, max)?,
        DeviceBuffer::new(&sb.ctx, max)?,
    ];
    let pool_a = [sa.pool.alloc(max as u64, 0)?, sa.pool.alloc(max as u64, 0)?];
    let pool_b = [sb.pool.alloc(max as u64, 0)?, sb.pool.alloc(max as u64, 0)?];
    // Buffer 0 of a side is the source of its outgoing copy, buffer 1 the destination of the
    // incoming one.
    let addrs = |pool: bool| -> ([u64; 2], [u64; 2]) {
        if pool {
            (
                [pool_a[0].addr(), pool_a[1].addr()],
                [pool_b[0].addr(), pool_b[1].addr()],
            )
        } else {
            (
                [plain_a[0].device_ptr(), plain_a[1].device_ptr()],
                [plain_b[0].device_ptr(), plain_b[1].device_ptr()],
            )
        }
    };
    let ab = format!("{a}->{b}");
    let ba = format!("{b}->{a}");
    let mut rows: Vec<PeerRow> = Vec::new();
    let mut cases: Vec<(PeerMethod, bool)> = vec![
        (PeerMethod::Peer, false),
        (PeerMethod::Peer, true),
        (PeerMethod::DtoD, true),
    ];
    if peers {
        cases.push((PeerMethod::Kernel, true));
    }
    for &size in &cfg.sizes {
        let bytes = usize::try_from(size).unwrap_or(max).clamp(16, max) / 16 * 16;
        let copies = (BATCH_BYTES / bytes as u64).clamp(1, MAX_BATCH_COPIES);
        for &(method, pool) in &cases {
            let (xa, xb) = addrs(pool);
            let job = |to_b: bool| -> Job<'_> {
                let (src_side, dst_side, src, dst) = if to_b {
                    (&sa, &sb, xa[0], xb[1])
                } else {
                    (&sb, &sa, xb[0], xa[1])
                };
                let run_on = if method == PeerMethod::Kernel {
                    dst_side
                } else {
                    src_side
                };
                Job {
                    stream: &run_on.stream,
                    kernel: (method == PeerMethod::Kernel).then_some(&run_on.kernel),
                    dst_ctx: &dst_side.ctx,
                    dst,
                    src_ctx: &src_side.ctx,
                    src,
                }
            };
            for (dir, jobs) in [
                (ab.clone(), vec![job(true)]),
                (ba.clone(), vec![job(false)]),
                ("both".to_string(), vec![job(true), job(false)]),
            ] {
                progress(&format!(
                    "{} {} {dir} {} B",
                    if pool { "pool" } else { "cuMemAlloc" },
                    method.name(),
                    bytes
                ));
                time_batch(method, &jobs, bytes, 1)?; // warm-up
                let mut t: Vec<f64> = (0..cfg.repeats.max(1))
                    .map(|_| time_batch(method, &jobs, bytes, copies))
                    .collect::<Result<_, _>>()?;
                let s = median(&mut t);
                let moved = bytes as f64 * copies as f64 * jobs.len() as f64;
                let gbps = if s > 0.0 { moved / s / 1e9 } else { 0.0 };
                let pct_of_link = link
                    .gbps_per_direction
                    .filter(|l| *l > 0.0)
                    .map(|l| 100.0 * gbps / (l * jobs.len() as f64));
                rows.push(PeerRow {
                    method,
                    memory: if pool { "pool" } else { "cuMemAlloc" },
                    direction: dir,
                    bytes: bytes as u64,
                    median_s: s,
                    copies,
                    gbps,
                    pct_of_baseline: None,
                    pct_of_link,
                });
            }
        }
    }
    let pool_min_pct_of_baseline = set_pct_of_baseline(&mut rows);
    drop(pool_a);
    drop(pool_b);
    drop(plain_a);
    drop(plain_b);
    drop(sa);
    drop(sb);
    let checks = if cfg.check_bytes > 0 {
        progress("byte-for-byte checks");
        check_pool_peer_copies(a, b, usize::try_from(cfg.check_bytes).unwrap_or(usize::MAX))?
    } else {
        Vec::new()
    };
    Ok(PeerReport {
        devices: [a, b],
        names,
        peer_access: peers,
        attributes,
        link,
        rows,
        checks,
        pool_min_pct_of_baseline,
        target_pool_ge_90pct_of_baseline: pool_min_pct_of_baseline.map(|p| p >= 90.0),
    })
}
