//! The replay's `--timeline` chart: requested / allocated / reserved per allocator.
use crate::units::{counted, human_bytes};
use gpumem::plot::{Chart, Series, PALETTE};
use gpumem::replay::{self, ReplayReport};
use gpumem::session::StrategyRun;
use gpumem::trace::Trace;

/// A bucket's low and high as two points at the same x: the line goes down to the low and
/// up to the high inside each bucket, so no peak is lost however many events a bucket holds.
fn envelope(points: &mut Vec<(f64, f64)>, x: f64, lo: f64, hi: f64) {
    points.push((x, lo));
    if hi != lo {
        points.push((x, hi));
    }
}

/// Index in the whole trace of each event of `device`: a replay counts only its device's
/// events, the chart's x axis is the trace's.
fn trace_positions(trace: &Trace, device: u32) -> Vec<u64> {
    trace
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.device == device)
        .map(|(i, _)| i as u64)
        .collect()
}

/// The lines of one device's replay (`di`: its index in `devices`) from its `requested`,
/// `allocated` and `reserved` points: with `several` devices, reserved and requested in the
/// device's colour; else the three in their own colours.
fn device_series(
    several: bool,
    devices: &[u32],
    di: usize,
    req: Vec<(f64, f64)>,
    all: Vec<(f64, f64)>,
    res: Vec<(f64, f64)>,
) -> Vec<Series> {
    let mut out = Vec::new();
    if several {
        // Grey is the capacity line's.
        let color = PALETTE[[0, 1, 2, 4, 5, 6, 8, 9][di % 8]];
        let dev = devices.get(di).copied().unwrap_or(0);
        out.push(Series {
            label: format!("reserved, device {dev}"),
            color: color.into(),
            dashed: false,
            width: 1.6,
            points: res,
        });
        out.push(Series {
            label: format!("requested, device {dev}"),
            color: color.into(),
            dashed: true,
            width: 1.2,
            points: req,
        });
    } else {
        out.extend([
            Series {
                label: "reserved".into(),
                color: PALETTE[3].into(),
                dashed: false,
                width: 1.6,
                points: res,
            },
            // Wide and under: it shows as a band around `requested` where the two
            // coincide (every strategy but rounding differences).
            Series {
                label: "allocated".into(),
                color: PALETTE[0].into(),
                dashed: false,
                width: 4.0,
                points: all,
            },
            Series {
                label: "requested".into(),
                color: PALETTE[2].into(),
                dashed: true,
                width: 1.2,
                points: req,
            },
        ]);
    }
    out
}

/// The chart of `runs` (one panel per allocator; `devices[i]` is the device of each run's
/// `per_dev[i]`). One device: reserved, allocated (wide, under) and requested (dashed, on
/// top). Several: reserved and requested per device, each in its own colour, on the
/// trace's event axis (their sum is not drawn: the replays of two devices are apart, and
/// their buckets do not line up).
pub(super) fn timeline_chart(
    path: &std::path::Path,
    trace: &Trace,
    devices: &[u32],
    runs: &[StrategyRun],
    capacity: Option<f64>,
) -> Chart {
    let gib = (1u64 << 30) as f64;
    let positions: Vec<Vec<u64>> = devices.iter().map(|&d| trace_positions(trace, d)).collect();
    // A replay's event index → the trace's (the index past the end: the trace's length).
    let at = |dev: usize, i: u64| -> f64 {
        positions
            .get(dev)
            .and_then(|p| p.get(i as usize).copied())
            .unwrap_or(trace.events.len() as u64) as f64
    };
    let several = devices.len() > 1;
    let mut panels = Vec::new();
    let mut marks = Vec::new();
    let mut x_max = 0.0f64;
    for run in runs {
        let mut series = Vec::new();
        for (di, r) in run.per_dev.iter().enumerate() {
            let mut req = Vec::with_capacity(2 * r.timeline.len());
            let mut all = Vec::with_capacity(2 * r.timeline.len());
            let mut res = Vec::with_capacity(2 * r.timeline.len());
            for s in &r.timeline {
                let x = at(di, s.event);
                x_max = x_max.max(x);
                let gb = |m: replay::MinMax| (m.min as f64 / gib, m.max as f64 / gib);
                let (lo, hi) = gb(s.requested_bytes);
                envelope(&mut req, x, lo, hi);
                let (lo, hi) = gb(s.allocated_bytes);
                envelope(&mut all, x, lo, hi);
                let (lo, hi) = gb(s.reserved_bytes);
                envelope(&mut res, x, lo, hi);
            }
            series.extend(device_series(several, devices, di, req, all, res));
        }
        let failed: u64 = run.per_dev.iter().map(ReplayReport::failed_count).sum();
        marks.push(
            run.per_dev
                .iter()
                .enumerate()
                .flat_map(|(di, r)| r.failed_events.iter().map(move |&e| (di, e)))
                .map(|(di, e)| at(di, e))
                .collect::<Vec<f64>>(),
        );
        let peaks = run
            .per_dev
            .iter()
            .zip(devices)
            .map(|(r, d)| {
                let peak = human_bytes(r.peak_reserved_bytes);
                if several {
                    format!("{peak} on device {d}")
                } else {
                    peak
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        panels.push((
            format!(
                "{}: peak reserved {peaks}{}",
                run.strategy,
                if failed > 0 {
                    format!(
                        ", {} (black ticks on the x axis)",
                        counted(failed, "failed allocation")
                    )
                } else {
                    String::new()
                }
            ),
            "GiB".to_string(),
            series,
        ));
    }
    if let Some(c) = capacity {
        for (_, _, series) in &mut panels {
            series.push(Series {
                label: if several {
                    "capacity (each device)".into()
                } else {
                    "capacity".into()
                },
                color: PALETTE[7].into(),
                dashed: true,
                width: 1.6,
                points: vec![(0.0, c / gib), (x_max, c / gib)],
            });
        }
    }
    Chart {
        title: format!(
            "gpumem replay {} (each bucket drawn from its lowest to its highest value)",
            path.file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        ),
        x_label: if several {
            "event (of the whole trace)".into()
        } else {
            "event".into()
        },
        log_x: false,
        panels,
        shared_y: true,
        x_marks: marks,
    }
}
