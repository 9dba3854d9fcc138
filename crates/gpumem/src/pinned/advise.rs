//! Which host memory to use for a transfer pattern: pageable, pooled pinned, staged or mapped.
//!
//! The usual advice ("pin for large transfers (> 10 MB), be careful with frequent small
//! copies because pinning is expensive, asynchronous copies need pinned memory, zero-copy
//! needs mapped memory, don't pin much where memory is scarce") made quantitative: from a
//! measured table of bandwidth per kind and size and of allocation costs, the expected time
//! of one transfer of each kind, the allocation cost amortised over the transfer rate, and
//! the kind that minimises their sum under the constraints. Pure arithmetic; the table comes
//! from `gpumem bench transfer` / `bench pinned` (JSON) or [`TransferTable::h200`].

use serde::{Deserialize, Serialize};

/// Where the host side of a copy lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKind {
    /// `malloc` / `Vec`: the driver copies through its own bounce buffer.
    Pageable,
    /// Page-locked (`cuMemHostAlloc`, default flags), from a pool.
    Pinned,
    /// Page-locked and write-combined (`CU_MEMHOSTALLOC_WRITECOMBINED`).
    WriteCombined,
    /// Page-locked and mapped (`CU_MEMHOSTALLOC_DEVICEMAP`): kernels read it over PCIe.
    Mapped,
    /// Pageable, copied through gpumem's pinned staging ring.
    Staged,
}

impl MemoryKind {
    /// Every kind, in table order.
    pub const ALL: [MemoryKind; 5] = [
        MemoryKind::Pageable,
        MemoryKind::Pinned,
        MemoryKind::WriteCombined,
        MemoryKind::Mapped,
        MemoryKind::Staged,
    ];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Pageable => "pageable",
            MemoryKind::Pinned => "pinned",
            MemoryKind::WriteCombined => "write_combined",
            MemoryKind::Mapped => "mapped",
            MemoryKind::Staged => "staged",
        }
    }

    /// Parses [`MemoryKind::name`] (also `wc`, `write-combined`).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "pageable" => Some(MemoryKind::Pageable),
            "pinned" => Some(MemoryKind::Pinned),
            "write_combined" | "wc" => Some(MemoryKind::WriteCombined),
            "mapped" | "zero_copy" => Some(MemoryKind::Mapped),
            "staged" => Some(MemoryKind::Staged),
            _ => None,
        }
    }
}

/// Direction of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Host to device.
    H2d,
    /// Device to host.
    D2h,
    /// Both at once on two streams (bandwidth counts the bytes of both).
    Both,
}

impl Direction {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Direction::H2d => "h2d",
            Direction::D2h => "d2h",
            Direction::Both => "both",
        }
    }
}

/// One measured bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TransferPoint {
    /// Host memory kind.
    pub kind: MemoryKind,
    /// Direction.
    pub direction: Direction,
    /// Bytes per copy.
    pub bytes: u64,
    /// Bandwidth, GB/s (1e9 bytes per second), median of repeats.
    pub gbps: f64,
}

/// One measured allocation cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocPoint {
    /// `cuMemHostAlloc`, `cuMemHostRegister`, `malloc+touch`, `pool_cold`, `pool_warm`, `mlock`.
    pub method: String,
    /// Bytes per allocation.
    pub bytes: u64,
    /// Seconds per allocation (median).
    pub alloc_s: f64,
    /// Seconds per free / unregister (median).
    pub free_s: f64,
}

/// A machine's transfer and allocation figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferTable {
    /// Where the figures come from (`measured 2026-11-29 ...`, `built-in H200 anchors`).
    pub source: String,
    /// The device they were measured on.
    pub device: String,
    /// Bandwidths.
    pub transfers: Vec<TransferPoint>,
    /// Allocation costs.
    #[serde(default)]
    pub alloc: Vec<AllocPoint>,
}

