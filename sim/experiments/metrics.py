"""Error metrics of the paper's experiments (section "Evaluation Metric").

For item frequencies (the ``2d`` elements ``j+``/``j-``, each the share of users holding it):

* ``TVE = sum_{j, b} |f_hat(j_b) - f(j_b)|`` (total variation error, as the paper defines it:
  the plain sum of absolute errors, without a factor 1/2);
* ``MAE = max_{j, b} |f_hat(j_b) - f(j_b)|`` (maximum absolute error).

For means (``d`` values ``m_j = f(j+) - f(j-)``) the same two, plus ``MSE = sum_j (m_hat_j -
m_j)^2``, the loss of the minimax bound ``O(ds/(n eps^2))`` and of the closed forms in
:mod:`edge.theory`.

Post-processing ("projected"): every user holds exactly ``s`` elements, so the ``1/s``-scaled
item frequencies lie on the probability simplex of dimension ``2d``; the estimate is projected
onto it (:func:`aggregator.estimation.projection.project_to_simplex`) and scaled back by ``s``.
Projected means are derived from the projected items, ``f(j+) - f(j-)``, as in the paper's section
"Effects of post-processing". A mechanism without item estimates (SUCCINCT) has no projected
variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from aggregator.estimation.projection import project_to_simplex
from sim.experiments.baselines.base import KVEstimate

F64 = NDArray[np.float64]
Target = Literal["freq", "mean"]
Metric = Literal["TVE", "MAE", "MSE"]
METRICS: dict[Target, tuple[Metric, ...]] = {"freq": ("TVE", "MAE"), "mean": ("TVE", "MAE", "MSE")}


def tve(estimate: F64, truth: F64) -> float:
    """Sum of absolute errors over every entry."""
    return float(np.abs(np.asarray(estimate) - truth).sum())


def mae(estimate: F64, truth: F64) -> float:
    """Largest absolute error over every entry."""
    return float(np.abs(np.asarray(estimate) - truth).max())


def sse(estimate: F64, truth: F64) -> float:
    """Sum of squared errors over every entry."""
    return float(((np.asarray(estimate) - truth) ** 2).sum())


_METRIC_FUNCTIONS = {"TVE": tve, "MAE": mae, "MSE": sse}


def project_items(freq: F64, s: int) -> F64:
    """Project ``(2, d)`` item frequencies: ``s * project_to_simplex(freq / s)``."""
    f = np.asarray(freq, dtype=np.float64)
    if f.ndim != 2 or f.shape[0] != 2:
        raise ValueError(f"item frequencies must have shape (2, d), got {f.shape}")
    out: F64 = (project_to_simplex(f.ravel() / s) * s).reshape(f.shape)
    return out


@dataclass(frozen=True, kw_only=True)
class ErrorRecord:
    """One metric of one estimate."""

    target: Target
    projected: bool
    metric: Metric
    value: float


def estimate_errors(
    estimate: KVEstimate, *, true_freq: F64, true_mean: F64, s: int
) -> list[ErrorRecord]:
    """Every metric of :data:`METRICS` for ``estimate``, raw and (where items exist) projected.

    Raw means are the mechanism's own mean estimator (``estimate.mean``); projected means are
    ``f(j+) - f(j-)`` of the projected items.
    """
    records: list[ErrorRecord] = []

    def add(target: Target, projected: bool, est: F64, truth: F64) -> None:
        for metric in METRICS[target]:
            value = _METRIC_FUNCTIONS[metric](est, truth)
            records.append(
                ErrorRecord(target=target, projected=projected, metric=metric, value=value)
            )

    add("mean", False, estimate.mean, true_mean)
    if estimate.freq is not None:
        add("freq", False, estimate.freq, true_freq)
        items = project_items(estimate.freq, s)
        add("freq", True, items, true_freq)
        add("mean", True, items[0] - items[1], true_mean)
    return records
