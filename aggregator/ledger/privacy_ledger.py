"""What the shufflers' releases cost in central privacy: per round and over time.

:class:`PrivacyLedger` records every *release* the shufflers made and turns the record into
the numbers the service exports. It is plain data with no I/O; the service persists it
with :mod:`aggregator.ledger.ledger_file` (its own checksummed file, apart from the estimates'
checkpoint) and computes its numbers in the accountant's process
(:mod:`aggregator.ledger.accountant_process`).

The API the service calls
-------------------------
::

    from aggregator.ledger import accountant_process, ledger_file
    ledger = ledger_file.load_ledger(path, spec=spec, delta=delta)  # None: no file yet
    ledger = ledger or PrivacyLedger(spec, delta=delta)
    ledger.record_manifest(round=start, shard="g0s1", release_id=rid,
                           batches=[(batch_id, count), ...],   # a verified manifest
                           sources=[(sent_round, round_seconds), ...])
    ledger.record_batch(round=start, shard="g0s1", batch_id=bid, size=n)  # an applied batch
    ledger.compact(through_start)     # fold old rounds' detail, keep their cost
    ledger_file.save_ledger(path, ledger)   # with the checkpoint, in a thread
    snapshot = ledger.snapshot()      # immutable, picklable
    level = await accountant_process.compute_level(spec, delta, snapshot)  # privacy loop
    level = accountant_process.last_level(snapshot)   # a scrape: at once, or None
    settled = level.generation == ledger.generation
    shown = level.for_sizes(smallest=ledger.smallest, latest=ledger.latest)

``round`` is the start of the release's round, Unix seconds (``round_number *
round_seconds``: rounds are times, so that releases before and after a change of
``round_seconds`` keep their order); without a round length, its number. A ledger read from
a file written when they were numbers (no ``"rounds": "start"`` in it) is brought to starts
by :meth:`PrivacyLedger.renumber`. ``shard`` is the shard label of docs/protocol.md
(``g<generation>s<index>``) or ``""`` for an unsharded deployment. Both ``record_*`` methods
are idempotent and return a :data:`Outcome`: ``"recorded"`` (the ledger changed),
``"duplicate"`` (seen before, nothing changed), ``"covered"`` (a batch its manifest already
accounts for), ``"mismatch"`` (it contradicts what is recorded: nothing changed; count it),
``"late"`` (a round whose detail was compacted: accounted as an extra participation, the
pessimistic reading). Invalid arguments raise ``ValueError``;
:meth:`PrivacyLedger.record_extra` charges what the caller could not record (a
``"mismatch"``, a ``ValueError``) as an extra participation.
``generation`` grows by one with every change; ``PrivacyLevel.batches`` is the number of
participations a level composed.

The old per-batch calls (:meth:`PrivacyLedger.record`, :meth:`PrivacyLedger.restore`,
``ledger.sizes``) still work, with their old meaning (each batch one participation), until
the service moves over; the two kinds of record add up.

What a release is, and what a participation is
----------------------------------------------
A *release* is one shuffler's pool of one round (of one shard), permuted uniformly at
random once and published as one or more slices (batches) of consecutive positions, cut
only above ``max_batch`` (:mod:`broker.core`); a signed manifest lists its batches and
its *sources*: the rounds its reports were sent in (the round in each report), with how
many reports of each. A pool carried into a later round (policy ``carry``) keeps its
reports' own rounds there, so a release's round number alone does not say which rounds it
holds. The ledger charges one *participation* per source round, at the level of the
smallest release holding any report of that round:

1. *Slices are post-processing.* The slices of a release are a deterministic function of
   the uniformly permuted sequence of its ``n`` reports, and that sequence is the shuffled
   multiset followed by an independent uniform ordering: conversely the multiset is the
   union of the slices. So the sliced release and the shuffle of the whole pool have the
   same hockey-stick divergence for every neighbouring pair of datasets; a release of ``n``
   reports is accounted as ONE shuffle of ``n``, however many batches it was cut into.
   (Batch ids are fresh random values, independent of the data.)
2. *One report per device per source round.* A device sends at most one report per round,
   to the one shard its id hashes to for that round, and a release never holds two reports
   of one device (duplicate tokens; a carried report is superseded by the device's newer
   one). So each of a device's reports is in exactly one release, and the reports a
   device sent in round ``r`` are at most one: whatever releases hold reports of round
   ``r``, the device is in at most one of them *through its round-``r`` report*. Every
   other release that holds reports of round ``r`` holds only other devices' reports of
   that round (and maybe this device's reports of other rounds, which their own source
   rounds charge), so given everyone else's data it adds nothing about the round-``r``
   report: post-processing. A device's reports of different rounds are independent
   randomisations, and the releases compose over them (adaptively).
3. *Monotone in n.* The release of ``n`` reports is a post-processing of the shuffle of any
   ``n' <= n`` of them, so the pair that dominates the smallest release holding reports of
   a round dominates every release holding them (:mod:`aggregator.accountant.history`,
   "Accounting sizes").

Hence each source round is dominated by one blanket pair at its smallest release, and
``epsilon_total`` composes one participation per source round
(:func:`aggregator.accountant.history.epsilon_total_rounds`). Counting by the release's
round number instead would be wrong under ``carry``: a device's carried report of round
``r - 1`` and its fresh report of round ``r`` can sit in two releases that both bear round
``r`` (an early release, then the round's end), which is two participations. A source
round is keyed with its round length, ``(round, round_seconds)``, so rounds counted before
and after a change of ``round_seconds`` are never confused.

Records the ledger cannot place are charged pessimistically: a manifest without sources,
or with reports of an unknown round, is a participation of its own per release; an applied
batch without a manifest is a participation of its own per batch (below). Items 1 and 2
are checked by exact enumeration in tests/aggregator/test_release_enumeration.py.

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

from aggregator.accountant import amplify_spec
from aggregator.accountant.blanket import MAX_N
from aggregator.accountant.history import SIGNIFICANT_BITS, accounting_size, epsilon_total_rounds
from aggregator.ledger.levels import LedgerSnapshot, PrivacyLevel
from aggregator.ledger.records import ID_BYTES, MAX_ROUND
from aggregator.ledger.records import BatchRecord as _Batch
from aggregator.ledger.records import Key as _Key
from aggregator.ledger.records import ManifestRecord as _Manifest
from aggregator.ledger.records import check_id as _check_id
from aggregator.ledger.records import check_shard as _check_shard
from aggregator.ledger.records import check_size as _check_size
from aggregator.ledger.records import check_source as _check_source
from aggregator.ledger.records import check_start as _check_round
from aggregator.ledger.records import digest as _digest
from aggregator.ledger.timeline import DEFAULT_KEEP_SECONDS, Timeline
from edge.rounds import MAX_ROUND_SECONDS
from edge.spec import MechanismSpec

__all__ = [
    "ID_BYTES",
    "MAX_ROUND",
    "SIGNIFICANT_BITS",
    "Outcome",
    "PrivacyLedger",
    "accounting_size",
]


_MAX_TOTAL: Final = 2**62
"""Largest size of an extra participation (the ledger's file keeps sizes below 2^63)."""

Outcome = Literal["recorded", "duplicate", "covered", "mismatch", "late"]
"""What a ``record_*`` call did (module docstring)."""


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


class PrivacyLedger:
    """Releases recorded, and the central privacy they amount to (module docstring)."""

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
    ) -> Outcome:
        """An applied batch of ``size`` reports of ``round`` in ``shard``."""
        round = _check_round(round)
        shard = _check_shard(shard)
        batch_id = _check_id("batch_id", batch_id)
        size = _check_size("size", size)
        batch = _Batch(round=round, shard=shard, size=size)
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
            k: _Batch(round=b.round * unit, shard=b.shard, size=b.size)
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
        for a length outside ``[1, 86400]``: the unknown round); a release or batch record's
        from its round's start and the configured round length (undated without one, or in
        a ledger still numbered)."""
        kind, ident = key[0], key[1]
        if kind == "s":
            round_, length = int(str(ident)), int(str(key[2]))
            if not 1 <= length <= MAX_ROUND_SECONDS:
                return None
            return (round_ + 1) * length
        record: _Manifest | _Batch | None = None
        if isinstance(ident, bytes):
            record = self._manifests.get(ident) if kind == "r" else self._batches.get(ident)
        if record is None or self.round_seconds is None or self.numbered:
            return None  # undated (numbered: not renumbered yet): counted in every period
        return record.round + self.round_seconds

    def period_rounds(self, start: float, end: float) -> dict[int, int]:
        """:meth:`rounds` of a device present in every round that ended in ``(start, end]``:
        the participations dated in it, detailed or compacted, and every one whose time is
        not known (late and extra records, the old per-batch records, the undated): counted
        in every period, pessimistically."""
        out: Counter[int] = Counter()
        for key, size in self._round_levels().items():
            when = self._end_of(key)
            if when is None or start < when <= end:
                out[size] += 1
        out.update(self.timeline.between(start, end))
        out.update(self._history.late)
        out.update(self.sizes)
        return {size: count for size, count in sorted(out.items()) if count > 0}

    def rounds(self) -> dict[int, int]:
        """``{release size: participations}`` of everything recorded: detailed rounds at
        their exact level, compacted rounds at their accounting size, late records, and the
        old per-batch records."""
        out: Counter[int] = Counter(self._round_levels().values())
        out.update(self._history.compacted)
        out.update(self._history.late)
        out.update(self.sizes)
        return {size: count for size, count in sorted(out.items()) if count > 0}

    @property
    def smallest(self) -> int | None:
        """The smallest participation (exact size) ever recorded."""
        candidates = [
            *self._round_levels().values(),
            *(n for n, c in self._history.late.items() if c > 0),
            *(n for n, c in self.sizes.items() if c > 0),
        ]
        if self._history.compacted_smallest is not None:
            candidates.append(self._history.compacted_smallest)
        return min(candidates) if candidates else None

    @property
    def latest(self) -> int | None:
        """The smallest release (exact size) of the newest release round recorded in detail;
        with only old per-batch records, the latest batch."""
        newest: dict[int, int] = {}
        for manifest in self._manifests.values():
            newest[manifest.round] = min(newest.get(manifest.round, manifest.size), manifest.size)
        for batch_id, batch in self._batches.items():
            if batch_id not in self._listed:
                newest[batch.round] = min(newest.get(batch.round, batch.size), batch.size)
        if newest:
            return newest[max(newest)]
        return self._legacy_latest

    @property
    def releases(self) -> int:
        """Manifests and batches without a manifest, of the detailed rounds."""
        derived = sum(1 for k in self._batches if k not in self._listed)
        return len(self._manifests) + derived

    def snapshot(self, periods: Mapping[str, tuple[float, float]] | None = None) -> LedgerSnapshot:
        """An immutable copy to hand to :meth:`compute` in another thread or process, with
        the participations of each labelled period ``(start, end]`` (:meth:`period_rounds`)."""
        return LedgerSnapshot(
            periods=tuple(
                (label, tuple(self.period_rounds(start, end).items()))
                for label, (start, end) in sorted((periods or {}).items())
            ),
            rounds=tuple(self.rounds().items()),
            smallest=self.smallest,
            latest=self.latest,
            generation=self.generation,
            releases=self.releases,
            ledger=self.id,
        )

    # -- the numbers ------------------------------------------------------------------------

    def per_release(self, n: int) -> tuple[float, float]:
        """``(blanket, generic)`` central epsilon of one release of ``n`` (cached); above
        :data:`~aggregator.accountant.blanket.MAX_N` reports, that of ``MAX_N`` (the
        largest the bound is validated for; fewer reports: pessimistic)."""
        cached = self._per_release.get(n)
        if cached is None:
            record = amplify_spec(self.spec, n=min(n, MAX_N), delta=self.delta)
            cached = (record.epsilon_central, record.epsilon_central_generic)
            self._per_release[n] = cached
        return cached

    per_batch = per_release  # the old name

    def compute(self, snapshot: LedgerSnapshot) -> PrivacyLevel:
        """The numbers of ``snapshot`` (:meth:`snapshot`); thread-safe for one caller."""
        central: dict[str, float | None] = {}
        generic: dict[str, float | None] = {}
        for label, n in (("smallest", snapshot.smallest), ("latest", snapshot.latest)):
            blanket, clone = (None, None) if n is None else self.per_release(n)
            central[label], generic[label] = blanket, clone
        rounds = dict(snapshot.rounds)
        total = epsilon_total_rounds(self.spec, rounds, delta=self.delta) if rounds else None
        periods = {
            label: epsilon_total_rounds(self.spec, dict(counts), delta=self.delta)
            if counts
            else None
            for label, counts in snapshot.periods
        }
        return PrivacyLevel(
            epsilon_periods=periods,
            epsilon_central=central,
            epsilon_central_generic=generic,
            epsilon_total=total,
            batches=snapshot.participations,
            sizes={"smallest": snapshot.smallest, "latest": snapshot.latest},
            generation=snapshot.generation,
            releases=snapshot.releases,
        )

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
                [b.round, b.shard, bid.hex(), b.size]
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
