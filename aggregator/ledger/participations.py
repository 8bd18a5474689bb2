"""The participations the shufflers' releases charge: recorded, compacted, renumbered and
dated, with no I/O.

:class:`Participations` holds every record the ledger takes (a verified manifest, an applied
batch, an extra participation, the old per-batch records), each ``record_*`` call idempotent,
and keeps them bounded: the rounds it holds in detail are folded into a histogram of
accounting sizes (:meth:`Participations.compact`), the ids it charged late or folded
remembered for a while. It knows which participation each record charges, at what size
(:meth:`Participations._levels_of`) and when its round ended (:meth:`Participations._end_of`).
What they amount to in central privacy, per period and in all, is
:class:`~aggregator.ledger.privacy_ledger.PrivacyLedger`'s, which adds the figures to these
records (:mod:`aggregator.ledger.privacy_ledger`, whose docstring also holds the argument for one
participation per source round): kept apart so that what is recorded, and how it is kept
small and dated, reads without the accounting it feeds.

Where releases come from
------------------------
* *Manifests* list every release a shuffler made, whether or not this aggregator applied
  its batches (a stale round, a batch lost at the broker, a checkpoint reset): the ledger
  accounts what the devices really spent, not only what was applied here.
* *Applied batches without a manifest* (an older shuffler, or a manifest still on its way)
  are each a participation of their own, at their own size: from batches alone the ledger
  can tell neither which rounds their reports were sent in nor which batches are slices of
  one release, and every other grouping could understate the loss. A manifest that
  arrives later covers its batches and replaces their records by the release's sources;
  nothing is counted twice.

Compaction
----------
The detail (release ids, batch ids) of every round is kept until :meth:`compact` folds the
rounds up to a given round into a histogram of their accounting sizes (their cost is kept,
their ids are not). A record that arrives later for a compacted round cannot be told from
one already counted, so it is counted again as an extra participation (``"late"``): an
overstatement of privacy loss, never of privacy. Replays are bounded by a memory of the
last :data:`FORGOTTEN_KEPT` ids the ledger charged late or folded (with a digest of their
content, saved in the ledger's file): a record whose id and content it holds is a
``"duplicate"``, not charged again (a trusted shuffler's batch of a round older than the
aggregator's horizon, ``stale_round``, redelivered after a restart). Past that many ids the
oldest is forgotten, and its replay is charged again: pessimistic, never under-reported.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from aggregator.accountant.history import accounting_size
from aggregator.ledger.records import MAX_ROUND
from aggregator.ledger.records import BatchRecord as _Batch
from aggregator.ledger.records import Key as _Key
from aggregator.ledger.records import ManifestRecord as _Manifest
from aggregator.ledger.records import check_id as _check_id
from aggregator.ledger.records import check_seconds as _check_seconds
from aggregator.ledger.records import check_shard as _check_shard
from aggregator.ledger.records import check_size as _check_size
from aggregator.ledger.records import check_source as _check_source
from aggregator.ledger.records import check_start as _check_round
from aggregator.ledger.records import digest as _digest
from aggregator.ledger.timeline import DEFAULT_KEEP_SECONDS, Timeline
from edge.rounds import MAX_ROUND_SECONDS
from edge.spec import MechanismSpec

__all__ = ["FORGOTTEN_KEPT", "UNKNOWN_SOURCE", "Outcome", "Participations"]


_MAX_TOTAL: Final = 2**62
"""Largest size of an extra participation (the ledger's file keeps sizes below 2^63)."""

Outcome = Literal["recorded", "duplicate", "covered", "mismatch", "late"]
"""What a ``record_*`` call did (:mod:`aggregator.ledger.privacy_ledger`, *The API the service
calls*)."""


UNKNOWN_SOURCE: Final = (MAX_ROUND, 0)
"""A manifest's source ``(round, round_seconds)`` for reports whose round is not known."""

FORGOTTEN_KEPT: Final = 4096
"""Ids of compacted rounds the ledger remembers (module docstring, "Compaction")."""


@dataclass
class _History:
    """The cost of compacted rounds and of the old per-batch records."""

    compacted: Counter[int] = field(default_factory=Counter)
    """Accounting size -> compacted rounds."""
    compacted_smallest: int | None = None
    """The smallest exact size among the compacted rounds."""
    compacted_through: int | None = None
    late: Counter[int] = field(default_factory=Counter)
    """Exact size -> records that arrived for a compacted round (extra participations)."""


class Participations:
    """The records of the releases, and the participations they charge (module docstring)."""

    def __init__(
        self,
        spec: MechanismSpec,
        *,
        delta: float,
        round_seconds: int | None = None,
        keep_seconds: float = DEFAULT_KEEP_SECONDS,
    ) -> None:
        self.spec = spec
        self.delta = delta
        self.round_seconds = round_seconds
        """The deployment's round length, which dates a release known only by its round's
        start (a release without sources, a batch without manifest: it ended one such
        length after it started, or later); ``None``: such participations count in every
        period (:mod:`aggregator.ledger.timeline`)."""
        self.numbered = False
        """Whether the records' rounds are numbers (read from a file written before
        rounds were times), to be made starts (:meth:`renumber`)."""
        self.timeline = Timeline(keep_seconds)
        self.generation = 0
        self.id = os.urandom(8).hex()
        self._manifests: dict[bytes, _Manifest] = {}
        self._batches: dict[bytes, _Batch] = {}
        """Applied batches of the detailed rounds, by id."""
        self._listed: dict[bytes, bytes] = {}
        """Batch id -> the id of the manifest that lists it."""
        self._rounds: dict[int, set[bytes]] = {}
        """Round -> ids of its manifests and applied batches (for compaction)."""
        self._history = _History()
        self._forgotten: dict[bytes, bytes] = {}
        """Kind + id -> digest of the content, of records of compacted rounds (charged late,
        or folded), oldest first, at most :data:`FORGOTTEN_KEPT`."""
        # the old per-batch API
        self.sizes: Counter[int] = Counter()
        self._legacy_latest: int | None = None
        self._per_release: dict[int, tuple[float, float]] = {}
        self._levels_cache: tuple[int, dict[_Key, int]] | None = None

    # -- recording --------------------------------------------------------------------------

    def record_manifest(
        self,
        *,
        round: int,  # the protocol's name for it
        shard: str,
        release_id: bytes,
        batches: Sequence[tuple[bytes, int]],
        sources: Sequence[tuple[int, int]] | None = None,
    ) -> Outcome:
        """A verified manifest: release ``release_id`` of ``round`` in ``shard`` was cut
        into ``batches`` (``(batch_id, count)``, in the manifest's order) and holds reports
        sent in the rounds ``sources`` (``(round, round_seconds)``; :data:`UNKNOWN_SOURCE`
        for reports of an unknown round; ``None``: not known at all)."""
        round = _check_round(round)
        shard = _check_shard(shard)
        release_id = _check_id("release_id", release_id)
        listed = tuple((_check_id("batch_id", b), _check_size("count", c)) for b, c in batches)
        if not listed:
            raise ValueError("a manifest lists at least one batch")
        if len({b for b, _ in listed}) != len(listed):
            raise ValueError("a manifest lists each batch once")
        rounds = None if sources is None else tuple(sorted({_check_source(s) for s in sources}))
        manifest = _Manifest(round=round, shard=shard, batches=listed, sources=rounds)
        known = self._manifests.get(release_id)
        if known is not None:
            return "duplicate" if known == manifest else "mismatch"
        if self._compacted(round):
            return self._late(b"r" + release_id, manifest, manifest.size)
        for batch_id, count in listed:
            other = self._listed.get(batch_id)
            if other is not None and other != release_id:
                return "mismatch"
            applied = self._batches.get(batch_id)
            if applied is not None and applied != _Batch(round=round, shard=shard, size=count):
                return "mismatch"
        self._manifests[release_id] = manifest
        for batch_id, _ in listed:
            self._listed[batch_id] = release_id
        self._rounds.setdefault(round, set()).add(release_id)
        self.generation += 1
        return "recorded"

    def record_batch(
        self,
        *,
        round: int,
        shard: str,
        batch_id: bytes,
        size: int,
        seconds: int = 0,
    ) -> Outcome:
        """An applied batch of ``size`` reports of ``round`` in ``shard``, of a round of
        ``seconds`` (as the batch carries it; 0: it carries none)."""
        round = _check_round(round)
        shard = _check_shard(shard)
        batch_id = _check_id("batch_id", batch_id)
        size = _check_size("size", size)
        seconds = _check_seconds(seconds)
        batch = _Batch(round=round, shard=shard, size=size, seconds=seconds)
        known = self._batches.get(batch_id)
        if known is not None:
            return "duplicate" if known == batch else "mismatch"
        if self._compacted(round):
            return self._late(b"b" + batch_id, batch, size)
        release_id = self._listed.get(batch_id)
        if release_id is not None:
            manifest = self._manifests[release_id]
            if (manifest.round, manifest.shard) != (round, shard) or (
                dict(manifest.batches)[batch_id] != size
            ):
                return "mismatch"
            self._batches[batch_id] = batch  # remembered, to check a replay against it
            self._rounds.setdefault(round, set()).add(batch_id)
            return "covered"
        self._batches[batch_id] = batch
        self._rounds.setdefault(round, set()).add(batch_id)
        self.generation += 1
        return "recorded"

    def _late(self, key: bytes, record: _Manifest | _Batch, size: int) -> Outcome:
        """A record of a compacted round: ``"duplicate"`` if the ids remembered hold it with
        this content, else charged as an extra participation at ``size`` and remembered."""
        digest = _digest(record)
        if self._forgotten.get(key) == digest:
            return "duplicate"
        self._history.late[size] += 1
        self._forget(key, digest)
        self.generation += 1
        return "late"

    def _forget(self, key: bytes, digest: bytes) -> None:
        """Remember ``key`` (newest), forgetting the oldest beyond :data:`FORGOTTEN_KEPT`."""
        self._forgotten.pop(key, None)
        self._forgotten[key] = digest
        while len(self._forgotten) > FORGOTTEN_KEPT:
            del self._forgotten[next(iter(self._forgotten))]

    def record_extra(self, *, size: int) -> Outcome:
        """A release the ledger cannot place (one that contradicts what is recorded, or
        whose fields it refuses): one extra participation of its own at ``size``, kept
        with the late records. Pessimistic: whatever else charges its reports, a further
        participation never lowers ``epsilon_total``."""
        self._history.late[_check_size("size", size, high=_MAX_TOTAL)] += 1
        self.generation += 1
        return "late"

    def compact(self, through_round: int) -> int:
        """Fold every round ``<= through_round`` into the history of accounting sizes
        (module docstring, "Compaction"); returns the number of participations folded. A
        source round with releases on both sides of the cut is charged on both sides: an
        overstatement of privacy loss, never of privacy."""
        through_round = _check_round(through_round)
        history = self._history
        if history.compacted_through is not None and through_round <= history.compacted_through:
            return 0
        folded_ids: set[bytes] = set()
        for round_ in sorted(r for r in self._rounds if r <= through_round):
            folded_ids |= self._rounds.pop(round_)
        levels = self._levels_of(folded_ids)
        for participation, size in levels.items():
            self.timeline.add(self._end_of(participation), size)
            history.compacted[accounting_size(size)] += 1
            if history.compacted_smallest is None or size < history.compacted_smallest:
                history.compacted_smallest = size
        for key in sorted(folded_ids):
            manifest = self._manifests.pop(key, None)
            if manifest is not None:
                self._forget(b"r" + key, _digest(manifest))
                for batch_id, count in manifest.batches:
                    self._listed.pop(batch_id, None)
                    folded = _Batch(round=manifest.round, shard=manifest.shard, size=count)
                    self._forget(b"b" + batch_id, _digest(folded))
            batch = self._batches.pop(key, None)
            if batch is not None:
                self._forget(b"b" + key, _digest(batch))
        history.compacted_through = through_round
        self.timeline.trim()
        self.generation += 1
        return len(levels)

    def renumber(self, round_seconds: int) -> None:
        """Make the rounds of a ledger read with numbers (:attr:`numbered`) their starts,
        under ``round_seconds`` (the length they were counted in). The digests of the ids
        it remembers of compacted rounds name the old records: a replay of one is charged
        once more (pessimistic)."""
        if not self.numbered:
            return
        self.numbered = False
        unit = round_seconds
        self._manifests = {
            k: _Manifest(round=m.round * unit, shard=m.shard, batches=m.batches, sources=m.sources)
            for k, m in self._manifests.items()
        }
        self._batches = {
            k: _Batch(round=b.round * unit, shard=b.shard, size=b.size, seconds=b.seconds)
            for k, b in self._batches.items()
        }
        self._rounds = {r * unit: ids for r, ids in self._rounds.items()}
        through = self._history.compacted_through
        if through is not None:
            # the rounds up to ``through`` are compacted: every start before the next one
            self._history.compacted_through = (through + 1) * unit - 1
        self._levels_cache = None
        self.generation += 1

    def _compacted(self, round_: int) -> bool:
        through = self._history.compacted_through
        return through is not None and round_ <= through

    # -- reading ----------------------------------------------------------------------------

    def _levels_of(self, ids: set[bytes] | None = None) -> dict[_Key, int]:
        """Participation -> the size of the smallest release (or unlisted batch) charging
        it, over the records ``ids`` (default: every detailed record)."""
        levels: dict[_Key, int] = {}
        for release_id, manifest in self._manifests.items():
            if ids is not None and release_id not in ids:
                continue
            size = manifest.size
            for key in manifest.keys(release_id):
                levels[key] = min(levels.get(key, size), size)
        for batch_id, batch in self._batches.items():
            if batch_id in self._listed or (ids is not None and batch_id not in ids):
                continue  # its manifest accounts for it
            levels[("b", batch_id)] = batch.size
        return levels

    def _round_levels(self) -> dict[_Key, int]:
        """:meth:`_levels_of` of every detailed record, cached per generation (a covered
        batch changes no level)."""
        cached = self._levels_cache
        if cached is not None and cached[0] == self.generation:
            return cached[1]
        levels = self._levels_of()
        self._levels_cache = (self.generation, levels)
        return levels

    def _end_of(self, key: _Key) -> int | None:
        """When participation ``key``'s round ended (Unix seconds), if known: a source
        round's from its number and its length as the signed manifest lists them (undated
        for a length outside ``[1, 86400]``: the unknown round); a batch record's from its
        round's start and the length the batch carries (version 2: a batch of the old length
        that arrives after a change of ``round_seconds`` is dated by its own); a release
        record's, or a version-1 batch's, from its round's start and the configured round
        length, the one its start was computed with (undated without one, or in a ledger
        still numbered)."""
        kind, ident = key[0], key[1]
        if kind == "s":
            round_, length = int(str(ident)), int(str(key[2]))
            if not 1 <= length <= MAX_ROUND_SECONDS:
                return None
            return (round_ + 1) * length
        record: _Manifest | _Batch | None = None
        if isinstance(ident, bytes):
            record = self._manifests.get(ident) if kind == "r" else self._batches.get(ident)
        if record is None or self.numbered:
            return None  # undated (numbered: not renumbered yet): counted in every period
        if isinstance(record, _Batch) and record.seconds:
            return record.round + record.seconds
        if self.round_seconds is None:
            return None
        return record.round + self.round_seconds

    # -- the old per-batch API --------------------------------------------------------------

    def record(self, size: int) -> None:
        """One batch of ``size`` reports was applied, accounted as one participation (the
        old per-batch accounting)."""
        self.sizes[_check_size("size", size)] += 1
        self._legacy_latest = size
        self.generation += 1

    def restore(self, sizes: Mapping[int, int], latest: int | None) -> None:
        """The old per-batch records of a checkpoint."""
        self.sizes = Counter({int(n): int(c) for n, c in sizes.items() if c > 0})
        self._legacy_latest = latest
        self.generation += 1

    # -- persistence (the file format is aggregator.ledger.ledger_file's) --------------------------

    def to_dict(self) -> dict[str, Any]:
        """Everything recorded, JSON-ready (ids in hex, sorted: equal ledgers, equal text)."""
        history = self._history
        return {
            "fingerprint": self.spec.fingerprint,
            "delta": self.delta,
            "generation": self.generation,
            **({} if self.numbered else {"rounds": "start"}),
            "manifests": [
                [
                    m.round,
                    m.shard,
                    rid.hex(),
                    [[b.hex(), c] for b, c in m.batches],
                    None if m.sources is None else [list(src) for src in m.sources],
                ]
                for rid, m in sorted(self._manifests.items(), key=lambda kv: (kv[1].round, kv[0]))
            ],
            "batches": [
                [b.round, b.shard, bid.hex(), b.size, *([b.seconds] if b.seconds else [])]
                for bid, b in sorted(self._batches.items(), key=lambda kv: (kv[1].round, kv[0]))
            ],
            "compacted": _counts(history.compacted),
            "compacted_smallest": history.compacted_smallest,
            "compacted_through": history.compacted_through,
            "late": _counts(history.late),
            "per_batch": _counts(self.sizes),
            "per_batch_latest": self._legacy_latest,
            "forgotten": [[key.hex(), digest.hex()] for key, digest in self._forgotten.items()],
            "timeline": self.timeline.to_json(),
        }

    def restore_history(
        self,
        *,
        compacted: Mapping[int, int],
        compacted_smallest: int | None,
        compacted_through: int | None,
        late: Mapping[int, int],
        per_batch: Mapping[int, int],
        per_batch_latest: int | None,
    ) -> None:
        """The compacted part and the old per-batch records of :meth:`to_dict` (for
        :mod:`aggregator.ledger.ledger_file`; call it on a fresh ledger, before ``record_*``)."""
        self._history = _History(
            compacted=Counter(compacted),
            compacted_smallest=compacted_smallest,
            compacted_through=compacted_through,
            late=Counter(late),
        )
        self.restore(per_batch, per_batch_latest)

    def restore_forgotten(self, forgotten: Sequence[tuple[bytes, bytes]]) -> None:
        """The remembered ids of compacted rounds of :meth:`to_dict`, oldest first."""
        self._forgotten = {}
        for key, digest in forgotten:
            self._forget(key, digest)


def _counts(counter: Mapping[int, int]) -> dict[str, int]:
    return {str(size): count for size, count in sorted(counter.items()) if count > 0}
