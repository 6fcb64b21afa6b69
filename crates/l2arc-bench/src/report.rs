//! Self-contained HTML reports with hand-written SVG charts.
//!
//! A benchmark figure is read long after the run, on machines without the
//! tools that made it, so each report is one HTML file: inline SVG, inline
//! CSS, no script, nothing fetched. The chart helpers are pure functions from
//! data to markup (tested below), with three shapes the scenarios need:
//! grouped bars (throughput by dataset size and setting), lines on two y
//! axes (IOPS and L2ARC fill against time) and a heatmap (latency buckets on
//! a log scale against time, count as colour).

use std::fmt::Write;

/// Chart size in SVG units (the page scales it to its width).
const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 360.0;
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_RIGHT: f64 = 80.0;
const MARGIN_TOP: f64 = 40.0;
const MARGIN_BOTTOM: f64 = 60.0;
/// Series colours (colour-blind-safe Okabe–Ito order).
const PALETTE: [&str; 7] = [
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000",
];

/// A named sequence of values.
#[derive(Clone, Debug)]
pub(crate) struct Series {
    pub name: String,
    pub values: Vec<f64>,
}

impl Series {
    pub(crate) fn new(name: impl Into<String>, values: Vec<f64>) -> Self {
        Self {
            name: name.into(),
            values,
        }
    }
}

/// Escapes text for HTML and SVG.
pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round upper bound and step for an axis from 0 to at least `max`.
pub(crate) fn nice_axis(max: f64) -> (f64, f64) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw_step = max / 5.0;
    let magnitude = 10f64.powf(raw_step.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw_step)
        .unwrap_or(10.0 * magnitude);
    ((max / step).ceil() * step, step)
}

/// Short label of an axis value, three significant digits: 1979 -> "1.98k".
pub(crate) fn short_number(v: f64) -> String {
    let a = v.abs();
    let (scaled, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let digits = if scaled.abs() >= 100.0 || scaled == 0.0 {
        0
    } else if scaled.abs() >= 10.0 {
        1
    } else {
        2
    };
    let mut text = format!("{scaled:.digits$}");
    if text.contains('.') {
        text = text.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    text + suffix
}

fn svg_open(out: &mut String, title: &str) {
    write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12"><text x="{}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    )
    .expect("write to String");
}

/// Horizontal grid lines and labels of a y axis from 0 to `top`.
fn y_axis(out: &mut String, top: f64, step: f64, right: bool, label: &str, colour: &str) {
    let (x0, x1) = (MARGIN_LEFT, WIDTH - MARGIN_RIGHT);
    let plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let ticks = (top / step).round() as usize;
    for i in 0..=ticks.min(50) {
        let v = i as f64 * step;
        let y = HEIGHT - MARGIN_BOTTOM - plot_h * v / top;
        if !right {
            write!(
                out,
                r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#ddd"/>"##
            )
            .expect("write");
        }
        let (x, anchor) = if right {
            (x1 + 6.0, "start")
        } else {
            (x0 - 6.0, "end")
        };
        write!(
            out,
            r#"<text x="{x}" y="{:.1}" text-anchor="{anchor}" fill="{colour}">{}</text>"#,
            y + 4.0,
            short_number(v)
        )
        .expect("write");
    }
    let (x, rotate) = if right {
        (WIDTH - 14.0, 90)
    } else {
        (16.0, -90)
    };
    let y = MARGIN_TOP + plot_h / 2.0;
    write!(
        out,
        r#"<text x="{x}" y="{y}" text-anchor="middle" fill="{colour}" transform="rotate({rotate} {x} {y})">{}</text>"#,
        escape(label)
    )
    .expect("write");
}

fn legend(out: &mut String, names: &[(String, String, bool)]) {
    // (name, colour, dashed); laid out in a row under the title.
    let mut x = MARGIN_LEFT;
    for (name, colour, dashed) in names {
        let dash = if *dashed {
            r#" stroke-dasharray="6 3""#
        } else {
            ""
        };
        write!(
            out,
            r#"<line x1="{x}" y1="34" x2="{}" y2="34" stroke="{colour}" stroke-width="4"{dash}/><text x="{}" y="38">{}</text>"#,
            x + 18.0,
            x + 22.0,
            escape(name)
        )
        .expect("write");
        x += 34.0 + 7.0 * name.len() as f64;
    }
}

/// Grouped bars: one group per category, one bar per series.
pub(crate) fn bar_chart(
    title: &str,
    categories: &[String],
    series: &[Series],
    y_label: &str,
) -> String {
    assert!(series.iter().all(|s| s.values.len() == categories.len()));
    let mut out = String::new();
    svg_open(&mut out, title);
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    // Headroom: the value over the tallest bar must not reach the legend.
    let (top, step) = nice_axis(max * 1.1);
    y_axis(&mut out, top, step, false, y_label, "#000");
    let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let group_w = plot_w / categories.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    for (c, category) in categories.iter().enumerate() {
        let gx = MARGIN_LEFT + c as f64 * group_w;
        for (s, ser) in series.iter().enumerate() {
            let v = ser.values[c];
            if !v.is_finite() {
                continue;
            }
            let h = plot_h * v / top;
            let x = gx + group_w * 0.1 + s as f64 * bar_w;
            let y = HEIGHT - MARGIN_BOTTOM - h;
            write!(
                out,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                (bar_w - 2.0).max(1.0),
                PALETTE[s % PALETTE.len()],
                escape(&ser.name),
                short_number(v)
            )
            .expect("write");
            if bar_w >= 26.0 {
                write!(
                    out,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
                    x + bar_w / 2.0 - 1.0,
                    y - 3.0,
                    short_number(v)
                )
                .expect("write");
            }
        }
        write!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            gx + group_w / 2.0,
            HEIGHT - MARGIN_BOTTOM + 18.0,
            escape(category)
        )
        .expect("write");
    }
    axes_frame(&mut out);
    let names: Vec<_> = series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            (
                s.name.clone(),
                PALETTE[i % PALETTE.len()].to_string(),
                false,
            )
        })
        .collect();
    legend(&mut out, &names);
    out.push_str("</svg>");
    out
}

