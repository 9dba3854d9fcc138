//! Property and scenario tests run over every arena (buddy, TLSF, best fit) and every
//! strategy, on the simulated device.
//!
//! `for_every_arena!` runs each arena test over every arena; `for_every_pool!` runs
//! [`check_allocator`] (random operation sequences) and the fault-injection test for every
//! allocator name. Every scenario ends by allocating the whole capacity at offset 0 (arenas)
//! or by checking that `empty_cache` gives every byte back to the device (pools).
use std::collections::BTreeMap;

use gpumem_core::arena::ArenaReport;
use gpumem_core::best_fit::BestFit;
use gpumem_core::buddy::Buddy;
use gpumem_core::config::AllocatorConfig;
use gpumem_core::sim::SimDevice;
use gpumem_core::strategy::Strategy as AllocStrategy;
use gpumem_core::tlsf::Tlsf;
use gpumem_core::{AllocError, Allocator, Arena, Block, Device, DeviceError};
use proptest::prelude::*;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

// ---------------------------------------------------------------------------------------
// Arenas
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: u64, align_shift: u32 },
    Free { pick: usize },
}

fn size_strategy(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        6 => 1u64..=4 * KIB,
        3 => 4 * KIB..=max / 16,
        1 => max / 16..=max,
    ]
}

fn arena_op(max: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (size_strategy(max), 0u32..=13).prop_map(|(size, align_shift)| Op::Alloc { size, align_shift }),
        2 => any::<usize>().prop_map(|pick| Op::Free { pick }),
    ]
}

/// Live allocations of a test: offset -> (requested, allocated) bytes.
type Live = BTreeMap<u64, (u64, u64)>;

/// Checks the arena after an operation: validate, counts, byte accounting.
fn check_arena(arena: &dyn Arena, live: &Live, usable: u64) {
    arena.validate().unwrap();
    let r = arena.report();
    assert_eq!(r.allocations, live.len() as u64);
    let allocated: u64 = live.values().map(|&(_, a)| a).sum();
    assert_eq!(
        r.free_bytes + allocated,
        usable,
        "free + allocated = usable"
    );
    assert!(r.largest_free_bytes <= r.free_bytes);
}

/// Allocates and checks alignment, bounds and overlap against the live set.
fn alloc_checked(arena: &mut dyn Arena, live: &mut Live, size: u64, align: u64) -> Option<u64> {
    let before = arena.report();
    match arena.allocate(size, align) {
        Ok((off, bytes)) => {
            assert_eq!(off % align, 0, "offset {off} not aligned to {align}");
            assert!(bytes >= size.max(1));
            assert!(off + bytes <= arena.capacity_bytes());
            if let Some((&po, &(_, pb))) = live.range(..=off).next_back() {
                assert!(po + pb <= off, "[{off}, +{bytes}) overlaps [{po}, +{pb})");
            }
            if let Some((&no, _)) = live.range(off..).next() {
                assert!(
                    off + bytes <= no,
                    "[{off}, +{bytes}) overlaps block at {no}"
                );
            }
            live.insert(off, (size, bytes));
            Some(off)
        }
        Err(e) => {
            assert!(e.is_oom(), "{e}");
            assert_eq!(
                arena.report(),
                before,
                "a failed allocate changed the arena"
            );
            if align == 1 {
                // Exact search: OOM only when no free block holds the request.
                assert!(
                    size.max(1) > before.largest_free_bytes,
                    "{} refused {size} B with a {} B free block",
                    arena.name(),
                    before.largest_free_bytes
                );
            }
            None
        }
    }
}

fn free_all(arena: &mut dyn Arena, live: &mut Live, usable: u64) {
    let keys: Vec<u64> = live.keys().copied().collect();
    // Every other block first, then the rest, so merges happen on both sides.
    for k in keys.iter().step_by(2).chain(keys.iter().skip(1).step_by(2)) {
        let (_, bytes) = live.remove(k).unwrap();
        assert_eq!(arena.deallocate(*k), Ok(bytes));
        check_arena(arena, live, usable);
    }
}

