"""The shuffler's state machine: :class:`ShufflerCore`, whose state only effects change.

Everything the shuffling bridge decides is pure code in :mod:`broker.core`, driven by
explicit inputs (the time, a report's fields, a keyed token of its sender) and by injected
randomness (a uniform shuffle, fresh batch ids, the batch signature). The MQTT transports
and the durable log (:mod:`broker.service.shuffler`, :mod:`broker.store`) are thin shells
around it. :class:`ShufflerCore` is that code as one object: its admission of reports
(:class:`~broker.core.admission.Admission`) and its release of pools
(:class:`~broker.core.release.Release`) decide, over the state they share
(:class:`~broker.core.state.CoreState`); this module changes that state. The invariants it
keeps are listed in :mod:`broker.core`.

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
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from broker.core.admission import Admission
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
from broker.core.release import Release
from broker.core.rules import MAX_BATCH_LIMIT, BatchMaker, CoreConfig, RoundPolicy
from broker.core.state import (
    U64,
    UNKNOWN_SOURCE,
    Pool,
    TokenSet,
    as_u64,
    distinct,
    source_key,
    without,
)

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


@dataclass
class Applied:
    """What applying one effect changed, for counters (never for decisions)."""

    dropped: dict[str, int] = field(default_factory=dict)
    admitted: int = 0
    released_batches: int = 0
    released_reports: int = 0
    acked_reports: int = 0


class ShufflerCore(Admission, Release):
    """Rounds, pools, duplicate tokens and the outbox of one shuffler (module docstring):
    :class:`~broker.core.admission.Admission` and :class:`~broker.core.release.Release`
    decide, :meth:`apply` changes the state."""

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
