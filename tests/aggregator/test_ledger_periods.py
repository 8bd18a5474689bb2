"""The privacy ledger's rolling periods: a period's participations, recomputed independently
from the releases, compacted or not, across its file; unknown times counted in every period."""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections import Counter
from pathlib import Path

import pytest

from aggregator.accountant.history import epsilon_total_rounds
from aggregator.ledger.ledger_file import decode_ledger, encode_ledger
from aggregator.ledger.privacy_ledger import PrivacyLedger
from edge.spec import MechanismSpec

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DELTA = 1e-6
R = 10
PATH = Path("ledger.json")


def build(seed: int) -> tuple[PrivacyLedger, dict[int, int], list[int]]:
    """A ledger of 60 rounds of 1-3 releases each (some carrying the previous round's
    reports), compacted at random points; the independent truth: source round -> the
    smallest release holding reports of it; the rounds compacted through."""
    rng = random.Random(seed)
    ledger = PrivacyLedger(SPEC, delta=DELTA, round_seconds=R, keep_seconds=10**6)
    smallest: dict[int, int] = {}
    cuts: list[int] = []
    for round_ in range(100, 160):
        for shard in range(rng.randint(1, 3)):
            size = rng.randint(40, 400)
            sources = [(round_, R)]
            if rng.random() < 0.2:
                sources.append((round_ - 1, R))
            for source, _ in sources:
                smallest[source] = min(smallest.get(source, size), size)
            outcome = ledger.record_manifest(
                round=round_,
                shard=f"g0s{shard}",
                release_id=os.urandom(16),
                batches=[(os.urandom(16), size)],
                sources=sources,
            )
            assert outcome == "recorded"
        if rng.random() < 0.15:
            ledger.compact(round_ - 2)  # a source round on both sides of a cut: charged twice
            cuts.append(round_ - 2)
    return ledger, smallest, cuts


def independent(smallest: dict[int, int], start: float, end: float) -> Counter[int]:
    return Counter(size for r, size in smallest.items() if start < (r + 1) * R <= end)


@pytest.mark.parametrize("seed", range(6))
def test_a_period_composes_exactly_the_rounds_that_ended_in_it(seed: int) -> None:
    ledger, smallest, cuts = build(seed)
    for start, end in [(1000, 1600), (1200, 1300), (1295, 1305), (0, 10**9), (1590, 1600)]:
        got = Counter(ledger.period_rounds(start, end))
        want = independent(smallest, start, end)
        if not cuts:
            assert got == want
        else:  # a round carried across a cut is charged on both sides: at most once more
            assert sum(got.values()) >= sum(want.values())
            assert sum(got.values()) <= sum(want.values()) + len(cuts)
        assert all(got[s] >= c for s, c in want.items())
    everything = Counter(ledger.period_rounds(0, 10**9))
    assert sum(everything.values()) == sum(ledger.rounds().values())


def test_the_period_level_is_the_composition_of_its_rounds_and_never_above_the_total() -> None:
    ledger, _, _ = build(11)
    snapshot = ledger.snapshot({"1m": (1540, 1600), "all": (0, 10**9)})
    level = ledger.compute(snapshot)
    recent = ledger.period_rounds(1540, 1600)
    assert level.epsilon_periods["1m"] == epsilon_total_rounds(SPEC, recent, delta=DELTA)
    assert level.epsilon_total is not None
    assert level.epsilon_periods["all"] == pytest.approx(level.epsilon_total, rel=1e-9)
    assert level.epsilon_periods["1m"] is not None
    assert level.epsilon_periods["1m"] < level.epsilon_total
    assert level.to_dict()["epsilon_total_period"] == level.epsilon_periods


def test_the_timeline_survives_the_file_and_an_older_file_counts_its_past_in_every_period() -> None:
    ledger, _, _ = build(3)
    ledger.compact(150)
    text = encode_ledger(ledger, None)
    again = decode_ledger(text, path=PATH, spec=SPEC, delta=DELTA)
    again.round_seconds = R
    for start, end in [(1000, 1600), (1450, 1520)]:
        assert again.period_rounds(start, end) == ledger.period_rounds(start, end)
    # the same ledger as a file written before the timeline existed (checksummed as then)
    data = json.loads(text)
    del data["ledger"]["timeline"]
    covered = {"checkpoint": data["checkpoint"], "ledger": data["ledger"]}
    canonical = json.dumps(covered, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    data["sha256"] = hashlib.sha256(canonical.encode("ascii")).hexdigest()
    old = decode_ledger(json.dumps(data), path=PATH, spec=SPEC, delta=DELTA)
    old.round_seconds = R
    late = Counter(old.period_rounds(1590, 1600))
    assert sum(late.values()) >= sum(ledger.period_rounds(1590, 1600).values()) + 40


def test_unknown_times_count_in_every_period() -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA, round_seconds=None)
    ledger.record_batch(round=50, shard="", batch_id=os.urandom(16), size=77)  # round start 50
    ledger.record_extra(size=33)
    for start, end in [(0, 1), (10**6, 10**6 + 1)]:
        assert ledger.period_rounds(start, end) == {33: 1, 77: 1}
    ledger.round_seconds = R  # now the batch is dated by its round's start: [50, 60)
    assert ledger.period_rounds(0, 1) == {33: 1}
    assert ledger.period_rounds(55, 60) == {33: 1, 77: 1}


def test_a_batch_without_manifest_is_dated_by_the_length_it_carries() -> None:
    """After a change of ``round_seconds`` from 60 s to 10 s, a batch of the last 60-s round
    (wire version 2: it carries 60) with no manifest yet ended 60 s after its start, not 10:
    dated by the configured length it would leave a period 50 s early. A batch that carries
    no length (version 1) is dated by the configured one, the one its start was computed
    with; both datings survive the ledger's file."""
    start = 1_764_115_200
    ledger = PrivacyLedger(SPEC, delta=DELTA, round_seconds=10)
    ledger.record_batch(round=start, shard="", batch_id=os.urandom(16), size=70, seconds=60)
    ledger.record_batch(round=start, shard="", batch_id=os.urandom(16), size=90)  # version 1
    again = decode_ledger(encode_ledger(ledger, None), path=PATH, spec=SPEC, delta=DELTA)
    again.round_seconds = 10
    for one in (ledger, again):
        assert one.period_rounds(start, start + 10) == {90: 1}
        assert one.period_rounds(start + 10, start + 60) == {70: 1}
        assert one.period_rounds(start + 60, start + 10**5) == {}
    with pytest.raises(ValueError, match="round_seconds"):
        ledger.record_batch(round=start, shard="", batch_id=os.urandom(16), size=5, seconds=86_401)
