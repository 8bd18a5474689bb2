"""``coco demo``: the whole pipeline on one machine, devices -> shuffler -> aggregator.

1. **Broker.** ``--broker URL`` > a local Mosquitto > the embedded amqtt broker. With no
   broker URL, a local Mosquitto (``/usr/sbin/mosquitto`` or ``mosquitto`` on ``PATH``) is
   started on a free port from a temporary config (listener on 127.0.0.1, anonymous, no
   persistence, a large queue). Without that binary (or with ``embedded_broker=True``) the
   pure-Python :class:`~sim.embedded_broker.EmbeddedBroker` (amqtt) runs instead: MQTT 3.1.1
   only and about 1.5k messages/s, so the shuffler and the aggregator connect with MQTT
   3.1.1 (their ``mqtt_version`` option) and, unless the fleet
   size was given, the fleet shrinks to :data:`EMBEDDED_DEFAULT_DEVICES`. With a URL, that
   broker is used; every run has its own deployment name, so runs never interfere.
2. **Services.** A :class:`~broker.service.shuffler.Shuffler` and an
   :class:`~aggregator.service.service.Aggregator` run in-process as asyncio tasks, each with its
   own ``CollectorRegistry``; the spec announcement is published retained (and cleared at the end).
3. **Fleet.** :class:`~sim.sensors.SensorFleet` readings are encoded with
   :class:`~edge.encoders.SensorEncoder`, randomised with the batch path
   (:meth:`~edge.LocalMechanism.randomise_sparse`) and each device's 16-byte report is
   published on its own ingress topic, multiplexed over a few MQTT connections (QoS 1). The
   publishers keep at most ``window`` reports in flight between them and the shuffler, so
   the broker's per-client queue (Mosquitto's ``max_queued_messages``) never overflows.
4. **Rounds.** Round ``k`` of the readings is published in the ``k``-th wall-clock round
   of ``round_seconds`` (2 s) from the start; the shuffler releases each round whole, as
   one signed batch, when the round closes.
5. **Live page.** With ``http_port`` set (``coco demo --serve``) one HTTP server on
   127.0.0.1 (``0``: a free port) is bound before the broker starts and lives until the
   caller stops it: the aggregator serves its live page, ``/metrics`` and ``/estimates``
   on it during the run, then the same socket serves the run's final state
   (:meth:`~aggregator.service.http.MetricsServer.serve` swaps what it serves, so no request is
   ever refused in between). The URL is printed and kept in the result. Without it
   nothing listens.
6. **Accounting.** The demo waits until the shuffler has received every report, stops it
   (drain: without a state directory it releases the open round's pool), waits until the
   aggregator has applied every released report, then stops the aggregator.
   ``reports_sent = reports_aggregated + reports_rejected + reports_dropped +
   reports_unaccounted`` where the last term (reports lost at the broker or after a
   timeout) is 0 in a healthy run.

The simulated devices' ids appear only in ingress topics; nothing here logs or prints them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import aiomqtt
import numpy as np
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry

from aggregator.estimation.estimators import AggregateState
from aggregator.page.page_data import Channel
from aggregator.service.config import AggregatorConfig
from aggregator.service.http import MetricsServer, Source
from aggregator.service.service import Aggregator
from broker.core.machine import MAX_BATCH_LIMIT
from broker.service.metrics import DROP_REASONS, REJECT_REASONS
from broker.service.shuffler import Shuffler, ShufflerConfig, parse_broker_url
from edge import CocoError, LocalMechanism, MechanismSpec
from edge.announce import encode_announcement
from edge.batch_auth import BatchSigner
from edge.codec import encode_report
from edge.rounds import current_round, seconds_to_next_round
from edge.topics import ingress_topic, spec_topic
from sim.embedded_broker import EmbeddedBroker, EmbeddedBrokerError
from sim.sensors import SensorFleet, channel_table
from sim.synthetic import sparse_totals

__all__ = [
    "DEFAULT_DEVICES",
    "EMBEDDED_BROKER_KIND",
    "EMBEDDED_DEFAULT_DEVICES",
    "DemoConfig",
    "DemoError",
    "DemoRun",
    "find_mosquitto",
    "run_demo",
    "run_pipeline",
]

DEFAULT_DEVICES = 2000
EMBEDDED_DEFAULT_DEVICES = 1000
"""Fleet size on the embedded broker when none was given: 3 rounds take a few seconds."""
EMBEDDED_BROKER_KIND = "embedded amqtt (MQTT 3.1.1, fallback for small fleets)"
HTTP_HOST = "127.0.0.1"
"""Where the demo's aggregator serves its page (``http_port``): this machine only."""

