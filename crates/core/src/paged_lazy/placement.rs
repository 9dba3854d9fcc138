//! Placement: where a block goes. Two views of the free virtual addresses:
//! - the free ranges (start → bytes, coalesced within a reservation), mapped or not;
//! - the *mapped* free runs: the free bytes that lie on mapped pages, as maximal runs,
//!   indexed by address and by (bytes, address).
//!
//! A block that fits in a mapped run is placed there best-fit (the smallest run that holds
//! it, then the lowest address, as PyTorch's caching allocator picks a cached block): no
//! driver call. Otherwise [`LazyPagedPool::place_growth`] scores every candidate spot by the
//! pages it would newly map, then by the bytes of those new pages it would leave free, then
//! by address.
mod size_index;

use super::{LazyPagedPool, Reservation};
use crate::align::{align_down, align_up};
use crate::vmm::range_map::RangeMap;
use size_index::SizeIndex;

/// The free address space of one pool.
#[derive(Debug, Clone, Default)]
pub(super) struct FreeSpace {
    /// Free virtual ranges: start → bytes; coalesced within a reservation ([`RangeMap`]).
    pub(super) va: RangeMap,
    /// Free bytes on mapped (and opened) pages, as maximal runs: start → bytes.
    pub(super) mapped: RangeMap,
    /// The same runs as (bytes, start), for best fit: size bins with a bitmap
    /// ([`size_index`]).
    pub(super) by_size: SizeIndex,
    /// Bytes of all mapped runs.
    pub(super) mapped_bytes: u64,
}

/// Where a new block goes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placement {
    /// Index into `reservations`.
    pub(super) res: usize,
    /// Block address.
    pub(super) addr: u64,
}

impl FreeSpace {
    fn add_run(&mut self, st: u64, len: u64) {
        if len > 0 {
            self.mapped.insert(st, len);
            self.by_size.insert(len, st);
            self.mapped_bytes += len;
        }
    }

    /// [`FreeSpace::add_run`] of `[s, e)` clipped to `[a, b)`.
    fn add_run_clipped(&mut self, s: u64, e: u64, a: u64, b: u64) {
        let (s, e) = (s.max(a), e.min(b));
        if e > s {
            self.add_run(s, e - s);
        }
    }

    fn remove_run(&mut self, st: u64) -> Option<u64> {
        let len = self.mapped.remove(&st)?;
        self.by_size.remove(len, st);
        self.mapped_bytes -= len;
        Some(len)
    }

    /// The smallest mapped run holding `bytes` at an address aligned to `align` (then the
    /// lowest address): `(run start, block address)`.
    pub(super) fn best_fit(&self, bytes: u64, align: u64) -> Option<(u64, u64)> {
        for (len, st) in self.by_size.range_from(bytes) {
            let addr = align_up(st, align)?;
            if addr.checked_add(bytes)? <= st + len {
                return Some((st, addr));
            }
        }
        None
    }

    /// Takes `[addr, addr + bytes)` out of the mapped run starting at `run` (which holds it)
    /// and out of the free range holding it.
    pub(super) fn take_mapped(&mut self, run: u64, addr: u64, bytes: u64) {
        if let Some((i, (_, len))) = self
            .mapped
            .position(run)
            .and_then(|i| Some((i, self.mapped.entry(i)?)))
        {
            self.by_size.remove(len, run);
            self.mapped_bytes -= bytes;
            let (head, tail) = (addr - run, run + len - addr - bytes);
            // The run is cut in place: its head keeps its slot, or its tail takes it.
            self.mapped.cut(i, run, head, addr + bytes, tail);
            if head > 0 {
                self.by_size.insert(head, run);
            }
            if tail > 0 {
                self.by_size.insert(tail, addr + bytes);
            }
        }
        self.take_va(addr, bytes);
    }

    /// Takes `[addr, addr + bytes)` out of the free range holding it (mapped runs are left to
    /// the caller).
    pub(super) fn take_va(&mut self, addr: u64, bytes: u64) {
        let Some(i) = self.va.at_or_before(addr) else {
            return;
        };
        let Some((st, len)) = self.va.entry(i) else {
            return;
        };
        if st + len < addr + bytes {
            return;
        }
        self.va
            .cut(i, st, addr - st, addr + bytes, st + len - addr - bytes);
    }

    /// Gives `[addr, addr + bytes)` back, inside the reservation `[lo, hi)`: coalesces the
    /// free range, and, when `mapped` (every page under it mapped and open), the mapped run.
    pub(super) fn give(&mut self, addr: u64, bytes: u64, lo: u64, hi: u64, mapped: bool) {
        self.va.join(addr, bytes, lo, hi);
        if !mapped {
            return;
        }
        let (prev, next) = self.mapped.join(addr, bytes, lo, hi);
        let (mut st, mut len) = (addr, bytes);
        if let Some((ps, pl)) = prev {
            self.by_size.remove(pl, ps);
            (st, len) = (ps, pl + len);
        }
        if let Some((ns, nl)) = next {
            self.by_size.remove(nl, ns);
            len += nl;
        }
        self.by_size.insert(len, st);
        self.mapped_bytes += bytes;
    }

