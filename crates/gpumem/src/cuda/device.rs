//! [`CudaDevice`]: one GPU's primary context, implementing [`gpumem_core::Device`] with
//! cuMemAlloc/cuMemFree segments and the VMM calls, each timed into [`DriverCounters`].
use std::collections::BTreeMap;
use std::time::Instant;

use gpumem_core::{Device, DeviceError, DriverCall, DriverCounters, PhysHandle};
use serde::Serialize;

use super::driver::{self, CUcontext, CUdevice, DeviceAttr, PointerAttr};
use super::CudaContext;
use gpumem_core::adaptor::{PageTable, VmmBook};

/// Blocks up to this size are checked whole by [`CudaDevice`]'s `check_pattern`, in bytes.
pub const FULL_CHECK_BYTES: u64 = 1 << 20;
/// Bytes checked at each end of a larger block.
pub const SAMPLE_WINDOW_BYTES: u64 = 64 << 10;
/// 4 KiB windows checked between the ends of a larger block.
pub const SAMPLE_WINDOWS: u64 = 16;

/// What `gpumem info` shows of one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Marketing name (cuDeviceGetName).
    pub name: String,
    /// Total memory in bytes (cuDeviceTotalMem).
    pub total_bytes: u64,
    /// Free memory in bytes when opened (cuMemGetInfo).
    pub free_bytes: u64,
    /// Minimum VMM granularity in bytes (cuMemGetAllocationGranularity, MINIMUM).
    pub granularity_bytes: u64,
    /// Recommended VMM granularity in bytes.
    pub recommended_granularity_bytes: u64,
    /// Whether the device supports virtual memory management.
    pub vmm_supported: bool,
    /// Whether the device supports stream-ordered pools (cuMemAllocAsync).
    pub mempools_supported: bool,
    /// Whether the device supports managed memory.
    pub managed_supported: bool,
    /// Pitch alignment for 2-D allocations in bytes (CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT).
    pub texture_pitch_alignment_bytes: u64,
    /// Base alignment for textures in bytes (CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT).
    pub texture_alignment_bytes: u64,
    /// Driver version (cuDriverGetVersion, e.g. 13000).
    pub driver_version: i32,
}

/// Memory type as cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE) reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryType {
    /// Host memory.
    Host,
    /// Device memory.
    Device,
    /// A CUDA array.
    Array,
    /// Unified (managed) memory.
    Unified,
    /// A value this build does not know.
    Other(u32),
}

impl MemoryType {
    fn from_raw(v: u32) -> Self {
        match v {
            1 => MemoryType::Host,
            2 => MemoryType::Device,
            3 => MemoryType::Array,
            4 => MemoryType::Unified,
            o => MemoryType::Other(o),
        }
    }
}

/// The driver's view of a pointer (cuPointerGetAttribute).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PointerInfo {
    /// The pointer asked about.
    pub addr: u64,
    /// CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL.
    pub device_ordinal: i32,
    /// CU_POINTER_ATTRIBUTE_MEMORY_TYPE.
    pub memory_type: MemoryType,
    /// CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: start of the allocation (or mapping) holding it.
    pub range_start: u64,
    /// CU_POINTER_ATTRIBUTE_RANGE_SIZE, in bytes.
    pub range_bytes: u64,
    /// CU_POINTER_ATTRIBUTE_MAPPED.
    pub mapped: bool,
    /// CU_POINTER_ATTRIBUTE_IS_MANAGED.
    pub managed: bool,
    /// Whether the address lies in a VMM reservation this device made (CU_POINTER_ATTRIBUTE_
    /// IS_LEGACY_CUDA_IPC_CAPABLE is false for VMM memory; we answer from our own record).
    pub vmm_mapped: bool,
    /// The physical handle mapped there, from this device's record.
    pub vmm_handle: Option<u64>,
}

/// One GPU: its primary context, memory figures, and the segments and VMM objects gpumem made.
///
/// Every call makes the context current on the calling thread first, so a device may move
/// between threads (it is `Send`; the pool keeps it behind a mutex).
#[derive(Debug)]
pub struct CudaDevice {
    ordinal: usize,
    dev: CUdevice,
    ctx: CudaContext,
    info: DeviceInfo,
    used: u64,
    counters: DriverCounters,
    /// Live cuMemAlloc segments: addr -> bytes.
    segments: BTreeMap<u64, u64>,
    book: VmmBook,
    /// Other devices granted read-write access whenever pages are opened
    /// ([`CudaDevice::share_mappings_with_peers`]).
    peers: Vec<i32>,
}

