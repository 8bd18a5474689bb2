"""Compact round state of the shuffler: duplicate tokens and pools in packed arrays.

A shard of a million devices keeps, for every open round, one 8-byte token per device that
reported (:class:`TokenSet`) and, until its round is released, 14 bytes per pooled report
(:class:`Pool`: token, seed, z). Nothing here is a Python object per report: tokens live in
sorted ``uint64`` arrays, pools in growable ``array.array`` columns, and every check that
touches many reports is one numpy call.

Tokens are the first 8 bytes of a keyed BLAKE2b of the device id
(:func:`broker.store.wal.token_of`), so they are uniform 64-bit integers. Two devices share a
token with probability about ``n / 2**64`` per report (``n`` the devices of the round):
the second one's report would be refused as ``duplicate_in_round``. That costs accuracy
for one report in about 10^13 at a million devices, and never privacy: a false duplicate
only ever removes a report.

:class:`CoreState` is the whole state of one core: the pools and tokens of its rounds, the
reports offered and not yet settled (:class:`Pending`), the outbox of sealed batches, the
time up to which rounds are closed. The parts of :class:`~broker.core.machine.ShufflerCore`
(admission, release, the folding of effects) all work on it.
"""

from __future__ import annotations

import sys
from array import array

import numpy as np
import numpy.typing as npt

from broker.core.rules import CoreConfig

__all__ = [
    "UNKNOWN_SOURCE",
    "CoreState",
    "Pending",
    "Pool",
    "TokenSet",
    "as_u16",
    "as_u32",
    "as_u64",
    "distinct",
    "source_key",
    "without",
]

if sys.byteorder != "little":  # pragma: no cover  # the packed columns are little-endian
    raise ImportError("broker.core.state needs a little-endian machine")

U64 = np.dtype("<u8")
U32 = np.dtype("<u4")
U16 = np.dtype("<u2")
_SMALL_FLOOR = 4096
"""Sorted runs of recent inserts are merged into the base array once they hold more than
an eighth of it (and at least this many): lookups stay one ``searchsorted`` on the base
plus a few small runs, and each token is copied O(log n) times in all."""

Tokens = npt.NDArray[np.uint64]

UNKNOWN_SOURCE = 0xFFFFFFFF
"""The source key of a carried report whose round is not known (a pool recovered from a log
written before sources were recorded): ``round_seconds`` 0, round ``2**32 - 1``."""


def source_key(round_: int, round_seconds: int) -> int:
    """The round a report was sent in, with the round length it was counted in, as one u64
    (``round_seconds << 32 | round``): what a release manifest lists as its sources."""
    return (round_seconds << 32) | round_


def as_u64(data: bytes | bytearray | memoryview | array[int]) -> Tokens:
    return np.frombuffer(data, dtype=U64)


def as_u32(data: bytes | bytearray | memoryview | array[int]) -> npt.NDArray[np.uint32]:
    return np.frombuffer(data, dtype=U32)


def as_u16(data: bytes | bytearray | memoryview | array[int]) -> npt.NDArray[np.uint16]:
    return np.frombuffer(data, dtype=U16)


def distinct(tokens: Tokens) -> Tokens:
    """The sorted distinct values of ``tokens`` (by sorting: numpy's hash-based
    ``unique`` is far slower on u64 here)."""
    ranked = np.sort(tokens)
    if ranked.size < 2:
        return ranked
    keep = np.empty(ranked.size, dtype=np.bool_)
    keep[0] = True
    np.not_equal(ranked[1:], ranked[:-1], out=keep[1:])
    result: Tokens = ranked[keep]
    return result


def without(ranked: Tokens, others: Tokens) -> Tokens:
    """The values of ``ranked`` (sorted) that are not in ``others``."""
    if not others.size or not ranked.size:
        return ranked
    other = np.sort(others)
    index = other.searchsorted(ranked)
    np.minimum(index, other.size - 1, out=index)
    result: Tokens = ranked[other[index] != ranked]
    return result


def _merge(runs: list[Tokens]) -> Tokens:
    merged = np.concatenate(runs)
    merged.sort(kind="stable")  # timsort: sorted runs merge in linear time
    return merged