/// The closing check of every scenario: with nothing live, the largest piece (the whole
/// capacity for a power-of-two capacity) is allocated at offset 0, then freed again.
fn assert_whole_capacity(arena: &mut dyn Arena, whole: u64) {
    assert_eq!(arena.report().allocations, 0);
    assert_eq!(arena.allocate(whole, 1), Ok((0, whole)));
    arena.validate().unwrap();
    assert_eq!(arena.deallocate(0), Ok(whole));
    arena.validate().unwrap();
}

fn arena_random_ops(arena: &mut dyn Arena, ops: &[Op]) {
    let fresh = arena.report();
    let usable = fresh.free_bytes;
    let whole = fresh.largest_free_bytes;
    if arena.capacity_bytes().is_power_of_two() {
        assert_eq!(whole, arena.capacity_bytes());
    }
    let mut live = Live::new();
    for op in ops {
        match *op {
            Op::Alloc { size, align_shift } => {
                alloc_checked(arena, &mut live, size, 1 << align_shift);
            }
            Op::Free { pick } => {
                if live.is_empty() {
                    let before = arena.report();
                    assert_eq!(
                        arena.deallocate(pick as u64),
                        Err(AllocError::UnknownBlock { addr: pick as u64 })
                    );
                    assert_eq!(arena.report(), before);
                } else {
                    let k = *live.keys().nth(pick % live.len()).unwrap();
                    let (_, bytes) = live.remove(&k).unwrap();
                    assert_eq!(arena.deallocate(k), Ok(bytes));
                }
            }
        }
        check_arena(arena, &live, usable);
    }
    free_all(arena, &mut live, usable);
    assert_eq!(
        arena.report(),
        fresh,
        "everything freed: back to the fresh report"
    );
    assert_whole_capacity(arena, whole);
}

/// (b) Sizes near `u64::MAX` with every power-of-two alignment up to 4096: an error
/// (overflow or out-of-memory), no panic, no change.
fn huge_sizes(arena: &mut dyn Arena) {
    let cap = arena.capacity_bytes();
    let usable = arena.report().free_bytes;
    let whole = arena.report().largest_free_bytes;
    let mut live = Live::new();
    alloc_checked(arena, &mut live, 1000, 64).unwrap();
    let before = arena.report();
    for shift in 0..=12 {
        let a = 1u64 << shift;
        for size in [
            u64::MAX,
            u64::MAX - 1,
            u64::MAX - a + 1,
            u64::MAX - a,
            u64::MAX - 2 * a + 1,
            1 << 63,
            (1 << 63) + 1,
            cap + 1,
        ] {
            match arena.allocate(size, a) {
                Err(AllocError::Overflow { .. }) | Err(AllocError::OutOfMemory { .. }) => {}
                other => panic!("{} size {size} align {a}: {other:?}", arena.name()),
            }
            assert_eq!(arena.report(), before);
            arena.validate().unwrap();
        }
    }
    for bad in [0, 3, 12, u64::MAX] {
        assert!(matches!(
            arena.allocate(16, bad),
            Err(AllocError::InvalidAlignment { align, .. }) if align == bad
        ));
    }
    free_all(arena, &mut live, usable);
    assert_whole_capacity(arena, whole);
}

/// (c) Double free, interior offsets and offsets past the end are `UnknownBlock` and change
/// nothing.
fn double_and_unknown_free(arena: &mut dyn Arena) {
    let usable = arena.report().free_bytes;
    let whole = arena.report().largest_free_bytes;
    let mut live = Live::new();
    let a = alloc_checked(arena, &mut live, 3000, 256).unwrap();
    let b = alloc_checked(arena, &mut live, 5000, 1).unwrap();
    let _c = alloc_checked(arena, &mut live, 100, 4096).unwrap();
    let (_, bytes) = live.remove(&a).unwrap();
    assert_eq!(arena.deallocate(a), Ok(bytes));
    let before: ArenaReport = arena.report();
    arena.validate().unwrap();
    for addr in [a, b + 1, b + 256, arena.capacity_bytes(), u64::MAX] {
        assert_eq!(
            arena.deallocate(addr),
            Err(AllocError::UnknownBlock { addr }),
            "{}: free of {addr}",
            arena.name()
        );
        assert_eq!(arena.report(), before);
        arena.validate().unwrap();
    }
    free_all(arena, &mut live, usable);
    assert_whole_capacity(arena, whole);
}

