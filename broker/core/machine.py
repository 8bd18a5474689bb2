"""The shuffler's state machine: rounds, pools, duplicate state and release, with no I/O.

Everything the shuffling bridge decides lives here, as pure code driven by explicit inputs
(the time, a report's fields, a keyed token of its sender) and by injected randomness (a
uniform shuffle, fresh batch ids, the batch signature). The MQTT transports and the durable
log (:mod:`broker.service.shuffler`, :mod:`broker.store`) are thin shells around it.

Event sourcing
--------------
Every change of state is an *effect* (:data:`Effect`): a small immutable record that
:meth:`ShufflerCore.apply` folds into the state, deterministically. The live service asks
the core what to do (:meth:`ShufflerCore.offer` and :meth:`ShufflerCore.settle`,
:meth:`ShufflerCore.tick`), writes the returned effects to its write-ahead log, then
applies them; on start it replays the log through :meth:`ShufflerCore.apply` and arrives
at the same state, pools, duplicate tokens and unacknowledged batches (with their exact
bytes) included. :meth:`ShufflerCore.snapshot` gives a short list of bulk effects (one per
round's tokens, one per pool) that rebuilds the current state, to compact the log.

Admission in two steps
----------------------
:meth:`ShufflerCore.offer` checks one report against everything that needs no lookup (the
spec, the round window, the per-round cap) and queues it; :meth:`ShufflerCore.settle`
decides every queued report at once: the first report of a device in a round is admitted,
any other is ``duplicate_in_round``. The shell offers the reports of one socket read and
settles them before writing the log and sending their PUBACKs (group commit), so the
duplicate check is a few numpy calls per read, not a lookup per report. A settle must
follow the offers before time passes (:meth:`ShufflerCore.tick` refuses pending offers).

Rounds (docs/protocol.md, "Rounds")
-----------------------------------
Round ``r`` is Unix time ``[r L, (r + 1) L)`` with ``L = round_seconds``. With ``S =
max_skew`` seconds of tolerated clock error and ``G = late_seconds``, at time ``now`` the
core accepts exactly the rounds

    floor((now - S - G) / L)  <=  r  <=  floor((now + S) / L),   and  (r + 1) L > closed,

where ``closed`` is a Unix time (:class:`Closed`): every round that ends at or before it
is *closed* and accepts nothing more (``round_too_old``). The others are rejected without
changing any state: no report, however hostile its round number, opens, closes or evicts a
round. ``closed`` is a time, not a round number, so it keeps its meaning when
``round_seconds`` changes between runs (:meth:`ShufflerCore.reconfigure`).

The one closed-round rule: round ``r`` is *due* once ``now - S >= (r + 1) L``; at the next
:meth:`ShufflerCore.tick` its pool is released (or carried, or dropped) and the round is
closed in the same step. A round whose pool has left is closed: a report of it that arrives
later is ``round_too_old``, so one device cannot feed an old round after its release. The
duplicate tokens kept are those of the open rounds only (usually one or two).

``late_seconds`` is for a shuffler that was away: the shell ticks with ``hold=True`` while
it is not subscribed and until the broker's queued backlog has drained after a
(re)subscription, and a held tick releases only rounds that ended more than ``S + G`` ago.
A round that ended while the shuffler was away therefore stays open for the reports the
broker queued for it, and is released whole once they are in.

Release
-------
A due round's pool is released whole, as one batch, split into near-equal slices only
above ``max_batch`` (each slice >= ``min_batch`` since ``max_batch >= 2 min_batch``). A due
pool below ``min_batch`` follows the policy: ``carry`` merges it into the pool of the
earliest open round (the batch then bears that round's number), ``drop`` discards it
(``small_round``). With ``release_size`` set, a pool that reaches it is released at once,
before its round is due (a latency cap that still respects the floor; the round stays open).

Invariants (property-tested in tests/broker/test_core.py)
---------------------------------------------------------
1. No batch holds fewer than ``min_batch`` records.
2. No batch holds two reports whose tokens are equal (one device, one report per batch):
   a device has at most one report per round (``duplicate_in_round``), and where carried
   reports meet a report of the same device, the newest one wins and the others are
   counted as dropped (``carry_superseded``) when the pool leaves. A release checks it.
3. Every accepted report is released exactly once or counted as dropped with a reason.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from broker.core.effects import (
    Acked,
    Admitted,
    Carried,
    Closed,
    Configured,
    Dropped,
    Effect,
    Outboxed,
    Pooled,
    Released,
    Seen,
    Sourced,
    batch_count_of,
    batch_id_of,
    batch_round_of,
    is_manifest,
)
from broker.core.rules import MAX_BATCH_LIMIT, BatchMaker, CoreConfig, RoundPolicy
from broker.core.state import (
    U64,
    UNKNOWN_SOURCE,
    Pool,
    TokenSet,
    as_u16,
    as_u32,
    as_u64,
    distinct,
    source_key,
    without,
)
from edge.codec import encode_batch_header, encode_manifest

__all__ = [
    "MAX_BATCH_LIMIT",
    "Acked",
    "Admitted",
    "BatchMaker",
    "Carried",
    "Closed",
    "Configured",
    "CoreConfig",
    "Dropped",
    "Effect",
    "Outboxed",
    "Pooled",
    "Released",
    "RoundPolicy",
    "Seen",
    "ShufflerCore",
    "Sourced",
    "batch_count_of",
    "batch_id_of",
    "batch_round_of",
]

_RECORDS = np.dtype([("seed", ">u4"), ("z", ">u2")])  # one batch record (edge/codec.py)


# --- state ------------------------------------------------------------------------------


class _Pending:
    """Reports offered since the last settle, for one round."""

    __slots__ = ("seeds", "tokens", "zs")

    def __init__(self) -> None:
        self.tokens = array("Q")
        self.seeds = array("I")
        self.zs = array("H")


@dataclass
class Applied:
    """What applying one effect changed, for counters (never for decisions)."""

    dropped: dict[str, int] = field(default_factory=dict)
    admitted: int = 0
    released_batches: int = 0
    released_reports: int = 0
    acked_reports: int = 0


class ShufflerCore:
    """Rounds, pools, duplicate tokens and the outbox of one shuffler (module docstring)."""

    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self._pools: dict[int, Pool] = {}
        self._seen: dict[int, TokenSet] = {}
        self._pending: dict[int, _Pending] = {}
        self._pending_count = 0
        self._outbox: dict[bytes, bytes] = {}  # batch_id -> sealed message, in release order
        self._closed = 0
        self._buffered = 0
        self._outbox_reports = 0
        self.end_round: int | None = None
        """A sharded shuffler's first round of the next layout (its shard retires before
        it): a small pool is never carried into it, but dropped (``small_round``)."""
        self.late_offers = 0
        """Offers of rounds already due (a backlog being delivered), ever: the shell
        watches it to tell when a backlog has drained."""
        # What the state was built under (Configured effects; a log without one was built
        # under the current configuration).
        self._units = config.round_seconds
        self._fingerprint = config.fingerprint
        self._configured = False
        self._window_from = self._window_until = 0.0  # empty: computed on first use
        self._highest = self._unended = self._lowest = 0

    # --- read-only views ----------------------------------------------------------------

    @property
    def closed(self) -> int:
        """Unix time up to which every round is closed."""
        return self._closed

    @property
    def buffered(self) -> int:
        """Accepted reports waiting in pools."""
        return self._buffered

    @property
    def outbox_reports(self) -> int:
        """Reports in released batches not yet acknowledged."""
        return self._outbox_reports

    @property
    def state_config(self) -> tuple[int, int] | None:
        """``(round_seconds, fingerprint)`` the state was recorded under, if recorded."""
        return (self._units, self._fingerprint) if self._configured else None

    def outbox(self) -> list[bytes]:
        """Sealed batches waiting for their PUBACK, oldest first."""
        return list(self._outbox.values())

    def pool_sizes(self) -> dict[int, int]:
        return {round_: pool.size() for round_, pool in self._pools.items()}

    def memory_bytes(self) -> int:
        """Bytes held by the duplicate tokens and the pools' columns."""
        return sum(s.nbytes() for s in self._seen.values()) + sum(
            p.nbytes() for p in self._pools.values()
        )

    def open_rounds(self, now: float) -> tuple[int, int]:
        """``(lowest, highest)`` round accepted at ``now`` (late rounds included)."""
        cfg = self.config
        lowest = math.floor((now - cfg.max_skew - cfg.late_seconds) / cfg.round_seconds)
        return max(lowest, self._closed // cfg.round_seconds), math.floor(
            (now + cfg.max_skew) / cfg.round_seconds
        )

    def first_unended(self, now: float) -> int:
        """The oldest round that is not due at ``now``: pools of older rounds are due."""
        return math.floor((now - self.config.max_skew) / self.config.round_seconds)

    # --- admission ----------------------------------------------------------------------

    def offer(self, now: float, token: int, report: tuple[int, int, int, int]) -> str | None:
        """Queue a decoded report ``(fingerprint, round, seed, z)`` of the sender whose
        keyed token is ``token`` (a u64) for :meth:`settle`, or return the reason it is
        rejected now. Nothing but the queue changes."""
        fingerprint, round_, seed, z = report
        if not self._window_from <= now < self._window_until:
            self._window(now)
        cfg = self.config
        if fingerprint != cfg.fingerprint:
            return "unknown_fingerprint"
        if z >= cfg.t:
            return "z_out_of_range"
        if round_ > self._highest:
            return "round_in_future"
        if round_ < self._lowest:
            return "round_too_old"
        pending = self._pending.get(round_)
        if pending is None:
            pending = self._pending[round_] = _Pending()
        seen = self._seen.get(round_)
        if (0 if seen is None else seen.count) + len(pending.seeds) >= cfg.max_reports_per_round:
            return "round_full"
        if round_ < self._unended:
            self.late_offers += 1
        pending.tokens.append(token)
        pending.seeds.append(seed)
        pending.zs.append(z)
        self._pending_count += 1
        return None

    def _window(self, now: float) -> None:
        """The round window at ``now`` (module docstring), and the interval of time over
        which it stays the same (the per-report path compares, nothing more)."""
        cfg = self.config
        length, skew, late = cfg.round_seconds, cfg.max_skew, cfg.late_seconds
        self._highest = math.floor((now + skew) / length)
        self._unended = math.floor((now - skew) / length)
        late_bound = math.floor((now - skew - late) / length)
        self._lowest = max(late_bound, self._closed // length)
        self._window_from = now
        self._window_until = min(
            (self._highest + 1) * length - skew,
            (self._unended + 1) * length + skew,
            (late_bound + 1) * length + skew + late,
        )

    @property
    def pending(self) -> int:
        """Reports offered and not yet settled."""
        return self._pending_count

    def settle(self) -> tuple[list[Admitted], int]:
        """The :class:`Admitted` effects of the offered reports (not yet applied), one per
        round, and how many were duplicates (``duplicate_in_round``: a device already seen
        in that round, or seen earlier among these offers, whose first report wins)."""
        if not self._pending:
            return [], 0
        pending, self._pending = self._pending, {}
        self._pending_count = 0
        effects: list[Admitted] = []
        duplicates = 0
        for round_, offered in pending.items():
            tokens = as_u64(offered.tokens)
            order = np.argsort(tokens, kind="stable")  # equal tokens: arrival order
            ranked = tokens[order]
            first = np.ones(ranked.size, dtype=np.bool_)
            first[1:] = ranked[1:] != ranked[:-1]
            seen = self._seen.get(round_)
            if seen is not None:
                first &= ~seen.contains(ranked)
            keep = order[first]
            keep.sort()
            duplicates += int(tokens.size - keep.size)
            if not keep.size:
                continue
            if keep.size == tokens.size:
                effects.append(
                    Admitted(round_, bytes(offered.tokens), bytes(offered.seeds), bytes(offered.zs))
                )
            else:
                effects.append(
                    Admitted(
                        round_,
                        tokens[keep].tobytes(),
                        as_u32(offered.seeds)[keep].tobytes(),
                        as_u16(offered.zs)[keep].tobytes(),
                    )
                )
        return effects, duplicates

    def accept(self, now: float, token: int, report: tuple[int, int, int, int]) -> Admitted | str:
        """One report alone: :meth:`offer` then :meth:`settle` (tests, tools)."""
        reason = self.offer(now, token, report)
        if reason is not None:
            return reason
        effects, _ = self.settle()
        return effects[0] if effects else "duplicate_in_round"

    # --- release ------------------------------------------------------------------------

    def due_early(self, round_: int) -> bool:
        """Whether the pool of ``round_`` has reached ``release_size`` (release it now)."""
        size = self.config.release_size
        if size is None:
            return False
        pool = self._pools.get(round_)
        return pool is not None and len(pool) >= size and pool.size() >= size

    def pieces(self, effect: Admitted) -> list[Admitted]:
        """``effect`` cut where its round's pool reaches ``release_size``, so that a pool
        released early (:meth:`release_early` after each piece) holds exactly that many."""
        size = self.config.release_size
        n = len(effect)
        if size is None:
            return [effect]
        pool = self._pools.get(effect.round)
        first = max(size - (0 if pool is None else len(pool)), 1)
        cuts = [0, *range(min(first, n), n, size), n]
        return [
            Admitted(
                effect.round,
                effect.tokens[8 * a : 8 * b],
                effect.seeds[4 * a : 4 * b],
                effect.zs[2 * a : 2 * b],
            )
            for a, b in itertools.pairwise(cuts)
            if b > a
        ]

    def tick(self, now: float, maker: BatchMaker, *, hold: bool = False) -> list[Effect]:
        """The effects of time passing: close the due rounds, then release, carry or drop
        their pools, oldest first. ``hold``: only rounds that ended more than ``max_skew +
        late_seconds`` ago are due (module docstring). A small pool is carried into the
        oldest open round, which this tick never releases. Effects must be applied in
        order (:meth:`apply`) before the next call. While the outbox is full, pools wait
        (their rounds are closed all the same)."""
        if self._pending:
            raise RuntimeError("settle the offered reports before time passes")
        cfg = self.config
        length = cfg.round_seconds
        due = self.first_unended(now)
        if hold:
            due = min(due, math.floor((now - cfg.max_skew - cfg.late_seconds) / length))
        effects: list[Effect] = []
        if due * length > self._closed:
            effects.append(Closed(due * length))
        target = max(due, max(self._closed, due * length) // length)
        queued = self._queued_batches()
        for round_ in sorted(r for r in self._pools if r < target):
            pool = self._pools[round_]
            if pool.size() >= cfg.min_batch:
                release = self._release(round_, maker, queued)
                if release is None:
                    break  # outbox full: keep the pools, retry on the next tick
                effects.append(release)
                queued += sum(1 for m in release.messages if not is_manifest(m))
            elif cfg.round_policy == "carry" and (
                self.end_round is None or target < self.end_round
            ):
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
        round is due (a shuffler without durable state, stopping); ``None`` if the pool is
        below ``min_batch`` or the outbox is full."""
        pool = self._pools.get(round_)
        if pool is None or pool.size() < self.config.min_batch:
            return None
        return self._release(round_, maker)

    def reconfigure(self, maker: BatchMaker) -> list[Effect]:
        """Effects that bring a recovered state to the current configuration (none when it
        matches). A new ``round_seconds`` renumbers the open rounds (:class:`Configured`);
        a new spec (fingerprint) cannot share a pool with the old one: each pool of the
        old spec is released now under the old fingerprint if it holds ``min_batch``
        reports, else dropped (``spec_changed``). ``min_batch`` and the other rules need
        nothing: they apply to the next release."""
        cfg = self.config
        if self._configured and (self._units, self._fingerprint) == (
            cfg.round_seconds,
            cfg.fingerprint,
        ):
            return []
        effects: list[Effect] = []
        if self._fingerprint != cfg.fingerprint:
            for round_ in sorted(self._pools):
                if self._pools[round_].size() >= cfg.min_batch:
                    release = self._release(
                        round_, maker, fingerprint=self._fingerprint, force=True
                    )
                    assert release is not None  # forced
                    effects.append(release)
                else:
                    effects.append(Dropped(round_, "spec_changed"))
        effects.append(Configured(cfg.round_seconds, cfg.fingerprint))
        return effects

    def _release(
        self,
        round_: int,
        maker: BatchMaker,
        queued: int | None = None,
        *,
        fingerprint: int | None = None,
        force: bool = False,
    ) -> Released | None:
        """Shuffle the pool of ``round_`` (>= min_batch) into sealed batch messages, or
        ``None`` while the outbox is full."""
        cfg = self.config
        pool = self._pools[round_]
        keep, _ = pool.resolve()
        tokens, seeds, zs = pool.columns(keep)
        sources = pool.source_counts(keep, source_key(round_, self._units))
        n = int(seeds.size)
        if n < cfg.min_batch:  # defence in depth: never release a small batch
            raise AssertionError("refusing to release a batch below min_batch")
        if distinct(tokens).size != n:  # defence in depth: one report per device
            raise AssertionError("refusing to release two reports of one device together")
        slices = math.ceil(n / cfg.max_batch)
        queued = self._queued_batches() if queued is None else queued
        if not force and queued and queued + slices > cfg.max_outbox_batches:
            return None  # ``queued`` batches wait already (released in this tick included)
        order = list(range(n))
        maker.shuffle(order)
        permutation = np.array(order, dtype=np.intp)
        records = np.empty(n, dtype=_RECORDS)
        records["seed"] = seeds
        records["z"] = zs
        fp = cfg.fingerprint if fingerprint is None else fingerprint
        messages = []
        for k in range(slices):
            part = permutation[k * n // slices : (k + 1) * n // slices]
            if part.size < cfg.min_batch:
                raise AssertionError("a slice below min_batch")  # max_batch >= 2 min_batch
            header = encode_batch_header(fp, round_, maker.new_batch_id(), int(part.size))
            messages.append(maker.seal(header + records[part].tobytes()))
        if maker.seal_manifest is not None:
            entries = [(batch_id_of(m), batch_count_of(m)) for m in messages]
            rounds = [
                (key & 0xFFFFFFFF, key >> 32, count) for key, count in sorted(sources.items())
            ]
            manifest = encode_manifest(fp, round_, maker.new_batch_id(), entries, rounds)
            messages.append(maker.seal_manifest(manifest))
        return Released(round_, tuple(messages))

    # --- state changes ------------------------------------------------------------------

    def apply(self, effect: Effect) -> Applied:  # noqa: PLR0912, PLR0915  # one case per effect type
        """Fold one effect into the state (live, or replaying the log)."""
        applied = Applied()
        match effect:
            case Admitted(round_, tokens, seeds, zs):
                ranked = as_u64(tokens).copy()
                ranked.sort()
                self._tokens(round_).add(ranked)
                self._pool(round_).extend(tokens, seeds, zs)
                applied.admitted = len(effect)
                self._buffered += applied.admitted
            case Seen(round_, tokens):
                ranked = as_u64(tokens).copy()
                ranked.sort()
                self._tokens(round_).add(ranked)
            case Pooled(round_, carried, tokens, seeds, zs):
                pool = Pool()
                pool.extend(tokens, seeds, zs)
                pool.carried = carried
                pool.sources.extend([UNKNOWN_SOURCE] * carried)  # a Sourced record follows
                earlier = self._pools.get(round_)
                if earlier is not None:
                    pool.absorb(earlier, source_key(round_, self._units))
                self._pools[round_] = pool
                self._buffered += len(seeds) // 4
                if len(seeds) > 4 * carried and (round_ + 1) * self._units > self._closed:
                    fresh = as_u64(tokens)[carried:].copy()
                    fresh.sort()
                    self._tokens(round_).add(fresh)
            case Released(round_, messages):
                pool = self._take(round_)  # (a repaired log may lack it)
                self._buffered -= len(pool)
                self._add_outbox(messages)
                released = sum(batch_count_of(m) for m in messages)
                applied.released_batches = sum(1 for m in messages if not is_manifest(m))
                applied.released_reports = released
                if len(pool) > released:
                    applied.dropped["carry_superseded"] = len(pool) - released
            case Outboxed(messages):
                self._add_outbox(messages)
            case Sourced(round_, keys):
                sourced = self._pools.get(round_)
                if sourced is not None:
                    sourced.set_sources(keys)
            case Carried(source, target):
                pool = self._take(source)
                self._pool(target).absorb(pool, source_key(source, self._units))
            case Dropped(round_, reason):
                pool = self._take(round_)
                self._buffered -= len(pool)
                _, superseded = pool.resolve()
                applied.dropped[reason] = len(pool) - superseded
                if superseded:
                    applied.dropped["carry_superseded"] = superseded
            case Closed(until):
                self._closed = max(self._closed, until)
                self._window_until = 0.0  # the lowest open round may have moved
                units = self._units
                for round_ in [r for r in self._seen if (r + 1) * units <= self._closed]:
                    del self._seen[round_]
            case Acked(batch_id):
                message = self._outbox.pop(batch_id, None)
                if message is not None:
                    count = batch_count_of(message)
                    self._outbox_reports -= count
                    applied.acked_reports = count
            case Configured(round_seconds, fingerprint):
                if round_seconds != self._units:
                    self._renumber(self._units, round_seconds)
                self._units, self._fingerprint = round_seconds, fingerprint
                self._configured = True
        return applied

    def _renumber(self, old: int, new: int) -> None:
        """Round numbers of ``old``-second rounds to ``new``-second ones. An old round's
        duplicate tokens go to every new round its interval of time overlaps (that is not
        closed): a device that reported in it is refused in each of them, so no sequence of
        lengths (10 -> 20 -> 10) lets it report twice in one round; the price is at most
        one refused report per device and change. An old round's pool goes to the new
        round holding its start; two old pools in one new round merge, the older carried
        into the newer."""
        seen: dict[int, list[np.ndarray]] = {}
        for round_, tokens in self._seen.items():
            first = round_ * old // new
            last = ((round_ + 1) * old - 1) // new
            first = max(first, self._closed // new)  # new rounds ending by then are closed
            for target in range(first, last + 1):
                seen.setdefault(target, []).append(tokens.tokens())
        self._seen = {
            round_: TokenSet.of(parts[0] if len(parts) == 1 else distinct(np.concatenate(parts)))
            for round_, parts in seen.items()
        }
        pools, self._pools = self._pools, {}
        for round_ in sorted(pools):
            pool = pools[round_]
            pool.freeze(source_key(round_, old))  # its reports keep the round they were sent in
            target = round_ * old // new
            earlier = self._pools.get(target)
            if earlier is not None:
                pool.absorb(earlier, source_key(target, new))  # (all its entries are carried)
            self._pools[target] = pool

    def _queued_batches(self) -> int:
        """Batches waiting for their PUBACK (manifests are not batches)."""
        return sum(1 for m in self._outbox.values() if not is_manifest(m))

    def _take(self, round_: int) -> Pool:
        """Remove and return the pool of ``round_`` (an empty one if there is none: a log
        salvaged by ``coco shuffler repair`` may miss the records that made it)."""
        pool = self._pools.pop(round_, None)
        return Pool() if pool is None else pool

    def _tokens(self, round_: int) -> TokenSet:
        tokens = self._seen.get(round_)
        if tokens is None:
            tokens = self._seen[round_] = TokenSet()
        return tokens

    def _pool(self, round_: int) -> Pool:
        pool = self._pools.get(round_)
        if pool is None:
            pool = self._pools[round_] = Pool()
        return pool

    def _add_outbox(self, messages: Iterable[bytes]) -> None:
        for message in messages:
            self._outbox[batch_id_of(message)] = message
            self._outbox_reports += batch_count_of(message)

    # --- compaction ---------------------------------------------------------------------

    def snapshot(self) -> Iterator[Effect]:
        """Bulk effects that rebuild the current state from an empty core, in order: one
        per round's tokens and one per pool, not one per report."""
        yield Configured(self._units, self._fingerprint)
        if self._closed:
            yield Closed(self._closed)
        for round_, pool in self._pools.items():
            yield Pooled(
                round_, pool.carried, bytes(pool.tokens), bytes(pool.seeds), bytes(pool.zs)
            )
            if pool.carried:
                yield Sourced(round_, bytes(pool.sources))
        for round_, seen in self._seen.items():
            # the pool's fresh tokens come back with it (Pooled): only the others here
            same = self._pools.get(round_)
            if (round_ + 1) * self._units <= self._closed:
                same = None  # (only a repaired log has tokens of a closed round)
            if same is not None and len(same) - same.carried == seen.count:
                continue  # all of the round's tokens are its pool's fresh ones
            tokens = seen.tokens()
            if same is not None:
                tokens = without(tokens, as_u64(same.tokens)[same.carried :])
            if tokens.size:
                yield Seen(round_, tokens.astype(U64).tobytes())
        if self._outbox:
            yield Outboxed(tuple(self._outbox.values()))

    def state_digest(self) -> tuple[object, ...]:
        """A comparable summary of the whole state (tests: replay == live)."""
        return (
            self._closed,
            self._units,
            self._fingerprint,
            {r: s.tokens().tobytes() for r, s in self._seen.items()},
            {
                r: (p.carried, bytes(p.tokens), bytes(p.seeds), bytes(p.zs), bytes(p.sources))
                for r, p in self._pools.items()
            },
            tuple(self._outbox.items()),
            self._buffered,
            self._outbox_reports,
        )
