"""What a reader may ask of the series: durations, windows and ``/series`` queries, checked.

Every malformed value is refused with a :class:`QueryError`: one line naming the parameter
and what is wrong with it (the service answers it as an HTTP 400, counted; the command
line prints it). Nothing here reads a clock: ``now`` is given.

* A duration is a whole number of seconds with an optional unit, ``90s``, ``15m``, ``1h``,
  ``24h``, ``7d`` (``3600`` alone is seconds), from 1 second to :data:`MAX_SECONDS`.
* A window is a duration (the rows whose end lies in ``(now - W, now]``) or ``rK``, the
  ``K`` newest rounds with data (1 to :data:`MAX_WINDOW_ROUNDS`).
* A ``/series`` query: ``from`` and ``to`` in Unix seconds (default ``0`` and ``now``; the
  rows whose end lies in ``(from, to]``), ``step`` (``round`` or a duration), ``dims``
  (comma-separated indices, default every dimension), ``format`` (``json`` or ``csv``).

Cost bound
----------
A query's cost is its output: every row carries the estimates of every dimension asked,
about 220 bytes of JSON (110 of CSV) per row and dimension. :func:`check_cells` refuses a
query of more than :data:`MAX_CELLS` rows x dimensions (1,048,576: a week of 60-second
rounds at ``d = 64``, 645,120 cells, fits; a narrower ``dims``, a shorter range or a
coarser ``step`` brings a larger one within it). The rows a step merges cost ``O(d)`` each
and are bounded by the series' retention.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from edge.durations import seconds_of

__all__ = [
    "MAX_CELLS",
    "MAX_DIMS_TEXT",
    "MAX_SECONDS",
    "MAX_WINDOWS",
    "MAX_WINDOW_ROUNDS",
    "QueryError",
    "SeriesQuery",
    "Window",
    "check_cells",
    "parse_dims",
    "parse_duration",
    "parse_series_query",
    "parse_window",
    "parse_windows",
]

MAX_SECONDS = 10 * 366 * 86400
"""The longest duration: ten years."""
MAX_WINDOW_ROUNDS = 1_000_000
"""The most rounds an ``rK`` window may ask for."""
MAX_WINDOWS = 8
"""The most windows ``coco aggregator run --window`` exports as gauges."""
MAX_CELLS = 1 << 20
"""The most rows x dimensions one ``/series`` answer holds (module docs, *Cost bound*)."""
MAX_DIMS_TEXT = 20_000
"""The longest ``dims`` value read (longer is refused before it is split)."""
PARAMETERS = ("from", "to", "step", "dims", "format")
"""The parameters of ``/series``; any other is refused."""

_ROUNDS = re.compile(r"r([0-9]{1,12})")


class QueryError(ValueError):
    """A malformed query: one line, fit for an HTTP 400 body."""


def _show(text: str) -> str:
    """``text`` quoted for an error line: printable ASCII only, at most 40 characters."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in text[:40])
    return repr(clean) + ("..." if len(text) > 40 else "")


def parse_duration(text: str, *, name: str = "duration") -> int:
    """Seconds of ``90s``, ``15m``, ``1h``, ``7d`` or ``3600`` (module docs)."""
    seconds = seconds_of(text)
    if seconds is None:
        raise QueryError(
            f"{name} {_show(text)} is not a duration (a whole number with s, m, h or d, "
            "e.g. 90s, 15m, 1h, 7d)"
        )
    if not 1 <= seconds <= MAX_SECONDS:
        raise QueryError(f"{name} {_show(text)} must be between 1 second and 10 years")
    return seconds


@dataclass(frozen=True)
class Window:
    """A window as asked (``spec``, e.g. ``1h`` or ``r10``): ``seconds`` or ``rounds``."""

    spec: str
    seconds: int | None = None
    rounds: int | None = None


