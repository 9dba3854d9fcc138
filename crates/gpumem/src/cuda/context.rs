//! The RAII family over the driver layer ([`super::driver`]), as in cudarc: a [`CudaContext`]
//! (a device's primary context), and a [`Stream`], [`Event`] and [`DeviceBuffer`] that each
//! hold a clone of their context, so the context outlives them. [`super::CudaDevice`], the
//! pool's [`super::CudaEvents`] and pinned host memory ([`crate::pinned`]) all build on these.
//!
//! Every method binds the context to the calling thread first (cuCtxSetCurrent), so the
//! types may be used from any thread.
use std::ffi::c_void;
use std::sync::Arc;

use gpumem_core::DeviceError;

use super::driver::{self, CUcontext, CUdevice, CUevent, CUstream};
use super::{guarded, init, CudaError};

/// A device's primary context (cuDevicePrimaryCtxRetain), released (cuDevicePrimaryCtxRelease)
/// when the last clone is dropped. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CudaContext {
    inner: Arc<Retained>,
}

#[derive(Debug)]
struct Retained {
    ordinal: usize,
    dev: CUdevice,
    ctx: CUcontext,
}

// SAFETY: a primary context may be made current on any thread (the driver API is
// thread-safe); the handles are only read.
unsafe impl Send for Retained {}
// SAFETY: as above.
unsafe impl Sync for Retained {}

impl Drop for Retained {
    fn drop(&mut self) {
        // SAFETY: matches the one retain in `CudaContext::new`; every user of the context holds
        // an `Arc` to this, so none is left.
        let _ = unsafe { driver::primary_ctx_release(self.dev) };
    }
}

impl CudaContext {
    /// Retains the primary context of device `ordinal`, loading the driver first.
    ///
    /// # Errors
    /// [`CudaError::NoDriver`] without a driver (or with `GPUMEM_NO_CUDA` set),
    /// [`CudaError::Unusable`] if it lacks a function, [`CudaError::Device`] if the device
    /// does not exist (cuDeviceGet) or its context cannot be retained.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        init()?;
        guarded(|| Self::retain(ordinal).map_err(CudaError::from))
    }

    /// As [`CudaContext::new`], once [`init`] succeeded.
    pub(crate) fn retain(ordinal: usize) -> Result<Self, DeviceError> {
        let dev = driver::device_get(ordinal)?;
        // SAFETY: `dev` comes from cuDeviceGet; released once by `Retained::drop`.
        let ctx = unsafe { driver::primary_ctx_retain(dev)? };
        Ok(Self {
            inner: Arc::new(Retained { ordinal, dev, ctx }),
        })
    }

    /// Makes this context current on the calling thread (cuCtxSetCurrent).
    ///
    /// # Errors
    /// A failed cuCtxSetCurrent.
    pub fn bind(&self) -> Result<(), DeviceError> {
        // SAFETY: the context is retained while `self` lives.
        unsafe { driver::ctx_set_current(self.inner.ctx) }
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The device's name (cuDeviceGetName).
    ///
    /// # Errors
    /// A failed driver call.
    pub fn name(&self) -> Result<String, DeviceError> {
        driver::device_name(self.inner.dev)
    }

    /// The device's PCI bus id, e.g. `0000:3B:00.0` (cuDeviceGetPCIBusId).
    ///
    /// # Errors
    /// A failed driver call.
    pub fn pci_bus_id(&self) -> Result<String, DeviceError> {
        driver::device_pci_bus_id(self.inner.dev)
    }

    /// Number of streaming multiprocessors (at least 1).
    ///
    /// # Errors
    /// A failed cuDeviceGetAttribute.
    pub fn sm_count(&self) -> Result<u32, DeviceError> {
        let v = driver::device_attribute(
            self.inner.dev,
            driver::DeviceAttr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        Ok(u32::try_from(v.max(1)).unwrap_or(1))
    }

    /// Whether `other` is the same context (so events and streams of one work with the
    /// other).
    pub fn same_context(&self, other: &CudaContext) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner) || self.inner.ctx == other.inner.ctx
    }

    pub(crate) fn device_raw(&self) -> CUdevice {
        self.inner.dev
    }

    pub(crate) fn context_raw(&self) -> CUcontext {
        self.inner.ctx
    }
}

