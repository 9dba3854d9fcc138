use super::*;
use crate::sim::{SimDevice, DEFAULT_GRANULARITY};
use crate::vmm::PageState;
use crate::DriverCall;

const G: u64 = DEFAULT_GRANULARITY;
const MIB: u64 = 1 << 20;

fn new_pair(capacity_pages: u64) -> (SimDevice, PagedPool) {
    (
        SimDevice::new(capacity_pages * G),
        PagedPool::new(&AllocatorConfig::default())
            .with_quick_slots(0)
            .with_lazy_unmap(false),
    )
}

fn check(a: &PagedPool, d: &SimDevice) {
    a.validate().unwrap();
    a.check_device(d).unwrap();
}

fn calls(d: &SimDevice, c: DriverCall) -> u64 {
    d.counters().get(c)
}

#[test]
fn a_page_is_mapped_while_a_block_touches_it_and_unmapped_after() {
    let (mut d, mut a) = new_pair(64);
    let x = a.allocate(&mut d, MIB, 256, 0).unwrap();
    check(&a, &d);
    assert_eq!(a.mapped_pages(), 1);
    assert_eq!(d.live_objects(), (0, 1, 1, 1));
    let y = a.allocate(&mut d, MIB, 256, 0).unwrap();
    check(&a, &d);
    assert_eq!(a.mapped_pages(), 1, "the second MiB shares the page");
    assert_eq!(y.addr, x.addr + MIB);
    a.deallocate(&mut d, x.addr).unwrap();
    check(&a, &d);
    assert_eq!(a.mapped_pages(), 1, "y still touches the page");
    assert_eq!(calls(&d, DriverCall::Unmap), 0);
    a.deallocate(&mut d, y.addr).unwrap();
    check(&a, &d);
    assert_eq!(a.mapped_pages(), 0);
    assert_eq!(calls(&d, DriverCall::Unmap), 1);
    assert_eq!(a.cached_handles().len(), 1);
    assert_eq!(d.live_objects(), (0, 1, 0, 1), "handle cached, unmapped");
    let s = a.stats();
    assert_eq!(s.reserved_bytes.current, G);
    assert_eq!(s.allocated_bytes.current, 0);
    assert_eq!(
        a.deallocate(&mut d, y.addr),
        Err(AllocError::UnknownBlock { addr: y.addr })
    );
    assert_eq!(a.empty_cache(&mut d).unwrap(), G);
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
    assert_eq!(d.used_bytes(), 0);
    check(&a, &d);
}

#[test]
fn cached_handles_are_remapped_before_any_create() {
    let (mut d, mut a) = new_pair(64);
    // Three whole pages: one handle of 3 pages, one cuMemCreate, one cuMemMap.
    let b = a.allocate(&mut d, 3 * G, 256, 0).unwrap();
    assert_eq!(calls(&d, DriverCall::Create), 1);
    assert_eq!(calls(&d, DriverCall::Map), 1);
    a.deallocate(&mut d, b.addr).unwrap();
    assert_eq!(
        a.cached_handles(),
        &[CachedHandle {
            handle: a.cached_handles()[0].handle,
            pages: 3
        }]
    );
    // The same size again takes the cached handle.
    let c = a.allocate(&mut d, 3 * G, 256, 0).unwrap();
    check(&a, &d);
    assert_eq!(calls(&d, DriverCall::Create), 1, "no new cuMemCreate");
    assert_eq!(calls(&d, DriverCall::Map), 2);
    assert_eq!(a.cached_pages(), 0);
    assert_eq!(a.stats().reserved_bytes.peak, 3 * G);
    a.deallocate(&mut d, c.addr).unwrap();
    // Smaller handles fill a larger run: 2 + 1 pages for 3.
    let x = a.allocate(&mut d, 2 * G, 256, 0).unwrap();
    assert_eq!(
        a.cached_pages(),
        0,
        "the 3-page handle was too large and went back"
    );
    assert_eq!(calls(&d, DriverCall::Release), 1);
    let y = a.allocate(&mut d, G, 256, 0).unwrap();
    a.deallocate(&mut d, x.addr).unwrap();
    a.deallocate(&mut d, y.addr).unwrap();
    assert_eq!(a.cached_pages(), 3);
    assert_eq!(a.cached_handles().len(), 2);
    let creates = calls(&d, DriverCall::Create);
    let maps = calls(&d, DriverCall::Map);
    let z = a.allocate(&mut d, 3 * G, 256, 0).unwrap();
    check(&a, &d);
    assert_eq!(calls(&d, DriverCall::Create), creates);
    assert_eq!(calls(&d, DriverCall::Map), maps + 2);
    assert!(d.is_accessible(z.addr, 3 * G));
    assert_eq!(a.stats().reserved_bytes.peak, 3 * G);
    assert_eq!(d.peak_used_bytes(), 3 * G);
    a.deallocate(&mut d, z.addr).unwrap();
    check(&a, &d);
}

