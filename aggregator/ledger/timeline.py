"""When the compacted participations happened: the privacy ledger's view of rolling periods.

The privacy ledger folds old rounds into a histogram of sizes
(:meth:`~aggregator.ledger.privacy_ledger.PrivacyLedger.compact`): enough for
``epsilon_total`` since the start, not for "the last 24 hours". :class:`Timeline` keeps, for
the compacted participations of the last ``keep`` seconds, the end of the round each was
charged for and its size, so that a rolling period's ``epsilon_total`` (a device present in
every round of the period) composes exactly the participations whose round ended in it.

A participation whose time is not known (a record the ledger could not place, one that
arrived for a compacted round, a release of unknown round length) is *undated*: it is
counted in every period, the pessimistic reading. Entries older than ``keep`` seconds
before the newest are dropped from the timeline only; their cost stays in the ledger's
since-start histogram. A period longer than ``keep`` would miss them, so the service keeps
the timeline at least as long as its longest period. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_KEEP_SECONDS", "Timeline"]

DEFAULT_KEEP_SECONDS = 8 * 86400
"""A week and a day: the longest default period or window, with a day to spare."""


class Timeline:
    """Compacted participations by round end (module docs)."""

    def __init__(self, keep: float = DEFAULT_KEEP_SECONDS) -> None:
        if not keep > 0:
            raise ValueError(f"keep must be > 0 seconds, got {keep}")
        self.keep = float(keep)
        self.dated: Counter[tuple[int, int]] = Counter()
        """``(round end, size)`` -> participations."""
        self.undated: Counter[int] = Counter()
        """Size -> participations of unknown time (counted in every period)."""

    def add(self, end: int | None, size: int, count: int = 1) -> None:
        if end is None:
            self.undated[size] += count
        else:
            self.dated[(end, size)] += count

    def trim(self) -> int:
        """Drop dated entries that ended ``keep`` seconds or more before the newest; the
        number of participations dropped."""
        if not self.dated:
            return 0
        newest = max(end for end, _ in self.dated)
        old = [key for key in self.dated if key[0] <= newest - self.keep]
        return sum(self.dated.pop(key) for key in old)

    def between(self, start: float, end: float) -> Counter[int]:
        """Size -> participations whose round ended in ``(start, end]``, and the undated."""
        out: Counter[int] = Counter(self.undated)
        for (when, size), count in self.dated.items():
            if start < when <= end:
                out[size] += count
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "keep": self.keep,
            "dated": [[end, size, count] for (end, size), count in sorted(self.dated.items())],
            "undated": {str(size): count for size, count in sorted(self.undated.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Timeline:
        """The inverse of :meth:`to_json`; ``ValueError`` naming what is wrong."""
        keep = data.get("keep")
        if isinstance(keep, bool) or not isinstance(keep, int | float) or not keep > 0:
            raise ValueError("timeline.keep must be a number of seconds > 0")
        timeline = cls(float(keep))
        dated = data.get("dated")
        if not isinstance(dated, list):
            raise ValueError("timeline.dated must be a list")
        for i, entry in enumerate(dated):
            if not (isinstance(entry, list) and len(entry) == 3 and all(_count(v) for v in entry)):
                raise ValueError(f"timeline.dated[{i}] must be [end, size, count] of integers")
            end, size, count = entry
            if size < 1 or count < 1:
                raise ValueError(f"timeline.dated[{i}] has a size or count below 1")
            timeline.dated[(end, size)] += count
        undated = data.get("undated")
        if not isinstance(undated, dict):
            raise ValueError("timeline.undated must be an object")
        for size_text, count in undated.items():
            if not (isinstance(size_text, str) and size_text.isdigit() and _count(count)):
                raise ValueError(f"timeline.undated[{size_text!r}] must be a count")
            if int(size_text) < 1 or count < 1:
                raise ValueError(f"timeline.undated[{size_text!r}] is below 1")
            timeline.undated[int(size_text)] += count
        return timeline


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
