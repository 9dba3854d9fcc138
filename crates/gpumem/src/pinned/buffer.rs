//! [`PinnedBuffer`] (cuMemHostAlloc or mmap + mlock) and [`HostRegistration`]
//! (cuMemHostRegister or mlock of the caller's memory, in chunks).

use super::locked::{map_locked, memlock_error, page_size, unmap_locked};
use super::{HostAllocFlags, PinnedError, Result};
use crate::cuda::driver;
use crate::cuda::CudaContext;
use std::ffi::c_void;
use std::ptr::NonNull;

/// Page-locked host memory, zero-initialised, freed only by its own `Drop`.
///
/// With CUDA it comes from `cuMemHostAlloc` with the given [`HostAllocFlags`] and goes back
/// through `cuMemFreeHost`; without a driver ([`PinnedBuffer::new_locked`]) it is anonymous
/// memory locked with `mlock` (DMA-able by nothing, but page-locked, so pool logic, caps and
/// statistics behave as they will with CUDA). Since the memory is only ever released by
/// `Drop`, handing it to `free` or `cudaFree` cannot be written.
#[derive(Debug)]
pub struct PinnedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

#[derive(Debug)]
enum Backing {
    Cuda {
        host: CudaContext,
        flags: HostAllocFlags,
        device_ptr: Option<u64>,
    },
    Locked {
        map_len: usize,
    },
}