/// Fill the arena with small blocks until it refuses, free them, and take it whole again.
fn fill_until_full(arena: &mut dyn Arena) {
    let usable = arena.report().free_bytes;
    let whole = arena.report().largest_free_bytes;
    let mut live = Live::new();
    let mut i = 0u64;
    while alloc_checked(arena, &mut live, 1000 + (i * 7919) % 9000, 1 << (i % 9)).is_some() {
        i += 1;
    }
    check_arena(arena, &live, usable);
    assert!(i > 10);
    free_all(arena, &mut live, usable);
    assert_whole_capacity(arena, whole);
}

macro_rules! for_every_arena {
    ($($name:ident => $make:expr, caps: [$($cap:expr),+ $(,)?]);* $(;)?) => { $(
        mod $name {
            use super::*;

            fn make(capacity_bytes: u64) -> Box<dyn Arena> {
                Box::new(($make)(capacity_bytes))
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(96))]
                #[test]
                fn random_alloc_free(
                    cap in prop::sample::select(vec![$($cap),+]),
                    ops in prop::collection::vec(arena_op(4 * MIB), 1..160),
                ) {
                    arena_random_ops(&mut *make(cap), &ops);
                }
            }

            #[test]
            fn sizes_near_u64_max_never_panic() {
                huge_sizes(&mut *make(MIB));
            }

            #[test]
            fn double_free_and_unknown_offsets_change_nothing() {
                double_and_unknown_free(&mut *make(MIB));
            }

            #[test]
            fn fill_until_full_then_whole_capacity() {
                for cap in [$($cap),+] {
                    fill_until_full(&mut *make(cap));
                }
            }

            #[test]
            fn empty_arena_refuses_and_stays_valid() {
                let mut a = make(0);
                assert!(a.allocate(0, 1).unwrap_err().is_oom());
                a.validate().unwrap();
                assert_eq!(a.deallocate(0), Err(AllocError::UnknownBlock { addr: 0 }));
            }
        }
    )* };
}

for_every_arena! {
    buddy => Buddy::new, caps: [16 * MIB, MIB, 3 * MIB + 777];
    tlsf => Tlsf::new, caps: [16 * MIB, 16 * MIB + 12_345, 100_003];
    best_fit => BestFit::new, caps: [16 * MIB, 16 * MIB + 12_345, 100_003];
}

/// (a) The fragmentation case: a freed 4 GiB scratch block, partly reused by a 1 GiB block,
/// makes a later 4 GiB request fail under best fit although 4.5 GiB are free in total.
#[test]
fn best_fit_fragmentation_refuses_4gib_with_4_5gib_free() {
    let cap = 8 * GIB;
    let mut a = BestFit::new(cap);
    let mut live = Live::new();
    let scratch = alloc_checked(&mut a, &mut live, 4 * GIB, 256).unwrap(); // [0, 4G)
    let _pin1 = alloc_checked(&mut a, &mut live, GIB, 256).unwrap(); // [4G, 5G)
    let hole1 = alloc_checked(&mut a, &mut live, 768 * MIB, 256).unwrap();
    let _pin2 = alloc_checked(&mut a, &mut live, GIB, 256).unwrap();
    let hole2 = alloc_checked(&mut a, &mut live, 768 * MIB, 256).unwrap();
    let _pin3 = alloc_checked(&mut a, &mut live, 512 * MIB, 256).unwrap(); // fills to 8 GiB
    assert_eq!(a.report().free_bytes, 0);
    for k in [hole1, hole2, scratch] {
        live.remove(&k);
        a.deallocate(k).unwrap();
    }
    // The two 768 MiB holes are too small: best fit puts 1 GiB at the start of the scratch.
    let reuse = alloc_checked(&mut a, &mut live, GIB, 256).unwrap();
    assert_eq!(reuse, 0);
    let r = a.report();
    let request = 4 * GIB;
    assert_eq!(r.free_bytes, 3 * GIB + 2 * 768 * MIB);
    assert_eq!(r.largest_free_bytes, 3 * GIB);
    assert!(r.largest_free_bytes < request && request <= r.free_bytes);
    assert_eq!(
        a.allocate(request, 256),
        Err(AllocError::OutOfMemory {
            requested_bytes: request,
            free_bytes: 3 * GIB + 2 * 768 * MIB,
            largest_free_bytes: 3 * GIB,
        })
    );
    a.validate().unwrap();
    free_all(&mut a, &mut live, cap);
    assert_whole_capacity(&mut a, cap);
}