def parse_window(text: str) -> Window:
    """``rK`` (the ``K`` newest rounds with data) or a duration; :class:`QueryError`."""
    spec = text.strip()
    match = _ROUNDS.fullmatch(spec)
    if match is not None:
        rounds = int(match.group(1))
        if not 1 <= rounds <= MAX_WINDOW_ROUNDS:
            raise QueryError(f"window {_show(text)} must hold 1 to {MAX_WINDOW_ROUNDS} rounds")
        return Window(spec, rounds=rounds)
    if spec.startswith("r"):
        raise QueryError(f"window {_show(text)} is not rK (K rounds, e.g. r10)")
    return Window(spec, seconds=parse_duration(spec, name="window"))


def parse_windows(texts: Sequence[str]) -> tuple[Window, ...]:
    """The configured windows (``--window``): at most :data:`MAX_WINDOWS`, none twice."""
    if len(texts) > MAX_WINDOWS:
        raise QueryError(f"at most {MAX_WINDOWS} windows, got {len(texts)}")
    windows = tuple(parse_window(text) for text in texts)
    specs = [window.spec for window in windows]
    for spec in specs:
        if specs.count(spec) > 1:
            raise QueryError(f"window {spec} is given twice")
    return windows


def _parse_time(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise QueryError(f"{name} {_show(text)} is not a number of Unix seconds") from None
    if not math.isfinite(value) or value < 0:
        raise QueryError(f"{name} {_show(text)} must be finite Unix seconds >= 0")
    return value


def parse_dims(text: str | None, d: int) -> tuple[int, ...]:
    """``0,3,5`` (in that order, none twice), each in ``[0, d)``; ``None``: every one."""
    if text is None:
        return tuple(range(d))
    if len(text) > MAX_DIMS_TEXT:
        raise QueryError(f"dims is longer than {MAX_DIMS_TEXT} characters")
    dims: list[int] = []
    for part in text.split(","):
        item = part.strip()
        if not item.isdigit() or len(item) > 9:
            raise QueryError(f"dims {_show(text)}: {_show(part)} is not a dimension index")
        j = int(item)
        if j >= d:
            raise QueryError(f"unknown dimension {j}: the spec has d = {d} (0..{d - 1})")
        if j in dims:
            raise QueryError(f"dimension {j} is given twice in dims")
        dims.append(j)
    return tuple(dims)


@dataclass(frozen=True, kw_only=True)
class SeriesQuery:
    """A checked ``/series`` query: rows whose end lies in ``(start, end]``."""

    start: float
    end: float
    step: int | None
    """Seconds of a step, ``None`` for one row per round."""
    dims: tuple[int, ...]
    format: Literal["json", "csv"] = "json"


def _one(params: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = params.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise QueryError(f"{name} is given {len(values)} times")
    return values[0]


def parse_series_query(params: Mapping[str, Sequence[str]], *, d: int, now: float) -> SeriesQuery:
    """The ``/series`` query of ``params`` (``urllib.parse.parse_qs`` of the query string,
    with blank values kept); :class:`QueryError` for any malformed or unknown one."""
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise QueryError(
            f"unknown parameter {_show(unknown[0])}: /series takes {', '.join(PARAMETERS)}"
        )
    start_text, end_text = _one(params, "from"), _one(params, "to")
    start = 0.0 if start_text is None else _parse_time(start_text, "from")
    end = now if end_text is None else _parse_time(end_text, "to")
    if start > end:
        raise QueryError(f"from ({start:g}) is after to ({end:g})")
    step_text = _one(params, "step")
    step = (
        None
        if step_text is None or step_text.strip() == "round"
        else parse_duration(step_text, name="step")
    )
    dims = parse_dims(_one(params, "dims"), d)
    form = _one(params, "format") or "json"
    if form == "csv":
        return SeriesQuery(start=start, end=end, step=step, dims=dims, format="csv")
    if form != "json":
        raise QueryError(f"format {_show(form)} is not json or csv")
    return SeriesQuery(start=start, end=end, step=step, dims=dims)


def check_cells(rows: int, dims: int) -> None:
    """Refuse an answer of more than :data:`MAX_CELLS` rows x dimensions."""
    if rows * dims > MAX_CELLS:
        raise QueryError(
            f"{rows} rows x {dims} dimensions is more than {MAX_CELLS} values: ask for fewer "
            "dims, a shorter from..to or a coarser step"
        )
