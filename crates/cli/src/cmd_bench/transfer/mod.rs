//! `gpumem bench transfer`: host<->device bandwidth of pageable, pinned, write-combined,
//! mapped and staged memory on one device (the sweep is `gpumem::pinned::transfer::sweep`),
//! or on every device and between each pair (`--device all`, in `all.rs`); `--host-only`
//! measures the staging ring's host side alone.
use anyhow::{bail, Context, Result};
use clap::Args;
use gpumem::cuda::CudaContext;
use gpumem::pinned::advise::{self, Direction, MemoryKind};
use gpumem::pinned::transfer::{self, MappedMethod, StagingRate, SweepConfig, TransferBench};
use gpumem::pinned::{sysinfo, CopyKind, StagingConfig};
use gpumem::units;
use serde_json::json;
use std::path::PathBuf;

use super::now_utc;

mod all;

/// `--stage-chunk`: a size above zero.
fn parse_chunk(s: &str) -> Result<u64, String> {
    match crate::units::parse_positive_size(s)? {
        0 => Err(format!(
            "`{s}`: a staging chunk holds at least 1 B (e.g. 16MiB)"
        )),
        n => Ok(n),
    }
}

/// `--stage-buffers`: at least one.
fn parse_buffer_count(s: &str) -> Result<usize, String> {
    match crate::units::whole_number::<usize>(s, 0, "a buffer count")? {
        0 => Err(format!("`{s}`: the staging ring needs at least 1 buffer")),
        n => Ok(n),
    }
}

fn parse_thread_count(s: &str) -> Result<usize, String> {
    match crate::units::whole_number::<usize>(s, 0, "a thread count")? {
        0 => Err(format!("`{s}`: a thread count is at least 1")),
        n => Ok(n),
    }
}

fn parse_kinds(s: &str) -> Result<Vec<MemoryKind>, String> {
    s.split(',')
        .map(|t| {
            MemoryKind::parse(t).ok_or_else(|| {
                format!("`{t}`: expected pageable, pinned, write_combined, mapped or staged")
            })
        })
        .collect()
}

pub(crate) fn parse_dirs(s: &str) -> Result<Vec<Direction>, String> {
    s.split(',')
        .map(|t| match t.trim().to_ascii_lowercase().as_str() {
            "h2d" => Ok(Direction::H2d),
            "d2h" => Ok(Direction::D2h),
            "both" | "bidir" => Ok(Direction::Both),
            o => Err(format!("`{o}`: expected h2d, d2h or both")),
        })
        .collect()
}

fn parse_copy(s: &str) -> Result<CopyKind, String> {
    match s {
        "libc" | "memcpy" => Ok(CopyKind::Libc),
        "nt" | "non-temporal" => Ok(CopyKind::NonTemporal),
        o => Err(format!("`{o}`: expected libc or nt")),
    }
}

