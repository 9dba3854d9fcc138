//! Each PYTORCH_CUDA_ALLOC_CONF option with figures derived by hand from PyTorch's code.
use super::*;

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    // max_split_size_mb:64. A 100 MiB block is oversize: a 50 MiB request may not split it
    // and gets a segment of its own (native would split the cached 100 MiB).
    let (mut t, mut d) = with("max_split_size_mb:64", 1 << 40);
    let a = alloc(&mut t, &mut d, 100 * MIB);
    assert_eq!(t.torch_stats().oversize_segments.current, 1);
    assert_eq!(t.torch_stats().oversize_allocations.current, 1);
    free(&mut t, &mut d, a.addr);
    assert_eq!(t.torch_stats().oversize_allocations.current, 0);
    let b = alloc(&mut t, &mut d, 50 * MIB);
    assert_ne!(b.addr, a.addr);
    assert_eq!(t.stats().reserved_bytes.current, 150 * MIB);
    // A request of at least 64 MiB takes the cached 100 MiB block whole when it is less than
    // 20 MiB (max_non_split_rounding_mb) larger: 90 MiB does, 70 MiB does not.
    let c = alloc(&mut t, &mut d, 90 * MIB);
    assert_eq!((c.addr, c.allocated_bytes), (a.addr, 100 * MIB));
    free(&mut t, &mut d, c.addr);
    let e = alloc(&mut t, &mut d, 70 * MIB);
    assert_ne!(e.addr, a.addr);
    assert_eq!(t.stats().reserved_bytes.current, 220 * MIB);
    assert_eq!(t.torch_stats().num_device_alloc, 3);
    // Native reuses: 100 MiB split into 50 + 50, then 90 and 70 get new segments.
    let (mut n, mut nd) = new();
    let a = alloc(&mut n, &mut nd, 100 * MIB);
    free(&mut n, &mut nd, a.addr);
    let b = alloc(&mut n, &mut nd, 50 * MIB);
    assert_eq!(b.addr, a.addr);
    assert_eq!(n.stats().reserved_bytes.current, 100 * MIB);
}

#[test]
fn max_split_size_releases_oversize_blocks_before_the_cache() {
    // 200 MiB device; 100 + 80 MiB cached, free. 150 MiB does not fit beside them: the
    // oversize blocks are freed largest first until they cover 150 MiB (both), and the
    // cudaMalloc is tried again without counting a retry.
    let (mut t, mut d) = with("max_split_size_mb:64", 200 * MIB);
    let a = alloc(&mut t, &mut d, 100 * MIB);
    let b = alloc(&mut t, &mut d, 80 * MIB);
    free(&mut t, &mut d, a.addr);
    free(&mut t, &mut d, b.addr);
    let c = alloc(&mut t, &mut d, 150 * MIB);
    assert_eq!(c.allocated_bytes, 150 * MIB);
    let ts = t.torch_stats();
    assert_eq!(
        (ts.num_device_free, ts.num_alloc_retries, ts.num_ooms),
        (2, 0, 0)
    );
    assert_eq!(t.stats().reserved_bytes.current, 150 * MIB);
    // One block large enough is freed alone: 120 MiB cached beside a 60 MiB live one.
    let (mut t, mut d) = with("max_split_size_mb:64", 200 * MIB);
    let a = alloc(&mut t, &mut d, 120 * MIB);
    let _k = alloc(&mut t, &mut d, 30 * MIB);
    free(&mut t, &mut d, a.addr);
    let _c = alloc(&mut t, &mut d, 110 * MIB); // 120 ≥ 110 + 20? no: reused whole
    assert_eq!(t.torch_stats().num_device_free, 0);
}

#[test]
fn roundup_power2_divisions_round_requests() {
    let (mut t, mut d) = with("roundup_power2_divisions:4", 1 << 40);
    // 5 MiB + 1 lies in [4, 8) MiB, steps of 1 MiB: 6 MiB, from a 20 MiB segment.
    let a = alloc(&mut t, &mut d, 5 * MIB + 1);
    assert_eq!(a.allocated_bytes, 6 * MIB);
    assert_eq!(t.stats().reserved_bytes.current, 20 * MIB);
    // Up to 512 B × 4 plain 512-byte rounding; above it the divisions.
    assert_eq!(alloc(&mut t, &mut d, 1200).allocated_bytes, 1536);
    assert_eq!(alloc(&mut t, &mut d, 2049).allocated_bytes, 2560);
    assert_eq!(alloc(&mut t, &mut d, 700 << 10).allocated_bytes, 768 << 10);
    // Interval list: 8 divisions below 64 MiB, none (plain rounding) from 64 MiB on.
    let (mut t, mut d) = with("roundup_power2_divisions:[32:8,64:0,>:0]", 1 << 40);
    assert_eq!(alloc(&mut t, &mut d, 33 * MIB).allocated_bytes, 36 * MIB);
    assert_eq!(
        alloc(&mut t, &mut d, 64 * MIB + 512).allocated_bytes,
        64 * MIB + 512
    );
}

#[test]
fn garbage_collection_frees_old_segments_past_the_threshold() {
    // A 100 MiB limit with threshold 0.5: past 50 MiB reserved, a cudaMalloc first frees
    // cached whole segments at least as old as the average.
    let conf = TorchConfig {
        allowed_memory_bytes: Some(100 * MIB),
        ..TorchConfig::parse("garbage_collection_threshold:0.5").unwrap()
    };
    let mut t = TorchCachingPool::with_conf(conf);
    let mut d = SimDevice::default();
    let a = alloc(&mut t, &mut d, 30 * MIB);
    let _b = alloc(&mut t, &mut d, 30 * MIB);
    free(&mut t, &mut d, a.addr);
    let _c = alloc(&mut t, &mut d, 40 * MIB);
    assert_eq!(t.torch_stats().num_device_free, 1);
    assert_eq!(t.stats().reserved_bytes.current, 70 * MIB);
    assert_eq!(t.stats().reserved_bytes.peak, 70 * MIB);
    // Without a limit the threshold does nothing (as in PyTorch).
    let (mut t, mut d) = with("garbage_collection_threshold:0.5", 1 << 40);
    let a = alloc(&mut t, &mut d, 30 * MIB);
    let _b = alloc(&mut t, &mut d, 30 * MIB);
    free(&mut t, &mut d, a.addr);
    let _c = alloc(&mut t, &mut d, 40 * MIB);
    assert_eq!(t.torch_stats().num_device_free, 0);
    assert_eq!(t.stats().reserved_bytes.current, 100 * MIB);
}

#[test]
fn memory_limit_refuses_without_a_device_call() {
    let conf = TorchConfig {
        allowed_memory_bytes: Some(50 * MIB),
        ..TorchConfig::default()
    };
    let mut t = TorchCachingPool::with_conf(conf);
    let mut d = SimDevice::default();
    let _a = alloc(&mut t, &mut d, 30 * MIB);
    let calls = d.calls_made();
    let e = t
        .allocate(&mut d, 30 * MIB, 512, 0)
        .expect_err("over the limit");
    assert!(e.is_oom());
    assert_eq!(d.calls_made(), calls);
    let ts = t.torch_stats();
    assert_eq!((ts.num_alloc_retries, ts.num_ooms), (1, 1));
    // per_process_memory_fraction does the same from the device capacity.
    let (mut t, mut d) = with("per_process_memory_fraction:0.5", 100 * MIB);
    let _a = alloc(&mut t, &mut d, 30 * MIB);
    assert!(t.allocate(&mut d, 30 * MIB, 512, 0).unwrap_err().is_oom());
}
