//! The sweep behind `gpumem bench transfer`: the staging ring's settings (optional), then
//! every kind × direction × size on one device, the overlap of copies with device work
//! (optional), a data check and the NUMA placement; and the host side of the staging ring
//! alone (`--host-only`). The caller opens the device, allocates the [`TransferBench`] and
//! prints.

use serde::Serialize;
use serde_json::{json, Value};

use super::{sweep_grid, MappedMethod, Overlap, TransferBench};
use crate::measure::median;
use crate::pinned::advise::{Direction, MemoryKind, TransferPoint, TransferTable};
use crate::pinned::{NullDma, Result, StagingConfig, StagingRing};

/// Progress of a sweep, for a progress bar; every method does nothing by default.
pub trait SweepProgress {
    /// A phase of `points` measurements starts (`message`: its name, or empty).
    fn phase(&mut self, _points: u64, _message: &str) {}
    /// The next measurement, named `label`, starts.
    fn point(&mut self, _label: &str) {}
    /// A measurement is done.
    fn advance(&mut self) {}
    /// The phase is over.
    fn finish(&mut self) {}
}

/// A [`SweepProgress`] that shows nothing.
impl SweepProgress for () {}

/// What to measure in [`sweep`].
#[derive(Debug, Clone, PartialEq)]
pub struct SweepConfig {
    /// Bytes per copy, ascending (the last is the largest, which the staging sweep, the
    /// overlap and the summary use).
    pub sizes: Vec<u64>,
    /// Host memory kinds.
    pub kinds: Vec<MemoryKind>,
    /// Directions.
    pub directions: Vec<Direction>,
    /// Timed repeats per point (median); sizes ≥ 256 MiB use at most 5.
    pub repeats: usize,
    /// The staging ring's setting `bench` was made with.
    pub staging: StagingConfig,
    /// First try every staging setting of [`sweep_grid`] at the largest size and keep the
    /// fastest (when `kinds` has [`MemoryKind::Staged`]).
    pub staging_sweep: bool,
    /// Also measure how much of a copy hides behind device work (pageable and pinned).
    pub overlap: bool,
}

/// One measured point of the main table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TransferRow {
    /// Host memory kind.
    pub kind: MemoryKind,
    /// Direction.
    pub direction: Direction,
    /// Bytes per copy.
    pub bytes: u64,
    /// Median seconds of one copy.
    pub median_s: f64,
    /// Decimal GB/s of the bytes moved (twice `bytes` for both directions).
    pub gbps: f64,
    /// Percent of the best pinned rate in the same direction (any size).
    pub pct_of_best_pinned: Option<f64>,
}

/// One staging setting and its two rates, in decimal GB/s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StagingRate {
    /// The setting, as the ring ran it.
    pub config: StagingConfig,
    /// Host to device (or, host side alone: fill, pageable to pinned).
    pub h2d_gbps: f64,
    /// Device to host (or, host side alone: drain, pinned to pageable).
    pub d2h_gbps: f64,
}

