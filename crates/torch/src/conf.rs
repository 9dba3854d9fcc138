//! `GPUMEM_CONF`: the plug-in's settings, as `key=value` pairs separated by commas, in the
//! style of `PYTORCH_CUDA_ALLOC_CONF`:
//!
//! ```text
//! GPUMEM_CONF=strategy=paged,reserve=256MiB,release_threshold=4GiB
//! ```
//!
//! | key | value | default |
//! |---|---|---|
//! | `strategy` | `paged-lazy`, `paged`, `torch`, `tlsf`, `buddy`, `best-fit` | `paged-lazy` |
//! | `mode` | `direct` (PyTorch's stream semantics, see [`gpumem::pool::DirectPool`]) or `pool` (gpumem's `DevicePool`, size-class caches, events) | `direct` |
//! | `reserve` | bytes taken from the device at the pool's creation and kept cached | 256 MiB |
//! | `release_threshold` | `mode=pool`: reserved bytes above which freed memory goes back to the device (`none`: never) | none |
//! | `max_cached_block` | `mode=pool`: largest block kept in the stream caches; larger ones go back to the strategy behind an event | 1 GiB |
//! | `shard_cache` | `mode=pool`: bytes one thread's cache may hold before it is flushed | 2 GiB |
//! | `segment` | segment size of the segmented strategies (`tlsf`, `buddy`, `best-fit`) | 256 MiB |
//! | `page_cache_pages` | free physical pages `paged` keeps before releasing them | 1024 |
//! | `placement` | `paged-lazy`: `segments` (PyTorch's expandable segments, one physical handle per growth) or `pages` (gpumem's page placement, which `headroom`, `max_handle` and `map_ahead` tune) | `segments` |
//! | `headroom` | `paged-lazy` with `placement=pages` (no effect with `segments`): fraction of the peak of allocated bytes it may hold above that peak in idle pages before it moves pages instead of creating them (`0.02` = 2 %) | 0 |
//! | `max_handle` | `paged-lazy` with `placement=pages` (no effect with `segments`): largest physical handle (runs of new pages are cut into powers of two of pages) | 1 GiB |
//! | `map_ahead` | `paged-lazy` with `placement=pages` (no effect with `segments`): most bytes mapped ahead of a block while below the headroom | 1 GiB |
//! | `grow_ahead` | `paged-lazy` with `placement=segments` (no effect with `pages`): fraction of the bytes held that each growth maps beyond the request, 0 to 1 (fewer driver calls for a higher peak; `0.0156` removes most steady-state growths, BENCHMARKS.md "Open targets: the default placement's peak and calls") | 0 |
//! | `backend` | `cuda`, or `sim` (the simulated device: tests without a GPU) | `cuda` |
//! | `sim_capacity` | capacity of the simulated device | 80 GiB |
//!
//! Sizes take a unit: `B`, `KiB`/`MiB`/`GiB`/`TiB` (and `K`/`M`/`G`/`T`, binary as in PyTorch),
//! `KB`/`MB`/`GB`/`TB` (decimal), or none (bytes). Keys and values are case-sensitive.
//!
//! [`parse`] is lenient, as the C boundary must be: an unknown key or bad value becomes a
//! [`ConfError`] in the returned list and the default is kept. [`parse_strict`] fails on the
//! first one.
#![forbid(unsafe_code)]

use gpumem::conf_items::{items, ItemError};
use gpumem::pool::PoolConfig;
use gpumem_core::config::AllocatorConfig;
use gpumem_core::strategy::Strategy;

/// Keys `GPUMEM_CONF` accepts, in the order of the table above.
pub const KEYS: [&str; 15] = [
    "strategy",
    "mode",
    "reserve",
    "release_threshold",
    "max_cached_block",
    "shard_cache",
    "segment",
    "page_cache_pages",
    "placement",
    "headroom",
    "max_handle",
    "map_ahead",
    "grow_ahead",
    "backend",
    "sim_capacity",
];

/// Where the pools take memory from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The CUDA driver (cuMemAlloc, or the VMM calls for `paged`).
    Cuda,
    /// The simulated device of [`gpumem_core::sim`] (no memory behind the addresses).
    Sim,
}

/// How blocks go back to the strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// [`gpumem::pool::DirectPool`]: at once on the main stream (PyTorch's semantics).
    Direct,
    /// gpumem's `DevicePool`: size-class caches per stream, events before the strategy.
    Pool,
}

