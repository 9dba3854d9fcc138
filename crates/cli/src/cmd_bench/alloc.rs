//! `gpumem bench alloc`: strategies against cuMemAlloc and cuMemAllocAsync.
use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use gpumem::cuda::bench::{
    self, AllocBackend, AsyncCuda, BenchRow, BenchStreams, Budget, Case, ContextBinder,
    PoolBackend, RawCuda,
};
use gpumem::cuda::{self, CudaEvents, DeviceSel};
use gpumem::pool::ManualEvents;
use gpumem::pool::{DevicePool, PoolConfig};
use gpumem_core::config::AllocatorConfig;
use gpumem_core::sim::SimDevice;
use gpumem_core::strategy::Strategy;
use serde::Serialize;

/// The most threads one measurement starts (each also gets a CUDA stream of its own): a
/// mistyped count (100000) otherwise spends minutes starting threads before measuring.
const MAX_THREADS: usize = 1024;

fn parse_threads(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| match x.trim().parse::<usize>() {
            Ok(0) => Err(format!("`{x}`: a thread count is at least 1")),
            Ok(n) if n > MAX_THREADS => Err(format!(
                "`{x}`: at most {MAX_THREADS} threads a measurement"
            )),
            Ok(n) => Ok(n),
            Err(e) => Err(format!("`{x}`: {e}")),
        })
        .collect()
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
    #[arg(long, default_value = "256,4KiB,64KiB,1MiB,16MiB,256MiB,1GiB", value_parser = gpumem::units::parse_size_list, allow_hyphen_values = true)]
    pub sizes: std::vec::Vec<u64>,
    /// Also run the mixed batch (1000 live allocations of 1 KiB..4 MiB).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub mixed: bool,
    /// Thread counts (comma-separated, 1 to 1024 each).
    #[arg(long, default_value = "1,4,16", value_parser = parse_threads)]
    pub threads: std::vec::Vec<usize>,
    /// Time per measurement, in milliseconds (at least 1).
    #[arg(long, default_value_t = 100, allow_hyphen_values = true,
          value_parser = |s: &str| crate::units::whole_number::<u64>(s, 1, "milliseconds a measurement"))]
    pub time_ms: u64,
    /// Most pairs per thread per measurement (at least 1).
    #[arg(long, default_value_t = 5_000_000, allow_hyphen_values = true,
          value_parser = |s: &str| crate::units::whole_number::<u64>(s, 1, "the most pairs a thread"))]
    pub max_pairs: u64,
    /// Skip the cuMemAlloc and cuMemAllocAsync baselines.
    #[arg(long)]
    pub no_baselines: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

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

/// Steps of the benchmark, on the CLI's progress bar.
struct Progress {
    bar: indicatif::ProgressBar,
}

impl Progress {
    fn new(n: u64) -> Self {
        Progress {
            bar: crate::progress::bar(n),
        }
    }
    fn step(&self, msg: String) {
        self.bar.set_message(msg);
        self.bar.inc(1);
    }
    fn done(&self) {
        self.bar.finish_and_clear();
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
    if cases(&a).is_empty() {
        bail!("--sizes gives no size and --mixed is false: nothing to measure (give --sizes 1MiB, or leave --mixed on)");
    }
    let names = Strategy::parse_list(&a.strategies)?;
    let budget = Budget {
        time: Duration::from_millis(a.time_ms),
        max_pairs: a.max_pairs,
    };
    let max_threads = a.threads.iter().copied().max().unwrap_or(1);
    let per_backend = (cases(&a).len() * a.threads.len()) as u64;
    let mut outs = Vec::new();
    let targets: Vec<Option<usize>> = match a.device {
        DeviceSel::Sim => {
            eprintln!(
                "note: on the simulated device this measures each strategy's own CPU cost (the \
                 pool's hit path and the allocator's bookkeeping), not driver time: the \
                 simulated driver calls cost nothing here. Use --device cuda for real figures."
            );
            vec![None]
        }
        sel => sel.ordinals()?.into_iter().map(Some).collect(),
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
                        name.build(&AllocatorConfig::default()),
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
                        name.build(&AllocatorConfig::default()),
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

/// A note when a measurement's threads ran less than 90 % of the wall time (a busy host, more
/// threads than cores, or calls that sleep): pairs/s then counts the wait, the medians do not.
fn busy_host_note(o: &BenchOut) -> Option<String> {
    let low: Vec<(&RatedRow, f64)> = o
        .rows
        .iter()
        .filter_map(|r| r.row.cpu_share.filter(|&c| c < 0.9).map(|c| (r, c)))
        .collect();
    let (worst, c) = low.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1))?;
    Some(format!(
        "note: in {} of {} measurements the threads ran under 90 % of the wall time (least: {:.0} %, {} {} x{}; a busy host, more threads than cores, or calls that sleep): pairs/s counts that wait, the medians do not",
        low.len(),
        o.rows.len(),
        c * 100.0,
        worst.row.backend,
        worst.row.case.label(),
        worst.row.threads
    ))
}

fn fmt_ns(ns: f64) -> String {
    gpumem::units::duration(ns * 1e-9)
}

fn print_bench(o: &BenchOut) {
    println!(
        "bench alloc on {}: alloc+free pairs; speedup = baseline median / this median",
        o.device
    );
    println!(
        "{:<16} {:>8} {:>4} {:>10} {:>10} {:>12} {:>11} {:>11}",
        "backend", "size", "thr", "median", "p99", "pairs/s", "×cuMemAlloc", "×AllocAsync"
    );
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
    for r in &o.rows {
        println!(
            "{:<16} {:>8} {:>4} {:>10} {:>10} {:>12} {:>11} {:>11}",
            r.row.backend,
            r.row.case.label(),
            r.row.threads,
            fmt_ns(r.row.median_ns),
            fmt_ns(r.row.p99_ns),
            gpumem::units::rate(r.row.pairs_per_s),
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
    if let Some(low) = busy_host_note(o) {
        println!("{low}");
    }
    for e in &o.errors {
        eprintln!("error: {e}");
    }
}
