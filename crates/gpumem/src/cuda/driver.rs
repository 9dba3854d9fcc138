//! Thin wrappers over `cudarc::driver::sys`: one function per CUDA call, each returning
//! `Result<_, DeviceError>` naming the call and the CUDA error (`DeviceError::Driver`), or
//! `DeviceError::OutOfMemory` for CUDA_ERROR_OUT_OF_MEMORY on an allocating call.
//!
//! Callers must have loaded the library first ([`super::init`]); functions that work on memory
//! need the device's context current on the calling thread ([`ctx_set_current`]).
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::ptr;

use cudarc::driver::sys;
use gpumem_core::DeviceError;

pub(crate) use sys::{CUcontext, CUdevice, CUevent, CUstream};

/// Maps a CUresult to `Ok` or `DeviceError::Driver { call, name }`.
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<(), DeviceError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DeviceError::Driver {
            call,
            name: format!("{r:?}"),
        })
    }
}

/// As [`check`], but CUDA_ERROR_OUT_OF_MEMORY becomes `DeviceError::OutOfMemory` for
/// `requested_bytes` (free and total from cuMemGetInfo when it answers).
fn check_alloc(
    call: &'static str,
    r: sys::CUresult,
    requested_bytes: u64,
) -> Result<(), DeviceError> {
    if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        let (free_bytes, capacity_bytes) = mem_get_info().unwrap_or((0, 0));
        return Err(DeviceError::OutOfMemory {
            requested_bytes,
            free_bytes,
            capacity_bytes,
        });
    }
    check(call, r)
}

fn to_usize(call: &'static str, bytes: u64) -> Result<usize, DeviceError> {
    usize::try_from(bytes).map_err(|_| DeviceError::Invalid {
        call,
        detail: format!("{bytes} B does not fit in usize"),
    })
}

/// Whether a driver library can be opened (cudarc's fallible probe; the loader itself would
/// panic).
pub(crate) fn library_present() -> bool {
    // SAFETY: is_culib_present only dlopens candidate names (running the library's
    // initialisers, which the CUDA driver allows) and drops each handle again.
    unsafe { sys::is_culib_present() }
}

/// Whether the loaded driver library exports `name` (call after [`library_present`]).
pub(crate) fn has_symbol(name: &str) -> bool {
    // SAFETY: only looks a symbol up in the library found by `library_present`; the pointer
    // is not used.
    unsafe { sys::culib().get::<*const c_void>(name.as_bytes()) }.is_ok()
}

/// cuInit(0).
pub(crate) fn init() -> Result<(), DeviceError> {
    // SAFETY: cuInit takes only flags; the library is loaded (caller checked its presence).
    check("cuInit", unsafe { sys::cuInit(0) })
}

/// cuDriverGetVersion: e.g. 13000 for CUDA 13.0.
pub(crate) fn driver_version() -> Result<i32, DeviceError> {
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer for one int.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut v)
    })?;
    Ok(v)
}

/// cuDeviceGetCount.
pub(crate) fn device_count() -> Result<usize, DeviceError> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer for one int; cuInit was called.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// cuDeviceGet.
pub(crate) fn device_get(ordinal: usize) -> Result<CUdevice, DeviceError> {
    let mut d = MaybeUninit::uninit();
    let ord = i32::try_from(ordinal).map_err(|_| DeviceError::Invalid {
        call: "cuDeviceGet",
        detail: format!("ordinal {ordinal}"),
    })?;
    // SAFETY: `d` is a valid out-pointer; it is read only on success.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(d.as_mut_ptr(), ord)
    })?;
    // SAFETY: cuDeviceGet succeeded, so it wrote the device.
    Ok(unsafe { d.assume_init() })
}

/// cuDeviceGetName.
pub(crate) fn device_name(dev: CUdevice) -> Result<String, DeviceError> {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: `buf` holds 256 chars and we pass that length; the driver NUL-terminates.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(buf.as_mut_ptr(), 256, dev)
    })?;
    // SAFETY: the driver wrote a NUL-terminated string inside `buf`.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(s.to_string_lossy().into_owned())
}

/// cuDeviceTotalMem, in bytes.
pub(crate) fn device_total_mem(dev: CUdevice) -> Result<u64, DeviceError> {
    let mut b = 0usize;
    // SAFETY: `b` is a valid out-pointer.
    check("cuDeviceTotalMem", unsafe {
        sys::cuDeviceTotalMem_v2(&mut b, dev)
    })?;
    Ok(b as u64)
}

