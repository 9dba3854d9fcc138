//! A simulated GPU: capacity, VMM granularity, an address space, driver-call counts and a
//! driver-time model taken from calls measured on an H200 (CUDA 13.0, driver 580).
//!
//! It enforces the same rules the CUDA driver does (granularity multiples, mapping only inside
//! reserved ranges, no double map, access only on mapped ranges), so an allocator that runs
//! clean here makes legal calls on a real GPU. Faults can be injected at any call to test
//! that allocators unwind exactly what they did.
use std::collections::BTreeMap;

use crate::device::{Device, DeviceError, DriverCall, DriverCounters, PhysHandle};

/// 2 MiB, the VMM granularity of current NVIDIA data-centre GPUs.
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;
/// 150,109,880,320 bytes (139.8 GiB): the total that cuMemGetInfo reports on the lent H200
/// (driver 580, CUDA 13.0), i.e. what a pool on that GPU can actually take. The marketed
/// "141 GB" (131.3 GiB) is less than this.
pub const DEFAULT_CAPACITY: u64 = 150_109_880_320;
/// Where the simulated address space starts (looks like a CUDA device address).
pub const DEFAULT_BASE: u64 = 0x7f00_0000_0000;

const MIB: f64 = (1u64 << 20) as f64;

/// Kinds of [`DriverCall`] (the length of the per-kind cost memo).
const CALL_KINDS: usize = DriverCall::ALL.len();
/// Sizes remembered per call kind by the cost memo (a power of two).
const COST_MEMO_SLOTS: usize = 64;

/// Driver-call time in seconds for a call of `bytes`, interpolated log-linearly between
/// measured points `(bytes, microseconds)`; clamped outside.
fn interp(points: &[(f64, f64)], bytes: u64) -> f64 {
    let x = (bytes.max(1) as f64).ln();
    let first = points[0];
    let last = points[points.len() - 1];
    if x <= first.0.ln() {
        return first.1 * 1e-6;
    }
    for w in points.windows(2) {
        let (x0, y0) = (w[0].0.ln(), w[0].1);
        let (x1, y1) = (w[1].0.ln(), w[1].1);
        if x <= x1 {
            let t = (x - x0) / (x1 - x0);
            return (y0 + t * (y1 - y0)) * 1e-6;
        }
    }
    // Beyond the last point: grow linearly with size from the last point.
    last.1 * 1e-6 * (bytes as f64 / last.0)
}

/// How the cost of a page-table call (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap,
/// cuMemRelease) grows with the mappings live in the context: `(alpha, beta)` such that a
/// call costs its isolated figure ([`h200_call_points`]) × (alpha + beta × live mappings).
/// Other calls cost their measured figure whatever is mapped.
///
/// Fitted by `scripts/fit/fit-cost-model.py` (least squares on relative error, per kind, alpha
/// and beta ≥ 0) to the real driver seconds of 33 replays on the H200 (2026-12-01: the
/// eleven traces of `traces/`, `traces/external/` and `traces/validation/` under `paged`,
/// which holds hundreds to thousands of mappings, `paged-lazy`, which holds tens, and
/// `torch`, which makes cuMemAlloc/cuMemFree only), against the sums Σ isolated and
/// Σ isolated × live mappings of the same calls on the simulated device (same counts per
/// kind). The data and the check are in
/// `crates/gpumem/tests/data/h200_replay_driver_time_by_mappings.json` and the
/// `cost_model` test: mean |ln(modelled / real)| 0.31 (a factor 1.37), every replay within
/// a factor 2.9; real seconds of the same replay move by ±40 % from run to run. Only `paged`
/// unmaps or releases in these replays, always with hundreds of mappings live, so for
/// cuMemUnmap and cuMemRelease alpha and beta cannot be told apart and the fit put the whole
/// cost in one of them. Checked out of sample on 44 later replays (`paged-lazy` under
/// `placement=pages`, which unmaps and releases with tens of mappings, and `grow_ahead`,
/// beside torch; `tests/data/h200_lazy_replays.json`): mean factor 1.38, the page
/// placement's 1.26. Refitting on all 110 replays moves part of cuMemUnmap's cost into beta
/// (alpha 1.52, beta 1.26 per 1,000 mappings) but predicts the 110 worse (mean factor 1.41
/// against 1.37), so the factors stay.
pub fn mapping_cost_factors(call: DriverCall) -> (f64, f64) {
    match call {
        DriverCall::Create => (0.87, 0.316e-3),
        DriverCall::Map => (1.35, 0.316e-3),
        DriverCall::SetAccess => (0.80, 1.421e-3),
        DriverCall::Unmap => (2.93, 0.0),
        DriverCall::Release => (0.71, 0.038e-3),
        _ => (1.0, 0.0),
    }
}

/// Measured points `(bytes, microseconds)` of one driver call on the H200, in a context
/// with nothing else mapped (before [`mapping_cost_factors`]). Sources:
/// `../shared/anchors/H200.md` (cudaMalloc/cudaFree medians at 16 MiB – 1 GiB, the VMM
/// reserve–create–map–set-access–unmap–release cycle at 2 MiB – 1 GiB), and
/// `scripts/bench/baselines` on the same GPU (2026-12-01, BENCHMARKS.md "The driver cost model"):
/// cuMemAlloc/cuMemFree and the VMM cycle at 4 and 16 GiB, and cuMemAddressReserve /
/// cuMemAddressFree of address space alone, which cost the same 2–4 µs from 1 GiB to 1 TiB
/// (hence their last point at 1 TiB: flat above 1 GiB, where a linear extrapolation priced
/// the ≥ 64 GiB range of an expandable segment at ~1 ms).
pub fn h200_call_points(call: DriverCall) -> &'static [(f64, f64)] {
    const GIB: f64 = 1024.0 * MIB;
    match call {
        DriverCall::Alloc => &[
            (16.0 * MIB, 45.0),
            (256.0 * MIB, 81.0),
            (GIB, 184.0),
            (4.0 * GIB, 655.0),
            (16.0 * GIB, 5150.0),
        ],
        DriverCall::Free => &[
            (16.0 * MIB, 43.0),
            (256.0 * MIB, 173.0),
            (GIB, 585.0),
            (4.0 * GIB, 2659.0),
            (16.0 * GIB, 9375.0),
        ],
        DriverCall::Reserve => &[
            (2.0 * MIB, 0.5),
            (64.0 * MIB, 2.9),
            (GIB, 6.0),
            (1024.0 * GIB, 6.0),
        ],
        DriverCall::Create => &[
            (2.0 * MIB, 10.0),
            (64.0 * MIB, 13.0),
            (GIB, 36.0),
            (4.0 * GIB, 416.0),
            (16.0 * GIB, 1551.0),
        ],
        DriverCall::Map => &[
            (2.0 * MIB, 0.9),
            (64.0 * MIB, 1.0),
            (GIB, 2.1),
            (4.0 * GIB, 5.2),
            (16.0 * GIB, 10.5),
        ],
        DriverCall::SetAccess => &[
            (2.0 * MIB, 24.0),
            (64.0 * MIB, 51.0),
            (GIB, 93.0),
            (4.0 * GIB, 223.0),
            (16.0 * GIB, 689.0),
        ],
        DriverCall::Unmap => &[
            (2.0 * MIB, 17.0),
            (64.0 * MIB, 26.0),
            (GIB, 40.0),
            (4.0 * GIB, 81.0),
            (16.0 * GIB, 207.0),
        ],
        DriverCall::Release => &[
            (2.0 * MIB, 12.0),
            (64.0 * MIB, 51.0),
            (GIB, 490.0),
            (4.0 * GIB, 2324.0),
            (16.0 * GIB, 10577.0),
        ],
        DriverCall::AddressFree => &[
            (2.0 * MIB, 0.6),
            (64.0 * MIB, 3.5),
            (GIB, 7.7),
            (1024.0 * GIB, 7.7),
        ],
    }
}

/// Isolated H200 cost of one driver call of `bytes`, in seconds: the measured points of
/// [`h200_call_points`] interpolated log-linearly in size (linear in size beyond the last
/// point, flat below the smallest).
pub fn h200_isolated_call_seconds(call: DriverCall, bytes: u64) -> f64 {
    interp(h200_call_points(call), bytes)
}

/// Isolated H200 cost, in seconds, of a cuMemAlloc or cuMemCreate of `bytes` when `bytes`
/// exceed the whole device, which the driver refuses; `None` for the other calls. Measured
/// by `scripts/probes/refused-alloc-probe.py` (driver 580, 2026-12-01, BENCHMARKS.md "Requests
/// larger than the device"): a refused cuMemAlloc of the device's memory + 1 GiB takes 5.5 ms (median of
/// 21; 1 TiB: 6.4 ms), not the ≈ 45 ms of a granted one of the device's size; a refused
/// cuMemCreate of 1 TiB 3.2 ms; sizes of 2^48 bytes (256 TiB) and above, far beyond any
/// device, are taken as refused by an argument check: 3.7 µs (cuMemAlloc) and 13 µs (cuMemCreate)
/// at 2^63. (A cuMemCreate of the device's memory + 1 GiB was refused as an invalid value in
/// 3 µs; the 1 TiB figure is charged from just above the device up, the dearer of the two.)
pub fn h200_refused_call_seconds(call: DriverCall, bytes: u64) -> Option<f64> {
    let absurd = bytes >= 1 << 48;
    match call {
        DriverCall::Alloc => Some(if absurd { 3.7e-6 } else { 5.5e-3 }),
        DriverCall::Create => Some(if absurd { 13e-6 } else { 3.2e-3 }),
        _ => None,
    }
}

/// Modelled H200 cost of one driver call of `bytes`, in seconds, made while
/// `live_mappings` mappings are live in the context: [`h200_isolated_call_seconds`] ×
/// (alpha + beta × `live_mappings`) of [`mapping_cost_factors`]. Per call kind, size and
/// page-table state, so that it holds for any allocator's mix of calls, not one strategy's.
pub fn h200_call_seconds(call: DriverCall, bytes: u64, live_mappings: u64) -> f64 {
    let (alpha, beta) = mapping_cost_factors(call);
    h200_isolated_call_seconds(call, bytes) * (alpha + beta * live_mappings as f64)
}

#[derive(Debug, Clone, Copy)]
struct Handle {
    bytes: u64,
    released: bool,
    /// Under a mapping (cuMemRelease of a mapped handle frees its memory only at the unmap).
    mapped: bool,
}

/// Handles below this many slots are never trimmed from the front of [`Handles`].
const HANDLE_TRIM_MIN: usize = 64;