#[test]
fn the_cache_is_bounded_by_config() {
    let mut d = SimDevice::new(64 * G);
    let mut a = PagedPool::new(&AllocatorConfig {
        page_cache_pages: 2,
        ..AllocatorConfig::default()
    })
    .with_quick_slots(0)
    .with_lazy_unmap(false);
    let b = a.allocate(&mut d, 2 * G, 256, 0).unwrap();
    let c = a.allocate(&mut d, 5 * G, 256, 0).unwrap();
    a.deallocate(&mut d, b.addr).unwrap();
    check(&a, &d);
    assert_eq!(a.cached_pages(), 2, "2 pages fit the bound");
    a.deallocate(&mut d, c.addr).unwrap();
    check(&a, &d);
    assert_eq!(a.cached_pages(), 2, "the 5-page handle did not");
    assert_eq!(calls(&d, DriverCall::Release), 1);
    assert_eq!(a.stats().reserved_bytes.current, 2 * G);
    assert_eq!(d.used_bytes(), 2 * G);
}

#[test]
fn small_blocks_pack_into_one_page() {
    let (mut d, mut a) = new_pair(64);
    let mut v = Vec::new();
    for i in 0..8u64 {
        // 256 KiB each, with sizes that need rounding to 256 bytes.
        v.push(a.allocate(&mut d, 256 * 1024 - i, 256, 0).unwrap());
        check(&a, &d);
    }
    assert_eq!(
        a.mapped_pages(),
        1,
        "eight 256 KiB blocks fill one 2 MiB page"
    );
    assert_eq!(calls(&d, DriverCall::Create), 1);
    assert_eq!(a.stats().free_bytes, 0);
    let ninth = a.allocate(&mut d, 100, 256, 0).unwrap();
    assert_eq!(a.mapped_pages(), 2);
    assert_eq!(ninth.allocated_bytes, 256);
    // Free a block in the middle: its 256 KiB is free inside a mapped page, and the next
    // small request lands exactly there without a driver call.
    a.deallocate(&mut d, v[3].addr).unwrap();
    let s = a.stats();
    assert_eq!(
        s.free_bytes,
        256 * 1024 + G - 256,
        "the hole + the ninth block's page"
    );
    assert_eq!(s.largest_free_bytes, G - 256);
    assert_eq!(s.reserved_bytes.current, 2 * G);
    let before = d.counters().total();
    let again = a.allocate(&mut d, 4096, 256, 0).unwrap();
    assert_eq!(again.addr, v[3].addr);
    assert_eq!(d.counters().total(), before);
    check(&a, &d);
}

#[test]
fn a_large_block_shares_its_edge_pages_with_small_ones() {
    let (mut d, mut a) = new_pair(64);
    let small = a.allocate(&mut d, MIB, 256, 0).unwrap();
    // 3 MiB: 1 MiB in the free tail of the first page + one new page.
    let big = a.allocate(&mut d, 3 * MIB, 256, 0).unwrap();
    check(&a, &d);
    assert_eq!(big.addr, small.addr + MIB);
    assert_eq!(a.mapped_pages(), 2);
    assert_eq!(a.stats().reserved_bytes.peak, 2 * G);
}

#[test]
fn alignment_up_to_the_page_size() {
    let (mut d, mut a) = new_pair(64);
    let _pad = a.allocate(&mut d, 1000, 256, 0).unwrap();
    let mut align = 1;
    while align <= G {
        let b = a.allocate(&mut d, 3000, align, 0).unwrap();
        assert_eq!(b.addr % align, 0, "align {align}");
        assert_eq!(b.addr % 256, 0);
        check(&a, &d);
        align *= 2;
    }
    assert_eq!(
        a.allocate(&mut d, 10, 2 * G, 0),
        Err(AllocError::InvalidAlignment {
            align: 2 * G,
            max: G
        })
    );
    assert!(matches!(
        a.allocate(&mut d, 10, 3, 0),
        Err(AllocError::InvalidAlignment { .. })
    ));
    assert!(matches!(
        a.allocate(&mut d, 10, 0, 0),
        Err(AllocError::InvalidAlignment { .. })
    ));
    assert!(matches!(
        a.allocate(&mut d, u64::MAX - 5, 256, 0),
        Err(AllocError::Overflow { .. })
    ));
    check(&a, &d);
}