ReportSink = Callable[[str, int, int, int], None]
"""Called with ``(device_id, round, seed, z)`` for every report before it is published."""


class DemoError(CocoError):
    """The demo cannot run (no broker binary, broker unreachable, services failed)."""


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """Parameters of one demo run.

    Rounds are wall-clock rounds of ``round_seconds`` (:mod:`edge.rounds`): the fleet
    publishes round ``k`` of its readings in the ``k``-th round from its start, and the
    shuffler releases each round whole, as one batch, when it closes (the last one at the
    drain). ``release_size`` (unset by default) would cap a pool's size before its round
    ends.
    """

    devices: int = DEFAULT_DEVICES
    rounds: int = 3
    mechanism: Literal["coco", "collision"] = "coco"
    epsilon: float = 1.0
    channels: int = 6
    s: int = 2
    min_batch: int = 500
    delta: float = 1e-6
    seed: int = 1
    broker: str | None = None
    embedded_broker: bool = False
    """Use the embedded amqtt broker even when Mosquitto is installed (ignored with ``broker``)."""
    auto_devices: bool = False
    """``devices`` was not chosen by the user: the embedded broker may reduce it."""
    connections: int = 4
    window: int = 500
    round_seconds: int = 2
    flush_interval: float = 0.2
    release_size: int | None = None
    timeout: float = 60.0
    http_port: int | None = None
    """Serve the aggregator's live page, ``/metrics`` and ``/estimates`` on 127.0.0.1 at this
    port during the run (``0``: a free one); ``None``: no HTTP server."""
    progress: bool = True
    deployment: str = field(default_factory=lambda: f"demo-{secrets.token_hex(4)}")

    def __post_init__(self) -> None:
        if self.devices < 2 or self.rounds < 1:
            raise ValueError(
                f"need devices >= 2 and rounds >= 1, got {self.devices}, {self.rounds}"
            )
        if not 2 <= self.min_batch <= self.devices:
            raise ValueError(
                f"min_batch must be in [2, devices={self.devices}], got {self.min_batch}"
            )
        if self.connections < 1 or self.window < 1:
            raise ValueError("connections and window must be >= 1")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0, got {self.timeout}")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ValueError(f"http_port must be in [0, 65535], got {self.http_port}")
        if self.broker is not None:
            parse_broker_url(self.broker)

    def spec(self) -> MechanismSpec:
        return MechanismSpec(
            mechanism=self.mechanism, d=self.channels, s=self.s, epsilon=self.epsilon
        )


@dataclass
class DemoRun:
    """What a run leaves behind: the result document and the live objects (for tests)."""

    result: dict[str, Any]
    state: AggregateState
    shuffler_registry: CollectorRegistry
    aggregator_registry: CollectorRegistry
    estimates: dict[str, Any] = field(default_factory=dict)
    """The aggregator's final ``/estimates`` document."""
    http_port: int | None = None
    """The port the aggregator served on during the run (``None``: it did not serve)."""
    server: MetricsServer | None = None
    """With ``http_port``: the run's HTTP server, still serving the final state; stop it."""


# -- the broker -----------------------------------------------------------------------------


