"""What the privacy ledger records, and the checks on it: release (manifest) and batch
records, the participations they charge, their content digest, and the validation of every
field a record takes (ids, rounds, sizes, sources, shard labels). Pure: no I/O."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Final

from edge.rounds import MAX_ROUND_SECONDS, MAX_START

ID_BYTES: Final = 16
"""Length of a release id and of a batch id (docs/protocol.md)."""
MAX_ROUND: Final = 0xFFFFFFFF

Key = tuple[object, ...]
"""A participation: ``("s", round, round_seconds)`` (a source round), ``("r", release_id)``
(a release whose sources are unknown) or ``("b", batch_id)`` (a batch without manifest)."""


@dataclass(frozen=True, slots=True)
class ManifestRecord:
    round: int
    """The start of the release's round (Unix seconds; its number in a file of format
    version 2 or older, or without a round length)."""
    shard: str
    batches: tuple[tuple[bytes, int], ...]
    sources: tuple[tuple[int, int], ...] | None = None
    """The ``(round, round_seconds)`` its reports were sent in (``None``: not known)."""

    @property
    def size(self) -> int:
        return sum(count for _, count in self.batches)

    def keys(self, release_id: bytes) -> list[Key]:
        """The participations this release charges."""
        if self.sources is None or not self.sources:
            return [("r", release_id)]
        keys: list[Key] = [("s", r, length) for r, length in self.sources if length > 0]
        if any(length == 0 for _, length in self.sources):  # an unknown round among them
            keys.append(("r", release_id))
        return keys


@dataclass(frozen=True, slots=True)
class BatchRecord:
    round: int
    shard: str
    size: int
    seconds: int = field(default=0, compare=False, repr=False)
    """The length of its round as the batch carries it (wire version 2), 0 if it carries
    none (version 1: read under the announced length). It dates the batch's participation
    while no manifest lists it; a replay of the same bytes carries the same length, so it is
    left out of equality and of the :func:`digest` (which files already hold)."""


def check_id(name: str, value: bytes) -> bytes:
    if not isinstance(value, bytes) or len(value) != ID_BYTES:
        raise ValueError(f"{name} must be {ID_BYTES} bytes, got {value!r}")
    return value


def check_round(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ROUND:
        raise ValueError(f"round must be an integer in [0, 2^32), got {value!r}")
    return value


def check_start(value: int) -> int:
    """A release round's start, Unix seconds (the key of the ledger's records)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_START:
        raise ValueError(f"a round start must be an integer in [0, {MAX_START}], got {value!r}")
    return value


def check_size(name: str, value: int, *, high: int = MAX_ROUND) -> int:
    """A count or size: at least 1, and at most the wire's u32 field (the ledger's file
    keeps what the ledger accepts, and a count above it cannot come from a shuffler)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if value > high:
        raise ValueError(f"{name} must be at most {high}, got {value}")
    return value


def check_source(value: tuple[int, int]) -> tuple[int, int]:
    if not (isinstance(value, tuple | list) and len(value) == 2):
        raise ValueError(f"a source is (round, round_seconds), got {value!r}")
    round_, length = check_round(value[0]), value[1]
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= MAX_ROUND:
        raise ValueError(f"round_seconds must be an integer in [0, 2^32), got {length!r}")
    if length == 0 and round_ != MAX_ROUND:
        raise ValueError("round_seconds 0 stands only for an unknown round (2^32 - 1)")
    return round_, length


def check_seconds(value: int) -> int:
    """A batch's round length: in ``[1, 86400]`` as the wire allows, or 0 (not carried)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ROUND_SECONDS:
        raise ValueError(f"round_seconds must be an integer in [0, 86400], got {value!r}")
    return value


def check_shard(value: str) -> str:
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError(f"shard must be a label of at most 64 characters, got {value!r}")
    return value


def digest(record: ManifestRecord | BatchRecord) -> bytes:
    """16 bytes naming a record's content (its ``repr``: tuples of ints, bytes and str)."""
    return hashlib.blake2b(repr(record).encode(), digest_size=16).digest()