/// TLSF's good-fit search never skips a block that would fit (its slow path scans the
/// classes below the guaranteed one): a block of exactly the largest free size succeeds.
#[test]
fn tlsf_takes_a_free_block_of_exactly_the_requested_size() {
    let mut t = Tlsf::new(64 * MIB);
    let mut live = Live::new();
    let x = alloc_checked(&mut t, &mut live, 1_000_001, 1).unwrap();
    let _pin = alloc_checked(&mut t, &mut live, 10, 1).unwrap();
    live.remove(&x);
    t.deallocate(x).unwrap();
    let rest = t.report().largest_free_bytes;
    assert_eq!(alloc_checked(&mut t, &mut live, rest, 1), Some(1_000_011));
    assert_eq!(alloc_checked(&mut t, &mut live, 1_000_001, 1), Some(0));
    assert!(t.allocate(1, 1).unwrap_err().is_oom());
    free_all(&mut t, &mut live, 64 * MIB);
    assert_whole_capacity(&mut t, 64 * MIB);
}

// ---------------------------------------------------------------------------------------
// Allocators (pools)
// ---------------------------------------------------------------------------------------

/// Allocators not (yet) run through the harness. Move a name from here into
/// `for_every_pool!` below once it passes. (Empty: every allocator is covered; `torch` was
/// here until an empty over-aligned block could get its neighbour's address, see
/// `torch_gives_distinct_addresses_to_live_blocks`.)
const PENDING: &[&str] = &[];

#[derive(Debug, Clone)]
enum PoolOp {
    Alloc { size: u64, align_shift: u32 },
    Free { pick: usize },
    ReleaseCached,
}

fn pool_op() -> impl Strategy<Value = PoolOp> {
    let size = prop_oneof![
        1 => Just(0u64),
        6 => 1u64..=64 * KIB,
        3 => 64 * KIB..=4 * MIB,
        1 => 4 * MIB..=24 * MIB,
    ];
    prop_oneof![
        6 => (size, 0u32..=21).prop_map(|(size, align_shift)| PoolOp::Alloc { size, align_shift }),
        4 => any::<usize>().prop_map(|pick| PoolOp::Free { pick }),
        1 => Just(PoolOp::ReleaseCached),
    ]
}

/// Device and settings of the pool tests: a 64 MiB device, 8 MiB segments. Besides the
/// strategies, `paged-lazy:pages` is `paged-lazy` with `placement=pages`,
/// `paged-lazy:grow` the default placement with `grow_ahead=0.25`, and
/// `torch:expandable` the torch emulation under `expandable_segments:True` (page by page,
/// as PyTorch maps and unmaps; like PyTorch it keeps the range of a segment whose first
/// mapping failed, which [`drain_pool`] accepts once the pool has shown it still owns it;
/// `paged-lazy`, the same placement with coarse handles, gives such a range back at once).
fn pool_setup(name: &str) -> (SimDevice, Box<dyn Allocator>) {
    let mut config = AllocatorConfig {
        segment_bytes: 8 * MIB,
        ..AllocatorConfig::default()
    };
    let name = match name {
        "paged-lazy:pages" => {
            config.lazy.placement = gpumem_core::config::LazyPlacement::Pages;
            "paged-lazy"
        }
        "torch:expandable" => {
            config.torch.expandable_segments = true;
            "torch"
        }
        "paged-lazy:grow" => {
            // Every growth maps 25 % of the bytes held beyond the request: often more than
            // the 64 MiB device has left, so the fallback to what the request needs runs.
            config.lazy.grow_ahead_bp = 2_500;
            "paged-lazy"
        }
        n => n,
    };
    let pool = name.parse::<AllocStrategy>().unwrap().build(&config);
    (SimDevice::new(64 * MIB), pool)
}

