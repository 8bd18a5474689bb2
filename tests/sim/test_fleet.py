"""``coco fleet`` against a real Mosquitto: reproducibility, topics and counts, the
ground truth against the private estimates, per-device credentials, many connections,
multiplexing, interruption, wall-clock rounds.

The fleets here run 1 s rounds (announced with ``round_seconds=1``), so a run of R rounds
takes about R seconds; what is asserted about rounds never depends on when the test runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

import aiomqtt
import numpy as np
import pytest
from typer.testing import CliRunner

from aggregator.estimation.estimators import AggregateState
from edge.announce import encode_announcement
from edge.codec import decode_report
from edge.spec import MechanismSpec
from edge.topics import spec_topic
from sim.cli import app
from sim.credentials.accounts import device_id
from sim.credentials.mosquitto import mosquitto_password_file
from sim.fleet.cli import EXIT_NOT_SENT
from sim.fleet.connection import backoff_delay
from sim.fleet.metrics import CONNECT_FAILURE_REASONS, PUBLISH_FAILURE_REASONS
from sim.fleet.models import FleetModel
from sim.fleet.run import Fleet, FleetConfig, ensure_fd_limit, next_round
from sim.fleet.truth import (
    GroundTruth,
    GroundTruthFileError,
    merge_documents,
    read_document,
    write_merged,
)
from tests import waiting
from tests.asyncutil import run, value, wait_until
from tests.conftest import MOSQUITTO, Broker, free_port

pytestmark = pytest.mark.integration

SENSORS = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
KEYVALUE = MechanismSpec(mechanism="collision", d=24, s=4, epsilon=2.0)


def config(broker: Broker, **kw: Any) -> FleetConfig:
    base: dict[str, Any] = {
        "broker": broker.url,
        "deployment": "fleet-test",
        "spec": SENSORS,
        "devices": 40,
        "rounds": 2,
        "round_seconds": 1,
        "seed": 11,
        "publish_timeout": 30.0,
    }
    return FleetConfig(**(base | kw))


@contextlib.asynccontextmanager
async def subscriber(broker: Broker, deployment: str) -> AsyncIterator[list[tuple[str, bytes]]]:
    """Every ingress message of ``deployment``, as ``(topic, payload)``."""
    received: list[tuple[str, bytes]] = []
    async with aiomqtt.Client("127.0.0.1", broker.port, max_queued_incoming_messages=0) as client:
        await client.subscribe(f"coco/v1/{deployment}/ingress/+", qos=1)

        async def collect() -> None:
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                received.append((str(message.topic), message.payload))

        task = asyncio.create_task(collect())
        try:
            yield received
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def capture(cfg: FleetConfig) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
    """Reports seen by the fleet's hook, and the run's summary."""
    seen: list[tuple[str, bytes]] = []
    fleet = Fleet(cfg, on_report=lambda topic, payload: seen.append((topic, payload)))
    summary = run(fleet.run(), 60)
    return seen, summary


def by_round(seen: list[tuple[str, bytes]]) -> dict[int, dict[str, tuple[int, int, int]]]:
    """``{round: {topic: (fingerprint, seed, z)}}`` of the reports seen."""
    out: dict[int, dict[str, tuple[int, int, int]]] = {}
    for topic, payload in seen:
        _, fingerprint, round_, seed, z = decode_report(payload)
        assert topic not in out.setdefault(round_, {})  # one report per device and round
        out[round_][topic] = (fingerprint, seed, z)
    return out


def replayed(cfg: FleetConfig, round_: int) -> dict[str, tuple[int, int, int]]:
    """What ``cfg``'s devices report in wall-clock ``round_``, computed offline."""
    fleet = Fleet(cfg)
    fingerprint = cfg.spec.fingerprint_int
    return {
        topic: (fingerprint, seed, z)
        for topic, report in zip(fleet.topics, fleet.reports(round_), strict=True)
        if report is not None
        for (_, _, seed, z) in [report]
    }