/// The physical handles, by id. Ids are issued in sequence from 1 and never reused (what
/// cuMemCreate answers, seen by the callers), so a handle is found by subtracting the id of
/// the first slot kept: an indexing, not a hash. The slots of handles gone are trimmed from
/// the front once they are at least half of the slab, so that it spans the ids from the
/// oldest live handle to the newest (16 bytes a slot), not every cuMemCreate of the run.
#[derive(Debug, Clone)]
struct Handles {
    /// Id of `slots[0]`.
    first_id: u64,
    /// Slots below this index are all `None` (handles gone).
    head: usize,
    slots: Vec<Option<Handle>>,
}

impl Handles {
    fn new() -> Self {
        Handles {
            first_id: 1,
            head: 0,
            slots: Vec::new(),
        }
    }

    /// Index of handle `id` in the slab, if it was issued and not trimmed.
    #[inline(always)]
    fn index(&self, id: u64) -> Option<usize> {
        usize::try_from(id.checked_sub(self.first_id)?).ok()
    }

    /// The live (or released but still mapped) handle `id`.
    #[inline(always)]
    fn get(&self, id: u64) -> Option<&Handle> {
        self.slots.get(self.index(id)?)?.as_ref()
    }

    /// The live (or released but still mapped) handle `id`, to write.
    #[inline(always)]
    fn get_mut(&mut self, id: u64) -> Option<&mut Handle> {
        let i = self.index(id)?;
        self.slots.get_mut(i)?.as_mut()
    }

    /// Records a new handle and returns its id (the next in sequence).
    #[inline(always)]
    fn push(&mut self, h: Handle) -> u64 {
        self.slots.push(Some(h));
        self.first_id + self.slots.len() as u64 - 1
    }

    /// Forgets handle `id` (released and unmapped).
    #[inline]
    fn remove(&mut self, id: u64) {
        let Some(i) = self.index(id) else {
            return;
        };
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = None;
        }
        if i == self.head {
            self.trim_front();
        }
    }

    /// Moves `head` past the handles gone at the front, and drops them once they are at
    /// least half of the slab.
    #[cold]
    #[inline(never)]
    fn trim_front(&mut self) {
        while self.slots.get(self.head).is_some_and(|s| s.is_none()) {
            self.head += 1;
        }
        if self.head >= HANDLE_TRIM_MIN && self.head * 2 >= self.slots.len() {
            self.slots.drain(..self.head);
            self.first_id += self.head as u64;
            self.head = 0;
        }
    }

    /// Marks handle `id` unmapped; a released one is gone then, and its `bytes` leave
    /// `used`.
    #[inline(always)]
    fn unmapped(&mut self, id: u64, used: &mut u64) {
        let Some(h) = self.get_mut(id) else {
            return;
        };
        h.mapped = false;
        if h.released {
            *used -= h.bytes;
            self.remove(id);
        }
    }

    /// Handles not released (mapped or not).
    fn unreleased(&self) -> usize {
        self.slots.iter().flatten().filter(|h| !h.released).count()
    }
}

/// A mapping (whether access was granted is a bit of [`Reserved::access`]).
#[derive(Debug, Clone, Copy)]
struct Mapping {
    /// Never 0 (a mapping is at least a granule): the niche makes a slot 16 bytes.
    bytes: std::num::NonZeroU64,
    handle: PhysHandle,
}

/// Slots per chunk of a [`GranuleMap`] (a power of two).
const MAP_CHUNK: usize = 256;

/// One chunk of a [`GranuleMap`].
type MapChunk = Box<[Option<Mapping>; MAP_CHUNK]>;

/// The mappings of one reserved range by the granule they start at: chunks of
/// [`MAP_CHUNK`] slots, each allocated when one of its slots is first written, the chunk
/// index grown on demand (a range costs nothing until mapped, however large). A look-up is
/// two indexings, not a hash: cuMemMap, cuMemSetAccess and cuMemUnmap walk a range mapping
/// by mapping from its start.
#[derive(Debug, Clone, Default)]
struct GranuleMap {
    chunks: Vec<Option<MapChunk>>,
}

impl GranuleMap {
    /// The slot of granule `i`, if its chunk is allocated.
    #[inline(always)]
    fn slot(&self, i: u64) -> Option<&Option<Mapping>> {
        let i = usize::try_from(i).ok()?;
        let chunk = self.chunks.get(i / MAP_CHUNK)?.as_ref()?;
        Some(&chunk[i % MAP_CHUNK])
    }

    /// The slot of granule `i`, to write, if its chunk is allocated.
    #[inline(always)]
    fn slot_mut(&mut self, i: u64) -> Option<&mut Option<Mapping>> {
        let i = usize::try_from(i).ok()?;
        let chunk = self.chunks.get_mut(i / MAP_CHUNK)?.as_mut()?;
        Some(&mut chunk[i % MAP_CHUNK])
    }

    /// The mapping starting at granule `i`.
    #[inline(always)]
    fn get(&self, i: u64) -> Option<&Mapping> {
        self.slot(i)?.as_ref()
    }

    /// Records `m` as the mapping starting at granule `i`.
    #[inline(always)]
    fn insert(&mut self, i: u64, m: Mapping) {
        // The chunk is there (the common case): one write.
        match self.slot_mut(i) {
            Some(slot) => *slot = Some(m),
            None => self.insert_in_new_chunk(i, m),
        }
    }

    /// [`GranuleMap::insert`] where the chunk of granule `i` is not allocated yet.
    #[cold]
    #[inline(never)]
    fn insert_in_new_chunk(&mut self, i: u64, m: Mapping) {
        let Ok(i) = usize::try_from(i) else {
            return;
        };
        let c = i / MAP_CHUNK;
        if c >= self.chunks.len() {
            self.chunks.resize_with(c + 1, || None);
        }
        if let Some(chunk) = self.chunks.get_mut(c) {
            let chunk = chunk.get_or_insert_with(|| Box::new([None; MAP_CHUNK]));
            chunk[i % MAP_CHUNK] = Some(m);
        }
    }

    /// Takes the mappings that follow each other from granule `first` (each starting where
    /// the one before ends, mappings of `1 << sh`-byte granules) until granule `end` or
    /// the first granule where none starts, passing each to `f`; returns the granule where
    /// it stopped. One chunk look-up per chunk crossed, not per mapping.
    #[inline(always)]
    fn take_run(&mut self, first: u64, end: u64, sh: u32, mut f: impl FnMut(Mapping)) -> u64 {
        let chunk_slots = MAP_CHUNK as u64;
        let mut gi = first;
        'chunks: while gi < end {
            let Ok(i) = usize::try_from(gi) else {
                break;
            };
            let Some(Some(chunk)) = self.chunks.get_mut(i / MAP_CHUNK) else {
                break;
            };
            let chunk_end = (gi / chunk_slots + 1) * chunk_slots;
            loop {
                let Some(m) = chunk[(gi % chunk_slots) as usize].take() else {
                    break 'chunks;
                };
                f(m);
                gi += m.bytes.get() >> sh;
                if gi >= end {
                    break 'chunks;
                }
                if gi >= chunk_end {
                    continue 'chunks;
                }
            }
        }
        gi
    }

    /// Takes the mapping starting at granule `i`.
    #[inline(always)]
    fn remove(&mut self, i: u64) -> Option<Mapping> {
        self.slot_mut(i)?.take()
    }
}

/// 64 granules' state in a reserved range: bit `i` of `mapped` is set when granule `i`
/// is under a mapping, of `starts` when a mapping starts there (it has a slot in the
/// [`GranuleMap`]), of `access` when its mapping was made accessible by cuMemSetAccess
/// (set on whole mappings, cleared at their unmap). `starts` and `access` are subsets of
/// `mapped`.
#[derive(Debug, Clone, Copy, Default)]
struct GranuleBits {
    mapped: u64,
    starts: u64,
    access: u64,
}

/// A reserved virtual range: where it starts, its size, which of its granules are mapped
/// and accessible, and the mappings in it.
#[derive(Debug, Clone)]
struct Reserved {
    start: u64,
    bytes: u64,
    /// The range's granules, 64 a word (what the overlap check of cuMemMap and the tiling
    /// check of cuMemUnmap and cuMemSetAccess read, instead of an ordered search of the
    /// mappings). Grown as granules are mapped (a missing word is all unmapped): a large
    /// range costs nothing until mapped, and a range mapped from its start (expandable
    /// segments) touches a few words, not a bitmap of the whole range.
    bits: Vec<GranuleBits>,
    /// Granules mapped (cuMemAddressFree refuses a range with any).
    mapped_granules: u64,
    /// Live mappings in the range, by first granule.
    maps: GranuleMap,
}

impl Reserved {
    fn new(start: u64, bytes: u64) -> Self {
        Reserved {
            start,
            bytes,
            bits: Vec::new(),
            mapped_granules: 0,
            maps: GranuleMap::default(),
        }
    }

    /// Calls `f(word, mask of the span's bits in it)` for each bitmap word that granules
    /// `[first, first + n)` touch, in order, while it returns `true`; whether every call
    /// did. A plain loop: one word for a span inside one (the common case).
    #[inline(always)]
    fn words(first: u64, n: u64, mut f: impl FnMut(usize, u64) -> bool) -> bool {
        if n == 0 {
            return true;
        }
        let last = first + (n - 1);
        let (w0, b0) = (first / 64, first % 64);
        let (w1, b1) = (last / 64, last % 64);
        // Words of granules in a range held in memory fit a usize.
        let (w0, w1) = (w0 as usize, w1 as usize);
        if w0 == w1 {
            return f(w0, (u64::MAX >> (63 - (b1 - b0))) << b0);
        }
        if !f(w0, u64::MAX << b0) {
            return false;
        }
        for w in w0 + 1..w1 {
            if !f(w, u64::MAX) {
                return false;
            }
        }
        f(w1, u64::MAX >> (63 - b1))
    }

    /// `(word, mask)` when granules `[first, first + n)` lie in one bitmap word (the common
    /// case: a mapping of fewer than 64 granules).
    #[inline(always)]
    fn one_word(first: u64, n: u64) -> Option<(usize, u64)> {
        let b = first % 64;
        // 1 ≤ n ≤ 64 - b (`n - 1` wraps above for n = 0): `n` ones from bit `b`.
        (n.wrapping_sub(1) < 64 - b).then(|| ((first / 64) as usize, (u64::MAX >> (64 - n)) << b))
    }

    /// Whether any granule of `[first, first + n)` is mapped.
    #[inline(always)]
    fn any_mapped(&self, first: u64, n: u64) -> bool {
        !Self::words(first, n, |w, mask| {
            self.bits.get(w).is_none_or(|x| x.mapped & mask == 0)
        })
    }

    /// Whether every granule of `[first, first + n)` is mapped.
    #[inline(always)]
    fn all_mapped(&self, first: u64, n: u64) -> bool {
        Self::words(first, n, |w, mask| {
            self.bits.get(w).is_some_and(|x| x.mapped & mask == mask)
        })
    }

