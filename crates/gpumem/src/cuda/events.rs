//! Events for stream-ordered reuse: the pool records one on a stream when a block leaves it,
//! and hands the block to another stream only once the event has completed.
use std::collections::HashMap;
use std::sync::Mutex;

use gpumem_core::DeviceError;

use super::driver::{self, CUcontext, CUdevice, CUevent, CUstream};
use super::CudaDevice;

/// Stream events as the pool needs them. Streams and events are opaque `u64` ids (for CUDA,
/// the `CUstream` / `CUevent` pointers; stream 0 is the legacy default stream).
pub trait StreamEvents: Send + Sync {
    /// Records a new event on `stream` (cuEventRecord) and returns its id.
    ///
    /// # Errors
    /// A failed driver call.
    fn record(&self, stream: u64) -> Result<u64, DeviceError>;
    /// Whether the event has completed (cuEventQuery), without waiting.
    ///
    /// # Errors
    /// A failed driver call (CUDA_ERROR_NOT_READY is `Ok(false)`, not an error).
    fn query(&self, event: u64) -> Result<bool, DeviceError>;
    /// Waits for the event (cuEventSynchronize).
    ///
    /// # Errors
    /// A failed driver call.
    fn synchronize(&self, event: u64) -> Result<(), DeviceError>;
    /// Gives the event back (to a free list; cuEventDestroy at the end).
    fn recycle(&self, event: u64);
}

/// Events whose completion the caller decides: for the simulated device and for tests. An
/// event completes when [`ManualEvents::complete_all`] or [`StreamEvents::synchronize`] is
/// called (or at once, with [`ManualEvents::immediate`]).
#[derive(Debug, Default)]
pub struct ManualEvents {
    state: Mutex<ManualState>,
    immediate: bool,
}

#[derive(Debug, Default)]
struct ManualState {
    next: u64,
    /// event -> (stream, complete)
    events: HashMap<u64, (u64, bool)>,
    recorded: u64,
}

impl ManualEvents {
    /// Events that stay pending until completed by hand.
    pub fn new() -> Self {
        Self::default()
    }
    /// Events complete as soon as recorded (the simulated device does no work).
    pub fn immediate() -> Self {
        ManualEvents {
            immediate: true,
            ..Self::default()
        }
    }
    /// Completes every pending event.
    pub fn complete_all(&self) {
        if let Ok(mut s) = self.state.lock() {
            for v in s.events.values_mut() {
                v.1 = true;
            }
        }
    }
    /// Completes the events recorded on `stream`.
    pub fn complete_stream(&self, stream: u64) {
        if let Ok(mut s) = self.state.lock() {
            for v in s.events.values_mut() {
                if v.0 == stream {
                    v.1 = true;
                }
            }
        }
    }
    /// Events recorded so far.
    pub fn recorded(&self) -> u64 {
        self.state.lock().map(|s| s.recorded).unwrap_or(0)
    }
    /// Events not recycled yet.
    pub fn live(&self) -> usize {
        self.state.lock().map(|s| s.events.len()).unwrap_or(0)
    }
}

fn poisoned() -> DeviceError {
    DeviceError::Driver {
        call: "event",
        name: "lock poisoned".into(),
    }
}

impl StreamEvents for ManualEvents {
    fn record(&self, stream: u64) -> Result<u64, DeviceError> {
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        s.next += 1;
        s.recorded += 1;
        let id = s.next;
        s.events.insert(id, (stream, self.immediate));
        Ok(id)
    }
    fn query(&self, event: u64) -> Result<bool, DeviceError> {
        let s = self.state.lock().map_err(|_| poisoned())?;
        Ok(s.events.get(&event).is_none_or(|e| e.1))
    }
    fn synchronize(&self, event: u64) -> Result<(), DeviceError> {
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        if let Some(e) = s.events.get_mut(&event) {
            e.1 = true;
        }
        Ok(())
    }
    fn recycle(&self, event: u64) {
        if let Ok(mut s) = self.state.lock() {
            s.events.remove(&event);
        }
    }
}

/// CUDA events of one device's context, created with CU_EVENT_DISABLE_TIMING and reused.
/// Holds its own reference to the primary context (cuDevicePrimaryCtxRetain).
#[derive(Debug)]
pub struct CudaEvents {
    dev: CUdevice,
    ctx: CUcontext,
    free: Mutex<Vec<usize>>,
}

