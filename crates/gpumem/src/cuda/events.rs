//! Events for stream-ordered reuse: the pool records one on a stream when a block leaves it,
//! and hands the block to another stream only once the event has completed.
use std::collections::HashMap;
use std::sync::Mutex;

use gpumem_core::DeviceError;

use super::driver::{self, CUevent, CUstream};
use super::{CudaContext, CudaDevice};

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
