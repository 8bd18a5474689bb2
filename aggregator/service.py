"""The aggregator service: shuffled batches in, streaming estimates and metrics out.

:class:`Aggregator` subscribes (QoS 1) to ``coco/v1/<deployment>/batches``, checks every
batch (wire format, fingerprint of the spec in force, ``z < t``, seeds, non-empty; the codec
checks that the length matches the count) and folds the valid ones into an
:class:`~aggregator.estimators.AggregateState`. Rejections are counted by reason and never
stop the service. The certified central epsilon is computed with
:func:`~aggregator.accountant.amplify_spec` for the smallest batch seen (the guarantee every
report has) and for the latest batch, cached per batch size.

The aggregator is trusted with nothing beyond what it receives: it sees only shuffled,
locally randomised reports, never a device id. Its duty is accounting: every batch counted
exactly once, none lost.

Exactly once, across crashes
----------------------------
Each batch carries a random 16-byte ``batch_id``. The service keeps the ids it has applied
(the most recent ``seen_capacity`` of them) and ignores a batch whose id it knows, counting
it in ``coco_aggregator_batches_duplicate_total``. The ids are written in the *same*
checkpoint file as the sums they went into, atomically (temporary file, ``fsync``,
``os.replace``), so a checkpoint never holds a batch's reports without its id or the other
way round.

Delivery is MQTT QoS 1 over a **persistent session** (MQTT 5, a fixed client id,
``clean_start=False`` and a session expiry interval) with **manual acknowledgement**: the
PUBACK of a batch is sent only after a checkpoint containing it is on disk. Hence:

* crash after apply, before the checkpoint: the batch is neither in the checkpoint nor
  acknowledged; on restart the service resumes from the older checkpoint and the broker
  redelivers the batch, which is applied once;
* crash after the checkpoint, before the PUBACK: the broker redelivers, the id is in the
  checkpoint, the batch is counted as a duplicate and acknowledged;
* batches published while the service is down are queued in its session and delivered on
  reconnection.

Retained messages were rejected: only the last message per topic is retained, so batches
published while the service is down would be lost. Unacknowledged batches count against the
broker's in-flight window (Mosquitto's ``max_inflight_messages``, 20 by default), so the
service checkpoints when ``max_unacked`` batches are waiting for their PUBACK, as well as
every ``checkpoint_interval`` seconds and on shutdown. Without a checkpoint path batches
are acknowledged as soon as they are applied (at-most-once across a crash).

What a broker cannot give back is out of scope: a Mosquitto restarted without persistence
forgets sessions and queued batches (run it with ``persistence true`` in production); the
service reconnects with exponential backoff and resubscribes either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import ssl
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client import CollectorRegistry

from aggregator.accountant import amplify_spec
from aggregator.batch_codec import decode_batch_arrays
from aggregator.estimators import AggregateState
from aggregator.metrics import (
    AggregatorMetrics,
    MetricsServer,
    epsilon_curve,
    epsilon_curve_grid,
)
from edge import mqtt_url, topics
from edge.announce import decode_announcement
from edge.codec import CodecError
from edge.errors import CocoError, ReportError, SpecError
from edge.spec import MechanismSpec

logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
DEFAULT_METRICS_DIMS = 16
MAX_METRICS_DIMS = 1024


class CheckpointError(CocoError):
    """A checkpoint that cannot be read, or that belongs to another spec."""


class _RejectedError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def mqtt_connection(
    broker: str,
    *,
    username: str | None = None,
    password: str | None = None,
    ca_file: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments of :class:`aiomqtt.Client` for ``broker`` (``mqtt://`` or
    ``mqtts://``, :func:`edge.mqtt_url.parse_broker_url`): address, credentials, and for
    ``mqtts://`` a verifying TLS context (``ca_file``, or the system's CA store)."""
    address = mqtt_url.parse_broker_url(broker)
    kwargs: dict[str, Any] = {
        "hostname": address.host,
        "port": address.port,
        "username": username,
        "password": password,
    }
    if address.tls:
        kwargs["tls_context"] = ssl.create_default_context(cafile=ca_file)
    return kwargs


