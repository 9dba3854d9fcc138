//! Following the cudaMalloc / cudaFree calls a trace recorded
//! ([`SimDevice::follow_recorded`]), so that an allocator whose choices depend on address
//! order sees the addresses the recorded run saw, and checking the calls made against them.

use super::{SimDevice, DEFAULT_BASE};

/// What a recorded driver call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordedKind {
    /// cudaMalloc (PyTorch's `segment_alloc`).
    Alloc,
    /// cudaFree (PyTorch's `segment_free`).
    Free,
}

/// A cudaMalloc or cudaFree recorded in a trace, for [`SimDevice::follow_recorded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RecordedCall {
    /// What the call did.
    pub kind: RecordedKind,
    /// Address of the segment.
    pub addr: u64,
    /// Bytes of the segment.
    pub bytes: u64,
    /// Index of the recording event in the trace.
    pub event: u64,
}

/// Whether the calls made matched the recorded ones ([`SimDevice::recorded_check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum RecordedCheck {
    /// Every recorded call was made, in order, with the same size (and, for frees, address).
    Matches {
        /// Calls matched.
        calls: u64,
    },
    /// The first call that differed.
    Diverges {
        /// Index of the recorded event where the sequences part (the last recorded call's
        /// event when the device made a call the trace does not have).
        event: u64,
        /// The recorded call at that point, if any remained.
        recorded: Option<RecordedCall>,
        /// The call the device was asked for instead (kind, address for frees or 0, bytes),
        /// if any. Serialised as an object with the keys of `recorded` (`kind`, `addr`,
        /// `bytes`), less `event`.
        #[serde(serialize_with = "serialize_emulated")]
        emulated: Option<(RecordedKind, u64, u64)>,
    },
}

/// [`RecordedCheck::Diverges`]'s `emulated` call as `{"kind", "addr", "bytes"}`, the shape of
/// its `recorded` call, instead of serde's array for a tuple.
pub(super) fn serialize_emulated<S: serde::Serializer>(
    call: &Option<(RecordedKind, u64, u64)>,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(serde::Serialize)]
    struct Call {
        kind: RecordedKind,
        addr: u64,
        bytes: u64,
    }
    serde::Serialize::serialize(
        &call.map(|(kind, addr, bytes)| Call { kind, addr, bytes }),
        s,
    )
}

impl std::fmt::Display for RecordedCheck {
    /// `matches the recorded cudaMalloc sequence (N calls)` or
    /// `diverges at event K: recorded X, emulated Y`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn call(k: RecordedKind, addr: u64, bytes: u64) -> String {
            match (k, addr) {
                (RecordedKind::Alloc, 0) => format!("cudaMalloc({bytes})"),
                (RecordedKind::Alloc, a) => format!("cudaMalloc({bytes}) at {a:#x}"),
                (RecordedKind::Free, a) => format!("cudaFree({a:#x}, {bytes} B)"),
            }
        }
        match self {
            RecordedCheck::Matches { calls } => {
                write!(
                    f,
                    "matches the recorded cudaMalloc sequence ({calls} calls)"
                )
            }
            RecordedCheck::Diverges {
                event,
                recorded,
                emulated,
            } => write!(
                f,
                "diverges at event {event}: recorded {}, emulated {}",
                recorded.map_or("nothing".into(), |r| call(r.kind, r.addr, r.bytes)),
                emulated.map_or("nothing".into(), |(k, a, b)| call(k, a, b)),
            ),
        }
    }
}

/// The recorded calls being followed.
#[derive(Debug, Clone)]
pub(super) struct Script {
    pub(super) calls: Vec<RecordedCall>,
    pub(super) next: usize,
    /// Successful cudaMalloc calls still to place as usual once `skip_from` calls of the
    /// script are made.
    pub(super) skip_allocs: u64,
    pub(super) skip_from: usize,
    pub(super) divergence: Option<RecordedCheck>,
}

impl SimDevice {
    /// Follows recorded driver calls: each cudaMalloc of the same size as the next recorded
    /// `segment_alloc` returns the recorded address, each cudaFree must match the next
    /// recorded `segment_free`, so an allocator whose choices depend on address order (the
    /// PyTorch emulation) sees the addresses the recorded run saw. The first `skip_allocs`
    /// successful cudaMallocs (blocks that were live before recording started) are placed as
    /// usual. At the first call that differs the device stops following and places the rest
    /// top-down; [`SimDevice::recorded_check`] says where.
    pub fn follow_recorded(&mut self, calls: Vec<RecordedCall>, skip_allocs: u64) {
        self.follow_recorded_from(calls, 0, skip_allocs);
    }

