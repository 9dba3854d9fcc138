//! Trace reading throughput, in MB/s of uncompressed pickle.
//!
//! - `read/synthetic_1M`: a snapshot of 1,000,000 trace entries shaped like PyTorch 2.x's
//!   (`action`, `addr`, `size`, `stream`, `time_us`, `compile_context`, `user_metadata`), with
//!   freed addresses handed out again as a caching allocator does,
//!   pickled by python3 (protocol 4, as `_dump_snapshot` does) into the temp directory at bench
//!   time (skipped when python3 is missing; override the count with GPUMEM_BENCH_EVENTS);
//! - `read/<trace>`: the shipped traces, from the inflated bytes (`pickle`) and from the gzip'd
//!   file end to end (`gz`; the throughput is still counted in uncompressed bytes).
//!
//! Run: `cargo bench -p gpumem-bench --bench read -- --warm-up-time 1 --measurement-time 3`
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpumem::trace::{detect, read_bytes, ReadConfig};
use std::path::{Path, PathBuf};
use std::process::Command;

const MAKE_SNAPSHOT: &str = r#"
import pickle, random, sys
n, out = int(sys.argv[1]), sys.argv[2]
rng = random.Random(7)
trace, live, pool, t = [], [], [], 1_795_942_431_589_050
addr = 0x7f00_0000_0000
while len(trace) < n:
    t += rng.randint(1, 50)
    if live and (len(live) > 400 or rng.random() < 0.5):
        a, s = live.pop(rng.randrange(len(live)))
        pool.append(a)
        for act in ("free_requested", "free_completed"):
            trace.append({"action": act, "addr": a, "size": s, "stream": 0, "time_us": t,
                          "compile_context": "N/A", "user_metadata": ""})
    else:
        s = int(rng.lognormvariate(12, 3)) % (1 << 31) + 1
        # A caching allocator hands the same addresses out again: reuse a freed one 90% of
        # the time, as PyTorch's traces do.
        if pool and rng.random() < 0.9:
            a = pool.pop(rng.randrange(len(pool)))
        else:
            addr += 1 << 20
            a = addr
        live.append((a, s))
        trace.append({"action": "alloc", "addr": a, "size": s, "stream": 0, "time_us": t,
                      "compile_context": "N/A", "user_metadata": ""})
snap = {"segments": [], "device_traces": [trace[:n]], "allocator_settings": {},
        "external_annotations": []}
with open(out, "wb") as f:
    pickle.dump(snap, f, protocol=4)
"#;

fn synthetic(events: usize) -> Option<PathBuf> {
    let path = std::env::temp_dir().join(format!("gpumem-bench-snapshot-v2-{events}.pickle"));
    if path.exists() {
        return Some(path);
    }
    let ok = Command::new("python3")
        .args(["-c", MAKE_SNAPSHOT, &events.to_string()])
        .arg(&path)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        Some(path)
    } else {
        eprintln!("python3 unavailable or failed: skipping the synthetic snapshot");
        None
    }
}

fn traces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces")
}

fn bench_read(c: &mut Criterion) {
    let mut g = c.benchmark_group("read");
    g.sample_size(10);
    let events: usize = std::env::var("GPUMEM_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    if let Some(path) = synthetic(events) {
        let bytes = std::fs::read(&path).expect("read synthetic snapshot");
        let t = read_bytes("synthetic", &bytes, ReadConfig::default()).expect("synthetic reads");
        eprintln!(
            "synthetic: {} bytes, {} events after dropping free_requested",
            bytes.len(),
            t.events.len()
        );
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_function(
            BenchmarkId::new("pickle", format!("synthetic_{events}")),
            |b| b.iter(|| read_bytes("synthetic", &bytes, ReadConfig::default()).expect("reads")),
        );
    }
    for name in [
        "resnet_train",
        "gpt2_train",
        "mixed_sizes",
        "external/finetune_no_timestamps",
    ] {
        let gz = std::fs::read(traces_dir().join(format!("{name}.pickle.gz"))).expect("trace");
        let raw = detect::gunzip(name, &gz).expect("inflates");
        g.throughput(Throughput::Bytes(raw.len() as u64));
        g.bench_function(BenchmarkId::new("pickle", name), |b| {
            b.iter(|| read_bytes(name, &raw, ReadConfig::default()).expect("reads"))
        });
        g.bench_function(BenchmarkId::new("gz", name), |b| {
            b.iter(|| read_bytes(name, &gz, ReadConfig::default()).expect("reads"))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_read);
criterion_main!(benches);
