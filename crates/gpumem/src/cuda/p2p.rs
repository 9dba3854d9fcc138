//! Copies between two GPUs (peer copies), their byte-for-byte check, and the link they run
//! over.
//!
//! Three ways to move bytes from device A to device B, all in [`peer_copy`]:
//! - [`PeerMethod::Peer`]: cuMemcpyPeerAsync with both contexts named (the plain CUDA way; it
//!   works without peer access, staging through the host then);
//! - [`PeerMethod::DtoD`]: cuMemcpyDtoDAsync on the two unified (UVA) addresses, which is
//!   what a pool block copy does; with peer access enabled ([`enable_peer_access`]) the copy
//!   engine moves the bytes over NVLink or PCIe directly;
//! - [`PeerMethod::Kernel`]: the `copy16` kernel ([`super::CopyKernel`]) launched on the
//!   destination device, reading the source through the peer mapping (loads over NVLink)
//!   and writing local memory. It needs peer access: cuCtxEnablePeerAccess for cuMemAlloc
//!   segments, cuMemSetAccess for VMM pages ([`crate::pool::DevicePool::set_peer_access`]).
//!
//! [`verify_peer_copy`] checks one copy byte for byte, with canary guards on both sides of
//! the destination. [`link_bandwidth`] says what the link between two devices should carry,
//! from `nvidia-smi` when it is there.
use std::process::Command;

use gpumem_core::DeviceError;

use super::driver::{self, P2pAttr};
use super::{guarded, CopyKernel, CudaContext, CudaError, Stream};

/// How a peer copy is made (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerMethod {
    /// cuMemcpyPeerAsync.
    Peer,
    /// cuMemcpyDtoDAsync on unified addresses.
    #[serde(rename = "dtod")]
    DtoD,
    /// The copy16 kernel on the destination device, reading through the peer mapping.
    Kernel,
}

impl PeerMethod {
    /// Short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            PeerMethod::Peer => "cuMemcpyPeerAsync",
            PeerMethod::DtoD => "cuMemcpyDtoDAsync",
            PeerMethod::Kernel => "kernel (peer load)",
        }
    }
}

/// Lets `from`'s device access cuMemAlloc memory of `to`'s device (cuCtxEnablePeerAccess in
/// `from`). Returns `true` if this call enabled it, `false` if it was already enabled.
/// VMM memory ignores this: its pages are shared with cuMemSetAccess.
///
/// # Errors
/// `DeviceError::Unsupported` when both are the same device or cuDeviceCanAccessPeer says
/// no; a failed driver call.
pub fn enable_peer_access(from: &CudaContext, to: &CudaContext) -> Result<bool, DeviceError> {
    if from.ordinal() == to.ordinal() {
        return Err(DeviceError::Unsupported(format!(
            "peer access of device {} to itself",
            from.ordinal()
        )));
    }
    if !driver::can_access_peer(from.ordinal(), to.ordinal())? {
        return Err(DeviceError::Unsupported(format!(
            "device {} cannot access device {} (cuDeviceCanAccessPeer)",
            from.ordinal(),
            to.ordinal()
        )));
    }
    from.bind()?;
    // SAFETY: `to` holds its retained context, alive for the call.
    unsafe { driver::ctx_enable_peer_access(to.context_raw()) }
}

