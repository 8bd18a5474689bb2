"""``coco shuffler``: run the shuffling bridge (signal handling and logging live only here)."""

from __future__ import annotations

import asyncio
import logging
import signal
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from edge import CocoError, MechanismSpec
from edge.announce import load_spec_file
from edge.cli_options import (
    DEFAULT_BROKER,
    DEFAULT_MQTT_VERSION,
    BrokerOption,
    CaFileOption,
    MetricsHostOption,
    MqttVersionOption,
    PasswordFileOption,
    PasswordOption,
    SpecFileOption,
    UsernameOption,
    resolve_password,
)
from edge.defaults import DEFAULT_METRICS_HOST, DEFAULT_ROUND_SECONDS, SHUFFLER_METRICS_PORT
from edge.mqtt_version import check_mqtt_version
from edge.shards import ShardPlan

if TYPE_CHECKING:  # imported when a command runs, not for --help (MQTT clients, numpy)
    from prometheus_client import CollectorRegistry

    from broker.service.shuffler import ShufflerConfig

logger = logging.getLogger("broker.cli")  # a fixed name: broker/__init__.py, "Loggers"


class Policy(StrEnum):
    carry = "carry"
    drop = "drop"


def _rules(
    round_seconds: int | None,
    announced_round: int | None,
    min_batch: int | None,
    announced: int | None,
) -> tuple[int, int]:
    """``(round_seconds, min_batch)`` from the options and the announcement."""
    if round_seconds is None:
        if announced_round is None:
            raise ValueError("--round-seconds is required with --spec")
        round_seconds = announced_round
    elif announced_round is not None and round_seconds != announced_round:
        raise ValueError(
            f"--round-seconds {round_seconds} differs from the announced {announced_round}"
        )
    if min_batch is None:
        if announced is None:
            raise ValueError("--min-batch is required with --spec")
        min_batch = announced
    if announced is not None and min_batch < announced:
        raise ValueError(f"--min-batch {min_batch} is below the announced min_batch {announced}")
    return round_seconds, min_batch


def _shard_key(
    deployment: str, shard: str | None, plan: ShardPlan | None, announced: str | None
) -> str | None:
    """The announced public key this shuffler must sign with: its shard's in a sharded
    deployment (where --shard is required), else the announcement's batch_public_key."""
    if plan is not None:
        if shard is None:
            raise ValueError(
                f"deployment {deployment} is sharded ({', '.join(plan.labels)}): pass --shard LABEL"
            )
        key = plan.key_of(shard)
        if key is None:
            raise ValueError(
                f"--shard {shard} is not one of the announced shards ({', '.join(plan.labels)})"
            )
        return key
    if shard is not None:
        raise ValueError(
            f"--shard {shard}: deployment {deployment} is not sharded (its announcement "
            "has no shards; with --spec there is none)"
        )
    return announced


