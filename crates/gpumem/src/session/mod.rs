//! One replay setup for the trace commands (`replay`, `tune`, `report`, `map`): what their
//! shared flags mean, decided once.
//!
//! - [`ReplaySettings`]: the capacity, segment size, torch emulation's setting and
//!   `paged-lazy`'s settings as given ([`check_capacity`], [`check_segment_size`] and
//!   [`lazy_conf`] refuse what is wrong before a trace is read);
//!   [`ReplaySettings::setup`] turns them and a trace into a [`TraceSetup`]
//!   (the [`AllocatorConfig`](gpumem_core::config::AllocatorConfig), where the torch setting
//!   came from, whether the emulation follows the recorded addresses).
//! - Which devices a trace allocates on and which one a command looks at
//!   ([`alloc_devices`], [`pick_device`]).
//! - The warnings a setting earns ([`capacity_warnings`], [`segment_size_warning`],
//!   [`segment_granularity_warning`], [`lazy_conf_warnings`], [`torch_conf_warnings`]) and
//!   the notes a trace earns ([`read_notes`]).
//! - [`compare`]: a trace through several strategies, one run per strategy
//!   ([`run_strategy`]: every device of the trace, then the smallest capacities when asked).
//!
//! Messages name the commands' flags (`--capacity`, `--torch-conf`, ...): they are the words
//! the user typed.
mod compare;
mod conf;
mod devices;
mod warnings;

pub use compare::{
    compare, oom_verdicts, planned_layouts, recorded_figures, run_strategy, CompareSettings,
    Comparison, DeviceMinCapacity, PlannedLayout, RecordedRatio, StrategyRun, NO_PLAN,
};
pub use conf::{
    allocator_config, follows_recorded, lazy_conf, recorded_conf, torch_conf, ConfSource,
    ReplaySettings, TraceSetup,
};
pub use devices::{alloc_devices, device_list, pick_device, why_no_allocation, HOW_TO_RECORD};
pub use warnings::{
    capacity_warnings, check_capacity, check_segment_size, lazy_conf_warnings, read_notes,
    segment_granularity_warning, segment_size_warning, torch_conf_warnings, MAX_CAPACITY,
};

use gpumem_core::strategy::Strategy;

