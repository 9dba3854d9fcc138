//! The replay's table: one row per allocator, the columns in [`columns`], the smallest
//! capacities and the notes under them.
use gpumem::session::DeviceMinCapacity;

use super::{JsonAllocator, JsonOut};
use crate::units::{counted, human_bytes};
use gpumem::replay::MinCapacityOutcome;

/// One column of the replay table: header, width, and the cell of an allocator's row.
/// Add a column by adding an entry in [`columns`].
struct Column {
    header: &'static str,
    width: usize,
    cell: fn(&JsonAllocator) -> String,
}

fn columns(j: &JsonOut) -> Vec<Column> {
    let mut c = vec![
        Column {
            header: "allocator",
            width: 9,
            cell: |a| a.name.clone(),
        },
        Column {
            header: "peak reserv.",
            width: 12,
            cell: |a| human_bytes(a.peak_reserved_bytes),
        },
        Column {
            header: "peak alloc.",
            width: 12,
            cell: |a| human_bytes(a.peak_allocated_bytes),
        },
        Column {
            header: "res/req",
            width: 8,
            // Rows with failed allocations divide by what they served: marked. No byte
            // requested (zero-byte requests only, or none served): no ratio.
            cell: |a| {
                let mark = if a.oom_count + a.refused_count > 0 {
                    "†"
                } else {
                    ""
                };
                let r = (a.peak_requested_served_bytes > 0).then_some(a.reserved_over_requested);
                format!("{}{mark}", ratio(r))
            },
        },
        Column {
            header: "ext.frag",
            width: 8,
            cell: |a| format!("{:.3}", a.peak_external_fragmentation),
        },
        Column {
            header: "frag@pk",
            width: 7,
            cell: |a| format!("{:.3}", a.external_fragmentation_at_peak),
        },
        Column {
            header: "inact.split",
            width: 11,
            cell: |a| human_bytes(a.inactive_split_bytes_peak),
        },
        Column {
            header: "retries",
            width: 7,
            cell: |a| a.num_alloc_retries.to_string(),
        },
        Column {
            header: "OOMs",
            width: 5,
            cell: |a| a.oom_count.to_string(),
        },
    ];
    if j.allocators.iter().any(|a| a.oom_count > 0) {
        c.push(Column {
            header: "first OOM",
            width: 9,
            cell: |a| {
                a.first_oom_event
                    .map_or_else(|| "-".to_string(), |e| format!("#{e}"))
            },
        });
    }
    if j.allocators.iter().any(|a| a.refused_count > 0) {
        c.push(Column {
            header: "refused",
            width: 7,
            cell: |a| a.refused_count.to_string(),
        });
    }
    c.push(Column {
        header: "driver calls",
        width: 12,
        cell: |a| a.driver_calls_total.to_string(),
    });
    c.push(Column {
        header: "2nd half",
        width: 8,
        cell: |a| a.steady_state_driver_calls.to_string(),
    });
    c.push(Column {
        header: "driver time",
        width: 11,
        cell: |a| gpumem::units::duration(a.modelled_driver_seconds),
    });
    if j.trace.duration_seconds.is_some() {
        c.push(Column {
            header: "of trace",
            width: 8,
            cell: |a| {
                a.driver_share_of_trace
                    .map_or_else(|| "-".to_string(), |s| format!("{:.1} %", s * 100.0))
            },
        });
    }
    c.push(Column {
        header: "events/s",
        width: 9,
        cell: |a| gpumem::units::rate(a.events_per_second),
    });
    if j.device != "sim" {
        c.push(Column {
            header: "canary",
            width: 7,
            cell: |a| {
                if a.canary_errors == 0 {
                    "ok".to_string()
                } else {
                    format!("{} BAD", a.canary_errors)
                }
            },
        });
    }
    c
}

/// A ratio to peak requested bytes, to 3 decimals; `-` for `None`, when nothing was
/// requested (where `--json` has 0).
fn ratio(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |r| format!("{r:.3}"))
}

/// Why a pool's reserved peak on a real device can differ from the simulated one's.
const SIM_DIFFERS: &str = "the torch emulation, as PyTorch, gives a request the free block \
of the lowest address among those of one size, so where segments are freed and made again \
during the run (the garbage collector, empty_cache, an OOM) its placement follows the \
addresses the device hands out, and the driver's are not the simulated device's; the \
simulated device with the trace's own addresses (`--device sim`, no --capacity) gives the \
recorded run's figures. The other allocators place by creation order or by offset in \
their own reservations, not by device address: a difference there is a bug.";

/// The line said under the real-device table when a pool's reserved peak there is not the
/// simulated one's: `rows` are (allocator, real peak reserved, simulated peak reserved).
fn sim_differs<'a>(rows: impl Iterator<Item = (&'a str, u64, Option<u64>)>) -> Option<String> {
    let differ: Vec<&str> = rows
        .filter(|&(_, real, sim)| sim.is_some_and(|s| s != real))
        .map(|(name, _, _)| name)
        .collect();
    (!differ.is_empty()).then(|| {
        format!(
            "pool reserved differs from the simulated device's for {}: {SIM_DIFFERS}",
            differ.join(", ")
        )
    })
}

