//! The property test: random operations under every setting, `validate()` after each.
use super::*;
use proptest::test_runner::TestCaseError;

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
                            insert_live(&mut live, b.addr, b.addr + size)?;
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
                    adopt_checked(&mut t, &mut d, &mut live, coarse, (bytes, small, stream), &blocks)?;
                }
            }
            t.validate().unwrap();
            proptest::prop_assert_eq!(t.stats().reserved_bytes.current, d.used_bytes());
        }
        free_all_and_take_whole(&mut t, &mut d, &live, nulls, coarse)?;
    }
}

/// Records a new live block `[addr, end)`, failing the test if it overlaps one already live.
fn insert_live(live: &mut BTreeMap<u64, u64>, addr: u64, end: u64) -> Result<(), TestCaseError> {
    if let Some((_, &pe)) = live.range(..=addr).next_back() {
        proptest::prop_assert!(pe <= addr, "overlap below");
    }
    if let Some((&na, _)) = live.range(addr..).next() {
        proptest::prop_assert!(na >= end, "overlap above");
    }
    live.insert(addr, end);
    Ok(())
}

/// [`Op::Adopt`]: adopts a segment of `bytes` (small pool or not, on `stream`) holding
/// `blocks`, and checks what was adopted, or that nothing changed.
fn adopt_checked(
    t: &mut TorchCachingPool,
    d: &mut SimDevice,
    live: &mut BTreeMap<u64, u64>,
    coarse: bool,
    (bytes, small, stream): (u64, bool, u64),
    blocks: &[(u64, u64)],
) -> Result<(), TestCaseError> {
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
    let mapped = (bytes / (2 * MIB))
        .is_multiple_of(2)
        .then(|| vec![(0, bytes.div_ceil(page) * page)]);
    let seg = crate::ForeignSegment {
        bytes,
        small_pool: small,
        stream,
        blocks,
        mapped,
    };
    let before = t.stats();
    let used = d.used_bytes();
    match t.adopt_segment(d, &seg) {
        Ok(Some(got)) => {
            proptest::prop_assert!(!coarse);
            proptest::prop_assert_eq!(t.conf().expandable_segments, seg.mapped.is_some());
            proptest::prop_assert_eq!(got.len(), seg.blocks.len());
            let taken = seg.mapped.as_ref().map_or(bytes, |r| r[0].1);
            proptest::prop_assert_eq!(d.used_bytes(), used + taken);
            for (b, f) in got.iter().zip(&seg.blocks) {
                proptest::prop_assert_eq!(b.requested_bytes, f.requested_bytes);
                insert_live(live, b.addr, b.addr + b.requested_bytes)?;
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
    Ok(())
}

/// The end of a case: frees every live block (and the null ones), empties the cache, checks
/// that the device holds nothing, then that the whole device can be taken again.
fn free_all_and_take_whole(
    t: &mut TorchCachingPool,
    d: &mut SimDevice,
    live: &BTreeMap<u64, u64>,
    nulls: u64,
    coarse: bool,
) -> Result<(), TestCaseError> {
    for k in live.keys() {
        t.deallocate(d, *k).unwrap();
    }
    for _ in 0..nulls {
        t.deallocate(d, 0).unwrap();
    }
    proptest::prop_assert!(t.deallocate(d, 0).is_err());
    t.validate().unwrap();
    t.empty_cache(d).unwrap();
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
        proptest::prop_assert_eq!(
            t.torch_stats().num_device_alloc,
            t.torch_stats().num_device_free
        );
    }
    // Everything came back: the whole device (to a whole number of 20 MiB pages, within
    // the memory limit) can be taken again.
    let limit = t.conf().allowed_bytes(128 * MIB).unwrap_or(128 * MIB);
    let mut whole = limit / (20 * MIB) * (20 * MIB);
    while round_size_with(whole, t.conf()).unwrap().div_ceil(20 * MIB) * (20 * MIB) > limit {
        whole -= 20 * MIB;
    }
    let all = t.allocate(d, whole, 512, 0);
    proptest::prop_assert!(all.is_ok(), "{:?}", all);
    Ok(())
}
