"""The aggregator's privacy ledger: releases from manifests and applied batches, one
participation per round, idempotent records, compaction; the old per-batch API; and the
pessimistic reading of a checkpoint written before the history was kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aggregator.accountant import amplify_spec, blanket_pair_for_spec, epsilon_total_batches
from aggregator.accountant.history import epsilon_total_rounds
from aggregator.ledger.privacy_ledger import SIGNIFICANT_BITS, PrivacyLedger, accounting_size
from aggregator.service.checkpoint_files import load_checkpoint
from aggregator.service.core.checkpoint import CheckpointError
from edge.spec import MechanismSpec

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DELTA = 1e-6


def test_levels_are_the_accountant_s_for_the_batches_recorded() -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    empty = ledger.compute(ledger.snapshot())
    assert empty.epsilon_total is None
    assert empty.epsilon_central == {"smallest": None, "latest": None}
    for size in (1000, 500, 1000, 2000):
        ledger.record(size)
    level = ledger.compute(ledger.snapshot())
    assert level.batches == 4
    small, latest = amplify_spec(SPEC, n=500, delta=DELTA), amplify_spec(SPEC, n=2000, delta=DELTA)
    assert level.epsilon_central == {
        "smallest": small.epsilon_central,
        "latest": latest.epsilon_central,
    }
    assert level.epsilon_central_generic == {
        "smallest": small.epsilon_central_generic,
        "latest": latest.epsilon_central_generic,
    }
    # epsilon_total composes the pairs of the accounting sizes (500 -> 496, 1000 -> 992,
    # 2000 -> 1984: five significant bits), a pessimistic reading of the exact sizes
    pairs = [blanket_pair_for_spec(SPEC, n=n) for n in (496, 992, 992, 1984)]
    assert level.epsilon_total == epsilon_total_batches(pairs=pairs, delta=DELTA)
    exact = [blanket_pair_for_spec(SPEC, n=n) for n in (500, 1000, 1000, 2000)]
    assert level.epsilon_total >= epsilon_total_batches(pairs=exact, delta=DELTA)
    # composing more batches never lowers the total; one batch costs its own epsilon at most
    assert level.epsilon_total is not None
    assert level.epsilon_total >= small.epsilon_central
    ledger.record(2000)
    more = ledger.compute(ledger.snapshot())
    assert more.epsilon_total is not None
    assert more.epsilon_total >= level.epsilon_total
    assert set(more.to_dict()) == {
        "epsilon_central",
        "epsilon_central_generic",
        "epsilon_total",
        "batches_accounted",
    }


def _checkpoint(tmp_path: Path, **fields: object) -> Path:
    """A minimal valid version-2 checkpoint of 3 applied batches, with ``fields`` replaced."""
    from aggregator.estimation.estimators import AggregateState  # noqa: PLC0415

    state = AggregateState(SPEC)
    doc: dict[str, object] = {
        "version": 2,
        "fingerprint": SPEC.fingerprint,
        "deployment": "dep",
        "delta": DELTA,
        "state": state.to_dict(),
        "batch_rounds": {},
        "retention_rounds": 10,
        "counters": {"reports": 0, "batches": 3, "duplicates": 0, "rejected": {}},
        "smallest_batch": 100,
        "latest_batch": 300,
        "last_batch_timestamp": None,
        **fields,
    }
    path = tmp_path / "ckpt.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_checkpoint_without_history_counts_every_batch_as_the_smallest(tmp_path: Path) -> None:
    checkpoint = load_checkpoint(_checkpoint(tmp_path))
    assert checkpoint.batch_sizes == {100: 3}  # the largest per-batch epsilon: an upper bound
    recorded = load_checkpoint(_checkpoint(tmp_path, batch_sizes={"100": 1, "300": 2}))
    assert recorded.batch_sizes == {100: 1, 300: 2}
    for bad, field in (
        ({"100": 1}, "batch_sizes"),  # counts 1 batch, counters say 3
        ({"x": 3}, "batch_sizes.x"),
        ({"100": -3}, "batch_sizes.100"),
    ):
        with pytest.raises(CheckpointError, match=field):
            load_checkpoint(_checkpoint(tmp_path, batch_sizes=bad))


def test_a_level_is_shown_only_beside_the_batch_sizes_it_was_computed_for() -> None:
    """A level computed before a smaller batch arrived must not show the larger batch's
    epsilon (smaller: an overstatement of privacy) beside the new smallest size."""
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    ledger.record(1000)
    level = ledger.compute(ledger.snapshot())
    assert level.sizes == {"smallest": 1000, "latest": 1000}
    same = level.for_sizes(smallest=1000, latest=1000)
    assert same.epsilon_central == level.epsilon_central
    assert same.epsilon_central_generic == level.epsilon_central_generic
    ledger.record(500)  # a smaller batch arrives before the level is recomputed
    shown = level.for_sizes(smallest=ledger.smallest, latest=ledger.latest)
    assert shown.epsilon_central == {"smallest": None, "latest": None}
    assert shown.epsilon_central_generic == {"smallest": None, "latest": None}
    assert shown.epsilon_total == level.epsilon_total  # qualified by batches instead
    assert shown.batches == 1
    ledger.record(1000)  # the latest size is again the one the level was computed for
    shown = level.for_sizes(smallest=ledger.smallest, latest=ledger.latest)
    assert shown.epsilon_central == {"smallest": None, "latest": level.epsilon_central["latest"]}


def test_accounting_sizes_round_down_to_five_significant_bits_and_stay_few() -> None:
    small = (1, 2, 31, 32, 33, 63, 64, 65, 1000)
    assert [accounting_size(n) for n in small] == [1, 2, 31, 32, 32, 62, 64, 64, 992]
    for n in range(1, 5000):
        size = accounting_size(n)
        assert size <= n  # never more reports than the batch holds: pessimistic
        assert 16 * size >= 15 * n  # at most 1/16 fewer
        # at most five significant bits: the low bits are zero
        assert size % (1 << max(0, size.bit_length() - SIGNIFICANT_BITS)) == 0
    # one size per 5-bit mantissa: 16 per doubling however many distinct batch sizes come
    assert len({accounting_size(n) for n in range(10_000, 20_000)}) <= 17
    with pytest.raises(ValueError, match="at least one report"):
        accounting_size(0)


def bid(i: int) -> bytes:
    """A 16-byte id."""
    return i.to_bytes(16, "big")


def total(rounds: dict[int, int]) -> float:
    return epsilon_total_rounds(SPEC, rounds, delta=DELTA)


def test_a_release_cut_into_slices_is_one_participation() -> None:
    """The issue's case: a round of 2,000 cut into 3 batches by max_batch is one shuffle of
    2,000, not three participations of about 666."""
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    slices = [(bid(1), 667), (bid(2), 667), (bid(3), 666)]
    assert ledger.record_manifest(round=7, shard="", release_id=bid(100), batches=slices) == (
        "recorded"
    )
    for batch_id, size in slices:
        assert ledger.record_batch(round=7, shard="", batch_id=batch_id, size=size) == "covered"
    assert ledger.rounds() == {2000: 1}
    level = ledger.compute(ledger.snapshot())
    assert level.batches == 1
    assert level.epsilon_total == total({2000: 1})
    assert level.sizes == {"smallest": 2000, "latest": 2000}
    assert (
        level.epsilon_central["smallest"] == amplify_spec(SPEC, n=2000, delta=DELTA).epsilon_central
    )
    per_batch = total({666: 3})  # the old accounting: three participations
    assert level.epsilon_total is not None
    assert level.epsilon_total < per_batch / 2


L = 60  # round_seconds of the sources below


def test_a_round_costs_its_smallest_release_over_shards_and_early_releases() -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA)

    def release(round_: int, shard: str, i: int, size: int) -> None:
        ledger.record_manifest(
            round=round_,
            shard=shard,
            release_id=bid(i),
            batches=[(bid(10 + i), size)],
            sources=[(round_, L)],
        )

    release(1, "g0s0", 1, 900)
    release(1, "g0s1", 2, 700)
    # an early release and the rest of the round, same shard
    release(1, "g0s1", 3, 400)
    release(2, "g0s0", 4, 1000)
    assert ledger.rounds() == {400: 1, 1000: 1}
    assert ledger.smallest == 400
    assert ledger.latest == 1000
    assert ledger.releases == 4
    assert ledger.compute(ledger.snapshot()).epsilon_total == total({400: 1, 1000: 1})
    # a manifest that does not say which rounds its reports were sent in is its own
    # participation, whatever round it bears
    ledger.record_manifest(round=2, shard="g0s1", release_id=bid(5), batches=[(bid(15), 800)])
    assert ledger.rounds() == {400: 1, 800: 1, 1000: 1}


def test_a_carried_report_charges_the_round_it_was_sent_in() -> None:
    """Carry and an early release: X's report of round 0 was carried into round 1 and left
    in round 1's early release with A and B; X's own round-1 report left later with C. Both
    releases bear round 1, but X is in both: two participations (round 0 at 3 reports,
    round 1 at its smallest release of 2), not one."""
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    ledger.record_manifest(
        round=1, shard="", release_id=bid(1), batches=[(bid(11), 3)], sources=[(0, L), (1, L)]
    )
    ledger.record_manifest(
        round=1, shard="", release_id=bid(2), batches=[(bid(12), 2)], sources=[(1, L)]
    )
    assert ledger.rounds() == {2: 1, 3: 1}
    # the same round numbers counted in another round length are other rounds
    ledger.record_manifest(
        round=1, shard="", release_id=bid(3), batches=[(bid(13), 5)], sources=[(1, 2 * L)]
    )
    assert ledger.rounds() == {2: 1, 3: 1, 5: 1}
    # reports of an unknown round: the release is a participation of its own
    ledger.record_manifest(
        round=2,
        shard="",
        release_id=bid(4),
        batches=[(bid(14), 7)],
        sources=[(2, L), (2**32 - 1, 0)],
    )
    assert ledger.rounds() == {2: 1, 3: 1, 5: 1, 7: 2}


def test_records_are_idempotent_and_a_late_manifest_replaces_the_batch_record() -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    # batches arrive first, with no manifest: a participation each (nothing tells which
    # rounds their reports were sent in)
    assert ledger.record_batch(round=5, shard="", batch_id=bid(1), size=1000) == "recorded"
    assert ledger.record_batch(round=5, shard="", batch_id=bid(2), size=999) == "recorded"
    assert ledger.rounds() == {999: 1, 1000: 1}
    generation = ledger.generation
    assert ledger.record_batch(round=5, shard="", batch_id=bid(1), size=1000) == "duplicate"
    assert ledger.generation == generation
    # the manifest arrives: the release and its rounds replace the batch records
    batches = [(bid(1), 1000), (bid(2), 999)]
    sources = [(5, L)]
    assert ledger.record_manifest(
        round=5, shard="", release_id=bid(9), batches=batches, sources=sources
    ) == ("recorded")
    assert ledger.rounds() == {1999: 1}
    generation = ledger.generation
    assert ledger.record_manifest(
        round=5, shard="", release_id=bid(9), batches=batches, sources=sources
    ) == ("duplicate")
    assert ledger.record_batch(round=5, shard="", batch_id=bid(2), size=999) == "duplicate"
    assert ledger.generation == generation
    assert ledger.rounds() == {1999: 1}


def test_a_manifest_accounts_for_batches_never_applied_here() -> None:
    """Released but refused here (stale round), or lost: the devices spent it all the same."""
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    for r in range(3):
        ledger.record_manifest(round=r, shard="", release_id=bid(r), batches=[(bid(10 + r), 500)])
    ledger.record_batch(round=2, shard="", batch_id=bid(12), size=500)
    assert ledger.rounds() == {500: 3}


def test_batches_of_a_partly_listed_round_keep_their_own_record() -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    ledger.record_manifest(
        round=3, shard="", release_id=bid(1), batches=[(bid(11), 800)], sources=[(3, L)]
    )
    ledger.record_batch(round=3, shard="", batch_id=bid(11), size=800)
    # a batch of the same round that no manifest lists (another release): its own record
    ledger.record_batch(round=3, shard="", batch_id=bid(12), size=300)
    assert ledger.rounds() == {300: 1, 800: 1}
    assert ledger.releases == 2


@pytest.mark.parametrize(
    "case",
    [
        "batch_replayed_with_another_size",
        "batch_listed_with_another_count",
        "batch_listed_in_another_round",
        "batch_listed_by_two_manifests",
        "manifest_replayed_with_other_batches",
    ],
)
def test_contradictions_are_refused_and_change_nothing(case: str) -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    ledger.record_manifest(round=4, shard="g0s0", release_id=bid(1), batches=[(bid(11), 600)])
    ledger.record_batch(round=4, shard="g0s0", batch_id=bid(11), size=600)
    ledger.record_batch(round=4, shard="g0s0", batch_id=bid(12), size=700)
    before, generation = ledger.to_dict(), ledger.generation
    if case == "batch_replayed_with_another_size":
        outcome = ledger.record_batch(round=4, shard="g0s0", batch_id=bid(12), size=70)
    elif case == "batch_listed_with_another_count":
        outcome = ledger.record_manifest(
            round=4, shard="g0s0", release_id=bid(2), batches=[(bid(12), 701)]
        )
    elif case == "batch_listed_in_another_round":
        outcome = ledger.record_manifest(
            round=5, shard="g0s0", release_id=bid(2), batches=[(bid(12), 700)]
        )
    elif case == "batch_listed_by_two_manifests":
        outcome = ledger.record_manifest(
            round=4, shard="g0s0", release_id=bid(2), batches=[(bid(11), 600)]
        )
    else:
        outcome = ledger.record_manifest(
            round=4, shard="g0s0", release_id=bid(1), batches=[(bid(11), 300), (bid(13), 300)]
        )
    assert outcome == "mismatch"
    assert ledger.to_dict() == before
    assert ledger.generation == generation


def test_invalid_records_are_value_errors() -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    for kwargs, match in (
        ({"round": -1, "shard": "", "batch_id": bid(1), "size": 5}, "round"),
        ({"round": 2**32 * 86_400, "shard": "", "batch_id": bid(1), "size": 5}, "round"),
        ({"round": 1, "shard": "", "batch_id": b"short", "size": 5}, "batch_id"),
        ({"round": 1, "shard": "", "batch_id": bid(1), "size": 0}, "size"),
    ):
        with pytest.raises(ValueError, match=match):
            ledger.record_batch(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one batch"):
        ledger.record_manifest(round=1, shard="", release_id=bid(1), batches=[])
    with pytest.raises(ValueError, match="each batch once"):
        ledger.record_manifest(
            round=1, shard="", release_id=bid(1), batches=[(bid(2), 5), (bid(2), 5)]
        )
    assert ledger.generation == 0


def test_compaction_keeps_the_cost_and_counts_late_records_pessimistically() -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    for r, size in enumerate((1000, 700, 1000, 1200)):
        ledger.record_manifest(round=r, shard="", release_id=bid(r), batches=[(bid(50 + r), size)])
    before = ledger.compute(ledger.snapshot())
    assert ledger.compact(2) == 3
    assert ledger.rounds() == {accounting_size(700): 1, accounting_size(1000): 2, 1200: 1}
    after = ledger.compute(ledger.snapshot())
    assert after.epsilon_total == before.epsilon_total  # composed at accounting sizes anyway
    assert after.sizes == {"smallest": 700, "latest": 1200}
    assert ledger.compact(1) == 0  # already folded
    # a replay of a folded manifest: its id is remembered (a bounded memory), not charged
    replay = ledger.record_manifest(round=1, shard="", release_id=bid(1), batches=[(bid(51), 700)])
    assert replay == "duplicate"
    assert sum(ledger.rounds().values()) == 4
    # another manifest of a compacted round cannot be told from one counted: counted again
    outcome = ledger.record_manifest(round=1, shard="", release_id=bid(9), batches=[(bid(59), 700)])
    assert outcome == "late"
    assert ledger.rounds()[700] == 1
    assert sum(ledger.rounds().values()) == 5


def test_the_old_per_batch_api_adds_up_with_releases() -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    ledger.record(500)
    ledger.record(500)
    ledger.record_manifest(round=9, shard="", release_id=bid(1), batches=[(bid(2), 800)])
    assert ledger.rounds() == {500: 2, 800: 1}
    assert ledger.compute(ledger.snapshot()).batches == 3


def test_a_level_is_tagged_with_the_generation_it_covers() -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    ledger.record_batch(round=1, shard="", batch_id=bid(1), size=400)
    level = ledger.compute(ledger.snapshot())
    assert level.generation == ledger.generation
    ledger.record_batch(round=2, shard="", batch_id=bid(2), size=400)
    assert level.generation < ledger.generation
