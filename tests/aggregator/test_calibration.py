"""Tests of ``calibrate`` (aggregator/accountant/calibration.py) and ``coco privacy calibrate``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aggregator.accountant import (
    BlanketPair,
    CalibrationTarget,
    accounting_size,
    calibrate,
    epsilon_total_counts,
    epsilon_total_rounds,
)
from aggregator.ledger.privacy_ledger import PrivacyLedger
from edge.announce import load_spec_file
from sim.cli import app
from tests.aggregator.reference import reference_rows

CALIBRATE = [
    *("privacy", "calibrate", "--mechanism", "collision", "--d", "32", "--s", "4"),
    *("--n", "1000", "--rounds", "10", "--epsilon-total", "1", "--delta", "1e-6"),
]
"""``coco privacy calibrate`` of :data:`TARGET`'s problem with n = 1000 and 10 rounds."""

TARGET = CalibrationTarget(
    mechanism="collision", d=32, s=4, n=1_000, rounds=10, epsilon_total=1.0, delta=1e-6
)


def test_plan_meets_the_target_and_a_larger_budget_would_not() -> None:
    plan = calibrate(TARGET, rtol=1e-3)
    eps0 = plan.spec.epsilon
    assert plan.epsilon_total <= TARGET.epsilon_total
    assert plan.epsilon_total == epsilon_total_rounds(plan.spec, {1_000: 10}, delta=1e-6)
    above = TARGET.spec(eps0 * (1 + 3e-3))
    assert epsilon_total_rounds(above, {1_000: 10}, delta=1e-6) > 1.0
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
    args = [*CALIBRATE, "--json"]
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


def _bid(i: int) -> bytes:
    return i.to_bytes(16, "big")


@pytest.mark.parametrize("as_batches", [False, True])
def test_a_deployment_run_as_planned_reports_at_most_the_target(
    tmp_path: Path, *, as_batches: bool
) -> None:
    """The issue's case: 10 rounds of 1,000 planned for epsilon_total 0.5 reported 0.50152
    (the ledger rounded sizes down, the plan did not). Now calibrate plans with the ledger's
    accounting: run the plan through the ledger (each round cut into slices by max_batch,
    from manifests; or as one batch per round without them) and it reports exactly the
    plan's number, at most the target."""
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
        "0.5",
        "--delta",
        "1e-6",
        "--json",
        "--spec-out",
        str(spec_file),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    planned = json.loads(result.output)
    spec = load_spec_file(spec_file)
    ledger = PrivacyLedger(spec, delta=1e-6)
    for r in range(planned["rounds"]):
        if as_batches:
            ledger.record_batch(round=r, shard="", batch_id=_bid(r), size=planned["n"])
        else:
            slices = [(_bid(100 * r + i), size) for i, size in enumerate((334, 333, 333))]
            ledger.record_manifest(round=r, shard="", release_id=_bid(10_000 + r), batches=slices)
    level = ledger.compute(ledger.snapshot())
    assert level.batches == 10
    assert level.epsilon_total == planned["epsilon_total"]
    assert level.epsilon_total is not None
    assert level.epsilon_total <= 0.5


def test_the_plan_uses_the_ledger_accounting_sizes() -> None:
    """n = 1,000 is composed as 992 (five significant bits), by the plan as by the ledger."""
    plan = calibrate(TARGET)
    assert plan.epsilon_total == epsilon_total_rounds(plan.spec, {1_000: 10}, delta=1e-6)
    assert plan.epsilon_total == epsilon_total_rounds(plan.spec, {992: 10}, delta=1e-6)


def test_the_ledger_accounting_against_the_reference_composition() -> None:
    """../shared/reference/composition-blanket.tsv (dp_accounting on the exact counts): the
    ledger's accounting (the pair of the accounting size) is never more than 1% below it
    (both are pessimistic discretisations) and at most a few percent above (n = 150 is
    accounted as 144)."""
    rows = reference_rows("composition-blanket.tsv")
    assert rows
    for row in rows:
        n = int(row["n"])
        pair = BlanketPair(
            n=accounting_size(n),
            exp_epsilon0=math.exp(float(row["eps0"])),
            s=int(row["s"]),
            t=int(row["t"]),
        )
        ours = epsilon_total_counts({pair: int(row["rounds"])}, delta=float(row["delta"]))
        reference = float(row["eps_total"])
        assert ours >= reference * 0.99, row
        assert ours <= reference * 1.04, row


@pytest.mark.parametrize("where", ["missing/p.json", "."])
def test_cli_calibrate_refuses_an_unwritable_spec_out_before_the_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """--spec-out in a missing directory (or naming a directory) is refused in one line,
    before the plan is computed (it took seconds, then a traceback)."""

    def no_work(*_: object, **__: object) -> None:
        raise AssertionError("the plan was computed before --spec-out was checked")

    monkeypatch.setattr("aggregator.accountant.calibrate", no_work)
    spec_out = tmp_path / where
    result = CliRunner().invoke(app, [*CALIBRATE, "--spec-out", str(spec_out)])
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --spec-out ")
    assert str(spec_out) in line
    assert not (tmp_path / "missing").exists()
