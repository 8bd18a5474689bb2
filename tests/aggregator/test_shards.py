"""How many shards a deployment can afford (aggregator/accountant/shards.py) and its command
line: the worst shard's size checked exactly (binomial sums in exact rationals, and the
multinomial law of the shard sizes enumerated), the plan's numbers against the ledger's."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import pytest
from typer.testing import CliRunner

from aggregator.accountant import CalibrationTarget, amplify_spec, epsilon_total_rounds
from aggregator.accountant.shards import (
    calibrate_shards,
    shard_plan,
    worst_shard_size,
)
from aggregator.ledger.privacy_ledger import PrivacyLedger
from edge.spec import MechanismSpec
from sim.cli import app

SPEC = MechanismSpec(mechanism="coco", d=32, s=4, epsilon=1.0)
DELTA = 1e-6


def exact_cdf(m: int, n: int, p: Fraction) -> Fraction:
    """Pr[Binomial(n, p) <= m] in exact rationals."""
    return sum(
        (Fraction(math.comb(n, j)) * p**j * (1 - p) ** (n - j) for j in range(m + 1)),
        Fraction(0),
    )


@pytest.mark.parametrize(("devices", "shards"), [(60, 2), (60, 3), (200, 7), (97, 5)])
@pytest.mark.parametrize("imbalance", [0.2, 1e-2, 1e-6])
def test_the_worst_shard_is_the_exact_binomial_quantile(
    devices: int, shards: int, imbalance: float
) -> None:
    """m is the largest size with K Pr[Bin(N, p_K) <= m - 1] <= q, p_K the smaller share of
    the hash range, in exact arithmetic."""
    m = worst_shard_size(devices, shards, imbalance=imbalance)
    p = Fraction(2**32 // shards, 2**32)
    q = Fraction(imbalance)
    assert m == 0 or shards * exact_cdf(m - 1, devices, p) <= q
    assert shards * exact_cdf(m, devices, p) > q
    assert m <= devices // shards + 1


@pytest.mark.parametrize(("devices", "shards", "imbalance"), [(12, 3, 0.1), (10, 2, 0.05)])
def test_the_union_bound_holds_on_the_enumerated_shard_sizes(
    devices: int, shards: int, imbalance: float
) -> None:
    """Every assignment of the devices to shards enumerated (uniform hash): the probability
    that the smallest shard is below the planned size is at most the stated imbalance."""
    m = worst_shard_size(devices, shards, imbalance=imbalance)
    below = sum(
        1
        for assignment in itertools.product(range(shards), repeat=devices)
        if min(assignment.count(k) for k in range(shards)) < m
    )
    assert Fraction(below, shards**devices) <= Fraction(imbalance)


def test_a_perfectly_even_split_and_validation() -> None:
    assert worst_shard_size(1000, 3, imbalance=0.0) == 333
    assert worst_shard_size(1000, 1, imbalance=1e-6) == 1000
    assert worst_shard_size(10**6, 4, imbalance=1e-6) < 250_000
    for kwargs, match in (
        ({"devices": 0, "shards": 1, "imbalance": 0.0}, "devices"),
        ({"devices": 10, "shards": 257, "imbalance": 0.0}, "shards"),
        ({"devices": 10, "shards": 2, "imbalance": 1.0}, "imbalance"),
    ):
        with pytest.raises(ValueError, match=match):
            worst_shard_size(**kwargs)  # type: ignore[arg-type]


def test_central_target_rows_and_the_largest_affordable_count() -> None:
    plan = shard_plan(SPEC, devices=20_000, delta=DELTA, target_epsilon_central=0.12)
    rows = plan.rows
    assert plan.max_affordable >= 2
    assert [row.shards for row in rows] == list(range(1, len(rows) + 1))
    assert all(row.meets for row in rows[: plan.max_affordable])
    assert not rows[-1].meets  # the first that misses is shown
    for row in rows:
        assert (
            row.epsilon_central == amplify_spec(SPEC, n=row.shard_size, delta=DELTA).epsilon_central
        )
    sizes = [row.shard_size for row in rows]
    assert sizes == sorted(sizes, reverse=True)
    document = plan.to_dict()
    assert json.loads(json.dumps(document)) == document


def test_total_target_rows_are_what_the_ledger_reports() -> None:
    """Run the affordable plan through the ledger: K shards' releases of the planned worst
    size each round, and the ledger reports the row's epsilon_total, within the target."""
    rounds = 6
    plan = shard_plan(
        SPEC, devices=30_000, delta=DELTA, target_epsilon_total=0.5, rounds=rounds, max_shards=8
    )
    assert plan.max_affordable >= 1
    row = plan.rows[plan.max_affordable - 1]
    assert row.epsilon_total == epsilon_total_rounds(SPEC, {row.shard_size: rounds}, delta=DELTA)
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    serial = itertools.count()
    for r in range(rounds):
        for shard in range(row.shards):
            size = row.shard_size + shard  # the worst shard and larger ones
            ledger.record_manifest(
                round=r,
                shard=f"g0s{shard}",
                release_id=next(serial).to_bytes(16, "big"),
                batches=[(next(serial).to_bytes(16, "big"), size)],
                sources=[(r, 60)],
            )
    level = ledger.compute(ledger.snapshot())
    assert level.epsilon_total == row.epsilon_total
    assert level.epsilon_total is not None
    assert level.epsilon_total <= 0.5


