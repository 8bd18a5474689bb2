"""What the privacy ledger is charged for a verified batch or release, applied or not (no
I/O): the accounting rules of :class:`~aggregator.service.core.machine.AggregatorCore`."""

from __future__ import annotations

from aggregator.ledger.privacy_ledger import PrivacyLedger
from aggregator.service.core.checkpoint import Counters

Entries = list[tuple[bytes, int]]
"""A manifest's ``(batch_id, count)`` entries."""
Sources = list[tuple[int, int, int]]
"""A manifest's ``(round, round_seconds, count)`` sources."""

__all__ = [
    "Entries",
    "Sources",
    "account_batch",
    "account_release",
    "charge_unplaced",
    "count_conflict",
]


def account_release(
    ledger: PrivacyLedger,
    counters: Counters,
    *,
    min_batch: int,
    shard: str | None,
    round_: int,
    release_id: bytes,
    entries: Entries,
    sources: Sources,
) -> None:
    """A verified release goes into the privacy ledger, applied here or not. One the
    ledger cannot place (it contradicts a record, or a field is out of its range: an
    empty release, a zero count, an unknown round with a length) is charged as an
    extra participation at the smallest size a release can have (or the size it
    claims, if smaller: :func:`charge_unplaced`), and counted
    (``ledger_conflict``): its claimed counts are not to be trusted."""
    try:
        outcome = ledger.record_manifest(
            round=round_,
            shard=shard or "",
            release_id=release_id,
            batches=entries,
            sources=[(r, length) for r, length, count in sources if count > 0],
        )
    except ValueError:
        outcome = "mismatch"
    if outcome == "mismatch":
        charge_unplaced(ledger, min_batch, entries)
        count_conflict(counters)


def account_batch(
    ledger: PrivacyLedger,
    counters: Counters,
    *,
    round_: int,
    shard: str | None,
    batch_id: bytes,
    size: int,
    seconds: int = 0,
) -> None:
    """A verified batch (of a round of ``seconds``, 0 if not known) goes into the privacy
    ledger; one that contradicts a record is charged as an extra participation at its own
    (real) size, and counted."""
    outcome = ledger.record_batch(
        round=round_, shard=shard or "", batch_id=batch_id, size=size, seconds=seconds
    )
    if outcome == "mismatch":
        ledger.record_extra(size=size)
        count_conflict(counters)


def charge_unplaced(ledger: PrivacyLedger, min_batch: int, entries: Entries) -> None:
    """One extra participation for a verified release the ledger cannot place: at
    ``min_batch``, or at the smallest count its manifest lists if that is smaller (a
    smaller release amplifies less, and claims the ledger could not place are not
    trusted to be larger: never a size above the real one)."""
    counts = [count for _, count in entries if count > 0]
    size = min([min_batch, *counts])
    ledger.record_extra(size=size)


def count_conflict(counters: Counters) -> None:
    rejects = counters.manifests_rejected
    rejects["ledger_conflict"] = rejects.get("ledger_conflict", 0) + 1
