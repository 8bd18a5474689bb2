"""``coco announce`` publishes a retained announcement that the services then read."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

from typer.testing import CliRunner

from edge import MechanismSpec
from edge.announce import decode_announcement
from edge.announcement_reader import fetch_announcement
from sim.cli import app
from tests.conftest import Broker, free_port

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
    assert bad.exit_code == 2  # a usage error, as for every --delta (edge/defaults.py)
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


def _keys(n: int) -> list[str]:
    return [bytes([i + 1]).hex() * 32 for i in range(n)]


def test_a_sharded_announcement_and_a_reshard(mosquitto: Broker) -> None:
    first = _keys(2)
    args = [*ARGS, "--broker", mosquitto.url, "--round-seconds", "60", "--shard-seed", "9"]
    result = runner.invoke(app, [*args, *(a for k in first for a in ("--shard-key", k))])
    assert result.exit_code == 0, result.output
    layouts = json.loads(result.output)["shards"]
    assert layouts == [
        {"count": 2, "from_round": 0, "generation": 0, "keys": first, "seed": 9},
    ]
    assert "batch_public_key" not in json.loads(result.output)
    second = [bytes([i + 10]).hex() * 32 for i in range(3)]
    reshard = [*args, "--reshard", *(a for k in second for a in ("--shard-key", k))]
    result = runner.invoke(app, reshard)
    assert result.exit_code == 0, result.output
    old, new = json.loads(result.output)["shards"]
    assert old == layouts[0]
    now = int(time.time() // 60)
    assert now + 2 <= new["from_round"] <= now + 4  # a few rounds ahead
    assert (new["count"], new["generation"], new["keys"]) == (3, 1, second)
    # resharding again keeps only the newest layout beside the new one
    third = _keys(1)
    result = runner.invoke(
        app,
        [*args, "--reshard", "--shard-key", third[0], "--shards-from-round", str(now + 100)],
    )
    assert result.exit_code == 0, result.output
    kept, newest = json.loads(result.output)["shards"]
    assert kept == new
    assert (newest["generation"], newest["from_round"]) == (2, now + 100)


def test_a_layout_whose_first_round_has_begun_is_refused(mosquitto: Broker) -> None:
    """A reshard (or a first layout) whose --shards-from-round is not ahead of the current
    round would have two layouts serve one round: refused with one line naming the current
    round and a later one, exit 1, and the retained announcement stays as it was."""
    args = [*ARGS, "--broker", mosquitto.url, "--round-seconds", "60"]
    first = runner.invoke(app, [*args, "--shard-key", _keys(1)[0]])
    assert first.exit_code == 0, first.output
    announced = json.loads(first.output)
    key = bytes([20]).hex() * 32
    for late in ("past", "current"):
        now = int(time.time() // 60)
        start = now if late == "current" else now - 1
        for reshard in (["--reshard"], []):
            result = runner.invoke(
                app, [*args, *reshard, "--shard-key", key, "--shards-from-round", str(start)]
            )
            assert result.exit_code == 1, result.output
            errors = [line for line in result.output.splitlines() if line.startswith("error:")]
            assert len(errors) == 1, result.output
            assert f"--shards-from-round {start} is not ahead of the current round" in errors[0]
            assert "or later" in errors[0]
    retained = asyncio.run(fetch_announcement(mosquitto.url, "plant-7", timeout=5.0))
    assert retained["shards"] == announced["shards"]  # nothing published
    # a first layout from round 0 (a deployment sharded from the start) is not "late"
    from_zero = runner.invoke(app, [*args, "--shard-key", key, "--shards-from-round", "0"])
    assert from_zero.exit_code == 0, from_zero.output


def test_shard_options_are_checked(mosquitto: Broker) -> None:
    key = _keys(1)[0]
    both = runner.invoke(app, [*ARGS, "--shard-key", key, "--batch-public-key", key, "--dry-run"])
    assert both.exit_code == 1
    assert "not --batch-public-key" in both.output
    same = runner.invoke(app, [*ARGS, "--shard-key", key, "--shard-key", key, "--dry-run"])
    assert same.exit_code == 1
    assert "own key" in same.output
    nothing_to_reshard = runner.invoke(
        app, [*ARGS, "--broker", mosquitto.url, "--reshard", "--shard-key", key, "--timeout", "1"]
    )
    assert nothing_to_reshard.exit_code == 1
    assert "needs the current announcement (none is retained)" in nothing_to_reshard.output
    unsharded = runner.invoke(app, [*ARGS, "--broker", mosquitto.url])
    assert unsharded.exit_code == 0, unsharded.output
    not_sharded = runner.invoke(
        app, [*ARGS, "--broker", mosquitto.url, "--reshard", "--shard-key", key]
    )
    assert not_sharded.exit_code == 1
    assert "not sharded" in not_sharded.output


def test_an_announcement_the_broker_does_not_retain_is_an_error(tmp_path: Path) -> None:
    """A broker whose ACL silently drops the publish (as a 3.1.1 broker does) acknowledges
    it but never hands it back: nothing was announced, and the command says so."""
    from tests.conftest import MOSQUITTO, free_port  # noqa: PLC0415

    port = free_port()
    acl = tmp_path / "acl"
    acl.write_text("topic read coco/v1/#\n")  # anonymous may read, not write, the spec
    broker = Broker(tmp_path, port, f"acl_file {acl}\n")
    broker.start()
    try:
        result = runner.invoke(
            app, [*ARGS, "--broker", broker.url, "--mqtt-version", "3.1.1", "--timeout", "2"]
        )
    finally:
        broker.stop()
    assert MOSQUITTO
    assert result.exit_code == 1
    assert "nothing was announced" in result.output


def test_announce_takes_a_cluster_s_node_list(mosquitto: Broker) -> None:
    """``--broker`` as the nodes of a cluster, the first one down: the announcement goes to
    the next node, and a reshard reads the current one through the same list."""
    nodes = f"mqtt://127.0.0.1:{free_port()},{mosquitto.url}"
    result = runner.invoke(app, [*ARGS, "--broker", nodes, "--timeout", "5"])
    assert result.exit_code == 0, result.output
    announced = asyncio.run(fetch_announcement(mosquitto.url, "plant-7", timeout=10))
    assert announced["min_batch"] == 100
    args = [*ARGS, "--broker", nodes, "--round-seconds", "60", "--shard-seed", "9"]
    sharded = runner.invoke(app, [*args, "--shard-key", "ab" * 32])
    assert sharded.exit_code == 0, sharded.output
    dead = f"mqtt://127.0.0.1:{free_port()},mqtt://127.0.0.1:{free_port()}"
    refused = runner.invoke(app, [*ARGS, "--broker", dead, "--timeout", "5"])
    assert refused.exit_code == 1
    assert "cannot connect to the broker at" in refused.output
    assert "Traceback" not in refused.output


def test_what_announce_prints_is_accepted_by_every_spec_option(tmp_path: Path) -> None:
    """``coco announce --dry-run > a.json`` then ``--spec a.json``: every command reads the
    file (its ``topic`` key ignored) and goes on to its next check, which names no spec."""
    printed = runner.invoke(app, [*ARGS, "--dry-run"])
    assert printed.exit_code == 0, printed.output
    assert "topic" in json.loads(printed.stdout)
    spec_file = tmp_path / "a.json"
    spec_file.write_text(printed.stdout)
    again = runner.invoke(
        app,
        [*ARGS[:3], "--min-batch", "100", "--delta", "1e-7", "--spec", str(spec_file), "--dry-run"],
    )
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == json.loads(printed.stdout)
    unreachable = ["--broker", f"mqtt://127.0.0.1:{free_port()}", "--deployment", "plant-7"]
    cases = [
        (
            ["fleet", "--devices", "2", "--no-progress", "--round-seconds", "61"],
            f"--round-seconds 61 does not match the round_seconds 60 of the spec file {spec_file}",
        ),
        (
            [
                *("device", "--device-id", "d1", "--lo", "0", "--hi", "1", "--budget", "5"),
                *("--ledger", str(tmp_path / "missing" / "ledger.json")),
            ],
            "privacy ledger",
        ),
        (["shuffler"], "--round-seconds is required with --spec"),
        (["aggregator", "run"], "--delta is required with --spec"),
    ]
    for args, message in cases:
        result = runner.invoke(app, [*args, *unreachable, "--spec", str(spec_file)])
        assert result.exit_code == 1, result.output
        assert message in result.stderr, (args, result.stderr)
        assert "announcement must have the keys" not in result.stderr


def test_participation_and_the_period_policy() -> None:
    """--participation below 1 and --budget-per-period/--period are announced; without them
    the announcement is the bytes it always was; out-of-range values are one-line errors."""
    plain = json.loads(runner.invoke(app, [*ARGS, "--dry-run"]).output)
    assert "participation" not in plain
    assert "period_seconds" not in plain
    one = json.loads(runner.invoke(app, [*ARGS, "--participation", "1", "--dry-run"]).output)
    assert one == plain
    result = runner.invoke(
        app,
        [*ARGS, "--participation", "0.25", "--budget-per-period", "24", "--period", "1d",
         "--dry-run"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["participation"], doc["period_seconds"], doc["budget_per_period"]) == (
        0.25,
        86_400,
        24.0,
    )
    decoded = decode_announcement(
        json.dumps({k: v for k, v in doc.items() if k != "topic"}).encode()
    )
    assert decoded["period_seconds"] == 86_400
    default = json.loads(
        runner.invoke(app, [*ARGS, "--budget-per-period", "2", "--dry-run"]).output
    )
    assert default["period_seconds"] == 86_400  # --period defaults to 1d
    for extra, word in (
        (["--participation", "0"], "participation"),
        (["--participation", "1.5"], "participation"),
        (["--budget-per-period", "0.5"], "below one report"),  # epsilon 1
        (["--budget-per-period", "2", "--period", "90s"], "multiple of round_seconds"),
        (["--period", "1d"], "give both"),
        (["--budget-per-period", "2", "--period", "1w"], "a period is"),
    ):
        bad = runner.invoke(app, [*ARGS, *extra, "--dry-run"])
        assert bad.exit_code == 1, (extra, bad.output)
        assert bad.output.startswith("error:")
        assert word in bad.output
