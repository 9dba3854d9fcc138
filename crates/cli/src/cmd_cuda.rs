//! `gpumem info`, `inspect`, `vmm`, `bench alloc`: the CUDA backend's commands. Each takes
//! `--device sim|cuda|cuda:N|all`; without a CUDA driver the CUDA choices fail with a clear
//! error pointing at `--device sim`.
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use gpumem::cuda::bench::{
    self, AllocBackend, AsyncCuda, BenchRow, BenchStreams, Budget, Case, ContextBinder,
    PoolBackend, RawCuda,
};
use gpumem::cuda::pool::{DevicePool, PoolConfig};
use gpumem::cuda::vmm::{self, human, PageTable, Tracked, VmmBook};
use gpumem::cuda::{self, CudaDevice, CudaEvents, DeviceSel, ManualEvents, PointerInfo};
use gpumem_core::config::AllocatorConfig;
use gpumem_core::registry;
use gpumem_core::sim::SimDevice;
use gpumem_core::Device;
use serde::Serialize;

use crate::units::parse_size;

fn parse_sizes(s: &str) -> Result<Vec<u64>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(parse_size)
        .collect()
}

fn parse_threads(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| x.trim().parse::<usize>().map_err(|e| format!("`{x}`: {e}")))
        .collect()
}

