"""How well the per-round estimates tracked the simulation's per-round truth (``coco demo``'s
summary, SIMULATION ONLY).

Each round's estimate (the aggregator's series: the reports released for that round) is set
beside the exact mean of the ternary vectors the demo's devices sent in that round
(:class:`sim.fleet.truth.GroundTruth`). :func:`tracking` says

* **coverage**: the share of (round, channel) cells whose interval ``[mean_lo, mean_hi]``
  holds that round's truth, with its binomial standard error at the nominal level
  ``sqrt(c (1 - c) / cells)``: a share more than a few standard errors below the
  confidence ``c`` means the intervals are too narrow;
* **error against the closed form**: the mean over rounds of the squared error summed over
  channels, ``sum_j (mean_j - truth_j)^2``, beside its closed form, the mean over rounds of
  ``mean_mse(d, s) / n_r`` (:meth:`edge.theory.ReportMoments.mean_mse`, the mechanism's
  variance of one report summed over the dimensions, over the round's ``n_r`` reports);
  their ratio is about 1 when the estimates are as accurate as the theory says, and the
  average interval half-width beside the closed form's ``z sqrt(mean_mse / (d n_r))``.

A round without reports, or without truth, is left out. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import NDArray

from edge import MechanismSpec

__all__ = ["RoundEstimate", "format_tracking", "tracking"]

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class RoundEstimate:
    """One round's estimate: its reports and per-dimension mean with its interval."""

    round: int
    n: int
    mean: F64
    lo: F64
    hi: F64


def tracking(
    rounds: Sequence[RoundEstimate],
    truth: Mapping[int, F64],
    spec: MechanismSpec,
    *,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """The tracking summary (module docs) of ``rounds`` against ``truth`` (round -> the
    exact per-dimension mean of the vectors sent in it)."""
    cells = covered = used = 0
    squared = theory = half = half_theory = 0.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    per_report = spec.moments.mean_mse(spec.d, spec.s)
    for row in rounds:
        exact = truth.get(row.round)
        if exact is None or row.n <= 0:
            continue
        ok = np.isfinite(row.lo) & np.isfinite(row.hi)
        covered += int(np.sum(ok & (row.lo <= exact) & (exact <= row.hi)))
        cells += int(np.sum(ok))
        squared += float(np.sum((row.mean - exact) ** 2))
        theory += per_report / row.n
        half += float(np.sum(np.where(ok, (row.hi - row.lo) / 2, 0.0)))
        half_theory += int(np.sum(ok)) * z * math.sqrt(per_report / (spec.d * row.n))
        used += 1
    return {
        "rounds": used,
        "cells": cells,
        "coverage": covered / cells if cells else None,
        "coverage_nominal": confidence,
        "coverage_se": math.sqrt(confidence * (1 - confidence) / cells) if cells else None,
        "mse_per_round": squared / used if used else None,
        "mse_per_round_theory": theory / used if used else None,
        "halfwidth_mean": half / cells if cells else None,
        "halfwidth_theory": half_theory / cells if cells else None,
        "note": (
            "simulation only: each round's estimate against the exact mean of the vectors "
            "sent in that round; coverage = share of (round, channel) cells whose interval "
            "holds the truth; mse = sum over channels of squared errors, mean over rounds, "
            "theory = closed form mean_mse(d, s) / n per round"
        ),
    }


def format_tracking(summary: Mapping[str, Any]) -> list[str]:
    """The summary's lines for people (none when no round could be compared)."""
    if not summary.get("cells"):
        return []
    c = summary["coverage_nominal"]
    return [
        f"tracking per round (simulation truth): interval held the truth in "
        f"{summary['coverage']:.1%} of {summary['cells']} (round, channel) cells over "
        f"{summary['rounds']} rounds (nominal {c:.0%}, binomial SE {summary['coverage_se']:.1%})",
        f"  squared error per round {summary['mse_per_round']:.4g} (closed form "
        f"{summary['mse_per_round_theory']:.4g}), half-width {summary['halfwidth_mean']:.4g} "
        f"(closed form {summary['halfwidth_theory']:.4g})",
    ]
