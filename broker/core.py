"""The shuffler's state machine: rounds, pools, duplicate state and release, with no I/O.

Everything the shuffling bridge decides lives here, as pure code driven by explicit inputs
(the time, a report's fields, a keyed token of its sender) and by injected randomness (a
uniform shuffle, fresh batch ids, the batch signature). The MQTT transports and the durable
log (:mod:`broker.shuffler`, :mod:`broker.store`) are thin shells around it.

Event sourcing
--------------
Every change of state is an *effect* (:data:`Effect`): a small immutable record that
:meth:`ShufflerCore.apply` folds into the state, deterministically. The live service asks
the core what to do (:meth:`ShufflerCore.accept`, :meth:`ShufflerCore.tick`), writes the
returned effects to its write-ahead log, then applies them; on start it replays the log
through :meth:`ShufflerCore.apply` and arrives at the same state, pools, duplicate tokens
and unacknowledged batches (with their exact bytes) included. :meth:`ShufflerCore.snapshot`
gives a short list of effects that rebuilds the current state, to compact the log.

Rounds (docs/protocol.md, "Rounds")
-----------------------------------
Round ``r`` is Unix time ``[r L, (r + 1) L)`` with ``L = round_seconds`` from the
announcement. With ``S = max_skew`` seconds of tolerated clock error and ``G =
late_seconds`` of tolerated delivery delay, at time ``now`` the core accepts exactly the
rounds

    floor((now - S - G) / L)  <=  r  <=  floor((now + S) / L),   and  r > closed_through,

and rejects the others as ``round_too_old`` / ``round_in_future`` without changing any
state: no report, however hostile its round number, opens, closes or evicts a round.

Round ``r`` *ends* once ``now - S >= (r + 1) L``: its pool is released (below). A report of
an ended round that arrives within ``G`` (queued at the broker while the shuffler was away,
a device that retried for a while) is still accepted, into a fresh pool of that round,
released or carried at the next tick. Round ``r`` is *closed* once ``now - S - G >= (r + 1)
L``: its duplicate tokens are forgotten, which is safe because no report of a closed round
is accepted again: ``closed_through`` only grows and is part of the durable state, so a
restart, or a clock stepped backwards, cannot reopen a round. The tokens kept are those of
about ``(2 S + G) / L + 2`` rounds.

Release
-------
A closed round's pool is released whole, as one batch, split into near-equal slices only
above ``max_batch`` (each slice >= ``min_batch`` since ``max_batch >= 2 min_batch``). A
closed pool below ``min_batch`` follows the policy: ``carry`` merges it into the pool of the
earliest open round (the batch then bears that round's number), ``drop`` discards it
(``small_round``). With ``release_size`` set, a pool that reaches it is released at once,
before its round closes (a latency cap that still respects the floor).

Invariants (property-tested in tests/broker/test_core.py)
---------------------------------------------------------
1. No batch holds fewer than ``min_batch`` records.
2. No batch holds two reports whose tokens are equal (one device, one report per batch):
   a device has at most one report per round (``duplicate_in_round``), and where a carried
   report meets a report of the same device in the target pool, the newer one wins and the
   other is counted as dropped (``carry_superseded``).
3. Every accepted report is released exactly once or counted as dropped with a reason.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from edge.codec import encode_batch_header
from edge.rounds import check_round_seconds

__all__ = [
    "Accepted",
    "Acked",
    "BatchMaker",
    "Closed",
    "CoreConfig",
    "Dropped",
    "Effect",
    "Outboxed",
    "Pooled",
    "Released",
    "Seen",
    "ShufflerCore",
]

RoundPolicy = Literal["carry", "drop"]
_RECORD = struct.Struct(">IH")  # one batch record: seed u32, z u16 (edge/codec.py)
MAX_BATCH_LIMIT = 40_000
"""Largest ``max_batch``: a sealed batch of 40,000 records is 240,094 bytes, under the
shipped broker's ``max_packet_size`` of 256 KiB (deploy/mosquitto/mosquitto.conf)."""
BATCH_ID_OFFSET = 10
BATCH_ID_SIZE = 16