def _repair(state_dir: Path | None, round_seconds: int | None) -> None:
    """``coco shuffler repair``: one JSON report on stdout; exit 1 if nothing to repair
    could be opened."""
    import json  # noqa: PLC0415

    from broker.core.machine import CoreConfig  # noqa: PLC0415
    from broker.store.repair import repair  # noqa: PLC0415

    if state_dir is None:
        typer.echo("error: repair needs --state-dir", err=True)
        raise typer.Exit(2)
    # Rules do not matter to a repair; round_seconds only reads a version-1 log's rounds.
    config = CoreConfig(
        fingerprint=0, t=1, round_seconds=round_seconds or DEFAULT_ROUND_SECONDS, min_batch=2
    )
    try:
        report = repair(state_dir, config)
    except (CocoError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(json.dumps(report.as_dict(), indent=2))


async def _serve(config: ShufflerConfig, registry: CollectorRegistry) -> None:
    from broker.service.shuffler import Shuffler  # noqa: PLC0415 (not for --help)

    loop = asyncio.get_running_loop()
    async with Shuffler(config, registry=registry) as shuffler:
        logger.info(
            "batches are signed with Ed25519 public key %s (signing.pub in %s)",
            shuffler.public_key_hex,
            config.state_dir,
        )
        stops = 0

        def on_signal() -> None:
            nonlocal stops
            stops += 1
            if stops == 1:
                logger.info("stopping: publishing released batches, keeping pools in the state")
                shuffler.stop()
            else:  # a second signal forces exit
                raise SystemExit(1)

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        try:
            await shuffler.run()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


class Action(StrEnum):
    run = "run"
    repair = "repair"
    prepare = "prepare"


def _prepare(
    deployment: str,
    broker: str,
    shards: list[str],
    *,
    settings: dict[str, Any],
    password_file: Path | None,
    announcement_timeout: float,
) -> None:
    """``coco shuffler prepare``: one line per shard prepared, one ``error:`` line per shard
    that could not be (exit 1 if any); the shards are ``shards``, or by default every shard
    of an announced layout whose first round is ahead (an unsharded deployment: its one
    session)."""
    import aiomqtt  # noqa: PLC0415 (not for --help)

    from broker.service.prepare import PrepareSettings, prepare_shard  # noqa: PLC0415
    from edge.announcement_reader import fetch_announcement  # noqa: PLC0415
    from edge.rounds import current_round  # noqa: PLC0415

    try:
        password = resolve_password(settings.pop("password"), password_file)
        settings["mqtt_version"] = check_mqtt_version(settings["mqtt_version"])
        config = PrepareSettings(
            broker=broker, deployment=deployment, password=password, announced=True, **settings
        )
        announcement = asyncio.run(
            fetch_announcement(
                broker,
                deployment,
                timeout=announcement_timeout,
                username=config.username,
                password=config.password,
                ca_file=config.ca_file,
                mqtt_version=config.mqtt_version,
            )
        )
        targets: list[str | None]
        if announcement.get("shards") is None:
            if shards:
                raise ValueError(f"--shard: deployment {deployment} is not sharded")
            targets = [None]
        else:
            plan = ShardPlan.from_json(announcement["shards"])
            now = current_round(int(announcement["round_seconds"]))
            unknown = [label for label in shards if plan.layout_of_label(label) is None]
            if unknown:
                raise ValueError(
                    f"--shard {', '.join(unknown)}: not an announced shard "
                    f"({', '.join(plan.labels)})"
                )
            targets = list(dict.fromkeys(shards)) or list(plan.labels_ahead(now))
            if not targets:
                raise ValueError(
                    f"no announced layout of {deployment} starts after the current round "
                    f"{now}: nothing to prepare (name shards with --shard)"
                )
    except (CocoError, ValueError, OSError, TimeoutError, aiomqtt.MqttError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    failed = False
    for target in targets:
        try:
            typer.echo(asyncio.run(prepare_shard(config, target)).line())
        except (CocoError, OSError, TimeoutError) as exc:
            typer.echo(f"error: {exc}", err=True)
            failed = True
    if failed:
        raise typer.Exit(1)


def shuffler(
    action: Annotated[
        Action,
        typer.Argument(
            help="run (default): the service. repair: salvage a damaged log in --state-dir "
            "(the shuffler stopped), keeping a copy and printing what was dropped. prepare: "
            "create the ingest session of each --shard (default: every shard of an announced "
            "layout not begun yet) before its shuffler first starts, so the broker queues "
            "that shard's reports until it does (refused for a shard whose shuffler runs).",
        ),
    ] = Action.run,
    deployment: Annotated[
        str | None,
        typer.Option(envvar="COCO_DEPLOYMENT", help="Deployment name (one topic level)."),
    ] = None,
    broker: BrokerOption = DEFAULT_BROKER,
    spec: SpecFileOption = None,
    min_batch: Annotated[
        int | None,
        typer.Option(
            envvar="COCO_MIN_BATCH",
            help="Smallest released batch (default: the announcement's; may not be lower).",
        ),
    ] = None,
    max_batch: Annotated[
        int, typer.Option(envvar="COCO_MAX_BATCH", help="Most records per batch message.")
    ] = 10_000,
    round_policy: Annotated[
        Policy, typer.Option(envvar="COCO_ROUND_POLICY", help="Rounds below min_batch.")
    ] = Policy.carry,
    flush_interval: Annotated[
        float,
        typer.Option(envvar="COCO_FLUSH_INTERVAL", help="Seconds between round-closing checks."),
    ] = 1.0,
    round_seconds: Annotated[
        int | None,
        typer.Option(
            envvar="COCO_ROUND_SECONDS",
            help="Round length (default: the announcement's; required with --spec).",
        ),
    ] = None,
    max_skew: Annotated[
        float,
        typer.Option(
            envvar="COCO_MAX_SKEW", help="Seconds of device clock error accepted either way."
        ),
    ] = 5.0,
    late_seconds: Annotated[
        float,
        typer.Option(
            envvar="COCO_LATE_SECONDS",
            help="Accept a round's reports this long after it ends (queued while down).",
        ),
    ] = 600.0,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="COCO_STATE_DIR",
            help="Durable state: log, keys, lock (default: coco-state/<deployment>/shuffler).",
        ),
    ] = None,
    signing_key: Annotated[
        Path | None,
        typer.Option(
            envvar="COCO_SIGNING_KEY",
            help="Ed25519 batch key (default: signing.key in the state directory); "
            "never created unless --create-signing-key.",
        ),
    ] = None,
    shard: Annotated[
        list[str] | None,
        typer.Option(
            envvar="COCO_SHARD",
            help="This shuffler's shard (g<generation>s<index>, e.g. g0s1) in a sharded "
            "deployment: required there, refused elsewhere. prepare: repeat it for several.",
        ),
    ] = None,
    lease_ttl: Annotated[
        float,
        typer.Option(envvar="COCO_LEASE_TTL", help="Seconds a shard lease lives unless renewed."),
    ] = 30.0,
    broker_stats: Annotated[
        bool,
        typer.Option(
            envvar="COCO_BROKER_STATS",
            help="Export Mosquitto's $SYS loss counters (coco_mosquitto_*) on /metrics "
            "(the account needs read access to $SYS/broker/#).",
        ),
    ] = True,
    create_signing_key: Annotated[
        bool,
        typer.Option(
            envvar="COCO_CREATE_SIGNING_KEY",
            help="Create the signing key if it does not exist (otherwise: coco credentials "
            "--batch-key-dir).",
        ),
    ] = False,
    fsync: Annotated[
        bool,
        typer.Option(
            envvar="COCO_FSYNC",
            help="Sync the log after every write, before the PUBACKs it covers "
            "(survives power loss).",
        ),
    ] = False,
    client_id: Annotated[
        str | None,
        typer.Option(
            envvar="COCO_CLIENT_ID",
            help="MQTT client id (default: the username, else coco-shuffler-<deployment>).",
        ),
    ] = None,
    username: UsernameOption = None,
    password: PasswordOption = None,
    password_file: PasswordFileOption = None,
    ca_file: CaFileOption = None,
    mqtt_version: MqttVersionOption = DEFAULT_MQTT_VERSION,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            envvar="COCO_METRICS_PORT",
            help=f"Serve /metrics and /ready on this port (the deployment files use "
            f"{SHUFFLER_METRICS_PORT}; none without it).",
        ),
    ] = None,
    metrics_host: MetricsHostOption = DEFAULT_METRICS_HOST,
    announcement_timeout: Annotated[float, typer.Option(help="Seconds to wait for it.")] = 10.0,
) -> None:
    """Shuffle each round's ingress reports into signed batches of at least --min-batch."""
    if action == Action.repair:
        _repair(state_dir, round_seconds)
        return
    if deployment is None:
        typer.echo("error: --deployment is required (or COCO_DEPLOYMENT)", err=True)
        raise typer.Exit(2)
    shards = shard or []
    if action == Action.prepare:
        _prepare(
            deployment,
            broker,
            shards,
            settings={
                "username": username,
                "password": password,
                "ca_file": ca_file,
                "client_id": client_id,
                "mqtt_version": mqtt_version,
            },
            password_file=password_file,
            announcement_timeout=announcement_timeout,
        )
        return
    if len(shards) > 1:
        typer.echo("error: --shard: a shuffler serves one shard (more only with prepare)", err=True)
        raise typer.Exit(2)
    one_shard = shards[0] if shards else None
    import aiomqtt  # noqa: PLC0415 (not for --help: the MQTT clients cost 0.1-0.2 s of CPU)
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from broker.service.lease import LeaseRefusedError  # noqa: PLC0415
    from broker.service.metrics import serve_http  # noqa: PLC0415
    from broker.service.shuffler import SessionTakenOverError, ShufflerConfig  # noqa: PLC0415
    from edge.announcement_reader import fetch_announcement  # noqa: PLC0415

    try:
        password = resolve_password(password, password_file)
        announced: int | None = None
        announced_round: int | None = None
        announced_key: str | None = None
        plan: ShardPlan | None = None
        if spec is not None:
            mechanism = load_spec_file(spec)
        else:
            announcement = asyncio.run(
                fetch_announcement(
                    broker,
                    deployment,
                    timeout=announcement_timeout,
                    username=username,
                    password=password,
                    ca_file=ca_file,
                    mqtt_version=check_mqtt_version(mqtt_version),
                )
            )
            mechanism = MechanismSpec.from_dict(announcement["spec"])
            announced = int(announcement["min_batch"])
            announced_round = int(announcement["round_seconds"])
            key = announcement.get("batch_public_key")
            announced_key = key if isinstance(key, str) else None
            if announcement.get("shards") is not None:
                plan = ShardPlan.from_json(announcement["shards"])
        announced_key = _shard_key(deployment, one_shard, plan, announced_key)
        round_seconds, min_batch = _rules(round_seconds, announced_round, min_batch, announced)
        config = ShufflerConfig(
            broker=broker,
            deployment=deployment,
            spec=mechanism,
            min_batch=min_batch,
            max_batch=max_batch,
            round_policy=round_policy.value,
            flush_interval=flush_interval,
            round_seconds=round_seconds,
            max_skew=max_skew,
            late_seconds=late_seconds,
            state_dir=state_dir
            or Path("coco-state")
            / deployment
            / ("shuffler" + (f"-{one_shard}" if one_shard else "")),
            signing_key=signing_key,
            create_signing_key=create_signing_key,
            broker_stats=broker_stats,
            shard=one_shard,
            plan=plan,
            lease_ttl=lease_ttl,
            mqtt_version=check_mqtt_version(mqtt_version),
            announced_public_key=announced_key,
            announced=spec is None,
            fsync=fsync,
            client_id=client_id,
            username=username,
            password=password,
            ca_file=ca_file,
        )
        registry = CollectorRegistry()
        if metrics_port is not None:
            serve_http(metrics_port, registry, metrics_host)  # /metrics and /ready
        asyncio.run(_serve(config, registry))
    except (
        CocoError,
        ValueError,
        OSError,
        TimeoutError,
        aiomqtt.MqttError,
        SessionTakenOverError,
        LeaseRefusedError,
    ) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