/// What a trace command's setup or replays refused or failed on.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// `--capacity 0`.
    #[error("--capacity 0: expected a device capacity above zero (e.g. 80GiB)")]
    ZeroCapacity,
    /// A capacity above [`MAX_CAPACITY`], in bytes.
    #[error(
        "--capacity {}: above {} (the simulated device has 64 TiB of address space, and pools reserve several times their capacity in it; no GPU has more than a few hundred GiB)",
        crate::units::bytes(*.0),
        crate::units::bytes(MAX_CAPACITY)
    )]
    CapacityTooLarge(u64),
    /// `--segment-size 0`.
    #[error("--segment-size 0: expected a segment size above zero (e.g. 256MiB)")]
    ZeroSegmentSize,
    /// `--torch-conf` does not parse.
    #[error("--torch-conf")]
    TorchConf(#[source] gpumem_core::config::ConfError),
    /// The trace's recorded `allocator_settings` do not parse.
    #[error("the trace's allocator_settings")]
    RecordedConf(#[source] gpumem_core::config::ConfError),
    /// `--lazy-conf` does not parse; `hint` is empty or says which flag a misplaced key
    /// belongs to.
    #[error("--lazy-conf: {error}{hint}")]
    LazyConf {
        /// The first bad item.
        error: crate::conf_items::ItemError,
        /// `; ...` or empty.
        hint: String,
    },
    /// The device asked for (under `flag`) has no allocation in the trace.
    #[error("{flag} {device}: the trace has no allocation on device {device} (it has {})", device_list(.devices))]
    NoAllocationOnDevice {
        /// The flag that asked (`--trace-device`).
        flag: &'static str,
        /// The device asked for.
        device: u32,
        /// The devices that have allocations.
        devices: Vec<u32>,
    },
    /// A replay failed.
    #[error(transparent)]
    Replay(#[from] crate::replay::ReplayError),
    /// A replay of one strategy on one device of the trace failed.
    #[error("replaying {trace} with {strategy} on device {device}")]
    ReplayOf {
        /// The trace as `trace::source_name` names it.
        trace: String,
        /// The strategy.
        strategy: Strategy,
        /// The trace's device ordinal.
        device: u32,
        /// The failure.
        #[source]
        source: crate::replay::ReplayError,
    },
    /// The smallest-capacity search of one strategy on one device failed.
    #[error("smallest capacity of {strategy} on device {device}")]
    MinCapacityOf {
        /// The strategy.
        strategy: Strategy,
        /// The trace's device ordinal.
        device: u32,
        /// The failure.
        #[source]
        source: crate::replay::ReplayError,
    },
    /// A replay thread panicked.
    #[error("a replay thread panicked")]
    Panicked,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Action, Event, Trace};

    #[test]
    fn capacity_and_segment_size_bounds() {
        assert!(check_capacity(None).is_ok());
        assert!(check_capacity(Some(MAX_CAPACITY)).is_ok());
        assert!(matches!(
            check_capacity(Some(0)),
            Err(SessionError::ZeroCapacity)
        ));
        assert!(matches!(
            check_capacity(Some(MAX_CAPACITY + 1)),
            Err(SessionError::CapacityTooLarge(_))
        ));
        assert!(matches!(
            check_segment_size(0),
            Err(SessionError::ZeroSegmentSize)
        ));
        assert!(segment_granularity_warning(2 << 20).is_none());
        assert!(segment_granularity_warning(3 << 20).is_some());
    }

    #[test]
    fn the_device_asked_for_must_allocate() {
        let trace = Trace {
            events: vec![
                Event {
                    device: 1,
                    ..Event::new(Action::Alloc, 1, 512)
                },
                Event::new(Action::Free, 2, 0),
            ],
            ..Trace::default()
        };
        assert_eq!(alloc_devices(&trace), [1]);
        assert_eq!(pick_device(&trace, "--trace-device", None).unwrap(), 1);
        assert_eq!(
            pick_device(&trace, "--trace-device", Some(0))
                .unwrap_err()
                .to_string(),
            "--trace-device 0: the trace has no allocation on device 0 (it has device 1)"
        );
        assert_eq!(device_list(&[0, 1]), "devices 0, 1");
    }

    #[test]
    fn the_recorded_addresses_are_followed_only_under_the_trace_own_setting() {
        assert!(follows_recorded(ConfSource::Trace, None));
        assert!(follows_recorded(ConfSource::Default, None));
        assert!(!follows_recorded(ConfSource::Flag, None));
        assert!(!follows_recorded(ConfSource::Trace, Some(1 << 30)));
        let settings = ReplaySettings {
            capacity: Some(8 << 30),
            segment_bytes: 64 << 20,
            torch_conf: Some("native".into()),
            lazy_conf: Some("placement=pages".into()),
        };
        let setup = settings.setup(&Trace::default()).unwrap();
        assert_eq!(setup.conf_source, ConfSource::Flag);
        assert!(setup.config.torch.limit_to_capacity);
        assert_eq!(setup.config.segment_bytes, 64 << 20);
        assert_eq!(
            setup.config.lazy.placement,
            gpumem_core::config::LazyPlacement::Pages
        );
        assert_eq!(setup.capacity_bytes, 8 << 30);
        assert!(!setup.follow_recorded);
    }

    #[test]
    fn a_gpumem_conf_strategy_in_lazy_conf_names_the_flag() {
        let e = lazy_conf("strategy=paged").unwrap_err().to_string();
        assert!(e.starts_with("--lazy-conf: unknown key `strategy`"), "{e}");
        assert!(e.contains("--allocator paged"), "{e}");
        let w = lazy_conf_warnings("headroom=0.1", &Default::default(), &[Strategy::Tlsf]);
        assert_eq!(w.len(), 2, "{w:?}");
    }
}
