"""The series as the service serves it: ``/series``, ``/estimates?window=W`` and the gauges
of the configured windows (``coco aggregator run --window``).

Reading the rows
----------------
The rows live in the core (:class:`~aggregator.series.core.Series`), which only the event
loop changes. A request from the HTTP server's thread asks the loop for a copy of the rows
it needs (:meth:`~aggregator.service.publishing.Publisher.on_loop`: an immutable
:class:`~aggregator.series.frame.Frame`, ``O(rows x d)`` array copies, about 50 ms for a
week of 60-second rounds at ``d = 64``), then estimates, merges and encodes in its own
thread; at most :data:`MAX_QUERIES` ``/series`` requests run at once (another one is
answered 503 at once), so queries never queue up on the loop. A malformed query is answered
400 with one line and counted (``coco_aggregator_http_bad_requests_total{endpoint}``);
nothing else is touched.

A window's privacy level
------------------------
A window's ``epsilon_total`` composes one participation per round of the window at that
round's smallest release (:func:`~aggregator.accountant.history.epsilon_total_rounds`
through :meth:`~aggregator.ledger.privacy_ledger.PrivacyLedger.compute`, which also gives
the per-release epsilons of the window's smallest and newest release). It is computed in
the accountant's process (:func:`~aggregator.ledger.accountant_process.submit_level`;
seconds cold per new release size), never on the loop, and kept in a small LRU keyed by
what it composes (:class:`LevelCache`). A request waits at most :data:`LEVEL_WAIT` for a
level not computed yet, then answers ``epsilon_total: null`` with ``"epsilon_pending":
true``; the computation goes on, and the configured windows' levels are requested by each
publication, so their gauges follow without any request.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aggregator.estimation.estimators import Estimates
from aggregator.ledger import accountant_process
from aggregator.ledger.levels import LedgerSnapshot, PrivacyLevel
from aggregator.page.page_data import channel_estimates
from aggregator.series.core import RoundRow, Series
from aggregator.series.detector import DetectorConfig
from aggregator.series.documents import series_csv, series_json, window_document
from aggregator.series.frame import Frame, WindowSums
from aggregator.series.watch import ChangeWatch, cycle_rounds
from aggregator.series.windows import QueryError, Window, parse_series_query, parse_window

if TYPE_CHECKING:
    from aggregator.service.publishing import Publisher

__all__ = ["LevelCache", "Reply", "SeriesView"]

logger = logging.getLogger("aggregator.service")

MAX_QUERIES = 2
"""``/series`` requests served at once."""
LEVEL_WAIT = 1.0
"""Seconds a request waits for a window's privacy level not computed yet."""
LEVEL_CACHE = 64
"""Window levels kept (LRU)."""

LEVELS_RUNNING = 16
"""Window levels computed at once at most (the configured windows' and requests'): a
flood of distinct windows cannot queue work before the ledger's own level."""
ACCOUNTING_FAILURES = (ArithmeticError, ValueError, accountant_process.AccountantError)

