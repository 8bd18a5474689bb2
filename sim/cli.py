"""The ``coco`` command line: one entry point composed from the components' commands."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from enum import StrEnum
from typing import Annotated

import numpy as np
import typer

from aggregator.cli import aggregator_app, privacy_app
from broker.announce_cli import announce
from broker.cli import shuffler
from edge import CocoError, MechanismSpec
from edge.cli_options import apply_deprecated_env
from edge.device_cli import device
from sim.credentials_cli import credentials
from sim.demo import (
    DEFAULT_DEVICES,
    DemoConfig,
    DemoError,
    format_table,
    page_url,
    run_pipeline,
    serve_final_state,
)
from sim.experiments.cli import experiment_app
from sim.fleet_cli import fleet
from sim.simulate import SensorSimulationResult, simulate_sensors
from sim.simulate import simulate as run_simulation

app = typer.Typer(
    name="coco",
    help="coco-fleet: privacy-preserving telemetry for IoT fleets (CoCo/Collision + shuffling).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(privacy_app, name="privacy")
app.add_typer(aggregator_app, name="aggregator")
app.command("shuffler")(shuffler)
app.command("device")(device)
app.command("announce")(announce)
app.command("credentials")(credentials)
app.add_typer(experiment_app, name="experiment")
app.command("fleet")(fleet)


_SERVICES = frozenset({"shuffler", "aggregator"})
"""Commands that run a service: their lifecycle (connected, subscribed, released, stopped)
is logged at INFO by default; every other command logs warnings only."""


@app.callback()
def _root(
    ctx: typer.Context,
    log_level: Annotated[
        str | None,
        typer.Option(
            envvar="COCO_LOG_LEVEL",
            help="Logging level (debug, info, ...; default: info for services, else warning).",
        ),
    ] = None,
) -> None:
    for warning in apply_deprecated_env(os.environ):
        typer.echo(warning, err=True)
    if log_level is None:
        log_level = "info" if ctx.invoked_subcommand in _SERVICES else "warning"
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


class SimMechanism(StrEnum):
    coco = "coco"
    collision = "collision"


class SimModel(StrEnum):
    sparse = "sparse"
    sensors = "sensors"


@app.command("simulate")
def simulate(
    mechanism: Annotated[SimMechanism, typer.Option(help="Local randomiser.")],
    d: Annotated[int, typer.Option(help="Dimension (sensors: channels, 5..8).")],
    s: Annotated[int, typer.Option(help="Non-zeros per vector.")],
    epsilon: Annotated[float, typer.Option(help="Local budget of one report.")],
    n: Annotated[int, typer.Option(help="Reports per trial.")],
    seed: Annotated[int, typer.Option(help="Seed of the whole run.")],
    t: Annotated[
        int | None, typer.Option(help="Output domain size (default: MSE-optimal).")
    ] = None,
    trials: Annotated[int, typer.Option(help="Independent repetitions.")] = 1,
    model: Annotated[
        SimModel,
        typer.Option(
            help="sparse: random s-sparse ternary vectors; sensors: real-valued readings of a "
            "simulated sensor fleet through the sensor encoder, with 95% intervals."
        ),
    ] = SimModel.sparse,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Simulate reports (no MQTT), randomise them and estimate.

    --model sparse: random s-sparse ternary vectors; the error beside its closed form.

    --model sensors: trial k reads hour k mod 24 of a fleet of n devices; coverage of its means.

    --json with sensors: per trial and channel the estimate, ci95_halfwidth and truth.
    """
    try:
        spec = MechanismSpec(mechanism=mechanism.value, d=d, s=s, epsilon=epsilon, t=t)  # type: ignore[arg-type]
        if model is SimModel.sensors:
            sensors = simulate_sensors(spec, n=n, seed=seed, trials=trials)
        else:
            result = run_simulation(spec, n=n, seed=seed, trials=trials)
    except (CocoError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if model is SimModel.sensors:
        _print_sensors(sensors, as_json=as_json)
        return
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    typer.echo(
        f"{spec.mechanism} d={d} s={s} epsilon={epsilon:g} t={spec.t}: {n} reports x {trials} "
        f"trial(s) in {result.elapsed_seconds:.2f} s"
    )
    typer.echo(
        f"  mean MSE (sum over dims) {result.mse_mean:.6g}  theory {result.mse_mean_theory:.6g}"
    )
    typer.echo(
        f"  freq MSE (sum over dims) {result.mse_freq:.6g}  theory {result.mse_freq_theory:.6g}"
    )
    typer.echo(f"  max |error| of a mean    {result.max_abs_error_mean:.6g}")


def _print_sensors(result: SensorSimulationResult, *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    typer.echo(
        f"{result.mechanism} sensors d={result.d} s={result.s} epsilon={result.epsilon:g} "
        f"t={result.t}: {result.n} devices x {result.trials} trial(s) in "
        f"{result.elapsed_seconds:.2f} s"
    )
    typer.echo(
        f"  {'channel':<12} {'unit':<6} {'coverage':>9} {'mean +- (95%)':>14} {'RMS error':>10}"
    )
    rms = np.sqrt(np.mean((result.estimate - result.truth) ** 2, axis=0))
    half = result.ci95_halfwidth.mean(axis=0)
    for j, (name, unit) in enumerate(zip(result.channels, result.units, strict=True)):
        typer.echo(
            f"  {name:<12} {unit:<6} {result.coverage[j]:>9.3f} {half[j]:>14.4g} {rms[j]:>10.4g}"
        )


@app.command("demo")
def demo(
    devices: Annotated[
        int | None,
        typer.Option(
            help=f"Simulated devices ({DEFAULT_DEVICES} by default; fewer on the embedded broker)."
        ),
    ] = None,
    rounds: Annotated[int, typer.Option(help="Rounds (one report per device each).")] = 3,
    mechanism: Annotated[SimMechanism, typer.Option(help="Local randomiser.")] = (
        SimMechanism.coco
    ),
    epsilon: Annotated[float, typer.Option(help="Local budget of one report.")] = 1.0,
    channels: Annotated[int, typer.Option(help="Sensor channels d (5..8).")] = 6,
    s: Annotated[int, typer.Option(help="Channels each report carries.")] = 2,
    min_batch: Annotated[int, typer.Option(help="Smallest batch the shuffler releases.")] = 500,
    delta: Annotated[float, typer.Option(help="Target delta of the accountant.")] = 1e-6,
    seed: Annotated[int, typer.Option(help="Seed of the sensor model and randomisers.")] = 1,
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
) -> None:
    """Run devices -> shuffler -> aggregator on this machine and compare the private
    estimates with the (simulation-only) ground truth."""
    try:
        config = DemoConfig(
            devices=DEFAULT_DEVICES if devices is None else devices,
            auto_devices=devices is None,
            rounds=rounds,
            mechanism=mechanism.value,
            epsilon=epsilon,
            channels=channels,
            s=s,
            min_batch=min_batch,
            delta=delta,
            seed=seed,
            broker=broker,
            embedded_broker=embedded_broker,
            timeout=timeout,
            http_port=port if serve else None,
        )
        run = asyncio.run(run_pipeline(config))
    except (DemoError, CocoError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(run.result, indent=1) if as_json else format_table(run.result))
    if not serve:
        return
    try:
        server = serve_final_state(run)
    except OSError as exc:
        typer.echo(f"error: cannot serve the live page on 127.0.0.1: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"serving the final estimates at {page_url(server.port)} (Ctrl-C to stop)", err=True)
    _wait_for_a_stop_signal()
    server.stop()


def _wait_for_a_stop_signal() -> None:
    """Sleep until SIGINT (Ctrl-C) or SIGTERM, also where the shell started this process
    with SIGINT ignored (in the background)."""

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main() -> None:
    app()