impl TransferTable {
    /// The built-in table: figures measured on the lent H200 (PCIe gen 5 x16, driver 580; its
    /// `source` line gives the date): cudaMemcpyAsync bandwidths, host allocation costs, and
    /// the staging ring's rate at 1 GiB with 12 copy threads (34.3 GB/s); staged figures below
    /// 64 MiB are an estimate (fill, then DMA, without overlap).
    pub fn h200() -> Self {
        const KIB: u64 = 1 << 10;
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        let sizes = [4 * KIB, 64 * KIB, MIB, 8 * MIB, 64 * MIB, GIB];
        let rows: [(MemoryKind, Direction, [f64; 6]); 6] = [
            (
                MemoryKind::Pageable,
                Direction::H2d,
                [0.90, 4.7, 11.9, 13.1, 7.6, 8.4],
            ),
            (
                MemoryKind::Pageable,
                Direction::D2h,
                [0.41, 3.6, 7.9, 10.8, 11.4, 14.1],
            ),
            (
                MemoryKind::Pinned,
                Direction::H2d,
                [0.87, 11.2, 44.3, 53.8, 55.2, 55.5],
            ),
            (
                MemoryKind::Pinned,
                Direction::D2h,
                [1.08, 13.8, 46.2, 54.0, 55.2, 55.3],
            ),
            (
                MemoryKind::WriteCombined,
                Direction::H2d,
                [0.86, 11.2, 44.5, 53.8, 55.3, 55.6],
            ),
            (
                MemoryKind::Mapped,
                Direction::H2d,
                [0.52, 7.3, 37.3, 49.0, 50.9, 51.3],
            ),
        ];
        let mut transfers = Vec::new();
        for (kind, direction, gbps) in rows {
            for (bytes, g) in sizes.iter().zip(gbps) {
                transfers.push(TransferPoint {
                    kind,
                    direction,
                    bytes: *bytes,
                    gbps: g,
                });
            }
        }
        // Staged: 34.3 GB/s at 1 GiB measured; below, one fill then one DMA per chunk.
        let fill = 34.3;
        for (bytes, pinned) in sizes.iter().zip([0.87, 11.2, 44.3, 53.8, 55.2]) {
            transfers.push(TransferPoint {
                kind: MemoryKind::Staged,
                direction: Direction::H2d,
                bytes: *bytes,
                gbps: 1.0 / (1.0 / fill + 1.0 / pinned),
            });
        }
        transfers.push(TransferPoint {
            kind: MemoryKind::Staged,
            direction: Direction::H2d,
            bytes: GIB,
            gbps: fill,
        });
        let alloc_rows: [(&str, [f64; 4], [f64; 4]); 4] = [
            (
                "cuMemHostAlloc",
                [1.0e-3, 7.9e-3, 131e-3, 409e-3],
                [0.39e-3, 2.3e-3, 37e-3, 122e-3],
            ),
            (
                "malloc+touch",
                [0.05e-3, 1.8e-3, 160e-3, 555e-3],
                [0.0, 0.0, 0.0, 0.0],
            ),
            (
                "cuMemHostRegister",
                [0.26e-3, 1.2e-3, 14e-3, 46e-3],
                [0.12e-3, 0.38e-3, 5.1e-3, 19e-3],
            ),
            // gpumem's pool, warm: no driver call, so the figure measured on the mlock
            // fallback (≈0.06 µs + 0.05 µs, release build) carries over; rounded up.
            // (PyTorch's pinned cache: 0.04 ms from Python.)
            ("pool_warm", [0.2e-6; 4], [0.2e-6; 4]),
        ];
        let alloc_sizes = [MIB, 16 * MIB, 256 * MIB, GIB];
        let mut alloc = Vec::new();
        for (method, a, f) in alloc_rows {
            for i in 0..4 {
                alloc.push(AllocPoint {
                    method: method.to_string(),
                    bytes: alloc_sizes[i],
                    alloc_s: a[i],
                    free_s: f[i],
                });
            }
        }
        Self {
            source: "built-in H200 figures (gpumem anchors, 2026-11-29)".into(),
            device: "NVIDIA H200 (PCIe gen 5 x16)".into(),
            transfers,
            alloc,
        }
    }