class TokenSet:
    """The duplicate tokens of one round: a sorted base array plus a few sorted runs of
    recent inserts (binary-counter merging). Insert and lookup work on sorted arrays of
    many tokens at once."""

    __slots__ = ("_base", "_runs", "_small", "count")

    def __init__(self) -> None:
        self._base: Tokens = np.empty(0, dtype=U64)
        self._runs: list[Tokens] = []
        self._small = 0
        self.count = 0

    @classmethod
    def of(cls, tokens: Tokens) -> TokenSet:
        """A set of ``tokens`` (sorted, distinct), which it keeps as its base without a
        copy: sets made of one array share it (a set never writes its arrays in place)."""
        made = cls()
        made._base = tokens
        made.count = int(tokens.size)
        return made

    def contains(self, queries: Tokens) -> npt.NDArray[np.bool_]:
        """Which of ``queries`` (sorted) are in the set."""
        hit = np.zeros(queries.size, dtype=np.bool_)
        for level in (self._base, *self._runs):
            if level.size:
                index = level.searchsorted(queries)
                np.minimum(index, level.size - 1, out=index)
                hit |= level[index] == queries
        return hit

    def add(self, tokens: Tokens) -> None:
        """Add ``tokens``: sorted, distinct, none of them in the set yet."""
        if not tokens.size:
            return
        self.count += int(tokens.size)
        runs = self._runs
        runs.append(tokens)
        self._small += int(tokens.size)
        while len(runs) > 1 and runs[-2].size <= runs[-1].size:
            last = runs.pop()
            runs.append(_merge([runs.pop(), last]))
        if self._small > max(_SMALL_FLOOR, self._base.size >> 3):
            self._base = _merge([self._base, *runs])
            self._runs = []
            self._small = 0

    def tokens(self) -> Tokens:
        """Every token, sorted (a snapshot)."""
        if self._runs:
            self._base = _merge([self._base, *self._runs])
            self._runs = []
            self._small = 0
        return self._base

    def nbytes(self) -> int:
        return int(self._base.nbytes) + sum(int(run.nbytes) for run in self._runs)


