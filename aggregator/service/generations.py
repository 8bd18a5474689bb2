"""Checkpoint generations and the PUBACKs they release: the service's file side.

A checkpoint is written every ``checkpoint_interval`` seconds while anything changed or a
PUBACK waits (and the session is confirmed: only then can PUBACKs go out), when
``max_unacked`` deliveries wait, and twice on shutdown, so that every PUBACK goes out. Each
is a new generation (:func:`~aggregator.service.checkpoint_files.write_checkpoint` keeps the
previous one); the PUBACKs of generation ``N``'s batches are sent once ``N + 1`` is durable
(:class:`~aggregator.service.core.acks.AckGenerations`). Without a checkpoint path there is no file
and no timer: batches are acknowledged as soon as they are applied.

With a series (a round length), each generation first appends the series' new records to
``<checkpoint>.series`` (:mod:`aggregator.service.series_file`) and records the newest one's
sequence number in the checkpoint; the records are forgotten in memory once it is durable.

A write that fails (a full disk) loses nothing: its batches stay unacknowledged and the next
checkpoint retries. Until one succeeds :attr:`Generations.failure` names the file that could
not be written; the service is not ready meanwhile (``coco_aggregator_checkpoint_failing``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from aggregator.durable import DiskWriteError, write_atomically
from aggregator.ledger.ledger_file import (
    Bound,
    LedgerFileError,
    decode_ledger,
    encode_ledger,
    file_digest,
    ledger_path_for,
)
from aggregator.ledger.ledger_file import previous_path as ledger_previous_path
from aggregator.service.checkpoint_files import previous_path, write_checkpoint
from aggregator.service.config import AggregatorConfig
from aggregator.service.core.acks import AckGenerations
from aggregator.service.core.checkpoint import Checkpoint, LedgerRecord
from aggregator.service.core.rules import AggregatorCore
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

    def acknowledge(self, ready: list[Ack]) -> None:
        for paho_client, mid, qos in ready:
            paho_client.ack(mid, qos)  # an error means the connection is gone: redelivered

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
        path = self.config.checkpoint
        if self.session.taken_over:
            return
        if path is None:
            self.acknowledge(self.acks.take_all())
            return
        if not self.core.dirty and not self.acks.waiting():
            return
        # The content and the deliveries it covers are taken together, with no await.
        generation = self.generation + 1
        content = self.core.content(generation=generation, written_at=time.time())
        # small: its old rounds are compacted; it names the checkpoint it goes with
        ledger = encode_ledger(self.core.ledger, Bound(self.config.deployment, generation))
        ledger_generation = self.core.ledger.generation
        series = self._series_write(content)
        quarantine = self._quarantine_write(generation)
        self.acks.snapshot()
        write = asyncio.ensure_future(
            asyncio.to_thread(
                self._write_files,
                path,
                content,
                ledger,
                ledger_generation,
                series=series,
                quarantine=quarantine,
            )
        )
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

    def _quarantine_write(self, generation: int) -> str | None:
        """The quarantine file's text if what it holds changed (taken with the content, no
        await between: :mod:`aggregator.service.quarantine_file`)."""
        quarantine = self.core.quarantine
        quarantine.assign(generation)
        self._quarantine_writing = quarantine.version
        if quarantine.version == self.quarantine_written:
            return None
        return encode_quarantine(quarantine, self.config.deployment)

    def _series_write(self, content: Checkpoint) -> SeriesWrite | None:
        """What ``content`` appends to the series file (taken with it, no await between)."""
        series = self.core.series
        if self.series_file is None or series is None or content.series_seq is None:
            return None
        now = content.written_at or 0.0
        return SeriesWrite(
            deltas=content.series_deltas,
            seq=content.series_seq,
            rows=len(series),
            rolled_before=series.rolled_before,
            step=series.step,
            dropped_before=now - series.retention - series.coarse_retention,
        )

    def _write_files(
        self,
        path: Path,
        content: Checkpoint,
        ledger: str,
        ledger_generation: int,
        *,
        series: SeriesWrite | None = None,
        quarantine: str | None = None,
    ) -> None:
        """The quarantine first (what it keeps is durable before any PUBACK), the series
        file's new records (:mod:`aggregator.service.series_file`), then the ledger and the
        checkpoint, which records the newest of them; once it is durable the records are
        committed (and the file compacted when due)."""
        if quarantine is not None:
            write_quarantine(path, quarantine)
        file = self.series_file if series is not None else None
        if file is None or series is None:
            self._write_ledger_and_checkpoint(path, content, ledger, ledger_generation)
            return
        try:
            file.append(series)
            self._write_ledger_and_checkpoint(path, content, ledger, ledger_generation)
        except BaseException:
            file.abandon()
            raise
        file.commit()
        if file.due(series.rows):
            try:
                file.compact(series)
            except (OSError, ValueError) as exc:  # the file as it was is still whole
                logger.warning("cannot compact %s (kept as it is): %s", file.path, exc)

    def _write_ledger_and_checkpoint(
        self, path: Path, content: Checkpoint, ledger: str, ledger_generation: int
    ) -> None:
        """The privacy ledger's file first, then the checkpoint: a crash between the two
        leaves the ledger ahead, and what the checkpoint lacks is redelivered and found
        in the ledger already (``duplicate``), never missing from it. The checkpoint records
        the digest of the ledger's bytes written here (:mod:`aggregator.service.core.binding`):
        hashed from ``ledger``, not read back."""
        record = LedgerRecord(ledger_generation, file_digest(ledger))
        content = dataclasses.replace(content, ledger=record)
        ledger_path = ledger_path_for(path)
        if ledger_path.exists():  # keep the last good generation as <ledger>.prev
            try:
                decode_ledger(
                    ledger_path.read_text(encoding="utf-8"),
                    path=ledger_path,
                    spec=self.core.spec,
                    delta=self.core.delta,
                )
            except (LedgerFileError, OSError, UnicodeDecodeError) as exc:
                logger.warning("not keeping %s as the previous generation: %s", ledger_path, exc)
            else:
                os.replace(ledger_path, ledger_previous_path(ledger_path))
        write_atomically(ledger_path, ledger)
        write_checkpoint(path, content)

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

    def roll_back(self) -> None:
        """After a takeover: the newest generation's batches were never acknowledged, so
        the broker redelivers them to the new holder; back to the previous generation (or
        none), so that no batch is in both services' checkpoints."""
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
