//! Where a block goes: the free-range map and its fit tags, the search for a fit in pages
//! already mapped, and the scored search (fewest new pages, then least waste) when pages must be
//! mapped.
use super::*;

/// Mapped bytes a block may use at the start of the free range `[st, st+len)` in a
/// reservation starting at `base`, pages of `p` bytes: the whole range when it has no
/// interior page, else the free tail of the page holding `st`.
#[inline(always)]
pub(super) fn usable_head_at(p: u64, base: u64, st: u64, len: u64) -> u64 {
    // Pages are a power of two: masks, not divisions (a division is tens of cycles). The
    // range's head `h` runs to the first page boundary at or after `st`; it holds a whole
    // page exactly when `len ≥ h + p`.
    let head = (st - base).wrapping_neg() & (p - 1);
    if len < head + p {
        len
    } else {
        head
    }
}

/// The tail value of the free range `[st, st + len)` of a reservation starting at `base`:
/// `(page, bytes)` when it ends inside page `page` and covers the whole page before it
/// (so the free bytes at that page's head are usable next to its mapped part).
pub(super) fn tail_leaf(p: u64, base: u64, st: u64, len: u64) -> Option<(usize, u64)> {
    let b = st + len;
    let page = (b - base) >> p.trailing_zeros();
    let ps = base + page * p;
    (b > ps && st + p <= ps).then_some((page as usize, b - ps))
}

/// `bytes` in [`UNIT_BYTES`] units, saturated to `u32`.
#[inline]
fn units(bytes: u64) -> u32 {
    u32::try_from(bytes / UNIT_BYTES).unwrap_or(u32::MAX)
}

/// The fit tag of the free range `[st, st + len)` of a reservation starting at `base`, pages
/// of `p` bytes: the larger of its head value ([`usable_head_at`]) and its tail value
/// ([`tail_leaf`], 0 when it has none), in [`UNIT_BYTES`] units.
pub(super) fn fit_of(p: u64, base: u64, st: u64, len: u64) -> u32 {
    // The definition, in page indices (the invariant checker's reference for the tags,
    // which [`fit_fast`] computes).
    let sh = p.trailing_zeros();
    let rel = st - base;
    let i0 = (rel + p - 1) >> sh;
    let i1 = (rel + len) >> sh;
    let head = units(if i1 <= i0 { len } else { i0 * p - rel });
    let tail = tail_leaf(p, base, st, len).map_or(0, |(_, t)| units(t));
    head.max(tail)
}

/// [`fit_of`] in a few instructions (the free map's upkeep computes it on every cut and
/// join): with `h` the range's head ([`usable_head_at`]) and `t` its tail (bytes past the
/// last page boundary), a range without a whole page offers all of it; one with a whole page
/// offers the larger of `h` and `t` (then the page before the tail is whole, so the tail
/// counts). The invariant checker compares every tag with [`fit_of`].
#[inline(always)]
pub(super) fn fit_fast(p: u64, base: u64, st: u64, len: u64) -> u32 {
    let mask = p - 1;
    let rel = st - base;
    let head = rel.wrapping_neg() & mask;
    let fit = if len < head + p {
        len
    } else {
        head.max((rel + len) & mask)
    };
    units(fit)
}