#[test]
fn one_create_map_and_set_access_per_run_of_new_pages() {
    let (mut d, mut a) = new_pair(64);
    let b = a.allocate(&mut d, 10 * G, 256, 0).unwrap();
    assert_eq!(calls(&d, DriverCall::Create), 1);
    assert_eq!(calls(&d, DriverCall::Map), 1);
    assert_eq!(calls(&d, DriverCall::SetAccess), 1);
    assert!(d.is_accessible(b.addr, 10 * G));
    a.deallocate(&mut d, b.addr).unwrap();
    assert_eq!(calls(&d, DriverCall::Unmap), 1);
    a.empty_cache(&mut d).unwrap();
    // Half a page, then a block over the rest of that page, 2 whole pages and most of a
    // third: one handle for the 2 whole pages, one for the partly covered last page (it may
    // be shared later), and one cuMemSetAccess over all 3 new pages.
    let s = a.allocate(&mut d, G / 2, 256, 0).unwrap();
    let before = d.counters();
    let c = a.allocate(&mut d, 3 * G + G / 2 - 1000, 256, 0).unwrap();
    assert_eq!(c.addr, s.addr + G / 2);
    let delta = |k: DriverCall| d.counters().get(k) - before.get(k);
    assert_eq!(delta(DriverCall::Create), 2);
    assert_eq!(delta(DriverCall::Map), 2);
    assert_eq!(delta(DriverCall::SetAccess), 1);
    check(&a, &d);
    let rows = a.page_table();
    assert_eq!(rows[0].bytes, G);
    assert_eq!(rows[1].bytes, 2 * G, "one row per handle");
    assert_eq!(rows[2].bytes, G);
    // The partly covered page is shared by the next block.
    let t = a.allocate(&mut d, 500, 256, 0).unwrap();
    assert_eq!(t.addr, c.addr + c.allocated_bytes);
    a.deallocate(&mut d, c.addr).unwrap();
    check(&a, &d);
    assert_eq!(a.mapped_pages(), 2, "s's page and t's page stay");
}

#[test]
fn out_of_memory_changes_nothing_and_leaks_nothing() {
    let (mut d, mut a) = new_pair(4);
    let x = a.allocate(&mut d, G + 1, 256, 0).unwrap(); // 2 pages
    let stats = a.stats();
    let e = a.allocate(&mut d, 3 * G, 256, 0).unwrap_err();
    assert!(
        matches!(e, AllocError::OutOfMemory { requested_bytes, .. } if requested_bytes == 3 * G)
    );
    check(&a, &d);
    assert_eq!(a.stats().allocated_bytes, stats.allocated_bytes);
    assert_eq!(
        a.stats().reserved_bytes.current,
        stats.reserved_bytes.current
    );
    assert_eq!(a.live_blocks(), vec![(x.addr, G + 256)]);
    // Two pages fit (one of them shared with x's tail).
    let y = a.allocate(&mut d, 2 * G, 256, 0).unwrap();
    check(&a, &d);
    assert_eq!(a.mapped_pages(), 4);
    a.deallocate(&mut d, x.addr).unwrap();
    a.deallocate(&mut d, y.addr).unwrap();
    a.empty_cache(&mut d).unwrap();
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
}

#[test]
fn a_request_above_the_capacity_is_refused_without_driver_calls() {
    let (mut d, mut a) = new_pair(4);
    for size in [4 * G + 1, 1 << 45, u64::MAX / 4] {
        let e = a.allocate(&mut d, size, 256, 0).unwrap_err();
        assert!(
            matches!(e, AllocError::OutOfMemory { requested_bytes, .. } if requested_bytes == size)
        );
    }
    assert_eq!(d.calls_made(), 0);
    let b = a.allocate(&mut d, 4 * G, 256, 0).unwrap();
    check(&a, &d);
    a.deallocate(&mut d, b.addr).unwrap();
}

