//! The self-contained HTML page of a [`Report`].
//!
//! Layout: the static parts (summary, comparison table, what holds the memory at the peak,
//! recorded segments beside the emulation's) are written here as HTML, readable without
//! script; the timelines and the memory maps are drawn by `report.js` from one JSON object
//! (`<script type="application/json" id="gpumem-data">`) whose bulk arrays (block events,
//! placements, regions, mappings) are packed into one gzip'd, base64'd buffer.
use std::fmt::Write as _;
use std::io::Write as _;

use base64::Engine as _;
use gpumem_core::strategy::Strategy;
use serde_json::{json, Value};

use super::map::{MemoryMap, STATES};
use super::record::NEVER;
use super::Report;
use crate::units::bytes as human;

const TEMPLATE: &str = include_str!("page.html");
const STYLE: &str = include_str!("report.css");
const SCRIPT: &str = include_str!("report.js");
const UPLOT_JS: &str = include_str!("vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("vendor/uplot/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("vendor/uplot/LICENSE");

/// Packs numeric arrays into one buffer, each 8-byte aligned, and describes where each lies.
#[derive(Default)]
struct Pack {
    buf: Vec<u8>,
}

impl Pack {
    fn align(&mut self) {
        while !self.buf.len().is_multiple_of(8) {
            self.buf.push(0);
        }
    }
    fn f64s(&mut self, v: impl ExactSizeIterator<Item = f64>) -> Value {
        self.align();
        let o = self.buf.len();
        let n = v.len();
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
        json!({"t": "f64", "o": o, "n": n})
    }
    fn u32s(&mut self, v: impl ExactSizeIterator<Item = u32>) -> Value {
        self.align();
        let o = self.buf.len();
        let n = v.len();
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
        json!({"t": "u32", "o": o, "n": n})
    }
    fn i32s(&mut self, v: impl ExactSizeIterator<Item = i32>) -> Value {
        self.align();
        let o = self.buf.len();
        let n = v.len();
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
        json!({"t": "i32", "o": o, "n": n})
    }
    fn finish(self) -> String {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        // Writing to a Vec cannot fail.
        let _ = gz.write_all(&self.buf);
        let bytes = gz.finish().unwrap_or_default();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }
}

fn ev32(e: u64) -> u32 {
    if e == NEVER {
        u32::MAX
    } else {
        e.min(u64::from(u32::MAX - 1)) as u32
    }
}

fn map_json(m: &MemoryMap) -> Value {
    json!({
        "allocator": m.allocator,
        "rows": m.rows.iter().map(|r| json!({
            "kind": r.kind,
            "region_base": r.region_base as f64,
            "base": r.base as f64,
            "bytes": r.bytes as f64,
            "shown": r.shown_bytes as f64,
            "spans": r.spans.iter().map(|s| json!([s.offset as f64, s.bytes as f64, s.state as u8, s.requested_bytes as f64])).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// The data object the page's script reads.
fn data(r: &Report) -> Value {
    let mut p = Pack::default();
    let b = &r.blocks;
    let blocks = json!({
        "requested": p.f64s(b.iter().map(|x| x.requested_bytes as f64)),
        "alloc_event": p.u32s(b.iter().map(|x| ev32(x.alloc_event))),
        "free_event": p.u32s(b.iter().map(|x| ev32(x.free_event))),
        "stack": p.i32s(b.iter().map(|x| x.stack.map_or(-1, |s| s as i32))),
    });
    let first = r.runs.first().map(|x| &x.columns);
    let allocators: Vec<Value> = r
        .runs
        .iter()
        .map(|run| {
            let c = &run.columns;
            let regions = &run.regions;
            let maps = &run.mappings;
            let peak_map = MemoryMap::at(run, &r.blocks, run.peak_reserved_event);
            json!({
                "name": run.name,
                "peak_reserved_event": run.peak_reserved_event,
                "oom_count": run.oom_count,
                "series": {
                    "requested": [c.min[0], c.max[0]],
                    "allocated": [c.min[1], c.max[1]],
                    "reserved": [c.min[2], c.max[2]],
                    "fragmentation": [c.min[3], c.max[3]],
                    "driver_calls": c.last,
                },
                "regions": {
                    "kind": p.u32s(regions.iter().map(|x| x.kind as u32)),
                    "base": p.f64s(regions.iter().map(|x| x.base as f64)),
                    "bytes": p.f64s(regions.iter().map(|x| x.bytes as f64)),
                    "created": p.u32s(regions.iter().map(|x| ev32(x.created))),
                    "released": p.u32s(regions.iter().map(|x| ev32(x.released))),
                },
                "mappings": {
                    "va": p.f64s(maps.iter().map(|x| x.va as f64)),
                    "bytes": p.f64s(maps.iter().map(|x| x.bytes as f64)),
                    "mapped": p.u32s(maps.iter().map(|x| ev32(x.mapped))),
                    "unmapped": p.u32s(maps.iter().map(|x| ev32(x.unmapped))),
                },
                "placements": {
                    "addr": p.f64s(run.placements.iter().map(|x| x.map_or(-1.0, |q| q.addr as f64))),
                    "allocated": p.f64s(run.placements.iter().map(|x| x.map_or(0.0, |q| q.allocated_bytes as f64))),
                },
                "peak_totals": peak_map.totals(),
                "peak_live_blocks": peak_map.live_blocks(),
            })
        })
        .collect();
    let last_event = r.events().saturating_sub(1);
    let torch_end = r
        .runs
        .iter()
        .position(|x| x.strategy == Some(Strategy::Torch))
        .map(|i| MemoryMap::at(&r.runs[i], &r.blocks, last_event));
    json!({
        "trace": r.trace_name,
        "events": r.events(),
        "device": r.device,
        "peak_requested_event": r.peak_requested_event,
        "peak_requested_bytes": r.summary.peak_requested_bytes,
        // Drawn as a line only when the user set a capacity (the default, an H200's, would
        // flatten every chart).
        "capacity_limit": (r.capacity_bytes != gpumem_core::sim::DEFAULT_CAPACITY).then_some(r.capacity_bytes),
        "columns": first.map(|c| c.first_event.clone()).unwrap_or_default(),
        "va_gap_merge_bytes": super::map::VA_GAP_MERGE_BYTES,
        "states": STATES.iter().map(|s| s.label()).collect::<Vec<_>>(),
        "allocators": allocators,
        "blocks": blocks,
        "stacks": r.stacks,
        "recorded": r.recorded,
        "snapshot_map": r.snapshot_map.as_ref().map(map_json),
        "torch_end_map": if r.snapshot_map.is_some() { torch_end.as_ref().map(map_json) } else { None },
        "packed": p.finish(),
    })
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

fn comparison_table(r: &Report, o: &mut String) {
    let peak_req = r.summary.peak_requested_bytes;
    // Refusals (an impossible size or alignment) get a column only when there are some, as in
    // `replay`'s table.
    let refused = r.replays.iter().any(|x| x.refused_count > 0);
    let _ = writeln!(o, "<div class=\"wide\"><table id=\"comparison\"><thead><tr><th>allocator</th><th>peak reserved</th><th>reserved / requested</th><th>peak allocated</th><th>ext. frag. at peak</th><th>peak ext. frag.</th><th>int. frag. at peak</th><th title=\"peak free bytes inside segments or pages that hold live blocks (PyTorch's inactive_split_bytes)\">inactive split (peak)</th><th title=\"cache released and the allocation retried after the device refused memory (PyTorch's num_alloc_retries)\">retries</th><th>OOMs</th>{refused_head}<th>driver calls</th><th title=\"driver calls made during the second half of the events (the steady state)\">in the 2nd half</th><th>modelled driver time</th></tr></thead><tbody>",
        refused_head = if refused {
            "<th title=\"allocations refused as impossible (an unsupported alignment, a size that overflows) and dropped with their frees\">refused</th>"
        } else {
            ""
        },
    );
    for x in &r.replays {
        let calls: Vec<String> = gpumem_core::DriverCall::ALL
            .iter()
            .filter(|c| x.driver_calls.get(**c) > 0)
            .map(|c| format!("{} {}", c.short_name(), x.driver_calls.get(*c)))
            .collect();
        let _ = writeln!(
            o,
            "<tr data-allocator=\"{n}\"><td>{n}</td><td data-bytes=\"{pr}\">{prh}</td><td>{ratio}</td><td data-bytes=\"{pa}\">{pah}</td><td>{efp}</td><td>{pef}</td><td>{ifp}</td><td data-bytes=\"{isp}\">{isph}</td><td>{retries}</td><td>{oom}</td>{refused_cell}<td title=\"{calls}\">{total}</td><td>{steady}</td><td>{secs}</td></tr>",
            n = esc(&x.name),
            pr = x.peak_reserved_bytes,
            prh = human(x.peak_reserved_bytes),
            // As `replay`'s table: no byte served, no ratio.
            ratio = if x.peak_requested_bytes > 0 {
                format!("{:.3}", x.reserved_over_requested)
            } else {
                "-".to_string()
            },
            pa = x.peak_allocated_bytes,
            pah = human(x.peak_allocated_bytes),
            efp = pct(x.external_fragmentation_at_peak),
            pef = pct(x.peak_external_fragmentation),
            ifp = pct(x.internal_fragmentation_at_peak),
            isp = x.peak_inactive_split_bytes,
            isph = human(x.peak_inactive_split_bytes),
            retries = x.alloc_retries,
            oom = x.oom_count,
            refused_cell = if refused {
                format!("<td>{}</td>", x.refused_count)
            } else {
                String::new()
            },
            calls = esc(&calls.join(", ")),
            total = x.driver_calls.total(),
            steady = x.steady_state_driver_calls,
            // With the unit `replay`'s table uses (1.487 ms, not 0.001 s).
            secs = crate::units::duration(x.modelled_driver_seconds),
        );
    }
    for rec in &r.recorded {
        let ratio = if peak_req == 0 {
            "-".to_string()
        } else {
            format!("{:.3}", rec.reserved_peak_bytes as f64 / peak_req as f64)
        };
        // `traced run` (a `<stem>.stats.json`) is the run under its own setting, which the
        // settings row above names.
        let conf = if rec.conf == "traced run" {
            "under its own PYTORCH_CUDA_ALLOC_CONF".to_string()
        } else {
            format!("PYTORCH_CUDA_ALLOC_CONF {}", rec.conf)
        };
        let _ = writeln!(
            o,
            "<tr class=\"recorded\"><td>PyTorch, recorded</td><td data-bytes=\"{}\">{}</td><td>{ratio}</td><td>{}</td><td colspan=\"{span}\">torch.cuda.memory_stats() of the traced run, {}</td></tr>",
            rec.reserved_peak_bytes,
            human(rec.reserved_peak_bytes),
            rec.allocated_peak_bytes.map(human).unwrap_or_default(),
            esc(&conf),
            span = if refused { 10 } else { 9 },
        );
    }
    o.push_str("</tbody></table></div>\n");
}

fn stack_html(r: &Report, stack: Option<u32>, frames: usize) -> String {
    match stack {
        None => "<span class=\"muted\">no stack recorded</span>".into(),
        Some(s) => {
            let f = r.stacks.frames_of(s);
            let mut out: Vec<String> = f.iter().take(frames).map(|x| esc(x)).collect();
            if f.len() > frames {
                out.push(format!(
                    "<span class=\"muted\">… {} more</span>",
                    f.len() - frames
                ));
            }
            out.join("<br>")
        }
    }
}

fn peak_tables(r: &Report, o: &mut String) {
    let live = r.live_at(r.peak_requested_event);
    let total: u64 = live
        .iter()
        .fold(0u64, |t, &i| t.saturating_add(r.blocks[i].requested_bytes));
    let _ = writeln!(
        o,
        "<p>After event <b>{}</b>: <b>{}</b> requested in <b>{}</b> live blocks.</p>",
        r.peak_requested_event,
        human(total),
        live.len()
    );
    o.push_str("<h3>By allocation site</h3><table id=\"sites\"><thead><tr><th>site</th><th>blocks</th><th>requested</th><th>share</th></tr></thead><tbody>\n");
    for s in r.sites_at_peak().iter().take(15) {
        let _ =
            writeln!(
            o,
            "<tr><td title=\"{}\">{}</td><td>{}</td><td data-bytes=\"{}\">{}</td><td>{}</td></tr>",
            esc(&s.stack.map(|x| r.stacks.frames_of(x).join("\n")).unwrap_or_default()),
            esc(&s.site),
            s.blocks,
            s.requested_bytes,
            human(s.requested_bytes),
            pct(if total == 0 { 0.0 } else { s.requested_bytes as f64 / total as f64 }),
        );
    }
    o.push_str("</tbody></table>\n<h3>Largest live blocks</h3><table id=\"largest\"><thead><tr><th>requested</th><th>allocated at event</th><th>freed at event</th><th class=\"stack\">stack (innermost first)</th></tr></thead><tbody>\n");
    for &i in live.iter().take(20) {
        let b = &r.blocks[i];
        let _ = writeln!(
            o,
            "<tr><td data-bytes=\"{}\">{}</td><td>{}</td><td>{}</td><td class=\"stack\">{}</td></tr>",
            b.requested_bytes,
            human(b.requested_bytes),
            b.alloc_event,
            if b.free_event == NEVER {
                "never".to_string()
            } else {
                b.free_event.to_string()
            },
            stack_html(r, b.stack, 6),
        );
    }
    o.push_str("</tbody></table>\n");
}

fn snapshot_table(r: &Report, o: &mut String) {
    let Some(rec) = &r.snapshot_map else {
        o.push_str(
            "<p class=\"muted\">The trace recorded no segments (PyTorch snapshots list them at dump time).</p>\n",
        );
        return;
    };
    let last = r.events().saturating_sub(1);
    let emu = r
        .runs
        .iter()
        .position(|x| x.strategy == Some(Strategy::Torch))
        .map(|i| MemoryMap::at(&r.runs[i], &r.blocks, last));
    o.push_str("<table id=\"segments\"><thead><tr><th></th><th>segments</th><th>reserved</th><th>live</th><th>split remainder</th><th>free (cached)</th><th>live blocks</th></tr></thead><tbody>\n");
    let mut row = |name: &str, m: &MemoryMap| {
        let t = m.totals();
        let reserved: u64 = m.rows.iter().map(|x| x.bytes).sum();
        let _ = writeln!(
            o,
            "<tr><td>{}</td><td>{}</td><td data-bytes=\"{reserved}\">{}</td><td data-bytes=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(name),
            m.rows.len(),
            human(reserved),
            t[0],
            human(t[0]),
            human(t[1]),
            human(t[2]),
            m.live_blocks()
        );
    };
    row("PyTorch, recorded at dump time", rec);
    if let Some(m) = &emu {
        row(&format!("torch emulation after event {last}"), m);
    }
    o.push_str("</tbody></table>\n");
    if emu.is_none() {
        o.push_str("<p class=\"muted\">Add <code>torch</code> to <code>--allocator</code> to see the emulation beside it.</p>\n");
    }
}

/// `template` with each `{{KEY}}` replaced by its value, in one pass (a value that contains
/// `{{...}}`, such as a trace named so, is left as it is).
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out =
        String::with_capacity(template.len() + values.iter().map(|v| v.1.len()).sum::<usize>());
    let mut rest = template;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        match after.find("}}").and_then(|j| {
            let key = &after[..j];
            values.iter().find(|v| v.0 == key).map(|v| (v.1, j))
        }) {
            Some((v, j)) => {
                out.push_str(v);
                rest = &after[j + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The summary's device: its ordinal, and for a trace of several devices which they are
/// (the page shows one; its figures and event indices are that device's alone).
fn device_text(r: &Report) -> String {
    if r.trace_devices.len() < 2 {
        return r.device.to_string();
    }
    let all: Vec<String> = r.trace_devices.iter().map(u32::to_string).collect();
    format!(
        "{} of {} ({}; <code>--trace-device N</code> shows another)",
        r.device,
        r.trace_devices.len(),
        all.join(", ")
    )
}

/// The page for `r`, one self-contained HTML document.
pub fn render(r: &Report) -> String {
    let mut summary = String::new();
    let s = &r.summary;
    let _ = write!(
        summary,
        "<dl class=\"summary\"><dt>trace</dt><dd>{}</dd><dt>format</dt><dd>{}</dd><dt>device</dt><dd>{}</dd><dt>events</dt><dd id=\"n-events\">{}</dd><dt>allocations / frees</dt><dd>{} / {}</dd><dt>peak requested</dt><dd id=\"peak-requested\" data-bytes=\"{}\">{} (after event {})</dd><dt>largest request</dt><dd>{}</dd><dt>simulated device</dt><dd>{}</dd><dt>stacks</dt><dd>{}</dd>{}{}</dl>",
        // A long path wraps after a slash rather than inside a name.
        esc(&r.trace_name).replace('/', "/<wbr>"),
        r.format.map_or("gpumem JSON lines".into(), |f| format!("{f:?}")),
        device_text(r),
        s.events,
        s.allocs,
        s.frees,
        s.peak_requested_bytes,
        human(s.peak_requested_bytes),
        r.peak_requested_event,
        human(s.largest_request_bytes),
        human(r.capacity_bytes),
        if r.stacks.stacks.is_empty() {
            "none recorded".to_string()
        } else {
            format!("{} distinct stacks", r.stacks.stacks.len())
        },
        if r.settings.is_empty() {
            String::new()
        } else {
            format!(
                "<dt>settings</dt><dd id=\"settings\">{}</dd>",
                r.settings
                    .iter()
                    .map(|(a, s, what)| {
                        if what.is_empty() {
                            format!("{}: <code>{}</code>", esc(a), esc(s))
                        } else {
                            format!("{}: <code>{}</code> ({})", esc(a), esc(s), esc(what))
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("<br>")
            )
        },
        // A salvaged or partly skipped trace says so on the page, not only on stderr.
        if r.read_notes.is_empty() {
            String::new()
        } else {
            format!(
                "<dt>read (--lenient)</dt><dd id=\"read-notes\">{}</dd>",
                r.read_notes
                    .iter()
                    .map(|n| esc(n))
                    .collect::<Vec<_>>()
                    .join("<br>")
            )
        }
    );
    let mut table = String::new();
    comparison_table(r, &mut table);
    let mut peak = String::new();
    peak_tables(r, &mut peak);
    let mut seg = String::new();
    snapshot_table(r, &mut seg);
    let data = serde_json::to_string(&data(r))
        .unwrap_or_else(|_| "{}".into())
        .replace("</", "<\\/");
    let title = esc(&format!("gpumem report: {}", r.trace_name));
    let license = esc(UPLOT_LICENSE);
    fill(
        TEMPLATE,
        &[
            ("TITLE", &title),
            ("UPLOT_CSS", UPLOT_CSS),
            ("STYLE", STYLE),
            ("SUMMARY", &summary),
            ("COMPARISON", &table),
            ("PEAK", &peak),
            ("SEGMENTS", &seg),
            ("UPLOT_LICENSE", &license),
            ("UPLOT_JS", UPLOT_JS),
            ("SCRIPT", SCRIPT),
            ("DATA", &data),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::fill;

    /// The capacity line's value: only a capacity the user set is drawn.
    #[test]
    fn capacity_limit_only_when_set() {
        use crate::report::{build, ReportConfig};
        use crate::trace::{read_bytes, ReadConfig};
        let t = read_bytes(
            "small.jsonl",
            crate::report::tests::SMALL.as_bytes(),
            ReadConfig::default(),
        )
        .unwrap();
        let limit = |capacity_bytes: u64| {
            let cfg = ReportConfig {
                allocators: vec![super::Strategy::Tlsf],
                capacity_bytes,
                ..ReportConfig::default()
            };
            let r = build(&t, "small.jsonl", &cfg, &mut |_| {}).unwrap();
            super::data(&r)["capacity_limit"].clone()
        };
        assert_eq!(
            limit(gpumem_core::sim::DEFAULT_CAPACITY),
            serde_json::Value::Null
        );
        assert_eq!(limit(1 << 30), serde_json::json!(1u64 << 30));
    }

    #[test]
    fn fill_replaces_once_and_keeps_unknown_keys() {
        let got = fill("<t>{{A}}</t>{{B}}{{C}}", &[("A", "x {{B}} y"), ("B", "2")]);
        assert_eq!(got, "<t>x {{B}} y</t>2{{C}}");
    }
}
