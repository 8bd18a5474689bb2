"""The service's side of the quarantine: recovered at start, replayed when the fix comes,
exported as metrics.

What is kept is :mod:`aggregator.service.core.quarantine`, the replay
:mod:`aggregator.service.core.replay`, the file :mod:`aggregator.service.quarantine_file`
(written with each checkpoint generation by :mod:`aggregator.service.generations`). Here:

* at start, the file beside the checkpoint is read (a damaged entry dropped, counted and
  logged; a damaged header refuses the start) and, once the checkpoint, the ledger and the
  series are recovered, every entry is replayed: a restart with a fixed configuration (a
  longer retention, the new layout trusted) applies what now passes;
* when the trusted anchor changes (``coco aggregator trust``, adopted by
  :class:`~aggregator.service.trust.KeyGuard`), every entry is replayed;
* ``coco aggregator rejected replay`` creates ``<checkpoint>.quarantine.replay``; the running
  service replays within :data:`~aggregator.service.trust.PIN_POLL` seconds and removes it (a
  stopped service replays at its next start anyway).

Metrics: ``coco_aggregator_quarantined{reason}`` (entries kept now, by reason),
``coco_aggregator_quarantined_bytes``, ``coco_aggregator_quarantine_dropped_total{cause}``
(``bounds``: the oldest dropped to keep the bounds; ``damaged``: an entry line of the file
that failed its checksum; ``discarded``: no longer verifiable at a replay) and
``coco_aggregator_quarantine_replayed_total{outcome}`` (``applied``, ``duplicate``,
``accepted``, ``kept``, ``discarded``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from aggregator.service.config import AggregatorConfig
from aggregator.service.core.machine import AggregatorCore
from aggregator.service.core.quarantine import KEPT_REASONS
from aggregator.service.core.replay import replay
from aggregator.service.generations import Generations
from aggregator.service.publishing import Publisher
from aggregator.service.quarantine_file import (
    LoadedQuarantine,
    read_quarantine,
    replay_request_path,
)
from aggregator.service.trust import PIN_POLL

__all__ = ["DROP_CAUSES", "REPLAY_OUTCOMES", "Rejected"]

logger = logging.getLogger("aggregator.service")

DROP_CAUSES = ("bounds", "damaged", "discarded")
REPLAY_OUTCOMES = ("applied", "duplicate", "accepted", "kept", "discarded")


class Rejected:
    """The quarantine of one service (module docs)."""

    def __init__(
        self,
        config: AggregatorConfig,
        core: AggregatorCore,
        registry: CollectorRegistry,
        generations: Generations,
        *,
        publisher: Publisher,
    ) -> None:
        self.core = core
        self.deployment = config.deployment
        self.checkpoint: Path | None = config.checkpoint
        self.generations = generations
        self.publisher = publisher
        p = "coco_aggregator"
        self.kept = Gauge(
            f"{p}_quarantined",
            "Verified batches and manifests kept, refused for a reason an operator can fix "
            "(`coco aggregator rejected list`), by reason.",
            ["reason"],
            registry=registry,
        )
        self.kept_bytes = Gauge(
            f"{p}_quarantined_bytes", "Bytes of the kept messages.", registry=registry
        )
        self.dropped = Counter(
            f"{p}_quarantine_dropped",
            "Kept messages dropped, by cause (bounds, damaged, discarded).",
            ["cause"],
            registry=registry,
        )
        self.replayed = Counter(
            f"{p}_quarantine_replayed",
            "Outcomes of replaying kept messages.",
            ["outcome"],
            registry=registry,
        )
        for reason in KEPT_REASONS:
            self.kept.labels(reason=reason)
        for cause in DROP_CAUSES:
            self.dropped.labels(cause=cause)
        for outcome in REPLAY_OUTCOMES:
            self.replayed.labels(outcome=outcome)
        self._seen = {"bounds": 0, "discarded": 0}

    def recover(self) -> None:
        """Read the file beside the checkpoint into the core and replay it (once the
        checkpoint, the ledger and the series are recovered)."""
        if self.checkpoint is None:
            return
        loaded = read_quarantine(self.checkpoint, self.deployment)
        if loaded is not None:
            self._restore(loaded)
        self.generations.quarantine_written = self.core.quarantine.version
        self.replay("at start")

    def _restore(self, loaded: LoadedQuarantine) -> None:
        self.core.quarantine.restore(
            loaded.every, dropped=loaded.dropped, discarded=loaded.discarded
        )
        self._seen = {"bounds": loaded.dropped, "discarded": loaded.discarded}
        if loaded.damaged:
            self.dropped.labels(cause="damaged").inc(loaded.damaged)
            logger.warning(
                "quarantine file beside %s: %d damaged entries dropped (never applied; "
                'coco_aggregator_quarantine_dropped_total{cause="damaged"})',
                self.checkpoint,
                loaded.damaged,
            )
        logger.info("quarantine: %d kept messages recovered", len(self.core.quarantine))

    def replay(self, why: str) -> None:
        """Replay every kept message (:mod:`aggregator.service.core.replay`), log and count."""
        if not len(self.core.quarantine):
            return
        outcomes = replay(self.core, now=time.time())
        for outcome, count in outcomes.items():
            if outcome in REPLAY_OUTCOMES:
                self.replayed.labels(outcome=outcome).inc(count)
        logger.info(
            "replayed the quarantine (%s): %s",
            why,
            ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items())),
        )
        self.generations.metrics.sync(self.core)  # the service's metrics and privacy level follow
        self.publisher.applied()
        self.refresh()

    def refresh(self) -> None:
        """Bring the gauges and counters up to the core's quarantine."""
        quarantine = self.core.quarantine
        for reason, count in quarantine.counts().items():
            if reason in KEPT_REASONS:
                self.kept.labels(reason=reason).set(count)
        self.kept_bytes.set(quarantine.bytes)
        for cause, value in (("bounds", quarantine.dropped), ("discarded", quarantine.discarded)):
            if value > self._seen[cause]:
                self.dropped.labels(cause=cause).inc(value - self._seen[cause])
                self._seen[cause] = value

    async def watch(self) -> None:
        """Replay on an operator's request (module docs)."""
        assert self.checkpoint is not None
        request = replay_request_path(self.checkpoint)
        while True:
            await asyncio.sleep(PIN_POLL)
            if not request.exists():
                continue
            self.replay("requested by `coco aggregator rejected replay`")
            try:
                request.unlink()
            except OSError:
                logger.exception("cannot remove the replay request %s", request)
