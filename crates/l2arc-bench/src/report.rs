//! Self-contained HTML reports whose charts are drawn by the shared chart
//! code (`l2arc_web::CHARTS_JS`).
//!
//! A benchmark figure is read long after the run, on machines without the
//! tools that made it, so each report is one HTML file that fetches
//! nothing: inline CSS, the chart code inlined once, and each chart's data
//! as JSON on its canvas. The charts are the live page's (`--http`), so a
//! report and the live view of a service draw a heat map or an IOPS curve
//! the same way. The helpers here are pure functions from data to markup
//! (tested below); three shapes: grouped bars (throughput by dataset size
//! and setting), lines on two y axes (IOPS and L2ARC fill against time) and
//! a heat map (latency buckets on a log scale against time, count as colour).

use std::fmt::Write;

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

/// A chart: its title and a canvas carrying its kind and data as JSON, for
/// the shared chart code (`L2Charts.drawAll`, run by [`page`]).
fn figure(title: &str, kind: &str, spec: &serde_json::Value) -> String {
    format!(
        r#"<figure><figcaption>{}</figcaption><canvas data-chart="{kind}" data-spec="{}"></canvas></figure>"#,
        escape(title),
        escape(&spec.to_string())
    )
}

/// JSON numbers; a value that is not finite (a cell not measured) is null,
/// which the chart code skips.
fn finite_or_null(values: &[f64]) -> Vec<serde_json::Value> {
    values
        .iter()
        .map(|v| {
            if v.is_finite() {
                serde_json::json!(v)
            } else {
                serde_json::Value::Null
            }
        })
        .collect()
}

/// Grouped bars: one group per category, one bar per series.
pub(crate) fn bar_chart(
    title: &str,
    categories: &[String],
    series: &[Series],
    y_label: &str,
) -> String {
    assert!(series.iter().all(|s| s.values.len() == categories.len()));
    let series: Vec<_> = series
        .iter()
        .map(|s| serde_json::json!({ "name": s.name, "values": finite_or_null(&s.values) }))
        .collect();
    let spec = serde_json::json!({
        "categories": categories,
        "series": series,
        "yFmt": "number",
        "yLabel": y_label,
    });
    figure(title, "bars", &spec)
}

/// Lines over x, some on a left axis (solid) and some on a right one
/// (dashed).
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
    // A y not measured stays as null: the chart code breaks the line there.
    let points = |s: &Series| -> Vec<serde_json::Value> {
        x.iter()
            .zip(finite_or_null(&s.values))
            .filter(|(x, _)| x.is_finite())
            .map(|(x, y)| serde_json::json!([x, y]))
            .collect()
    };
    let series: Vec<_> = left
        .iter()
        .map(|s| (s, false))
        .chain(right.iter().map(|s| (s, true)))
        .map(
            |(s, right)| serde_json::json!({ "name": s.name, "points": points(s), "right": right }),
        )
        .collect();
    let (x_max, x_step) = nice_axis(x.iter().copied().fold(0.0, f64::max));
    let spec = serde_json::json!({
        "series": series,
        "xMin": 0.0,
        "xMax": x_max,
        "xTicks": (x_max / x_step).round(),
        "xFmt": "number",
        "xLabel": x_label,
        "yFmt": "number",
        "yLabel": left_label,
        "yRightFmt": "number",
        "yRightLabel": right_label,
    });
    figure(title, "line", &spec)
}

