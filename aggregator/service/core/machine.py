"""The aggregator's state and the decisions that change it, with no I/O: what is applied,
what is refused, what is remembered.

Everything the aggregator decides about a batch or a manifest lives here, in
:class:`AggregatorCore`, as pure code driven by explicit inputs (the sealed payload, the time, the
sums of its records); the MQTT session, the files and the timers (:mod:`aggregator.service.service`,
:mod:`aggregator.service.session`, :mod:`aggregator.service.checkpoint_files`) are shells around
it, and its terms (:class:`~aggregator.service.core.rules.CoreRules`, what a check concludes) are
:mod:`aggregator.service.core.rules`'. Like the shuffler's :mod:`broker.core.machine`, it is
property-tested (tests/aggregator/test_core.py): any interleaving of deliveries, redeliveries,
forged and replayed
batches, crashes and restarts from the last durable checkpoint applies each genuine batch exactly
once and never a forged one.

Checks, in order (:meth:`AggregatorCore.check`)
-----------------------------------------------
1. The topic's shard has a trusted key (``unknown_shard``), and the signature verifies under
   it (:class:`~edge.batch_auth.BatchVerifier`), before anything of the message is read:
   ``bad_length``, ``bad_signature``. One signed by the key announced and not trusted yet
   (:meth:`AggregatorCore.announce`) is ``untrusted_key`` (``unknown_shard`` on a shard of
   an announced layout) and kept, as are verified batches refused as ``wrong_shard`` or
   ``stale_round`` (:mod:`aggregator.service.core.quarantine`, replayed by
   :mod:`aggregator.service.core.replay`).
2. The wire format (:func:`~aggregator.service.core.batch_codec.decode_batch_arrays`):
   ``bad_version``, ``bad_kind``, ``bad_count``, ``bad_field``.
3. The spec and size: ``fingerprint_mismatch``, ``empty``, ``below_min_batch``.
4. The round: ``wrong_shard`` (one its shard's layout does not serve), ``stale_round``
   (below the retained horizon, whose ids may be forgotten), ``future_round`` (more than
   ``retention_rounds`` ahead of the clock's round).
5. The batch id: one applied before is a duplicate (ignored, acknowledged).
6. The records (:meth:`AggregatorCore.partial`): ``z_out_of_range``,
   ``seed_out_of_range``.

Manifests
---------
Each release's signed manifest is checked like a batch (signature under its shard's key,
wire format, spec, round) and reconciled against the batches
(:mod:`aggregator.service.core.manifests`): missing reports counted after a grace period, unlisted
batches counted, a manifest that disagrees rejected as ``manifest_mismatch``.

Estimates over time
-------------------
With a round length, every applied batch is also added to its round's row of the
per-round series (:class:`~aggregator.series.core.Series`, :attr:`AggregatorCore.series`):
the round is the batch's release round. :meth:`AggregatorCore.content` takes the series'
changes with the checkpoint's content (its ``series_deltas``, for the series file written
before it) and records the newest one's sequence number (``series_seq``). Without a round
length there is no series (``series`` is ``None``).

Acknowledgements across checkpoint generations: :mod:`aggregator.service.core.acks`.
"""

from __future__ import annotations

from dataclasses import replace

from aggregator.estimation.estimators import AggregateState
from aggregator.ledger.privacy_ledger import PrivacyLedger
from aggregator.series.core import Delta
from aggregator.service.core.accounting import (
    Entries,
    Sources,
    account_batch,
    account_release,
    charge_unplaced,
)
from aggregator.service.core.batch_codec import decode_batch_arrays
from aggregator.service.core.checkpoint import CHECKPOINT_VERSION, Checkpoint, Counters
from aggregator.service.core.checkpoint_migration import migrate_rounds, numbered_rounds_problem
from aggregator.service.core.keys import TrustedKeys
from aggregator.service.core.manifests import Loss, Reconciler
from aggregator.service.core.memory import BatchMemory, ShardStats
from aggregator.service.core.quarantine import Entry, Kind, Quarantine
from aggregator.service.core.rules import (
    ACCOUNTED_REFUSALS,
    CoreRules,
    Outcome,
    RejectedError,
    Verified,
)
from aggregator.service.core.silence import SilenceWatch
from edge.batch_auth import BatchAuthError
from edge.codec import CodecError, decode_manifest, round_seconds_of
from edge.errors import ReportError
from edge.rounds import ClockError, round_of

__all__ = ["AggregatorCore", "check_resumable"]