    /// Recomputes the mapped runs touching `[lo, hi)` of reservation `r` (pages of `p` bytes)
    /// from the free ranges and the page table. O(pages of the window).
    pub(super) fn rebuild_mapped(&mut self, r: &Reservation, p: u64, lo: u64, hi: u64) {
        let (mut lo, mut hi) = (lo.max(r.va), hi.min(r.end()));
        // Runs touching the window go, and widen it: only this reservation's (a run starting
        // at its end belongs to the next reservation, adjacent in the address space).
        let touching: Vec<u64> = self
            .mapped
            .range(r.va..hi.saturating_add(1).min(r.end()))
            .rev()
            .take_while(|(&s, &l)| s + l >= lo)
            .map(|(&s, _)| s)
            .collect();
        for s in touching {
            if let Some(l) = self.remove_run(s) {
                lo = lo.min(s);
                hi = hi.max(s + l);
            }
        }
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        if let Some((&s, &l)) = self.va.range(..lo).next_back() {
            if s + l > lo {
                ranges.push((lo, (s + l).min(hi)));
            }
        }
        ranges.extend(self.va.range(lo..hi).map(|(&s, &l)| (s, (s + l).min(hi))));
        for (a, b) in ranges {
            // Runs of open pages over `[a, b)`, from the mapped extents (a handle's pages
            // share one access flag): O(extents), not O(pages).
            let (pa, pb) = (((a - r.va) / p) as usize, ((b - 1 - r.va) / p) as usize);
            let first = r
                .index
                .extents
                .range(..=pa)
                .next_back()
                .map_or(pa, |(&i, _)| i);
            let mut run: Option<(usize, usize)> = None; // pages [start, end)
            for (&i, &n) in r.index.extents.range(first..=pb) {
                let end = i + n as usize;
                if end <= pa {
                    continue;
                }
                let open = r.pages.get(i).is_some_and(|s| s.is_some_and(|s| s.access));
                run = match run {
                    Some((s, e)) if open && e == i => Some((s, end)),
                    _ => {
                        if let Some((s, e)) = run {
                            self.add_run_clipped(r.va + s as u64 * p, r.va + e as u64 * p, a, b);
                        }
                        open.then_some((i, end))
                    }
                };
            }
            if let Some((s, e)) = run {
                self.add_run_clipped(r.va + s as u64 * p, r.va + e as u64 * p, a, b);
            }
        }
    }
}

impl LazyPagedPool {
    /// Unmapped pages under `[x, x + bytes)` in reservation `ri`, and the bytes of those new
    /// pages the block would leave free.
    fn growth_cost(&self, ri: usize, x: u64, bytes: u64) -> (u64, u64) {
        let p = self.vmm.page_bytes;
        let r = &self.vmm.reservations[ri];
        let (rel, end) = (x - r.va, x - r.va + bytes);
        let p0 = rel / p;
        let p1 = (end - 1) / p;
        let span = p1 - p0 + 1;
        let mapped = r.mapped_in(p0 as usize, p1 as usize + 1);
        let new = span - mapped;
        if new == 0 {
            return (0, 0);
        }
        // Bytes of the block on mapped pages: whole interior pages plus the ends.
        let is_mapped = |pg: u64| r.pages.get(pg as usize).is_some_and(Option::is_some);
        let mut on_mapped = 0u64;
        if span == 1 {
            on_mapped = if is_mapped(p0) { bytes } else { 0 };
        } else {
            let head = (p0 + 1) * p - rel;
            let tail = end - p1 * p;
            let (hm, tm) = (is_mapped(p0), is_mapped(p1));
            let interior_mapped = mapped - u64::from(hm) - u64::from(tm);
            on_mapped += interior_mapped * p;
            if hm {
                on_mapped += head;
            }
            if tm {
                on_mapped += tail;
            }
        }
        (new, new * p - (bytes - on_mapped))
    }

    /// Slow path: the spot for a block of `bytes` (aligned to `align`) that maps the fewest
    /// new pages: both ends of every free range long enough, and both ends of every mapped
    /// run inside one (extending the run). Ties go to the fewest bytes of new pages left
    /// free, then to the lowest address. `None` when no free range is long enough.
    pub(super) fn place_growth(&self, bytes: u64, align: u64) -> Option<Placement> {
        let mut best: Option<(u64, u64, u64, Placement)> = None;
        let mut ri = 0usize;
        for (&st, &len) in &self.space.va {
            if len < bytes {
                continue;
            }
            while ri < self.vmm.reservations.len() && self.vmm.reservations[ri].end() <= st {
                ri += 1;
            }
            self.vmm.reservations.get(ri)?;
            let b = st + len;
            let mut consider = |x: u64| {
                let (k, slack) = self.growth_cost(ri, x, bytes);
                if best.is_none_or(|(bk, bs, bx, _)| (k, slack, x) < (bk, bs, bx)) {
                    best = Some((k, slack, x, Placement { res: ri, addr: x }));
                }
            };
            let mut ends = |a: u64, e: u64| {
                if let Some(x) = align_up(a, align) {
                    if x.checked_add(bytes).is_some_and(|xe| xe <= b) {
                        consider(x);
                    }
                }
                if let Some(x) = e.checked_sub(bytes).map(|x| align_down(x, align)) {
                    if x >= st {
                        consider(x);
                    }
                }
            };
            ends(st, b);
            for (&ms, &ml) in self.space.mapped.range(st..b) {
                ends(ms, ms + ml);
            }
        }
        best.map(|(_, _, _, pl)| pl)
    }
}
