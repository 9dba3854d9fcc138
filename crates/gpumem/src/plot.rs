//! A small SVG line-chart writer (no dependencies): replay timelines and bandwidth curves.
use std::fmt::Write as _;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// CSS colour, e.g. `#1f77b4`.
    pub color: String,
    /// Dashed line.
    pub dashed: bool,
    /// Stroke width in pixels (1.6 for an ordinary line; a wider line drawn before a thin
    /// one stays visible where the two coincide).
    pub width: f64,
    /// Points `(x, y)`.
    pub points: Vec<(f64, f64)>,
}

/// A chart: one or more panels stacked vertically sharing the x label.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    /// Title above everything.
    pub title: String,
    /// Label under the x axis.
    pub x_label: String,
    /// Logarithmic x axis (base 2 ticks).
    pub log_x: bool,
    /// Panels: (panel title, y label, series).
    pub panels: Vec<(String, String, Vec<Series>)>,
    /// One y scale for every panel (the highest point of all), so panels compare by eye.
    pub shared_y: bool,
    /// Per panel (same order), x positions marked by a short black tick above the x axis
    /// (e.g. failed allocations); panels without an entry get none.
    pub x_marks: Vec<Vec<f64>>,
}

/// Ten distinguishable colours (matplotlib's tab10).
pub const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn nice_step(range: f64, target_ticks: f64) -> f64 {
    let raw = (range / target_ticks).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let r = raw / mag;
    let m = if r < 1.5 {
        1.0
    } else if r < 3.0 {
        2.0
    } else if r < 7.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

fn fmt_tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{}G", trim(v / 1e9))
    } else if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Width of the whole chart, in SVG user units (pixels).
const WIDTH: f64 = 960.0;
/// Height of one panel's plot area.
const PANEL_H: f64 = 300.0;
/// Left margin (y ticks and the y label).
const MARGIN_L: f64 = 90.0;
/// Right margin (the legend).
const MARGIN_R: f64 = 200.0;
/// Top margin (the title).
const MARGIN_T: f64 = 50.0;

/// Where one panel sits and how it maps data to SVG coordinates.
struct Frame {
    /// Top of the plot area.
    top: f64,
    /// Width of the plot area.
    pw: f64,
    /// The x range after the axis transform (log2 for a logarithmic axis), and the top of the
    /// y range (the bottom is 0), rounded up to a whole number of y ticks.
    x0: f64,
    x1: f64,
    y1: f64,
    /// The y tick step.
    ystep: f64,
    log_x: bool,
}

impl Frame {
    /// The axis transform of x (log2 on a logarithmic axis).
    fn tx(&self, x: f64) -> f64 {
        if self.log_x {
            x.max(f64::MIN_POSITIVE).log2()
        } else {
            x
        }
    }

    fn sx(&self, x: f64) -> f64 {
        MARGIN_L + (self.tx(x) - self.x0) / (self.x1 - self.x0) * self.pw
    }

    fn sy(&self, y: f64) -> f64 {
        self.top + PANEL_H - y / self.y1 * PANEL_H
    }
}

