"""The aggregator's live page: one self-contained HTML document served at ``/``.

No build step, no CDN, no external font or image: inline CSS and JavaScript only, and the
HTTP handler sends it with a Content-Security-Policy that lets the page load nothing but
``/estimates``, ``/series`` and ``/truth`` from its own origin. The script polls
``/estimates`` every :data:`POLL_SECONDS` and shows

* the report counts: ``n``, reports, batches, rejected batches, duplicates;
* in a sharded deployment, the smallest batch of each shard (the smallest of all is the
  guarantee every report has), and the reports the shufflers' manifests list that never
  came;
* the certified central epsilon of the smallest and the latest batch, the generic bound
  beside it, the composed ``epsilon_total``, and a time series of the smallest batch's
  epsilon, the latest batch's and ``epsilon_total``: ``/estimates``' ``privacy_history``
  (:mod:`aggregator.page.page_data`; ``data-source="service"`` on the chart), else the points
  the page keeps while it is open, one per change of ``batches_accounted``
  (``data-source="page"``). The chart's ``data-points`` holds them as JSON
  ``[batches_accounted, smallest, latest, total]`` and ``data-times`` their Unix times; the
  axis (``#eps-axis``) shows clock times in UTC and seconds since the first point;
* each dimension's mean and frequency with its interval half-width, as a table and an SVG
  chart of the intervals (the first :data:`MAX_ROWS` dimensions); where ``/estimates`` has
  ``channels`` (one per dimension), each channel's name, unit, mean in that unit with its
  interval, and range instead, the chart placing each interval on its channel's range;
* one dimension's per-round estimate with its interval band over clock time, and the
  simulation's per-round truth beside it where the aggregator serves ``/truth``
  (:mod:`aggregator.page.series_chart`).

Numbers are rendered deterministically for tests and people alike: every value sits in an
element with ``data-field`` (and ``data-dim`` for a dimension) whose ``data-value`` is the
raw number as JavaScript prints it (shortest round trip, ``null`` when absent), and whose
text is a fixed rendering (integers in full, other numbers with 4 significant digits). The
half-width is ``(hi - lo) / 2`` of ``<name>_lo``/``<name>_hi`` when ``/estimates`` has them,
else ``z * <name>_se`` with ``z`` the normal quantile of ``estimates.confidence``
(Wichura's AS241, the algorithm of Python's ``NormalDist.inv_cdf``).

The page shows nothing about any device: ``/estimates`` holds aggregates only.
"""

from __future__ import annotations

from aggregator.page.series_chart import SERIES_HTML, SERIES_SCRIPT

__all__ = ["CONTENT_SECURITY_POLICY", "MAX_ROWS", "PAGE", "POLL_SECONDS"]

POLL_SECONDS = 2
"""Seconds between two reads of ``/estimates``."""
MAX_ROWS = 64
"""Dimensions shown in the table and the chart (the first ones)."""
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
)
"""Sent with the page: it may fetch from its own origin only, and load nothing else."""

_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>coco-fleet aggregator</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2em auto; max-width: 62em;
  padding: 0 1em; color: #1b1f24; background: #fff; }