// SAFETY: a CUDA context may be used from any thread once made current there; every method
// makes it current first, and `&mut self` keeps calls on one device sequential.
unsafe impl Send for CudaDevice {}

impl CudaDevice {
    /// Opens device `ordinal` (the driver is loaded and the ordinal checked by
    /// [`super::open`], which is the public entry point).
    pub(crate) fn open_checked(ordinal: usize) -> Result<Self, DeviceError> {
        let ctx = CudaContext::retain(ordinal)?;
        let dev = ctx.device_raw();
        let mut d = CudaDevice {
            ordinal,
            dev,
            ctx,
            info: DeviceInfo {
                ordinal,
                name: String::new(),
                total_bytes: 0,
                free_bytes: 0,
                granularity_bytes: 0,
                recommended_granularity_bytes: 0,
                vmm_supported: false,
                mempools_supported: false,
                managed_supported: false,
                texture_pitch_alignment_bytes: 0,
                texture_alignment_bytes: 0,
                driver_version: 0,
            },
            used: 0,
            counters: DriverCounters::default(),
            segments: BTreeMap::new(),
            book: VmmBook::default(),
            peers: Vec::new(),
        };
        d.bind()?;
        let attr = |a| driver::device_attribute(dev, a);
        let ord = d.ordinal_i32();
        d.info.name = driver::device_name(dev)?;
        d.info.total_bytes = driver::device_total_mem(dev)?;
        d.info.free_bytes = driver::mem_get_info()?.0;
        d.info.vmm_supported =
            attr(DeviceAttr::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)? != 0;
        d.info.mempools_supported =
            attr(DeviceAttr::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0;
        d.info.managed_supported = attr(DeviceAttr::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)? != 0;
        d.info.texture_pitch_alignment_bytes = u64::try_from(attr(
            DeviceAttr::CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT,
        )?)
        .unwrap_or(0);
        d.info.texture_alignment_bytes =
            u64::try_from(attr(DeviceAttr::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT)?).unwrap_or(0);
        d.info.driver_version = driver::driver_version()?;
        if d.info.vmm_supported {
            let (min, rec) = driver::allocation_granularity(ord)?;
            d.info.granularity_bytes = min;
            d.info.recommended_granularity_bytes = rec;
        }
        Ok(d)
    }

    fn ordinal_i32(&self) -> i32 {
        i32::try_from(self.ordinal).unwrap_or(i32::MAX)
    }

    /// Makes this device's context current on the calling thread (cuCtxSetCurrent).
    ///
    /// # Errors
    /// `DeviceError::Driver` if cuCtxSetCurrent fails.
    pub fn bind(&self) -> Result<(), DeviceError> {
        self.ctx.bind()
    }

    /// The device's primary context, for streams, events and pinned memory of this device.
    pub fn context(&self) -> &CudaContext {
        &self.ctx
    }

    /// The retained primary context, raw.
    pub(crate) fn context_raw(&self) -> CUcontext {
        self.ctx.context_raw()
    }

    /// The raw `CUdevice`.
    pub(crate) fn device_raw(&self) -> CUdevice {
        self.dev
    }

    /// CUDA ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The figures gathered when the device was opened (free memory refreshed now).
    pub fn info(&self) -> DeviceInfo {
        let mut i = self.info.clone();
        if let Ok((f, _)) = self.mem_info() {
            i.free_bytes = f;
        }
        i
    }

    /// Free and total device memory in bytes (cuMemGetInfo).
    ///
    /// # Errors
    /// A failed cuCtxSetCurrent or cuMemGetInfo.
    pub fn mem_info(&self) -> Result<(u64, u64), DeviceError> {
        self.bind()?;
        driver::mem_get_info()
    }

    /// The record of reservations, handles and mappings made through this device.
    pub fn vmm_book(&self) -> &VmmBook {
        &self.book
    }

    /// Page tables of every live reservation, pages of the granularity.
    pub fn page_tables(&self) -> Vec<PageTable> {
        self.book.page_tables(self.info.granularity_bytes)
    }

    /// The pitch cuMemAllocPitch chooses for rows of `width_bytes` (`height` rows, elements of
    /// `elem_bytes` ∈ {4, 8, 16}): allocates with cuMemAllocPitch and frees at once.
    ///
    /// # Errors
    /// A failed cuMemAllocPitch or cuMemFree.
    pub fn driver_pitch(
        &self,
        width_bytes: u64,
        height: u64,
        elem_bytes: u32,
    ) -> Result<u64, DeviceError> {
        self.bind()?;
        let (addr, pitch) = driver::mem_alloc_pitch(width_bytes, height, elem_bytes)?;
        // SAFETY: just allocated by cuMemAllocPitch in this context, unused, freed once.
        unsafe { driver::mem_free(addr)? };
        Ok(pitch)
    }

    /// The pitch alignment this device's pitched allocations use, in bytes
    /// ([`crate::pool::pitch::pitch_align_for`] of its texture alignments).
    pub fn pitch_align_bytes(&self) -> u64 {
        crate::pool::pitch::pitch_align_for(
            self.info.texture_alignment_bytes,
            self.info.texture_pitch_alignment_bytes,
        )
    }

    /// Waits for all work in the context (cuCtxSynchronize).
    ///
    /// # Errors
    /// A failed driver call (a sticky error would show here).
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        self.bind()?;
        driver::ctx_synchronize()
    }

