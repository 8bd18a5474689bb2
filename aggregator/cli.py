"""``coco aggregator run | snapshot`` (:data:`aggregator_app`): the streaming service.
``coco privacy`` lives in :mod:`aggregator.privacy_cli` (its names are re-exported here)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import string
import urllib.error
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer

from aggregator.privacy_cli import PrivacyMechanism, privacy_app, privacy_rows
from edge import CocoError, MechanismSpec, SpecError
from edge.announce import load_spec_file
from edge.cli_options import (
    DEFAULT_BROKER,
    BrokerOption,
    CaFileOption,
    DeploymentOption,
    PasswordFileOption,
    PasswordOption,
    SpecFileOption,
    UsernameOption,
    resolve_password,
)

__all__ = ["PrivacyMechanism", "aggregator_app", "privacy_app", "privacy_rows"]

HEX_KEY_DIGITS = 64


# -- coco aggregator run | snapshot ------------------------------------------------------------

aggregator_app = typer.Typer(help="The streaming aggregator service.", no_args_is_help=True)


@aggregator_app.command("run")
def aggregator_run(
    deployment: DeploymentOption,
    broker: BrokerOption = DEFAULT_BROKER,
    spec: SpecFileOption = None,
    delta: Annotated[
        float | None,
        typer.Option(envvar="COCO_DELTA", help="Target delta (default: the announcement's)."),
    ] = None,
    checkpoint: Annotated[
        Path | None, typer.Option(envvar="COCO_CHECKPOINT", help="Checkpoint file.")
    ] = None,
    checkpoint_interval: Annotated[
        float, typer.Option(envvar="COCO_CHECKPOINT_INTERVAL", help="Seconds between checkpoints.")
    ] = 10.0,
    publish_interval: Annotated[
        float,
        typer.Option(
            envvar="COCO_PUBLISH_INTERVAL",
            help="Seconds between rebuilds of the estimates and gauges while batches arrive "
            "(every scrape and /estimates request also gets fresh ones).",
        ),
    ] = 1.0,
    metrics_host: Annotated[
        str, typer.Option(envvar="COCO_METRICS_HOST", help="HTTP bind address.")
    ] = "127.0.0.1",
    metrics_port: Annotated[
        int, typer.Option(envvar="COCO_METRICS_PORT", help="Port of /metrics and /estimates.")
    ] = 9108,
    metrics_dims: Annotated[
        int, typer.Option(envvar="COCO_METRICS_DIMS", help="Dimensions exported as metrics.")
    ] = 16,
    announcement_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the retained announcement.")
    ] = 10.0,
    username: UsernameOption = None,
    password: PasswordOption = None,
    password_file: PasswordFileOption = None,
    ca_file: CaFileOption = None,
    epsilon_target: Annotated[
        float | None,
        typer.Option(
            envvar="COCO_EPSILON_TARGET",
            help="Target central epsilon, exported as coco_aggregator_epsilon_target for "
            "dashboards (default: none, nothing exported).",
        ),
    ] = None,
    batch_public_key: Annotated[
        str | None,
        typer.Option(
            envvar="COCO_BATCH_PUBLIC_KEY",
            help="The shuffler's Ed25519 public key: 64 hex digits, or a file holding them "
            "(default: the announcement's batch_public_key; both given must agree).",
        ),
    ] = None,
    min_batch: Annotated[
        int | None,
        typer.Option(
            envvar="COCO_MIN_BATCH",
            help="Smallest batch to apply (required with --spec; with an announcement, the "
            "larger of this and the announced min_batch).",
        ),
    ] = None,
    retention_rounds: Annotated[
        int,
        typer.Option(
            envvar="COCO_RETENTION_ROUNDS",
            help="Rounds whose batch ids are kept to reject replays; older batches are "
            "rejected as stale_round.",
        ),
    ] = 1440,
    client_id: Annotated[
        str | None,
        typer.Option(
            envvar="COCO_AGGREGATOR_CLIENT_ID",
            help="MQTT client id of the persistent session (default: --username, else "
            "coco-aggregator-<deployment>).",
        ),
    ] = None,
) -> None:
    """Consume shuffled batches; serve estimates, metrics and the certified central epsilon.

    Only batches sealed by the shuffler's key are applied. One aggregator per deployment: a
    second one with the same checkpoint refuses to start, and one whose MQTT session is taken
    over by another client stops.
    """
    from aggregator.service import (  # noqa: PLC0415 (keeps `coco privacy` light)
        AggregatorConfig,
        fetch_announcement,
        resolve_batch_public_key,
        run_aggregator,
    )

    try:
        password = resolve_password(password, password_file)
        configured_key = (
            None if batch_public_key is None else read_public_key_option(batch_public_key)
        )
        announced_key: str | None = None
        round_seconds: int | None = None
        if spec is not None:
            mechanism = load_spec_file(spec)
            if delta is None:
                raise SpecError("--delta is required with --spec")
            if min_batch is None:
                raise SpecError("--min-batch is required with --spec")
        else:
            announcement = asyncio.run(
                fetch_announcement(
                    broker,
                    deployment,
                    timeout=announcement_timeout,
                    username=username,
                    password=password,
                    ca_file=ca_file,
                )
            )
            mechanism = MechanismSpec.from_dict(announcement["spec"])
            delta = delta if delta is not None else float(announcement["delta"])
            min_batch = max(int(announcement["min_batch"]), min_batch or 0)
            round_seconds = int(announcement["round_seconds"])
            announced_key = announcement.get("batch_public_key")
        key = resolve_batch_public_key(configured_key, announced_key)
        config = AggregatorConfig(
            broker=broker,
            deployment=deployment,
            spec=mechanism,
            delta=delta,
            checkpoint=checkpoint,
            checkpoint_interval=checkpoint_interval,
            publish_interval=publish_interval,
            metrics_dims=metrics_dims,
            http_host=metrics_host,
            http_port=metrics_port,
            min_batch=min_batch,
            batch_public_key=key,
            retention_rounds=retention_rounds,
            round_seconds=round_seconds,
            client_id=client_id,
            epsilon_target=epsilon_target,
            username=username,
            password=password,
            ca_file=ca_file,
        )
    except (CocoError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(
        f"aggregator: deployment={deployment} spec={mechanism.fingerprint} delta={delta:g} "
        f"min_batch={config.min_batch} batch_key={key[:16]}... client_id="
        f"{config.mqtt_client_id} http://{metrics_host}:{metrics_port}/metrics",
        err=True,
    )
    try:
        _run_until_signal(run_aggregator(config))
    except (CocoError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def read_public_key_option(value: str) -> str:
    """``--batch-public-key``: 64 hex digits, or the path of a file holding them (lowercased,
    whitespace stripped); :class:`CocoError` naming what is wrong."""
    text = value.strip()
    if len(text) == HEX_KEY_DIGITS and all(c in string.hexdigits for c in text):
        return text.lower()
    try:
        text = Path(value).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CocoError(
            f"--batch-public-key is neither {HEX_KEY_DIGITS} hex digits nor a readable file: {exc}"
        ) from None
    if len(text) != HEX_KEY_DIGITS or not all(c in string.hexdigits for c in text):
        raise CocoError(
            f"--batch-public-key file {value} must hold {HEX_KEY_DIGITS} hex digits "
            "(the shuffler's Ed25519 public key)"
        )
    return text.lower()


def _run_until_signal(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main``; the first SIGINT/SIGTERM cancels it (final checkpoint), a second forces
    exit."""

    async def runner() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        stopping = False

        def stop() -> None:
            nonlocal stopping
            if stopping:
                os._exit(130)
            stopping = True
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        with contextlib.suppress(asyncio.CancelledError):
            await main

    asyncio.run(runner())


@aggregator_app.command("snapshot")
def aggregator_snapshot(
    url: Annotated[
        str | None,
        typer.Option(envvar="COCO_AGGREGATOR_URL", help="http://host:port/estimates of a service."),
    ] = None,
    checkpoint: Annotated[
        Path | None, typer.Option(help="Read a checkpoint file offline instead.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="HTTP timeout in seconds.")] = 10.0,
) -> None:
    """Print the current estimates JSON, from a running service or a checkpoint."""
    from aggregator.service import snapshot_from_checkpoint  # noqa: PLC0415

    if (url is None) == (checkpoint is None):
        typer.echo("error: give exactly one of --url and --checkpoint", err=True)
        raise typer.Exit(1)
    try:
        if checkpoint is not None:
            document = snapshot_from_checkpoint(checkpoint)
        else:
            assert url is not None
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--url must be http(s)://..., got {url!r}")
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    document = json.loads(response.read())
            except urllib.error.URLError as exc:  # the reason alone, naming the URL
                raise CocoError(f"cannot read {url}: {exc.reason}") from None
    except (CocoError, OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(document, indent=1))
