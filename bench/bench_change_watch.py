"""The cost of the change detector on the event loop: a week of 60-second rounds at
``d = 64``, the 16 exported dimensions charted (the default ``--metrics-dims``).

Fills a :class:`~aggregator.series.core.Series` with one batch per round (random sums of
1,000 reports) for ``--rounds`` rounds (a retention of that many, a day's cycle), then
times what a publication does with :class:`~aggregator.series.watch.ChangeWatch`: an
update with nothing new (the comparison of the charted rows alone), an update that charts
the round that just settled (the usual case, once per round), and a start over from the
anchor (the first update, a late batch for a charted round, and once per cycle when the
anchor moves). Timed with :func:`time.perf_counter`, the median of ``--repeat`` runs.

Run from the repository root::

    .venv/bin/python bench/bench_change_watch.py [--rounds 10080] [--d 64] [--dims 16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from aggregator.estimation.estimators import AggregateState
from aggregator.series.core import Series
from aggregator.series.detector import DetectorConfig
from aggregator.series.watch import ChangeWatch
from edge.spec import MechanismSpec

R = 60
DAY = 86_400


def timed(repeat: int, work: Callable[[], object]) -> float:
    """Median seconds of ``work()``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7 * 24 * 60)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--dims", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    spec = MechanismSpec(mechanism="coco", d=args.d, s=8, epsilon=1.0)
    rng = np.random.default_rng(0)
    first = 1_700_006_400 // DAY * DAY // R  # a day boundary: every retained row charted
    series = Series(spec, round_seconds=R, retention=args.rounds * R + 1)

    def add(r: int) -> None:
        state = AggregateState(spec)
        state.n = 1000
        state.sum_u = rng.integers(-300, 300, size=spec.d)
        state.sum_v = rng.integers(250, 2000, size=spec.d)
        series.add(r, state, batch_size=1000)

    for r in range(first, first + args.rounds):
        add(r)
    config = DetectorConfig(period=DAY)
    dims = list(range(args.dims))
    now = (first + args.rounds + 1) * R  # every row settled

    def start_over() -> ChangeWatch:
        watch = ChangeWatch(series, dims, config, confidence=0.95)
        watch.update(now)
        return watch

    full = timed(args.repeat, start_over)
    watch = start_over()
    charted = watch.detector.rows
    idle = timed(args.repeat, lambda: watch.update(now))
    steps = []
    for k in range(args.repeat):
        add(first + args.rounds + k)
        at = now + (k + 1) * R
        begin = time.perf_counter()
        assert watch.update(at)
        steps.append(time.perf_counter() - begin)
    step = statistics.median(steps)
    print(
        f"{args.rounds} rows of {R} s, d = {args.d}, {args.dims} dimensions charted "
        f"({charted} rows)"
    )
    print(f"  update, nothing new:     {idle * 1e3:8.1f} ms")
    print(f"  update, one round new:   {step * 1e3:8.1f} ms")
    print(f"  start over (all rows):   {full * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
