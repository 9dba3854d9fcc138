//! `gpumem bench transfer --device all`: host<->device bandwidth of every device, then peer
//! copies between each pair (the library side is `gpumem::cuda::peer_bench`).
use anyhow::{bail, Context, Result};
use gpumem::cuda::peer_bench::{self, PeerBenchConfig, PeerReport};
use gpumem::cuda::CudaContext;
use gpumem::pinned::advise::{Direction, MemoryKind};
use gpumem::pinned::transfer::TransferBench;
use gpumem::units;
use serde::Serialize;
use serde_json::json;

use super::BenchTransferArgs;

/// Bytes of each byte-for-byte peer-copy check.
const CHECK_BYTES: u64 = 64 << 20;

#[derive(Serialize)]
struct HostRow {
    kind: MemoryKind,
    direction: Direction,
    bytes: u64,
    median_s: f64,
    gbps: f64,
}

#[derive(Serialize)]
struct DeviceRows {
    ordinal: usize,
    name: String,
    pci_bus_id: String,
    results: Vec<HostRow>,
}

fn host_device(a: &BenchTransferArgs, ordinal: usize) -> Result<DeviceRows> {
    let host = CudaContext::new(ordinal)?;
    let name = host.name().unwrap_or_else(|_| "unknown".into());
    let pci_bus_id = host.pci_bus_id().unwrap_or_default();
    let wanted = [MemoryKind::Pageable, MemoryKind::Pinned, MemoryKind::Staged];
    let mut kinds: Vec<MemoryKind> = a
        .kinds
        .iter()
        .copied()
        .filter(|k| wanted.contains(k))
        .collect();
    if kinds.is_empty() {
        kinds = wanted.to_vec();
    }
    let max = *a.sizes.iter().max().context("no sizes")? as usize;
    gpumem::pinned::sysinfo::ensure_host_memory(
        (max as u64).saturating_mul(2),
        &format!(
            "bench transfer on cuda:{ordinal} at {}",
            units::bytes(max as u64)
        ),
    )?;
    let staging = super::staging_config(a);
    let mut bench = TransferBench::new(&host, max, &kinds, staging)
        .with_context(|| format!("allocating the benchmark's buffers on cuda:{ordinal}"))?;
    let points = kinds.len() * a.directions.len() * a.sizes.len();
    let pb = crate::progress::bar(points as u64);
    let mut results = Vec::new();
    for &kind in &kinds {
        for &dir in &a.directions {
            for &bytes in &a.sizes {
                pb.set_message(format!(
                    "cuda:{ordinal} {} {} {}",
                    kind.name(),
                    dir.name(),
                    units::bytes(bytes)
                ));
                if let Some((s, gbps)) = bench.measure_rate(kind, dir, bytes, a.repeats)? {
                    results.push(HostRow {
                        kind,
                        direction: dir,
                        bytes,
                        median_s: s,
                        gbps,
                    });
                }
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    Ok(DeviceRows {
        ordinal,
        name,
        pci_bus_id,
        results,
    })
}

fn pct(p: Option<f64>) -> String {
    p.map_or_else(|| "-".to_string(), |p| format!("{p:.0} %"))
}

fn print_peer(r: &PeerReport) {
    let [a, b] = r.devices;
    println!();
    println!(
        "peer copies cuda:{a} <-> cuda:{b} ({} / {}); peer access {}",
        r.names[0],
        r.names[1],
        if r.peer_access {
            "on both ways"
        } else {
            "not available (copies may be staged by the driver; no kernel path)"
        }
    );
    if let Some(p) = r.attributes[0] {
        println!(
            "driver: performance rank {}, access {}, native atomics {} (cuDeviceGetP2PAttribute)",
            p.performance_rank, p.access_supported, p.native_atomics
        );
    }
    match r.link.gbps_per_direction {
        Some(g) => println!(
            "link: {} {g:.1} GB/s per direction ({})",
            r.link.kind, r.link.source
        ),
        None => println!("link: unknown ({}); no % of link", r.link.source),
    }
    println!("GB/s = 1e9 B/s of payload, host-timed batches (median); baseline = plain cuMemcpyPeerAsync loop between cuMemAlloc buffers");
    println!(
        "{:<20} {:<11} {:<6} {:>10} {:>9} {:>11} {:>9}",
        "method", "memory", "dir", "size", "GB/s", "% baseline", "% link"
    );
    for row in &r.rows {
        println!(
            "{:<20} {:<11} {:<6} {:>10} {:>9.1} {:>11} {:>9}",
            row.method.name(),
            row.memory,
            row.direction,
            units::bytes(row.bytes),
            row.gbps,
            pct(row.pct_of_baseline),
            pct(row.pct_of_link)
        );
    }
    let bad: Vec<_> = r.checks.iter().filter(|c| !c.check.ok()).collect();
    println!(
        "byte-for-byte checks: {} of {} passed (pool blocks over cuMemAlloc and VMM pages, every method, both ways, canary guards)",
        r.checks.len() - bad.len(),
        r.checks.len()
    );
    for c in &bad {
        println!("  FAILED: {} {:?}", c.strategy, c.check);
    }
    if let Some(p) = r.pool_min_pct_of_baseline {
        println!(
            "target: pool-block copies ≥ 90 % of the cuMemcpyPeerAsync baseline at the largest size: {p:.1} % ({})",
            if p >= 90.0 { "met" } else { "NOT met" }
        );
    }
}

/// `gpumem bench transfer --device all`.
pub fn bench_transfer_all(a: &BenchTransferArgs) -> Result<()> {
    let n = gpumem::cuda::device_count()?;
    if n == 0 {
        bail!("no CUDA device visible");
    }
    let mut devices = Vec::new();
    for ordinal in 0..n {
        devices.push(host_device(a, ordinal)?);
    }
    let cfg = PeerBenchConfig {
        sizes: a.sizes.clone(),
        repeats: a.repeats.clamp(1, 11),
        check_bytes: CHECK_BYTES.min(a.sizes.iter().copied().max().unwrap_or(CHECK_BYTES)),
    };
    let mut peers = Vec::new();
    for x in 0..n {
        for y in x + 1..n {
            let pb = crate::progress::bar(0);
            let r = peer_bench::peer_bandwidth(x, y, &cfg, &mut |m| pb.set_message(m.to_string()))
                .with_context(|| format!("peer copies between cuda:{x} and cuda:{y}"))?;
            pb.finish_and_clear();
            peers.push(r);
        }
    }
    let peer_note = if n < 2 {
        Some("skipped: 1 device")
    } else {
        None
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "devices": devices,
                "peer": peers,
                "peer_note": peer_note,
                "note": "host<->device: CUDA-event-timed copies (median), GB/s = 1e9 B/s; peer: host-timed batches, baseline a plain cuMemcpyPeerAsync loop in the same run",
            }))?
        );
    } else {
        for d in &devices {
            println!("cuda:{} {} ({})", d.ordinal, d.name, d.pci_bus_id);
            println!("  {:<9} {:<5} {:>10} {:>9}", "kind", "dir", "size", "GB/s");
            for r in &d.results {
                println!(
                    "  {:<9} {:<5} {:>10} {:>9.2}",
                    r.kind.name(),
                    r.direction.name(),
                    units::bytes(r.bytes),
                    r.gbps
                );
            }
        }
        if let Some(note) = peer_note {
            println!("peer copies: {note}");
        }
        for r in &peers {
            print_peer(r);
        }
    }
    let failed: usize = peers
        .iter()
        .map(|r| r.checks.iter().filter(|c| !c.check.ok()).count())
        .sum();
    if failed > 0 {
        bail!("{failed} peer copy check(s) found wrong bytes");
    }
    Ok(())
}
