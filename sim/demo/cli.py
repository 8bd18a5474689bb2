"""``coco demo``: the command (options, the result printed, ``--serve``'s wait for Ctrl-C);
the run is :func:`sim.demo.pipeline.run_pipeline`. :mod:`sim.cli` registers it; this module
imports only typer, so that ``coco --help`` and ``coco demo --help`` stay fast.
"""

from __future__ import annotations

import json
import signal
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

DEMO_DEVICES = 2000
"""``sim.demo.config.DEFAULT_DEVICES``, repeated so that ``coco demo --help`` does not import
the demo (tests/sim/test_cli.py checks that they agree)."""


class DemoMechanism(StrEnum):
    coco = "coco"
    collision = "collision"


def _delta_option(value: float) -> float:
    """The shared ``--delta`` check (:func:`edge.cli_options.delta_option`), imported only
    when the command runs."""
    from edge.cli_options import delta_option  # noqa: PLC0415 (not for --help)

    checked = delta_option(value)
    assert checked is not None
    return checked


def demo(
    devices: Annotated[
        int | None,
        typer.Option(
            help=f"Simulated devices ({DEMO_DEVICES} by default; fewer on the embedded broker)."
        ),
    ] = None,
    rounds: Annotated[int, typer.Option(help="Rounds (one report per device each).")] = 3,
    mechanism: Annotated[DemoMechanism, typer.Option(help="Local randomiser.")] = (
        DemoMechanism.coco
    ),
    epsilon: Annotated[float, typer.Option(help="Local budget of one report.")] = 1.0,
    channels: Annotated[int, typer.Option(help="Sensor channels d (any number from 1).")] = 6,
    s: Annotated[int, typer.Option(help="Channels each report carries.")] = 2,
    min_batch: Annotated[int, typer.Option(help="Smallest batch the shuffler releases.")] = 500,
    delta: Annotated[
        float,
        typer.Option(callback=_delta_option, help="Target delta of the accountant, in (0, 1)."),
    ] = 1e-6,
    seed: Annotated[int, typer.Option(help="Seed of the sensor model and randomisers.")] = 1,
    day_seconds: Annotated[
        int | None,
        typer.Option(
            help="Compress the sensor model's day into this many seconds (each 2-s round "
            "reads its hour of that day; at least 4), so the estimate follows the daily "
            "cycle; default: one hour a round."
        ),
    ] = None,
    participation: Annotated[
        float,
        typer.Option(
            help="Probability q in (0, 1] with which each device reports in a round "
            "(announced; the truth is then over the devices that reported)."
        ),
    ] = 1.0,
    broker: Annotated[
        str | None,
        typer.Option(
            envvar="COCO_BROKER",
            help="Use this broker (mqtt://host:port) instead of a local Mosquitto.",
        ),
    ] = None,
    embedded_broker: Annotated[
        bool,
        typer.Option(
            "--embedded-broker",
            help="Use the embedded amqtt broker (MQTT 3.1.1, small fleets) even when "
            "Mosquitto is installed.",
        ),
    ] = False,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="Serve the aggregator's live page (and /metrics, /estimates) on 127.0.0.1 "
            "during the run, and keep it up afterwards until Ctrl-C.",
        ),
    ] = False,
    port: Annotated[
        int, typer.Option(help="Port of the live page with --serve (0: a free one).")
    ] = 0,
    ground_truth: Annotated[
        Path | None,
        typer.Option(
            help="SIMULATION ONLY: write the per-round ground truth here after every round "
            "(coco fleet's format), served at /truth and drawn on the live page (with "
            "--serve they are, from memory, without it)."
        ),
    ] = None,
) -> None:
    """Run devices -> shuffler -> aggregator on this machine and compare the private
    estimates with the (simulation-only) ground truth."""
    import asyncio  # noqa: PLC0415 (the demo's imports are heavy: not for --help)

    from edge import CocoError  # noqa: PLC0415
    from sim.demo.config import DemoConfig, DemoError, page_url  # noqa: PLC0415
    from sim.demo.pipeline import run_pipeline  # noqa: PLC0415
    from sim.demo.report import format_table  # noqa: PLC0415

    try:
        config = DemoConfig(
            devices=DEMO_DEVICES if devices is None else devices,
            auto_devices=devices is None,
            rounds=rounds,
            mechanism=mechanism.value,
            epsilon=epsilon,
            channels=channels,
            s=s,
            min_batch=min_batch,
            delta=delta,
            seed=seed,
            day_seconds=day_seconds,
            participation=participation,
            broker=broker,
            embedded_broker=embedded_broker,
            timeout=timeout,
            http_port=port if serve else None,
            truth_file=ground_truth,
        )
        run = asyncio.run(run_pipeline(config))
    except (DemoError, CocoError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(run.result, indent=1) if as_json else format_table(run.result))
    server = run.server
    if server is None:
        return
    try:  # the server that served the run serves its final state: the page never went away
        _wait_for_a_stop_signal(
            f"serving the final estimates at {page_url(server.port)} (Ctrl-C to stop)"
        )
    finally:
        server.stop()


def _wait_for_a_stop_signal(announce: str) -> None:
    """Print ``announce`` (on stderr) and sleep until SIGINT (Ctrl-C) or SIGTERM, also where
    the shell started this process with SIGINT ignored (in the background). The handlers are
    in place before the line is printed: a signal sent on reading it stops cleanly."""

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        typer.echo(announce, err=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
