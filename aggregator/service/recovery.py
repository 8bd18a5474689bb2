"""How a service resumes at start: the newest good checkpoint generation, the privacy ledger
file and the per-round series file, checked against each other, and the key in force settled.

:class:`Recovery` runs once, when :class:`aggregator.service.service.Aggregator` is entered,
before anything is applied: it reads the files (in a thread), refuses a checkpoint the core
cannot resume from (:func:`~aggregator.service.core.machine.check_resumable`) or a ledger that
does not belong with it (:mod:`aggregator.service.core.binding`), restores the core, replays the
series file's committed records and the quarantine. Apart from the service's wiring and loops
(:mod:`aggregator.service.service`) because it is the one place where the files' pasts meet:
a newcomer reading how a restart keeps each batch applied once starts here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from aggregator.ledger.ledger_file import (
    LedgerFileError,
    LoadedLedger,
    ledger_path_for,
    read_ledger,
)
from aggregator.service.checkpoint_files import ledger_seen, recover_checkpoint
from aggregator.service.config import AggregatorConfig
from aggregator.service.core.binding import check_binding
from aggregator.service.core.checkpoint import CHECKPOINT_VERSION, Checkpoint, CheckpointError
from aggregator.service.core.machine import AggregatorCore, check_resumable
from aggregator.service.generations import Generations
from aggregator.service.metrics import AggregatorMetrics
from aggregator.service.rejected import Rejected
from aggregator.service.series_file import recover_series
from aggregator.service.trust import KeyGuard

__all__ = ["Recovery"]

logger = logging.getLogger("aggregator.service")


class Recovery:
    """The start of one service: its files read, checked and restored into its core."""

    def __init__(
        self,
        config: AggregatorConfig,
        core: AggregatorCore,
        *,
        metrics: AggregatorMetrics,
        generations: Generations,
        keys: KeyGuard,
        rejected: Rejected,
    ) -> None:
        self.config = config
        self.spec = config.spec
        self.core = core
        self.metrics = metrics
        self.generations = generations
        self.keys = keys
        self.rejected = rejected

    async def recover(self, path: Path) -> None:
        """Resume from the newest good checkpoint generation and settle the key in force."""
        recovery = await asyncio.to_thread(recover_checkpoint, path)
        if recovery.fallback is not None:
            logger.warning("%s; the broker redelivers what it lacks", recovery.fallback)
        checkpoint = recovery.checkpoint
        if checkpoint is not None:
            problem = check_resumable(self.core, checkpoint)
            if problem is not None:
                raise CheckpointError(f"checkpoint {checkpoint.path} {problem}")
        ledger_path = ledger_path_for(path)
        loaded = await asyncio.to_thread(
            read_ledger, ledger_path, spec=self.spec, delta=self.config.delta
        )
        self._check_binding(checkpoint, recovery.fallback is not None, ledger_path, loaded)
        self.generations.vouch(loaded)
        self.keys.settle(
            configured=self.config.key_source == "configured",
            checkpoint_key=None if checkpoint is None else checkpoint.trusted,
        )
        if checkpoint is not None:
            self._restore(checkpoint)
            if checkpoint.ledger is None:  # written before the binding: bind it now
                self.core.dirty = True
        await self._recover_series(path, checkpoint)
        if loaded is not None:  # what the devices spent, kept apart from the estimates
            self.core.ledger = loaded.ledger
            loaded.ledger.round_seconds = self.config.round_seconds  # dates its releases
            if loaded.ledger.numbered and self.config.round_seconds is not None:
                # written when rounds were numbers; without a round length it stays so
                loaded.ledger.renumber(self.core.rules.unit)
                logger.info(
                    "privacy ledger %s kept round numbers: read under round_seconds %d",
                    loaded.path,
                    self.core.rules.unit,
                )
            logger.info(
                "privacy ledger %s: generation %d, %d participations",
                loaded.path,
                loaded.ledger.generation,
                sum(loaded.ledger.rounds().values()),
            )
        self.rejected.recover()  # and replayed, once the rest is recovered

    async def _recover_series(self, path: Path, checkpoint: Checkpoint | None) -> None:
        """The series file's committed records replayed, the rest cut off
        (:func:`~aggregator.service.series_file.recover_series`); nothing without a round
        length."""
        series = self.core.rules.new_series()
        self.core.series = series
        if series is None:
            logger.info("no round length: no per-round series is kept")
            return
        recovered = await asyncio.to_thread(
            recover_series,
            path,
            checkpoint,
            series,
            deployment=self.config.deployment,
            anew=self.config.new_series,
        )
        for line in recovered.notes:
            logger.warning("%s", line)
        series.expire(time.time())
        self.generations.series_file = recovered.file
        logger.info("series %s: %d rows, sequence %d", recovered.file.path, len(series), series.seq)

    def _check_binding(
        self,
        checkpoint: Checkpoint | None,
        fell_back: bool,
        ledger_path: Path,
        loaded: LoadedLedger | None,
    ) -> None:
        """Refuse a ledger or checkpoint that does not belong with the other
        (:mod:`aggregator.service.core.binding`): :class:`LedgerFileError`, one line."""
        binding = check_binding(
            deployment=self.config.deployment,
            checkpoint=checkpoint,
            fell_back=fell_back,
            ledger_path=ledger_path,
            ledger=None if loaded is None else ledger_seen(loaded),
        )
        for line in binding.warnings:
            logger.warning("%s", line)
        for line in binding.notes:
            logger.info("%s", line)
        if binding.refusal is not None:
            raise LedgerFileError(binding.refusal)

    def _restore(self, checkpoint: Any) -> None:
        self.core.restore(checkpoint)
        self.generations.generation = checkpoint.generation
        restored = self.core.counters
        self.metrics.sync(self.core)
        self.metrics.checkpoint_generation.set(self.generations.generation)
        if checkpoint.version < CHECKPOINT_VERSION:
            logger.info(
                "checkpoint %s is version %d: its round numbers read under round_seconds %d "
                "and rewritten as version %d (rounds keyed by their start time)%s",
                checkpoint.path,
                checkpoint.version,
                self.core.rules.unit,
                CHECKPOINT_VERSION,
                "; its unsigned batch ids are dropped" if checkpoint.version == 1 else "",
            )
        logger.info(
            "resumed from %s (generation %d): n=%d, %d batches, %d batch ids of rounds %s..%s",
            checkpoint.path,
            self.generations.generation,
            self.core.state.n,
            restored.batches,
            len(self.core.memory),
            self.core.memory.oldest_round,
            self.core.memory.newest_round,
        )
