"""``coco demo``'s run: devices -> shuffler -> aggregator on one machine, on the broker
:mod:`sim.demo.brokers` chooses (:func:`run_pipeline`).

A :class:`~broker.service.shuffler.Shuffler` and an
:class:`~aggregator.service.service.Aggregator` run in-process as asyncio tasks, each with its
own ``CollectorRegistry``; the spec announcement is published retained (and cleared at the
end). The fleet (:mod:`sim.demo.publisher`) publishes round ``k`` of its readings in the
``k``-th wall-clock round of ``round_seconds`` (2 s) from the start; the shuffler releases
each round whole, as one signed batch, when the round closes. The run then waits until the
shuffler has received every report, stops it (drain: without a state directory it releases
the open round's pool), waits until the aggregator has applied every released report, then
stops the aggregator, and accounts for every report (:mod:`sim.demo.report`).

With ``http_port`` set (``coco demo --serve``) one HTTP server on 127.0.0.1 (``0``: a free
port) is bound before the broker starts and lives until the caller stops it: the aggregator
serves its live page, ``/metrics`` and ``/estimates`` on it during the run, then the same
socket serves the run's final state (:meth:`~aggregator.service.http.MetricsServer.serve`
swaps what it serves, so no request is ever refused in between).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from typing import Any, Literal

import aiomqtt
import numpy as np
from prometheus_client import CollectorRegistry

from aggregator.page.page_data import Channel
from aggregator.service.config import AggregatorConfig
from aggregator.service.http import MetricsServer, Source
from aggregator.service.service import Aggregator
from aggregator.service.truth_file import TruthMemory
from broker.core.machine import MAX_BATCH_LIMIT
from broker.service.shuffler import Shuffler, ShufflerConfig
from edge import MechanismSpec
from edge.announce import encode_announcement
from edge.batch_auth import BatchSigner
from edge.topics import spec_topic
from sim.demo.brokers import a_broker
from sim.demo.config import (
    HTTP_HOST,
    DemoConfig,
    DemoError,
    DemoRun,
    ReportSink,
    page_url,
    progress,
)
from sim.demo.publisher import DemoFleet, connections
from sim.demo.report import metric_value, result_document
from sim.models.day import DAY_SECONDS
from sim.models.sensors import SensorFleet, channel_table

__all__ = ["run_demo", "run_pipeline", "sensor_channels"]


async def run_pipeline(config: DemoConfig, *, on_report: ReportSink | None = None) -> DemoRun:
    """Run the demo; ``on_report`` sees every report the fleet publishes.

    Broker: ``config.broker`` > a local Mosquitto > the embedded amqtt broker
    (:func:`~sim.demo.brokers.a_broker`).

    With ``config.http_port`` set, one HTTP server is bound before anything else and serves
    the live page, ``/metrics`` and ``/estimates`` of the running aggregator, then, on the
    same socket and without a pause, the run's final state: the returned run holds it
    (:attr:`DemoRun.server`, started); the caller stops it. A run that fails stops it.
    """
    server = None
    if config.http_port is not None:  # a busy port fails here, before any work
        server = MetricsServer(
            host=HTTP_HOST,
            port=config.http_port,
            registry=CollectorRegistry(),
            estimates=lambda: {"ready": False, "starting": True},
            recovered=lambda: False,
            option="--port",
        )
        server.start()
    try:
        async with a_broker(config) as broker:
            run = await _run(
                broker.config,
                broker.url,
                broker.kind,
                on_report,
                mqtt5=broker.mqtt5,
                server=server,
            )
    except BaseException:
        if server is not None:
            server.stop()
        raise
    if broker.note is not None:
        run.result["note"] = broker.note
    if server is not None:
        final = run.estimates
        server.serve(
            Source(run.aggregator_registry, lambda: final, query=run.query, truth=run.truth)
        )
        run.server = server
    return run


async def run_demo(config: DemoConfig) -> dict[str, Any]:
    """The demo's result document (see :func:`run_pipeline`)."""
    return (await run_pipeline(config)).result


