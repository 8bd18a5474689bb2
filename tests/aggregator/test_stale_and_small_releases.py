"""Releases the aggregator refuses but a trusted shuffler made all the same: a batch or
manifest of a round older than the horizon (``stale_round``) and a batch below
``min_batch``. Whoever listens on the batches topic has them, so the privacy ledger charges
them (at their real size), a replay is not charged again while the ledger remembers its id
(also across a restart, through the ledger's file), and a forged one charges nothing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from aggregator.accountant import amplify_spec
from aggregator.accountant.history import epsilon_total_rounds
from aggregator.ledger import ledger_file
from aggregator.ledger import participations as ledger_participations
from aggregator.service.core.machine import AggregatorCore
from aggregator.service.core.rules import ACCOUNTED_REFUSALS
from edge.batch_auth import BatchSigner
from tests.aggregator.test_shards_and_manifests import (
    DEP,
    MIN_BATCH,
    NEW,
    NOW,
    OLD,
    ROUND,
    SPEC,
    manifest,
    raw,
)
from tests.aggregator.test_shards_and_manifests import core as shards_core

DELTA = 1e-6
NEWEST = ROUND + 2
"""The newest round applied: with ``retention_rounds=2``, rounds below ``ROUND + 1`` are
stale, and the ledger keeps rounds above ``NEWEST - ledger_lag_rounds`` in detail."""
COMPACTED = ROUND - 5
"""A stale round whose detail the ledger has compacted (``ledger_lag_rounds`` is 3)."""


def core() -> AggregatorCore:
    """A core whose horizon is two rounds, after a batch of round ``NEWEST``, compacted."""
    agg = shards_core(retention_rounds=2)
    assert agg.handle(OLD["g0s0"].seal(raw(8, 1, NEWEST)), now=NOW, shard="g0s0") == "applied"
    agg.compact_ledger()
    # the ledger keys releases by their round's start (rounds are times)
    lag = agg.rules.ledger_lag_rounds
    assert agg.ledger.to_dict()["compacted_through"] == (NEWEST - lag) * agg.rules.unit
    return agg


def participations(agg: AggregatorCore) -> int:
    return sum(agg.ledger.rounds().values())


def epsilon_total(agg: AggregatorCore) -> float:
    level = agg.ledger.compute(agg.ledger.snapshot())
    assert level.epsilon_total is not None
    return level.epsilon_total


def stale(batch: int, round_: int = COMPACTED, size: int = 6) -> bytes:
    return OLD["g0s0"].seal(raw(size, batch, round_))


def test_stale_round_is_an_accounted_refusal() -> None:
    assert "stale_round" in ACCOUNTED_REFUSALS


def test_a_signed_stale_batch_is_charged_once_and_its_replay_is_not() -> None:
    agg = core()
    before, eps_before = participations(agg), epsilon_total(agg)
    assert agg.handle(stale(2), now=NOW, shard="g0s0") == "stale_round"
    assert participations(agg) == before + 1
    assert agg.ledger.rounds().get(6) == 1  # at its real size
    assert epsilon_total(agg) > eps_before
    generation = agg.ledger.generation
    for _ in range(3):  # redelivered or replayed
        assert agg.handle(stale(2), now=NOW, shard="g0s0") == "stale_round"
    assert agg.ledger.generation == generation
    assert participations(agg) == before + 1
    assert agg.counters.rejected["stale_round"] == 4


def test_a_stale_batch_of_a_round_still_in_detail_is_recorded_idempotently() -> None:
    agg = core()
    before = participations(agg)
    assert agg.handle(stale(2, round_=ROUND), now=NOW, shard="g0s0") == "stale_round"
    assert agg.handle(stale(2, round_=ROUND), now=NOW, shard="g0s0") == "stale_round"
    assert participations(agg) == before + 1


def test_a_signed_stale_manifest_is_charged_and_counted() -> None:
    agg = core()
    before = participations(agg)
    sealed = manifest("g0s0", COMPACTED, 1, [(20, 7), (21, 9)])
    assert agg.manifest(sealed, now=NOW, shard="g0s0") == "stale_round"
    assert agg.counters.manifests_rejected["stale_round"] == 1
    assert participations(agg) == before + 1
    assert agg.ledger.rounds().get(16) == 1  # the release's size
    assert agg.manifest(sealed, now=NOW, shard="g0s0") == "stale_round"
    assert participations(agg) == before + 1
    assert agg.counters.manifests_rejected["stale_round"] == 2


def test_a_stale_replay_after_a_restart_is_not_charged_again(tmp_path: Path) -> None:
    agg = core()
    assert agg.handle(stale(2), now=NOW, shard="g0s0") == "stale_round"
    charged = participations(agg)
    checkpoint = agg.content(generation=1, written_at=NOW)
    text = ledger_file.encode_ledger(agg.ledger)

    again = AggregatorCore(agg.rules, delta=DELTA)
    again.restore(checkpoint)
    again.ledger = ledger_file.decode_ledger(text, path=tmp_path / "l", spec=SPEC, delta=DELTA)
    assert participations(again) == charged
    assert again.handle(stale(2), now=NOW, shard="g0s0") == "stale_round"
    assert participations(again) == charged


def test_a_stale_replay_is_charged_again_once_its_id_is_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The memory is bounded: past FORGOTTEN_KEPT ids the oldest is forgotten, and its
    replay is charged again (an overstatement of loss, never of privacy)."""
    monkeypatch.setattr(ledger_participations, "FORGOTTEN_KEPT", 2)
    agg = core()
    before = participations(agg)
    for batch in (2, 3, 4):
        assert agg.handle(stale(batch), now=NOW, shard="g0s0") == "stale_round"
    assert participations(agg) == before + 3
    assert agg.handle(stale(4), now=NOW, shard="g0s0") == "stale_round"  # remembered
    assert participations(agg) == before + 3
    assert agg.handle(stale(2), now=NOW, shard="g0s0") == "stale_round"  # forgotten
    assert participations(agg) == before + 4