/// Arguments of `gpumem bench transfer`.
#[derive(Args)]
pub struct BenchTransferArgs {
    /// Sizes per copy, comma-separated, with units.
    #[arg(long, default_value = "4KiB,16KiB,64KiB,256KiB,1MiB,4MiB,8MiB,16MiB,64MiB,256MiB,1GiB", value_parser = units::parse_size_set, allow_hyphen_values = true)]
    pub sizes: std::vec::Vec<u64>,
    /// Host memory kinds: pageable, pinned, write_combined, mapped, staged.
    #[arg(long, default_value = "pageable,pinned,write_combined,mapped,staged", value_parser = parse_kinds, conflicts_with = "host_only")]
    pub kinds: std::vec::Vec<MemoryKind>,
    /// Directions: h2d, d2h, both (two streams at once).
    #[arg(long, default_value = "h2d,d2h,both", value_parser = parse_dirs, conflicts_with = "host_only")]
    pub directions: std::vec::Vec<Direction>,
    /// Timed repeats per point (median, at least 1); sizes ≥ 256 MiB use at most 5.
    #[arg(long, default_value_t = 11, allow_hyphen_values = true,
          value_parser = |s: &str| crate::units::whole_number::<usize>(s, 1, "a repeat count"))]
    pub repeats: usize,
    /// CUDA device: an ordinal (`0`), `cuda:N`, or `all` (every device: host<->device
    /// bandwidth of each, then peer copies between each pair; see `gpumem bench transfer
    /// --device all --help`).
    #[arg(long, default_value = "0", value_parser = parse_transfer_device)]
    pub device: TransferDevice,
    /// Staging ring: bytes per chunk.
    #[arg(long, default_value = "16MiB", value_parser = parse_chunk, allow_hyphen_values = true)]
    pub stage_chunk: u64,
    /// Staging ring: pinned buffers.
    #[arg(long, default_value = "4", value_parser = parse_buffer_count, allow_hyphen_values = true)]
    pub stage_buffers: usize,
    /// Staging ring: host threads copying each chunk (the caller included); default two
    /// below the CPU count, at most 12.
    #[arg(long, value_parser = parse_thread_count, allow_hyphen_values = true)]
    pub stage_threads: Option<usize>,
    /// Staging ring: `nt` (non-temporal stores) or `libc` (memcpy).
    #[arg(long, default_value = "nt", value_parser = parse_copy)]
    pub stage_copy: CopyKind,
    /// First sweep the staging ring's settings at the largest size (threads × chunk × buffers
    /// × copy), then measure with the fastest.
    #[arg(long)]
    pub staging_sweep: bool,
    /// Also measure how much of an H2D copy hides behind device-to-device copies on another
    /// stream, pageable vs pinned.
    #[arg(long, conflicts_with = "host_only")]
    pub overlap: bool,
    /// Draw bandwidth against size (log x axis) into this SVG file.
    #[arg(long, conflicts_with = "host_only")]
    pub plot: Option<PathBuf>,
    /// Do not write the table that `gpumem advise` reads.
    #[arg(long)]
    pub no_cache: bool,
    /// Measure only the host side of staged copies (no GPU needed): fill and drain rates of
    /// the staging ring at the largest of --sizes (median of at most 5 repeats), with
    /// `--staging-sweep` over its settings. It measures neither --kinds nor --directions.
    #[arg(long)]
    pub host_only: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Which device(s) `bench transfer` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferDevice {
    /// One CUDA device.
    One(usize),
    /// Every visible device, then each pair.
    All,
}

/// Parses `0`, `cuda`, `cuda:N` or `all`.
pub fn parse_transfer_device(s: &str) -> Result<TransferDevice, String> {
    let t = s.trim();
    if t == "all" {
        return Ok(TransferDevice::All);
    }
    if t == "cuda" {
        return Ok(TransferDevice::One(0));
    }
    t.strip_prefix("cuda:")
        .unwrap_or(t)
        .parse::<usize>()
        .map(TransferDevice::One)
        .map_err(|_| format!("`{s}`: expected a device ordinal (0), cuda:N or all"))
}

/// The staging ring's setting of `--stage-*`.
fn staging_config(a: &BenchTransferArgs) -> StagingConfig {
    StagingConfig {
        chunk_bytes: a.stage_chunk as usize,
        buffers: a.stage_buffers,
        threads: a
            .stage_threads
            .unwrap_or_else(transfer::default_copy_threads),
        copy: a.stage_copy,
    }
}

/// A progress bar per phase of a sweep.
#[derive(Default)]
struct Bars(Option<indicatif::ProgressBar>);

impl transfer::SweepProgress for Bars {
    fn phase(&mut self, points: u64, message: &str) {
        let pb = crate::progress::bar(points);
        if !message.is_empty() {
            pb.set_message(message.to_string());
        }
        self.0 = Some(pb);
    }
    fn point(&mut self, label: &str) {
        if let Some(pb) = &self.0 {
            pb.set_message(label.to_string());
        }
    }
    fn advance(&mut self) {
        if let Some(pb) = &self.0 {
            pb.inc(1);
        }
    }
    fn finish(&mut self) {
        if let Some(pb) = self.0.take() {
            pb.finish_and_clear();
        }
    }
}

