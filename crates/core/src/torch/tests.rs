//! Unit tests of the emulation: PyTorch's rules one by one, each option with figures derived
//! by hand from PyTorch's code, fault injection at every driver call, and a property test
//! that runs `validate()` after every operation.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::sim::SimDevice;
use crate::Block;
use std::collections::BTreeMap;

const MIB: u64 = 1 << 20;

fn new() -> (TorchCachingPool, SimDevice) {
    (
        TorchCachingPool::new(&AllocatorConfig::default()),
        SimDevice::default(),
    )
}

fn alloc(t: &mut TorchCachingPool, d: &mut SimDevice, size: u64) -> Block {
    let b = t.allocate(d, size, 512, 0).expect("allocate");
    t.validate().expect("valid");
    b
}

fn free(t: &mut TorchCachingPool, d: &mut SimDevice, addr: u64) {
    t.deallocate(d, addr).expect("deallocate");
    t.validate().expect("valid");
}

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

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: u64,
        stream: u64,
        align_shift: u32,
    },
    Free(usize),
    /// A free requested while other streams still use the block ([`Allocator::free_requested`]).
    Request(usize),
    Release,
    /// A segment made before the allocator existed ([`Allocator::adopt_segment`]): bytes,
    /// small pool, stream, and its live blocks as (gap before, size) in 512-byte units.
    Adopt {
        bytes: u64,
        small: bool,
        stream: u64,
        blocks: Vec<(u64, u64)>,
    },
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        5 => (0u64..3 * MIB, 0u64..2, 0u32..13).prop_map(|(size, stream, a)| Op::Alloc {
            size,
            stream,
            align_shift: a,
        }),
        2 => (3 * MIB..40 * MIB, 0u64..2).prop_map(|(size, stream)| Op::Alloc {
            size,
            stream,
            align_shift: 9,
        }),
        1 => Just(Op::Alloc { size: 0, stream: 0, align_shift: 9 }),
        5 => any::<usize>().prop_map(Op::Free),
        2 => any::<usize>().prop_map(Op::Request),
        1 => Just(Op::Release),
        1 => (
            1u64..24,
            any::<bool>(),
            0u64..2,
            proptest::collection::vec((0u64..4096, 1u64..4096), 0..5),
        )
            .prop_map(|(pages, small, stream, blocks)| Op::Adopt {
                bytes: if small { 2 * MIB } else { pages * 2 * MIB },
                small,
                stream,
                blocks,
            }),
    ]
}

/// The settings the property test runs under, each with a 128 MiB device (`paged-lazy`:
/// [`TorchCachingPool::paged_lazy`], expandable segments with coarse handles).
const PROP_CONFS: [&str; 7] = [
    "paged-lazy",
    "",
    "max_split_size_mb:20",
    "roundup_power2_divisions:[1:2,4:4,>:8]",
    "expandable_segments:True",
    "garbage_collection_threshold:0.5,per_process_memory_fraction:0.8",
    "expandable_segments:True,max_split_size_mb:32,roundup_power2_divisions:4",
];