def find_mosquitto() -> str | None:
    """Path of a Mosquitto binary, or ``None``."""
    if Path("/usr/sbin/mosquitto").exists():
        return "/usr/sbin/mosquitto"
    return shutil.which("mosquitto")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def local_mosquitto(binary: str) -> Iterator[str]:
    """A throw-away Mosquitto on 127.0.0.1 at a free port; yields its ``mqtt://`` URL."""
    with tempfile.TemporaryDirectory(prefix="coco-demo-") as tmp:
        port = _free_port()
        conf = Path(tmp) / "mosquitto.conf"
        log = Path(tmp) / "mosquitto.log"
        conf.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            f"max_queued_messages 1000000\nlog_dest file {log}\n"
        )
        proc = subprocess.Popen(
            [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        text = log.read_text() if log.exists() else ""
                        raise DemoError(f"mosquitto did not start: {text.strip()}") from None
                    time.sleep(0.05)
            yield f"mqtt://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- helpers --------------------------------------------------------------------------------


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    sample = registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


def _progress(enabled: bool, line: str) -> None:
    if enabled:
        print(line, file=sys.stderr, flush=True)


async def _wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@dataclass
class _Fleet:
    """The simulated devices' side: reports per round and what was sent."""

    config: DemoConfig
    spec: MechanismSpec
    sensors: SensorFleet
    ids: list[str]
    sent: int = 0
    total: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    truth_sum: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))

    def reports(
        self, index: int, round_: int, rng: np.random.Generator
    ) -> list[tuple[str, int, int, int]]:
        """The ``index``-th round of readings, randomised, as reports of ``round_``."""
        readings = self.sensors.readings(index)
        keys, signs = self.sensors.encoder(self.config.s).encode_batch(readings, rng)
        seeds, z = LocalMechanism.from_spec(self.spec).randomise_sparse(keys, signs, rng)
        total, _ = sparse_totals(keys, signs, self.spec.d)
        self.total = total if self.total.size == 0 else self.total + total
        truth = readings.sum(axis=0)
        self.truth_sum = truth if self.truth_sum.size == 0 else self.truth_sum + truth
        return [(self.ids[i], round_, int(seeds[i]), int(z[i])) for i in range(self.config.devices)]

    async def publish_all(
        self,
        clients: list[aiomqtt.Client],
        deployment: str,
        rng: np.random.Generator,
        *,
        in_flight: Callable[[], int],
        sink: ReportSink | None,
    ) -> float:
        """Publish every round's reports; returns the seconds it took."""

        def sent_one() -> None:
            self.sent += 1

        start = time.monotonic()
        length = self.config.round_seconds
        for index in range(self.config.rounds):
            if index:  # the next wall-clock round: one report per device per round
                await asyncio.sleep(seconds_to_next_round(length) + 0.01)
            reports = self.reports(index, current_round(length), rng)
            if sink is not None:
                for report in reports:
                    sink(*report)
            await _publish_round(
                clients,
                deployment,
                self.spec.fingerprint_int,
                reports,
                in_flight=in_flight,
                window=self.config.window,
                on_sent=sent_one,
            )
        return time.monotonic() - start


async def _publish_round(
    clients: list[aiomqtt.Client],
    deployment: str,
    fingerprint: int,
    reports: list[tuple[str, int, int, int]],
    *,
    in_flight: Callable[[], int],
    window: int,
    on_sent: Callable[[], None],
) -> None:
    """Each report on its device's ingress topic, spread over ``clients`` (QoS 1)."""

    async def worker(k: int) -> None:
        client = clients[k]
        pending: set[asyncio.Task[None]] = set()
        for device, round_, seed, z in reports[k :: len(clients)]:
            while in_flight() >= window:  # backpressure: keep the broker queue short
                await asyncio.sleep(0.005)
            payload = encode_report(fingerprint, round_, seed, z)
            task = asyncio.create_task(
                client.publish(ingress_topic(deployment, device), payload, qos=1, timeout=30)
            )
            task.add_done_callback(lambda _t: on_sent())
            pending.add(task)
            task.add_done_callback(pending.discard)
            if len(pending) >= 100:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if pending:
            await asyncio.gather(*pending)

    async with asyncio.TaskGroup() as tg:
        for k in range(len(clients)):
            tg.create_task(worker(k), name=f"demo-publisher-{k}")