    /// Whether granule `i`'s bit is set in the bitmap `field` picks (mapped, starts, access).
    #[inline(always)]
    fn bit(&self, i: u64, field: impl Fn(&GranuleBits) -> u64) -> bool {
        let w = usize::try_from(i / 64).unwrap_or(usize::MAX);
        self.bits
            .get(w)
            .is_some_and(|x| field(x) >> (i % 64) & 1 != 0)
    }

    /// Whether granule `i` is mapped.
    #[inline(always)]
    fn is_mapped(&self, i: u64) -> bool {
        self.bit(i, |x| x.mapped)
    }

    /// Whether a mapping starts at granule `i`.
    #[inline(always)]
    fn starts_at(&self, i: u64) -> bool {
        self.bit(i, |x| x.starts)
    }

    /// Whether mappings tile granules `[first, first + n)` exactly (`n` ≥ 1): what the walk
    /// of [`SimDevice::check_tiled_in`] accepts, from the bitmaps instead of a look-up per
    /// mapping. Mappings are runs of granules that never overlap, each starting where its
    /// `starts` bit is, and `mapped` is their union; so the walk from `first` steps from
    /// mapping to mapping exactly when a mapping starts at `first` and every granule up to
    /// `first + n` is mapped, and it stops on `first + n` exactly when no mapping runs
    /// across it (that granule is unmapped, or a mapping starts there).
    #[inline(always)]
    fn tiles(&self, first: u64, n: u64) -> bool {
        let end = first + n;
        let end_ok = |x: &GranuleBits| {
            let b = end % 64;
            (x.mapped & !x.starts) >> b & 1 == 0
        };
        if let Some((w, mask)) = Self::one_word(first, n) {
            // The whole span in one word: its start bit, its mapped bits, and the granule
            // after it in the same word or the next.
            let Some(x) = self.bits.get(w) else {
                return false;
            };
            if x.mapped & mask != mask || x.starts >> (first % 64) & 1 == 0 {
                return false;
            }
            let we = usize::try_from(end / 64).unwrap_or(usize::MAX);
            return if we == w {
                end_ok(x)
            } else {
                self.bits.get(we).is_none_or(end_ok)
            };
        }
        self.starts_at(first)
            && self.all_mapped(first, n)
            && (!self.is_mapped(end) || self.starts_at(end))
    }

    /// Whether granule `i` was made accessible.
    fn granted(&self, i: u64) -> bool {
        self.bit(i, |x| x.access)
    }

    /// Grows the bitmap to hold granules below `end`.
    #[inline(always)]
    fn cover(&mut self, end: u64) {
        let words = usize::try_from(end.div_ceil(64)).unwrap_or(usize::MAX);
        if words > self.bits.len() {
            self.bits.resize(words, GranuleBits::default());
        }
    }

    /// Makes granules `[first, first + n)` accessible (whole mappings).
    #[inline(always)]
    fn grant(&mut self, first: u64, n: u64) {
        self.cover(first + n);
        let bits = &mut self.bits;
        Self::words(first, n, |w, mask| {
            if let Some(x) = bits.get_mut(w) {
                x.access |= mask;
            }
            true
        });
    }

    /// Marks granules `[first, first + n)` mapped, by one mapping starting at `first`.
    #[inline(always)]
    fn set_mapped(&mut self, first: u64, n: u64) {
        self.cover(first + n);
        let bits = &mut self.bits;
        Self::words(first, n, |w, mask| {
            if let Some(x) = bits.get_mut(w) {
                x.mapped |= mask;
            }
            true
        });
        let w = usize::try_from(first / 64).unwrap_or(usize::MAX);
        if let Some(x) = self.bits.get_mut(w) {
            x.starts |= 1 << (first % 64);
        }
        self.mapped_granules += n;
    }

    /// Marks granules `[first, first + n)` unmapped (no mapping starts there, none is
    /// accessible).
    #[inline(always)]
    fn clear_mapped(&mut self, first: u64, n: u64) {
        let bits = &mut self.bits;
        Self::words(first, n, |w, mask| {
            if let Some(x) = bits.get_mut(w) {
                x.mapped &= !mask;
                x.starts &= !mask;
                x.access &= !mask;
            }
            true
        });
        self.mapped_granules = self.mapped_granules.saturating_sub(n);
    }
}

/// One call kind's sums behind the modelled driver seconds ([`SimDevice::cost_basis`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CostBasis {
    /// Calls made.
    pub calls: u64,
    /// Sum of their isolated costs ([`h200_isolated_call_seconds`]), seconds.
    pub isolated_seconds: f64,
    /// Sum of isolated cost × mappings live in the context at the call, seconds.
    pub isolated_seconds_x_mappings: f64,
}

/// What every driver call is charged: its index (for fault injection), its modelled seconds
/// and the sums behind them. Kept apart from the device's records so that a call can
/// charge itself while it holds one of them.
#[derive(Debug, Clone)]
struct Meter {
    counters: DriverCounters,
    /// Per call kind, `(bytes, isolated cost in seconds)` of the last sizes modelled, in
    /// [`COST_MEMO_SLOTS`] slots picked by the size in granules (a cache: the log-linear
    /// interpolation is the dearest part of a call, and a pool's calls come in a few sizes).
    /// An empty slot holds the cost of a call of 0 bytes, so it needs no flag of its own.
    cost_memo: [[(u64, f64); COST_MEMO_SLOTS]; CALL_KINDS],
    /// Per call kind, the sum of the isolated costs charged, seconds.
    isolated_seconds: [f64; CALL_KINDS],
    /// Per call kind, the sum of isolated cost × mappings live at the call, seconds.
    isolated_seconds_x_mappings: [f64; CALL_KINDS],
    calls_made: u64,
    /// Index of the call to fail; `u64::MAX` for none (a count no run reaches).
    fault_at: u64,
    /// The device's capacity (at least 1 byte): a cuMemAlloc or cuMemCreate above it is
    /// charged as a refusal, any other call as one of this size.
    max_bytes: u64,
    /// log2 of the granularity (the memo slot of a size is its granules, modulo).
    granule_shift: u32,
}

impl Meter {
    /// The meter of a device of `capacity` bytes and granules of `1 << granule_shift` bytes.
    fn new(capacity: u64, granule_shift: u32) -> Self {
        let mut cost_memo = [[(0, 0.0); COST_MEMO_SLOTS]; CALL_KINDS];
        for (memo, &call) in cost_memo.iter_mut().zip(DriverCall::ALL.iter()) {
            *memo = [(0, h200_isolated_call_seconds(call, 0)); COST_MEMO_SLOTS];
        }
        Meter {
            counters: DriverCounters::default(),
            cost_memo,
            isolated_seconds: [0.0; CALL_KINDS],
            isolated_seconds_x_mappings: [0.0; CALL_KINDS],
            calls_made: 0,
            fault_at: u64::MAX,
            max_bytes: capacity.max(1),
            granule_shift,
        }
    }

    /// Counts a call of `bytes` made with `live_mappings` mappings live, and charges its
    /// modelled seconds; the injected fault when it is the call to fail. Inlined in every
    /// call with `call` a constant: the cost factors and the indexings fold away.
    #[inline(always)]
    fn charge(
        &mut self,
        call: DriverCall,
        bytes: u64,
        live_mappings: u64,
    ) -> Result<(), DeviceError> {
        let idx = self.calls_made;
        self.calls_made += 1;
        if idx == self.fault_at {
            return Err(Self::injected_fault(call));
        }
        self.record(call, bytes, live_mappings);
        Ok(())
    }

    /// Whether the next call is the one to fail.
    #[inline(always)]
    fn next_faults(&self) -> bool {
        self.calls_made == self.fault_at
    }

    /// [`Meter::charge`] of a call that is not the one to fail ([`Meter::next_faults`]).
    #[inline(always)]
    fn charge_unfailing(&mut self, call: DriverCall, bytes: u64, live_mappings: u64) {
        self.calls_made += 1;
        self.record(call, bytes, live_mappings);
    }

    /// The cost part of [`Meter::charge`]: the call's modelled seconds and the sums.
    #[inline(always)]
    fn record(&mut self, call: DriverCall, bytes: u64, live_mappings: u64) {
        let isolated = if bytes > self.max_bytes {
            self.above_device(call, bytes)
        } else {
            let k = call as usize;
            let slot = (bytes >> self.granule_shift) as usize % COST_MEMO_SLOTS;
            match self.cost_memo.get(k).and_then(|m| m.get(slot)) {
                Some(&(b, s)) if b == bytes => s,
                _ => self.memo_miss(call, bytes, slot),
            }
        };
        let k = call as usize;
        let (alpha, beta) = mapping_cost_factors(call);
        // The same value as `live_mappings as f64` by the signed conversion (one
        // instruction): a count of mappings is below 2^63 (each holds a granule of the
        // 2^46-byte address space).
        let live = live_mappings as i64 as f64;
        let seconds = isolated * (alpha + beta * live);
        self.counters.record(call, seconds);
        if let Some(s) = self.isolated_seconds.get_mut(k) {
            *s += isolated;
        }
        if let Some(s) = self.isolated_seconds_x_mappings.get_mut(k) {
            *s += isolated * live;
        }
    }

    /// The isolated cost of a call of `bytes` above the whole device: a refusal
    /// ([`h200_refused_call_seconds`]: cuMemAlloc, cuMemCreate), else address space, priced
    /// as a call of the device's size (flat above 1 GiB).
    #[cold]
    #[inline(never)]
    fn above_device(&self, call: DriverCall, bytes: u64) -> f64 {
        h200_refused_call_seconds(call, bytes)
            .unwrap_or_else(|| h200_isolated_call_seconds(call, self.max_bytes))
    }

    /// The isolated cost of a call of `bytes` not in memo slot `slot`: modelled, and kept
    /// in that slot (out of line: the charge of a memoized size stays a few instructions).
    #[cold]
    #[inline(never)]
    fn memo_miss(&mut self, call: DriverCall, bytes: u64, slot: usize) -> f64 {
        let s = h200_isolated_call_seconds(call, bytes);
        if let Some(m) = self
            .cost_memo
            .get_mut(call as usize)
            .and_then(|m| m.get_mut(slot))
        {
            *m = (bytes, s);
        }
        s
    }

    /// Per call kind, the sums behind the cost model ([`SimDevice::cost_basis`]).
    fn basis(&self) -> [CostBasis; CALL_KINDS] {
        let mut b = [CostBasis::default(); CALL_KINDS];
        for (k, b) in b.iter_mut().enumerate() {
            *b = CostBasis {
                calls: self.counters.calls.get(k).copied().unwrap_or(0),
                isolated_seconds: self.isolated_seconds.get(k).copied().unwrap_or(0.0),
                isolated_seconds_x_mappings: self
                    .isolated_seconds_x_mappings
                    .get(k)
                    .copied()
                    .unwrap_or(0.0),
            };
        }
        b
    }