/// The scores `(pages newly mapped, bytes of them left free, address)` of a block of
/// `bytes` (a multiple of [`UNIT_BYTES`], at most `len`) flush against the start and
/// against the end of the free range `[st, st + len)` of a reservation starting at `r_va`,
/// pages of `p` bytes (a power of two), in closed form.
///
/// In page units relative to the reservation, the range `[s, e)` wholly holds the pages
/// `i0 = ⌈s/p⌉ .. i1 = ⌊e/p⌋` (the pages around them are mapped: a neighbour holds their
/// other part). A block flush at `s` ends at `er = s + bytes` and newly maps the pages
/// `i0 .. min(⌈er/p⌉, i1)`; it leaves `⌈er/p⌉·p − er` bytes of them free unless it runs
/// into the mapped page at the end (then none). Flush at `e` it starts at `xr = e − bytes`,
/// maps `max(⌊xr/p⌋, i0) .. i1` and leaves `xr mod p` free unless it runs into the mapped
/// page at the start.
#[inline]
pub(super) fn scored_ends(
    p: u64,
    r_va: u64,
    st: u64,
    len: u64,
    bytes: u64,
) -> [(u64, u64, u64); 2] {
    let sh = p.trailing_zeros();
    let mask = p - 1;
    let s = st - r_va;
    let e = s + len;
    let i0 = (s + mask) >> sh;
    let i1 = e >> sh;
    // Flush against the start.
    let er = s + bytes;
    let hr = (er + mask) >> sh;
    let (k0, slack0) = if hr <= i1 {
        let k = hr - i0;
        (k, if k == 0 { 0 } else { (hr << sh) - er })
    } else {
        (i1.saturating_sub(i0), 0)
    };
    // Flush against the end.
    let xr = e - bytes;
    let lr = xr >> sh;
    let (k1, slack1) = if lr >= i0 {
        let k = i1 - lr;
        (k, if k == 0 { 0 } else { xr & mask })
    } else {
        (i1.saturating_sub(i0), 0)
    };
    [(k0, slack0, st), (k1, slack1, r_va + xr)]
}

/// The reservation of free ranges met in address order, followed along the reservations.
#[derive(Default)]
struct ResCursor {
    /// Index of the reservation.
    ri: usize,
    /// Its base address.
    va: u64,
    /// Its end address.
    end: u64,
}

impl ResCursor {
    /// Moves on to the reservation of the free range starting at `st` (at or after the last
    /// one met) and returns its `(index, base address)`; `None` if no reservation holds it.
    fn reach<X>(
        &mut self,
        reservations: &[crate::vmm::reserve::Reservation<X>],
        st: u64,
    ) -> Option<(usize, u64)> {
        if st >= self.end {
            while self.ri < reservations.len() && reservations[self.ri].end() <= st {
                self.ri += 1;
            }
            let r = reservations.get(self.ri)?;
            (self.va, self.end) = (r.va, r.end());
        }
        Some((self.ri, self.va))
    }
}

impl PagedPool {
    /// Sets the fit tags ([`fit_of`]) of the free ranges `added` (`(start, bytes)` each, in
    /// reservation `ri`) after the free map gained or rewrote them; a removed range took its
    /// tag with it.
    pub(super) fn refit(&mut self, ri: usize, added: &[(u64, u64)]) {
        let p = self.vmm.page_bytes;
        let Some(base) = self.vmm.reservations.get(ri).map(|r| r.va) else {
            return;
        };
        for &(st, len) in added {
            if let Some(i) = self.free.position(st) {
                self.free.set_tag(i, fit_fast(p, base, st, len));
            }
        }
    }

    /// Sets the fit tag of the free range at position `i` of the free map, in the
    /// reservation starting at `base`.
    #[inline]
    pub(super) fn refit_at(&mut self, base: u64, i: usize) {
        if let Some((st, len)) = self.free.entry(i) {
            self.free
                .set_tag(i, fit_fast(self.vmm.page_bytes, base, st, len));
        }
    }

