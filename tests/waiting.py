"""Waiting in tests by observed progress, not by the clock.

The suite runs on loaded shared machines (two cores, load 6), where anything can take ten
times longer than on a quiet one. A wait here fails only when the thing waited for has
*stopped moving*: ``progress`` returns a comparable value (a counter of reports acknowledged
or applied, a metric, a file's size, the number of log lines) and the wait fails when that
value has not changed for ``stall`` seconds, or, as a guard against a hang, after a generous
absolute ``ceiling``. A wait without a ``progress`` gives its condition ``stall`` seconds.

:func:`wait_until` (blocking) and :func:`until` (a coroutine) are the one wait of every suite,
the stall window their second argument; a suite with its own default window binds it once
with :class:`Waits` (``wait_until = Waits(15.0).until``) instead of wrapping them.

Every window is multiplied by ``COCO_TEST_TIMEOUT_SCALE`` (default 1): a slower machine sets
it higher instead of editing tests.

No test asserts on wall-clock time; a time a document claims is measured by bench/, not by
a test.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

from tests import cputime

__all__ = [
    "CEILING",
    "SCALE",
    "STALL",
    "Condition",
    "Options",
    "Progress",
    "Stall",
    "StalledError",
    "Waits",
    "cpu_seconds",
    "file_size",
    "scaled",
    "until",
    "wait_until",
]


def _scale() -> float:
    raw = os.environ.get("COCO_TEST_TIMEOUT_SCALE", "1")
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"COCO_TEST_TIMEOUT_SCALE must be a number, not {raw!r}") from None
    if not scale > 0:
        raise ValueError(f"COCO_TEST_TIMEOUT_SCALE must be positive, not {raw!r}")
    return scale


SCALE = _scale()
STALL = 30.0  # seconds without progress before a wait fails (before scaling)
CEILING = 180.0
"""Seconds a wait may take in all (before scaling), however its progress moves: below the
suites' pytest-timeout (180-600 s), so that a wait reports what it waited for."""


def scaled(seconds: float) -> float:
    """``seconds`` multiplied by ``COCO_TEST_TIMEOUT_SCALE``."""
    return seconds * SCALE


def cpu_seconds(pid: int | None, grain: float = 0.5) -> float | None:
    """CPU time (user + system, tests/cputime.py) process ``pid`` has used so far, in whole
    ``grain`` s: the progress of a process that computes (the accountant's worker, a service
    at work). The grain keeps a process that merely idles (a few ms a second) from counting
    as progress for ever; ``grain=0`` gives the exact time. ``None`` for no process or one
    that is gone."""
    seconds = None if pid is None else cputime.cpu_seconds(pid)
    if seconds is None:
        return None
    return math.floor(seconds / grain) * grain if grain > 0 else seconds


def file_size(path: Path) -> int | None:
    """The size of ``path`` (a log, a store): the progress of whatever writes it."""
    try:
        return path.stat().st_size
    except OSError:
        return None


class StalledError(AssertionError):
    """A wait whose condition did not hold and whose progress stopped moving."""


Progress = Callable[[], Any]
Condition = Callable[[], object]
"""What a wait waits for: it ends once this returns something true."""
Stall = float | None
"""A stall window in seconds; ``None`` for the default (:data:`STALL`, or a suite's)."""

# The clock and the pauses, as names of this module so that tests/test_waiting.py can fake them.
_monotonic = time.monotonic
_sleep = time.sleep
_async_sleep = asyncio.sleep


@dataclass
class _Watch:
    """The bookkeeping of one wait: when progress last moved, and to what."""

    what: str
    progress: Progress | None
    stall: float
    ceiling: float
    started: float = 0.0
    last: Any = None
    moved: float = 0.0
    changes: int = 0

    def __post_init__(self) -> None:
        self.started = self.moved = _monotonic()
        self.last = self._read()

    def _read(self) -> Any:
        return None if self.progress is None else self.progress()

    def check(self) -> None:
        """Raise :class:`StalledError` if progress stood still for ``stall`` s or the ceiling
        passed; otherwise note any movement."""
        now = _monotonic()
        current = self._read()
        if current != self.last:
            self.last = current
            self.moved = now
            self.changes += 1
        if now - self.moved > self.stall:
            raise StalledError(
                f"{self.what}: not reached, and "
                + (
                    f"progress stuck at {self.last!r} for {self.stall:.0f} s "
                    f"(it moved {self.changes} times before)"
                    if self.progress is not None
                    else f"no progress measure, gave it {self.stall:.0f} s"
                )
            )
        if now - self.started > self.ceiling:
            raise StalledError(
                f"{self.what}: not reached within the {self.ceiling:.0f} s ceiling although "
                f"progress kept moving (last {self.last!r})"
            )


class Options(TypedDict, total=False):
    """What a wait takes beside its condition and its stall window."""

    progress: Progress | None
    """A comparable measure of the work done: the wait fails when it stops changing."""
    ceiling: float | None
    """Seconds the wait may take in all (default :data:`CEILING`)."""
    what: str
    """What is waited for, in the failure's message (default: the condition's name)."""


def _pending(
    predicate: Condition,
    stall: Stall,
    *,
    progress: Progress | None = None,
    ceiling: float | None = None,
    what: str = "",
) -> Iterator[None]:
    """The one loop of every wait: yields (the caller pauses between polls) until
    ``predicate`` holds; raises :class:`StalledError` when the watch says so."""
    if predicate():
        return
    watch = _Watch(
        what=what or getattr(predicate, "__qualname__", repr(predicate)),
        progress=progress,
        stall=scaled(STALL if stall is None else stall),
        ceiling=scaled(CEILING if ceiling is None else ceiling),
    )
    while not predicate():
        watch.check()
        yield


def wait_until(
    predicate: Condition,
    stall: Stall = None,
    *,
    interval: float = 0.02,
    **options: Unpack[Options],
) -> None:
    """Poll ``predicate`` every ``interval`` s until it is true. Fails with :class:`StalledError`
    when ``progress()`` has returned the same value for ``stall`` s (default :data:`STALL`;
    counted from the start when there is no ``progress``), or after ``ceiling`` s in all
    (default :data:`CEILING`); both scaled by ``COCO_TEST_TIMEOUT_SCALE``."""
    for _ in _pending(predicate, stall, **options):
        _sleep(interval)


async def until(
    predicate: Condition,
    stall: Stall = None,
    *,
    interval: float = 0.02,
    **options: Unpack[Options],
) -> None:
    """:func:`wait_until` for a coroutine: the event loop runs between polls."""
    for _ in _pending(predicate, stall, **options):
        await _async_sleep(interval)


@dataclass(frozen=True)
class Waits:
    """:func:`wait_until` and :func:`until` with a suite's own default stall window and poll
    interval, for a suite to bind once (``wait_until = Waits(15.0).until``) and call as
    ``await wait_until(predicate)`` (15 s) or ``await wait_until(predicate, 60)``."""

    stall: float = STALL
    interval: float = 0.02

    def wait_until(self, predicate: Condition, stall: Stall = None, **kw: Unpack[Options]) -> None:
        wait_until(predicate, self.stall if stall is None else stall, interval=self.interval, **kw)

    async def until(self, predicate: Condition, stall: Stall = None, **kw: Unpack[Options]) -> None:
        await until(predicate, self.stall if stall is None else stall, interval=self.interval, **kw)