    /// The error of an injected fault.
    #[cold]
    #[inline(never)]
    fn injected_fault(call: DriverCall) -> DeviceError {
        DeviceError::Driver {
            call: call.cuda_name(),
            name: "CUDA_ERROR_UNKNOWN (injected fault)".into(),
        }
    }
}

/// Index of the range of `reserved` (in address order) holding `va`.
#[inline(always)]
fn reserved_at(reserved: &[Reserved], va: u64) -> Option<usize> {
    let i = reserved.partition_point(|r| r.start <= va).checked_sub(1)?;
    let r = reserved.get(i)?;
    (va - r.start < r.bytes).then_some(i)
}

/// Index of the range of `reserved` (in address order) holding all of `[va, va+bytes)`.
#[inline(always)]
fn reserved_holding(reserved: &[Reserved], va: u64, bytes: u64) -> Option<usize> {
    let i = reserved_at(reserved, va)?;
    let r = reserved.get(i)?;
    va.checked_add(bytes)
        .is_some_and(|e| e <= r.start + r.bytes)
        .then_some(i)
}

/// [`reserved_holding`] trying range `*last` first (a pool's calls fall in one or two
/// ranges), and remembering in `*last` the range found: `(its index, offset of va in it)`.
#[inline(always)]
fn reserved_holding_from(
    reserved: &[Reserved],
    last: &mut usize,
    va: u64,
    bytes: u64,
) -> Option<(usize, u64)> {
    if let Some(r) = reserved.get(*last) {
        let off = va.wrapping_sub(r.start);
        if off < r.bytes {
            // Ranges do not overlap: this is the one holding `va`.
            return (bytes <= r.bytes - off).then_some((*last, off));
        }
    }
    reserved_holding_elsewhere(reserved, last, va, bytes)
}

/// [`reserved_holding_from`] when `va` is not in range `*last`.
#[inline(never)]
fn reserved_holding_elsewhere(
    reserved: &[Reserved],
    last: &mut usize,
    va: u64,
    bytes: u64,
) -> Option<(usize, u64)> {
    let i = reserved_holding(reserved, va, bytes)?;
    *last = i;
    Some((i, va - reserved.get(i)?.start))
}

/// The simulated device. Cheap to clone (for bisection over capacities).
#[derive(Debug, Clone)]
pub struct SimDevice {
    capacity: u64,
    granularity: u64,
    /// log2 of `granularity`.
    granule_shift: u32,
    used: u64,
    peak_used: u64,
    /// Call counts, modelled seconds and the cost model's sums.
    meter: Meter,
    /// Free virtual address ranges: start -> length.
    free_va: BTreeMap<u64, u64>,
    /// Live cuMemAlloc segments: addr -> bytes (rounded to the granularity).
    segments: BTreeMap<u64, u64>,
    /// Live reserved VA ranges in address order (a pool holds a few: a binary search of a
    /// short vector), each with its mappings.
    reserved: Vec<Reserved>,
    /// Index in `reserved` of the range the last cuMemMap, cuMemSetAccess or cuMemUnmap
    /// fell in (tried first: a pool maps into one or two ranges).
    last_range: usize,
    /// Live mappings, in all reserved ranges.
    live_mappings: u64,
    /// Physical handles, by id.
    handles: Handles,
    /// Recorded cudaMalloc/cudaFree calls to follow (see [`SimDevice::follow_recorded`]).
    script: Option<Script>,
    /// Live segments placed at recorded addresses outside the simulated address space.
    foreign: std::collections::BTreeSet<u64>,
    /// Smallest physical usage a refused request would have reached (`used + bytes`).
    smallest_refused_demand: Option<u64>,
}

/// What a recorded driver call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordedKind {
    /// cudaMalloc (PyTorch's `segment_alloc`).
    Alloc,
    /// cudaFree (PyTorch's `segment_free`).
    Free,
}

/// A cudaMalloc or cudaFree recorded in a trace, for [`SimDevice::follow_recorded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RecordedCall {
    /// What the call did.
    pub kind: RecordedKind,
    /// Address of the segment.
    pub addr: u64,
    /// Bytes of the segment.
    pub bytes: u64,
    /// Index of the recording event in the trace.
    pub event: u64,
}

/// Whether the calls made matched the recorded ones ([`SimDevice::recorded_check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum RecordedCheck {
    /// Every recorded call was made, in order, with the same size (and, for frees, address).
    Matches {
        /// Calls matched.
        calls: u64,
    },
    /// The first call that differed.
    Diverges {
        /// Index of the recorded event where the sequences part (the last recorded call's
        /// event when the device made a call the trace does not have).
        event: u64,
        /// The recorded call at that point, if any remained.
        recorded: Option<RecordedCall>,
        /// The call the device was asked for instead (kind, address for frees or 0, bytes),
        /// if any. Serialised as an object with the keys of `recorded` (`kind`, `addr`,
        /// `bytes`), less `event`.
        #[serde(serialize_with = "serialize_emulated")]
        emulated: Option<(RecordedKind, u64, u64)>,
    },
}

/// [`RecordedCheck::Diverges`]'s `emulated` call as `{"kind", "addr", "bytes"}`, the shape of
/// its `recorded` call, instead of serde's array for a tuple.
fn serialize_emulated<S: serde::Serializer>(
    call: &Option<(RecordedKind, u64, u64)>,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(serde::Serialize)]
    struct Call {
        kind: RecordedKind,
        addr: u64,
        bytes: u64,
    }
    serde::Serialize::serialize(
        &call.map(|(kind, addr, bytes)| Call { kind, addr, bytes }),
        s,
    )
}

impl std::fmt::Display for RecordedCheck {
    /// `matches the recorded cudaMalloc sequence (N calls)` or
    /// `diverges at event K: recorded X, emulated Y`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn call(k: RecordedKind, addr: u64, bytes: u64) -> String {
            match (k, addr) {
                (RecordedKind::Alloc, 0) => format!("cudaMalloc({bytes})"),
                (RecordedKind::Alloc, a) => format!("cudaMalloc({bytes}) at {a:#x}"),
                (RecordedKind::Free, a) => format!("cudaFree({a:#x}, {bytes} B)"),
            }
        }
        match self {
            RecordedCheck::Matches { calls } => {
                write!(
                    f,
                    "matches the recorded cudaMalloc sequence ({calls} calls)"
                )
            }
            RecordedCheck::Diverges {
                event,
                recorded,
                emulated,
            } => write!(
                f,
                "diverges at event {event}: recorded {}, emulated {}",
                recorded.map_or("nothing".into(), |r| call(r.kind, r.addr, r.bytes)),
                emulated.map_or("nothing".into(), |(k, a, b)| call(k, a, b)),
            ),
        }
    }
}

/// The recorded calls being followed.
#[derive(Debug, Clone)]
struct Script {
    calls: Vec<RecordedCall>,
    next: usize,
    /// Successful cudaMalloc calls still to place as usual once `skip_from` calls of the
    /// script are made.
    skip_allocs: u64,
    skip_from: usize,
    divergence: Option<RecordedCheck>,
}

impl Default for SimDevice {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl SimDevice {
    /// A device of `capacity_bytes` with 2 MiB granularity.
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_granularity(capacity_bytes, DEFAULT_GRANULARITY)
    }

    /// A device of `capacity_bytes` and the given VMM granularity (a power of two).
    pub fn with_granularity(capacity_bytes: u64, granularity_bytes: u64) -> Self {
        let granularity = if crate::align::is_pow2(granularity_bytes) {
            granularity_bytes
        } else {
            DEFAULT_GRANULARITY
        };
        let mut free_va = BTreeMap::new();
        // 64 TiB of address space, like a real GPU's 47+ bits.
        free_va.insert(DEFAULT_BASE, 1u64 << 46);
        SimDevice {
            capacity: capacity_bytes,
            granularity,
            granule_shift: granularity.trailing_zeros(),
            used: 0,
            peak_used: 0,
            meter: Meter::new(capacity_bytes, granularity.trailing_zeros()),
            free_va,
            segments: BTreeMap::new(),
            reserved: Vec::new(),
            last_range: 0,
            live_mappings: 0,
            handles: Handles::new(),
            smallest_refused_demand: None,
            script: None,
            foreign: std::collections::BTreeSet::new(),
        }
    }

    /// Follows recorded driver calls: each cudaMalloc of the same size as the next recorded
    /// `segment_alloc` returns the recorded address, each cudaFree must match the next
    /// recorded `segment_free`, so an allocator whose choices depend on address order (the
    /// PyTorch emulation) sees the addresses the recorded run saw. The first `skip_allocs`
    /// successful cudaMallocs (blocks that were live before recording started) are placed as
    /// usual. At the first call that differs the device stops following and places the rest
    /// top-down; [`SimDevice::recorded_check`] says where.
    pub fn follow_recorded(&mut self, calls: Vec<RecordedCall>, skip_allocs: u64) {
        self.follow_recorded_from(calls, 0, skip_allocs);
    }

    /// [`SimDevice::follow_recorded`] where the `skip_allocs` cudaMallocs placed as usual come
    /// after the first `skip_from` calls of the script (a replay that first takes in the
    /// segments a recorded run already held, at their recorded addresses, then allocates the
    /// other blocks live before recording started).
    pub fn follow_recorded_from(
        &mut self,
        calls: Vec<RecordedCall>,
        skip_from: usize,
        skip_allocs: u64,
    ) {
        self.script = Some(Script {
            calls,
            next: 0,
            skip_allocs,
            skip_from,
            divergence: None,
        });
    }

    /// Per call kind (indexed like [`DriverCall::ALL`]), the sums the cost model is linear
    /// in: the modelled seconds of kind `k` are alpha × `isolated_seconds` + beta ×
    /// `isolated_seconds_x_mappings` with `(alpha, beta)` = [`mapping_cost_factors`]. What a
    /// refit of the model against real replays needs (`scripts/fit/fit-cost-model.py`).
    pub fn cost_basis(&self) -> [CostBasis; CALL_KINDS] {
        self.meter.basis()
    }

    /// How the calls made compare with the ones given to [`SimDevice::follow_recorded`]
    /// (`None` when none were given).
    pub fn recorded_check(&self) -> Option<RecordedCheck> {
        let s = self.script.as_ref()?;
        if let Some(d) = s.divergence {
            return Some(d);
        }
        Some(match s.calls.get(s.next) {
            Some(r) => RecordedCheck::Diverges {
                event: r.event,
                recorded: Some(*r),
                emulated: None,
            },
            None => RecordedCheck::Matches {
                calls: s.next as u64,
            },
        })
    }

