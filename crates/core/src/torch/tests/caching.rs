//! PyTorch's caching rules one by one: rounding, pools, splits, merges, best fit, streams, out-of-memory
//! and fault injection at the driver calls.
use super::*;

#[test]
fn rounding_follows_round_size() {
    assert_eq!(round_size(0), Some(512));
    assert_eq!(round_size(1), Some(512));
    assert_eq!(round_size(511), Some(512));
    assert_eq!(round_size(512), Some(512));
    assert_eq!(round_size(513), Some(1024));
    assert_eq!(round_size(1_000_000), Some(1_000_448));
    assert_eq!(round_size(u64::MAX), None);
    let (mut t, mut d) = new();
    let b = alloc(&mut t, &mut d, 513);
    assert_eq!((b.requested_bytes, b.allocated_bytes), (513, 1024));
    let s = t.stats();
    assert_eq!(s.requested_bytes.current, 513);
    assert_eq!(s.allocated_bytes.current, 1024);
}

#[test]
fn pool_choice_and_segment_sizes() {
    assert_eq!(PoolKind::for_size(MIB), PoolKind::Small);
    assert_eq!(PoolKind::for_size(MIB + 512), PoolKind::Large);
    assert_eq!(allocation_size(MIB), Some(2 * MIB));
    assert_eq!(allocation_size(MIB + 512), Some(20 * MIB));
    assert_eq!(allocation_size(10 * MIB - 512), Some(20 * MIB));
    assert_eq!(allocation_size(10 * MIB), Some(10 * MIB));
    assert_eq!(allocation_size(10 * MIB + 512), Some(12 * MIB));
    for (req, seg, pool) in [
        (MIB, 2 * MIB, PoolKind::Small),
        (5 * MIB, 20 * MIB, PoolKind::Large),
        (11 * MIB, 12 * MIB, PoolKind::Large),
    ] {
        let (mut t, mut d) = new();
        alloc(&mut t, &mut d, req);
        let segs = t.segments();
        assert_eq!(segs.len(), 1, "request {req}");
        assert_eq!((segs[0].1, segs[0].2), (seg, pool), "request {req}");
        assert_eq!(t.stats().reserved_bytes.current, seg);
        assert_eq!(d.used_bytes(), seg);
        assert_eq!(t.torch_stats().num_device_alloc, 1);
    }
}

#[test]
fn split_thresholds() {
    assert!(should_split(PoolKind::Small, 2 * MIB, 2 * MIB - 512));
    assert!(!should_split(PoolKind::Small, 2 * MIB, 2 * MIB));
    assert!(should_split(PoolKind::Large, 20 * MIB, 19 * MIB - 512));
    assert!(!should_split(PoolKind::Large, 20 * MIB, 19 * MIB));

    // Small pool: 1 MiB + 512 B left of a 2 MiB segment is split off.
    let (mut t, mut d) = new();
    let a = alloc(&mut t, &mut d, MIB - 512);
    assert_eq!(a.allocated_bytes, MIB - 512);
    assert_eq!(t.torch_stats().inactive_split_bytes.current, MIB + 512);
    assert_eq!(t.torch_stats().inactive_split.current, 1);

    // Large pool: 12 MiB request in a 12 MiB segment: no split. A 19 MiB request from
    // a cached 20 MiB block leaves exactly 1 MiB: not split either.
    let (mut t, mut d) = new();
    let b = alloc(&mut t, &mut d, 5 * MIB); // 20 MiB segment, 15 MiB remainder split
    assert_eq!(b.allocated_bytes, 5 * MIB);
    free(&mut t, &mut d, b.addr);
    let c = alloc(&mut t, &mut d, 19 * MIB);
    assert_eq!(c.allocated_bytes, 20 * MIB);
    assert_eq!(c.addr, b.addr);
    assert_eq!(t.torch_stats().inactive_split.current, 0);
    free(&mut t, &mut d, c.addr);
    let e = alloc(&mut t, &mut d, 19 * MIB - 512);
    assert_eq!(e.allocated_bytes, 19 * MIB - 512);
    assert_eq!(t.torch_stats().inactive_split_bytes.current, MIB + 512);
    assert_eq!(t.torch_stats().num_device_alloc, 1);
}