/// Everything [`sweep`] measured.
#[derive(Debug, Clone)]
pub struct SweepReport {
    /// The largest size, in bytes.
    pub largest_bytes: u64,
    /// How mapped memory was read.
    pub mapped_method: MappedMethod,
    /// The staging setting the table was measured with.
    pub staging: StagingConfig,
    /// The staging sweep (empty unless asked for).
    pub staging_sweep: Vec<StagingRate>,
    /// The main table, kind by kind, direction by direction, size by size.
    pub rows: Vec<TransferRow>,
    /// The overlap measurements (empty unless asked for).
    pub overlap: Vec<Overlap>,
    /// Data checks: name and whether the bytes came back right.
    pub verify: Vec<(&'static str, bool)>,
    /// NUMA node of the GPU, where the system tells.
    pub gpu_node: Option<i32>,
    /// NUMA node of each kind's host buffers, where the system tells.
    pub host_nodes: Vec<(MemoryKind, Option<i32>)>,
    /// Host buffers on another NUMA node than the GPU, with the `numactl` advice.
    pub numa_warnings: Vec<String>,
}

/// Measures `config` on `bench` (allocated for the largest size and the kinds asked for).
///
/// # Errors
/// Driver errors of the copies, the staging ring or the checks.
pub fn sweep(
    bench: &mut TransferBench,
    config: &SweepConfig,
    progress: &mut dyn SweepProgress,
) -> Result<SweepReport> {
    let max = config.sizes.last().copied().unwrap_or(0) as usize;
    let (staging_sweep, staging) =
        if config.staging_sweep && config.kinds.contains(&MemoryKind::Staged) {
            sweep_staging(bench, config.staging, max, progress)?
        } else {
            (Vec::new(), config.staging)
        };
    let rows = measure_rows(bench, config, progress)?;
    let overlap = if config.overlap {
        let mut v = Vec::new();
        for kind in [MemoryKind::Pageable, MemoryKind::Pinned] {
            if config.kinds.contains(&kind) {
                v.push(bench.overlap(kind, max, 5)?);
            }
        }
        v
    } else {
        Vec::new()
    };
    let verify = bench.verify(max.min(64 << 20))?;
    let (gpu_node, host_nodes) = bench.numa();
    let numa_warnings = numa_warnings(gpu_node, &host_nodes);
    Ok(SweepReport {
        largest_bytes: max as u64,
        mapped_method: bench.mapped_method().clone(),
        // As measured: the ring starts at most one thread per CPU.
        staging: bench.staging_config().unwrap_or(staging),
        staging_sweep,
        rows,
        overlap,
        verify,
        gpu_node,
        host_nodes,
        numa_warnings,
    })
}

/// Every staging setting of [`sweep_grid`] at `max` bytes; leaves the fastest (host to
/// device) set on `bench` and returns it (`staging` if none was measured).
fn sweep_staging(
    bench: &mut TransferBench,
    mut staging: StagingConfig,
    max: usize,
    progress: &mut dyn SweepProgress,
) -> Result<(Vec<StagingRate>, StagingConfig)> {
    let grid = sweep_grid();
    let mut sweep = Vec::new();
    progress.phase(grid.len() as u64, "staging sweep");
    for c in grid {
        bench.set_staging(c)?;
        let h = bench.measure(MemoryKind::Staged, Direction::H2d, max, 3)?;
        let d = bench.measure(MemoryKind::Staged, Direction::D2h, max, 3)?;
        let gb = |s: Option<f64>| s.map_or(0.0, |s| max as f64 / s / 1e9);
        sweep.push(StagingRate {
            config: bench.staging_config().unwrap_or(c),
            h2d_gbps: gb(h),
            d2h_gbps: gb(d),
        });
        progress.advance();
    }
    progress.finish();
    if let Some(best) = sweep
        .iter()
        .max_by(|x, y| x.h2d_gbps.total_cmp(&y.h2d_gbps))
    {
        staging = best.config;
    }
    bench.set_staging(staging)?;
    Ok((sweep, staging))
}

/// The main table, with each row's share of the best pinned rate in its direction.
fn measure_rows(
    bench: &mut TransferBench,
    config: &SweepConfig,
    progress: &mut dyn SweepProgress,
) -> Result<Vec<TransferRow>> {
    let mut points: Vec<(MemoryKind, Direction, u64)> = Vec::new();
    for &k in &config.kinds {
        for &d in &config.directions {
            for &s in &config.sizes {
                points.push((k, d, s));
            }
        }
    }
    progress.phase(points.len() as u64, "");
    let mut rows = Vec::new();
    for (kind, dir, bytes) in points {
        progress.point(&format!(
            "{} {} {}",
            kind.name(),
            dir.name(),
            crate::units::bytes(bytes)
        ));
        if let Some((s, gbps)) = bench.measure_rate(kind, dir, bytes, config.repeats)? {
            rows.push(TransferRow {
                kind,
                direction: dir,
                bytes,
                median_s: s,
                gbps,
                pct_of_best_pinned: None,
            });
        }
        progress.advance();
    }
    progress.finish();
    for d in [Direction::H2d, Direction::D2h, Direction::Both] {
        let best = rows
            .iter()
            .filter(|r| r.kind == MemoryKind::Pinned && r.direction == d)
            .map(|r| r.gbps)
            .fold(0.0, f64::max);
        if best > 0.0 {
            for r in rows.iter_mut().filter(|r| r.direction == d) {
                r.pct_of_best_pinned = Some(100.0 * r.gbps / best);
            }
        }
    }
    Ok(rows)
}

/// A warning for each kind whose host buffers are on another NUMA node than the GPU.
fn numa_warnings(gpu_node: Option<i32>, host_nodes: &[(MemoryKind, Option<i32>)]) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(g) = gpu_node {
        for (k, n) in host_nodes {
            if let Some(n) = n {
                if *n != g {
                    warnings.push(format!(
                        "{} buffers are on NUMA node {n} but the GPU is on node {g}: bind with `numactl --cpunodebind={g} --membind={g}`",
                        k.name()
                    ));
                }
            }
        }
    }
    warnings
}

