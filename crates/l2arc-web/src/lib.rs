//! The one chart code of l2arc, as text to inline into a page.
//!
//! Why one: the live page of a running service (`--http`) and the
//! benchmark reports show the same things (IOPS over time, latency heat
//! maps, systems side by side), and a reader comparing a report with the
//! live view should see one drawing of each. Why JavaScript on a canvas
//! rather than SVG made in Rust: the live page redraws every second from
//! data it polls, in the browser; the reports are static pages that carry
//! their data as JSON beside the same code. Why inlined: both kinds of page
//! must work with no network and fetch nothing.

/// `charts.js`: defines `L2Charts` (`line`, `bars`, `heat`, `drawAll`).
pub const CHARTS_JS: &str = include_str!("charts.js");

/// Where a page asks for the chart code: a page template holds this marker
/// inside a `<script>` element and [`inline_charts`] replaces it.
pub const CHARTS_MARKER: &str = "/*L2ARC_CHARTS_JS*/";

/// `page` with the chart code in place of [`CHARTS_MARKER`].
///
/// Panics if the marker is missing: a page without its charts is a build
/// mistake, not a runtime condition.
pub fn inline_charts(page: &str) -> String {
    assert!(
        page.contains(CHARTS_MARKER),
        "the page has no {CHARTS_MARKER} marker"
    );
    page.replacen(CHARTS_MARKER, CHARTS_JS, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_code_defines_its_api_and_is_inlined_once() {
        for name in [
            "function line(",
            "function bars(",
            "function heat(",
            "drawAll",
        ] {
            assert!(CHARTS_JS.contains(name), "{name}");
        }
        let page = format!("<script>{CHARTS_MARKER}</script><p>{CHARTS_MARKER}</p>");
        let out = inline_charts(&page);
        assert!(out.starts_with("<script>// The one chart code"));
        assert!(out.ends_with(&format!("<p>{CHARTS_MARKER}</p>")));
    }

    #[test]
    #[should_panic(expected = "marker")]
    fn a_page_without_the_marker_is_a_mistake() {
        inline_charts("<p>no charts</p>");
    }
}