/// Queues a copy of `bytes` bytes from `src` (on `src_ctx`'s device) to `dst` (on
/// `dst_ctx`'s device) on `stream`. [`PeerMethod::Kernel`] needs `kernel` (loaded in the
/// stream's context, normally the destination's) and copies `bytes` rounded down to 16.
///
/// # Errors
/// `DeviceError::Invalid` for the kernel method without a kernel, or with a kernel or stream
/// of another context than each other; a failed driver call.
///
/// # Safety
/// 1. `[src, src + bytes)` and `[dst, dst + bytes)` lie inside live device allocations of
///    their contexts that stay alive (and are not otherwise written) until the copy completes;
/// 2. for [`PeerMethod::Kernel`], both addresses are 16-byte aligned and the stream's device
///    has access to both ranges (peer access enabled or VMM pages granted); the ranges do not
///    overlap.
#[allow(clippy::too_many_arguments)]
pub unsafe fn peer_copy(
    method: PeerMethod,
    stream: &Stream,
    kernel: Option<&CopyKernel>,
    dst_ctx: &CudaContext,
    dst: u64,
    src_ctx: &CudaContext,
    src: u64,
    bytes: usize,
) -> Result<(), DeviceError> {
    match method {
        PeerMethod::Peer => {
            stream.context().bind()?;
            // SAFETY: the caller upholds 1; the stream is live in the current context.
            unsafe {
                driver::memcpy_peer_async(
                    dst,
                    dst_ctx.context_raw(),
                    src,
                    src_ctx.context_raw(),
                    bytes,
                    stream.raw(),
                )
            }
        }
        // SAFETY: the caller upholds 1 (unified addresses name their device).
        PeerMethod::DtoD => unsafe { stream.copy_d2d_raw(dst, src, bytes) },
        PeerMethod::Kernel => {
            let k = kernel.ok_or_else(|| DeviceError::Invalid {
                call: "cuLaunchKernel",
                detail: "a kernel peer copy without the copy16 kernel".into(),
            })?;
            if !k.context().same_context(stream.context()) {
                return Err(DeviceError::Invalid {
                    call: "cuLaunchKernel",
                    detail: "the copy16 kernel and the stream belong to different devices".into(),
                });
            }
            // SAFETY: the caller upholds 1 and 2.
            unsafe { k.launch(stream, dst, src, bytes) }
        }
    }
}

/// Bytes of canary kept on each side of the destination by [`verify_peer_copy`].
pub const GUARD_BYTES: usize = 4096;
/// The canary byte of the guards.
pub const CANARY: u8 = 0xC5;

/// The outcome of [`verify_peer_copy`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PeerCheck {
    /// The copy checked.
    pub method: PeerMethod,
    /// Source device ordinal.
    pub src_device: usize,
    /// Destination device ordinal.
    pub dst_device: usize,
    /// Bytes copied.
    pub bytes: u64,
    /// Destination bytes that differ from the source.
    pub mismatched_bytes: u64,
    /// Offset of the first such byte.
    pub first_mismatch: Option<u64>,
    /// Guard bytes (before and after the destination) no longer holding the canary.
    pub damaged_guard_bytes: u64,
    /// Source bytes changed by the copy.
    pub damaged_source_bytes: u64,
}

impl PeerCheck {
    /// Whether every byte arrived, and nothing else changed.
    pub fn ok(&self) -> bool {
        self.mismatched_bytes == 0
            && self.damaged_guard_bytes == 0
            && self.damaged_source_bytes == 0
    }
}

/// The byte at `offset` of the test pattern of `seed` (no period of a power of two, so a
/// copy landing at a shifted offset shows).
pub fn pattern_byte(seed: u32, offset: u64) -> u8 {
    let x = (offset.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 29) as u32 ^ seed;
    (x ^ (x >> 11) ^ (offset as u32 % 251)) as u8
}

