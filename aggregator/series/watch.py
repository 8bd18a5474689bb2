"""The change detector kept over a live series, a function of its rows (pure, no I/O).

:class:`ChangeWatch` runs :class:`~aggregator.series.detector.ChangeDetector` on the round
rows of a :class:`~aggregator.series.core.Series` for a bounded set of channels, and keeps
its state *derivable from the rows*: at any time ``now`` it equals a fresh detector fed,
in time order, the rows that

- are round rows of the series' round length (not rolled-up steps),
- have *settled*: ended at least ``settle`` seconds before ``now`` (a round's batches come
  after its end, each shard's on its own; a row is charted once they are in), and
- start at or after the *anchor*: the first cycle boundary (a multiple of the cycle) at or
  after ``now - retention``. Rows after it are all still retained, so after a restart the
  recovered series gives the same rows, and the same detector: the state never needs a file
  of its own.

Cost. Each call compares the rows it would chart with the ones it has charted (their
start, batches and reports; ``O(rows)`` tuple comparisons), then folds the new settled rows
alone (``O(new rows x dims)``). It starts over from the anchor's rows only when that
comparison fails: a batch came for a row already charted (a late or redelivered one), or
the anchor moved, which happens once per cycle once the retention is full. A start over
estimates every row at once (:func:`~aggregator.estimation.estimators.estimate_rows`) and
folds them one by one; bench/bench_change_watch.py measures both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from aggregator.estimation.estimators import estimate_rows
from aggregator.series.core import RoundRow, Series
from aggregator.series.detector import ChangeDetector, DetectorConfig, Observation

__all__ = ["ChangeWatch", "cycle_rounds"]

F64 = NDArray[np.float64]
RowKey = tuple[int, int, int]
"""``(start, batches, n)`` of a charted row: any batch folded into it changes it."""


def cycle_rounds(cycle_seconds: float, round_seconds: int) -> int:
    """Rounds per cycle; :class:`ValueError` unless the cycle is a whole number (>= 2) of
    rounds (the detector compares a round with the same round of earlier cycles)."""
    rounds = cycle_seconds / round_seconds
    if not (math.isfinite(rounds) and rounds >= 2 and rounds == round(rounds)):
        raise ValueError(
            f"the cycle ({cycle_seconds:g} s) must be a whole number (>= 2) of rounds of "
            f"{round_seconds} s"
        )
    return round(rounds)


class ChangeWatch:
    """The detector of ``config`` on the channels ``dims`` of ``series`` (module docs)."""

    def __init__(
        self,
        series: Series,
        dims: Sequence[int],
        config: DetectorConfig,
        *,
        confidence: float,
        settle: float | None = None,
    ) -> None:
        cycle_rounds(config.period, series.round_seconds)
        if not dims:
            raise ValueError("the change watch needs at least one channel")
        self.series = series
        self.dims = list(dims)
        self.config = config
        self.confidence = confidence
        self.settle = float(series.round_seconds if settle is None else settle)
        self.anchor = -math.inf
        self.detector = ChangeDetector(config, len(self.dims))
        self.charted: list[RowKey] = []
        self.statistic: F64 = np.zeros(len(self.dims))
        self.alarm: NDArray[np.bool_] = np.zeros(len(self.dims), dtype=np.bool_)
        self.restarts = 0
        """How many times the detector started over (module docs, *Cost*)."""

    def anchor_at(self, now: float) -> float:
        """The first cycle boundary at or after ``now - retention``."""
        period = self.config.period
        return math.ceil((now - self.series.retention) / period) * period

    def due(self) -> float:
        """When the next row settles (an update then charts it): the end of the oldest
        round row after the charted ones and the anchor, plus ``settle`` (infinity for
        none)."""
        after = max(self.charted[-1][0] if self.charted else -math.inf, self.anchor - 1)
        for row in self.series.rows(after + self.series.round_seconds, math.inf):
            if row.start > after and self._charts(row):
                return row.end + self.settle
        return math.inf

    def _charts(self, row: RoundRow) -> bool:
        return row.rounds == 1 and row.end - row.start == self.series.round_seconds

    def update(self, now: float) -> bool:
        """Bring the detector up to ``now``; whether anything changed."""
        anchor = self.anchor_at(now)
        rows = [
            row
            for row in self.series.rows(anchor - 1, now - self.settle)
            if row.start >= anchor and self._charts(row)
        ]
        keys = [(row.start, row.batches, row.state.n) for row in rows]
        done = len(self.charted)
        if anchor == self.anchor and keys[:done] == self.charted:
            if len(keys) == done:
                return False
            self._fold(rows[done:], keys[done:])
            return True
        self.anchor = anchor
        self.detector = ChangeDetector(self.config, len(self.dims))
        self.charted = []
        self.statistic = np.zeros(len(self.dims))
        self.alarm = np.zeros(len(self.dims), dtype=np.bool_)
        self.restarts += 1
        self._fold(rows, keys)
        return True

    def _fold(self, rows: Sequence[RoundRow], keys: Sequence[RowKey]) -> None:
        if not rows:
            return
        n = np.array([row.state.n for row in rows], dtype=np.int64)
        sum_u = np.stack([row.state.sum_u[self.dims] for row in rows]).astype(np.int64)
        sum_v = np.stack([row.state.sum_v[self.dims] for row in rows]).astype(np.int64)
        fields = estimate_rows(self.series.spec, n, sum_u, sum_v, confidence=self.confidence)
        for i, row in enumerate(rows):
            result = self.detector.update(
                Observation(
                    start=float(row.start),
                    end=float(row.end),
                    n=int(n[i]),
                    mean=fields["mean"][i],
                    mean_se=fields["mean_se"][i],
                    freq=fields["freq"][i],
                )
            )
            self.statistic, self.alarm = result.statistic, result.alarm
        self.charted.extend(keys)