@dataclass(frozen=True, kw_only=True)
class AggregatorConfig:
    """Everything the service needs; ``metrics_dims`` is a count (the first ``k``
    dimensions) or an explicit list, at most :data:`MAX_METRICS_DIMS` of them."""

    broker: str
    deployment: str
    spec: MechanismSpec
    delta: float
    checkpoint: Path | None = None
    checkpoint_interval: float = 10.0
    metrics_dims: int | Sequence[int] = DEFAULT_METRICS_DIMS
    http_host: str = "127.0.0.1"
    http_port: int | None = 9108
    """``None`` disables the HTTP endpoint; ``0`` picks a free port."""
    client_id: str | None = None
    """MQTT client id of the persistent session; default ``coco-aggregator-<deployment>``."""
    session_expiry: int = 7 * 24 * 3600
    mqtt_version: Literal["5", "3.1.1"] = "5"
    """MQTT 3.1.1 is for brokers without MQTT 5 (the demo's embedded amqtt): the persistent
    session is then ``clean_session=False`` with no expiry interval."""
    max_unacked: int = 10
    seen_capacity: int = 100_000
    confidence: float = 0.95
    reconnect_min: float = 0.1
    reconnect_max: float = 10.0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    """CA bundle that verifies an ``mqtts://`` broker (default: the system's)."""
    min_batch: int | None = None
    """The announced ``min_batch``: first point of ``coco_aggregator_epsilon_central_curve``
    (:func:`~aggregator.metrics.epsilon_curve_grid`); ``None`` starts the curve at 100."""
    epsilon_target: float | None = None
    """Exported as ``coco_aggregator_epsilon_target`` for dashboards; ``None`` exports
    nothing (no target line is drawn). It changes nothing in the service's behaviour."""
    exported_dims: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        mqtt_url.parse_broker_url(self.broker)
        topics.check_name("deployment", self.deployment)
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if not self.checkpoint_interval > 0:
            raise ValueError(f"checkpoint_interval must be > 0, got {self.checkpoint_interval}")
        if self.max_unacked < 1:
            raise ValueError(f"max_unacked must be >= 1, got {self.max_unacked}")
        if self.seen_capacity < 1:
            raise ValueError(f"seen_capacity must be >= 1, got {self.seen_capacity}")
        if not 0 < self.reconnect_min <= self.reconnect_max:
            raise ValueError(
                f"need 0 < reconnect_min <= reconnect_max, got {self.reconnect_min}, "
                f"{self.reconnect_max}"
            )
        if self.min_batch is not None and self.min_batch < 1:
            raise ValueError(f"min_batch must be >= 1, got {self.min_batch}")
        if self.epsilon_target is not None and not (
            math.isfinite(self.epsilon_target) and self.epsilon_target > 0
        ):
            raise ValueError(f"epsilon_target must be finite and > 0, got {self.epsilon_target}")
        if isinstance(self.metrics_dims, int):
            if self.metrics_dims < 0:
                raise ValueError(f"metrics_dims must be >= 0, got {self.metrics_dims}")
            dims = tuple(range(min(self.metrics_dims, self.spec.d)))
        else:
            dims = tuple(sorted({int(j) for j in self.metrics_dims}))
            if dims and (dims[0] < 0 or dims[-1] >= self.spec.d):
                raise ValueError(f"metrics_dims must be in [0, {self.spec.d}), got {dims}")
        if len(dims) > MAX_METRICS_DIMS:
            raise ValueError(f"at most {MAX_METRICS_DIMS} metrics_dims, got {len(dims)}")
        object.__setattr__(self, "exported_dims", dims)

    @property
    def mqtt_client_id(self) -> str:
        return self.client_id or f"coco-aggregator-{self.deployment}"