fn axes_frame(out: &mut String) {
    write!(
        out,
        r##"<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
        WIDTH - MARGIN_LEFT - MARGIN_RIGHT,
        HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    )
    .expect("write");
}

fn x_axis(out: &mut String, x_max: f64, label: &str) {
    let (top, step) = nice_axis(x_max);
    let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let ticks = (top / step).round() as usize;
    for i in 0..=ticks.min(50) {
        let v = i as f64 * step;
        let x = MARGIN_LEFT + plot_w * v / top;
        write!(
            out,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            HEIGHT - MARGIN_BOTTOM + 18.0,
            short_number(v)
        )
        .expect("write");
    }
    write!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        MARGIN_LEFT + plot_w / 2.0,
        HEIGHT - 16.0,
        escape(label)
    )
    .expect("write");
}

fn polyline(
    out: &mut String,
    xs: &[f64],
    ys: &[f64],
    x_top: f64,
    y_top: f64,
    colour: &str,
    dashed: bool,
) {
    let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let points: Vec<String> = xs
        .iter()
        .zip(ys)
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .map(|(x, y)| {
            format!(
                "{:.1},{:.1}",
                MARGIN_LEFT + plot_w * x / x_top,
                HEIGHT - MARGIN_BOTTOM - plot_h * y / y_top
            )
        })
        .collect();
    let dash = if dashed {
        r#" stroke-dasharray="6 3""#
    } else {
        ""
    };
    write!(
        out,
        r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"#,
        points.join(" ")
    )
    .expect("write");
}

/// Lines against a shared x: `left` series on the left axis (solid),
/// `right` series on the right axis (dashed).
pub(crate) fn line_chart_two_axes(
    title: &str,
    x: &[f64],
    x_label: &str,
    left: &[Series],
    left_label: &str,
    right: &[Series],
    right_label: &str,
) -> String {
    assert!(left.iter().chain(right).all(|s| s.values.len() == x.len()));
    let mut out = String::new();
    svg_open(&mut out, title);
    let max_of = |ss: &[Series]| {
        ss.iter()
            .flat_map(|s| s.values.iter().copied())
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max)
    };
    let (left_top, left_step) = nice_axis(max_of(left));
    let (right_top, right_step) = nice_axis(max_of(right));
    let (x_top, _) = nice_axis(x.iter().copied().fold(0.0, f64::max));
    y_axis(&mut out, left_top, left_step, false, left_label, "#000");
    if !right.is_empty() {
        y_axis(&mut out, right_top, right_step, true, right_label, "#555");
    }
    x_axis(&mut out, x_top, x_label);
    let mut names = Vec::new();
    for (i, s) in left.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        polyline(&mut out, x, &s.values, x_top, left_top, colour, false);
        names.push((s.name.clone(), colour.to_string(), false));
    }
    for (i, s) in right.iter().enumerate() {
        let colour = PALETTE[(left.len() + i) % PALETTE.len()];
        polyline(&mut out, x, &s.values, x_top, right_top, colour, true);
        names.push((s.name.clone(), colour.to_string(), true));
    }
    axes_frame(&mut out);
    legend(&mut out, &names);
    out.push_str("</svg>");
    out
}

