"""What the aggregator shows: estimates, gauges, ``/estimates`` and the privacy level.

Applying a batch only adds its sums and counts (``O(d)``); the estimates, the gauges and the
``/estimates`` document are rebuilt from the state every ``publish_interval`` seconds, on
every scrape of ``/metrics`` and request of ``/estimates`` (a collector registered first
in the registry asks the event loop for a rebuild and waits for it, up to
:data:`REQUEST_WAIT`) and on shutdown, never per batch. Prometheus counters move with each
batch. The central privacy level (epsilon_central of the smallest and latest batch,
epsilon_central_generic, epsilon_total) is the :class:`~aggregator.ledger.privacy_ledger.
PrivacyLedger`'s, recomputed after batches are applied in the accountant's own
low-priority process (:mod:`aggregator.ledger.accountant_process`, the service's one use of the
accountant); until it covers the newest batch the previous level is shown
(``batches_accounted`` says how many it covers), and a request from another thread waits
for it, up to :data:`REQUEST_WAIT`, off the loop. ``/estimates`` also carries the privacy
levels shown so far with their times (``privacy_history``) and, where the configuration
names the dimensions as sensor channels, each channel's mean in its unit (``channels``;
both from :mod:`aggregator.page.page_data`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.registry import Collector

from aggregator.estimation.estimators import AggregateState
from aggregator.ledger import accountant_process
from aggregator.ledger.ledger_file import ledger_path_for, read_ledger
from aggregator.ledger.levels import PrivacyLevel
from aggregator.ledger.privacy_ledger import PrivacyLedger
from aggregator.page.page_data import PrivacyHistory, channel_estimates
from aggregator.service.checkpoint_files import ledger_seen, recover_checkpoint
from aggregator.service.config import AggregatorConfig
from aggregator.service.core.binding import check_binding
from aggregator.service.core.checkpoint import Counters
from aggregator.service.core.machine import AggregatorCore
from aggregator.service.metrics import AggregatorMetrics, epsilon_curve_grid
from aggregator.service.series_view import SeriesView
from edge.errors import CocoError

logger = logging.getLogger("aggregator.service")
T = TypeVar("T")

REQUEST_WAIT = 5.0
"""Seconds a scrape or ``/estimates`` request waits for the event loop (and for an
epsilon_central being computed) before it is served what was last published."""
ACCOUNTING_ERRORS = (ArithmeticError, ValueError, accountant_process.AccountantError)
"""What a privacy computation may raise; logged and retried, never fatal to the service."""


class RefreshOnCollect(Collector):
    """Registered first: every scrape (or ``get_sample_value``) brings the gauges up to date
    before the other collectors are read. It exports nothing itself."""

    def __init__(self, refresh: Callable[[], None]) -> None:
        self._refresh = refresh

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        self._refresh()
        return []


def no_level() -> PrivacyLevel:
    return PrivacyLevel(
        epsilon_central={"smallest": None, "latest": None},
        epsilon_central_generic={"smallest": None, "latest": None},
        epsilon_total=None,
        batches=0,
        sizes={"smallest": None, "latest": None},
    )


class Publisher:
    """Rebuilds what the service shows from ``core`` (module docs); thread-safe reads."""

    def __init__(
        self,
        config: AggregatorConfig,
        core: AggregatorCore,
        metrics: AggregatorMetrics,
        *,
        status: Callable[[], dict[str, Any]],
    ) -> None:
        self.config = config
        self.core = core
        self.metrics = metrics
        self.status = status
        """Extra fields of the document (``subscribed``, ``ready``, trust), from the shell."""
        self.document: dict[str, Any] = {}
        self.history = PrivacyHistory()
        """The levels shown so far, with their times (:mod:`aggregator.page.page_data`)."""
        self.clock: Callable[[], float] = time.time
        self.level = no_level()
        self.privacy_dirty = asyncio.Event()
        self.first_level = asyncio.Event()  # the privacy loop's first level is done
        self.settled = threading.Event()
        """Set while the privacy level covers every batch applied."""
        self.running = False  # whether the privacy loop runs (else a request accounts)
        self.entered = False  # whether the service is entered (its loop owns the state)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._computing: int | None = None
        self.periods_at = -math.inf
        """When the rolling periods of the last snapshot ended (they slide with time)."""
        """The ledger generation of the level being computed."""
        self.series = SeriesView(self)
        """``/series``, the windows and their gauges (:mod:`aggregator.service.series_view`)."""

    def bind_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def applied(self) -> None:
        """The privacy ledger changed (a batch applied, a release recorded): the privacy
        level is out of date."""
        self.settled.clear()
        self.privacy_dirty.set()
        self.history.ledger_changed(self.core.ledger.generation, self.clock())

    def refresh(self) -> None:
        """Bring the estimates, gauges and ``/estimates`` up to date, from any thread.

        The privacy level: while the privacy loop runs a request is served at once with the
        level computed so far (``batches_accounted``). Without it (batches handed in
        directly, or after the service stopped) a request accounts for what is missing
        itself, in the requesting thread, but never on the event loop of a service that is
        entered. Then: on the event loop's thread, publish now; from another thread (the
        HTTP server, or a caller with no running loop), publish on the event loop if it
        runs (the state is the loop's, waiting up to :data:`REQUEST_WAIT`), else here.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            on_a_loop = False
        else:
            on_a_loop = True
        if not self.running and not self.settled.is_set() and not (on_a_loop and self.entered):
            try:  # in the accountant's process, where its caches are; waits at most
                # LEVEL_WAIT, then serves the last level (the computation goes on)
                level = accountant_process.level_now(
                    self.core.spec,
                    self.config.delta,
                    self.core.ledger.snapshot(),
                    curves=self.config.curves_path,
                )
            except ACCOUNTING_ERRORS:
                logger.exception("cannot compute the central privacy level; serving the last")
            else:
                if level is not None:
                    self.adopt(level)
        if on_a_loop:
            self.publish()
            return
        loop = self._loop
        if loop is None or not loop.is_running() or self._loop_thread == threading.get_ident():
            self.publish()
            return
        done = threading.Event()

        def publish() -> None:
            try:
                self.publish()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(publish)
        except RuntimeError:  # the loop closed meanwhile: serve what was published
            return
        done.wait(REQUEST_WAIT)

    def snapshot(self) -> dict[str, Any]:
        """The current ``/estimates`` document, brought up to date first."""
        self.refresh()
        return self.document

    def on_loop(self, call: Callable[[], T]) -> T:
        """``call()`` on the event loop that owns the state (here when this is its thread, or
        it does not run), waited for up to :data:`REQUEST_WAIT`: :class:`TimeoutError` if
        the loop did not run it by then."""
        loop = self._loop
        if loop is None or not loop.is_running() or self._loop_thread == threading.get_ident():
            return call()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # handed to the caller
                    future.set_exception(exc)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop closed meanwhile: nothing changes the state now
            return call()
        try:
            return future.result(REQUEST_WAIT)
        except TimeoutError:
            future.cancel()
            raise

    def publish(self) -> None:
        """Rebuild the estimates, the gauges and the ``/estimates`` document (a new dict: the
        HTTP thread reads the old one whole) if anything changed. O(d) plus at most
        :data:`~aggregator.service.config.MAX_METRICS_DIMS` gauges: on an interval, on request,
        never per batch. Each central epsilon is shown only while its batch size is still
        the current smallest or latest one."""
        core = self.core
        if not core.changed:
            return
        core.changed = False  # before reading: a change from another thread re-marks it
        estimates = core.state.estimate(confidence=self.config.confidence)
        self.metrics.set_estimates(estimates)
        self.series.publish()
        # the sizes behind the epsilons: the smallest participation ever and the newest
        # round's (each round at its smallest release, applied here or not)
        smallest, latest = core.ledger.smallest, core.ledger.latest
        level = self.level.for_sizes(smallest=smallest, latest=latest)
        self.metrics.set_epsilon(**level.epsilon_central)
        self.metrics.set_epsilon_generic(**level.epsilon_central_generic)
        self.metrics.set_epsilon_total(level.epsilon_total)
        self.metrics.set_epsilon_periods(level.epsilon_periods)
        self.metrics.set_batch_size(smallest=smallest, latest=latest)
        self.metrics.set_retention(
            retained_ids=len(core.memory), oldest_round=core.memory.oldest_round
        )
        level_shown = level.to_dict()
        self.history.record(
            self.clock(),
            generation=level.generation,
            batches=level.batches,
            smallest=level.epsilon_central["smallest"],
            latest=level.epsilon_central["latest"],
            total=level.epsilon_total,
        )
        channels = self.config.channels
        self.document = {
            "deployment": self.config.deployment,
            "spec": core.spec.to_dict(),
            "n": core.state.n,
            "estimates": estimates.to_dict(),
            "epsilon_local": core.spec.epsilon,
            **level_shown,
            "batch_size": {"smallest": smallest, "latest": latest},
            "privacy_history": self.history.to_json(),
            **(
                {}
                if channels is None
                else {
                    "channels": channel_estimates(
                        channels,
                        s=core.spec.s,
                        n=core.state.n,
                        mean=estimates.mean.tolist(),
                        mean_se=estimates.mean_se.tolist(),
                        confidence=self.config.confidence,
                    )
                }
            ),
            "min_batch": core.rules.min_batch,
            "delta": self.config.delta,
            "last_batch_timestamp": core.last_batch_timestamp,
            "counters": core.counters.to_dict(),
            "shards": {label: stats.to_json() for label, stats in sorted(core.shards.items())},
            "manifests": {
                **core.reconciler.counts.to_json(),
                "pending": len(core.reconciler.pending),
                "recent_losses": [loss.to_json() for loss in core.reconciler.losses],
            },
            "retention": {
                "rounds": core.rules.retention_rounds,
                "round_seconds": core.memory.unit,
                "newest_round": core.memory.newest_round,
                "oldest_round": core.memory.oldest_round,
                "newest_start": core.memory.newest_start,
                "oldest_start": core.memory.floor,
                "batch_ids": len(core.memory),
            },
            **self.status(),
        }

    @property
    def period_refresh(self) -> float:
        """How often the rolling periods are recomputed while no release arrives: each
        round (at least every 10 s), since a round leaving a period lowers its level."""
        return float(max(10, self.config.round_seconds or 60))

    def periods(self) -> dict[str, tuple[float, float]]:
        """The configured rolling periods as ``(now - P, now]`` (taken with a snapshot)."""
        now = self.clock()
        self.periods_at = now
        return {label: (now - seconds, now) for label, seconds in self.config.periods}

    def adopt(self, level: PrivacyLevel) -> None:
        """Show ``level`` from the next publication on, unless a newer one is shown."""
        if level.generation >= self.level.generation:
            self.level = level
        if level.generation == self.core.ledger.generation:
            self.settled.set()
        self.core.changed = True

    async def privacy_loop(self) -> None:
        """Recompute the central privacy level after batches were applied, in the
        accountant's process (a new batch size costs up to about a second, a new
        composition 2-3 s), never on the event loop."""
        self.privacy_dirty.set()  # a restored checkpoint has a history to account for
        self.running = True
        try:
            while True:
                await self.account_once()
        finally:
            self.running = False

    async def account_once(self) -> None:
        await self.privacy_dirty.wait()
        self.privacy_dirty.clear()
        snapshot = self.core.ledger.snapshot(self.periods())
        self._computing = snapshot.generation
        try:
            level = await accountant_process.compute_level(
                self.core.spec, self.config.delta, snapshot, curves=self.config.curves_path
            )
        except ACCOUNTING_ERRORS:  # accounting must not stop the service
            logger.exception("cannot compute the central privacy level; retrying later")
            self.first_level.set()
            await asyncio.sleep(5.0)
            self.privacy_dirty.set()
            return
        self.adopt(level)
        self.first_level.set()
        self.publish()

    async def publish_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.publish_interval)
            # whatever changed the ledger (a batch, a manifest, a compaction at a
            # checkpoint), a level that does not cover it is recomputed
            generation = self.core.ledger.generation
            if generation not in (self.level.generation, self._computing):
                self.settled.clear()
                self.privacy_dirty.set()
            elif self.config.periods and self.clock() - self.periods_at >= self.period_refresh:
                self.privacy_dirty.set()  # the rolling periods slid: rounds left them
            if self.series.due():  # a window's oldest round left it
                self.core.changed = True
            self.publish()

    async def export_epsilon_curve(self) -> None:
        """Compute the certified epsilon curve once, in the accountant's process (about
        3 s of CPU at d = 512), after the first privacy level: the level comes first."""
        await self.first_level.wait()
        grid = epsilon_curve_grid(self.core.rules.min_batch)
        try:
            curve = await accountant_process.compute_curve(self.core.spec, self.config.delta, grid)
        except ACCOUNTING_ERRORS:  # a dashboard curve must not stop the service
            logger.exception("cannot compute the epsilon_central curve; not exported")
            return
        self.metrics.set_epsilon_curve(curve)


