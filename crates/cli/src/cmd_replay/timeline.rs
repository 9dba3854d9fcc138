//! The replay's `--timeline` chart: requested / allocated / reserved per allocator.
use super::AllocatorRun;
use crate::units::human_bytes;
use gpumem::plot::{Chart, Series, PALETTE};
use gpumem::replay::{self, ReplayReport};

/// A bucket's low and high as two points at the same x: the line goes down to the low and
/// up to the high inside each bucket, so no peak is lost however many events a bucket holds.
fn envelope(points: &mut Vec<(f64, f64)>, x: f64, lo: f64, hi: f64) {
    points.push((x, lo));
    if hi != lo {
        points.push((x, hi));
    }
}

pub(super) fn timeline_chart(
    path: &std::path::Path,
    runs: &[AllocatorRun],
    capacity: Option<f64>,
) -> Chart {
    let gib = (1u64 << 30) as f64;
    let mut panels = Vec::new();
    let mut marks = Vec::new();
    let mut x_max = 0.0f64;
    for run in runs {
        let per_dev = &run.per_dev;
        // Timelines of several devices are summed bucket by bucket (lows and highs apart).
        let n = per_dev.iter().map(|r| r.timeline.len()).min().unwrap_or(0);
        let mut req = Vec::with_capacity(2 * n);
        let mut all = Vec::with_capacity(2 * n);
        let mut res = Vec::with_capacity(2 * n);
        for i in 0..n {
            let ev = per_dev[0].timeline[i].event as f64;
            x_max = x_max.max(ev);
            let s = |f: &dyn Fn(&replay::Sample) -> replay::MinMax| {
                let (lo, hi) = per_dev.iter().fold((0u64, 0u64), |(l, h), r| {
                    let m = f(&r.timeline[i]);
                    (l + m.min, h + m.max)
                });
                (lo as f64 / gib, hi as f64 / gib)
            };
            let (lo, hi) = s(&|x| x.requested_bytes);
            envelope(&mut req, ev, lo, hi);
            let (lo, hi) = s(&|x| x.allocated_bytes);
            envelope(&mut all, ev, lo, hi);
            let (lo, hi) = s(&|x| x.reserved_bytes);
            envelope(&mut res, ev, lo, hi);
        }
        let peak_res: u64 = per_dev.iter().map(|r| r.peak_reserved_bytes).sum();
        let failed: u64 = per_dev.iter().map(ReplayReport::failed_count).sum();
        marks.push(
            per_dev
                .iter()
                .flat_map(|r| r.failed_events.iter().map(|&e| e as f64))
                .collect::<Vec<f64>>(),
        );
        panels.push((
            format!(
                "{}: peak reserved {}{}",
                run.name,
                human_bytes(peak_res),
                if failed > 0 {
                    format!(", {failed} failed allocations (black ticks on the x axis)")
                } else {
                    String::new()
                }
            ),
            "GiB".to_string(),
            vec![
                Series {
                    label: "reserved".into(),
                    color: PALETTE[3].into(),
                    dashed: false,
                    points: res,
                },
                Series {
                    label: "allocated".into(),
                    color: PALETTE[0].into(),
                    dashed: false,
                    points: all,
                },
                Series {
                    label: "requested".into(),
                    color: PALETTE[2].into(),
                    dashed: true,
                    points: req,
                },
            ],
        ));
    }
    if let Some(c) = capacity {
        for (_, _, series) in &mut panels {
            series.push(Series {
                label: "capacity".into(),
                color: PALETTE[7].into(),
                dashed: true,
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
        x_label: "event".into(),
        log_x: false,
        panels,
        shared_y: true,
        x_marks: marks,
    }
}
