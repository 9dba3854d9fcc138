//! The small part of the CUDA driver API that pinned memory needs, through cudarc's
//! `sys`/`result` layers (loaded at run time): a context, device buffers, streams, events,
//! async copies. Kept separate from [`crate::cuda`] so that the two can be unified later.
//!
//! Every entry point first checks that `libcuda.so` can be loaded ([`cuda_available`]); without
//! it every constructor returns [`PinnedError::NoDriver`] instead of panicking inside cudarc.

use super::{PinnedError, Result};
use cudarc::driver::result::DriverError;
use cudarc::driver::{result, sys, CudaContext};
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

/// Maps a driver error of `call` to [`PinnedError::Cuda`] with the CUDA error name.
pub(crate) fn cuda_err(call: &'static str) -> impl Fn(DriverError) -> PinnedError {
    move |e| PinnedError::Cuda {
        call,
        name: format!("{:?}", e.0),
    }
}

/// The driver entry points this module (and the part of cudarc it uses) calls.
const REQUIRED_SYMBOLS: [&str; 32] = [
    "cuInit",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceGetPCIBusId",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
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
];

/// Whether the CUDA driver library loads, exports every entry point used here, and `cuInit`
/// succeeds; the answer is computed once.
///
/// # Errors
/// [`PinnedError::NoDriver`] naming the libraries searched, or the `cuInit` error.
pub fn cuda_available() -> Result<()> {
    static STATE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            // SAFETY: is_culib_present only tries to dlopen the candidate names.
            if !unsafe { sys::is_culib_present() } {
                return Err("searched libcuda.so, libcuda.so.1 and the versioned names \
                            cudarc tries; none could be loaded (no NVIDIA driver?)"
                    .to_string());
            }
            // cudarc panics when it calls a symbol the driver lacks: look for every one this
            // module calls first, and name the missing ones.
            let missing: Vec<&str> = REQUIRED_SYMBOLS
                .iter()
                .copied()
                // SAFETY: only looks symbols up in the library found above.
                .filter(|name| {
                    unsafe { sys::culib().get::<*const c_void>(name.as_bytes()) }.is_err()
                })
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "the CUDA driver library lacks {} (driver too old?)",
                    missing.join(", ")
                ));
            }
            match std::panic::catch_unwind(result::init) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("cuInit failed: {:?}", e.0)),
                Err(_) => Err("the CUDA driver library lacks a symbol cudarc needs".to_string()),
            }
        })
        .clone()
        .map_err(|detail| PinnedError::NoDriver { detail })
}

/// A CUDA device and its primary context (`cuDevicePrimaryCtxRetain`), bound to the calling
/// thread by every method that calls the driver. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CudaHost {
    ctx: Arc<CudaContext>,
}

impl CudaHost {
    /// Opens device `ordinal`.
    ///
    /// # Errors
    /// [`PinnedError::NoDriver`] without a driver; [`PinnedError::Cuda`] if the device does not
    /// exist or its context cannot be retained.
    pub fn new(ordinal: usize) -> Result<Self> {
        cuda_available()?;
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("cuDevicePrimaryCtxRetain"))?;
        Ok(Self { ctx })
    }

    /// Makes this context current on the calling thread (`cuCtxSetCurrent`).
    ///
    /// # Errors
    /// [`PinnedError::Cuda`].
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("cuCtxSetCurrent"))
    }

    /// The device's name (`cuDeviceGetName`).
    ///
    /// # Errors
    /// [`PinnedError::Cuda`].
    pub fn name(&self) -> Result<String> {
        self.ctx.name().map_err(cuda_err("cuDeviceGetName"))
    }

    /// The device's PCI bus id, e.g. `0000:3B:00.0` (`cuDeviceGetPCIBusId`).
    ///
    /// # Errors
    /// [`PinnedError::Cuda`].
    pub fn pci_bus_id(&self) -> Result<String> {
        let mut buf = [0 as std::ffi::c_char; 32];
        // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into `buf`.
        unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), 32, self.ctx.cu_device()) }
            .result()
            .map_err(cuda_err("cuDeviceGetPCIBusId"))?;
        // SAFETY: the driver NUL-terminated the string inside `buf`.
        let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        Ok(s.to_string_lossy().into_owned())
    }

    /// Number of streaming multiprocessors.
    ///
    /// # Errors
    /// [`PinnedError::Cuda`].
    pub fn sm_count(&self) -> Result<u32> {
        self.ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map(|v| v.max(1) as u32)
            .map_err(cuda_err("cuDeviceGetAttribute"))
    }

    /// Whether `other` is the same context (so events and streams of one work with the
    /// other).
    pub fn same_device_context(&self, other: &CudaHost) -> bool {
        Arc::ptr_eq(&self.ctx, &other.ctx) || self.ctx.cu_ctx() == other.ctx.cu_ctx()
    }

    /// The cudarc context, for callers that need more of the driver.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

