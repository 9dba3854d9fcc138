//! The pinned pool's hot path on the mlock fallback: a warm alloc + free pair (no OS call),
//! and the size-class arithmetic alone. Target: warm allocation ≤ 1 µs.
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use gpumem::pinned::size_class::class_bytes;
use gpumem::pinned::{PinnedPool, PinnedPoolConfig};

fn pool_warm(c: &mut Criterion) {
    let pool = PinnedPool::new(PinnedPoolConfig::locked(64 << 20));
    for bytes in [64usize << 10, 1 << 20, 3 << 20] {
        // Warm the cache once; skip where RLIMIT_MEMLOCK refuses even that.
        match pool.alloc(bytes) {
            Ok(b) => drop(b),
            Err(e) => {
                eprintln!("skipping {bytes} B: {e}");
                continue;
            }
        }
        c.bench_function(&format!("pinned_pool_warm_alloc_free_{bytes}"), |b| {
            b.iter(|| {
                let blk = pool.alloc(black_box(bytes)).expect("warm block");
                black_box(blk.as_ptr());
            })
        });
    }
    c.bench_function("pinned_class_bytes", |b| {
        b.iter(|| class_bytes(black_box(300 << 20)))
    });
}

criterion_group!(benches, pool_warm);
criterion_main!(benches);