def test_same_seed_same_reports_in_a_round_whatever_the_mode(mosquitto: Broker) -> None:
    """A round's reports are a function of (seed, device, round): every mode sends exactly
    what an offline replay of that round computes."""
    own, summary = capture(config(mosquitto))
    assert summary["reports_published"] == 80
    shared, _ = capture(config(mosquitto, mode="multiplexed", connections=3))
    for seen in (own, shared):
        per_round = by_round(seen)
        assert len(per_round) == 2  # two wall-clock rounds, 40 reports each
        for round_, reports in per_round.items():
            assert reports == replayed(config(mosquitto), round_)
    rounds = [decode_report(p)[2] for _, p in own]
    assert rounds == sorted(rounds)
    assert summary["first_round"] == rounds[0] < rounds[-1] == summary["last_round"]
    assert summary["round_seconds"] == 1


def test_a_device_report_depends_on_seed_device_and_round_only() -> None:
    """Offline: another fleet size, mode or order of rounds gives device i the same report
    in round r; another round or another seed gives it another one."""
    base = FleetConfig(
        broker="mqtt://127.0.0.1:1", deployment="d", spec=SENSORS, devices=30,
        round_seconds=10, seed=7,
    )  # fmt: skip
    r = 177_000_000
    first = Fleet(base).reports(r)
    again = Fleet(base)
    again.reports(r + 5)  # another round first: nothing carries over
    assert again.reports(r) == first
    small = Fleet(replace(base, devices=10, mode="multiplexed"))
    assert small.reports(r) == first[:10]
    assert None not in first  # participation 1: every device reports
    for other in (Fleet(base).reports(r + 1), Fleet(replace(base, seed=8)).reports(r)):
        assert all(
            a is not None and b is not None and a[2:] != b[2:]
            for a, b in zip(first, other, strict=True)
        )
    kv = replace(base, spec=KEYVALUE, model="keyvalue")
    assert Fleet(kv).reports(r) == Fleet(kv).reports(r)
    vectors = [[None if x is None else x[:2] for x in Fleet(kv).reports(k)] for k in (r, r + 1)]
    assert vectors[0] != vectors[1]


def test_a_rerun_with_the_same_seed_sends_new_reports(mosquitto: Broker) -> None:
    """Issue 18: the README's fleet run twice with --seed 7 published the identical (seed,
    z) reports in new rounds, which the aggregator counted as new data."""
    first, _ = capture(config(mosquitto))
    second, summary = capture(config(mosquitto))
    assert summary["reports_published"] == 80
    one, two = by_round(first), by_round(second)
    assert not set(one) & set(two)  # new rounds (a run never reuses the previous one's)
    sent = {(topic, report[1:]) for reports in one.values() for topic, report in reports.items()}
    again = {(topic, report[1:]) for reports in two.values() for topic, report in reports.items()}
    assert len(sent) == len(again) == 80
    assert not sent & again  # no device repeats a (seed, z)
    for round_, reports in two.items():
        assert reports == replayed(config(mosquitto), round_)  # reproducible per round