/// Copies `bytes` bytes with `method` from `src` (on `src_ctx`) into the middle of the
/// destination region `dst` (on `dst_ctx`, `bytes + 2 ×` [`GUARD_BYTES`] long), and checks
/// it byte for byte: the source is filled with a pattern and the region with [`CANARY`]
/// first (host copies on each device), the copy runs on `stream`, then the whole region and
/// the source are read back. Waits for everything it queued.
///
/// # Errors
/// `DeviceError::Invalid` for 0 bytes or a destination offset that is not 16-byte aligned
/// with the kernel method; a failed driver call.
///
/// # Safety
/// 1. `[src, src + bytes)` is a live device allocation of `src_ctx`, and
///    `[dst, dst + bytes + 2 * GUARD_BYTES)` one of `dst_ctx`, both unused by anyone else
///    during the call;
/// 2. as [`peer_copy`]'s 2 for the kernel method.
#[allow(clippy::too_many_arguments)]
pub unsafe fn verify_peer_copy(
    method: PeerMethod,
    stream: &Stream,
    kernel: Option<&CopyKernel>,
    dst_ctx: &CudaContext,
    dst: u64,
    src_ctx: &CudaContext,
    src: u64,
    bytes: usize,
    seed: u32,
) -> Result<PeerCheck, DeviceError> {
    if bytes == 0 || (method == PeerMethod::Kernel && !bytes.is_multiple_of(16)) {
        return Err(DeviceError::Invalid {
            call: "verify_peer_copy",
            detail: format!(
                "{bytes} B: expected a positive size (a multiple of 16 for the kernel)"
            ),
        });
    }
    let region = bytes + 2 * GUARD_BYTES;
    let pattern: Vec<u8> = (0..bytes as u64).map(|i| pattern_byte(seed, i)).collect();
    let canary = vec![CANARY; region];
    let src_stream = Stream::new(src_ctx)?;
    let dst_stream = Stream::new(dst_ctx)?;
    // SAFETY: the host buffers live until the synchronisations below; the caller upholds 1.
    unsafe {
        src_stream.copy_h2d_raw(src, pattern.as_ptr(), bytes)?;
        dst_stream.copy_h2d_raw(dst, canary.as_ptr(), region)?;
    }
    src_stream.synchronize()?;
    dst_stream.synchronize()?;
    let to = dst + GUARD_BYTES as u64;
    // SAFETY: the caller upholds 1 and 2; `[to, to + bytes)` lies inside the region.
    unsafe { peer_copy(method, stream, kernel, dst_ctx, to, src_ctx, src, bytes)? };
    stream.synchronize()?;
    let mut back = vec![0u8; region];
    let mut src_back = vec![0u8; bytes];
    // SAFETY: the host buffers are borrowed mutably until the synchronisations below.
    unsafe {
        dst_stream.copy_d2h_raw(back.as_mut_ptr(), dst, region)?;
        src_stream.copy_d2h_raw(src_back.as_mut_ptr(), src, bytes)?;
    }
    dst_stream.synchronize()?;
    src_stream.synchronize()?;
    let (head, rest) = back.split_at(GUARD_BYTES);
    let (body, tail) = rest.split_at(bytes);
    let mismatches = body
        .iter()
        .zip(&pattern)
        .enumerate()
        .filter(|(_, (a, b))| a != b);
    let mut mismatched_bytes = 0u64;
    let mut first_mismatch = None;
    for (i, _) in mismatches {
        mismatched_bytes += 1;
        first_mismatch.get_or_insert(i as u64);
    }
    let damaged = |s: &[u8]| s.iter().filter(|&&b| b != CANARY).count() as u64;
    Ok(PeerCheck {
        method,
        src_device: src_ctx.ordinal(),
        dst_device: dst_ctx.ordinal(),
        bytes: bytes as u64,
        mismatched_bytes,
        first_mismatch,
        damaged_guard_bytes: damaged(head) + damaged(tail),
        damaged_source_bytes: src_back
            .iter()
            .zip(&pattern)
            .filter(|(a, b)| a != b)
            .count() as u64,
    })
}

/// What the driver says about the path from device `src` to `dst`
/// (cuDeviceGetP2PAttribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct P2pAttributes {
    /// CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: relative rank of the link (0 is the best the
    /// system has; a ranking, not a bandwidth).
    pub performance_rank: i32,
    /// CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED.
    pub access_supported: bool,
    /// CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED.
    pub native_atomics: bool,
}

