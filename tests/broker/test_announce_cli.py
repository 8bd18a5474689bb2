"""``coco announce`` publishes a retained announcement that the services then read."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from edge import MechanismSpec
from edge.announce import decode_announcement
from sim.cli import app
from tests.conftest import Broker

runner = CliRunner()
ARGS = [
    "announce",
    "--deployment",
    "plant-7",
    "--mechanism",
    "coco",
    "--d",
    "16",
    "--s",
    "2",
    "--epsilon",
    "1",
    "--min-batch",
    "100",
    "--delta",
    "1e-7",
]


def test_announcement_is_retained_on_the_spec_topic(mosquitto: Broker) -> None:
    result = runner.invoke(app, [*ARGS, "--broker", mosquitto.url])
    assert result.exit_code == 0, result.output
    # A subscriber that connects afterwards still gets it: it is retained.
    got = subprocess.run(
        [
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            str(mosquitto.port),
            "-t",
            "coco/v1/plant-7/spec",
            "-C",
            "1",
            "-W",
            "5",
        ],
        capture_output=True,
        check=True,
        timeout=20,
    ).stdout.rstrip(b"\n")
    announced = decode_announcement(got)
    spec = MechanismSpec(mechanism="coco", d=16, s=2, epsilon=1.0)
    assert announced["spec"] == spec.to_dict()
    assert announced["min_batch"] == 100
    assert announced["delta"] == 1e-7


def test_round_length_and_batch_key_from_hex_or_file(tmp_path: Path) -> None:
    key = "ab" * 32
    pub = tmp_path / "signing.pub"
    pub.write_text(key + "\n")
    for given in (key, str(pub)):
        result = runner.invoke(
            app, [*ARGS, "--round-seconds", "30", "--batch-public-key", given, "--dry-run"]
        )
        assert result.exit_code == 0, result.output
        announced = json.loads(result.output)
        assert announced["round_seconds"] == 30
        assert announced["batch_public_key"] == key
    bad = runner.invoke(app, [*ARGS, "--batch-public-key", str(tmp_path / "none"), "--dry-run"])
    assert bad.exit_code == 1
    assert "none" in bad.output
    bad = runner.invoke(app, [*ARGS, "--round-seconds", "0", "--dry-run"])
    assert bad.exit_code == 1
    assert "round_seconds" in bad.output


def test_dry_run_and_errors() -> None:
    result = runner.invoke(app, [*ARGS, "--dry-run"])
    assert result.exit_code == 0
    assert '"topic": "coco/v1/plant-7/spec"' in result.output
    bad = runner.invoke(app, [*ARGS[:-2], "--delta", "2", "--dry-run"])
    assert bad.exit_code == 1
    assert "delta" in bad.output
    bad = runner.invoke(app, [*ARGS, "--broker", "mqtt://127.0.0.1:1", "--timeout", "2"])
    assert bad.exit_code == 1
    assert bad.output.startswith("error:")


def test_services_without_an_announcement_say_so_in_one_line(mosquitto: Broker) -> None:
    """No retained spec yet: a one-line error naming the topic, not an empty message."""
    result = CliRunner().invoke(
        app,
        [
            "shuffler",
            "--deployment",
            "never-announced",
            "--broker",
            mosquitto.url,
            "--announcement-timeout",
            "0.3",
        ],
    )
    assert result.exit_code == 1
    assert "no announcement on coco/v1/never-announced/spec within 0.3 s" in result.output


def test_announce_takes_the_spec_of_coco_privacy_calibrate(tmp_path: Path) -> None:
    """``coco privacy calibrate --spec-out FILE`` then ``coco announce --spec FILE``."""
    spec_file = tmp_path / "plan-spec.json"
    plan = runner.invoke(
        app,
        [
            "privacy",
            "calibrate",
            "--mechanism",
            "coco",
            "--d",
            "16",
            "--s",
            "2",
            "--n",
            "10000",
            "--rounds",
            "24",
            "--epsilon-total",
            "2",
            "--delta",
            "1e-7",
            "--spec-out",
            str(spec_file),
        ],
    )
    assert plan.exit_code == 0, plan.output
    base = ["announce", "--deployment", "plant-7", "--min-batch", "100", "--delta", "1e-7"]
    result = runner.invoke(app, [*base, "--spec", str(spec_file), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["spec"] == json.loads(spec_file.read_text())
    both = runner.invoke(app, [*base, "--spec", str(spec_file), "--d", "16", "--dry-run"])
    assert both.exit_code == 1
    assert "not both" in both.output
    neither = runner.invoke(app, [*base, "--mechanism", "coco", "--dry-run"])
    assert neither.exit_code == 1
    assert "missing --d, --s, --epsilon" in neither.output
