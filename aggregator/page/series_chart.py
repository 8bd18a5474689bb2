"""The live page's chart over time: one dimension's per-round estimate with its interval band
over clock time, and the simulation's per-round truth beside it when the aggregator serves
one (``/truth``, ``--truth``: SIMULATION ONLY, labelled so).

:data:`SERIES_HTML` is the section and :data:`SERIES_SCRIPT` its inline script, which
:mod:`aggregator.page.live_page` puts into the page (same Content-Security-Policy: it fetches
``series`` and ``truth`` from its own origin and loads nothing else). Every
:data:`~aggregator.page.live_page.POLL_SECONDS` the script asks
``/series?from=<now - window>&dims=<j>`` (docs/estimates.md) and ``/truth`` with the same
query, and draws, on ``svg#series-chart``:

* the band from each row's ``mean_lo`` to ``mean_hi`` (``data-series="band"``; a row with no
  interval breaks it),
* the estimate ``mean`` (``data-series="estimate"``),
* the truth's ``mean`` (``data-series="truth"``, dashed, legend "simulation truth"),

each row at the middle of its interval, the x axis from ``now - window`` to ``now`` in UTC.
The chart's ``data-rows`` holds the drawn rows as JSON ``[time, mean, lo, hi]`` and
``data-truth`` the truth's ``[time, mean]`` (``null`` without one), for tests and people
alike. The dimension and the window are chosen with ``select#series-dim`` and
``select#series-window`` (10 minutes to 7 days); the dimensions are named by ``/estimates``'
channels where it has them. An aggregator without ``/series`` leaves the chart empty with
a one-line note saying so.
"""

from __future__ import annotations

__all__ = ["SERIES_HTML", "SERIES_SCRIPT", "SERIES_WINDOWS"]

SERIES_WINDOWS: tuple[tuple[str, int], ...] = (
    ("10 minutes", 600),
    ("1 hour", 3600),
    ("24 hours", 86_400),
    ("7 days", 604_800),
)
"""The windows the chart offers (label, seconds); the first is the default."""

SERIES_HTML = (
    """<h2>Over time: estimate per round with its interval</h2>
<div class="muted">dimension <select id="series-dim" aria-label="dimension"></select>
 &middot; window <select id="series-window" aria-label="window">"""
    + "".join(f'<option value="{s}">{label}</option>' for label, s in SERIES_WINDOWS)
    + """</select> &middot; <span id="series-note">-</span></div>
<svg id="series-chart" width="640" height="220" role="img" data-rows="[]" data-truth="null"
 aria-label="per-round estimate with its interval band over time"></svg>
<div class="muted"><span class="key" style="background:#0969da"></span> estimate (per round)
 &nbsp; <span class="key" style="background:#0969da;opacity:.25;height:.8em"></span>
 interval &nbsp; <span id="series-truth-key" hidden><span class="key"
 style="background:#bc4c00"></span> simulation truth (SIMULATION ONLY: the fleet's exact
 per-round mean; no real deployment has it)</span></div>
"""
)

