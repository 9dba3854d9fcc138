//! [`DriverCall`]: the kinds of driver call a device makes, and [`DriverCounters`], the
//! calls and seconds a device counts per kind.

use serde::Serialize;

/// The kinds of driver call counted by a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverCall {
    /// cuMemAlloc (cudaMalloc).
    Alloc,
    /// cuMemFree (cudaFree).
    Free,
    /// cuMemAddressReserve.
    Reserve,
    /// cuMemCreate.
    Create,
    /// cuMemMap.
    Map,
    /// cuMemSetAccess.
    SetAccess,
    /// cuMemUnmap.
    Unmap,
    /// cuMemRelease.
    Release,
    /// cuMemAddressFree.
    AddressFree,
}

impl DriverCall {
    /// Every kind, in a fixed order.
    pub const ALL: [DriverCall; 9] = [
        DriverCall::Alloc,
        DriverCall::Free,
        DriverCall::Reserve,
        DriverCall::Create,
        DriverCall::Map,
        DriverCall::SetAccess,
        DriverCall::Unmap,
        DriverCall::Release,
        DriverCall::AddressFree,
    ];

    /// The CUDA driver function this kind stands for.
    pub fn cuda_name(self) -> &'static str {
        match self {
            DriverCall::Alloc => "cuMemAlloc",
            DriverCall::Free => "cuMemFree",
            DriverCall::Reserve => "cuMemAddressReserve",
            DriverCall::Create => "cuMemCreate",
            DriverCall::Map => "cuMemMap",
            DriverCall::SetAccess => "cuMemSetAccess",
            DriverCall::Unmap => "cuMemUnmap",
            DriverCall::Release => "cuMemRelease",
            DriverCall::AddressFree => "cuMemAddressFree",
        }
    }

    /// Short lower-case name used in reports (`alloc`, `set_access`, ...).
    pub fn short_name(self) -> &'static str {
        match self {
            DriverCall::Alloc => "alloc",
            DriverCall::Free => "free",
            DriverCall::Reserve => "reserve",
            DriverCall::Create => "create",
            DriverCall::Map => "map",
            DriverCall::SetAccess => "set_access",
            DriverCall::Unmap => "unmap",
            DriverCall::Release => "release",
            DriverCall::AddressFree => "address_free",
        }
    }
}

/// Counts of driver calls by kind, and the modelled or measured time they took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DriverCounters {
    /// Calls per kind, indexed like [`DriverCall::ALL`].
    pub calls: [u64; 9],
    /// Seconds spent in driver calls (modelled on the simulated device, measured on CUDA).
    pub seconds: f64,
    /// The same seconds per kind, indexed like [`DriverCall::ALL`] (what a calibration of
    /// the cost model compares against).
    pub seconds_by_call: [f64; 9],
}

impl DriverCounters {
    /// Calls of one kind.
    pub fn get(&self, call: DriverCall) -> u64 {
        self.calls[call as usize]
    }
    /// Adds one call of `call` that took `seconds`.
    pub fn record(&mut self, call: DriverCall, seconds: f64) {
        self.calls[call as usize] += 1;
        self.seconds += seconds;
        self.seconds_by_call[call as usize] += seconds;
    }
    /// Seconds spent in calls of one kind.
    pub fn seconds_of(&self, call: DriverCall) -> f64 {
        self.seconds_by_call[call as usize]
    }
    /// The calls and seconds made since `earlier` (a snapshot of the same counters).
    pub fn since(&self, earlier: &DriverCounters) -> DriverCounters {
        let mut d = DriverCounters {
            seconds: self.seconds - earlier.seconds,
            ..DriverCounters::default()
        };
        for i in 0..self.calls.len() {
            d.calls[i] = self.calls[i].saturating_sub(earlier.calls[i]);
            d.seconds_by_call[i] = self.seconds_by_call[i] - earlier.seconds_by_call[i];
        }
        d
    }
    /// All calls together.
    pub fn total(&self) -> u64 {
        self.calls.iter().sum()
    }
}