    /// Fast path: the lowest-addressed spot where `bytes` fit (aligned to `align`) without
    /// mapping a page.
    ///
    /// Each free range offers mapped bytes at two places: at its start (the head value of
    /// [`usable_head_at`]) and at its end (the tail value of [`tail_leaf`]); in address
    /// order the head comes first, then the tail, and the head values of the ranges that
    /// start in one page count as one (their maximum), searched range by range. The first
    /// range whose tag (the larger of its two) reaches the request decides: its head when
    /// that reaches it, else its tail. When alignment above 256 bytes defeats that spot,
    /// the scored search decides instead.
    #[inline(always)]
    pub(super) fn find_mapped_fit(&self, bytes: u64, align: u64) -> Option<Placement> {
        let p = self.vmm.page_bytes;
        let need = bytes + align.saturating_sub(UNIT_BYTES);
        let need = u32::try_from(need / UNIT_BYTES).ok()?;
        let i = self.free.first_tag_at_least(need)?;
        let (st, len) = self.free.entry(i)?;
        let res = self.vmm.res_of(st)?;
        let base = self.vmm.reservations.get(res)?.va;
        let sh = p.trailing_zeros();
        if units(usable_head_at(p, base, st, len)) >= need {
            // The ranges starting in the page of `st`, in order (those before `st` reach
            // the request only with the alignment slack).
            let ps = base + (((st - base) >> sh) << sh);
            // The first of them: walk back from `i` (ranges start in address order).
            let mut j = i;
            while j > 0 && self.free.entry(j - 1).is_some_and(|(s, _)| s >= ps) {
                j -= 1;
            }
            while let Some((st, len)) = self.free.entry(j).filter(|&(s, _)| s < ps + p) {
                let usable = usable_head_at(p, base, st, len);
                let addr = align_up(st, align)?;
                if addr + bytes <= st + usable {
                    return Some(Placement {
                        res,
                        range_start: st,
                        pos: j,
                        addr,
                    });
                }
                j += 1;
            }
        } else {
            let b = st + len;
            let ps = base + (((b - base) >> sh) << sh);
            let addr = align_down(b.checked_sub(bytes)?, align);
            if addr >= st && addr >= ps {
                return Some(Placement {
                    res,
                    range_start: st,
                    pos: i,
                    addr,
                });
            }
        }
        // The tag promised a fit that alignment defeats: fall back to the scan.
        None
    }

    /// Slow path: scores both ends of every free range by the pages the block would map,
    /// then by the bytes of those pages it would leave free (the waste it adds), then by
    /// address. Returns the best placement and its page count.
    pub(super) fn find_scored_fit(&self, bytes: u64, align: u64) -> Option<(Placement, u64)> {
        if align == UNIT_BYTES {
            self.find_scored_fit_unit(bytes)
        } else {
            self.find_scored_fit_any(bytes, align)
        }
    }

    /// [`PagedPool::find_scored_fit`] for the default alignment (every free range starts
    /// and ends on it, so a block fits flush against either end of any range at least as
    /// long): the same scores as [`scored_ends`], with the ranges at least two pages longer
    /// than the block scored by their page offsets alone (below), a subtraction and a mask
    /// per end. Ties go to the lower address, as in a scan in address order that keeps the
    /// first best.
    pub(super) fn find_scored_fit_unit(&self, bytes: u64) -> Option<(Placement, u64)> {
        let p = self.vmm.page_bytes;
        let sh = p.trailing_zeros();
        let mask = p - 1;
        let q = bytes >> sh;
        let r = bytes & mask;
        let Some(long_from) = bytes.checked_add(2 * p).filter(|_| q > 0) else {
            // A block under a page may score 0 pages (ties then go by address alone): the
            // scan decides.
            return self.find_scored_fit_scan(bytes);
        };
        // A range at least two pages longer than the block is *long*. Reservations start
        // on a page boundary, so a range's head `h` (bytes from its start to the next page
        // boundary) and tail `t` (from the last page boundary to its end) are those of its
        // addresses. Flush against the start of a long range the block newly maps `q`
        // pages when `h ≥ r = bytes mod p`, leaving `h − r` of them free, else `q + 1`
        // pages leaving `p − r + h`; flush against its end likewise with `t`. Both order
        // as `v' = (v − r) mod p` does (`v` the head or the tail): among long ranges the
        // best candidate is the first in address order of the least `v'`, a subtraction
        // and a mask per end. A shorter range that holds the block (*near*) is scored in
        // full ([`scored_ends`]).
        let mut least = u64::MAX;
        // The best long candidate: (start, length, at its end, position).
        let mut at = (0u64, 0u64, false, 0usize);
        let mut near: Option<((u64, u64, u64), u64, usize)> = None;
        for (i, &(st, len)) in self.free.as_slice().iter().enumerate() {
            if len >= long_from {
                let vh = st.wrapping_neg().wrapping_sub(r) & mask;
                let vt = (st + len).wrapping_sub(r) & mask;
                if vh < least {
                    (least, at) = (vh, (st, len, false, i));
                }
                if vt < least {
                    (least, at) = (vt, (st, len, true, i));
                }
            } else if len >= bytes {
                let r_va = self.vmm.reservations.get(self.vmm.res_of(st)?)?.va;
                for score in scored_ends(p, r_va, st, len, bytes) {
                    if near.is_none_or(|(b, _, _)| score < b) {
                        near = Some((score, st, i));
                    }
                }
            }
        }
        let long = (least != u64::MAX).then(|| {
            let (st, len, end, i) = at;
            let k = q + u64::from(least >= p - r);
            let addr = if end { st + len - bytes } else { st };
            ((k, least, addr), st, i)
        });
        let ((k, _, addr), st, pos) = match (long, near) {
            (Some(l), Some(n)) => {
                if n.0 < l.0 {
                    n
                } else {
                    l
                }
            }
            (l, n) => l.or(n)?,
        };
        Some((
            Placement {
                res: self.vmm.res_of(st)?,
                range_start: st,
                pos,
                addr,
            },
            k,
        ))
    }

