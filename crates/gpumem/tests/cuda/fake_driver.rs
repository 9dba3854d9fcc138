//! The CUDA backend against a fake driver (tests/support/libcuda.c): device memory is
//! host memory, so the FFI plumbing (symbols, arguments, out-pointers), the bookkeeping of
//! segments and VMM objects, stream-ordered reuse with driver events, the canary fill/check
//! and the release of every handle run on machines without a GPU.
//!
//! The harness (tests/support/fakecuda.rs) builds the fake and runs the test again in a
//! child process that loads it.
use gpumem::core::adaptor::Capped;
use gpumem::cuda::bench::{self, AsyncCuda, Budget, Case, ContextBinder, PoolBackend, RawCuda};
use gpumem::cuda::{self, Advice, CudaError, CudaEvents, MemoryType, Stream};
use gpumem::pool::pitch::pitch_bytes;
use gpumem::pool::{DevicePool, PoolConfig};
use gpumem_core::config::AllocatorConfig;
use gpumem_core::strategy::Strategy;
use gpumem_core::{Device, DeviceError, DriverCall};

use crate::common::SegmentPerBlock;
use crate::support::{against_fake_driver, test_name};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

#[test]
fn cuda_backend_against_a_fake_driver() {
    against_fake_driver(
        &test_name(module_path!(), "cuda_backend_against_a_fake_driver"),
        child,
    );
}

fn child() {
    assert!(cuda::driver_present());
    assert_eq!(cuda::device_count().unwrap(), 1);
    assert!(matches!(
        cuda::open(1),
        Err(CudaError::NoDevice {
            ordinal: 1,
            count: 1
        })
    ));
    assert_eq!(cuda::peer_matrix().unwrap(), vec![vec![true]]);
    info_and_segments();
    vmm_and_page_table();
    pool_on_the_driver();
    every_strategy_keeps_canaries();
    managed_and_benchmarks();
}