SERIES_SCRIPT = """
let seriesDim = 0, seriesWindow = Number(document.getElementById("series-window").value);
document.getElementById("series-dim").addEventListener("change", (e) => {
  seriesDim = Number(e.target.value); pollSeries(false);
});
document.getElementById("series-window").addEventListener("change", (e) => {
  seriesWindow = Number(e.target.value); pollSeries(false);
});

function seriesDims(d, channels) {
  // The dimension choices: one per dimension (at most MAX_ROWS), named by the channels.
  const select = document.getElementById("series-dim");
  const n = Math.min(d, MAX_ROWS), key = (channels ? "c" : "x") + n;
  if (select.dataset.key === key) return;
  select.dataset.key = key;
  select.replaceChildren();
  for (let j = 0; j < n; j++) {
    const option = document.createElement("option");
    option.value = String(j);
    option.textContent = channels ? channels[j].name + " (x" + j + ")" : "x" + j;
    select.appendChild(option);
  }
  if (seriesDim >= n) seriesDim = 0;
  select.value = String(seriesDim);
}

function columnsOf(doc, names) {
  const c = Array.isArray(doc.columns) ? doc.columns : [];
  const at = names.map((name) => c.indexOf(name));
  return at.some((k) => k < 0) ? null : at;
}

function seriesRows(doc, j) {
  // /series rows as [time, mean, lo, hi] of dimension j (null where a row has none).
  const c = columnsOf(doc, ["start", "end", "estimates"]);
  const p = Array.isArray(doc.dims) ? doc.dims.indexOf(j) : -1;
  if (!c || p < 0 || !Array.isArray(doc.rows)) return [];
  const at = (e, name) => (e && Array.isArray(e[name]) && isNum(e[name][p])) ? e[name][p] : null;
  return doc.rows.map((r) => [(r[c[0]] + r[c[1]]) / 2, at(r[c[2]], "mean"),
    at(r[c[2]], "mean_lo"), at(r[c[2]], "mean_hi")]);
}

function truthRows(doc, j) {
  // /truth rows as [time, mean] of dimension j.
  const c = columnsOf(doc, ["start", "end", "mean"]);
  const p = Array.isArray(doc.dims) ? doc.dims.indexOf(j) : -1;
  if (!c || p < 0 || !Array.isArray(doc.rows)) return null;
  return doc.rows.map((r) => [(r[c[0]] + r[c[1]]) / 2,
    Array.isArray(r[c[2]]) && isNum(r[c[2]][p]) ? r[c[2]][p] : null]);
}

function runs(points, ok) {
  // Consecutive points where ok(point) holds: a gap breaks a line or a band.
  const out = [];
  let run = [];
  for (const p of points) {
    if (ok(p)) { run.push(p); } else if (run.length) { out.push(run); run = []; }
  }
  if (run.length) out.push(run);
  return out;
}

function drawSeries(rows, truth, t0, t1) {
  const svg = document.getElementById("series-chart");
  const W = 640, H = 220, left = 52, right = 16, top = 10, bottom = 38;
  svg.replaceChildren();
  svg.dataset.rows = JSON.stringify(rows);
  svg.dataset.truth = JSON.stringify(truth);
  document.getElementById("series-truth-key").hidden = !truth;
  const values = rows.flatMap((r) => r.slice(1)).concat(truth ? truth.map((r) => r[1]) : [])
    .filter(isNum);
  if (!values.length) {
    label(svg, W / 2, H / 2, "no round with reports in this window yet");
    return;
  }
  let lo = Math.min(...values), hi = Math.max(...values);
  const pad = (hi - lo) * 0.08 || Math.abs(hi) * 0.1 || 0.1;
  lo -= pad; hi += pad;
  const xOf = (t) => left + (t - t0) / (t1 - t0) * (W - left - right);
  const yOf = (v) => H - bottom - (v - lo) / (hi - lo) * (H - top - bottom);
  for (let k = 0; k <= 4; k++) {
    const v = lo + (hi - lo) * k / 4;
    el("line", {x1: left, x2: W - right, y1: yOf(v), y2: yOf(v), stroke: "#eaeef2"}, svg);
    label(svg, left - 6, yOf(v) + 4, fmt(Number(v.toPrecision(3))), "end");
  }
  const axis = el("g", {id: "series-axis"}, svg);
  label(axis, left, H - 22, clock(t0), "start");
  label(axis, xOf((t0 + t1) / 2), H - 22, clock((t0 + t1) / 2));
  label(axis, W - right, H - 22, clock(t1), "end");
  label(axis, xOf((t0 + t1) / 2), H - 8, "mean of x" + seriesDim + " (last " +
    fmt(Number(((t1 - t0) / 60).toPrecision(3))) + " min)");
  for (const run of runs(rows, (r) => isNum(r[2]) && isNum(r[3]))) {
    const upper = run.map((r) => xOf(r[0]) + "," + yOf(r[3]));
    const lower = run.slice().reverse().map((r) => xOf(r[0]) + "," + yOf(r[2]));
    el("polygon", {points: upper.concat(lower).join(" "), fill: "#0969da", opacity: 0.22,
      stroke: "#0969da", "stroke-opacity": 0.35, "data-series": "band"}, svg);
  }
  for (const run of runs(rows, (r) => isNum(r[1]))) {
    el("polyline", {points: run.map((r) => xOf(r[0]) + "," + yOf(r[1])).join(" "),
      fill: "none", stroke: "#0969da", "stroke-width": 2, "data-series": "estimate"}, svg);
    if (run.length === 1) {  // a lone round: a dot and its interval as a bar
      const [t, m, a, b] = run[0];
      el("circle", {cx: xOf(t), cy: yOf(m), r: 3, fill: "#0969da"}, svg);
      if (isNum(a) && isNum(b)) {
        el("line", {x1: xOf(t), x2: xOf(t), y1: yOf(a), y2: yOf(b), stroke: "#0969da",
          "stroke-width": 3, opacity: 0.35}, svg);
      }
    }
  }
  for (const run of runs(truth || [], (r) => isNum(r[1]))) {
    el("polyline", {points: run.map((r) => xOf(r[0]) + "," + yOf(r[1])).join(" "),
      fill: "none", stroke: "#bc4c00", "stroke-width": 2, "stroke-dasharray": "5 3",
      "data-series": "truth"}, svg);
  }
}

async function pollSeries(again) {
  const note = document.getElementById("series-note");
  const t1 = Date.now() / 1000, t0 = t1 - seriesWindow, j = seriesDim;
  const query = "?from=" + t0.toFixed(3) + "&to=" + t1.toFixed(3) + "&dims=" + j;
  try {
    const response = await fetch("series" + query, {cache: "no-store"});
    if (!response.ok) throw new Error("HTTP " + response.status);
    const rows = seriesRows(await response.json(), j);
    let truth = null;
    const answer = await fetch("truth" + query, {cache: "no-store"});
    if (answer.ok) truth = truthRows(await answer.json(), j);
    if (j === seriesDim) {
      drawSeries(rows, truth, t0, t1);
      note.textContent = rows.length + " rounds" + (truth ? ", with the simulation truth" : "");
    }
  } catch (err) {
    note.textContent = "cannot read /series (" + err.message + "); retrying";
  } finally {
    if (again) setTimeout(() => pollSeries(true), POLL_MS);
  }
}
pollSeries(true);
"""