    /// The recorded address for a cudaMalloc of `rounded` bytes, if the script has one
    /// (consumed), or `None` to place it as usual (recording a divergence if it differs).
    fn scripted_alloc(&mut self, bytes: u64, rounded: u64) -> Option<u64> {
        let s = self.script.as_mut()?;
        if s.divergence.is_some() {
            return None;
        }
        if s.skip_allocs > 0 && s.next >= s.skip_from {
            s.skip_allocs -= 1;
            return None;
        }
        let diverge = |s: &mut Script, r: Option<RecordedCall>| {
            let event = r.or_else(|| s.calls.last().copied()).map_or(0, |c| c.event);
            s.divergence = Some(RecordedCheck::Diverges {
                event,
                recorded: r,
                emulated: Some((RecordedKind::Alloc, 0, bytes)),
            });
            None
        };
        let r = s.calls.get(s.next).copied();
        match r {
            Some(c) if c.kind == RecordedKind::Alloc && c.bytes == bytes => {
                // The recorded range must be free address space here, or lie outside the
                // simulated address space without touching a live segment.
                let Some(end) = c.addr.checked_add(rounded) else {
                    return diverge(s, r);
                };
                let inside = self
                    .free_va
                    .range(..=c.addr)
                    .next_back()
                    .filter(|(&st, &len)| end <= st + len);
                let Some((&start, &len)) = inside else {
                    let space_end = DEFAULT_BASE + (1u64 << 46);
                    let outside = end <= DEFAULT_BASE || c.addr >= space_end;
                    let overlaps = self
                        .segments
                        .range(..end)
                        .next_back()
                        .is_some_and(|(&a, &b)| a + b > c.addr);
                    if outside && !overlaps {
                        s.next += 1;
                        self.foreign.insert(c.addr);
                        return Some(c.addr);
                    }
                    return diverge(s, r);
                };
                s.next += 1;
                self.free_va.remove(&start);
                if c.addr > start {
                    self.free_va.insert(start, c.addr - start);
                }
                let end = c.addr + rounded;
                if start + len > end {
                    self.free_va.insert(end, start + len - end);
                }
                Some(c.addr)
            }
            _ => diverge(s, r),
        }
    }

    /// Checks a cudaFree of `addr` against the script.
    fn scripted_free(&mut self, addr: u64, bytes: u64) {
        let Some(s) = self.script.as_mut() else {
            return;
        };
        if s.divergence.is_some() {
            return;
        }
        let r = s.calls.get(s.next).copied();
        match r {
            Some(c) if c.kind == RecordedKind::Free && c.addr == addr => s.next += 1,
            _ => {
                let event = r.or_else(|| s.calls.last().copied()).map_or(0, |c| c.event);
                s.divergence = Some(RecordedCheck::Diverges {
                    event,
                    recorded: r,
                    emulated: Some((RecordedKind::Free, addr, bytes)),
                });
            }
        }
    }

    /// Makes the driver call with 0-based index `call_index` (counting every call from the
    /// start of the device) fail with `CUDA_ERROR_UNKNOWN`; `None` clears it.
    pub fn inject_fault_at(&mut self, call_index: Option<u64>) {
        self.meter.fault_at = call_index.unwrap_or(u64::MAX);
    }

    /// Calls made so far (including failed ones).
    pub fn calls_made(&self) -> u64 {
        self.meter.calls_made
    }

    /// Highest physical usage seen, in bytes.
    pub fn peak_used_bytes(&self) -> u64 {
        self.peak_used
    }

    /// The smallest physical usage, in bytes, that a request refused for lack of memory
    /// would have reached (`used + bytes` at the refusal); `None` if none was refused.
    ///
    /// With [`Self::peak_used_bytes`] it bounds the capacities that would have given the
    /// same answers: every request the device granted fits in any capacity of at least the
    /// peak, and every refused one is refused by any capacity below this figure.
    pub fn smallest_refused_demand_bytes(&self) -> Option<u64> {
        self.smallest_refused_demand
    }

    /// Live segments, reserved ranges, mappings and unreleased handles; all zero means
    /// nothing leaked.
    pub fn live_objects(&self) -> (usize, usize, usize, usize) {
        let live_handles = self.handles.unreleased();
        (
            self.segments.len(),
            self.reserved.len(),
            usize::try_from(self.live_mappings).unwrap_or(usize::MAX),
            live_handles,
        )
    }

    #[inline(always)]
    fn begin(&mut self, call: DriverCall, bytes: u64) -> Result<(), DeviceError> {
        self.meter.charge(call, bytes, self.live_mappings)
    }

    fn take_physical(&mut self, bytes: u64) -> Result<(), DeviceError> {
        match self.used.checked_add(bytes) {
            Some(n) if n <= self.capacity => {
                self.used = n;
                self.peak_used = self.peak_used.max(n);
                Ok(())
            }
            _ => {
                let demand = self.used.saturating_add(bytes);
                self.smallest_refused_demand = Some(
                    self.smallest_refused_demand
                        .map_or(demand, |d| d.min(demand)),
                );
                Err(DeviceError::OutOfMemory {
                    requested_bytes: bytes,
                    free_bytes: self.capacity.saturating_sub(self.used),
                    capacity_bytes: self.capacity,
                })
            }
        }
    }

    /// Takes `bytes` of address space from the top of the highest free range that fits:
    /// the CUDA driver hands out newer allocations at lower addresses, and PyTorch's
    /// tie-break between equal free blocks (lowest address) depends on that order.
    fn take_va(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        let found = self
            .free_va
            .iter()
            .rev()
            .find(|(_, &len)| len >= bytes)
            .map(|(&s, &l)| (s, l));
        let (start, len) = found.ok_or(DeviceError::OutOfMemory {
            requested_bytes: bytes,
            free_bytes: 0,
            capacity_bytes: self.capacity,
        })?;
        if len > bytes {
            self.free_va.insert(start, len - bytes);
        } else {
            self.free_va.remove(&start);
        }
        Ok(start + len - bytes)
    }

