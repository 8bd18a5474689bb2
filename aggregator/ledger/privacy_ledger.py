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
batch without a manifest is a participation of its own per batch (*Where releases come
from*, in :mod:`aggregator.ledger.participations`). Items 1 and 2
are checked by exact enumeration in tests/aggregator/test_release_enumeration.py.

The records, their compaction and their dates: :mod:`aggregator.ledger.participations`
(*Where releases come from*, *Compaction*).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from aggregator.accountant import amplify_spec
from aggregator.accountant.blanket import MAX_N
from aggregator.accountant.history import SIGNIFICANT_BITS, accounting_size, epsilon_total_rounds
from aggregator.ledger.levels import LedgerSnapshot, PrivacyLevel
from aggregator.ledger.participations import Participations
from aggregator.ledger.records import ID_BYTES, MAX_ROUND

__all__ = [
    "ID_BYTES",
    "MAX_ROUND",
    "SIGNIFICANT_BITS",
    "PrivacyLedger",
    "accounting_size",
]


class PrivacyLedger(Participations):
    """Releases recorded, and the central privacy they amount to (module docstring; the
    records: :class:`~aggregator.ledger.participations.Participations`)."""

    # -- reading ----------------------------------------------------------------------------

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