/// The peer attributes from device `src` to device `dst` (ordinals).
///
/// # Errors
/// [`CudaError::NoDriver`] without a driver; a failed driver call.
pub fn p2p_attributes(src: usize, dst: usize) -> Result<P2pAttributes, CudaError> {
    super::init()?;
    guarded(|| {
        let a = |attr| driver::device_p2p_attribute(attr, src, dst);
        Ok(P2pAttributes {
            performance_rank: a(P2pAttr::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
            access_supported: a(P2pAttr::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
            native_atomics: a(P2pAttr::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
        })
    })
}

/// NVLink 4 (Hopper) nominal data rate per link and direction, in GB/s (10^9 B/s): 18 links
/// make the 450 GB/s per direction NVIDIA quotes for an H100/H200 SXM.
pub const NVLINK4_LINK_GBPS: f64 = 25.0;
/// PCIe 5.0 x16 nominal data rate per direction, in GB/s (32 GT/s × 16 lanes, 128b/130b).
pub const PCIE5_X16_GBPS: f64 = 63.0;

/// What the link between two devices should carry per direction, and where that figure
/// comes from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LinkEstimate {
    /// `NVLink`, `PCIe` or `unknown`.
    pub kind: String,
    /// NVLink links between the two (from `nvidia-smi topo -m`, e.g. `NV18`).
    pub links: Option<u32>,
    /// Bandwidth per direction, GB/s (10^9 B/s); `None` when unknown.
    pub gbps_per_direction: Option<f64>,
    /// How the figure was found (the commands and values read, or the nominal used).
    pub source: String,
}

/// Strips ANSI escape sequences (nvidia-smi underlines the topology header on a terminal).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... final byte in @..~
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if ('@'..='~').contains(&d) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The GPU-to-GPU part of `nvidia-smi topo -m`: `m[i][j]` is the cell of row `GPUi`,
/// column `GPUj` (`X` on the diagonal, `NV18`, `PIX`, `SYS`, ...), indexed by nvidia-smi's
/// GPU numbers. Empty when the text holds no such matrix.
pub fn parse_topo_matrix(text: &str) -> Vec<Vec<String>> {
    let text = strip_ansi(text);
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let gpu_index = |t: &str| -> Option<usize> { t.strip_prefix("GPU")?.parse().ok() };
    // Columns in order: the header's tab-separated names (the first cell is empty).
    let cols: Vec<Option<usize>> = header
        .split('\t')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(gpu_index)
        .collect();
    let n = cols.iter().flatten().count();
    if n == 0 {
        return Vec::new();
    }
    let mut m = vec![vec![String::new(); n]; n];
    for line in lines {
        let mut cells = line.split('\t').map(str::trim);
        let Some(row) = cells.next().and_then(gpu_index) else {
            continue;
        };
        if row >= n {
            continue;
        }
        for (col, cell) in cols.iter().zip(cells) {
            if let Some(c) = *col {
                if c < n {
                    m[row][c] = cell.to_string();
                }
            }
        }
    }
    m
}

/// `nvidia-smi nvlink -s`: for each `GPU n:` section, the speeds of its active links in
/// GB/s (`Link k: 26.562 GB/s`; `<inactive>` links are left out), as `(n, speeds)`.
pub fn parse_nvlink_status(text: &str) -> Vec<(usize, Vec<f64>)> {
    let mut out: Vec<(usize, Vec<f64>)> = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("GPU ") {
            if let Some(n) = rest.split(':').next().and_then(|t| t.trim().parse().ok()) {
                out.push((n, Vec::new()));
            }
        } else if let Some(rest) = line.strip_prefix("Link ") {
            let Some((_, speed)) = rest.split_once(':') else {
                continue;
            };
            let speed = speed.trim();
            if let Some(v) = speed
                .strip_suffix("GB/s")
                .and_then(|v| v.trim().parse::<f64>().ok())
            {
                if let Some(last) = out.last_mut() {
                    last.1.push(v);
                }
            }
        }
    }
    out
}

/// `nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader`: `(index, bus id)`.
pub fn parse_gpu_bus_ids(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .filter_map(|l| {
            let (i, b) = l.split_once(',')?;
            Some((i.trim().parse().ok()?, b.trim().to_string()))
        })
        .collect()
}

/// A PCI bus id without its domain, lower case (`0000:3B:00.0` and `00000000:3b:00.0` both
/// give `3b:00.0`).
fn bus_key(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((_, rest)) if rest.contains(':') => rest.to_string(),
        _ => id,
    }
}

