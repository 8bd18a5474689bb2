"""`coco privacy calibrate --period --participation`: a plan per period whose replay through
the privacy ledger lands at or under its target."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from aggregator.accountant.shards import worst_shard_size
from aggregator.ledger.privacy_cli import privacy_app
from aggregator.ledger.privacy_ledger import PrivacyLedger
from edge.participation import threshold
from edge.spec import MechanismSpec

DEVICES = 20_000
Q = 0.5
R = 600
TARGET = 2.0
DELTA = 1e-6


def plan(*extra: str) -> dict[str, object]:
    result = CliRunner().invoke(
        privacy_app,
        [
            *("calibrate", "--mechanism", "coco", "--d", "6", "--s", "2"),
            *("--epsilon-total", str(TARGET), "--delta", str(DELTA)),
            *("--period", "1d", "--round-seconds", str(R)),
            *("--devices", str(DEVICES), "--participation", str(Q), "--json"),
            *extra,
        ],
    )
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.stdout)
    return data


def test_a_period_plan_replayed_through_the_ledger_meets_its_target() -> None:
    """A day of 10-minute rounds, each release the sampled devices of the round (drawn as the
    devices draw: Binomial(N, threshold(q) / 2^32)), recorded in a ledger as manifests: the
    ledger's level over the period is at or under the target, and so is since the start."""
    data = plan()
    assert data["period"] == "1d"
    assert data["rounds"] == 86_400 // R
    assert data["n"] == worst_shard_size(DEVICES, 1, imbalance=1e-6, participation=Q)
    spec = MechanismSpec.from_dict(data["spec"])  # type: ignore[arg-type]
    planned_n = worst_shard_size(DEVICES, 1, imbalance=1e-6, participation=Q)
    rng = np.random.default_rng(5)
    sizes = rng.binomial(DEVICES, threshold(Q) / 2**32, size=86_400 // R)
    assert sizes.min() >= planned_n  # the plan's size is reached w.p. 1 - 1e-6 per round
    ledger = PrivacyLedger(spec, delta=DELTA, round_seconds=R)
    first = 2_000_000
    for i, size in enumerate(sizes.tolist()):
        ledger.record_manifest(
            round=first + i,
            shard="",
            release_id=os.urandom(16),
            batches=[(os.urandom(16), size)],
            sources=[(first + i, R)],
        )
    end = (first + len(sizes)) * R
    level = ledger.compute(ledger.snapshot({"1d": (end - 86_400, end)}))
    assert level.batches == len(sizes)
    assert level.epsilon_periods["1d"] is not None
    assert level.epsilon_periods["1d"] <= TARGET
    assert level.epsilon_total is not None
    assert level.epsilon_total <= TARGET


def test_participation_shrinks_the_planned_release_to_a_binomial_lower_quantile() -> None:
    q = threshold(Q) / 2**32
    n = worst_shard_size(DEVICES, 1, imbalance=1e-6, participation=Q)
    assert stats.binom.cdf(n - 1, DEVICES, q) <= 1e-6 < stats.binom.cdf(n, DEVICES, q)
    assert worst_shard_size(DEVICES, 1, imbalance=1e-6) == DEVICES  # q = 1: every device
    assert worst_shard_size(DEVICES, 4, imbalance=0, participation=Q) == DEVICES // 8


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--rounds", "10"), "exactly one of --rounds and --period"),
        (("--round-seconds", "700"), "not a whole number of 700-s rounds"),
    ],
)
def test_a_period_plan_refuses_what_it_cannot_plan(extra: tuple[str, ...], message: str) -> None:
    args = [
        *("calibrate", "--mechanism", "coco", "--d", "6", "--s", "2"),
        *("--epsilon-total", "1", "--delta", "1e-6", "--period", "1d", "--devices", "1000"),
    ]
    if "--round-seconds" not in extra:
        args += ["--round-seconds", "600"]
    result = CliRunner().invoke(privacy_app, [*args, *extra])
    assert result.exit_code == 1
    assert message in result.stderr
    bare = CliRunner().invoke(
        privacy_app,
        [
            *("calibrate", "--mechanism", "coco", "--d", "6", "--s", "2"),
            *("--epsilon-total", "1", "--delta", "1e-6", "--rounds", "5", "--n", "100"),
            *("--participation", "0.5"),
        ],
    )
    assert bare.exit_code == 1
    assert "--participation needs --devices" in bare.stderr


def test_coco_privacy_per_period_is_its_rounds() -> None:
    """``coco privacy --period 1d --round-seconds 600`` is ``--rounds 144``: the level per
    period the aggregator reports for a device in every round of it."""
    base = [
        *("--mechanism", "coco", "--epsilon", "1", "--s", "2", "--d", "6"),
        *("--n", "1000", "--delta", "1e-6", "--json"),
    ]
    by_period = CliRunner().invoke(privacy_app, [*base, "--period", "1d", "--round-seconds", "600"])
    by_rounds = CliRunner().invoke(privacy_app, [*base, "--rounds", "144"])
    assert by_period.exit_code == 0, by_period.output
    assert json.loads(by_period.stdout) == json.loads(by_rounds.stdout)
    both = CliRunner().invoke(privacy_app, [*base, "--period", "1d", "--rounds", "5"])
    assert both.exit_code == 1
    assert "exactly one of --rounds and --period" in both.stderr
