"""The demo's tracking summary (:mod:`sim.demo.tracking`) on per-round estimates drawn from
the closed form, seeded."""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
from typer.testing import CliRunner

from edge import MechanismSpec
from sim.cli import app
from sim.demo.tracking import RoundEstimate, format_tracking, tracking
from tests.conftest import Broker

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)


def drawn(
    rounds: int, n: int, *, scale: float = 1.0, seed: int = 3
) -> tuple[list[RoundEstimate], dict[int, np.ndarray]]:
    """Rounds whose estimate is the truth plus normal noise of the closed form's variance,
    with intervals ``scale`` times the closed form's."""
    rng = np.random.default_rng(seed)
    z = NormalDist().inv_cdf(0.975)
    sd = math.sqrt(SPEC.moments.mean_mse(SPEC.d, SPEC.s) / (SPEC.d * n))
    rows, truth = [], {}
    for r in range(rounds):
        exact = rng.uniform(-0.3, 0.3, SPEC.d)
        mean = exact + rng.normal(0, sd, SPEC.d)
        half = scale * z * sd
        rows.append(RoundEstimate(1000 + r, n, mean, mean - half, mean + half))
        truth[1000 + r] = exact
    return rows, truth


def test_coverage_and_error_match_the_closed_form_when_the_estimates_do() -> None:
    rows, truth = drawn(400, 500)
    out = tracking(rows, truth, SPEC)
    cells = 400 * SPEC.d
    assert (out["rounds"], out["cells"]) == (400, cells)
    k = NormalDist().inv_cdf(1 - 0.001 / 2)  # two-sided, 0.1 % false alarm
    assert out["coverage_se"] == pytest.approx(math.sqrt(0.95 * 0.05 / cells), rel=1e-12)
    assert abs(out["coverage"] - 0.95) <= k * out["coverage_se"]
    # the sum of d squared normal errors: mean d sd^2, SE sqrt(2 d) sd^2 / sqrt(rounds)
    theory = out["mse_per_round_theory"]
    assert theory == pytest.approx(SPEC.moments.mean_mse(SPEC.d, SPEC.s) / 500, rel=1e-12)
    assert abs(out["mse_per_round"] - theory) <= k * theory * math.sqrt(2 / SPEC.d / 400)
    assert out["halfwidth_mean"] == pytest.approx(out["halfwidth_theory"], rel=1e-12)
    lines = format_tracking(out)
    assert len(lines) == 2
    assert lines[0].startswith("tracking per round (simulation truth): interval held the truth in")


def test_intervals_too_narrow_show_as_low_coverage() -> None:
    rows, truth = drawn(400, 500, scale=0.5)
    out = tracking(rows, truth, SPEC)
    # P(|Z| < 0.98) = 0.67: far below 0.95 (k standard errors of the nominal level)
    assert out["coverage"] < 0.95 - 10 * out["coverage_se"]


def test_rounds_without_reports_truth_or_interval_are_left_out() -> None:
    rows, truth = drawn(3, 500)
    nan = np.full(SPEC.d, np.nan)
    partial = rows[1].lo.copy()
    partial[0] = np.nan
    rows = [
        rows[0],
        RoundEstimate(rows[1].round, rows[1].n, rows[1].mean, partial, rows[1].hi),
        RoundEstimate(rows[2].round, 0, nan, nan, nan),  # no reports
        RoundEstimate(5, 500, rows[0].mean, rows[0].lo, rows[0].hi),  # no truth
    ]
    out = tracking(rows, truth, SPEC)
    assert (out["rounds"], out["cells"]) == (2, 2 * SPEC.d - 1)
    empty = tracking([], truth, SPEC)
    assert empty["coverage"] is None
    assert format_tracking(empty) == []


def test_the_demo_reports_how_well_each_round_tracked_its_truth(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """``coco demo --day-seconds 12 --ground-truth FILE``: six rounds of a compressed day;
    the per-round truth file, and the summary's tracking of every (round, channel) cell."""
    truth = tmp_path / "truth.json"
    result = CliRunner().invoke(
        app,
        [
            "demo", "--devices", "400", "--rounds", "6", "--min-batch", "100",
            "--broker", mosquitto.url, "--timeout", "60", "--json",
            "--day-seconds", "12", "--ground-truth", str(truth),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    tracked = doc["tracking"]
    assert (tracked["rounds"], tracked["cells"]) == (6, 6 * doc["d"])
    # one-sided (the cells of a round share its reports): K = Phi^-1(1 - 10^-3)
    k = NormalDist().inv_cdf(1 - 1e-3)
    assert tracked["coverage"] >= 0.95 - k * tracked["coverage_se"]
    assert 0 < tracked["mse_per_round"] < 5 * tracked["mse_per_round_theory"]
    written = json.loads(truth.read_text())
    assert (written["round_seconds"], written["day_seconds"]) == (2, 12)
    assert [x["n"] for x in written["rounds"]] == [400] * 6
    assert written["overall"]["n"] == doc["reports_sent"] == 2400


def test_the_demo_aggregator_takes_the_compressed_day_as_its_cycle() -> None:
    """``coco demo --day-seconds S``: its aggregator's change detector compares each round
    with the same round of earlier S-second days; a real day without it."""
    from sim.demo.config import DemoConfig  # noqa: PLC0415
    from sim.demo.pipeline import _services  # noqa: PLC0415

    spec = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
    for day, cycle in ((12, 12.0), (None, 86_400.0)):
        config = DemoConfig(rounds=6, round_seconds=2, day_seconds=day, progress=False)
        _, aggregator, _ = _services(config, "mqtt://127.0.0.1:1", spec)
        assert aggregator.config.cycle_seconds == cycle
