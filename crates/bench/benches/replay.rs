//! Replay throughput: events per second for each strategy on each shipped trace
//! (target ≥ 10 million events per second per strategy, single thread).
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpumem::core::config::AllocatorConfig;
use gpumem::core::sim::SimDevice;
use gpumem::core::strategy::Strategy;
use gpumem::replay::{self, ReplayConfig};
use gpumem::trace::{read_path, ReadConfig};

fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces")
}

fn bench_replay(c: &mut Criterion) {
    for trace_name in ["resnet_train", "gpt2_train", "mixed_sizes"] {
        let path = traces_dir().join(format!("{trace_name}.pickle.gz"));
        let trace = read_path(&path, ReadConfig::default()).expect("shipped trace reads");
        let events = replay::summarize(&trace, 0).events;
        let mut g = c.benchmark_group(format!("replay/{trace_name}"));
        g.throughput(Throughput::Elements(events));
        g.sample_size(10);
        for strategy in Strategy::ALL {
            let name = strategy.name();
            g.bench_with_input(BenchmarkId::from_parameter(name), &name, |b, _| {
                b.iter(|| {
                    let mut a = strategy.build(&AllocatorConfig::default());
                    let mut d = SimDevice::default();
                    replay::replay(
                        &trace,
                        a.as_mut(),
                        &mut d,
                        &ReplayConfig::default(),
                        &mut |_| {},
                    )
                    .expect("replay runs")
                    .peak_reserved_bytes
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench_replay);
criterion_main!(benches);