/// cuDeviceGetAttribute.
pub(crate) fn device_attribute(
    dev: CUdevice,
    attr: sys::CUdevice_attribute,
) -> Result<i32, DeviceError> {
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer for one int.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

/// cuDeviceCanAccessPeer between ordinals `a` (accessing) and `b` (owner).
pub(crate) fn can_access_peer(a: usize, b: usize) -> Result<bool, DeviceError> {
    let (da, db) = (device_get(a)?, device_get(b)?);
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer; both devices come from cuDeviceGet.
    check("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut v, da, db)
    })?;
    Ok(v != 0)
}

/// cuDevicePrimaryCtxRetain.
///
/// # Safety
/// 1. `dev` comes from cuDeviceGet; every retain must be matched by one
///    [`primary_ctx_release`] (cuDevicePrimaryCtxRelease).
pub(crate) unsafe fn primary_ctx_retain(dev: CUdevice) -> Result<CUcontext, DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        let mut c = ptr::null_mut();
        check(
            "cuDevicePrimaryCtxRetain",
            sys::cuDevicePrimaryCtxRetain(&mut c, dev),
        )?;
        Ok(c)
    }
}

/// cuDevicePrimaryCtxRelease.
///
/// # Safety
/// 1. Matches one earlier [`primary_ctx_retain`] of `dev`; no memory of the context is used
///    after the last release (cuDevicePrimaryCtxRelease).
pub(crate) unsafe fn primary_ctx_release(dev: CUdevice) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        check(
            "cuDevicePrimaryCtxRelease",
            sys::cuDevicePrimaryCtxRelease_v2(dev),
        )
    }
}

/// cuCtxSetCurrent.
///
/// # Safety
/// 1. `ctx` is a live context (retained and not yet released) (cuCtxSetCurrent).
pub(crate) unsafe fn ctx_set_current(ctx: CUcontext) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe { check("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx)) }
}

/// cuCtxSynchronize of the current context.
pub(crate) fn ctx_synchronize() -> Result<(), DeviceError> {
    // SAFETY: cuCtxSynchronize takes no pointers; it fails cleanly without a current context.
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}

/// cuMemGetInfo of the current context: (free, total) bytes.
pub(crate) fn mem_get_info() -> Result<(u64, u64), DeviceError> {
    let (mut f, mut t) = (0usize, 0usize);
    // SAFETY: both are valid out-pointers.
    check("cuMemGetInfo", unsafe {
        sys::cuMemGetInfo_v2(&mut f, &mut t)
    })?;
    Ok((f as u64, t as u64))
}

/// cuMemAlloc of `bytes` in the current context.
pub(crate) fn mem_alloc(bytes: u64) -> Result<u64, DeviceError> {
    let n = to_usize("cuMemAlloc", bytes)?;
    let mut p = 0;
    check_alloc(
        "cuMemAlloc",
        // SAFETY: `p` is a valid out-pointer; the memory returned is owned by the caller.
        unsafe { sys::cuMemAlloc_v2(&mut p, n) },
        bytes,
    )?;
    Ok(p)
}

/// cuMemFree.
///
/// # Safety
/// 1. `addr` was returned by cuMemAlloc (or cuMemAllocManaged) in the current context and is
///    not freed yet; no queued work still uses it (cuMemFree).
pub(crate) unsafe fn mem_free(addr: u64) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe { check("cuMemFree", sys::cuMemFree_v2(addr)) }
}

/// cuMemAllocManaged with CU_MEM_ATTACH_GLOBAL.
pub(crate) fn mem_alloc_managed(bytes: u64) -> Result<u64, DeviceError> {
    let n = to_usize("cuMemAllocManaged", bytes)?;
    let mut p = 0;
    let flags = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
    check_alloc(
        "cuMemAllocManaged",
        // SAFETY: `p` is a valid out-pointer; the memory is owned by the caller.
        unsafe { sys::cuMemAllocManaged(&mut p, n, flags) },
        bytes,
    )?;
    Ok(p)
}

fn device_location(ordinal: i32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal,
    }
}

/// A location for prefetch/advice: a device ordinal, or the host (`None`).
pub(crate) fn location(ordinal: Option<i32>) -> sys::CUmemLocation {
    match ordinal {
        Some(o) => device_location(o),
        None => sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
    }
}

