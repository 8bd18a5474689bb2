"""``coco fleet``: N simulated devices publishing privatised reports to an MQTT broker.

Each round, every device takes its vector of the model (:mod:`sim.fleet_models`),
randomises it with the spec's mechanism on the device path
(:meth:`~edge.LocalMechanism.randomise_keys`, its own generator's bits) and publishes the
16-byte report on its own ingress topic ``coco/v1/<deployment>/ingress/<device-id>`` (in a
sharded deployment, ``.../ingress/<shard label>/<device-id>`` with the shard of the round's
layout: :mod:`edge.shards`).

Rounds
------
Rounds are the wall clock's (:mod:`edge.rounds`): round ``r`` is the Unix-time interval
``[r L, (r + 1) L)`` with ``L = round_seconds`` (the announced one), and every report
published in it carries ``r``. ``rounds`` rounds run back to back: the fleet publishes a
round's reports from ``round_offset`` seconds after it starts, spread over ``round_spread``
seconds (device ``i`` of ``n`` at ``offset + spread i / n``; 0 = as fast as possible), waits
for every acknowledgement, then waits for the next round. It joins the round in progress
only if it is ready in its first half (or before its offset, if that is later): see
:func:`next_round`. A round the fleet cannot join (the previous one overran it) is skipped
and counted; a round whose publishing overruns its end is logged (its reports keep its
number). One report per device per round, so a shuffler that accepts each round once sees
no duplicate from a healthy fleet.

Connections
-----------
MQTT 5, or 3.1.1 where the broker speaks only that (``mqtt_version`` ``auto``: one probe
before the first connection, :func:`edge.mqtt_version.negotiate`), or as configured.

* ``connections`` (default): one MQTT connection per device, client id = device id
  (what a broker that binds client ids to accounts expects) and, with a credentials
  secret, user name = device id and password =
  :func:`sim.credentials.device_password` (what a broker ACL with ``%u`` expects). Needs
  one file descriptor per device: the soft ``RLIMIT_NOFILE`` is raised to the hard limit
  when needed (:func:`ensure_fd_limit`).
* ``multiplexed``: ``connections`` shared connections (one identity, e.g. a gateway), device
  ``i`` on connection ``i mod K``; each report still goes to its device's ingress topic.

Client library: gmqtt (an asyncio ``Protocol`` per connection, no thread, no task per
message), chosen by measurement against aiomqtt (bench/README.md, ``bench_fleet.py``).
A publish is counted when the broker acknowledges it (QoS 1: PUBACK with a success reason)
or when it is written to the socket (QoS 0). At most ``window`` QoS 1 reports are
unacknowledged per connection (and fewer if the broker's MQTT 5 receive maximum says so).

Failures never crash the fleet: a refused or failed connection and an unpublished report
are counted by reason (:mod:`sim.fleet_metrics`); a device that is not connected tries
again before the next round.

Reproducibility: ``SeedSequence(seed).spawn(3)``: model parameters, per-device data
generators, per-device randomiser generators (``spawn(n_devices)`` each), so the same
seed gives the same reports whatever the mode, the ramp-up or the failures.

No device id is logged at INFO or above, exported as a metric label or written to the
ground-truth file. Simulated devices keep no budget ledger: they are simulations; a real
device runs ``coco device``, whose ledger persists every release before it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import resource
import secrets
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import gmqtt  # type: ignore[import-untyped]
import numpy as np
from gmqtt.mqtt.constants import MQTTv50, MQTTv311  # type: ignore[import-untyped]
from gmqtt.storage import PersistentStorage  # type: ignore[import-untyped]
from prometheus_client import CollectorRegistry

from edge import CocoError, LocalMechanism
from edge.codec import encode_report
from edge.mqtt_url import parse_broker_urls
from edge.mqtt_version import MQTT_VERSIONS, MqttVersion, Negotiated, negotiate
from edge.rounds import check_round_seconds, current_round, round_start
from edge.shards import ShardLayout, ShardPlan
from edge.spec import MechanismSpec
from edge.topics import check_name, ingress_topic
from sim.credentials import DEFAULT_PREFIX, device_id, device_password
from sim.fleet_metrics import (
    CONNECT_FAILURE_REASONS,
    DEFAULT_METRICS_DIMS,
    PUBLISH_FAILURE_REASONS,
    FleetMetrics,
)
from sim.fleet_models import FleetModel, ModelName, device_bits, seed_children
from sim.fleet_truth import GroundTruth

__all__ = [
    "Fleet",
    "FleetConfig",
    "FleetError",
    "Mode",
    "ReportHook",
    "ensure_fd_limit",
    "next_round",
]

logger = logging.getLogger(__name__)

Mode = Literal["connections", "multiplexed"]
ReportHook = Callable[[str, bytes], None]
"""Called with ``(topic, payload)`` of every report just before it is published (tests)."""

_GMQTT_NO_AUTO_RECONNECT = -2  # the fleet reconnects by itself, at the next round
_KEEPALIVE = 60
_FDS_RESERVED = 64
"""File descriptors beyond one per connection: the event loop, the metrics server, logs."""
_CONNECT_CONCURRENCY = 200
"""At most this many connection attempts at once (keeps the broker's listen backlog short)."""
_YIELD_EVERY = 200
"""Publishes between two yields to the event loop (so PUBACKs are read meanwhile)."""


class FleetError(CocoError):
    """The fleet cannot run (file-descriptor limit, bad configuration)."""


def next_round(
    now: float,
    round_seconds: int,
    offset: float,
    after: int | None = None,
    *,
    join_current: bool = True,
) -> int:
    """The wall-clock round a fleet ready at Unix time ``now`` publishes in next.

    After ``after`` (the round it last published in, if any): the round in progress if the
    fleet is ready no later than ``max(offset, L / 2)`` seconds after it started, otherwise
    the next one. Without ``join_current`` the first round (``after`` None) is always the
    next one: a run started right after another one never reuses the round that one ended
    in (its reports would all be duplicates). Raises :class:`~edge.rounds.ClockError` for a
    clock that is not set.
    """
    round_ = current_round(round_seconds, now)
    if after is None and not join_current:
        return round_ + 1
    if after is not None and round_ <= after:
        return after + 1
    late = now - round_start(round_, round_seconds) > max(offset, round_seconds / 2)
    return round_ + 1 if late else round_


@dataclass(frozen=True, kw_only=True)
class FleetConfig:
    """Everything one fleet run needs (the CLI builds it from its options)."""

    broker: str
    deployment: str
    spec: MechanismSpec
    devices: int
    round_seconds: int
    """Length of a round (the deployment's announced ``round_seconds``)."""
    rounds: int = 1
    """Consecutive wall-clock rounds to publish in; 0 runs until :meth:`Fleet.stop`."""
    round_offset: float = 0.0
    """Seconds after a round starts before the fleet publishes in it."""
    join_current_round: bool = False
    """Publish the first round in the round in progress (when early enough in it) instead of
    waiting for the next: faster to start, but a run right after another one would repeat
    that run's last round, whose reports the shuffler rejects as duplicates."""
    round_spread: float = 0.0
    """Seconds over which a round's reports are spread (0 = as fast as possible);
    ``round_offset + round_spread`` must be below ``round_seconds``."""
    ramp_up: float = 0.0
    """New connections per second; 0 = as fast as possible."""
    qos: Literal[0, 1] = 1
    mode: Mode = "connections"
    connections: int = 4
    """Shared connections in ``multiplexed`` mode (ignored otherwise)."""
    model: ModelName = "sensors"
    seed: int = 0
    prefix: str = DEFAULT_PREFIX
    username: str | None = None
    password: str | None = None
    credentials_secret: bytes | None = None
    """Per-device credentials: user name = device id, password from this secret."""
    ca_file: str | None = None
    window: int = 1000
    connect_timeout: float = 30.0
    publish_timeout: float = 30.0
    drain_timeout: float = 5.0
    """After :meth:`Fleet.stop`, how long to wait for outstanding PUBACKs."""
    metrics_dims: int = DEFAULT_METRICS_DIMS
    mqtt_version: MqttVersion = "auto"
    shards: ShardPlan | None = None
    """The announced shard layouts (``None``: an unsharded deployment)."""

    def __post_init__(self) -> None:
        parse_broker_urls(self.broker)
        if self.mqtt_version not in MQTT_VERSIONS:
            raise ValueError(f"mqtt_version must be one of {MQTT_VERSIONS}")
        check_name("deployment", self.deployment)
        check_name("device", device_id(0, self.prefix))
        if isinstance(self.devices, bool) or self.devices < 1:
            raise ValueError(f"devices must be >= 1, got {self.devices}")
        if self.rounds < 0:
            raise ValueError(f"rounds must be >= 0 (0 = until interrupted), got {self.rounds}")
        check_round_seconds(self.round_seconds)
        for name in ("round_offset", "round_spread", "ramp_up"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be >= 0, got {value}")
        for name in ("connect_timeout", "publish_timeout", "drain_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.qos not in (0, 1):
            raise ValueError(f"qos must be 0 or 1, got {self.qos}")
        if self.mode not in ("connections", "multiplexed"):
            raise ValueError(f"mode must be connections or multiplexed, got {self.mode!r}")
        if self.connections < 1 or self.window < 1:
            raise ValueError("connections and window must be >= 1")
        if not self.round_offset + self.round_spread < self.round_seconds:
            raise ValueError(
                f"round_offset + round_spread must be < round_seconds ({self.round_seconds}), "
                f"got {self.round_offset} + {self.round_spread}"
            )
        self._check_credentials()

    def _check_credentials(self) -> None:
        if self.credentials_secret is not None:
            if not self.credentials_secret:
                raise ValueError("the credentials secret is empty")
            if self.username is not None:
                raise ValueError("give either a shared username or a credentials secret")
            if self.mode == "multiplexed":
                raise ValueError(
                    "per-device credentials need --mode connections (a shared connection has "
                    "one identity; give it --username/--password)"
                )

    @property
    def connection_count(self) -> int:
        return self.devices if self.mode == "connections" else min(self.connections, self.devices)


def ensure_fd_limit(needed: int) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit if it is below ``needed``.

    Returns the soft limit in force; :class:`FleetError` if even the hard limit is too low.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return int(soft)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise FleetError(
            f"{needed} file descriptors needed (one per connection plus {_FDS_RESERVED}), but "
            f"the hard limit RLIMIT_NOFILE is {hard}: raise it (ulimit -Hn, systemd "
            f"LimitNOFILE=, docker --ulimit nofile=) or use --mode multiplexed"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logger.info("raised the soft RLIMIT_NOFILE from %d to %s", soft, hard)
    return int(needed if hard == resource.RLIM_INFINITY else hard)


# -- one MQTT connection --------------------------------------------------------------------

_Done = Callable[[str | None], None]
"""Outcome of one QoS 1 publish: ``None`` (acknowledged) or a failure reason."""


class _AckTracker(PersistentStorage):  # type: ignore[misc]
    """gmqtt's in-flight store, extended to resolve each QoS 1 publish on its PUBACK.

    gmqtt's ``publish`` returns nothing; it pushes ``(mid, packet)`` here synchronously, so
    the callback registered just before the call belongs to that ``mid``. The PUBACK's MQTT 5
    reason code is read by :meth:`_Connection._on_puback` before gmqtt removes the ``mid``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.next_done: _Done | None = None
        self.reason = 0
        self.pending: dict[int, tuple[float, _Done]] = {}

    def push_message(self, mid: int, raw_package: bytes) -> None:
        super().push_message(mid, raw_package)
        if self.next_done is not None:
            self.pending[mid] = (time.monotonic(), self.next_done)
            self.next_done = None

    def remove_message_by_mid(self, mid: int) -> None:
        super().remove_message_by_mid(mid)
        entry = self.pending.pop(mid, None)
        if entry is not None:
            reason, self.reason = self.reason, 0
            if reason < 0x80:
                entry[1](None)
            else:
                entry[1]("not_authorized" if reason == 0x87 else "refused")

    def fail_all(self, reason: str) -> None:
        pending, self.pending = self.pending, {}
        self.clear()
        for _, done in pending.values():
            done(reason)

    def expire(self, older_than: float) -> None:
        """Fail (``timeout``) every publish sent before ``older_than`` (monotonic)."""
        old = [mid for mid, (sent, _) in self.pending.items() if sent < older_than]
        for mid in old:
            _, done = self.pending.pop(mid)
            done("timeout")


def _connect_reason(exc: BaseException) -> str:
    if isinstance(exc, gmqtt.MQTTConnectError):
        code = getattr(exc, "_code", None)
        if code in (4, 0x86):
            return "bad_credentials"
        if code in (5, 0x87):
            return "not_authorized"
        return "refused"
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return "tls"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "network"


class _Connection:
    """One gmqtt client: connect, publish with a window of unacknowledged reports, close."""

    def __init__(
        self,
        client_id: str,
        *,
        username: str | None,
        password: str | None,
        window: int,
        on_lost: Callable[[_Connection], None],
    ) -> None:
        self.tracker = _AckTracker()
        self.client = gmqtt.Client(
            client_id,
            clean_session=True,
            persistent_storage=self.tracker,
            logger=logging.getLogger(f"{__name__}.gmqtt"),
            session_expiry_interval=0,
        )
        self.client.set_config({"reconnect_retries": _GMQTT_NO_AUTO_RECONNECT})
        if username is not None:
            self.client.set_auth_credentials(username, password)
        self.client.on_disconnect = self._on_disconnect
        handler = self.client._package_handler
        original = handler._handle_puback_packet

        def on_puback(cmd: int, packet: bytes) -> None:
            # MQTT 5: a reason code follows the packet id (absent = success).
            self.tracker.reason = packet[2] if len(packet) > 2 else 0
            original(cmd, packet)

        handler._handle_puback_packet = on_puback  # looked up by name on the instance
        self.window = window
        self.connected = False
        self.node = 0
        """Index of the broker node this connection uses (moves on after a failure)."""
        self._on_lost = on_lost
        self._room = asyncio.Event()
        self._room.set()

    @property
    def in_flight(self) -> int:
        return len(self.tracker.pending)

    async def connect(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | bool,
        timeout: float,
        version: Negotiated = "5",
    ) -> str | None:
        """``None`` once connected, else the failure reason (never raises for the broker)."""
        try:
            async with asyncio.timeout(timeout):
                await self.client.connect(
                    host,
                    port,
                    ssl=tls,
                    keepalive=_KEEPALIVE,
                    version=MQTTv50 if version == "5" else MQTTv311,
                )
        except (OSError, TimeoutError, gmqtt.MQTTConnectError, ssl.CertificateError) as exc:
            await self._abandon()
            return _connect_reason(exc)
        # The broker's MQTT 5 receive maximum bounds the in-flight ids gmqtt will allocate.
        id_max = getattr(getattr(self.client._package_handler, "id_generator", None), "_max", 0)
        if isinstance(id_max, int) and id_max >= 3:
            self.window = min(self.window, id_max - 2)
        self.connected = True
        return None

    def _on_disconnect(self, *_args: Any) -> None:
        was = self.connected
        self.connected = False
        self.tracker.fail_all("connection_lost")
        self._room.set()
        if was:
            self._on_lost(self)

    async def wait_room(self) -> None:
        """Until fewer than ``window`` reports are unacknowledged (or the connection is gone)."""
        while self.connected and self.in_flight >= self.window:
            self._room.clear()
            await self._room.wait()

    def acked(self) -> None:
        if self.in_flight < self.window:
            self._room.set()

    def publish(self, topic: str, payload: bytes, qos: int, done: _Done) -> None:
        """Send one report; ``done`` gets its outcome (QoS 0: at once)."""
        if not self.connected:
            done("not_connected")
            return
        try:
            if qos:
                self.tracker.next_done = done
            self.client.publish(topic, payload, qos=qos)
        except (OSError, OverflowError, AttributeError) as exc:
            self.tracker.next_done = None
            logger.debug("publish failed: %s", exc)
            done("connection_lost")
            return
        if not qos:
            done(None)

    async def close(self, timeout: float) -> None:
        was = self.connected
        self.connected = False
        self.tracker.fail_all("connection_lost")
        if was:
            self._on_lost(self)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                await self.client.disconnect()

    async def _abandon(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.client.disconnect()


# -- the fleet ------------------------------------------------------------------------------


@dataclass
class _Stats:
    started: float = field(default_factory=time.monotonic)
    connect_seconds: float = 0.0
    connected_first: int = 0
    connections_first: int = 0
    publish_seconds: float = 0.0
    peak_connected: int = 0
    rounds_completed: int = 0
    rounds_skipped: int = 0
    rounds_late: int = 0
    interrupted: bool = False


class Fleet:
    """A simulated fleet: ``await fleet.run()`` publishes every round; :meth:`stop` ends it
    early (the current round's outstanding PUBACKs get ``drain_timeout`` seconds).

    ``registry`` receives the metrics (:class:`~sim.fleet_metrics.FleetMetrics`);
    ``on_report`` sees every report's topic and payload before it is published;
    ``on_acked`` gets ``(round, seed, z)`` of every report the broker acknowledged (QoS 1)
    or that was sent (QoS 0), the device's promise that a pipeline must keep.
    """

    def __init__(
        self,
        config: FleetConfig,
        *,
        registry: CollectorRegistry | None = None,
        on_report: ReportHook | None = None,
        on_acked: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self.config = config
        self.spec = config.spec
        self.model = FleetModel(
            name=config.model, spec=config.spec, n_devices=config.devices, seed=config.seed
        )
        self.metrics = FleetMetrics(
            registry if registry is not None else CollectorRegistry(),
            d=config.spec.d,
            dims=config.metrics_dims,
        )
        self.truth = GroundTruth(d=config.spec.d)
        self.ids = [device_id(i, config.prefix) for i in range(config.devices)]
        self.topics = [ingress_topic(config.deployment, dev) for dev in self.ids]
        """Every device's unsharded ingress topic (:meth:`topics_for` gives a round's)."""
        self._shard_topics: dict[int, list[str]] = {}  # per layout generation
        self.version: Negotiated = "3.1.1" if config.mqtt_version == "3.1.1" else "5"
        self._on_report = on_report
        self._on_acked = on_acked
        self._mechanism = LocalMechanism.from_spec(config.spec)
        self._data_rngs = self.model.device_generators()
        self._rand_rngs = [
            np.random.default_rng(c) for c in seed_children(config.seed)[2].spawn(config.devices)
        ]
        self._nodes = parse_broker_urls(config.broker)
        """The broker's nodes: connection ``k`` starts on node ``k mod n`` and moves to the
        next node each time it fails (a cluster node that died)."""
        self._host, self._port, tls = self._nodes[0]
        self._tls: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=config.ca_file) if tls else False
        )
        self._stop = asyncio.Event()
        self._conns: list[_Connection] = []
        self._connected = 0
        self._outstanding = 0
        self._settled = asyncio.Event()
        self.stats = _Stats()
        self.rounds_used: list[int] = []
        """The wall-clock round numbers the run published in, in order."""
        self.published = 0
        self.publish_failures = dict.fromkeys(PUBLISH_FAILURE_REASONS, 0)
        self.connect_failures = dict.fromkeys(CONNECT_FAILURE_REASONS, 0)

    # -- public surface --

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    @property
    def connected(self) -> int:
        """Devices that can publish now (own mode: connected devices; multiplexed: devices
        whose shared connection is up)."""
        return self._connected

    def stop(self) -> None:
        """End the run: no new round starts; the current one drains briefly."""
        self.stats.interrupted = True
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def topics_for(self, round_: int) -> list[str] | None:
        """Every device's ingress topic in ``round_`` (its shard's, in a sharded deployment);
        ``None`` if no announced layout serves the round (the fleet then skips it)."""
        plan = self.config.shards
        if plan is None:
            return self.topics
        layout = plan.layout_for_round(round_)
        if layout is None:
            return None
        topics = self._shard_topics.get(layout.generation)
        if topics is None:
            topics = self._shard_topics[layout.generation] = self._layout_topics(layout)
        return topics

    def _layout_topics(self, layout: ShardLayout) -> list[str]:
        deployment = self.config.deployment
        return [
            ingress_topic(deployment, dev, layout.label(layout.index_of(dev))) for dev in self.ids
        ]

    def reports(self, round_index: int) -> list[tuple[list[int], list[int], int, int]]:
        """``(keys, signs, seed, z)`` of every device for the run's ``round_index``-th round.

        Advances the devices' generators: call it once per round, in order.
        """
        vectors = self.model.vectors(round_index, self._data_rngs)
        mech = self._mechanism
        out = []
        for (keys, signs), rng in zip(vectors, self._rand_rngs, strict=True):
            seed, z = mech.randomise_keys(keys, signs, getrandbits=device_bits(rng))
            out.append((keys, signs, seed, z))
        return out

    async def run(self) -> dict[str, Any]:
        """Connect, publish every round, disconnect; returns :meth:`summary`."""
        cfg = self.config
        if cfg.mode == "connections":
            ensure_fd_limit(cfg.connection_count + _FDS_RESERVED)
        self.stats = _Stats()
        sweeper = asyncio.create_task(self._sweep(), name="fleet-timeouts")
        try:
            self.version = await self._negotiate()
            self._conns = self._make_connections()
            t0 = time.monotonic()
            await self._connect_all(self._conns)
            self.stats.connect_seconds = time.monotonic() - t0
            self.stats.connected_first = self._connected
            self.stats.connections_first = sum(c.connected for c in self._conns)
            index = 0
            previous: int | None = None
            while not self.stopping and (cfg.rounds == 0 or index < cfg.rounds):
                if index:
                    await self._reconnect_missing()
                round_ = next_round(
                    time.time(),
                    cfg.round_seconds,
                    cfg.round_offset,
                    previous,
                    join_current=cfg.join_current_round,
                )
                if previous is not None and round_ > previous + 1:
                    skipped = round_ - previous - 1
                    self.stats.rounds_skipped += skipped
                    logger.warning(
                        "skipped %d round(s) after round %d: it ended after the next one's "
                        "first half (raise round_seconds or lower the offset and spread)",
                        skipped,
                        previous,
                    )
                start = round_start(round_, cfg.round_seconds)
                if not await self._sleep_until(start + cfg.round_offset):
                    break
                await self._round(index, round_)
                previous = round_
                index += 1
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await asyncio.gather(*(c.close(2.0) for c in self._conns))
            self.metrics.set_truth(self.truth)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """The run's counts and rates (the ``--json`` document of ``coco fleet``)."""
        st = self.stats
        duration = time.monotonic() - st.started
        cfg = self.config
        return {
            "devices": cfg.devices,
            "mode": cfg.mode,
            "connections": cfg.connection_count,
            "connected": st.peak_connected,
            "connected_at_start": st.connected_first,
            "rounds": cfg.rounds,
            "rounds_completed": st.rounds_completed,
            "round_seconds": cfg.round_seconds,
            "first_round": self.rounds_used[0] if self.rounds_used else None,
            "last_round": self.rounds_used[-1] if self.rounds_used else None,
            "rounds_skipped": st.rounds_skipped,
            "rounds_late": st.rounds_late,
            "reports_published": self.published,
            "publish_failures": dict(self.publish_failures),
            "connect_failures": dict(self.connect_failures),
            "connect_rate_per_s": (  # connections (not devices) per second
                st.connections_first / st.connect_seconds if st.connect_seconds > 0 else None
            ),
            "publish_rate_per_s": (
                self.published / st.publish_seconds if st.publish_seconds > 0 else None
            ),
            "duration_seconds": duration,
            "seed": cfg.seed,
            "model": cfg.model,
            "qos": cfg.qos,
            "mqtt_version": self.version,
            "deployment": cfg.deployment,
            "spec_fingerprint": self.spec.fingerprint,
            "interrupted": st.interrupted,
        }

    def ground_truth(self) -> dict[str, Any]:
        """The SIMULATION-ONLY ground-truth document (``--ground-truth``)."""
        return self.truth.to_dict(
            spec=self.spec,
            seed=self.config.seed,
            model=self.config.model,
            extra={
                "devices": self.config.devices,
                "round_seconds": self.config.round_seconds,
                "rounds_completed": self.stats.rounds_completed,
            },
        )

    # -- connections --

    def _make_connections(self) -> list[_Connection]:
        conns = self._new_connections()
        for k, conn in enumerate(conns):
            conn.node = k  # spread over the nodes of a cluster
        return conns

    def _new_connections(self) -> list[_Connection]:
        cfg = self.config
        if cfg.mode == "connections":
            secret = cfg.credentials_secret
            return [
                _Connection(
                    dev,
                    username=dev if secret is not None else cfg.username,
                    password=device_password(secret, dev) if secret is not None else cfg.password,
                    window=cfg.window,
                    on_lost=self._lost,
                )
                for dev in self.ids
            ]
        run = secrets.token_hex(4)
        return [
            _Connection(
                f"coco-fleet-{run}-{k}",
                username=cfg.username,
                password=cfg.password,
                window=cfg.window,
                on_lost=self._lost,
            )
            for k in range(cfg.connection_count)
        ]

    async def _negotiate(self) -> Negotiated:
        """The MQTT version of every connection (a probe for ``auto``; MQTT 5 if the
        broker cannot be probed: the connections then count the failure)."""
        tls = self._tls if isinstance(self._tls, ssl.SSLContext) else None
        try:
            return await negotiate(
                self.config.mqtt_version,
                self._host,
                self._port,
                tls=tls,
                timeout=self.config.connect_timeout,
            )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            logger.debug("MQTT version probe failed: %s", exc)
            return "5"

    def _devices_on(self, conn: _Connection) -> int:
        if self.config.mode == "connections":
            return 1
        k, n = self._conns.index(conn), self.config.devices
        return len(range(k, n, len(self._conns)))

    def _lost(self, conn: _Connection) -> None:
        conn.node += 1  # reconnect to the next node (the lost one may have died)
        self._connected -= self._devices_on(conn)
        self.metrics.connected.set(self._connected)

    async def _connect_all(self, conns: list[_Connection]) -> None:
        cfg = self.config
        gate = asyncio.Semaphore(_CONNECT_CONCURRENCY)
        start = time.monotonic()

        async def one(i: int, conn: _Connection) -> None:
            if cfg.ramp_up > 0:
                delay = start + i / cfg.ramp_up - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), delay)
            if self.stopping:
                return
            async with gate:
                if self.stopping:
                    return
                host, port, _ = self._nodes[conn.node % len(self._nodes)]
                reason = await conn.connect(
                    host, port, self._tls, cfg.connect_timeout, self.version
                )
            if reason is None:
                if self.stopping:
                    await conn.close(1.0)
                    return
                self._connected += self._devices_on(conn)
                self.stats.peak_connected = max(self.stats.peak_connected, self._connected)
                self.metrics.connected.set(self._connected)
            else:
                conn.node += 1  # the next attempt goes to the next node of a cluster
                self.connect_failures[reason] += 1
                self.metrics.connect_failure(reason)
                logger.debug("connection refused or failed: %s", reason)

        await asyncio.gather(*(one(i, c) for i, c in enumerate(conns)))

    async def _reconnect_missing(self) -> None:
        missing = [c for c in self._conns if not c.connected]
        if missing:
            await self._connect_all(missing)

    # -- rounds --

    def _count(self, reason: str | None) -> None:
        if reason is None:
            self.published += 1
            self.metrics.published.inc()
        else:
            self.publish_failures[reason] += 1
            self.metrics.publish_failure(reason)

    async def _sleep_until(self, unix_time: float) -> bool:
        """Until the wall clock reads ``unix_time``; ``False`` if the fleet was stopped."""
        while not self.stopping:
            delay = unix_time - time.time()
            if delay <= 0:
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
        return False

    async def _round(self, index: int, round_: int) -> None:
        """Publish the run's ``index``-th round of reports in wall-clock round ``round_``."""
        cfg = self.config
        self.rounds_used.append(round_)
        reports = self.reports(index)  # every device, connected or not: reproducible
        topics = self.topics_for(round_)
        if topics is None:
            logger.warning("no announced shard layout serves round %d: not reporting", round_)
            self.stats.rounds_skipped += 1
            return
        begin = round_start(round_, cfg.round_seconds) + cfg.round_offset
        n = len(reports)
        fingerprint = self.spec.fingerprint_int
        conns = self._conns
        k = len(conns)
        own = cfg.mode == "connections"
        start = time.monotonic()
        self._outstanding = 0
        self._settled.clear()
        for i, (keys, signs, seed, z) in enumerate(reports):
            due = begin + cfg.round_spread * i / n
            if cfg.round_spread > 0 and not await self._sleep_until(due):
                break
            if self.stopping:
                break
            conn = conns[i] if own else conns[i % k]
            if not own and conn.in_flight >= conn.window:
                await conn.wait_room()
            payload = encode_report(fingerprint, round_, seed, z)
            if self._on_report is not None:
                self._on_report(topics[i], payload)
            self._outstanding += 1
            self._settled.clear()
            done = self._outcome(conn, round_, keys, signs, (seed, z))
            conn.publish(topics[i], payload, cfg.qos, done)
            if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)
        if self._outstanding > 0:
            await self._await_settled()
        self.stats.publish_seconds += time.monotonic() - start
        complete = not self.stopping and self._outstanding == 0
        if complete:
            self.stats.rounds_completed += 1
            self.metrics.rounds.inc()
        if time.time() >= round_start(round_ + 1, cfg.round_seconds):
            self.stats.rounds_late += 1
            logger.warning(
                "round %d was still publishing when it ended (raise round_seconds or lower the "
                "offset and spread)",
                round_,
            )
        self.metrics.set_truth(self.truth)

    def _outcome(
        self,
        conn: _Connection,
        round_: int,
        keys: list[int],
        signs: list[int],
        report: tuple[int, int],
    ) -> _Done:
        """The callback that settles one report: counts, truth, ``on_acked``, the window."""

        def done(reason: str | None) -> None:
            self._count(reason)
            if reason is None:
                self.truth.add(round_, keys, signs)
                if self._on_acked is not None:
                    self._on_acked(round_, *report)
            self._outstanding -= 1
            if self._outstanding == 0:
                self._settled.set()
            conn.acked()

        return done

    async def _await_settled(self) -> None:
        """Until every report of the round is acknowledged or failed (the sweeper fails
        them after ``publish_timeout``); after :meth:`stop`, ``drain_timeout`` at most."""
        drain = self.config.drain_timeout
        if self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), drain)
            return
        stop = asyncio.ensure_future(self._stop.wait())
        settled = asyncio.ensure_future(self._settled.wait())
        try:
            await asyncio.wait({stop, settled}, return_when=asyncio.FIRST_COMPLETED)
            if not settled.done():
                await asyncio.wait({settled}, timeout=drain)
        finally:
            stop.cancel()
            settled.cancel()

    async def _sweep(self) -> None:
        """Fail (``timeout``) QoS 1 publishes unacknowledged for ``publish_timeout`` s."""
        period = min(1.0, self.config.publish_timeout / 4)
        while True:
            await asyncio.sleep(period)
            horizon = time.monotonic() - self.config.publish_timeout
            for conn in self._conns:
                if conn.tracker.pending:
                    conn.tracker.expire(horizon)