proptest::proptest! {
    #[test]
    fn random_operations_keep_every_invariant(
        ops in proptest::collection::vec(op(), 1..200),
        conf in 0usize..PROP_CONFS.len(),
    ) {
        let mut d = SimDevice::new(128 * MIB);
        let coarse = PROP_CONFS[conf] == "paged-lazy";
        let mut t = if coarse {
            TorchCachingPool::paged_lazy(&AllocatorConfig::default())
        } else {
            TorchCachingPool::with_conf(TorchConfig::parse(PROP_CONFS[conf]).unwrap())
        };
        // user address -> end of the user's bytes
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        let mut nulls = 0u64;
        for o in ops {
            match o {
                Op::Alloc { size, stream, align_shift } => {
                    let align = 1u64 << align_shift;
                    let before = t.stats();
                    let calls = d.calls_made();
                    match t.allocate(&mut d, size, align, stream) {
                        Ok(b) if size == 0 => {
                            proptest::prop_assert_eq!(b.addr, 0);
                            proptest::prop_assert_eq!(t.stats(), before);
                            proptest::prop_assert_eq!(d.calls_made(), calls);
                            nulls += 1;
                        }
                        Ok(b) => {
                            proptest::prop_assert_eq!(b.addr % align, 0);
                            proptest::prop_assert!(b.allocated_bytes >= size);
                            let end = b.addr + size;
                            if let Some((_, &pe)) = live.range(..=b.addr).next_back() {
                                proptest::prop_assert!(pe <= b.addr, "overlap below");
                            }
                            if let Some((&na, _)) = live.range(b.addr..).next() {
                                proptest::prop_assert!(na >= end, "overlap above");
                            }
                            live.insert(b.addr, end);
                        }
                        Err(e) => {
                            proptest::prop_assert!(e.is_oom(), "{}", e);
                            let after = t.stats();
                            proptest::prop_assert_eq!(after.allocated_bytes, before.allocated_bytes);
                            proptest::prop_assert_eq!(after.requested_bytes, before.requested_bytes);
                        }
                    }
                }
                Op::Free(i) => {
                    if i % 7 == 0 && nulls > 0 {
                        t.deallocate(&mut d, 0).unwrap();
                        nulls -= 1;
                    } else if !live.is_empty() {
                        let k = *live.keys().nth(i % live.len()).unwrap();
                        live.remove(&k);
                        t.deallocate(&mut d, k).unwrap();
                    }
                }
                Op::Release => {
                    t.empty_cache(&mut d).unwrap();
                }
                Op::Request(i) => {
                    if !live.is_empty() {
                        let k = *live.keys().nth(i % live.len()).unwrap();
                        let before = t.stats();
                        t.free_requested(&mut d, k).unwrap();
                        // Only allocated_bytes (and the allocation count) may drop.
                        let after = t.stats();
                        proptest::prop_assert!(after.allocated_bytes.current <= before.allocated_bytes.current);
                        proptest::prop_assert_eq!(after.requested_bytes, before.requested_bytes);
                        proptest::prop_assert_eq!(after.reserved_bytes, before.reserved_bytes);
                    }
                }
                Op::Adopt { bytes, small, stream, blocks } => {
                    let mut at = 0u64;
                    let blocks: Vec<crate::ForeignBlock> = blocks
                        .iter()
                        .map(|&(gap, size)| {
                            let offset = at + gap * 512;
                            at = offset + size * 512;
                            crate::ForeignBlock {
                                offset,
                                requested_bytes: size * 512 - size % 300,
                                allocated_bytes: None,
                            }
                        })
                        .collect();
                    // Half of them as expandable segments (their pages all mapped).
                    let page = if small { 2 * MIB } else { 20 * MIB };
                    let mapped = (bytes / (2 * MIB)).is_multiple_of(2)
                        .then(|| vec![(0, bytes.div_ceil(page) * page)]);
                    let seg = crate::ForeignSegment { bytes, small_pool: small, stream, blocks, mapped };
                    let before = t.stats();
                    let used = d.used_bytes();
                    match t.adopt_segment(&mut d, &seg) {
                        Ok(Some(got)) => {
                            proptest::prop_assert!(!coarse);
                            proptest::prop_assert_eq!(t.conf().expandable_segments, seg.mapped.is_some());
                            proptest::prop_assert_eq!(got.len(), seg.blocks.len());
                            let taken = seg.mapped.as_ref().map_or(bytes, |r| r[0].1);
                            proptest::prop_assert_eq!(d.used_bytes(), used + taken);
                            for (b, f) in got.iter().zip(&seg.blocks) {
                                proptest::prop_assert_eq!(b.requested_bytes, f.requested_bytes);
                                let end = b.addr + b.requested_bytes;
                                if let Some((_, &pe)) = live.range(..=b.addr).next_back() {
                                    proptest::prop_assert!(pe <= b.addr, "overlap below");
                                }
                                if let Some((&na, _)) = live.range(b.addr..).next() {
                                    proptest::prop_assert!(na >= end, "overlap above");
                                }
                                live.insert(b.addr, end);
                            }
                        }
                        // Not adopted (a layout past the end, a small-pool block over 1 MiB,
                        // expandable segments) or out of memory: nothing changed.
                        Ok(None) | Err(AllocError::OutOfMemory { .. }) => {
                            proptest::prop_assert_eq!(t.stats(), before);
                            proptest::prop_assert_eq!(d.used_bytes(), used);
                        }
                        Err(e) => proptest::prop_assert!(false, "{}", e),
                    }
                }
            }
            t.validate().unwrap();
            proptest::prop_assert_eq!(t.stats().reserved_bytes.current, d.used_bytes());
        }
        for k in live.keys() {
            t.deallocate(&mut d, *k).unwrap();
        }
        for _ in 0..nulls {
            t.deallocate(&mut d, 0).unwrap();
        }
        proptest::prop_assert!(t.deallocate(&mut d, 0).is_err());
        t.validate().unwrap();
        t.empty_cache(&mut d).unwrap();
        t.validate().unwrap();
        let (segs, reserved, maps, handles) = d.live_objects();
        proptest::prop_assert_eq!((segs, maps, handles), (0, 0, 0));
        if !t.conf().expandable_segments || coarse {
            // (An expandable segment whose first mapping ran out of memory keeps its range
            // with nothing mapped, as in PyTorch: release_blocks only visits mapped blocks.
            // With coarse handles it gives the range back at once.)
            proptest::prop_assert_eq!(reserved, 0);
        }
        proptest::prop_assert_eq!(t.stats().reserved_bytes.current, 0);
        proptest::prop_assert_eq!(t.stats().free_bytes, 0);
        if !t.conf().expandable_segments {
            // (Expandable segments count map and unmap steps, which need not pair up.)
            proptest::prop_assert_eq!(t.torch_stats().num_device_alloc, t.torch_stats().num_device_free);
        }
        // Everything came back: the whole device (to a whole number of 20 MiB pages, within
        // the memory limit) can be taken again.
        let limit = t.conf().allowed_bytes(128 * MIB).unwrap_or(128 * MIB);
        let mut whole = limit / (20 * MIB) * (20 * MIB);
        while round_size_with(whole, t.conf()).unwrap().div_ceil(20 * MIB) * (20 * MIB) > limit {
            whole -= 20 * MIB;
        }
        let all = t.allocate(&mut d, whole, 512, 0);
        proptest::prop_assert!(all.is_ok(), "{:?}", all);
    }
}

