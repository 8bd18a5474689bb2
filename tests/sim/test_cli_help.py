"""Every ``coco`` help as an operator reads it: the real command line in a subprocess at 80
columns, nothing cut, no shell-completion options, and ``coco --version``."""

from __future__ import annotations

import os
from importlib.metadata import version
from typing import Any

import typer

from sim.cli import app
from tests.processes import coco


def command_paths() -> list[tuple[str, ...]]:
    """Every command and group of the ``coco`` tree, the root ``()`` included."""
    paths: list[tuple[str, ...]] = []

    def walk(command: Any, path: tuple[str, ...]) -> None:
        paths.append(path)
        if hasattr(command, "list_commands"):
            ctx = typer.Context(command)
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), (*path, name))

    walk(typer.main.get_command(app), ())
    return paths


def help_at(width: int, *command: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in {"TERMINAL_WIDTH", "LINES"}}
    done = coco(*command, "--help", env=env | {"COLUMNS": str(width)}, timeout=60)
    assert done.returncode == 0, (command, done.stderr)
    return done.stdout


def squashed(text: str) -> str:
    """The help without its box and white space: a folded word reads whole again."""
    return "".join(text.replace("│", "").split())


def test_version_is_the_package_metadata() -> None:
    done = coco("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"coco {version('coco-fleet')}\n"
    assert done.stderr == ""


def test_every_help_at_80_columns_cuts_nothing_and_offers_no_completion() -> None:
    paths = command_paths()
    assert {("shuffler",), ("aggregator", "run"), ("aggregator", "rejected", "replay")} <= set(
        paths
    )
    for path in paths:
        text = help_at(80, *path)
        assert "…" not in text, (path, text)
        assert max(len(line) for line in text.splitlines()) <= 80, path
        assert "completion" not in text, path


def test_long_defaults_and_variables_read_whole_at_80_columns() -> None:
    """The words typer cut at 80 columns (the issue's ``mqtt://127.0.0.1:1…``) are folded
    onto the next line instead; at 200 columns they stand on one line."""
    shuffler = help_at(80, "shuffler")
    assert "mqtt://127.0.0.1:1883]" not in shuffler  # too wide for its column: folded
    assert "[default:mqtt://127.0.0.1:1883]" in squashed(shuffler)
    aggregator = squashed(help_at(80, "aggregator", "run"))
    for whole in ("[envvar:COCO_CHECKPOINT_INTERVAL]", "[envvar:COCO_MQTT_PASSWORD_FILE]"):
        assert whole in aggregator
    assert "[default: mqtt://127.0.0.1:1883]" in help_at(200, "shuffler")