def test_a_replay_of_a_batch_folded_by_compaction_is_not_charged_again() -> None:
    agg = core()
    assert agg.handle(stale(2, round_=ROUND + 1), now=NOW, shard="g0s0") == "applied"
    newer = NEW["g1s0"].seal(raw(8, 3, NEWEST + 3))
    assert agg.handle(newer, now=NOW + 300, shard="g1s0") == "applied"
    agg.compact_ledger()
    charged = participations(agg)
    assert agg.handle(stale(2, round_=ROUND + 1), now=NOW, shard="g0s0") == "stale_round"
    assert participations(agg) == charged


@pytest.mark.parametrize("size", [1, 2, MIN_BATCH - 1])
def test_a_signed_batch_below_min_batch_is_charged_at_its_real_size(size: int) -> None:
    agg = core()
    before = dict(agg.ledger.rounds())
    assert agg.handle(stale(2, round_=NEWEST, size=size), now=NOW, shard="g0s0") == (
        "below_min_batch"
    )
    assert agg.counters.rejected_reports["below_min_batch"] == size
    assert agg.ledger.rounds() == {**before, size: before.get(size, 0) + 1}
    alone = epsilon_total_rounds(SPEC, {size: 1}, delta=DELTA)  # one participation of size
    assert math.isfinite(alone)
    assert alone > epsilon_total_rounds(SPEC, {MIN_BATCH: 1}, delta=DELTA)  # smaller: dearer
    assert epsilon_total(agg) >= alone
    generation = agg.ledger.generation  # a replay is the same batch: not charged again
    assert agg.handle(stale(2, round_=NEWEST, size=size), now=NOW, shard="g0s0") == (
        "below_min_batch"
    )
    assert agg.ledger.generation == generation


def test_one_report_is_charged_at_its_local_epsilon_and_finite() -> None:
    """A release of one report is the local randomiser alone: no amplification, so its
    level at ``delta`` is the local epsilon less at most the slack ``delta`` buys (for a
    loss of +-eps0, about ``delta / Pr[loss = eps0]``), finite, and never below that."""
    eps0 = amplify_spec(SPEC, n=1, delta=DELTA).epsilon0
    total = epsilon_total_rounds(SPEC, {1: 1}, delta=DELTA)
    assert math.isfinite(total)
    assert eps0 - 1e-4 <= total <= eps0 + 1e-9


def test_an_unplaced_release_is_never_charged_above_the_size_it_lists() -> None:
    """A manifest listing a count below min_batch is refused by reconciliation and charged
    at its smallest listed count, not at min_batch."""
    agg = core()
    before = dict(agg.ledger.rounds())
    sealed = manifest("g0s0", NEWEST, 1, [(30, 2), (31, 50)])
    assert agg.manifest(sealed, now=NOW, shard="g0s0") == "manifest_mismatch"
    assert agg.ledger.rounds() == {**before, 2: before.get(2, 0) + 1}


@pytest.mark.parametrize("reason", ["bad_signature", "bad_length"])
def test_a_forged_small_or_stale_batch_charges_nothing(reason: str) -> None:
    agg = core()
    generation = agg.ledger.generation
    forger = BatchSigner.generate(DEP, "g0s0")
    for round_, size in ((COMPACTED, 6), (NEWEST, 1)):
        body = raw(size, 5, round_)
        payload = forger.seal(body) if reason == "bad_signature" else body[:10]
        assert agg.handle(payload, now=NOW, shard="g0s0") == reason
        signed = manifest("g0s0", round_, 1, [(40, size)])
        forged = signed[:-1] + bytes([signed[-1] ^ 1])  # never the signature itself
        assert agg.manifest(forged, now=NOW, shard="g0s0") == "bad_signature"
    assert agg.ledger.generation == generation
    assert agg.counters.rejected[reason] == 2