    /// Bandwidth of `kind` in `direction` at `bytes`, GB/s: interpolated linearly in
    /// log(size) between measured sizes, the nearest end outside them. For D2H of
    /// write-combined, mapped or staged memory with no figure, the H2D figure stands in.
    pub fn gbps(&self, kind: MemoryKind, direction: Direction, bytes: u64) -> Option<f64> {
        let pick = |dir: Direction| {
            let mut pts: Vec<(u64, f64)> = self
                .transfers
                .iter()
                .filter(|p| p.kind == kind && p.direction == dir && p.gbps > 0.0)
                .map(|p| (p.bytes, p.gbps))
                .collect();
            pts.sort_by_key(|p| p.0);
            interpolate_log(&pts, bytes)
        };
        pick(direction).or_else(|| {
            if direction != Direction::H2d && kind != MemoryKind::Pageable {
                pick(Direction::H2d)
            } else {
                None
            }
        })
    }

    /// Seconds of the smallest measured transfer of `kind` in `direction` when `bytes` is
    /// below its size, else 0: a copy never takes less than the smallest one measured (below
    /// it, latency dominates, not bandwidth). The H2D figure stands in as in
    /// [`TransferTable::gbps`].
    pub fn latency_floor_s(&self, kind: MemoryKind, direction: Direction, bytes: u64) -> f64 {
        let smallest = |dir: Direction| {
            self.transfers
                .iter()
                .filter(|p| p.kind == kind && p.direction == dir && p.gbps > 0.0)
                .min_by_key(|p| p.bytes)
                .map(|p| (p.bytes, p.gbps))
        };
        let s = smallest(direction).or_else(|| {
            if direction != Direction::H2d && kind != MemoryKind::Pageable {
                smallest(Direction::H2d)
            } else {
                None
            }
        });
        match s {
            Some((sb, g)) if bytes < sb => sb as f64 / (g * 1e9),
            _ => 0.0,
        }
    }

    /// Seconds of one allocation (and of its free) by `method` at `bytes`, interpolated
    /// like [`TransferTable::gbps`] but in log(time).
    pub fn alloc_cost(&self, method: &str, bytes: u64) -> Option<(f64, f64)> {
        let mut pts: Vec<&AllocPoint> = self.alloc.iter().filter(|p| p.method == method).collect();
        pts.sort_by_key(|p| p.bytes);
        let a: Vec<(u64, f64)> = pts.iter().map(|p| (p.bytes, p.alloc_s)).collect();
        let f: Vec<(u64, f64)> = pts.iter().map(|p| (p.bytes, p.free_s)).collect();
        Some((
            interpolate_log(&a, bytes)?,
            interpolate_log(&f, bytes).unwrap_or(0.0),
        ))
    }
}

/// Linear interpolation in log2(size) over `pts` sorted by size; clamps outside.
fn interpolate_log(pts: &[(u64, f64)], bytes: u64) -> Option<f64> {
    let first = pts.first()?;
    let last = pts.last()?;
    if bytes <= first.0 {
        return Some(first.1);
    }
    if bytes >= last.0 {
        return Some(last.1);
    }
    let x = (bytes as f64).log2();
    for w in pts.windows(2) {
        let (a, b) = (w[0], w[1]);
        if bytes >= a.0 && bytes <= b.0 {
            let xa = (a.0 as f64).log2();
            let xb = (b.0 as f64).log2();
            let t = if xb > xa { (x - xa) / (xb - xa) } else { 0.0 };
            return Some(a.1 + t * (b.1 - a.1));
        }
    }
    Some(last.1)
}

/// A transfer pattern.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pattern {
    /// Bytes per transfer.
    pub bytes: u64,
    /// Transfers per second (0: a one-off).
    pub per_second: f64,
    /// Whether the copy must be asynchronous (overlap host work or kernels).
    pub asynchronous: bool,
    /// Direction.
    pub direction: Direction,
    /// The pinned-memory cap, in bytes (a pinned buffer larger than this cannot be pooled).
    pub pinned_cap_bytes: u64,
    /// Seconds the pattern runs, over which a pool's one-time (cold) allocation is spread.
    pub horizon_s: f64,
}