fn with(conf: &str, capacity: u64) -> (TorchCachingPool, SimDevice) {
    (
        TorchCachingPool::with_conf(TorchConfig::parse(conf).unwrap()),
        SimDevice::new(capacity),
    )
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

#[test]
fn expandable_segments_grow_one_range() {
    use crate::device::DriverCall;
    let (mut t, mut d) = with("expandable_segments:True", 1 << 30);
    // 5 MiB: a range is reserved and one 20 MiB page mapped; the block splits at 512 B.
    let a = alloc(&mut t, &mut d, 5 * MIB);
    assert_eq!(t.stats().reserved_bytes.current, 20 * MIB);
    // 30 MiB: the free 15 MiB tail plus one more page, merged: the block follows `a`.
    let b = alloc(&mut t, &mut d, 30 * MIB);
    assert_eq!(b.addr, a.addr + 5 * MIB);
    assert_eq!(t.stats().reserved_bytes.current, 40 * MIB);
    let c = d.counters();
    assert_eq!(
        [
            DriverCall::Alloc,
            DriverCall::Reserve,
            DriverCall::Create,
            DriverCall::Map,
            DriverCall::SetAccess
        ]
        .map(|k| c.get(k)),
        [0, 1, 2, 2, 2]
    );
    assert_eq!(t.torch_stats().num_device_alloc, 2);
    assert_eq!(t.segments(), vec![(a.addr, 40 * MIB, PoolKind::Large)]);
    // Small requests get their own range with 2 MiB pages.
    let s = alloc(&mut t, &mut d, 1000);
    assert_eq!(s.allocated_bytes, 1024);
    assert_eq!(t.stats().reserved_bytes.current, 42 * MIB);
    // Nothing is unmapped on free; empty_cache unmaps every free page and gives the
    // ranges back.
    free(&mut t, &mut d, a.addr);
    free(&mut t, &mut d, b.addr);
    free(&mut t, &mut d, s.addr);
    assert_eq!(t.stats().reserved_bytes.current, 42 * MIB);
    assert_eq!(t.empty_cache(&mut d).unwrap(), 42 * MIB);
    t.validate().unwrap();
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
    assert_eq!(t.stats().reserved_bytes.current, 0);
    // Native for the same two requests: a 20 MiB and a 30 MiB segment.
    let (mut n, mut nd) = new();
    alloc(&mut n, &mut nd, 5 * MIB);
    alloc(&mut n, &mut nd, 30 * MIB);
    assert_eq!(n.stats().reserved_bytes.current, 50 * MIB);
}

#[test]
fn expandable_segments_prefer_fixed_blocks_and_unmap_partly() {
    let (mut t, mut d) = with("expandable_segments:True", 1 << 30);
    let a = alloc(&mut t, &mut d, 8 * MIB);
    let b = alloc(&mut t, &mut d, 4 * MIB);
    let _k = alloc(&mut t, &mut d, 4 * MIB); // [a 8][b 4][k 4][free 4 | unmapped ...]
    free(&mut t, &mut d, b.addr);
    // 4 MiB fits both the hole of `b` and the 4 MiB tail; the tail can grow into unmapped
    // space, so the hole wins.
    let c = alloc(&mut t, &mut d, 4 * MIB);
    assert_eq!(c.addr, b.addr);
    // Freeing `a` leaves an 8 MiB free block inside the first 20 MiB page: nothing whole
    // to unmap.
    free(&mut t, &mut d, a.addr);
    assert_eq!(t.empty_cache(&mut d).unwrap(), 0);
    assert_eq!(t.stats().reserved_bytes.current, 20 * MIB);
    t.validate().unwrap();
}

#[test]
fn expandable_segments_fault_at_every_call_changes_nothing() {
    for fault in 0..12 {
        let (mut t, mut d) = with("expandable_segments:True", 1 << 30);
        let a = alloc(&mut t, &mut d, 5 * MIB);
        let before = (t.stats(), d.used_bytes());
        d.inject_fault_at(Some(d.calls_made() + fault));
        match t.allocate(&mut d, 50 * MIB, 512, 0) {
            Ok(_) => {}
            Err(e) => {
                assert!(
                    matches!(e, AllocError::Device(DeviceError::Driver { .. })),
                    "{e}"
                );
                assert_eq!(
                    (t.stats().allocated_bytes, d.used_bytes()),
                    (before.0.allocated_bytes, before.1),
                    "fault {fault}"
                );
            }
        }
        t.validate().unwrap();
        d.inject_fault_at(None);
        free(&mut t, &mut d, a.addr);
        t.validate().unwrap();
    }
}

/// `paged-lazy` ([`TorchCachingPool::paged_lazy`]): the placement and figures of
/// `expandable_segments:True` (here, where the small pool grows once), but one handle per
/// growth.
#[test]
fn coarse_handles_map_a_growth_in_three_calls_and_place_as_pytorch() {
    use crate::device::DriverCall;
    // Room enough that no growth is cut (a handle is at most 1/8 of what a growth leaves
    // free: `coarse_handles_shrink_as_the_device_fills`).
    let mut d = SimDevice::new(16 << 30);
    let mut t = TorchCachingPool::paged_lazy(&AllocatorConfig::default());
    let (mut e, mut ed) = with("expandable_segments:True", 1 << 30);
    assert_eq!(t.name(), "paged-lazy");
    let sizes = [5 * MIB, 100 * MIB, 1000, 30 * MIB];
    let blocks: Vec<Block> = sizes.iter().map(|&s| alloc(&mut t, &mut d, s)).collect();
    let same: Vec<Block> = sizes.iter().map(|&s| alloc(&mut e, &mut ed, s)).collect();
    // PyTorch's placement to the byte, in another address range.
    let offsets = |v: &[Block]| -> Vec<u64> { v.iter().map(|b| b.addr - v[0].addr).collect() };
    assert_eq!(offsets(&blocks[..2]), offsets(&same[..2]));
    assert_eq!(t.stats(), e.stats());
    // Growths: 20 MiB (5 MiB block), 100 MiB more (5 pages), a small-pool page, 20 MiB
    // more: four handles, where PyTorch creates and maps 1 + 5 + 1 + 1.
    let calls = |d: &SimDevice| {
        let c = d.counters();
        [DriverCall::Create, DriverCall::Map, DriverCall::SetAccess].map(|k| c.get(k))
    };
    assert_eq!(calls(&d), [4, 4, 4]);
    assert_eq!(calls(&ed), [8, 8, 4]);
    // A repeated step finds its pages mapped: no call.
    let before = d.calls_made();
    for b in &blocks {
        free(&mut t, &mut d, b.addr);
    }
    for &s in &sizes {
        let b = alloc(&mut t, &mut d, s);
        free(&mut t, &mut d, b.addr);
    }
    assert_eq!(d.calls_made(), before);
    assert_eq!(t.empty_cache(&mut d).unwrap(), 142 * MIB);
    t.validate().unwrap();
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
}

/// `paged-lazy` refuses a block larger than the whole device without a driver call and keeps
/// its cache; the emulation of PyTorch asks the device (and releases its cache first, as
/// PyTorch does on an out-of-memory).
#[test]
fn paged_lazy_refuses_a_block_above_the_device_without_a_call() {
    let cap = 1u64 << 30;
    for size in [cap + 1, 1 << 62] {
        let mut d = SimDevice::new(cap);
        let mut t = TorchCachingPool::paged_lazy(&AllocatorConfig::default());
        let b = alloc(&mut t, &mut d, 30 * MIB);
        free(&mut t, &mut d, b.addr);
        let (calls, reserved) = (d.calls_made(), t.stats().reserved_bytes.current);
        let err = t.allocate(&mut d, size, 512, 0).unwrap_err();
        assert!(err.is_oom(), "{err}");
        assert_eq!(d.calls_made(), calls, "{size}");
        assert_eq!(
            t.stats().reserved_bytes.current,
            reserved,
            "the cache stays"
        );
        assert_eq!(t.torch_stats().num_ooms, 1);
        t.validate().unwrap();
        // The cached pages still serve the next block with no call.
        let b = alloc(&mut t, &mut d, 30 * MIB);
        assert_eq!(d.calls_made(), calls);
        free(&mut t, &mut d, b.addr);
        let (mut e, mut ed) = with("expandable_segments:True", cap);
        let b = alloc(&mut e, &mut ed, 30 * MIB);
        free(&mut e, &mut ed, b.addr);
        let calls = ed.calls_made();
        assert!(e.allocate(&mut ed, size, 512, 0).is_err());
        assert!(ed.calls_made() > calls, "the emulation asks the device");
    }
}

/// A handle is unmapped whole or not at all: `empty_cache` gives back the handles that lie
/// whole inside free blocks and keeps one that a live block still touches, where PyTorch
/// (a handle per 20 MiB page) unmaps the free pages of it.
#[test]
fn coarse_handles_unmap_only_whole_handles() {
    let mut d = SimDevice::new(1 << 30);
    let mut t = TorchCachingPool::paged_lazy(&AllocatorConfig::default());
    let (mut e, mut ed) = with("expandable_segments:True", 1 << 30);
    for (t, d) in [(&mut t, &mut d), (&mut e, &mut ed)] {
        // [a 30 MiB | b 5 MiB | 5 MiB free]: one 40 MiB growth.
        let a = alloc(t, d, 30 * MIB);
        let b = alloc(t, d, 5 * MIB);
        let c = alloc(t, d, 50 * MIB); // a second growth, its own handle
        free(t, d, a.addr);
        free(t, d, c.addr);
        t.empty_cache(d).unwrap();
        t.validate().unwrap();
        free(t, d, b.addr);
    }
    // Coarse: the 60 MiB handle of `c` (minus nothing) went, the 40 MiB one that `b`
    // touches stayed; PyTorch also unmapped the first 20 MiB page, free under `a`.
    assert_eq!(t.stats().reserved_bytes.current, 40 * MIB);
    assert_eq!(e.stats().reserved_bytes.current, 20 * MIB);
    assert_eq!(t.empty_cache(&mut d).unwrap(), 40 * MIB);
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
}

/// Coarse handles shrink as the device fills (`expandable::coarse_piece_pages`): a growth is
/// cut into handles of at most 1/8 of the device memory it leaves free, so that on an
/// out-of-memory the free pages beside a live block can be given back, as PyTorch's 20 MiB
/// pages can; on a roomy device the growth is one handle.
#[test]
fn coarse_handles_shrink_as_the_device_fills() {
    use crate::device::DriverCall;
    let mut t = TorchCachingPool::paged_lazy(&AllocatorConfig::default());
    let mut d = SimDevice::new(16 << 30);
    alloc(&mut t, &mut d, 800 * MIB);
    assert_eq!(d.live_objects().2, 1, "one mapping: one handle");

    // A device of 64 pages of 20 MiB: the same growth leaves 480 MiB free, so its handles
    // are of three pages (60 MiB): thirteen of them and one of a page, where PyTorch makes
    // forty.
    let capacity = 1280 * MIB;
    let mut t = TorchCachingPool::paged_lazy(&AllocatorConfig::default());
    let mut d = SimDevice::new(capacity);
    let (mut e, mut ed) = with("expandable_segments:True", capacity);
    for (t, d, handles) in [(&mut t, &mut d, 14), (&mut e, &mut ed, 40)] {
        let a = alloc(t, d, 800 * MIB);
        let c = d.counters();
        assert_eq!(
            [DriverCall::Create, DriverCall::Map, DriverCall::SetAccess].map(|k| c.get(k)),
            [handles, handles, 1]
        );
        let b = alloc(t, d, 20 * MIB);
        free(t, d, a.addr);
        let c = alloc(t, d, 600 * MIB);
        assert_eq!(c.addr, a.addr, "best fit: in a's pages");
        // 30 more pages where the device has 23: only once the 10 free pages left of a's
        // (pages 30-39: three handles of three pages and one of a page) are given back;
        // one coarse handle for a would have kept them.
        let f = alloc(t, d, 600 * MIB);
        assert_eq!(t.stats().reserved_bytes.current, 1220 * MIB);
        for x in [b, c, f] {
            free(t, d, x.addr);
        }
        t.empty_cache(d).unwrap();
        assert_eq!(d.live_objects(), (0, 0, 0, 0));
    }
}

/// `expandable_segments:True` maps and unmaps page by page, as PyTorch does: a fault at any
/// driver call of a growth by three 20 MiB pages, of their unmapping by `empty_cache` (one
/// page, then two at once) and of the release of the range leaves the counters equal to
/// what the device holds after every step; later steps work, and once the faults stop,
/// everything is given back (a range kept because its first mapping failed is reused and
/// released by a later growth).
#[test]
fn expandable_segments_fault_anywhere_in_page_by_page_mapping_and_unmapping() {
    fn workload(t: &mut TorchCachingPool, d: &mut SimDevice) -> (u64, Vec<u64>) {
        let mut errors = 0;
        let mut live = Vec::new();
        let mut check = |t: &TorchCachingPool, d: &SimDevice, r: Result<(), AllocError>| {
            match r {
                Ok(()) => {}
                Err(AllocError::Device(DeviceError::Driver { .. })) => errors += 1,
                Err(e) => panic!("unexpected {e}"),
            }
            t.validate().unwrap();
            assert_eq!(t.stats().reserved_bytes.current, d.used_bytes());
            // Every page mapped, or unmapped with its handle still to release.
            let unreleased: u64 = t.unreleased.iter().map(|u| u.bytes).sum();
            assert_eq!(
                d.live_objects().2 as u64 * 20 * MIB + unreleased,
                d.used_bytes()
            );
        };
        // Pages 0-2 at once; `b` then sits in page 2.
        let a = t.allocate(d, 50 * MIB, 512, 0).map(|b| b.addr);
        check(t, d, a.clone().map(|_| ()));
        let b = t.allocate(d, 5 * MIB, 512, 0).map(|b| b.addr);
        check(t, d, b.clone().map(|_| ()));
        for x in [a, b].into_iter().flatten() {
            let r = t.deallocate(d, x);
            check(t, d, r);
            // First pages 0-1 (under `a`), then page 2 and the range.
            let r = t.empty_cache(d).map(|_| ());
            check(t, d, r);
        }
        let c = t.allocate(d, 30 * MIB, 512, 0).map(|b| b.addr);
        check(t, d, c.clone().map(|_| ()));
        live.extend(c);
        let r = t.empty_cache(d).map(|_| ());
        check(t, d, r);
        (errors, live)
    }
    let (mut t, mut d) = with("expandable_segments:True", 1 << 30);
    let (errors, live) = workload(&mut t, &mut d);
    assert_eq!(errors, 0);
    let calls = d.calls_made();
    // reserve, 3 × create, 3 × map, set-access; 2 × (unmap, release); unmap, release,
    // address-free; reserve, 2 × create, 2 × map, set-access.
    assert_eq!(calls, 8 + 4 + 3 + 6);
    for addr in live {
        free(&mut t, &mut d, addr);
    }
    for fault in 0..calls {
        let (mut t, mut d) = with("expandable_segments:True", 1 << 30);
        d.inject_fault_at(Some(fault));
        let (errors, live) = workload(&mut t, &mut d);
        assert_eq!(errors, 1, "fault {fault}");
        d.inject_fault_at(None);
        for addr in live {
            free(&mut t, &mut d, addr);
        }
        t.empty_cache(&mut d).unwrap();
        let kept = d.live_objects().1;
        assert!(kept <= 1, "fault {fault}: {kept} ranges kept");
        let x = alloc(&mut t, &mut d, 50 * MIB);
        free(&mut t, &mut d, x.addr);
        t.empty_cache(&mut d).unwrap();
        t.validate().unwrap();
        assert_eq!(d.live_objects(), (0, 0, 0, 0), "fault {fault}");
        assert_eq!(t.stats().reserved_bytes.current, 0, "fault {fault}");
        assert_eq!(t.unreleased.len() + t.ranges_to_free.len(), 0);
    }
}

/// `grow_ahead` ([`crate::config::LazyConfig::grow_ahead_bp`]): a growth maps that share of
/// the bytes held beyond the request, so a peak that creeps up grows in fewer steps; where
/// the device has no room for the extra, the growth maps what the request needs.
#[test]
fn grow_ahead_maps_a_share_of_the_held_bytes_beyond_the_request() {
    use crate::device::DriverCall;
    let pool = |bp: u32| {
        let mut config = AllocatorConfig::default();
        config.lazy.grow_ahead_bp = bp;
        TorchCachingPool::paged_lazy(&config)
    };
    // One cuMemSetAccess per growth that succeeded.
    let growths = |d: &SimDevice| d.counters().get(DriverCall::SetAccess);
    let reserved = |t: &TorchCachingPool| t.stats().reserved_bytes.current;
    for (capacity, bp, after_b, growths_after_c) in [
        // 25 % of 100 MiB ahead: B maps 20 + 25 MiB, rounded up to 20 MiB pages = 60 MiB,
        // and C (30 MiB) fits in what is left: two growths for three blocks.
        (1 << 30, 2_500, 160 * MIB, 2),
        // No ahead: C needs a third growth.
        (1 << 30, 0, 120 * MIB, 3),
        // A 128 MiB device has no room for B's 60 MiB: B maps its 20 MiB after a refused
        // growth, and C finds no room at all.
        (128 * MIB, 2_500, 120 * MIB, 2),
    ] {
        let mut t = pool(bp);
        let mut d = SimDevice::new(capacity);
        let a = alloc(&mut t, &mut d, 100 * MIB);
        assert_eq!(
            reserved(&t),
            100 * MIB,
            "the first growth has nothing held to scale"
        );
        let b = alloc(&mut t, &mut d, 20 * MIB);
        assert_eq!(reserved(&t), after_b, "capacity {capacity}, {bp} bp");
        assert_eq!(b.addr, a.addr + 100 * MIB, "placement is PyTorch's");
        if capacity > 128 * MIB {
            alloc(&mut t, &mut d, 30 * MIB);
            assert_eq!(growths(&d), growths_after_c, "capacity {capacity}, {bp} bp");
        } else {
            assert_eq!(growths(&d), growths_after_c, "one refused, one made");
            assert!(matches!(
                t.allocate(&mut d, 30 * MIB, 512, 0),
                Err(AllocError::OutOfMemory { .. })
            ));
            assert_eq!(reserved(&t), after_b, "nothing lost on the refusal");
        }
        t.validate().unwrap();
    }
}

/// `paged-lazy`'s small pool maps, at each growth, as many pages beyond the request's as the
/// segment holds, at most [`SMALL_GROW_AHEAD_BYTES`] (4 MiB, two pages): for 1 MiB blocks
/// 2, 6, 12, 18, 24 MiB mapped after its growths (three driver calls each) where PyTorch's
/// expandable segment makes a growth per 2 MiB page. The large pool and the emulation of
/// PyTorch map the pages the request needs. Where the device has no room for the pages
/// ahead, the growth maps the request's.
#[test]
fn the_small_pool_grows_by_what_it_holds_up_to_4_mib() {
    use crate::device::DriverCall;
    use crate::torch::SMALL_GROW_AHEAD_BYTES;
    assert_eq!(SMALL_GROW_AHEAD_BYTES, 4 * MIB);
    let reserved = |t: &TorchCachingPool| t.stats().reserved_bytes.current;
    let growths = |d: &SimDevice| d.counters().get(DriverCall::SetAccess);
    // Run 1 MiB blocks (the small pool's largest), none freed, through a device of
    // `capacity`: the mapped MiB after each growth, and how many blocks were placed.
    let run = |capacity: u64, blocks: usize| {
        let mut t = TorchCachingPool::paged_lazy(&AllocatorConfig::default());
        let mut d = SimDevice::new(capacity);
        let mut after_growth = Vec::new();
        let mut placed = 0;
        for _ in 0..blocks {
            let before = growths(&d);
            if t.allocate(&mut d, MIB, 512, 0).is_err() {
                break;
            }
            placed += 1;
            if growths(&d) > before {
                after_growth.push(reserved(&t) / MIB);
            }
            t.validate().unwrap();
        }
        (after_growth, placed)
    };
    // 2 MiB for the first block; then the request's page and one more (the segment holds
    // one page), then two more each time.
    assert_eq!(run(1 << 30, 24), (vec![2, 6, 12, 18, 24], 24));
    // PyTorch's expandable segment: one growth per 2 MiB page.
    let (mut e, mut ed) = with("expandable_segments:True", 1 << 30);
    for _ in 0..24 {
        alloc(&mut e, &mut ed, MIB);
    }
    assert_eq!((reserved(&e), growths(&ed)), (24 * MIB, 12));
    // A 5 MiB device: the second growth has no room for its page ahead and maps the
    // request's (4 MiB held); the third has room for neither.
    assert_eq!(run(5 * MIB, 24), (vec![2, 4], 4));
    // The large pool maps what the request needs (20 MiB pages).
    let mut t = TorchCachingPool::paged_lazy(&AllocatorConfig::default());
    let mut d = SimDevice::new(1 << 30);
    for k in 1..=3 {
        alloc(&mut t, &mut d, 20 * MIB);
        assert_eq!((reserved(&t), growths(&d)), (k * 20 * MIB, k));
    }
}

/// A segment made before the emulation existed (a snapshot's pre-existing segment) is taken
/// in whole: its free stretches serve later requests before any cudaMalloc, as in PyTorch.
#[test]
fn adopted_segment_serves_later_requests() {
    use crate::{ForeignBlock, ForeignSegment};
    let (mut t, mut d) = new();
    let seg = ForeignSegment {
        bytes: 20 * MIB,
        small_pool: false,
        stream: 0,
        blocks: vec![ForeignBlock {
            offset: 5 * MIB,
            requested_bytes: 3 * MIB - 100,
            allocated_bytes: None,
        }],
        mapped: None,
    };
    let got = t.adopt_segment(&mut d, &seg).unwrap().expect("adopted");
    t.validate().unwrap();
    let base = t.segments()[0].0;
    assert_eq!(
        got,
        vec![Block {
            addr: base + 5 * MIB,
            requested_bytes: 3 * MIB - 100,
            allocated_bytes: 3 * MIB,
        }]
    );
    let s = t.stats();
    assert_eq!(s.reserved_bytes.current, 20 * MIB);
    assert_eq!(s.allocated_bytes.current, 3 * MIB);
    assert_eq!(s.free_bytes, 17 * MIB);
    assert_eq!(t.torch_stats().inactive_split.current, 2);
    assert_eq!(t.torch_stats().inactive_split_bytes.current, 17 * MIB);
    // Best fit: 4 MiB goes to the 5 MiB stretch at the base, not the 12 MiB one after the block.
    let a = alloc(&mut t, &mut d, 4 * MIB);
    assert_eq!(a.addr, base);
    assert_eq!(
        d.counters().total(),
        1,
        "no cudaMalloc beyond the adopted segment"
    );
    // Freeing everything merges the segment back into one free block, which empty_cache frees.
    free(&mut t, &mut d, got[0].addr);
    free(&mut t, &mut d, a.addr);
    assert_eq!(t.torch_stats().inactive_split.current, 0);
    assert_eq!(t.empty_cache(&mut d).unwrap(), 20 * MIB);
    t.validate().unwrap();
}

#[test]
fn layouts_pytorch_cannot_make_are_not_adopted() {
    use crate::{ForeignBlock, ForeignSegment};
    let block = |offset, requested| ForeignBlock {
        offset,
        requested_bytes: requested,
        allocated_bytes: None,
    };
    let seg = |small_pool, bytes, blocks| ForeignSegment {
        bytes,
        small_pool,
        stream: 0,
        blocks,
        mapped: None,
    };
    for bad in [
        seg(false, 20 * MIB, vec![block(0, 2 * MIB), block(MIB, MIB)]), // overlap
        seg(false, 20 * MIB, vec![block(19 * MIB, 2 * MIB)]),           // past the end
        seg(false, 20 * MIB, vec![block(100, MIB)]),                    // unaligned offset
        seg(false, 20 * MIB + 100, vec![]),                             // unaligned size
        seg(true, 2 * MIB, vec![block(0, 2 * MIB)]),                    // small pool, > 1 MiB
        seg(false, 0, vec![]),
    ] {
        let (mut t, mut d) = new();
        assert_eq!(t.adopt_segment(&mut d, &bad).unwrap(), None, "{bad:?}");
        assert_eq!(d.counters().total(), 0);
        assert_eq!(t.stats().reserved_bytes.current, 0);
        t.validate().unwrap();
    }
    // Expandable segments (and paged-lazy) keep no cudaMalloc segments to adopt.
    let fine = seg(false, 20 * MIB, vec![]);
    let mut d = SimDevice::default();
    let mut t =
        TorchCachingPool::with_conf(TorchConfig::parse("expandable_segments:True").unwrap());
    assert_eq!(t.adopt_segment(&mut d, &fine).unwrap(), None);
    let mut t = TorchCachingPool::paged_lazy(&AllocatorConfig::default());
    assert_eq!(t.adopt_segment(&mut d, &fine).unwrap(), None);
    // A device too small refuses it: out-of-memory, nothing changed.
    let mut d = SimDevice::new(16 * MIB);
    let (mut t, _) = new();
    assert!(t.adopt_segment(&mut d, &fine).unwrap_err().is_oom());
    assert_eq!(t.stats().reserved_bytes.current, 0);
    t.validate().unwrap();
}

/// An expandable segment of a recorded run (`expandable_segments:True`) is taken in with the
/// pages it had mapped: their free parts serve later requests with no map step.
#[test]
fn adopted_expandable_segment_serves_later_requests() {
    use crate::{ForeignBlock, ForeignSegment};
    let mut t =
        TorchCachingPool::with_conf(TorchConfig::parse("expandable_segments:True").unwrap());
    let mut d = SimDevice::default();
    let seg = ForeignSegment {
        bytes: 120 * MIB,
        small_pool: false,
        stream: 0,
        blocks: vec![
            ForeignBlock {
                offset: 10 * MIB,
                requested_bytes: 5 * MIB,
                allocated_bytes: None,
            },
            ForeignBlock {
                offset: 101 * MIB,
                requested_bytes: 2 * MIB - 7,
                allocated_bytes: Some(2 * MIB),
            },
        ],
        mapped: Some(vec![(0, 60 * MIB), (100 * MIB, 20 * MIB)]),
    };
    let got = t.adopt_segment(&mut d, &seg).unwrap().expect("adopted");
    t.validate().unwrap();
    let runs = t.segments();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let base = runs[0].0;
    assert_eq!(
        runs.iter().map(|r| (r.0 - base, r.1)).collect::<Vec<_>>(),
        vec![(0, 60 * MIB), (100 * MIB, 20 * MIB)]
    );
    assert_eq!(
        got.iter()
            .map(|b| (b.addr - base, b.allocated_bytes))
            .collect::<Vec<_>>(),
        vec![(10 * MIB, 5 * MIB), (101 * MIB, 2 * MIB)]
    );
    let s = t.stats();
    assert_eq!(s.reserved_bytes.current, 80 * MIB);
    assert_eq!(s.allocated_bytes.current, 7 * MIB);
    assert_eq!(s.requested_bytes.current, 7 * MIB - 7);
    assert_eq!(d.used_bytes(), 80 * MIB);
    // 30 MiB fits in the free 45 MiB after the first block: no map step.
    let calls = d.calls_made();
    let a = alloc(&mut t, &mut d, 30 * MIB);
    assert_eq!(a.addr - base, 15 * MIB);
    assert_eq!(d.calls_made(), calls);
    for b in got.iter().chain([&a]) {
        t.deallocate(&mut d, b.addr).unwrap();
        t.validate().unwrap();
    }
    t.empty_cache(&mut d).unwrap();
    t.validate().unwrap();
    assert_eq!(t.stats().reserved_bytes.current, 0);
    // Not twice into one pool, not into the native emulation, not a run off the page.
    let mut t =
        TorchCachingPool::with_conf(TorchConfig::parse("expandable_segments:True").unwrap());
    assert!(t.adopt_segment(&mut d, &seg).unwrap().is_some());
    assert_eq!(t.adopt_segment(&mut d, &seg).unwrap(), None);
    let (mut native, _) = new();
    assert_eq!(native.adopt_segment(&mut d, &seg).unwrap(), None);
    let mut t =
        TorchCachingPool::with_conf(TorchConfig::parse("expandable_segments:True").unwrap());
    let odd = ForeignSegment {
        mapped: Some(vec![(MIB, 20 * MIB)]),
        blocks: vec![],
        ..seg.clone()
    };
    assert_eq!(t.adopt_segment(&mut d, &odd).unwrap(), None);
    t.validate().unwrap();
}

/// A free that waits for another stream (`record_stream`): PyTorch's `free()` takes the block
/// out of `allocated_bytes` at once, its `free_block` out of `requested_bytes` and back into
/// the pool only when the stream's work is done.
#[test]
fn a_requested_free_leaves_allocated_bytes_first() {
    let (mut t, mut d) = new();
    let a = alloc(&mut t, &mut d, 3 * MIB - 10);
    t.free_requested(&mut d, a.addr).unwrap();
    t.validate().unwrap();
    let s = t.stats();
    assert_eq!(s.allocated_bytes.current, 0);
    assert_eq!(s.requested_bytes.current, 3 * MIB - 10);
    // Not back in the pool yet: the next request of the same size takes new memory.
    let b = alloc(&mut t, &mut d, 3 * MIB - 10);
    assert_ne!(b.addr, a.addr);
    assert_eq!(t.stats().allocated_bytes.current, 3 * MIB);
    // A second request changes nothing; the completion frees it.
    t.free_requested(&mut d, a.addr).unwrap();
    assert_eq!(t.stats().allocated_bytes.current, 3 * MIB);
    free(&mut t, &mut d, a.addr);
    let s = t.stats();
    assert_eq!(s.allocated_bytes.current, 3 * MIB);
    assert_eq!(s.requested_bytes.current, 3 * MIB - 10);
    assert!(t.free_requested(&mut d, a.addr).is_err());
    free(&mut t, &mut d, b.addr);
    assert_eq!(t.stats().allocated_bytes.current, 0);
    // Never 6 MiB: `a` had left allocated_bytes before `b` came (a free at completion would
    // have made it 6 MiB).
    assert_eq!(t.stats().allocated_bytes.peak, 3 * MIB);
}