/// `bench transfer --host-only`: the host side of staged copies (fill and drain of the ring
/// with no DMA), over the sweep grid, for the largest size. Needs no GPU.
fn host_only(a: &BenchTransferArgs) -> Result<()> {
    let max = *a.sizes.last().context("no sizes")? as usize;
    // A source and a destination of the largest size, and the ring.
    let ring = a.stage_chunk.saturating_mul(a.stage_buffers as u64);
    sysinfo::ensure_host_memory(
        (max as u64).saturating_mul(2).saturating_add(ring),
        &format!("bench transfer --host-only at {}", units::bytes(max as u64)),
    )?;
    let grid = if a.staging_sweep {
        transfer::sweep_grid()
    } else {
        vec![staging_config(a)]
    };
    let rows = transfer::host_side(max, grid, a.repeats, &mut Bars::default())?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "host_only": true,
                "bytes": max,
                "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
                "note": "host side of the staging ring alone (no DMA): fill = pageable -> pinned, drain = pinned -> pageable",
                "staging_sweep": rows,
            }))?
        );
    } else {
        println!(
            "host side of staged copies of {} (no DMA), GB/s:",
            units::bytes(max as u64)
        );
        for s in &rows {
            println!("{}", sweep_line(s, "fill", "drain", ""));
        }
    }
    Ok(())
}

/// `gpumem bench transfer`.
pub fn bench_transfer(a: BenchTransferArgs) -> Result<()> {
    if let Some(path) = &a.plot {
        crate::output::check("--plot", path, &[])?;
        crate::output::check_svg("--plot", path)?;
    }
    if a.host_only {
        return host_only(&a);
    }
    match gpumem::cuda::init() {
        Ok(_) => {}
        // Not the driver error's "--device sim": this command has no simulated device.
        Err(gpumem::cuda::CudaError::NoDriver { .. }) => bail!(
            "no NVIDIA driver (libcuda.so.1) found: `gpumem bench transfer` measures copies over PCIe and needs a CUDA device (--host-only measures the staging ring's host side without one; `gpumem bench pinned` the mlock fallback)"
        ),
        Err(e) => bail!("{e}: `gpumem bench transfer` measures copies over PCIe and needs a CUDA device"),
    }
    let ordinal = match a.device {
        TransferDevice::One(n) => n,
        TransferDevice::All => return all::bench_transfer_all(&a),
    };
    let host = CudaContext::new(ordinal)?;
    let device = host.name().unwrap_or_else(|_| "unknown".into());
    let bus = host.pci_bus_id().unwrap_or_default();
    let max = *a.sizes.last().context("no sizes")? as usize;
    sysinfo::ensure_host_memory(
        (max as u64).saturating_mul(2),
        &format!("bench transfer at {}", units::bytes(max as u64)),
    )?;
    let config = SweepConfig {
        sizes: a.sizes.clone(),
        kinds: a.kinds.clone(),
        directions: a.directions.clone(),
        repeats: a.repeats,
        staging: staging_config(&a),
        staging_sweep: a.staging_sweep,
        overlap: a.overlap,
    };
    let mut bench = TransferBench::new(&host, max, &a.kinds, config.staging)
        .context("allocating the benchmark's buffers")?;
    let report = transfer::sweep(&mut bench, &config, &mut Bars::default())?;
    let summary = report.summary();
    let mapped_method = match &report.mapped_method {
        MappedMethod::Kernel => "kernel (copy16 PTX reads mapped host memory)".to_string(),
        MappedMethod::DtoD(e) => format!(
            "cuMemcpyDtoD from the mapped device pointer (kernel not loaded: {e}); the copy engine reads host memory like a pinned copy"
        ),
    };
    let table = report.table(
        format!("measured by gpumem bench transfer, {}", now_utc()),
        device.clone(),
    );
    let cached = if a.no_cache {
        None
    } else {
        match advise::store_table(table) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("warning: could not cache the table for `gpumem advise`: {e:#}");
                None
            }
        }
    };
    if let Some(path) = &a.plot {
        crate::output::write_text(
            path,
            &transfer::bandwidth_chart(&report.plot_series(), &device).to_svg(),
        )?;
    }
    for w in &report.numa_warnings {
        eprintln!("warning: {w}");
    }
    let verify = &report.verify;
    if a.json {
        let out = json!({
            "device": device,
            "pci_bus_id": bus,
            "numa": {
                "gpu_node": report.gpu_node,
                "host_nodes": report.host_nodes.iter().map(|(k, n)| json!({"kind": k, "node": n})).collect::<Vec<_>>(),
                "warnings": report.numa_warnings,
            },
            "mapped_method": mapped_method,
            "staging": report.staging,
            "staging_sweep": report.staging_sweep,
            "results": report.rows,
            "summary": summary,
            "overlap": report.overlap,
            "verify": verify.iter().map(|(w, ok)| json!({"check": w, "ok": ok})).collect::<Vec<_>>(),
            "cache": cached,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&report, &device, &bus, &mapped_method, &summary);
        if let Some(p) = cached {
            println!("table cached for `gpumem advise` in {}", p.display());
        }
    }
    if verify.iter().any(|(_, ok)| !ok) {
        bail!("a data check failed: {verify:?}");
    }
    Ok(())
}

