//! The CUDA backend: the driver API through cudarc, loaded at run time.
//!
//! Layers, as in cudarc:
//! - `driver.rs` (crate-private): the one `result` layer, thin wrappers over
//!   `cudarc::driver::sys`, one function per CUDA call, each returning
//!   `Result<_, DeviceError>` with the call's name and the CUDA error name; nothing else in
//!   gpumem calls the driver;
//! - one RAII family ([`CudaContext`], [`Stream`], [`Event`], [`DeviceBuffer`], [`CopyKernel`]),
//!   each holding its context, used by the device, the pool's events and pinned memory;
//! - safe types that leave the module: [`CudaDevice`] (implements [`gpumem_core::Device`]:
//!   cuMemAlloc segments and VMM arenas), [`CudaEvents`] (stream-ordered reuse), [`Managed`]
//!   (cuMemAllocManaged with a free-memory guard), and peer access per pool block.
//!
//! The device-independent pieces that run on CUDA and on [`gpumem_core::sim::SimDevice`]
//! alike live outside: the pool in [`crate::pool`], the page-table view in [`crate::vmm`], the
//! `Capped` and `Tracked` adaptors in [`gpumem_core::adaptor`].
//!
//! Nothing here links against `libcuda`: the library is opened on first use. When it is missing,
//! [`init`] (called by every entry point) returns [`CudaError::NoDriver`], which keeps every file searched
//! (cudarc itself would panic; we check with its fallible probe first and catch any panic of a
//! missing symbol).
use std::sync::OnceLock;

use gpumem_core::DeviceError;

pub mod bench;
mod context;
mod device;
pub(crate) mod driver;
mod events;
mod managed;
pub mod p2p;
mod peer;
pub mod peer_bench;

pub use context::{CopyKernel, CudaContext, DeviceBuffer, Event, Stream, COPY16_PTX};
pub use device::{
    CudaDevice, DeviceInfo, MemoryType, PointerInfo, FULL_CHECK_BYTES, SAMPLE_WINDOWS,
    SAMPLE_WINDOW_BYTES,
};
pub use events::CudaEvents;
pub use managed::{
    managed_guard, managed_margin, Advice, Managed, ManagedBuffer, MANAGED_MARGIN_BYTES,
};
pub use p2p::{
    enable_peer_access, link_bandwidth, p2p_attributes, peer_copy, verify_peer_copy, LinkEstimate,
    P2pAttributes, PeerCheck, PeerMethod,
};

/// Errors of the CUDA backend outside an allocator call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// The driver library (`libcuda.so`) could not be opened.
    /// The search list is kept for `-v`; the message names only the library a Linux
    /// driver installs.
    #[error("no NVIDIA driver (libcuda.so.1) found; use the simulated device: --device sim")]
    NoDriver {
        /// Every library file name tried, in order (empty when `GPUMEM_NO_CUDA` turned the
        /// probe off).
        searched: Vec<String>,
    },
    /// The driver is there but reports no device with this ordinal.
    #[error("no CUDA device {ordinal}: {count} device(s) visible")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices the driver reports.
        count: usize,
    },
    /// A driver call failed (names the call and the CUDA error).
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The driver library lacks a function gpumem needs (driver too old), reported by cudarc
    /// as a panic that was caught.
    #[error("CUDA driver unusable: {0}")]
    Unusable(String),
    /// A managed-memory request was refused by the free-memory guard.
    #[error("managed allocation of {requested_bytes} B refused: {free_bytes} B free on the device, keeping a margin of {margin_bytes} B (over-asking can hang a shared GPU)")]
    ManagedRefused {
        /// Bytes asked for.
        requested_bytes: u64,
        /// Free device memory reported by cuMemGetInfo, in bytes.
        free_bytes: u64,
        /// Margin kept free, in bytes.
        margin_bytes: u64,
    },
}

