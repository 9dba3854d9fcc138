//! `gpumem info`: devices, memory, granularity and pool figures.

use anyhow::Result;
use clap::Args;
use gpumem::cuda::{self, DeviceSel};
use gpumem::pool::PoolConfig;
use gpumem::units::bytes_compact as human;
use gpumem_core::sim::SimDevice;
use gpumem_core::Device;
use serde::Serialize;

use crate::units::yes;

/// Arguments of `gpumem info`.
#[derive(Args)]
pub struct InfoArgs {
    /// Device: sim, cuda (= cuda:0), cuda:N or all. Default: every CUDA device, or the
    /// simulated device (said so) where there is no driver.
    #[arg(long)]
    pub device: Option<DeviceSel>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct InfoOut {
    driver_present: bool,
    devices: Vec<cuda::DeviceInfo>,
    peer_access: Vec<Vec<bool>>,
    pool_defaults: PoolConfig,
    simulated: Option<SimInfo>,
}

#[derive(Serialize)]
struct SimInfo {
    capacity_bytes: u64,
    granularity_bytes: u64,
}

pub fn info(a: InfoArgs) -> Result<()> {
    let device = match a.device {
        Some(d) => d,
        None => match cuda::init() {
            Ok(()) => DeviceSel::All,
            Err(cuda::CudaError::NoDriver { .. }) => {
                eprintln!(
                    "note: no NVIDIA driver (libcuda.so.1) found: showing the simulated device (--device sim)"
                );
                DeviceSel::Sim
            }
            Err(e) => {
                eprintln!("note: {e}: showing the simulated device (--device sim)");
                DeviceSel::Sim
            }
        },
    };
    let mut out = InfoOut {
        driver_present: cuda::driver_present(),
        devices: Vec::new(),
        peer_access: Vec::new(),
        pool_defaults: PoolConfig::default(),
        simulated: None,
    };
    if device == DeviceSel::Sim {
        let d = SimDevice::default();
        out.simulated = Some(SimInfo {
            capacity_bytes: d.capacity_bytes(),
            granularity_bytes: d.granularity_bytes(),
        });
    } else {
        for o in device.ordinals()? {
            out.devices.push(cuda::open(o)?.info());
        }
        let m = cuda::peer_matrix()?;
        let chosen: Vec<usize> = out.devices.iter().map(|d| d.ordinal).collect();
        out.peer_access = chosen
            .iter()
            .map(|&i| {
                chosen
                    .iter()
                    .map(|&j| m.get(i).and_then(|r| r.get(j)).copied().unwrap_or(false))
                    .collect()
            })
            .collect();
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if let Some(s) = &out.simulated {
        println!(
            "simulated device: {} capacity, {} granularity",
            human(s.capacity_bytes),
            human(s.granularity_bytes)
        );
    }
    for d in &out.devices {
        println!("cuda:{}  {}", d.ordinal, d.name);
        println!(
            "  memory          {} total, {} free",
            human(d.total_bytes),
            human(d.free_bytes)
        );
        println!(
            "  VMM             {} (granularity {} minimum, {} recommended)",
            if d.vmm_supported {
                "supported"
            } else {
                "not supported"
            },
            human(d.granularity_bytes),
            human(d.recommended_granularity_bytes)
        );
        println!("  mempools        {}", yes(d.mempools_supported));
        println!("  managed memory  {}", yes(d.managed_supported));
        println!(
            "  pitch alignment {} B (texture alignment {} B, texture pitch alignment {} B)",
            gpumem::pool::pitch::pitch_align_for(
                d.texture_alignment_bytes,
                d.texture_pitch_alignment_bytes
            ),
            d.texture_alignment_bytes,
            d.texture_pitch_alignment_bytes
        );
        println!(
            "  driver          CUDA {}.{}",
            d.driver_version / 1000,
            (d.driver_version % 1000) / 10
        );
    }
    if !out.peer_access.is_empty() {
        println!("peer access (row can access column):");
        let ords: Vec<usize> = out.devices.iter().map(|d| d.ordinal).collect();
        print!("        ");
        for o in &ords {
            print!(" gpu{o:<3}");
        }
        println!();
        for (i, row) in out.peer_access.iter().enumerate() {
            print!("  gpu{:<3}", ords[i]);
            for &c in row {
                print!(" {:<6}", if c { "yes" } else { "no" });
            }
            println!();
        }
    }
    let p = &out.pool_defaults;
    println!(
        "pool defaults: reserve {}, release threshold {}, cache blocks up to {}, {} per shard",
        human(p.reserve_bytes),
        if p.release_threshold_bytes == u64::MAX {
            "none (keep all)".to_string()
        } else {
            human(p.release_threshold_bytes)
        },
        human(p.max_cached_block_bytes),
        human(p.shard_cache_bytes)
    );
    Ok(())
}
