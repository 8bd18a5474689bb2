"""Verified batches and manifests refused for a reason an operator can fix, kept to be
applied later (no I/O).

A batch or manifest whose signature verifies under a key the deployment announced (the
trusted one, or one announced and not yet trusted), but that a rule depending on the
configuration refuses, is not lost: the core keeps it here (:data:`KEPT_REASONS`):

* ``untrusted_key``: signed by the announced key the pin does not trust yet (a key rotation
  before ``coco aggregator trust --accept-announced``);
* ``unknown_shard``: on the topic of a shard of an announced layout not trusted yet (a
  reshard before the trust command);
* ``wrong_shard``, ``stale_round``: verified, but of a round its shard's layout does not
  serve, or below the retained horizon.

A message that does not verify under any announced key is never kept (a forgery stays
``bad_signature``). Each entry is the raw payload as it came, its kind, topic shard, the
reason and the time it was kept; its key is the SHA-256 of kind, shard and payload, so a
redelivery is kept once.

Bounded by count and bytes: when either bound is reached the oldest entry is dropped and
counted (:attr:`Quarantine.dropped`). An entry applied (or found a duplicate) by a replay is
*retired*: it stays in what the file holds until two durable checkpoint generations hold
its effect (:meth:`Quarantine.assign`, :meth:`Quarantine.durable`), so a crash between the
quarantine file and the checkpoint replays it again, and the batch id makes that a
duplicate: applied exactly once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "KEPT_REASONS",
    "Entry",
    "Quarantine",
    "entry_key",
]

KEPT_REASONS = ("untrusted_key", "unknown_shard", "wrong_shard", "stale_round")
"""The refusals whose verified messages are kept (module docs): each label of
``coco_aggregator_quarantined{reason}``."""

DEFAULT_MAX_ENTRIES = 20_000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024

Kind = Literal["batch", "manifest"]


def entry_key(kind: str, shard: str | None, payload: bytes) -> str:
    """The SHA-256 (hex) of ``kind``, ``shard`` and ``payload``: one entry per message."""
    digest = hashlib.sha256()
    digest.update(f"{kind}\0{shard or ''}\0".encode())
    digest.update(payload)
    return digest.hexdigest()


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One kept message (module docs)."""

    kind: Kind
    shard: str | None
    reason: str
    at: float
    payload: bytes

    @property
    def key(self) -> str:
        return entry_key(self.kind, self.shard, self.payload)


class Quarantine:
    """The kept messages, oldest first, bounded (module docs)."""

    def __init__(
        self, *, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("the quarantine's bounds must be >= 1")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: dict[str, Entry] = {}
        self._retired: dict[str, tuple[Entry, int | None]] = {}
        """Entries a replay applied, with the generation of the first checkpoint that
        holds their effect (``None`` until one is snapshotted)."""
        self.bytes = 0
        self.dropped = 0
        """Entries dropped to keep the bounds (oldest first)."""
        self.discarded = 0
        """Entries a replay found no longer verifiable (the announced key changed again)."""
        self.version = 0
        """Bumped by every change of what the file holds."""

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    def counts(self) -> dict[str, int]:
        """Entries by reason, every :data:`KEPT_REASONS` present."""
        counts = dict.fromkeys(KEPT_REASONS, 0)
        for entry in self._entries.values():
            counts[entry.reason] = counts.get(entry.reason, 0) + 1
        return counts

    def add(self, entry: Entry) -> bool:
        """Keep ``entry``: ``False`` if it is kept already (a redelivery) or is larger
        than the byte bound by itself (dropped, counted)."""
        key = entry.key
        if key in self._entries or key in self._retired:
            return False
        size = len(entry.payload)
        if size > self.max_bytes:
            self.dropped += 1
            self.version += 1
            return False
        while self._entries and (
            len(self._entries) >= self.max_entries or self.bytes + size > self.max_bytes
        ):
            oldest = next(iter(self._entries))
            self._remove(oldest)
            self.dropped += 1
        self._entries[key] = entry
        self.bytes += size
        self.version += 1
        return True

    def _remove(self, key: str) -> Entry:
        entry = self._entries.pop(key)
        self.bytes -= len(entry.payload)
        self.version += 1
        return entry

    def retire(self, key: str) -> None:
        """A replay applied ``key``'s message (or found it applied already)."""
        entry = self._remove(key)
        self._retired[key] = (entry, None)

    def discard(self, key: str) -> None:
        """A replay found ``key``'s message no longer verifiable: dropped, counted."""
        self._remove(key)
        self.discarded += 1

    def rekeep(self, key: str, reason: str) -> None:
        """A replay refused ``key``'s message again, for ``reason`` (still kept)."""
        entry = self._entries[key]
        if entry.reason != reason:
            self._entries[key] = replace(entry, reason=reason)
            self.version += 1

    def assign(self, generation: int) -> None:
        """A checkpoint of ``generation`` was snapshotted: it holds what was retired."""
        for key, (entry, assigned) in list(self._retired.items()):
            if assigned is None:
                self._retired[key] = (entry, generation)

    def durable(self, generation: int) -> None:
        """Checkpoint ``generation`` is durable: forget the retired entries two durable
        generations hold (those of ``generation - 1`` and before)."""
        for key, (_entry, assigned) in list(self._retired.items()):
            if assigned is not None and assigned < generation:
                del self._retired[key]
                self.version += 1

    def persisted(self) -> list[tuple[Entry, bool]]:
        """What the file holds: the entries retired but not yet forgotten (``True``: applied)
        and those kept (``False``)."""
        retired = [(entry, True) for entry, _ in self._retired.values()]
        return retired + [(entry, False) for entry in self._entries.values()]

    def restore(self, entries: list[Entry], *, dropped: int = 0, discarded: int = 0) -> None:
        """Start from a file's entries (retired ones among them replay as duplicates)."""
        self._entries.clear()
        self._retired.clear()
        self.bytes = 0
        for entry in entries:
            self.add(entry)
        self.dropped += dropped
        self.discarded += discarded