@dataclass(frozen=True, kw_only=True)
class CoreConfig:
    """Release and acceptance rules (see the module docstring)."""

    fingerprint: int
    t: int
    round_seconds: int
    min_batch: int
    max_batch: int = 10_000
    release_size: int | None = None
    round_policy: RoundPolicy = "carry"
    max_skew: float = 5.0
    late_seconds: float = 0.0
    max_reports_per_round: int = 1_000_000
    max_outbox_batches: int = 1_000

    def __post_init__(self) -> None:
        check_round_seconds(self.round_seconds)
        for name in ("min_batch", "max_batch", "max_reports_per_round", "max_outbox_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.min_batch < 2:
            raise ValueError(f"min_batch must be >= 2, got {self.min_batch}")
        if self.max_batch > MAX_BATCH_LIMIT:
            raise ValueError(f"max_batch must be <= {MAX_BATCH_LIMIT}, got {self.max_batch}")
        if self.max_batch < 2 * self.min_batch:
            raise ValueError(
                f"max_batch must be >= 2 * min_batch = {2 * self.min_batch}, got {self.max_batch}"
            )
        release = self.release_size
        if release is not None and not self.min_batch <= release <= self.max_reports_per_round:
            raise ValueError(
                f"release_size must be None or in [min_batch={self.min_batch}, "
                f"max_reports_per_round], got {release}"
            )
        if self.round_policy not in ("carry", "drop"):
            raise ValueError(f"round_policy must be 'carry' or 'drop', got {self.round_policy!r}")
        for name in ("max_skew", "late_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.max_reports_per_round < self.min_batch:
            raise ValueError(
                f"max_reports_per_round must be >= min_batch, got {self.max_reports_per_round}"
            )
        if self.max_outbox_batches < 1:
            raise ValueError(f"max_outbox_batches must be >= 1, got {self.max_outbox_batches}")


@dataclass(frozen=True, kw_only=True)
class BatchMaker:
    """The randomness and the key a release needs, injected so that the core stays pure:
    a uniform in-place shuffle, fresh 16-byte batch ids, and the batch seal."""

    shuffle: Callable[[list[int]], None]
    new_batch_id: Callable[[], bytes]
    seal: Callable[[bytes], bytes]


# --- effects ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Accepted:
    """A report joins round ``round``: its token is seen and it is pooled."""

    round: int
    token: bytes
    seed: int
    z: int


@dataclass(frozen=True, slots=True)
class Seen:
    """Only the duplicate token of a report of ``round`` (snapshots of released rounds)."""

    round: int
    token: bytes


@dataclass(frozen=True, slots=True)
class Pooled:
    """Only a pool entry (snapshots: a carried report keeps its token in the pool, not in
    the duplicate set of the round it was carried into)."""

    round: int
    token: bytes
    seed: int
    z: int


@dataclass(frozen=True, slots=True)
class Released:
    """The pool of ``round`` leaves as these sealed batch messages (outbox until acked)."""

    round: int
    messages: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Outboxed:
    """Sealed batches waiting for their PUBACK, without a pool (snapshots)."""

    messages: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Carried:
    """The pool of ``source`` merges into the pool of ``target`` (policy ``carry``)."""

    source: int
    target: int


@dataclass(frozen=True, slots=True)
class Dropped:
    """The pool of ``round`` is discarded (``reason``: ``small_round``)."""

    round: int
    reason: str


@dataclass(frozen=True, slots=True)
class Closed:
    """Rounds up to ``through`` are closed: never accepted again, their tokens forgotten."""

    through: int


@dataclass(frozen=True, slots=True)
class Acked:
    """The batch ``batch_id`` was acknowledged by the broker: it leaves the outbox."""

    batch_id: bytes


Effect = Accepted | Seen | Pooled | Released | Outboxed | Carried | Dropped | Closed | Acked


def batch_id_of(message: bytes) -> bytes:
    """The 16-byte ``batch_id`` of a (sealed) batch message."""
    return message[BATCH_ID_OFFSET : BATCH_ID_OFFSET + BATCH_ID_SIZE]


def batch_count_of(message: bytes) -> int:
    """The record count of a (sealed) batch message."""
    return int.from_bytes(message[26:30], "big")


# --- state ------------------------------------------------------------------------------


class _Pool:
    """Accepted reports of one round waiting for release, in arrival order."""

    __slots__ = ("index", "seeds", "tokens", "zs")

    def __init__(self) -> None:
        self.seeds: list[int] = []
        self.zs: list[int] = []
        self.tokens: list[bytes] = []
        self.index: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self.seeds)

    def add(self, token: bytes, seed: int, z: int) -> bool:
        """Add a report; one of the same device already here (carried from an older round)
        is replaced. Returns ``True`` if a report was replaced."""
        position = self.index.get(token)
        if position is not None:
            self.seeds[position] = seed
            self.zs[position] = z
            return True
        self.index[token] = len(self.seeds)
        self.seeds.append(seed)
        self.zs.append(z)
        self.tokens.append(token)
        return False

    def merge_into(self, target: _Pool) -> int:
        """Move these reports into ``target``; returns how many were superseded (the
        device already has a report in ``target``, which is kept)."""
        superseded = 0
        for token, seed, z in zip(self.tokens, self.seeds, self.zs, strict=True):
            if token in target.index:
                superseded += 1
            else:
                target.add(token, seed, z)
        return superseded


@dataclass
class Applied:
    """What applying one effect changed, for counters (never for decisions)."""

    dropped: dict[str, int] = field(default_factory=dict)
    released_batches: int = 0
    released_reports: int = 0
    acked_reports: int = 0


class ShufflerCore:
    """Rounds, pools, duplicate tokens and the outbox of one shuffler (module docstring)."""

    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self._pools: dict[int, _Pool] = {}
        self._seen: dict[int, set[bytes]] = {}
        self._outbox: dict[bytes, bytes] = {}  # batch_id -> sealed message, in release order
        self._closed_through = -1
        self._buffered = 0
        self._outbox_reports = 0

    # --- read-only views ----------------------------------------------------------------

    @property
    def closed_through(self) -> int:
        return self._closed_through

    @property
    def buffered(self) -> int:
        """Accepted reports waiting in pools."""
        return self._buffered

    @property
    def outbox_reports(self) -> int:
        """Reports in released batches not yet acknowledged."""
        return self._outbox_reports

    def outbox(self) -> list[bytes]:
        """Sealed batches waiting for their PUBACK, oldest first."""
        return list(self._outbox.values())

    def pool_sizes(self) -> dict[int, int]:
        return {round_: len(pool) for round_, pool in self._pools.items()}

    def open_rounds(self, now: float) -> tuple[int, int]:
        """``(lowest, highest)`` round accepted at ``now`` (late rounds included)."""
        cfg = self.config
        lowest = math.floor((now - cfg.max_skew - cfg.late_seconds) / cfg.round_seconds)
        return max(lowest, self._closed_through + 1), math.floor(
            (now + cfg.max_skew) / cfg.round_seconds
        )

    def first_unended(self, now: float) -> int:
        """The oldest round that has not ended at ``now``: pools of older rounds are due."""
        return math.floor((now - self.config.max_skew) / self.config.round_seconds)

    # --- decisions ----------------------------------------------------------------------

    def check(self, now: float, fingerprint: int, round_: int, z: int, token: bytes) -> str | None:
        """``None`` if the report would be accepted now, else the rejection reason."""
        if fingerprint != self.config.fingerprint:
            return "unknown_fingerprint"
        if z >= self.config.t:
            return "z_out_of_range"
        lowest, highest = self.open_rounds(now)
        if round_ < lowest:
            return "round_too_old"
        if round_ > highest:
            return "round_in_future"
        seen = self._seen.get(round_)
        if seen is not None:
            if token in seen:
                return "duplicate_in_round"
            if len(seen) >= self.config.max_reports_per_round:
                return "round_full"
        return None

    def accept(self, now: float, token: bytes, report: tuple[int, int, int, int]) -> Accepted | str:
        """The :class:`Accepted` effect of a decoded report ``(fingerprint, round, seed,
        z)`` of the sender whose keyed token is ``token``, not yet applied; or the reason it
        is rejected. Rejection changes nothing."""
        fingerprint, round_, seed, z = report
        reason = self.check(now, fingerprint, round_, z, token)
        if reason is not None:
            return reason
        return Accepted(round_, token, seed, z)

    def due_early(self, round_: int) -> bool:
        """Whether the pool of ``round_`` has reached ``release_size`` (release it now)."""
        size = self.config.release_size
        if size is None:
            return False
        pool = self._pools.get(round_)
        return pool is not None and len(pool) >= size

    def tick(self, now: float, maker: BatchMaker) -> list[Effect]:
        """The effects of time passing: close rounds, then release, carry or drop the pools
        of ended rounds, oldest first. A small pool is carried into the oldest round that
        has not ended, which this tick never releases. Effects must be applied in order
        (:meth:`apply`) before the next call. While the outbox is full, pools wait."""
        lowest, _ = self.open_rounds(now)
        effects: list[Effect] = []
        if lowest - 1 > self._closed_through:
            effects.append(Closed(lowest - 1))
        target = max(self.first_unended(now), self._closed_through + 1, lowest)
        queued = len(self._outbox)
        for round_ in sorted(r for r in self._pools if r < target):
            if len(self._pools[round_]) >= self.config.min_batch:
                release = self._release(round_, maker, queued)
                if release is None:
                    break  # outbox full: keep the pools, retry on the next tick
                effects.append(release)
                queued += len(release.messages)
            elif self.config.round_policy == "carry":
                effects.append(Carried(round_, target))
            else:
                effects.append(Dropped(round_, "small_round"))
        return effects

    def release_early(self, round_: int, maker: BatchMaker) -> Released | None:
        """The :class:`Released` effect of a pool that reached ``release_size``."""
        if not self.due_early(round_):
            return None
        return self._release(round_, maker)

    def release_pool(self, round_: int, maker: BatchMaker) -> Released | None:
        """The :class:`Released` effect of the pool of ``round_`` now, whether or not its
        round has closed (a shuffler without durable state, stopping); ``None`` if the
        pool is below ``min_batch`` or the outbox is full."""
        pool = self._pools.get(round_)
        if pool is None or len(pool) < self.config.min_batch:
            return None
        return self._release(round_, maker)

    def _release(
        self, round_: int, maker: BatchMaker, queued: int | None = None
    ) -> Released | None:
        """Shuffle the pool of ``round_`` (>= min_batch) into sealed batch messages, or
        ``None`` while the outbox is full."""
        pool = self._pools[round_]
        n = len(pool)
        if n < self.config.min_batch:  # defence in depth: never release a small batch
            raise AssertionError("refusing to release a batch below min_batch")
        slices = math.ceil(n / self.config.max_batch)
        queued = len(self._outbox) if queued is None else queued
        if queued and queued + slices > self.config.max_outbox_batches:
            return None  # ``queued`` batches wait already (released in this tick included)
        order = list(range(n))
        maker.shuffle(order)
        messages = []
        for k in range(slices):
            part = order[k * n // slices : (k + 1) * n // slices]
            if len(part) < self.config.min_batch:
                raise AssertionError("a slice below min_batch")  # max_batch >= 2 min_batch
            header = encode_batch_header(
                self.config.fingerprint, round_, maker.new_batch_id(), len(part)
            )
            seeds, zs = pool.seeds, pool.zs
            # seeds and z were range-checked when their reports were decoded
            batch = header + b"".join([_RECORD.pack(seeds[i], zs[i]) for i in part])
            messages.append(maker.seal(batch))
        return Released(round_, tuple(messages))

    # --- state changes ------------------------------------------------------------------

    def apply_accepted(self, effect: Accepted) -> bool:
        """:meth:`apply` of an :class:`Accepted` (the per-report hot path, without the
        dispatch); returns ``True`` if it replaced a carried report of the same device
        (counted as dropped, ``carry_superseded``)."""
        seen = self._seen.get(effect.round)
        if seen is None:
            seen = self._seen[effect.round] = set()
        seen.add(effect.token)
        if self._pool(effect.round).add(effect.token, effect.seed, effect.z):
            return True
        self._buffered += 1
        return False

    def apply(self, effect: Effect) -> Applied:  # noqa: PLR0912  # one case per effect type
        """Fold one effect into the state (live, or replaying the log)."""
        applied = Applied()
        match effect:
            case Accepted(round_, token, seed, z) | Pooled(round_, token, seed, z):
                if isinstance(effect, Accepted):
                    self._seen.setdefault(round_, set()).add(token)
                if self._pool(round_).add(token, seed, z):
                    applied.dropped["carry_superseded"] = 1  # the fresh report replaced it
                else:
                    self._buffered += 1
            case Seen(round_, token):
                self._seen.setdefault(round_, set()).add(token)
            case Released(round_, messages):
                pool = self._pools.pop(round_)
                self._buffered -= len(pool)
                self._add_outbox(messages)
                applied.released_batches = len(messages)
                applied.released_reports = len(pool)
            case Outboxed(messages):
                self._add_outbox(messages)
            case Carried(source, target):
                pool = self._pools.pop(source)
                superseded = pool.merge_into(self._pool(target))
                self._buffered -= superseded
                if superseded:
                    applied.dropped["carry_superseded"] = superseded
            case Dropped(round_, reason):
                pool = self._pools.pop(round_)
                self._buffered -= len(pool)
                applied.dropped[reason] = len(pool)
            case Closed(through):
                self._closed_through = max(self._closed_through, through)
                for round_ in [r for r in self._seen if r <= self._closed_through]:
                    del self._seen[round_]
            case Acked(batch_id):
                message = self._outbox.pop(batch_id, None)
                if message is not None:
                    count = batch_count_of(message)
                    self._outbox_reports -= count
                    applied.acked_reports = count
        return applied

    def _pool(self, round_: int) -> _Pool:
        pool = self._pools.get(round_)
        if pool is None:
            pool = self._pools[round_] = _Pool()
        return pool

    def _add_outbox(self, messages: Iterable[bytes]) -> None:
        for message in messages:
            self._outbox[batch_id_of(message)] = message
            self._outbox_reports += batch_count_of(message)

    # --- compaction ---------------------------------------------------------------------

    def snapshot(self) -> Iterator[Effect]:
        """Effects that rebuild the current state from an empty core, in order."""
        if self._closed_through >= 0:
            yield Closed(self._closed_through)
        for round_, seen in self._seen.items():
            for token in seen:
                yield Seen(round_, token)
        for round_, pool in self._pools.items():
            for token, seed, z in zip(pool.tokens, pool.seeds, pool.zs, strict=True):
                yield Pooled(round_, token, seed, z)
        if self._outbox:
            yield Outboxed(tuple(self._outbox.values()))

    def state_digest(self) -> tuple[object, ...]:
        """A comparable summary of the whole state (tests: replay == live)."""
        return (
            self._closed_through,
            {r: frozenset(s) for r, s in self._seen.items()},
            {r: (tuple(p.tokens), tuple(p.seeds), tuple(p.zs)) for r, p in self._pools.items()},
            tuple(self._outbox.items()),
            self._buffered,
            self._outbox_reports,
        )
