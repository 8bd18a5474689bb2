"""The effects of the shuffler's core: immutable records of every change of its state.

:meth:`broker.core.machine.ShufflerCore.apply` folds them into the state; :mod:`broker.store`
writes them to the log (its record formats) and reads them back. Columns of reports are
packed little-endian arrays: tokens u64, seeds u32, z u16 (:mod:`broker.core.state`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BATCH_ID_OFFSET",
    "BATCH_ID_SIZE",
    "Acked",
    "Admitted",
    "Carried",
    "Closed",
    "Configured",
    "Dropped",
    "Effect",
    "Outboxed",
    "Pooled",
    "Released",
    "Seen",
    "Sourced",
    "batch_count_of",
    "batch_id_of",
    "batch_round_of",
    "is_manifest",
]

BATCH_ID_OFFSET = 10
BATCH_ID_SIZE = 16
KIND_MANIFEST = 3


@dataclass(frozen=True, slots=True)
class Admitted:
    """Reports of ``round`` accepted together (one socket read): their tokens are seen and
    the reports pooled, in arrival order."""

    round: int
    tokens: bytes
    seeds: bytes
    zs: bytes

    def __len__(self) -> int:
        return len(self.seeds) // 4


@dataclass(frozen=True, slots=True)
class Seen:
    """Every duplicate token of ``round`` (snapshots)."""

    round: int
    tokens: bytes


@dataclass(frozen=True, slots=True)
class Pooled:
    """A whole pool (snapshots): its first ``carried`` entries were carried in, and carry
    their tokens only in the pool, not in the round's duplicate tokens."""

    round: int
    carried: int
    tokens: bytes
    seeds: bytes
    zs: bytes


@dataclass(frozen=True, slots=True)
class Sourced:
    """The rounds the carried entries of the pool of ``round`` were sent in (snapshots:
    packed u64 source keys, :func:`broker.core.state.source_key`, one per carried entry)."""

    round: int
    keys: bytes


@dataclass(frozen=True, slots=True)
class Released:
    """The pool of ``round`` leaves as these sealed batch messages, followed by the
    release's sealed manifest where there is one (outbox until acked, in this order)."""

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
    """The pool of ``round`` is discarded (``reason``: ``small_round``, ``spec_changed``,
    ``at_shutdown``)."""

    round: int
    reason: str


@dataclass(frozen=True, slots=True)
class Closed:
    """Every round that ends at or before Unix time ``until`` is closed: never accepted
    again, its tokens forgotten."""

    until: int


@dataclass(frozen=True, slots=True)
class Acked:
    """The batch ``batch_id`` was acknowledged by the broker: it leaves the outbox."""

    batch_id: bytes


@dataclass(frozen=True, slots=True)
class Configured:
    """From here on, round numbers are in units of ``round_seconds`` and reports are of the
    spec ``fingerprint``. A change of ``round_seconds`` renumbers the open rounds' tokens
    (to every new round an old one overlaps) and pools (to the new round holding an old
    one's start): :meth:`ShufflerCore.reconfigure`."""

    round_seconds: int
    fingerprint: int


Effect = (
    Admitted
    | Seen
    | Pooled
    | Sourced
    | Released
    | Outboxed
    | Carried
    | Dropped
    | Closed
    | Acked
    | Configured
)


def batch_id_of(message: bytes) -> bytes:
    """The 16-byte ``batch_id`` of a (sealed) batch message (a manifest's ``release_id``:
    at the same offset)."""
    return message[BATCH_ID_OFFSET : BATCH_ID_OFFSET + BATCH_ID_SIZE]


def is_manifest(message: bytes) -> bool:
    """Whether an outbox message is a release's manifest (kind 3), not a batch."""
    return message[1] == KIND_MANIFEST


def batch_count_of(message: bytes) -> int:
    """The record count of a (sealed) batch message; 0 for a manifest."""
    if message[1] == KIND_MANIFEST:
        return 0
    return int.from_bytes(message[26:30], "big")


def batch_round_of(message: bytes) -> int:
    """The round of a (sealed) batch message."""
    return int.from_bytes(message[6:10], "big")
