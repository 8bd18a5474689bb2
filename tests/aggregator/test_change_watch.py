"""The change detector over a live series: always what a fresh detector computes from the
rows (so a restart, which recovers the rows, recomputes the same state), mostly by folding
only the rows that settled."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aggregator.series.core import Series
from aggregator.series.cusum import CusumDesign
from aggregator.series.detector import DetectorConfig
from aggregator.series.watch import ChangeWatch, cycle_rounds
from tests.aggregator.test_series_core import SPEC, batch

R = 10
CYCLE = 8 * R
DIMS = (0, 2, 5)
CONFIG = DetectorConfig(period=CYCLE, design=CusumDesign.for_arl(20.0), hold=3)


def state(watch: ChangeWatch) -> tuple[object, ...]:
    detector = watch.detector
    return (
        watch.anchor,
        watch.charted,
        watch.statistic.tolist(),
        watch.alarm.tolist(),
        detector.upper.tolist(),
        detector.lower.tolist(),
        detector.rows,
        detector.alarms.tolist(),
    )


@pytest.mark.parametrize("seed", range(4))
def test_the_watch_is_a_function_of_the_rows(seed: int) -> None:
    """Batches released at each round's end (a few shards), late batches for rows already
    charted, rows rolled up past the retention and updates at arbitrary times: after every
    update the watch equals a fresh one on the same series at the same time, and nearly
    every update only folds the settled rows."""
    rng = np.random.default_rng(seed)
    series = Series(SPEC, round_seconds=R, retention=3 * CYCLE, step=4 * R, coarse_retention=1e9)
    watch = ChangeWatch(series, DIMS, CONFIG, confidence=0.95)
    updates = late = 0
    for round_ in range(200):
        now = (round_ + 1) * R + rng.uniform(0, R)
        for _ in range(rng.integers(1, 4)):
            series.add(round_, batch(rng, 150), batch_size=150)
        if round_ > 3 and rng.random() < 0.05:
            series.add(round_ - 3, batch(rng, 150), batch_size=150)  # late: already charted
            late += 1
        if rng.random() < 0.5:
            series.expire(now)
        if rng.random() < 0.7:
            watch.update(now)
            updates += 1
            fresh = ChangeWatch(series, DIMS, CONFIG, confidence=0.95)
            fresh.update(now)
            assert state(watch) == state(fresh)
            assert watch.due() > now
    assert late > 0
    assert watch.detector.rows > CYCLE // R  # past learning
    # a start over per late batch charted, per anchor move (one per cycle once the
    # retention is full) and the first update; every other update folds new rows only
    cycles = 200 * R // CYCLE
    assert watch.restarts <= 1 + late + cycles
    assert watch.restarts < updates / 3


def test_only_settled_round_rows_after_the_anchor_are_charted() -> None:
    rng = np.random.default_rng(7)
    series = Series(SPEC, round_seconds=R, retention=2 * CYCLE, step=4 * R, coarse_retention=1e9)
    for round_ in range(40):
        series.add(round_, batch(rng, 100), batch_size=100)
    now = 40 * R + 3.0  # round 39 ended 3 s ago: not settled (settle = one round)
    series.expire(now)
    watch = ChangeWatch(series, DIMS, CONFIG, confidence=0.95)
    assert watch.update(now)
    anchor = math.ceil((now - 2 * CYCLE) / CYCLE) * CYCLE
    starts = [start for start, _, _ in watch.charted]
    assert starts == list(range(anchor, 39 * R, R))
    assert watch.due() == 40 * R + R  # round 39 settles one round after its end
    assert not watch.update(now)  # nothing new: no change


def test_the_cycle_must_be_whole_rounds() -> None:
    assert cycle_rounds(86_400, 60) == 1440
    for cycle in (86_400, 15):
        with pytest.raises(ValueError, match="whole number"):
            cycle_rounds(cycle, 7 if cycle == 86_400 else 10)
    with pytest.raises(ValueError, match="whole number"):
        cycle_rounds(10, 10)  # one round per cycle compares nothing with itself
