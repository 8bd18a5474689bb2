"""The cost of a ``/series`` query: a week of 60-second rounds at ``d = 64`` (10,080 rows).

Fills a :class:`~aggregator.series.core.Series` with one batch per round (random sums of
1,000 reports), then times what the service does for ``GET /series``: the copy of the rows
the event loop hands over (:meth:`Frame.of`), and the answer written from the HTTP thread
(:func:`series_json`, :func:`series_csv`: estimates of every row at once, then the text),
for a few dimensions, every dimension, and steps of an hour; and, for comparison, each
row's own ``estimate()``. Timed with :func:`time.perf_counter`, the median of
``--repeat`` runs.

Run from the repository root::

    .venv/bin/python bench/bench_series_query.py [--rounds 10080] [--d 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from aggregator.estimation.estimators import AggregateState
from aggregator.series.core import Series
from aggregator.series.documents import series_csv, series_json
from aggregator.series.frame import Frame
from aggregator.series.windows import SeriesQuery
from edge.spec import MechanismSpec

R = 60


def timed(repeat: int, work: Callable[[], int]) -> tuple[float, int]:
    """Median seconds of ``work()`` and the size it returned."""
    times, size = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        size = work()
        times.append(time.perf_counter() - start)
    return statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7 * 24 * 60)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spec = MechanismSpec(mechanism="coco", d=args.d, s=8, epsilon=1.0)
    rng = np.random.default_rng(0)
    series = Series(spec, round_seconds=R, retention=10**9)
    first = 1_700_000_000 // R
    for r in range(first, first + args.rounds):
        state = AggregateState(spec)
        state.n = 1000
        state.sum_u = rng.integers(-300, 300, size=spec.d)
        state.sum_v = rng.integers(0, 2000, size=spec.d)
        series.add(r, state, batch_size=1000)
    rows = series.rows()
    seconds, _ = timed(args.repeat, lambda: len(Frame.of(series.rows(), spec.d)))
    print(f"{len(rows)} rows, d = {spec.d}: copy on the event loop {seconds * 1000:.0f} ms")
    frame = Frame.of(rows, spec.d)
    for label, dims, step in (
        ("4 dims", tuple(range(4)), None),
        (f"{spec.d} dims", tuple(range(spec.d)), None),
        (f"{spec.d} dims, 1h steps", tuple(range(spec.d)), 3600),
    ):
        query = SeriesQuery(start=0, end=float("inf"), step=step, dims=dims)

        def as_json(query: SeriesQuery = query) -> int:
            pieces = series_json(spec, frame, query, round_seconds=R, confidence=0.95)
            return sum(len(piece) for piece in pieces)

        def as_csv(query: SeriesQuery = query) -> int:
            return sum(len(line) for line in series_csv(spec, frame, query, confidence=0.95))

        for form, work in (("json", as_json), ("csv", as_csv)):
            seconds, size = timed(args.repeat, work)
            print(f"  {label:>18} {form}: {seconds:6.2f} s, {size / 1e6:6.1f} MB")
    seconds, _ = timed(1, lambda: len([row.state.estimate() for row in rows]))
    print(f"  each row's own estimate(), for comparison: {seconds:.2f} s")


if __name__ == "__main__":
    main()