/// The plug-in's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conf {
    /// Allocator strategy.
    pub strategy: Strategy,
    /// How blocks go back to the strategy.
    pub mode: Mode,
    /// Where memory comes from.
    pub backend: Backend,
    /// Capacity of the simulated device, in bytes (only with [`Backend::Sim`]).
    pub sim_capacity_bytes: u64,
    /// The device pool's settings (reserve, release threshold, caches).
    pub pool: PoolConfig,
    /// The strategy's settings (segment size, page cache).
    pub allocator: AllocatorConfig,
}

impl Default for Conf {
    fn default() -> Self {
        Conf {
            strategy: Strategy::PagedLazy,
            mode: Mode::Direct,
            backend: Backend::Cuda,
            sim_capacity_bytes: 80 << 30,
            pool: PoolConfig::default(),
            allocator: AllocatorConfig::default(),
        }
    }
}

/// A setting that could not be used: the item and what was wrong, worded as
/// `gpumem replay --lazy-conf` words it ([`ItemError`]), then what the plug-in did instead
/// (ignored the item, or kept the key's default).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPUMEM_CONF: {0}; {fate}", fate = fate(&self.0))]
pub struct ConfError(pub ItemError);

/// What the lenient [`parse`] does with a bad item.
fn fate(e: &ItemError) -> &'static str {
    match e {
        ItemError::BadValue { .. } => "the default is used",
        ItemError::NotKeyValue { .. }
        | ItemError::UnknownKey { .. }
        | ItemError::Repeated { .. } => "ignored",
    }
}

/// Parses `GPUMEM_CONF` leniently: returns the settings (defaults where an item was bad) and
/// every item that was ignored, in order. Items are split as `replay --lazy-conf` splits
/// them ([`gpumem::conf_items::items`]); empty items (`a=1,,b=2`) are skipped.
pub fn parse(s: &str) -> (Conf, Vec<ConfError>) {
    let mut c = Conf::default();
    let errors = items(s, &KEYS)
        .filter_map(|item| {
            item.and_then(|(key, value)| apply(&mut c, key, value))
                .err()
        })
        .map(ConfError)
        .collect();
    (c, errors)
}

/// Parses `GPUMEM_CONF`, failing on the first item that [`parse`] would ignore.
///
/// # Errors
/// The first [`ConfError`].
pub fn parse_strict(s: &str) -> Result<Conf, ConfError> {
    let (c, mut errors) = parse(s);
    if errors.is_empty() {
        Ok(c)
    } else {
        Err(errors.swap_remove(0))
    }
}

fn apply(c: &mut Conf, key: &str, value: &str) -> Result<(), ItemError> {
    let bad = |why: String| ItemError::bad_value(key, value, why);
    let size = || parse_size(value).map_err(bad);
    match key {
        "strategy" => {
            let names = Strategy::parse_list(value).map_err(|e| bad(e.to_string()))?;
            match names.as_slice() {
                [one] => c.strategy = *one,
                _ => return Err(bad("expected one strategy".into())),
            }
        }
        "mode" => {
            c.mode = match value {
                "direct" => Mode::Direct,
                "pool" => Mode::Pool,
                _ => return Err(bad("expected direct or pool".into())),
            }
        }
        "reserve" => c.pool.reserve_bytes = size()?,
        "release_threshold" => {
            c.pool.release_threshold_bytes = if value == "none" { u64::MAX } else { size()? }
        }
        "max_cached_block" => c.pool.max_cached_block_bytes = size()?,
        "shard_cache" => c.pool.shard_cache_bytes = size()?,
        "segment" => {
            let v = size()?;
            if v == 0 {
                return Err(bad("a segment must be at least 1 byte".into()));
            }
            c.allocator.segment_bytes = v;
        }
        "page_cache_pages" => {
            c.allocator.page_cache_pages = value
                .parse()
                .map_err(|_| bad("expected a whole number of pages".into()))?
        }
        "placement" | "headroom" | "max_handle" | "map_ahead" | "grow_ahead" => {
            gpumem::lazy_conf::apply(&mut c.allocator.lazy, key, value).map_err(bad)?;
        }
        "backend" => {
            c.backend = match value {
                "cuda" => Backend::Cuda,
                "sim" => Backend::Sim,
                _ => return Err(bad("expected cuda or sim".into())),
            }
        }
        "sim_capacity" => c.sim_capacity_bytes = size()?,
        _ => return Err(ItemError::unknown_key(key, &KEYS)),
    }
    Ok(())
}