    /// [`PagedPool::find_scored_fit_unit`] by a scan of every free range, each scored in
    /// closed form ([`scored_ends`]).
    pub(super) fn find_scored_fit_scan(&self, bytes: u64) -> Option<(Placement, u64)> {
        let p = self.vmm.page_bytes;
        // The best `(pages, slack, address)` so far and its placement.
        let mut best: Option<((u64, u64, u64), Placement)> = None;
        let mut cur = ResCursor::default();
        for (&st, &len) in &self.free {
            if len < bytes {
                continue;
            }
            let (ri, r_va) = cur.reach(&self.vmm.reservations, st)?;
            for score in scored_ends(p, r_va, st, len, bytes) {
                if best.is_none_or(|(b, _)| score < b) {
                    let pl = Placement {
                        res: ri,
                        range_start: st,
                        pos: usize::MAX,
                        addr: score.2,
                    };
                    best = Some((score, pl));
                }
            }
        }
        best.map(|((k, _, _), pl)| (pl, k))
    }

    /// [`PagedPool::find_scored_fit`] for any alignment: each end of each range, scored as
    /// described there.
    pub(super) fn find_scored_fit_any(&self, bytes: u64, align: u64) -> Option<(Placement, u64)> {
        let p = self.vmm.page_bytes;
        // Pages are a power of two (checked when learnt): shifts instead of divisions.
        let sh = p.trailing_zeros();
        // The best score so far, `(pages newly mapped, bytes of them left free, address)`,
        // compared lexicographically (the address makes it a total order, so the scan order
        // does not matter), and its placement.
        let (mut bk, mut bs, mut bx) = (u64::MAX, u64::MAX, u64::MAX);
        let mut best: Option<Placement> = None;
        let mut cur = ResCursor::default();
        for (&st, &len) in &self.free {
            // A range shorter than the block holds it at neither end.
            if len < bytes {
                continue;
            }
            let (ri, r_va) = cur.reach(&self.vmm.reservations, st)?;
            let b = st + len;
            let i0 = (st - r_va + p - 1) >> sh;
            let i1 = (b - r_va) >> sh;
            // A block at `x` newly maps the pages `lo..hi` (`k` of them) and leaves `slack`
            // bytes of them free; the slack is only worked out when `k` can win.
            let mut consider = |x: u64| {
                let (xr, er) = (x - r_va, x - r_va + bytes);
                let lo = (xr >> sh).max(i0);
                let hi = (((er - 1) >> sh) + 1).min(i1);
                let k = hi.saturating_sub(lo);
                if k > bk {
                    return;
                }
                let slack = if k == 0 {
                    0
                } else {
                    (k << sh) - (er.min(hi << sh) - xr.max(lo << sh))
                };
                if k < bk || slack < bs || (slack == bs && x < bx) {
                    (bk, bs, bx) = (k, slack, x);
                    best = Some(Placement {
                        res: ri,
                        range_start: st,
                        pos: usize::MAX,
                        addr: x,
                    });
                }
            };
            if let Some(x) = align_up(st, align) {
                if x.checked_add(bytes).is_some_and(|e| e <= b) {
                    consider(x);
                }
            }
            if let Some(x) = b.checked_sub(bytes).map(|x| align_down(x, align)) {
                if x >= st {
                    consider(x);
                }
            }
        }
        best.map(|pl| (pl, bk))
    }

