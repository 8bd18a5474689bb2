"""The aggregator service: signed, shuffled batches in, streaming estimates and metrics out.

A thin shell around :class:`~aggregator.service.core.machine.AggregatorCore` (the rules: what is
applied, refused, remembered): it wires the MQTT session (:mod:`aggregator.service.session`), what
is done with each message (:mod:`aggregator.service.intake`), the recovery of its files at start
(:mod:`aggregator.service.recovery`), the checkpoint files
(:mod:`aggregator.service.checkpoint_files`, :mod:`aggregator.service.generations`), the pinned key
(:mod:`aggregator.service.trust`), the HTTP endpoint and gauges (:mod:`aggregator.service.metrics`,
:mod:`aggregator.service.publishing`) and the timers, and runs their lifecycle. Nothing unverified
is ever applied; rejections are counted by reason
(``coco_aggregator_batches_rejected_total{reason}``) and never stop the service. The aggregator sees
only shuffled, locally randomised reports, never a device id, and logs none.

Exactly once, across crashes
----------------------------
Each batch carries a random 16-byte ``batch_id`` and its round, both signed; the ids applied
in the retained rounds are written in the *same* checkpoint as the sums they went into, and
every checkpoint keeps the generation before it (``<checkpoint>.previous``). Delivery is
QoS 1 on a persistent session, each PUBACK sent once *two* durable generations hold its
batch (:class:`~aggregator.service.core.acks.AckGenerations`). Hence
a crash before the checkpoint: redelivered, applied once; after it, before the PUBACK:
redelivered, a duplicate (its id is in the checkpoint); the newest generation damaged: its
checksum refuses it, the previous one resumes, and every batch it lacks is redelivered
(none was acknowledged).

A checkpoint is written every ``checkpoint_interval`` seconds while anything changed or a
PUBACK waits, in the background once half of ``max_unacked`` deliveries wait, and twice on
shutdown; without a checkpoint path, batches are acknowledged as applied (at most once).

Readiness: ``/ready`` (and ``coco_aggregator_ready``, and ``/estimates``' ``state``) is 200 once the
checkpoint is recovered and the batches topic subscribed; 503, with the reason in one line,
before, while disconnected, while the checkpoint or ledger cannot be written (a full disk:
nothing lost, retried, ``coco_aggregator_checkpoint_failing`` 1) and once stopped. Until
the checkpoint is recovered ``/metrics`` serves that gauge alone and ``/estimates`` 503.

One writer per deployment
-------------------------
The checkpoint is locked (``flock`` on ``<checkpoint>.lock``): a second service with the
same checkpoint refuses to start. One of the same account takes the MQTT session over and
the first stops (:class:`~aggregator.service.session.SessionTakenOverError`); what it applied
after its last checkpoint is redelivered to the new holder, never in two checkpoints.

Shutdown
--------
On shutdown the service writes its final checkpoints, sends the PUBACKs they cover and
logs at INFO what this run applied, ignored, rejected and left unacknowledged, by reason
(the broker redelivers the last). Rejections and duplicates are logged only the 1st, 2nd,
4th, 8th... time of each kind per run.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import aiomqtt
import paho.mqtt.client as paho
from prometheus_client import CollectorRegistry

from aggregator.ledger.levels import PrivacyLevel
from aggregator.ledger.privacy_ledger import PrivacyLedger
from aggregator.service.checkpoint_files import lock_checkpoint
from aggregator.service.config import AggregatorConfig
from aggregator.service.core.acks import AckGenerations
from aggregator.service.core.checkpoint import Counters
from aggregator.service.core.keys import describe_anchor
from aggregator.service.core.machine import AggregatorCore
from aggregator.service.core.rules import CoreRules
from aggregator.service.generations import Generations
from aggregator.service.http import MetricsServer, Source
from aggregator.service.intake import Intake
from aggregator.service.metrics import AggregatorMetrics
from aggregator.service.publishing import Publisher, RefreshOnCollect, log_shutdown
from aggregator.service.recovery import Recovery
from aggregator.service.rejected import Rejected
from aggregator.service.session import Ack, BatchSession
from aggregator.service.trust import KeyGuard
from aggregator.service.truth_file import truth_answer
from edge.errors import CocoError

__all__ = ["Aggregator", "run_aggregator"]

logger = logging.getLogger("aggregator.service")


class Aggregator:
    """Async context manager around the service; ``await run()`` until cancelled.

    Entering takes the checkpoint's lock, starts the HTTP endpoint (or serves on the one
    it was handed, ``http``), recovers the checkpoint (if any) and settles the pinned key;
    leaving writes the final checkpoints, logs the shutdown counts, stops its own endpoint
    (a handed one serves the final state on) and releases the lock. Reusable, not
    re-entrant.
    """

    def __init__(
        self,
        config: AggregatorConfig,
        *,
        registry: CollectorRegistry | None = None,
        http: MetricsServer | None = None,
    ):
        """``http``: a started server that the service serves on while it is entered
        instead of its own (``config.http_port`` is then ignored); it is not stopped on
        leaving, but goes on serving the stopped service's final state."""
        assert config.min_batch is not None
        self.config = config
        self.spec = config.spec
        self.core = AggregatorCore(
            CoreRules(
                spec=config.spec,
                deployment=config.deployment,
                trusted=config.trusted,
                min_batch=config.min_batch,
                retention_rounds=config.retention_rounds,
                round_seconds=config.round_seconds,
                manifest_grace=config.manifest_grace,
                silent_shard_rounds=config.silent_shard_rounds,
                series_retention=config.series_retention,
                series_step=config.series_step,
                series_coarse_retention=config.series_coarse_retention,
            ),
            delta=config.delta,
        )
        self.core.series_kept = config.checkpoint is not None
        self.registry = registry if registry is not None else CollectorRegistry()
        # first in the registry, so a scrape refreshes the gauges before they are read
        self.registry.register(RefreshOnCollect(self._refresh))
        self.metrics = AggregatorMetrics(
            self.registry,
            spec=self.spec,
            dims=config.exported_dims,
            epsilon_target=config.epsilon_target,
            windows=[window.spec for window in config.exported_windows],
            periods=[label for label, _ in config.periods],
        )
        self.metrics.delta.set(config.delta)
        self.metrics.min_batch.set(config.min_batch)
        self.metrics.retention_rounds.set(config.retention_rounds)
        self.keys = KeyGuard(
            self.core,
            deployment=config.deployment,
            checkpoint=config.checkpoint,
            refused=self.metrics.announcements_refused,
        )
        self.session = BatchSession(
            config,
            on_batch=self._on_message,
            on_end=self._connection_ended,
            on_stop=self._on_stop,
            on_announcement=self.keys.announcement,
        )
        self.session.watch_subscribed(self._subscribed_changed)
        self.publisher = Publisher(config, self.core, self.metrics, status=self._status)
        self.generations = Generations(config, self.core, self.session, self.metrics)
        self.generations.on_failing = self._readiness_changed
        self.intake = Intake(config, self.core, self.metrics, self.publisher, self.generations)
        self.rejected = Rejected(
            config, self.core, self.registry, self.generations, publisher=self.publisher
        )
        self.keys.on_trusted = lambda: self.rejected.replay("the trusted key changed")
        self.recovery = Recovery(
            config,
            self.core,
            metrics=self.metrics,
            generations=self.generations,
            keys=self.keys,
            rejected=self.rejected,
        )
        self.recovered = False
        """Whether the checkpoint (if any) has been recovered: readiness needs it."""
        self._shown_ready = False
        self._shown_why: str | None = None
        self.stopped = False
        """Set when the service has shut down: its final document says ``"stopped"``."""
        self._entered = False
        self._lock_fd: int | None = None
        self._http: MetricsServer | None = None
        self._lent_http = http
        self.truth = truth_answer(config.truth_file, self.registry)  # SIMULATION ONLY

    # -- what tests, the demo and dashboards read ----------------------------------------

    @property
    def state(self) -> Any:
        return self.core.state

    @property
    def counters(self) -> Counters:
        return self.core.counters

    @property
    def ledger(self) -> PrivacyLedger:
        return self.core.ledger

    @property
    def smallest_batch(self) -> int | None:
        return self.core.smallest_batch

    @property
    def latest_batch(self) -> int | None:
        return self.core.latest_batch

    @property
    def newest_round(self) -> int | None:
        """The newest round of an applied batch: the retained horizon ends there."""
        return self.core.memory.newest_round

    @property
    def oldest_retained_round(self) -> int | None:
        """The oldest round still accepted; ``None`` before the first batch."""
        return self.core.memory.oldest_round

    @property
    def retained_batch_ids(self) -> int:
        """Batch ids in memory (those of the retained rounds)."""
        return len(self.core.memory)

    @property
    def subscribed(self) -> asyncio.Event:
        """Set while subscribed to the batches topic (for tests and health checks)."""
        return self.session.subscribed

    @property
    def connections(self) -> int:
        return self.session.connections

    @property
    def acks(self) -> AckGenerations[Ack]:
        return self.generations.acks

    @acks.setter
    def acks(self, acks: AckGenerations[Ack]) -> None:
        self.generations.acks = acks

    @property
    def generation(self) -> int:
        """The generation of the newest checkpoint written or recovered."""
        return self.generations.generation

    @property
    def privacy_settled(self) -> bool:
        """Whether the privacy level shown covers everything the ledger recorded."""
        return self.publisher.level.generation == self.core.ledger.generation

    @property
    def ready(self) -> bool:
        """Recovered, subscribed and writing its files (module docs, *Readiness*)."""
        return self.not_ready() is None

    def not_ready(self) -> str | None:
        """Why the service is not ready (one line), ``None`` when it is."""
        if not self.recovered:
            return "recovering the checkpoint"
        if self.generations.failure is not None:
            return f"{self.generations.failure}; batches stay unacknowledged, retrying"
        if not self.session.subscribed.is_set():
            return "not subscribed to the batches topic"
        return None

    @property
    def privacy(self) -> PrivacyLevel:
        """The central privacy level last computed (its ``batches`` says how many batches
        it covers; it trails the applied batches by one computation)."""
        return self.publisher.level

    @property
    def http_port(self) -> int | None:
        if self._lent_http is not None:
            return self._lent_http.port
        return None if self._http is None else self._http.port

    def snapshot(self) -> dict[str, Any]:
        """The current ``/estimates`` document (brought up to date first)."""
        self._refresh()
        return self.publisher.document

    def _refresh(self) -> None:
        self.publisher.refresh()
        self.rejected.refresh()

    def _status(self) -> dict[str, Any]:
        why = None if self.stopped else self.not_ready()
        return {
            "state": "stopped" if self.stopped else "live" if why is None else "not_ready",
            "not_ready": why,
            "subscribed": self.session.subscribed.is_set(),
            "ready": not self.stopped and why is None,
            "checkpoint_generation": self.generation if self.config.checkpoint else None,
            "batch_public_key": describe_anchor(self.core.rules.trusted),
        }

    def _subscribed_changed(self, _subscribed: bool) -> None:
        self._readiness_changed(always=True)

    def _readiness_changed(self, *, always: bool = False) -> None:
        """The gauge and the document's status after a change that may touch readiness
        (a write attempt calls this each time: only a change is published)."""
        ready, why = self.ready, self.not_ready()
        if (ready, why) == (self._shown_ready, self._shown_why) and not always:
            return
        self._shown_ready, self._shown_why = ready, why
        self.metrics.ready.set(1 if ready else 0)
        self.core.changed = True
        self.publisher.document = {**self.publisher.document, **self._status()}

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._entered:
            raise RuntimeError("the Aggregator is reusable, but not re-entrant")
        self._entered = True
        self.stopped = False
        self.publisher.entered = True
        self.session.taken_over = False
        try:
            path, lock = self.config.checkpoint, self.config.lock_path
            if path is not None and lock is not None:
                self._lock_fd = lock_checkpoint(lock, path)
            self.publisher.bind_loop()
            if self._lent_http is not None:
                self._lent_http.serve(self._source())
            elif self.config.http_port is not None:
                self._http = MetricsServer(
                    host=self.config.http_host, port=self.config.http_port, **self._served()
                )
                self._http.start()
            if path is not None:
                await self.recovery.recover(path)
            elif self.config.key_source == "announced":
                logger.warning(
                    "no --checkpoint: the announced batch key is trusted at every start, "
                    "not pinned (aggregator.service.trust)"
                )
            self.intake.run_start = self.counters.copy()
            self.recovered = True
            self._shown_ready, self._shown_why = self.ready, self.not_ready()
            self.metrics.ready.set(1 if self._shown_ready else 0)
            self.core.changed = True
            self.publisher.publish()
        except BaseException:
            self._stop_http()
            self._release_lock()
            self._entered = self.publisher.entered = False
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.session.taken_over:
                logger.info(
                    "no final checkpoint: the batches applied since the last one are "
                    "redelivered to the session's new holder"
                )
                await self.generations.roll_back()
                self.intake.count_unacknowledged("taken_over", len(self.acks))
                self.acks = AckGenerations()
            else:
                await asyncio.shield(self.generations.final())
            if self.acks:
                self.intake.count_unacknowledged("checkpoint_failed", len(self.acks))
                self.acks = AckGenerations()
            log_shutdown(self.counters, self.intake.run_start)
            # what stays in the registry and document: final. The privacy level of batches
            # not yet accounted for is computed by the first read after this, not here.
            self.stopped = True
            self.core.changed = True
            self.publisher.publish()
        finally:
            self._stop_http()
            self._release_lock()
            if self._lent_http is not None and self.recovered:  # the final state, served on
                self._lent_http.serve(self._source(final=True))
            self.recovered = False
            self._entered = self.publisher.entered = False

    def _served(self, *, final: bool = False) -> dict[str, Any]:
        """What the HTTP endpoint serves of this service (after it stopped: its final state,
        never ready)."""
        return {
            "registry": self.registry,
            "estimates": self.snapshot,
            "ready": (lambda: False) if final else (lambda: self.ready),
            "recovered": (lambda: True) if final else (lambda: self.recovered),
            "not_ready": (lambda: None) if final else self.not_ready,
            "query": self.publisher.series.answer,
            "truth": self.truth,
        }

    def _source(self, *, final: bool = False) -> Source:
        return Source(**self._served(final=final))

    def _stop_http(self) -> None:
        if self._http is not None:
            self._http.stop()
            self._http = None

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    async def run(self) -> None:
        """Consume batches (reconnecting as needed) and checkpoint, until cancelled.

        Raises :class:`~aggregator.service.session.SessionTakenOverError` when another client takes
        over the session."""
        if not self._entered:
            raise RuntimeError("use 'async with Aggregator(config) as agg: await agg.run()'")
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self.session.run(), name="coco-aggregator-mqtt")
                if self.config.checkpoint is not None:
                    tasks.create_task(self.generations.loop(), name="coco-aggregator-checkpoint")
                    tasks.create_task(self.keys.watch(), name="coco-aggregator-trust")
                    tasks.create_task(self.rejected.watch(), name="coco-aggregator-replay")
                tasks.create_task(
                    self.publisher.export_epsilon_curve(), name="coco-aggregator-eps-curve"
                )
                tasks.create_task(self.publisher.privacy_loop(), name="coco-aggregator-privacy")
                tasks.create_task(self.publisher.publish_loop(), name="coco-aggregator-publish")
                tasks.create_task(self.intake.reconcile_loop(), name="coco-aggregator-reconcile")
        except BaseExceptionGroup as group:
            coco = group.subgroup(CocoError)
            if coco is not None and len(group.exceptions) == len(coco.exceptions):
                first = coco.exceptions[0]
                while isinstance(first, BaseExceptionGroup):
                    first = first.exceptions[0]
                raise first from None
            raise

    # -- batches ---------------------------------------------------------------------------

    async def _on_message(self, paho_client: paho.Client, message: aiomqtt.Message) -> None:
        """The session's callback: :meth:`~aggregator.service.intake.Intake.on_message` (the
        intake needs the checkpoint generations, which are built after the session)."""
        await self.intake.on_message(paho_client, message)

    async def handle_batch(self, payload: bytes, shard: str | None = None) -> str:
        """Verify, check and apply one sealed batch (``batch || signature``) that came on
        ``shard``'s topic (``None``: the unsharded one); returns ``"applied"``,
        ``"duplicate"`` or the reject reason
        (:meth:`~aggregator.service.intake.Intake.handle_batch`)."""
        return await self.intake.handle_batch(payload, shard)

    def handle_manifest(self, payload: bytes, shard: str | None = None) -> str:
        """Check and reconcile one sealed release manifest
        (:mod:`aggregator.service.core.manifests`); returns ``"accepted"``, ``"duplicate"`` or the
        reject reason."""
        return self.intake.handle_manifest(payload, shard)

    # -- acknowledgements ------------------------------------------------------------------

    def _connection_ended(self, paho_client: paho.Client) -> None:
        # PUBACKs cannot cross connections; the broker redelivers those batches and the
        # remembered ids turn them into acknowledged duplicates.
        lost = self.acks.drop(lambda ack: ack[0] is paho_client)
        reason = "taken_over" if self.session.taken_over else "connection_lost"
        self.intake.count_unacknowledged(reason, lost)

    async def _on_stop(self, _client: paho.Client, unread: int) -> None:
        """Shutdown while connected: the final checkpoints send every PUBACK they can."""
        self.intake.count_unacknowledged("unprocessed", unread)
        await self.generations.final()

    # -- checkpoints -----------------------------------------------------------------------

    async def checkpoint(self) -> None:
        """Write a new checkpoint generation (if configured, and anything changed or a
        PUBACK waits), then send the PUBACKs of the generation before it."""
        await self.generations.checkpoint()


async def run_aggregator(
    config: AggregatorConfig,
    *,
    registry: CollectorRegistry | None = None,
    serving: Callable[[Aggregator], None] | None = None,
) -> None:
    """``async with Aggregator(config) as agg: await agg.run()``; ``serving`` is called once
    the aggregator is entered (its HTTP endpoint listening, its checkpoint recovered)."""
    async with Aggregator(config, registry=registry) as aggregator:
        if serving is not None:
            serving(aggregator)
        await aggregator.run()