#[test]
fn oom_releases_the_cache_and_retries_once() {
    let (mut d, mut a) = new_pair(4);
    let x = a.allocate(&mut d, 2 * G, 256, 0).unwrap();
    let y = a.allocate(&mut d, G, 256, 0).unwrap();
    a.deallocate(&mut d, x.addr).unwrap();
    assert_eq!(a.cached_pages(), 2);
    // 4 new pages: the cached 2 + 2 created, beyond the device.
    let e = a.allocate(&mut d, 4 * G, 256, 0).unwrap_err();
    assert!(e.is_oom());
    let s = a.stats();
    assert_eq!(s.alloc_retries, 1);
    assert_eq!(a.cached_pages(), 0, "the cache was given back");
    assert_eq!(d.used_bytes(), G, "only y's page is left");
    assert_eq!(s.reserved_bytes.current, G);
    assert_eq!(a.live_blocks(), vec![(y.addr, G)]);
    check(&a, &d);
}

#[test]
fn other_granularities_are_queried_not_assumed() {
    let g = 64 * 1024;
    let mut d = SimDevice::with_granularity(1 << 30, g);
    let mut a = PagedPool::new(&AllocatorConfig::default())
        .with_quick_slots(0)
        .with_lazy_unmap(false);
    let b = a.allocate(&mut d, 100_000, 256, 0).unwrap();
    assert_eq!(a.page_bytes(), g);
    assert_eq!(a.mapped_pages(), 2);
    let c = a.allocate(&mut d, 1000, g, 0).unwrap();
    assert_eq!(c.addr % g, 0);
    check(&a, &d);
    a.deallocate(&mut d, b.addr).unwrap();
    a.deallocate(&mut d, c.addr).unwrap();
    check(&a, &d);
    assert_eq!(a.mapped_pages(), 0);
}

#[test]
fn more_virtual_ranges_are_reserved_when_needed() {
    let mut d = SimDevice::new(64 * G);
    let mut a = PagedPool::new(&AllocatorConfig::default()).with_va_chunk_bytes(4 * G);
    let x = a.allocate(&mut d, 3 * G, 256, 0).unwrap();
    let y = a.allocate(&mut d, 3 * G, 256, 0).unwrap();
    assert_eq!(a.reserved_ranges().len(), 2);
    let z = a.allocate(&mut d, 9 * G, 256, 0).unwrap();
    let r = a.reserved_ranges();
    assert_eq!(r.len(), 3);
    assert!(r.iter().any(|&(_, b)| b == 9 * G));
    check(&a, &d);
    for b in [x, y, z] {
        a.deallocate(&mut d, b.addr).unwrap();
        check(&a, &d);
    }
    a.empty_cache(&mut d).unwrap();
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
    assert!(a.reserved_ranges().is_empty());
}

#[test]
fn page_table_view_lists_mapped_and_unmapped_rows() {
    let mut d = SimDevice::new(64 * G);
    let mut a = PagedPool::new(&AllocatorConfig::default()).with_va_chunk_bytes(8 * G);
    let x = a.allocate(&mut d, G + 10, 256, 0).unwrap();
    let rows = a.page_table();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].va, x.addr);
    assert_eq!(rows[0].state, PageState::Mapped);
    assert_eq!((rows[0].live_blocks, rows[0].access), (1, true));
    assert_eq!(rows[1].state, PageState::Mapped);
    assert_eq!(rows[2].state, PageState::ReservedUnmapped);
    assert_eq!(rows[2].va, x.addr + 2 * G);
    assert_eq!(rows[2].bytes, 6 * G);
    assert!(rows.iter().all(|r| r.page_bytes == G));
    assert_eq!(rows.iter().map(|r| r.bytes).sum::<u64>(), 8 * G);
    let text = rows[0].to_string();
    assert!(text.ends_with("| 2 MiB | mapped, 1 block"), "{text}");
    assert!(text.starts_with(&format!("{:#x} - {:#x} | handle ", x.addr, x.addr + G)));
    assert!(rows[2]
        .to_string()
        .ends_with("| unmapped | 2 MiB | reserved, 6 pages"));
}

#[test]
fn zero_size_takes_the_smallest_block() {
    let (mut d, mut a) = new_pair(4);
    let b = a.allocate(&mut d, 0, 256, 0).unwrap();
    assert_eq!(b.allocated_bytes, 256);
    assert_eq!(b.requested_bytes, 0);
    check(&a, &d);
}

/// Tiny deterministic generator for the workloads below.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// One operation of the fault workload.
#[derive(Debug, Clone, Copy)]
enum Op {
    Alloc(u64, u64),
    Free(usize),
    Release,
}