/// The text output of one device's sweep (all but the cache line).
fn print_table(
    report: &transfer::SweepReport,
    device: &str,
    bus: &str,
    mapped_method: &str,
    summary: &serde_json::Value,
) {
    let staging = report.staging;
    println!("{device} ({bus}); GB/s = 1e9 B/s, median of CUDA-event-timed copies");
    println!("mapped: {mapped_method}");
    println!(
        "staging: {} chunks × {}, {} threads, copy {}",
        units::bytes(staging.chunk_bytes as u64),
        staging.buffers,
        staging.threads,
        staging.copy
    );
    println!(
        "{:<15} {:<5} {:>10} {:>10} {:>9}",
        "kind", "dir", "size", "GB/s", "% pinned"
    );
    for r in &report.rows {
        println!(
            "{:<15} {:<5} {:>10} {:>10.2} {:>9}",
            r.kind.name(),
            r.direction.name(),
            units::bytes(r.bytes),
            r.gbps,
            r.pct_of_best_pinned
                .map_or("-".to_string(), |p| format!("{p:.1}"))
        );
    }
    println!("summary: {summary}");
    for s in &report.staging_sweep {
        println!("sweep: {}", sweep_line(s, "h2d", "d2h", " GB/s"));
    }
    for o in &report.overlap {
        println!(
            "overlap {}: copy {:.3} ms, device work {:.3} ms, both {:.3} ms: {:.0} % of the copy hidden",
            o.kind.name(),
            o.copy_s * 1e3,
            o.device_s * 1e3,
            o.both_s * 1e3,
            o.hidden_fraction * 100.0
        );
    }
    for (w, ok) in &report.verify {
        println!("check {w}: {}", if *ok { "ok" } else { "FAILED" });
    }
}

/// One staging configuration and its two rates, as the sweep tables print it.
fn sweep_line(s: &StagingRate, a: &str, b: &str, unit: &str) -> String {
    format!(
        "threads {:>2} chunk {:>9} buffers {} copy {}: {a} {:.2} {b} {:.2}{unit}",
        s.config.threads,
        units::bytes(s.config.chunk_bytes as u64),
        s.config.buffers,
        s.config.copy,
        s.h2d_gbps,
        s.d2h_gbps
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse() {
        assert_eq!(
            units::parse_size_set("1MiB,4KiB,1MiB").unwrap(),
            vec![4096, 1 << 20]
        );
        assert!(units::parse_size_set("0").is_err());
        assert!(units::parse_size_set("").is_err());
        assert_eq!(
            parse_kinds("pinned,wc").unwrap(),
            vec![MemoryKind::Pinned, MemoryKind::WriteCombined]
        );
        assert!(parse_dirs("sideways").is_err());
    }

    #[test]
    fn device_argument_parses() {
        assert_eq!(parse_transfer_device("0"), Ok(TransferDevice::One(0)));
        assert_eq!(parse_transfer_device("cuda:1"), Ok(TransferDevice::One(1)));
        assert_eq!(parse_transfer_device("cuda"), Ok(TransferDevice::One(0)));
        assert_eq!(parse_transfer_device("all"), Ok(TransferDevice::All));
        assert!(parse_transfer_device("gpu1").is_err());
    }
}
