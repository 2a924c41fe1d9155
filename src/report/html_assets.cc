// Inline CSS and JavaScript of the HTML report (html_assets.h).
#include "html_assets.h"

namespace vramscope::report_internal {

const std::string_view kHtmlStyle = R"CSS(
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1000px; padding: 16px 24px 48px; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.5em; margin: 0.2em 0; word-break: break-word; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #dddddd; }
h3 { font-size: 1.05em; margin-top: 1.2em; }
.meta { color: #444444; margin: 0.2em 0; }
.verdict { font-size: 1.2em; font-weight: bold; padding: 10px 14px; border-radius: 6px; }
.verdict.fits { background: #e3f4e6; color: #1d5e2c; }
.verdict.nofit { background: #fbe4e4; color: #8e1f1f; }
.numbers { display: flex; flex-wrap: wrap; gap: 12px; }
.number { flex: 1 1 200px; border: 1px solid #dddddd; border-radius: 6px; padding: 10px 12px; }
.number .value { font-size: 1.5em; font-weight: bold; }
.number .what { color: #555555; font-size: 0.9em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eeeeee; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.peak td { font-weight: bold; background: #fff6dc; }
td.name { word-break: break-all; max-width: 28em; }
.bar { height: 12px; min-width: 1px; display: inline-block; vertical-align: middle; }
.swatch { width: 12px; height: 12px; display: inline-block; margin-right: 6px; vertical-align: middle; }
.oom { border-left: 4px solid #c0392b; background: #fdf1f0; padding: 8px 12px; }
.oom pre { white-space: pre-wrap; word-break: break-word; margin: 0.4em 0 0; }
figure.vs-timeline { position: relative; margin: 1em 0; }
figure.vs-timeline svg { max-width: 100%; height: auto; display: block; user-select: none; }
figcaption { color: #555555; font-size: 0.9em; }
.vs-tip { position: absolute; pointer-events: none; background: #ffffff; border: 1px solid #999999;
          border-radius: 4px; padding: 6px 8px; font-size: 12px; box-shadow: 0 2px 6px #0003;
          white-space: nowrap; z-index: 2; }
.vs-tip .row { display: flex; justify-content: space-between; gap: 12px; }
)CSS";

const std::string_view kHtmlScript = R"JS(
(function () {
  'use strict';
  var GIB = 1073741824;
  function gib(bytes) { return (bytes / GIB).toFixed(2) + ' GiB'; }
  function group(n) { return String(Math.round(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ','); }
  function num(el, name) { return Number(el.getAttribute(name)); }
  function niceStep(raw) {
    var m = Math.pow(10, Math.floor(Math.log10(raw)));
    var ms = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < ms.length; i++) if (ms[i] * m >= raw * (1 - 1e-9)) return ms[i] * m;
    return 10 * m;
  }
  function make(ns, tag, attrs) {
    var el = document.createElementNS(ns, tag);
    for (var k in attrs) el.setAttribute(k, attrs[k]);
    return el;
  }

  function setup(fig) {
    var svg = fig.querySelector('svg.vs-chart');
    var dataEl = fig.querySelector('script.vs-data');
    var tip = fig.querySelector('.vs-tip');
    if (!svg || !dataEl || !tip) return;
    var d = JSON.parse(dataEl.textContent);
    var ns = svg.namespaceURI;
    var L = num(svg, 'data-plot-left'), R = num(svg, 'data-plot-right');
    var T = num(svg, 'data-plot-top'), B = num(svg, 'data-plot-bottom');
    var x0 = num(svg, 'data-x-min'), x1 = num(svg, 'data-x-max');
    var view = [x0, x1];
    var content = svg.querySelector('.vs-content');
    var pins = Array.prototype.slice.call(svg.querySelectorAll('.vs-pin'));
    var xticks = svg.querySelector('.vs-xticks');
    var cursor = make(ns, 'line', {y1: T, y2: B, stroke: '#000000', 'stroke-width': 1, display: 'none'});
    var band = make(ns, 'rect', {y: T, height: B - T, fill: '#3a6ea5', 'fill-opacity': 0.15, display: 'none'});
    svg.appendChild(band);
    svg.appendChild(cursor);
    var dragFrom = null;

    function point(evt) {
      var p = svg.createSVGPoint();
      p.x = evt.clientX; p.y = evt.clientY;
      return p.matrixTransform(svg.getScreenCTM().inverse());
    }
    function toEvent(px) { return view[0] + (px - L) / (R - L) * (view[1] - view[0]); }
    function inPlot(p) { return p.x >= L && p.x <= R && p.y >= T && p.y <= B; }

    function drawTicks() {
      while (xticks.firstChild) xticks.removeChild(xticks.firstChild);
      var step = Math.max(1, Math.floor(niceStep(Math.max(1, (view[1] - view[0]) / 6))));
      for (var t = Math.ceil(view[0] / step) * step; t <= view[1]; t += step) {
        var x = L + (t - view[0]) / (view[1] - view[0]) * (R - L);
        xticks.appendChild(make(ns, 'line', {x1: x, x2: x, y1: B, y2: B + 5, stroke: '#333333'}));
        var label = make(ns, 'text', {x: x, y: B + 18, 'text-anchor': 'middle'});
        label.textContent = group(t);
        xticks.appendChild(label);
      }
    }
    function apply() {
      var k = (x1 - x0) / (view[1] - view[0]);
      var shift = L - (L + (view[0] - x0) / (x1 - x0) * (R - L)) * k;
      content.setAttribute('transform', 'translate(' + shift + ',0) scale(' + k + ',1)');
      var lastPhase = -1e9;
      pins.forEach(function (pin) {
        var px0 = num(pin, 'data-px');
        var px = shift + k * px0;
        var show = px >= L - 0.5 && px <= R + 0.5;
        if (show && pin.classList.contains('vs-phase')) {
          show = px - lastPhase >= 12;
          if (show) lastPhase = px;
        }
        pin.setAttribute('transform', 'translate(' + (px - px0) + ',0)');
        pin.setAttribute('display', show ? 'inline' : 'none');
      });
      drawTicks();
    }
    function zoomTo(a, b) {
      var span = Math.max(b - a, Math.min(2, x1 - x0));
      a = Math.max(x0, Math.min(a, x1 - span));
      view = [a, Math.min(x1, a + span)];
      apply();
    }
    function hideTip() { tip.hidden = true; cursor.setAttribute('display', 'none'); }
    function row(parent, colour, label, value) {
      var r = document.createElement('div');
      r.className = 'row';
      var left = document.createElement('span');
      if (colour) {
        var sw = document.createElement('span');
        sw.className = 'swatch';
        sw.style.background = colour;
        left.appendChild(sw);
      }
      left.appendChild(document.createTextNode(label));
      var right = document.createElement('span');
      right.textContent = value;
      r.appendChild(left); r.appendChild(right);
      parent.appendChild(r);
    }
    function showTip(evt, p) {
      var e = toEvent(p.x), lo = 0, hi = d.x.length - 1;
      if (hi < 0 || e < d.x[0]) { hideTip(); return; }
      while (lo < hi) {
        var mid = (lo + hi + 1) >> 1;
        if (d.x[mid] <= e) lo = mid; else hi = mid - 1;
      }
      cursor.setAttribute('x1', p.x); cursor.setAttribute('x2', p.x);
      cursor.setAttribute('display', 'inline');
      tip.textContent = '';
      var head = document.createElement('div');
      head.style.fontWeight = 'bold';
      head.textContent = 'event ' + group(d.x[lo]) + ', step ' + d.s[lo] + ', ' + d.phases[d.p[lo]];
      tip.appendChild(head);
      row(tip, '', 'allocated', gib(d.a[lo]));
      row(tip, '', 'reserved', gib(d.r[lo]));
      for (var c = 0; c < d.names.length; c++) {
        if (d.c[lo][c] > 0) row(tip, d.colours[c], d.names[c], gib(d.c[lo][c]));
      }
      var box = fig.getBoundingClientRect();
      tip.hidden = false;
      var left = evt.clientX - box.left + 14;
      if (left + tip.offsetWidth > box.width) left = evt.clientX - box.left - tip.offsetWidth - 14;
      tip.style.left = Math.max(0, left) + 'px';
      tip.style.top = (evt.clientY - box.top + 14) + 'px';
    }

    svg.addEventListener('mousemove', function (evt) {
      var p = point(evt);
      if (dragFrom !== null) {
        var a = Math.max(L, Math.min(dragFrom, p.x)), b = Math.min(R, Math.max(dragFrom, p.x));
        band.setAttribute('x', a); band.setAttribute('width', b - a);
        band.setAttribute('display', 'inline');
      }
      if (inPlot(p)) showTip(evt, p); else hideTip();
    });
    svg.addEventListener('mouseleave', function () { hideTip(); });
    svg.addEventListener('mousedown', function (evt) {
      var p = point(evt);
      if (inPlot(p)) { dragFrom = p.x; evt.preventDefault(); }
    });
    window.addEventListener('mouseup', function (evt) {
      if (dragFrom === null) return;
      var p = point(evt), a = Math.min(dragFrom, p.x), b = Math.max(dragFrom, p.x);
      dragFrom = null;
      band.setAttribute('display', 'none');
      if (b - a > 4) zoomTo(toEvent(Math.max(L, a)), toEvent(Math.min(R, b)));
    });
    svg.addEventListener('wheel', function (evt) {
      var p = point(evt);
      if (!inPlot(p)) return;
      evt.preventDefault();
      var e = toEvent(p.x), f = evt.deltaY < 0 ? 0.8 : 1.25;
      zoomTo(e - (e - view[0]) * f, e + (view[1] - e) * f);
    }, {passive: false});
    function reset() { view = [x0, x1]; apply(); }
    svg.addEventListener('dblclick', reset);
    var button = fig.querySelector('button.vs-reset');
    if (button) button.addEventListener('click', reset);
  }

  document.querySelectorAll('figure.vs-timeline').forEach(setup);
  document.documentElement.setAttribute('data-vs-script', 'done');
})();
)JS";

}  // namespace vramscope::report_internal