Participations = tuple[tuple[int, int], ...]
"""``(release size, participations)``, sorted: what a window's ``epsilon_total`` composes."""
LevelKey = tuple[Participations, int | None, int | None]


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: status, content type and the body in pieces."""

    status: int
    content_type: str
    body: Iterable[bytes]


def _text(status: int, line: str) -> Reply:
    return Reply(status, "text/plain; charset=utf-8", [f"{line}\n".encode()])


class LevelCache:
    """Window levels by what they compose, computed in the accountant's process; thread-safe."""

    def __init__(self, compute: Callable[[LevelKey], concurrent.futures.Future[Any]]) -> None:
        self._compute = compute
        self._lock = threading.Lock()
        self._levels: OrderedDict[LevelKey, PrivacyLevel] = OrderedDict()
        self._running: dict[LevelKey, concurrent.futures.Future[Any]] = {}
        self.on_ready: Callable[[], None] = lambda: None
        """Called (from the accountant's thread) when a level computed in the background
        is kept."""

    def get(self, key: LevelKey, *, wait: float) -> PrivacyLevel | None:
        """The level of ``key``: at once if kept, else computed (one computation per key at
        a time) and waited for up to ``wait`` seconds; ``None`` if not ready by then."""
        with self._lock:
            level = self._levels.get(key)
            if level is not None:
                self._levels.move_to_end(key)
                return level
            future = self._running.get(key)
            if future is None:
                if len(self._running) >= LEVELS_RUNNING:
                    return None
                future = self._running[key] = self._compute(key)
                future.add_done_callback(lambda done: self._settle(key, done))
        try:
            result = future.result(timeout=wait) if wait > 0 else None
        except (TimeoutError, concurrent.futures.CancelledError):
            return None
        except ACCOUNTING_FAILURES:
            return None  # logged by _settle
        return result if isinstance(result, PrivacyLevel) else None

    def _settle(self, key: LevelKey, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._running.pop(key, None)
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:
                logger.warning("cannot compute a window's privacy level: %s", error)
                return
            self._levels[key] = future.result()
            while len(self._levels) > LEVEL_CACHE:
                self._levels.popitem(last=False)
        self.on_ready()


class SeriesView:
    """``/series``, windows and their gauges, for the publisher's service (module docs)."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self.config = publisher.config
        self.core = publisher.core
        self.metrics = publisher.metrics
        self.spec = self.core.spec
        self.levels = LevelCache(self._submit)
        self.levels.on_ready = self._level_ready
        self._queries = threading.BoundedSemaphore(MAX_QUERIES)
        self._slide_at: float = float("inf")
        """When a configured window's oldest row leaves it (its gauges then change)."""
        self.watch: ChangeWatch | None = None
        """The change detector on the exported dimensions (:mod:`aggregator.series.watch`),
        made for the series in force (a recovery replaces it)."""
        self._refused: Series | None = None

    @property
    def series(self) -> Series | None:
        series: Series | None = getattr(self.core, "series", None)
        return series

    # -- HTTP ------------------------------------------------------------------------------

    def answer(self, path: str, params: Mapping[str, Sequence[str]]) -> Reply:
        """``/series`` or ``/estimates?window=W``, from the HTTP server's thread."""
        endpoint = "series" if path == "/series" else "estimates"
        if self.series is None:
            return _text(404, "this aggregator keeps no series (it has no round length)")
        try:
            if endpoint == "series":
                return self._series(params)
            values = params.get("window", [])
            if len(values) != 1:
                raise QueryError(f"window is given {len(values)} times")
            return self._window(values[0])
        except QueryError as exc:
            self.metrics.bad_requests.labels(endpoint=endpoint).inc()
            return _text(400, str(exc).splitlines()[0] if str(exc) else "bad query")
        except TimeoutError:
            return _text(503, "the service is busy; retry")

    def _series(self, params: Mapping[str, Sequence[str]]) -> Reply:
        query = parse_series_query(params, d=self.spec.d, now=self.publisher.clock())
        if not self._queries.acquire(blocking=False):
            return _text(503, f"busy: {MAX_QUERIES} /series queries are being answered; retry")
        try:
            frame = self.publisher.on_loop(
                lambda: self._take(lambda series: series.rows(query.start, query.end))
            )
            series = self.series
            assert series is not None
            confidence = self.config.confidence
            if query.format == "csv":
                lines = series_csv(self.spec, frame, query, confidence=confidence)
                body: Iterable[bytes] = (line.encode() for line in lines)
                return Reply(200, "text/csv; charset=utf-8", _Pieces(body, self._queries))
            pieces = series_json(
                self.spec,
                frame,
                query,
                round_seconds=series.round_seconds,
                confidence=confidence,
            )
            return Reply(200, "application/json", _Pieces(pieces, self._queries))
        except BaseException:
            self._queries.release()
            raise

    def _window(self, text: str) -> Reply:
        window = parse_window(text)
        base = self.publisher.snapshot()
        now = self.publisher.clock()
        frame, start, end, charged = self.publisher.on_loop(lambda: self._window_frame(window, now))
        document = self.window_document(
            base, window, frame, start, end, charged=charged, wait=LEVEL_WAIT
        )
        return Reply(200, "application/json", [json.dumps(document).encode()])

    def window_document(
        self,
        base: Mapping[str, Any],
        window: Window,
        frame: Frame,
        start: float,
        end: float,
        *,
        charged: Participations,
        wait: float,
    ) -> dict[str, Any]:
        """The ``/estimates`` document ``base`` over ``frame`` (the window's rows), its
        privacy level that of the ledger's participations ``charged`` in it."""
        sums = frame.sums()
        estimates = sums.state(self.spec).estimate(confidence=self.config.confidence)
        level = self.level(sums, charged, wait=wait)
        document = window_document(
            base,
            window=window,
            start=start,
            end=end,
            sums=sums,
            estimates=estimates,
            level=None if level is None else level.to_dict(),
        )
        if self.config.channels is not None:
            document["channels"] = self._channels(estimates)
        return document

    def _channels(self, estimates: Estimates) -> Any:
        assert self.config.channels is not None
        return channel_estimates(
            self.config.channels,
            s=self.spec.s,
            n=estimates.n,
            mean=estimates.mean.tolist(),
            mean_se=estimates.mean_se.tolist(),
            confidence=self.config.confidence,
        )

    # -- rows, on the loop ----------------------------------------------------------------

    def _take(self, select: Callable[[Series], list[RoundRow]]) -> Frame:
        series = self.series
        rows = [] if series is None else select(series)
        return Frame.of(rows, self.spec.d)

    def _window_frame(
        self, window: Window, now: float
    ) -> tuple[Frame, float, float, Participations]:
        """The rows of ``window`` at ``now``, the range they stand for (``(now - W, now]``,
        or for ``rK`` the span of the ``K`` newest rounds), and the privacy ledger's
        participations of a device present in every round that ended in that range: every
        release of those rounds, applied here or not (a stale round's, a lost batch's), and
        every participation of unknown time, pessimistically
        (:meth:`~aggregator.ledger.privacy_ledger.PrivacyLedger.period_rounds`)."""
        if window.rounds is not None:
            frame = self._take(lambda series: series.newest(window.rounds or 1))
            if not len(frame):
                return frame, now, now, ()
            start, end = float(frame.start.min()), float(frame.end.max())
        else:
            assert window.seconds is not None
            start, end = now - window.seconds, now
            frame = self._take(lambda series: series.rows(start, now))
        if not len(frame):
            return frame, start, end, ()
        charged = tuple(self.core.ledger.period_rounds(start, end).items())
        return frame, start, end, charged

    # -- levels ---------------------------------------------------------------------------

    def level(
        self, sums: WindowSums, charged: Participations, *, wait: float
    ) -> PrivacyLevel | None:
        """The privacy level of a window (``None``: empty, or not computed within
        ``wait``): ``epsilon_total`` composes ``charged``, and the per-release epsilons are
        for the smallest release charged and the newest row's."""
        if not sums.sizes or not charged:
            return None
        smallest = min(size for size, _ in charged)
        return self.levels.get((charged, smallest, sums.latest), wait=wait)

    def _submit(self, key: LevelKey) -> concurrent.futures.Future[Any]:
        sizes, smallest, latest = key
        snapshot = LedgerSnapshot(rounds=sizes, smallest=smallest, latest=latest, generation=0)
        return accountant_process.submit_level(
            self.spec, self.config.delta, snapshot, curves=self.config.curves_path
        )

    def _level_ready(self) -> None:
        self.core.changed = True  # the gauges show it at the next publication

    # -- gauges, on the loop --------------------------------------------------------------

    def due(self) -> bool:
        """Whether a configured window's rows changed with time alone (its oldest row left),
        or a round settled for the change detector."""
        now = self.publisher.clock()
        return now >= self._slide_at or (self.watch is not None and now >= self.watch.due())

    def _watch(self) -> ChangeWatch | None:
        series = self.series
        if series is None or not self.config.exported_dims:
            return None
        if self.watch is None or self.watch.series is not series:
            try:
                cycle_rounds(self.config.cycle_seconds, series.round_seconds)
            except ValueError as exc:
                if self._refused is not series:
                    logger.warning("no change detector: %s (--cycle-seconds)", exc)
                self.watch, self._refused = None, series
                return None
            config = DetectorConfig(period=self.config.cycle_seconds)
            self.watch = ChangeWatch(
                series, self.config.exported_dims, config, confidence=self.config.confidence
            )
        return self.watch

    def publish_change(self) -> None:
        """Chart the rounds that settled and set the detector's gauges (on the loop, with
        each publication; ``O(rows)`` to find them, ``O(new rows x dims)`` to chart them)."""
        watch = self._watch()
        if watch is not None and watch.update(self.publisher.clock()):
            self.metrics.set_change(watch.statistic.tolist(), watch.alarm.tolist())

    def publish(self) -> None:
        """Set the configured windows' and the change detector's gauges (on the loop, with
        each publication)."""
        self.publish_change()
        windows = self.config.exported_windows
        if not windows or self.series is None:
            return
        now = self.publisher.clock()
        slide = float("inf")
        for window in windows:
            frame, _, _, charged = self._window_frame(window, now)
            sums = frame.sums()
            estimates = None
            if sums.n:
                estimates = sums.state(self.spec).estimate(confidence=self.config.confidence)
            level = self.level(sums, charged, wait=0)
            self.metrics.set_window(
                window.spec, estimates, epsilon_total=None if level is None else level.epsilon_total
            )
            if window.seconds is not None and len(frame):
                slide = min(slide, float(frame.end.min()) + window.seconds)
        self._slide_at = slide


class _Pieces:
    """A body's pieces that give back their query slot once written, or once closed (the
    HTTP handler closes every body it was given, written or not)."""

    def __init__(self, pieces: Iterable[bytes], slot: threading.BoundedSemaphore) -> None:
        self._pieces = pieces
        self._slot: threading.BoundedSemaphore | None = slot

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._pieces
        finally:
            self.close()

    def close(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()