/// One option for a pattern, with the numbers behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KindOption {
    /// The memory kind.
    pub kind: MemoryKind,
    /// What it means in practice.
    pub how: &'static str,
    /// Expected seconds per transfer (bytes / bandwidth).
    pub transfer_s: f64,
    /// Allocation cost per transfer, in seconds: for pinned kinds the pool's cold cost
    /// (`cuMemHostAlloc` + zeroing) spread over the transfers of the horizon
    /// (`per_second × horizon_s`, at least one) plus its warm cost;
    /// 0 for pageable and staged memory (the caller's buffers are reused).
    pub alloc_per_transfer_s: f64,
    /// Sum of the two.
    pub total_s: f64,
    /// Fraction of each second spent transferring at the pattern's rate.
    pub busy_fraction: f64,
    /// Whether the copy can be asynchronous with this kind.
    pub asynchronous: bool,
    /// Why this kind is ruled out, if it is.
    pub excluded: Option<String>,
}

/// The advice for a pattern: every option and the chosen one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Advice {
    /// Where the figures came from.
    pub source: String,
    /// All options, best first (excluded ones last).
    pub options: Vec<KindOption>,
    /// The recommended kind.
    pub recommended: MemoryKind,
    /// Seconds per transfer with pinned memory allocated and freed for each transfer
    /// (`cuMemHostAlloc` + `cuMemFreeHost`, no pool): what the pool saves. `None` without
    /// the figures.
    pub unpooled_pinned_s: Option<f64>,
    /// Why, in one sentence.
    pub reason: String,
}

/// Where `gpumem bench transfer` caches its table for `gpumem advise`:
/// `$XDG_CACHE_HOME/gpumem/transfer.json`, else `~/.cache/gpumem/transfer.json`; `None`
/// when neither variable is set.
pub fn cache_path() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("gpumem").join("transfer.json"))
}

/// The cached table and where it was read from; `None` if there is none or it cannot be
/// read as a table.
pub fn load_cached_table() -> Option<(std::path::PathBuf, TransferTable)> {
    let p = cache_path()?;
    let text = std::fs::read_to_string(&p).ok()?;
    serde_json::from_str(&text).ok().map(|t| (p, t))
}

/// Merges `update` into the cached table (its transfers replace the cached ones if it has
/// any, its allocation costs likewise; a table of another device is replaced whole) and
/// writes it back. Returns the file written.
///
/// # Errors
/// An I/O error naming the file (or that neither `XDG_CACHE_HOME` nor `HOME` is set).
pub fn store_table(update: TransferTable) -> std::io::Result<std::path::PathBuf> {
    let p = cache_path().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "neither XDG_CACHE_HOME nor HOME is set",
        )
    })?;
    let mut t = match load_cached_table() {
        Some((_, old)) if old.device == update.device => old,
        _ => TransferTable {
            source: String::new(),
            device: update.device.clone(),
            transfers: Vec::new(),
            alloc: Vec::new(),
        },
    };
    t.source = update.source;
    if !update.transfers.is_empty() {
        t.transfers = update.transfers;
    }
    if !update.alloc.is_empty() {
        t.alloc = update.alloc;
    }
    let with_path = |e: std::io::Error, what: &str, path: &std::path::Path| {
        std::io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
    };
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir).map_err(|e| with_path(e, "creating", dir))?;
    }
    let text = serde_json::to_string_pretty(&t).map_err(std::io::Error::other)?;
    std::fs::write(&p, text).map_err(|e| with_path(e, "writing", &p))?;
    Ok(p)
}

/// Recommends a kind for `pattern` from `table`.
///
/// Rules: asynchronous copies need pinned (pooled or write-combined) or mapped memory;
/// pinned kinds need the buffer to fit under the pinned cap; mapped memory only for
/// transfers ≤ 1 MiB read once by a kernel (every access crosses PCIe); write-combined only
/// host-to-device (the CPU reading it is very slow). Among the rest, least total time per
/// transfer; a pinned option must beat pageable by 10 % to be worth its locked memory, and
/// write-combined must beat plain pinned by 5 %.
pub fn advise(table: &TransferTable, pattern: &Pattern) -> Advice {
    let b = pattern.bytes.max(1);
    let rate = pattern.per_second.max(0.0);
    let options = kind_options(table, pattern, b, rate);
    let (recommended, reason) = recommend(table, pattern, &options, b, rate);
    let unpooled_pinned_s = match (
        table.alloc_cost("cuMemHostAlloc", b),
        table.gbps(MemoryKind::Pinned, pattern.direction, b),
    ) {
        (Some((a, f)), Some(g)) => Some(a + f + b as f64 / (g * 1e9)),
        _ => None,
    };
    Advice {
        source: table.source.clone(),
        options,
        recommended,
        reason,
        unpooled_pinned_s,
    }
}