/// Sizes are parsed as everywhere in gpumem ([`gpumem::units::parse_size`]): B, KB/MB/GB/TB
/// (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024), K/M/G/T (binary); a fraction is
/// allowed (`1.5GiB`) and rounded to the nearest byte.
pub use gpumem::units::parse_size;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paged_lazy_knobs() {
        let c = parse_strict(
            "strategy=paged-lazy,headroom=0.02,max_handle=64MiB,map_ahead=0,grow_ahead=0.01",
        )
        .unwrap();
        assert_eq!(c.strategy, Strategy::PagedLazy);
        assert_eq!(c.allocator.lazy.grow_ahead_bp, 100);
        assert_eq!(c.allocator.lazy.headroom_bp, 200);
        assert_eq!(c.allocator.lazy.handle_bytes, 64 << 20);
        assert_eq!(c.allocator.lazy.ahead_bytes, 0);
        let (c, e) = parse("headroom=-1,max_handle=0,headroom=x,grow_ahead=2");
        assert_eq!(e.len(), 4, "{e:?}");
        assert_eq!(c.allocator.lazy, AllocatorConfig::default().lazy);
    }

    #[test]
    fn the_issue_example_parses() {
        let c = parse_strict("strategy=paged,reserve=256MiB,release_threshold=4GiB").unwrap();
        assert_eq!(c.strategy, Strategy::Paged);
        assert_eq!(c.pool.reserve_bytes, 256 << 20);
        assert_eq!(c.pool.release_threshold_bytes, 4 << 30);
        assert_eq!(c.backend, Backend::Cuda);
    }

    #[test]
    fn every_key_sets_its_field() {
        let c = parse_strict(
            " strategy = best_fit , mode=pool, reserve=0, release_threshold=none, max_cached_block=64M, \
             shard_cache=1.5GiB, segment=2MB, page_cache_pages=7, backend=sim, sim_capacity=1G",
        )
        .unwrap();
        assert_eq!(c.strategy, Strategy::BestFit);
        assert_eq!(c.mode, Mode::Pool);
        assert_eq!(c.pool.reserve_bytes, 0);
        assert_eq!(c.pool.release_threshold_bytes, u64::MAX);
        assert_eq!(c.pool.max_cached_block_bytes, 64 << 20);
        assert_eq!(c.pool.shard_cache_bytes, 3 << 29);
        assert_eq!(c.allocator.segment_bytes, 2_000_000);
        assert_eq!(c.allocator.page_cache_pages, 7);
        assert_eq!(c.backend, Backend::Sim);
        assert_eq!(c.sim_capacity_bytes, 1 << 30);
    }

    #[test]
    fn bad_items_are_named_and_defaults_kept() {
        let (c, e) = parse("strategy=nope,reserve=12XB,colour=red,oops,,segment=0,reserve=1KiB");
        let d = Conf::default();
        assert_eq!(c.strategy, d.strategy);
        assert_eq!(c.allocator.segment_bytes, d.allocator.segment_bytes);
        assert_eq!(
            c.pool.reserve_bytes, 1024,
            "a later good item still applies"
        );
        assert_eq!(e.len(), 5, "{e:?}");
        let text: Vec<String> = e.iter().map(ToString::to_string).collect();
        assert!(text[0].contains("`nope` for `strategy`"), "{}", text[0]);
        assert!(text[1].contains("`12XB` for `reserve`") && text[1].contains("unknown unit `xb`"));
        assert!(text[2].starts_with("GPUMEM_CONF: unknown key `colour`"));
        assert!(text[2].contains("strategy, mode, reserve, release_threshold"));
        assert_eq!(
            text[3],
            format!(
                "GPUMEM_CONF: `oops` is not key=value (keys: {}); ignored",
                KEYS.join(", ")
            )
        );
        assert!(text[4].contains("`0` for `segment`"));
        assert_eq!(parse_strict("colour=red"), Err(e[2].clone()));
    }

    #[test]
    fn empty_conf_is_the_default() {
        assert_eq!(parse(""), (Conf::default(), vec![]));
        assert_eq!(parse(" , ,"), (Conf::default(), vec![]));
    }

    #[test]
    fn sizes_round_trip_through_units() {
        for (s, v) in [
            ("4096", 4096),
            ("1KiB", 1024),
            ("1kb", 1000),
            ("2M", 2 << 20),
            ("0.5GiB", 1 << 29),
            ("1_000B", 1000),
            ("16T", 16 << 40),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
        for s in ["", "GiB", "1.2.3", "99999999999999999999T", "-1"] {
            assert!(parse_size(s).is_err(), "{s}");
        }
    }
}
