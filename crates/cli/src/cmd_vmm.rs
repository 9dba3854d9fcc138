//! `gpumem vmm`: the page table of a live VMM arena.

use anyhow::{bail, Result};
use clap::Args;
use gpumem::core::adaptor::{PageTable, Tracked};
use gpumem::cuda::{self, CudaEvents, DeviceSel};
use gpumem::pool::ManualEvents;
use gpumem::pool::{DevicePool, PoolConfig};
use gpumem::units::bytes_compact as human;
use gpumem::vmm::{self, Introspect};
use gpumem_core::config::AllocatorConfig;
use gpumem_core::sim::SimDevice;
use gpumem_core::strategy::Strategy;
use gpumem_core::Device;
use serde::Serialize;

use gpumem::units::parse_size;

/// Arguments of `gpumem vmm`.
#[derive(Args)]
pub struct VmmArgs {
    /// Device: sim, cuda (= cuda:0) or cuda:N.
    #[arg(long, default_value = "cuda")]
    pub device: DeviceSel,
    /// Virtual range to reserve for the demonstration arena.
    #[arg(long, default_value = "32MiB", value_parser = parse_size, allow_hyphen_values = true)]
    pub reserve: u64,
    /// Pages considered for mapping (every other one is mapped, leaving holes).
    #[arg(long, default_value_t = 8, allow_hyphen_values = true,
          value_parser = |s: &str| crate::units::whole_number::<u64>(s, 0, "a page count"))]
    pub pages: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct VmmOut {
    device: String,
    granularity_bytes: u64,
    /// Page tables of the `paged` strategy's arenas after a few allocations (empty if it
    /// could not run), then of the demonstration arena.
    paged_strategy: Vec<PageTable>,
    paged_error: Option<String>,
    demo_arena: Vec<PageTable>,
    /// What the demonstration arena did not take as given (`--reserve` rounded up to whole
    /// pages, `--pages` capped at the pages reserved).
    notes: Vec<String>,
}

fn paged_tables<D: Introspect>(pool: &DevicePool<D>, g: u64) -> Result<Vec<PageTable>> {
    let sizes = [3 << 20, 64 << 10, 10 << 20, 512];
    let mut blocks = Vec::new();
    for s in sizes {
        blocks.push(pool.alloc(s, 0)?);
    }
    drop(blocks.remove(0)); // leave a hole
    Ok(pool.with_device(|d| d.book().page_tables(g))?)
}

/// What the demonstration arena did not take as given ([`vmm::demo_arena`] reserves whole
/// pages of `page` bytes and considers at most the pages reserved).
fn demo_notes(reserve: u64, pages: u64, page: u64) -> Vec<String> {
    let mut notes = Vec::new();
    if page == 0 {
        return notes;
    }
    let held = reserve.div_ceil(page).max(1);
    if held.checked_mul(page) != Some(reserve) {
        notes.push(format!(
            "--reserve {}: reserved {} (whole pages of {})",
            human(reserve),
            human(held.saturating_mul(page)),
            human(page)
        ));
    }
    if pages > held {
        notes.push(format!(
            "--pages {pages}: considered {held}, the pages the reserve holds (--reserve {} would hold {pages})",
            human(pages.saturating_mul(page))
        ));
    }
    notes
}

pub fn vmm(a: VmmArgs) -> Result<()> {
    let paged_opts = PoolConfig {
        reserve_bytes: 0,
        ..PoolConfig::default()
    };
    let mut out = match a.device {
        DeviceSel::Sim => {
            let g = SimDevice::default().granularity_bytes();
            let (paged_strategy, paged_error) = match DevicePool::new(
                Strategy::Paged.build(&AllocatorConfig::default()),
                Tracked::new(SimDevice::default()),
                Box::new(ManualEvents::immediate()),
                paged_opts,
            )
            .map_err(anyhow::Error::from)
            .and_then(|p| paged_tables(&p, g))
            {
                Ok(t) => (t, None),
                Err(e) => (Vec::new(), Some(crate::error_text(&e))),
            };
            let mut d = Tracked::new(SimDevice::default());
            let va = vmm::demo_arena(&mut d, a.reserve, a.pages)?;
            let demo_arena = d.book.page_tables(g);
            let book = d.book.clone();
            vmm::teardown(&mut d, &book, va)?;
            VmmOut {
                device: "sim".into(),
                granularity_bytes: g,
                paged_strategy,
                paged_error,
                demo_arena,
                notes: Vec::new(),
            }
        }
        DeviceSel::All => bail!("`gpumem vmm` shows one device: use --device cuda:N"),
        DeviceSel::Cuda(o) => {
            let dev = cuda::open(o)?;
            let g = dev.granularity_bytes();
            if g == 0 {
                bail!("cuda:{o} does not support virtual memory management");
            }
            let events = CudaEvents::new(&dev)?;
            let (paged_strategy, paged_error) = match DevicePool::new(
                Strategy::Paged.build(&AllocatorConfig::default()),
                dev,
                Box::new(events),
                paged_opts,
            )
            .map_err(anyhow::Error::from)
            .and_then(|p| paged_tables(&p, g))
            {
                Ok(t) => (t, None),
                Err(e) => (Vec::new(), Some(crate::error_text(&e))),
            };
            let mut dev = cuda::open(o)?;
            let va = vmm::demo_arena(&mut dev, a.reserve, a.pages)?;
            let demo_arena = dev.page_tables();
            let book = dev.vmm_book().clone();
            vmm::teardown(&mut dev, &book, va)?;
            VmmOut {
                device: format!("cuda:{o} {}", dev.info().name),
                granularity_bytes: g,
                paged_strategy,
                paged_error,
                demo_arena,
                notes: Vec::new(),
            }
        }
    };
    out.notes = demo_notes(a.reserve, a.pages, out.granularity_bytes);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{} — page size (granularity) {}",
        out.device,
        human(out.granularity_bytes)
    );
    println!("\n`paged` strategy after allocating 3 MiB, 64 KiB, 10 MiB, 512 B and freeing the 3 MiB block:");
    match &out.paged_error {
        Some(e) => println!("  (not available: {e})"),
        None => print!("{}", vmm::render(&out.paged_strategy)),
    }
    println!("\ndemonstration arena (every other page mapped):");
    print!("{}", vmm::render(&out.demo_arena));
    for note in &out.notes {
        println!("note: {note}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::demo_notes;

    #[test]
    fn the_demonstration_says_what_it_rounded_and_capped() {
        const MIB: u64 = 1 << 20;
        assert!(demo_notes(32 * MIB, 8, 2 * MIB).is_empty());
        let n = demo_notes(1 << 10, 8, 2 * MIB);
        assert_eq!(n.len(), 2, "{n:?}");
        assert_eq!(
            n[0],
            "--reserve 1 KiB: reserved 2 MiB (whole pages of 2 MiB)"
        );
        assert_eq!(
            n[1],
            "--pages 8: considered 1, the pages the reserve holds (--reserve 16 MiB would hold 8)"
        );
        let n = demo_notes(32 * MIB, 100, 2 * MIB);
        assert_eq!(
            n,
            ["--pages 100: considered 16, the pages the reserve holds (--reserve 200 MiB would hold 100)"]
        );
    }
}
