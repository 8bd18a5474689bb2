"""The cost of a short window: the closed form of the interval's half-width for ``m`` reports
per round over ``k`` rounds (docs/estimates.md, "Estimates over time"), against the
half-width that ``AggregateState.estimate`` reports, and the table in the docs.

A window's estimate is that of the merge of its rounds, i.e. of ``N = m k`` reports, so

    halfwidth(m, k) = z sqrt(V(f) / (m k)),    V(f) = (f V_nz + (1 - f) V_z) / D_mean^2

for the ternary mean of a dimension held by a share ``f`` of the reports
(``ReportMoments.mean_variance``), and for a sensor channel's mean in its unit (range
``[lo, hi]``, ``s`` of ``d`` channels per report, fleet mean ``vbar`` in ``[-1, 1]``)

    halfwidth(m, k) = z (hi - lo)/2 sqrt((d/s)^2 V(s/d) + d/s - vbar^2) / sqrt(m k).

The reported half-width plugs in the estimated ``f``, so it differs from the closed form at
the true ``f`` by ``dhw/df (f_hat - f)``: the check allows ``K`` standard deviations of that,
with ``Var(f_hat - f) = (freq_variance(f) + f (1 - f)) / N`` (the mechanism's noise and the
draw of which reports hold the dimension), ``K = Phi^-1(1 - 1e-3 / (2 CHECKS))`` over the
``CHECKS`` (m, k, dimension) cells (Bonferroni).

``python -m tests.aggregator.test_window_width`` prints the table of docs/estimates.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest

from aggregator.estimation.estimators import AggregateState
from aggregator.estimation.intervals import z_score
from aggregator.series.core import Series, merge_rows
from edge import LocalMechanism, MechanismSpec
from edge.theory import Mechanism
from sim.models.sensors import CHANNELS, SensorFleet

ROOT = Path(__file__).resolve().parents[2]
D, S = 6, 2
SHAPES = [(500, 1), (500, 12), (2000, 3), (100, 60)]
CHECKS = len(SHAPES) * D * 2
K = NormalDist().inv_cdf(1 - 1e-3 / (2 * CHECKS))
TEMPERATURE = CHANNELS[0]


def halfwidth(spec: MechanismSpec, f: float, reports: int, confidence: float = 0.95) -> float:
    """The closed form for the ternary mean of a dimension held by a share ``f``."""
    return z_score(confidence) * math.sqrt(spec.moments.mean_variance(f) / reports)


def sensor_halfwidth(
    spec: MechanismSpec, half_range: float, vbar: float, reports: int, confidence: float = 0.95
) -> float:
    """The closed form for a sensor channel's mean in its unit."""
    scale = spec.d / spec.s
    per_report = scale**2 * spec.moments.mean_variance(1 / scale) + scale - vbar**2
    return z_score(confidence) * half_range * math.sqrt(per_report / reports)


@pytest.mark.parametrize("mechanism", ["coco", "collision"])
def test_the_reported_halfwidth_of_a_window_is_the_closed_form(mechanism: Mechanism) -> None:
    """Sensor readings through the mechanism, ``m`` reports per round in a series, windows of
    ``k`` rounds merged: the reported half-widths (ternary and in the channel's unit)
    against the closed forms at ``f = s/d``."""
    spec = MechanismSpec(mechanism=mechanism, d=D, s=S, epsilon=2.0)
    fleet = SensorFleet(n_devices=2000, channels=D, seed=4, faulty_fraction=0.0)
    encoder = fleet.encoder(S)
    mech = LocalMechanism.from_spec(spec)
    rng = np.random.default_rng(9)
    f = S / D
    z = z_score(0.95)
    slope = z * (spec.moments.mean_variance(1.0) - spec.moments.mean_variance(0.0))
    half = (np.array(fleet.ranges[1]) - np.array(fleet.ranges[0])) / 2
    for m, k in SHAPES:
        series = Series(spec, round_seconds=60, retention=1e9)
        truth = np.zeros(D)
        for r in range(k):
            x = fleet.readings(r)[:m]
            truth += x.sum(axis=0)
            seeds, zz = mech.randomise_sparse(*encoder.encode_batch(x, rng), rng)
            series.add(r, _state(spec, seeds, zz), batch_size=m)
        window = merge_rows(spec, series.rows())
        assert window is not None
        assert window.state.n == m * k
        est = window.state.estimate()
        n = m * k
        closed = halfwidth(spec, f, n)
        # d hw / d f = z (V_nz - V_z) / (2 sqrt(V(f) n)) in ternary units
        dhw = slope / (2 * math.sqrt(spec.moments.mean_variance(f) * n))
        sd_f = math.sqrt((spec.moments.freq_variance(f) + f * (1 - f)) / n)
        assert np.abs(est.mean_halfwidth - closed).max() <= K * abs(dhw) * sd_f
        # in the channels' units: the encoder's decoded standard error, at the fleet's vbar
        _, se = encoder.decode_mean(est.mean, est.mean_se, n=n)
        vbar = np.clip(encoder.normalise(truth[None, :] / n)[0], -1, 1)
        for j in range(D):
            closed_j = sensor_halfwidth(spec, half[j], float(vbar[j]), n)
            # the decoded form moves with f_hat (by at most d/s times the ternary move) and
            # with the estimated vbar (d(vbar^2)/n = 2 vbar dvbar / n, at most z/n of the
            # half-width once divided by the standard error it moves)
            slack = K * half[j] * (D / S * abs(dhw) * sd_f + z / n)
            assert abs(z * se[j] - closed_j) <= slack, (m, k, j)


def _state(spec: MechanismSpec, seeds: np.ndarray, z: np.ndarray) -> AggregateState:
    state = AggregateState(spec)
    state.add(seeds, z)
    return state


SETTINGS = [(1.0, 500), (1.0, 2000), (4.0, 500), (4.0, 2000), (8.0, 2000)]
ROUNDS = [1, 10, 60, 1440]


def table() -> str:
    """Half-widths (95%, degC) of the fleet's mean temperature: CoCo, d = 6, s = 2, at the
    model's mean 21 degC, for ``m`` reports per round and windows of ``k`` rounds."""
    half = (TEMPERATURE.hi - TEMPERATURE.lo) / 2
    vbar = 2 * (TEMPERATURE.base - TEMPERATURE.lo) / (TEMPERATURE.hi - TEMPERATURE.lo) - 1
    head = "| ε | m | " + " | ".join(f"k = {k}" for k in ROUNDS) + " |"
    lines = [head, "| --- | --- | " + " | ".join("---" for _ in ROUNDS) + " |"]
    for eps, m in SETTINGS:
        spec = MechanismSpec(mechanism="coco", d=D, s=S, epsilon=eps)
        cells = [f"{sensor_halfwidth(spec, half, vbar, m * k):.2f}" for k in ROUNDS]
        lines.append(f"| {eps:g} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_the_documented_table_is_the_closed_form() -> None:
    assert table() in (ROOT / "docs" / "estimates.md").read_text(encoding="utf-8")


if __name__ == "__main__":
    print(table())