/// Arguments of `gpumem info`.
#[derive(Args)]
pub struct InfoArgs {
    /// Device: sim, cuda (= cuda:0), cuda:N or all.
    #[arg(long, default_value = "all")]
    pub device: DeviceSel,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

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
    #[arg(long, default_value = "256,64KiB,3MiB,64MiB", value_parser = parse_sizes)]
    pub sizes: std::vec::Vec<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `gpumem vmm`.
#[derive(Args)]
pub struct VmmArgs {
    /// Device: sim, cuda (= cuda:0) or cuda:N.
    #[arg(long, default_value = "cuda")]
    pub device: DeviceSel,
    /// Virtual range to reserve for the demonstration arena.
    #[arg(long, default_value = "32MiB", value_parser = parse_size)]
    pub reserve: u64,
    /// Pages considered for mapping (every other one is mapped, leaving holes).
    #[arg(long, default_value_t = 8)]
    pub pages: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `gpumem bench alloc`.
#[derive(Args)]
pub struct BenchAllocArgs {
    /// Device: sim (pool cost only, no baselines), cuda, cuda:N or all.
    #[arg(long, default_value = "cuda")]
    pub device: DeviceSel,
    /// Strategies (comma-separated, or `all`).
    #[arg(long, default_value = "all")]
    pub strategies: String,
    /// Sizes of the alloc+free pairs (comma-separated).
    #[arg(long, default_value = "256,4KiB,64KiB,1MiB,16MiB,256MiB,1GiB", value_parser = parse_sizes)]
    pub sizes: std::vec::Vec<u64>,
    /// Also run the mixed batch (1000 live allocations of 1 KiB..4 MiB).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub mixed: bool,
    /// Thread counts (comma-separated).
    #[arg(long, default_value = "1,4,16", value_parser = parse_threads)]
    pub threads: std::vec::Vec<usize>,
    /// Time per measurement, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub time_ms: u64,
    /// Most pairs per thread per measurement.
    #[arg(long, default_value_t = 5_000_000)]
    pub max_pairs: u64,
    /// Skip the cuMemAlloc and cuMemAllocAsync baselines.
    #[arg(long)]
    pub no_baselines: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn ordinals(sel: DeviceSel) -> Result<Vec<usize>> {
    Ok(sel.ordinals()?)
}

// ---------------------------------------------------------------- info

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
    let mut out = InfoOut {
        driver_present: cuda::driver_present(),
        devices: Vec::new(),
        peer_access: Vec::new(),
        pool_defaults: PoolConfig::default(),
        simulated: None,
    };
    if a.device == DeviceSel::Sim {
        let d = SimDevice::default();
        out.simulated = Some(SimInfo {
            capacity_bytes: d.capacity_bytes(),
            granularity_bytes: d.granularity_bytes(),
        });
    } else {
        for o in ordinals(a.device)? {
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
            gpumem::cuda::pitch::pitch_align_for(
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

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

// ---------------------------------------------------------------- inspect

/// What the pool knows of a device's memory.
trait Introspect: Device {
    fn segment_list(&self) -> Vec<(u64, u64)>;
    fn book(&self) -> &VmmBook;
    fn driver_view(&self, addr: u64) -> Option<Result<PointerInfo, String>>;
}

impl Introspect for CudaDevice {
    fn segment_list(&self) -> Vec<(u64, u64)> {
        self.segments()
    }
    fn book(&self) -> &VmmBook {
        self.vmm_book()
    }
    fn driver_view(&self, addr: u64) -> Option<Result<PointerInfo, String>> {
        Some(self.pointer_info(addr).map_err(|e| e.to_string()))
    }
}

impl Introspect for Tracked<SimDevice> {
    fn segment_list(&self) -> Vec<(u64, u64)> {
        self.segments.iter().map(|(a, b)| (*a, *b)).collect()
    }
    fn book(&self) -> &VmmBook {
        &self.book
    }
    fn driver_view(&self, _addr: u64) -> Option<Result<PointerInfo, String>> {
        None
    }
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
    let blocks: Vec<_> = sizes
        .iter()
        .map(|&s| {
            pool.alloc(s, 0)
                .with_context(|| format!("{}: allocating {}", pool.name(), human(s)))
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
    let names = registry::parse_list(&a.strategies)?;
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    let opts = PoolConfig::default();
    for name in &names {
        let alloc = registry::build(name, &AllocatorConfig::default())?;
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
            for o in ordinals(a.device)? {
                let dev = cuda::open(o)?;
                let events = CudaEvents::new(&dev)?;
                let o2 = PoolConfig {
                    pitch_align_bytes: dev.pitch_align_bytes(),
                    ..opts
                };
                res = DevicePool::new(alloc_again(name)?, dev, Box::new(events), o2)
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
            errors.push(format!("{name}: {e:#}"));
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
        println!(
            "{:<9} {:>9} {:>16} | {:<8} {:>16} {:>10} {:>10} {:<6} | {:>4} {:<8} {:>16} {:>10} {:<5}",
            "strategy", "size", "address", "backing", "start", "bytes", "offset", "pages", "dev", "type", "range start", "range", "vmm"
        );
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
            println!(
                "{:<9} {:>9} {:>#16x} | {:<8} {:>#16x} {:>10} {:>10} {:<6} | {:>4} {:<8} {:>16} {:>10} {:<5}",
                p.strategy,
                human(p.requested_bytes),
                r.addr,
                p.backing,
                p.backing_start,
                human(p.backing_bytes),
                p.block_offset,
                pages,
                dev,
                ty,
                rs,
                rb,
                vm
            );
        }
        for e in &errors {
            eprintln!("error: {e}");
        }
    }
    if rows.is_empty() && !errors.is_empty() {
        bail!("no strategy could allocate ({} errors)", errors.len());
    }
    Ok(())
}

fn alloc_again(name: &str) -> Result<Box<dyn gpumem_core::Allocator>> {
    Ok(registry::build(name, &AllocatorConfig::default())?)
}

// ---------------------------------------------------------------- vmm

#[derive(Serialize)]
struct VmmOut {
    device: String,
    granularity_bytes: u64,
    /// Page tables of the `paged` strategy's arenas after a few allocations (empty if it
    /// could not run), then of the demonstration arena.
    paged_strategy: Vec<PageTable>,
    paged_error: Option<String>,
    demo_arena: Vec<PageTable>,
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

pub fn vmm(a: VmmArgs) -> Result<()> {
    let paged_opts = PoolConfig {
        reserve_bytes: 0,
        ..PoolConfig::default()
    };
    let out = match a.device {
        DeviceSel::Sim => {
            let g = SimDevice::default().granularity_bytes();
            let (paged_strategy, paged_error) = match DevicePool::new(
                registry::build("paged", &AllocatorConfig::default())?,
                Tracked::new(SimDevice::default()),
                Box::new(ManualEvents::immediate()),
                paged_opts,
            )
            .map_err(anyhow::Error::from)
            .and_then(|p| paged_tables(&p, g))
            {
                Ok(t) => (t, None),
                Err(e) => (Vec::new(), Some(format!("{e:#}"))),
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
                registry::build("paged", &AllocatorConfig::default())?,
                dev,
                Box::new(events),
                paged_opts,
            )
            .map_err(anyhow::Error::from)
            .and_then(|p| paged_tables(&p, g))
            {
                Ok(t) => (t, None),
                Err(e) => (Vec::new(), Some(format!("{e:#}"))),
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
            }
        }
    };
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
    Ok(())
}

// ---------------------------------------------------------------- bench alloc

#[derive(Serialize)]
struct BenchOut {
    device: String,
    rows: Vec<RatedRow>,
    errors: Vec<String>,
}

#[derive(Serialize)]
struct RatedRow {
    #[serde(flatten)]
    row: BenchRow,
    /// cuMemAlloc median / this median (how many times faster), same case and threads.
    speedup_vs_cumemalloc: Option<f64>,
    /// cuMemAllocAsync median / this median.
    speedup_vs_cumemallocasync: Option<f64>,
}

struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    fn new(n: u64) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(n);
            if let Ok(st) = indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}") {
                b.set_style(st);
            }
            b
        });
        Progress { bar }
    }
    fn step(&self, msg: String) {
        if let Some(b) = &self.bar {
            b.set_message(msg);
            b.inc(1);
        }
    }
    fn done(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn cases(a: &BenchAllocArgs) -> Vec<Case> {
    let mut c: Vec<Case> = a.sizes.iter().map(|&s| Case::Fixed(s)).collect();
    if a.mixed {
        c.push(Case::Mixed);
    }
    c
}

fn run_cases<B: AllocBackend>(
    b: &B,
    a: &BenchAllocArgs,
    budget: Budget,
    prog: &Progress,
    rows: &mut Vec<BenchRow>,
    errors: &mut Vec<String>,
) {
    for case in cases(a) {
        for &t in &a.threads {
            prog.step(format!("{} {} x{t}", b.label(), case.label()));
            // Raw cuMemAlloc of large blocks is slow: fewer pairs.
            match bench::measure(b, case, t, budget) {
                Ok(r) => rows.push(r),
                Err(e) => errors.push(format!("{} {} x{t}: {e}", b.label(), case.label())),
            }
        }
    }
}

pub fn bench_alloc(a: BenchAllocArgs) -> Result<()> {
    let names = registry::parse_list(&a.strategies)?;
    let budget = Budget {
        time: Duration::from_millis(a.time_ms),
        max_pairs: a.max_pairs,
    };
    let max_threads = a.threads.iter().copied().max().unwrap_or(1);
    let per_backend = (cases(&a).len() * a.threads.len()) as u64;
    let mut outs = Vec::new();
    let targets: Vec<Option<usize>> = match a.device {
        DeviceSel::Sim => vec![None],
        sel => ordinals(sel)?.into_iter().map(Some).collect(),
    };
    for target in targets {
        let mut rows = Vec::new();
        let mut errors = Vec::new();
        let baselines = target.is_some() && !a.no_baselines;
        let prog =
            Progress::new(per_backend * (names.len() as u64 + if baselines { 2 } else { 0 }));
        let device = match target {
            None => {
                for name in &names {
                    let pool = DevicePool::new(
                        registry::build(name, &AllocatorConfig::default())?,
                        SimDevice::default(),
                        Box::new(ManualEvents::immediate()),
                        PoolConfig::default(),
                    );
                    match pool {
                        Ok(pool) => {
                            let b = PoolBackend {
                                pool: &pool,
                                streams: (1..=max_threads as u64).collect(),
                                ctx: None,
                            };
                            run_cases(&b, &a, budget, &prog, &mut rows, &mut errors);
                        }
                        Err(e) => errors.push(format!("{name}: {e}")),
                    }
                }
                "sim (pool CPU cost only)".to_string()
            }
            Some(o) => {
                let probe = cuda::open(o)?;
                let streams = BenchStreams::new(&probe, max_threads).map_err(|e| anyhow!(e))?;
                for name in &names {
                    let dev = cuda::open(o)?;
                    let events = CudaEvents::new(&dev)?;
                    let opts = PoolConfig {
                        pitch_align_bytes: dev.pitch_align_bytes(),
                        ..PoolConfig::default()
                    };
                    match DevicePool::new(
                        registry::build(name, &AllocatorConfig::default())?,
                        dev,
                        Box::new(events),
                        opts,
                    ) {
                        Ok(pool) => {
                            let b = PoolBackend {
                                pool: &pool,
                                streams: streams.ids(),
                                ctx: Some(ContextBinder::of(&probe)),
                            };
                            run_cases(&b, &a, budget, &prog, &mut rows, &mut errors);
                        }
                        Err(e) => errors.push(format!("{name}: {e}")),
                    }
                }
                if baselines {
                    let raw = RawCuda {
                        ctx: ContextBinder::of(&probe),
                    };
                    let raw_budget = Budget {
                        max_pairs: budget.max_pairs.min(2_000),
                        ..budget
                    };
                    run_cases(&raw, &a, raw_budget, &prog, &mut rows, &mut errors);
                    match AsyncCuda::new(&probe, max_threads) {
                        Ok(asy) => run_cases(&asy, &a, budget, &prog, &mut rows, &mut errors),
                        Err(e) => errors.push(format!("cuMemAllocAsync: {e}")),
                    }
                }
                drop(streams);
                format!("cuda:{o} {}", probe.info().name)
            }
        };
        prog.done();
        outs.push(BenchOut {
            device,
            rows: rate(rows),
            errors,
        });
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&outs)?);
    } else {
        for o in &outs {
            print_bench(o);
        }
    }
    if outs.iter().all(|o| o.rows.is_empty()) {
        bail!("no measurement succeeded");
    }
    Ok(())
}

fn rate(rows: Vec<BenchRow>) -> Vec<RatedRow> {
    let mut base: BTreeMap<(String, String, usize), f64> = BTreeMap::new();
    for r in &rows {
        if r.backend == "cuMemAlloc" || r.backend == "cuMemAllocAsync" {
            base.insert((r.backend.clone(), r.case.label(), r.threads), r.median_ns);
        }
    }
    rows.into_iter()
        .map(|row| {
            let k = |b: &str| (b.to_string(), row.case.label(), row.threads);
            let sa = base.get(&k("cuMemAlloc")).map(|m| m / row.median_ns);
            let sb = base.get(&k("cuMemAllocAsync")).map(|m| m / row.median_ns);
            RatedRow {
                row,
                speedup_vs_cumemalloc: sa,
                speedup_vs_cumemallocasync: sb,
            }
        })
        .collect()
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn print_bench(o: &BenchOut) {
    println!(
        "bench alloc on {} (alloc+free pair; speedup = baseline median / this median)",
        o.device
    );
    println!(
        "{:<16} {:>8} {:>4} {:>10} {:>10} {:>12} {:>11} {:>11}",
        "backend", "size", "thr", "median", "p99", "pairs/s", "×cuMemAlloc", "×AllocAsync"
    );
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
    for r in &o.rows {
        println!(
            "{:<16} {:>8} {:>4} {:>10} {:>10} {:>12.0} {:>11} {:>11}",
            r.row.backend,
            r.row.case.label(),
            r.row.threads,
            fmt_ns(r.row.median_ns),
            fmt_ns(r.row.p99_ns),
            r.row.pairs_per_s,
            f(r.speedup_vs_cumemalloc),
            f(r.speedup_vs_cumemallocasync)
        );
    }
    // Scaling: pairs/s at the most threads over 1 thread, per backend and case.
    let mut one: BTreeMap<(String, String), f64> = BTreeMap::new();
    let mut most: BTreeMap<(String, String), (usize, f64)> = BTreeMap::new();
    for r in &o.rows {
        let k = (r.row.backend.clone(), r.row.case.label());
        if r.row.threads == 1 {
            one.insert(k.clone(), r.row.pairs_per_s);
        }
        let e = most.entry(k).or_insert((0, 0.0));
        if r.row.threads > e.0 {
            *e = (r.row.threads, r.row.pairs_per_s);
        }
    }
    let mut lines = Vec::new();
    for (k, (t, p)) in &most {
        if let Some(b) = one.get(k) {
            if *t > 1 && *b > 0.0 {
                lines.push(format!("{} {}: {:.1}× at {t} threads", k.0, k.1, p / b));
            }
        }
    }
    if !lines.is_empty() {
        println!("throughput scaling over 1 thread: {}", lines.join("; "));
    }
    for e in &o.errors {
        eprintln!("error: {e}");
    }
}

/// Opens CUDA device `ordinal` for `gpumem replay --device cuda:N`, limited to `capacity`
/// bytes (or the device's own memory if smaller), so OOM points match the trace's device.
pub fn open_replay_device(ordinal: usize, capacity: u64) -> Result<Box<dyn gpumem::core::Device>> {
    let dev = cuda::open(ordinal)?;
    Ok(Box::new(gpumem::cuda::Capped::new(dev, capacity)))
}
