//! GPU tests of the CUDA backend. Run on the device machine through scripts/gpu-check.sh
//! (`cuda_device-* --ignored --test-threads 1`).
use gpumem::cuda::bench::{self, AsyncCuda, Budget, Case, ContextBinder, PoolBackend, RawCuda};
use gpumem::cuda::{self, Advice, CudaError, CudaEvents, MemoryType, Stream};
use gpumem::pool::pitch::pitch_bytes;
use gpumem::pool::{DevicePool, PoolConfig};
use gpumem_core::config::AllocatorConfig;
use gpumem_core::strategy::Strategy;
use gpumem_core::{Device, DeviceError, DriverCall};

use crate::common::SegmentPerBlock;

const MIB: u64 = 1 << 20;

fn dev0() -> gpumem::cuda::CudaDevice {
    cuda::open(0).expect("open cuda:0")
}

#[test]
#[ignore = "needs a CUDA device"]
fn open_reports_sane_figures() {
    let n = cuda::device_count().expect("count");
    assert!(n >= 1);
    let d = dev0();
    let i = d.info();
    assert!(!i.name.is_empty());
    assert!(i.total_bytes > 1 << 30);
    assert!(i.free_bytes <= i.total_bytes && i.free_bytes > 0);
    assert!(i.vmm_supported, "Hopper supports VMM");
    assert!(
        i.granularity_bytes.is_power_of_two(),
        "{}",
        i.granularity_bytes
    );
    assert!(i.recommended_granularity_bytes >= i.granularity_bytes);
    assert_eq!(d.granularity_bytes(), i.granularity_bytes);
    assert!(i.driver_version >= 12000);
    let m = cuda::peer_matrix().expect("peers");
    assert_eq!(m.len(), n);
    assert!((0..n).all(|k| m[k][k]));
    assert!(matches!(cuda::open(n), Err(CudaError::NoDevice { .. })));
}

#[test]
#[ignore = "needs a CUDA device"]
fn segment_pointer_attributes_and_canary() {
    let mut d = dev0();
    let a = d.alloc_segment(MIB).expect("alloc");
    assert_eq!(a % 256, 0);
    let p = d.pointer_info(a + 4096).expect("attrs");
    assert_eq!(p.device_ordinal, 0);
    assert_eq!(p.memory_type, MemoryType::Device);
    assert_eq!(p.range_start, a);
    assert_eq!(p.range_bytes, MIB);
    assert!(!p.managed);
    assert!(!p.vmm_mapped);
    d.fill_pattern(a, MIB, 0xdead_beef).expect("fill");
    assert!(d.check_pattern(a, MIB, 0xdead_beef).expect("check"));
    d.fill_pattern(a + 1000, 8, 0x1234_5678).expect("fill part");
    assert!(!d.check_pattern(a, MIB, 0xdead_beef).expect("check"));
    assert!(d.check_pattern(a, 1000, 0xdead_beef).expect("check head"));
    assert_eq!(d.used_bytes(), MIB);
    d.free_segment(a).expect("free");
    assert_eq!(d.used_bytes(), 0);
    // A large block is checked at its ends and at sampled windows: damage at either end shows.
    let big = 64 * MIB;
    let b = d.alloc_segment(big).expect("alloc");
    d.fill_pattern(b, big, 0x0bad_f00d).expect("fill");
    assert!(d.check_pattern(b, big, 0x0bad_f00d).expect("check"));
    d.fill_pattern(b + big - 256, 256, 1).expect("damage tail");
    assert!(!d.check_pattern(b, big, 0x0bad_f00d).expect("check"));
    d.fill_pattern(b + big - 256, 256, 0x0bad_f00d)
        .expect("repair");
    d.fill_pattern(b + 4096, 4, 1).expect("damage head");
    assert!(!d.check_pattern(b, big, 0x0bad_f00d).expect("check"));
    d.free_segment(b).expect("free");
    let c = d.counters();
    assert_eq!((c.get(DriverCall::Alloc), c.get(DriverCall::Free)), (2, 2));
    assert!(c.seconds > 0.0);
    assert!(matches!(
        d.free_segment(a),
        Err(DeviceError::Invalid { .. })
    ));
}