    /// [`SimDevice::follow_recorded`] where the `skip_allocs` cudaMallocs placed as usual come
    /// after the first `skip_from` calls of the script (a replay that first takes in the
    /// segments a recorded run already held, at their recorded addresses, then allocates the
    /// other blocks live before recording started).
    pub fn follow_recorded_from(
        &mut self,
        calls: Vec<RecordedCall>,
        skip_from: usize,
        skip_allocs: u64,
    ) {
        self.script = Some(Script {
            calls,
            next: 0,
            skip_allocs,
            skip_from,
            divergence: None,
        });
    }

    /// How the calls made compare with the ones given to [`SimDevice::follow_recorded`]
    /// (`None` when none were given).
    pub fn recorded_check(&self) -> Option<RecordedCheck> {
        let s = self.script.as_ref()?;
        if let Some(d) = s.divergence {
            return Some(d);
        }
        Some(match s.calls.get(s.next) {
            Some(r) => RecordedCheck::Diverges {
                event: r.event,
                recorded: Some(*r),
                emulated: None,
            },
            None => RecordedCheck::Matches {
                calls: s.next as u64,
            },
        })
    }

    /// The recorded address for a cudaMalloc of `rounded` bytes, if the script has one
    /// (consumed), or `None` to place it as usual (recording a divergence if it differs).
    pub(super) fn scripted_alloc(&mut self, bytes: u64, rounded: u64) -> Option<u64> {
        let s = self.script.as_mut()?;
        if s.divergence.is_some() {
            return None;
        }
        if s.skip_allocs > 0 && s.next >= s.skip_from {
            s.skip_allocs -= 1;
            return None;
        }
        let diverge = |s: &mut Script, r: Option<RecordedCall>| {
            let event = r.or_else(|| s.calls.last().copied()).map_or(0, |c| c.event);
            s.divergence = Some(RecordedCheck::Diverges {
                event,
                recorded: r,
                emulated: Some((RecordedKind::Alloc, 0, bytes)),
            });
            None
        };
        let r = s.calls.get(s.next).copied();
        match r {
            Some(c) if c.kind == RecordedKind::Alloc && c.bytes == bytes => {
                // The recorded range must be free address space here, or lie outside the
                // simulated address space without touching a live segment.
                let Some(end) = c.addr.checked_add(rounded) else {
                    return diverge(s, r);
                };
                let inside = self
                    .free_va
                    .range(..=c.addr)
                    .next_back()
                    .filter(|(&st, &len)| end <= st + len);
                let Some((&start, &len)) = inside else {
                    let space_end = DEFAULT_BASE + (1u64 << 46);
                    let outside = end <= DEFAULT_BASE || c.addr >= space_end;
                    let overlaps = self
                        .segments
                        .range(..end)
                        .next_back()
                        .is_some_and(|(&a, &b)| a + b > c.addr);
                    if outside && !overlaps {
                        s.next += 1;
                        self.foreign.insert(c.addr);
                        return Some(c.addr);
                    }
                    return diverge(s, r);
                };
                s.next += 1;
                self.free_va.remove(&start);
                if c.addr > start {
                    self.free_va.insert(start, c.addr - start);
                }
                let end = c.addr + rounded;
                if start + len > end {
                    self.free_va.insert(end, start + len - end);
                }
                Some(c.addr)
            }
            _ => diverge(s, r),
        }
    }

    /// Checks a cudaFree of `addr` against the script.
    pub(super) fn scripted_free(&mut self, addr: u64, bytes: u64) {
        let Some(s) = self.script.as_mut() else {
            return;
        };
        if s.divergence.is_some() {
            return;
        }
        let r = s.calls.get(s.next).copied();
        match r {
            Some(c) if c.kind == RecordedKind::Free && c.addr == addr => s.next += 1,
            _ => {
                let event = r.or_else(|| s.calls.last().copied()).map_or(0, |c| c.event);
                s.divergence = Some(RecordedCheck::Diverges {
                    event,
                    recorded: r,
                    emulated: Some((RecordedKind::Free, addr, bytes)),
                });
            }
        }
    }
}
