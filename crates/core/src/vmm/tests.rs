//! Property tests of the substrate on its own: the quick list and the handle cache against
//! plain models, and random reservations, mappings, unmappings, trims and releases with a
//! driver fault injected at a random call, with [`Vmm::validate`] and the simulated device's
//! cross-check after every operation.
use super::check::{device_agrees, Held};
use super::handles::{HandleCache, ReleaseOrder};
use super::map::{self, Page, PlanRun, Taken};
use super::quick::{QuickBlock, QuickList};
use super::range_map::{NoTags, RangeMap};
use super::reserve::{self, PageIndex};
use super::*;
use crate::device::PhysHandle;
use crate::sim::SimDevice;
use crate::Device;
use proptest::prelude::*;
use std::collections::VecDeque;

const P: u64 = 2 << 20;

/// The test placement keeps no index of its own.
impl PageIndex for () {
    fn new(_: usize) -> Self {}
}

#[derive(Debug, Clone)]
enum QuickOp {
    Free { size: u64 },
    Take { size: u64, align_sh: u32 },
    PopBack,
    Flush { keep_mask: u32 },
}

fn quick_op() -> impl Strategy<Value = QuickOp> {
    prop_oneof![
        4 => (1u64..5).prop_map(|size| QuickOp::Free { size }),
        3 => (1u64..5, 8u32..11).prop_map(|(size, align_sh)| QuickOp::Take { size, align_sh }),
        1 => Just(QuickOp::PopBack),
        1 => any::<u32>().prop_map(|keep_mask| QuickOp::Flush { keep_mask }),
    ]
}

#[derive(Debug, Clone)]
enum CacheOp {
    Push { pages: u64 },
    TakeFitting { n: u64 },
    TakeLargest,
    PopLast,
}

fn cache_op() -> impl Strategy<Value = CacheOp> {
    prop_oneof![
        3 => prop_oneof![1u64..5, 62u64..68].prop_map(|pages| CacheOp::Push { pages }),
        2 => prop_oneof![0u64..6, 60u64..70].prop_map(|n| CacheOp::TakeFitting { n }),
        1 => Just(CacheOp::TakeLargest),
        1 => Just(CacheOp::PopLast),
    ]
}

#[derive(Debug, Clone)]
enum VmmOp {
    /// Reserve a range of at least `pages` pages.
    Reserve { pages: u64 },
    /// Map `pages` pages at the first unmapped run of that length in reservation `res`.
    Map { res: usize, pages: u64 },
    /// Unmap the `k`-th mapped extent into the cache, then trim.
    Unmap { k: usize },
    /// Release every cached handle.
    ReleaseAll { largest_first: bool },
    /// Give back the reservations with nothing mapped.
    ReleaseUnused,
}

fn vmm_op() -> impl Strategy<Value = VmmOp> {
    prop_oneof![
        1 => (1u64..12).prop_map(|pages| VmmOp::Reserve { pages }),
        4 => (0usize..3, 1u64..5).prop_map(|(res, pages)| VmmOp::Map { res, pages }),
        3 => (0usize..8).prop_map(|k| VmmOp::Unmap { k }),
        1 => any::<bool>().prop_map(|largest_first| VmmOp::ReleaseAll { largest_first }),
        1 => Just(VmmOp::ReleaseUnused),
    ]
}

/// The mapped extents as `(reservation, first page, entry)`, in address order.
fn extents(v: &Vmm<()>) -> Vec<(usize, usize, Page)> {
    let mut out = Vec::new();
    for (ri, r) in v.reservations.iter().enumerate() {
        for (i, s) in r.pages.iter().enumerate() {
            if let Some(pg) = s.filter(|pg| pg.ext_first as usize == i) {
                out.push((ri, i, pg));
            }
        }
    }
    out
}

