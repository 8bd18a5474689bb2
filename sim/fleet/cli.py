"""``coco fleet``: the command (options, signals, progress, summary); the work is
:class:`sim.fleet.run.Fleet`."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import signal
import sys
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TextIO

import typer

from edge import CocoError, MechanismSpec
from edge.announce import (
    AnnouncedPeriod,
    participation_of,
    period_of,
    read_spec_or_announcement,
    shard_plan,
)
from edge.cli_options import (
    DEFAULT_BROKER,
    DEFAULT_MQTT_VERSION,
    BrokerOption,
    DeploymentOption,
    MetricsHostOption,
    MqttVersionOption,
    SpecFileOption,
    check_output_file,
)
from edge.defaults import DEFAULT_METRICS_HOST, FLEET_METRICS_PORT
from edge.mqtt_version import MqttVersion, check_mqtt_version
from edge.participation import check_participation
from sim.credentials.accounts import DEFAULT_PREFIX, device_id, device_password, read_secret
from sim.fleet.metrics import DEFAULT_METRICS_DIMS
from sim.models.day import DAY_SECONDS

if TYPE_CHECKING:  # imported when the command runs, not for --help (gmqtt, numpy)
    from prometheus_client import CollectorRegistry

    from edge.shards import ShardPlan
    from sim.fleet.run import Fleet, FleetConfig

logger = logging.getLogger(__name__)


class FleetMode(StrEnum):
    connections = "connections"
    multiplexed = "multiplexed"


class FleetModelName(StrEnum):
    sensors = "sensors"
    keyvalue = "keyvalue"


EXIT_ERROR = 1
"""The fleet could not run (options, spec, announcement, a file): one ``error:`` line."""
EXIT_NOT_SENT = 3
"""The run ended, but reports were not sent: the summary and one ``error:`` line say how
many, and why."""


def progress_line(fleet: Fleet, rate: float) -> str:
    """One progress line (no device ids): devices connected now, and reconnecting."""
    cfg = fleet.config
    failures = sum(fleet.publish_failures.values())
    refused = sum(fleet.connect_failures.values())
    rounds = f"{fleet.stats.rounds_completed}/{cfg.rounds or 'inf'}"
    reconnecting = fleet.reconnecting
    return (
        f"connected {fleet.connected}/{cfg.devices}"
        + (f" ({reconnecting} reconnecting)" if reconnecting else "")
        + f"  rounds {rounds}  published {fleet.published}  not sent {failures}  "
        f"connect failures {refused}  {rate:,.0f} reports/s"
    )


async def _progress(fleet: Fleet, enabled: bool) -> None:
    tty = sys.stderr.isatty()
    last_t, last_n = time.monotonic(), 0
    while True:
        await asyncio.sleep(1.0)
        now = time.monotonic()
        rate = (fleet.published - last_n) / (now - last_t)
        last_t, last_n = now, fleet.published
        fleet.metrics.set_truth(fleet.truth)  # running ground truth for a scraper
        if enabled:
            line = progress_line(fleet, rate)
            sys.stderr.write(f"\r\x1b[2K{line}" if tty else f"{line}\n")
            sys.stderr.flush()


async def _serve(fleet: Fleet, *, hold: bool, progress: bool) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    released = asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            fleet.stop()
            released.set()
        else:  # a second signal forces exit
            raise SystemExit(1)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    ticker = asyncio.create_task(_progress(fleet, progress), name="fleet-progress")
    try:
        summary = await fleet.run()
        if hold and not released.is_set():
            if progress:
                sys.stderr.write("\nrounds done; serving metrics until interrupted\n")
            await released.wait()
    finally:
        ticker.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if progress and sys.stderr.isatty():
        sys.stderr.write("\n")
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The summary for people."""

    def rate(value: float | None) -> str:
        return "n/a" if value is None else f"{value:,.0f}/s"

    def reasons(counts: dict[str, int]) -> str:
        nonzero = {k: v for k, v in counts.items() if v}
        return ", ".join(f"{k} {v}" for k, v in nonzero.items()) or "none"

    return "\n".join(
        [
            f"fleet: {summary['devices']} devices ({summary['mode']}, "
            f"{summary['connections']} connections), model {summary['model']}, "
            f"QoS {summary['qos']}, seed {summary['seed']}"
            + ("  [interrupted]" if summary["interrupted"] else ""),
            f"connected: {summary['connected']} at most (at start "
            f"{summary['connected_at_start']}, {rate(summary['connect_rate_per_s'])}; at the end "
            f"{summary['connected_at_end']}; connections lost {summary['connections_lost']})",
            f"rounds completed: {summary['rounds_completed']} of {summary['round_seconds']} s "
            f"(rounds {summary['first_round']}..{summary['last_round']}, skipped "
            f"{summary['rounds_skipped']}, late {summary['rounds_late']})",
            f"reports published: {summary['reports_published']} "
            f"({rate(summary['publish_rate_per_s'])})"
            + (
                f"; sat out {summary['reports_sat_out']} (participation "
                f"{summary['participation']:g}, period cap or not sampled)"
                if summary["reports_sat_out"]
                else ""
            ),
            f"reports not sent: {summary['reports_not_sent']} "
            f"({reasons(summary['publish_failures'])})",
            f"connect failures: {reasons(summary['connect_failures'])}",
            f"duration: {summary['duration_seconds']:.1f} s",
        ]
    )


