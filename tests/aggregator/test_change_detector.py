"""The change detector (aggregator/series/detector.py) on a simulated sensor fleet through the
real mechanism (tests/aggregator/fleet_rounds.py: CoCo, 6 channels, s = 2, a compressed day):
its false-alarm rate under no change against the rate theory states, and its delay after a
heatwave (+3 degC on temperature) against the delay theory states.

Tolerances. The false-alarm count of ``d`` channels over ``N`` charted rows is compared with
``d N * false_alarm_rate`` within ``K`` of its standard deviation from the renewal central
limit theorem (``CusumDesign.alarm_count_sd``; the channels taken as independent: they are
nearly so, reports hold ``s`` of ``d`` channels drawn without replacement); the mean of
``R`` independent delays with the mean that theory predicts for each replicate (from the chart's
state at the onset and the shift in standard units, :func:`~aggregator.series.cusum.arl_from`)
within ``K sd / sqrt(R)``, ``sd`` the run length's. ``K = Phi^-1(1 - 1e-3 / (2 CHECKS))``:
a family-wise error of 1e-3 over the ``CHECKS`` simulated checks here (Bonferroni).
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest

from aggregator.series.cusum import CusumDesign, arl_from
from aggregator.series.detector import (
    ChangeDetector,
    DetectorConfig,
    Observation,
    detect,
    latest,
    observations,
)
from edge import MechanismSpec
from sim.models.sensors import SensorFleet
from tests.aggregator.fleet_rounds import FleetRounds
from tests.aggregator.test_window_width import SETTINGS, TEMPERATURE, sensor_halfwidth

CHECKS = 4
K = NormalDist().inv_cdf(1 - 1e-3 / (2 * CHECKS))
CHANNELS, S = 6, 2
HEAT = 3.0  # degC on temperature, channel 0


def fleet_rounds(epsilon: float, devices: int, seed: int, per_day: int) -> FleetRounds:
    spec = MechanismSpec(mechanism="coco", d=CHANNELS, s=S, epsilon=epsilon)
    fleet = SensorFleet(n_devices=devices, channels=CHANNELS, seed=seed, faulty_fraction=0.0)
    return FleetRounds(spec, fleet, rounds_per_day=per_day)


def test_the_false_alarm_rate_on_a_fleet_without_change_is_the_stated_one() -> None:
    """6,000 rounds of 1,000 devices at epsilon 4 with a 24-round day, a chart designed for
    an in-control ARL of 200 rows (so that the check sees about 180 alarms; the service's
    10,000 would need 50 times the rounds: theory carries the rate over, the test on normal
    residuals in tests/aggregator/test_cusum.py checks it at another ARL). The residuals are
    standard normal (mean and variance within their sampling error), which is what the
    rate assumes."""
    rounds, day = 6000, 24
    fr = fleet_rounds(4.0, 1000, seed=3, per_day=day)
    design = CusumDesign.for_arl(200.0)
    detector = ChangeDetector(DetectorConfig(period=fr.day_seconds, design=design), CHANNELS)
    rng = np.random.default_rng(5)
    z = []
    for r in range(rounds):
        state, _ = fr.round(r, rng)
        z.append(detector.update(fr.observation(r, state)).z)
    charted = rounds - day
    expected = CHANNELS * charted * design.false_alarm_rate
    sd = math.sqrt(CHANNELS) * design.alarm_count_sd(charted)
    alarms = int(detector.alarms.sum())
    assert abs(alarms - expected) <= K * sd, (alarms, expected, sd)
    residuals = np.array(z[day:]).ravel()
    assert not np.isnan(residuals).any()
    assert np.isnan(np.array(z[:day])).all()
    cells = residuals.size
    assert abs(residuals.mean()) <= K / math.sqrt(cells)
    assert abs(residuals.var() - 1) <= K * math.sqrt(2 / cells)


def test_a_heatwave_is_found_after_the_delay_theory_states() -> None:
    """40 fleets of 2,000 devices at epsilon 8, a 48-round day: two days learn, then from a
    random round of the third temperature reads +3 degC. Each replicate's delay (rounds from
    the onset to the upward alarm, the alarm's round included) against the chart's expected
    run length from its state at the onset under the shift in standard units, ``+3 degC``
    as a ternary mean (``s/d * 2 * 3 / (hi - lo)``) over the scale of the residuals. The
    alarm comes within the day, before the profile of a phase has seen a changed round."""
    design = CusumDesign.for_arl(1e4)  # the service's default
    day, replicates = 48, 40
    shift_mean = S / CHANNELS * 2 * HEAT / 70.0  # temperature spans [-20, 50] degC
    measured, predicted, spread = [], [], []
    for rep in range(replicates):
        fr = fleet_rounds(8.0, 2000, seed=100 + rep, per_day=day)
        rng = np.random.default_rng(200 + rep)
        onset = 2 * day + int(rng.integers(day // 2))
        hot = np.arange(CHANNELS) == 0

        def heat(r: int, x: np.ndarray, onset: int = onset, hot: np.ndarray = hot) -> np.ndarray:
            return x + HEAT * hot if r >= onset else x

        detector = ChangeDetector(DetectorConfig(period=fr.day_seconds, design=design), CHANNELS)
        scales, at_onset, r = [], 0.0, 0
        while True:
            if r == onset:
                at_onset = float(detector.upper[0])
            state, _ = fr.round(r, rng, heat)
            result = detector.update(fr.observation(r, state))
            if r >= onset:
                scales.append(float(result.scale[0]))
                if result.raised[0] == 1:
                    break
            r += 1
            assert r < onset + day, "no alarm within the day"
        shift = shift_mean / float(np.mean(scales))
        measured.append(r - onset + 1)
        predicted.append(float(arl_from(design.k, design.h, shift, [at_onset])[0]))
        spread.append(design.delay(shift).sd)
    sd = float(np.mean(spread))
    gap = np.mean(measured) - np.mean(predicted)
    assert abs(gap) <= K * sd / math.sqrt(replicates), (np.mean(measured), np.mean(predicted))


def test_rows_are_read_from_a_series_document_and_checked() -> None:
    est = {"n": 10, "mean": [0.1, None], "mean_se": [0.01, None], "freq": [0.5, None]}
    doc = {
        "columns": ["round", "start", "end", "n", "batches", "smallest_release", "estimates"],
        "rows": [[r, 60.0 * r, 60.0 * (r + 1), 10, 1, 10, est] for r in range(4)],
        "dims": [0, 3],
    }
    dims, rows = observations(doc)
    assert dims == [0, 3]
    assert len(rows) == 4
    assert np.isnan(rows[0].mean[1])
    results = detect(rows, DetectorConfig(period=120.0), 2)
    assert np.isnan(results[0].z).all()
    assert np.isnan(results[1].z).all()
    assert results[2].z[0] == 0.0
    assert np.isnan(results[2].z[1])
    statistic, alarm = latest(results, 2)
    assert statistic.tolist() == [0.0, 0.0]
    assert not alarm.any()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"columns": [], "rows": [], "dims": []}, "needs the columns"),
        ({"rows": []}, "needs 'columns'"),
        ({**doc, "dims": [0]}, "2 values for 1 dims"),
        ({**doc, "rows": [[0, 0.0, 60.0, 1, 1, 1, {"n": -1}]]}, "report count"),
        ({**doc, "rows": [[0, 60.0, 60.0, 1, 1, 1, est]]}, "empty"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            observations(bad)
    detector = ChangeDetector(DetectorConfig(period=90.0), 2)
    with pytest.raises(ValueError, match="whole number"):
        detector.update(rows[0])
    detector = ChangeDetector(DetectorConfig(period=120.0), 2)
    detector.update(rows[1])
    with pytest.raises(ValueError, match="time order"):
        detector.update(rows[0])


def test_an_alarm_shows_for_hold_rows_and_a_channel_is_charted_alone() -> None:
    """A cycle of 8 rows, two cycles of zeros, then a step of 20 standard errors on channel
    1 in one row: the upper side crosses ``h`` at once (the residual's scale is
    ``se sqrt(1 + 1/2)`` with two earlier rows in the profile), the flag stays up for
    ``hold`` rows, and channel 0 (no change) stays quiet."""
    se = np.array([0.01, 0.01])
    config = DetectorConfig(period=8 * 60.0, design=CusumDesign(k=0.5, h=4.0), hold=3)

    def row(r: int, mean: list[float]) -> Observation:
        return Observation(r * 60.0, (r + 1) * 60.0, 10**9, np.array(mean), se, np.zeros(2))

    means = [[0.0, 0.0]] * 16 + [[0.0, 0.2]] + [[0.0, 0.0]] * 7
    results = detect([row(r, m) for r, m in enumerate(means)], config, 2)[16:]
    assert [int(x.raised[1]) for x in results] == [1, 0, 0, 0, 0, 0, 0, 0]
    assert [bool(x.alarm[1]) for x in results] == [True, True, True] + [False] * 5
    assert not any(x.alarm[0] for x in results)
    assert results[0].statistic[1] == pytest.approx(20 / math.sqrt(1.5) - 0.5)
    assert results[1].statistic.tolist() == [0.0, 0.0]


def delay_table() -> str:
    """Expected delay (rounds, from the onset, zero state) of the default chart after a
    +3 degC step of the fleet's mean temperature, CoCo d = 6, s = 2, with ``m`` reports per
    round and three learned days (the residual's scale ``sigma sqrt(1 + 1/3)``)."""
    design = CusumDesign.for_arl(1e4)
    half = (TEMPERATURE.hi - TEMPERATURE.lo) / 2
    vbar = 2 * (TEMPERATURE.base - TEMPERATURE.lo) / (TEMPERATURE.hi - TEMPERATURE.lo) - 1
    lines = [
        "| ε | m | sd of a round (degC) | shift (sd of z) | delay (rounds) | its sd |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for eps, m in SETTINGS:
        spec = MechanismSpec(mechanism="coco", d=CHANNELS, s=S, epsilon=eps)
        sigma = sensor_halfwidth(spec, half, vbar, m) / 1.959963984540054
        shift = HEAT / (sigma * math.sqrt(1 + 1 / 3))
        delay = design.delay(shift)
        lines.append(
            f"| {eps:g} | {m} | {sigma:.2f} | {shift:.2f} | {delay.mean:.1f} | {delay.sd:.1f} |"
        )
    return "\n".join(lines)


def test_the_documented_delays_are_the_theory() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "estimates.md").read_text("utf-8")
    assert delay_table() in docs


if __name__ == "__main__":
    print(delay_table())