// SAFETY: events and the context may be used from any thread once the context is current
// there; every method makes it current first. The free list is behind a mutex.
unsafe impl Send for CudaEvents {}
// SAFETY: as above; no method hands out interior references.
unsafe impl Sync for CudaEvents {}

impl CudaEvents {
    /// Events for `device`'s context.
    ///
    /// # Errors
    /// A failed cuDevicePrimaryCtxRetain.
    pub fn new(device: &CudaDevice) -> Result<Self, DeviceError> {
        let dev = device.device_raw();
        // SAFETY: `dev` is a valid device; released once in Drop.
        let ctx = unsafe { driver::primary_ctx_retain(dev)? };
        Ok(CudaEvents {
            dev,
            ctx,
            free: Mutex::new(Vec::new()),
        })
    }

    fn bind(&self) -> Result<(), DeviceError> {
        // SAFETY: our retained primary context, released only in Drop.
        unsafe { driver::ctx_set_current(self.ctx) }
    }
}

impl StreamEvents for CudaEvents {
    fn record(&self, stream: u64) -> Result<u64, DeviceError> {
        self.bind()?;
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
        self.bind()?;
        // SAFETY: `event` came from `record` and is not recycled yet.
        unsafe { driver::event_query(event as CUevent) }
    }
    fn synchronize(&self, event: u64) -> Result<(), DeviceError> {
        self.bind()?;
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
        if self.bind().is_ok() {
            if let Ok(mut f) = self.free.lock() {
                for e in f.drain(..) {
                    // SAFETY: each free-listed event is live and destroyed once here.
                    let _ = unsafe { driver::event_destroy(e as CUevent) };
                }
            }
        }
        // SAFETY: matches the retain in `new`.
        let _ = unsafe { driver::primary_ctx_release(self.dev) };
    }
}

/// A non-blocking CUDA stream of one device (cuStreamCreate), destroyed on drop. Holds its
/// own reference to the primary context.
#[derive(Debug)]
pub struct CudaStream {
    dev: CUdevice,
    ctx: CUcontext,
    stream: CUstream,
}

// SAFETY: a stream may be used from any thread with its context current; methods bind first.
unsafe impl Send for CudaStream {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// Creates a stream on `device`.
    ///
    /// # Errors
    /// A failed cuCtxSetCurrent or cuStreamCreate.
    pub fn new(device: &CudaDevice) -> Result<Self, DeviceError> {
        let dev = device.device_raw();
        // SAFETY: `dev` is a valid device; released once in Drop (or below on failure).
        let ctx = unsafe { driver::primary_ctx_retain(dev)? };
        // SAFETY: just retained.
        let made = unsafe { driver::ctx_set_current(ctx) }.and_then(|()| driver::stream_create());
        match made {
            Ok(stream) => Ok(CudaStream { dev, ctx, stream }),
            Err(e) => {
                // SAFETY: matches the retain above.
                let _ = unsafe { driver::primary_ctx_release(dev) };
                Err(e)
            }
        }
    }
    /// The stream id to pass to the pool (the `CUstream` as an integer).
    pub fn id(&self) -> u64 {
        self.stream as u64
    }
    /// Waits for all work on the stream (cuStreamSynchronize).
    ///
    /// # Errors
    /// A failed driver call.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        // SAFETY: the context is live while the device is; the stream is ours.
        unsafe {
            driver::ctx_set_current(self.ctx)?;
            driver::stream_synchronize(self.stream)
        }
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        // SAFETY: our stream, destroyed once with its context current; then the context
        // reference taken in `new` is released.
        unsafe {
            if driver::ctx_set_current(self.ctx).is_ok() {
                let _ = driver::stream_destroy(self.stream);
            }
            let _ = driver::primary_ctx_release(self.dev);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn manual_events_complete_by_stream() {
        let ev = ManualEvents::new();
        let a = ev.record(1).expect("record");
        let b = ev.record(2).expect("record");
        assert_eq!(ev.query(a), Ok(false));
        ev.complete_stream(1);
        assert_eq!(ev.query(a), Ok(true));
        assert_eq!(ev.query(b), Ok(false));
        ev.synchronize(b).expect("sync");
        assert_eq!(ev.query(b), Ok(true));
        ev.recycle(a);
        ev.recycle(b);
        assert_eq!(ev.live(), 0);
        assert_eq!(ev.recorded(), 2);
        let i = ManualEvents::immediate();
        let c = i.record(5).expect("record");
        assert_eq!(i.query(c), Ok(true));
    }
}