def _services(
    config: DemoConfig,
    url: str,
    spec: MechanismSpec,
    *,
    mqtt5: bool = True,
    server: MetricsServer | None = None,
) -> tuple[Shuffler, Aggregator, BatchSigner]:
    """The shuffler and the aggregator of a run, each with its own registry; without
    ``mqtt5`` both speak MQTT 3.1.1 (the fleet's connections always do). The aggregator
    serves on ``server`` (the run's own, :func:`run_pipeline`). The shuffler keeps
    its state in memory (a demo has nothing to resume) and signs with a fresh key, whose
    public key the aggregator trusts (and the announcement carries)."""
    dep = config.deployment
    signer = BatchSigner.generate(dep)
    release = config.release_size
    version: Literal["5", "3.1.1"] = "5" if mqtt5 else "3.1.1"
    shuffler = Shuffler(
        ShufflerConfig(
            mqtt_version=version,
            broker=url,
            deployment=dep,
            spec=spec,
            min_batch=config.min_batch,
            # a whole round in one batch where the broker's packet limit allows
            max_batch=min(MAX_BATCH_LIMIT, max(2 * config.min_batch, 10_000, config.devices)),
            release_size=None if release is None else max(release, config.min_batch),
            round_seconds=config.round_seconds,
            # a round stays open three round lengths after its end: the fleet, the shuffler
            # and the aggregator (and the embedded broker) share one process, whose lag on a
            # loaded machine made reports arrive late (round_too_old: 40 of 400 with a
            # quarter round, 110 of 3,000 with one round on the embedded broker); the drain
            # at the end releases what is still open
            max_skew=float(3 * config.round_seconds),
            flush_interval=config.flush_interval,
            drain_timeout=10.0,
            signer=signer,
            client_id=f"coco-shuffler-{dep}",
            session_expiry=60,
        ),
        registry=CollectorRegistry(),
    )
    aggregator = Aggregator(
        AggregatorConfig(
            mqtt_version=version,
            broker=url,
            deployment=dep,
            spec=spec,
            delta=config.delta,
            batch_public_key=signer.public_key_hex,
            min_batch=config.min_batch,
            round_seconds=config.round_seconds,
            http_host=HTTP_HOST,
            http_port=None,
            session_expiry=60,
            metrics_dims=spec.d,
            channels=sensor_channels(config.channels),
            truth_file=config.truth_file,
            cycle_seconds=DAY_SECONDS if config.day_seconds is None else config.day_seconds,
        ),
        registry=CollectorRegistry(),
        http=server,
    )
    return shuffler, aggregator, signer


def _fleet(config: DemoConfig, spec: MechanismSpec, aggregator: Aggregator) -> DemoFleet:
    """The run's devices; the aggregator serves their per-round truth at ``/truth`` (from
    ``config.truth_file``, else, when it serves its page, from memory)."""
    fleet = DemoFleet(
        config=config,
        spec=spec,
        sensors=SensorFleet(n_devices=config.devices, channels=config.channels, seed=config.seed),
        ids=[f"sensor-{secrets.token_hex(6)}" for _ in range(config.devices)],
        truth_path=config.truth_file,
    )
    if config.http_port is not None and aggregator.truth is None:
        aggregator.truth = TruthMemory(fleet.latest_truth, registry=aggregator.registry).answer
    return fleet


def sensor_channels(count: int) -> tuple[Channel, ...]:
    """The live page's channels of the sensor model with ``count`` channels: names, units
    and ranges (:func:`sim.models.sensors.channel_table`), nothing about any device."""
    return tuple(Channel(ch.name, ch.unit, ch.lo, ch.hi) for ch in channel_table(count))


def _status_line(fleet: DemoFleet, shuffler: Shuffler, aggregator: Aggregator) -> str:
    """One progress line: sent, shuffler counters, aggregated n and the epsilon_central."""
    registry = shuffler.metrics.registry
    eps = aggregator.snapshot().get("epsilon_central", {})
    small, latest = eps.get("smallest"), eps.get("latest")
    return (
        f"sent {fleet.sent}/{fleet.config.devices * fleet.config.rounds}  shuffler: received "
        f"{int(metric_value(registry, 'coco_shuffler_reports_received_total'))}, buffered "
        f"{shuffler.buffered}, batches "
        f"{int(metric_value(registry, 'coco_shuffler_batches_released_total'))}  "
        f"aggregator: n={aggregator.state.n}, epsilon_central (certified) "
        f"smallest batch={level_text(small, aggregator.state.n)} "
        f"latest batch={level_text(latest, aggregator.state.n)}"
    )


def level_text(level: float | None, n: int) -> str:
    """A privacy level of the progress line: ``-`` before any report is applied,
    ``pending`` while the accountant (off the event loop) has not yet computed the level of
    the reports applied."""
    if level is not None:
        return f"{level:.4g}"
    return "pending" if n > 0 else "-"