/// Device memory from `cuMemAlloc`, freed by `cuMemFree` on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    host: CudaHost,
}

impl DeviceBuffer {
    /// Allocates `bytes` bytes (uninitialised) with `cuMemAlloc`.
    ///
    /// # Errors
    /// [`PinnedError::Cuda`] (`CUDA_ERROR_OUT_OF_MEMORY`, ...); [`PinnedError::InvalidArgument`]
    /// for 0 bytes.
    pub fn new(host: &CudaHost, bytes: usize) -> Result<Self> {
        if bytes == 0 {
            return Err(PinnedError::InvalidArgument(
                "a device buffer of 0 B".into(),
            ));
        }
        host.bind()?;
        // SAFETY: cuMemAlloc with a current context; the memory is only ever used as bytes.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(cuda_err("cuMemAlloc"))?;
        Ok(Self {
            ptr,
            bytes,
            host: host.clone(),
        })
    }

    /// Device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the length is 0 (never: a device buffer has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Errors cannot be reported from Drop; cuMemFree synchronises the device first.
        if self.host.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// A non-blocking stream (`cuStreamCreate(CU_STREAM_NON_BLOCKING)`), destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    raw: sys::CUstream,
    host: CudaHost,
}

// SAFETY: a CUstream handle may be used from any thread (the driver API is thread-safe).
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream that does not synchronise with the legacy default stream.
    ///
    /// # Errors
    /// [`PinnedError::Cuda`].
    pub fn new(host: &CudaHost) -> Result<Self> {
        host.bind()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(cuda_err("cuStreamCreate"))?;
        Ok(Self {
            raw,
            host: host.clone(),
        })
    }

    /// The raw handle, for driver calls; owned by `self`.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The device this stream belongs to.
    pub fn host(&self) -> &CudaHost {
        &self.host
    }

    /// Waits until all work queued on the stream is done (`cuStreamSynchronize`).
    ///
    /// # Errors
    /// [`PinnedError::Cuda`], including errors of earlier asynchronous work.
    pub fn synchronize(&self) -> Result<()> {
        self.host.bind()?;
        // SAFETY: `raw` is a live stream of this context.
        unsafe { result::stream::synchronize(self.raw) }.map_err(cuda_err("cuStreamSynchronize"))
    }

    /// Makes later work on this stream wait for `event`'s last record (`cuStreamWaitEvent`).
    ///
    /// # Errors
    /// [`PinnedError::Cuda`].
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.host.bind()?;
        // SAFETY: both handles are live and belong to this context.
        unsafe {
            result::stream::wait_event(
                self.raw,
                event.raw,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(cuda_err("cuStreamWaitEvent"))
    }

    /// Queues a host-to-device copy (`cuMemcpyHtoDAsync`).
    ///
    /// # Safety
    /// 1. `[src, src + len)` is readable host memory that stays valid and unchanged until
    ///    the copy completes (synchronise the stream or an event recorded after it).
    /// 2. `[dst, dst + len)` lies inside a live device allocation.
    pub unsafe fn copy_h2d_raw(&self, dst: u64, src: *const u8, len: usize) -> Result<()> {
        self.host.bind()?;
        sys::cuMemcpyHtoDAsync_v2(dst, src.cast::<c_void>(), len, self.raw)
            .result()
            .map_err(cuda_err("cuMemcpyHtoDAsync"))
    }

    /// Queues a device-to-host copy (`cuMemcpyDtoHAsync`).
    ///
    /// # Safety
    /// 1. `[dst, dst + len)` is writable host memory that stays valid, and is neither read
    ///    nor written by anyone else, until the copy completes.
    /// 2. `[src, src + len)` lies inside a live device allocation.
    pub unsafe fn copy_d2h_raw(&self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
        self.host.bind()?;
        sys::cuMemcpyDtoHAsync_v2(dst.cast::<c_void>(), src, len, self.raw)
            .result()
            .map_err(cuda_err("cuMemcpyDtoHAsync"))
    }

    /// Queues a device-to-device copy (`cuMemcpyDtoDAsync`); with a mapped host address as
    /// `src` or `dst`, the copy reads or writes host memory over PCIe.
    ///
    /// # Safety
    /// Both ranges lie inside live device (or mapped host) allocations, which stay alive
    /// until the copy completes.
    pub unsafe fn copy_d2d_raw(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        self.host.bind()?;
        sys::cuMemcpyDtoDAsync_v2(dst, src, len, self.raw)
            .result()
            .map_err(cuda_err("cuMemcpyDtoDAsync"))
    }

    /// Copies `src` to device memory and waits for the copy (`cuMemcpyHtoDAsync` +
    /// `cuStreamSynchronize`). Works for pageable and pinned `src`.
    ///
    /// # Errors
    /// [`PinnedError::InvalidArgument`] if `dst_offset + src.len()` passes the end of `dst`;
    /// [`PinnedError::Cuda`].
    pub fn copy_h2d(&self, dst: &DeviceBuffer, dst_offset: usize, src: &[u8]) -> Result<()> {
        check_range(dst, dst_offset, src.len())?;
        // SAFETY: `src` is borrowed until the synchronisation below; the range was checked.
        unsafe { self.copy_h2d_raw(dst.ptr + dst_offset as u64, src.as_ptr(), src.len())? };
        self.synchronize()
    }

    /// Copies device memory into `dst` and waits for the copy.
    ///
    /// # Errors
    /// As [`Stream::copy_h2d`].
    pub fn copy_d2h(&self, dst: &mut [u8], src: &DeviceBuffer, src_offset: usize) -> Result<()> {
        check_range(src, src_offset, dst.len())?;
        // SAFETY: `dst` is borrowed mutably until the synchronisation below.
        unsafe { self.copy_d2h_raw(dst.as_mut_ptr(), src.ptr + src_offset as u64, dst.len())? };
        self.synchronize()
    }
}