pub(super) fn print_table(j: &JsonOut, capacity: u64, capacity_given: bool) {
    let t = &j.trace;
    println!(
        "trace {}: {} ({}, {}), peak requested {}, largest request {}{}{}",
        gpumem::trace::source_name(std::path::Path::new(&t.path)),
        counted(t.events, "event"),
        counted(t.alloc_events, "alloc"),
        counted(t.free_events, "free"),
        human_bytes(t.peak_requested_bytes),
        human_bytes(t.largest_request_bytes),
        if t.impossible_requests > 0 {
            format!(
                " (not counting {} too large for any allocator)",
                counted(t.impossible_requests, "request")
            )
        } else {
            String::new()
        },
        t.duration_seconds
            .map(|d| format!(", {}", gpumem::units::duration(d)))
            .unwrap_or_default()
    );
    println!(
        "device {} with capacity {}{}{}",
        j.device,
        human_bytes(capacity),
        if j.device == "sim" && !capacity_given {
            " (the H200's, as cuMemGetInfo reports it)"
        } else if j.device == "all" {
            " (the trace's device N on cuda:N)"
        } else {
            ""
        },
        if t.devices.len() > 1 {
            format!(
                ", {} devices in the trace (figures summed; one pool and one such device each)",
                t.devices.len()
            )
        } else {
            String::new()
        }
    );
    println!();
    let mut cols = columns(j);
    // A column is as wide as its widest cell (a long allocator name such as `paged-lazy`).
    for c in &mut cols {
        let widest = j
            .allocators
            .iter()
            .map(|a| (c.cell)(a).chars().count())
            .max()
            .unwrap_or(0);
        c.width = c.width.max(widest).max(c.header.chars().count());
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, (c, v)) in cols.iter().zip(cells).enumerate() {
            if i == 0 {
                s.push_str(&format!("{v:<w$}", w = c.width));
            } else {
                s.push_str(&format!(" {v:>w$}", w = c.width));
            }
        }
        println!("{}", s.trim_end());
    };
    line(cols.iter().map(|c| c.header.to_string()).collect());
    for a in &j.allocators {
        line(cols.iter().map(|c| (c.cell)(a)).collect());
    }
    print_real_against_simulated(j);
    print_references(j);
}

/// On a real device: each pool's reserved peak, the driver's used-memory delta and the same
/// replay's simulated peak, with why they may differ.
fn print_real_against_simulated(j: &JsonOut) {
    if j.allocators
        .iter()
        .any(|a| a.simulated_peak_reserved_bytes.is_some())
    {
        println!();
        println!(
            "{:<9} {:>16} {:>16} {:>16} {:>10}",
            "allocator", "pool reserved", "cuMemGetInfo Δ", "simulated", "real/sim"
        );
        for a in &j.allocators {
            let sim = a.simulated_peak_reserved_bytes.unwrap_or(0);
            println!(
                "{:<9} {:>16} {:>16} {:>16} {:>10.4}",
                a.name,
                human_bytes(a.peak_reserved_bytes),
                a.driver_peak_delta_bytes
                    .map(human_bytes)
                    .unwrap_or_else(|| "-".into()),
                human_bytes(sim),
                if sim == 0 {
                    0.0
                } else {
                    a.driver_peak_delta_bytes.unwrap_or(a.peak_reserved_bytes) as f64 / sim as f64
                }
            );
        }
        let rows = j.allocators.iter().map(|a| {
            (
                a.name.as_str(),
                a.peak_reserved_bytes,
                a.simulated_peak_reserved_bytes,
            )
        });
        if let Some(line) = sim_differs(rows) {
            println!("{line}");
        }
    }
}

/// The reference lines under the table: PyTorch's own figures for the run, and the planned
/// layout.
fn print_references(j: &JsonOut) {
    if !j.pytorch_recorded.is_empty() {
        let parts: Vec<String> = j
            .pytorch_recorded
            .iter()
            .map(|r| {
                format!(
                    "{} {} ({})",
                    r.conf,
                    human_bytes(r.reserved_bytes_peak),
                    ratio((j.trace.peak_requested_bytes > 0).then_some(r.reserved_over_requested))
                )
            })
            .collect();
        println!(
            "PyTorch's own peak reserved for this run (memory_stats beside the trace): {}",
            parts.join(", ")
        );
    }
    let planned: Vec<String> = j
        .trace
        .planned_layout
        .iter()
        .map(|p| {
            let dev = if j.trace.planned_layout.len() > 1 {
                format!("device {}: ", p.device)
            } else {
                String::new()
            };
            // A device's layout holds at least its peak requested bytes: the ratio is 0 only
            // when that peak is.
            format!(
                "{dev}{} ({})",
                human_bytes(p.layout_bytes),
                ratio((p.over_requested > 0.0).then_some(p.over_requested))
            )
        })
        .collect();
    if !planned.is_empty() {
        let total = if j.trace.planned_layout.len() > 1 {
            let bytes: u64 = j.trace.planned_layout.iter().map(|p| p.layout_bytes).sum();
            let peak = j.trace.peak_requested_bytes;
            let r = ratio((peak > 0).then(|| bytes as f64 / peak as f64));
            format!("; all devices {} ({r})", human_bytes(bytes))
        } else {
            String::new()
        };
        println!(
            "planned layout (the whole trace known in advance, no block ever moved): {}{total}",
            planned.join(", ")
        );
    } else if let Some(why) = &j.trace.planned_layout_skipped {
        println!("planned layout: skipped ({why})");
    }
}