/// Device memory from cuMemAlloc, freed by cuMemFree on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
    ctx: CudaContext,
}

impl DeviceBuffer {
    /// Allocates `bytes` bytes (uninitialised) with cuMemAlloc.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] for 0 bytes, [`DeviceError::OutOfMemory`] or another failed
    /// driver call.
    pub fn new(ctx: &CudaContext, bytes: usize) -> Result<Self, DeviceError> {
        if bytes == 0 {
            return Err(DeviceError::Invalid {
                call: "cuMemAlloc",
                detail: "a device buffer of 0 B".into(),
            });
        }
        ctx.bind()?;
        let ptr = driver::mem_alloc(bytes as u64)?;
        Ok(Self {
            ptr,
            bytes,
            ctx: ctx.clone(),
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

    /// Checks that `[offset, offset + len)` lies inside the buffer.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] naming `call` when it does not.
    pub fn check_range(
        &self,
        call: &'static str,
        offset: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(()),
            _ => Err(DeviceError::Invalid {
                call,
                detail: format!(
                    "{len} B at offset {offset} B pass the end of a {} B device buffer",
                    self.bytes
                ),
            }),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Errors cannot be reported from Drop; cuMemFree synchronises the device first.
        if self.ctx.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once.
            let _ = unsafe { driver::mem_free(self.ptr) };
        }
    }
}

/// A non-blocking stream (cuStreamCreate with CU_STREAM_NON_BLOCKING), destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    raw: CUstream,
    ctx: CudaContext,
}

// SAFETY: a CUstream handle may be used from any thread (the driver API is thread-safe);
// every method binds the context first.
unsafe impl Send for Stream {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream that does not synchronise with the legacy default stream.
    ///
    /// # Errors
    /// A failed cuCtxSetCurrent or cuStreamCreate.
    pub fn new(ctx: &CudaContext) -> Result<Self, DeviceError> {
        ctx.bind()?;
        let raw = driver::stream_create()?;
        Ok(Self {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// The stream id to pass to a pool (the `CUstream` as an integer; owned by `self`).
    pub fn id(&self) -> u64 {
        self.raw as u64
    }

    /// The context this stream belongs to.
    pub fn context(&self) -> &CudaContext {
        &self.ctx
    }

    /// The raw handle (owned by `self`).
    pub(crate) fn raw(&self) -> CUstream {
        self.raw
    }

    /// Waits until all work queued on the stream is done (cuStreamSynchronize).
    ///
    /// # Errors
    /// A failed driver call, including errors of earlier asynchronous work.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live stream of this context.
        unsafe { driver::stream_synchronize(self.raw) }
    }

    /// Makes later work on this stream wait for `event`'s last record (cuStreamWaitEvent).
    ///
    /// # Errors
    /// A failed driver call.
    pub fn wait_event(&self, event: &Event) -> Result<(), DeviceError> {
        self.ctx.bind()?;
        // SAFETY: both handles are live and belong to this context.
        unsafe { driver::stream_wait_event(self.raw, event.raw) }
    }

    /// Queues a host-to-device copy (cuMemcpyHtoDAsync).
    ///
    /// # Errors
    /// A failed driver call.
    ///
    /// # Safety
    /// 1. `[src, src + len)` is readable host memory that stays valid and unchanged until
    ///    the copy completes (synchronise the stream or an event recorded after it).
    /// 2. `[dst, dst + len)` lies inside a live device allocation.
    pub unsafe fn copy_h2d_raw(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> Result<(), DeviceError> {
        self.ctx.bind()?;
        // SAFETY: the caller upholds 1 and 2; `raw` is a live stream of this context.
        unsafe { driver::memcpy_htod_async(dst, src, len, self.raw) }
    }

    /// Queues a device-to-host copy (cuMemcpyDtoHAsync).
    ///
    /// # Errors
    /// A failed driver call.
    ///
    /// # Safety
    /// 1. `[dst, dst + len)` is writable host memory that stays valid, and is neither read
    ///    nor written by anyone else, until the copy completes.
    /// 2. `[src, src + len)` lies inside a live device allocation.
    pub unsafe fn copy_d2h_raw(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
    ) -> Result<(), DeviceError> {
        self.ctx.bind()?;
        // SAFETY: the caller upholds 1 and 2; `raw` is a live stream of this context.
        unsafe { driver::memcpy_dtoh_async(dst, src, len, self.raw) }
    }

    /// Queues a device-to-device copy (cuMemcpyDtoDAsync); with a mapped host address as
    /// `src` or `dst`, the copy reads or writes host memory over PCIe.
    ///
    /// # Errors
    /// A failed driver call.
    ///
    /// # Safety
    /// 1. Both ranges lie inside live device (or mapped host) allocations, which stay alive
    ///    until the copy completes.
    pub unsafe fn copy_d2d_raw(&self, dst: u64, src: u64, len: usize) -> Result<(), DeviceError> {
        self.ctx.bind()?;
        // SAFETY: the caller upholds 1; `raw` is a live stream of this context.
        unsafe { driver::memcpy_dtod_async(dst, src, len, self.raw) }
    }

    /// Copies `src` to device memory and waits for the copy (cuMemcpyHtoDAsync +
    /// cuStreamSynchronize). Works for pageable and pinned `src`.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] if `dst_offset + src.len()` passes the end of `dst`; a failed
    /// driver call.
    pub fn copy_h2d(
        &self,
        dst: &DeviceBuffer,
        dst_offset: usize,
        src: &[u8],
    ) -> Result<(), DeviceError> {
        dst.check_range("cuMemcpyHtoDAsync", dst_offset, src.len())?;
        // SAFETY: `src` is borrowed until the synchronisation below; the range was checked.
        unsafe { self.copy_h2d_raw(dst.ptr + dst_offset as u64, src.as_ptr(), src.len())? };
        self.synchronize()
    }

    /// Copies device memory into `dst` and waits for the copy.
    ///
    /// # Errors
    /// As [`Stream::copy_h2d`].
    pub fn copy_d2h(
        &self,
        dst: &mut [u8],
        src: &DeviceBuffer,
        src_offset: usize,
    ) -> Result<(), DeviceError> {
        src.check_range("cuMemcpyDtoHAsync", src_offset, dst.len())?;
        // SAFETY: `dst` is borrowed mutably until the synchronisation below; range checked.
        unsafe { self.copy_d2h_raw(dst.as_mut_ptr(), src.ptr + src_offset as u64, dst.len())? };
        self.synchronize()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `raw` is a live stream destroyed once; pending work still completes.
            let _ = unsafe { driver::stream_destroy(self.raw) };
        }
    }
}

/// A CUDA event (cuEventCreate), destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: CUevent,
    ctx: CudaContext,
    recorded: bool,
}

// SAFETY: a CUevent handle may be used from any thread; every method binds the context.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event; `timing` false gives CU_EVENT_DISABLE_TIMING (cheaper to record
    /// and query).
    ///
    /// # Errors
    /// A failed driver call.
    pub fn new(ctx: &CudaContext, timing: bool) -> Result<Self, DeviceError> {
        ctx.bind()?;
        let raw = driver::event_create_timed(timing)?;
        Ok(Self {
            raw,
            ctx: ctx.clone(),
            recorded: false,
        })
    }