def estimates_document(
    state: AggregateState,
    *,
    delta: float,
    batch_sizes: dict[int, int],
    latest_batch: int | None,
    confidence: float = 0.95,
    extra: dict[str, Any] | None = None,
    ledger: PrivacyLedger | None = None,
) -> dict[str, Any]:
    """The offline ``/estimates`` JSON of a checkpoint (``coco aggregator snapshot``): the
    privacy level of ``ledger`` (the ledger file's), else of the old per-batch records."""
    if ledger is None:
        ledger = PrivacyLedger(state.spec, delta=delta)
        ledger.restore(batch_sizes, latest_batch)
    level = ledger.compute(ledger.snapshot())
    return {
        "spec": state.spec.to_dict(),
        "n": state.n,
        "estimates": state.estimate(confidence=confidence).to_dict(),
        "epsilon_local": state.spec.epsilon,
        **level.to_dict(),
        "batch_size": {"smallest": ledger.smallest, "latest": ledger.latest},
        "delta": delta,
        **(extra or {}),
    }


def snapshot_from_checkpoint(path: Path, *, confidence: float = 0.95) -> dict[str, Any]:
    """Offline ``/estimates`` document of the newest good generation of a checkpoint."""
    recovery = recover_checkpoint(path, move_damaged=False)
    checkpoint = recovery.checkpoint
    if checkpoint is None:
        raise CocoError(f"no checkpoint at {path}")
    extra: dict[str, Any] = {
        "checkpoint": str(checkpoint.path),
        "generation": checkpoint.generation,
        "counters": checkpoint.counters.to_dict(),
    }
    if recovery.fallback is not None:
        extra["fallback"] = recovery.fallback
    ledger_path = ledger_path_for(path)
    loaded = read_ledger(ledger_path, spec=checkpoint.state.spec, delta=checkpoint.delta)
    seen = None if loaded is None else ledger_seen(loaded)
    binding = check_binding(  # an epsilon_total from a ledger behind its checkpoint: refused
        deployment=checkpoint.deployment or (seen and seen.deployment) or "",
        checkpoint=checkpoint,
        fell_back=recovery.fallback is not None,
        ledger_path=ledger_path,
        ledger=seen,
    )
    if binding.refusal is not None:
        raise CocoError(binding.refusal)
    return estimates_document(
        checkpoint.state,
        ledger=None if loaded is None else loaded.ledger,
        delta=checkpoint.delta,
        batch_sizes=checkpoint.batch_sizes,
        latest_batch=checkpoint.latest_batch,
        confidence=confidence,
        extra=extra,
    )


def log_shutdown(now: Counters, start: Counters) -> None:
    """This run's counts at INFO: what was applied, ignored, rejected, unacknowledged."""

    def since(current: dict[str, int], before: dict[str, int]) -> dict[str, int]:
        delta = {k: v - before.get(k, 0) for k, v in current.items()}
        return {k: v for k, v in sorted(delta.items()) if v}

    rejected = since(now.rejected, start.rejected)
    rejected_reports = since(now.rejected_reports, start.rejected_reports)
    unacked = since(now.unacknowledged, start.unacknowledged)
    logger.info(
        "stopping: this run applied %d batches (%d reports) and ignored %d duplicates; "
        "rejected %d batches %s holding %d verified reports %s; left %d batches "
        "unacknowledged %s, which the broker redelivers to the session",
        now.batches - start.batches,
        now.reports - start.reports,
        now.duplicates - start.duplicates,
        sum(rejected.values()),
        rejected,
        sum(rejected_reports.values()),
        rejected_reports,
        sum(unacked.values()),
        unacked,
    )
