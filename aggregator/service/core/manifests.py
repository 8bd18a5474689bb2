"""Release manifests against batches, per (shard, round): loss you can see (no I/O).

A round is told by its start, Unix seconds (``round * round_seconds``: rounds are times,
:mod:`aggregator.service.core.rules`): every ``round`` here is such a start.

Each shuffler release (one round's pool, shuffled, maybe in several slices) comes with a
signed manifest listing its batches and their report counts (docs/protocol.md, kind 3),
published after them. :class:`Reconciler` holds each accepted manifest until every batch it
lists has arrived, or until ``grace`` seconds have passed: then the reports of the batches
still missing are counted (``coco_aggregator_reports_missing_total``, and the shard and
round in the recent losses of ``/estimates``: never a per-round metric label). A batch that
arrives after being counted missing is counted late (it is applied, once, as any other).
A batch of a (shard, round) that has manifests, none of which lists it within ``grace``
seconds, is counted as unlisted. A manifest that disagrees with a batch received (same
``batch_id``, another count, round or shard), lists a batch twice or one another manifest
lists, or lists a count below ``min_batch``, is rejected as ``manifest_mismatch`` and changes
nothing; a batch that disagrees with an accepted manifest withdraws that manifest the same
way (the batch itself, verified, is applied).

A re-sent manifest (the shuffler re-publishes after a restart) is a duplicate: the release
ids of the retained rounds are remembered, as batch ids are
(:class:`~aggregator.service.core.memory.BatchMemory`). Everything here is bounded by the grace
period and the retained rounds. The
checkpoint holds it (:meth:`Reconciler.to_json`) but for the batches applied in the last
``grace`` seconds, which only memory holds: after a restart a manifest's batches applied
before it count as received (their ids are remembered), their counts unchecked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Counts", "Loss", "Reconciler", "Release"]

RECENT_LOSSES = 32
"""Losses kept for ``/estimates`` (the newest ones)."""


@dataclass
class Release:
    """An accepted manifest still waiting for some of its batches."""

    shard: str | None
    round: int
    entries: dict[bytes, int]
    at: float


@dataclass
class Seen:
    """A batch applied, kept for ``grace`` seconds to match it with its manifest."""

    shard: str | None
    round: int
    count: int
    at: float
    listed: bool = False


@dataclass(frozen=True)
class Loss:
    """Reports of one (shard, round) counted missing; ``start`` is the round's start."""

    shard: str | None
    start: int
    batches: int
    reports: int
    at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "start": self.start,
            "batches": self.batches,
            "reports": self.reports,
            "at": self.at,
        }