fn workload() -> Vec<Op> {
    let mut r = Lcg(7);
    let mut ops = Vec::new();
    for i in 0..60 {
        if i % 23 == 22 {
            ops.push(Op::Release);
        } else if r.next().is_multiple_of(3) {
            ops.push(Op::Free(r.next() as usize));
        } else {
            let size = match r.next() % 4 {
                0 => r.next() % 4096,
                1 => r.next() % (G / 2),
                2 => r.next() % (3 * G),
                _ => G * (1 + r.next() % 2),
            };
            let align = 1u64 << (r.next() % 22);
            ops.push(Op::Alloc(size, align));
        }
    }
    ops
}

/// Runs the workload; returns the number of driver calls it made and of allocations
/// refused for lack of memory.
fn run_workload(d: &mut SimDevice, a: &mut PagedPool) -> (u64, u64) {
    let mut ooms = 0;
    let mut live: Vec<u64> = Vec::new();
    for op in workload() {
        let before_stats = a.stats();
        let before_live = a.live_blocks();
        let before_reserved = a.stats().reserved_bytes.current;
        let res = match op {
            Op::Alloc(size, align) => a.allocate(d, size, align, 0).map(|b| live.push(b.addr)),
            Op::Free(i) if !live.is_empty() => {
                let k = i % live.len();
                let addr = live[k];
                a.deallocate(d, addr).map(|()| {
                    live.swap_remove(k);
                })
            }
            Op::Free(_) => Ok(()),
            Op::Release => a.empty_cache(d).map(|_| ()),
        };
        a.validate().unwrap();
        a.check_device(d).unwrap();
        match res {
            Err(e) if !matches!(op, Op::Release) => {
                let s = a.stats();
                assert_eq!(
                    a.live_blocks(),
                    before_live,
                    "{op:?} failed but changed blocks"
                );
                assert_eq!(s.allocated_bytes, before_stats.allocated_bytes);
                assert_eq!(s.requested_bytes, before_stats.requested_bytes);
                assert_eq!(s.allocation_count, before_stats.allocation_count);
                ooms += u64::from(e.is_oom());
                if matches!(op, Op::Alloc(..)) {
                    // A failed allocation may only have given cached memory back (out of
                    // memory, or cached handles too large to use released before creating).
                    assert!(s.reserved_bytes.current <= before_reserved, "{op:?}: {e}");
                } else {
                    assert_eq!(s.reserved_bytes.current, before_reserved, "{op:?}: {e}");
                }
            }
            _ => {}
        }
    }
    // Clean up; the one injected fault may hit here, so a failed call is retried once.
    for addr in live {
        if a.deallocate(d, addr).is_err() {
            a.validate().unwrap();
            a.deallocate(d, addr).unwrap();
        }
    }
    if a.empty_cache(d).is_err() {
        a.validate().unwrap();
        a.empty_cache(d).unwrap();
    }
    a.validate().unwrap();
    a.check_device(d).unwrap();
    (d.calls_made(), ooms)
}

#[test]
fn a_fault_at_any_driver_call_is_unwound_exactly() {
    for (slots, lazy) in [
        (0, false),
        (0, true),
        (QUICK_SLOTS, false),
        (QUICK_SLOTS, true),
    ] {
        let mk = || {
            let d = SimDevice::new(16 * G);
            let a = PagedPool::new(&AllocatorConfig {
                page_cache_pages: 3,
                ..AllocatorConfig::default()
            })
            .with_va_chunk_bytes(6 * G)
            .with_quick_slots(slots)
            .with_lazy_unmap(lazy);
            (d, a)
        };
        let (mut d, mut a) = mk();
        let (total, ooms) = run_workload(&mut d, &mut a);
        assert!(total > 100, "the workload makes {total} calls");
        assert!(ooms > 0, "the workload runs out of memory");
        assert_eq!(d.live_objects(), (0, 0, 0, 0));
        for f in 0..total {
            let (mut d, mut a) = mk();
            d.inject_fault_at(Some(f));
            run_workload(&mut d, &mut a);
            assert_eq!(d.live_objects(), (0, 0, 0, 0), "fault at call {f} leaked");
            assert_eq!(d.used_bytes(), 0, "fault at call {f}");
        }
    }
}

