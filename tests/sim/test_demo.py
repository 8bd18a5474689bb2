"""The sensor model and ``coco demo`` (against a real Mosquitto from the fixture)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.sensors import CHANNELS, SensorFleet
from tests.conftest import Broker


def test_readings_are_seeded_in_range_and_match_the_ground_truth() -> None:
    fleet = SensorFleet(n_devices=500, channels=8, seed=7, faulty_fraction=0.05)
    again = SensorFleet(n_devices=500, channels=8, seed=7, faulty_fraction=0.05)
    x = fleet.readings(3)
    assert x.shape == (500, 8)
    np.testing.assert_array_equal(x, again.readings(3))  # same seed, same readings
    assert not np.array_equal(x, fleet.readings(4))
    lo, hi = (np.array(r) for r in fleet.ranges)
    assert np.all(x >= lo)
    assert np.all(x <= hi)
    np.testing.assert_array_equal(fleet.ground_truth_mean(3), x.mean(axis=0))
    # the stuck channels sit at a range edge in every round
    at_edge = (x == lo) | (x == hi)
    assert fleet.faulty_devices > 0
    assert at_edge.any(axis=1).sum() >= fleet.faulty_devices


def test_daily_cycle_moves_the_temperature() -> None:
    fleet = SensorFleet(n_devices=2000, channels=5, seed=1, hours_per_round=1.0)
    temp = [float(fleet.ground_truth_mean(r)[0]) for r in (3, 15)]  # night vs afternoon
    peak = CHANNELS[0]
    assert temp[1] - temp[0] == pytest.approx(2 * peak.daily_amplitude, rel=0.1)


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="channels must be in"):
        SensorFleet(n_devices=10, channels=4)
    with pytest.raises(ValueError, match="n_devices"):
        SensorFleet(n_devices=0)


def test_encoder_round_trip_of_the_truth() -> None:
    fleet = SensorFleet(n_devices=20000, channels=6, seed=2)
    encoder = fleet.encoder(s=6)  # s = d: every channel, only the sign noise is left
    x = fleet.readings(0)
    keys, signs = encoder.encode_batch(x, np.random.default_rng(0))
    mean = np.zeros(6)
    np.add.at(mean, keys.ravel(), signs.ravel().astype(float))
    value, se = encoder.decode_mean(mean / x.shape[0], np.zeros(6), n=x.shape[0])
    half = (np.array(fleet.ranges[1]) - np.array(fleet.ranges[0])) / 2
    # No mechanism: the standard error is the sign noise's alone, at most half / sqrt(n).
    assert np.all(se <= half / np.sqrt(x.shape[0]))
    assert np.all(np.abs(value - x.mean(axis=0)) <= 5 * se)


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_demo_json_against_the_fixture_broker(mosquitto: Broker) -> None:
    result = CliRunner().invoke(
        app,
        [
            "demo", "--devices", "300", "--rounds", "2", "--min-batch", "100",
            "--broker", mosquitto.url, "--timeout", "45", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    for key in (
        "reports_sent", "reports_aggregated", "reports_rejected", "n", "epsilon_local",
        "epsilon_central", "delta", "mse_mean", "mse_mean_theory",
        "throughput_reports_per_s", "broker",
    ):  # fmt: skip
        assert key in doc, key
    assert doc["reports_sent"] == 600
    assert doc["reports_sent"] == (
        doc["reports_aggregated"] + doc["reports_rejected"] + doc["reports_dropped"]
    )
    assert doc["n"] == doc["reports_aggregated"] == 600
    assert doc["broker"].startswith("external")
    assert 0 < doc["epsilon_central"] < doc["epsilon_local"]
    # the achieved error is within a generous factor of its closed form (one run, d=6)
    assert 0 < doc["mse_mean"] < 5 * doc["mse_mean_theory"]


def test_demo_refuses_a_bad_broker_url() -> None:
    result = CliRunner().invoke(app, ["demo", "--broker", "http://x", "--json"])
    assert result.exit_code == 1
    assert "broker must be mqtt://host:port" in result.output
