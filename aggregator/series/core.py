"""The per-round series: each round's own estimate, windows as merges, and their persistence.

Rows
----
The reports released for a round (batches carry the round of their release: a report the
shuffler carried over, or one that reached it late, counts in the round that released it) are
that round's own sample. Since the estimators are integer sums
(:class:`~aggregator.estimation.estimators.AggregateState`), each round keeps its own sums
and the estimate of any set of rounds is the estimate of the merge of their sums: a window's
estimate is exactly the estimate of one pass over its reports, in any order.

A row is keyed by its interval of Unix time ``[start, end)``, not by its round number, so
that rows of different round lengths (a change of ``round_seconds``) never mix. Besides its
sums, a row keeps its number of batches and its smallest batch (a round's privacy level
is its smallest release's).

Retention
---------
Rows whose end is older than ``retention`` seconds are rolled up into coarse rows of ``step``
seconds (aligned on multiples of ``step``), kept for ``coarse_retention`` seconds; ``step``
``None`` drops them instead. Memory: a row is two ``int64`` vectors of ``d`` and a few
integers, ``16 d + ~700`` bytes with Python's overheads (bench/bench_series.py measures it).

Persistence
-----------
What changed since the last checkpoint leaves as :class:`Delta` records, each with a
sequence number: :meth:`Series.take` freezes the changes (taken with the checkpoint's
content, with no await between), the service appends them to the series file before the
checkpoint that records their last sequence number, and :meth:`Series.committed` forgets
them once that checkpoint is durable. A failed write leaves them pending: the next
:meth:`Series.take` returns them again, with what came since. Replaying the committed
records of the file (:meth:`Series.replay`) and redelivering what the checkpoint did not
acknowledge gives the same rows as an uninterrupted run.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from aggregator.estimation.estimators import AggregateState
from edge.spec import MechanismSpec

__all__ = ["Delta", "RoundRow", "Series", "compact_records", "merge_rows", "step_rows"]

I64 = NDArray[np.int64]


@dataclass(kw_only=True)
class RoundRow:
    """One round (``rounds == 1``) or one coarse step of rolled-up rounds."""

    round: int
    """The round number (of a coarse row: its first round)."""
    start: int
    end: int
    state: AggregateState
    batches: int = 0
    smallest_release: int | None = None
    rounds: int = 1
    """How many rounds the row holds (more than one for a coarse or step row)."""

    @property
    def key(self) -> tuple[int, int]:
        return (self.start, self.end)

    def fold(self, state: AggregateState, *, batches: int, smallest: int | None) -> None:
        self.state.merge(state)
        self.batches += batches
        if smallest is not None:
            self.smallest_release = (
                smallest if self.smallest_release is None else min(self.smallest_release, smallest)
            )


@dataclass(frozen=True, kw_only=True)
class Delta:
    """What a row gained between two checkpoints (or a whole row, in a compacted file)."""

    seq: int
    coarse: bool
    """A rolled-up row (``start``/``end`` a step), not a round."""
    round: int
    start: int
    end: int
    n: int
    sum_u: I64
    sum_v: I64
    batches: int
    smallest: int | None
    rounds: int = 1

    def state(self, spec: MechanismSpec) -> AggregateState:
        return AggregateState.of(spec, n=self.n, sum_u=self.sum_u, sum_v=self.sum_v)


class Series:
    """The rows of one deployment (module docs)."""

    def __init__(
        self,
        spec: MechanismSpec,
        *,
        round_seconds: int,
        retention: float,
        step: int | None = 3600,
        coarse_retention: float = 0.0,
    ) -> None:
        if round_seconds < 1:
            raise ValueError(f"round_seconds must be >= 1, got {round_seconds}")
        if not retention > 0:
            raise ValueError(f"retention must be > 0 seconds, got {retention}")
        if step is not None and step < 1:
            raise ValueError(f"step must be >= 1 second, got {step}")
        self.spec = spec
        self.round_seconds = round_seconds
        self.retention = float(retention)
        self.step = step
        self.coarse_retention = float(coarse_retention)
        self._rows: dict[tuple[int, int], RoundRow] = {}
        self._keys: list[tuple[int, int]] = []
        self._coarse: dict[tuple[int, int], RoundRow] = {}
        self._coarse_keys: list[tuple[int, int]] = []
        self._open: dict[tuple[bool, int, int], Delta] = {}
        self._pending: list[Delta] = []
        self.seq = 0
        """The sequence number of the newest delta taken (or replayed)."""
        self.rolled_before = -math.inf
        """Rows that ended before this time are rolled up (:meth:`expire`)."""

    # -- changes ---------------------------------------------------------------------------

    def add(
        self,
        round_: int,
        partial: AggregateState,
        *,
        batch_size: int,
        round_seconds: int | None = None,
    ) -> None:
        """One applied batch of ``round_`` (its sums ``partial``, its size), a round of
        ``round_seconds`` (default: the series' own): its row is
        ``[round_ * round_seconds, (round_ + 1) * round_seconds)``."""
        length = self.round_seconds if round_seconds is None else round_seconds
        start = round_ * length
        delta = Delta(
            seq=0,
            coarse=False,
            round=round_,
            start=start,
            end=start + length,
            n=partial.n,
            sum_u=partial.sum_u.copy(),
            sum_v=partial.sum_v.copy(),
            batches=1,
            smallest=batch_size,
        )
        self._fold(delta)
        key = (False, delta.start, delta.end)
        old = self._open.get(key)
        self._open[key] = delta if old is None else _sum(old, delta, key)

    def _fold(self, delta: Delta) -> None:
        state = delta.state(self.spec)
        if not delta.coarse and delta.end <= self.rolled_before:
            # a round already rolled up (a late batch): into its step, not counted as a
            # round of it again (a replay that expires afterwards counts it once too)
            self._fold_coarse(replace(delta, rounds=0), state)
            return
        rows, keys = (self._coarse, self._coarse_keys) if delta.coarse else (self._rows, self._keys)
        key = (delta.start, delta.end)
        row = rows.get(key)
        if row is None:
            row = RoundRow(
                round=delta.round,
                start=delta.start,
                end=delta.end,
                state=AggregateState(self.spec),
                rounds=0,
            )
            rows[key] = row
            bisect.insort(keys, key)
        row.fold(state, batches=delta.batches, smallest=delta.smallest)
        row.round = min(row.round, delta.round)
        row.rounds = row.rounds + delta.rounds if delta.coarse else 1

    def _fold_coarse(self, row: Delta | RoundRow, state: AggregateState) -> None:
        """``row`` (a round, rolled up) into its step's coarse row."""
        if self.step is None:
            return
        begin = (row.start // self.step) * self.step
        key = (begin, begin + self.step)
        coarse = self._coarse.get(key)
        if coarse is None:
            coarse = RoundRow(
                round=row.round,
                start=begin,
                end=begin + self.step,
                state=AggregateState(self.spec),
                rounds=0,
            )
            self._coarse[key] = coarse
            bisect.insort(self._coarse_keys, key)
        smallest = row.smallest if isinstance(row, Delta) else row.smallest_release
        coarse.fold(state, batches=row.batches, smallest=smallest)
        coarse.round = min(coarse.round, row.round)
        coarse.rounds += row.rounds

    # -- persistence -----------------------------------------------------------------------

    def take(self) -> list[Delta]:
        """Every change not yet committed, oldest first, each with its sequence number: the
        ones a failed write left pending, then the ones since the last :meth:`take`."""
        for delta in self._open.values():
            self.seq += 1
            self._pending.append(replace(delta, seq=self.seq))
        self._open.clear()
        return list(self._pending)

    def committed(self, seq: int) -> None:
        """The checkpoint recording ``seq`` is durable: forget the deltas up to it."""
        self._pending = [delta for delta in self._pending if delta.seq > seq]

    @property
    def pending(self) -> int:
        """Deltas taken but not yet committed."""
        return len(self._pending)

    def replay(self, deltas: Iterable[Delta]) -> None:
        """Fold the committed records of the series file (a fresh series, at start)."""
        for delta in deltas:
            if delta.sum_u.shape != (self.spec.d,) or delta.sum_v.shape != (self.spec.d,):
                raise ValueError(f"record {delta.seq} is for another dimension")
            self._fold(delta)
            self.seq = max(self.seq, delta.seq)

    # -- retention -------------------------------------------------------------------------

    def expire(self, now: float) -> int:
        """Roll the rows that ended more than ``retention`` before ``now`` into their steps,
        and drop the coarse rows that ended more than ``coarse_retention`` before; the number
        of rows moved or dropped. (Not a change to persist: replaying the file and
        expiring at the same time gives the same rows.)"""
        boundary = now - self.retention
        moved = 0
        if boundary > self.rolled_before:
            self.rolled_before = boundary
            cut = bisect.bisect_left(self._keys, (math.floor(boundary) + 1, -(2**62)))
            # rows are sorted by start; a row rolls when its end is at or before the boundary
            done: list[tuple[int, int]] = [k for k in self._keys[:cut] if k[1] <= boundary]
            for key in done:
                row = self._rows.pop(key)
                self._fold_coarse(row, row.state)
                moved += 1
            if done:
                gone = set(done)
                self._keys = [k for k in self._keys if k not in gone]
        coarse_boundary = now - self.retention - self.coarse_retention
        dropped = [k for k in self._coarse_keys if k[1] <= coarse_boundary]
        for key in dropped:
            del self._coarse[key]
            moved += 1
        if dropped:
            self._coarse_keys = self._coarse_keys[len(dropped) :]
        return moved

    # -- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._rows) + len(self._coarse)

    def rows(self, start: float = -math.inf, end: float = math.inf) -> list[RoundRow]:
        """Coarse rows, then round rows, whose end lies in ``(start, end]``, by start time."""
        coarse = [self._coarse[k] for k in self._coarse_keys if start < k[1] <= end]
        fine = [self._rows[k] for k in self._keys if start < k[1] <= end]
        return sorted(coarse + fine, key=lambda row: row.key)

    def newest(self, rounds: int) -> list[RoundRow]:
        """The ``rounds`` newest round rows (with data), by start time."""
        if rounds < 1:
            raise ValueError(f"a window holds at least one round, got {rounds}")
        return [self._rows[k] for k in self._keys[-rounds:]]

    def memory_bytes(self) -> int:
        """The bytes the rows' sums hold (``16 d`` each): what grows with retention."""
        return len(self) * 16 * self.spec.d


def merge_rows(spec: MechanismSpec, rows: Sequence[RoundRow]) -> RoundRow | None:
    """One row holding every row of ``rows`` (``None`` for none): a window."""
    if not rows:
        return None
    state = AggregateState(spec)
    merged = RoundRow(
        round=min(row.round for row in rows),
        start=min(row.start for row in rows),
        end=max(row.end for row in rows),
        state=state,
        rounds=0,
    )
    for row in rows:
        merged.fold(row.state, batches=row.batches, smallest=row.smallest_release)
        merged.rounds += row.rounds
    return merged


def step_rows(spec: MechanismSpec, rows: Sequence[RoundRow], step: int) -> list[RoundRow]:
    """``rows`` merged per aligned step of ``step`` seconds (a row goes to the step its start
    lies in), by start time."""
    if step < 1:
        raise ValueError(f"step must be >= 1 second, got {step}")
    groups: dict[int, list[RoundRow]] = {}
    for row in rows:
        groups.setdefault((row.start // step) * step, []).append(row)
    out: list[RoundRow] = []
    for begin in sorted(groups):
        merged = merge_rows(spec, groups[begin])
        assert merged is not None
        merged.start, merged.end = begin, begin + step
        out.append(merged)
    return out


def compact_records(
    deltas: Iterable[Delta], *, rolled_before: float, step: int | None
) -> list[Delta]:
    """The records of a series file merged: one per row, the rounds that ended at or before
    ``rolled_before`` rolled into their ``step`` (dropped if ``step`` is ``None``), as
    :meth:`Series.expire` does in memory. Each merged record keeps the largest sequence number
    of its sources, and the output is ordered by it, so that a file of compacted committed
    records is still cut at a checkpoint's sequence number (everything in it is committed).
    Replaying the output gives the same rows as replaying the input and expiring at
    ``rolled_before``."""
    rows: dict[tuple[bool, int, int], Delta] = {}
    for delta in deltas:  # one record per row first, so that a round counts once in its step
        key = (delta.coarse, delta.start, delta.end)
        rows[key] = delta if key not in rows else _sum(rows[key], delta, key)
    merged: dict[tuple[bool, int, int], Delta] = {}
    for delta in rows.values():
        key = (delta.coarse, delta.start, delta.end)
        if not delta.coarse and delta.end <= rolled_before:
            if step is None:
                continue
            begin = (delta.start // step) * step
            key = (True, begin, begin + step)
        merged[key] = _sum(merged[key], delta, key) if key in merged else _moved(delta, key)
    return sorted(merged.values(), key=lambda d: (d.seq, d.coarse, d.start, d.end))


def _moved(delta: Delta, key: tuple[bool, int, int]) -> Delta:
    coarse, start, end = key
    return Delta(
        seq=delta.seq,
        coarse=coarse,
        round=delta.round,
        start=start,
        end=end,
        n=delta.n,
        sum_u=delta.sum_u.copy(),
        sum_v=delta.sum_v.copy(),
        batches=delta.batches,
        smallest=delta.smallest,
        rounds=delta.rounds,
    )


def _sum(old: Delta, delta: Delta, key: tuple[bool, int, int]) -> Delta:
    """``old`` and ``delta`` as one record of row ``key``: a round's records are one round,
    a coarse row's rounds add up."""
    coarse, start, end = key
    return Delta(
        seq=max(old.seq, delta.seq),
        coarse=coarse,
        round=min(old.round, delta.round),
        start=start,
        end=end,
        n=old.n + delta.n,
        sum_u=old.sum_u + delta.sum_u,
        sum_v=old.sum_v + delta.sum_v,
        batches=old.batches + delta.batches,
        smallest=_min(old.smallest, delta.smallest),
        rounds=old.rounds + delta.rounds if coarse else 1,
    )


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