/// cuMemPrefetchAsync_v2.
///
/// # Safety
/// 1. `[addr, addr + bytes)` lies inside one live cuMemAllocManaged allocation;
/// 2. `stream` is a live stream of the current context (or 0) (cuMemPrefetchAsync_v2).
pub(crate) unsafe fn mem_prefetch(
    addr: u64,
    bytes: u64,
    loc: sys::CUmemLocation,
    stream: CUstream,
) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        let n = to_usize("cuMemPrefetchAsync", bytes)?;
        check(
            "cuMemPrefetchAsync",
            sys::cuMemPrefetchAsync_v2(addr, n, loc, 0, stream),
        )
    }
}

/// cuMemAdvise_v2.
///
/// # Safety
/// 1. `[addr, addr + bytes)` lies inside one live cuMemAllocManaged allocation (cuMemAdvise_v2).
pub(crate) unsafe fn mem_advise(
    addr: u64,
    bytes: u64,
    advice: sys::CUmem_advise,
    loc: sys::CUmemLocation,
) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        let n = to_usize("cuMemAdvise", bytes)?;
        check("cuMemAdvise", sys::cuMemAdvise_v2(addr, n, advice, loc))
    }
}

fn pinned_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: device_location(ordinal),
        win32HandleMetaData: ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// cuMemGetAllocationGranularity for pinned device memory on `ordinal`: (minimum, recommended).
pub(crate) fn allocation_granularity(ordinal: i32) -> Result<(u64, u64), DeviceError> {
    let prop = pinned_prop(ordinal);
    let (mut min, mut rec) = (0usize, 0usize);
    // SAFETY: `prop` is a fully initialised property struct; out-pointers are valid.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut min,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    // SAFETY: as above.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut rec,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        )
    })?;
    Ok((min as u64, rec as u64))
}

/// cuMemAddressReserve of `bytes` aligned to `align` (0 = granularity), anywhere.
pub(crate) fn address_reserve(bytes: u64, align: u64) -> Result<u64, DeviceError> {
    let n = to_usize("cuMemAddressReserve", bytes)?;
    let a = to_usize("cuMemAddressReserve", align)?;
    let mut p = 0;
    check_alloc(
        "cuMemAddressReserve",
        // SAFETY: `p` is a valid out-pointer; reserving address space touches no memory.
        unsafe { sys::cuMemAddressReserve(&mut p, n, a, 0, 0) },
        bytes,
    )?;
    Ok(p)
}

/// cuMemAddressFree.
///
/// # Safety
/// 1. `[va, va + bytes)` is exactly one range from cuMemAddressReserve, wholly unmapped
///    (cuMemAddressFree).
pub(crate) unsafe fn address_free(va: u64, bytes: u64) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        let n = to_usize("cuMemAddressFree", bytes)?;
        check("cuMemAddressFree", sys::cuMemAddressFree(va, n))
    }
}

/// cuMemCreate of `bytes` of pinned device memory on `ordinal`.
pub(crate) fn mem_create(bytes: u64, ordinal: i32) -> Result<u64, DeviceError> {
    let n = to_usize("cuMemCreate", bytes)?;
    let prop = pinned_prop(ordinal);
    let mut h = 0;
    check_alloc(
        "cuMemCreate",
        // SAFETY: `prop` is fully initialised; `h` is a valid out-pointer; the handle is owned by
        // the caller until cuMemRelease.
        unsafe { sys::cuMemCreate(&mut h, n, &prop, 0) },
        bytes,
    )?;
    Ok(h)
}

/// cuMemRelease.
///
/// # Safety
/// 1. `handle` came from cuMemCreate and is not released yet (cuMemRelease); its memory is
///    freed once every mapping of it is unmapped.
pub(crate) unsafe fn mem_release(handle: u64) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe { check("cuMemRelease", sys::cuMemRelease(handle)) }
}

/// cuMemMap of the whole of `handle` (`bytes`, offset 0) at `va`.
///
/// # Safety
/// 1. `[va, va + bytes)` lies in a reserved range and is not mapped;
/// 2. `handle` is live and exactly `bytes` long (cuMemMap).
pub(crate) unsafe fn mem_map(va: u64, bytes: u64, handle: u64) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        let n = to_usize("cuMemMap", bytes)?;
        check("cuMemMap", sys::cuMemMap(va, n, 0, handle, 0))
    }
}