impl SweepReport {
    /// The rate of `kind` in direction `d` at `bytes`, if measured.
    fn rate(&self, k: MemoryKind, d: Direction, b: u64) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.kind == k && r.direction == d && r.bytes == b)
            .map(|r| r.gbps)
    }

    /// The lowest pinned rate in direction `d` at 8 MiB or more.
    fn min_pinned_ge8(&self, d: Direction) -> Option<f64> {
        self.rows
            .iter()
            .filter(|r| r.kind == MemoryKind::Pinned && r.direction == d && r.bytes >= 8 << 20)
            .map(|r| r.gbps)
            .reduce(f64::min)
    }

    /// The headline figures at the largest size, and the targets this run can judge alone
    /// (staged host to device at 45 GB/s or more, and at 5 × pageable or more); pinned at
    /// 98 % of cudaMemcpyAsync needs a figure from outside the run.
    pub fn summary(&self) -> Value {
        let max = self.largest_bytes;
        let staged_h2d = self.rate(MemoryKind::Staged, Direction::H2d, max);
        let pageable_h2d = self.rate(MemoryKind::Pageable, Direction::H2d, max);
        json!({
            "largest_bytes": max,
            "pinned_h2d_min_gbps_ge_8MiB": self.min_pinned_ge8(Direction::H2d),
            "pinned_d2h_min_gbps_ge_8MiB": self.min_pinned_ge8(Direction::D2h),
            "staged_h2d_gbps_largest": staged_h2d,
            "staged_d2h_gbps_largest": self.rate(MemoryKind::Staged, Direction::D2h, max),
            "pageable_h2d_gbps_largest": pageable_h2d,
            "pageable_d2h_gbps_largest": self.rate(MemoryKind::Pageable, Direction::D2h, max),
            "staged_over_pageable_h2d": staged_h2d.zip(pageable_h2d).map(|(s, p)| s / p),
            "target_staged_h2d_ge_45_gbps": staged_h2d.map(|s| s >= 45.0),
            "target_staged_ge_5x_pageable": staged_h2d.zip(pageable_h2d).map(|(s, p)| s >= 5.0 * p),
        })
    }

    /// The table `gpumem advise` reads: the measured bandwidths of `device`, from `source`.
    pub fn table(&self, source: String, device: String) -> TransferTable {
        TransferTable {
            source,
            device,
            transfers: self
                .rows
                .iter()
                .map(|r| TransferPoint {
                    kind: r.kind,
                    direction: r.direction,
                    bytes: r.bytes,
                    gbps: r.gbps,
                })
                .collect(),
            alloc: Vec::new(),
        }
    }

    /// The rows as one series per kind and direction, for [`super::bandwidth_chart`].
    pub fn plot_series(&self) -> Vec<(String, Vec<(u64, f64)>)> {
        let mut series: Vec<(String, Vec<(u64, f64)>)> = Vec::new();
        for r in &self.rows {
            let name = format!("{} {}", r.kind.name(), r.direction.name());
            match series.iter_mut().find(|s| s.0 == name) {
                Some(s) => s.1.push((r.bytes, r.gbps)),
                None => series.push((name, vec![(r.bytes, r.gbps)])),
            }
        }
        series
    }
}

/// The host side of staged copies alone (`bench transfer --host-only`): fill (pageable to
/// pinned) and drain (pinned to pageable) rates of a ring with no DMA, for each setting of
/// `grid`, at `bytes`, median of `repeats` (at most 5) after one warm-up. Needs no GPU.
///
/// # Errors
/// [`crate::pinned::PinnedError`] when the ring's memory cannot be locked.
pub fn host_side(
    bytes: usize,
    grid: Vec<StagingConfig>,
    repeats: usize,
    progress: &mut dyn SweepProgress,
) -> Result<Vec<StagingRate>> {
    let src = vec![0x5au8; bytes];
    let mut dst = vec![0u8; bytes];
    progress.phase(grid.len() as u64, "");
    let mut rows = Vec::new();
    for c in grid {
        let mut ring = StagingRing::new_locked(c)?;
        let mut fill = Vec::new();
        let mut drain = Vec::new();
        for r in 0..=repeats.clamp(1, 5) {
            let t0 = std::time::Instant::now();
            ring.stage_h2d(&src, &mut NullDma)?;
            let t1 = t0.elapsed().as_secs_f64();
            let t0 = std::time::Instant::now();
            ring.stage_d2h(&mut dst, &mut NullDma)?;
            let t2 = t0.elapsed().as_secs_f64();
            if r > 0 {
                fill.push(t1);
                drain.push(t2);
            }
        }
        rows.push(StagingRate {
            // As measured: the ring starts at most one thread per CPU.
            config: ring.config(),
            h2d_gbps: bytes as f64 / median(&mut fill) / 1e9,
            d2h_gbps: bytes as f64 / median(&mut drain) / 1e9,
        });
        progress.advance();
    }
    progress.finish();
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pinned::CopyKind;

    #[test]
    fn host_side_measures_each_setting() {
        let c = StagingConfig {
            chunk_bytes: 64 << 10,
            buffers: 2,
            threads: 1,
            copy: CopyKind::Libc,
        };
        match host_side(256 << 10, vec![c], 1, &mut ()) {
            Ok(rows) => {
                assert_eq!(rows.len(), 1);
                assert!(rows[0].h2d_gbps > 0.0 && rows[0].d2h_gbps > 0.0);
            }
            // A tight RLIMIT_MEMLOCK: the ring cannot lock its buffers.
            Err(e) => eprintln!("skipped: {e}"),
        }
    }

    #[test]
    fn numa_warnings_name_the_other_node() {
        let w = numa_warnings(
            Some(0),
            &[
                (MemoryKind::Pinned, Some(1)),
                (MemoryKind::Pageable, Some(0)),
            ],
        );
        assert_eq!(w.len(), 1);
        assert!(w[0].starts_with("pinned buffers are on NUMA node 1"));
    }
}
