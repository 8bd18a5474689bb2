"""The shuffling bridge: per-device ingress reports in, uniformly permuted batches out.

Devices publish 16-byte eps-LDP reports to ``coco/v1/<dep>/ingress/<device-id>``. The
:class:`Shuffler` subscribes to ``coco/v1/<dep>/ingress/+`` (and to nothing else), validates
each report, buffers ``(seed, z)`` per round and publishes shuffled batches of at least
``min_batch`` reports to ``coco/v1/<dep>/batches``. Privacy rests on four properties, each
enforced here:

1. **No batch smaller than** ``min_batch``. Every release path (size trigger, flush tick,
   shutdown, splitting of large pools) checks it; a pool that cannot reach it is carried or
   dropped, never released.
2. **No sender identity leaves the process.** The device id (last topic level) is used only
   for the one-report-per-device-per-round rule, and even then only as a keyed BLAKE2b token
   under a per-process random key (never logged, never a metric label, never persisted).
   A batch holds only ``seed | z`` records; MQTT publish carries no user properties, no
   correlation data, and the client id is the library's random one unless configured.
3. **Uniform permutation.** Each pool is shuffled with :class:`random.SystemRandom`
   (Fisher-Yates driven by ``os.urandom``, a CSPRNG), so every order is equally likely and
   the order cannot be predicted from, or linked to, the arrival order. ``batch_id`` is
   ``secrets.token_bytes(16)``.
4. **At most one report per device in any batch.** Duplicates within a round are rejected;
   when the ``carry`` policy merges an old round into a newer pool, a carried report whose
   device already has a report in that pool is dropped (``carry_superseded``), and a fresh
   report replaces a carried report of the same device. So a shuffled batch of ``n``
   records always comes from ``n`` distinct devices, as the shuffle accountant assumes.

Timing: a batch is released whole, in one MQTT message, never record by record.

Rounds and release
------------------
Reports are pooled per round (the report's ``round`` field). A pool is released
immediately when it holds ``release_size`` reports (default ``min_batch``). Every
``flush_interval`` seconds:

* rounds older than the newest round seen are *closed*: a closed pool with at least
  ``min_batch`` reports is released; a smaller one follows ``round_policy``:
  ``"drop"`` discards it (counted as dropped, reason ``small_round``); ``"carry"`` merges
  it into the newest round's pool, so the **batch's round field is then the newest round**
  of the reports it contains;
* the newest round's pool is released if it holds at least ``min_batch`` reports.

A pool larger than ``max_batch`` is shuffled as a whole and cut into ``ceil(n / max_batch)``
contiguous slices of near-equal size (each >= ``min_batch`` because ``max_batch >=
2 min_batch`` is required), each a uniformly random subset in uniformly random order.

Duplicate detection keeps one token set per round for the ``max_rounds`` newest rounds
(each set at most ``max_reports_per_round`` tokens; beyond it reports are rejected as
``round_full``). A report of a round older than every tracked round, once ``max_rounds``
rounds are tracked, is rejected as ``stale_round``: accepting it could let a device
contribute twice to a round whose token set was forgotten. Round numbers are not
authenticated: a device can open a far-future round, which closes older rounds early
(their pools are still released only when >= ``min_batch``).

Shutdown
--------
:meth:`Shuffler.stop` (or cancelling :meth:`Shuffler.run`) stops consuming (unsubscribe,
then the reports already received are processed), closes every round (releasing pools of
at least ``min_batch``; with ``carry`` the small pools are first merged into the newest
pool), and waits up to ``drain_timeout`` seconds for the broker's PUBACKs. Nothing is
persisted: reports in pools still smaller than ``min_batch`` are discarded and counted as
dropped with reason ``at_shutdown`` (whatever the policy, since carrying them would need
storage of unreleased reports), and batches not acknowledged in time as
``unpublished_at_shutdown``.

Delivery
--------
Batches wait in a bounded outbox until PUBACK (QoS 1). A failed or timed-out publish is
retried after reconnecting with the *same* bytes and ``batch_id`` (the aggregator
deduplicates by ``batch_id``; re-sending identical bytes reveals nothing new). While the
outbox is full, pools stay buffered (no loss, they are released later, split if needed).
On a lost connection the shuffler reconnects with exponential backoff; accepted but
unreleased reports stay in memory.

Connections
-----------
With ``ingest_client="gmqtt"`` (the default) reports are received by a gmqtt client whose
``on_message`` calls the synchronous handler directly (no task or queue per report), and
batches are published by a second, aiomqtt connection (random client id, clean start, no
subscription). With ``"aiomqtt"`` one aiomqtt connection does both. The session settings
below apply to the ingest connection.

Sessions and broker restarts
----------------------------
The shuffler speaks MQTT 5. By default it connects with a clean start and the library's
random client id: reports published while it is disconnected (a network cut, a broker
restart) are not queued for it and are lost at the broker. With ``client_id`` set it asks
for a **persistent session** (that fixed client id, ``clean_start=False``, session expiry
interval ``session_expiry`` seconds): the broker keeps the ingress subscription and queues
QoS 1 reports while the shuffler is away, and delivers them when it reconnects. Across a
broker *restart* this holds only if the broker persists its sessions (Mosquitto:
``persistence true``; it writes them on a clean shutdown and every ``autosave_interval``).
A fixed client id is a stable identifier of the shuffler, not of any device: it reveals
nothing about senders.

The at-most-once boundary: the MQTT client acknowledges a report as soon as it has reached
the shuffler's memory (a PUBACK cannot wait for the release of a pool of ``min_batch``
reports: the broker's in-flight window is far smaller). From then until its batch is
acknowledged by the broker, a report lives only in this process. A graceful stop releases
what it can and counts the rest as dropped (``at_shutdown``, ``unpublished_at_shutdown``);
a *crash* of the shuffler loses the buffered and outbox reports without a count; on restart
they show up as the difference between the devices' PUBACKs and what was aggregated,
rejected or dropped. Reports that are queued at the broker and not yet sent to the
shuffler survive a shuffler crash when the session is persistent. A graceful stop
unsubscribes (the barrier that guarantees every delivered report is processed), so reports
published while a stopped shuffler is down are not queued, even with a persistent session.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import random
import secrets
import ssl
import time
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

import aiomqtt
import gmqtt  # type: ignore[import-untyped]
from gmqtt.mqtt.constants import MQTTv50, MQTTv311  # type: ignore[import-untyped]
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client import CollectorRegistry

from broker.metrics import ShufflerMetrics
from edge import mqtt_url
from edge.codec import CodecError, decode_report, encode_batch
from edge.spec import MechanismSpec
from edge.topics import batches_topic, check_name, ingress_filter

__all__ = ["IngestClient", "RoundPolicy", "Shuffler", "ShufflerConfig", "parse_broker_url"]

logger = logging.getLogger(__name__)

RoundPolicy = Literal["carry", "drop"]
_TOKEN_KEY_SIZE = 32
_TOKEN_SIZE = 16
# gmqtt reconnects by itself while ``failed_connections <= reconnect_retries`` (-1 means
# unlimited); -2 disables that, so the shuffler's own loop (backoff, metrics) is in charge.
_GMQTT_NO_AUTO_RECONNECT = -2
_GMQTT_KEEPALIVE = 60
IngestClient = Literal["gmqtt", "aiomqtt"]


def parse_broker_url(url: str) -> tuple[str, int, bool]:
    """``(host, port, tls)`` of a broker URL (:func:`edge.mqtt_url.parse_broker_url`)."""
    return tuple(mqtt_url.parse_broker_url(url))  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class ShufflerConfig:
    """Settings of one shuffler (see the module docstring for their privacy role).

    ``broker`` is ``mqtt://host:port`` or ``mqtts://host:port`` (TLS, optionally with
    ``ca_file``); ``release_size`` defaults to ``min_batch``; ``max_batch`` caps the
    records in one message and must be at least ``2 min_batch`` so that splitting never
    makes a slice smaller than ``min_batch``.
    """

    broker: str
    deployment: str
    spec: MechanismSpec
    min_batch: int
    max_batch: int = 10_000
    release_size: int | None = None
    round_policy: RoundPolicy = "carry"
    flush_interval: float = 5.0
    qos: int = 1
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    client_id: str | None = None
    session_expiry: int = 3600
    mqtt_version: Literal["5", "3.1.1"] = "5"
    """MQTT 3.1.1 is for brokers without MQTT 5 (the demo's embedded amqtt); its persistent
    session is ``clean_session=False`` with no expiry interval."""
    max_rounds: int = 8
    max_reports_per_round: int = 1_000_000
    max_outbox_batches: int = 1_000
    incoming_queue_size: int = 100_000
    publish_timeout: float = 10.0
    drain_timeout: float = 10.0
    reconnect_min: float = 0.1
    reconnect_max: float = 10.0
    ingest_client: IngestClient = "gmqtt"
    """The MQTT library that receives reports. ``"gmqtt"`` (default) hands each report to
    the synchronous handler straight from its read loop (several times aiomqtt's rate) and
    publishes batches on a second, aiomqtt connection (random client id, clean start).
    ``"aiomqtt"`` receives and publishes on one aiomqtt connection."""

    def __post_init__(self) -> None:
        parse_broker_url(self.broker)
        check_name("deployment", self.deployment)
        if not isinstance(self.spec, MechanismSpec):
            raise ValueError(f"spec must be a MechanismSpec, got {self.spec!r}")
        for name in ("min_batch", "max_batch", "max_rounds", "max_reports_per_round"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.min_batch < 2:
            raise ValueError(f"min_batch must be >= 2, got {self.min_batch}")
        if self.max_batch < 2 * self.min_batch:
            raise ValueError(
                f"max_batch must be >= 2 * min_batch = {2 * self.min_batch}, got {self.max_batch}"
            )
        if self.release_size is None:
            object.__setattr__(self, "release_size", self.min_batch)
        release = self.release_size
        if isinstance(release, bool) or not isinstance(release, int):
            raise ValueError(f"release_size must be an integer, got {release!r}")
        if not self.min_batch <= release <= self.max_batch:
            raise ValueError(
                f"release_size must be in [min_batch={self.min_batch}, "
                f"max_batch={self.max_batch}], got {release}"
            )
        self._check_policy_and_limits()

    def _check_policy_and_limits(self) -> None:
        if self.round_policy not in ("carry", "drop"):
            raise ValueError(f"round_policy must be 'carry' or 'drop', got {self.round_policy!r}")
        if self.qos != 1:
            raise ValueError(f"qos must be 1 (at-least-once batches), got {self.qos}")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")
        if self.max_reports_per_round < self.min_batch:
            raise ValueError(
                f"max_reports_per_round must be >= min_batch, got {self.max_reports_per_round}"
            )
        for name in (
            "flush_interval",
            "publish_timeout",
            "drain_timeout",
            "reconnect_min",
            "reconnect_max",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        expiry = self.session_expiry
        if isinstance(expiry, bool) or not isinstance(expiry, int) or not 0 <= expiry < 2**32:
            raise ValueError(
                f"session_expiry must be an integer number of seconds in [0, 2**32), got {expiry!r}"
            )
        if self.client_id is not None and not self.client_id:
            raise ValueError("client_id must be None (random, clean start) or a non-empty string")
        if self.ingest_client not in ("gmqtt", "aiomqtt"):
            raise ValueError(
                f"ingest_client must be 'gmqtt' or 'aiomqtt', got {self.ingest_client!r}"
            )
        if self.max_outbox_batches < 1 or self.incoming_queue_size < 1:
            raise ValueError("max_outbox_batches and incoming_queue_size must be >= 1")


class _Pool:
    """Accepted reports waiting for release, in arrival order (shuffled before release).

    ``tokens`` are keyed hashes of device ids, kept only to enforce one report per device
    per batch; they never leave the process.
    """

    __slots__ = ("arrivals", "index", "seeds", "tokens", "zs")

    def __init__(self) -> None:
        self.seeds: list[int] = []
        self.zs: list[int] = []
        self.arrivals: list[float] = []
        self.tokens: list[bytes] = []
        self.index: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self.seeds)

    def add(self, token: bytes, seed: int, z: int, arrival: float) -> bool:
        """Add a report; a report of the same device already here (a carried one of an
        older round) is replaced. Returns ``True`` if a report was replaced."""
        position = self.index.get(token)
        if position is not None:
            self.seeds[position] = seed
            self.zs[position] = z
            self.arrivals[position] = arrival
            return True
        self.index[token] = len(self.seeds)
        self.seeds.append(seed)
        self.zs.append(z)
        self.arrivals.append(arrival)
        self.tokens.append(token)
        return False

    def merge_from(self, other: _Pool) -> int:
        """Carry ``other``'s reports in; returns how many were dropped as superseded."""
        superseded = 0
        for i in range(len(other)):
            token = other.tokens[i]
            if token in self.index:
                superseded += 1  # the device already has a report here: keep the newer
                continue
            self.index[token] = len(self.seeds)
            self.seeds.append(other.seeds[i])
            self.zs.append(other.zs[i])
            self.arrivals.append(other.arrivals[i])
            self.tokens.append(token)
        return superseded


class _IngestError(Exception):
    """The gmqtt ingest connection was lost or its subscription refused."""


class _Acks:
    """SUBACK/UNSUBACK waits and loss detection of one gmqtt ingest connection."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.lost = asyncio.Event()
        self.pending: dict[int, asyncio.Future[tuple[int, ...]]] = {}

    def on_ack(self, _client: object, mid: int, codes: object, *_: object) -> None:
        future = self.pending.get(mid)
        if future is not None and not future.done():
            future.set_result(tuple(codes) if isinstance(codes, tuple | list) else ())

    def on_disconnect(self, *_: object) -> None:
        self.lost.set()
        for future in self.pending.values():
            if not future.done():
                future.set_exception(_IngestError("connection lost"))

    async def wait(self, mid: int) -> tuple[int, ...]:
        """The reason codes of the acknowledgement of ``mid`` (call it with no await
        between sending the packet and this call, so the ack cannot be missed)."""
        if self.lost.is_set():
            raise _IngestError("connection lost")
        future: asyncio.Future[tuple[int, ...]] = asyncio.get_running_loop().create_future()
        self.pending[mid] = future
        try:
            async with asyncio.timeout(self.timeout):
                return await future
        finally:
            del self.pending[mid]


@dataclass(frozen=True)
class _Batch:
    payload: bytes
    count: int
    oldest_arrival: float


class Shuffler:
    """The shuffling bridge as an async context manager: ``async with Shuffler(cfg) as s:
    await s.run()``. Reusable after exit, not re-entrant.

    :meth:`run` returns after :meth:`stop` has been called and the drain has finished. If
    the task running :meth:`run` is cancelled, it drains the same way and then re-raises
    :class:`asyncio.CancelledError`.
    """

    def __init__(self, config: ShufflerConfig, *, registry: CollectorRegistry) -> None:
        self.config = config
        self.metrics = ShufflerMetrics(registry)
        self.metrics.min_batch.set(config.min_batch)
        self._host, self._port, self._tls = parse_broker_url(config.broker)
        self._ingress = ingress_filter(config.deployment)
        self._ingress_prefix = self._ingress[:-1]
        self._batches = batches_topic(config.deployment)
        self._fingerprint = config.spec.fingerprint_int
        self._t = config.spec.t
        self._release_size = config.release_size or config.min_batch
        self._random = random.SystemRandom()
        self._lock = asyncio.Lock()
        self._reset()

    def _reset(self) -> None:
        # A fresh key per run: tokens of different runs cannot be linked.
        self._token_key = secrets.token_bytes(_TOKEN_KEY_SIZE)
        self._pools: dict[int, _Pool] = {}
        self._seen: dict[int, set[bytes]] = {}
        self._newest_round: int | None = None
        self._outbox: deque[_Batch] = deque()
        self._outbox_changed = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self._connected = asyncio.Event()
        # Set while ``self._client`` can publish batches (the ingest connection with
        # aiomqtt, the separate publishing connection with gmqtt).
        self._publisher_ready = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._consumption_done = asyncio.Event()
        self._closing = asyncio.Event()
        self._update_gauges()

    async def __aenter__(self) -> Self:
        if self._lock.locked():
            raise RuntimeError("Shuffler is not re-entrant: it is already running")
        await self._lock.acquire()
        self._reset()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_requested.set()
        self._lock.release()

    def stop(self) -> None:
        """Request a graceful drain; :meth:`run` returns when it is done."""
        self._stop_requested.set()

    @property
    def buffered(self) -> int:
        """Accepted reports waiting in round pools."""
        return sum(len(pool) for pool in self._pools.values())

    @property
    def connected(self) -> asyncio.Event:
        """Set while subscribed to the ingress filter (for tests and health checks)."""
        return self._connected

    # --- main loop --------------------------------------------------------------------

    async def run(self) -> None:
        """Consume, shuffle and publish until :meth:`stop` (or cancellation), then drain."""
        if not self._lock.locked():
            raise RuntimeError("use 'async with Shuffler(...) as shuffler: await shuffler.run()'")
        cancelled = False
        async with asyncio.TaskGroup() as tg:
            connections = {tg.create_task(self._connection_loop(), name="shuffler-connection")}
            if self.config.ingest_client == "gmqtt":
                connections.add(tg.create_task(self._ingest_loop(), name="shuffler-ingest"))
            publisher = tg.create_task(self._publish_loop(), name="shuffler-publish")
            flusher = tg.create_task(self._flush_loop(), name="shuffler-flush")
            try:
                await self._stop_requested.wait()
            except asyncio.CancelledError:
                cancelled = True
                self._stop_requested.set()
            flusher.cancel()
            await self._drain()
            self._closing.set()
            publisher.cancel()
            # Let the connection loops leave their clients themselves (clean DISCONNECT).
            _, pending = await asyncio.wait(connections, timeout=self.config.publish_timeout)
            for task in pending:
                task.cancel()
        if cancelled:
            raise asyncio.CancelledError

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.config.drain_timeout
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.drain_timeout):
                await self._consumption_done.wait()
        self._close_rounds(shutdown=True)
        remaining = max(deadline - time.monotonic(), 0.0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(remaining):
                while self._outbox:
                    self._outbox_changed.clear()
                    await self._outbox_changed.wait()
        unpublished = sum(batch.count for batch in self._outbox)
        if unpublished:
            logger.warning("%d reports in unacknowledged batches dropped at shutdown", unpublished)
        self.metrics.drop("unpublished_at_shutdown", unpublished)
        self._outbox.clear()
        self._update_gauges()

    def _make_client(self) -> aiomqtt.Client:
        """The aiomqtt client: ingest and publishing, or publishing only (gmqtt ingest)."""
        cfg = self.config
        tls = aiomqtt.TLSParameters(ca_certs=cfg.ca_file) if self._tls else None
        tls_context = None
        if self._tls and cfg.ca_file is None:
            tls_context = ssl.create_default_context()
            tls = None
        # A publishing-only connection needs no session: the outbox retries unacknowledged
        # batches itself. Its client id is the library's random one (a fixed id is the
        # ingest connection's, and two connections with one id would take over each other).
        ingest = cfg.ingest_client == "aiomqtt"
        persistent = ingest and cfg.client_id is not None
        identifier = cfg.client_id if ingest else None
        session: dict[str, Any]
        if cfg.mqtt_version == "3.1.1":
            session = {"protocol": aiomqtt.ProtocolVersion.V311, "clean_session": not persistent}
        else:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = cfg.session_expiry if persistent else 0
            session = {
                "protocol": aiomqtt.ProtocolVersion.V5,
                "clean_start": not persistent,
                "properties": properties,
            }
        return aiomqtt.Client(
            self._host,
            self._port,
            username=cfg.username,
            password=cfg.password,
            identifier=identifier,
            tls_params=tls,
            tls_context=tls_context,
            max_queued_incoming_messages=cfg.incoming_queue_size,
            timeout=cfg.publish_timeout,
            **session,
        )

    async def _connection_loop(self) -> None:
        """The aiomqtt connection: ingest and publishing, or publishing only (gmqtt)."""
        ingest = self.config.ingest_client == "aiomqtt"
        backoff = self.config.reconnect_min
        first = True
        while not self._closing.is_set():
            if not first and ingest:
                self.metrics.reconnects.inc()
            first = False
            try:
                async with self._make_client() as client:
                    self._client = client
                    if not ingest:
                        self._publisher_ready.set()
                        backoff = self.config.reconnect_min
                        await self._watch_publisher(client)
                        return
                    self.metrics.connected.set(1)
                    if not self._consumption_done.is_set():
                        await client.subscribe(self._ingress, qos=self.config.qos)
                        logger.info("subscribed to %s", self._ingress)
                    self._connected.set()
                    self._publisher_ready.set()
                    backoff = self.config.reconnect_min
                    if not self._consumption_done.is_set():
                        await self._consume(client)
                    await self._closing.wait()
                    return
            except aiomqtt.MqttError as exc:
                logger.warning(
                    "broker connection lost or refused (%s); retry in %.1f s", exc, backoff
                )
            finally:
                self._client = None
                self._publisher_ready.clear()
                if ingest:
                    self._connected.clear()
                    self.metrics.connected.set(0)
            if ingest and self._stop_requested.is_set():
                self._consumption_done.set()  # not connected: nothing more to consume
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), backoff)
            backoff = min(backoff * 2, self.config.reconnect_max)

    async def _watch_publisher(self, client: aiomqtt.Client) -> None:
        """Until closing; raises :class:`aiomqtt.MqttError` when the connection is lost.

        The publishing connection subscribes to nothing, so its message iterator yields
        nothing and only serves to report a disconnection.
        """
        closing = asyncio.ensure_future(self._closing.wait())
        lost = asyncio.ensure_future(anext(aiter(client.messages)))
        try:
            await asyncio.wait({closing, lost}, return_when=asyncio.FIRST_COMPLETED)
            if lost.done():
                lost.result()  # raises MqttError on a lost connection
        finally:
            closing.cancel()
            lost.cancel()

    # --- gmqtt ingest -------------------------------------------------------------------

    def _make_gmqtt_client(self) -> gmqtt.Client:
        cfg = self.config
        persistent = cfg.client_id is not None
        kwargs: dict[str, object] = {}
        if cfg.mqtt_version == "5":
            kwargs["session_expiry_interval"] = cfg.session_expiry if persistent else 0
        # client_id None: gmqtt's random uuid4 id. clean_session is MQTT 5's clean start.
        client = gmqtt.Client(cfg.client_id, clean_session=not persistent, logger=logger, **kwargs)
        client.set_config({"reconnect_retries": _GMQTT_NO_AUTO_RECONNECT})
        if cfg.username is not None:
            client.set_auth_credentials(cfg.username, cfg.password)
        return client

    def _gmqtt_ssl(self) -> ssl.SSLContext | bool:
        if not self._tls:
            return False
        return ssl.create_default_context(cafile=self.config.ca_file)

    async def _ingest_loop(self) -> None:
        """Receive reports with gmqtt, reconnecting with backoff, until consumption stops."""
        cfg = self.config
        backoff = cfg.reconnect_min
        first = True
        while not self._closing.is_set():
            if self._stop_requested.is_set() and not self._connected.is_set():
                self._consumption_done.set()  # not connected: nothing more to consume
            if self._consumption_done.is_set():
                return
            if not first:
                self.metrics.reconnects.inc()
            first = False
            try:
                await self._ingest_session()
                if self._consumption_done.is_set():
                    return
                backoff = cfg.reconnect_min
            except (OSError, TimeoutError, gmqtt.MQTTConnectError, _IngestError) as exc:
                logger.warning(
                    "broker connection lost or refused (%s); retry in %.1f s", exc, backoff
                )
            if self._stop_requested.is_set():
                self._consumption_done.set()  # not connected: nothing more to consume
                return
            stop = asyncio.ensure_future(self._stop_requested.wait())
            try:
                await asyncio.wait({stop}, timeout=backoff)
            finally:
                stop.cancel()
            backoff = min(backoff * 2, cfg.reconnect_max)

    async def _ingest_session(self) -> None:
        """One gmqtt connection: subscribe, receive until stop or loss, then unsubscribe.

        Returns after a lost connection (retry) or with consumption done (after stop).
        Every report is handled synchronously in gmqtt's read loop, in arrival order, so the
        UNSUBACK is a barrier: once it is read, every report sent before it is pooled.
        """
        cfg = self.config
        client = self._make_gmqtt_client()
        acks = _Acks(cfg.publish_timeout)
        lost = acks.lost

        def on_message(
            _client: object, topic: object, payload: object, _qos: int, properties: object
        ) -> None:
            retain = bool(properties.get("retain")) if isinstance(properties, dict) else False
            self._handle_report(topic, payload, retain=retain)

        client.on_message = on_message
        client.on_subscribe = acks.on_ack
        client.on_unsubscribe = acks.on_ack
        client.on_disconnect = acks.on_disconnect
        version = MQTTv311 if cfg.mqtt_version == "3.1.1" else MQTTv50
        disconnected = False
        try:
            async with asyncio.timeout(cfg.publish_timeout):
                await client.connect(
                    self._host,
                    self._port,
                    ssl=self._gmqtt_ssl(),
                    keepalive=_GMQTT_KEEPALIVE,
                    version=version,
                )
            if lost.is_set():
                raise _IngestError("connection lost")
            # The future is registered before the SUBACK can be read (no await in between).
            codes = await acks.wait(client.subscribe(self._ingress, qos=cfg.qos))
            if not codes or codes[0] >= 0x80:
                raise _IngestError(f"subscription refused {codes!r}")
            logger.info("subscribed to %s", self._ingress)
            self._connected.set()
            self.metrics.connected.set(1)
            stop = asyncio.ensure_future(self._stop_requested.wait())
            gone = asyncio.ensure_future(lost.wait())
            try:
                await asyncio.wait({stop, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                gone.cancel()
            if lost.is_set():
                raise _IngestError("connection lost")
            await acks.wait(client.unsubscribe(self._ingress))
            # Reports read before the UNSUBACK are pooled; none follow it. Disconnect before
            # declaring consumption done, so that nothing can be pooled after the drain.
            await self._disconnect_gmqtt(client)
            disconnected = True
            self._consumption_done.set()
            logger.info("stopped consuming ingress")
        finally:
            self._connected.clear()
            self.metrics.connected.set(0)
            if not disconnected:  # a second DISCONNECT would be written to a closed socket
                await self._disconnect_gmqtt(client)

    async def _disconnect_gmqtt(self, client: gmqtt.Client) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.config.publish_timeout):
                await client.disconnect()

    # --- aiomqtt ingest -----------------------------------------------------------------

    async def _consume(self, client: aiomqtt.Client) -> None:
        messages = aiter(client.messages)
        stop = asyncio.ensure_future(self._stop_requested.wait())
        nxt = asyncio.ensure_future(anext(messages))
        try:
            while True:
                done, _ = await asyncio.wait({nxt, stop}, return_when=asyncio.FIRST_COMPLETED)
                if nxt not in done:
                    break
                self._handle(nxt.result())
                nxt = asyncio.ensure_future(anext(messages))
            # Stop consuming: after UNSUBACK every message the broker sent us is queued here.
            # The pending read is not cancelled while a message may be in flight to it.
            await client.unsubscribe(self._ingress)
            while True:
                done, _ = await asyncio.wait({nxt}, timeout=0.05)
                if not done:
                    if len(client.messages) == 0:
                        break
                    continue
                self._handle(nxt.result())
                nxt = asyncio.ensure_future(anext(messages))
        finally:
            stop.cancel()
            nxt.cancel()
        self._consumption_done.set()
        logger.info("stopped consuming ingress")

    async def _publish_loop(self) -> None:
        while True:
            if not self._outbox:
                self._outbox_changed.clear()
                await self._outbox_changed.wait()
                continue
            await self._publisher_ready.wait()
            client = self._client
            if client is None:
                await asyncio.sleep(self.config.reconnect_min)
                continue
            batch = self._outbox[0]
            try:
                # No properties, no retain: the payload is the whole message.
                await client.publish(
                    self._batches,
                    batch.payload,
                    qos=self.config.qos,
                    timeout=self.config.publish_timeout,
                )
            except aiomqtt.MqttError as exc:
                logger.warning("batch publish failed (%s); will retry", exc)
                await asyncio.sleep(self.config.reconnect_min)
                continue
            self._outbox.popleft()
            self.metrics.batches_released.inc()
            self.metrics.reports_released.inc(batch.count)
            self.metrics.batch_size.observe(batch.count)
            self.metrics.release_latency.observe(max(time.monotonic() - batch.oldest_arrival, 0.0))
            self._update_gauges()
            self._outbox_changed.set()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.flush_interval)
            self._close_rounds(shutdown=False)

    # --- validation and pooling (synchronous: no await between check and update) ----------

    def _token(self, device: str) -> bytes:
        digest = hashlib.blake2b(device.encode(), key=self._token_key, digest_size=_TOKEN_SIZE)
        return digest.digest()

    def _handle(self, message: aiomqtt.Message) -> None:
        self._handle_report(message.topic.value, message.payload, retain=message.retain)

    def _handle_report(self, topic: object, payload: object, *, retain: bool) -> None:
        """Validate and pool one report (any client library): ``topic`` should be a str
        (gmqtt passes bytes when it is not UTF-8), ``payload`` bytes."""
        reason = self._accept(topic, payload, retain=retain)
        if reason is not None:
            self.metrics.reject(reason)
            return
        self.metrics.reports_received.inc()
        self.metrics.reports_accepted.inc()
        self._update_gauges()

    def _accept(self, topic: object, payload: object, *, retain: bool) -> str | None:
        """Pool the report and return ``None``, or return the rejection reason."""
        if not isinstance(topic, str) or not topic.startswith(self._ingress_prefix):
            return "bad_topic"
        device = topic[len(self._ingress_prefix) :]
        if not device or "/" in device:
            return "bad_topic"
        if retain:
            return "retained"  # a retained report would be replayed on every subscription
        parsed = self._parse(payload)
        if isinstance(parsed, str):
            return parsed
        round_, seed, z = parsed
        seen = self._seen.get(round_)
        if seen is None:
            if len(self._seen) >= self.config.max_rounds and round_ < min(self._seen):
                return "stale_round"
            seen = self._open_round(round_)
        token = self._token(device)
        del device  # the id is not needed past this point
        if token in seen:
            return "duplicate_in_round"
        if len(seen) >= self.config.max_reports_per_round:
            return "round_full"
        seen.add(token)
        pool = self._pools.setdefault(round_, _Pool())
        if pool.add(token, seed, z, time.monotonic()):
            self.metrics.drop("carry_superseded", 1)
        if len(pool) >= self._release_size:
            self._release(round_)
        return None

    def _parse(self, payload: object) -> tuple[int, int, int] | str:
        """``(round, seed, z)`` of a valid report of this spec, or the rejection reason."""
        if not isinstance(payload, bytes | bytearray):
            return "bad_length"
        try:
            _, fingerprint, round_, seed, z = decode_report(payload)
        except CodecError as exc:
            return exc.reason
        if fingerprint != self._fingerprint:
            return "unknown_fingerprint"
        if z >= self._t:
            return "z_out_of_range"
        return round_, seed, z

    def _open_round(self, round_: int) -> set[bytes]:
        seen: set[bytes] = set()
        self._seen[round_] = seen
        if self._newest_round is None or round_ > self._newest_round:
            self._newest_round = round_
        while len(self._seen) > self.config.max_rounds:
            oldest = min(self._seen)
            del self._seen[oldest]
            self._close_round(oldest)
        return seen

    # --- release ------------------------------------------------------------------------

    def _close_round(self, round_: int) -> None:
        """Release the pool of a closed round, or apply the round policy to it."""
        pool = self._pools.get(round_)
        if pool is None:
            return
        if len(pool) >= self.config.min_batch:
            self._release(round_)
            return
        newest = self._newest_round
        if self.config.round_policy == "carry" and newest is not None and newest != round_:
            del self._pools[round_]
            target = self._pools.setdefault(newest, _Pool())
            self.metrics.drop("carry_superseded", target.merge_from(pool))
            return
        del self._pools[round_]
        self.metrics.drop("small_round", len(pool))

    def _close_rounds(self, *, shutdown: bool) -> None:
        newest = self._newest_round
        for round_ in sorted(self._pools):
            if round_ != newest:
                self._close_round(round_)
        if newest is not None and newest in self._pools:
            pool = self._pools[newest]
            if len(pool) >= self.config.min_batch:
                self._release(newest)
            elif shutdown:
                del self._pools[newest]
                self.metrics.drop("at_shutdown", len(pool))
        if shutdown:
            for round_ in list(self._pools):  # only possible if the outbox was full
                pool = self._pools.pop(round_)
                self.metrics.drop("at_shutdown", len(pool))
            logger.info("shutdown: %d batches to publish", len(self._outbox))
        self._update_gauges()

    def _release(self, round_: int) -> None:
        """Shuffle a pool of >= min_batch reports into the outbox (split above max_batch)."""
        pool = self._pools[round_]
        n = len(pool)
        if n < self.config.min_batch:  # defence in depth: never release a small batch
            raise AssertionError("refusing to release a batch below min_batch")
        if not self._outbox_has_room():
            return  # outbox full: keep buffering, release on a later flush
        del self._pools[round_]
        order = list(range(n))
        self._random.shuffle(order)  # uniform permutation from os.urandom
        slices = math.ceil(n / self.config.max_batch)
        for k in range(slices):
            part = order[k * n // slices : (k + 1) * n // slices]
            if len(part) < self.config.min_batch:
                raise AssertionError("a slice below min_batch")  # excluded by max_batch >= 2m
            payload = encode_batch(
                self._fingerprint,
                round_,
                secrets.token_bytes(16),
                [pool.seeds[i] for i in part],
                [pool.zs[i] for i in part],
            )
            oldest = min(pool.arrivals[i] for i in part)
            self._outbox.append(_Batch(payload, len(part), oldest))
        self._outbox_changed.set()
        self._update_gauges()

    def _outbox_has_room(self) -> bool:
        return len(self._outbox) < self.config.max_outbox_batches

    def _update_gauges(self) -> None:
        self.metrics.buffer_reports.set(self.buffered)
        self.metrics.outbox_reports.set(sum(batch.count for batch in self._outbox))