def _round_length(announced: int | None, given: int | None, source: str) -> int:
    """``--round-seconds`` or the announced (or spec file's) ``round_seconds``."""
    if announced is not None and given is not None and announced != given:
        raise ValueError(
            f"--round-seconds {given} does not match the round_seconds {announced} of {source}"
        )
    length = announced if announced is not None else given
    if length is None:
        raise ValueError(
            f"{source} holds no round_seconds: give --round-seconds (the deployment's round length)"
        )
    return length


def _file_spec(
    path: Path, given_seconds: int | None
) -> tuple[MechanismSpec, int, ShardPlan | None, float | None, AnnouncedPeriod | None]:
    """The spec, round length, shard layouts, participation (``None``: a bare spec) and
    period policy of a ``--spec`` file (a spec, or a whole announcement)."""
    mechanism, whole = read_spec_or_announcement(path)
    file_seconds = None if whole is None else whole["round_seconds"]
    length = _round_length(file_seconds, given_seconds, f"the spec file {path}")
    if whole is None:
        return mechanism, length, None, None, None
    return mechanism, length, shard_plan(whole), participation_of(whole), period_of(whole)


def _participation(announced: float | None, given: float | None, source: str) -> float:
    """``--participation`` or the announced ``q`` (1 when neither says)."""
    if announced is not None and given is not None and announced != given:
        raise ValueError(
            f"--participation {given:g} does not match the participation {announced:g} of "
            f"{source} (devices follow the announcement)"
        )
    chosen = given if announced is None else announced
    return 1.0 if chosen is None else check_participation(chosen)


def _write_truth(path: Path, base: dict[str, Any] | None, fleet: Fleet) -> None:
    """Add the run's ground truth to ``base``, the file's document when the run started,
    in ``path`` (a one-line error, exit 1, if it cannot)."""
    from sim.fleet.truth import write_onto  # noqa: PLC0415

    try:
        write_onto(path, base, fleet.ground_truth())
    except (CocoError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_ERROR) from None


def _truth_writer(
    path: Path | None, base: dict[str, Any] | None, fleet: list[Fleet]
) -> Callable[[int], None] | None:
    """``--ground-truth``: the file rewritten after every round (the rounds so far added to
    ``base``), so that an aggregator's ``--truth`` shows them while the fleet runs; a
    failed write is one WARNING line (the run's last write reports it as an error)."""
    if path is None:
        return None
    from sim.fleet.truth import write_onto  # noqa: PLC0415

    def write(round_: int) -> None:
        try:
            write_onto(path, base, fleet[0].ground_truth())
        except (CocoError, OSError) as exc:
            logging.getLogger("sim.fleet").warning(
                "round %d: cannot write the ground truth: %s", round_, exc
            )

    return write


def _check_options(qos: int, ground_truth: Path | None, acked_log: Path | None) -> None:
    """The checks that need no broker; the output files among them, so that a file the run
    cannot write fails before anything is published (``ValueError``)."""
    if qos not in (0, 1):
        raise ValueError(f"--qos must be 0 or 1, got {qos}")
    if ground_truth is not None:
        check_output_file(ground_truth, "--ground-truth", renamed=True)
    if acked_log is not None:
        check_output_file(acked_log, "--acked-log")


