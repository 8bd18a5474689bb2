"""A compressed day (``coco fleet --day-seconds``, ``coco demo --day-seconds``): the sensor
model's daily cycle in S wall-clock seconds, the fleet's per-round ground truth following
the same clock; the real day by default, unchanged."""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from edge.spec import MechanismSpec
from sim.cli import app
from sim.fleet.models import DeviceStreams, FleetModel
from sim.fleet.run import Fleet, FleetConfig
from sim.fleet.truth import GroundTruth, read_document, write_merged, write_onto
from sim.models.day import DAY_SECONDS, check_day_seconds, hour_of_day
from sim.models.sensors import CHANNELS
from tests.conftest import Broker

SENSORS = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)


def test_hour_of_day_compresses_the_day_and_keeps_the_real_one() -> None:
    for t in (0, 1, 3599, 3600, 45_296, 1_700_000_123, 86_399, 86_400, 2**40 + 17):
        assert hour_of_day(t) == (t % 86_400) / 3600  # bit for bit: default unchanged
    assert hour_of_day(1_200, 120) == 0.0
    assert hour_of_day(1_260, 120) == 12.0
    assert hour_of_day(1_275, 120) == 15.0
    assert check_day_seconds(DAY_SECONDS, 86_400) == DAY_SECONDS
    assert check_day_seconds(20, 10) == 20
    for bad in (0, -5, True, 1.5):
        with pytest.raises(ValueError, match="day_seconds must be an int >= 1"):
            check_day_seconds(bad, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must hold at least two rounds of 10 s"):
        check_day_seconds(19, 10)
    with pytest.raises(ValueError, match="must hold at least two rounds"):
        FleetConfig(
            broker="mqtt://127.0.0.1:1", deployment="d", spec=SENSORS, devices=1,
            round_seconds=60, day_seconds=100,
        )  # fmt: skip


def test_the_default_day_is_the_real_one() -> None:
    """No --day-seconds: the same vectors as a model told the real day explicitly, and the
    readings of a round's UTC hour."""
    streams = DeviceStreams(5, 50)
    base = FleetModel(name="sensors", spec=SENSORS, n_devices=50, seed=5, round_seconds=600)
    real = FleetModel(
        name="sensors", spec=SENSORS, n_devices=50, seed=5, round_seconds=600, day_seconds=86_400
    )
    r = 2_833_339  # a round at 14:50 UTC
    streams.set_round(r)
    first = base.vectors(r, streams)
    streams.set_round(r)
    assert real.vectors(r, streams) == first
    np.testing.assert_array_equal(
        base.sensors.readings(r, hour=(r * 600 % 86_400) / 3600),
        real.sensors.readings(r, hour=hour_of_day(r * 600)),
    )


def test_a_compressed_day_runs_the_cycle_and_the_truth_follows_it() -> None:
    """S = 120 s of 5-s rounds (24 rounds a day), two days, seeded. The per-round ground
    truth of the published vectors (what the aggregator's per-round estimate estimates)
    is, within k standard errors, (s/d) times the mean normalised reading of the round's
    compressed hour; the readings' mean temperature goes through the whole cycle: its
    15:00 minus its 03:00 is twice the amplitude over the devices whose temperature is
    working, within k standard errors of the noise and drift; one day later, the same."""
    n, rs, day = 3000, 5, 120
    per_day = day // rs
    config = FleetConfig(
        broker="mqtt://127.0.0.1:1", deployment="d", spec=SENSORS, devices=n,
        round_seconds=rs, day_seconds=day, seed=11,
    )  # fmt: skip
    fleet = Fleet(config)
    model, sensors = fleet.model, fleet.model.sensors
    streams = DeviceStreams(config.seed, n)
    first = (1_700_000_040 // day) * day // rs  # the first round of a compressed day
    rounds = list(range(first, first + 2 * per_day))
    truth = GroundTruth(d=SENSORS.d)
    lo, hi = (np.array(r) for r in sensors.ranges)
    scale = SENSORS.s / SENSORS.d
    # Bonferroni over the (round, channel) cells
    k = NormalDist().inv_cdf(1 - 0.001 / (2 * len(rounds) * SENSORS.d))
    temperature: dict[int, float] = {}
    for r in rounds:
        streams.set_round(r)
        for keys, signs in model.vectors(r, streams):
            truth.add(r, keys, signs)
        hour = hour_of_day(r * rs, day)
        readings = sensors.readings(r, hour=hour)
        temperature[r] = float(readings[:, 0].mean())
        v = 2 * (np.clip(readings, lo, hi) - lo) / (hi - lo) - 1
        sums = truth.rounds[r]
        assert sums.n == n
        for j in range(SENSORS.d):  # light (j = 4) swings over a third of its range
            expected = scale * float(v[:, j].mean())
            se = math.sqrt(float(np.sum(scale - (scale * v[:, j]) ** 2))) / n
            assert abs(sums.total[j] / n - expected) <= k * se, (r, hour, j)
    temp = CHANNELS[0]
    working = 1 - sensors.faulty_devices / n  # at least this share cycles
    # the noise of two rounds' means and the drift over the 12 hours between them
    sd = math.sqrt(2 * temp.noise_sd**2 + (12 * temp.drift_sd) ** 2) / math.sqrt(n)
    for d0 in (first, first + per_day):
        peak, trough = d0 + per_day * 15 // 24, d0 + per_day * 3 // 24
        assert hour_of_day(peak * rs, day) == 15.0
        gap = temperature[peak] - temperature[trough]
        assert 2 * temp.daily_amplitude * working - k * sd <= gap
        assert gap <= 2 * temp.daily_amplitude + k * sd
    for r in rounds[:per_day]:  # a day later: the same hour, the same expected truth
        assert abs(temperature[r + per_day] - temperature[r]) <= k * sd


def test_the_cli_writes_the_day_into_the_truth_file_and_refuses_another(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """``--day-seconds`` is part of a ground-truth file's identity: the file says it, and a
    run with another day is refused before it publishes; a day shorter than two rounds is a
    one-line error."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SENSORS.to_dict()))
    truth = tmp_path / "truth.json"

    def cli(*extra: str) -> Any:
        return CliRunner().invoke(
            app,
            [
                *("fleet", "--broker", mosquitto.url, "--deployment", "day"),
                *("--spec", str(spec_file), "--round-seconds", "1", "--seed", "3"),
                *("--devices", "10", "--rounds", "2", "--no-progress", "--json"),
                *("--ground-truth", str(truth), *extra),
            ],
        )

    result = cli("--day-seconds", "4")
    assert result.exit_code == 0, result.output
    doc = json.loads(truth.read_text())
    assert (doc["round_seconds"], doc["day_seconds"]) == (1, 4)
    assert [x["n"] for x in doc["rounds"]] == [10, 10]
    assert len(doc["runs"]) == 1
    before = truth.read_bytes()
    result = cli()
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"error: {truth} is the ground truth of a run with day_seconds 4, this run has "
        "day_seconds 86400: not adding to it (give --ground-truth another path)"
    ]
    assert truth.read_bytes() == before
    result = cli("--day-seconds", "1")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: day_seconds 1 must hold at least two rounds of 1 s (>= 2) to show the daily cycle"
    ]


def test_a_run_writing_after_every_round_replaces_its_own_rounds(tmp_path: Path) -> None:
    """The per-round writes of a run go onto the file as it was when the run started: the
    run is one entry of ``runs`` and its rounds are counted once, however often written."""
    path = tmp_path / "truth.json"
    header: dict[str, Any] = {"spec": SENSORS, "seed": 1, "model": "sensors", "round_seconds": 5}
    earlier = GroundTruth(d=6)
    earlier.add(10, [0, 1], [1, -1])
    write_merged(path, earlier.to_dict(**header, run={"devices": 1}))
    base = read_document(path)
    run = GroundTruth(d=6)
    run.add(20, [2, 3], [1, 1])
    write_onto(path, base, run.to_dict(**header, run={"devices": 2}))
    run.add(20, [2, 4], [-1, 1])
    run.add(21, [5, 0], [1, 1])
    doc = write_onto(path, base, run.to_dict(**header, run={"devices": 2}))
    assert json.loads(path.read_text()) == doc
    assert doc["runs"] == [{"devices": 1}, {"devices": 2}]
    assert [(x["round"], x["n"]) for x in doc["rounds"]] == [(10, 1), (20, 2), (21, 1)]
    assert doc["overall"]["n"] == 4
    assert doc["overall"]["total"] == [2, -1, 0, 1, 1, 1]