#[test]
#[ignore = "needs a CUDA device"]
fn vmm_arena_maps_fills_and_unwinds() {
    let mut d = dev0();
    let g = d.granularity_bytes();
    let va = d.reserve_va(4 * g).expect("reserve");
    let h0 = d.create_physical(g).expect("create");
    let h1 = d.create_physical(g).expect("create");
    d.map(va, g, h0).expect("map");
    d.map(va + g, g, h1).expect("map");
    d.set_access(va, 2 * g).expect("access"); // one call over two mappings
    let p = d.pointer_info(va + g + 64).expect("attrs");
    assert_eq!(p.device_ordinal, 0);
    assert!(p.vmm_mapped);
    assert_eq!(p.vmm_handle, Some(h1.0));
    d.fill_pattern(va, 2 * g, 0x5a5a_5a5a)
        .expect("fill across pages");
    assert!(d.check_pattern(va, 2 * g, 0x5a5a_5a5a).expect("check"));
    let t = d.page_tables();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].mapped_bytes, 2 * g);
    assert_eq!(t[0].rows.len(), 3); // two mapped, one hole
                                    // Peer access: granting our own device again is legal; revoking it is refused.
    d.set_peer_access(va, 2 * g, 0, true).expect("grant self");
    assert!(d.set_peer_access(va, 2 * g, 0, false).is_err());
    // cuMemSetAccess calls so far: the set_access above and the self grant (the refused
    // revoke never reaches the driver).
    let mut set_access_calls = 2;
    // With a second device that can reach this one, grant and revoke its access too (two
    // more cuMemSetAccess calls); on one device this part is skipped.
    if cuda::device_count().expect("count") >= 2 && cuda::peer_matrix().expect("m")[1][0] {
        d.set_peer_access(va, 2 * g, 1, true).expect("grant peer");
        assert_eq!(d.page_tables()[0].rows[0].access, vec![0, 1]);
        d.set_peer_access(va, 2 * g, 1, false).expect("revoke peer");
        assert_eq!(d.page_tables()[0].rows[0].access, vec![0]);
        set_access_calls += 2;
    }
    assert!(
        d.map(va, g, h0).is_err(),
        "double map refused before the driver"
    );
    d.unmap(va, 2 * g).expect("unmap both");
    d.release_physical(h0).expect("release");
    d.release_physical(h1).expect("release");
    d.free_va(va, 4 * g).expect("free va");
    assert_eq!(d.used_bytes(), 0);
    let c = d.counters();
    assert_eq!(c.get(DriverCall::Create), 2);
    assert_eq!(c.get(DriverCall::Map), 2);
    assert_eq!(c.get(DriverCall::SetAccess), set_access_calls);
    d.synchronize().expect("context healthy");
}