/// cuMemUnmap.
///
/// # Safety
/// 1. `[va, va + bytes)` covers whole mappings; no queued work uses them (cuMemUnmap).
pub(crate) unsafe fn mem_unmap(va: u64, bytes: u64) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        let n = to_usize("cuMemUnmap", bytes)?;
        check("cuMemUnmap", sys::cuMemUnmap(va, n))
    }
}

/// cuMemSetAccess with one descriptor per `(ordinal, read_write)`: `true` grants read-write,
/// `false` revokes (PROT_NONE).
///
/// # Safety
/// 1. `[va, va + bytes)` is wholly mapped (cuMemSetAccess).
pub(crate) unsafe fn mem_set_access(
    va: u64,
    bytes: u64,
    access: &[(i32, bool)],
) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        let n = to_usize("cuMemSetAccess", bytes)?;
        let descs: Vec<sys::CUmemAccessDesc> = access
            .iter()
            .map(|&(o, rw)| sys::CUmemAccessDesc {
                location: device_location(o),
                flags: if rw {
                    sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                } else {
                    sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE
                },
            })
            .collect();
        check(
            "cuMemSetAccess",
            sys::cuMemSetAccess(va, n, descs.as_ptr(), descs.len()),
        )
    }
}

/// cuMemsetD32 (synchronous) of `words` 32-bit words at `addr`.
///
/// # Safety
/// 1. `[addr, addr + 4 * words)` is device memory of the current context that is mapped and
///    read-write for this device (cuMemsetD32).
pub(crate) unsafe fn memset_d32(addr: u64, pattern: u32, words: usize) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe { check("cuMemsetD32", sys::cuMemsetD32_v2(addr, pattern, words)) }
}

/// cuMemcpyDtoH (synchronous) into `dst`.
///
/// # Safety
/// 1. `[src, src + size_of_val(dst))` is readable device memory of the current context
///    (cuMemcpyDtoH).
pub(crate) unsafe fn memcpy_dtoh(dst: &mut [u32], src: u64) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        check(
            "cuMemcpyDtoH",
            sys::cuMemcpyDtoH_v2(
                dst.as_mut_ptr().cast::<c_void>(),
                src,
                std::mem::size_of_val(dst),
            ),
        )
    }
}

/// cuPointerGetAttribute for a plain-old-data attribute of type `T`.
///
/// # Safety
/// 1. `T` is the type the driver writes for `attr` (cuPointerGetAttribute's table: c_int for
///    ordinals, memory type and flags, CUdeviceptr for range start, size_t for range size).
pub(crate) unsafe fn pointer_attribute<T: Copy + Default>(
    addr: u64,
    attr: sys::CUpointer_attribute,
) -> Result<T, DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        let mut v = T::default();
        check(
            "cuPointerGetAttribute",
            sys::cuPointerGetAttribute((&mut v as *mut T).cast::<c_void>(), attr, addr),
        )?;
        Ok(v)
    }
}

/// cuStreamCreate (non-blocking).
pub(crate) fn stream_create() -> Result<CUstream, DeviceError> {
    let mut s = ptr::null_mut();
    // SAFETY: `s` is a valid out-pointer; the stream is owned by the caller.
    check("cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
    })?;
    Ok(s)
}

/// cuStreamDestroy.
///
/// # Safety
/// 1. `s` came from cuStreamCreate and is not destroyed yet (cuStreamDestroy).
pub(crate) unsafe fn stream_destroy(s: CUstream) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe { check("cuStreamDestroy", sys::cuStreamDestroy_v2(s)) }
}

/// cuStreamSynchronize.
///
/// # Safety
/// 1. `s` is a live stream of the current context, or null (cuStreamSynchronize).
pub(crate) unsafe fn stream_synchronize(s: CUstream) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe { check("cuStreamSynchronize", sys::cuStreamSynchronize(s)) }
}

/// cuEventCreate with CU_EVENT_DISABLE_TIMING.
pub(crate) fn event_create() -> Result<CUevent, DeviceError> {
    let mut e = ptr::null_mut();
    // SAFETY: `e` is a valid out-pointer; the event is owned by the caller.
    check("cuEventCreate", unsafe {
        sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    })?;
    Ok(e)
}