async def _run(
    config: DemoConfig,
    url: str,
    broker_kind: str,
    on_report: ReportSink | None,
    *,
    mqtt5: bool = True,
    server: MetricsServer | None = None,
) -> DemoRun:
    spec = config.spec()
    dep = config.deployment
    progress(config.progress, f"broker: {broker_kind} at {url}; deployment {dep}")
    shuffler, aggregator, signer = _services(config, url, spec, mqtt5=mqtt5, server=server)
    shuffler_registry = shuffler.metrics.registry
    fleet = _fleet(config, spec, aggregator)
    rng = np.random.default_rng(np.random.SeedSequence(config.seed).spawn(3)[2])

    def received() -> int:
        return int(metric_value(shuffler_registry, "coco_shuffler_reports_received_total"))

    def status() -> str:
        return _status_line(fleet, shuffler, aggregator)

    async def reporter() -> None:
        while True:
            await asyncio.sleep(1.0)
            progress(config.progress, status())

    start = time.monotonic()
    publish_seconds, unaccounted_wait = 0.0, False
    try:
        async with (
            asyncio.timeout(config.timeout),
            aggregator,
            shuffler,
            connections(url, config.connections) as clients,
        ):
            http_port = _announce_page(config, aggregator)
            agg_task = asyncio.create_task(aggregator.run(), name="demo-aggregator")
            shuf_task = asyncio.create_task(shuffler.run(), name="demo-shuffler")
            progress_task = asyncio.create_task(reporter(), name="demo-progress")
            try:
                if not await _wait_until(
                    lambda: aggregator.subscribed.is_set() and shuffler.connected.is_set(), 10
                ):
                    raise DemoError(f"the services could not subscribe at {url}")
                announcement = encode_announcement(
                    spec.to_dict(),
                    min_batch=config.min_batch,
                    delta=config.delta,
                    round_seconds=config.round_seconds,
                    batch_public_key=signer.public_key_hex,
                    participation=config.participation,
                )
                await clients[0].publish(spec_topic(dep), announcement, qos=1, retain=True)

                publish_seconds = await fleet.publish_all(
                    clients, dep, rng, in_flight=lambda: fleet.sent - received(), sink=on_report
                )
                # Every report at the shuffler, then drain it, then every batch applied.
                if not await _wait_until(lambda: received() >= fleet.sent, 20):
                    unaccounted_wait = True
                shuffler.stop()
                await asyncio.wait_for(shuf_task, 20)
                released = int(
                    metric_value(shuffler_registry, "coco_shuffler_reports_released_total")
                )
                if not await _all_applied(config, aggregator, released):
                    unaccounted_wait = True
                await clients[0].publish(spec_topic(dep), b"", qos=1, retain=True)  # clear
            finally:
                progress_task.cancel()
                shuffler.stop()
                for task in (agg_task, shuf_task):
                    task.cancel()
                for task in (agg_task, shuf_task, progress_task):
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
    except TimeoutError:
        raise DemoError(f"the demo did not finish within {config.timeout:g} s") from None
    except aiomqtt.MqttError as exc:
        raise DemoError(f"cannot use the broker at {url}: {exc}") from exc
    progress(config.progress, status())
    result = result_document(
        config=config,
        spec=spec,
        fleet=fleet,
        aggregator=aggregator,
        registry=shuffler_registry,
        broker_kind=broker_kind,
        url=url,
        publish_seconds=publish_seconds,
        http_port=http_port,
    )
    result |= {"elapsed_seconds": time.monotonic() - start, "timed_out_waiting": unaccounted_wait}
    return DemoRun(
        result=result,
        state=aggregator.state,
        shuffler_registry=shuffler_registry,
        aggregator_registry=aggregator.registry,
        estimates=aggregator.snapshot(),
        http_port=http_port,
        truth_file=config.truth_file,
        truth=aggregator.truth,
        query=aggregator.publisher.series.answer,
    )


async def _all_applied(config: DemoConfig, aggregator: Aggregator, released: int) -> bool:
    """Wait until the aggregator has applied ``released`` reports and, when it serves its
    page, until its privacy level (computed in the accountant's process) covers everything its
    ledger recorded, so that
    the page and ``/metrics`` end on the final epsilon. ``False`` after a timeout."""
    if not await _wait_until(lambda: aggregator.state.n >= released, 20):
        return False
    if config.http_port is None:
        return True
    return await _wait_until(lambda: aggregator.privacy_settled, 20)


def _announce_page(config: DemoConfig, aggregator: Aggregator) -> int | None:
    """The port of the aggregator's live page (printed), or ``None`` when it does not serve."""
    port = aggregator.http_port
    if port is not None:
        progress(config.progress, f"live page: {page_url(port)}")
    return port


async def _wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True