/// Writes the entry of a handle mapped at `page` of reservation `ri` (in its first slot:
/// the substrate's checks are layout-agnostic).
fn set_entry(v: &mut Vmm<()>, ri: usize, page: usize, h: CachedHandle, access: bool) {
    if let Some(slot) = v.reservations[ri].pages.get_mut(page) {
        *slot = Some(Page {
            handle: h.handle,
            ext_first: page as u32,
            ext_pages: h.pages as u32,
            refs: 0,
            access,
        });
    }
    v.mapped_pages += h.pages;
}

/// Maps `pages` pages in reservation `ri` at its first unmapped run of that length: handles
/// from the cache first, then created; on failure unwinds as the pools do (a mapping whose
/// unmap fails twice stays, quarantined).
fn map_pages(v: &mut Vmm<()>, dev: &mut SimDevice, ri: usize, pages: u64) {
    let Some(r) = v.reservations.get(ri) else {
        return;
    };
    let n = pages as usize;
    let free_at = |i: usize| r.pages.get(i).is_some_and(Option::is_none);
    let covered: Vec<bool> = {
        let mut c = vec![false; r.npages];
        for (i, s) in r.pages.iter().enumerate() {
            if let Some(pg) = s {
                let f = pg.ext_first as usize;
                for x in c.iter_mut().skip(f).take(pg.ext_pages as usize) {
                    *x = true;
                }
                let _ = i;
            }
        }
        c
    };
    let Some(at) = (0..r.npages.saturating_sub(n - 1))
        .find(|&a| (a..a + n).all(|i| free_at(i) && !covered[i]))
    else {
        return;
    };
    let mut plan: Vec<PlanRun> = Vec::new();
    let (mut page, mut rest) = (at, pages);
    while rest > 0 {
        match v.cache.take_fitting(rest) {
            Some(h) => {
                plan.push((page, Some(h), h.pages));
                page += h.pages as usize;
                rest -= h.pages;
            }
            None => {
                plan.push((page, None, rest));
                rest = 0;
            }
        }
    }
    let mut taken: Vec<Taken> = Vec::new();
    let base = v.reservations[ri].va;
    if v.map_plan(dev, ri, &plan, &mut taken).is_err() {
        for run in map::unwind_runs(&taken, false) {
            let t = run[0];
            let va = base + t.page as u64 * P;
            if map::unmap_retried(dev, va, t.handle.pages * P) {
                v.untake_handle(dev, t.handle, t.from_cache);
            } else {
                set_entry(v, ri, t.page, t.handle, false);
                v.quarantine.push((va, t.handle.pages * P));
            }
        }
        return;
    }
    for t in &taken {
        set_entry(v, ri, t.page, t.handle, true);
    }
}

/// Unmaps the `k`-th mapped extent (not a quarantined one) into the cache.
fn unmap_extent(v: &mut Vmm<()>, dev: &mut SimDevice, k: usize) {
    let open: Vec<_> = extents(v).into_iter().filter(|e| e.2.access).collect();
    let Some(&(ri, i, pg)) = open.get(k) else {
        return;
    };
    let va = v.reservations[ri].va + i as u64 * P;
    let bytes = u64::from(pg.ext_pages) * P;
    if dev.unmap(va, bytes).is_err() {
        return;
    }
    if let Some(slot) = v.reservations[ri].pages.get_mut(i) {
        *slot = None;
    }
    v.mapped_pages -= u64::from(pg.ext_pages);
    v.cache.push(CachedHandle {
        handle: pg.handle,
        pages: u64::from(pg.ext_pages),
    });
    if v.cache.over(0) {
        v.cache.trim_pending = true;
    }
    v.trim_cache(dev, 0);
}