/// cuEventRecord.
///
/// # Safety
/// 1. `e` is a live event and `s` a live stream (or null) of the current context
///    (cuEventRecord).
pub(crate) unsafe fn event_record(e: CUevent, s: CUstream) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe { check("cuEventRecord", sys::cuEventRecord(e, s)) }
}

/// cuEventQuery: `Ok(true)` when complete, `Ok(false)` on CUDA_ERROR_NOT_READY.
///
/// # Safety
/// 1. `e` is a live event (cuEventQuery).
pub(crate) unsafe fn event_query(e: CUevent) -> Result<bool, DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        let r = sys::cuEventQuery(e);
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            // Not an error: nothing is left pending in the context.
            return Ok(false);
        }
        check("cuEventQuery", r).map(|()| true)
    }
}

/// cuEventSynchronize.
///
/// # Safety
/// 1. `e` is a live event (cuEventSynchronize).
pub(crate) unsafe fn event_synchronize(e: CUevent) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe { check("cuEventSynchronize", sys::cuEventSynchronize(e)) }
}

/// cuEventDestroy.
///
/// # Safety
/// 1. `e` is a live event, destroyed once (cuEventDestroy).
pub(crate) unsafe fn event_destroy(e: CUevent) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe { check("cuEventDestroy", sys::cuEventDestroy_v2(e)) }
}

/// cuDeviceGetDefaultMemPool of `dev`.
pub(crate) fn default_mem_pool(dev: CUdevice) -> Result<sys::CUmemoryPool, DeviceError> {
    let mut p = ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer; the default pool is owned by the driver.
    check("cuDeviceGetDefaultMemPool", unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut p, dev)
    })?;
    Ok(p)
}

/// cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, bytes).
///
/// # Safety
/// 1. `pool` is a live memory pool (cuMemPoolSetAttribute).
pub(crate) unsafe fn mem_pool_set_release_threshold(
    pool: sys::CUmemoryPool,
    bytes: u64,
) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        let mut v: u64 = bytes;
        check(
            "cuMemPoolSetAttribute",
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut v as *mut u64).cast::<c_void>(),
            ),
        )
    }
}

/// cuMemPoolTrimTo(pool, 0).
///
/// # Safety
/// 1. `pool` is a live memory pool (cuMemPoolTrimTo).
pub(crate) unsafe fn mem_pool_trim(pool: sys::CUmemoryPool) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe { check("cuMemPoolTrimTo", sys::cuMemPoolTrimTo(pool, 0)) }
}

/// cuMemAllocAsync of `bytes` on `stream` (from the device's current pool).
///
/// # Safety
/// 1. `stream` is a live stream of the current context, or null (cuMemAllocAsync).
pub(crate) unsafe fn mem_alloc_async(bytes: u64, stream: CUstream) -> Result<u64, DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe {
        let n = to_usize("cuMemAllocAsync", bytes)?;
        let mut p = 0;
        check_alloc(
            "cuMemAllocAsync",
            sys::cuMemAllocAsync(&mut p, n, stream),
            bytes,
        )?;
        Ok(p)
    }
}

/// cuMemFreeAsync.
///
/// # Safety
/// 1. `addr` came from cuMemAllocAsync and is not freed yet; `stream` is live (cuMemFreeAsync).
pub(crate) unsafe fn mem_free_async(addr: u64, stream: CUstream) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the # Safety contract above; out-pointers are locals.
    unsafe { check("cuMemFreeAsync", sys::cuMemFreeAsync(addr, stream)) }
}

/// The raw attribute enum, re-exported for the device module.
pub(crate) use sys::CUdevice_attribute as DeviceAttr;
/// The raw advice enum.
pub(crate) use sys::CUmem_advise as MemAdvise;
/// The raw memory-pool handle.
pub(crate) use sys::CUmemoryPool as MemPool;
/// The raw pointer-attribute enum.
pub(crate) use sys::CUpointer_attribute as PointerAttr;
/// CU_MEMHOSTREGISTER_PORTABLE.
pub(crate) const HOST_REGISTER_PORTABLE: u32 = sys::CU_MEMHOSTREGISTER_PORTABLE;
/// CU_MEMHOSTREGISTER_DEVICEMAP.
pub(crate) const HOST_REGISTER_DEVICEMAP: u32 = sys::CU_MEMHOSTREGISTER_DEVICEMAP;
/// CU_MEMHOSTALLOC_PORTABLE.
pub(crate) const HOST_ALLOC_PORTABLE: u32 = sys::CU_MEMHOSTALLOC_PORTABLE;
/// CU_MEMHOSTALLOC_DEVICEMAP.
pub(crate) const HOST_ALLOC_DEVICEMAP: u32 = sys::CU_MEMHOSTALLOC_DEVICEMAP;
/// CU_MEMHOSTALLOC_WRITECOMBINED.
pub(crate) const HOST_ALLOC_WRITECOMBINED: u32 = sys::CU_MEMHOSTALLOC_WRITECOMBINED;
/// The raw function handle.
pub(crate) use sys::CUfunction as Function;
/// The raw module handle.
pub(crate) use sys::CUmodule as Module;