impl Chart {
    /// Renders the chart as an SVG document.
    pub fn to_svg(&self) -> String {
        let (width, ml, mr, mt) = (WIDTH, MARGIN_L, MARGIN_R, MARGIN_T);
        // Panels are `PANEL_H + 40` apart (the gap holds the x ticks and the next title);
        // the x label sits under the last panel's ticks.
        let n = self.panels.len().max(1) as f64;
        let x_label_y = mt + (n - 1.0) * (PANEL_H + 40.0) + PANEL_H + 36.0;
        let height = x_label_y + 14.0;
        let mut o = String::new();
        let _ = write!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
        );
        let _ = write!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = write!(
            o,
            r#"<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#,
            width / 2.0,
            esc(&self.title)
        );
        let all_y_max = self
            .panels
            .iter()
            .flat_map(|(_, _, series)| series.iter().flat_map(|s| s.points.iter()))
            .fold(0.0f64, |m, &(_, y)| m.max(y));
        for (pi, (ptitle, ylabel, series)) in self.panels.iter().enumerate() {
            let f = self.frame(pi, series, all_y_max);
            let _ = write!(
                o,
                r#"<text x="{}" y="{}" font-size="13" text-anchor="middle">{}</text>"#,
                ml + f.pw / 2.0,
                f.top - 8.0,
                esc(ptitle)
            );
            let (top, pw, panel_h) = (f.top, f.pw, PANEL_H);
            let _ = write!(
                o,
                r##"<rect x="{ml}" y="{top}" width="{pw}" height="{panel_h}" fill="none" stroke="#888"/>"##
            );
            y_grid(&mut o, &f);
            x_ticks(&mut o, &f);
            let _ = write!(
                o,
                r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle">{}</text>"#,
                20.0,
                f.top + PANEL_H / 2.0,
                esc(ylabel)
            );
            if let Some(marks) = self.x_marks.get(pi) {
                x_marks(&mut o, &f, marks);
            }
            for (si, s) in series.iter().enumerate() {
                series_and_legend(&mut o, &f, si, s);
            }
        }
        let _ = write!(
            o,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            ml + (width - ml - mr) / 2.0,
            x_label_y,
            esc(&self.x_label)
        );
        o.push_str("</svg>\n");
        o
    }

    /// Panel `pi`'s frame: its place, and the data range of its series (or of every panel's,
    /// with a shared y scale), its y range rounded up to a whole number of ticks.
    fn frame(&self, pi: usize, series: &[Series], all_y_max: f64) -> Frame {
        let mut f = Frame {
            top: MARGIN_T + pi as f64 * (PANEL_H + 40.0),
            pw: WIDTH - MARGIN_L - MARGIN_R,
            x0: f64::INFINITY,
            x1: f64::NEG_INFINITY,
            y1: 0.0,
            ystep: 1.0,
            log_x: self.log_x,
        };
        for &(x, y) in series.iter().flat_map(|s| s.points.iter()) {
            f.x0 = f.x0.min(f.tx(x));
            f.x1 = f.x1.max(f.tx(x));
            f.y1 = f.y1.max(y);
        }
        if self.shared_y {
            f.y1 = all_y_max;
        }
        if !f.x0.is_finite() {
            f.x0 = 0.0;
            f.x1 = 1.0;
        }
        if f.x1 <= f.x0 {
            f.x1 = f.x0 + 1.0;
        }
        if f.y1 <= 0.0 {
            f.y1 = 1.0;
        }
        f.ystep = nice_step(f.y1, 5.0);
        f.y1 = (f.y1 / f.ystep).ceil() * f.ystep;
        f
    }
}

/// Horizontal grid lines and y tick labels every `f.ystep`.
fn y_grid(o: &mut String, f: &Frame) {
    let (ml, pw, ystep) = (MARGIN_L, f.pw, f.ystep);
    let mut y = 0.0;
    while y <= f.y1 + ystep * 0.01 {
        let py = f.sy(y);
        let _ = write!(
            o,
            r##"<line x1="{ml}" y1="{py}" x2="{}" y2="{py}" stroke="#eee"/>"##,
            ml + pw
        );
        let _ = write!(
            o,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            ml - 6.0,
            py + 4.0,
            fmt_tick(y)
        );
        y += ystep;
    }
}

/// x tick labels: every second power of two (with grid lines) on a logarithmic axis, round
/// numbers otherwise.
fn x_ticks(o: &mut String, f: &Frame) {
    let (ml, pw, top, panel_h) = (MARGIN_L, f.pw, f.top, PANEL_H);
    let (x0, x1) = (f.x0, f.x1);
    if f.log_x {
        let mut e = x0.floor();
        while e <= x1 {
            let px = ml + (e - x0) / (x1 - x0) * pw;
            if px >= ml - 0.5 {
                let v = 2f64.powf(e);
                let _ = write!(
                    o,
                    r##"<line x1="{px}" y1="{top}" x2="{px}" y2="{}" stroke="#eee"/>"##,
                    top + panel_h
                );
                let _ = write!(
                    o,
                    r#"<text x="{px}" y="{}" text-anchor="middle">{}</text>"#,
                    top + panel_h + 16.0,
                    esc(&human_pow2(v))
                );
            }
            e += 2.0;
        }
    } else {
        let xs = nice_step(x1 - x0, 8.0);
        let mut x = (x0 / xs).ceil() * xs;
        while x <= x1 {
            let px = ml + (x - x0) / (x1 - x0) * pw;
            let _ = write!(
                o,
                r#"<text x="{px}" y="{}" text-anchor="middle">{}</text>"#,
                top + panel_h + 16.0,
                fmt_tick(x)
            );
            x += xs;
        }
    }
}

