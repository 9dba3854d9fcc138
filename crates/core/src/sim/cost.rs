//! The driver-time model: isolated call costs measured on an H200 (CUDA 13.0, driver 580),
//! interpolated by size, scaled by the mappings live in the context; and the [`Meter`] that
//! charges every call of a [`super::SimDevice`].

use crate::device::{DeviceError, DriverCall, DriverCounters};

pub(super) const MIB: f64 = (1u64 << 20) as f64;

/// Kinds of [`DriverCall`] (the length of the per-kind cost memo).
pub(super) const CALL_KINDS: usize = DriverCall::ALL.len();
/// Sizes remembered per call kind by the cost memo (a power of two).
pub(super) const COST_MEMO_SLOTS: usize = 64;

/// Driver-call time in seconds for a call of `bytes`, interpolated log-linearly between
/// measured points `(bytes, microseconds)`; clamped outside.
pub(super) fn interp(points: &[(f64, f64)], bytes: u64) -> f64 {
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
/// and beta ≥ 0) to the real driver seconds of replays of the shipped traces on the H200
/// under `paged`, which holds hundreds to thousands of mappings, `paged-lazy`, which holds
/// tens, and `torch`, which makes cuMemAlloc/cuMemFree only, against the sums Σ isolated and
/// Σ isolated × live mappings of the same calls on the simulated device (same counts per
/// kind). The data and the check are in
/// `crates/gpumem/tests/data/h200_replay_driver_time_by_mappings.json` and the `cost_model`
/// test; how close the model comes, on these replays and on later ones it was not fitted to
/// (`tests/data/h200_lazy_replays.json`): BENCHMARKS.md, "The driver cost model". Only
/// `paged` unmaps or releases in the fitted replays, always with hundreds of mappings live,
/// so for cuMemUnmap and cuMemRelease alpha and beta cannot be told apart and the fit put the
/// whole cost in one of them. A refit that adds the later replays (the page placement unmaps
/// and releases with tens of mappings) predicts them all worse, so the factors stay
/// (`docs/decisions.md`, "Measured points up to 16 GiB, address space flat, factors by
/// mappings live").
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
/// `scripts/bench/baselines` on the same GPU (BENCHMARKS.md, "The driver cost model"):
/// cuMemAlloc/cuMemFree and the VMM cycle at 4 and 16 GiB, and cuMemAddressReserve /
/// cuMemAddressFree of address space alone, which cost the same from 1 GiB to 1 TiB (hence
/// their last point at 1 TiB: flat above 1 GiB, where a linear extrapolation priced the
/// ≥ 64 GiB range of an expandable segment far above what the driver takes).
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
/// exceed the whole device, which the driver refuses; `None` for the other calls. Below
/// 2^48 bytes (256 TiB) the driver tries before it refuses, which costs milliseconds (though
/// far less than a granted call of the device's size): 5.5 ms (cuMemAlloc) and 3.2 ms
/// (cuMemCreate); from 2^48 bytes up, far beyond any device, it refuses on an argument check:
/// 3.7 µs (cuMemAlloc) and 13 µs (cuMemCreate). cuMemCreate is charged its dearer figure from
/// just above the device up, though there the driver refuses it sooner, as an invalid value.
/// Measured by `scripts/probes/refused-alloc-probe.py` (BENCHMARKS.md, "Requests larger than
/// the device").
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

/// One call kind's sums behind the modelled driver seconds ([`SimDevice::cost_basis`](super::SimDevice::cost_basis)).
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
pub(super) struct Meter {
    pub(super) counters: DriverCounters,
    /// Per call kind, `(bytes, isolated cost in seconds)` of the last sizes modelled, in
    /// [`COST_MEMO_SLOTS`] slots picked by the size in granules (a cache: the log-linear
    /// interpolation is the dearest part of a call, and a pool's calls come in a few sizes).
    /// An empty slot holds the cost of a call of 0 bytes, so it needs no flag of its own.
    pub(super) cost_memo: [[(u64, f64); COST_MEMO_SLOTS]; CALL_KINDS],
    /// Per call kind, the sum of the isolated costs charged, seconds.
    pub(super) isolated_seconds: [f64; CALL_KINDS],
    /// Per call kind, the sum of isolated cost × mappings live at the call, seconds.
    pub(super) isolated_seconds_x_mappings: [f64; CALL_KINDS],
    pub(super) calls_made: u64,
    /// Index of the call to fail; `u64::MAX` for none (a count no run reaches).
    pub(super) fault_at: u64,
    /// The device's capacity (at least 1 byte): a cuMemAlloc or cuMemCreate above it is
    /// charged as a refusal, any other call as one of this size.
    pub(super) max_bytes: u64,
    /// log2 of the granularity (the memo slot of a size is its granules, modulo).
    pub(super) granule_shift: u32,
}

impl Meter {
    /// The meter of a device of `capacity` bytes and granules of `1 << granule_shift` bytes.
    pub(super) fn new(capacity: u64, granule_shift: u32) -> Self {
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
    pub(super) fn charge(
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
    pub(super) fn next_faults(&self) -> bool {
        self.calls_made == self.fault_at
    }

    /// [`Meter::charge`] of a call that is not the one to fail ([`Meter::next_faults`]).
    #[inline(always)]
    pub(super) fn charge_unfailing(&mut self, call: DriverCall, bytes: u64, live_mappings: u64) {
        self.calls_made += 1;
        self.record(call, bytes, live_mappings);
    }

    /// The cost part of [`Meter::charge`]: the call's modelled seconds and the sums.
    #[inline(always)]
    pub(super) fn record(&mut self, call: DriverCall, bytes: u64, live_mappings: u64) {
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
    pub(super) fn above_device(&self, call: DriverCall, bytes: u64) -> f64 {
        h200_refused_call_seconds(call, bytes)
            .unwrap_or_else(|| h200_isolated_call_seconds(call, self.max_bytes))
    }

    /// The isolated cost of a call of `bytes` not in memo slot `slot`: modelled, and kept
    /// in that slot (out of line: the charge of a memoized size stays a few instructions).
    #[cold]
    #[inline(never)]
    pub(super) fn memo_miss(&mut self, call: DriverCall, bytes: u64, slot: usize) -> f64 {
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

    /// Per call kind, the sums behind the cost model ([`SimDevice::cost_basis`](super::SimDevice::cost_basis)).
    pub(super) fn basis(&self) -> [CostBasis; CALL_KINDS] {
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
    pub(super) fn injected_fault(call: DriverCall) -> DeviceError {
        DeviceError::Driver {
            call: call.cuda_name(),
            name: "CUDA_ERROR_UNKNOWN (injected fault)".into(),
        }
    }
}