    /// Cuts the block out of its free range and raises the refs of its pages.
    ///
    /// `mapped` is `None` when no page was mapped for the block (every page it covers gets
    /// its reference here), else what [`PagedPool::map_block_pages`] returned: the pages it
    /// mapped have their reference already, and only the pages mapped before it get one
    /// here: the block's end pages when `mapped` says so, and the idle pages of its
    /// interior (the only mapped pages there besides the new ones).
    pub(super) fn commit_block(
        &mut self,
        pl: Placement,
        bytes: u64,
        requested: u64,
        mapped: Option<[bool; 2]>,
    ) {
        let p = self.vmm.page_bytes;
        let st = pl.range_start;
        let found = self.free.entry(pl.pos).filter(|&(s, _)| s == st);
        let Some((i, len)) = found.map(|(_, len)| (pl.pos, len)).or_else(|| {
            self.free
                .position(st)
                .and_then(|i| Some((i, self.free.entry(i)?.1)))
        }) else {
            return;
        };
        let end = st + len;
        let bend = pl.addr + bytes;
        let (head, tail) = (pl.addr - st, end.saturating_sub(bend));
        // Cut in place: the head keeps the range's slot, or else the tail does.
        self.free.cut(i, st, head, bend, tail);
        let Some(base) = self.vmm.reservations.get(pl.res).map(|r| r.va) else {
            return;
        };
        // The head keeps the range's position, the tail follows it (or takes it).
        match (head > 0, tail > 0) {
            (true, true) => {
                self.refit_at(base, i);
                self.refit_at(base, i + 1);
            }
            (false, false) => {}
            _ => self.refit_at(base, i),
        }
        let Some(r) = self.vmm.reservations.get_mut(pl.res) else {
            return;
        };
        let sh = p.trailing_zeros();
        let p0 = ((pl.addr - r.va) >> sh) as usize;
        let p1 = ((bend - 1 - r.va) >> sh) as usize;
        // The end pages, one look-up each: an idle one is idle no more, and each gets the
        // block's reference unless this allocation just mapped it (then it has it).
        let ends = if p1 == p0 { 1 } else { 2 };
        for (k, i) in [p0, p1].into_iter().take(ends).enumerate() {
            let raise = mapped.is_none_or(|m| m[k]);
            if let Some(Some(pg)) = r.pages.get_mut(i) {
                // Idle pages are single-page handles: a page of a longer handle (one this
                // allocation just mapped) is not looked up.
                if self.idle_count > 0 && pg.refs == 0 && pg.ext_pages == 1 && r.index.remove(i) {
                    self.idle_count -= 1;
                }
                if raise {
                    pg.refs += 1;
                }
            }
        }
        // The interior lay in one free range (no block touches it): a page there is mapped
        // only if it was idle or this allocation just mapped it, so the idle ones are found
        // through the idle bitmap. (A block placed without mapping spans at most two pages:
        // no interior.)
        if p1 > p0 + 1 {
            if self.idle_count > 0 {
                let mut i = p0 + 1;
                while let Some(j) = r.index.next_in(i, p1) {
                    if r.index.remove(j) {
                        self.idle_count -= 1;
                    }
                    if let (Some(_), Some(Some(pg))) = (mapped, r.pages.get_mut(j)) {
                        pg.refs += 1;
                    }
                    i = j + 1;
                }
            }
            if mapped.is_none() {
                for pg in r.pages.range_mut(p0 + 1, p1).flatten() {
                    pg.refs += 1;
                }
            }
        }
        self.live.insert(pl.addr, LiveBlock { bytes, requested });
        self.vmm.tracker.on_alloc(requested, bytes);
    }
}