/// cuMemAllocPitch: (address, pitch in bytes).
pub(crate) fn mem_alloc_pitch(
    width_bytes: u64,
    height: u64,
    elem_bytes: u32,
) -> Result<(u64, u64), DeviceError> {
    let w = to_usize("cuMemAllocPitch", width_bytes)?;
    let h = to_usize("cuMemAllocPitch", height)?;
    let (mut p, mut pitch) = (0, 0usize);
    check_alloc(
        "cuMemAllocPitch",
        // SAFETY: valid out-pointers; the memory returned is owned by the caller.
        unsafe { sys::cuMemAllocPitch_v2(&mut p, &mut pitch, w, h, elem_bytes) },
        width_bytes.saturating_mul(height),
    )?;
    Ok((p, pitch as u64))
}

/// cuDeviceGetPCIBusId, e.g. `0000:3B:00.0`.
pub(crate) fn device_pci_bus_id(dev: CUdevice) -> Result<String, DeviceError> {
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: the driver writes at most 32 bytes, NUL-terminated, into `buf`.
    check("cuDeviceGetPCIBusId", unsafe {
        sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), 32, dev)
    })?;
    // SAFETY: the driver NUL-terminated the string inside `buf`.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(s.to_string_lossy().into_owned())
}

/// cuMemHostAlloc of `bytes` page-locked host bytes with `flags` (CU_MEMHOSTALLOC_*).
pub(crate) fn mem_host_alloc(bytes: usize, flags: u32) -> Result<*mut c_void, DeviceError> {
    let mut p = ptr::null_mut();
    check_alloc(
        "cuMemHostAlloc",
        // SAFETY: `p` is a valid out-pointer; the memory is owned by the caller until
        // cuMemFreeHost.
        unsafe { sys::cuMemHostAlloc(&mut p, bytes, flags) },
        bytes as u64,
    )?;
    Ok(p)
}

/// cuMemFreeHost.
///
/// # Safety
/// 1. `p` came from cuMemHostAlloc, is not freed yet and no queued copy still uses it
///    (cuMemFreeHost).
pub(crate) unsafe fn mem_free_host(p: *mut c_void) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the contract above.
    check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(p) })
}

/// cuMemHostGetDevicePointer: the device address of mapped pinned host memory.
///
/// # Safety
/// 1. `p` lies in memory pinned with CU_MEMHOSTALLOC_DEVICEMAP or registered with
///    CU_MEMHOSTREGISTER_DEVICEMAP (cuMemHostGetDevicePointer).
pub(crate) unsafe fn mem_host_get_device_pointer(p: *mut c_void) -> Result<u64, DeviceError> {
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: `d` is a valid out-pointer; the caller upholds the contract above.
    check("cuMemHostGetDevicePointer", unsafe {
        sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0)
    })?;
    Ok(d)
}

/// cuMemHostRegister of `[p, p + bytes)` with `flags` (CU_MEMHOSTREGISTER_*).
///
/// # Safety
/// 1. `[p, p + bytes)` is host memory owned by the caller that stays mapped until
///    cuMemHostUnregister (cuMemHostRegister).
pub(crate) unsafe fn mem_host_register(
    p: *mut c_void,
    bytes: usize,
    flags: u32,
) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the contract above.
    check("cuMemHostRegister", unsafe {
        sys::cuMemHostRegister_v2(p, bytes, flags)
    })
}