    fn give_va(&mut self, start: u64, bytes: u64) {
        let mut s = start;
        let mut l = bytes;
        if let Some((&ps, &pl)) = self.free_va.range(..s).next_back() {
            if ps + pl == s {
                self.free_va.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(&nl) = self.free_va.get(&(s + l)) {
            self.free_va.remove(&(s + l));
            l += nl;
        }
        self.free_va.insert(s, l);
    }

    #[inline(always)]
    fn check_granular(&self, call: DriverCall, v: u64) -> Result<(), DeviceError> {
        if v == 0 || !self.is_granular(v) {
            return Err(self.not_granular(call, v));
        }
        Ok(())
    }

    /// The error of [`SimDevice::check_granular`].
    #[cold]
    #[inline(never)]
    fn not_granular(&self, call: DriverCall, v: u64) -> DeviceError {
        DeviceError::Invalid {
            call: call.cuda_name(),
            detail: format!(
                "{v} is not a non-zero multiple of the granularity {}",
                self.granularity
            ),
        }
    }

    fn invalid(call: DriverCall, detail: String) -> DeviceError {
        DeviceError::Invalid {
            call: call.cuda_name(),
            detail,
        }
    }

    /// Index of the reserved range holding `va`.
    #[inline]
    fn reserved_at(&self, va: u64) -> Option<usize> {
        reserved_at(&self.reserved, va)
    }

    /// Where the mapping starting at `va` would be recorded: `(reserved range, granule in
    /// it)`, or `None` when `va` is not a granule of a reserved range. `hint` is a reserved
    /// range to try first (a walk stays in one range).
    #[inline]
    fn granule_of(&self, va: u64, hint: usize) -> Option<(usize, u64)> {
        let ri = match self.reserved.get(hint) {
            Some(r) if va >= r.start && va - r.start < r.bytes => hint,
            _ => self.reserved_at(va)?,
        };
        let off = va - self.reserved.get(ri)?.start;
        self.is_granular(off).then(|| (ri, self.granules(off)))
    }

    /// The mapping starting at `va`, and where it is recorded (see
    /// [`SimDevice::granule_of`]).
    #[inline]
    fn mapping_at(&self, va: u64, hint: usize) -> Option<(usize, u64, Mapping)> {
        let (ri, gi) = self.granule_of(va, hint)?;
        let m = *self.reserved.get(ri)?.maps.get(gi)?;
        Some((ri, gi, m))
    }

    /// Checks that mappings tile `[va, va + bytes)` exactly, walking them from `va`.
    fn check_tiled(&self, c: DriverCall, va: u64, bytes: u64) -> Result<(), DeviceError> {
        let mut at = va;
        let end = va + bytes;
        let mut hint = 0;
        while at < end {
            match self.mapping_at(at, hint) {
                Some((ri, _, m)) => {
                    at += m.bytes.get();
                    hint = ri;
                }
                None => break,
            }
        }
        if at < end {
            return Err(Self::invalid(c, format!("{at:#x} is not mapped")));
        }
        if at != end {
            return Err(Self::invalid(c, "range ends inside a mapping".into()));
        }
        Ok(())
    }

    /// `(reserved range, first granule, granules)` when `[va, va + bytes)` starts on a
    /// granule and lies inside one reserved range (the common case, walked by granule
    /// index without a look-up per mapping); `None` otherwise (the general walk decides).
    #[inline(always)]
    fn span_in_one_range(&mut self, va: u64, bytes: u64) -> Option<(usize, u64, u64)> {
        let (ri, off) = reserved_holding_from(&self.reserved, &mut self.last_range, va, bytes)?;
        self.is_granular(off)
            .then(|| (ri, self.granules(off), self.granules(bytes)))
    }

    /// [`SimDevice::check_tiled`] for granules `[first, first + n)` of reserved range `ri`:
    /// the same walk and the same errors, by granule index.
    fn check_tiled_in(
        &self,
        c: DriverCall,
        ri: usize,
        first: u64,
        n: u64,
    ) -> Result<(), DeviceError> {
        let sh = self.granule_shift;
        let Some(r) = self.reserved.get(ri) else {
            return Err(Self::invalid(c, "reserved range vanished".into()));
        };
        let end = first + n;
        let mut gi = first;
        while gi < end {
            match r.maps.get(gi) {
                Some(m) => gi += m.bytes.get() >> sh,
                None => {
                    let at = r.start + (gi << sh);
                    return Err(Self::invalid(c, format!("{at:#x} is not mapped")));
                }
            }
        }
        if gi != end {
            return Err(Self::invalid(c, "range ends inside a mapping".into()));
        }
        Ok(())
    }

    /// Why cuMemMap of `handle` at `va` for `bytes` is refused: its checks in order, the
    /// first that fails (out of line: [`Device::map`] runs them without their messages).
    #[cold]
    #[inline(never)]
    fn map_refused(&self, va: u64, bytes: u64, handle: PhysHandle) -> DeviceError {
        let c = DriverCall::Map;
        if let Err(e) = self.check_granular(c, bytes) {
            return e;
        }
        if !self.is_granular(va) {
            return Self::invalid(c, format!("{va:#x} is not aligned to the granularity"));
        }
        let h = match self.handles.get(handle.0) {
            Some(h) if !h.released => h,
            _ => return Self::invalid(c, format!("handle {} is not live", handle.0)),
        };
        if h.bytes != bytes {
            return Self::invalid(
                c,
                format!("handle {} has {} B, not {bytes}", handle.0, h.bytes),
            );
        }
        if h.mapped {
            return Self::invalid(c, format!("handle {} is already mapped", handle.0));
        }
        let Some(r) =
            reserved_holding(&self.reserved, va, bytes).and_then(|i| self.reserved.get(i))
        else {
            return Self::invalid(c, format!("{va:#x}+{bytes} is not inside a reserved range"));
        };
        let sh = self.granule_shift;
        if r.any_mapped((va - r.start) >> sh, bytes >> sh) {
            return Self::invalid(c, format!("{va:#x}+{bytes} overlaps a mapping"));
        }
        Self::invalid(c, "refused by a check that then passed".into())
    }

    /// `bytes` in granules (the granularity is a power of two: a shift, not a division).
    fn granules(&self, bytes: u64) -> u64 {
        bytes >> self.granule_shift
    }

    /// Whether `v` is a multiple of the granularity (a power of two).
    fn is_granular(&self, v: u64) -> bool {
        v & (self.granularity - 1) == 0
    }
}

impl Device for SimDevice {
    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }
    fn granularity_bytes(&self) -> u64 {
        self.granularity
    }
    fn used_bytes(&self) -> u64 {
        self.used
    }
    fn counters(&self) -> DriverCounters {
        self.meter.counters
    }

    fn alloc_segment(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        let c = DriverCall::Alloc;
        if bytes == 0 {
            return Err(Self::invalid(c, "size 0".into()));
        }
        let rounded = crate::align::align_up(bytes, self.granularity)
            .ok_or_else(|| Self::invalid(c, format!("size {bytes} overflows")))?;
        self.begin(c, bytes)?;
        self.take_physical(rounded)?;
        if let Some(addr) = self.scripted_alloc(bytes, rounded) {
            self.segments.insert(addr, rounded);
            return Ok(addr);
        }
        match self.take_va(rounded) {
            Ok(addr) => {
                self.segments.insert(addr, rounded);
                Ok(addr)
            }
            Err(e) => {
                self.used -= rounded;
                Err(e)
            }
        }
    }

    fn free_segment(&mut self, addr: u64) -> Result<(), DeviceError> {
        let c = DriverCall::Free;
        let bytes = *self
            .segments
            .get(&addr)
            .ok_or_else(|| Self::invalid(c, format!("{addr:#x} is not a live segment")))?;
        self.begin(c, bytes)?;
        self.scripted_free(addr, bytes);
        self.segments.remove(&addr);
        self.used -= bytes;
        if !self.foreign.remove(&addr) {
            self.give_va(addr, bytes);
        }
        Ok(())
    }

    fn reserve_va(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        let c = DriverCall::Reserve;
        self.check_granular(c, bytes)?;
        self.begin(c, bytes)?;
        let va = self.take_va(bytes)?;
        let i = self.reserved.partition_point(|r| r.start < va);
        self.reserved.insert(i, Reserved::new(va, bytes));
        Ok(va)
    }

    fn free_va(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        let c = DriverCall::AddressFree;
        let found = self
            .reserved
            .binary_search_by_key(&va, |r| r.start)
            .ok()
            .filter(|&i| self.reserved[i].bytes == bytes);
        let Some(i) = found else {
            return Err(Self::invalid(
                c,
                format!("{va:#x}+{bytes} is not a reserved range"),
            ));
        };
        if self.reserved[i].mapped_granules > 0 {
            return Err(Self::invalid(
                c,
                format!("{va:#x}+{bytes} still has mappings"),
            ));
        }
        self.begin(c, bytes)?;
        self.reserved.remove(i);
        self.give_va(va, bytes);
        Ok(())
    }

    fn create_physical(&mut self, bytes: u64) -> Result<PhysHandle, DeviceError> {
        let c = DriverCall::Create;
        self.check_granular(c, bytes)?;
        self.begin(c, bytes)?;
        self.take_physical(bytes)?;
        let h = self.handles.push(Handle {
            bytes,
            released: false,
            mapped: false,
        });
        Ok(PhysHandle(h))
    }

    fn release_physical(&mut self, handle: PhysHandle) -> Result<(), DeviceError> {
        let c = DriverCall::Release;
        let h = match self.handles.get(handle.0) {
            Some(h) if !h.released => *h,
            _ => return Err(Self::invalid(c, format!("handle {} is not live", handle.0))),
        };
        self.begin(c, h.bytes)?;
        if !h.mapped {
            self.handles.remove(handle.0);
            self.used -= h.bytes;
        } else if let Some(e) = self.handles.get_mut(handle.0) {
            e.released = true;
        }
        Ok(())
    }

    fn map(&mut self, va: u64, bytes: u64, handle: PhysHandle) -> Result<(), DeviceError> {
        if self.map_in_one_word(va, bytes, handle) {
            return Ok(());
        }
        self.map_checked(va, bytes, handle)
    }

    fn set_access(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        if self.set_access_in_one_word(va, bytes) {
            return Ok(());
        }
        self.set_access_checked(va, bytes)
    }

    fn unmap(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        let c = DriverCall::Unmap;
        self.check_granular(c, bytes)?;
        let Some((ri, first, n)) = self.span_in_one_range(va, bytes) else {
            return self.unmap_across(va, bytes);
        };
        if !self.reserved.get(ri).is_some_and(|r| r.tiles(first, n)) {
            // The walk says why (and decides, should the bitmaps disagree).
            self.check_tiled_in(c, ri, first, n)?;
        }
        self.begin(c, bytes)?;
        let sh = self.granule_shift;
        let Some(r) = self.reserved.get_mut(ri) else {
            return Ok(());
        };
        // The mappings tile the granules: each is taken, and their bits are cleared in one
        // pass at the end.
        let (handles, used, live) = (&mut self.handles, &mut self.used, &mut self.live_mappings);
        let gi = r.maps.take_run(first, first + n, sh, |m| {
            *live -= 1;
            handles.unmapped(m.handle.0, used);
        });
        r.clear_mapped(first, gi - first);
        Ok(())
    }
}

impl SimDevice {
    /// cuMemMap in the common case, in few registers: a live unmapped handle of `bytes`,
    /// a span in one bitmap word of the range the last call used, no granule mapped there,
    /// and a call not to fail. Then done, `true`; otherwise nothing done, `false`
    /// ([`SimDevice::map_checked`] decides, with every check and its error).
    #[inline(always)]
    fn map_in_one_word(&mut self, va: u64, bytes: u64, handle: PhysHandle) -> bool {
        let Some(h) = self.handles.get_mut(handle.0) else {
            return false;
        };
        let Some(r) = self.reserved.get_mut(self.last_range) else {
            return false;
        };
        let off = va.wrapping_sub(r.start);
        if h.released
            || h.mapped
            || h.bytes != bytes
            || bytes == 0
            || off >= r.bytes
            || bytes > r.bytes - off
            || (va | bytes) & (self.granularity - 1) != 0
        {
            return false;
        }
        let sh = self.granule_shift;
        let (first, n) = (off >> sh, bytes >> sh);
        let Some((w, mask)) = Reserved::one_word(first, n) else {
            return false;
        };
        let Some(x) = r.bits.get_mut(w) else {
            return false;
        };
        if x.mapped & mask != 0 || self.meter.next_faults() {
            return false;
        }
        x.mapped |= mask;
        x.starts |= 1 << (first % 64);
        r.mapped_granules += n;
        self.meter
            .charge_unfailing(DriverCall::Map, bytes, self.live_mappings);
        if let Some(bytes) = std::num::NonZeroU64::new(bytes) {
            r.maps.insert(first, Mapping { bytes, handle });
        }
        self.live_mappings += 1;
        h.mapped = true;
        true
    }

    /// cuMemMap with every check (out of line).
    #[inline(never)]
    fn map_checked(&mut self, va: u64, bytes: u64, handle: PhysHandle) -> Result<(), DeviceError> {
        // The checks of `map_refused`, in one pass without their messages: the errors are
        // made out of line, by that function, which runs the checks again in order.
        let c = DriverCall::Map;
        let sh = self.granule_shift;
        let args_ok = bytes != 0 && (bytes | va) & (self.granularity - 1) == 0;
        // One look-up of the handle: the meter and the reserved ranges are other fields.
        let h = match self.handles.get_mut(handle.0) {
            Some(h) if args_ok && !h.released && h.bytes == bytes && !h.mapped => h,
            _ => return Err(self.map_refused(va, bytes, handle)),
        };
        let Some((r, off)) = reserved_holding_from(&self.reserved, &mut self.last_range, va, bytes)
            .and_then(|(ri, off)| Some((self.reserved.get_mut(ri)?, off)))
        else {
            return Err(self.map_refused(va, bytes, handle));
        };
        let (first, n) = (off >> sh, bytes >> sh);
        // Mappings never overlap: no granule of the range may be mapped already. A mapping
        // of granules in one bitmap word (the common case) reads and sets that word once.
        let word = Reserved::one_word(first, n);
        let overlaps = match word {
            Some((w, mask)) => r.bits.get(w).is_some_and(|x| x.mapped & mask != 0),
            None => r.any_mapped(first, n),
        };
        if overlaps {
            return Err(self.map_refused(va, bytes, handle));
        }
        self.meter.charge(c, bytes, self.live_mappings)?;
        if let Some(bytes) = std::num::NonZeroU64::new(bytes) {
            r.maps.insert(first, Mapping { bytes, handle });
        }
        match word {
            Some((w, mask)) => {
                if w >= r.bits.len() {
                    r.bits.resize(w + 1, GranuleBits::default());
                }
                if let Some(x) = r.bits.get_mut(w) {
                    x.mapped |= mask;
                    x.starts |= 1 << (first % 64);
                }
                r.mapped_granules += n;
            }
            None => r.set_mapped(first, n),
        }
        self.live_mappings += 1;
        h.mapped = true;
        Ok(())
    }