def _check_truth_file(path: Path, config: FleetConfig) -> dict[str, Any] | None:
    """Refuse a ``--ground-truth`` file this run could not add its rounds to; its document
    (``None``: no file yet), onto which the run writes."""
    from sim.fleet.truth import GroundTruth, check_compatible, read_document  # noqa: PLC0415

    header = GroundTruth(d=config.spec.d).to_dict(
        spec=config.spec,
        seed=config.seed,
        model=config.model,
        round_seconds=config.round_seconds,
        day_seconds=config.day_seconds,
        participation=config.participation,
    )
    base = read_document(path)
    check_compatible(path, base, header)
    return base


def _announced_spec(
    broker: str,
    deployment: str,
    timeout: float,
    username: str | None,
    password: str | None,
    ca_file: str | None,
    client_id: str | None = None,
    mqtt_version: MqttVersion = "auto",
) -> tuple[MechanismSpec, int, ShardPlan | None, float, AnnouncedPeriod | None]:
    """The retained announcement's spec, round_seconds, shard layouts, participation and
    period policy, or a :class:`FleetError` that says what failed."""
    import aiomqtt  # noqa: PLC0415 (not for --help)

    from edge.announcement_reader import fetch_announcement  # noqa: PLC0415 (not for --help)
    from sim.fleet.run import FleetError  # noqa: PLC0415

    try:
        announcement = asyncio.run(
            fetch_announcement(
                broker,
                deployment,
                timeout=timeout,
                username=username,
                password=password,
                ca_file=ca_file,
                client_id=client_id,
                mqtt_version=mqtt_version,
            )
        )
    except CocoError as exc:  # it names the topic it waited on, or the broker it could not read
        raise FleetError(str(exc)) from None
    except (OSError, aiomqtt.MqttError) as exc:
        raise FleetError(f"reading the announcement from {broker}: {exc}") from None
    spec = MechanismSpec.from_dict(announcement["spec"])
    length = int(announcement["round_seconds"])
    q = participation_of(announcement)
    return spec, length, shard_plan(announcement), q, period_of(announcement)


def _fail_if_not_sent(summary: dict[str, Any]) -> None:
    """A run that left reports unsent (or got none acknowledged) failed, whatever else it
    printed: one ``error:`` line with the counts by reason, exit :data:`EXIT_NOT_SENT`."""
    failures = {k: v for k, v in summary["publish_failures"].items() if v}
    published = summary["reports_published"]
    if published == 0 and not summary.get("interrupted"):
        typer.echo(
            f"error: the broker acknowledged no report (failures: {failures or 'none'}; "
            f"connected {summary['connected']} of {summary['devices']} devices)",
            err=True,
        )
        raise typer.Exit(EXIT_NOT_SENT)
    if not failures:
        return
    not_sent = sum(failures.values())
    reasons = ", ".join(f"{k} {v}" for k, v in failures.items())
    refused = ", ".join(f"{k} {v}" for k, v in summary["connect_failures"].items() if v)
    typer.echo(
        f"error: {not_sent} of {not_sent + published} reports were not sent ({reasons}); "
        f"connections lost {summary['connections_lost']}, failed connection attempts "
        f"{sum(summary['connect_failures'].values())}" + (f" ({refused})" if refused else ""),
        err=True,
    )
    raise typer.Exit(EXIT_NOT_SENT)