#[test]
fn merge_on_free() {
    let (mut t, mut d) = new();
    let a = alloc(&mut t, &mut d, 4096);
    let b = alloc(&mut t, &mut d, 4096);
    let c = alloc(&mut t, &mut d, 4096);
    assert_eq!(b.addr, a.addr + 4096);
    assert_eq!(c.addr, b.addr + 4096);
    free(&mut t, &mut d, a.addr);
    free(&mut t, &mut d, c.addr); // merges with the tail remainder
    assert_eq!(t.torch_stats().inactive_split.current, 2);
    assert_eq!(t.stats().largest_free_bytes, 2 * MIB - 8192);
    free(&mut t, &mut d, b.addr); // merges both sides: the segment is whole again
    let s = t.stats();
    assert_eq!(s.largest_free_bytes, 2 * MIB);
    assert_eq!(s.free_bytes, 2 * MIB);
    assert_eq!(t.torch_stats().inactive_split.current, 0);
    assert_eq!(t.torch_stats().inactive_split_bytes.current, 0);
    // The whole segment can be handed out again at its base.
    let w = alloc(&mut t, &mut d, MIB);
    assert_eq!(w.addr, a.addr);
    assert_eq!(t.empty_cache(&mut d).expect("release"), 0);
    free(&mut t, &mut d, w.addr);
    assert_eq!(t.empty_cache(&mut d).expect("release"), 2 * MIB);
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
    assert_eq!(t.stats().reserved_bytes.current, 0);
    assert_eq!(t.torch_stats().num_device_free, 1);
}

#[test]
fn reuse_is_best_fit_then_lowest_address() {
    let (mut t, mut d) = new();
    // Three large blocks in one 20 MiB segment with gaps of 3 and 2 MiB.
    let a = alloc(&mut t, &mut d, 3 * MIB);
    let _k1 = alloc(&mut t, &mut d, 2 * MIB);
    let b = alloc(&mut t, &mut d, 2 * MIB);
    let _k2 = alloc(&mut t, &mut d, 2 * MIB);
    free(&mut t, &mut d, a.addr);
    free(&mut t, &mut d, b.addr);
    // 2 MiB fits the 2 MiB hole best, not the first (3 MiB) hole nor the 11 MiB tail.
    let c = alloc(&mut t, &mut d, 2 * MIB);
    assert_eq!(c.addr, b.addr);
    // Equal sizes: the lower address wins.
    let e = alloc(&mut t, &mut d, 2 * MIB + 512);
    assert_eq!(e.addr, a.addr);
    assert_eq!(t.torch_stats().num_device_alloc, 1);
}

#[test]
fn streams_do_not_share_blocks() {
    let (mut t, mut d) = new();
    let a = t.allocate(&mut d, 4096, 512, 1).expect("alloc");
    t.deallocate(&mut d, a.addr).expect("free");
    let b = t.allocate(&mut d, 4096, 512, 2).expect("alloc");
    assert_ne!(t.segments()[0].0, t.segments()[1].0);
    assert_eq!(t.torch_stats().num_device_alloc, 2);
    let c = t.allocate(&mut d, 4096, 512, 1).expect("alloc");
    assert_eq!(c.addr, a.addr);
    assert_ne!(b.addr, a.addr);
    t.validate().expect("valid");
}

#[test]
fn oom_releases_cache_then_retries() {
    let mut d = SimDevice::new(24 * MIB);
    let mut t = TorchCachingPool::new(&AllocatorConfig::default());
    let a = alloc(&mut t, &mut d, 12 * MIB); // a 12 MiB segment
    let before = t.stats();
    // 8 MiB wants a 20 MiB segment: 12 + 20 > 24, nothing cached to release.
    let e = t
        .allocate(&mut d, 8 * MIB, 512, 0)
        .expect_err("must not fit");
    assert!(e.is_oom(), "{e}");
    t.validate().expect("valid");
    assert_eq!(t.torch_stats().num_ooms, 1);
    assert_eq!(t.torch_stats().num_alloc_retries, 1);
    let after = t.stats();
    assert_eq!(after.reserved_bytes, before.reserved_bytes);
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(after.allocation_count, before.allocation_count);
    // With `a` freed its segment is cached; 14 MiB does not fit in it, the cudaMalloc
    // of 14 MiB fails (12 + 14 > 24), the cache is released, and the retry succeeds.
    free(&mut t, &mut d, a.addr);
    assert_eq!(t.stats().reserved_bytes.current, 12 * MIB);
    let b = alloc(&mut t, &mut d, 14 * MIB);
    assert_eq!(b.allocated_bytes, 14 * MIB);
    let ts = t.torch_stats();
    assert_eq!(
        (ts.num_alloc_retries, ts.num_device_free, ts.num_ooms),
        (2, 1, 1)
    );
    assert_eq!(ts.num_device_alloc, 2);
    assert_eq!(t.stats().reserved_bytes.current, 14 * MIB);
    assert_eq!(t.stats().reserved_bytes.peak, 14 * MIB);
    assert_eq!(t.stats().alloc_retries, 2);
    assert_eq!(d.used_bytes(), 14 * MIB);
}

