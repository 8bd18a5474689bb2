"""The aggregator's privacy ledger: per-batch and composed central epsilon of the batches
applied, and the pessimistic reading of a checkpoint written before the history was kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aggregator.accountant import amplify_spec, blanket_pair_for_spec, epsilon_total_batches
from aggregator.checkpoint import CheckpointError, load_checkpoint
from aggregator.privacy_ledger import SIGNIFICANT_BITS, PrivacyLedger, accounting_size
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
    from aggregator.estimators import AggregateState  # noqa: PLC0415

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
