"""The shuffling bridge: per-device ingress reports in, uniformly permuted signed batches out.

Devices publish 16-byte eps-LDP reports to ``coco/v1/<dep>/ingress/<device-id>`` (in a
sharded deployment ``ingress/<shard>/<device-id>``). The :class:`Shuffler` subscribes to its
ingress filter (and to nothing else), validates each report, and publishes shuffled,
Ed25519-sealed batches (:mod:`edge.batch_auth`) of at least ``min_batch`` reports to
``coco/v1/<dep>/batches`` (``batches/<shard>``), each release followed by its signed
manifest on ``manifests`` (``manifests/<shard>``). It is a thin shell: every decision
(rounds, pools, duplicates, release) is :mod:`broker.core`'s, every durable write
:mod:`broker.store`'s; the ingest is :mod:`broker.service.ingesting`, the publishing
:mod:`broker.service.publishing`, a shard's lease and retirement :mod:`broker.service.sharding`.
Privacy rests on four properties:

1. **No batch smaller than** ``min_batch`` (:mod:`broker.core`, invariant 1).
2. **No sender identity leaves the process.** The device id (last topic level) is turned
   at once into a keyed 8-byte token (:func:`broker.store.wal.token_of`) under a secret key of
   the state directory, used only for the one-report-per-device-per-round rule; the id is
   never logged at any level, never a metric label, never persisted. A batch holds only
   ``seed | z`` records; publishes carry no properties.
3. **Uniform permutation.** Each pool is shuffled with :class:`random.SystemRandom`
   (Fisher-Yates driven by ``os.urandom``), and ``batch_id`` is ``secrets.token_bytes(16)``.
4. **At most one report per device in any batch** (:mod:`broker.core`, invariant 2).

Rounds are wall-clock rounds (:mod:`edge.rounds`); a report outside the acceptance window
around the shuffler's clock is rejected (``round_too_old``, ``round_in_future``) and changes
nothing. Each round is released whole when it is due (split above ``max_batch``), and is
closed from then on; after a (re)subscription the rounds that ended while the shuffler was
away are held open until the broker's backlog has drained (at most ``late_seconds``).

Delivery: a PUBACK is a promise
-------------------------------
The ingest connection (gmqtt) has a **persistent session** by default: client id
``client_id`` (default: the ``username``, else ``coco-shuffler-<deployment>``), clean start
off, session expiry ``session_expiry`` (MQTT 3.1.1: ``clean_session=0``). A report's PUBACK
is sent to the broker only *after* its effect is written to the state directory's log
(``_handle_report``, called synchronously from gmqtt's read loop, offers the report to the
core; :class:`broker.service.ingest.GroupCommit` then settles the read's reports at once, writes
their record in one ``write(2)`` and only then sends their PUBACKs). A full disk pauses
that (nothing acknowledged, the ingest disconnected, retried) instead of stopping.
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
import time
from types import TracebackType
from typing import Self

import aiomqtt
from prometheus_client import CollectorRegistry

from broker.core.machine import (
    Acked,
    Admitted,
    Applied,
    BatchMaker,
    Dropped,
    Effect,
    Released,
    RoundPolicy,
    ShufflerCore,
)
from broker.service.broker_stats import MosquittoSysStats
from broker.service.config import INGEST_MAX_PACKET, ShufflerConfig, parse_broker_url
from broker.service.ingest import (
    GroupCommit,
    SessionTakenOverError,
)
from broker.service.ingesting import IngestMixin
from broker.service.keys import check_announced, load_signer
from broker.service.lease import ShardControl
from broker.service.metrics import ShufflerMetrics
from broker.service.publishing import PublishMixin
from broker.service.sharding import ShardMixin
from broker.store.wal import EffectLog, LogFullError, StateDir
from edge.batch_auth import BatchSigner
from edge.mqtt_url import BrokerList
from edge.mqtt_version import Negotiated
from edge.shards import parse_label
from edge.topics import batches_topic, ingress_filter, manifests_topic

__all__ = [
    "INGEST_MAX_PACKET",
    "RoundPolicy",
    "SessionTakenOverError",
    "Shuffler",
    "ShufflerConfig",
    "parse_broker_url",
]

logger = logging.getLogger("broker.shuffler")  # a fixed name: broker/__init__.py, "Loggers"


class Shuffler(ShardMixin, IngestMixin, PublishMixin):
    """The shuffling bridge as an async context manager: ``async with Shuffler(cfg) as s:
    await s.run()``. Reusable after exit, not re-entrant.

    Entering opens (and locks) the state directory and replays its log; :meth:`run`
    returns after :meth:`stop` and the drain. If the task running :meth:`run` is
    cancelled, it drains the same way and then re-raises :class:`asyncio.CancelledError`.
    """

    def __init__(self, config: ShufflerConfig, *, registry: CollectorRegistry) -> None:
        self.config = config
        self.metrics = ShufflerMetrics(registry)
        self._sys_stats = MosquittoSysStats(registry) if config.broker_stats else None
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
        self.metrics.recovered_reports.set(nan)  # not "nothing recovered" before recovery
        self._nodes = BrokerList(config.broker)
        self._tls = self._nodes.tls
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
        self._generations_seen = (
            set() if config.plan is None else {x.generation for x in config.plan.layouts}
        )
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
        self._had_session = False  # a session on the broker, of this state directory's
        self._session_present = False  # the last CONNACK's flag
        self._late_offers = 0
        self._last_late = 0.0
        self._backlog_drained: float | None = None
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
        self.metrics.recovered_reports.set(math.nan)
        if cfg.state_dir is None:
            self._token_key = secrets.token_bytes(32)  # a fresh key per run
            self.signer = self._memory_signer()
            self.metrics.recovered_reports.set(0)  # no state directory: nothing to recover
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
        self._had_session = self._state.session_seen()
        self._token_key = self._state.token_key()
        self._owner = self._state.owner_id()
        self._state.publish_public_key(self.signer.public_key_hex)
        self._log = self._state.log(fsync=cfg.fsync, round_seconds=cfg.round_seconds)
        for effect in self._log.recover():  # one record's effect held at a time
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
            try:
                log.compact(self.core.snapshot())
            except LogFullError as exc:  # the log is intact and applied: compact later
                logger.warning("the shuffler log is not compacted for now: %s", exc)
            self._compacted_size = log.size  # failed: tried again after compact_bytes more

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
        (the broker's queued backlog has drained), once per subscription, so that a device
        whose clock lags cannot hold rounds back in steady state; the core bounds the hold
        by ``late_seconds``."""
        subscribed = self._subscribed_at
        if subscribed is None or not self._connected.is_set():
            return True
        if self._backlog_drained == subscribed:
            return False  # drained after this subscription: late reports hold nothing more
        quiet = time.monotonic() - max(subscribed, self._last_late)
        if quiet < self.config.backlog_quiet:
            return True
        self._backlog_drained = subscribed
        return False

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
        if self._needs_lease():
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
            stats = None
            if self._sys_stats is not None:
                cfg = self.config
                stats = tg.create_task(
                    self._sys_stats.watch(
                        cfg.broker,
                        username=cfg.username,
                        password=cfg.password,
                        client_id=f"{cfg.ingest_client_id}-sys",
                    ),
                    name="shuffler-broker-stats",
                )
            try:
                await self._stop_requested.wait()
            except asyncio.CancelledError:
                cancelled = True
                self._stop_requested.set()
            flusher.cancel()
            await self._drain()
            self._closing.set()
            publisher.cancel()
            if stats is not None:
                stats.cancel()
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
        self.metrics.ready.set(0)  # at once: the ingest's disconnection follows

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