fn info_and_segments() {
    let mut d = cuda::open(0).unwrap();
    let i = d.info();
    assert_eq!(i.name, "Fake H200");
    assert_eq!(
        (i.total_bytes, i.granularity_bytes, i.driver_version),
        (16 * GIB, 2 * MIB, 13000)
    );
    assert!(i.vmm_supported && i.mempools_supported && i.managed_supported);
    assert_eq!(d.pitch_align_bytes(), 512);
    for w in [1, 512, 513, 5000] {
        assert_eq!(Some(d.driver_pitch(w, 3, 4).unwrap()), pitch_bytes(w, 512));
    }
    let a = d.alloc_segment(3 * MIB).unwrap();
    let p = d.pointer_info(a + 100).unwrap();
    assert_eq!(
        (
            p.device_ordinal,
            p.memory_type,
            p.range_start,
            p.range_bytes
        ),
        (0, MemoryType::Device, a, 3 * MIB)
    );
    assert!(!p.vmm_mapped && !p.managed);
    d.fill_pattern(a, 3 * MIB, 0xfeed_f00d).unwrap();
    assert!(d.check_pattern(a, 3 * MIB, 0xfeed_f00d).unwrap());
    d.fill_pattern(a + 3 * MIB - 8, 4, 9).unwrap(); // damage the tail
    assert!(!d.check_pattern(a, 3 * MIB, 0xfeed_f00d).unwrap());
    match d.alloc_segment(64 * GIB) {
        Err(DeviceError::OutOfMemory {
            requested_bytes,
            capacity_bytes,
            ..
        }) => {
            assert_eq!((requested_bytes, capacity_bytes), (64 * GIB, 16 * GIB));
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    assert_eq!(d.used_bytes(), 3 * MIB);
    d.free_segment(a).unwrap();
    assert!(matches!(
        d.free_segment(a),
        Err(DeviceError::Invalid {
            call: "cuMemFree",
            ..
        })
    ));
    let c = d.counters();
    assert_eq!((c.get(DriverCall::Alloc), c.get(DriverCall::Free)), (2, 1)); // the refused one counts
                                                                             // A capped device refuses before the driver.
    let mut capped = Capped::new(d, 4 * MIB);
    assert!(matches!(
        capped.alloc_segment(5 * MIB),
        Err(DeviceError::OutOfMemory { .. })
    ));
    assert_eq!(capped.counters().get(DriverCall::Alloc), 2);
}

fn vmm_and_page_table() {
    let mut d = cuda::open(0).unwrap();
    let g = d.granularity_bytes();
    let va = gpumem::vmm::demo_arena(&mut d, 8 * g, 4).unwrap();
    let t = d.page_tables();
    assert_eq!((t.len(), t[0].mapped_bytes), (1, 2 * g));
    assert!(d.pointer_info(va + 10).unwrap().vmm_mapped);
    d.fill_pattern(va, g, 0x1357_9bdf).unwrap();
    assert!(d.check_pattern(va, g, 0x1357_9bdf).unwrap());
    d.set_peer_access(va, g, 0, true).unwrap();
    assert!(d.set_peer_access(va, g, 0, false).is_err());
    assert!(
        d.set_peer_access(va + g, g, 0, true).is_err(),
        "a hole is not mapped"
    );
    let book = d.vmm_book().clone();
    gpumem::vmm::teardown(&mut d, &book, va).unwrap();
    assert_eq!(d.used_bytes(), 0);
    // Objects left behind are released when the device is dropped (the fake checks the calls).
    let va2 = d.reserve_va(2 * g).unwrap();
    let h = d.create_physical(g).unwrap();
    d.map(va2, g, h).unwrap();
    assert!(d.map(va2, g, h).is_err());
    assert!(d.unmap(va2, 2 * g).is_err(), "must cover whole mappings");
}

fn pool_on_the_driver() {
    let d = cuda::open(0).unwrap();
    let s1 = Stream::new(d.context()).unwrap();
    let s2 = Stream::new(d.context()).unwrap();
    let events = CudaEvents::new(&d).unwrap();
    let o = PoolConfig {
        reserve_bytes: 0,
        shard_cache_bytes: 0,
        ..PoolConfig::default()
    };
    let pool =
        DevicePool::new(Box::new(SegmentPerBlock::default()), d, Box::new(events), o).unwrap();
    let a = pool.alloc(64 << 10, s1.id()).unwrap();
    let addr = a.addr();
    drop(a);
    s1.synchronize().unwrap();
    let b = pool.alloc(64 << 10, s2.id()).unwrap();
    assert_eq!(b.addr(), addr, "reused on s2 once s1's event completed");
    drop(b);
    assert_eq!(pool.empty_cache().unwrap(), 64 << 10);
    assert_eq!(pool.with_device(|d| d.used_bytes()).unwrap(), 0);
}

fn every_strategy_keeps_canaries() {
    for name in Strategy::ALL.map(Strategy::name) {
        let d = cuda::open(0).unwrap();
        let events = CudaEvents::new(&d).unwrap();
        let pool = DevicePool::new(
            name.parse::<Strategy>()
                .unwrap()
                .build(&AllocatorConfig::default()),
            d,
            Box::new(events),
            PoolConfig::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut blocks = Vec::new();
        for (i, sz) in [256u64, 5000, 3 * MIB, 40 * MIB].into_iter().enumerate() {
            let b = pool
                .alloc(sz, 0)
                .unwrap_or_else(|e| panic!("{name} {sz}: {e}"));
            let pat = 0x7000_0000 + i as u32;
            pool.with_device(|d| d.fill_pattern(b.addr(), sz, pat))
                .unwrap()
                .unwrap();
            blocks.push((b, sz, pat));
        }
        for (b, sz, pat) in &blocks {
            assert!(
                pool.with_device(|d| d.check_pattern(b.addr(), *sz, *pat))
                    .unwrap()
                    .unwrap(),
                "{name}: {sz} B overwritten"
            );
        }
        drop(blocks);
        pool.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        pool.empty_cache().unwrap();
    }
}

fn managed_and_benchmarks() {
    let d = cuda::open(0).unwrap();
    let m = d.alloc_managed(8 * MIB).unwrap();
    m.advise(Advice::PreferDevice).unwrap();
    m.advise(Advice::ReadMostly).unwrap();
    m.prefetch(true).unwrap();
    assert!(d.pointer_info(m.addr()).unwrap().managed);
    drop(m);
    assert!(matches!(
        d.alloc_managed(16 * GIB),
        Err(CudaError::ManagedRefused { .. })
    ));
    let budget = Budget {
        time: std::time::Duration::from_millis(5),
        max_pairs: 200,
    };
    let raw = RawCuda {
        ctx: ContextBinder::of(&d),
    };
    assert!(
        bench::measure(&raw, Case::Fixed(4096), 2, budget)
            .unwrap()
            .pairs
            >= 32
    );
    let asy = AsyncCuda::new(&d, 2).unwrap();
    assert!(bench::measure(&asy, Case::Mixed, 2, budget).unwrap().pairs >= 2000);
    drop(asy);
    let events = CudaEvents::new(&d).unwrap();
    let pool = DevicePool::new(
        Box::new(SegmentPerBlock::default()),
        cuda::open(0).unwrap(),
        Box::new(events),
        PoolConfig::default(),
    )
    .unwrap();
    let b = PoolBackend {
        pool: &pool,
        streams: vec![0, 0],
        ctx: Some(ContextBinder::of(&d)),
    };
    let r = bench::measure(&b, Case::Fixed(1 << 20), 2, budget).unwrap();
    assert!(r.pairs >= 32 && r.median_ns > 0.0);
    let s = pool.stats().unwrap();
    assert!(s.cache_hits > s.cache_misses, "{s:?}");
}