#[test]
fn random_workload_keeps_every_invariant() {
    let mut d = SimDevice::new(256 * G);
    let mut a = PagedPool::new(&AllocatorConfig::default()).with_va_chunk_bytes(64 * G);
    let mut r = Lcg(99);
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut req = 0u64;
    let mut peak_req = 0u64;
    for i in 0..3000 {
        if r.next().is_multiple_of(2) && !live.is_empty() {
            let k = r.next() as usize % live.len();
            let (addr, size) = live.swap_remove(k);
            a.deallocate(&mut d, addr).unwrap();
            req -= size;
        } else {
            let size = match r.next() % 3 {
                0 => r.next() % 8192,
                1 => r.next() % (G * 2),
                _ => r.next() % (G * 9),
            };
            let b = a.allocate(&mut d, size, 256, 0).unwrap();
            // No overlap with any live block.
            for &(o, os) in &live {
                let oe = o + os.max(1);
                assert!(b.addr + size.max(1) <= o || oe <= b.addr, "overlap");
            }
            live.push((b.addr, size));
            req += size;
            peak_req = peak_req.max(req);
        }
        if i % 50 == 0 {
            check(&a, &d);
        }
    }
    check(&a, &d);
    let s = a.stats();
    assert_eq!(s.requested_bytes.peak, peak_req);
    assert_eq!(s.reserved_bytes.peak, d.peak_used_bytes());
}

#[test]
fn quick_list_reuses_same_size_blocks_without_driver_calls() {
    let mut d = SimDevice::new(4 * G);
    let mut a = PagedPool::new(&AllocatorConfig::default());
    let x = a.allocate(&mut d, 2 * G - 1000, 256, 0).unwrap();
    let before = d.counters().total();
    for _ in 0..10 {
        a.deallocate(&mut d, x.addr).unwrap();
        check(&a, &d);
        assert_eq!(a.stats().allocated_bytes.current, 0);
        assert_eq!(a.mapped_pages(), 2, "held by the quick list");
        assert_eq!(
            a.deallocate(&mut d, x.addr),
            Err(AllocError::UnknownBlock { addr: x.addr })
        );
        let y = a.allocate(&mut d, 2 * G - 1000, 256, 0).unwrap();
        assert_eq!(y.addr, x.addr);
        check(&a, &d);
    }
    assert_eq!(d.counters().total(), before, "no driver call");
    // A request that needs pages first flushes the list: 3 pages fit in a 4-page device
    // only because the two held pages are unmapped and reused.
    a.deallocate(&mut d, x.addr).unwrap();
    let z = a.allocate(&mut d, 3 * G, 256, 0).unwrap();
    check(&a, &d);
    assert_eq!(a.mapped_pages(), 3);
    assert_eq!(a.stats().reserved_bytes.peak, 3 * G);
    assert_eq!(d.counters().get(DriverCall::Create), 3);
    a.deallocate(&mut d, z.addr).unwrap();
    a.empty_cache(&mut d).unwrap();
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
    check(&a, &d);
}

#[test]
fn lazy_unmapping_keeps_idle_pages_mapped_and_reuses_them_in_place() {
    let mut d = SimDevice::new(8 * G);
    let mut a = PagedPool::new(&AllocatorConfig {
        page_cache_pages: 3,
        ..AllocatorConfig::default()
    })
    .with_quick_slots(0);
    let xs: Vec<_> = (0..4)
        .map(|_| a.allocate(&mut d, G, 256, 0).unwrap())
        .collect();
    let pin = a.allocate(&mut d, 1000, 256, 0).unwrap(); // keeps the VA after them in use
    assert_eq!(pin.addr, xs[3].addr + G);
    for x in &xs {
        a.deallocate(&mut d, x.addr).unwrap();
        check(&a, &d);
    }
    // Three pages stay mapped (the bound), the fourth is unmapped and released.
    assert_eq!(a.idle_pages(), 3);
    assert_eq!(a.cached_pages(), 0);
    assert_eq!(calls(&d, DriverCall::Unmap), 1);
    assert_eq!(calls(&d, DriverCall::Release), 1);
    assert_eq!(a.stats().reserved_bytes.current, 4 * G);
    // The same place again, without a driver call.
    let before = d.counters().total();
    let y = a.allocate(&mut d, G, 256, 0).unwrap();
    check(&a, &d);
    assert_eq!(y.addr, xs[0].addr);
    assert_eq!(d.counters().total(), before);
    assert_eq!(a.idle_pages(), 2);
    for b in [y, pin] {
        a.deallocate(&mut d, b.addr).unwrap();
    }
    a.empty_cache(&mut d).unwrap();
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
    check(&a, &d);
}

