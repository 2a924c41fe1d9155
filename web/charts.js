// vramscope web page: the charts, as inline SVG built by hand (no library, so
// nothing to fetch). Pure functions of the data they are given; app.js calls
// them with the engine's answer.
"use strict";

const vsCharts = (() => {
  const GIB = 2 ** 30;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const W = 900, H = 280, PAD = { l: 62, r: 14, t: 12, b: 30 };
  const PHASE_FILL = { setup: "#f2f2f2", forward: "#e8f0fb", backward: "#fbefe3", optimizer: "#e9f6ee" };

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG_NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, s, attrs) {
    const t = el("text", Object.assign({ x, y, "font-size": 11, fill: "#5b6676" }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }

  // Round GiB ticks for [0, maxBytes]: about five.
  function gibTicks(maxBytes) {
    const maxGib = Math.max(maxBytes / GIB, 1e-3);
    const raw = maxGib / 5, mag = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const ticks = [];
    for (let v = 0; v <= maxGib * 1.0001 + step; v += step) ticks.push(v);
    return ticks;
  }

  function yAxis(svg, ticks, y) {
    for (const g of ticks) {
      el("line", { x1: PAD.l, x2: W - PAD.r, y1: y(g * GIB), y2: y(g * GIB), stroke: "#eef0f3" }, svg);
      text(svg, PAD.l - 6, y(g * GIB) + 4, `${+g.toFixed(2)} GiB`, { "text-anchor": "end" });
    }
  }

  function polyline(svg, xs, ys, color, cls) {
    const pts = xs.map((x, i) => `${x.toFixed(1)},${ys[i].toFixed(1)}`).join(" ");
    return el("polyline", { points: pts, fill: "none", stroke: color, "stroke-width": 1.6, class: cls }, svg);
  }

  function usableLine(svg, usable, y, top) {
    if (!(usable > 0) || usable > top) return;
    el("line", { x1: PAD.l, x2: W - PAD.r, y1: y(usable), y2: y(usable), stroke: "#c0392b",
                 "stroke-dasharray": "5 4" }, svg);
    text(svg, W - PAD.r - 4, y(usable) - 4, "GPU usable", { "text-anchor": "end", fill: "#c0392b" });
  }

  // Phase bands behind the curves: one rectangle per run of equal phase.
  function phaseBands(svg, phases, x, lo, hi) {
    let start = lo;
    for (let i = lo + 1; i <= hi + 1; i++) {
      if (i <= hi && phases[i] === phases[start]) continue;
      const kind = phases[start].split(" ")[0];
      el("rect", { x: x(start), y: PAD.t, width: Math.max(0.5, x(i) - x(start)), height: H - PAD.t - PAD.b,
                   fill: PHASE_FILL[kind] || "#f6f6f6" }, svg).appendChild(titleOf(phases[start]));
      start = i;
    }
  }

  function titleOf(s) {
    const t = document.createElementNS(SVG_NS, "title");
    t.textContent = s;
    return t;
  }

  function legend(svg, items) {
    let x = PAD.l + 8;
    for (const [label, color] of items) {
      el("rect", { x, y: PAD.t + 4, width: 10, height: 10, fill: color }, svg);
      text(svg, x + 14, PAD.t + 13, label, { fill: "#1d2430" });
      x += 14 + label.length * 6.5 + 16;
    }
  }

  // The allocated / reserved timeline of points lo..hi (indices into the
  // engine's thinned timeline), with the GPU's usable memory.
  function timeline(container, tl, usable, range, onZoom) {
    container.textContent = "";
    const n = tl.allocated_bytes.length;
    if (n === 0) return;
    const lo = range ? range[0] : 0, hi = range ? range[1] : n - 1;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "memory timeline" });
    let top = 0;
    for (let i = lo; i <= hi; i++) top = Math.max(top, tl.reserved_bytes[i], tl.allocated_bytes[i]);
    if (usable > top && usable < top * 2) top = usable;
    const ticks = gibTicks(top), yMax = ticks[ticks.length - 1] * GIB;
    const x = (i) => PAD.l + ((i - lo) / Math.max(1, hi - lo)) * (W - PAD.l - PAD.r);
    const y = (b) => H - PAD.b - (b / yMax) * (H - PAD.t - PAD.b);
    phaseBands(svg, tl.phase, x, lo, hi);
    yAxis(svg, ticks, y);
    const idx = [];
    for (let i = lo; i <= hi; i++) idx.push(i);
    polyline(svg, idx.map(x), idx.map((i) => y(tl.reserved_bytes[i])), "#e08a1e", "reserved");
    polyline(svg, idx.map(x), idx.map((i) => y(tl.allocated_bytes[i])), "#2f6fd6", "allocated");
    usableLine(svg, usable, y, yMax);
    text(svg, PAD.l, H - 8, `event ${tl.event_index[lo]}`);
    text(svg, W - PAD.r, H - 8, `event ${tl.event_index[hi]}`, { "text-anchor": "end" });
    legend(svg, [["allocated", "#2f6fd6"], ["reserved", "#e08a1e"]]);
    container.appendChild(svg);
    enableZoom(svg, lo, hi, x, onZoom);
  }

  // Drag across the chart to zoom into those events; double-click to reset.
  function enableZoom(svg, lo, hi, x, onZoom) {
    const toIndex = (evt) => {
      const box = svg.getBoundingClientRect();
      const px = ((evt.clientX - box.left) / box.width) * W;
      const f = (px - PAD.l) / (W - PAD.l - PAD.r);
      return Math.min(hi, Math.max(lo, Math.round(lo + f * (hi - lo))));
    };
    let from = null, band = null;
    svg.addEventListener("mousedown", (e) => {
      from = toIndex(e);
      band = el("rect", { x: x(from), y: PAD.t, width: 0, height: H - PAD.t - PAD.b, fill: "rgba(47,111,214,.15)" }, svg);
    });
    svg.addEventListener("mousemove", (e) => {
      if (from === null) return;
      const to = toIndex(e);
      band.setAttribute("x", x(Math.min(from, to)));
      band.setAttribute("width", Math.abs(x(to) - x(from)));
    });
    svg.addEventListener("mouseup", (e) => {
      const to = toIndex(e);
      const a = Math.min(from, to), b = Math.max(from, to);
      from = null;
      if (b - a >= 2) onZoom([a, b]);
      else band.remove();
    });
    svg.addEventListener("dblclick", () => onZoom(null));
  }

  // Memory against the swept knob: needed (device total) and peak allocated,
  // with the GPU's usable memory.
  function sweep(container, points, knob, usable) {
    container.textContent = "";
    if (!points.length) return;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "sweep chart" });
    let top = usable || 0;
    for (const p of points) top = Math.max(top, p.needed_bytes, p.peak_allocated_bytes);
    const ticks = gibTicks(top), yMax = ticks[ticks.length - 1] * GIB;
    const x = (i) => PAD.l + 20 + (i / Math.max(1, points.length - 1)) * (W - PAD.l - PAD.r - 40);
    const y = (b) => H - PAD.b - (b / yMax) * (H - PAD.t - PAD.b);
    yAxis(svg, ticks, y);
    const xs = points.map((_, i) => x(i));
    polyline(svg, xs, points.map((p) => y(p.needed_bytes)), "#e08a1e", "needed");
    polyline(svg, xs, points.map((p) => y(p.peak_allocated_bytes)), "#2f6fd6", "allocated");
    points.forEach((p, i) => {
      el("circle", { cx: xs[i], cy: y(p.needed_bytes), r: 3.5, fill: p.fits ? "#1e8e4a" : "#c0392b" }, svg)
        .appendChild(titleOf(`${knob} ${p[knob]}: needs ${(p.needed_bytes / GIB).toFixed(2)} GiB`));
      text(svg, xs[i], H - 10, String(p[knob]), { "text-anchor": "middle" });
    });
    usableLine(svg, usable, y, yMax);
    legend(svg, [["needed (nvidia-smi, unbounded GPU)", "#e08a1e"], ["peak allocated", "#2f6fd6"]]);
    container.appendChild(svg);
  }

  return { timeline, sweep, GIB };
})();
