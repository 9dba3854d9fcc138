//! The settings a trace is replayed under: the torch emulation's setting and where it came
//! from, `paged-lazy`'s settings, the allocator configuration.
use gpumem_core::config::TorchConfig;
use gpumem_core::config::{AllocatorConfig, LazyConfig};
use gpumem_core::strategy::Strategy;

use super::SessionError;
use crate::trace::{Format, Trace};

/// Where the torch emulation's setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfSource {
    /// `--torch-conf`.
    Flag,
    /// The trace's `allocator_settings`.
    Trace,
    /// Neither: native.
    Default,
    /// Neither, in a truncated snapshot: its `allocator_settings` (written after the trace)
    /// may have been cut off.
    Cut,
}

impl std::fmt::Display for ConfSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConfSource::Flag => "from --torch-conf",
            ConfSource::Trace => "the trace's own allocator_settings",
            ConfSource::Default => "native: the trace records no allocator_settings",
            ConfSource::Cut => "native: the snapshot is cut before its allocator_settings; give --torch-conf with the setting it ran under",
        })
    }
}

/// Whether the torch emulation replays on a device that hands out the recorded run's
/// segment addresses: only under the trace's own setting (not `--torch-conf`) and with no
/// capacity given, where the emulation makes the recorded run's cudaMalloc calls.
pub fn follows_recorded(source: ConfSource, capacity: Option<u64>) -> bool {
    source != ConfSource::Flag && capacity.is_none()
}

/// The setting the trace recorded (a snapshot's `allocator_settings`), if it recorded one.
///
/// # Errors
/// [`SessionError::RecordedConf`]: the recorded settings do not parse.
pub fn recorded_conf(trace: &Trace) -> Result<Option<TorchConfig>, SessionError> {
    let Some(s) = &trace.allocator_settings else {
        return Ok(None);
    };
    s.torch_config()
        .map(Some)
        .map_err(SessionError::RecordedConf)
}

/// The torch emulation's setting: `flag` (`--torch-conf`; `native` for PyTorch's defaults)
/// when given, else the trace's own.
///
/// # Errors
/// [`SessionError::TorchConf`] or [`SessionError::RecordedConf`]: the setting does not parse.
pub fn torch_conf(
    flag: Option<&str>,
    trace: &Trace,
) -> Result<(TorchConfig, ConfSource), SessionError> {
    if let Some(s) = flag {
        // `native` (unset), the name `tune` and the replay give PyTorch's defaults.
        let conf = if s.trim() == "native" {
            TorchConfig::default()
        } else {
            TorchConfig::parse(s).map_err(SessionError::TorchConf)?
        };
        return Ok((conf, ConfSource::Flag));
    }
    Ok(match recorded_conf(trace)? {
        Some(c) => (c, ConfSource::Trace),
        None if trace.truncated.is_some() && trace.format == Some(Format::TorchSnapshot) => {
            (TorchConfig::default(), ConfSource::Cut)
        }
        None => (TorchConfig::default(), ConfSource::Default),
    })
}

/// The allocators' settings: the segment size, and the torch emulation's
/// `PYTORCH_CUDA_ALLOC_CONF`, whose memory limit is the capacity when one is given (as
/// `set_per_process_memory_fraction` sets it).
pub fn allocator_config(
    segment_bytes: u64,
    capacity: Option<u64>,
    torch: TorchConfig,
) -> AllocatorConfig {
    AllocatorConfig {
        segment_bytes,
        torch: TorchConfig {
            limit_to_capacity: capacity.is_some(),
            ..torch
        },
        ..Default::default()
    }
}

/// Parses `--lazy-conf` onto the defaults. `tune` can export `GPUMEM_CONF=strategy=paged`,
/// which is not a `paged-lazy` setting: the error then names the flag that replays it.
///
/// # Errors
/// [`SessionError::LazyConf`]: the first bad item, as [`crate::lazy_conf::parse`] words it.
pub fn lazy_conf(text: &str) -> Result<LazyConfig, SessionError> {
    crate::lazy_conf::parse(text).map_err(|error| {
        let hint = match &error {
            crate::conf_items::ItemError::UnknownKey { key, .. } if key == "strategy" => {
                let value = crate::conf_items::items(text, &crate::lazy_conf::KEYS)
                    .filter_map(Result::ok)
                    .find(|(k, _)| *k == "strategy")
                    .map_or("", |(_, v)| v);
                format!(
                    "; `strategy` is GPUMEM_CONF's choice of allocator, which is --allocator here (GPUMEM_CONF=strategy={value}: --allocator {value}); --lazy-conf holds paged-lazy's own settings"
                )
            }
            _ => String::new(),
        };
        SessionError::LazyConf { error, hint }
    })
}

/// The replay settings the trace commands share, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplaySettings {
    /// The device capacity given, in bytes (`None`: the default device, and the torch
    /// emulation has no memory limit).
    pub capacity: Option<u64>,
    /// Segment size of the buddy, tlsf and best-fit pools, in bytes.
    pub segment_bytes: u64,
    /// `--torch-conf` (`None`: the trace's own setting).
    pub torch_conf: Option<String>,
    /// `--lazy-conf` (`None`: `paged-lazy`'s defaults).
    pub lazy_conf: Option<String>,
}

/// What [`ReplaySettings::setup`] decided for one trace.
#[derive(Debug, Clone)]
pub struct TraceSetup {
    /// The allocators' settings.
    pub config: AllocatorConfig,
    /// Where the torch emulation's setting came from.
    pub conf_source: ConfSource,
    /// The capacity of the simulated device, in bytes (the one given, else the default).
    pub capacity_bytes: u64,
    /// Whether the torch emulation follows the recorded addresses ([`follows_recorded`]).
    pub follow_recorded: bool,
}

impl ReplaySettings {
    /// The setup of `trace` under these settings: the torch emulation's setting (the one
    /// given, else the trace's own), then `paged-lazy`'s.
    ///
    /// # Errors
    /// [`SessionError::TorchConf`] or [`SessionError::RecordedConf`]: the torch setting does
    /// not parse; [`SessionError::LazyConf`]: `lazy_conf` does not.
    pub fn setup(&self, trace: &Trace) -> Result<TraceSetup, SessionError> {
        let (torch, conf_source) = torch_conf(self.torch_conf.as_deref(), trace)?;
        let mut config = allocator_config(self.segment_bytes, self.capacity, torch);
        if let Some(text) = &self.lazy_conf {
            config.lazy = lazy_conf(text)?;
        }
        Ok(TraceSetup {
            config,
            conf_source,
            capacity_bytes: self.capacity.unwrap_or(gpumem_core::sim::DEFAULT_CAPACITY),
            follow_recorded: follows_recorded(conf_source, self.capacity),
        })
    }

    /// The warnings for `--lazy-conf` under `strategies` ([`super::lazy_conf_warnings`]),
    /// none without it.
    pub fn lazy_warnings(&self, setup: &TraceSetup, strategies: &[Strategy]) -> Vec<String> {
        self.lazy_conf
            .as_deref()
            .map(|text| super::lazy_conf_warnings(text, &setup.config.lazy, strategies))
            .unwrap_or_default()
    }
}
