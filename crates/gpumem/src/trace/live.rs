//! Live-block bookkeeping shared by the readers: a duplicate live address is an error, a free
//! of an unknown address is either a pre-existing block (snapshots) or an error (logs).
use super::{Action, Event, PreexistingBlock, Trace};

/// A hash map keyed by `(device, address)` (the one address hasher, [`gpumem_core::hash`]).
pub(crate) type AddrMap<V> = gpumem_core::hash::AddrMap<(u32, u64), V>;

/// What a free of an address that is not live means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnknownFree {
    /// The block existed before recording started (PyTorch snapshots).
    Preexisting,
    /// A malformed log (RMM, JSON lines).
    Error,
}

/// How messages write an address: the way the file wrote it, so that a user finds it there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddrStyle {
    /// `0x3df`: PyTorch snapshots (Python ints, which users compare with the hex pointers
    /// PyTorch prints) and RMM logs (hexadecimal `Pointer` column).
    Hex,
    /// `991 (0x3df)`: gpumem JSON lines, and RMM logs with decimal pointers.
    Decimal,
}

impl AddrStyle {
    /// `addr` written in this style.
    pub(crate) fn show(self, addr: u64) -> String {
        match self {
            AddrStyle::Hex => format!("{addr:#x}"),
            AddrStyle::Decimal => format!("{addr} ({addr:#x})"),
        }
    }
}

/// What the reader knows about an address.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// Allocated at event `at` with `size` bytes.
    Live { size: u64, at: u64 },
    /// A declared pre-existing block of `size` bytes: index `pre` in [`Trace::preexisting`].
    Declared { size: u64, pre: usize },
    /// Freed at event `at` and not allocated since.
    Freed { at: u64 },
}

/// Tracks live blocks while a reader admits events. Freed addresses are remembered (until they
/// are allocated again), so that a double free is told apart from a pre-existing block.
pub(crate) struct Liveness {
    slots: AddrMap<Slot>,
    unknown: UnknownFree,
    /// How messages write addresses.
    pub(crate) style: AddrStyle,
    /// The line of the file each admitted event came from ([`Liveness::admit_line`]), so that
    /// a message about an earlier event names its line as the reader names the current one.
    lines: Vec<u64>,
}

impl Liveness {
    pub(crate) fn new(unknown: UnknownFree, style: AddrStyle) -> Self {
        Self {
            slots: AddrMap::default(),
            unknown,
            style,
            lines: Vec::new(),
        }
    }

    /// Where event `at` is, in words: `on line N` for a text file read by lines, else
    /// `at event N`.
    fn place(&self, at: u64) -> String {
        match usize::try_from(at).ok().and_then(|i| self.lines.get(i)) {
            Some(line) => format!("on line {line}"),
            None => format!("at event {at}"),
        }
    }

    /// [`Liveness::admit`] of an event read from line `line` (1-based) of a text file: later
    /// messages about it name that line.
    ///
    /// # Errors
    /// As [`Liveness::admit`].
    pub(crate) fn admit_line(
        &mut self,
        trace: &mut Trace,
        event: Event,
        line: u64,
        size_hint: impl Fn(u32, u64) -> u64,
    ) -> Result<(), String> {
        // Lines are kept only while they follow the events one for one.
        let aligned = self.lines.len() == trace.events.len();
        self.admit(trace, event, size_hint)?;
        if aligned {
            self.lines.push(line);
        }
        Ok(())
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
        self.check(&mut event, index, &mut trace.preexisting, size_hint)?;
        trace.events.push(event);
        Ok(())
    }

