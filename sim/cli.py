"""The ``coco`` command line: one entry point composed from the components' commands.

The components' commands are imported only when one of them runs (or shows its own
``--help``): :data:`LAZY_COMMANDS` names each one's module and its one-line help, which
``coco --help`` lists without importing numpy, scipy or an MQTT client. Two commands are
registered as they are, their modules importing only typer: ``coco simulate`` (here) and
``coco demo`` (:mod:`sim.demo.cli`).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from sim import cli_help
from sim.demo.cli import demo

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
        "sim.credentials.cli",
        "credentials",
        "Derive the MQTT credentials of a deployment from its secret and write the broker's "
        "dynamic-security configuration and/or password file (Mosquitto 2, PBKDF2-SHA512) "
        "and the services' password files; and/or the shuffler's batch key (no secret "
        "needed).",
    ),
    "fleet": (
        "sim.fleet.cli",
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
        holder = typer.Typer(add_completion=False)
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


cli_help.install()  # every help folds what does not fit, at any width

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


def _print_version(value: bool) -> None:
    """``coco --version``: the installed package's version, then exit 0."""
    if value:
        from importlib.metadata import version  # noqa: PLC0415

        typer.echo(f"coco {version('coco-fleet')}")
        raise typer.Exit


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
    _version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version."
        ),
    ] = False,
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
        f"  {'channel':<{w}} {'unit':<{u}} {'coverage':>9} {'95% half-width':>14} {'RMS error':>10}"
    )
    import numpy as np  # noqa: PLC0415 (not for --help)

    rms = np.sqrt(np.mean((result.estimate - result.truth) ** 2, axis=0))
    half = result.ci95_halfwidth.mean(axis=0)
    for j, (name, unit) in enumerate(zip(result.channels, result.units, strict=True)):
        typer.echo(
            f"  {name:<{w}} {unit:<{u}} {result.coverage[j]:>9.3f} {half[j]:>14.4g} {rms[j]:>10.4g}"
        )


app.command("demo")(demo)  # after `simulate`: `coco --help` lists them in this order


def main() -> None:
    app()
