"""tests/waiting.py: a wait fails when progress stops, not when a clock runs out. The clock
and the sleep are fakes here, so these tests hold on any machine."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import pytest

from tests import waiting
from tests.waiting import StalledError, Waits, until, wait_until

REAL_ASYNC_SLEEP = asyncio.sleep


class FakeClock:
    """``time.monotonic`` that advances only when the wait sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.now += seconds
        await REAL_ASYNC_SLEEP(0)  # let the other tasks run, as a real pause would


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(waiting, "_monotonic", fake.monotonic)
    monkeypatch.setattr(waiting, "_sleep", fake.sleep)
    monkeypatch.setattr(waiting, "_async_sleep", fake.async_sleep)
    monkeypatch.setattr(waiting, "SCALE", 1.0)
    return fake


def test_a_condition_that_holds_returns_at_once(clock: FakeClock) -> None:
    wait_until(lambda: True, stall=0.0)
    assert clock.now == 1000.0


def test_moving_progress_outlasts_the_stall_window(clock: FakeClock) -> None:
    """The condition takes 50 stall windows, and the progress moves all along."""
    count = itertools.count()
    wait_until(
        lambda: clock.now >= 1500.0, progress=lambda: next(count), stall=10.0, ceiling=1000.0
    )
    assert clock.now >= 1500.0


def test_progress_that_stops_fails_after_the_stall_window(clock: FakeClock) -> None:
    """Progress moves for 100 s, then stands still: the wait fails 10 s later."""
    with pytest.raises(StalledError, match=r"applied: not reached.*stuck at 1100\b.*for 10 s"):
        wait_until(
            lambda: False,
            progress=lambda: int(min(clock.now, 1100.0)),
            stall=10.0,
            what="applied",
        )
    assert 1110.0 <= clock.now < 1111.0


def test_without_progress_the_window_counts_from_the_start(clock: FakeClock) -> None:
    with pytest.raises(StalledError, match="no progress measure"):
        wait_until(lambda: False, stall=5.0)
    assert 1005.0 <= clock.now < 1006.0


def test_the_ceiling_ends_a_wait_whose_progress_never_stops(clock: FakeClock) -> None:
    count = itertools.count()
    with pytest.raises(StalledError, match="ceiling"):
        wait_until(lambda: False, progress=lambda: next(count), stall=1.0, ceiling=60.0)
    assert 1060.0 <= clock.now < 1061.0


def test_the_scale_stretches_the_windows(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "SCALE", 3.0)
    with pytest.raises(StalledError):
        wait_until(lambda: False, stall=5.0)
    assert 1015.0 <= clock.now < 1016.0


@pytest.mark.usefixtures("clock")
def test_the_async_wait_lets_the_loop_run() -> None:
    async def scenario() -> int:
        done = asyncio.Event()

        async def worker() -> None:
            for _ in range(3):
                await asyncio.sleep(0)
            done.set()

        task = asyncio.create_task(worker())
        polls = itertools.count()
        await until(done.is_set, progress=lambda: next(polls), stall=1.0)
        await task
        return next(polls)

    assert asyncio.run(scenario()) >= 1


@pytest.mark.usefixtures("clock")
def test_the_async_wait_fails_when_progress_stops() -> None:
    with pytest.raises(StalledError, match="stuck at 7"):
        asyncio.run(until(lambda: False, progress=lambda: 7, stall=2.0))


def test_the_stall_window_is_the_second_argument(clock: FakeClock) -> None:
    with pytest.raises(StalledError, match="gave it 7 s"):
        wait_until(lambda: False, 7.0)
    assert 1007.0 <= clock.now < 1008.0


def test_a_suites_waits_bind_its_window_and_interval(clock: FakeClock) -> None:
    """``Waits(5.0, interval=0.5)``: 5 s unless a call gives its own window, polled every
    0.5 s, in both the blocking and the async wait."""
    waits = Waits(5.0, interval=0.5)
    polls = itertools.count()

    def never() -> bool:
        next(polls)
        return False

    with pytest.raises(StalledError, match="gave it 5 s"):
        waits.wait_until(never)
    assert clock.now == 1005.5  # the first poll past the window, on the 0.5 s grid
    assert next(polls) == 13  # twice at the start, then after each of the 11 pauses of 0.5 s
    with pytest.raises(StalledError, match="gave it 8 s"):
        waits.wait_until(lambda: False, 8.0)
    assert clock.now == 1005.5 + 8.5
    with pytest.raises(StalledError, match=r"stuck at 3\b.*for 5 s"):
        asyncio.run(waits.until(lambda: False, progress=lambda: 3))
    assert clock.now == 1014.0 + 5.5


@pytest.mark.parametrize("raw", ["0", "-1", "fast"])
def test_a_bad_scale_is_refused(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COCO_TEST_TIMEOUT_SCALE", raw)
    with pytest.raises(ValueError, match="COCO_TEST_TIMEOUT_SCALE"):
        waiting._scale()


def test_cpu_seconds_grows_while_a_process_computes() -> None:
    start = waiting.cpu_seconds(os.getpid(), grain=0)
    assert start is not None
    # burn CPU until the tick counter moves (it must: ticks are 10 ms at most)
    while waiting.cpu_seconds(os.getpid(), grain=0) == start:
        sum(range(10_000))
    coarse = waiting.cpu_seconds(os.getpid(), grain=0.5)
    assert coarse is not None
    assert coarse % 0.5 == 0
    exact = waiting.cpu_seconds(os.getpid(), grain=0)
    assert exact is not None
    assert coarse <= exact
    assert waiting.cpu_seconds(None) is None
    assert waiting.cpu_seconds(2**22 + 1) is None  # above pid_max's default: no such process


def test_file_size_follows_a_file(tmp_path: Path) -> None:
    log = tmp_path / "log"
    assert waiting.file_size(log) is None
    log.write_text("one line\n")
    assert waiting.file_size(log) == 9
