"""Honest over time, at the estimator level: a changing fleet (the sensor model's daily cycle
compressed into 48 rounds, tests/aggregator/fleet_rounds.py; CoCo at epsilon 4, d = 6,
s = 2, 1,000 devices), 192 rounds (four days), each round's reports added in batches to a
:class:`~aggregator.series.core.Series`.

* Per-round intervals (each round's own estimate, decoded to the channels' units) cover the
  round's truth (the fleet mean of its readings) in at least 95% of the (round, channel)
  cells, and the rounds' first channel ``r mod d`` (one cell per round: independent, so
  exactly binomial) at 95% both ways.
* The cumulative estimate (every report since the start) misses the round's truth where the
  cycle has moved it away from the cumulative truth: in every cell where the gap exceeds
  ``(z + K_cell)`` cumulative standard errors it misses (each such cell covers with
  probability at most ``Phi(-K_cell)``), and its coverage over all cells is far below 95%.
* Windows of 4 rounds (the series' aligned steps) are bit for bit the estimate of one pass
  over their reports, and cover the window's truth in at least 95% of cells.

Tolerances: ``K`` binomial standard errors ``sqrt(0.95 * 0.05 / cells)``,
``K = Phi^-1(1 - 1e-3 / (2 CHECKS))`` over the ``CHECKS`` coverage checks (Bonferroni);
``K_cell = Phi^-1(1 - 1e-3 / cells)`` for the per-cell misses. The cells of one round share
its reports (a report holds 2 of the 6 channels), so the all-cells counts are checked
one-sided (the decoded intervals are conservative: docs/maths.md, "Sensor means").
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from aggregator.estimation.estimators import AggregateState
from aggregator.estimation.intervals import z_score
from aggregator.series.core import Series, step_rows
from edge import MechanismSpec
from sim.models.sensors import SensorFleet
from tests.aggregator.fleet_rounds import FleetRounds

D, S, DAY, ROUNDS, DEVICES, WINDOW = 6, 2, 48, 192, 1000, 4
BATCHES = 3
LEVEL = 0.95
CHECKS = 4
K = NormalDist().inv_cdf(1 - 1e-3 / (2 * CHECKS))
Z = z_score(LEVEL)


def binomial_se(cells: int) -> float:
    return math.sqrt(LEVEL * (1 - LEVEL) / cells)


def test_per_round_and_window_intervals_cover_a_changing_fleet_and_the_cumulative_does_not() -> (
    None
):
    spec = MechanismSpec(mechanism="coco", d=D, s=S, epsilon=4.0)
    fleet = SensorFleet(n_devices=DEVICES, channels=D, seed=21, faulty_fraction=0.01)
    fr = FleetRounds(spec, fleet, rounds_per_day=DAY)
    series = Series(spec, round_seconds=int(fr.round_seconds), retention=1e9)
    rng = np.random.default_rng(22)
    reports: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    truth = np.empty((ROUNDS, D))
    for r in range(ROUNDS):
        x = fr.readings(r)
        truth[r] = x.mean(axis=0)
        seeds, z = fr.mechanism.randomise_sparse(*fr.encoder.encode_batch(x, rng), rng)
        reports[r] = (seeds, z)
        for part in np.array_split(np.arange(DEVICES), BATCHES):  # batches of the round
            batch = AggregateState(spec)
            batch.add(seeds[part], z[part])
            series.add(r, batch, batch_size=part.size)

    rows = series.rows()
    assert [row.round for row in rows] == list(range(ROUNDS))
    # per round
    decoded = [fr.decoded(row.state) for row in rows]
    value = np.array([v for v, _ in decoded])
    se = np.array([e for _, e in decoded])
    hit = np.abs(value - truth) <= Z * se
    cells = hit.size
    assert hit.mean() >= LEVEL - K * binomial_se(cells), hit.mean()
    first = hit[np.arange(ROUNDS), np.arange(ROUNDS) % D]
    assert abs(first.mean() - LEVEL) <= K * binomial_se(ROUNDS), first.mean()

    # cumulative: every report so far, against each round's truth
    cumulative = AggregateState(spec)
    cum_value, cum_se, cum_truth = (np.empty((ROUNDS, D)) for _ in range(3))
    for r, row in enumerate(rows):
        cumulative.merge(row.state)
        cum_value[r], cum_se[r] = fr.decoded(cumulative)
        cum_truth[r] = truth[: r + 1].mean(axis=0)
    cum_hit = np.abs(cum_value - truth) <= Z * cum_se
    k_cell = NormalDist().inv_cdf(1 - 1e-3 / cells)
    moved = np.abs(cum_truth - truth) > (Z + k_cell) * cum_se
    assert moved.sum() >= cells // 4  # the cycle moves the truth away for a good share
    assert not cum_hit[moved].any()
    assert hit[moved].mean() >= LEVEL - K * binomial_se(int(moved.sum()))
    assert cum_hit.mean() < LEVEL - 10 * K * binomial_se(cells), cum_hit.mean()

    # windows: the series' aligned steps of WINDOW rounds
    windows = step_rows(spec, rows, WINDOW * int(fr.round_seconds))
    assert len(windows) == ROUNDS // WINDOW
    window_hit = []
    for w, window in enumerate(windows):
        rounds = range(w * WINDOW, (w + 1) * WINDOW)
        one_pass = AggregateState(spec)
        one_pass.add(
            np.concatenate([reports[r][0] for r in rounds]),
            np.concatenate([reports[r][1] for r in rounds]),
        )
        assert window.state.n == one_pass.n == WINDOW * DEVICES
        assert np.array_equal(window.state.sum_u, one_pass.sum_u)
        assert np.array_equal(window.state.sum_v, one_pass.sum_v)
        assert window.state.estimate().to_dict() == one_pass.estimate().to_dict()
        v, e = fr.decoded(window.state)
        window_hit.append(np.abs(v - truth[list(rounds)].mean(axis=0)) <= Z * e)
    window_cells = np.array(window_hit)
    assert window_cells.mean() >= LEVEL - K * binomial_se(window_cells.size), window_cells.mean()