/// Every kind the table has a rate for at `b` bytes, with its costs per transfer at `rate`
/// transfers a second and why it is ruled out, if it is; the usable ones first, fastest
/// first.
fn kind_options(table: &TransferTable, pattern: &Pattern, b: u64, rate: f64) -> Vec<KindOption> {
    let cold = table
        .alloc_cost("pool_cold", b)
        .or_else(|| table.alloc_cost("cuMemHostAlloc", b))
        .map_or(0.0, |(a, f)| a + f);
    let warm = table
        .alloc_cost("pool_warm", b)
        .map_or(1e-6, |(a, f)| a + f);
    let mut options = Vec::new();
    for kind in MemoryKind::ALL {
        let dir = pattern.direction;
        let (how, is_async, pinned) = match kind {
            MemoryKind::Pageable => ("keep malloc'd buffers; cudaMemcpy", false, false),
            MemoryKind::Pinned => ("PinnedPool blocks; cudaMemcpyAsync", true, true),
            MemoryKind::WriteCombined => (
                "write-combined PinnedPool; CPU writes only, then cudaMemcpyAsync",
                true,
                true,
            ),
            MemoryKind::Mapped => (
                "mapped pinned memory read by the kernel (zero-copy)",
                true,
                true,
            ),
            MemoryKind::Staged => (
                "keep pageable buffers; StagingRing::copy_pageable_to_device",
                false,
                false,
            ),
        };
        let Some(gbps) = table.gbps(kind, dir, b) else {
            continue;
        };
        let transfer_s = (b as f64 / (gbps * 1e9)).max(table.latency_floor_s(kind, dir, b));
        let alloc_per_transfer_s = if pinned {
            warm + cold / (rate * pattern.horizon_s.max(0.0)).max(1.0)
        } else {
            0.0
        };
        let total_s = transfer_s + alloc_per_transfer_s;
        let mut excluded = None;
        if pattern.asynchronous && !is_async {
            excluded = Some("not asynchronous: the host waits for the copy".to_string());
        } else if pinned && b > pattern.pinned_cap_bytes {
            excluded = Some(format!(
                "{} is more than the pinned cap of {}",
                crate::units::bytes(b),
                crate::units::bytes(pattern.pinned_cap_bytes)
            ));
        } else if kind == MemoryKind::Mapped && b > 1 << 20 {
            excluded =
                Some("over 1 MiB: every kernel access crosses PCIe; copy once instead".to_string());
        } else if kind == MemoryKind::WriteCombined && dir != Direction::H2d {
            excluded = Some("the CPU reads write-combined memory very slowly".to_string());
        }
        options.push(KindOption {
            kind,
            how,
            transfer_s,
            alloc_per_transfer_s,
            total_s,
            busy_fraction: total_s * rate,
            asynchronous: is_async,
            excluded,
        });
    }
    options.sort_by(|a, b| {
        (a.excluded.is_some(), a.total_s)
            .partial_cmp(&(b.excluded.is_some(), b.total_s))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    options
}

/// The kind to take among `options` (sorted as [`kind_options`] leaves them) and why.
fn recommend(
    table: &TransferTable,
    pattern: &Pattern,
    options: &[KindOption],
    b: u64,
    rate: f64,
) -> (MemoryKind, String) {
    let pageable = options
        .iter()
        .find(|o| o.kind == MemoryKind::Pageable && o.excluded.is_none())
        .map(|o| o.total_s);
    let mut best = options.iter().find(|o| o.excluded.is_none());
    // Write-combined memory is slow for the CPU to read: take it only when it is clearly
    // (5 %) faster than plain pinned memory.
    let mut over_write_combined = false;
    if let Some(b) = best.filter(|b| b.kind == MemoryKind::WriteCombined) {
        if let Some(p) = options
            .iter()
            .find(|o| o.kind == MemoryKind::Pinned && o.excluded.is_none())
        {
            if p.total_s <= b.total_s * 1.05 {
                best = Some(p);
                over_write_combined = true;
            }
        }
    }
    match (best, pageable) {
        (Some(best), Some(p)) if best.kind != MemoryKind::Pageable && best.total_s > p / 1.1 => (
            MemoryKind::Pageable,
            format!(
                "{} would save under 10 % ({} vs {} per transfer): not worth locking memory",
                best.kind.name(),
                crate::units::duration(best.total_s),
                crate::units::duration(p)
            ),
        ),
        (Some(best), _) => (
            best.kind,
            format!(
                "{} per transfer ({:.1} GB/s effective){}{}",
                crate::units::duration(best.total_s),
                b as f64 / best.total_s / 1e9,
                if over_write_combined {
                    "; write-combined is less than 5 % faster and slow for the CPU to read back"
                } else {
                    ""
                },
                if best.busy_fraction > 1.0 {
                    format!(
                        "; at {rate}/s that is {} % of each second: the pattern cannot be sustained ({})",
                        busy_percent(best.busy_fraction),
                        sustainable(best.total_s)
                    )
                } else {
                    String::new()
                }
            ),
        ),
        // Asynchronous but larger than the pinned cap: pinned memory still serves it in
        // pieces, two of them under the cap (one filled while the other is copied).
        (None, _)
            if pattern.asynchronous
                && b > pattern.pinned_cap_bytes
                && pattern.pinned_cap_bytes >= 2
                && table.gbps(MemoryKind::Pinned, pattern.direction, b).is_some() =>
        {
            let piece = pattern.pinned_cap_bytes / 2;
            (
                MemoryKind::Pinned,
                format!(
                    "in pieces: no kind takes {} whole asynchronously (pinned memory is capped at {}); copy it in {} pieces of at most {} through a PinnedPool of two (fill one while the other is copied with cudaMemcpyAsync), or raise --cap",
                    crate::units::bytes(b),
                    crate::units::bytes(pattern.pinned_cap_bytes),
                    b.div_ceil(piece),
                    crate::units::bytes(piece),
                ),
            )
        }
        (None, _) => (
            MemoryKind::Pageable,
            format!(
                "no kind meets the constraints (each is ruled out above){}; falling back to pageable",
                if pattern.asynchronous {
                    ", and pageable memory is not asynchronous"
                } else {
                    ""
                }
            ),
        ),
    }
}

/// The most transfers of `total_s` seconds each that a second holds: `at most 822 transfers
/// a second`, or for a transfer longer than a second `at most one transfer every 512.89 s`
/// (not "at most 0 transfers a second").
fn sustainable(total_s: f64) -> String {
    let per_second = (1.0 / total_s).floor();
    if per_second >= 1.0 {
        format!(
            "at most {per_second:.0} transfer{} a second",
            if per_second == 1.0 { "" } else { "s" }
        )
    } else {
        format!(
            "at most one transfer every {}",
            crate::units::duration(total_s)
        )
    }
}

/// A busy fraction as a percentage for tables and messages: one decimal (`87.5`), or in
/// scientific notation from 10,000 % on (`1.2e8`), so that an impossible rate keeps a table's
/// column width.
pub fn busy_percent(fraction: f64) -> String {
    let pct = fraction * 100.0;
    if pct < 10_000.0 {
        format!("{pct:.1}")
    } else {
        format!("{pct:.1e}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn busy_percent_keeps_a_column_width() {
        assert_eq!(busy_percent(0.875), "87.5");
        assert_eq!(busy_percent(99.9), "9990.0");
        assert_eq!(busy_percent(1_213_941.846), "1.2e8");
    }

    /// A transfer longer than a second at one a second was "at most 0 transfers a second".
    #[test]
    fn a_rate_below_one_a_second_says_how_often() {
        let t = TransferTable::h200();
        let slow = advise(&t, &pattern(16 << 40, 1.0, false));
        let best = slow
            .options
            .iter()
            .find(|o| o.kind == slow.recommended)
            .unwrap();
        assert!(best.total_s > 1.0, "{}", best.total_s);
        assert!(
            slow.reason.ends_with(&format!(
                "the pattern cannot be sustained (at most one transfer every {})",
                crate::units::duration(best.total_s)
            )),
            "{}",
            slow.reason
        );
        assert!(!slow.reason.contains("at most 0"), "{}", slow.reason);
        let fast = advise(&t, &pattern(64 << 20, 1e6, false));
        assert!(
            fast.reason.contains("(at most 822 transfers a second)"),
            "{}",
            fast.reason
        );
    }

    fn pattern(bytes: u64, per_second: f64, asynchronous: bool) -> Pattern {
        Pattern {
            bytes,
            per_second,
            asynchronous,
            direction: Direction::H2d,
            pinned_cap_bytes: 64 << 30,
            horizon_s: 60.0,
        }
    }

    /// `advise --size 1B` once modelled a 1-byte copy at 1 ns (bandwidth alone) against
    /// 4.55 µs for 4 KiB: below the smallest measured size the smallest copy's time is the
    /// floor, so 1 B costs what 4 KiB costs; sizes inside the table are unchanged.
    #[test]
    fn a_tiny_copy_costs_no_less_than_the_smallest_measured() {
        let t = TransferTable::h200();
        let time = |bytes| {
            let a = advise(&t, &pattern(bytes, 0.0, false));
            a.options
                .iter()
                .find(|o| o.kind == MemoryKind::Pageable)
                .map(|o| o.transfer_s)
                .unwrap()
        };
        let smallest = t
            .transfers
            .iter()
            .filter(|p| p.kind == MemoryKind::Pageable && p.direction == Direction::H2d)
            .map(|p| p.bytes)
            .min()
            .unwrap();
        let at_smallest = time(smallest);
        assert!(at_smallest > 1e-6, "{at_smallest}");
        assert_eq!(time(1), at_smallest);
        assert_eq!(time(smallest / 2), at_smallest);
        let g = t
            .gbps(MemoryKind::Pageable, Direction::H2d, 4 * smallest)
            .unwrap();
        assert_eq!(time(4 * smallest), (4 * smallest) as f64 / (g * 1e9));
    }

    #[test]
    fn interpolation_is_exact_at_points_and_log_linear_between() {
        let t = TransferTable::h200();
        assert_eq!(
            t.gbps(MemoryKind::Pinned, Direction::H2d, 1 << 20),
            Some(44.3)
        );
        assert_eq!(t.gbps(MemoryKind::Pinned, Direction::H2d, 1), Some(0.87));
        assert_eq!(
            t.gbps(MemoryKind::Pinned, Direction::H2d, 1 << 40),
            Some(55.5)
        );
        // 2 MiB is a third of the way from 1 MiB to 8 MiB in log2.
        let g = t.gbps(MemoryKind::Pinned, Direction::H2d, 2 << 20).unwrap();
        assert!((g - (44.3 + (53.8 - 44.3) / 3.0)).abs() < 1e-9, "{g}");
        // Mapped D2H falls back to the H2D figure; pageable has its own.
        assert_eq!(
            t.gbps(MemoryKind::Mapped, Direction::D2h, 1 << 30),
            Some(51.3)
        );
        assert_eq!(
            t.gbps(MemoryKind::Pageable, Direction::D2h, 1 << 30),
            Some(14.1)
        );
    }

    #[test]
    fn pinned_over_a_barely_faster_write_combined_says_why() {
        let a = advise(&TransferTable::h200(), &pattern(64 << 20, 100.0, false));
        let total = |k| {
            a.options
                .iter()
                .find(|o| o.kind == k)
                .map(|o| o.total_s)
                .unwrap()
        };
        let (wc, pinned) = (total(MemoryKind::WriteCombined), total(MemoryKind::Pinned));
        assert!(wc < pinned && pinned <= wc * 1.05, "{wc} {pinned}");
        assert_eq!(a.recommended, MemoryKind::Pinned);
        assert!(
            a.reason.contains("write-combined is less than 5 % faster"),
            "{}",
            a.reason
        );
    }

    #[test]
    fn large_repeated_transfers_go_pinned() {
        let a = advise(&TransferTable::h200(), &pattern(256 << 20, 10.0, false));
        assert_eq!(a.recommended, MemoryKind::Pinned);
        let pinned = a
            .options
            .iter()
            .find(|o| o.kind == MemoryKind::Pinned)
            .unwrap();
        // 256 MiB at ≈55.3 GB/s ≈ 4.85 ms.
        assert!((pinned.transfer_s - 268_435_456.0 / 55.35e9).abs() < 1e-4);
        // Cold cost ≈ 168 ms spread over 10/s × 60 s = 600 transfers, plus 0.4 µs warm.
        let want = (131e-3 + 37e-3) / 600.0 + 0.4e-6;
        assert!(
            (pinned.alloc_per_transfer_s - want).abs() < 1e-4,
            "{pinned:?}"
        );
        // Pinning per transfer instead: 131 + 37 ms of allocation each time.
        let unpooled = a.unpooled_pinned_s.unwrap();
        assert!(
            (unpooled - (168e-3 + pinned.transfer_s)).abs() < 1e-3,
            "{unpooled}"
        );
        // Without the pool's reuse (a one-off), staging wins.
        let mut once = pattern(256 << 20, 10.0, false);
        once.horizon_s = 0.1;
        assert_eq!(
            advise(&TransferTable::h200(), &once).recommended,
            MemoryKind::Staged
        );
    }

    #[test]
    fn a_one_off_large_copy_goes_staged() {
        // Pinning 1 GiB once costs 0.5 s: more than staging the copy at 34 GB/s.
        let a = advise(&TransferTable::h200(), &pattern(1 << 30, 0.0, false));
        assert_eq!(a.recommended, MemoryKind::Staged, "{a:#?}");
    }

    #[test]
    fn tiny_copies_stay_pageable_and_async_needs_pinned() {
        let a = advise(&TransferTable::h200(), &pattern(4096, 1000.0, false));
        assert_eq!(a.recommended, MemoryKind::Pageable, "{a:#?}");
        let a = advise(&TransferTable::h200(), &pattern(4096, 1000.0, true));
        assert_ne!(a.recommended, MemoryKind::Pageable);
        assert!(a.options.iter().any(|o| o.kind == MemoryKind::Pageable
            && o.excluded
                .as_deref()
                .unwrap_or("")
                .contains("not asynchronous")));
    }

    #[test]
    fn the_cap_rules_out_pinned() {
        let mut p = pattern(8 << 30, 1.0, false);
        p.pinned_cap_bytes = 4 << 30;
        let a = advise(&TransferTable::h200(), &p);
        assert!(matches!(
            a.recommended,
            MemoryKind::Staged | MemoryKind::Pageable
        ));
        let pinned = a
            .options
            .iter()
            .find(|o| o.kind == MemoryKind::Pinned)
            .unwrap();
        assert!(pinned.excluded.as_deref().unwrap().contains("pinned cap"));
    }

    /// Asynchronous and above the cap: pinned memory in pieces, two under the cap, not a
    /// fall-back to pageable memory, which is not asynchronous (it was recommended).
    #[test]
    fn asynchronous_above_the_cap_goes_in_pinned_pieces() {
        let mut p = pattern(1 << 40, 0.0, true);
        p.pinned_cap_bytes = 10 << 30;
        let a = advise(&TransferTable::h200(), &p);
        assert_eq!(a.recommended, MemoryKind::Pinned);
        assert!(
            a.reason.contains("in 205 pieces of at most 5.00 GiB"),
            "{}",
            a.reason
        );
        // Nothing pinned is possible at all (a cap of 1 byte): pageable, and why.
        p.pinned_cap_bytes = 1;
        let a = advise(&TransferTable::h200(), &p);
        assert_eq!(a.recommended, MemoryKind::Pageable);
        assert!(a.reason.contains("not asynchronous"), "{}", a.reason);
    }

    #[test]
    fn tables_round_trip_through_json() {
        let t = TransferTable::h200();
        let s = serde_json::to_string(&t).unwrap();
        let back: TransferTable = serde_json::from_str(&s).unwrap();
        assert_eq!(back, t);
        assert_eq!(
            MemoryKind::parse("write-combined"),
            Some(MemoryKind::WriteCombined)
        );
        for k in MemoryKind::ALL {
            assert_eq!(MemoryKind::parse(k.name()), Some(k));
        }
    }
}