fn nvidia_smi(args: &[&str]) -> Option<String> {
    let out = Command::new("nvidia-smi").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Estimates the link from `nvidia-smi` output: `topo` (of `topo -m`), `nvlink` (of
/// `nvlink -s`, optional) and the nvidia-smi GPU numbers `a`, `b` of the two devices.
/// NVLink: links × the mean active link speed `nvlink -s` reports for `a` (or ×
/// [`NVLINK4_LINK_GBPS`], stated as nominal, without it); PCIe: [`PCIE5_X16_GBPS`], nominal.
pub fn estimate_link(topo: &str, nvlink: Option<&str>, a: usize, b: usize) -> LinkEstimate {
    let m = parse_topo_matrix(topo);
    let Some(cell) = m.get(a).and_then(|r| r.get(b)).filter(|c| !c.is_empty()) else {
        return LinkEstimate {
            kind: "unknown".into(),
            links: None,
            gbps_per_direction: None,
            source: format!("nvidia-smi topo -m has no cell for GPU{a}/GPU{b}"),
        };
    };
    if let Some(n) = cell.strip_prefix("NV").and_then(|n| n.parse::<u32>().ok()) {
        let speeds = nvlink
            .map(parse_nvlink_status)
            .and_then(|v| v.into_iter().find(|(g, _)| *g == a))
            .map(|(_, s)| s)
            .filter(|s| !s.is_empty());
        return match speeds {
            Some(s) => {
                let per_link = s.iter().sum::<f64>() / s.len() as f64;
                LinkEstimate {
                    kind: "NVLink".into(),
                    links: Some(n),
                    gbps_per_direction: Some(f64::from(n) * per_link),
                    source: format!(
                        "nvidia-smi topo -m: {cell} between GPU{a} and GPU{b}; nvidia-smi nvlink -s: {per_link:.3} GB/s per link (mean of {} active links of GPU{a}); {n} × {per_link:.3} GB/s per direction",
                        s.len()
                    ),
                }
            }
            None => LinkEstimate {
                kind: "NVLink".into(),
                links: Some(n),
                gbps_per_direction: Some(f64::from(n) * NVLINK4_LINK_GBPS),
                source: format!(
                    "nvidia-smi topo -m: {cell} between GPU{a} and GPU{b}; nominal NVLink 4 rate {NVLINK4_LINK_GBPS} GB/s per link and direction (nvidia-smi nvlink -s gave no speeds)"
                ),
            },
        };
    }
    LinkEstimate {
        kind: "PCIe".into(),
        links: None,
        gbps_per_direction: Some(PCIE5_X16_GBPS),
        source: format!(
            "nvidia-smi topo -m: {cell} between GPU{a} and GPU{b} (no NVLink); nominal PCIe 5.0 x16 rate {PCIE5_X16_GBPS} GB/s per direction"
        ),
    }
}

/// The link between CUDA devices `a` and `b` (ordinals), from `nvidia-smi topo -m` and
/// `nvidia-smi nvlink -s` run now (CUDA ordinals are matched to nvidia-smi's GPU numbers by
/// PCI bus id). Without nvidia-smi the estimate is `unknown` and names the driver's
/// performance rank instead.
///
/// # Errors
/// [`CudaError`] from opening the devices (for their bus ids).
pub fn link_bandwidth(a: usize, b: usize) -> Result<LinkEstimate, CudaError> {
    let ca = CudaContext::new(a)?;
    let cb = CudaContext::new(b)?;
    let (ba, bb) = (bus_key(&ca.pci_bus_id()?), bus_key(&cb.pci_bus_id()?));
    let Some(topo) = nvidia_smi(&["topo", "-m"]) else {
        let rank = p2p_attributes(a, b)
            .map(|p| p.performance_rank.to_string())
            .unwrap_or_else(|e| e.to_string());
        return Ok(LinkEstimate {
            kind: "unknown".into(),
            links: None,
            gbps_per_direction: None,
            source: format!(
                "nvidia-smi not found; CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK = {rank} (a rank, not a bandwidth)"
            ),
        });
    };
    let ids = nvidia_smi(&["--query-gpu=index,pci.bus_id", "--format=csv,noheader"])
        .map(|t| parse_gpu_bus_ids(&t))
        .unwrap_or_default();
    let smi_index = |key: &str, fallback: usize| {
        ids.iter()
            .find(|(_, id)| bus_key(id) == key)
            .map_or(fallback, |(i, _)| *i)
    };
    let (sa, sb) = (smi_index(&ba, a), smi_index(&bb, b));
    let nvlink = nvidia_smi(&["nvlink", "-s", "-i", &sa.to_string()]);
    Ok(estimate_link(&topo, nvlink.as_deref(), sa, sb))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPO: &str =
        "\u{1b}[4m\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\u{1b}[0m\n\
GPU0\t X \tNV18\tSYS\t0-47\t0\t\tN/A\n\
GPU1\tNV18\t X \tSYS\t48-95\t1\t\tN/A\n\
NIC0\tSYS\tSYS\t X \t\t\t\t\n\
\n\
Legend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n";

    const NVLINK: &str = "GPU 0: NVIDIA H200 (UUID: GPU-1234)\n\t Link 0: 26.562 GB/s\n\t Link 1: 26.562 GB/s\n\t Link 2: <inactive>\nGPU 1: NVIDIA H200 (UUID: GPU-5678)\n\t Link 0: 26.562 GB/s\n";

    #[test]
    fn topo_matrix_reads_the_gpu_cells() {
        let m = parse_topo_matrix(TOPO);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0][1], "NV18");
        assert_eq!(m[1][0], "NV18");
        assert_eq!(m[0][0], "X");
        assert!(parse_topo_matrix("no matrix here\n").is_empty());
        assert!(parse_topo_matrix("").is_empty());
    }

    #[test]
    fn nvlink_status_keeps_active_links() {
        let s = parse_nvlink_status(NVLINK);
        assert_eq!(s, vec![(0, vec![26.562, 26.562]), (1, vec![26.562])]);
    }

    #[test]
    fn link_estimate_uses_reported_speeds_then_the_nominal() {
        let e = estimate_link(TOPO, Some(NVLINK), 0, 1);
        assert_eq!((e.kind.as_str(), e.links), ("NVLink", Some(18)));
        let g = e.gbps_per_direction.unwrap();
        assert!((g - 18.0 * 26.562).abs() < 1e-9, "{g}");
        assert!(e.source.contains("nvlink -s"), "{}", e.source);
        let e = estimate_link(TOPO, None, 1, 0);
        assert_eq!(e.gbps_per_direction, Some(18.0 * NVLINK4_LINK_GBPS));
        assert!(e.source.contains("nominal"), "{}", e.source);
        let pcie = TOPO.replace("NV18", "SYS");
        let e = estimate_link(&pcie, Some(NVLINK), 0, 1);
        assert_eq!(
            (e.kind.as_str(), e.gbps_per_direction),
            ("PCIe", Some(PCIE5_X16_GBPS))
        );
        let e = estimate_link(TOPO, None, 0, 5);
        assert_eq!((e.kind.as_str(), e.gbps_per_direction), ("unknown", None));
    }

    #[test]
    fn bus_ids_match_across_formats() {
        assert_eq!(bus_key("0000:3B:00.0"), bus_key("00000000:3b:00.0"));
        assert_ne!(bus_key("0000:3B:00.0"), bus_key("0000:5D:00.0"));
        assert_eq!(
            parse_gpu_bus_ids("0, 00000000:3B:00.0\n1, 00000000:5D:00.0\n"),
            vec![
                (0, "00000000:3B:00.0".into()),
                (1, "00000000:5D:00.0".into())
            ]
        );
    }

    #[test]
    fn pattern_has_no_short_period() {
        let v: Vec<u8> = (0..4096).map(|i| pattern_byte(7, i)).collect();
        for shift in [1usize, 2, 4, 16, 64, 256, 1024] {
            assert!(
                v.iter().zip(&v[shift..]).any(|(a, b)| a != b),
                "period {shift}"
            );
        }
        assert_ne!(pattern_byte(1, 5), pattern_byte(2, 5));
    }
}