    /// cuMemSetAccess in the common case, in few registers: a span in one bitmap word of
    /// the range the last call used, tiled by its mappings, and a call not to fail. Then
    /// done, `true`; otherwise nothing done, `false` ([`SimDevice::set_access_checked`]
    /// decides, with every check and its error).
    #[inline(always)]
    fn set_access_in_one_word(&mut self, va: u64, bytes: u64) -> bool {
        let Some(r) = self.reserved.get_mut(self.last_range) else {
            return false;
        };
        let off = va.wrapping_sub(r.start);
        if bytes == 0
            || off >= r.bytes
            || bytes > r.bytes - off
            || (off | bytes) & (self.granularity - 1) != 0
        {
            return false;
        }
        let sh = self.granule_shift;
        let (first, n) = (off >> sh, bytes >> sh);
        let Some((w, mask)) = Reserved::one_word(first, n) else {
            return false;
        };
        if !r.tiles(first, n) || self.meter.next_faults() {
            return false;
        }
        self.meter
            .charge_unfailing(DriverCall::SetAccess, bytes, self.live_mappings);
        if let Some(x) = r.bits.get_mut(w) {
            x.access |= mask;
        }
        true
    }

    /// cuMemSetAccess with every check (out of line).
    #[inline(never)]
    fn set_access_checked(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        let c = DriverCall::SetAccess;
        self.check_granular(c, bytes)?;
        let Some((ri, first, n)) = self.span_in_one_range(va, bytes) else {
            return self.set_access_across(va, bytes);
        };
        if !self.reserved.get(ri).is_some_and(|r| r.tiles(first, n)) {
            // The walk says why (and decides, should the bitmaps disagree).
            self.check_tiled_in(c, ri, first, n)?;
        }
        self.begin(c, bytes)?;
        // The mappings tile the granules: their access bits, set in one pass.
        if let Some(r) = self.reserved.get_mut(ri) {
            r.grant(first, n);
        }
        Ok(())
    }

    /// cuMemSetAccess of a span that does not start on a granule of one reserved range (out
    /// of line: the general walk, mapping by mapping).
    #[inline(never)]
    fn set_access_across(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        let c = DriverCall::SetAccess;
        // The range must be covered by contiguous mappings starting exactly at va.
        self.check_tiled(c, va, bytes)?;
        self.begin(c, bytes)?;
        let mut at = va;
        let end = va + bytes;
        let mut hint = 0;
        while at < end {
            let Some((ri, gi)) = self.granule_of(at, hint) else {
                break;
            };
            let r = &mut self.reserved[ri];
            match r.maps.get(gi).copied() {
                Some(m) => {
                    r.grant(gi, m.bytes.get() >> self.granule_shift);
                    at += m.bytes.get();
                    hint = ri;
                }
                None => break,
            }
        }
        Ok(())
    }