/// The library names cudarc searches for the driver, in order (`libcuda.so`, `libcuda.so.1`,
/// ...).
pub fn searched_library_names() -> Vec<String> {
    let mut v = Vec::new();
    for lib in ["cuda", "nvcuda"] {
        for c in cudarc::get_lib_name_candidates(lib) {
            if !v.contains(&c) {
                v.push(c);
            }
        }
    }
    v
}

/// Runs `f`, turning a panic inside cudarc (a missing library or symbol) into
/// [`CudaError::Unusable`].
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_else(|| "panic in the CUDA loader".to_string());
            Err(CudaError::Unusable(msg))
        }
    }
}

/// The driver entry points gpumem calls outside a [`guarded`] section (pinned memory and
/// copies): checked at [`init`] so that an old driver is a clear error, not a panic in cudarc.
const REQUIRED_SYMBOLS: [&str; 35] = [
    "cuInit",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceGetPCIBusId",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuGetErrorName",
    "cuCtxEnablePeerAccess",
    "cuDeviceGetP2PAttribute",
    "cuMemcpyPeerAsync",
];

/// Whether a driver library can be opened, without panicking (cudarc's `is_culib_present`).
/// The one presence check of gpumem: `GPUMEM_NO_CUDA` (any value) answers `false`, to test
/// the no-driver paths on a machine that has one.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // The probe can be forced off, to test the no-driver path on a machine that has one.
        if std::env::var_os("GPUMEM_NO_CUDA").is_some() {
            return false;
        }
        driver::library_present()
    })
}

/// Loads the driver, checks that it exports every function gpumem calls, and runs cuInit,
/// once; every entry point of the CUDA backend and of pinned memory calls it first.
///
/// # Errors
/// [`CudaError::NoDriver`] when no library is found (or `GPUMEM_NO_CUDA` is set),
/// [`CudaError::Unusable`] when it lacks a function, [`CudaError::Device`] if cuInit fails.
pub fn init() -> Result<(), CudaError> {
    static INIT: OnceLock<Result<(), CudaError>> = OnceLock::new();
    INIT.get_or_init(|| {
        if !driver_present() {
            let searched = if std::env::var_os("GPUMEM_NO_CUDA").is_some() {
                Vec::new()
            } else {
                searched_library_names()
            };
            return Err(CudaError::NoDriver { searched });
        }
        // cudarc panics when it calls a symbol the driver lacks: look for every one called
        // outside a guarded section first, and name the missing ones.
        let missing: Vec<&str> = REQUIRED_SYMBOLS
            .iter()
            .copied()
            .filter(|name| !driver::has_symbol(name))
            .collect();
        if !missing.is_empty() {
            return Err(CudaError::Unusable(format!(
                "the CUDA driver library lacks {} (driver too old?)",
                missing.join(", ")
            )));
        }
        guarded(|| driver::init().map_err(CudaError::from))
    })
    .clone()
}

/// Number of CUDA devices visible (cuDeviceGetCount).
///
/// # Errors
/// [`CudaError::NoDriver`] without a driver library; [`CudaError::Device`] if a call fails.
pub fn device_count() -> Result<usize, CudaError> {
    init()?;
    guarded(|| driver::device_count().map_err(CudaError::from))
}

/// Opens device `ordinal`: retains its primary context and queries granularity, VMM support,
/// pitch alignment and memory size.
///
/// # Errors
/// [`CudaError::NoDriver`], [`CudaError::NoDevice`] for an ordinal past the count, or a failed
/// driver call.
pub fn open(ordinal: usize) -> Result<CudaDevice, CudaError> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(CudaError::NoDevice { ordinal, count });
    }
    guarded(|| CudaDevice::open_checked(ordinal).map_err(CudaError::from))
}

/// Opens device `ordinal` limited to `capacity_bytes` (or the device's own memory if
/// smaller), so that a replay runs out of memory where the traced device did.
///
/// # Errors
/// As [`open`].
pub fn open_capped(
    ordinal: usize,
    capacity_bytes: u64,
) -> Result<gpumem_core::adaptor::Capped<CudaDevice>, CudaError> {
    Ok(gpumem_core::adaptor::Capped::new(
        open(ordinal)?,
        capacity_bytes,
    ))
}

