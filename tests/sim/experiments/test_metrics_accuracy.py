"""The error metrics of the experiments, on hand-computed examples."""

from __future__ import annotations

import numpy as np
import pytest

from sim.experiments.baselines.base import KVEstimate
from sim.experiments.metrics import estimate_errors, mae, project_items, sse, tve


def test_tve_mae_sse_by_hand() -> None:
    est = np.array([[0.5, 0.1], [0.0, 0.4]])
    truth = np.array([[0.25, 0.25], [0.25, 0.25]])
    # |0.25| + |-0.15| + |-0.25| + |0.15| = 0.8
    assert tve(est, truth) == pytest.approx(0.8)
    assert mae(est, truth) == pytest.approx(0.25)
    assert sse(est, truth) == pytest.approx(2 * 0.25**2 + 2 * 0.15**2)


def test_projection_keeps_a_feasible_point() -> None:
    freq = np.array([[0.5, 0.5], [0.5, 0.5]])  # s = 2: items / s sum to 1, all >= 0
    np.testing.assert_allclose(project_items(freq, 2), freq)


def test_projection_by_hand() -> None:
    # items / s = [0.6, 0.6, -0.2, 0]: shift by lambda = -0.1 and clip -> [0.5, 0.5, 0, 0].
    freq = np.array([[1.2, 1.2], [-0.4, 0.0]])
    np.testing.assert_allclose(project_items(freq, 2), [[1.0, 1.0], [0.0, 0.0]])


def test_projection_lands_on_the_scaled_simplex() -> None:
    rng = np.random.default_rng(3)
    freq = rng.normal(0.1, 0.3, size=(2, 50))
    proj = project_items(freq, 4)
    assert proj.min() >= 0
    assert proj.sum() == pytest.approx(4.0)


def test_projection_rejects_a_wrong_shape() -> None:
    with pytest.raises(ValueError, match=r"shape \(2, d\)"):
        project_items(np.zeros(4), 2)


def test_estimate_errors_raw_and_projected() -> None:
    true_freq = np.array([[0.5, 0.0], [0.0, 0.5]])  # s = 1: half the users +1 on 0, half -1 on 1
    true_mean = np.array([0.5, -0.5])
    est = KVEstimate(freq=np.array([[0.7, 0.1], [-0.1, 0.5]]), mean=np.array([0.6, -0.3]))
    got = {
        (r.target, r.projected, r.metric): r.value
        for r in estimate_errors(est, true_freq=true_freq, true_mean=true_mean, s=1)
    }
    assert len(got) == 10
    # Raw means are the mechanism's own mean estimates.
    assert got[("mean", False, "TVE")] == pytest.approx(0.1 + 0.2)
    assert got[("mean", False, "MAE")] == pytest.approx(0.2)
    assert got[("mean", False, "MSE")] == pytest.approx(0.01 + 0.04)
    assert got[("freq", False, "TVE")] == pytest.approx(0.2 + 0.1 + 0.1 + 0.0)
    assert got[("freq", False, "MAE")] == pytest.approx(0.2)
    # [0.7, 0.1, -0.1, 0.5] projected onto the simplex: lambda = -0.1 -> [0.6, 0, 0, 0.4].
    assert got[("freq", True, "TVE")] == pytest.approx(0.1 + 0.0 + 0.0 + 0.1)
    assert got[("freq", True, "MAE")] == pytest.approx(0.1)
    # Projected means f(j+) - f(j-) = [0.6, -0.4].
    assert got[("mean", True, "TVE")] == pytest.approx(0.1 + 0.1)
    assert got[("mean", True, "MSE")] == pytest.approx(0.02)


def test_a_mean_only_mechanism_has_no_frequency_or_projected_errors() -> None:
    est = KVEstimate(freq=None, mean=np.array([0.0, 0.0]))
    records = estimate_errors(est, true_freq=np.zeros((2, 2)), true_mean=np.array([0.5, -0.5]), s=1)
    assert {(r.target, r.projected) for r in records} == {("mean", False)}
    assert {r.metric for r in records} == {"TVE", "MAE", "MSE"}
