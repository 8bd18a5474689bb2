"""Tests of ``calibrate`` (aggregator/accountant/calibration.py) and ``coco privacy calibrate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aggregator.accountant import (
    CalibrationTarget,
    blanket_pair_for_spec,
    calibrate,
    epsilon_total,
)
from edge.announce import load_spec_file
from sim.cli import app

TARGET = CalibrationTarget(
    mechanism="collision", d=32, s=4, n=1_000, rounds=10, epsilon_total=1.0, delta=1e-6
)


def test_plan_meets_the_target_and_a_larger_budget_would_not() -> None:
    plan = calibrate(TARGET, rtol=1e-3)
    eps0 = plan.spec.epsilon
    assert plan.epsilon_total <= TARGET.epsilon_total
    assert plan.epsilon_total == epsilon_total(
        blanket_pair_for_spec(plan.spec, n=1_000), rounds=10, delta=1e-6
    )
    above = TARGET.spec(eps0 * (1 + 3e-3))
    assert epsilon_total(blanket_pair_for_spec(above, n=1_000), rounds=10, delta=1e-6) > 1.0
    # a smaller budget meets the target too but has a larger closed-form MSE
    below = TARGET.spec(eps0 * 0.8)
    assert below.moments.mean_mse(32, 4) / 1_000 > plan.mse_mean
    assert plan.mse_mean == plan.spec.moments.mean_mse(32, 4) / 1_000
    assert plan.epsilon_central <= plan.epsilon_central_generic
    assert plan.epsilon_central <= plan.epsilon_total
    assert plan.ledger_total == pytest.approx(10 * eps0)
    data = plan.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["spec"]["fingerprint"] == plan.spec.fingerprint


def test_fixed_t_and_a_larger_target_gives_a_larger_budget() -> None:
    fixed = calibrate(
        CalibrationTarget(
            mechanism="coco", d=32, s=4, n=1_000, rounds=10, epsilon_total=1.0, delta=1e-6, t=12
        )
    )
    assert fixed.spec.t == 12
    looser = calibrate(
        CalibrationTarget(
            mechanism="coco", d=32, s=4, n=1_000, rounds=10, epsilon_total=2.0, delta=1e-6, t=12
        )
    )
    assert looser.spec.epsilon > fixed.spec.epsilon
    assert looser.mse_mean < fixed.mse_mean


def test_unreachable_target_and_validation() -> None:
    with pytest.raises(ValueError, match="out of reach"):
        calibrate(
            CalibrationTarget(
                mechanism="collision", d=8, s=2, n=10, rounds=100, epsilon_total=1e-3, delta=1e-6
            )
        )
    with pytest.raises(ValueError, match="epsilon_total must be > 0"):
        CalibrationTarget(mechanism="coco", d=8, s=2, n=10, rounds=1, epsilon_total=0.0, delta=1e-6)
    with pytest.raises(ValueError, match="rounds must be an integer >= 1"):
        CalibrationTarget(mechanism="coco", d=8, s=2, n=10, rounds=0, epsilon_total=1.0, delta=1e-6)
    with pytest.raises(ValueError, match="mechanism must be coco or collision"):
        CalibrationTarget(
            mechanism="generic",  # type: ignore[arg-type]
            d=8,
            s=2,
            n=10,
            rounds=1,
            epsilon_total=1.0,
            delta=1e-6,
        )


def test_cli_calibrate_json_and_spec_file(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.json"
    args = [
        "privacy",
        "calibrate",
        "--mechanism",
        "collision",
        "--d",
        "32",
        "--s",
        "4",
        "--n",
        "1000",
        "--rounds",
        "10",
        "--epsilon-total",
        "1",
        "--delta",
        "1e-6",
        "--json",
    ]
    result = CliRunner().invoke(app, [*args, "--spec-out", str(spec_file)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for key in (
        "epsilon0",
        "t",
        "epsilon_central",
        "epsilon_central_generic",
        "epsilon_total",
        "delta",
        "n",
        "rounds",
        "mse_mean",
        "ledger_epsilon_total",
    ):
        assert key in out
    assert out["epsilon_total"] <= 1.0
    assert load_spec_file(spec_file).fingerprint == out["spec"]["fingerprint"]
    bad = CliRunner().invoke(app, [*args[:-1], "--epsilon-total", "-1"])
    assert bad.exit_code == 1
    assert "epsilon_total must be > 0" in bad.output
