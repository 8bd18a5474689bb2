"""``coco aggregator run | snapshot | series | trust | plot | rejected`` (:data:`aggregator_app`):
the streaming service, an offline snapshot of its checkpoint, its estimates over time, the
pinned batch keys, the series as a PNG (:mod:`aggregator.service.plot_cli`) and the verified
batches kept after a refusal (:mod:`aggregator.service.rejected_cli`). ``coco privacy``
lives in :mod:`aggregator.ledger.privacy_cli`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import string
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from aggregator.service.core.silence import DEFAULT_SILENT_SHARD_ROUNDS
from edge import CocoError, MechanismSpec, SpecError
from edge.announce import load_spec_file, shard_plan
from edge.cli_options import (
    DEFAULT_BROKER,
    BrokerOption,
    CaFileOption,
    DeploymentOption,
    MetricsHostOption,
    PasswordFileOption,
    PasswordOption,
    SpecFileOption,
    UsernameOption,
    delta_option,
    resolve_password,
)
from edge.defaults import AGGREGATOR_METRICS_PORT, DEFAULT_METRICS_HOST
from edge.shards import ShardPlan

if TYPE_CHECKING:
    from aggregator.page.page_data import Channel

__all__ = ["aggregator_app"]

HEX_KEY_DIGITS = 64

aggregator_app = typer.Typer(
    help="The streaming aggregator service.", no_args_is_help=True, add_completion=False
)


@aggregator_app.command("run")
def aggregator_run(
    deployment: DeploymentOption,
    broker: BrokerOption = DEFAULT_BROKER,
    spec: SpecFileOption = None,
    delta: Annotated[
        float | None,
        typer.Option(
            envvar="COCO_DELTA",
            callback=delta_option,
            help="Target delta in (0, 1) (default: the announcement's).",
        ),
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
    metrics_host: MetricsHostOption = DEFAULT_METRICS_HOST,
    metrics_port: Annotated[
        int, typer.Option(envvar="COCO_METRICS_PORT", help="Port of /metrics and /estimates.")
    ] = AGGREGATOR_METRICS_PORT,
    metrics_dims: Annotated[
        int, typer.Option(envvar="COCO_METRICS_DIMS", help="Dimensions exported as metrics.")
    ] = 16,
    channels: Annotated[
        Path | None,
        typer.Option(
            envvar="COCO_CHANNELS",
            help="JSON list of {name, unit, lo, hi}, one per dimension, where devices encode "
            "sensor readings on [lo, hi] (SensorEncoder): /estimates and the live page then "
            "show each channel's mean in its unit.",
        ),
    ] = None,
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
    manifest_grace: Annotated[
        float,
        typer.Option(
            envvar="COCO_MANIFEST_GRACE",
            help="Seconds a shuffler's release manifest waits for its batches before the "
            "missing reports are counted (coco_aggregator_reports_missing_total).",
        ),
    ] = 120.0,
    silent_shard_rounds: Annotated[
        int,
        typer.Option(
            envvar="COCO_SILENT_SHARD_ROUNDS",
            min=1,
            help="Log a WARNING when a shard of the layout in force has released nothing "
            "for this many rounds in which other shards released "
            "(coco_aggregator_shard_silent_rounds).",
        ),
    ] = DEFAULT_SILENT_SHARD_ROUNDS,
    mqtt_version: Annotated[
        str,
        typer.Option(
            envvar="COCO_MQTT_VERSION",
            help="MQTT protocol: auto (5, else 3.1.1 if the broker refuses 5), 5 or 3.1.1.",
        ),
    ] = "auto",
    cycle_seconds: Annotated[
        int,
        typer.Option(
            envvar="COCO_CYCLE_SECONDS",
            min=1,
            help="The fleet's cycle for the change detector (coco_aggregator_change_*), a "
            "whole number of rounds: a day, or a fleet's --day-seconds.",
        ),
    ] = 86_400,
    window: Annotated[
        list[str] | None,
        typer.Option(
            help="A window exported as coco_aggregator_window_* gauges: a duration (15m, 1h, "
            "24h) or rK (the K newest rounds); repeat for more, at most 8.",
        ),
    ] = None,
    privacy_period: Annotated[
        list[str] | None,
        typer.Option(
            help="A rolling period over which epsilon_total is also reported (a device in "
            "every round that ended in it): coco_aggregator_epsilon_total_period{period} and "
            "epsilon_total_period in /estimates; repeat for more, at most 4. [default: 24h]",
        ),
    ] = None,
    series_retention: Annotated[
        str,
        typer.Option(
            envvar="COCO_SERIES_RETENTION",
            help="How long each round keeps its own row in the per-round series "
            "(<checkpoint>.series): a duration, e.g. 7d.",
        ),
    ] = "7d",
    series_step: Annotated[
        str,
        typer.Option(
            envvar="COCO_SERIES_STEP",
            help="Older rounds are rolled up into rows of this duration (e.g. 1h), or 'none' "
            "to drop them.",
        ),
    ] = "1h",
    series_coarse_retention: Annotated[
        str,
        typer.Option(
            envvar="COCO_SERIES_COARSE_RETENTION",
            help="How long the rolled-up rows are kept past --series-retention (a duration, or 0).",
        ),
    ] = "90d",
    new_series: Annotated[
        bool,
        typer.Option(
            "--new-series",
            help="Keep the series file as <checkpoint>.series.old and start the per-round "
            "series anew (after a damaged or lost series file; the cumulative estimates "
            "are unaffected).",
        ),
    ] = False,
    truth: Annotated[
        Path | None,
        typer.Option(
            envvar="COCO_TRUTH_FILE",
            help="SIMULATION ONLY: a fleet's --ground-truth file, served at /truth (read "
            "again when it changes) and drawn on the live page as the simulation truth.",
        ),
    ] = None,
) -> None:
    """Consume shuffled batches; serve estimates, metrics and the certified central epsilon.

    Only batches sealed by the shuffler's key are applied; with --checkpoint that key is
    pinned on first use beside the checkpoint (<checkpoint>.trust), and a changed
    announcement is refused until `coco aggregator trust` accepts it. One aggregator per
    deployment: a second one with the same checkpoint refuses to start, and one whose MQTT
    session is taken over by another client stops. GET /ready answers 200 once the
    checkpoint is recovered and the batches topic subscribed, 503 while the checkpoint
    cannot be written (a full disk).
    """
    from aggregator.service.config import (  # noqa: PLC0415 (keeps `coco privacy` light)
        AggregatorConfig,
        resolve_batch_public_key,
        series_options,
    )
    from aggregator.service.service import run_aggregator  # noqa: PLC0415
    from edge.announcement_reader import fetch_announcement  # noqa: PLC0415
    from edge.mqtt_version import check_mqtt_version  # noqa: PLC0415

    try:
        version = check_mqtt_version(mqtt_version)
        password = resolve_password(password, password_file)
        configured_key = (
            None if batch_public_key is None else read_public_key_option(batch_public_key)
        )
        announced_key: str | None = None
        shards: ShardPlan | None = None
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
                    mqtt_version=version,
                )
            )
            mechanism = MechanismSpec.from_dict(announcement["spec"])
            delta = delta if delta is not None else float(announcement["delta"])
            min_batch = max(int(announcement["min_batch"]), min_batch or 0)
            round_seconds = int(announcement["round_seconds"])
            announced_key = announcement.get("batch_public_key")
            shards = shard_plan(announcement)
        if shards is not None:
            if configured_key is not None:
                raise CocoError(
                    "the deployment is sharded: the aggregator trusts the announced per-shard "
                    "keys, not --batch-public-key"
                )
            key = None
        else:
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
            channels=None if channels is None else read_channels(channels),
            http_host=metrics_host,
            http_port=metrics_port,
            min_batch=min_batch,
            batch_public_key=key,
            shards=shards,
            manifest_grace=manifest_grace,
            silent_shard_rounds=silent_shard_rounds,
            key_source="configured" if configured_key is not None else "announced",
            mqtt_version=version,
            retention_rounds=retention_rounds,
            round_seconds=round_seconds,
            **series_options(series_retention, series_step, series_coarse_retention),
            cycle_seconds=cycle_seconds,
            new_series=new_series,
            client_id=client_id,
            epsilon_target=epsilon_target,
            truth_file=truth,
            username=username,
            password=password,
            ca_file=ca_file,
            windows=tuple(window or ()),
            privacy_periods=tuple(privacy_period or ("24h",)),
        )
    except (CocoError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    banner = (
        f"aggregator: deployment={deployment} spec={mechanism.fingerprint} delta={delta:g} "
        f"min_batch={config.min_batch} "
        + (
            f"batch_key={key[:16]}..."
            if key
            else f"shards={','.join(shards.labels if shards else ())}"
        )
        + " client_id="
        f"{config.mqtt_client_id} http://{metrics_host}:{metrics_port}/ "
        "(/metrics, /estimates, /ready)"
    )
    try:  # the URL is printed once it serves (a busy port or a locked checkpoint: no URL)
        _run_until_signal(run_aggregator(config, serving=lambda _: typer.echo(banner, err=True)))
    except (CocoError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def read_channels(path: Path) -> tuple[Channel, ...]:
    """``--channels FILE``; :class:`CocoError` (one line) naming the file and the problem."""
    from aggregator.page.page_data import channels_from_json  # noqa: PLC0415 (numpy: not for --help)

    try:
        return channels_from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is one
        raise CocoError(f"--channels {path}: {exc}") from None


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


def read_estimates_url(url: str, *, timeout: float) -> dict[str, Any]:
    """The ``/estimates`` document at ``url``; a service's base URL (``http://host:port``
    or ``.../``) means its ``/estimates``. :class:`CocoError` (one line) for anything that
    is not an ``/estimates`` document."""
    if not url.startswith(("http://", "https://")):
        raise CocoError(f"--url must be http(s)://host:port/estimates, got {url!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.path in ("", "/"):
        url = urllib.parse.urlunsplit(parts._replace(path="/estimates"))
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise CocoError(f"cannot read {url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:  # the reason alone, naming the URL
        raise CocoError(f"cannot read {url}: {exc.reason}") from None
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if not isinstance(document, dict) or "estimates" not in document:
        raise CocoError(
            f"{url} is not an aggregator's /estimates document; give "
            "--url http://host:port/estimates"
        )
    return document


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
    from aggregator.service.publishing import snapshot_from_checkpoint  # noqa: PLC0415

    if (url is None) == (checkpoint is None):
        typer.echo("error: give exactly one of --url and --checkpoint", err=True)
        raise typer.Exit(1)
    try:
        if checkpoint is not None:
            document = snapshot_from_checkpoint(checkpoint)
        else:
            assert url is not None
            document = read_estimates_url(url, timeout=timeout)
    except (CocoError, OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(document, indent=1))


@aggregator_app.command("trust")
def aggregator_trust(
    checkpoint: Annotated[
        Path, typer.Option(envvar="COCO_CHECKPOINT", help="The aggregator's checkpoint file.")
    ],
    accept_announced: Annotated[
        bool,
        typer.Option(
            "--accept-announced",
            help="Pin the announced batch key the service refused (after checking it is the "
            "shuffler's new key).",
        ),
    ] = False,
    accept: Annotated[
        str | None,
        typer.Option(help="Pin this batch key: 64 hex digits, or a file holding them."),
    ] = None,
) -> None:
    """Show, or move, the batch key pinned beside a checkpoint (<checkpoint>.trust).

    Without an option: print the pinned key and the announced key last refused. A running
    service picks an accepted key up within seconds; batches signed by the old key are
    rejected from then on.
    """
    from aggregator.service.core.keys import describe_anchor  # noqa: PLC0415
    from aggregator.service.trust import accept as accept_key  # noqa: PLC0415
    from aggregator.service.trust import load_pins, trust_path  # noqa: PLC0415

    path = trust_path(checkpoint)
    try:
        if accept_announced and accept is not None:
            raise CocoError("give --accept-announced or --accept KEY, not both")
        if not accept_announced and accept is None:
            pins = load_pins(path)
            if pins is None:
                raise CocoError(f"no key is pinned ({path} does not exist)")
            typer.echo(f"pinned:  {describe_anchor(pins.trusted)}")
            typer.echo(f"refused: {describe_anchor(pins.refused) if pins.refused else '-'}")
            return
        key = None if accept is None else read_public_key_option(accept)
        old, new = accept_key(path, key=key)
    except (CocoError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"old: {describe_anchor(old) if old else '-'}")
    typer.echo(f"new: {describe_anchor(new)}")
    typer.echo(f"pinned in {path}")


def _register_over_time() -> None:
    """``coco aggregator series`` (:mod:`aggregator.service.series_cli`) and ``coco aggregator
    plot`` (:mod:`aggregator.service.plot_cli`)."""
    from aggregator.service.plot_cli import aggregator_plot  # noqa: PLC0415
    from aggregator.service.rejected_cli import rejected_app  # noqa: PLC0415
    from aggregator.service.series_cli import aggregator_series  # noqa: PLC0415

    aggregator_app.command("series")(aggregator_series)
    aggregator_app.command("plot")(aggregator_plot)
    aggregator_app.add_typer(rejected_app, name="rejected")


_register_over_time()
