//! Which devices a trace allocates on, and which one a command looks at.
use super::SessionError;
use crate::trace::{Action, Format, Trace};

/// How to record a snapshot worth replaying, in one line.
pub const HOW_TO_RECORD: &str = "to record one, call \
    torch.cuda.memory._record_memory_history(max_entries=1000000) before the model is loaded, \
    run the steps, then torch.cuda.memory._dump_snapshot(\"snapshot.pickle\")";

/// The devices on which the trace allocates (alloc events or pre-existing blocks), in order.
/// [`crate::replay::devices`] are those a replay runs: every device with any event.
pub fn alloc_devices(trace: &Trace) -> Vec<u32> {
    let mut d: Vec<u32> = trace
        .events
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .map(|e| e.device)
        .chain(trace.preexisting.iter().map(|p| p.device))
        .collect();
    d.sort_unstable();
    d.dedup();
    d
}

/// `device 0` or `devices 0, 1`.
pub fn device_list(devices: &[u32]) -> String {
    let list: Vec<String> = devices.iter().map(u32::to_string).collect();
    format!(
        "device{} {}",
        if devices.len() == 1 { "" } else { "s" },
        list.join(", ")
    )
}

/// The device to look at: the one asked for (under `flag`), which must have allocations,
/// else the first that has some (0 for a trace without any).
///
/// # Errors
/// [`SessionError::NoAllocationOnDevice`]: the device asked for has no allocation in the
/// trace (the message lists those that have).
pub fn pick_device(
    trace: &Trace,
    flag: &'static str,
    asked: Option<u32>,
) -> Result<u32, SessionError> {
    let devices = alloc_devices(trace);
    match asked {
        Some(d) if !devices.is_empty() && !devices.contains(&d) => {
            Err(SessionError::NoAllocationOnDevice {
                flag,
                device: d,
                devices,
            })
        }
        Some(d) => Ok(d),
        None => Ok(devices.first().copied().unwrap_or(0)),
    }
}

/// Why a trace read without error holds no allocation to replay: every alloc/free skipped
/// under `--lenient`, a snapshot that recorded nothing (with how to record one), a snapshot
/// of segments without a trace, or a file without alloc/free events.
pub fn why_no_allocation(trace: &Trace) -> String {
    if trace.skipped_count > 0 {
        let n = trace.skipped_count;
        format!(
            "no alloc/free event is left after --lenient skipped {n} malformed event{} (the first listed above)",
            if n == 1 { "" } else { "s" }
        )
    } else if !trace.segments.is_empty() {
        "the snapshot holds segments but no trace entries (`gpumem replay` shows the state of its segments)".to_string()
    } else if trace.format == Some(Format::TorchSnapshot) {
        format!(
            "the snapshot holds no segments and no trace entries: memory history was not being \
             recorded when it was dumped; {HOW_TO_RECORD}"
        )
    } else {
        "the file is a valid trace but holds no alloc/free events".to_string()
    }
}
