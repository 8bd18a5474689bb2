"""The defaults every command shares (edge/defaults.py): one range of delta, one metrics
address, one port per service, one round length, whichever command is asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer

from edge import MechanismSpec, defaults
from edge.cli_options import delta_option
from sim.cli import app
from sim.demo import config as demo_config
from tests.processes import coco
from tests.sim.test_cli_help import command_paths, squashed


def command(path: tuple[str, ...]) -> Any:
    cmd: Any = typer.main.get_command(app)
    for name in path:
        cmd = cmd.get_command(typer.Context(cmd), name)
    return cmd


def params_named(name: str) -> dict[tuple[str, ...], Any]:
    """Command path -> its parameter ``name``, over the whole ``coco`` tree."""
    found = {}
    for path in command_paths():
        for param in command(path).params:
            if param.name == name:
                found[path] = param
    return found


DELTA_COMMANDS = {
    ("privacy",),
    ("privacy", "calibrate"),
    ("announce",),
    ("aggregator", "run"),
    ("demo",),
}


def test_every_delta_option_is_checked_by_the_shared_range() -> None:
    """Each ``--delta`` of the tree refuses 1 (and 0, NaN) and takes 0.5 through its own
    callback, with the one message of edge/defaults.py."""
    found = params_named("delta")
    assert set(found) == DELTA_COMMANDS  # a new --delta joins this list and this check
    for path, param in found.items():
        ctx = typer.Context(command(path))
        assert param.callback(ctx, param, 0.5) == 0.5, path
        for bad in (1.0, 0.0, float("nan"), 2.0):
            with pytest.raises(typer.BadParameter, match=r"delta must be in \(0, 1\)"):
                param.callback(ctx, param, bad)
    assert delta_option(None) is None  # an optional --delta left out


def _spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(MechanismSpec(mechanism="coco", d=4, s=1, epsilon=1.0).to_dict()))
    return path


def test_every_command_refuses_delta_1_the_same_way(tmp_path: Path) -> None:
    """The real command line: each command stops on ``--delta 1`` before any work (no
    broker is started or asked), exit status 2, with the same line."""
    spec = str(_spec_file(tmp_path))
    lines = {
        "privacy": ["privacy", "--mechanism", "generic", "--epsilon", "1", "--n", "1000"],
        "calibrate": [
            *("privacy", "calibrate", "--mechanism", "coco", "--d", "8", "--s", "2"),
            *("--n", "1000", "--rounds", "24", "--epsilon-total", "1"),
        ],
        "announce": [
            *("announce", "--deployment", "x", "--spec", spec, "--min-batch", "2"),
            "--dry-run",
        ],
        "aggregator": ["aggregator", "run", "--deployment", "x", "--spec", spec],
        "demo": ["demo", "--rounds", "1"],
    }
    for name, args in lines.items():
        done = coco(*args, "--delta", "1")
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        # one message (in click's error box, wrapped at the terminal's width; the
        # aggregator's names its variable too: "for '--delta' / 'COCO_DELTA'")
        error = squashed(done.stderr)
        assert "Invalidvaluefor'--delta'" in error, name
        assert "deltamustbein(0,1),got1.0" in error, name
        assert done.stdout == "", name  # nothing started: the demo names its broker first
    # 0.5 is taken: the two commands that need no broker run to the end with it
    privacy = coco(*lines["privacy"], "--delta", "0.5", "--json")
    assert privacy.returncode == 0, privacy.stderr
    assert json.loads(privacy.stdout)["delta"] == 0.5
    announce = coco(*lines["announce"], "--delta", "0.5")
    assert announce.returncode == 0, announce.stderr
    announced = json.loads(announce.stdout)
    assert announced["delta"] == 0.5
    assert announced["round_seconds"] == defaults.DEFAULT_ROUND_SECONDS == 60


def test_every_service_listens_on_the_loopback_by_default() -> None:
    found = params_named("metrics_host")
    assert set(found) == {("shuffler",), ("fleet",), ("aggregator", "run")}
    for path, param in found.items():
        assert param.default == defaults.DEFAULT_METRICS_HOST == "127.0.0.1", path
        assert param.envvar == "COCO_METRICS_HOST", path
    assert demo_config.HTTP_HOST == defaults.DEFAULT_METRICS_HOST  # coco demo --serve


def test_each_service_documents_its_one_metrics_port() -> None:
    ports = params_named("metrics_port")
    assert ports[("aggregator", "run")].default == defaults.AGGREGATOR_METRICS_PORT == 9108
    for path, port in ((("shuffler",), 9109), (("fleet",), 9110)):
        assert ports[path].default is None  # served only when asked for
        assert f"use {port};" in ports[path].help, path
    assert (defaults.SHUFFLER_METRICS_PORT, defaults.FLEET_METRICS_PORT) == (9109, 9110)


def test_only_announce_has_a_round_length_of_its_own() -> None:
    """The shuffler, the fleet and the aggregator take the announced length; announce's
    default is the shared one."""
    found = params_named("round_seconds")
    assert found[("announce",)].default == defaults.DEFAULT_ROUND_SECONDS
    for path, param in found.items():
        if path != ("announce",):
            assert param.default is None, path