/// Latency buckets (rows, log scale) against time (columns ending at
/// `x_end`), count as colour; `markers` label moments (a phase starting).
/// Rows no column uses, below the lowest and above the highest used, are
/// left out.
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
    let used = |j: usize| counts.iter().any(|c| c[j] > 0);
    let first = (0..bucket_lower_us.len()).find(|&j| used(j)).unwrap_or(0);
    let last = (0..bucket_lower_us.len())
        .rev()
        .find(|&j| used(j))
        .unwrap_or(0)
        .max(first);
    let columns: Vec<_> = x_end
        .iter()
        .zip(counts)
        .map(|(x, c)| serde_json::json!({ "x": x, "rows": &c[first..=last] }))
        .collect();
    let rows_ns: Vec<f64> = bucket_lower_us[first..=last]
        .iter()
        .map(|us| us * 1000.0)
        .collect();
    // A column is as wide as the step between column ends.
    let col_width = match x_end {
        [a, b, ..] => b - a,
        [a] => *a,
        [] => 1.0,
    };
    let (x_max, x_step) = nice_axis(x_end.last().copied().unwrap_or(1.0));
    let spec = serde_json::json!({
        "columns": columns,
        "rowLowNs": rows_ns,
        "xMin": 0.0,
        "xMax": x_max,
        "xTicks": (x_max / x_step).round(),
        "colWidth": col_width,
        "xFmt": "number",
        "xLabel": x_label,
        "markers": markers,
    });
    figure(title, "heat", &spec)
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
/// (charts, tables) under headings; the chart code inlined once at the end,
/// drawing every chart when the page loads.
pub(crate) fn page(title: &str, preamble: &str, sections: &[(String, String)]) -> String {
    let mut out = format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{0}</title><style>\
         body{{font-family:sans-serif;max-width:960px;margin:1em auto;color:#222}}\
         table{{border-collapse:collapse;margin:.5em 0}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}\
         th{{background:#f3f3f3}}pre{{background:#f6f6f6;padding:.5em;white-space:pre-wrap}}\
         figure{{margin:1em 0}}figcaption{{font-weight:bold;margin-bottom:.3em}}\
         canvas{{display:block;width:100%;height:340px}}\
         :root{{--chart-fg:#222;--chart-dim:#555;--chart-grid:#ddd}}\
         </style></head><body><h1>{0}</h1><p>{1}</p>",
        escape(title),
        escape(preamble)
    );
    for (heading, body) in sections {
        write!(out, "<h2>{}</h2>{}", escape(heading), body).expect("write");
    }
    // Pushed, not put in place of the marker: a title may hold any text.
    out.push_str("<script>");
    out.push_str(l2arc_web::CHARTS_JS);
    out.push_str("</script><script>L2Charts.drawAll();</script></body></html>\n");
    out
}

/// A page with one chart of each kind over fixed data, a value missing in
/// each: what the browser test opens to see the chart code draw a report.
pub(crate) fn sample_page() -> String {
    let x: Vec<f64> = (1..=40).map(f64::from).collect();
    let iops: Vec<f64> = x
        .iter()
        .map(|t| {
            if *t == 20.0 {
                f64::NAN
            } else {
                2000.0 + 400.0 * t
            }
        })
        .collect();
    let fill: Vec<f64> = x.iter().map(|t| (t * 1.5).min(48.0)).collect();
    let buckets: Vec<f64> = (0..30)
        .map(|i| 10.0 * 10f64.powf(f64::from(i) / 5.0))
        .collect();
    let counts: Vec<Vec<u64>> = (0..40u64)
        .map(|t| {
            let mut c = vec![0; 30];
            let slow = usize::try_from(17 - t.min(30) / 3).expect("small");
            c[slow] = 200 + 10 * t;
            c[slow + 1] = 50;
            c[3] = 30 * t;
            c
        })
        .collect();
    let bars = bar_chart(
        "Throughput <by> size",
        &[
            "0.5x (16 MiB)".into(),
            "1x (32 MiB)".into(),
            "2x (64 MiB)".into(),
        ],
        &[
            Series::new("no_l2arc", vec![40.0, 38.0, 37.0]),
            Series::new("l2arc", vec![900.0, 610.0, f64::NAN]),
            Series::new("l2arc_lz4", vec![1100.0, 820.0, 300.0]),
        ],
        "MiB/s",
    );
    let lines = line_chart_two_axes(
        "IOPS (solid) and L2ARC fill (dashed)",
        &x,
        "seconds",
        &[Series::new("IOPS", iops)],
        "IOPS",
        &[Series::new("L2ARC fill, MiB", fill)],
        "L2ARC MiB",
    );
    let heat = heatmap(
        "read latency per second",
        &x,
        "seconds",
        &buckets,
        &counts,
        &[(10.0, "warm-up".into()), (30.0, "warm".into())],
    );
    page(
        "l2arc bench: the chart kinds",
        "Fixed data, one chart of each kind.",
        &[
            ("Bars".into(), bars),
            ("Lines".into(), lines),
            ("Heat map".into(), heat),
        ],
    )
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
    use serde_json::{Value, json};

    /// Undoes [`escape`].
    fn unescape(text: &str) -> String {
        text.replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&")
    }

    /// Each figure of `html`: its caption (as written), kind and spec.
    fn figures(html: &str) -> Vec<(String, String, Value)> {
        html.split("<figure>")
            .skip(1)
            .map(|f| {
                let between = |a: &str, b: &str| {
                    let start = f.find(a).expect(a) + a.len();
                    f[start..start + f[start..].find(b).expect(b)].to_string()
                };
                let spec = between(" data-spec=\"", "\"");
                (
                    between("<figcaption>", "</figcaption>"),
                    between("data-chart=\"", "\""),
                    serde_json::from_str(&unescape(&spec)).expect("the spec is JSON"),
                )
            })
            .collect()
    }

    #[test]
    fn axes_are_round() {
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
        assert_eq!(nice_axis(97.0), (100.0, 20.0));
        assert_eq!(nice_axis(1234.0), (1250.0, 250.0));
    }

    #[test]
    fn bars_carry_categories_and_values_with_null_for_missing() {
        let html = bar_chart(
            "t <&>",
            &["0.5x".into(), "1x \"a\"".into()],
            &[
                Series::new("a", vec![1.0, 2.5]),
                Series::new("b", vec![3.0, f64::NAN]),
            ],
            "MiB/s",
        );
        let [(caption, kind, spec)] = &figures(&html)[..] else {
            panic!("one figure: {html}")
        };
        assert_eq!(caption, "t &lt;&amp;&gt;");
        assert_eq!(kind, "bars");
        assert_eq!(spec["categories"], json!(["0.5x", "1x \"a\""]));
        assert_eq!(
            spec["series"],
            json!([{"name": "a", "values": [1.0, 2.5]}, {"name": "b", "values": [3.0, null]}])
        );
        assert_eq!(spec["yLabel"], "MiB/s");
        assert!(!html.contains("NaN"));
    }

    #[test]
    fn lines_carry_points_on_two_axes_with_null_for_missing() {
        let html = line_chart_two_axes(
            "warm-up",
            &[1.0, 2.0, 3.0],
            "s",
            &[Series::new("IOPS", vec![10.0, f64::INFINITY, 30.0])],
            "IOPS",
            &[Series::new("fill", vec![0.0, 5.0, 9.0])],
            "MiB",
        );
        let [(caption, kind, spec)] = &figures(&html)[..] else {
            panic!("one figure: {html}")
        };
        assert_eq!((caption.as_str(), kind.as_str()), ("warm-up", "line"));
        assert_eq!(
            spec["series"],
            json!([
                {"name": "IOPS", "points": [[1.0, 10.0], [2.0, null], [3.0, 30.0]], "right": false},
                {"name": "fill", "points": [[1.0, 0.0], [2.0, 5.0], [3.0, 9.0]], "right": true},
            ])
        );
        assert_eq!(spec["xLabel"], "s");
        assert_eq!(spec["yLabel"], "IOPS");
        assert_eq!(spec["yRightLabel"], "MiB");
        // The x axis is round: 0 to 3 in steps of 1.
        assert_eq!(
            (spec["xMin"].as_f64(), spec["xMax"].as_f64()),
            (Some(0.0), Some(3.0))
        );
        assert_eq!(spec["xTicks"].as_f64(), Some(3.0));
    }

    #[test]
    fn heatmap_keeps_the_used_rows_in_ns_and_its_markers() {
        let edges: Vec<f64> = (0..10)
            .map(|i| 10.0 * 10f64.powf(f64::from(i) / 5.0))
            .collect();
        let mut a = vec![0u64; 10];
        a[2] = 5;
        let mut b = vec![0u64; 10];
        b[7] = 100;
        let html = heatmap(
            "lat",
            &[1.0, 2.0],
            "s",
            &edges,
            &[a, b],
            &[(1.0, "warm <up>".into())],
        );
        let [(_, kind, spec)] = &figures(&html)[..] else {
            panic!("one figure: {html}")
        };
        assert_eq!(kind, "heat");
        // Rows 2 to 7: the lowest and the highest used.
        let rows: Vec<f64> = spec["rowLowNs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(rows.len(), 6);
        assert!((rows[0] - edges[2] * 1000.0).abs() < 1e-6, "{rows:?}");
        assert_eq!(
            spec["columns"],
            json!([{"x": 1.0, "rows": [5, 0, 0, 0, 0, 0]}, {"x": 2.0, "rows": [0, 0, 0, 0, 0, 100]}])
        );
        assert_eq!(spec["colWidth"].as_f64(), Some(1.0));
        assert_eq!(spec["markers"], json!([[1.0, "warm <up>"]]));
    }

    #[test]
    fn page_inlines_the_chart_code_once_and_escapes() {
        let html = page(
            "a<b",
            "x",
            &[
                ("t".into(), table(&["h"], &[vec!["<1>".into()]])),
                ("c".into(), bar_chart("c", &["x".into()], &[], "")),
            ],
        );
        assert!(html.contains("<title>a&lt;b</title>") && html.contains("&lt;1&gt;"));
        assert_eq!(html.matches(l2arc_web::CHARTS_JS).count(), 1);
        assert_eq!(html.matches("L2Charts.drawAll()").count(), 1);
        assert!(!html.contains(l2arc_web::CHARTS_MARKER));
        // Nothing is fetched: no source, no link, no address.
        assert!(!html.contains("src=") && !html.contains("<link") && !html.contains("http"));
        assert!(html.find("data-chart").unwrap() < html.find("L2Charts.drawAll()").unwrap());
    }

    #[test]
    fn the_sample_page_has_each_chart_kind() {
        let html = sample_page();
        let kinds: Vec<String> = figures(&html).into_iter().map(|(_, k, _)| k).collect();
        assert_eq!(kinds, ["bars", "line", "heat"]);
        assert!(html.contains("Throughput &lt;by&gt; size"));
    }
}