def estimates_document(
    state: AggregateState,
    *,
    delta: float,
    smallest_batch: int | None,
    latest_batch: int | None,
    confidence: float = 0.95,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``/estimates`` JSON (also ``coco aggregator snapshot --checkpoint``)."""

    def eps(n: int | None) -> float | None:
        return None if n is None else amplify_spec(state.spec, n=n, delta=delta).epsilon_central

    return {
        "spec": state.spec.to_dict(),
        "n": state.n,
        "estimates": state.estimate(confidence=confidence).to_dict(),
        "epsilon_local": state.spec.epsilon,
        "epsilon_central": {"smallest": eps(smallest_batch), "latest": eps(latest_batch)},
        "batch_size": {"smallest": smallest_batch, "latest": latest_batch},
        "delta": delta,
        **(extra or {}),
    }


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The parsed checkpoint at ``path`` (:class:`CheckpointError` if unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path} is not a version-{CHECKPOINT_VERSION} checkpoint")
    return data


def snapshot_from_checkpoint(path: Path, *, confidence: float = 0.95) -> dict[str, Any]:
    """Offline ``/estimates`` document of a checkpoint file."""
    data = read_checkpoint(path)
    try:
        state = AggregateState.from_dict(data["state"])
        return estimates_document(
            state,
            delta=float(data["delta"]),
            smallest_batch=data["smallest_batch"],
            latest_batch=data["latest_batch"],
            confidence=confidence,
            extra={"checkpoint": str(path), "counters": data["counters"]},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} is malformed: {exc}") from exc


async def fetch_announcement(
    broker: str,
    deployment: str,
    *,
    timeout: float = 10.0,
    username: str | None = None,
    password: str | None = None,
    ca_file: str | None = None,
) -> dict[str, Any]:
    """The retained spec announcement of ``deployment`` (:func:`decode_announcement`)."""
    connection = mqtt_connection(broker, username=username, password=password, ca_file=ca_file)
    try:
        async with (
            asyncio.timeout(timeout),
            aiomqtt.Client(**connection, timeout=timeout) as client,
        ):
            await client.subscribe(topics.spec_topic(deployment), qos=1)
            async for message in client.messages:
                payload = message.payload
                if isinstance(payload, bytes | bytearray):
                    return decode_announcement(bytes(payload))
                raise SpecError("the spec announcement is not a binary payload")
    except TimeoutError:
        raise SpecError(
            f"no retained spec announcement on {topics.spec_topic(deployment)} within {timeout:g} s"
        ) from None
    except aiomqtt.MqttError as exc:
        raise CocoError(f"cannot read the spec announcement from {broker}: {exc}") from exc
    raise SpecError("the broker closed the announcement subscription")  # pragma: no cover


@dataclass
class _Counters:
    reports: int = 0
    batches: int = 0
    duplicates: int = 0
    rejected: dict[str, int] = field(default_factory=dict)


class Aggregator:
    """Async context manager around the service; ``await run()`` until cancelled.

    Entering loads the checkpoint (if any) and starts the HTTP endpoint; leaving writes a
    final checkpoint and stops it. Reusable, not re-entrant.
    """

    def __init__(self, config: AggregatorConfig, *, registry: CollectorRegistry | None = None):
        self.config = config
        self.spec = config.spec
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = AggregatorMetrics(
            self.registry,
            spec=self.spec,
            dims=config.exported_dims,
            epsilon_target=config.epsilon_target,
        )
        self.metrics.delta.set(config.delta)
        self.state = AggregateState(self.spec)
        self.counters = _Counters()
        self.smallest_batch: int | None = None
        self.latest_batch: int | None = None
        self.last_batch_timestamp: float | None = None
        self.subscribed = asyncio.Event()
        """Set while subscribed to the batches topic (for tests and health checks)."""
        self.connections = 0
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._eps_cache: dict[int, float] = {}
        self._pending: list[tuple[paho.Client, int, int]] = []
        self._dirty = False
        self._last_checkpoint = time.monotonic()
        self._checkpoint_lock = asyncio.Lock()
        self._entered = False
        self._http: MetricsServer | None = None
        self._document: dict[str, Any] = {}

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._entered:
            raise RuntimeError("the Aggregator is reusable, but not re-entrant")
        self._entered = True
        try:
            if self.config.checkpoint is not None and self.config.checkpoint.exists():
                self._restore(read_checkpoint(self.config.checkpoint))
            self._publish_estimates()
            if self.config.http_port is not None:
                self._http = MetricsServer(
                    host=self.config.http_host,
                    port=self.config.http_port,
                    registry=self.registry,
                    estimates=lambda: self._document,
                )
                self._http.start()
        except BaseException:
            self._entered = False
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await asyncio.shield(self.checkpoint())
        finally:
            if self._http is not None:
                self._http.stop()
                self._http = None
            self._entered = False

    @property
    def http_port(self) -> int | None:
        return None if self._http is None else self._http.port

    def snapshot(self) -> dict[str, Any]:
        """The current ``/estimates`` document."""
        return self._document

    async def run(self) -> None:
        """Consume batches (reconnecting as needed) and checkpoint, until cancelled."""
        if not self._entered:
            raise RuntimeError("use 'async with Aggregator(config) as agg: await agg.run()'")
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._mqtt_loop(), name="coco-aggregator-mqtt")
            tasks.create_task(self._checkpoint_loop(), name="coco-aggregator-checkpoint")
            tasks.create_task(self._export_epsilon_curve(), name="coco-aggregator-eps-curve")

    async def _export_epsilon_curve(self) -> None:
        """Compute the certified epsilon curve once, in a thread (about 0.5 s in all)."""
        grid = epsilon_curve_grid(self.config.min_batch)
        try:
            curve = await asyncio.to_thread(
                epsilon_curve, self.spec, delta=self.config.delta, grid=grid
            )
        except (ArithmeticError, ValueError):  # a dashboard curve must not stop the service
            logger.exception("cannot compute the epsilon_central curve; not exported")
            return
        self.metrics.set_epsilon_curve(curve)
        for n, epsilon in curve.items():  # same function, same values: share the cache
            self._eps_cache.setdefault(n, epsilon)

    # -- MQTT ------------------------------------------------------------------------------

    def _client(self) -> aiomqtt.Client:
        cfg = self.config
        connection = mqtt_connection(
            cfg.broker, username=cfg.username, password=cfg.password, ca_file=cfg.ca_file
        )
        if self.config.mqtt_version == "3.1.1":
            client = aiomqtt.Client(
                **connection,
                identifier=self.config.mqtt_client_id,
                protocol=aiomqtt.ProtocolVersion.V311,
                clean_session=False,
                keepalive=30,
                timeout=10,
            )
        else:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = self.config.session_expiry
            client = aiomqtt.Client(
                **connection,
                identifier=self.config.mqtt_client_id,
                protocol=aiomqtt.ProtocolVersion.V5,
                clean_start=False,
                properties=properties,
                keepalive=30,
                timeout=10,
            )
        # aiomqtt 2.x does not expose paho's manual acknowledgement; the PUBACK must wait for
        # the checkpoint (module docs), so switch it on in the underlying paho client.
        client._client.manual_ack_set(True)
        return client

    async def _mqtt_loop(self) -> None:
        delay = self.config.reconnect_min
        topic = topics.batches_topic(self.config.deployment)
        while True:
            client = self._client()
            paho_client = client._client
            try:
                async with client:
                    await client.subscribe(topic, qos=1)
                    self.connections += 1
                    self.subscribed.set()
                    logger.info("subscribed to %s at %s", topic, self.config.broker)
                    delay = self.config.reconnect_min
                    try:
                        async for message in client.messages:
                            await self._on_message(paho_client, message)
                    except asyncio.CancelledError:
                        # Shutdown: checkpoint and send the PUBACKs while still connected.
                        await asyncio.shield(self.checkpoint())
                        raise
            except aiomqtt.MqttError as exc:
                logger.warning("broker connection lost (%s); reconnecting in %.2f s", exc, delay)
            finally:
                self.subscribed.clear()
                # PUBACKs cannot cross connections; the broker redelivers those batches and
                # the seen ids turn them into acknowledged duplicates.
                self._pending = [p for p in self._pending if p[0] is not paho_client]
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2 * delay, self.config.reconnect_max)

    async def _on_message(self, paho_client: paho.Client, message: aiomqtt.Message) -> None:
        payload = message.payload
        data = bytes(payload) if isinstance(payload, bytes | bytearray) else b""
        await self.handle_batch(data)
        if message.qos > 0:
            self._pending.append((paho_client, message.mid, message.qos))
        if self.config.checkpoint is None:
            self._flush_acks(list(self._pending))
        elif len(self._pending) >= self.config.max_unacked:
            await self.checkpoint()

    async def handle_batch(self, payload: bytes) -> str:
        """Check and apply one batch; ``"applied"``, ``"duplicate"`` or the reject reason."""
        try:
            batch_id, partial = await self._check(payload)
        except _RejectedError as rejected:
            reason = rejected.reason
            self.counters.rejected[reason] = self.counters.rejected.get(reason, 0) + 1
            self.metrics.rejected.labels(reason=reason).inc()
            self._dirty = True
            logger.warning("rejected a batch: %s", reason)
            return reason
        if partial is None or batch_id in self._seen:
            self.counters.duplicates += 1
            self.metrics.duplicates.inc()
            self._dirty = True
            logger.info("ignored a redelivered batch %s", batch_id.hex())
            return "duplicate"
        # From here to the end, no await: the sums and the id change together.
        self.state.merge(partial)
        self._remember(batch_id)
        size = partial.n
        self.counters.reports += size
        self.counters.batches += 1
        self.metrics.reports.inc(size)
        self.metrics.batches.inc()
        self.smallest_batch = (
            size if self.smallest_batch is None else min(self.smallest_batch, size)
        )
        self.latest_batch = size
        self.last_batch_timestamp = time.time()
        self.metrics.last_batch.set(self.last_batch_timestamp)
        self._dirty = True
        self._publish_estimates()
        return "applied"

    async def _check(self, payload: bytes) -> tuple[bytes, AggregateState | None]:
        try:
            fingerprint, _round, batch_id, seeds, z = decode_batch_arrays(payload)
        except CodecError as exc:
            raise _RejectedError(exc.reason) from None
        if fingerprint != self.spec.fingerprint_int:
            raise _RejectedError("fingerprint_mismatch")
        if seeds.size == 0:
            raise _RejectedError("empty")
        if batch_id in self._seen:
            return batch_id, None
        partial = AggregateState(self.spec)
        try:
            await asyncio.to_thread(partial.add, seeds, z)  # numpy releases the GIL
        except ReportError as exc:
            raise _RejectedError(exc.reason) from None
        return batch_id, partial

    def _remember(self, batch_id: bytes) -> None:
        self._seen[batch_id] = None
        while len(self._seen) > self.config.seen_capacity:
            self._seen.popitem(last=False)

    def _epsilon(self, n: int | None) -> float | None:
        if n is None:
            return None
        if n not in self._eps_cache:
            if len(self._eps_cache) > 4096:
                self._eps_cache.clear()
            self._eps_cache[n] = amplify_spec(
                self.spec, n=n, delta=self.config.delta
            ).epsilon_central
        return self._eps_cache[n]

    def _publish_estimates(self) -> None:
        estimates = self.state.estimate(confidence=self.config.confidence)
        self.metrics.set_estimates(estimates)
        eps_small = self._epsilon(self.smallest_batch)
        eps_latest = self._epsilon(self.latest_batch)
        self.metrics.set_epsilon(smallest=eps_small, latest=eps_latest)
        self.metrics.set_batch_size(smallest=self.smallest_batch, latest=self.latest_batch)
        self._document = {
            "deployment": self.config.deployment,
            "spec": self.spec.to_dict(),
            "n": self.state.n,
            "estimates": estimates.to_dict(),
            "epsilon_local": self.spec.epsilon,
            "epsilon_central": {"smallest": eps_small, "latest": eps_latest},
            "batch_size": {"smallest": self.smallest_batch, "latest": self.latest_batch},
            "delta": self.config.delta,
            "counters": self._counters_dict(),
            "last_batch_timestamp": self.last_batch_timestamp,
        }

    def _flush_acks(self, pending: list[tuple[paho.Client, int, int]]) -> None:
        for paho_client, mid, qos in pending:
            paho_client.ack(mid, qos)  # an error means the connection is gone: redelivered
        done = {id(p) for p in pending}
        self._pending = [p for p in self._pending if id(p) not in done]

    # -- checkpoints -----------------------------------------------------------------------

    def _counters_dict(self) -> dict[str, Any]:
        c = self.counters
        return {
            "reports": c.reports,
            "batches": c.batches,
            "duplicates": c.duplicates,
            "rejected": dict(sorted(c.rejected.items())),
        }

    def _checkpoint_dict(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION,
            "fingerprint": self.spec.fingerprint,
            "deployment": self.config.deployment,
            "delta": self.config.delta,
            "state": self.state.to_dict(),
            "seen": [batch_id.hex() for batch_id in self._seen],
            "counters": self._counters_dict(),
            "smallest_batch": self.smallest_batch,
            "latest_batch": self.latest_batch,
            "last_batch_timestamp": self.last_batch_timestamp,
            "written_at": time.time(),
        }

    async def checkpoint(self) -> None:
        """Write the checkpoint (if configured and anything changed), then send the PUBACKs
        of the batches it covers."""
        async with self._checkpoint_lock:
            path = self.config.checkpoint
            pending = list(self._pending)
            if path is None:
                self._flush_acks(pending)
                return
            if self._dirty:
                # Snapshot and pending list are taken together, with no await in between.
                text = json.dumps(self._checkpoint_dict(), separators=(",", ":"))
                self._dirty = False
                write = asyncio.ensure_future(asyncio.to_thread(_write_atomically, path, text))
                try:
                    await asyncio.shield(write)
                except asyncio.CancelledError:
                    # A thread cannot be cancelled: keep the lock until the file is complete,
                    # so the final checkpoint of a shutdown neither races this write nor
                    # skips a write that failed.
                    await asyncio.wait([write])
                    if write.exception() is not None:
                        self._dirty = True
                    raise
                except OSError:
                    self._dirty = True
                    logger.exception(
                        "cannot write checkpoint %s; batches stay unacknowledged", path
                    )
                    return
                logger.debug("checkpoint written: n=%d", self.state.n)
            self._last_checkpoint = time.monotonic()
            self._flush_acks(pending)

    async def _checkpoint_loop(self) -> None:
        interval = self.config.checkpoint_interval
        while True:
            await asyncio.sleep(max(0.0, self._last_checkpoint + interval - time.monotonic()))
            if time.monotonic() - self._last_checkpoint >= interval:
                await self.checkpoint()

    def _restore(self, data: dict[str, Any]) -> None:
        path = self.config.checkpoint
        if data.get("fingerprint") != self.spec.fingerprint:
            raise CheckpointError(
                f"checkpoint {path} is for spec {data.get('fingerprint')}, not "
                f"{self.spec.fingerprint}; move it away or run with its spec"
            )
        try:
            state = AggregateState.from_dict(data["state"])
            if state.spec.canonical() != self.spec.canonical():
                raise CheckpointError(f"checkpoint {path} state is for another spec")
            seen = [bytes.fromhex(h) for h in data["seen"]]
            counters = data["counters"]
            restored = _Counters(
                reports=int(counters["reports"]),
                batches=int(counters["batches"]),
                duplicates=int(counters["duplicates"]),
                rejected={str(k): int(v) for k, v in counters["rejected"].items()},
            )
            smallest, latest = data["smallest_batch"], data["latest_batch"]
            last = data["last_batch_timestamp"]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint {path} is malformed: {exc}") from exc
        self.state = state
        self._seen = OrderedDict.fromkeys(seen[-self.config.seen_capacity :])
        self.counters = restored
        self.smallest_batch = None if smallest is None else int(smallest)
        self.latest_batch = None if latest is None else int(latest)
        self.last_batch_timestamp = None if last is None else float(last)
        self.metrics.reports.inc(restored.reports)
        self.metrics.batches.inc(restored.batches)
        self.metrics.duplicates.inc(restored.duplicates)
        for reason, count in restored.rejected.items():
            self.metrics.rejected.labels(reason=reason).inc(count)
        if self.last_batch_timestamp is not None:
            self.metrics.last_batch.set(self.last_batch_timestamp)
        logger.info("resumed from %s: n=%d, %d batches", path, state.n, restored.batches)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):  # make the rename durable where directories open
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


async def run_aggregator(
    config: AggregatorConfig, *, registry: CollectorRegistry | None = None
) -> None:
    """``async with Aggregator(config) as agg: await agg.run()``."""
    async with Aggregator(config, registry=registry) as aggregator:
        await aggregator.run()
