"""Checkpoint generations and the PUBACKs they release: the service's file side.

A checkpoint is written every ``checkpoint_interval`` seconds while anything changed or a
PUBACK waits (and the session is confirmed: only then can PUBACKs go out), in the
background as deliveries come (*Acknowledgements*), and twice on shutdown, so that every
PUBACK goes out. Each is a new generation, its files written in the checkpoint's thread by
:class:`~aggregator.service.checkpoint_files.GenerationWriter` (the order, and why a crash
leaves files that agree, in :mod:`aggregator.service.checkpoint_files`); the PUBACKs of
generation ``N``'s batches are sent as soon as ``N + 1`` is durable
(:class:`~aggregator.service.core.acks.AckGenerations`). Without a checkpoint path there is no
file and no timer: batches are acknowledged as soon as they are applied.

On the event loop a generation is only taken: the checkpoint's content (copies), the
ledger's ``to_dict`` and the series' new records, with the deliveries they cover, with no
await between. Everything is encoded, hashed and written in the thread.

Acknowledgements
----------------
A delivery stays unacknowledged until two generations hold it, and the broker sends no
more than its in-flight window (Mosquitto's ``max_inflight_messages``, sized by
``max_unacked``: ``2 * max_unacked``) before PUBACKs come back. So the intake never waits
for a checkpoint: once half of ``max_unacked`` deliveries are open (or ``max_unacked`` are
unacknowledged in all), a checkpoint starts in the background, and another follows as soon
as it is durable while they are still due. Batches keep coming and being applied while it
is written, and the window is not full when its PUBACKs go out. A series compaction runs
after them, never before.

With a series (a round length), each generation also appends the series' new records to
``<checkpoint>.series`` (:mod:`aggregator.service.series_file`) and records the newest one's
sequence number in the checkpoint; the records are forgotten in memory once it is durable.

A write that fails (a full disk) loses nothing: its batches stay unacknowledged and the next
checkpoint retries. Until one succeeds :attr:`Generations.failure` names the file that could
not be written; the service is not ready meanwhile (``coco_aggregator_checkpoint_failing``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from aggregator.durable import DiskWriteError
from aggregator.ledger.ledger_file import Bound, LoadedLedger, decode_ledger
from aggregator.service.checkpoint_files import (
    GenerationWriter,
    LedgerWrite,
    previous_path,
    verified,
)
from aggregator.service.config import AggregatorConfig
from aggregator.service.core.acks import AckGenerations
from aggregator.service.core.checkpoint import Checkpoint
from aggregator.service.core.machine import AggregatorCore
from aggregator.service.metrics import AggregatorMetrics
from aggregator.service.quarantine_file import encode_quarantine, write_quarantine
from aggregator.service.series_file import SeriesFile, SeriesWrite
from aggregator.service.session import Ack, BatchSession

logger = logging.getLogger("aggregator.service")


class Generations:
    """Writes checkpoint generations of ``core`` and sends the PUBACKs they release."""

    def __init__(
        self,
        config: AggregatorConfig,
        core: AggregatorCore,
        session: BatchSession,
        metrics: AggregatorMetrics,
    ) -> None:
        self.config = config
        self.core = core
        self.session = session
        self.metrics = metrics
        self.acks: AckGenerations[Ack] = AckGenerations()
        self.generation = 0
        """The generation of the newest checkpoint written or recovered."""
        self.last = time.monotonic()
        self.failure: str | None = None
        """Why the last write attempt failed (one line naming the file), ``None`` once one
        succeeds: readiness reads it."""
        self.on_failing: Callable[[], None] = lambda: None
        """Called after each write attempt (the service updates its readiness)."""
        self.series_file: SeriesFile | None = None
        """The series file (set by the recovery; ``None``: no series, or no checkpoint)."""
        self.quarantine_written = 0
        """The quarantine's version the file beside the checkpoint holds."""
        self._quarantine_writing = 0
        self._lock = asyncio.Lock()
        self.writer = (
            None
            if config.checkpoint is None
            else GenerationWriter(config.checkpoint, self._check_ledger)
        )
        self._background: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    def _check_ledger(self, text: str, path: Path) -> None:
        decode_ledger(text, path=path, spec=self.core.spec, delta=self.core.delta)

    def acknowledge(self, ready: list[Ack]) -> None:
        for paho_client, mid, qos in ready:
            paho_client.ack(mid, qos)  # an error means the connection is gone: redelivered

    def vouch(self, loaded: LoadedLedger | None) -> None:
        """The ledger file read and checked at start (``None``: none): the first
        generation keeps it as ``.prev`` without reading it again, if it is unchanged."""
        if self.writer is not None:
            good = loaded is not None and not loaded.fell_back
            self.writer.ledger_on_disk = verified(loaded) if good and loaded else None

    def delivered(self) -> None:
        """A delivery joined the open ones: start a checkpoint in the background when the
        broker's in-flight window would otherwise fill (module docs, *Acknowledgements*).
        An unexpected error of the last background checkpoint is raised here."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self.config.checkpoint is None:
            self.acknowledge(self.acks.take_all())
        elif self._due() and (self._background is None or self._background.done()):
            self._background = asyncio.ensure_future(self._chain())
            self._background.add_done_callback(self._background_done)

    def _due(self) -> bool:
        acks, half = self.acks, -(-self.config.max_unacked // 2)
        return bool(acks.open) and (len(acks.open) >= half or len(acks) >= self.config.max_unacked)

    async def _chain(self) -> None:
        """Checkpoints one after the other while they are due (deliveries kept coming
        while the last one was written)."""
        while self._due() and self.session.confirmed and not self.session.taken_over:
            await self.checkpoint()

    def _background_done(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._error = task.exception()

    async def settle(self) -> None:
        """Wait for a checkpoint written in the background (a takeover's roll-back must
        not race it)."""
        if self._background is not None:
            await asyncio.wait([self._background])

    async def checkpoint(self) -> None:
        """Write a new checkpoint generation (if configured, and anything changed or a
        PUBACK waits), then send the PUBACKs of the generation before it."""
        try:
            async with self._lock:
                await self._write()
        finally:
            self.last = time.monotonic()

    async def final(self) -> None:
        """Two generations, so that every batch applied is in both and acknowledged."""
        await self.checkpoint()
        await self.checkpoint()

    async def _write(self) -> None:
        path, writer = self.config.checkpoint, self.writer
        if self.session.taken_over:
            return
        if path is None or writer is None:
            self.acknowledge(self.acks.take_all())
            return
        if not self.core.dirty and not self.acks.waiting():
            return
        # The content and the deliveries it covers are taken together, with no await;
        # copies, encoded in the thread (nothing is serialised on the event loop).
        generation = self.generation + 1
        content = self.core.content(generation=generation, written_at=time.time())
        # small: its old rounds are compacted; it names the checkpoint it goes with
        ledger = LedgerWrite(
            self.core.ledger.to_dict(),
            self.core.ledger.generation,
            Bound(self.config.deployment, generation),
        )
        series = self._series_write(content)
        quarantine = self._quarantine_write(generation)
        self.acks.snapshot()

        def write_all() -> None:  # the quarantine durable before the checkpoint's PUBACKs
            if quarantine is not None:
                write_quarantine(writer.path, quarantine)
            writer.write(content, ledger, series)

        write = asyncio.ensure_future(asyncio.to_thread(write_all))
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            # A thread cannot be cancelled: keep the lock until the file is complete, so the
            # final checkpoint of a shutdown neither races this write nor skips a write
            # that failed.
            await asyncio.wait([write])
            self._written(write.exception() is None, write.exception(), content.series_seq)
            raise
        except (OSError, ValueError) as exc:
            if self.failure is None:  # once per failure: retried every checkpoint_interval
                logger.exception("cannot write checkpoint %s; batches stay unacknowledged", path)
            self._written(False, exc)
            return
        if self.failure is not None:
            logger.error(
                "checkpoint %s written again (after: %s): acknowledging", path, self.failure
            )
        self._written(True, series_seq=content.series_seq)
        logger.debug("checkpoint generation %d written: n=%d", self.generation, content.state.n)
        if series is not None and series[0].due(series[1].rows):  # after the PUBACKs
            await asyncio.to_thread(self._compact, series[0], series[1])

    @staticmethod
    def _compact(file: SeriesFile, series: SeriesWrite) -> None:
        try:
            file.compact(series)
        except (OSError, ValueError) as exc:  # the file as it was is still whole
            logger.warning("cannot compact %s (kept as it is): %s", file.path, exc)

    def _quarantine_write(self, generation: int) -> str | None:
        """The quarantine file's text if what it holds changed (taken with the content, no
        await between: :mod:`aggregator.service.quarantine_file`)."""
        quarantine = self.core.quarantine
        quarantine.assign(generation)
        self._quarantine_writing = quarantine.version
        if quarantine.version == self.quarantine_written:
            return None
        return encode_quarantine(quarantine, self.config.deployment)

    def _series_write(self, content: Checkpoint) -> tuple[SeriesFile, SeriesWrite] | None:
        """What ``content`` appends to the series file (taken with it, no await between)."""
        series = self.core.series
        file = self.series_file
        if file is None or series is None or content.series_seq is None:
            return None
        now = content.written_at or 0.0
        return file, SeriesWrite(
            deltas=content.series_deltas,
            seq=content.series_seq,
            rows=len(series),
            rolled_before=series.rolled_before,
            step=series.step,
            dropped_before=now - series.retention - series.coarse_retention,
        )

    def _written(
        self, ok: bool, exc: BaseException | None = None, series_seq: int | None = None
    ) -> None:
        if ok:
            self._failing(None)
        elif isinstance(exc, DiskWriteError):
            self._failing(str(exc))
        else:
            self._failing(f"cannot write checkpoint {self.config.checkpoint}: {exc}")
        if not ok:
            self.core.dirty = True
            self.acks.failed()
            return
        self.generation += 1
        self.quarantine_written = self._quarantine_writing
        self.core.quarantine.durable(self.generation)
        if self.core.quarantine.version != self.quarantine_written:
            self.core.dirty = True  # the file is to drop what two generations now hold
        if series_seq is not None and self.core.series is not None:
            self.core.series.committed(series_seq)
        self.metrics.checkpoint_generation.set(self.generation)
        self.acknowledge(self.acks.written())

    def _failing(self, failure: str | None) -> None:
        self.failure = failure
        self.metrics.checkpoint_failing.set(0 if failure is None else 1)
        self.on_failing()

    async def loop(self) -> None:
        interval = self.config.checkpoint_interval
        while True:
            await asyncio.sleep(max(0.0, self.last + interval - time.monotonic()))
            if time.monotonic() - self.last < interval:
                continue
            if self.session.confirmed:
                await self.checkpoint()
            else:  # no PUBACK can go out; the session may be another service's now
                self.last = time.monotonic()

    async def roll_back(self) -> None:
        """After a takeover: the newest generation's batches were never acknowledged, so
        the broker redelivers them to the new holder; back to the previous generation (or
        none), so that no batch is in both services' checkpoints. A checkpoint written in
        the background is waited for first (it must not race the roll-back)."""
        await self.settle()
        path = self.config.checkpoint
        if path is None or not self.acks.newest_unacknowledged:
            return
        previous = previous_path(path)
        try:
            if previous.exists():
                os.replace(previous, path)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            logger.exception("cannot roll %s back to its previous generation", path)
            return
        logger.info("rolled %s back to the generation its PUBACKs were sent for", path)
