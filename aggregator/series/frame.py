"""Rows of the series as one immutable block of arrays, to read outside the event loop.

A :class:`Frame` is a copy of some :class:`~aggregator.series.core.RoundRow`\\ s (taken
where the rows live, in ``O(rows x d)`` array copies) that any thread may then read, merge
per step and estimate without touching the live series: the rows' sums are integers, so a
step or a window merged here is exactly :func:`~aggregator.series.core.step_rows` or
:func:`~aggregator.series.core.merge_rows` of the same rows (tests/aggregator/
test_series_documents.py), and :func:`~aggregator.estimation.estimators.estimate_rows`
estimates every row at once, bit for bit as each row's own ``estimate()``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from aggregator.estimation.estimators import AggregateState
from aggregator.series.core import RoundRow
from edge.spec import MechanismSpec

__all__ = ["Frame", "WindowSums"]

I64 = NDArray[np.int64]
_NONE = np.iinfo(np.int64).max
"""``smallest`` of a row with no batch size: above every real size, so ``min`` skips it."""


@dataclass(frozen=True, kw_only=True)
class Frame:
    """Rows by start time: one entry per row in each 1-D array, one line in ``sum_u`` and
    ``sum_v`` (``(rows, d)``). ``smallest`` holds :data:`_NONE` for a row of no size."""

    round: I64
    start: I64
    end: I64
    rounds: I64
    n: I64
    batches: I64
    smallest: I64
    sum_u: I64
    sum_v: I64

    @classmethod
    def of(cls, rows: Sequence[RoundRow], d: int) -> Frame:
        """A copy of ``rows`` (of a spec with ``d`` dimensions)."""

        def column(values: list[int]) -> I64:
            return np.array(values, dtype=np.int64)

        def sums(name: str) -> I64:
            if not rows:
                return np.zeros((0, d), dtype=np.int64)
            return np.stack([getattr(row.state, name) for row in rows]).astype(np.int64)

        return cls(
            round=column([row.round for row in rows]),
            start=column([row.start for row in rows]),
            end=column([row.end for row in rows]),
            rounds=column([row.rounds for row in rows]),
            n=column([row.state.n for row in rows]),
            batches=column([row.batches for row in rows]),
            smallest=column(
                [_NONE if row.smallest_release is None else row.smallest_release for row in rows]
            ),
            sum_u=sums("sum_u"),
            sum_v=sums("sum_v"),
        )

    def __len__(self) -> int:
        return int(self.n.size)

    def smallest_release(self, i: int) -> int | None:
        value = int(self.smallest[i])
        return None if value == _NONE else value

    def stepped(self, step: int) -> Frame:
        """The rows merged per aligned step of ``step`` seconds (a row goes to the step its
        start lies in): :func:`~aggregator.series.core.step_rows`, on arrays."""
        if step < 1:
            raise ValueError(f"step must be >= 1 second, got {step}")
        if not len(self):
            return self
        begin = (self.start // step) * step
        order = np.argsort(begin, kind="stable")
        begin = begin[order]
        cuts = np.flatnonzero(np.r_[True, begin[1:] != begin[:-1]])
        first = begin[cuts]

        def add(values: I64) -> I64:
            return np.add.reduceat(values[order], cuts, axis=0)

        def low(values: I64) -> I64:
            return np.minimum.reduceat(values[order], cuts, axis=0)

        return Frame(
            round=low(self.round),
            start=first,
            end=first + step,
            rounds=add(self.rounds),
            n=add(self.n),
            batches=add(self.batches),
            smallest=low(self.smallest),
            sum_u=add(self.sum_u),
            sum_v=add(self.sum_v),
        )

    def sums(self) -> WindowSums:
        """Every row merged: a window (:func:`~aggregator.series.core.merge_rows`)."""
        d = self.sum_u.shape[1]
        sizes: Counter[int] = Counter()
        for size, rounds in zip(self.smallest.tolist(), self.rounds.tolist(), strict=True):
            if size != _NONE and rounds > 0:
                sizes[size] += rounds
        smallest = int(self.smallest.min()) if len(self) else _NONE
        latest = self.smallest_release(int(np.argmax(self.start))) if len(self) else None
        return WindowSums(
            rows=len(self),
            rounds=int(self.rounds.sum()),
            n=int(self.n.sum()),
            batches=int(self.batches.sum()),
            smallest=None if smallest == _NONE else smallest,
            latest=latest,
            sizes=tuple(sorted(sizes.items())),
            sum_u=self.sum_u.sum(axis=0, dtype=np.int64) if len(self) else np.zeros(d, np.int64),
            sum_v=self.sum_v.sum(axis=0, dtype=np.int64) if len(self) else np.zeros(d, np.int64),
            start=int(self.start.min()) if len(self) else None,
            end=int(self.end.max()) if len(self) else None,
        )


@dataclass(frozen=True, kw_only=True)
class WindowSums:
    """A window's rows merged, and what its privacy level is composed of."""

    rows: int
    rounds: int
    n: int
    batches: int
    smallest: int | None
    """The smallest release in the window."""
    latest: int | None
    """The newest row's smallest release."""
    sizes: tuple[tuple[int, int], ...]
    """``(release size, rounds)``, sorted: each round of the window is one participation of a
    device present in every round, at its smallest release (a coarse row's rounds each at
    the row's smallest: pessimistic)."""
    sum_u: I64
    sum_v: I64
    start: int | None
    end: int | None

    def state(self, spec: MechanismSpec) -> AggregateState:
        return AggregateState.of(spec, n=self.n, sum_u=self.sum_u, sum_v=self.sum_v)