    /// Live cuMemAlloc segments: (address, bytes).
    pub fn segments(&self) -> Vec<(u64, u64)> {
        self.segments.iter().map(|(a, b)| (*a, *b)).collect()
    }

    /// The driver's view of `addr` (cuPointerGetAttribute), with this device's VMM record.
    ///
    /// # Errors
    /// A failed cuPointerGetAttribute (e.g. CUDA_ERROR_INVALID_VALUE for a host address).
    pub fn pointer_info(&self, addr: u64) -> Result<PointerInfo, DeviceError> {
        self.bind()?;
        // Each T below is the type the driver writes for that attribute: c_int for ordinal,
        // c_uint for memory type, bools as c_int flags, CUdeviceptr (u64) for the range start
        // and size_t (usize) for the range size.
        // SAFETY: c_int for the device ordinal, as above.
        let device_ordinal: i32 = unsafe {
            driver::pointer_attribute(addr, PointerAttr::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)?
        };
        // SAFETY: see above.
        let mt: u32 = unsafe {
            driver::pointer_attribute(addr, PointerAttr::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)?
        };
        // SAFETY: see above.
        let range_start: u64 = unsafe {
            driver::pointer_attribute(addr, PointerAttr::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)?
        };
        // SAFETY: see above.
        let range_bytes: usize = unsafe {
            driver::pointer_attribute(addr, PointerAttr::CU_POINTER_ATTRIBUTE_RANGE_SIZE)?
        };
        // SAFETY: see above.
        let mapped: i32 =
            unsafe { driver::pointer_attribute(addr, PointerAttr::CU_POINTER_ATTRIBUTE_MAPPED)? };
        // SAFETY: see above.
        let managed: i32 = unsafe {
            driver::pointer_attribute(addr, PointerAttr::CU_POINTER_ATTRIBUTE_IS_MANAGED)?
        };
        let m = self.book.mapping_of(addr);
        Ok(PointerInfo {
            addr,
            device_ordinal,
            memory_type: MemoryType::from_raw(mt),
            range_start,
            range_bytes: range_bytes as u64,
            mapped: mapped != 0,
            managed: managed != 0,
            vmm_mapped: m.is_some(),
            vmm_handle: m.map(|(_, r)| r.handle),
        })
    }

    /// From now on, every cuMemSetAccess that opens newly mapped pages of this device also
    /// grants read-write access to each other device that cuDeviceCanAccessPeer allows, in
    /// the same call (one descriptor per device), as PyTorch's expandable segments do once
    /// peer access is enabled. Without it, VMM memory of this device is invisible to the
    /// others: a copy or kernel on another device that reads it fails with
    /// CUDA_ERROR_INVALID_VALUE or an illegal address. Pages mapped before the call keep
    /// their access. Returns the ordinals of the devices that now get access.
    ///
    /// # Errors
    /// A failed cuDeviceGetCount or cuDeviceCanAccessPeer.
    pub fn share_mappings_with_peers(&mut self) -> Result<Vec<usize>, DeviceError> {
        let n = driver::device_count()?;
        let mut out = Vec::new();
        for o in (0..n).filter(|&o| o != self.ordinal) {
            if driver::can_access_peer(o, self.ordinal)? {
                out.push(o);
            }
        }
        self.peers = out
            .iter()
            .map(|&o| i32::try_from(o).unwrap_or(i32::MAX))
            .collect();
        Ok(out)
    }