/// Information on every visible device (name, memory, granularity, VMM support), without
/// keeping them open.
///
/// # Errors
/// As [`open`].
pub fn devices() -> Result<Vec<DeviceInfo>, CudaError> {
    let n = device_count()?;
    (0..n).map(|i| open(i).map(|d| d.info())).collect()
}

/// Peer-access matrix: `m[i][j]` is whether device `i` can access memory of device `j`
/// (cuDeviceCanAccessPeer; the diagonal is `true`).
///
/// # Errors
/// As [`device_count`].
pub fn peer_matrix() -> Result<Vec<Vec<bool>>, CudaError> {
    let n = device_count()?;
    guarded(|| {
        let mut m = vec![vec![false; n]; n];
        for (i, row) in m.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                *cell = i == j || driver::can_access_peer(i, j)?;
            }
        }
        Ok(m)
    })
}

/// Which device a command works on: `sim`, `cuda` (= `cuda:0`), `cuda:N` or `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSel {
    /// The simulated device.
    Sim,
    /// CUDA device N.
    Cuda(usize),
    /// Every visible CUDA device.
    All,
}

impl std::str::FromStr for DeviceSel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "sim" => Ok(DeviceSel::Sim),
            "cuda" => Ok(DeviceSel::Cuda(0)),
            "all" => Ok(DeviceSel::All),
            t => match t.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DeviceSel::Cuda(n)),
                _ => Err(format!(
                    "`{s}`: expected a device: sim, cuda, cuda:N or all"
                )),
            },
        }
    }
}

impl DeviceSel {
    /// The CUDA ordinals this selection names (`Sim` names none).
    ///
    /// # Errors
    /// As [`device_count`] (only `All` asks the driver).
    pub fn ordinals(self) -> Result<Vec<usize>, CudaError> {
        match self {
            DeviceSel::Sim => Ok(Vec::new()),
            DeviceSel::Cuda(n) => Ok(vec![n]),
            DeviceSel::All => Ok((0..device_count()?).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_selection_parses() {
        assert_eq!("sim".parse::<DeviceSel>(), Ok(DeviceSel::Sim));
        assert_eq!("cuda".parse::<DeviceSel>(), Ok(DeviceSel::Cuda(0)));
        assert_eq!("cuda:3".parse::<DeviceSel>(), Ok(DeviceSel::Cuda(3)));
        assert_eq!("all".parse::<DeviceSel>(), Ok(DeviceSel::All));
        assert!("cuda:x".parse::<DeviceSel>().is_err());
        assert!("gpu".parse::<DeviceSel>().is_err());
        assert_eq!(DeviceSel::Sim.ordinals(), Ok(vec![]));
        assert_eq!(DeviceSel::Cuda(2).ordinals(), Ok(vec![2]));
    }

    #[test]
    fn searched_names_include_libcuda() {
        let names = searched_library_names();
        assert!(names.iter().any(|n| n == "libcuda.so"), "{names:?}");
        assert!(names.iter().any(|n| n == "libcuda.so.1"), "{names:?}");
    }

    #[test]
    fn no_driver_message_names_the_search_and_the_way_out() {
        let e = CudaError::NoDriver {
            searched: vec!["libcuda.so".into(), "libcuda.so.1".into()],
        };
        assert_eq!(
            e.to_string(),
            "no NVIDIA driver (libcuda.so.1) found; use the simulated device: --device sim"
        );
    }

    #[test]
    fn guarded_turns_a_panic_into_an_error() {
        let r: Result<(), CudaError> = guarded(|| panic!("Missing symbol cuFoo"));
        assert_eq!(r, Err(CudaError::Unusable("Missing symbol cuFoo".into())));
    }
}