#[test]
#[ignore = "needs a CUDA device"]
fn pitch_matches_cu_mem_alloc_pitch() {
    let d = dev0();
    let align = d.pitch_align_bytes();
    for w in [1u64, 100, 511, 512, 513, 1000, 4096, 5000, 65_537] {
        let driver = d.driver_pitch(w, 4, 4).expect("cuMemAllocPitch");
        assert_eq!(
            Some(driver),
            pitch_bytes(w, align),
            "width {w}, align {align}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn driver_oom_is_an_error_value_and_leaves_nothing_pending() {
    let mut d = dev0();
    let total = d.capacity_bytes();
    match d.alloc_segment(total * 4) {
        Err(DeviceError::OutOfMemory {
            requested_bytes,
            capacity_bytes,
            ..
        }) => {
            assert_eq!(requested_bytes, total * 4);
            assert_eq!(capacity_bytes, total);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    let a = d.alloc_segment(MIB).expect("small alloc after OOM");
    d.synchronize().expect("no sticky error");
    d.free_segment(a).expect("free");
}

#[test]
#[ignore = "needs a CUDA device"]
fn pool_stream_ordered_reuse_with_real_events() {
    let d = dev0();
    let s1 = Stream::new(d.context()).expect("stream");
    let s2 = Stream::new(d.context()).expect("stream");
    let events = CudaEvents::new(&d).expect("events");
    let o = PoolConfig {
        reserve_bytes: 0,
        shard_cache_bytes: 0,
        ..PoolConfig::default()
    };
    let pool = DevicePool::new(Box::new(SegmentPerBlock::default()), d, Box::new(events), o)
        .expect("pool");
    let a = pool.alloc(64 * 1024, s1.id()).expect("alloc");
    let addr = a.addr();
    pool.with_device(|d| d.fill_pattern(addr, 64 * 1024, 7))
        .expect("dev")
        .expect("fill");
    drop(a);
    s1.synchronize().expect("sync");
    // The event on s1 has completed: the block is reusable on s2.
    let b = pool.alloc(64 * 1024, s2.id()).expect("alloc");
    assert_eq!(b.addr(), addr);
    drop(b);
    let s = pool.stats().expect("stats");
    assert_eq!(s.live_blocks, 0);
    pool.empty_cache().expect("empty_cache");
    assert_eq!(pool.with_device(|d| d.used_bytes()).expect("dev"), 0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn every_strategy_serves_blocks_with_intact_canaries() {
    for name in Strategy::ALL.map(Strategy::name) {
        let d = dev0();
        let s = Stream::new(d.context()).expect("stream");
        let events = CudaEvents::new(&d).expect("events");
        let pool = DevicePool::new(
            name.parse::<Strategy>()
                .expect("build")
                .build(&AllocatorConfig::default()),
            d,
            Box::new(events),
            PoolConfig::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let sizes = [256u64, 4096, 100_000, 3 * MIB, 64 * MIB];
        let mut blocks = Vec::new();
        for (i, &sz) in sizes.iter().enumerate() {
            let stream = if i % 2 == 0 { 0 } else { s.id() };
            let mut b = pool
                .alloc(sz, stream)
                .unwrap_or_else(|e| panic!("{name} {sz}: {e}"));
            pool.with_device(|d| d.fill_pattern(b.addr(), sz, 0xa000_0000 + i as u32))
                .expect("dev")
                .expect("fill");
            if i == 1 {
                b.record_stream(s.id());
            }
            blocks.push((b, sz, 0xa000_0000 + i as u32));
        }
        for (b, sz, pat) in &blocks {
            let ok = pool
                .with_device(|d| d.check_pattern(b.addr(), *sz, *pat))
                .expect("dev")
                .expect("check");
            assert!(ok, "{name}: block of {sz} B overwritten");
        }
        drop(blocks);
        pool.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        pool.empty_cache().expect("empty_cache");
        pool.with_device(|d| d.synchronize())
            .expect("dev")
            .expect("healthy");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn pool_recovers_from_oom_by_releasing_its_cache() {
    let d = dev0();
    let free = d.mem_info().expect("info").0;
    let s1 = Stream::new(d.context()).expect("stream");
    let s2 = Stream::new(d.context()).expect("stream");
    let events = CudaEvents::new(&d).expect("events");
    let o = PoolConfig {
        reserve_bytes: 0,
        max_cached_block_bytes: u64::MAX,
        shard_cache_bytes: u64::MAX,
        ..PoolConfig::default()
    };
    let pool = DevicePool::new(Box::new(SegmentPerBlock::default()), d, Box::new(events), o)
        .expect("pool");
    // Cache 60 % of free memory for stream s1, then ask for as much on s2: the cached block
    // is not reusable there, the device refuses, the pool flushes, waits, releases, retries.
    let big = free / 10 * 6 / MIB * MIB;
    drop(pool.alloc(big, s1.id()).expect("first"));
    assert_eq!(pool.stats().expect("stats").cached_blocks, 1);
    let b = pool
        .alloc(big, s2.id())
        .expect("recovered by releasing the cached block");
    let s = pool.stats().expect("stats");
    assert_eq!(s.oom_recoveries, 1);
    assert_eq!(s.cached_blocks, 0);
    drop(b);
    pool.empty_cache().expect("empty_cache");
    pool.with_device(|d| d.synchronize())
        .expect("dev")
        .expect("no error left pending");
}

#[test]
#[ignore = "needs a CUDA device"]
fn managed_memory_guard_prefetch_and_advice() {
    let d = dev0();
    let (free, _) = d.mem_info().expect("info");
    let m = d.alloc_managed(64 * MIB).expect("managed");
    assert_eq!(m.size_bytes(), 64 * MIB);
    m.advise(Advice::PreferDevice).expect("advise");
    m.advise(Advice::AccessedByDevice).expect("advise");
    m.prefetch(true).expect("prefetch to device");
    m.prefetch(false).expect("prefetch to host");
    let p = d.pointer_info(m.addr()).expect("attrs");
    assert!(p.managed);
    drop(m);
    assert!(matches!(
        d.alloc_managed(free),
        Err(CudaError::ManagedRefused { .. })
    ));
}

#[test]
#[ignore = "needs a CUDA device"]
fn bench_backends_measure() {
    let d = dev0();
    let budget = Budget {
        time: std::time::Duration::from_millis(20),
        max_pairs: 2000,
    };
    let raw = RawCuda {
        ctx: ContextBinder::of(&d),
    };
    let r = bench::measure(&raw, Case::Fixed(4096), 1, budget).expect("raw");
    assert!(
        r.median_ns > 1000.0,
        "cuMemAlloc+cuMemFree takes microseconds: {}",
        r.median_ns
    );
    let asy = AsyncCuda::new(&d, 2).expect("async");
    let r = bench::measure(&asy, Case::Fixed(4096), 2, budget).expect("async");
    assert!(r.pairs > 0 && r.median_ns > 0.0);
    let ctx = ContextBinder::of(&d);
    let events = CudaEvents::new(&d).expect("events");
    let pool = DevicePool::new(
        Box::new(SegmentPerBlock::default()),
        dev0(),
        Box::new(events),
        PoolConfig::default(),
    )
    .expect("pool");
    let b = PoolBackend {
        pool: &pool,
        streams: vec![0],
        ctx: Some(ctx),
    };
    let r = bench::measure(&b, Case::Fixed(4096), 1, budget).expect("pool");
    assert!(r.median_ns < 5000.0, "cache hit path: {} ns", r.median_ns);
}

#[test]
#[ignore = "needs a CUDA device"]
fn peer_access_per_block_needs_vmm_pages() {
    let n = cuda::device_count().expect("count");
    let d = dev0();
    let events = CudaEvents::new(&d).expect("events");
    let o = PoolConfig {
        reserve_bytes: 0,
        ..PoolConfig::default()
    };
    let paged = DevicePool::new(
        Strategy::Paged.build(&AllocatorConfig::default()),
        d,
        Box::new(events),
        o,
    )
    .expect("pool");
    let b = paged.alloc(3 * MIB, 0).expect("alloc");
    paged.set_peer_access(&b, 0, true).expect("own device");
    if n >= 2 && cuda::peer_matrix().expect("m")[1][0] {
        paged.set_peer_access(&b, 1, true).expect("grant");
        paged.set_peer_access(&b, 1, false).expect("revoke");
    }
    drop(b);
    let d = dev0();
    let events = CudaEvents::new(&d).expect("events");
    let seg = DevicePool::new(Box::new(SegmentPerBlock::default()), d, Box::new(events), o)
        .expect("pool");
    let b = seg.alloc(MIB, 0).expect("alloc");
    assert!(matches!(
        seg.set_peer_access(&b, 0, true),
        Err(gpumem::pool::PoolError::Device(DeviceError::Unsupported(_)))
    ));
}