/// Checks that `[offset, offset + len)` lies inside `buf`.
pub(crate) fn check_range(buf: &DeviceBuffer, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= buf.bytes => Ok(()),
        _ => Err(PinnedError::InvalidArgument(format!(
            "{len} B at offset {offset} B pass the end of a {} B device buffer",
            buf.bytes
        ))),
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.host.bind().is_ok() {
            // SAFETY: `raw` is a live stream destroyed once; pending work still completes.
            let _ = unsafe { result::stream::destroy(self.raw) };
        }
    }
}

/// A CUDA event (`cuEventCreate`), destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
    host: CudaHost,
    recorded: bool,
}

// SAFETY: a CUevent handle may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event; `timing` false gives `CU_EVENT_DISABLE_TIMING` (cheaper to record
    /// and query).
    ///
    /// # Errors
    /// [`PinnedError::Cuda`].
    pub fn new(host: &CudaHost, timing: bool) -> Result<Self> {
        host.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let raw = result::event::create(flags).map_err(cuda_err("cuEventCreate"))?;
        Ok(Self {
            raw,
            host: host.clone(),
            recorded: false,
        })
    }

    /// The device whose context the event belongs to.
    pub fn host(&self) -> &CudaHost {
        &self.host
    }

    /// Records the event on `stream` (`cuEventRecord`).
    ///
    /// # Errors
    /// [`PinnedError::Cuda`].
    pub fn record(&mut self, stream: &Stream) -> Result<()> {
        self.host.bind()?;
        // SAFETY: both handles are live and belong to this context.
        unsafe { result::event::record(self.raw, stream.raw) }
            .map_err(cuda_err("cuEventRecord"))?;
        self.recorded = true;
        Ok(())
    }

    /// Waits for the work before the last record (`cuEventSynchronize`); returns at once if
    /// never recorded.
    ///
    /// # Errors
    /// [`PinnedError::Cuda`].
    pub fn synchronize(&self) -> Result<()> {
        if !self.recorded {
            return Ok(());
        }
        self.host.bind()?;
        // SAFETY: `raw` is a live event.
        unsafe { result::event::synchronize(self.raw) }.map_err(cuda_err("cuEventSynchronize"))
    }

    /// Whether the work before the last record is done (`cuEventQuery`); true if never recorded.
    ///
    /// # Errors
    /// [`PinnedError::Cuda`] for errors other than `CUDA_ERROR_NOT_READY`.
    pub fn query(&self) -> Result<bool> {
        if !self.recorded {
            return Ok(true);
        }
        self.host.bind()?;
        // SAFETY: `raw` is a live event.
        match unsafe { result::event::query(self.raw) } {
            Ok(()) => Ok(true),
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(e) => Err(cuda_err("cuEventQuery")(e)),
        }
    }

    /// Milliseconds between `start` and `self`, both recorded with timing and completed
    /// (`cuEventElapsedTime`).
    ///
    /// # Errors
    /// [`PinnedError::Cuda`].
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        self.host.bind()?;
        type ElapsedFn =
            unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;
        // CUDA 12.8 added cuEventElapsedTime_v2 and CUDA 13 headers use it; take whichever the
        // driver exports rather than let a missing symbol panic inside cudarc.
        static ELAPSED: OnceLock<Option<ElapsedFn>> = OnceLock::new();
        let f = ELAPSED.get_or_init(|| {
            // SAFETY: the library is loaded (cuda_available succeeded before any Event
            // existed); both symbols have this signature in cuda.h.
            unsafe {
                let lib = sys::culib();
                lib.get::<ElapsedFn>(b"cuEventElapsedTime_v2")
                    .or_else(|_| lib.get::<ElapsedFn>(b"cuEventElapsedTime"))
                    .map(|s| *s)
                    .ok()
            }
        });
        let f = f.ok_or_else(|| PinnedError::Cuda {
            call: "cuEventElapsedTime",
            name: "symbol not found in the driver".into(),
        })?;
        let mut ms = 0f32;
        // SAFETY: both events are live; `ms` is a valid out pointer.
        unsafe { f(&mut ms, start.raw, self.raw) }
            .result()
            .map_err(cuda_err("cuEventElapsedTime"))?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.host.bind().is_ok() {
            // SAFETY: `raw` is a live event destroyed once.
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}