def test_every_device_reports_on_its_own_topic_and_the_truth_matches(mosquitto: Broker) -> None:
    n, rounds = 300, 3
    cfg = config(mosquitto, devices=n, rounds=rounds, seed=5)
    fleet = Fleet(cfg)

    async def scenario() -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        async with subscriber(mosquitto, cfg.deployment) as received:
            summary = await fleet.run()
            await wait_until(
                lambda: len(received) >= n * rounds, 30, progress=lambda: len(received)
            )
            await asyncio.sleep(0.2)  # nothing more may arrive
        return list(received), summary

    received, summary = run(scenario(), 90)
    assert summary["reports_published"] == n * rounds
    assert summary["rounds_completed"] == rounds
    used = fleet.rounds_used
    assert len(used) == rounds
    assert used == sorted(set(used))  # consecutive unless one was skipped, never repeated
    assert used[-1] - used[0] == rounds - 1 + summary["rounds_skipped"]
    assert len(received) == n * rounds
    per_topic = Counter(topic for topic, _ in received)
    assert per_topic == {
        f"coco/v1/{cfg.deployment}/ingress/{device_id(i)}": rounds for i in range(n)
    }
    decoded = [(topic, decode_report(p)) for topic, p in received]
    by_topic_round = {(topic, rep[2]): rep for topic, rep in decoded}
    # Recompute from the model: same vectors, same (seed, z) on the same topic and round.
    replay = Fleet(cfg)
    truth = replay.truth
    for round_ in used:
        for i, replayed_report in enumerate(replay.reports(round_)):
            assert replayed_report is not None
            keys, signs, seed, z = replayed_report
            report = by_topic_round[(replay.topics[i], round_)]
            assert report == (1, SENSORS.fingerprint_int, round_, seed, z)
            truth.add(round_, keys, signs)
    doc = fleet.ground_truth()
    assert doc["simulation_only"] is True
    assert doc["seed"] == 5
    assert doc["spec"] == SENSORS.to_dict()
    assert doc["overall"] == truth.overall.stats()
    assert doc["round_seconds"] == 1
    assert [x["round"] for x in doc["rounds"]] == used  # keyed by the round actually used
    for x in doc["rounds"]:
        assert x == {"round": x["round"], **truth.rounds[x["round"]].stats()}
    registry = fleet.registry
    assert value(registry, "coco_fleet_reports_published_total") == n * rounds
    assert value(registry, "coco_fleet_rounds_completed_total") == rounds
    for j in range(SENSORS.d):
        assert value(registry, "coco_fleet_ground_truth_mean", dim=str(j)) == pytest.approx(
            doc["overall"]["mean"][j]
        )
        assert value(registry, "coco_fleet_ground_truth_freq", dim=str(j)) == pytest.approx(
            doc["overall"]["freq"][j]
        )
        assert value(registry, "coco_fleet_ground_truth_round_mean", dim=str(j)) == (
            pytest.approx(doc["rounds"][-1]["mean"][j])  # the last round the fleet finished
        )
    assert value(registry, "coco_fleet_ground_truth_round") == used[-1]


@pytest.mark.parametrize(("model", "spec"), [("sensors", SENSORS), ("keyvalue", KEYVALUE)])
def test_private_estimates_are_within_k_standard_errors_of_the_truth(
    mosquitto: Broker, model: str, spec: MechanismSpec
) -> None:
    """Offline estimator over the received reports vs the fleet's ground truth.

    Each of the 2d estimates is asymptotically normal with its own SE; k is the two-sided
    normal quantile for a family-wise error of 1e-3 over the 2d comparisons (Bonferroni).
    """
    n, rounds = 3000, 2
    cfg = config(
        mosquitto,
        spec=spec,
        model=model,
        devices=n,
        rounds=rounds,
        mode="multiplexed",
        connections=2,
        seed=3,
    )
    fleet = Fleet(cfg)

    async def scenario() -> list[tuple[str, bytes]]:
        async with subscriber(mosquitto, cfg.deployment) as received:
            await fleet.run()
            await wait_until(
                lambda: len(received) >= n * rounds, 60, progress=lambda: len(received)
            )
        return list(received)

    received = run(scenario(), 120)
    reports = [decode_report(p) for _, p in received]
    state = AggregateState(spec)
    state.add([r[3] for r in reports], [r[4] for r in reports])
    est = state.estimate()
    truth = fleet.ground_truth()["overall"]
    assert truth["n"] == est.n == n * rounds
    k = NormalDist().inv_cdf(1 - 1e-3 / (2 * 2 * spec.d))
    mean_err = np.abs(est.mean - np.array(truth["mean"]))
    freq_err = np.abs(est.freq - np.array(truth["freq"]))
    assert np.all(mean_err <= k * est.mean_se), (mean_err / est.mean_se).max()
    assert np.all(freq_err <= k * est.freq_se), (freq_err / est.freq_se).max()


def fleet_cli(broker: Broker, spec_file: Path, *extra: str) -> Any:
    """``coco fleet`` in-process: 20 devices, 2 rounds of 1 s, the spec from a file."""
    return CliRunner().invoke(
        app,
        [
            *("fleet", "--broker", broker.url, "--deployment", "truth-file"),
            *("--spec", str(spec_file), "--round-seconds", "1"),
            *("--devices", "20", "--rounds", "2", "--no-progress", "--json"),
            *extra,
        ],
    )