@contextlib.asynccontextmanager
async def _connections(url: str, count: int) -> AsyncIterator[list[aiomqtt.Client]]:
    host, port, _ = parse_broker_url(url)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            aiomqtt.Client(host, port, timeout=30, max_inflight_messages=100) for _ in range(count)
        ]
        for client in clients:
            client.pending_calls_threshold = 1_000  # many publishes in flight is the plan
            await stack.enter_async_context(client)
        yield clients


# -- the run --------------------------------------------------------------------------------


def _embedded_config(config: DemoConfig) -> tuple[DemoConfig, str | None]:
    """The config for the embedded broker, and a note when the fleet was reduced."""
    if not config.auto_devices or config.devices <= EMBEDDED_DEFAULT_DEVICES:
        return config, None
    devices = EMBEDDED_DEFAULT_DEVICES
    reduced = replace(
        config,
        devices=devices,
        min_batch=min(config.min_batch, devices),
        release_size=None if config.release_size is None else min(config.release_size, devices),
    )
    note = (
        f"fleet reduced from {config.devices} to {devices} devices for the embedded broker "
        f"(about 1.5k messages/s); pass --devices to choose, or install mosquitto"
    )
    return reduced, note


async def run_pipeline(config: DemoConfig, *, on_report: ReportSink | None = None) -> DemoRun:
    """Run the demo; ``on_report`` sees every report the fleet publishes.

    Broker: ``config.broker`` > a local Mosquitto > the embedded amqtt broker.

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
        run = await _run_on_a_broker(config, on_report, server)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    if server is not None:
        final = run.estimates
        server.serve(Source(run.aggregator_registry, lambda: final))
        run.server = server
    return run


async def _run_on_a_broker(
    config: DemoConfig, on_report: ReportSink | None, server: MetricsServer | None
) -> DemoRun:
    if config.broker is not None:
        return await _run(config, config.broker, "external", on_report, server=server)
    binary = None if config.embedded_broker else find_mosquitto()
    if binary is not None:
        with local_mosquitto(binary) as url:
            return await _run(config, url, f"local mosquitto ({binary})", on_report, server=server)
    config, note = _embedded_config(config)
    if note is not None:
        _progress(config.progress, note)
    try:
        broker = EmbeddedBroker()
        async with broker:
            run = await _run(
                config, broker.url, EMBEDDED_BROKER_KIND, on_report, mqtt5=False, server=server
            )
    except EmbeddedBrokerError as exc:
        raise DemoError(
            f"no broker: mosquitto is not installed (apt-get install mosquitto), no --broker "
            f"mqtt://host:port was given and the embedded broker failed: {exc}"
        ) from exc
    if note is not None:
        run.result["note"] = note
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
        ),
        registry=CollectorRegistry(),
        http=server,
    )
    return shuffler, aggregator, signer


def sensor_channels(count: int) -> tuple[Channel, ...]:
    """The live page's channels of the sensor model with ``count`` channels: names, units
    and ranges (:func:`sim.sensors.channel_table`), nothing about any device."""
    return tuple(Channel(ch.name, ch.unit, ch.lo, ch.hi) for ch in channel_table(count))


def _status_line(fleet: _Fleet, shuffler: Shuffler, aggregator: Aggregator) -> str:
    """One progress line: sent, shuffler counters, aggregated n and the epsilon_central."""
    registry = shuffler.metrics.registry
    eps = aggregator.snapshot().get("epsilon_central", {})
    small, latest = eps.get("smallest"), eps.get("latest")
    return (
        f"sent {fleet.sent}/{fleet.config.devices * fleet.config.rounds}  shuffler: received "
        f"{int(_value(registry, 'coco_shuffler_reports_received_total'))}, buffered "
        f"{shuffler.buffered}, batches "
        f"{int(_value(registry, 'coco_shuffler_batches_released_total'))}  "
        f"aggregator: n={aggregator.state.n}, epsilon_central (certified) "
        f"smallest batch={'-' if small is None else f'{small:.4g}'} "
        f"latest batch={'-' if latest is None else f'{latest:.4g}'}"
    )


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
    _progress(config.progress, f"broker: {broker_kind} at {url}; deployment {dep}")
    shuffler, aggregator, signer = _services(config, url, spec, mqtt5=mqtt5, server=server)
    shuffler_registry = shuffler.metrics.registry
    fleet = _Fleet(
        config=config,
        spec=spec,
        sensors=SensorFleet(n_devices=config.devices, channels=config.channels, seed=config.seed),
        ids=[f"sensor-{secrets.token_hex(6)}" for _ in range(config.devices)],
    )
    rng = np.random.default_rng(np.random.SeedSequence(config.seed).spawn(3)[2])

    def received() -> int:
        return int(_value(shuffler_registry, "coco_shuffler_reports_received_total"))

    def status() -> str:
        return _status_line(fleet, shuffler, aggregator)

    async def reporter() -> None:
        while True:
            await asyncio.sleep(1.0)
            _progress(config.progress, status())

    start = time.monotonic()
    publish_seconds, unaccounted_wait = 0.0, False
    try:
        async with (
            asyncio.timeout(config.timeout),
            aggregator,
            shuffler,
            _connections(url, config.connections) as clients,
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
                released = int(_value(shuffler_registry, "coco_shuffler_reports_released_total"))
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
    _progress(config.progress, status())
    result = _result(
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
        _progress(config.progress, f"live page: {page_url(port)}")
    return port


def page_url(port: int) -> str:
    """The live page of an aggregator serving on :data:`HTTP_HOST` at ``port``."""
    return f"http://{HTTP_HOST}:{port}/"


def _result(
    *,
    config: DemoConfig,
    spec: MechanismSpec,
    fleet: _Fleet,
    aggregator: Aggregator,
    registry: CollectorRegistry,
    broker_kind: str,
    url: str,
    publish_seconds: float,
    http_port: int | None,
) -> dict[str, Any]:
    rejected = {
        r: int(_value(registry, "coco_shuffler_reports_rejected_total", reason=r))
        for r in REJECT_REASONS
    }
    dropped = {
        r: int(_value(registry, "coco_shuffler_dropped_total", reason=r)) for r in DROP_REASONS
    }
    buffered = int(_value(registry, "coco_shuffler_buffer_reports")) + int(
        _value(registry, "coco_shuffler_outbox_reports")
    )
    state = aggregator.state
    n = state.n
    agg_rejected_batches = sum(aggregator.counters.rejected.values())
    accounted = n + sum(rejected.values()) + sum(dropped.values()) + buffered
    est = state.estimate()
    encoder = fleet.sensors.encoder(config.s)
    sent = fleet.sent
    xbar = fleet.total / max(sent, 1)
    mse = float(np.sum((est.mean - xbar) ** 2)) if n else math.nan
    mse_theory = spec.moments.mean_mse(spec.d, spec.s) / n if n else math.nan
    value, se = encoder.decode_mean(est.mean, est.mean_se, n=n)
    truth = fleet.truth_sum / max(sent, 1)
    smallest = aggregator.smallest_batch
    privacy = aggregator.ledger.compute(aggregator.ledger.snapshot())  # the one accountant call
    channels = [
        {
            "name": ch.name,
            "unit": ch.unit,
            "estimate": None if not n else float(value[j]),
            "ci95_halfwidth": None if not n else float(1.96 * se[j]),
            "ground_truth": float(truth[j]),
        }
        for j, ch in enumerate(fleet.sensors.channel_specs)
    ]
    return {
        "broker": f"{broker_kind} at {url}",
        "deployment": config.deployment,
        "mechanism": spec.mechanism,
        "d": spec.d,
        "s": spec.s,
        "t": spec.t,
        "devices": config.devices,
        "rounds": config.rounds,
        "faulty_devices": fleet.sensors.faulty_devices,
        "min_batch": config.min_batch,
        "reports_sent": sent,
        "reports_aggregated": n,
        "reports_rejected": sum(rejected.values()),
        "reports_rejected_by_reason": {k: v for k, v in rejected.items() if v},
        "reports_dropped": sum(dropped.values()),
        "reports_dropped_by_reason": {k: v for k, v in dropped.items() if v},
        "reports_buffered": buffered,
        "reports_unaccounted": sent - accounted,
        "batches": aggregator.counters.batches,
        "batches_rejected": agg_rejected_batches,
        "batch_size_smallest": smallest,
        "n": n,
        "epsilon_local": spec.epsilon,
        "epsilon_local_effective": spec.epsilon_effective,
        "epsilon_central": privacy.epsilon_central["smallest"],
        "epsilon_central_generic": privacy.epsilon_central_generic["smallest"],
        "epsilon_central_certified": True,
        "epsilon_total": privacy.epsilon_total,
        "epsilon_total_batches": privacy.batches,
        "delta": config.delta,
        "mse_mean": mse,
        "mse_mean_theory": mse_theory,
        "mse_mean_note": (
            "sum over channels of squared errors of the ternary-vector means (estimate vs the "
            "realised mean of the encoded vectors sent); theory = closed form / n"
        ),
        "channels": channels,
        "ground_truth_note": "simulation only: the exact fleet mean of the readings",
        "throughput_reports_per_s": sent / publish_seconds if publish_seconds > 0 else None,
        **({} if http_port is None else {"url": page_url(http_port)}),
    }


def format_table(result: dict[str, Any]) -> str:
    """The result as a table for people."""
    lines = [
        f"broker: {result['broker']}",
        *([f"note: {result['note']}"] if result.get("note") else []),
        f"{result['mechanism']} d={result['d']} s={result['s']} t={result['t']}: "
        f"{result['devices']} devices x {result['rounds']} rounds "
        f"({result['faulty_devices']} with a stuck channel)",
        "",
        f"{'channel':<12} {'unit':<6} {'estimate':>12} {'+- 1.96 SE':>11} "
        f"{'truth (sim)':>12} {'error':>10}",
    ]
    for ch in result["channels"]:
        est, half, truth = ch["estimate"], ch["ci95_halfwidth"], ch["ground_truth"]
        if est is None:
            lines.append(f"{ch['name']:<12} {ch['unit']:<6} {'n/a':>12}")
            continue
        lines.append(
            f"{ch['name']:<12} {ch['unit']:<6} {est:>12.4g} {half:>11.3g} {truth:>12.4g} "
            f"{est - truth:>10.3g}"
        )
    eps_c, eps_t = result["epsilon_central"], result["epsilon_total"]
    lines += [
        "",
        f"reports: sent {result['reports_sent']}, aggregated {result['reports_aggregated']}, "
        f"rejected {result['reports_rejected']}, dropped {result['reports_dropped']}"
        f"{' ' + str(result['reports_dropped_by_reason']) if result['reports_dropped'] else ''}, "
        f"buffered {result['reports_buffered']}, "
        f"unaccounted {result['reports_unaccounted']}",
        f"batches: {result['batches']} (smallest {result['batch_size_smallest']}, "
        f"min_batch {result['min_batch']})",
        f"MSE of the ternary means (sum over channels): {result['mse_mean']:.4g}  "
        f"closed form {result['mse_mean_theory']:.4g}",
        f"epsilon_local {result['epsilon_local']:g}  epsilon_central (certified, smallest "
        f"batch) {'n/a' if eps_c is None else f'{eps_c:.4g}'}  delta {result['delta']:g}",
        f"epsilon_total (a device in all {result['epsilon_total_batches']} rounds) "
        f"{'n/a' if eps_t is None else f'{eps_t:.4g}'}",
        f"throughput: {result['throughput_reports_per_s'] or 0:.0f} reports/s published",
        *([f"live page: {result['url']}"] if result.get("url") else []),
    ]
    return "\n".join(lines)
