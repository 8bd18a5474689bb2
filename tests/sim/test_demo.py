"""The sensor model and ``coco demo`` (against a real Mosquitto from the fixture)."""

from __future__ import annotations

import itertools
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from aggregator.page.live_page import CONTENT_SECURITY_POLICY
from sim.cli import app
from sim.models.sensors import CHANNELS, MORE_CHANNELS, SensorFleet, channel_table
from tests.conftest import Broker, free_port


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
    with pytest.raises(ValueError, match="channels must be >= 1, got 0"):
        SensorFleet(n_devices=10, channels=0)
    with pytest.raises(ValueError, match="n_devices"):
        SensorFleet(n_devices=0)


@pytest.mark.parametrize("channels", [1, 4, 12, 16, 17, 40])
def test_any_channel_count_has_named_channels_in_range(channels: int) -> None:
    fleet = SensorFleet(n_devices=300, channels=channels, seed=3, faulty_fraction=0.05)
    x = fleet.readings(2)
    assert x.shape == (300, channels)
    assert len(set(fleet.names)) == channels  # distinct names, one per channel
    lo, hi = (np.array(r) for r in fleet.ranges)
    assert np.all((lo <= x) & (x <= hi))
    catalogue = CHANNELS + MORE_CHANNELS
    for j, ch in enumerate(fleet.channel_specs):
        base = catalogue[j % len(catalogue)]
        board = j // len(catalogue)
        assert ch.name == (base.name if board == 0 else f"{base.name}_{board + 1}")
        assert (ch.unit, ch.lo, ch.hi) == (base.unit, base.lo, base.hi)
    # the channels of the repeated boards read values of their own
    if channels > len(catalogue):
        assert not np.array_equal(x[:, 0], x[:, len(catalogue)])


def test_the_first_channels_and_their_readings_do_not_depend_on_the_count() -> None:
    """Up to eight channels the fleet is the one it always was: CHANNELS' first ``channels``
    (the demo's six included), and a larger fleet's first channels are the same ones."""
    for k in range(1, 9):
        assert channel_table(k) == CHANNELS[:k]
    assert channel_table(16)[:8] == CHANNELS
    assert SensorFleet(n_devices=1).names == (
        "temperature", "humidity", "pressure", "co2", "light", "noise",
    )  # fmt: skip


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
    assert "url" not in doc  # nothing served without --serve
    assert 0 < doc["epsilon_central"] < doc["epsilon_local"]
    # the achieved error is within a generous factor of its closed form (one run, d=6)
    assert 0 < doc["mse_mean"] < 5 * doc["mse_mean_theory"]
    assert doc["mse_mean_ratio"] == pytest.approx(doc["mse_mean"] / doc["mse_mean_theory"])
    for ch in doc["channels"]:  # each interval within the channel's physical range
        unclipped = (ch["estimate"] - ch["ci95_halfwidth"], ch["estimate"] + ch["ci95_halfwidth"])
        if ch["ci95_range"] == "outside":  # misses the range, shown as it is
            assert (ch["ci95_lo"], ch["ci95_hi"]) == unclipped
            assert unclipped[1] < ch["lo"] or unclipped[0] > ch["hi"]
        else:
            assert ch["lo"] <= ch["ci95_lo"] <= ch["ci95_hi"] <= ch["hi"], ch
            cut = (ch["ci95_lo"], ch["ci95_hi"]) != unclipped
            assert ch["ci95_range"] == ("cut" if cut else "inside")


def test_demo_refuses_a_bad_broker_url() -> None:
    result = CliRunner().invoke(app, ["demo", "--broker", "http://x", "--json"])
    assert result.exit_code == 1
    assert "broker must be mqtt://host:port" in result.output