h1 { font-size: 1.4em; margin: 0 0 .2em; }
h2 { font-size: 1.1em; margin: 1.2em 0 .4em; border-bottom: 1px solid #d0d7de; }
.muted { color: #57606a; }
.num { font-variant-numeric: tabular-nums; text-align: right; }
table { border-collapse: collapse; }
th, td { padding: .15em .7em; border-bottom: 1px solid #eaeef2; }
th { text-align: right; font-weight: 600; }
th.left, td.left { text-align: left; }
.cards { display: flex; flex-wrap: wrap; gap: .6em; }
.card { border: 1px solid #d0d7de; border-radius: 6px; padding: .4em .8em; min-width: 7em; }
.card .label { font-size: .85em; color: #57606a; }
.card .value { font-size: 1.4em; font-variant-numeric: tabular-nums; }
#status.ok { color: #1a7f37; } #status.error { color: #cf222e; }
#status.stopped { color: #57606a; }
svg { display: block; margin: .4em 0; }
svg text { font: 11px system-ui, sans-serif; fill: #57606a; }
.key { display: inline-block; width: 1.4em; height: .25em; vertical-align: middle; }
</style>
</head>
<body>
<h1>coco-fleet aggregator</h1>
<div class="muted">deployment <span id="deployment">-</span> &middot; <span id="spec">-</span>
 &middot; <span id="status" data-field="status">connecting</span></div>

<h2>Reports</h2>
<div class="cards">
<div class="card"><div class="label">n (in the estimates)</div>
 <div class="value" data-field="n" data-value="null">-</div></div>
<div class="card"><div class="label">reports applied</div>
 <div class="value" data-field="reports" data-value="null">-</div></div>
<div class="card"><div class="label">batches applied</div>
 <div class="value" data-field="batches" data-value="null">-</div></div>
<div class="card"><div class="label">batches rejected</div>
 <div class="value" data-field="rejected" data-value="null">-</div></div>
<div class="card"><div class="label">duplicates ignored</div>
 <div class="value" data-field="duplicates" data-value="null">-</div></div>
</div>
<div class="muted">rejected by reason: <span id="reasons">none</span></div>

<h2>Privacy (certified central epsilon at delta <span data-field="delta"
 data-value="null">-</span>)</h2>
<table>
<tr><th class="left"></th><th>smallest batch</th><th>latest batch</th></tr>
<tr><td class="left">batch size</td>
 <td class="num" data-field="batch_size.smallest" data-value="null">-</td>
 <td class="num" data-field="batch_size.latest" data-value="null">-</td></tr>
<tr><td class="left">epsilon_central (blanket)</td>
 <td class="num" data-field="epsilon_central.smallest" data-value="null">-</td>
 <td class="num" data-field="epsilon_central.latest" data-value="null">-</td></tr>
<tr><td class="left">epsilon_central_generic</td>
 <td class="num" data-field="epsilon_central_generic.smallest" data-value="null">-</td>
 <td class="num" data-field="epsilon_central_generic.latest" data-value="null">-</td></tr>
<tr><td class="left">epsilon_total (a device in every batch)</td>
 <td class="num" colspan="2" data-field="epsilon_total" data-value="null">-</td></tr>
<tr><td class="left">epsilon_total per rolling period (a device in every round of it)</td>
 <td class="num" colspan="2" id="periods" data-field="epsilon_total_period"
  data-value="null">-</td></tr>
<tr><td class="left">batches accounted in epsilon_total</td>
 <td class="num" colspan="2" data-field="batches_accounted" data-value="null">-</td></tr>
<tr><td class="left">epsilon_local (one report)</td>
 <td class="num" colspan="2" data-field="epsilon_local" data-value="null">-</td></tr>
</table>
<div class="muted" id="shards-note">smallest batch by shard (sharded deployments): <span
 id="shards">-</span>; reports counted missing from the shufflers' manifests: <span
 data-field="manifests.reports_missing" data-value="null">-</span></div>
<svg id="eps-chart" width="640" height="200" role="img"
 aria-label="epsilon of the smallest and the latest batch and epsilon_total over time"></svg>
<div class="muted"><span class="key" style="background:#1a7f37"></span> epsilon_central of
 the smallest batch (every report's guarantee) &nbsp; <span class="key"
 style="background:#0969da"></span> of the latest batch &nbsp; <span class="key"
 style="background:#bc4c00"></span> epsilon_total (composed over rounds) &nbsp; (<span
 id="points">0</span> points <span id="points-source">kept by this page</span>)</div>

<h2>Estimates with <span id="confidence">95%</span> intervals</h2>
<div class="muted" id="dims-note"></div>
<svg id="est-chart" width="640" height="40" role="img" aria-label="means with intervals"></svg>
<table id="est-table">
<thead></thead>
<tbody></tbody>
</table>
<p class="muted" id="units-note">Reads /estimates every __POLL__ s.</p>

__SERIES_HTML__

<script>
"use strict";
const POLL_MS = __POLL__ * 1000;
const MAX_ROWS = __MAX_ROWS__;
const MAX_POINTS = 500;
const SVG = "http://www.w3.org/2000/svg";
const history = [];

function invNormal(p) {
  // Wichura's AS241, as Python's statistics.NormalDist.inv_cdf.
  const q = p - 0.5;
  let num, den;
  if (Math.abs(q) <= 0.425) {
    const r = 0.180625 - q * q;
    num = (((((((2.5090809287301226727e+3 * r + 3.3430575583588128105e+4) * r +
      6.7265770927008700853e+4) * r + 4.5921953931549871457e+4) * r +
      1.3731693765509461125e+4) * r + 1.9715909503065514427e+3) * r +
      1.3314166789178437745e+2) * r + 3.3871328727963666080e+0) * q;
    den = (((((((5.2264952788528545610e+3 * r + 2.8729085735721942674e+4) * r +
      3.9307895800092710610e+4) * r + 2.1213794301586595867e+4) * r +
      5.3941960214247511077e+3) * r + 6.8718700749205790830e+2) * r +
      4.2313330701600911252e+1) * r + 1.0);
    return num / den;
  }
  let r = q <= 0 ? p : 1.0 - p;
  r = Math.sqrt(-Math.log(r));
  if (r <= 5.0) {
    r = r - 1.6;
    num = (((((((7.7454501427834140764e-4 * r + 2.2723844989269184583e-2) * r +
      2.4178072517745061177e-1) * r + 1.2704582524523683826e+0) * r +
      3.6478483247632046050e+0) * r + 5.7694972214606914055e+0) * r +
      4.6303378461565452959e+0) * r + 1.4234371107496835773e+0);
    den = (((((((1.0507500716444168432e-9 * r + 5.4759380849953449460e-4) * r +
      1.5198666563616457197e-2) * r + 1.4810397642748007459e-1) * r +
      6.8976733498510000455e-1) * r + 1.6763848301838038494e+0) * r +
      2.0531916266377588219e+0) * r + 1.0);
  } else {
    r = r - 5.0;
    num = (((((((2.0103343992922881327e-7 * r + 2.7115555687434875782e-5) * r +
      1.2426609473880784386e-3) * r + 2.6532189526576123093e-2) * r +
      2.9656057182850489123e-1) * r + 1.7848265399172913358e+0) * r +
      5.4637849111641143699e+0) * r + 6.6579046435011037772e+0);
    den = (((((((2.0442631033899397856e-15 * r + 1.4215117583164458887e-7) * r +
      1.8463183175100546818e-5) * r + 7.8686913114561325910e-4) * r +
      1.4875361290850614853e-2) * r + 1.3692988092273580531e-1) * r +
      5.9983220655588793769e-1) * r + 1.0);
  }
  const x = num / den;
  return q < 0 ? -x : x;
}

function isNum(v) { return typeof v === "number" && isFinite(v); }
function fmt(v) {
  if (!isNum(v)) return "-";
  if (Number.isInteger(v) && Math.abs(v) < 1e15) return String(v);
  return Number(v.toPrecision(4)).toString();
}
function put(el, v, text) {
  el.dataset.value = isNum(v) ? String(v) : "null";
  el.textContent = text === undefined ? fmt(v) : text;
}
function field(name) { return document.querySelector('[data-field="' + name + '"]'); }
function get(doc, path) {
  return path.split(".").reduce((o, k) => (o == null ? null : o[k]), doc);
}

function intervals(est, name, z) {
  // [value, half-width, lo, hi] per dimension.
  const v = est[name] || [], lo = est[name + "_lo"], hi = est[name + "_hi"];
  const se = est[name + "_se"] || [];
  return v.map((x, j) => {
    if (lo && hi) {
      const ok = isNum(lo[j]) && isNum(hi[j]);
      return [x, ok ? (hi[j] - lo[j]) / 2 : null, ok ? lo[j] : null, ok ? hi[j] : null];
    }
    const h = isNum(se[j]) && isNum(x) ? z * se[j] : null;
    return [x, h, h === null ? null : x - h, h === null ? null : x + h];
  });
}

function el(tag, attrs, parent) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}
function label(parent, x, y, text, anchor) {
  const t = el("text", {x: x, y: y, "text-anchor": anchor || "middle"}, parent);
  t.textContent = text;
}

function drawEstimates(rows, channels) {
  // rows: [j, [value, half-width, lo, hi]]; with channels, each row on its own range.
  const svg = document.getElementById("est-chart");
  const W = 640, left = channels ? 118 : 46, right = channels ? 96 : 16, rowH = 16, top = 8;
  const H = top + rows.length * rowH + 24;
  svg.setAttribute("height", H);
  svg.replaceChildren();
  const span = (j) => channels ? [channels[j].lo, channels[j].hi] : [-1, 1];
  const xOf = (j, v) => {
    const [a, b] = span(j);
    return left + (Math.max(a, Math.min(b, v)) - a) / (b - a) * (W - left - right);
  };
  const ticks = channels ? [[0, "low"], [0.5, "mid-range"], [1, "high"]]
    : [[0, "-1"], [0.25, "-0.5"], [0.5, "0"], [0.75, "0.5"], [1, "1"]];
  for (const [f, text] of ticks) {
    const x = left + f * (W - left - right);
    el("line", {x1: x, x2: x, y1: top - 4, y2: H - 20,
      stroke: f === 0.5 ? "#8c959f" : "#eaeef2"}, svg);
    label(svg, x, H - 6, text);
  }
  rows.forEach(([j, m], i) => {
    const y = top + i * rowH + rowH / 2;
    label(svg, left - 8, y + 4, channels ? channels[j].name : "x" + j, "end");
    if (isNum(m[2]) && isNum(m[3])) {
      el("line", {x1: xOf(j, m[2]), x2: xOf(j, m[3]), y1: y, y2: y, stroke: "#0969da",
        "stroke-width": 3, "stroke-linecap": "round", opacity: 0.45}, svg);
    }
    if (isNum(m[0])) el("circle", {cx: xOf(j, m[0]), cy: y, r: 3.5, fill: "#0969da"}, svg);
    if (channels) {
      label(svg, W - right + 8, y + 4, fmt(m[0]) + " " + channels[j].unit, "start");
    }
  });
}

function clock(t) {
  // Unix seconds -> "HH:MM:SS UTC": the same on every machine.
  return new Date(t * 1000).toISOString().slice(11, 19) + " UTC";
}

function drawHistory(points, source) {
  // points: {t (Unix seconds), batches, smallest, latest, total}
  const svg = document.getElementById("eps-chart");
  const W = 640, H = 200, left = 46, right = 16, top = 10, bottom = 38;
  svg.replaceChildren();
  svg.dataset.points = JSON.stringify(
    points.map((p) => [p.batches, p.smallest, p.latest, p.total]));
  svg.dataset.times = JSON.stringify(points.map((p) => p.t));
  svg.dataset.source = source;
  document.getElementById("points").textContent = String(points.length);
  document.getElementById("points-source").textContent = source === "service"
    ? "kept by the aggregator since it started" : "kept by this page since it was opened";
  const values = points.flatMap((p) => [p.smallest, p.latest, p.total]).filter(isNum);
  if (!values.length) {
    label(svg, W / 2, H / 2, "no batch accounted yet");
    return;
  }
  const ymax = Math.max(...values) * 1.1;
  const t0 = points[0].t, t1 = points[points.length - 1].t;
  const single = t1 <= t0;
  const xOf = (t) => single ? (left + W - right) / 2
    : left + (t - t0) / (t1 - t0) * (W - left - right);
  const yOf = (v) => H - bottom - v / ymax * (H - top - bottom);
  for (let k = 0; k <= 4; k++) {
    const v = ymax * k / 4;
    el("line", {x1: left, x2: W - right, y1: yOf(v), y2: yOf(v), stroke: "#eaeef2"}, svg);
    label(svg, left - 6, yOf(v) + 4, fmt(Number(v.toPrecision(2))), "end");
  }
  const axis = el("g", {id: "eps-axis"}, svg);
  if (single) {
    label(axis, xOf(t0), H - 22, clock(t0));
    label(axis, xOf(t0), H - 8, "one level so far (batches accounted " + points[0].batches + ")");
  } else {
    const mid = (t0 + t1) / 2;
    label(axis, left, H - 22, clock(t0), "start");
    label(axis, xOf(mid), H - 22, clock(mid));
    label(axis, W - right, H - 22, clock(t1), "end");
    label(axis, left, H - 8, "0 s", "start");
    label(axis, xOf(mid), H - 8, "+" + fmt(Number((mid - t0).toPrecision(3))) + " s");
    label(axis, W - right, H - 8, "+" + fmt(Number((t1 - t0).toPrecision(3))) + " s", "end");
  }
  // the smallest batch's last, on top; the latest dashed: they coincide while the latest
  // batch is the smallest
  for (const [key, color, dash] of [["total", "#bc4c00", "none"],
      ["latest", "#0969da", "6 4"], ["smallest", "#1a7f37", "none"]]) {
    const pts = points.filter((p) => isNum(p[key]));
    if (!pts.length) continue;
    el("polyline", {points: pts.map((p) => xOf(p.t) + "," + yOf(p[key])).join(" "),
      fill: "none", stroke: color, "stroke-width": 2, "stroke-dasharray": dash,
      "data-series": key}, svg);
    for (const p of pts) el("circle", {cx: xOf(p.t), cy: yOf(p[key]), r: 2.5, fill: color}, svg);
  }
}

function serviceHistory(doc) {
  // /estimates' privacy_history as points, or null when it has none.
  const h = doc.privacy_history;
  if (!h || !Array.isArray(h.columns) || !Array.isArray(h.points)) return null;
  const at = (name) => h.columns.indexOf(name);
  const c = [at("time"), at("batches_accounted"), at("smallest"), at("latest"),
    at("epsilon_total")];
  if (c.some((k) => k < 0)) return null;
  return h.points.map((p) => ({t: p[c[0]], batches: p[c[1]], smallest: p[c[2]],
    latest: p[c[3]], total: p[c[4]]}));
}

function channelsOf(doc, d) {
  // The sensor channels of /estimates when they describe the d dimensions, else null.
  const ch = doc.channels;
  if (!Array.isArray(ch) || ch.length !== d) return null;
  return ch.every((c) => c && typeof c.name === "string" && typeof c.unit === "string" &&
    isNum(c.lo) && isNum(c.hi) && c.hi > c.lo) ? ch : null;
}

function header(columns) {
  const head = document.querySelector("#est-table thead");
  head.replaceChildren();
  const tr = head.insertRow();
  columns.forEach((text, k) => {
    const th = document.createElement("th");
    if (k === 0 || (columns.length === 6 && k === 1)) th.className = "left";
    th.textContent = text;
    tr.appendChild(th);
  });
}

function render(doc) {
  const est = doc.estimates || {};
  const counters = doc.counters || {};
  const rejected = counters.rejected || {};
  put(field("n"), doc.n);
  put(field("reports"), counters.reports);
  put(field("batches"), counters.batches);
  put(field("rejected"), Object.values(rejected).reduce((a, b) => a + b, 0));
  put(field("duplicates"), counters.duplicates);
  const reasons = Object.entries(rejected).filter(([, c]) => c > 0);
  document.getElementById("reasons").textContent =
    reasons.length ? reasons.map(([r, c]) => r + " " + c).join(", ") : "none";
  for (const name of ["delta", "epsilon_local", "epsilon_total", "batches_accounted",
      "batch_size.smallest", "batch_size.latest", "epsilon_central.smallest",
      "epsilon_central.latest", "epsilon_central_generic.smallest",
      "epsilon_central_generic.latest", "manifests.reports_missing"]) {
    put(field(name), get(doc, name));
  }
  const periods = Object.entries(doc.epsilon_total_period || {});
  const periodsCell = document.getElementById("periods");
  periodsCell.dataset.value = JSON.stringify(doc.epsilon_total_period ?? null);
  periodsCell.textContent = periods.length
    ? periods.map(([p, e]) => "last " + p + ": " + (isNum(e) ? e.toPrecision(4) : "pending"))
      .join(", ")
    : "-";
  const shards = Object.entries(doc.shards || {});
  document.getElementById("shards").textContent = shards.length
    ? shards.map(([label, s]) => label + " " + (isNum(s.smallest) ? s.smallest : "-")).join(", ")
    : "-";
  document.getElementById("deployment").textContent = String(doc.deployment || "-");
  const spec = doc.spec || {};
  document.getElementById("spec").textContent =
    spec.mechanism + " d=" + spec.d + " s=" + spec.s + " epsilon=" + spec.epsilon;

  const confidence = isNum(est.confidence) ? est.confidence : 0.95;
  document.getElementById("confidence").textContent = fmt(confidence * 100) + "%";
  const z = invNormal(0.5 + confidence / 2);
  const means = intervals(est, "mean", z), freqs = intervals(est, "freq", z);
  const channels = channelsOf(doc, means.length);
  const shown = Math.min(means.length, MAX_ROWS);
  document.getElementById("dims-note").textContent = means.length > shown
    ? "the first " + shown + " of " + means.length + " dimensions" : "";
  document.getElementById("units-note").textContent = channels
    ? "Reads /estimates every " + POLL_MS / 1000 + " s. Each channel's fleet mean in its " +
      "unit, with its interval (the mechanism's and the encoding's error); the chart " +
      "places it on the channel's range."
    : "Reads /estimates every " + POLL_MS / 1000 + " s. Means of x_j are in [-1, 1]; " +
      "frequency is the share of reports with x_j != 0.";
  const body = document.querySelector("#est-table tbody");
  const mode = (channels ? "channels " : "dims ") + shown;
  if (body.dataset.mode !== mode) {
    body.dataset.mode = mode;
    body.replaceChildren();
    header(channels
      ? ["channel", "unit", "estimate", "\u00b1 half-width", "low", "high"]
      : ["dim", "mean", "\u00b1 half-width", "frequency", "\u00b1 half-width"]);
    const names = channels ? ["value", "value_halfwidth", "channel_lo", "channel_hi"]
      : ["mean", "mean_halfwidth", "freq", "freq_halfwidth"];
    for (let j = 0; j < shown; j++) {
      const tr = body.insertRow();
      const head = tr.insertCell();
      head.className = "left";
      head.dataset.field = "label";
      head.dataset.dim = String(j);
      head.textContent = channels ? channels[j].name : "x" + j;
      if (channels) {
        const unit = tr.insertCell();
        unit.className = "left";
        unit.dataset.field = "unit";
        unit.dataset.dim = String(j);
        unit.textContent = channels[j].unit;
      }
      for (const name of names) {
        const td = tr.insertCell();
        td.className = "num";
        td.dataset.field = name;
        td.dataset.dim = String(j);
      }
    }
  }
  const rows = [];
  for (let j = 0; j < shown; j++) {
    const cells = body.rows[j].cells;
    if (channels) {
      const c = channels[j];
      const ok = isNum(c.value_lo) && isNum(c.value_hi);
      const row = [c.value, ok ? (c.value_hi - c.value_lo) / 2 : null,
        ok ? c.value_lo : null, ok ? c.value_hi : null];
      cells[0].textContent = c.name;
      cells[1].textContent = c.unit;
      put(cells[2], row[0]);
      put(cells[3], row[1]);
      put(cells[4], c.lo);
      put(cells[5], c.hi);
      rows.push([j, row]);
    } else {
      put(cells[1], means[j][0]);
      put(cells[2], means[j][1]);
      put(cells[3], freqs[j][0]);
      put(cells[4], freqs[j][1]);
      rows.push([j, means[j]]);
    }
  }
  drawEstimates(rows, channels);
  seriesDims(means.length, channels);

  const accounted = doc.batches_accounted;
  const last = history[history.length - 1];
  if (isNum(accounted) && accounted > 0 && (!last || last.batches !== accounted)) {
    history.push({t: Date.now() / 1000, batches: accounted,
      smallest: get(doc, "epsilon_central.smallest"),
      latest: get(doc, "epsilon_central.latest"), total: doc.epsilon_total});
    if (history.length > MAX_POINTS) history.shift();
  }
  const kept = serviceHistory(doc);
  if (kept) drawHistory(kept, "service");
  else drawHistory(history, "page");
}

function showState(status, doc) {
  // the service's own state (/estimates "state", "not_ready"), never "live" by default
  if (doc.state === "stopped") {
    status.className = "stopped";
    status.textContent = "stopped (final state)";
  } else if (doc.state === "not_ready" || doc.ready === false) {
    status.className = "error";
    status.textContent = "not ready: " + (doc.not_ready || "no reason given");
  } else {
    status.className = "ok";
    status.textContent = "live";
  }
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const response = await fetch("estimates", {cache: "no-store"});
    if (response.status === 503) {  // {"ready": false, "recovering": true} while it recovers
      const early = await response.json().catch(() => null);
      if (early && early.recovering) {
        showState(status, {state: "not_ready", not_ready: "recovering the checkpoint"});
        return;
      }
    }
    if (!response.ok) throw new Error("HTTP " + response.status);
    const doc = await response.json();
    render(doc);
    showState(status, doc);
  } catch (err) {
    status.className = "error";
    status.textContent = "cannot read /estimates (" + err.message + "); retrying";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}
__SERIES_SCRIPT__
drawHistory(history, "page");
poll();
</script>
</body>
</html>
"""

PAGE: bytes = (
    _HTML.replace("__POLL__", str(POLL_SECONDS))
    .replace("__MAX_ROWS__", str(MAX_ROWS))
    .replace("__SERIES_HTML__", SERIES_HTML)
    .replace("__SERIES_SCRIPT__", SERIES_SCRIPT)
    .encode()
)
"""The page, UTF-8."""