/// cuMemHostUnregister.
///
/// # Safety
/// 1. `p` is the start of a range registered by cuMemHostRegister; no queued copy uses it
///    (cuMemHostUnregister).
pub(crate) unsafe fn mem_host_unregister(p: *mut c_void) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the contract above.
    check("cuMemHostUnregister", unsafe {
        sys::cuMemHostUnregister(p)
    })
}

/// cuMemcpyHtoDAsync on `stream`.
///
/// # Safety
/// 1. `[src, src + bytes)` is readable host memory that stays valid and unchanged until the
///    copy completes;
/// 2. `[dst, dst + bytes)` lies inside a live device allocation (cuMemcpyHtoDAsync).
pub(crate) unsafe fn memcpy_htod_async(
    dst: u64,
    src: *const u8,
    bytes: usize,
    stream: CUstream,
) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the contract above.
    check("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src.cast::<c_void>(), bytes, stream)
    })
}

/// cuMemcpyDtoHAsync on `stream`.
///
/// # Safety
/// 1. `[dst, dst + bytes)` is writable host memory that nobody else touches until the copy
///    completes;
/// 2. `[src, src + bytes)` lies inside a live device allocation (cuMemcpyDtoHAsync).
pub(crate) unsafe fn memcpy_dtoh_async(
    dst: *mut u8,
    src: u64,
    bytes: usize,
    stream: CUstream,
) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the contract above.
    check("cuMemcpyDtoHAsync", unsafe {
        sys::cuMemcpyDtoHAsync_v2(dst.cast::<c_void>(), src, bytes, stream)
    })
}

/// cuMemcpyDtoDAsync on `stream` (mapped host addresses count as device addresses).
///
/// # Safety
/// 1. Both ranges lie inside live device (or mapped host) allocations that stay alive until
///    the copy completes (cuMemcpyDtoDAsync).
pub(crate) unsafe fn memcpy_dtod_async(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: CUstream,
) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the contract above.
    check("cuMemcpyDtoDAsync", unsafe {
        sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream)
    })
}

/// cuStreamWaitEvent (CU_EVENT_WAIT_DEFAULT).
///
/// # Safety
/// 1. `s` and `e` are live handles of the current context (cuStreamWaitEvent).
pub(crate) unsafe fn stream_wait_event(s: CUstream, e: CUevent) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the contract above.
    check("cuStreamWaitEvent", unsafe {
        sys::cuStreamWaitEvent(s, e, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT as u32)
    })
}

/// cuEventCreate with timing (`CU_EVENT_DEFAULT`) or without (`CU_EVENT_DISABLE_TIMING`,
/// cheaper to record and query).
pub(crate) fn event_create_timed(timing: bool) -> Result<CUevent, DeviceError> {
    let flags = if timing {
        sys::CUevent_flags::CU_EVENT_DEFAULT
    } else {
        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
    };
    let mut e = ptr::null_mut();
    // SAFETY: `e` is a valid out-pointer; the event is owned by the caller.
    check("cuEventCreate", unsafe {
        sys::cuEventCreate(&mut e, flags as u32)
    })?;
    Ok(e)
}

/// cuEventElapsedTime (or cuEventElapsedTime_v2, whichever the driver exports: CUDA 12.8
/// added the second and CUDA 13 headers use it), in milliseconds from `start` to `end`.
///
/// # Safety
/// 1. Both events are live, created with timing and completed (cuEventElapsedTime).
pub(crate) unsafe fn event_elapsed_time(start: CUevent, end: CUevent) -> Result<f32, DeviceError> {
    type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;
    static ELAPSED: std::sync::OnceLock<Option<ElapsedFn>> = std::sync::OnceLock::new();
    let f = ELAPSED.get_or_init(|| {
        // SAFETY: the library is loaded (an event exists); both symbols have this signature
        // in cuda.h.
        unsafe {
            let lib = sys::culib();
            lib.get::<ElapsedFn>(b"cuEventElapsedTime_v2")
                .or_else(|_| lib.get::<ElapsedFn>(b"cuEventElapsedTime"))
                .map(|s| *s)
                .ok()
        }
    });
    let f = f.ok_or_else(|| DeviceError::Driver {
        call: "cuEventElapsedTime",
        name: "symbol not found in the driver".into(),
    })?;
    let mut ms = 0f32;
    // SAFETY: `ms` is a valid out-pointer; the caller upholds the contract above.
    check("cuEventElapsedTime", unsafe { f(&mut ms, start, end) })?;
    Ok(ms)
}