def _get(url: str) -> tuple[bytes, str | None]:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body, response.headers.get("Content-Security-Policy")


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_demo_serve_keeps_the_live_page_up_until_ctrl_c(mosquitto: Broker) -> None:
    coco = str(Path(sys.executable).with_name("coco"))
    command = [
        coco, "demo", "--devices", "300", "--rounds", "2", "--min-batch", "100",
        "--broker", mosquitto.url, "--timeout", "45", "--serve",
    ]  # fmt: skip
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stderr is not None
        progress = []
        for line in proc.stderr:  # until the run is over and the final state is served
            progress.append(line)
            if line.startswith("serving the final estimates at "):
                break
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", progress[-1])
        assert match is not None, "".join(progress)
        url = match.group(0)
        assert f"live page: {url}\n" in progress  # served during the run, on that port
        estimates, _ = _get(url + "estimates")
        page, policy = _get(url)
        # the run's truth (from memory) and series, up to the end of its last round (the
        # default, now, may lie in it)
        truth = json.loads(_get(url + "truth?dims=0,1&to=1e12")[0])
        series = json.loads(_get(url + "series?dims=0,1&to=1e12")[0])
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    doc = json.loads(estimates)
    assert doc["n"] == doc["counters"]["reports"] == 600
    # one participation per round (aggregator/ledger/privacy_ledger.py), at most one per batch
    assert 1 <= doc["batches_accounted"] <= doc["counters"]["batches"]
    # the page's units: the sensor model's channels, and the privacy level over time
    assert [(c["name"], c["unit"]) for c in doc["channels"]] == [
        (c.name, c.unit) for c in CHANNELS[:6]
    ]
    points = doc["privacy_history"]["points"]
    assert points[-1][1:] == [
        doc["batches_accounted"], doc["epsilon_central"]["smallest"],
        doc["epsilon_central"]["latest"], doc["epsilon_total"],
    ]  # fmt: skip
    assert "device" not in json.dumps(doc)
    assert page.startswith(b"<!doctype html>")
    assert policy == CONTENT_SECURITY_POLICY
    assert stdout.rstrip().endswith(f"live page: {url}")  # the table's last line
    assert "aggregated 600" in stdout
    # the simulation truth beside the per-round series, round by round
    assert truth["simulation_only"] is True
    assert [row[3] for row in truth["rows"]] == [300, 300]
    at = series["columns"].index("round")
    assert [row[at] for row in series["rows"]] == [row[0] for row in truth["rows"]]


def _status(url: str) -> int | str:
    """The HTTP status of ``GET url``, or the error when no answer came (a refusal)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code
    except OSError as exc:
        return repr(exc)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_demo_serve_answers_every_request_from_the_run_to_ctrl_c(mosquitto: Broker) -> None:
    """A client reads /estimates, / and /metrics every 50 ms from before the demo starts
    until well after the final state is served: once the page first answered, every request
    is answered 200, across the end of the run (one server for the whole command; there
    used to be a second one after the run, and a window with the port closed)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    outcomes: list[tuple[bool, str, int | str]] = []  # (final state served, path, status)
    final, done = threading.Event(), threading.Event()

    def poll() -> None:
        for path in itertools.cycle(("estimates", "", "metrics")):
            if done.is_set():
                return
            outcomes.append((final.is_set(), path, _status(base + path)))
            done.wait(0.05)

    coco = str(Path(sys.executable).with_name("coco"))
    command = [
        coco, "demo", "--devices", "300", "--rounds", "2", "--min-batch", "100",
        "--broker", mosquitto.url, "--timeout", "60", "--serve", "--port", str(port),
    ]  # fmt: skip
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stderr is not None
        progress = []
        for line in proc.stderr:
            progress.append(line)
            if line.startswith("serving the final estimates at "):
                break
        assert progress, "no output"
        assert progress[-1].startswith("serving the final"), "".join(progress)
        final.set()
        seen = len(outcomes)
        while sum(1 for after, _, _ in outcomes[seen:] if after) < 30:  # 10 rounds of 3
            assert proc.poll() is None, "".join(progress)
            done.wait(0.05)
        done.set()
        poller.join(timeout=30)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    first = next(k for k, (_, _, status) in enumerate(outcomes) if status == 200)
    answered = outcomes[first:]
    assert [o for o in answered if o[2] != 200] == [], f"{len(answered)} requests"
    assert any(not after for after, _, _ in answered)  # the run was read while it ran
    assert sum(1 for after, _, _ in answered if after) >= 30
    assert f"live page: {base}\n" in progress


def test_demo_serve_on_a_busy_port_is_one_line_naming_it_before_any_work() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            app, ["demo", "--devices", "300", "--min-batch", "100", "--serve", "--port", str(port)]
        )
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use: choose another with --port"
    ]


def test_demo_with_participation_sampling(mosquitto: Broker) -> None:
    """--participation 0.5: about half the device-rounds report (within K = 5 binomial
    standard errors), every report is aggregated, the truth is over the devices that
    reported and the fleet-wide mean is given beside it; a min_batch the sampled rounds
    could fall below is refused in one line."""
    devices, rounds, q = 400, 2, 0.5
    result = CliRunner().invoke(
        app,
        [
            "demo", "--devices", str(devices), "--rounds", str(rounds), "--min-batch", "100",
            "--participation", str(q), "--broker", mosquitto.url, "--timeout", "45", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    sent, trials = doc["reports_sent"], devices * rounds
    assert abs(sent - q * trials) <= 5 * (trials * q * (1 - q)) ** 0.5
    assert doc["n"] == doc["reports_aggregated"] == sent
    assert doc["participation"] == q
    assert "devices that reported" in doc["ground_truth_note"]
    for channel in doc["channels"]:
        assert channel["ground_truth_fleet"] is not None
    too_big = CliRunner().invoke(
        app,
        ["demo", "--devices", "300", "--min-batch", "200", "--participation", "0.5",
         "--broker", mosquitto.url],
    )  # fmt: skip
    assert too_big.exit_code == 1
    assert "too few for min_batch 200" in too_big.stderr