#[test]
fn idle_pages_elsewhere_are_taken_before_any_create() {
    let mut d = SimDevice::new(8 * G);
    let mut a = PagedPool::new(&AllocatorConfig::default()).with_quick_slots(0);
    let x0 = a.allocate(&mut d, G, 256, 0).unwrap(); // page 0
    let x1 = a.allocate(&mut d, G, 256, 0).unwrap(); // page 1
    let pin = a.allocate(&mut d, 1000, 256, 0).unwrap(); // page 2
    a.deallocate(&mut d, x0.addr).unwrap();
    a.deallocate(&mut d, x1.addr).unwrap();
    assert_eq!(a.idle_pages(), 2);
    assert_eq!(a.stats().reserved_bytes.current, 3 * G);
    // 3 pages do not fit in x's hole; they need three new pages: two come from the idle
    // pages (unmapped there with one call, mapped here), one is created.
    let before = d.counters();
    let b = a.allocate(&mut d, 3 * G, 256, 0).unwrap();
    check(&a, &d);
    let delta = |c: DriverCall| d.counters().get(c) - before.get(c);
    assert_eq!(delta(DriverCall::Unmap), 1);
    assert_eq!(delta(DriverCall::Map), 3);
    assert_eq!(delta(DriverCall::Create), 1);
    assert_eq!(delta(DriverCall::SetAccess), 1);
    assert_eq!(a.idle_pages(), 0);
    assert_eq!(a.stats().reserved_bytes.peak, 4 * G);
    assert_eq!(d.peak_used_bytes(), 4 * G);
    for blk in [b, pin] {
        a.deallocate(&mut d, blk.addr).unwrap();
    }
    a.empty_cache(&mut d).unwrap();
    assert_eq!(d.live_objects(), (0, 0, 0, 0));
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum POp {
        Alloc { size: u64, align_shift: u32 },
        Free(usize),
        Release,
    }

    fn op() -> impl Strategy<Value = POp> {
        prop_oneof![
            6 => (0u64..5 * G, 0u32..22).prop_map(|(size, align_shift)| POp::Alloc { size, align_shift }),
            2 => (0u64..4096).prop_map(|size| POp::Alloc { size, align_shift: 8 }),
            5 => any::<usize>().prop_map(POp::Free),
            1 => Just(POp::Release),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_sequence_keeps_invariants_and_leaks_nothing(
            ops in proptest::collection::vec(op(), 1..80),
            slots in prop_oneof![Just(0usize), Just(QUICK_SLOTS)],
            lazy in any::<bool>(),
            cache in 0u64..6,
        ) {
            let mut d = SimDevice::new(24 * G);
            let mut a = PagedPool::new(&AllocatorConfig { page_cache_pages: cache, ..AllocatorConfig::default() })
                .with_va_chunk_bytes(16 * G)
                .with_quick_slots(slots)
                .with_lazy_unmap(lazy);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for o in ops {
                match o {
                    POp::Alloc { size, align_shift } => {
                        let align = 1u64 << align_shift;
                        match a.allocate(&mut d, size, align, 0) {
                            Ok(b) => {
                                prop_assert_eq!(b.addr % align, 0);
                                prop_assert!(b.allocated_bytes >= size.max(1));
                                for &(o, os) in &live {
                                    prop_assert!(b.addr + b.allocated_bytes <= o || o + os <= b.addr);
                                }
                                live.push((b.addr, b.allocated_bytes));
                            }
                            Err(e) => prop_assert!(e.is_oom(), "{e}"),
                        }
                    }
                    POp::Free(i) if !live.is_empty() => {
                        let (addr, _) = live.swap_remove(i % live.len());
                        a.deallocate(&mut d, addr).unwrap();
                    }
                    POp::Free(_) => {}
                    POp::Release => {
                        a.empty_cache(&mut d).unwrap();
                        prop_assert!(a.cached_handles().is_empty());
                        prop_assert_eq!(a.idle_pages(), 0);
                    }
                }
                a.validate().unwrap();
                a.check_device(&d).unwrap();
                prop_assert_eq!(a.stats().reserved_bytes.peak, d.peak_used_bytes());
                // The column search and the closed-form scan agree with the generic search.
                if a.vmm.page_bytes > 0 {
                    for bytes in [UNIT_BYTES, 3 * UNIT_BYTES, G / 2, G - UNIT_BYTES, G, G + 7 * UNIT_BYTES, 2 * G - UNIT_BYTES, 2 * G + G / 2, 3 * G] {
                        let fast = a.find_scored_fit_unit(bytes).map(|(pl, k)| (pl.res, pl.range_start, pl.addr, k));
                        let scan = a.find_scored_fit_scan(bytes).map(|(pl, k)| (pl.res, pl.range_start, pl.addr, k));
                        let slow = a.find_scored_fit_any(bytes, UNIT_BYTES).map(|(pl, k)| (pl.res, pl.range_start, pl.addr, k));
                        prop_assert_eq!(fast, slow, "{} bytes", bytes);
                        prop_assert_eq!(scan, slow, "{} bytes", bytes);
                    }
                }
            }
            for (addr, _) in live {
                a.deallocate(&mut d, addr).unwrap();
            }
            a.empty_cache(&mut d).unwrap();
            prop_assert_eq!(d.live_objects(), (0, 0, 0, 0));
        }
    }
}

/// A device whose cuMemSetAccess and cuMemUnmap can be made to fail, to reach the unwind
/// paths a single injected fault cannot (an unmap failing twice while unwinding).
struct Flaky {
    inner: SimDevice,
    fail_set_access: bool,
    fail_unmap: bool,
}

crate::forward_device! {
    impl Device for Flaky => inner {
        fn set_access(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            if self.fail_set_access {
                return Err(DeviceError::Driver {
                    call: "cuMemSetAccess",
                    name: "test".into(),
                });
            }
            self.inner.set_access(va, bytes)
        }
        fn unmap(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            if self.fail_unmap {
                return Err(DeviceError::Driver {
                    call: "cuMemUnmap",
                    name: "test".into(),
                });
            }
            self.inner.unmap(va, bytes)
        }
    }
}

#[test]
fn pages_an_unwind_cannot_unmap_are_quarantined_then_released() {
    for lazy in [false, true] {
        let mut d = Flaky {
            inner: SimDevice::new(64 * G),
            fail_set_access: false,
            fail_unmap: false,
        };
        let mut a = PagedPool::new(&AllocatorConfig::default()).with_lazy_unmap(lazy);
        let x = a.allocate(&mut d, G / 2, 256, 0).unwrap();
        d.fail_set_access = true;
        d.fail_unmap = true;
        let before = a.stats();
        // Pages 1..=3 whole and page 4 in part: two handles mapped, access refused, and the
        // unwind cannot unmap them.
        let e = a.allocate(&mut d, 4 * G - 1000, 256, 0).unwrap_err();
        assert!(matches!(e, AllocError::Device(DeviceError::Driver { .. })));
        a.validate().unwrap();
        a.check_device(&d.inner).unwrap();
        assert_eq!(a.live_blocks(), vec![(x.addr, G / 2)]);
        assert_eq!(a.stats().allocated_bytes, before.allocated_bytes);
        assert_eq!(a.mapped_pages(), 5, "x's page + 4 quarantined");
        // The quarantined VA is not handed out while it is held.
        d.fail_set_access = false;
        d.fail_unmap = false;
        let y = a.allocate(&mut d, 4 * G, 256, 0).unwrap();
        assert!(y.addr >= x.addr + 5 * G || y.addr + 4 * G <= x.addr);
        a.validate().unwrap();
        a.check_device(&d.inner).unwrap();
        for b in [x, y] {
            a.deallocate(&mut d, b.addr).unwrap();
        }
        a.empty_cache(&mut d).unwrap();
        a.validate().unwrap();
        assert_eq!(d.inner.live_objects(), (0, 0, 0, 0));
        assert_eq!(d.inner.used_bytes(), 0);
    }
}

/// The fit tag's closed form ([`placement::fit_fast`]) and the head's mask form
/// ([`placement::usable_head_at`]) against the definitions in page indices, at every unit
/// offset and length over three pages, for three page sizes and a reservation base.
#[test]
fn fit_forms_match_their_definitions() {
    for p in [256u64, 4096, 2 << 20] {
        let base = 64 * p;
        let u = (p / 256).max(1);
        let step = 256 * (u / 64).max(1);
        for off in (0..3 * p).step_by(step as usize) {
            for len in (256..3 * p).step_by(step as usize) {
                let st = base + off;
                assert_eq!(
                    placement::fit_fast(p, base, st, len),
                    placement::fit_of(p, base, st, len),
                    "p {p} off {off} len {len}"
                );
                let (i0, i1) = (off.div_ceil(p), (off + len) / p);
                let head = if i1 <= i0 { len } else { i0 * p - off };
                assert_eq!(placement::usable_head_at(p, base, st, len), head);
            }
        }
    }
}
