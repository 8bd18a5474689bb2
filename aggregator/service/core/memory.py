"""What the core remembers of the batches it applied: their ids by round start, for the retained
horizon (:class:`BatchMemory`), and their sizes per shard (:class:`ShardStats`). Pure code
(:mod:`aggregator.service.core.machine` uses them; :mod:`aggregator.service.core.rules`
says why)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchMemory", "ShardStats"]


class BatchMemory:
    """Applied batch ids by round, for the rounds that started in the newest
    ``retention_rounds * unit`` seconds applied.

    A round is keyed by its start time (Unix seconds: ``round * round_seconds``), so that
    rounds counted before and after a change of ``round_seconds`` keep their order in time.
    ``unit`` is the round length the horizon is counted in (the announced one, at start;
    ``None`` without one: the length of the newest round applied).
    The oldest start still accepted, :attr:`floor`, never moves back while the service
    runs; a restart with a longer horizon (a larger ``retention_rounds``, or a longer
    announced round length) widens it, as a longer retention always did, but never over
    the **forgotten** starts: ``[first, high)``, from the floor set by the first batch ever
    applied (:attr:`first`) to the highest floor ever (:attr:`high`). Every batch ever
    applied started at or after ``first``, and the ids of those that started before
    ``high`` were forgotten: a batch of that span may have been applied, and is stale for
    good (a batch kept as ``stale_round`` and replayed at a start would otherwise be
    applied twice). A batch that started before ``first`` was never applied, and is
    accepted once the horizon reaches it (a shard whose outage outlived the horizon)."""

    def __init__(self, retention_rounds: int, unit: int | None = 1) -> None:
        self.retention_rounds = retention_rounds
        self.given_unit = unit
        self.newest_length = 1
        """The length of the newest round applied."""
        self.newest_start: int | None = None
        self.floor: int | None = None
        """The oldest start still accepted; ``None`` before the first batch."""
        self.first: int | None = None
        """The floor the first batch ever applied set (kept across restarts)."""
        self.high: int | None = None
        """The highest floor ever (kept across restarts): ids before it were forgotten."""
        self._seen: dict[bytes, int] = {}
        self._rounds: dict[int, list[bytes]] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._seen

    @property
    def unit(self) -> int:
        """The round length the horizon is counted in (module docs)."""
        return self.newest_length if self.given_unit is None else self.given_unit

    @property
    def horizon(self) -> int:
        """Seconds of rounds retained behind the newest start applied."""
        return self.retention_rounds * self.unit

    @property
    def newest_round(self) -> int | None:
        """The newest start applied, in rounds of ``unit`` (for gauges and pages)."""
        return None if self.newest_start is None else self.newest_start // self.unit

    @property
    def oldest_round(self) -> int | None:
        """The oldest start still accepted, in rounds of ``unit`` (rounded up)."""
        return None if self.floor is None else -(-self.floor // self.unit)

    def stale(self, start: int) -> bool:
        """Whether a round starting at ``start`` is below the horizon, or among the
        forgotten starts (class docs)."""
        if self.floor is not None and start < self.floor:
            return True
        return self.first is not None and self.high is not None and self.first <= start < self.high

    def remember(self, batch_id: bytes, start: int, length: int = 1) -> None:
        """Batch ``batch_id`` of the round of ``length`` seconds that starts at ``start``
        was applied."""
        self._seen[batch_id] = start
        self._rounds.setdefault(start, []).append(batch_id)
        if self.newest_start is None or start > self.newest_start:
            self.newest_start = start
            self.newest_length = length
            floor = max(0, start - self.horizon + self.unit)
            if self.floor is None or floor > self.floor:
                self.floor = floor
            if self.first is None:
                self.first = self.floor
            if self.high is None or self.floor > self.high:
                self.high = self.floor
            self._evict()

    def _evict(self) -> None:
        """Forget the ids of rounds below the horizon (those batches are now stale)."""
        floor = self.floor
        if floor is None:
            return
        for start in [s for s in self._rounds if s < floor]:
            for batch_id in self._rounds.pop(start):
                self._seen.pop(batch_id, None)

    def by_round(self) -> dict[int, tuple[bytes, ...]]:
        """A copy: round start -> ids applied in it."""
        return {s: tuple(ids) for s, ids in self._rounds.items()}

    def restore(
        self,
        rounds: dict[int, list[bytes]],
        newest_length: int = 1,
        forgotten: tuple[int, int] | None = None,
    ) -> None:
        """The ids of :meth:`by_round`, the newest of a round of ``newest_length`` seconds
        (:attr:`newest_length`, kept with them); the :attr:`floor` is the one they imply, and
        ``forgotten`` (:attr:`first`, :attr:`high`, saved with them) the starts whose ids
        were forgotten: a restart under a longer unit or retention never lets those count
        as new again (class docs)."""
        self._seen.clear()
        self._rounds.clear()
        self.newest_start = None
        self.floor = None
        self.first = None
        self.high = None
        self.newest_length = 1
        for start, ids in sorted(rounds.items()):
            for batch_id in ids:
                self.remember(batch_id, start, newest_length)
        if forgotten is not None:
            first, high = forgotten
            self.first = first  # the first floor ever, not one the longer horizon implies
            self.high = high if self.high is None else max(high, self.high)


@dataclass
class ShardStats:
    """Batches applied of one shard: the smallest is the guarantee its reports have."""

    batches: int = 0
    reports: int = 0
    smallest: int | None = None
    latest: int | None = None

    def add(self, size: int) -> None:
        self.batches += 1
        self.reports += size
        self.smallest = size if self.smallest is None else min(self.smallest, size)
        self.latest = size

    def to_json(self) -> dict[str, int | None]:
        return dict(self.__dict__)