/// Short black ticks above the x axis at `marks`, as one path.
fn x_marks(o: &mut String, f: &Frame, marks: &[f64]) {
    let mut d = String::new();
    for &x in marks {
        let px = f.sx(x);
        let _ = write!(
            d,
            "M{px:.1},{:.1} L{px:.1},{:.1} ",
            f.top + PANEL_H,
            f.top + PANEL_H - 10.0
        );
    }
    if !d.is_empty() {
        let _ = write!(
            o,
            r##"<path d="{}" stroke="#000" stroke-width="1"/>"##,
            d.trim_end()
        );
    }
}

/// Series `si` as a path, and its line and label in the legend right of the panel.
fn series_and_legend(o: &mut String, f: &Frame, si: usize, s: &Series) {
    let mut d = String::new();
    for (i, &(x, y)) in s.points.iter().enumerate() {
        let _ = write!(
            d,
            "{}{:.1},{:.1}",
            if i == 0 { "M" } else { " L" },
            f.sx(x),
            f.sy(y)
        );
    }
    let dash = if s.dashed {
        r#" stroke-dasharray="6,4""#
    } else {
        ""
    };
    let _ = write!(
        o,
        r#"<path d="{d}" fill="none" stroke="{}" stroke-width="{}"{dash}/>"#,
        s.color, s.width
    );
    let ly = f.top + 14.0 + si as f64 * 18.0;
    let lx = MARGIN_L + f.pw + 12.0;
    let _ = write!(
        o,
        r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="{}"{dash}/>"#,
        lx + 24.0,
        s.color,
        s.width.max(2.0)
    );
    let _ = write!(
        o,
        r#"<text x="{}" y="{}">{}</text>"#,
        lx + 30.0,
        ly + 4.0,
        esc(&s.label)
    );
}

/// `4 KiB`, `1 MiB`, `1 GiB` for powers of two; plain numbers otherwise.
pub fn human_pow2(v: f64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = v;
    let mut i = 0;
    while x >= 1024.0 && i < U.len() - 1 {
        x /= 1024.0;
        i += 1;
    }
    format!("{} {}", trim(x), U[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_series_and_legend() {
        let c = Chart {
            title: "t <1>".into(),
            x_label: "event".into(),
            log_x: false,
            panels: vec![(
                "p".into(),
                "GiB".into(),
                vec![Series {
                    label: "reserved".into(),
                    color: PALETTE[0].into(),
                    dashed: false,
                    width: 1.6,
                    points: vec![(0.0, 1.0), (10.0, 3.0)],
                }],
            )],
            ..Chart::default()
        };
        let svg = c.to_svg();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("t &lt;1&gt;"));
        assert!(svg.contains("reserved"));
        assert_eq!(svg.matches("<path").count(), 1);
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn shared_y_scale_and_marks() {
        let panel = |top: f64| {
            (
                "p".to_string(),
                "GiB".to_string(),
                vec![Series {
                    label: "reserved".into(),
                    color: PALETTE[0].into(),
                    dashed: false,
                    width: 1.6,
                    points: vec![(0.0, 0.0), (10.0, top)],
                }],
            )
        };
        let mut c = Chart {
            panels: vec![panel(1.0), panel(40.0)],
            x_marks: vec![vec![5.0, 6.0], vec![]],
            ..Chart::default()
        };
        let own = c.to_svg();
        c.shared_y = true;
        let shared = c.to_svg();
        // The small panel's axis reaches 40 only with the shared scale.
        assert!(shared.matches(">40<").count() == 2, "{shared}");
        assert!(own.matches(">40<").count() == 1);
        assert!(
            shared.contains(r##"stroke="#000""##),
            "failed-allocation marks drawn"
        );
    }

    #[test]
    fn log_axis_ticks_are_powers_of_two() {
        assert_eq!(human_pow2(4096.0), "4 KiB");
        assert_eq!(human_pow2(1073741824.0), "1 GiB");
        let c = Chart {
            log_x: true,
            panels: vec![(
                "p".into(),
                "GB/s".into(),
                vec![Series {
                    label: "a".into(),
                    color: "#000".into(),
                    dashed: true,
                    width: 1.6,
                    points: vec![(4096.0, 1.0), (1048576.0, 40.0)],
                }],
            )],
            ..Chart::default()
        };
        let svg = c.to_svg();
        assert!(svg.contains("4 KiB") && svg.contains("1 MiB"));
    }
}