class Pool:
    """Reports of one round waiting for release: packed columns, in arrival order.

    The first ``carried`` entries were carried in from older rounds (policy ``carry``); one
    device may appear there more than once, and again among the fresh reports. Where it
    does, the newest report wins (the fresh one, else the last carried one) and the others
    are superseded: :meth:`resolve` does that in one vectorised pass, when the pool is
    released, carried on or dropped, never per report.

    ``sources`` holds, for each carried entry, the round its report was sent in
    (:func:`source_key`): a release's manifest lists the rounds of its reports, and the
    privacy ledger charges each of them (a device sends one report per round, so the rounds
    a release holds are the participations it costs, docs/privacy-model.md). The fresh
    entries' round is the pool's own.
    """

    __slots__ = ("carried", "seeds", "sources", "tokens", "zs")

    def __init__(self) -> None:
        self.tokens = array("Q")
        self.seeds = array("I")
        self.zs = array("H")
        self.sources = array("Q")
        self.carried = 0

    def __len__(self) -> int:
        """Entries, superseded ones included."""
        return len(self.seeds)

    def extend(self, tokens: bytes, seeds: bytes, zs: bytes) -> None:
        self.tokens.frombytes(tokens)
        self.seeds.frombytes(seeds)
        self.zs.frombytes(zs)

    def absorb(self, older: Pool, older_key: int) -> None:
        """Take ``older``'s entries (a round before this one, whose fresh reports were
        sent in the round ``older_key``) as carried entries."""
        # The carried part becomes: this pool's carried entries, then all of older's
        # (its carried ones, then its fresh ones), then this pool's fresh entries follow.
        # Carries happen oldest round first, so later entries are newer reports.
        tokens, seeds, zs = array("Q"), array("I"), array("H")
        cut = self.carried
        for column, mine, theirs in (
            (tokens, self.tokens, older.tokens),
            (seeds, self.seeds, older.seeds),
            (zs, self.zs, older.zs),
        ):
            column.extend(mine[:cut])
            column.extend(theirs)
            column.extend(mine[cut:])
        sources = array("Q", self.sources[:cut])
        sources.extend(older.sources[: older.carried])
        sources.extend(array("Q", [older_key]) * (len(older) - older.carried))
        self.tokens, self.seeds, self.zs, self.sources = tokens, seeds, zs, sources
        self.carried = cut + len(older)

    def freeze(self, key: int) -> None:
        """Turn every fresh entry (sent in the round ``key``) into a carried one: the pool
        is moving to another round number (a change of ``round_seconds``)."""
        self.sources.extend(array("Q", [key]) * (len(self) - self.carried))
        self.carried = len(self)

    def set_sources(self, keys: bytes) -> None:
        """The carried entries' rounds, as a snapshot recorded them (ignored, leaving them
        unknown, if they do not match the carried entries)."""
        if len(keys) == 8 * self.carried:
            self.sources = array("Q")
            self.sources.frombytes(keys)

    def source_counts(self, keep: npt.NDArray[np.intp] | None, fresh_key: int) -> dict[int, int]:
        """``{source key: reports}`` of the entries ``keep`` (:meth:`resolve`), the fresh
        ones counted under ``fresh_key``."""
        carried = self.carried
        if len(self.sources) != carried:  # recovered without its sources: unknown rounds
            self.sources = array("Q", [UNKNOWN_SOURCE]) * carried
        counts: dict[int, int] = {}
        if keep is None:
            kept_carried = np.frombuffer(self.sources, dtype=U64) if carried else None
            fresh = len(self) - carried
        else:
            index = keep[keep < carried]
            kept_carried = np.frombuffer(self.sources, dtype=U64)[index] if index.size else None
            fresh = int(keep.size - index.size)
        if kept_carried is not None and kept_carried.size:
            values, numbers = np.unique(kept_carried, return_counts=True)
            counts.update(zip(values.tolist(), numbers.tolist(), strict=True))
        if fresh:
            counts[fresh_key] = counts.get(fresh_key, 0) + fresh
        return counts

    def resolve(self) -> tuple[npt.NDArray[np.intp] | None, int]:
        """``(keep, superseded)``: the indices of the entries that stay (``None``: all of
        them, in order) and how many are superseded (module docstring of :class:`Pool`)."""
        if not self.carried:
            return None, 0
        tokens = as_u64(self.tokens)
        # the last occurrence of each token wins: the first one in the reversed order
        reversed_ = tokens[::-1]
        order = np.argsort(reversed_, kind="stable")
        ranked = reversed_[order]
        first = np.ones(ranked.size, dtype=np.bool_)
        np.not_equal(ranked[1:], ranked[:-1], out=first[1:])
        keep = np.sort(tokens.size - 1 - order[first])
        return keep, int(tokens.size - keep.size)

    def size(self) -> int:
        """Reports that would be released (superseded ones left out)."""
        if not self.carried:
            return len(self)
        return len(self) - self.resolve()[1]

    def columns(
        self, keep: npt.NDArray[np.intp] | None
    ) -> tuple[Tokens, npt.NDArray[np.uint32], npt.NDArray[np.uint16]]:
        tokens, seeds, zs = as_u64(self.tokens), as_u32(self.seeds), as_u16(self.zs)
        if keep is None:
            return tokens, seeds, zs
        return tokens[keep], seeds[keep], zs[keep]

    def nbytes(self) -> int:
        columns = (self.tokens, self.seeds, self.zs, self.sources)
        return sum(c.itemsize * c.buffer_info()[1] for c in columns)


class Pending:
    """Reports offered since the last settle, for one round."""

    __slots__ = ("seeds", "tokens", "zs")

    def __init__(self) -> None:
        self.tokens = array("Q")
        self.seeds = array("I")
        self.zs = array("H")


class CoreState:
    """The state of one shuffler core and its read-only views (module docstring): the
    attributes the parts of :class:`~broker.core.machine.ShufflerCore` share."""

    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self._pools: dict[int, Pool] = {}
        self._seen: dict[int, TokenSet] = {}
        self._pending: dict[int, Pending] = {}
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
