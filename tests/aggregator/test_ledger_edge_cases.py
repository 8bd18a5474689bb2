"""The privacy ledger's edge cases: duplicate source rounds, out-of-order releases, a
release with a zero count, overflow-sized counts. Each is accounted conservatively or
refused with a clear error and a counter; never a crash, never fewer participations (or a
larger size) than the releases give."""

from __future__ import annotations

from collections.abc import Mapping
from random import Random
from typing import Any

import pytest

from aggregator.accountant import BlanketPair
from aggregator.accountant import history as history_module
from aggregator.accountant.blanket import MAX_N
from aggregator.ledger import privacy_ledger
from aggregator.ledger.privacy_ledger import PrivacyLedger
from edge.codec import encode_manifest
from edge.spec import MechanismSpec
from tests.aggregator.test_shards_and_manifests import (
    NOW,
    OLD,
    ROUND,
    SPEC,
    bid,
    core,
    raw,
)

DELTA = 1e-6
U32 = 2**32 - 1


def rid(n: int) -> bytes:
    return (10_000 + n).to_bytes(16, "big")


def ledger() -> PrivacyLedger:
    return PrivacyLedger(SPEC, delta=DELTA)


# -- duplicate source rounds --------------------------------------------------------------


def test_a_source_round_listed_twice_in_a_manifest_is_one_participation() -> None:
    led = ledger()
    sources = [(5, 60), (5, 60), (6, 60), (5, 60)]
    assert (
        led.record_manifest(
            round=6, shard="", release_id=rid(1), batches=[(bid(1), 100)], sources=sources
        )
        == "recorded"
    )
    assert led.rounds() == {100: 2}  # rounds 5 and 6, once each


def test_a_source_round_in_two_releases_is_charged_once_at_the_smaller() -> None:
    led = ledger()
    led.record_manifest(round=6, shard="", release_id=rid(1), batches=[(bid(1), 100)],
                        sources=[(5, 60), (6, 60)])  # fmt: skip
    led.record_manifest(round=7, shard="", release_id=rid(2), batches=[(bid(2), 30)],
                        sources=[(5, 60), (7, 60)])  # fmt: skip
    # round 5 at its smallest release (30), round 6 at 100, round 7 at 30
    assert led.rounds() == {30: 2, 100: 1}


def test_one_round_under_two_lengths_is_two_participations() -> None:
    """(round, round_seconds) keys a source: the same number under another length is
    another interval of time, never merged with it (more participations, not fewer)."""
    led = ledger()
    led.record_manifest(round=6, shard="", release_id=rid(1), batches=[(bid(1), 50)],
                        sources=[(6, 10), (6, 20)])  # fmt: skip
    assert led.rounds() == {50: 2}


# -- out-of-order releases ----------------------------------------------------------------

RECORDS: list[tuple[str, dict[str, Any]]] = [
    ("m", {"round": 10, "release_id": rid(1), "batches": [(bid(1), 40), (bid(2), 41)],
           "sources": [(10, 60)]}),
    ("m", {"round": 11, "release_id": rid(2), "batches": [(bid(3), 25)],
           "sources": [(10, 60), (11, 60)]}),
    ("m", {"round": 12, "release_id": rid(3), "batches": [(bid(4), 60)], "sources": None}),
    ("b", {"round": 12, "batch_id": bid(9), "size": 33}),
    ("b", {"round": 10, "batch_id": bid(1), "size": 40}),
    ("m", {"round": 13, "release_id": rid(4), "batches": [(bid(5), 70)],
           "sources": [(12, 60), (13, 60), (2**32 - 1, 0)]}),
]  # fmt: skip


def _play(led: PrivacyLedger, order: list[int]) -> None:
    for i in order:
        kind, fields = RECORDS[i]
        if kind == "m":
            led.record_manifest(shard="", **fields)
        else:
            led.record_batch(shard="", **fields)