/// cuModuleLoadData of a NUL-terminated PTX text.
pub(crate) fn module_load_data(image: &std::ffi::CStr) -> Result<sys::CUmodule, DeviceError> {
    let mut m = ptr::null_mut();
    // SAFETY: `image` is NUL-terminated and outlives the call; `m` is a valid out-pointer.
    check("cuModuleLoadData", unsafe {
        sys::cuModuleLoadData(&mut m, image.as_ptr().cast::<c_void>())
    })?;
    Ok(m)
}

/// cuModuleGetFunction.
///
/// # Safety
/// 1. `module` is a live module of the current context (cuModuleGetFunction).
pub(crate) unsafe fn module_get_function(
    module: sys::CUmodule,
    name: &std::ffi::CStr,
) -> Result<sys::CUfunction, DeviceError> {
    let mut f = ptr::null_mut();
    // SAFETY: `f` is a valid out-pointer; `name` is NUL-terminated; the caller upholds the
    // contract above.
    check("cuModuleGetFunction", unsafe {
        sys::cuModuleGetFunction(&mut f, module, name.as_ptr())
    })?;
    Ok(f)
}

/// cuModuleUnload.
///
/// # Safety
/// 1. `module` is live, unloaded once, and none of its functions is used afterwards
///    (cuModuleUnload).
pub(crate) unsafe fn module_unload(module: sys::CUmodule) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the contract above.
    check("cuModuleUnload", unsafe { sys::cuModuleUnload(module) })
}

/// cuLaunchKernel of a 1-D grid with no shared memory.
///
/// # Safety
/// 1. `func` is a live function whose parameters are exactly the pointed-to values of
///    `params`, which stay valid for the call;
/// 2. `stream` is a live stream of the current context; whatever the kernel touches stays
///    alive until it completes (cuLaunchKernel).
pub(crate) unsafe fn launch_kernel(
    func: sys::CUfunction,
    grid: u32,
    block: u32,
    stream: CUstream,
    params: &mut [*mut c_void],
) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the contract above.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            func,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            ptr::null_mut(),
        )
    })
}

/// cuCtxEnablePeerAccess: lets the current context access memory of `peer` (cuMemAlloc
/// memory, for kernels and UVA copies). `Ok(false)` when access was already enabled
/// (CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED), `Ok(true)` when this call enabled it.
///
/// # Safety
/// 1. `peer` is a live context of another device (cuCtxEnablePeerAccess).
pub(crate) unsafe fn ctx_enable_peer_access(peer: CUcontext) -> Result<bool, DeviceError> {
    // SAFETY: the caller upholds the contract above; flags must be 0.
    let r = unsafe { sys::cuCtxEnablePeerAccess(peer, 0) };
    if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(false);
    }
    check("cuCtxEnablePeerAccess", r).map(|()| true)
}

/// cuDeviceGetP2PAttribute between devices `src` and `dst` (ordinals).
pub(crate) fn device_p2p_attribute(
    attr: sys::CUdevice_P2PAttribute,
    src: usize,
    dst: usize,
) -> Result<i32, DeviceError> {
    let (ds, dd) = (device_get(src)?, device_get(dst)?);
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer; both devices come from cuDeviceGet.
    check("cuDeviceGetP2PAttribute", unsafe {
        sys::cuDeviceGetP2PAttribute(&mut v, attr, ds, dd)
    })?;
    Ok(v)
}

/// The raw peer-attribute enum.
pub(crate) use sys::CUdevice_P2PAttribute as P2pAttr;

/// cuMemcpyPeerAsync of `bytes` from `src` in context `src_ctx` to `dst` in `dst_ctx`, on
/// `stream` (works without peer access: the driver stages through the host then).
///
/// # Safety
/// 1. Both ranges lie inside live device allocations of their contexts that stay alive until
///    the copy completes; both contexts are live;
/// 2. `stream` is a live stream of the current context (cuMemcpyPeerAsync).
pub(crate) unsafe fn memcpy_peer_async(
    dst: u64,
    dst_ctx: CUcontext,
    src: u64,
    src_ctx: CUcontext,
    bytes: usize,
    stream: CUstream,
) -> Result<(), DeviceError> {
    // SAFETY: the caller upholds the contract above.
    check("cuMemcpyPeerAsync", unsafe {
        sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, bytes, stream)
    })
}