impl super::Fence for Event {
    fn is_complete(&self) -> Result<bool> {
        self.query()
    }
}

/// PTX of `copy16(src, dst, n16)`: a grid-stride loop copying `n16` 16-byte words from `src`
/// to `dst`. With a mapped host pointer as `src` the kernel reads host memory over PCIe
/// (zero-copy); as `dst`, it writes it. JIT-compiled by the driver for the actual GPU.
pub const COPY16_PTX: &str = r#".version 7.0
.target sm_75
.address_size 64

.visible .entry copy16(
    .param .u64 copy16_src,
    .param .u64 copy16_dst,
    .param .u64 copy16_n16
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<10>;
    .reg .b64 %rd<12>;

    ld.param.u64 %rd1, [copy16_src];
    ld.param.u64 %rd2, [copy16_dst];
    ld.param.u64 %rd3, [copy16_n16];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.s64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
$L_loop:
    setp.ge.u64 %p1, %rd4, %rd3;
    @%p1 bra $L_done;
    shl.b64 %rd7, %rd4, 4;
    add.s64 %rd8, %rd1, %rd7;
    add.s64 %rd9, %rd2, %rd7;
    ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd8];
    st.global.v4.u32 [%rd9], {%r5, %r6, %r7, %r8};
    add.s64 %rd4, %rd4, %rd6;
    bra.uni $L_loop;