    /// Grants (`grant = true`, read-write) or revokes (PROT_NONE) access of device
    /// `peer_ordinal` to the mapped range `[va, va + bytes)` (cuMemSetAccess with one
    /// descriptor). Revoking this device's own access is refused.
    ///
    /// # Errors
    /// `DeviceError::Invalid` if the range is not wholly mapped by this device or the peer is
    /// this device on revoke; `DeviceError::Unsupported` when cuDeviceCanAccessPeer says no;
    /// a failed driver call.
    pub fn set_peer_access(
        &mut self,
        va: u64,
        bytes: u64,
        peer_ordinal: usize,
        grant: bool,
    ) -> Result<(), DeviceError> {
        if !self.book.is_mapped(va, bytes) {
            return Err(DeviceError::Invalid {
                call: "cuMemSetAccess",
                detail: format!("[{va:#x}, +{bytes}) is not wholly mapped by this device"),
            });
        }
        if peer_ordinal == self.ordinal && !grant {
            return Err(DeviceError::Invalid {
                call: "cuMemSetAccess",
                detail: "cannot revoke the owning device's own access".into(),
            });
        }
        if peer_ordinal != self.ordinal && !driver::can_access_peer(peer_ordinal, self.ordinal)? {
            return Err(DeviceError::Unsupported(format!(
                "device {peer_ordinal} cannot access device {} (cuDeviceCanAccessPeer)",
                self.ordinal
            )));
        }
        let peer = i32::try_from(peer_ordinal).unwrap_or(i32::MAX);
        self.bind()?;
        let t = Instant::now();
        // SAFETY: the book shows [va, va + bytes) wholly mapped by this device.
        unsafe { driver::mem_set_access(va, bytes, &[(peer, grant)])? };
        self.counters
            .record(DriverCall::SetAccess, t.elapsed().as_secs_f64());
        self.book.on_set_access(va, bytes, peer, grant);
        Ok(())
    }

    fn timed<T>(
        &mut self,
        call: DriverCall,
        f: impl FnOnce() -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        self.bind()?;
        let t = Instant::now();
        let r = f();
        // Failed calls count too, as on the simulated device.
        self.counters.record(call, t.elapsed().as_secs_f64());
        r
    }

    fn invalid(call: &'static str, detail: String) -> DeviceError {
        DeviceError::Invalid { call, detail }
    }

    fn check_granular(&self, call: &'static str, bytes: u64) -> Result<(), DeviceError> {
        let g = self.info.granularity_bytes;
        if !self.info.vmm_supported || g == 0 {
            return Err(DeviceError::Unsupported(format!(
                "device {} has no virtual memory management",
                self.ordinal
            )));
        }
        if bytes == 0 || !bytes.is_multiple_of(g) {
            return Err(Self::invalid(
                call,
                format!("{bytes} B is not a positive multiple of the granularity {g} B"),
            ));
        }
        Ok(())
    }

    fn release_everything(&mut self) {
        // Best effort, in the order the driver needs: unmap, release, free the ranges, then
        // plain segments.
        let _ = self.bind();
        let maps: Vec<(u64, u64)> = self
            .book
            .mappings
            .iter()
            .map(|(a, m)| (*a, m.bytes))
            .collect();
        for (a, b) in maps {
            // SAFETY: recorded as mapped by this device; it is being dropped, no user remains.
            let _ = unsafe { driver::mem_unmap(a, b) };
        }
        let handles: Vec<u64> = self.book.handles.keys().copied().collect();
        for h in handles {
            // SAFETY: a live handle from cuMemCreate, released once here.
            let _ = unsafe { driver::mem_release(h) };
        }
        let ranges: Vec<(u64, u64)> = self
            .book
            .reservations
            .iter()
            .map(|(a, b)| (*a, *b))
            .collect();
        for (a, b) in ranges {
            // SAFETY: a reserved range, unmapped just above.
            let _ = unsafe { driver::address_free(a, b) };
        }
        let segs: Vec<u64> = self.segments.keys().copied().collect();
        for s in segs {
            // SAFETY: a live segment from cuMemAlloc, freed once here.
            let _ = unsafe { driver::mem_free(s) };
        }
        self.book = VmmBook::default();
        self.segments.clear();
        self.used = 0;
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // The context itself is released when the last clone of `ctx` goes.
        self.release_everything();
    }
}

