"""The ``coco`` command line: one entry point composed from the components' commands.

The components' commands are imported only when one of them runs (or shows its own
``--help``): :data:`LAZY_COMMANDS` names each one's module and its one-line help, which
``coco --help`` lists without importing numpy, scipy or an MQTT client.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import time
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    from sim.simulate import SensorSimulationResult

LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    # name: (module, attribute: a command function or a typer.Typer, help in `coco --help`)
    "privacy": (
        "aggregator.ledger.privacy_cli",
        "privacy_app",
        "Central privacy of shuffled batches (certified bounds); `calibrate` plans epsilon0.",
    ),
    "shuffler": (
        "broker.service.cli",
        "shuffler",
        "Shuffle each round's ingress reports into signed batches of at least --min-batch.",
    ),
    "device": (
        "edge.device_cli",
        "device",
        "Publish one eps-LDP report per CSV row of sensor readings, in the current wall-clock "
        "round, after charging the device's privacy-budget ledger.",
    ),
    "announce": (
        "broker.service.announce_cli",
        "announce",
        "Publish the retained spec announcement of a deployment (or print it).",
    ),
    "credentials": (
        "sim.credentials_cli",
        "credentials",
        "Derive the MQTT credentials of a deployment from its secret and write the broker's "
        "dynamic-security configuration and/or password file (Mosquitto 2, PBKDF2-SHA512) "
        "and the services' password files; and/or the shuffler's batch key (no secret "
        "needed).",
    ),
    "fleet": (
        "sim.fleet_cli",
        "fleet",
        "Simulate a fleet of devices publishing privatised reports (simulation only: no "
        "budget ledger; a real device runs `coco device`).",
    ),
    "aggregator": ("aggregator.service.cli", "aggregator_app", "The streaming aggregator service."),
    "experiment": (
        "sim.experiments.cli",
        "experiment_app",
        "Reproduce the paper's experiments: CSV and PNG per figure (docs/results.md).",
    ),
}
"""The help texts are the commands' own (tests/sim/test_cli.py checks that they agree)."""


def load_command(name: str) -> Any:
    """Import the command ``name`` of :data:`LAZY_COMMANDS` and build it."""
    module, attribute, _ = LAZY_COMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    if not isinstance(target, typer.Typer):
        holder = typer.Typer()
        holder.command(name)(target)
        target = holder
    command = typer.main.get_command(target)
    command.name = name
    return command


class _LazyGroup(TyperGroup):
    """Loads a command of :data:`LAZY_COMMANDS` when it is resolved; while its own help is
    formatted, lists them from their help texts instead."""

    _listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        eager = [n for n in super().list_commands(ctx) if n not in LAZY_COMMANDS]
        groups = [n for n, (_, attr, _) in LAZY_COMMANDS.items() if attr.endswith("_app")]
        commands = [n for n in LAZY_COMMANDS if n not in groups]
        return [*commands, *eager, *groups]  # typer's order: commands, then groups

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in self.commands or cmd_name not in LAZY_COMMANDS:
            return super().get_command(ctx, cmd_name)
        if self._listing:
            return TyperCommand(name=cmd_name, help=LAZY_COMMANDS[cmd_name][2])
        command = self.commands[cmd_name] = load_command(cmd_name)
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="coco",
    cls=_LazyGroup,
    help="coco-fleet: privacy-preserving telemetry for IoT fleets (CoCo/Collision + shuffling).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
"""The values of ``--log-level`` / ``COCO_LOG_LEVEL`` (any case); anything else is a
one-line error (exit status 2, as for any other bad option)."""

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
            help=f"Logging level: {', '.join(LOG_LEVELS)} (default: info for services, "
            "else warning).",
        ),
    ] = None,
) -> None:
    from edge.cli_options import apply_deprecated_env  # noqa: PLC0415 (edge imports numpy)

    for warning in apply_deprecated_env(os.environ):
        typer.echo(warning, err=True)
    if log_level is None:
        log_level = "info" if ctx.invoked_subcommand in _SERVICES else "warning"
    level = log_level.strip().lower()
    if level not in LOG_LEVELS:
        typer.echo(
            f"error: unknown log level {log_level!r} (--log-level or COCO_LOG_LEVEL): "
            f"use one of {', '.join(LOG_LEVELS)}",
            err=True,
        )
        raise typer.Exit(2)
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


DEMO_DEVICES = 2000
"""``sim.demo.DEFAULT_DEVICES``, repeated so that ``coco demo --help`` does not import the
demo (tests/sim/test_cli.py checks that they agree)."""


class SimMechanism(StrEnum):
    coco = "coco"
    collision = "collision"


class SimModel(StrEnum):
    sparse = "sparse"
    sensors = "sensors"


@app.command("simulate")
def simulate(
    mechanism: Annotated[SimMechanism, typer.Option(help="Local randomiser.")],
    d: Annotated[int, typer.Option(help="Dimension (sensors: channels, any number from 1).")],
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
    from edge import CocoError, MechanismSpec  # noqa: PLC0415 (numpy: not for --help)
    from sim.simulate import simulate as run_simulation  # noqa: PLC0415
    from sim.simulate import simulate_sensors  # noqa: PLC0415

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
    w = max(12, *(len(name) for name in result.channels))
    u = max(6, *(len(unit) for unit in result.units))
    typer.echo(
        f"  {'channel':<{w}} {'unit':<{u}} {'coverage':>9} {'mean +- (95%)':>14} {'RMS error':>10}"
    )
    import numpy as np  # noqa: PLC0415 (not for --help)

    rms = np.sqrt(np.mean((result.estimate - result.truth) ** 2, axis=0))
    half = result.ci95_halfwidth.mean(axis=0)
    for j, (name, unit) in enumerate(zip(result.channels, result.units, strict=True)):
        typer.echo(
            f"  {name:<{w}} {unit:<{u}} {result.coverage[j]:>9.3f} {half[j]:>14.4g} {rms[j]:>10.4g}"
        )


@app.command("demo")
def demo(
    devices: Annotated[
        int | None,
        typer.Option(
            help=f"Simulated devices ({DEMO_DEVICES} by default; fewer on the embedded broker)."
        ),
    ] = None,
    rounds: Annotated[int, typer.Option(help="Rounds (one report per device each).")] = 3,
    mechanism: Annotated[SimMechanism, typer.Option(help="Local randomiser.")] = (
        SimMechanism.coco
    ),
    epsilon: Annotated[float, typer.Option(help="Local budget of one report.")] = 1.0,
    channels: Annotated[int, typer.Option(help="Sensor channels d (any number from 1).")] = 6,
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
    import asyncio  # noqa: PLC0415 (the demo's imports are heavy: not for --help)

    from edge import CocoError  # noqa: PLC0415
    from sim.demo import (  # noqa: PLC0415
        DemoConfig,
        DemoError,
        format_table,
        page_url,
        run_pipeline,
    )

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


def main() -> None:
    app()
