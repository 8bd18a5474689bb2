"""The CUSUM's run lengths from theory (aggregator/series/cusum.py) against published values
and seeded simulation of the chart on independent N(mu, 1) residuals.

Tolerances. A mean of ``R`` independent run lengths is within ``K sd / sqrt(R)`` of the ARL
(``sd`` from theory, the central limit theorem), and a side's alarm count over ``N`` rows
within ``K sqrt(N sd^2 / ARL^3)`` of ``N / ARL`` (renewal central limit theorem), with
``K = Phi^-1(1 - 1e-3 / (2 CHECKS))`` for a family-wise error of 1e-3 over this file's
``CHECKS`` simulated checks (Bonferroni).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from aggregator.series.cusum import CusumDesign, arl_from, run_length, siegmund_arl
from aggregator.series.detector import ChangeDetector, DetectorConfig, Observation

CHECKS = 6
K = NormalDist().inv_cdf(1 - 1e-3 / (2 * CHECKS))


@pytest.mark.parametrize(
    ("h", "shift", "published", "unit"),
    # the two-sided chart at k = 1/2 (Montgomery, "Introduction to Statistical Quality
    # Control", the table of the tabular CUSUM's ARLs), to the printed digits: in control
    # half the one-sided ARL, under a shift the side it pushes
    [
        (4.0, 0.0, 168.0, 1.0), (4.0, 1.0, 8.38, 0.01), (4.0, 2.0, 3.34, 0.01),
        (5.0, 0.0, 465.0, 1.0), (5.0, 1.0, 10.4, 0.1), (5.0, 3.0, 2.57, 0.01),
    ],
)  # fmt: skip
def test_the_integral_equation_gives_the_published_arls(
    h: float, shift: float, published: float, unit: float
) -> None:
    arl = CusumDesign(k=0.5, h=h).arl if shift == 0 else run_length(0.5, h, shift).mean
    assert abs(arl - published) <= unit / 2


def test_siegmund_approximates_the_exact_arl() -> None:
    for h in (3.0, 5.0, 8.0):
        for shift in (0.0, 0.5, 1.0):  # within 1%; at larger shifts it drifts off (5% at 2)
            exact = run_length(0.5, h, shift).mean
            assert siegmund_arl(0.5, h, shift) == pytest.approx(exact, rel=0.01)


def test_a_design_for_an_arl_has_that_arl_and_its_rate() -> None:
    for arl in (200.0, 1e4, 1e6):
        design = CusumDesign.for_arl(arl)
        assert design.arl == pytest.approx(arl, rel=1e-9)
        assert design.false_alarm_rate == pytest.approx(1 / arl, rel=1e-9)
    assert CusumDesign.for_arl(1e4).h == pytest.approx(8.053, abs=1e-3)
    assert arl_from(0.5, 4.0, 1.0, [0.0])[0] == pytest.approx(run_length(0.5, 4.0, 1.0).mean)
    with pytest.raises(ValueError, match="ARL must be > 1"):
        CusumDesign.for_arl(0.5)


def run_lengths(
    k: float, h: float, shift: float, runs: int, rng: np.random.Generator
) -> np.ndarray:
    """Zero-state run lengths of the one-sided chart, ``runs`` charts side by side."""
    s = np.zeros(runs)
    length = np.zeros(runs, dtype=np.int64)
    alive = np.ones(runs, dtype=np.bool_)
    step = 0
    while alive.any():
        step += 1
        s = np.where(alive, np.maximum(0.0, s + rng.normal(shift, 1.0, runs) - k), s)
        ended = alive & (s > h)
        length[ended] = step
        alive &= ~ended
    return length


@pytest.mark.parametrize(("h", "shift"), [(4.0, 0.0), (8.053, 1.0), (8.053, 0.5)])
def test_simulated_run_lengths_match_the_theory(h: float, shift: float) -> None:
    runs = 4000
    lengths = run_lengths(0.5, h, shift, runs, np.random.default_rng(7))
    theory = run_length(0.5, h, shift)
    assert abs(lengths.mean() - theory.mean) <= K * theory.sd / math.sqrt(runs)
    assert lengths.std() == pytest.approx(theory.sd, rel=0.1)


def test_the_detector_raises_the_stated_false_alarm_rate_on_normal_residuals() -> None:
    """The detector itself on rows whose means are independent normal around a daily cycle:
    200 channels, 6,000 rows of a 24-row day; the count of alarms against ``2 N / ARL_1``
    per channel (both sides, each a renewal process)."""
    dims, rows, day = 200, 6000, 24
    design = CusumDesign.for_arl(100.0)
    detector = ChangeDetector(DetectorConfig(period=day * 60.0, design=design), dims)
    rng = np.random.default_rng(11)
    cycle = np.sin(2 * np.pi * np.arange(day) / day)[:, None] * np.linspace(0.1, 0.3, dims)
    se = np.linspace(0.01, 0.05, dims)
    for r in range(rows):
        mean = cycle[r % day] + rng.normal(size=dims) * se
        detector.update(
            Observation(
                start=r * 60.0, end=(r + 1) * 60.0, n=10**9, mean=mean, mean_se=se,
                freq=np.zeros(dims),
            )
        )  # fmt: skip
    charted = rows - day  # the first day learns
    expected = dims * charted * design.false_alarm_rate
    sd = math.sqrt(dims) * design.alarm_count_sd(charted)
    assert abs(int(detector.alarms.sum()) - expected) <= K * sd, (detector.alarms.sum(), expected)