def test_ground_truth_files_are_added_to_never_overwritten(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """Issue 18: a second run overwrote truth.json. Now the rounds of every run of the same
    seed, spec, model and round length are merged in the file; another run's file is
    refused before anything is published, and left as it was."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SENSORS.to_dict()))
    truth = tmp_path / "truth.json"
    runs = []
    for _ in range(2):
        result = fleet_cli(mosquitto, spec_file, "--seed", "7", "--ground-truth", str(truth))
        assert result.exit_code == 0, result.output
        runs.append(json.loads(result.stdout))
    doc = json.loads(truth.read_text())
    assert doc["simulation_only"] is True
    assert (doc["seed"], doc["model"], doc["round_seconds"]) == (7, "sensors", 1)
    assert [run["reports_published"] for run in doc["runs"]] == [40, 40]
    rounds = [x["round"] for x in doc["rounds"]]
    ends = [(run["first_round"], run["last_round"]) for run in runs]
    assert rounds == [ends[0][0], ends[0][1], ends[1][0], ends[1][1]]
    assert len(rounds) == 4
    assert doc["overall"]["n"] == 80 == sum(x["n"] for x in doc["rounds"])
    for j in range(SENSORS.d):
        total = sum(x["total"][j] for x in doc["rounds"])
        assert doc["overall"]["total"][j] == total
        assert doc["overall"]["mean"][j] == total / 80

    before = truth.read_bytes()
    for extra, message in [
        (("--seed", "8"), "with seed 7, this run has seed 8"),
        (("--seed", "7", "--model", "keyvalue"), "with model sensors, this run has model keyvalue"),
    ]:
        result = fleet_cli(mosquitto, spec_file, *extra, "--ground-truth", str(truth))
        assert result.exit_code == 1, result.output
        assert result.stdout == ""  # refused before the run: no summary
        assert result.stderr.strip().splitlines() == [
            f"error: {truth} is the ground truth of a run {message}: not adding to it (give "
            "--ground-truth another path)"
        ]
        assert truth.read_bytes() == before
    other = tmp_path / "other.json"
    other.write_text('{"not": "a ground truth"}')
    result = fleet_cli(mosquitto, spec_file, "--seed", "7", "--ground-truth", str(other))
    assert result.exit_code == 1
    assert "is not a ground-truth file of coco fleet" in result.stderr
    assert other.read_text() == '{"not": "a ground truth"}'


def test_merging_ground_truth_documents(tmp_path: Path) -> None:
    """A round in both documents is kept once if its counts agree, refused otherwise; a
    document of another spec is refused."""
    path = tmp_path / "truth.json"

    def document(seed: int, spec: MechanismSpec, rounds: dict[int, list[list[int]]]) -> Any:
        truth = GroundTruth(d=spec.d)
        for round_, vectors in rounds.items():
            for keys in vectors:
                truth.add(round_, keys, [1] * len(keys))
        return truth.to_dict(spec=spec, seed=seed, model="sensors", round_seconds=1, run={})

    a = document(1, SENSORS, {10: [[0, 1], [2, 3]], 11: [[0, 4]]})
    b = document(1, SENSORS, {11: [[0, 4]], 12: [[5, 1]]})
    merged = merge_documents(path, a, b)
    assert [x["round"] for x in merged["rounds"]] == [10, 11, 12]
    assert merged["overall"]["n"] == 4
    assert merged["overall"]["present"] == [2, 2, 1, 1, 1, 1]
    assert merged["runs"] == [{}, {}]
    clash = document(1, SENSORS, {11: [[0, 4], [2, 3]]})
    with pytest.raises(GroundTruthFileError, match="already holds round 11 with other counts"):
        merge_documents(path, a, clash)
    other = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=2.0)
    with pytest.raises(GroundTruthFileError, match=f"this run has spec {other.fingerprint}"):
        merge_documents(path, a, document(1, other, {12: [[0, 1]]}))
    write_merged(path, a)
    write_merged(path, b)
    assert json.loads(path.read_text()) == merged
    assert read_document(tmp_path / "absent.json") is None


def _auth_broker(tmp_path: Path, secret: bytes, n: int) -> Broker:
    passwords = tmp_path / "passwords"
    from sim.credentials.accounts import device_password  # noqa: PLC0415

    accounts = [(device_id(i), device_password(secret, device_id(i))) for i in range(n)]
    accounts.append(("gateway", "gateway-password"))
    passwords.write_text(mosquitto_password_file(accounts))
    acl = tmp_path / "acl"
    acl.write_text("pattern write coco/v1/+/ingress/%u\n")
    return Broker(
        tmp_path,
        free_port(),
        extra_config=(f"allow_anonymous false\npassword_file {passwords}\nacl_file {acl}\n"),
    )


def test_per_device_credentials_and_refusals_are_counted(tmp_path: Path) -> None:
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    secret = b"deployment-secret"
    n = 30
    broker = _auth_broker(tmp_path, secret, n)
    broker.start()
    try:
        _, summary = capture(config(broker, devices=n, credentials_secret=secret))
        assert summary["reports_published"] == 2 * n
        assert sum(summary["connect_failures"].values()) == 0

        wrong = Fleet(config(broker, devices=n, credentials_secret=b"wrong-secret"))
        summary = run(wrong.run(), 60)
        assert summary["reports_published"] == 0
        refused = summary["connect_failures"]
        assert set(refused) == set(CONNECT_FAILURE_REASONS)
        # Round 2 retries every device: 2n refused attempts, each by the broker's CONNACK.
        assert refused["bad_credentials"] + refused["not_authorized"] == 2 * n
        assert summary["publish_failures"]["not_connected"] == 2 * n
        assert value(
            wrong.registry, "coco_fleet_publish_failures_total", reason="not_connected"
        ) == (2 * n)

        # A shared identity the ACL does not let write ingress: MQTT 5 PUBACK 0x87.
        gateway = Fleet(
            config(
                broker,
                devices=n,
                mode="multiplexed",
                connections=2,
                username="gateway",
                password="gateway-password",
            )
        )
        summary = run(gateway.run(), 60)
        assert summary["reports_published"] == 0
        assert summary["publish_failures"]["not_authorized"] == 2 * n
        assert set(summary["publish_failures"]) == set(PUBLISH_FAILURE_REASONS)
        assert gateway.ground_truth()["overall"]["n"] == 0  # nothing published, nothing counted
    finally:
        broker.stop()


def test_five_thousand_own_connections_in_one_process(tmp_path: Path) -> None:
    """One process, one connection per device (the broker's fd limit raised first)."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    n = 5000  # the fleet's documented floor for one process
    ensure_fd_limit(2 * n + 200)  # inherited by the broker subprocess
    broker = Broker(tmp_path, free_port())
    broker.start()
    try:
        cfg = config(broker, devices=n, rounds=1, model="keyvalue", spec=KEYVALUE)
        fleet = Fleet(cfg)

        async def scenario() -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
            async with subscriber(broker, cfg.deployment) as received:
                summary = await fleet.run()
                await wait_until(lambda: len(received) >= n, 60, progress=lambda: len(received))
            return list(received), summary

        received, summary = run(scenario(), 150)
    finally:
        broker.stop()
    assert summary["connected"] == n
    assert summary["connections"] == n
    assert summary["reports_published"] == n
    assert len({topic for topic, _ in received}) == n


def test_spec_must_match_the_model() -> None:
    with pytest.raises(ValueError, match=r"5\.\.8 channels"):
        FleetModel(name="sensors", spec=KEYVALUE, n_devices=3, seed=0)
    with pytest.raises(ValueError, match="d = features"):
        FleetModel(
            name="keyvalue",
            spec=MechanismSpec(mechanism="coco", d=4, s=4, epsilon=1.0),
            n_devices=3,
            seed=0,
        )


def test_fd_limit_too_low_is_a_clear_error() -> None:
    import resource  # noqa: PLC0415

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit")
    from sim.fleet.run import FleetError  # noqa: PLC0415

    with pytest.raises(FleetError, match="hard limit RLIMIT_NOFILE"):
        ensure_fd_limit(hard + 1)


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def test_cli_reads_the_announcement_and_stops_gracefully_on_sigint(
    mosquitto: Broker, tmp_path: Path
) -> None:
    deployment = "fleet-cli"

    async def announce() -> None:
        payload = encode_announcement(SENSORS.to_dict(), min_batch=10, delta=1e-6, round_seconds=1)
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as client:
            await client.publish(spec_topic(deployment), payload, qos=1, retain=True)

    run(announce(), 20)
    port = free_port()
    truth_path = tmp_path / "truth.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from sim.cli import main; main()",
            "fleet",
            "--deployment",
            deployment,
            "--broker",
            mosquitto.url,
            "--devices",
            "50",
            "--rounds",
            "0",
            "--round-spread",
            "0.2",
            "--seed",
            "9",
            "--json",
            "--ground-truth",
            str(truth_path),
            "--acked-log",
            str(tmp_path / "acked.txt"),
            "--metrics-port",
            str(port),
            "--metrics-host",
            "127.0.0.1",
            "--no-progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        published = 0.0

        def hundred() -> bool:
            nonlocal published
            with contextlib.suppress(OSError):
                published = _metric(port, "coco_fleet_reports_published_total")
            return published >= 100 or proc.poll() is not None

        waiting.wait_until(
            hundred,
            progress=lambda: (published, waiting.cpu_seconds(proc.pid)),
            stall=60,
            what="the fleet publishing",
            interval=0.2,
        )
        assert published >= 100, "the fleet published nothing"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert set(summary) >= {
        "devices",
        "connected",
        "reports_published",
        "publish_failures",
        "connect_failures",
        "connect_rate_per_s",
        "publish_rate_per_s",
        "duration_seconds",
        "seed",
    }
    assert summary["interrupted"] is True
    assert summary["round_seconds"] == 1  # the announced round length
    assert summary["seed"] == 9
    assert summary["devices"] == 50
    assert summary["reports_published"] >= 100
    assert "dev-0000" not in err  # no device id in the logs
    truth = json.loads(truth_path.read_text())
    assert truth["simulation_only"] is True
    assert truth["overall"]["n"] == summary["reports_published"]
    rounds = [x["round"] for x in truth["rounds"]]
    assert rounds == sorted(set(rounds))
    assert rounds[0] == summary["first_round"]
    # --acked-log: one line per acknowledged report, no device id
    acked = [line.split() for line in (tmp_path / "acked.txt").read_text().splitlines()]
    assert len(acked) == summary["reports_published"]
    assert {int(r) for r, _, _ in acked} == set(rounds)
    assert all(0 <= int(z) < SENSORS.t for _, _, z in acked)


def test_cli_errors_are_one_line_without_a_traceback(mosquitto: Broker, tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["fleet", "--broker", mosquitto.url, "--devices", "2", "--no-progress"]
    not_an_object = tmp_path / "spec.json"
    not_an_object.write_text('["coco"]')
    good = tmp_path / "good.json"
    good.write_text(json.dumps(SENSORS.to_dict()))
    whole = tmp_path / "announcement.json"
    whole.write_bytes(
        encode_announcement(SENSORS.to_dict(), min_batch=10, delta=1e-6, round_seconds=30)
    )
    cases = [
        (["--deployment", "cli-err", "--spec", str(not_an_object)], "must hold a JSON object"),
        (
            ["--deployment", "cli-nothing-announced", "--announcement-timeout", "0.5"],
            "no announcement on coco/v1/cli-nothing-announced/spec within 0.5 s",
        ),
        (
            [
                "--deployment",
                "cli-err",
                "--broker",
                f"mqtt://127.0.0.1:{free_port()}",
                "--announcement-timeout",
                "1",
            ],
            "cannot read the spec announcement from",
        ),
        (
            ["--deployment", "cli-err", "--spec", str(good)],
            "holds no round_seconds: give --round-seconds",
        ),
        (
            ["--deployment", "cli-err", "--spec", str(whole), "--round-seconds", "60"],
            "--round-seconds 60 does not match the round_seconds 30",
        ),
        (
            ["--deployment", "cli-err", "--spec", str(good), "--round-seconds", "0"],
            "round_seconds must be an int in [1, 86400]",
        ),
        (
            [
                *("--deployment", "cli-err", "--spec", str(whole)),
                *("--round-offset", "20", "--round-spread", "10"),
            ],
            "round_offset + round_spread must be < round_seconds (30)",
        ),
    ]
    for args, message in cases:
        result = runner.invoke(app, [*base, *args])
        assert result.exit_code == 1, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
        assert message in result.output


def test_a_busy_metrics_port_is_a_one_line_error_naming_the_port_and_option(
    tmp_path: Path,
) -> None:
    """Issue 18: "[Errno 98] Address already in use", without the port or the option."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SENSORS.to_dict()))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            app,
            [
                *("fleet", "--deployment", "busy", "--spec", str(spec_file)),
                *("--round-seconds", "1", "--no-progress"),
                *("--broker", f"mqtt://127.0.0.1:{free_port()}"),  # never reached
                *("--metrics-port", str(port), "--metrics-host", "127.0.0.1"),
            ],
        )
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"error: --metrics-port {port}: cannot serve /metrics on 127.0.0.1:{port}: "
        "Address already in use"
    ]


T0 = 1_764_115_200  # 2025-11-26T00:00:00Z, a multiple of 60


def test_next_round_joins_the_round_in_progress_only_in_its_first_half() -> None:
    r = T0 // 60
    assert next_round(T0, 60, 0.0) == r  # at the boundary
    assert next_round(T0 + 30, 60, 0.0) == r  # up to half-way
    assert next_round(T0 + 30.5, 60, 0.0) == r + 1  # later: the next round
    assert next_round(T0 + 40, 60, 45.0) == r  # before a later offset
    assert next_round(T0 + 46, 60, 45.0) == r + 1
    # After round r was published: the next round, even if r is still in progress...
    assert next_round(T0 + 5, 60, 0.0, after=r) == r + 1
    # ...and a round whose first half has passed is skipped.
    assert next_round(T0 + 60 + 31, 60, 0.0, after=r) == r + 2
    assert next_round(T0 + 60 + 1, 60, 0.0, after=r) == r + 1
    with pytest.raises(ValueError, match="not set"):
        next_round(12.0, 60, 0.0)  # a clock that is not set: ClockError
    # The fleet's default: a first round is never the one in progress (a rerun would repeat it)
    assert next_round(T0 + 1, 60, 0.0, join_current=False) == r + 1
    assert next_round(T0 + 5, 60, 0.0, after=r, join_current=False) == r + 1


def test_round_options_are_checked() -> None:
    base: dict[str, Any] = {
        "broker": "mqtt://127.0.0.1:1",
        "deployment": "d",
        "spec": SENSORS,
        "devices": 1,
    }
    assert FleetConfig(**base, round_seconds=60, round_offset=10, round_spread=49.5)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"round_seconds": 0}, "round_seconds"),
        ({"round_seconds": 86_401}, "round_seconds"),
        ({"round_seconds": 60, "round_offset": -1.0}, "round_offset must be >= 0"),
        ({"round_seconds": 60, "round_spread": float("nan")}, "round_spread must be >= 0"),
        ({"round_seconds": 60, "round_offset": 30, "round_spread": 30}, "must be < round_se"),
        ({"round_seconds": 60, "reconnect_min_delay": 0.0}, "reconnect_min_delay must be > 0"),
        ({"round_seconds": 60, "reconnect_max_delay": 0.5}, "reconnect_max_delay must be >="),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            FleetConfig(**base, **bad)


def test_reconnection_delays_double_up_to_the_cap_with_jitter() -> None:
    rng = random.Random(1)
    for attempt, base in [(0, 1.0), (1, 2.0), (3, 8.0), (4, 16.0), (5, 30.0), (80, 30.0)]:
        delays = [backoff_delay(attempt, 1.0, 30.0, rng) for _ in range(200)]
        assert all(base / 2 <= d <= base for d in delays)
        assert max(delays) - min(delays) > base / 4  # jittered, not one value


def test_each_own_connection_uses_its_device_id_as_client_id(
    mosquitto_client_id_acl: Broker,
) -> None:
    """A broker ACL on the client id (``%c``): every own connection may write its own
    ingress topic; a shared connection's client id is no device's, so it may not."""
    broker, n = mosquitto_client_id_acl, 20
    _, summary = capture(config(broker, devices=n, rounds=1))
    assert summary["reports_published"] == n
    shared = Fleet(config(broker, devices=n, rounds=1, mode="multiplexed", connections=2))
    summary = run(shared.run(), 60)
    assert summary["reports_published"] == 0
    assert summary["publish_failures"]["not_authorized"] == n


def test_cli_fails_when_the_broker_acknowledged_no_report(
    mosquitto_client_id_acl: Broker, tmp_path: Path
) -> None:
    """Every publish refused (shared connections under a client-id ACL): one error line
    naming the failures, and exit status 3 (reports not sent), not a summary that looks
    like success."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SENSORS.to_dict()))
    result = CliRunner().invoke(
        app,
        [
            "fleet",
            "--broker",
            mosquitto_client_id_acl.url,
            "--deployment",
            "fleet-test",
            "--spec",
            str(spec_file),
            "--round-seconds",
            "1",
            "--devices",
            "10",
            "--mode",
            "multiplexed",
            "--connections",
            "2",
            "--no-progress",
            "--json",
        ],
    )
    assert result.exit_code == EXIT_NOT_SENT == 3, result.output
    assert "error: the broker acknowledged no report" in result.output
    assert "not_authorized" in result.output


@pytest.mark.parametrize("option", ["--ground-truth", "--acked-log"])
def test_an_unwritable_output_file_is_refused_before_anything_is_published(
    mosquitto: Broker, tmp_path: Path, option: str
) -> None:
    """Issue 25: --ground-truth in a missing directory published the whole run (the devices'
    budget spent) and failed at the end. Now the output files are checked first: one line,
    exit 1, no summary (nothing was published)."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SENSORS.to_dict()))
    path = tmp_path / "missing" / "out.json"
    result = fleet_cli(mosquitto, spec_file, option, str(path))
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: {option} {path}: the directory {path.parent} does not exist"
    ]
    assert not path.parent.exists()


def test_participation_sampling_sends_the_sampled_devices_and_says_both_truths(
    mosquitto: Broker,
) -> None:
    """q = 0.5: each round carries the reports of exactly the devices an offline replay
    samples, the summary counts the rest as not sampled, and the ground truth of a round is
    the mean over the devices that reported, with the fleet-wide sums beside it."""
    n = 200
    cfg = config(mosquitto, devices=n, participation=0.5)
    seen: list[tuple[str, bytes]] = []
    fleet = Fleet(cfg, on_report=lambda topic, payload: seen.append((topic, payload)))
    summary = run(fleet.run(), 60)
    assert summary["participation"] == 0.5
    assert summary["reports_published"] + summary["reports_sat_out"] == n * cfg.rounds
    assert 0 < summary["reports_sat_out"] < n * cfg.rounds
    doc = fleet.ground_truth()
    assert doc["participation"] == 0.5
    replay = Fleet(cfg)
    for round_, reports in by_round(seen).items():
        assert reports == replayed(cfg, round_)  # the sampled devices, the same reports
        vectors, sampled = replay.round_data(round_)
        (entry,) = [x for x in doc["rounds"] if x["round"] == round_]
        assert entry["n"] == len(reports) == sum(x is not None for x in sampled)
        everyone = GroundTruth(d=SENSORS.d)
        for keys, signs in vectors:
            everyone.add(round_, keys, signs)
        assert entry["fleet"] == everyone.rounds[round_].stats()
        reported = GroundTruth(d=SENSORS.d)
        for x in sampled:
            if x is not None:
                reported.add(round_, x[0], x[1])
        assert {k: v for k, v in entry.items() if k not in ("round", "fleet")} == (
            reported.rounds[round_].stats()
        )


def test_fleet_participation_follows_the_announcement(tmp_path: Path) -> None:
    """The --spec file's announced q is the fleet's; a different --participation is refused
    in one line before anything is sent; a ground-truth file of another q is refused."""
    ann = tmp_path / "announcement.json"
    ann.write_bytes(
        encode_announcement(
            SENSORS.to_dict(), min_batch=10, delta=1e-6, round_seconds=1, participation=0.5
        )
    )
    base = ["fleet", "--deployment", "d", "--broker", f"mqtt://127.0.0.1:{free_port()}"]
    result = CliRunner().invoke(
        app, [*base, "--spec", str(ann), "--participation", "0.3", "--no-progress"]
    )
    assert result.exit_code == 1
    assert "--participation 0.3 does not match the participation 0.5" in result.stderr
    truth = tmp_path / "truth.json"
    truth.write_text(
        json.dumps(
            GroundTruth(d=SENSORS.d).to_dict(spec=SENSORS, seed=3, model="sensors", round_seconds=1)
        )
    )
    refused = CliRunner().invoke(
        app, [*base, "--spec", str(ann), "--seed", "3", "--ground-truth", str(truth)]
    )
    assert refused.exit_code == 1
    assert "participation 1.0, this run has participation 0.5" in refused.stderr
