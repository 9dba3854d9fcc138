//! Allocate + free pairs: per arena (buddy, TLSF, best fit) and per strategy on a
//! simulated device, at fixed sizes, on a mixed-size batch, and (arenas) with many same-size
//! holes.
//!
//! The pools are warm: their segment already exists, so this times the hit path (no driver
//! call). For comparison, PyTorch's C++ caching allocator takes about 700 ns per
//! allocate/free pair on the H200 host.
//!
//! Run: `cargo bench -p gpumem-bench --bench pairs -- --warm-up-time 1 --measurement-time 3`
//!
//! On a shared machine, wall time counts the time other processes hold the core. With
//! `GPUMEM_BENCH_CPU=1` the same benchmarks measure this thread's CPU time instead
//! (`CLOCK_THREAD_CPUTIME_ID`), reported in nanoseconds as `cpu/...`.
use std::hint::black_box;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use gpumem_core::best_fit::BestFit;
use gpumem_core::buddy::Buddy;
use gpumem_core::config::AllocatorConfig;
use gpumem_core::sim::SimDevice;
use gpumem_core::strategy::Strategy;
use gpumem_core::tlsf::Tlsf;
use gpumem_core::{Allocator, Arena, DEFAULT_ALIGN};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Arena size: a 256 MiB pre-allocated pool, as in the classic buddy design.
const ARENA_BYTES: u64 = 256 * MIB;
const SIZES: [(u64, &str); 4] = [
    (256, "256B"),
    (4 * KIB, "4KiB"),
    (MIB, "1MiB"),
    (64 * MIB, "64MiB"),
];
/// Live blocks in one mixed batch.
const BATCH: usize = 300;

/// xorshift64*: a small deterministic generator, so every run sees the same workload.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Log-uniform size between 256 B and 1 MiB.
    fn size(&mut self) -> u64 {
        let shift = 8 + self.next() % 12; // 2^8 .. 2^19
        let base = 1u64 << shift;
        base + self.next() % base
    }
}

/// The mixed batch: `(size, align)` of each block, and the order to free them in.
fn mixed_batch() -> (Vec<(u64, u64)>, Vec<usize>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let blocks: Vec<(u64, u64)> = (0..BATCH)
        .map(|_| (rng.size(), DEFAULT_ALIGN << (rng.next() % 5)))
        .collect();
    let mut order: Vec<usize> = (0..BATCH).collect();
    for i in (1..BATCH).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    (blocks, order)
}

fn arenas() -> Vec<Box<dyn Arena>> {
    vec![
        Box::new(Buddy::new(ARENA_BYTES)),
        Box::new(Tlsf::new(ARENA_BYTES)),
        Box::new(BestFit::new(ARENA_BYTES)),
    ]
}

/// Leaves some live blocks and holes behind, so the free lists are not a single range.
fn fragment(arena: &mut dyn Arena) {
    let mut rng = Rng(7);
    let offs: Vec<u64> = (0..256)
        .map(|_| {
            arena
                .allocate(4 * KIB + rng.next() % (60 * KIB), 256)
                .unwrap()
                .0
        })
        .collect();
    for o in offs.iter().step_by(2) {
        arena.deallocate(*o).unwrap();
    }
}

fn arena_pairs<M: Measurement + 'static>(c: &mut Criterion<M>) {
    let mut g = c.benchmark_group(group_name::<M>("arena_pair"));
    for mut arena in arenas() {
        fragment(&mut *arena);
        for (size, label) in SIZES {
            g.bench_function(BenchmarkId::new(arena.name(), label), |b| {
                b.iter(|| {
                    let (off, _) = arena.allocate(black_box(size), DEFAULT_ALIGN).unwrap();
                    arena.deallocate(black_box(off)).unwrap()
                })
            });
        }
        arena.validate().unwrap();
    }
    g.finish();
}

fn arena_mixed<M: Measurement + 'static>(c: &mut Criterion<M>) {
    let (blocks, order) = mixed_batch();
    let mut g = c.benchmark_group(group_name::<M>("arena_mixed"));
    g.throughput(Throughput::Elements(BATCH as u64));
    for mut arena in arenas() {
        let mut offs = vec![0u64; BATCH];
        g.bench_function(arena.name(), |b| {
            b.iter(|| {
                for (i, &(size, align)) in blocks.iter().enumerate() {
                    offs[i] = arena.allocate(size, align).unwrap().0;
                }
                for &i in &order {
                    arena.deallocate(offs[i]).unwrap();
                }
            })
        });
        arena.validate().unwrap();
    }
    g.finish();
}

/// Same-size holes in one arena: 4 KiB free ranges between 4 KiB live blocks.
const CROWDED_HOLES: [usize; 3] = [16, 1_000, 10_000];

