"""The documents the series is read as: ``/series`` (JSON and CSV) and a window's
``/estimates``.

``/series``
-----------
One row per round (or per step: the rounds whose start lies in ``[k S, (k + 1) S)``
merged, ``round`` the first of them), columns :data:`COLUMNS`; each row's ``estimates`` is
the ``/estimates`` object (:meth:`~aggregator.estimation.estimators.Estimates.to_dict`)
with every per-dimension array restricted to the dimensions asked, in their order (JSON
``null`` for NaN). The CSV has the same leading columns, then ``mean_j, mean_lo_j,
mean_hi_j, freq_j, freq_lo_j, freq_hi_j`` for each dimension ``j`` asked (an empty cell for
NaN). Every row is estimated at once (:func:`~aggregator.estimation.estimators.
estimate_rows`), a chunk of rows at a time: :func:`series_json` and :func:`series_csv`
write the answer in pieces, so a large one never holds the interpreter for long in one
call, nor all its rows in memory as objects.

A window's ``/estimates``
-------------------------
The service's ``/estimates`` document with ``n``, ``estimates`` and ``batch_size`` over
the window's rows merged (:class:`~aggregator.series.frame.WindowSums`), the privacy
level of a device present in every round of the window (one participation per round at
its smallest release; ``null`` with ``"epsilon_pending": true`` until it is computed), and
``"window"`` saying which rows it holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from aggregator.estimation.estimators import ARRAY_FIELDS, Estimates, estimate_rows
from aggregator.series.frame import Frame, WindowSums
from aggregator.series.windows import SeriesQuery, Window, check_cells
from edge.spec import MechanismSpec

__all__ = [
    "COLUMNS",
    "CSV_FIELDS",
    "series_csv",
    "series_document",
    "series_json",
    "window_document",
]

COLUMNS = ("round", "start", "end", "rounds", "n", "batches", "smallest_release", "estimates")
"""The columns of a ``/series`` row."""
ESTIMATE_FIELDS = ARRAY_FIELDS
"""The per-dimension arrays of a row's ``estimates``, in ``Estimates.to_dict`` order."""
CSV_FIELDS = ("mean", "mean_lo", "mean_hi", "freq", "freq_lo", "freq_hi")
"""The CSV's columns per dimension (``<field>_<j>``)."""
CHUNK_ROWS = 256
"""Rows estimated and encoded at a time (a few milliseconds each at ``d = 64``)."""


def _prepare(frame: Frame, query: SeriesQuery) -> Frame:
    rows = frame if query.step is None else frame.stepped(query.step)
    check_cells(len(rows), len(query.dims))
    return rows


def _chunks(
    spec: MechanismSpec, rows: Frame, dims: Sequence[int], confidence: float
) -> Iterator[tuple[int, dict[str, NDArray[Any]]]]:
    """``(first row, estimates of dims)`` for :data:`CHUNK_ROWS` rows at a time: each
    dimension is estimated on its own, so restricting the sums first is exact; the memory a
    large answer takes stays that of one chunk."""
    cols = list(dims)
    for at in range(0, len(rows), CHUNK_ROWS):
        part = slice(at, at + CHUNK_ROWS)
        fields = estimate_rows(
            spec,
            rows.n[part],
            rows.sum_u[part][:, cols],
            rows.sum_v[part][:, cols],
            confidence=confidence,
        )
        yield at, fields


def _lists(values: NDArray[np.float64]) -> list[list[float | None]]:
    """``values`` (rows x dims) as nested lists, ``None`` where not finite."""
    out: list[list[float | None]] = values.tolist()
    for i, j in np.argwhere(~np.isfinite(values)).tolist():
        out[i][j] = None
    return out


def _head(rows: Frame, i: int) -> list[int | None]:
    return [
        int(rows.round[i]),
        int(rows.start[i]),
        int(rows.end[i]),
        int(rows.rounds[i]),
        int(rows.n[i]),
        int(rows.batches[i]),
        rows.smallest_release(i),
    ]


def _json_rows(
    rows: Frame, at: int, fields: dict[str, NDArray[Any]], confidence: float
) -> list[list[Any]]:
    arrays = {name: _lists(fields[name]) for name in ESTIMATE_FIELDS}
    kinds = np.where(fields["freq_score"], "score", "normal").tolist()
    out: list[list[Any]] = []
    for k in range(len(kinds)):
        i = at + k
        estimates: dict[str, Any] = {"n": int(rows.n[i]), "confidence": confidence}
        estimates["projected"] = False
        for name in ESTIMATE_FIELDS:
            estimates[name] = arrays[name][k]
        estimates["freq_interval"] = kinds[k]
        out.append([*_head(rows, i), estimates])
    return out