/// Checks the pool against the live blocks the test holds.
fn check_pool(pool: &dyn Allocator, dev: &SimDevice, live: &BTreeMap<u64, Block>) {
    pool.validate().unwrap();
    let s = pool.stats();
    // The O(1) reserved figures the replay reads after every event are the statistics'.
    assert_eq!(pool.reserved_bytes(), s.reserved_bytes);
    assert_eq!(s.allocation_count.current, live.len() as u64);
    let requested: u64 = live.values().map(|b| b.requested_bytes).sum();
    let allocated: u64 = live.values().map(|b| b.allocated_bytes).sum();
    assert_eq!(s.requested_bytes.current, requested);
    assert_eq!(s.allocated_bytes.current, allocated);
    assert_eq!(
        s.reserved_bytes.current,
        dev.used_bytes(),
        "reserved = device memory held"
    );
    assert!(s.allocated_bytes.current + s.free_bytes <= s.reserved_bytes.current);
    assert!(s.largest_free_bytes <= s.free_bytes);
}

/// Allocates through the pool and checks alignment, overlap, accessibility and that a
/// failure changes no live figure. `Ok(None)` is an out-of-memory refusal.
fn pool_alloc(
    pool: &mut dyn Allocator,
    dev: &mut SimDevice,
    live: &mut BTreeMap<u64, Block>,
    size: u64,
    align: u64,
) -> Result<Option<Block>, AllocError> {
    let before = pool.stats();
    match pool.allocate(dev, size, align, 0) {
        Ok(b) if size == 0 && b.addr == 0 => {
            // A null block (torch, as PyTorch: nothing reserved, nothing called): it changes
            // no figure and frees at address 0.
            assert_eq!(b.allocated_bytes, 0, "{}: {b:?}", pool.name());
            assert_eq!(pool.stats(), before);
            pool.deallocate(dev, 0)?;
            assert!(pool.deallocate(dev, 0).is_err());
            Ok(Some(b))
        }
        Ok(b) => {
            assert_eq!(
                b.addr % align,
                0,
                "{}: {b:?} not aligned to {align}",
                pool.name()
            );
            assert_eq!(b.requested_bytes, size);
            assert!(b.allocated_bytes >= size.max(1));
            // The user's bytes: backed by device memory and disjoint from every live block.
            // (Not `allocated_bytes`: an over-aligned block may count padding that lies
            // before its address.)
            let end = b.addr + b.requested_bytes.max(1);
            assert!(dev.is_accessible(b.addr, end - b.addr), "{b:?} not backed");
            if let Some((_, p)) = live.range(..=b.addr).next_back() {
                assert!(
                    p.addr + p.requested_bytes.max(1) <= b.addr,
                    "{b:?} overlaps {p:?}"
                );
            }
            if let Some((_, n)) = live.range(b.addr..).next() {
                assert!(end <= n.addr, "{b:?} overlaps {n:?}");
            }
            live.insert(b.addr, b);
            Ok(Some(b))
        }
        Err(e) => {
            let after = pool.stats();
            assert_eq!(after.allocation_count, before.allocation_count);
            assert_eq!(
                after.allocated_bytes.current,
                before.allocated_bytes.current
            );
            assert_eq!(
                after.requested_bytes.current,
                before.requested_bytes.current
            );
            if e.is_oom() {
                if let AllocError::OutOfMemory {
                    free_bytes,
                    largest_free_bytes,
                    ..
                } = e
                {
                    assert!(largest_free_bytes <= free_bytes);
                }
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

/// Frees every live block, releases the cache, and checks the device got every byte back.
fn drain_pool(pool: &mut dyn Allocator, dev: &mut SimDevice, live: &mut BTreeMap<u64, Block>) {
    let keys: Vec<u64> = live.keys().copied().collect();
    for k in keys {
        live.remove(&k);
        pool.deallocate(dev, k).unwrap();
        check_pool(pool, dev, live);
    }
    pool.empty_cache(dev).unwrap();
    pool.validate().unwrap();
    reuse_kept_ranges(pool, dev, live);
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.current, 0);
    assert_eq!(s.segment_count.current, 0);
    assert_eq!(s.allocation_count.current, 0);
    assert_eq!(dev.used_bytes(), 0, "{}: device memory leaked", pool.name());
    assert_eq!(
        dev.live_objects(),
        (0, 0, 0, 0),
        "{}: driver objects leaked",
        pool.name()
    );
}

/// Address ranges left reserved with nothing mapped after `empty_cache`. `torch` under
/// `expandable_segments:True` keeps, as PyTorch does, the range of an expandable segment
/// whose first mapping failed (`release_blocks` visits mapped free blocks only): no memory,
/// and the range serves the next request of its stream and pool. That is harmless but must
/// not hide a range the pool forgot: each round here allocates a block in the small and in
/// the large pool and frees it again, then releases the cache; a range the pool owns is
/// reused by the round and given back at its release, so every round must leave fewer ranges
/// reserved. (No other pool keeps a range; one that did would have to pass the same rounds.)
fn reuse_kept_ranges(
    pool: &mut dyn Allocator,
    dev: &mut SimDevice,
    live: &mut BTreeMap<u64, Block>,
) {
    let mut kept = dev.live_objects().1;
    while kept > 0 {
        assert_eq!(
            dev.live_objects(),
            (0, kept, 0, 0),
            "{}: a kept range holds memory",
            pool.name()
        );
        for size in [512, 2 * MIB] {
            let b = pool_alloc(pool, dev, live, size, 512).unwrap().unwrap();
            live.remove(&b.addr);
            pool.deallocate(dev, b.addr).unwrap();
            pool.empty_cache(dev).unwrap();
            check_pool(pool, dev, live);
        }
        let left = dev.live_objects().1;
        assert!(
            left < kept,
            "{}: {kept} ranges with nothing mapped are not reused: leaked",
            pool.name()
        );
        kept = left;
    }
}

/// The generic allocator harness: runs `ops` against the strategy `name` on a
/// 64 MiB simulated device, checking every invariant after every operation, and ends by
/// giving everything back.
fn check_allocator(name: &str, ops: &[PoolOp]) {
    let (mut dev, mut pool) = pool_setup(name);
    assert_eq!(Some(pool.name()), name.split(':').next());
    let mut live = BTreeMap::new();
    for op in ops {
        match *op {
            PoolOp::Alloc { size, align_shift } => {
                pool_alloc(&mut *pool, &mut dev, &mut live, size, 1 << align_shift).unwrap();
            }
            PoolOp::Free { pick } => {
                if live.is_empty() {
                    let before = pool.stats();
                    let addr = pick as u64;
                    assert_eq!(
                        pool.deallocate(&mut dev, addr),
                        Err(AllocError::UnknownBlock { addr })
                    );
                    assert_eq!(pool.stats(), before);
                } else {
                    let k = *live.keys().nth(pick % live.len()).unwrap();
                    live.remove(&k);
                    pool.deallocate(&mut dev, k).unwrap();
                    // (c) for pools: the same address again is unknown and changes nothing.
                    let before = pool.stats();
                    assert_eq!(
                        pool.deallocate(&mut dev, k),
                        Err(AllocError::UnknownBlock { addr: k })
                    );
                    assert_eq!(pool.stats(), before);
                }
            }
            PoolOp::ReleaseCached => {
                let reserved = pool.stats().reserved_bytes.current;
                let released = pool.empty_cache(&mut dev).unwrap();
                assert_eq!(pool.stats().reserved_bytes.current, reserved - released);
            }
        }
        check_pool(&*pool, &dev, &live);
    }
    drain_pool(&mut *pool, &mut dev, &mut live);
}

/// A small workload touching every path: small blocks, a block larger than a segment,
/// frees, a cache release and reuse. Returns the live blocks; every error must be an
/// out-of-memory refusal or a (injected) driver error.
fn small_workload(
    pool: &mut dyn Allocator,
    dev: &mut SimDevice,
    live: &mut BTreeMap<u64, Block>,
) -> usize {
    let mut errors = 0;
    let mut step = |pool: &mut dyn Allocator,
                    dev: &mut SimDevice,
                    live: &mut BTreeMap<u64, Block>,
                    r: Result<(), AllocError>| {
        match r {
            Ok(()) => {}
            Err(AllocError::Device(DeviceError::Driver { .. })) => errors += 1,
            Err(e) => panic!("{}: unexpected error {e}", pool.name()),
        }
        check_pool(pool, dev, live);
    };
    for (size, align) in [(MIB, 256), (300, 1), (10 * MIB, 4096), (3 * MIB, 2 * MIB)] {
        let r = pool_alloc(pool, dev, live, size, align).map(|_| ());
        step(pool, dev, live, r);
    }
    if let Some(&k) = live.keys().next() {
        live.remove(&k);
        let r = pool.deallocate(dev, k);
        step(pool, dev, live, r);
    }
    let big: Vec<u64> = live
        .values()
        .filter(|b| b.requested_bytes >= 3 * MIB)
        .map(|b| b.addr)
        .collect();
    for k in big {
        live.remove(&k);
        let r = pool.deallocate(dev, k);
        step(pool, dev, live, r);
    }
    let r = pool.empty_cache(dev).map(|_| ());
    step(pool, dev, live, r);
    for (size, align) in [(5 * MIB, 256), (1000, 512), (40 * MIB, 256)] {
        let r = pool_alloc(pool, dev, live, size, align).map(|_| ());
        step(pool, dev, live, r);
    }
    errors
}

/// A fault injected at every driver call index of the workload in turn: the pool still
/// validates after every step, and nothing leaks once everything is freed and released.
fn fault_at_every_call(name: &str) {
    let (mut dev, mut pool) = pool_setup(name);
    let mut live = BTreeMap::new();
    assert_eq!(small_workload(&mut *pool, &mut dev, &mut live), 0);
    drain_pool(&mut *pool, &mut dev, &mut live);
    let calls = dev.calls_made();
    assert!(
        calls >= 4,
        "{name}: the workload made only {calls} driver calls"
    );
    for at in 0..calls {
        let (mut dev, mut pool) = pool_setup(name);
        dev.inject_fault_at(Some(at));
        let mut live = BTreeMap::new();
        let errors = small_workload(&mut *pool, &mut dev, &mut live);
        assert!(
            errors >= 1 || dev.calls_made() <= at,
            "{name}: the fault at call {at} was swallowed"
        );
        dev.inject_fault_at(None);
        drain_pool(&mut *pool, &mut dev, &mut live);
    }
}

/// Alignment and size edge cases for a pool: invalid alignments, sizes near `u64::MAX`.
fn pool_edges(name: &str) {
    let (mut dev, mut pool) = pool_setup(name);
    let mut live = BTreeMap::new();
    pool_alloc(&mut *pool, &mut dev, &mut live, 1000, 256)
        .unwrap()
        .unwrap();
    let gran = dev.granularity_bytes();
    for bad in [0, 3, 2 * gran, u64::MAX] {
        let before = pool.stats();
        assert!(matches!(
            pool.allocate(&mut dev, 16, bad, 0),
            Err(AllocError::InvalidAlignment { align, .. }) if align == bad
        ));
        assert_eq!(pool.stats(), before);
    }
    for shift in 0..=12 {
        let a = 1u64 << shift;
        for size in [u64::MAX, u64::MAX - a + 1, 1 << 63, 65 * MIB] {
            match pool.allocate(&mut dev, size, a, 0) {
                Err(AllocError::Overflow { .. }) => {}
                Err(e) if e.is_oom() => {}
                other => panic!("{name}: size {size} align {a}: {other:?}"),
            }
            check_pool(&*pool, &dev, &live);
        }
    }
    drain_pool(&mut *pool, &mut dev, &mut live);
}

macro_rules! for_every_pool {
    ($($name:ident => $reg:literal),* $(,)?) => {
        /// Allocators covered by `for_every_pool!`.
        const TESTED: &[&str] = &[$($reg),*];
        $(
            mod $name {
                use super::*;

                proptest! {
                    #![proptest_config(ProptestConfig::with_cases(48))]
                    #[test]
                    fn random_ops(ops in prop::collection::vec(pool_op(), 1..120)) {
                        check_allocator($reg, &ops);
                    }
                }

                #[test]
                fn fault_injected_at_every_driver_call() {
                    fault_at_every_call($reg);
                }

                #[test]
                fn alignment_and_huge_sizes() {
                    pool_edges($reg);
                }
            }
        )*
    };
}

for_every_pool! {
    buddy_pool => "buddy",
    tlsf_pool => "tlsf",
    best_fit_pool => "best-fit",
    paged_pool => "paged",
    paged_lazy_pool => "paged-lazy",
    paged_lazy_pages_pool => "paged-lazy:pages",
    paged_lazy_grow_pool => "paged-lazy:grow",
    torch_pool => "torch",
    torch_expandable_pool => "torch:expandable",
}

/// `torch` answers an empty request as PyTorch does, with a null block (address 0, nothing
/// reserved, no device call) whatever the alignment; each frees once at address 0. (It once
/// gave two live empty blocks one address.)
#[test]
fn torch_gives_null_blocks_to_empty_requests() {
    let (mut dev, mut pool) = pool_setup("torch");
    let blocks: Vec<Block> = [1u64, 1024, 1]
        .iter()
        .map(|&align| pool.allocate(&mut dev, 0, align, 0).unwrap())
        .collect();
    assert!(
        blocks.iter().all(|b| b.addr == 0 && b.allocated_bytes == 0),
        "{blocks:?}"
    );
    assert_eq!(pool.stats().reserved_bytes.current, 0);
    assert_eq!(dev.calls_made(), 0);
    for _ in 0..3 {
        pool.deallocate(&mut dev, 0).unwrap();
    }
    assert!(pool.deallocate(&mut dev, 0).is_err());
    pool.validate().unwrap();
}

#[test]
fn every_strategy_is_tested_or_pending() {
    for name in AllocStrategy::ALL.map(AllocStrategy::name) {
        assert!(
            TESTED.contains(&name) ^ PENDING.contains(&name),
            "{name} must be in exactly one of for_every_pool! and PENDING"
        );
    }
}

/// Pools: the fragmentation case at the pool level, figures from `stats()`.
#[test]
fn pool_reports_free_and_largest_free_on_oom() {
    let config = AllocatorConfig {
        segment_bytes: 8 * GIB,
        ..AllocatorConfig::default()
    };
    let mut dev = SimDevice::new(8 * GIB);
    let mut pool = AllocStrategy::BestFit.build(&config);
    let mut live = BTreeMap::new();
    let get = |pool: &mut dyn Allocator,
               dev: &mut SimDevice,
               live: &mut BTreeMap<u64, Block>,
               size: u64| {
        pool_alloc(pool, dev, live, size, 256)
            .unwrap()
            .unwrap()
            .addr
    };
    let scratch = get(&mut *pool, &mut dev, &mut live, 4 * GIB);
    get(&mut *pool, &mut dev, &mut live, GIB);
    let h1 = get(&mut *pool, &mut dev, &mut live, 768 * MIB);
    get(&mut *pool, &mut dev, &mut live, GIB);
    let h2 = get(&mut *pool, &mut dev, &mut live, 768 * MIB);
    get(&mut *pool, &mut dev, &mut live, 512 * MIB);
    for k in [h1, h2, scratch] {
        live.remove(&k);
        pool.deallocate(&mut dev, k).unwrap();
    }
    assert_eq!(get(&mut *pool, &mut dev, &mut live, GIB), scratch);
    let e = pool.allocate(&mut dev, 4 * GIB, 256, 0).unwrap_err();
    assert_eq!(
        e,
        AllocError::OutOfMemory {
            requested_bytes: 4 * GIB,
            free_bytes: 3 * GIB + 1536 * MIB,
            largest_free_bytes: 3 * GIB,
        }
    );
    let s = pool.stats();
    assert!(s.largest_free_bytes < 4 * GIB && 4 * GIB <= s.free_bytes);
    assert!(s.external_fragmentation() > 0.3);
    assert_eq!(
        s.alloc_retries, 1,
        "the pool released its cache and retried once"
    );
    drain_pool(&mut *pool, &mut dev, &mut live);
}