    /// The context the event belongs to.
    pub fn context(&self) -> &CudaContext {
        &self.ctx
    }

    /// Records the event on `stream` (cuEventRecord).
    ///
    /// # Errors
    /// A failed driver call.
    pub fn record(&mut self, stream: &Stream) -> Result<(), DeviceError> {
        self.ctx.bind()?;
        // SAFETY: both handles are live and belong to this context.
        unsafe { driver::event_record(self.raw, stream.raw) }?;
        self.recorded = true;
        Ok(())
    }

    /// Waits for the work before the last record (cuEventSynchronize); returns at once if
    /// never recorded.
    ///
    /// # Errors
    /// A failed driver call.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        if !self.recorded {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: `raw` is a live event.
        unsafe { driver::event_synchronize(self.raw) }
    }

    /// Whether the work before the last record is done (cuEventQuery); true if never
    /// recorded.
    ///
    /// # Errors
    /// A failed driver call other than CUDA_ERROR_NOT_READY.
    pub fn query(&self) -> Result<bool, DeviceError> {
        if !self.recorded {
            return Ok(true);
        }
        self.ctx.bind()?;
        // SAFETY: `raw` is a live event.
        unsafe { driver::event_query(self.raw) }
    }

    /// Milliseconds between `start` and `self`, both recorded with timing and completed
    /// (cuEventElapsedTime).
    ///
    /// # Errors
    /// A failed driver call.
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32, DeviceError> {
        self.ctx.bind()?;
        // SAFETY: both events are live.
        unsafe { driver::event_elapsed_time(start.raw, self.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `raw` is a live event destroyed once.
            let _ = unsafe { driver::event_destroy(self.raw) };
        }
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

/// The `copy16` kernel, loaded from [`COPY16_PTX`] (cuModuleLoadData), unloaded on drop.
#[derive(Debug)]
pub struct CopyKernel {
    module: driver::Module,
    func: driver::Function,
    sms: u32,
    ctx: CudaContext,
}

// SAFETY: module and function handles may be used from any thread; methods bind first.
unsafe impl Send for CopyKernel {}

impl CopyKernel {
    /// JIT-compiles and loads the kernel.
    ///
    /// # Errors
    /// A failed driver call (CUDA_ERROR_INVALID_PTX, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, ...).
    pub fn load(ctx: &CudaContext) -> Result<Self, DeviceError> {
        ctx.bind()?;
        let image = std::ffi::CString::new(COPY16_PTX).map_err(|_| DeviceError::Invalid {
            call: "cuModuleLoadData",
            detail: "the PTX holds a NUL".into(),
        })?;
        let module = driver::module_load_data(&image)?;
        // SAFETY: `module` was just loaded in the current context.
        let func = match unsafe { driver::module_get_function(module, c"copy16") } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: unloading the module loaded above, unused elsewhere.
                let _ = unsafe { driver::module_unload(module) };
                return Err(e);
            }
        };
        let sms = match ctx.sm_count() {
            Ok(n) => n,
            Err(e) => {
                // SAFETY: as above.
                let _ = unsafe { driver::module_unload(module) };
                return Err(e);
            }
        };
        Ok(Self {
            module,
            func,
            sms,
            ctx: ctx.clone(),
        })
    }

    /// The context the kernel is loaded in.
    pub fn context(&self) -> &CudaContext {
        &self.ctx
    }

    /// Queues a copy of `bytes` bytes (rounded down to 16) from `src` to `dst`, device
    /// addresses (mapped host addresses included), on `stream` (cuLaunchKernel): 256
    /// threads a block, at most 8 blocks per SM.
    ///
    /// # Errors
    /// A failed driver call.
    ///
    /// # Safety
    /// 1. Both ranges are live device or mapped-host allocations, 16-byte aligned, that stay
    ///    alive until the kernel completes.
    /// 2. The ranges do not overlap.
    pub unsafe fn launch(
        &self,
        stream: &Stream,
        dst: u64,
        src: u64,
        bytes: usize,
    ) -> Result<(), DeviceError> {
        self.ctx.bind()?;
        let mut src = src;
        let mut dst = dst;
        let mut n16 = (bytes / 16) as u64;
        let block = 256u32;
        let blocks_needed = n16.div_ceil(u64::from(block)).max(1);
        let grid = u32::try_from(blocks_needed.min(u64::from(self.sms) * 8)).unwrap_or(u32::MAX);
        let mut params = [
            (&mut src as *mut u64).cast::<c_void>(),
            (&mut dst as *mut u64).cast::<c_void>(),
            (&mut n16 as *mut u64).cast::<c_void>(),
        ];
        // SAFETY: `params` points at the kernel's three u64 parameters, alive for the call;
        // the caller upholds 1 and 2 for what the kernel touches.
        unsafe { driver::launch_kernel(self.func, grid, block, stream.raw, &mut params) }
    }
}

impl Drop for CopyKernel {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: the module is live and unloaded once.
            let _ = unsafe { driver::module_unload(self.module) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_declares_the_kernel() {
        assert!(COPY16_PTX.contains(".visible .entry copy16("));
        assert_eq!(
            COPY16_PTX.matches('{').count(),
            COPY16_PTX.matches('}').count()
        );
    }
}