class AggregatorCore:
    """The state the aggregator keeps and the rules that change it (module docs).

    ``dirty`` is set by every change a checkpoint must hold and cleared by
    :meth:`content`; ``changed`` by every change that anything published must show, and
    cleared by the shell that publishes.
    """

    def __init__(self, rules: CoreRules, *, delta: float) -> None:
        self.rules = rules
        self.spec = rules.spec
        self.delta = delta
        self.keys = TrustedKeys(rules.trusted, rules.deployment)
        self.announced: TrustedKeys | None = None
        """The anchor announced, not trusted yet: what it signs is kept, not applied."""
        self.quarantine = Quarantine()
        self.shards: dict[str, ShardStats] = {}
        """Per shard label (the trusted ones only: a bounded set)."""
        self.reconciler = Reconciler(grace=rules.manifest_grace, min_batch=rules.min_batch)
        self.silence = SilenceWatch(rules.silent_shard_rounds, unit=rules.unit)
        """Which shard of the layout in force released nothing for a while (not in the
        checkpoint: it starts afresh with each run)."""
        self.state = AggregateState(rules.spec)
        self.series = rules.new_series()
        """Each round's own sums (module docs, *Estimates over time*)."""
        self.series_kept = True
        """Whether a file keeps the series' changes (a checkpoint); if not, they are
        forgotten as they come."""
        self.counters = Counters()
        self.memory = BatchMemory(rules.retention_rounds, rules.round_seconds)
        self.ledger = PrivacyLedger(rules.spec, delta=delta, round_seconds=rules.round_seconds)
        self.smallest_batch: int | None = None
        self.latest_batch: int | None = None
        self.last_batch_timestamp: float | None = None
        self.dirty = False
        self.changed = True

    def trust(self, anchor: str) -> None:
        """Verify batches under ``anchor`` from now on (the pin in force:
        :mod:`aggregator.service.trust`)."""
        self.keys = TrustedKeys(anchor, self.rules.deployment)
        self.rules = replace(self.rules, trusted=anchor)
        if self.announced is not None and self.announced.anchor == anchor:
            self.announced = None
        self._touch()

    def announce(self, anchor: str | None) -> None:
        """The deployment announced ``anchor`` (``None``: the trusted one): kept till trusted."""
        if anchor is None or anchor == self.rules.trusted:
            self.announced = None
        else:
            self.announced = TrustedKeys(anchor, self.rules.deployment)

    def _open(self, payload: bytes, shard: str | None, *, manifest: bool) -> memoryview:
        verifier = self.keys.verifier(shard)
        reason = "unknown_shard"
        if verifier is not None:
            try:
                return verifier.open_manifest(payload) if manifest else verifier.open(payload)
            except BatchAuthError as exc:
                reason = exc.reason
        announced = None if self.announced is None else self.announced.verifier(shard)
        if announced is not None and reason in ("unknown_shard", "bad_signature"):
            try:
                announced.open_manifest(payload) if manifest else announced.open(payload)
            except BatchAuthError:
                pass
            else:  # signed by the key announced, not yet trusted: kept
                raise RejectedError(
                    "unknown_shard" if verifier is None else "untrusted_key", keep=True
                )
        raise RejectedError(reason)

    def _lengths(self, message: memoryview) -> tuple[int, int]:
        """The round length of a decoded batch or manifest
        (:mod:`aggregator.service.core.rules`, *Rounds are times*), and the one that dates
        a batch in the privacy ledger while no manifest lists it: the length it carries
        (version 2), else the announced one (its start was computed with it), else 0:
        undated, counted in every period."""
        carried = round_seconds_of(message)
        return carried or self.rules.unit, carried or (self.rules.round_seconds or 0)

    def _check_round(
        self, shard: str | None, round_: int, length: int, size: int, now: float | None
    ) -> None:
        start = round_ * length
        # a layout's from_round counts rounds of the announced length (edge.shards)
        if not self.keys.serves(shard, start // self.rules.unit):
            raise RejectedError("wrong_shard", size, keep=True)
        if self.memory.stale(start):
            raise RejectedError("stale_round", size, keep=True)
        if self._future(start, length, now):
            raise RejectedError("future_round", size)

    # -- the checks ------------------------------------------------------------------------

    def check(
        self, payload: bytes, *, now: float | None, shard: str | None = None
    ) -> Verified | None:
        """The checks 1-5 of the module docs for a batch that came on ``shard``'s topic
        (``None``: the unsharded topic): a :class:`Verified` batch to apply, ``None`` for
        one already applied; :class:`RejectedError` otherwise. ``now`` is the Unix time of
        the ``future_round`` check (``None``: no clock to judge by)."""
        inner = self._open(payload, shard, manifest=False)
        try:
            fingerprint, round_, batch_id, seeds, z = decode_batch_arrays(inner)
        except CodecError as exc:
            raise RejectedError(exc.reason) from None
        length, dating = self._lengths(inner)
        size = int(seeds.size)
        if fingerprint != self.spec.fingerprint_int:
            raise RejectedError("fingerprint_mismatch", size)
        if size == 0:
            raise RejectedError("empty")
        if size < self.rules.min_batch:
            # released all the same (signed): accounted at its real size, like any batch
            self._account_batch(round_ * length, shard, batch_id, size, dating)
            self._touch()
            raise RejectedError("below_min_batch", size)
        try:
            self._check_round(shard, round_, length, size, now)
        except RejectedError as rejected:
            if rejected.reason in ACCOUNTED_REFUSALS:  # released all the same: accounted
                self._account_batch(round_ * length, shard, batch_id, size, dating)
                self._touch()
            raise
        if batch_id in self.memory:
            return None
        return Verified(batch_id, round_, seeds, z, shard, length, dating)

    def _future(self, start: int, length: int, now: float | None) -> bool:
        """Whether a round of ``length`` starting at ``start`` begins more than the horizon
        after the clock's round of that length."""
        if self.rules.round_seconds is None or now is None:
            return False
        try:
            current = round_of(now, length) * length
        except ClockError:  # a clock that is not set cannot judge
            return False
        return start > current + self.memory.horizon

    def partial(self, batch: Verified) -> AggregateState:
        """The sums of ``batch``'s records (check 6): :class:`RejectedError` for a record outside
        the spec. ``O(size * d)``, numpy: the shell may run it in a thread."""
        partial = AggregateState(self.spec)
        try:
            partial.add(batch.seeds, batch.z)
        except ReportError as exc:
            raise RejectedError(exc.reason, batch.size) from None
        return partial

    # -- the changes -----------------------------------------------------------------------

    def apply(self, batch: Verified, partial: AggregateState, *, now: float) -> bool:
        """Fold ``partial`` (:meth:`partial` of ``batch``) into the state, with its id:
        ``True``; ``False`` if the id was applied meanwhile (the shell may have awaited
        since :meth:`check`), :class:`RejectedError` (``stale_round``) if the horizon moved
        past its round. Nothing is counted for ``False``: see :meth:`duplicate`."""
        if batch.batch_id in self.memory:
            return False
        start = batch.start
        if self.memory.stale(start):  # released all the same: accounted
            self._account_batch(start, batch.shard, batch.batch_id, batch.size, batch.dating)
            self._touch()
            raise RejectedError("stale_round", batch.size, keep=True)
        self.state.merge(partial)
        self.memory.remember(batch.batch_id, start, batch.round_seconds)
        size = partial.n
        if self.series is not None:
            self.series.add(
                batch.round, partial, batch_size=size, round_seconds=batch.round_seconds
            )
            if not self.series_kept:  # no file: nothing to keep for
                self.series.take()
                self.series.committed(self.series.seq)
        self.counters.reports += size
        self.counters.batches += 1
        self.smallest_batch = (
            size if self.smallest_batch is None else min(self.smallest_batch, size)
        )
        self.latest_batch = size
        self.last_batch_timestamp = now
        self._account_batch(start, batch.shard, batch.batch_id, size, batch.dating)
        if batch.shard is not None:
            self.shards.setdefault(batch.shard, ShardStats()).add(size)
            self.silence.released(batch.shard, start)
        agrees = self.reconciler.batch(
            batch.batch_id, shard=batch.shard, round_=start, count=size, now=now
        )
        if not agrees:
            self.counters.manifests_rejected["manifest_mismatch"] = (
                self.counters.manifests_rejected.get("manifest_mismatch", 0) + 1
            )
        oldest = self.memory.floor
        if oldest is not None:
            self.reconciler.forget_before(oldest)
        self._touch()
        return True

    # -- manifests -------------------------------------------------------------------------

    def manifest(self, payload: bytes, *, now: float, shard: str | None = None) -> Outcome:
        """Check and reconcile one sealed manifest: ``"accepted"``, ``"duplicate"`` or the
        reason it is rejected (counted in ``counters.manifests_rejected``; one the
        quarantine keeps is kept)."""
        try:
            outcome = self.manifest_checked(payload, now=now, shard=shard)
        except RejectedError as rejected:
            rejects = self.counters.manifests_rejected
            rejects[rejected.reason] = rejects.get(rejected.reason, 0) + 1
            if rejected.keep:
                self.keep(rejected, payload, shard=shard, kind="manifest", now=now)
            self._touch()
            return rejected.reason
        if outcome == "duplicate":
            self.counters.manifests_duplicate += 1
        self._touch()
        return outcome

    def manifest_checked(self, payload: bytes, *, now: float, shard: str | None) -> Outcome:
        """:meth:`manifest` without the counting: :class:`RejectedError` if refused."""
        inner = self._open(payload, shard, manifest=True)
        try:
            fingerprint, round_, release_id, entries, sources = decode_manifest(inner)
        except CodecError as exc:
            raise RejectedError(exc.reason) from None
        if fingerprint != self.spec.fingerprint_int:
            raise RejectedError("fingerprint_mismatch")
        length, _ = self._lengths(inner)
        start = round_ * length
        try:
            self._check_round(shard, round_, length, 0, now)
        except RejectedError as rejected:
            if rejected.reason in ACCOUNTED_REFUSALS:  # released all the same
                self._account_release(shard, start, release_id, entries, sources)
            raise
        outcome = self.reconciler.manifest(
            release_id,
            entries,
            shard=shard,
            round_=start,
            now=now,
            known=self.memory.__contains__,
        )
        if outcome == "manifest_mismatch":
            # verified (signed), so released: charged all the same, pessimistically
            charge_unplaced(self.ledger, self.rules.min_batch, entries)
            raise RejectedError(outcome)
        if outcome == "accepted":
            self._account_release(shard, start, release_id, entries, sources)
            self.silence.released(shard, start)
        return outcome

    def _account_batch(
        self, start: int, shard: str | None, batch_id: bytes, size: int, dating: int
    ) -> None:
        """The ledger keys a release by its round's start
        (:mod:`aggregator.service.core.rules`, *Rounds are times*), and dates a batch no
        manifest lists by ``dating`` (:meth:`_lengths`)."""
        account_batch(
            self.ledger,
            self.counters,
            round_=start,
            shard=shard,
            batch_id=batch_id,
            size=size,
            seconds=dating,
        )

    def _account_release(
        self, shard: str | None, start: int, release_id: bytes, entries: Entries, sources: Sources
    ) -> None:
        account_release(
            self.ledger, self.counters, min_batch=self.rules.min_batch, shard=shard,
            round_=start, release_id=release_id, entries=entries, sources=sources,
        )  # fmt: skip

    def compact_ledger(self) -> None:
        """Fold the ledger's rounds that started ``ledger_lag_rounds`` rounds (of the
        announced length) before the newest round applied (their cost kept, their ids
        dropped: the ledger stays small). A record that arrives later for such a round is
        counted again, pessimistically."""
        newest = self.memory.newest_start
        lag = self.rules.ledger_lag_rounds * self.memory.unit
        if newest is not None and newest > lag:
            self.ledger.compact(newest - lag)

    def reconcile(self, now: float) -> list[Loss]:
        """Count what the grace period did not bring (:meth:`Reconciler.reconcile`)."""
        before = self.reconciler.counts.to_json()
        losses = self.reconciler.reconcile(now, self.memory.__contains__)
        if losses or self.reconciler.counts.to_json() != before:
            self._touch()
        return losses

    def handle(self, payload: bytes, *, now: float, shard: str | None = None) -> Outcome:
        """Every check and the change in one synchronous call (the shell splits it to run
        the records' sums in a thread): ``"applied"``, ``"duplicate"`` or the reason."""
        try:
            batch = self.check(payload, now=now, shard=shard)
            if batch is not None and self.apply(batch, self.partial(batch), now=now):
                return "applied"
        except RejectedError as rejected:
            return self.reject(rejected, payload, shard=shard, now=now)
        return self.duplicate()

    def reject(
        self,
        rejected: RejectedError,
        payload: bytes | None = None,
        *,
        shard: str | None = None,
        now: float = 0.0,
    ) -> Outcome:
        """Count ``rejected`` by its reason (and its verified reports); keep ``payload``
        in the quarantine if the refusal is one an operator can fix."""
        reason = rejected.reason
        self.counters.rejected[reason] = self.counters.rejected.get(reason, 0) + 1
        if rejected.reports:
            reports = self.counters.rejected_reports
            reports[reason] = reports.get(reason, 0) + rejected.reports
        if rejected.keep and payload is not None:
            self.keep(rejected, payload, shard=shard, kind="batch", now=now)
        self._touch()
        return reason

    def keep(self, rejected: RejectedError, payload: bytes, *, shard: str | None, kind: Kind,
             now: float) -> None:  # fmt: skip
        """Keep a verified message refused for ``rejected.reason`` (its ``keep``)."""
        entry = Entry(kind=kind, shard=shard, reason=rejected.reason, at=now, payload=payload)
        if self.quarantine.add(entry):
            self._touch()

    def duplicate(self) -> Outcome:
        self.counters.duplicates += 1
        self._touch()
        return "duplicate"

    def unacknowledged(self, reason: str, count: int) -> None:
        """``count`` batches left without a PUBACK for ``reason`` (the broker redelivers)."""
        if count <= 0:
            return
        unacked = self.counters.unacknowledged
        unacked[reason] = unacked.get(reason, 0) + count
        self._touch()

    def _touch(self) -> None:
        self.dirty = True
        self.changed = True

    # -- checkpoints -----------------------------------------------------------------------

    def content(self, *, generation: int, written_at: float) -> Checkpoint:
        """What a checkpoint holds, as copies (O(d) for the sums, O(retained ids) for the
        ids), to serialise later in another thread, with the series' changes not yet
        committed (module docs, *Estimates over time*; rows past their retention rolled up
        at ``written_at`` first); clears ``dirty``."""
        self.dirty = False
        self.compact_ledger()
        deltas: tuple[Delta, ...] = ()
        if self.series is not None:
            self.series.expire(written_at)
            deltas = tuple(self.series.take())
        return Checkpoint(
            version=CHECKPOINT_VERSION,
            generation=generation,
            fingerprint=self.spec.fingerprint,
            deployment=self.rules.deployment,
            delta=self.delta,
            trusted=self.rules.trusted,
            state=self.state.copy(),
            batch_rounds={r: list(ids) for r, ids in self.memory.by_round().items()},
            newest_length=None if self.memory.newest_start is None else self.memory.newest_length,
            forgotten=None
            if self.memory.first is None or self.memory.high is None
            else (self.memory.first, self.memory.high),
            retention_rounds=self.rules.retention_rounds,
            counters=self.counters.copy(),
            smallest_batch=self.smallest_batch,
            latest_batch=self.latest_batch,
            batch_sizes={int(n): int(c) for n, c in self.ledger.sizes.items()},
            last_batch_timestamp=self.last_batch_timestamp,
            written_at=written_at,
            shards={label: stats.to_json() for label, stats in sorted(self.shards.items())},
            reconciliation=self.reconciler.to_json(),
            series_seq=None if self.series is None else self.series.seq,
            series_deltas=deltas,
        )

    def restore(self, checkpoint: Checkpoint) -> None:
        """Resume from ``checkpoint`` (already checked: :func:`check_resumable`); the series
        starts empty, for the shell to replay its file into
        (:func:`aggregator.service.series_file.recover_series`)."""
        self.state = checkpoint.state.copy()
        self.series = self.rules.new_series()
        unit = self.rules.unit
        if checkpoint.version < CHECKPOINT_VERSION:
            # rounds are numbers there, of the length announced then: the one announced
            # now, as check_resumable made sure of
            checkpoint = migrate_rounds(checkpoint, unit)
        self.memory.restore(
            checkpoint.batch_rounds, checkpoint.newest_length or unit, checkpoint.forgotten
        )
        self.counters = checkpoint.counters.copy()
        self.smallest_batch = checkpoint.smallest_batch
        self.latest_batch = checkpoint.latest_batch
        self.ledger.restore(checkpoint.batch_sizes, checkpoint.latest_batch)
        self.last_batch_timestamp = checkpoint.last_batch_timestamp
        self.shards = {
            label: ShardStats(
                batches=int(stats["batches"] or 0),
                reports=int(stats["reports"] or 0),
                smallest=stats["smallest"],
                latest=stats["latest"],
            )
            for label, stats in checkpoint.shards.items()
        }
        if checkpoint.reconciliation is not None:
            self.reconciler = Reconciler.from_json(
                checkpoint.reconciliation,
                grace=self.rules.manifest_grace,
                min_batch=self.rules.min_batch,
            )
        self.dirty = checkpoint.version != CHECKPOINT_VERSION  # rewrite an older version
        self.changed = True


def check_resumable(core: AggregatorCore, checkpoint: Checkpoint) -> str | None:
    """Why ``core`` must not resume from ``checkpoint`` (a one-line problem, naming the
    field), or ``None``. (The batch key is the trust file's to decide:
    :func:`aggregator.service.trust.decide`.)"""
    spec = core.spec
    if checkpoint.fingerprint != spec.fingerprint:
        return (
            f"is for spec {checkpoint.fingerprint}, not {spec.fingerprint}; move it away or "
            "run with its spec"
        )
    if checkpoint.state.spec.canonical() != spec.canonical():
        return "field 'state' is for another spec"
    if checkpoint.version < CHECKPOINT_VERSION:
        return numbered_rounds_problem(checkpoint, core.rules.unit)
    return None