/// Colour of a heatmap cell: white for 0, then from pale yellow through
/// green and blue to dark purple (a viridis-like ramp, readable in grey) on
/// a log scale of the count relative to `max`.
fn heat_colour(count: u64, max: u64) -> String {
    const STOPS: [(f64, f64, f64); 5] = [
        (253.0, 231.0, 37.0),
        (94.0, 201.0, 98.0),
        (33.0, 145.0, 140.0),
        (59.0, 82.0, 139.0),
        (68.0, 1.0, 84.0),
    ];
    if count == 0 || max == 0 {
        return "#ffffff".to_string();
    }
    let t = if max <= 1 {
        1.0
    } else {
        ((count as f64).ln() / (max as f64).ln()).clamp(0.0, 1.0)
    };
    let at = t * (STOPS.len() - 1) as f64;
    let i = (at.floor() as usize).min(STOPS.len() - 2);
    let f = at - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |x: f64, y: f64| (x + (y - x) * f).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(a.0, b.0),
        mix(a.1, b.1),
        mix(a.2, b.2)
    )
}

/// A heatmap: column `i` is the interval ending at `x_end[i]`, row `j` the
/// latency bucket from `bucket_lower_us[j]` (a log scale, lowest at the
/// bottom), colour the count. Rows with no count in any column at either
/// end are trimmed. `markers` are labelled vertical lines (phase changes).
pub(crate) fn heatmap(
    title: &str,
    x_end: &[f64],
    x_label: &str,
    bucket_lower_us: &[f64],
    counts: &[Vec<u64>],
    markers: &[(f64, String)],
) -> String {
    assert_eq!(x_end.len(), counts.len());
    assert!(counts.iter().all(|c| c.len() == bucket_lower_us.len()));
    let mut out = String::new();
    svg_open(&mut out, title);
    let grid = HeatGrid::new(x_end, bucket_lower_us, counts);
    grid.cells(&mut out, x_end, bucket_lower_us, counts);
    grid.y_labels(&mut out, bucket_lower_us);
    x_axis(&mut out, grid.x_top, x_label);
    grid.markers(&mut out, markers);
    let y_mid = MARGIN_TOP + grid.plot_h / 2.0;
    write!(
        out,
        r#"<text x="14" y="{y_mid}" text-anchor="middle" transform="rotate(-90 14 {y_mid})">latency (log scale)</text>"#
    )
    .expect("write");
    grid.colour_scale(&mut out);
    axes_frame(&mut out);
    out.push_str("</svg>");
    out
}

/// Where a heatmap's cells go: the bucket rows shown (`first..=last`, the
/// used ones), their height, the x axis' top, the largest count.
struct HeatGrid {
    first: usize,
    last: usize,
    cell_h: f64,
    plot_w: f64,
    plot_h: f64,
    x_top: f64,
    max: u64,
}

impl HeatGrid {
    fn new(x_end: &[f64], bucket_lower_us: &[f64], counts: &[Vec<u64>]) -> Self {
        let used = |j: usize| counts.iter().any(|c| c[j] > 0);
        let first = (0..bucket_lower_us.len()).find(|&j| used(j)).unwrap_or(0);
        let last = (0..bucket_lower_us.len())
            .rev()
            .find(|&j| used(j))
            .unwrap_or(0)
            .max(first);
        let plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
        Self {
            first,
            last,
            cell_h: plot_h / (last - first + 1) as f64,
            plot_w: WIDTH - MARGIN_LEFT - MARGIN_RIGHT,
            plot_h,
            x_top: nice_axis(x_end.last().copied().unwrap_or(1.0)).0,
            max: counts.iter().flatten().copied().max().unwrap_or(0),
        }
    }

