//! Expandable segments, and `paged-lazy`'s default placement on them: coarse handles, growing ahead,
//! the small pool, faults anywhere in mapping and unmapping.
use super::*;

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
