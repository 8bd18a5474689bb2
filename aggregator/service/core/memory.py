"""What the core remembers of the batches it applied: their ids by round, for the retained
horizon (:class:`BatchMemory`), and their sizes per shard (:class:`ShardStats`). Pure code
(:mod:`aggregator.service.core.rules` uses them; its module docs say why)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchMemory", "ShardStats"]


class BatchMemory:
    """Applied batch ids by round, for the newest ``retention_rounds`` rounds applied."""

    def __init__(self, retention_rounds: int) -> None:
        self.retention_rounds = retention_rounds
        self.newest_round: int | None = None
        self._seen: dict[bytes, int] = {}
        self._rounds: dict[int, list[bytes]] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._seen

    @property
    def oldest_round(self) -> int | None:
        """The oldest round still accepted; ``None`` before the first batch."""
        if self.newest_round is None:
            return None
        return max(0, self.newest_round - self.retention_rounds + 1)

    def stale(self, round_: int) -> bool:
        oldest = self.oldest_round
        return oldest is not None and round_ < oldest

    def remember(self, batch_id: bytes, round_: int) -> None:
        self._seen[batch_id] = round_
        self._rounds.setdefault(round_, []).append(batch_id)
        if self.newest_round is None or round_ > self.newest_round:
            self.newest_round = round_
            self._evict()

    def _evict(self) -> None:
        """Forget the ids of rounds below the horizon (those batches are now stale)."""
        oldest = self.oldest_round
        if oldest is None:
            return
        for round_ in [r for r in self._rounds if r < oldest]:
            for batch_id in self._rounds.pop(round_):
                self._seen.pop(batch_id, None)

    def by_round(self) -> dict[int, tuple[bytes, ...]]:
        """A copy: round -> ids applied in it."""
        return {r: tuple(ids) for r, ids in self._rounds.items()}

    def restore(self, rounds: dict[int, list[bytes]]) -> None:
        self._seen.clear()
        self._rounds.clear()
        self.newest_round = None
        for round_, ids in sorted(rounds.items()):
            for batch_id in ids:
                self.remember(batch_id, round_)


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
