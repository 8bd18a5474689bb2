"""SIMULATION-ONLY per-round ground truth beside the estimates: the ``/truth`` document.

A simulated fleet (``coco fleet --ground-truth FILE``, ``coco demo``) knows every vector it
sent, so it writes, per wall-clock round, the exact mean of ``x_j`` and the share of reports
with ``x_j != 0`` over the reports it published (docs/fleet.md, "Ground truth"): the
quantities the aggregator's per-round estimates estimate, in the same coordinates. No real
deployment has them. ``coco aggregator run --truth FILE`` serves that file's rounds at
``GET /truth`` so that the live page and ``coco aggregator plot`` can draw the truth beside
the estimate, labelled as simulation; this module reads such a document
(:func:`parse_truth`), reads the query (:func:`parse_query`, the same ``from``, ``to`` and
``dims`` as ``/series``) and builds the answer (:meth:`TruthTable.select`). Pure: no I/O, no
clock (the shell passes ``now``).

The answer::

    {"simulation_only": true, "note": ..., "round_seconds": R, "day_seconds": S,
     "dims": [0, 3], "columns": ["round", "start", "end", "n", "mean", "freq"],
     "rows": [[r, r R, (r + 1) R, n, [mean_0, mean_3], [freq_0, freq_3]], ...]}

with the rows whose ``end`` lies in ``(from, to]`` (as ``/series``), oldest first, and
``null`` where a round has no reports. A document that is not a ground-truth file, or a
malformed query, is a :class:`TruthError` of one line (the shell answers 404 or 400).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

__all__ = [
    "MAX_TRUTH_ROUNDS",
    "TRUTH_NOTE",
    "TruthError",
    "TruthQuery",
    "TruthRound",
    "TruthTable",
    "parse_query",
    "parse_truth",
]

TRUTH_NOTE = (
    "SIMULATION ONLY: the exact per-round mean of x_j and share of reports with x_j != 0 "
    "over the vectors the simulated fleet published; no real deployment knows them."
)
MAX_TRUTH_ROUNDS = 1_000_000
"""Most rounds a truth document may hold (a week of 1-s rounds is 604,800)."""


class TruthError(ValueError):
    """A truth document or query this module cannot use (one line, says why)."""


@dataclass(frozen=True)
class TruthRound:
    """One round of the truth: its number, interval, reports and per-dimension values."""

    round: int
    start: int
    end: int
    n: int
    mean: tuple[float | None, ...]
    freq: tuple[float | None, ...]


@dataclass(frozen=True)
class TruthQuery:
    """``from``, ``to`` (Unix seconds) and the dimensions of a ``/truth`` request."""

    start: float
    end: float
    dims: tuple[int, ...]


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TruthError(f"a truth value must be a finite number or null, got {value!r}")
    return float(value)


def _values(entry: Mapping[str, Any], key: str, d: int) -> tuple[float | None, ...]:
    values = entry.get(key)
    if not isinstance(values, list) or len(values) != d:
        raise TruthError(f"every round's {key} must be a list of {d} values")
    return tuple(_number(v) for v in values)


def _int(value: Any, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TruthError(f"{what} must be an integer >= {low}, got {value!r}")
    return value


@dataclass(frozen=True)
class TruthTable:
    """The rounds of a ground-truth document, oldest first."""

    round_seconds: int
    day_seconds: int | None
    d: int
    rounds: tuple[TruthRound, ...]

    def select(self, query: TruthQuery) -> dict[str, Any]:
        """The ``/truth`` answer (module docs) for ``query``."""
        for j in query.dims:
            if not 0 <= j < self.d:
                raise TruthError(f"dims: no dimension {j} (the truth has {self.d})")
        rows = [
            [
                x.round,
                x.start,
                x.end,
                x.n,
                [x.mean[j] for j in query.dims],
                [x.freq[j] for j in query.dims],
            ]
            for x in self.rounds
            if query.start < x.end <= query.end
        ]
        return {
            "simulation_only": True,
            "note": TRUTH_NOTE,
            "round_seconds": self.round_seconds,
            "day_seconds": self.day_seconds,
            "dims": list(query.dims),
            "columns": ["round", "start", "end", "n", "mean", "freq"],
            "rows": rows,
        }


def parse_truth(doc: Any) -> TruthTable:
    """The rounds of a ground-truth document (``coco fleet --ground-truth``), or a
    :class:`TruthError` naming what is wrong with it."""
    if not isinstance(doc, dict) or doc.get("simulation_only") is not True:
        raise TruthError("not a ground-truth document of a simulated fleet")
    round_seconds = _int(doc.get("round_seconds"), "round_seconds", 1)
    day = doc.get("day_seconds")
    day_seconds = None if day is None else _int(day, "day_seconds", 1)
    entries = doc.get("rounds")
    if not isinstance(entries, list):
        raise TruthError("the document has no list of rounds")
    if len(entries) > MAX_TRUTH_ROUNDS:
        raise TruthError(f"more than {MAX_TRUTH_ROUNDS} rounds")
    d: int | None = None
    rounds: list[TruthRound] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise TruthError("every round must be an object")
        mean = entry.get("mean")
        if d is None:
            d = len(mean) if isinstance(mean, list) and mean else 0
            if d < 1:
                raise TruthError("every round's mean must be a list of >= 1 values")
        r = _int(entry.get("round"), "round", 0)
        rounds.append(
            TruthRound(
                round=r,
                start=r * round_seconds,
                end=(r + 1) * round_seconds,
                n=_int(entry.get("n"), "n", 0),
                mean=_values(entry, "mean", d),
                freq=_values(entry, "freq", d),
            )
        )
    rounds.sort(key=lambda x: x.round)
    if any(a.round == b.round for a, b in itertools.pairwise(rounds)):
        raise TruthError("a round appears twice")
    if d is None:
        spec = doc.get("spec")
        d = _int(spec.get("d") if isinstance(spec, dict) else None, "spec d", 1)
    return TruthTable(round_seconds, day_seconds, d, tuple(rounds))


def _seconds(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TruthError(f"{name}: not a number of Unix seconds: {text[:40]!r}") from None
    if not math.isfinite(value):
        raise TruthError(f"{name}: not a finite number: {text[:40]!r}")
    return value


def parse_query(query: str, *, now: float, d: int) -> TruthQuery:
    """``from`` (default 0), ``to`` (default ``now``) and ``dims`` (comma-separated
    indices, default all ``d``) of a query string, as ``/series`` reads them; a
    :class:`TruthError` for a malformed one, ``from > to``, a dimension not below ``d``
    or an unknown parameter."""
    try:
        params = parse_qs(query, keep_blank_values=True, strict_parsing=False)
    except ValueError:
        raise TruthError("malformed query") from None
    unknown = sorted(set(params) - {"from", "to", "dims"})
    if unknown:
        raise TruthError(f"unknown parameter {unknown[0][:40]!r} (from, to, dims)")
    if any(len(v) > 1 for v in params.values()):
        raise TruthError("a parameter is given twice")
    start = _seconds(params["from"][0], "from") if "from" in params else 0.0
    end = _seconds(params["to"][0], "to") if "to" in params else now
    if start > end:
        raise TruthError(f"from {start:g} is after to {end:g}")
    if "dims" not in params:
        return TruthQuery(start, end, tuple(range(d)))
    dims: list[int] = []
    for part in params["dims"][0].split(","):
        if not part.isdigit() or len(part) > 7:
            raise TruthError(f"dims: not a dimension index: {part[:40]!r}")
        j = int(part)
        if j >= d:
            raise TruthError(f"dims: no dimension {j} (the truth has {d})")
        dims.append(j)
    return TruthQuery(start, end, tuple(dims))