impl Device for CudaDevice {
    fn capacity_bytes(&self) -> u64 {
        self.info.total_bytes
    }
    fn granularity_bytes(&self) -> u64 {
        self.info.granularity_bytes
    }
    fn used_bytes(&self) -> u64 {
        self.used
    }
    fn counters(&self) -> DriverCounters {
        self.counters
    }
    fn driver_used_bytes(&mut self) -> Option<u64> {
        self.mem_info()
            .ok()
            .map(|(free, total)| total.saturating_sub(free))
    }

    fn alloc_segment(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        let addr = self.timed(DriverCall::Alloc, || driver::mem_alloc(bytes))?;
        self.segments.insert(addr, bytes);
        self.used += bytes;
        Ok(addr)
    }

    fn free_segment(&mut self, addr: u64) -> Result<(), DeviceError> {
        let Some(&bytes) = self.segments.get(&addr) else {
            return Err(Self::invalid(
                "cuMemFree",
                format!("{addr:#x} is not a live segment"),
            ));
        };
        // SAFETY: `addr` is a live cuMemAlloc segment of this context (checked above); the
        // allocator frees it only when no block of it is live.
        self.timed(DriverCall::Free, || unsafe { driver::mem_free(addr) })?;
        self.segments.remove(&addr);
        self.used -= bytes;
        Ok(())
    }

    fn reserve_va(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        self.check_granular("cuMemAddressReserve", bytes)?;
        let g = self.info.granularity_bytes;
        let va = self.timed(DriverCall::Reserve, || driver::address_reserve(bytes, g))?;
        self.book.on_reserve(va, bytes);
        Ok(va)
    }

    fn free_va(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        if self.book.reservations.get(&va) != Some(&bytes) {
            return Err(Self::invalid(
                "cuMemAddressFree",
                format!("[{va:#x}, +{bytes}) is not a reservation"),
            ));
        }
        if self.book.mappings.range(va..va + bytes).next().is_some() {
            return Err(Self::invalid(
                "cuMemAddressFree",
                format!("[{va:#x}, +{bytes}) is still mapped"),
            ));
        }
        // SAFETY: exactly one live reservation, wholly unmapped (both checked above).
        self.timed(DriverCall::AddressFree, || unsafe {
            driver::address_free(va, bytes)
        })?;
        self.book.on_free_va(va);
        Ok(())
    }

    fn create_physical(&mut self, bytes: u64) -> Result<PhysHandle, DeviceError> {
        self.check_granular("cuMemCreate", bytes)?;
        let ord = self.ordinal_i32();
        let h = self.timed(DriverCall::Create, || driver::mem_create(bytes, ord))?;
        self.book.on_create(h, bytes);
        self.used += bytes;
        Ok(PhysHandle(h))
    }

    fn release_physical(&mut self, handle: PhysHandle) -> Result<(), DeviceError> {
        let Some(&bytes) = self.book.handles.get(&handle.0) else {
            return Err(Self::invalid(
                "cuMemRelease",
                format!("unknown handle {:#x}", handle.0),
            ));
        };
        // SAFETY: a live handle from cuMemCreate (checked above), released once.
        self.timed(DriverCall::Release, || unsafe {
            driver::mem_release(handle.0)
        })?;
        self.book.on_release(handle.0);
        // The driver frees the memory when the last mapping goes; we count it as given back
        // now, as the simulated device does for an unmapped handle.
        self.used = self.used.saturating_sub(bytes);
        Ok(())
    }

    fn map(&mut self, va: u64, bytes: u64, handle: PhysHandle) -> Result<(), DeviceError> {
        self.check_granular("cuMemMap", bytes)?;
        if self.book.handles.get(&handle.0) != Some(&bytes) {
            return Err(Self::invalid(
                "cuMemMap",
                format!("handle {:#x} is not a live handle of {bytes} B", handle.0),
            ));
        }
        match self.book.reservation_of(va) {
            Some((s, b)) if va + bytes <= s + b => {}
            _ => {
                return Err(Self::invalid(
                    "cuMemMap",
                    format!("[{va:#x}, +{bytes}) is not inside a reservation"),
                ))
            }
        }
        if self.book.mappings.range(va..va + bytes).next().is_some()
            || self.book.mapping_of(va).is_some()
        {
            return Err(Self::invalid(
                "cuMemMap",
                format!("[{va:#x}, +{bytes}) is already mapped"),
            ));
        }
        // SAFETY: inside a reservation, not mapped, handle live and of `bytes` (checked above).
        self.timed(DriverCall::Map, || unsafe {
            driver::mem_map(va, bytes, handle.0)
        })?;
        self.book.on_map(va, bytes, handle.0);
        Ok(())
    }

