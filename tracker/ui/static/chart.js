// kiln console charts: draws the JSON in each .chart[data-chart] as SVG.
// A line chart: {kind:"line", x:"time"|name, y:name, step:bool,
// series:[{name, points:[[x,y],...]}]}. A bar chart: {kind:"bars", y:name,
// ref:number, bars:[{name, value, range:[lo,hi], class}]}. No dependencies.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = ["#c2410c", "#1d4ed8", "#15803d", "#7e22ce", "#a16207", "#0e7490", "#be185d", "#4d7c0f", "#57534e", "#b91c1c"];

  function el(name, attrs, parent, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (text !== undefined) { e.textContent = text; }
    if (parent) { parent.appendChild(e); }
    return e;
  }

  // secs writes seconds with a unit fit to their size.
  function secs(v) {
    var a = Math.abs(v);
    if (v === 0) { return "0"; }
    if (a < 1e-6) { return (v * 1e9).toPrecision(3) + " ns"; }
    if (a < 1e-3) { return (v * 1e6).toPrecision(3) + " µs"; }
    if (a < 1) { return (v * 1e3).toPrecision(3) + " ms"; }
    return v.toPrecision(3) + " s";
  }

  function fmtY(c, v) {
    return /seconds/.test(c.y || "") ? secs(v) : (Math.round(v * 1000) / 1000).toString();
  }

  function fmtX(c, v, span) {
    if (c.x !== "time") { return (Math.round(v * 100) / 100).toString(); }
    var d = new Date(v);
    var hm = ("0" + d.getHours()).slice(-2) + ":" + ("0" + d.getMinutes()).slice(-2);
    if (span > 2 * 86400e3) { return (d.getMonth() + 1) + "/" + d.getDate(); }
    if (span < 120e3) { return hm + ":" + ("0" + d.getSeconds()).slice(-2); }
    return hm;
  }

  // ticks returns about n round values covering [lo, hi].
  function ticks(lo, hi, n) {
    if (hi <= lo) { return [lo]; }
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
    var err = (hi - lo) / n / step;
    if (err >= 7.5) { step *= 10; } else if (err >= 3.5) { step *= 5; } else if (err >= 1.5) { step *= 2; }
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) { out.push(v); }
    return out;
  }

  function extent(vals) {
    var lo = Infinity, hi = -Infinity;
    vals.forEach(function (v) { if (isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    if (!isFinite(lo)) { return [0, 1]; }
    if (lo === hi) { var p = lo === 0 ? 1 : Math.abs(lo) * 0.1; return [lo - p, hi + p]; }
    return [lo, hi];
  }

  function line(box, c) {
    var W = width(box), H = W < 500 ? 220 : 300, L = 68, R = 16, T = 12, B = 34;
    var series = c.series || [], cols = W < 500 ? 1 : 3;
    var xs = [], ys = [];
    series.forEach(function (s) { s.points.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    var legendRows = Math.ceil(series.length / cols);
    var svg = el("svg", { viewBox: "0 0 " + W + " " + (H + legendRows * 18), role: "img", "aria-label": (c.y || "") + " by " + (c.x || "") });
    var xr = extent(xs), yr = extent(ys);
    if (yr[0] > 0 && yr[0] < 0.5 * yr[1]) { yr[0] = 0; }
    var pad = (yr[1] - yr[0]) * 0.05; yr = [Math.max(yr[0] === 0 ? 0 : yr[0] - pad, yr[0] >= 0 ? 0 : -Infinity), yr[1] + pad];
    function X(v) { return L + (v - xr[0]) / (xr[1] - xr[0]) * (W - L - R); }
    function Y(v) { return T + (1 - (v - yr[0]) / (yr[1] - yr[0])) * (H - T - B); }
    ticks(yr[0], yr[1], 5).forEach(function (v) {
      el("line", { "class": "grid", x1: L, x2: W - R, y1: Y(v), y2: Y(v) }, svg);
      el("text", { x: L - 6, y: Y(v) + 4, "text-anchor": "end" }, svg, fmtY(c, v));
    });
    var xt = c.x === "time" ? ticks(xr[0], xr[1], 6) : ticks(xr[0], xr[1], 8).filter(function (v) { return Math.abs(v - Math.round(v)) < 1e-9; });
    if (W < 500 && xt.length > 4) { xt = xt.filter(function (v, i) { return i % 2 === 0; }); }
    xt.forEach(function (v) {
      var x = X(v), anchor = x > W - R - 30 ? "end" : "middle";
      el("text", { x: x, y: H - B + 16, "text-anchor": anchor }, svg, fmtX(c, v, xr[1] - xr[0]));
    });
    el("line", { "class": "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }, svg);
    el("line", { "class": "axis", x1: L, x2: L, y1: T, y2: H - B }, svg);
    el("text", { x: L, y: H - 4 }, svg, c.x === "time" ? "time recorded" : (c.x || ""));
    el("text", { x: 4, y: T + 4 }, svg, c.y || "");
    series.forEach(function (s, i) {
      var color = COLORS[i % COLORS.length], d = "";
      s.points.forEach(function (p, j) {
        if (j === 0) { d += "M" + X(p[0]) + "," + Y(p[1]); return; }
        if (c.step) { d += "H" + X(p[0]) + "V" + Y(p[1]); } else { d += "L" + X(p[0]) + "," + Y(p[1]); }
      });
      el("path", { "class": "line", d: d, stroke: color }, svg);
      var g = el("g", { "class": "points", "data-series": s.name }, svg);
      s.points.forEach(function (p) {
        var pt = el("circle", { "class": "pt", cx: X(p[0]), cy: Y(p[1]), r: s.points.length > 200 ? 2 : 3, fill: color }, g);
        el("title", {}, pt, s.name + ": " + fmtY(c, p[1]) + " at " + fmtX(c, p[0], 0));
      });
      var lg = el("g", { "class": "legend" }, svg);
      var lx = 8 + (i % cols) * (W / cols), ly = H + 6 + Math.floor(i / cols) * 18;
      el("rect", { x: lx, y: ly, width: 10, height: 10, fill: color }, lg);
      el("text", { x: lx + 14, y: ly + 9 }, lg, s.name.length > 40 ? s.name.slice(0, 39) + "…" : s.name);
    });
    box.appendChild(svg);
  }

  function bars(box, c) {
    var list = c.bars || [];
    var W = width(box), R = 64, T = 8, RowH = 24, B = 24;
    var L = Math.min(Math.round(W * 0.4), 16 + 6.5 * Math.max.apply(null, list.map(function (b) { return b.name.length; }).concat([4])));
    var maxChars = Math.floor((L - 10) / 6.5);
    var H = T + list.length * RowH + B;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": c.y || "bars" });
    var hi = 0;
    list.forEach(function (b) { hi = Math.max(hi, b.value, b.range ? b.range[1] : 0); });
    if (c.ref) { hi = Math.max(hi, c.ref * 1.1); }
    hi = hi > 0 ? hi * 1.05 : 1;
    function X(v) { return L + v / hi * (W - L - R); }
    ticks(0, hi, 5).forEach(function (v) {
      el("line", { "class": "grid", x1: X(v), x2: X(v), y1: T, y2: H - B }, svg);
      el("text", { x: X(v), y: H - 8, "text-anchor": "middle" }, svg, fmtY(c, v));
    });
    list.forEach(function (b, i) {
      var y = T + i * RowH;
      var name = b.name.length > maxChars ? "…" + b.name.slice(b.name.length - maxChars + 1) : b.name;
      el("text", { x: L - 6, y: y + RowH / 2 + 4, "text-anchor": "end" }, svg, name);
      var r = el("rect", { "class": "bar " + (b["class"] || ""), x: L, y: y + 4, width: Math.max(1, X(b.value) - L), height: RowH - 8 }, svg);
      el("title", {}, r, b.name + ": " + fmtY(c, b.value) + (b.range ? " (" + fmtY(c, b.range[0]) + "–" + fmtY(c, b.range[1]) + ")" : ""));
      if (b.range) {
        var my = y + RowH / 2;
        el("line", { "class": "whisker", x1: X(b.range[0]), x2: X(b.range[1]), y1: my, y2: my }, svg);
        el("line", { "class": "whisker", x1: X(b.range[0]), x2: X(b.range[0]), y1: my - 5, y2: my + 5 }, svg);
        el("line", { "class": "whisker", x1: X(b.range[1]), x2: X(b.range[1]), y1: my - 5, y2: my + 5 }, svg);
      }
      el("text", { x: Math.max(X(b.value), b.range ? X(b.range[1]) : 0) + 6, y: y + RowH / 2 + 4 }, svg, fmtY(c, b.value));
    });
    if (c.ref) { el("line", { "class": "ref", x1: X(c.ref), x2: X(c.ref), y1: T, y2: H - B }, svg); }
    el("line", { "class": "axis", x1: L, x2: L, y1: T, y2: H - B }, svg);
    box.appendChild(svg);
  }

  // width is the box's inner width in CSS pixels: the chart is drawn at
  // its real size, so its text stays legible on a phone.
  function width(box) {
    return Math.max(280, Math.round(box.clientWidth - 8) || 800);
  }

  function draw(box) {
    var c;
    try { c = JSON.parse(box.getAttribute("data-chart")); } catch (e) { box.textContent = "chart: " + e; return; }
    while (box.firstChild) { box.removeChild(box.firstChild); }
    if (c.kind === "line" && c.series && c.series.length) { line(box, c); }
    else if (c.kind === "bars" && c.bars && c.bars.length) { bars(box, c); }
    else { box.textContent = "Nothing to plot."; }
  }

  function drawAll(root) {
    var boxes = (root || document).querySelectorAll(".chart[data-chart]");
    for (var i = 0; i < boxes.length; i++) { draw(boxes[i]); }
  }

  window.KilnChart = { draw: draw, drawAll: drawAll, secs: secs };
  document.addEventListener("DOMContentLoaded", function () { drawAll(document); });
  var resized = null;
  window.addEventListener("resize", function () {
    clearTimeout(resized);
    resized = setTimeout(function () { drawAll(document); }, 150);
  });
})();
