//! A simulated GPU: capacity, VMM granularity, an address space, driver-call counts and a
//! driver-time model taken from calls measured on an H200 (CUDA 13.0, driver 580).
//!
//! It enforces the same rules the CUDA driver does (granularity multiples, mapping only inside
//! reserved ranges, no double map, access only on mapped ranges), so an allocator that runs
//! clean here makes legal calls on a real GPU. Faults can be injected at any call to test
//! that allocators unwind exactly what they did.
use std::collections::BTreeMap;

use crate::device::{Device, DeviceError, DriverCall, DriverCounters, PhysHandle};

mod cost;
mod granules;
mod handles;
mod recorded;

pub use cost::{
    h200_call_points, h200_call_seconds, h200_isolated_call_seconds, h200_refused_call_seconds,
    mapping_cost_factors, CostBasis,
};
pub use recorded::{RecordedCall, RecordedCheck, RecordedKind};

use cost::{Meter, CALL_KINDS};
use granules::{
    reserved_at, reserved_holding, reserved_holding_from, GranuleBits, Mapping, Reserved,
};
use handles::{Handle, Handles};
use recorded::Script;

/// 2 MiB, the VMM granularity of current NVIDIA data-centre GPUs.
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;
/// 150,109,880,320 bytes (139.8 GiB): the total that cuMemGetInfo reports on the lent H200
/// (driver 580, CUDA 13.0), i.e. what a pool on that GPU can actually take. The marketed
/// "141 GB" (131.3 GiB) is less than this.
pub const DEFAULT_CAPACITY: u64 = 150_109_880_320;
/// Where the simulated address space starts (looks like a CUDA device address).
pub const DEFAULT_BASE: u64 = 0x7f00_0000_0000;

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

    /// Per call kind (indexed like [`DriverCall::ALL`]), the sums the cost model is linear
    /// in: the modelled seconds of kind `k` are alpha × `isolated_seconds` + beta ×
    /// `isolated_seconds_x_mappings` with `(alpha, beta)` = [`mapping_cost_factors`]. What a
    /// refit of the model against real replays needs (`scripts/fit/fit-cost-model.py`).
    pub fn cost_basis(&self) -> [CostBasis; CALL_KINDS] {
        self.meter.basis()
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
mod tests;
