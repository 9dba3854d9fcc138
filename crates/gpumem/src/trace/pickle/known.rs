//! The strings the trace-entry converter looks for (keys such as `action` and `addr`, and the
//! action names), recognised once by the pickle VM when it creates the string, so that the
//! converter (`entry.rs`) compares a tag instead of bytes.

use crate::trace::Action;

/// Strings the converter looks for, recognised once when the string is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Known {
    Other,
    KeyAction,
    KeyAddr,
    KeySize,
    KeyStream,
    KeyTimeUs,
    KeyFrames,
    KeyDeviceFree,
    KeyFilename,
    KeyLine,
    KeyName,
    Act(Option<Action>),
}

pub(super) fn classify(s: &[u8]) -> Known {
    match s {
        b"action" => Known::KeyAction,
        b"addr" => Known::KeyAddr,
        b"size" => Known::KeySize,
        b"stream" => Known::KeyStream,
        b"time_us" => Known::KeyTimeUs,
        b"frames" => Known::KeyFrames,
        b"device_free" => Known::KeyDeviceFree,
        b"filename" => Known::KeyFilename,
        b"line" => Known::KeyLine,
        b"name" => Known::KeyName,
        b"alloc" => Known::Act(Some(Action::Alloc)),
        b"free_completed" | b"free" => Known::Act(Some(Action::Free)),
        b"free_requested" => Known::Act(Some(Action::FreeRequested)),
        b"segment_alloc" => Known::Act(Some(Action::SegmentAlloc)),
        b"segment_free" => Known::Act(Some(Action::SegmentFree)),
        b"segment_map" => Known::Act(Some(Action::SegmentMap)),
        b"segment_unmap" => Known::Act(Some(Action::SegmentUnmap)),
        b"oom" => Known::Act(Some(Action::Oom)),
        b"snapshot" => Known::Act(Some(Action::Snapshot)),
        _ => Known::Other,
    }
}
