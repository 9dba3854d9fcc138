//! `gpumem bench pinned`: allocation costs of pinned host memory (cuMemHostAlloc,
//! cuMemHostRegister, malloc, the pool), or of the mlock fallback without a driver.
use anyhow::{Context, Result};
use clap::Args;
use gpumem::cuda::CudaContext;
use gpumem::pinned::advise::{self, TransferTable};
use gpumem::pinned::{sysinfo, transfer};
use gpumem::units;
use serde_json::json;

use super::now_utc;

/// Arguments of `gpumem bench pinned`.
#[derive(Args)]
pub struct BenchPinnedArgs {
    /// Sizes per allocation, comma-separated, with units.
    #[arg(long, default_value = "1MiB,16MiB,256MiB,1GiB", value_parser = units::parse_size_set, allow_hyphen_values = true)]
    pub sizes: std::vec::Vec<u64>,
    /// Repeats per point (median, at least 1); the pool's warm figure uses at least 1000.
    #[arg(long, default_value_t = 5, allow_hyphen_values = true,
          value_parser = |s: &str| crate::units::whole_number::<usize>(s, 1, "a repeat count"))]
    pub repeats: usize,
    /// CUDA device ordinal (`0`, or `cuda:N`). Without a CUDA driver the mlock fallback is
    /// measured instead, on the host alone.
    #[arg(long, default_value = "0", value_parser = parse_pinned_device)]
    pub device: usize,
    /// Measure the mlock fallback even where CUDA is present.
    #[arg(long)]
    pub no_cuda: bool,
    /// Do not write the figures that `gpumem advise` reads.
    #[arg(long)]
    pub no_cache: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `--device` of `bench pinned`: an ordinal, `cuda` or `cuda:N`.
fn parse_pinned_device(s: &str) -> Result<usize, String> {
    let t = s.trim();
    if t == "cuda" {
        return Ok(0);
    }
    t.strip_prefix("cuda:").unwrap_or(t).parse::<usize>().map_err(|_| {
        "expected a CUDA device ordinal (0, 1, ...) or cuda:N; pinned memory has no simulated mode: without a driver (or with --no-cuda) the mlock fallback is measured".to_string()
    })
}

/// `gpumem bench pinned`.
pub fn bench_pinned(a: BenchPinnedArgs) -> Result<()> {
    if let Some(&max) = a.sizes.last() {
        sysinfo::ensure_host_memory(max, &format!("bench pinned at {}", units::bytes(max)))?;
    }
    let (host, note) = if a.no_cuda {
        (None, "mlock fallback (--no-cuda)".to_string())
    } else {
        match CudaContext::new(a.device) {
            Ok(h) => (Some(h), "CUDA".to_string()),
            // Without a driver the fallback is this command's own answer: the driver error's
            // advice (`--device sim`, for the device commands) does not apply here.
            Err(gpumem::cuda::CudaError::NoDriver { .. }) => (
                None,
                "mlock fallback: no NVIDIA driver (libcuda.so.1) found".to_string(),
            ),
            Err(e) => (None, format!("mlock fallback: {e}")),
        }
    };
    if host.is_none() {
        eprintln!(
            "note: measuring the {note}; cuMemHostAlloc and cuMemHostRegister are not measured"
        );
    }
    let device = host
        .as_ref()
        .and_then(|h| h.name().ok())
        .unwrap_or_else(|| "host (no CUDA)".to_string());
    let pb = crate::progress::bar(a.sizes.len() as u64 + 1);
    let mut points = Vec::new();
    for &s in &a.sizes {
        pb.set_message(units::bytes(s));
        let p = transfer::alloc_costs(host.as_ref(), s as usize, a.repeats)
            .with_context(|| format!("measuring {}", units::bytes(s)))?;
        points.extend(p);
        pb.inc(1);
    }
    pb.set_message("pool overhead");
    let req = transfer::OVERHEAD_REQUESTS;
    let overhead = transfer::pool_overhead(host.as_ref(), &req);
    pb.finish_and_clear();
    let overhead_json = match &overhead {
        Ok(s) => json!({
            "requests_bytes": req,
            "requested_bytes": s.requested_bytes.current,
            "pinned_bytes": s.pinned_bytes.current,
            "pinned_over_requested": s.pinned_over_requested(),
            "per_request": req.iter().map(|&r| {
                let c = gpumem::pinned::size_class::class_bytes(r).unwrap_or(0);
                json!({"requested": r, "pinned": c, "ratio": c as f64 / r as f64})
            }).collect::<Vec<_>>(),
        }),
        Err(e) => json!({"error": e.to_string()}),
    };
    let cached = if a.no_cache || host.is_none() {
        None
    } else {
        advise::store_table(TransferTable {
            source: format!("measured by gpumem bench pinned, {}", now_utc()),
            device: device.clone(),
            transfers: Vec::new(),
            alloc: points.clone(),
        })
        .ok()
    };
    if a.json {
        let out = json!({
            "device": device,
            "backend": note,
            "memlock_limit": gpumem::pinned::memlock_limit().map(|l| l.to_string()).unwrap_or_default(),
            "pool_cap_bytes": sysinfo::default_pinned_cap_bytes(),
            "alloc": points,
            "pool_overhead": overhead_json,
            "pinned_over_requested": overhead.as_ref().ok().map(|s| s.pinned_over_requested()),
            "cache": cached,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{device}: {note}; medians of {} (pool_warm: ≥ 1000)",
            crate::units::counted(a.repeats as u64, "repeat")
        );
        println!(
            "{:<18} {:>10} {:>14} {:>14}",
            "method", "size", "alloc", "free"
        );
        for p in &points {
            println!(
                "{:<18} {:>10} {:>14} {:>14}",
                p.method,
                units::bytes(p.bytes),
                units::duration(p.alloc_s),
                units::duration(p.free_s)
            );
        }
        match &overhead {
            Ok(s) => println!(
                "pool on 1 MiB, 3 MiB, 5 MiB, 100 MiB, 300 MiB, 1 GiB + 1 B: pinned {} for {} requested, pinned_over_requested = {:.4}",
                units::bytes(s.pinned_bytes.current),
                units::bytes(s.requested_bytes.current),
                s.pinned_over_requested()
            ),
            Err(e) => println!("pool overhead not measured: {e}"),
        }
    }
    Ok(())
}
