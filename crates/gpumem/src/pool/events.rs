//! Events for stream-ordered reuse: the pool records one on a stream when a block leaves it,
//! and hands the block to another stream only once the event has completed. [`StreamEvents`]
//! is the abstraction (CUDA's is [`crate::cuda::CudaEvents`]; pinned memory uses it too);
//! [`ManualEvents`] completes by hand, for the simulated device and tests.
use std::collections::HashMap;
use std::sync::Mutex;

use gpumem_core::DeviceError;

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

pub(crate) fn poisoned() -> DeviceError {
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
