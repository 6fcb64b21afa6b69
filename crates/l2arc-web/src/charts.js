// The one chart code of l2arc: the live page of a running service and the
// benchmark reports both draw with it, so a latency heat map or an IOPS
// curve reads the same wherever it is seen. Plain canvas, no library, no
// request: it is inlined into every page that uses it.
//
// L2Charts.line(canvas, spec)  lines over x (time or a number), one or two y axes
// L2Charts.bars(canvas, spec)  grouped bars, one group per category
// L2Charts.heat(canvas, spec)  columns of latency rows (log scale), colour = count
// L2Charts.drawAll(root)       draws every <canvas data-chart="KIND" data-spec="JSON">
//
// Each draw leaves what it drew in data attributes (data-points, data-bars,
// data-columns, data-events; data-series, the names of a line chart's
// series) for tests to read. Colours come from the CSS
// variables --chart-fg, --chart-dim and --chart-grid when the page sets
// them, so a dark page and a white report share the code.
"use strict";
const L2Charts = (() => {
  const PALETTE = ["#4dabf7", "#ff922b", "#51cf66", "#f06595", "#fcc419", "#845ef7", "#22b8cf", "#adb5bd"];

  const fmt = {
    count: v => v >= 1e9 ? (v / 1e9).toFixed(1) + "G" : v >= 1e6 ? (v / 1e6).toFixed(1) + "M" : v >= 1e3 ? (v / 1e3).toFixed(1) + "K" : v.toFixed(v < 10 && v % 1 ? 1 : 0),
    bytes: v => { const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0; while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; } return v.toFixed(i && v < 10 ? 1 : 0) + " " + u[i]; },
    bytesPerSec: v => fmt.bytes(v) + "/s",
    ns: ns => ns >= 1e9 ? (ns / 1e9).toFixed(ns >= 1e10 ? 0 : 1) + " s" : ns >= 1e6 ? (ns / 1e6).toFixed(ns >= 1e7 ? 0 : 1) + " ms" : ns >= 1e3 ? (ns / 1e3).toFixed(ns >= 1e4 ? 0 : 1) + " µs" : ns.toFixed(0) + " ns",
    secsAgo: s => s >= 86400 ? "-" + (s / 86400).toFixed(s % 86400 ? 1 : 0) + " d" : s >= 3600 ? "-" + (s / 3600).toFixed(s % 3600 ? 1 : 0) + " h" : s >= 60 ? "-" + (s / 60).toFixed(s % 60 ? 1 : 0) + " min" : "-" + s + " s",
    number: v => Math.abs(v) >= 1e3 ? fmt.count(v) : String(+v.toPrecision(3)),   // 3 significant digits
    percent: v => v.toFixed(1) + "%",
  };
  const formatter = f => typeof f === "function" ? f : (fmt[f] || fmt.number);

  function colours(c) {
    const css = getComputedStyle(c);
    const v = (name, fallback) => (css.getPropertyValue(name) || "").trim() || fallback;
    return { fg: v("--chart-fg", "#222"), dim: v("--chart-dim", "#666"), grid: v("--chart-grid", "#ddd") };
  }

  function size(c) {
    const r = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(c.clientWidth * r)), h = Math.max(1, Math.round(c.clientHeight * r));
    if (c.width !== w || c.height !== h) { c.width = w; c.height = h; }
    const g = c.getContext("2d");
    g.setTransform(r, 0, 0, r, 0, 0);
    g.clearRect(0, 0, c.clientWidth, c.clientHeight);
    g.font = "11px system-ui, sans-serif";
    return [g, c.clientWidth, c.clientHeight];
  }

  // The top of a y axis of four equal steps at or above m, a step being
  // 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten: round labels.
  function niceMax(m) {
    if (!(m > 0)) return 1;
    const raw = m / 4, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10].map(k => k * p).find(s => s >= raw * (1 - 1e-9));
    return 4 * step;
  }

  // Horizontal grid lines and labels of a y axis from 0 to max.
  function yAxis(g, box, max, f, col, right) {
    g.strokeStyle = col.grid; g.fillStyle = col.dim; g.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = box.top + box.h * (1 - i / 4);
      if (!right) { g.beginPath(); g.moveTo(box.left, y); g.lineTo(box.left + box.w, y); g.stroke(); }
      const label = f(max * i / 4);
      g.fillText(label, right ? box.left + box.w + 4 : 4, y + 4);
    }
  }

  // The legend in rows from the top left, wrapped at `right`; returns the
  // number of rows (a long legend pushes the plot down).
  function legend(g, names, x0, right, draw) {
    let x = x0, row = 0;
    names.forEach(([label, colour]) => {
      const w = g.measureText(label).width;
      if (x > x0 && right && x + w > right) { x = x0; row++; }
      if (draw !== false) { g.fillStyle = colour; g.fillText(label, x, 12 + 13 * row); }
      x += w + 14;
    });
    return row + 1;
  }

  // Labels under the x axis: the ends only (the live page's time axis),
  // or with spec.xTicks, that many equal steps labelled, the axis' name on
  // a row of its own below them. Returns the height the labels take.
  function xAxis(g, box, spec, h, col, ends) {
    const xf = formatter(spec.xFmt);
    g.fillStyle = col.dim;
    if (!spec.xTicks) {
      g.fillText(xf(spec.xMin), box.left, h - 4);
      if (ends) { const end = xf(spec.xMax); g.fillText(end, box.left + box.w - g.measureText(end).width, h - 4); }
      if (spec.xLabel) g.fillText(spec.xLabel, box.left + box.w / 2 - g.measureText(spec.xLabel).width / 2, h - 4);
      return;
    }
    for (let i = 0; i <= spec.xTicks; i++) {
      const label = xf(spec.xMin + (spec.xMax - spec.xMin) * i / spec.xTicks), lw = g.measureText(label).width;
      const x = box.left + box.w * i / spec.xTicks;
      g.fillText(label, Math.min(Math.max(x - lw / 2, box.left - 8), box.left + box.w - lw + 8), box.top + box.h + 13);
    }
    if (spec.xLabel) g.fillText(spec.xLabel, box.left + box.w / 2 - g.measureText(spec.xLabel).width / 2, h - 4);
  }

  // spec: {series: [{name, points: [[x, y]...], right, colour}], xMin, xMax, xFmt,
  // xLabel, xTicks, yFmt, yLabel, yRightFmt, yRightLabel, gap (x distance
  // that breaks a line), lastInLegend}. A point whose y is null (not
  // measured) is skipped and breaks the line; right-axis lines are dashed.
  function line(c, spec) {
    const [g, w, h] = size(c);
    const col = colours(c);
    const hasRight = spec.series.some(s => s.right);
    const names = [];
    spec.series.forEach((s, k) => {
      const lastY = s.points.length ? s.points[s.points.length - 1][1] : null;
      const f = formatter(s.right ? (spec.yRightFmt || spec.yFmt) : spec.yFmt);
      names.push([s.name + (s.right ? " (right)" : "") + (spec.lastInLegend && lastY !== null ? " " + f(lastY) : ""), s.colour || PALETTE[k % PALETTE.length]]);
    });
    const axes = [spec.yLabel, hasRight && spec.yRightLabel ? spec.yRightLabel + " (right)" : null].filter(Boolean);
    if (axes.length) names.unshift([axes.join(" · ") + ":", col.dim]);
    const top = 6 + 13 * legend(g, names, 62, w - 8, false);
    const bottom = spec.xTicks ? 32 : 18;
    const box = { left: 62, top, w: w - 62 - (hasRight ? 62 : 8), h: h - top - bottom };
    const maxOf = right => {
      let m = 0;
      for (const s of spec.series) if (!!s.right === right) for (const p of s.points) if (p[1] > m) m = p[1];
      return niceMax(m * 1.05);
    };
    const maxL = maxOf(false), maxR = maxOf(true);
    const yf = formatter(spec.yFmt), yrf = formatter(spec.yRightFmt || spec.yFmt);
    yAxis(g, box, maxL, yf, col, false);
    if (hasRight) yAxis(g, box, maxR, yrf, col, true);
    const span = Math.max(1e-9, spec.xMax - spec.xMin);
    const x = v => box.left + box.w * (v - spec.xMin) / span;
    const gap = spec.gap || Infinity;
    let points = 0;
    spec.series.forEach((s, k) => {
      const max = s.right ? maxR : maxL;
      g.strokeStyle = s.colour || PALETTE[k % PALETTE.length]; g.lineWidth = 1.5;
      g.setLineDash(s.right ? [6, 3] : []);
      g.beginPath();
      let last = null, drawn = 0;
      for (const [px, py] of s.points) {
        if (py === null || !Number.isFinite(py)) { last = null; continue; }
        const y = box.top + box.h * (1 - py / max);
        // A gap (a restart, a missed poll, a value not measured) breaks the line.
        if (last !== null && px - last <= gap) g.lineTo(x(px), y); else g.moveTo(x(px), y);
        last = px;
        drawn++;
      }
      g.stroke();
      points = Math.max(points, drawn);
    });
    g.setLineDash([]);
    legend(g, names, box.left, w - 8);
    xAxis(g, box, spec, h, col, true);
    c.dataset.points = String(points);
    c.dataset.series = JSON.stringify(spec.series.map(s => s.name));
  }

  // spec: {categories: [...], series: [{name, values}], yFmt, yLabel}; a
  // value that is null (not measured) has no bar.
  function bars(c, spec) {
    const [g, w, h] = size(c);
    const col = colours(c);
    const names = spec.series.map((s, k) => [s.name, PALETTE[k % PALETTE.length]]);
    if (spec.yLabel) names.unshift([spec.yLabel + ":", col.dim]);
    const top = 9 + 13 * legend(g, names, 62, w - 8, false);
    const box = { left: 62, top, w: w - 62 - 8, h: h - top - 22 };
    let max = 0;
    for (const s of spec.series) for (const v of s.values) if (Number.isFinite(v) && v > max) max = v;
    max = niceMax(max * 1.1);
    const yf = formatter(spec.yFmt);
    yAxis(g, box, max, yf, col, false);
    const groupW = box.w / Math.max(1, spec.categories.length);
    const barW = groupW * 0.8 / Math.max(1, spec.series.length);
    let drawn = 0;
    spec.categories.forEach((cat, ci) => {
      const gx = box.left + ci * groupW;
      spec.series.forEach((s, si) => {
        const v = s.values[ci];
        if (!Number.isFinite(v)) return;
        const bh = box.h * v / max, bx = gx + groupW * 0.1 + si * barW, by = box.top + box.h - bh;
        g.fillStyle = PALETTE[si % PALETTE.length];
        g.fillRect(bx, by, Math.max(1, barW - 2), bh);
        if (barW >= 26) { g.fillStyle = col.fg; g.fillText(yf(v), bx, by - 3); }
        drawn++;
      });
      g.fillStyle = col.fg;
      g.fillText(cat, gx + groupW / 2 - g.measureText(cat).width / 2, h - 6);
    });
    legend(g, names, box.left, w - 8);
    c.dataset.bars = String(drawn);
  }

  // spec: {columns: [{x, rows: [...]}], rowLowNs: [...], xMin, xMax, colWidth,
  // xFmt, xLabel, xTicks, perSecond (values are rates), eventScale (events per unit of a
  // value: a column's seconds for rates; default 1), markers: [[x, label]]}
  function heat(c, spec) {
    const [g, w, h] = size(c);
    const col = colours(c);
    const box = { left: 54, top: 6, w: w - 54 - 8, h: h - 6 - (spec.xTicks ? 30 : 16) };
    const rowsN = spec.rowLowNs.length;
    let max = 0, events = 0;
    for (const column of spec.columns) for (const v of column.rows) {
      if (v > max) max = v;
      events += v * (spec.eventScale || 1);
    }
    const span = Math.max(1e-9, spec.xMax - spec.xMin);
    const cw = Math.max(1, box.w * spec.colWidth / span), rh = box.h / Math.max(1, rowsN);
    for (const column of spec.columns) {
      const x = box.left + box.w * (column.x - spec.xMin) / span - cw;
      column.rows.forEach((v, r) => {
        if (v <= 0) return;
        const f = Math.log1p(v) / Math.log1p(max);        // log colour scale
        g.fillStyle = `hsl(${220 - 200 * f}, 90%, ${18 + 50 * f}%)`;
        g.fillRect(x, box.top + box.h - (r + 1) * rh, Math.ceil(cw), Math.ceil(rh));
      });
    }
    // Latency labels on the rows that start at a round latency: every 32x
    // for power-of-two rows, every 10x for decade rows.
    g.fillStyle = col.dim; g.strokeStyle = col.grid;
    const whole = v => Math.abs(v - Math.round(v)) < 1e-6;
    let lastLabelY = Infinity;
    spec.rowLowNs.forEach((low, r) => {
      const y = box.top + box.h - r * rh;
      const l2 = Math.log2(Math.max(1, low)), l10 = Math.log10(Math.max(1, low));
      const round = (whole(l2) && Math.round(l2) % 5 === 0) || whole(l10);
      if (!round || lastLabelY - y < 12) return;
      g.fillText(fmt.ns(low), 2, y + 4);
      g.beginPath(); g.moveTo(box.left, y); g.lineTo(box.left + box.w, y); g.stroke();
      lastLabelY = y;
    });
    g.fillStyle = col.fg;
    for (const [mx, label] of spec.markers || []) {
      const x = box.left + box.w * (mx - spec.xMin) / span;
      g.fillRect(x, box.top, 1, box.h);
      g.fillText(label, x + 3, box.top + 12);
    }
    xAxis(g, box, spec, h, col, false);
    const note = max > 0 ? "max " + fmt.count(max) + (spec.perSecond ? "/s" : "") : "no events";
    g.fillText(note, box.left + box.w - g.measureText(note).width, h - 4);
    c.dataset.columns = String(spec.columns.length);
    c.dataset.events = String(Math.round(events));
  }

  // Rows of `rowsPerOctave` per power of two from 2^lowLog2 ns to 2^highLog2 ns.
  function logRows(lowLog2, highLog2, rowsPerOctave) {
    const rows = [];
    for (let i = 0; i < (highLog2 - lowLog2) * rowsPerOctave; i++) rows.push(Math.pow(2, lowLog2 + i / rowsPerOctave));
    return rows;
  }

  function drawAll(root) {
    (root || document).querySelectorAll("canvas[data-chart]").forEach(c => {
      const spec = JSON.parse(c.dataset.spec);
      ({ line, bars, heat })[c.dataset.chart](c, spec);
    });
  }

  return { fmt, line, bars, heat, logRows, drawAll, PALETTE };
})();
