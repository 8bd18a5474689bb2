"""What the service does with each message the session hands it: a batch or a manifest
through the core, counted, logged and acknowledged.

:class:`Intake` routes a message by its topic (:func:`~aggregator.service.session.route`), has the
core verify and apply a batch (:meth:`~aggregator.service.core.machine.AggregatorCore.check`,
``partial``, ``apply``) or reconcile a manifest, syncs the metrics and tells the publisher; it
counts what is refused or left unacknowledged, and logs it only the 1st, 2nd, 4th, 8th... time of
each kind per run, so a flood cannot flood the log. The PUBACK of a delivery goes out through the
checkpoint generations (:class:`~aggregator.service.generations.Generations`). Everything the
service holds (the session, the files, the endpoint) is wired around it by
:class:`aggregator.service.service.Aggregator`.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiomqtt
import paho.mqtt.client as paho

from aggregator.service.config import AggregatorConfig
from aggregator.service.core.checkpoint import Counters
from aggregator.service.core.machine import AggregatorCore
from aggregator.service.core.rules import RejectedError
from aggregator.service.generations import Generations
from aggregator.service.metric_labels import UNACKED_REASONS
from aggregator.service.metrics import AggregatorMetrics
from aggregator.service.publishing import Publisher
from aggregator.service.session import route

__all__ = ["INLINE_ELEMENTS", "Intake", "log_silence"]

logger = logging.getLogger("aggregator.service")

INLINE_ELEMENTS = 1 << 16
"""Batches of at most this many hash evaluations (``size * d``; well under 1 ms) are added
on the event loop; larger ones in a thread."""


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def log_silence(core: AggregatorCore) -> None:
    """One WARNING when a shard of the layout in force goes silent while others
    release (:mod:`aggregator.service.core.silence`), one INFO line when it speaks again."""
    for change in core.silence.changes(core.keys.plan):
        if change.silent:
            logger.warning(
                "shard %s has released nothing for %d rounds in which other shards "
                "released: its shuffler may be down or cut off, and its devices' reports "
                "are not reaching the aggregator (coco_aggregator_shard_silent_rounds)",
                change.shard,
                change.rounds,
            )
        else:
            logger.info(
                "shard %s released again (it was silent for up to %d rounds)",
                change.shard,
                change.rounds,
            )


class Intake:
    """The batches and manifests of one service, from delivery to acknowledgement."""

    def __init__(
        self,
        config: AggregatorConfig,
        core: AggregatorCore,
        metrics: AggregatorMetrics,
        publisher: Publisher,
        generations: Generations,
    ) -> None:
        self.config = config
        self.spec = config.spec
        self.core = core
        self.metrics = metrics
        self.publisher = publisher
        self.generations = generations
        self.run_start = Counters()
        """The counters when this run began: what the log and the shutdown line count from."""
        self.other_lengths = 0
        """Batches applied this run of another round length than the service's."""

    async def on_message(self, paho_client: paho.Client, message: aiomqtt.Message) -> None:
        payload = message.payload
        data = bytes(payload) if isinstance(payload, bytes | bytearray) else b""
        kind, shard = route(self.config.deployment, message.topic.value)
        if kind == "manifest":
            self.handle_manifest(data, shard)
        else:
            await self.handle_batch(data, shard)
        if message.qos > 0:
            self.generations.acks.delivered((paho_client, message.mid, message.qos))
        self.generations.delivered()  # acknowledged, or a checkpoint in the background

    async def handle_batch(self, payload: bytes, shard: str | None = None) -> str:
        """Verify, check and apply one sealed batch (``batch || signature``) that came on
        ``shard``'s topic (``None``: the unsharded one); returns ``"applied"``,
        ``"duplicate"`` or the reject reason."""
        self.publisher.bind_loop()
        core = self.core
        generation = core.ledger.generation
        try:
            batch = core.check(payload, now=time.time(), shard=shard)
            if batch is not None:
                if batch.size * self.spec.d <= INLINE_ELEMENTS:  # less than a thread hand-off
                    partial = core.partial(batch)
                else:
                    partial = await asyncio.to_thread(core.partial, batch)  # numpy: no GIL
                # From here to the end, no await: the sums and the id change together.
                if core.apply(batch, partial, now=time.time()):
                    self.metrics.sync(core)
                    log_silence(self.core)
                    self.publisher.applied()
                    announced = core.rules.round_seconds
                    if announced is not None and batch.round_seconds != announced:
                        self._other_length(batch.round_seconds, announced)
                    return "applied"
        except RejectedError as rejected:
            self._reject(rejected, payload, shard)
            if core.ledger.generation != generation:  # refused, yet charged (ACCOUNTED_REFUSALS)
                self.publisher.applied()
            return rejected.reason
        core.duplicate()
        self.metrics.sync(core)
        this_run = core.counters.duplicates - self.run_start.duplicates
        if _is_power_of_two(this_run):
            logger.info(
                "ignored a redelivered batch (%d so far this run; "
                "coco_aggregator_batches_duplicate_total)",
                this_run,
            )
        return "duplicate"

    def _other_length(self, length: int, announced: int) -> None:
        """A batch applied of a round length other than the service's (counted; logged at
        powers of two): expected for the rounds before a change of ``round_seconds``."""
        self.metrics.batches_other_length.inc()
        self.other_lengths += 1
        if _is_power_of_two(self.other_lengths):
            logger.info(
                "applied a batch of %d-s rounds while this aggregator runs with %d-s rounds "
                "(%d so far this run; coco_aggregator_batches_other_length_total): the rounds "
                "before a change of round_seconds; if it goes on, a shuffler runs on another "
                "length, or this aggregator was not restarted (docs/operations.md)",
                length,
                announced,
                self.other_lengths,
            )

    def handle_manifest(self, payload: bytes, shard: str | None = None) -> str:
        """Check and reconcile one sealed release manifest
        (:mod:`aggregator.service.core.manifests`); returns ``"accepted"``, ``"duplicate"`` or the
        reject reason."""
        generation = self.core.ledger.generation
        outcome = self.core.manifest(payload, now=time.time(), shard=shard)
        self.metrics.sync(self.core)
        if outcome == "accepted":
            log_silence(self.core)
        if self.core.ledger.generation != generation:
            self.publisher.applied()
        if outcome not in ("accepted", "duplicate"):
            count = self.core.counters.manifests_rejected[outcome]
            if _is_power_of_two(count - self.run_start.manifests_rejected.get(outcome, 0)):
                logger.warning(
                    "rejected a manifest: %s (%d so far; coco_aggregator_manifests_rejected_total)",
                    outcome,
                    count,
                )
        return outcome

    async def reconcile_loop(self) -> None:
        """Count what the manifests' grace period did not bring (every few seconds)."""
        while True:
            await asyncio.sleep(min(5.0, self.config.manifest_grace / 4))
            for loss in self.core.reconcile(time.time()):
                logger.warning(
                    "%d reports in %d batches of shard %s, round starting at %d, listed in a "
                    "manifest, never came (coco_aggregator_reports_missing_total)",
                    loss.reports,
                    loss.batches,
                    loss.shard or "-",
                    loss.start,
                )
            self.metrics.sync(self.core)

    def _reject(self, rejected: RejectedError, payload: bytes, shard: str | None) -> None:
        reason = self.core.reject(rejected, payload, shard=shard, now=time.time())
        self.metrics.sync(self.core)
        count = self.core.counters.rejected[reason]
        if _is_power_of_two(count - self.run_start.rejected.get(reason, 0)):
            # 1st, 2nd, 4th, 8th... of a reason this run: a flood cannot flood the log
            logger.warning(
                "rejected a batch: %s (%d so far; coco_aggregator_batches_rejected_total)",
                reason,
                count,
            )

    def count_unacknowledged(self, reason: str, count: int) -> None:
        """``count`` deliveries left without a PUBACK for ``reason``
        (:data:`~aggregator.service.metric_labels.UNACKED_REASONS`); the broker redelivers them."""
        assert reason in UNACKED_REASONS
        if count <= 0:
            return
        self.core.unacknowledged(reason, count)
        self.metrics.sync(self.core)
        logger.info(
            "%d batches left unacknowledged (%s); the broker redelivers them", count, reason
        )