    /// Checks `event`, to be appended at `index` of the events, against the live set and
    /// records its effect (a free of a live block gets the block's size when it had none; a
    /// pre-existing block goes to `preexisting`).
    ///
    /// # Errors
    /// What is wrong with the event; the live set is unchanged.
    pub(crate) fn check(
        &mut self,
        event: &mut Event,
        index: u64,
        preexisting: &mut Vec<PreexistingBlock>,
        size_hint: impl Fn(u32, u64) -> u64,
    ) -> Result<(), String> {
        let key = (event.device, event.addr);
        match event.action {
            Action::Alloc => match self.slots.get(&key) {
                Some(&Slot::Live { size, at }) => {
                    return Err(format!(
                        "alloc of {} bytes at address {} (device {}), which is already live \
                         (allocated with {size} bytes {}, not freed since)",
                        event.size_bytes,
                        self.style.show(event.addr),
                        event.device,
                        self.place(at)
                    ))
                }
                Some(&Slot::Declared { size, .. }) => {
                    return Err(format!(
                        "alloc of {} bytes at address {} (device {}), which is already live \
                         (a preexisting block of {size} bytes)",
                        event.size_bytes,
                        self.style.show(event.addr),
                        event.device
                    ))
                }
                Some(Slot::Freed { .. }) | None => {
                    self.slots.insert(
                        key,
                        Slot::Live {
                            size: event.size_bytes,
                            at: index,
                        },
                    );
                }
            },
            Action::Free => match self.slots.get(&key).copied() {
                Some(Slot::Live { size, .. }) => {
                    if event.size_bytes == 0 {
                        event.size_bytes = size;
                    }
                    self.slots.insert(key, Slot::Freed { at: index });
                }
                Some(Slot::Declared { size, pre }) => {
                    if event.size_bytes == 0 {
                        event.size_bytes = size;
                    }
                    if let Some(b) = preexisting.get_mut(pre) {
                        b.freed_at_event = Some(index);
                    }
                    self.slots.insert(key, Slot::Freed { at: index });
                }
                Some(Slot::Freed { at }) => {
                    return Err(format!(
                        "free of address {} (device {}) that is not live: freed {} and not \
                         allocated since (a double free)",
                        self.style.show(event.addr),
                        event.device,
                        self.place(at)
                    ))
                }
                None => match self.unknown {
                    UnknownFree::Error => {
                        return Err(format!(
                            "free of address {} (device {}) that is not live (never \
                             allocated)",
                            self.style.show(event.addr),
                            event.device
                        ))
                    }
                    UnknownFree::Preexisting => {
                        if event.size_bytes == 0 {
                            event.size_bytes = size_hint(event.device, event.addr);
                        }
                        preexisting.push(PreexistingBlock {
                            addr: event.addr,
                            size_bytes: event.size_bytes,
                            device: event.device,
                            freed_at_event: Some(index),
                        });
                        self.slots.insert(key, Slot::Freed { at: index });
                    }
                },
            },
            _ => {}
        }
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
        if let Some(Slot::Live { .. } | Slot::Declared { .. }) = self.slots.get(&key) {
            return Err(format!(
                "preexisting block at address {} (device {}), which is already live",
                self.style.show(block.addr),
                block.device
            ));
        }
        self.slots.insert(
            key,
            Slot::Declared {
                size: block.size_bytes,
                pre: trace.preexisting.len(),
            },
        );
        trace.preexisting.push(block);
        Ok(())
    }

    /// Whether `(device, addr)` is live now.
    pub(crate) fn is_live(&self, device: u32, addr: u64) -> bool {
        matches!(
            self.slots.get(&(device, addr)),
            Some(Slot::Live { .. } | Slot::Declared { .. })
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_and_unknown() {
        let mut t = Trace::default();
        let mut l = Liveness::new(UnknownFree::Error, AddrStyle::Hex);
        l.admit(&mut t, Event::alloc(16, 8), |_, _| 0).unwrap();
        assert!(l
            .admit(&mut t, Event::alloc(16, 8), |_, _| 0)
            .unwrap_err()
            .contains("already live"));
        l.admit(&mut t, Event::free(16, 0), |_, _| 0).unwrap();
        assert_eq!(t.events[1].size_bytes, 8, "free gets the block's size");
        assert!(l
            .admit(&mut t, Event::free(16, 0), |_, _| 0)
            .unwrap_err()
            .contains("freed at event 1 and not allocated since (a double free)"));
        assert!(l
            .admit(&mut t, Event::free(48, 0), |_, _| 0)
            .unwrap_err()
            .contains("never allocated"));
        assert_eq!(t.events.len(), 2);
        // Allocated again after its free: fine.
        l.admit(&mut t, Event::alloc(16, 4), |_, _| 0).unwrap();
    }

    #[test]
    fn messages_name_the_line_of_an_earlier_event_read_by_lines() {
        let mut t = Trace::default();
        let mut l = Liveness::new(UnknownFree::Error, AddrStyle::Decimal);
        l.admit_line(&mut t, Event::alloc(16, 8), 3, |_, _| 0)
            .unwrap();
        let e = l
            .admit_line(&mut t, Event::alloc(16, 8), 7, |_, _| 0)
            .unwrap_err();
        assert!(
            e.contains("(allocated with 8 bytes on line 3, not freed since)"),
            "{e}"
        );
        l.admit_line(&mut t, Event::free(16, 0), 9, |_, _| 0)
            .unwrap();
        let e = l
            .admit_line(&mut t, Event::free(16, 0), 12, |_, _| 0)
            .unwrap_err();
        assert!(e.contains("freed on line 9 and not allocated since"), "{e}");
    }

    #[test]
    fn preexisting() {
        let mut t = Trace::default();
        let mut l = Liveness::new(UnknownFree::Preexisting, AddrStyle::Hex);
        l.admit(&mut t, Event::free(32, 0), |_, a| a * 2).unwrap();
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
        // The same address freed again without an alloc in between: a double free, not a
        // second pre-existing block.
        let e = l.admit(&mut t, Event::free(32, 0), |_, _| 0).unwrap_err();
        assert!(e.contains("double free"), "{e}");
        assert_eq!(t.preexisting.len(), 1);
    }
}