/// The worst case of a size-binned best fit: many free ranges of one size class. A 4 KiB
/// allocate/free pair takes the lowest hole and puts it back.
fn arena_crowded<M: Measurement + 'static>(c: &mut Criterion<M>) {
    let mut g = c.benchmark_group(group_name::<M>("arena_crowded"));
    for holes in CROWDED_HOLES {
        for mut arena in arenas() {
            let live: Vec<u64> = (0..2 * holes)
                .map(|_| arena.allocate(4 * KIB, DEFAULT_ALIGN).unwrap().0)
                .collect();
            for o in live.iter().step_by(2) {
                arena.deallocate(*o).unwrap();
            }
            g.bench_function(BenchmarkId::new(arena.name(), holes), |b| {
                b.iter(|| {
                    let (off, _) = arena.allocate(black_box(4 * KIB), DEFAULT_ALIGN).unwrap();
                    arena.deallocate(black_box(off)).unwrap()
                })
            });
            arena.validate().unwrap();
        }
    }
    g.finish();
}

/// Registry allocators that work on this build; a strategy still stubbed is skipped with a
/// note, so `torch` and `paged` join once they exist.
fn warm_pools() -> Vec<(SimDevice, Box<dyn Allocator>)> {
    let mut out = Vec::new();
    for name in Strategy::ALL.map(Strategy::name) {
        let mut dev = SimDevice::default();
        let mut pool = name
            .parse::<Strategy>()
            .unwrap()
            .build(&AllocatorConfig::default());
        // Warm: one block of each size, so the segments (or pages) the benchmark needs exist.
        let mut ok = true;
        let mut live = Vec::new();
        for (size, _) in SIZES {
            match pool.allocate(&mut dev, size, DEFAULT_ALIGN, 0) {
                Ok(b) => live.push(b.addr),
                Err(e) => {
                    eprintln!("pairs: skipping {name}: {e}");
                    ok = false;
                    break;
                }
            }
        }
        for a in live {
            pool.deallocate(&mut dev, a).unwrap();
        }
        if ok {
            out.push((dev, pool));
        }
    }
    out
}

fn pool_pairs<M: Measurement + 'static>(c: &mut Criterion<M>) {
    let mut g = c.benchmark_group(group_name::<M>("pool_pair"));
    for (mut dev, mut pool) in warm_pools() {
        for (size, label) in SIZES {
            let calls = dev.calls_made();
            g.bench_function(BenchmarkId::new(pool.name(), label), |b| {
                b.iter(|| {
                    let blk = pool
                        .allocate(&mut dev, black_box(size), DEFAULT_ALIGN, 0)
                        .unwrap();
                    pool.deallocate(&mut dev, black_box(blk.addr)).unwrap()
                })
            });
            if dev.calls_made() != calls {
                eprintln!(
                    "pairs: {} {label} made {} driver calls (not the hit path)",
                    pool.name(),
                    dev.calls_made() - calls
                );
            }
        }
        pool.validate().unwrap();
    }
    g.finish();
}

fn pool_mixed<M: Measurement + 'static>(c: &mut Criterion<M>) {
    let (blocks, order) = mixed_batch();
    let mut g = c.benchmark_group(group_name::<M>("pool_mixed"));
    g.throughput(Throughput::Elements(BATCH as u64));
    for (mut dev, mut pool) in warm_pools() {
        let mut addrs = vec![0u64; BATCH];
        g.bench_function(pool.name(), |b| {
            b.iter(|| {
                for (i, &(size, align)) in blocks.iter().enumerate() {
                    addrs[i] = pool.allocate(&mut dev, size, align, 0).unwrap().addr;
                }
                for &i in &order {
                    pool.deallocate(&mut dev, addrs[i]).unwrap();
                }
            })
        });
        pool.validate().unwrap();
    }
    g.finish();
}

/// `name`, or `cpu/name` under the CPU-time measurement (so the two never share a baseline).
fn group_name<M: 'static>(name: &str) -> String {
    if std::any::TypeId::of::<M>() == std::any::TypeId::of::<CpuTime>() {
        format!("cpu/{name}")
    } else {
        name.to_string()
    }
}

/// CPU time of the calling thread, in nanoseconds (clock_gettime(CLOCK_THREAD_CPUTIME_ID)).
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Criterion measurement: CPU time of the benchmark thread, in nanoseconds.
struct CpuTime;

struct NsFormatter;

impl ValueFormatter for NsFormatter {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "ns (cpu)"
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let (n, unit) = match *t {
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) => (n, "B/s (cpu)"),
            Throughput::Elements(n) => (n, "elem/s (cpu)"),
        };
        for v in values.iter_mut() {
            *v = n as f64 * 1e9 / *v;
        }
        unit
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

impl Measurement for CpuTime {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &NsFormatter
    }
}

criterion_group!(
    name = wall;
    config = Criterion::default().with_measurement(WallTime);
    targets = arena_pairs::<WallTime>, arena_mixed::<WallTime>, arena_crowded::<WallTime>, pool_pairs::<WallTime>, pool_mixed::<WallTime>
);
criterion_group!(
    name = cpu;
    config = Criterion::default().with_measurement(CpuTime);
    targets = arena_pairs::<CpuTime>, arena_mixed::<CpuTime>, arena_crowded::<CpuTime>, pool_pairs::<CpuTime>, pool_mixed::<CpuTime>
);

fn main() {
    if std::env::var_os("GPUMEM_BENCH_CPU").is_some() {
        cpu();
    } else {
        wall();
    }
    Criterion::default().configure_from_args().final_summary();
}