    /// cuMemUnmap of a span that does not start on a granule of one reserved range (out of
    /// line: the general walk, mapping by mapping).
    #[inline(never)]
    fn unmap_across(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        let c = DriverCall::Unmap;
        // Walk the mappings from the start of the range: they must tile it.
        self.check_tiled(c, va, bytes)?;
        self.begin(c, bytes)?;
        let mut at = va;
        let end = va + bytes;
        let mut hint = 0;
        let sh = self.granule_shift;
        while at < end {
            let Some((ri, gi)) = self.granule_of(at, hint) else {
                break;
            };
            let r = &mut self.reserved[ri];
            let Some(m) = r.maps.remove(gi) else {
                break;
            };
            r.clear_mapped(gi, m.bytes.get() >> sh);
            self.live_mappings -= 1;
            hint = ri;
            at += m.bytes.get();
            self.handles.unmapped(m.handle.0, &mut self.used);
        }
        Ok(())
    }
}

impl SimDevice {
    /// Whether every byte of `[va, va+bytes)` is mapped with access granted (what a kernel
    /// touching the block needs). Used by tests and the replay's checks.
    pub fn is_accessible(&self, va: u64, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        // Inside a plain segment?
        if let Some((&s, &l)) = self.segments.range(..=va).next_back() {
            if va >= s && va + bytes <= s + l {
                return true;
            }
        }
        let mut at = va;
        let end = va.saturating_add(bytes);
        // Find the mapping containing `at`: it starts at the granule of `at` or below, no
        // lower than the start of the reserved range holding it.
        let g = self.granularity;
        while at < end {
            let Some(ri) = self.reserved_at(at) else {
                return false;
            };
            let r = &self.reserved[ri];
            let gi = (at - r.start) / g;
            if !r.any_mapped(gi, 1) {
                return false;
            }
            let mut s = gi;
            let m = loop {
                if let Some(m) = r.maps.get(s) {
                    break m;
                }
                if s == 0 {
                    return false;
                }
                s -= 1;
            };
            let ms = r.start + s * g;
            if at < ms + m.bytes.get() && r.granted(s) {
                at = ms + m.bytes.get();
            } else {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = DEFAULT_GRANULARITY;

    #[test]
    fn recorded_calls_are_followed_then_checked() {
        let mib = 1u64 << 20;
        let rec = |kind, addr, bytes, event| RecordedCall {
            kind,
            addr,
            bytes,
            event,
        };
        let base = DEFAULT_BASE + (1 << 30);
        let calls = vec![
            rec(RecordedKind::Alloc, base, 2 * mib, 0),
            rec(RecordedKind::Alloc, base + 64 * mib, 20 * mib, 3),
            rec(RecordedKind::Free, base, 2 * mib, 9),
        ];
        let mut d = SimDevice::default();
        d.follow_recorded(calls.clone(), 1);
        let skipped = d.alloc_segment(4 * mib).unwrap(); // placed as usual
        assert_ne!(skipped, base);
        assert_eq!(d.alloc_segment(2 * mib).unwrap(), base);
        assert_eq!(d.alloc_segment(20 * mib).unwrap(), base + 64 * mib);
        assert!(matches!(
            d.recorded_check(),
            Some(RecordedCheck::Diverges {
                event: 9,
                emulated: None,
                ..
            })
        ));
        d.free_segment(base).unwrap();
        assert_eq!(
            d.recorded_check(),
            Some(RecordedCheck::Matches { calls: 3 })
        );
        assert_eq!(
            d.recorded_check().unwrap().to_string(),
            "matches the recorded cudaMalloc sequence (3 calls)"
        );
        // The freed range is address space again.
        assert_eq!(d.alloc_segment(2 * mib).unwrap() % (2 * mib), 0);
        // A size that differs: the device stops following and says where.
        let mut d = SimDevice::default();
        d.follow_recorded(calls, 0);
        let a = d.alloc_segment(4 * mib).unwrap();
        assert_ne!(a, base);
        let check = d.recorded_check().unwrap();
        assert_eq!(
            check.to_string(),
            format!("diverges at event 0: recorded cudaMalloc(2097152) at {base:#x}, emulated cudaMalloc(4194304)")
        );
        assert_ne!(d.alloc_segment(2 * mib).unwrap(), base);
        assert_eq!(d.recorded_check(), Some(check));
    }

    #[test]
    fn segments_count_against_capacity_and_are_rounded() {
        let mut d = SimDevice::new(10 * G);
        let a = d.alloc_segment(1).unwrap();
        assert_eq!(d.used_bytes(), G);
        let err = d.alloc_segment(10 * G).unwrap_err();
        assert!(matches!(err, DeviceError::OutOfMemory { free_bytes, .. } if free_bytes == 9 * G));
        d.free_segment(a).unwrap();
        assert_eq!(d.used_bytes(), 0);
        assert!(d.free_segment(a).is_err());
        assert_eq!(
            d.counters().get(DriverCall::Alloc),
            2,
            "a refused cuMemAlloc is still a call"
        );
        assert_eq!(d.counters().get(DriverCall::Free), 1);
        assert!(d.counters().seconds > 80e-6);
    }

    /// A request above the whole device is charged what the H200's driver took to refuse
    /// it (`h200_refused_call_seconds`), not the cost of a granted call of the device's size
    /// (≈ 45 ms for cuMemAlloc).
    #[test]
    fn refusals_above_the_device_cost_what_the_driver_took() {
        let cap = 16 * G;
        let seconds = |f: &dyn Fn(&mut SimDevice)| {
            let mut d = SimDevice::new(cap);
            f(&mut d);
            (d.counters().seconds_by_call, d.counters().calls)
        };
        let (s, n) = seconds(&|d| assert!(d.alloc_segment(1 << 63).is_err()));
        assert_eq!(n[DriverCall::Alloc as usize], 1);
        assert!((s[DriverCall::Alloc as usize] - 3.7e-6).abs() < 1e-12);
        let (s, _) = seconds(&|d| assert!(d.alloc_segment(cap + G).is_err()));
        assert!((s[DriverCall::Alloc as usize] - 5.5e-3).abs() < 1e-12);
        let (s, _) = seconds(&|d| assert!(d.create_physical(1 << 40).is_err()));
        let (alpha, _) = mapping_cost_factors(DriverCall::Create);
        assert!((s[DriverCall::Create as usize] - alpha * 3.2e-3).abs() < 1e-12);
        // At the device's size the call is granted and priced by the model as before.
        let (s, _) = seconds(&|d| assert!(d.alloc_segment(cap).is_ok()));
        assert_eq!(
            s[DriverCall::Alloc as usize],
            h200_isolated_call_seconds(DriverCall::Alloc, cap)
        );
        // Address space above the device is not a refusal: priced as the device's size.
        let (s, _) = seconds(&|d| assert!(d.reserve_va(4 * cap).is_ok()));
        assert_eq!(
            s[DriverCall::Reserve as usize],
            h200_isolated_call_seconds(DriverCall::Reserve, cap)
        );
    }

    #[test]
    fn vmm_rules_are_enforced() {
        let mut d = SimDevice::new(8 * G);
        let va = d.reserve_va(4 * G).unwrap();
        let h = d.create_physical(G).unwrap();
        assert!(d.map(va + 1, G, h).is_err(), "unaligned va");
        assert!(d.map(va + 4 * G, G, h).is_err(), "outside the reservation");
        d.map(va, G, h).unwrap();
        assert!(d.map(va, G, h).is_err(), "double map");
        assert!(!d.is_accessible(va, 16));
        assert!(d.set_access(va, 2 * G).is_err(), "second page unmapped");
        d.set_access(va, G).unwrap();
        assert!(d.is_accessible(va, G));
        assert!(d.free_va(va, 4 * G).is_err(), "still mapped");
        d.release_physical(h).unwrap();
        assert_eq!(d.used_bytes(), G, "memory lives until unmapped");
        d.unmap(va, G).unwrap();
        assert_eq!(d.used_bytes(), 0);
        d.free_va(va, 4 * G).unwrap();
        assert_eq!(d.live_objects(), (0, 0, 0, 0));
    }

    #[test]
    fn overlapping_maps_are_refused_across_bitmap_words() {
        let mut d = SimDevice::new(1 << 40);
        let va = d.reserve_va(200 * G).unwrap();
        // A 70-granule mapping from granule 60: it crosses the first word of the bitmap.
        let h = d.create_physical(70 * G).unwrap();
        d.map(va + 60 * G, 70 * G, h).unwrap();
        for (at, n) in [(59, 2), (129, 1), (100, 1), (0, 61), (129, 40)] {
            let h2 = d.create_physical(n * G).unwrap();
            assert!(d.map(va + at * G, n * G, h2).is_err(), "{at}+{n} overlaps");
            d.release_physical(h2).unwrap();
        }
        let h3 = d.create_physical(60 * G).unwrap();
        d.map(va, 60 * G, h3).unwrap(); // right below: fits
        let h4 = d.create_physical(G).unwrap();
        d.map(va + 130 * G, G, h4).unwrap(); // right above: fits
                                             // Access over the three, tiled; not past them.
        assert!(d.set_access(va, 132 * G).is_err());
        d.set_access(va, 131 * G).unwrap();
        assert!(d.is_accessible(va + 5, 131 * G - 10));
        assert!(!d.is_accessible(va + 130 * G, G + 1));
        assert!(
            d.unmap(va + 60 * G, 10 * G).is_err(),
            "ends inside a mapping"
        );
        assert!(d.free_va(va, 200 * G).is_err(), "still mapped");
        d.unmap(va, 131 * G).unwrap();
        assert!(!d.is_accessible(va, 1));
        // Unmapped granules can be mapped again.
        d.map(va + 64 * G, 70 * G, h).unwrap();
        d.unmap(va + 64 * G, 70 * G).unwrap();
        for h in [h, h3, h4] {
            d.release_physical(h).unwrap();
        }
        d.free_va(va, 200 * G).unwrap();
        assert_eq!(d.live_objects(), (0, 0, 0, 0));
    }

    #[test]
    fn handle_ids_stay_sequential_when_the_slab_is_trimmed() {
        let mut d = SimDevice::new(1 << 40);
        let hs: Vec<PhysHandle> = (0..300).map(|_| d.create_physical(G).unwrap()).collect();
        assert_eq!(hs.first(), Some(&PhysHandle(1)));
        assert_eq!(hs.last(), Some(&PhysHandle(300)));
        let va = d.reserve_va(4 * G).unwrap();
        // Handle 250 stays mapped while released: it lives until its unmap.
        d.map(va, G, hs[249]).unwrap();
        // Release the first 200 out of order: the front is trimmed once it is all gone.
        for i in (0..200).rev() {
            d.release_physical(hs[i]).unwrap();
        }
        assert!(d.handles.first_id > 1, "the slab was trimmed");
        d.release_physical(hs[249]).unwrap();
        assert_eq!(d.used_bytes(), 100 * G);
        assert_eq!(d.live_objects(), (0, 1, 1, 99));
        assert_eq!(d.create_physical(G).unwrap(), PhysHandle(301));
        for bad in [0, 1, 150, 200, 250, 302, u64::MAX] {
            let e = d.release_physical(PhysHandle(bad)).unwrap_err().to_string();
            assert!(e.contains(&format!("handle {bad} is not live")), "{e}");
            let e = d.map(va + G, G, PhysHandle(bad)).unwrap_err().to_string();
            assert!(e.contains(&format!("handle {bad} is not live")), "{e}");
        }
        d.map(va + G, G, hs[200]).unwrap();
        d.unmap(va, 2 * G).unwrap();
        assert_eq!(d.used_bytes(), 100 * G, "handle 250 gone at its unmap");
        for h in hs[200..300].iter().filter(|h| h.0 != 250) {
            d.release_physical(*h).unwrap();
        }
        d.release_physical(PhysHandle(301)).unwrap();
        d.free_va(va, 4 * G).unwrap();
        assert_eq!(d.live_objects(), (0, 0, 0, 0));
        assert_eq!(d.used_bytes(), 0);
        assert_eq!(d.create_physical(G).unwrap(), PhysHandle(302));
    }

    #[test]
    fn the_bitmap_tiling_check_agrees_with_the_walk() {
        // Random mappings of 1–70 granules in a 300-granule range, then every span from
        // random starts: the bitmap check and the walk must agree on each.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..20 {
            let mut d = SimDevice::new(1 << 40);
            let va = d.reserve_va(300 * G).unwrap();
            for _ in 0..40 {
                let (at, n) = (rnd(300), 1 + rnd(70));
                let h = d.create_physical(n * G).unwrap();
                if d.map(va + at * G, n * G, h).is_err() {
                    d.release_physical(h).unwrap();
                }
            }
            let r = &d.reserved[0];
            let mut agreed = (0, 0);
            for first in 0..300 {
                for n in 1..=(300 - first).min(140) {
                    let walk = d.check_tiled_in(DriverCall::Unmap, 0, first, n).is_ok();
                    assert_eq!(r.tiles(first, n), walk, "granules {first}+{n}");
                    if walk {
                        agreed.0 += 1;
                    } else {
                        agreed.1 += 1;
                    }
                }
            }
            assert!(agreed.0 > 0 && agreed.1 > 0, "{agreed:?}");
        }
    }

    #[test]
    fn bitmap_words_of_a_span() {
        let words = |first, n| {
            let mut v = Vec::new();
            let all = Reserved::words(first, n, |w, m| {
                v.push((w, m));
                true
            });
            assert!(all);
            v
        };
        assert_eq!(words(0, 64), [(0, u64::MAX)]);
        assert_eq!(words(64, 1), [(1, 1)]);
        assert_eq!(words(70, 3), [(1, 0b111 << 6)]);
        assert_eq!(words(127, 1), [(1, 1 << 63)]);
        assert_eq!(words(63, 2), [(0, 1 << 63), (1, 1)]);
        assert_eq!(words(5, 0), []);
        assert_eq!(words(60, 70), [(0, 0xf << 60), (1, u64::MAX), (2, 0b11)]);
        assert_eq!(words(64, 128), [(1, u64::MAX), (2, u64::MAX)]);
        // Stops at the first word refused.
        let mut seen = 0;
        assert!(!Reserved::words(0, 200, |_, _| {
            seen += 1;
            seen < 2
        }));
        assert_eq!(seen, 2);
    }

    #[test]
    fn injected_faults_on_map_access_and_unmap_change_nothing() {
        let mut d = SimDevice::new(8 * G);
        let va = d.reserve_va(4 * G).unwrap();
        let h = d.create_physical(2 * G).unwrap();
        let before = (d.counters(), d.live_objects(), d.used_bytes());
        d.inject_fault_at(Some(d.calls_made()));
        let e = d.map(va, 2 * G, h).unwrap_err();
        assert!(e.to_string().contains("cuMemMap"), "{e}");
        assert_eq!((d.counters(), d.live_objects(), d.used_bytes()), before);
        d.map(va, 2 * G, h).unwrap();
        d.inject_fault_at(Some(d.calls_made()));
        assert!(d.set_access(va, 2 * G).is_err());
        assert!(!d.is_accessible(va, 1), "the failed call granted nothing");
        d.set_access(va, 2 * G).unwrap();
        assert!(d.is_accessible(va, 2 * G));
        d.inject_fault_at(Some(d.calls_made()));
        assert!(d.unmap(va, 2 * G).is_err());
        assert!(
            d.is_accessible(va, 2 * G),
            "the failed call unmapped nothing"
        );
        assert_eq!(d.live_objects(), (0, 1, 1, 1));
        d.unmap(va, 2 * G).unwrap();
        d.release_physical(h).unwrap();
        d.free_va(va, 4 * G).unwrap();
        assert_eq!(d.live_objects(), (0, 0, 0, 0));
        assert_eq!(
            d.counters().total(),
            7,
            "the three failed calls are not counted"
        );
        assert_eq!(d.calls_made(), 10, "but were made");
    }

    #[test]
    fn injected_fault_fails_exactly_that_call() {
        let mut d = SimDevice::new(8 * G);
        d.inject_fault_at(Some(1));
        d.reserve_va(G).unwrap();
        let e = d.create_physical(G).unwrap_err();
        assert!(matches!(
            e,
            DeviceError::Driver {
                call: "cuMemCreate",
                ..
            }
        ));
        assert_eq!(d.used_bytes(), 0);
        d.create_physical(G).unwrap();
    }

    #[test]
    fn time_model_matches_anchor_points() {
        let t = h200_call_seconds(DriverCall::SetAccess, 2 << 20, 0);
        assert!((t - 24e-6 * 0.80).abs() < 1e-9, "{t}");
        // With 1,000 mappings live, set access costs 1.421 × its isolated figure more.
        let t = h200_call_seconds(DriverCall::SetAccess, 2 << 20, 1000);
        assert!((t - 24e-6 * 2.221).abs() < 1e-9, "{t}");
        let t = h200_call_seconds(DriverCall::Release, 1 << 30, 0);
        assert!((t - 490e-6 * 0.71).abs() < 1e-9);
        let t = h200_call_seconds(DriverCall::Release, 16 << 30, 0);
        assert!((t - 10_577e-6 * 0.71).abs() < 1e-9);
        // Address space alone: flat from 1 GiB (6 µs) to 1 TiB.
        let t = h200_call_seconds(DriverCall::Reserve, 64 << 30, 0);
        assert!((t - 6e-6).abs() < 1e-12, "{t}");
        let t = h200_call_seconds(DriverCall::Alloc, 1 << 30, 5000);
        assert!(
            (t - 184e-6).abs() < 1e-9,
            "cuMemAlloc does not depend on mappings"
        );
        let mid = h200_call_seconds(DriverCall::Alloc, 128 << 20, 0);
        assert!(mid > 45e-6 && mid < 81e-6);
    }

    #[test]
    fn a_call_costs_more_with_more_mappings_live() {
        let mut d = SimDevice::new(1 << 30);
        let va = d.reserve_va(128 << 20).unwrap();
        let map_cost = |d: &mut SimDevice, i: u64| {
            let h = d.create_physical(2 << 20).unwrap();
            let before = d.counters().seconds_of(DriverCall::Map);
            d.map(va + i * (2 << 20), 2 << 20, h).unwrap();
            d.counters().seconds_of(DriverCall::Map) - before
        };
        let first = map_cost(&mut d, 0);
        for i in 1..32 {
            map_cost(&mut d, i);
        }
        let at_32 = map_cost(&mut d, 32);
        assert!((first - h200_call_seconds(DriverCall::Map, 2 << 20, 0)).abs() < 1e-12);
        assert!((at_32 - h200_call_seconds(DriverCall::Map, 2 << 20, 32)).abs() < 1e-12);
        assert!(at_32 > first, "{at_32} vs {first}");
    }
}
