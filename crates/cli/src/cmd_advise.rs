//! `gpumem advise`: pageable, pinned, staged or mapped memory for a transfer pattern, from
//! the table `gpumem bench transfer` caches (or built-in figures).
use anyhow::{Context, Result};
use clap::Args;
use gpumem::pinned::advise::{self, Direction, Pattern, TransferTable};
use gpumem::pinned::sysinfo;
use gpumem::units::{self, parse_size};
use std::path::PathBuf;

use crate::cmd_bench::transfer::parse_dirs;

fn parse_transfer_size(s: &str) -> Result<u64, String> {
    match crate::units::parse_positive_size(s)? {
        0 => Err(format!(
            "`{s}`: a transfer of 0 B needs no memory; give its size, e.g. 4KiB"
        )),
        n => Ok(n),
    }
}

/// `advise --per-second`: a finite number of transfers per second, 0 or more.
fn parse_per_second(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!(
            "`{s}`: expected transfers per second, a number ≥ 0 (0: a one-off)"
        )),
    }
}

/// `advise --horizon`: a finite number of seconds above zero.
fn parse_horizon(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!(
            "`{s}`: expected the seconds the pattern runs, a number above 0"
        )),
    }
}

/// `advise --direction`: one direction (the advice weighs the copies of one). A word that is
/// no direction gets the same message as `both`: `bench transfer`'s "expected h2d, d2h or
/// both" offered a value that is refused here.
fn parse_advise_direction(s: &str) -> Result<Direction, String> {
    match parse_dirs(s).as_deref() {
        Ok([d @ (Direction::H2d | Direction::D2h)]) => Ok(*d),
        Ok(_) => Err(format!(
            "`{s}`: expected one direction, h2d or d2h (both at once is measured by `gpumem bench transfer --directions both`, not advised on)"
        )),
        Err(_) => Err(format!("`{s}`: expected one direction, h2d or d2h")),
    }
}

/// Arguments of `gpumem advise`.
#[derive(Args)]
pub struct AdviseArgs {
    /// Bytes per transfer, with units (at least 1 B).
    #[arg(long, value_parser = parse_transfer_size, allow_hyphen_values = true)]
    pub size: u64,
    /// Transfers per second (0: a one-off).
    #[arg(long, default_value_t = 0.0, value_parser = parse_per_second, allow_hyphen_values = true)]
    pub per_second: f64,
    /// The copy must be asynchronous (overlap host work or kernels).
    #[arg(long = "async")]
    pub asynchronous: bool,
    /// Direction: h2d or d2h.
    #[arg(long, default_value = "h2d", value_parser = parse_advise_direction)]
    pub direction: Direction,
    /// Seconds the pattern runs (a pool's cold allocation is spread over them).
    #[arg(long, default_value_t = 60.0, value_parser = parse_horizon, allow_hyphen_values = true)]
    pub horizon: f64,
    /// Cap on pinned memory, with units (default: half of RAM or of the cgroup limit).
    #[arg(long, value_parser = parse_size, allow_hyphen_values = true)]
    pub cap: Option<u64>,
    /// A table written by `bench transfer` (default: the cached one, else built-in H200 figures).
    #[arg(long)]
    pub table: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `gpumem advise`.
pub fn advise(a: AdviseArgs) -> Result<()> {
    let table = match &a.table {
        Some(p) => serde_json::from_str(
            &std::fs::read_to_string(p).with_context(|| format!("--table {}: reading it", p.display()))?,
        )
        .with_context(|| {
            format!(
                "--table {}: expected a table as `gpumem bench transfer` caches it for advise (an object with source, device, transfers; {})",
                p.display(),
                advise::cache_path().map_or_else(
                    || "cached under $XDG_CACHE_HOME or ~/.cache as gpumem/transfer.json".to_string(),
                    |c| format!("here {}", c.display())
                )
            )
        })?,
        None => match advise::load_cached_table() {
            Some((_, t)) if !t.transfers.is_empty() => {
                // Allocation costs missing from a measured table: the built-in ones.
                let mut t = t;
                if t.alloc.is_empty() {
                    t.alloc = TransferTable::h200().alloc;
                }
                t
            }
            _ => TransferTable::h200(),
        },
    };
    let direction = a.direction;
    let pattern = Pattern {
        bytes: a.size,
        per_second: a.per_second,
        asynchronous: a.asynchronous,
        direction,
        pinned_cap_bytes: a.cap.unwrap_or_else(sysinfo::default_pinned_cap_bytes),
        horizon_s: a.horizon,
    };
    let adv = advise::advise(&table, &pattern);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&adv)?);
        return Ok(());
    }
    println!(
        "{} {} per transfer, {}{}, over {} s; figures: {} ({})",
        direction.name(),
        units::bytes(a.size),
        if a.per_second == 0.0 {
            "a one-off".to_string()
        } else {
            format!("{}/s", a.per_second)
        },
        if a.asynchronous { ", asynchronous" } else { "" },
        a.horizon,
        adv.source,
        table.device
    );
    println!(
        "{:<15} {:>12} {:>14} {:>12} {:>8}  note",
        "kind", "transfer", "alloc/transfer", "total", "busy %"
    );
    for o in &adv.options {
        println!(
            "{:<15} {:>12} {:>14} {:>12} {:>8}  {}",
            o.kind.name(),
            units::duration(o.transfer_s),
            units::duration(o.alloc_per_transfer_s),
            units::duration(o.total_s),
            advise::busy_percent(o.busy_fraction),
            o.excluded.as_deref().unwrap_or(o.how)
        );
    }
    if let Some(u) = adv.unpooled_pinned_s {
        println!(
            "(pinned memory allocated and freed per transfer, without a pool: {} per transfer)",
            units::duration(u)
        );
    }
    println!("recommended: {} — {}", adv.recommended.name(), adv.reason);
    Ok(())
}