def _meta(
    spec: MechanismSpec, query: SeriesQuery, round_seconds: int, confidence: float
) -> dict[str, Any]:
    return {
        "columns": list(COLUMNS),
        "dims": list(query.dims),
        "step": "round" if query.step is None else query.step,
        "round_seconds": round_seconds,
        "confidence": confidence,
        "spec": spec.to_dict(),
    }


def series_document(
    spec: MechanismSpec,
    frame: Frame,
    query: SeriesQuery,
    *,
    round_seconds: int,
    confidence: float,
) -> dict[str, Any]:
    """The ``/series`` JSON document of ``frame`` (the rows in the query's range) for
    ``query``; :class:`~aggregator.series.windows.QueryError` if it is too large."""
    rows = _prepare(frame, query)
    out: list[list[Any]] = []
    for at, fields in _chunks(spec, rows, query.dims, confidence):
        out += _json_rows(rows, at, fields, confidence)
    meta = _meta(spec, query, round_seconds, confidence)
    return {"columns": meta.pop("columns"), "rows": out, **meta}


def series_json(
    spec: MechanismSpec,
    frame: Frame,
    query: SeriesQuery,
    *,
    round_seconds: int,
    confidence: float,
) -> Iterator[bytes]:
    """:func:`series_document` encoded, in pieces of :data:`CHUNK_ROWS` rows (built and
    encoded one after the other: a large answer never holds all its rows as objects, nor
    the interpreter, and the service's event loop, for long in one call);
    :class:`~aggregator.series.windows.QueryError` at once if it is too large."""
    rows = _prepare(frame, query)
    meta = json.dumps(_meta(spec, query, round_seconds, confidence), allow_nan=False)
    return _json_pieces(spec, rows, query, confidence, meta)


def _json_pieces(
    spec: MechanismSpec, rows: Frame, query: SeriesQuery, confidence: float, meta: str
) -> Iterator[bytes]:
    yield (meta[:-1] + ', "rows": [').encode()
    for at, fields in _chunks(spec, rows, query.dims, confidence):
        chunk = json.dumps(_json_rows(rows, at, fields, confidence), allow_nan=False)
        yield (b"," if at else b"") + chunk[1:-1].encode()
    yield b"]}"


def _cell(value: float | int | None) -> str:
    return "" if value is None else repr(value)


def series_csv(
    spec: MechanismSpec, frame: Frame, query: SeriesQuery, *, confidence: float
) -> Iterator[str]:
    """The ``/series`` CSV of ``frame`` for ``query``, in pieces of whole lines (each
    ending ``\n``); :class:`~aggregator.series.windows.QueryError` at once if too large."""
    rows = _prepare(frame, query)
    header = list(COLUMNS[:-1]) + [f"{name}_{j}" for j in query.dims for name in CSV_FIELDS]
    return _csv_pieces(spec, rows, query, confidence, header)


def _csv_pieces(
    spec: MechanismSpec, rows: Frame, query: SeriesQuery, confidence: float, header: list[str]
) -> Iterator[str]:
    yield ",".join(header) + "\n"
    k = len(query.dims)
    for at, fields in _chunks(spec, rows, query.dims, confidence):
        columns = [_lists(fields[name]) for name in CSV_FIELDS]
        lines = []
        for c in range(len(fields["mean"])):
            cells = [_cell(v) for v in _head(rows, at + c)]
            cells += [_cell(column[c][j]) for j in range(k) for column in columns]
            lines.append(",".join(cells) + "\n")
        yield "".join(lines)


def window_document(
    base: Mapping[str, Any],
    *,
    window: Window,
    start: float,
    end: float,
    sums: WindowSums,
    estimates: Estimates,
    level: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """``base`` (the service's ``/estimates`` document) over a window: ``n``, ``estimates``,
    ``batch_size`` and the privacy level (``level``: ``PrivacyLevel.to_dict()`` of the
    window's participations, ``None`` while it is being computed, then every epsilon is
    ``null`` and ``epsilon_pending`` true) are the window's; ``"window"`` says which rows
    (``from``/``to``: the range asked, for ``rK`` the span of its rows)."""
    pending = level is None and sums.rounds > 0
    shown: Mapping[str, Any] = level or {
        "epsilon_central": {"smallest": None, "latest": None},
        "epsilon_central_generic": {"smallest": None, "latest": None},
        "epsilon_total": None,
        "batches_accounted": 0,
    }
    return {
        **base,
        "n": sums.n,
        "estimates": estimates.to_dict(),
        **shown,
        "epsilon_pending": pending,
        "batch_size": {"smallest": sums.smallest, "latest": sums.latest},
        "window": {
            "spec": window.spec,
            "from": start,
            "to": end,
            "rounds": sums.rounds,
            "rows": sums.rows,
            "batches": sums.batches,
            "smallest_release": sums.smallest,
            "epsilon_total": shown["epsilon_total"],
        },
    }