    /// One rectangle per nonzero count.
    fn cells(&self, out: &mut String, x_end: &[f64], bucket_lower_us: &[f64], counts: &[Vec<u64>]) {
        let mut x_start = 0.0;
        for (i, column) in counts.iter().enumerate() {
            let x0 = MARGIN_LEFT + self.plot_w * x_start / self.x_top;
            let x1 = MARGIN_LEFT + self.plot_w * x_end[i] / self.x_top;
            for j in self.first..=self.last {
                let y = HEIGHT - MARGIN_BOTTOM - (j - self.first + 1) as f64 * self.cell_h;
                if column[j] > 0 {
                    write!(
                        out,
                        r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}s, {}us+: {}</title></rect>"#,
                        (x1 - x0 + 0.3).max(0.5),
                        self.cell_h + 0.3,
                        heat_colour(column[j], self.max),
                        short_number(x_end[i]),
                        short_number(bucket_lower_us[j]),
                        column[j]
                    )
                    .expect("write");
                }
            }
            x_start = x_end[i];
        }
    }

    /// y labels: every bucket edge that is a power of ten.
    fn y_labels(&self, out: &mut String, bucket_lower_us: &[f64]) {
        for j in self.first..=self.last + 1 {
            let lower_us = if j < bucket_lower_us.len() {
                bucket_lower_us[j]
            } else {
                bucket_lower_us[j - 1]
                    * (bucket_lower_us[j - 1] / bucket_lower_us[j.saturating_sub(2)])
            };
            let decade = lower_us.log10();
            if (decade - decade.round()).abs() > 1e-6 {
                continue;
            }
            let y = HEIGHT - MARGIN_BOTTOM - (j - self.first) as f64 * self.cell_h;
            let label = if lower_us >= 1000.0 {
                format!("{} ms", short_number(lower_us / 1000.0))
            } else {
                format!("{} us", short_number(lower_us))
            };
            write!(
                out,
                r##"<line x1="{}" y1="{y:.1}" x2="{MARGIN_LEFT}" y2="{y:.1}" stroke="#000"/><text x="{}" y="{:.1}" text-anchor="end">{label}</text>"##,
                MARGIN_LEFT - 4.0,
                MARGIN_LEFT - 6.0,
                y + 4.0
            )
            .expect("write");
        }
    }

    /// Labelled vertical lines (phase changes).
    fn markers(&self, out: &mut String, markers: &[(f64, String)]) {
        for (x, label) in markers {
            let px = MARGIN_LEFT + self.plot_w * x / self.x_top;
            write!(
                out,
                r##"<line x1="{px:.1}" y1="{MARGIN_TOP}" x2="{px:.1}" y2="{}" stroke="#d00" stroke-width="1.5" stroke-dasharray="4 3"/><text x="{:.1}" y="{}" fill="#d00" font-size="11">{}</text>"##,
                HEIGHT - MARGIN_BOTTOM,
                px + 3.0,
                MARGIN_TOP + 12.0,
                escape(label)
            )
            .expect("write");
        }
    }

    /// The colour scale beside the plot, its ends labelled.
    fn colour_scale(&self, out: &mut String) {
        let (max, plot_h) = (self.max, self.plot_h);
        let scale_x = WIDTH - MARGIN_RIGHT + 12.0;
        for k in 0..10 {
            let count = if max <= 1 {
                max
            } else {
                (max as f64).powf(k as f64 / 9.0).round() as u64
            };
            let y = MARGIN_TOP + plot_h - (k + 1) as f64 * plot_h / 10.0;
            write!(
                out,
                r##"<rect x="{scale_x}" y="{y:.1}" width="14" height="{:.1}" fill="{}" stroke="#ccc"/>"##,
                plot_h / 10.0,
                heat_colour(count.max(1), max)
            )
            .expect("write");
            if k == 0 || k == 9 {
                write!(
                    out,
                    r#"<text x="{}" y="{:.1}" font-size="10">{}</text>"#,
                    scale_x + 18.0,
                    y + plot_h / 20.0 + 4.0,
                    short_number(count as f64)
                )
                .expect("write");
            }
        }
    }
}

