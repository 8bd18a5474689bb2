"""The shuffler core's release: rounds closed as time passes, their pools released whole.

Closing rounds
--------------
With ``L = round_seconds``, ``S = max_skew`` and ``G = late_seconds`` (the round window of
:mod:`broker.core.admission`), the one closed-round rule: round ``r`` is *due* once
``now - S >= (r + 1) L``; at the next :meth:`Release.tick` its pool is released (or
carried, or dropped) and the round is closed in the same step. A round whose pool has left
is closed: a report of it that arrives later is ``round_too_old``, so one device cannot
feed an old round after its release. The duplicate tokens kept are those of the open
rounds only (usually one or two).

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
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from broker.core.effects import (
    Admitted,
    Carried,
    Closed,
    Configured,
    Dropped,
    Effect,
    Released,
    batch_count_of,
    batch_id_of,
    is_manifest,
)
from broker.core.rules import BatchMaker
from broker.core.state import CoreState, distinct, source_key
from edge.codec import encode_batch_header, encode_manifest, encode_trailer

__all__ = ["Release"]

_RECORDS = np.dtype([("seed", ">u4"), ("z", ">u2")])  # one batch record (edge/codec.py)


class Release(CoreState):
    """The release part of :class:`~broker.core.machine.ShufflerCore` (module
    docstring)."""

    def first_unended(self, now: float) -> int:
        """The oldest round that is not due at ``now``: pools of older rounds are due."""
        return math.floor((now - self.config.max_skew) / self.config.round_seconds)

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
            header = encode_batch_header(
                fp, round_, maker.new_batch_id(), int(part.size), self._units
            )
            trailer = encode_trailer(self._units)  # the round's length: a round is a time
            messages.append(maker.seal(header + records[part].tobytes() + trailer))
        if maker.seal_manifest is not None:
            entries = [(batch_id_of(m), batch_count_of(m)) for m in messages]
            rounds = [
                (key & 0xFFFFFFFF, key >> 32, count) for key, count in sorted(sources.items())
            ]
            manifest = encode_manifest(
                fp, round_, maker.new_batch_id(), entries, rounds, round_seconds=self._units
            )
            messages.append(maker.seal_manifest(manifest))
        return Released(round_, tuple(messages))

    def _queued_batches(self) -> int:
        """Batches waiting for their PUBACK (manifests are not batches)."""
        return sum(1 for m in self._outbox.values() if not is_manifest(m))