fn held(v: &Vmm<()>) -> Held {
    Held {
        ranges: v.reservations.len(),
        mapped_handles: extents(v).len(),
        cached_handles: v.cache.len(),
        reserved_bytes: v.tracker.stats.reserved_bytes.current,
        live_blocks: Vec::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The quick list as a pool drives it (admit, evict the oldest until it fits, push;
    /// take the newest match; flush) against a deque, with its bounds.
    #[test]
    fn quick_list_matches_a_deque(
        ops in proptest::collection::vec(quick_op(), 1..60),
        max_blocks in 0usize..5,
        max_units in prop_oneof![Just(None), (1u64..12).prop_map(Some)],
    ) {
        let u = UNIT_BYTES;
        let mut q = QuickList::new(max_blocks);
        q.set_max_bytes(max_units.map(|m| m * u));
        let mut model: VecDeque<QuickBlock> = VecDeque::new();
        let mut next_addr = 1u64 << 20;
        for op in ops {
            match op {
                QuickOp::Free { size } => {
                    let b = QuickBlock { addr: next_addr, bytes: size * u };
                    next_addr += 1 << 12;
                    if q.admits(b.bytes) {
                        while let Some(old) = q.must_go_for(b.bytes) {
                            prop_assert_eq!(Some(old), model.pop_front());
                            q.pop_front();
                        }
                        prop_assert!(q.has_room(b.bytes));
                        q.push_back(b);
                        model.push_back(b);
                    } else {
                        prop_assert!(max_blocks == 0 || max_units.is_some_and(|m| size > m));
                    }
                }
                QuickOp::Take { size, align_sh } => {
                    let align = 1u64 << align_sh;
                    let want = model
                        .iter()
                        .rposition(|b| b.bytes == size * u && b.addr % align == 0)
                        .and_then(|i| model.remove(i));
                    prop_assert_eq!(q.take(size * u, align), want);
                }
                QuickOp::PopBack => prop_assert_eq!(q.pop_back(), model.pop_back()),
                QuickOp::Flush { keep_mask } => {
                    let mut i = 0;
                    let keep = |_: QuickBlock| {
                        i += 1;
                        keep_mask >> (i % 32) & 1 == 1
                    };
                    q.retain(keep);
                    let mut j = 0;
                    model.retain(|_| {
                        j += 1;
                        keep_mask >> (j % 32) & 1 == 1
                    });
                }
            }
            let listed: Vec<QuickBlock> = q.iter().copied().collect();
            prop_assert_eq!(&listed, &model.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(q.len(), model.len());
            prop_assert_eq!(q.is_empty(), model.is_empty());
            prop_assert_eq!(q.front(), model.front().copied());
            q.validate().map_err(TestCaseError::fail)?;
        }
    }

    /// The handle cache against a plain vector with the same picks (the first handle of
    /// the largest size at most `n`; the last of the largest; the last), small and large
    /// sizes alike.
    #[test]
    fn handle_cache_matches_a_vector(ops in proptest::collection::vec(cache_op(), 1..80)) {
        let mut c = HandleCache::new(u64::MAX);
        let mut model: Vec<CachedHandle> = Vec::new();
        let mut next = 1u64;
        for op in ops {
            let got = match op {
                CacheOp::Push { pages } => {
                    let h = CachedHandle { handle: PhysHandle(next), pages };
                    next += 1;
                    c.push(h);
                    model.push(h);
                    None
                }
                CacheOp::TakeFitting { n } => {
                    let size = model.iter().map(|h| h.pages).filter(|&s| s <= n).max();
                    let want = size
                        .and_then(|s| model.iter().position(|h| h.pages == s))
                        .map(|i| model.swap_remove(i));
                    prop_assert_eq!(c.take_fitting(n), want);
                    want
                }
                CacheOp::TakeLargest => {
                    let size = model.iter().map(|h| h.pages).max();
                    let want = size
                        .and_then(|s| model.iter().rposition(|h| h.pages == s))
                        .map(|i| model.swap_remove(i));
                    prop_assert_eq!(c.take_largest(), want);
                    want
                }
                CacheOp::PopLast => {
                    let want = model.pop();
                    prop_assert_eq!(c.pop_last(), want);
                    want
                }
            };
            let _ = got;
            prop_assert_eq!(c.as_slice(), &model[..]);
            prop_assert_eq!(c.pages(), model.iter().map(|h| h.pages).sum::<u64>());
            c.validate(0).map_err(TestCaseError::fail)?;
        }
    }

    /// Reservations, mappings (from the cache, else created), unmappings into a bounded
    /// cache, trims and releases, with one driver fault at a random call: after every
    /// operation the substrate's invariants hold and the device holds exactly what the
    /// substrate says; at the end everything can be given back.
    #[test]
    fn substrate_keeps_its_invariants_under_faults(
        ops in proptest::collection::vec(vmm_op(), 1..60),
        limit in 0u64..6,
        fault in prop_oneof![Just(None), (0u64..80).prop_map(Some)],
    ) {
        let mut dev = SimDevice::new(16 * P);
        dev.inject_fault_at(fault);
        let mut v: Vmm<()> = Vmm::new(limit);
        v.page_bytes = P;
        v.va_chunk_bytes = 4 * P;
        let mut free: RangeMap<NoTags> = RangeMap::default();
        for op in ops {
            match op {
                VmmOp::Reserve { pages } => {
                    let before = v.reservations.len();
                    let r = reserve::reserve(
                        &mut v.reservations, &mut free, &mut dev, pages * P, P, v.va_chunk_bytes,
                    );
                    prop_assert_eq!(v.reservations.len(), before + usize::from(r.is_ok()));
                    if let Ok(ri) = r {
                        prop_assert!(v.reservations[ri].bytes >= pages * P);
                        prop_assert_eq!(v.res_of(v.reservations[ri].va), Some(ri));
                    }
                }
                VmmOp::Map { res, pages } => map_pages(&mut v, &mut dev, res, pages),
                VmmOp::Unmap { k } => unmap_extent(&mut v, &mut dev, k),
                VmmOp::ReleaseAll { largest_first } => {
                    let order = if largest_first { ReleaseOrder::Largest } else { ReleaseOrder::LastCached };
                    let before = v.cache.pages();
                    match v.release_cache(&mut dev, order) {
                        Ok(bytes) => {
                            prop_assert_eq!(bytes, before * P);
                            prop_assert!(v.cache.is_empty());
                        }
                        Err(_) => prop_assert!(!v.cache.is_empty()),
                    }
                }
                VmmOp::ReleaseUnused => {
                    // Free-map view of this test: a reservation is one free range when nothing
                    // is mapped in it.
                    for r in &v.reservations {
                        let empty = r.pages.iter().all(|s| s.is_none());
                        if !empty {
                            free.remove(&r.va);
                        } else if free.get(&r.va).is_none() {
                            free.insert(r.va, r.bytes);
                        }
                    }
                    let _ = reserve::release_unused(&mut v.reservations, &mut free, &mut dev);
                }
            }
            v.validate(0).map_err(TestCaseError::fail)?;
            device_agrees(&dev, &held(&v)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        // Everything goes back once no fault is pending.
        dev.inject_fault_at(None);
        for (ri, i, pg) in extents(&v) {
            let va = v.reservations[ri].va + i as u64 * P;
            prop_assert!(dev.unmap(va, u64::from(pg.ext_pages) * P).is_ok());
            if let Some(slot) = v.reservations[ri].pages.get_mut(i) {
                *slot = None;
            }
            v.mapped_pages -= u64::from(pg.ext_pages);
            v.cache.push(CachedHandle { handle: pg.handle, pages: u64::from(pg.ext_pages) });
        }
        v.quarantine.clear();
        prop_assert!(v.release_cache(&mut dev, ReleaseOrder::LastCached).is_ok());
        for r in &v.reservations {
            free.remove(&r.va);
            free.insert(r.va, r.bytes);
        }
        prop_assert!(reserve::release_unused(&mut v.reservations, &mut free, &mut dev).is_ok());
        v.validate(0).map_err(TestCaseError::fail)?;
        prop_assert_eq!(dev.live_objects(), (0, 0, 0, 0));
        prop_assert_eq!(dev.used_bytes(), 0);
        prop_assert_eq!(v.tracker.stats.reserved_bytes.current, 0);
    }
}