def test_the_order_of_releases_does_not_change_what_is_charged() -> None:
    reference = ledger()
    _play(reference, list(range(len(RECORDS))))
    expected = reference.rounds()
    # 10 at 25; 11 at 25; release 3 (no sources) at 60; batch 9 at 33; 12 and 13 at 70,
    # and release 4's unknown round at 70
    assert expected == {25: 2, 33: 1, 60: 1, 70: 3}
    rng = Random(20261126)
    for _ in range(50):
        order = list(range(len(RECORDS)))
        rng.shuffle(order)
        led = ledger()
        _play(led, order)
        assert led.rounds() == expected, order
        assert led.smallest == reference.smallest


def test_a_release_after_its_round_was_compacted_is_charged_again() -> None:
    """Out of order across a compaction: the late release cannot be told from one already
    counted, so it is an extra participation (never fewer than in order)."""
    in_order = ledger()
    _play(in_order, list(range(len(RECORDS))))
    late = ledger()
    _play(late, [0, 2, 3, 4, 5])
    late.compact(12)
    _play(late, [1])  # round 11's release, after round 11 was folded
    charged = sum(late.rounds().values())
    assert charged >= sum(in_order.rounds().values())
    assert late.rounds().get(25, 0) >= 1  # at its own size


# -- zero counts --------------------------------------------------------------------------


def test_the_ledger_refuses_a_zero_count_or_an_empty_release_with_a_clear_error() -> None:
    led = ledger()
    with pytest.raises(ValueError, match="count must be an integer >= 1, got 0"):
        led.record_manifest(round=1, shard="", release_id=rid(1), batches=[(bid(1), 0)])
    with pytest.raises(ValueError, match="at least one batch"):
        led.record_manifest(round=1, shard="", release_id=rid(1), batches=[])
    with pytest.raises(ValueError, match="size must be an integer >= 1, got 0"):
        led.record_batch(round=1, shard="", batch_id=bid(1), size=0)
    assert led.rounds() == {}
    assert led.generation == 0  # nothing half-recorded


def _sealed(entries: list[tuple[int, int]], sources: list[tuple[int, int, int]]) -> bytes:
    body = encode_manifest(
        SPEC.fingerprint_int, ROUND, rid(7), [(bid(b), c) for b, c in entries], sources
    )
    return OLD["g0s0"].seal_manifest(body)


def test_a_signed_manifest_with_a_zero_count_is_charged_and_counted() -> None:
    """A trusted shuffler released it: its other batches are real releases. It is refused
    by reconciliation (a count below min_batch) and charged one extra participation at
    min_batch (its claimed sizes are not to be trusted), never a crash."""
    agg = core()
    before = sum(agg.ledger.rounds().values())
    outcome = agg.manifest(_sealed([(1, 0), (2, 50)], [(ROUND, 60, 50)]), now=NOW, shard="g0s0")
    assert outcome == "manifest_mismatch"
    assert agg.counters.manifests_rejected == {"manifest_mismatch": 1}
    assert agg.ledger.rounds() == {agg.rules.min_batch: 1}
    assert sum(agg.ledger.rounds().values()) == before + 1


def test_an_unknown_round_with_a_length_is_charged_and_counted_not_a_crash() -> None:
    """A source (round, round_seconds = 0) with a real round number is out of the ledger's
    range (0 stands only for an unknown round): the release is charged as an extra
    participation and counted as ``ledger_conflict``."""
    agg = core()
    payload = _sealed([(1, 50)], [(ROUND, 0, 50)])
    assert agg.manifest(payload, now=NOW, shard="g0s0") == "accepted"
    assert agg.counters.manifests_rejected == {"ledger_conflict": 1}
    assert agg.ledger.rounds() == {agg.rules.min_batch: 1}