$L_done:
    ret;
}
"#;

/// The `copy16` kernel, loaded from [`COPY16_PTX`] (`cuModuleLoadData`).
#[derive(Debug)]
pub struct CopyKernel {
    module: sys::CUmodule,
    func: sys::CUfunction,
    sms: u32,
    host: CudaHost,
}

// SAFETY: module and function handles may be used from any thread.
unsafe impl Send for CopyKernel {}

impl CopyKernel {
    /// JIT-compiles and loads the kernel.
    ///
    /// # Errors
    /// [`PinnedError::Cuda`] (`CUDA_ERROR_INVALID_PTX`, `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, ...).
    pub fn load(host: &CudaHost) -> Result<Self> {
        host.bind()?;
        let image = std::ffi::CString::new(COPY16_PTX)
            .map_err(|_| PinnedError::Internal("PTX holds a NUL".into()))?;
        // SAFETY: `image` is a NUL-terminated PTX text that outlives the call.
        let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
            .map_err(cuda_err("cuModuleLoadData"))?;
        let name = std::ffi::CString::new("copy16")
            .map_err(|_| PinnedError::Internal("kernel name holds a NUL".into()))?;
        // SAFETY: `module` is live; `name` is NUL-terminated.
        let func = match unsafe { result::module::get_function(module, name) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: unloading the module loaded above, unused elsewhere.
                let _ = unsafe { result::module::unload(module) };
                return Err(cuda_err("cuModuleGetFunction")(e));
            }
        };
        Ok(Self {
            module,
            func,
            sms: host.sm_count()?,
            host: host.clone(),
        })
    }

    /// Queues a copy of `bytes` bytes (rounded down to 16) from `src` to `dst`, device
    /// addresses (mapped host addresses included), on `stream` (`cuLaunchKernel`).
    ///
    /// # Safety
    /// 1. Both ranges are live device or mapped-host allocations, 16-byte aligned, that stay
    ///    alive until the kernel completes.
    /// 2. The ranges do not overlap.
    pub unsafe fn launch(&self, stream: &Stream, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.host.bind()?;
        let mut src = src;
        let mut dst = dst;
        let mut n16 = (bytes / 16) as u64;
        let block = 256u32;
        let blocks_needed = n16.div_ceil(u64::from(block)).max(1);
        let grid = blocks_needed.min(u64::from(self.sms) * 8) as u32;
        let mut params = [
            (&mut src as *mut u64).cast::<c_void>(),
            (&mut dst as *mut u64).cast::<c_void>(),
            (&mut n16 as *mut u64).cast::<c_void>(),
        ];
        result::launch_kernel(
            self.func,
            (grid, 1, 1),
            (block, 1, 1),
            0,
            stream.raw,
            &mut params,
        )
        .map_err(cuda_err("cuLaunchKernel"))
    }
}

impl Drop for CopyKernel {
    fn drop(&mut self) {
        if self.host.bind().is_ok() {
            // SAFETY: the module is live and unloaded once.
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_constructors_fail_cleanly() {
        match cuda_available() {
            Ok(()) => {} // a machine with a GPU: nothing to check here
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.starts_with("no CUDA driver found"), "{msg}");
                assert!(matches!(
                    CudaHost::new(0),
                    Err(PinnedError::NoDriver { .. })
                ));
            }
        }
    }

    #[test]
    fn error_names_are_cuda_names() {
        let e = cuda_err("cuMemHostAlloc")(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(
            e.to_string(),
            "cuMemHostAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"
        );
    }

    #[test]
    fn ptx_declares_the_kernel() {
        assert!(COPY16_PTX.contains(".visible .entry copy16("));
        assert_eq!(
            COPY16_PTX.matches('{').count(),
            COPY16_PTX.matches('}').count()
        );
    }
}