pub(super) fn print_min_capacity(min_caps: &[(&'static str, &[DeviceMinCapacity])]) {
    println!();
    println!("smallest simulated capacity (to the 2 MiB granularity):");
    println!(
        "{:<10} {:>6} {:>14} {:>18} {:>8}  note",
        "allocator", "device", "completes at", "and every larger", "replays"
    );
    for (name, list) in min_caps {
        for m in *list {
            match &m.outcome {
                MinCapacityOutcome::Found(f) => {
                    let mut notes = Vec::new();
                    if f.all_larger_bytes != f.smallest_bytes {
                        notes.push(format!(
                            "not monotone: completes at {} but fails somewhere below {}",
                            human_bytes(f.smallest_bytes),
                            human_bytes(f.all_larger_bytes)
                        ));
                    }
                    if !f.exact {
                        notes.push("partly bisected (assumes monotone above the scanned range)".into());
                    }
                    let line = format!(
                        "{:<10} {:>6} {:>14} {:>18} {:>8}  {}",
                        name,
                        m.device,
                        human_bytes(f.smallest_bytes),
                        human_bytes(f.all_larger_bytes),
                        f.replays,
                        notes.join("; ")
                    );
                    // No note: no spaces at the end of the line.
                    println!("{}", line.trim_end());
                }
                MinCapacityOutcome::NeverCompletes(i) => println!(
                    "{:<10} {:>6} {:>14} {:>18} {:>8}  does not complete even with {}: {} ({} failed allocation{}, the first at event index {})",
                    name,
                    m.device,
                    "-",
                    "-",
                    1,
                    human_bytes(i.upper_bytes),
                    i.reason,
                    i.failed_count,
                    if i.failed_count == 1 { "" } else { "s" },
                    i.first_failed_event
                        .map_or_else(|| "?".to_string(), |e| e.to_string())
                ),
            }
        }
    }
    println!(
        "replays: simulated replays of the whole trace the search ran (a scan, then a bisection)."
    );
}

pub(super) fn print_notes(j: &JsonOut, capacity: u64) {
    let failed: u64 = j
        .allocators
        .iter()
        .map(|a| a.oom_count + a.refused_count)
        .sum();
    if failed > 0 {
        println!();
        println!(
            "† failed allocations (OOMs under {}, or refused) were dropped with their frees and the replay went on (PyTorch would have stopped at the first OOM); res/req divides by the peak requested bytes of the blocks served.",
            human_bytes(capacity)
        );
        for a in &j.allocators {
            if let Some(r) = &a.first_refusal {
                println!("  {} refused {}", a.name, r);
            }
        }
    }
    println!();
    println!("res/req: peak reserved / peak requested (1.000 = no memory lost to rounding or fragmentation; - when no byte was requested).");
    if !j.trace.planned_layout.is_empty() {
        println!("planned layout: every block at one address for its life, placed with the whole trace known in advance (greedy: the smaller of largest-first, as TensorFlow Lite's planner, and longest-lived-first; requests rounded to 512 B), ÷ peak requested in brackets; what foresight alone buys a placement that never moves memory. A heuristic, not a floor: paged, which remaps pages, often goes below it.");
    }
    println!("ext.frag: highest external fragmentation 1 - largest free block / free bytes (about 1000 samples and the peak); frag@pk: the same right after the event that set peak reserved.");
    println!("inact.split: peak free bytes inside segments or pages that hold live blocks (PyTorch's inactive_split_bytes); retries: cache released and retried after the device refused (num_alloc_retries).");
    println!("driver time: modelled from H200 call costs per kind and size on the simulated device, measured on a real one{}.",
        if j.trace.duration_seconds.is_some() { "; of trace: that time as a share of the trace's own duration" } else { "" });
    println!(
        "2nd half: driver calls made during the second half of the events (the steady state)."
    );
    println!("events/s: events replayed per CPU second of the replaying thread (allocators replay side by side on the simulated device).");
}

#[cfg(test)]
mod tests {
    use super::sim_differs;

    #[test]
    fn a_real_peak_off_the_simulated_one_is_named_and_explained() {
        let rows = [
            ("torch", 6_582_960_128, Some(6_421_479_424)),
            ("paged", 3_653_238_784, Some(3_653_238_784)),
            ("tlsf", 7_285_506_048, None),
        ];
        let line = sim_differs(rows.into_iter()).expect("torch differs");
        assert!(
            line.starts_with("pool reserved differs from the simulated device's for torch: "),
            "{line}"
        );
        assert!(line.contains("lowest address"), "{line}");
        let same = [("torch", 1, Some(1)), ("paged", 2, None)];
        assert_eq!(sim_differs(same.into_iter()), None);
    }
}