def test_calibrating_per_shard_count_stops_below_the_budget_floor() -> None:
    target = CalibrationTarget(
        mechanism="coco", d=32, s=4, n=1, rounds=5, epsilon_total=1.0, delta=DELTA
    )
    affordable, rows = calibrate_shards(
        target, devices=8_000, imbalance=1e-6, max_shards=6, min_epsilon0=0.8
    )
    budgets = [row.plan.spec.epsilon for row in rows if row.plan is not None]
    assert budgets == sorted(budgets, reverse=True)
    assert all(row.meets for row in rows[:affordable])
    if affordable < 6:
        assert not rows[-1].meets
    for row in rows:
        if row.plan is not None:
            assert row.plan.target.n == row.shard_size
            assert row.plan.epsilon_total <= 1.0


def test_privacy_command_shards_mode() -> None:
    base = [
        "privacy",
        "--mechanism",
        "coco",
        "--epsilon",
        "1",
        "--s",
        "4",
        "--d",
        "32",
        "--delta",
        "1e-6",
        "--devices",
        "20000",
    ]
    result = CliRunner().invoke(app, [*base, "--target-epsilon-central", "0.12", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["max_affordable_shards"] >= 2
    assert {"shards", "shard_size", "epsilon_central", "epsilon_total", "meets"} == set(
        document["shards"][0]
    )
    text = CliRunner().invoke(app, [*base, "--target-epsilon-central", "0.12"])
    assert "largest affordable shard count" in text.output
    both = CliRunner().invoke(
        app, [*base, "--target-epsilon-central", "0.1", "--target-epsilon-total", "1"]
    )
    assert both.exit_code == 1
    assert "exactly one target" in both.output
    missing = CliRunner().invoke(app, [*base, "--target-epsilon-total", "1"])
    assert missing.exit_code == 1
    assert "rounds" in missing.output


def test_calibrate_command_for_the_worst_of_k_shards() -> None:
    base = [
        "privacy",
        "calibrate",
        "--mechanism",
        "coco",
        "--d",
        "32",
        "--s",
        "4",
        "--rounds",
        "5",
        "--epsilon-total",
        "1",
        "--delta",
        "1e-6",
    ]
    result = CliRunner().invoke(app, [*base, "--devices", "9000", "--shards", "3", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["n"] == worst_shard_size(9000, 3, imbalance=1e-6)
    assert plan["shards"] == 3
    assert plan["epsilon_total"] <= 1.0
    table = CliRunner().invoke(
        app, [*base, "--devices", "9000", "--max-shards", "3", "--min-epsilon0", "0.5", "--json"]
    )
    assert table.exit_code == 0, table.output
    assert json.loads(table.output)["max_affordable_shards"] >= 1
    for bad, message in (
        (["--n", "100", "--devices", "9000"], "exactly one of --n and --devices"),
        (["--devices", "9000", "--max-shards", "3"], "--min-epsilon0"),
    ):
        result = CliRunner().invoke(app, [*base, *bad])
        assert result.exit_code == 1
        assert message in result.output
