"""The shuffling bridge: per-device ingress reports in, uniformly permuted signed batches out.

Devices publish 16-byte eps-LDP reports to ``coco/v1/<dep>/ingress/<device-id>``. The
:class:`Shuffler` subscribes to ``coco/v1/<dep>/ingress/+`` (and to nothing else), validates
each report, and publishes shuffled, Ed25519-sealed batches (:mod:`edge.batch_auth`) of at
least ``min_batch`` reports to ``coco/v1/<dep>/batches``. It is a thin shell: every decision
(rounds, pools, duplicates, release) is :mod:`broker.core`'s, every durable write
:mod:`broker.store`'s. Privacy rests on four properties:

1. **No batch smaller than** ``min_batch`` (:mod:`broker.core`, invariant 1).
2. **No sender identity leaves the process.** The device id (last topic level) is turned
   at once into a keyed BLAKE2b token (:func:`broker.store.token_of`) under a secret key of
   the state directory, used only for the one-report-per-device-per-round rule; the id is
   never logged at any level, never a metric label, never persisted. A batch holds only
   ``seed | z`` records; publishes carry no properties.
3. **Uniform permutation.** Each pool is shuffled with :class:`random.SystemRandom`
   (Fisher-Yates driven by ``os.urandom``), and ``batch_id`` is ``secrets.token_bytes(16)``.
4. **At most one report per device in any batch** (:mod:`broker.core`, invariant 2).

Rounds are wall-clock rounds (:mod:`edge.rounds`); a report outside the acceptance window
around the shuffler's clock is rejected (``round_too_old``, ``round_in_future``) and changes
nothing. Each round is released whole when it closes (split above ``max_batch``).

Delivery: a PUBACK is a promise
-------------------------------
The ingest connection (gmqtt) has a **persistent session** by default: client id
``client_id`` (default: the ``username``, else ``coco-shuffler-<deployment>``), clean start
off, session expiry ``session_expiry``. A report's PUBACK is sent to the broker only
*after* its effect is written to the state directory's log (:meth:`_handle_report`, called
synchronously from gmqtt's read loop, stages the record; :class:`GroupCommit` writes the
records of one socket read in one ``write(2)`` and then sends their PUBACKs).
So a report the broker handed over is either in the log (and survives ``kill -9``) or not
acknowledged, and the broker redelivers it to the session. Released batches are written to
the log before they are published and leave it when the broker acknowledges them; after a
restart the unacknowledged ones are re-sent with the same bytes and ``batch_id``. A stop
disconnects without unsubscribing, so the broker keeps queueing reports for the session;
from the moment it is requested nothing more is handled, so no report is logged whose
PUBACK could be lost with the connection (it would come back as a duplicate).
A report published at QoS 0 reaches the shuffler at QoS 0 (a broker never raises the
publisher's QoS): it is validated, counted and pooled the same way, with no PUBACK to hold
back, so a crash may lose it, as QoS 0 allows.

Without a state directory (``state_dir=None``: tests, the in-process demo) nothing is
persisted: at stop every pool of at least ``min_batch`` reports is released, smaller ones
are dropped (``at_shutdown``), and batches not acknowledged within ``drain_timeout`` are
dropped (``unpublished_at_shutdown``), each logged at INFO with its count.

Hostile input
-------------
Every message is checked before anything is stored: the topic (one level of at most 64
characters: ``bad_topic``, ``bad_device_id``), ``retain`` (``retained``), the wire format,
the fingerprint, ``z < t``, the round window and the duplicate rule; each refusal is
counted by reason and harms nothing else. The ingest connection announces a Maximum Packet
Size of :data:`INGEST_MAX_PACKET` bytes (MQTT 5), so the broker never sends it an oversized
message: a flood of huge messages costs the shuffler nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import secrets
import ssl
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import aiomqtt
import gmqtt  # type: ignore[import-untyped]
from gmqtt.mqtt.constants import MQTTv50, MQTTv311  # type: ignore[import-untyped]
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client import CollectorRegistry

from broker.core import (
    Acked,
    Admitted,
    Applied,
    BatchMaker,
    CoreConfig,
    Dropped,
    Effect,
    Released,
    RoundPolicy,
    ShufflerCore,
    batch_count_of,
    batch_id_of,
    batch_round_of,
)
from broker.effects import is_manifest
from broker.ingest import (
    MQTT_LOGGER,
    Acks,
    GroupCommit,
    IngestError,
    SessionTakenOverError,
    ack_after_handling,
)
from broker.keys import check_announced, load_signer
from broker.lease import LeaseLostError, ShardControl
from broker.metrics import ShufflerMetrics
from broker.store import EffectLog, LogFullError, StateDir, token_of
from edge import mqtt_url
from edge.batch_auth import BatchSigner
from edge.codec import KIND_REPORT, REPORT_SIZE, VERSION, CodecError, decode_report
from edge.errors import SpecError
from edge.mqtt_version import MqttVersion, Negotiated, check_mqtt_version, negotiate
from edge.rounds import check_round_seconds
from edge.shards import ShardPlan, parse_label
from edge.spec import MechanismSpec
from edge.topics import MAX_NAME, batches_topic, check_name, ingress_filter, manifests_topic

__all__ = [
    "INGEST_MAX_PACKET",
    "RoundPolicy",
    "SessionTakenOverError",
    "Shuffler",
    "ShufflerConfig",
    "parse_broker_url",
]

logger = logging.getLogger(__name__)

try:  # the C XXH32 (same values as edge.device.xxh32, the protocol's reference)
    from xxhash import xxh32_intdigest as _xxh32_c

    def xxh32(data: bytes, seed: int) -> int:
        return int(_xxh32_c(data, seed))
except ImportError:  # pragma: no cover
    from edge.device import xxh32

INGEST_MAX_PACKET = 512
"""Largest MQTT packet the ingest connection accepts (a report's PUBLISH is under 100 bytes)."""
# gmqtt reconnects by itself while ``failed_connections <= reconnect_retries`` (-1 means
# unlimited); -2 disables that, so the shuffler's own loop (backoff, metrics) is in charge.
_GMQTT_NO_AUTO_RECONNECT = -2
_GMQTT_KEEPALIVE = 60
_SESSION_TAKEN_OVER = 0x8E
_REPORT = struct.Struct(">2xIIIH")  # (version, kind,) fingerprint, round, seed, z
_QUICK_LOSS_SECONDS = 2.0
_QUICK_LOSSES = 3
"""A subscribed session lost within 2 s, three times in a row, means another client keeps
taking the client id over (Mosquitto 2.0 closes the old connection without a reason)."""


def parse_broker_url(url: str) -> tuple[str, int, bool]:
    """``(host, port, tls)`` of a broker URL (:func:`edge.mqtt_url.parse_broker_url`)."""
    return tuple(mqtt_url.parse_broker_url(url))  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class ShufflerConfig:
    """Settings of one shuffler (see the module docstrings of this module and
    :mod:`broker.core` for their role).

    ``broker`` is ``mqtt://host:port`` or ``mqtts://host:port`` (TLS, optionally with
    ``ca_file``). ``state_dir`` holds the durable state (:mod:`broker.store`); ``None``
    keeps everything in memory. The batch signer is ``signer`` if given, else the key in
    ``signing_key`` (default ``<state_dir>/signing.key``), else (no state directory) a
    fresh in-memory key.
    """

    broker: str
    deployment: str
    spec: MechanismSpec
    min_batch: int
    round_seconds: int
    max_skew: float = 5.0
    late_seconds: float = 600.0
    """Reports of an ended round still accepted this long (queued while the shuffler was
    down); their duplicate tokens are kept as long (:mod:`broker.core`, "Rounds")."""
    max_batch: int = 10_000
    release_size: int | None = None
    round_policy: RoundPolicy = "carry"
    flush_interval: float = 1.0
    qos: int = 1
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    client_id: str | None = None
    session_expiry: int = 7 * 24 * 3600
    mqtt_version: MqttVersion = "auto"
    """``auto``: MQTT 5, or 3.1.1 where the broker refuses 5 (probed once per process,
    :func:`edge.mqtt_version.negotiate`). On 3.1.1 the session is ``clean_session=0`` (kept
    until a clean connection), there is no Maximum Packet Size (the broker's own limit
    applies; the ingest checks every payload's length first) and no DISCONNECT 0x8E on a
    takeover (only the quick-loss rule, or a shard lease, tells)."""
    state_dir: Path | None = None
    fsync: bool = False
    signing_key: Path | None = None
    create_signing_key: bool = False
    """Create ``signing_key`` (default ``<state_dir>/signing.key``) if it does not exist;
    otherwise a missing key is an error (broker/keys.py)."""
    announced_public_key: str | None = None
    """The announcement's ``batch_public_key``: the shuffler refuses any other key."""
    signer: BatchSigner | None = field(default=None, repr=False)
    shard: str | None = None
    """This shuffler's shard label (``g0s1``) in a sharded deployment; ``plan`` is then the
    announced layouts (:class:`edge.shards.ShardPlan`)."""
    plan: ShardPlan | None = None
    lease_ttl: float = 30.0
    """The shard lease's time to live (broker/lease.py); renewed every third of it."""
    lease_settle: float = 1.0
    """How long a lease claim waits before it reads the retained value back."""
    backlog_quiet: float = 2.0
    """After a (re)subscription, rounds that ended while the shuffler was away are held
    open until no report of an ended round has arrived for this long (bounded by
    ``late_seconds``), so the broker's queued backlog is still accepted."""
    max_reports_per_round: int = 1_000_000
    max_outbox_batches: int = 1_000
    compact_bytes: int = 64 << 20
    """Compact the log once it has grown by this many bytes since the last compaction."""
    publish_timeout: float = 10.0
    drain_timeout: float = 10.0
    reconnect_min: float = 0.1
    reconnect_max: float = 10.0

    def __post_init__(self) -> None:
        parse_broker_url(self.broker)
        check_name("deployment", self.deployment)
        if not isinstance(self.spec, MechanismSpec):
            raise ValueError(f"spec must be a MechanismSpec, got {self.spec!r}")
        check_round_seconds(self.round_seconds)
        self.core_config()  # validates the release rules
        if self.qos != 1:
            raise ValueError(f"qos must be 1 (at-least-once batches), got {self.qos}")
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
            raise ValueError("client_id must be None (derived from the account) or non-empty")
        check_mqtt_version(self.mqtt_version)
        if (self.shard is None) != (self.plan is None):
            raise ValueError("a sharded shuffler needs both shard and plan (the announcement's)")
        if self.shard is not None and self.plan is not None:
            if self.plan.layout_of_label(self.shard) is None:
                raise ValueError(
                    f"shard {self.shard} is not one of the announced shards "
                    f"({', '.join(self.plan.labels)})"
                )
            if self.signer is not None and self.signer.shard != self.shard:
                raise ValueError(f"the signer is not shard {self.shard}'s")
        if self.compact_bytes < 1:
            raise ValueError(f"compact_bytes must be >= 1, got {self.compact_bytes}")

    def core_config(self) -> CoreConfig:
        return CoreConfig(
            fingerprint=self.spec.fingerprint_int,
            t=self.spec.t,
            round_seconds=self.round_seconds,
            min_batch=self.min_batch,
            max_batch=self.max_batch,
            release_size=self.release_size,
            round_policy=self.round_policy,
            max_skew=self.max_skew,
            late_seconds=self.late_seconds,
            max_reports_per_round=self.max_reports_per_round,
            max_outbox_batches=self.max_outbox_batches,
        )

    @property
    def ingest_client_id(self) -> str:
        """The persistent session's client id: derived from the account, and fixed per
        shard (``-<label>``), so the broker lets one connection consume a shard's session."""
        base = self.client_id or self.username or f"coco-shuffler-{self.deployment}"
        return base if self.shard is None else f"{base}-{self.shard}"


class Shuffler:
    """The shuffling bridge as an async context manager: ``async with Shuffler(cfg) as s:
    await s.run()``. Reusable after exit, not re-entrant.

    Entering opens (and locks) the state directory and replays its log; :meth:`run`
    returns after :meth:`stop` and the drain. If the task running :meth:`run` is
    cancelled, it drains the same way and then re-raises :class:`asyncio.CancelledError`.
    """

    def __init__(self, config: ShufflerConfig, *, registry: CollectorRegistry) -> None:
        self.config = config
        self.metrics = ShufflerMetrics(registry)
        self.metrics.min_batch.set(config.min_batch)
        # Not zeros before the state is recovered: an operator's "drained" check must not
        # pass while a log of pooled reports is being replayed.
        nan = math.nan
        self.metrics.buffer_reports.set_function(
            lambda: self.core.buffered if self._recovered else nan
        )
        self.metrics.outbox_reports.set_function(
            lambda: self.core.outbox_reports if self._recovered else nan
        )
        self._host, self._port, self._tls = parse_broker_url(config.broker)
        shard = config.shard
        self._ingress = ingress_filter(config.deployment, shard)
        self._ingress_prefix = self._ingress[:-1]
        self._batches = batches_topic(config.deployment, shard)
        self._manifests = manifests_topic(config.deployment, shard)
        self._plan = config.plan
        self._layout = (
            None if config.plan is None or shard is None else (config.plan.layout_of_label(shard))
        )
        self._shard_index = -1 if shard is None else parse_label(shard)[1]
        self._serves: dict[int, bool] = {}  # round -> whether this shard's layout serves it
        self._control: ShardControl | None = None
        self._owner = secrets.token_hex(16)  # a state directory's persistent id replaces it
        self.retired = False
        self._random = random.SystemRandom()
        self._lock = asyncio.Lock()
        self.core = ShufflerCore(config.core_config())
        self._state: StateDir | None = None
        self._log: EffectLog | None = None
        self._compacted_size = 0
        self._group: GroupCommit | None = None
        self._token_key = b""
        self._recovered = False
        self._version: Negotiated | None = (
            None if config.mqtt_version == "auto" else (config.mqtt_version)
        )
        self.signer: BatchSigner | None = config.signer
        self._reset_events()

    def _reset_events(self) -> None:
        self._outbox_changed = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self._connected = asyncio.Event()
        self._publisher_ready = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._consumption_done = asyncio.Event()
        self._closing = asyncio.Event()
        self._subscribed_at: float | None = None
        self._late_offers = 0
        self._last_late = 0.0
        self._paused = asyncio.Event()
        self._unlogged_acks: dict[bytes, bytes] = {}
        self.failure: BaseException | None = None

    async def __aenter__(self) -> Self:
        if self._lock.locked():
            raise RuntimeError("Shuffler is not re-entrant: it is already running")
        await self._lock.acquire()
        try:
            self._reset_events()
            self._open_state()
        except BaseException:
            self._close_state()
            self._lock.release()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_requested.set()
        self._close_state()
        self._lock.release()

    def _open_state(self) -> None:
        cfg = self.config
        self.core = ShufflerCore(cfg.core_config())
        if self._plan is not None:
            self._set_plan(self._plan)
        self._recovered = False
        if cfg.state_dir is None:
            self._token_key = secrets.token_bytes(32)  # a fresh key per run
            self.signer = self._memory_signer()
            self._recovered = True
            return
        # the key first: a missing or wrong one refuses before anything is created
        if cfg.signer is not None:
            check_announced(cfg.signer.public_key_hex, cfg.announced_public_key, "(in memory)")
            self.signer = cfg.signer
        else:
            self.signer = load_signer(
                cfg.signing_key or cfg.state_dir / "signing.key",
                cfg.deployment,
                create=cfg.create_signing_key,
                announced=cfg.announced_public_key,
                shard=cfg.shard,
            )
        self._state = StateDir(cfg.state_dir).__enter__()
        self._token_key = self._state.token_key()
        self._owner = self._state.owner_id()
        self._state.publish_public_key(self.signer.public_key_hex)
        self._log = self._state.log(fsync=cfg.fsync, round_seconds=cfg.round_seconds)
        for effect in self._log.replay():
            self.core.apply(effect)
        before = self.core.state_config
        self._commit(self.core.reconfigure(self._maker()), compact=False)
        if before is not None and before != self.core.state_config:
            logger.warning(
                "state %s: recorded under round_seconds %d and spec %08x, now %d and %08x: "
                "open rounds renumbered, pools of another spec released or dropped",
                cfg.state_dir,
                *before,
                cfg.round_seconds,
                cfg.spec.fingerprint_int,
            )
        self._log.compact(self.core.snapshot())
        self._compacted_size = self._log.size
        recovered = self.core.buffered + self.core.outbox_reports
        self.metrics.recovered_reports.set(recovered)
        self._recovered = True
        logger.info(
            "state %s: %d reports in pools and %d in %d unacknowledged batches recovered; "
            "rounds closed until %d",
            cfg.state_dir,
            self.core.buffered,
            self.core.outbox_reports,
            len(self.core.outbox()),
            self.core.closed,
        )

    def _memory_signer(self) -> BatchSigner:
        cfg = self.config
        if cfg.signer is not None:
            signer = cfg.signer
        elif cfg.signing_key is not None:
            signer = load_signer(
                cfg.signing_key, cfg.deployment, create=cfg.create_signing_key, shard=cfg.shard
            )
        else:
            signer = BatchSigner.generate(cfg.deployment, cfg.shard)
        check_announced(signer.public_key_hex, cfg.announced_public_key, "(in memory)")
        return signer

    def _close_state(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._state is not None:
            self._state.__exit__()
            self._state = None

    def stop(self) -> None:
        """Request a graceful drain; :meth:`run` returns when it is done."""
        self._stop_requested.set()

    @property
    def buffered(self) -> int:
        """Accepted reports waiting in round pools."""
        return self.core.buffered

    @property
    def connected(self) -> asyncio.Event:
        """Set while subscribed to the ingress filter (for tests and health checks)."""
        return self._connected

    @property
    def public_key_hex(self) -> str:
        """The public key that verifies this shuffler's batches."""
        if self.signer is None:
            raise RuntimeError("the shuffler is not open")
        return self.signer.public_key_hex

    # --- effects ------------------------------------------------------------------------

    def _commit(self, effects: list[Effect], *, compact: bool = True) -> None:
        """Log ``effects`` (one write, after anything staged), then apply them and count
        what they did."""
        if not effects:
            return
        if self._log is not None:
            self._log.extend(effects)
        for effect in effects:
            self._count(self.core.apply(effect), effect)
        if any(isinstance(e, Released) for e in effects):
            self._outbox_changed.set()
        if compact:
            self._maybe_compact()

    def _settle(self) -> None:
        """Decide the reports offered since the last settle (one socket read), write their
        effects (one write), apply them, and count: the step before their PUBACKs."""
        effects, duplicates = self.core.settle()
        if duplicates:
            self.metrics.reject("duplicate_in_round", duplicates, received=False)
        if self.core.late_offers != self._late_offers:
            self._late_offers = self.core.late_offers
            self._last_late = time.monotonic()
        if not effects:
            return
        if self.config.release_size is None:
            self._commit(list(effects), compact=False)
        else:  # a latency cap: each pool leaves as soon as it holds release_size reports
            for effect in effects:
                for piece in self.core.pieces(effect):
                    self._commit([piece], compact=False)
                    release = self.core.release_early(piece.round, self._maker())
                    if release is not None:
                        self._commit([release], compact=False)
        self._maybe_compact()

    def _count(self, applied: Applied, effect: Effect) -> None:
        if isinstance(effect, Admitted):
            self.metrics.live.accepted += applied.admitted
            return
        for reason, count in applied.dropped.items():
            self.metrics.drop(reason, count)
            if isinstance(effect, Dropped):
                logger.info("round %d: %d reports dropped (%s)", effect.round, count, reason)
        if isinstance(effect, Released):
            logger.info(
                "round %d released: %d reports in %d batches",
                effect.round,
                applied.released_reports,
                applied.released_batches,
            )

    def _maybe_compact(self) -> None:
        log = self._log
        if log is not None and log.size - self._compacted_size >= self.config.compact_bytes:
            log.compact(self.core.snapshot())
            self._compacted_size = log.size

    def _tick(self) -> None:
        if self.core.pending:  # reports offered in a read whose flush has not run yet
            if self._group is not None:
                self._group.flush()
            else:
                self._settle()
        if self.core.pending:
            return  # the flush failed: the shuffler is stopping
        self._commit(self.core.tick(time.time(), self._maker(), hold=self._holding()))
        self._check_retired()

    def _holding(self) -> bool:
        """Whether rounds that ended while the shuffler was away are held open: until it is
        subscribed and no report of an ended round has arrived for ``backlog_quiet`` s
        (the broker's queued backlog has drained); the core bounds the hold by
        ``late_seconds``."""
        subscribed = self._subscribed_at
        if subscribed is None or not self._connected.is_set():
            return True
        quiet = time.monotonic() - max(subscribed, self._last_late)
        return quiet < self.config.backlog_quiet

    def _maker(self) -> BatchMaker:
        signer = self.signer
        if signer is None:
            raise RuntimeError("the shuffler is not open")
        return BatchMaker(
            shuffle=self._random.shuffle,
            new_batch_id=lambda: secrets.token_bytes(16),
            seal=signer.seal,
            seal_manifest=signer.seal_manifest,
        )

    # --- main loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """Consume, shuffle and publish until :meth:`stop` (or cancellation), then drain.

        Raises :class:`SessionTakenOverError` when another client took over the session.
        """
        if not self._lock.locked():
            raise RuntimeError("use 'async with Shuffler(...) as shuffler: await shuffler.run()'")
        cancelled = False
        self._outbox_changed.set()  # recovered batches go out first
        if self._layout is not None:
            await self._acquire_shard()  # LeaseRefusedError: another shuffler has it
        async with asyncio.TaskGroup() as tg:
            if self._control is not None:
                tg.create_task(self._hold_shard(), name="shuffler-lease")
            ingest = tg.create_task(self._ingest_loop(), name="shuffler-ingest")
            publisher_connection = tg.create_task(
                self._connection_loop(), name="shuffler-publisher-connection"
            )
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
            _, pending = await asyncio.wait(
                {ingest, publisher_connection}, timeout=self.config.publish_timeout
            )
            for task in pending:
                task.cancel()
        if self.retired and self._control is not None:
            await self._control.release()
        if cancelled:
            raise asyncio.CancelledError
        if self.failure is not None:
            raise self.failure

    async def _drain(self) -> None:
        cfg = self.config
        deadline = time.monotonic() + cfg.drain_timeout
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(cfg.drain_timeout):
                await self._consumption_done.wait()
        with contextlib.suppress(LogFullError):  # paused: the pools stay in the log
            self._tick()
        if self._log is None:
            self._commit(self._release_all())
        remaining = max(deadline - time.monotonic(), 0.0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(remaining):
                while self.core.outbox():
                    self._outbox_changed.clear()
                    await self._outbox_changed.wait()
        unpublished = self.core.outbox_reports
        if self._log is None:
            if unpublished:
                logger.info("shutdown: %d reports in unacknowledged batches dropped", unpublished)
            self.metrics.drop("unpublished_at_shutdown", unpublished)
        else:
            logger.info(
                "shutdown: %d reports in pools and %d in unacknowledged batches kept in %s",
                self.core.buffered,
                unpublished,
                cfg.state_dir,
            )

    def _release_all(self) -> list[Effect]:
        """Without a state directory: release every pool of >= min_batch, drop the rest."""
        effects: list[Effect] = []
        for round_, size in sorted(self.core.pool_sizes().items()):
            if size >= self.config.min_batch:
                release = self.core.release_pool(round_, self._maker())
                if release is not None:
                    effects.append(release)
                    continue
            effects.append(Dropped(round_, "at_shutdown"))
        return effects

    # --- shards: lease, announcement, retirement --------------------------------------

    async def _acquire_shard(self) -> None:
        cfg = self.config
        assert cfg.shard is not None
        version = await self._negotiated()
        control = ShardControl(
            host=self._host,
            port=self._port,
            tls=self._tls,
            ca_file=cfg.ca_file,
            username=cfg.username,
            password=cfg.password,
            client_id=cfg.ingest_client_id,
            deployment=cfg.deployment,
            shard=cfg.shard,
            owner=self._owner,
            ttl=cfg.lease_ttl,
            settle=cfg.lease_settle,
            mqtt5=version == "5",
            timeout=cfg.publish_timeout,
        )
        control.on_announcement = self._on_announcement
        await control.acquire()
        self._control = control

    async def _hold_shard(self) -> None:
        assert self._control is not None
        try:
            await self._control.hold(self._closing)
        except LeaseLostError as exc:
            self._fail(exc)

    def _set_plan(self, plan: ShardPlan) -> None:
        """The layouts in force; this shard's rounds end where a newer layout starts."""
        shard = self.config.shard
        assert shard is not None
        layout = plan.layout_of_label(shard)
        if layout is None:
            return  # this shard's layout was dropped from the announcement: keep the last
        self._plan, self._layout = plan, layout
        self._serves.clear()
        end = plan.rounds_of(layout)[1]
        if end != self.core.end_round:
            self.core.end_round = end
            if end is not None:
                logger.info(
                    "shard %s serves rounds before %d: a layout of generation %d takes over "
                    "from there",
                    shard,
                    end,
                    plan.layout_for_round(end).generation,  # type: ignore[union-attr]
                )

    def _on_announcement(self, announcement: dict[str, object]) -> None:
        shards = announcement.get("shards")
        if shards is None:
            return
        try:
            self._set_plan(ShardPlan.from_json(shards))
        except (SpecError, ValueError) as exc:
            logger.warning("an announced shard plan is ignored (%s)", exc)

    def _check_retired(self) -> None:
        """A shard whose rounds are over, all released and acknowledged, retires: its
        manifests are published (they are in the outbox), one INFO line, exit 0."""
        end = self.core.end_round
        if end is None or self.retired or self.core.closed < end * self.config.round_seconds:
            return
        core = self.core
        if core.pool_sizes() or core.outbox() or core.pending or self._unlogged_acks:
            return
        self.retired = True
        logger.info(
            "shard %s retired: every round before %d is released and acknowledged; exiting",
            self.config.shard,
            end,
        )
        self.stop()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.flush_interval)
            try:
                if self._paused.is_set():
                    self._try_resume()
                else:
                    self._tick()
            except LogFullError as exc:
                self._pause(exc)
            except OSError as exc:
                self._fail(exc)

    # --- a full disk: pause, retry, resume ----------------------------------------------

    def _pause(self, exc: BaseException) -> None:
        """The log could not be written for lack of space: nothing it held was applied or
        acknowledged. Stop consuming (the ingest disconnects, keeping its session: the
        broker keeps and later redelivers every unacknowledged report), keep the
        published-but-unlogged acknowledgements, and retry every flush interval."""
        self.metrics.log_full.inc()
        if self._paused.is_set():
            return
        logger.error(
            "the shuffler log in %s cannot be written (%s): acknowledgements paused, ingest "
            "disconnected, retrying every %.1f s",
            self.config.state_dir,
            exc,
            self.config.flush_interval,
        )
        self._paused.set()
        self.metrics.log_paused.set(1)

    def _try_resume(self) -> None:
        """Write what waits (acknowledgements of published batches, or a no-op record):
        once that succeeds there is space again, and consumption resumes."""
        pending: list[Effect] = [Acked(batch_id) for batch_id in self._unlogged_acks]
        probe = pending or [next(iter(self.core.snapshot()))]  # Configured: a no-op
        self._commit(probe, compact=False)  # raises LogFullError while the disk is full
        for batch_id in list(self._unlogged_acks):
            self._count_ack(batch_id)
        self._unlogged_acks.clear()
        self._paused.clear()
        self.metrics.log_paused.set(0)
        self._outbox_changed.set()
        logger.error("the shuffler log in %s is writable again: resuming", self.config.state_dir)

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            logger.error("the shuffler state cannot be written (%s); stopping", exc)
            self.failure = exc
        self._stop_requested.set()

    # --- ingest (gmqtt) -----------------------------------------------------------------

    async def _negotiated(self) -> Negotiated:
        """The MQTT version to speak, probed once for ``auto`` (raises ``OSError`` or
        ``TimeoutError`` while the broker cannot be reached: the callers retry)."""
        if self._version is None:
            tls = ssl.create_default_context(cafile=self.config.ca_file) if self._tls else None
            self._version = await negotiate(
                self.config.mqtt_version,
                self._host,
                self._port,
                tls=tls,
                timeout=self.config.publish_timeout,
            )
        return self._version

    def _make_gmqtt_client(self) -> gmqtt.Client:
        cfg = self.config
        kwargs: dict[str, object] = {}
        if self._version == "5":
            kwargs["session_expiry_interval"] = cfg.session_expiry
            kwargs["maximum_packet_size"] = INGEST_MAX_PACKET
        client = gmqtt.Client(
            cfg.ingest_client_id, clean_session=False, logger=MQTT_LOGGER, **kwargs
        )
        client.set_config({"reconnect_retries": _GMQTT_NO_AUTO_RECONNECT})
        if cfg.username is not None:
            client.set_auth_credentials(cfg.username, cfg.password)
        self._group = GroupCommit(client, self._flush_log, self._fail, self._pause)
        ack_after_handling(client, self._on_message, self._group)
        client.on_message = self._on_unacknowledged_message
        return client

    def _flush_log(self) -> None:
        """Settle and write what this read offered; raises if the state failed before (then
        nothing may be acknowledged)."""
        if self.failure is not None:
            raise OSError(f"the shuffler state failed earlier: {self.failure}")
        self._settle()

    def _gmqtt_ssl(self) -> ssl.SSLContext | bool:
        if not self._tls:
            return False
        return ssl.create_default_context(cafile=self.config.ca_file)

    async def _ingest_loop(self) -> None:
        """Receive reports, reconnecting with backoff, until consumption stops."""
        cfg = self.config
        backoff = cfg.reconnect_min
        first = True
        quick_losses = 0
        while not self._closing.is_set():
            if self._stop_requested.is_set():
                self._consumption_done.set()
                return
            if not first:
                self.metrics.reconnects.inc()
            first = False
            self._subscribed_at = None
            try:
                await self._ingest_session()
                if self._consumption_done.is_set():
                    return
                backoff = cfg.reconnect_min
            except SessionTakenOverError as exc:
                self._fail(exc)
                self._consumption_done.set()
                return
            except (OSError, TimeoutError, gmqtt.MQTTConnectError, IngestError) as exc:
                subscribed = self._subscribed_at
                quick = (
                    subscribed is not None and time.monotonic() - subscribed < _QUICK_LOSS_SECONDS
                )
                quick_losses = quick_losses + 1 if quick else 0
                if quick_losses >= _QUICK_LOSSES:
                    self._fail(
                        SessionTakenOverError(
                            f"the session {cfg.ingest_client_id} at {cfg.broker} was lost "
                            f"{quick_losses} times within {_QUICK_LOSS_SECONDS:g} s of "
                            "subscribing: another client is using this client id (a second "
                            "shuffler for this deployment?)"
                        )
                    )
                    self._consumption_done.set()
                    return
                if not self._paused.is_set():
                    logger.warning(
                        "broker %s: connection lost or refused (%s); retry in %.1f s",
                        cfg.broker,
                        exc,
                        backoff,
                    )
            if self._stop_requested.is_set():
                self._consumption_done.set()
                return
            stop = asyncio.ensure_future(self._stop_requested.wait())
            try:
                await asyncio.wait({stop}, timeout=backoff)
                while self._paused.is_set() and not self._stop_requested.is_set():
                    await asyncio.wait({stop}, timeout=self.config.flush_interval)
            finally:
                stop.cancel()
            backoff = min(backoff * 2, cfg.reconnect_max)

    async def _ingest_session(self) -> None:
        """One gmqtt connection: subscribe, receive until stop or loss, disconnect.

        Every report is handled synchronously in gmqtt's read loop, in arrival order, and
        acknowledged after it is logged; the DISCONNECT at stop keeps the session, so the
        broker queues what arrives while the shuffler is away.
        """
        cfg = self.config
        await self._negotiated()
        client = self._make_gmqtt_client()
        acks = Acks(cfg.publish_timeout)
        client.on_subscribe = acks.on_ack
        client.on_disconnect = acks.on_disconnect
        version = MQTTv311 if self._version == "3.1.1" else MQTTv50
        try:
            async with asyncio.timeout(cfg.publish_timeout):
                await client.connect(
                    self._host,
                    self._port,
                    ssl=self._gmqtt_ssl(),
                    keepalive=_GMQTT_KEEPALIVE,
                    version=version,
                )
            if acks.lost.is_set():
                raise IngestError("connection lost")
            logger.info("connected to %s as %s", cfg.broker, cfg.ingest_client_id)
            # Retain As Published (MQTT 5): a report a device publishes with the retain
            # flag keeps it on the way here and is rejected (``retained``), as is a retained
            # report delivered on subscription (with either protocol version).
            codes = await acks.wait(
                client.subscribe(
                    self._ingress, qos=cfg.qos, retain_as_published=self._version == "5"
                )
            )
            if not codes or codes[0] >= 0x80:
                raise IngestError(f"subscription to {self._ingress} refused {codes!r}")
            logger.info("subscribed to %s", self._ingress)
            self._subscribed_at = time.monotonic()
            self._connected.set()
            self.metrics.connected.set(1)
            self.metrics.ready.set(1 if self._recovered else 0)
            stop = asyncio.ensure_future(self._stop_requested.wait())
            gone = asyncio.ensure_future(acks.lost.wait())
            paused = asyncio.ensure_future(self._paused.wait())
            try:
                await asyncio.wait({stop, gone, paused}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                gone.cancel()
                paused.cancel()
            if self._paused.is_set() and not acks.lost.is_set():
                await self._disconnect_gmqtt(client)  # the session keeps what is not acked
                raise IngestError("paused: the state directory's disk is full")
            if acks.lost.is_set():
                if acks.reason == _SESSION_TAKEN_OVER:
                    raise SessionTakenOverError(
                        f"another client connected as {cfg.ingest_client_id} to {cfg.broker}: "
                        "is a second shuffler running for this deployment?"
                    )
                raise IngestError("connection lost")
            await self._disconnect_gmqtt(client)
            self._consumption_done.set()
            logger.info("stopped consuming ingress")
        finally:
            self._connected.clear()
            self.metrics.connected.set(0)
            self.metrics.ready.set(0)
            if not acks.lost.is_set() and not self._consumption_done.is_set():
                await self._disconnect_gmqtt(client)

    async def _disconnect_gmqtt(self, client: gmqtt.Client) -> None:
        if self._group is not None:
            self._group.flush()  # the PUBACKs of the last read go before the DISCONNECT
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.config.publish_timeout):
                await client.disconnect()

    # --- validation and pooling (synchronous: no await between check and update) ----------

    def _on_unacknowledged_message(
        self, _client: object, topic: object, payload: object, _qos: object, properties: object
    ) -> int:
        """A report delivered at QoS 0 (published so): handled like any other, with no
        PUBACK to hold back. One that cannot be stored is lost, as QoS 0 allows."""
        with contextlib.suppress(OSError):
            self._on_message(topic, payload, properties)
        return 0

    def _on_message(self, topic: object, payload: object, properties: object) -> bool:
        retain = bool(properties.get("retain")) if isinstance(properties, dict) else False
        return self._handle_report(topic, payload, retain=retain)

    def _handle_report(self, topic: object, payload: object, *, retain: bool) -> bool:
        """Validate, log and pool one report; ``True`` once it is durable (or rejected),
        when it may be acknowledged. ``False`` (or raising) leaves it unacknowledged."""
        if self._stop_requested.is_set() or self._paused.is_set():
            # Stopping (or paused: the log cannot be written): the DISCONNECT may already
            # be on its way, so a PUBACK now could be lost and the report, once logged,
            # come back as a duplicate. Leave it to the session: the next connection gets
            # it (or, at QoS 0, nobody: QoS 0 allows that).
            return False
        reason = self._offer(topic, payload, retain=retain)
        if reason is not None:
            self.metrics.reject(reason)
            return True
        self.metrics.live.received += 1
        group = self._group
        if group is not None:
            group.note()  # settled, written and acknowledged after this read
        return True

    def _offer(self, topic: object, payload: object, *, retain: bool) -> str | None:
        """Offer the report to the core (settled after this read) and return ``None``, or
        return the rejection reason."""
        reason = self._topic_reason(topic)
        if reason is not None:
            return reason
        if retain:
            return "retained"  # a retained report would be replayed on every subscription
        report = self._decode(payload)
        if isinstance(report, str):
            return report
        assert isinstance(topic, str)  # checked by _topic_reason
        device = topic[len(self._ingress_prefix) :]
        token = token_of(self._token_key, device)
        if self._layout is not None and not self._in_shard(device, report[1]):
            return "wrong_shard"
        del device  # the id is not needed past this point
        return self.core.offer(time.time(), token, report)

    def _in_shard(self, device: str, round_: int) -> bool:
        """Whether ``device``'s report of ``round_`` is this shard's: the layout in force
        for that round is this shard's layout, and it puts the device in this shard."""
        layout = self._layout
        plan = self._plan
        if layout is None or plan is None:
            return True
        serves = self._serves.get(round_)
        if serves is None:
            if len(self._serves) > 4096:  # hostile round numbers cannot grow it
                self._serves.clear()
            serves = self._serves[round_] = plan.layout_for_round(round_) is layout
        if not serves:
            return False
        digest = xxh32(device.encode(), layout.seed)
        return (digest * layout.count) >> 32 == self._shard_index

    def _topic_reason(self, topic: object) -> str | None:
        """``None`` for an ingress topic with a valid device id, else the reason."""
        if not isinstance(topic, str) or not topic.startswith(self._ingress_prefix):
            return "bad_topic"
        device = topic[len(self._ingress_prefix) :]
        if not device or "/" in device:
            return "bad_topic"
        if len(device) > MAX_NAME:
            return "bad_device_id"
        return None

    @staticmethod
    def _decode(payload: object) -> tuple[int, int, int, int] | str:
        """``(fingerprint, round, seed, z)`` of a valid report, else the codec's reason."""
        if not isinstance(payload, bytes | bytearray):
            return "bad_length"
        if len(payload) == REPORT_SIZE and payload[0] == VERSION and payload[1] == KIND_REPORT:
            fields: tuple[int, int, int, int] = _REPORT.unpack(payload)  # the common case
            return fields
        try:
            return decode_report(payload)[1:]  # raises with the codec's reason
        except CodecError as exc:
            return exc.reason

    # --- publishing (aiomqtt) -----------------------------------------------------------

    def _make_client(self) -> aiomqtt.Client:
        """The publishing connection: clean start, its own client id, no subscription."""
        cfg = self.config
        tls_context = ssl.create_default_context(cafile=cfg.ca_file) if self._tls else None
        session: dict[str, object]
        if self._version == "3.1.1":
            session = {"protocol": aiomqtt.ProtocolVersion.V311, "clean_session": True}
        else:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 0
            session = {
                "protocol": aiomqtt.ProtocolVersion.V5,
                "clean_start": True,
                "properties": properties,
            }
        return aiomqtt.Client(
            self._host,
            self._port,
            username=cfg.username,
            password=cfg.password,
            identifier=f"{cfg.ingest_client_id}-out",
            tls_context=tls_context,
            timeout=cfg.publish_timeout,
            **session,  # type: ignore[arg-type]
        )

    async def _connection_loop(self) -> None:
        """Keep the publishing connection up until closing."""
        backoff = self.config.reconnect_min
        while not self._closing.is_set():
            try:
                await self._negotiated()
                async with self._make_client() as client:
                    self._client = client
                    self._publisher_ready.set()
                    backoff = self.config.reconnect_min
                    await self._watch_publisher(client)
                    return
            except (aiomqtt.MqttError, OSError, TimeoutError) as exc:
                logger.warning(
                    "broker %s: publishing connection lost or refused (%s); retry in %.1f s",
                    self.config.broker,
                    exc,
                    backoff,
                )
            finally:
                self._client = None
                self._publisher_ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), backoff)
            backoff = min(backoff * 2, self.config.reconnect_max)

    async def _watch_publisher(self, client: aiomqtt.Client) -> None:
        """Until closing; raises :class:`aiomqtt.MqttError` when the connection is lost."""
        closing = asyncio.ensure_future(self._closing.wait())
        lost = asyncio.ensure_future(anext(aiter(client.messages)))
        try:
            await asyncio.wait({closing, lost}, return_when=asyncio.FIRST_COMPLETED)
            if lost.done():
                lost.result()  # raises MqttError on a lost connection
        finally:
            closing.cancel()
            lost.cancel()

    async def _publish_loop(self) -> None:
        while True:
            outbox = [m for m in self.core.outbox() if batch_id_of(m) not in self._unlogged_acks]
            if not outbox:
                self._outbox_changed.clear()
                await self._outbox_changed.wait()
                continue
            await self._publisher_ready.wait()
            client = self._client
            if client is None:
                await asyncio.sleep(self.config.reconnect_min)
                continue
            message = outbox[0]
            try:
                await client.publish(
                    self._manifests if is_manifest(message) else self._batches,
                    message,
                    qos=self.config.qos,
                    timeout=self.config.publish_timeout,
                )
            except aiomqtt.MqttError as exc:
                logger.warning("batch publish failed (%s); will retry", exc)
                await asyncio.sleep(self.config.reconnect_min)
                continue
            self._on_batch_acked(message)

    def _on_batch_acked(self, message: bytes) -> None:
        batch_id = batch_id_of(message)
        try:
            self._commit([Acked(batch_id)])
        except LogFullError as exc:  # published; its Acked is written once there is space
            self._unlogged_acks[batch_id] = message
            self._pause(exc)
            return
        except OSError as exc:
            self._fail(exc)
            return
        self._count_ack(batch_id, message)

    def _count_ack(self, batch_id: bytes, message: bytes | None = None) -> None:
        message = message or self._unlogged_acks[batch_id]
        if is_manifest(message):
            self.metrics.manifests_published.inc()
            self._outbox_changed.set()
            return
        count = batch_count_of(message)
        round_ = batch_round_of(message)
        self.metrics.batches_released.inc()
        self.metrics.reports_released.inc(count)
        self.metrics.batch_size.observe(count)
        end = (round_ + 1) * self.config.round_seconds
        self.metrics.release_latency.observe(max(time.time() - end, 0.0))
        self._outbox_changed.set()