// SAFETY: the buffer owns its memory exclusively, like a Vec<u8>.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access only reads through &[u8].
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` bytes of pinned memory with `cuMemHostAlloc(flags)` in `host`'s context
    /// and zeroes them; with `flags.mapped`, also looks up the device address
    /// (`cuMemHostGetDevicePointer`).
    ///
    /// # Errors
    /// [`PinnedError::InvalidArgument`] for 0 bytes; [`PinnedError::Cuda`] from the driver
    /// (`CUDA_ERROR_OUT_OF_MEMORY` when the OS refuses to pin that much).
    pub fn new_cuda(host: &CudaContext, len: usize, flags: HostAllocFlags) -> Result<Self> {
        if len == 0 {
            return Err(PinnedError::InvalidArgument(
                "a pinned buffer of 0 B".into(),
            ));
        }
        host.bind()?;
        // cuMemHostAlloc with a current context; the memory is zeroed below before any
        // slice is made of it.
        let raw = driver::mem_host_alloc(len, flags.to_cuda())?;
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| PinnedError::Internal("cuMemHostAlloc returned null".into()))?;
        // The buffer owns the memory from here on: an early return frees it.
        let mut buf = Self {
            ptr,
            len,
            backing: Backing::Cuda {
                host: host.clone(),
                flags,
                device_ptr: None,
            },
        };
        // SAFETY: [ptr, ptr + len) was just allocated and is writable.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        if flags.mapped {
            // SAFETY: `raw` was allocated with CU_MEMHOSTALLOC_DEVICEMAP in this context.
            let dptr = unsafe { driver::mem_host_get_device_pointer(raw) }?;
            if let Backing::Cuda { device_ptr, .. } = &mut buf.backing {
                *device_ptr = Some(dptr);
            }
        }
        Ok(buf)
    }

    /// Allocates `len` bytes of anonymous memory (`mmap`) locked with `mlock`: the fallback
    /// without CUDA. Zeroed.
    ///
    /// # Errors
    /// [`PinnedError::InvalidArgument`] for 0 bytes; [`PinnedError::MemlockLimit`] if
    /// `RLIMIT_MEMLOCK` refuses (the message names the limit and how to raise it);
    /// [`PinnedError::Os`] if `mmap` fails.
    pub fn new_locked(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(PinnedError::InvalidArgument(
                "a pinned buffer of 0 B".into(),
            ));
        }
        let (ptr, map_len) = map_locked(len)?;
        Ok(Self {
            ptr,
            len,
            backing: Backing::Locked { map_len },
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is 0 (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The flags it was allocated with (`None` for the mlock fallback).
    pub fn flags(&self) -> Option<HostAllocFlags> {
        match &self.backing {
            Backing::Cuda { flags, .. } => Some(*flags),
            Backing::Locked { .. } => None,
        }
    }

    /// Whether the memory came from the CUDA driver (and is therefore DMA-able).
    pub fn is_cuda(&self) -> bool {
        matches!(self.backing, Backing::Cuda { .. })
    }

    /// The device address of a mapped buffer (zero-copy: kernels and copies that use it read
    /// and write host memory over PCIe); `None` unless allocated with `flags.mapped`.
    pub fn device_ptr(&self) -> Option<u64> {
        match &self.backing {
            Backing::Cuda { device_ptr, .. } => *device_ptr,
            Backing::Locked { .. } => None,
        }
    }

    /// Raw pointer to the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Raw mutable pointer to the first byte.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for PinnedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: [ptr, ptr + len) is owned, initialised (zeroed at allocation) memory.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for PinnedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        match &self.backing {
            Backing::Cuda { host, .. } => {
                // Errors cannot be reported from Drop; a failed bind leaks rather than frees
                // in the wrong context.
                if host.bind().is_ok() {
                    // SAFETY: the pointer came from cuMemHostAlloc and is freed exactly once.
                    let _ = unsafe { driver::mem_free_host(self.ptr.as_ptr().cast::<c_void>()) };
                }
            }
            Backing::Locked { map_len } => {
                // SAFETY: the mapping came from map_locked and is released exactly once.
                unsafe { unmap_locked(self.ptr, *map_len) };
            }
        }
    }
}

/// Default largest piece registered by one call, in bytes (64 GiB): a single
/// `cuMemHostRegister` of ≥ 512 GiB fails on current drivers.
pub const DEFAULT_REGISTER_CHUNK_BYTES: usize = 64 << 30;

/// Memory the caller already holds, page-locked for as long as this value lives:
/// `cuMemHostRegister` with CUDA (then DMA-able), `mlock` without.
///
/// The range is registered in chunks of at most `chunk_bytes` whose inner boundaries fall on
/// page boundaries (two registrations never share a page). If a chunk fails, the chunks
/// registered before it are unregistered and the error names the chunk, its offset and the
/// CUDA (or OS) error.
#[derive(Debug)]
pub struct HostRegistration<'a> {
    chunks: Vec<(usize, usize)>,
    base: *const u8,
    len: usize,
    host: Option<CudaContext>,
    device_ptr: Option<u64>,
    _memory: std::marker::PhantomData<&'a mut [u8]>,
}

// SAFETY: holds only addresses of memory borrowed for 'a; unregistering may happen on any thread.
unsafe impl Send for HostRegistration<'_> {}

impl<'a> HostRegistration<'a> {
    /// Registers `memory` with `cuMemHostRegister(flags)` in `host`'s context, in chunks of at
    /// most `chunk_bytes` (rounded up to a page; [`DEFAULT_REGISTER_CHUNK_BYTES`] is a good
    /// default). `mapped` asks for `CU_MEMHOSTREGISTER_DEVICEMAP` (the device address of the
    /// start is then [`HostRegistration::device_ptr`]), `portable` for
    /// `CU_MEMHOSTREGISTER_PORTABLE`.
    ///
    /// # Errors
    /// [`PinnedError::InvalidArgument`] for an empty range or 0 chunk size;
    /// [`PinnedError::Register`] for the first chunk that failed (the others rolled back);
    /// [`PinnedError::Cuda`] if the device address cannot be read.
    pub fn new_cuda(
        host: &CudaContext,
        memory: &'a mut [u8],
        chunk_bytes: usize,
        portable: bool,
        mapped: bool,
    ) -> Result<Self> {
        host.bind()?;
        let mut flags = 0;
        if portable {
            flags |= driver::HOST_REGISTER_PORTABLE;
        }
        if mapped {
            flags |= driver::HOST_REGISTER_DEVICEMAP;
        }
        let mut reg = Self::register_with(
            memory,
            chunk_bytes,
            "cuMemHostRegister",
            Some(host),
            |addr, n| {
                // SAFETY: [addr, addr + n) lies inside `memory`, borrowed for 'a; registering
                // does not change its contents.
                unsafe { driver::mem_host_register(addr as *mut c_void, n, flags) }.map_err(|e| {
                    match e {
                        gpumem_core::DeviceError::Driver { name, .. } => name,
                        other => other.to_string(),
                    }
                })
            },
            |addr, _| {
                // SAFETY: `addr` starts a chunk registered just before.
                let _ = unsafe { driver::mem_host_unregister(addr as *mut c_void) };
            },
        )?;
        if mapped {
            // SAFETY: `base` lies in memory registered with CU_MEMHOSTREGISTER_DEVICEMAP.
            let dptr = unsafe {
                driver::mem_host_get_device_pointer(reg.base.cast_mut().cast::<c_void>())
            }?;
            reg.device_ptr = Some(dptr);
        }
        Ok(reg)
    }

    /// Locks `memory` with `mlock`, in chunks of at most `chunk_bytes`: the fallback without
    /// CUDA. Pages at the two ends that `memory` shares with other data are locked too, and
    /// unlocked on drop even if other data on them was locked separately.
    ///
    /// # Errors
    /// [`PinnedError::InvalidArgument`] for an empty range or 0 chunk size;
    /// [`PinnedError::Register`] for the first chunk `mlock` refused (earlier chunks unlocked;
    /// the message carries the OS error and `RLIMIT_MEMLOCK`).
    pub fn new_locked(memory: &'a mut [u8], chunk_bytes: usize) -> Result<Self> {
        Self::register_with(
            memory,
            chunk_bytes,
            "mlock",
            None,
            |addr, n| {
                // SAFETY: [addr, addr + n) lies inside `memory`; mlock does not change it.
                if unsafe { libc::mlock(addr as *const c_void, n) } == 0 {
                    Ok(())
                } else {
                    Err(memlock_error(n, std::io::Error::last_os_error()).to_string())
                }
            },
            |addr, n| {
                // SAFETY: as above.
                unsafe { libc::munlock(addr as *const c_void, n) };
            },
        )
    }

    /// Registers `memory` in chunks of at most `chunk_bytes` with `register` (`unregister`
    /// rolls back the chunks done when one fails), `call` naming it in the error; the
    /// registration keeps `host`'s context, with no device address yet.
    ///
    /// # Errors
    /// As [`register_chunks`], as [`PinnedError`]s.
    fn register_with(
        memory: &'a mut [u8],
        chunk_bytes: usize,
        call: &'static str,
        host: Option<&CudaContext>,
        register: impl FnMut(usize, usize) -> std::result::Result<(), String>,
        unregister: impl FnMut(usize, usize),
    ) -> Result<Self> {
        let base = memory.as_mut_ptr();
        let len = memory.len();
        let chunks = register_chunks(
            base as usize,
            len,
            chunk_bytes,
            page_size(),
            register,
            unregister,
        )
        .map_err(|f| f.into_error(call, len))?;
        Ok(Self {
            chunks,
            base,
            len,
            host: host.cloned(),
            device_ptr: None,
            _memory: std::marker::PhantomData,
        })
    }

    /// The chunks registered, as `(offset from the start, length)` in bytes.
    pub fn chunks(&self) -> Vec<(usize, usize)> {
        self.chunks
            .iter()
            .map(|&(a, n)| (a - self.base as usize, n))
            .collect()
    }

    /// Length of the registered range, in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device address of the start of a range registered with `mapped`.
    pub fn device_ptr(&self) -> Option<u64> {
        self.device_ptr
    }
}

impl Drop for HostRegistration<'_> {
    fn drop(&mut self) {
        match &self.host {
            Some(host) => {
                if host.bind().is_ok() {
                    for &(addr, _) in &self.chunks {
                        // SAFETY: each chunk was registered once by new_cuda.
                        let _ = unsafe { driver::mem_host_unregister(addr as *mut c_void) };
                    }
                }
            }
            None => {
                for &(addr, n) in &self.chunks {
                    // SAFETY: each chunk was locked by new_locked and lies in borrowed memory.
                    unsafe { libc::munlock(addr as *const c_void, n) };
                }
            }
        }
    }
}

/// Where a chunked registration stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChunkFailure {
    pub chunk: usize,
    pub offset: usize,
    pub len: usize,
    pub error: String,
}

impl ChunkFailure {
    fn into_error(self, call: &'static str, total: usize) -> PinnedError {
        if self.len == 0 {
            return PinnedError::InvalidArgument(self.error);
        }
        PinnedError::Register {
            call,
            chunk: self.chunk,
            offset_bytes: self.offset,
            len_bytes: self.len,
            total_bytes: total,
            name: self.error,
        }
    }
}

/// Splits `[base, base + len)` into chunks of at most `chunk` bytes (rounded up to `page`)
/// whose inner boundaries are page-aligned, calls `register` on each in order and, if one
/// fails, `unregister` on those before it (in reverse order). Returns the chunks as
/// `(address, length)`.
pub(crate) fn register_chunks(
    base: usize,
    len: usize,
    chunk: usize,
    page: usize,
    mut register: impl FnMut(usize, usize) -> std::result::Result<(), String>,
    mut unregister: impl FnMut(usize, usize),
) -> std::result::Result<Vec<(usize, usize)>, ChunkFailure> {
    let invalid = |error: String| ChunkFailure {
        chunk: 0,
        offset: 0,
        len: 0,
        error,
    };
    if len == 0 {
        return Err(invalid("registering an empty range".into()));
    }
    if chunk == 0 {
        return Err(invalid("a chunk size of 0 B".into()));
    }
    let chunk = chunk.div_ceil(page).saturating_mul(page);
    let end = base
        .checked_add(len)
        .ok_or_else(|| invalid("range wraps the address space".into()))?;
    // Inner boundaries: the first page boundary at or after base, then every `chunk`.
    let first_aligned = base.div_ceil(page) * page;
    let mut done: Vec<(usize, usize)> = Vec::new();
    let mut start = base;
    let mut boundary = if first_aligned > base {
        first_aligned.saturating_add(chunk - page)
    } else {
        first_aligned.saturating_add(chunk)
    };
    while start < end {
        let stop = boundary.min(end);
        let n = stop - start;
        if let Err(error) = register(start, n) {
            for &(a, m) in done.iter().rev() {
                unregister(a, m);
            }
            return Err(ChunkFailure {
                chunk: done.len(),
                offset: start - base,
                len: n,
                error,
            });
        }
        done.push((start, n));
        start = stop;
        boundary = boundary.saturating_add(chunk);
    }
    Ok(done)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    #[test]
    fn chunks_cover_the_range_with_page_aligned_inner_boundaries() {
        for (base, len, chunk) in [
            (0x10000usize, 10 * PAGE, 4 * PAGE),
            (0x10000 + 100, 10 * PAGE, 4 * PAGE),
            (0x10000 + 100, 3 * PAGE - 200, 4 * PAGE),
            (0x10000, 4 * PAGE, 4 * PAGE),
            (0x10000 + 7, 1, PAGE),
            (0x10000 + 7, 9 * PAGE, 5000), // chunk rounds up to 2 pages
        ] {
            let mut seen = Vec::new();
            let chunks = register_chunks(
                base,
                len,
                chunk,
                PAGE,
                |a, n| {
                    seen.push((a, n));
                    Ok(())
                },
                |_, _| panic!("nothing to roll back"),
            )
            .unwrap();
            assert_eq!(chunks, seen);
            let rounded = chunk.div_ceil(PAGE) * PAGE;
            let mut expect = base;
            for (i, &(a, n)) in chunks.iter().enumerate() {
                assert_eq!(a, expect, "contiguous");
                assert!(n > 0 && n <= rounded, "chunk {i}: {n} B");
                if i > 0 {
                    assert_eq!(a % PAGE, 0, "inner boundary aligned");
                }
                expect = a + n;
            }
            assert_eq!(expect, base + len, "covers the range");
        }
    }

    #[test]
    fn a_failing_chunk_rolls_back_the_earlier_ones_in_reverse() {
        let mut registered = Vec::new();
        let mut unregistered = Vec::new();
        let err = register_chunks(
            0x100000,
            10 * PAGE,
            2 * PAGE,
            PAGE,
            |a, n| {
                if registered.len() == 3 {
                    Err("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED".into())
                } else {
                    registered.push((a, n));
                    Ok(())
                }
            },
            |a, n| unregistered.push((a, n)),
        )
        .unwrap_err();
        assert_eq!(
            err,
            ChunkFailure {
                chunk: 3,
                offset: 6 * PAGE,
                len: 2 * PAGE,
                error: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED".into()
            }
        );
        registered.reverse();
        assert_eq!(unregistered, registered);
        let msg = err.into_error("cuMemHostRegister", 10 * PAGE).to_string();
        assert!(msg.contains("chunk 3 (offset 24576 B, 8192 B)"), "{msg}");
        assert!(
            msg.contains("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
            "{msg}"
        );
    }

    #[test]
    fn empty_ranges_and_zero_chunks_are_refused() {
        let ok = |_: usize, _: usize| Ok(());
        assert!(register_chunks(0x1000, 0, PAGE, PAGE, ok, |_, _| {}).is_err());
        assert!(register_chunks(0x1000, PAGE, 0, PAGE, ok, |_, _| {}).is_err());
    }

    #[test]
    fn locked_buffer_is_zeroed_writable_and_not_cuda() {
        match PinnedBuffer::new_locked(10_000) {
            Ok(mut b) => {
                assert_eq!(b.len(), 10_000);
                assert!(b.iter().all(|&x| x == 0));
                b[9_999] = 7;
                assert_eq!(b[9_999], 7);
                assert!(!b.is_cuda());
                assert_eq!(b.device_ptr(), None);
                assert_eq!(b.flags(), None);
            }
            Err(e) => assert!(matches!(e, PinnedError::MemlockLimit { .. }), "{e}"),
        }
        assert!(matches!(
            PinnedBuffer::new_locked(0),
            Err(PinnedError::InvalidArgument(_))
        ));
    }

    #[test]
    fn locked_registration_of_a_vec_in_chunks() {
        let mut v = vec![3u8; 5 * PAGE + 123];
        match HostRegistration::new_locked(&mut v[77..], 2 * PAGE) {
            Ok(r) => {
                let chunks = r.chunks();
                assert_eq!(chunks[0].0, 0);
                assert_eq!(
                    chunks.iter().map(|c| c.1).sum::<usize>(),
                    5 * PAGE + 123 - 77
                );
                assert!(chunks.len() >= 3);
            }
            Err(e) => assert!(matches!(e, PinnedError::Register { .. }), "{e}"),
        }
        assert_eq!(v[100], 3);
    }
}
