//! [`CudaEvents`]: the pool's [`StreamEvents`] on CUDA events (cuEventRecord / cuEventQuery),
//! recycled through a free list.
use std::sync::Mutex;

use gpumem_core::DeviceError;

use super::driver::{self, CUevent, CUstream};
use super::{CudaContext, CudaDevice};
use crate::pool::events::poisoned;
use crate::pool::StreamEvents;

/// CUDA events of one device's context, created with CU_EVENT_DISABLE_TIMING and reused.
/// Holds a clone of the device's [`CudaContext`].
#[derive(Debug)]
pub struct CudaEvents {
    ctx: CudaContext,
    free: Mutex<Vec<usize>>,
}

impl CudaEvents {
    /// Events for `device`'s context.
    ///
    /// # Errors
    /// None today (kept for a context that cannot be shared).
    pub fn new(device: &CudaDevice) -> Result<Self, DeviceError> {
        Ok(Self::for_context(device.context()))
    }

    /// Events for `ctx`.
    pub fn for_context(ctx: &CudaContext) -> Self {
        CudaEvents {
            ctx: ctx.clone(),
            free: Mutex::new(Vec::new()),
        }
    }
}

impl StreamEvents for CudaEvents {
    fn record(&self, stream: u64) -> Result<u64, DeviceError> {
        self.ctx.bind()?;
        let reused = self.free.lock().map_err(|_| poisoned())?.pop();
        let e = match reused {
            Some(e) => e as CUevent,
            None => driver::event_create()?,
        };
        // SAFETY: `e` is a live event of this context; `stream` is a stream id the user
        // passed to the pool, i.e. a live CUstream of this context or 0.
        if let Err(err) = unsafe { driver::event_record(e, stream as CUstream) } {
            self.recycle(e as u64);
            return Err(err);
        }
        Ok(e as u64)
    }
    fn query(&self, event: u64) -> Result<bool, DeviceError> {
        self.ctx.bind()?;
        // SAFETY: `event` came from `record` and is not recycled yet.
        unsafe { driver::event_query(event as CUevent) }
    }
    fn synchronize(&self, event: u64) -> Result<(), DeviceError> {
        self.ctx.bind()?;
        // SAFETY: as in query.
        unsafe { driver::event_synchronize(event as CUevent) }
    }
    fn recycle(&self, event: u64) {
        if let Ok(mut f) = self.free.lock() {
            f.push(event as usize);
        }
    }
}

impl Drop for CudaEvents {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            if let Ok(mut f) = self.free.lock() {
                for e in f.drain(..) {
                    // SAFETY: each free-listed event is live and destroyed once here.
                    let _ = unsafe { driver::event_destroy(e as CUevent) };
                }
            }
        }
    }
}