#[test]
fn fault_at_cuda_malloc_changes_nothing() {
    let (mut t, mut d) = new();
    let a = alloc(&mut t, &mut d, 4096); // call 0
    let before = t.stats();
    d.inject_fault_at(Some(d.calls_made()));
    // A large request needs cudaMalloc, which fails with a non-OOM error: reported at
    // once, no cache release, no retry (C10_CUDA_CHECK).
    let e = t.allocate(&mut d, 50 * MIB, 512, 0).expect_err("fault");
    assert!(
        matches!(e, AllocError::Device(DeviceError::Driver { .. })),
        "{e}"
    );
    assert!(!e.is_oom());
    t.validate().expect("valid");
    assert_eq!(t.stats(), before);
    assert_eq!(t.torch_stats().num_alloc_retries, 0);
    assert_eq!(t.torch_stats().num_device_alloc, 1);
    // The small pool still serves from its cached segment without the device.
    let b = alloc(&mut t, &mut d, 4096);
    assert_eq!(b.addr, a.addr + 4096);
    // And the device works again.
    let c = alloc(&mut t, &mut d, 50 * MIB);
    assert_eq!(c.allocated_bytes, 50 * MIB);
    assert_eq!(t.torch_stats().num_device_alloc, 2);
}

#[test]
fn fault_at_cuda_free_during_release_keeps_state_valid() {
    let mut d = SimDevice::new(30 * MIB);
    let mut t = TorchCachingPool::new(&AllocatorConfig::default());
    let a = alloc(&mut t, &mut d, 12 * MIB);
    free(&mut t, &mut d, a.addr);
    // cudaMalloc (OOM) is the next call, then the cudaFree of the cached segment.
    d.inject_fault_at(Some(d.calls_made() + 1));
    let e = t.allocate(&mut d, 20 * MIB, 512, 0).expect_err("fault");
    assert!(
        matches!(e, AllocError::Device(DeviceError::Driver { .. })),
        "{e}"
    );
    t.validate().expect("valid");
    assert_eq!(t.stats().reserved_bytes.current, 12 * MIB);
    assert_eq!(t.stats().allocation_count.current, 0);
    let b = alloc(&mut t, &mut d, 20 * MIB);
    assert_eq!(b.allocated_bytes, 20 * MIB);
    assert_eq!(t.stats().reserved_bytes.current, 20 * MIB);
}

#[test]
fn alignment_up_to_granularity() {
    let (mut t, mut d) = new();
    for align in [1, 256, 512] {
        let b = t.allocate(&mut d, 100, align, 0).expect("alloc");
        assert_eq!(b.allocated_bytes, 512);
    }
    let _spacer = alloc(&mut t, &mut d, 512);
    let b = t.allocate(&mut d, 100, 4096, 0).expect("alloc");
    assert_eq!(b.addr % 4096, 0);
    assert_eq!(b.requested_bytes, 100);
    assert_eq!(b.allocated_bytes, 4096);
    t.validate().expect("valid");
    t.deallocate(&mut d, b.addr).expect("free");
    let big = t.allocate(&mut d, 3 * MIB, 2 * MIB, 0).expect("alloc");
    assert_eq!(big.addr % (2 * MIB), 0);
    t.validate().expect("valid");
    for bad in [0, 3, 4 * MIB] {
        assert!(matches!(
            t.allocate(&mut d, 100, bad, 0),
            Err(AllocError::InvalidAlignment { .. })
        ));
    }
    assert!(matches!(
        t.allocate(&mut d, u64::MAX - 100, 512, 0),
        Err(AllocError::Overflow { .. })
    ));
    assert!(matches!(
        t.allocate(&mut d, u64::MAX - 100, 4096, 0),
        Err(AllocError::Overflow { .. })
    ));
    t.validate().expect("valid");
}

#[test]
fn unknown_and_double_free_change_nothing() {
    let (mut t, mut d) = new();
    let a = alloc(&mut t, &mut d, 4096);
    assert!(matches!(
        t.deallocate(&mut d, a.addr + 512),
        Err(AllocError::UnknownBlock { .. })
    ));
    free(&mut t, &mut d, a.addr);
    let s = t.stats();
    assert!(matches!(
        t.deallocate(&mut d, a.addr),
        Err(AllocError::UnknownBlock { .. })
    ));
    assert_eq!(t.stats(), s);
    t.validate().expect("valid");
}

#[test]
fn zero_bytes_is_a_null_block() {
    let (mut t, mut d) = new();
    let b = t.allocate(&mut d, 0, 512, 0).unwrap();
    assert_eq!((b.addr, b.requested_bytes, b.allocated_bytes), (0, 0, 0));
    assert_eq!(d.calls_made(), 0);
    assert_eq!(t.stats(), Stats::default());
    t.deallocate(&mut d, 0).unwrap();
    assert!(matches!(
        t.deallocate(&mut d, 0),
        Err(AllocError::UnknownBlock { addr: 0 })
    ));
    t.validate().unwrap();
}
