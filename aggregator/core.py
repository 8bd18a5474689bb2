"""The aggregator's rules, with no I/O: what is applied, what is refused, what is remembered.

Everything the aggregator decides about a batch lives here, as pure code driven by explicit
inputs (the sealed payload, the time, the sums of its records); the MQTT session, the
lease, the HTTP endpoint, the files and the timers (:mod:`aggregator.service`,
:mod:`aggregator.session`, :mod:`aggregator.checkpoint`) are shells around it. Like the
shuffler's :mod:`broker.core`, it is property-tested (tests/aggregator/test_core.py): any
interleaving of deliveries, redeliveries, forged and replayed batches, crashes and
restarts from the last durable checkpoint applies each genuine batch exactly once and
never a forged one.

Checks, in order (:meth:`AggregatorCore.check`)
-----------------------------------------------
1. The signature, under the trusted key (:class:`~edge.batch_auth.BatchVerifier`), before
   anything of the message is read: ``bad_length``, ``bad_signature``.
2. The wire format (:func:`~aggregator.batch_codec.decode_batch_arrays`): ``bad_version``,
   ``bad_kind``, ``bad_count``, ``bad_field``.
3. The spec and size: ``fingerprint_mismatch``, ``empty``, ``below_min_batch``.
4. The round: ``stale_round`` (below the retained horizon, whose ids may be forgotten),
   ``future_round`` (more than ``retention_rounds`` ahead of the clock's round).
5. The batch id: one applied before is a duplicate (ignored, acknowledged).
6. The records (:meth:`AggregatorCore.partial`): ``z_out_of_range``,
   ``seed_out_of_range``.

Batch-id memory and the retained horizon
----------------------------------------
The ids of applied batches are kept per round for the newest ``retention_rounds`` rounds
applied (:class:`BatchMemory`): a replay of a retained round is a duplicate, a batch of an
older round is ``stale_round``. Memory follows the traffic of the window, not the age of
the deployment.

Acknowledgements across checkpoint generations (:class:`AckGenerations`)
------------------------------------------------------------------------
A delivered batch is acknowledged to the broker only once *two* durable checkpoint
generations hold it: the PUBACKs of the batches in generation ``N`` are sent once
generation ``N + 1`` is durable. If the newest file is found damaged, recovery falls back
to the previous generation, and every batch it lacks is one the broker still holds
unacknowledged and redelivers: nothing lost, nothing doubled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from aggregator.batch_codec import decode_batch_arrays
from aggregator.checkpoint import CHECKPOINT_VERSION, Checkpoint, Counters
from aggregator.estimators import AggregateState
from aggregator.privacy_ledger import PrivacyLedger
from edge.batch_auth import BatchAuthError, BatchVerifier
from edge.codec import CodecError
from edge.errors import ReportError
from edge.rounds import ClockError, check_round_seconds, round_of
from edge.spec import MechanismSpec

__all__ = [
    "AckGenerations",
    "AggregatorCore",
    "BatchMemory",
    "CoreRules",
    "Outcome",
    "RejectedError",
    "Verified",
]

Outcome = Literal["applied", "duplicate"] | str
"""What :meth:`AggregatorCore.handle` did: ``"applied"``, ``"duplicate"`` or the reason a
batch was rejected (:data:`aggregator.metrics.REJECT_REASONS`)."""


class RejectedError(Exception):
    """A batch refused for ``reason``; ``reports`` is its record count when its signature
    verified (an unverified count means nothing), else 0."""

    def __init__(self, reason: str, reports: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.reports = reports


@dataclass(frozen=True, kw_only=True)
class CoreRules:
    """What a batch must satisfy (module docs)."""

    spec: MechanismSpec
    deployment: str
    batch_public_key: str
    min_batch: int
    retention_rounds: int
    round_seconds: int | None = None
    """The announced round length; ``None`` (a spec file without it) skips the
    ``future_round`` check: there is no clock to judge by."""

    def __post_init__(self) -> None:
        BatchVerifier(self.batch_public_key, self.deployment)  # CocoError if malformed
        if self.min_batch < 1:
            raise ValueError(f"min_batch must be >= 1, got {self.min_batch}")
        if self.retention_rounds < 1:
            raise ValueError(f"retention_rounds must be >= 1, got {self.retention_rounds}")
        if self.round_seconds is not None:
            check_round_seconds(self.round_seconds)


@dataclass(frozen=True)
class Verified:
    """A batch that passed every check but the records' (:meth:`AggregatorCore.partial`)."""

    batch_id: bytes
    round: int
    seeds: npt.NDArray[np.uint32]
    z: npt.NDArray[np.uint16]

    @property
    def size(self) -> int:
        return int(self.seeds.size)


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
        self.verifier = BatchVerifier(rules.batch_public_key, rules.deployment)
        self.state = AggregateState(rules.spec)
        self.counters = Counters()
        self.memory = BatchMemory(rules.retention_rounds)
        self.ledger = PrivacyLedger(rules.spec, delta=delta)
        self.smallest_batch: int | None = None
        self.latest_batch: int | None = None
        self.last_batch_timestamp: float | None = None
        self.dirty = False
        self.changed = True

    def trust(self, key: str) -> None:
        """Verify batches under ``key`` from now on (the pin in force: :mod:`aggregator.trust`)."""
        self.rules = replace(self.rules, batch_public_key=key)
        self.verifier = BatchVerifier(key, self.rules.deployment)
        self._touch()

    # -- the checks ------------------------------------------------------------------------

    def check(self, payload: bytes, *, now: float | None) -> Verified | None:
        """The checks 1-5 of the module docs: a :class:`Verified` batch to apply, ``None``
        for one already applied; :class:`RejectedError` otherwise. ``now`` is the Unix time of
        the ``future_round`` check (``None``: no clock to judge by)."""
        try:
            inner = self.verifier.open(payload)
        except BatchAuthError as exc:
            raise RejectedError(exc.reason) from None
        try:
            fingerprint, round_, batch_id, seeds, z = decode_batch_arrays(inner)
        except CodecError as exc:
            raise RejectedError(exc.reason) from None
        size = int(seeds.size)
        if fingerprint != self.spec.fingerprint_int:
            raise RejectedError("fingerprint_mismatch", size)
        if size == 0:
            raise RejectedError("empty")
        if size < self.rules.min_batch:
            raise RejectedError("below_min_batch", size)
        if self.memory.stale(round_):
            raise RejectedError("stale_round", size)
        if self._future(round_, now):
            raise RejectedError("future_round", size)
        if batch_id in self.memory:
            return None
        return Verified(batch_id, round_, seeds, z)

    def _future(self, round_: int, now: float | None) -> bool:
        round_seconds = self.rules.round_seconds
        if round_seconds is None or now is None:
            return False
        try:
            current = round_of(now, round_seconds)
        except ClockError:  # a clock that is not set cannot judge
            return False
        return round_ > current + self.rules.retention_rounds

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
        if self.memory.stale(batch.round):
            raise RejectedError("stale_round", batch.size)
        self.state.merge(partial)
        self.memory.remember(batch.batch_id, batch.round)
        size = partial.n
        self.counters.reports += size
        self.counters.batches += 1
        self.smallest_batch = (
            size if self.smallest_batch is None else min(self.smallest_batch, size)
        )
        self.latest_batch = size
        self.last_batch_timestamp = now
        self.ledger.record(size)
        self._touch()
        return True

    def handle(self, payload: bytes, *, now: float) -> Outcome:
        """Every check and the change in one synchronous call (the shell splits it to run
        the records' sums in a thread): ``"applied"``, ``"duplicate"`` or the reason."""
        try:
            batch = self.check(payload, now=now)
            if batch is not None and self.apply(batch, self.partial(batch), now=now):
                return "applied"
        except RejectedError as rejected:
            return self.reject(rejected)
        return self.duplicate()

    def reject(self, rejected: RejectedError) -> Outcome:
        """Count ``rejected`` by its reason (and its verified reports)."""
        reason = rejected.reason
        self.counters.rejected[reason] = self.counters.rejected.get(reason, 0) + 1
        if rejected.reports:
            reports = self.counters.rejected_reports
            reports[reason] = reports.get(reason, 0) + rejected.reports
        self._touch()
        return reason

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
        ids), to serialise later in another thread; clears ``dirty``."""
        self.dirty = False
        return Checkpoint(
            version=CHECKPOINT_VERSION,
            generation=generation,
            fingerprint=self.spec.fingerprint,
            deployment=self.rules.deployment,
            delta=self.delta,
            batch_public_key=self.rules.batch_public_key,
            state=self.state.copy(),
            batch_rounds={r: list(ids) for r, ids in self.memory.by_round().items()},
            retention_rounds=self.rules.retention_rounds,
            counters=self.counters.copy(),
            smallest_batch=self.smallest_batch,
            latest_batch=self.latest_batch,
            batch_sizes={int(n): int(c) for n, c in self.ledger.sizes.items()},
            last_batch_timestamp=self.last_batch_timestamp,
            written_at=written_at,
        )

    def restore(self, checkpoint: Checkpoint) -> None:
        """Resume from ``checkpoint`` (already checked: :func:`check_resumable`)."""
        self.state = checkpoint.state.copy()
        self.memory.restore(checkpoint.batch_rounds)
        self.counters = checkpoint.counters.copy()
        self.smallest_batch = checkpoint.smallest_batch
        self.latest_batch = checkpoint.latest_batch
        self.ledger.restore(checkpoint.batch_sizes, checkpoint.latest_batch)
        self.last_batch_timestamp = checkpoint.last_batch_timestamp
        self.dirty = checkpoint.version != CHECKPOINT_VERSION  # rewrite an older version
        self.changed = True


def check_resumable(core: AggregatorCore, checkpoint: Checkpoint) -> str | None:
    """Why ``core`` must not resume from ``checkpoint`` (a one-line problem, naming the
    field), or ``None``. (The batch key is the trust file's to decide:
    :func:`aggregator.trust.decide`.)"""
    spec = core.spec
    if checkpoint.fingerprint != spec.fingerprint:
        return (
            f"is for spec {checkpoint.fingerprint}, not {spec.fingerprint}; move it away or "
            "run with its spec"
        )
    if checkpoint.state.spec.canonical() != spec.canonical():
        return "field 'state' is for another spec"
    return None


T = TypeVar("T")


class AckGenerations(Generic[T]):
    """Which deliveries may be acknowledged, by checkpoint generation (module docs).

    ``T`` is whatever the shell needs to send a PUBACK (a connection and a message id).
    A delivery is *open* until a checkpoint snapshot covers it, then *writing* until that
    generation is durable, then *held* until the next generation is durable, when
    :meth:`written` hands it out to be acknowledged.
    """

    def __init__(self) -> None:
        self.open: list[T] = []
        self.writing: list[T] = []
        self.held: list[T] = []
        self.newest_unacknowledged = False
        """Whether the newest durable generation holds deliveries never acknowledged (kept
        when a lost connection drops them): a service whose session was taken over rolls
        its files back to the previous generation, so that the new holder, to whom the
        broker redelivers them, is the only one to count them."""

    def __len__(self) -> int:
        return len(self.open) + len(self.writing) + len(self.held)

    def delivered(self, token: T) -> None:
        self.open.append(token)

    def snapshot(self) -> None:
        """A checkpoint snapshot was taken: what is open goes into that generation."""
        self.writing.extend(self.open)
        self.open = []

    def written(self) -> list[T]:
        """The snapshot's generation is durable: return what the previous generation held
        (acknowledge it now); the new one's deliveries wait for the next generation."""
        ready, self.held, self.writing = self.held, self.writing, []
        self.newest_unacknowledged = bool(self.held)
        return ready

    def failed(self) -> None:
        """The snapshot's generation could not be written: its deliveries are open again."""
        self.open = self.writing + self.open
        self.writing = []

    def drop(self, lost: Callable[[T], bool]) -> int:
        """Forget the deliveries for which ``lost`` holds (their connection is gone: the
        broker redelivers them); how many."""
        count = 0
        for name in ("open", "writing", "held"):
            tokens: list[T] = getattr(self, name)
            kept = [t for t in tokens if not lost(t)]
            count += len(tokens) - len(kept)
            setattr(self, name, kept)
        return count

    def take_all(self) -> list[T]:
        """Everything, to acknowledge at once (a service without checkpoints)."""
        every, self.open, self.writing, self.held = self.held + self.writing + self.open, [], [], []
        return every

    def waiting(self) -> bool:
        """Whether a new generation would let PUBACKs out."""
        return bool(self.held or self.writing or self.open)
