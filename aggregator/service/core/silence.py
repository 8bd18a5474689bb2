"""Which trusted shard of the layout in force has gone silent (no I/O).

A sharded deployment whose shard's shuffler never started (or stopped) loses every report of
that shard's devices, acknowledged or not, and no batch of its topic ever shows it. The
other shards keep releasing, so the loss shows as one shard falling behind them.

:class:`SilenceWatch` is told of every release the aggregator accepts (an applied batch or
an accepted manifest, by shard and round). For each shard of the *layout in force* (the
layout of the newest round released) it counts the rounds, of those in which some shard
of the layout released, that came after that shard's last release: its *silent rounds*.
Only rounds in which another shard spoke count, so an idle fleet (no shard releasing)
never reads as silent, and a round the others released a little earlier than this shard
counts one round at most. A shard is *silent* from ``threshold`` silent rounds on; it
speaks again when a release of its own brings it back under ``threshold`` (one that
catches up an old round only does not), said with the most silent rounds it was counted.

The watch starts empty with each run (it is not in the checkpoint): after a restart a
shard's silent rounds count from the rounds released since the start. Memory is bounded:
the released rounds that every shard has caught up with are forgotten, and at most
:data:`TRACKED_ROUNDS` are kept (a count that reached it reads as that many).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from edge.shards import ShardLayout, ShardPlan

__all__ = ["DEFAULT_SILENT_SHARD_ROUNDS", "TRACKED_ROUNDS", "SilenceChange", "SilenceWatch"]

DEFAULT_SILENT_SHARD_ROUNDS = 5
"""Silent rounds from which a shard is reported silent."""

TRACKED_ROUNDS = 4096
"""Released rounds remembered at most: the silent rounds a gauge can count."""


@dataclass(frozen=True)
class SilenceChange:
    """A shard became silent (``silent``, with its silent rounds) or spoke again (not
    ``silent``, with the most silent rounds it was counted)."""

    shard: str
    silent: bool
    rounds: int


class SilenceWatch:
    """Silent rounds per shard of the layout in force (module docs)."""

    def __init__(self, threshold: int = DEFAULT_SILENT_SHARD_ROUNDS, *, unit: int = 1) -> None:
        if threshold < 1:
            raise ValueError(f"silent_shard_rounds must be >= 1, got {threshold}")
        self.threshold = threshold
        self.unit = unit
        """The announced round length: rounds are told by their start (Unix seconds), and
        a layout's ``from_round`` counts rounds of this length."""
        self._last: dict[str, int] = {}
        """Per shard label: the start of the newest round it released."""
        self._rounds: list[int] = []
        """Rounds in which some shard released, newer than some shard's last release
        (sorted)."""
        self._newest: int | None = None
        self._silent: dict[str, int] = {}
        """The shards reported silent, with the most silent rounds counted since."""

    def released(self, shard: str | None, round_: int) -> None:
        """``shard`` released (part of) the round that starts at ``round_`` (Unix seconds):
        an applied batch or accepted manifest."""
        if shard is None:
            return
        last = self._last.get(shard)
        if last is None or round_ > last:
            self._last[shard] = round_
        at = bisect.bisect_left(self._rounds, round_)
        if at == len(self._rounds) or self._rounds[at] != round_:
            self._rounds.insert(at, round_)
        if self._newest is None or round_ > self._newest:
            self._newest = round_

    def layout(self, plan: ShardPlan | None) -> ShardLayout | None:
        """The layout in force: that of the newest round released (``None``: none yet, or
        an unsharded deployment)."""
        if plan is None or self._newest is None:
            return None
        return plan.layout_for_round(self._newest // self.unit)

    def silent_rounds(self, plan: ShardPlan | None) -> dict[str, int]:
        """Silent rounds per shard label of the layout in force (empty: no layout yet)."""
        layout = self.layout(plan)
        if plan is None or layout is None:
            return {}
        self._forget(plan, layout)
        rounds = self._rounds
        counts: dict[str, int] = {}
        for label in layout.labels:
            last = self._last.get(label)
            counts[label] = len(rounds) - (0 if last is None else bisect.bisect_right(rounds, last))
        return counts

    def _forget(self, plan: ShardPlan, layout: ShardLayout) -> None:
        """Keep the released rounds of ``layout`` (the newest layout: none are newer) that
        some shard of it has not caught up with, at most the newest :data:`TRACKED_ROUNDS`."""
        first_round, _ = plan.rounds_of(layout)
        first = first_round * self.unit
        lasts = [self._last.get(label) for label in layout.labels]
        if None not in lasts:
            first = max(first, min(r for r in lasts if r is not None) + 1)
        start = max(bisect.bisect_left(self._rounds, first), len(self._rounds) - TRACKED_ROUNDS)
        if start > 0:
            del self._rounds[:start]

    def changes(self, plan: ShardPlan | None) -> list[SilenceChange]:
        """The shards that became silent or spoke again since the last call, in label
        order. A shard that leaves the layout in force is no longer watched (nothing is
        said of it)."""
        counts = self.silent_rounds(plan)
        changes: list[SilenceChange] = []
        for label, most in sorted(self._silent.items()):
            if label not in counts:
                del self._silent[label]
            elif counts[label] < self.threshold:  # it released, and caught up
                del self._silent[label]
                changes.append(SilenceChange(label, False, most))
        for label, rounds in counts.items():
            if rounds >= self.threshold:
                if label not in self._silent:
                    changes.append(SilenceChange(label, True, rounds))
                self._silent[label] = max(rounds, self._silent.get(label, 0))
        return sorted(changes, key=lambda change: change.shard)

    @property
    def silent(self) -> tuple[str, ...]:
        """The shards reported silent (as of the last :meth:`changes`)."""
        return tuple(sorted(self._silent))
