//! `gpumem inspect`: blocks as the driver and the pool see them.

use anyhow::{bail, Context, Result};
use clap::Args;
use gpumem::core::adaptor::Tracked;
use gpumem::cuda::{self, CudaEvents, DeviceSel, PointerInfo};
use gpumem::pool::ManualEvents;
use gpumem::pool::{DevicePool, PoolConfig};
use gpumem::units::bytes_compact as human;
use gpumem::vmm::Introspect;
use gpumem_core::config::AllocatorConfig;
use gpumem_core::sim::SimDevice;
use gpumem_core::strategy::Strategy;
use serde::Serialize;

use crate::units::yes;

/// Arguments of `gpumem inspect`.
#[derive(Args)]
pub struct InspectArgs {
    /// Device: sim, cuda (= cuda:0), cuda:N or all.
    #[arg(long, default_value = "cuda")]
    pub device: DeviceSel,
    /// Strategies (comma-separated, or `all`).
    #[arg(long, default_value = "all")]
    pub strategies: String,
    /// Block sizes to allocate (comma-separated: 256,64KiB,3MiB,64MiB).
    #[arg(long, default_value = "256,64KiB,3MiB,64MiB", value_parser = crate::units::parse_size_list_nonempty, allow_hyphen_values = true)]
    pub sizes: std::vec::Vec<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct PoolView {
    strategy: String,
    requested_bytes: u64,
    class_bytes: u64,
    /// "segment" (cuMemAlloc) or "vmm" (mapped pages) or "unknown".
    backing: String,
    backing_start: u64,
    backing_bytes: u64,
    block_offset: u64,
    /// Physical handles of the pages under the block (VMM), in order.
    pages: Vec<u64>,
}

#[derive(Serialize)]
struct InspectRow {
    addr: u64,
    pool: PoolView,
    driver: Option<PointerInfo>,
    driver_error: Option<String>,
}

fn pool_view<D: Introspect>(d: &D, strategy: &str, addr: u64, req: u64, class: u64) -> PoolView {
    let mut v = PoolView {
        strategy: strategy.to_string(),
        requested_bytes: req,
        class_bytes: class,
        backing: "unknown".into(),
        backing_start: 0,
        backing_bytes: 0,
        block_offset: 0,
        pages: Vec::new(),
    };
    if let Some((s, b)) = d
        .segment_list()
        .into_iter()
        .find(|(s, b)| addr >= *s && addr < s + b)
    {
        v.backing = "segment".into();
        v.backing_start = s;
        v.backing_bytes = b;
        v.block_offset = addr - s;
        return v;
    }
    let book = d.book();
    if let Some((s, b)) = book.reservation_of(addr) {
        v.backing = "vmm".into();
        v.backing_start = s;
        v.backing_bytes = b;
        v.block_offset = addr - s;
        let end = addr + req.max(1);
        let mut at = addr;
        while at < end {
            match book.mapping_of(at) {
                Some((ms, m)) => {
                    v.pages.push(m.handle);
                    at = ms + m.bytes;
                }
                None => break,
            }
        }
    }
    v
}

fn inspect_on<D: Introspect>(
    pool: &DevicePool<D>,
    sizes: &[u64],
    rows: &mut Vec<InspectRow>,
) -> Result<()> {
    let capacity = pool.with_device(|d| d.capacity_bytes())?;
    let blocks: Vec<_> = sizes
        .iter()
        .map(|&s| {
            pool.alloc(s, 0).with_context(|| {
                let over = if s > capacity {
                    format!(" (more than the device's {})", human(capacity))
                } else {
                    String::new()
                };
                format!("{}: allocating {}{over}", pool.name(), human(s))
            })
        })
        .collect::<Result<_>>()?;
    for b in &blocks {
        let (view, drv) = pool.with_device(|d| {
            (
                pool_view(d, pool.name(), b.addr(), b.size_bytes(), b.class_bytes()),
                d.driver_view(b.addr()),
            )
        })?;
        let (driver, driver_error) = match drv {
            Some(Ok(p)) => (Some(p), None),
            Some(Err(e)) => (None, Some(e)),
            None => (None, None),
        };
        rows.push(InspectRow {
            addr: b.addr(),
            pool: view,
            driver,
            driver_error,
        });
    }
    Ok(())
}

pub fn inspect(a: InspectArgs) -> Result<()> {
    let names = Strategy::parse_list(&a.strategies)?;
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    let opts = PoolConfig::default();
    for name in &names {
        let alloc = name.build(&AllocatorConfig::default());
        let r = if a.device == DeviceSel::Sim {
            DevicePool::new(
                alloc,
                Tracked::new(SimDevice::default()),
                Box::new(ManualEvents::immediate()),
                opts,
            )
            .map_err(anyhow::Error::from)
            .and_then(|p| inspect_on(&p, &a.sizes, &mut rows))
        } else {
            let mut res = Ok(());
            for o in a.device.ordinals()? {
                let dev = cuda::open(o)?;
                let events = CudaEvents::new(&dev)?;
                let o2 = PoolConfig {
                    pitch_align_bytes: dev.pitch_align_bytes(),
                    ..opts
                };
                res = DevicePool::new(alloc_again(*name), dev, Box::new(events), o2)
                    .map_err(anyhow::Error::from)
                    .and_then(|p| inspect_on(&p, &a.sizes, &mut rows));
                if res.is_err() {
                    break;
                }
            }
            drop(alloc);
            res
        };
        if let Err(e) = r {
            // Each cause once (the pool's out-of-memory error quotes its source), named once.
            let text = crate::error_text(&e);
            errors.push(if text.starts_with(&format!("{name}: ")) {
                text
            } else {
                format!("{name}: {text}")
            });
        }
    }
    if a.json {
        #[derive(Serialize)]
        struct Out<'a> {
            rows: &'a [InspectRow],
            errors: &'a [String],
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&Out {
                rows: &rows,
                errors: &errors
            })?
        );
    } else {
        // The strategy column as wide as its widest cell (`paged-lazy`); the offset in binary
        // units as the sizes beside it (`1023.9 KiB` at most: ten letters; exact in --json).
        let sw = rows
            .iter()
            .map(|r| r.pool.strategy.len())
            .max()
            .unwrap_or(0)
            .max(9);
        let header = format!(
            "{:<sw$} {:>9} {:>16} | {:<8} {:>16} {:>10} {:>10} {:<6} | {:>4} {:<8} {:>16} {:>10} {:<5}",
            "strategy", "size", "address", "backing", "start", "bytes", "offset", "pages", "dev", "type", "range start", "range", "vmm"
        );
        if !rows.is_empty() {
            println!("{}", header.trim_end());
        }
        for r in &rows {
            let p = &r.pool;
            let pages = if p.pages.is_empty() {
                "-".to_string()
            } else {
                p.pages.len().to_string()
            };
            let (dev, ty, rs, rb, vm) = match &r.driver {
                Some(d) => (
                    d.device_ordinal.to_string(),
                    format!("{:?}", d.memory_type).to_lowercase(),
                    format!("{:#x}", d.range_start),
                    human(d.range_bytes),
                    yes(d.vmm_mapped).to_string(),
                ),
                None => (
                    "-".into(),
                    r.driver_error.clone().unwrap_or_else(|| "(sim)".into()),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                ),
            };
            let line = format!(
                "{:<sw$} {:>9} {:>#16x} | {:<8} {:>#16x} {:>10} {:>10} {:<6} | {:>4} {:<8} {:>16} {:>10} {:<5}",
                p.strategy,
                human(p.requested_bytes),
                r.addr,
                p.backing,
                p.backing_start,
                human(p.backing_bytes),
                human(p.block_offset),
                pages,
                dev,
                ty,
                rs,
                rb,
                vm
            );
            println!("{}", line.trim_end());
        }
        for e in &errors {
            eprintln!("error: {e}");
        }
    }
    if rows.is_empty() && !errors.is_empty() {
        bail!(
            "no strategy could allocate ({})",
            crate::units::counted(errors.len() as u64, "error")
        );
    }
    Ok(())
}

pub(super) fn alloc_again(name: Strategy) -> Box<dyn gpumem_core::Allocator> {
    name.build(&AllocatorConfig::default())
}