@dataclass
class Counts:
    """What reconciliation counted (kept in the checkpoint, so they continue)."""

    manifests: int = 0
    reports_missing: int = 0
    batches_missing: int = 0
    batches_unlisted: int = 0
    reports_late: int = 0

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Reconciler:
    """Manifests against batches (module docs)."""

    grace: float
    min_batch: int = 1
    pending: dict[bytes, Release] = field(default_factory=dict)
    seen: dict[bytes, Seen] = field(default_factory=dict)
    listed: dict[bytes, bytes] = field(default_factory=dict)
    """batch id -> release id, for the pending releases."""
    releases: dict[int, set[bytes]] = field(default_factory=dict)
    """Release ids accepted, by round, for the retained rounds."""
    manifested: dict[tuple[str | None, int], float] = field(default_factory=dict)
    """(shard, round) -> when its last manifest came."""
    missing: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    """batch id -> (round, count) of batches counted missing, for the retained rounds."""
    losses: deque[Loss] = field(default_factory=lambda: deque(maxlen=RECENT_LOSSES))
    counts: Counts = field(default_factory=Counts)

    def batch(
        self, batch_id: bytes, *, shard: str | None, round_: int, count: int, now: float
    ) -> bool:
        """A verified batch was applied. ``False`` if it disagrees with the pending manifest
        that lists it, which is then withdrawn (counted by the caller as
        ``manifest_mismatch``)."""
        agrees = True
        release_id = self.listed.get(batch_id)
        if release_id is not None:
            release = self.pending[release_id]
            if (release.shard, release.round, release.entries[batch_id]) != (
                shard,
                round_,
                count,
            ):
                self._withdraw(release_id)
                agrees = False
        late = self.missing.pop(batch_id, None)
        if late is not None:
            self.counts.reports_late += count
        self.seen[batch_id] = Seen(shard, round_, count, now, listed=release_id is not None)
        if release_id is not None and agrees:
            self._resolve_if_complete(release_id, lambda _: False)
        return agrees

    def manifest(
        self,
        release_id: bytes,
        entries: list[tuple[bytes, int]],
        *,
        shard: str | None,
        round_: int,
        now: float,
        known: Callable[[bytes], bool],
    ) -> str:
        """An authentic manifest of ``shard`` for ``round_``: ``"accepted"``, ``"duplicate"``
        or ``"manifest_mismatch"`` (changes nothing). ``known(batch_id)``: whether a batch
        was applied before (one older than what :attr:`seen` still holds)."""
        if any(release_id in ids for ids in self.releases.values()):
            return "duplicate"
        ids = [batch_id for batch_id, _ in entries]
        if not ids or len(set(ids)) != len(ids) or any(c < self.min_batch for _, c in entries):
            return "manifest_mismatch"
        for batch_id, count in entries:
            if batch_id in self.listed:
                return "manifest_mismatch"
            seen = self.seen.get(batch_id)
            if seen is not None and (seen.shard, seen.round, seen.count) != (
                shard,
                round_,
                count,
            ):
                return "manifest_mismatch"
        self.counts.manifests += 1
        self.releases.setdefault(round_, set()).add(release_id)
        self.manifested[(shard, round_)] = now
        self.pending[release_id] = Release(shard, round_, dict(entries), now)
        for batch_id in ids:
            self.listed[batch_id] = release_id
            if batch_id in self.seen:
                self.seen[batch_id].listed = True
        self._resolve_if_complete(release_id, known)
        return "accepted"

    def _resolve_if_complete(self, release_id: bytes, known: Callable[[bytes], bool]) -> None:
        release = self.pending[release_id]
        if all(b in self.seen or known(b) for b in release.entries):
            self._drop(release_id)

    def _drop(self, release_id: bytes) -> None:
        release = self.pending.pop(release_id)
        for batch_id in release.entries:
            self.listed.pop(batch_id, None)

    def _withdraw(self, release_id: bytes) -> None:
        release = self.pending[release_id]
        self._drop(release_id)
        self.releases.get(release.round, set()).discard(release_id)
        for batch_id in release.entries:
            if batch_id in self.seen:
                self.seen[batch_id].listed = False

    def reconcile(self, now: float, known: Callable[[bytes], bool]) -> list[Loss]:
        """Count what ``grace`` seconds did not bring; the new losses."""
        new: list[Loss] = []
        for release_id, release in list(self.pending.items()):
            if release.at + self.grace > now:
                continue
            lost = {b: c for b, c in release.entries.items() if b not in self.seen and not known(b)}
            self._drop(release_id)
            if lost:
                for batch_id, count in lost.items():
                    self.missing[batch_id] = (release.round, count)
                loss = Loss(release.shard, release.round, len(lost), sum(lost.values()), now)
                self.counts.batches_missing += loss.batches
                self.counts.reports_missing += loss.reports
                self.losses.append(loss)
                new.append(loss)
        for batch_id, seen in list(self.seen.items()):
            if seen.at + self.grace > now or batch_id in self.listed:
                continue
            if not seen.listed and (seen.shard, seen.round) in self.manifested:
                self.counts.batches_unlisted += 1
            del self.seen[batch_id]
        for key, at in list(self.manifested.items()):
            if at + 2 * self.grace <= now:
                del self.manifested[key]
        return new

    def forget_before(self, oldest_round: int) -> None:
        """Forget release ids and missing batches of rounds below the retained horizon."""
        for round_ in [r for r in self.releases if r < oldest_round]:
            del self.releases[round_]
        for batch_id in [b for b, (r, _) in self.missing.items() if r < oldest_round]:
            del self.missing[batch_id]

    # -- the checkpoint's part -------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": self.counts.to_json(),
            "pending": [
                {
                    "release_id": rid.hex(),
                    "shard": r.shard,
                    "round": r.round,
                    "entries": [[b.hex(), c] for b, c in r.entries.items()],
                    "at": r.at,
                }
                for rid, r in self.pending.items()
            ],
            "releases": {str(r): sorted(i.hex() for i in ids) for r, ids in self.releases.items()},
            "manifested": [[s, r, at] for (s, r), at in self.manifested.items()],
            "missing": [[b.hex(), r, c] for b, (r, c) in self.missing.items()],
            "losses": [loss.to_json() for loss in self.losses],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, grace: float, min_batch: int) -> Reconciler:
        """The reconciler of :meth:`to_json` (``KeyError``/``TypeError``/``ValueError`` if
        malformed: the checkpoint's loader names the field)."""
        out = cls(grace=grace, min_batch=min_batch)
        out.counts = Counts(**{k: int(v) for k, v in data["counts"].items()})
        for item in data["pending"]:
            rid = bytes.fromhex(item["release_id"])
            entries = {bytes.fromhex(b): int(c) for b, c in item["entries"]}
            out.pending[rid] = Release(item["shard"], int(item["round"]), entries, item["at"])
            for batch_id in entries:
                out.listed[batch_id] = rid
        for r, ids in data["releases"].items():
            out.releases[int(r)] = {bytes.fromhex(i) for i in ids}
        for shard, round_, at in data["manifested"]:
            out.manifested[(shard, int(round_))] = at
        for b, round_, count in data["missing"]:
            out.missing[bytes.fromhex(b)] = (int(round_), int(count))
        for item in data["losses"]:
            start = item["start"] if "start" in item else item["round"]  # before version 4
            out.losses.append(
                Loss(item["shard"], start, item["batches"], item["reports"], item["at"])
            )
        return out