def _serve_metrics(port: int, host: str, registry: CollectorRegistry) -> Any:
    """Serve ``/metrics`` of ``registry`` on ``host:port`` (the server, to shut down), or a
    :class:`FleetError` that names the port and the option."""
    from prometheus_client import start_http_server  # noqa: PLC0415 (not for --help)

    from sim.fleet.run import FleetError  # noqa: PLC0415

    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except (OSError, OverflowError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise FleetError(
            f"--metrics-port {port}: cannot serve /metrics on {host}:{port}: {reason}"
        ) from None
    return server


def _acked_writer(out: TextIO | None) -> Callable[[int, int, int], None] | None:
    """``--acked-log``: one line ``round seed z`` per acknowledged report."""
    if out is None:
        return None

    def write(round_: int, seed: int, z: int) -> None:
        out.write(f"{round_} {seed} {z}\n")

    return write


def fleet(
    deployment: DeploymentOption,
    broker: BrokerOption = DEFAULT_BROKER,
    devices: Annotated[int, typer.Option(help="Simulated devices.")] = 1000,
    rounds: Annotated[
        int,
        typer.Option(
            help="Consecutive wall-clock rounds (one report per device each); 0 = until "
            "interrupted."
        ),
    ] = 1,
    round_seconds: Annotated[
        int | None,
        typer.Option(
            help="Round length; default: the announced one (needed with a --spec file that "
            "is not a whole announcement)."
        ),
    ] = None,
    round_offset: Annotated[
        float, typer.Option(help="Seconds into each round before publishing starts.")
    ] = 0.0,
    round_spread: Annotated[
        float,
        typer.Option(
            help="Seconds over which a round's reports are spread (0 = as fast as possible)."
        ),
    ] = 0.0,
    join_current_round: Annotated[
        bool,
        typer.Option(
            help="Start in the round in progress instead of the next (a rerun may then "
            "repeat the previous run's last round: duplicates)."
        ),
    ] = False,
    ramp_up: Annotated[
        float, typer.Option(help="New connections per second (0 = as fast as possible).")
    ] = 0.0,
    qos: Annotated[int, typer.Option(help="MQTT QoS of the reports (0 or 1).")] = 1,
    mode: Annotated[
        FleetMode,
        typer.Option(
            help="connections: one MQTT connection per device; multiplexed: --connections "
            "shared connections (each report still on its device's ingress topic)."
        ),
    ] = FleetMode.connections,
    connections: Annotated[int, typer.Option(help="Shared connections in multiplexed mode.")] = 4,
    model: Annotated[
        FleetModelName,
        typer.Option(
            help="sensors: d = 5..8 environmental channels; keyvalue: d - s features "
            "liked (+1) or disliked (-1)."
        ),
    ] = FleetModelName.sensors,
    day_seconds: Annotated[
        int,
        typer.Option(
            help="Length of the sensor model's day in seconds (default a real day, the UTC "
            "hour); smaller compresses the daily cycle, e.g. 600 shows a day in 10 minutes "
            "(at least two rounds)."
        ),
    ] = DAY_SECONDS,
    spec: SpecFileOption = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the whole run (default: random, printed).")
    ] = None,
    prefix: Annotated[str, typer.Option(help="Device id prefix (id = prefix + 6 digits).")] = (
        DEFAULT_PREFIX
    ),
    username: Annotated[
        str | None,
        typer.Option(envvar="COCO_MQTT_USERNAME", help="One shared MQTT identity."),
    ] = None,
    password: Annotated[
        str | None,
        typer.Option(envvar="COCO_MQTT_PASSWORD", help="Password of the shared MQTT identity."),
    ] = None,
    ca_file: Annotated[
        str | None, typer.Option(envvar="COCO_MQTT_CA_FILE", help="CA bundle for mqtts://.")
    ] = None,
    credentials_secret_file: Annotated[
        Path | None,
        typer.Option(
            envvar="COCO_CREDENTIALS_SECRET_FILE",
            help="Per-device credentials: user name = device id, password derived from this "
            "deployment secret (sim.credentials; surrounding whitespace ignored).",
        ),
    ] = None,
    ground_truth: Annotated[
        Path | None,
        typer.Option(
            help="Add this run's SIMULATION-ONLY ground truth (JSON) to this file: its rounds "
            "are merged with those already there; a file of another seed, spec, model or round "
            "length is refused."
        ),
    ] = None,
    acked_log: Annotated[
        Path | None,
        typer.Option(
            help="SIMULATION-ONLY: append 'round seed z' of every acknowledged report here "
            "(no device id), to reconcile with what the pipeline released."
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            envvar="COCO_METRICS_PORT",
            help=f"Serve /metrics on this port (the deployment files use "
            f"{FLEET_METRICS_PORT}; none without it).",
        ),
    ] = None,
    metrics_host: MetricsHostOption = DEFAULT_METRICS_HOST,
    metrics_dims: Annotated[
        int, typer.Option(help="Dimensions 0..k-1 of the ground-truth gauges (<= 1024).")
    ] = DEFAULT_METRICS_DIMS,
    hold: Annotated[
        bool, typer.Option("--hold", help="Keep serving metrics after the last round.")
    ] = False,
    window: Annotated[
        int, typer.Option(help="Most unacknowledged QoS 1 reports per connection.")
    ] = 1000,
    announcement_timeout: Annotated[float, typer.Option(help="Seconds to wait for it.")] = 10.0,
    participation: Annotated[
        float | None,
        typer.Option(
            help="Probability q in (0, 1] with which each device reports in a round; default: "
            "the announced one (1 without); must match an announced one."
        ),
    ] = None,
    mqtt_version: MqttVersionOption = DEFAULT_MQTT_VERSION,
    progress: Annotated[bool, typer.Option(help="Live progress on stderr.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Simulate a fleet of devices publishing privatised reports (simulation only: no
    budget ledger; a real device runs `coco device`)."""
    import aiomqtt  # noqa: PLC0415 (not for --help: the MQTT clients and numpy)
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from sim.fleet.run import Fleet, FleetConfig  # noqa: PLC0415

    # gmqtt logs per connection (thousands of lines when a broker restarts, some naming a
    # client id, i.e. a device): DEBUG only. The fleet logs one line per round instead.
    debug = logging.getLogger().isEnabledFor(logging.DEBUG)
    logging.getLogger("gmqtt").setLevel(logging.DEBUG if debug else logging.CRITICAL)
    registry = CollectorRegistry()
    server = None
    try:
        _check_options(qos, ground_truth, acked_log)
        if metrics_port is not None:  # first: a busy port fails before the broker is asked
            server = _serve_metrics(metrics_port, metrics_host, registry)
        secret = None if credentials_secret_file is None else read_secret(credentials_secret_file)
        if spec is not None:
            mechanism, length, shards, q, period = _file_spec(spec, round_seconds)
            q = _participation(q, participation, f"the spec file {spec}")
        else:
            user, pw, client_id = username, password, None
            if secret is not None:  # read the announcement as device 0 would, with its id
                user = client_id = device_id(0, prefix)
                pw = device_password(secret, user)
            mechanism, length, shards, q, period = _announced_spec(
                broker,
                deployment,
                announcement_timeout,
                user,
                pw,
                ca_file,
                client_id,
                check_mqtt_version(mqtt_version),
            )
            length = _round_length(length, round_seconds, "the announcement")
            q = _participation(q, participation, "the announcement")
        run_seed = secrets.randbits(32) if seed is None else seed
        qos_level: Literal[0, 1] = 1 if qos == 1 else 0
        config = FleetConfig(
            broker=broker,
            deployment=deployment,
            spec=mechanism,
            devices=devices,
            rounds=rounds,
            round_seconds=length,
            round_offset=round_offset,
            round_spread=round_spread,
            join_current_round=join_current_round,
            ramp_up=ramp_up,
            qos=qos_level,
            mode=mode.value,
            connections=connections,
            model=model.value,
            day_seconds=day_seconds,
            seed=run_seed,
            prefix=prefix,
            username=username,
            password=password,
            credentials_secret=secret,
            ca_file=ca_file,
            window=window,
            metrics_dims=metrics_dims,
            mqtt_version=check_mqtt_version(mqtt_version),
            shards=shards,
            participation=q,
            period=period,
        )
        # a file this run cannot add to is refused before it
        base = None if ground_truth is None else _check_truth_file(ground_truth, config)
        acked_file = None if acked_log is None else acked_log.open("a", encoding="ascii")
        made: list[Fleet] = []
        sim = Fleet(
            config,
            registry=registry,
            on_acked=_acked_writer(acked_file),
            on_round=_truth_writer(ground_truth, base, made),
        )
        made.append(sim)
        try:
            summary = asyncio.run(_serve(sim, hold=hold, progress=progress))
        finally:
            if acked_file is not None:
                acked_file.close()
    except (CocoError, ValueError, OSError, TimeoutError, aiomqtt.MqttError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_ERROR) from None
    finally:
        if server is not None:
            server.shutdown()
    typer.echo(json.dumps(summary, indent=1) if as_json else format_summary(summary))
    if ground_truth is not None:
        _write_truth(ground_truth, base, sim)
    _fail_if_not_sent(summary)