def test_a_batch_contradicting_its_manifest_is_charged_at_its_own_size() -> None:
    agg = core()
    good = _sealed([(1, 5)], [(ROUND, 60, 5)])
    assert agg.manifest(good, now=NOW, shard="g0s0") == "accepted"
    # the batch the manifest lists, with another size (a different batch under its id)
    assert agg.handle(OLD["g0s0"].seal(raw(6, 1)), now=NOW, shard="g0s0") == "applied"
    rejected = agg.counters.manifests_rejected
    assert rejected.get("ledger_conflict") == 1
    assert agg.ledger.rounds() == {5: 1, 6: 1}  # the release, and the batch on its own


# -- overflow-sized counts ----------------------------------------------------------------


def test_overflow_sized_counts_are_recorded_exactly_and_composed_at_max_n(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counts at the u32 limit add up past 2^32 (Python ints: no wraparound); the ledger
    keeps the exact size and composes it as MAX_N reports (pessimistic), and a level is
    computed, not an error."""
    led = ledger()
    batches = [(bid(i), U32) for i in range(3)]
    assert (
        led.record_manifest(
            round=1, shard="", release_id=rid(1), batches=batches, sources=[(1, 60)]
        )
        == "recorded"
    )
    assert led.rounds() == {3 * U32: 1}
    seen: list[Mapping[BlanketPair, int]] = []
    sizes: list[int] = []

    def fake_total(counts: Mapping[BlanketPair, int], *, delta: float) -> float:
        assert delta == DELTA
        seen.append(dict(counts))
        return 1.0

    class Record:
        epsilon_central = 0.5
        epsilon_central_generic = 0.9

    def fake_amplify(spec: MechanismSpec, *, n: int, delta: float) -> Record:
        assert (spec, delta) == (SPEC, DELTA)
        sizes.append(n)
        return Record()

    monkeypatch.setattr(history_module, "epsilon_total_counts", fake_total)
    monkeypatch.setattr(privacy_ledger, "amplify_spec", fake_amplify)
    level = led.compute(led.snapshot())
    assert level.epsilon_total == 1.0
    ((pair, count),) = seen[0].items()
    assert (pair.n, count) == (MAX_N, 1)
    assert sizes == [MAX_N]  # smallest and latest are the same size: computed once
    assert level.sizes == {"smallest": 3 * U32, "latest": 3 * U32}


def test_overflow_sized_counts_survive_the_ledger_file_or_are_refused(tmp_path: Any) -> None:
    from aggregator.ledger import ledger_file  # noqa: PLC0415

    led = ledger()
    led.record_manifest(round=1, shard="", release_id=rid(1),
                        batches=[(bid(1), U32), (bid(2), U32)], sources=[(1, 60)])  # fmt: skip
    with pytest.raises(ValueError, match="size must be at most 4294967295, got 1099511627776"):
        led.record_batch(round=2, shard="", batch_id=bid(3), size=2**40)  # above the wire's u32
    with pytest.raises(ValueError, match="count must be at most 4294967295"):
        led.record_manifest(round=3, shard="", release_id=rid(3), batches=[(bid(4), 2**32)])
    led.record_batch(round=2, shard="", batch_id=bid(3), size=U32)
    led.record_extra(size=2**45)
    path = tmp_path / "x.ledger"
    ledger_file.save_ledger(path, led)
    again = ledger_file.load_ledger(path, spec=SPEC, delta=DELTA)
    assert again is not None
    assert again.rounds() == led.rounds() == {U32: 1, 2 * U32: 1, 2**45: 1}


def test_a_signed_manifest_listing_no_batch_is_charged_and_counted_not_a_crash() -> None:
    """Refused by reconciliation (it lists nothing), yet a trusted shuffler sent it: one
    extra participation at min_batch."""
    agg = core()
    assert agg.manifest(_sealed([], []), now=NOW, shard="g0s0") == "manifest_mismatch"
    assert agg.counters.manifests_rejected == {"manifest_mismatch": 1}
    assert agg.ledger.rounds() == {agg.rules.min_batch: 1}