    fn set_access(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        if !self.book.is_mapped(va, bytes) {
            return Err(Self::invalid(
                "cuMemSetAccess",
                format!("[{va:#x}, +{bytes}) is not wholly mapped"),
            ));
        }
        let ord = self.ordinal_i32();
        let mut access = Vec::with_capacity(1 + self.peers.len());
        access.push((ord, true));
        access.extend(self.peers.iter().map(|&p| (p, true)));
        // SAFETY: wholly mapped (checked above).
        self.timed(DriverCall::SetAccess, || unsafe {
            driver::mem_set_access(va, bytes, &access)
        })?;
        for &(o, _) in &access {
            self.book.on_set_access(va, bytes, o, true);
        }
        Ok(())
    }

    fn unmap(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        // Must cover whole mappings: start at one, end at one's end.
        let covers = match self.book.mappings.get(&va) {
            Some(_) => {
                let mut at = va;
                for (&s, m) in self.book.mappings.range(va..va + bytes) {
                    if s != at {
                        break;
                    }
                    at = s + m.bytes;
                }
                at == va + bytes
            }
            None => false,
        };
        if !covers {
            return Err(Self::invalid(
                "cuMemUnmap",
                format!("[{va:#x}, +{bytes}) does not cover whole mappings"),
            ));
        }
        // SAFETY: covers whole mappings of this device (checked above); the allocator unmaps
        // only pages holding no live block.
        self.timed(DriverCall::Unmap, || unsafe {
            driver::mem_unmap(va, bytes)
        })?;
        self.book.on_unmap(va, bytes);
        Ok(())
    }

    fn fill_pattern(&mut self, addr: u64, bytes: u64, pattern: u32) -> Result<(), DeviceError> {
        let words = usize::try_from(bytes / 4)
            .map_err(|_| Self::invalid("cuMemsetD32", format!("{bytes} B")))?;
        if words == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the replay fills only live blocks it was handed by an allocator on this
        // device, which lie in segments or mapped, accessible pages of this context.
        unsafe { driver::memset_d32(addr, pattern, words) }
    }

    /// Copies the block back (cuMemcpyDtoH) and compares. Blocks up to
    /// [`FULL_CHECK_BYTES`] are checked whole; larger ones at their first and last
    /// [`SAMPLE_WINDOW_BYTES`] and at [`SAMPLE_WINDOWS`] evenly spaced windows between, which
    /// catches an overlapping neighbour (it damages an end, or a run wider than the spacing)
    /// while keeping a replay of large traces within minutes.
    fn check_pattern(&mut self, addr: u64, bytes: u64, pattern: u32) -> Result<bool, DeviceError> {
        let bytes = bytes & !3;
        if bytes == 0 {
            return Ok(true);
        }
        self.bind()?;
        let mut windows: Vec<(u64, u64)> = Vec::new();
        if bytes <= FULL_CHECK_BYTES {
            windows.push((addr, bytes));
        } else {
            let w = SAMPLE_WINDOW_BYTES;
            windows.push((addr, w));
            let span = bytes - 2 * w;
            for i in 1..=SAMPLE_WINDOWS {
                let off = w + (span / (SAMPLE_WINDOWS + 1)) * i;
                windows.push((addr + (off & !3), 4096));
            }
            windows.push((addr + bytes - w, w));
        }
        let mut buf: Vec<u32> = Vec::new();
        for (at, n) in windows {
            let words = usize::try_from(n / 4)
                .map_err(|_| Self::invalid("cuMemcpyDtoH", format!("{n} B")))?;
            buf.clear();
            buf.resize(words, 0);
            // SAFETY: [at, at + n) lies inside [addr, addr + bytes), a live block of this
            // context handed out by an allocator on this device (the replay's contract).
            unsafe { driver::memcpy_dtoh(&mut buf, at)? };
            if buf.iter().any(|&x| x != pattern) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
