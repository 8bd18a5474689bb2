"""The per-round series as a figure: each chosen dimension's estimate with its interval band
over clock time, the simulation's per-round truth beside it when there is one.

:func:`series_figure` is pure: it takes a ``/series`` document (docs/estimates.md: ``rows``
of ``[round, start, end, n, batches, smallest_release, estimates]`` with each estimate array
restricted to the document's ``dims``) and, optionally, a ``/truth`` document
(:mod:`aggregator.page.truth`), and returns a matplotlib :class:`~matplotlib.figure.Figure`
on the Agg canvas (no pyplot, no global state, no file): ``coco aggregator plot`` saves it
as a PNG. One panel per dimension, stacked on a shared UTC time axis; a row is drawn at
the middle of its interval; an estimate with no interval (a round without reports) leaves a
gap; the truth is a dashed line labelled "simulation truth" and never mistaken for a
measurement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure

__all__ = ["MAX_PLOT_DIMS", "SeriesPlotError", "series_figure", "series_points"]

MAX_PLOT_DIMS = 16
"""Most panels of one figure."""
ESTIMATE_COLOUR = "#0969da"
TRUTH_COLOUR = "#bc4c00"


class SeriesPlotError(ValueError):
    """A document the plot cannot draw (one line, says why)."""


def _value(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


def _at(values: Any, p: int) -> float:
    """Entry ``p`` of a JSON array (NaN for null, a short or a missing array)."""
    return _value(values[p]) if isinstance(values, list) and p < len(values) else math.nan


def _column(doc: Mapping[str, Any], name: str, what: str) -> int:
    columns = doc.get("columns")
    if not isinstance(columns, list) or name not in columns:
        raise SeriesPlotError(f"the {what} document has no column {name!r}")
    return columns.index(name)


def _position(doc: Mapping[str, Any], j: int, what: str) -> int:
    dims = doc.get("dims")
    if not isinstance(dims, list) or j not in dims:
        raise SeriesPlotError(f"the {what} document holds no dimension {j} (dims {dims})")
    return dims.index(j)


def series_points(
    doc: Mapping[str, Any], j: int
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Times (middles of the rows' intervals, Unix seconds), estimate, lower and upper
    bound of dimension ``j`` in a ``/series`` document (NaN where a row has none)."""
    start, end = _column(doc, "start", "series"), _column(doc, "end", "series")
    est = _column(doc, "estimates", "series")
    p = _position(doc, j, "series")
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise SeriesPlotError("the series document has no list of rows")
    times: list[float] = []
    out: tuple[list[float], list[float], list[float]] = ([], [], [])
    for row in rows:
        if not isinstance(row, list) or len(row) <= max(start, end, est):
            raise SeriesPlotError("a series row is not a list of the columns")
        estimates = row[est] if isinstance(row[est], dict) else {}
        times.append((_value(row[start]) + _value(row[end])) / 2)
        for target, key in zip(out, ("mean", "mean_lo", "mean_hi"), strict=True):
            target.append(_at(estimates.get(key), p))
    return times, *out


def _truth_points(doc: Mapping[str, Any], j: int) -> tuple[list[float], list[float]]:
    start, end = _column(doc, "start", "truth"), _column(doc, "end", "truth")
    mean = _column(doc, "mean", "truth")
    p = _position(doc, j, "truth")
    times, values = [], []
    for row in doc.get("rows") or []:
        if isinstance(row, list) and len(row) > max(start, end, mean):
            times.append((_value(row[start]) + _value(row[end])) / 2)
            values.append(_at(row[mean], p))
    return times, values


def _clock(times: Sequence[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t, UTC) for t in times]


def series_figure(
    series: Mapping[str, Any],
    dims: Sequence[int],
    truth: Mapping[str, Any] | None = None,
    *,
    names: Mapping[int, str] | None = None,
) -> Figure:
    """One panel per dimension of ``dims``: the estimate of each row of ``series`` with
    its interval band over clock time, and ``truth``'s per-round values beside it
    (labelled "simulation truth"); ``names`` labels a dimension (a sensor channel)."""
    if not dims:
        raise SeriesPlotError("no dimension to plot")
    if len(dims) > MAX_PLOT_DIMS:
        raise SeriesPlotError(f"at most {MAX_PLOT_DIMS} dimensions in one figure")
    confidence = series.get("confidence")
    level = f"{_value(confidence) * 100:g}%" if isinstance(confidence, int | float) else "the"
    step = series.get("step", "round")
    per = "per round" if step == "round" else f"per {_value(step):g} s step"
    fig = Figure(figsize=(9, 2.4 * len(dims) + 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(dims), 1, sharex=True, squeeze=False)[:, 0]
    for ax, j in zip(axes, dims, strict=True):
        times, mean, lo, hi = series_points(series, j)
        clock = _clock(times)
        ax.fill_between(
            clock, lo, hi, color=ESTIMATE_COLOUR, alpha=0.25, linewidth=0,
            label=f"{level} interval",
        )  # fmt: skip
        ax.plot(clock, mean, color=ESTIMATE_COLOUR, marker=".", label=f"estimate ({per})")
        if truth is not None:
            t_times, t_mean = _truth_points(truth, j)
            ax.plot(
                _clock(t_times), t_mean, color=TRUTH_COLOUR, linestyle="--", marker="x",
                markersize=4, label="simulation truth",
            )  # fmt: skip
        name = names.get(j) if names else None
        ax.set_ylabel(f"{name} (x{j})" if name else f"mean of x{j}")
        ax.grid(True, color="#eaeef2")
        ax.legend(loc="upper left", fontsize="small")
    locator = AutoDateLocator()  # type: ignore[no-untyped-call]
    formatter = ConciseDateFormatter(locator)  # type: ignore[no-untyped-call]
    axes[-1].xaxis.set_major_locator(locator)
    axes[-1].xaxis.set_major_formatter(formatter)
    axes[-1].set_xlabel("time (UTC)")
    rows = series.get("rows")
    fig.suptitle(
        f"coco-fleet estimates over time ({len(rows) if isinstance(rows, list) else 0} rows)"
    )
    return fig