/// An HTML table (cells are escaped).
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::from("<table><tr>");
    for h in headers {
        write!(out, "<th>{}</th>", escape(h)).expect("write");
    }
    out.push_str("</tr>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            write!(out, "<td>{}</td>", escape(cell)).expect("write");
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

/// A whole page: a title, a preamble paragraph and sections of raw HTML
/// (charts, tables) under headings.
pub(crate) fn page(title: &str, preamble: &str, sections: &[(String, String)]) -> String {
    let mut out = format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{0}</title><style>\
         body{{font-family:sans-serif;max-width:900px;margin:1em auto;color:#222}}\
         table{{border-collapse:collapse;margin:.5em 0}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}\
         th{{background:#f3f3f3}}svg{{max-width:100%;height:auto}}pre{{background:#f6f6f6;padding:.5em;white-space:pre-wrap}}\
         </style></head><body><h1>{0}</h1><p>{1}</p>",
        escape(title),
        escape(preamble)
    );
    for (heading, body) in sections {
        write!(out, "<h2>{}</h2>{}", escape(heading), body).expect("write");
    }
    out.push_str("</body></html>\n");
    out
}

/// Writes `<dir>/<name>.json` and `<dir>/<name>.html`; returns the HTML path.
pub(crate) fn write_report(
    dir: &std::path::Path,
    name: &str,
    json: &str,
    html: &str,
) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let json_path = dir.join(format!("{name}.json"));
    std::fs::write(&json_path, json)
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    let html_path = dir.join(format!("{name}.html"));
    std::fs::write(&html_path, html)
        .with_context(|| format!("cannot write {}", html_path.display()))?;
    Ok(html_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn well_formed(svg: &str) {
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        // Every element opened is closed (self-closing or paired).
        for tag in ["rect", "text", "line", "polyline", "title"] {
            let opened =
                svg.matches(&format!("<{tag} ")).count() + svg.matches(&format!("<{tag}>")).count();
            let closed = svg.matches(&format!("</{tag}>")).count();
            let self_closed = svg
                .split(&format!("<{tag} "))
                .skip(1)
                .filter(|rest| {
                    let end = rest.find('>').unwrap();
                    rest[..end].ends_with('/')
                })
                .count();
            assert_eq!(opened, closed + self_closed, "<{tag}> balance");
        }
    }

    #[test]
    fn axes_are_round() {
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
        assert_eq!(nice_axis(97.0), (100.0, 20.0));
        assert_eq!(nice_axis(1234.0), (1250.0, 250.0));
        assert_eq!(short_number(21_000.0), "21k");
        assert_eq!(short_number(2_500.0), "2.5k");
        assert_eq!(short_number(1_979.1), "1.98k");
        assert_eq!(short_number(15_833.0), "15.8k");
        assert_eq!(short_number(143.4), "143");
        assert_eq!(short_number(0.5), "0.5");
        assert_eq!(short_number(0.0), "0");
    }

    #[test]
    fn bar_chart_has_one_bar_per_value() {
        let svg = bar_chart(
            "t <&>",
            &["0.5x".into(), "1x".into()],
            &[
                Series::new("a", vec![1.0, 2.0]),
                Series::new("b", vec![3.0, f64::NAN]),
            ],
            "MiB/s",
        );
        well_formed(&svg);
        assert_eq!(
            svg.matches("<rect x=").count(),
            3 + 1,
            "three bars and the frame"
        );
        assert!(svg.contains("t &lt;&amp;&gt;"));
    }

    #[test]
    fn line_chart_draws_each_series() {
        let svg = line_chart_two_axes(
            "warm-up",
            &[1.0, 2.0, 3.0],
            "s",
            &[Series::new("IOPS", vec![10.0, 20.0, 30.0])],
            "IOPS",
            &[Series::new("fill", vec![0.0, 5.0, 9.0])],
            "MiB",
        );
        well_formed(&svg);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("stroke-dasharray"));
    }

    #[test]
    fn heatmap_colours_nonzero_cells_only() {
        let edges: Vec<f64> = (0..10).map(|i| 10.0 * 10f64.powf(i as f64 / 5.0)).collect();
        let mut a = vec![0u64; 10];
        a[2] = 5;
        let mut b = vec![0u64; 10];
        b[7] = 100;
        let svg = heatmap(
            "lat",
            &[1.0, 2.0],
            "s",
            &edges,
            &[a, b],
            &[(1.0, "warm".into())],
        );
        well_formed(&svg);
        // Two cells, ten scale swatches, the frame.
        assert_eq!(svg.matches("<rect").count(), 2 + 10 + 1);
        assert!(svg.contains("100 us"));
        assert_eq!(heat_colour(0, 10), "#ffffff");
        assert_eq!(heat_colour(100, 100), "#440154");
        assert_eq!(heat_colour(1, 100), "#fde725");
        assert!(svg.contains(">warm</text>"));
    }

    #[test]
    fn page_escapes_and_is_self_contained() {
        let html = page(
            "a<b",
            "x",
            &[("t".into(), table(&["h"], &[vec!["<1>".into()]]))],
        );
        assert!(html.contains("a&lt;b") && html.contains("&lt;1&gt;"));
        assert!(!html.contains("<script") && !html.contains("http://") || html.contains("xmlns"));
    }
}
