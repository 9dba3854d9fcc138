//! Live-block bookkeeping shared by the readers: a duplicate live address is an error, a free
//! of an unknown address is either a pre-existing block (snapshots) or an error (logs).
use super::{Action, Event, PreexistingBlock, Trace};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A multiplicative hasher for `(device, address)` keys: addresses are not attacker-chosen in a
/// way that matters here (a hostile file can at worst slow its own reading down).
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Fx-style mixing (the constant is 2^64 / golden ratio).
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
}

/// A hash map keyed by `(device, address)`.
pub(crate) type AddrMap<V> = HashMap<(u32, u64), V, BuildHasherDefault<AddrHasher>>;

/// What a free of an address that is not live means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnknownFree {
    /// The block existed before recording started (PyTorch snapshots).
    Preexisting,
    /// A malformed log (RMM, JSON lines).
    Error,
}

/// Tracks live blocks while a reader admits events.
pub(crate) struct Liveness {
    /// Live blocks: (size in bytes, index of the alloc event).
    live: AddrMap<(u64, u64)>,
    /// Declared pre-existing blocks still live: index in [`Trace::preexisting`].
    declared: AddrMap<usize>,
    unknown: UnknownFree,
}

/// `Liveness::live` alloc index of a declared pre-existing block.
const DECLARED: u64 = u64::MAX;

impl Liveness {
    pub(crate) fn new(unknown: UnknownFree) -> Self {
        Self {
            live: AddrMap::default(),
            declared: AddrMap::default(),
            unknown,
        }
    }

    /// Checks `event` against the live set and, when it is sound, appends it to `trace`
    /// (a free of a live block gets the block's size when it had none). `size_hint` gives the
    /// size of a pre-existing block whose free event carries no size.
    ///
    /// # Errors
    /// What is wrong with the event; nothing was appended.
    pub(crate) fn admit(
        &mut self,
        trace: &mut Trace,
        mut event: Event,
        size_hint: impl Fn(u32, u64) -> u64,
    ) -> Result<(), String> {
        let index = trace.events.len() as u64;
        let key = (event.device, event.addr);
        match event.action {
            Action::Alloc => {
                if let Some(&(size, at)) = self.live.get(&key) {
                    return Err(format!(
                        "alloc of {} bytes at address {:#x} (device {}), which is already live \
                         ({})",
                        event.size_bytes,
                        event.addr,
                        event.device,
                        if at == DECLARED {
                            format!("a preexisting block of {size} bytes")
                        } else {
                            format!("allocated with {size} bytes at event {at}, not freed since")
                        }
                    ));
                }
                self.live.insert(key, (event.size_bytes, index));
            }
            Action::Free => match self.live.remove(&key) {
                Some((size, at)) => {
                    if event.size_bytes == 0 {
                        event.size_bytes = size;
                    }
                    if at == DECLARED {
                        if let Some(b) = self
                            .declared
                            .remove(&key)
                            .and_then(|i| trace.preexisting.get_mut(i))
                        {
                            b.freed_at_event = Some(index);
                        }
                    }
                }
                None => match self.unknown {
                    UnknownFree::Error => {
                        return Err(format!(
                            "free of address {:#x} (device {}) that is not live (never \
                             allocated, or already freed)",
                            event.addr, event.device
                        ))
                    }
                    UnknownFree::Preexisting => {
                        if event.size_bytes == 0 {
                            event.size_bytes = size_hint(event.device, event.addr);
                        }
                        trace.preexisting.push(PreexistingBlock {
                            addr: event.addr,
                            size_bytes: event.size_bytes,
                            device: event.device,
                            freed_at_event: Some(index),
                        });
                    }
                },
            },
            _ => {}
        }
        trace.events.push(event);
        Ok(())
    }

    /// Declares a block live before the first event (gpumem JSON lines `preexisting`) and
    /// appends it to [`Trace::preexisting`].
    ///
    /// # Errors
    /// When a block at that address is live already; nothing was appended.
    pub(crate) fn declare_preexisting(
        &mut self,
        trace: &mut Trace,
        block: PreexistingBlock,
    ) -> Result<(), String> {
        let key = (block.device, block.addr);
        if self.live.contains_key(&key) {
            return Err(format!(
                "preexisting block at address {:#x} (device {}), which is already live",
                block.addr, block.device
            ));
        }
        self.live.insert(key, (block.size_bytes, DECLARED));
        self.declared.insert(key, trace.preexisting.len());
        trace.preexisting.push(block);
        Ok(())
    }

    /// Whether `(device, addr)` is live now.
    pub(crate) fn is_live(&self, device: u32, addr: u64) -> bool {
        self.live.contains_key(&(device, addr))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ev(action: Action, addr: u64, size: u64) -> Event {
        Event {
            action,
            addr,
            size_bytes: size,
            stream: 0,
            device: 0,
            time_us: None,
            align: None,
        }
    }

    #[test]
    fn duplicate_and_unknown() {
        let mut t = Trace::default();
        let mut l = Liveness::new(UnknownFree::Error);
        l.admit(&mut t, ev(Action::Alloc, 16, 8), |_, _| 0).unwrap();
        assert!(l
            .admit(&mut t, ev(Action::Alloc, 16, 8), |_, _| 0)
            .unwrap_err()
            .contains("already live"));
        l.admit(&mut t, ev(Action::Free, 16, 0), |_, _| 0).unwrap();
        assert_eq!(t.events[1].size_bytes, 8, "free gets the block's size");
        assert!(l
            .admit(&mut t, ev(Action::Free, 16, 0), |_, _| 0)
            .unwrap_err()
            .contains("not live"));
        assert_eq!(t.events.len(), 2);
    }

    #[test]
    fn preexisting() {
        let mut t = Trace::default();
        let mut l = Liveness::new(UnknownFree::Preexisting);
        l.admit(&mut t, ev(Action::Free, 32, 0), |_, a| a * 2)
            .unwrap();
        assert_eq!(
            t.preexisting,
            vec![PreexistingBlock {
                addr: 32,
                size_bytes: 64,
                device: 0,
                freed_at_event: Some(0)
            }]
        );
        assert!(!l.is_live(0, 32));
    }
}
